/*
 * kvcache_large_sm90.cu: the large-head KV-cache decode kernels on wgmma, for sm_90a (built by the
 * Makefile's *_sm90*.cu rule); kvcache.cu picks them on compute capability 9.0 when dv = 512 and
 * no rotary is asked (fa_kvl_wgmma_ok), the mma.sync instances otherwise or with
 * FA_CUDA_KVCACHE=portable.
 *
 * Separate K and V caches: kvcache_large_sm80.cuh's kernel, WGMMA instantiations (the pair of a row
 * group split d's k16 steps, swap partial scores, each runs P·V for half of dv).
 *
 * A latent cache (DeepSeek-style MLA, 576 / 512): fa_kvl_latent_kernel below, FlashMLA's "seesaw"
 * schedule in our code. A block = 64 packed query rows of one (sequence, kv head, split) and three
 * warpgroups: consumers L (warpgroup 0, O columns 0..255) and R (warpgroup 1, 256..511), each with
 * a 64 × 256 fp32 accumulator (128 registers), and a producer (warpgroup 2) that issues every copy.
 * The 64-slot key tiles go in pairs, tile a = 2i in buffer 0 and c = 2i + 1 in buffer 1. L computes
 * S_a = Q K_aᵀ (m64n64k16 over the padded d, Q and K from shared memory: 4 KB of shared memory per
 * 64K MACs, the tensor cores' rate) and its softmax while R computes S_c; each then runs P·V for
 * its columns with both tiles' P, one running max m for both:
 *   L: m_a = max(m, rowmax S_a), scale_a = 2^(m - m_a), P_a; O_L = O_L·scale_a + P_a V_aL;
 *   R: O_R = O_R·scale_a + P_a V_aR; m_c = max(m_a, rowmax S_c), scale_c = 2^(m_a - m_c), P_c;
 *      O_R = O_R·scale_c + P_c V_cR;
 *   L: O_L = O_L·scale_c + P_c V_cL; m = m_c, l = (l·scale_a + Σ P_a)·scale_c + Σ P_c.
 * One warpgroup's softmax thus runs under the other's GEMMs (L's under S_c, R's under both P_a·V),
 * and buffer 0 is free once both P_a·V are done, a third of a pair before its next tile is needed.
 * An odd tile count ends with a phantom tile c (zero-filled, every score -inf: P_c = 0).
 *
 * Hand-overs through shared memory: P in fragment order (thread (w, lane) of one warpgroup holds
 * the rows of thread (w, lane) of the other: 16-byte stores and loads), in buffer 1's slab 8
 * (columns 512..575 of K_c, read only by S_c): L writes P_a there once S_c is done, R reads it and
 * writes P_c in its place, L reads P_c. L's {m_a, scale_a} per row and R's {m_c, scale_c, Σ P_c}
 * of each thread's two rows (for L's thread with the same rows) in the header. Named barriers of
 * both consumer warpgroups, synced on by each (an arrive on the side that hands over measured no
 * faster, and racecheck follows only syncs; barrier.sync without .aligned, as L and R reach them
 * from different instructions): SA (L issued S_a, so R's S_c queues behind it and S_a
 * finishes first), SC (S_c done: slab 8 of buffer 1 is free), PA (P_a and L's statistics stored),
 * PC (P_c and R's statistics stored); END after the loop.
 *
 * Copies: each tile in three parts with their own full / empty mbarriers: A = slabs 0..3 (columns
 * 0..255), B = slabs 4..7, C = slab 8; S runs over C, A, B, waiting for each as it lands. A tile
 * of cache rows the block reads, all 64 of them, comes by TMA (a map of the cache, one 64 × 64 box
 * per slab, evict-first in L2: every row is read by the one or two blocks of its sequence at
 * about the same time); any other tile (appended rows from k_new, the sequence's ends, the
 * phantom, or a cache TMA cannot map) by the tile loader's cp.async copies with their zero fill,
 * the producer's 128 threads each copying its rows. full: 128 arrivals (TMA: the first thread's
 * arrive.expect_tx and 127 plain ones; cp.async: cp.async.mbarrier.arrive.noinc, once the thread's
 * copies landed, or with FA_CUDA_KVL_WAIT_COPIES=1 a wait for them and a plain arrival, the form
 * racecheck follows, 25 % slower on a cache that goes all by cp.async); empty: 128 arrivals, every thread of the part's last user (A and C by L, B by
 * R, in both buffers; the other warpgroup's use of the part ends before, by the named barriers;
 * each thread for its own accesses, which racecheck credits where one lane's arrival for its warp
 * it does not: docs/hopper.md), after its wgmma.wait_group, and for buffer 1's C after a proxy
 * fence (P was written and read there through the generic proxy; TMA writes through the async
 * one). Use u of a buffer is phase u. Throughput: docs/tuning-log.md ("MLA decode: the seesaw kernel").
 *
 * Shared memory (fa_kvl_latent_smem_bytes): the header (mbarriers, statistics) just below the
 * 1024-byte aligned Q tile [64][576], then the two tiles [64][576]; tiles in 64-column slabs,
 * 128-byte swizzle (fa_kvl_slab_offset, TMA's SWIZZLE_128B). At the end L's row sums go to R through
 * buffer 0, each writes its columns (fa_kvl_store), and the fused merge runs as in the other
 * kernels (the producer has exited; __syncthreads waits for the threads that have not).
 */
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels/kvcache_large_sm80.cuh"
#include "cuda/common/tma.h"

