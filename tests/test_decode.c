/*
 * test_decode.c: the CPU decode path (src/cpu/cpu_decode.c) on quantised KV caches (int8 with a
 * scale per token and head, llama.cpp Q8_0 blocks, fp8 e4m3 with a per-head scale): attention
 * against float64 attention on the dequantised cache (error <= 2x that of fp32 attention on the
 * same dequantised cache, rounded to the dtype, + a tiny floor), contiguous and paged caches,
 * causal, softcap, sinks, split-KV, thread counts, seqlen_new > seqlen_q; the append's quantisation of k_new / v_new
 * (element error within half a quantisation step); the e4m3 conversions; the split count as a
 * pure function; and bad quantised-cache fields reported by name with nothing written.
 * (The unquantised decode path is covered by test_kvcache.c, whose decode shapes it serves.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_internal.h"
#include "cpu/cpu_convert.h"
#include "cpu/cpu_decode.h"
#include "oracle/reference.h"
#include "tests/test.h"

typedef struct qcase {
    fa_kv_dtype kvd;
    fa_dtype dtype;
    int64_t b, sq, hq, hkv, d, cap, page;
    int causal, append, sinks, splits, threads;
    int64_t extra_new; /* appended tokens beyond seqlen_q (seqlen_new = seqlen_q + extra_new) */
    float softcap;
} qcase;

/* Independent e4m3 decoder: sign, exponent (bias 7), 3 mantissa bits; S.1111.111 = NaN. */
static double e4m3_value(uint8_t x) {
    int e = (x >> 3) & 15, m = x & 7;
    double v = (e == 15 && m == 7) ? NAN : e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (x & 0x80) ? -v : v;
}

static int64_t row_bytes(fa_kv_dtype t, int64_t d) { return t == FA_KV_Q8_0 ? d / 32 * 34 : d; }

static void dequant(fa_kv_dtype t, const uint8_t *row, double scale, int64_t d, double *out) {
    for (int64_t i = 0; i < d; i++) {
        if (t == FA_KV_INT8) out[i] = (int8_t)row[i] * scale;
        else if (t == FA_KV_FP8_E4M3) out[i] = e4m3_value(row[i]) * scale;
        else {
            const uint8_t *blk = row + (i / 32) * 34;
            uint16_t h = (uint16_t)(blk[0] | blk[1] << 8);
            out[i] = (double)fa_test_f16_to_f32(h) * (int8_t)blk[2 + i % 32];
        }
    }
}

typedef struct qproblem {
    fa_params p;
    uint8_t *k, *v;
    float *ks, *vs;
    void *q, *o, *knew, *vnew;
    int32_t *seqlens, *table;
    float *sinks;
    int64_t slabs, slab_rows, rb;
} qproblem;

static void qproblem_free(qproblem *t) {
    free(t->k), free(t->v), free(t->ks), free(t->vs), free(t->q), free(t->o), free(t->knew), free(t->vnew);
    free(t->seqlens), free(t->table), free(t->sinks);
}

static void fill_row(const qcase *c, fa_test_rng *rng, uint8_t *row, float *scale) {
    if (c->kvd == FA_KV_INT8) {
        for (int64_t i = 0; i < c->d; i++) row[i] = (uint8_t)(int8_t)fa_test_rng_int(rng, -127, 127);
        *scale = (float)(0.004 + 0.012 * fa_test_rng_uniform(rng));
    } else if (c->kvd == FA_KV_FP8_E4M3) {
        for (int64_t i = 0; i < c->d; i++) row[i] = fa_cpu_f32_to_e4m3((float)(fa_test_rng_normal(rng) * 16.0));
    } else {
        for (int64_t blk = 0; blk < c->d / 32; blk++) {
            uint16_t h = fa_test_f32_to_f16((float)(0.004 + 0.012 * fa_test_rng_uniform(rng)));
            row[blk * 34] = (uint8_t)(h & 0xff);
            row[blk * 34 + 1] = (uint8_t)(h >> 8);
            for (int i = 0; i < 32; i++) row[blk * 34 + 2 + i] = (uint8_t)(int8_t)fa_test_rng_int(rng, -127, 127);
        }
    }
}

