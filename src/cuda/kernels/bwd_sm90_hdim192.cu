/*
 * bwd_sm90_hdim192.cu: the Hopper (sm_90a) backward main kernel for MLA's training shape, d <= 192
 * with dv <= 128 (d in 136..192: the bucket-256 problems with those extents), on the plain score
 * path, deterministic mode included: no softcap, ALiBi, negative scale or dropout (those run
 * bwd_sm90_hdim256.cu, d and dv padded to 256, as does everything with FA_HOPPER_BWD_192=0, for
 * timing). FlashAttention-3/4's tile for this
 * shape (64 queries × 96 keys, S not transposed, dK and dV accumulated transposed) in our own
 * code; what it shares with the other Hopper backward kernels (the producer, the walk over query
 * blocks and heads, the varlen zeroing, the dQ writer and its tiled accumulator, the dK / dV
 * output) is bwd_sm90_common.cuh's, described there.
 *
 * Why another kernel: the bucket-256 kernel at 192 / 128 extents runs 64 keys per CTA, so every
 * 64 × 64 block of scores costs a [64, 192] fp32 dQ reduce-add and a Q / dO load; 96 keys per CTA
 * cut both by a third per score. 96 keys cannot be the wgmma M of two consumers (64 each), so the
 * scores are not transposed: each consumer computes S and dP for all 64 queries and its 48 keys
 * (N = 48), and dK, dV are accumulated as dKᵀ [192, 48] and dVᵀ [128, 48] (M = the head dim),
 * 72 + 48 fp32 registers per thread over all iterations.
 *
 * One CTA = BLOCK_N = 96 keys [n0, n0 + 96) of one (kv head, batch); grid (key blocks, heads_kv,
 * batch); 384 threads:
 *   warpgroup 0, producer (setmaxnreg 24), warp 0: fa_bwd_sm90_load: K [96, 192] and V [96, 128]
 *     once (kv_full), then per iteration t Q [64, 192] and dO [64, 128] into stage t % 2 with the
 *     rows' LSE2 and D (stage_full / stage_empty); warp 1: fa_bwd_sm90_dq_writer, both consumers'
 *     dQ pieces of each iteration into the tiled accumulator (one 1-D bulk reduce-add each; in
 *     deterministic mode warps 1 and 2 take alternate iterations); the other warps exit;
 *   warpgroups 1 and 2, consumers (setmaxnreg 240): consumer c owns keys n0 + 48c .. + 47 (S, dP,
 *     dKᵀ, dVᵀ of those keys) and dQ columns 96c .. 96c + 95 of every query block.
 *
 * GEMMs (M = 64 per warpgroup; 128-byte swizzled slabs of 64 columns):
 *   S_c   = Q K_cᵀ      SS  A = the Q stage K-major, B = K rows 48c.. K-major       N = 48, 12 k16 steps
 *   dP_c  = dO V_cᵀ     SS  A = the dO stage, B = V rows 48c..                     N = 48, 8 k16 steps
 *   dVᵀ_c += dOᵀ P_c    SS  A = dO slab i read MN-major (trans-a: A's rows are dv columns 64i..,
 *                           its K the queries, +2048 B per 16 rows), B = the P tile's rows 48c..
 *                           K-major (+32 B per 16 queries)                               N = 48, i = 0, 1
 *   dKᵀ_c += Qᵀ dS_c    SS  the same with Q slab i and the dS tile                     N = 48, i = 0, 1, 2
 *   dQ_c  = dS K[:, c]  SS  A = the dS tile read MN-major (trans-a: rows = the 64 queries, K = the
 *                           96 keys), B = K read MN-major (trans-b) at columns 96c .. 96c + 95,
 *                           6 k16 steps as two GEMMs: consumer 0 slab 0 (N = 64) and the first
 *                           half of slab 1 (N = 32), consumer 1 the second half of slab 1 (N = 32,
 *                           its descriptor starting 64 bytes into the 128-byte rows: the swizzle
 *                           acts on the address, so a start inside a row reads as the K-major
 *                           steps of +32 B do) and slab 2 (N = 64).
 * P and dS leave the registers transposed: stmatrix.trans puts each 8 × 8 block of the S / dP
 * accumulator (rows queries, columns keys) as 8 key rows of 8 queries into the tile [96 keys][64
 * queries] (128-byte rows, 16-byte chunk q/8 ^ (key & 7): the 8 rows of a block in 8 chunks, no
 * bank conflict), the layout all three GEMMs that read them want.
 *
 * One consumer iteration t (stage s = t % 2, dS buffer t % 2):
 *   wait stage_full[s] (varlen: Q / dO rows past the sequence zeroed, named barrier Q_TAIL);
 *   issue S_c and dP_c; wait for S_c: mask (fa_hopper_mask), P = 2^(S·scale·log2e - LSE2[row]);
 *   pack, stmatrix.trans into the P tile; fence.proxy.async; named barrier P_READY + c (this
 *   consumer's four warps' rows are in: the GEMM reads them all); issue dVᵀ_c; wait for dP_c:
 *   dS = P∘(dP - D[row]); pack, stmatrix.trans into dS buffer t % 2; fence.proxy.async; named
 *   barrier DS_FULL (256 threads: dQ reads both consumers' keys); issue dQ_c, then dKᵀ_c; wait for
 *   all but dKᵀ_c; named barrier DQ_EMPTY + c (the writer has read the previous piece); store dQ_c
 *   [64, 96] in register order into the staging (12 16-byte stores per thread); wait for dKᵀ_c;
 *   arrive on stage_empty[s]. The staged piece's fence.proxy.async and arrival on DQ_FULL + c follow
 *   the next iteration's S and dP issue (after the loop for the last).
 * The P tile has one buffer: only consumer c's dV reads its rows, and consumer c retires it before
 * it stores the next P. The dS tile has two: consumer c writes buffer t % 2 only after passing
 * DS_FULL of iteration t - 1, which the other consumer reaches only after it waited for all its
 * GEMMs of iteration t - 2, the last that read buffer t % 2.
 *
 * Epilogue: after both consumers' last GEMMs (named barrier EPILOGUE), dKᵀ (scaled) and dVᵀ go
 * transposed (stmatrix.trans, the P store's addressing) into dK and dV tiles [96 keys][64
 * columns] in the freed Q / dO stages, and fa_bwd_sm90_dkdv_out writes consumer c's 48 rows (TMA
 * box {64, 48}, or coalesced copies).
 *
 * Shared memory (1024-byte aligned): K [3][96][64] | V [2][96][64] | Q [2][3][64][64] |
 * dO [2][2][64][64] | P [96][64] | dS [2][96][64] | dQ staging [2 consumers][12][128 threads][4]
 * fp32 | LSE2 [2][64] fp32 | D [2][64] fp32 | mbarriers: 231,464 bytes with the alignment slack.
 * mbarriers: kv_full (1 arrival + the K and V bytes); stage_full[s] (33: the producer's
 * arrive.expect_tx, then every lane of warp 0 after its LSE2 / D stores); stage_empty[s] (256:
 * every consumer thread after its last read of the stage).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels/bwd_sm90_common.cuh"
#include "cuda/common/bwd_launch.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/tma.h"

/* ---- configuration --------------------------------------------------------------------------- */