/* The latent-cache kernel's shape as seen by the consumers (256 threads: the geometry, append,
 * store and merge) and, below, by the producer (128 threads: the tile loader); the fields
 * kvcache_large_sm80.cuh's functions read. */
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
    static constexpr int HEADER_BYTES = (int)fa_kvl_latent_header_bytes();
    static constexpr int STAT_A = FA_KVL_LATENT_BARRIER_BYTES;  /* [64] {m_a, scale_a}            */
    static constexpr int STAT_C = STAT_A + 8 * BLOCK_M; /* [128 threads] {m_c, scale_c, Σ P_c} × 2 rows */
    static constexpr size_t SMEM_BYTES = fa_kvl_latent_smem_bytes();
    static_assert(SMEM_BYTES == (size_t)HEADER_BYTES + 1024 + Q_BYTES + STAGES * STAGE_BYTES &&
                      STAT_C + 32 * 128 == HEADER_BYTES,
                  "smem layout: header, alignment, Q, two tiles");
    static_assert(BLOCK_N % ROWS_PER_PASS == 0 && CHUNKS % ROW_THREADS == 0, "whole rows per pass");
    static_assert(FA_KVL_MAX_DV == 512 && 8 * O_TILES == 256 && FA_KVL_MAX_D == 9 * 64,
                  "two warpgroups of 256 columns; slabs 0..7 hold V, slab 8 the rest of K");
    static_assert(BLOCK_M == 64 && BLOCK_N == 64 && (BLOCK_N / 16) * 128 * 16 == KV_SLAB_BYTES,
                  "one warpgroup's P (4 k16 steps × 128 threads × 16 bytes) fills a slab");
    static_assert(fa_kvl_smem_bytes(1) <= Q_BYTES + STAGES * STAGE_BYTES, "the merge fits");

    template <int ROWS, int ROW_CHUNKS>
    static __device__ __forceinline__ uint32_t chunk_offset(int row, int ch) {
        return fa_kvl_slab_offset<ROWS>(row, ch);
    }
};

struct fa_kvl_latent_producer_config : fa_kvl_latent_config {
    static constexpr int THREADS = 128;
    static constexpr int ROWS_PER_PASS = THREADS / ROW_THREADS;
    static_assert(BLOCK_N % ROWS_PER_PASS == 0 && BLOCK_M % ROWS_PER_PASS == 0, "whole rows per pass");
};

