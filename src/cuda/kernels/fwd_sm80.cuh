/*
 * fwd_sm80.cuh: the portable FlashAttention forward kernel (mma.sync tensor cores, sm_80+),
 * templated on the element type and the head-dim bucket only. Included by instances/fwd_sm80_hdim<D>.cu, which
 * instantiate it through their extern "C" launchers.
 *
 * One block = BLOCK_M query rows of one (batch, query head). Per block:
 *   1. cp.async the Q tile [BLOCK_M, D] into shared memory (zero-filled past len_q / head_dim);
 *      for small D each warp then keeps its Q fragments in registers for the whole loop.
 *   2. Walk the key tiles that hold any visible key, from the last to the first, streaming
 *      K_j and V_j [BLOCK_N, D] through shared memory with cp.async (2 stages, or 1 stage per
 *      tensor with V_j and K_{j+1} overlapped, see fa_fwd_kv_stages):
 *        S = Q K_jᵀ (fp32, registers) -> scores (softcap, ALiBi, masks only where needed)
 *        -> online softmax in base 2 (scale folded into one FFMA) -> P (16-bit, registers)
 *        -> O += P V_j (fp32, registers).
 *   3. O /= rowsum (sink included), staged through shared memory for 16-byte stores; LSE.
 * Each warp owns WARP_ROWS = BLOCK_M / WARPS rows, so the softmax needs only quad shuffles.
 *
 * Large heads (buckets 512 and 576, fa_fwd_dv_split): 16 rows × 512 columns of O would be 256
 * fp32 registers per thread, so the 8 warps form 4 row groups of 16 rows × 2 column halves.
 * Warps w and w + 4 take alternate k16 steps of S = Q Kᵀ for the same rows and all keys of the
 * tile, add each other's partial scores through shared memory (fa_pair_add_scores: both then hold
 * the same S and run the same mask and softmax), and each computes P·V for its 256 columns of O.
 *
 * DROPOUT (a separate instantiation, so the kernels without it are unchanged): the row sums take
 * P whole, then the dropped elements of P are zeroed before P·V (keep bits from
 * common/dropout.cuh, one Philox call per lane per pair of m16n8 tiles of S), and the epilogue scales O
 * by 1 / (1 - p): O = Σ Z∘P·V / Σ P, LSE that of the softmax without dropout.
 *
 * MODS (another instantiation): the score bias, document ids and block-sparse mask of
 * common/mods.cuh. Every score goes through the transformed (log2-unit) path and fa_mods_score;
 * with a block mask the key tiles walked are those of the query block's listed key blocks only
 * (fa_mods_first_tile / fa_mods_prev_tile over the block map), in the same descending order.
 */
#ifndef FA_FWD_KERNEL_CUH
#define FA_FWD_KERNEL_CUH

#include <math_constants.h>
#include <stdint.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/common/fwd_tiles.h"
#include "cuda/common/mods.cuh"

template <int HEAD_DIM>
struct fa_fwd_config {
    static constexpr int D = HEAD_DIM;                      /* padded head dim of q/k (the bucket) */
    static constexpr int DV = fa_fwd_bucket_dv(HEAD_DIM);   /* padded head dim of v/o         */
    static constexpr int BLOCK_M = fa_fwd_block_m(D);
    static constexpr int BLOCK_N = fa_fwd_block_n(D);
    static constexpr int WARPS = fa_fwd_warps(D);
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int DV_SPLIT = fa_fwd_dv_split(D);     /* warps sharing a row's O columns */
    static constexpr int ROW_WARPS = WARPS / DV_SPLIT;      /* row groups                     */
    static constexpr int WARP_ROWS = BLOCK_M / ROW_WARPS;   /* query rows per warp            */
    static constexpr int M_TILES = WARP_ROWS / 16;          /* m16 tiles per warp             */
    /* dropout: Philox calls in flight per m16 tile (the order ptxas 13 spills least with: at
     * d = 128 one, both unrolled spilled 24 bytes on sm_90 and 32 on sm_80; at d = 64 and 256
     * both) */
    static constexpr int KEEP_UNROLL = D == 128 ? 1 : BLOCK_N / 32;
    static constexpr int N_TILES = BLOCK_N / 8;             /* n8 tiles of S per warp         */
    static constexpr int K_STEPS = D / 16;                  /* k16 steps of Q Kᵀ              */
    static constexpr int WARP_K_STEPS = K_STEPS / DV_SPLIT; /* ... of them per warp            */
    static constexpr int O_TILES = DV / 8 / DV_SPLIT;       /* n8 tiles of O per warp         */
    static constexpr int PV_STEPS = BLOCK_N / 16;           /* k16 steps of P V               */
    static constexpr int CHUNKS = D / 8;                    /* 16-byte chunks per tile row    */
    static constexpr bool Q_IN_REGS = fa_fwd_q_in_regs(D) != 0;
    static constexpr int STAGES = fa_fwd_kv_stages(D);
    static constexpr int Q_ELEMS = BLOCK_M * D;
    static constexpr int KV_ELEMS = BLOCK_N * D;
    static constexpr size_t SMEM_BYTES = fa_fwd_smem_bytes(D);
    /* partial scores of a dv split: [warp][m tile][n tile][lane] × 4 fp32 */
    static constexpr size_t EXCHANGE_BYTES = DV_SPLIT > 1 ? (size_t)16 * THREADS * M_TILES * N_TILES : 0;
    static constexpr size_t STATE_BYTES = 4 * (size_t)THREADS * 2 * M_TILES + 16 * (size_t)THREADS + EXCHANGE_BYTES;
    static_assert(WARP_ROWS % 16 == 0, "each warp owns whole m16 tiles");
    static_assert(N_TILES % 2 == 0 && O_TILES % 2 == 0, "ldmatrix.x4 loads pairs of n8 tiles");
    static_assert(DV_SPLIT == 1 || (DV_SPLIT == 2 && K_STEPS % 2 == 0 && O_TILES % 8 == 0 && !Q_IN_REGS),
                  "a dv split halves the k16 steps and O's columns in whole 128-byte groups");
    static_assert(SMEM_BYTES == 2 * (size_t)(Q_ELEMS + 2 * STAGES * KV_ELEMS) + STATE_BYTES, "smem layout");
};

