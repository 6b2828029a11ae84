/*
 * reference.c: the float64 attention oracle, the same-dtype baseline, tolerances, and test
 * problems (see reference.h for the contract).
 */
#include "oracle/reference.h"
#include "api/fa_philox.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- dtypes ------------------------------------------------------------------------------- */

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t fa_test_f32_to_f16(float x) {
    uint32_t bits = float_bits(x);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) /* inf stays inf; NaN stays a quiet NaN with its top payload */
        return (uint16_t)(sign | (magnitude > 0x7f800000u ? 0x7e00u | ((magnitude >> 13) & 0x3ffu)
                                                          : 0x7c00u));
    if (magnitude >= 0x477ff000u) /* >= 65520 = halfway between 65504 and 2^16: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) { /* below 2^-14: an f16 subnormal (or zero)                   */
        if (magnitude <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ties to 0      */
            return sign;
        uint32_t exponent = magnitude >> 23;                  /* 102..112                    */
        uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u; /* value = m·2^(e-150)        */
        uint32_t shift = 126u - exponent;                     /* subnormal unit is 2^-24     */
        uint32_t quotient = mantissa >> shift;
        uint32_t remainder = mantissa & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (remainder > half || (remainder == half && (quotient & 1u))) quotient++;
        return (uint16_t)(sign | quotient);
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits; a carry
     * out of the mantissa correctly bumps the exponent. */
    uint32_t rebiased = magnitude - 0x38000000u;
    uint32_t quotient = rebiased >> 13;
    uint32_t remainder = rebiased & 0x1fffu;
    if (remainder > 0x1000u || (remainder == 0x1000u && (quotient & 1u))) quotient++;
    return (uint16_t)(sign | quotient);
}

float fa_test_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1p-24f; /* exact: subnormal or zero             */
        return sign ? -magnitude : magnitude;
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t fa_test_f32_to_bf16(float x) {
    uint32_t bits = float_bits(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN */
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u); /* ties to even; overflow -> inf */
    return (uint16_t)((bits + rounding) >> 16);
}

float fa_test_bf16_to_f32(uint16_t h) { return bits_float((uint32_t)h << 16); }

float fa_test_round_to(fa_dtype dtype, float x) {
    switch (dtype) {
    case FA_DTYPE_F16: return fa_test_f16_to_f32(fa_test_f32_to_f16(x));
    case FA_DTYPE_BF16: return fa_test_bf16_to_f32(fa_test_f32_to_bf16(x));
    default: return x;
    }
}

size_t fa_test_dtype_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : 2; }

const char *fa_test_dtype_name(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_FP8_E4M3: return "e4m3";
    default: return "?";
    }
}

int fa_test_mantissa_bits(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F16: return 10;
    case FA_DTYPE_BF16: return 7;
    default: return 23;
    }
}

double fa_test_load(const void *base, fa_dtype dtype, int64_t index) {
    switch (dtype) {
    case FA_DTYPE_F16: return fa_test_f16_to_f32(((const uint16_t *)base)[index]);
    case FA_DTYPE_BF16: return fa_test_bf16_to_f32(((const uint16_t *)base)[index]);
    default: return ((const float *)base)[index];
    }
}

void fa_test_store(void *base, fa_dtype dtype, int64_t index, double value) {
    switch (dtype) {
    case FA_DTYPE_F16: ((uint16_t *)base)[index] = fa_test_f32_to_f16((float)value); break;
    case FA_DTYPE_BF16: ((uint16_t *)base)[index] = fa_test_f32_to_bf16((float)value); break;
    default: ((float *)base)[index] = (float)value; break;
    }
}

/* ---- random numbers ----------------------------------------------------------------------- */

void fa_test_rng_seed(fa_test_rng *rng, uint64_t seed) { rng->state = seed; }

uint64_t fa_test_rng_next(fa_test_rng *rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double fa_test_rng_uniform(fa_test_rng *rng) {
    return (double)(fa_test_rng_next(rng) >> 11) * 0x1p-53;
}

int64_t fa_test_rng_int(fa_test_rng *rng, int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    return lo + (int64_t)(fa_test_rng_next(rng) % (uint64_t)(hi - lo + 1));
}

double fa_test_rng_normal(fa_test_rng *rng) {
    double u1 = fa_test_rng_uniform(rng), u2 = fa_test_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t fa_test_fresh_seed(void) {
    uint64_t seed = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&seed, sizeof seed, 1, f) != 1) seed = 0;
        fclose(f);
    }
    if (seed == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec * 6364136223846793005ull ^ (uint64_t)ts.tv_sec ^
               ((uint64_t)getpid() << 32);
    }
    /* keep it short enough to retype: 48 bits */
    seed &= 0xffffffffffffull;
    return seed ? seed : 1;
}

/* ---- canonical geometry ------------------------------------------------------------------- */

typedef struct ref_sequence {
    int64_t q_row, k_row; /* first canonical row of the sequence                            */
    int64_t len_q, len_k;
} ref_sequence;

static ref_sequence ref_seq(const fa_ref_problem *rp, int64_t b) {
    ref_sequence s;
    if (rp->cu_seqlens_q) {
        s.q_row = rp->cu_seqlens_q[b];
        s.k_row = rp->cu_seqlens_k[b];
        s.len_q = rp->cu_seqlens_q[b + 1] - s.q_row;
        s.len_k = rp->cu_seqlens_k[b + 1] - s.k_row;
    } else {
        s.q_row = b * rp->seqlen_q;
        s.k_row = b * rp->seqlen_k;
        s.len_q = rp->seqlen_q;
        s.len_k = rp->seqlen_k;
    }
    return s;
}

int64_t fa_test_masked_rows_inexact(const fa_test_problem *tp, const fa_ref_outputs *ref64) {
    const fa_params *p = &tp->params;
    int64_t bad = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int varlen = p->cu_seqlens_q != NULL;
        const int64_t q0 = varlen ? p->cu_seqlens_q[b] : 0;
        const int64_t len_q = varlen ? p->cu_seqlens_q[b + 1] - q0 : p->seqlen_q;
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < len_q; i++) {
                const int64_t lse_at = varlen ? h * p->total_q + q0 + i : (b * p->heads_q + h) * p->seqlen_q + i;
                if (ref64->lse[lse_at] != -INFINITY || p->sink_logits) continue;
                if (p->lse[lse_at] != -INFINITY) bad++;
                const int64_t row = varlen ? (q0 + i) * p->o_row_stride : b * p->o_batch_stride + i * p->o_row_stride;
                for (int64_t c = 0; c < p->head_dim_v; c++)
                    bad += fa_test_load(p->o, p->dtype, row + h * p->o_head_stride + c) != 0.0;
            }
    }
    return bad;
}

int fa_ref_dbias_compare(const fa_params *p, const void *dbias, const fa_ref_problem *rp,
                         const fa_ref_outputs *ref64, const fa_ref_outputs *base, fa_ref_dbias_check *out) {
    const int64_t B = p->batch, H = p->heads_q, sq = p->seqlen_q, sk = p->seqlen_k;
    const int64_t nb = p->dbias_batch_stride ? B : 1, nh = p->dbias_head_stride ? H : 1;
    const int64_t ni = p->dbias_row_stride ? sq : 1, nj = p->dbias_col_stride ? sk : 1;
    const size_t n_out = (size_t)(nb * nh * ni * nj) + 1;
    double *want = calloc(n_out, sizeof(double)), *bl = calloc(n_out, sizeof(double));
    double *mag = calloc(n_out, sizeof(double));
    if (!want || !bl || !mag) {
        free(want);
        free(bl);
        free(mag);
        return -1;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t j = 0; j < sk; j++) {
                    const int64_t at = fa_ref_mod_index(rp, b, h, i, j);
                    const int64_t o = (((nb > 1 ? b : 0) * nh + (nh > 1 ? h : 0)) * ni + (ni > 1 ? i : 0)) * nj +
                                      (nj > 1 ? j : 0);
                    want[o] += ref64->dbias[at];
                    bl[o] += base->dbias[at];
                    mag[o] += ref64->dbias_mag[at];
                }
    double err = 0.0, base_err = 0.0, ref_max = 0.0, mag_max = 0.0;
    int64_t unwritten = 0;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < ni; i++)
                for (int64_t j = 0; j < nj; j++) {
                    const int64_t o = ((b * nh + h) * ni + i) * nj + j;
                    const double got = fa_test_load(dbias, p->dbias_dtype,
                                                    b * p->dbias_batch_stride + h * p->dbias_head_stride +
                                                        i * p->dbias_row_stride + j * p->dbias_col_stride);
                    if (isnan(got)) unwritten++;
                    const double e = fabs(got - want[o]);
                    if (!(e <= err)) err = isnan(e) ? INFINITY : e;
                    /* the baseline stores its dbias in the same dtype */
                    const double bl_o = fa_test_round_to(p->dbias_dtype, (float)bl[o]);
                    if (fabs(bl_o - want[o]) > base_err) base_err = fabs(bl_o - want[o]);
                    if (fabs(want[o]) > ref_max) ref_max = fabs(want[o]);
                    if (mag[o] > mag_max) mag_max = mag[o];
                }
    free(want);
    free(bl);
    free(mag);
    /* the floor: dS = P∘(dP - D) in fp32 from dots of head_dim terms; with 64·eps alone a bf16
     * case whose dbias cancels to ~0 failed at 1.004x the tolerance */
    out->err = err;
    out->tol = 2.0 * base_err + (double)(p->head_dim + 64) * 1.2e-7 * (mag_max + ref_max) + 1e-6;
    out->base_err = base_err;
    out->ref_max = ref_max;
    out->unwritten = unwritten;
    return 0;
}

int64_t fa_ref_lse_index(const fa_ref_problem *rp, int64_t b, int64_t h, int64_t i) {
    if (rp->cu_seqlens_q) return h * rp->rows_q + rp->cu_seqlens_q[b] + i;
    return (b * rp->heads_q + h) * rp->seqlen_q + i;
}

/* Visible keys of row i: [lo, hi) from the effective window (written independently of the
 * library's fa_key_range: visible iff diag - left <= j <= diag + right, diag = i + lk - lq). */
static void ref_visible(const fa_ref_problem *rp, int64_t i, int64_t len_q, int64_t len_k,
                        int64_t *lo, int64_t *hi) {
    int64_t diag = i + len_k - len_q;
    int64_t first = 0, last = len_k - 1;
    if (rp->window_left >= 0 && diag - rp->window_left > first) first = diag - rp->window_left;
    if (rp->window_right >= 0 && diag + rp->window_right < last) last = diag + rp->window_right;
    *lo = first;
    *hi = last + 1 > first ? last + 1 : first;
}

/* Keys a row's loop visits: the window's range, or every key when rp->visible decides. */
static void ref_row_keys(const fa_ref_problem *rp, int64_t i, int64_t len_q, int64_t len_k, int64_t *lo,
                         int64_t *hi) {
    if (rp->visible) {
        *lo = 0;
        *hi = len_k;
    } else {
        ref_visible(rp, i, len_q, len_k, lo, hi);
    }
}

/* Score s of a visited key with the bias and the element visibility applied. */
static double ref_mod_score(const fa_ref_problem *rp, int64_t b, int64_t h, int64_t i, int64_t j, double s) {
    if (!rp->visible && !rp->bias) return s;
    const int64_t at = fa_ref_mod_index(rp, b, h, i, j);
    if (rp->visible && !rp->visible[at]) return -INFINITY;
    return rp->bias ? s + rp->bias[at] : s;
}

/* ---- dropout ------------------------------------------------------------------------------ */

double fa_ref_dropout_factor(const fa_ref_problem *rp, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (!(rp->dropout_p > 0.0f)) return 1.0;
    int keep = fa_dropout_keep(rp->dropout_seed, rp->dropout_offset, fa_dropout_threshold(rp->dropout_p), b, h,
                               rp->heads_q, i, j);
    return keep ? 256.0 / (256.0 - (double)fa_dropout_threshold(rp->dropout_p)) : 0.0;
}

/* ---- the float64 oracle -------------------------------------------------------------------- */

/* One (sequence b, kv head) unit: all query heads of the group, every row. Units write disjoint
 * parts of o, lse, dq, dk, dv; dsink goes to a per-unit partial [group]. */
static void ref64_unit(const fa_ref_problem *rp, int backward, fa_ref_outputs *out, int64_t b,
                       int64_t kv_head, double *dsink_part, double *scores, double *tanh_row) {
    const int64_t d = rp->head_dim, dv = rp->head_dim_v, hq = rp->heads_q, hkv = rp->heads_kv;
    const int64_t group = hq / hkv;
    ref_sequence seq = ref_seq(rp, b);
    for (int64_t g = 0; g < group; g++) {
        int64_t h = kv_head * group + g;
        double slope = rp->slopes ? rp->slopes[b * hq + h] : 0.0;
        int has_sink = rp->sinks != NULL;
        double sink = has_sink ? rp->sinks[h] : 0.0;
        for (int64_t i = 0; i < seq.len_q; i++) {
            const double *q_row = rp->q + ((seq.q_row + i) * hq + h) * d;
            int64_t lo, hi;
            ref_row_keys(rp, i, seq.len_q, seq.len_k, &lo, &hi);
            double row_max = has_sink ? sink : -INFINITY;
            for (int64_t j = lo; j < hi; j++) {
                const double *k_row = rp->k + ((seq.k_row + j) * hkv + kv_head) * d;
                double s = 0.0;
                for (int64_t c = 0; c < d; c++) s += q_row[c] * k_row[c];
                s *= rp->scale;
                if (rp->softcap > 0) {
                    tanh_row[j] = tanh(s / rp->softcap);
                    s = rp->softcap * tanh_row[j];
                }
                if (rp->slopes) s -= slope * fabs((double)(i + seq.len_k - seq.len_q - j));
                s = ref_mod_score(rp, b, h, i, j, s);
                scores[j] = s;
                if (s > row_max || isnan(s)) row_max = isnan(row_max) ? row_max : s;
            }
            double *o_row = out->o ? out->o + ((seq.q_row + i) * hq + h) * dv : NULL;
            int64_t lse_at = fa_ref_lse_index(rp, b, h, i);
            if (row_max == -INFINITY) { /* no visible key, no sink: O = 0, LSE = -inf      */
                if (o_row) memset(o_row, 0, (size_t)dv * sizeof *o_row);
                if (out->lse) out->lse[lse_at] = -INFINITY;
                continue;
            }
            double sum = has_sink ? exp(sink - row_max) : 0.0;
            for (int64_t j = lo; j < hi; j++) sum += exp(scores[j] - row_max);
            double lse = row_max + log(sum);
            if (out->lse) out->lse[lse_at] = lse;
            if (out->lse_mag) {
                double mag = has_sink ? fabs(sink) : 0.0;
                for (int64_t j = lo; j < hi; j++)
                    if (isfinite(scores[j]) && fabs(scores[j]) > mag) mag = fabs(scores[j]);
                out->lse_mag[lse_at] = mag;
            }
            /* O_i in double, also needed by the backward (D_i) */
            double o_local[FA_MAX_HEAD_DIM];
            double *o_mag = out->o_mag ? out->o_mag + ((seq.q_row + i) * hq + h) * dv : NULL;
            for (int64_t c = 0; c < dv; c++) o_local[c] = 0.0;
            if (o_mag) memset(o_mag, 0, (size_t)dv * sizeof *o_mag);
            for (int64_t j = lo; j < hi; j++) {
                double p = exp(scores[j] - lse) * fa_ref_dropout_factor(rp, b, h, i, j);
                const double *v_row = rp->v + ((seq.k_row + j) * hkv + kv_head) * dv;
                for (int64_t c = 0; c < dv; c++) o_local[c] += p * v_row[c];
                if (o_mag)
                    for (int64_t c = 0; c < dv; c++) o_mag[c] += p * fabs(v_row[c]);
            }
            if (o_row) memcpy(o_row, o_local, (size_t)dv * sizeof *o_row);
            if (!backward) continue;

            const double *do_row = rp->dout + ((seq.q_row + i) * hq + h) * dv;
            double delta = 0.0, delta_mag = 0.0, delta_sq = 0.0; /* D_i = rowsum(dO_i ∘ O_i) */
            for (int64_t c = 0; c < dv; c++) {
                delta += do_row[c] * o_local[c];
                delta_mag += fabs(do_row[c] * o_local[c]);
                delta_sq += (do_row[c] * o_local[c]) * (do_row[c] * o_local[c]);
            }
            /* D from O stored in a dtype of m mantissa bits: each O_c off by at most half an ulp
             * (≤ 2^-m·|O_c|), independently, so D's spread is ≤ 2^-m·sqrt(Σ (dO_c·O_c)² / 12);
             * it enters every dS_ij of the row as -P_ij·δD (the same δD for all keys) */
            const double d_spread = sqrt(delta_sq / 12.0);
            double dq_spread[FA_MAX_HEAD_DIM];
            for (int64_t c = 0; c < d; c++) dq_spread[c] = 0.0;
            double *dq_row = out->dq + ((seq.q_row + i) * hq + h) * d;
            double *dq_mag = out->dq_mag + ((seq.q_row + i) * hq + h) * d;
            for (int64_t j = lo; j < hi; j++) {
                if (scores[j] == -INFINITY) continue; /* masked: no gradient */
                double p = exp(scores[j] - lse);
                /* A FlashAttention backward recomputes P = exp(s - LSE) in fp32: its relative
                 * error grows with the size of the exponent's operands, so the term magnitude
                 * of everything built from P carries the factor (1 + |s| + |LSE|). */
                double p_mag = p * (1.0 + fabs(scores[j]) + fabs(lse));
                const double *k_row = rp->k + ((seq.k_row + j) * hkv + kv_head) * d;
                const double *v_row = rp->v + ((seq.k_row + j) * hkv + kv_head) * dv;
                int64_t k_at = ((seq.k_row + j) * hkv + kv_head);
                double *dk_row = out->dk + k_at * d, *dk_mag = out->dk_mag + k_at * d;
                double *dv_row = out->dv + k_at * dv, *dv_mag = out->dv_mag + k_at * dv;
                double dp = 0.0, dp_mag = 0.0;
                for (int64_t c = 0; c < dv; c++) {
                    dp += do_row[c] * v_row[c];
                    dp_mag += fabs(do_row[c] * v_row[c]);
                }
                /* dropout: O uses Z∘P, so dL/dP = Z∘dP and dV gets (Z∘P)ᵀ dO */
                const double z = fa_ref_dropout_factor(rp, b, h, i, j);
                dp *= z;
                dp_mag *= z;
                double ds = p * (dp - delta), ds_mag = p_mag * (dp_mag + delta_mag), ds_d = p;
                if (out->dbias) out->dbias[fa_ref_mod_index(rp, b, h, i, j)] = ds;
                if (out->dbias_mag) out->dbias_mag[fa_ref_mod_index(rp, b, h, i, j)] = ds_mag;
                if (rp->softcap > 0) {
                    ds *= 1.0 - tanh_row[j] * tanh_row[j];
                    ds_mag *= 1.0 - tanh_row[j] * tanh_row[j];
                    ds_d *= 1.0 - tanh_row[j] * tanh_row[j];
                }
                double *dk_dnoise = out->dk_dnoise + k_at * d;
                for (int64_t c = 0; c < d; c++) {
                    dq_row[c] += rp->scale * ds * k_row[c];
                    dk_row[c] += rp->scale * ds * q_row[c];
                    dq_mag[c] += fabs(rp->scale) * ds_mag * fabs(k_row[c]);
                    dk_mag[c] += fabs(rp->scale) * ds_mag * fabs(q_row[c]);
                    dq_spread[c] += rp->scale * ds_d * k_row[c];
                    const double dk_spread = rp->scale * ds_d * q_row[c] * d_spread;
                    dk_dnoise[c] += dk_spread * dk_spread; /* a variance until ref_run's end */
                }
                for (int64_t c = 0; c < dv; c++) {
                    dv_row[c] += z * p * do_row[c];
                    dv_mag[c] += z * p_mag * fabs(do_row[c]);
                }
            }
            double *dq_dnoise = out->dq_dnoise + ((seq.q_row + i) * hq + h) * d;
            for (int64_t c = 0; c < d; c++) dq_dnoise[c] = fabs(dq_spread[c]) * d_spread;
            if (has_sink) {
                dsink_part[2 * g] -= exp(sink - lse) * delta;
                dsink_part[2 * g + 1] += exp(sink - lse) * (1.0 + fabs(sink) + fabs(lse)) * delta_mag;
            }
        }
    }
}

