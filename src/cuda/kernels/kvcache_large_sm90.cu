/*
 * kvcache_large_sm90.cu: the large-head KV-cache decode kernels on wgmma, for sm_90a (built by the
 * Makefile's *_sm90*.cu rule); kvcache.cu picks them on compute capability 9.0 when dv = 512 and
 * no rotary is asked (fa_kvl_wgmma_ok), the mma.sync instances otherwise or with
 * FA_CUDA_KVCACHE=portable.
 *
 * Separate K and V caches: kvcache_large_sm80.cuh's kernel, WGMMA instantiations (the pair of a row
 * group split d's k16 steps, swap partial scores, each runs P·V for half of dv).
 *
 * A latent cache (DeepSeek-style MLA, 576 / 512): fa_kvl_latent_kernel below, FlashMLA's division
 * of labour in our code. 64-slot key tiles; the block's two warpgroups take different jobs:
 *   warpgroup 0: S = Q Kᵀ of the tile for all 64 rows (m64n64k16 over the padded d, Q and K from
 *     shared memory: 64-slot tiles read 4 KB of shared memory per 64K MACs, the tensor cores'
 *     rate, where the 32-slot k-split reads 3 KB per 32K), the mask and online softmax (the
 *     mma.sync kernel's functions), then hands P and each row's rescale factor to warpgroup 1
 *     through shared memory and runs P·V for dv columns 0..255;
 *   warpgroup 1: waits for that hand-over (named barrier FA_KVL_BAR_P of both warpgroups),
 *     rescales its O and runs P·V for columns 256..511 with the same P.
 * P travels in fragment order: the thread (w, lane) of warpgroup 0 stores its A fragments, and
 * thread (w, lane) of warpgroup 1, which holds the same rows of the m64 tiles, loads them as its
 * own A fragments (16-byte stores and loads, one contiguous 512-byte run per warp and k16 step).
 * No score exchange; per tile one __syncthreads (stage reuse; also: warpgroup 1 has read P before
 * warpgroup 0 writes the next) and one named barrier. At the end warpgroup 0's row maxima and sums
 * go to warpgroup 1 the same way (through the stage area), each writes its columns (fa_kvl_store)
 * and the fused merge runs as in the other kernels.
 *
 * Shared memory (fa_kvl_latent_smem_bytes): the rows' rescale factors [64] fp32 just below the
 * 1024-byte aligned Q tile [64][576], two K stages [64][576], P [4 k16 steps][128 threads][4
 * words]; tiles in 64-column slabs, 128-byte swizzle (fa_kvl_slab_offset).
 */
#include "cuda/kernels/kvcache_large_sm80.cuh"

/* The latent-cache kernel's shape; the fields kvcache_large_sm80.cuh's functions read. */
struct fa_kvl_latent_config {
    static constexpr int WARPS = FA_KVL_WARPS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int BLOCK_M = FA_KVL_BLOCK_M;
    static constexpr int BLOCK_N = FA_KVL_LATENT_BLOCK_N;
    static constexpr int WARP_N = 16;
    static constexpr int CHUNKS = FA_KVL_MAX_D / 8;
    static constexpr int V_CHUNKS = CHUNKS;
    static constexpr int O_TILES = 32;
    static constexpr int STAGES = 2;
    static constexpr int ROW_THREADS = 8;
    static constexpr int ROWS_PER_PASS = THREADS / ROW_THREADS;
    static constexpr int Q_BYTES = 2 * BLOCK_M * FA_KVL_MAX_D;
    static constexpr int K_TILE_BYTES = 2 * BLOCK_N * FA_KVL_MAX_D;
    static constexpr int STAGE_BYTES = K_TILE_BYTES;
    static constexpr int Q_SLAB_BYTES = 128 * BLOCK_M, KV_SLAB_BYTES = 128 * BLOCK_N;
    static constexpr int G16 = BLOCK_N / 16;                 /* k16 steps of P·V               */
    static constexpr int P_BYTES = G16 * 128 * 16;           /* warpgroup 0's A fragments      */
    static constexpr int ROW_SCALE_BYTES = 4 * BLOCK_M;      /* the rows' rescale factors      */
    static constexpr size_t SMEM_BYTES = fa_kvl_latent_smem_bytes();
    static_assert(SMEM_BYTES == (size_t)ROW_SCALE_BYTES + 1024 + Q_BYTES + STAGES * STAGE_BYTES + P_BYTES,
                  "smem layout: factors, alignment, Q, stages, P");
    static_assert(BLOCK_N % ROWS_PER_PASS == 0 && CHUNKS % ROW_THREADS == 0, "whole rows per pass");
    static_assert(FA_KVL_MAX_DV == 512 && 8 * O_TILES == 256, "two warpgroups of 256 columns");
    static_assert(P_BYTES >= 16 * 128 && fa_kvl_smem_bytes(1) <= SMEM_BYTES, "end hand-over and merge fit");