/* Issue cp.async for a [ROWS, D] tile whose row 0 is at gmem (16-bit elements, row_stride in
 * elements) into the swizzled smem tile at smem_base. Rows >= valid_rows and chunks >=
 * valid_chunks are zero-filled, so pad rows/columns never hold garbage (0 · NaN would leak into
 * the products). `any_valid` is a readable address used as the source of zero-fills. */
template <class Cfg, int ROWS>
__device__ __forceinline__ void fa_fwd_load_tile(uint32_t smem_base, const uint16_t *gmem,
                                                 int64_t row_stride, int valid_rows,
                                                 int valid_chunks, const void *any_valid) {
    if constexpr (Cfg::THREADS % Cfg::CHUNKS != 0) { /* rows of 72 chunks (bucket 576) */
        fa_load_tile_items<Cfg::THREADS, Cfg::CHUNKS, ROWS>(smem_base, gmem, row_stride, valid_rows, valid_chunks,
                                                            any_valid);
    } else {
        constexpr int ROWS_PER_PASS = Cfg::THREADS / Cfg::CHUNKS;
        static_assert(ROWS % ROWS_PER_PASS == 0, "whole passes");
        const int chunk = threadIdx.x % Cfg::CHUNKS;
        const int row0 = threadIdx.x / Cfg::CHUNKS;
        const bool chunk_ok = chunk < valid_chunks;
        const uint16_t *src = gmem + row0 * row_stride + chunk * 8;
#pragma unroll
        for (int pass = 0; pass < ROWS / ROWS_PER_PASS; ++pass) {
            const int row = row0 + pass * ROWS_PER_PASS;
            const bool ok = chunk_ok && row < valid_rows;
            cp_async_cg_16(smem_base + 16 * fa_swizzled_chunk<Cfg::CHUNKS>(row, chunk),
                           ok ? (const void *)src : any_valid, ok ? 16 : 0);
            src += ROWS_PER_PASS * row_stride;
        }
    }
}

