/*
 * bench/ggml_decode.c: CPU decode attention, flashattn (fa_kvcache_forward) and ggml
 * (ggml_flash_attn_ext on the CPU backend) side by side in one process, on the same cache bytes.
 *
 * One query token per sequence, heads_q / heads_kv query / kv heads, head dim d, a full cache of
 * ctx keys per sequence, scale 1/sqrt(d), no mask. --layout token (default): the cache is
 * [batch, ctx, heads_kv, d] as llama.cpp stores it, ggml reading it through a view [d, ctx, heads_kv,
 * batch] (the view llama.cpp builds, one stream per sequence); --layout head: [batch, heads_kv, ctx,
 * d], contiguous for ggml (as test-backend-ops builds it). flashattn reads either through strides.
 *
 *   --cache f16   both read the same f16 bytes
 *   --cache q8_0  both read the same Q8_0 bytes (llama.cpp block_q8_0; FA_KV_Q8_0)
 *   --cache int8  flashattn reads int8 with one fp32 scale per (token, head) (FA_KV_INT8),
 *                 ggml its 8-bit cache type Q8_0 (ggml has no per-token int8 type)
 *
 * Timing: rounds of [a memcpy of 512 MiB split among the threads, `repeats` calls of each library,
 * the order alternating by round]; medians over all calls; the ratio is the median of per-round
 * ratios. GB/s = K+V bytes a call must read (scales included) / time; copy GB/s = (read +
 * written) / time. Both libraries get the same number of threads.
 *
 * Check: outputs of both against a float64 attention over each library's own (dequantised) cache,
 * on a few (sequence, head) pairs, and, when both read the same bytes, the largest difference
 * between the two outputs over every element. Prints one JSON object.
 *
 * Built by bench/bench_ggml_decode.sh against a ggml checkout; not part of the library's build.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "../tools/timing.h"

#define COPY_BYTES ((size_t)512 << 20)

/* ---- inputs ------------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform01(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((double)(rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float normal(float mean) {
    return mean + (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}

/* A cache row (one token, one kv head, d values) in each format. */
static void fill_row(float *x, int64_t d, float mean) {
    for (int64_t i = 0; i < d; i++) x[i] = normal(mean);
}

static void quantize_int8_row(const float *x, int64_t d, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int64_t i = 0; i < d; i++) amax = fmaxf(amax, fabsf(x[i]));
    *scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (int64_t i = 0; i < d; i++) q[i] = (int8_t)lrintf(x[i] / *scale);
}

/* ---- float64 reference over one (sequence, head) ----------------------------------------------- */

/* k_row / v_row: dequantised rows of the cache as fp32; out: d doubles. */
typedef void (*row_reader)(const void *ctx, int64_t b, int64_t t, int64_t h, int is_v, float *row);

static void reference(const void *ctx, row_reader read, const float *q, int64_t b, int64_t h_kv, int64_t ctx_len,
                      int64_t d, double scale, double *out) {
    float row[512];
    double *s = malloc((size_t)ctx_len * sizeof(double)), m = -INFINITY, sum = 0.0;
    for (int64_t t = 0; t < ctx_len; t++) {
        read(ctx, b, t, h_kv, 0, row);
        double acc = 0.0;
        for (int64_t i = 0; i < d; i++) acc += (double)q[i] * (double)row[i];
        s[t] = acc * scale;
        if (s[t] > m) m = s[t];
    }
    for (int64_t i = 0; i < d; i++) out[i] = 0.0;
    for (int64_t t = 0; t < ctx_len; t++) {
        double p = exp(s[t] - m);
        sum += p;
        read(ctx, b, t, h_kv, 1, row);
        for (int64_t i = 0; i < d; i++) out[i] += p * (double)row[i];
    }
    for (int64_t i = 0; i < d; i++) out[i] /= sum;
    free(s);
}

typedef struct cache_view {
    const char *k, *v;          /* [batch, ctx, hkv, row bytes] */
    const float *ks, *vs;       /* int8 scales [batch, ctx, hkv], else NULL */
    enum ggml_type type;        /* f16 or q8_0 when ks is NULL */
    int64_t ctx, hkv, d, row_bytes;
    int head_major;             /* [batch, hkv, ctx, row] instead of [batch, ctx, hkv, row] */
} cache_view;

