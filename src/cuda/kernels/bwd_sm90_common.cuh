/*
 * bwd_sm90_common.cuh: what the two Hopper backward kernels share: bwd_sm90.cu (buckets
 * 64 and 128: each consumer warpgroup owns 64 keys) and bwd_sm90_hdim256.cu (bucket 256: both
 * consumers share 64 keys, each owns 128 head-dim columns). The kernel arguments, the mbarrier
 * wait, the query range of a key block, the varlen row zeroing, the Sᵀ / dPᵀ GEMM (K-major A and
 * B over the head dim), the packing of an accumulator into A fragments, and on the host the TMA
 * maps, the arguments and the shared-memory opt-in. Every kernel configuration `Cfg` these
 * templates take names D, BLOCK_M, KV_SLAB_BYTES and Q_SLAB_BYTES as its file comment describes.
 * Included only by *_sm90a.cu files (sm_90a code).
 */
#ifndef FA_BWD_HOPPER_COMMON_CUH
#define FA_BWD_HOPPER_COMMON_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common/bwd_launch.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/mods.cuh"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/tma.h"

/* Kernel arguments besides the tensor maps: the backward's parameter block (bwd_launch.h; window
 * sides -1 = unbounded, causal folded in; lse is the forward's; dq_accum tiled at buckets 64 and
 * 128 and for 192 / 128, head-major [heads_q, total_q, d] at 256 (sm90_tiles.h,
 * fa_hopper_bwd_dq_tile_cols); dq_semaphore set in deterministic mode) and the query-block count
 * of the kernel's BLOCK_M. */
struct fa_bwd_sm90_params : fa_bwd_params {
    int query_blocks;              /* ceil(seqlen_q / BLOCK_M)                                      */
    int64_t dq_tiles;              /* tiled dQ accumulator: tiles per query head (fa_hopper_bwd_dq_tiles) */
    int dkdv_tma;                  /* dK and dV out through the TMA store (fa_bwd_sm90_dkdv_maps)   */
    int rotate_walk;               /* rotated query walks (fa_bwd_sm90_walk_of; host: fa_hopper_bwd_rotate) */
};

/* The query heads a CTA walks: blockIdx.y = kv head · group_splits + split, and split s takes
 * the heads_per_split consecutive query heads from (kv head · group + s · heads_per_split) =
 * blockIdx.y · heads_per_split (group_splits divides the group; 1: the whole group, dK and dV
 * written in the output dtype; > 1: each split writes fp32 partials that bwd.cu sums). Every CTA
 * has heads_per_split · n_m iterations, a product of a parameter, as with the whole group. */
struct fa_bwd_sm90_heads {
    int kv, split; /* kv head; split of its group  */
    int first;     /* first query head             */
};

__device__ __forceinline__ fa_bwd_sm90_heads fa_bwd_sm90_cta_heads(const fa_bwd_sm90_params &prm) {
    fa_bwd_sm90_heads h;
    h.kv = (int)blockIdx.y / prm.group_splits;
    h.split = (int)blockIdx.y % prm.group_splits;
    h.first = (int)blockIdx.y * prm.heads_per_split;
    return h;
}

/* The iterations (query head h, query block `tile` of a fa_mods_q_pos) a CTA walks, heads
 * ascending and blocks ascending within a head: every head's blocks [m_first, m_first + n_m) of the query range; with a block mask (the
 * MODS instantiations, `listed`) the query blocks the block map lists for this key block instead
 * (common/mods.cuh's fa_mods_q_walk, one map entry per query block of BLOCK_M rows: block_q is a
 * multiple of BLOCK_M). The producer and the dQ writer each walk them with fa_bwd_sm90_iter_first /
 * _next; the consumers read each iteration's position from the slot the producer wrote beside its
 * stage (fa_bwd_sm90_load), so the map's loads stay off their path. */
struct fa_bwd_sm90_iters {
    int h_begin, m_first, n_m;
    bool listed;
    fa_mods_q_walk walk; /* listed only */
};
__device__ __forceinline__ fa_mods_q_pos fa_bwd_sm90_iter_first(const fa_bwd_sm90_iters &it) {
    if (it.listed) return fa_mods_first_q_tile(it.walk, it.h_begin);
    return fa_mods_q_pos{it.h_begin, it.m_first, 0, 0};
}
__device__ __forceinline__ void fa_bwd_sm90_iter_next(const fa_bwd_sm90_iters &it, fa_mods_q_pos &p) {
    if (it.listed) {
        fa_mods_next_q_tile(it.walk, it.h_begin, p);
    } else if (++p.tile == it.m_first + it.n_m) {
        p.tile = it.m_first;
        ++p.h;
    }
}

/* ---- device functions ------------------------------------------------------------------------ */

template <bool BF16>
__device__ __forceinline__ uint32_t fa_bwd_sm90_pack2(float lo, float hi) {
    return BF16 ? cvt_rn_bf16x2_f32(lo, hi) : cvt_rn_f16x2_f32(lo, hi);
}

/* dK (scaled) and dV rows key0 and key0 + 8 of this thread straight to global memory (both
 * kernels): COLS accumulator columns, element 4j + 2h + c is row key0 + 8h, column
 * col0 + 8j + col_in + c; columns below d / dv, 4-byte stores; keys past the sequence skipped.
 * varlen: prm.cu_seqlens_q != nullptr. */
template <int COLS, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_store_dkdv_rows(const fa_bwd_sm90_params &prm, const float (&dk_rmem)[COLS / 2],
                                                            const float (&dv_rmem)[COLS / 2], int key0, int len_k,
                                                            int64_t k_start, int batch, int head_kv, int col0,
                                                            int col_in, bool varlen) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h;
        if (key >= len_k) continue;
        const int64_t dk_off = varlen ? (k_start + key) * prm.dk_row_stride
                                      : (int64_t)batch * prm.dk_batch_stride + (int64_t)key * prm.dk_row_stride;
        const int64_t dv_off = varlen ? (k_start + key) * prm.dv_row_stride
                                      : (int64_t)batch * prm.dv_batch_stride + (int64_t)key * prm.dv_row_stride;
        uint16_t *dk_row = static_cast<uint16_t *>(prm.dk) + dk_off + (int64_t)head_kv * prm.dk_head_stride;
        uint16_t *dv_row = static_cast<uint16_t *>(prm.dv) + dv_off + (int64_t)head_kv * prm.dv_head_stride;
#pragma unroll
        for (int j = 0; j < COLS / 8; ++j) {
            const int col = col0 + 8 * j + col_in;
            if (col < prm.head_dim)
                *reinterpret_cast<uint32_t *>(dk_row + col) = fa_bwd_sm90_pack2<BF16>(
                    dk_rmem[4 * j + 2 * h] * prm.softmax_scale, dk_rmem[4 * j + 2 * h + 1] * prm.softmax_scale);
            if (col < prm.head_dim_v)
                *reinterpret_cast<uint32_t *>(dv_row + col) =
                    fa_bwd_sm90_pack2<BF16>(dv_rmem[4 * j + 2 * h], dv_rmem[4 * j + 2 * h + 1]);
        }
    }
}

/* Query rows [q_lo, q_hi) that see at least one key of [n0, n1) (n1 <= len_k): key j is visible
 * to row i iff i + shift - window_left <= j <= i + shift + window_right (sides -1 unbounded). */
__device__ __forceinline__ void fa_hopper_bwd_query_range(const fa_bwd_sm90_params &prm, int n0, int n1, int len_q,
                                                          int shift, int &q_lo, int &q_hi) {
    q_lo = 0;
    q_hi = len_q;
    if (prm.window_right >= 0) q_lo = max(0, n0 - shift - prm.window_right);
    if (prm.window_left >= 0) q_hi = min(len_q, n1 - 1 - shift + prm.window_left + 1);
}

/* The query blocks [m_first, m_first + n_m) of block_m rows that see a key of [n0, n0 + block_n)
 * (fa_hopper_bwd_query_range; shift = len_k - len_q): a key block's walk. */
__device__ __forceinline__ void fa_bwd_sm90_query_blocks(const fa_bwd_sm90_params &prm, int n0, int block_m, int block_n,
                                                         int len_q, int len_k, int shift, int &m_first, int &n_m) {
    int q_lo, q_hi;
    fa_hopper_bwd_query_range(prm, n0, min(n0 + block_n, len_k), len_q, shift, q_lo, q_hi);
    m_first = q_lo / block_m;
    n_m = q_hi > q_lo ? (q_hi + block_m - 1) / block_m - m_first : 0;
}

