/*
 * test_api.c: the rest of the public surface on the CPU path.
 *
 *   - fa_check_forward / fa_check_backward: report support and workspace, run nothing, and a
 *     caller workspace of exactly that size (or larger) works;
 *   - fa_set_contiguous_strides (dense and varlen);
 *   - layouts: padded strides, BHSD, slices of a packed QKV buffer (dq/dk/dv packed too);
 *   - empty problems: seqlen_q = 0, seqlen_k = 0, both; varlen with empty sequences;
 *   - rows that see no key: O = 0 exactly, LSE = -inf (LSE = sink logit with sinks), dq = 0;
 *   - lse = NULL in the forward;
 *   - zero_varlen_tail: the rows past the last sequence zeroed, or left as they were;
 *   - fa_standard_forward against the reference;
 *   - fa_cpu_isa names a level.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

FA_TEST(api_check_reports_and_runs_nothing) {
    for (int varlen = 0; varlen < 2; varlen++) {
        fa_test_spec spec = fa_test_base_spec(FA_DTYPE_BF16, 3, 150, 97, 4, 2, 64);
        spec.varlen = varlen;
        spec.sinks = 1;
        spec.causal = 1;
        fa_test_problem tp;
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
        size_t need_fwd = (size_t)-1, need_bwd = (size_t)-1;
        fa_status fs = fa_check_forward(&tp.params, &need_fwd);
        fa_status bs = fa_check_backward(&tp.params, &need_bwd);
        FA_CHECK(fs == FA_OK && bs == FA_OK, "checks: %s %s (%s)", fa_strerror(fs), fa_strerror(bs), fa_last_error());
        FA_CHECK(need_fwd != (size_t)-1 && need_bwd != (size_t)-1, "workspace sizes were not reported");
        FA_CHECK(fa_check_forward(&tp.params, NULL) == FA_OK, "a NULL workspace_bytes pointer is accepted");
        static const int outputs[] = {FA_T_O, FA_T_LSE, FA_T_DQ, FA_T_DK, FA_T_DV, FA_T_DSINK};
        for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++)
            FA_CHECK(fa_test_buffer_all_poison(&tp, outputs[i]), "a check call wrote %s",
                     fa_test_tensor_name(outputs[i]));
        FA_CHECK(fa_test_inputs_unchanged(&tp), "a check call modified an input");

        /* run with a caller workspace of exactly the reported size, then a larger one */
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        fa_ref_references(&tp.params, spec.dtype, 1, &g, &ref, &base);
        for (int extra = 0; extra <= 4096; extra += 4096) {
            size_t bytes_fwd = need_fwd + (size_t)extra, bytes_bwd = need_bwd + (size_t)extra;
            void *ws_fwd = aligned_alloc(64, (bytes_fwd + 64) & ~(size_t)63);
            void *ws_bwd = aligned_alloc(64, (bytes_bwd + 64) & ~(size_t)63);
            fa_params p = tp.params;
            fa_test_poison_forward_outputs(&tp);
            fa_test_poison_backward_outputs(&tp);
            p.workspace = ws_fwd;
            p.workspace_bytes = bytes_fwd;
            fs = fa_forward(&p);
            p.workspace = ws_bwd;
            p.workspace_bytes = bytes_bwd;
            bs = fs == FA_OK ? fa_backward(&p) : fs;
            FA_CHECK(fs == FA_OK && bs == FA_OK, "with caller workspace (+%d bytes): %s %s: %s", extra,
                     fa_strerror(fs), fa_strerror(bs), fa_last_error());
            fa_test_check checks[5] = {
                fa_test_compare(&tp, FA_T_O, &ref, &base), fa_test_compare(&tp, FA_T_LSE, &ref, &base),
                fa_test_compare(&tp, FA_T_DQ, &ref, &base), fa_test_compare(&tp, FA_T_DK, &ref, &base),
                fa_test_compare(&tp, FA_T_DV, &ref, &base)};
            for (int c = 0; c < 5; c++)
                FA_CHECK(checks[c].ok, "caller workspace (+%d, varlen %d): tensor %d err %.3e tol %.3e unwritten %lld",
                         extra, varlen, c, checks[c].err, checks[c].tol, (long long)checks[c].unwritten);
            free(ws_fwd);
            free(ws_bwd);
        }
        fa_ref_references_free(&g, &ref, &base);
        fa_test_problem_destroy(&tp);
    }
}

