/*
 * test_reference.c: the oracle proves itself before it judges the library.
 *
 *   - dtype conversion: exhaustive round trips, round-to-nearest-even against neighbours;
 *   - the float64 forward against an independent naive version written from the header's
 *     mask text (causal and window not folded), and against a hand-computed example;
 *   - the float64 backward against central finite differences of L = Σ dout ∘ O, for every
 *     feature (softcap, ALiBi, sinks, GQA, window, causal with empty rows, varlen);
 *   - the baseline has the error of its dtype;
 *   - the comparison machinery flags unwritten, clobbered and wrong elements.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ---- dtype conversion ------------------------------------------------------------------- */

FA_TEST(reference_f16_round_trip_exhaustive) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = fa_test_f16_to_f32((uint16_t)h);
        if (isnan(x)) {
            bad += !isnan(fa_test_f16_to_f32(fa_test_f32_to_f16(x)));
            continue;
        }
        bad += fa_test_f32_to_f16(x) != h;
    }
    FA_CHECK(bad == 0, "%d f16 values do not survive f16 -> f32 -> f16", bad);
    FA_CHECK(fa_test_f16_to_f32(0x3c00) == 1.0f && fa_test_f16_to_f32(0x7bff) == 65504.0f &&
                 fa_test_f16_to_f32(0x0001) == 0x1p-24f && fa_test_f16_to_f32(0xc000) == -2.0f,
             "f16 decoding of known values");
}

FA_TEST(reference_bf16_round_trip_exhaustive) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = fa_test_bf16_to_f32((uint16_t)h);
        if (isnan(x)) {
            bad += !isnan(fa_test_bf16_to_f32(fa_test_f32_to_bf16(x)));
            continue;
        }
        bad += fa_test_f32_to_bf16(x) != h;
    }
    FA_CHECK(bad == 0, "%d bf16 values do not survive bf16 -> f32 -> bf16", bad);
}

/* Is h the correctly rounded (nearest, ties to even) encoding of x? Checked against the two
 * neighbouring encodings of the same sign. */
static int is_nearest_even(float x, uint16_t h, float (*decode)(uint16_t), uint16_t inf_bits) {
    float y = decode(h);
    uint16_t sign = h & 0x8000u, magnitude = h & 0x7fffu;
    if (isinf(y)) { /* must be beyond the halfway point above the largest finite value */
        float largest = decode((uint16_t)(sign | (inf_bits - 1)));
        float next_up = 2.0f * largest - decode((uint16_t)(sign | (inf_bits - 2)));
        double halfway = 0.5 * ((double)largest + (double)next_up);
        return fabs((double)x) >= fabs(halfway);
    }
    double error = fabs((double)y - (double)x);
    for (int step = -1; step <= 1; step += 2) {
        int neighbour = (int)magnitude + step;
        if (neighbour < 0 || neighbour >= inf_bits) continue;
        double other = fabs((double)decode((uint16_t)(sign | neighbour)) - (double)x);
        if (other < error) return 0;
        if (other == error && (magnitude & 1u)) return 0; /* a tie must pick the even one */
    }
    return 1;
}

