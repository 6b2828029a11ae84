/*
 * fwd_tiles.h: tile sizes and launch heuristics of the portable CUDA forward kernels, as pure
 * functions of the problem, usable from C (host code, tests) and from CUDA (where the kernels
 * take them as compile-time constants; in C++ they are constexpr).
 *
 * The forward kernels (fwd_sm80.cuh) use mma.sync m16n8k16 (sm_80 and newer, also
 * what runs on sm_90 here). One block owns BLOCK_M query rows of one (batch, head); each warp owns
 * BLOCK_M / warps of those rows and streams all BLOCK_N-key tiles of K and V through shared memory.
 */
#ifndef FA_TILES_H
#define FA_TILES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define FA_TILES_FN static constexpr inline
#else
#define FA_TILES_FN static inline
#endif

/* Head-dim buckets the forward kernels are compiled for: 64, 128, 256, and for large heads 512
 * (d, dv <= 512: Gemma-class heads) and 576 (d <= 576, dv <= 512: DeepSeek MLA's absorbed
 * 576 / 512). Below 512, d and dv are padded up to the bucket of max(d, dv) by zero-filled loads
 * (pad columns are never stored); bucket 576 pads q/k to 576 and v/o to 512 (fa_fwd_bucket_dv).
 * Few buckets keep CI's build short (2 dtypes × buckets × 2 archs); d = 96 or 192 pay the
 * padding (33%). Returns 0 when no bucket fits. */
FA_TILES_FN int fa_fwd_hdim_bucket(int head_dim, int head_dim_v) {
    return (head_dim > head_dim_v ? head_dim : head_dim_v) <= 64    ? 64
           : (head_dim > head_dim_v ? head_dim : head_dim_v) <= 128 ? 128
           : (head_dim > head_dim_v ? head_dim : head_dim_v) <= 256 ? 256
           : (head_dim <= 512 && head_dim_v <= 512)                 ? 512
           : (head_dim <= 576 && head_dim_v <= 512)                 ? 576
                                                                    : 0;
}

/* Padded width of v and o in a bucket: the bucket, except 512 for bucket 576. */
FA_TILES_FN int fa_fwd_bucket_dv(int bucket) { return bucket == 576 ? 512 : bucket; }

/* Warps sharing one query row's O columns: 2 for the large-head buckets (512, 576), else 1. A warp
 * holding 16 rows × 512 columns of O would need 256 fp32 registers per thread, so the two warps
 * of a row group each keep half of dv's columns; they split the k16 steps of S = Q Kᵀ between
 * them and add each other's partial scores (exchanged through shared memory), so both hold the
 * same scores and run the same softmax. */
FA_TILES_FN int fa_fwd_dv_split(int bucket) { return bucket >= 512 ? 2 : 1; }

/* Query rows per block: 128 (sm_80/sm_90: with 4 warps that is 32 rows per warp, so every K/V
 * fragment read from shared memory feeds two m16 MMAs; at 16 rows per warp the ldmatrix traffic
 * alone would cap an SM at about 2048 FLOP/clock); 64 for the large-head buckets (4 row groups
 * of 16 rows × 2 column halves). */
FA_TILES_FN int fa_fwd_block_m(int bucket) { return bucket >= 512 ? 64 : bucket > 0 ? 128 : 0; }

/* Keys per K/V tile: 64. (sm_80/sm_90: 64 keys × 32 rows keep the S accumulator at 64 fp32
 * registers per thread next to the O accumulator of up to 128, under the 255-register limit.)
 * 32 for the large-head buckets, so that one K and one V tile fit next to Q: 150 KiB at 512
 * (an A100's 163 KiB), 166 KiB at 576 (sm_90's 227 KiB). */
FA_TILES_FN int fa_fwd_block_n(int bucket) { return bucket >= 512 ? 32 : bucket > 0 ? 64 : 0; }

/* Warps per block: 4, except 8 for d >= 256 (16 rows per warp: the O accumulator of 32 rows × 256
 * columns would need 256 registers per thread; at 512 the pairs of fa_fwd_dv_split). */
FA_TILES_FN int fa_fwd_warps(int bucket) { return bucket >= 256 ? 8 : 4; }

/* Q fragments live in registers for the whole K/V loop when they are small (d <= 64: 32
 * registers per thread); larger Q tiles stay in shared memory and are re-read with ldmatrix each
 * tile (their registers are needed by the O accumulator). */
