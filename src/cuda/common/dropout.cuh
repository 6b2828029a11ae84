/*
 * dropout.cuh: the attention-dropout keep bits of mma.sync / wgmma accumulator fragments, for
 * the portable kernels' DROPOUT instantiations (fwd_sm80.cuh, bwd_sm80.cuh, bwd_sm80_bigsmem.cuh)
 * and the Hopper ones (fwd_sm90.cu, bwd_sm90.cu).
 *
 * The bits are those of src/api/fa_philox.h (fa_dropout_bits8: one Philox4x32-10 call gives the
 * 16-bit numbers of eight neighbouring keys 8k..8k+7 of one (sequence, query head, query row)),
 * so the CUDA mask equals the CPU engine's and the oracle's bit for bit.
 *
 * An m16n8 C fragment (lane = 4g + t holds rows g and g + 8, columns 2t and 2t + 1; element e is
 * row g + 8·(e >> 1), column 2t + (e & 1)) covers 16 × 8 = 128 elements = 16 Philox groups of
 * eight keys, so the functions work on PAIRS of n8 fragments (32 groups, one per lane): every lane
 * makes one call for a group of another lane's choosing and the 8-bit keep masks reach the lanes
 * that hold their elements through shuffles. No number is computed twice and no call's output is
 * thrown away. A wgmma accumulator of one warp is, per 8 columns, exactly such a fragment.
 * Both functions return 8 bits: bit 4c + e = element e of fragment c (c = 0, 1) of this lane.
 */
#ifndef FA_CUDA_DROPOUT_CUH
#define FA_CUDA_DROPOUT_CUH

#include <stdint.h>

#include "api/fa_philox.h"
#include "cuda/common/cuda_common.cuh"

/* 8 bits: bit k = key 8·(j/8) + k of row (b, h, i) is kept. */
__device__ __forceinline__ uint32_t fa_dropout_keep_row8(const fa_dropout_params &dp, int b, int h, int heads_q, int i,
                                                         int j) {
    return fa_dropout_keep_byte(fa_dropout_bits8(dp.seed, dp.offset, b, h, heads_q, i, j), dp.threshold);
}

/* Two fragments whose rows are queries and columns keys (the forward's S): rows query0 ..
 * query0 + 15, fragment c = keys key0 + 8c .. + 7 (key0 a multiple of 8).
 * Lane (g, t) draws row g + 8·(t & 1), keys of fragment t >> 1: the four lanes of a quad draw
 * exactly the four groups the quad needs (rows g, g + 8 of both fragments), so two exchanges
 * give each lane all four bytes; it keeps bits 2t, 2t + 1 of each. */
__device__ __forceinline__ uint32_t fa_dropout_keep_qk2(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                        int query0, int key0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t all = fa_dropout_keep_row8(dp, b, h, heads_q, query0 + g + 8 * (t & 1), key0 + 8 * (t >> 1)) << (8 * t);
    all |= __shfl_xor_sync(0xffffffffu, all, 1);
    all |= __shfl_xor_sync(0xffffffffu, all, 2); /* byte 2c + r: row g + 8r of fragment c */
    const uint32_t mine = all >> (2 * t);        /* bits 8B, 8B + 1: this lane's columns of byte B */
    return (mine & 3u) | ((mine >> 6) & 0xCu) | ((mine >> 12) & 0x30u) | ((mine >> 18) & 0xC0u);
}

/* Two transposed fragments, rows keys and columns queries (the backward's Sᵀ): rows key0 ..
 * key0 + 15 (key0 a multiple of 8: rows 0-7 and 8-15 are one group each per query), fragment
 * c = queries query0 + 8c .. + 7. The eight lanes g = 0..7 of one t need the same eight groups
 * (query 8c + 2t + x, key half r, for c, r, x in {0, 1}), each one bit of every group (key g of
 * the half): lane g draws group i = 4c + 2r + x = g, and an 8 × 8 bit transpose over those
 * lanes (three exchanges at lane distances 4, 8, 16, each swapping one bit of the lane's g with
 * one bit of the group index) leaves bit i = key g of group i, which is element e = 2r + x of
 * fragment c: bit 4c + e. */
__device__ __forceinline__ uint32_t fa_dropout_keep_kq2(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                        int key0, int query0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t v = fa_dropout_keep_row8(dp, b, h, heads_q, query0 + 8 * (g >> 2) + 2 * t + (g & 1),
                                      key0 + 8 * ((g >> 1) & 1));
#pragma unroll
    for (int s = 1; s < 8; s *= 2) {
        const uint32_t low = s == 1 ? 0x55u : s == 2 ? 0x33u : 0x0Fu; /* bits whose index has bit s clear */
        const uint32_t other = __shfl_xor_sync(0xffffffffu, v, 4 * s);
        v = (g & s) ? (v & ~low & 0xFFu) | ((other & ~low & 0xFFu) >> s) : (v & low) | ((other & low) << s);
    }
    return v;
}

#endif /* FA_CUDA_DROPOUT_CUH */
