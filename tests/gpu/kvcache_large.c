/*
 * kvcache_large.c: the CUDA KV-cache path at head dims above 256 (the large-head decode kernel,
 * src/cuda/kernels/kvcache_large_sm80.cuh; on sm_90 at dv = 512 its wgmma variant, which
 * FA_CUDA_KVCACHE=portable turns off) against the CPU engine and the float64 oracle.
 *   kvlarge [small]  random problems: DeepSeek-style MLA first (one latent kv head, d 576, dv 512,
 *                    v the first 512 columns of k and v_new those of k_new, 16..128 query heads,
 *                    1..4 new tokens appended, causal, contiguous or paged caches with pages of
 *                    64, 16, 1, 3, 256 tokens, splits forced on and off), then other shapes with
 *                    separate K and V caches (320 / 320, 512 / 512, 288 / 256, 128 / 320,
 *                    576 / 512, GQA and MQA, rotary, windows, softcap, ALiBi, sinks, left
 *                    padding, cache_batch_idx). Each problem runs on the CPU and on CUDA with the
 *                    same inputs: the CUDA output by the oracle's rule (fa_kv_verify: o and lse
 *                    poisoned first, every element written, the appended slots, nothing else of
 *                    the caches changed), the caches after the two calls equal (bitwise; one unit
 *                    in the last place where rotary rounds), and o of the two within twice the
 *                    oracle's tolerance. Then bad shapes (dv > 512, d > 576, d not a
 *                    multiple of 8, v == k with dv > d, a score bias), each rejected on CUDA with
 *                    its status and a message naming the field, nothing written.
 * The oracle's problems have separate K and V caches; a latent problem makes V equal to K's first
 * dv columns (and v_new to k_new's) before either call, runs both engines with v = k (v_new =
 * k_new) and k's strides, then mirrors K's first dv columns into V so that fa_kv_verify checks the
 * single cache. `small` runs a few small problems (for compute-sanitizer). Fresh seeds every run
 * unless FA_TEST_SEED is set; a failure prints the seed.
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

#define EXPECT(cond, ...) GPU_EXPECT(failures, "kvlarge", cond, __VA_ARGS__)

/* ---- latent caches on top of the oracle's separate K and V ------------------------------------ */

/* Rows (slab, row, kv head) of the caches and of k_new / v_new. */
static void cache_extent(const fa_kv_problem *kp, int64_t *slabs, int64_t *rows) {
    *slabs = kp->cache_rows;
    *rows = kp->spec.page_size > 0 ? kp->spec.page_size : kp->spec.capacity;
}

/* dst[.., :dv] = src[.., :dv] for every (n0, n1, n2) row, in the buffers given. */
static void copy_columns(void *dst, int64_t d0, int64_t d1, int64_t d2, const void *src, int64_t s0, int64_t s1,
                         int64_t s2, int64_t n0, int64_t n1, int64_t n2, int64_t dv, size_t es) {
    for (int64_t i = 0; i < n0; i++)
        for (int64_t j = 0; j < n1; j++)
            for (int64_t h = 0; h < n2; h++)
                memcpy((char *)dst + (size_t)(i * d0 + j * d1 + h * d2) * es,
                       (const char *)src + (size_t)(i * s0 + j * s1 + h * s2) * es, (size_t)dv * es);
}

/* V := K's first dv columns (the caches as they are now, `saved` too when with_saved), v_new :=
 * k_new's (host and saved). */
static void mirror_k_into_v(fa_kv_problem *kp, int with_saved) {
    const fa_params *p = &kp->params;
    const size_t es = fa_test_dtype_size(kp->spec.dtype);
    int64_t slabs, rows;
    cache_extent(kp, &slabs, &rows);
    fa_test_buffer *kc = &kp->buffer[FA_KV_KCACHE], *vc = &kp->buffer[FA_KV_VCACHE];
    copy_columns(vc->host, p->v_batch_stride, p->v_row_stride, p->v_head_stride, kc->host, p->k_batch_stride,
                 p->k_row_stride, p->k_head_stride, slabs, rows, kp->spec.heads_kv, kp->spec.head_dim_v, es);
    if (!with_saved) return;
    copy_columns(vc->saved, p->v_batch_stride, p->v_row_stride, p->v_head_stride, kc->saved, p->k_batch_stride,
                 p->k_row_stride, p->k_head_stride, slabs, rows, kp->spec.heads_kv, kp->spec.head_dim_v, es);
    if (!kp->spec.append) return;
    fa_test_buffer *kn = &kp->buffer[FA_KV_KNEW], *vn = &kp->buffer[FA_KV_VNEW];
    for (int saved = 0; saved < 2; saved++)
        copy_columns(saved ? vn->saved : vn->host, p->vnew_batch_stride, p->vnew_row_stride, p->vnew_head_stride,
                     saved ? kn->saved : kn->host, p->knew_batch_stride, p->knew_row_stride, p->knew_head_stride,
                     kp->spec.batch, kp->spec.seqlen_new, kp->spec.heads_kv, kp->spec.head_dim_v, es);
}

