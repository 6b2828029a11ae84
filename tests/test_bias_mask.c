/*
 * test_bias_mask.c: the additive score bias (fa_params.bias / dbias), document ids and
 * block-sparse masks (kv_num_blocks ... partial_block_bits) on the CPU.
 *
 *   - forward and backward against the float64 oracle (2·baseline + floor rule) over fresh
 *     seeds and odd shapes: full, per-head, per-batch key-padding and per-row biases in f32 /
 *     f16 / bf16, -inf entries and fully -inf rows, sq != sk, GQA, varlen, softcap, ALiBi,
 *     sinks, causal; dbias reduced over its broadcast axes against the oracle's;
 *   - random block masks (partial and full lists, empty lists, bit masks, document ids, causal
 *     and windows inside partial blocks, broadcast lists) against the oracle, whose dense mask
 *     is derived independently from the block structure;
 *   - a block mask gives the same result as the same mask applied densely (a 0 / -inf bias);
 *   - dbias by central finite differences of the library's own f32 forward; dbias bitwise the
 *     same for any thread count; NaN in a visible bias element makes its row NaN, in a masked
 *     one nothing;
 *   - fa_kvcache_forward with a bias over the cache slots equals fa_forward on the same keys;
 *   - bad values rejected with a message naming the field, nothing written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* ---- the modifications of a test problem (fa_test_mods_make) -------------------------------- */

static const fa_test_mods_odds cpu_odds = {.empty_row = 0.1, .partial = 0.35, .partial_or_full = 0.6,
                                           .new_document = 0.08};

/* Attach the modifications of ms to p (host arrays owned by m); 0 when out of memory. */
static int mods_make(fa_test_mods *m, fa_params *p, const fa_test_mods_spec *ms, fa_test_rng *rng) {
    if (fa_test_mods_make(m, p, ms, &cpu_odds, rng) == 0) return 1;
    FA_CHECK(0, "modifications: out of memory");
    return 0;
}

/* ---- one case: forward, backward, dbias against the oracle ----------------------------------- */

/* dbias against the oracle (fa_ref_dbias_compare: summed over the broadcast axes, the 2x rule). */
static int check_dbias(const fa_params *p, const fa_ref_problem *rp, const fa_ref_outputs *ref64,
                       const fa_ref_outputs *base, const char *label) {
    fa_ref_dbias_check c;
    if (!FA_CHECK(fa_ref_dbias_compare(p, p->dbias, rp, ref64, base, &c) == 0, "%s dbias: out of memory", label))
        return 0;
    FA_CHECK(c.unwritten == 0, "%s dbias: %lld elements unwritten (NaN)", label, (long long)c.unwritten);
    return FA_CHECK(c.err <= c.tol, "%s dbias: err %.3e > tol %.3e (baseline err %.3e, max|ref| %.3e)", label, c.err,
                    c.tol, c.base_err, c.ref_max);
}

