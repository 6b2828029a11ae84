/*
 * bwd_sm80.cuh: the main kernel of the portable CUDA backward (FlashAttention-2 scheme,
 * mma.sync m16n8k16, sm_80 and newer), templated on the element type and the head-dim bucket.
 * Included by instances/bwd_sm80_hdim<bucket>.cu, which instantiate it for f16 and bf16.
 *
 * One block owns BLOCK_K keys of one (batch, kv head) (tiles: bwd_tiles.h). K and V stay in
 * shared memory and the dK, dV accumulators in registers while the block walks every query block
 * of every query head it handles (the GQA group, or a slice of it). Per query block of BLOCK_Q
 * rows, with P and dS kept transposed (keys are the rows of every per-warp tile):
 *   1. S^T  = K Q^T                       (fp32 registers)
 *   2. dP^T = V dO^T
 *   3. P^T  = 2^(S^T·scale_log2 - LSE_log2)   (softcap / ALiBi / masks only where needed)
 *      dS^T = P^T ∘ (dP^T - D)  [· (1 - tanh²) with softcap]
 *   4. dV += P^T dO,  dK += dS^T Q         (P^T, dS^T are already the A operands: no transpose)
 *   5. dQ_accum += dS K                     (fp32 atomics, or one buffer per block: deterministic)
 * and at the end dK·scale, dV are stored (or fp32 partials when the GQA group is split).
 *
 * Pipelining: Q, dO, LSE and D of the next query block are fetched with cp.async into the other
 * of two shared-memory stages while the current one is computed. Two barriers per query block:
 *   A (top): this stage's data landed for every thread, and every warp has finished the previous
 *            query block (so its stage and the dS^T tile may be overwritten);
 *   B:       dS^T (and P^T) of this query block are complete in shared memory.
 * At d >= 512 (fa_bwd_q_stages) there is one stage, and a third barrier, C, after step 4: every
 * warp is done with Q and dO, so the next query block loads while step 5 runs.
 *
 * DROPOUT (a separate instantiation): with the keep bits of common/dropout.cuh (one Philox call
 * per lane per pair of m16n8 tiles of S^T) and Z = keep / (1 - p), step 3 makes P^T -> Z∘P^T (what dV
 * takes) and dS^T = P^T ∘ (Z∘dP^T - D).
 *
 * MODS (another instantiation): the score bias, document ids and block-sparse mask of
 * common/mods.cuh in step 3 (fa_mods_score on every element; the general path always); with a
 * block mask only the query tiles of the query blocks that list this key block are loaded and
 * computed (fa_mods_q_walk down the block map's column), and dL/dbias = P^T ∘
 * (dP^T - D) (0 where P = 0) stored per element into the dS target of fa_mods_params (each
 * element of a (b, h) belongs to one block and one query block: plain stores, deterministic).
 *
 * Fragment layouts (m16n8k16, lane = 4g + t): C/D fragment element e of n-tile j holds row
 * g + 8·(e >> 1), column 8j + 2t + (e & 1). Two adjacent n-tiles of a C fragment, packed to 16-bit
 * pairs, are exactly the A fragment of one k16 slice, which is how P^T and dS^T feed step 4.
 */
#ifndef FA_BWD_KERNEL_CUH
#define FA_BWD_KERNEL_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/common/bwd_launch.h"
#include "cuda/common/bwd_tiles.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/common/mods.cuh"

/* Queries of S^T/dP^T computed at a time per warp (see the chunk loop); a lab knob. */
#ifndef FA_BWD_CHUNK_Q
#define FA_BWD_CHUNK_Q 32
#endif

template <int BUCKET>
struct fa_bwd_config {
    static constexpr int D = BUCKET;                      /* padded head dim (d and dv)        */
    static constexpr int WARPS = fa_bwd_warps(BUCKET);
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int SPLIT_D = fa_bwd_split_d(BUCKET);
    static constexpr int BLOCK_K = fa_bwd_block_k(BUCKET);
    static constexpr int BLOCK_Q = fa_bwd_block_q(BUCKET);
    static constexpr int STAGES = fa_bwd_q_stages(BUCKET); /* of Q, dO, LSE, D                */
    static constexpr int KEY_WARPS = WARPS / SPLIT_D;     /* warps along the keys              */
    static constexpr int WARP_Q = BLOCK_Q / SPLIT_D;      /* queries per warp in S^T, dP^T     */
    static constexpr int CHUNK_Q = FA_BWD_CHUNK_Q < WARP_Q ? FA_BWD_CHUNK_Q : WARP_Q; /* ... at a time */
    static constexpr int WARP_COLS = D / SPLIT_D;         /* dK/dV columns per warp            */
    static constexpr int CHUNKS = D / 8;                  /* 16-byte chunks per Q/K/V/dO row   */
    static constexpr int S_CHUNKS = BLOCK_Q / 8;          /* 16-byte chunks per P^T/dS^T row   */
    static constexpr int DQ_ROW_WARPS = BLOCK_Q / 16;     /* dQ: warps along the queries       */
    static constexpr int DQ_COL_WARPS = WARPS / DQ_ROW_WARPS;
    static constexpr int DQ_WARP_COLS = D / DQ_COL_WARPS;
    static constexpr int DQ_PASS_COLS = DQ_WARP_COLS < 64      ? DQ_WARP_COLS
                                        : DQ_WARP_COLS % 64 == 0 ? 64
                                                                 : 32; /* 32 acc registers (16 at d = 576) */
    /* Column pieces whose B fragment addresses fa_bwd_pair_step can walk (its rule: the piece
     * starts a 128-byte group of the swizzle, or half-way into one with at most two pairs): the
     * dK/dV pieces (QT) and the dQ pieces (KT). At d = 576 (144 columns per warp, 288 of dQ)
     * neither does, and the addresses are formed per pair instead. */
    static constexpr bool QT_PAIR_STEP = SPLIT_D == 1 || WARP_COLS % 64 == 0;
    static constexpr bool KT_PAIR_STEP = DQ_COL_WARPS == 1 || DQ_WARP_COLS % 64 == 0 || DQ_WARP_COLS == 32;
    /* shared memory, in bytes */
    static constexpr uint32_t K_BYTES = 2u * BLOCK_K * D;
    static constexpr uint32_t Q_BYTES = 2u * BLOCK_Q * D;
    static constexpr uint32_t S_BYTES = 2u * BLOCK_K * BLOCK_Q;
    static constexpr uint32_t OFF_K = 0;
    static constexpr uint32_t OFF_V = OFF_K + K_BYTES;
    static constexpr uint32_t OFF_Q = OFF_V + K_BYTES;           /* [STAGES][BLOCK_Q][D]     */
    static constexpr uint32_t OFF_DO = OFF_Q + STAGES * Q_BYTES;  /* [STAGES][BLOCK_Q][D]     */
    static constexpr uint32_t OFF_DS = OFF_DO + STAGES * Q_BYTES; /* dS^T [BLOCK_K][BLOCK_Q]  */
    static constexpr uint32_t OFF_P = OFF_DS + S_BYTES;          /* P^T (SPLIT_D > 1 only)   */
    static constexpr uint32_t OFF_LSE = OFF_P + (SPLIT_D > 1 ? S_BYTES : 0); /* [STAGES][BLOCK_Q] */
    static constexpr uint32_t OFF_DSUM = OFF_LSE + STAGES * 4 * BLOCK_Q;     /* [STAGES][BLOCK_Q] */
    static constexpr uint32_t SMEM = OFF_DSUM + STAGES * 4 * BLOCK_Q;

