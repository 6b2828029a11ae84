/*
 * fa_gpu_bwd_paths.c: the CUDA backward's two kernels on problems large enough that every CTA of
 * the Hopper backward walks many query blocks: the default kernel (the Hopper one on sm_90 for the
 * problems it covers) against the portable one (FA_CUDA_BACKWARD=portable), which the randomised
 * sweep checks against float64 on smaller problems. One fa_forward (default kernel), then three
 * fa_backward calls on the same inputs: default, default again, portable.
 *
 * What fails a case:
 *   - dq, dk, dv (and dsink) of the default kernel differ from the portable one's by more than
 *     the tolerance below, or contain NaN: every output is NaN-poisoned (all bits set) before each
 *     call, so an element left unwritten (e.g. dk/dv of keys no query sees) shows up as NaN;
 *   - the default kernel's dk or dv differ bitwise between its two runs (dq may: fp32 atomics;
 *     with `det`, deterministic = 1 in every call, a third default run after the portable one,
 *     and dq must repeat bitwise too);
 *   - an output element outside the tensors' declared extent (gaps of padded strides, varlen rows
 *     past total_q / total_k) is written by either kernel.
 * Inputs outside the declared extent and the varlen rows between the last sequence and total_q /
 * total_k (q, k, v, o, dout, lse) are NaN, so a kernel that loads them without masking leaks NaN.
 *
 * Tolerance. Both kernels recompute S = QKᵀ in fp32 (in different orders), round P and dS to the
 * 16-bit dtype before their MMAs, accumulate in fp32 (dq by atomics in any order) and round dq,
 * dk, dv to 16 bits. The summation order alone moves the fp32 results by ~1e-6; what moves them
 * more is where P and dS are rounded (before or after the softmax scale, which flips a 16-bit
 * rounding of every element, or where a recomputed S straddles a rounding boundary): per term a
 * relative change of up to one 16-bit ulp with a random sign. Terms of dq/dk/dv have random signs,
 * so the sums and these errors both grow like √n: the difference is a fixed fraction of the
 * tensor's typical magnitude, not of each element (an element can be small by cancellation), plus
 * one output-rounding ulp of the element itself. Rule, per element with ref = portable:
 *     |default - ref| <= c_abs·max|ref| + 2^-7·|ref|,   c_abs = 1e-2 (bf16), 2.5e-3 (f16).
 * A numpy model of two kernels differing in exactly those roundings
 * (docs/tuning-log.md, experiments) needs c_abs = 3.2e-3 (bf16) and 2.9e-4 (f16) at n = 2048,
 * so these leave a 3× (bf16) and 8× (f16) margin, while a dropped or doubled 64-query or 128-key
 * block changes an element by ~√(64/n) ≈ 15 % of the typical magnitude, several times c_abs·max.
 * dsink is an fp32 sum of the same terms (LSE and D = rowsum(dO∘O) from the same inputs) in a
 * different order: |default - ref| <= 1e-3·(max|ref| + |ref|).
 *
 * Head dims 64, 96, 128 (bwd_sm90.cu), d ≤ 192 with dv ≤ 128 (bwd_sm90_hdim192.cu, deterministic
 * mode included; with softcap, ALiBi or a negative scale bwd_sm90_hdim256.cu), 192, 256
 * (bwd_sm90_hdim256.cu), 320 .. 512 (the same file's CTA pairs).
 * Softcap cases (the kernels' SOFTCAP instantiations): softcap 20-50 with q scaled up so that the
 * scores' spread is about half the softcap: tanh partly saturates, 1 - tanh² runs from 1 to ~0.
 * A negative softmax_scale and ALiBi run the Hopper kernel (the mask acts on the exponent); with
 * softcap both stay on the portable kernel, which the cases marked "portable both runs" check.
 * Part of `make gpu-test` (tests/gpu_test.sh step 6). Exit status 0 = every case passes.
 * Usage: fa_gpu_bwd_paths [small] [det]   (small: short problems of the same kinds, for
 *        compute-sanitizer; det: deterministic mode, plus 4k-8k-token problems whose key-block
 *        chains span several waves of the grid)
 */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

/* ---- cases ----------------------------------------------------------------------------------- */

typedef enum tensor_layout {
    LAYOUT_CONTIGUOUS, /* every tensor dense [b, s, h, d] (fa_set_contiguous_strides)            */
    LAYOUT_PACKED_QKV, /* q, k, v views of one [b, s, hq + 2·hkv, d] tensor, dq, dk, dv of another
                          (self-attention: seqlen_q = seqlen_k); o and dout dense                  */
    LAYOUT_PADDED      /* every tensor with head stride d + 8, row stride h·(d + 8) + 16 and batch
                          stride s·row + 64 elements: gaps a kernel must neither read nor write   */
} tensor_layout;

#define MAX_SEQS 4
typedef struct bwd_case {
    const char *name;
    fa_dtype dtype;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int causal, window_left, window_right; /* window sides < 0: unbounded; use_window if either >= 0 */
    int sinks;                             /* sink logits and dsink                                 */
    tensor_layout layout;
    int varlen;                            /* lens_q / lens_k hold `batch` sequence lengths           */
    int lens_q[MAX_SEQS], lens_k[MAX_SEQS];
    int head_dim_v;                        /* 0: head_dim (dense and padded layouts only)          */
} bwd_case;

/* What a case changes in the scores (all zero: the defaults). */
typedef struct score_options {
    float softcap;       /* > 0: softcap on                                                       */
    float q_amplitude;   /* q uniform in ±2·q_amplitude (0: ±2)                                   */
    float softmax_scale; /* 0: the default 1/sqrt(d)                                              */
    int alibi;           /* ALiBi slopes 2^(-8(h+1)/heads_q); 2: per batch × head                  */
} score_options;

typedef struct softcap_case {
    bwd_case c;
    score_options scores;
} softcap_case;

/* ---- poison and random inputs ---------------------------------------------------- */

#define POISON16 0xffffu /* NaN in bf16 and f16 */

static gpu_rng rng = {2891336453u};

/* ---- tensor views over buffers --------------------------------------------------------------- */

enum { BUF_Q, BUF_K, BUF_V, BUF_O, BUF_DO, BUF_DQ, BUF_DK, BUF_DV, NUM_BUFS };
static const char *const tensor_names[NUM_BUFS] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};

static int case_dv(const bwd_case *c) { return c->head_dim_v > 0 ? c->head_dim_v : c->head_dim; }

static int is_query_side(int t) { return t == BUF_Q || t == BUF_O || t == BUF_DO || t == BUF_DQ; }

/* A [batch, seq, heads, dim] tensor inside buffer `buf`, as fa_params sees it. */
typedef struct tensor_view {
    int buf;
    size_t offset;                                /* elements from the buffer's start             */
    int64_t batch_stride, row_stride, head_stride; /* elements                                  */
    int heads, dim;
} tensor_view;

/* The geometry of one side (queries or keys) of a case. */
typedef struct seq_geometry {
    int varlen, batch, seqlen;
    int cu[MAX_SEQS + 1]; /* varlen: prefix sums of the lengths                                */
    int64_t total;        /* varlen: declared rows (cu[batch] + 3 rows that belong to no sequence) */
    int64_t alloc_rows;   /* rows the buffers hold: varlen total + 5, else batch · seqlen        */
} seq_geometry;