static void run_mod_case(const fa_test_spec *spec_in, const fa_test_mods_spec *ms, int num_threads, const char *label) {
    fa_test_problem tp;
    char desc[256], full_label[400];
    if (!FA_CHECK(fa_test_problem_create(&tp, spec_in) == 0, "%s: problem not created", label)) return;
    fa_test_describe(&tp, desc, sizeof desc);
    snprintf(full_label, sizeof full_label, "%s [%s %s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld%s]", label,
             fa_test_dtype_name(tp.spec.dtype), desc, (long long)tp.spec.batch, (long long)tp.spec.seqlen_q,
             (long long)tp.spec.seqlen_k, (long long)tp.spec.heads_q, (long long)tp.spec.heads_kv,
             (long long)tp.spec.head_dim, tp.spec.varlen ? " varlen" : "");
    fa_test_rng rng;
    fa_test_rng_seed(&rng, tp.spec.seed ^ 0xb1a5ull);
    fa_test_mods m;
    fa_params *p = &tp.params;
    p->num_threads = num_threads;
    if (!mods_make(&m, p, ms, &rng)) goto out;
    fa_ref_gathered g;
    fa_ref_outputs ref64, base;
    if (!FA_CHECK(fa_ref_references(p, tp.spec.dtype, tp.spec.backward, &g, &ref64, &base) == 0, "%s: reference OOM",
                  full_label))
        goto out;
    fa_status s = fa_forward(p);
    if (FA_CHECK(s == FA_OK, "%s: fa_forward: %s", full_label, fa_last_error())) {
        fa_test_check o = fa_test_compare(&tp, FA_T_O, &ref64, &base), lse = fa_test_compare(&tp, FA_T_LSE, &ref64, &base);
        FA_CHECK(o.ok, "%s o: err %.3e > tol %.3e (base %.3e) unwritten %lld nonfinite %lld clobbered %lld", full_label,
                 o.err, o.tol, o.base_err, (long long)o.unwritten, (long long)o.nonfinite, (long long)o.clobbered);
        FA_CHECK(lse.ok, "%s lse: err %.3e > tol %.3e nonfinite %lld", full_label, lse.err, lse.tol,
                 (long long)lse.nonfinite);
        const int64_t inexact = fa_test_masked_rows_inexact(&tp, &ref64);
        FA_CHECK(inexact == 0, "%s: %lld elements of fully masked rows are not O = 0 / LSE = -inf", full_label,
                 (long long)inexact);
        if (tp.spec.backward) {
            fa_test_poison_backward_outputs(&tp);
            s = fa_backward(p);
            if (FA_CHECK(s == FA_OK, "%s: fa_backward: %s", full_label, fa_last_error())) {
                static const int grads[3] = {FA_T_DQ, FA_T_DK, FA_T_DV};
                for (int t = 0; t < 3; t++) {
                    fa_test_check c = fa_test_compare(&tp, grads[t], &ref64, &base);
                    FA_CHECK(c.ok, "%s %s: err %.3e > tol %.3e (base %.3e, max|ref| %.3e) unwritten %lld nonfinite %lld",
                             full_label, fa_test_tensor_name(grads[t]), c.err, c.tol, c.base_err, c.ref_max,
                             (long long)c.unwritten, (long long)c.nonfinite);
                }
                if (p->dbias) check_dbias(p, &g.rp, &ref64, &base, full_label);
            }
        }
    }
    FA_CHECK(fa_test_inputs_unchanged(&tp), "%s: an input was modified", full_label);
    fa_ref_references_free(&g, &ref64, &base);
out:
    p->bias = NULL;
    fa_test_mods_free(&m);
    fa_test_problem_destroy(&tp);
}

/* ---- tests --------------------------------------------------------------------------------- */

FA_TEST(bias_forward_backward) {
    const fa_test_shape *shapes;
    int shape_count = fa_test_feature_shapes(&shapes);
    if (shape_count > 3) shape_count = 3; /* the long shapes add time, not coverage */
    static const fa_test_bias_kind kinds[4] = {FA_TEST_BIAS_FULL, FA_TEST_BIAS_HEAD, FA_TEST_BIAS_KEYPAD,
                                               FA_TEST_BIAS_ROW};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < shape_count; i++)
            for (int k = 0; k < 4; k++) {
                const fa_test_shape *sh = &shapes[i];
                fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], sh->batch, sh->seqlen_q, sh->seqlen_k,
                                                      sh->heads_q, sh->heads_kv, sh->head_dim);
                spec.seed ^= (uint64_t)k * 0x51ull;
                spec.layout = (fa_test_layout)((i + k) % 3);
                fa_test_mods_spec ms = {kinds[k], fa_test_cpu_dtypes[(t + k) % 3], k < 2, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32};
                ms.dbias_dtype = fa_test_cpu_dtypes[(t + 2 * k + 1) % 3]; /* every pairing over the cases */
                if (k == 1) spec.causal = 1;
                if (k == 2) spec.softcap = 4.0f;
                if (k == 3) {
                    spec.alibi = FA_TEST_ALIBI_HEAD;
                    spec.use_window = 1;
                    spec.window_left = 9;
                    spec.window_right = 3;
                }
                run_mod_case(&spec, &ms, 0, "bias");
            }
}

