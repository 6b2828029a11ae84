/*
 * kvcache_large_sm80.cuh: the CUDA KV-cache decode kernel for large heads, 256 < max(d, dv),
 * d <= 576, dv <= 512 (DeepSeek-style MLA: a latent cache of 576-dim rows whose first 512 columns
 * are the values), mma.sync tensor cores (sm_80+), templated on the element type and on whether V
 * is the first dv columns of K. Included by instances/kvcache_large_sm80_{latent,separate}.cu.
 * A sibling of fa_kv_kernel (kvcache_sm80.cuh) that reuses its geometry (1), rotary of Q and of
 * the appended keys, score transform and mask, append (5), and fused split merge (6); the tile
 * loads, the key loop and the output are its own.
 *
 * Why another kernel: MLA decodes up to 128 query heads on one kv head with 1-4 query tokens.
 * fa_kv_kernel's 16-row block would read each cache byte 8 times for 128 heads, and its warps
 * each hold an fp32 O accumulator of all dv columns (512 columns: 256 registers per thread).
 * Here a block packs 64 rows (query heads of one kv head × new tokens, row r = token r / group,
 * head hk·group + r % group, as fa_kv_kernel) and 8 warps = 4 row groups of 16 rows × 2 halves:
 *   S = Q Kᵀ of a 32-slot key tile: the two warps of a row group take alternate pairs of k16
 *     steps of d (warp half h: steps 4j + 2h, 4j + 2h + 1), each computing its 16 rows × all 32
 *     slots; they swap these partial scores through shared memory (one named barrier per row
 *     group) and each adds the other's to its own: a + b = b + a exactly, so both hold the same
 *     scores and run the same mask, online softmax and probabilities, with no second exchange;
 *   O += P V: each warp for its half of dv's columns (fa_kvl_dv_split: at most 256 columns, 128
 *     fp32 registers), over all 32 slots of the tile;
 *   the end: each warp normalises and writes its own columns (its softmax state is the row
 *     group's), the first warp of the pair the LSE.
 * Splitting d between the pair (instead of the slots) loads each Q fragment for four mma
 * instead of two and needs one exchange per tile instead of two (scores, then probabilities).
 * The kernel is bound by shared-memory reads (ldmatrix of Q and K for the scores, V for P·V;
 * about 380 KB per block and tile against 36 KB of cache bytes) more than by the tensor cores.
 *
 * A latent cache (V_IN_K; prm.v_in_k): a tile holds K only, each cache row is read once, and P·V
 * reads the first dv columns of the K tile. Separate caches: a V tile follows the K tile.
 *
 * WGMMA (sm_90a, dv = 512, separate K and V caches; kernels/kvcache_large_sm90.cu, kvcache_tiles.h's
 * fa_kvl_wgmma_ok; a latent cache runs that file's own kernel, which borrows these functions): the
 * same blocks with the two GEMMs on Hopper's warpgroup MMA. The pair of a row group is warps w and
 * w + 4, i.e. warpgroups 0 and 1, each holding all 64 rows (warp w of a warpgroup: rows 16w ..):
 *   S: warpgroup h runs m64n32k16 over k16 steps 2j + h of the padded d (fa_kvl_scores_wgmma, Q
 *     and K straight from shared memory), whose accumulator is, warp by warp, the mma.sync
 *     fragments above, so the exchange, mask and softmax are the same code;
 *   P·V: warpgroup h runs m64n256k16 over its 256 columns of dv with P from registers (the A
 *     fragments the softmax packs) and the V tile read MN-major: the warpgroup's whole O in one
 *     accumulator of 128 registers per thread (fa_kvl_pv_wgmma).
 * Its tiles are slabs of 64 columns in wgmma's 128-byte swizzle (fa_kvl_slab_offset),
 * written by the same cp.async copies and handed to wgmma's async proxy by fence.proxy.async
 * before each tile's __syncthreads.
 *
 * Grid: x = split × row_tiles + row tile, y = kv head, z = batch. One block:
 *   1. geometry of sequence b (fa_kv_block_geometry, clamped device arrays), the lane's rows
 *      16·(row group) + lane / 4 (+ 8);
 *   2. Q: the 64 rows by cp.async into shared memory (rotary applied in place);
 *   3. the split's key tiles (BLOCK_N = 32 slots, aligned to multiples of 32) through a 2-stage
 *      cp.async pipeline: thread t copies tile row t / 8 (one slot: one block-table entry, read
 *      one tile ahead), chunks t % 8 + 8i; slots >= L0 come from k_new / v_new (appended keys
 *      rotated in shared memory); outside the block's slots and past d / dv: zero-filled;
 *   4. per tile: the scores, exchange, mask, softmax and P·V above;
 *   5. block (split 0, row tile 0) of each (b, kv head) writes the appended rows into the cache;
 *   6. with splits, the normalised partial o (fp32) and lse of each split, merged by the block
 *      that finds every split of its row tile done (fa_kv_claim_merge, fa_kv_merge_splits).
 *
 * Shared memory: q_smem [64][72 chunks] | stage s < 2: K [32][72 chunks] (V [32][64 chunks]) |
 * exchange [8 warps][4][32 lanes][4 fp32]; tiles swizzled by fa_swizzled_chunk (WGMMA: the same
 * bytes as slabs, from a 1024-byte aligned base). The fused merge reuses all of it.
 */
#ifndef FA_KVCACHE_LARGE_KERNEL_CUH
#define FA_KVCACHE_LARGE_KERNEL_CUH