/* A CTA's walk over its query blocks [m_first, m_first + n_m): from m_first + offset on, wrapping
 * around. offset = 0, or with prm.rotate_walk (deterministic mode, no mask that limits the query
 * range, so every key block of the sequence sees the same n_m blocks) and n_m >= n_blocks, key
 * block n_block's fa_hopper_bwd_walk_offset (sm90_tiles.h): no walk then waits at its start. */
struct fa_bwd_sm90_walk {
    int m_first, n_m, offset;
    int n_block, n_blocks; /* this CTA's key block of the sequence's n_blocks                      */
    bool rotated;
};

template <bool DET>
__device__ __forceinline__ fa_bwd_sm90_walk fa_bwd_sm90_walk_of(const fa_bwd_sm90_params &prm, int m_first, int n_m,
                                                                 int n_block, int len_k, int block_n) {
    fa_bwd_sm90_walk w;
    w.m_first = m_first;
    w.n_m = n_m;
    w.n_block = n_block;
    w.n_blocks = (len_k + block_n - 1) / block_n;
    w.rotated = DET && prm.rotate_walk && n_m >= w.n_blocks;
    w.offset = w.rotated ? fa_hopper_bwd_walk_offset(n_block, w.n_blocks, n_m) : 0;
    return w;
}

/* Query block of walk position i (0 <= i < n_m); DET = false: never rotated (no wrap to test). */
template <bool DET>
__device__ __forceinline__ int fa_bwd_sm90_walk_block(const fa_bwd_sm90_walk &w, int i) {
    if constexpr (!DET) return w.m_first + i;
    const int r = i + w.offset;
    return w.m_first + (r >= w.n_m ? r - w.n_m : r);
}

/* ---- deterministic dQ ---------------------------------------------------------------------------
 * Every CTA adds its dQ piece of a tile (query head, BLOCK_M query rows) into the fp32
 * accumulator with bulk reduce-adds: one addition per element and key block. In deterministic mode
 * the key blocks of a tile add in a fixed order, from the highest key block to the lowest, so each
 * element's fp32 sum is always rounded in the same order. The order is kept by a semaphore per
 * (sequence, query head, query block, consumer piece) in the workspace, zeroed before the kernel:
 * it counts the key blocks that have added; key block n adds when it reads
 * rank = last_key_block(tile) - n. The key blocks that add into a tile are contiguous (a key
 * block's query range [q_lo, q_hi) is monotone in n on both ends, and the empty ones lie beyond
 * both ends; an exhaustive check over 81,000 problems confirmed it: docs/tuning-log.md), so the ranks
 * are 0, 1, 2, ... in that order.
 *
 * Why descending: key block n + 1 reaches a tile no later than key block n (its query range
 * starts no earlier, so the tile comes no later in its loop), so the blocks arrive in about that
 * order and seldom wait (causal: two iterations apart). Deadlock freedom: a CTA waits only for
 * higher key blocks of its own (kv head, sequence); the grid runs key block
 * n = gridDim.x - 1 - blockIdx.x, so those have smaller linear block indices, and CUDA hands out
 * the blocks of a grid in linear index order: the lowest unfinished block is then always resident
 * and never waits for an unfinished one (docs/hopper.md, "Global reductions and inter-CTA order").
 *
 * Rotated walks (fa_bwd_sm90_walk) instead take a tile's additions in the order the walks reach
 * it (fa_hopper_bwd_rotated_rank): each walk waits only for walks that reached the tile at an
 * earlier step of their own, and none at its first step; the host rotates deterministic walks
 * only when a sequence's key blocks fit the multiprocessors at once (fa_hopper_bwd_rotate), so
 * every walk a CTA waits for is resident or will be once earlier CTAs finish.
 *
 * Buckets 64 and 128 (bwd_sm90.cu) and 192 / 128: a dQ writer warp adds both pieces of a tile and
 * keeps the turn itself, on piece 0's semaphore; two writers take alternate tiles
 * (fa_bwd_sm90_dq_writer). Bucket 256, below: each consumer warp adds its own rows of its
 * consumer's piece.
 *
 * Who waits: not the consumers. Producer warp 1 + c, the turn keeper of consumer c, walks the
 * same iterations as the consumers; per tile it polls the semaphore until it reads the rank
 * (relaxed loads, then fence.acq_rel.gpu: acquire) and arrives on named barrier DQ_TURN + c;
 * consumer c's 128 threads bar.sync on it just before their reduce-adds (normally long granted)
 * and bar.arrive on DQ_DONE + c once each warp's lane 0 has waited for its reduce-adds to be
 * written; the keeper bar.syncs on DQ_DONE + c (the consumers' adds are then performed for it) and passes the tile on with red.release.gpu (+1, cumulative: it
 * orders the adds the barrier made visible to it). The acquire/release latencies stay off the
 * consumers' path. One phase of each barrier per tile: the keeper grants tile t + 1 only after
 * DQ_DONE of tile t, and the consumers arrive on DQ_DONE of t + 1 only after DQ_TURN of t + 1.
 * Named barriers rather than mbarriers: a consumer's bar.sync is one instruction, where an mbarrier
 * wait is a loop, and with it ptxas spilled 40 bytes at bucket 64 (addresses kept across it). */

/* Named barrier ids of the deterministic mode, + the consumer (ids the kernels' own barriers do
 * not use); each joins the keeper warp and the consumer warpgroup. */
enum { FA_HBWD_BAR_DQ_TURN = 12, FA_HBWD_BAR_DQ_DONE = 14, FA_HBWD_DQ_TURN_THREADS = 32 + 128 };

/* ---- the dK / dV epilogue (both kernels) ------------------------------------------------------ */

/* Named barriers of the epilogue: EPILOGUE joins the 256 consumer threads (both consumers' last
 * GEMMs have retired), EPILOGUE + 1 + c the 128 of consumer c (its tiles are staged). */
enum { FA_HBWD_BAR_EPILOGUE = 8 };

/* dK (scaled) and dV of a CTA's keys, out through shared memory, as the forward's O epilogue: the
 * Q / dO stages are free after the last iteration and hold dK and dV tiles [TILE_SLABS][TILE_ROWS
 * keys][64 columns] in the 128-byte swizzle (the K / V layout), dV's right after dK's. Consumer c
 * holds keys row0 .. row0 + 63 of the tile (n0 + row0 ..) and columns 64·slab0 ..
 * 64·(slab0 + OWN_SLABS) - 1 of dK and of dV in the accumulator layout (element 4j + 2h + e: row
 * row0 + 16w + l/4 + 8h, column 64·slab0 + 8j + 2(l%4) + e). After the EPILOGUE barrier (both
 * consumers' last GEMMs have read the stages) each thread writes its pairs with 4-byte st.shared (the 8 rows of a store
 * instruction land on 8 different chunks: conflict-free). Then with prm.dkdv_tma (mappable
 * tensors: fa_hopper_bwd_dkdv_tma) one thread per consumer stores its slabs by TMA, whose box
 * {64, 64} clips rows past the sequence (fixed length) and columns past d / dv, and waits until
 * they are read before the CTA may exit; else, and for a varlen consumer whose 64 keys end inside
 * the sequence's last 64 (the rows past it belong to the next sequence, the box would overwrite
 * them), the consumer copies its rows below len_k out with 4-byte stores, consecutive threads on
 * consecutive words of a row. (Each thread storing its own pairs to global memory writes half of
 * every 32-byte sector and throttles the load-store unit at the CTA's end.) */
template <int TILE_SLABS, int TILE_ROWS, int OWN_SLABS, int ROWS = 64>
__device__ __forceinline__ void fa_bwd_sm90_dkdv_out(const CUtensorMap *tmap_dk, const CUtensorMap *tmap_dv,
                                                     const fa_bwd_sm90_params &prm, uint32_t tiles_smem, int consumer,
                                                     int tid, int row0, int slab0, int n0, int len_k, int64_t k_start,
                                                     int batch, int col_base);