FA_TEST(api_set_contiguous_strides) {
    fa_params p = {0};
    p.batch = 3;
    p.seqlen_q = 5;
    p.seqlen_k = 7;
    p.heads_q = 6;
    p.heads_kv = 2;
    p.head_dim = 16;
    p.head_dim_v = 0; /* defaults to head_dim */
    static float dummy[4];
    p.q = p.k = p.v = dummy;
    p.o = p.dq = p.dk = p.dv = dummy;
    p.dout = dummy;
    fa_set_contiguous_strides(&p);
    FA_CHECK(p.q_head_stride == 16 && p.q_row_stride == 96 && p.q_batch_stride == 480, "q strides %lld %lld %lld",
             (long long)p.q_batch_stride, (long long)p.q_row_stride, (long long)p.q_head_stride);
    FA_CHECK(p.k_head_stride == 16 && p.k_row_stride == 32 && p.k_batch_stride == 224, "k strides");
    FA_CHECK(p.v_head_stride == 16 && p.v_row_stride == 32 && p.v_batch_stride == 224, "v strides");
    FA_CHECK(p.o_head_stride == 16 && p.o_row_stride == 96 && p.o_batch_stride == 480, "o strides");
    FA_CHECK(p.do_head_stride == 16 && p.do_row_stride == 96 && p.do_batch_stride == 480, "do strides");
    FA_CHECK(p.dq_head_stride == 16 && p.dq_row_stride == 96 && p.dq_batch_stride == 480, "dq strides");
    FA_CHECK(p.dk_head_stride == 16 && p.dk_row_stride == 32 && p.dk_batch_stride == 224, "dk strides");
    FA_CHECK(p.dv_head_stride == 16 && p.dv_row_stride == 32 && p.dv_batch_stride == 224, "dv strides");
    p.head_dim_v = 24; /* v, o, do, dv use dv */
    fa_set_contiguous_strides(&p);
    FA_CHECK(p.v_head_stride == 24 && p.v_row_stride == 48 && p.v_batch_stride == 336, "v strides with dv");
    FA_CHECK(p.o_head_stride == 24 && p.o_row_stride == 144 && p.o_batch_stride == 720, "o strides with dv");
    FA_CHECK(p.do_row_stride == 144 && p.dv_row_stride == 48 && p.dk_row_stride == 32 && p.dq_row_stride == 96,
             "backward strides with dv");
    /* varlen: [total, heads, dim]; batch strides unused */
    static const int32_t cu[4] = {0, 2, 5, 9};
    p.cu_seqlens_q = cu;
    p.cu_seqlens_k = cu;
    fa_set_contiguous_strides(&p);
    FA_CHECK(p.q_head_stride == 16 && p.q_row_stride == 96, "varlen q strides");
    FA_CHECK(p.v_head_stride == 24 && p.v_row_stride == 48, "varlen v strides");
    fa_set_contiguous_strides(NULL); /* must not crash */
    FA_CHECK(1, "fa_set_contiguous_strides(NULL) returned");
}

/* dense problem set up with fa_set_contiguous_strides only, run end to end */
FA_TEST(api_contiguous_end_to_end) {
    for (int t = 0; t < 3; t++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, 33, 47, 4, 1, 24);
        spec.layout = FA_TEST_LAYOUT_CONTIGUOUS;
        spec.causal = 1;
        fa_test_expect_case(&spec, 0, "contiguous");
    }
}

FA_TEST(api_layouts) {
    static const fa_test_layout layouts[] = {FA_TEST_LAYOUT_PADDED, FA_TEST_LAYOUT_BHSD, FA_TEST_LAYOUT_PACKED_QKV};
    static const char *names[] = {"padded", "bhsd", "packed-qkv"};
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 3; t++)
            for (int varlen = 0; varlen < 2; varlen++) {
                fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 3, 61, 61, 6, 2, 40);
                spec.layout = layouts[l];
                spec.varlen = varlen;
                spec.causal = varlen;
                spec.sinks = 1;
                spec.seed += (uint64_t)(l * 7 + varlen);
                char label[64];
                snprintf(label, sizeof label, "%s%s", names[l], varlen ? " varlen" : "");
                fa_test_expect_case(&spec, 0, label);
                /* the packed layout must really have been used (equal lengths, d == dv) */
                if (layouts[l] == FA_TEST_LAYOUT_PACKED_QKV) {
                    fa_test_problem tp;
                    if (fa_test_problem_create(&tp, &spec) == 0) {
                        FA_CHECK(tp.spec.layout == FA_TEST_LAYOUT_PACKED_QKV &&
                                     (const char *)tp.params.k - (const char *)tp.params.q ==
                                         (ptrdiff_t)(6 * 40 * fa_test_dtype_size(spec.dtype)) &&
                                     tp.params.dk != NULL &&
                                     (char *)tp.params.dv - (char *)tp.params.dq ==
                                         (ptrdiff_t)(8 * 40 * fa_test_dtype_size(spec.dtype)),
                                 "%s: q/k/v and dq/dk/dv are not slices of one buffer", label);
                        fa_test_problem_destroy(&tp);
                    }
                }
            }
}

