/*
 * decode_neon.c: the decode path's kernels (cpu_decode.h) on AArch64 NEON (128-bit vectors, 32
 * registers). Built on AArch64 only (Makefile) and called after cpu_dispatch.c has checked
 * HWCAP_ASIMD.
 *
 * The structure follows decode_avx2.c: a step covers 8 elements of a row (head dims are
 * multiples of 8) as two 4-lane vectors, so int8 / e4m3 rows are read 8 bytes at a time. Scores
 * take 4 rows × 2 keys (8 accumulators, 4 K vectors, 2 q vectors) and reduce the 4 rows of a key
 * with two pairwise-add levels; the accumulation holds 4 rows × 4 vectors of o (16 columns).
 * Every K / V element is loaded and converted once per group of 4 rows, a Q8_0 block's scale
 * once per key and block (scores) or per 16 values (accumulation). Formats convert in
 * registers: f16 by fcvtl, bf16 by a 16-bit shift, int8 by sign extension, e4m3 by moving its
 * bits into an f16 (exponent bias 7 vs 15: the value is the f16's times 2^8, which the caller's
 * k_mult / weights carry; the NaN code is mapped to an f16 NaN). An int8 cache is attended in
 * integers instead, as on AVX2 (scores_block_int, accumulate_int: smlal of int16 query rows or
 * int16 tile weights with the sign-extended int8 values, exact int32 sums; docs/design.md).
 */
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_decode.h"

typedef struct f32x8 {
    float32x4_t lo, hi;
} f32x8;

static FA_CPU_ALWAYS_INLINE f32x8 f16x8_to_f32(uint16x8_t h) {
    float16x8_t x = vreinterpretq_f16_u16(h);
    f32x8 r = {vcvt_f32_f16(vget_low_f16(x)), vcvt_high_f32_f16(x)};
    return r;
}

static FA_CPU_ALWAYS_INLINE f32x8 i8x8_to_f32(const char *p) {
    int16x8_t x = vmovl_s8(vld1_s8((const int8_t *)p));
    f32x8 r = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(x))), vcvtq_f32_s32(vmovl_high_s16(x))};
    return r;
}

static FA_CPU_ALWAYS_INLINE f32x8 scale8(f32x8 x, float32x4_t scale) {
    f32x8 r = {vmulq_f32(x.lo, scale), vmulq_f32(x.hi, scale)};
    return r;
}

/* The f16 scale of the Q8_0 block holding element c, broadcast. */
static FA_CPU_ALWAYS_INLINE float32x4_t q8_scale(const char *row, int64_t c) {
    uint16_t bits;
    memcpy(&bits, row + (c >> 5) * 34, 2);
    return vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(bits)));
}

/* 8 values from element c; Q8_0 takes its block's scale from `scale` (loaded once per block and
 * key by the caller). */
static FA_CPU_ALWAYS_INLINE f32x8 load8_scaled(const int format, const char *row, int64_t c, float32x4_t scale) {
    switch (format) {
    case FA_CPU_KV_F32: {
        f32x8 r = {vld1q_f32((const float *)row + c), vld1q_f32((const float *)row + c + 4)};
        return r;
    }
    case FA_CPU_KV_F16: return f16x8_to_f32(vld1q_u16((const uint16_t *)(row + 2 * c)));
    case FA_CPU_KV_BF16: {
        uint16x8_t x = vld1q_u16((const uint16_t *)(row + 2 * c));
        f32x8 r = {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)),
                   vreinterpretq_f32_u32(vshll_high_n_u16(x, 16))};
        return r;
    }
    case FA_CPU_KV_I8: return i8x8_to_f32(row + c);
    case FA_CPU_KV_Q8_0: return scale8(i8x8_to_f32(row + (c >> 5) * 34 + 2 + (c & 31)), scale);
    default: { /* FA_CPU_KV_E4M3 */
        uint16x8_t x = vmovl_u8(vld1_u8((const uint8_t *)(row + c)));
        uint16x8_t magnitude = vandq_u16(x, vdupq_n_u16(0x7f));
        uint16x8_t h = vorrq_u16(vshlq_n_u16(vandq_u16(x, vdupq_n_u16(0x80)), 8), vshlq_n_u16(magnitude, 7));
        uint16x8_t nan = vceqq_u16(magnitude, vdupq_n_u16(0x7f));
        return f16x8_to_f32(vorrq_u16(h, vandq_u16(nan, vdupq_n_u16(0x7e00))));
    }
    }
}

/* Scores of an int8 cache from the int16 query rows (t->q16): smlal / smlal2 of the sign-extended
 * K values with q16, 8 values per step, summed in int32 (exact: see fa_cpu_q16_max) and across
 * the lanes in int32, one conversion to fp32 per key and row. */