/* The call's parameters on a latent cache: v is k (pointer and strides), v_new is k_new. */
static void make_latent(fa_params *p) {
    p->v = p->k;
    p->v_batch_stride = p->k_batch_stride;
    p->v_row_stride = p->k_row_stride;
    p->v_head_stride = p->k_head_stride;
    if (p->k_new == NULL) return;
    p->v_new = p->k_new;
    p->vnew_batch_stride = p->knew_batch_stride;
    p->vnew_row_stride = p->knew_row_stride;
    p->vnew_head_stride = p->knew_head_stride;
}

/* ---- one problem ------------------------------------------------------------------------------ */

typedef struct large_case {
    fa_kv_spec spec;
    int latent;
} large_case;

/* Elements of the caches that differ between the two runs: bitwise, or (rotary) by more than one
 * unit in the last place of k. */
static int64_t cache_differences(const fa_kv_problem *a, const fa_kv_problem *b, int rotary) {
    int64_t bad = 0;
    const int bufs[2] = {FA_KV_KCACHE, FA_KV_VCACHE};
    const fa_dtype dtype = a->spec.dtype;
    const size_t es = fa_test_dtype_size(dtype);
    for (int i = 0; i < 2; i++) {
        const fa_test_buffer *x = &a->buffer[bufs[i]], *y = &b->buffer[bufs[i]];
        for (size_t e = 0; e < x->bytes / es; e++) {
            if (!memcmp((const char *)x->host + e * es, (const char *)y->host + e * es, es)) continue;
            const double u = fa_test_load(x->host, dtype, (int64_t)e), w = fa_test_load(y->host, dtype, (int64_t)e);
            const double ulp = ldexp(1.0, (int)floor(log2(fmax(fabs(u), 1e-30))) - (dtype == FA_DTYPE_BF16 ? 7 : 10));
            if (!rotary || bufs[i] == FA_KV_VCACHE || !(fabs(u - w) <= ulp)) bad++;
        }
    }
    return bad;
}

/* Largest |o_a - o_b| over the logical elements of o (inf when only one is finite). */
static double o_difference(const fa_kv_problem *a, const fa_kv_problem *b) {
    const fa_params *p = &a->params;
    const fa_kv_spec *s = &a->spec;
    double worst = 0.0;
    for (int64_t i = 0; i < s->batch; i++)
        for (int64_t t = 0; t < s->seqlen_q; t++)
            for (int64_t h = 0; h < s->heads_q; h++)
                for (int64_t c = 0; c < s->head_dim_v; c++) {
                    const int64_t at = i * p->o_batch_stride + t * p->o_row_stride + h * p->o_head_stride + c;
                    const double x = fa_test_load(a->buffer[FA_KV_O].host, s->dtype, at),
                                 y = fa_test_load(b->buffer[FA_KV_O].host, s->dtype, at);
                    if (isnan(x) && isnan(y)) continue;
                    const double diff = fabs(x - y);
                    if (!(diff <= worst)) worst = isnan(diff) ? INFINITY : diff;
                }
    return worst;
}