template <class Elem, int HEAD_DIM, bool DROPOUT, bool MODS>
__global__ void __launch_bounds__(fa_fwd_config<HEAD_DIM>::THREADS, 1)
    fa_fwd_kernel(const fa_fwd_params prm, const fa_dropout_params dropout /* read iff DROPOUT */,
                  const fa_mods_arg<MODS> mods /* read iff MODS */) {
    using Cfg = fa_fwd_config<HEAD_DIM>;
    constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N;
    constexpr int M_TILES = Cfg::M_TILES, N_TILES = Cfg::N_TILES, O_TILES = Cfg::O_TILES;
    constexpr int CHUNKS = Cfg::CHUNKS;

    /* Shared memory: q_smem [BLOCK_M, D] | k_smem [STAGES][BLOCK_N, D] | v_smem [STAGES][BLOCK_N, D],
     * each tile swizzled (fa_swizzled_chunk). */
    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t q_smem = smem_u32addr(smem_raw);
    const uint32_t k_smem = q_smem + 2 * Cfg::Q_ELEMS;
    const uint32_t v_smem = k_smem + 2 * Cfg::STAGES * Cfg::KV_ELEMS;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int quad_row = lane / 4; /* g: the row (and row+8) this lane holds in mma fragments */
    const int quad_col = lane % 4; /* t: its column pair 2t, 2t+1                            */
    /* dv split (fa_fwd_dv_split): warps w and w + ROW_WARPS share the rows of row group
     * w % ROW_WARPS; col_half picks their k16 steps of S (ks ≡ col_half mod 2) and their half of
     * O's columns */
    const int row_warp = Cfg::DV_SPLIT > 1 ? warp % Cfg::ROW_WARPS : warp;
    const int col_half = Cfg::DV_SPLIT > 1 ? warp / Cfg::ROW_WARPS : 0;

    /* ---- which block: heavy_first puts the query block in the slowest grid dimension, last
     * block first (it sees the most keys under a causal mask). */
    int m_block, head, batch;
    if (prm.heavy_first) {
        head = blockIdx.x;
        batch = blockIdx.y;
        m_block = prm.num_m_blocks - 1 - (int)blockIdx.z;
    } else {
        m_block = blockIdx.x;
        head = blockIdx.y;
        batch = blockIdx.z;
    }
    const fa_seq_rows seq = fa_sequence_rows(prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q,
                                             prm.total_k, prm.seqlen_q, prm.seqlen_k, batch);
    const int m0 = m_block * BLOCK_M;
    if (m0 >= seq.len_q) return; /* whole block: no barrier has been reached yet */
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int head_kv = head / prm.group;
    const bool varlen = prm.cu_seqlens_q != nullptr;

    const uint16_t *q_gmem = (const uint16_t *)prm.q + head * prm.q_head_stride +
                             (varlen ? seq.q_start * prm.q_row_stride : batch * prm.q_batch_stride) +
                             (int64_t)m0 * prm.q_row_stride;
    const uint16_t *k_gmem = (const uint16_t *)prm.k + head_kv * prm.k_head_stride +
                             (varlen ? seq.k_start * prm.k_row_stride : batch * prm.k_batch_stride);
    const uint16_t *v_gmem = (const uint16_t *)prm.v + head_kv * prm.v_head_stride +
                             (varlen ? seq.k_start * prm.v_row_stride : batch * prm.v_batch_stride);

    /* ---- visible keys. Row i sees [lo(i), hi(i)) (fa_key_lo / fa_key_hi, fa_internal.h), both
     * non-decreasing in i, so the block's keys are [lo(first row), hi(last row)) and a tile needs
     * no per-element mask iff it lies inside [lo(last row), hi(first row)) (fa_tile_all_visible). */
    const int64_t shift = (int64_t)len_k - len_q;
    const int m_last = min(m0 + BLOCK_M, len_q) - 1;
    auto key_lo = [&](int64_t i) -> int { return fa_key_lo_clamped(i + shift, prm.window_left, len_k); };
    auto key_hi = [&](int64_t i) -> int { return fa_key_hi_clamped(i + shift, prm.window_right, len_k); };
    const int block_key_lo = key_lo(m0), block_key_hi = key_hi(m_last);
    const int nomask_lo = key_lo(m_last), nomask_hi = key_hi(m0);
    const int n_block_first = block_key_lo / BLOCK_N;
    int n_tiles = block_key_hi > block_key_lo
                      ? (block_key_hi + BLOCK_N - 1) / BLOCK_N - n_block_first
                      : 0;
    int n_block_last = n_block_first + n_tiles - 1;
    /* MODS with a block mask: only the listed key blocks' tiles (the window is then unbounded,
     * so the range above is every key; causal / window hold inside partial blocks) */
    const int32_t *map_row = nullptr;
    int tiles_per_block = 1;
    const int key_tiles = (len_k + BLOCK_N - 1) / BLOCK_N;
    fa_mods_k_pos walk_pos = {n_block_last, 0, 0}; /* MODS: the tile of this iteration, its block and entry */
    if constexpr (MODS) {
        if (mods.block_map != nullptr) {
            map_row = fa_mods_map_row(mods, batch, head, m0);
            tiles_per_block = mods.block_k / BLOCK_N;
            walk_pos = fa_mods_first_tile(mods, batch, head, m0 / mods.block_q, map_row, tiles_per_block, key_tiles,
                                          &n_tiles);
            n_block_last = walk_pos.tile;
        }
    }

    /* The 2·M_TILES rows this lane holds: r = mt*2 + half is query row lane_row0 + 8·r. */
    const int lane_row0 = m0 + row_warp * Cfg::WARP_ROWS + quad_row;
    const float alibi_slope_log2 =
        prm.alibi_slopes != nullptr
            ? prm.alibi_slopes[batch * prm.alibi_batch_stride + head] * 1.4426950408889634f
            : 0.0f;
    const float score_mul = prm.score_mul;

    /* ---- prologue: Q, then the first K (and V with 2 stages). Every load site commits a group,
     * empty or not, so the wait_group counts below are constants. */
    const int d_chunks = prm.head_dim / 8, dv_chunks = prm.head_dim_v / 8;
    fa_fwd_load_tile<Cfg, BLOCK_M>(q_smem, q_gmem, prm.q_row_stride, len_q - m0, d_chunks, prm.q);
    cp_async_commit_group();
    if (n_tiles > 0)
        fa_fwd_load_tile<Cfg, BLOCK_N>(k_smem, k_gmem + (int64_t)n_block_last * BLOCK_N * prm.k_row_stride,
                                       prm.k_row_stride, len_k - n_block_last * BLOCK_N, d_chunks,
                                       prm.q);
    cp_async_commit_group();
    if (Cfg::STAGES == 2) {
        if (n_tiles > 0)
            fa_fwd_load_tile<Cfg, BLOCK_N>(v_smem, v_gmem + (int64_t)n_block_last * BLOCK_N * prm.v_row_stride,
                                           prm.v_row_stride, len_k - n_block_last * BLOCK_N,
                                           dv_chunks, prm.q);
        cp_async_commit_group();
    }

    /* Every ldmatrix below reads rows r with r & 7 == lane & 7 and logical chunks c = 2·step +
     * {0,1}, so its swizzled position (fa_swizzled_chunk) is r·CHUNKS + 8·(c / 8) + ((c % 8) ^
     * (lane & 7)): the lane-dependent part takes one of 4 values (c % 8 in {0,2,4,6} + {0,1}),
     * kept in 4 registers per operand; the rest is a compile-time offset. (Left to itself the
     * compiler hoists one address per (step, tile) pair out of the loop: 64+ registers.) */
    auto frag_offsets = [&](int row, int chunk_lo, uint32_t offs[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) offs[i] = 16u * (uint32_t)(row * CHUNKS + ((2 * i + chunk_lo) ^ (lane & 7)));
    };
    /* byte offset of logical chunk pair `step` (chunks 2·step, 2·step+1) for a fragment */
    auto frag_addr = [&](uint32_t base, const uint32_t offs[4], int step, int row_offset) -> uint32_t {
        return base + offs[step % 4] + 16u * (uint32_t)(8 * (step / 4) + row_offset * CHUNKS);
    };
    /* A dv split's warp walks the k16 steps ks = 2·kh + col_half of S: chunk pair ks % 4 =
     * 2·(kh % 2) + col_half of the 8-chunk group kh / 2. split_offsets keeps the two offsets of
     * those pairs in offs[0..1]; s_step_addr is frag_addr of the warp's kh-th step. */
    auto split_offsets = [&](uint32_t offs[4]) {
        if (Cfg::DV_SPLIT > 1) {
            const uint32_t even = col_half ? offs[1] : offs[0], odd = col_half ? offs[3] : offs[2];
            offs[0] = even;
            offs[1] = odd;
        }
    };
    auto s_step_addr = [&](uint32_t base, const uint32_t offs[4], int kh, int row_offset) -> uint32_t {
        return Cfg::DV_SPLIT > 1 ? base + offs[kh % 2] + 16u * (uint32_t)(8 * (kh / 2) + row_offset * CHUNKS)
                                 : frag_addr(base, offs, kh, row_offset);
    };
    /* Q fragments (A operand, ldmatrix.x4 of a 16x16 block): lanes 0-15 address rows 0-15 at
     * chunk 2k, lanes 16-31 rows 0-15 at chunk 2k+1 -> a[0..3] = (rows 0-7 | 8-15) × (cols 0-7 | 8-15). */
    uint32_t q_offs[4];
    frag_offsets(row_warp * Cfg::WARP_ROWS + (lane & 15), lane >> 4, q_offs);
    split_offsets(q_offs);
    auto q_frag_addr = [&](int mt, int ks) -> uint32_t { return frag_addr(q_smem, q_offs, ks, mt * 16); };
    uint32_t q_rmem[Cfg::Q_IN_REGS ? M_TILES : 1][Cfg::Q_IN_REGS ? Cfg::K_STEPS : 1][4];
    if (Cfg::Q_IN_REGS) {
        cp_async_wait_group<Cfg::STAGES>(); /* Q landed (the K/V groups may still be in flight) */
        __syncthreads();                     /* ... and other threads' Q chunks are visible      */
#pragma unroll
        for (int mt = 0; mt < (Cfg::Q_IN_REGS ? M_TILES : 1); ++mt)
#pragma unroll
            for (int ks = 0; ks < (Cfg::Q_IN_REGS ? Cfg::K_STEPS : 1); ++ks)
                ldmatrix_x4(q_rmem[mt][ks], q_frag_addr(mt, ks));
    }

    /* K fragments (B operand of S = Q Kᵀ; K rows are B's columns): for keys n16 × dims k16,
     * lanes 0-7 -> keys 0-7 dims 0-7, 8-15 -> keys 0-7 dims 8-15, 16-23 -> keys 8-15 dims 0-7,
     * 24-31 -> keys 8-15 dims 8-15, giving b[0..1] of n8 tile 0 and b[2..3] of n8 tile 1. */
    uint32_t k_offs[4];
    frag_offsets((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, k_offs);
    split_offsets(k_offs);
    /* V fragments (B operand of O = P V, V rows are B's rows: ldmatrix.trans): keys k16 × dims
     * n16, lanes 0-7 -> keys 0-7 dims 0-7, 8-15 -> keys 8-15 dims 0-7, 16-23 -> keys 0-7 dims
     * 8-15, 24-31 -> keys 8-15 dims 8-15. */
    uint32_t v_offs[4];
    frag_offsets((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4, v_offs);

    float o_rmem[M_TILES][O_TILES][4];
    /* Row sums and the K/V row-0 pointers of the thread's loads live in shared memory, not in
     * registers: at d = 64 and 128 the accumulators leave none for them, and ptxas would spill
     * exactly these to local memory (one load/store per tile either way; here it is explicit).
     * Layout after the V stages: row sums [2·M_TILES][THREADS] floats (conflict-free), then
     * [THREADS][2] 64-bit pointers. */
    float row_max[2 * M_TILES];
    const uint32_t state_smem = v_smem + 2 * Cfg::STAGES * Cfg::KV_ELEMS;
    auto row_sum_addr = [&](int r) -> uint32_t { return state_smem + 4 * (Cfg::THREADS * r + threadIdx.x); };
    const uint32_t kv_ptr_smem = state_smem + 4 * Cfg::THREADS * 2 * M_TILES + 16 * threadIdx.x;
    const uint32_t exchange_smem = state_smem + 4 * Cfg::THREADS * 2 * M_TILES + 16 * Cfg::THREADS;
    st_shared_u64(kv_ptr_smem, (uint64_t)k_gmem);
    st_shared_u64(kv_ptr_smem + 8, (uint64_t)v_gmem);
    auto k_gmem_reloaded = [&]() { return (const uint16_t *)ld_shared_u64(kv_ptr_smem); };
    auto v_gmem_reloaded = [&]() { return (const uint16_t *)ld_shared_u64(kv_ptr_smem + 8); };
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int ot = 0; ot < O_TILES; ++ot)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_rmem[mt][ot][e] = 0.0f;
#pragma unroll
    for (int r = 0; r < 2 * M_TILES; ++r) {
        row_max[r] = -CUDART_INF_F;
        st_shared_f32(row_sum_addr(r), 0.0f);
    }

    for (int it = 0; it < n_tiles; ++it) {
        const fa_mods_k_pos pos = walk_pos;
        const int n_block = MODS ? pos.tile : n_block_last - it;
        const int n0 = n_block * BLOCK_N;
        /* MODS: the next tile walked (its loads are issued during this iteration); the kernels
         * without MODS keep their own expressions for it below */
        if (MODS && map_row != nullptr)
            fa_mods_prev_tile(map_row, tiles_per_block, key_tiles, walk_pos);
        else
            walk_pos.tile = n_block - 1;
        const int next_block = walk_pos.tile;
        const int next_n0 = MODS ? next_block * BLOCK_N : n0 - BLOCK_N;
        const int stage = Cfg::STAGES == 2 ? (it & 1) : 0;
        const uint32_t k_tile = k_smem + stage * 2 * Cfg::KV_ELEMS;
        const uint32_t v_tile = v_smem + stage * 2 * Cfg::KV_ELEMS;

        if (Cfg::STAGES == 2) {
            cp_async_wait_group<1>(); /* K_it (and Q) landed; V_it may still be in flight   */
            __syncthreads();          /* K_it visible to all warps, and every warp finished
                                         iteration it-1, so the other stage can be refilled */
            if (it + 1 < n_tiles) {
                const int next = MODS ? next_n0 : (n_block - 1) * BLOCK_N;
                fa_fwd_load_tile<Cfg, BLOCK_N>(k_smem + (stage ^ 1) * 2 * Cfg::KV_ELEMS,
                                               k_gmem_reloaded() + (int64_t)next * prm.k_row_stride,
                                               prm.k_row_stride, len_k - next, d_chunks, prm.q);
            }
            cp_async_commit_group();
            if (it + 1 < n_tiles) {
                const int next = MODS ? next_n0 : (n_block - 1) * BLOCK_N;
                fa_fwd_load_tile<Cfg, BLOCK_N>(v_smem + (stage ^ 1) * 2 * Cfg::KV_ELEMS,
                                               v_gmem_reloaded() + (int64_t)next * prm.v_row_stride,
                                               prm.v_row_stride, len_k - next, dv_chunks, prm.q);
            }
            cp_async_commit_group();
        } else {
            cp_async_wait_group<0>(); /* K_it (and Q) landed                                  */
            __syncthreads();          /* visible to all; every warp finished P·V_{it-1}, so the
                                         single V buffer can be refilled                      */
            fa_fwd_load_tile<Cfg, BLOCK_N>(v_smem, v_gmem_reloaded() + (int64_t)n0 * prm.v_row_stride,
                                           prm.v_row_stride, len_k - n0, dv_chunks, prm.q);
            cp_async_commit_group();
        }

        /* ---- dropout: keep bits of this warp's S tiles, bit 4·nt + e of keep_rmem[mt] for
         * element e of n8 tile nt (32 bits per m16 tile). Drawn before S exists: the Philox
         * rounds then have the registers S will take (after it, ptxas spills at d = 128). */
        uint32_t keep_rmem[DROPOUT ? M_TILES : 1];
        if (DROPOUT) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                keep_rmem[DROPOUT ? mt : 0] = 0;
#pragma unroll Cfg::KEEP_UNROLL
                for (int nt = 0; nt < N_TILES; nt += 4) /* four n8 tiles: one call per lane */
                    keep_rmem[DROPOUT ? mt : 0] |=
                        fa_dropout_keep_qk4(dropout, batch, head, prm.heads_q,
                                            m0 + row_warp * Cfg::WARP_ROWS + mt * 16, n0 + nt * 8)
                        << (4 * nt);
            }
        }

        /* ---- S = Q K_jᵀ for this warp's rows: s_rmem[mt][nt] is the m16n8 tile (rows mt·16..,
         * keys n0 + nt·8..) in the accumulator layout (e: row g + 8·(e>>1), key 2t + (e&1)). */
        float s_rmem[M_TILES][N_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int nt = 0; nt < N_TILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s_rmem[mt][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < Cfg::WARP_K_STEPS; ++ks) { /* the warp's ks-th k16 step (s_step_addr) */
            uint32_t a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                if (Cfg::Q_IN_REGS) {
#pragma unroll
                    for (int x = 0; x < 4; ++x) a[mt][x] = q_rmem[Cfg::Q_IN_REGS ? mt : 0][Cfg::Q_IN_REGS ? ks : 0][x];
                } else {
                    ldmatrix_x4(a[mt], s_step_addr(q_smem, q_offs, ks, mt * 16));
                }
            }
#pragma unroll
            for (int np = 0; np < N_TILES / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, s_step_addr(k_tile, k_offs, ks, np * 16));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    Elem::mma(s_rmem[mt][2 * np], a[mt], &b[0]);
                    Elem::mma(s_rmem[mt][2 * np + 1], a[mt], &b[2]);
                }
            }
        }

        /* dv split: the pair adds each other's partial scores (barriers 1..ROW_WARPS; the slots
         * are rewritten after the next tile's __syncthreads) */
        if constexpr (Cfg::DV_SPLIT > 1)
            fa_pair_add_scores<M_TILES * N_TILES>(exchange_smem, warp, (warp + Cfg::ROW_WARPS) % Cfg::WARPS,
                                                  1 + row_warp, lane, &s_rmem[0][0]);

        /* ---- scores: transform (softcap / ALiBi / non-positive scale -> log2 units) and mask
         * (only tiles that straddle a row's key range; -inf never reaches a product). */
        const bool need_mask = !(n0 >= nomask_lo && n0 + BLOCK_N <= nomask_hi);
        fa_mods_tile mods_tile;
        if constexpr (MODS)
            mods_tile = fa_mods_tile_of(mods, batch, head, varlen, seq.q_start, seq.k_start,
                                        map_row != nullptr ? m0 / mods.block_q : 0, pos.kb, pos.entry);
        if (prm.transform_scores || need_mask || MODS) {
#pragma unroll
            for (int r = 0; r < 2 * M_TILES; ++r) {
                const int mt = r / 2, h = r % 2;
                const int i = lane_row0 + 8 * r;
                /* keys this row sees, relative to the tile: [lo, hi) (everything if unmasked);
                 * MODS: the element window's [lo, hi), whose test fa_mods_score applies */
                int lo = need_mask ? key_lo(i) - n0 : 0;
                int hi = need_mask ? key_hi(i) - n0 : BLOCK_N;
                if constexpr (MODS) {
                    lo = fa_key_lo_clamped(i + shift, mods.elem_window_left, len_k) - n0;
                    hi = fa_key_hi_clamped(i + shift, mods.elem_window_right, len_k) - n0;
                }
                const int diag = (int)(i + shift) - n0;
#pragma unroll
                for (int nt = 0; nt < N_TILES; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int j = nt * 8 + 2 * quad_col + c;
                        float x = s_rmem[mt][nt][2 * h + c];
                        if (prm.transform_scores) {
                            x = prm.softcap_pre != 0.0f ? prm.softcap_post_log2 * fa_tanh(x * prm.softcap_pre)
                                                       : x * prm.scale_log2;
                            x -= alibi_slope_log2 * (float)abs(diag - j);
                        }
                        if constexpr (MODS)
                            s_rmem[mt][nt][2 * h + c] =
                                fa_mods_score(mods, mods_tile, i, n0 + j, i < len_q && n0 + j < len_k,
                                              j >= lo && j < hi, x, 1.4426950408889634f);
                        else
                            s_rmem[mt][nt][2 * h + c] = (j < lo || j >= hi) ? -CUDART_INF_F : x;
                    }
            }
        }

        /* ---- online softmax, base 2: p = 2^(s·mul - max·mul), one FFMA + one EX2 per score.
         * A row whose max is still -inf uses 0 instead (all its p are 0, no inf - inf). Each
         * pair of p is packed to 16 bits at once (p_rmem[mt][nt][h]: row g + 8h, keys 2t, 2t+1),
         * so the P·V phase holds 32 registers of P instead of 64 of S. */
        uint32_t p_rmem[M_TILES][N_TILES][2];