    template <int ROWS, int ROW_CHUNKS>
    static __device__ __forceinline__ uint32_t chunk_offset(int row, int ch) {
        return fa_kvl_slab_offset<ROWS>(row, ch);
    }
};

enum { FA_KVL_BAR_P = 1 }; /* named barrier of both warpgroups: warpgroup 0's P and factors stored */

template <class Elem>
__global__ void __launch_bounds__(fa_kvl_latent_config::THREADS, 1) fa_kvl_latent_kernel(const fa_kv_params prm) {
    using Cfg = fa_kvl_latent_config;
    using Cvt = fa_kv_convert<Elem>;
    constexpr int STAGES = Cfg::STAGES, BLOCK_N = Cfg::BLOCK_N, G16 = Cfg::G16;

    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t q_smem = (smem_u32addr(smem_raw) + Cfg::ROW_SCALE_BYTES + 1023u) & ~1023u; /* slabs' atoms */
    const uint32_t row_scale_smem = q_smem - Cfg::ROW_SCALE_BYTES;
    const uint32_t stage_smem = q_smem + Cfg::Q_BYTES;
    const uint32_t p_smem = stage_smem + STAGES * Cfg::STAGE_BYTES;

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;
    const int row_group = warp % 4; /* rows 16·row_group .. of the m64 tiles, in either warpgroup */
    /* from lane 0, which ptxas knows to be warp-uniform (descriptors in uniform registers) */
    const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
    const uint32_t frag_smem = p_smem + 16u * (uint32_t)(tid % 128); /* this thread's A fragments */

    const fa_kv_block blk = fa_kv_block_geometry<Cfg>(prm, 16 * row_group + quad_row); /* 1. */

    const fa_kvl_tile_loader<Cfg, true> ld(prm, blk, stage_smem, tid);
    fa_kvl_issue_q<Cfg>(prm, blk, q_smem, ld.row, ld.chunk0, ld.d_chunks); /* 2. */
    auto page_next = ld.prologue();                                        /* 3. */
    if (blk.append && blk.split == 0 && blk.row_tile == 0) fa_kv_append<Cfg, Cvt, true>(prm, blk, ld, 0, tid); /* 5. */

    float o_rmem[4 * Cfg::O_TILES];
#pragma unroll
    for (int i = 0; i < 4 * Cfg::O_TILES; ++i) o_rmem[i] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f}; /* warpgroup 0: this lane's share; quad-summed at the end */
    const float score_mul = prm.score_mul;
    const fa_mods_arg<false> no_mods{};

    int stage = 0; /* tile it's */
    for (int it = 0; it < blk.n_tiles; ++it) {
        cp_async_wait_group<0>();       /* tile it landed (this thread's copies; round 0: Q too) */
        fence_proxy_async_shared_cta(); /* ... and visible to wgmma                               */
        __syncthreads();                /* everyone's; every warp finished tile it - 1 (its stage
                                           is refilled now) and warpgroup 1 has read its P        */
        const int next = it + 1;
        if (next < blk.n_tiles) ld.issue(blk.tile_first + next, stage ^ 1, page_next);
        cp_async_commit_group();
        if (next + 1 < blk.n_tiles) page_next = ld.fetch_pages(blk.tile_first + next + 1);
        const uint32_t k_tile = stage_smem + (uint32_t)stage * Cfg::STAGE_BYTES;
        stage ^= 1;

        uint32_t p_frag[G16][4];
        float rescale[2];
        if (wg == 0) {
            const int c0 = (blk.tile_first + it) * BLOCK_N;
            float s_rmem[G16][2][4];
            fa_kvl_scores_wgmma<Elem, BLOCK_N, 1, Cfg::Q_SLAB_BYTES, Cfg::KV_SLAB_BYTES>(q_smem, k_tile, 0, s_rmem);
#pragma unroll
            for (int g16 = 0; g16 < G16; ++g16)
                fa_kv_score_transform<Cfg, false>(prm, blk, c0 + 16 * g16, quad_col, s_rmem[g16], no_mods);
            fa_kvl_softmax<Elem, G16>(score_mul, s_rmem, rescale, row_max, row_sum, p_frag);
#pragma unroll
            for (int g16 = 0; g16 < G16; ++g16) st_shared_v4_b32(frag_smem + 2048u * (uint32_t)g16, p_frag[g16]);
            if (quad_col == 0) { /* one lane per row pair */
                st_shared_f32(row_scale_smem + 4u * (uint32_t)(16 * row_group + quad_row), rescale[0]);
                st_shared_f32(row_scale_smem + 4u * (uint32_t)(16 * row_group + quad_row + 8), rescale[1]);
            }
        }
        bar_sync(FA_KVL_BAR_P, Cfg::THREADS); /* warpgroup 0's P and factors of this tile stored
                                                 (warpgroup 1 waits here from the tile's start) */
        if (wg == 1) {
#pragma unroll
            for (int g16 = 0; g16 < G16; ++g16) ld_shared_v4_b32(p_frag[g16], frag_smem + 2048u * (uint32_t)g16);
            rescale[0] = ld_shared_f32(row_scale_smem + 4u * (uint32_t)(16 * row_group + quad_row));
            rescale[1] = ld_shared_f32(row_scale_smem + 4u * (uint32_t)(16 * row_group + quad_row + 8));
        }
        fa_kvl_rescale_o<Cfg>(o_rmem, rescale);
        fa_kvl_pv_wgmma<Elem, Cfg>(k_tile, wg, p_frag, o_rmem); /* V: the tile's first 512 columns */
    }
    cp_async_wait_all(); /* no copy in flight when the merge reuses shared memory */

    /* warpgroup 1's rows' softmax state: that of warpgroup 0's thread with the same (warp % 4,
     * lane), through the stages (free: no copy in flight, every tile read) */
    const uint32_t state_smem = stage_smem + 16u * (uint32_t)(tid % 128);
    __syncthreads();
    if (wg == 0) {
        const uint32_t state[4] = {__float_as_uint(row_max[0]), __float_as_uint(row_max[1]),
                                   __float_as_uint(row_sum[0]), __float_as_uint(row_sum[1])};
        st_shared_v4_b32(state_smem, state);
    }
    __syncthreads();
    if (wg == 1) {
        uint32_t state[4];
        ld_shared_v4_b32(state, state_smem);
        row_max[0] = __uint_as_float(state[0]);
        row_max[1] = __uint_as_float(state[1]);
        row_sum[0] = __uint_as_float(state[2]);
        row_sum[1] = __uint_as_float(state[3]);
    }
    fa_kvl_store<Elem, Cfg>(prm, blk, blk.r0 + 16 * row_group + quad_row, wg, quad_col, 256 * wg, 256, o_rmem, row_max,
                            row_sum, score_mul); /* 4. */
    if (prm.num_splits == 1) return;
    if (fa_kv_claim_merge(prm, blk, tid)) fa_kv_merge_splits<Elem, fa_kvl_merge_area<true>, true>(prm, blk, q_smem, tid); /* 6. */
}

