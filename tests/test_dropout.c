/*
 * test_dropout.c: attention dropout on the CPU (fa_params.dropout_p / dropout_seed /
 * dropout_offset, src/api/fa_philox.h).
 *
 *   - Philox4x32 with 7 rounds (the mask's) and 10 against the published known-answer vectors
 *     (Random123);
 *   - the mapping spelled out (counter, word, byte) against fa_dropout_keep, the 8-bit
 *     thresholds (round(p · 256), clamped) and keep scales (256 / (256 - threshold)), the
 *     byte-parallel compare of fa_dropout_keep_bits16 against the plain one for every byte and
 *     threshold;
 *   - the mask's statistics: the keep rate of every p within a 6-sigma binomial bound of the
 *     quantised rate 1 - threshold / 256, for each of the sixteen 8-bit numbers of a Philox
 *     call, and independent masks for offsets ceil(sk / 16) apart and for different seeds
 *     (agreement rate d² + (1 - d)², d = threshold / 256);
 *   - forward and backward (f32, f16, bf16; causal, GQA, sinks, varlen, softcap, ALiBi, window)
 *     against the float64 oracle applying the same mask (2·baseline + floor rule);
 *   - LSE bitwise unaffected by dropout; the same seed and offset give bitwise identical o, dq,
 *     dk, dv for any thread count; another seed or offset gives another result; dropout_p = 0
 *     gives the result without dropout bitwise;
 *   - attn_probs: signs follow the mask, magnitudes are the float64 softmax probabilities;
 *   - gradients by central finite differences of the library's own forward (f32).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_philox.h"
#include "test_util.h"

FA_TEST(dropout_philox_known_answers) {
    /* Random123's kat_vectors for philox4x32 with 7 rounds (the mask's) and with 10 */
    static const uint32_t in[3][6] = {
        {0, 0, 0, 0, 0, 0},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u},
    };
    static const uint32_t out7[3][4] = {
        {0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u},
        {0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u},
        {0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au},
    };
    static const uint32_t out10[3][4] = {
        {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    FA_CHECK(FA_DROPOUT_PHILOX_ROUNDS == 7, "the mask's generator has %d rounds", FA_DROPOUT_PHILOX_ROUNDS);
    for (int t = 0; t < 3; t++) {
        const fa_philox_u32x4 r7 = fa_philox4x32(in[t][0], in[t][1], in[t][2], in[t][3], in[t][4], in[t][5], 7);
        const fa_philox_u32x4 r10 = fa_philox4x32(in[t][0], in[t][1], in[t][2], in[t][3], in[t][4], in[t][5], 10);
        for (int w = 0; w < 4; w++) {
            FA_CHECK(r7.x[w] == out7[t][w], "7 rounds, vector %d word %d: %08x, expected %08x", t, w, r7.x[w],
                     out7[t][w]);
            FA_CHECK(r10.x[w] == out10[t][w], "10 rounds, vector %d word %d: %08x, expected %08x", t, w, r10.x[w],
                     out10[t][w]);
        }
    }
    FA_CHECK(fa_dropout_threshold(0.0f) == 0u, "threshold(0) = %u", fa_dropout_threshold(0.0f));
    FA_CHECK(fa_dropout_threshold(0.5f) == 128u, "threshold(0.5) = %u", fa_dropout_threshold(0.5f));
    FA_CHECK(fa_dropout_threshold(0.1f) == 26u, "threshold(0.1) = %u (round(25.6))", fa_dropout_threshold(0.1f));
    FA_CHECK(fa_dropout_threshold(0.0019f) == 0u, "threshold(0.0019) = %u", fa_dropout_threshold(0.0019f));
    FA_CHECK(fa_dropout_threshold(0.0021f) == 1u, "threshold(0.0021) = %u", fa_dropout_threshold(0.0021f));
    FA_CHECK(fa_dropout_threshold(0.99999994f) == 255u, "threshold(1 - 2^-24) = %u (clamped to 255)",
             fa_dropout_threshold(0.99999994f));
    FA_CHECK(fa_dropout_keep_scale(0) == 1.0f && fa_dropout_keep_scale(128) == 2.0f &&
                 fa_dropout_keep_scale(26) == 256.0f / 230.0f && fa_dropout_keep_scale(255) == 256.0f,
             "keep scales 256 / (256 - threshold)");
    /* the byte-parallel compare against the plain one: every byte value in every byte position
     * (neighbours random), every threshold */
    {
        uint32_t mix = 0x9e3779b9u;
        for (uint32_t th = 0; th < 256; th++)
            for (uint32_t v = 0; v < 256; v++) {
                fa_philox_u32x4 r;
                for (int w = 0; w < 4; w++) {
                    mix = mix * 1664525u + 1013904223u;
                    r.x[w] = mix;
                }
                const int at = (int)((v + th) & 15);
                r.x[at >> 2] = (r.x[at >> 2] & ~(0xFFu << (8 * (at & 3)))) | (v << (8 * (at & 3)));
                const uint32_t bits = fa_dropout_keep_bits16(r, th);
                uint32_t want = 0;
                for (int k = 0; k < 16; k++) want |= (uint32_t)(fa_dropout_number(r, k) >= th) << k;
                if (!FA_CHECK(bits == want, "keep_bits16 threshold %u byte %u at %d: %04x, expected %04x", th, v, at,
                              bits, want))
                    th = 256, v = 256;
            }
    }
    /* the mapping of fa_philox.h's comment, spelled out: counter (lo, hi of offset + j/16, i,
     * b·heads_q + h), key = seed, byte j % 4 of word (j % 16) / 4 */
    {
        const uint64_t seed = 0x0123456789abcdefull, offset = 0xfffffffffull;
        const int64_t b = 2, h = 3, heads = 5, i = 77;
        const uint32_t threshold = fa_dropout_threshold(0.45f);
        for (int64_t j = 0; j < 40; j++) {
            const uint64_t column = offset + (uint64_t)j / 16;
            fa_philox_u32x4 r = fa_philox4x32((uint32_t)column, (uint32_t)(column >> 32), (uint32_t)i,
                                              (uint32_t)(b * heads + h), (uint32_t)seed, (uint32_t)(seed >> 32), 7);
            const uint32_t number = (r.x[(j % 16) / 4] >> (8 * (j % 4))) & 0xFFu;
            if (!FA_CHECK(fa_dropout_keep(seed, offset, threshold, b, h, heads, i, j) == (number >= threshold),
                          "key %lld: keep() disagrees with the mapping (number %u, threshold %u)", (long long)j,
                          number, threshold))
                break;
        }
    }
    /* apply_row agrees with keep() element by element, from any starting key */
    float row[37];
    for (int64_t j0 = 0; j0 < 10; j0++) {
        for (int t = 0; t < 37; t++) row[t] = 1.0f;
        fa_dropout_apply_row(99, 7, fa_dropout_threshold(0.4f), 2.5f, 1, 2, 3, 5, j0, 37, row, 1);
        for (int t = 0; t < 37; t++) {
            float want = fa_dropout_keep(99, 7, fa_dropout_threshold(0.4f), 1, 2, 3, 5, j0 + t) ? 2.5f : 0.0f;
            if (!FA_CHECK(row[t] == want, "apply_row j0 %lld key %d: %g, keep() says %g", (long long)j0, t,
                          (double)row[t], (double)want))
                return;
        }
    }
}

/* |count - n·q| <= 6·sqrt(n·q·(1 - q)) + 1 */
static int binomial_ok(int64_t count, int64_t n, double q) {
    return fabs((double)count - (double)n * q) <= 6.0 * sqrt((double)n * q * (1.0 - q)) + 1.0;
}

FA_TEST(dropout_mask_statistics) {
    static const float ps[] = {0.01f, 0.1f, 0.3f, 0.5f, 0.9f};
    const int64_t batch = 3, heads = 5, sq = 61, sk = 1031;
    uint64_t seed = fa_test_seed() * 0x9e3779b97f4a7c15ull + 1;
    for (int pi = 0; pi < 5; pi++) {
        const float p = ps[pi];
        const uint32_t threshold = fa_dropout_threshold(p);
        const double q = 1.0 - threshold / 256.0; /* the quantised keep rate */
        const uint64_t offset = seed >> 20, other_offset = offset + (uint64_t)(sk + 15) / 16;
        int64_t kept = 0, n = 0, kept_word[16] = {0}, n_word[16] = {0}; /* per 8-bit number of a call */
        int64_t same_offset = 0, same_seed = 0;
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < sk; j++) {
                        int keep = fa_dropout_keep(seed, offset, threshold, b, h, heads, i, j);
                        kept += keep;
                        n++;
                        kept_word[j & 15] += keep;
                        n_word[j & 15]++;
                        same_offset += keep == fa_dropout_keep(seed, other_offset, threshold, b, h, heads, i, j);
                        same_seed += keep == fa_dropout_keep(seed + 1, offset, threshold, b, h, heads, i, j);
                    }
        FA_CHECK(binomial_ok(kept, n, q), "p = %g: kept %lld of %lld (expected %.0f)", (double)p, (long long)kept,
                 (long long)n, (double)n * q);
        for (int w = 0; w < 16; w++)
            FA_CHECK(binomial_ok(kept_word[w], n_word[w], q), "p = %g, number %d: kept %lld of %lld", (double)p, w,
                     (long long)kept_word[w], (long long)n_word[w]);
        double agree = (1.0 - q) * (1.0 - q) + q * q;
        FA_CHECK(binomial_ok(same_offset, n, agree), "p = %g: offsets %llu and %llu agree on %lld of %lld (independent: %.0f)",
                 (double)p, (unsigned long long)offset, (unsigned long long)other_offset, (long long)same_offset,
                 (long long)n, agree * (double)n);
        FA_CHECK(binomial_ok(same_seed, n, agree), "p = %g: seeds s and s + 1 agree on %lld of %lld (independent: %.0f)",
                 (double)p, (long long)same_seed, (long long)n, agree * (double)n);
    }
}