struct fa_bwd_sm90_d192_config {
    static constexpr int DQK = 192, DV = 128; /* the extents: columns past d or dv are zeros */
    static constexpr int BLOCK_M = 64;        /* queries per iteration                        */
    static constexpr int BLOCK_N = 96;        /* keys per CTA                                 */
    static constexpr int STAGES = 2, DO_STAGES = 2; /* Q and dO share each stage and its barriers */
    static constexpr int CONSUMER_WGS = 2;
    static constexpr int KEYS = BLOCK_N / CONSUMER_WGS;   /* keys per consumer: the N of S and dP */
    static constexpr int DQ_COLS = DQK / CONSUMER_WGS;    /* dQ columns per consumer           */
    static constexpr int THREADS = 128 * (1 + CONSUMER_WGS);
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
    static constexpr int SLABS = DQK / 64;  /* K and Q */
    static constexpr int V_SLABS = DV / 64; /* V and dO */
    static constexpr uint32_t KV_SLAB_BYTES = BLOCK_N * 128;
    static constexpr uint32_t KV_BYTES = KV_SLAB_BYTES * SLABS;
    static constexpr uint32_t Q_SLAB_BYTES = BLOCK_M * 128;
    static constexpr uint32_t Q_BYTES = Q_SLAB_BYTES * SLABS;
    static constexpr uint32_t DO_BYTES = Q_SLAB_BYTES * V_SLABS;
    static constexpr uint32_t TILE_BYTES = BLOCK_N * 128; /* P or dS [96 keys][64 queries] */
    /* dQ staging: per consumer its fp32 piece [64 queries, 96 columns] in the accumulator tile's
     * register order (sm90_tiles.h, fa_hopper_bwd_dq_tile_cols): store j of thread i at 16·(128j + i) */
    static constexpr int D = DQK; /* the dQ accumulator tile's columns (fa_bwd_sm90_dq_writer) */
    static constexpr uint32_t DQ_PIECE_BYTES = 4 * fa_hopper_bwd_dq_piece_elems(BLOCK_M, DQK);
    static constexpr uint32_t VEC_BYTES = BLOCK_M * 4;
    static constexpr uint32_t K_OFFSET = 0;
    static constexpr uint32_t V_OFFSET = KV_BYTES;
    static constexpr uint32_t Q_OFFSET = V_OFFSET + KV_SLAB_BYTES * V_SLABS;
    static constexpr uint32_t DO_OFFSET = Q_OFFSET + STAGES * Q_BYTES;
    static constexpr uint32_t P_OFFSET = DO_OFFSET + STAGES * DO_BYTES;
    static constexpr uint32_t DS_OFFSET = P_OFFSET + TILE_BYTES;
    static constexpr uint32_t DQ_OFFSET = DS_OFFSET + 2 * TILE_BYTES;
    static constexpr uint32_t LSE_OFFSET = DQ_OFFSET + CONSUMER_WGS * DQ_PIECE_BYTES;
    static constexpr uint32_t DVEC_OFFSET = LSE_OFFSET + STAGES * VEC_BYTES;
    static constexpr uint32_t BAR_OFFSET = DVEC_OFFSET + STAGES * VEC_BYTES;
    static constexpr int NUM_BARRIERS = 1 + 2 * STAGES; /* kv_full, stage_full[S], stage_empty[S] */
    static constexpr uint32_t SMEM_BYTES = BAR_OFFSET + 8 * NUM_BARRIERS + 1024; /* + alignment slack */
    static constexpr uint32_t STAGE_TX = Q_BYTES + DO_BYTES;
    static constexpr int FULL_ARRIVALS = 1 + 32;
    static constexpr int EMPTY_ARRIVALS = 128 * CONSUMER_WGS;