FA_TEST(bias_varlen_gqa_sinks) {
    for (int t = 0; t < 3; t++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 4, 37, 70, 6, 2, 40);
        spec.varlen = 1;
        spec.causal = t != 1;
        spec.sinks = t == 2;
        spec.layout = FA_TEST_LAYOUT_PADDED;
        fa_test_mods_spec ms = {t == 1 ? FA_TEST_BIAS_HEAD : FA_TEST_BIAS_FULL, FA_DTYPE_BF16, 1, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32};
        run_mod_case(&spec, &ms, 0, "bias varlen");
        /* a fused-scheme sized problem (many kv heads) */
        fa_test_spec many = fa_test_base_spec(fa_test_cpu_dtypes[t], 3, 20, 45, 24, 12, 16);
        fa_test_mods_spec ms2 = {FA_TEST_BIAS_FULL, FA_DTYPE_F32, 0, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32};
        run_mod_case(&many, &ms2, 0, "bias many heads");
    }
}

FA_TEST(block_mask_random) {
    static const int64_t sizes[][2] = {{16, 16}, {7, 13}, {1, 1}, {64, 128}, {5, 200}};
    const fa_test_shape *shapes;
    int shape_count = fa_test_feature_shapes(&shapes);
    if (shape_count > 4) shape_count = 4;
    int n = 0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < shape_count; i++)
            for (int z = 0; z < 5; z++, n++) {
                if (n % 2 && fa_test_get_level() != FA_LEVEL_FULL) continue; /* half the grid at normal level */
                const fa_test_shape *sh = &shapes[i];
                fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], sh->batch, sh->seqlen_q, sh->seqlen_k,
                                                      sh->heads_q, sh->heads_kv, sh->head_dim);
                spec.seed ^= (uint64_t)z * 0x9e37ull;
                spec.causal = z % 2;
                if (z == 3) {
                    spec.use_window = 1;
                    spec.window_left = 20;
                    spec.window_right = -1;
                }
                if (z == 4) {
                    spec.varlen = 1;
                    spec.batch = 3;
                    spec.layout = FA_TEST_LAYOUT_PADDED;
                }
                fa_test_mods_spec ms = {z == 2 ? FA_TEST_BIAS_FULL : FA_TEST_BIAS_NONE, FA_DTYPE_F32, 0, z == 2, 1,
                                        sizes[z][0], sizes[z][1], z == 1, z != 3, z >= 3, FA_DTYPE_F32};
                run_mod_case(&spec, &ms, 0, "block mask");
            }
}

FA_TEST(doc_ids_packed_sequences) {
    for (int t = 0; t < 3; t++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, 150, 150, 4, 2, 32);
        spec.causal = 1;
        fa_test_mods_spec ms = {FA_TEST_BIAS_NONE, FA_DTYPE_F32, 0, 0, 0, 0, 0, 0, 0, 1, FA_DTYPE_F32};
        run_mod_case(&spec, &ms, 0, "doc ids");
        spec.varlen = 1;
        spec.layout = FA_TEST_LAYOUT_PADDED;
        ms.bias = FA_TEST_BIAS_KEYPAD; /* with a bias */
        run_mod_case(&spec, &ms, 0, "doc ids varlen");
    }
}

/* The block mask and the same mask as a dense 0 / -inf bias give the same output (the
 * skipped tiles contribute nothing, bitwise). */