/* ---- forward and backward against the oracle --------------------------------------------- */

typedef void (*dropout_feature)(fa_test_spec *spec);

static void run_dropout_feature(const char *name, dropout_feature apply) {
    const fa_test_shape *shapes;
    int shape_count = fa_test_feature_shapes(&shapes);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < shape_count; i++) {
            const fa_test_shape *sh = &shapes[i];
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], sh->batch, sh->seqlen_q, sh->seqlen_k,
                                                  sh->heads_q, sh->heads_kv, sh->head_dim);
            spec.dropout_p = 0.17f + 0.1f * (float)i;
            spec.dropout_seed = spec.seed * 31 + 7;
            spec.dropout_offset = spec.seed >> 40;
            apply(&spec);
            fa_test_expect_case(&spec, 0, name);
        }
}

static void d_plain(fa_test_spec *s) { (void)s; }
static void d_causal(fa_test_spec *s) { s->causal = 1; }
static void d_gqa_sinks(fa_test_spec *s) {
    s->heads_kv = 2;
    s->heads_q = 6;
    s->sinks = 1;
    s->causal = 1;
}
static void d_varlen(fa_test_spec *s) {
    s->varlen = 1;
    s->batch = 4;
    s->causal = 1;
    s->layout = FA_TEST_LAYOUT_PADDED;
}
static void d_everything(fa_test_spec *s) {
    s->causal = 1;
    s->use_window = 1;
    s->window_left = 11;
    s->softcap = 3.0f;
    s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
    s->sinks = 1;
    s->head_dim_v = s->head_dim / 2 + 3;
    s->dropout_p = 0.6f;
}