#pragma unroll
        for (int r = 0; r < 2 * M_TILES; ++r) {
            const int mt = r / 2, h = r % 2;
            float tile_max = -CUDART_INF_F;
#pragma unroll
            for (int nt = 0; nt < N_TILES; ++nt)
                tile_max = fmaxf(tile_max, fmaxf(s_rmem[mt][nt][2 * h], s_rmem[mt][nt][2 * h + 1]));
            tile_max = fa_quad_max(tile_max);
            float max_scaled;
            const float rescale = fa_online_max_step(row_max[r], tile_max, score_mul, max_scaled);
#pragma unroll
            for (int ot = 0; ot < O_TILES; ++ot) {
                o_rmem[mt][ot][2 * h] *= rescale;
                o_rmem[mt][ot][2 * h + 1] *= rescale;
            }
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < N_TILES; ++nt) {
                const float p0 = ex2_approx_ftz_f32(fmaf(s_rmem[mt][nt][2 * h], score_mul, -max_scaled));
                const float p1 = ex2_approx_ftz_f32(fmaf(s_rmem[mt][nt][2 * h + 1], score_mul, -max_scaled));
                if (DROPOUT) {
                    const uint32_t keep = keep_rmem[DROPOUT ? mt : 0] >> (4 * nt + 2 * h);
                    p_rmem[mt][nt][h] = Elem::pack2(keep & 1u ? p0 : 0.0f, keep & 2u ? p1 : 0.0f);
                } else {
                    p_rmem[mt][nt][h] = Elem::pack2(p0, p1);
                }
                sum += p0 + p1; /* the row sum takes P before dropout */
            }
            st_shared_f32(row_sum_addr(r), fmaf(ld_shared_f32(row_sum_addr(r)), rescale, sum));
        }

        if (Cfg::STAGES == 2) {
            cp_async_wait_group<2>(); /* V_it landed; K/V_{it+1} may still be in flight       */
            __syncthreads();          /* V_it visible to all warps                            */
        } else {
            cp_async_wait_group<0>(); /* V_it landed                                          */
            __syncthreads();          /* visible to all; every warp finished Q K_itᵀ, so the
                                         single K buffer can be refilled                      */
            if (it + 1 < n_tiles)
                fa_fwd_load_tile<Cfg, BLOCK_N>(k_smem, k_gmem_reloaded() + (int64_t)next_n0 * prm.k_row_stride,
                                               prm.k_row_stride, len_k - next_n0, d_chunks, prm.q);
            cp_async_commit_group();
        }

        /* ---- O += P V_j. The S accumulator of n8 tiles 2s, 2s+1 is exactly the A fragment of
         * k16 step s: a[0] = rows g keys 2t.. (tile 2s, e 0-1), a[1] = rows g+8 (tile 2s, e 2-3),
         * a[2] = rows g keys 8+2t.. (tile 2s+1, e 0-1), a[3] = rows g+8 (tile 2s+1, e 2-3);
         * p_rmem holds those pairs already packed. */
        const uint32_t v_cols = v_tile + 16u * (uint32_t)(col_half * O_TILES); /* the warp's columns */
