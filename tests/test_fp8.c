/*
 * test_fp8.c: fa_forward and fa_backward with e4m3 q, k, v (dtype = FA_DTYPE_FP8_E4M3; o, dout,
 * dq, dk, dv in bf16) on the CPU.
 *
 * A bf16 test problem is quantised element by element to e4m3 against descale factors per
 * (batch, kv head) that are powers of two, so descale · e4m3 is exact in bf16: the bf16 problem
 * then holds exactly the values the fp8 call attends to (masks, softcap, ALiBi, sinks, varlen and
 * dropout included), and the float64 reference and the bf16
 * baseline of that problem set the tolerance (max|ours - ref64| <= 2·max|baseline - ref64| +
 * floor) for o, lse, dq, dk and dv, as for every other dtype. A second check uses descales that are not powers of two, the
 * same for every (batch, kv head): the fp8 call must equal the e4m3 values attended with the
 * scale multiplied by q_descale · k_descale and the output by v_descale. Then the rejections:
 * fp8 where it is not supported, and bad descale factors, with nothing written. Half the backward
 * cases take dout in e4m3 too (dout_e4m3), quantised the same way.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct fp8_problem {
    fa_test_problem tp;
    fa_test_fp8 f;
} fp8_problem;

/* The bf16 problem of `spec`, quantised (oracle/reference.h, fp8 inputs). Returns 0, or -1 with a
 * failed check. */
static int fp8_create(fp8_problem *f, const fa_test_spec *spec, int scaled) {
    memset(f, 0, sizeof *f);
    if (!FA_CHECK(fa_test_problem_create(&f->tp, spec) == 0, "fp8: test problem could not be created")) return -1;
    return FA_CHECK(fa_test_fp8_quantise(&f->tp, scaled, spec->seed ^ 0x5eedf8u, &f->f) == 0,
                    "fp8: quantisation failed (out of memory, or over 64 (batch, kv head) pairs)")
               ? 0
               : -1;
}

static void fp8_destroy(fp8_problem *f) {
    fa_test_fp8_free(&f->f);
    fa_test_problem_destroy(&f->tp);
}

static fa_params fp8_params(const fp8_problem *f, int with_descales) {
    return fa_test_fp8_params(&f->tp, &f->f, with_descales);
}

/* o (divided by out_factor) and lse against the references. */
static void compare(const char *label, fp8_problem *f, const fa_ref_outputs *ref, const fa_ref_outputs *base,
                    double out_factor) {
    if (out_factor != 1.0) { /* o / v_descale, in place: o is not looked at again */
        const fa_test_view *ov = &f->tp.view[FA_T_O];
        fa_test_buffer *buf = &f->tp.buffer[ov->buffer];
        for (size_t i = 0; i < buf->bytes / buf->elem_size; ++i)
            fa_test_store(buf->host, FA_DTYPE_BF16, (int64_t)i, fa_test_load(buf->host, FA_DTYPE_BF16, (int64_t)i) / out_factor);
    }
    const fa_test_check co = fa_test_compare(&f->tp, FA_T_O, ref, base), cl = fa_test_compare(&f->tp, FA_T_LSE, ref, base);
    FA_CHECK(co.ok, "%s: o err %.3e > tol %.3e (baseline err %.3e)", label, co.err, co.tol, co.base_err);
    FA_CHECK(cl.ok, "%s: lse err %.3e > tol %.3e (baseline err %.3e)", label, cl.err, cl.tol, cl.base_err);
    FA_CHECK(fa_test_fp8_unchanged(&f->f) && fa_test_inputs_unchanged(&f->tp), "%s: an input was modified", label);
}

/* Forward, then backward from the library's o and lse: dq, dk, dv (bf16) are the gradients of
 * the dequantised q, k, v, held to the bf16 problem's rule; e4m3_dout: dout passed in e4m3 as
 * well (dout_e4m3, its own power-of-two factors), the bf16 problem holding its values. */
static void expect_fp8_case(fa_test_spec spec, const char *label, int e4m3_dout) {
    spec.dtype = FA_DTYPE_BF16;
    spec.backward = 1;
    fp8_problem f;
    if (fp8_create(&f, &spec, 1) == 0 &&
        (!e4m3_dout || FA_CHECK(fa_test_fp8_quantise_dout(&f.tp, spec.seed ^ 0xd0f8u, &f.f) == 0,
                                "%s: dout quantisation out of memory", label))) {
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        if (FA_CHECK(fa_ref_references(&f.tp.params, FA_DTYPE_BF16, 1, &g, &ref, &base) == 0, "%s: oracle out of memory",
                     label)) {
            fa_params p = fp8_params(&f, 1);
            fa_status s = fa_forward(&p);
            if (FA_CHECK(s == FA_OK, "%s: fa_forward: %s", label, fa_last_error())) {
                compare(label, &f, &ref, &base, 1.0);
                s = fa_backward(&p);
                if (FA_CHECK(s == FA_OK, "%s: fa_backward: %s", label, fa_last_error())) {
                    static const int grads[3] = {FA_T_DQ, FA_T_DK, FA_T_DV};
                    static const char *names[3] = {"dq", "dk", "dv"};
                    for (int t = 0; t < 3; ++t) {
                        const fa_test_check c = fa_test_compare(&f.tp, grads[t], &ref, &base);
                        FA_CHECK(c.ok, "%s%s: %s err %.3e > tol %.3e (baseline err %.3e)", label,
                                 e4m3_dout ? " (e4m3 dout)" : "", names[t], c.err, c.tol, c.base_err);
                    }
                }
            }
            fa_ref_references_free(&g, &ref, &base);
        }
    }
    fp8_destroy(&f);
}

