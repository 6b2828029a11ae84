/*
 * kvquant.c: fa_kvcache_forward on CUDA with quantised caches (int8 with a scale per token and
 * kv head, llama.cpp Q8_0 blocks, fp8 e4m3 with a scale per kv head), `kvquant [small]`.
 *
 * Each random problem (contiguous or paged in a shuffled pool, GQA, seqlen_q 1..20, appends of
 * as many, more or no new tokens, causal, left window, softcap, sinks, left padding, splits,
 * head dims 64..256 with d != dv, padded rows so that the kernel copies in 16-, 8- and 4-byte
 * units) runs on the CPU engine and on CUDA from the same bytes:
 *   - the caches after the call (k, v and the int8 scales, whole buffers: appended rows and
 *     everything around them) equal the CPU's bit for bit;
 *   - o and lse, poisoned with NaN before the call, are fully written, and o against float64
 *     attention on the dequantised cache (after the append) within 2× the error of plain
 *     attention in the dtype on that cache (K and V rounded to the dtype, fp32 scores and
 *     softmax, P rounded to the dtype, output rounded) + the oracle's floor; lse likewise.
 * Some problems spread the query rows' magnitudes (a bf16 row is scaled into f16's range by the
 * int8 / e4m3 kernel) or the int8 V scales (the kernel keeps P·V in units of the tile's largest
 * p·scale). NaN in the cache (an e4m3 NaN code, an int8 NaN scale) gives NaN exactly where the
 * CPU engine gives NaN.
 * Then what the CUDA path refuses: FA_ERR_UNSUPPORTED naming the field (rotary, Q8_0 head dims
 * that are not multiples of 64, 2-byte-aligned strides), nothing written.
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

#define EXPECT(cond, ...) GPU_EXPECT(failures, "kvquant", cond, __VA_ARGS__)

typedef struct qspec {
    fa_kv_dtype kvd;
    fa_dtype dtype;
    int64_t b, sq, hq, hkv, d, dv, cap, page, pad_bytes, n_new; /* n_new: appended tokens, 0 = none */
    int causal, window_left, sinks, leftpad, batch_idx, splits, no_lse;
    int q_spread;     /* query rows 2^-10 .. 2^3 apart, elements down to 2^-16 of their row's scale */
    int scale_spread; /* int8: V scales per token 2^-20 .. 2^20 (f16: 2^8) apart */
    float softcap;
    uint64_t seed;
} qspec;

/* Host buffers of one problem: caches with rows of rb bytes padded to pitch, int8 scales
 * [slabs][slab_rows][hkv] (fp8: [hkv]), q, o, k_new, v_new, the int32 arrays, sinks. */
typedef struct qhost {
    int64_t slabs, slab_rows, rb_k, rb_v, pitch_k, pitch_v, pages_per_seq, scale_count;
    size_t k_bytes, v_bytes, q_elems, o_elems, knew_elems, vnew_elems;
    uint8_t *k, *v;
    float *ks, *vs, *lse, *sinks;
    void *q, *o, *knew, *vnew;
    int32_t *seqlens, *leftpad, *table, *batch_idx;
} qhost;

static const char *kvd_name(fa_kv_dtype t) {
    return t == FA_KV_INT8 ? "int8" : t == FA_KV_Q8_0 ? "q8_0" : "e4m3";
}

static int64_t row_bytes(fa_kv_dtype t, int64_t d) { return t == FA_KV_Q8_0 ? d / 32 * 34 : d; }

/* Independent e4m3 decoder: sign, exponent (bias 7), 3 mantissa bits; S.1111.111 = NaN. */
static double e4m3_value(uint8_t x) {
    int e = (x >> 3) & 15, m = x & 7;
    double v = (e == 15 && m == 7) ? NAN : e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (x & 0x80) ? -v : v;
}

static void dequant(fa_kv_dtype t, const uint8_t *row, double scale, int64_t d, double *out) {
    for (int64_t i = 0; i < d; i++) {
        if (t == FA_KV_INT8) out[i] = (int8_t)row[i] * scale;
        else if (t == FA_KV_FP8_E4M3) out[i] = e4m3_value(row[i]) * scale;
        else {
            const uint8_t *blk = row + (i / 32) * 34;
            out[i] = (double)fa_test_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) * (int8_t)blk[2 + i % 32];
        }
    }
}

/* spread: an int8 scale times 2^-20 .. 2^spread */
static void fill_row(fa_kv_dtype t, fa_test_rng *rng, uint8_t *row, int64_t d, float *scale, int spread) {
    if (t == FA_KV_INT8) {
        for (int64_t i = 0; i < d; i++) row[i] = (uint8_t)(int8_t)fa_test_rng_int(rng, -127, 127);
        *scale = (float)(0.004 + 0.012 * fa_test_rng_uniform(rng));
        if (spread) *scale = ldexpf(*scale, (int)fa_test_rng_int(rng, -20, spread));
    } else if (t == FA_KV_FP8_E4M3) { /* magnitudes up to 2^3·1.875 */
        for (int64_t i = 0; i < d; i++) row[i] = (uint8_t)(fa_test_rng_int(rng, 0, 0x57) | (fa_test_rng_int(rng, 0, 1) << 7));
    } else {
        for (int64_t blk = 0; blk < d / 32; blk++) {
            uint16_t h = fa_test_f32_to_f16((float)(0.004 + 0.012 * fa_test_rng_uniform(rng)));
            row[blk * 34] = (uint8_t)(h & 0xff);
            row[blk * 34 + 1] = (uint8_t)(h >> 8);
            for (int i = 0; i < 32; i++) row[blk * 34 + 2 + i] = (uint8_t)(int8_t)fa_test_rng_int(rng, -127, 127);
        }
    }
}

