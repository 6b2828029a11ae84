/*
 * gpu_util.h: what the GPU test programs (tests/gpu/) share: a small random-number generator
 * for their inputs and the conversions between fp32 and the 16-bit dtypes of their host buffers.
 */
#ifndef FA_GPU_UTIL_H
#define FA_GPU_UTIL_H

#include <stdint.h>

#include "flashattn.h"

/* xorshift32; each program seeds its own (state != 0). */
typedef struct gpu_rng {
    uint32_t state;
} gpu_rng;

/* Uniform in [lo, hi). */
float gpu_random_uniform(gpu_rng *rng, float lo, float hi);

/* fp32 -> bf16 / f16 bits, round to nearest even (f16: |f| < 65504, subnormals exact). */
uint16_t gpu_float_to_16(float f, fa_dtype dtype);

/* bf16 / f16 bits -> fp32 (exact). */
float gpu_float_from_16(uint16_t x, fa_dtype dtype);

#endif /* FA_GPU_UTIL_H */
