/*
 * fa_validate.h: host-only validation functions shared by fa_api.c and fa_kvcache.c that the
 * engines do not need (the rest of the validation interface is in fa_internal.h).
 */
#ifndef FA_VALIDATE_H
#define FA_VALIDATE_H

#include <stdint.h>

/* The stride of an axis of extent <= 1 is never needed (index 0 only) and may hold anything, a
 * huge value included; the CPU engines step pointers by strides (one step past the last row), so
 * such strides are set to 0 in the resolved problem. */
static inline void fa_zero_unused_strides(int64_t n0, int64_t *s0, int64_t n1, int64_t *s1, int64_t n2,
                                          int64_t *s2) {
    if (n0 <= 1) *s0 = 0;
    if (n1 <= 1) *s1 = 0;
    if (n2 <= 1) *s2 = 0;
}

#endif /* FA_VALIDATE_H */