static void qhost_free(qhost *h) {
    free(h->k), free(h->v), free(h->ks), free(h->vs), free(h->lse), free(h->sinks), free(h->q), free(h->o);
    free(h->knew), free(h->vnew), free(h->seqlens), free(h->leftpad), free(h->table);
    free(h->batch_idx);
    memset(h, 0, sizeof *h);
}

static int qhost_make(qhost *h, const qspec *c) {
    memset(h, 0, sizeof *h);
    fa_test_rng rng;
    fa_test_rng_seed(&rng, c->seed);
    const size_t es = fa_test_dtype_size(c->dtype);
    h->rb_k = row_bytes(c->kvd, c->d), h->rb_v = row_bytes(c->kvd, c->dv);
    h->pitch_k = h->rb_k + c->pad_bytes, h->pitch_v = h->rb_v + c->pad_bytes;
    h->pages_per_seq = c->page ? (c->cap + c->page - 1) / c->page : 0;
    /* two pages nobody reads; with cache_batch_idx one cache row nobody reads */
    h->slabs = c->page ? c->b * h->pages_per_seq + 2 : c->b + (c->batch_idx ? 1 : 0);
    h->slab_rows = c->page ? c->page : c->cap;
    const int64_t rows = h->slabs * h->slab_rows * c->hkv;
    h->k_bytes = (size_t)(rows * h->pitch_k), h->v_bytes = (size_t)(rows * h->pitch_v);
    h->scale_count = c->kvd == FA_KV_INT8 ? rows : c->hkv;
    h->q_elems = (size_t)(c->b * c->sq * c->hq * c->d), h->o_elems = (size_t)(c->b * c->sq * c->hq * c->dv);
    const int64_t n_new = c->n_new > 0 ? c->n_new : 1;
    h->knew_elems = (size_t)(c->b * n_new * c->hkv * c->d), h->vnew_elems = (size_t)(c->b * n_new * c->hkv * c->dv);
    h->k = malloc(h->k_bytes), h->v = malloc(h->v_bytes);
    h->ks = malloc(sizeof(float) * (size_t)(h->scale_count > 0 ? rows : 1));
    h->vs = malloc(sizeof(float) * (size_t)(h->scale_count > 0 ? rows : 1));
    h->lse = malloc(sizeof(float) * (size_t)(c->b * c->hq * c->sq));
    h->sinks = malloc(sizeof(float) * (size_t)c->hq);
    h->q = malloc(h->q_elems * es), h->o = malloc(h->o_elems * es);
    h->knew = malloc(h->knew_elems * es), h->vnew = malloc(h->vnew_elems * es);
    h->seqlens = malloc(sizeof(int32_t) * (size_t)c->b), h->leftpad = malloc(sizeof(int32_t) * (size_t)c->b);
    h->table = c->page ? malloc(sizeof(int32_t) * (size_t)(c->b * h->pages_per_seq)) : NULL;
    h->batch_idx = malloc(sizeof(int32_t) * (size_t)h->slabs);
    if (!h->k || !h->v || !h->ks || !h->vs || !h->lse || !h->sinks || !h->q || !h->o || !h->knew || !h->vnew ||
        !h->seqlens || !h->leftpad || (c->page && !h->table) || !h->batch_idx)
        return -1;
    memset(h->k, 0x5a, h->k_bytes); /* row padding: must come back unchanged */
    memset(h->v, 0xa5, h->v_bytes);
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        fill_row(c->kvd, &rng, h->k + r * h->pitch_k, c->d, &s, 0);
        h->ks[r] = s;
        fill_row(c->kvd, &rng, h->v + r * h->pitch_v, c->dv, &s,
                 c->scale_spread ? (c->dtype == FA_DTYPE_F16 ? 8 : 20) : 0);
        h->vs[r] = s;
    }
    if (c->kvd == FA_KV_FP8_E4M3)
        for (int64_t i = 0; i < c->hkv; i++) {
            h->ks[i] = (float)(0.02 + 0.02 * fa_test_rng_uniform(&rng));
            h->vs[i] = (float)(0.02 + 0.02 * fa_test_rng_uniform(&rng));
        }
    int row_exp = 0;
    for (size_t i = 0; i < h->q_elems; i++) {
        double x = fa_test_rng_normal(&rng);
        if (c->q_spread) {
            if (i % (size_t)c->d == 0) row_exp = (int)fa_test_rng_int(&rng, -10, 3);
            x = ldexp(x, row_exp - (int)fa_test_rng_int(&rng, 0, 16));
        }
        fa_test_store(h->q, c->dtype, (int64_t)i, x);
    }
    for (size_t i = 0; i < h->knew_elems; i++) fa_test_store(h->knew, c->dtype, (int64_t)i, fa_test_rng_normal(&rng));
    for (size_t i = 0; i < h->vnew_elems; i++) fa_test_store(h->vnew, c->dtype, (int64_t)i, fa_test_rng_normal(&rng));
    memset(h->o, 0xff, h->o_elems * es); /* NaN in f16 and bf16 */
    for (int64_t i = 0; i < c->b * c->hq * c->sq; i++) h->lse[i] = NAN;
    const int64_t room = c->cap - c->n_new;
    for (int64_t b = 0; b < c->b; b++) {
        h->seqlens[b] = (int32_t)fa_test_rng_int(&rng, b == 0 ? room : 0, room);
        h->leftpad[b] = c->leftpad ? (int32_t)fa_test_rng_int(&rng, 0, h->seqlens[b]) : 0;
    }
    if (c->page) {
        const int64_t n = c->b * h->pages_per_seq;
        int32_t *pool = malloc(sizeof(int32_t) * (size_t)h->slabs);
        if (!pool) return -1;
        for (int64_t i = 0; i < h->slabs; i++) pool[i] = (int32_t)i;
        for (int64_t i = h->slabs - 1; i > 0; i--) {
            int64_t j = fa_test_rng_int(&rng, 0, i);
            int32_t x = pool[i];
            pool[i] = pool[j];
            pool[j] = x;
        }
        memcpy(h->table, pool, sizeof(int32_t) * (size_t)n);
        free(pool);
    }
    for (int64_t i = 0; i < c->hq; i++) h->sinks[i] = (float)fa_test_rng_normal(&rng);
    for (int64_t i = 0; i < h->slabs; i++) h->batch_idx[i] = (int32_t)i; /* sequence b -> cache row [b] */
    for (int64_t i = h->slabs - 1; c->batch_idx && i > 0; i--) {
        int64_t j = fa_test_rng_int(&rng, 0, i);
        int32_t x = h->batch_idx[i];
        h->batch_idx[i] = h->batch_idx[j];
        h->batch_idx[j] = x;
    }
    return 0;
}