FA_TEST(api_empty_sequences) {
    /* seqlen_q = 0 (nothing to write but dk = dv = 0), seqlen_k = 0 (O = 0, LSE = -inf or the
     * sink; dq = 0), both 0 */
    static const int64_t shapes[][2] = {{0, 9}, {9, 0}, {0, 0}, {1, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 3; t++)
            for (int sinks = 0; sinks < 2; sinks++) {
                fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, shapes[s][0], shapes[s][1], 2, 1, 16);
                spec.sinks = sinks;
                spec.layout = FA_TEST_LAYOUT_PADDED;
                char label[64];
                snprintf(label, sizeof label, "sq=%lld sk=%lld sinks=%d", (long long)shapes[s][0],
                         (long long)shapes[s][1], sinks);
                fa_test_expect_case(&spec, 0, label);
            }
    /* varlen with empty query, key and both sequences */
    static const int32_t lens_q[5] = {0, 5, 3, 0, 7}, lens_k[5] = {4, 0, 6, 0, 7};
    for (int t = 0; t < 3; t++)
        for (int causal = 0; causal < 2; causal++) {
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 5, 7, 7, 4, 2, 24);
            spec.varlen = 1;
            spec.lens_q = lens_q;
            spec.lens_k = lens_k;
            spec.causal = causal;
            spec.sinks = causal;
            fa_test_expect_case(&spec, 0, causal ? "varlen empties causal+sinks" : "varlen empties");
        }
}

/* Rows with no visible key. fa_case_run counts any such row whose O is not exactly 0, whose LSE
 * is not -inf (or the sink logit), or whose dq is not 0 as a failure; here make sure the shapes
 * really have such rows. */
FA_TEST(api_fully_masked_rows) {
    struct {
        const char *label;
        int64_t sq, sk;
        int causal, use_window, left, right, sinks;
    } cases[] = {
        {"causal sq>sk", 40, 17, 1, 0, 0, 0, 0},
        {"causal sq>sk sinks", 40, 17, 1, 0, 0, 0, 1},
        {"window(2,0) sq>sk sinks", 30, 12, 0, 1, 2, 0, 1},
        {"diagonal only, sq>sk", 25, 10, 0, 1, 0, 0, 1},
        {"causal+window sq>sk", 33, 9, 1, 1, 3, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 3; t++) {
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, cases[c].sq, cases[c].sk, 2, 2, 32);
            spec.causal = cases[c].causal;
            spec.use_window = cases[c].use_window;
            spec.window_left = cases[c].left;
            spec.window_right = cases[c].right;
            spec.sinks = cases[c].sinks;
            fa_test_expect_case(&spec, 0, cases[c].label);
        }
    /* the exact values, spelled out once: causal sq = 4 > sk = 2 -> rows 0, 1 see nothing */
    float q[4 * 8], k[2 * 8], v[2 * 8], o[4 * 8], lse[4], sink[1] = {0.75f};
    for (int i = 0; i < 32; i++) q[i] = 0.1f * (float)(i % 7) - 0.2f;
    for (int i = 0; i < 16; i++) k[i] = 0.05f * (float)(i % 5), v[i] = 1.0f + 0.01f * (float)i;
    fa_params p = {0};
    p.batch = 1;
    p.seqlen_q = 4;
    p.seqlen_k = 2;
    p.heads_q = p.heads_kv = 1;
    p.head_dim = 8;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.causal = 1;
    fa_set_contiguous_strides(&p);
    for (int with_sink = 0; with_sink < 2; with_sink++) {
        p.sink_logits = with_sink ? sink : NULL;
        for (int i = 0; i < 32; i++) o[i] = NAN;
        for (int i = 0; i < 4; i++) lse[i] = NAN;
        FA_CHECK(fa_forward(&p) == FA_OK, "forward: %s", fa_last_error());
        int zero = 1;
        for (int i = 0; i < 16; i++) zero &= o[i] == 0.0f;
        FA_CHECK(zero, "sink %d: rows 0-1 of O are not exactly 0 (o[0] = %g)", with_sink, (double)o[0]);
        if (with_sink)
            FA_CHECK(fabsf(lse[0] - 0.75f) <= 4e-7f && fabsf(lse[1] - 0.75f) <= 4e-7f,
                     "LSE of key-less rows with a sink = %.9g %.9g, want the sink 0.75", (double)lse[0], (double)lse[1]);
        else
            FA_CHECK(isinf(lse[0]) && lse[0] < 0 && isinf(lse[1]) && lse[1] < 0,
                     "LSE of key-less rows = %g %g, want -inf", (double)lse[0], (double)lse[1]);
        FA_CHECK(isfinite(lse[2]) && isfinite(lse[3]) && isfinite(o[16]), "rows 2-3 see keys");
    }
}

