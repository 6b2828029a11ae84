/*
 * tests/gpu/dropout.c: attention dropout on CUDA (`fa_gpu_tests dropout [small]`).
 *   1. forward and backward against the float64 oracle with the same mask (fa_case_run, which
 *      applies src/api/fa_philox.h in the reference, poisons every output with NaN and counts
 *      the elements left unwritten), over fresh seeds and odd shapes: sq != sk, GQA/MQA, varlen
 *      with an empty sequence, causal with fully masked rows, window, softcap, ALiBi, sinks, head
 *      dims 40..256, key counts 1, 15, 17, 33 (around the sixteen keys of a Philox call); each
 *      case on four kernel paths: the default ones (on sm_90 the Hopper forward and backward,
 *      every bucket), the same with deterministic = 1,
 *      the portable forward with the portable backward (FA_CUDA_FORWARD=portable,
 *      FA_CUDA_BACKWARD=portable: the bigsmem kernel on sm_90), and the portable forward with
 *      the sm_80 backward kernel (FA_CUDA_BACKWARD=sm80), so that every dropout kernel runs on
 *      sm_90;
 *   2. the CUDA mask equals the CPU engine's bit for bit: attn_probs from both devices on the
 *      same problem have the same sign everywhere (negated = dropped), and close magnitudes;
 *   3. the same seed and offset give bitwise the same O, LSE, dq, dk, dv (deterministic backward;
 *      dk, dv in the default mode too); another offset gives another O; the LSE equals the one
 *      without dropout bitwise (on the portable forward and on the default one: each kernel's
 *      two instantiations share the softmax);
 *   4. the kernels' masks bit for bit: with q = 0 (P = 1 / seqlen_k), V one-hot over the keys and
 *      dO one-hot over the queries, O[i][j] != 0 exactly where element (i, j) is kept, and so is
 *      dV[j][i] (one query head per kv head): every element of both compared with
 *      fa_dropout_keep, on every kernel path, with counter offsets that cross 2^32, all buckets.
 * `small` runs a few small problems of each part (for compute-sanitizer).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/fa_philox.h"
#include "flashattn.h"
#include "gpu_util.h"
#include "oracle/sweep_case.h"

static int failures;

#define EXPECT(cond, ...) GPU_EXPECT(failures, "dropout", cond, __VA_ARGS__)

static uint64_t rng_state;
static uint64_t next_random(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct shape {
    const char *name;
    fa_dtype dtype;
    int64_t batch, sq, sk, hq, hkv, d;
    int varlen, causal, window_left, window_right, sinks, alibi;
    float softcap;
} shape;

static const shape shapes[] = {
    {"plain sq != sk", FA_DTYPE_BF16, 2, 113, 203, 4, 4, 64, 0, 0, -1, -1, 0, 0, 0.0f},
    {"GQA causal, fully masked rows (sq > sk)", FA_DTYPE_F16, 1, 203, 77, 6, 2, 128, 0, 1, -1, -1, 0, 0, 0.0f},
    {"MQA varlen sinks", FA_DTYPE_BF16, 3, 150, 130, 3, 1, 96, 1, 0, -1, -1, 1, 0, 0.0f},
    {"window softcap ALiBi d256", FA_DTYPE_BF16, 1, 64, 300, 2, 2, 256, 0, 0, 40, 7, 0, 1, 5.0f},
    {"GQA causal d512 (large heads)", FA_DTYPE_BF16, 1, 90, 140, 4, 2, 512, 0, 1, -1, -1, 0, 0, 0.0f},
    {"causal varlen GQA sinks d40", FA_DTYPE_F16, 2, 70, 70, 4, 2, 40, 1, 1, -1, -1, 1, 0, 0.0f},
    {"long rows d128", FA_DTYPE_BF16, 1, 129, 1023, 2, 1, 128, 0, 0, -1, -1, 0, 0, 0.0f},
    {"GQA causal odd d64", FA_DTYPE_BF16, 2, 157, 211, 8, 2, 64, 0, 1, -1, -1, 0, 0, 0.0f},
    {"varlen causal GQA d128", FA_DTYPE_F16, 3, 190, 170, 4, 2, 128, 1, 1, -1, -1, 0, 0, 0.0f},
    {"ALiBi window d64 (log2 scores)", FA_DTYPE_BF16, 2, 99, 140, 4, 4, 64, 0, 0, 20, 5, 0, 1, 0.0f},
    {"softcap sinks d128", FA_DTYPE_BF16, 1, 200, 260, 2, 2, 128, 0, 0, -1, -1, 1, 0, 8.0f},
    {"causal d256", FA_DTYPE_BF16, 2, 100, 130, 2, 2, 256, 0, 1, -1, -1, 0, 0, 0.0f},
    {"GQA varlen causal d192", FA_DTYPE_BF16, 3, 90, 120, 4, 2, 192, 1, 1, -1, -1, 0, 0, 0.0f},
    /* key counts around the sixteen keys of a Philox call */
    {"one key d256", FA_DTYPE_BF16, 2, 19, 1, 2, 1, 256, 0, 0, -1, -1, 0, 0, 0.0f},
    {"15 keys GQA d128", FA_DTYPE_F16, 2, 40, 15, 4, 2, 128, 0, 0, -1, -1, 0, 0, 0.0f},
    {"17 keys causal d64", FA_DTYPE_BF16, 1, 17, 17, 2, 2, 64, 0, 1, -1, -1, 0, 0, 0.0f},
    {"33 keys varlen GQA d256", FA_DTYPE_F16, 2, 45, 33, 4, 2, 256, 1, 0, -1, -1, 1, 0, 0.0f},
    {"varlen window sinks d320", FA_DTYPE_F16, 3, 70, 99, 2, 1, 320, 1, 0, 30, 9, 1, 0, 0.0f},
};
#define SMALL_SHAPES 5 /* `small`: the first five (Hopper buckets 64, 128, 256 and 512), shrunk */