    static_assert(SMEM == fa_bwd_smem_bytes(BUCKET), "bwd_tiles.h and the kernel disagree");
    static_assert(KEY_WARPS * 16 == BLOCK_K && WARP_Q % CHUNK_Q == 0 && WARP_COLS % 16 == 0, "tiles");
    static_assert(SPLIT_D == 1 || WARP_Q == CHUNK_Q, "SPLIT_D > 1 computes its queries in one chunk");
    static_assert(DQ_ROW_WARPS * DQ_COL_WARPS == WARPS && DQ_WARP_COLS % DQ_PASS_COLS == 0, "dQ");
    static_assert(CHUNKS % 8 == 0 && S_CHUNKS % 8 == 0, "swizzle needs rows of >= 8 chunks");
    static_assert(2 * BLOCK_Q <= THREADS, "one thread per LSE/D element");
};

/* Byte offset of element (row, col) in a swizzled tile of CHUNKS 16-byte chunks per row (col of
 * a 16-bit element; the swizzle permutes whole chunks, so the offset inside a chunk is kept). */
template <int CHUNKS>
__device__ __forceinline__ uint32_t fa_bwd_tile_offset(int row, int col) {
    return 16u * fa_swizzled_chunk<CHUNKS>(row, col >> 3) + 2u * (uint32_t)(col & 7);
}

/* ldmatrix addresses walk a row in steps of one chunk pair (16 elements). A lane reads logical
 * chunk 2m + c of a row r (c = 0 or 1 fixed per lane), stored at chunk (2m + c) ^ (r & 7) =
 * 8·(m / 4) + (2·(m % 4) ^ (c ^ (r & 7))). So from the address `addr` of pair m0 of that row, pair
 * m0 + j is at (addr ^ 32·(j % 4)) + 128·(j / 4): one XOR and an immediate instead of a register
 * per j. Valid when rows start on 128-byte boundaries and (m0 % 4) & j == 0 for the j used
 * (m0 % 4 == 0, or m0 % 4 == 2 with j <= 1). */
__device__ __forceinline__ uint32_t fa_bwd_pair_step(uint32_t addr, int j) {
    return (addr ^ (32u * (uint32_t)(j & 3))) + 128u * (uint32_t)(j >> 2);
}

/* dst[0..1] += (a, b), fp32 in global memory, result unused (compiles to a reduction). */
__device__ __forceinline__ void fa_bwd_atomic_add2(float *dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(a, b)); /* one 8-byte red on sm_90 */
#else
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
#endif
}

/* Copy a [ROWS, D] tile (rows of `row_stride` elements from gmem_row0) into a swizzled shared
 * tile with 16-byte cp.async, zero-filling rows >= valid_rows and columns >= valid_cols (both
 * multiples of 8 for the columns). */
template <int BUCKET, int ROWS>
__device__ __forceinline__ void fa_bwd_load_tile(uint32_t smem_tile, const uint16_t *gmem_row0,
                                                 int64_t row_stride, int valid_rows, int valid_cols) {
    using Cfg = fa_bwd_config<BUCKET>;
    if constexpr (Cfg::THREADS % Cfg::CHUNKS != 0) { /* rows of 72 chunks (d = 576) */
        fa_load_tile_items<Cfg::THREADS, Cfg::CHUNKS, ROWS>(smem_tile, gmem_row0, row_stride, valid_rows,
                                                            valid_cols / 8, gmem_row0);
    } else {
        constexpr int ROWS_PER_PASS = Cfg::THREADS / Cfg::CHUNKS;
        static_assert(ROWS % ROWS_PER_PASS == 0, "whole passes");
        /* with ROWS_PER_PASS % 8 == 0 every pass keeps row & 7, so one swizzled offset serves all;
         * at d = 512 (4 rows per pass) the offset alternates between two */
        const int chunk = threadIdx.x % Cfg::CHUNKS;
        const int row0 = threadIdx.x / Cfg::CHUNKS;
        const bool chunk_ok = chunk * 8 < valid_cols;
        const uint32_t dst0 = smem_tile + 16 * fa_swizzled_chunk<Cfg::CHUNKS>(row0, chunk);
        const uint32_t dst1 = smem_tile + 16 * fa_swizzled_chunk<Cfg::CHUNKS>(row0 + ROWS_PER_PASS % 8, chunk) -
                              16 * (ROWS_PER_PASS % 8) * Cfg::CHUNKS; /* odd passes when ROWS_PER_PASS % 8 == 4 */
        static_assert(ROWS_PER_PASS % 8 == 0 || ROWS_PER_PASS == 4, "passes of 8·k or 4 rows");
#pragma unroll
        for (int pass = 0; pass < ROWS / ROWS_PER_PASS; ++pass) {
            const int row = row0 + pass * ROWS_PER_PASS;
            const bool ok = chunk_ok && row < valid_rows;
            const uint16_t *src = gmem_row0 + (int64_t)row * row_stride + chunk * 8;
            cp_async_cg_16((ROWS_PER_PASS % 8 != 0 && (pass & 1) ? dst1 : dst0) +
                               pass * ROWS_PER_PASS * Cfg::CHUNKS * 16,
                           ok ? (const void *)src : (const void *)gmem_row0, ok ? 16 : 0);
        }
    }
}

