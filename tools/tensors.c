/*
 * tensors.c: RNG, buffer filling and touched allocations for the tool (see tensors.h).
 */
#include "tensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/reference.h"

tool_rng tool_rng_seeded(uint64_t seed) {
    tool_rng rng = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull, 0.0, 0};
    return rng;
}

/* splitmix64 -> [0, 1) with 53 random bits. */
static double rng_uniform(tool_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

double tool_rng_normal(tool_rng *rng) {
    if (rng->has_spare) {
        rng->has_spare = 0;
        return rng->spare;
    }
    double u1 = rng_uniform(rng), u2 = rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    double radius = sqrt(-2.0 * log(u1)), angle = 6.283185307179586 * u2;
    rng->spare = radius * sin(angle);
    rng->has_spare = 1;
    return radius * cos(angle);
}

void tool_fill_normal(void *buffer, fa_dtype dtype, size_t n, float scale, float offset,
                      tool_rng *rng) {
    for (size_t i = 0; i < n; i++)
        fa_test_store(buffer, dtype, (int64_t)i, tool_rng_normal(rng) * scale + offset);
}

void *tool_alloc_touched(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void *buffer = aligned_alloc(64, rounded);
    if (buffer) memset(buffer, 0, rounded);
    return buffer;
}