/* 384 threads: the launch cap is 168 registers each; the producer's setmaxnreg.dec to 56 and the
 * consumers' .inc to 224 fit that pool (128 · 56 + 256 · 224 = 384 · 168). */
enum { FA_KVL_LATENT_THREADS = 384, FA_KVL_LATENT_CONSUMER_REGS = 224, FA_KVL_LATENT_PRODUCER_REGS = 56 };
enum {
    FA_KVL_LATENT_BAR_SA = 1,
    FA_KVL_LATENT_BAR_SC = 2,
    FA_KVL_LATENT_BAR_PA = 3,
    FA_KVL_LATENT_BAR_PC = 4,
    FA_KVL_LATENT_BAR_END = 5
};
enum { FA_KVL_LATENT_PART_A = 0, FA_KVL_LATENT_PART_B = 1, FA_KVL_LATENT_PART_C = 2 };

/* S = Q Kᵀ of a 64-slot tile over the padded d (fa_kvl_scores_steps), issued part by part as the
 * copies land: slab 8 (k16 steps 32..35, part C), slabs 0..3 (A), slabs 4..7 (B), each after its
 * full barrier; one commit group. fa_kvl_latent_scores_wait takes the accumulator into s_rmem
 * (fa_kvl_scores_wgmma's layout). */
template <class Elem>
__device__ __forceinline__ void fa_kvl_latent_scores_issue(uint32_t q_smem, uint32_t k_tile, uint32_t full_a,
                                                       uint32_t full_b, uint32_t full_c, uint32_t parity,
                                                       float (&acc)[32]) {
    const uint64_t q_desc = wgmma_desc_sw128(q_smem, 16, 1024);
    const uint64_t k_desc = wgmma_desc_sw128(k_tile, 16, 1024);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        acc[i] = 0.0f;
        wgmma_fence_operand(acc[i]);
    }
    mbarrier_wait_parity_spin(full_c, parity);
    fence_proxy_async_shared_cta(); /* cp.async copies (generic proxy), visible to wgmma */
    using Cfg = fa_kvl_latent_config;
    constexpr int Q_SLAB = Cfg::Q_SLAB_BYTES, K_SLAB = Cfg::KV_SLAB_BYTES;
    wgmma_fence();
    fa_kvl_scores_steps<Elem, 64, 1, Q_SLAB, K_SLAB, 32, 36>(q_desc, k_desc, acc);
    mbarrier_wait_parity_spin(full_a, parity);
    fence_proxy_async_shared_cta();
    fa_kvl_scores_steps<Elem, 64, 1, Q_SLAB, K_SLAB, 0, 16>(q_desc, k_desc, acc);
    mbarrier_wait_parity_spin(full_b, parity);
    fence_proxy_async_shared_cta();
    fa_kvl_scores_steps<Elem, 64, 1, Q_SLAB, K_SLAB, 16, 32>(q_desc, k_desc, acc);
    wgmma_commit_group();
}

__device__ __forceinline__ void fa_kvl_latent_scores_wait(float (&acc)[32], float (&s_rmem)[4][2][4]) {
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        wgmma_fence_operand(acc[i]);
        s_rmem[i / 8][(i / 4) % 2][i % 4] = acc[i];
    }
}

