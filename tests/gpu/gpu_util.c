/*
 * gpu_util.c: the GPU test programs' random numbers and 16-bit conversions (gpu_util.h).
 */
#include "gpu_util.h"

#include <math.h>
#include <string.h>

float gpu_random_uniform(gpu_rng *rng, float lo, float hi) {
    uint32_t x = rng->state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    rng->state = x;
    return lo + (hi - lo) * (float)(x >> 8) / 16777216.0f;
}

uint16_t gpu_float_to_16(float f, fa_dtype dtype) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dtype == FA_DTYPE_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const float a = fabsf(f);
    if (a < 6.103515625e-05f) /* below 2^-14: subnormal, a multiple of 2^-24 (1024 encodes 2^-14) */
        return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
    memcpy(&u, &a, 4);
    u += 0xfffu + ((u >> 13) & 1u); /* round away the 13 low mantissa bits, ties to even */
    return (uint16_t)(sign | (uint16_t)((u >> 13) - ((127u - 15u) << 10)));
}

float gpu_float_from_16(uint16_t x, fa_dtype dtype) {
    if (dtype == FA_DTYPE_BF16) {
        const uint32_t u = (uint32_t)x << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const int exponent = (x >> 10) & 0x1f, mantissa = x & 0x3ff;
    float a;
    if (exponent == 0)
        a = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        a = mantissa ? NAN : INFINITY;
    else
        a = ldexpf((float)(mantissa | 0x400), exponent - 25);
    return (x & 0x8000) ? -a : a;
}