FA_TEST(block_mask_equals_dense) {
    for (int t = 0; t < 3; t++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 2, 77, 300, 4, 2, 48);
        spec.causal = 1;
        spec.backward = 0;
        fa_test_problem tp;
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem")) return;
        fa_test_rng rng;
        fa_test_rng_seed(&rng, spec.seed);
        fa_test_mods m;
        fa_test_mods_spec ms = {FA_TEST_BIAS_NONE, FA_DTYPE_F32, 0, 0, 1, 16, 32, 0, 1, 1, FA_DTYPE_F32};
        fa_params *p = &tp.params;
        if (!mods_make(&m, p, &ms, &rng)) {
            fa_test_problem_destroy(&tp);
            return;
        }
        fa_ref_gathered g;
        if (!FA_CHECK(fa_ref_gather(p, &g) == 0, "gather")) return;
        FA_CHECK(fa_forward(p) == FA_OK, "block-mask forward: %s", fa_last_error());
        void *o_blocks = fa_test_snapshot(&tp, FA_T_O);
        /* dense: bias 0 where visible, -inf elsewhere; no causal, no block mask */
        const int64_t n = p->batch * p->heads_q * p->seqlen_q * p->seqlen_k;
        float *dense = malloc(sizeof(float) * (size_t)n);
        for (int64_t e = 0; e < n; e++) dense[e] = g.visible[e] ? 0.0f : -INFINITY;
        fa_params dp = *p;
        dp.kv_num_blocks = NULL;
        dp.kv_indices = dp.full_kv_indices = dp.full_kv_num_blocks = NULL;
        dp.partial_block_bits = NULL;
        dp.doc_ids_q = dp.doc_ids_k = NULL;
        dp.causal = 0;
        dp.bias = dense;
        dp.bias_dtype = FA_DTYPE_F32;
        dp.bias_col_stride = 1;
        dp.bias_row_stride = p->seqlen_k;
        dp.bias_head_stride = p->seqlen_q * p->seqlen_k;
        dp.bias_batch_stride = p->heads_q * p->seqlen_q * p->seqlen_k;
        fa_test_poison_forward_outputs(&tp);
        FA_CHECK(fa_forward(&dp) == FA_OK, "dense forward: %s", fa_last_error());
        FA_CHECK(fa_test_same_as_snapshot(&tp, FA_T_O, o_blocks), "%s: block-sparse o differs from the dense mask's",
                 fa_test_dtype_name(spec.dtype));
        free(o_blocks);
        free(dense);
        fa_ref_gathered_free(&g);
        fa_test_mods_free(&m);
        fa_test_problem_destroy(&tp);
    }
}

/* dbias of a per-head bias (summed over the batch) by central differences of
 * L = Σ O ∘ dO with the library's f32 forward. */
FA_TEST(dbias_finite_differences) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 2, 9, 13, 2, 1, 8);
    spec.causal = 1;
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem")) return;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, spec.seed);
    fa_test_mods m;
    fa_test_mods_spec ms = {FA_TEST_BIAS_HEAD, FA_DTYPE_F32, 0, 1, 0, 0, 0, 0, 0, 0, FA_DTYPE_F32};
    fa_params *p = &tp.params;
    p->num_threads = 1;
    if (!mods_make(&m, p, &ms, &rng)) {
        fa_test_problem_destroy(&tp);
        return;
    }
    FA_CHECK(fa_forward(p) == FA_OK, "forward: %s", fa_last_error());
    FA_CHECK(fa_backward(p) == FA_OK, "backward: %s", fa_last_error());
    float *bias = m.array[FA_TEST_MOD_BIAS];
    int checked = 0;
    for (int trial = 0; trial < 12; trial++) {
        const int64_t h = fa_test_rng_int(&rng, 0, p->heads_q - 1), i = fa_test_rng_int(&rng, 0, p->seqlen_q - 1);
        const int64_t j = fa_test_rng_int(&rng, 0, i + p->seqlen_k - p->seqlen_q); /* a visible key */
        const int64_t at = h * p->bias_head_stride + i * p->bias_row_stride + j;
        const float keep = bias[at], eps = 1e-2f;
        double loss[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            bias[at] = keep + (sgn ? -eps : eps);
            fa_forward(p);
            double l = 0.0;
            for (int64_t b = 0; b < p->batch; b++)
                for (int64_t r = 0; r < p->seqlen_q; r++)
                    for (int64_t hh = 0; hh < p->heads_q; hh++)
                        for (int64_t c = 0; c < p->head_dim_v; c++) {
                            l += fa_test_load(p->o, p->dtype,
                                              b * p->o_batch_stride + r * p->o_row_stride + hh * p->o_head_stride + c) *
                                 fa_test_load(p->dout, p->dtype,
                                              b * p->do_batch_stride + r * p->do_row_stride + hh * p->do_head_stride + c);
                        }
            loss[sgn] = l;
        }
        bias[at] = keep;
        const double numeric = (loss[0] - loss[1]) / (2.0 * eps);
        const double analytic = fa_test_load(p->dbias, p->dbias_dtype, at);
        checked++;
        FA_CHECK(fabs(numeric - analytic) <= 2e-3 + 1e-2 * fabs(numeric),
                 "dbias[h=%lld][i=%lld][j=%lld]: analytic %.6f, finite differences %.6f", (long long)h, (long long)i,
                 (long long)j, analytic, numeric);
    }
    FA_CHECK(checked == 12, "checked %d", checked);
    fa_test_mods_free(&m);
    fa_test_problem_destroy(&tp);
}