/* One problem on the CPU and on CUDA with the same inputs (latent or separate caches). */
static void run_case(const large_case *lc) {
    fa_kv_problem cpu, gpu;
    char label[480];
    fa_kv_describe(&lc->spec, label, sizeof label - 40);
    if (lc->latent) strcat(label, " latent");
    if (fa_kv_problem_create(&cpu, &lc->spec)) {
        EXPECT(0, "%s: could not create the problem", label);
        return;
    }
    if (fa_kv_problem_create(&gpu, &lc->spec)) {
        fa_kv_problem_destroy(&cpu);
        EXPECT(0, "%s: could not create the problem", label);
        return;
    }
    if (lc->latent) {
        mirror_k_into_v(&cpu, 1);
        mirror_k_into_v(&gpu, 1);
    }
    fa_params pc = cpu.params;
    if (lc->latent) make_latent(&pc);
    const fa_status s_cpu = fa_kvcache_forward(&pc);
    EXPECT(s_cpu == FA_OK, "%s: CPU: %s", label, fa_last_error());
    if (gpu_buffers_upload(gpu.buffer, FA_KV_BUFFER_COUNT)) {
        EXPECT(0, "%s: upload failed", label);
    } else {
        fa_params p = fa_kv_problem_device_params(&gpu);
        p.device = FA_DEVICE_CUDA;
        if (lc->latent) make_latent(&p);
        const fa_status s = fa_kvcache_forward(&p);
        if (gpu_buffers_download(gpu.buffer, FA_KV_BUFFER_COUNT)) EXPECT(0, "%s: CUDA error after the call", label);
        EXPECT(s == FA_OK, "%s: CUDA: %s", label, fa_last_error());
        if (s == FA_OK && s_cpu == FA_OK) {
            if (lc->latent) {
                mirror_k_into_v(&cpu, 0);
                mirror_k_into_v(&gpu, 0);
            }
            const fa_kv_check c = fa_kv_verify(&gpu);
            char detail[600];
            fa_kv_format(&c, detail, sizeof detail);
            EXPECT(c.ok, "%s:%s", label, detail);
            const int64_t diff = cache_differences(&cpu, &gpu, lc->spec.rotary_dim != 0);
            EXPECT(diff == 0, "%s: %lld cache elements differ from the CPU engine's", label, (long long)diff);
            /* both within the oracle's tolerance of the float64 result (the CPU engine's is checked
             * by the CPU tests), so within twice it of each other */
            const double o_diff = o_difference(&cpu, &gpu);
            EXPECT(o_diff <= 2.0 * c.o.tol, "%s: o differs from the CPU engine's by %.3e (2 x tolerance %.3e)", label,
                   o_diff, 2.0 * c.o.tol);
        }
    }
    gpu_buffers_release(gpu.buffer, FA_KV_BUFFER_COUNT);
    fa_kv_problem_destroy(&cpu);
    fa_kv_problem_destroy(&gpu);
}

/* ---- problems ---------------------------------------------------------------------------------- */

static void draw_common(fa_test_rng *rng, int index, int small, fa_kv_spec *s) {
    static const int64_t page_sizes[] = {64, 16, 0, 64, 1, 3, 256, 0};
    memset(s, 0, sizeof *s);
    s->dtype = index % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    s->seed = fa_test_rng_next(rng);
    s->pad_align = 8;
    s->padded = fa_test_rng_uniform(rng) < 0.3;
    s->batch = fa_test_rng_int(rng, 1, small ? 1 : 3);
    s->page_size = page_sizes[index % 8];
    s->causal = fa_test_rng_uniform(rng) < 0.8;
    s->leftpad = fa_test_rng_uniform(rng) < 0.3;
    s->no_lse = fa_test_rng_uniform(rng) < 0.1;
    /* splits: off (1), forced on (2..6: at most that many), or the heuristic (0) */
    const int mode = index % 3;
    s->num_splits = mode == 0 ? 1 : mode == 1 ? (int)fa_test_rng_int(rng, 2, 6) : 0;
}

/* DeepSeek-style MLA: one latent kv head, 576 / 512, 16..128 query heads, 1..4 new tokens. */
static void draw_mla(fa_test_rng *rng, int index, int small, large_case *lc) {
    fa_kv_spec *s = &lc->spec;
    draw_common(rng, index, small, s);
    lc->latent = 1;
    s->head_dim = 576;
    s->head_dim_v = 512;
    s->heads_kv = 1;
    /* 128 heads (MLA's count) on the caches the wgmma kernel reads by TMA (page 64 or 256,
     * contiguous), the other counts on the rest */
    static const int64_t heads[] = {128, 16, 128, 32, 64, 96, 128, 40};
    s->heads_q = small ? (index % 2 ? 16 : 128) : heads[index % 8];
    s->seqlen_q = fa_test_rng_int(rng, 1, 4);
    s->append = index % 5 != 4;
    s->seqlen_new = 0; /* = seqlen_q */
    s->capacity = s->seqlen_q + fa_test_rng_int(rng, 0, small ? (index % 2 ? 90 : 200) : (index % 4 == 0 ? 1000 : 300));
    if (s->heads_q * s->capacity > 128 * 600 && s->batch > 2) s->batch = 2; /* the oracle's time */
    s->batch_idx = !s->page_size && s->append && fa_test_rng_uniform(rng) < 0.3;
    s->softcap = fa_test_rng_uniform(rng) < 0.15 ? 30.0f : 0.0f;
    s->sinks = fa_test_rng_uniform(rng) < 0.2;
}