static int qproblem_make(qproblem *t, const qcase *c, uint64_t seed) {
    memset(t, 0, sizeof *t);
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    fa_params *p = &t->p;
    const size_t es = fa_test_dtype_size(c->dtype);
    t->rb = row_bytes(c->kvd, c->d);
    int64_t pages_per_seq = c->page ? (c->cap + c->page - 1) / c->page : 0;
    t->slabs = c->page ? c->b * pages_per_seq : c->b;
    t->slab_rows = c->page ? c->page : c->cap;
    size_t rows = (size_t)(t->slabs * t->slab_rows * c->hkv);
    t->k = malloc(rows * (size_t)t->rb);
    t->v = malloc(rows * (size_t)t->rb);
    t->ks = malloc(rows * sizeof(float));
    t->vs = malloc(rows * sizeof(float));
    t->q = malloc((size_t)(c->b * c->sq * c->hq * c->d) * es);
    t->o = malloc((size_t)(c->b * c->sq * c->hq * c->d) * es);
    const int64_t n_new = c->sq + c->extra_new;
    t->knew = malloc((size_t)(c->b * n_new * c->hkv * c->d) * es);
    t->vnew = malloc((size_t)(c->b * n_new * c->hkv * c->d) * es);
    t->seqlens = malloc(sizeof(int32_t) * (size_t)c->b);
    t->table = c->page ? malloc(sizeof(int32_t) * (size_t)(c->b * pages_per_seq)) : NULL;
    t->sinks = malloc(sizeof(float) * (size_t)c->hq);
    if (!t->k || !t->v || !t->ks || !t->vs || !t->q || !t->o || !t->knew || !t->vnew || !t->seqlens || !t->sinks ||
        (c->page && !t->table))
        return 0;
    for (size_t r = 0; r < rows; r++) {
        fill_row(c, &rng, t->k + r * (size_t)t->rb, &t->ks[r]);
        fill_row(c, &rng, t->v + r * (size_t)t->rb, &t->vs[r]);
    }
    if (c->kvd == FA_KV_FP8_E4M3)
        for (int64_t h = 0; h < c->hkv; h++) {
            t->ks[h] = (float)(0.02 + 0.02 * fa_test_rng_uniform(&rng));
            t->vs[h] = (float)(0.02 + 0.02 * fa_test_rng_uniform(&rng));
        }
    for (int64_t i = 0; i < c->b * c->sq * c->hq * c->d; i++) fa_test_store(t->q, c->dtype, i, fa_test_rng_normal(&rng));
    for (int64_t i = 0; i < c->b * n_new * c->hkv * c->d; i++) {
        fa_test_store(t->knew, c->dtype, i, fa_test_rng_normal(&rng));
        fa_test_store(t->vnew, c->dtype, i, fa_test_rng_normal(&rng));
    }
    memset(t->o, 0x7e, (size_t)(c->b * c->sq * c->hq * c->d) * es);
    for (int64_t b = 0; b < c->b; b++)
        t->seqlens[b] = (int32_t)fa_test_rng_int(&rng, b == 0 ? c->cap - (c->append ? n_new : 0) : 0,
                                                 c->cap - (c->append ? n_new : 0));
    if (c->page) {
        int64_t n = c->b * pages_per_seq;
        for (int64_t i = 0; i < n; i++) t->table[i] = (int32_t)i;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = fa_test_rng_int(&rng, 0, i);
            int32_t x = t->table[i];
            t->table[i] = t->table[j];
            t->table[j] = x;
        }
    }
    for (int64_t h = 0; h < c->hq; h++) t->sinks[h] = (float)fa_test_rng_normal(&rng);
    memset(p, 0, sizeof *p);
    p->device = FA_DEVICE_CPU;
    p->dtype = c->dtype;
    p->batch = c->b;
    p->seqlen_q = c->sq;
    p->seqlen_k = c->page ? pages_per_seq * c->page : c->cap;
    p->heads_q = c->hq;
    p->heads_kv = c->hkv;
    p->head_dim = c->d;
    fa_set_contiguous_strides(p);
    p->kv_dtype = c->kvd;
    p->k_head_stride = p->v_head_stride = t->rb;
    p->k_row_stride = p->v_row_stride = c->hkv * t->rb;
    p->k_batch_stride = p->v_batch_stride = t->slab_rows * c->hkv * t->rb;
    if (c->kvd != FA_KV_Q8_0) {
        p->k_scale = t->ks;
        p->v_scale = t->vs;
    }
    if (c->kvd == FA_KV_INT8) {
        p->k_scale_head_stride = p->v_scale_head_stride = 1;
        p->k_scale_row_stride = p->v_scale_row_stride = c->hkv;
        p->k_scale_batch_stride = p->v_scale_batch_stride = t->slab_rows * c->hkv;
    }
    if (c->page) {
        p->block_table = t->table;
        p->page_size = c->page;
        p->num_pages = t->slabs;
        p->block_table_batch_stride = pages_per_seq;
    }
    p->q = t->q;
    p->o = t->o;
    p->k = t->k;
    p->v = t->v;
    p->cache_seqlens = t->seqlens;
    if (c->append) {
        p->k_new = t->knew;
        p->v_new = t->vnew;
        p->knew_head_stride = p->vnew_head_stride = c->d;
        p->knew_row_stride = p->vnew_row_stride = c->hkv * c->d;
        p->knew_batch_stride = p->vnew_batch_stride = n_new * c->hkv * c->d;
        p->seqlen_new = c->extra_new ? n_new : 0; /* 0 = seqlen_q */
    }
    p->causal = c->causal;
    p->softcap = c->softcap;
    p->sink_logits = c->sinks ? t->sinks : NULL;
    p->num_splits = c->splits;
    p->num_threads = c->threads;
    return 1;
}

/* Byte offset of (b, slot, h) in the cache, and the int8 scale index. */
static int64_t cache_row_index(const qproblem *t, const qcase *c, int64_t b, int64_t slot, int64_t h) {
    int64_t slab = b, row = slot;
    if (c->page) {
        slab = t->table[b * t->p.block_table_batch_stride + slot / c->page];
        row = slot % c->page;
    }
    return (slab * t->slab_rows + row) * c->hkv + h;
}

static double row_scale(const qproblem *t, const qcase *c, const float *scales, int64_t index, int64_t h) {
    return c->kvd == FA_KV_INT8 ? scales[index] : c->kvd == FA_KV_FP8_E4M3 ? scales[h] : 1.0;
}

