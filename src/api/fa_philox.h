/*
 * fa_philox.h: the attention-dropout random numbers, one definition for every engine (CPU, CUDA)
 * and for the test oracle. C11, and CUDA C++ (functions are host + device there).
 *
 * Generator: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC
 * 2011): a counter-based generator, so any element's number is computed directly from its
 * coordinates, without state. The forward and the backward regenerate the same mask instead of
 * storing it.
 *
 * Element (b, h, i, j) of the attention matrix (sequence b, query head h, query row i and key j
 * within the sequence, heads_q query heads) draws 16 bits:
 *   key     = (lo32(seed), hi32(seed))
 *   counter = (lo32(offset + j/8), hi32(offset + j/8), i, lo32(b·heads_q + h))
 *   word    = philox4x32_10(counter, key)[(j % 8) / 2]
 *   number  = half j % 2 of word (0: bits 0-15, 1: bits 16-31)
 * so one Philox call serves eight neighbouring keys of a row. The element is dropped iff
 * number < threshold, threshold = round(p · 65536) clamped to [0, 65535]
 * (fa_dropout_threshold): it is kept with probability 1 - threshold / 65536, p quantised to
 * 1/65536. A kept element is scaled by 1 / (1 - p).
 * Calls sharing a seed get independent masks when their offsets differ by at least
 * ceil(seqlen_k / 8) (the counters they use do not overlap).
 */
#ifndef FA_PHILOX_H
#define FA_PHILOX_H

#include <stdint.h>

#ifndef FA_HD
#ifdef __CUDACC__
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD static inline
#endif
#endif

typedef struct fa_philox_u32x4 {
    uint32_t x[4];
} fa_philox_u32x4;

/* Philox4x32 with 10 rounds: counter c, key (k0, k1). */
FA_HD fa_philox_u32x4 fa_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                       uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { /* the Weyl key schedule: golden ratio and sqrt(3) - 1 */
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    fa_philox_u32x4 r;
    r.x[0] = c0;
    r.x[1] = c1;
    r.x[2] = c2;
    r.x[3] = c3;
    return r;
}

/* The eight 16-bit numbers of keys 8·(j/8) .. 8·(j/8) + 7 of element row (b, h, i): key
 * 8·(j/8) + k is half k % 2 of word k / 2 (fa_dropout_number). */
FA_HD fa_philox_u32x4 fa_dropout_bits8(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t heads_q,
                                       int64_t i, int64_t j) {
    const uint64_t column = offset + (uint64_t)(j >> 3);
    const uint64_t head_row = (uint64_t)(b * heads_q + h);
    return fa_philox4x32_10((uint32_t)column, (uint32_t)(column >> 32), (uint32_t)i, (uint32_t)head_row,
                            (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* The 16-bit number of key 8·(j/8) + k, k = j % 8, in the call's output r. */
FA_HD uint32_t fa_dropout_number(fa_philox_u32x4 r, int k) { return (r.x[k >> 1] >> (16 * (k & 1))) & 0xFFFFu; }

/* Drop threshold of probability p in [0, 1): round(p · 65536) clamped to [0, 65535]; an element
 * is dropped iff its 16-bit number < threshold. */
FA_HD uint32_t fa_dropout_threshold(float p) {
    const double t = (double)p * 65536.0 + 0.5;
    return t < 1.0 ? 0u : t >= 65535.0 ? 65535u : (uint32_t)t;
}

/* 8 bits: bit k = key 8·(j/8) + k of the call's output r is kept (number >= threshold). The high
 * half of a word is compared as the word against threshold << 16, the low half after a shift. */
FA_HD uint32_t fa_dropout_keep_byte(fa_philox_u32x4 r, uint32_t threshold) {
    const uint32_t t_hi = threshold << 16;
    uint32_t bits = 0;
    for (int w = 0; w < 4; ++w)
        bits |= ((uint32_t)((r.x[w] << 16) >= t_hi) | ((uint32_t)(r.x[w] >= t_hi) << 1)) << (2 * w);
    return bits;
}

/* 1 if element (b, h, i, j) is kept. */
FA_HD int fa_dropout_keep(uint64_t seed, uint64_t offset, uint32_t threshold, int64_t b, int64_t h,
                          int64_t heads_q, int64_t i, int64_t j) {
    return fa_dropout_number(fa_dropout_bits8(seed, offset, b, h, heads_q, i, j), (int)(j & 7)) >= threshold;
}

/* x[t·stride] *= kept(b, h, i, j0 + t) ? keep_scale : 0 for t < n: one row of a tile, keys
 * j0 .. j0 + n - 1 (one Philox call per eight keys). */
FA_HD void fa_dropout_apply_row(uint64_t seed, uint64_t offset, uint32_t threshold, float keep_scale, int64_t b,
                                int64_t h, int64_t heads_q, int64_t i, int64_t j0, int64_t n, float *x,
                                int64_t stride) {
    uint32_t keep = fa_dropout_keep_byte(fa_dropout_bits8(seed, offset, b, h, heads_q, i, j0), threshold);
    for (int64_t t = 0; t < n; ++t) {
        const int64_t j = j0 + t;
        if (t > 0 && (j & 7) == 0) keep = fa_dropout_keep_byte(fa_dropout_bits8(seed, offset, b, h, heads_q, i, j), threshold);
        x[t * stride] *= (keep >> (j & 7)) & 1u ? keep_scale : 0.0f;
    }
}

#endif /* FA_PHILOX_H */