template <int TILE_SLABS, int TILE_ROWS, int OWN_SLABS, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_epilogue_dkdv(const CUtensorMap *tmap_dk, const CUtensorMap *tmap_dv,
                                                          const fa_bwd_sm90_params &prm,
                                                          const float (&dk_rmem)[OWN_SLABS * 32],
                                                          const float (&dv_rmem)[OWN_SLABS * 32], uint32_t tiles_smem,
                                                          int consumer, int tid, int row0, int slab0, int n0, int len_k,
                                                          int64_t k_start, int batch, int col_base = 0) {
    constexpr uint32_t SLAB_BYTES = TILE_ROWS * 128;
    const uint32_t dk_tile = tiles_smem, dv_tile = tiles_smem + TILE_SLABS * SLAB_BYTES;
    const int warp = tid / 32, lane = tid % 32;
    bar_sync(FA_HBWD_BAR_EPILOGUE, 256);
    const int tile_row = row0 + 16 * warp + lane / 4; /* row of h = 0; (r + 8) % 8 == r % 8 */
#pragma unroll
    for (int j = 0; j < OWN_SLABS * 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t at = (uint32_t)(slab0 + j / 8) * SLAB_BYTES + (uint32_t)(tile_row + 8 * h) * 128 +
                                (uint32_t)(((j % 8) ^ (tile_row % 8)) * 16) + (uint32_t)(lane % 4) * 4;
            st_shared_b32(dk_tile + at, fa_bwd_sm90_pack2<BF16>(dk_rmem[4 * j + 2 * h] * prm.softmax_scale,
                                                                dk_rmem[4 * j + 2 * h + 1] * prm.softmax_scale));
            st_shared_b32(dv_tile + at, fa_bwd_sm90_pack2<BF16>(dv_rmem[4 * j + 2 * h], dv_rmem[4 * j + 2 * h + 1]));
        }
    fa_bwd_sm90_dkdv_out<TILE_SLABS, TILE_ROWS, OWN_SLABS>(tmap_dk, tmap_dv, prm, tiles_smem, consumer, tid, row0, slab0,
                                                           n0, len_k, k_start, batch, col_base);
}

/* The second half of the epilogue: consumer c's staged rows row0 .. row0 + ROWS - 1 of the dK and
 * dV tiles (layout as above; every writer of them has stored) out by TMA (box {64, ROWS}) or by
 * coalesced copies, as described above. */
template <int TILE_SLABS, int TILE_ROWS, int OWN_SLABS, int ROWS>
__device__ __forceinline__ void fa_bwd_sm90_dkdv_out(const CUtensorMap *tmap_dk, const CUtensorMap *tmap_dv,
                                                     const fa_bwd_sm90_params &prm, uint32_t tiles_smem, int consumer,
                                                     int tid, int row0, int slab0, int n0, int len_k, int64_t k_start,
                                                     int batch, int col_base) {
    constexpr uint32_t SLAB_BYTES = TILE_ROWS * 128;
    const uint32_t dk_tile = tiles_smem, dv_tile = tiles_smem + TILE_SLABS * SLAB_BYTES;
    const int key_first = n0 + row0;
    const int head_kv = (int)blockIdx.y;
    const bool varlen = prm.cu_seqlens_q != nullptr;
    if (prm.dkdv_tma && (!varlen || key_first + ROWS <= len_k)) {
        /* st.shared (generic proxy) -> TMA store (async proxy): each writer fences, then the
         * consumer's threads meet before one of them issues the stores */
        fence_proxy_async_shared_cta();
        bar_sync(FA_HBWD_BAR_EPILOGUE + 1 + consumer, 128);
        if (tid == 0 && key_first < len_k) {
            const uint32_t rows = (uint32_t)row0 * 128;
            /* varlen maps are {d, total_k, heads, 1} */
            const int key_row = (varlen ? (int)k_start : 0) + key_first, map_batch = varlen ? 0 : batch;
#pragma unroll
            for (int i = 0; i < OWN_SLABS; ++i) { /* slabs past d or dv hold no column */
                const int slab = slab0 + i;
                if (col_base + 64 * slab < prm.head_dim)
                    tma_store_4d(tmap_dk, dk_tile + (uint32_t)slab * SLAB_BYTES + rows, col_base + 64 * slab, key_row,
                                 head_kv, map_batch);
                if (col_base + 64 * slab < prm.head_dim_v)
                    tma_store_4d(tmap_dv, dv_tile + (uint32_t)slab * SLAB_BYTES + rows, col_base + 64 * slab, key_row,
                                 head_kv, map_batch);
            }
            tma_store_commit_group();
            tma_store_wait_group_read<0>();
        }
        return;
    }
    bar_sync(FA_HBWD_BAR_EPILOGUE + 1 + consumer, 128);
    const int rows = max(0, min(ROWS, len_k - key_first));
    auto copy_out = [&](uint32_t tile, void *base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                        int dim, int first_slab) {
        /* this consumer's words (column pairs; dim is a multiple of 8) below dim */
        const int words = max(0, min(OWN_SLABS * 32, (dim - col_base) / 2 - 32 * first_slab));
        uint16_t *rows_gmem = static_cast<uint16_t *>(base) + (int64_t)head_kv * head_stride +
                              (varlen ? k_start * row_stride : (int64_t)batch * batch_stride) + col_base +
                              64 * first_slab;
        for (int idx = tid; idx < rows * words; idx += 128) {
            const int r = idx / words, w = idx % words, tr = row0 + r;
            const uint32_t at = (uint32_t)(first_slab + w / 32) * SLAB_BYTES + (uint32_t)tr * 128 +
                                (uint32_t)((((w % 32) / 4) ^ (tr % 8)) * 16) + (uint32_t)(w % 4) * 4;
            *reinterpret_cast<uint32_t *>(rows_gmem + (int64_t)(key_first + r) * row_stride + 2 * w) =
                __float_as_uint(ld_shared_f32(tile + at));
        }
    };
    copy_out(dk_tile, prm.dk, prm.dk_batch_stride, prm.dk_row_stride, prm.dk_head_stride, prm.head_dim, slab0);
    copy_out(dv_tile, prm.dv, prm.dv_batch_stride, prm.dv_row_stride, prm.dv_head_stride, prm.head_dim_v, slab0);
}

/* Highest key block that adds into query block m (rows [m·block_m, min((m + 1)·block_m, len_q))):
 * the last key any of its rows sees, clamped to the sequence. */
__device__ __forceinline__ int fa_bwd_sm90_last_key_block(const fa_bwd_sm90_params &prm, int m, int block_m, int block_n,
                                                      int len_q, int len_k, int shift) {
    const int last_row = min((m + 1) * block_m, len_q) - 1;
    int last_key = len_k - 1;
    if (prm.window_right >= 0) last_key = min(last_key, last_row + shift + prm.window_right);
    return last_key / block_n;
}

/* This CTA's place among the key blocks that add into query block m (0 = first): the walks'
 * order when rotated, else the highest key block first. */
__device__ __forceinline__ int fa_bwd_sm90_dq_rank(const fa_bwd_sm90_params &prm, const fa_bwd_sm90_walk &walk, int m,
                                                   int block_m, int block_n, int len_q, int len_k, int shift) {
    return walk.rotated ? fa_hopper_bwd_rotated_rank(walk.n_block, walk.n_blocks, walk.n_m, m - walk.m_first)
                        : fa_bwd_sm90_last_key_block(prm, m, block_m, block_n, len_q, len_k, shift) - walk.n_block;
}

/* The turn keeper of consumer `consumer`'s dQ piece, semaphore `piece` of `pieces` per query
 * block (a whole warp; lane 0 passes the turn on): for every iteration of this CTA (query head
 * of the group, query block m of its walk), wait for the turn of this key block, grant it to the
 * consumer (DQ_TURN), wait for its adds (DQ_DONE), pass the turn on. All lanes poll the same word (one request per poll, the same value in every lane). An
 * ordering bug hangs here: tests run under a timeout. */
__device__ __forceinline__ void fa_bwd_sm90_dq_turn_keeper(const fa_bwd_sm90_params &prm, const fa_bwd_sm90_walk &walk,
                                                       int block_m, int block_n, int batch,
                                                       const fa_bwd_sm90_heads &heads, int len_q, int len_k, int shift,
                                                       int consumer, int piece, int pieces, int lane) {
    for (int head = heads.first; head < heads.first + prm.heads_per_split; ++head) {
        int *const sem_head =
            prm.dq_semaphore + ((int64_t)batch * prm.heads_q + head) * prm.query_blocks * pieces + piece;
#pragma unroll 1
        for (int i = 0; i < walk.n_m; ++i) {
            const int m = fa_bwd_sm90_walk_block<true>(walk, i);
            int *const sem = sem_head + m * pieces;
            const int rank = fa_bwd_sm90_dq_rank(prm, walk, m, block_m, block_n, len_q, len_k, shift);
            while (ld_relaxed_gpu_s32(sem) != rank) {
            }
            fence_acq_rel_gpu(); /* acquire: the higher key blocks' adds happen before ours */
            bar_arrive(FA_HBWD_BAR_DQ_TURN + consumer, FA_HBWD_DQ_TURN_THREADS);
            bar_sync(FA_HBWD_BAR_DQ_DONE + consumer, FA_HBWD_DQ_TURN_THREADS); /* the consumer's adds are done */
            if (lane == 0) red_release_gpu_add_s32(sem, 1);                  /* ... before the next key block's */
        }
    }
}

/* Named barriers of the dQ hand-over to the writer warp (fa_bwd_sm90_dq_writer), + the consumer:
 * DQ_EMPTY (the writer's reductions have read consumer c's staged piece) and DQ_FULL (consumer c's
 * piece is staged and fenced); each joins consumer c's warpgroup and the writer warp. */