/* dbias (summed over batch and rows) and dq/dk/dv bitwise identical for 1 and 3 threads. */
FA_TEST(dbias_deterministic_threads) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_BF16, 3, 70, 140, 4, 2, 32);
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem")) return;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, spec.seed);
    fa_test_mods m;
    fa_test_mods_spec ms = {FA_TEST_BIAS_FULL, FA_DTYPE_F16, 0, 1, 1, 20, 30, 0, 1, 0, FA_DTYPE_F32};
    fa_params *p = &tp.params;
    if (!mods_make(&m, p, &ms, &rng)) {
        fa_test_problem_destroy(&tp);
        return;
    }
    p->dbias_batch_stride = 0; /* summed over the batch and the rows */
    p->dbias_row_stride = 0;
    const size_t dbias_bytes = m.bytes[FA_TEST_MOD_DBIAS];
    float *first = malloc(dbias_bytes);
    void *dq = NULL;
    for (int run = 0; run < 2; run++) {
        p->num_threads = run ? 3 : 1;
        FA_CHECK(fa_forward(p) == FA_OK, "forward: %s", fa_last_error());
        FA_CHECK(fa_backward(p) == FA_OK, "backward: %s", fa_last_error());
        if (run == 0) {
            memcpy(first, m.array[FA_TEST_MOD_DBIAS], dbias_bytes);
            dq = fa_test_snapshot(&tp, FA_T_DQ);
        } else {
            FA_CHECK(memcmp(first, m.array[FA_TEST_MOD_DBIAS], dbias_bytes) == 0,
                     "dbias differs between 1 and 3 threads");
            FA_CHECK(fa_test_same_as_snapshot(&tp, FA_T_DQ, dq), "dq differs between 1 and 3 threads");
        }
    }
    free(first);
    free(dq);
    fa_test_mods_free(&m);
    fa_test_problem_destroy(&tp);
}

/* NaN in a visible bias element makes its row NaN; in a masked element (causal) nothing. */
FA_TEST(bias_nan_propagates) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 1, 8, 8, 1, 1, 16);
    spec.causal = 1;
    spec.backward = 0;
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem")) return;
    float bias[64] = {0};
    fa_params *p = &tp.params;
    p->bias = bias;
    p->bias_row_stride = 8;
    p->bias_col_stride = 1;
    bias[2 * 8 + 1] = NAN; /* row 2, key 1: visible */
    bias[3 * 8 + 6] = NAN; /* row 3, key 6: above the diagonal, masked */
    FA_CHECK(fa_forward(p) == FA_OK, "forward: %s", fa_last_error());
    for (int64_t i = 0; i < 8; i++) {
        const double o = fa_test_load(p->o, p->dtype, i * p->o_row_stride);
        FA_CHECK(i == 2 ? isnan(o) && isnan(p->lse[i]) : isfinite(o) && isfinite(p->lse[i]),
                 "row %lld: o %g lse %g", (long long)i, o, (double)p->lse[i]);
    }
    fa_test_problem_destroy(&tp);
}

/* fa_kvcache_forward with a bias over the cache slots equals fa_forward over the same keys,
 * one sequence at a time (the decode kernels and the general items, left padding). */
