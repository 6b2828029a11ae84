/*
 * mods.c: `fa_gpu_tests mods [small]`: the score bias (bias / dbias), document ids and block-sparse
 * masks on CUDA (the portable kernels' MODS instantiations, src/cuda/common/mods.cuh):
 *
 *   1. forward and backward against the float64 oracle (2·baseline + floor), fresh seeds every
 *      run: full, per-head, key-padding and per-row biases in f32 / f16 / bf16 with -inf entries
 *      and fully -inf rows, dbias reduced over its broadcast axes, sq != sk, GQA, varlen,
 *      softcap, ALiBi, windows, sinks; document ids with causal; random block masks (empty rows,
 *      partial and full blocks, bit masks, causal / window inside partial blocks, broadcast
 *      lists, varlen); every output poisoned first and checked fully written;
 *   1b. fa_kvcache_forward with a bias over the cache slots (causal, left padding, a fully -inf
 *      row) against the CPU engine's;
 *   2. deterministic mode: dbias (a reduced one), dq, dk, dv bitwise equal over two runs;
 *   3. rejections, nothing written: bad block lists (FA_ERR_INVALID_ARGUMENT naming the field,
 *      found on the device), block sizes that are not multiples of the kernel tiles, the KV-cache
 *      call with document ids (FA_ERR_UNSUPPORTED naming the field).
 * Part of `make gpu-test` (tests/gpu_test.sh). Exit status 0 = every check held.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"
#include "oracle/reference.h"

static int failures;

#define EXPECT(cond, ...) GPU_EXPECT(failures, "mods", cond, __VA_ARGS__)
#define CUDA_OK(call) GPU_CUDA_OK("mods", call)

/* ---- the modifications of one case (host arrays and their device copies) ---------------------- */

static const fa_test_mods_odds gpu_odds = {.empty_row = 0.15, .partial = 0.35, .partial_or_full = 0.65,
                                           .new_document = 0.05};

/* The host arrays (the oracle's view, fa_test_mods_make) and their device copies. */
typedef struct mods {
    fa_test_mods host;
    void *device[FA_TEST_MOD_COUNT];
} mods;

static void mods_upload(mods *m) {
    for (int w = 0; w < FA_TEST_MOD_COUNT; w++)
        if (m->host.array[w]) {
            CUDA_OK(cudaMalloc(&m->device[w], m->host.bytes[w] + 8));
            CUDA_OK(cudaMemcpy(m->device[w], m->host.array[w], m->host.bytes[w], cudaMemcpyHostToDevice));
        }
}

static void mods_free(mods *m) {
    fa_test_mods_free(&m->host);
    for (int w = 0; w < FA_TEST_MOD_COUNT; w++)
        if (m->device[w]) CUDA_OK(cudaFree(m->device[w]));
    memset(m, 0, sizeof *m);
}

/* The device params of the problem with the device copies of the modifications. */
static fa_params device_params(const fa_test_problem *tp, const fa_params *host, const mods *m) {
    fa_params d = fa_test_problem_device_params(tp);
    d.device = FA_DEVICE_CUDA;
    /* every modification field as on the host, pointers to the device copies */
    d.bias = m->device[FA_TEST_MOD_BIAS];
    d.bias_dtype = host->bias_dtype;
    d.bias_batch_stride = host->bias_batch_stride;
    d.bias_head_stride = host->bias_head_stride;
    d.bias_row_stride = host->bias_row_stride;
    d.bias_col_stride = host->bias_col_stride;
    d.dbias = m->device[FA_TEST_MOD_DBIAS];
    d.dbias_dtype = host->dbias_dtype;
    d.dbias_batch_stride = host->dbias_batch_stride;
    d.dbias_head_stride = host->dbias_head_stride;
    d.dbias_row_stride = host->dbias_row_stride;
    d.dbias_col_stride = host->dbias_col_stride;
    d.block_q = host->block_q;
    d.block_k = host->block_k;
    d.kv_num_blocks = m->device[FA_TEST_MOD_COUNTS];
    d.kv_indices = m->device[FA_TEST_MOD_INDICES];
    d.full_kv_num_blocks = m->device[FA_TEST_MOD_FULL_COUNTS];
    d.full_kv_indices = m->device[FA_TEST_MOD_FULL_INDICES];
    d.block_count_batch_stride = host->block_count_batch_stride;
    d.block_count_head_stride = host->block_count_head_stride;
    d.block_index_batch_stride = host->block_index_batch_stride;
    d.block_index_head_stride = host->block_index_head_stride;
    d.block_index_row_stride = host->block_index_row_stride;
    d.partial_block_bits = m->device[FA_TEST_MOD_BITS];
    d.doc_ids_q = m->device[FA_TEST_MOD_DOC_Q];
    d.doc_ids_k = m->device[FA_TEST_MOD_DOC_K];
    d.doc_ids_q_batch_stride = host->doc_ids_q_batch_stride;
    d.doc_ids_k_batch_stride = host->doc_ids_k_batch_stride;
    return d;
}