enum { FA_HBWD_BAR_DQ_EMPTY = 4, FA_HBWD_BAR_DQ_FULL = 6, FA_HBWD_DQ_HANDOFF_THREADS = 128 + 32 };

/* Consumer `consumer`'s staged dQ piece goes to the writer warp: fence its generic-proxy stores for
 * the bulk reduction (async proxy), arrive on DQ_FULL. The kernels defer it to the next
 * iteration's GEMM issue: the fence waits until the stores have drained, which would otherwise
 * hold the next score GEMM back. */
__device__ __forceinline__ void fa_bwd_sm90_dq_piece_staged(int consumer) {
    fence_proxy_async_shared_cta();
    bar_arrive(FA_HBWD_BAR_DQ_FULL + consumer, FA_HBWD_DQ_HANDOFF_THREADS);
}

/* The dQ writer of the kernels with a tiled dQ accumulator (bwd_sm90.cu, bwd_sm90_hdim192.cu),
 * producer warp 1: walks the consumers' iterations (query head of the group, query block m) and
 * adds both staged dQ pieces of each into its accumulator tile (sm90_tiles.h,
 * fa_hopper_bwd_dq_tile_cols) with one 1-D bulk reduce-add per piece (lane 0 issues it, one bulk
 * group per piece). A piece of rows past the sequence (bucket 64's second) or of columns past
 * head_dim (bucket 128's second when d <= 64) is not added: nothing reads it.
 * Per iteration and piece c: arrive on DQ_EMPTY + c once the previous iteration's group c has read
 * the staging (its first arrival frees the empty buffer), wait on DQ_FULL + c (staged and fenced
 * by consumer c), reduce.
 *
 * Deterministic mode: FA_HBWD_DQ_WRITERS writers, producer warps 1, 2, ... (writer = warp - 1),
 * take the iterations in turn (writer t % WRITERS). For its iteration t a writer waits for the tile's turn (the
 * semaphore of piece 0 reads this key block's rank, fa_bwd_sm90_dq_rank: the key blocks before it
 * have added), then for the baton (DQ_BATON + writer: the writer of t - 1 has issued its
 * additions and their reads of the staging are done), adds both pieces, waits until the staging
 * is read, frees it for t + 1 (DQ_EMPTY) and passes the baton to the writer of t + 1; only then
 * does it wait until its additions are written (not only read) and pass the turn on with
 * red.release. So one writer's write round trip and release run while the next polls the next
 * tile's turn and adds it: with one writer those latencies came one after another in every
 * iteration and held the consumers at DQ_EMPTY (docs/tuning-log.md; a third writer measured no
 * better than two). The proxy fences order the generic-proxy semaphore accesses with the
 * async-proxy reductions on both sides. The baton keeps exactly one writer on DQ_FULL / DQ_EMPTY
 * at a time, so those barriers see one writer warp per phase, as without determinism. */
enum {
    FA_HBWD_DQ_WRITERS = 2,    /* deterministic mode's writers, producer warps 1 .. WRITERS       */
    FA_HBWD_BAR_DQ_BATON = 13  /* + writer (13, 14): ids no kernel of this writer uses           */
};
static_assert(FA_HBWD_DQ_WRITERS >= 2 && FA_HBWD_DQ_WRITERS <= 3 && FA_HBWD_BAR_DQ_BATON + FA_HBWD_DQ_WRITERS <= 16,
              "writers: producer warps 1 .. 3 of the producer warpgroup; baton ids within the 16 named barriers");
/* The producer warps that run fa_bwd_sm90_dq_writer (writer = warp - 1): warp 1, and in
 * deterministic mode warps 2 .. FA_HBWD_DQ_WRITERS as well. */
__device__ __forceinline__ bool fa_bwd_sm90_is_dq_writer(bool det, int warp) {
    return warp >= 1 && warp <= (det ? FA_HBWD_DQ_WRITERS : 1);
}
template <class Cfg, bool DET, bool MODS = false>
__device__ __forceinline__ void fa_bwd_sm90_dq_writer(const fa_bwd_sm90_params &prm,
                                                      uint32_t dq_smem, const fa_bwd_sm90_walk &walk, int batch,
                                                      const fa_bwd_sm90_heads &heads, int len_q, int len_k, int shift,
                                                      int64_t q_packed0, int lane,
                                                      int writer /* DET: 0 .. FA_HBWD_DQ_WRITERS - 1 */,
                                                      const fa_bwd_sm90_iters *iters = nullptr /* MODS: the walk */,
                                                      int iterations = 0 /* MODS: its length */) {
    /* this sequence's first accumulator tile (of each head) */
    const int64_t tile0 = fa_hopper_bwd_dq_tile0(q_packed0, batch, Cfg::BLOCK_M);
    /* add both pieces of tile m of `head` (one bulk group each) */
    auto add_pieces = [&](int head, int m) {
        float *const tile = prm.dq_accum + ((int64_t)head * prm.dq_tiles + tile0 + m) * (Cfg::BLOCK_M * Cfg::D);
#pragma unroll
        for (int c = 0; c < Cfg::CONSUMER_WGS; ++c) {
            /* pieces of rows: inside the sequence; pieces of columns: inside head_dim */
            constexpr bool ROW_PIECES = fa_hopper_bwd_dq_piece_row0(Cfg::BLOCK_M, 1) > 0;
            const bool live = ROW_PIECES ? m * Cfg::BLOCK_M + fa_hopper_bwd_dq_piece_row0(Cfg::BLOCK_M, c) < len_q
                                         : fa_hopper_bwd_dq_piece_col0(Cfg::BLOCK_M, Cfg::D, c) < prm.head_dim;
            bar_sync(FA_HBWD_BAR_DQ_FULL + c, FA_HBWD_DQ_HANDOFF_THREADS);
            if (lane == 0) {
                if (live)
                    cp_reduce_async_bulk_add_f32(tile + c * (Cfg::DQ_PIECE_BYTES / 4),
                                                 dq_smem + (uint32_t)c * Cfg::DQ_PIECE_BYTES, Cfg::DQ_PIECE_BYTES);
                tma_store_commit_group();
            }
        }
    };
    auto free_staging = [&]() {
        __syncwarp();
        bar_arrive(FA_HBWD_BAR_DQ_EMPTY + 0, FA_HBWD_DQ_HANDOFF_THREADS);
        bar_arrive(FA_HBWD_BAR_DQ_EMPTY + 1, FA_HBWD_DQ_HANDOFF_THREADS);
    };
    /* one iteration without determinism: free each piece's staging once its previous add read it */
    auto write_one = [&](int head, int m) {
        tma_store_wait_group_read<1>();
        __syncwarp();
        bar_arrive(FA_HBWD_BAR_DQ_EMPTY + 0, FA_HBWD_DQ_HANDOFF_THREADS);
        tma_store_wait_group_read<0>();
        __syncwarp();
        bar_arrive(FA_HBWD_BAR_DQ_EMPTY + 1, FA_HBWD_DQ_HANDOFF_THREADS);
        add_pieces(head, m);
    };
    if constexpr (MODS) {
        static_assert(!DET, "a block mask's key blocks need not be contiguous: no ordered dQ");
        fa_mods_q_pos it = fa_bwd_sm90_iter_first(*iters);
#pragma unroll 1
        for (int t = 0; t < iterations; ++t, fa_bwd_sm90_iter_next(*iters, it)) write_one(it.h, it.tile);
    } else if constexpr (!DET) {
#pragma unroll 1
        for (int head = heads.first; head < heads.first + prm.heads_per_split; ++head)
#pragma unroll 1
            for (int i = 0; i < walk.n_m; ++i) write_one(head, fa_bwd_sm90_walk_block<false>(walk, i));
    } else {
        const int last = prm.heads_per_split * walk.n_m - 1; /* the CTA's last iteration */
        if (writer == 0) free_staging(); /* the staging starts empty */
        const unsigned next_writer = ((unsigned)writer + 1u) % FA_HBWD_DQ_WRITERS; /* the baton's next holder */
        int t = 0;
#pragma unroll 1
        for (int head = heads.first; head < heads.first + prm.heads_per_split; ++head) {
            int *const sem_head = prm.dq_semaphore + ((int64_t)batch * prm.heads_q + head) * prm.query_blocks * 2;
#pragma unroll 1
            for (int i = 0; i < walk.n_m; ++i, ++t) {
                if ((unsigned)t % FA_HBWD_DQ_WRITERS != (unsigned)writer) continue;
                const int m = fa_bwd_sm90_walk_block<true>(walk, i);
                int *const sem = sem_head + m * 2;
                const int rank = fa_bwd_sm90_dq_rank(prm, walk, m, Cfg::BLOCK_M, Cfg::BLOCK_N, len_q, len_k, shift);
                while (ld_relaxed_gpu_s32(sem) != rank) {
                }
                fence_acq_rel_gpu();        /* acquire: the higher key blocks' additions happen before ours */
                fence_proxy_async_global(); /* ... and before our bulk reductions */
                __syncwarp();
                if (t > 0) bar_sync(FA_HBWD_BAR_DQ_BATON + writer, 64);
                add_pieces(head, m);
                tma_store_wait_group_read<0>(); /* the staging is read: t + 1 may be staged */
                if (t < last) {
                    free_staging();
                    bar_arrive(FA_HBWD_BAR_DQ_BATON + next_writer, 64);
                }
                tma_store_wait_group<0>();  /* lane 0's additions are written */
                fence_proxy_async_global(); /* ... before the release */
                if (lane == 0) red_release_gpu_add_s32(sem, 1);
            }
        }
    }
    if constexpr (!DET) tma_store_wait_group_read<0>(); /* the staging is read before the CTA exits */
}

