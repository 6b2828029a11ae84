/*
 * bwd_bigsmem_tiles.h: tile sizes of the backward main kernel v2 (bwd_sm80_bigsmem.cuh, used on sm_90+),
 * pure functions of the head-dim bucket, usable from C and (constexpr) from CUDA. The v1 kernel
 * (sm_8x fallback) keeps bwd_tiles.h. History: docs/tuning-log.md (CUDA backward v2).
 *
 * Blocks (BLOCK_K keys of one (batch, kv head), BLOCK_Q query rows per iteration, 8 warps):
 *   d = 64:  128 × 128      d = 128: 128 × 64      d = 256: 64 × 64
 * Every 16-bit tile in shared memory is row-major with rows padded by 8 elements (16 bytes), so
 * eight consecutive rows start in eight different 16-byte bank groups (conflict-free ldmatrix)
 * and every fragment address is one per-lane base register plus an immediate.
 */
#ifndef FA_BWD_BIGSMEM_TILES_H
#define FA_BWD_BIGSMEM_TILES_H

#include <stddef.h>

#include "cuda/common/fwd_tiles.h"

/* Keys per block: 128, or 64 at d = 256 (the dK and dV accumulators of a block are
 * 2 × BLOCK_K × bucket fp32 values = 128 registers per thread at 256 threads for d = 128, 256). */
FA_TILES_FN int fa_bwd_bigsmem_block_k(int bucket) { return bucket == 256 ? 64 : bucket > 0 ? 128 : 0; }

/* Query rows per iteration: 128 at d = 64 (half the barriers per FLOP; the 32-query dQ tiles
 * need 128 rows to give 8 warps work), else 64. */
FA_TILES_FN int fa_bwd_bigsmem_block_q(int bucket) { return bucket == 64 ? 128 : bucket > 0 ? 64 : 0; }

/* Dynamic shared memory of one block, in bytes (2-byte elements, rows padded by 8):
 *   K, V              2 × BLOCK_K × (bucket + 8)
 *   Q, dO             2 stages × 2 × BLOCK_Q × (bucket + 8)
 *   P^T, dS^T         2 × BLOCK_K × (BLOCK_Q + 8)
 * plus 2 stages × 2 × BLOCK_Q fp32 (LSE in log2 units, D = rowsum(dO∘O)).
 * d = 64: 178 KiB, d = 128: 173 KiB, d = 256: 217 KiB: sm_90 only (227 KiB); on sm_80 (163 KiB)
 * the dispatcher keeps the v1 kernel. */
FA_TILES_FN size_t fa_bwd_bigsmem_smem_bytes(int bucket) {
    return bucket <= 0 ? 0
                       : (size_t)2 * ((size_t)2 * (size_t)fa_bwd_bigsmem_block_k(bucket) * (size_t)(bucket + 8) +
                                      (size_t)4 * (size_t)fa_bwd_bigsmem_block_q(bucket) * (size_t)(bucket + 8) +
                                      (size_t)2 * (size_t)fa_bwd_bigsmem_block_k(bucket) *
                                          (size_t)(fa_bwd_bigsmem_block_q(bucket) + 8)) +
                             (size_t)4 * 4 * (size_t)fa_bwd_bigsmem_block_q(bucket);
}

#endif /* FA_BWD_BIGSMEM_TILES_H */