#include "cuda/kernels/kvcache_sm80.cuh"

/* The WGMMA instantiations' code exists where ptx.cuh's Hopper wrappers do (the host pass and
 * sm_90a; kernels/kvcache_large_sm90.cu instantiates them); other device passes compile it out. */
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_KVL_HAVE_WGMMA 1
#else
#define FA_KVL_HAVE_WGMMA 0
#endif

/* Byte offset of 16-byte chunk ch of row `row` in a tile of ROWS rows stored for wgmma: slab ch / 8
 * holds columns 64·(ch / 8) .. of every row, 128 bytes per row, the chunk at (ch % 8) ^ (row % 8):
 * the 128-byte swizzle wgmma's descriptors (layout 1) and TMA's SWIZZLE_128B share; the tile starts
 * 1024-byte aligned. */
template <int ROWS>
__device__ __forceinline__ uint32_t fa_kvl_slab_offset(int row, int ch) {
    return (uint32_t)(ch >> 3) * (128u * ROWS) + (uint32_t)row * 128u + (uint32_t)(((ch & 7) ^ (row & 7)) << 4);
}

template <bool V_IN_K, bool WGMMA = false>
struct fa_kvl_config {
    static constexpr int WARPS = FA_KVL_WARPS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int BLOCK_M = FA_KVL_BLOCK_M;      /* packed query rows: 4 row groups of 16    */
    static constexpr int BLOCK_N = FA_KVL_BLOCK_N;      /* cache slots per tile                     */
    static constexpr int WARP_N = 16;                   /* slots per fa_kv_score_transform call     */
    static constexpr int CHUNKS = FA_KVL_MAX_D / 8;     /* 16-byte chunks per Q / K row             */
    static constexpr int V_CHUNKS = V_IN_K ? CHUNKS : FA_KVL_MAX_DV / 8; /* per V row (latent: K's) */
    static constexpr int STEP_GROUPS = FA_KVL_MAX_D / 64; /* groups of 4 k16 steps of d            */
    static constexpr int O_TILES = 32;                  /* n8 tiles of a warp's half of dv          */
    static constexpr int STAGES = FA_KVL_STAGES;
    static constexpr int ROW_THREADS = 8;               /* threads copying one tile row             */
    static constexpr int ROWS_PER_PASS = THREADS / ROW_THREADS;
    static constexpr int Q_BYTES = 2 * BLOCK_M * FA_KVL_MAX_D;
    static constexpr int K_TILE_BYTES = 16 * BLOCK_N * CHUNKS;
    static constexpr int STAGE_BYTES = (int)fa_kvl_stage_bytes(V_IN_K);
    static constexpr int EXCHANGE_BYTES = (int)fa_kvl_exchange_bytes();
    static constexpr size_t SMEM_BYTES = (size_t)Q_BYTES + (size_t)STAGES * STAGE_BYTES + (size_t)EXCHANGE_BYTES;
    static constexpr int ALIGN_PAD = WGMMA ? 1024 : 0; /* WGMMA: the slabs' 1024-byte alignment */
    static_assert(SMEM_BYTES + ALIGN_PAD == (WGMMA ? fa_kvl_wgmma_smem_bytes(V_IN_K) : fa_kvl_smem_bytes(V_IN_K)),
                  "smem layout");
    static_assert(STAGE_BYTES == K_TILE_BYTES + (V_IN_K ? 0 : 16 * BLOCK_N * V_CHUNKS), "stage layout");
    static_assert(EXCHANGE_BYTES == WARPS * 4 * 32 * 16, "one v4 of scores per lane and (k16 step, n8 pair)");
    static_assert(BLOCK_M == 16 * (WARPS / 2) && BLOCK_N == 2 * WARP_N, "row groups of 16; two score halves");
    static_assert(ROWS_PER_PASS == BLOCK_N && BLOCK_M % ROWS_PER_PASS == 0, "one tile row per thread octet");
    static_assert(CHUNKS % ROW_THREADS == 0 && V_CHUNKS % ROW_THREADS == 0 && CHUNKS % 8 == 0 &&
                      V_CHUNKS % 8 == 0,
                  "whole swizzle groups per row, split evenly over a row's threads");
    static_assert(STEP_GROUPS * 64 == FA_KVL_MAX_D && 8 * O_TILES * 2 >= FA_KVL_MAX_DV, "steps and columns");
    static_assert(STAGES == 2, "the loader keeps one tile's page ahead; the loop refills the stage computed last");
    /* WGMMA: tiles as slabs of 64 columns (128-byte rows, 1024-byte swizzle atoms) */
    static constexpr int Q_SLAB_BYTES = 128 * BLOCK_M, KV_SLAB_BYTES = 128 * BLOCK_N;
    static_assert(!WGMMA || (FA_KVL_MAX_DV == 512 && FA_KVL_MAX_D % 32 == 0 && Q_BYTES % 1024 == 0 &&
                             K_TILE_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0),
                  "wgmma: two m64n256 halves of dv; whole swizzle atoms");

    /* Byte offset of 16-byte chunk ch of row `row` in a tile of ROWS rows of ROW_CHUNKS chunks:
     * mma.sync, rows one after another (fa_swizzled_chunk); WGMMA, slabs (fa_kvl_slab_offset). */
    template <int ROWS, int ROW_CHUNKS>
    static __device__ __forceinline__ uint32_t chunk_offset(int row, int ch) {
        if constexpr (WGMMA)
            return fa_kvl_slab_offset<ROWS>(row, ch);
        else
            return 16u * fa_swizzled_chunk<ROW_CHUNKS>(row, ch);
    }
};