/* Zero rows [row_lo, rows) of `slabs` slabs of [rows, 64] 16-bit elements (128-byte rows; the
 * swizzle permutes 16-byte chunks inside a row, so whole rows are contiguous either way). Called
 * by all 256 consumer threads (thread index ct = threadIdx.x - 128). */
__device__ __forceinline__ void fa_bwd_sm90_zero_rows(uint32_t tile, uint32_t slab_bytes, int slabs, int rows, int row_lo,
                                                  int ct) {
    const uint32_t zero[4] = {0u, 0u, 0u, 0u};
    const int chunks = (rows - row_lo) * 8;
    for (int s = 0; s < slabs; ++s)
        for (int i = ct; i < chunks; i += 256)
            st_shared_v4_b32(tile + (uint32_t)s * slab_bytes + (uint32_t)row_lo * 128 + (uint32_t)i * 16, zero);
}

/* Varlen: the K and V rows of a key block past its sequence (the next sequence's, or anything)
 * -> 0 before any GEMM reads them (valid_rows = len_k - n0 < BLOCK_N), by all 256 consumer
 * threads; the generic-proxy stores are fenced for the wgmma (async proxy) reads, then both
 * consumers meet on named barrier `bar`. */
template <class Cfg>
__device__ __forceinline__ void fa_bwd_sm90_zero_kv_tail(uint32_t k_smem, uint32_t v_smem, int valid_rows, int ct,
                                                         int bar) {
    fa_bwd_sm90_zero_rows(k_smem, Cfg::KV_SLAB_BYTES, Cfg::SLABS, Cfg::BLOCK_N, valid_rows, ct);
    fa_bwd_sm90_zero_rows(v_smem, Cfg::KV_SLAB_BYTES, Cfg::V_SLABS, Cfg::BLOCK_N, valid_rows, ct);
    fence_proxy_async_shared_cta();
    bar_sync(bar, 256);
}


/* The mbarriers of the kernels whose Q and dO share a stage (bwd_sm90.cu, bwd_sm90_hdim192.cu), by
 * thread 0: kv_full (1 arrival + the K and V bytes), then STAGES stage_full (Cfg::FULL_ARRIVALS)
 * and STAGES stage_empty (Cfg::EMPTY_ARRIVALS); the caller's CTA barrier follows. */
template <class Cfg>
__device__ __forceinline__ void fa_bwd_sm90_init_stage_barriers(uint32_t bars) {
    if (threadIdx.x == 0) {
        mbarrier_init(bars, 1);
        for (int s = 0; s < Cfg::STAGES; ++s) {
            mbarrier_init(bars + 8u * (uint32_t)(1 + s), Cfg::FULL_ARRIVALS);
            mbarrier_init(bars + 8u * (uint32_t)(1 + Cfg::STAGES + s), Cfg::EMPTY_ARRIVALS);
        }
        fence_mbarrier_init_release_cluster();
    }
}

/* A = 64 rows of a K-major [rows, D] tile (K or V, slab stride KV_SLAB_BYTES) starting at a_wg, B = a
 * K-major [BLOCK_M, D] stage (Q or dO): acc = A Bᵀ, D/16 k16 steps over the head dim (step kk:
 * slab kk/4, +32·(kk%4) bytes). E4M3 (the fp8 kernel): both of e4m3 codes, one 128-byte-row slab
 * each, four k32 steps of the same +32 bytes. One commit group; nothing waits here. */