FA_TEST(bias_kvcache) {
    for (int variant = 0; variant < 3; variant++) {
        /* sq 1 and 5: the decode kernels (group · sq <= 16); 9: the general KV-cache items */
        const int64_t B = 3, cap = 90, hq = 4, hkv = 2, d = 64, sq = variant == 0 ? 1 : variant == 1 ? 5 : 9;
        fa_test_rng rng;
        fa_test_rng_seed(&rng, fa_test_seed() + (uint64_t)variant);
        float *k = malloc(sizeof(float) * (size_t)(B * cap * hkv * d)), *v = malloc(sizeof(float) * (size_t)(B * cap * hkv * d));
        float *q = malloc(sizeof(float) * (size_t)(B * sq * hq * d));
        float *o1 = malloc(sizeof(float) * (size_t)(B * sq * hq * d)), *o2 = malloc(sizeof(float) * (size_t)(B * sq * hq * d));
        uint16_t *bias = malloc(sizeof(uint16_t) * (size_t)(B * hq * sq * cap));
        for (int64_t e = 0; e < B * cap * hkv * d; e++) {
            k[e] = (float)fa_test_rng_normal(&rng);
            v[e] = (float)fa_test_rng_normal(&rng);
        }
        for (int64_t e = 0; e < B * sq * hq * d; e++) q[e] = (float)fa_test_rng_normal(&rng);
        for (int64_t e = 0; e < B * hq * sq * cap; e++)
            bias[e] = fa_test_f32_to_bf16(fa_test_rng_uniform(&rng) < 0.1 ? -INFINITY : (float)fa_test_rng_normal(&rng));
        int32_t seqlens[3] = {90, 41, 7}, leftpad[3] = {0, 5, 2};
        fa_params p = {0};
        p.batch = B;
        p.seqlen_q = sq;
        p.seqlen_k = cap;
        p.heads_q = hq;
        p.heads_kv = hkv;
        p.head_dim = d;
        p.q = q;
        p.k = k;
        p.v = v;
        p.o = o1;
        fa_set_contiguous_strides(&p);
        p.causal = 1;
        p.cache_seqlens = seqlens;
        p.cache_leftpad = leftpad;
        p.bias = bias;
        p.bias_dtype = FA_DTYPE_BF16;
        p.bias_col_stride = 1;
        p.bias_row_stride = cap;
        p.bias_head_stride = sq * cap;
        p.bias_batch_stride = hq * sq * cap;
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "kvcache: %s", fa_last_error());
        double max_diff = 0.0;
        for (int64_t b = 0; b < B; b++) {
            fa_params f = p;
            f.cache_seqlens = f.cache_leftpad = NULL;
            f.batch = 1;
            f.seqlen_k = seqlens[b] - leftpad[b];
            f.q = q + b * p.q_batch_stride;
            f.o = o2 + b * p.o_batch_stride;
            f.k = k + b * p.k_batch_stride + leftpad[b] * p.k_row_stride;
            f.v = v + b * p.v_batch_stride + leftpad[b] * p.v_row_stride;
            f.bias = bias + b * p.bias_batch_stride + leftpad[b];
            FA_CHECK(fa_forward(&f) == FA_OK, "forward b=%lld: %s", (long long)b, fa_last_error());
        }
        for (int64_t e = 0; e < B * sq * hq * d; e++) {
            double x = fabs((double)o1[e] - (double)o2[e]);
            if (!(x <= max_diff)) max_diff = isnan(x) ? INFINITY : x;
        }
        FA_CHECK(max_diff <= 2e-5, "sq %lld: kvcache with bias differs from fa_forward by %.3e", (long long)sq, max_diff);
        free(k);
        free(v);
        free(q);
        free(o1);
        free(o2);
        free(bias);
    }
}

/* ---- errors ------------------------------------------------------------------------------ */

/* The block lists of a problem, writable (the cases below break them). */
typedef struct block_lists {
    int32_t *counts, *indices, *full_counts, *full_indices;
} block_lists;