/* The dtype baseline for one unit: fp32 math, dtype rounding of P, dP, dS and every output. */
/* The probability the baseline multiplies V with: P = exp(s - max) / sum rounded to dtype; for
 * fp8 inputs (dtype FA_DTYPE_FP8_E4M3, forward) the unnormalised exp(s - max) <= 1 rounded to
 * e4m3, as an fp8 P·V product takes it (FlashAttention-3's), then divided by the unrounded sum. */
static float baseline_prob(fa_dtype dtype, float e, float sum) {
    if (dtype == FA_DTYPE_FP8_E4M3) return (float)fa_test_e4m3_value(fa_test_e4m3_nearest(e)) / sum;
    return fa_test_round_to(dtype, e / sum);
}

/* Hopper's fp8 tensor-core product keeps 14 significant bits in its sums, not fp32's 24
 * (DeepSeek-V3's report for the H800). One k32 step of an e4m3 wgmma adds the accumulator and the
 * step's exact products a_i·b_i after aligning each to the largest exponent among the products'
 * (the sum of the factors' exponents, before any carry of the mantissa product) and the
 * accumulator's, and dropping the bits below its 14th, toward zero (sign and magnitude). Fitted
 * on an H100 (docs/tuning-log.md, "The fp8 tensor cores' sums"): it reproduces all 4,096 bf16
 * outputs of a P·V built to expose it, and the S = Q Kᵀ behind the LSE to the LSE's fp32 noise
 * at d = 96 (at d = 128 a tenth of the rows differ by 4e-5 to 1.7e-4 of LSE; the cut toward -inf
 * was 2.6e-4 off in half of them). The fp8 baseline forms both of the forward's products with it.
 * A NaN or an infinity passes through unchanged. */
static float fp8_mma_step(float acc, const double *a, const double *b, int64_t n) {
    double exact = acc;
    int top = INT_MIN, e;
    if (acc != 0.0f) {
        frexp((double)acc, &e); /* |acc| in [2^(e-1), 2^e) */
        top = e;
    }
    for (int64_t i = 0; i < n; i++) {
        const double x = a[i] * b[i];
        exact += x;
        if (x == 0.0) continue;
        int ea, eb;
        frexp(a[i], &ea);
        frexp(b[i], &eb);
        if (ea + eb - 1 > top) top = ea + eb - 1; /* |a·b| < 2^(ea + eb), at least 2^(ea + eb - 2) */
    }
    if (!isfinite(exact) || top == INT_MIN) return (float)exact;
    const double unit = ldexp(1.0, top - 14);
    double sum = trunc((double)acc / unit) * unit;
    for (int64_t i = 0; i < n; i++) sum += trunc(a[i] * b[i] / unit) * unit;
    return (float)sum;
}

/* O[c] (unnormalised) of an fp8 forward as the Hopper kernel forms it: per 128-key tile, the last
 * tile first, four k32 steps of e4m3(P)·V in key order (fwd_sm90.cu), each through fp8_mma_step.
 * p_e4m3[j]: the row's unnormalised P of key j rounded to e4m3, for j in [lo, hi). */
static float fp8_pv_sum(const fa_ref_problem *rp, const float *p_e4m3, int64_t lo, int64_t hi, int64_t k_row0,
                        int64_t kv_head, int64_t c) {
    const int64_t dv = rp->head_dim_v, hkv = rp->heads_kv;
    float acc = 0.0f;
    for (int64_t tile = (hi - 1) / 128; tile >= lo / 128; tile--)
        for (int64_t j0 = 128 * tile; j0 < 128 * tile + 128; j0 += 32) {
            double p[32], v[32];
            for (int64_t j = j0; j < j0 + 32; j++) {
                const int in = j >= lo && j < hi;
                p[j - j0] = in ? (double)p_e4m3[j] : 0.0;
                v[j - j0] = in ? rp->v[((k_row0 + j) * hkv + kv_head) * dv + c] : 0.0;
            }
            acc = fp8_mma_step(acc, p, v, 32);
        }
    return acc;
}

static void baseline_unit(const fa_ref_problem *rp, fa_dtype dtype, int backward,
                          fa_ref_outputs *out, int64_t b, int64_t kv_head, double *dsink_part,
                          float *scores, float *tanh_row, float *probs, float *probs_drop, float *dk_acc,
                          float *dv_acc) {
    const int64_t d = rp->head_dim, dv = rp->head_dim_v, hq = rp->heads_q, hkv = rp->heads_kv;
    const int64_t group = hq / hkv;
    const float scale = (float)rp->scale, softcap = (float)rp->softcap;
    /* the backward's own dtype: fp8 inputs are differentiated in bf16 (the CUDA backward runs the
     * bf16 kernels on the dequantised inputs), from the O of the fp8 forward (P in e4m3) */
    const fa_dtype bdt = dtype == FA_DTYPE_FP8_E4M3 ? FA_DTYPE_BF16 : dtype;
    ref_sequence seq = ref_seq(rp, b);
    if (backward) {
        memset(dk_acc, 0, (size_t)(seq.len_k * d) * sizeof *dk_acc);
        memset(dv_acc, 0, (size_t)(seq.len_k * dv) * sizeof *dv_acc);
    }
    for (int64_t g = 0; g < group; g++) {
        int64_t h = kv_head * group + g;
        float slope = rp->slopes ? (float)rp->slopes[b * hq + h] : 0.0f;
        int has_sink = rp->sinks != NULL;
        float sink = has_sink ? (float)rp->sinks[h] : 0.0f;
        float dsink_sum = 0.0f;
        for (int64_t i = 0; i < seq.len_q; i++) {
            const double *q_row = rp->q + ((seq.q_row + i) * hq + h) * d;
            int64_t lo, hi;
            ref_row_keys(rp, i, seq.len_q, seq.len_k, &lo, &hi);
            float row_max = has_sink ? sink : -INFINITY;
            for (int64_t j = lo; j < hi; j++) {
                const double *k_row = rp->k + ((seq.k_row + j) * hkv + kv_head) * d;
                float s = 0.0f; /* q, k hold dtype values; fp32 multiply-accumulate         */
                if (dtype == FA_DTYPE_FP8_E4M3) {
                    /* the GEMM's K padded with zeros to 64, 128 or 256 (the kernels' head-dim
                     * buckets): a step of zero products still re-aligns the accumulator */
                    const int64_t padded = d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : (d + 31) / 32 * 32;
                    for (int64_t c0 = 0; c0 < padded; c0 += 32)
                        s = fp8_mma_step(s, q_row + c0, k_row + c0, d - c0 < 0 ? 0 : d - c0 < 32 ? d - c0 : 32);
                }
                else
                    for (int64_t c = 0; c < d; c++) s += (float)q_row[c] * (float)k_row[c];
                s *= scale;
                if (softcap > 0) {
                    tanh_row[j] = tanhf(s / softcap);
                    s = softcap * tanh_row[j];
                }
                if (rp->slopes) s -= slope * (float)llabs(i + seq.len_k - seq.len_q - j);
                s = (float)ref_mod_score(rp, b, h, i, j, s);
                scores[j] = s;
                if (s > row_max || isnan(s)) row_max = isnan(row_max) ? row_max : s;
            }
            double *o_row = out->o ? out->o + ((seq.q_row + i) * hq + h) * dv : NULL;
            float o_stored[FA_MAX_HEAD_DIM]; /* O as the forward stores it (dtype-rounded)     */
            int64_t lse_at = fa_ref_lse_index(rp, b, h, i);
            if (row_max == -INFINITY) {
                if (o_row) memset(o_row, 0, (size_t)dv * sizeof *o_row);
                if (out->lse) out->lse[lse_at] = -INFINITY;
                continue;
            }
            float sum = has_sink ? expf(sink - row_max) : 0.0f;
            for (int64_t j = lo; j < hi; j++) sum += expf(scores[j] - row_max);
            if (out->lse) out->lse[lse_at] = row_max + logf(sum);
            for (int64_t j = lo; j < hi; j++) probs[j] = baseline_prob(dtype, expf(scores[j] - row_max), sum);
            /* dropout: P·Z rounded, as a framework would apply nn.Dropout to P; fp8: the
             * unnormalised e4m3 P (P·V in the tensor cores' 14-bit sums, then / sum) */
            if (dtype == FA_DTYPE_FP8_E4M3)
                for (int64_t j = lo; j < hi; j++)
                    probs_drop[j] = (float)fa_test_e4m3_value(fa_test_e4m3_nearest(expf(scores[j] - row_max))) *
                                    (float)fa_ref_dropout_factor(rp, b, h, i, j);
            else
                for (int64_t j = lo; j < hi; j++)
                    probs_drop[j] = fa_test_round_to(dtype, probs[j] * (float)fa_ref_dropout_factor(rp, b, h, i, j));
            if (o_row || backward)
                for (int64_t c = 0; c < dv; c++) {
                    float acc = 0.0f;
                    if (dtype == FA_DTYPE_FP8_E4M3)
                        acc = fp8_pv_sum(rp, probs_drop, lo, hi, seq.k_row, kv_head, c) / sum;
                    else
                        for (int64_t j = lo; j < hi; j++) /* dropout applied (Z∘P) */
                            acc += probs_drop[j] * (float)rp->v[((seq.k_row + j) * hkv + kv_head) * dv + c];
                    o_stored[c] = fa_test_round_to(bdt, acc); /* also the O the backward's D is formed from */
                    if (o_row) o_row[c] = o_stored[c];
                }
            if (!backward) continue;
            if (bdt != dtype) /* the backward's P: recomputed and rounded in its own dtype */
                for (int64_t j = lo; j < hi; j++) {
                    probs[j] = baseline_prob(bdt, expf(scores[j] - row_max), sum);
                    probs_drop[j] = fa_test_round_to(bdt, probs[j] * (float)fa_ref_dropout_factor(rp, b, h, i, j));
                }

            const double *do_row = rp->dout + ((seq.q_row + i) * hq + h) * dv;
            /* dP = dO Vᵀ rounded to the dtype; softmax backward from the saved (rounded) P, with
             * D = rowsum(dO ∘ O) in fp32 from the stored, dtype-rounded O. D = Σ_j P_j dP_j
             * mathematically; a backward that receives O (rather than recomputing every P_j dP_j
             * before any dS, a second pass over the keys) takes D from O, as FlashAttention-2/3,
             * cuDNN and PyTorch's flash and memory-efficient SDPA backward do. O's rounding then
             * enters D with an absolute error ~ 2^-mantissa·|dO|·|O|, which dominates dsink =
             * -Σ_i P_sink,i·D_i and, at tiny or unequal head dims, dQ. The baseline pays the same
             * price, so the rule compares like with like (docs/testing.md, "The accuracy rule"). */
            float delta = 0.0f;
            for (int64_t j = lo; j < hi; j++) {
                const double *v_row = rp->v + ((seq.k_row + j) * hkv + kv_head) * dv;
                float dp = 0.0f;
                for (int64_t c = 0; c < dv; c++) dp += (float)do_row[c] * (float)v_row[c];
                dp = fa_test_round_to(bdt, dp);
                if (rp->dropout_p > 0.0f) dp = fa_test_round_to(bdt, dp * (float)fa_ref_dropout_factor(rp, b, h, i, j));
                scores[j] = dp; /* scores now hold dP (times the dropout factor Z)            */
            }
            for (int64_t c = 0; c < dv; c++) delta += (float)do_row[c] * o_stored[c];
            float dq_acc[FA_MAX_HEAD_DIM];
            for (int64_t c = 0; c < d; c++) dq_acc[c] = 0.0f;
            for (int64_t j = lo; j < hi; j++) {
                float ds = fa_test_round_to(bdt, probs[j] * (scores[j] - delta));
                if (out->dbias) out->dbias[fa_ref_mod_index(rp, b, h, i, j)] = ds;
                if (softcap > 0)
                    ds = fa_test_round_to(bdt, ds * (1.0f - tanh_row[j] * tanh_row[j]));
                const double *k_row = rp->k + ((seq.k_row + j) * hkv + kv_head) * d;
                for (int64_t c = 0; c < d; c++) {
                    dq_acc[c] += ds * (float)k_row[c];
                    dk_acc[j * d + c] += ds * (float)q_row[c];
                }
                for (int64_t c = 0; c < dv; c++) dv_acc[j * dv + c] += probs_drop[j] * (float)do_row[c];
            }
            double *dq_row = out->dq + ((seq.q_row + i) * hq + h) * d;
            for (int64_t c = 0; c < d; c++) dq_row[c] = fa_test_round_to(bdt, scale * dq_acc[c]);
            if (has_sink) { /* the sink column of the softmax: P_sink rounded, dS = P·(0 - D) */
                float p_sink = fa_test_round_to(bdt, expf(sink - row_max) / sum);
                dsink_sum += fa_test_round_to(bdt, p_sink * (0.0f - delta));
            }
        }
        if (has_sink) dsink_part[2 * g] = dsink_sum;
    }
    if (backward) {
        for (int64_t j = 0; j < seq.len_k; j++) {
            double *dk_row = out->dk + ((seq.k_row + j) * hkv + kv_head) * d;
            double *dv_row = out->dv + ((seq.k_row + j) * hkv + kv_head) * dv;
            for (int64_t c = 0; c < d; c++) dk_row[c] = fa_test_round_to(bdt, scale * dk_acc[j * d + c]);
            for (int64_t c = 0; c < dv; c++) dv_row[c] = fa_test_round_to(bdt, dv_acc[j * dv + c]);
        }
    }
}

typedef struct ref_job {
    const fa_ref_problem *rp;
    fa_ref_outputs *out;
    int backward, baseline;
    fa_dtype dtype;
    double *dsink_parts; /* [units, group, 2]: the value and (oracle) its term magnitude */
    int64_t units;
    atomic_llong next_unit;
} ref_job;

static void *ref_worker(void *arg) {
    ref_job *job = arg;
    const fa_ref_problem *rp = job->rp;
    int64_t sk = rp->seqlen_k > 0 ? rp->seqlen_k : 1;
    int64_t group = rp->heads_q / rp->heads_kv;
    double *scores64 = malloc((size_t)sk * 2 * sizeof(double));
    float *scratch32 = malloc((size_t)sk * 4 * sizeof(float));
    float *dk_acc = job->baseline && job->backward
                        ? malloc((size_t)(sk * rp->head_dim) * sizeof(float)) : NULL;
    float *dv_acc = job->baseline && job->backward
                        ? malloc((size_t)(sk * rp->head_dim_v) * sizeof(float)) : NULL;
    if (!scores64 || !scratch32 || (job->baseline && job->backward && (!dk_acc || !dv_acc))) {
        fprintf(stderr, "reference: out of memory\n");
        abort(); /* test harness only: an oracle that cannot run must not pass anything */
    }
    for (;;) {
        int64_t unit = atomic_fetch_add(&job->next_unit, 1);
        if (unit >= job->units) break;
        int64_t b = unit / rp->heads_kv, kv_head = unit % rp->heads_kv;
        double *part = job->dsink_parts + unit * group * 2;
        if (job->baseline)
            baseline_unit(rp, job->dtype, job->backward, job->out, b, kv_head, part, scratch32,
                          scratch32 + sk, scratch32 + 2 * sk, scratch32 + 3 * sk, dk_acc, dv_acc);
        else
            ref64_unit(rp, job->backward, job->out, b, kv_head, part, scores64, scores64 + sk);
    }
    free(scores64);
    free(scratch32);
    free(dk_acc);
    free(dv_acc);
    return NULL;
}

static int ref_thread_count(int64_t units) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("FA_TEST_REF_THREADS");
    if (env && atoi(env) > 0) cpus = atoi(env);
    if (cpus < 1) cpus = 1;
    if (cpus > 32) cpus = 32;
    if (cpus > units) cpus = (long)units;
    return cpus < 1 ? 1 : (int)cpus;
}

static void ref_run(const fa_ref_problem *rp, int baseline, fa_dtype dtype, int backward,
                    fa_ref_outputs *out) {
    const int64_t d = rp->head_dim, dv = rp->head_dim_v;
    const int64_t group = rp->heads_q / rp->heads_kv;
    if (backward) {
        size_t q_count = (size_t)(rp->rows_q * rp->heads_q * d);
        size_t k_count = (size_t)(rp->rows_k * rp->heads_kv * d);
        size_t v_count = (size_t)(rp->rows_k * rp->heads_kv * dv);
        memset(out->dq, 0, q_count * sizeof(double));
        memset(out->dk, 0, k_count * sizeof(double));
        memset(out->dv, 0, v_count * sizeof(double));
        memset(out->dq_mag, 0, q_count * sizeof(double));
        memset(out->dk_mag, 0, k_count * sizeof(double));
        memset(out->dq_dnoise, 0, q_count * sizeof(double));
        memset(out->dk_dnoise, 0, k_count * sizeof(double));
        memset(out->dv_mag, 0, v_count * sizeof(double));
    }
    ref_job job;
    job.rp = rp;
    job.out = out;
    job.backward = backward;
    job.baseline = baseline;
    job.dtype = dtype;
    job.units = rp->batch * rp->heads_kv;
    atomic_init(&job.next_unit, 0);
    job.dsink_parts = calloc((size_t)(job.units * group * 2 + 1), sizeof(double));
    if (!job.dsink_parts) abort();
    int threads = ref_thread_count(job.units);
    pthread_t tids[32];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&tids[started], NULL, ref_worker, &job) == 0) started++;
    ref_worker(&job);
    for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
    if (backward && !baseline) { /* dk's spread from D: the rows' variances summed, as a deviation */
        const size_t k_count = (size_t)(rp->rows_k * rp->heads_kv * d);
        for (size_t e = 0; e < k_count; e++) out->dk_dnoise[e] = sqrt(out->dk_dnoise[e]);
    }
    if (backward && rp->sinks && out->dsink) { /* reduce over batches in a fixed order      */
        for (int64_t h = 0; h < rp->heads_q; h++) {
            int64_t kv_head = h / group, g = h % group;
            double sum64 = 0.0, magnitude = 0.0;
            float sum32 = 0.0f;
            for (int64_t b = 0; b < rp->batch; b++) {
                const double *part = job.dsink_parts + ((b * rp->heads_kv + kv_head) * group + g) * 2;
                sum64 += part[0];
                sum32 += (float)part[0];
                magnitude += part[1];
            }
            out->dsink[h] = baseline ? (double)sum32 : sum64;
            if (out->dsink_mag) out->dsink_mag[h] = magnitude;
        }
    }
    free(job.dsink_parts);
}

void fa_ref64_run(const fa_ref_problem *rp, int backward, fa_ref_outputs *out) {
    ref_run(rp, 0, FA_DTYPE_F32, backward, out);
}

void fa_ref_baseline_run(const fa_ref_problem *rp, fa_dtype dtype, int backward,
                         fa_ref_outputs *out) {
    ref_run(rp, 1, dtype, backward, out);
}