FA_TEST(api_forward_without_lse) {
    for (int t = 0; t < 3; t++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, 70, 50, 4, 2, 32);
        spec.causal = 1;
        spec.sinks = 1;
        spec.backward = 0;
        fa_test_problem tp;
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
        fa_params p = tp.params;
        p.lse = NULL;
        fa_status st = fa_forward(&p);
        FA_CHECK(st == FA_OK, "%s lse=NULL: %s %s", fa_test_dtype_name(spec.dtype), fa_strerror(st), fa_last_error());
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        fa_ref_references(&tp.params, spec.dtype, 0, &g, &ref, &base);
        fa_test_check c = fa_test_compare(&tp, FA_T_O, &ref, &base);
        FA_CHECK(c.ok, "%s lse=NULL: o err %.3e tol %.3e unwritten %lld", fa_test_dtype_name(spec.dtype), c.err, c.tol,
                 (long long)c.unwritten);
        FA_CHECK(fa_test_buffer_all_poison(&tp, FA_T_LSE), "lse buffer written although lse = NULL");
        fa_ref_references_free(&g, &ref, &base);
        fa_test_problem_destroy(&tp);
    }
}

/* fa_standard_forward: same contract as fa_forward (o, lse), same tolerance */
FA_TEST(api_standard_forward_matches_reference) {
    struct {
        const char *label;
        int causal, window, alibi, sinks, varlen;
        float softcap;
    } cases[] = {
        {"plain", 0, 0, 0, 0, 0, 0},
        {"causal+sinks", 1, 0, 0, 1, 0, 0},
        {"window+alibi", 0, 1, FA_TEST_ALIBI_BATCH_HEAD, 0, 0, 0},
        {"softcap", 0, 0, 0, 0, 0, 2.0f},
        {"varlen everything", 1, 1, FA_TEST_ALIBI_HEAD, 1, 1, 3.0f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 3; t++) {
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, 77, 113, 4, 2, 59);
            spec.causal = cases[c].causal;
            spec.use_window = cases[c].window;
            spec.window_left = 20;
            spec.window_right = 5;
            spec.alibi = (fa_test_alibi)cases[c].alibi;
            spec.sinks = cases[c].sinks;
            spec.varlen = cases[c].varlen;
            spec.softcap = cases[c].softcap;
            spec.backward = 0;
            spec.layout = FA_TEST_LAYOUT_PADDED;
            if (spec.varlen) spec.batch = 4;
            fa_test_problem tp;
            if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
            fa_status st = fa_standard_forward(&tp.params);
            FA_CHECK(st == FA_OK, "%s %s: %s %s", cases[c].label, fa_test_dtype_name(spec.dtype), fa_strerror(st),
                     fa_last_error());
            fa_ref_gathered g;
            fa_ref_outputs ref, base;
            fa_ref_references(&tp.params, spec.dtype, 0, &g, &ref, &base);
            fa_test_check co = fa_test_compare(&tp, FA_T_O, &ref, &base);
            fa_test_check cl = fa_test_compare(&tp, FA_T_LSE, &ref, &base);
            FA_CHECK(co.ok && cl.ok, "standard %s %s: o err %.3e tol %.3e (unwritten %lld clobbered %lld), lse err %.3e tol %.3e (nonfinite %lld)",
                     cases[c].label, fa_test_dtype_name(spec.dtype), co.err, co.tol, (long long)co.unwritten,
                     (long long)co.clobbered, cl.err, cl.tol, (long long)cl.nonfinite);
            FA_CHECK(fa_test_inputs_unchanged(&tp), "standard forward modified an input");
            fa_ref_references_free(&g, &ref, &base);
            fa_test_problem_destroy(&tp);
        }
}

FA_TEST(api_cpu_isa_and_cuda_query) {
    const char *isa = fa_cpu_isa();
    FA_CHECK(isa && (!strcmp(isa, "scalar") || !strcmp(isa, "avx2") || !strcmp(isa, "avx512") || !strcmp(isa, "neon") ||
                     !strcmp(isa, "sve256")),
             "fa_cpu_isa() = \"%s\"", isa ? isa : "(null)");
    int available = fa_cuda_available();
    FA_CHECK(available == 0 || available == 1, "fa_cuda_available() = %d", available);
}

