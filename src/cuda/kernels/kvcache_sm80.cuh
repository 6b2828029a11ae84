/*
 * kvcache_sm80.cuh: the CUDA KV-cache decode kernel (flash-decoding with GQA packing), mma.sync
 * tensor cores (sm_80+), templated on the element type and the head-dim bucket only. Included by
 * instances/kvcache_sm80_hdim<D>.cu, which instantiate it through their extern "C" launchers.
 *
 * Grid: x = split × row_tiles + row tile, y = kv head, z = batch. One block:
 *   1. geometry of sequence b from the device arrays, clamped (L0 = cache_seqlens[b], pad =
 *      cache_leftpad[b], cache row, appended slots [L0, L0 + seqlen_new)); the seqlen_q queries
 *      are the last ones of the keys [pad, L0 + seqlen_new);
 *   2. Q: the block's 16 packed rows (row r = token r / group, query head hk·group + r % group)
 *      by cp.async into shared memory, rotary applied in place, then kept in registers (d <= 128);
 *   3. its split's share of the key tiles (BLOCK_N = 64 cache slots, tiles aligned to slot
 *      multiples of 64; each thread copies a column of LOAD_PASSES consecutive rows, which share
 *      one page when page_size % LOAD_PASSES == 0) flows through a STAGES-deep cp.async
 *      pipeline; slots >= L0 come straight from k_new / v_new
 *      (appended keys rotated in shared memory), so no block ever reads a cache slot this call
 *      writes. Warp w computes slots 16w..16w+15 of every tile: S = Q Kᵀ (m16n8k16), masks,
 *      online softmax in base 2, O += P V, with its own running max / sum / O for all 16 rows;
 *   4. the four warp states are merged through shared memory; the block writes o and lse (one
 *      split) or the normalised partial o (fp32) and lse of its split;
 *   5. block (split 0, row tile 0) of each (b, kv head) also writes the appended rows into the
 *      cache (k_new rotated, v_new bit-exact), independently of everything above;
 *   6. with splits, the block that finds every split of its row tile done (flags in the
 *      workspace) merges the splits' partial states into o and lse, in split order.
 *
 * MODS (another instantiation): the score bias over (new query, cache slot) of common/mods.cuh,
 * every score through the transformed path and fa_mods_score (the cache has no document ids or
 * block masks, as on the CPU).
 */
#ifndef FA_KVCACHE_KERNEL_CUH
#define FA_KVCACHE_KERNEL_CUH

#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/kvcache_launch.h"
#include "cuda/common/kvcache_tiles.h"
#include "cuda/common/mods.cuh"

template <int HEAD_DIM>
struct fa_kv_config {
    static constexpr int D = HEAD_DIM;           /* padded head dim of q/k and v/o              */
    static constexpr int WARPS = FA_KV_WARPS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int BLOCK_M = FA_KV_BLOCK_M; /* packed query rows (one m16 tile)          */
    static constexpr int BLOCK_N = FA_KV_BLOCK_N; /* cache slots per tile                      */
    static constexpr int WARP_N = BLOCK_N / WARPS; /* slots per warp per tile: one k16 of P·V  */
    static constexpr int CHUNKS = D / 8;          /* 16-byte chunks per row                     */
    static constexpr int K_STEPS = D / 16;        /* k16 steps of Q Kᵀ                          */
    static constexpr int O_TILES = D / 8;         /* n8 tiles of O per warp                     */
    static constexpr int STAGES = fa_kv_stages(D);
    static constexpr bool Q_IN_REGS = fa_kv_q_in_regs(D) != 0;
    /* issue_tile's fast path (rows at one pointer step each); not at d 256, where the O
     * accumulator leaves ptxas too few registers for it (it spills) */
    static constexpr bool FAST_LOADS = D <= 128;
    static constexpr int ROWS_PER_PASS = THREADS / CHUNKS;   /* rows one load pass covers      */
    static constexpr int LOAD_PASSES = BLOCK_N / ROWS_PER_PASS; /* K (and V) rows per thread   */
    static constexpr int Q_PASSES = BLOCK_M / ROWS_PER_PASS;
    static constexpr int Q_BYTES = 2 * BLOCK_M * D;
    static constexpr int TILE_BYTES = 2 * BLOCK_N * D;      /* one K or V tile                 */
    static constexpr int STAGE_BYTES = 2 * TILE_BYTES;      /* K then V                        */
    static constexpr size_t SMEM_BYTES = fa_kv_smem_bytes(D);
    /* epilogue, in the stage area: red_o [WARPS][BLOCK_M][D + 8] fp32 (8 floats of padding per
     * row spread the fragment stores over the banks), then red_max, red_sum [WARPS][BLOCK_M]. */
    static constexpr int RED_ROW_FLOATS = D + 8;
    static constexpr int RED_O_BYTES = 4 * WARPS * BLOCK_M * RED_ROW_FLOATS;
    static constexpr int RED_BYTES = RED_O_BYTES + 2 * 4 * WARPS * BLOCK_M;
    static_assert(WARP_N == 16, "each warp owns one k16 step of P·V per tile");
    static_assert(CHUNKS % 8 == 0, "the swizzle needs rows of a multiple of 64 elements");
    static_assert(THREADS % CHUNKS == 0 && BLOCK_N % ROWS_PER_PASS == 0 && BLOCK_M % ROWS_PER_PASS == 0,
                  "tile loads give each thread a fixed chunk column and whole passes");
    static_assert(O_TILES % 2 == 0, "ldmatrix.x4.trans loads pairs of n8 tiles of V");
    static_assert(SMEM_BYTES == (size_t)Q_BYTES + (size_t)STAGES * STAGE_BYTES, "smem layout");
    static_assert(RED_BYTES <= STAGES * STAGE_BYTES, "the epilogue fits in the stage area");
    static_assert(STAGES >= 2, "the loop refills the stage computed one iteration earlier");
    static_assert(4 * BLOCK_M * (FA_KV_MAX_SPLITS + 1) + 16 + 4 * BLOCK_M * D <= STAGES * STAGE_BYTES &&
                      FA_KV_MAX_SPLITS % 32 == 0 && (BLOCK_M * (D / 4)) % THREADS == 0,
                  "the fused merge's weights and one split's partial o fit in the stage area; warp 0 reads "
                  "the flags 32 at a time; merge items divide among the threads");
};

/* 16-bit element <-> fp32 (round to nearest even), for the rotary embedding; BF16: the element
 * flag of the wgmma wrappers and of the quantised kernels' query scaling. */
template <class Elem>
struct fa_kv_convert;
template <>
struct fa_kv_convert<fa_bf16> {
    static constexpr bool BF16 = true;
    static __device__ __forceinline__ float to_float(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
    static __device__ __forceinline__ uint16_t from_float(float x) {
        return (uint16_t)(fa_bf16::pack2(x, 0.0f) & 0xffffu);
    }
};
template <>
struct fa_kv_convert<fa_f16> {
    static constexpr bool BF16 = false;
    static __device__ __forceinline__ float to_float(uint16_t x) { return __half2float(__ushort_as_half(x)); }
    static __device__ __forceinline__ uint16_t from_float(float x) {
        return (uint16_t)(fa_f16::pack2(x, 0.0f) & 0xffffu);
    }
};

/* The rotation of one pair, in fp32 without contraction (ya = xa·c - xb·s, yb = xa·s + xb·c each
 * rounded per operation), so the shared-memory path (keys attended, q) and the global path (keys
 * written to the cache) give the same bits. */
__device__ __forceinline__ void fa_kv_rotate(float xa, float xb, float c, float s, float *ya, float *yb) {
    *ya = __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s));
    *yb = __fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c));
}

/* Dimensions (a, b) and table column of rotary pair p (0 <= p < rotary_dim / 2). */
__device__ __forceinline__ void fa_kv_rotary_pair_dims(int p, int half, int interleaved, int *da, int *db) {
    *da = interleaved ? 2 * p : p;
    *db = interleaved ? 2 * p + 1 : p + half;
}

/* ---- 1. geometry --------------------------------------------------------------------------- */

/* Where block (split, row tile, kv head hk, sequence b) reads and writes, and what the lane's two
 * fragment rows (h = 0: g, h = 1: g + 8) see. */