static FA_CPU_ALWAYS_INLINE void scores_block_int(const int ROWS, const int KEYS, const fa_cpu_decode_tile *t, int64_t j,
                                                  int64_t r0) {
    const int64_t d = t->d;
    const int16_t *q = t->q16 + r0 * d;
    int32x4_t acc[4][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = vdupq_n_s32(0);
    for (int64_t c = 0; c < d; c += 8) { /* d is a multiple of 8 */
        int16x8_t kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = vmovl_s8(vld1_s8((const int8_t *)(t->k_rows[j + k] + c)));
        for (int r = 0; r < ROWS; r++) {
            int16x8_t qv = vld1q_s16(q + r * d + c);
            for (int k = 0; k < KEYS; k++)
                acc[r][k] = vmlal_high_s16(vmlal_s16(acc[r][k], vget_low_s16(kv[k]), vget_low_s16(qv)), kv[k], qv);
        }
    }
    for (int k = 0; k < KEYS; k++) {
        float mult = t->k_mult[j + k];
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS == 4) {
            int32x4_t sums = vpaddq_s32(vpaddq_s32(acc[0][k], acc[1][k]), vpaddq_s32(acc[2][k], acc[3][k]));
            vst1q_f32(s, vmulq_f32(vcvtq_f32_s32(sums), vmulq_n_f32(vld1q_f32(t->q16_scale + r0), mult)));
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * t->q16_scale[r0 + r] * (float)vaddvq_s32(acc[r][k]);
        }
    }
}

/* Scores of rows r0 .. r0 + ROWS - 1 (ROWS <= 4), keys KEYS at a time (1 or 2). */
static FA_CPU_ALWAYS_INLINE void scores_block(const int format, const int ROWS, const int KEYS,
                                              const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
    const int64_t d = t->d;
    const float *q = t->q + r0 * d;
    float32x4_t acc[4][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = vdupq_n_f32(0.0f);
    float32x4_t scale[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t c = 0; c < d; c += 8) {
        f32x8 kv[2];
        if (format == FA_CPU_KV_Q8_0 && (c & 31) == 0)
            for (int k = 0; k < KEYS; k++) scale[k] = q8_scale(t->k_rows[j + k], c);
        for (int k = 0; k < KEYS; k++) kv[k] = load8_scaled(format, t->k_rows[j + k], c, scale[k]);
        for (int r = 0; r < ROWS; r++) {
            float32x4_t q_lo = vld1q_f32(q + r * d + c), q_hi = vld1q_f32(q + r * d + c + 4);
            for (int k = 0; k < KEYS; k++) acc[r][k] = vfmaq_f32(vfmaq_f32(acc[r][k], kv[k].lo, q_lo), kv[k].hi, q_hi);
        }
    }
    for (int k = 0; k < KEYS; k++) {
        float mult = t->k_mult ? t->k_mult[j + k] : 1.0f;
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS == 4) {
            float32x4_t sums = vpaddq_f32(vpaddq_f32(acc[0][k], acc[1][k]), vpaddq_f32(acc[2][k], acc[3][k]));
            vst1q_f32(s, vmulq_n_f32(sums, mult));
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * vaddvq_f32(acc[r][k]);
        }
    }
}

/* o[r0 + r][c .. c + 8·PAIRS) for ROWS rows over every key of the tile (PAIRS of 4-lane vectors
 * pairs: 1 or 2). */
static FA_CPU_ALWAYS_INLINE void accumulate_block(const int format, const int ROWS, const int PAIRS,
                                                  const fa_cpu_decode_tile *t, int64_t r0, int64_t c) {
    float32x4_t acc[4][4];
    const int64_t dv = t->dv, ld = t->ld;
    for (int r = 0; r < ROWS; r++) {
        float alpha = t->alpha[r0 + r];
        for (int v = 0; v < 2 * PAIRS; v++) acc[r][v] = vmulq_n_f32(vld1q_f32(t->o + (r0 + r) * dv + c + 4 * v), alpha);
    }
    const float *s = t->s + r0;
    for (int64_t j = 0; j < t->n_keys; j++, s += ld) {
        float32x4_t vv[4];
        float32x4_t scale = format == FA_CPU_KV_Q8_0 ? q8_scale(t->v_rows[j], c) : vdupq_n_f32(0.0f);
        for (int h = 0; h < PAIRS; h++) {
            f32x8 x = load8_scaled(format, t->v_rows[j], c + 8 * h, scale);
            vv[2 * h] = x.lo;
            vv[2 * h + 1] = x.hi;
        }
        for (int r = 0; r < ROWS; r++) {
            float32x4_t wr = vld1q_dup_f32(s + r);
            for (int v = 0; v < 2 * PAIRS; v++) acc[r][v] = vfmaq_f32(acc[r][v], wr, vv[v]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < 2 * PAIRS; v++) vst1q_f32(t->o + (r0 + r) * dv + c + 4 * v, acc[r][v]);
}

/* o[r0 + r][c .. c + 8·PAIRS) of an int8 cache from the int16 weights p16[j][r] of the tile's
 * keys (accumulate_int): the int8 V values sign-extended and multiplied by each row's weight
 * with smlal / smlal2, summed over the tile in int32, then o = alpha · o + scale ·
 * sum in fp32. */
static FA_CPU_ALWAYS_INLINE void accumulate_int_block(const int ROWS, const int PAIRS, const fa_cpu_decode_tile *t,
                                                      int64_t r0, int64_t c, const int16_t (*p16)[4],
                                                      const float *scale) {
    fa_cpu_decode_prefetch_v(t, r0, c);
    int32x4_t acc[4][4];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < 2 * PAIRS; v++) acc[r][v] = vdupq_n_s32(0);
    for (int64_t j = 0; j < t->n_keys; j++) {
        int16x8_t vv[2];
        for (int h = 0; h < PAIRS; h++) vv[h] = vmovl_s8(vld1_s8((const int8_t *)(t->v_rows[j] + c + 8 * h)));
        for (int h = 0; h < PAIRS; h++)
            for (int r = 0; r < ROWS; r++) {
                acc[r][2 * h] = vmlal_n_s16(acc[r][2 * h], vget_low_s16(vv[h]), p16[j][r]);
                acc[r][2 * h + 1] = vmlal_high_n_s16(acc[r][2 * h + 1], vv[h], p16[j][r]);
            }
    }
    for (int r = 0; r < ROWS; r++) {
        float *o = t->o + (r0 + r) * t->dv + c;
        const float alpha = t->alpha[r0 + r];
        for (int v = 0; v < 2 * PAIRS; v++)
            vst1q_f32(o + 4 * v, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(o + 4 * v), alpha),
                                             vmulq_n_f32(vcvtq_f32_s32(acc[r][v]), scale[r]), 1.0f / 32767.0f));
    }
}