static int seq_len(const seq_geometry *g, int b) { return g->varlen ? g->cu[b + 1] - g->cu[b] : g->seqlen; }

static size_t view_index(const tensor_view *t, const seq_geometry *g, int b, int64_t i, int h, int c) {
    const int64_t row = g->varlen ? (g->cu[b] + i) * t->row_stride : b * t->batch_stride + i * t->row_stride;
    return t->offset + (size_t)(row + (int64_t)h * t->head_stride + c);
}

/* Mask of a buffer's elements: what each one is. */
enum { ELEM_OUTSIDE = 0, ELEM_DECLARED_PAD = 1, ELEM_LOGICAL = 2 };

static void mark_view(uint8_t *mask, const tensor_view *t, const seq_geometry *g) {
    for (int b = 0; b < g->batch; ++b)
        for (int64_t i = 0; i < seq_len(g, b); ++i)
            for (int h = 0; h < t->heads; ++h)
                for (int c = 0; c < t->dim; ++c) mask[view_index(t, g, b, i, h, c)] = ELEM_LOGICAL;
    if (!g->varlen) return;
    for (int64_t row = g->cu[g->batch]; row < g->total; ++row) /* rows in the tensor, in no sequence */
        for (int h = 0; h < t->heads; ++h)
            for (int c = 0; c < t->dim; ++c) {
                uint8_t *m = &mask[t->offset + (size_t)(row * t->row_stride + (int64_t)h * t->head_stride + c)];
                if (*m == ELEM_OUTSIDE) *m = ELEM_DECLARED_PAD;
            }
}

/* ---- one case ---------------------------------------------------------------------------------- */

typedef struct compare_stats {
    double max_ref, max_diff, worst_ratio; /* worst_ratio: max over elements of |diff| / allowed  */
    long nan_count, over_count;
} compare_stats;

static void compare_view(compare_stats *st, const uint16_t *got, const uint16_t *ref, const tensor_view *t,
                         const seq_geometry *g, fa_dtype dtype, double c_abs) {
    memset(st, 0, sizeof *st);
    for (int pass = 0; pass < 2; ++pass) /* pass 0: max|ref|, pass 1: differences */
        for (int b = 0; b < g->batch; ++b)
            for (int64_t i = 0; i < seq_len(g, b); ++i)
                for (int h = 0; h < t->heads; ++h)
                    for (int c = 0; c < t->dim; ++c) {
                        const size_t e = view_index(t, g, b, i, h, c);
                        const double a = gpu_float_from_16(got[e], dtype), r = gpu_float_from_16(ref[e], dtype);
                        if (pass == 0) {
                            if (!isnan(r) && fabs(r) > st->max_ref) st->max_ref = fabs(r);
                            continue;
                        }
                        if (isnan(a) || isnan(r)) {
                            ++st->nan_count;
                            continue;
                        }
                        const double diff = fabs(a - r), allowed = c_abs * st->max_ref + 0.0078125 * fabs(r);
                        if (diff > st->max_diff) st->max_diff = diff;
                        if (diff > allowed) ++st->over_count;
                        const double ratio = allowed > 0.0 ? diff / allowed : (diff > 0.0 ? INFINITY : 0.0);
                        if (ratio > st->worst_ratio) st->worst_ratio = ratio;
                    }
}

#define CHECK_CUDA(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            printf("FAIL %s: %s: %s\n", c->name, #call, cudaGetErrorString(e_));                  \
            failed = 1;                                                                           \
            goto done;                                                                            \
        }                                                                                         \
    } while (0)

/* RUN_DEFAULT_THIRD: deterministic mode only (after the portable run, on a fresh workspace). */
enum { RUN_DEFAULT, RUN_DEFAULT_AGAIN, RUN_PORTABLE, RUN_DEFAULT_THIRD, NUM_RUNS };
static int deterministic_mode; /* `det`: fa_params.deterministic = 1 */

static void set_geometry(seq_geometry *g, const bwd_case *c, const int *lens, int seqlen) {
    memset(g, 0, sizeof *g);
    g->varlen = c->varlen;
    g->batch = c->batch;
    g->seqlen = seqlen;
    if (c->varlen) {
        for (int b = 0; b < c->batch; ++b) g->cu[b + 1] = g->cu[b] + lens[b];
        g->total = g->cu[c->batch] + 3;
        g->alloc_rows = g->total + 5;
    } else {
        g->alloc_rows = (int64_t)c->batch * seqlen;
    }
}

/* Lays out the eight tensors of case c; returns each buffer's element count in buf_elems. */
static void set_views(tensor_view *views, size_t *buf_elems, const bwd_case *c, const seq_geometry *gq,
                      const seq_geometry *gk) {
    const int hq = c->heads_q, hkv = c->heads_kv;
    for (int t = 0; t < NUM_BUFS; ++t) {
        const int d = t == BUF_V || t == BUF_O || t == BUF_DO || t == BUF_DV ? case_dv(c) : c->head_dim;
        const int is_q_side = is_query_side(t);
        const seq_geometry *g = is_q_side ? gq : gk;
        tensor_view *v = &views[t];
        memset(v, 0, sizeof *v);
        v->buf = t;
        v->heads = is_q_side ? hq : hkv;
        v->dim = d;
        const int padded = c->layout == LAYOUT_PADDED;
        v->head_stride = padded ? d + 8 : d;
        v->row_stride = (int64_t)v->heads * v->head_stride + (padded ? 16 : 0);
        v->batch_stride = (int64_t)g->seqlen * v->row_stride + (padded ? 64 : 0);
        buf_elems[t] = (size_t)(g->varlen ? g->alloc_rows * v->row_stride : (int64_t)g->batch * v->batch_stride);
    }
    if (c->layout != LAYOUT_PACKED_QKV) return;
    const int d = c->head_dim;
    const int64_t row = (int64_t)(hq + 2 * hkv) * d; /* one token of the packed tensor */
    for (int t = 0; t < NUM_BUFS; ++t) {
        if (t == BUF_O || t == BUF_DO) continue;
        tensor_view *v = &views[t];
        const int slot = (t == BUF_K || t == BUF_DK) ? 1 : (t == BUF_V || t == BUF_DV) ? 2 : 0;
        v->buf = t < BUF_DQ ? BUF_Q : BUF_DQ;
        v->offset = slot == 0 ? 0 : (size_t)(slot == 1 ? hq : hq + hkv) * d;
        v->row_stride = row;
        v->batch_stride = (int64_t)gq->seqlen * row;
        buf_elems[t] = 0;
    }
    buf_elems[BUF_Q] = buf_elems[BUF_DQ] =
        (size_t)(gq->varlen ? gq->alloc_rows * row : (int64_t)gq->batch * gq->seqlen * row);
}

