/*
 * cache.c: the CUDA KV-cache path against the CPU engine and the float64 oracle, and the CUDA
 * fa_forward with a paged K/V (block_table).
 *   kvcache [small]  fa_kvcache_forward on random problems stressing appends of another token
 *                    count than q (seqlen_new > and < seqlen_q), head dims that are not multiples
 *                    of 8 (d != dv, unaligned strides), paged and contiguous caches, rotary, left
 *                    padding, every mask feature, splits: the output by the oracle's rule
 *                    (fa_kv_verify: o / lse, poison, appended slots, nothing else of the cache
 *                    changed), and the caches after the call equal to the CPU engine's on the
 *                    same problem (bitwise; within one unit in the last place where rotary
 *                    rounds). Then bad values of the new combinations, each rejected with its
 *                    own status and a message naming the field, nothing written.
 *   paged [small]    fa_forward with block_table, batched and varlen, pages of 1 .. 256 tokens
 *                    in a shuffled pool whose unread pages hold +-300: o and lse by the oracle's
 *                    rule, with the library's workspace and with a caller workspace of exactly
 *                    the size fa_check_forward reports; then its bad values.
 * `small` runs a few small problems (for compute-sanitizer). Fresh seeds every run unless
 * FA_TEST_SEED is set; a failure prints the seed.
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

#define EXPECT(cond, ...) GPU_EXPECT(failures, "cache", cond, __VA_ARGS__)

/* `word` occurs in `text` */
static int mentions(const char *text, const char *word) { return strstr(text, word) != NULL; }

/* ---- kvcache ------------------------------------------------------------------------------ */

/* Elements of the two caches that differ between the CPU and the CUDA run: bitwise, or by more
 * than one unit in the last place (rotary). */
static int64_t cache_differences(const fa_kv_problem *cpu, const fa_kv_problem *gpu, int rotary) {
    int64_t bad = 0;
    const int bufs[2] = {FA_KV_KCACHE, FA_KV_VCACHE};
    const size_t es = fa_test_dtype_size(cpu->spec.dtype);
    for (int i = 0; i < 2; i++) {
        const fa_test_buffer *a = &cpu->buffer[bufs[i]], *b = &gpu->buffer[bufs[i]];
        for (size_t e = 0; e < a->bytes / es; e++) {
            if (!memcmp((const char *)a->host + e * es, (const char *)b->host + e * es, es)) continue;
            if (!rotary || bufs[i] == FA_KV_VCACHE) {
                bad++;
                continue;
            }
            const double x = fa_test_load(a->host, cpu->spec.dtype, (int64_t)e),
                         y = fa_test_load(b->host, cpu->spec.dtype, (int64_t)e);
            const double ulp = ldexp(1.0, (int)floor(log2(fmax(fabs(x), 1e-30))) -
                                              (cpu->spec.dtype == FA_DTYPE_BF16 ? 7 : 10));
            if (!(fabs(x - y) <= ulp)) bad++;
        }
    }
    return bad;
}

