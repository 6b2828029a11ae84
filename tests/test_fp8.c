/*
 * test_fp8.c: fa_forward with e4m3 q, k, v (dtype = FA_DTYPE_FP8_E4M3, o in bf16) on the CPU.
 *
 * A bf16 test problem is quantised element by element to e4m3 against descale factors per
 * (batch, kv head) that are powers of two, so descale · e4m3 is exact in bf16: the bf16 problem
 * then holds exactly the values the fp8 call attends to (masks, softcap, ALiBi, sinks, varlen and
 * dropout included), and the float64 reference and the bf16
 * baseline of that problem set the tolerance (max|ours - ref64| <= 2·max|baseline - ref64| +
 * floor), as for every other dtype. A second check uses descales that are not powers of two, the
 * same for every (batch, kv head): the fp8 call must equal the e4m3 values attended with the
 * scale multiplied by q_descale · k_descale and the output by v_descale. Then the rejections:
 * fp8 where it is not supported, and bad descale factors, with nothing written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* e4m3 (sign, 4 exponent bits of bias 7, 3 mantissa bits; S.1111.111 is NaN), decoded here
 * independently of the library. */
static double e4m3_value(uint8_t x) {
    const int magnitude = x & 0x7f;
    double v;
    if (magnitude == 0x7f) v = NAN;
    else if ((magnitude >> 3) == 0) v = (double)(magnitude & 7) / 512.0;
    else v = ldexp(1.0 + (double)(magnitude & 7) / 8.0, (magnitude >> 3) - 7);
    return (x & 0x80) ? -v : v;
}

/* The nearest e4m3 code (ties to the even code), saturating at ±448: a search over the 127
 * non-negative finite values, which increase with the code. */
static uint8_t e4m3_nearest(double x) {
    static double values[0x7f];
    if (values[1] == 0.0)
        for (int code = 0; code < 0x7f; ++code) values[code] = e4m3_value((uint8_t)code);
    const uint8_t sign = x < 0 ? 0x80 : 0;
    const double a = fabs(x);
    int lo = 0;
    while (lo < 0x7e && values[lo + 1] <= a) ++lo;
    int best = lo;
    if (lo < 0x7e) {
        const double below = a - values[lo], above = values[lo + 1] - a;
        if (above < below || (above == below && (lo & 1))) best = lo + 1;
    }
    return (uint8_t)(sign | best);
}

/* Quantise tensor `t` of tp (q, k or v; heads of it: `heads`, width `dim`) in place: each valid
 * element x of sequence b and head h becomes ds · e4m3(x / ds), ds = descale[b·hkv + h / group],
 * and its code goes to out8 at the same element index. */
static void quantise(fa_test_problem *tp, int t, uint8_t *out8, const float *descale, int64_t heads,
                     int64_t dim, int64_t group) {
    const fa_params *p = &tp->params;
    const fa_test_view *view = &tp->view[t];
    void *host = tp->buffer[view->buffer].host;
    const int varlen = p->cu_seqlens_q != NULL;
    const int32_t *cu = t == FA_T_Q ? p->cu_seqlens_q : p->cu_seqlens_k;
    const int64_t seqlen = t == FA_T_Q ? p->seqlen_q : p->seqlen_k;
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t first = varlen ? cu[b] : 0, count = varlen ? cu[b + 1] - cu[b] : seqlen;
        for (int64_t i = 0; i < count; ++i)
            for (int64_t h = 0; h < heads; ++h) {
                const double ds = descale ? descale[b * p->heads_kv + h / group] : 1.0;
                for (int64_t c = 0; c < dim; ++c) {
                    const int64_t at = view->offset + (varlen ? 0 : b * view->batch_stride) +
                                       (first + i) * view->row_stride + h * view->head_stride + c;
                    const uint8_t code = e4m3_nearest(fa_test_load(host, FA_DTYPE_BF16, at) / ds);
                    out8[at] = code;
                    fa_test_store(host, FA_DTYPE_BF16, at, ds * e4m3_value(code));
                }
            }
    }
}

typedef struct fp8_problem {
    fa_test_problem tp;
    uint8_t *q8, *k8, *v8;
    float descale[3][64]; /* q, k, v: [batch, heads_kv] */
} fp8_problem;