/* fa_params over the pointers in `ptr` (host or device copies of h's buffers, same order). */
typedef struct qptrs {
    void *k, *v, *ks, *vs, *lse, *sinks, *q, *o, *knew, *vnew, *seqlens, *leftpad, *table, *batch_idx;
} qptrs;

static fa_params qparams(const qspec *c, const qhost *h, const qptrs *x, fa_device device) {
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = device;
    p.dtype = c->dtype;
    p.batch = c->b;
    p.seqlen_q = c->sq;
    p.seqlen_k = c->page ? h->pages_per_seq * c->page : c->cap;
    p.heads_q = c->hq;
    p.heads_kv = c->hkv;
    p.head_dim = c->d;
    p.head_dim_v = c->dv;
    p.q = x->q, p.o = x->o, p.k = x->k, p.v = x->v;
    p.q_head_stride = c->d, p.q_row_stride = c->hq * c->d, p.q_batch_stride = c->sq * c->hq * c->d;
    p.o_head_stride = c->dv, p.o_row_stride = c->hq * c->dv, p.o_batch_stride = c->sq * c->hq * c->dv;
    p.kv_dtype = c->kvd;
    p.k_head_stride = h->pitch_k, p.k_row_stride = c->hkv * h->pitch_k, p.k_batch_stride = h->slab_rows * c->hkv * h->pitch_k;
    p.v_head_stride = h->pitch_v, p.v_row_stride = c->hkv * h->pitch_v, p.v_batch_stride = h->slab_rows * c->hkv * h->pitch_v;
    if (c->kvd != FA_KV_Q8_0) p.k_scale = x->ks, p.v_scale = x->vs;
    if (c->kvd == FA_KV_INT8) {
        p.k_scale_head_stride = p.v_scale_head_stride = 1;
        p.k_scale_row_stride = p.v_scale_row_stride = c->hkv;
        p.k_scale_batch_stride = p.v_scale_batch_stride = h->slab_rows * c->hkv;
    }
    if (c->page) {
        p.block_table = x->table;
        p.page_size = c->page;
        p.num_pages = h->slabs;
        p.block_table_batch_stride = h->pages_per_seq;
    }
    p.cache_seqlens = x->seqlens;
    p.cache_leftpad = c->leftpad ? x->leftpad : NULL;
    if (c->batch_idx) {
        p.cache_batch_idx = x->batch_idx;
        p.cache_batch = h->slabs;
    }
    if (c->n_new > 0) {
        p.k_new = x->knew, p.v_new = x->vnew;
        p.knew_head_stride = c->d, p.knew_row_stride = c->hkv * c->d, p.knew_batch_stride = c->n_new * c->hkv * c->d;
        p.vnew_head_stride = c->dv, p.vnew_row_stride = c->hkv * c->dv, p.vnew_batch_stride = c->n_new * c->hkv * c->dv;
        p.seqlen_new = c->n_new;
    }
    p.lse = c->no_lse ? NULL : x->lse;
    p.causal = c->causal;
    if (c->window_left >= 0) {
        p.use_window = 1;
        p.window_left = c->window_left;
        p.window_right = -1;
    }
    p.softcap = c->softcap;
    p.sink_logits = c->sinks ? x->sinks : NULL;
    p.num_splits = c->splits;
    return p;
}