/* Checks one case; returns 1 when it passed. */
static int run_case(const qcase *c, const char *label) {
    qproblem t;
    uint64_t seed = fa_test_seed() ^ (uint64_t)(c->kvd * 131 + c->b * 7 + c->sq * 3 + c->page);
    if (!FA_CHECK(qproblem_make(&t, c, seed), "%s: out of memory", label)) {
        qproblem_free(&t);
        return 0;
    }
    fa_status st = fa_kvcache_forward(&t.p);
    int ok = FA_CHECK(st == FA_OK, "%s: %s", label, fa_last_error());
    const int64_t d = c->d, G = c->hq / c->hkv, appended = c->append ? c->sq + c->extra_new : 0;
    double *k = malloc(sizeof(double) * (size_t)(t.p.seqlen_k * d)), *v = malloc(sizeof(double) * (size_t)(t.p.seqlen_k * d));
    double *ref = malloc(sizeof(double) * (size_t)d), *base = malloc(sizeof(double) * (size_t)d);
    double *sc = malloc(sizeof(double) * (size_t)t.p.seqlen_k);
    float *sc32 = malloc(sizeof(float) * (size_t)t.p.seqlen_k), *acc32 = malloc(sizeof(float) * (size_t)d);
    double err = 0.0, base_err = 0.0, append_excess = 0.0;
    for (int64_t b = 0; ok && b < c->b; b++)
        for (int64_t h = 0; h < c->hkv; h++) {
            const int64_t len_k = t.seqlens[b] + appended;
            for (int64_t j = 0; j < len_k; j++) {
                int64_t idx = cache_row_index(&t, c, b, j, h);
                dequant(c->kvd, t.k + idx * t.rb, row_scale(&t, c, t.ks, idx, h), d, k + j * d);
                dequant(c->kvd, t.v + idx * t.rb, row_scale(&t, c, t.vs, idx, h), d, v + j * d);
                if (j >= t.seqlens[b]) { /* appended token: within half a quantisation step of k_new */
                    int64_t tok = j - t.seqlens[b];
                    for (int64_t e = 0; e < d; e++) {
                        int64_t src = ((b * (c->sq + c->extra_new) + tok) * c->hkv + h) * d + e;
                        double xs[2] = {fa_test_load(t.knew, c->dtype, src), fa_test_load(t.vnew, c->dtype, src)};
                        double got[2] = {k[j * d + e], v[j * d + e]};
                        const float *scales[2] = {t.ks, t.vs};
                        const uint8_t *bytes[2] = {t.k + idx * t.rb, t.v + idx * t.rb};
                        for (int w = 0; w < 2; w++) {
                            double step;
                            if (c->kvd == FA_KV_INT8) step = scales[w][idx] * 0.5 * (1 + 1e-6);
                            else if (c->kvd == FA_KV_Q8_0) {
                                const uint8_t *blk = bytes[w] + (e / 32) * 34;
                                step = 0.6 * fa_test_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
                            } else
                                step = fabs(xs[w]) * 0.0625 + scales[w][h] * ldexp(1.0, -10);
                            double excess = fabs(got[w] - xs[w]) - step;
                            if (excess > append_excess) append_excess = excess;
                        }
                    }
                }
            }
            for (int64_t g = 0; g < G; g++)
                for (int64_t i = 0; i < c->sq; i++) {
                    const int64_t hq = h * G + g;
                    int64_t lo, hi;
                    fa_key_range(i, c->sq, len_k, -1, c->causal ? 0 : -1, &lo, &hi);
                    const int64_t qoff = ((b * c->sq + i) * c->hq + hq) * d;
                    double top = -INFINITY;
                    float top32 = -INFINITY;
                    for (int64_t j = lo; j < hi; j++) {
                        double s = 0.0;
                        float s32 = 0.0f;
                        for (int64_t e = 0; e < d; e++) {
                            double qe = fa_test_load(t.q, c->dtype, qoff + e);
                            s += qe * k[j * d + e];
                            s32 += (float)qe * (float)k[j * d + e];
                        }
                        s *= 1.0 / sqrt((double)d);
                        s32 *= 1.0f / sqrtf((float)d);
                        if (c->softcap > 0) {
                            s = c->softcap * tanh(s / c->softcap);
                            s32 = c->softcap * tanhf(s32 / c->softcap);
                        }
                        sc[j] = s;
                        sc32[j] = s32;
                        if (s > top) top = s;
                        if (s32 > top32) top32 = s32;
                    }
                    double sink = c->sinks ? t.sinks[hq] : -INFINITY;
                    if (sink > top) top = sink;
                    if ((float)sink > top32) top32 = (float)sink;
                    double z = c->sinks ? exp(sink - top) : 0.0;
                    float z32 = c->sinks ? expf((float)sink - top32) : 0.0f;
                    for (int64_t e = 0; e < d; e++) ref[e] = 0.0, acc32[e] = 0.0f;
                    for (int64_t j = lo; j < hi; j++) {
                        double pj = exp(sc[j] - top);
                        float pj32 = expf(sc32[j] - top32);
                        z += pj;
                        z32 += pj32;
                        for (int64_t e = 0; e < d; e++) {
                            ref[e] += pj * v[j * d + e];
                            acc32[e] += pj32 * (float)v[j * d + e];
                        }
                    }
                    for (int64_t e = 0; e < d; e++) {
                        double r = z > 0 ? ref[e] / z : 0.0;
                        double bl = fa_test_round_to(c->dtype, z32 > 0 ? acc32[e] / z32 : 0.0f);
                        double got = fa_test_load(t.o, c->dtype, qoff + e);
                        if (!(fabs(got - r) <= err)) err = isnan(got) ? INFINITY : fabs(got - r);
                        if (fabs(bl - r) > base_err) base_err = fabs(bl - r);
                    }
                }
        }
    if (ok) {
        ok &= FA_CHECK(err <= 2.0 * base_err + 1e-6, "%s: max error %.3g vs float64, fp32 attention on the same cache %.3g",
                       label, err, base_err);
        ok &= FA_CHECK(append_excess <= 1e-6, "%s: an appended element is %.3g beyond half a quantisation step", label,
                       append_excess);
    }
    free(k), free(v), free(ref), free(base), free(sc), free(sc32), free(acc32);
    qproblem_free(&t);
    return ok;
}

static qcase qbase(fa_kv_dtype kvd, fa_dtype dtype, int64_t b, int64_t sq, int64_t hq, int64_t hkv, int64_t d, int64_t cap) {
    qcase c;
    memset(&c, 0, sizeof c);
    c.kvd = kvd, c.dtype = dtype, c.b = b, c.sq = sq, c.hq = hq, c.hkv = hkv, c.d = d, c.cap = cap;
    return c;
}

static const fa_kv_dtype quant_types[3] = {FA_KV_INT8, FA_KV_Q8_0, FA_KV_FP8_E4M3};
static const char *const quant_names[3] = {"int8", "q8_0", "e4m3"};

static void run_all(void (*tweak)(qcase *c), const char *feature) {
    const int big = fa_test_get_level() != FA_LEVEL_SMALL;
    for (int k = 0; k < 3; k++)
        for (int dt = 0; dt < 2; dt++) {
            fa_dtype dtype = dt ? FA_DTYPE_BF16 : FA_DTYPE_F16;
            qcase cases[3] = {qbase(quant_types[k], dtype, 3, 1, 8, 2, 64, 203),
                              qbase(quant_types[k], dtype, 2, 3, 3, 1, 128, 300), /* 9 rows: 8 + 1 */
                              qbase(quant_types[k], dtype, 1, 1, 32, 8, 128, big ? 1500 : 320)};
            for (int i = 0; i < 3; i++) {
                tweak(&cases[i]);
                char label[128];
                snprintf(label, sizeof label, "%s %s %s case %d", feature, quant_names[k], fa_test_dtype_name(dtype), i);
                run_case(&cases[i], label);
            }
        }
}