/* The bf16 problem of `spec`, quantised; descales 2^e (e in -3..3) per (batch, kv head) when
 * `scaled`, else NULL. Returns 0, or -1 with a failed check. */
static int fp8_create(fp8_problem *f, const fa_test_spec *spec, int scaled) {
    memset(f, 0, sizeof *f);
    if (!FA_CHECK(fa_test_problem_create(&f->tp, spec) == 0, "fp8: test problem could not be created")) return -1;
    const fa_params *p = &f->tp.params;
    if (!FA_CHECK(p->batch * p->heads_kv <= 64, "fp8: at most 64 (batch, kv head) pairs")) return -1;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, spec->seed ^ 0x5eedf8u);
    for (int a = 0; a < 3; ++a)
        for (int64_t i = 0; i < p->batch * p->heads_kv; ++i)
            f->descale[a][i] = scaled ? ldexpf(1.0f, (int)fa_test_rng_int(&rng, -3, 3)) : 1.0f;
    uint8_t **outs[3] = {&f->q8, &f->k8, &f->v8};
    const int tensors[3] = {FA_T_Q, FA_T_K, FA_T_V};
    for (int a = 0; a < 3; ++a) {
        const fa_test_buffer *buf = &f->tp.buffer[f->tp.view[tensors[a]].buffer];
        *outs[a] = calloc(buf->bytes / buf->elem_size, 1);
        if (!FA_CHECK(*outs[a] != NULL, "fp8: out of memory")) return -1;
    }
    const int64_t group = p->heads_q / p->heads_kv;
    quantise(&f->tp, FA_T_Q, f->q8, scaled ? f->descale[0] : NULL, p->heads_q, p->head_dim, group);
    quantise(&f->tp, FA_T_K, f->k8, scaled ? f->descale[1] : NULL, p->heads_kv, p->head_dim, 1);
    quantise(&f->tp, FA_T_V, f->v8, scaled ? f->descale[2] : NULL, p->heads_kv, p->head_dim_v, 1);
    return 0;
}

static void fp8_destroy(fp8_problem *f) {
    free(f->q8);
    free(f->k8);
    free(f->v8);
    fa_test_problem_destroy(&f->tp);
}

/* The fp8 call's parameters: the bf16 problem's with dtype, q, k, v and the descales replaced. */
static fa_params fp8_params(const fp8_problem *f, int with_descales) {
    fa_params p = f->tp.params;
    p.dtype = FA_DTYPE_FP8_E4M3;
    p.q = f->q8 + f->tp.view[FA_T_Q].offset; /* the problem's pointers are at each view's offset */
    p.k = f->k8 + f->tp.view[FA_T_K].offset;
    p.v = f->v8 + f->tp.view[FA_T_V].offset;
    if (with_descales) {
        p.q_descale = f->descale[0];
        p.k_descale = f->descale[1];
        p.v_descale = f->descale[2];
    }
    return p;
}

/* max|ours - ref|, max|base - ref|, max|ref| and the largest term magnitude over o's valid
 * elements; ours scaled by 1 / out_factor. */
typedef struct err_stats {
    double err, base_err, ref_max, term_max;
} err_stats;

static void track(err_stats *e, double ours, double ref, double base, double term) {
    if (isinf(ref) && ours == ref && base == ref) return; /* rows that see nothing: -inf == -inf */
    const double d = fabs(ours - ref), bd = fabs(base - ref);
    e->err = isnan(d) || d > e->err ? (isnan(d) ? INFINITY : d) : e->err;
    if (bd > e->base_err) e->base_err = bd;
    if (fabs(ref) > e->ref_max && isfinite(ref)) e->ref_max = fabs(ref);
    if (term > e->term_max) e->term_max = term;
}