/* Element offset of (sequence b starting at packed row `start`, row `row`, head h). */
__device__ __forceinline__ int64_t fa_bwd_row_offset(bool varlen, int b, int64_t start, int row,
                                                     int h, int64_t batch_stride, int64_t row_stride,
                                                     int64_t head_stride) {
    const int64_t base = varlen ? (start + row) * row_stride
                                : (int64_t)b * batch_stride + (int64_t)row * row_stride;
    return base + (int64_t)h * head_stride;
}

/* P^T and dS^T of one warp chunk (16 keys × CHUNK_Q queries) from the S^T and dP^T accumulators,
 * in place: s_acc becomes P^T, dp_acc becomes dS^T. GENERAL adds softcap, ALiBi and the mask
 * (the plain path is one FFMA + ex2 per element). DROPOUT: s_acc becomes Z∘P^T and dS^T =
 * P^T ∘ (Z∘dP^T - D); drop_b, drop_h are the sequence and query head, drop_key0 and
 * drop_query0 the sequence's key of row 0 and query of column 0 of the chunk (GENERAL or not). */
template <int BUCKET, bool GENERAL, bool DROPOUT, bool MODS = false>
__device__ __forceinline__ void fa_bwd_scores_to_grads(
    const fa_bwd_params &prm, float (&s_acc)[fa_bwd_config<BUCKET>::CHUNK_Q / 8][4],
    float (&dp_acc)[fa_bwd_config<BUCKET>::CHUNK_Q / 8][4], const float *lse_smem,
    const float *dsum_smem, int q_col0, int key0, int query0, int shift, int len_q, int len_k,
    int left_limit, int right_limit, float alibi_log2, const fa_dropout_params &dropout, int drop_b, int drop_h,
    int drop_key0, int drop_query0, const fa_mods_arg<MODS> *mods = nullptr,
    const fa_mods_tile *mods_tile = nullptr, int mods_left_limit = 0, int mods_right_limit = 0) {
    using Cfg = fa_bwd_config<BUCKET>;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    static_assert(!DROPOUT || Cfg::CHUNK_Q % 32 == 0 || Cfg::CHUNK_Q == 16,
                  "dropout keep bits come in fours of n8 tiles (a 16-query chunk uses the first two)");
    uint32_t keep4 = 0; /* dropout: keep bits of n8 tiles j .. j + 3 (one call per lane per four) */
#pragma unroll
    for (int j = 0; j < Cfg::CHUNK_Q / 8; ++j) {
        const int qcol = q_col0 + 8 * j + 2 * t; /* query column of elements e = 0, 2 (+1: 1, 3) */
        const float2 lse2 = *reinterpret_cast<const float2 *>(lse_smem + qcol);
        const float2 dsum2 = *reinterpret_cast<const float2 *>(dsum_smem + qcol);
        if (DROPOUT && j % 4 == 0)
            keep4 = fa_dropout_keep_kq4(dropout, drop_b, drop_h, prm.heads_q, drop_key0, drop_query0 + q_col0 + 8 * j);
        const uint32_t keep = keep4 >> (4 * (j % 4));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float lse = (e & 1) ? lse2.y : lse2.x;
            const float dsum = (e & 1) ? dsum2.y : dsum2.x;
            const float s = s_acc[j][e];
            /* dropout: dP -> Z∘dP (Z = 0 or 1 / (1 - p)) */
            const float z = DROPOUT ? ((keep >> e) & 1u ? dropout.keep_scale : 0.0f) : 1.0f;
            const float dp = DROPOUT ? dp_acc[j][e] * z : dp_acc[j][e];
            float p, ds;
            if (!GENERAL) {
                p = ex2_approx_ftz_f32(fmaf(s, prm.scale_log2, -lse));
                ds = p * (dp - dsum);
            } else {
                const int key = key0 + g + 8 * (e >> 1);   /* in the sequence */
                const int query = query0 + qcol + (e & 1);
                const int diff = key - (query + shift);     /* key minus the query's diagonal */
                float x, dcap = 1.0f;
                if (prm.softcap_pre != 0.0f) {
                    const float tc = fa_tanh(s * prm.softcap_pre);
                    x = prm.softcap_post_log2 * tc;
                    dcap = 1.0f - tc * tc;
                } else {
                    x = s * prm.scale_log2;
                }
                x -= alibi_log2 * (float)abs(diff);
                const bool in_bounds = key < len_k && query < len_q;
                if constexpr (MODS) {
                    x = fa_mods_score(*mods, *mods_tile, query, key, in_bounds,
                                      fa_window_holds(diff, mods_left_limit, mods_right_limit), x,
                                      1.4426950408889634f);
                    p = x == -CUDART_INF_F ? 0.0f : ex2_approx_ftz_f32(x - lse);
                    const float dbias = p == 0.0f ? 0.0f : p * (dp - dsum); /* before softcap's factor */
                    if (mods->dbias != nullptr && in_bounds) fa_mods_store_dbias(*mods, drop_b, drop_h, query, key, dbias);
                } else {
                    const bool visible = in_bounds && fa_window_holds(diff, left_limit, right_limit);
                    p = visible ? ex2_approx_ftz_f32(x - lse) : 0.0f;
                }
                ds = p * (dp - dsum) * dcap;
            }
            s_acc[j][e] = DROPOUT ? p * z : p; /* dV takes Z∘P */
            dp_acc[j][e] = ds;
        }
    }
}

