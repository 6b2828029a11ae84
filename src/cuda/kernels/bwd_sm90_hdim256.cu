/*
 * bwd_sm90_hdim256.cu: the Hopper (sm_90a) backward main kernel for head-dim bucket 256 (d and
 * dv multiples of 8 in 136..256, one bucket; columns past d or dv read as zeros, never written),
 * and in CTA pairs for bucket 512 (264..512, the paragraph "Bucket 512" below).
 * The sibling of bwd_sm90.cu (buckets 64 and 128), whose file comment describes what the
 * two share: bwd.cu's pre-pass (D = rowsum(dO∘O), dsink) and zeroed fp32 dQ accumulator
 * around it, the coverage (f16 / bf16, MHA / GQA / MQA, fixed-length and varlen batches, causal
 * and sliding windows with causal folded in, sinks through the LSE, softcap in the SOFTCAP
 * instantiations; not ALiBi), the deterministic mode (template DET: dQ additions ordered by key
 * block, producer warps 1 and 2 keeping the turns of the two consumers' column pieces;
 * bwd_sm90_common.cuh), the forward's LSE read here and converted to log2 units, the producer's
 * stage protocol, the varlen zeroing and the mask. fa_bwd_launch_hopper() dispatches here. From
 * an experiment (docs/tuning-log.md: d = 256 only, fixed length, causal or not; 37/37 checks at
 * 1.11-1.15x FA2), with the library's varlen, windows, LSE and dQ layout added.
 *
 * Why another kernel: at d = 256 a warpgroup cannot hold dK and dV of 64 keys × 256 columns in
 * fp32 registers (256 per thread), so the head-dim columns are split between the consumers:
 *
 * One CTA = BLOCK_N = 64 keys [n0, n0 + 64) of one (kv head, batch); grid (key blocks, heads_kv,
 * batch); 384 threads:
 *   warpgroup 0, producer (setmaxnreg 24), warp 0: lane 0 issues K and V of the key block once
 *     (kv_full), then for every iteration t = (query head of the group, query block; query block
 *     fastest) Q_t [64, 256] by TMA into stage t % 2 of a ring, the warp's 32 lanes storing the
 *     rows' LSE·log2e (+inf where LSE = -inf or past the sequence) and D (0 past it) into the
 *     stage (stage_full), then dO_t into the one dO buffer once both consumers have released
 *     dO_(t-1) (do_empty -> do_full; fa_bwd_sm90_load with DO_STAGES = 1);
 *   warpgroups 1 and 2, consumers (setmaxnreg 240): both work on all 64 keys; consumer c computes
 *     Sᵀ and dPᵀ for queries 32c .. 32c+31 of the block (no GEMM is computed twice: 5 units of
 *     64×64×256 per iteration) and owns head-dim columns 128c .. 128c+127 of dK, dV (fp32
 *     registers, 64 + 64 per thread, over all iterations) and of every dQ tile. The two halves of
 *     Pᵀ and dSᵀ meet in shared memory, where all three remaining GEMMs read them. After the
 *     last iteration dK and dV go out through the Q stages (bwd_sm90_common.cuh's
 *     fa_bwd_sm90_epilogue_dkdv: TMA store, or coalesced copies for varlen batches). MLA's
 *     192 / 128 runs bwd_sm90_hdim192.cu on its plain score path (fa_hopper_bwd_d192); with
 *     softcap, ALiBi, a negative scale or dropout (or FA_HOPPER_BWD_192=0) it runs here, d and
 *     dv padded to 256.
 *
 * GEMM orientation (M = 64; A from shared memory K-major, or MN-major with imm-trans-a = 1; B
 * K-major or MN-major with imm-trans-b = 1):
 *   Sᵀ_c  = K Q_cᵀ         SS  A = K [64 keys, 256] K-major, B = the 32 rows of Q_c K-major, N = 32
 *   dPᵀ_c = V dO_cᵀ        SS  the same with V and dO,                                     N = 32
 *   dV_c += Pᵀ dO[:, c]    SS  A = the Pᵀ tile [64 keys][64 queries] K-major (K = queries);
 *                              B = dO slabs 2c, 2c+1 read MN-major (trans-b),              N = 128
 *   dQ_c  = dS K[:, c]     SS  A = the same dSᵀ tile read MN-major (trans-a: its rows are keys,
 *                              the K of this GEMM); B = K slabs 2c, 2c+1 MN-major,         N = 128
 *   dK_c += dSᵀ Q[:, c]    SS  A = the dSᵀ tile K-major; B = Q slabs 2c, 2c+1 MN-major,    N = 128
 *
 * One consumer iteration t (stage s = t % 2, score buffer t % 2):
 *   wait stage_full[s] (varlen: do_full too, then rows of Q and dO past the sequence zeroed by
 *   both consumers, named barrier Q_TAIL of the 256 consumer threads); issue Sᵀ_c; wait do_full;
 *   issue dPᵀ_c; wait for Sᵀ_c: mask, P = 2^(Sᵀ·scale·log2e - LSE2); pack; stmatrix P into the
 *   Pᵀ tile's columns 32c..; wait for dPᵀ_c: dS = P∘(dPᵀ - D); pack; stmatrix into the dSᵀ tile;
 *   fence.proxy.async; named barrier PDS_FULL (256 threads: both halves are in place); issue dV_c,
 *   dQ_c, dK_c; wait for dV_c: arrive on do_empty[c] (dO of t + 1 then loads under dQ and dK);
 *   wait for dQ_c: each warp adds its rows [16, 128] of the piece with four bulk tensor
 *   reduce-adds of 32 columns through its two staging buffers; wait for dK_c: arrive on
 *   stage_empty[s][c].
 * The score double buffer: consumer c writes buffer t % 2 at iteration t only after passing
 * PDS_FULL of iteration t-1, which the other consumer reaches only after its wait for the GEMMs of
 * iteration t-2, the last that read buffer t % 2. A staging buffer is rewritten only after lane 0's
 * wait_group.read 1 (the reduction issued two rounds before, which read it, is done reading).
 * Deterministic mode: consumer c's warps issue their reductions after DQ_TURN + c, and lane 0 waits
 * for them to be written (wait_group 0, fence.proxy.async.global) before the warp arrives on
 * DQ_DONE + c.
 *
 * mbarriers: kv_full (1 arrival + K and V bytes; phase 0 only); stage_full[s] (33 arrivals:
 * producer lane 0's arrive.expect_tx with the Q bytes before the TMA, then every lane of warp 0
 * after its own vector stores); do_full (1 arrival + the dO bytes); stage_empty[s][c] and
 * do_empty[c] (128 arrivals: every thread of consumer c after its last read). Use u of stage s is
 * phase u: consumers wait full with parity u & 1, the producer waits both empties with parity
 * (u & 1) ^ 1; dO's use is t.
 *
 * Every thread releases its own shared-memory accesses. One lane arriving after __syncwarp for
 * its whole warp is also ordered by the memory model, but compute-sanitizer racecheck does not
 * credit it: on the H200 it reported the other lanes' LSE2/D stores against the consumers' reads
 * (the 64/128 kernel, first form of this file; lab v2 likewise). The 33 and 128 arrivals cost
 * next to nothing.
 *
 * Shared memory (1024-byte aligned; every tile is 64-column slabs of 128-byte rows in the
 * 128-byte swizzle, each slab 1024-byte aligned): K [4][64][64] | V [4][64][64] |
 * Q [2][4][64][64] | dO [4][64][64] | [2 buffers][Pᵀ, dSᵀ][64][64] | dQ staging [8 warps][2][16][32]
 * fp32 | LSE2 [2][64] fp32 | D [2][64] fp32 | mbarriers: 231,504 bytes with the alignment slack
 * (sm90_tiles.h).
 *
 * Dropout (template flag DROPOUT; off, the kernel is the code it was): as the 64/128 kernel, the
 * mask is regenerated on Sᵀ. A consumer's Sᵀ per warp is 16 keys × 32 queries, four transposed
 * m16n8 fragments = 32 Philox groups of 16 keys: one fa_dropout_keep_kq4 call per lane, drawn
 * right after the Sᵀ GEMM is issued (integer work under the tensor cores), bit i for element i.
 * dPᵀ -> Z∘dPᵀ (Z = keep · keep_scale) before dS = P∘(Z∘dPᵀ - D); the packed Pᵀ of this
 * consumer's queries has its dropped halves cleared before it goes to shared memory (so dV =
 * Σ (keep∘P)ᵀ dO), and keep_scale is applied to dV once when it is stored.
 *
 * Bucket 512 (d or dv in 264..512; template CTAS = 2): a cluster of two CTAs per key block, the
 * same kernel on each half of the head-dim columns. CTA r (cluster rank r, blockIdx.x = 2n + r for
 * key block n) loads columns 256r .. 256r + 255 of Q, K, V and dO, owns those columns of dK, dV and
 * dQ, and computes Sᵀ and dPᵀ over them only: partial sums, which the two CTAs exchange through
 * each other's shared memory (st.async into the peer's receive buffer, counted on the peer's
 * xchg_full mbarrier; cuda_common.cuh's fa_pair_exchange) and add, so both hold the
 * whole Sᵀ and dPᵀ and run the same mask, softmax, softcap, ALiBi and dropout bits. Per CTA everything else is the
 * bucket-256 kernel: the same GEMMs, registers and dQ staging. The receive buffers (one fp32
 * [64 keys, 32 queries] per consumer, used in turn by Sᵀ and dPᵀ) take the second score buffer's
 * 16 KiB, so the consumers meet (PDS_EMPTY) before writing Pᵀ of the next iteration. Deterministic
 * mode keeps four dQ turns per query block (two per CTA). Nothing is sent to the peer after its
 * last message has been read, so a CTA may exit without a cluster barrier.
 *
 * Varlen and windows exactly as the 64/128 kernel: K/V rows past the sequence and Q/dO rows past
 * it zeroed in shared memory before any GEMM (NaN in the next sequence's rows never reaches an
 * accumulator); keys past the sequence masked and not written; query blocks no key of the block
 * sees skipped; key blocks no query sees get dK = dV = 0.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <math_constants.h>
#include <stdint.h>

#include "cuda/kernels/bwd_sm90_common.cuh"
#include "cuda/common/bwd_launch.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/tma.h"

/* dQ staging stores: a thread's fp32 accumulator pairs go to rows lane/4 (+8) of a
 * 128-byte-swizzled fp32 tile, 16-byte chunk 2b + (lane%4)/2 of column block b swizzled by the
 * row's bits 0-2, so the four lanes of row r fill chunk pair b ^ (r/2). 8-byte stores reach the
 * banks a half-warp (rows 0-3 or 4-7) at a time: with block b = j in step j, rows r and r^1 would
 * share a pair (two wavefronts per half-warp, twice the minimum); odd rows store block
 * j ^ FA_BWD_SM90_DQ_SWAP instead, and the four rows of a half-warp land on four different pairs.
 * The call sites read both candidates' registers by compile-time index and select one (a
 * run-time register index would put the accumulator in local memory). */