template <class Elem>
static fa_status fa_kvl_latent_launch(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream,
                                      const char *name) {
    using Cfg = fa_kvl_latent_config;
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    return fa_kvl_launch_kernel(fa_kvl_latent_kernel<Elem>, smem_configured, Cfg::THREADS, Cfg::SMEM_BYTES, prm,
                                device_ordinal, stream, name);
}

extern "C" fa_status fa_kvl_launch_wgmma(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                                         cudaStream_t stream) {
    const bool bf16 = dtype == FA_DTYPE_BF16;
    if (prm->v_in_k)
        return bf16 ? fa_kvl_latent_launch<fa_bf16>(prm, device_ordinal, stream,
                                                    "KV-cache decode kernel, large heads, wgmma, latent cache (bf16)")
                    : fa_kvl_latent_launch<fa_f16>(prm, device_ordinal, stream,
                                                   "KV-cache decode kernel, large heads, wgmma, latent cache (f16)");
    return bf16 ? fa_kvl_launch<fa_bf16, false, true>(prm, device_ordinal, stream,
                                                      "KV-cache decode kernel, large heads, wgmma, separate K and V (bf16)")
                : fa_kvl_launch<fa_f16, false, true>(prm, device_ordinal, stream,
                                                     "KV-cache decode kernel, large heads, wgmma, separate K and V (f16)");
}