/* fa_kv_merge_splits's view of the block's shared memory: everything, as one stage (its weights
 * and one split's partial o of 64 rows × 512 columns). */
template <bool V_IN_K>
struct fa_kvl_merge_area {
    static constexpr int BLOCK_M = FA_KVL_BLOCK_M, WARPS = FA_KVL_WARPS, THREADS = 32 * FA_KVL_WARPS;
    static constexpr int D = FA_KVL_MAX_DV;
    static constexpr int STAGES = 1;
    static constexpr int STAGE_BYTES = (int)fa_kvl_smem_bytes(V_IN_K);
    static_assert(4 * BLOCK_M * (FA_KVL_MAX_SPLITS + 1) + 16 + 4 * BLOCK_M * D <= STAGE_BYTES &&
                      FA_KVL_MAX_SPLITS <= FA_KV_MAX_SPLITS && (BLOCK_M * (D / 4)) % THREADS == 0,
                  "the fused merge's weights and one split's partial o fit the block's shared memory");
};

/* ---- 2. Q ------------------------------------------------------------------------------------ */

/* cp.async of the block's 64 Q rows (one commit group): thread octet row `row` copies rows row and
 * row + 32, chunks chunk0 + 8i; rows beyond rows_packed and chunks past d are zero-filled. */
template <class Cfg>
__device__ __forceinline__ void fa_kvl_issue_q(const fa_kv_params &prm, const fa_kv_block &blk, uint32_t q_smem,
                                               int row, int chunk0, int d_chunks) {
    const uint16_t *q_seq = (const uint16_t *)prm.q + (int64_t)blk.b * prm.q_batch_stride;
#pragma unroll
    for (int pass = 0; pass < Cfg::BLOCK_M / Cfg::ROWS_PER_PASS; ++pass) {
        const int r = row + pass * Cfg::ROWS_PER_PASS;
        const int rr = blk.r0 + r;
        const bool row_ok = rr < blk.rows_packed;
        const uint16_t *src = q_seq + (int64_t)(rr / blk.g) * prm.q_row_stride +
                              (int64_t)(blk.hk * blk.g + rr % blk.g) * prm.q_head_stride;
#pragma unroll
        for (int i = 0; i < Cfg::CHUNKS / Cfg::ROW_THREADS; ++i) {
            const int ch = chunk0 + Cfg::ROW_THREADS * i;
            const bool ok = row_ok && ch < d_chunks;
            cp_async_cg_16(q_smem + Cfg::template chunk_offset<Cfg::BLOCK_M, Cfg::CHUNKS>(r, ch),
                           ok ? (const void *)(src + ch * 8) : prm.q, ok ? 16 : 0);
        }
    }
    cp_async_commit_group();
}

/* ---- 3. key tiles: loads ---------------------------------------------------------------------- */

/* K/V tile loads: thread t copies row t / 8 of every tile (one cache slot), chunks t % 8 + 8i of
 * K (and of V), so a paged cache costs one block-table entry per thread and tile, read one tile
 * ahead of the copies that use it. The cache view (fa_kv_cache_view) is the one fa_kv_tile_loader
 * has, which fa_kv_append reads. */
template <class Cfg, bool V_IN_K>
struct fa_kvl_tile_loader : fa_kv_cache_view {
    static constexpr int PASSES = Cfg::BLOCK_N / Cfg::ROWS_PER_PASS; /* tile rows per thread */
    struct pages {
        int id[PASSES];      /* the block-table entries of the thread's rows of a tile */
        int in_page[PASSES]; /* and the rows' slots in their pages (one division for both) */
    };
    const fa_kv_params &prm;
    const fa_kv_block &blk;
    uint32_t stage_smem;
    int row, chunk0;                   /* first tile row (tid / 8; then + ROWS_PER_PASS) and first
                                          chunk (tid % 8)                                      */

    __device__ __forceinline__ fa_kvl_tile_loader(const fa_kv_params &prm_, const fa_kv_block &blk_, uint32_t stage,
                                                  int tid)
        : fa_kv_cache_view(prm_, blk_), prm(prm_), blk(blk_), stage_smem(stage), row(tid / Cfg::ROW_THREADS),
          chunk0(tid % Cfg::ROW_THREADS) {}