template <class Cfg, bool BF16, bool E4M3 = false>
__device__ __forceinline__ void fa_bwd_sm90_issue_abt(float (&acc)[Cfg::BLOCK_M / 2], uint32_t a_wg, uint32_t b_stage) {
    const uint64_t a_desc = wgmma_desc_sw128(a_wg, 16, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(b_stage, 16, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_M / 2; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
    if constexpr (E4M3) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma_ss_f32_e4m3<Cfg::BLOCK_M>(acc, a_desc + ((kk * 32) >> 4), b_desc + ((kk * 32) >> 4), kk > 0 ? 1 : 0);
    } else {
#pragma unroll
        for (int kk = 0; kk < Cfg::D / 16; ++kk) {
            const uint64_t a_step = ((kk / 4) * Cfg::KV_SLAB_BYTES + (kk % 4) * 32) >> 4;
            const uint64_t b_step = ((kk / 4) * Cfg::Q_SLAB_BYTES + (kk % 4) * 32) >> 4;
            wgmma_ss_f32<Cfg::BLOCK_M, BF16>(acc, a_desc + a_step, b_desc + b_step, kk > 0 ? 1 : 0);
        }
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_M / 2; ++i) wgmma_fence_operand(acc[i]);
}

/* fp32 accumulator (keys × queries, accumulator layout) -> 16-bit A fragments with K = queries:
 * k-slice kk (queries 16kk .. 16kk+15) is acc[8kk .. 8kk+7], packed pairwise (src/cuda/common/ptx.cuh). */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_pack(const float (&acc)[Cfg::BLOCK_M / 2],
                                             uint32_t (&frag)[Cfg::BLOCK_M / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) frag[kk][x] = fa_bwd_sm90_pack2<BF16>(acc[8 * kk + 2 * x], acc[8 * kk + 2 * x + 1]);
}

/* Producer warp 0 of both kernels. Lane 0 issues K and V of the key block once, then Q and dO of
 * every iteration (query head, query block of BLOCK_M rows, in that order) into the STAGES-deep
 * ring; all lanes store the iteration's LSE2 and D rows (+inf and 0 past the sequence) while the
 * stage's TMA runs. stage_full[s] completes after lane 0's arrive.expect_tx (+ the TMA bytes) and
 * every lane's arrival after its own stores. wait_empty(s, phase) returns once the consumers have
 * released stage s. Cfg names the shared-memory offsets (K, V, Q, DO, LSE, DVEC, BAR: kv_full,
 * then the STAGES stage_full barriers), sizes (SLABS of K and Q, V_SLABS of V and dO, DO_BYTES a
 * dO stage), STAGE_TX and DO_STAGES; this warp lives on the producers' 24 registers.
 * DO_STAGES == STAGES: dO shares Q's stage and barrier. DO_STAGES == 1 (bucket 256): dO has one
 * buffer and its own barrier do_full (the one after the stage_full barriers, 1 arrival + the dO
 * bytes); after Q of iteration t the producer waits wait_do_empty(phase) (the consumers have
 * released dO of iteration t - 1) and loads dO of iteration t. */
/* The fp8 backward's kernel argument (bwd_sm90.cu's FP8 instantiation): the e4m3 Q, K and dO maps
 * ({d, rows, heads, batch}, varlen {d, total, heads, 1}; box {128 codes, BLOCK_M or BLOCK_N rows};
 * V's is the kernel's tmap_v) and the descale factors [batch, heads_kv] (NULL: 1); empty for the
 * other instantiations. */
template <bool FP8> struct fa_bwd_sm90_fp8_arg {};
template <> struct fa_bwd_sm90_fp8_arg<true> {
    CUtensorMap q8, k8, do8;
    const float *q_descale, *k_descale, *v_descale, *do_descale;
};

template <class Cfg, bool MODS = false, bool DET = false, bool FP8 = false, class WaitEmpty, class WaitDoEmpty>
__device__ __forceinline__ void fa_bwd_sm90_load(const CUtensorMap *tmap_q, const CUtensorMap *tmap_do,
                                                 const CUtensorMap *tmap_k, const CUtensorMap *tmap_v,
                                                 const fa_bwd_sm90_params &prm, uint32_t smem, const fa_seq_rows &seq,
                                                 int64_t q_packed0, int batch, const fa_bwd_sm90_heads &heads,
                                                 int k_row, int q_row0,
                                                 int tma_batch, const fa_bwd_sm90_walk &walk, int len_q, int lane,
                                                 WaitEmpty wait_empty, WaitDoEmpty wait_do_empty,
                                                 const fa_bwd_sm90_iters *iters = nullptr /* MODS: the walk */,
                                                 int iterations = 0 /* MODS: its length */,
                                                 int col_base = 0 /* first head-dim column of this CTA's tiles */,
                                                 const fa_bwd_sm90_fp8_arg<FP8> *fp8 = nullptr /* FP8: the e4m3 maps */) {
    constexpr bool SPLIT_DO = Cfg::DO_STAGES != Cfg::STAGES;
    static_assert(!SPLIT_DO || Cfg::DO_STAGES == 1, "dO: the Q ring's stages, or one buffer of its own");
    const bool varlen = prm.cu_seqlens_q != nullptr;
    const uint32_t k_smem = smem + Cfg::K_OFFSET, v_smem = smem + Cfg::V_OFFSET;
    const uint32_t lse2_smem = smem + Cfg::LSE_OFFSET, dvec_smem = smem + Cfg::DVEC_OFFSET;
    const uint32_t kv_full = smem + Cfg::BAR_OFFSET;
    auto q_stage = [&](int s) -> uint32_t { return smem + Cfg::Q_OFFSET + (uint32_t)s * Cfg::Q_BYTES; };
    auto do_stage = [&](int s) -> uint32_t { return smem + Cfg::DO_OFFSET + (uint32_t)s * Cfg::DO_BYTES; };
    auto stage_full = [&](int s) -> uint32_t { return kv_full + 8u * (uint32_t)(1 + s); };
    if (lane == 0) {
        tma_prefetch_tensormap(tmap_q);
        tma_prefetch_tensormap(tmap_do);
        mbarrier_arrive_expect_tx(kv_full, (uint32_t)(Cfg::SLABS + Cfg::V_SLABS) * Cfg::KV_SLAB_BYTES);
        for (int slab = 0; slab < Cfg::SLABS; ++slab) {
            tma_load_4d(k_smem + (uint32_t)slab * Cfg::KV_SLAB_BYTES, tmap_k, kv_full, col_base + 64 * slab, k_row,
                        heads.kv, tma_batch);
            if constexpr (FP8) /* the V tile's two slabs: V's codes, then K's (128 per row each) */
                tma_load_4d(v_smem + (uint32_t)slab * Cfg::KV_SLAB_BYTES, slab == 0 ? tmap_v : &fp8->k8, kv_full, 0,
                            k_row, heads.kv, tma_batch);
            else if (slab < Cfg::V_SLABS)
                tma_load_4d(v_smem + (uint32_t)slab * Cfg::KV_SLAB_BYTES, tmap_v, kv_full, col_base + 64 * slab,
                            k_row, heads.kv, tma_batch);
        }
    }
    const int64_t lse_head_pitch = varlen ? prm.total_q : prm.seqlen_q;
    const float *lse_head = prm.lse + (varlen ? seq.q_start : (int64_t)batch * prm.heads_q * prm.seqlen_q) +
                            (int64_t)heads.first * lse_head_pitch;
    const float *dsum_head = prm.dsum + (int64_t)heads.first * prm.total_q + q_packed0;
    int s = 0, phase = 1, do_phase = 1;
    /* one iteration: Q and dO of (head, m0) into stage s, LSE2 and D of its rows (lse_row, dsum_row:
     * the head's vectors); MODS: its walk position into the stage's slot (Cfg::POS_OFFSET) */
    auto load_one = [&](int head, int m0, const float *lse_row, const float *dsum_row, const fa_mods_q_pos &pos) {
        wait_empty(s, phase);
        if (lane == 0) {
            if constexpr (MODS) {
                const uint32_t slot[4] = {(uint32_t)pos.h, (uint32_t)pos.tile, (uint32_t)pos.qb, (uint32_t)pos.entry};
                st_shared_v4_b32(smem + Cfg::POS_OFFSET + 16u * (uint32_t)s, slot);
            }
            mbarrier_arrive_expect_tx(stage_full(s), Cfg::STAGE_TX);
            for (int slab = 0; slab < Cfg::SLABS; ++slab) {
                tma_load_4d(q_stage(s) + (uint32_t)slab * Cfg::Q_SLAB_BYTES, tmap_q, stage_full(s),
                            col_base + 64 * slab, q_row0 + m0, head, tma_batch);
                if (!SPLIT_DO && slab < Cfg::V_SLABS)
                    tma_load_4d(do_stage(s) + (uint32_t)slab * Cfg::Q_SLAB_BYTES, tmap_do, stage_full(s),
                                col_base + 64 * slab, q_row0 + m0, head, tma_batch);
            }
            if constexpr (FP8) { /* the codes of Q and dO, for Sᵀ and dPᵀ */
                tma_load_4d(smem + Cfg::Q8_OFFSET + (uint32_t)s * Cfg::Q8_SLAB_BYTES, &fp8->q8, stage_full(s), 0,
                            q_row0 + m0, head, tma_batch);
                tma_load_4d(smem + Cfg::DO8_OFFSET + (uint32_t)s * Cfg::Q8_SLAB_BYTES, &fp8->do8, stage_full(s), 0,
                            q_row0 + m0, head, tma_batch);
            }
        }
#pragma unroll 1
        for (int r = lane; r < Cfg::BLOCK_M; r += 32) {
            const bool in_seq = m0 + r < len_q;
            const uint32_t at = (uint32_t)(s * Cfg::BLOCK_M + r) * 4;
            const float lse = in_seq ? lse_row[m0 + r] : -CUDART_INF_F;
            st_shared_f32(lse2_smem + at, lse == -CUDART_INF_F ? CUDART_INF_F : lse * 1.4426950408889634f);
            st_shared_f32(dvec_smem + at, in_seq ? dsum_row[m0 + r] : 0.0f);
        }
        /* each lane releases its own stores (lane 0's second arrival) */
        mbarrier_arrive(stage_full(s));
        if constexpr (SPLIT_DO) {
            const uint32_t do_full = stage_full(Cfg::STAGES);
            wait_do_empty(do_phase);
            if (lane == 0) {
                mbarrier_arrive_expect_tx(do_full, Cfg::DO_BYTES);
                for (int slab = 0; slab < Cfg::V_SLABS; ++slab)
                    tma_load_4d(do_stage(0) + (uint32_t)slab * Cfg::Q_SLAB_BYTES, tmap_do, do_full,
                                col_base + 64 * slab, q_row0 + m0, head, tma_batch);
            }
            do_phase ^= 1;
        }
        if (++s == Cfg::STAGES) {
            s = 0;
            phase ^= 1;
        }
    };
    if constexpr (MODS) {
        fa_mods_q_pos it = fa_bwd_sm90_iter_first(*iters);
        for (int t = 0; t < iterations; ++t, fa_bwd_sm90_iter_next(*iters, it))
            load_one(it.h, it.tile * Cfg::BLOCK_M, lse_head + (int64_t)(it.h - heads.first) * lse_head_pitch,
                     dsum_head + (int64_t)(it.h - heads.first) * prm.total_q, it);
    } else {
        for (int head = heads.first; head < heads.first + prm.heads_per_split; ++head) {
            for (int i = 0; i < walk.n_m; ++i)
                load_one(head, fa_bwd_sm90_walk_block<DET>(walk, i) * Cfg::BLOCK_M, lse_head, dsum_head,
                         fa_mods_q_pos{0, 0, 0, 0});
            lse_head += lse_head_pitch;
            dsum_head += prm.total_q;
        }
    }
}

/* ---- mask and probabilities (both kernels) --------------------------------------------------
 * Element 4j + 2h + c of a thread's Sᵀ accumulator is key key0 + 8h and query
 * m0 + 8j + col_in + c; `base` = key0 - shift - col_in - m0 puts both in the thread's local column
 * units: query + shift - key = 8j + c - (base + 8h). */

/* Key k sees queries [k - shift - window_right, k - shift + window_left] (a side -1: unbounded),
 * none when k is past the sequence; in local column units that is [lo, hi], and 8j + c are
 * compile-time constants, so each element costs two compares. Masked elements become -inf. */
template <int BLOCK_M>
__device__ __forceinline__ void fa_bwd_sm90_mask_window(float (&x)[BLOCK_M / 2], int window_left, int window_right,
                                                        int base, int key0, int len_k) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int b = base + 8 * h;
        int lo = window_right >= 0 ? b - window_right : -BLOCK_M;
        const int hi = window_left >= 0 ? b + window_left : BLOCK_M;
        if (key0 + 8 * h >= len_k) lo = BLOCK_M;
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if (8 * j + c < lo || 8 * j + c > hi) x[4 * j + 2 * h + c] = -CUDART_INF_F;
    }
}
template <int BLOCK_M>
__device__ __forceinline__ void fa_bwd_sm90_mask(float (&x)[BLOCK_M / 2], const fa_bwd_sm90_params &prm, int base,
                                                 int key0, int len_k) {
    fa_bwd_sm90_mask_window<BLOCK_M>(x, prm.window_left, prm.window_right, base, key0, len_k);
}

