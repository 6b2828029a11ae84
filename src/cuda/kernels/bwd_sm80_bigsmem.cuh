/*
 * bwd_sm80_bigsmem.cuh: the CUDA backward main kernel v2 (FlashAttention-2 scheme, mma.sync
 * m16n8k16), 1.2-1.5x the v1 kernel on an H200 (docs/tuning-log.md). Its shared memory (173-217 KiB) fits
 * sm_90 only: below that bwd.cu keeps the v1 kernel (bwd_sm80.cuh).
 * Same contract as bwd_sm80.cuh (fa_bwd_params, workspace, grid, every feature);
 * different warp tiles, shared-memory layout and loop structure:
 *
 * One block owns BLOCK_K keys of one (batch, kv head) (bwd_bigsmem_tiles.h); K, V stay in shared
 * memory and the dK or dV accumulator in registers while it walks the query blocks (BLOCK_Q rows)
 * of every query head it handles. Per query block, three phases, two barriers:
 *   A  (barrier: this stage's Q, dO, LSE, D landed; every warp is done with the previous block)
 *   1. per warp tile of 32 keys × TILE_Q queries (8 tiles, or 16 at d = 64: two per warp):
 *        S^T = K Q^T (fp32 registers) -> P^T = 2^(S^T·scale_log2 - LSE_log2) -> shared memory
 *        [key][query] (16-bit); w = P^T [· (1 - tanh²)] stays in registers
 *        dP^T = V dO^T (fp32 registers) -> dS^T = w ∘ (dP^T - D) -> shared memory
 *   B  (barrier: P^T, dS^T of the block are complete)
 *   3. dQ_accum += dS K: warp tiles of 32 queries × 32 columns (A = dS by ldmatrix.trans of
 *      dS^T), fp32 atomics (or one buffer per block: deterministic)
 *   2. warps 0-3: dV += P^T dO, warps 4-7: dK += dS^T Q, each on 64 keys × (64 or 32) columns,
 *      A and B from shared memory (dQ runs first so its reductions drain under these MMAs)
 * At the end dK·scale and dV are stored (fp32 partials when the GQA group is split).
 * DROPOUT (a separate instantiation): phase 1 stores keep∘P^T (dV takes Z∘P^T, Z = keep /
 * (1 - p): its 1 / (1 - p) is applied once, in the epilogue) and keeps the tile's keep bits
 * (common/dropout.cuh, one Philox call per lane per pair of m16n8 tiles, 32 bits per warp tile) for
 * dS^T = w ∘ (Z∘dP^T - D).
 *
 * Why (docs/tuning-log.md, CUDA backward v2): v1 kept P^T/dS^T in registers with 16-key warp tiles, which
 * costs 800 KB of ldmatrix per 128 × 64 tile at d = 128 and, with its per-k-step head-dim
 * branches and one reused fragment register set, issued every ldmatrix right before its MMAs.
 * Here: 32 × 32 tiles for S^T/dP^T and dQ, 64 × 64 for dV/dK (512 KB per 128 × 64 tile), no
 * branch inside any MMA loop (head-dim padding columns are zero-filled, so their products are
 * exact zeros and never stored), and padded rows, so every fragment address is a base register
 * plus an immediate.
 *
 * Fragment layouts (mma m16n8k16, lane = 4g + t, PTX "Matrix Fragments for mma.m16n8k16"):
 *   A (16×16): a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
 *   B (16×8):  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
 *   C (16×8):  c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1]
 * ldmatrix.x4: lanes 8i..8i+7 address the 8 rows of 8×8 matrix i, register r[i] receives it.
 * Two per-lane patterns cover every operand here:
 *   P1: row (lane & 15), column 8·(lane >> 4):
 *       non-trans on X[m][k] -> A fragment of X (matrices: rows +8·(i&1), k +8·(i>>1));
 *       .trans on Z[k][n]    -> B fragments of n-tiles 0 (r0, r1) and 1 (r2, r3) of Z.
 *   P2: row (lane & 7) + 8·(lane >> 4), column 8·((lane >> 3) & 1):
 *       non-trans on Y[n][k] -> B fragments of n-tiles 0 (r0, r1) and 1 (r2, r3) of Y^T;
 *       .trans on W[k][m]    -> A fragment of W^T (matrices: k +8·(i>>1), m +8·(i&1)).
 */
#ifndef FA_BWD_SM80_BIGSMEM_CUH
#define FA_BWD_SM80_BIGSMEM_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/common/bwd_bigsmem_tiles.h"
#include "cuda/kernels/bwd_sm80.cuh" /* fa_bwd_params, fa_bwd_atomic_add2, fa_bwd_row_offset */

