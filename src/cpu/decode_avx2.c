/*
 * decode_avx2.c: the decode path's kernels (cpu_decode.h) on 256-bit vectors, for CPUs with AVX2,
 * FMA and F16C (also used at the AVX-512 level). Built with the AVX2 flags (Makefile) and called
 * only after cpu_dispatch.c has checked them.
 *
 * Rows are taken 4 at a time: scores hold 2 keys × 4 rows = 8 accumulators plus 2 K vectors and
 * 4 q vectors (14 of the 16 ymm registers) and reduce the 4 rows of a key with one hadd tree;
 * the accumulation holds 4 rows × 2 vectors of o. Every K / V element is loaded and converted
 * once per group of 4 rows, a Q8_0 block's scale once per key and block (scores) or per 16
 * values (accumulation). Formats convert in registers: f16 by vcvtph2ps, bf16 by a 16-bit
 * shift, int8 by sign extension, e4m3 by moving its bits into an f16 (exponent bias 7 vs 15:
 * the value is the f16's times 2^8, which the caller's k_mult / weights carry; the NaN code is
 * mapped to an f16 NaN).
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_decode.h"

static FA_CPU_ALWAYS_INLINE __m256 load8(const int format, const char *row, int64_t c) {
    switch (format) {
    case FA_CPU_KV_F32: return _mm256_loadu_ps((const float *)row + c);
    case FA_CPU_KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * c)));
    case FA_CPU_KV_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * c))), 16));
    case FA_CPU_KV_I8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
    case FA_CPU_KV_Q8_0: {
        const char *block = row + (c >> 5) * 34;
        uint16_t scale_bits;
        memcpy(&scale_bits, block, 2);
        __m256 scale = _mm256_set1_ps(_cvtsh_ss(scale_bits));
        __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(block + 2 + (c & 31)))));
        return _mm256_mul_ps(x, scale);
    }
    default: { /* FA_CPU_KV_E4M3 */
        __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + c)));
        __m128i magnitude = _mm_and_si128(x, _mm_set1_epi16(0x7f));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8), _mm_slli_epi16(magnitude, 7));
        __m128i nan = _mm_cmpeq_epi16(magnitude, _mm_set1_epi16(0x7f));
        h = _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7e00)));
        return _mm256_cvtph_ps(h);
    }
    }
}

/* The f16 scale of the Q8_0 block holding element c, broadcast. */
static FA_CPU_ALWAYS_INLINE __m256 q8_scale(const char *row, int64_t c) {
    uint16_t bits;
    memcpy(&bits, row + (c >> 5) * 34, 2);
    return _mm256_set1_ps(_cvtsh_ss(bits));
}

/* 8 values from element c: load8, except that Q8_0 takes its block's scale from `scale` (loaded
 * once per block and key by the caller). */
static FA_CPU_ALWAYS_INLINE __m256 load8_scaled(const int format, const char *row, int64_t c, __m256 scale) {
    if (format != FA_CPU_KV_Q8_0) return load8(format, row, c);
    const char *values = row + (c >> 5) * 34 + 2 + (c & 31);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)values))), scale);
}

/* [sum(a0), sum(a1), sum(a2), sum(a3)] */
static FA_CPU_ALWAYS_INLINE __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

static FA_CPU_ALWAYS_INLINE float hsum(__m256 a) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* Scores of rows r0 .. r0 + ROWS - 1 (ROWS <= 4), keys KEYS at a time (1 or 2). */
static FA_CPU_ALWAYS_INLINE void scores_block(const int format, const int ROWS, const int KEYS,
                                              const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
    const int64_t d = t->d;
    const float *q = t->q + r0 * d;
    __m256 acc[4][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = _mm256_setzero_ps();
    __m256 scale[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t c = 0; c < d; c += 8) {
        __m256 kv[2];
        if (format == FA_CPU_KV_Q8_0 && (c & 31) == 0)
            for (int k = 0; k < KEYS; k++) scale[k] = q8_scale(t->k_rows[j + k], c);
        for (int k = 0; k < KEYS; k++) kv[k] = load8_scaled(format, t->k_rows[j + k], c, scale[k]);
        for (int r = 0; r < ROWS; r++) {
            __m256 qv = _mm256_loadu_ps(q + r * d + c);
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm256_fmadd_ps(kv[k], qv, acc[r][k]);
        }
    }
    for (int k = 0; k < KEYS; k++) {
        float mult = t->k_mult ? t->k_mult[j + k] : 1.0f;
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS == 4) {
            _mm_storeu_ps(s, _mm_mul_ps(hsum4(acc[0][k], acc[1][k], acc[2][k], acc[3][k]), _mm_set1_ps(mult)));
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * hsum(acc[r][k]);
        }
    }
}

/* o[r0 + r][c .. c + 8·VECS) for ROWS rows over every key of the tile. */
static FA_CPU_ALWAYS_INLINE void accumulate_block(const int format, const int ROWS, const int VECS,
                                                  const fa_cpu_decode_tile *t, int64_t r0, int64_t c) {
    __m256 acc[4][2];
    const int64_t dv = t->dv, ld = t->ld;
    for (int r = 0; r < ROWS; r++) {
        __m256 alpha = _mm256_broadcast_ss(t->alpha + r0 + r);
        for (int v = 0; v < VECS; v++)
            acc[r][v] = _mm256_mul_ps(_mm256_loadu_ps(t->o + (r0 + r) * dv + c + 8 * v), alpha);
    }
    const float *s = t->s + r0;
    for (int64_t j = 0; j < t->n_keys; j++, s += ld) {
        __m256 vv[2];
        __m256 scale = format == FA_CPU_KV_Q8_0 ? q8_scale(t->v_rows[j], c) : _mm256_setzero_ps();
        for (int v = 0; v < VECS; v++) vv[v] = load8_scaled(format, t->v_rows[j], c + 8 * v, scale);
        for (int r = 0; r < ROWS; r++) {
            __m256 w = _mm256_broadcast_ss(s + r);
            for (int v = 0; v < VECS; v++) acc[r][v] = _mm256_fmadd_ps(w, vv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < VECS; v++) _mm256_storeu_ps(t->o + (r0 + r) * dv + c + 8 * v, acc[r][v]);
}

#include "decode_impl.h"

const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx2(void) { return &kernels; }