/* Without softcap, positive scale, no ALiBi (the mask has written -inf into the raw scores):
 * Sᵀ -> P = 2^(s·scale_log2 - LSE2[query]) in place, one FFMA + one MUFU.EX2 per element
 * (scale_log2: prm.scale_log2, times the descale factors for e4m3 scores); LSE2 = +inf (rows past
 * the sequence) gives 0. LSE2 of queries 8j + col_in, +1 at lse2_pair + 32j. */
template <int BLOCK_M>
__device__ __forceinline__ void fa_bwd_sm90_probs(float (&s_rmem)[BLOCK_M / 2], float scale_log2, uint32_t lse2_pair) {
#pragma unroll
    for (int j = 0; j < BLOCK_M / 8; ++j) {
        const float2 lse2 = ld_shared_v2_f32(lse2_pair + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            s_rmem[4 * j + 2 * h] = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h], scale_log2, -lse2.x));
            s_rmem[4 * j + 2 * h + 1] = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h + 1], scale_log2, -lse2.y));
        }
    }
}

/* The LOG2 kernels (ALiBi, or a negative scale; no softcap): Sᵀ (unmasked) ->
 * P = 2^(s·scale·log2e - slope·log2e·|query + shift - key| - LSE2[query]) in place
 * (fa_bwd_sm90_exponent_log2 forms the exponent; the MODS kernels share it). The exponent
 * is formed first and the mask writes -inf into it, so a masked element gets P = 0 whatever the
 * sign of the scale (two more instructions per element with ALiBi, none without). */
template <int BLOCK_M>
__device__ __forceinline__ void fa_bwd_sm90_exponent_log2(float (&s_rmem)[BLOCK_M / 2], const fa_bwd_sm90_params &prm,
                                                          int base, uint32_t lse2_pair, float alibi_slope_log2) {
    /* without ALiBi (slope 0, uniform) the distance term is skipped: two instructions per element */
    const bool alibi = alibi_slope_log2 != 0.0f;
#pragma unroll
    for (int j = 0; j < BLOCK_M / 8; ++j) {
        const float2 lse2 = ld_shared_v2_f32(lse2_pair + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float &x = s_rmem[4 * j + 2 * h + c];
                x = fmaf(x, prm.scale_log2, -(c ? lse2.y : lse2.x));
            }
        }
    }
    if (alibi) {
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    float &x = s_rmem[4 * j + 2 * h + c];
                    x = fmaf(-alibi_slope_log2, fabsf((float)(8 * j + c) - (float)(base + 8 * h)), x);
                }
    }
}
template <int BLOCK_M>
__device__ __forceinline__ void fa_bwd_sm90_probs_log2(float (&s_rmem)[BLOCK_M / 2], const fa_bwd_sm90_params &prm,
                                                       bool needs_mask, int base, int key0, int len_k,
                                                       uint32_t lse2_pair, float alibi_slope_log2) {
    fa_bwd_sm90_exponent_log2<BLOCK_M>(s_rmem, prm, base, lse2_pair, alibi_slope_log2);
    if (needs_mask) fa_bwd_sm90_mask<BLOCK_M>(s_rmem, prm, base, key0, len_k);
#pragma unroll
    for (int i = 0; i < BLOCK_M / 2; ++i) s_rmem[i] = ex2_approx_ftz_f32(s_rmem[i]);
}

/* ALiBi slope of query head `head` in log2 units (0 without ALiBi). */
__device__ __forceinline__ float fa_bwd_sm90_alibi_slope(const fa_bwd_sm90_params &prm, int batch, int head) {
    return prm.alibi_slopes != nullptr
               ? prm.alibi_slopes[(int64_t)batch * prm.alibi_batch_stride + head] * 1.4426950408889634f
               : 0.0f;
}

/* ---- softcap (the SOFTCAP instantiations; bwd.cu picks them when softcap > 0) -------------
 * The forward's scores are s = softcap·tanh(scale·q·k / softcap), in log2 units tc·softcap·log2(e)
 * with tc = tanh(...) (fa_tanh, the forward's own function, so P is recomputed exactly as the
 * forward normalised it). dS = P∘(dP - D)∘(1 - tc²): both kernels keep one fp32 value per element
 * across the dPᵀ GEMM, as without softcap; which one depends on when dV needs P:
 *   dV issued before dPᵀ is awaited (bucket 256): P is packed to 16 bits for dV at once and the
 *     fp32 register keeps w = P·(1 - tc²) in its place (fa_bwd_sm90_softcap_probs_w);
 *   dV issued after dS (buckets 64 and 128 with softcap): the register keeps tc across the GEMM,
 *     and P, w and dS are computed together once dPᵀ is ready (fa_bwd_sm90_softcap_ds).
 * Masked elements are tc = -inf (the mask runs after the tanh): P = 2^-inf = 0, and the factor
 * max(1 - tc², 0) = 0 keeps 0·inf out of w. */

/* Sᵀ (fp32 accumulator) -> tc = tanh(Sᵀ·softmax_scale / softcap), in place. */
template <int N>
__device__ __forceinline__ void fa_bwd_sm90_softcap_tanh(float (&s_rmem)[N], float softcap_pre) {
#pragma unroll
    for (int i = 0; i < N; ++i) s_rmem[i] = fa_tanh(s_rmem[i] * softcap_pre);
}

/* 1 - tc² (0 for a masked element, tc = -inf). */
__device__ __forceinline__ float fa_bwd_sm90_softcap_slope(float tc) { return fmaxf(fmaf(-tc, tc, 1.0f), 0.0f); }

/* tc (masked -inf) -> P = 2^(tc·softcap·log2e - LSE2) packed into the A fragments p_rmem (k-slice
 * kk = elements 8kk .. 8kk+7, pairs as fa_bwd_sm90_pack), and s_rmem <- w = P·(1 - tc²) in fp32.
 * Element 4j + 2h + c is query 8j + col_in + c: LSE2 of queries 8j + col_in, +1 at lse2_pair + 32j. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_softcap_probs_w(float (&s_rmem)[Cfg::BLOCK_M / 2],
                                                        uint32_t (&p_rmem)[Cfg::BLOCK_M / 16][4], uint32_t lse2_pair,
                                                        float softcap_post_log2) {
#pragma unroll
    for (int j = 0; j < Cfg::BLOCK_M / 8; ++j) {
        const float2 lse2 = ld_shared_v2_f32(lse2_pair + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float tc0 = s_rmem[4 * j + 2 * h], tc1 = s_rmem[4 * j + 2 * h + 1];
            const float p0 = ex2_approx_ftz_f32(fmaf(tc0, softcap_post_log2, -lse2.x));
            const float p1 = ex2_approx_ftz_f32(fmaf(tc1, softcap_post_log2, -lse2.y));
            p_rmem[j / 2][2 * (j % 2) + h] = fa_bwd_sm90_pack2<BF16>(p0, p1); /* elements 8kk + 2x, +1 */
            s_rmem[4 * j + 2 * h] = p0 * fa_bwd_sm90_softcap_slope(tc0);
            s_rmem[4 * j + 2 * h + 1] = p1 * fa_bwd_sm90_softcap_slope(tc1);
        }
    }
}

/* tc (masked -inf) and dPᵀ -> P = 2^(tc·softcap·log2e - LSE2) into s_rmem (fp32, packed by the
 * caller) and dS = P·(1 - tc²)·(dPᵀ - D) into dp_rmem. LSE2 and D of queries 8j + col_in, +1 at
 * lse2_pair + 32j and dvec_pair + 32j. */
template <int N>
__device__ __forceinline__ void fa_bwd_sm90_softcap_ds(float (&s_rmem)[N], float (&dp_rmem)[N], uint32_t lse2_pair,
                                                   uint32_t dvec_pair, float softcap_post_log2) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
        const float2 lse2 = ld_shared_v2_f32(lse2_pair + 32 * j);
        const float2 dv2 = ld_shared_v2_f32(dvec_pair + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int e = 4 * j + 2 * h + c;
                const float tc = s_rmem[e];
                const float p = ex2_approx_ftz_f32(fmaf(tc, softcap_post_log2, -(c ? lse2.y : lse2.x)));
                dp_rmem[e] = p * fa_bwd_sm90_softcap_slope(tc) * (dp_rmem[e] - (c ? dv2.y : dv2.x));
                s_rmem[e] = p;
            }
    }
}