int fa_ref_outputs_alloc(const fa_ref_problem *rp, int backward, fa_ref_outputs *out) {
    memset(out, 0, sizeof *out);
    size_t lse_count = (size_t)(rp->cu_seqlens_q ? rp->heads_q * rp->rows_q
                                                 : rp->batch * rp->heads_q * rp->seqlen_q);
    out->o = calloc((size_t)(rp->rows_q * rp->heads_q * rp->head_dim_v) + 1, sizeof(double));
    out->lse = calloc(lse_count + 1, sizeof(double));
    int ok = out->o && out->lse;
    out->o_mag = calloc((size_t)(rp->rows_q * rp->heads_q * rp->head_dim_v) + 1, sizeof(double));
    out->lse_mag = calloc(lse_count + 1, sizeof(double));
    ok = ok && out->o_mag && out->lse_mag;
    if (backward) {
        size_t q_count = (size_t)(rp->rows_q * rp->heads_q * rp->head_dim) + 1;
        size_t k_count = (size_t)(rp->rows_k * rp->heads_kv * rp->head_dim) + 1;
        size_t v_count = (size_t)(rp->rows_k * rp->heads_kv * rp->head_dim_v) + 1;
        out->dq = calloc(q_count, sizeof(double));
        out->dk = calloc(k_count, sizeof(double));
        out->dv = calloc(v_count, sizeof(double));
        out->dsink = calloc((size_t)rp->heads_q + 1, sizeof(double));
        out->dq_mag = calloc(q_count, sizeof(double));
        out->dk_mag = calloc(k_count, sizeof(double));
        out->dv_mag = calloc(v_count, sizeof(double));
        out->dsink_mag = calloc((size_t)rp->heads_q + 1, sizeof(double));
        out->dq_dnoise = calloc(q_count, sizeof(double));
        out->dk_dnoise = calloc(k_count, sizeof(double));
        ok = ok && out->dq && out->dk && out->dv && out->dsink && out->dq_mag && out->dk_mag &&
             out->dv_mag && out->dsink_mag && out->dq_dnoise && out->dk_dnoise;
        if (rp->bias) {
            out->dbias = calloc((size_t)(rp->batch * rp->heads_q * rp->seqlen_q * rp->seqlen_k) + 1, sizeof(double));
            out->dbias_mag = calloc((size_t)(rp->batch * rp->heads_q * rp->seqlen_q * rp->seqlen_k) + 1, sizeof(double));
            ok = ok && out->dbias && out->dbias_mag;
        }
    }
    if (!ok) {
        fa_ref_outputs_free(out);
        return -1;
    }
    return 0;
}

void fa_ref_outputs_free(fa_ref_outputs *out) {
    free(out->o);
    free(out->lse);
    free(out->dq);
    free(out->dk);
    free(out->dv);
    free(out->dsink);
    free(out->o_mag);
    free(out->lse_mag);
    free(out->dq_mag);
    free(out->dk_mag);
    free(out->dv_mag);
    free(out->dsink_mag);
    free(out->dq_dnoise);
    free(out->dk_dnoise);
    free(out->dbias);
    free(out->dbias_mag);
    memset(out, 0, sizeof *out);
}

int fa_ref_references(const fa_params *p, fa_dtype dtype, int backward, fa_ref_gathered *g, fa_ref_outputs *ref64,
                      fa_ref_outputs *baseline) {
    memset(ref64, 0, sizeof *ref64);
    memset(baseline, 0, sizeof *baseline);
    if (fa_ref_gather(p, g) || fa_ref_outputs_alloc(&g->rp, backward, ref64) ||
        fa_ref_outputs_alloc(&g->rp, backward, baseline)) {
        fa_ref_references_free(g, ref64, baseline);
        return -1;
    }
    fa_ref64_run(&g->rp, backward, ref64);
    fa_ref_baseline_run(&g->rp, dtype, backward, baseline);
    return 0;
}

void fa_ref_references_free(fa_ref_gathered *g, fa_ref_outputs *ref64, fa_ref_outputs *baseline) {
    fa_ref_outputs_free(ref64);
    fa_ref_outputs_free(baseline);
    fa_ref_gathered_free(g);
}

/* ---- gathering a host fa_params problem into canonical doubles ---------------------------- */

/* Read a [rows, heads, dim] strided tensor of p into canonical doubles (unused rows zero). */
static void gather_tensor(const fa_params *p, const fa_ref_problem *rp, const void *base,
                          int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                          int key_side, int64_t heads, int64_t dim, double *dst) {
    for (int64_t b = 0; b < rp->batch; b++) {
        ref_sequence seq = ref_seq(rp, b);
        int64_t len = key_side ? seq.len_k : seq.len_q;
        int64_t first = key_side ? seq.k_row : seq.q_row;
        for (int64_t i = 0; i < len; i++) {
            int64_t src_row = rp->cu_seqlens_q ? (first + i) * row_stride
                                               : b * batch_stride + i * row_stride;
            for (int64_t h = 0; h < heads; h++)
                for (int64_t c = 0; c < dim; c++)
                    dst[((first + i) * heads + h) * dim + c] =
                        fa_test_load(base, p->dtype, src_row + h * head_stride + c);
        }
    }
}

/* Is key block kb in list[0 .. count)? (a plain scan: the oracle does not rely on the order) */
static int ref_listed(const int32_t *list, int32_t count, int64_t kb) {
    for (int32_t n = 0; n < count; n++)
        if (list[n] == kb) return n + 1;
    return 0;
}

/* The dense bias and visibility of p's bias, block mask and document ids (fa_params' rules:
 * a full block is visible, a partial one where the window, the documents and its bit agree, an
 * unlisted one nowhere; without a block mask every element is "partial"). 0, or -1 OOM. */
static int gather_mods(const fa_params *p, fa_ref_problem *rp, fa_ref_gathered *g) {
    const int64_t n = rp->batch * rp->heads_q * rp->seqlen_q * rp->seqlen_k;
    const int blocks = p->kv_num_blocks != NULL, docs = p->doc_ids_q != NULL;
    if (p->bias) {
        g->bias = calloc((size_t)n + 1, sizeof(double));
        if (!g->bias) return -1;
    }
    if (blocks || docs) {
        g->visible = calloc((size_t)n + 1, 1);
        if (!g->visible) return -1;
    }
    for (int64_t b = 0; b < rp->batch; b++) {
        ref_sequence seq = ref_seq(rp, b);
        for (int64_t h = 0; h < rp->heads_q; h++)
            for (int64_t i = 0; i < seq.len_q; i++) {
                int64_t lo, hi;
                ref_visible(rp, i, seq.len_q, seq.len_k, &lo, &hi);
                for (int64_t j = 0; j < seq.len_k; j++) {
                    const int64_t at = fa_ref_mod_index(rp, b, h, i, j);
                    if (g->bias)
                        g->bias[at] = fa_test_load(p->bias, p->bias_dtype,
                                                   b * p->bias_batch_stride + h * p->bias_head_stride +
                                                       i * p->bias_row_stride + j * p->bias_col_stride);
                    if (!g->visible) continue;
                    int elem = j >= lo && j < hi;
                    if (docs) {
                        const int64_t iq = rp->cu_seqlens_q ? seq.q_row + i : b * p->doc_ids_q_batch_stride + i;
                        const int64_t jk = rp->cu_seqlens_k ? seq.k_row + j : b * p->doc_ids_k_batch_stride + j;
                        elem = elem && p->doc_ids_q[iq] == p->doc_ids_k[jk];
                    }
                    int vis = elem;
                    if (blocks) {
                        const int64_t qb = i / p->block_q, kb = j / p->block_k;
                        const int64_t c_at = b * p->block_count_batch_stride + h * p->block_count_head_stride + qb;
                        const int64_t l_at = b * p->block_index_batch_stride + h * p->block_index_head_stride +
                                             qb * p->block_index_row_stride;
                        const int part = ref_listed(p->kv_indices + l_at, p->kv_num_blocks[c_at], kb);
                        const int full = p->full_kv_indices &&
                                         ref_listed(p->full_kv_indices + l_at, p->full_kv_num_blocks[c_at], kb);
                        vis = full ? 1 : part ? elem : 0;
                        if (part && vis && p->partial_block_bits) {
                            const int64_t bytes = (p->block_q * p->block_k + 7) / 8;
                            const uint8_t *bits = p->partial_block_bits + (l_at + part - 1) * bytes;
                            const int64_t bit = (i % p->block_q) * p->block_k + j % p->block_k;
                            vis = (bits[bit / 8] >> (bit % 8)) & 1;
                        }
                    }
                    g->visible[at] = (unsigned char)vis;
                }
            }
    }
    rp->bias = g->bias;
    rp->visible = g->visible;
    return 0;
}

int fa_ref_gather(const fa_params *p, fa_ref_gathered *g) {
    memset(g, 0, sizeof *g);
    fa_ref_problem *rp = &g->rp;
    rp->batch = p->batch;
    rp->seqlen_q = p->seqlen_q;
    rp->seqlen_k = p->seqlen_k;
    rp->heads_q = p->heads_q;
    rp->heads_kv = p->heads_kv;
    rp->head_dim = p->head_dim;
    rp->head_dim_v = p->head_dim_v ? p->head_dim_v : p->head_dim;
    int varlen = p->cu_seqlens_q != NULL;
    rp->cu_seqlens_q = varlen ? p->cu_seqlens_q : NULL;
    rp->cu_seqlens_k = varlen ? p->cu_seqlens_k : NULL;
    rp->rows_q = varlen ? p->total_q : p->batch * p->seqlen_q;
    rp->rows_k = varlen ? p->total_k : p->batch * p->seqlen_k;
    /* the mathematically specified scale; the library's float default differs by < 1 ulp */
    rp->scale = p->softmax_scale != 0.0f ? (double)p->softmax_scale : 1.0 / sqrt((double)p->head_dim);
    rp->softcap = p->softcap;
    int64_t left = p->use_window && p->window_left >= 0 ? p->window_left : -1;
    int64_t right = p->use_window && p->window_right >= 0 ? p->window_right : -1;
    if (p->causal) right = 0; /* min(right, 0) with right unbounded (-1) or >= 0 */
    rp->window_left = left;
    rp->window_right = right;
    rp->dropout_p = p->dropout_p;
    rp->dropout_seed = p->dropout_seed;
    rp->dropout_offset = p->dropout_offset;

    const int64_t d = rp->head_dim, dv = rp->head_dim_v;
    g->q = calloc((size_t)(rp->rows_q * rp->heads_q * d) + 1, sizeof(double));
    g->k = calloc((size_t)(rp->rows_k * rp->heads_kv * d) + 1, sizeof(double));
    g->v = calloc((size_t)(rp->rows_k * rp->heads_kv * dv) + 1, sizeof(double));
    if (!g->q || !g->k || !g->v) goto oom;
    gather_tensor(p, rp, p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, 0,
                  rp->heads_q, d, g->q);
    gather_tensor(p, rp, p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, 1,
                  rp->heads_kv, d, g->k);
    gather_tensor(p, rp, p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, 1,
                  rp->heads_kv, dv, g->v);
    if (p->dout) {
        g->dout = calloc((size_t)(rp->rows_q * rp->heads_q * dv) + 1, sizeof(double));
        if (!g->dout) goto oom;
        gather_tensor(p, rp, p->dout, p->do_batch_stride, p->do_row_stride, p->do_head_stride,
                      0, rp->heads_q, dv, g->dout);
    }
    if (p->alibi_slopes) {
        g->slopes = calloc((size_t)(rp->batch * rp->heads_q), sizeof(double));
        if (!g->slopes) goto oom;
        for (int64_t b = 0; b < rp->batch; b++)
            for (int64_t h = 0; h < rp->heads_q; h++)
                g->slopes[b * rp->heads_q + h] = p->alibi_slopes[b * p->alibi_batch_stride + h];
    }
    if (p->sink_logits) {
        g->sinks = calloc((size_t)rp->heads_q, sizeof(double));
        if (!g->sinks) goto oom;
        for (int64_t h = 0; h < rp->heads_q; h++) g->sinks[h] = p->sink_logits[h];
    }
    if (gather_mods(p, rp, g)) goto oom;
    rp->q = g->q;
    rp->k = g->k;
    rp->v = g->v;
    rp->dout = g->dout;
    rp->slopes = g->slopes;
    rp->sinks = g->sinks;
    return 0;
oom:
    fa_ref_gathered_free(g);
    return -1;
}

void fa_ref_gathered_free(fa_ref_gathered *g) {
    free(g->q);
    free(g->k);
    free(g->v);
    free(g->dout);
    free(g->slopes);
    free(g->sinks);
    free(g->bias);
    free(g->visible);
    memset(g, 0, sizeof *g);
}

/* ---- tolerance ---------------------------------------------------------------------------- */

/* The absolute floor. FlashAttention-3's tests use fwd_atol = 2·max|(ref + 0.3 - 0.3) - ref|,
 * twice the rounding noise of the dtype at the output's magnitude (shifted by 0.3 so that a
 * tensor of near-zero values still gets the noise of values ~0.3). Rounding to nearest errs by
 * at most half a unit in the last place, so that is one ulp of the dtype at max|ref| + 0.3:
 * about 2e-3 for f16 and 1.6e-2 for bf16 at magnitude 1. It matters where the baseline happens
 * to be (nearly) exact, e.g. tensors of a handful of elements such as dsink.
 * That rule assumes storage rounding dominates. Every path also computes in fp32, whose noise
 * scales with the magnitude of the terms summed, not with the result: fp32 outputs carry the
 * accumulation noise of sums over hundreds of terms (dot products, P·V, dK summed over rows,
 * dsink over every row) taken in another order than the baseline's, and a FlashAttention
 * backward recomputes P = exp(S - LSE), adding eps·|S| per element. A gradient whose terms
 * cancel (a row that sees one key has dS = P·(dP - D) = 0 exactly, while dP and D = rowsum(dO∘O)
 * are each ~10) is exact in the baseline and off by eps·|terms| in any FlashAttention backward,
 * whatever the storage dtype. So the floor is also at least 8 fp32 ulp at the largest term
 * magnitude (max of |ref| and the oracle's Σ|terms|): about 1e-6 at magnitude 1, four orders of
 * magnitude below a semantic error such as one missing key (P ~ 1e-2) or an accidental 16-bit
 * intermediate in an f32 path (~1e-3). For f32 tensors (and lse, always fp32) that second term
 * is the floor. */
double fa_test_floor(fa_dtype dtype, double ref_max, double term_max) {
    int exponent;
    frexp(ref_max + 0.3, &exponent); /* ref_max + 0.3 = m·2^exponent, m in [0.5, 1)       */
    double storage = ldexp(1.0, exponent - 1 - fa_test_mantissa_bits(dtype));
    frexp((term_max > ref_max ? term_max : ref_max) + 0.3, &exponent);
    double fp32_noise = 8.0 * ldexp(1.0, exponent - 1 - fa_test_mantissa_bits(FA_DTYPE_F32));
    return storage > fp32_noise ? storage : fp32_noise;
}

double *fa_ref_tensor(const fa_ref_outputs *outputs, int tensor) {
    switch (tensor) {
    case FA_T_O: return outputs->o;
    case FA_T_LSE: return outputs->lse;
    case FA_T_DQ: return outputs->dq;
    case FA_T_DK: return outputs->dk;
    case FA_T_DV: return outputs->dv;
    case FA_T_DSINK: return outputs->dsink;
    default: return NULL;
    }
}

double *fa_ref_tensor_magnitude(const fa_ref_outputs *outputs, int tensor) {
    switch (tensor) {
    case FA_T_O: return outputs->o_mag;
    case FA_T_LSE: return outputs->lse_mag;
    case FA_T_DQ: return outputs->dq_mag;
    case FA_T_DK: return outputs->dk_mag;
    case FA_T_DV: return outputs->dv_mag;
    case FA_T_DSINK: return outputs->dsink_mag;
    default: return NULL;
    }
}

/* ---- test problems ------------------------------------------------------------------------ */

#define POISON_F32 FA_TEST_POISON_F32
#define POISON_16_F16 FA_TEST_POISON_F16
#define POISON_16_BF16 FA_TEST_POISON_BF16

static fa_dtype tensor_dtype(const fa_test_problem *tp, int tensor) {
    if (tensor == FA_T_LSE || tensor == FA_T_DSINK || tensor == FA_T_ALIBI || tensor == FA_T_SINK)
        return FA_DTYPE_F32;
    return tp->spec.dtype;
}

static void poison_buffer(fa_test_buffer *buf, fa_dtype dtype) {
    if (!buf->host) return;
    if (buf->elem_size == 4) {
        uint32_t *w = buf->host;
        for (size_t i = 0; i < buf->bytes / 4; i++) w[i] = POISON_F32;
    } else {
        uint16_t pattern = dtype == FA_DTYPE_F16 ? POISON_16_F16 : POISON_16_BF16;
        uint16_t *w = buf->host;
        for (size_t i = 0; i < buf->bytes / 2; i++) w[i] = pattern;
    }
}

static int is_poison(const fa_test_buffer *buf, fa_dtype dtype, int64_t index) {
    if (buf->elem_size == 4) return ((const uint32_t *)buf->host)[index] == POISON_F32;
    uint16_t pattern = dtype == FA_DTYPE_F16 ? POISON_16_F16 : POISON_16_BF16;
    return ((const uint16_t *)buf->host)[index] == pattern;
}

const char *fa_test_tensor_name(int tensor) {
    static const char *names[FA_T_COUNT] = {"q",   "k",     "v",    "o",    "dout",
                                            "dq",  "dk",    "dv",   "lse",  "dsink",
                                            "cu_seqlens_q", "cu_seqlens_k", "alibi", "sinks"};
    return tensor >= 0 && tensor < FA_T_COUNT ? names[tensor] : "?";
}

static int tensor_on_q_side(int tensor) {
    return tensor == FA_T_Q || tensor == FA_T_O || tensor == FA_T_DO || tensor == FA_T_DQ;
}

static int64_t tensor_heads(const fa_test_problem *tp, int tensor) {
    return tensor_on_q_side(tensor) ? tp->spec.heads_q : tp->spec.heads_kv;
}

static int64_t tensor_dim(const fa_test_problem *tp, int tensor) {
    return (tensor == FA_T_V || tensor == FA_T_O || tensor == FA_T_DO || tensor == FA_T_DV)
               ? tp->spec.head_dim_v : tp->spec.head_dim;
}

/* Sequence geometry of the test problem (independent of the library). */
static void problem_seq(const fa_test_problem *tp, int64_t b, int key_side, int64_t *first_row,
                        int64_t *len) {
    if (tp->spec.varlen) {
        const int32_t *cu = tp->buffer[key_side ? FA_T_CU_K : FA_T_CU_Q].host;
        *first_row = cu[b];
        *len = cu[b + 1] - cu[b];
    } else {
        *first_row = b * (key_side ? tp->spec.seqlen_k : tp->spec.seqlen_q);
        *len = key_side ? tp->spec.seqlen_k : tp->spec.seqlen_q;
    }
}

/* Buffer element index of (b, i, h, c) of strided tensor `tensor`. */
static int64_t strided_index(const fa_test_problem *tp, int tensor, int64_t b, int64_t first_row,
                             int64_t i, int64_t h, int64_t c) {
    const fa_test_view *vw = &tp->view[tensor];
    int64_t row = tp->spec.varlen ? (first_row + i) * vw->row_stride
                                  : b * vw->batch_stride + i * vw->row_stride;
    return vw->offset + row + h * vw->head_stride + c;
}

/* Calls visit(ctx, buffer_index, canonical_index) for every logical element of `tensor`. */
typedef void (*element_visitor)(void *ctx, int64_t buffer_index, int64_t canonical_index);

static void for_each_element(const fa_test_problem *tp, int tensor, element_visitor visit,
                             void *ctx) {
    const fa_test_spec *s = &tp->spec;
    if (tensor < FA_T_STRIDED_COUNT) {
        int key_side = !tensor_on_q_side(tensor);
        int64_t heads = tensor_heads(tp, tensor), dim = tensor_dim(tp, tensor);
        for (int64_t b = 0; b < s->batch; b++) {
            int64_t first, len;
            problem_seq(tp, b, key_side, &first, &len);
            for (int64_t i = 0; i < len; i++)
                for (int64_t h = 0; h < heads; h++)
                    for (int64_t c = 0; c < dim; c++)
                        visit(ctx, strided_index(tp, tensor, b, first, i, h, c),
                              ((first + i) * heads + h) * dim + c);
        }
    } else if (tensor == FA_T_LSE) {
        for (int64_t b = 0; b < s->batch; b++) {
            int64_t first, len;
            problem_seq(tp, b, 0, &first, &len);
            for (int64_t h = 0; h < s->heads_q; h++)
                for (int64_t i = 0; i < len; i++) {
                    int64_t at = s->varlen ? h * tp->total_q + first + i
                                           : (b * s->heads_q + h) * s->seqlen_q + i;
                    visit(ctx, at, at);
                }
        }
    } else if (tensor == FA_T_DSINK || tensor == FA_T_SINK) {
        for (int64_t h = 0; h < s->heads_q; h++) visit(ctx, h, h);
    } else if (tensor == FA_T_ALIBI) {
        int64_t batches = s->alibi == FA_TEST_ALIBI_BATCH_HEAD ? s->batch : 1;
        for (int64_t b = 0; b < batches; b++)
            for (int64_t h = 0; h < s->heads_q; h++)
                visit(ctx, b * tp->params.alibi_batch_stride + h, b * s->heads_q + h);
    }
}