struct fa_kv_block {
    int b, hk, split, row_tile;
    int g, sq;                 /* group, seqlen_q                                             */
    bool append, paged;
    int n_new;                 /* appended tokens (seqlen_new), 0 without an append           */
    int capacity;              /* seqlen_k: slots per sequence                                */
    int cache_len, pad;        /* L0 (cache tokens before the append), left padding           */
    int cache_row;             /* contiguous cache only: the batch row                         */
    const int32_t *block_table_row; /* paged only                                            */
    int table_last;            /* paged only: last usable block-table column                  */
    int rows_packed, r0, r_last; /* the block's packed rows [r0, r_last]                     */
    int slot_lo, slot_hi;       /* slots some row of the block sees                            */
    int nomask_lo, nomask_hi;  /* slots every row of the block sees                           */
    int tile_first, n_tiles;   /* this split's key tiles                                       */
    int row_lo[2], row_hi[2], row_diag[2]; /* the lane's rows: visible slots, diagonal slot  */
    float row_slope_log2[2];   /* ALiBi slope · log2(e), or 0                                 */
};

/* Step 1: sequence geometry from the device arrays. They are device memory the host never
 * checked: clamp so that every slot touched is < seqlen_k and every page id < num_pages. */
template <class Cfg>
__device__ __forceinline__ fa_kv_block fa_kv_block_geometry(const fa_kv_params &prm, int quad_row) {
    constexpr int BLOCK_N = Cfg::BLOCK_N, BLOCK_M = Cfg::BLOCK_M;
    constexpr float LOG2E = 1.4426950408889634f;
    fa_kv_block blk;
    blk.row_tile = (int)(blockIdx.x % (unsigned)prm.row_tiles);
    blk.split = (int)(blockIdx.x / (unsigned)prm.row_tiles);
    blk.hk = blockIdx.y;
    blk.b = blockIdx.z;
    const int b = blk.b, g = prm.group, sq = prm.seqlen_q;
    blk.g = g;
    blk.sq = sq;
    blk.append = prm.k_new != nullptr;
    blk.paged = prm.block_table != nullptr;
    blk.capacity = prm.seqlen_k;
    blk.n_new = blk.append ? prm.seqlen_new : 0;
    const int l0_max = max(0, blk.capacity - blk.n_new);
    const int cache_len = min(max(prm.cache_seqlens != nullptr ? prm.cache_seqlens[b] : blk.capacity, 0), l0_max);
    const int pad = min(max(prm.cache_leftpad != nullptr ? prm.cache_leftpad[b] : 0, 0), cache_len);
    blk.cache_len = cache_len;
    blk.pad = pad;
    const int slot_end = cache_len + blk.n_new; /* attended slots: [pad, slot_end)              */
    const int len_k = slot_end - pad;
    blk.cache_row = blk.paged ? 0
                          : min(max(prm.cache_batch_idx != nullptr ? prm.cache_batch_idx[b] : b, 0),
                                prm.cache_batch - 1);
    blk.block_table_row = blk.paged ? prm.block_table + (int64_t)b * prm.block_table_batch_stride : nullptr;
    blk.table_last = !blk.paged ? 0
                   : prm.block_table_batch_stride - 1 > INT32_MAX ? INT32_MAX
                                                                  : (int)(prm.block_table_batch_stride - 1);

    /* Visible keys of query token t: [key_lo(t), key_hi(t)) in key units (fa_key_lo / fa_key_hi,
     * fa_internal.h). */
    auto key_lo = [&](int t) -> int { return fa_key_lo_clamped((int64_t)t + len_k - sq, prm.window_left, len_k); };
    auto key_hi = [&](int t) -> int { return fa_key_hi_clamped((int64_t)t + len_k - sq, prm.window_right, len_k); };

    /* The block's packed rows [r0, r_last]; tokens are non-decreasing in r, and so are both
     * ends of the key range, so the block needs slots [slot_lo, slot_hi) and a tile inside
     * [nomask_lo, nomask_hi) is visible to every row. */
    blk.rows_packed = prm.rows_packed;
    blk.r0 = blk.row_tile * BLOCK_M;
    blk.r_last = min(blk.r0 + BLOCK_M, blk.rows_packed) - 1;
    const int t_first = blk.r0 / g, t_last = blk.r_last / g;
    blk.slot_lo = pad + key_lo(t_first);
    blk.slot_hi = pad + key_hi(t_last);
    blk.nomask_lo = pad + key_lo(t_last);
    blk.nomask_hi = pad + key_hi(t_first);

    /* This split's tiles: the block's tiles [m_begin, m_end) cut into num_splits even pieces. */
    blk.tile_first = 0;
    blk.n_tiles = 0;
    if (blk.slot_hi > blk.slot_lo) {
        const int m_begin = blk.slot_lo / BLOCK_N, m_end = (blk.slot_hi - 1) / BLOCK_N + 1;
        const int per_split = (m_end - m_begin + prm.num_splits - 1) / prm.num_splits;
        blk.tile_first = m_begin + blk.split * per_split;
        blk.n_tiles = max(0, min(per_split, m_end - blk.tile_first));
    }

    /* The two rows this lane holds in fragments (h = 0: g, h = 1: g + 8). Padding rows (beyond
     * rows_packed) take the last row's token and head: their Q is zero and nothing is stored. */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rr = min(blk.r0 + quad_row + 8 * h, blk.rows_packed - 1);
        const int t = rr / g;
        blk.row_lo[h] = pad + key_lo(t);
        blk.row_hi[h] = pad + key_hi(t);
        blk.row_diag[h] = pad + t + len_k - sq; /* slot on the diagonal: ALiBi distance |diag - slot| */
        blk.row_slope_log2[h] = prm.alibi_slopes != nullptr
                                  ? prm.alibi_slopes[(int64_t)b * prm.alibi_batch_stride + blk.hk * g + rr % g] * LOG2E
                                  : 0.0f;
    }
    return blk;
}

/* ---- 2. Q and the rotary embedding ---------------------------------------------------------- */

/* Step 2: cp.async of the block's Q tile (one commit group); rows beyond rows_packed and chunks
 * beyond head_dim are zero-filled. The thread copies chunk `chunk` of rows row0, row0 + RPP, ... */
template <class Cfg>
__device__ __forceinline__ void fa_kv_issue_q(const fa_kv_params &prm, const fa_kv_block &blk, uint32_t q_smem,
                                              int row0, int chunk, int d_chunks) {
    const uint16_t *q_seq = (const uint16_t *)prm.q + (int64_t)blk.b * prm.q_batch_stride;
#pragma unroll
    for (int pass = 0; pass < Cfg::Q_PASSES; ++pass) {
        const int r = row0 + pass * Cfg::ROWS_PER_PASS;
        const int rr = blk.r0 + r;
        const bool ok = rr < blk.rows_packed && chunk < d_chunks;
        const uint16_t *src = q_seq + (int64_t)(rr / blk.g) * prm.q_row_stride +
                              (int64_t)(blk.hk * blk.g + rr % blk.g) * prm.q_head_stride + chunk * 8;
        cp_async_cg_16(q_smem + 16 * fa_swizzled_chunk<Cfg::CHUNKS>(r, chunk), ok ? (const void *)src : prm.q,
                       ok ? 16 : 0);
    }
    cp_async_commit_group();
}

/* Rotate pair p (dims da, db) of row `row` of a swizzled 16-bit tile in place, at table position
 * `position` (clamped to the table). */
template <class Cfg, class Cvt>
__device__ __forceinline__ void fa_kv_rotate_smem_pair(const fa_kv_params &prm, int rot_half, uint32_t tile, int row,
                                                       int p, int position) {
    int da, db;
    fa_kv_rotary_pair_dims(p, rot_half, prm.rotary_interleaved, &da, &db);
    const int64_t pos = min(max(position, 0), prm.rotary_seqlen - 1);
    const float cs = Cvt::to_float(((const uint16_t *)prm.rotary_cos)[pos * rot_half + p]);
    const float sn = Cvt::to_float(((const uint16_t *)prm.rotary_sin)[pos * rot_half + p]);
    const uint32_t addr_a = tile + 16 * fa_swizzled_chunk<Cfg::CHUNKS>(row, da / 8) + 2 * (da % 8);
    const uint32_t addr_b = tile + 16 * fa_swizzled_chunk<Cfg::CHUNKS>(row, db / 8) + 2 * (db % 8);
    float ya, yb;
    fa_kv_rotate(Cvt::to_float(ld_shared_u16(addr_a)), Cvt::to_float(ld_shared_u16(addr_b)), cs, sn, &ya, &yb);
    st_shared_u16(addr_a, Cvt::from_float(ya));
    st_shared_u16(addr_b, Cvt::from_float(yb));
}