/* ---- host -------------------------------------------------------------------------------------- */

/* FA_HOPPER_BWD_ROTATE=0: never rotate the walks (timing); else the rule (fa_hopper_bwd_rotate). */
static inline int fa_bwd_sm90_rotate_disabled(void) {
    const char *mode = getenv("FA_HOPPER_BWD_ROTATE");
    return mode != nullptr && strcmp(mode, "0") == 0;
}

/* prm->rotate_walk for a launch of key_blocks CTAs per sequence (two per key block at bucket 512;
 * fa_hopper_bwd_rotate). Only
 * deterministic walks rotate: the other calls skip the device query and the environment. */
static inline fa_status fa_bwd_sm90_set_rotation(fa_bwd_sm90_params *prm, bool mods, bool det, int64_t ctas) {
    if (!det) {
        prm->rotate_walk = 0;
        return FA_OK;
    }
    fa_cuda_device_info dev;
    fa_status st = fa_cuda_current_device(&dev);
    if (st != FA_OK) return st;
    prm->rotate_walk = fa_hopper_bwd_rotate(prm->window_left, prm->window_right, mods, det, ctas, dev.sm_count,
                                            fa_bwd_sm90_rotate_disabled());
    return FA_OK;
}

/* The kernel arguments from the backward's parameter block (window sides already clamped and
 * causal folded in by bwd.cu). */
static inline fa_bwd_sm90_params fa_bwd_sm90_make_params(const fa_bwd_params *p) {
    fa_bwd_sm90_params prm;
    static_cast<fa_bwd_params &>(prm) = *p;
    prm.query_blocks = 0; /* the launcher sets both from its BLOCK_M */
    prm.dq_tiles = 0;
    prm.dkdv_tma = 0;
    prm.rotate_walk = 0;
    return prm;
}

/* The LOG2 instantiations' problems: ALiBi, or a negative scale (softcap excluded by the caller). */
static inline bool fa_bwd_sm90_log2_scores(const fa_bwd_params *p) {
    return p->alibi_slopes != nullptr || !(p->scale_log2 > 0.0f);
}

/* A compile-time flag passed as a value, so that one generic lambda receives every instantiation's flags. */
template <bool B> struct fa_flag {
    static constexpr bool value = B;
};

/* The score path and dtype of a backward problem, chosen as every CUDA kernel chooses them, handed to
 * `launch(bf16, softcap, log2, dropout)` as fa_flag values: SOFTCAP when softcap_pre > 0, else LOG2
 * for ALiBi or a negative scale (fa_hopper_bwd_unsupported keeps LOG2 and softcap apart), else the
 * plain path; DROPOUT when the call has dropout. Both Hopper backward launchers dispatch through it. */
template <class Launch>
static inline fa_status fa_bwd_sm90_dispatch(const fa_bwd_params *p, bool dropout, bool bf16, Launch &&launch) {
    const auto with_dropout = [&](auto drop) -> fa_status {
        const auto with_dtype = [&](auto softcap, auto log2) -> fa_status {
            return bf16 ? launch(fa_flag<true>{}, softcap, log2, drop) : launch(fa_flag<false>{}, softcap, log2, drop);
        };
        if (p->softcap_pre > 0.0f) return with_dtype(fa_flag<true>{}, fa_flag<false>{});
        if (fa_bwd_sm90_log2_scores(p)) return with_dtype(fa_flag<false>{}, fa_flag<true>{});
        return with_dtype(fa_flag<false>{}, fa_flag<false>{});
    };
    return dropout ? with_dropout(fa_flag<true>{}) : with_dropout(fa_flag<false>{});
}

/* TMA maps of Q and dO (box rows block_m) and of K and V (box rows block_n): a tensor as the 4-D
 * {d, rows, heads, batch}, varlen {d, total, heads, 1}; without with_v, V's map is left to the
 * caller (the fp8 kernel maps V's e4m3 codes). The caller has returned early when a tensor has no
 * rows. `path` names the kernel in messages. */
static inline fa_status fa_bwd_sm90_make_maps(const fa_bwd_params *p, bool bf16, int block_m, int block_n,
                                          const char *path, CUtensorMap *tmap_q, CUtensorMap *tmap_do,
                                          CUtensorMap *tmap_k, CUtensorMap *tmap_v, bool with_v = true) {
    const CUtensorMapDataType type = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const bool varlen = p->cu_seqlens_q != nullptr;
    const int64_t rows_q = varlen ? p->total_q : p->seqlen_q;
    const int64_t rows_k = varlen ? p->total_k : p->seqlen_k;
    const int64_t map_batch = varlen ? 1 : p->batch;
    fa_status st;
    if ((st = fa_hopper_make_map(tmap_q, path, "q", type, p->q, p->head_dim, rows_q, p->heads_q, map_batch,
                                 p->q_row_stride, p->q_head_stride, p->q_batch_stride, block_m)) != FA_OK ||
        (st = fa_hopper_make_map(tmap_do, path, "dout", type, p->dout, p->head_dim_v, rows_q, p->heads_q, map_batch,
                                 p->do_row_stride, p->do_head_stride, p->do_batch_stride, block_m)) != FA_OK ||
        (st = fa_hopper_make_map(tmap_k, path, "k", type, p->k, p->head_dim, rows_k, p->heads_kv, map_batch,
                                 p->k_row_stride, p->k_head_stride, p->k_batch_stride, block_n)) != FA_OK ||
        (with_v && (st = fa_hopper_make_map(tmap_v, path, "v", type, p->v, p->head_dim_v, rows_k, p->heads_kv,
                                            map_batch, p->v_row_stride, p->v_head_stride, p->v_batch_stride,
                                            block_n)) != FA_OK))
        return st;
    return FA_OK;
}

/* The dK / dV epilogue's output path for this problem (sm90_tiles.h's fa_hopper_bwd_dkdv_tma):
 * *tma = 1 and the TMA maps of dK and dV as outputs {d, seqlen_k, heads_kv, batch} (varlen
 * {d, total_k, heads_kv, 1}), box {64, box_rows, 1, 1} (one consumer's keys per slab: 64, or 48
 * in the 192 / 128 kernel); or *tma = 0 and both maps copies of `unused` (the epilogue then
 * copies out with st.global and never reads them). */
static inline fa_status fa_bwd_sm90_dkdv_maps(const fa_bwd_params *p, bool bf16, const char *path,
                                              const CUtensorMap *unused, CUtensorMap *tmap_dk, CUtensorMap *tmap_dv,
                                              int *tma, int box_rows = 64) {
    const bool varlen = p->cu_seqlens_q != nullptr;
    const int64_t rows_k = varlen ? p->total_k : p->seqlen_k, map_batch = varlen ? 1 : p->batch;
    *tma = fa_hopper_bwd_dkdv_tma(p->group_splits, (unsigned long long)(uintptr_t)p->dk, p->dk_row_stride,
                                  p->dk_head_stride, p->dk_batch_stride, (unsigned long long)(uintptr_t)p->dv,
                                  p->dv_row_stride, p->dv_head_stride, p->dv_batch_stride, rows_k, p->heads_kv,
                                  map_batch);
    if (!*tma) {
        *tmap_dk = *tmap_dv = *unused;
        return FA_OK;
    }
    const CUtensorMapDataType type = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    fa_status st;
    if ((st = fa_hopper_make_map(tmap_dk, path, "dk", type, p->dk, p->head_dim, rows_k, p->heads_kv, map_batch,
                                 p->dk_row_stride, p->dk_head_stride, p->dk_batch_stride, box_rows)) != FA_OK ||
        (st = fa_hopper_make_map(tmap_dv, path, "dv", type, p->dv, p->head_dim_v, rows_k, p->heads_kv, map_batch,
                                 p->dv_row_stride, p->dv_head_stride, p->dv_batch_stride, box_rows)) != FA_OK)
        return st;
    return FA_OK;
}

/* > 48 KiB of dynamic shared memory needs the per-device opt-in for each kernel, set once per
 * device: bit d of *configured (one word per kernel instantiation) records device d. */
template <class Kernel>
static inline fa_status fa_bwd_sm90_opt_in_smem(Kernel *kernel, uint32_t smem_bytes, int device_ordinal,
                                            unsigned long long *configured) {
    const unsigned long long bit = device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (bit == 0 || !(__atomic_load_n(configured, __ATOMIC_ACQUIRE) & bit)) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes),
                      "cudaFuncSetAttribute(Hopper backward shared memory)");
        __atomic_fetch_or(configured, bit, __ATOMIC_RELEASE);
    }
    return FA_OK;
}

#endif /* FA_BWD_HOPPER_COMMON_CUH */