typedef struct fill_ctx {
    void *base;
    fa_dtype dtype;
    fa_test_rng *rng;
    double amplitude, offset;
} fill_ctx;

static void fill_visit(void *ctx_, int64_t at, int64_t canonical) {
    fill_ctx *ctx = ctx_;
    (void)canonical;
    fa_test_store(ctx->base, ctx->dtype, at,
                  ctx->amplitude * fa_test_rng_normal(ctx->rng) + ctx->offset);
}

/* Fill tensor logical elements in canonical order (the values do not depend on the layout). */
static void fill_tensor(fa_test_problem *tp, int tensor, fa_test_rng *rng, double amplitude,
                        double offset) {
    fa_test_buffer *buf = &tp->buffer[tp->view[tensor].buffer];
    /* visit in canonical order: for strided tensors for_each_element already iterates b, i, h, c */
    fill_ctx ctx = {buf->host, tensor_dtype(tp, tensor), rng, amplitude, offset};
    for_each_element(tp, tensor, fill_visit, &ctx);
}

typedef struct extent_ctx {
    int64_t max_index;
} extent_ctx;

static void extent_visit(void *ctx_, int64_t at, int64_t canonical) {
    extent_ctx *ctx = ctx_;
    (void)canonical;
    if (at > ctx->max_index) ctx->max_index = at;
}

/* Strides and offset of one strided tensor in its own buffer (packed QKV handled by caller). */
static void layout_tensor(fa_test_problem *tp, int tensor, fa_test_layout layout,
                          fa_test_rng *rng) {
    const fa_test_spec *s = &tp->spec;
    int64_t heads = tensor_heads(tp, tensor), dim = tensor_dim(tp, tensor);
    int64_t rows = tensor_on_q_side(tensor) ? (s->varlen ? tp->total_q : s->seqlen_q)
                                            : (s->varlen ? tp->total_k : s->seqlen_k);
    int64_t align = s->pad_align;
    fa_test_view *vw = &tp->view[tensor];
    vw->buffer = tensor;
    vw->offset = 0;
    switch (layout) {
    case FA_TEST_LAYOUT_PADDED:
        vw->offset = align * fa_test_rng_int(rng, 0, 3);
        vw->head_stride = dim + align * fa_test_rng_int(rng, 0, 2);
        vw->row_stride = heads * vw->head_stride + align * fa_test_rng_int(rng, 0, 3);
        vw->batch_stride = rows * vw->row_stride + align * fa_test_rng_int(rng, 0, 5);
        break;
    case FA_TEST_LAYOUT_BHSD: /* [b, h, s, d] (varlen [h, total, d]) */
        vw->row_stride = dim;
        vw->head_stride = (rows > 0 ? rows : 1) * dim;
        vw->batch_stride = heads * vw->head_stride;
        break;
    default:
        vw->head_stride = dim;
        vw->row_stride = heads * dim;
        vw->batch_stride = rows * heads * dim;
        break;
    }
    if (s->varlen) vw->batch_stride = fa_test_rng_int(rng, 1, 999); /* must be ignored */
}

static int alloc_buffer(fa_test_buffer *buf, int64_t elements, size_t elem_size, int is_output) {
    if (elements < 1) elements = 1;
    buf->bytes = (size_t)elements * elem_size;
    buf->elem_size = elem_size;
    buf->is_output = is_output;
    /* round the allocation to 64 bytes of slack-free size: aligned_alloc needs a multiple */
    size_t padded = (buf->bytes + 63) & ~(size_t)63;
    buf->host = aligned_alloc(64, padded);
    return buf->host ? 0 : -1;
}

static int64_t buffer_extent(fa_test_problem *tp, int buffer) {
    extent_ctx ctx = {-1};
    for (int t = 0; t < FA_T_COUNT; t++) {
        if (tp->view[t].buffer != buffer) continue;
        for_each_element(tp, t, extent_visit, &ctx);
        /* varlen: the API's packed tensors have total_q / total_k rows, so the rows after the
         * last sequence are allocated (and poisoned) too; an engine may read them but must not
         * let them reach an output */
        if (tp->spec.varlen && t < FA_T_STRIDED_COUNT) {
            int64_t rows = tensor_on_q_side(t) ? tp->total_q : tp->total_k;
            for (int64_t h = 0; h < tensor_heads(tp, t) && rows > 0; h++)
                extent_visit(&ctx, strided_index(tp, t, 0, 0, rows - 1, h, tensor_dim(tp, t) - 1), 0);
        }
    }
    return ctx.max_index + 1;
}

static void make_lengths(fa_test_problem *tp, fa_test_rng *rng) {
    fa_test_spec *s = &tp->spec;
    int64_t max_q = 0, max_k = 0;
    int64_t full_q = fa_test_rng_int(rng, 0, s->batch - 1);
    int64_t full_k = fa_test_rng_int(rng, 0, s->batch - 1);
    int same = s->layout == FA_TEST_LAYOUT_PACKED_QKV && s->seqlen_q == s->seqlen_k &&
               !s->lens_q && !s->lens_k;
    for (int64_t b = 0; b < s->batch; b++) {
        int64_t lq, lk;
        if (s->lens_q) {
            lq = s->lens_q[b];
        } else {
            double u = fa_test_rng_uniform(rng);
            lq = b == full_q ? s->seqlen_q : u < 0.2 ? 0 : fa_test_rng_int(rng, 0, s->seqlen_q);
        }
        if (s->lens_k) {
            lk = s->lens_k[b];
        } else if (same) {
            lk = lq;
        } else {
            double u = fa_test_rng_uniform(rng);
            lk = b == full_k ? s->seqlen_k : u < 0.2 ? 0 : fa_test_rng_int(rng, 0, s->seqlen_k);
        }
        tp->lens_q_storage[b] = (int32_t)lq;
        tp->lens_k_storage[b] = (int32_t)lk;
        if (lq > max_q) max_q = lq;
        if (lk > max_k) max_k = lk;
    }
    if (s->lens_q && max_q > s->seqlen_q) s->seqlen_q = max_q;
    if (s->lens_k && max_k > s->seqlen_k) s->seqlen_k = max_k;
    s->lens_q = tp->lens_q_storage;
    s->lens_k = tp->lens_k_storage;
}

static fa_params problem_params(const fa_test_problem *tp, int on_device);

static uint64_t stream_seed(uint64_t seed, uint64_t stream) {
    fa_test_rng r;
    fa_test_rng_seed(&r, seed ^ (stream * 0xd1b54a32d192ed03ull));
    return fa_test_rng_next(&r);
}

/* Sequence lengths, the varlen offsets and the row counts of a problem. */
static int problem_rows(fa_test_problem *tp, fa_test_rng *len_rng) {
    fa_test_spec *s = &tp->spec;
    if (s->varlen) {
        make_lengths(tp, len_rng);
        if (alloc_buffer(&tp->buffer[FA_T_CU_Q], s->batch + 1, 4, 0) ||
            alloc_buffer(&tp->buffer[FA_T_CU_K], s->batch + 1, 4, 0))
            return -1;
        int32_t *cu_q = tp->buffer[FA_T_CU_Q].host, *cu_k = tp->buffer[FA_T_CU_K].host;
        cu_q[0] = cu_k[0] = 0;
        for (int64_t b = 0; b < s->batch; b++) {
            cu_q[b + 1] = cu_q[b] + s->lens_q[b];
            cu_k[b + 1] = cu_k[b] + s->lens_k[b];
        }
        /* a few unused rows after the last sequence: total may exceed cu_seqlens[batch] */
        int64_t extra = fa_test_rng_int(len_rng, 0, 3);
        tp->total_q = cu_q[s->batch] + extra;
        tp->total_k = cu_k[s->batch] + extra;
        tp->view[FA_T_CU_Q].buffer = FA_T_CU_Q;
        tp->view[FA_T_CU_K].buffer = FA_T_CU_K;
        tp->rows_q = tp->total_q;
        tp->rows_k = tp->total_k;
    } else {
        tp->total_q = s->batch * s->seqlen_q;
        tp->total_k = s->batch * s->seqlen_k;
        tp->rows_q = tp->total_q;
        tp->rows_k = tp->total_k;
    }

    return 0;
}

/* Where each tensor lives: its buffer, offset and strides. */
static void problem_layout(fa_test_problem *tp, fa_test_rng *layout_rng) {
    fa_test_spec *s = &tp->spec;
    if (s->layout == FA_TEST_LAYOUT_PACKED_QKV) {
        int same_rows = s->varlen ? tp->total_q == tp->total_k &&
                                        !memcmp(tp->buffer[FA_T_CU_Q].host,
                                                tp->buffer[FA_T_CU_K].host,
                                                (size_t)(s->batch + 1) * 4)
                                  : s->seqlen_q == s->seqlen_k;
        if (!same_rows || s->head_dim != s->head_dim_v) s->layout = FA_TEST_LAYOUT_PADDED;
    }
    int strided[FA_T_STRIDED_COUNT] = {1, 1, 1, 1, s->backward, s->backward, s->backward,
                                       s->backward};
    if (s->layout == FA_TEST_LAYOUT_PACKED_QKV) {
        /* one buffer [rows, hq + 2·hkv, d] (+ padding) holds q, k, v; another dq, dk, dv */
        int64_t d = s->head_dim, all_heads = s->heads_q + 2 * s->heads_kv;
        int64_t rows = s->varlen ? tp->total_q : s->seqlen_q;
        int64_t align = s->pad_align;
        int64_t row_stride = all_heads * d + align * fa_test_rng_int(layout_rng, 0, 2);
        int64_t batch_stride = rows * row_stride + align * fa_test_rng_int(layout_rng, 0, 2);
        int64_t head_offset[3] = {0, s->heads_q * d, (s->heads_q + s->heads_kv) * d};
        int members[2][3] = {{FA_T_Q, FA_T_K, FA_T_V}, {FA_T_DQ, FA_T_DK, FA_T_DV}};
        for (int set = 0; set < (s->backward ? 2 : 1); set++)
            for (int m = 0; m < 3; m++) {
                fa_test_view *vw = &tp->view[members[set][m]];
                vw->buffer = members[set][0];
                vw->offset = head_offset[m];
                vw->head_stride = d;
                vw->row_stride = row_stride;
                vw->batch_stride = s->varlen ? 5 : batch_stride;
            }
        layout_tensor(tp, FA_T_O, FA_TEST_LAYOUT_PADDED, layout_rng);
        if (s->backward) layout_tensor(tp, FA_T_DO, FA_TEST_LAYOUT_PADDED, layout_rng);
    } else {
        for (int t = 0; t < FA_T_STRIDED_COUNT; t++)
            if (strided[t]) layout_tensor(tp, t, s->layout, layout_rng);
    }
    tp->view[FA_T_LSE].buffer = FA_T_LSE;
    if (s->alibi != FA_TEST_ALIBI_NONE) tp->view[FA_T_ALIBI].buffer = FA_T_ALIBI;
    if (s->sinks) {
        tp->view[FA_T_SINK].buffer = FA_T_SINK;
        if (s->backward) tp->view[FA_T_DSINK].buffer = FA_T_DSINK;
    }
    tp->params.alibi_batch_stride =
        s->alibi == FA_TEST_ALIBI_BATCH_HEAD ? s->heads_q + fa_test_rng_int(layout_rng, 0, 3) : 0;

}

/* The host buffers, each sized to the furthest logical element of the tensors it holds and poisoned. */
static int problem_buffers(fa_test_problem *tp) {
    fa_test_spec *s = &tp->spec;
    for (int buffer = 0; buffer < FA_T_COUNT; buffer++) {
        if (buffer == FA_T_CU_Q || buffer == FA_T_CU_K) continue;
        int used = 0;
        for (int t = 0; t < FA_T_COUNT; t++) used |= tp->view[t].buffer == buffer;
        if (!used) continue;
        int64_t extent = buffer_extent(tp, buffer);
        if (buffer == FA_T_LSE)
            extent = s->varlen ? s->heads_q * tp->total_q : s->batch * s->heads_q * s->seqlen_q;
        int is_output = buffer == FA_T_O || buffer == FA_T_LSE || buffer == FA_T_DQ ||
                        buffer == FA_T_DK || buffer == FA_T_DV || buffer == FA_T_DSINK;
        if (alloc_buffer(&tp->buffer[buffer], extent, fa_test_dtype_size(tensor_dtype(tp, buffer)),
                         is_output))
            return -1;
        /* everything not written below (padding, unused rows) holds poison: reading it
         * would spread NaN into the outputs, writing it is detected as clobbering */
        poison_buffer(&tp->buffer[buffer], tensor_dtype(tp, buffer));
    }

    return 0;
}

/* The input values, in canonical order (independent of the layout), and the saved copies of the inputs. */
static int problem_values(fa_test_problem *tp, fa_test_rng *value_rng) {
    fa_test_spec *s = &tp->spec;
    fill_tensor(tp, FA_T_Q, value_rng, s->q_amplitude, 0.0);
    fill_tensor(tp, FA_T_K, value_rng, 1.0, 0.0);
    fill_tensor(tp, FA_T_V, value_rng, 1.0, 0.5); /* offset: outputs are not near zero */
    if (s->backward) fill_tensor(tp, FA_T_DO, value_rng, 1.0, 0.5);
    if (s->alibi != FA_TEST_ALIBI_NONE) { /* slopes in [0.01, 0.3) as in FlashAttention's tests */
        float *slopes = tp->buffer[FA_T_ALIBI].host;
        int64_t batches = s->alibi == FA_TEST_ALIBI_BATCH_HEAD ? s->batch : 1;
        for (int64_t b = 0; b < batches; b++)
            for (int64_t h = 0; h < s->heads_q; h++)
                slopes[b * tp->params.alibi_batch_stride + h] =
                    (float)(0.01 + 0.29 * fa_test_rng_uniform(value_rng));
    }
    if (s->sinks) { /* comparable to the row's own mass: log(keys) ± 1 */
        float *sinks = tp->buffer[FA_T_SINK].host;
        double typical = log((double)(s->seqlen_k > 1 ? s->seqlen_k : 1));
        for (int64_t h = 0; h < s->heads_q; h++)
            sinks[h] = (float)(0.75 * typical + fa_test_rng_normal(value_rng));
    }
    for (int buffer = 0; buffer < FA_T_COUNT; buffer++) {
        fa_test_buffer *buf = &tp->buffer[buffer];
        if (!buf->host || buf->is_output) continue;
        buf->saved = malloc(buf->bytes);
        if (!buf->saved) return -1;
        memcpy(buf->saved, buf->host, buf->bytes);
    }

    return 0;
}

/* fa_params of the problem (host pointers and strides). */
static void problem_fill_params(fa_test_problem *tp) {
    fa_test_spec *s = &tp->spec;
    fa_params *p = &tp->params;
    p->device = FA_DEVICE_CPU;
    p->dtype = s->dtype;
    p->batch = s->batch;
    p->seqlen_q = s->seqlen_q;
    p->seqlen_k = s->seqlen_k;
    p->heads_q = s->heads_q;
    p->heads_kv = s->heads_kv;
    p->head_dim = s->head_dim;
    p->head_dim_v = s->head_dim_v;
    if (s->varlen) {
        p->cu_seqlens_q = tp->buffer[FA_T_CU_Q].host;
        p->cu_seqlens_k = tp->buffer[FA_T_CU_K].host;
        p->total_q = tp->total_q;
        p->total_k = tp->total_k;
    }
    p->softmax_scale = s->softmax_scale;
    p->causal = s->causal;
    p->use_window = s->use_window;
    p->window_left = s->window_left;
    p->window_right = s->window_right;
    p->softcap = s->softcap;
    p->dropout_p = s->dropout_p;
    p->dropout_seed = s->dropout_seed;
    p->dropout_offset = s->dropout_offset;
    p->deterministic = s->deterministic;
    *p = problem_params(tp, 0); /* host pointers and strides */
}

int fa_test_problem_create(fa_test_problem *tp, const fa_test_spec *spec) {
    memset(tp, 0, sizeof *tp);
    tp->spec = *spec;
    fa_test_spec *s = &tp->spec;
    if (s->head_dim_v == 0) s->head_dim_v = s->head_dim;
    if (s->pad_align <= 0) s->pad_align = 1;
    if (s->q_amplitude <= 0) s->q_amplitude = 1.0;
    if (s->batch < 1 || s->batch > FA_TEST_MAX_BATCH || s->heads_kv < 1 ||
        s->heads_q % s->heads_kv || s->head_dim < 1 || s->head_dim > FA_MAX_HEAD_DIM ||
        s->head_dim_v > FA_MAX_HEAD_DIM || s->seqlen_q < 0 || s->seqlen_k < 0)
        return -1;
    for (int t = 0; t < FA_T_COUNT; t++) tp->view[t].buffer = -1;

    fa_test_rng len_rng, layout_rng, value_rng;
    fa_test_rng_seed(&len_rng, stream_seed(s->seed, 1));
    fa_test_rng_seed(&layout_rng, stream_seed(s->seed, 2));
    fa_test_rng_seed(&value_rng, stream_seed(s->seed, 3));

    if (problem_rows(tp, &len_rng)) goto fail;
    problem_layout(tp, &layout_rng);
    if (problem_buffers(tp)) goto fail;
    if (problem_values(tp, &value_rng)) goto fail;
    problem_fill_params(tp);
    return 0;
fail:
    fa_test_problem_destroy(tp);
    return -1;
}

static void *tensor_pointer(const fa_test_problem *tp, int tensor, int on_device) {
    const fa_test_view *vw = &tp->view[tensor];
    if (vw->buffer < 0) return NULL;
    const fa_test_buffer *buf = &tp->buffer[vw->buffer];
    char *base = on_device ? buf->device : buf->host;
    if (!base) return NULL;
    return base + (size_t)vw->offset * buf->elem_size;
}

static fa_params problem_params(const fa_test_problem *tp, int on_device) {
    fa_params p = tp->params;
    p.q = tensor_pointer(tp, FA_T_Q, on_device);
    p.k = tensor_pointer(tp, FA_T_K, on_device);
    p.v = tensor_pointer(tp, FA_T_V, on_device);
    p.o = tensor_pointer(tp, FA_T_O, on_device);
    p.lse = tensor_pointer(tp, FA_T_LSE, on_device);
    p.dout = tensor_pointer(tp, FA_T_DO, on_device);
    p.dq = tensor_pointer(tp, FA_T_DQ, on_device);
    p.dk = tensor_pointer(tp, FA_T_DK, on_device);
    p.dv = tensor_pointer(tp, FA_T_DV, on_device);
    p.dsink = tensor_pointer(tp, FA_T_DSINK, on_device);
    p.alibi_slopes = tensor_pointer(tp, FA_T_ALIBI, on_device);
    p.sink_logits = tensor_pointer(tp, FA_T_SINK, on_device);
    if (tp->spec.varlen) {
        p.cu_seqlens_q = tensor_pointer(tp, FA_T_CU_Q, on_device);
        p.cu_seqlens_k = tensor_pointer(tp, FA_T_CU_K, on_device);
    }
#define SET_STRIDES(tensor, prefix)                                                          \
    do {                                                                                     \
        p.prefix##_batch_stride = tp->view[tensor].buffer >= 0 ? tp->view[tensor].batch_stride : 0; \
        p.prefix##_row_stride = tp->view[tensor].buffer >= 0 ? tp->view[tensor].row_stride : 0;     \
        p.prefix##_head_stride = tp->view[tensor].buffer >= 0 ? tp->view[tensor].head_stride : 0;   \
    } while (0)
    SET_STRIDES(FA_T_Q, q);
    SET_STRIDES(FA_T_K, k);
    SET_STRIDES(FA_T_V, v);
    SET_STRIDES(FA_T_O, o);
    SET_STRIDES(FA_T_DO, do);
    SET_STRIDES(FA_T_DQ, dq);
    SET_STRIDES(FA_T_DK, dk);
    SET_STRIDES(FA_T_DV, dv);
#undef SET_STRIDES
    return p;
}