constexpr int FA_BWD_SM90_DQ_SWAP = 2;
__device__ __forceinline__ bool fa_bwd_sm90_dq_odd_row(int lane) { return (lane / 4) & 1; }

/* ---- configuration --------------------------------------------------------------------------- */

/* CTAS = 2: bucket 512's cluster pair (every size below is per CTA: 256 of the head-dim columns);
 * one score buffer, whose second 16 KiB hold the exchange. */
template <int CTAS = 1>
struct fa_bwd_sm90_d256_config {
    static constexpr int BUCKET = CTAS == 2 ? 512 : 256; /* sm90_tiles.h's name for this layout */
    static constexpr int D = 256;
    static constexpr int BLOCK_M = fa_hopper_bwd_block_m(D, 0); /* 64 queries per iteration */
    static constexpr int BLOCK_N = fa_hopper_bwd_block_n(D); /* 64 keys, shared by both consumers */
    static constexpr int STAGES = fa_hopper_bwd_stages(D);       /* Q (and LSE2, D) ring */
    static constexpr int DO_STAGES = fa_hopper_bwd_do_stages(D); /* 1: dO on its own barrier */
    static constexpr int CONSUMER_WGS = 2;
    static constexpr int HALF_M = BLOCK_M / CONSUMER_WGS; /* queries of Sᵀ / dPᵀ per consumer: 16 fp32 registers each */
    static constexpr int COLS = D / CONSUMER_WGS;         /* head-dim columns of dK, dV, dQ per consumer */
    static constexpr int THREADS = 128 * (1 + CONSUMER_WGS);
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
    static constexpr int SLABS = D / 64;
    static constexpr uint32_t KV_SLAB_BYTES = BLOCK_N * 128;
    static constexpr uint32_t KV_BYTES = KV_SLAB_BYTES * SLABS;   /* K or V */
    static constexpr uint32_t Q_SLAB_BYTES = BLOCK_M * 128;       /* Q and dO slabs */
    static constexpr uint32_t Q_BYTES = Q_SLAB_BYTES * SLABS;     /* one Q or dO stage */
    static constexpr int V_SLABS = SLABS;                         /* V and dO: as K and Q */
    static constexpr uint32_t DO_BYTES = Q_BYTES;
    /* dQ staging: per consumer warp two fp32 buffers [16 rows][32 columns] of 128-byte rows in the
     * 128-byte swizzle (the accumulator map's box) */
    static constexpr uint32_t DQ_BUF_BYTES = 16 * 32 * 4;
    static constexpr uint32_t DQ_WARP_BYTES = 2 * DQ_BUF_BYTES;
    static constexpr uint32_t TILE_BYTES = BLOCK_N * BLOCK_M * 2; /* one Pᵀ or dSᵀ tile [64 keys][64 queries] */
    static constexpr int SCORE_TILES = fa_hopper_bwd_score_tiles(D); /* Pᵀ and dSᵀ per buffer */
    static constexpr int SCORE_BUFFERS = fa_hopper_bwd_score_buffers(BUCKET);
    static constexpr uint32_t XCHG_BYTES = fa_hopper_bwd_exchange_bytes(BUCKET); /* [consumer][4][128 threads] float4 */
    static constexpr uint32_t VEC_BYTES = BLOCK_M * 4;            /* one LSE2 or D stage */
    static constexpr uint32_t K_OFFSET = 0;
    static constexpr uint32_t V_OFFSET = KV_BYTES;
    static constexpr uint32_t Q_OFFSET = 2 * KV_BYTES;
    static constexpr uint32_t DO_OFFSET = Q_OFFSET + STAGES * Q_BYTES;
    static constexpr uint32_t PDS_OFFSET = DO_OFFSET + DO_STAGES * Q_BYTES; /* [2 buffers][Pᵀ, dSᵀ] */
    static constexpr uint32_t XCHG_OFFSET = PDS_OFFSET + SCORE_BUFFERS * SCORE_TILES * TILE_BYTES;
    static constexpr uint32_t DQ_OFFSET = XCHG_OFFSET + XCHG_BYTES;
    static constexpr uint32_t LSE_OFFSET = DQ_OFFSET + 4 * CONSUMER_WGS * DQ_WARP_BYTES;
    static constexpr uint32_t DVEC_OFFSET = LSE_OFFSET + STAGES * VEC_BYTES;
    static constexpr uint32_t BAR_OFFSET = DVEC_OFFSET + STAGES * VEC_BYTES;
    /* kv_full, stage_full[STAGES], do_full, stage_empty[STAGES][CONSUMER_WGS], do_empty[CONSUMER_WGS];
     * CTAS = 2: xchg_full[CONSUMER_WGS], xchg_free[CONSUMER_WGS] */
    static constexpr int NUM_BARRIERS =
        1 + STAGES + 1 + STAGES * CONSUMER_WGS + CONSUMER_WGS + (CTAS == 2 ? 2 * CONSUMER_WGS : 0);
    static constexpr uint32_t SMEM_BYTES = BAR_OFFSET + 8 * NUM_BARRIERS + 1024; /* + alignment slack */
    static constexpr uint32_t STAGE_TX = Q_BYTES; /* dO: Q_BYTES on do_full */
    static constexpr int FULL_ARRIVALS = 1 + 32; /* producer lane 0's expect_tx, then each lane after its stores */
    static constexpr int EMPTY_ARRIVALS = 128;   /* every thread of one consumer after its reads */