/* Points fa_params' tensor t (BUF_*) at ptr with the view's strides. */
static void set_tensor(fa_params *p, int t, void *ptr, const tensor_view *v) {
#define SET_TENSOR(field, prefix)                   \
    do {                                            \
        p->field = ptr;                             \
        p->prefix##_batch_stride = v->batch_stride; \
        p->prefix##_row_stride = v->row_stride;     \
        p->prefix##_head_stride = v->head_stride;   \
    } while (0)
    switch (t) {
    case BUF_Q: SET_TENSOR(q, q); break;
    case BUF_K: SET_TENSOR(k, k); break;
    case BUF_V: SET_TENSOR(v, v); break;
    case BUF_O: SET_TENSOR(o, o); break;
    case BUF_DO: SET_TENSOR(dout, do); break;
    case BUF_DQ: SET_TENSOR(dq, dq); break;
    case BUF_DK: SET_TENSOR(dk, dk); break;
    default: SET_TENSOR(dv, dv); break;
    }
#undef SET_TENSOR
}

/* One case's buffers: host copies (NaN-poisoned, then the inputs), the element masks, device
 * buffers, lse / sinks / cu_seqlens, and each backward run's outputs and time. */
typedef struct case_run {
    seq_geometry gq, gk;
    tensor_view views[NUM_BUFS];
    size_t buf_elems[NUM_BUFS];
    uint16_t *host[NUM_BUFS], *out_host[NUM_RUNS][NUM_BUFS];
    uint8_t *mask[NUM_BUFS];
    void *dev[NUM_BUFS];
    float *lse, *sinks, *dsink, *lse_host, *alibi;
    float dsink_host[NUM_RUNS][64], run_ms[NUM_RUNS];
    cudaEvent_t start, stop;
    int *cu_q, *cu_k;
    size_t lse_elems;
} case_run;

/* Buffers: NaN everywhere, then random values at the logical elements of the inputs; lse
 * (NaN), sinks and cu_seqlens on the device. 1 on a CUDA failure. */