/* zero_varlen_tail: the rows past the last sequence (total_q / total_k beyond cu_seqlens[batch])
 * keep whatever they held when 0, become zeros when 1; every other element is the same. */
FA_TEST(api_zero_varlen_tail) {
    enum { B = 2, HQ = 2, HKV = 1, D = 8, TQ = 11, TK = 13 };
    static const int32_t cu_q[B + 1] = {0, 3, 8}, cu_k[B + 1] = {0, 4, 10}; /* tails of 3 rows */
    static float q[TQ * HQ * D], k[TK * HKV * D], v[TK * HKV * D], dout[TQ * HQ * D];
    static float o[2][TQ * HQ * D], lse[2][HQ * TQ], dq[2][TQ * HQ * D], dk[2][TK * HKV * D],
        dv[2][TK * HKV * D];
    uint32_t seed = 12345u;
    float *inputs[4] = {q, k, v, dout};
    const int counts[4] = {TQ * HQ * D, TK * HKV * D, TK * HKV * D, TQ * HQ * D};
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < counts[t]; i++) {
            seed = seed * 1664525u + 1013904223u;
            inputs[t][i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
        }
    memset(o, 0x7f, sizeof o); /* poison: 0x7f7f7f7f, a large finite float */
    memset(lse, 0x7f, sizeof lse);
    memset(dq, 0x7f, sizeof dq);
    memset(dk, 0x7f, sizeof dk);
    memset(dv, 0x7f, sizeof dv);
    for (int zero = 0; zero < 2; zero++) {
        fa_params p;
        memset(&p, 0, sizeof p);
        p.device = FA_DEVICE_CPU;
        p.dtype = FA_DTYPE_F32;
        p.batch = B;
        p.seqlen_q = 5;
        p.seqlen_k = 6;
        p.heads_q = HQ;
        p.heads_kv = HKV;
        p.head_dim = D;
        p.cu_seqlens_q = cu_q;
        p.cu_seqlens_k = cu_k;
        p.total_q = TQ;
        p.total_k = TK;
        p.zero_varlen_tail = zero;
        p.causal = 1;
        p.q = q, p.k = k, p.v = v, p.o = o[zero], p.lse = lse[zero];
        p.dout = dout, p.dq = dq[zero], p.dk = dk[zero], p.dv = dv[zero];
        fa_set_contiguous_strides(&p);
        if (!FA_CHECK(fa_forward(&p) == FA_OK && fa_backward(&p) == FA_OK, "zero_varlen_tail = %d: %s", zero,
                      fa_last_error()))
            return;
    }
    const uint32_t poison = 0x7f7f7f7fu;
    struct {
        const char *name;
        const float *run[2];
        int rows, first, per_row; /* per_row: elements of a row (lse: its heads, below) */
    } outs[] = {{"o", {o[0], o[1]}, TQ, 8, HQ * D},   {"dq", {dq[0], dq[1]}, TQ, 8, HQ * D},
                {"dk", {dk[0], dk[1]}, TK, 10, HKV * D}, {"dv", {dv[0], dv[1]}, TK, 10, HKV * D}};
    for (size_t t = 0; t < sizeof outs / sizeof outs[0]; t++)
        for (int r = 0; r < outs[t].rows; r++)
            for (int e = 0; e < outs[t].per_row; e++) {
                const float a = outs[t].run[0][r * outs[t].per_row + e], b = outs[t].run[1][r * outs[t].per_row + e];
                uint32_t abits;
                memcpy(&abits, &a, 4);
                if (r < outs[t].first)
                    FA_CHECK(memcmp(&a, &b, 4) == 0, "%s row %d: %g vs %g", outs[t].name, r, a, b);
                else
                    FA_CHECK(abits == poison && b == 0.0f, "%s tail row %d: %g (untouched expected), %g (0 expected)",
                             outs[t].name, r, a, b);
            }
    for (int h = 0; h < HQ; h++) /* lse [heads_q, total_q] */
        for (int r = 0; r < TQ; r++) {
            const float a = lse[0][h * TQ + r], b = lse[1][h * TQ + r];
            uint32_t abits;
            memcpy(&abits, &a, 4);
            FA_CHECK(r < 8 ? memcmp(&a, &b, 4) == 0 : abits == poison && b == 0.0f, "lse head %d row %d: %g, %g", h,
                     r, a, b);
        }
}