template <int BUCKET>
struct fa_bwd_bigsmem_config {
    static constexpr int D = BUCKET;                   /* padded head dim (d and dv)            */
    static constexpr int WARPS = 8;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int BLOCK_K = fa_bwd_bigsmem_block_k(BUCKET);
    static constexpr int BLOCK_Q = fa_bwd_bigsmem_block_q(BUCKET);
    /* phase 1: warp tiles of TILE_K keys × TILE_Q queries, TILES_K of them along the keys */
    static constexpr int TILE_K = 32;
    static constexpr int TILE_Q = BUCKET == 256 ? 16 : 32;
    static constexpr int TILES_K = BLOCK_K / TILE_K;
    static constexpr int TILES_PER_WARP = TILES_K * (BLOCK_Q / TILE_Q) / WARPS;
    /* phase 2: 4 warps per tensor, each DKV_K keys × DKV_C columns of dV or dK */
    static constexpr int DKV_K = 64;
    static constexpr int DKV_C = BUCKET == 64 ? 32 : 64;
    static constexpr int DKV_KGROUPS = BLOCK_K / DKV_K;
    /* phase 3: dQ warp tiles of DQ_Q queries × DQ_C columns, DQ_PASSES passes per warp */
    static constexpr int DQ_Q = 32;
    static constexpr int DQ_C = 32;
    static constexpr int DQ_QGROUPS = BLOCK_Q / DQ_Q;
    static constexpr int DQ_WARP_COLS = D / (WARPS / DQ_QGROUPS);
    static constexpr int DQ_PASSES = DQ_WARP_COLS / DQ_C;
    /* shared memory, in bytes; rows padded by 16 bytes */
    static constexpr uint32_t ROW_BYTES = 2u * (D + 8);       /* K, V, Q, dO rows              */
    static constexpr uint32_t S_ROW_BYTES = 2u * (BLOCK_Q + 8); /* P^T, dS^T rows (one per key) */
    static constexpr uint32_t KV_BYTES = ROW_BYTES * BLOCK_K;
    static constexpr uint32_t Q_BYTES = ROW_BYTES * BLOCK_Q;  /* one stage of Q (or dO)         */
    static constexpr uint32_t S_BYTES = S_ROW_BYTES * BLOCK_K;
    static constexpr uint32_t OFF_K = 0;
    static constexpr uint32_t OFF_V = OFF_K + KV_BYTES;
    static constexpr uint32_t OFF_Q = OFF_V + KV_BYTES;       /* [2 stages][BLOCK_Q][D + 8]     */
    static constexpr uint32_t OFF_DO = OFF_Q + 2 * Q_BYTES;   /* [2 stages][BLOCK_Q][D + 8]     */
    static constexpr uint32_t OFF_P = OFF_DO + 2 * Q_BYTES;   /* P^T  [BLOCK_K][BLOCK_Q + 8]    */
    static constexpr uint32_t OFF_DS = OFF_P + S_BYTES;       /* dS^T [BLOCK_K][BLOCK_Q + 8]    */
    static constexpr uint32_t OFF_LSE = OFF_DS + S_BYTES;     /* [2 stages][BLOCK_Q] fp32       */
    static constexpr uint32_t OFF_DSUM = OFF_LSE + 2 * 4 * BLOCK_Q;
    static constexpr uint32_t SMEM = OFF_DSUM + 2 * 4 * BLOCK_Q;

    static_assert(SMEM == fa_bwd_bigsmem_smem_bytes(BUCKET), "bwd_bigsmem_tiles.h and the kernel disagree");
    static_assert(TILES_PER_WARP >= 1 && TILES_K * (BLOCK_Q / TILE_Q) == WARPS * TILES_PER_WARP, "phase 1 tiles");
    static_assert(TILE_K == 32 && TILE_Q % 16 == 0, "phase 1: two m16 key tiles × pairs of n8 query tiles");
    static_assert(DKV_KGROUPS * (D / DKV_C) == WARPS / 2, "phase 2: 4 warps per tensor");
    static_assert(DQ_QGROUPS * (D / DQ_WARP_COLS) == WARPS && DQ_WARP_COLS % DQ_C == 0, "phase 3 tiles");
    static_assert(DKV_C % 16 == 0 && DQ_C % 16 == 0 && DQ_Q % 16 == 0, "ldmatrix.x4 covers n8 pairs");
    /* 8 consecutive padded rows must start in 8 different 16-byte bank groups (within 128 bytes) */
    static_assert((ROW_BYTES - 16) % 128 == 0 && (S_ROW_BYTES - 16) % 128 == 0, "padding");
    static_assert(2 * BLOCK_Q <= THREADS, "one thread per LSE/D element");
    static_assert(THREADS % (D / 8) == 0, "tile loads give each thread a fixed 16-byte column");
};

/* Copy a [ROWS, D] tile (rows of `row_stride` elements from gmem_row0) into a padded shared tile
 * with 16-byte cp.async, zero-filling rows >= valid_rows and columns >= valid_cols (a multiple
 * of 8). The 8 pad elements of each row are never read. */