fa_params fa_test_problem_device_params(const fa_test_problem *tp) {
    return problem_params(tp, 1);
}

void fa_test_problem_destroy(fa_test_problem *tp) {
    for (int b = 0; b < FA_T_COUNT; b++) {
        free(tp->buffer[b].host);
        free(tp->buffer[b].saved);
        tp->buffer[b].host = NULL;
        tp->buffer[b].saved = NULL;
    }
}

void fa_test_poison_forward_outputs(fa_test_problem *tp) {
    poison_buffer(&tp->buffer[FA_T_O], tp->spec.dtype);
    poison_buffer(&tp->buffer[FA_T_LSE], FA_DTYPE_F32);
}

void fa_test_poison_backward_outputs(fa_test_problem *tp) {
    for (int t = FA_T_DQ; t <= FA_T_DV; t++) poison_buffer(&tp->buffer[t], tp->spec.dtype);
    poison_buffer(&tp->buffer[FA_T_DSINK], FA_DTYPE_F32);
}

int fa_test_inputs_unchanged(const fa_test_problem *tp) {
    for (int b = 0; b < FA_T_COUNT; b++) {
        const fa_test_buffer *buf = &tp->buffer[b];
        if (buf->host && buf->saved && memcmp(buf->host, buf->saved, buf->bytes)) return 0;
    }
    return 1;
}

int fa_test_buffer_all_poison(const fa_test_problem *tp, int tensor) {
    int buffer = tp->view[tensor].buffer;
    if (buffer < 0 || !tp->buffer[buffer].host) return 1;
    const fa_test_buffer *buf = &tp->buffer[buffer];
    for (size_t i = 0; i < buf->bytes / buf->elem_size; i++)
        if (!is_poison(buf, tensor_dtype(tp, tensor), (int64_t)i)) return 0;
    return 1;
}

void *fa_test_snapshot(const fa_test_problem *tp, int tensor) {
    int buffer = tp->view[tensor].buffer;
    if (buffer < 0) return NULL;
    const fa_test_buffer *buf = &tp->buffer[buffer];
    void *copy = malloc(buf->bytes);
    if (copy) memcpy(copy, buf->host, buf->bytes);
    return copy;
}

int fa_test_same_as_snapshot(const fa_test_problem *tp, int tensor, const void *snapshot) {
    int buffer = tp->view[tensor].buffer;
    if (buffer < 0) return snapshot == NULL;
    return snapshot && !memcmp(tp->buffer[buffer].host, snapshot, tp->buffer[buffer].bytes);
}

void fa_test_describe(const fa_test_problem *tp, char *buf, size_t size) {
    const fa_test_spec *s = &tp->spec;
    size_t used = 0;
    buf[0] = '\0';
#define APPEND(...)                                                                          \
    do {                                                                                     \
        if (used < size) used += (size_t)snprintf(buf + used, size - used, __VA_ARGS__);     \
    } while (0)
    if (s->causal) APPEND("%scausal", used ? "+" : "");
    if (s->use_window) APPEND("%swindow(%d,%d)", used ? "+" : "", (int)s->window_left, (int)s->window_right);
    if (s->softcap > 0) APPEND("%ssoftcap(%g)", used ? "+" : "", (double)s->softcap);
    if (s->alibi) APPEND("%salibi(%s)", used ? "+" : "", s->alibi == FA_TEST_ALIBI_HEAD ? "h" : "bh");
    if (s->sinks) APPEND("%ssink", used ? "+" : "");
    if (s->softmax_scale != 0) APPEND("%sscale(%g)", used ? "+" : "", (double)s->softmax_scale);
    if (s->q_amplitude > 1) APPEND("%ssharp", used ? "+" : "");
    if (s->dropout_p > 0) APPEND("%sdropout(%g,seed %llu)", used ? "+" : "", (double)s->dropout_p,
                                 (unsigned long long)s->dropout_seed);
    if (!used) APPEND("plain");
#undef APPEND
}

/* ---- comparison --------------------------------------------------------------------------- */

typedef struct compare_ctx {
    const fa_test_buffer *buf;
    fa_dtype dtype;
    const double *ref, *base, *magnitude;
    fa_test_check *check;
    uint8_t *logical; /* per buffer element: 1 if some output view covers it */
    const double *dnoise; /* dq / dk: the oracle's spread from O's rounding through D, or NULL */
} compare_ctx;

/* One compared element, ours and ref finite: the largest errors of ours and of the baseline and
 * the largest |ref| so far. */
static void check_note(fa_test_check *c, double ours, double ref, double base) {
    if (fabs(ours - ref) > c->err) c->err = fabs(ours - ref);
    if (fabs(ref) > c->ref_max) c->ref_max = fabs(ref);
    if (fabs(base - ref) > c->base_err) c->base_err = fabs(base - ref);
}

/* The verdict of a check whose tolerance is set. */
static void check_judge(fa_test_check *c) {
    c->ok = c->unwritten == 0 && c->nonfinite == 0 && c->clobbered == 0 && c->err <= c->tol;
}

/* All elements seen: the tolerance 2·base_err + floor (floor_dtype: the tensor's storage type,
 * f32 for lse, also O's) and the verdict. dq and dk: base_err is at least the spread that D =
 * rowsum(dO∘O) taken from the stored O gives them (one standard deviation at the ulp bound,
 * 2^-mantissa·dnoise_max). The baseline pays the same D, but where a handful of rows decide a
 * gradient (a row that sees one key has dS = 0 but for that rounding) its realised error is a
 * few samples of that noise, too few to stand for ours; elsewhere it is far above that spread. */
static void check_finish(fa_test_check *c, fa_dtype floor_dtype) {
    c->floor = fa_test_floor(floor_dtype, c->ref_max, c->term_max);
    const double d_spread = ldexp(c->dnoise_max, -fa_test_mantissa_bits(floor_dtype));
    c->tol = 2.0 * (c->base_err > d_spread ? c->base_err : d_spread) + c->floor;
    check_judge(c);
}

static void compare_visit(void *ctx_, int64_t at, int64_t canonical) {
    compare_ctx *ctx = ctx_;
    fa_test_check *c = ctx->check;
    c->checked++;
    if (is_poison(ctx->buf, ctx->dtype, at)) {
        c->unwritten++;
        return;
    }
    if (ctx->magnitude && ctx->magnitude[canonical] > c->term_max) c->term_max = ctx->magnitude[canonical];
    if (ctx->dnoise && ctx->dnoise[canonical] > c->dnoise_max) c->dnoise_max = ctx->dnoise[canonical];
    double ours = fa_test_load(ctx->buf->host, ctx->dtype, at);
    double ref = ctx->ref[canonical], base = ctx->base ? ctx->base[canonical] : ref;
    if (!isfinite(ref)) { /* only lse: -inf on rows with no key and no sink */
        if (ours != ref) c->nonfinite++;
        return;
    }
    if (!isfinite(ours)) {
        c->nonfinite++;
        return;
    }
    check_note(c, ours, ref, isfinite(base) ? base : ref); /* a non-finite baseline is not counted */
}

static void mark_visit(void *ctx_, int64_t at, int64_t canonical) {
    compare_ctx *ctx = ctx_;
    (void)canonical;
    ctx->logical[at] = 1;
}

fa_test_check fa_test_compare(const fa_test_problem *tp, int tensor, const fa_ref_outputs *ref64,
                              const fa_ref_outputs *baseline) {
    fa_test_check check;
    memset(&check, 0, sizeof check);
    int buffer = tp->view[tensor].buffer;
    const double *ref = fa_ref_tensor(ref64, tensor);
    if (buffer < 0 || !ref) {
        check.ok = 0;
        check.nonfinite = -1;
        return check;
    }
    const fa_test_buffer *buf = &tp->buffer[buffer];
    compare_ctx ctx = {buf, tensor_dtype(tp, tensor), ref, baseline ? fa_ref_tensor(baseline, tensor) : NULL,
                       fa_ref_tensor_magnitude(ref64, tensor), &check, NULL,
                       tensor == FA_T_DQ ? ref64->dq_dnoise : tensor == FA_T_DK ? ref64->dk_dnoise : NULL};
    for_each_element(tp, tensor, compare_visit, &ctx);
    /* everything in this buffer outside every output view must still be poison */
    size_t elements = buf->bytes / buf->elem_size;
    ctx.logical = calloc(elements, 1);
    if (ctx.logical) {
        for (int t = 0; t < FA_T_COUNT; t++)
            if (tp->view[t].buffer == buffer) for_each_element(tp, t, mark_visit, &ctx);
        for (size_t i = 0; i < elements; i++)
            if (!ctx.logical[i] && !is_poison(buf, ctx.dtype, (int64_t)i)) check.clobbered++;
        free(ctx.logical);
    } else {
        check.clobbered = -1;
    }
    check_finish(&check, tensor == FA_T_LSE ? FA_DTYPE_F32 : tp->spec.dtype);
    return check;
}

double fa_test_fp8_score_noise(int64_t head_dim, double term_max) {
    const int64_t steps = (head_dim + 31) / 32 + (head_dim != 64 && head_dim != 128 && head_dim != 256);
    return (double)steps * ldexp(term_max, -13);
}

void fa_test_check_widen(fa_test_check *c, double extra) {
    c->floor += extra;
    c->tol += extra;
    check_judge(c);
}

typedef struct diff_ctx {
    const void *a, *b;
    fa_dtype dtype;
    double max_diff;
} diff_ctx;

static void diff_visit(void *ctx_, int64_t at, int64_t canonical) {
    diff_ctx *ctx = ctx_;
    (void)canonical;
    double x = fa_test_load(ctx->a, ctx->dtype, at), y = fa_test_load(ctx->b, ctx->dtype, at);
    if (x == y) return; /* also equal infinities */
    double d = fabs(x - y);
    if (isnan(d)) d = INFINITY;
    if (d > ctx->max_diff) ctx->max_diff = d;
}

double fa_test_max_diff(const fa_test_problem *tp, int tensor, const void *a_host,
                        const void *b_host) {
    diff_ctx ctx = {a_host, b_host, tensor_dtype(tp, tensor), 0.0};
    for_each_element(tp, tensor, diff_visit, &ctx);
    return ctx.max_diff;
}

/* ---- score modifications ------------------------------------------------------------------- */

static void *mods_alloc(fa_test_mods *m, int which, size_t bytes) {
    m->bytes[which] = bytes;
    m->array[which] = calloc(bytes, 1);
    return m->array[which];
}

void fa_test_mods_free(fa_test_mods *m) {
    for (int w = 0; w < FA_TEST_MOD_COUNT; w++) free(m->array[w]);
    memset(m, 0, sizeof *m);
}

int fa_test_mods_make(fa_test_mods *m, fa_params *p, const fa_test_mods_spec *ms, const fa_test_mods_odds *odds,
                      fa_test_rng *rng) {
    memset(m, 0, sizeof *m);
    fa_params out = *p; /* attached to p only when every array was allocated */
    const int64_t B = p->batch, H = p->heads_q, sq = p->seqlen_q, sk = p->seqlen_k;
    if (ms->bias != FA_TEST_BIAS_NONE) {
        int64_t nb = B, nh = H, ni = sq, nj = sk;
        if (ms->bias == FA_TEST_BIAS_HEAD) nb = 1;
        if (ms->bias == FA_TEST_BIAS_KEYPAD) nh = ni = 1;
        if (ms->bias == FA_TEST_BIAS_ROW) nj = 1;
        /* padded strides: spare elements after each key row; half the problems keep every stride
         * even (the kernels' paired 16-bit loads), the others have odd ones */
        const int even = fa_test_rng_uniform(rng) < 0.5;
        const int64_t cs = nj > 1 ? 1 : 0, rs = nj + (even ? 2 - nj % 2 : 1), hs = rs * ni + (even ? 2 : 1),
                      bs = hs * nh + (even ? 4 : 3);
        const size_t elem = fa_test_dtype_size(ms->bias_dtype);
        const int64_t count = bs * nb + 8;
        void *bias = mods_alloc(m, FA_TEST_MOD_BIAS, (size_t)count * elem);
        if (!bias) goto oom;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t i = 0; i < ni; i++) {
                    const int dead_row = ms->neg_inf_rows && fa_test_rng_uniform(rng) < 0.15;
                    for (int64_t j = 0; j < nj; j++) {
                        double x = 1.5 * fa_test_rng_normal(rng);
                        if (ms->bias == FA_TEST_BIAS_KEYPAD) x = fa_test_rng_uniform(rng) < 0.3 ? -INFINITY : 0.0;
                        if (ms->neg_inf_rows && (dead_row || fa_test_rng_uniform(rng) < 0.1)) x = -INFINITY;
                        fa_test_store(bias, ms->bias_dtype, b * bs + h * hs + i * rs + j * cs, x);
                    }
                }
        out.bias = bias;
        out.bias_dtype = ms->bias_dtype;
        out.bias_batch_stride = nb > 1 ? bs : 0;
        out.bias_head_stride = nh > 1 ? hs : 0;
        out.bias_row_stride = ni > 1 ? rs : 0;
        out.bias_col_stride = cs;
        if (ms->dbias) {
            void *dbias = mods_alloc(m, FA_TEST_MOD_DBIAS, fa_test_dtype_size(ms->dbias_dtype) * (size_t)count);
            if (!dbias) goto oom;
            for (int64_t e = 0; e < count; e++) fa_test_store(dbias, ms->dbias_dtype, e, NAN); /* poison */
            out.dbias = dbias;
            out.dbias_dtype = ms->dbias_dtype;
            out.dbias_batch_stride = out.bias_batch_stride;
            out.dbias_head_stride = out.bias_head_stride;
            out.dbias_row_stride = out.bias_row_stride;
            out.dbias_col_stride = out.bias_col_stride;
        }
    }
    if (ms->blocks) {
        const int64_t bq = ms->block_q, bk = ms->block_k;
        const int64_t QB = (sq + bq - 1) / bq, KB = (sk + bk - 1) / bk;
        const int64_t nb = ms->broadcast_blocks ? 1 : B, nh = ms->broadcast_blocks ? 1 : H;
        const int64_t rs = KB + 1, hs = QB * rs + 1, bs = nh * hs; /* padded index rows */
        const int64_t cbs = nh * QB, chs = QB;
        const size_t n_index = (size_t)(nb * bs + 1), n_count = (size_t)(nb * cbs + 1);
        int32_t *counts = mods_alloc(m, FA_TEST_MOD_COUNTS, n_count * sizeof(int32_t));
        int32_t *full_counts = mods_alloc(m, FA_TEST_MOD_FULL_COUNTS, n_count * sizeof(int32_t));
        int32_t *indices = mods_alloc(m, FA_TEST_MOD_INDICES, n_index * sizeof(int32_t));
        int32_t *full = mods_alloc(m, FA_TEST_MOD_FULL_INDICES, n_index * sizeof(int32_t));
        if (!counts || !full_counts || !indices || !full) goto oom;
        for (size_t e = 0; e < n_index; e++) indices[e] = full[e] = -7; /* never read */
        const int64_t block_bytes = (bq * bk + 7) / 8;
        uint8_t *bits = NULL;
        if (ms->bits) {
            bits = mods_alloc(m, FA_TEST_MOD_BITS, n_index * (size_t)block_bytes);
            if (!bits) goto oom;
            for (size_t e = 0; e < n_index * (size_t)block_bytes; e++)
                bits[e] = (uint8_t)(fa_test_rng_next(rng) | fa_test_rng_next(rng)); /* ~3/4 ones */
        }
        for (int64_t b = 0; b < nb; b++)
            for (int64_t h = 0; h < nh; h++)
                for (int64_t qb = 0; qb < QB; qb++) {
                    const int64_t at = b * bs + h * hs + qb * rs;
                    const int empty = fa_test_rng_uniform(rng) < odds->empty_row;
                    int32_t n_part = 0, n_full = 0;
                    for (int64_t kb = 0; kb < KB && !empty; kb++) {
                        const double u = fa_test_rng_uniform(rng);
                        if (u < odds->partial) indices[at + n_part++] = (int32_t)kb;
                        else if (u < odds->partial_or_full) full[at + n_full++] = (int32_t)kb;
                    }
                    counts[b * cbs + h * chs + qb] = n_part;
                    full_counts[b * cbs + h * chs + qb] = n_full;
                }
        out.block_q = bq;
        out.block_k = bk;
        out.kv_num_blocks = counts;
        out.kv_indices = indices;
        out.full_kv_num_blocks = full_counts;
        out.full_kv_indices = full;
        out.block_count_batch_stride = nb > 1 ? cbs : 0;
        out.block_count_head_stride = nh > 1 ? chs : 0;
        out.block_index_batch_stride = nb > 1 ? bs : 0;
        out.block_index_head_stride = nh > 1 ? hs : 0;
        out.block_index_row_stride = rs;
        out.partial_block_bits = bits;
    }
    if (ms->docs) {
        const int varlen = p->cu_seqlens_q != NULL;
        const int64_t nq = varlen ? p->total_q : B * sq, nk = varlen ? p->total_k : B * sk;
        int32_t *doc_q = mods_alloc(m, FA_TEST_MOD_DOC_Q, sizeof(int32_t) * (size_t)(nq + 1));
        int32_t *doc_k = mods_alloc(m, FA_TEST_MOD_DOC_K, sizeof(int32_t) * (size_t)(nk + 1));
        if (!doc_q || !doc_k) goto oom;
        /* a few documents per sequence, boundaries at random; keys' documents follow the same
         * proportions so that most queries have keys of their document */
        int32_t doc = 0;
        for (int64_t t = 0; t < nq; t++) {
            if (fa_test_rng_uniform(rng) < odds->new_document) doc++;
            doc_q[t] = doc % 4;
        }
        for (int64_t t = 0; t < nk; t++) doc_k[t] = nq > 0 ? doc_q[t * nq / (nk > 0 ? nk : 1)] : 0;
        out.doc_ids_q = doc_q;
        out.doc_ids_k = doc_k;
        out.doc_ids_q_batch_stride = varlen ? 0 : sq;
        out.doc_ids_k_batch_stride = varlen ? 0 : sk;
    }
    *p = out;
    return 0;
oom:
    fa_test_mods_free(m);
    return -1;
}

/* ==== KV-cache decoding and state merging ================================================== */

/* Value written into cache slots no sequence attends (alternating sign): a kernel that reads
 * the wrong slot gets scores far off, while a kernel that loads such a slot and masks it (P = 0)
 * is not disturbed (the value is finite). */
#define KV_GARBAGE 300.0

/* Strides of a [n0, n1, n2, dim] tensor, dense or with random padding; returns the elements
 * its buffer needs. */
static int64_t kv_strides(int64_t n0, int64_t n1, int64_t n2, int64_t dim, int padded, int64_t align,
                          fa_test_rng *rng, int64_t *s0, int64_t *s1, int64_t *s2) {
    *s2 = dim + (padded ? align * fa_test_rng_int(rng, 0, 2) : 0);
    *s1 = n2 * *s2 + (padded ? align * fa_test_rng_int(rng, 0, 3) : 0);
    *s0 = n1 * *s1 + (padded ? align * fa_test_rng_int(rng, 0, 5) : 0);
    if (n0 < 1 || n1 < 1 || n2 < 1) return 1;
    return (n0 - 1) * *s0 + (n1 - 1) * *s1 + (n2 - 1) * *s2 + dim;
}

static void kv_shuffle(int32_t *values, int64_t n, fa_test_rng *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = fa_test_rng_int(rng, 0, i);
        int32_t t = values[i];
        values[i] = values[j];
        values[j] = t;
    }
}