    /* The block-table entries of this thread's slots of tile m and their slots in the pages
     * (paged, a cache slot the block reads; 0 otherwise, unused). Unclamped: issue clamps the
     * entries. */
    __device__ __forceinline__ pages fetch_pages(int m) const {
        pages p;
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass) {
            const int c = m * Cfg::BLOCK_N + row + pass * Cfg::ROWS_PER_PASS;
            const bool read = blk.paged && c >= blk.slot_lo && c < min(blk.slot_hi, blk.cache_len);
            const int page = read ? c / page_size : 0;
            p.id[pass] = read ? blk.block_table_row[min(page, blk.table_last)] : 0;
            p.in_page[pass] = read ? c - page * page_size : 0;
        }
        return p;
    }

    /* cp.async this thread's rows of tile m (slots BLOCK_N·m ..) into `stage`; pages from
     * fetch_pages(m). I0, I1: only the K copies i in [I0, I1), i.e. (the thread's chunk being
     * chunk0 + 8i) K's 64-column slabs I0 .. I1 - 1 (a latent cache's tile in parts). */
    template <int I0 = 0, int I1 = Cfg::CHUNKS / Cfg::ROW_THREADS>
    __device__ __forceinline__ void issue(int m, int stage, const pages &page) const {
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass)
            issue_row<I0, I1>(m, stage, row + pass * Cfg::ROWS_PER_PASS, page.id[pass], page.in_page[pass]);
    }

    template <int I0 = 0, int I1 = Cfg::CHUNKS / Cfg::ROW_THREADS>
    __device__ __forceinline__ void issue_row(int m, int stage, int r, int page_id, int in_page) const {
        const int c = m * Cfg::BLOCK_N + r;
        const bool valid = c >= blk.slot_lo && c < blk.slot_hi;
        const uint16_t *k_src = k_seq, *v_src = v_seq; /* never read unless valid */
        if (!valid) {
            /* zero-fill below */
        } else if (c >= blk.cache_len) { /* only with append: slot_hi <= cache_len otherwise */
            k_src = k_new + (int64_t)(c - blk.cache_len) * prm.knew_row_stride;
            v_src = v_new + (int64_t)(c - blk.cache_len) * prm.vnew_row_stride;
        } else if (blk.paged) {
            const int64_t id = min(max(page_id, 0), num_pages_last);
            k_src = k_cache + id * prm.k_batch_stride + (int64_t)in_page * prm.k_row_stride;
            v_src = v_cache + id * prm.v_batch_stride + (int64_t)in_page * prm.v_row_stride;
        } else {
            k_src = k_seq + (int64_t)c * prm.k_row_stride;
            v_src = v_seq + (int64_t)c * prm.v_row_stride;
        }
        const uint32_t k_dst = stage_smem + stage * Cfg::STAGE_BYTES;
#pragma unroll
        for (int i = I0; i < I1; ++i) {
            const int ch = chunk0 + Cfg::ROW_THREADS * i;
            const bool ok = valid && ch < d_chunks;
            cp_async_cg_16(k_dst + Cfg::template chunk_offset<Cfg::BLOCK_N, Cfg::CHUNKS>(r, ch),
                           ok ? (const void *)(k_src + ch * 8) : prm.k, ok ? 16 : 0);
        }
        if constexpr (!V_IN_K) {
            const uint32_t v_dst = k_dst + Cfg::K_TILE_BYTES;
#pragma unroll
            for (int i = 0; i < Cfg::V_CHUNKS / Cfg::ROW_THREADS; ++i) {
                const int ch = chunk0 + Cfg::ROW_THREADS * i;
                const bool ok = valid && ch < dv_chunks;
                cp_async_cg_16(v_dst + Cfg::template chunk_offset<Cfg::BLOCK_N, Cfg::V_CHUNKS>(r, ch),
                               ok ? (const void *)(v_src + ch * 8) : prm.v, ok ? 16 : 0);
            }
        }
    }

    /* Prologue: tile 0's copies (one commit group, empty without tiles); returns tile 1's pages.
     * Group order: Q, tile 0. */
    __device__ __forceinline__ pages prologue() const {
        const pages page0 = blk.n_tiles > 0 ? fetch_pages(blk.tile_first) : pages{};
        const pages page1 = blk.n_tiles > 1 ? fetch_pages(blk.tile_first + 1) : pages{};
        if (blk.n_tiles > 0) issue(blk.tile_first, 0, page0);
        cp_async_commit_group();
        return page1;
    }
};

/* ---- 4. key tiles: compute -------------------------------------------------------------------- */

/* The warp's share of S = Q Kᵀ for its 16 rows and the tile's 32 slots: k16 steps 4j + 2·half +
 * {0, 1} of d (steps past d skipped). s_rmem[g16][nt][e] = (row quad_row + 8·(e >> 1), slot
 * 16·g16 + 8·nt + 2·quad_col + (e & 1)). q_offs / k_offs: fa_kv_frag_offsets of the warp's Q rows
 * and of K, entries 2·half, 2·half + 1 moved to 0, 1 (the steps' positions in a swizzle group). */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvl_partial_scores(uint32_t q_smem, uint32_t k_tile, const uint32_t q_offs[4],
                                                      const uint32_t k_offs[4], int half, int k_steps,
                                                      float (&s_rmem)[2][2][4]) {
#pragma unroll
    for (int g16 = 0; g16 < 2; ++g16)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s_rmem[g16][nt][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < Cfg::STEP_GROUPS; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (4 * j + 2 * half + i >= k_steps) continue; /* warp-uniform */
            uint32_t a[4], b_lo[4], b_hi[4];
            ldmatrix_x4(a, fa_kv_frag_addr<Cfg::CHUNKS>(q_smem, q_offs, 4 * j + i, 0));
            ldmatrix_x4(b_lo, fa_kv_frag_addr<Cfg::CHUNKS>(k_tile, k_offs, 4 * j + i, 0));
            ldmatrix_x4(b_hi, fa_kv_frag_addr<Cfg::CHUNKS>(k_tile, k_offs, 4 * j + i, 16));
            Elem::mma(s_rmem[0][0], a, &b_lo[0]);
            Elem::mma(s_rmem[0][1], a, &b_lo[2]);
            Elem::mma(s_rmem[1][0], a, &b_hi[0]);
            Elem::mma(s_rmem[1][1], a, &b_hi[2]);
        }
}

/* Online softmax in base 2 over the tile's 16·G16 slots (fa_kv_softmax_pv's rule: p = 2^(s·mul -
 * max·mul), a row whose max is still -inf uses 0), P straight into the A fragments of the G16 k16
 * steps (p_frag[g16]: a[0] = (row, 2t..), a[1] = (row + 8, 2t..), a[2] = (row, 8 + 2t..), a[3] =
 * (row + 8, 8 + 2t..)); rescale[h]: the factor of row h's O (fa_kvl_rescale_o, before this tile's
 * P·V). */
