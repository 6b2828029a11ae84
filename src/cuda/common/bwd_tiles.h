/*
 * bwd_tiles.h: tile sizes and launch heuristics of the portable CUDA backward kernels, as pure
 * functions of the problem, usable from C (host code, tests) and from CUDA (constexpr in C++, so
 * the kernel templates take them as compile-time constants).
 *
 * The backward main kernel (bwd_sm80.cuh) uses mma.sync m16n8k16 (sm_80 and newer).
 * One block owns BLOCK_K keys of one (batch, kv head) and keeps K, V and the dK, dV accumulators
 * on chip while it loops over the query blocks (BLOCK_Q rows) of every query head of the group.
 * Its 8 warps are split in two ways:
 *   S^T = K Q^T, dP^T = V dO^T:  warp (wk, wq) owns keys 16wk..16wk+15 × queries of half wq;
 *   dV += P^T dO, dK += dS^T Q:  warp (wk, wq) owns the same keys × head-dim columns of part wq;
 *   dQ = dS K:                   warp (wr, wc) owns queries 16wr.. × head-dim columns of half wc.
 * SPLIT_D = number of parts wq. With SPLIT_D = 1 a warp's P^T and dS^T rows never leave its
 * registers for the dV/dK products (only dS^T goes to shared memory, for dQ).
 */
#ifndef FA_BWD_TILES_H
#define FA_BWD_TILES_H

#include <stddef.h>

#include "cuda/common/fwd_tiles.h"

/* Head-dim bucket (64, 128, 256, 512, 576) of max(d, dv), the forward's buckets (d and dv are
 * zero-padded up to it; at 576, v and dO tiles have q/k's row pitch too); 0 when none fits. */
FA_TILES_FN int fa_bwd_hdim_bucket(int head_dim, int head_dim_v) {
    return fa_fwd_hdim_bucket(head_dim, head_dim_v);
}

/* Warps per block: 8 (256 threads) for every bucket. */
FA_TILES_FN int fa_bwd_warps(int bucket) { return bucket > 0 ? 8 : 0; }

/* SPLIT_D (see above): 1 for d <= 128, 2 for d = 256, 4 for d = 512 and 576. The dK and dV
 * accumulators of a warp are 16 keys × bucket/SPLIT_D columns each, bucket/(2·SPLIT_D) fp32
 * registers per thread each: 64 + 64 at d = 128, 72 + 72 at 576 (144 columns, of dv's 512 the
 * last warp holds 80). At d = 256 one warp cannot hold 16 keys × 256 columns twice (256
 * registers), so the columns are split and P^T, dS^T are exchanged through shared memory. */
FA_TILES_FN int fa_bwd_split_d(int bucket) { return bucket >= 512 ? 4 : bucket >= 256 ? 2 : 1; }

/* Keys per block: 16 per key-warp, so 128 for d <= 128, 64 for d = 256 and 32 for d >= 512. */
FA_TILES_FN int fa_bwd_block_k(int bucket) {
    return bucket > 0 ? 16 * (fa_bwd_warps(bucket) / fa_bwd_split_d(bucket)) : 0;
}

/* Query rows per iteration: 64 (S^T and dP^T tiles of 16 keys × 64 queries are 32 fp32
 * registers each per thread, next to the 128 of dK and dV at d = 128). */
#ifndef FA_BWD_BLOCK_Q_D64
#define FA_BWD_BLOCK_Q_D64 64 /* lab knob: query rows per iteration at d <= 64 */
#endif
FA_TILES_FN int fa_bwd_block_q(int bucket) {
    return bucket <= 0 ? 0 : bucket <= 64 ? FA_BWD_BLOCK_Q_D64 : 64;
}

/* Shared-memory stages of the Q, dO, LSE and D tiles: 2 (the next query block loads while this
 * one computes), 1 at d >= 512 (two 64-row stages of Q and dO alone would take 256 KiB; the next
 * block's loads then overlap the dQ product only). */
FA_TILES_FN int fa_bwd_q_stages(int bucket) { return bucket >= 512 ? 1 : 2; }

/* Dynamic shared memory of one main-kernel block, in bytes (2-byte elements):
 *   K, V tiles          2 × BLOCK_K × bucket
 *   Q, dO tiles         stages × 2 × BLOCK_Q × bucket
 *   dS^T (and P^T when SPLIT_D > 1)   BLOCK_K × BLOCK_Q each
 * plus stages × 2 × BLOCK_Q fp32 for LSE (log2 units) and D = rowsum(dO∘O).
 * d = 64: 81 KiB, d = 128: 145 KiB (both fit sm_80's 163 KiB opt-in limit; sm_86/sm_89's 99 KiB
 * fits only d = 64), d = 256: 209 KiB, d = 512: 200.5 KiB, d = 576: 224.5 KiB (sm_90's 227 KiB
 * only). */
FA_TILES_FN size_t fa_bwd_smem_bytes(int bucket) {
    return bucket <= 0 ? 0
                       : (size_t)2 * (2 * (size_t)fa_bwd_block_k(bucket) * (size_t)bucket +
                                      2 * (size_t)fa_bwd_q_stages(bucket) * (size_t)fa_bwd_block_q(bucket) *
                                          (size_t)bucket +
                                      (size_t)(fa_bwd_split_d(bucket) > 1 ? 2 : 1) *
                                          (size_t)fa_bwd_block_k(bucket) *
                                          (size_t)fa_bwd_block_q(bucket)) +
                             (size_t)2 * 4 * (size_t)fa_bwd_q_stages(bucket) * (size_t)fa_bwd_block_q(bucket);
}

/* Query heads of a GQA group handled by one block. A block sums dK/dV over all the query heads it
 * handles on chip; when (key blocks × batch × kv heads) alone would leave most multiprocessors
 * idle, the group is split across blocks (each writes fp32 partial dK/dV, summed afterwards in a
 * fixed order). Returns the number of splits (1 = no split). */
FA_TILES_FN int fa_bwd_group_splits(long long key_blocks, long long batch, long long heads_kv,
                                    long long group, int sm_count) {
    long long blocks = key_blocks * batch * heads_kv;
    if (group <= 1 || blocks <= 0 || blocks >= sm_count) return 1;
    long long want = (sm_count + blocks - 1) / blocks;
    if (want > group) want = group;
    long long per_split = (group + want - 1) / want; /* heads per block, rounded so splits are even */
    return (int)((group + per_split - 1) / per_split);
}

/* Deterministic mode: each block owns one fp32 dQ buffer ("split") and walks the key blocks
 * split, split + splits, ... in order, so every dQ element is summed by one thread in a fixed
 * order; the buffers are then summed in a fixed order. Enough splits to give every
 * multiprocessor one block, at most one per key block. Memory: splits × total_q × heads_q × d × 4
 * bytes. */
FA_TILES_FN int fa_bwd_deterministic_splits(long long key_blocks, long long batch_heads_splits,
                                            int sm_count) {
    long long s = batch_heads_splits <= 0 ? 1 : (sm_count + batch_heads_splits - 1) / batch_heads_splits;
    if (s > key_blocks) s = key_blocks;
    return s < 1 ? 1 : (int)s;
}

#endif /* FA_BWD_TILES_H */
