/*
 * tensors.h: host buffers for the tool: a seeded normal RNG fast enough for large inputs (two
 * values per Box-Muller step), filling buffers of any dtype, and allocations that are touched so
 * they are resident before memory is measured. dtype conversion comes from oracle/reference.h.
 */
#ifndef FA_TOOL_TENSORS_H
#define FA_TOOL_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

typedef struct tool_rng {
    uint64_t state;
    double spare; /* second value of the last Box-Muller pair */
    int has_spare;
} tool_rng;

tool_rng tool_rng_seeded(uint64_t seed);
double tool_rng_normal(tool_rng *rng); /* standard normal */

/* n elements of randn()·scale + offset, rounded to dtype, filled by all cores; the values depend
 * only on the generator's state, which then advances for the next tensor. */
void tool_fill_normal(void *buffer, fa_dtype dtype, size_t n, float scale, float offset,
                      tool_rng *rng);

/* 64-byte aligned zeroed allocation (every page written, so it counts in the RSS); NULL on failure. */
void *tool_alloc_touched(size_t bytes);

#endif /* FA_TOOL_TENSORS_H */