template <class Elem, int G16>
__device__ __forceinline__ void fa_kvl_softmax(float score_mul, const float (&s_rmem)[G16][2][4], float (&rescale)[2],
                                               float (&row_max)[2], float (&row_sum)[2], uint32_t (&p_frag)[G16][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float tile_max = -CUDART_INF_F;
#pragma unroll
        for (int g16 = 0; g16 < G16; ++g16)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
                tile_max = fmaxf(tile_max, fmaxf(s_rmem[g16][nt][2 * h], s_rmem[g16][nt][2 * h + 1]));
        tile_max = fa_quad_max(tile_max);
        float max_scaled;
        rescale[h] = fa_online_max_step(row_max[h], tile_max, score_mul, max_scaled);
        float sum = 0.0f;
#pragma unroll
        for (int g16 = 0; g16 < G16; ++g16)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const float p0 = ex2_approx_ftz_f32(fmaf(s_rmem[g16][nt][2 * h], score_mul, -max_scaled));
                const float p1 = ex2_approx_ftz_f32(fmaf(s_rmem[g16][nt][2 * h + 1], score_mul, -max_scaled));
                p_frag[g16][2 * nt + h] = Elem::pack2(p0, p1);
                sum += p0 + p1;
            }
        row_sum[h] = fmaf(row_sum[h], rescale[h], sum);
    }
}

/* O *= the rows' factors from fa_kvl_softmax. */
template <class Cfg>
__device__ __forceinline__ void fa_kvl_rescale_o(float (&o_rmem)[4 * Cfg::O_TILES], const float (&rescale)[2]) {
    /* factors of exactly 1 (a row max unchanged: most tiles of a long cache) leave O as it is */
    if (!__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) return;
#pragma unroll
    for (int ot = 0; ot < Cfg::O_TILES; ++ot)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_rmem[4 * ot + e] *= rescale[e / 2];
}
/* O += P V for the warp's columns [col0, col0 + cols) (cols = its half of dv, col0 a multiple of
 * 16), pairs of n8 tiles by ldmatrix.x4.trans of 16 slots × 16 columns (fa_kv_load_fragments'
 * lane layout: rows (lane & 7) + 8·((lane >> 3) & 1), chunk + (lane >> 4)). Pairs past dv are
 * skipped (warp-uniform); a pair that ends past dv computes columns nothing stores. */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvl_pv(uint32_t v_tile, int lane, int col0, int cols, int dv,
                                          const uint32_t (&p_frag)[2][4], float (&o_rmem)[4 * Cfg::O_TILES]) {
    constexpr int V_CHUNKS = Cfg::V_CHUNKS;
    const int key = (lane & 7) + (((lane >> 3) & 1) << 3);
    const uint32_t lane_row = v_tile + 16u * (uint32_t)(key * V_CHUNKS);
    const int chunk_lane = col0 / 8 + (lane >> 4);
#pragma unroll
    for (int op = 0; op < Cfg::O_TILES / 2; ++op) {
        if (16 * op >= cols || col0 + 16 * op >= dv) continue; /* warp-uniform */
        /* the swizzle of fa_swizzled_chunk: the row's low 3 bits are lane & 7 */
        const uint32_t addr = lane_row + 16u * (uint32_t)((chunk_lane + 2 * op) ^ (lane & 7));
#pragma unroll
        for (int g16 = 0; g16 < 2; ++g16) {
            uint32_t bv[4];
            ldmatrix_x4_trans(bv, addr + 16u * (uint32_t)(16 * g16 * V_CHUNKS));
            Elem::mma(&o_rmem[8 * op], p_frag[g16], &bv[0]);
            Elem::mma(&o_rmem[8 * op + 4], p_frag[g16], &bv[2]);
        }
    }
}

/* ---- 4. key tiles: compute with wgmma (WGMMA, sm_90a) -------------------------------------------- */
#if FA_KVL_HAVE_WGMMA

/* desc + step in the start-address field: a 32-bit add (shared-memory addresses / 16 stay below
 * 2^14, so nothing carries into the high word). */
__device__ __forceinline__ uint64_t fa_kvl_desc_plus(uint64_t desc, uint32_t step) {
    return (desc & 0xffffffff00000000ull) | (uint64_t)((uint32_t)desc + step);
}

/* m64nNk16 wgmma for k16 steps kk = STRIDE·j, J0 <= j < J1, of S = Q Kᵀ (the descriptors' bases may
 * add an offset), A = the Q tile and B = the K tile, both K-major in slabs of Q_SLAB / K_SLAB bytes
 * (step kk: slab kk / 4, +32·(kk % 4) bytes). Issued only: no fence, commit or wait. */
template <class Elem, int N, int STRIDE, int Q_SLAB, int K_SLAB, int J0, int J1>
__device__ __forceinline__ void fa_kvl_scores_steps(uint64_t q_desc, uint64_t k_desc, float (&acc)[N / 2]) {
#pragma unroll
    for (int j = J0; j < J1; ++j) {
        const int kk = STRIDE * j;
        const uint32_t q_step = (uint32_t)(((kk / 4) * Q_SLAB + (kk % 4) * 32) >> 4);
        const uint32_t k_step = (uint32_t)(((kk / 4) * K_SLAB + (kk % 4) * 32) >> 4);
        wgmma_ss_f32<N, fa_kv_convert<Elem>::BF16>(acc, fa_kvl_desc_plus(q_desc, q_step),
                                                      fa_kvl_desc_plus(k_desc, k_step), 1);
    }
}