static void t_plain(qcase *c) { (void)c; }
static void t_causal_append(qcase *c) {
    c->causal = 1;
    c->append = 1;
}
static void t_paged(qcase *c) {
    c->page = 16;
    c->append = 1;
}
static void t_paged3_softcap_sinks(qcase *c) {
    c->page = 3;
    c->softcap = 5.0f;
    c->sinks = 1;
    c->causal = 1;
}
static void t_splits_threads(qcase *c) {
    c->splits = 5;
    c->threads = 3;
    c->append = 1;
    c->extra_new = 2; /* seqlen_new = seqlen_q + 2: the queries are the last of the new tokens */
    c->causal = 1;
}

FA_TEST(decode_quant_plain) { run_all(t_plain, "plain"); }
FA_TEST(decode_quant_causal_append) { run_all(t_causal_append, "causal append"); }
FA_TEST(decode_quant_paged_append) { run_all(t_paged, "paged(16) append"); }
FA_TEST(decode_quant_paged_softcap_sinks) { run_all(t_paged3_softcap_sinks, "paged(3) softcap sinks"); }
FA_TEST(decode_quant_splits_threads) { run_all(t_splits_threads, "splits 5, 3 threads"); }

/* Head dims that are not multiples of 32 (e4m3 and int8 caches: the x86 levels' 16- and 32-wide
 * steps then end in 8-, 16- and 24-value remainders), at the level the CPU runs (FA_CPU_ISA
 * chooses another). */
FA_TEST(decode_quant_head_dims) {
    static const int64_t dims[4] = {40, 48, 56, 72};
    static const fa_kv_dtype kinds[2] = {FA_KV_FP8_E4M3, FA_KV_INT8};
    for (int kind = 0; kind < 2; kind++)
        for (int dt = 0; dt < 2; dt++)
            for (int i = 0; i < 4; i++) {
                qcase c = qbase(kinds[kind], dt ? FA_DTYPE_BF16 : FA_DTYPE_F16, 2, 1, 8, 2, dims[i], 77);
                c.causal = i % 2;
                c.append = i >= 2;
                char label[96];
                snprintf(label, sizeof label, "%s %s d %lld", kind ? "int8" : "e4m3", fa_test_dtype_name(c.dtype),
                         (long long)dims[i]);
                run_case(&c, label);
            }
}

FA_TEST(decode_quant_scalar_isa) { /* the scalar kernels serve quantised caches without AVX2 */
    char *old = fa_test_env_set("FA_CPU_ISA", "scalar");
    for (int k = 0; k < 3; k++) {
        qcase c = qbase(quant_types[k], FA_DTYPE_F16, 2, 2, 8, 2, 64, 150);
        c.append = 1;
        c.causal = 1;
        char label[64];
        snprintf(label, sizeof label, "scalar %s", quant_names[k]);
        run_case(&c, label);
    }
    fa_test_env_restore("FA_CPU_ISA", old);
}

FA_TEST(decode_quant_int8_both_pv) { /* the integer and the fp32 P·V of an int8 cache, on any CPU */
    char *old = fa_test_env_set("FA_CPU_DECODE_INT_PV", "0"); /* each case sets it below */
    for (int integer = 0; integer < 2; integer++) {
        setenv("FA_CPU_DECODE_INT_PV", integer ? "1" : "0", 1);
        for (int paged = 0; paged < 2; paged++) {
            qcase c = qbase(FA_KV_INT8, FA_DTYPE_F16, 2, 3, 8, 2, 64, 150);
            c.append = 1;
            c.causal = 1;
            if (paged) t_paged(&c);
            char label[64];
            snprintf(label, sizeof label, "int8, %s P·V%s", integer ? "integer" : "fp32", paged ? ", paged" : "");
            run_case(&c, label);
        }
    }
    fa_test_env_restore("FA_CPU_DECODE_INT_PV", old);
}

FA_TEST(decode_quant_int8_vnni) { /* the int8 scores with and without AVX512-VNNI (the same sums) */
    char *old = fa_test_env_set("FA_CPU_DECODE_VNNI", "0"); /* each case sets it below */
    for (int vnni = 0; vnni < 2; vnni++) {
        setenv("FA_CPU_DECODE_VNNI", vnni ? "1" : "0", 1);
        for (int i = 0; i < 2; i++) {
            qcase c = qbase(FA_KV_INT8, i ? FA_DTYPE_BF16 : FA_DTYPE_F16, 2, 4, 8, 2, i ? 72 : 128, 150);
            c.append = 1;
            c.causal = i;
            char label[64];
            snprintf(label, sizeof label, "int8, vnni %s, d %lld", vnni ? "where present" : "off", (long long)c.d);
            run_case(&c, label);
        }
    }
    fa_test_env_restore("FA_CPU_DECODE_VNNI", old);
}

/* NaN in one query row, or in one token's int8 V scale: exactly the rows that read it are NaN (the
 * query's o and LSE; every query of the scale's kv head, o only), the others finite; an int8
 * cache with both P·V kernels (the integer one hands a block holding a non-finite weight to the
 * fp32 kernel). */