    static_assert(KEYS == 48 && DQ_COLS == 96, "48 keys and 96 dQ columns per consumer");
    static_assert(DQ_PIECE_BYTES == 128 * (32 + 16) * 4 && fa_hopper_bwd_dq_tile_cols(256, 1) == D,
                  "a piece: the 32 + 16 fp32 registers of the dQ accumulators of 128 threads");
    static_assert(KV_SLAB_BYTES % 1024 == 0 && Q_SLAB_BYTES % 1024 == 0 && (KEYS * 128) % 1024 == 0 &&
                      Q_OFFSET % 1024 == 0 && DO_OFFSET % 1024 == 0 && P_OFFSET % 1024 == 0 &&
                      DS_OFFSET % 1024 == 0 && DQ_OFFSET % 1024 == 0,
                  "every slab, tile and consumer's key rows on a 1024-byte swizzle atom");
    static_assert(LSE_OFFSET % 16 == 0 && BAR_OFFSET % 8 == 0, "vector and mbarrier alignment");
    static_assert(fa_hopper_regs_split_ok(THREADS, PRODUCER_REGS, CONSUMER_REGS),
                  "setmaxnreg: .dec / .inc from the launch cap, within the CTA's register pool");
    static_assert((SLABS + V_SLABS) * KV_SLAB_BYTES <= P_OFFSET - Q_OFFSET,
                  "the epilogue's dK and dV tiles fit in the Q / dO stages");
    static_assert(SMEM_BYTES <= FA_HOPPER_SMEM_LIMIT, "H100/H200 opt-in shared memory per block");
    static_assert(BLOCK_M == fa_hopper_bwd_block_m(256, 0), "the bucket-256 plan's query blocks (semaphores, dQ)");
};

/* Named barrier ids (0 is __syncthreads; 4-7: FA_HBWD_BAR_DQ_EMPTY / DQ_FULL, 8-10:
 * FA_HBWD_BAR_EPILOGUE, bwd_sm90_common.cuh). */
enum fa_bwd_sm90_d192_named_barrier {
    FA_HBWD192_BAR_DS_FULL = 1, /* 256 consumer threads: both consumers' dS rows are in shared memory */
    FA_HBWD192_BAR_KV_TAIL = 2, /* 256, varlen: K/V rows past the sequence zeroed                   */
    FA_HBWD192_BAR_Q_TAIL = 3,  /* 256, varlen: Q/dO rows past the sequence zeroed in this stage     */
    FA_HBWD192_BAR_P_READY = 11 /* + consumer, its 128 threads: its P rows are in shared memory     */
};

/* A consumer's role as a type: its dQ columns decide the dQ GEMMs' shapes and operands. */
template <int C>
struct fa_bwd_sm90_d192_role {
    static constexpr int CONSUMER = C;
};

/* ---- device functions ------------------------------------------------------------------------ */

/* acc [64 queries, 48 keys] = A Bᵀ over K_STEPS k16 steps: A = a [64, K] stage K-major (slab
 * stride a_slab_bytes), B = 48 rows of a [96, K] tile K-major (slab stride KV_SLAB_BYTES). */