FA_TEST(dropout_plain) { run_dropout_feature("dropout", d_plain); }

/* key counts around the sixteen keys of a Philox call: a partial first call, one call plus a
 * key, two plus a key (tiny, f32, forward and backward) */
FA_TEST(dropout_key_counts) {
    static const int64_t sks[] = {1, 15, 17, 33};
    for (int i = 0; i < 4; i++) {
        fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 1, 6, sks[i], 2, 1, 16);
        spec.causal = i & 1;
        spec.dropout_p = 0.4f;
        spec.dropout_seed = spec.seed * 7 + 3;
        spec.dropout_offset = spec.seed >> 36;
        fa_test_expect_case(&spec, 0, "dropout key counts");
    }
}
FA_TEST(dropout_causal) { run_dropout_feature("dropout+causal", d_causal); }
FA_TEST(dropout_gqa_sinks) { run_dropout_feature("dropout+gqa+sinks", d_gqa_sinks); }
FA_TEST(dropout_varlen) { run_dropout_feature("dropout+varlen", d_varlen); }
FA_TEST(dropout_everything) { run_dropout_feature("dropout+everything", d_everything); }

/* ---- reproducibility ------------------------------------------------------------------------ */

static const int outputs[] = {FA_T_O, FA_T_LSE, FA_T_DQ, FA_T_DK, FA_T_DV};
#define N_OUTPUTS 5