/* Separate K and V caches at other large shapes, every feature. */
static void draw_other(fa_test_rng *rng, int index, int small, large_case *lc) {
    static const int64_t shapes[][2] = {{320, 320}, {512, 512}, {288, 256}, {128, 320}, {576, 512},
                                        {264, 264}, {512, 64},  {576, 576 - 64}, {384, 320}};
    fa_kv_spec *s = &lc->spec;
    draw_common(rng, index, small, s);
    lc->latent = 0;
    const int shape = (int)(index % 9);
    s->head_dim = shapes[shape][0];
    s->head_dim_v = shapes[shape][1];
    if (shape == 8) lc->latent = 1; /* a latent cache with dv < d, not MLA's */
    s->heads_kv = fa_test_rng_int(rng, 1, 3);
    s->heads_q = s->heads_kv * fa_test_rng_int(rng, 1, small ? 4 : 12);
    s->seqlen_q = fa_test_rng_int(rng, 1, small ? 3 : (index % 4 == 0 ? 40 : 6));
    s->append = index % 6 != 5;
    if (s->append) {
        const int mode = index % 3; /* more, fewer, as many new tokens as queries */
        s->seqlen_new = mode == 0   ? s->seqlen_q + fa_test_rng_int(rng, 1, small ? 4 : 30)
                        : mode == 1 ? (s->seqlen_q > 1 ? fa_test_rng_int(rng, 1, s->seqlen_q - 1) : 1)
                                    : 0;
        if (!lc->latent && fa_test_rng_uniform(rng) < 0.4) {
            s->rotary_dim = 2 * fa_test_rng_int(rng, 1, s->head_dim / 2);
            s->rotary_interleaved = fa_test_rng_uniform(rng) < 0.5;
        }
    }
    const int64_t appended = s->append ? (s->seqlen_new ? s->seqlen_new : s->seqlen_q) : 0;
    s->capacity = appended + fa_test_rng_int(rng, 0, small ? 70 : 600);
    if (s->capacity < 1) s->capacity = 1;
    s->batch_idx = !s->page_size && s->append && fa_test_rng_uniform(rng) < 0.3;
    if (fa_test_rng_uniform(rng) < 0.3) {
        s->use_window = 1;
        s->window_left = (int32_t)fa_test_rng_int(rng, 0, s->capacity);
        s->window_right = fa_test_rng_uniform(rng) < 0.5 ? -1 : (int32_t)fa_test_rng_int(rng, 0, 5);
    }
    s->softcap = fa_test_rng_uniform(rng) < 0.2 ? 4.0f : 0.0f;
    s->alibi = fa_test_rng_uniform(rng) < 0.2 ? FA_TEST_ALIBI_BATCH_HEAD : FA_TEST_ALIBI_NONE;
    s->sinks = fa_test_rng_uniform(rng) < 0.3;
    while ((double)s->batch * s->heads_q * s->seqlen_q * s->capacity * s->head_dim > 4e7 && s->batch > 1) s->batch--;
}

/* ---- bad shapes ---------------------------------------------------------------------------------- */

/* A refused call on CUDA: its status, a message naming `field`, no output or cache element written. */
static void expect_refused(fa_kv_problem *kp, fa_params p, fa_status want, const char *field, const char *label) {
    fa_kv_problem_reset(kp);
    if (gpu_buffers_upload(kp->buffer, FA_KV_BUFFER_COUNT)) {
        EXPECT(0, "%s: upload failed", label);
        return;
    }
    const fa_status got = fa_kvcache_forward(&p);
    char message[512];
    snprintf(message, sizeof message, "%s", fa_last_error());
    size_t ws = 0;
    const fa_status checked = fa_check_kvcache(&p, &ws);
    if (gpu_buffers_download(kp->buffer, FA_KV_BUFFER_COUNT)) EXPECT(0, "%s: CUDA error", label);
    EXPECT(got == want, "%s: %s, want %s: %s", label, fa_strerror(got), fa_strerror(want), message);
    EXPECT(checked == got, "%s: fa_check_kvcache says %s, the call %s", label, fa_strerror(checked), fa_strerror(got));
    EXPECT(strstr(message, field) != NULL, "%s: message does not name %s: \"%s\"", label, field, message);
    EXPECT(fa_kv_untouched(kp), "%s: an output or the cache was written", label);
}