/* Wait for Q (the commit groups after it: the key prologue's STAGES - 1), then rotate it in
 * place: query token t sits at the cache slot L0 (+ t when causal / windowed), left padding
 * included, as flash_attn 2.x rotates it. */
template <class Cfg, class Cvt>
__device__ __forceinline__ void fa_kv_land_q(const fa_kv_params &prm, const fa_kv_block &blk, uint32_t q_smem,
                                             int rot_half, int tid) {
    cp_async_wait_group<Cfg::STAGES - 1>(); /* Q landed (this thread's copies)             */
    __syncthreads();                        /* ... everyone's                               */
    if (prm.rotary_cos != nullptr) {
        for (int idx = tid; idx < Cfg::BLOCK_M * rot_half; idx += Cfg::THREADS) {
            const int r = idx / rot_half, rr = blk.r0 + r;
            if (rr < blk.rows_packed)
                fa_kv_rotate_smem_pair<Cfg, Cvt>(prm, rot_half, q_smem, r, idx % rot_half,
                                                 blk.cache_len + (prm.rotary_q_per_token ? rr / blk.g : 0));
        }
        __syncthreads(); /* rotated Q visible to the fragment loads */
    }
}

/* ---- 3. key tiles: loads ---------------------------------------------------------------------- */

/* What the decode kernels' tile loaders (fa_kv_tile_loader, fa_kvl_tile_loader) know of block
 * (b, hk)'s cache and appended rows; fa_kv_append reads this view of either. */
struct fa_kv_cache_view {
    int d_chunks, dv_chunks;           /* 16-byte chunks of a K / V row                     */
    int page_size, num_pages_last;
    const uint16_t *k_cache, *v_cache; /* head hk of the cache                             */
    const uint16_t *k_seq, *v_seq;     /* contiguous only: the sequence's cache row         */
    const uint16_t *k_new, *v_new;     /* append only: sequence b, head hk                  */

    __device__ __forceinline__ fa_kv_cache_view(const fa_kv_params &prm, const fa_kv_block &blk) {
        d_chunks = prm.head_dim / 8;
        dv_chunks = prm.head_dim_v / 8;
        page_size = prm.page_size;
        num_pages_last = prm.num_pages - 1;
        k_cache = (const uint16_t *)prm.k + (int64_t)blk.hk * prm.k_head_stride;
        v_cache = (const uint16_t *)prm.v + (int64_t)blk.hk * prm.v_head_stride;
        k_new = blk.append ? (const uint16_t *)prm.k_new + (int64_t)blk.b * prm.knew_batch_stride +
                               (int64_t)blk.hk * prm.knew_head_stride
                         : nullptr;
        v_new = blk.append ? (const uint16_t *)prm.v_new + (int64_t)blk.b * prm.vnew_batch_stride +
                               (int64_t)blk.hk * prm.vnew_head_stride
                         : nullptr;
        k_seq = k_cache + (int64_t)blk.cache_row * prm.k_batch_stride;
        v_seq = v_cache + (int64_t)blk.cache_row * prm.v_batch_stride;
    }
};

/* K/V tile loads. Per tile and thread a paged cache needs the block-table entries of its rows and
 * the in-page position of its first row: one division and, when page_size is a multiple of
 * LOAD_PASSES (16, 64, 256, ... at d 128), a single table read, since the thread's rows then lie
 * in one page. Other page sizes (1, 3, ...) read one entry per row. The entries are read one tile
 * ahead of the copies that use them (the prologue's all at once, in the loop those of tile m + 1
 * right after tile m's copies), so the dependent load never stalls the issue of the copies.
 * The thread copies chunk `chunk` of the LOAD_PASSES consecutive tile rows [row_first,
 * row_first + LOAD_PASSES). Consecutive rows are consecutive cache slots, so they share a page
 * (and one block-table entry) unless a page ends among them. One warp-wide copy still covers
 * whole 16-byte-chunk rows: 32 / CHUNKS rows of CHUNKS · 16 bytes each. */
template <class Cfg>
struct fa_kv_tile_loader : fa_kv_cache_view {
    static constexpr int LOAD_PASSES = Cfg::LOAD_PASSES, BLOCK_N = Cfg::BLOCK_N, CHUNKS = Cfg::CHUNKS;
    const fa_kv_params &prm;
    const fa_kv_block &blk;
    uint32_t stage_smem;
    int chunk, row_first;
    bool rows_one_page;              /* block-uniform                                     */

    __device__ __forceinline__ fa_kv_tile_loader(const fa_kv_params &prm_, const fa_kv_block &blk_, uint32_t stage,
                                                 int chunk_, int row0)
        : fa_kv_cache_view(prm_, blk_), prm(prm_), blk(blk_), stage_smem(stage), chunk(chunk_),
          row_first(row0 * LOAD_PASSES) {
        rows_one_page = blk.paged && page_size % LOAD_PASSES == 0;
    }

    /* Page state of tile m for this thread: ids[pass] = block-table entry of row row_first + pass
     * (all passes in ids[0] when rows_one_page), first_in_page = slot of its first row within
     * that row's page. Unclamped: issue clamps the ids. */
    __device__ __forceinline__ void fetch_pages(int m, int (&ids)[LOAD_PASSES], int &first_in_page) const {
        if (!blk.paged) return;
        const int c = m * BLOCK_N + row_first;
        int index = c / page_size;
        int in_page = c - index * page_size;
        first_in_page = in_page;
        if (rows_one_page) {
            ids[0] = blk.block_table_row[min(index, blk.table_last)];
        } else {
#pragma unroll
            for (int pass = 0; pass < LOAD_PASSES; ++pass) {
                ids[pass] = blk.block_table_row[min(index, blk.table_last)];
                if (++in_page == page_size) { /* the next row starts the next page */
                    in_page = 0;
                    ++index;
                }
            }
        }
    }

    /* cp.async tile m (slots 64m ..) into `stage`. Rows outside [slot_lo, slot_hi) and chunks past
     * d / dv are zero-filled (nothing is read), so pad rows never hold garbage (0·NaN would leak
     * into P·V). Slots >= cache_len are the appended tokens: read from k_new / v_new. A
     * contiguous cache and a paged one with rows_one_page address row pass as the thread's first
     * row + pass row strides; other paged rows take their own page. */
    __device__ __forceinline__ void issue(int m, int stage, const int (&ids)[LOAD_PASSES], int first_in_page) const {
        const int c_first = m * BLOCK_N + row_first;
        const uint32_t k_dst = stage_smem + stage * Cfg::STAGE_BYTES;
        const uint32_t v_dst = k_dst + Cfg::TILE_BYTES;
        const uint16_t *k_first, *v_first;
        if (blk.paged) {
            const int64_t id = min(max(ids[0], 0), num_pages_last);
            k_first = k_cache + id * prm.k_batch_stride + (int64_t)first_in_page * prm.k_row_stride;
            v_first = v_cache + id * prm.v_batch_stride + (int64_t)first_in_page * prm.v_row_stride;
        } else {
            k_first = k_seq + (int64_t)c_first * prm.k_row_stride;
            v_first = v_seq + (int64_t)c_first * prm.v_row_stride;
        }
        const bool k_chunk = chunk < d_chunks, v_chunk = chunk < dv_chunks;
        /* Fast path (d <= 128), every row of the thread a cache row of the block's range in one
         * page (or a contiguous cache): one pointer step per row. Threads at the ends of the
         * range, at appended slots or at page ends among their rows take the general path. */
        if (Cfg::FAST_LOADS && c_first >= blk.slot_lo && c_first + LOAD_PASSES <= min(blk.slot_hi, blk.cache_len) &&
            (!blk.paged || rows_one_page)) {
            const uint16_t *k_src = k_first + chunk * 8, *v_src = v_first + chunk * 8;
#pragma unroll
            for (int pass = 0; pass < LOAD_PASSES; ++pass) {
                const uint32_t dst = 16 * fa_swizzled_chunk<CHUNKS>(row_first + pass, chunk);
                cp_async_cg_16(k_dst + dst, k_chunk ? (const void *)k_src : prm.k, k_chunk ? 16 : 0);
                cp_async_cg_16(v_dst + dst, v_chunk ? (const void *)v_src : prm.v, v_chunk ? 16 : 0);
                k_src += prm.k_row_stride;
                v_src += prm.v_row_stride;
            }
            return;
        }
        int in_page = first_in_page; /* paged without rows_one_page: position of row `pass` */
#pragma unroll
        for (int pass = 0; pass < LOAD_PASSES; ++pass) {
            const int row = row_first + pass;
            const int c = c_first + pass;
            const bool valid = c >= blk.slot_lo && c < blk.slot_hi;
            const uint16_t *k_src = k_first + pass * prm.k_row_stride;
            const uint16_t *v_src = v_first + pass * prm.v_row_stride;
            if (!valid) {
                /* zero-fill below: the sources are never read */
            } else if (c >= blk.cache_len) { /* only with append: slot_hi <= slot_end = cache_len otherwise */
                k_src = k_new + (int64_t)(c - blk.cache_len) * prm.knew_row_stride;
                v_src = v_new + (int64_t)(c - blk.cache_len) * prm.vnew_row_stride;
            } else if (blk.paged && !rows_one_page) {
                const int64_t id = min(max(ids[pass], 0), num_pages_last);
                k_src = k_cache + id * prm.k_batch_stride + (int64_t)in_page * prm.k_row_stride;
                v_src = v_cache + id * prm.v_batch_stride + (int64_t)in_page * prm.v_row_stride;
            }
            if (blk.paged && !rows_one_page && ++in_page == page_size) in_page = 0;
            const uint32_t dst = 16 * fa_swizzled_chunk<CHUNKS>(row, chunk);
            const bool k_ok = valid && k_chunk, v_ok = valid && v_chunk;
            cp_async_cg_16(k_dst + dst, k_ok ? (const void *)(k_src + chunk * 8) : prm.k, k_ok ? 16 : 0);
            cp_async_cg_16(v_dst + dst, v_ok ? (const void *)(v_src + chunk * 8) : prm.v, v_ok ? 16 : 0);
        }
    }