    static_assert(BLOCK_M == 64 && BLOCK_N == 64, "64 keys (wgmma M) × 64 queries, 32 per consumer");
    static_assert(COLS == 128 && HALF_M == 32, "each consumer owns two 64-column slabs and 32 queries");
    static_assert(SCORE_TILES == 2, "Pᵀ and dSᵀ");
    static_assert(DO_STAGES == 1, "one dO buffer");
    static_assert(4 * CONSUMER_WGS * DQ_WARP_BYTES == fa_hopper_bwd_dq_staging_bytes(D, 0), "dQ staging");
    static_assert(Q_SLAB_BYTES % 1024 == 0 && KV_SLAB_BYTES % 1024 == 0 && PDS_OFFSET % 1024 == 0 &&
                      XCHG_OFFSET % 16 == 0 &&
                      TILE_BYTES % 1024 == 0 && (HALF_M * 128) % 1024 == 0 && DQ_OFFSET % 1024 == 0 &&
                      DQ_BUF_BYTES % 1024 == 0,
                  "every slab, tile and query half on a 1024-byte swizzle atom (descriptor base offset 0)");
    static_assert(LSE_OFFSET % 16 == 0 && BAR_OFFSET % 8 == 0, "vector and mbarrier alignment");
    static_assert(fa_hopper_regs_split_ok(THREADS, PRODUCER_REGS, CONSUMER_REGS),
                  "setmaxnreg: .dec / .inc from the launch cap, within the CTA's register pool");
    static_assert(CTAS == fa_hopper_bwd_cluster_ctas(BUCKET) && D == fa_hopper_bwd_cta_cols(BUCKET), "CTAs per key block");
    static_assert(XCHG_BYTES == (CTAS == 2 ? CONSUMER_WGS * 128 * (HALF_M / 2) * 4 : 0), "one partial per consumer thread");
    static_assert(NUM_BARRIERS == fa_hopper_bwd_barriers(BUCKET), "sm90_tiles.h agrees with the barriers");
    static_assert(SMEM_BYTES == fa_hopper_bwd_smem_bytes(BUCKET, 0), "sm90_tiles.h agrees with the layout");
    static_assert(2 * KV_BYTES <= PDS_OFFSET - Q_OFFSET, "the epilogue's dK and dV tiles fit in the Q / dO buffers");
    static_assert(SMEM_BYTES <= FA_HOPPER_SMEM_LIMIT, "H100/H200 opt-in shared memory per block");
};

/* One consumer's share of the Sᵀ / dPᵀ GEMM and of the probabilities, for the shared templates of
 * bwd_sm90_common.cuh: 64 keys × HALF_M queries (BLOCK_M there is the N of the GEMM) over the 256
 * head-dim columns (the GEMM's K), the stage slab strides unchanged. */
struct fa_bwd_sm90_d256_half_config {
    static constexpr int D = fa_bwd_sm90_d256_config<>::D;
    static constexpr int BLOCK_M = fa_bwd_sm90_d256_config<>::HALF_M;
    static constexpr uint32_t KV_SLAB_BYTES = fa_bwd_sm90_d256_config<>::KV_SLAB_BYTES;
    static constexpr uint32_t Q_SLAB_BYTES = fa_bwd_sm90_d256_config<>::Q_SLAB_BYTES;
};

/* Named barrier ids (0 is __syncthreads). */
enum fa_bwd_sm90_d256_named_barrier {
    FA_HBWD256_BAR_PDS_FULL = 1, /* 256 consumer threads: both halves of Pᵀ and dSᵀ are in shared memory */
    FA_HBWD256_BAR_PDS_EMPTY = 2, /* 256 consumer threads, one score buffer: the last GEMMs that read it retired */
    FA_HBWD256_BAR_KV_TAIL = 3,  /* 256 consumer threads, varlen: K/V rows past the sequence zeroed    */
    FA_HBWD256_BAR_Q_TAIL = 4    /* 256 consumer threads, varlen: Q/dO rows past the sequence zeroed   */
};

/* ---- device functions (the shared ones: bwd_sm90_common.cuh) --------------------------------- */

/* This consumer's half of a Pᵀ or dSᵀ tile [64 keys][64 queries] (rows of 128 bytes, 128-byte
 * swizzle: 16-byte chunk q ^ (row & 7)) from its A fragments (keys × its HALF_M queries, packed as
 * fa_bwd_sm90_pack). stmatrix x4 of k-slice kk: matrix i = lane / 8 holds keys 16w + 8(i & 1) ..
 * +7 and queries half0 + 16kk + 8(i >> 1) .. +7, so lane 8i + R passes row 16w + 8(i & 1) + R,
 * chunk (half0 / 8 + 2kk + (i >> 1)) ^ R: the 8 rows of a matrix land in 8 distinct chunks (no
 * bank conflict). */
__device__ __forceinline__ void fa_bwd_sm90_d256_store_half(uint32_t tile, const uint32_t (&frag)[2][4], int warp,
                                                            int lane, int half0) {
    const int i = lane / 8, r = lane % 8;
    const uint32_t row = (uint32_t)(16 * warp + 8 * (i & 1) + r);
#pragma unroll
    for (int kk = 0; kk < fa_bwd_sm90_d256_config<>::HALF_M / 16; ++kk) {
        const uint32_t chunk = (uint32_t)((half0 / 8 + 2 * kk + (i >> 1)) ^ r);
        stmatrix_x4(tile + row * 128 + chunk * 16, frag[kk]);
    }
}