static void draw_kv(fa_test_rng *rng, int index, int small, fa_kv_spec *s) {
    static const int64_t dims[] = {1, 6, 33, 59, 64, 100, 111, 128, 130, 250, 256};
    memset(s, 0, sizeof *s);
    s->dtype = index % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    s->seed = fa_test_rng_next(rng);
    s->head_dim = dims[fa_test_rng_int(rng, 0, 10)];
    s->head_dim_v = fa_test_rng_uniform(rng) < 0.6 ? s->head_dim : dims[fa_test_rng_int(rng, 0, 10)];
    /* even dims and 16-byte strides take the vector kernel, the others the padded copies */
    const int odd = s->head_dim % 8 != 0 || s->head_dim_v % 8 != 0;
    s->pad_align = odd ? 1 : 8;
    s->padded = fa_test_rng_uniform(rng) < 0.4;
    s->heads_kv = fa_test_rng_int(rng, 1, 3);
    s->heads_q = s->heads_kv * fa_test_rng_int(rng, 1, 4);
    s->batch = fa_test_rng_int(rng, 1, small ? 2 : 5);
    s->seqlen_q = fa_test_rng_int(rng, 1, small ? 5 : (index % 5 == 0 ? 70 : 9));
    s->append = index % 7 != 6;
    if (s->append) {
        const int mode = index % 3; /* more, fewer, as many new tokens as queries */
        s->seqlen_new = mode == 0   ? s->seqlen_q + fa_test_rng_int(rng, 1, small ? 5 : 40)
                        : mode == 1 ? (s->seqlen_q > 1 ? fa_test_rng_int(rng, 1, s->seqlen_q - 1) : 1)
                                    : 0;
        if (s->head_dim >= 2 && fa_test_rng_uniform(rng) < 0.6) {
            s->rotary_dim = 2 * fa_test_rng_int(rng, 1, s->head_dim / 2);
            s->rotary_interleaved = fa_test_rng_uniform(rng) < 0.5;
        }
    }
    const int64_t appended = s->append ? (s->seqlen_new ? s->seqlen_new : s->seqlen_q) : 0;
    s->capacity = appended + fa_test_rng_int(rng, 0, small ? 40 : 700);
    if (s->capacity < 1) s->capacity = 1;
    s->page_size = fa_test_rng_uniform(rng) < 0.5 ? fa_test_rng_int(rng, 1, 40) : 0;
    s->batch_idx = !s->page_size && s->append && fa_test_rng_uniform(rng) < 0.3;
    s->leftpad = fa_test_rng_uniform(rng) < 0.5;
    s->causal = fa_test_rng_uniform(rng) < 0.7;
    if (fa_test_rng_uniform(rng) < 0.3) {
        s->use_window = 1;
        s->window_left = (int32_t)fa_test_rng_int(rng, 0, s->capacity);
        s->window_right = fa_test_rng_uniform(rng) < 0.5 ? -1 : (int32_t)fa_test_rng_int(rng, 0, 5);
    }
    s->softcap = fa_test_rng_uniform(rng) < 0.2 ? 4.0f : 0.0f;
    s->alibi = fa_test_rng_uniform(rng) < 0.2 ? FA_TEST_ALIBI_BATCH_HEAD : FA_TEST_ALIBI_NONE;
    s->sinks = fa_test_rng_uniform(rng) < 0.3;
    s->no_lse = fa_test_rng_uniform(rng) < 0.1;
    s->num_splits = (int)fa_test_rng_int(rng, 0, 5);
    while ((double)s->batch * s->heads_q * s->seqlen_q * s->capacity * s->head_dim > 3e7 && s->batch > 1) s->batch--;
}

/* One problem on the CPU and on CUDA: oracle, poison and cache checks, caches equal. */
static void kv_case(const fa_kv_spec *spec) {
    fa_kv_problem cpu, gpu;
    char label[400];
    fa_kv_describe(spec, label, sizeof label);
    if (fa_kv_problem_create(&cpu, spec)) {
        EXPECT(0, "%s: could not create the problem", label);
        return;
    }
    if (fa_kv_problem_create(&gpu, spec)) {
        fa_kv_problem_destroy(&cpu);
        EXPECT(0, "%s: could not create the problem", label);
        return;
    }
    fa_status s_cpu = fa_kvcache_forward(&cpu.params);
    EXPECT(s_cpu == FA_OK, "%s: CPU: %s", label, fa_last_error());
    if (gpu_buffers_upload(gpu.buffer, FA_KV_BUFFER_COUNT)) {
        EXPECT(0, "%s: upload failed", label);
    } else {
        fa_params p = fa_kv_problem_device_params(&gpu);
        p.device = FA_DEVICE_CUDA;
        fa_status s = fa_kvcache_forward(&p);
        if (gpu_buffers_download(gpu.buffer, FA_KV_BUFFER_COUNT)) EXPECT(0, "%s: CUDA error after the call", label);
        EXPECT(s == FA_OK, "%s: CUDA: %s", label, fa_last_error());
        if (s == FA_OK && s_cpu == FA_OK) {
            fa_kv_check c = fa_kv_verify(&gpu);
            char detail[600];
            fa_kv_format(&c, detail, sizeof detail);
            EXPECT(c.ok, "%s:%s", label, detail);
            const int64_t diff = cache_differences(&cpu, &gpu, gpu.spec.rotary_dim != 0);
            EXPECT(diff == 0, "%s: %lld cache elements differ from the CPU engine's", label, (long long)diff);
        }
    }
    gpu_buffers_release(gpu.buffer, FA_KV_BUFFER_COUNT);
    fa_kv_problem_destroy(&cpu);
    fa_kv_problem_destroy(&gpu);
}