typedef struct run_result {
    void *snap[N_OUTPUTS];
} run_result;

static int run_once(fa_test_problem *tp, float p_drop, uint64_t seed, uint64_t offset, int threads, run_result *r) {
    fa_params p = tp->params;
    p.dropout_p = p_drop;
    p.dropout_seed = seed;
    p.dropout_offset = offset;
    p.num_threads = threads;
    fa_test_poison_forward_outputs(tp);
    fa_test_poison_backward_outputs(tp);
    fa_status s = fa_forward(&p);
    if (s == FA_OK) s = fa_backward(&p);
    if (!FA_CHECK(s == FA_OK, "run: %s: %s", fa_strerror(s), fa_last_error())) return 0;
    for (int t = 0; t < N_OUTPUTS; t++) r->snap[t] = fa_test_snapshot(tp, outputs[t]);
    return 1;
}

static void run_free(run_result *r) {
    for (int t = 0; t < N_OUTPUTS; t++) free(r->snap[t]);
}

static int same(const fa_test_problem *tp, int t, const run_result *a, const run_result *b) {
    return fa_test_max_diff(tp, outputs[t], a->snap[t], b->snap[t]) == 0.0;
}

FA_TEST(dropout_reproducible) {
    const int small = fa_test_get_level() == FA_LEVEL_SMALL;
    for (int di = 0; di < 3; di++) {
        fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[di], 2, small ? 70 : 150, small ? 93 : 201, 4, 2, 64);
        spec.causal = 1;
        spec.sinks = 1;
        spec.layout = FA_TEST_LAYOUT_PADDED;
        fa_test_problem tp;
        if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
        const uint64_t seed = spec.seed | 1, offset = spec.seed >> 33;
        run_result base, again, threads1, threads3, other_seed, other_offset, off, zero;
        int ok = run_once(&tp, 0.25f, seed, offset, 0, &base) && run_once(&tp, 0.25f, seed, offset, 0, &again) &&
                 run_once(&tp, 0.25f, seed, offset, 1, &threads1) && run_once(&tp, 0.25f, seed, offset, 3, &threads3) &&
                 run_once(&tp, 0.25f, seed + 1, offset, 0, &other_seed) &&
                 run_once(&tp, 0.25f, seed, offset + 1000, 0, &other_offset) && run_once(&tp, 0.0f, 0, 0, 0, &off) &&
                 run_once(&tp, 0.0f, seed, offset, 0, &zero);
        if (ok) {
            const char *dt = fa_test_dtype_name(spec.dtype);
            for (int t = 0; t < N_OUTPUTS; t++) {
                const char *name = fa_test_tensor_name(outputs[t]);
                FA_CHECK(same(&tp, t, &base, &again), "%s %s: not bitwise reproducible with one seed", dt, name);
                FA_CHECK(same(&tp, t, &base, &threads1), "%s %s: 1 thread differs from all cores", dt, name);
                FA_CHECK(same(&tp, t, &base, &threads3), "%s %s: 3 threads differ from all cores", dt, name);
                FA_CHECK(same(&tp, t, &off, &zero), "%s %s: dropout_p = 0 with a seed differs from no dropout", dt,
                         name);
                if (outputs[t] == FA_T_LSE) {
                    FA_CHECK(same(&tp, t, &base, &off), "%s lse: dropout changed the LSE", dt);
                    continue;
                }
                FA_CHECK(!same(&tp, t, &base, &other_seed), "%s %s: another seed gave the same result", dt, name);
                FA_CHECK(!same(&tp, t, &base, &other_offset), "%s %s: another offset gave the same result", dt, name);
                FA_CHECK(!same(&tp, t, &base, &off), "%s %s: dropout_p = 0.25 gave the result without dropout", dt,
                         name);
            }
        }
        run_free(&base), run_free(&again), run_free(&threads1), run_free(&threads3);
        run_free(&other_seed), run_free(&other_offset), run_free(&off), run_free(&zero);
        fa_test_problem_destroy(&tp);
    }
}

/* ---- attn_probs ---------------------------------------------------------------------------- */