static fa_test_spec make_spec(const shape *sh, int small, float p_drop) {
    fa_test_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = sh->dtype;
    s.batch = sh->batch;
    s.seqlen_q = small && sh->sq > 40 ? 40 : sh->sq;
    s.seqlen_k = small && sh->sk > 50 ? 50 : sh->sk;
    if (small && sh->sq > sh->sk) s.seqlen_q = s.seqlen_k + 9; /* keep the fully masked rows */
    s.heads_q = sh->hq;
    s.heads_kv = sh->hkv;
    s.head_dim = sh->d;
    s.head_dim_v = sh->d;
    s.varlen = sh->varlen;
    s.causal = sh->causal;
    s.use_window = sh->window_left >= 0 || sh->window_right >= 0;
    s.window_left = sh->window_left;
    s.window_right = sh->window_right;
    s.sinks = sh->sinks;
    s.alibi = sh->alibi ? FA_TEST_ALIBI_BATCH_HEAD : FA_TEST_ALIBI_NONE;
    s.softcap = sh->softcap;
    s.layout = (fa_test_layout)(next_random() % 3);
    s.pad_align = 8;
    s.backward = 1;
    s.seed = next_random();
    s.dropout_p = p_drop;
    s.dropout_seed = next_random();
    s.dropout_offset = next_random() >> (next_random() % 63 + 1);
    return s;
}

/* ---- 1. against the float64 oracle ----------------------------------------------------------- */

/* The kernel paths of part 1: the environment that forces them (NULL: the default) and
 * deterministic mode. */
typedef struct kernel_path {
    const char *name, *forward, *backward;
    int deterministic;
} kernel_path;

static const kernel_path paths[] = {
    {"default kernels", NULL, NULL, 0},
    {"default kernels, deterministic", NULL, NULL, 1},
    {"portable fwd + bwd", "portable", "portable", 0},
    {"portable fwd + sm80 bwd", "portable", "sm80", 0},
};