static qptrs host_ptrs(const qhost *h) {
    qptrs x = {h->k,    h->v,    h->ks,   h->vs,      h->lse,     h->sinks, h->q,
               h->o,    h->knew, h->vnew, h->seqlens, h->leftpad, h->table, h->batch_idx};
    return x;
}

enum { QBUFFERS = 14 };

/* Sizes of the QBUFFERS buffers, in qptrs order. */
static void buffer_sizes(const qspec *c, const qhost *h, size_t n[QBUFFERS]) {
    const size_t es = fa_test_dtype_size(c->dtype);
    const size_t scales = sizeof(float) * (size_t)(c->kvd == FA_KV_INT8 ? h->scale_count : c->hkv);
    n[0] = h->k_bytes, n[1] = h->v_bytes, n[2] = scales, n[3] = scales;
    n[4] = sizeof(float) * (size_t)(c->b * c->hq * c->sq), n[5] = sizeof(float) * (size_t)c->hq;
    n[6] = h->q_elems * es, n[7] = h->o_elems * es, n[8] = h->knew_elems * es, n[9] = h->vnew_elems * es;
    n[10] = n[11] = sizeof(int32_t) * (size_t)c->b;
    n[12] = c->page ? sizeof(int32_t) * (size_t)(c->b * h->pages_per_seq) : 0;
    n[13] = sizeof(int32_t) * (size_t)h->slabs;
}

static int upload(const qspec *c, const qhost *h, qptrs *dev) {
    size_t n[QBUFFERS];
    buffer_sizes(c, h, n);
    qptrs src = host_ptrs(h);
    void **s = (void **)&src, **d = (void **)dev;
    memset(dev, 0, sizeof *dev);
    for (int i = 0; i < QBUFFERS; i++) {
        if (n[i] == 0) continue;
        if (cudaMalloc(&d[i], n[i]) != cudaSuccess || cudaMemcpy(d[i], s[i], n[i], cudaMemcpyHostToDevice) != cudaSuccess)
            return -1;
    }
    return 0;
}

/* Device buffers back into h (the caches, scales, o, lse). */
static int download(const qspec *c, qhost *h, const qptrs *dev) {
    size_t n[QBUFFERS];
    buffer_sizes(c, h, n);
    qptrs dst = host_ptrs(h);
    void **s = (void **)dev, **d = (void **)&dst;
    if (cudaDeviceSynchronize() != cudaSuccess) return -1;
    const int which[6] = {0, 1, 2, 3, 4, 7};
    for (int i = 0; i < 6; i++)
        if (n[which[i]] && cudaMemcpy(d[which[i]], s[which[i]], n[which[i]], cudaMemcpyDeviceToHost) != cudaSuccess)
            return -1;
    return 0;
}

static void release(qptrs *dev) {
    void **d = (void **)dev;
    for (int i = 0; i < QBUFFERS; i++)
        if (d[i]) cudaFree(d[i]);
    memset(dev, 0, sizeof *dev);
}

/* (slab, row) of slot j of sequence b */
static int64_t cache_row(const qspec *c, const qhost *h, int64_t b, int64_t j, int64_t head) {
    int64_t slab = c->batch_idx ? h->batch_idx[b] : b, row = j;
    if (c->page) {
        slab = h->table[b * h->pages_per_seq + j / c->page];
        row = j % c->page;
    }
    return (slab * h->slab_rows + row) * c->hkv + head;
}

static void describe(const qspec *c, char *out, size_t n) {
    snprintf(out, n,
             "%s %s b%lld sq%lld hq%lld hkv%lld d%lld dv%lld cap%lld page%lld pad%lld new%lld%s%s%s%s%s%s%s%s "
             "splits%d wl%d (seed %llu)",
             kvd_name(c->kvd), fa_test_dtype_name(c->dtype), (long long)c->b, (long long)c->sq, (long long)c->hq,
             (long long)c->hkv, (long long)c->d, (long long)c->dv, (long long)c->cap, (long long)c->page,
             (long long)c->pad_bytes, (long long)c->n_new, c->causal ? " causal" : "", c->sinks ? " sinks" : "",
             c->leftpad ? " leftpad" : "", c->batch_idx ? " batch_idx" : "", c->softcap > 0 ? " softcap" : "", c->no_lse ? " no-lse" : "",
             c->q_spread ? " q-spread" : "", c->scale_spread ? " scale-spread" : "", c->splits,
             c->window_left, (unsigned long long)c->seed);
}