template <int K_STEPS, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_d192_issue_scores(float (&acc)[24], uint32_t a_stage, uint32_t b_rows) {
    using Cfg = fa_bwd_sm90_d192_config;
    const uint64_t a_desc = wgmma_desc_sw128(a_stage, 16, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(b_rows, 16, 1024);
#pragma unroll
    for (int i = 0; i < 24; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
        const uint64_t a_step = ((kk / 4) * Cfg::Q_SLAB_BYTES + (kk % 4) * 32) >> 4;
        const uint64_t b_step = ((kk / 4) * Cfg::KV_SLAB_BYTES + (kk % 4) * 32) >> 4;
        wgmma_ss_f32<48, BF16>(acc, a_desc + a_step, b_desc + b_step, kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < 24; ++i) wgmma_fence_operand(acc[i]);
}

/* acc[i] [64 head-dim columns 64i.., 48 keys] += (stage slab i)ᵀ · B for i < TILES: A = the slab
 * [64 queries][64 columns] read MN-major (rows of A = columns, K = queries: +2048 B per k16
 * step), B = this consumer's 48 rows of a P / dS tile, K-major (+32 B per step). One commit
 * group: dVᵀ += dOᵀ P (TILES 2), dKᵀ += Qᵀ dS (TILES 3). */
template <int TILES, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_d192_issue_kv_grads(float (&acc)[TILES][24], uint32_t stage,
                                                                uint32_t tile_rows) {
    using Cfg = fa_bwd_sm90_d192_config;
    const uint64_t b_desc = wgmma_desc_sw128(tile_rows, 16, 1024);
#pragma unroll
    for (int i = 0; i < TILES; ++i)
#pragma unroll
        for (int e = 0; e < 24; ++e) wgmma_fence_operand(acc[i][e]);
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
        const uint64_t a_desc = wgmma_desc_sw128(stage + (uint32_t)i * Cfg::Q_SLAB_BYTES, Cfg::Q_SLAB_BYTES, 1024);
#pragma unroll
        for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
            wgmma_ss_f32_transa<48, BF16>(acc[i], a_desc + ((kk * 2048) >> 4), b_desc + ((kk * 32) >> 4), 1);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < TILES; ++i)
#pragma unroll
        for (int e = 0; e < 24; ++e) wgmma_fence_operand(acc[i][e]);
}

/* dQ_c [64 queries, 96 columns] = dS K[:, 96C ..]: A = the dS tile [96 keys][64 queries] read
 * MN-major (K = the keys, +2048 B per k16 step), B = K [96 keys][192] read MN-major at the
 * consumer's columns (LBO = the slab stride, +2048 B per step): consumer 0 columns 0..63 into
 * dq64 and 64..95 into dq32, consumer 1 columns 96..127 (slab 1 from byte 64) into dq32 and
 * 128..191 into dq64. One commit group. */
template <int C, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_d192_issue_dq(float (&dq64)[32], float (&dq32)[16], uint32_t ds_tile,
                                                          uint32_t k_smem) {
    using Cfg = fa_bwd_sm90_d192_config;
    const uint64_t a_desc = wgmma_desc_sw128(ds_tile, Cfg::TILE_BYTES, 1024);
    const uint32_t b64 = k_smem + (C == 0 ? 0u : 2u * Cfg::KV_SLAB_BYTES);
    const uint32_t b32 = k_smem + Cfg::KV_SLAB_BYTES + (C == 0 ? 0u : 64u);
    const uint64_t b64_desc = wgmma_desc_sw128(b64, Cfg::KV_SLAB_BYTES, 1024);
    const uint64_t b32_desc = wgmma_desc_sw128(b32, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < 32; ++i) wgmma_fence_operand(dq64[i]);
#pragma unroll
    for (int i = 0; i < 16; ++i) wgmma_fence_operand(dq32[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk) {
        const uint64_t step = (uint64_t)((kk * 2048) >> 4);
        wgmma_ss_f32_transab<64, BF16>(dq64, a_desc + step, b64_desc + step, kk > 0 ? 1 : 0);
        wgmma_ss_f32_transab<32, BF16>(dq32, a_desc + step, b32_desc + step, kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < 32; ++i) wgmma_fence_operand(dq64[i]);
#pragma unroll
    for (int i = 0; i < 16; ++i) wgmma_fence_operand(dq32[i]);
}

/* An accumulator [64 rows, 48 columns] (element 4j + 2h + e: row 16w + l/4 + 8h, column
 * 8j + 2(l%4) + e) times mul, packed to 16 bits and stored transposed into 48 rows of a
 * [rows][64] tile (128-byte rows, 128-byte swizzle) at `rows_base`: stored row = column, its 64
 * elements = the accumulator's rows. stmatrix.trans x4 number k stores the 8 × 8 blocks (j, h) =
 * (2k + (i >> 1), i & 1), i = 0..3: lane 8i + R passes stored row 8j + R, chunk (2w + h) ^ R. */
template <bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_d192_store_t(uint32_t rows_base, const float (&acc)[24], float mul,
                                                         int warp, int lane) {
    const int i = lane / 8, r = lane % 8;
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        uint32_t frag[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int j = 2 * k + (x >> 1), h = x & 1;
            frag[x] = fa_bwd_sm90_pack2<BF16>(acc[4 * j + 2 * h] * mul, acc[4 * j + 2 * h + 1] * mul);
        }
        const int j = 2 * k + (i >> 1), h = i & 1;
        stmatrix_x4_trans(rows_base + (uint32_t)(8 * j + r) * 128 + (uint32_t)(((2 * warp + h) ^ r) * 16), frag);
    }
}

/* ---- main kernel ------------------------------------------------------------------------------ */

template <bool BF16, bool DET>
__global__ void __launch_bounds__(fa_bwd_sm90_d192_config::THREADS, 1)
    fa_bwd_sm90_d192_main_kernel(const __grid_constant__ CUtensorMap tmap_q,  /* {d, sq, hq, b}, box {64, 64, 1, 1}   */
                                 const __grid_constant__ CUtensorMap tmap_do, /* {dv, sq, hq, b}, box {64, 64, 1, 1}  */
                                 const __grid_constant__ CUtensorMap tmap_k,  /* {d, sk, hkv, b}, box {64, 96, 1, 1}  */
                                 const __grid_constant__ CUtensorMap tmap_v,  /* {dv, sk, hkv, b}, box {64, 96, 1, 1} */
                                 const __grid_constant__ CUtensorMap tmap_dk, /* dK {d, sk, hkv, b}, {64, 48, 1, 1}    */
                                 const __grid_constant__ CUtensorMap tmap_dv, /* dV {dv, sk, hkv, b}, {64, 48, 1, 1}   */
                                 const fa_bwd_sm90_params prm) {
    using Cfg = fa_bwd_sm90_d192_config;
    constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, STAGES = Cfg::STAGES, KEYS = Cfg::KEYS;

    /* deterministic mode: highest key block first (bwd_sm90_common.cuh, "deterministic dQ") */
    const int n_block = DET ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int n0 = n_block * BLOCK_N, batch = (int)blockIdx.z;
    const fa_bwd_sm90_heads heads = fa_bwd_sm90_cta_heads(prm); /* group_splits = 1: the whole group */
    const int head_kv = heads.kv;
    const bool varlen = prm.cu_seqlens_q != nullptr;
    const fa_seq_rows seq = fa_sequence_rows(prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q, prm.total_k,
                                             prm.seqlen_q, prm.seqlen_k, batch);
    const int len_q = seq.len_q, len_k = seq.len_k, shift = len_k - len_q;
    if (n0 >= len_k) return; /* past this sequence's keys (uniform over the CTA) */
    const int64_t q_packed0 = varlen ? seq.q_start : (int64_t)batch * prm.seqlen_q;
    int m_first, n_m;
    fa_bwd_sm90_query_blocks(prm, n0, BLOCK_M, BLOCK_N, len_q, len_k, shift, m_first, n_m);
    const fa_bwd_sm90_walk walk = fa_bwd_sm90_walk_of<DET>(prm, m_first, n_m, n_block, len_k, BLOCK_N);
    const int iterations = prm.heads_per_split * n_m;
    const int warpgroup = threadIdx.x / 128;

    if (iterations == 0) {
        /* no query row sees these keys: dK = dV = 0, written by all threads (before any barrier) */
        const int rows = min(BLOCK_N, len_k - n0);
        const int64_t row0 = varlen ? seq.k_start + n0 : n0;
        uint32_t *dk = reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(prm.dk) +
                                                    (int64_t)head_kv * prm.dk_head_stride +
                                                    (varlen ? 0 : (int64_t)batch * prm.dk_batch_stride));
        uint32_t *dv = reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(prm.dv) +
                                                    (int64_t)head_kv * prm.dv_head_stride +
                                                    (varlen ? 0 : (int64_t)batch * prm.dv_batch_stride));
        for (int idx = (int)threadIdx.x; idx < rows * (prm.head_dim / 2); idx += Cfg::THREADS)
            dk[((row0 + idx / (prm.head_dim / 2)) * prm.dk_row_stride) / 2 + idx % (prm.head_dim / 2)] = 0u;
        for (int idx = (int)threadIdx.x; idx < rows * (prm.head_dim_v / 2); idx += Cfg::THREADS)
            dv[((row0 + idx / (prm.head_dim_v / 2)) * prm.dv_row_stride) / 2 + idx % (prm.head_dim_v / 2)] = 0u;
        return;
    }

    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t smem = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t k_smem = smem + Cfg::K_OFFSET, v_smem = smem + Cfg::V_OFFSET; /* the loop reforms these */
    const uint32_t lse2_smem = smem + Cfg::LSE_OFFSET, dvec_smem = smem + Cfg::DVEC_OFFSET;
    const uint32_t bars = smem + Cfg::BAR_OFFSET;
    const uint32_t kv_full = bars;
    auto stage_full = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + s); };
    auto stage_empty = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + STAGES + s); };

    fa_bwd_sm90_init_stage_barriers<Cfg>(bars);
    __syncthreads(); /* every thread sees initialised barriers before any wait or arrive */

    /* TMA coordinates: varlen maps are {d, total, heads, 1} */
    const int k_row = (varlen ? (int)seq.k_start : 0) + n0;
    const int q_row0 = varlen ? (int)seq.q_start : 0;
    const int tma_batch = varlen ? 0 : batch;

    if (warpgroup == 0) {
        /* ================= producer ================= */
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0); /* warp-uniform for ptxas */
        const int lane = threadIdx.x % 32;
        if (warp == 0)
            fa_bwd_sm90_load<Cfg, false, DET>(&tmap_q, &tmap_do, &tmap_k, &tmap_v, prm, smem, seq, q_packed0, batch,
                                              heads, k_row, q_row0, tma_batch, walk, len_q, lane,
                                              [&](int s, int phase) { mbarrier_wait_parity(stage_empty(s), phase); },
                                              [&](int) {});
        else if (fa_bwd_sm90_is_dq_writer(DET, warp))
            fa_bwd_sm90_dq_writer<Cfg, DET>(prm, smem + Cfg::DQ_OFFSET, walk, batch, heads, len_q, len_k, shift,
                                            q_packed0, lane, warp - 1);
        return;
    }

    /* ================= consumers ================= */
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    /* from lane 0 (warp-uniform for ptxas): descriptors that depend on it stay in uniform registers */
    const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int ct = threadIdx.x - 128; /* 0..255 over both consumers */
    const int key_c = KEYS * consumer; /* this consumer's first key in the block */
    const uint32_t key_rows = (uint32_t)key_c * 128; /* ... as a byte offset in K, V, P and dS tiles */
    /* Query block m0 needs the mask iff m0 < mask_m_lo or m0 > mask_m_hi: the keys [n0, n0 + 95]
     * run past the sequence, or the last key is right of the first row's window, or the first key
     * left of the last row's window. */
    const int last_key = n0 + BLOCK_N - 1;
    const int mask_m_lo = last_key >= len_k           ? INT_MAX
                          : prm.window_right >= 0 ? last_key - shift - prm.window_right
                                                  : INT_MIN;
    const int mask_m_hi = prm.window_left >= 0 ? n0 - (BLOCK_M - 1) - shift + prm.window_left : INT_MAX;
    const int no_pack[2] = {0, 0};

    float dk_rmem[Cfg::SLABS][24], dv_rmem[Cfg::V_SLABS][24]; /* dKᵀ, dVᵀ [64 columns 64i.., 48 keys] */