/* Physical element offset of (sequence b, slot, kv head, element c) of cache k (v: is_v). */
static int64_t kv_cache_index(const fa_kv_problem *kp, int64_t b, int64_t slot, int64_t h, int64_t c,
                              int is_v) {
    const fa_params *p = &kp->params;
    int64_t bs = is_v ? p->v_batch_stride : p->k_batch_stride;
    int64_t rs = is_v ? p->v_row_stride : p->k_row_stride;
    int64_t hs = is_v ? p->v_head_stride : p->k_head_stride;
    if (kp->spec.page_size > 0) {
        const int32_t *table = kp->buffer[FA_KV_BLOCK_TABLE].host;
        int64_t page = table[b * p->block_table_batch_stride + slot / kp->spec.page_size];
        return page * bs + (slot % kp->spec.page_size) * rs + h * hs + c;
    }
    int64_t row = kp->spec.batch_idx ? ((const int32_t *)kp->buffer[FA_KV_BATCH_IDX].host)[b] : b;
    return row * bs + slot * rs + h * hs + c;
}

static int kv_has_mask(const fa_kv_spec *s) {
    return s->causal || (s->use_window && (s->window_left >= 0 || s->window_right >= 0));
}

/* Rotary angle tables: cos/sin[pos][r] = cos/sin(pos · 10000^(-2r/rotary_dim)). */
static void kv_fill_rotary(fa_kv_problem *kp, int64_t rows) {
    const int64_t half = kp->spec.rotary_dim / 2;
    for (int64_t pos = 0; pos < rows; pos++)
        for (int64_t r = 0; r < half; r++) {
            double angle = (double)pos * pow(10000.0, -2.0 * (double)r / (double)kp->spec.rotary_dim);
            fa_test_store(kp->buffer[FA_KV_COS].host, kp->spec.dtype, pos * half + r, cos(angle));
            fa_test_store(kp->buffer[FA_KV_SIN].host, kp->spec.dtype, pos * half + r, sin(angle));
        }
}

static fa_params kv_params(const fa_kv_problem *kp, int on_device) {
    fa_params p = kp->params;
#define KV_PTR(index) (kp->buffer[index].host ? (on_device ? kp->buffer[index].device : kp->buffer[index].host) : NULL)
    p.q = KV_PTR(FA_KV_Q);
    p.k = KV_PTR(FA_KV_KCACHE);
    p.v = KV_PTR(FA_KV_VCACHE);
    p.k_new = KV_PTR(FA_KV_KNEW);
    p.v_new = KV_PTR(FA_KV_VNEW);
    p.o = KV_PTR(FA_KV_O);
    p.lse = kp->spec.no_lse ? NULL : KV_PTR(FA_KV_LSE);
    p.rotary_cos = KV_PTR(FA_KV_COS);
    p.rotary_sin = KV_PTR(FA_KV_SIN);
    p.alibi_slopes = KV_PTR(FA_KV_ALIBI);
    p.sink_logits = KV_PTR(FA_KV_SINK);
    p.cache_seqlens = kp->spec.no_seqlens ? NULL : KV_PTR(FA_KV_SEQLENS);
    p.cache_batch_idx = KV_PTR(FA_KV_BATCH_IDX);
    p.cache_leftpad = KV_PTR(FA_KV_LEFTPAD);
    p.block_table = KV_PTR(FA_KV_BLOCK_TABLE);
#undef KV_PTR
    return p;
}

fa_params fa_kv_problem_device_params(const fa_kv_problem *kp) { return kv_params(kp, 1); }

#define KV_ALLOC(index, elements, elem_size, out)                                                 \
    do {                                                                                          \
        if (alloc_buffer(&kp->buffer[index], (elements), (elem_size), (out))) return -1;          \
    } while (0)