static int fill_inputs(const bwd_case *c, const score_options *opt, case_run *r) {
    const int hq = c->heads_q;
    int failed = 0;
    for (int t = 0; t < NUM_BUFS; ++t) {
        if (r->buf_elems[t] == 0) continue;
        r->host[t] = malloc(r->buf_elems[t] * 2);
        r->mask[t] = calloc(r->buf_elems[t], 1);
        for (int run = 0; run < NUM_RUNS; ++run)
            if (t >= BUF_DQ) r->out_host[run][t] = malloc(r->buf_elems[t] * 2);
        memset(r->host[t], 0xff, r->buf_elems[t] * 2);
        CHECK_CUDA(cudaMalloc(&r->dev[t], r->buf_elems[t] * 2));
    }
    for (int t = 0; t < NUM_BUFS; ++t) {
        const tensor_view *v = &r->views[t];
        const seq_geometry *g = is_query_side(t) ? &r->gq : &r->gk;
        mark_view(r->mask[v->buf], v, g);
        if (t == BUF_O || t >= BUF_DQ) continue; /* o comes from fa_forward */
        const float amplitude = t == BUF_Q && opt->q_amplitude > 0.0f ? opt->q_amplitude : 1.0f;
        const float lo = t == BUF_DO ? -1.0f : -2.0f * amplitude, hi = t == BUF_DO ? 1.0f : 2.0f * amplitude;
        const float offset = t == BUF_V ? 0.5f : 0.0f;
        for (int b = 0; b < g->batch; ++b)
            for (int64_t i = 0; i < seq_len(g, b); ++i)
                for (int h = 0; h < v->heads; ++h)
                    for (int e = 0; e < v->dim; ++e)
                        r->host[v->buf][view_index(v, g, b, i, h, e)] = gpu_float_to_16(gpu_random_uniform(&rng, lo, hi) + offset, c->dtype);
    }
    for (int t = 0; t < NUM_BUFS; ++t)
        if (r->host[t]) CHECK_CUDA(cudaMemcpy(r->dev[t], r->host[t], r->buf_elems[t] * 2, cudaMemcpyHostToDevice));
    r->lse_host = malloc(r->lse_elems * 4);
    CHECK_CUDA(cudaMalloc((void **)&r->lse, r->lse_elems * 4));
    CHECK_CUDA(cudaMemset(r->lse, 0xff, r->lse_elems * 4));
    if (opt->alibi) {
        const int n_slopes = opt->alibi == 2 ? c->batch * hq : hq;
        float slope_host[256];
        for (int i = 0; i < n_slopes && i < 256; ++i)
            slope_host[i] = exp2f(-8.0f * (float)(i % hq + 1) / (float)hq) * (i >= hq ? 1.5f : 1.0f);
        CHECK_CUDA(cudaMalloc((void **)&r->alibi, (size_t)n_slopes * 4));
        CHECK_CUDA(cudaMemcpy(r->alibi, slope_host, (size_t)n_slopes * 4, cudaMemcpyHostToDevice));
    }
    if (c->sinks) {
        float sink_host[64];
        for (int h = 0; h < hq; ++h) sink_host[h] = 6.0f + 0.75f * (float)(h % 4); /* near LSE ≈ log(keys) + 1 */
        CHECK_CUDA(cudaMalloc((void **)&r->sinks, hq * 4));
        CHECK_CUDA(cudaMalloc((void **)&r->dsink, hq * 4));
        CHECK_CUDA(cudaMemcpy(r->sinks, sink_host, hq * 4, cudaMemcpyHostToDevice));
    }
    if (c->varlen) {
        CHECK_CUDA(cudaMalloc((void **)&r->cu_q, sizeof r->gq.cu));
        CHECK_CUDA(cudaMalloc((void **)&r->cu_k, sizeof r->gk.cu));
        CHECK_CUDA(cudaMemcpy(r->cu_q, r->gq.cu, sizeof r->gq.cu, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(r->cu_k, r->gk.cu, sizeof r->gk.cu, cudaMemcpyHostToDevice));
    }
done:
    return failed;
}

/* The fa_params of the case on r's device buffers. */
static void case_params(const bwd_case *c, const score_options *opt, const case_run *r, fa_params *p) {
    const int hq = c->heads_q, d = c->head_dim;
    memset(p, 0, sizeof *p);
    p->device = FA_DEVICE_CUDA;
    p->dtype = c->dtype;
    p->batch = c->batch;
    p->seqlen_q = c->seqlen_q; /* varlen: the longest sequence */
    p->seqlen_k = c->seqlen_k;
    p->heads_q = hq;
    p->heads_kv = c->heads_kv;
    p->head_dim = d;
    p->head_dim_v = case_dv(c);
    if (c->varlen) {
        p->cu_seqlens_q = r->cu_q;
        p->cu_seqlens_k = r->cu_k;
        p->total_q = r->gq.total;
        p->total_k = r->gk.total;
    }
    for (int t = 0; t < NUM_BUFS; ++t) set_tensor(p, t, (uint16_t *)r->dev[r->views[t].buf] + r->views[t].offset, &r->views[t]);
    p->lse = r->lse;
    p->causal = c->causal;
    p->use_window = c->window_left >= 0 || c->window_right >= 0;
    p->window_left = c->window_left;
    p->window_right = c->window_right;
    p->sink_logits = r->sinks;
    p->dsink = r->dsink;
    p->softcap = opt->softcap;
    p->softmax_scale = opt->softmax_scale;
    p->alibi_slopes = r->alibi;
    p->alibi_batch_stride = opt->alibi == 2 ? hq : 0;
    p->deterministic = deterministic_mode;

}

/* fa_forward (default kernel), then NaN back into o and lse wherever it may have written outside
 * the sequences. 1 on failure. */
static int run_forward(const bwd_case *c, case_run *r, const fa_params *p) {
    const int hq = c->heads_q;
    int failed = 0;
    fa_status s = fa_forward(p);
    if (s != FA_OK) {
        printf("FAIL %s: fa_forward: %s: %s\n", c->name, fa_strerror(s), fa_last_error());
        failed = 1;
        goto done;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    /* NaN back into o and lse wherever fa_forward may have written outside the sequences. */
    CHECK_CUDA(cudaMemcpy(r->host[BUF_O], r->dev[BUF_O], r->buf_elems[BUF_O] * 2, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < r->buf_elems[BUF_O]; ++e)
        if (r->mask[BUF_O][e] != ELEM_LOGICAL) r->host[BUF_O][e] = POISON16;
    CHECK_CUDA(cudaMemcpy(r->dev[BUF_O], r->host[BUF_O], r->buf_elems[BUF_O] * 2, cudaMemcpyHostToDevice));
    if (c->varlen) {
        CHECK_CUDA(cudaMemcpy(r->lse_host, r->lse, r->lse_elems * 4, cudaMemcpyDeviceToHost));
        for (size_t e = 0; e < r->lse_elems; ++e)
            if (e >= (size_t)(hq * r->gq.total) || (int64_t)(e % (size_t)r->gq.total) >= r->gq.cu[c->batch]) r->lse_host[e] = NAN;
        CHECK_CUDA(cudaMemcpy(r->lse, r->lse_host, r->lse_elems * 4, cudaMemcpyHostToDevice));
    }
done:
    return failed;
}

/* The backward runs (default, default again, portable, and in deterministic mode default a third
 * time), each on NaN-poisoned outputs; 1 on failure. */
static int run_backwards(const bwd_case *c, case_run *r, const fa_params *p, int runs) {
    const int hq = c->heads_q;
    int failed = 0;
    CHECK_CUDA(cudaEventCreate(&r->start));
    CHECK_CUDA(cudaEventCreate(&r->stop));
    for (int run = 0; run < runs; ++run) {
        if (run == RUN_PORTABLE)
            setenv("FA_CUDA_BACKWARD", "portable", 1);
        else
            unsetenv("FA_CUDA_BACKWARD");
        for (int t = BUF_DQ; t < NUM_BUFS; ++t)
            if (r->dev[t]) CHECK_CUDA(cudaMemset(r->dev[t], 0xff, r->buf_elems[t] * 2)); /* NaN poison */
        if (r->dsink) CHECK_CUDA(cudaMemset(r->dsink, 0xff, hq * 4));
        CHECK_CUDA(cudaEventRecord(r->start, 0));
        fa_status s = fa_backward(p);
        unsetenv("FA_CUDA_BACKWARD");
        if (s != FA_OK) {
            printf("FAIL %s: fa_backward (%s): %s: %s\n", c->name, run == RUN_PORTABLE ? "portable" : "default",
                   fa_strerror(s), fa_last_error());
            failed = 1;
            goto done;
        }
        CHECK_CUDA(cudaEventRecord(r->stop, 0));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaEventElapsedTime(&r->run_ms[run], r->start, r->stop));
        for (int t = BUF_DQ; t < NUM_BUFS; ++t)
            if (r->dev[t]) CHECK_CUDA(cudaMemcpy(r->out_host[run][t], r->dev[t], r->buf_elems[t] * 2, cudaMemcpyDeviceToHost));
        if (r->dsink) CHECK_CUDA(cudaMemcpy(r->dsink_host[run], r->dsink, hq * 4, cudaMemcpyDeviceToHost));
    }
done:
    unsetenv("FA_CUDA_BACKWARD");
    return failed;
}

/* Compare the runs and print the case's line; 1 when it fails. */
static int report_case(const bwd_case *c, const case_run *r, int runs, double c_abs) {
    const int hq = c->heads_q;
    int failed = 0;
    char line[1024];
    int len = 0;
    long stray = 0, repeat_differs = 0;
    for (int run = 0; run < runs; ++run) /* nothing written outside the declared tensors */
        for (int t = BUF_DQ; t < NUM_BUFS; ++t)
            for (size_t e = 0; r->out_host[run][t] && e < r->buf_elems[t]; ++e)
                stray += r->mask[t][e] == ELEM_OUTSIDE && r->out_host[run][t][e] != POISON16;
    for (int t = BUF_DQ; t < NUM_BUFS; ++t) {
        const tensor_view *v = &r->views[t];
        const seq_geometry *g = is_query_side(t) ? &r->gq : &r->gk;
        compare_stats st;
        compare_view(&st, r->out_host[RUN_DEFAULT][v->buf], r->out_host[RUN_PORTABLE][v->buf], v, g, c->dtype, c_abs);
        if (t != BUF_DQ || deterministic_mode) { /* dk, dv (deterministic mode: dq too): bitwise repeatable */
            const uint16_t *first = r->out_host[RUN_DEFAULT][v->buf], *again = r->out_host[RUN_DEFAULT_AGAIN][v->buf];
            const uint16_t *third = deterministic_mode ? r->out_host[RUN_DEFAULT_THIRD][v->buf] : again;
            for (int b = 0; b < g->batch; ++b)
                for (int64_t i = 0; i < seq_len(g, b); ++i)
                    for (int h = 0; h < v->heads; ++h)
                        for (int e = 0; e < v->dim; ++e) {
                            const size_t x = view_index(v, g, b, i, h, e);
                            repeat_differs += first[x] != again[x] || first[x] != third[x];
                        }
        }
        failed |= st.nan_count != 0 || st.over_count != 0;
        len += snprintf(line + len, sizeof line - (size_t)len, " %s %.1e/%.2f=%.1e%s", tensor_names[t],
                        st.max_diff, st.max_ref, st.max_ref > 0 ? st.max_diff / st.max_ref : 0.0,
                        st.nan_count ? " NaN" : "");
        if (st.nan_count || st.over_count)
            len += snprintf(line + len, sizeof line - (size_t)len, " [%ld NaN, %ld over tol, worst %.1f× tol]",
                            st.nan_count, st.over_count, st.worst_ratio);
    }
    if (r->dsink) {
        double max_ref = 0.0, max_diff = 0.0;
        long bad = 0;
        for (int h = 0; h < hq; ++h)
            if (fabs(r->dsink_host[RUN_PORTABLE][h]) > max_ref) max_ref = fabs(r->dsink_host[RUN_PORTABLE][h]);
        for (int h = 0; h < hq; ++h) {
            const double a = r->dsink_host[RUN_DEFAULT][h], ref = r->dsink_host[RUN_PORTABLE][h], diff = fabs(a - ref);
            if (isnan(a) || isnan(ref) || diff > 1e-3 * (max_ref + fabs(ref))) ++bad;
            if (diff > max_diff) max_diff = diff;
        }
        failed |= bad != 0;
        len += snprintf(line + len, sizeof line - (size_t)len, " dsink %.1e/%.2f%s", max_diff, max_ref,
                        bad ? " BAD" : "");
    }
    failed |= stray != 0 || repeat_differs != 0;
    printf("%s %s:%s; repeat %s %s; stray writes %ld; ms default %.2f portable %.2f\n",
           failed ? "FAIL" : "ok  ", c->name, line, deterministic_mode ? "dq/dk/dv (3 runs)" : "dk/dv",
           repeat_differs ? "DIFFER" : "same", stray,
           r->run_ms[RUN_DEFAULT_AGAIN], r->run_ms[RUN_PORTABLE]);
    return failed;
}

static void free_case_run(case_run *r) {
    for (int t = 0; t < NUM_BUFS; ++t) {
        if (r->dev[t]) cudaFree(r->dev[t]);
        free(r->host[t]);
        free(r->mask[t]);
        for (int run = 0; run < NUM_RUNS; ++run) free(r->out_host[run][t]);
    }
    if (r->lse) cudaFree(r->lse);
    if (r->sinks) cudaFree(r->sinks);
    if (r->alibi) cudaFree(r->alibi);
    if (r->dsink) cudaFree(r->dsink);
    if (r->cu_q) cudaFree(r->cu_q);
    if (r->cu_k) cudaFree(r->cu_k);
    free(r->lse_host);
    if (r->start) cudaEventDestroy(r->start);
    if (r->stop) cudaEventDestroy(r->stop);
}

static int run_case(const bwd_case *c, const score_options *opt) {
    const int runs = deterministic_mode ? NUM_RUNS : RUN_DEFAULT_THIRD;
    const double c_abs = c->dtype == FA_DTYPE_BF16 ? 1e-2 : 2.5e-3;
    case_run run;
    case_run *r = &run;
    memset(r, 0, sizeof *r);
    set_geometry(&r->gq, c, c->lens_q, c->seqlen_q);
    set_geometry(&r->gk, c, c->lens_k, c->seqlen_k);
    set_views(r->views, r->buf_elems, c, &r->gq, &r->gk);
    r->lse_elems = c->varlen ? (size_t)(c->heads_q * r->gq.total) + 64 : (size_t)c->batch * c->heads_q * c->seqlen_q;
    fa_params p;
    int failed = fill_inputs(c, opt, r);
    if (!failed) {
        case_params(c, opt, r, &p);
        failed = run_forward(c, r, &p) || run_backwards(c, r, &p, runs) || report_case(c, r, runs, c_abs);
    }
    unsetenv("FA_CUDA_BACKWARD");
    free_case_run(r);
    return failed;
}

/* The cases. B, H: the dtypes; DENSE, PACKED, PADDED: the layouts. */
#define B FA_DTYPE_BF16
#define H FA_DTYPE_F16
#define DENSE LAYOUT_CONTIGUOUS
#define PACKED LAYOUT_PACKED_QKV
#define PADDED LAYOUT_PADDED
/* name, dtype, batch, sq, sk, hq, hkv, d, causal, window left/right, sinks, layout, varlen, lens */
static const bwd_case big_cases[] = {
    {"bf16 d128 s=2048 b=2 h=8", B, 2, 2048, 2048, 8, 8, 128, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"f16 d128 causal sq=1000 sk=3000 GQA 8/2", H, 2, 1000, 3000, 8, 2, 128, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    /* few CTAs: the Hopper backward splits the kv group (8 and 3 ways, fp32 dK/dV partials) */
    {"bf16 d128 causal s=1024 MQA 16/1", B, 1, 1024, 1024, 16, 1, 128, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"f16 d64 s=777 GQA 12/2", H, 1, 777, 777, 12, 2, 64, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"bf16 d64 causal sq=3000 sk=1100 MQA 8/1 (rows with no key)", B, 1, 3000, 1100, 8, 1, 64, 1, -1, -1, 0,
     DENSE, 0, {0}, {0}, 0},
    {"f16 d96 window 256/64 s=2500 GQA 8/2", H, 2, 2500, 2500, 8, 2, 96, 0, 256, 64, 0, DENSE, 0, {0}, {0}, 0},
    {"bf16 d64 window left 200 sq=1000 sk=3000 (keys no query sees)", B, 2, 1000, 3000, 4, 4, 64, 0, 200, -1,
     0, DENSE, 0, {0}, {0}, 0},
    {"bf16 d128 causal sinks s=2048 b=2 GQA 8/2", B, 2, 2048, 2048, 8, 2, 128, 1, -1, -1, 1, DENSE, 0, {0}, {0}, 0},
    {"f16 d64 varlen causal GQA 8/2 (an empty sequence)", H, 4, 1531, 1531, 8, 2, 64, 1, -1, -1, 0, DENSE, 1,
     {700, 0, 1531, 333}, {901, 77, 1531, 250}, 0},
    {"bf16 d128 varlen causal window 300 sinks MQA 8/1 (no keys, no queries)", B, 4, 2047, 2047, 8, 1, 128, 1,
     300, -1, 1, DENSE, 1, {1200, 190, 0, 2047}, {1000, 0, 300, 2047}, 0},
    {"bf16 d96 causal packed qkv s=2000 b=2 h=8", B, 2, 2000, 2000, 8, 8, 96, 1, -1, -1, 0, PACKED, 0, {0}, {0}, 0},
    {"f16 d128 varlen packed qkv GQA 8/2 sinks", H, 3, 1000, 1000, 8, 2, 128, 0, -1, -1, 1, PACKED, 1,
     {1000, 0, 777}, {1000, 0, 777}, 0},
    {"bf16 d64 causal padded strides sq=1500 sk=1800 b=2 GQA 16/4", B, 2, 1500, 1800, 16, 4, 64, 1, -1, -1, 0,
     PADDED, 0, {0}, {0}, 0},
    {"f16 d96 varlen padded strides window 128/128 GQA 8/4", H, 3, 1100, 1300, 8, 4, 96, 0, 128, 128, 0,
     PADDED, 1, {1100, 513, 71}, {1300, 0, 200}, 0},
    /* bucket 128 without causal or window: 80-row query blocks (dQᵀ pieces), last block partial;
     * d96 and d64 / dv128: dQ columns past d inside the bucket */
    {"bf16 d128 sq=1000 sk=3000 GQA 8/2 (80-row blocks)", B, 2, 1000, 3000, 8, 2, 128, 0, -1, -1, 0, DENSE, 0, {0},
     {0}, 0},
    {"f16 d96 s=1500 h=8 (80-row blocks)", H, 1, 1500, 1500, 8, 8, 96, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"bf16 d64 dv128 varlen padded strides MQA 8/1 (80-row blocks)", B, 3, 1100, 1300, 8, 1, 64, 0, -1, -1, 0,
     PADDED, 1, {1100, 513, 71}, {1300, 0, 200}, 128},
    /* causal from 8,192 query rows per sequence: 80-row blocks too */
    {"f16 d128 causal s=8192 GQA 4/2 (80-row blocks)", H, 1, 8192, 8192, 4, 2, 128, 1, -1, -1, 0, DENSE, 0, {0},
     {0}, 0},
    /* bucket 256 (bwd_sm90_hdim256.cu): 64-key CTAs, each consumer 128 head-dim columns */
    {"bf16 d256 s=1024 b=2 h=4", B, 2, 1024, 1024, 4, 4, 256, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"f16 d256 causal sq=700 sk=1500 GQA 4/2", H, 2, 700, 1500, 4, 2, 256, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"bf16 d192 causal sq=1500 sk=600 MQA 4/1 (rows with no key)", B, 1, 1500, 600, 4, 1, 192, 1, -1, -1, 0,
     DENSE, 0, {0}, {0}, 0},
    {"f16 d192 window 200/50 s=1300 GQA 4/2", H, 2, 1300, 1300, 4, 2, 192, 0, 200, 50, 0, DENSE, 0, {0}, {0}, 0},
    /* d ≠ dv across the buckets (MLA's 192 / 128; 64 / 128): the larger bucket's kernel */
    {"bf16 d192 dv128 causal s=2048 b=2 GQA 8/2", B, 2, 2048, 2048, 8, 2, 192, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 128},
    {"f16 d192 dv128 varlen padded strides h=4", H, 3, 1100, 1300, 4, 4, 192, 0, -1, -1, 0, PADDED, 1,
     {1100, 513, 71}, {1300, 0, 200}, 128},
    {"bf16 d64 dv128 window 200/0 sq=1500 sk=2000 h=8", B, 1, 1500, 2000, 8, 8, 64, 0, 200, 0, 0, DENSE, 0, {0},
     {0}, 128},
    /* the 192 / 128 kernel (bwd_sm90_hdim192.cu: 96-key CTAs) with columns past d and dv inside
     * its extents, keys no query sees, empty sequences, query rows with no key */
    {"f16 d160 dv96 causal sq=900 sk=1300 GQA 6/2", H, 2, 900, 1300, 6, 2, 160, 1, -1, -1, 0, DENSE, 0, {0}, {0},
     96},
    {"bf16 d192 dv128 sq=1000 sk=3000 GQA 8/2", B, 2, 1000, 3000, 8, 2, 192, 0, -1, -1, 0, DENSE, 0, {0}, {0},
     128},
    {"bf16 d192 dv128 window left 150 sq=500 sk=1500 (keys no query sees)", B, 1, 500, 1500, 4, 4, 192, 0, 150,
     -1, 0, DENSE, 0, {0}, {0}, 128},
    {"f16 d192 dv128 varlen window 100/100 MQA 4/1 (no keys, no queries)", H, 4, 1023, 1023, 4, 1, 192, 0, 100,
     100, 0, DENSE, 1, {800, 120, 0, 1023}, {600, 0, 200, 1023}, 128},
    {"bf16 d136 dv64 causal sinks sq=1500 sk=600 GQA 4/2 (rows with no key)", B, 1, 1500, 600, 4, 2, 136, 1, -1,
     -1, 1, DENSE, 0, {0}, {0}, 64},
    {"bf16 d256 window left 150 sq=500 sk=1500 (keys no query sees)", B, 1, 500, 1500, 4, 4, 256, 0, 150, -1, 0,
     DENSE, 0, {0}, {0}, 0},
    {"bf16 d256 varlen causal sinks GQA 4/2 (an empty sequence)", B, 4, 1000, 1000, 4, 2, 256, 1, -1, -1, 1,
     DENSE, 1, {600, 0, 1000, 150}, {700, 90, 1000, 130}, 0},
    {"f16 d192 varlen window 100/100 MQA 4/1 (no keys, no queries)", H, 4, 1023, 1023, 4, 1, 192, 0, 100, 100,
     0, DENSE, 1, {800, 120, 0, 1023}, {600, 0, 200, 1023}, 0},
    {"bf16 d256 causal packed qkv s=1200 b=2 h=4", B, 2, 1200, 1200, 4, 4, 256, 1, -1, -1, 0, PACKED, 0, {0},
     {0}, 0},
    {"f16 d192 varlen packed qkv GQA 4/2 sinks", H, 3, 900, 900, 4, 2, 192, 0, -1, -1, 1, PACKED, 1,
     {900, 0, 517}, {900, 0, 517}, 0},
    {"bf16 d256 causal padded strides sq=700 sk=900 GQA 8/2", B, 2, 700, 900, 8, 2, 256, 1, -1, -1, 0, PADDED,
     0, {0}, {0}, 0},
    {"f16 d192 varlen padded strides window 128/128 GQA 4/2", H, 3, 900, 1000, 4, 2, 192, 0, 128, 128, 0,
     PADDED, 1, {900, 413, 71}, {1000, 0, 200}, 0},
    /* bucket 512 (bwd_sm90_hdim256.cu's CTA pairs, 256 head-dim columns each) */
    {"bf16 d512 s=1024 b=2 h=4", B, 2, 1024, 1024, 4, 4, 512, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"f16 d512 causal sq=700 sk=1500 GQA 4/2", H, 2, 700, 1500, 4, 2, 512, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"bf16 d384 dv256 varlen padded strides window 128/128 GQA 4/2", B, 3, 900, 1000, 4, 2, 384, 0, 128, 128, 0,
     PADDED, 1, {900, 413, 71}, {1000, 0, 200}, 256},
    {"f16 d320 dv512 varlen causal sinks MQA 4/1 (an empty sequence)", H, 4, 1000, 1000, 4, 1, 320, 1, -1, -1, 1,
     DENSE, 1, {600, 0, 1000, 150}, {700, 90, 1000, 130}, 512},
    {"bf16 d512 causal packed qkv s=1000 b=2 h=2", B, 2, 1000, 1000, 2, 2, 512, 1, -1, -1, 0, PACKED, 0, {0},
     {0}, 0},
};
/* The same kinds, small enough for compute-sanitizer (still several query blocks per key block). */
static const bwd_case small_cases[] = {
    {"small f16 d64 varlen causal GQA 4/2", H, 4, 131, 131, 4, 2, 64, 1, -1, -1, 0, DENSE, 1,
     {70, 0, 131, 33}, {91, 7, 131, 25}, 0},
    {"small bf16 d128 varlen causal window 40 sinks MQA 4/1", B, 4, 200, 200, 4, 1, 128, 1, 40, -1, 1, DENSE, 1,
     {120, 19, 0, 200}, {100, 0, 30, 200}, 0},
    {"small bf16 d192 dv128 varlen causal GQA 4/2", B, 4, 131, 131, 4, 2, 192, 1, -1, -1, 0, DENSE, 1,
     {70, 0, 131, 33}, {91, 7, 131, 25}, 128},
    {"small bf16 d96 causal packed qkv s=200 b=2 h=4", B, 2, 200, 200, 4, 4, 96, 1, -1, -1, 0, PACKED, 0, {0},
     {0}, 0},
    {"small bf16 d64 causal sq=400 sk=130 GQA 4/2 (query blocks with no key)", B, 2, 400, 130, 4, 2, 64, 1, -1, -1,
     0, DENSE, 0, {0}, {0}, 0},
    {"small f16 d128 padded strides window 50/20 sq=150 sk=300 GQA 4/2", H, 1, 150, 300, 4, 2, 128, 0, 50, 20,
     0, PADDED, 0, {0}, {0}, 0},
    {"small bf16 d256 varlen causal sinks GQA 4/2", B, 4, 131, 131, 4, 2, 256, 1, -1, -1, 1, DENSE, 1,
     {70, 0, 131, 33}, {91, 7, 131, 25}, 0},
    {"small f16 d192 padded strides window 50/20 sq=150 sk=300 GQA 4/2", H, 1, 150, 300, 4, 2, 192, 0, 50, 20,
     0, PADDED, 0, {0}, {0}, 0},
    {"small f16 d192 dv128 padded strides window 50/20 sq=150 sk=300 GQA 4/2", H, 1, 150, 300, 4, 2, 192, 0, 50,
     20, 0, PADDED, 0, {0}, {0}, 128},
    {"small bf16 d176 dv112 varlen sinks MQA 4/1 (an empty sequence)", B, 4, 200, 200, 4, 1, 176, 0, -1, -1, 1,
     DENSE, 1, {120, 0, 200, 33}, {100, 19, 200, 131}, 112},
    {"small bf16 d256 causal packed qkv s=200 b=2 h=2", B, 2, 200, 200, 2, 2, 256, 1, -1, -1, 0, PACKED, 0, {0},
     {0}, 0},
    /* non-causal without a window: rotated query walks (fewer query than key blocks: not rotated) */
    {"small bf16 d128 varlen GQA 4/2 (rotated walks)", B, 4, 260, 260, 4, 2, 128, 0, -1, -1, 0, DENSE, 1,
     {260, 131, 0, 77}, {200, 260, 5, 77}, 0},
    {"small f16 d96 sq=170 sk=300 GQA 4/2 (80-row blocks)", H, 1, 170, 300, 4, 2, 96, 0, -1, -1, 0, DENSE, 0, {0},
     {0}, 0},
    {"small bf16 d64 dv128 varlen padded strides (80-row blocks)", B, 3, 250, 250, 2, 2, 64, 0, -1, -1, 0, PADDED,
     1, {250, 81, 7}, {200, 0, 250}, 128},
    {"small f16 d64 sq=300 sk=170 (rotated walks)", H, 2, 300, 170, 4, 4, 64, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"small bf16 d256 sq=200 sk=330 GQA 4/2 (rotated walks)", B, 2, 200, 330, 4, 2, 256, 0, -1, -1, 0, DENSE, 0,
     {0}, {0}, 0},
    {"small bf16 d512 varlen causal sinks GQA 4/2", B, 4, 131, 131, 4, 2, 512, 1, -1, -1, 1, DENSE, 1,
     {70, 0, 131, 33}, {91, 7, 131, 25}, 0},
    {"small f16 d448 dv128 padded strides window 50/20 sq=150 sk=300", H, 1, 150, 300, 2, 2, 448, 0, 50, 20, 0,
     PADDED, 0, {0}, {0}, 128},
};
/* softcap (and the negative-scale dispatch): the case, then softcap, q amplitude, softmax_scale */
static const softcap_case big_softcap_cases[] = {
    {{"bf16 d128 softcap 30 s=2048 b=2 h=8", B, 2, 2048, 2048, 8, 8, 128, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"f16 d64 softcap 20 causal sq=1500 sk=1800 GQA 8/2", H, 2, 1500, 1800, 8, 2, 64, 1, -1, -1, 0, DENSE, 0, {0},
      {0}, 0},
     {20.0f, 8.0f, 0.0f, 0}},
    {{"bf16 d64 softcap 30 causal sq=3000 sk=1100 MQA 8/1 (rows with no key)", B, 1, 3000, 1100, 8, 1, 64, 1, -1,
      -1, 0, DENSE, 0, {0}, {0}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"bf16 d96 softcap 50 window 256/64 s=2000 GQA 8/2", B, 2, 2000, 2000, 8, 2, 96, 0, 256, 64, 0, DENSE, 0, {0},
      {0}, 0},
     {50.0f, 20.0f, 0.0f, 0}},
    {{"f16 d128 softcap 30 varlen causal sinks MQA 8/1 (an empty sequence)", H, 4, 1531, 1531, 8, 1, 128, 1, -1, -1,
      1, DENSE, 1, {700, 0, 1531, 333}, {901, 77, 1531, 250}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"bf16 d64 softcap 25 varlen padded strides window 128/128 GQA 8/4", B, 3, 1100, 1300, 8, 4, 64, 0, 128, 128,
      0, PADDED, 1, {1100, 513, 71}, {1300, 0, 200}, 0},
     {25.0f, 10.0f, 0.0f, 0}},
    {{"f16 d128 softcap 40 causal packed qkv s=1500 b=2 h=8", H, 2, 1500, 1500, 8, 8, 128, 1, -1, -1, 0, PACKED, 0,
      {0}, {0}, 0},
     {40.0f, 15.0f, 0.0f, 0}},
    {{"bf16 d256 softcap 30 causal sq=700 sk=1500 GQA 4/2", B, 2, 700, 1500, 4, 2, 256, 1, -1, -1, 0, DENSE, 0, {0},
      {0}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"f16 d192 softcap 50 varlen window 100/100 MQA 4/1 (no keys, no queries)", H, 4, 1023, 1023, 4, 1, 192, 0,
      100, 100, 0, DENSE, 1, {800, 120, 0, 1023}, {600, 0, 200, 1023}, 0},
     {50.0f, 20.0f, 0.0f, 0}},
    {{"bf16 d256 softcap 20 packed qkv sinks s=1000 b=2 h=4", B, 2, 1000, 1000, 4, 4, 256, 0, -1, -1, 1, PACKED, 0,
      {0}, {0}, 0},
     {20.0f, 8.0f, 0.0f, 0}},
    {{"bf16 d128 causal softmax_scale -0.09", B, 1, 1000, 1000, 4, 4, 128, 1, -1, -1, 0, DENSE,
      0, {0}, {0}, 0},
     {0.0f, 0.0f, -0.09f, 0}},
    {{"f16 d64 softcap 30 softmax_scale -0.125 causal (portable both runs)", H, 1, 1000, 1000, 4, 2, 64, 1, -1, -1,
      0, DENSE, 0, {0}, {0}, 0},
     {30.0f, 10.0f, -0.125f, 0}},
    /* ALiBi: the exponent's slope term, then the mask */
    {{"bf16 d128 causal ALiBi s=2048 b=2 GQA 8/2", B, 2, 2048, 2048, 8, 2, 128, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
     {0.0f, 0.0f, 0.0f, 1}},
    {{"f16 d64 ALiBi (batch x head) window 300/100 sinks sq=1500 sk=2200", H, 2, 1500, 2200, 8, 8, 64, 0, 300, 100,
      1, DENSE, 0, {0}, {0}, 0},
     {0.0f, 0.0f, 0.0f, 2}},
    {{"bf16 d256 varlen causal ALiBi GQA 4/2 (an empty sequence)", B, 4, 1000, 1000, 4, 2, 256, 1, -1, -1, 0, DENSE,
      1, {1000, 0, 777, 301}, {1000, 0, 900, 301}, 0},
     {0.0f, 0.0f, 0.0f, 1}},
    {{"bf16 d128 ALiBi softmax_scale -0.1 s=1500 h=8", B, 1, 1500, 1500, 8, 8, 128, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
     {0.0f, 0.0f, -0.1f, 1}},
    {{"f16 d128 ALiBi softcap 30 causal (portable both runs)", H, 1, 1000, 1000, 4, 4, 128, 1, -1, -1, 0, DENSE, 0,
      {0}, {0}, 0},
     {30.0f, 10.0f, 0.0f, 1}},
    {{"bf16 d512 softcap 30 causal sq=700 sk=1500 GQA 4/2", B, 2, 700, 1500, 4, 2, 512, 1, -1, -1, 0, DENSE, 0, {0},
      {0}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"f16 d512 ALiBi softmax_scale -0.05 window 300/100 s=1200", H, 1, 1200, 1200, 4, 4, 512, 0, 300, 100, 0, DENSE,
      0, {0}, {0}, 0},
     {0.0f, 0.0f, -0.05f, 2}},
};
static const softcap_case small_softcap_cases[] = {
    {{"small bf16 d128 varlen causal ALiBi GQA 4/2", B, 4, 131, 131, 4, 2, 128, 1, -1, -1, 0, DENSE, 1,
      {70, 0, 131, 33}, {91, 7, 131, 25}, 0},
     {0.0f, 0.0f, 0.0f, 1}},
    {{"small f16 d256 ALiBi softmax_scale -0.08 window 40/10 sq=150 sk=200", H, 1, 150, 200, 4, 4, 256, 0, 40, 10, 0,
      DENSE, 0, {0}, {0}, 0},
     {0.0f, 0.0f, -0.08f, 2}},
    {{"small bf16 d64 softcap 30 varlen causal GQA 4/2", B, 4, 131, 131, 4, 2, 64, 1, -1, -1, 0, DENSE, 1,
      {70, 0, 131, 33}, {91, 7, 131, 25}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"small f16 d128 softcap 20 padded strides window 50/20 sq=150 sk=300 GQA 4/2", H, 1, 150, 300, 4, 2, 128, 0,
      50, 20, 0, PADDED, 0, {0}, {0}, 0},
     {20.0f, 8.0f, 0.0f, 0}},
    {{"small f16 d96 softcap 50 causal packed qkv s=200 b=2 h=4", H, 2, 200, 200, 4, 4, 96, 1, -1, -1, 0, PACKED, 0,
      {0}, {0}, 0},
     {50.0f, 20.0f, 0.0f, 0}},
    {{"small bf16 d256 softcap 30 varlen causal sinks GQA 4/2", B, 4, 131, 131, 4, 2, 256, 1, -1, -1, 1, DENSE, 1,
      {70, 0, 131, 33}, {91, 7, 131, 25}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
    {{"small f16 d512 softcap 30 causal sq=150 sk=200", H, 1, 150, 200, 2, 2, 512, 1, -1, -1, 0, DENSE, 0,
      {0}, {0}, 0},
     {30.0f, 10.0f, 0.0f, 0}},
};
/* Deterministic mode: key-block chains longer than one wave of the grid (132 SMs), in every
 * head-dim kernel; each dQ tile then gets 32-171 ordered additions. */
static const bwd_case det_cases[] = {
    {"det bf16 d128 s=8192 h=16", B, 1, 8192, 8192, 16, 16, 128, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"det f16 d128 causal s=8192 GQA 16/4", H, 1, 8192, 8192, 16, 4, 128, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"det bf16 d64 causal s=4096 b=2 h=16", B, 2, 4096, 4096, 16, 16, 64, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"det bf16 d256 causal s=4096 GQA 8/2", B, 1, 4096, 4096, 8, 2, 256, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"det bf16 d192 dv128 s=4096 h=8", B, 1, 4096, 4096, 8, 8, 192, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 128},
    {"det bf16 d192 dv128 causal s=16384 h=2", B, 1, 16384, 16384, 2, 2, 192, 1, -1, -1, 0, DENSE, 0, {0}, {0},
     128},
    {"det bf16 d512 causal s=4096 GQA 4/2", B, 1, 4096, 4096, 4, 2, 512, 1, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"det f16 d512 s=4096 h=4", H, 1, 4096, 4096, 4, 4, 512, 0, -1, -1, 0, DENSE, 0, {0}, {0}, 0},
    {"det f16 d128 varlen causal window 1000 GQA 8/2", H, 3, 6000, 6000, 8, 2, 128, 1, 1000, -1, 0, DENSE, 1,
     {6000, 2500, 4100}, {6000, 2000, 4500}, 0},
};
#undef B
#undef H
#undef DENSE
#undef PACKED
#undef PADDED

int gpu_bwd_paths_main(int argc, char **argv) {
    const score_options plain = {0.0f, 0.0f, 0.0f, 0};
    int small = 0;
    for (int a = 1; a < argc; ++a) {
        if (strcmp(argv[a], "small") == 0)
            small = 1;
        else if (strcmp(argv[a], "det") == 0)
            deterministic_mode = 1;
        else {
            printf("usage: fa_gpu_bwd_paths [small] [det]\n");
            return 2;
        }
    }
    const bwd_case *cases = small ? small_cases : big_cases;
    const int n = small ? (int)(sizeof small_cases / sizeof small_cases[0]) : (int)(sizeof big_cases / sizeof big_cases[0]);
    const softcap_case *sc_cases = small ? small_softcap_cases : big_softcap_cases;
    const int n_sc = small ? (int)(sizeof small_softcap_cases / sizeof small_softcap_cases[0])
                           : (int)(sizeof big_softcap_cases / sizeof big_softcap_cases[0]);
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        printf("fa_gpu_bwd_paths: no CUDA device\n");
        return 1;
    }
    printf("fa_gpu_bwd_paths: %s (cc %d.%d)%s\n", prop.name, prop.major, prop.minor,
           prop.major == 9 && prop.minor == 0 ? ""
                                              : ": no Hopper backward here, both runs use the portable kernel");
    printf("per tensor: max|default - portable| / max|portable| = ratio\n");
    printf("%s\n", deterministic_mode ? "deterministic = 1: dq, dk, dv must repeat bitwise over 3 default runs"
                                       : "deterministic = 0");
    int fails = 0, total = n + n_sc;
    for (int i = 0; i < n; ++i) {
        fails += run_case(&cases[i], &plain);
        fflush(stdout); /* under a timeout, the last line names a case that hung */
    }
    for (int i = 0; i < n_sc; ++i) {
        fails += run_case(&sc_cases[i].c, &sc_cases[i].scores);
        fflush(stdout);
    }
    if (deterministic_mode && !small) {
        total += (int)(sizeof det_cases / sizeof det_cases[0]);
        for (int i = 0; i < (int)(sizeof det_cases / sizeof det_cases[0]); ++i) {
            fails += run_case(&det_cases[i], &plain);
            fflush(stdout);
        }
    }
    printf("fa_gpu_bwd_paths: %d passed, %d failed\n", total - fails, fails);
    return fails ? 1 : 0;
}