#pragma unroll
    for (int e = 0; e < 24; ++e) {
#pragma unroll
        for (int i = 0; i < Cfg::SLABS; ++i) dk_rmem[i][e] = 0.0f;
#pragma unroll
        for (int i = 0; i < Cfg::V_SLABS; ++i) dv_rmem[i][e] = 0.0f;
    }

    mbarrier_wait_parity(kv_full, 0);
    if (varlen && n0 + BLOCK_N > len_k)
        fa_bwd_sm90_zero_kv_tail<Cfg>(k_smem, v_smem, len_k - n0, ct, FA_HBWD192_BAR_KV_TAIL);

    /* The iterations, once per role (each consumer its own copy of the loop: its dQ accumulators
     * are different register arrays, and an accumulator that changes registers at a branch's join
     * while a wgmma is in flight makes ptxas serialise the wgmma). The consumers meet at 256-thread
     * named barriers from different instructions: barrier.sync, not the .aligned bar.sync. */
    auto consumer_loop = [&](auto role) {
        constexpr int C = decltype(role)::CONSUMER;
        int walk_i = 0; /* iteration t is query block walk_i of query head t / n_m (the writer's walk) */
        for (int t = 0; t < iterations; ++t) {
            const int s = t % STAGES, use = t / STAGES;
            const int m0 = fa_bwd_sm90_walk_block<DET>(walk, walk_i) * BLOCK_M;
            /* the tiles' addresses from a base read again each iteration (shfl_sync_idx0_b32): the
             * wgmma descriptors derived from them are formed in uniform registers where they are
             * used; hoisted out of the loop, they outnumbered the uniform registers and ptxas
             * parked them in regular ones, moved back by an R2UR before every wgmma */
            const uint32_t smem_t = shfl_sync_idx0_b32(smem);
            const uint32_t k_t = smem_t + Cfg::K_OFFSET, v_t = smem_t + Cfg::V_OFFSET;
            const uint32_t q_s = smem_t + Cfg::Q_OFFSET + (uint32_t)s * Cfg::Q_BYTES;
            const uint32_t do_s = smem_t + Cfg::DO_OFFSET + (uint32_t)s * Cfg::DO_BYTES;
            const uint32_t p_t = smem_t + Cfg::P_OFFSET;
            const uint32_t ds_tile = smem_t + Cfg::DS_OFFSET + (uint32_t)(t & 1) * Cfg::TILE_BYTES;
            const int row0 = m0 + 16 * warp + lane / 4; /* this thread's query rows: row0, row0 + 8 */
            const uint32_t vec_row = (uint32_t)(s * BLOCK_M + 16 * warp + lane / 4) * 4;

            mbarrier_wait_parity(stage_full(s), use & 1);
            if (varlen && m0 + BLOCK_M > len_q) {
                /* Q/dO rows past the sequence -> 0 (uniform over both consumers in this iteration) */
                fa_bwd_sm90_zero_rows(q_s, Cfg::Q_SLAB_BYTES, Cfg::SLABS, BLOCK_M, len_q - m0, ct);
                fa_bwd_sm90_zero_rows(do_s, Cfg::Q_SLAB_BYTES, Cfg::V_SLABS, BLOCK_M, len_q - m0, ct);
                fence_proxy_async_shared_cta();
                barrier_sync(FA_HBWD192_BAR_Q_TAIL, 256);
            }
            float s_rmem[24], dp_rmem[24];
            fa_bwd_sm90_d192_issue_scores<Cfg::DQK / 16, BF16>(s_rmem, q_s, k_t + key_rows); /* S_c  */
            fa_bwd_sm90_d192_issue_scores<Cfg::DV / 16, BF16>(dp_rmem, do_s, v_t + key_rows); /* dP_c */
            if (t > 0) fa_bwd_sm90_dq_piece_staged(consumer); /* the previous iteration's, now that S_c and dP_c run */
            const float lse2_lo = ld_shared_f32(lse2_smem + vec_row), lse2_hi = ld_shared_f32(lse2_smem + vec_row + 32);

            wgmma_wait_group<1>(); /* S_c ready; dP_c may still run */
#pragma unroll
            for (int i = 0; i < 24; ++i) wgmma_fence_operand(s_rmem[i]);
            if (m0 < mask_m_lo || m0 > mask_m_hi)
                fa_hopper_mask<KEYS, false>(s_rmem, n0 + key_c, row0, no_pack, lane, len_k, shift, prm.window_left,
                                            prm.window_right);
            /* P = 2^(S·scale·log2e - LSE2) (LSE2 = +inf past the sequence: 0) */
#pragma unroll
            for (int j = 0; j < KEYS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s_rmem[4 * j + e] =
                        ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + e], prm.scale_log2, e & 2 ? -lse2_hi : -lse2_lo));
            fa_bwd_sm90_d192_store_t<BF16>(p_t + key_rows, s_rmem, 1.0f, warp, lane);
            /* stmatrix (generic proxy) -> wgmma (async proxy): each writer fences, then the
             * consumer's four warps meet (its GEMM reads all their rows) */
            fence_proxy_async_shared_cta();
            bar_sync(FA_HBWD192_BAR_P_READY + C, 128);
            fa_bwd_sm90_d192_issue_kv_grads<Cfg::V_SLABS, BF16>(dv_rmem, do_s, p_t + key_rows); /* dVᵀ_c */
            const float d_lo = ld_shared_f32(dvec_smem + vec_row), d_hi = ld_shared_f32(dvec_smem + vec_row + 32);

            wgmma_wait_group<1>(); /* dP_c ready; dVᵀ_c may still run */