FA_TEST(reference_round_to_nearest_even) {
    fa_test_rng rng;
    fa_test_rng_seed(&rng, 7);
    int bad16 = 0, bad_bf = 0;
    for (int n = 0; n < 400000; n++) {
        /* random bit patterns over the f16 range and beyond, plus exact ties */
        uint32_t bits = (uint32_t)fa_test_rng_next(&rng);
        float x;
        if (n % 4 == 0) {
            uint16_t h = (uint16_t)(bits & 0x7bffu);
            float a = fa_test_f16_to_f32(h), b = fa_test_f16_to_f32((uint16_t)(h + 1));
            x = 0.5f * (a + b); /* exact midpoint (representable in f32) */
        } else {
            uint32_t exponent = 96u + (bits >> 24) % 56u; /* 2^-31 .. 2^24 */
            bits = (bits & 0x807fffffu) | (exponent << 23);
            memcpy(&x, &bits, sizeof x);
        }
        bad16 += !is_nearest_even(x, fa_test_f32_to_f16(x), fa_test_f16_to_f32, 0x7c00u);
        bad_bf += !is_nearest_even(x, fa_test_f32_to_bf16(x), fa_test_bf16_to_f32, 0x7f80u);
    }
    FA_CHECK(bad16 == 0, "%d f32 -> f16 conversions are not round-to-nearest-even", bad16);
    FA_CHECK(bad_bf == 0, "%d f32 -> bf16 conversions are not round-to-nearest-even", bad_bf);
    FA_CHECK(fa_test_f32_to_f16(65519.0f) == 0x7bffu && fa_test_f32_to_f16(65520.0f) == 0x7c00u,
             "f16 overflow threshold");
    FA_CHECK(fa_test_f32_to_f16(0x1p-25f) == 0 && fa_test_f32_to_f16(0x1.000002p-25f) == 1,
             "f16 subnormal rounding at half the smallest subnormal");
    FA_CHECK(fa_test_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00u &&
                 fa_test_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02u,
             "f16 ties to even");
    FA_CHECK(fa_test_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80u &&
                 fa_test_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82u,
             "bf16 ties to even");
    FA_CHECK(isnan(fa_test_f16_to_f32(fa_test_f32_to_f16(NAN))) &&
                 isnan(fa_test_bf16_to_f32(fa_test_f32_to_bf16(NAN))),
             "NaN stays NaN");
}

/* ---- forward: independent naive version ----------------------------------------------- */

/* Straight from flashattn.h: causal: j <= i + shift; window: i + shift - left <= j <=
 * i + shift + right (negative side unbounded); both intersect. */
static int naive_visible(const fa_params *p, int64_t i, int64_t j, int64_t lq, int64_t lk) {
    int64_t shift = lk - lq;
    if (p->causal && j > i + shift) return 0;
    if (p->use_window) {
        if (p->window_left >= 0 && j < i + shift - p->window_left) return 0;
        if (p->window_right >= 0 && j > i + shift + p->window_right) return 0;
    }
    return 1;
}