template <int BUCKET, int ROWS>
__device__ __forceinline__ void fa_bwd_bigsmem_load_tile(uint32_t smem_tile, const uint16_t *gmem_row0,
                                                  int64_t row_stride, int valid_rows, int valid_cols) {
    using Cfg = fa_bwd_bigsmem_config<BUCKET>;
    constexpr int CHUNKS = Cfg::D / 8;
    constexpr int ROWS_PER_PASS = Cfg::THREADS / CHUNKS;
    static_assert(ROWS % ROWS_PER_PASS == 0, "whole passes");
    const int chunk = threadIdx.x % CHUNKS;
    const int row0 = threadIdx.x / CHUNKS;
    const bool chunk_ok = chunk * 8 < valid_cols;
    const uint32_t dst0 = smem_tile + (uint32_t)row0 * Cfg::ROW_BYTES + 16u * (uint32_t)chunk;
#pragma unroll
    for (int pass = 0; pass < ROWS / ROWS_PER_PASS; ++pass) {
        const int row = row0 + pass * ROWS_PER_PASS;
        const bool ok = chunk_ok && row < valid_rows;
        const uint16_t *src = gmem_row0 + (int64_t)row * row_stride + chunk * 8;
        cp_async_cg_16(dst0 + (uint32_t)(pass * ROWS_PER_PASS) * Cfg::ROW_BYTES,
                       ok ? (const void *)src : (const void *)gmem_row0, ok ? 16 : 0);
    }
}

/* acc[MT][NT] += A · B^T over KSTEPS k16 slices, both operands row-major [row][k] in padded
 * shared tiles: A (m-tile mi) at a_lane + mi·A_TILE_BYTES, B^T rows (n, pair nj of n8 tiles) at
 * b_lane + nj·B_PAIR_BYTES, both advancing 32 bytes per slice. a_lane uses pattern P1, b_lane P2. */
template <class Elem, int MT, int NT, int KSTEPS, uint32_t A_TILE_BYTES, uint32_t B_PAIR_BYTES>
__device__ __forceinline__ void fa_bwd_bigsmem_gemm_abt(float (&acc)[MT][NT][4], uint32_t a_lane, uint32_t b_lane) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        uint32_t a[MT][4], b[NT / 2][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_lane + mi * A_TILE_BYTES + 32 * kk);
#pragma unroll
        for (int nj = 0; nj < NT / 2; ++nj) ldmatrix_x4(b[nj], b_lane + nj * B_PAIR_BYTES + 32 * kk);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int nj = 0; nj < NT / 2; ++nj) {
                Elem::mma(acc[mi][2 * nj], a[mi], b[nj]);
                Elem::mma(acc[mi][2 * nj + 1], a[mi], b[nj] + 2);
            }
    }
}

/* P^T of one phase-1 warp tile (32 keys × 8·NT queries) from the S^T accumulator, in place, and
 * w = P·(1 - tanh²) (= P without softcap), the factor of dS = w ∘ (dP - D): after P^T has been
 * stored, only w crosses the dP^T GEMM (not S, P and the softcap derivative). Element e
 * of n-tile j in m-tile mi is key key0 + 16·mi + g + 8·(e >> 1), query column q_col0 + 8j + 2t +
 * (e & 1) of the block (LSE is indexed by that column; query0 + column is the query's row in the
 * sequence). MASKED adds the mask, TRANSFORM (needs MASKED) softcap and ALiBi; the plain path is
 * one FFMA + ex2 per element. */
template <int NT, bool MASKED, bool TRANSFORM>
__device__ __forceinline__ void fa_bwd_bigsmem_probs(const fa_bwd_params &prm, float (&s_acc)[2][NT][4],
                                              float (&w)[2][NT][4], const float *lse_smem, int q_col0,
                                              int key0, int query0, int shift, int len_q, int len_k, int left_limit,
                                              int right_limit, float alibi_log2, uint32_t keep) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int qcol = q_col0 + 8 * j + 2 * t; /* column of elements e = 0, 2 (+1: e = 1, 3) */
        const float2 lse2 = *reinterpret_cast<const float2 *>(lse_smem + qcol);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float lse = (e & 1) ? lse2.y : lse2.x;
                const float s = s_acc[mi][j][e];
                float p, dcap = 1.0f;
                if (!MASKED) {
                    p = ex2_approx_ftz_f32(fmaf(s, prm.scale_log2, -lse));
                } else {
                    const int key = key0 + 16 * mi + g + 8 * (e >> 1); /* in the sequence */
                    const int query = query0 + qcol + (e & 1);
                    const int diff = key - (query + shift); /* key minus the query's diagonal */
                    float x;
                    if (!TRANSFORM) {
                        x = fmaf(s, prm.scale_log2, -lse);
                    } else {
                        if (prm.softcap_pre != 0.0f) {
                            const float tc = fa_tanh(s * prm.softcap_pre);
                            x = prm.softcap_post_log2 * tc;
                            dcap = 1.0f - tc * tc;
                        } else {
                            x = s * prm.scale_log2;
                        }
                        x -= alibi_log2 * (float)abs(diff) + lse;
                    }
                    const bool visible = key < len_k && query < len_q && fa_window_holds(diff, left_limit, right_limit);
                    p = visible ? ex2_approx_ftz_f32(x) : 0.0f;
                }
                w[mi][j][e] = TRANSFORM ? p * dcap : p;
                /* dropout (keep != ~0u): P^T -> keep∘P^T for dV; bit 4·(NT·mi + j) + e */
                s_acc[mi][j][e] = (keep >> (4 * (NT * mi + j) + e)) & 1u ? p : 0.0f;
            }
    }
}

/* dS^T = w ∘ (dP^T - D) of one phase-1 warp tile, in place in dp_acc (w from fa_bwd_bigsmem_probs);
 * DROPOUT: w ∘ (Z∘dP^T - D) with Z = keep_scale or 0 by the keep bits (bit 4·(NT·mi + j) + e). */