#pragma unroll
        for (int ps = 0; ps < Cfg::PV_STEPS; ++ps) {
            uint32_t a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                a[mt][0] = p_rmem[mt][2 * ps][0];
                a[mt][1] = p_rmem[mt][2 * ps][1];
                a[mt][2] = p_rmem[mt][2 * ps + 1][0];
                a[mt][3] = p_rmem[mt][2 * ps + 1][1];
            }
#pragma unroll
            for (int op = 0; op < O_TILES / 2; ++op) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, frag_addr(v_cols, v_offs, op, ps * 16));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    Elem::mma(o_rmem[mt][2 * op], a[mt], &b[0]);
                    Elem::mma(o_rmem[mt][2 * op + 1], a[mt], &b[2]);
                }
            }
        }
    }

    /* ---- epilogue. Every copy must have landed before q_smem is reused for O (a block with no
     * key tile still has its Q copies in flight, issued by all threads for all rows). */
    cp_async_wait_all();
    __syncthreads();

    const float sink_log2 =
        prm.sink_logits != nullptr ? prm.sink_logits[head] * 1.4426950408889634f : -CUDART_INF_F;
    const int64_t lse_row0 = varlen ? (int64_t)head * prm.total_q + seq.q_start
                                    : ((int64_t)batch * prm.heads_q + head) * prm.seqlen_q;