#pragma unroll
            for (int i = 0; i < 24; ++i) wgmma_fence_operand(dp_rmem[i]);
            /* dS = P ∘ (dP - D) */
#pragma unroll
            for (int j = 0; j < KEYS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp_rmem[4 * j + e] = s_rmem[4 * j + e] * (dp_rmem[4 * j + e] - (e & 2 ? d_hi : d_lo));
            fa_bwd_sm90_d192_store_t<BF16>(ds_tile + key_rows, dp_rmem, 1.0f, warp, lane);
            fence_proxy_async_shared_cta();
            barrier_sync(FA_HBWD192_BAR_DS_FULL, 256); /* dQ reads both consumers' keys */

            float dq64[32], dq32[16];
            fa_bwd_sm90_d192_issue_dq<C, BF16>(dq64, dq32, ds_tile, k_t);                        /* dQ_c  */
            fa_bwd_sm90_d192_issue_kv_grads<Cfg::SLABS, BF16>(dk_rmem, q_s, ds_tile + key_rows); /* dKᵀ_c */
            wgmma_wait_group<1>(); /* dVᵀ_c and dQ_c retired; dKᵀ_c runs under the staging */
#pragma unroll
            for (int i = 0; i < 32; ++i) wgmma_fence_operand(dq64[i]);
#pragma unroll
            for (int i = 0; i < 16; ++i) wgmma_fence_operand(dq32[i]);

            /* dQ_c into the writer's staging in register order (the piece's 12 groups of four
             * registers: its columns in order, dq64 then dq32 for consumer 0, dq32 then dq64 for
             * consumer 1), once the writer has read the previous piece; consecutive threads'
             * 16-byte stores are contiguous: no bank conflict */
            bar_sync(FA_HBWD_BAR_DQ_EMPTY + C, FA_HBWD_DQ_HANDOFF_THREADS);
            const uint32_t dq_slot = smem_t + Cfg::DQ_OFFSET + (uint32_t)C * Cfg::DQ_PIECE_BYTES + (uint32_t)tid * 16;
#pragma unroll
            for (int j = 0; j < 12; ++j) {
                const bool from64 = C == 0 ? j < 8 : j >= 4;
                const int e = 4 * (C == 0 ? (j < 8 ? j : j - 8) : (j < 4 ? j : j - 4));
                const float *src = from64 ? dq64 + e : dq32 + e;
                st_shared_v4_f32(dq_slot + (uint32_t)j * 128 * 16, src[0], src[1], src[2], src[3]);
            }

            wgmma_wait_group<0>(); /* dKᵀ_c retired */
#pragma unroll
            for (int e = 0; e < 24; ++e) {
#pragma unroll
                for (int i = 0; i < Cfg::SLABS; ++i) wgmma_fence_operand(dk_rmem[i][e]);
#pragma unroll
                for (int i = 0; i < Cfg::V_SLABS; ++i) wgmma_fence_operand(dv_rmem[i][e]);
            }
            /* this thread's reads of stage s (GEMMs retired, LSE2 / D used) are done: release it */
            mbarrier_arrive(stage_empty(s));
            if (++walk_i == walk.n_m) walk_i = 0;
        }
    };
    if (consumer == 0) consumer_loop(fa_bwd_sm90_d192_role<0>{});
    else consumer_loop(fa_bwd_sm90_d192_role<1>{});
    fa_bwd_sm90_dq_piece_staged(consumer); /* the last iteration's */

    /* dK (scaled) and dV of this consumer's 48 keys through the Q / dO stages, free once both
     * consumers' last GEMMs have retired */
    bar_sync(FA_HBWD_BAR_EPILOGUE, 256);
    const uint32_t dk_tiles = smem + Cfg::Q_OFFSET, dv_tiles = dk_tiles + Cfg::SLABS * Cfg::KV_SLAB_BYTES;