/* max |naive - ref64| over o (relative to max|o|) and lse for problem p (host, any layout). */
static void naive_vs_oracle(const fa_test_problem *tp, double *o_err, double *lse_err) {
    const fa_params *p = &tp->params;
    fa_ref_gathered g;
    fa_ref_outputs out;
    *o_err = *lse_err = INFINITY;
    if (fa_ref_gather(p, &g)) return;
    if (fa_ref_outputs_alloc(&g.rp, 0, &out)) {
        fa_ref_gathered_free(&g);
        return;
    }
    fa_ref64_run(&g.rp, 0, &out);
    int64_t dv = p->head_dim_v ? p->head_dim_v : p->head_dim, group = p->heads_q / p->heads_kv;
    double scale = p->softmax_scale ? p->softmax_scale : 1.0 / sqrt((double)p->head_dim);
    double worst_o = 0, worst_lse = 0;
    double *s = malloc(sizeof(double) * (size_t)(p->seqlen_k + 1));
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t q0 = p->cu_seqlens_q ? p->cu_seqlens_q[b] : 0, k0 = p->cu_seqlens_k ? p->cu_seqlens_k[b] : 0;
        int64_t lq = p->cu_seqlens_q ? p->cu_seqlens_q[b + 1] - q0 : p->seqlen_q;
        int64_t lk = p->cu_seqlens_k ? p->cu_seqlens_k[b + 1] - k0 : p->seqlen_k;
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < lq; i++) {
                int64_t qa = p->cu_seqlens_q ? (q0 + i) * p->q_row_stride
                                             : b * p->q_batch_stride + i * p->q_row_stride;
                qa += h * p->q_head_stride;
                double denominator = p->sink_logits ? exp(p->sink_logits[h]) : 0.0;
                double numerator[FA_MAX_HEAD_DIM] = {0};
                for (int64_t j = 0; j < lk; j++) {
                    if (!naive_visible(p, i, j, lq, lk)) continue;
                    int64_t ka = p->cu_seqlens_k ? (k0 + j) * p->k_row_stride
                                                 : b * p->k_batch_stride + j * p->k_row_stride;
                    int64_t va = p->cu_seqlens_k ? (k0 + j) * p->v_row_stride
                                                 : b * p->v_batch_stride + j * p->v_row_stride;
                    ka += (h / group) * p->k_head_stride;
                    va += (h / group) * p->v_head_stride;
                    double dot = 0;
                    for (int64_t c = 0; c < p->head_dim; c++)
                        dot += fa_test_load(p->q, p->dtype, qa + c) * fa_test_load(p->k, p->dtype, ka + c);
                    s[j] = scale * dot;
                    if (p->softcap > 0) s[j] = p->softcap * tanh(s[j] / p->softcap);
                    if (p->alibi_slopes)
                        s[j] += -p->alibi_slopes[b * p->alibi_batch_stride + h] * fabs((double)(i + lk - lq - j));
                    double w = exp(s[j]);
                    denominator += w;
                    for (int64_t c = 0; c < dv; c++) numerator[c] += w * fa_test_load(p->v, p->dtype, va + c);
                }
                int64_t lse_at = p->cu_seqlens_q ? h * p->total_q + q0 + i : (b * p->heads_q + h) * p->seqlen_q + i;
                double lse = denominator > 0 ? log(denominator) : -INFINITY;
                double ref_lse = out.lse[lse_at];
                if (isinf(lse) || isinf(ref_lse))
                    worst_lse = fmax(worst_lse, lse == ref_lse ? 0.0 : INFINITY);
                else
                    worst_lse = fmax(worst_lse, fabs(lse - ref_lse));
                for (int64_t c = 0; c < dv; c++) {
                    double o = denominator > 0 ? numerator[c] / denominator : 0.0;
                    double ref = out.o[((q0 + (p->cu_seqlens_q ? 0 : b * p->seqlen_q) + i) * p->heads_q + h) * dv + c];
                    worst_o = fmax(worst_o, fabs(o - ref));
                }
            }
    }
    free(s);
    *o_err = worst_o;
    *lse_err = worst_lse;
    fa_ref_outputs_free(&out);
    fa_ref_gathered_free(&g);
}

FA_TEST(reference_forward_matches_naive) {
    /* small scores (|s| <~ 10): the naive exp without max subtraction is exact enough */
    struct {
        const char *name;
        int causal, use_window, left, right, alibi, sinks, varlen, layout;
        float softcap, scale;
    } cases[] = {
        {"plain", 0, 0, 0, 0, 0, 0, 0, FA_TEST_LAYOUT_PADDED, 0, 0},
        {"causal", 1, 0, 0, 0, 0, 0, 0, FA_TEST_LAYOUT_BHSD, 0, 0},
        {"window", 0, 1, 3, 1, 0, 0, 0, FA_TEST_LAYOUT_PADDED, 0, 0},
        {"window-left", 0, 1, 2, -1, 0, 0, 0, FA_TEST_LAYOUT_CONTIGUOUS, 0, 0},
        {"causal+window-right", 1, 1, 4, 3, 0, 0, 0, FA_TEST_LAYOUT_PADDED, 0, 0},
        {"softcap", 0, 0, 0, 0, 0, 0, 0, FA_TEST_LAYOUT_PADDED, 0.8f, 0.9f},
        {"alibi", 1, 0, 0, 0, FA_TEST_ALIBI_BATCH_HEAD, 0, 0, FA_TEST_LAYOUT_PADDED, 0, 0},
        {"sinks", 1, 0, 0, 0, FA_TEST_ALIBI_HEAD, 1, 0, FA_TEST_LAYOUT_PADDED, 0, 0},
        {"varlen", 1, 1, 3, -1, FA_TEST_ALIBI_BATCH_HEAD, 1, 1, FA_TEST_LAYOUT_PADDED, 1.5f, 0},
        {"packed", 1, 0, 0, 0, 0, 1, 1, FA_TEST_LAYOUT_PACKED_QKV, 0, 0},
    };
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        for (int shape = 0; shape < 3; shape++) {
            static const int64_t sq[3] = {9, 4, 7}, sk[3] = {5, 11, 7};
            fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 3, sq[shape], sk[shape], 4, 2, 5);
            spec.head_dim_v = 3;
            if (cases[n].layout == FA_TEST_LAYOUT_PACKED_QKV) spec.head_dim_v = 5;
            spec.causal = cases[n].causal;
            spec.use_window = cases[n].use_window;
            spec.window_left = cases[n].left;
            spec.window_right = cases[n].right;
            spec.alibi = (fa_test_alibi)cases[n].alibi;
            spec.sinks = cases[n].sinks;
            spec.varlen = cases[n].varlen;
            spec.layout = (fa_test_layout)cases[n].layout;
            spec.softcap = cases[n].softcap;
            spec.softmax_scale = cases[n].scale;
            spec.backward = 0;
            fa_test_problem tp;
            if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem %s", cases[n].name)) continue;
            double o_err, lse_err;
            naive_vs_oracle(&tp, &o_err, &lse_err);
            FA_CHECK(o_err < 1e-12 && lse_err < 1e-12, "%s shape %d: naive vs oracle: o %.3e lse %.3e",
                     cases[n].name, shape, o_err, lse_err);
            fa_test_problem_destroy(&tp);
        }
    }
}