/* One warpgroup's S = Q Kᵀ for the 64 rows and the tile's N slots: m64nNk16 wgmma over k16 steps
 * first + STRIDE·j of the padded d (FA_KVL_MAX_D / 16 / STRIDE steps; columns past d are zeros in
 * both tiles; first < STRIDE <= 2), fa_kvl_scores_steps' operands. Warp w's accumulator is the
 * m16n8 C fragments of rows 16w.., n8 tile i in acc[4i .. 4i + 3] = s_rmem[i / 2][i % 2], the
 * layout fa_kvl_partial_scores produces. The k-split warpgroups: N = 32, STRIDE = 2, first = half. */
template <class Elem, int N, int STRIDE, int Q_SLAB, int K_SLAB>
__device__ __forceinline__ void fa_kvl_scores_wgmma(uint32_t q_smem, uint32_t k_tile, int first,
                                                    float (&s_rmem)[N / 16][2][4]) {
    static_assert(STRIDE == 1 || STRIDE == 2, "steps first + STRIDE·j stay in their 128-byte row");
    const uint64_t q_desc = wgmma_desc_sw128(q_smem + 32u * (uint32_t)first, 16, 1024);
    const uint64_t k_desc = wgmma_desc_sw128(k_tile + 32u * (uint32_t)first, 16, 1024);
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        acc[i] = 0.0f;
        wgmma_fence_operand(acc[i]);
    }
    wgmma_fence();
    fa_kvl_scores_steps<Elem, N, STRIDE, Q_SLAB, K_SLAB, 0, FA_KVL_MAX_D / 16 / STRIDE>(q_desc, k_desc, acc);
    wgmma_commit_group();
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        wgmma_fence_operand(acc[i]);
        s_rmem[i / 8][(i / 4) % 2][i % 4] = acc[i];
    }
}

/* O += P V for warpgroup `half`'s 256 columns of dv = 512: BLOCK_N / 16 m64n256k16, A = P from
 * registers (p_frag[g16], the A fragment of slots 16·g16 ..), B = slabs 4·half .. 4·half + 3 of the
 * V tile read MN-major (LBO = the slab stride, SBO = 1024 bytes = 8 slots, k16 step = 16 slots =
 * 2048 bytes). o_rmem is the m64n256 accumulator: n8 tile i in o_rmem[4i .. 4i + 3], the layout
 * fa_kvl_pv's mma.sync tiles have. Waits for the GEMM: the stage is refilled next. */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvl_pv_wgmma(uint32_t v_tile, int half, uint32_t (&p_frag)[Cfg::BLOCK_N / 16][4],
                                                float (&o_rmem)[4 * Cfg::O_TILES]) {
    constexpr int G16 = Cfg::BLOCK_N / 16;
    static_assert(4 * Cfg::O_TILES == 128, "one m64n256 accumulator");
    const uint64_t v_desc =
        wgmma_desc_sw128(v_tile + (uint32_t)half * 4u * Cfg::KV_SLAB_BYTES, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma_fence_operand(o_rmem[i]);
#pragma unroll
    for (int g16 = 0; g16 < G16; ++g16)
#pragma unroll
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(p_frag[g16][x]);
    wgmma_fence();
#pragma unroll
    for (int g16 = 0; g16 < G16; ++g16)
        wgmma_rs_f32_transb<256, fa_kv_convert<Elem>::BF16>(
            o_rmem, p_frag[g16], fa_kvl_desc_plus(v_desc, (uint32_t)((g16 * 16 * 128) >> 4)), 1);
    wgmma_commit_group();
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma_fence_operand(o_rmem[i]);
}

#endif /* FA_KVL_HAVE_WGMMA */

/* ---- 4. output -------------------------------------------------------------------------------- */

/* The warp's columns of its 16 rows, normalised (fa_kv_merge_warps' rule with one state: M =
 * max(row max·mul, sink), L = 2^(m·mul - M)·l (+ the sink in split 0), o = 2^(m·mul - M)·O / L,
 * lse = (M + log2 L)·ln 2), as o and lse (one split) or this split's fp32 partial o and lse. The
 * pair's first warp writes the LSE. */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvl_store(const fa_kv_params &prm, const fa_kv_block &blk, int row_base,
                                             int half, int quad_col, int col0, int cols,
                                             const float (&o_rmem)[4 * Cfg::O_TILES], const float (&row_max)[2],
                                             const float (&row_sum)[2], float score_mul) {
    constexpr float LOG2E = 1.4426950408889634f;
    const int g = blk.g, sq = blk.sq, b = blk.b, dv = prm.head_dim_v;
    const bool sink_here = prm.sink_logits != nullptr && blk.split == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float sum = fa_quad_sum(row_sum[h]); /* every lane: a shuffle */
        const int rr = row_base + 8 * h;
        if (rr >= blk.rows_packed) continue;
        const int t = rr / g, hq = blk.hk * g + rr % g;
        const float m = row_max[h];
        const float sink_log2 = sink_here ? prm.sink_logits[hq] * LOG2E : -CUDART_INF_F;
        float max_scaled = fmaxf(m == -CUDART_INF_F ? -CUDART_INF_F : m * score_mul, sink_log2);
        if (max_scaled == -CUDART_INF_F) max_scaled = 0.0f;
        const float f = ex2_approx_ftz_f32(m * score_mul - max_scaled); /* 0 without a visible key */
        float l_all = f * sum;
        if (sink_here) l_all += exp2f(sink_log2 - max_scaled);
        const float inv = fa_row_scale(1.0f, l_all); /* 0: no visible key; NaN: a NaN score */
        const float lse_val = fa_row_lse(max_scaled, l_all);
        const int64_t lse_index = ((int64_t)b * prm.heads_q + hq) * sq + t;
        const int64_t part_row = (int64_t)blk.split * prm.batch * prm.heads_q * sq + lse_index;
        uint16_t *o_row = (uint16_t *)prm.o + (int64_t)b * prm.o_batch_stride + (int64_t)t * prm.o_row_stride +
                          (int64_t)hq * prm.o_head_stride;
#pragma unroll
        for (int ot = 0; ot < Cfg::O_TILES; ++ot) {
            const int col = col0 + 8 * ot + 2 * quad_col;
            if (8 * ot >= cols || col0 + 8 * ot >= dv) continue; /* warp-uniform */
            const float x0 = f * o_rmem[4 * ot + 2 * h] * inv, x1 = f * o_rmem[4 * ot + 2 * h + 1] * inv;
            if (prm.num_splits == 1) {
                *(uint32_t *)(o_row + col) = Elem::pack2(x0, x1);
            } else {
                *(float2 *)(prm.o_partial + part_row * dv + col) = make_float2(x0, x1);
            }
        }
        if (half == 0 && quad_col == 0) {
            if (prm.num_splits > 1) prm.lse_partial[part_row] = lse_val;
            else if (prm.lse != nullptr) prm.lse[lse_index] = lse_val;
        }
    }
}