template <class Elem, int BUCKET, bool DROPOUT, bool MODS>
__global__ void __launch_bounds__(fa_bwd_config<BUCKET>::THREADS, 1)
    fa_bwd_main_kernel(const fa_bwd_params prm, const fa_dropout_params dropout /* read iff DROPOUT */,
                       const fa_mods_arg<MODS> mods /* read iff MODS */) {
    using Cfg = fa_bwd_config<BUCKET>;
    constexpr int D = Cfg::D, BLOCK_K = Cfg::BLOCK_K, BLOCK_Q = Cfg::BLOCK_Q;
    constexpr int WARP_Q = Cfg::WARP_Q, CHUNK_Q = Cfg::CHUNK_Q, WARP_COLS = Cfg::WARP_COLS;
    constexpr int CHUNKS = Cfg::CHUNKS, S_CHUNKS = Cfg::S_CHUNKS;
    constexpr uint32_t ROWS16 = 16 * 16 * CHUNKS;   /* bytes of 16 rows of a Q/K/V/dO tile    */
    constexpr uint32_t S_ROWS16 = 16 * 16 * S_CHUNKS; /* bytes of 16 rows of a P^T/dS^T tile  */

    /* Shared memory (fa_bwd_config offsets): K, V [BLOCK_K][D] | Q, dO [2 stages][BLOCK_Q][D] |
     * dS^T [BLOCK_K][BLOCK_Q] | P^T (SPLIT_D = 2) | LSE_log2, D [2 stages][BLOCK_Q] fp32. Every
     * 16-bit tile is swizzled (fa_swizzled_chunk); rows start on 128-byte boundaries, which
     * fa_bwd_pair_step relies on. */
    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t smem = smem_u32addr(smem_raw);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wk = warp % Cfg::KEY_WARPS; /* steps 1-4: keys 16wk..16wk+15 of the block        */
    const int wq = warp / Cfg::KEY_WARPS; /* steps 1-2: query part; step 4: column part         */
    const int key_row0 = 16 * wk;
    const int q_col0 = wq * WARP_Q;
    const int col0 = wq * WARP_COLS;
    const int dq_row0 = 16 * (warp % Cfg::DQ_ROW_WARPS); /* step 5: queries dq_row0..+15     */
    const int dq_col0 = Cfg::DQ_WARP_COLS * (warp / Cfg::DQ_ROW_WARPS);

    /* Per-lane ldmatrix addresses of chunk pair 0 (later pairs: fa_bwd_pair_step). With .x4,
     * lanes 8i..8i+7 address the 8 rows of matrix i, and r[i] receives matrix i:
     *   k_lane:   A (16 keys × 16) from K (V at +OFF_V): matrix i = rows +8·(i & 1), cols +8·(i >> 1)
     *             -> a[0..3] in mma order; s_lane: the same from P^T / dS^T (SPLIT_D = 2)
     *   q_lane:   B = Q^T (dO^T) non-transposed, Q rows = queries = n: matrix i = n +8·(i >> 1),
     *             k +8·(i & 1) -> b[0..1] of n-tile 0, b[0..1] of n-tile 1
     *   qt_lane:  B = Q (dO) transposed, rows = queries = k: matrix i = k +8·(i & 1), n +8·(i >> 1)
     *   dst_lane: A = dS, transposed from dS^T (rows = keys = k): matrix i = queries +8·(i & 1),
     *             keys +8·(i >> 1) -> a[0..3] in mma order
     *   kt_lane:  B = K transposed, rows = keys = k: matrix i = k +8·(i & 1), n +8·(i >> 1) */
    const uint32_t k_lane = smem + Cfg::OFF_K + fa_bwd_tile_offset<CHUNKS>(key_row0 + (lane & 15), 8 * (lane >> 4));
    const uint32_t s_lane = smem + Cfg::OFF_DS + fa_bwd_tile_offset<S_CHUNKS>(key_row0 + (lane & 15), 8 * (lane >> 4));
    const uint32_t q_lane = smem + Cfg::OFF_Q +
                            fa_bwd_tile_offset<CHUNKS>(q_col0 + (lane & 7) + 8 * (lane >> 4), 8 * ((lane >> 3) & 1));
    const uint32_t qt_lane = smem + Cfg::OFF_Q +
                             fa_bwd_tile_offset<CHUNKS>((lane & 7) + 8 * ((lane >> 3) & 1), col0 + 8 * (lane >> 4));
    const uint32_t dst_lane = smem + Cfg::OFF_DS +
                              fa_bwd_tile_offset<S_CHUNKS>((lane & 7) + 8 * (lane >> 4), dq_row0 + 8 * ((lane >> 3) & 1));
    const uint32_t kt_lane = smem + Cfg::OFF_K +
                             fa_bwd_tile_offset<CHUNKS>((lane & 7) + 8 * ((lane >> 3) & 1), dq_col0 + 8 * (lane >> 4));
    /* 4-byte stores of dS^T / P^T: row key_row0 + g, column q_col0 + 2t (+8j: XOR 16j, see below). */
    const uint32_t s_store = smem + Cfg::OFF_DS + fa_bwd_tile_offset<S_CHUNKS>(key_row0 + g, q_col0 + 2 * t);
    /* B fragment addresses of steps 4 and 5 at column pair `pair` of qt_lane's / kt_lane's
     * columns (+ base, a multiple of 128): fa_bwd_pair_step where the pieces start a 128-byte
     * group, else formed from the column (d = 576) */
    auto qt_pair = [&](uint32_t base, int pair) -> uint32_t {
        if constexpr (Cfg::QT_PAIR_STEP) return fa_bwd_pair_step(qt_lane + base, pair);
        else
            return smem + Cfg::OFF_Q + base +
                   fa_bwd_tile_offset<CHUNKS>((lane & 7) + 8 * ((lane >> 3) & 1), col0 + 16 * pair + 8 * (lane >> 4));
    };
    auto kt_pair = [&](int pair) -> uint32_t {
        if constexpr (Cfg::KT_PAIR_STEP) return fa_bwd_pair_step(kt_lane, pair);
        else
            return smem + Cfg::OFF_K +
                   fa_bwd_tile_offset<CHUNKS>((lane & 7) + 8 * ((lane >> 3) & 1), dq_col0 + 16 * pair + 8 * (lane >> 4));
    };

    /* ---- which block: blocks_per_head consecutive blocks share one (batch, kv head, group
     * split), so they read the same Q/dO while those are in L2. */
    int rest = blockIdx.x;
    const int first_block = rest % prm.blocks_per_head;
    rest /= prm.blocks_per_head;
    const int gsplit = rest % prm.group_splits;
    rest /= prm.group_splits;
    const int hk = rest % prm.heads_kv;
    const int b = rest / prm.heads_kv;

    const bool varlen = prm.cu_seqlens_q != nullptr;
    const fa_seq_rows seq = fa_sequence_rows(prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q,
                                             prm.total_k, prm.seqlen_q, prm.seqlen_k, b);
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int64_t q_packed = varlen ? seq.q_start : (int64_t)b * prm.seqlen_q;
    const int64_t k_packed = varlen ? seq.k_start : (int64_t)b * prm.seqlen_k;
    const int shift = len_k - len_q;
    const int left_limit = fa_window_limit(prm.window_left); /* per element: fa_window_holds */
    const int right_limit = fa_window_limit(prm.window_right);
    const bool transform = prm.softcap_pre != 0.0f || prm.alibi_slopes != nullptr;
    int mods_left_limit = 0, mods_right_limit = 0; /* MODS: the element window, per element */
    if constexpr (MODS) {
        mods_left_limit = fa_window_limit(mods.elem_window_left);
        mods_right_limit = fa_window_limit(mods.elem_window_right);
    }

    const int h_begin = hk * prm.group + gsplit * prm.heads_per_split;
    const int h_end = min(h_begin + prm.heads_per_split, (hk + 1) * prm.group);
    float *dq_accum = prm.dq_accum + (int64_t)first_block * prm.dq_accum_split_elems;
    const int64_t dq_row_elems = (int64_t)prm.heads_q * prm.head_dim;

    const uint16_t *q_gmem = static_cast<const uint16_t *>(prm.q);
    const uint16_t *k_gmem = static_cast<const uint16_t *>(prm.k);
    const uint16_t *v_gmem = static_cast<const uint16_t *>(prm.v);
    const uint16_t *do_gmem = static_cast<const uint16_t *>(prm.dout);

    for (int n_block = first_block; n_block * BLOCK_K < len_k; n_block += prm.blocks_per_head) {
        const int n0 = n_block * BLOCK_K;
        const int keys_valid = min(BLOCK_K, len_k - n0);

        /* Query rows that see at least one key of [n0, n0 + keys_valid). */
        int64_t q_lo, q_hi;
        fa_query_range(n0, n0 + keys_valid, len_q, len_k, prm.window_left, prm.window_right, &q_lo, &q_hi);
        const int m_first = (int)(q_lo / BLOCK_Q);
        const int m_count = q_hi > q_lo ? (int)((q_hi + BLOCK_Q - 1) / BLOCK_Q) - m_first : 0;
        int n_iter = m_count * (h_end - h_begin);
        /* MODS with a block mask: the listed (head, query tile) positions instead, walked with
         * `walk`: an iteration's position, advanced at its start to the prefetch's (`pos` keeps it) */
        fa_mods_q_pos walk = {h_begin, 0, 0, 0};
        fa_mods_q_walk q_walk;
        bool q_walk_on = false;
        if constexpr (MODS) {
            if (mods.block_map != nullptr) {
                q_walk_on = true;
                q_walk = fa_mods_q_walk_at(mods, b, h_begin, h_end, n0, BLOCK_Q, len_q);
                n_iter = fa_mods_q_count(q_walk, h_begin);
                walk = fa_mods_first_q_tile(q_walk, h_begin);
            }
        }

        float dk_acc[WARP_COLS / 8][4], dv_acc[WARP_COLS / 8][4];
#pragma unroll
        for (int j = 0; j < WARP_COLS / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk_acc[j][e] = dv_acc[j][e] = 0.0f;

        /* Fetch Q, dO, LSE_log2 and D of iteration `it` into `stage`. */
        auto prefetch = [&](int it, int stage) {
            const int h = MODS && q_walk_on ? walk.h : h_begin + it / m_count;
            const int m0 = MODS && q_walk_on ? walk.tile * BLOCK_Q : (m_first + it % m_count) * BLOCK_Q;
            const int rows = min(BLOCK_Q, len_q - m0);
            fa_bwd_load_tile<BUCKET, BLOCK_Q>(
                smem + Cfg::OFF_Q + stage * Cfg::Q_BYTES,
                q_gmem + fa_bwd_row_offset(varlen, b, seq.q_start, m0, h, prm.q_batch_stride,
                                           prm.q_row_stride, prm.q_head_stride),
                prm.q_row_stride, rows, prm.head_dim);
            fa_bwd_load_tile<BUCKET, BLOCK_Q>(
                smem + Cfg::OFF_DO + stage * Cfg::Q_BYTES,
                do_gmem + fa_bwd_row_offset(varlen, b, seq.q_start, m0, h, prm.do_batch_stride,
                                            prm.do_row_stride, prm.do_head_stride),
                prm.do_row_stride, rows, prm.head_dim_v);
            if (threadIdx.x < 2 * BLOCK_Q) {
                const int r = threadIdx.x % BLOCK_Q;
                const bool is_lse = threadIdx.x < BLOCK_Q;
                const float *src = (is_lse ? prm.lse_log2 : prm.dsum) +
                                   (int64_t)h * prm.total_q + q_packed + m0;
                const uint32_t dst = smem + (is_lse ? Cfg::OFF_LSE : Cfg::OFF_DSUM) +
                                     4u * (uint32_t)(stage * BLOCK_Q + r);
                cp_async_ca_4(dst, r < rows ? (const void *)(src + r) : (const void *)src,
                              r < rows ? 4 : 0);
            }
        };

        if (n_iter > 0) {
            /* The previous key block of this block (deterministic mode) is finished by every
             * warp before K and V are overwritten. */
            __syncthreads();
            fa_bwd_load_tile<BUCKET, BLOCK_K>(
                smem + Cfg::OFF_K,
                k_gmem + fa_bwd_row_offset(varlen, b, seq.k_start, n0, hk, prm.k_batch_stride,
                                           prm.k_row_stride, prm.k_head_stride),
                prm.k_row_stride, keys_valid, prm.head_dim);
            fa_bwd_load_tile<BUCKET, BLOCK_K>(
                smem + Cfg::OFF_V,
                v_gmem + fa_bwd_row_offset(varlen, b, seq.k_start, n0, hk, prm.v_batch_stride,
                                           prm.v_row_stride, prm.v_head_stride),
                prm.v_row_stride, keys_valid, prm.head_dim_v);
            prefetch(0, 0);
            cp_async_commit_group();
        }

        for (int it = 0; it < n_iter; ++it) {
            const int stage = Cfg::STAGES == 2 ? it & 1 : 0;
            const fa_mods_q_pos pos = walk; /* this iteration's */
            const int h = MODS && q_walk_on ? pos.h : h_begin + it / m_count;
            const int m0 = MODS && q_walk_on ? pos.tile * BLOCK_Q : (m_first + it % m_count) * BLOCK_Q;
            if (MODS && q_walk_on) fa_mods_next_q_tile(q_walk, h_begin, walk); /* the prefetch's position */
            const uint32_t stage_off = stage * Cfg::Q_BYTES; /* multiple of 128 */
            const float *lse_smem = reinterpret_cast<const float *>(smem_raw + Cfg::OFF_LSE) + stage * BLOCK_Q;
            const float *dsum_smem = reinterpret_cast<const float *>(smem_raw + Cfg::OFF_DSUM) + stage * BLOCK_Q;

            /* Barrier A: this stage has landed for all threads; all warps are done with the
             * previous query block, so the other stage and dS^T may be overwritten. (One stage:
             * the next block's prefetch waits for barrier C, below.) */
            cp_async_wait_all();
            __syncthreads();
            if (Cfg::STAGES == 2 && it + 1 < n_iter) {
                prefetch(it + 1, stage ^ 1);
                cp_async_commit_group();
            }
            fa_mods_tile mods_tile;
            if constexpr (MODS)
                mods_tile = fa_mods_tile_of(mods, b, h, varlen, seq.q_start, seq.k_start, pos.qb,
                                            q_walk_on ? q_walk.kb : 0, pos.entry);

            /* The plain score path (step 3) needs the tile fully inside both sequences and the
             * window, and no score transform. */
            const bool tile_inside =
                m0 + BLOCK_Q <= len_q && fa_tile_all_visible((int64_t)m0 + shift, (int64_t)m0 + BLOCK_Q - 1 + shift, n0,
                                                             n0 + BLOCK_K, prm.window_left, prm.window_right, len_k);
            const float alibi_log2 =
                prm.alibi_slopes != nullptr
                    ? prm.alibi_slopes[b * prm.alibi_batch_stride + h] * 1.4426950408889634f
                    : 0.0f;

            /* Steps 1-4 run per chunk of CHUNK_Q queries (a real loop: the S^T, dP^T registers
             * of one chunk are live at a time, next to the 128 of dK, dV at d = 128). */
#pragma unroll 1
            for (int qc = 0; qc < WARP_Q / CHUNK_Q; ++qc) {
                constexpr int NT = CHUNK_Q / 8; /* n-tiles of the chunk */
                const int q_col = q_col0 + qc * CHUNK_Q;
                const uint32_t q_chunk = q_lane + stage_off + qc * (CHUNK_Q / 16) * ROWS16;

                /* ---- 1-2. S^T = K Q^T and dP^T = V dO^T: keys key_row0.. × queries q_col.. */
                float s_acc[NT][4], dp_acc[NT][4];
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s_acc[j][e] = dp_acc[j][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    if (16 * kk < prm.head_dim) {
                        uint32_t a[4];
                        ldmatrix_x4(a, fa_bwd_pair_step(k_lane, kk));
#pragma unroll
                        for (int j2 = 0; j2 < NT / 2; ++j2) {
                            uint32_t bq[4]; /* n-tiles 2j2 (bq[0..1]) and 2j2 + 1 (bq[2..3]) */
                            ldmatrix_x4(bq, fa_bwd_pair_step(q_chunk, kk) + j2 * ROWS16);
                            Elem::mma(s_acc[2 * j2], a, bq);
                            Elem::mma(s_acc[2 * j2 + 1], a, bq + 2);
                        }
                    }
                }
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    if (16 * kk < prm.head_dim_v) {
                        uint32_t a[4];
                        ldmatrix_x4(a, fa_bwd_pair_step(k_lane, kk) + (Cfg::OFF_V - Cfg::OFF_K));
#pragma unroll
                        for (int j2 = 0; j2 < NT / 2; ++j2) {
                            uint32_t bo[4];
                            ldmatrix_x4(bo, fa_bwd_pair_step(q_chunk, kk) + j2 * ROWS16 +
                                                (Cfg::OFF_DO - Cfg::OFF_Q));
                            Elem::mma(dp_acc[2 * j2], a, bo);
                            Elem::mma(dp_acc[2 * j2 + 1], a, bo + 2);
                        }
                    }
                }

                /* ---- 3. P^T, dS^T. The plain path needs the tile fully inside both sequences
                 * and the window, and no score transform. */
                if (!MODS && tile_inside && !transform) {
                    fa_bwd_scores_to_grads<BUCKET, false, DROPOUT>(prm, s_acc, dp_acc, lse_smem, dsum_smem,
                                                                   q_col, 0, 0, 0, 0, 0, 0, 0, 0.0f, dropout, b, h,
                                                                   n0 + key_row0, m0);
                } else {
                    fa_bwd_scores_to_grads<BUCKET, true, DROPOUT, MODS>(prm, s_acc, dp_acc, lse_smem, dsum_smem,
                                                                  q_col, n0 + key_row0, m0, shift, len_q, len_k,
                                                                  left_limit, right_limit, alibi_log2, dropout, b, h,
                                                                  n0 + key_row0, m0, &mods, &mods_tile,
                                                                  mods_left_limit, mods_right_limit);
                }

                /* Pack to 16-bit A fragments: k16 slice kk2 = n-tiles 2kk2, 2kk2 + 1. */
                uint32_t p_frag[NT / 2][4], ds_frag[NT / 2][4];
#pragma unroll
                for (int kk2 = 0; kk2 < NT / 2; ++kk2) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        p_frag[kk2][2 * half] = Elem::pack2(s_acc[2 * kk2 + half][0], s_acc[2 * kk2 + half][1]);
                        p_frag[kk2][2 * half + 1] = Elem::pack2(s_acc[2 * kk2 + half][2], s_acc[2 * kk2 + half][3]);
                        ds_frag[kk2][2 * half] = Elem::pack2(dp_acc[2 * kk2 + half][0], dp_acc[2 * kk2 + half][1]);
                        ds_frag[kk2][2 * half + 1] = Elem::pack2(dp_acc[2 * kk2 + half][2], dp_acc[2 * kk2 + half][3]);
                    }
                }

                /* dS^T (and P^T) to shared memory, [key][query] swizzled: n-tile j of rows g, g + 8
                 * is a 4-byte pair at column q_col + 8j + 2t, chunk (q_col0/8 + NT·qc + j) ^ g. The
                 * three terms share no bits (q_col0/8 is 0, or 4 with a single chunk, or 2·wq at
                 * d = 512 with a single chunk of NT = 2; NT is a power of two above j), so the
                 * address is s_store ^ 16·(NT·qc + j). */
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const uint32_t addr = (s_store ^ (16u * (NT * qc + j))) + half * 8 * 16 * S_CHUNKS;
                        st_shared_b32(addr, ds_frag[j / 2][2 * (j & 1) + half]);
                        if (Cfg::SPLIT_D > 1)
                            st_shared_b32(addr + (Cfg::OFF_P - Cfg::OFF_DS), p_frag[j / 2][2 * (j & 1) + half]);
                    }
                }

                /* ---- 4 (SPLIT_D = 1). dV += P^T dO, dK += dS^T Q for this chunk's queries, A
                 * straight from registers. B: rows (queries, = k) of slice 2qc + kk2, column
                 * pair jd2 (n-tiles 2jd2, 2jd2 + 1), transposed by ldmatrix. */
                if (Cfg::SPLIT_D == 1) {
#pragma unroll
                    for (int kk2 = 0; kk2 < NT / 2; ++kk2) {
#pragma unroll
                        for (int jd2 = 0; jd2 < WARP_COLS / 16; ++jd2) {
                            const uint32_t addr = qt_pair(stage_off, jd2) +
                                                  (qc * (CHUNK_Q / 16) + kk2) * ROWS16;
                            if (col0 + 16 * jd2 < prm.head_dim_v) {
                                uint32_t bo[4];
                                ldmatrix_x4_trans(bo, addr + (Cfg::OFF_DO - Cfg::OFF_Q));
                                Elem::mma(dv_acc[2 * jd2], p_frag[kk2], bo);
                                Elem::mma(dv_acc[2 * jd2 + 1], p_frag[kk2], bo + 2);
                            }
                            if (col0 + 16 * jd2 < prm.head_dim) {
                                uint32_t bq[4];
                                ldmatrix_x4_trans(bq, addr);
                                Elem::mma(dk_acc[2 * jd2], ds_frag[kk2], bq);
                                Elem::mma(dk_acc[2 * jd2 + 1], ds_frag[kk2], bq + 2);
                            }
                        }
                    }
                }
            }

            /* Barrier B: dS^T (and P^T) of the whole block are in shared memory. */
            __syncthreads();

            /* ---- 4 (SPLIT_D > 1). The same from shared memory: this warp needs the queries its
             * partner warps computed. (A real loop over the k16 slices: unrolled, the loads hoisted
             * across slices spill next to the 128 accumulator registers.) */
            if (Cfg::SPLIT_D > 1) {
#pragma unroll 1
                for (int kk2 = 0; kk2 < BLOCK_Q / 16; ++kk2) {
                    uint32_t pa[4], dsa[4];
                    ldmatrix_x4(dsa, fa_bwd_pair_step(s_lane, kk2));
                    ldmatrix_x4(pa, fa_bwd_pair_step(s_lane, kk2) + (Cfg::OFF_P - Cfg::OFF_DS));
#pragma unroll
                    for (int jd2 = 0; jd2 < WARP_COLS / 16; ++jd2) {
                        const uint32_t addr = qt_pair(stage_off, jd2) + kk2 * ROWS16;
                        if (col0 + 16 * jd2 < prm.head_dim_v) {
                            uint32_t bo[4];
                            ldmatrix_x4_trans(bo, addr + (Cfg::OFF_DO - Cfg::OFF_Q));
                            Elem::mma(dv_acc[2 * jd2], pa, bo);
                            Elem::mma(dv_acc[2 * jd2 + 1], pa, bo + 2);
                        }
                        if (col0 + 16 * jd2 < prm.head_dim) {
                            uint32_t bq[4];
                            ldmatrix_x4_trans(bq, addr);
                            Elem::mma(dk_acc[2 * jd2], dsa, bq);
                            Elem::mma(dk_acc[2 * jd2 + 1], dsa, bq + 2);
                        }
                    }
                }
            }

            /* Barrier C (one stage): every warp is done with this block's Q and dO (step 5
             * reads dS^T and K only), so the next block's load overlaps step 5. */
            if (Cfg::STAGES == 1) {
                __syncthreads();
                if (it + 1 < n_iter) {
                    prefetch(it + 1, 0);
                    cp_async_commit_group();
                }
            }

            /* ---- 5. dQ_accum[queries m0 + dq_row0.., columns] += dS K, in passes of
             * DQ_PASS_COLS columns (a real loop: one pass's accumulators live at a time).
             * A = dS (ldmatrix.trans of dS^T), B = K (trans). */