template <int NT, bool DROPOUT>
__device__ __forceinline__ void fa_bwd_bigsmem_grads(float (&dp_acc)[2][NT][4], const float (&w)[2][NT][4],
                                              const float *dsum_smem, int q_col0, uint32_t keep, float keep_scale) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float2 dsum2 = *reinterpret_cast<const float2 *>(dsum_smem + q_col0 + 8 * j + 2 * t);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dp_acc[mi][j][e] =
                    w[mi][j][e] * ((DROPOUT ? dp_acc[mi][j][e] * ((keep >> (4 * (NT * mi + j) + e)) & 1u ? keep_scale : 0.0f)
                                            : dp_acc[mi][j][e]) -
                                   ((e & 1) ? dsum2.y : dsum2.x));
    }
}

template <class Elem, int BUCKET, bool DROPOUT>
__global__ void __launch_bounds__(fa_bwd_bigsmem_config<BUCKET>::THREADS, 1)
    fa_bwd_bigsmem_main_kernel(const fa_bwd_params prm, const fa_dropout_params dropout /* read iff DROPOUT */) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    /* Never launched below sm_90 (bwd.cu keeps the v1 kernel there: this one's shared memory
     * does not fit sm_80/86/89), so no code is generated for those targets. */
    __trap();
#else
    using Cfg = fa_bwd_bigsmem_config<BUCKET>;
    constexpr int D = Cfg::D, BLOCK_K = Cfg::BLOCK_K, BLOCK_Q = Cfg::BLOCK_Q;
    constexpr int TILE_K = Cfg::TILE_K, TILE_Q = Cfg::TILE_Q;
    constexpr int NT = TILE_Q / 8;                         /* phase 1: n8 query tiles per warp tile */
    constexpr uint32_t RB = Cfg::ROW_BYTES, SRB = Cfg::S_ROW_BYTES;
    constexpr int KV_MT = Cfg::DKV_K / 16, KV_NT = Cfg::DKV_C / 8;
    constexpr int DQ_MT = Cfg::DQ_Q / 16, DQ_NT = Cfg::DQ_C / 8;

    /* Shared memory (fa_bwd_bigsmem_config offsets): K, V [BLOCK_K][D+8] | Q, dO [2 stages][BLOCK_Q][D+8]
     * | P^T, dS^T [BLOCK_K][BLOCK_Q+8] | LSE_log2, D [2 stages][BLOCK_Q] fp32. */
    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t smem = smem_u32addr(smem_raw);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int p1_row = lane & 15, p1_col = 8 * (lane >> 4);                  /* pattern P1 */
    const int p2_row = (lane & 7) + 8 * (lane >> 4), p2_col = 8 * ((lane >> 3) & 1); /* P2 */

    /* Phase 2 roles: warps 0-3 own dV (A = P^T, B = dO), warps 4-7 own dK (A = dS^T, B = Q);
     * keys kv_key0.. (DKV_K), columns kv_col0.. (DKV_C). The accumulator `kv_acc` is this
     * warp's dV or dK tile. Lane bases: A by P1 on [key][query] (k = queries), B by P1 .trans on
     * [query][column] (k = queries). */
    const int kv_tensor = warp / 4; /* 0: dV, 1: dK */
    const int kv_key0 = (warp % 4) % Cfg::DKV_KGROUPS * Cfg::DKV_K;
    const int kv_col0 = (warp % 4) / Cfg::DKV_KGROUPS * Cfg::DKV_C;
    const uint32_t kv_a_lane = smem + (kv_tensor ? Cfg::OFF_DS : Cfg::OFF_P) + (uint32_t)(kv_key0 + p1_row) * SRB +
                               2u * (uint32_t)p1_col;
    const uint32_t kv_b_lane = smem + (kv_tensor ? Cfg::OFF_Q : Cfg::OFF_DO) + (uint32_t)p1_row * RB +
                               2u * (uint32_t)(kv_col0 + p1_col);
    /* Phase 3 roles: queries dq_row0.. (DQ_Q) of the block × columns dq_col0.. (DQ_WARP_COLS).
     * A = dS by P2 .trans on dS^T [key][query]; B = K by P1 .trans on K [key][column]. */
    const int dq_row0 = (warp % Cfg::DQ_QGROUPS) * Cfg::DQ_Q;
    const int dq_col0 = (warp / Cfg::DQ_QGROUPS) * Cfg::DQ_WARP_COLS;
    const uint32_t dq_a_lane = smem + Cfg::OFF_DS + (uint32_t)p2_row * SRB + 2u * (uint32_t)(dq_row0 + p2_col);
    const uint32_t dq_b_lane = smem + Cfg::OFF_K + (uint32_t)p1_row * RB + 2u * (uint32_t)(dq_col0 + p1_col);

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
    const fa_seq_rows seq = fa_sequence_rows(prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q, prm.total_k,
                                             prm.seqlen_q, prm.seqlen_k, b);
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int64_t q_packed = varlen ? seq.q_start : (int64_t)b * prm.seqlen_q;
    const int64_t k_packed = varlen ? seq.k_start : (int64_t)b * prm.seqlen_k;
    const int shift = len_k - len_q;
    const int left_limit = fa_window_limit(prm.window_left); /* per element: fa_window_holds */
    const int right_limit = fa_window_limit(prm.window_right);
    const bool transform = prm.softcap_pre != 0.0f || prm.alibi_slopes != nullptr;

    const int h_begin = hk * prm.group + gsplit * prm.heads_per_split;
    const int h_end = min(h_begin + prm.heads_per_split, (hk + 1) * prm.group);

    /* Row 0 of this sequence (query head 0) in q, dO and the dQ accumulator; row 0 of kv head hk
     * in k, v and in this warp's output (dK or dV, or their fp32 partials). Row `row`, head h of
     * q is q_seq + row·q_row_stride + h·q_head_stride (fa_bwd_row_offset), and so on. Few
     * registers stay live across the main loop for the epilogue this way. */
    const int64_t q_row0 = varlen ? seq.q_start : 0, k_row0 = varlen ? seq.k_start : 0;
    const uint16_t *q_seq = static_cast<const uint16_t *>(prm.q) +
                            fa_bwd_row_offset(varlen, b, q_row0, 0, 0, prm.q_batch_stride, prm.q_row_stride, 0);
    const uint16_t *do_seq = static_cast<const uint16_t *>(prm.dout) +
                             fa_bwd_row_offset(varlen, b, q_row0, 0, 0, prm.do_batch_stride, prm.do_row_stride, 0);
    const uint16_t *k_seq = static_cast<const uint16_t *>(prm.k) +
                            fa_bwd_row_offset(varlen, b, k_row0, 0, hk, prm.k_batch_stride, prm.k_row_stride,
                                              prm.k_head_stride);
    const uint16_t *v_seq = static_cast<const uint16_t *>(prm.v) +
                            fa_bwd_row_offset(varlen, b, k_row0, 0, hk, prm.v_batch_stride, prm.v_row_stride,
                                              prm.v_head_stride);
    float *dq_seq = prm.dq_accum + (int64_t)first_block * prm.dq_accum_split_elems +
                    q_packed * ((int64_t)prm.heads_q * prm.head_dim);
    uint16_t *kv_out = kv_tensor ? static_cast<uint16_t *>(prm.dk) +
                                       fa_bwd_row_offset(varlen, b, k_row0, 0, hk, prm.dk_batch_stride,
                                                         prm.dk_row_stride, prm.dk_head_stride)
                                 : static_cast<uint16_t *>(prm.dv) +
                                       fa_bwd_row_offset(varlen, b, k_row0, 0, hk, prm.dv_batch_stride,
                                                         prm.dv_row_stride, prm.dv_head_stride);
    float *kv_partial = nullptr;
    if (prm.group_splits > 1) {
        const int64_t prow0 = ((int64_t)gsplit * prm.total_k + k_packed) * prm.heads_kv + hk;
        kv_partial = kv_tensor ? prm.dk_partial + prow0 * prm.head_dim : prm.dv_partial + prow0 * prm.head_dim_v;
    }

    for (int n_block = first_block; n_block * BLOCK_K < len_k; n_block += prm.blocks_per_head) {
        const int n0 = n_block * BLOCK_K;
        const int keys_valid = min(BLOCK_K, len_k - n0);

        /* Query rows that see at least one key of [n0, n0 + keys_valid). */
        int64_t q_lo, q_hi;
        fa_query_range(n0, n0 + keys_valid, len_q, len_k, prm.window_left, prm.window_right, &q_lo, &q_hi);
        const int m_first = (int)(q_lo / BLOCK_Q);
        const int m_count = q_hi > q_lo ? (int)((q_hi + BLOCK_Q - 1) / BLOCK_Q) - m_first : 0;
        const int n_iter = m_count * (h_end - h_begin);

        float kv_acc[KV_MT][KV_NT][4];
#pragma unroll
        for (int mi = 0; mi < KV_MT; ++mi)
#pragma unroll
            for (int j = 0; j < KV_NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) kv_acc[mi][j][e] = 0.0f;

        /* Fetch Q, dO, LSE_log2 and D of query head h, rows m0.. into `stage`. */
        auto prefetch = [&](int h, int m0, int stage) {
            const int rows = min(BLOCK_Q, len_q - m0);
            fa_bwd_bigsmem_load_tile<BUCKET, BLOCK_Q>(smem + Cfg::OFF_Q + stage * Cfg::Q_BYTES,
                                               q_seq + (int64_t)m0 * prm.q_row_stride + (int64_t)h * prm.q_head_stride,
                                               prm.q_row_stride, rows, prm.head_dim);
            fa_bwd_bigsmem_load_tile<BUCKET, BLOCK_Q>(
                smem + Cfg::OFF_DO + stage * Cfg::Q_BYTES,
                do_seq + (int64_t)m0 * prm.do_row_stride + (int64_t)h * prm.do_head_stride, prm.do_row_stride, rows,
                prm.head_dim_v);
            if (threadIdx.x < 2 * BLOCK_Q) {
                const int r = threadIdx.x % BLOCK_Q;
                const bool is_lse = threadIdx.x < BLOCK_Q;
                const float *src = (is_lse ? prm.lse_log2 : prm.dsum) + (int64_t)h * prm.total_q + q_packed + m0;
                const uint32_t dst =
                    smem + (is_lse ? Cfg::OFF_LSE : Cfg::OFF_DSUM) + 4u * (uint32_t)(stage * BLOCK_Q + r);
                cp_async_ca_4(dst, r < rows ? (const void *)(src + r) : (const void *)src, r < rows ? 4 : 0);
            }
        };

        if (n_iter > 0) {
            /* The previous key block of this block (deterministic mode) is finished by every
             * warp before K and V are overwritten. */
            __syncthreads();
            fa_bwd_bigsmem_load_tile<BUCKET, BLOCK_K>(smem + Cfg::OFF_K, k_seq + (int64_t)n0 * prm.k_row_stride,
                                               prm.k_row_stride, keys_valid, prm.head_dim);
            fa_bwd_bigsmem_load_tile<BUCKET, BLOCK_K>(smem + Cfg::OFF_V, v_seq + (int64_t)n0 * prm.v_row_stride,
                                               prm.v_row_stride, keys_valid, prm.head_dim_v);
            prefetch(h_begin, m_first * BLOCK_Q, 0);
            cp_async_commit_group();
        }

        /* Iteration it handles query head h, rows m0..m0 + BLOCK_Q - 1 (heads outer, query blocks
         * inner; stepped without divisions). */
        int h = h_begin, m0 = m_first * BLOCK_Q;
#pragma unroll 1
        for (int it = 0; it < n_iter; ++it) {
            const int stage = it & 1;
            const uint32_t stage_off = stage * Cfg::Q_BYTES;
            const float *lse_smem = reinterpret_cast<const float *>(smem_raw + Cfg::OFF_LSE) + stage * BLOCK_Q;
            const float *dsum_smem = reinterpret_cast<const float *>(smem_raw + Cfg::OFF_DSUM) + stage * BLOCK_Q;

            /* Barrier A: this stage has landed for all threads; all warps are done with the
             * previous query block, so the other stage and the P^T, dS^T tiles may be overwritten. */
            cp_async_wait_all();
            __syncthreads();
            const int m_end = (m_first + m_count) * BLOCK_Q;
            const int h_next = m0 + BLOCK_Q < m_end ? h : h + 1;
            const int m0_next = m0 + BLOCK_Q < m_end ? m0 + BLOCK_Q : m_first * BLOCK_Q;
            if (it + 1 < n_iter) {
                prefetch(h_next, m0_next, stage ^ 1);
                cp_async_commit_group();
            }
            const float alibi_log2 =
                prm.alibi_slopes != nullptr ? prm.alibi_slopes[b * prm.alibi_batch_stride + h] * 1.4426950408889634f
                                            : 0.0f;

            /* ---- 1. S^T, dP^T -> P^T, dS^T, one warp tile at a time (a real loop at d = 64:
             * one tile's accumulators live at a time). */
#pragma unroll 1
            for (int ti = 0; ti < Cfg::TILES_PER_WARP; ++ti) {
                const int tile = warp + Cfg::WARPS * ti;
                const int key_t0 = (tile % Cfg::TILES_K) * TILE_K; /* in the block */
                const int q_t0 = (tile / Cfg::TILES_K) * TILE_Q;   /* in the block */
                const int ka = n0 + key_t0, qa = m0 + q_t0;        /* in the sequence */
                /* dead: no (query, key) of the tile is visible (P^T = dS^T = 0, no MMA);
                 * inside: all are, and no score transform (the plain path). Both conservative:
                 * a tile that is neither takes the masked path, which is exact everywhere. */
                /* fa_tile_none_visible / fa_tile_all_visible (fa_internal.h) spelled out with the
                 * block's int32 sizes: the int64 calls cost this register-bound kernel a spill. */
                const bool dead =
                    qa >= len_q || ka >= len_k ||
                    (prm.window_right >= 0 && (int64_t)qa + TILE_Q - 1 + shift + prm.window_right < ka) ||
                    (prm.window_left >= 0 && (int64_t)qa + shift - prm.window_left > (int64_t)ka + TILE_K - 1);
                const bool inside =
                    !transform && qa + TILE_Q <= len_q && ka + TILE_K <= len_k &&
                    (prm.window_left < 0 || (int64_t)qa + TILE_Q - 1 + shift - prm.window_left <= ka) &&
                    (prm.window_right < 0 || (int64_t)qa + shift + prm.window_right >= (int64_t)ka + TILE_K - 1);

                /* P^T, dS^T go to shared memory [key][query]: rows g, g + 8 of m-tile mi, n-tile j
                 * are the 4-byte pairs at column q_t0 + 8j + 2t. (Rows 144 or 272 bytes apart:
                 * the 32 lanes hit 32 different banks.) */
                const uint32_t st_lane =
                    smem + Cfg::OFF_P + (uint32_t)(key_t0 + g) * SRB + 2u * (uint32_t)(q_t0 + 2 * t);
                /* A = K (V) rows (keys, P1), B = Q^T (dO^T) from Q (dO) rows (queries, P2). */
                const uint32_t k_lane = smem + Cfg::OFF_K + (uint32_t)(key_t0 + p1_row) * RB + 2u * (uint32_t)p1_col;
                const uint32_t q_lane =
                    smem + Cfg::OFF_Q + stage_off + (uint32_t)(q_t0 + p2_row) * RB + 2u * (uint32_t)p2_col;

                float acc[2][NT][4]; /* S^T, then P^T; then dP^T, then dS^T */
                float w[2][NT][4];   /* P·(1 - tanh²) */
                /* dropout keep bits of the tile (bit 4·(NT·mi + j) + e), all ones without */
                static_assert(!DROPOUT || 2 * NT * 4 <= 32, "one word of keep bits per warp tile");
                uint32_t keep = ~0u;
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[mi][j][e] = 0.0f;
                if (dead) {
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                        for (int j = 0; j < NT; ++j)
#pragma unroll
                            for (int e = 0; e < 4; ++e) w[mi][j][e] = 0.0f;
                } else {
                    fa_bwd_bigsmem_gemm_abt<Elem, 2, NT, D / 16, 16 * RB, 16 * RB>(acc, k_lane, q_lane); /* S^T = K Q^T */
                    if (DROPOUT) {
                        keep = 0;
                        if constexpr (NT == 2) { /* both m16 key tiles × both n8 query tiles: one call */
                            keep = fa_dropout_keep_kq4(dropout, b, h, prm.heads_q, ka, qa, 16, 0);
                        } else {
#pragma unroll 1 /* one Philox call in flight (unrolled, ptxas interleaves them and spills) */
                            for (int mi = 0; mi < 2; ++mi)
#pragma unroll 1
                                for (int j = 0; j < NT; j += 4) /* four n8 tiles: one call per lane */
                                    keep |= fa_dropout_keep_kq4(dropout, b, h, prm.heads_q, ka + 16 * mi, qa + 8 * j)
                                            << (4 * (NT * mi + j));
                        }
                    }
                    if (inside)
                        fa_bwd_bigsmem_probs<NT, false, false>(prm, acc, w, lse_smem, q_t0, 0, 0, 0, 0, 0, 0, 0, 0.0f,
                                                               keep);
                    else if (!transform)
                        fa_bwd_bigsmem_probs<NT, true, false>(prm, acc, w, lse_smem, q_t0, ka, m0, shift, len_q, len_k,
                                                       left_limit, right_limit, 0.0f, keep);
                    else
                        fa_bwd_bigsmem_probs<NT, true, true>(prm, acc, w, lse_smem, q_t0, ka, m0, shift, len_q, len_k,
                                                      left_limit, right_limit, alibi_log2, keep);
                }
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int half = 0; half < 2; ++half)
                            st_shared_b32(st_lane + (uint32_t)(16 * mi + 8 * half) * SRB + 16u * (uint32_t)j,
                                          Elem::pack2(acc[mi][j][2 * half], acc[mi][j][2 * half + 1]));

#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[mi][j][e] = 0.0f;
                if (!dead) /* dP^T = V dO^T */
                    fa_bwd_bigsmem_gemm_abt<Elem, 2, NT, D / 16, 16 * RB, 16 * RB>(acc, k_lane + (Cfg::OFF_V - Cfg::OFF_K),
                                                                           q_lane + (Cfg::OFF_DO - Cfg::OFF_Q));
                fa_bwd_bigsmem_grads<NT, DROPOUT>(acc, w, dsum_smem, q_t0, keep, dropout.keep_scale);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int half = 0; half < 2; ++half)
                            st_shared_b32(st_lane + (Cfg::OFF_DS - Cfg::OFF_P) + (uint32_t)(16 * mi + 8 * half) * SRB +
                                              16u * (uint32_t)j,
                                          Elem::pack2(acc[mi][j][2 * half], acc[mi][j][2 * half + 1]));
            }

            /* Barrier B: P^T and dS^T of the whole block are in shared memory. */
            __syncthreads();

            /* ---- 3. dQ_accum[queries m0 + dq_row0.., columns] += dS K, in passes of DQ_C
             * columns (a real loop: one pass's accumulators live at a time). Columns past
             * head_dim are zero products and are not added. */