/* Compare o (bf16, the problem's layout) and lse with the references; o divided by out_factor. */
static void compare(const char *label, const fp8_problem *f, const fa_ref_outputs *ref, const fa_ref_outputs *base,
                    double out_factor) {
    const fa_test_problem *tp = &f->tp;
    const fa_params *p = &tp->params;
    const int varlen = p->cu_seqlens_q != NULL;
    const fa_test_view *ov = &tp->view[FA_T_O], *lv = &tp->view[FA_T_LSE];
    const void *o = tp->buffer[ov->buffer].host;
    const float *lse = (const float *)tp->buffer[lv->buffer].host + lv->offset;
    err_stats eo = {0, 0, 0, 0}, el = {0, 0, 0, 0};
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t first = varlen ? p->cu_seqlens_q[b] : b * p->seqlen_q;
        const int64_t count = varlen ? p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b] : p->seqlen_q;
        for (int64_t i = 0; i < count; ++i)
            for (int64_t h = 0; h < p->heads_q; ++h) {
                for (int64_t c = 0; c < p->head_dim_v; ++c) {
                    const int64_t at = ov->offset + (varlen ? 0 : b * ov->batch_stride) +
                                       (varlen ? first + i : i) * ov->row_stride + h * ov->head_stride + c;
                    const int64_t canon = ((first + i) * p->heads_q + h) * p->head_dim_v + c;
                    track(&eo, fa_test_load(o, FA_DTYPE_BF16, at) / out_factor, ref->o[canon], base->o[canon],
                          ref->o_mag ? ref->o_mag[canon] : 0.0);
                }
                const int64_t li = varlen ? h * p->total_q + first + i : (b * p->heads_q + h) * p->seqlen_q + i;
                track(&el, lse[li], ref->lse[li], base->lse[li], 0.0);
            }
    }
    const double tol_o = 2.0 * eo.base_err + fa_test_floor(FA_DTYPE_BF16, eo.ref_max, eo.term_max);
    const double tol_l = 2.0 * el.base_err + fa_test_floor(FA_DTYPE_BF16, el.ref_max, el.ref_max);
    FA_CHECK(eo.err <= tol_o, "%s: o err %.3e > tol %.3e (baseline err %.3e)", label, eo.err, tol_o, eo.base_err);
    FA_CHECK(el.err <= tol_l, "%s: lse err %.3e > tol %.3e (baseline err %.3e)", label, el.err, tol_l, el.base_err);
}

static void expect_fp8_case(fa_test_spec spec, const char *label) {
    spec.dtype = FA_DTYPE_BF16;
    spec.backward = 0;
    fp8_problem f;
    if (fp8_create(&f, &spec, 1) == 0) {
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        if (FA_CHECK(fa_ref_references(&f.tp.params, FA_DTYPE_BF16, 0, &g, &ref, &base) == 0, "%s: oracle out of memory",
                     label)) {
            fa_params p = fp8_params(&f, 1);
            const fa_status s = fa_forward(&p);
            if (FA_CHECK(s == FA_OK, "%s: fa_forward: %s", label, fa_last_error())) compare(label, &f, &ref, &base, 1.0);
            fa_ref_references_free(&g, &ref, &base);
        }
    }
    fp8_destroy(&f);
}