FA_TEST(fp8_forward_backward_features) {
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
            expect_fp8_case(s, label, (int)((i + (size_t)feature) % 2)); /* half the cases with an e4m3 dout */
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
            f.f.descale[0][i] = qd;
            f.f.descale[1][i] = kd;
            f.f.descale[2][i] = vd;
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
        FA_CHECK(fa_standard_forward(&p) == FA_ERR_DTYPE, "fa_standard_forward with fp8: %s", fa_last_error());
        FA_CHECK(fa_kvcache_forward(&p) == FA_ERR_DTYPE, "fa_kvcache_forward with fp8: %s", fa_last_error());
        if (!fa_cuda_available()) { /* with a GPU, tests/gpu (check --device cuda) runs the fp8 forward */
            fa_params cuda = p;
            cuda.device = FA_DEVICE_CUDA;
            const fa_status sc = fa_forward(&cuda);
            FA_CHECK(sc == FA_ERR_DEVICE, "fa_forward fp8 on CUDA without a GPU: %s", fa_last_error());
        }
        float probs[9 * 11 * 2];
        fa_params with_probs = p;
        with_probs.attn_probs = probs;
        FA_CHECK(fa_forward(&with_probs) == FA_ERR_UNSUPPORTED, "attn_probs with fp8: %s", fa_last_error());
        const float bad[] = {NAN, 0.0f, -1.0f, INFINITY};
        for (int i = 0; i < 4; ++i) {
            float saved = f.f.descale[1][0];
            f.f.descale[1][0] = bad[i];
            FA_CHECK(fa_forward(&p) == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "k_descale") != NULL,
                     "k_descale = %g: %s", (double)bad[i], fa_last_error());
            f.f.descale[1][0] = saved;
        }
        FA_CHECK(fa_test_buffer_all_poison(&f.tp, FA_T_O) && fa_test_buffer_all_poison(&f.tp, FA_T_LSE),
                 "a rejected fp8 call wrote o or lse");
        fa_params bad_dtype = p;
        bad_dtype.dtype = (fa_dtype)4;
        FA_CHECK(fa_forward(&bad_dtype) == FA_ERR_DTYPE, "dtype 4: %s", fa_last_error());
    }
    fp8_destroy(&f);
}

/* An e4m3 dout: its flag's values, the dtype it needs and bad factors are rejected by
 * fa_backward with nothing written; fa_forward ignores both fields. */
FA_TEST(fp8_dout_rejections) {
    fa_test_spec s = fa_test_base_spec(FA_DTYPE_BF16, 1, 9, 11, 2, 1, 32);
    s.backward = 1;
    fp8_problem f;
    if (fp8_create(&f, &s, 1) == 0 &&
        FA_CHECK(fa_test_fp8_quantise_dout(&f.tp, 7, &f.f) == 0, "dout quantisation out of memory")) {
        fa_params p = fp8_params(&f, 1);
        FA_CHECK(fa_forward(&p) == FA_OK, "fa_forward with dout_e4m3 set: %s", fa_last_error());
        fa_test_poison_backward_outputs(&f.tp);
        fa_params flag = p;
        flag.dout_e4m3 = 2;
        FA_CHECK(fa_backward(&flag) == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "dout_e4m3") != NULL,
                 "dout_e4m3 = 2: %s", fa_last_error());
        fa_params bf16 = f.tp.params; /* a bf16 problem with dout_e4m3 = 1 */
        bf16.dout_e4m3 = 1;
        FA_CHECK(fa_backward(&bf16) == FA_ERR_DTYPE && strstr(fa_last_error(), "dout_e4m3") != NULL,
                 "dout_e4m3 with bf16 inputs: %s", fa_last_error());
        const float bad[] = {NAN, 0.0f, -2.0f, INFINITY};
        for (int i = 0; i < 4; ++i) {
            const float saved = f.f.descale[3][0];
            f.f.descale[3][0] = bad[i];
            FA_CHECK(fa_backward(&p) == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "dout_descale") != NULL,
                     "dout_descale = %g: %s", (double)bad[i], fa_last_error());
            f.f.descale[3][0] = saved;
        }
        FA_CHECK(fa_test_buffer_all_poison(&f.tp, FA_T_DQ) && fa_test_buffer_all_poison(&f.tp, FA_T_DK) &&
                     fa_test_buffer_all_poison(&f.tp, FA_T_DV),
                 "a rejected backward with an e4m3 dout wrote a gradient");
        FA_CHECK(fa_backward(&p) == FA_OK, "fa_backward with an e4m3 dout: %s", fa_last_error());
    }
    fp8_destroy(&f);
}