/* ---- the pair's exchange (CTAS = 2, bucket 512) ---------------------------------------------
 * Each CTA of a pair computes Sᵀ and dPᵀ over its own 256 head-dim columns; the whole scores are
 * the two partials added (both CTAs hold the same Sᵀ and dPᵀ, so they run the same mask, softmax
 * and dropout bits): cuda_common.cuh's fa_pair_exchange, consumer c with consumer c of the peer,
 * HALF_M / 2 fp32 per thread. */
constexpr int FA_BWD_SM90_PAIR_V4 = fa_bwd_sm90_d256_config<>::HALF_M / 8; /* float4 per thread */
constexpr uint32_t FA_BWD_SM90_PAIR_MSG_BYTES = FA_BWD_SM90_PAIR_V4 * 128 * 16;

/* acc [64 rows, COLS = 128 columns] (+)= A [64 rows, 64] times B [64, 128 columns], K = 64 (4 k16
 * steps):
 *   TRANS_A = false: A = a Pᵀ / dSᵀ tile read K-major (rows = keys, K = queries: +32 B per step):
 *     dV_c += Pᵀ dO[:, c], dK_c += dSᵀ Q[:, c];
 *   TRANS_A = true: A = the dSᵀ tile read MN-major (rows of A = queries, K = keys: +2048 B per
 *     16 keys, SBO = 1024 B per 8): dQ_c = dS K[:, c];
 * B = two 64-column slabs (stride b_slab_bytes) of a 64-row stage or of K, read MN-major (SBO =
 * 1024 B, +2048 B per 16 rows). accumulate = 0 starts from zero. One commit group. */