#pragma unroll 1
            for (int pass = 0; pass < Cfg::DQ_PASSES; ++pass) {
                const int c0 = dq_col0 + pass * Cfg::DQ_C;
                if (c0 >= prm.head_dim) break;
                float dq_acc[DQ_MT][DQ_NT][4];
#pragma unroll
                for (int mi = 0; mi < DQ_MT; ++mi)
#pragma unroll
                    for (int j = 0; j < DQ_NT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) dq_acc[mi][j][e] = 0.0f;
                const uint32_t b_lane = dq_b_lane + 2u * (uint32_t)(pass * Cfg::DQ_C);
#pragma unroll
                for (int kk = 0; kk < BLOCK_K / 16; ++kk) {
                    uint32_t a[DQ_MT][4], bk[DQ_NT / 2][4];
#pragma unroll
                    for (int mi = 0; mi < DQ_MT; ++mi) ldmatrix_x4_trans(a[mi], dq_a_lane + kk * 16 * SRB + 32 * mi);
#pragma unroll
                    for (int nj = 0; nj < DQ_NT / 2; ++nj) ldmatrix_x4_trans(bk[nj], b_lane + kk * 16 * RB + 32 * nj);
#pragma unroll
                    for (int mi = 0; mi < DQ_MT; ++mi)
#pragma unroll
                        for (int nj = 0; nj < DQ_NT / 2; ++nj) {
                            Elem::mma(dq_acc[mi][2 * nj], a[mi], bk[nj]);
                            Elem::mma(dq_acc[mi][2 * nj + 1], a[mi], bk[nj] + 2);
                        }
                }
#pragma unroll
                for (int mi = 0; mi < DQ_MT; ++mi)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int qrow = m0 + dq_row0 + 16 * mi + g + 8 * half;
                        if (qrow >= len_q) continue;
                        float *dst = dq_seq + ((int64_t)qrow * prm.heads_q + h) * prm.head_dim;
#pragma unroll
                        for (int j = 0; j < DQ_NT; ++j) {
                            const int col = c0 + 8 * j + 2 * t;
                            if (col < prm.head_dim)
                                fa_bwd_atomic_add2(dst + col, dq_acc[mi][j][2 * half], dq_acc[mi][j][2 * half + 1]);
                        }
                    }
            }

            /* ---- 2. dV += P^T dO (warps 0-3) or dK += dS^T Q (warps 4-7) over the block's
             * queries: k16 slice qs = queries 16qs..16qs+15. */