#pragma unroll
    for (int r = 0; r < 2 * M_TILES; ++r) {
        const int mt = r / 2, h = r % 2;
        /* the sink, the max and the sum (fa_row_end_with_sink) */
        const fa_row_end e = fa_row_end_with_sink(row_max[r], score_mul, fa_quad_sum(ld_shared_f32(row_sum_addr(r))),
                                                  sink_log2, prm.sink_logits != nullptr);
        /* 0: no visible key; NaN: a NaN score; dropout's 1 / (1 - p) joins the O scale only */
        const float inv_sum = fa_row_scale(DROPOUT ? e.corr * dropout.keep_scale : e.corr, e.sum);
#pragma unroll
        for (int ot = 0; ot < O_TILES; ++ot) {
            o_rmem[mt][ot][2 * h] *= inv_sum;
            o_rmem[mt][ot][2 * h + 1] *= inv_sum;
        }
        const int local_row = row_warp * Cfg::WARP_ROWS + mt * 16 + h * 8 + quad_row;
        if (prm.lse != nullptr && quad_col == 0 && col_half == 0 && m0 + local_row < len_q)
            prm.lse[lse_row0 + m0 + local_row] = fa_row_lse(e.m, e.sum);
    }

    /* O tile -> this warp's own rows (and, with a dv split, columns) of q_smem (same swizzle; no
     * other warp touches them, so a __syncwarp orders the fragment stores before the row-wise
     * 16-byte reads). */
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int ot = 0; ot < O_TILES; ++ot)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int local_row = row_warp * Cfg::WARP_ROWS + mt * 16 + h * 8 + quad_row;
                st_shared_b32(q_smem + 16 * fa_swizzled_chunk<CHUNKS>(local_row, col_half * O_TILES + ot) + 4 * quad_col,
                              Elem::pack2(o_rmem[mt][ot][2 * h], o_rmem[mt][ot][2 * h + 1]));
            }
    __syncwarp();

    uint16_t *o_gmem = (uint16_t *)prm.o + head * prm.o_head_stride +
                       (varlen ? seq.q_start * prm.o_row_stride : batch * prm.o_batch_stride);
    constexpr int WARP_CHUNKS = Cfg::WARP_ROWS * O_TILES; /* the warp's rows × its O columns */
    static_assert(WARP_CHUNKS % 32 == 0, "whole passes over the warp's O rows");