    /* Prologue: the page state of tiles 0 .. STAGES-1, then the copies of tiles 0 .. STAGES-2,
     * one commit per stage, empty or not, so the wait_group counts of the loop are constants.
     * Group order: Q, tile 0, tile 1, ... page_ids / page_first then hold tile STAGES-1's. */
    __device__ __forceinline__ void prologue(int (&page_ids)[LOAD_PASSES], int &page_first) const {
        constexpr int STAGES = Cfg::STAGES;
        int prologue_ids[STAGES][LOAD_PASSES];
        int prologue_first[STAGES];
#pragma unroll
        for (int st = 0; st < STAGES; ++st) {
            prologue_first[st] = 0;
#pragma unroll
            for (int pass = 0; pass < LOAD_PASSES; ++pass) prologue_ids[st][pass] = 0;
        }
#pragma unroll
        for (int st = 0; st < STAGES; ++st)
            if (st < blk.n_tiles) fetch_pages(blk.tile_first + st, prologue_ids[st], prologue_first[st]);
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {
            if (st < blk.n_tiles) issue(blk.tile_first + st, st, prologue_ids[st], prologue_first[st]);
            cp_async_commit_group();
        }
#pragma unroll
        for (int pass = 0; pass < LOAD_PASSES; ++pass) page_ids[pass] = prologue_ids[STAGES - 1][pass];
        page_first = prologue_first[STAGES - 1];
    }
};

/* ---- 3. key tiles: compute -------------------------------------------------------------------- */

/* Fragment addressing as in the forward (fwd_sm80.cuh): every ldmatrix reads rows r with
 * r & 7 == lane & 7 and logical chunks 2·step + {0, 1}; the lane-dependent part of the swizzled
 * offset takes 4 values, kept in 4 registers per operand. */
template <int CHUNKS>
__device__ __forceinline__ void fa_kv_frag_offsets(int row, int chunk_lo, int lane, uint32_t offs[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) offs[i] = 16u * (uint32_t)(row * CHUNKS + ((2 * i + chunk_lo) ^ (lane & 7)));
}
template <int CHUNKS>
__device__ __forceinline__ uint32_t fa_kv_frag_addr(uint32_t base, const uint32_t offs[4], int step, int row_offset) {
    return base + offs[step % 4] + 16u * (uint32_t)(8 * (step / 4) + row_offset * CHUNKS);
}

/* The lane's operand state of the key loop: Q fragments (in registers when Q_IN_REGS) and the
 * lane's ldmatrix offsets of Q, K and V. */
template <class Cfg>
struct fa_kv_fragments {
    uint32_t q_rmem[Cfg::Q_IN_REGS ? Cfg::K_STEPS : 1][4];
    uint32_t q_offs[4], k_offs[4], v_offs[4];
};

template <class Cfg>
__device__ __forceinline__ void fa_kv_load_fragments(fa_kv_fragments<Cfg> &f, uint32_t q_smem, int lane) {
    constexpr int CHUNKS = Cfg::CHUNKS;
    /* Q (A operand, 16 rows × k16): lanes 0-15 rows 0-15 at chunk 2k, lanes 16-31 at 2k + 1. */
    fa_kv_frag_offsets<CHUNKS>(lane & 15, lane >> 4, lane, f.q_offs);
    if (Cfg::Q_IN_REGS) {
#pragma unroll
        for (int ks = 0; ks < (Cfg::Q_IN_REGS ? Cfg::K_STEPS : 1); ++ks)
            ldmatrix_x4(f.q_rmem[ks], fa_kv_frag_addr<CHUNKS>(q_smem, f.q_offs, ks, 0));
    }
    /* K (B operand of Q Kᵀ, keys n16 × dims k16): lanes 0-7 keys 0-7 dims 0-7, 8-15 keys 0-7
     * dims 8-15, 16-23 keys 8-15 dims 0-7, 24-31 keys 8-15 dims 8-15 -> b[0..1] keys 0-7,
     * b[2..3] keys 8-15. */
    fa_kv_frag_offsets<CHUNKS>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, lane, f.k_offs);
    /* V (B operand of P V via ldmatrix.trans, keys k16 × dims n16): lanes 0-7 keys 0-7 dims 0-7,
     * 8-15 keys 8-15 dims 0-7, 16-23 keys 0-7 dims 8-15, 24-31 keys 8-15 dims 8-15. */
    fa_kv_frag_offsets<CHUNKS>((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4, lane, f.v_offs);
}

/* Appended keys of the tile at slot c0 (stage k_tile): rotated in place before anyone reads them. */
template <class Cfg, class Cvt>
__device__ __forceinline__ void fa_kv_rotate_appended(const fa_kv_params &prm, const fa_kv_block &blk, int rot_half,
                                                      uint32_t k_tile, int c0, int tid) {
    const int a_lo = max(max(c0, blk.cache_len), blk.slot_lo), a_hi = min(c0 + Cfg::BLOCK_N, blk.slot_hi);
    if (a_hi > a_lo) { /* block-uniform */
        for (int idx = tid; idx < (a_hi - a_lo) * rot_half; idx += Cfg::THREADS) {
            const int c = a_lo + idx / rot_half;
            fa_kv_rotate_smem_pair<Cfg, Cvt>(prm, rot_half, k_tile, c - c0, idx % rot_half, c); /* at its slot */
        }
        __syncthreads(); /* rotated K visible to every warp */
    }
}

template <class Cfg, bool MODS>
__device__ __forceinline__ void fa_kv_score_transform(const fa_kv_params &prm, const fa_kv_block &blk, int cw,
                                                      int quad_col, float (&s_rmem)[2][4],
                                                      const fa_mods_arg<MODS> &mods);

/* S = Q Kᵀ for the warp's 16 slots from cw: s_rmem[nt][e] = (row g + 8·(e>>1), slot
 * cw + 8·nt + 2t + (e&1)), then the transform (softcap / ALiBi / non-positive scale -> log2 units)
 * and the mask, the latter only where the warp's slots are not visible to every row of the block. */
