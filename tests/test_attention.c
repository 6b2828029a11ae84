/*
 * test_attention.c: fa_forward and fa_backward against the float64 reference, one test per
 * feature, every CPU dtype (f32, f16, bf16), the shapes of fa_test_feature_shapes (odd sizes,
 * sq < sk and sq > sk, GQA, single token). o, lse, dq, dk, dv (and dsink with sinks) are each
 * held to max|ours - ref64| <= 2·max|baseline - ref64| + floor; every output element must be
 * written, nothing around it, and rows that see no key must be exactly O = 0 / LSE = -inf.
 */
#include <stdio.h>

#include "test_util.h"

typedef void (*feature_fn)(fa_test_spec *spec);

static void run_feature(const char *name, feature_fn apply) {
    const fa_test_shape *shapes;
    int shape_count = fa_test_feature_shapes(&shapes);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < shape_count; i++) {
            const fa_test_shape *sh = &shapes[i];
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], sh->batch, sh->seqlen_q,
                                                  sh->seqlen_k, sh->heads_q, sh->heads_kv,
                                                  sh->head_dim);
            apply(&spec);
            fa_test_expect_case(&spec, 0, name);
        }
}

static void apply_plain(fa_test_spec *s) { (void)s; }
static void apply_causal(fa_test_spec *s) { s->causal = 1; }
static void apply_window_both(fa_test_spec *s) {
    s->use_window = 1;
    s->window_left = 5;
    s->window_right = 3;
}
static void apply_window_left(fa_test_spec *s) {
    s->use_window = 1;
    s->window_left = 17;
    s->window_right = -1;
}
static void apply_window_right(fa_test_spec *s) {
    s->use_window = 1;
    s->window_left = -1;
    s->window_right = 2;
}
static void apply_window_diagonal(fa_test_spec *s) { /* only the diagonal key (often none) */
    s->use_window = 1;
    s->window_left = 0;
    s->window_right = 0;
}
static void apply_causal_window(fa_test_spec *s) {
    s->causal = 1;
    s->use_window = 1;
    s->window_left = 9;
    s->window_right = 4; /* causal folds it to 0 */
}
static void apply_softcap(fa_test_spec *s) {
    s->softcap = 2.0f;
    s->q_amplitude = 2.0; /* scores large enough for tanh to bend */
}
static void apply_alibi_head(fa_test_spec *s) { s->alibi = FA_TEST_ALIBI_HEAD; }
static void apply_alibi_batch_head(fa_test_spec *s) {
    s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
    s->causal = 1;
}
static void apply_sinks(fa_test_spec *s) { s->sinks = 1; }
static void apply_sinks_causal(fa_test_spec *s) { /* sq > sk shapes: rows that see only the sink */
    s->sinks = 1;
    s->causal = 1;
}
static void apply_gqa(fa_test_spec *s) {
    s->heads_kv = 2;
    s->heads_q = 6;
    s->causal = 1;
}
static void apply_mqa(fa_test_spec *s) {
    s->heads_kv = 1;
    s->heads_q = 4;
}
static void apply_head_dim_v(fa_test_spec *s) {
    s->head_dim_v = s->head_dim / 2 + 3; /* dv != d */
    s->sinks = 1;
}
static void apply_scale_sharp(fa_test_spec *s) {
    s->softmax_scale = 0.37f;
    s->q_amplitude = 3.0; /* peaked softmax: exercises the running-max rescaling */
}
static void apply_varlen(fa_test_spec *s) {
    s->varlen = 1;
    s->batch = 4; /* lengths drawn in [0, seqlen], some empty */
    s->causal = 1;
}
static void apply_everything(fa_test_spec *s) {
    s->causal = 1;
    s->use_window = 1;
    s->window_left = 11;
    s->softcap = 3.0f;
    s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
    s->sinks = 1;
    s->heads_kv = 2;
    s->heads_q = 4;
    s->layout = FA_TEST_LAYOUT_PADDED;
}
static void apply_everything_varlen(fa_test_spec *s) {
    apply_everything(s);
    s->varlen = 1;
    s->batch = 3;
    s->causal = 0;
    s->window_right = 6;
    s->layout = FA_TEST_LAYOUT_BHSD;
}

FA_TEST(attention_plain) { run_feature("plain", apply_plain); }
FA_TEST(attention_causal) { run_feature("causal", apply_causal); }
FA_TEST(attention_window_both_sides) { run_feature("window(5,3)", apply_window_both); }
FA_TEST(attention_window_left_only) { run_feature("window(17,-1)", apply_window_left); }
FA_TEST(attention_window_right_only) { run_feature("window(-1,2)", apply_window_right); }
FA_TEST(attention_window_diagonal_only) { run_feature("window(0,0)", apply_window_diagonal); }
FA_TEST(attention_causal_window) { run_feature("causal+window(9,4)", apply_causal_window); }
FA_TEST(attention_softcap) { run_feature("softcap", apply_softcap); }
FA_TEST(attention_alibi_per_head) { run_feature("alibi(h)", apply_alibi_head); }
FA_TEST(attention_alibi_per_batch_head) { run_feature("alibi(bh)+causal", apply_alibi_batch_head); }
FA_TEST(attention_sinks) { run_feature("sinks", apply_sinks); }
FA_TEST(attention_sinks_causal) { run_feature("sinks+causal", apply_sinks_causal); }
FA_TEST(attention_gqa) { run_feature("gqa", apply_gqa); }
FA_TEST(attention_mqa) { run_feature("mqa", apply_mqa); }
FA_TEST(attention_head_dim_v) { run_feature("dv!=d", apply_head_dim_v); }
FA_TEST(attention_scale_sharp) { run_feature("scale+sharp", apply_scale_sharp); }
FA_TEST(attention_varlen) { run_feature("varlen", apply_varlen); }
FA_TEST(attention_everything) { run_feature("everything", apply_everything); }
FA_TEST(attention_everything_varlen) { run_feature("everything+varlen", apply_everything_varlen); }

/* The largest heads: MLA's decode shape (d = 576 = 512 latent + 64 rotary, dv = 512, one kv head
 * for many query heads) and d = dv = 576, forward and backward against float64, every dtype. */
FA_TEST(attention_large_heads) {
    static const struct { int64_t sq, sk, hq, hkv, d, dv; int causal; } cases[] = {
        {2, 37, 8, 1, 576, 512, 1}, {5, 23, 2, 1, 576, 576, 0}, {9, 9, 2, 2, 520, 264, 1}};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], 1, cases[i].sq, cases[i].sk, cases[i].hq,
                                                  cases[i].hkv, cases[i].d);
            spec.head_dim_v = cases[i].dv;
            spec.causal = cases[i].causal;
            fa_test_expect_case(&spec, 0, "large heads");
        }
}
