/*
 * cpu_convert.h: scalar conversions between fp32 and the 16-bit storage types, and from fp8 e4m3.
 *
 * fp32 -> f16 / bf16 round to nearest, ties to even (IEEE default), keep infinities, turn NaN
 * into a quiet NaN of the same sign, and produce f16 subnormals exactly. The SIMD kernels use
 * the hardware conversions (F16C) or the same bit arithmetic, so every level agrees bit for bit.
 */
#ifndef FA_CPU_CONVERT_H
#define FA_CPU_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t fa_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float fa_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float fa_bf16_to_f32(uint16_t h) { return fa_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t fa_f32_to_bf16(float f) {
    uint32_t u = fa_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even on the 16 dropped bits */
    return (uint16_t)(u >> 16);
}

static inline float fa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return fa_f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        /* zero or subnormal: mantissa · 2^-24, exact in fp32 */
        float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    return fa_f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline uint16_t fa_f32_to_f16(float f) {
    uint32_t u = fa_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: infinity */
    if (magnitude >= 0x38800000u) {
        /* normal f16: round the 13 dropped mantissa bits to nearest even, then rebias 127 -> 15 */
        magnitude += 0x0fffu + ((magnitude >> 13) & 1u);
        return (uint16_t)(sign | ((magnitude - 0x38000000u) >> 13));
    }
    /* subnormal f16 (or zero): the value in units of 2^-24, rounded to nearest even by rintf
     * (scaling by 2^24 is exact, the result is at most 1024 = the smallest normal) */
    float units = fa_f32_from_bits(magnitude) * 16777216.0f;
    return (uint16_t)(sign | (uint16_t)rintf(units));
}

/* OCP e4m3 (sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, S.1111.111 is NaN)
 * -> fp32, exact: normal codes move their fields into place (bias 7 -> 127), subnormal ones are
 * m · 2^-9. */
static inline float fa_e4m3_to_f32(uint8_t x) {
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, exponent = (x >> 3) & 0xfu, mantissa = x & 7u;
    if ((x & 0x7fu) == 0x7fu) return fa_f32_from_bits(sign | 0x7fc00000u);
    if (exponent == 0) return fa_f32_from_bits(sign | fa_f32_bits((float)mantissa * 0.001953125f));
    return fa_f32_from_bits(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

#endif /* FA_CPU_CONVERT_H */