FA_TEST(fp8_forward_features) {
    static const struct { int64_t b, sq, sk, hq, hkv, d, dv; } shapes[] = {
        {2, 7, 113, 4, 2, 59, 59}, {1, 113, 7, 2, 1, 64, 64}, {2, 1, 1, 3, 3, 32, 32}, {1, 130, 203, 4, 1, 128, 96}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
        for (int feature = 0; feature < 6; ++feature) {
            fa_test_spec s = fa_test_base_spec(FA_DTYPE_BF16, shapes[i].b, shapes[i].sq, shapes[i].sk, shapes[i].hq,
                                               shapes[i].hkv, shapes[i].d);
            s.head_dim_v = shapes[i].dv;
            s.layout = FA_TEST_LAYOUT_PADDED;
            const char *label = "fp8 plain";
            if (feature == 1) {
                s.causal = 1;
                label = "fp8 causal";
            } else if (feature == 2) {
                s.softcap = 30.0f;
                s.sinks = 1;
                s.alibi = FA_TEST_ALIBI_HEAD;
                label = "fp8 softcap+sinks+alibi";
            } else if (feature == 3) {
                s.use_window = 1;
                s.window_left = 9;
                s.window_right = 4;
                label = "fp8 window";
            } else if (feature == 4) {
                s.varlen = 1;
                s.causal = 1;
                label = "fp8 varlen+causal";
            } else if (feature == 5) {
                s.dropout_p = 0.17f;
                s.dropout_seed = 0x1234567u + (uint64_t)i;
                s.dropout_offset = 3;
                label = "fp8 dropout";
            }
            expect_fp8_case(s, label);
        }
}

/* Descales that are not powers of two, one value for every (batch, kv head): the problem holds
 * the e4m3 values themselves, the reference attends them with the scale times q_descale ·
 * k_descale, and o / v_descale must match it. */
FA_TEST(fp8_forward_descale_fold) {
    fa_test_spec s = fa_test_base_spec(FA_DTYPE_BF16, 2, 37, 53, 4, 2, 64);
    s.backward = 0;
    s.causal = 1;
    const float qd = 0.37f, kd = 1.9f, vd = 0.61f;
    fp8_problem f;
    if (fp8_create(&f, &s, 0) == 0) {
        for (int64_t i = 0; i < 4; ++i) {
            f.descale[0][i] = qd;
            f.descale[1][i] = kd;
            f.descale[2][i] = vd;
        }
        fa_params scaled = f.tp.params; /* the reference problem: e4m3 values, the folded scale */
        scaled.softmax_scale = (1.0f / sqrtf(64.0f)) * qd * kd;
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        if (FA_CHECK(fa_ref_references(&scaled, FA_DTYPE_BF16, 0, &g, &ref, &base) == 0, "oracle out of memory")) {
            fa_params p = fp8_params(&f, 1);
            const fa_status st = fa_forward(&p);
            if (FA_CHECK(st == FA_OK, "fa_forward: %s", fa_last_error()))
                compare("fp8 descale fold", &f, &ref, &base, vd);
            fa_ref_references_free(&g, &ref, &base);
        }
    }
    fp8_destroy(&f);
}

/* Where fp8 is not taken, and bad descales: the right status, nothing written. */
FA_TEST(fp8_rejections) {
    fa_test_spec s = fa_test_base_spec(FA_DTYPE_BF16, 1, 9, 11, 2, 1, 32);
    s.backward = 1;
    fp8_problem f;
    if (fp8_create(&f, &s, 1) == 0) {
        fa_test_poison_forward_outputs(&f.tp);
        fa_params p = fp8_params(&f, 1);
        FA_CHECK(fa_backward(&p) == FA_ERR_DTYPE, "fa_backward with fp8: %s", fa_last_error());
        FA_CHECK(fa_standard_forward(&p) == FA_ERR_DTYPE, "fa_standard_forward with fp8: %s", fa_last_error());
        FA_CHECK(fa_kvcache_forward(&p) == FA_ERR_DTYPE, "fa_kvcache_forward with fp8: %s", fa_last_error());
        fa_params cuda = p;
        cuda.device = FA_DEVICE_CUDA;
        const fa_status sc = fa_forward(&cuda);
        FA_CHECK(sc == FA_ERR_DTYPE || sc == FA_ERR_DEVICE, "fa_forward fp8 on CUDA: %s", fa_last_error());
        float probs[9 * 11 * 2];
        fa_params with_probs = p;
        with_probs.attn_probs = probs;
        FA_CHECK(fa_forward(&with_probs) == FA_ERR_UNSUPPORTED, "attn_probs with fp8: %s", fa_last_error());
        const float bad[] = {NAN, 0.0f, -1.0f, INFINITY};
        for (int i = 0; i < 4; ++i) {
            float saved = f.descale[1][0];
            f.descale[1][0] = bad[i];
            FA_CHECK(fa_forward(&p) == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "k_descale") != NULL,
                     "k_descale = %g: %s", (double)bad[i], fa_last_error());
            f.descale[1][0] = saved;
        }
        FA_CHECK(fa_test_buffer_all_poison(&f.tp, FA_T_O) && fa_test_buffer_all_poison(&f.tp, FA_T_LSE),
                 "a rejected fp8 call wrote o or lse");
        fa_params bad_dtype = p;
        bad_dtype.dtype = (fa_dtype)4;
        FA_CHECK(fa_forward(&bad_dtype) == FA_ERR_DTYPE, "dtype 4: %s", fa_last_error());
    }
    fp8_destroy(&f);
}