static void set_path(const kernel_path *k) {
    if (k->forward) setenv("FA_CUDA_FORWARD", k->forward, 1);
    else unsetenv("FA_CUDA_FORWARD");
    if (k->backward) setenv("FA_CUDA_BACKWARD", k->backward, 1);
    else unsetenv("FA_CUDA_BACKWARD");
}

static void oracle_cases(int small) {
    static const float probs[] = {0.1f, 0.3f, 0.6f};
    const int n_shapes = small ? SMALL_SHAPES : (int)(sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < n_shapes; si++)
        for (int pi = 0; pi < (small ? 1 : 3); pi++)
            for (int kernel = 0; kernel < (int)(sizeof paths / sizeof paths[0]); kernel++) {
                set_path(&paths[kernel]);
                fa_test_spec spec = make_spec(&shapes[si], small, probs[pi]);
                spec.deterministic = paths[kernel].deterministic;
                fa_case_result r;
                char what[256];
                const int rc = fa_case_run(&spec, FA_DEVICE_CUDA, 0, &r);
                fa_case_describe(&r.spec, what, sizeof what);
                char fwd[512], bwd[512];
                fa_case_format(&r, 0, 0, fwd, sizeof fwd);
                fa_case_format(&r, 1, 0, bwd, sizeof bwd);
                const int ok = rc == 0 && !r.skipped && r.fwd_ok && r.bwd_ok;
                printf("%s %s p=%.1f seed %llu (%s):%s |%s %s%s\n", ok ? "ok  " : "FAIL", shapes[si].name,
                       (double)probs[pi], (unsigned long long)spec.seed, paths[kernel].name, fwd, bwd,
                       r.skipped ? r.skip_reason : "", r.error);
                if (!ok) {
                    printf("     %s\n", what);
                    failures++;
                }
            }
    unsetenv("FA_CUDA_FORWARD");
    unsetenv("FA_CUDA_BACKWARD");
}

/* ---- device copies of a test problem ------------------------------------------------------- */