/* One query, two keys, d = 1, scale 1, ALiBi slope 0.5, causal (sq < sk): both keys visible.
 * s0 = 1·1 - 0.5·|0 + 1 - 0| = 0.5, s1 = 1·2 - 0 = 2. With a sink t = 1 also in the sum. */
FA_TEST(reference_hand_computed_example) {
    float q[1] = {1.0f}, k[2] = {1.0f, 2.0f}, v[2] = {1.0f, 3.0f}, o[1] = {NAN}, lse[1] = {NAN};
    float slope[1] = {0.5f}, sink[1] = {1.0f};
    fa_params p = {0};
    p.dtype = FA_DTYPE_F32;
    p.batch = 1;
    p.seqlen_q = 1;
    p.seqlen_k = 2;
    p.heads_q = p.heads_kv = 1;
    p.head_dim = 1;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.softmax_scale = 1.0f;
    p.causal = 1;
    p.alibi_slopes = slope;
    fa_set_contiguous_strides(&p);
    double e0 = exp(0.5), e1 = exp(2.0), et = exp(1.0);
    for (int with_sink = 0; with_sink < 2; with_sink++) {
        p.sink_logits = with_sink ? sink : NULL;
        double denominator = e0 + e1 + (with_sink ? et : 0.0);
        double want_o = (e0 * 1.0 + e1 * 3.0) / denominator, want_lse = log(denominator);
        fa_ref_gathered g;
        fa_ref_outputs out;
        if (!FA_CHECK(fa_ref_gather(&p, &g) == 0 && fa_ref_outputs_alloc(&g.rp, 0, &out) == 0, "alloc")) return;
        fa_ref64_run(&g.rp, 0, &out);
        FA_CHECK(fabs(out.o[0] - want_o) < 1e-15 && fabs(out.lse[0] - want_lse) < 1e-15,
                 "oracle (sink %d): o %.17g want %.17g, lse %.17g want %.17g", with_sink, out.o[0],
                 want_o, out.lse[0], want_lse);
        fa_ref_outputs_free(&out);
        fa_ref_gathered_free(&g);
        fa_status st = fa_forward(&p);
        FA_CHECK(st == FA_OK, "fa_forward: %s %s", fa_strerror(st), fa_last_error());
        FA_CHECK(fabs(o[0] - want_o) < 4e-7 && fabs(lse[0] - want_lse) < 4e-7,
                 "library (sink %d): o %.9g want %.9g, lse %.9g want %.9g", with_sink, (double)o[0],
                 want_o, (double)lse[0], want_lse);
    }
}