template <class Elem, class Cfg, bool MODS>
__device__ __forceinline__ void fa_kv_scores(const fa_kv_params &prm, const fa_kv_block &blk,
                                             const fa_kv_fragments<Cfg> &f, uint32_t q_smem, uint32_t k_tile,
                                             int cw, int warp, int quad_col, float (&s_rmem)[2][4],
                                             const fa_mods_arg<MODS> &mods) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_rmem[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < Cfg::K_STEPS; ++ks) {
        uint32_t a[4];
        if (Cfg::Q_IN_REGS) {
#pragma unroll
            for (int x = 0; x < 4; ++x) a[x] = f.q_rmem[Cfg::Q_IN_REGS ? ks : 0][x];
        } else {
            ldmatrix_x4(a, fa_kv_frag_addr<Cfg::CHUNKS>(q_smem, f.q_offs, ks, 0));
        }
        uint32_t bk[4];
        ldmatrix_x4(bk, fa_kv_frag_addr<Cfg::CHUNKS>(k_tile, f.k_offs, ks, warp * Cfg::WARP_N));
        Elem::mma(s_rmem[0], a, &bk[0]);
        Elem::mma(s_rmem[1], a, &bk[2]);
    }
    fa_kv_score_transform<Cfg, MODS>(prm, blk, cw, quad_col, s_rmem, mods);
}

/* The scores' transform (softcap / ALiBi / non-positive scale -> log2 units) and mask, on the
 * warp's S = Q Kᵀ of the slots from cw (layout of fa_kv_scores); the mask only where the warp's
 * slots are not visible to every row of the block. */
template <class Cfg, bool MODS>
__device__ __forceinline__ void fa_kv_score_transform(const fa_kv_params &prm, const fa_kv_block &blk, int cw,
                                                      int quad_col, float (&s_rmem)[2][4],
                                                      const fa_mods_arg<MODS> &mods) {
    const bool need_mask = !(cw >= blk.nomask_lo && cw + Cfg::WARP_N <= blk.nomask_hi);
    if (prm.transform_scores || need_mask || MODS) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            /* MODS: the bias of the row's (query token, query head) over the cache slots */
            int mods_token = 0;
            fa_mods_tile mods_tile;
            if constexpr (MODS) {
                const int rr = min(blk.r0 + (int)(threadIdx.x % 32) / 4 + 8 * h, blk.rows_packed - 1);
                mods_token = rr / blk.g;
                mods_tile = fa_mods_tile_at(mods, blk.b, blk.hk * blk.g + rr % blk.g, false, 0, 0, 0, 0);
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = cw + 8 * nt + 2 * quad_col + e;
                    float x = s_rmem[nt][2 * h + e];
                    if (prm.transform_scores) {
                        x = prm.softcap_pre != 0.0f ? prm.softcap_post_log2 * fa_tanh(x * prm.softcap_pre)
                                                   : x * prm.scale_log2;
                        x -= blk.row_slope_log2[h] * (float)abs(blk.row_diag[h] - c);
                    }
                    if constexpr (MODS)
                        s_rmem[nt][2 * h + e] = fa_mods_score(mods, mods_tile, mods_token, c, true,
                                                              c >= blk.row_lo[h] && c < blk.row_hi[h], x,
                                                              1.4426950408889634f);
                    else
                        s_rmem[nt][2 * h + e] = (c < blk.row_lo[h] || c >= blk.row_hi[h]) ? -CUDART_INF_F : x;
                }
        }
    }
}

/* Online softmax in base 2 (as the forward): p = 2^(s·mul - max·mul); a row whose max is still
 * -inf uses 0 (all its p are 0, no inf - inf). P goes straight to the A fragment of the k16 step:
 * a[0] = (g, 2t..), a[1] = (g+8, 2t..), a[2] = (g, 8+2t..), a[3] = (g+8, 8+2t..). Then O += P V
 * for the warp's 16 slots. */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kv_softmax_pv(const fa_kv_fragments<Cfg> &f, uint32_t v_tile, int warp,
                                                 float score_mul, const float (&s_rmem)[2][4],
                                                 float (&o_rmem)[Cfg::O_TILES][4], float (&row_max)[2],
                                                 float (&row_sum)[2]) {
    uint32_t p_frag[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float tile_max = fmaxf(fmaxf(s_rmem[0][2 * h], s_rmem[0][2 * h + 1]),
                               fmaxf(s_rmem[1][2 * h], s_rmem[1][2 * h + 1]));
        tile_max = fa_quad_max(tile_max);
        float max_scaled;
        const float rescale = fa_online_max_step(row_max[h], tile_max, score_mul, max_scaled);
#pragma unroll
        for (int ot = 0; ot < Cfg::O_TILES; ++ot) {
            o_rmem[ot][2 * h] *= rescale;
            o_rmem[ot][2 * h + 1] *= rescale;
        }
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const float p0 = ex2_approx_ftz_f32(fmaf(s_rmem[nt][2 * h], score_mul, -max_scaled));
            const float p1 = ex2_approx_ftz_f32(fmaf(s_rmem[nt][2 * h + 1], score_mul, -max_scaled));
            p_frag[2 * nt + h] = Elem::pack2(p0, p1);
            sum += p0 + p1;
        }
        row_sum[h] = fmaf(row_sum[h], rescale, sum);
    }
#pragma unroll
    for (int op = 0; op < Cfg::O_TILES / 2; ++op) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, fa_kv_frag_addr<Cfg::CHUNKS>(v_tile, f.v_offs, op, warp * Cfg::WARP_N));
        Elem::mma(o_rmem[2 * op], p_frag, &bv[0]);
        Elem::mma(o_rmem[2 * op + 1], p_frag, &bv[2]);
    }
}

/* ---- 4. warp merge and output ------------------------------------------------------------------ */

/* Step 4: merge the 4 warps' states through shared memory (the stage area) and write o and lse
 * (one split) or this split's normalised partial o and lse. Every copy must have landed and every
 * warp left the loop before the stage area is reused. QUAD_COLS: o_rmem in the column order of
 * the quantised register kernel (n-tiles 2s and 2s + 1 hold columns 16s + 4t + {0, 2} and
 * {1, 3}), stored as 4 consecutive columns per lane. */