FA_TEST(decode_quant_nan_propagates) {
    char *old = fa_test_env_set("FA_CPU_DECODE_INT_PV", "0"); /* each case sets it below */
    for (int k = 0; k < 3; k++)
        for (int where = 0; where < 2; where++)
            for (int integer = 0; integer < 2; integer++) {
                if ((where || integer) && quant_types[k] != FA_KV_INT8) continue;
                setenv("FA_CPU_DECODE_INT_PV", integer ? "1" : "0", 1);
                const qcase c = qbase(quant_types[k], FA_DTYPE_F16, 2, 1, 8, 2, 64, 100);
                qproblem t;
                if (!FA_CHECK(qproblem_make(&t, &c, fa_test_seed() + (uint64_t)k), "out of memory")) {
                    qproblem_free(&t);
                    break;
                }
                float lse[2 * 8];
                t.p.lse = lse;
                for (int64_t b = 0; b < c.b; b++) t.seqlens[b] = (int32_t)c.cap;
                const int64_t nan_b = 1, nan_h = 5, nan_kv = nan_h / (c.hq / c.hkv);
                if (where == 0) fa_test_store(t.q, c.dtype, (nan_b * c.hq + nan_h) * c.d + 3, NAN);
                else t.vs[cache_row_index(&t, &c, nan_b, 37, nan_kv)] = NAN;
                int ok = FA_CHECK(fa_kvcache_forward(&t.p) == FA_OK, "%s: %s", quant_names[k], fa_last_error());
                int64_t wrong = 0;
                for (int64_t b = 0; ok && b < c.b; b++)
                    for (int64_t h = 0; h < c.hq; h++) {
                        const int expect = b == nan_b && (where == 0 ? h == nan_h : h / (c.hq / c.hkv) == nan_kv);
                        int64_t n_nan = 0;
                        for (int64_t e = 0; e < c.d; e++) n_nan += isnan(fa_test_load(t.o, c.dtype, (b * c.hq + h) * c.d + e));
                        const int lse_nan = isnan(lse[b * c.hq + h]);
                        if (expect ? n_nan != c.d || lse_nan != (where == 0) : n_nan != 0 || lse_nan) wrong++;
                    }
                FA_CHECK(ok && wrong == 0, "%s, NaN in %s, %s P·V: %lld rows wrong", quant_names[k],
                         where ? "a V scale" : "a query", integer ? "integer" : "fp32", (long long)wrong);
                qproblem_free(&t);
            }
    fa_test_env_restore("FA_CPU_DECODE_INT_PV", old);
}

/* An int8 cache whose V scales are tiny (2^-120 times the usual, so P times the scale lies near
 * or below fp32's smallest normal): the output is the usual one times 2^-120, from both P·V
 * kernels (the integer one once lost every weight of such a tile: 32767 / max overflowed). */
FA_TEST(decode_quant_int8_tiny_scales) {
    char *old = fa_test_env_set("FA_CPU_DECODE_INT_PV", "0"); /* each case sets it below */
    for (int integer = 0; integer < 2; integer++) {
        setenv("FA_CPU_DECODE_INT_PV", integer ? "1" : "0", 1);
        const qcase c = qbase(FA_KV_INT8, FA_DTYPE_F32, 1, 1, 8, 2, 64, 100);
        qproblem t;
        if (!FA_CHECK(qproblem_make(&t, &c, fa_test_seed() + 7), "out of memory")) {
            qproblem_free(&t);
            break;
        }
        t.seqlens[0] = (int32_t)c.cap;
        const int64_t n_out = c.hq * c.d;
        float *first = malloc(sizeof(float) * (size_t)n_out);
        int ok = FA_CHECK(first != NULL, "out of memory") && FA_CHECK(fa_kvcache_forward(&t.p) == FA_OK, "%s", fa_last_error());
        if (ok) memcpy(first, t.o, sizeof(float) * (size_t)n_out);
        for (int64_t i = 0; i < c.cap * c.hkv; i++) t.vs[i] = ldexpf(t.vs[i], -120);
        ok = ok && FA_CHECK(fa_kvcache_forward(&t.p) == FA_OK, "%s", fa_last_error());
        double worst = 0.0, top = 0.0;
        for (int64_t i = 0; ok && i < n_out; i++) {
            const double want = first[i], got = ldexp(((const float *)t.o)[i], 120);
            if (!(fabs(got - want) <= worst)) worst = isnan(got) ? INFINITY : fabs(got - want);
            if (fabs(want) > top) top = fabs(want);
        }
        FA_CHECK(ok && worst <= 1e-3 * top, "%s P·V: output with V scales times 2^-120, times 2^120, off by %.3g (largest %.3g)",
                 integer ? "integer" : "fp32", worst, top);
        free(first);
        qproblem_free(&t);
    }
    fa_test_env_restore("FA_CPU_DECODE_INT_PV", old);
}

FA_TEST(decode_integer_pv_rule) {
    FA_CHECK(fa_cpu_decode_integer_pv(1, 0x17, 0x01, 0) && fa_cpu_decode_integer_pv(1, 0x17, 0x08, 0) &&
                 fa_cpu_decode_integer_pv(1, 0x17, 0x18, 0),
             "Zen and Zen+ (256-bit operations as two halves): integer P·V");
    FA_CHECK(!fa_cpu_decode_integer_pv(1, 0x17, 0x31, 0) && !fa_cpu_decode_integer_pv(1, 0x17, 0x71, 0),
             "Zen 2: fp32 P·V");
    FA_CHECK(!fa_cpu_decode_integer_pv(1, 0x19, 0x01, 0) && !fa_cpu_decode_integer_pv(1, 0x19, 0x11, 0) &&
                 !fa_cpu_decode_integer_pv(1, 0x1a, 0x02, 0),
             "Zen 3, 4, 5 at the AVX2 level: fp32 P·V");
    FA_CHECK(!fa_cpu_decode_integer_pv(0, 6, 0x55, 0) && !fa_cpu_decode_integer_pv(0, 0x17, 0x01, 0),
             "other vendors: fp32 P·V");
    FA_CHECK(fa_cpu_decode_integer_pv(1, 0x19, 0x11, 1) && fa_cpu_decode_integer_pv(1, 0x1a, 0x02, 1) &&
                 !fa_cpu_decode_integer_pv(0, 6, 0x8f, 1) && !fa_cpu_decode_integer_pv(1, 0x17, 0x31, 1),
             "AVX512-VNNI kernels: integer P·V on AMD Zen 4 and later, fp32 on Intel");
    const fa_cpu_model_id a = fa_cpu_identify(), b = fa_cpu_identify();
    FA_CHECK(a.amd == b.amd && a.family == b.family && a.model == b.model && (a.amd == 0 || a.amd == 1) &&
                 a.family >= 0 && a.family <= 0x10e && a.model >= 0 && a.model <= 0xff,
             "fa_cpu_identify: the same identity on every call, fields in CPUID's ranges (%d, %#x, %#x)", a.amd,
             a.family, a.model);
#if defined(__x86_64__) || defined(_M_X64)
    FA_CHECK(a.family >= 5, "fa_cpu_identify: an x86-64 CPU reports family 5 or later (%#x)", a.family);
#endif
}