/* A bad value on CUDA: its status, a message naming `field`, no output or cache element written. */
static void kv_bad(fa_kv_problem *kp, fa_params p, fa_status want, const char *field, const char *label) {
    fa_kv_problem_reset(kp);
    if (gpu_buffers_upload(kp->buffer, FA_KV_BUFFER_COUNT)) {
        EXPECT(0, "%s: upload failed", label);
        return;
    }
    fa_status got = fa_kvcache_forward(&p);
    const char *message = fa_last_error();
    char copy[512];
    snprintf(copy, sizeof copy, "%s", message);
    if (gpu_buffers_download(kp->buffer, FA_KV_BUFFER_COUNT)) EXPECT(0, "%s: CUDA error", label);
    EXPECT(got == want, "%s: %s, want %s: %s", label, fa_strerror(got), fa_strerror(want), copy);
    EXPECT(mentions(copy, field), "%s: message does not name %s: \"%s\"", label, field, copy);
    EXPECT(fa_kv_untouched(kp), "%s: an output or the cache was written", label);
}

static void kv_bad_values(uint64_t seed) {
    fa_kv_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = FA_DTYPE_BF16;
    s.batch = 2, s.seqlen_q = 3, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 59, s.head_dim_v = 33;
    s.capacity = 40, s.page_size = 7, s.append = 1, s.seqlen_new = 5, s.rotary_dim = 20, s.causal = 1;
    s.pad_align = 1, s.seed = seed;
    fa_kv_problem kp;
    if (fa_kv_problem_create(&kp, &s)) {
        EXPECT(0, "bad values: could not create the problem");
        return;
    }
    if (gpu_buffers_upload(kp.buffer, FA_KV_BUFFER_COUNT)) {
        EXPECT(0, "bad values: upload failed");
        fa_kv_problem_destroy(&kp);
        return;
    }
    fa_params good = fa_kv_problem_device_params(&kp);
    good.device = FA_DEVICE_CUDA;
    size_t ws = 0;
    fa_status c = fa_check_kvcache(&good, &ws);
    EXPECT(c == FA_OK && ws > 0, "odd head dims: fa_check_kvcache %s, workspace %zu: %s", fa_strerror(c), ws,
           fa_last_error());
    fa_params p = good;
    p.seqlen_new = p.seqlen_k + 1;
    kv_bad(&kp, p, FA_ERR_INVALID_SIZE, "seqlen_new", "seqlen_new past the capacity");
    p = good;
    p.seqlen_new = -2;
    kv_bad(&kp, p, FA_ERR_INVALID_SIZE, "seqlen_new", "negative seqlen_new");
    p = good;
    p.k_new = p.v_new = NULL;
    p.rotary_cos = p.rotary_sin = NULL;
    kv_bad(&kp, p, FA_ERR_INVALID_ARGUMENT, "seqlen_new", "seqlen_new without k_new");
    if (ws > 1) {
        void *small = NULL;
        if (cudaMalloc(&small, ws) == cudaSuccess) {
            p = good;
            p.workspace = small;
            p.workspace_bytes = ws - 1;
            kv_bad(&kp, p, FA_ERR_WORKSPACE, "workspace_bytes", "padded copies: workspace one byte short");
            /* the exact size works */
            fa_kv_problem_reset(&kp);
            if (gpu_buffers_upload(kp.buffer, FA_KV_BUFFER_COUNT) == 0) {
                p.workspace_bytes = ws;
                fa_status st = fa_kvcache_forward(&p);
                if (gpu_buffers_download(kp.buffer, FA_KV_BUFFER_COUNT)) EXPECT(0, "caller workspace: CUDA error");
                fa_kv_check ck = fa_kv_verify(&kp);
                char detail[600];
                fa_kv_format(&ck, detail, sizeof detail);
                EXPECT(st == FA_OK && ck.ok, "padded copies in a caller workspace of %zu bytes: %s%s", ws,
                       st == FA_OK ? "" : fa_last_error(), detail);
            }
            cudaFree(small);
        }
    }
    gpu_buffers_release(kp.buffer, FA_KV_BUFFER_COUNT);
    fa_kv_problem_destroy(&kp);

    /* f32 and head dims past 256 are CPU-only, also with the padded copies */
    static const struct {
        fa_dtype dtype;
        int64_t d, dv;
        fa_status want;
        const char *field;
    } limits[2] = {{FA_DTYPE_F32, 59, 59, FA_ERR_DTYPE, "dtype"}, {FA_DTYPE_BF16, 300, 59, FA_ERR_HEAD_DIM, "head_dim"}};
    for (int i = 0; i < 2; i++) {
        s.dtype = limits[i].dtype;
        s.head_dim = limits[i].d;
        s.head_dim_v = limits[i].dv;
        if (fa_kv_problem_create(&kp, &s)) {
            EXPECT(0, "limits: could not create the problem");
            continue;
        }
        if (gpu_buffers_upload(kp.buffer, FA_KV_BUFFER_COUNT) == 0) {
            p = fa_kv_problem_device_params(&kp);
            p.device = FA_DEVICE_CUDA;
            kv_bad(&kp, p, limits[i].want, limits[i].field, limits[i].field);
        }
        gpu_buffers_release(kp.buffer, FA_KV_BUFFER_COUNT);
        fa_kv_problem_destroy(&kp);
    }
}