static int upload(fa_test_problem *tp) {
    for (int b = 0; b < FA_T_COUNT; b++) {
        fa_test_buffer *buf = &tp->buffer[b];
        if (!buf->host) continue;
        if (cudaMalloc(&buf->device, buf->bytes) != cudaSuccess ||
            cudaMemcpy(buf->device, buf->host, buf->bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            return -1;
    }
    return 0;
}

static void release(fa_test_problem *tp) {
    for (int b = 0; b < FA_T_COUNT; b++)
        if (tp->buffer[b].device) {
            cudaFree(tp->buffer[b].device);
            tp->buffer[b].device = NULL;
        }
}

static int download(void *host, const void *device, size_t bytes) {
    return cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

/* ---- 2. the CUDA mask equals the CPU mask --------------------------------------------------- */

/* A varlen draw may leave few or no (query, key) pairs visible (every sequence empty on one side),
 * and with a handful of elements "some dropped, some kept" is a coin toss: such a draw is
 * counted as not comparable and drawn again with fresh seeds (MIN_VISIBLE elements at least:
 * all 64 dropped at the largest p, 0.85, has probability 3e-5, all kept far less). */
#define MIN_VISIBLE 64
#define MASK_DRAWS 8

/* One draw of shape sh: 1 = compared (results counted), 0 = too few visible elements. */
static int mask_case(const shape *sh, int small, float p_drop) {
    fa_test_spec spec = make_spec(sh, small, p_drop);
    spec.backward = 0;
    fa_test_problem tp;
    int compared = 1;
    if (fa_test_problem_create(&tp, &spec) || upload(&tp)) {
        EXPECT(0, "%s: could not set up the problem", sh->name);
        release(&tp);
        return 1;
    }
    fa_params cpu = tp.params, gpu = fa_test_problem_device_params(&tp);
    cpu.device = FA_DEVICE_CPU;
    gpu.device = FA_DEVICE_CUDA;
    const size_t n = (size_t)(cpu.batch * cpu.heads_q * cpu.seqlen_q * cpu.seqlen_k);
    float *cpu_probs = malloc(sizeof(float) * n + 4), *gpu_probs = malloc(sizeof(float) * n + 4);
    float *dev_probs = NULL;
    int ready = cpu_probs && gpu_probs && cudaMalloc((void **)&dev_probs, sizeof(float) * n + 4) == cudaSuccess &&
                cudaMemset(dev_probs, 0xff, sizeof(float) * n + 4) == cudaSuccess; /* NaN: unwritten */
    cpu.attn_probs = cpu_probs;
    gpu.attn_probs = dev_probs;
    fa_status sc = ready ? fa_forward(&cpu) : FA_ERR_ALLOC;
    fa_status sg = ready ? fa_forward(&gpu) : FA_ERR_ALLOC;
    ready = ready && cudaDeviceSynchronize() == cudaSuccess && download(gpu_probs, dev_probs, sizeof(float) * n) == 0;
    EXPECT(sc == FA_OK && sg == FA_OK && ready, "%s: attn_probs forward: cpu %s, cuda %s (%s)", sh->name,
           fa_strerror(sc), fa_strerror(sg), fa_last_error());
    if (sc == FA_OK && sg == FA_OK && ready) {
        size_t sign_diff = 0, value_diff = 0, dropped = 0, kept = 0, unwritten = 0;
        double worst = 0.0;
        for (size_t e = 0; e < n; e++) {
            const float c = cpu_probs[e], g = gpu_probs[e];
            unwritten += isnan(g);
            sign_diff += signbit(c) != signbit(g);
            const double err = fabs((double)c - (double)g);
            value_diff += err > 2e-5 + 1e-4 * fabs((double)c);
            if (err > worst) worst = err;
            dropped += signbit(c) != 0; /* visible and dropped: negated (-0 where P underflows) */
            kept += c > 0.0f;           /* masked elements are +0 */
        }
        compared = dropped + kept >= MIN_VISIBLE || sign_diff || value_diff || unwritten;
        printf("%s mask %s: %zu elements, %zu dropped, %zu kept; sign differences %zu, values off %zu "
               "(max %.2e), unwritten %zu%s\n",
               !compared ? "skip" : sign_diff || value_diff || unwritten || !dropped || !kept ? "FAIL" : "ok  ",
               sh->name, n, dropped, kept, sign_diff, value_diff, worst, unwritten,
               compared ? "" : ": too few visible elements, drawn again");
        if (compared)
            EXPECT(sign_diff == 0 && value_diff == 0 && unwritten == 0 && dropped > 0 && kept > 0,
                   "%s: CUDA attn_probs differ from the CPU's", sh->name);
    }
    free(cpu_probs);
    free(gpu_probs);
    if (dev_probs) cudaFree(dev_probs);
    release(&tp);
    fa_test_problem_destroy(&tp);
    return compared;
}

static void mask_cases(int small) {
    const int n_shapes = small ? SMALL_SHAPES : (int)(sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < n_shapes; si++) {
        int draws = 0;
        while (draws < MASK_DRAWS && !mask_case(&shapes[si], small, 0.25f + 0.1f * (float)(si % 7))) /* p 0.25 .. 0.85 */
            draws++;
        EXPECT(draws < MASK_DRAWS, "%s: %d draws in a row with fewer than %d visible elements", shapes[si].name,
               MASK_DRAWS, MIN_VISIBLE);
    }
}

/* ---- 3. repeatability ---------------------------------------------------------------------- */

typedef struct outputs {
    void *o, *lse, *dq, *dk, *dv;
} outputs;

static size_t buffer_bytes(const fa_test_problem *tp, int t) { return tp->buffer[t].bytes; }

/* forward + backward on the device copies; host snapshots of every output into *out */
static int run_both(fa_test_problem *tp, fa_params p, outputs *out) {
    static const int tensors[5] = {FA_T_O, FA_T_LSE, FA_T_DQ, FA_T_DK, FA_T_DV};
    void **dst[5] = {&out->o, &out->lse, &out->dq, &out->dk, &out->dv};
    /* identical starting outputs (the padding around tensors included) */
    for (int i = 0; i < 5; i++) {
        fa_test_buffer *buf = &tp->buffer[tensors[i]];
        if (cudaMemcpy(buf->device, buf->host, buf->bytes, cudaMemcpyHostToDevice) != cudaSuccess) return -1;
    }
    fa_status s = fa_forward(&p);
    if (s == FA_OK) s = fa_backward(&p);
    if (s != FA_OK) {
        printf("FAIL: %s\n", fa_last_error());
        return -1;
    }
    if (cudaDeviceSynchronize() != cudaSuccess) return -1;
    for (int i = 0; i < 5; i++) {
        const size_t bytes = buffer_bytes(tp, tensors[i]);
        *dst[i] = malloc(bytes + 1);
        if (!*dst[i] || download(*dst[i], tp->buffer[tensors[i]].device, bytes)) return -1;
    }
    return 0;
}

static void free_outputs(outputs *o) {
    free(o->o);
    free(o->lse);
    free(o->dq);
    free(o->dk);
    free(o->dv);
    memset(o, 0, sizeof *o);
}

/* (query, key) pairs the mask leaves visible, over all sequences and query heads: with few of them
 * two offsets may well draw the same keep bits (at p = 0.2 two bits agree with probability 0.68),
 * so "another offset gives another O" is checked only from 48 pairs on (0.68^48 < 1e-8). */
static int64_t visible_pairs(const fa_test_problem *tp) {
    const fa_test_spec *sp = &tp->spec;
    const int64_t wl = sp->use_window && sp->window_left >= 0 ? sp->window_left : -1;
    int64_t wr = sp->use_window && sp->window_right >= 0 ? sp->window_right : -1;
    if (sp->causal) wr = 0; /* bottom-right: right side min(window_right, 0) */
    int64_t pairs = 0;
    for (int b = 0; b < sp->batch; b++) {
        const int64_t lq = sp->varlen ? tp->lens_q_storage[b] : sp->seqlen_q;
        const int64_t lk = sp->varlen ? tp->lens_k_storage[b] : sp->seqlen_k;
        for (int64_t i = 0; i < lq; i++) {
            int64_t hi = wr < 0 ? lk - 1 : i + lk - lq + wr, lo = wl < 0 ? 0 : i + lk - lq - wl;
            if (hi > lk - 1) hi = lk - 1;
            if (lo < 0) lo = 0;
            if (hi >= lo) pairs += hi - lo + 1;
        }
    }
    return pairs * sp->heads_q;
}

static void repeat_cases(int small) {
    const int n_shapes = small ? SMALL_SHAPES : (int)(sizeof shapes / sizeof shapes[0]);
    /* the LSE comparison needs both runs on one forward kernel: the portable one forced, or the
     * default (Hopper on sm_90; its dropout kernels never pack GQA tiles, so neither may the run
     * without dropout) */
    setenv("FA_CUDA_PACK_GQA", "0", 1);
    for (int portable = 0; portable < 2; portable++)
    for (int si = 0; si < n_shapes; si++)
        for (int deterministic = 0; deterministic < 2; deterministic++) {
            if (portable) setenv("FA_CUDA_FORWARD", "portable", 1);
            else unsetenv("FA_CUDA_FORWARD");
            fa_test_spec spec = make_spec(&shapes[si], small, 0.2f);
            fa_test_problem tp;
            if (fa_test_problem_create(&tp, &spec) || upload(&tp)) {
                EXPECT(0, "%s: could not set up the problem", shapes[si].name);
                release(&tp);
                continue;
            }
            fa_params p = fa_test_problem_device_params(&tp);
            p.device = FA_DEVICE_CUDA;
            p.deterministic = deterministic;
            outputs a = {0}, b = {0}, c = {0}, z = {0};
            fa_params other = p, none = p;
            other.dropout_offset += 1 + (uint64_t)(p.seqlen_k + 15) / 16; /* disjoint counters */
            none.dropout_p = 0.0f;
            const int ran = run_both(&tp, p, &a) == 0 && run_both(&tp, p, &b) == 0 && run_both(&tp, other, &c) == 0 &&
                            run_both(&tp, none, &z) == 0;
            EXPECT(ran, "%s: a run failed", shapes[si].name);
            if (ran) {
                const int same_o = !memcmp(a.o, b.o, buffer_bytes(&tp, FA_T_O)) &&
                                   !memcmp(a.lse, b.lse, buffer_bytes(&tp, FA_T_LSE));
                const int same_dq = !memcmp(a.dq, b.dq, buffer_bytes(&tp, FA_T_DQ));
                const int same_dkdv = !memcmp(a.dk, b.dk, buffer_bytes(&tp, FA_T_DK)) &&
                                      !memcmp(a.dv, b.dv, buffer_bytes(&tp, FA_T_DV));
                const int few = visible_pairs(&tp) < 48;
                const int other_o = few || !!memcmp(a.o, c.o, buffer_bytes(&tp, FA_T_O));
                const int lse_kept = !memcmp(a.lse, z.lse, buffer_bytes(&tp, FA_T_LSE));
                const int ok = same_o && same_dkdv && (!deterministic || same_dq) && other_o && lse_kept;
                printf("%s repeat %s%s%s: o/lse %s, dq %s, dk/dv %s; another offset: o %s; lse without dropout %s\n",
                       ok ? "ok  " : "FAIL", shapes[si].name, portable ? " (portable forward)" : "",
                       deterministic ? " (deterministic)" : "",
                       same_o ? "same" : "DIFFER", same_dq ? "same" : "differs", same_dkdv ? "same" : "DIFFER",
                       few ? "not checked (under 48 visible pairs)" : other_o ? "differs" : "SAME",
                       lse_kept ? "same" : "DIFFERS");
                failures += !ok;
            }
            free_outputs(&a);
            free_outputs(&b);
            free_outputs(&c);
            free_outputs(&z);
            release(&tp);
            fa_test_problem_destroy(&tp);
        }
    unsetenv("FA_CUDA_FORWARD");
    unsetenv("FA_CUDA_PACK_GQA");
}

/* ---- 4. exact masks ------------------------------------------------------------------------ */

typedef struct mask_shape {
    fa_dtype dtype;
    int batch, sq, sk, hq, hkv, d;
    int check_fwd, check_bwd; /* fwd: sk <= d (V one-hot over keys); bwd: sq <= d, hq == hkv */
} mask_shape;

static const mask_shape mask_shapes[] = {
    {FA_DTYPE_BF16, 2, 400, 64, 4, 2, 64, 1, 0},  /* bucket 64: three query tiles, GQA           */
    {FA_DTYPE_F16, 2, 64, 200, 2, 2, 64, 0, 1},   /* bucket 64 backward: two key blocks           */
    {FA_DTYPE_BF16, 2, 300, 128, 3, 3, 128, 1, 0}, /* bucket 128: three query tiles               */
    {FA_DTYPE_F16, 1, 128, 300, 2, 2, 128, 0, 1}, /* bucket 128 backward: 2 query, 3 key blocks    */
    {FA_DTYPE_BF16, 1, 200, 256, 2, 1, 256, 1, 0}, /* bucket 256 forward: four key tiles of 80    */
    {FA_DTYPE_BF16, 1, 77, 77, 2, 2, 96, 1, 1},    /* d = 96 (bucket 128), odd lengths, both      */
    {FA_DTYPE_BF16, 1, 200, 130, 2, 2, 256, 0, 1}, /* bucket 256 backward: 4 query, 3 key blocks   */
    {FA_DTYPE_F16, 1, 150, 97, 2, 2, 192, 1, 1},   /* d = 192 (bucket 256), odd lengths, both     */
    {FA_DTYPE_BF16, 1, 33, 17, 2, 2, 64, 1, 1},    /* 17 keys, 33 queries: partial Philox groups  */
};

static int upload16(void **dev, const float *host, size_t n, fa_dtype dtype) {
    uint16_t *h16 = malloc(2 * n + 2);
    if (!h16) return -1;
    for (size_t e = 0; e < n; e++) h16[e] = gpu_float_to_16(host[e], dtype);
    const int ok = cudaMalloc(dev, 2 * n + 2) == cudaSuccess && cudaMemcpy(*dev, h16, 2 * n, cudaMemcpyHostToDevice) ==
                                                                  cudaSuccess;
    free(h16);
    return ok ? 0 : -1;
}

static void exact_mask_cases(int small) {
    const int n_shapes = small ? 2 : (int)(sizeof mask_shapes / sizeof mask_shapes[0]);
    for (int si = 0; si < n_shapes; si++)
        for (int kernel = 0; kernel < (int)(sizeof paths / sizeof paths[0]); kernel++) {
            if (paths[kernel].deterministic) continue; /* the mask does not depend on it */
            set_path(&paths[kernel]);
            const mask_shape *m = &mask_shapes[si];
            const int b = m->batch, sq = small && m->sq > 64 ? 64 : m->sq, sk = m->sk, hq = m->hq, hkv = m->hkv,
                      d = m->d;
            const size_t nq = (size_t)b * sq * hq * d, nk = (size_t)b * sk * hkv * d;
            float *q = calloc(nq, sizeof(float)), *v = calloc(nk, sizeof(float)), *dout = calloc(nq, sizeof(float));
            uint16_t *o_host = malloc(2 * nq), *dv_host = malloc(2 * nk);
            void *q_dev = NULL, *k_dev = NULL, *v_dev = NULL, *o_dev = NULL, *do_dev = NULL, *dq_dev = NULL,
                 *dk_dev = NULL, *dv_dev = NULL, *lse_dev = NULL;
            /* v_j = e_j (keys j < d), dO_i = e_i (queries i < d) */
            for (int bb = 0; bb < b; bb++)
                for (int j = 0; j < sk && j < d; j++)
                    for (int h = 0; h < hkv; h++) v[(((size_t)bb * sk + j) * hkv + h) * d + j] = 1.0f;
            for (int bb = 0; bb < b; bb++)
                for (int i = 0; i < sq && i < d; i++)
                    for (int h = 0; h < hq; h++) dout[(((size_t)bb * sq + i) * hq + h) * d + i] = 1.0f;
            int ok = q && v && dout && o_host && dv_host && upload16(&q_dev, q, nq, m->dtype) == 0 &&
                     upload16(&k_dev, v, nk, m->dtype) == 0 && upload16(&v_dev, v, nk, m->dtype) == 0 &&
                     upload16(&do_dev, dout, nq, m->dtype) == 0 && cudaMalloc(&o_dev, 2 * nq) == cudaSuccess &&
                     cudaMalloc(&dq_dev, 2 * nq) == cudaSuccess && cudaMalloc(&dk_dev, 2 * nk) == cudaSuccess &&
                     cudaMalloc(&dv_dev, 2 * nk) == cudaSuccess &&
                     cudaMalloc(&lse_dev, sizeof(float) * (size_t)b * hq * sq) == cudaSuccess &&
                     cudaMemset(o_dev, 0xff, 2 * nq) == cudaSuccess && cudaMemset(dv_dev, 0xff, 2 * nk) == cudaSuccess;
            EXPECT(ok, "exact masks %d: could not set up the problem", si);
            if (ok) {
                fa_params p;
                memset(&p, 0, sizeof p);
                p.device = FA_DEVICE_CUDA;
                p.dtype = m->dtype;
                p.batch = b, p.seqlen_q = sq, p.seqlen_k = sk, p.heads_q = hq, p.heads_kv = hkv;
                p.head_dim = d, p.head_dim_v = d;
                p.q = q_dev, p.k = k_dev, p.v = v_dev, p.o = o_dev, p.lse = lse_dev;
                p.dout = do_dev, p.dq = dq_dev, p.dk = dk_dev, p.dv = dv_dev;
                fa_set_contiguous_strides(&p);
                p.dropout_p = (si & 1) ? 0.1f : 0.5f;
                p.dropout_seed = next_random();
                p.dropout_offset = 0xFFFFFFFEull - (next_random() % 2); /* offset + j/16 crosses 2^32 */
                const uint32_t threshold = fa_dropout_threshold(p.dropout_p);
                fa_status st = fa_forward(&p);
                if (st == FA_OK) st = fa_backward(&p);
                ok = st == FA_OK && cudaDeviceSynchronize() == cudaSuccess &&
                     download(o_host, o_dev, 2 * nq) == 0 && download(dv_host, dv_dev, 2 * nk) == 0;
                EXPECT(ok, "exact masks %d (%s): %s: %s", si, paths[kernel].name, fa_strerror(st), fa_last_error());
                int64_t fwd_bad = 0, bwd_bad = 0, fwd_n = 0, bwd_n = 0, kept = 0;
                for (int bb = 0; ok && bb < b; bb++)
                    for (int h = 0; h < hq; h++) {
                        for (int i = 0; m->check_fwd && i < sq; i++)
                            for (int c = 0; c < d; c++) { /* O[i][c] = keep(i, c) · scale / sk, c < sk */
                                const float o = gpu_float_from_16(o_host[(((size_t)bb * sq + i) * hq + h) * d + c], m->dtype);
                                const int want = c < sk && fa_dropout_keep(p.dropout_seed, p.dropout_offset, threshold,
                                                                           bb, h, hq, i, c);
                                fwd_bad += !(want ? o > 0.0f : o == 0.0f);
                                fwd_n++;
                                kept += want;
                            }
                        for (int j = 0; m->check_bwd && j < sk; j++)
                            for (int c = 0; c < d; c++) { /* dV[j][c] = keep(c, j) · scale / sk, c < sq */
                                const float x = gpu_float_from_16(dv_host[(((size_t)bb * sk + j) * hkv + h) * d + c], m->dtype);
                                const int want = c < sq && fa_dropout_keep(p.dropout_seed, p.dropout_offset, threshold,
                                                                           bb, h, hq, c, j);
                                bwd_bad += !(want ? x > 0.0f : x == 0.0f);
                                bwd_n++;
                                kept += want;
                            }
                    }
                if (ok) {
                    printf("%s exact mask %s b=%d sq=%d sk=%d hq=%d hkv=%d d=%d p=%.1f (%s): o %lld of %lld wrong, "
                           "dv %lld of %lld wrong (%lld kept)\n",
                           fwd_bad || bwd_bad ? "FAIL" : "ok  ", fa_test_dtype_name(m->dtype), b, sq, sk, hq, hkv, d,
                           (double)p.dropout_p, paths[kernel].name, (long long)fwd_bad, (long long)fwd_n,
                           (long long)bwd_bad, (long long)bwd_n, (long long)kept);
                    failures += fwd_bad || bwd_bad;
                }
            }
            free(q), free(v), free(dout), free(o_host), free(dv_host);
            void *devs[] = {q_dev, k_dev, v_dev, o_dev, do_dev, dq_dev, dk_dev, dv_dev, lse_dev};
            for (int t = 0; t < 9; t++)
                if (devs[t]) cudaFree(devs[t]);
        }
    unsetenv("FA_CUDA_FORWARD");
    unsetenv("FA_CUDA_BACKWARD");
}

int gpu_dropout_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    rng_state = (uint64_t)time(NULL) * 0x2545F4914F6CDD1Dull;
    printf("fa_gpu_tests dropout%s: random seed %llu\n", small ? " small" : "", (unsigned long long)rng_state);
    oracle_cases(small);
    mask_cases(small);
    repeat_cases(small);
    exact_mask_cases(small);
    printf("fa_gpu_tests dropout: %d failed\n", failures);
    return failures != 0;
}