FA_TEST(decode_e4m3_conversion) {
    int bad = 0;
    for (int x = 0; x < 256; x++) {
        double want = e4m3_value((uint8_t)x);
        float got = fa_e4m3_to_f32((uint8_t)x);
        if (isnan(want) ? !isnan(got) : (double)got != want) bad++;
        if (!isnan(want) && fa_cpu_f32_to_e4m3((float)want) != (uint8_t)x && !(want == 0.0 && x == 0x80)) bad++;
    }
    FA_CHECK(bad == 0, "%d e4m3 codes do not round-trip", bad);
    FA_CHECK(fa_cpu_f32_to_e4m3(1000.0f) == 0x7e && fa_cpu_f32_to_e4m3(-1e30f) == 0xfe, "saturation to ±448");
    FA_CHECK((fa_cpu_f32_to_e4m3(NAN) & 0x7f) == 0x7f, "NaN keeps the NaN code");
    /* 1 + 1/16 lies halfway between 1 (code 0x38) and 1.125 (0x39): ties to the even code */
    FA_CHECK(fa_cpu_f32_to_e4m3(1.0625f) == 0x38 && fa_cpu_f32_to_e4m3(1.1875f) == 0x3a, "ties to even");
}

FA_TEST(decode_split_count) {
    FA_CHECK(fa_cpu_decode_split_count(8, 4096, 2, 0) == 1, "8 items fill 2 threads: no split");
    FA_CHECK(fa_cpu_decode_split_count(1, 16384, 2, 0) == 8, "1 item, 2 threads: 8 splits");
    FA_CHECK(fa_cpu_decode_split_count(1, 700, 2, 0) == 1, "splits keep >= 512 keys");
    FA_CHECK(fa_cpu_decode_split_count(1, 100000, 256, 0) == FA_KV_MAX_SPLITS, "capped");
    FA_CHECK(fa_cpu_decode_split_count(1, FA_CPU_DECODE_KEYS + 8, 2, 9) == 2, "requested, at most one per tile");
    FA_CHECK(fa_cpu_decode_split_count(5, 1 << 20, 1, 0) == 1, "one thread: no split");
    int monotone = 1;
    for (int64_t keys = 0; keys < 5000; keys += 37)
        for (int units = 1; units < 10; units++)
            monotone &= fa_cpu_decode_split_count(units, keys, 4, 0) <= fa_cpu_decode_split_count(units, keys + 37, 4, 0);
    FA_CHECK(monotone, "the count grows with the keys (the workspace bound uses the capacity)");
}

FA_TEST(decode_quant_errors) {
    qcase c = qbase(FA_KV_INT8, FA_DTYPE_F16, 2, 1, 8, 2, 64, 64);
    c.append = 1;
    qproblem t;
    if (!FA_CHECK(qproblem_make(&t, &c, 7), "out of memory")) return;
    const size_t o_bytes = (size_t)(2 * 8 * 64 * 2);
    struct {
        const char *what, *needle;
        fa_status status;
    } cases[] = {
        {"kv_dtype 9", "kv_dtype", FA_ERR_DTYPE},
        {"no k_scale", "k_scale", FA_ERR_NULL_POINTER},
        {"no v_scale", "v_scale", FA_ERR_NULL_POINTER},
        {"scale rows overlap", "k_scale", FA_ERR_STRIDE},
        {"head_dim 60", "multiples of 8", FA_ERR_HEAD_DIM},
        {"q8_0 with scales", "FA_KV_Q8_0", FA_ERR_INVALID_ARGUMENT},
        {"q8_0 strides too small", "k_", FA_ERR_STRIDE},
        {"fp8 scale 0", "k_scale[1]", FA_ERR_INVALID_ARGUMENT},
        {"rotary", "rotary", FA_ERR_UNSUPPORTED},
        {"scales without kv_dtype", "FA_KV_SAME", FA_ERR_INVALID_ARGUMENT},
    };
    uint16_t cos_sin[64 * 32] = {0};
    float zero_scale[2] = {1.0f, 0.0f};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fa_params p = t.p;
        switch (i) {
        case 0: p.kv_dtype = (fa_kv_dtype)9; break;
        case 1: p.k_scale = NULL; break;
        case 2: p.v_scale = NULL; break;
        case 3: p.k_scale_row_stride = 0; break;
        case 4: p.head_dim = 60; p.k_head_stride = p.v_head_stride = 60; p.k_row_stride = p.v_row_stride = 120;
                p.q_head_stride = p.o_head_stride = 60; p.q_row_stride = p.o_row_stride = 480;
                p.knew_head_stride = p.vnew_head_stride = 60; p.knew_row_stride = p.vnew_row_stride = 120; break;
        case 5: p.kv_dtype = FA_KV_Q8_0; break;
        case 6: p.kv_dtype = FA_KV_Q8_0; p.k_scale = p.v_scale = NULL; break; /* 64 bytes < 68 per row */
        case 7: p.kv_dtype = FA_KV_FP8_E4M3; p.k_scale = zero_scale; p.v_scale = t.vs; break;
        case 8: p.rotary_cos = p.rotary_sin = cos_sin; p.rotary_dim = 64; p.rotary_seqlen = 64; break;
        default: p.kv_dtype = FA_KV_SAME; break;
        }
        memset(t.o, 0x7e, o_bytes);
        fa_status st = fa_kvcache_forward(&p);
        const char *msg = fa_last_error();
        int untouched = 1;
        for (size_t e = 0; e < o_bytes; e++) untouched &= ((uint8_t *)t.o)[e] == 0x7e;
        FA_CHECK(st == cases[i].status && strstr(msg, cases[i].needle) != NULL && untouched,
                 "%s: status %s (want %s), message '%s', output %s", cases[i].what, fa_strerror(st),
                 fa_strerror(cases[i].status), msg, untouched ? "untouched" : "written");
    }
    qproblem_free(&t);
}

FA_TEST(decode_quant_forward_rejects) { /* fa_forward / fa_backward do not read quantised K/V */
    qcase c = qbase(FA_KV_INT8, FA_DTYPE_F16, 1, 1, 4, 2, 64, 32);
    qproblem t;
    if (!FA_CHECK(qproblem_make(&t, &c, 3), "out of memory")) return;
    fa_params p = t.p;
    p.cache_seqlens = NULL;
    fa_status st = fa_forward(&p);
    FA_CHECK(st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "kv_dtype") != NULL, "fa_forward: %s: %s",
             fa_strerror(st), fa_last_error());
    qproblem_free(&t);
}