FA_TEST(dropout_attn_probs) {
    for (int di = 0; di < 3; di++)
        for (int varlen = 0; varlen < 2; varlen++) {
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[di], varlen ? 3 : 2, 37, 47, 4, 2, 32);
            spec.causal = 1;
            spec.sinks = varlen;
            spec.softcap = varlen ? 0.0f : 4.0f;
            spec.alibi = varlen ? FA_TEST_ALIBI_NONE : FA_TEST_ALIBI_HEAD;
            spec.varlen = varlen;
            spec.backward = 0;
            spec.dropout_p = 0.3f;
            spec.dropout_seed = spec.seed + 5;
            spec.dropout_offset = 12345;
            fa_test_problem tp;
            if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
            fa_params p = tp.params;
            const int64_t n = p.batch * p.heads_q * p.seqlen_q * p.seqlen_k;
            float *probs = malloc(sizeof(float) * (size_t)n);
            fa_ref_gathered g;
            fa_ref_outputs ref, base;
            if (!FA_CHECK(probs && fa_ref_references(&p, spec.dtype, 0, &g, &ref, &base) == 0, "allocation")) return;
            for (int64_t e = 0; e < n; e++) probs[e] = NAN;
            p.attn_probs = probs;
            fa_status s = fa_forward(&p);
            if (FA_CHECK(s == FA_OK, "forward with attn_probs: %s", fa_last_error())) {
                int64_t bad_sign = 0, bad_value = 0, bad_zero = 0, bad_sum = 0;
                double worst = 0.0;
                const fa_ref_problem *rp = &g.rp;
                for (int64_t b = 0; b < p.batch; b++) {
                    int64_t len_q = varlen ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.seqlen_q;
                    int64_t len_k = varlen ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
                    int64_t k_row = varlen ? p.cu_seqlens_k[b] : b * p.seqlen_k;
                    int64_t q_row = varlen ? p.cu_seqlens_q[b] : b * p.seqlen_q;
                    for (int64_t h = 0; h < p.heads_q; h++)
                        for (int64_t i = 0; i < p.seqlen_q; i++) {
                            const float *row = probs + ((b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k;
                            double lse = i < len_q ? ref.lse[fa_ref_lse_index(rp, b, h, i)] : -INFINITY;
                            double sum = rp->sinks && i < len_q ? exp(rp->sinks[h] - lse) : 0.0;
                            /* causal: keys j <= i + len_k - len_q */
                            int64_t lo = 0, hi = i < len_q ? i + len_k - len_q + 1 : 0;
                            if (hi > len_k) hi = len_k;
                            for (int64_t j = 0; j < p.seqlen_k; j++) {
                                if (i >= len_q || j >= len_k || j < lo || j >= hi) {
                                    bad_zero += row[j] != 0.0f;
                                    continue;
                                }
                                /* the float64 probability of this element */
                                const double *q = rp->q + ((q_row + i) * p.heads_q + h) * p.head_dim;
                                const double *k = rp->k + ((k_row + j) * p.heads_kv + h / (p.heads_q / p.heads_kv)) * p.head_dim;
                                double sc = 0.0;
                                for (int64_t c = 0; c < p.head_dim; c++) sc += q[c] * k[c];
                                sc *= rp->scale;
                                if (rp->softcap > 0) sc = rp->softcap * tanh(sc / rp->softcap);
                                if (rp->slopes) sc -= rp->slopes[b * p.heads_q + h] * fabs((double)(i + len_k - len_q - j));
                                double want = exp(sc - lse);
                                int keep = fa_ref_dropout_factor(rp, b, h, i, j) != 0.0;
                                bad_sign += want > 0.0 && (row[j] < 0.0f) == keep;
                                double err = fabs(fabs((double)row[j]) - want);
                                if (err > worst) worst = err;
                                bad_value += !(err <= 1e-5 + 1e-4 * want);
                                sum += fabs((double)row[j]);
                            }
                            if (i < len_q && hi > lo) bad_sum += !(fabs(sum - 1.0) <= 1e-4);
                        }
                }
                const char *dt = fa_test_dtype_name(spec.dtype);
                FA_CHECK(bad_sign == 0, "%s varlen=%d: %lld signs disagree with the dropout mask", dt, varlen,
                         (long long)bad_sign);
                FA_CHECK(bad_value == 0, "%s varlen=%d: %lld probabilities off (worst %.3e)", dt, varlen,
                         (long long)bad_value, worst);
                FA_CHECK(bad_zero == 0, "%s varlen=%d: %lld masked / out-of-sequence entries are not 0", dt, varlen,
                         (long long)bad_zero);
                FA_CHECK(bad_sum == 0, "%s varlen=%d: %lld rows of |P| (+ sink) do not sum to 1", dt, varlen,
                         (long long)bad_sum);
                fa_test_check c = fa_test_compare(&tp, FA_T_O, &ref, &base);
                FA_CHECK(c.ok, "%s varlen=%d: o with attn_probs: err %.3e tol %.3e", dt, varlen, c.err, c.tol);
            }
            fa_ref_references_free(&g, &ref, &base);
            free(probs);
            fa_test_problem_destroy(&tp);
        }
}

/* ---- finite differences of the library itself ---------------------------------------------- */

/* L = Σ w ∘ O for fixed weights w (dout), with the library's forward in f32. */
static double fd_loss(const fa_params *base, const float *w, int64_t n_out) {
    fa_params p = *base;
    p.lse = NULL;
    if (fa_forward(&p) != FA_OK) return NAN;
    const float *o = p.o;
    double sum = 0.0;
    for (int64_t e = 0; e < n_out; e++) sum += (double)w[e] * (double)o[e];
    return sum;
}

FA_TEST(dropout_finite_differences) {
    const int64_t b = 2, sq = 9, sk = 13, hq = 4, hkv = 2, d = 8;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, fa_test_seed() + 77);
    const int64_t nq = b * sq * hq * d, nk = b * sk * hkv * d, no = nq;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    float *o = malloc(sizeof(float) * no), *w = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * b * hq * sq);
    float *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk), *dv = malloc(sizeof(float) * nk);
    for (int64_t e = 0; e < nq; e++) q[e] = (float)fa_test_rng_normal(&rng), w[e] = (float)fa_test_rng_normal(&rng);
    for (int64_t e = 0; e < nk; e++) k[e] = (float)fa_test_rng_normal(&rng), v[e] = (float)fa_test_rng_normal(&rng);
    for (int causal = 0; causal < 2; causal++) {
        fa_params p;
        memset(&p, 0, sizeof p);
        p.batch = b, p.seqlen_q = sq, p.seqlen_k = sk, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
        p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse, p.dout = w, p.dq = dq, p.dk = dk, p.dv = dv;
        p.causal = causal;
        p.dropout_p = 0.35f;
        p.dropout_seed = fa_test_rng_next(&rng);
        p.dropout_offset = fa_test_rng_next(&rng) >> 8;
        fa_set_contiguous_strides(&p);
        if (!FA_CHECK(fa_forward(&p) == FA_OK && fa_backward(&p) == FA_OK, "run: %s", fa_last_error())) break;
        float *inputs[3] = {q, k, v}, *grads[3] = {dq, dk, dv};
        const int64_t sizes[3] = {nq, nk, nk};
        const char *names[3] = {"dq", "dk", "dv"};
        float *saved_grad[3];
        for (int t = 0; t < 3; t++) {
            saved_grad[t] = malloc(sizeof(float) * sizes[t]);
            memcpy(saved_grad[t], grads[t], sizeof(float) * sizes[t]);
        }
        for (int t = 0; t < 3; t++)
            for (int probe = 0; probe < 12; probe++) {
                int64_t e = fa_test_rng_int(&rng, 0, sizes[t] - 1);
                const float x = inputs[t][e], h = 1e-2f;
                inputs[t][e] = x + h;
                double up = fd_loss(&p, w, no);
                inputs[t][e] = x - h;
                double down = fd_loss(&p, w, no);
                inputs[t][e] = x;
                double numeric = (up - down) / (2.0 * (double)h), analytic = saved_grad[t][e];
                FA_CHECK(fabs(numeric - analytic) <= 2e-3 + 2e-2 * fabs(numeric),
                         "causal=%d %s[%lld]: backward %.6f, finite difference %.6f", causal, names[t], (long long)e,
                         analytic, numeric);
            }
        for (int t = 0; t < 3; t++) free(saved_grad[t]);
    }
    free(q), free(k), free(v), free(o), free(w), free(lse), free(dq), free(dk), free(dv);
}