/* O += P V for `half`'s 256 columns (fa_kvl_pv_wgmma without the wait: one commit group). */
template <class Elem>
__device__ __forceinline__ void fa_kvl_latent_pv_issue(uint32_t v_tile, int half, uint32_t (&p_frag)[4][4],
                                                   float (&o_rmem)[128]) {
    using Cfg = fa_kvl_latent_config;
    const uint64_t v_desc =
        wgmma_desc_sw128(v_tile + (uint32_t)half * 4u * Cfg::KV_SLAB_BYTES, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma_fence_operand(o_rmem[i]);
#pragma unroll
    for (int g16 = 0; g16 < 4; ++g16)
#pragma unroll
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(p_frag[g16][x]);
    wgmma_fence();
#pragma unroll
    for (int g16 = 0; g16 < 4; ++g16)
        wgmma_rs_f32_transb<256, fa_kv_convert<Elem>::BF16>(
            o_rmem, p_frag[g16], fa_kvl_desc_plus(v_desc, (uint32_t)((g16 * 16 * 128) >> 4)), 1);
    wgmma_commit_group();
}

template <int N>
__device__ __forceinline__ void fa_kvl_latent_pv_wait(float (&o_rmem)[128]) {
    wgmma_wait_group<N>();
#pragma unroll
    for (int i = 0; i < 128; ++i) wgmma_fence_operand(o_rmem[i]);
}

/* P fragments (4 k16 steps × 4 words per thread) at `area` (8 KiB), thread slot 16·(tid % 128). */
__device__ __forceinline__ void fa_kvl_latent_store_p(uint32_t area, const uint32_t (&p_frag)[4][4]) {
#pragma unroll
    for (int g16 = 0; g16 < 4; ++g16) st_shared_v4_b32(area + 2048u * (uint32_t)g16, p_frag[g16]);
}
__device__ __forceinline__ void fa_kvl_latent_load_p(uint32_t area, uint32_t (&p_frag)[4][4]) {
#pragma unroll
    for (int g16 = 0; g16 < 4; ++g16) ld_shared_v4_b32(p_frag[g16], area + 2048u * (uint32_t)g16);
}

template <class Elem>
__global__ void __launch_bounds__(FA_KVL_LATENT_THREADS, 1)
    fa_kvl_latent_kernel(const fa_kv_params prm,
                         /* the cache {d, page_size or seqlen_k, heads_kv, num_pages or cache_batch}, box {64, 64, 1, 1} */
                         const __grid_constant__ CUtensorMap k_map,
                         int use_tma,       /* 0: every tile by cp.async (k_map unused) */
                         int wait_copies) { /* 1: the producer waits for its cp.async copies before arriving */
    using Cfg = fa_kvl_latent_config;
    using PCfg = fa_kvl_latent_producer_config;
    using Cvt = fa_kv_convert<Elem>;
    constexpr int BLOCK_N = Cfg::BLOCK_N;
    constexpr uint32_t SLAB_C = 8u * Cfg::KV_SLAB_BYTES; /* slab 8 of a K tile */

    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t q_smem = (smem_u32addr(smem_raw) + Cfg::HEADER_BYTES + 1023u) & ~1023u;
    const uint32_t hdr = q_smem - Cfg::HEADER_BYTES;
    const uint32_t stage_smem = q_smem + Cfg::Q_BYTES;
    const uint32_t q_full = hdr;
    auto full = [&](int b, int part) -> uint32_t { return hdr + 8u * (uint32_t)(1 + 3 * b + part); };
    auto empty = [&](int b, int part) -> uint32_t { return hdr + 8u * (uint32_t)(7 + 3 * b + part); };
    auto tile_smem = [&](int b) -> uint32_t { return stage_smem + (uint32_t)b * Cfg::STAGE_BYTES; };

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;
    const int row_group = warp % 4;
    const int wg = __shfl_sync(0xffffffffu, warp / 4, 0); /* 0: L, 1: R, 2: producer */

    if (tid == 0) {
        mbarrier_init(q_full, PCfg::THREADS);
        for (int b = 0; b < 2; ++b)
            for (int part = 0; part < 3; ++part) {
                mbarrier_init(full(b, part), PCfg::THREADS);
                mbarrier_init(empty(b, part), 128);
            }
        fence_mbarrier_init_release_cluster();
    }
    __syncthreads();

    const fa_kv_block blk = fa_kv_block_geometry<Cfg>(prm, 16 * row_group + quad_row); /* 1. */
    const int n_pairs = (blk.n_tiles + 1) / 2;

    if (wg == 2) { /* the producer: Q, then each tile's parts C, A, B as the consumers free them */
        setmaxnreg_dec<FA_KVL_LATENT_PRODUCER_REGS>();
        const fa_kvl_tile_loader<PCfg, true> ld(prm, blk, stage_smem, tid - 256);
        /* one arrival per thread once its copies have landed: by cp.async.mbarrier.arrive.noinc, or
           (wait_copies) after waiting for them, which racecheck can follow */
        auto cp_async_arrive = [&](uint32_t bar) {
            if (wait_copies) {
                cp_async_wait_all();
                mbarrier_arrive(bar);
            } else {
                cp_async_mbarrier_arrive_noinc(bar);
            }
        };
        fa_kvl_issue_q<PCfg>(prm, blk, q_smem, ld.row, ld.chunk0, ld.d_chunks); /* 2. */
        cp_async_arrive(q_full);
        /* the phantom tile: slots from slot_hi on, every copy a zero fill */
        const int phantom = (blk.slot_hi + BLOCK_N - 1) / BLOCK_N;
        auto tile_of = [&](int t) -> int { return t < blk.n_tiles ? blk.tile_first + t : phantom; };
        auto page = ld.fetch_pages(tile_of(0));
        auto page_next = ld.fetch_pages(tile_of(1));
        for (int t = 0; t < 2 * n_pairs; ++t) {
            const int b = t & 1, m = tile_of(t);
            const uint32_t parity = (uint32_t)((t >> 1) & 1) ^ 1u;
            /* a tile of cache rows the block reads, all 64: TMA boxes (one per slab, by the first
               thread; the others' arrivals plain); else the loader's cp.async copies */
            const int c_first = m * BLOCK_N;
            const bool tma = use_tma && t < blk.n_tiles && c_first >= blk.slot_lo &&
                             c_first + BLOCK_N <= min(blk.slot_hi, blk.cache_len);
            const int row_coord = blk.paged ? page.in_page[0] : c_first;
            const int batch_coord = blk.paged ? min(max(page.id[0], 0), prm.num_pages - 1) : blk.cache_row;
            auto issue = [&](int part, auto copies) {
                if (!tma) {
                    copies();
                    cp_async_arrive(full(b, part));
                } else if (tid == 256) {
                    const int s0 = part == FA_KVL_LATENT_PART_A ? 0 : part == FA_KVL_LATENT_PART_B ? 4 : 8;
                    const int n = part == FA_KVL_LATENT_PART_C ? 1 : 4;
                    fence_proxy_async_shared_cta(); /* earlier cp.async fills of the buffer, before TMA's */
                    mbarrier_arrive_expect_tx(full(b, part), (uint32_t)n * Cfg::KV_SLAB_BYTES);
                    for (int s = s0; s < s0 + n; ++s)
                        tma_load_4d_hint(tile_smem(b) + (uint32_t)s * Cfg::KV_SLAB_BYTES, &k_map, full(b, part),
                                         64 * s, row_coord, blk.hk, batch_coord, createpolicy_evict_first());
                } else {
                    mbarrier_arrive(full(b, part));
                }
            };
            mbarrier_wait_parity_spin(empty(b, FA_KVL_LATENT_PART_C), parity);
            issue(FA_KVL_LATENT_PART_C, [&] { ld.issue<8, 9>(m, b, page); });
            mbarrier_wait_parity_spin(empty(b, FA_KVL_LATENT_PART_A), parity);
            issue(FA_KVL_LATENT_PART_A, [&] { ld.issue<0, 4>(m, b, page); });
            mbarrier_wait_parity_spin(empty(b, FA_KVL_LATENT_PART_B), parity);
            issue(FA_KVL_LATENT_PART_B, [&] { ld.issue<4, 8>(m, b, page); });
            page = page_next;
            page_next = ld.fetch_pages(tile_of(t + 2));
        }
        cp_async_wait_all();
        return;
    }

    setmaxnreg_inc<FA_KVL_LATENT_CONSUMER_REGS>();
    if (blk.append && blk.split == 0 && blk.row_tile == 0) { /* 5. */
        const fa_kvl_tile_loader<Cfg, true> view(prm, blk, stage_smem, tid);
        fa_kv_append<Cfg, Cvt, true>(prm, blk, view, 0, tid);
    }

    float o_rmem[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o_rmem[i] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f}; /* L: this lane's share; quad-summed at the end */
    const float score_mul = prm.score_mul;
    const fa_mods_arg<false> no_mods{};
    const uint32_t frag = 16u * (uint32_t)(tid % 128); /* this thread's P fragments in a hand-over */
    const int row0 = 16 * row_group + quad_row;        /* the lane's rows row0, row0 + 8 */
    mbarrier_wait_parity_spin(q_full, 0);

    for (int i = 0; i < n_pairs; ++i) {
        const uint32_t parity = (uint32_t)(i & 1);
        float acc[32], s_rmem[4][2][4];
        uint32_t p_own[4][4], p_other[4][4];
        float scale_own[2], scale_other[2];
        if (wg == 0) { /* L */
            fa_kvl_latent_scores_issue<Elem>(q_smem, tile_smem(0), full(0, FA_KVL_LATENT_PART_A),
                                             full(0, FA_KVL_LATENT_PART_B), full(0, FA_KVL_LATENT_PART_C), parity, acc);
            barrier_sync(FA_KVL_LATENT_BAR_SA, 256); /* S_a issued: R's S_c queues behind it */
            fa_kvl_latent_scores_wait(acc, s_rmem);
            const int c0 = (blk.tile_first + 2 * i) * BLOCK_N;
#pragma unroll
            for (int g16 = 0; g16 < 4; ++g16)
                fa_kv_score_transform<Cfg, false>(prm, blk, c0 + 16 * g16, quad_col, s_rmem[g16], no_mods);
            fa_kvl_softmax<Elem, 4>(score_mul, s_rmem, scale_own, row_max, row_sum, p_own);
            barrier_sync(FA_KVL_LATENT_BAR_SC, 256); /* S_c done: buffer 1's slab 8 is free */
            /* complete already (R waited on it before S_c): this thread's own wait, so that
               racecheck sees the slab's cp.async fill ordered before these stores */
            mbarrier_wait_parity_spin(full(1, FA_KVL_LATENT_PART_C), parity);
            fa_kvl_latent_store_p(tile_smem(1) + SLAB_C + frag, p_own);
            if (quad_col == 0)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    st_shared_v2_f32(hdr + Cfg::STAT_A + 8u * (uint32_t)(row0 + 8 * h), row_max[h], scale_own[h]);
            barrier_sync(FA_KVL_LATENT_BAR_PA, 256); /* P_a and the statistics stored */
            fa_kvl_rescale_o<Cfg>(o_rmem, scale_own);
            fa_kvl_latent_pv_issue<Elem>(tile_smem(0), 0, p_own, o_rmem);
            fa_kvl_latent_pv_wait<0>(o_rmem);
            mbarrier_arrive(empty(0, FA_KVL_LATENT_PART_A)); /* buffer 0: S_a and P_a V_aL done */
            mbarrier_arrive(empty(0, FA_KVL_LATENT_PART_C));
            barrier_sync(FA_KVL_LATENT_BAR_PC, 256); /* P_c and R's stats stored */
            fa_kvl_latent_load_p(tile_smem(1) + SLAB_C + frag, p_other);
            float st[8], sum_c[2];
            ld_shared_v4_f32(st, hdr + Cfg::STAT_C + 2u * frag); /* R's thread of the same rows */
            ld_shared_v4_f32(st + 4, hdr + Cfg::STAT_C + 2u * frag + 16u);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                row_max[h] = st[h];
                scale_other[h] = st[2 + h];
                sum_c[h] = quad_col == 0 ? st[4 + h] : 0.0f; /* once per row in the quad's shares */
            }
            fence_proxy_async_shared_cta(); /* P_a written, P_c read (generic) before the next TMA writes */
            mbarrier_arrive(empty(1, FA_KVL_LATENT_PART_C)); /* S_c long done */
#pragma unroll
            for (int h = 0; h < 2; ++h) row_sum[h] = fmaf(row_sum[h], scale_other[h], sum_c[h]);
            fa_kvl_rescale_o<Cfg>(o_rmem, scale_other);
            mbarrier_wait_parity_spin(full(1, FA_KVL_LATENT_PART_A), parity); /* (R saw it complete) */
            fence_proxy_async_shared_cta();
            fa_kvl_latent_pv_issue<Elem>(tile_smem(1), 0, p_other, o_rmem);
            fa_kvl_latent_pv_wait<0>(o_rmem);
            mbarrier_arrive(empty(1, FA_KVL_LATENT_PART_A));
        } else { /* R */
            barrier_sync(FA_KVL_LATENT_BAR_SA, 256); /* L's S_a issued first */
            fa_kvl_latent_scores_issue<Elem>(q_smem, tile_smem(1), full(1, FA_KVL_LATENT_PART_A),
                                             full(1, FA_KVL_LATENT_PART_B), full(1, FA_KVL_LATENT_PART_C), parity, acc);
            fa_kvl_latent_scores_wait(acc, s_rmem);
            barrier_sync(FA_KVL_LATENT_BAR_SC, 256); /* S_c done: slab 8 of buffer 1 is free */
            const int t_c = 2 * i + 1;
            const int c0 = (blk.tile_first + t_c) * BLOCK_N;
#pragma unroll
            for (int g16 = 0; g16 < 4; ++g16)
                fa_kv_score_transform<Cfg, false>(prm, blk, c0 + 16 * g16, quad_col, s_rmem[g16], no_mods);
            if (t_c >= blk.n_tiles) /* the phantom tile */
#pragma unroll
                for (int g16 = 0; g16 < 4; ++g16)
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) s_rmem[g16][nt][e] = -CUDART_INF_F;
            barrier_sync(FA_KVL_LATENT_BAR_PA, 256); /* P_a and L's stats stored */
            fa_kvl_latent_load_p(tile_smem(1) + SLAB_C + frag, p_other);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 st = ld_shared_v2_f32(hdr + Cfg::STAT_A + 8u * (uint32_t)(row0 + 8 * h));
                row_max[h] = st.x;
                scale_other[h] = st.y;
            }
            fa_kvl_rescale_o<Cfg>(o_rmem, scale_other);
            mbarrier_wait_parity_spin(full(0, FA_KVL_LATENT_PART_B), parity); /* (L saw it complete) */
            fence_proxy_async_shared_cta();
            fa_kvl_latent_pv_issue<Elem>(tile_smem(0), 1, p_other, o_rmem); /* runs under the softmax of S_c */
            float sum_c[2] = {0.0f, 0.0f};
            fa_kvl_softmax<Elem, 4>(score_mul, s_rmem, scale_own, row_max, sum_c, p_own);
#pragma unroll
            for (int h = 0; h < 2; ++h) sum_c[h] = fa_quad_sum(sum_c[h]);
            fa_kvl_latent_store_p(tile_smem(1) + SLAB_C + frag, p_own); /* where this thread's P_a was */
            const uint32_t st[8] = {__float_as_uint(row_max[0]), __float_as_uint(row_max[1]),
                                    __float_as_uint(scale_own[0]), __float_as_uint(scale_own[1]),
                                    __float_as_uint(sum_c[0]), __float_as_uint(sum_c[1]), 0u, 0u};
            st_shared_v4_b32(hdr + Cfg::STAT_C + 2u * frag, st); /* for L's thread of the same rows */
            st_shared_v4_b32(hdr + Cfg::STAT_C + 2u * frag + 16u, st + 4);
            fence_proxy_async_shared_cta(); /* P_a read, P_c written (generic), before L frees the slab */
            barrier_sync(FA_KVL_LATENT_BAR_PC, 256); /* P_c and the statistics stored */
            fa_kvl_latent_pv_wait<0>(o_rmem);
            mbarrier_arrive(empty(0, FA_KVL_LATENT_PART_B));
            fa_kvl_rescale_o<Cfg>(o_rmem, scale_own);
            fa_kvl_latent_pv_issue<Elem>(tile_smem(1), 1, p_own, o_rmem);
            fa_kvl_latent_pv_wait<0>(o_rmem);
            mbarrier_arrive(empty(1, FA_KVL_LATENT_PART_B));
        }
    }

    /* R's rows' l: that of L's thread with the same (warp % 4, lane), through buffer 0 (every copy
     * landed and every tile read) */
    const uint32_t state_smem = stage_smem + 16u * (uint32_t)(tid % 128);
    bar_sync(FA_KVL_LATENT_BAR_END, 256); /* every consumer is past its last GEMM */
    if (wg == 0) {
        const uint32_t state[4] = {__float_as_uint(row_max[0]), __float_as_uint(row_max[1]),
                                   __float_as_uint(row_sum[0]), __float_as_uint(row_sum[1])};
        st_shared_v4_b32(state_smem, state);
    }
    bar_sync(FA_KVL_LATENT_BAR_END, 256);
    if (wg == 1) {
        uint32_t state[4];
        ld_shared_v4_b32(state, state_smem);
        row_max[0] = __uint_as_float(state[0]);
        row_max[1] = __uint_as_float(state[1]);
        row_sum[0] = __uint_as_float(state[2]);
        row_sum[1] = __uint_as_float(state[3]);
    }
    fa_kvl_store<Elem, Cfg>(prm, blk, blk.r0 + row0, wg, quad_col, 256 * wg, 256, o_rmem, row_max, row_sum,
                            score_mul); /* 4. */
    if (prm.num_splits == 1) return;
    if (fa_kv_claim_merge(prm, blk, tid)) /* 6. */
        fa_kv_merge_splits<Elem, fa_kvl_merge_area<true>, true>(prm, blk, q_smem, tid);
}