/* ---- latent caches (DeepSeek-style MLA): v is the first dv columns of k -------------------------- */

/* One MLA decode call (one latent kv head, 576/512 dims, 2 speculative query tokens, causal,
 * an append of 2 tokens, optionally paged) twice: on one latent cache with v = k and v_new =
 * k_new, and on separate K and V caches holding the same values. Outputs, LSE and the caches
 * after the append must agree bitwise. */
static void latent_case(fa_dtype dtype, int64_t page_size, int threads) {
    enum { B = 2, HQ = 16, D = 576, DV = 512, SQ = 2, CAP = 48 };
    const int64_t e = dtype == FA_DTYPE_F32 ? 4 : 2;
    const int32_t seqlens[B] = {30, 17};
    const int64_t pages_per_seq = page_size ? (CAP + page_size - 1) / page_size : 0;
    const int64_t slabs = page_size ? B * pages_per_seq : B, slab_rows = page_size ? page_size : CAP;
    int32_t table[B * CAP]; /* page_size >= 1: at most CAP pages per sequence */
    for (int64_t i = 0; i < B * pages_per_seq; i++) table[i] = (int32_t)(B * pages_per_seq - 1 - i); /* reversed */
    const size_t cache_elems = (size_t)(slabs * slab_rows * D), vcache_elems = (size_t)(slabs * slab_rows * DV);
    uint8_t *latent = malloc(cache_elems * e), *kc = malloc(cache_elems * e), *vc = malloc(vcache_elems * e);
    uint8_t *q = malloc((size_t)B * SQ * HQ * D * e), *knew = malloc((size_t)B * SQ * D * e);
    uint8_t *vnew = malloc((size_t)B * SQ * DV * e);
    uint8_t *o[2] = {malloc((size_t)B * SQ * HQ * DV * e), malloc((size_t)B * SQ * HQ * DV * e)};
    float *lse[2] = {malloc(sizeof(float) * B * HQ * SQ), malloc(sizeof(float) * B * HQ * SQ)};
    fa_test_rng rng;
    fa_test_rng_seed(&rng, fa_test_seed());
    for (size_t i = 0; i < cache_elems; i++) fa_test_store(latent, dtype, (int64_t)i, fa_test_rng_normal(&rng));
    for (size_t i = 0; i < (size_t)B * SQ * HQ * D; i++) fa_test_store(q, dtype, (int64_t)i, fa_test_rng_normal(&rng));
    for (size_t i = 0; i < (size_t)B * SQ * D; i++) fa_test_store(knew, dtype, (int64_t)i, fa_test_rng_normal(&rng));
    memcpy(kc, latent, cache_elems * e);
    for (size_t r = 0; r < (size_t)(slabs * slab_rows); r++) memcpy(vc + r * DV * e, latent + r * D * e, DV * e);
    for (size_t r = 0; r < (size_t)B * SQ; r++) memcpy(vnew + r * DV * e, knew + r * D * e, DV * e);
    for (int run = 0; run < 2; run++) { /* 0: latent, 1: separate caches */
        fa_params p;
        memset(&p, 0, sizeof p);
        p.device = FA_DEVICE_CPU;
        p.dtype = dtype;
        p.batch = B, p.seqlen_q = SQ, p.seqlen_k = page_size ? pages_per_seq * page_size : CAP;
        p.heads_q = HQ, p.heads_kv = 1, p.head_dim = D, p.head_dim_v = DV;
        p.q = q, p.o = o[run], p.lse = lse[run];
        p.q_batch_stride = SQ * HQ * D, p.q_row_stride = HQ * D, p.q_head_stride = D;
        p.o_batch_stride = SQ * HQ * DV, p.o_row_stride = HQ * DV, p.o_head_stride = DV;
        p.k = run ? kc : latent, p.v = run ? vc : latent;
        p.k_batch_stride = slab_rows * D, p.k_row_stride = D, p.k_head_stride = D;
        p.v_batch_stride = run ? slab_rows * DV : slab_rows * D, p.v_row_stride = run ? DV : D;
        p.v_head_stride = run ? DV : D;
        p.k_new = knew, p.v_new = run ? vnew : knew;
        p.knew_batch_stride = SQ * D, p.knew_row_stride = D, p.knew_head_stride = D;
        p.vnew_batch_stride = run ? SQ * DV : SQ * D, p.vnew_row_stride = run ? DV : D, p.vnew_head_stride = run ? DV : D;
        p.cache_seqlens = seqlens;
        if (page_size) {
            p.block_table = table, p.block_table_batch_stride = pages_per_seq, p.page_size = page_size;
            p.num_pages = slabs;
        }
        p.causal = 1;
        p.num_threads = threads;
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "latent %s page %lld run %d: %s", fa_test_dtype_name(dtype),
                 (long long)page_size, run, fa_last_error());
        if (run == 1) continue;
        /* a latent cache with a separate v_new, or with rotary: rejected, nothing written */
        uint16_t cos_sin[CAP * 32] = {0};
        for (int bad = 0; bad < 2; bad++) {
            fa_params pb = p;
            if (bad == 0) {
                pb.v_new = vnew, pb.vnew_batch_stride = SQ * DV, pb.vnew_row_stride = DV, pb.vnew_head_stride = DV;
            } else {
                pb.rotary_cos = pb.rotary_sin = cos_sin, pb.rotary_dim = 64, pb.rotary_seqlen = pb.seqlen_k;
            }
            uint8_t *o_bad = malloc((size_t)B * SQ * HQ * DV * e);
            memset(o_bad, 0x7e, (size_t)B * SQ * HQ * DV * e);
            pb.o = o_bad, pb.lse = NULL;
            const fa_status st = fa_kvcache_forward(&pb);
            int untouched = 1;
            for (size_t i = 0; i < (size_t)B * SQ * HQ * DV * e; i++) untouched &= o_bad[i] == 0x7e;
            FA_CHECK(st == (bad ? FA_ERR_UNSUPPORTED : FA_ERR_OVERLAP) &&
                         strstr(fa_last_error(), bad ? "rotary_cos" : "v_new") != NULL && untouched,
                     "latent cache, %s: %s '%s', output %s", bad ? "rotary" : "separate v_new", fa_strerror(st),
                     fa_last_error(), untouched ? "untouched" : "written");
            free(o_bad);
        }
    }
    int same_o = memcmp(o[0], o[1], (size_t)B * SQ * HQ * DV * e) == 0;
    int same_lse = memcmp(lse[0], lse[1], sizeof(float) * B * HQ * SQ) == 0;
    int same_k = memcmp(latent, kc, cache_elems * e) == 0, same_v = 1;
    for (size_t r = 0; r < (size_t)(slabs * slab_rows); r++) same_v &= memcmp(vc + r * DV * e, latent + r * D * e, DV * e) == 0;
    FA_CHECK(same_o && same_lse && same_k && same_v,
             "latent cache (%s, page %lld, %d threads) vs separate caches: o %s, lse %s, k %s, v %s",
             fa_test_dtype_name(dtype), (long long)page_size, threads, same_o ? "same" : "differs",
             same_lse ? "same" : "differs", same_k ? "same" : "differs", same_v ? "same" : "differs");
    free(latent), free(kc), free(vc), free(q), free(knew), free(vnew), free(o[0]), free(o[1]), free(lse[0]), free(lse[1]);
}