#pragma unroll
            for (int qs = 0; qs < BLOCK_Q / 16; ++qs) {
                uint32_t a[KV_MT][4], bo[KV_NT / 2][4];
#pragma unroll
                for (int mi = 0; mi < KV_MT; ++mi) ldmatrix_x4(a[mi], kv_a_lane + mi * 16 * SRB + 32 * qs);
#pragma unroll
                for (int nj = 0; nj < KV_NT / 2; ++nj)
                    ldmatrix_x4_trans(bo[nj], kv_b_lane + stage_off + qs * 16 * RB + 32 * nj);
#pragma unroll
                for (int mi = 0; mi < KV_MT; ++mi)
#pragma unroll
                    for (int nj = 0; nj < KV_NT / 2; ++nj) {
                        Elem::mma(kv_acc[mi][2 * nj], a[mi], bo[nj]);
                        Elem::mma(kv_acc[mi][2 * nj + 1], a[mi], bo[nj] + 2);
                    }
            }
            h = h_next;
            m0 = m0_next;
        }

        /* ---- epilogue: this warp's dK·scale or dV tile, keys n0 + kv_key0 + 16mi + g (+8),
         * columns kv_col0 + 8j + 2t. Zero when no query sees the block. */
        const int valid_cols = kv_tensor ? prm.head_dim : prm.head_dim_v;
        if (DROPOUT && kv_tensor == 0) /* dV = Σ (keep∘P)^T dO / (1 - p) */