/* o and lse of the CUDA run (in h) against float64 attention on h's dequantised cache. */
static void check_outputs(const qspec *c, const qhost *h, const char *label) {
    const int64_t d = c->d, dv = c->dv, G = c->hq / c->hkv;
    const double scale = 1.0 / sqrt((double)d);
    double *k = malloc(sizeof(double) * (size_t)(c->cap * d)), *v = malloc(sizeof(double) * (size_t)(c->cap * dv));
    float *k16 = malloc(sizeof(float) * (size_t)(c->cap * d)), *v16 = malloc(sizeof(float) * (size_t)(c->cap * dv));
    double *sc = malloc(sizeof(double) * (size_t)c->cap), *ref = malloc(sizeof(double) * (size_t)dv);
    float *sc32 = malloc(sizeof(float) * (size_t)c->cap), *acc32 = malloc(sizeof(float) * (size_t)dv);
    if (!k || !v || !k16 || !v16 || !sc || !ref || !sc32 || !acc32) {
        EXPECT(0, "%s: out of memory", label);
        goto done;
    }
    double err = 0, base = 0, ref_max = 0, term_max = 0, lse_err = 0, lse_base = 0, lse_max = 0;
    int64_t unwritten = 0;
    const size_t es = fa_test_dtype_size(c->dtype);
    for (int64_t b = 0; b < c->b; b++) {
        const int64_t pad = h->leftpad[b], len_k = h->seqlens[b] + c->n_new - pad;
        for (int64_t hk = 0; hk < c->hkv; hk++) {
            for (int64_t j = 0; j < len_k; j++) {
                const int64_t r = cache_row(c, h, b, pad + j, hk);
                const double ks = c->kvd == FA_KV_INT8 ? h->ks[r] : c->kvd == FA_KV_FP8_E4M3 ? h->ks[hk] : 1.0;
                const double vs = c->kvd == FA_KV_INT8 ? h->vs[r] : c->kvd == FA_KV_FP8_E4M3 ? h->vs[hk] : 1.0;
                dequant(c->kvd, h->k + r * h->pitch_k, ks, d, k + j * d);
                dequant(c->kvd, h->v + r * h->pitch_v, vs, dv, v + j * dv);
                for (int64_t e = 0; e < d; e++) k16[j * d + e] = fa_test_round_to(c->dtype, (float)k[j * d + e]);
                for (int64_t e = 0; e < dv; e++) {
                    v16[j * dv + e] = fa_test_round_to(c->dtype, (float)v[j * dv + e]);
                    if (fabs(v[j * dv + e]) > term_max) term_max = fabs(v[j * dv + e]);
                }
            }
            for (int64_t g = 0; g < G; g++)
                for (int64_t i = 0; i < c->sq; i++) {
                    const int64_t hq = hk * G + g, pos = i + len_k - c->sq;
                    int64_t lo = c->window_left >= 0 ? pos - c->window_left : 0, hi = c->causal ? pos + 1 : len_k;
                    if (lo < 0) lo = 0;
                    if (hi > len_k) hi = len_k;
                    const int64_t qoff = ((b * c->sq + i) * c->hq + hq) * d;
                    double top = -INFINITY;
                    float top32 = -INFINITY;
                    for (int64_t j = lo; j < hi; j++) {
                        double s = 0.0;
                        float s32 = 0.0f;
                        for (int64_t e = 0; e < d; e++) {
                            const double qe = fa_test_load(h->q, c->dtype, qoff + e);
                            s += qe * k[j * d + e];
                            s32 += (float)qe * k16[j * d + e];
                        }
                        s *= scale;
                        s32 *= (float)scale;
                        if (c->softcap > 0) {
                            s = c->softcap * tanh(s / c->softcap);
                            s32 = c->softcap * tanhf(s32 / c->softcap);
                        }
                        sc[j] = s, sc32[j] = s32;
                        if (s > top) top = s;
                        if (s32 > top32) top32 = s32;
                    }
                    const double sink = c->sinks ? h->sinks[hq] : -INFINITY;
                    if (sink > top) top = sink;
                    if ((float)sink > top32) top32 = (float)sink;
                    double z = c->sinks ? exp(sink - top) : 0.0;
                    float z32 = c->sinks ? expf((float)sink - top32) : 0.0f;
                    for (int64_t e = 0; e < dv; e++) ref[e] = 0.0, acc32[e] = 0.0f;
                    for (int64_t j = lo; j < hi; j++) {
                        const double pj = exp(sc[j] - top);
                        const float pj32 = expf(sc32[j] - top32);
                        const float p16 = fa_test_round_to(c->dtype, pj32);
                        z += pj, z32 += pj32;
                        for (int64_t e = 0; e < dv; e++) {
                            ref[e] += pj * v[j * dv + e];
                            acc32[e] += p16 * v16[j * dv + e];
                        }
                    }
                    const int64_t ooff = ((b * c->sq + i) * c->hq + hq) * dv;
                    for (int64_t e = 0; e < dv; e++) {
                        const double r = z > 0 ? ref[e] / z : 0.0;
                        const double bl = fa_test_round_to(c->dtype, z32 > 0 ? acc32[e] / z32 : 0.0f);
                        const double got = fa_test_load(h->o, c->dtype, ooff + e);
                        uint16_t bits;
                        memcpy(&bits, (const char *)h->o + (size_t)(ooff + e) * es, 2);
                        if (bits == 0xffff) unwritten++;
                        if (!(fabs(got - r) <= err)) err = isnan(got) ? INFINITY : fabs(got - r);
                        if (fabs(bl - r) > base) base = fabs(bl - r);
                        if (fabs(r) > ref_max) ref_max = fabs(r);
                    }
                    if (!c->no_lse) {
                        const int64_t li = (b * c->hq + hq) * c->sq + i;
                        const double lr = z > 0 ? top + log(z) : -INFINITY;
                        const double lb = z32 > 0 ? (double)(top32 + logf(z32)) : -INFINITY;
                        const double lg = h->lse[li];
                        if (isnan(lg)) unwritten++;
                        if (isinf(lr)) {
                            if (!(lg == lr)) lse_err = INFINITY;
                        } else {
                            if (!(fabs(lg - lr) <= lse_err)) lse_err = isnan(lg) ? INFINITY : fabs(lg - lr);
                            if (fabs(lb - lr) > lse_base) lse_base = fabs(lb - lr);
                            if (fabs(lr) > lse_max) lse_max = fabs(lr);
                        }
                    }
                }
        }
    }
    const double tol = 2.0 * base + fa_test_floor(c->dtype, ref_max, term_max);
    const double lse_tol = 2.0 * lse_base + fa_test_floor(FA_DTYPE_F32, lse_max, lse_max);
    EXPECT(unwritten == 0, "%s: %lld output elements still hold the poison", label, (long long)unwritten);
    EXPECT(err <= tol, "%s: o: max error %.3g vs float64, tolerance %.3g (plain attention in the dtype %.3g)", label,
           err, tol, base);
    EXPECT(lse_err <= lse_tol, "%s: lse: max error %.3g, tolerance %.3g", label, lse_err, lse_tol);
done:
    free(k), free(v), free(k16), free(v16), free(sc), free(ref), free(sc32), free(acc32);
}