FA_TEST(decode_latent_cache) {
    static const fa_dtype dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        latent_case(dtypes[t], 0, 2);
        latent_case(dtypes[t], 16, 1);
        latent_case(dtypes[t], 5, 2);
    }
}

/* A bf16 cache's scores by bf16 dot products (the AVX512-VNNI kernel set on CPUs with
 * AVX512-BF16) against the fp32 kernels (FA_CPU_BF16DOT=0) on the same problem: both form the same
 * exact products of the bf16 values and differ only in the order of the fp32 sums and where the
 * score scale is applied, so the LSE agrees to fp32 rounding and o to one bf16 rounding step. Head
 * dims with 0, 8, 16 and 24 values past the last 32; 1, 3, 4, 8 and 11 rows per kv head (blocks of
 * 8, 4 and the rest); an odd key count. Elsewhere both runs take the fp32 kernels and agree
 * exactly. */
FA_TEST(decode_bf16_dot_scores) {
    static const int64_t dims[] = {64, 72, 80, 88, 128};
    static const int64_t heads[][2] = {{8, 8}, {12, 4}, {16, 4}, {32, 4}, {22, 2}};
    const int64_t B = 2, CAP = 101;
    if (!fa_cpu_select_kernels()->gemm_bf16) fa_test_note("no bf16 dot products on this CPU: both runs use fp32");
    char *old = fa_test_env_set("FA_CPU_BF16DOT", "1"); /* each run sets it below */
    fa_test_rng rng;
    fa_test_rng_seed(&rng, fa_test_seed());
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
            const int64_t d = dims[di], hq = heads[hi][0], hkv = heads[hi][1];
            const size_t n_q = (size_t)(B * hq * d), n_kv = (size_t)(B * CAP * hkv * d);
            uint16_t *q = malloc(2 * n_q), *k = malloc(2 * n_kv), *v = malloc(2 * n_kv);
            uint16_t *o[2] = {malloc(2 * n_q), malloc(2 * n_q)};
            float *lse[2] = {malloc(sizeof(float) * (size_t)(B * hq)), malloc(sizeof(float) * (size_t)(B * hq))};
            int32_t lens[2] = {(int32_t)CAP, (int32_t)(CAP - 6)};
            if (!FA_CHECK(q && k && v && o[0] && o[1] && lse[0] && lse[1], "out of memory")) {
                free(q), free(k), free(v), free(o[0]), free(o[1]), free(lse[0]), free(lse[1]);
                continue;
            }
            for (size_t i = 0; i < n_q; i++) fa_test_store(q, FA_DTYPE_BF16, (int64_t)i, 2.0 * fa_test_rng_normal(&rng));
            for (size_t i = 0; i < n_kv; i++) {
                fa_test_store(k, FA_DTYPE_BF16, (int64_t)i, fa_test_rng_normal(&rng));
                fa_test_store(v, FA_DTYPE_BF16, (int64_t)i, fa_test_rng_normal(&rng));
            }
            for (int run = 0; run < 2; run++) {
                setenv("FA_CPU_BF16DOT", run ? "0" : "1", 1);
                fa_params p;
                memset(&p, 0, sizeof p);
                p.device = FA_DEVICE_CPU;
                p.dtype = FA_DTYPE_BF16;
                p.batch = B, p.seqlen_q = 1, p.seqlen_k = CAP;
                p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
                p.q = q, p.k = k, p.v = v, p.o = o[run], p.lse = lse[run];
                fa_set_contiguous_strides(&p);
                p.cache_seqlens = lens;
                p.causal = 1;
                FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "d %lld, %lld/%lld heads: %s", (long long)d, (long long)hq,
                         (long long)hkv, fa_last_error());
            }
            double lse_err = 0.0, o_err = 0.0;
            for (int64_t i = 0; i < B * hq; i++) {
                const double e = fabs((double)lse[0][i] - lse[1][i]) / (1.0 + fabs((double)lse[1][i]));
                if (!(e <= lse_err)) lse_err = e; /* NaN kept */
            }
            for (size_t i = 0; i < n_q; i++) {
                const double a = fa_test_load(o[0], FA_DTYPE_BF16, (int64_t)i), b = fa_test_load(o[1], FA_DTYPE_BF16, (int64_t)i);
                const double e = fabs(a - b) / (fabs(b) + 1e-30);
                if (!(e <= o_err)) o_err = e;
            }
            FA_CHECK(lse_err <= 1e-5, "d %lld, %lld/%lld heads: LSE differs by %.3g (relative)", (long long)d,
                     (long long)hq, (long long)hkv, lse_err);
            FA_CHECK(o_err <= 0x1p-7, "d %lld, %lld/%lld heads: o differs by %.3g (relative; one bf16 step 7.8e-3)",
                     (long long)d, (long long)hq, (long long)hkv, o_err);
            free(q), free(k), free(v), free(o[0]), free(o[1]), free(lse[0]), free(lse[1]);
        }
    fa_test_env_restore("FA_CPU_BF16DOT", old);
}
