/*
 * dropout.cuh: the attention-dropout keep bits of mma.sync / wgmma accumulator fragments, for
 * the portable kernels' DROPOUT instantiations (fwd_sm80.cuh, bwd_sm80.cuh, bwd_sm80_bigsmem.cuh)
 * and the Hopper ones (fwd_sm90.cu, bwd_sm90.cu, bwd_sm90_hdim256.cu).
 *
 * The bits are those of src/api/fa_philox.h (fa_dropout_bits16: one Philox4x32-7 call gives the
 * 8-bit numbers of sixteen neighbouring keys 16k..16k+15 of one (sequence, query head, query
 * row)), so the CUDA mask equals the CPU engine's and the oracle's bit for bit.
 *
 * An m16n8 C fragment (lane = 4g + t holds rows g and g + 8, columns 2t and 2t + 1; element e is
 * row g + 8·(e >> 1), column 2t + (e & 1)) covers 128 elements = 8 Philox groups of sixteen keys,
 * so the functions work on FOUR n8 fragments (32 groups, one per lane): every lane makes one
 * call for a group of another lane's choosing and the keep bits reach the lanes that hold their
 * elements through shuffles. No number is computed twice and no call's output is thrown away
 * (fa_dropout_keep_qk2, for a tile of 16 keys left over, is the one exception: 16 groups, each
 * drawn by two lanes). A wgmma accumulator of one warp is, per 8 columns, exactly such a fragment.
 * The functions return 4 bits per fragment: bit 4c + e = element e of fragment c of this lane.
 */
#ifndef FA_CUDA_DROPOUT_CUH
#define FA_CUDA_DROPOUT_CUH

#include <stdint.h>

#include "api/fa_philox.h"
#include "cuda/common/cuda_common.cuh"

/* 16 bits: bit k = key 16·(j/16) + k of row (b, h, i) is kept. */
__device__ __forceinline__ uint32_t fa_dropout_keep_row16(const fa_dropout_params &dp, int b, int h, int heads_q, int i,
                                                          int j) {
    return fa_dropout_keep_bits16(fa_dropout_bits16(dp.seed, dp.offset, b, h, heads_q, i, j), dp.threshold);
}

/* The four bits of lane t from a word holding the 16-key groups of rows g (bits 0-15) and g + 8
 * (bits 16-31) already shifted right by 2t: bits 16r + 8c + x (row g + 8r, fragment c of the
 * group, column 2t + x) go to bit 4c + 2r + x. */
__device__ __forceinline__ uint32_t fa_dropout_pick_qk(uint32_t s) {
    return (s & 3u) | ((s >> 14) & 0xCu) | ((s >> 4) & 0x30u) | ((s >> 18) & 0xC0u);
}

/* Four fragments whose rows are queries and columns keys (the forward's S): fragment c covers
 * rows query0 + (c >> 1)·dq .. + 15 and keys key0 + (c >> 1)·dk + 8·(c & 1) .. + 7 (key0 and dk
 * multiples of 16): dq = 0, dk = 16 are four fragments side by side (32 keys), dq = 16, dk = 0
 * two m16 row tiles of 16 keys. The 32 groups are (row, fragment half h = c >> 1); the four
 * lanes of a quad need exactly the four groups of rows g, g + 8 and both halves, so lane t draws
 * row g + 8·(t & 1) of half t >> 1: the exchange with lane t ^ 1 pairs the two rows of a half in
 * one word, the one with lane t ^ 2 brings the other half's word; each lane then picks its
 * columns 2t, 2t + 1 of each 8-key fragment. */
__device__ __forceinline__ uint32_t fa_dropout_keep_qk4(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                        int query0, int key0, int dq = 0, int dk = 16) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r = t & 1, half = t >> 1;
    uint32_t mine = fa_dropout_keep_row16(dp, b, h, heads_q, query0 + half * dq + g + 8 * r, key0 + half * dk)
                    << (16 * r);
    mine |= __shfl_xor_sync(0xffffffffu, mine, 1);
    const uint32_t other = __shfl_xor_sync(0xffffffffu, mine, 2);
    const uint32_t w0 = half ? other : mine, w1 = half ? mine : other;
    return fa_dropout_pick_qk(w0 >> (2 * t)) | (fa_dropout_pick_qk(w1 >> (2 * t)) << 8);
}

/* Two fragments of S (rows query0 .. + 15, keys key0 .. key0 + 15, key0 a multiple of 16): 16
 * groups for 32 lanes, so lanes t and t ^ 2 draw the same row g + 8·(t & 1) and one exchange
 * (with lane t ^ 1) pairs the rows. For a tile whose width is an odd multiple of 16 keys. */
__device__ __forceinline__ uint32_t fa_dropout_keep_qk2(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                        int query0, int key0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r = t & 1;
    uint32_t mine = fa_dropout_keep_row16(dp, b, h, heads_q, query0 + g + 8 * r, key0) << (16 * r);
    mine |= __shfl_xor_sync(0xffffffffu, mine, 1);
    return fa_dropout_pick_qk(mine >> (2 * t));
}

/* Four transposed fragments, rows keys and columns queries (the backward's Sᵀ): fragment c
 * covers keys key0 + (c >> 1)·dk .. + 15 (one group per query column; key0, dk multiples of 16)
 * and queries query0 + (c >> 1)·dq + 8·(c & 1) .. + 7: dk = 0, dq = 16 are four fragments side
 * by side (32 queries), dk = 16, dq = 0 two m16 key tiles of 16 queries. The eight lanes g =
 * 0..7 of one t need the same eight groups (fragment c, query column 2t + x: index i = 2c + x),
 * each two bits of every group (keys g and g + 8: row g of the low byte, of the high byte), so
 * lane g draws group i = g and an 8 × 8 bit transpose over those lanes, of both bytes at once
 * (three exchanges at lane distances 4, 8, 16, each swapping one bit of the lane's g with one
 * bit of the bit index), leaves bit i of byte r = key g + 8r of group i, which then spreads to
 * bit 4c + 2r + x. */
__device__ __forceinline__ uint32_t fa_dropout_keep_kq4(const fa_dropout_params &dp, int b, int h, int heads_q,
                                                        int key0, int query0, int dk = 0, int dq = 16) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int c = g >> 1, x = g & 1;
    uint32_t v = fa_dropout_keep_row16(dp, b, h, heads_q, query0 + (c >> 1) * dq + 8 * (c & 1) + 2 * t + x,
                                       key0 + (c >> 1) * dk);
#pragma unroll
    for (int s = 1; s < 8; s *= 2) {
        const uint32_t low = s == 1 ? 0x5555u : s == 2 ? 0x3333u : 0x0F0Fu; /* bits whose index has bit s clear */
        const uint32_t other = __shfl_xor_sync(0xffffffffu, v, 4 * s);
        v = (g & s) ? (v & ~low & 0xFFFFu) | ((other & ~low & 0xFFFFu) >> s) : (v & low) | ((other & low) << s);
    }
    uint32_t w = (v & 0xFFu) | ((v & 0xFF00u) << 8); /* byte r at bits 16r ..                 */
    w = (w | (w << 4)) & 0x0F0F0F0Fu;                /* bit pairs i/2 of each byte 4 bits apart */
    w = (w | (w << 2)) & 0x33333333u;
    return (w | (w >> 14)) & 0xFFFFu;
}

#endif /* FA_CUDA_DROPOUT_CUH */