#pragma unroll
    for (int i = 0; i < Cfg::SLABS; ++i)
        fa_bwd_sm90_d192_store_t<BF16>(dk_tiles + (uint32_t)i * Cfg::KV_SLAB_BYTES + key_rows, dk_rmem[i],
                                       prm.softmax_scale, warp, lane);
#pragma unroll
    for (int i = 0; i < Cfg::V_SLABS; ++i)
        fa_bwd_sm90_d192_store_t<BF16>(dv_tiles + (uint32_t)i * Cfg::KV_SLAB_BYTES + key_rows, dv_rmem[i], 1.0f, warp,
                                       lane);
    fa_bwd_sm90_dkdv_out<Cfg::SLABS, BLOCK_N, Cfg::SLABS, KEYS>(&tmap_dk, &tmap_dv, prm, dk_tiles, consumer, tid, key_c,
                                                                0, n0, len_k, seq.k_start, batch, 0);
}

/* ---- host ------------------------------------------------------------------------------------ */

template <bool BF16>
static fa_status fa_bwd_sm90_d192_launch(const fa_bwd_params *p, int device_ordinal, cudaStream_t stream) {
    using Cfg = fa_bwd_sm90_d192_config;
    static const char *const path = "the Hopper backward (d = 192, dv = 128)";
    const int64_t rows_q = p->cu_seqlens_q != nullptr ? p->total_q : p->seqlen_q;
    const int64_t rows_k = p->cu_seqlens_q != nullptr ? p->total_k : p->seqlen_k;
    if (rows_q == 0 || rows_k == 0) return FA_OK; /* bwd.cu never launches an empty grid */
    if (p->group_splits != 1 || p->heads_per_split != p->group)
        return fa_set_error(FA_ERR_INVALID_SIZE, "%s: the kv group is not split", path);
    CUtensorMap tmap_q, tmap_do, tmap_k, tmap_v, tmap_dk, tmap_dv;
    fa_status st;
    int dkdv_tma;
    if ((st = fa_bwd_sm90_make_maps(p, BF16, Cfg::BLOCK_M, Cfg::BLOCK_N, path, &tmap_q, &tmap_do, &tmap_k, &tmap_v)) !=
            FA_OK ||
        (st = fa_bwd_sm90_dkdv_maps(p, BF16, path, &tmap_k, &tmap_dk, &tmap_dv, &dkdv_tma, Cfg::KEYS)) != FA_OK)
        return st;
    const bool det = p->dq_semaphore != nullptr;
    auto kernel = det ? fa_bwd_sm90_d192_main_kernel<BF16, true> : fa_bwd_sm90_d192_main_kernel<BF16, false>;
    static unsigned long long configured[2] = {0, 0};
    if ((st = fa_bwd_sm90_opt_in_smem(kernel, Cfg::SMEM_BYTES, device_ordinal, &configured[det])) != FA_OK) return st;
    fa_bwd_sm90_params prm = fa_bwd_sm90_make_params(p);
    prm.query_blocks = (p->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M;
    prm.dq_tiles = fa_hopper_bwd_dq_tiles(p->total_q, p->batch, Cfg::BLOCK_M);
    prm.dkdv_tma = dkdv_tma;
    const int64_t key_blocks = (p->seqlen_k + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N;
    if (key_blocks == 0) return FA_OK;
    if ((st = fa_bwd_sm90_set_rotation(&prm, false, det, key_blocks)) != FA_OK) return st;
    if (key_blocks > INT32_MAX || p->heads_kv > FA_CUDA_GRID_YZ_MAX || p->batch > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE, "%s: grid (%lld key blocks, %d kv heads, %d sequences) too large",
                            path, (long long)key_blocks, p->heads_kv, p->batch);
    const dim3 grid((unsigned)key_blocks, (unsigned)p->heads_kv, (unsigned)p->batch);
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(tmap_q, tmap_do, tmap_k, tmap_v, tmap_dk, tmap_dv,
                                                            prm);
    FA_CUDA_CHECK_LAUNCH("Hopper backward (d = 192, dv = 128) kernel launch");
    return FA_OK;
}

extern "C" fa_status fa_bwd_launch_hopper192(const fa_bwd_params *prm, fa_dtype dtype, int device_ordinal,
                                             cudaStream_t stream) {
    if (prm->dq_tile_cols != 192 ||
        !fa_hopper_bwd_d192(prm->head_dim, prm->head_dim_v, prm->softcap_pre > 0.0f, fa_bwd_sm90_log2_scores(prm), 0))
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "head_dim = %d, head_dim_v = %d: not the d = 192 / dv = 128 Hopper backward's problem",
                            prm->head_dim, prm->head_dim_v);
    return dtype == FA_DTYPE_BF16 ? fa_bwd_sm90_d192_launch<true>(prm, device_ordinal, stream)
                                  : fa_bwd_sm90_d192_launch<false>(prm, device_ordinal, stream);
}