/* ---- backward: finite differences ------------------------------------------------------- */

typedef struct fd_problem {
    fa_ref_problem rp;
    double *q, *k, *v, *dout, *slopes, *sinks;
    int32_t cu_q[8], cu_k[8];
} fd_problem;

static double *random_array(fa_test_rng *rng, int64_t n, double offset) {
    double *a = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) a[i] = fa_test_rng_normal(rng) + offset;
    return a;
}

static double loss(const fd_problem *fp) { /* L = Σ dout ∘ O */
    fa_ref_outputs out;
    fa_ref_outputs_alloc(&fp->rp, 0, &out);
    fa_ref64_run(&fp->rp, 0, &out);
    double sum = 0;
    for (int64_t n = 0; n < fp->rp.rows_q * fp->rp.heads_q * fp->rp.head_dim_v; n++)
        sum += fp->dout[n] * out.o[n];
    fa_ref_outputs_free(&out);
    return sum;
}

/* Worst |finite difference - analytic| over every element of `param` (n elements). */
static double fd_worst(fd_problem *fp, double *param, int64_t n, const double *analytic,
                       double *worst_scale) {
    const double h = 1e-5;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double saved = param[i];
        param[i] = saved + h;
        double up = loss(fp);
        param[i] = saved - h;
        double down = loss(fp);
        param[i] = saved;
        double fd = (up - down) / (2 * h);
        worst = fmax(worst, fabs(fd - analytic[i]));
        *worst_scale = fmax(*worst_scale, fabs(analytic[i]));
    }
    return worst;
}

typedef struct fd_config {
    const char *name;
    int64_t batch, sq, sk, hq, hkv, d, dv;
    int varlen, causal, alibi, sinks;
    int64_t left, right; /* effective window, -1 unbounded */
    double softcap;
    float dropout_p; /* 0 = off; the mask's seed comes from the test seed */
} fd_config;