template <bool BF16, bool TRANS_A>
__device__ __forceinline__ void fa_bwd_sm90_d256_issue_tile(float (&acc)[fa_bwd_sm90_d256_config<>::COLS / 2],
                                                            uint32_t a_tile, uint32_t b_cols, uint32_t b_slab_bytes,
                                                            int accumulate) {
    using Cfg = fa_bwd_sm90_d256_config<>;
    constexpr int N = Cfg::COLS;
    const uint64_t a_desc = TRANS_A ? wgmma_desc_sw128(a_tile, Cfg::TILE_BYTES, 1024) : wgmma_desc_sw128(a_tile, 16, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(b_cols, b_slab_bytes, 1024);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 64 / 16; ++kk) {
        const uint64_t a_step = TRANS_A ? (uint64_t)((kk * 2048) >> 4) : (uint64_t)((kk * 32) >> 4);
        if constexpr (TRANS_A)
            wgmma_ss_f32_transab<N, BF16>(acc, a_desc + a_step, b_desc + ((kk * 2048) >> 4),
                                          kk > 0 || accumulate ? 1 : 0);
        else
            wgmma_ss_f32_transb<N, BF16>(acc, a_desc + a_step, b_desc + ((kk * 2048) >> 4),
                                         kk > 0 || accumulate ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) wgmma_fence_operand(acc[i]);
}

/* ---- dropout (the DROPOUT instantiations) ----------------------------------------------------- */

/* Packed Pᵀ pairs (fa_bwd_sm90_pack's layout: frag[kk][x] holds elements i = 8kk + 2x, i + 1) with
 * the dropped halves cleared (an AND on the packed pair, as the 64/128 kernel's pack_kept). */
__device__ __forceinline__ void fa_bwd_sm90_d256_clear_dropped(uint32_t (&frag)[fa_bwd_sm90_d256_config<>::HALF_M / 16][4],
                                                               uint32_t keep) {
#pragma unroll
    for (int kk = 0; kk < fa_bwd_sm90_d256_config<>::HALF_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const uint32_t two = keep >> (8 * kk + 2 * x);
            frag[kk][x] &= (two & 1u ? 0x0000FFFFu : 0u) | (two & 2u ? 0xFFFF0000u : 0u);
        }
}

/* ---- main kernel ------------------------------------------------------------------------------ */

template <bool BF16, bool SOFTCAP, bool LOG2, bool DET, bool DROPOUT, int CTAS>
__global__ void __launch_bounds__(fa_bwd_sm90_d256_config<>::THREADS, 1)
    fa_bwd_sm90_d256_main_kernel(const __grid_constant__ CUtensorMap tmap_q,  /* {d, sq, hq, b}, box {64, 64, 1, 1}   */
                           const __grid_constant__ CUtensorMap tmap_do, /* {dv, sq, hq, b}, box {64, 64, 1, 1}  */
                           const __grid_constant__ CUtensorMap tmap_k,  /* {d, sk, hkv, b}, box {64, 64, 1, 1}  */
                           const __grid_constant__ CUtensorMap tmap_v,  /* {dv, sk, hkv, b}, box {64, 64, 1, 1} */
                           const __grid_constant__ CUtensorMap tmap_dq, /* fp32 {d, total_q, hq}, box {32, 16, 1} */
                           const __grid_constant__ CUtensorMap tmap_dk, /* {d, sk, hkv, b}, box {64, 64, 1, 1}: dK out  */
                           const __grid_constant__ CUtensorMap tmap_dv, /* {dv, sk, hkv, b}, box {64, 64, 1, 1}: dV out */
                           const fa_bwd_sm90_params prm,
                           const fa_dropout_params dropout /* read iff DROPOUT */) {
    using Cfg = fa_bwd_sm90_d256_config<CTAS>;
    using Half = fa_bwd_sm90_d256_half_config; /* Sᵀ and dPᵀ; also the probabilities' shape */
    static_assert(Cfg::HALF_M == 32, "dropout: one Philox call per lane covers 16 keys × 32 queries of a warp");
    constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, STAGES = Cfg::STAGES, COLS = Cfg::COLS;

    /* CTAS = 2: the pair (cluster ranks 0 and 1, blockIdx.x 2n and 2n + 1) shares key block n, CTA r
     * holding head-dim columns col_base = 256r .. 256r + 255 of every tile */
    const int rank = CTAS == 2 ? (int)cluster_ctarank() : 0;
    const int col_base = Cfg::D * rank;
    const int key_block = (int)blockIdx.x / CTAS;
    /* deterministic mode: highest key block first (bwd_sm90_common.cuh, "deterministic dQ") */
    const int n_block = DET ? (int)(gridDim.x / CTAS - 1) - key_block : key_block;
    const int n0 = n_block * BLOCK_N, batch = blockIdx.z;
    const fa_bwd_sm90_heads heads = fa_bwd_sm90_cta_heads(prm); /* group_splits = 1 here: the whole group */
    const int head_kv = heads.kv;
    const bool varlen = prm.cu_seqlens_q != nullptr;
    const fa_seq_rows seq = fa_sequence_rows(prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q, prm.total_k,
                                             prm.seqlen_q, prm.seqlen_k, batch);
    const int len_q = seq.len_q, len_k = seq.len_k, shift = len_k - len_q;
    if (n0 >= len_k) return; /* past this sequence's keys: nothing to do (uniform over the CTA) */
    /* first packed row of the sequence in the pre-pass vectors and the dQ accumulator */
    const int64_t q_packed0 = varlen ? seq.q_start : (int64_t)batch * prm.seqlen_q;
    int m_first, n_m;
    fa_bwd_sm90_query_blocks(prm, n0, BLOCK_M, BLOCK_N, len_q, len_k, shift, m_first, n_m);
    const fa_bwd_sm90_walk walk = fa_bwd_sm90_walk_of<DET>(prm, m_first, n_m, n_block, len_k, BLOCK_N);
    const int iterations = prm.heads_per_split * n_m;
    const int warpgroup = threadIdx.x / 128;

    if (iterations == 0) {
        /* no query row sees these keys: dK = dV = 0 (uniform over the CTA, before any barrier) */
        if (warpgroup > 0) {
            const int tid = threadIdx.x % 128;
            float zero_rmem[COLS / 2];
#pragma unroll
            for (int i = 0; i < COLS / 2; ++i) zero_rmem[i] = 0.0f;
            fa_bwd_sm90_store_dkdv_rows<COLS, BF16>(prm, zero_rmem, zero_rmem, n0 + 16 * (tid / 32) + (tid % 32) / 4,
                                                    len_k, seq.k_start, batch, head_kv, col_base + COLS * (warpgroup - 1),
                                                    2 * (tid % 4), prm.cu_seqlens_q != nullptr);
        }
        return;
    }

    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t smem = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t k_smem = smem + Cfg::K_OFFSET, v_smem = smem + Cfg::V_OFFSET;
    auto q_stage = [&](int s) -> uint32_t { return smem + Cfg::Q_OFFSET + (uint32_t)s * Cfg::Q_BYTES; };
    const uint32_t do_smem = smem + Cfg::DO_OFFSET; /* the one dO buffer */
    /* LSE2 and D [STAGES][BLOCK_M] fp32 as 32-bit shared addresses */
    const uint32_t lse2_smem = smem + Cfg::LSE_OFFSET, dvec_smem = smem + Cfg::DVEC_OFFSET;
    const uint32_t bars = smem + Cfg::BAR_OFFSET;
    const uint32_t kv_full = bars;
    auto stage_full = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + s); };
    const uint32_t do_full = bars + 8u * (uint32_t)(1 + STAGES);
    auto stage_empty = [&](int s, int c) -> uint32_t {
        return bars + 8u * (uint32_t)(2 + STAGES + s * Cfg::CONSUMER_WGS + c);
    };
    auto do_empty = [&](int c) -> uint32_t {
        return bars + 8u * (uint32_t)(2 + STAGES + STAGES * Cfg::CONSUMER_WGS + c);
    };
    /* CTAS = 2: xchg_full[c] (1 arrival: consumer c's thread 0 arming the next message with its
     * bytes, + the peer's st.async bytes) and xchg_free[c] (4 arrivals: the peer's consumer c warps
     * have read our last message from their buffer) */
    auto xchg_full = [&](int c) -> uint32_t {
        return bars + 8u * (uint32_t)(2 + STAGES + STAGES * Cfg::CONSUMER_WGS + Cfg::CONSUMER_WGS + c);
    };
    auto xchg_free = [&](int c) -> uint32_t {
        return bars + 8u * (uint32_t)(2 + STAGES + STAGES * Cfg::CONSUMER_WGS + 2 * Cfg::CONSUMER_WGS + c);
    };

    if (threadIdx.x == 0) {
        mbarrier_init(kv_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(stage_full(s), Cfg::FULL_ARRIVALS);
            for (int c = 0; c < Cfg::CONSUMER_WGS; ++c) mbarrier_init(stage_empty(s, c), Cfg::EMPTY_ARRIVALS);
        }
        mbarrier_init(do_full, 1);
        for (int c = 0; c < Cfg::CONSUMER_WGS; ++c) mbarrier_init(do_empty(c), Cfg::EMPTY_ARRIVALS);
        if constexpr (CTAS == 2)
            for (int c = 0; c < Cfg::CONSUMER_WGS; ++c) {
                mbarrier_init(xchg_full(c), 1);
                mbarrier_init(xchg_free(c), 4);
            }
        fence_mbarrier_init_release_cluster();
        if constexpr (CTAS == 2) /* message 0's bytes expected */
            for (int c = 0; c < Cfg::CONSUMER_WGS; ++c)
                mbarrier_arrive_expect_tx(xchg_full(c), FA_BWD_SM90_PAIR_MSG_BYTES);
    }
    /* every thread sees initialised barriers before any wait or arrive; a pair: the peer's too,
     * before any remote store or arrival */
    if constexpr (CTAS == 2) cluster_sync();
    else __syncthreads();

    /* TMA coordinates: varlen maps are {d, total, heads, 1} */
    const int k_row = (varlen ? (int)seq.k_start : 0) + n0;
    const int q_row0 = varlen ? (int)seq.q_start : 0;
    const int tma_batch = varlen ? 0 : batch;

    if (warpgroup == 0) {
        /* ================= producer ================= */
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        /* Deterministic mode: the warp index is lane 0's, which ptxas knows to be warp-uniform;
         * with threadIdx.x / 32 the branch to the turn keepers made it spill the consumers'
         * loop-invariant values (softcap at buckets 64 and 256, ptxas 13). */
        const int warp = DET ? __shfl_sync(0xffffffffu, threadIdx.x / 32, 0) : threadIdx.x / 32;
        const int lane = threadIdx.x % 32;
        if (warp == 0) {
            fa_bwd_sm90_load<Cfg, false, DET>(&tmap_q, &tmap_do, &tmap_k, &tmap_v, prm, smem, seq, q_packed0, batch,
                                              heads, k_row, q_row0, tma_batch, walk, len_q, lane,
                                  [&](int s, int phase) {
                /* both consumers have released the stage (each on its own barrier) */
                mbarrier_wait_parity(stage_empty(s, 0), phase);
                mbarrier_wait_parity(stage_empty(s, 1), phase);
            },
                                  [&](int phase) {
                mbarrier_wait_parity(do_empty(0), phase);
                mbarrier_wait_parity(do_empty(1), phase);
            }, nullptr, 0, col_base);
        } else if (DET && warp <= Cfg::CONSUMER_WGS) {
            /* the whole warp: turn keeper of consumer warp - 1's dQ columns (piece 2·rank + warp - 1) */
            fa_bwd_sm90_dq_turn_keeper(prm, walk, BLOCK_M, BLOCK_N, batch, heads, len_q, len_k, shift, warp - 1,
                                       Cfg::CONSUMER_WGS * rank + warp - 1, Cfg::CONSUMER_WGS * CTAS, lane);
        }
        return;
    }

    /* ================= consumers ================= */
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    /* from lane 0, which ptxas knows to be warp-uniform: the shared-memory descriptors that
     * depend on the consumer are then formed in uniform registers, not per thread and moved over
     * by R2UR before every wgmma */
    const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int ct = threadIdx.x - 128; /* 0..255 over both consumers */
    /* this thread's accumulator rows (keys): key0 and key0 + 8; columns (queries, or head-dim
     * columns col0 + ...) 8j + 2(l%4) + {0,1} */
    const int key0 = n0 + 16 * warp + lane / 4;
    const int col_in = 2 * (lane % 4);
    const int col_local = COLS * consumer; /* this consumer's columns in the CTA's tiles */
    const int col0 = col_base + col_local; /* ... and of the head */
    const uint32_t col_slab_off = (uint32_t)(col_local / 64) * Cfg::Q_SLAB_BYTES; /* in a Q/dO stage */
    const uint32_t k_cols = k_smem + (uint32_t)(col_local / 64) * Cfg::KV_SLAB_BYTES;
    const int half0 = Cfg::HALF_M * consumer; /* this consumer's queries of Sᵀ / dPᵀ within a block */
    const uint32_t half_off = (uint32_t)half0 * 128;                          /* their rows in a Q/dO slab */
    const uint32_t pds_smem = smem + Cfg::PDS_OFFSET;
    const uint32_t dq_warp_smem = smem + Cfg::DQ_OFFSET + (uint32_t)(4 * consumer + warp) * Cfg::DQ_WARP_BYTES;
    int dq_round = 0; /* this warp's staged reductions so far: buffer dq_round & 1 is next */
    /* CTAS = 2: message m of this consumer is Sᵀ of iteration t for m = 2t, dPᵀ for 2t + 1
     * (fa_pair_exchange: our xchg_full[c] / xchg_free[c] and the peer's) */
    [[maybe_unused]] fa_pair_link link = {};
    if constexpr (CTAS == 2)
        link = fa_pair_link_of(smem + Cfg::XCHG_OFFSET + (uint32_t)consumer * FA_BWD_SM90_PAIR_MSG_BYTES,
                               xchg_full(consumer), xchg_free(consumer), tid, (uint32_t)rank ^ 1u);
    auto pair_exchange = [&](float(&x_rmem)[Cfg::HALF_M / 2], int msg, bool last) {
        fa_pair_exchange<FA_BWD_SM90_PAIR_V4>(link, x_rmem, msg, last, tid, lane);
    };
    if (lane == 0) tma_prefetch_tensormap(&tmap_dq);
    /* Query block m0 needs the mask iff m0 < mask_m_lo or m0 > mask_m_hi: the keys [n0, n0 + 63]
     * run past the sequence (always), or the last key is right of the first row's window, or the
     * first key left of the last row's window. */
    const int last_key = n0 + BLOCK_N - 1;
    const int mask_m_lo = last_key >= len_k           ? INT_MAX
                          : prm.window_right >= 0 ? last_key - shift - prm.window_right
                                                  : INT_MIN;
    const int mask_m_hi = prm.window_left >= 0 ? n0 - (BLOCK_M - 1) - shift + prm.window_left : INT_MAX;
    const int mask_base = key0 - shift - col_in - half0; /* key0 - shift - (query - m0 - 8j - c) */

    /* dK and dV of this consumer's columns: the loop adds into them, the epilogue stores them */
    float dk_rmem[COLS / 2], dv_rmem[COLS / 2];