#pragma unroll
            for (int mi = 0; mi < KV_MT; ++mi)
#pragma unroll
                for (int j = 0; j < KV_NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) kv_acc[mi][j][e] *= dropout.keep_scale;
#pragma unroll
        for (int mi = 0; mi < KV_MT; ++mi)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int key = n0 + kv_key0 + 16 * mi + g + 8 * half;
                if (key >= len_k) continue;
                if (kv_partial == nullptr) {
                    uint16_t *row = kv_out + (int64_t)key * (kv_tensor ? prm.dk_row_stride : prm.dv_row_stride);
                    const float mul = kv_tensor ? prm.softmax_scale : 1.0f;
#pragma unroll
                    for (int j = 0; j < KV_NT; ++j) {
                        const int col = kv_col0 + 8 * j + 2 * t;
                        if (col < valid_cols)
                            *reinterpret_cast<uint32_t *>(row + col) =
                                Elem::pack2(kv_acc[mi][j][2 * half] * mul, kv_acc[mi][j][2 * half + 1] * mul);
                    }
                } else {
                    float *row = kv_partial + (int64_t)key * prm.heads_kv * valid_cols;
#pragma unroll
                    for (int j = 0; j < KV_NT; ++j) {
                        const int col = kv_col0 + 8 * j + 2 * t;
                        if (col < valid_cols)
                            *reinterpret_cast<float2 *>(row + col) =
                                make_float2(kv_acc[mi][j][2 * half], kv_acc[mi][j][2 * half + 1]);
                    }
                }
            }
    }
#endif
}

/* Launch the bigsmem main kernel on `grid` blocks (opting in to its shared memory first). */
template <class Elem, int BUCKET, bool DROPOUT = false>
static fa_status fa_bwd_bigsmem_launch_main(const fa_bwd_params *prm, int grid, cudaStream_t stream,
                                            const fa_dropout_params *dropout = nullptr) {
    using Cfg = fa_bwd_bigsmem_config<BUCKET>;
    auto kernel = fa_bwd_bigsmem_main_kernel<Elem, BUCKET, DROPOUT>;
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Cfg::SMEM),
                  "cudaFuncSetAttribute(backward bigsmem main kernel, shared memory)");
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(*prm, dropout != nullptr ? *dropout : fa_dropout_params{});
    FA_CUDA_CHECK_LAUNCH("backward bigsmem main kernel launch");
    return FA_OK;
}

#endif /* FA_BWD_SM80_BIGSMEM_CUH */