#pragma unroll
    for (int pass = 0; pass < WARP_CHUNKS / 32; ++pass) {
        const int idx = pass * 32 + lane;
        const int local_row = row_warp * Cfg::WARP_ROWS + idx / O_TILES;
        const int chunk = col_half * O_TILES + idx % O_TILES;
        const int row = m0 + local_row;
        if (row < len_q && chunk < dv_chunks) {
            uint32_t vals[4];
            ld_shared_v4_b32(vals, q_smem + 16 * fa_swizzled_chunk<CHUNKS>(local_row, chunk));
            st_global_v4_b32(o_gmem + (int64_t)row * prm.o_row_stride + chunk * 8, vals);
        }
    }
}

/* Launch one instantiation on `stream`. The > 48 KiB dynamic shared-memory opt-in is a per-device
 * function attribute: set once per device ordinal (a bit per ordinal < 64, set after success). */
template <class Elem, int HEAD_DIM, bool DROPOUT = false, bool MODS = false>
static fa_status fa_fwd_launch(const fa_fwd_params *prm, int device_ordinal, cudaStream_t stream,
                               const char *name, const fa_dropout_params *dropout = nullptr,
                               const fa_mods_params *mods = nullptr) {
    using Cfg = fa_fwd_config<HEAD_DIM>;
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    const unsigned long long bit = device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (Cfg::SMEM_BYTES > 48 * 1024 && (bit == 0 || !(__atomic_load_n(&smem_configured, __ATOMIC_ACQUIRE) & bit))) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(fa_fwd_kernel<Elem, HEAD_DIM, DROPOUT, MODS>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)Cfg::SMEM_BYTES),
                      name);
        __atomic_fetch_or(&smem_configured, bit, __ATOMIC_RELEASE);
    }
    const dim3 grid = prm->heavy_first
                          ? dim3((unsigned)prm->heads_q, (unsigned)prm->batch, (unsigned)prm->num_m_blocks)
                          : dim3((unsigned)prm->num_m_blocks, (unsigned)prm->heads_q, (unsigned)prm->batch);
    fa_mods_arg<MODS> mods_arg{};
    if constexpr (MODS) static_cast<fa_mods_params &>(mods_arg) = *mods;
    fa_fwd_kernel<Elem, HEAD_DIM, DROPOUT, MODS><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(
        *prm, dropout != nullptr ? *dropout : fa_dropout_params{}, mods_arg);
    FA_CUDA_CHECK_LAUNCH(name);
    return FA_OK;
}

#endif /* FA_FWD_KERNEL_CUH */