#pragma unroll
    for (int i = 0; i < COLS / 2; ++i) {
        dk_rmem[i] = 0.0f;
        dv_rmem[i] = 0.0f;
    }

    mbarrier_wait_parity(kv_full, 0);
    if (varlen && n0 + BLOCK_N > len_k)
        fa_bwd_sm90_zero_kv_tail<Cfg>(k_smem, v_smem, len_k - n0, ct, FA_HBWD256_BAR_KV_TAIL);

    auto consumer_loop = [&]() { /* the consumer's iterations */
        /* iteration t = head_i · n_m + walk_i, counted along (no division by the runtime n_m) */
        int walk_i = 0, head_i = 0;
        for (int t = 0; t < iterations; ++t) {
            const int s = t % STAGES, use = t / STAGES;
            const int head = heads.first + head_i, m0 = fa_bwd_sm90_walk_block<DET>(walk, walk_i) * BLOCK_M;
            /* this thread's pairs of queries half0 + 8j + col_in, + 1 start at these addresses (+32 B per j) */
            const uint32_t lse2_pair = lse2_smem + (uint32_t)(s * BLOCK_M + half0 + col_in) * 4;
            const uint32_t dvec_pair = dvec_smem + (uint32_t)(s * BLOCK_M + half0 + col_in) * 4;
            const uint32_t p_tile =
                pds_smem + (uint32_t)(Cfg::SCORE_BUFFERS == 2 ? t & 1 : 0) * Cfg::SCORE_TILES * Cfg::TILE_BYTES;
            const uint32_t ds_tile = p_tile + Cfg::TILE_BYTES;

            float s_rmem[Cfg::HALF_M / 2], dp_rmem[Cfg::HALF_M / 2];
            uint32_t frag_rmem[Cfg::HALF_M / 16][4];

            mbarrier_wait_parity(stage_full(s), use & 1);
            if (varlen && m0 + BLOCK_M > len_q) {
                /* Q/dO rows past the sequence -> 0 (uniform over both consumers in this iteration;
                 * both read every column of the stage) */
                mbarrier_wait_parity(do_full, t & 1);
                fa_bwd_sm90_zero_rows(q_stage(s), Cfg::Q_SLAB_BYTES, Cfg::SLABS, BLOCK_M, len_q - m0, ct);
                fa_bwd_sm90_zero_rows(do_smem, Cfg::Q_SLAB_BYTES, Cfg::SLABS, BLOCK_M, len_q - m0, ct);
                fence_proxy_async_shared_cta();
                bar_sync(FA_HBWD256_BAR_Q_TAIL, 256);
            }
            /* this consumer's queries only: Sᵀ and dPᵀ [64 keys, HALF_M queries] */
            fa_bwd_sm90_issue_abt<Half, BF16>(s_rmem, k_smem, q_stage(s) + half_off); /* group: Sᵀ  */
            /* dropout: the keep bits of this warp's 16 keys × 32 queries while Sᵀ is computed */
            [[maybe_unused]] uint32_t keep = 0; /* read only by the DROPOUT instantiations */
            if constexpr (DROPOUT)
                keep = fa_dropout_keep_kq4(dropout, batch, head, prm.heads_q, key0 - lane / 4, m0 + half0);
            mbarrier_wait_parity(do_full, t & 1);                                           /* dO of this iteration */
            fa_bwd_sm90_issue_abt<Half, BF16>(dp_rmem, v_smem, do_smem + half_off);     /* group: dPᵀ */

            wgmma_wait_group<1>(); /* Sᵀ ready; dPᵀ may still run */
#pragma unroll
            for (int i = 0; i < Cfg::HALF_M / 2; ++i) wgmma_fence_operand(s_rmem[i]);
            if constexpr (CTAS == 2) pair_exchange(s_rmem, 2 * t, false); /* + the peer's columns */
            /* softcap: Sᵀ -> tc = tanh(Sᵀ·scale / softcap) before the mask, which then writes tc = -inf */
            if constexpr (SOFTCAP) fa_bwd_sm90_softcap_tanh(s_rmem, prm.softcap_pre);

            /* mask: -inf into Sᵀ (softcap: into tc), or into the exponent (LOG2, fa_bwd_sm90_probs_log2) */
            const bool needs_mask = m0 < mask_m_lo || m0 > mask_m_hi;
            if constexpr (!LOG2) {
                if (needs_mask) fa_bwd_sm90_mask<Cfg::HALF_M>(s_rmem, prm, mask_base - m0, key0, len_k);
            }
            if constexpr (SOFTCAP) {
                /* P packed, s_rmem keeps w = P·(1 - tc²) (bwd_sm90_common.cuh) */
                fa_bwd_sm90_softcap_probs_w<Half, BF16>(s_rmem, frag_rmem, lse2_pair, prm.softcap_post_log2);
            } else {
                if constexpr (LOG2)
                    fa_bwd_sm90_probs_log2<Cfg::HALF_M>(s_rmem, prm, needs_mask, mask_base - m0, key0, len_k, lse2_pair,
                                                        fa_bwd_sm90_alibi_slope(prm, batch, head));
                else
                    fa_bwd_sm90_probs<Cfg::HALF_M>(s_rmem, prm.scale_log2, lse2_pair);
                fa_bwd_sm90_pack<Half, BF16>(s_rmem, frag_rmem);
            }
            if constexpr (DROPOUT) fa_bwd_sm90_d256_clear_dropped(frag_rmem, keep); /* keep∘P for dV */
            /* one score buffer: both consumers' GEMMs of iteration t - 1 (which read it) have retired */
            if constexpr (Cfg::SCORE_BUFFERS == 1)
                if (t > 0) bar_sync(FA_HBWD256_BAR_PDS_EMPTY, 256);
            fa_bwd_sm90_d256_store_half(p_tile, frag_rmem, warp, lane, half0); /* Pᵀ, this consumer's queries */

            wgmma_wait_group<0>(); /* dPᵀ ready */
#pragma unroll
            for (int i = 0; i < Cfg::HALF_M / 2; ++i) wgmma_fence_operand(dp_rmem[i]);
            if constexpr (CTAS == 2) pair_exchange(dp_rmem, 2 * t + 1, t + 1 == iterations);
            if constexpr (DROPOUT) { /* dPᵀ -> Z∘dPᵀ (a factor 1 or 0: a NaN stays NaN) */
#pragma unroll
                for (int i = 0; i < Cfg::HALF_M / 2; ++i)
                    dp_rmem[i] *= ((keep >> i) & 1u ? 1.0f : 0.0f) * dropout.keep_scale;
            }
            /* dS = P ∘ (dP - D) (P in fp32; softcap: w = P·(1 - tc²) in its place) */
#pragma unroll
            for (int j = 0; j < Cfg::HALF_M / 8; ++j) {
                const float2 dv2 = ld_shared_v2_f32(dvec_pair + 32 * j);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    dp_rmem[4 * j + 2 * h] = s_rmem[4 * j + 2 * h] * (dp_rmem[4 * j + 2 * h] - dv2.x);
                    dp_rmem[4 * j + 2 * h + 1] = s_rmem[4 * j + 2 * h + 1] * (dp_rmem[4 * j + 2 * h + 1] - dv2.y);
                }
            }
            fa_bwd_sm90_pack<Half, BF16>(dp_rmem, frag_rmem);
            fa_bwd_sm90_d256_store_half(ds_tile, frag_rmem, warp, lane, half0); /* dSᵀ, this consumer's queries */

            /* stmatrix writes (generic proxy) -> wgmma reads (async proxy): each writer fences, then
             * both consumers meet: every GEMM below reads both halves of the tiles */
            fence_proxy_async_shared_cta();
            bar_sync(FA_HBWD256_BAR_PDS_FULL, 256);

            float dq_rmem[COLS / 2];
            fa_bwd_sm90_d256_issue_tile<BF16, false>(dv_rmem, p_tile, do_smem + col_slab_off, Cfg::Q_SLAB_BYTES,
                                                     1); /* dV_c += Pᵀ dO */
            fa_bwd_sm90_d256_issue_tile<BF16, true>(dq_rmem, ds_tile, k_cols, Cfg::KV_SLAB_BYTES, 0); /* dQ_c = dS K */
            fa_bwd_sm90_d256_issue_tile<BF16, false>(dk_rmem, ds_tile, q_stage(s) + col_slab_off, Cfg::Q_SLAB_BYTES,
                                                     1); /* dK_c += dSᵀ Q */
            wgmma_wait_group<2>(); /* dV_c retired: this consumer is done with dO (the next one loads now) */
            mbarrier_arrive(do_empty(consumer));
            wgmma_wait_group<1>(); /* dQ_c retired; dK_c runs under the staging */
#pragma unroll
            for (int i = 0; i < COLS / 2; ++i) wgmma_fence_operand(dq_rmem[i]);

            /* dQ_c into the fp32 accumulator [heads_q, total_q, d]: this warp's rows 16w .. 16w + 15 of
             * the query block (element 4j + 2h + c: row lane/4 + 8h, column col0 + 8j + col_in + c),
             * in four rounds of 32 columns through its two staging buffers, each round one bulk
             * tensor reduce-add by lane 0. Rows past the sequence are staged as zeros (they add into
             * the next sequence's rows, or fall outside the map); rounds past d are skipped. */
            if (m0 + BLOCK_M > len_q) {
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    if (m0 + 16 * warp + lane / 4 + 8 * h >= len_q)
#pragma unroll
                        for (int j = 0; j < COLS / 8; ++j) {
                            dq_rmem[4 * j + 2 * h] = 0.0f;
                            dq_rmem[4 * j + 2 * h + 1] = 0.0f;
                        }
            }
            /* deterministic mode: the higher key blocks have added these columns (the turn keeper
             * acquired at gpu scope, then arrived on DQ_TURN); lane 0's bulk reductions come after
             * that acquire */
            if constexpr (DET) {
                bar_sync(FA_HBWD_BAR_DQ_TURN + consumer, FA_HBWD_DQ_TURN_THREADS);
                if (lane == 0) fence_proxy_async_global();
            }
            const int dq_row = (int)q_packed0 + m0 + 16 * warp;
#pragma unroll
            for (int r = 0; r < COLS / 32; ++r) {
                if (col0 + 32 * r >= prm.head_dim) break; /* uniform: the columns past d are never added */
                const uint32_t buf = dq_warp_smem + (uint32_t)(dq_round & 1) * Cfg::DQ_BUF_BYTES;
                ++dq_round;
                /* the reduction that read this buffer two rounds ago is done reading it */
                if (lane == 0) tma_store_wait_group_read<1>();
                __syncwarp();
                /* element pair (j = 4r + jj, h): row lane/4 + 8h, 16-byte chunk 2jj + (lane%4)/2
                 * swizzled by the row's bits 0-2, +8 bytes for odd lanes; in step jj odd rows store
                 * block jj ^ FA_BWD_SM90_DQ_SWAP (above: no bank twice per half-warp) */
                const bool odd_row = fa_bwd_sm90_dq_odd_row(lane);
#pragma unroll
                for (int jj = 0; jj < 4; ++jj)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t row = (uint32_t)(lane / 4 + 8 * h);
                        const int jj_odd = jj ^ FA_BWD_SM90_DQ_SWAP, b = odd_row ? jj_odd : jj;
                        const uint32_t chunk = (uint32_t)(2 * b + (lane % 4) / 2) ^ (row & 7u);
                        const int e = 4 * (4 * r + jj) + 2 * h, e_odd = 4 * (4 * r + jj_odd) + 2 * h;
                        st_shared_v2_f32(buf + row * 128 + chunk * 16 + 8u * (lane & 1), odd_row ? dq_rmem[e_odd] : dq_rmem[e],
                                         odd_row ? dq_rmem[e_odd + 1] : dq_rmem[e + 1]);
                    }
                /* generic-proxy stores -> the bulk reduction (async proxy) */
                fence_proxy_async_shared_cta();
                __syncwarp();
                if (lane == 0) {
                    tma_reduce_add_3d(&tmap_dq, buf, col0 + 32 * r, dq_row, head);
                    tma_store_commit_group();
                }
            }
            if constexpr (DET) {
                /* the additions are written (not only read) before the keeper passes the turn on */
                if (lane == 0) {
                    tma_store_wait_group<0>();
                    fence_proxy_async_global();
                }
                __syncwarp();
                bar_arrive(FA_HBWD_BAR_DQ_DONE + consumer, FA_HBWD_DQ_TURN_THREADS);
            }

            wgmma_wait_group<0>(); /* dK_c retired */
