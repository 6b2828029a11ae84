/*
 * fa_philox.h: the attention-dropout random numbers, one definition for every engine (CPU, CUDA)
 * and for the test oracle. C11, and CUDA C++ (functions are host + device there).
 *
 * Generator: Philox4x32-7 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC
 * 2011): a counter-based generator, so any element's number is computed directly from its
 * coordinates, without state. The forward and the backward regenerate the same mask instead of
 * storing it. Seven rounds is the fewest the paper finds Crush-resistant (Philox4x32 passes
 * TestU01's BigCrush from 7 rounds; 10 is its default, kept as a safety margin) and the count
 * FlashAttention-4's dropout uses; the rounds are most of the integer work a dropout kernel adds
 * per element, so 7 instead of 10 takes 30 % of it away.
 *
 * Element (b, h, i, j) of the attention matrix (sequence b, query head h, query row i and key j
 * within the sequence, heads_q query heads) draws 8 bits:
 *   key     = (lo32(seed), hi32(seed))
 *   counter = (lo32(offset + j/16), hi32(offset + j/16), i, lo32(b·heads_q + h))
 *   number  = byte j % 16 of philox4x32_7(counter, key), byte k being bits 8·(k % 4) ..
 *             8·(k % 4) + 7 of word k / 4
 * so one Philox call serves sixteen neighbouring keys 16·(j/16) .. 16·(j/16) + 15 of a row. The
 * element is dropped iff number < threshold, threshold = round(p · 256) clamped to [0, 255]
 * (fa_dropout_threshold): it is kept with probability q = 1 - threshold / 256, i.e. p is
 * quantised to 1/256 (as FlashAttention-2's 8-bit numbers do). A kept element is scaled by
 * 1 / q = 256 / (256 - threshold) (fa_dropout_keep_scale), the inverse of the rate actually
 * kept, so E[Z] = 1 exactly and the dropout estimator stays unbiased after the quantisation
 * (1 / (1 - p) would be off by up to 0.2 % at p = 0.1). p < 1/512 rounds to threshold 0: nothing
 * is dropped and the scale is 1.
 * Calls sharing a seed get independent masks when their offsets differ by at least
 * ceil(seqlen_k / 16) (the counters they use do not overlap).
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

/* Rounds of the dropout generator (see above). */
#define FA_DROPOUT_PHILOX_ROUNDS 7

/* Philox4x32 with `rounds` rounds: counter c, key (k0, k1). Called with a constant, so the
 * loop unrolls. */
FA_HD fa_philox_u32x4 fa_philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                                    int rounds) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int round = 0; round < rounds; ++round) {
        if (round > 0) { /* the Weyl key schedule: golden ratio and sqrt(3) - 1 */
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
#ifdef __CUDA_ARCH__ /* the same words; from the 64-bit products ptxas added a zero to each high word */
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
#else
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
#endif
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

/* The sixteen 8-bit numbers of keys 16·(j/16) .. 16·(j/16) + 15 of element row (b, h, i): key
 * 16·(j/16) + k is byte k % 4 of word k / 4 (fa_dropout_number). */
FA_HD fa_philox_u32x4 fa_dropout_bits16(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t heads_q,
                                        int64_t i, int64_t j) {
    const uint64_t column = offset + (uint64_t)(j >> 4);
    const uint64_t head_row = (uint64_t)(b * heads_q + h);
    return fa_philox4x32((uint32_t)column, (uint32_t)(column >> 32), (uint32_t)i, (uint32_t)head_row,
                         (uint32_t)seed, (uint32_t)(seed >> 32), FA_DROPOUT_PHILOX_ROUNDS);
}

/* The 8-bit number of key 16·(j/16) + k, k = j % 16, in the call's output r. */
FA_HD uint32_t fa_dropout_number(fa_philox_u32x4 r, int k) { return (r.x[k >> 2] >> (8 * (k & 3))) & 0xFFu; }

/* Drop threshold of probability p in [0, 1): round(p · 256) clamped to [0, 255]; an element is
 * dropped iff its 8-bit number < threshold. */
FA_HD uint32_t fa_dropout_threshold(float p) {
    const double t = (double)p * 256.0 + 0.5;
    return t < 1.0 ? 0u : t >= 255.0 ? 255u : (uint32_t)t;
}

/* The factor of a kept element: 1 / (kept rate) = 256 / (256 - threshold). */
FA_HD float fa_dropout_keep_scale(uint32_t threshold) { return 256.0f / (float)(256u - threshold); }

/* 4 bits: bit k = byte k of w >= threshold, for the four bytes at once (SWAR). th7 = the
 * threshold's low 7 bits in every byte: (w | 0x80..) - th7 cannot borrow across bytes, and its
 * top bit per byte says low7(byte) >= low7(threshold). A byte with its top bit set is >= any
 * threshold < 128 and a byte without it is < any threshold >= 128, so with below128 = all ones
 * for a threshold < 128 (else 0) the top bit of (w & d) | ((w | d) & below128) (one LOP3) is
 * byte >= threshold; one multiply gathers the four top bits into bits 28-31 (their partial
 * products never collide). */
FA_HD uint32_t fa_dropout_keep_nibble(uint32_t w, uint32_t th7, uint32_t below128) {
    const uint32_t d = (w | 0x80808080u) - th7;
    const uint32_t ge = (w & d) | ((w | d) & below128);
    return ((ge & 0x80808080u) * 0x00204081u) >> 28;
}

/* 16 bits: bit k = key 16·(j/16) + k of the call's output r is kept (number >= threshold). */
FA_HD uint32_t fa_dropout_keep_bits16(fa_philox_u32x4 r, uint32_t threshold) {
    const uint32_t th7 = (threshold & 0x7Fu) * 0x01010101u;
    const uint32_t below128 = threshold < 128u ? 0xFFFFFFFFu : 0u;
    return fa_dropout_keep_nibble(r.x[0], th7, below128) | (fa_dropout_keep_nibble(r.x[1], th7, below128) << 4) |
           (fa_dropout_keep_nibble(r.x[2], th7, below128) << 8) |
           (fa_dropout_keep_nibble(r.x[3], th7, below128) << 12);
}

/* 1 if element (b, h, i, j) is kept. */
FA_HD int fa_dropout_keep(uint64_t seed, uint64_t offset, uint32_t threshold, int64_t b, int64_t h,
                          int64_t heads_q, int64_t i, int64_t j) {
    return fa_dropout_number(fa_dropout_bits16(seed, offset, b, h, heads_q, i, j), (int)(j & 15)) >= threshold;
}

/* x[t·stride] *= kept(b, h, i, j0 + t) ? keep_scale : 0 for t < n: one row of a tile, keys
 * j0 .. j0 + n - 1 (one Philox call per sixteen keys). */
FA_HD void fa_dropout_apply_row(uint64_t seed, uint64_t offset, uint32_t threshold, float keep_scale, int64_t b,
                                int64_t h, int64_t heads_q, int64_t i, int64_t j0, int64_t n, float *x,
                                int64_t stride) {
    uint32_t keep = fa_dropout_keep_bits16(fa_dropout_bits16(seed, offset, b, h, heads_q, i, j0), threshold);
    for (int64_t t = 0; t < n; ++t) {
        const int64_t j = j0 + t;
        if (t > 0 && (j & 15) == 0)
            keep = fa_dropout_keep_bits16(fa_dropout_bits16(seed, offset, b, h, heads_q, i, j), threshold);
        x[t * stride] *= (keep >> (j & 15)) & 1u ? keep_scale : 0.0f;
    }
}

#endif /* FA_PHILOX_H */