template <class Elem, class Cfg, bool QUAD_COLS = false>
__device__ __forceinline__ void fa_kv_merge_warps(const fa_kv_params &prm, const fa_kv_block &blk, uint32_t stage_smem,
                                                  const float (&o_rmem)[Cfg::O_TILES][4], const float (&row_max)[2],
                                                  const float (&row_sum)[2], int tid, float score_mul) {
    constexpr int BLOCK_M = Cfg::BLOCK_M, WARPS = Cfg::WARPS, CHUNKS = Cfg::CHUNKS;
    constexpr float LOG2E = 1.4426950408889634f;
    const int warp = tid / 32, lane = tid % 32, quad_row = lane / 4, quad_col = lane % 4;
    const int g = blk.g, sq = blk.sq, b = blk.b;
    const int dv_chunks = prm.head_dim_v / 8;
    cp_async_wait_all();
    __syncthreads();
    const uint32_t red_o = stage_smem;
    const uint32_t red_max = red_o + Cfg::RED_O_BYTES;
    const uint32_t red_sum = red_max + 4 * WARPS * BLOCK_M;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = quad_row + 8 * h;
        const float sum = fa_quad_sum(row_sum[h]);
        if (quad_col == 0) {
            st_shared_f32(red_max + 4 * (warp * BLOCK_M + r), row_max[h]);
            st_shared_f32(red_sum + 4 * (warp * BLOCK_M + r), sum);
        }
        if constexpr (QUAD_COLS) {
#pragma unroll
            for (int sg = 0; sg < Cfg::O_TILES / 2; ++sg) {
                const uint32_t bits[4] = {
                    __float_as_uint(o_rmem[2 * sg][2 * h]), __float_as_uint(o_rmem[2 * sg + 1][2 * h]),
                    __float_as_uint(o_rmem[2 * sg][2 * h + 1]), __float_as_uint(o_rmem[2 * sg + 1][2 * h + 1])};
                st_shared_v4_b32(red_o + 4 * ((warp * BLOCK_M + r) * Cfg::RED_ROW_FLOATS + 16 * sg + 4 * quad_col),
                                 bits);
            }
        } else {
#pragma unroll
            for (int ot = 0; ot < Cfg::O_TILES; ++ot)
                st_shared_v2_f32(red_o + 4 * ((warp * BLOCK_M + r) * Cfg::RED_ROW_FLOATS + ot * 8 + 2 * quad_col),
                                 o_rmem[ot][2 * h], o_rmem[ot][2 * h + 1]);
        }
    }
    __syncthreads(); /* all warps' states visible */

    /* Final: thread per (row, 8-column chunk). Weights f_w = 2^(m_w·mul - M·mul), L = Σ f_w l_w
     * (+ the sink, once: split 0), o = Σ f_w o_w / L, lse = (M·mul + log2 L)·ln 2. */
    const bool sink_here = prm.sink_logits != nullptr && blk.split == 0;
    for (int item = tid; item < BLOCK_M * CHUNKS; item += Cfg::THREADS) {
        const int r = item / CHUNKS, ch = item % CHUNKS;
        const int rr = blk.r0 + r;
        if (rr >= blk.rows_packed || ch >= dv_chunks) continue;
        const int t = rr / g, hq = blk.hk * g + rr % g;
        float m_w[WARPS], f_w[WARPS];
        float m_all = -CUDART_INF_F;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            m_w[w] = ld_shared_f32(red_max + 4 * (w * BLOCK_M + r));
            m_all = fmaxf(m_all, m_w[w]);
        }
        /* M = max(row max, sink) so a sink far above every score cannot overflow exp2; with no
         * key and no sink M = 0 and L stays 0. */
        const float sink_log2 = sink_here ? prm.sink_logits[hq] * LOG2E : -CUDART_INF_F;
        float max_scaled = fmaxf(m_all == -CUDART_INF_F ? -CUDART_INF_F : m_all * score_mul, sink_log2);
        if (max_scaled == -CUDART_INF_F) max_scaled = 0.0f;
        float l_all = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            f_w[w] = ex2_approx_ftz_f32(m_w[w] * score_mul - max_scaled); /* 0 for an empty warp */
            l_all = fmaf(f_w[w], ld_shared_f32(red_sum + 4 * (w * BLOCK_M + r)), l_all);
        }
        if (sink_here) l_all += exp2f(sink_log2 - max_scaled);
        const float inv = fa_row_scale(1.0f, l_all); /* 0: no visible key; NaN: a NaN score */
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            float x[8];
            const uint32_t src = red_o + 4 * ((w * BLOCK_M + r) * Cfg::RED_ROW_FLOATS + ch * 8);
            ld_shared_v4_f32(&x[0], src);
            ld_shared_v4_f32(&x[4], src + 16);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = fmaf(f_w[w], x[i], acc[i]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] *= inv;
        const float lse_val = fa_row_lse(max_scaled, l_all);
        const int64_t lse_index = ((int64_t)b * prm.heads_q + hq) * sq + t;
        if (prm.num_splits == 1) {
            uint32_t packed[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) packed[i] = Elem::pack2(acc[2 * i], acc[2 * i + 1]);
            st_global_v4_b32((uint16_t *)prm.o + (int64_t)b * prm.o_batch_stride + (int64_t)t * prm.o_row_stride +
                                 (int64_t)hq * prm.o_head_stride + ch * 8,
                             packed);
            if (ch == 0 && prm.lse != nullptr) prm.lse[lse_index] = lse_val;
        } else {
            const int64_t part_row = (int64_t)blk.split * prm.batch * prm.heads_q * sq + lse_index;
            float *dst = prm.o_partial + part_row * prm.head_dim_v + ch * 8;
            uint32_t bits[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) bits[i] = __float_as_uint(acc[i]);
            st_global_v4_b32(dst, &bits[0]);
            st_global_v4_b32(dst + 4, &bits[4]);
            if (ch == 0) prm.lse_partial[part_row] = lse_val;
        }
    }
}

/* ---- 5. append ---------------------------------------------------------------------------------- */

/* Step 5: the appended tokens into the cache (k_new rotated, v_new bit-exact), by one block per
 * (b, kv head); nothing in this launch reads these slots from the cache. `ld`: the kernel's tile
 * loader's cache view (d_chunks, dv_chunks, page_size, and k_new / v_new at sequence b, head hk). V_IN_K: a
 * latent cache, v the first dv columns of k and v_new those of k_new, so writing k_new writes
 * v_new too and the values are not written again. */
template <class Cfg, class Cvt, bool V_IN_K = false>
__device__ __forceinline__ void fa_kv_append(const fa_kv_params &prm, const fa_kv_block &blk,
                                             const fa_kv_cache_view &ld, int rot_half, int tid) {
    const bool rotary = prm.rotary_cos != nullptr;
    const int d_chunks = ld.d_chunks, dv_chunks = ld.dv_chunks, page_size = ld.page_size;
    const int per_row = d_chunks + (V_IN_K ? 0 : dv_chunks);
    for (int idx = tid; idx < blk.n_new * per_row; idx += Cfg::THREADS) {
        const int t = idx / per_row, ch = idx % per_row;
        const int c = blk.cache_len + t;
        if (c >= blk.capacity) continue;
        int64_t k_off, v_off;
        if (blk.paged) {
            const int pidx = min(c / page_size, blk.table_last);
            const int64_t id = min(max(blk.block_table_row[pidx], 0), prm.num_pages - 1);
            const int64_t in_page = min(c - pidx * page_size, page_size - 1);
            k_off = id * prm.k_batch_stride + in_page * prm.k_row_stride;
            v_off = id * prm.v_batch_stride + in_page * prm.v_row_stride;
        } else {
            k_off = (int64_t)blk.cache_row * prm.k_batch_stride + (int64_t)c * prm.k_row_stride;
            v_off = (int64_t)blk.cache_row * prm.v_batch_stride + (int64_t)c * prm.v_row_stride;
        }
        if (ch < d_chunks) {
            const uint16_t *src = ld.k_new + (int64_t)t * prm.knew_row_stride;
            uint4 raw = *(const uint4 *)(src + ch * 8);
            if (rotary && ch * 8 < prm.rotary_dim) {
                /* element i of the chunk is bits 16·(i % 2) of word i / 2; each rotated
                 * element is computed from its pair, read back from k_new */
                uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
                const int64_t pos = min(max(c, 0), prm.rotary_seqlen - 1); /* the slot, left padding included */
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int j = ch * 8 + i;
                    if (j < prm.rotary_dim) {
                        const int p = prm.rotary_interleaved ? j / 2 : (j < rot_half ? j : j - rot_half);
                        int da, db;
                        fa_kv_rotary_pair_dims(p, rot_half, prm.rotary_interleaved, &da, &db);
                        const float cs = Cvt::to_float(((const uint16_t *)prm.rotary_cos)[pos * rot_half + p]);
                        const float sn = Cvt::to_float(((const uint16_t *)prm.rotary_sin)[pos * rot_half + p]);
                        float ya, yb;
                        fa_kv_rotate(Cvt::to_float(src[da]), Cvt::to_float(src[db]), cs, sn, &ya, &yb);
                        const uint32_t bits = Cvt::from_float(j == da ? ya : yb);
                        const int shift = 16 * (i % 2);
                        words[i / 2] = (words[i / 2] & ~(0xffffu << shift)) | (bits << shift);
                    }
                }
                raw = make_uint4(words[0], words[1], words[2], words[3]);
            }
            *(uint4 *)((uint16_t *)prm.k + k_off + (int64_t)blk.hk * prm.k_head_stride + ch * 8) = raw;
        } else {
            const int cv = ch - d_chunks;
            const uint4 raw = *(const uint4 *)(ld.v_new + (int64_t)t * prm.vnew_row_stride + cv * 8);
            *(uint4 *)((uint16_t *)prm.v + v_off + (int64_t)blk.hk * prm.v_head_stride + cv * 8) = raw;
        }
    }
}

/* ---- 6. split merge ------------------------------------------------------------------------------ */

/* Step 6, split-KV merge, fused: a block that finds every split of its (b, kv head, row tile)
 * done merges their partial states. Done = the split's flag word in the workspace holds this
 * call's tag (a fresh 64-bit value per call, so the caller's workspace needs no zeroing and no
 * memset is launched). Each block stores its flag, then (SC fence) reads all flags: the block
 * whose fence comes last sees every flag, so at least one block merges; two blocks finishing
 * together may both merge, writing the same bits (the merge reads the splits in order 0, 1, ...
 * with a fixed reduction tree). The merging block clears the flags (graph replays reuse the tag).
 * No atomics: blocks never wait on each other. Returns whether this block merges. */