/* P·V of an int8 cache by integer multiply-adds, per block of 4 rows: P (which carries v_mult)
 * quantised per row to int16 against the row's largest |P| in the tile (rounding error at most
 * 2^-16 of it, round to nearest even as on AVX2), summed over the tile in int32 (|sum| <= 16 ·
 * 128 · 32767 < 2^27). Returns 0, having written nothing, when a P of the tile is not finite (the
 * fp32 kernels then carry the NaN / infinity). */
static int accumulate_int(const fa_cpu_decode_tile *t) {
    const int64_t n = t->n_keys, ld = t->ld;
    for (int64_t j = 0; j < n; j++)
        for (int64_t r = 0; r < t->n_rows; r++)
            if (!(fabsf(t->s[j * ld + r]) <= FLT_MAX)) return 0;
    for (int64_t r0 = 0; r0 < t->n_rows; r0 += 4) {
        const int R = t->n_rows - r0 >= 4 ? 4 : (int)(t->n_rows - r0);
        float top[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        double inv[4]; /* 32767 / top in double: finite for every top > 0, denormal weights included */
        for (int64_t j = 0; j < n; j++)
            for (int r = 0; r < R; r++) top[r] = fmaxf(top[r], fabsf(t->s[j * ld + r0 + r]));
        for (int r = 0; r < 4; r++) inv[r] = top[r] > 0.0f ? 32767.0 / top[r] : 0.0;
        int16_t p16[FA_CPU_DECODE_KEYS][4];
        for (int64_t j = 0; j < n; j++)
            for (int r = 0; r < 4; r++)
                p16[j][r] = r < R ? (int16_t)vcvtnd_s64_f64((double)t->s[j * ld + r0 + r] * inv[r]) : 0;
        FA_DECODE_INT_ROWS(R, t, r0, p16, top); /* the block applies (sum · top) / 32767 */
    }
    return 1;
}

/* fa_cpu_decode_kernels.quantise_rows: round to nearest even (fcvtns), as on AVX2. */
static int quantise_rows(const float *q, int64_t n_rows, int64_t d, int16_t *q16, float *q16_scale) {
    const float q_max = (float)fa_cpu_q16_max(d);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = q + r * d;
        float top = 0.0f;
        for (int64_t k = 0; k < d; k++) {
            if (!(fabsf(x[k]) <= FLT_MAX)) return 0; /* NaN or infinite */
            top = fabsf(x[k]) > top ? fabsf(x[k]) : top;
        }
        if (top > 0.0f && top < 0x1p-100f) return 0; /* q_max / top would overflow: the fp32 scores */
        const float inv = top > 0.0f ? q_max / top : 0.0f;
        q16_scale[r] = top / q_max;
        const float32x4_t vinv = vdupq_n_f32(inv);
        int16_t *y = q16 + r * d;
        int64_t k = 0;
        for (; k + 8 <= d; k += 8) {
            int32x4_t a = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + k), vinv));
            int32x4_t b = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + k + 4), vinv));
            vst1q_s16(y + k, vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)));
        }
        for (; k < d; k++) y[k] = (int16_t)vcvtns_s32_f32(x[k] * inv);
    }
    return 1;
}

#define DECODE_QUANTISE_ROWS quantise_rows
#define DECODE_ACCUMULATE_INT(t) accumulate_int(t)
#include "decode_impl.h"

const fa_cpu_decode_kernels *fa_cpu_decode_kernels_neon(void) { return &kernels; }