FA_TILES_FN int fa_fwd_q_in_regs(int bucket) { return bucket <= 64; }

/* K/V shared-memory stages: 2 (load tile j+1 while computing tile j) for d <= 128. For d >= 256 one
 * stage per tensor (V_j loads while S_j is computed, K_{j+1} while P_j·V_j is), so that the block
 * fits the 163 KiB of an A100 (sm_80): Q 64 KiB + K 32 KiB + V 32 KiB. */
FA_TILES_FN int fa_fwd_kv_stages(int bucket) { return bucket >= 256 ? 1 : 2; }

/* Dynamic shared memory of one block: the Q tile (reused to stage O for 16-byte stores) plus the
 * K and V stages (V tiles have q/k's row pitch), 2 bytes per element, plus the fp32 row sums of
 * the online softmax (2 rows per lane per m16 tile: 4·block_m·dv_split floats), two 64-bit load
 * pointers per thread and, with a dv split, the partial-score exchange (every warp's 16 rows ×
 * block_n fp32 per m16 tile) (fwd_sm80.cuh). */
FA_TILES_FN size_t fa_fwd_smem_bytes(int bucket) {
    return (size_t)2 * ((size_t)fa_fwd_block_m(bucket) * (size_t)bucket +
                        (size_t)fa_fwd_kv_stages(bucket) * 2 * (size_t)fa_fwd_block_n(bucket) *
                            (size_t)bucket) +
           (size_t)16 * (size_t)fa_fwd_block_m(bucket) * (size_t)fa_fwd_dv_split(bucket) +
           (size_t)16 * 32 * (size_t)fa_fwd_warps(bucket) +
           (fa_fwd_dv_split(bucket) > 1 ? (size_t)4 * (size_t)fa_fwd_block_m(bucket) * (size_t)fa_fwd_dv_split(bucket) *
                                              (size_t)fa_fwd_block_n(bucket)
                                        : 0);
}

/* Launch order: with a bounded right side and unbounded left side (causal), later query blocks
 * see more keys; launching them first (longest-processing-time first) shortens the tail of the
 * last wave. Otherwise consecutive blocks share one (batch, head), so its K/V stay in L2. */
FA_TILES_FN int fa_fwd_heavy_first(int window_left, int window_right) {
    return window_right >= 0 && window_left < 0;
}

/* Heavy-first order in head groups (the Hopper forward's tiles under causal-like masks): the
 * (batch, head) units are taken in groups of `group` consecutive ones (the last group may be
 * smaller); within a group the query blocks run from the last (the most keys) to the first, the
 * unit varying fastest. Tiles of one group run at the same time and share their K/V in L2: the
 * same order over all units at once (group = units) puts a different unit's K/V on every
 * multiprocessor, and at b8 h16 s2k d128 causal read 1.04 GB from DRAM per call against 0.20 GB
 * for groups of 8 (ncu), which cost ~18 % of the SM clock under the power cap (docs/tuning-log.md). */
typedef struct fa_tile_pos {
    int64_t unit; /* batch · heads + head                                                    */
    int m_block;  /* query block (BLOCK_M rows)                                              */
} fa_tile_pos;

FA_TILES_FN fa_tile_pos fa_fwd_grouped_tile(int64_t t, int64_t units, int num_m_blocks, int group) {
    const int64_t per_group = (int64_t)group * num_m_blocks;
    const int64_t g = t / per_group, r = t % per_group;
    const int64_t size = units - g * group < group ? units - g * group : group;
    fa_tile_pos pos = {g * group + r % size, num_m_blocks - 1 - (int)(r / size)};
    return pos;
}

/* Units per group: enough that a group's longest tiles fill the multiprocessors once
 * (ceil(sm_count / num_m_blocks), at least 1). Measured on the H200 (b·s = 16k causal): groups of
 * 4, 8 and 16 within 2 % of each other at s = 2k/4k, 4 better than 16 by 4 % at 8k. */
FA_TILES_FN int fa_fwd_head_group(int num_m_blocks, int sm_count) {
    return num_m_blocks <= 0 || sm_count <= num_m_blocks ? 1 : (sm_count + num_m_blocks - 1) / num_m_blocks;
}

#endif /* FA_TILES_H */