#pragma unroll
            for (int i = 0; i < COLS / 2; ++i) {
                wgmma_fence_operand(dk_rmem[i]);
                wgmma_fence_operand(dv_rmem[i]);
            }
            /* this thread's reads of stage s (GEMMs retired, LSE2/D loads used) are done: release */
            mbarrier_arrive(stage_empty(s, consumer));
            if (++walk_i == n_m) {
                walk_i = 0;
                ++head_i;
            }
        }
    };
    consumer_loop();
    if (lane == 0) tma_store_wait_group_read<0>(); /* the staging is read before the CTA exits */
    if constexpr (DROPOUT) { /* dV = Σ (keep∘P)ᵀ dO: the keep scale of Z, once */
#pragma unroll
        for (int i = 0; i < COLS / 2; ++i) dv_rmem[i] *= dropout.keep_scale;
    }

    /* both consumers' slabs of dK / dV [64 keys, 256] through the Q stages */
    fa_bwd_sm90_epilogue_dkdv<Cfg::SLABS, BLOCK_N, COLS / 64, BF16>(
        &tmap_dk, &tmap_dv, prm, dk_rmem, dv_rmem, smem + Cfg::Q_OFFSET, consumer, tid, 0, COLS / 64 * consumer, n0,
        len_k, seq.k_start, batch, col_base);
}