int gpu_kvcache_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    const uint64_t seed = gpu_announce_seed("kvcache");
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    const int cases = small ? 8 : 160;
    for (int i = 0; i < cases; i++) {
        fa_kv_spec spec;
        draw_kv(&rng, i, small, &spec);
        kv_case(&spec);
    }
    kv_bad_values(seed + 1);
    printf("kvcache: %d cases, %d failures\n", cases, failures);
    return failures ? 1 : 0;
}

/* ---- paged fa_forward ----------------------------------------------------------------------- */

typedef struct paged_pool {
    void *k, *v;
    int32_t *table;
    int64_t num_pages, table_stride, page_stride_k, page_stride_v;
} paged_pool;

/* The keys and values of tp page by page into a shuffled pool; unread pages hold +-300, unread
 * table entries -1. Page strides are padded by `pad` elements. */
static int make_pool(const fa_test_problem *tp, int64_t page_size, int64_t pad, fa_test_rng *rng, paged_pool *pool) {
    const fa_params *p = &tp->params;
    const int64_t hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    const size_t es = fa_test_dtype_size(p->dtype);
    const int varlen = p->cu_seqlens_k != NULL;
    memset(pool, 0, sizeof *pool);
    pool->table_stride = (p->seqlen_k + page_size - 1) / page_size + 1;
    pool->page_stride_k = page_size * hkv * d + pad;
    pool->page_stride_v = page_size * hkv * dv + pad;
    int64_t pages = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t len = varlen ? p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->seqlen_k;
        pages += (len + page_size - 1) / page_size;
    }
    pool->num_pages = pages + 2;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)pool->num_pages);
    pool->k = malloc((size_t)(pool->num_pages * pool->page_stride_k) * es);
    pool->v = malloc((size_t)(pool->num_pages * pool->page_stride_v) * es);
    pool->table = malloc(sizeof(int32_t) * (size_t)(p->batch * pool->table_stride));
    if (!order || !pool->k || !pool->v || !pool->table) {
        free(order);
        return 0;
    }
    for (int64_t e = 0; e < pool->num_pages * pool->page_stride_k; e++) fa_test_store(pool->k, p->dtype, e, 300.0);
    for (int64_t e = 0; e < pool->num_pages * pool->page_stride_v; e++) fa_test_store(pool->v, p->dtype, e, -300.0);
    for (int64_t i = 0; i < pool->num_pages; i++) order[i] = i;
    for (int64_t i = pool->num_pages - 1; i > 0; i--) {
        int64_t j = fa_test_rng_int(rng, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int64_t e = 0; e < p->batch * pool->table_stride; e++) pool->table[e] = -1;
    int64_t next = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t len = varlen ? p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->seqlen_k;
        for (int64_t t = 0; t < len; t++) {
            if (t % page_size == 0) pool->table[b * pool->table_stride + t / page_size] = (int32_t)order[next++];
            const int64_t page = pool->table[b * pool->table_stride + t / page_size];
            for (int64_t h = 0; h < hkv; h++) {
                const int64_t krow = varlen ? (p->cu_seqlens_k[b] + t) * p->k_row_stride
                                            : b * p->k_batch_stride + t * p->k_row_stride;
                const int64_t vrow = varlen ? (p->cu_seqlens_k[b] + t) * p->v_row_stride
                                            : b * p->v_batch_stride + t * p->v_row_stride;
                const int64_t kdst = page * pool->page_stride_k + ((t % page_size) * hkv + h) * d;
                const int64_t vdst = page * pool->page_stride_v + ((t % page_size) * hkv + h) * dv;
                memcpy((char *)pool->k + (size_t)kdst * es, (const char *)p->k + (size_t)(krow + h * p->k_head_stride) * es,
                       (size_t)d * es);
                memcpy((char *)pool->v + (size_t)vdst * es, (const char *)p->v + (size_t)(vrow + h * p->v_head_stride) * es,
                       (size_t)dv * es);
            }
        }
    }
    free(order);
    return 1;
}