/* The strided tensors (q, o, the caches, k_new / v_new) and lse: strides, buffers, poison. */
static int kv_tensors(fa_kv_problem *kp, int64_t slabs, int64_t slab_rows, fa_test_rng *layout_rng) {
    const fa_kv_spec *s = &kp->spec;
    fa_params *p = &kp->params;
    const int64_t b = s->batch;
    const int64_t sq = s->seqlen_q;
    const int64_t hq = s->heads_q;
    const int64_t hkv = s->heads_kv;
    const int64_t sn = s->seqlen_new;
    const int64_t d = s->head_dim;
    const int64_t dv = s->head_dim_v;
    const int64_t align = s->pad_align;
    const size_t es = fa_test_dtype_size(s->dtype);
    /* strided tensors */
    int64_t n;
    n = kv_strides(b, sq, hq, d, s->padded, align, layout_rng, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
    KV_ALLOC(FA_KV_Q, n, es, 0);
    n = kv_strides(b, sq, hq, dv, s->padded, align, layout_rng, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
    KV_ALLOC(FA_KV_O, n, es, 1);
    n = kv_strides(slabs, slab_rows, hkv, d, s->padded, align, layout_rng, &p->k_batch_stride, &p->k_row_stride,
                   &p->k_head_stride);
    KV_ALLOC(FA_KV_KCACHE, n, es, s->append);
    n = kv_strides(slabs, slab_rows, hkv, dv, s->padded, align, layout_rng, &p->v_batch_stride, &p->v_row_stride,
                   &p->v_head_stride);
    KV_ALLOC(FA_KV_VCACHE, n, es, s->append);
    if (s->append) {
        n = kv_strides(b, sn, hkv, d, s->padded, align, layout_rng, &p->knew_batch_stride, &p->knew_row_stride,
                       &p->knew_head_stride);
        KV_ALLOC(FA_KV_KNEW, n, es, 0);
        n = kv_strides(b, sn, hkv, dv, s->padded, align, layout_rng, &p->vnew_batch_stride, &p->vnew_row_stride,
                       &p->vnew_head_stride);
        KV_ALLOC(FA_KV_VNEW, n, es, 0);
    }
    KV_ALLOC(FA_KV_LSE, b * hq * sq + 3, 4, 1); /* 3 slack elements must stay poison        */
    poison_buffer(&kp->buffer[FA_KV_O], s->dtype);
    poison_buffer(&kp->buffer[FA_KV_LSE], FA_DTYPE_F32);

    return 0;
}

/* The int32 tables: cache_seqlens, cache_leftpad, cache_batch_idx, block_table (pages a call reads get real ids, the others ids no call may use). */
static int kv_tables(fa_kv_problem *kp, int64_t slabs, int64_t pages_per_seq, fa_test_rng *layout_rng) {
    const fa_kv_spec *s = &kp->spec;
    fa_params *p = &kp->params;
    const int64_t b = s->batch;
    const int64_t appended = s->seqlen_new;
    /* int32 tables */
    KV_ALLOC(FA_KV_SEQLENS, b, 4, 0);
    memcpy(kp->buffer[FA_KV_SEQLENS].host, kp->cached, (size_t)b * 4);
    if (s->leftpad) {
        KV_ALLOC(FA_KV_LEFTPAD, b, 4, 0);
        memcpy(kp->buffer[FA_KV_LEFTPAD].host, kp->start, (size_t)b * 4);
    }
    if (s->batch_idx) {
        int32_t rows[FA_TEST_MAX_BATCH + 2];
        for (int64_t i = 0; i < slabs; i++) rows[i] = (int32_t)i;
        kv_shuffle(rows, slabs, layout_rng);
        KV_ALLOC(FA_KV_BATCH_IDX, b, 4, 0);
        memcpy(kp->buffer[FA_KV_BATCH_IDX].host, rows, (size_t)b * 4);
    }
    if (s->page_size > 0) {
        p->block_table_batch_stride = pages_per_seq + (s->padded ? fa_test_rng_int(layout_rng, 0, 2) : 0);
        KV_ALLOC(FA_KV_BLOCK_TABLE, b * p->block_table_batch_stride, 4, 0);
        int32_t *table = kp->buffer[FA_KV_BLOCK_TABLE].host;
        int32_t *pages = malloc(sizeof(int32_t) * (size_t)slabs);
        if (!pages) return -1;
        for (int64_t i = 0; i < slabs; i++) pages[i] = (int32_t)i;
        kv_shuffle(pages, slabs, layout_rng);
        for (int64_t i = 0; i < b; i++) {
            int64_t first = kp->start[i] / s->page_size;
            int64_t end = (kp->cached[i] + appended + s->page_size - 1) / s->page_size;
            for (int64_t j = 0; j < p->block_table_batch_stride; j++) {
                int64_t at = i * p->block_table_batch_stride + j;
                /* pages a call reads get real ids; the others ids no call may use */
                if (j >= first && j < end) table[at] = pages[i * pages_per_seq + j];
                else table[at] = j % 2 ? -1 : (int32_t)(slabs + j);
            }
        }
        free(pages);
        p->page_size = s->page_size;
        p->num_pages = slabs;
    }

    return 0;
}

/* The cache contents (garbage everywhere, real values in the attended and written slots), then q and the new keys and values, in canonical order. */
static int kv_values(fa_kv_problem *kp, fa_test_rng *value_rng) {
    const fa_kv_spec *s = &kp->spec;
    fa_params *p = &kp->params;
    const int64_t b = s->batch;
    const int64_t sq = s->seqlen_q;
    const int64_t hq = s->heads_q;
    const int64_t hkv = s->heads_kv;
    const int64_t sn = s->seqlen_new;
    const int64_t d = s->head_dim;
    const int64_t dv = s->head_dim_v;
    const int64_t appended = s->seqlen_new;
    const size_t es = fa_test_dtype_size(s->dtype);
    /* cache contents: garbage everywhere, real values in the attended and written slots */
    for (int is_v = 0; is_v < 2; is_v++) {
        fa_test_buffer *buf = &kp->buffer[is_v ? FA_KV_VCACHE : FA_KV_KCACHE];
        for (size_t e = 0; e < buf->bytes / es; e++)
            fa_test_store(buf->host, s->dtype, (int64_t)e, e % 2 ? KV_GARBAGE : -KV_GARBAGE);
    }
    /* (the parameters kv_cache_index reads are set first) */
    for (int64_t i = 0; i < b; i++)
        for (int64_t slot = kp->start[i]; slot < kp->cached[i] + appended; slot++)
            for (int64_t h = 0; h < hkv; h++) {
                for (int64_t c = 0; c < d; c++)
                    fa_test_store(kp->buffer[FA_KV_KCACHE].host, s->dtype, kv_cache_index(kp, i, slot, h, c, 0),
                                  fa_test_rng_normal(value_rng));
                for (int64_t c = 0; c < dv; c++)
                    fa_test_store(kp->buffer[FA_KV_VCACHE].host, s->dtype, kv_cache_index(kp, i, slot, h, c, 1),
                                  fa_test_rng_normal(value_rng) + 0.5);
            }

    /* q, new keys and values (canonical order) */
    for (int64_t i = 0; i < b; i++)
        for (int64_t t = 0; t < sq; t++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t c = 0; c < d; c++)
                    fa_test_store(kp->buffer[FA_KV_Q].host, s->dtype,
                                  i * p->q_batch_stride + t * p->q_row_stride + h * p->q_head_stride + c,
                                  s->q_amplitude * fa_test_rng_normal(value_rng));
    if (s->append)
        for (int64_t i = 0; i < b; i++)
            for (int64_t t = 0; t < sn; t++)
                for (int64_t h = 0; h < hkv; h++) {
                    for (int64_t c = 0; c < d; c++)
                        fa_test_store(kp->buffer[FA_KV_KNEW].host, s->dtype,
                                      i * p->knew_batch_stride + t * p->knew_row_stride + h * p->knew_head_stride + c,
                                      fa_test_rng_normal(value_rng));
                    for (int64_t c = 0; c < dv; c++)
                        fa_test_store(kp->buffer[FA_KV_VNEW].host, s->dtype,
                                      i * p->vnew_batch_stride + t * p->vnew_row_stride + h * p->vnew_head_stride + c,
                                      fa_test_rng_normal(value_rng) + 0.5);
                }
    return 0;
}

/* Rotary tables, ALiBi slopes and sink logits when the spec asks for them. */
static int kv_extras(fa_kv_problem *kp, fa_test_rng *layout_rng, fa_test_rng *value_rng) {
    const fa_kv_spec *s = &kp->spec;
    fa_params *p = &kp->params;
    const int64_t b = s->batch;
    const int64_t sq = s->seqlen_q;
    const int64_t hq = s->heads_q;
    const int64_t sn = s->seqlen_new;
    const size_t es = fa_test_dtype_size(s->dtype);
    if (s->rotary_dim) {
        p->rotary_dim = s->rotary_dim;
        /* queries rotate at L0 + i, up to capacity - seqlen_new + seqlen_q - 1 */
        p->rotary_seqlen = s->capacity + (sq > sn ? sq - sn : 0) + fa_test_rng_int(layout_rng, 0, 3);
        p->rotary_interleaved = s->rotary_interleaved;
        KV_ALLOC(FA_KV_COS, p->rotary_seqlen * (s->rotary_dim / 2), es, 0);
        KV_ALLOC(FA_KV_SIN, p->rotary_seqlen * (s->rotary_dim / 2), es, 0);
        kv_fill_rotary(kp, p->rotary_seqlen);
    }
    if (s->alibi != FA_TEST_ALIBI_NONE) { /* slopes in [0.01, 0.3) */
        p->alibi_batch_stride = s->alibi == FA_TEST_ALIBI_BATCH_HEAD ? hq + fa_test_rng_int(layout_rng, 0, 3) : 0;
        int64_t batches = s->alibi == FA_TEST_ALIBI_BATCH_HEAD ? b : 1;
        KV_ALLOC(FA_KV_ALIBI, (batches - 1) * p->alibi_batch_stride + hq, 4, 0);
        float *slopes = kp->buffer[FA_KV_ALIBI].host;
        for (int64_t i = 0; i < batches; i++)
            for (int64_t h = 0; h < hq; h++)
                slopes[i * p->alibi_batch_stride + h] = (float)(0.01 + 0.29 * fa_test_rng_uniform(value_rng));
    }
    if (s->sinks) {
        KV_ALLOC(FA_KV_SINK, hq, 4, 0);
        float *sinks = kp->buffer[FA_KV_SINK].host;
        double typical = log((double)(s->capacity > 1 ? s->capacity : 1));
        for (int64_t h = 0; h < hq; h++) sinks[h] = (float)(0.75 * typical + fa_test_rng_normal(value_rng));
    }
    return 0;
}

#undef KV_ALLOC

int fa_kv_problem_create(fa_kv_problem *kp, const fa_kv_spec *spec) {
    memset(kp, 0, sizeof *kp);
    kp->spec = *spec;
    fa_kv_spec *s = &kp->spec;
    if (s->head_dim_v == 0) s->head_dim_v = s->head_dim;
    if (s->pad_align <= 0) s->pad_align = 1;
    if (s->q_amplitude <= 0) s->q_amplitude = 1.0;
    if (s->append && s->seqlen_new == 0) s->seqlen_new = s->seqlen_q;
    if (!s->append) s->seqlen_new = 0;
    const int64_t appended = s->seqlen_new;
    if (s->batch < 1 || s->batch > FA_TEST_MAX_BATCH || s->seqlen_q < 1 || s->heads_kv < 1 ||
        s->heads_q % s->heads_kv || s->head_dim < 1 || s->head_dim > FA_MAX_HEAD_DIM ||
        s->head_dim_v > FA_MAX_HEAD_DIM || s->capacity < appended || s->page_size < 0 ||
        (s->rotary_dim && (!s->append || s->rotary_dim % 2 || s->rotary_dim > s->head_dim)) ||
        (s->no_seqlens && s->append) || (s->batch_idx && s->page_size) || s->seqlen_new < 0)
        return -1;
    fa_test_rng len_rng, layout_rng, value_rng;
    fa_test_rng_seed(&len_rng, stream_seed(s->seed, 11));
    fa_test_rng_seed(&layout_rng, stream_seed(s->seed, 12));
    fa_test_rng_seed(&value_rng, stream_seed(s->seed, 13));
    const int64_t b = s->batch, sq = s->seqlen_q, hq = s->heads_q, hkv = s->heads_kv, sn = s->seqlen_new;
    const int64_t d = s->head_dim, dv = s->head_dim_v;
    fa_params *p = &kp->params;

    /* cache lengths and left padding: one sequence full, some empty, the rest random */
    int64_t longest = fa_test_rng_int(&len_rng, 0, b - 1);
    for (int64_t i = 0; i < b; i++) {
        int64_t most = s->capacity - appended, len;
        double u = fa_test_rng_uniform(&len_rng);
        len = s->no_seqlens || s->full || i == longest ? most : u < 0.15 ? 0 : fa_test_rng_int(&len_rng, 0, most);
        kp->cached[i] = (int32_t)len;
        kp->start[i] = s->leftpad ? (int32_t)(fa_test_rng_uniform(&len_rng) < 0.2 ? 0 : fa_test_rng_int(&len_rng, 0, len)) : 0;
    }

    /* geometry of the cache */
    int64_t slabs, slab_rows, pages_per_seq = 0;
    if (s->page_size > 0) {
        pages_per_seq = (s->capacity + s->page_size - 1) / s->page_size;
        slabs = b * pages_per_seq + fa_test_rng_int(&layout_rng, 1, 3);
        slab_rows = s->page_size;
    } else {
        slabs = s->batch_idx ? b + 2 : b;
        slab_rows = s->capacity;
    }
    kp->cache_rows = slabs;

    if (kv_tensors(kp, slabs, slab_rows, &layout_rng) || kv_tables(kp, slabs, pages_per_seq, &layout_rng) ||
        kv_values(kp, &value_rng) || kv_extras(kp, &layout_rng, &value_rng))
        goto fail;
    for (int i = 0; i < FA_KV_BUFFER_COUNT; i++) {
        fa_test_buffer *buf = &kp->buffer[i];
        if (!buf->host || i == FA_KV_O || i == FA_KV_LSE) continue;
        buf->saved = malloc(buf->bytes);
        if (!buf->saved) goto fail;
        memcpy(buf->saved, buf->host, buf->bytes);
    }

    p->device = FA_DEVICE_CPU;
    p->dtype = s->dtype;
    p->batch = b;
    p->seqlen_q = sq;
    p->seqlen_k = s->capacity;
    p->seqlen_new = sn == sq ? (fa_test_rng_uniform(&layout_rng) < 0.5 ? 0 : sn) : sn; /* 0 = seqlen_q */
    p->heads_q = hq;
    p->heads_kv = hkv;
    p->head_dim = d;
    p->head_dim_v = dv;
    p->cache_batch = s->page_size > 0 ? 0 : slabs;
    p->softmax_scale = s->softmax_scale;
    p->causal = s->causal;
    p->use_window = s->use_window;
    p->window_left = s->window_left;
    p->window_right = s->window_right;
    p->softcap = s->softcap;
    p->num_splits = s->num_splits;
    *p = kv_params(kp, 0);
    return 0;
fail:
    fa_kv_problem_destroy(kp);
    return -1;
}

void fa_kv_problem_destroy(fa_kv_problem *kp) {
    for (int i = 0; i < FA_KV_BUFFER_COUNT; i++) {
        free(kp->buffer[i].host);
        free(kp->buffer[i].saved);
        kp->buffer[i].host = NULL;
        kp->buffer[i].saved = NULL;
    }
}

void fa_kv_problem_reset(fa_kv_problem *kp) {
    for (int i = FA_KV_KCACHE; i <= FA_KV_VCACHE; i++)
        memcpy(kp->buffer[i].host, kp->buffer[i].saved, kp->buffer[i].bytes);
    poison_buffer(&kp->buffer[FA_KV_O], kp->spec.dtype);
    poison_buffer(&kp->buffer[FA_KV_LSE], FA_DTYPE_F32);
}

void fa_kv_describe(const fa_kv_spec *s, char *buf, size_t size) {
    size_t used = 0;
#define APPEND(...)                                                                          \
    do {                                                                                     \
        if (used < size) used += (size_t)snprintf(buf + used, size - used, __VA_ARGS__);     \
    } while (0)
    APPEND("%-4s b=%lld sq=%lld hq=%lld hkv=%lld d=%lld dv=%lld cap=%lld", fa_test_dtype_name(s->dtype),
           (long long)s->batch, (long long)s->seqlen_q, (long long)s->heads_q, (long long)s->heads_kv,
           (long long)s->head_dim, (long long)(s->head_dim_v ? s->head_dim_v : s->head_dim),
           (long long)s->capacity);
    if (s->page_size) APPEND(" paged(%lld)", (long long)s->page_size);
    if (s->batch_idx) APPEND(" batch_idx");
    if (s->no_seqlens) APPEND(" no-seqlens");
    if (s->leftpad) APPEND(" leftpad");
    if (s->append) APPEND(" append");
    if (s->append && s->seqlen_new && s->seqlen_new != s->seqlen_q) APPEND("(%lld)", (long long)s->seqlen_new);
    if (s->rotary_dim) APPEND(" rotary(%lld,%s)", (long long)s->rotary_dim, s->rotary_interleaved ? "i" : "h");
    if (s->causal) APPEND(" causal");
    if (s->use_window) APPEND(" window(%d,%d)", (int)s->window_left, (int)s->window_right);
    if (s->softcap > 0) APPEND(" softcap(%g)", (double)s->softcap);
    if (s->alibi) APPEND(" alibi(%s)", s->alibi == FA_TEST_ALIBI_HEAD ? "h" : "bh");
    if (s->sinks) APPEND(" sink");
    if (s->softmax_scale != 0) APPEND(" scale(%g)", (double)s->softmax_scale);
    if (s->num_splits) APPEND(" splits=%d", s->num_splits);
    if (s->no_lse) APPEND(" no-lse");
    if (s->padded) APPEND(" padded");
#undef APPEND
}

/* Rotate x (rotary_dim leading elements) by the tables at `pos`: in double when exact, else in
 * fp32 with the spec's operation order (x_a cos - x_b sin, x_a sin + x_b cos) and rounded to the
 * dtype. */
static void kv_rotate(const fa_kv_problem *kp, double *x, int64_t pos, int exact) {
    const fa_kv_spec *s = &kp->spec;
    const int64_t half = s->rotary_dim / 2;
    for (int64_t r = 0; r < half; r++) {
        int64_t ia = s->rotary_interleaved ? 2 * r : r, ib = s->rotary_interleaved ? 2 * r + 1 : r + half;
        double c = fa_test_load(kp->buffer[FA_KV_COS].host, s->dtype, pos * half + r);
        double sn = fa_test_load(kp->buffer[FA_KV_SIN].host, s->dtype, pos * half + r);
        double xa = x[ia], xb = x[ib];
        if (exact) {
            x[ia] = xa * c - xb * sn;
            x[ib] = xa * sn + xb * c;
        } else {
            float fa = (float)xa, fb = (float)xb, fc = (float)c, fs = (float)sn;
            float p1 = fa * fc, p2 = fb * fs, p3 = fa * fs, p4 = fb * fc;
            x[ia] = fa_test_round_to(s->dtype, p1 - p2);
            x[ib] = fa_test_round_to(s->dtype, p3 + p4);
        }
    }
    if (!exact)
        for (int64_t c = 2 * half; c < s->head_dim; c++) x[c] = fa_test_round_to(s->dtype, (float)x[c]);
}

/* One unit in the last place of `dtype` at magnitude |x| (the spacing of representable values). */
static double kv_ulp(fa_dtype dtype, double x) {
    int exponent;
    frexp(fabs(x) > 1e-30 ? fabs(x) : 1e-30, &exponent);
    return ldexp(1.0, exponent - 1 - fa_test_mantissa_bits(dtype));
}

/* The appended slots: checks them (k within one dtype ulp of the fp32 rotation plus fp32 noise,
 * v bit-identical) and marks them in `written` (per cache element). */
static void kv_check_appended(const fa_kv_problem *kp, uint8_t *written_k, uint8_t *written_v,
                              fa_kv_check *out) {
    const fa_kv_spec *s = &kp->spec;
    const fa_params *p = &kp->params;
    const size_t es = fa_test_dtype_size(s->dtype);
    double row[FA_MAX_HEAD_DIM];
    for (int64_t b = 0; b < s->batch; b++)
        for (int64_t t = 0; t < s->seqlen_new; t++)
            for (int64_t h = 0; h < s->heads_kv; h++) {
                int64_t slot = kp->cached[b] + t;
                int64_t src = b * p->knew_batch_stride + t * p->knew_row_stride + h * p->knew_head_stride;
                for (int64_t c = 0; c < s->head_dim; c++) row[c] = fa_test_load(kp->buffer[FA_KV_KNEW].host, s->dtype, src + c);
                double exact[FA_MAX_HEAD_DIM];
                memcpy(exact, row, sizeof(double) * (size_t)s->head_dim);
                if (s->rotary_dim) {
                    kv_rotate(kp, row, slot, 0); /* flash_attn 2.x: the slot, left padding included */
                    kv_rotate(kp, exact, slot, 1);
                }
                for (int64_t c = 0; c < s->head_dim; c++) {
                    int64_t at = kv_cache_index(kp, b, slot, h, c, 0);
                    written_k[at] = 1;
                    double ours = fa_test_load(kp->buffer[FA_KV_KCACHE].host, s->dtype, at);
                    if (!s->rotary_dim) { /* a plain copy must be bit-identical */
                        out->cache_k_bad += memcmp((const char *)kp->buffer[FA_KV_KCACHE].host + at * (int64_t)es,
                                                   (const char *)kp->buffer[FA_KV_KNEW].host + (src + c) * (int64_t)es, es) != 0;
                        continue;
                    }
                    double slack = kv_ulp(s->dtype, row[c]) + 4.0 * kv_ulp(FA_DTYPE_F32, fabs(exact[c]) + 2.0);
                    if (!(fabs(ours - row[c]) <= slack)) out->cache_k_bad++;
                }
                int64_t vsrc = b * p->vnew_batch_stride + t * p->vnew_row_stride + h * p->vnew_head_stride;
                for (int64_t c = 0; c < s->head_dim_v; c++) {
                    int64_t at = kv_cache_index(kp, b, slot, h, c, 1);
                    written_v[at] = 1;
                    out->cache_v_bad += memcmp((const char *)kp->buffer[FA_KV_VCACHE].host + at * (int64_t)es,
                                               (const char *)kp->buffer[FA_KV_VNEW].host + (vsrc + c) * (int64_t)es, es) != 0;
                }
            }
}

/* Oracle inputs: canonical doubles (varlen layout, sequence b's keys are its attended slots). */
typedef struct kv_oracle {
    int32_t cu_q[FA_TEST_MAX_BATCH + 1], cu_k[FA_TEST_MAX_BATCH + 1];
    double *q64, *qb, *k64, *kb, *v, *slopes, *sinks;
    fa_ref_problem rp64, rpb;
} kv_oracle;

static void kv_oracle_free(kv_oracle *o) {
    free(o->q64);
    free(o->qb);
    free(o->k64);
    free(o->kb);
    free(o->v);
    free(o->slopes);
    free(o->sinks);
}

/* Build the oracle problem; the cache is read from its state before the call (saved) plus the
 * appended tokens (k exact / rounded rotation, v as given). */
static int kv_oracle_build(const fa_kv_problem *kp, kv_oracle *o) {
    const fa_kv_spec *s = &kp->spec;
    const fa_params *p = &kp->params;
    const int64_t b_n = s->batch, sq = s->seqlen_q, hq = s->heads_q, hkv = s->heads_kv;
    const int64_t d = s->head_dim, dv = s->head_dim_v, appended = s->seqlen_new;
    memset(o, 0, sizeof *o);
    int64_t max_k = 0;
    o->cu_q[0] = o->cu_k[0] = 0;
    for (int64_t b = 0; b < b_n; b++) {
        int64_t len_k = kp->cached[b] + appended - kp->start[b];
        o->cu_q[b + 1] = (int32_t)((b + 1) * sq);
        o->cu_k[b + 1] = (int32_t)(o->cu_k[b] + len_k);
        if (len_k > max_k) max_k = len_k;
    }
    int64_t rows_q = b_n * sq, rows_k = o->cu_k[b_n];
    o->q64 = calloc((size_t)(rows_q * hq * d) + 1, sizeof(double));
    o->qb = calloc((size_t)(rows_q * hq * d) + 1, sizeof(double));
    o->k64 = calloc((size_t)(rows_k * hkv * d) + 1, sizeof(double));
    o->kb = calloc((size_t)(rows_k * hkv * d) + 1, sizeof(double));
    o->v = calloc((size_t)(rows_k * hkv * dv) + 1, sizeof(double));
    if (!o->q64 || !o->qb || !o->k64 || !o->kb || !o->v) return -1;
    const int per_query = kv_has_mask(s);
    for (int64_t b = 0; b < b_n; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < hq; h++) {
                double *x64 = o->q64 + ((b * sq + i) * hq + h) * d, *xb = o->qb + ((b * sq + i) * hq + h) * d;
                for (int64_t c = 0; c < d; c++)
                    x64[c] = xb[c] = fa_test_load(kp->buffer[FA_KV_Q].host, s->dtype,
                                                  b * p->q_batch_stride + i * p->q_row_stride + h * p->q_head_stride + c);
                if (s->rotary_dim) {
                    int64_t pos = kp->cached[b] + (per_query ? i : 0);
                    kv_rotate(kp, x64, pos, 1);
                    kv_rotate(kp, xb, pos, 0);
                }
            }
    for (int64_t b = 0; b < b_n; b++)
        for (int64_t j = 0; j < o->cu_k[b + 1] - o->cu_k[b]; j++) {
            int64_t slot = kp->start[b] + j, row = o->cu_k[b] + j;
            for (int64_t h = 0; h < hkv; h++) {
                double *k64 = o->k64 + (row * hkv + h) * d, *kb = o->kb + (row * hkv + h) * d;
                double *v = o->v + (row * hkv + h) * dv;
                if (slot < kp->cached[b]) {
                    for (int64_t c = 0; c < d; c++)
                        k64[c] = kb[c] = fa_test_load(kp->buffer[FA_KV_KCACHE].saved, s->dtype, kv_cache_index(kp, b, slot, h, c, 0));
                    for (int64_t c = 0; c < dv; c++)
                        v[c] = fa_test_load(kp->buffer[FA_KV_VCACHE].saved, s->dtype, kv_cache_index(kp, b, slot, h, c, 1));
                    continue;
                }
                int64_t t = slot - kp->cached[b];
                for (int64_t c = 0; c < d; c++)
                    k64[c] = kb[c] = fa_test_load(kp->buffer[FA_KV_KNEW].host, s->dtype,
                                                  b * p->knew_batch_stride + t * p->knew_row_stride + h * p->knew_head_stride + c);
                for (int64_t c = 0; c < dv; c++)
                    v[c] = fa_test_load(kp->buffer[FA_KV_VNEW].host, s->dtype,
                                        b * p->vnew_batch_stride + t * p->vnew_row_stride + h * p->vnew_head_stride + c);
                if (s->rotary_dim) {
                    kv_rotate(kp, k64, slot, 1);
                    kv_rotate(kp, kb, slot, 0);
                }
            }
        }
    if (s->alibi != FA_TEST_ALIBI_NONE) {
        o->slopes = calloc((size_t)(b_n * hq), sizeof(double));
        if (!o->slopes) return -1;
        const float *slopes = kp->buffer[FA_KV_ALIBI].host;
        for (int64_t b = 0; b < b_n; b++)
            for (int64_t h = 0; h < hq; h++) o->slopes[b * hq + h] = slopes[b * p->alibi_batch_stride + h];
    }
    if (s->sinks) {
        o->sinks = calloc((size_t)hq, sizeof(double));
        if (!o->sinks) return -1;
        for (int64_t h = 0; h < hq; h++) o->sinks[h] = ((const float *)kp->buffer[FA_KV_SINK].host)[h];
    }
    fa_ref_problem *rp = &o->rp64;
    rp->batch = b_n;
    rp->seqlen_q = sq;
    rp->seqlen_k = max_k;
    rp->heads_q = hq;
    rp->heads_kv = hkv;
    rp->head_dim = d;
    rp->head_dim_v = dv;
    rp->cu_seqlens_q = o->cu_q;
    rp->cu_seqlens_k = o->cu_k;
    rp->rows_q = rows_q;
    rp->rows_k = rows_k;
    rp->scale = s->softmax_scale != 0.0f ? (double)s->softmax_scale : 1.0 / sqrt((double)d);
    rp->softcap = s->softcap;
    rp->window_left = s->use_window && s->window_left >= 0 ? s->window_left : -1;
    rp->window_right = s->use_window && s->window_right >= 0 ? s->window_right : -1;
    if (s->causal) rp->window_right = 0;
    rp->slopes = o->slopes;
    rp->sinks = o->sinks;
    rp->q = o->q64;
    rp->k = o->k64;
    rp->v = o->v;
    o->rpb = *rp;
    o->rpb.q = o->qb;
    o->rpb.k = o->kb;
    return 0;
}

fa_kv_check fa_kv_verify(const fa_kv_problem *kp) {
    const fa_kv_spec *s = &kp->spec;
    const fa_params *p = &kp->params;
    const int64_t b_n = s->batch, sq = s->seqlen_q, hq = s->heads_q, dv = s->head_dim_v;
    fa_kv_check out;
    memset(&out, 0, sizeof out);

    /* the cache: appended slots as specified, everything else bit-identical */
    const fa_test_buffer *kc = &kp->buffer[FA_KV_KCACHE], *vc = &kp->buffer[FA_KV_VCACHE];
    size_t es = fa_test_dtype_size(s->dtype);
    uint8_t *written_k = calloc(kc->bytes / es + 1, 1), *written_v = calloc(vc->bytes / es + 1, 1);
    if (!written_k || !written_v) {
        free(written_k);
        free(written_v);
        out.cache_clobbered = -1;
        return out;
    }
    if (s->append) kv_check_appended(kp, written_k, written_v, &out);
    for (size_t e = 0; e < kc->bytes / es; e++)
        if (!written_k[e] && memcmp((const char *)kc->host + e * es, (const char *)kc->saved + e * es, es))
            out.cache_clobbered++;
    for (size_t e = 0; e < vc->bytes / es; e++)
        if (!written_v[e] && memcmp((const char *)vc->host + e * es, (const char *)vc->saved + e * es, es))
            out.cache_clobbered++;
    free(written_k);
    free(written_v);

    /* other inputs */
    out.inputs_unchanged = 1;
    for (int i = 0; i < FA_KV_BUFFER_COUNT; i++) {
        const fa_test_buffer *buf = &kp->buffer[i];
        if (i == FA_KV_KCACHE || i == FA_KV_VCACHE || !buf->host || !buf->saved) continue;
        if (memcmp(buf->host, buf->saved, buf->bytes)) out.inputs_unchanged = 0;
    }

    /* attention against the oracle */
    kv_oracle o;
    fa_ref_outputs ref, base;
    if (kv_oracle_build(kp, &o) || fa_ref_outputs_alloc(&o.rp64, 0, &ref)) {
        kv_oracle_free(&o);
        out.o.nonfinite = -1;
        return out;
    }
    if (fa_ref_outputs_alloc(&o.rpb, 0, &base)) {
        fa_ref_outputs_free(&ref);
        kv_oracle_free(&o);
        out.o.nonfinite = -1;
        return out;
    }
    fa_ref64_run(&o.rp64, 0, &ref);
    fa_ref_baseline_run(&o.rpb, s->dtype, 0, &base);

    const fa_test_buffer *ob = &kp->buffer[FA_KV_O], *lb = &kp->buffer[FA_KV_LSE];
    uint8_t *logical = calloc(ob->bytes / es + 1, 1);
    const int64_t left = o.rp64.window_left, right = o.rp64.window_right;
    for (int64_t b = 0; b < b_n; b++) {
        int64_t len_k = o.cu_k[b + 1] - o.cu_k[b];
        for (int64_t i = 0; i < sq; i++) {
            int64_t diag = i + len_k - sq;
            int64_t lo = left >= 0 && diag - left > 0 ? diag - left : 0;
            int64_t hi = right >= 0 && diag + right + 1 < len_k ? diag + right + 1 : len_k;
            int sees_nothing = hi <= lo;
            for (int64_t h = 0; h < hq; h++) {
                int64_t canonical = (b * sq + i) * hq + h;
                for (int64_t c = 0; c < dv; c++) {
                    int64_t at = b * p->o_batch_stride + i * p->o_row_stride + h * p->o_head_stride + c;
                    fa_test_check *ck = &out.o;
                    ck->checked++;
                    if (logical) logical[at] = 1;
                    if (is_poison(ob, s->dtype, at)) {
                        ck->unwritten++;
                        continue;
                    }
                    double ours = fa_test_load(ob->host, s->dtype, at);
                    double r = ref.o[canonical * dv + c], bb = base.o[canonical * dv + c];
                    if (ref.o_mag[canonical * dv + c] > ck->term_max) ck->term_max = ref.o_mag[canonical * dv + c];
                    if (!isfinite(ours)) {
                        ck->nonfinite++;
                        continue;
                    }
                    if (sees_nothing && ours != 0.0) out.masked_violations++;
                    check_note(ck, ours, r, bb);
                }
                if (s->no_lse) continue;
                int64_t at = (b * hq + h) * sq + i, ref_at = h * o.rp64.rows_q + b * sq + i;
                fa_test_check *ck = &out.lse;
                ck->checked++;
                if (is_poison(lb, FA_DTYPE_F32, at)) {
                    ck->unwritten++;
                    continue;
                }
                double ours = ((const float *)lb->host)[at], r = ref.lse[ref_at], bb = base.lse[ref_at];
                if (ref.lse_mag[ref_at] > ck->term_max) ck->term_max = ref.lse_mag[ref_at];
                if (sees_nothing) {
                    double want = s->sinks ? ((const float *)kp->buffer[FA_KV_SINK].host)[h] : -INFINITY;
                    if (!(ours == want || fabs(ours - want) <= 4.0 * 1.1920929e-7 * fmax(1.0, fabs(want))))
                        out.masked_violations++;
                }
                if (!isfinite(r)) {
                    if (ours != r) ck->nonfinite++;
                    continue;
                }
                if (!isfinite(ours)) {
                    ck->nonfinite++;
                    continue;
                }
                check_note(ck, ours, r, bb);
            }
        }
    }
    /* padding of o and the slack after lse must still be poison */
    if (logical) {
        for (size_t e = 0; e < ob->bytes / es; e++)
            if (!logical[e] && !is_poison(ob, s->dtype, (int64_t)e)) out.o.clobbered++;
        free(logical);
    } else {
        out.o.clobbered = -1;
    }
    for (size_t e = (size_t)(b_n * hq * sq); e < lb->bytes / 4; e++)
        if (!is_poison(lb, FA_DTYPE_F32, (int64_t)e)) out.lse.clobbered++;
    if (s->no_lse)
        for (size_t e = 0; e < lb->bytes / 4; e++)
            if (!is_poison(lb, FA_DTYPE_F32, (int64_t)e)) out.lse.clobbered++;

    check_finish(&out.o, s->dtype);
    check_finish(&out.lse, FA_DTYPE_F32);
    out.ok = out.o.ok && out.lse.ok && out.masked_violations == 0 && out.cache_k_bad == 0 &&
             out.cache_v_bad == 0 && out.cache_clobbered == 0 && out.inputs_unchanged;
    fa_ref_outputs_free(&ref);
    fa_ref_outputs_free(&base);
    kv_oracle_free(&o);
    return out;
}

int fa_kv_untouched(const fa_kv_problem *kp) {
    for (int i = 0; i < FA_KV_BUFFER_COUNT; i++) {
        const fa_test_buffer *buf = &kp->buffer[i];
        if (!buf->host) continue;
        if (i == FA_KV_O || i == FA_KV_LSE) {
            fa_dtype dtype = i == FA_KV_O ? kp->spec.dtype : FA_DTYPE_F32;
            for (size_t e = 0; e < buf->bytes / buf->elem_size; e++)
                if (!is_poison(buf, dtype, (int64_t)e)) return 0;
        } else if (buf->saved && memcmp(buf->host, buf->saved, buf->bytes)) {
            return 0;
        }
    }
    return 1;
}

void fa_kv_format(const fa_kv_check *c, char *buf, size_t size) {
    int n = snprintf(buf, size, " o %.2e/%.2e", c->o.err, c->o.tol);
    if (!c->o.ok && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, "[unwritten=%lld clobbered=%lld nonfinite=%lld]",
                      (long long)c->o.unwritten, (long long)c->o.clobbered, (long long)c->o.nonfinite);
    if (c->lse.checked && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " lse %.2e/%.2e", c->lse.err, c->lse.tol);
    if (!c->lse.ok && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, "[unwritten=%lld clobbered=%lld nonfinite=%lld]",
                      (long long)c->lse.unwritten, (long long)c->lse.clobbered, (long long)c->lse.nonfinite);
    if (n >= 0 && (size_t)n < size) {
        if (c->cache_k_bad || c->cache_v_bad || c->cache_clobbered)
            n += snprintf(buf + n, size - (size_t)n, " CACHE k_bad=%lld v_bad=%lld clobbered=%lld",
                          (long long)c->cache_k_bad, (long long)c->cache_v_bad, (long long)c->cache_clobbered);
        else
            n += snprintf(buf + n, size - (size_t)n, " cache ok");
    }
    if (c->masked_violations && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " masked-rows-not-exact=%lld", (long long)c->masked_violations);
    if (!c->inputs_unchanged && n >= 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, " INPUTS-MODIFIED");
}

/* ---- merge problems ------------------------------------------------------------------------- */

int fa_merge_problem_create(fa_merge_problem *mp, const fa_merge_spec *spec) {
    memset(mp, 0, sizeof *mp);
    mp->spec = *spec;
    fa_merge_spec *s = &mp->spec;
    if (s->pad_align <= 0) s->pad_align = 1;
    if (s->num_states < 1 || s->rows < 0 || s->heads < 1 || s->head_dim_v < 1 ||
        s->head_dim_v > FA_MAX_HEAD_DIM)
        return -1;
    fa_test_rng layout_rng, value_rng;
    fa_test_rng_seed(&layout_rng, stream_seed(s->seed, 21));
    fa_test_rng_seed(&value_rng, stream_seed(s->seed, 22));
    const int64_t n = s->num_states, rows = s->rows, heads = s->heads, dv = s->head_dim_v;
    const int64_t align = s->pad_align;
    fa_merge_params *m = &mp->params;
    int64_t elements, unused;
    elements = kv_strides(n, rows, heads, dv, s->padded, align, &layout_rng, &m->o_parts_state_stride,
                          &m->o_parts_row_stride, &m->o_parts_head_stride);
    if (alloc_buffer(&mp->buffer[FA_MG_PARTS], elements, fa_test_dtype_size(s->parts_dtype), 0)) goto fail;
    /* lse_parts [state][head][row] */
    elements = kv_strides(n, heads, rows, 1, s->padded, align, &layout_rng, &m->lse_parts_state_stride,
                          &m->lse_parts_head_stride, &m->lse_parts_row_stride);
    if (alloc_buffer(&mp->buffer[FA_MG_LSE_PARTS], elements, 4, 0)) goto fail;
    elements = kv_strides(1, rows, heads, dv, s->padded, align, &layout_rng, &unused, &m->o_row_stride,
                          &m->o_head_stride);
    if (alloc_buffer(&mp->buffer[FA_MG_O], elements, fa_test_dtype_size(s->out_dtype), 1)) goto fail;
    elements = kv_strides(1, heads, rows, 1, s->padded, align, &layout_rng, &unused, &m->lse_head_stride,
                          &m->lse_row_stride);
    if (alloc_buffer(&mp->buffer[FA_MG_LSE], elements, 4, 1)) goto fail;
    poison_buffer(&mp->buffer[FA_MG_PARTS], s->parts_dtype);
    poison_buffer(&mp->buffer[FA_MG_LSE_PARTS], FA_DTYPE_F32);
    poison_buffer(&mp->buffer[FA_MG_O], s->out_dtype);
    poison_buffer(&mp->buffer[FA_MG_LSE], FA_DTYPE_F32);

    /* states: lse around a per-row level with a spread of several units (weights far apart),
     * empty ones with lse = -inf and NaN values; every fifth row has only empty states */
    float *lse_parts = mp->buffer[FA_MG_LSE_PARTS].host;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            double level = 3.0 * fa_test_rng_normal(&value_rng);
            for (int64_t st = 0; st < n; st++) {
                int empty = r % 5 == 3 || fa_test_rng_uniform(&value_rng) < s->empty_share;
                int64_t at = st * m->lse_parts_state_stride + h * m->lse_parts_head_stride + r * m->lse_parts_row_stride;
                lse_parts[at] = empty ? -INFINITY : (float)(level + 2.0 * fa_test_rng_normal(&value_rng));
                int64_t o_at = st * m->o_parts_state_stride + r * m->o_parts_row_stride + h * m->o_parts_head_stride;
                for (int64_t c = 0; c < dv; c++)
                    fa_test_store(mp->buffer[FA_MG_PARTS].host, s->parts_dtype, o_at + c,
                                  empty ? NAN : fa_test_rng_normal(&value_rng) + 0.5);
            }
        }
    for (int i = FA_MG_PARTS; i <= FA_MG_LSE_PARTS; i++) {
        fa_test_buffer *buf = &mp->buffer[i];
        buf->saved = malloc(buf->bytes);
        if (!buf->saved) goto fail;
        memcpy(buf->saved, buf->host, buf->bytes);
    }
    m->device = FA_DEVICE_CPU;
    m->parts_dtype = s->parts_dtype;
    m->out_dtype = s->out_dtype;
    m->num_states = n;
    m->rows = rows;
    m->heads = heads;
    m->head_dim_v = dv;
    *m = fa_merge_problem_device_params(mp);
    m->o_parts = mp->buffer[FA_MG_PARTS].host;
    m->lse_parts = mp->buffer[FA_MG_LSE_PARTS].host;
    m->o = mp->buffer[FA_MG_O].host;
    m->lse = s->no_lse ? NULL : mp->buffer[FA_MG_LSE].host;
    return 0;
fail:
    fa_merge_problem_destroy(mp);
    return -1;
}

void fa_merge_problem_destroy(fa_merge_problem *mp) {
    for (int i = 0; i < FA_MG_BUFFER_COUNT; i++) {
        free(mp->buffer[i].host);
        free(mp->buffer[i].saved);
        mp->buffer[i].host = NULL;
        mp->buffer[i].saved = NULL;
    }
}

fa_merge_params fa_merge_problem_device_params(const fa_merge_problem *mp) {
    fa_merge_params m = mp->params;
    m.o_parts = mp->buffer[FA_MG_PARTS].device;
    m.lse_parts = mp->buffer[FA_MG_LSE_PARTS].device;
    m.o = mp->buffer[FA_MG_O].device;
    m.lse = mp->spec.no_lse ? NULL : mp->buffer[FA_MG_LSE].device;
    return m;
}

void fa_merge_describe(const fa_merge_spec *s, char *buf, size_t size) {
    snprintf(buf, size, "merge parts=%s out=%s states=%lld rows=%lld heads=%lld dv=%lld empty=%.2f%s%s",
             fa_test_dtype_name(s->parts_dtype), fa_test_dtype_name(s->out_dtype),
             (long long)s->num_states, (long long)s->rows, (long long)s->heads,
             (long long)s->head_dim_v, s->empty_share, s->no_lse ? " no-lse" : "",
             s->padded ? " padded" : "");
}

fa_merge_check fa_merge_verify(const fa_merge_problem *mp) {
    const fa_merge_spec *s = &mp->spec;
    const fa_merge_params *m = &mp->params;
    const int64_t n = s->num_states, dv = s->head_dim_v;
    fa_merge_check out;
    memset(&out, 0, sizeof out);
    const fa_test_buffer *ob = &mp->buffer[FA_MG_O], *lb = &mp->buffer[FA_MG_LSE];
    const fa_test_buffer *parts = &mp->buffer[FA_MG_PARTS];
    const float *lse_parts = mp->buffer[FA_MG_LSE_PARTS].host;
    size_t es = fa_test_dtype_size(s->out_dtype);
    uint8_t *logical_o = calloc(ob->bytes / es + 1, 1), *logical_lse = calloc(lb->bytes / 4 + 1, 1);
    double *weights = malloc(sizeof(double) * (size_t)n);
    float *weights32 = malloc(sizeof(float) * (size_t)n);
    if (!logical_o || !logical_lse || !weights || !weights32) {
        free(logical_o);
        free(logical_lse);
        free(weights);
        free(weights32);
        out.o.nonfinite = -1;
        return out;
    }
    for (int64_t r = 0; r < s->rows; r++)
        for (int64_t h = 0; h < s->heads; h++) {
            /* float64 merge, and the fp32 one the tolerance is relative to */
            double top = -INFINITY;
            float top32 = -INFINITY;
            for (int64_t st = 0; st < n; st++) {
                float l = lse_parts[st * m->lse_parts_state_stride + h * m->lse_parts_head_stride + r * m->lse_parts_row_stride];
                if (l > top) top = l;
                if (l > top32) top32 = l;
            }
            double total = 0.0, lse_mag = 0.0;
            float total32 = 0.0f;
            for (int64_t st = 0; st < n; st++) {
                float l = lse_parts[st * m->lse_parts_state_stride + h * m->lse_parts_head_stride + r * m->lse_parts_row_stride];
                if (l == -INFINITY) continue;
                total += exp((double)l - top);
                total32 += expf(l - top32);
                if (fabs(l) > lse_mag) lse_mag = fabs(l);
            }
            int empty = top == -INFINITY;
            for (int64_t st = 0; st < n; st++) {
                float l = lse_parts[st * m->lse_parts_state_stride + h * m->lse_parts_head_stride + r * m->lse_parts_row_stride];
                weights[st] = l == -INFINITY ? 0.0 : exp((double)l - top) / total;
                weights32[st] = l == -INFINITY ? 0.0f : expf(l - top32) / total32;
            }
            for (int64_t c = 0; c < dv; c++) {
                double ref = 0.0, mag = 0.0;
                float acc32 = 0.0f;
                for (int64_t st = 0; st < n && !empty; st++) {
                    if (weights[st] == 0.0 && weights32[st] == 0.0f) continue; /* empty: o is NaN */
                    double value = fa_test_load(parts->host, s->parts_dtype,
                                                st * m->o_parts_state_stride + r * m->o_parts_row_stride +
                                                    h * m->o_parts_head_stride + c);
                    ref += weights[st] * value;
                    mag += weights[st] * fabs(value);
                    acc32 += weights32[st] * (float)value;
                }
                double base = fa_test_round_to(s->out_dtype, acc32);
                int64_t at = r * m->o_row_stride + h * m->o_head_stride + c;
                logical_o[at] = 1;
                fa_test_check *ck = &out.o;
                ck->checked++;
                if (is_poison(ob, s->out_dtype, at)) {
                    ck->unwritten++;
                    continue;
                }
                double ours = fa_test_load(ob->host, s->out_dtype, at);
                if (!isfinite(ours)) {
                    ck->nonfinite++;
                    continue;
                }
                if (empty && ours != 0.0) out.empty_violations++;
                if (mag > ck->term_max) ck->term_max = mag;
                check_note(ck, ours, ref, base);
            }
            if (s->no_lse) continue;
            int64_t at = h * m->lse_head_stride + r * m->lse_row_stride;
            logical_lse[at] = 1;
            fa_test_check *ck = &out.lse;
            ck->checked++;
            if (is_poison(lb, FA_DTYPE_F32, at)) {
                ck->unwritten++;
                continue;
            }
            double ours = ((const float *)lb->host)[at];
            if (empty) {
                if (ours != -INFINITY) out.empty_violations++;
                continue;
            }
            double ref = top + log(total), base = top32 + logf(total32);
            if (!isfinite(ours)) {
                ck->nonfinite++;
                continue;
            }
            if (lse_mag > ck->term_max) ck->term_max = lse_mag;
            check_note(ck, ours, ref, base);
        }
    for (size_t e = 0; e < ob->bytes / es; e++)
        if (!logical_o[e] && !is_poison(ob, s->out_dtype, (int64_t)e)) out.o.clobbered++;
    for (size_t e = 0; e < lb->bytes / 4; e++)
        if (!logical_lse[e] && !is_poison(lb, FA_DTYPE_F32, (int64_t)e)) out.lse.clobbered++;
    free(logical_o);
    free(logical_lse);
    free(weights);
    free(weights32);
    out.inputs_unchanged = 1;
    for (int i = FA_MG_PARTS; i <= FA_MG_LSE_PARTS; i++)
        if (memcmp(mp->buffer[i].host, mp->buffer[i].saved, mp->buffer[i].bytes)) out.inputs_unchanged = 0;
    check_finish(&out.o, s->out_dtype);
    check_finish(&out.lse, FA_DTYPE_F32);
    out.ok = out.o.ok && out.lse.ok && out.empty_violations == 0 && out.inputs_unchanged;
    return out;
}

/* ---- fp8 inputs -------------------------------------------------------------------------- */

double fa_test_e4m3_value(uint8_t code) {
    const int magnitude = code & 0x7f;
    double v;
    if (magnitude == 0x7f) v = NAN;
    else if ((magnitude >> 3) == 0) v = (double)(magnitude & 7) / 512.0;
    else v = ldexp(1.0 + (double)(magnitude & 7) / 8.0, (magnitude >> 3) - 7);
    return (code & 0x80) ? -v : v;
}

uint8_t fa_test_e4m3_nearest(double x) {
    static double values[0x7f]; /* the non-negative finite values, increasing with the code */
    if (values[1] == 0.0)
        for (int code = 0; code < 0x7f; ++code) values[code] = fa_test_e4m3_value((uint8_t)code);
    const uint8_t sign = x < 0 ? 0x80 : 0;
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
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

/* Quantise tensor t (q, k, v or dout) of tp in place and write its codes. */
static void fp8_quantise_tensor(fa_test_problem *tp, int t, uint8_t *codes, const float *descale, int64_t heads,
                                int64_t dim, int64_t group) {
    const fa_params *p = &tp->params;
    const fa_test_view *view = &tp->view[t];
    void *host = tp->buffer[view->buffer].host;
    const int varlen = p->cu_seqlens_q != NULL;
    const int rows_q = t == FA_T_Q || t == FA_T_DO;
    const int32_t *cu = rows_q ? p->cu_seqlens_q : p->cu_seqlens_k;
    const int64_t seqlen = rows_q ? p->seqlen_q : p->seqlen_k;
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t first = varlen ? cu[b] : 0, count = varlen ? cu[b + 1] - cu[b] : seqlen;
        for (int64_t i = 0; i < count; ++i)
            for (int64_t h = 0; h < heads; ++h) {
                const double ds = descale[b * p->heads_kv + h / group];
                for (int64_t c = 0; c < dim; ++c) {
                    const int64_t at = view->offset + (varlen ? 0 : b * view->batch_stride) +
                                       (first + i) * view->row_stride + h * view->head_stride + c;
                    const uint8_t code = fa_test_e4m3_nearest(fa_test_load(host, FA_DTYPE_BF16, at) / ds);
                    codes[at] = code;
                    fa_test_store(host, FA_DTYPE_BF16, at, ds * fa_test_e4m3_value(code));
                }
            }
    }
}

int fa_test_fp8_quantise(fa_test_problem *tp, int scaled, uint64_t seed, fa_test_fp8 *f) {
    memset(f, 0, sizeof *f);
    const fa_params *p = &tp->params;
    if (tp->spec.dtype != FA_DTYPE_BF16) return -1;
    for (int a = 0; a < 3; ++a)
        if (!(f->descale[a] = malloc(sizeof(float) * (size_t)(p->batch * p->heads_kv)))) {
            fa_test_fp8_free(f);
            return -1;
        }
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    for (int a = 0; a < 3; ++a)
        for (int64_t i = 0; i < p->batch * p->heads_kv; ++i)
            f->descale[a][i] = scaled ? ldexpf(1.0f, (int)fa_test_rng_int(&rng, -3, 3)) : 1.0f;
    static const int tensors[3] = {FA_T_Q, FA_T_K, FA_T_V};
    for (int a = 0; a < 3; ++a) {
        const fa_test_buffer *buf = &tp->buffer[tp->view[tensors[a]].buffer];
        f->count[a] = buf->bytes / buf->elem_size;
        f->code[a] = calloc(f->count[a], 1);
        f->saved[a] = malloc(f->count[a]);
        if (!f->code[a] || !f->saved[a]) {
            fa_test_fp8_free(f);
            return -1;
        }
    }
    const int64_t group = p->heads_q / p->heads_kv;
    fp8_quantise_tensor(tp, FA_T_Q, f->code[0], f->descale[0], p->heads_q, p->head_dim, group);
    fp8_quantise_tensor(tp, FA_T_K, f->code[1], f->descale[1], p->heads_kv, p->head_dim, 1);
    fp8_quantise_tensor(tp, FA_T_V, f->code[2], f->descale[2], p->heads_kv, p->head_dim_v, 1);
    for (int a = 0; a < 3; ++a) {
        memcpy(f->saved[a], f->code[a], f->count[a]);
        fa_test_buffer *buf = &tp->buffer[tp->view[tensors[a]].buffer];
        if (buf->saved) memcpy(buf->saved, buf->host, buf->bytes); /* the quantised values are the inputs now */
    }
    return 0;
}

int fa_test_fp8_quantise_dout(fa_test_problem *tp, uint64_t seed, fa_test_fp8 *f) {
    const fa_params *p = &tp->params;
    const fa_test_buffer *buf = &tp->buffer[tp->view[FA_T_DO].buffer];
    f->count[3] = buf->bytes / buf->elem_size;
    f->code[3] = calloc(f->count[3], 1);
    f->saved[3] = malloc(f->count[3]);
    f->descale[3] = malloc(sizeof(float) * (size_t)(p->batch * p->heads_kv));
    if (!f->code[3] || !f->saved[3] || !f->descale[3]) return -1;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    for (int64_t i = 0; i < p->batch * p->heads_kv; ++i)
        f->descale[3][i] = ldexpf(1.0f, (int)fa_test_rng_int(&rng, -3, 3));
    fp8_quantise_tensor(tp, FA_T_DO, f->code[3], f->descale[3], p->heads_q, p->head_dim_v, p->heads_q / p->heads_kv);
    memcpy(f->saved[3], f->code[3], f->count[3]);
    fa_test_buffer *b = &tp->buffer[tp->view[FA_T_DO].buffer];
    if (b->saved) memcpy(b->saved, b->host, b->bytes);
    return 0;
}

void fa_test_fp8_free(fa_test_fp8 *f) {
    for (int a = 0; a < 4; ++a) {
        free(f->code[a]);
        free(f->saved[a]);
        free(f->descale[a]);
        f->code[a] = f->saved[a] = NULL;
        f->descale[a] = NULL;
    }
}

fa_params fa_test_fp8_params(const fa_test_problem *tp, const fa_test_fp8 *f, int with_descales) {
    fa_params p = tp->params;
    p.dtype = FA_DTYPE_FP8_E4M3;
    p.q = f->code[0] + tp->view[FA_T_Q].offset; /* the problem's pointers are at each view's offset */
    p.k = f->code[1] + tp->view[FA_T_K].offset;
    p.v = f->code[2] + tp->view[FA_T_V].offset;
    if (with_descales) {
        p.q_descale = f->descale[0];
        p.k_descale = f->descale[1];
        p.v_descale = f->descale[2];
    }
    if (f->code[3]) { /* dout in e4m3 too, with its factors whatever with_descales says (powers of two) */
        p.dout = f->code[3] + tp->view[FA_T_DO].offset;
        p.dout_e4m3 = 1;
        p.dout_descale = f->descale[3];
    }
    return p;
}

int fa_test_fp8_unchanged(const fa_test_fp8 *f) {
    for (int a = 0; a < 4; ++a)
        if (f->code[a] && memcmp(f->code[a], f->saved[a], f->count[a])) return 0;
    return 1;
}