typedef void (*mutate_fn)(fa_params *p, block_lists *m);
static void bad_col_stride(fa_params *p, block_lists *m) { (void)m; p->bias_col_stride = 2; }
static void bad_bias_dtype(fa_params *p, block_lists *m) { (void)m; p->bias_dtype = (fa_dtype)7; }
static void bad_dbias_stride(fa_params *p, block_lists *m) { (void)m; p->dbias_col_stride = 3; }
static void dbias_no_bias(fa_params *p, block_lists *m) { (void)m; p->bias = NULL; }
static void index_range(fa_params *p, block_lists *m) { m->counts[0] = 1; m->indices[0] = 999; (void)p; }
static void index_unsorted(fa_params *p, block_lists *m) {
    (void)p;
    m->counts[0] = 2;
    m->indices[0] = 1;
    m->indices[1] = 0;
    m->full_counts[0] = 0;
}
static void index_duplicate(fa_params *p, block_lists *m) {
    (void)p;
    m->counts[0] = 2;
    m->indices[0] = 1;
    m->indices[1] = 1;
    m->full_counts[0] = 0;
}
static void count_over(fa_params *p, block_lists *m) { m->counts[0] = 1000; (void)p; }
static void count_negative(fa_params *p, block_lists *m) { m->full_counts[0] = -1; (void)p; }
static void both_lists(fa_params *p, block_lists *m) {
    (void)p;
    m->counts[0] = 1;
    m->indices[0] = 0;
    m->full_counts[0] = 1;
    m->full_indices[0] = 0;
}
static void block_q_zero(fa_params *p, block_lists *m) { (void)m; p->block_q = 0; }
static void full_half(fa_params *p, block_lists *m) { (void)m; p->full_kv_indices = NULL; }
static void indices_null(fa_params *p, block_lists *m) { (void)m; p->kv_indices = NULL; }
static void doc_half(fa_params *p, block_lists *m) { (void)m; p->doc_ids_k = NULL; }
static void index_stride_negative(fa_params *p, block_lists *m) { (void)m; p->block_index_row_stride = -1; }
static void bits_without_mask(fa_params *p, block_lists *m) {
    (void)m;
    p->kv_num_blocks = NULL;
    p->kv_indices = p->full_kv_indices = p->full_kv_num_blocks = NULL;
}
static void lists_checked_two(fa_params *p, block_lists *m) { (void)m; p->block_lists_checked = 2; }
/* the CPU checks the lists whatever block_lists_checked says */
static void index_range_checked(fa_params *p, block_lists *m) {
    index_range(p, m);
    p->block_lists_checked = 1;
}
static void dbias_overlaps_o(fa_params *p, block_lists *m) { (void)m; p->dbias = p->o; }
static void bad_dbias_dtype(fa_params *p, block_lists *m) { (void)m; p->dbias_dtype = FA_DTYPE_FP8_E4M3; }