static void bad_shapes(uint64_t seed) {
    static const struct {
        int64_t d, dv;
        int latent, append;
        const char *what;
    } shapes[] = {
        {576, 520, 0, 1, "dv 520 > 512"},
        {576, 576, 0, 0, "dv 576 > 512"},
        {300, 256, 0, 1, "d 300, not a multiple of 8"},
        {288, 320, 1, 0, "v == k with dv 320 > d 288"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        fa_kv_spec s;
        memset(&s, 0, sizeof s);
        s.dtype = FA_DTYPE_BF16;
        s.batch = 2, s.seqlen_q = 2, s.heads_q = 8, s.heads_kv = 1, s.head_dim = shapes[i].d;
        s.head_dim_v = shapes[i].dv, s.capacity = 50, s.page_size = 16, s.append = shapes[i].append, s.causal = 1;
        s.pad_align = 8, s.seed = seed + i;
        fa_kv_problem kp;
        if (fa_kv_problem_create(&kp, &s)) {
            EXPECT(0, "%s: could not create the problem", shapes[i].what);
            continue;
        }
        if (gpu_buffers_upload(kp.buffer, FA_KV_BUFFER_COUNT) == 0) {
            fa_params p = fa_kv_problem_device_params(&kp);
            p.device = FA_DEVICE_CUDA;
            if (shapes[i].latent) make_latent(&p);
            const char *field = shapes[i].d % 8 ? "head_dim" : "head_dim_v";
            expect_refused(&kp, p, FA_ERR_HEAD_DIM, field, shapes[i].what);
        }
        gpu_buffers_release(kp.buffer, FA_KV_BUFFER_COUNT);
        fa_kv_problem_destroy(&kp);
    }

    /* d > 576 (every engine's limit), and a score bias at a large head dim, on an MLA problem */
    fa_kv_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = FA_DTYPE_F16;
    s.batch = 1, s.seqlen_q = 1, s.heads_q = 16, s.heads_kv = 1, s.head_dim = 576, s.head_dim_v = 512;
    s.capacity = 40, s.append = 1, s.causal = 1, s.pad_align = 8, s.seed = seed + 99;
    fa_kv_problem kp;
    if (fa_kv_problem_create(&kp, &s)) {
        EXPECT(0, "d > 576: could not create the problem");
        return;
    }
    mirror_k_into_v(&kp, 1);
    if (gpu_buffers_upload(kp.buffer, FA_KV_BUFFER_COUNT) == 0) {
        fa_params good = fa_kv_problem_device_params(&kp);
        good.device = FA_DEVICE_CUDA;
        make_latent(&good);
        fa_params p = good;
        p.head_dim = 584;
        expect_refused(&kp, p, FA_ERR_HEAD_DIM, "head_dim", "d 584 > 576");
        p = good;
        p.bias = good.q; /* any readable f16 array: a broadcast bias of one element */
        p.bias_dtype = FA_DTYPE_F16;
        p.bias_batch_stride = p.bias_head_stride = p.bias_row_stride = p.bias_col_stride = 0;
        expect_refused(&kp, p, FA_ERR_UNSUPPORTED, "bias", "a score bias at d 576");
        /* the same problem is accepted without them */
        fa_kv_problem_reset(&kp);
        if (gpu_buffers_upload(kp.buffer, FA_KV_BUFFER_COUNT) == 0) {
            const fa_status st = fa_kvcache_forward(&good);
            if (gpu_buffers_download(kp.buffer, FA_KV_BUFFER_COUNT)) EXPECT(0, "good MLA call: CUDA error");
            mirror_k_into_v(&kp, 0);
            const fa_kv_check c = fa_kv_verify(&kp);
            char detail[600];
            fa_kv_format(&c, detail, sizeof detail);
            EXPECT(st == FA_OK && c.ok, "the MLA problem of the refused calls: %s%s", st == FA_OK ? "" : fa_last_error(),
                   detail);
        }
    }
    gpu_buffers_release(kp.buffer, FA_KV_BUFFER_COUNT);
    fa_kv_problem_destroy(&kp);
}

int gpu_kvlarge_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    const uint64_t seed = gpu_announce_seed("kvlarge");
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    const int mla_cases = small ? 3 : 32, other_cases = small ? 3 : 36;
    for (int i = 0; i < mla_cases + other_cases; i++) {
        large_case lc;
        if (i < mla_cases) draw_mla(&rng, i, small, &lc);
        else draw_other(&rng, i - mla_cases, small, &lc);
        run_case(&lc);
    }
    bad_shapes(seed + 1);
    printf("kvlarge: %d cases, %d failures\n", mla_cases + other_cases, failures);
    return failures ? 1 : 0;
}