static void run_case(const qspec *c) {
    char label[400];
    describe(c, label, sizeof label);
    qhost cpu, gpu;
    if (qhost_make(&cpu, c) || qhost_make(&gpu, c)) {
        EXPECT(0, "%s: out of memory", label);
        qhost_free(&cpu), qhost_free(&gpu);
        return;
    }
    qptrs hp = host_ptrs(&cpu);
    fa_params pc = qparams(c, &cpu, &hp, FA_DEVICE_CPU);
    const fa_status s_cpu = fa_kvcache_forward(&pc);
    EXPECT(s_cpu == FA_OK, "%s: CPU: %s", label, fa_last_error());
    qptrs dev;
    if (upload(c, &gpu, &dev)) {
        EXPECT(0, "%s: upload failed", label);
    } else {
        fa_params pg = qparams(c, &gpu, &dev, FA_DEVICE_CUDA);
        const fa_status s = fa_kvcache_forward(&pg);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fa_last_error());
        if (download(c, &gpu, &dev)) EXPECT(0, "%s: CUDA error after the call: %s", label, cudaGetErrorString(cudaGetLastError()));
        EXPECT(s == FA_OK, "%s: CUDA: %s", label, msg);
        if (s == FA_OK && s_cpu == FA_OK) {
            int64_t diff = 0;
            for (size_t i = 0; i < cpu.k_bytes; i++) diff += cpu.k[i] != gpu.k[i];
            for (size_t i = 0; i < cpu.v_bytes; i++) diff += cpu.v[i] != gpu.v[i];
            if (c->kvd == FA_KV_INT8)
                diff += memcmp(cpu.ks, gpu.ks, sizeof(float) * (size_t)cpu.scale_count) != 0 ||
                        memcmp(cpu.vs, gpu.vs, sizeof(float) * (size_t)cpu.scale_count) != 0;
            EXPECT(diff == 0, "%s: %lld cache bytes (or the scales) differ from the CPU engine's", label, (long long)diff);
            check_outputs(c, &gpu, label);
        }
    }
    release(&dev);
    qhost_free(&cpu), qhost_free(&gpu);
}

static void draw(fa_test_rng *rng, int index, int small, qspec *c) {
    static const int64_t dims_i8[] = {64, 72, 128, 136, 200, 256};
    static const int64_t dims_q8[] = {64, 128, 192, 256};
    static const int64_t pages[] = {1, 3, 16, 64, 256};
    memset(c, 0, sizeof *c);
    c->kvd = (fa_kv_dtype)(1 + index % 3);
    c->dtype = (index / 3) % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    c->seed = fa_test_rng_next(rng);
    if (c->kvd == FA_KV_Q8_0) {
        c->d = dims_q8[fa_test_rng_int(rng, 0, small ? 1 : 3)];
        c->dv = fa_test_rng_uniform(rng) < 0.7 ? c->d : dims_q8[fa_test_rng_int(rng, 0, small ? 1 : 3)];
    } else {
        c->d = dims_i8[fa_test_rng_int(rng, 0, small ? 2 : 5)];
        c->dv = fa_test_rng_uniform(rng) < 0.7 ? c->d : dims_i8[fa_test_rng_int(rng, 0, small ? 2 : 5)];
    }
    static const int64_t pads[] = {0, 0, 4, 8, 16};
    c->pad_bytes = pads[fa_test_rng_int(rng, 0, 4)];
    c->hkv = fa_test_rng_int(rng, 1, 4);
    c->hq = c->hkv * fa_test_rng_int(rng, 1, 8);
    c->b = fa_test_rng_int(rng, 1, small ? 2 : 4);
    c->sq = fa_test_rng_uniform(rng) < 0.5 ? 1 : fa_test_rng_int(rng, 2, small ? 4 : 20);
    const int mode = fa_test_rng_int(rng, 0, 3); /* no append, as many, more, fewer new tokens */
    c->n_new = mode == 0 ? 0 : mode == 1 ? c->sq : mode == 2 ? c->sq + fa_test_rng_int(rng, 1, small ? 4 : 70)
                                                            : (c->sq > 1 ? fa_test_rng_int(rng, 1, c->sq - 1) : 1);
    c->cap = c->n_new + (small ? fa_test_rng_int(rng, 1, 150) : fa_test_rng_int(rng, 1, index % 4 == 0 ? 4000 : 600));
    c->page = fa_test_rng_uniform(rng) < 0.5 ? pages[fa_test_rng_int(rng, 0, 4)] : 0;
    c->causal = c->sq > 1 && fa_test_rng_uniform(rng) < 0.7;
    c->window_left = fa_test_rng_uniform(rng) < 0.2 ? (int)fa_test_rng_int(rng, 0, c->cap) : -1;
    c->sinks = fa_test_rng_uniform(rng) < 0.3;
    c->leftpad = !c->page && fa_test_rng_uniform(rng) < 0.3;
    c->batch_idx = !c->page && fa_test_rng_uniform(rng) < 0.3;
    c->softcap = fa_test_rng_uniform(rng) < 0.2 ? 4.0f : 0.0f;
    c->no_lse = fa_test_rng_uniform(rng) < 0.1;
    c->splits = (int)fa_test_rng_int(rng, 0, 6);
    c->q_spread = fa_test_rng_uniform(rng) < 0.25;
    c->scale_spread = c->kvd == FA_KV_INT8 && fa_test_rng_uniform(rng) < 0.3;
    /* the float64 oracle's work: batch, then the group, then the capacity give way */
    while ((double)c->b * c->hq * c->sq * c->cap * (c->d + c->dv) > 6e7) {
        if (c->b > 1) c->b--;
        else if (c->hq > c->hkv) c->hq -= c->hkv;
        else if (c->cap > c->n_new + 64) c->cap = c->n_new + (c->cap - c->n_new) / 2;
        else break;
    }
}

