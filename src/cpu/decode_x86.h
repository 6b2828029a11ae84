/*
 * decode_x86.h: the 8-wide pieces of the x86 decode kernels (cpu_decode.h) that decode_avx2.c
 * and decode_avx512.c share: a cache row's values in any storage format as 8 fp32 lanes, a Q8_0
 * block's scale, and the horizontal sums of the scores. Included only by files built with AVX2
 * (or AVX-512, which implies it), FMA and F16C.
 */
#ifndef FA_CPU_DECODE_X86_H
#define FA_CPU_DECODE_X86_H

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

#endif /* FA_CPU_DECODE_X86_H */