static void run_fd(const fd_config *c, uint64_t seed) {
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    fd_problem fp;
    memset(&fp, 0, sizeof fp);
    fa_ref_problem *rp = &fp.rp;
    rp->batch = c->batch;
    rp->seqlen_q = c->sq;
    rp->seqlen_k = c->sk;
    rp->heads_q = c->hq;
    rp->heads_kv = c->hkv;
    rp->head_dim = c->d;
    rp->head_dim_v = c->dv;
    rp->scale = 0.8;
    rp->softcap = c->softcap;
    rp->window_left = c->left;
    rp->window_right = c->causal ? 0 : c->right;
    rp->dropout_p = c->dropout_p;
    rp->dropout_seed = seed * 0x9e3779b97f4a7c15ull;
    rp->dropout_offset = seed;
    if (c->varlen) { /* lengths with an empty query and an empty key sequence */
        static const int32_t lq[3] = {3, 0, 2}, lk[3] = {2, 3, 0};
        fp.cu_q[0] = fp.cu_k[0] = 0;
        for (int b = 0; b < 3; b++) {
            fp.cu_q[b + 1] = fp.cu_q[b] + lq[b];
            fp.cu_k[b + 1] = fp.cu_k[b] + lk[b];
        }
        rp->batch = 3;
        rp->seqlen_q = 3;
        rp->seqlen_k = 3;
        rp->cu_seqlens_q = fp.cu_q;
        rp->cu_seqlens_k = fp.cu_k;
        rp->rows_q = fp.cu_q[3] + 1; /* one unused row */
        rp->rows_k = fp.cu_k[3];
    } else {
        rp->rows_q = c->batch * c->sq;
        rp->rows_k = c->batch * c->sk;
    }
    fp.q = random_array(&rng, rp->rows_q * c->hq * c->d, 0.0);
    fp.k = random_array(&rng, rp->rows_k * c->hkv * c->d, 0.0);
    fp.v = random_array(&rng, rp->rows_k * c->hkv * c->dv, 0.5);
    fp.dout = random_array(&rng, rp->rows_q * c->hq * c->dv, 0.5);
    rp->q = fp.q;
    rp->k = fp.k;
    rp->v = fp.v;
    rp->dout = fp.dout;
    if (c->alibi) {
        fp.slopes = random_array(&rng, rp->batch * c->hq, 0.0);
        for (int64_t i = 0; i < rp->batch * c->hq; i++) fp.slopes[i] = 0.1 + 0.3 * fabs(fp.slopes[i]);
        rp->slopes = fp.slopes;
    }
    if (c->sinks) {
        fp.sinks = random_array(&rng, c->hq, 0.5);
        rp->sinks = fp.sinks;
    }
    fa_ref_outputs grad;
    fa_ref_outputs_alloc(rp, 1, &grad);
    fa_ref64_run(rp, 1, &grad);
    double scale = 0;
    double err_q = fd_worst(&fp, fp.q, rp->rows_q * c->hq * c->d, grad.dq, &scale);
    double err_k = fd_worst(&fp, fp.k, rp->rows_k * c->hkv * c->d, grad.dk, &scale);
    double err_v = fd_worst(&fp, fp.v, rp->rows_k * c->hkv * c->dv, grad.dv, &scale);
    double err_sink = c->sinks ? fd_worst(&fp, fp.sinks, c->hq, grad.dsink, &scale) : 0.0;
    /* central differences with h = 1e-5 in double: truncation ~h²·L''' and rounding ~1e-16/h,
     * both ~1e-10 here; a wrong term in a gradient is off by O(0.01) or more */
    double tol = 1e-7 * fmax(1.0, scale);
    FA_CHECK(err_q < tol && err_k < tol && err_v < tol && err_sink < tol,
             "%s: |fd - analytic| dq %.2e dk %.2e dv %.2e dsink %.2e (tol %.1e, max|grad| %.2f)",
             c->name, err_q, err_k, err_v, err_sink, tol, scale);
    FA_CHECK(scale > 0.05, "%s: gradients are all ~0 (max %.3e): the check would prove nothing",
             c->name, scale);
    fa_ref_outputs_free(&grad);
    free(fp.q);
    free(fp.k);
    free(fp.v);
    free(fp.dout);
    free(fp.slopes);
    free(fp.sinks);
}

FA_TEST(reference_backward_finite_differences) {
    static const fd_config configs[] = {
        /* name            b sq sk hq hkv d dv varlen causal alibi sinks left right softcap dropout */
        {"plain",          2, 3, 4, 2, 2, 3, 2, 0, 0, 0, 0, -1, -1, 0, 0},
        {"gqa",            1, 3, 4, 4, 2, 3, 3, 0, 0, 0, 0, -1, -1, 0, 0},
        {"mqa",            1, 2, 3, 3, 1, 2, 4, 0, 0, 0, 0, -1, -1, 0, 0},
        {"causal sq<sk",   1, 3, 5, 2, 1, 3, 2, 0, 1, 0, 0, -1, -1, 0, 0},
        {"causal sq>sk",   2, 5, 3, 2, 1, 3, 2, 0, 1, 0, 0, -1, -1, 0, 0},
        {"window",         1, 5, 5, 2, 2, 3, 2, 0, 0, 0, 0, 1, 1, 0, 0},
        {"window left",    1, 4, 6, 2, 1, 2, 2, 0, 1, 0, 0, 2, -1, 0, 0},
        {"softcap",        2, 3, 4, 2, 1, 3, 2, 0, 0, 0, 0, -1, -1, 0.7, 0},
        {"alibi",          2, 3, 4, 2, 2, 3, 2, 0, 1, 1, 0, -1, -1, 0, 0},
        {"sinks",          2, 3, 4, 2, 1, 3, 2, 0, 0, 0, 1, -1, -1, 0, 0},
        {"sinks sq>sk",    1, 5, 2, 2, 1, 3, 2, 0, 1, 0, 1, -1, -1, 0, 0},
        {"varlen",         3, 3, 3, 2, 1, 3, 2, 1, 1, 0, 1, -1, -1, 0, 0},
        {"everything",     2, 4, 5, 4, 2, 3, 2, 0, 1, 1, 1, 2, -1, 1.1, 0},
        {"everything vl",  3, 3, 3, 4, 2, 3, 3, 1, 0, 1, 1, 1, 1, 0.9, 0},
        {"dropout",        2, 4, 7, 2, 1, 3, 2, 0, 0, 0, 0, -1, -1, 0, 0.4f},
        {"dropout causal", 2, 5, 6, 4, 2, 3, 3, 0, 1, 1, 1, -1, -1, 0.8, 0.3f},
        {"dropout varlen", 3, 3, 3, 2, 1, 3, 2, 1, 1, 0, 1, -1, -1, 0, 0.5f},
    };
    for (size_t n = 0; n < sizeof configs / sizeof configs[0]; n++)
        run_fd(&configs[n], fa_test_seed() + n);
}