/* ---- the kernel ------------------------------------------------------------------------------- */

template <class Elem, bool V_IN_K, bool WGMMA>
__global__ void __launch_bounds__(fa_kvl_config<V_IN_K, WGMMA>::THREADS, 1) fa_kvl_kernel(const fa_kv_params prm) {
    using Cfg = fa_kvl_config<V_IN_K, WGMMA>;
    using Cvt = fa_kv_convert<Elem>;
    constexpr int STAGES = Cfg::STAGES, BLOCK_N = Cfg::BLOCK_N;

    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint32_t q_smem = smem_u32addr(smem_raw);
    if constexpr (WGMMA) q_smem = (q_smem + 1023u) & ~1023u; /* the slabs' swizzle atoms (ALIGN_PAD) */
    const uint32_t stage_smem = q_smem + Cfg::Q_BYTES;
    const uint32_t exchange_smem = stage_smem + STAGES * Cfg::STAGE_BYTES;

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;
    /* The pair of warps sharing 16 rows: (2·row_group, 2·row_group + 1); WGMMA: (row_group,
     * row_group + 4), warp row_group of each warpgroup (a warpgroup's m64 tiles give warp w rows
     * 16w ..). */
    const int row_group = WGMMA ? warp % 4 : warp / 2;
    /* WGMMA: from lane 0, which ptxas knows to be warp-uniform, so the descriptors built from it
     * stay in uniform registers */
    const int half = WGMMA ? __shfl_sync(0xffffffffu, warp / 4, 0) : warp % 2;
    const int partner = WGMMA ? warp ^ 4 : warp ^ 1;

    const fa_kv_block blk = fa_kv_block_geometry<Cfg>(prm, 16 * row_group + quad_row); /* 1. */

    const fa_kvl_tile_loader<Cfg, V_IN_K> ld(prm, blk, stage_smem, tid);
    fa_kvl_issue_q<Cfg>(prm, blk, q_smem, ld.row, ld.chunk0, ld.d_chunks); /* 2. */
    auto page_next = ld.prologue();                                        /* 3. */

    const int rot_half = prm.rotary_dim / 2;
    /* WGMMA: never rotated (fa_kvl_wgmma_ok); Q lands with tile 0, at the loop's first wait */
    if constexpr (!WGMMA) fa_kv_land_q<Cfg, Cvt>(prm, blk, q_smem, rot_half, tid);

    if (blk.append && blk.split == 0 && blk.row_tile == 0)
        fa_kv_append<Cfg, Cvt, V_IN_K>(prm, blk, ld, rot_half, tid); /* 5. */

    /* Fragment offsets (fa_kv_load_fragments' lane layout), the warp's two positions in a swizzle
     * group of 4 k16 steps moved to entries 0 and 1. */
    uint32_t q_all[4], k_all[4], q_offs[4], k_offs[4];
    fa_kv_frag_offsets<Cfg::CHUNKS>(16 * row_group + (lane & 15), lane >> 4, lane, q_all);
    fa_kv_frag_offsets<Cfg::CHUNKS>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, lane, k_all);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q_offs[i] = half ? q_all[2 + i % 2] : q_all[i % 2];
        k_offs[i] = half ? k_all[2 + i % 2] : k_all[i % 2];
    }
    const int k_steps = (prm.head_dim + 15) / 16;
    const int dv = prm.head_dim_v, dv_split = fa_kvl_dv_split(dv);
    const int col0 = half * dv_split, cols = half ? dv - dv_split : dv_split;

    float o_rmem[4 * Cfg::O_TILES];