__device__ __forceinline__ bool fa_kv_claim_merge(const fa_kv_params &prm, const fa_kv_block &blk, int tid) {
    __shared__ int merge_here;
    const int warp = tid / 32, lane = tid % 32;
    __threadfence(); /* this thread's partial o / lse visible device-wide before the flag  */
    __syncthreads(); /* every thread's stores and fences done, and the red_* reads finished,
                        so the stage area can be reused after this                         */
    if (warp == 0) {
        unsigned long long *flags =
            prm.split_flags + (((int64_t)blk.b * prm.heads_kv + blk.hk) * prm.row_tiles + blk.row_tile) * prm.num_splits;
        const unsigned long long tag = prm.split_tag;
        if (lane == 0) __stcg(flags + blk.split, tag);
        /* Sequentially consistent fences around the warp barrier: lane 0's flag store comes
         * before every lane's flag reads, in the order all blocks' fences agree on. */
        __threadfence();
        __syncwarp();
        __threadfence();
        unsigned long long seen[FA_KV_MAX_SPLITS / 32]; /* lane l: flags l, l + 32, ... */
#pragma unroll
        for (int i = 0; i < FA_KV_MAX_SPLITS / 32; ++i)
            seen[i] = lane + 32 * i < prm.num_splits ? __ldcg(flags + lane + 32 * i) : tag;
        bool mine = true;
#pragma unroll
        for (int i = 0; i < FA_KV_MAX_SPLITS / 32; ++i) mine = mine && seen[i] == tag;
        const bool all = __all_sync(0xffffffffu, mine);
        if (all) {
            for (int sp = lane; sp < prm.num_splits; sp += 32) __stcg(flags + sp, 0ull);
            __threadfence(); /* the partials behind the flags seen are read after this */
        }
        if (lane == 0) merge_here = all;
    }
    __syncthreads(); /* merge_here visible */
    return merge_here;
}

/* The merge itself. Shared memory (stage area): weight_smem [BLOCK_M][splits] (first the partial
 * lse, then e^{lse_s - M}), row_inv_smem [BLOCK_M] (1 / Σ_s weight, 0 for an empty row), then
 * o_smem [batch][rows_here][dv] fp32: the partial o of `batch` splits (all of them unless the
 * stage area is too small), copied by cp.async so that every copy is in flight at once, issued
 * before the lse reads so both take one round trip together. */