template <class Elem>
static fa_status fa_kvl_latent_launch(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream,
                                      const char *name) {
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    /* The TMA boxes need whole 64-slot tiles inside a page, a 16-byte aligned cache and strides
     * TMA takes; otherwise (or when the driver refuses the map) every tile goes by cp.async. */
    CUtensorMap k_map;
    memset(&k_map, 0, sizeof(k_map));
    const bool paged = prm->block_table != nullptr;
    int use_tma = (!paged || prm->page_size % FA_KVL_LATENT_BLOCK_N == 0) && ((uintptr_t)prm->k % 16) == 0;
    if (use_tma) {
        const fa_status st =
            fa_hopper_make_map(&k_map, "the latent-cache decode kernel", "k", CU_TENSOR_MAP_DATA_TYPE_UINT16, prm->k,
                               prm->head_dim, paged ? prm->page_size : prm->seqlen_k, prm->heads_kv,
                               paged ? prm->num_pages : prm->cache_batch, prm->k_row_stride, prm->k_head_stride,
                               prm->k_batch_stride, FA_KVL_LATENT_BLOCK_N);
        if (st == FA_ERR_STRIDE) use_tma = 0; /* strides TMA cannot express */
        else if (st != FA_OK) return st;
    }
    /* FA_CUDA_KVL_WAIT_COPIES=1: the producer waits for its cp.async copies and arrives plainly, so
     * that compute-sanitizer racecheck can follow them (tests/gpu_test.sh; slower where tiles go by
     * cp.async) */
    const char *wait = getenv("FA_CUDA_KVL_WAIT_COPIES");
    const int wait_copies = wait != nullptr && strcmp(wait, "1") == 0;
    return fa_kvl_launch_kernel(fa_kvl_latent_kernel<Elem>, smem_configured, FA_KVL_LATENT_THREADS,
                                fa_kvl_latent_config::SMEM_BYTES, prm, device_ordinal, stream, name, k_map, use_tma,
                                wait_copies);
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