/* ---- baseline and comparison machinery -------------------------------------------------- */

FA_TEST(reference_baseline_has_dtype_error) {
    /* f32 baseline: fp32 rounding only; bf16 / f16: P rounded, so errors ~ the dtype's epsilon */
    static const double expected_max[3] = {2e-5, 4e-3, 3e-2}, expected_min[3] = {0.0, 1e-5, 1e-4};
    for (int t = 0; t < 3; t++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, 65, 77, 2, 1, 48);
        spec.sinks = 1;
        fa_test_problem tp;
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        fa_ref_references(&tp.params, spec.dtype, 1, &g, &ref, &base);
        double *pairs[5][2] = {{ref.o, base.o}, {ref.dq, base.dq}, {ref.dk, base.dk}, {ref.dv, base.dv},
                               {ref.dsink, base.dsink}};
        int64_t counts[5] = {g.rp.rows_q * 2 * 48, g.rp.rows_q * 2 * 48, g.rp.rows_k * 48,
                             g.rp.rows_k * 48, 2};
        static const char *names[5] = {"o", "dq", "dk", "dv", "dsink"};
        for (int n = 0; n < 5; n++) {
            double err = 0, top = 0;
            for (int64_t i = 0; i < counts[n]; i++) {
                err = fmax(err, fabs(pairs[n][0][i] - pairs[n][1][i]));
                top = fmax(top, fabs(pairs[n][0][i]));
            }
            double rel = err / top;
            /* the lower bound (the dtype's rounding really happens) needs many elements: the
             * two dsink values may both land close by chance */
            double lower = n == 4 ? 0.0 : expected_min[t];
            FA_CHECK(top > 0.01 && rel <= expected_max[t] && rel >= lower,
                     "%s baseline %s: relative error %.3e outside [%.0e, %.0e] (max|ref| %.3f)",
                     fa_test_dtype_name(spec.dtype), names[n], rel, expected_min[t], expected_max[t], top);
        }
        fa_ref_references_free(&g, &ref, &base);
        fa_test_problem_destroy(&tp);
    }
}

/* A fake "library" that writes the rounded reference: the checker must accept it, and must
 * catch one unwritten element, one write into padding, and one wrong value. */