/* ---- host ------------------------------------------------------------------------------------ */

template <bool BF16, bool SOFTCAP, bool LOG2, bool DROPOUT, int CTAS>
static fa_status fa_bwd_sm90_d256_launch(const fa_bwd_params *p, const fa_dropout_params *dropout, int device_ordinal,
                                         cudaStream_t stream) {
    using Cfg = fa_bwd_sm90_d256_config<CTAS>;
    static const char *const path = CTAS == 2 ? "the Hopper backward (d = 512)" : "the Hopper backward (d = 256)";
    const int64_t rows_q = p->cu_seqlens_q != nullptr ? p->total_q : p->seqlen_q;
    const int64_t rows_k = p->cu_seqlens_q != nullptr ? p->total_k : p->seqlen_k;
    if (rows_q == 0 || rows_k == 0) return FA_OK; /* bwd.cu never launches an empty grid */
    CUtensorMap tmap_q, tmap_do, tmap_k, tmap_v, tmap_dq, tmap_dk, tmap_dv;
    fa_status st;
    int dkdv_tma;
    if ((st = fa_bwd_sm90_make_maps(p, BF16, Cfg::BLOCK_M, Cfg::BLOCK_N, path, &tmap_q, &tmap_do, &tmap_k, &tmap_v)) !=
            FA_OK ||
        (st = fa_hopper_make_accum_map(&tmap_dq, path, p->dq_accum, p->head_dim, p->total_q, p->heads_q, 16)) != FA_OK ||
        (st = fa_bwd_sm90_dkdv_maps(p, BF16, path, &tmap_k, &tmap_dk, &tmap_dv, &dkdv_tma)) != FA_OK)
        return st;
    const bool det = p->dq_semaphore != nullptr;
    auto kernel = det ? fa_bwd_sm90_d256_main_kernel<BF16, SOFTCAP, LOG2, true, DROPOUT, CTAS>
                      : fa_bwd_sm90_d256_main_kernel<BF16, SOFTCAP, LOG2, false, DROPOUT, CTAS>;
    static unsigned long long configured[2] = {0, 0};
    if ((st = fa_bwd_sm90_opt_in_smem(kernel, Cfg::SMEM_BYTES, device_ordinal, &configured[det])) != FA_OK) return st;
    fa_bwd_sm90_params prm = fa_bwd_sm90_make_params(p);
    prm.query_blocks = (p->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M;
    prm.dkdv_tma = dkdv_tma;
    const int64_t key_blocks = (p->seqlen_k + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N;
    if (key_blocks == 0) return FA_OK;
    if (p->group_splits != 1 || p->heads_per_split != p->group)
        return fa_set_error(FA_ERR_INVALID_SIZE, "%s: the kv group is not split at buckets 256 and 512", path);
    /* rotated walks need every CTA of a sequence resident: a pair is two per key block */
    if ((st = fa_bwd_sm90_set_rotation(&prm, false, det, key_blocks * CTAS)) != FA_OK) return st;
    if (key_blocks > INT32_MAX / CTAS || p->heads_kv > FA_CUDA_GRID_YZ_MAX || p->batch > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE, "%s: grid (%lld key blocks, %d kv heads, %d sequences) too large",
                            path, (long long)key_blocks, p->heads_kv, p->batch);
    const dim3 grid((unsigned)(key_blocks * CTAS), (unsigned)p->heads_kv, (unsigned)p->batch);
    const fa_dropout_params drop = dropout != nullptr ? *dropout : fa_dropout_params{};
    /* CTAS = 2: clusters of two CTAs along x, the pair of one key block */
    FA_CUDA_CHECK(fa_cuda_launch_clusters(kernel, grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream, CTAS, tmap_q, tmap_do,
                                          tmap_k, tmap_v, tmap_dq, tmap_dk, tmap_dv, prm, drop),
                  "Hopper backward (d = 256 / 512) kernel launch");
    FA_CUDA_CHECK_LAUNCH("Hopper backward (d = 256 / 512) kernel launch");
    return FA_OK;
}

/* The problem's dtype and score path (fa_bwd_sm90_dispatch); CTAS = 2 at bucket 512; MLA's
 * 192 / 128 runs bwd_sm90_hdim192.cu where the plan chose it (dq_tile_cols = 192,
 * fa_hopper_bwd_d192), else this kernel. */
template <int CTAS>
static fa_status fa_bwd_sm90_d256_launch_ctas(const fa_bwd_params *prm, const fa_dropout_params *dropout, bool bf16,
                                              int device_ordinal, cudaStream_t stream) {
    if (CTAS == 1 && prm->dq_tile_cols == 192)
        return fa_bwd_launch_hopper192(prm, bf16 ? FA_DTYPE_BF16 : FA_DTYPE_F16, device_ordinal, stream);
    return fa_bwd_sm90_dispatch(prm, dropout != nullptr, bf16, [&](auto bf16_t, auto softcap, auto log2, auto drop) {
        constexpr bool BF16 = decltype(bf16_t)::value, SOFTCAP = decltype(softcap)::value;
        constexpr bool LOG2 = decltype(log2)::value, DROPOUT = decltype(drop)::value;
        return fa_bwd_sm90_d256_launch<BF16, SOFTCAP, LOG2, DROPOUT, CTAS>(prm, dropout, device_ordinal, stream);
    });
}

extern "C" fa_status fa_bwd_launch_hopper256(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                             int device_ordinal, cudaStream_t stream) {
    const int bucket = fa_hopper_bwd_bucket(prm->head_dim, prm->head_dim_v);
    if (bucket != 256 && bucket != 512)
        return fa_set_error(FA_ERR_HEAD_DIM,
                            "head_dim = %d, head_dim_v = %d: not the Hopper backward's bucket 256 or 512",
                            prm->head_dim, prm->head_dim_v);
    const bool bf16 = dtype == FA_DTYPE_BF16;
    return bucket == 512 ? fa_bwd_sm90_d256_launch_ctas<2>(prm, dropout, bf16, device_ordinal, stream)
                         : fa_bwd_sm90_d256_launch_ctas<1>(prm, dropout, bf16, device_ordinal, stream);
}