/* dbias (host copy) against the oracle (fa_ref_dbias_compare: summed over the broadcast axes). */
static void check_dbias(const fa_params *p, const void *dbias, const fa_ref_problem *rp, const fa_ref_outputs *ref64,
                        const fa_ref_outputs *base, const char *label) {
    fa_ref_dbias_check c;
    if (fa_ref_dbias_compare(p, dbias, rp, ref64, base, &c) != 0) {
        EXPECT(0, "%s dbias: out of memory", label);
        return;
    }
    EXPECT(c.unwritten == 0, "%s dbias: %lld elements unwritten (NaN)", label, (long long)c.unwritten);
    EXPECT(c.err <= c.tol, "%s dbias: err %.3e > tol %.3e (baseline err %.3e, max|ref| %.3e)", label, c.err, c.tol,
           c.base_err, c.ref_max);
}

static uint64_t rng_state;
static uint64_t next_random(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static fa_test_spec make_spec(fa_dtype dtype, int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv,
                              int64_t d) {
    fa_test_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.batch = batch;
    s.seqlen_q = sq;
    s.seqlen_k = sk;
    s.heads_q = hq;
    s.heads_kv = hkv;
    s.head_dim = s.head_dim_v = d;
    s.layout = (fa_test_layout)(next_random() % 3);
    s.pad_align = 8;
    s.backward = 1;
    s.seed = next_random();
    return s;
}

/* One case: forward and backward on CUDA against the oracle; with det, the backward twice in
 * deterministic mode, bitwise equal. */
static void run_case(const fa_test_spec *spec, const fa_test_mods_spec *ms, int det, const char *label) {
    fa_test_problem tp;
    char desc[256], full_label[400];
    if (fa_test_problem_create(&tp, spec) != 0) {
        EXPECT(0, "%s: problem not created", label);
        return;
    }
    fa_test_describe(&tp, desc, sizeof desc);
    snprintf(full_label, sizeof full_label, "%s [%s %s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld%s seed %llu]",
             label, fa_test_dtype_name(tp.spec.dtype), desc, (long long)tp.spec.batch, (long long)tp.spec.seqlen_q,
             (long long)tp.spec.seqlen_k, (long long)tp.spec.heads_q, (long long)tp.spec.heads_kv,
             (long long)tp.spec.head_dim, tp.spec.varlen ? " varlen" : "", (unsigned long long)tp.spec.seed);
    fa_test_rng rng;
    fa_test_rng_seed(&rng, tp.spec.seed ^ 0xb1a5ull);
    mods m;
    memset(&m, 0, sizeof m);
    fa_params *p = &tp.params;
    fa_ref_gathered g;
    fa_ref_outputs ref64, base;
    if (fa_test_mods_make(&m.host, p, ms, &gpu_odds, &rng) != 0 ||
        fa_ref_references(p, tp.spec.dtype, 1, &g, &ref64, &base) != 0) {
        EXPECT(0, "%s: modifications or reference out of memory", full_label);
        mods_free(&m);
        fa_test_problem_destroy(&tp);
        return;
    }
    CUDA_OK(gpu_buffers_upload(tp.buffer, FA_T_COUNT));
    mods_upload(&m);
    fa_params d = device_params(&tp, p, &m);
    void *dbias_host = m.host.array[FA_TEST_MOD_DBIAS];
    const size_t dbias_bytes = m.host.bytes[FA_TEST_MOD_DBIAS];
    d.deterministic = det;
    int ok_before = failures;
    fa_status s = fa_forward(&d);
    EXPECT(s == FA_OK, "%s: fa_forward: %s", full_label, fa_last_error());
    if (s == FA_OK) {
        CUDA_OK(gpu_buffers_download(&tp.buffer[FA_T_O], 1));
        CUDA_OK(gpu_buffers_download(&tp.buffer[FA_T_LSE], 1));
        fa_test_check o = fa_test_compare(&tp, FA_T_O, &ref64, &base), lse = fa_test_compare(&tp, FA_T_LSE, &ref64, &base);
        EXPECT(o.ok, "%s o: err %.3e > tol %.3e (base %.3e) unwritten %lld nonfinite %lld clobbered %lld", full_label,
               o.err, o.tol, o.base_err, (long long)o.unwritten, (long long)o.nonfinite, (long long)o.clobbered);
        EXPECT(lse.ok, "%s lse: err %.3e > tol %.3e nonfinite %lld unwritten %lld", full_label, lse.err, lse.tol,
               (long long)lse.nonfinite, (long long)lse.unwritten);
        const int64_t inexact = fa_test_masked_rows_inexact(&tp, &ref64);
        EXPECT(inexact == 0, "%s: %lld elements of fully masked rows are not O = 0 / LSE = -inf", full_label,
               (long long)inexact);
        s = fa_backward(&d);
        EXPECT(s == FA_OK, "%s: fa_backward: %s", full_label, fa_last_error());
        if (s == FA_OK) {
            static const int grads[3] = {FA_T_DQ, FA_T_DK, FA_T_DV};
            for (int t = 0; t < 3; t++) {
                CUDA_OK(gpu_buffers_download(&tp.buffer[grads[t]], 1));
                fa_test_check c = fa_test_compare(&tp, grads[t], &ref64, &base);
                EXPECT(c.ok, "%s %s: err %.3e > tol %.3e (base %.3e, max|ref| %.3e) unwritten %lld nonfinite %lld",
                       full_label, fa_test_tensor_name(grads[t]), c.err, c.tol, c.base_err, c.ref_max,
                       (long long)c.unwritten, (long long)c.nonfinite);
            }
            if (d.dbias) {
                CUDA_OK(cudaMemcpy(dbias_host, d.dbias, dbias_bytes, cudaMemcpyDeviceToHost));
                check_dbias(p, dbias_host, &g.rp, &ref64, &base, full_label);
            }
            if (det) { /* a second run: every gradient bitwise the same */
                void *first[3];
                for (int t = 0; t < 3; t++) first[t] = fa_test_snapshot(&tp, grads[t]);
                float *dbias_first = NULL;
                if (d.dbias) {
                    dbias_first = malloc(dbias_bytes);
                    memcpy(dbias_first, dbias_host, dbias_bytes);
                }
                EXPECT(fa_backward(&d) == FA_OK, "%s: second fa_backward: %s", full_label, fa_last_error());
                for (int t = 0; t < 3; t++) {
                    CUDA_OK(gpu_buffers_download(&tp.buffer[grads[t]], 1));
                    EXPECT(fa_test_same_as_snapshot(&tp, grads[t], first[t]), "%s: deterministic %s differs run to run",
                           full_label, fa_test_tensor_name(grads[t]));
                    free(first[t]);
                }
                if (d.dbias) {
                    CUDA_OK(cudaMemcpy(dbias_host, d.dbias, dbias_bytes, cudaMemcpyDeviceToHost));
                    EXPECT(memcmp(dbias_first, dbias_host, dbias_bytes) == 0,
                           "%s: deterministic dbias differs run to run", full_label);
                }
                free(dbias_first);
            }
        }
    }
    printf("%s %s\n", failures == ok_before ? "ok  " : "FAIL", full_label);
    fa_ref_references_free(&g, &ref64, &base);
    CUDA_OK(gpu_buffers_release(tp.buffer, FA_T_COUNT));
    mods_free(&m);
    fa_test_problem_destroy(&tp);
}

/* ---- 1-2. cases ------------------------------------------------------------------------------ */

static void bias_cases(int small) {
    static const fa_test_bias_kind kinds[4] = {FA_TEST_BIAS_FULL, FA_TEST_BIAS_HEAD, FA_TEST_BIAS_KEYPAD,
                                               FA_TEST_BIAS_ROW};
    static const fa_dtype bias_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    static const int64_t shapes[][6] = {{2, 100, 130, 4, 2, 64}, {1, 1, 77, 2, 1, 128}, {3, 65, 33, 6, 3, 40},
                                        {1, 90, 200, 2, 2, 256}, {1, 70, 150, 4, 2, 512}};
    const int n_shapes = small ? 2 : 5;
    for (int si = 0; si < n_shapes; si++)
        for (int k = 0; k < 4; k++) {
            const int64_t *sh = shapes[si];
            fa_test_spec spec = make_spec((si + k) % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, sh[0], sh[1], sh[2], sh[3],
                                          sh[4], sh[5]);
            fa_test_mods_spec ms = {kinds[k], bias_dtypes[(si + k) % 3], k < 2, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32};
            ms.dbias_dtype = bias_dtypes[(si + 2 * k + 1) % 3]; /* every pairing over the cases */
            if (k == 1) spec.causal = 1;
            if (k == 2) spec.softcap = 4.0f;
            if (k == 3) {
                spec.alibi = FA_TEST_ALIBI_HEAD;
                spec.use_window = 1;
                spec.window_left = 9;
                spec.window_right = 3;
            }
            run_case(&spec, &ms, 0, "bias");
        }
    /* varlen, GQA, sinks */
    for (int t = 0; t < (small ? 1 : 3); t++) {
        fa_test_spec spec = make_spec(t == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 4, 37, 70, 6, 2, 48);
        spec.varlen = 1;
        spec.causal = t != 1;
        spec.sinks = t == 2;
        spec.layout = FA_TEST_LAYOUT_PADDED;
        fa_test_mods_spec ms = {t == 1 ? FA_TEST_BIAS_HEAD : FA_TEST_BIAS_FULL, FA_DTYPE_BF16, 1, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32};
        run_case(&spec, &ms, 0, "bias varlen");
    }
}

static void doc_cases(int small) {
    for (int t = 0; t < (small ? 1 : 2); t++) {
        fa_test_spec spec = make_spec(t ? FA_DTYPE_F16 : FA_DTYPE_BF16, 2, 150, 150, 4, 2, 32);
        spec.causal = 1;
        fa_test_mods_spec ms = {FA_TEST_BIAS_NONE, FA_DTYPE_F32, 0, 0, 0, 0, 0, 0, 0, 1, FA_DTYPE_F32};
        run_case(&spec, &ms, 0, "doc ids");
        spec.varlen = 1;
        spec.layout = FA_TEST_LAYOUT_PADDED;
        ms.bias = FA_TEST_BIAS_KEYPAD;
        ms.dbias = 1;
        run_case(&spec, &ms, 0, "doc ids varlen + key padding");
    }
}

static void block_cases(int small) {
    /* block sizes are multiples of every kernel tile: 128 × 128, or 256 × 128 */
    static const int64_t shapes[][6] = {{2, 300, 400, 4, 2, 64}, {1, 257, 129, 2, 1, 128}, {2, 130, 520, 2, 2, 256},
                                        {3, 200, 300, 3, 1, 40}, {1, 200, 300, 2, 1, 512}};
    const int n_shapes = small ? 2 : 5;
    for (int si = 0; si < n_shapes; si++)
        for (int z = 0; z < (small ? 3 : 5); z++) {
            const int64_t *sh = shapes[si];
            fa_test_spec spec = make_spec(z % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
            spec.causal = z % 2;
            if (z == 3) {
                spec.use_window = 1;
                spec.window_left = 100;
                spec.window_right = -1;
            }
            if (z == 4) {
                spec.varlen = 1;
                spec.layout = FA_TEST_LAYOUT_PADDED;
            }
            fa_test_mods_spec ms = {z == 2 ? FA_TEST_BIAS_FULL : FA_TEST_BIAS_NONE, FA_DTYPE_F32, 0, z == 2, 1,
                                    z == 2 ? 256 : 128, 128, z == 1, z != 3, z >= 3, FA_DTYPE_F32};
            run_case(&spec, &ms, 0, "block mask");
        }
}

/* Shapes the Hopper kernels' MODS instantiations take on sm_90 (forward: head dims 64 to 512,
 * block masks of whole Hopper tiles, 128 × 128 multiples, 320 keys at d = 256, 128 × 192 at
 * d = 512 (128 × 64 tiles); backward: d 64 to 128, without softcap): block lists with and without bit masks, a bias with its gradient,
 * document ids, a window inside partial blocks, varlen, MQA with the group split over CTAs. */
static void hopper_cases(int small) {
    static const int64_t shapes[][8] = {{2, 300, 700, 4, 2, 128, 128, 128}, {1, 513, 257, 4, 4, 96, 256, 128},
                                        {2, 200, 700, 2, 1, 256, 128, 320}, {1, 129, 1000, 6, 2, 128, 128, 256},
                                        {1, 200, 600, 8, 1, 128, 128, 128}, {2, 260, 390, 4, 2, 64, 128, 128},
                                        {1, 200, 500, 4, 2, 512, 128, 192}};
    /* `small` (the sanitizers' run): the first shape and the d = 512 one (CTA pairs) */
    static const int order[] = {0, 6, 1, 2, 3, 4, 5};
    const int n_shapes = small ? 2 : 7;
    for (int oi = 0; oi < n_shapes; oi++)
        for (int z = 0; z < (small ? 2 : 5); z++) {
            const int64_t *sh = shapes[order[oi]];
            fa_test_spec spec = make_spec(z % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5]);
            spec.causal = z % 2;
            if (z == 3) {
                spec.use_window = 1;
                spec.window_left = 150;
                spec.window_right = 20;
            }
            if (z == 4) {
                spec.varlen = 1;
                spec.layout = FA_TEST_LAYOUT_PADDED;
            }
            if (z == 2) spec.softcap = 5.0f;
            /* z: 0 block lists + bits, 1 block lists + full bias and dbias, 2 document ids + key
             * padding (no block mask), 3 block lists + documents + window, 4 varlen block lists + bits */
            fa_test_mods_spec ms = {z == 1   ? FA_TEST_BIAS_FULL
                                    : z == 2 ? FA_TEST_BIAS_KEYPAD
                                             : FA_TEST_BIAS_NONE,
                                    z == 1 ? FA_DTYPE_BF16 : FA_DTYPE_F32,
                                    z == 1,
                                    z == 1 || z == 2,
                                    z != 2,
                                    z != 2 ? sh[6] : 0,
                                    z != 2 ? sh[7] : 0,
                                    order[oi] == 1,
                                    z == 0 || z == 4,
                                    z == 2 || z == 3,
                                    z == 1 ? FA_DTYPE_BF16 : FA_DTYPE_F32};
            run_case(&spec, &ms, 0, "Hopper-tiled mods");
        }
}

static void deterministic_cases(void) {
    fa_test_spec spec = make_spec(FA_DTYPE_BF16, 3, 200, 260, 4, 2, 64);
    spec.causal = 1;
    fa_test_mods_spec ms = {FA_TEST_BIAS_HEAD, FA_DTYPE_F32, 1, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32}; /* dbias summed over the batch */
    run_case(&spec, &ms, 1, "deterministic dbias (per-head table)");
    fa_test_mods_spec keypad = {FA_TEST_BIAS_KEYPAD, FA_DTYPE_BF16, 0, 1, 1, 128, 128, 0, 1, 1, FA_DTYPE_F32};
    run_case(&spec, &keypad, 1, "deterministic dbias (key padding) + block mask");
}

/* ---- 1b. fa_kvcache_forward with a bias: CUDA against the CPU engine ---------------------------- */

static void kvcache_cases(void) {
    enum { KB = 2, KSQ = 3, KCAP = 300, KHQ = 4, KHKV = 2, KD = 64 };
    const size_t nq = (size_t)KB * KSQ * KHQ * KD, nkv = (size_t)KB * KCAP * KHKV * KD;
    const size_t nbias = (size_t)KB * KHQ * KSQ * KCAP, nlse = (size_t)KB * KHQ * KSQ;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, next_random());
    uint16_t *q = malloc(2 * nq), *k = malloc(2 * nkv), *v = malloc(2 * nkv), *o_cpu = malloc(2 * nq),
             *o_gpu = malloc(2 * nq);
    float *bias = malloc(4 * nbias), *lse_cpu = malloc(4 * nlse), *lse_gpu = malloc(4 * nlse);
    for (size_t e = 0; e < nq; e++) fa_test_store(q, FA_DTYPE_BF16, (int64_t)e, fa_test_rng_normal(&rng));
    for (size_t e = 0; e < nkv; e++) {
        fa_test_store(k, FA_DTYPE_BF16, (int64_t)e, fa_test_rng_normal(&rng));
        fa_test_store(v, FA_DTYPE_BF16, (int64_t)e, fa_test_rng_normal(&rng));
    }
    for (size_t e = 0; e < nbias; e++)
        bias[e] = fa_test_rng_uniform(&rng) < 0.1 ? -INFINITY : (float)(1.5 * fa_test_rng_normal(&rng));
    /* one whole row of sequence 1, head 2, query 0 masked */
    for (int c = 0; c < KCAP; c++) bias[(((size_t)1 * KHQ + 2) * KSQ + 0) * KCAP + c] = -INFINITY;
    const int32_t seqlens[KB] = {150, 290}, leftpad[KB] = {0, 37};
    void *dq, *dk, *dv, *dout, *dbias, *dlse, *dlens, *dpad;
    CUDA_OK(cudaMalloc(&dq, 2 * nq));
    CUDA_OK(cudaMalloc(&dk, 2 * nkv));
    CUDA_OK(cudaMalloc(&dv, 2 * nkv));
    CUDA_OK(cudaMalloc(&dout, 2 * nq));
    CUDA_OK(cudaMalloc(&dbias, 4 * nbias));
    CUDA_OK(cudaMalloc(&dlse, 4 * nlse));
    CUDA_OK(cudaMalloc(&dlens, sizeof seqlens));
    CUDA_OK(cudaMalloc(&dpad, sizeof leftpad));
    CUDA_OK(cudaMemcpy(dq, q, 2 * nq, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, k, 2 * nkv, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, v, 2 * nkv, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dbias, bias, 4 * nbias, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dlens, seqlens, sizeof seqlens, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpad, leftpad, sizeof leftpad, cudaMemcpyHostToDevice));
    for (int variant = 0; variant < 4; variant++) { /* causal x left padding */
        fa_params p;
        memset(&p, 0, sizeof p);
        p.dtype = FA_DTYPE_BF16;
        p.batch = KB;
        p.seqlen_q = KSQ;
        p.seqlen_k = KCAP;
        p.heads_q = KHQ;
        p.heads_kv = KHKV;
        p.head_dim = KD;
        fa_set_contiguous_strides(&p);
        p.causal = variant & 1;
        p.bias_dtype = FA_DTYPE_F32;
        p.bias_batch_stride = (int64_t)KHQ * KSQ * KCAP;
        p.bias_head_stride = (int64_t)KSQ * KCAP;
        p.bias_row_stride = KCAP;
        p.bias_col_stride = 1;
        fa_params c = p, g = p;
        c.device = FA_DEVICE_CPU;
        c.q = q, c.k = k, c.v = v, c.o = o_cpu, c.lse = lse_cpu, c.bias = bias, c.cache_seqlens = seqlens;
        c.cache_leftpad = variant & 2 ? leftpad : NULL;
        g.device = FA_DEVICE_CUDA;
        g.q = dq, g.k = dk, g.v = dv, g.o = dout, g.lse = dlse, g.bias = dbias, g.cache_seqlens = dlens;
        g.cache_leftpad = variant & 2 ? dpad : NULL;
        CUDA_OK(cudaMemset(dout, 0x7f, 2 * nq));
        CUDA_OK(cudaMemset(dlse, 0x7f, 4 * nlse));
        fa_status sc = fa_kvcache_forward(&c), sg = fa_kvcache_forward(&g);
        EXPECT(sc == FA_OK && sg == FA_OK, "kvcache bias variant %d: cpu %s, cuda %s (%s)", variant, fa_strerror(sc),
               fa_strerror(sg), fa_last_error());
        if (sc != FA_OK || sg != FA_OK) continue;
        CUDA_OK(cudaMemcpy(o_gpu, dout, 2 * nq, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lse_gpu, dlse, 4 * nlse, cudaMemcpyDeviceToHost));
        double o_err = 0, lse_err = 0;
        int64_t mismatched_inf = 0;
        for (size_t e = 0; e < nq; e++) {
            const double d = fabs(fa_test_load(o_gpu, FA_DTYPE_BF16, (int64_t)e) - fa_test_load(o_cpu, FA_DTYPE_BF16, (int64_t)e));
            if (!(d <= o_err)) o_err = isnan(d) ? INFINITY : d;
        }
        for (size_t e = 0; e < nlse; e++) {
            if (isinf(lse_cpu[e]) || isinf(lse_gpu[e])) {
                mismatched_inf += lse_cpu[e] != lse_gpu[e];
                continue;
            }
            const double d = fabs((double)lse_gpu[e] - lse_cpu[e]);
            if (!(d <= lse_err)) lse_err = isnan(d) ? INFINITY : d;
        }
        EXPECT(o_err <= 3e-2 && lse_err <= 1e-2 && mismatched_inf == 0,
               "kvcache bias variant %d (causal %d, leftpad %d): |o cuda - o cpu| %.3e, |lse| %.3e, %lld -inf "
               "mismatches", variant, variant & 1, variant >> 1, o_err, lse_err, (long long)mismatched_inf);
        printf("%s kvcache bias (causal %d, leftpad %d): |o cuda - o cpu| %.3e, |lse| %.3e\n",
               o_err <= 3e-2 && lse_err <= 1e-2 && mismatched_inf == 0 ? "ok  " : "FAIL", variant & 1, variant >> 1,
               o_err, lse_err);
    }
    void *bufs[] = {dq, dk, dv, dout, dbias, dlse, dlens, dpad};
    for (int i = 0; i < 8; i++) CUDA_OK(cudaFree(bufs[i]));
    free(q);
    free(k);
    free(v);
    free(o_cpu);
    free(o_gpu);
    free(bias);
    free(lse_cpu);
    free(lse_gpu);
}