#pragma unroll
    for (int i = 0; i < 4 * Cfg::O_TILES; ++i) o_rmem[i] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f}; /* this lane's share; quad-summed at the end */
    const float score_mul = prm.score_mul;
    const fa_mods_arg<false> no_mods{};

    int stage = 0; /* tile it's */
    for (int it = 0; it < blk.n_tiles; ++it) {
        cp_async_wait_group<STAGES - 2>(); /* tile it landed (this thread's copies; the first round:
                                              Q too)                                          */
#if FA_KVL_HAVE_WGMMA
        if constexpr (WGMMA) fence_proxy_async_shared_cta(); /* ... and visible to wgmma */
#endif
        __syncthreads(); /* everyone's; and every warp finished tile it - 1, so its stage can be
                            refilled                                                           */
        const int next = it + STAGES - 1, next_stage = stage + 1 == STAGES ? 0 : stage + 1;
        if (next < blk.n_tiles) ld.issue(blk.tile_first + next, next_stage, page_next);
        cp_async_commit_group();
        if (next + 1 < blk.n_tiles) page_next = ld.fetch_pages(blk.tile_first + next + 1);

        const int c0 = (blk.tile_first + it) * BLOCK_N;
        const uint32_t k_tile = stage_smem + (uint32_t)stage * Cfg::STAGE_BYTES;
        const uint32_t v_tile = V_IN_K ? k_tile : k_tile + Cfg::K_TILE_BYTES;
        stage = next_stage;
        if constexpr (!V_IN_K && !WGMMA) { /* a latent cache has no rotary (refused by validation) */
            if (prm.rotary_cos != nullptr) fa_kv_rotate_appended<Cfg, Cvt>(prm, blk, rot_half, k_tile, c0, tid);
        }

        float s_rmem[2][2][4];
        if constexpr (WGMMA) {
#if FA_KVL_HAVE_WGMMA
            fa_kvl_scores_wgmma<Elem, Cfg::BLOCK_N, 2, Cfg::Q_SLAB_BYTES, Cfg::KV_SLAB_BYTES>(q_smem, k_tile, half,
                                                                                         s_rmem);
#endif
        } else {
            fa_kvl_partial_scores<Elem, Cfg>(q_smem, k_tile, q_offs, k_offs, half, k_steps, s_rmem);
        }
        fa_pair_add_scores<4>(exchange_smem, warp, partner, 1 + row_group, lane, &s_rmem[0][0]);
        fa_kv_score_transform<Cfg, false>(prm, blk, c0, quad_col, s_rmem[0], no_mods);
        fa_kv_score_transform<Cfg, false>(prm, blk, c0 + Cfg::WARP_N, quad_col, s_rmem[1], no_mods);
        uint32_t p_frag[2][4];
        float rescale[2];
        fa_kvl_softmax<Elem, 2>(score_mul, s_rmem, rescale, row_max, row_sum, p_frag);
        fa_kvl_rescale_o<Cfg>(o_rmem, rescale);
        if constexpr (WGMMA) {
#if FA_KVL_HAVE_WGMMA
            fa_kvl_pv_wgmma<Elem, Cfg>(v_tile, half, p_frag, o_rmem);
#endif
        } else {
            fa_kvl_pv<Elem, Cfg>(v_tile, lane, col0, cols, dv, p_frag, o_rmem);
        }
    }
    cp_async_wait_all(); /* no copy in flight when the merge reuses shared memory */

    fa_kvl_store<Elem, Cfg>(prm, blk, blk.r0 + 16 * row_group + quad_row, half, quad_col, col0, cols, o_rmem, row_max,
                            row_sum, score_mul); /* 4. */
    if (prm.num_splits == 1) return;
    if (fa_kv_claim_merge(prm, blk, tid)) fa_kv_merge_splits<Elem, fa_kvl_merge_area<V_IN_K>, true>(prm, blk, q_smem, tid); /* 6. */
}

/* Launch `kernel` (a large-head decode kernel over fa_kv_params) on `stream`, grid x = split ×
 * row tile, y = kv head, z = batch; the > 48 KiB dynamic shared-memory opt-in is set once per
 * device ordinal (bit i of the kernel's own `smem_configured`, as fa_kv_launch). */
template <class Kernel, class... Extra>
static fa_status fa_kvl_launch_kernel(Kernel kernel, unsigned long long &smem_configured, int threads, size_t smem_bytes,
                                      const fa_kv_params *prm, int device_ordinal, cudaStream_t stream, const char *name,
                                      const Extra &...extra) {
    const unsigned long long bit = device_ordinal >= 0 && device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (bit == 0 || !(__atomic_load_n(&smem_configured, __ATOMIC_ACQUIRE) & bit)) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes), name);
        __atomic_fetch_or(&smem_configured, bit, __ATOMIC_RELEASE);
    }
    const dim3 grid((unsigned)prm->row_tiles * (unsigned)prm->num_splits, (unsigned)prm->heads_kv,
                    (unsigned)prm->batch);
    kernel<<<grid, threads, smem_bytes, stream>>>(*prm, extra...);
    FA_CUDA_CHECK_LAUNCH(name);
    return FA_OK;
}

template <class Elem, bool V_IN_K, bool WGMMA = false>
static fa_status fa_kvl_launch(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream, const char *name) {
    using Cfg = fa_kvl_config<V_IN_K, WGMMA>;
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    return fa_kvl_launch_kernel(fa_kvl_kernel<Elem, V_IN_K, WGMMA>, smem_configured, Cfg::THREADS,
                                Cfg::SMEM_BYTES + Cfg::ALIGN_PAD, prm, device_ordinal, stream, name);
}

#endif /* FA_KVCACHE_LARGE_KERNEL_CUH */