FA_TEST(reference_checker_catches_defects) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_BF16, 2, 9, 13, 2, 1, 16);
    spec.layout = FA_TEST_LAYOUT_PADDED;
    spec.backward = 0;
    fa_test_problem tp;
    for (spec.seed = 1;; spec.seed++) { /* a layout with padding after each head of o */
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
        if (tp.params.o_head_stride > spec.head_dim || spec.seed > 200) break;
        fa_test_problem_destroy(&tp);
    }
    fa_ref_gathered g;
    fa_ref_outputs ref, base;
    fa_ref_references(&tp.params, spec.dtype, 0, &g, &ref, &base);
    const fa_params *p = &tp.params;
    int64_t dv = spec.head_dim;
    /* write the reference, rounded to bf16, through the strides */
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 9; i++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t c = 0; c < dv; c++)
                    fa_test_store(p->o, FA_DTYPE_BF16,
                                  b * p->o_batch_stride + i * p->o_row_stride + h * p->o_head_stride + c,
                                  ref.o[((b * 9 + i) * 2 + h) * dv + c]);
    for (int64_t n = 0; n < 2 * 2 * 9; n++) p->lse[n] = (float)ref.lse[n];
    fa_test_check c = fa_test_compare(&tp, FA_T_O, &ref, &base);
    FA_CHECK(c.ok && c.checked == 2 * 9 * 2 * dv, "a perfect output is accepted (err %.3e tol %.3e, %lld checked)",
             c.err, c.tol, (long long)c.checked);
    c = fa_test_compare(&tp, FA_T_LSE, &ref, &base);
    FA_CHECK(c.ok, "a perfect lse is accepted (err %.3e tol %.3e)", c.err, c.tol);

    uint16_t *o16 = (uint16_t *)p->o;
    uint16_t saved = o16[p->o_row_stride + 3];
    o16[p->o_row_stride + 3] = FA_TEST_POISON_BF16;
    c = fa_test_compare(&tp, FA_T_O, &ref, &base);
    FA_CHECK(!c.ok && c.unwritten == 1, "one unwritten element is caught (unwritten %lld)", (long long)c.unwritten);
    o16[p->o_row_stride + 3] = saved;

    int has_padding = p->o_head_stride > dv;
    if (FA_CHECK(has_padding, "no seed gave head padding (stride %lld, dv %lld)",
                 (long long)p->o_head_stride, (long long)dv)) {
        uint16_t *pad = o16 + p->o_head_stride - 1;
        uint16_t pad_saved = *pad;
        *pad = 0;
        c = fa_test_compare(&tp, FA_T_O, &ref, &base);
        FA_CHECK(!c.ok && c.clobbered == 1, "a write into padding is caught (clobbered %lld)", (long long)c.clobbered);
        *pad = pad_saved;
    }
    double wrong = ref.o[5] + 4 * c.tol + 0.1;
    fa_test_store(p->o, FA_DTYPE_BF16, 5, wrong);
    c = fa_test_compare(&tp, FA_T_O, &ref, &base);
    FA_CHECK(!c.ok && c.err > c.tol, "a wrong value is caught (err %.3e tol %.3e)", c.err, c.tol);
    p->lse[3] = -INFINITY;
    c = fa_test_compare(&tp, FA_T_LSE, &ref, &base);
    FA_CHECK(!c.ok && c.nonfinite == 1, "a wrong -inf lse is caught");
    fa_ref_references_free(&g, &ref, &base);
    fa_test_problem_destroy(&tp);
}

/* The fp8 LSE floor: one unit of the 14th bit per k32 step of the padded head dim, at the largest
 * score magnitude; widening re-judges the check. */
FA_TEST(reference_fp8_score_noise) {
    FA_CHECK(fa_test_fp8_score_noise(64, 2.0) == 2 * 2.0 / 8192.0 && fa_test_fp8_score_noise(128, 1.0) == 4 / 8192.0 &&
                 fa_test_fp8_score_noise(256, 1.0) == 8 / 8192.0 && fa_test_fp8_score_noise(96, 1.0) == 4 / 8192.0 &&
                 fa_test_fp8_score_noise(32, 1.0) == 2 / 8192.0 && fa_test_fp8_score_noise(64, 0.0) == 0.0,
             "steps (k32 steps, + 1 zero step below a bucket) · 2^-13 · term_max");
    fa_test_check c;
    memset(&c, 0, sizeof c);
    c.err = 2.73e-4;
    c.base_err = 9.0e-5;
    c.tol = 1.81e-4;
    c.ok = 0;
    fa_test_check_widen(&c, fa_test_fp8_score_noise(64, 2.1));
    FA_CHECK(c.ok && c.tol > c.err, "a d = 64 row of |s| = 2.1 that the H200 missed by 1.5x passes, tol %g", c.tol);
    c.err = 1e-2;
    fa_test_check_widen(&c, 0.0);
    FA_CHECK(!c.ok, "an error of a key of weight 1e-2 still fails");
}