FA_TEST(bias_mask_errors) {
    static const struct {
        const char *label, *field;
        mutate_fn mutate;
        fa_status want;
        int backward;
    } cases[] = {
        {"bias_col_stride 2", "bias_col_stride", bad_col_stride, FA_ERR_STRIDE, 0},
        {"bias_dtype 7", "bias_dtype", bad_bias_dtype, FA_ERR_DTYPE, 0},
        {"dbias_col_stride 3", "dbias_col_stride", bad_dbias_stride, FA_ERR_STRIDE, 1},
        {"dbias without bias", "dbias", dbias_no_bias, FA_ERR_NULL_POINTER, 1},
        {"index out of range", "kv_indices", index_range, FA_ERR_INVALID_ARGUMENT, 0},
        {"index unsorted", "kv_indices", index_unsorted, FA_ERR_INVALID_ARGUMENT, 0},
        {"index duplicate", "kv_indices", index_duplicate, FA_ERR_INVALID_ARGUMENT, 0},
        {"count over kv_blocks", "kv_num_blocks", count_over, FA_ERR_INVALID_ARGUMENT, 0},
        {"full count negative", "full_kv_num_blocks", count_negative, FA_ERR_INVALID_ARGUMENT, 1},
        {"partial and full", "full_kv_indices", both_lists, FA_ERR_INVALID_ARGUMENT, 0},
        {"block_lists_checked 2", "block_lists_checked", lists_checked_two, FA_ERR_INVALID_ARGUMENT, 0},
        {"index out of range, lists said checked", "kv_indices", index_range_checked, FA_ERR_INVALID_ARGUMENT, 1},
        {"block_q 0", "block_q", block_q_zero, FA_ERR_INVALID_SIZE, 0},
        {"full_kv_indices missing", "full_kv_indices", full_half, FA_ERR_NULL_POINTER, 0},
        {"kv_indices missing", "kv_indices", indices_null, FA_ERR_NULL_POINTER, 0},
        {"doc_ids_k missing", "doc_ids_k", doc_half, FA_ERR_NULL_POINTER, 0},
        {"index stride negative", "block_index_row_stride", index_stride_negative, FA_ERR_STRIDE, 0},
        {"bits without a mask", "partial_block_bits", bits_without_mask, FA_ERR_NULL_POINTER, 0},
        {"dbias overlaps o", "dbias", dbias_overlaps_o, FA_ERR_OVERLAP, 1},
        {"dbias_dtype fp8", "dbias_dtype", bad_dbias_dtype, FA_ERR_DTYPE, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 2, 20, 30, 2, 1, 16);
        fa_test_problem tp;
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem")) return;
        fa_test_rng rng;
        fa_test_rng_seed(&rng, 5);
        fa_test_mods m;
        fa_test_mods_spec ms = {FA_TEST_BIAS_FULL, FA_DTYPE_F32, 0, 1, 1, 8, 8, 0, 1, 1, FA_DTYPE_F32};
        fa_params *p = &tp.params;
        if (!mods_make(&m, p, &ms, &rng)) {
            fa_test_problem_destroy(&tp);
            return;
        }
        FA_CHECK(fa_check_forward(p, NULL) == FA_OK && fa_check_backward(p, NULL) == FA_OK, "%s: base rejected: %s",
                 cases[c].label, fa_last_error());
        block_lists lists = {m.array[FA_TEST_MOD_COUNTS], m.array[FA_TEST_MOD_INDICES],
                             m.array[FA_TEST_MOD_FULL_COUNTS], m.array[FA_TEST_MOD_FULL_INDICES]};
        cases[c].mutate(p, &lists);
        fa_test_poison_forward_outputs(&tp);
        fa_test_poison_backward_outputs(&tp);
        float *dbias = m.array[FA_TEST_MOD_DBIAS];
        const size_t dbias_count = m.bytes[FA_TEST_MOD_DBIAS] / sizeof(float);
        const fa_status got = cases[c].backward ? fa_backward(p) : fa_forward(p);
        const char *message = fa_last_error();
        FA_CHECK(got == cases[c].want, "%s: status %s, want %s (%s)", cases[c].label, fa_strerror(got),
                 fa_strerror(cases[c].want), message);
        FA_CHECK(strstr(message, cases[c].field) != NULL, "%s: message does not name %s: %s", cases[c].label,
                 cases[c].field, message);
        int untouched = fa_test_buffer_all_poison(&tp, FA_T_O) && fa_test_buffer_all_poison(&tp, FA_T_LSE) &&
                        fa_test_buffer_all_poison(&tp, FA_T_DQ) && fa_test_buffer_all_poison(&tp, FA_T_DK);
        for (size_t e = 0; dbias && e < dbias_count; e++) untouched &= isnan(dbias[e]);
        FA_CHECK(untouched, "%s: an output was written", cases[c].label);
        p->dbias = NULL;
        fa_test_mods_free(&m);
        fa_test_problem_destroy(&tp);
    }
    /* calls without these features reject them by name */
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 1, 4, 4, 1, 1, 8);
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "problem")) return;
    float bias[16] = {0};
    tp.params.bias = bias;
    tp.params.bias_row_stride = 4;
    tp.params.bias_col_stride = 1;
    fa_status s = fa_standard_forward(&tp.params);
    FA_CHECK(s == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "bias"), "standard forward with bias: %s %s",
             fa_strerror(s), fa_last_error());
    int32_t counts[1] = {1}, index[1] = {0};
    tp.params.bias = NULL;
    tp.params.kv_num_blocks = counts;
    tp.params.kv_indices = index;
    tp.params.block_q = tp.params.block_k = 4;
    int32_t seqlens[1] = {4};
    tp.params.cache_seqlens = seqlens;
    s = fa_kvcache_forward(&tp.params);
    FA_CHECK(s == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "kv_num_blocks"), "kvcache with a block mask: %s %s",
             fa_strerror(s), fa_last_error());
    fa_test_problem_destroy(&tp);
}