/* NaN in the cache: an e4m3 NaN code in a K row of sequence 0, kv head 1, and in a V row of
 * sequence 1, kv head 0 (int8: NaN scales there instead). Every row sees every slot (one query
 * token, no window), so the outputs of those (sequence, kv head) pairs are NaN and the others are
 * not: the CUDA outputs must be NaN exactly where the CPU engine's are, and both must have some. */
static void nan_cache(uint64_t seed) {
    for (int t = 0; t < 2; t++)
        for (int splits = 1; splits <= 3; splits += 2) {
            qspec c;
            memset(&c, 0, sizeof c);
            c.kvd = t ? FA_KV_INT8 : FA_KV_FP8_E4M3;
            c.dtype = splits == 1 ? FA_DTYPE_BF16 : FA_DTYPE_F16;
            c.b = 2, c.sq = 1, c.hq = 8, c.hkv = 2, c.d = 128, c.dv = 128, c.cap = 300, c.window_left = -1;
            c.splits = splits, c.seed = seed + (uint64_t)(2 * t + splits);
            char label[96];
            snprintf(label, sizeof label, "%s NaN in the cache, splits %d", kvd_name(c.kvd), splits);
            qhost cpu, gpu;
            qptrs dev;
            memset(&cpu, 0, sizeof cpu), memset(&gpu, 0, sizeof gpu), memset(&dev, 0, sizeof dev);
            if (qhost_make(&cpu, &c) || qhost_make(&gpu, &c)) {
                EXPECT(0, "%s: out of memory", label);
            } else {
                qhost *hs[2] = {&cpu, &gpu};
                for (int i = 0; i < 2; i++) {
                    qhost *h = hs[i];
                    h->seqlens[0] = h->seqlens[1] = 280;
                    const int64_t rk = cache_row(&c, h, 0, 100, 1), rv = cache_row(&c, h, 1, 200, 0);
                    if (c.kvd == FA_KV_INT8) {
                        h->ks[rk] = NAN;
                        h->vs[rv] = NAN;
                    } else {
                        h->k[rk * h->pitch_k + 5] = 0x7f;
                        h->v[rv * h->pitch_v + 77] = 0xff;
                    }
                }
                qptrs hp = host_ptrs(&cpu);
                fa_params pc = qparams(&c, &cpu, &hp, FA_DEVICE_CPU);
                EXPECT(fa_kvcache_forward(&pc) == FA_OK, "%s: CPU: %s", label, fa_last_error());
                if (upload(&c, &gpu, &dev)) {
                    EXPECT(0, "%s: upload failed", label);
                } else {
                    fa_params pg = qparams(&c, &gpu, &dev, FA_DEVICE_CUDA);
                    const fa_status st = fa_kvcache_forward(&pg);
                    EXPECT(st == FA_OK, "%s: CUDA: %s", label, fa_last_error());
                    if (download(&c, &gpu, &dev)) EXPECT(0, "%s: CUDA error after the call", label);
                    int64_t differ = 0, nans = 0;
                    for (size_t i = 0; i < gpu.o_elems; i++) {
                        const int n_cpu = isnan(fa_test_load(cpu.o, c.dtype, (int64_t)i)) != 0;
                        differ += n_cpu != (isnan(fa_test_load(gpu.o, c.dtype, (int64_t)i)) != 0);
                        nans += n_cpu;
                    }
                    EXPECT(st != FA_OK || (differ == 0 && nans > 0 && nans < (int64_t)gpu.o_elems),
                           "%s: %lld outputs NaN on one engine only (%lld of %zu NaN on the CPU)", label,
                           (long long)differ, (long long)nans, gpu.o_elems);
                }
            }
            release(&dev);
            qhost_free(&cpu), qhost_free(&gpu);
        }
}