static void read_row(const void *arg, int64_t b, int64_t t, int64_t h, int is_v, float *row) {
    const cache_view *c = arg;
    int64_t index = c->head_major ? (b * c->hkv + h) * c->ctx + t : (b * c->ctx + t) * c->hkv + h;
    const char *src = (is_v ? c->v : c->k) + index * c->row_bytes;
    if (c->ks) {
        float scale = (is_v ? c->vs : c->ks)[index];
        for (int64_t i = 0; i < c->d; i++) row[i] = scale * (float)((const int8_t *)src)[i];
    } else {
        ggml_get_type_traits(c->type)->to_float(src, row, c->d);
    }
}

/* ---- main -------------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: ggml_decode --cache f16|q8_0|int8 [--batch 1] [--ctx 16384] [--hq 32] [--hkv 8] [-d 128]\n"
                    "                   [--layout token|head] [--threads 2] [--rounds 5] [--repeats 5]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *cache = NULL, *layout = "token";
    int64_t batch = 1, ctx_len = 16384, hq = 32, hkv = 8, d = 128;
    int threads = 2, rounds = 5, repeats = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (!strcmp(a, "--cache")) cache = v;
        else if (!strcmp(a, "--batch")) batch = atoll(v);
        else if (!strcmp(a, "--ctx")) ctx_len = atoll(v);
        else if (!strcmp(a, "--hq")) hq = atoll(v);
        else if (!strcmp(a, "--hkv")) hkv = atoll(v);
        else if (!strcmp(a, "-d")) d = atoll(v);
        else if (!strcmp(a, "--layout")) layout = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--rounds")) rounds = atoi(v);
        else if (!strcmp(a, "--repeats")) repeats = atoi(v);
        else usage();
        i++;
    }
    if (!cache || (strcmp(cache, "f16") && strcmp(cache, "q8_0") && strcmp(cache, "int8")) ||
        (strcmp(layout, "token") && strcmp(layout, "head")) || batch < 1 ||
        ctx_len < 1 || hkv < 1 || hq % hkv || d % 32 || d > 512 || threads < 1 || threads > 64 || rounds < 1 ||
        repeats < 1)
        usage();
    const int shared_bytes = strcmp(cache, "int8") != 0; /* both libraries read one buffer */
    const enum ggml_type type = !strcmp(cache, "f16") ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
    const int64_t rows = batch * ctx_len * hkv;
    const int64_t row_bytes = (int64_t)ggml_row_size(type, d);
    const float scale = 1.0f / sqrtf((float)d);

    /* ggml: q [d, 1, hq, batch] f32; the cache [d, hkv, ctx, batch] seen as [d, ctx, hkv, batch] */
    struct ggml_init_params ip = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true};
    struct ggml_context *gctx = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_4d(gctx, GGML_TYPE_F32, d, 1, hq, batch);
    const int head_major = !strcmp(layout, "head");
    struct ggml_tensor *kc, *vc, *k, *v;
    if (head_major) { /* [d, ctx, hkv, batch] contiguous, as test-backend-ops builds it */
        k = kc = ggml_new_tensor_4d(gctx, type, d, ctx_len, hkv, batch);
        v = vc = ggml_new_tensor_4d(gctx, type, d, ctx_len, hkv, batch);
    } else {
        kc = ggml_new_tensor_4d(gctx, type, d, hkv, ctx_len, batch);
        vc = ggml_new_tensor_4d(gctx, type, d, hkv, ctx_len, batch);
        k = ggml_view_4d(gctx, kc, d, ctx_len, hkv, batch, kc->nb[2], kc->nb[1], kc->nb[3], 0);
        v = ggml_view_4d(gctx, vc, d, ctx_len, hkv, batch, vc->nb[2], vc->nb[1], vc->nb[3], 0);
    }
    struct ggml_tensor *out = ggml_flash_attn_ext(gctx, q, k, v, NULL, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32); /* as llama.cpp sets it */
    struct ggml_cgraph *graph = ggml_new_graph(gctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) return fprintf(stderr, "ggml_backend_cpu_init failed\n"), 1;
    ggml_backend_cpu_set_n_threads(backend, threads);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(gctx, backend);
    if (!buffer) return fprintf(stderr, "ggml: out of memory\n"), 1;

    /* flashattn: q / o f16 [batch, 1, hq, d]; its cache is ggml's bytes, or an int8 copy */
    const size_t q_elems = (size_t)(batch * hq * d);
    ggml_fp16_t *q16 = malloc(q_elems * sizeof *q16), *o16 = calloc(q_elems, sizeof *o16);
    int8_t *k8 = NULL, *v8 = NULL;
    float *ks = NULL, *vs = NULL;
    if (!shared_bytes) {
        k8 = malloc((size_t)(rows * d));
        v8 = malloc((size_t)(rows * d));
        ks = malloc((size_t)rows * sizeof(float));
        vs = malloc((size_t)rows * sizeof(float));
    }
    char *copy_src = malloc(COPY_BYTES), *copy_dst = malloc(COPY_BYTES);
    if (!q16 || !o16 || !copy_src || !copy_dst || (!shared_bytes && (!k8 || !v8 || !ks || !vs)))
        return fprintf(stderr, "out of memory\n"), 1;
    memset(copy_src, 1, COPY_BYTES);
    memset(copy_dst, 2, COPY_BYTES);

    /* inputs: q rounded to f16 (ggml gets the same values in f32), k ~ N(0, 1), v ~ N(0.5, 1) */
    float *qf = (float *)q->data, row[512];
    for (size_t i = 0; i < q_elems; i++) {
        q16[i] = ggml_fp32_to_fp16(normal(0.0f));
        qf[i] = ggml_fp16_to_fp32(q16[i]);
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int is_v = 0; is_v < 2; is_v++) {
            fill_row(row, d, is_v ? 0.5f : 0.0f);
            char *dst = (char *)(is_v ? vc : kc)->data + r * row_bytes;
            if (type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(row, (ggml_fp16_t *)dst, d);
            else ggml_quantize_chunk(GGML_TYPE_Q8_0, row, dst, 0, 1, d, NULL);
            if (!shared_bytes) quantize_int8_row(row, d, (is_v ? v8 : k8) + r * d, (is_v ? vs : ks) + r);
        }
    }

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CPU;
    p.dtype = FA_DTYPE_F16;
    p.batch = batch;
    p.seqlen_q = 1;
    p.seqlen_k = ctx_len;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    fa_set_contiguous_strides(&p);
    p.kv_dtype = !strcmp(cache, "f16") ? FA_KV_SAME : !strcmp(cache, "q8_0") ? FA_KV_Q8_0 : FA_KV_INT8;
    const int64_t units = p.kv_dtype == FA_KV_Q8_0 ? row_bytes : d; /* elements (f16) or bytes */
    p.k_batch_stride = p.v_batch_stride = ctx_len * hkv * units;
    p.k_row_stride = p.v_row_stride = head_major ? units : hkv * units;
    p.k_head_stride = p.v_head_stride = head_major ? ctx_len * units : units;
    if (p.kv_dtype == FA_KV_INT8) {
        p.k_scale = ks;
        p.v_scale = vs;
        p.k_scale_batch_stride = p.v_scale_batch_stride = ctx_len * hkv;
        p.k_scale_row_stride = p.v_scale_row_stride = head_major ? 1 : hkv;
        p.k_scale_head_stride = p.v_scale_head_stride = head_major ? ctx_len : 1;
    }
    p.softmax_scale = scale;
    p.num_threads = threads;
    p.q = q16;
    p.o = o16;
    p.k = shared_bytes ? kc->data : (const void *)k8;
    p.v = shared_bytes ? vc->data : (const void *)v8;

    const double ours_bytes = (double)rows * 2.0 * (p.kv_dtype == FA_KV_INT8 ? (double)d + 4.0 : (double)row_bytes);
    const double ggml_bytes = (double)rows * 2.0 * (double)row_bytes;

    /* warm up both, then check */
    if (fa_kvcache_forward(&p) != FA_OK) return fprintf(stderr, "flashattn: %s\n", fa_last_error()), 1;
    if (ggml_backend_graph_compute(backend, graph) != GGML_STATUS_SUCCESS) return fprintf(stderr, "ggml: compute failed\n"), 1;
    const float *og = (const float *)out->data; /* [d, hq, 1, batch]: same order as o16 */
    double diff = 0.0, err_ours = 0.0, err_ggml = 0.0;
    if (shared_bytes)
        for (size_t i = 0; i < q_elems; i++) diff = fmax(diff, fabs((double)ggml_fp16_to_fp32(o16[i]) - (double)og[i]));
    cache_view ggml_cache = {kc->data, vc->data, NULL, NULL, type, ctx_len, hkv, d, row_bytes, head_major};
    cache_view ours_cache = ggml_cache;
    if (!shared_bytes)
        ours_cache = (cache_view){(const char *)k8, (const char *)v8, ks, vs, type, ctx_len, hkv, d, d, head_major};
    const int64_t heads_checked[3] = {0, hq / 2 + 1, hq - 1};
    double ref[512];
    for (int64_t b = 0; b < batch; b += batch > 1 ? batch - 1 : 1) {
        for (int j = 0; j < 3; j++) {
            int64_t h = heads_checked[j];
            size_t at = (size_t)((b * hq + h) * d);
            for (int pass = 0; pass < 2; pass++) {
                reference(pass ? &ggml_cache : &ours_cache, read_row, qf + at, b, h / (hq / hkv), ctx_len, d, scale, ref);
                for (int64_t i = 0; i < d; i++) {
                    double got = pass ? (double)og[at + i] : (double)ggml_fp16_to_fp32(o16[at + i]);
                    double *err = pass ? &err_ggml : &err_ours;
                    *err = fmax(*err, fabs(got - ref[i]));
                }
            }
        }
    }

    /* timing */
    const int calls = rounds * repeats;
    double *t_ours = malloc((size_t)calls * sizeof(double)), *t_ggml = malloc((size_t)calls * sizeof(double));
    double *ratio = malloc((size_t)rounds * sizeof(double)), *copies = malloc((size_t)rounds * sizeof(double));
    double *round_ours = malloc((size_t)repeats * sizeof(double)), *round_ggml = malloc((size_t)repeats * sizeof(double));
    for (int r = 0; r < rounds; r++) {
        copies[r] = 2.0 * (double)COPY_BYTES / bench_copy_seconds(copy_dst, copy_src, COPY_BYTES, threads) / 1e9;
        for (int side = 0; side < 2; side++) {
            int ours_now = (side == 0) == (r % 2 == 0);
            for (int i = 0; i < repeats; i++) {
                double t0 = bench_now_seconds();
                if (ours_now) {
                    if (fa_kvcache_forward(&p) != FA_OK) return fprintf(stderr, "flashattn: %s\n", fa_last_error()), 1;
                } else if (ggml_backend_graph_compute(backend, graph) != GGML_STATUS_SUCCESS) {
                    return fprintf(stderr, "ggml: compute failed\n"), 1;
                }
                double dt = bench_now_seconds() - t0;
                (ours_now ? t_ours : t_ggml)[r * repeats + i] = dt;
                (ours_now ? round_ours : round_ggml)[i] = dt;
            }
        }
        ratio[r] = bench_median(round_ggml, repeats) / bench_median(round_ours, repeats);
    }
    double ms_ours = 1e3 * bench_median(t_ours, calls), ms_ggml = 1e3 * bench_median(t_ggml, calls);
    double copy = bench_median(copies, rounds);
    char diff_text[32] = "null"; /* the int8 cache differs from ggml's Q8_0: no element-wise diff */
    if (shared_bytes) snprintf(diff_text, sizeof diff_text, "%.3g", diff);
    printf("{\"layout\":\"%s\",\"batch\":%lld,\"ctx\":%lld,\"hq\":%lld,\"hkv\":%lld,\"d\":%lld,\"threads\":%d,\"cache\":\"%s\","
           "\"ggml_type\":\"%s\",\"ours_ms\":%.6g,\"ggml_ms\":%.6g,\"ours_bytes\":%.0f,\"ggml_bytes\":%.0f,"
           "\"ours_GBps\":%.6g,\"ggml_GBps\":%.6g,\"copy_GBps\":%.6g,\"speedup\":%.6g,"
           "\"err_ours\":%.3g,\"err_ggml\":%.3g,\"max_diff\":%s,\"isa\":\"%s\"}\n",
           layout, (long long)batch, (long long)ctx_len, (long long)hq, (long long)hkv, (long long)d, threads, cache,
           ggml_type_name(type), ms_ours, ms_ggml, ours_bytes, ggml_bytes, ours_bytes / ms_ours / 1e6,
           ggml_bytes / ms_ggml / 1e6, copy, bench_median(ratio, rounds), err_ours, err_ggml, diff_text, fa_cpu_isa());
    ggml_backend_buffer_free(buffer);
    ggml_backend_free(backend);
    ggml_free(gctx);
    return 0;
}