#pragma unroll 1
            for (int pass = 0; pass < Cfg::DQ_WARP_COLS / Cfg::DQ_PASS_COLS; ++pass) {
                const int c0 = dq_col0 + pass * Cfg::DQ_PASS_COLS;
                if (c0 >= prm.head_dim) continue;
                float dq_acc[Cfg::DQ_PASS_COLS / 8][4];
#pragma unroll
                for (int j = 0; j < Cfg::DQ_PASS_COLS / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dq_acc[j][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < BLOCK_K / 16; ++kk) {
                    if (16 * kk >= keys_valid) break;
                    uint32_t a[4];
                    ldmatrix_x4_trans(a, dst_lane + kk * S_ROWS16);
#pragma unroll
                    for (int jn2 = 0; jn2 < Cfg::DQ_PASS_COLS / 16; ++jn2) {
                        if (c0 + 16 * jn2 < prm.head_dim) {
                            uint32_t bk[4];
                            ldmatrix_x4_trans(bk, kt_pair(pass * Cfg::DQ_PASS_COLS / 16 + jn2) +
                                                      kk * ROWS16);
                            Elem::mma(dq_acc[2 * jn2], a, bk);
                            Elem::mma(dq_acc[2 * jn2 + 1], a, bk + 2);
                        }
                    }
                }
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int qrow = m0 + dq_row0 + g + 8 * half;
                    if (qrow >= len_q) continue;
                    float *dst = dq_accum + (q_packed + qrow) * dq_row_elems + (int64_t)h * prm.head_dim;
#pragma unroll
                    for (int j = 0; j < Cfg::DQ_PASS_COLS / 8; ++j) {
                        const int col = c0 + 8 * j + 2 * t;
                        if (col < prm.head_dim)
                            fa_bwd_atomic_add2(dst + col, dq_acc[j][2 * half], dq_acc[j][2 * half + 1]);
                    }
                }
            }
        }

        /* ---- epilogue: dK·scale and dV for keys n0 + key_row0 + g (+8), columns col0 + 8j + 2t.
         * Zero when no query sees the block. */
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int key = n0 + key_row0 + g + 8 * half;
            if (key >= len_k) continue;
            if (prm.group_splits == 1) {
                uint16_t *dk_row = static_cast<uint16_t *>(prm.dk) +
                                   fa_bwd_row_offset(varlen, b, seq.k_start, key, hk, prm.dk_batch_stride,
                                                     prm.dk_row_stride, prm.dk_head_stride);
                uint16_t *dv_row = static_cast<uint16_t *>(prm.dv) +
                                   fa_bwd_row_offset(varlen, b, seq.k_start, key, hk, prm.dv_batch_stride,
                                                     prm.dv_row_stride, prm.dv_head_stride);
#pragma unroll
                for (int j = 0; j < WARP_COLS / 8; ++j) {
                    const int col = col0 + 8 * j + 2 * t;
                    if (col < prm.head_dim)
                        *reinterpret_cast<uint32_t *>(dk_row + col) =
                            Elem::pack2(dk_acc[j][2 * half] * prm.softmax_scale,
                                        dk_acc[j][2 * half + 1] * prm.softmax_scale);
                    if (col < prm.head_dim_v)
                        *reinterpret_cast<uint32_t *>(dv_row + col) =
                            Elem::pack2(dv_acc[j][2 * half], dv_acc[j][2 * half + 1]);
                }
            } else {
                const int64_t row = ((int64_t)gsplit * prm.total_k + k_packed + key) * prm.heads_kv + hk;
                float *dk_row = prm.dk_partial + row * prm.head_dim;
                float *dv_row = prm.dv_partial + row * prm.head_dim_v;
#pragma unroll
                for (int j = 0; j < WARP_COLS / 8; ++j) {
                    const int col = col0 + 8 * j + 2 * t;
                    if (col < prm.head_dim)
                        *reinterpret_cast<float2 *>(dk_row + col) =
                            make_float2(dk_acc[j][2 * half], dk_acc[j][2 * half + 1]);
                    if (col < prm.head_dim_v)
                        *reinterpret_cast<float2 *>(dv_row + col) =
                            make_float2(dv_acc[j][2 * half], dv_acc[j][2 * half + 1]);
                }
            }
        }
    }
}

/* Launch the main kernel on `grid` blocks (opting in to its shared memory first). */
template <class Elem, int BUCKET, bool DROPOUT = false, bool MODS = false>
static fa_status fa_bwd_launch_main(const fa_bwd_params *prm, int grid, cudaStream_t stream,
                                    const fa_dropout_params *dropout = nullptr,
                                    const fa_mods_params *mods = nullptr) {
    using Cfg = fa_bwd_config<BUCKET>;
    auto kernel = fa_bwd_main_kernel<Elem, BUCKET, DROPOUT, MODS>;
    fa_mods_arg<MODS> mods_arg{};
    if constexpr (MODS) static_cast<fa_mods_params &>(mods_arg) = *mods;
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Cfg::SMEM),
                  "cudaFuncSetAttribute(backward main kernel, shared memory)");
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(*prm, dropout != nullptr ? *dropout : fa_dropout_params{},
                                                      mods_arg);
    FA_CUDA_CHECK_LAUNCH("backward main kernel launch");
    return FA_OK;
}

#endif /* FA_BWD_KERNEL_CUH */
