/*
 * dropout.cuh: the attention-dropout keep bits of mma.sync accumulator fragments, for the
 * portable kernels' DROPOUT instantiations (fwd_sm80.cuh, bwd_sm80.cuh, bwd_sm80_bigsmem.cuh).
 *
 * The bits are those of src/api/fa_philox.h (fa_dropout_bits4: one Philox4x32-10 call gives the
 * 32-bit numbers of four neighbouring keys 4k..4k+3 of one (sequence, query head, query row)),
 * so the CUDA mask equals the CPU engine's and the oracle's bit for bit.
 *
 * An m16n8 C fragment (lane = 4g + t holds rows g and g + 8, columns 2t and 2t + 1; element e is
 * row g + 8·(e >> 1), column 2t + (e & 1)) covers 16 × 8 = 128 elements = 32 Philox groups of
 * four keys, one per lane: every lane makes one call for the group of another lane's choosing
 * and the four numbers reach the lanes that hold their elements through shuffles of 4-bit keep
 * masks. No number is computed twice and no call's output is thrown away.
 */
#ifndef FA_CUDA_DROPOUT_CUH
#define FA_CUDA_DROPOUT_CUH

#include <stdint.h>

#include "api/fa_philox.h"
#include "cuda/common/cuda_common.cuh"

/* 4 bits: bit k = key 4·(j/4) + k of row (b, h, i) is kept (fa_dropout_bits4 >= threshold). */
__device__ __forceinline__ uint32_t fa_dropout_keep_nibble(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                           int i, int j) {
    const fa_philox_u32x4 r = fa_dropout_bits4(dp.seed, dp.offset, b, h, heads_q, i, j);
    return (uint32_t)(r.x[0] >= dp.threshold) | ((uint32_t)(r.x[1] >= dp.threshold) << 1) |
           ((uint32_t)(r.x[2] >= dp.threshold) << 2) | ((uint32_t)(r.x[3] >= dp.threshold) << 3);
}

/* Keep bits of one m16n8 fragment whose rows are queries and columns keys (the forward's S):
 * row 0 is query `query0` of the sequence, column 0 key `key0` (a multiple of 4). Returns bit e
 * = element e of this lane is kept.
 * Lane (g, t) computes the group of row g + 8·(t & 1), keys key0 + 4·(t >> 1)..+3: lanes t and
 * t ^ 1 need the same two groups (rows g and g + 8, their keys 2t, 2t + 1 inside one group of
 * four), so one exchange between them gives each its 4 bits. */
__device__ __forceinline__ uint32_t fa_dropout_keep_qk(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                       int query0, int key0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t own = fa_dropout_keep_nibble(dp, b, h, heads_q, query0 + g + 8 * (t & 1), key0 + 4 * (t >> 1))
                         << (4 * (t & 1));
    const uint32_t both = own | __shfl_xor_sync(0xffffffffu, own, 1); /* nibble of row g + 8·r at bit 4r */
    const int sel = 2 * (t & 1);                                       /* keys 2t, 2t+1 in the group */
    return ((both >> sel) & 3u) | (((both >> (4 + sel)) & 3u) << 2);
}

/* The same for a transposed fragment, rows keys and columns queries (the backward's S^T): row 0
 * is key `key0` (a multiple of 4: rows 0-3, 4-7, 8-11, 12-15 are one group each), column 0
 * query `query0`. Lane (g, t), g = 4a + r, computes the group of keys key0 + 4·(a +
 * 2·(r >> 1))..+3 at query query0 + 2t + (r & 1): the four lanes r = 0..3 of one (a, t) need
 * exactly those four groups (rows 4a + r and 4a + r + 8 at queries 2t, 2t + 1), each element at
 * position r; two exchanges give every lane all four nibbles. */
__device__ __forceinline__ uint32_t fa_dropout_keep_kq(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                       int key0, int query0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int a = g >> 2, r = g & 3;
    uint32_t all = fa_dropout_keep_nibble(dp, b, h, heads_q, query0 + 2 * t + (r & 1), key0 + 4 * (a + 2 * (r >> 1)))
                   << (4 * r);
    all |= __shfl_xor_sync(0xffffffffu, all, 4); /* lanes g ^ 1 */
    all |= __shfl_xor_sync(0xffffffffu, all, 8); /* lanes g ^ 2: now nibble s (element e = s) at 4s */
    return ((all >> r) & 1u) | (((all >> (4 + r)) & 1u) << 1) | (((all >> (8 + r)) & 1u) << 2) |
           (((all >> (12 + r)) & 1u) << 3);
}

#endif /* FA_CUDA_DROPOUT_CUH */