static void free_pool(paged_pool *pool) {
    free(pool->k);
    free(pool->v);
    free(pool->table);
}

/* Poison o and lse on the host and the device. */
static int repoison(fa_test_problem *tp) {
    fa_test_poison_forward_outputs(tp);
    const int outs[2] = {FA_T_O, FA_T_LSE};
    for (int i = 0; i < 2; i++) {
        fa_test_buffer *b = &tp->buffer[tp->view[outs[i]].buffer];
        if (b->host && b->device && cudaMemcpy(b->device, b->host, b->bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            return -1;
    }
    return 0;
}

static int paged_call(fa_test_problem *tp, const fa_params *p, const char *label, const fa_ref_outputs *ref,
                      const fa_ref_outputs *base) {
    if (repoison(tp)) return -1;
    fa_status s = fa_forward(p);
    if (gpu_buffers_download(tp->buffer, FA_T_COUNT)) EXPECT(0, "%s: CUDA error after the call", label);
    EXPECT(s == FA_OK, "%s: %s", label, fa_last_error());
    if (s != FA_OK) return -1;
    static const int tensors[2] = {FA_T_O, FA_T_LSE};
    for (int t = 0; t < 2; t++) {
        fa_test_check r = fa_test_compare(tp, tensors[t], ref, base);
        EXPECT(r.ok, "%s %s: err %.3e tol %.3e unwritten %lld nonfinite %lld clobbered %lld", label,
               fa_test_tensor_name(tensors[t]), r.err, r.tol, (long long)r.unwritten, (long long)r.nonfinite,
               (long long)r.clobbered);
    }
    return 0;
}

static void paged_bad(fa_test_problem *tp, const fa_params *p, int backward, fa_status want, const char *field,
                      const char *label) {
    if (repoison(tp)) return;
    fa_status got = backward ? fa_backward(p) : fa_forward(p);
    char message[512];
    snprintf(message, sizeof message, "%s", fa_last_error());
    if (gpu_buffers_download(tp->buffer, FA_T_COUNT)) EXPECT(0, "%s: CUDA error", label);
    EXPECT(got == want, "%s: %s, want %s: %s", label, fa_strerror(got), fa_strerror(want), message);
    EXPECT(mentions(message, field), "%s: message does not name %s: \"%s\"", label, field, message);
    EXPECT(fa_test_buffer_all_poison(tp, FA_T_O) && fa_test_buffer_all_poison(tp, FA_T_LSE),
           "%s: an output was written", label);
}

static void paged_case(fa_test_rng *rng, int index, int small) {
    static const int64_t page_sizes[] = {1, 3, 16, 64, 256};
    static const int64_t dims[] = {64, 96, 128, 256};
    fa_test_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.dtype = index % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    spec.seed = fa_test_rng_next(rng);
    spec.varlen = index % 4 >= 2;
    spec.batch = fa_test_rng_int(rng, 1, small ? 2 : 4);
    spec.seqlen_q = fa_test_rng_int(rng, 1, small ? 40 : 300);
    spec.seqlen_k = fa_test_rng_uniform(rng) < 0.3 ? spec.seqlen_q : fa_test_rng_int(rng, 1, small ? 80 : 700);
    spec.heads_kv = fa_test_rng_int(rng, 1, 2);
    spec.heads_q = spec.heads_kv * fa_test_rng_int(rng, 1, 4);
    spec.head_dim = dims[fa_test_rng_int(rng, 0, 3)];
    spec.head_dim_v = fa_test_rng_uniform(rng) < 0.8 ? spec.head_dim : (spec.head_dim == 64 ? 64 : spec.head_dim - 32);
    spec.causal = fa_test_rng_uniform(rng) < 0.6;
    if (fa_test_rng_uniform(rng) < 0.3) {
        spec.use_window = 1;
        spec.window_left = (int32_t)fa_test_rng_int(rng, 0, 100);
        spec.window_right = (int32_t)fa_test_rng_int(rng, -1, 20);
    }
    spec.softcap = fa_test_rng_uniform(rng) < 0.2 ? 5.0f : 0.0f;
    spec.alibi = fa_test_rng_uniform(rng) < 0.2 ? FA_TEST_ALIBI_HEAD : FA_TEST_ALIBI_NONE;
    spec.sinks = fa_test_rng_uniform(rng) < 0.3;
    spec.layout = fa_test_rng_uniform(rng) < 0.5 ? FA_TEST_LAYOUT_PADDED : FA_TEST_LAYOUT_CONTIGUOUS;
    spec.pad_align = 8;
    const int64_t page_size = page_sizes[fa_test_rng_int(rng, 0, 4)];
    fa_test_problem tp;
    if (fa_test_problem_create(&tp, &spec)) {
        EXPECT(0, "paged: could not create the problem");
        return;
    }
    char label[400], features[200];
    fa_test_describe(&tp, features, sizeof features);
    snprintf(label, sizeof label, "paged(%lld) %s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld dv=%lld %s %s",
             (long long)page_size, fa_test_dtype_name(spec.dtype), (long long)spec.batch, (long long)spec.seqlen_q,
             (long long)spec.seqlen_k, (long long)spec.heads_q, (long long)spec.heads_kv, (long long)spec.head_dim,
             (long long)spec.head_dim_v, spec.varlen ? "varlen" : "batched", features);
    fa_ref_gathered g;
    fa_ref_outputs ref, base;
    paged_pool pool;
    void *k_dev = NULL, *v_dev = NULL, *table_dev = NULL, *ws_dev = NULL;
    if (fa_ref_references(&tp.params, spec.dtype, 0, &g, &ref, &base) != 0) {
        EXPECT(0, "%s: oracle allocation", label);
        fa_test_problem_destroy(&tp);
        return;
    }
    const int64_t pad = fa_test_rng_uniform(rng) < 0.5 ? 8 : 0;
    if (!make_pool(&tp, page_size, pad, rng, &pool) || gpu_buffers_upload(tp.buffer, FA_T_COUNT) ||
        cudaMalloc(&k_dev, (size_t)(pool.num_pages * pool.page_stride_k) * 2) != cudaSuccess ||
        cudaMalloc(&v_dev, (size_t)(pool.num_pages * pool.page_stride_v) * 2) != cudaSuccess ||
        cudaMalloc(&table_dev, sizeof(int32_t) * (size_t)(spec.batch * pool.table_stride)) != cudaSuccess ||
        cudaMemcpy(k_dev, pool.k, (size_t)(pool.num_pages * pool.page_stride_k) * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(v_dev, pool.v, (size_t)(pool.num_pages * pool.page_stride_v) * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(table_dev, pool.table, sizeof(int32_t) * (size_t)(spec.batch * pool.table_stride),
                   cudaMemcpyHostToDevice)) {
        EXPECT(0, "%s: allocation or upload", label);
        goto done;
    }
    fa_params p = fa_test_problem_device_params(&tp);
    p.device = FA_DEVICE_CUDA;
    p.k = k_dev;
    p.v = v_dev;
    p.k_batch_stride = pool.page_stride_k;
    p.k_row_stride = tp.params.heads_kv * tp.params.head_dim;
    p.k_head_stride = tp.params.head_dim;
    p.v_batch_stride = pool.page_stride_v;
    p.v_row_stride = tp.params.heads_kv * tp.params.head_dim_v;
    p.v_head_stride = tp.params.head_dim_v;
    p.block_table = table_dev;
    p.block_table_batch_stride = pool.table_stride;
    p.page_size = page_size;
    p.num_pages = pool.num_pages;
    if (spec.varlen) p.total_k = 0; /* ignored with block_table */
    size_t ws = 0;
    fa_status c = fa_check_forward(&p, &ws);
    EXPECT(c == FA_OK && ws > 0, "%s: fa_check_forward %s, workspace %zu: %s", label, fa_strerror(c), ws,
           fa_last_error());
    if (c != FA_OK) goto done;
    paged_call(&tp, &p, label, &ref, &base);
    if (cudaMalloc(&ws_dev, ws) == cudaSuccess) {
        fa_params pw = p;
        pw.workspace = ws_dev;
        pw.workspace_bytes = ws;
        char with_ws[480];
        snprintf(with_ws, sizeof with_ws, "%s, caller workspace of %zu bytes", label, ws);
        paged_call(&tp, &pw, with_ws, &ref, &base);
        if (index == 0) {
            pw.workspace_bytes = ws - 1;
            paged_bad(&tp, &pw, 0, FA_ERR_WORKSPACE, "workspace_bytes", "paged: workspace one byte short");
        }
    }
    if (index == 0) {
        fa_params q = p;
        paged_bad(&tp, &q, 1, FA_ERR_UNSUPPORTED, "block_table", "paged: fa_backward");
        q.k_batch_stride = pool.page_stride_k + 1;
        paged_bad(&tp, &q, 0, FA_ERR_ALIGNMENT, "k_batch_stride", "paged: page stride not 16-byte aligned");
        q = p;
        q.page_size = 0;
        paged_bad(&tp, &q, 0, FA_ERR_INVALID_SIZE, "page_size", "paged: page_size 0");
        q = p;
        q.block_table_batch_stride = 0;
        paged_bad(&tp, &q, 0, FA_ERR_STRIDE, "block_table_batch_stride", "paged: table rows too short");
        q = p;
        q.num_pages = 0;
        paged_bad(&tp, &q, 0, FA_ERR_INVALID_SIZE, "num_pages", "paged: num_pages 0");
    }
done:
    cudaFree(k_dev);
    cudaFree(v_dev);
    cudaFree(table_dev);
    cudaFree(ws_dev);
    gpu_buffers_release(tp.buffer, FA_T_COUNT);
    free_pool(&pool);
    fa_ref_references_free(&g, &ref, &base);
    fa_test_problem_destroy(&tp);
}

int gpu_paged_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    const uint64_t seed = gpu_announce_seed("paged");
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    const int cases = small ? 6 : 80;
    for (int i = 0; i < cases; i++) paged_case(&rng, i, small);
    printf("paged: %d cases, %d failures\n", cases, failures);
    return failures ? 1 : 0;
}