/* ---- 3. rejections --------------------------------------------------------------------------- */

/* 1 if the n bytes at device address p all still hold `byte`. */
static int untouched(const void *p, size_t n, unsigned char byte) {
    unsigned char *host = malloc(n);
    CUDA_OK(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += host[i] != byte;
    free(host);
    return bad == 0;
}

enum { RB = 1, RS = 256, RH = 2, RD = 64, RN = RB * RS * RH * RD, RKB = RS / 128 };

static void expect_rejected(const char *label, const fa_params *p, int backward, fa_status want, const char *field) {
    fa_status s = backward ? fa_backward(p) : fa_forward(p);
    EXPECT(s == want && strstr(fa_last_error(), field), "%s: %s (%s), want %s naming %s", label, fa_strerror(s),
           fa_last_error(), fa_strerror(want), field);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT(untouched(p->o, sizeof(unsigned short) * RN, 0x7f) || backward, "%s: o was written", label);
    EXPECT(untouched(p->lse, sizeof(float) * RB * RH * RS, 0x7f) || backward, "%s: lse was written", label);
    if (backward) {
        EXPECT(untouched(p->dq, sizeof(unsigned short) * RN, 0x7f), "%s: dq was written", label);
        EXPECT(untouched(p->dk, sizeof(unsigned short) * RN, 0x7f), "%s: dk was written", label);
        if (p->dbias) EXPECT(untouched(p->dbias, sizeof(float) * RS * RS, 0x7f), "%s: dbias was written", label);
    }
    printf("%s rejected: %s\n", label, fa_last_error());
}

/* The outputs of a rejection problem back to the poison expect_rejected looks for. */
static void repoison(const fa_params *p) {
    const size_t t = sizeof(unsigned short) * RN;
    CUDA_OK(cudaMemset(p->o, 0x7f, t));
    CUDA_OK(cudaMemset(p->lse, 0x7f, sizeof(float) * RB * RH * RS));
    CUDA_OK(cudaMemset(p->dq, 0x7f, t));
    CUDA_OK(cudaMemset(p->dk, 0x7f, t));
    CUDA_OK(cudaMemset(p->dv, 0x7f, t));
    if (p->dbias) CUDA_OK(cudaMemset(p->dbias, 0x7f, sizeof(float) * RS * RS));
}

static void rejection_cases(void) {
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *bias, *dbias, *lse, *ints;
    const size_t t = sizeof(unsigned short) * RN;
    void **bufs[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++) {
        CUDA_OK(cudaMalloc(bufs[i], t));
        CUDA_OK(cudaMemset(*bufs[i], i != 3 && i < 5 ? 0 : 0x7f, t));
    }
    CUDA_OK(cudaMalloc(&bias, sizeof(float) * RS * RS));
    CUDA_OK(cudaMemset(bias, 0, sizeof(float) * RS * RS));
    CUDA_OK(cudaMalloc(&dbias, sizeof(float) * RS * RS));
    CUDA_OK(cudaMemset(dbias, 0x7f, sizeof(float) * RS * RS));
    CUDA_OK(cudaMalloc(&lse, sizeof(float) * RB * RH * RS));
    CUDA_OK(cudaMemset(lse, 0x7f, sizeof(float) * RB * RH * RS));
    CUDA_OK(cudaMalloc(&ints, sizeof(int32_t) * 64));

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = RB;
    p.seqlen_q = p.seqlen_k = RS;
    p.heads_q = p.heads_kv = RH;
    p.head_dim = RD;
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse;
    p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
    fa_set_contiguous_strides(&p);
    p.causal = 1;

    /* block lists [1, 1, q_blocks = 2] counts and [.., 2, kv_blocks = 2] indices, broadcast */
    fa_params m = p;
    m.block_q = m.block_k = 128;
    int32_t *counts = (int32_t *)ints, *indices = (int32_t *)ints + 8, *full_counts = (int32_t *)ints + 16,
            *full = (int32_t *)ints + 24;
    m.kv_num_blocks = counts;
    m.kv_indices = indices;
    m.block_index_row_stride = RKB;
    m.bias = bias;
    m.bias_row_stride = RS;
    m.bias_col_stride = 1;
    m.dbias = dbias;
    m.dbias_row_stride = RS;
    m.dbias_col_stride = 1;
    struct {
        const char *label;
        int32_t counts[2], indices[4], full_counts[2], full[4];
        int with_full;
        const char *field;
    } bad[] = {
        {"unsorted kv_indices", {2, 1}, {1, 0, 0, -7}, {0, 0}, {0}, 0, "kv_indices"},
        {"kv_indices out of range", {1, 1}, {0, -7, 2, -7}, {0, 0}, {0}, 0, "kv_indices"},
        {"kv_num_blocks out of range", {1, 3}, {0, -7, 0, 1}, {0, 0}, {0}, 0, "kv_num_blocks"},
        {"a block both partial and full", {1, 1}, {0, -7, 1, -7}, {0, 1}, {0, -7, 1, -7}, 1, "full_kv_indices"},
    };
    /* block_lists_checked = 1: the host does not wait for the device's verdict. Valid lists give
     * bit for bit the outputs of the checked call; bad ones (below) are not reported and the
     * calls stay inside every array (memcheck on the small run), their outputs unspecified. */
    {
        const int32_t good[32] = {1, 2, 0, 0, 0, 0, 0, 0, 0, -7, 0, 1};
        CUDA_OK(cudaMemcpy(ints, good, sizeof good, cudaMemcpyHostToDevice));
        unsigned short *o_host[2], *dq_host[2];
        for (int trusted = 0; trusted < 2; trusted++) {
            fa_params x = m;
            x.block_lists_checked = trusted;
            fa_status sf = fa_forward(&x), sb = fa_backward(&x);
            EXPECT(sf == FA_OK && sb == FA_OK, "valid lists, block_lists_checked %d: %s / %s (%s)", trusted,
                   fa_strerror(sf), fa_strerror(sb), fa_last_error());
            o_host[trusted] = malloc(t);
            dq_host[trusted] = malloc(t);
            CUDA_OK(cudaMemcpy(o_host[trusted], o, t, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(dq_host[trusted], dq, t, cudaMemcpyDeviceToHost));
        }
        const int same = memcmp(o_host[0], o_host[1], t) == 0 && memcmp(dq_host[0], dq_host[1], t) == 0;
        EXPECT(same, "valid lists: block_lists_checked 1 changed o or dq");
        printf("%s valid lists said checked: o and dq bit for bit the checked call's\n", same ? "ok  " : "FAIL");
        for (int i = 0; i < 2; i++) {
            free(o_host[i]);
            free(dq_host[i]);
        }
        repoison(&m);
    }
    int ran = 1;
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        int32_t host[32] = {0};
        memcpy(host, bad[c].counts, 8);
        memcpy(host + 8, bad[c].indices, 16);
        memcpy(host + 16, bad[c].full_counts, 8);
        memcpy(host + 24, bad[c].full, 16);
        CUDA_OK(cudaMemcpy(ints, host, sizeof host, cudaMemcpyHostToDevice));
        fa_params x = m;
        if (bad[c].with_full) {
            x.full_kv_num_blocks = full_counts;
            x.full_kv_indices = full;
        }
        char label[128];
        snprintf(label, sizeof label, "forward, %s", bad[c].label);
        expect_rejected(label, &x, 0, FA_ERR_INVALID_ARGUMENT, bad[c].field);
        snprintf(label, sizeof label, "backward, %s", bad[c].label);
        expect_rejected(label, &x, 1, FA_ERR_INVALID_ARGUMENT, bad[c].field);
        x.block_lists_checked = 1;
        fa_status sf = fa_forward(&x), sb = fa_backward(&x);
        EXPECT(sf == FA_OK && sb == FA_OK, "%s said checked: %s / %s (%s)", bad[c].label, fa_strerror(sf),
               fa_strerror(sb), fa_last_error());
        ran &= sf == FA_OK && sb == FA_OK;
        CUDA_OK(cudaDeviceSynchronize());
        repoison(&m);
    }
    printf("%s bad lists said checked: not reported, the calls ran\n", ran ? "ok  " : "FAIL");

    fa_params odd = m;
    odd.block_q = 96;
    expect_rejected("block_q not a multiple of the tile", &odd, 0, FA_ERR_UNSUPPORTED, "block_q");
    odd.block_q = 128;
    odd.block_k = 48;
    expect_rejected("block_k not a multiple of the tile", &odd, 1, FA_ERR_UNSUPPORTED, "block_k");

    fa_params kv = p;
    kv.seqlen_q = 1;
    kv.doc_ids_q = (const int32_t *)ints;
    kv.doc_ids_k = (const int32_t *)ints + 8;
    fa_status s = fa_kvcache_forward(&kv);
    EXPECT(s == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "doc_ids"), "kvcache with doc ids: %s (%s)",
           fa_strerror(s), fa_last_error());
    EXPECT(untouched(o, t, 0x7f), "kvcache with doc ids: o was written");

    for (int i = 0; i < 8; i++) CUDA_OK(cudaFree(*bufs[i]));
    CUDA_OK(cudaFree(bias));
    CUDA_OK(cudaFree(dbias));
    CUDA_OK(cudaFree(lse));
    CUDA_OK(cudaFree(ints));
}

int gpu_mods_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    if (!fa_cuda_available()) {
        printf("mods: no CUDA device\n");
        return 1;
    }
    rng_state = fa_test_fresh_seed();
    printf("mods: seed %llu%s\n", (unsigned long long)rng_state, small ? " (small)" : "");
    rejection_cases();
    bias_cases(small);
    kvcache_cases();
    doc_cases(small);
    block_cases(small);
    hopper_cases(small);
    if (!small) deterministic_cases();
    printf("mods: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