/* Refused on CUDA: status, a message naming `field`, nothing written. */
static void bad_case(const qspec *c, void (*tweak)(fa_params *p, const qptrs *dev), fa_status want, const char *field,
                     const char *label) {
    qhost h, before;
    if (qhost_make(&h, c) || qhost_make(&before, c)) {
        EXPECT(0, "%s: out of memory", label);
        qhost_free(&h), qhost_free(&before);
        return;
    }
    qptrs dev;
    if (upload(c, &h, &dev)) {
        EXPECT(0, "%s: upload failed", label);
    } else {
        fa_params p = qparams(c, &h, &dev, FA_DEVICE_CUDA);
        tweak(&p, &dev);
        const fa_status got = fa_kvcache_forward(&p);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fa_last_error());
        if (download(c, &h, &dev)) EXPECT(0, "%s: CUDA error", label);
        EXPECT(got == want, "%s: %s, want %s: %s", label, fa_strerror(got), fa_strerror(want), msg);
        EXPECT(strstr(msg, field) != NULL, "%s: message does not name %s: \"%s\"", label, field, msg);
        const size_t es = fa_test_dtype_size(c->dtype);
        EXPECT(!memcmp(h.k, before.k, h.k_bytes) && !memcmp(h.v, before.v, h.v_bytes) &&
                   !memcmp(h.o, before.o, h.o_elems * es),
               "%s: the cache or o was written", label);
    }
    release(&dev);
    qhost_free(&h), qhost_free(&before);
}

static void tweak_rotary(fa_params *p, const qptrs *dev) {
    p->rotary_cos = dev->q; /* any device pointers: refused before they are read */
    p->rotary_sin = dev->q;
    p->rotary_dim = 16;
    p->rotary_seqlen = p->seqlen_k;
}
static void tweak_none(fa_params *p, const qptrs *dev) { (void)p, (void)dev; }
static void tweak_stride(fa_params *p, const qptrs *dev) {
    (void)dev;
    p->k_head_stride += 2; /* 2-byte aligned heads, still inside the padded rows */
}

static void bad_values(uint64_t seed) {
    qspec c;
    memset(&c, 0, sizeof c);
    c.dtype = FA_DTYPE_BF16, c.b = 2, c.sq = 1, c.hq = 4, c.hkv = 2, c.d = 64, c.dv = 64, c.cap = 100;
    c.n_new = 1, c.window_left = -1, c.seed = seed;
    for (int t = 1; t <= 3; t++) {
        c.kvd = (fa_kv_dtype)t;
        char label[64];
        snprintf(label, sizeof label, "%s with rotary", kvd_name(c.kvd));
        bad_case(&c, tweak_rotary, FA_ERR_UNSUPPORTED, "rotary_cos", label);
    }
    c.kvd = FA_KV_Q8_0, c.d = c.dv = 96;
    bad_case(&c, tweak_none, FA_ERR_UNSUPPORTED, "head_dim", "q8_0 head_dim 96");
    c.kvd = FA_KV_INT8, c.d = c.dv = 64, c.pad_bytes = 8;
    bad_case(&c, tweak_stride, FA_ERR_UNSUPPORTED, "k_head_stride", "int8 with 2-byte aligned heads");
}

int gpu_kvquant_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    const uint64_t seed = gpu_announce_seed("kvquant");
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    const int cases = small ? 12 : 150;
    for (int i = 0; i < cases; i++) {
        qspec c;
        draw(&rng, i, small, &c);
        run_case(&c);
    }
    /* every head-dim bucket of the int8 / e4m3 kernel in every mode (the small ones run under
     * compute-sanitizer): d 256 paged with appends, several query tokens and splits; d 256 / dv
     * 200 with rows padded to 8-byte copies; d 64 with a spread of V scales and query rows */
    static const qspec fixed[] = {
        {.kvd = FA_KV_FP8_E4M3, .dtype = FA_DTYPE_BF16, .b = 2, .sq = 3, .hq = 8, .hkv = 2, .d = 256, .dv = 256,
         .cap = 200, .page = 16, .n_new = 2, .causal = 1, .window_left = -1, .sinks = 1, .splits = 3, .q_spread = 1},
        {.kvd = FA_KV_INT8, .dtype = FA_DTYPE_F16, .b = 2, .sq = 1, .hq = 4, .hkv = 2, .d = 256, .dv = 200,
         .cap = 150, .pad_bytes = 8, .window_left = -1, .leftpad = 1, .scale_spread = 1},
        {.kvd = FA_KV_INT8, .dtype = FA_DTYPE_BF16, .b = 3, .sq = 2, .hq = 16, .hkv = 2, .d = 64, .dv = 64,
         .cap = 180, .page = 3, .n_new = 2, .causal = 1, .window_left = -1, .splits = 2, .q_spread = 1,
         .scale_spread = 1},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        qspec c = fixed[i];
        c.seed = fa_test_rng_next(&rng);
        run_case(&c);
    }
    nan_cache(seed + 2);
    bad_values(seed + 1);
    printf("kvquant: %d cases, %d failures\n", cases, failures);
    return failures ? 1 : 0;
}