template <class Elem, class Cfg, bool BY_ROWS = false>
__device__ __forceinline__ void fa_kv_merge_splits(const fa_kv_params &prm, const fa_kv_block &blk, uint32_t stage_smem,
                                                   int tid) {
    constexpr int BLOCK_M = Cfg::BLOCK_M, WARPS = Cfg::WARPS, THREADS = Cfg::THREADS;
    const int warp = tid / 32, lane = tid % 32;
    const int g = blk.g, sq = blk.sq, b = blk.b, hk = blk.hk, r0 = blk.r0;
    const int splits = prm.num_splits;
    const int rows_here = blk.r_last - r0 + 1;
    const int dv = prm.head_dim_v, quads = dv / 4;
    const int64_t split_stride = (int64_t)prm.batch * prm.heads_q * sq; /* partial rows per split */
    const uint32_t weight_smem = stage_smem;
    const uint32_t row_inv_smem = weight_smem + 4 * BLOCK_M * splits;
    const uint32_t o_smem = (row_inv_smem + 4 * BLOCK_M + 15) & ~15u;
    const int o_split_bytes = 4 * rows_here * dv;
    const int batch =
        min(splits, max(1, (int)(stage_smem + Cfg::STAGES * Cfg::STAGE_BYTES - o_smem) / o_split_bytes));
    auto row_index = [&](int r) -> int64_t { /* lse_partial row of packed row r0 + r, split 0 */
        const int rr = r0 + r;
        return ((int64_t)b * prm.heads_q + hk * g + rr % g) * sq + rr / g;
    };
    /* copy 16 bytes i of splits [s_begin, s_begin + count): (split, row, 4 columns), columns fastest.
     * BY_ROWS: warp w takes the (split, row) pairs w, w + WARPS, ..., its lanes the row's quads, so
     * the index divisions are paid once per row, not per copy */
    auto stage_o = [&](int s_begin, int count) {
        if constexpr (BY_ROWS) {
            for (int rs = warp; rs < count * rows_here; rs += WARPS) {
                const int sl = rs / rows_here, r = rs - sl * rows_here;
                const float *src = prm.o_partial + ((s_begin + sl) * split_stride + row_index(r)) * dv;
                for (int q = lane; q < quads; q += 32) cp_async_cg_16(o_smem + 16 * (rs * quads + q), src + 4 * q, 16);
            }
        } else {
            for (int i = tid; i < count * rows_here * quads; i += THREADS) {
                const int q = i % quads, rs = i / quads, r = rs % rows_here, sl = rs / rows_here;
                cp_async_cg_16(o_smem + 16 * i,
                               prm.o_partial + ((s_begin + sl) * split_stride + row_index(r)) * dv + 4 * q, 16);
            }
        }
        cp_async_commit_group();
    };
    __threadfence(); /* this thread's reads of the partials come after the flags it was shown */
    stage_o(0, batch);
    for (int i = tid; i < rows_here * splits; i += THREADS) {
        const int r = i / splits, sp = i % splits;
        st_shared_f32(weight_smem + 4 * i, __ldcg(prm.lse_partial + sp * split_stride + row_index(r)));
    }
    __syncthreads(); /* partial lse of every (row, split) in weight_smem */

    /* Per row (warp w: rows w, w + 4, ...): M = max_s lse_s, weight_s = e^{lse_s - M} (0 for an
     * empty split), L = Σ weight_s by a fixed butterfly, lse = M + log L. */
    for (int r = warp; r < rows_here; r += WARPS) {
        float m = -CUDART_INF_F;
        for (int sp = lane; sp < splits; sp += 32) m = fmaxf(m, ld_shared_f32(weight_smem + 4 * (r * splits + sp)));
#pragma unroll
        for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        float z = 0.0f;
        for (int sp = lane; sp < splits; sp += 32) {
            const uint32_t addr = weight_smem + 4 * (r * splits + sp);
            const float v = ld_shared_f32(addr);
            /* m = -inf: every v is -inf or NaN. A NaN split (fmaxf skipped it in m) gives w = NaN,
             * so the row's z, o and lse are NaN */
            const float w = v == -CUDART_INF_F ? 0.0f : expf(v - m);
            st_shared_f32(addr, w);
            z += w;
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) z += __shfl_xor_sync(0xffffffffu, z, off);
        if (lane == 0) {
            st_shared_f32(row_inv_smem + 4 * r, fa_row_scale(1.0f, z));
            if (prm.lse != nullptr) prm.lse[row_index(r)] = z > 0.0f ? m + logf(z) : fa_row_lse_degenerate(z);
        }
    }

    /* o = Σ_s weight_s o_s / L: thread per (row, 4 columns) items tid, tid + 128, ... (at most
     * MERGE_ITEMS), accumulated over the batches in split order. An empty split's o is 0. */
    constexpr int MERGE_ITEMS = BLOCK_M * (Cfg::D / 4) / THREADS;
    float acc[MERGE_ITEMS][4];
#pragma unroll
    for (int i = 0; i < MERGE_ITEMS; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    /* BY_ROWS: item tid + i·THREADS is (row, quad) = (r0_item + i·step_r, q0_item + i·step_q) with
     * the quad's carry into the row, no division per item */
    const int r0_item = tid / quads, q0_item = tid - r0_item * quads;
    const int step_r = THREADS / quads, step_q = THREADS - step_r * quads;
    for (int s_begin = 0; s_begin < splits; s_begin += batch) {
        const int count = min(batch, splits - s_begin);
        cp_async_wait_all();
        __syncthreads(); /* the batch's partial o (and, the first time, the weights) visible */
        int r_step = r0_item, q_step = q0_item;
#pragma unroll
        for (int i = 0; i < MERGE_ITEMS; ++i, r_step += step_r, q_step += step_q) {
            int r, q;
            if constexpr (BY_ROWS) {
                if (q_step >= quads) {
                    q_step -= quads;
                    ++r_step;
                }
                if (r_step >= rows_here) continue;
                r = r_step;
                q = q_step;
            } else {
                const int item = tid + i * THREADS;
                if (item >= rows_here * quads) continue;
                r = item / quads;
                q = item % quads;
            }
            for (int sl = 0; sl < count; ++sl) {
                const float w = ld_shared_f32(weight_smem + 4 * (r * splits + s_begin + sl));
                float x[4];
                ld_shared_v4_f32(x, o_smem + 16 * ((sl * rows_here + r) * quads + q));
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][e] = fmaf(w, x[e], acc[i][e]);
            }
        }
        if (s_begin + batch < splits) {
            __syncthreads(); /* every read of o_smem done before the next batch overwrites it */
            stage_o(s_begin + batch, min(batch, splits - s_begin - batch));
        }
    }
    if constexpr (BY_ROWS) {
        /* packed row r0 + r is (query token, head of the group) = (tok, hh): stepped with the items */
        int r = r0_item, q = q0_item, tok = (r0 + r) / g, hh = (r0 + r) - tok * g;
        const int step_tok = step_r / g, step_hh = step_r - step_tok * g;
#pragma unroll
        for (int i = 0; i < MERGE_ITEMS; ++i, r += step_r, q += step_q, tok += step_tok, hh += step_hh) {
            if (q >= quads) {
                q -= quads;
                ++r;
                ++hh;
            }
            if (hh >= g) { /* hh < 2g here: at most one carry */
                hh -= g;
                ++tok;
            }
            if (r >= rows_here) continue;
            const float inv = ld_shared_f32(row_inv_smem + 4 * r);
            uint16_t *dst = (uint16_t *)prm.o + (int64_t)b * prm.o_batch_stride + (int64_t)tok * prm.o_row_stride +
                            (int64_t)(hk * g + hh) * prm.o_head_stride + 4 * q;
            *(uint2 *)dst = make_uint2(Elem::pack2(acc[i][0] * inv, acc[i][1] * inv),
                                       Elem::pack2(acc[i][2] * inv, acc[i][3] * inv));
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < MERGE_ITEMS; ++i) {
        const int item = tid + i * THREADS;
        if (item >= rows_here * quads) continue;
        const int r = item / quads, col = 4 * (item % quads);
        const float inv = ld_shared_f32(row_inv_smem + 4 * r);
        const int rr = r0 + r;
        uint16_t *dst = (uint16_t *)prm.o + (int64_t)b * prm.o_batch_stride + (int64_t)(rr / g) * prm.o_row_stride +
                        (int64_t)(hk * g + rr % g) * prm.o_head_stride + col;
        *(uint2 *)dst = make_uint2(Elem::pack2(acc[i][0] * inv, acc[i][1] * inv),
                                   Elem::pack2(acc[i][2] * inv, acc[i][3] * inv));
    }
}

/* ---- the kernel ------------------------------------------------------------------------------------ */

template <class Elem, int HEAD_DIM, bool MODS>
__global__ void __launch_bounds__(fa_kv_config<HEAD_DIM>::THREADS, fa_kv_min_blocks(HEAD_DIM))
    fa_kv_kernel(const fa_kv_params prm, const fa_mods_arg<MODS> mods /* read iff MODS */) {
    using Cfg = fa_kv_config<HEAD_DIM>;
    using Cvt = fa_kv_convert<Elem>;
    constexpr int STAGES = Cfg::STAGES, BLOCK_N = Cfg::BLOCK_N;

    /* Shared memory: q_smem [BLOCK_M, D] | stage s: K [BLOCK_N, D], V [BLOCK_N, D], s < STAGES;
     * every tile swizzled (fa_swizzled_chunk). */
    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t q_smem = smem_u32addr(smem_raw);
    const uint32_t stage_smem = q_smem + Cfg::Q_BYTES;

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int quad_row = lane / 4; /* g: rows g and g + 8 of the mma fragments */
    const int quad_col = lane % 4; /* t: column pair 2t, 2t + 1                */

    const fa_kv_block blk = fa_kv_block_geometry<Cfg>(prm, quad_row); /* 1. */

    const int chunk = tid % Cfg::CHUNKS; /* the 16-byte column every load of this thread uses */
    const int row0 = tid / Cfg::CHUNKS;  /* Q loads: its first row, then every RPP rows        */
    const fa_kv_tile_loader<Cfg> ld(prm, blk, stage_smem, chunk, row0);
    fa_kv_issue_q<Cfg>(prm, blk, q_smem, row0, chunk, ld.d_chunks); /* 2. */
    int page_ids[Cfg::LOAD_PASSES];
    int page_first = 0;
    ld.prologue(page_ids, page_first); /* 3. */

    const int rot_half = prm.rotary_dim / 2;
    fa_kv_land_q<Cfg, Cvt>(prm, blk, q_smem, rot_half, tid);
    fa_kv_fragments<Cfg> frag;
    fa_kv_load_fragments<Cfg>(frag, q_smem, lane);

    if (blk.append && blk.split == 0 && blk.row_tile == 0) fa_kv_append<Cfg, Cvt>(prm, blk, ld, rot_half, tid); /* 5. */

    /* ---- the key loop. Per warp: rows (g, g + 8) × its 16 slots of each tile. */
    float o_rmem[Cfg::O_TILES][4];
#pragma unroll
    for (int ot = 0; ot < Cfg::O_TILES; ++ot)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_rmem[ot][e] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f}; /* this lane's share; quad-summed in the epilogue */
    const float score_mul = prm.score_mul;

    for (int it = 0; it < blk.n_tiles; ++it) {
        cp_async_wait_group<STAGES - 2>(); /* tile it landed (this thread's copies)          */
        __syncthreads();                   /* everyone's; and every warp finished tile it-1,
                                              so its stage can be refilled                   */
        const int next = it + STAGES - 1;
        if (next < blk.n_tiles) ld.issue(blk.tile_first + next, next % STAGES, page_ids, page_first);
        cp_async_commit_group();
        if (next + 1 < blk.n_tiles) ld.fetch_pages(blk.tile_first + next + 1, page_ids, page_first);

        const int stage = it % STAGES;
        const int c0 = (blk.tile_first + it) * BLOCK_N;
        const uint32_t k_tile = stage_smem + stage * Cfg::STAGE_BYTES;
        const uint32_t v_tile = k_tile + Cfg::TILE_BYTES;
        if (prm.rotary_cos != nullptr) fa_kv_rotate_appended<Cfg, Cvt>(prm, blk, rot_half, k_tile, c0, tid);

        float s_rmem[2][4];
        fa_kv_scores<Elem, Cfg, MODS>(prm, blk, frag, q_smem, k_tile, c0 + warp * Cfg::WARP_N, warp, quad_col, s_rmem,
                                      mods);
        fa_kv_softmax_pv<Elem, Cfg>(frag, v_tile, warp, score_mul, s_rmem, o_rmem, row_max, row_sum);
    }

    fa_kv_merge_warps<Elem, Cfg>(prm, blk, stage_smem, o_rmem, row_max, row_sum, tid, score_mul); /* 4. */
    if (prm.num_splits == 1) return;
    if (fa_kv_claim_merge(prm, blk, tid)) fa_kv_merge_splits<Elem, Cfg>(prm, blk, stage_smem, tid); /* 6. */
}

/* Launch one instantiation on `stream`. The > 48 KiB dynamic shared-memory opt-in is a per-device
 * function attribute: set once per device ordinal (a bit per ordinal < 64, set after success). */
template <class Elem, int HEAD_DIM, bool MODS = false>
static fa_status fa_kv_launch(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream, const char *name,
                              const fa_mods_params *mods = nullptr) {
    using Cfg = fa_kv_config<HEAD_DIM>;
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    const unsigned long long bit = device_ordinal >= 0 && device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (Cfg::SMEM_BYTES > 48 * 1024 && (bit == 0 || !(__atomic_load_n(&smem_configured, __ATOMIC_ACQUIRE) & bit))) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(fa_kv_kernel<Elem, HEAD_DIM, MODS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)Cfg::SMEM_BYTES),
                      name);
        __atomic_fetch_or(&smem_configured, bit, __ATOMIC_RELEASE);
    }
    const dim3 grid((unsigned)prm->row_tiles * (unsigned)prm->num_splits, (unsigned)prm->heads_kv,
                    (unsigned)prm->batch);
    fa_mods_arg<MODS> mods_arg{};
    if constexpr (MODS) static_cast<fa_mods_params &>(mods_arg) = *mods;
    fa_kv_kernel<Elem, HEAD_DIM, MODS><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(*prm, mods_arg);
    FA_CUDA_CHECK_LAUNCH(name);
    return FA_OK;
}

#endif /* FA_KVCACHE_KERNEL_CUH */
