/*
 * bwd_sm90.cu: the backward main kernel for Hopper (sm_90a), FlashAttention-3's design in
 * our own code: TMA loads, wgmma, warp specialisation, dK/dV accumulated in registers across the
 * query loop, dQ staged in shared memory and added into an fp32 accumulator in global memory by
 * bulk reduce-adds. Compiled for `arch=compute_90a,code=sm_90a` only
 * (the Makefile's *_sm90a.cu rule). bwd.cu runs its pre-pass (D = rowsum(dO∘O), dsink
 * partials), the zeroing of the dQ accumulator and the conversions around it, exactly as around
 * the portable main kernel; fa_bwd_launch_hopper() replaces only the main kernel, for the
 * problems fa_hopper_bwd_unsupported() (sm90_tiles.h) accepts. This kernel reads the forward's
 * LSE itself, so the workspace holds no LSE·log2e copy. First run on the H200 as
 * an experiment (docs/tuning-log.md, Hopper backward).
 *
 * Covers: f16 / bf16; d and dv multiples of 8 in 64..128, the larger one's bucket (64 or 128: columns past
 * d or dv read as zeros, never written; bucket 256 is bwd_sm90_hdim256.cu's); MHA / GQA / MQA; fixed-length and varlen batches;
 * causal (bottom-right) and sliding windows (window sides, causal folded in); sink logits (the
 * pre-pass's dsink; the main kernel only sees the LSE, which includes the sink); softcap (the
 * SOFTCAP instantiations, see below); ALiBi and any sign of the scale without softcap
 * (the LOG2 instantiations, fa_bwd_sm90_probs_log2: the mask acts on the exponent). Deterministic mode
 * (template DET): the same kernel with each dQ tile's additions ordered by key block, highest
 * first (bwd_sm90_common.cuh, "deterministic dQ"): the grid runs key block
 * gridDim.x - 1 - blockIdx.x and two dQ writers (producer warps 1 and 2, alternate iterations)
 * wait for each tile's turn before its reduce-adds and pass it on once they are written
 * (fa_bwd_sm90_dq_writer).
 *
 * Semantics (include/flashattn.h, fa_backward): with P = exp(S - LSE), S = scale·Q Kᵀ masked,
 * D = rowsum(dO∘O): dV = Pᵀ dO, dP = dO Vᵀ, dS = P∘(dP - D), dQ = scale·dS K, dK = scale·dSᵀ Q,
 * dK/dV summed over the query heads of a kv group. A row with LSE = -inf contributes nothing.
 * Softcap: S = softcap·tanh(scale·Q Kᵀ / softcap) and dS = P∘(dP - D)∘(1 - tanh²).
 *
 * One CTA = BLOCK_N = 128 keys [n0, n0 + 128) of one (kv head, batch); grid (key blocks,
 * heads_kv, batch); 384 threads:
 *   warpgroup 0, producer (setmaxnreg 24), warp 0: lane 0 issues K and V of the key block once
 *     (kv_full), then for every iteration t = (query head of the group, query block; query block
 *     fastest) Q_t and dO_t [BLOCK_M, bucket] by TMA into stage t % STAGES of a ring
 *     (stage_full / stage_empty mbarriers); meanwhile the warp's 32 lanes load the rows'
 *     LSE·log2e (from the forward's LSE; +inf where LSE = -inf) and D (the pre-pass's) into the
 *     stage with st.shared: +inf and 0 for rows past the sequence (so P = 0 there);
 *   warp 1, the dQ writer: per iteration, adds the two staged dQ pieces into the accumulator
 *     with cp.reduce.async.bulk (one instruction per piece of 16 KiB, 20 KiB with 80 rows,
 *     instead of one red.global per element pair from 256 threads: half the L2 reduction
 *     traffic, and the consumers' issue slots stay on the GEMMs; FlashAttention-3/4's
 *     design). The accumulator is tiled in the
 *     register order of the dQ GEMM's accumulator (sm90_tiles.h, fa_hopper_bwd_dq_tile_cols), so a
 *     piece is staged by eight 16-byte stores per thread and added as one contiguous block;
 *     bwd.cu's conversion kernel puts the rows in order. Deterministic mode: warps 1 and 2
 *     write alternate iterations; warp 3 (and 2 otherwise) exits;
 *   warpgroups 1 and 2, consumers (setmaxnreg 240): consumer c owns keys n0 + 64c .. +63; its
 *     dK_c and dV_c [64, bucket] stay in fp32 registers over all iterations; after the last one
 *     they go out through shared memory (the Q / dO stages, free then) by the TMA store, or by
 *     coalesced stores for varlen batches (fa_bwd_sm90_epilogue_dkdv).
 * Query blocks no key of the block can see (causal, window) are skipped: the loop runs over
 * [q_lo, q_hi) of fa_hopper_bwd_query_range.
 *
 * GEMM orientation (M = 64 rows per warpgroup; A from registers only in K-major form; B from
 * shared memory K-major or, for 16-bit types, MN-major with imm-trans-b = 1):
 *   Sᵀ  = K_c Qᵀ     SS   A = K rows of c, B = Q, both K-major over d            N = BLOCK_M
 *   dPᵀ = V_c dOᵀ    SS   A = V rows of c, B = dO, both K-major over d           N = BLOCK_M
 *   dV_c += Pᵀ dO    RS   A = Pᵀ from registers: the fp32 accumulator of Sᵀ (keys × queries)
 *                         packed to 16 bits is the A fragment of a GEMM with K = queries;
 *                         B = dO [queries, d] MN-major (trans-b), the forward's V operand  N = bucket
 *   dK_c += dSᵀ Q    RS   the same with dSᵀ and Q                                N = bucket
 *   dQ  = dS K       SS   dS with queries as rows is the transpose of the registers; each
 *                         consumer writes its dSᵀ with stmatrix.trans into a shared dS tile
 *                         [BLOCK_M queries, 128 keys] (keys contiguous: a K-major A, two 64-key
 *                         slabs, consumer c writes slab c); B = K [keys, d] MN-major (trans-b).
 *                         The consumers split dQ [BLOCK_M, bucket] into two m64 × n64 pieces
 *                         (rows 64c.. at BLOCK_M = 128, columns 64c.. at bucket 128).
 *   dQᵀ = Kᵀ dSᵀ     SS   BLOCK_M = 80 (ROWS80, sm90_tiles.h's fa_hopper_bwd_rows80: bucket 128
 *                         without a sliding window, softcap, LOG2, dropout or MODS): 80 is no
 *                         wgmma M, so consumer c computes the transposed piece of columns 64c..:
 *                         A = K slab c read MN-major along the keys (imm-trans-a), B = the same
 *                         dS tile as a K-major B, N = 80; the piece is staged and added the same
 *                         way, and bwd.cu's conversion transposes it back.
 *
 * FP8 (template flag; e4m3 q, k, v and dout, bucket 128 at 64 rows: sm90_tiles.h's
 * fa_hopper_bwd_fp8_ok): Sᵀ and dPᵀ are e4m3 wgmma (k32) on the codes as stored, K's and V's in
 * the V tile's two slabs (no 16-bit V), Q's and dO's in stages of their own loaded with the 16-bit
 * ones on the same stage barrier; q_descale · k_descale scales the exponent, v_descale ·
 * dout_descale dP inside dS; dV, dK and dQ read the dequantised 16-bit dO, Q and K as above.
 *
 * One consumer iteration t (stage s = t % STAGES):
 *   wait stage_full[s] (varlen: rows of Q and dO past the sequence zeroed, see below);
 *   issue Sᵀ and dPᵀ (two wgmma groups); wait for Sᵀ: mask, P = 2^(Sᵀ·scale·log2e - LSE2);
 *   (bucket 128: pack P, issue dV += Pᵀ dO); wait for dPᵀ: dS = P∘(dPᵀ - D); pack dS;
 *   stmatrix.trans dS into dS buffer t % 2; (bucket 64: issue dV); fence.proxy.async; named
 *   barrier DS_FULL (both halves of dS are in smem); issue the dQ piece, then dK += dSᵀ Q; wait
 *   for all but dK; named barrier DQ_EMPTY + c (the writer has read the previous piece); store the
 *   dQ piece into the staging (while dK runs); wait for dK; every consumer thread arrives on
 *   stage_empty[s]. The piece's fence.proxy.async and arrival on DQ_FULL + c follow the next
 *   iteration's Sᵀ and dPᵀ issue (after the loop for the last piece): the fence waits for the
 *   stores to drain, which would otherwise keep the tensor cores idle before that Sᵀ.
 * Softcap (template flag SOFTCAP; off, the kernel is the one above, instruction for instruction):
 * after the Sᵀ wait tc = tanh(Sᵀ·scale / softcap) in place of Sᵀ, then the mask (tc = -inf); tc,
 * not P, stays in the fp32 registers across the dPᵀ wait; then P, dS = P∘(1 - tc²)∘(dPᵀ - D)
 * together (bwd_sm90_common.cuh's softcap section) and dV is issued with dK at both buckets
 * (no EARLY_DV: P packed before the dPᵀ wait plus w = P·(1 - tc²) spilled 4 bytes at bucket 128
 * with ptxas 13; this way the consumers peak at R220 (128) and R237 (64), no spill).
 * Dropout (template flag DROPOUT; off, the kernel is the one above): the mask is regenerated on
 * Sᵀ. Per 8 query columns a warp's accumulator is a transposed m16n8 fragment (rows = 16 keys,
 * columns = 8 queries), and fa_dropout_keep_kq4 (common/dropout.cuh) gives the keep bits of four
 * such chunks with one Philox call per lane: the 16 keys of one Philox group are one column,
 * rows g and g + 8, so the eight lanes g of each t draw eight groups and an 8 × 8 bit transpose
 * of two bytes (three shuffles) hands every lane its bits. They are drawn right after the Sᵀ GEMM
 * is issued and before the dPᵀ one (integer work while the tensor cores run, without dPᵀ's
 * accumulator yet), bit i for element i. Then,
 * with Z = keep / (1 - p) and P recomputed whole from the LSE (the softmax without dropout):
 * dPᵀ -> Z∘dPᵀ before dS (dS = P∘(Z∘dP - D), D = rowsum(dO∘O) as the pre-pass computes it,
 * softcap's factor included), and dV takes keep∘P, its 1 / (1 - p) applied once when dV is
 * stored: the algebra of the portable kernels and the CPU engine.
 * Double-buffered dS needs no second barrier: consumer c writes buffer t % 2 only after passing
 * DS_FULL of iteration t-1, which the other consumer reaches only after its wait of iteration
 * t-2, the last GEMM that read buffer t % 2 (checked by a model of the protocol: docs/tuning-log.md).
 *
 * mbarriers: kv_full (1 arrival + K and V bytes; phase 0 only); stage_full[s] (33 arrivals:
 * producer lane 0's arrive.expect_tx with the Q and dO bytes before the TMA, then every lane of
 * warp 0 after its own vector stores); stage_empty[s] (256 arrivals: every consumer thread after
 * its last read of the stage). Each thread releases its own accesses: one lane arriving after
 * __syncwarp for the whole warp is also correct, but compute-sanitizer racecheck reports the
 * other lanes' accesses as hazards (it did, on the H200), and 32 arrivals cost next to nothing.
 * Use u of stage s (u = t / STAGES) is phase u:
 * consumers wait full with parity u & 1, producers wait empty with parity (u & 1) ^ 1 (passes at
 * once for u = 0).
 *
 * Shared memory (1024-byte aligned; every tile is 64-column slabs of 128-byte rows in the
 * 128-byte swizzle, each slab 1024-byte aligned; layout and descriptors as src/cuda/common/ptx.cuh's Hopper
 * section): K [SLABS][128][64] | V [SLABS][128][64] | Q [STAGES][SLABS][BLOCK_M][64] |
 * dO [STAGES][SLABS][BLOCK_M][64] | dS [2][2][BLOCK_M][64] | dQ staging [2][8][128][4] fp32 |
 * LSE2 [STAGES][BLOCK_M] fp32 | D [STAGES][BLOCK_M] fp32 | mbarriers. TMA maps view a tensor as
 * 4-D {d, rows, heads, batch} (varlen: {d, total, heads, 1}); one box {64, rows, 1, 1} at column
 * 64·s lands as slab s. The dQ staging holds each consumer's piece in the accumulator tile's
 * order ([store j][thread][4 floats]).
 *
 * Varlen: a key block or query block may run past its sequence into the next one (or into rows
 * after the last sequence, which may hold anything, NaN included). Those K/V rows (once, after
 * kv_full) and Q/dO rows (per iteration that needs it) are zeroed in shared memory by the
 * consumers before any GEMM reads them, so 0·NaN never reaches an accumulator; keys past the
 * sequence are masked and their dK/dV rows not written; query rows past it have P = 0 (LSE2 =
 * +inf) and dS = 0 (zero dO, D = 0); their dQ rows land in the padding of the sequence's last
 * accumulator tile, which is never read. Fixed-length batches get the same zeros from the TMA's
 * out-of-bounds fill.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <limits.h>
#include <math_constants.h>
#include <stdint.h>

#include "cuda/kernels/bwd_sm90_common.cuh"
#include "cuda/common/bwd_launch.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/tma.h"

/* ---- configuration --------------------------------------------------------------------------- */

template <int BUCKET, bool ROWS80 = false, bool FP8 = false>
struct fa_bwd_sm90_config {
    static constexpr int D = BUCKET;
    static constexpr int BLOCK_M = fa_hopper_bwd_block_m(BUCKET, ROWS80);
    static constexpr int BLOCK_N = fa_hopper_bwd_block_n(BUCKET);
    static constexpr int STAGES = fa_hopper_bwd_stages(BUCKET);
    static constexpr int DO_STAGES = fa_hopper_bwd_do_stages(BUCKET); /* = STAGES: dO shares Q's stage */
    static constexpr int CONSUMER_WGS = 2;
    static constexpr int THREADS = 128 * (1 + CONSUMER_WGS);
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
    static constexpr int SLABS = D / 64;
    static constexpr uint32_t KV_SLAB_BYTES = BLOCK_N * 128;
    static constexpr uint32_t KV_BYTES = KV_SLAB_BYTES * SLABS;   /* K or V */
    static constexpr uint32_t Q_SLAB_BYTES = BLOCK_M * 128;       /* Q, dO and dS slabs */
    static constexpr uint32_t Q_BYTES = Q_SLAB_BYTES * SLABS;     /* one Q or dO stage */
    static constexpr int V_SLABS = SLABS;                         /* V and dO: as K and Q */
    static constexpr uint32_t DO_BYTES = Q_BYTES;
    static constexpr uint32_t DS_BYTES = Q_SLAB_BYTES * (BLOCK_N / 64);
    static constexpr uint32_t VEC_BYTES = BLOCK_M * 4;            /* one LSE2 or D stage */
    static constexpr uint32_t K_OFFSET = 0;
    static constexpr uint32_t V_OFFSET = KV_BYTES;
    static constexpr uint32_t Q_OFFSET = 2 * KV_BYTES;
    static constexpr uint32_t DO_OFFSET = Q_OFFSET + STAGES * Q_BYTES;
    static constexpr uint32_t DS_OFFSET = DO_OFFSET + STAGES * Q_BYTES;
    /* dQ staging: per consumer its fp32 piece ([64, 64], or dQᵀ [64 columns, 80 rows]) in the
     * accumulator tile's register order (sm90_tiles.h, fa_hopper_bwd_dq_tile_cols): store j of thread
     * i at 16·(128j + i) */
    static constexpr bool DQ_TRANSPOSED = fa_hopper_bwd_dq_transposed(BLOCK_M);
    static constexpr uint32_t DQ_PIECE_BYTES = 4 * fa_hopper_bwd_dq_piece_elems(BLOCK_M, D); /* as bwd.cu reads them */
    static constexpr int DQ_ACC = DQ_PIECE_BYTES / (4 * 128); /* fp32 registers of a consumer's piece */
    static constexpr uint32_t DQ_OFFSET = DS_OFFSET + 2 * DS_BYTES;
    static constexpr uint32_t LSE_OFFSET = DQ_OFFSET + CONSUMER_WGS * DQ_PIECE_BYTES;
    static constexpr uint32_t DVEC_OFFSET = LSE_OFFSET + STAGES * VEC_BYTES;
    static constexpr uint32_t BAR_OFFSET = DVEC_OFFSET + STAGES * VEC_BYTES;
    static constexpr int NUM_BARRIERS = 1 + 2 * STAGES; /* kv_full, stage_full[S], stage_empty[S] */
    /* MODS with a block mask: per stage the iteration's position {h, tile, qb, entry}, written by
     * the producer before its arrival on stage_full, read by each consumer thread before its
     * arrival on stage_empty (fa_bwd_sm90_load); 16-byte aligned */
    static constexpr uint32_t POS_OFFSET = BAR_OFFSET + 8 * NUM_BARRIERS + 8 * (NUM_BARRIERS % 2);
    /* FP8 (sm90_tiles.h's fa_hopper_bwd_fp8_smem_bytes): e4m3 V and K in the V tile's slabs 0 and 1
     * (V's 16-bit slabs are not loaded), then e4m3 Q and dO stages [STAGES][BLOCK_M][128 B] */
    static constexpr uint32_t Q8_SLAB_BYTES = BLOCK_M * 128;
    static constexpr uint32_t Q8_OFFSET = (POS_OFFSET + 16 * STAGES + 1023) & ~1023u;
    static constexpr uint32_t DO8_OFFSET = Q8_OFFSET + STAGES * Q8_SLAB_BYTES;
    static constexpr uint32_t SMEM_BYTES = FP8 ? DO8_OFFSET + STAGES * Q8_SLAB_BYTES + 1024
                                               : POS_OFFSET + 16 * STAGES + 1024; /* + alignment slack */
    static constexpr uint32_t STAGE_TX = 2 * Q_BYTES + (FP8 ? 2 * Q8_SLAB_BYTES : 0);
    static constexpr int FULL_ARRIVALS = 1 + 32;            /* producer lane 0's expect_tx, then each lane after its stores */
    static constexpr int EMPTY_ARRIVALS = 128 * CONSUMER_WGS; /* every consumer thread after its reads */
    /* Issue dV += Pᵀ dO before dPᵀ is awaited (it then overlaps the dS arithmetic) at bucket 128
     * with 64 rows; with 128 rows (bucket 64) and 80 the fp32 P, dPᵀ (64 or 40 registers each) and
     * the in-flight 16-bit P do not fit 240 registers together (ptxas spilled 48 and 64 bytes),
     * so dV is issued with dK, after dS. */
    static constexpr bool EARLY_DV = BLOCK_M == 64;
    static constexpr int KEEP_WORDS = (BLOCK_M / 2 + 31) / 32; /* dropout: one bit per Sᵀ element of a thread */

    static_assert(BLOCK_N == 64 * CONSUMER_WGS, "each consumer owns 64 keys (wgmma M)");
    static_assert(DO_STAGES == STAGES, "Q and dO share each stage and its barriers");
    static_assert((DQ_TRANSPOSED ? D / 64 : (BLOCK_M / 64) * (D / 64)) == CONSUMER_WGS,
                  "dQ: one m64 x n64 piece (dQᵀ: m64 x n80) per consumer");
    static_assert(BLOCK_M % 16 == 0 && BLOCK_M <= 256,
                  "wgmma N of Sᵀ (and pairs of 8-query dropout chunks); TMA box rows <= 256");
    static_assert(CONSUMER_WGS * DQ_PIECE_BYTES == fa_hopper_bwd_dq_staging_bytes(BUCKET, ROWS80), "dQ staging");
    static_assert(CONSUMER_WGS * DQ_PIECE_BYTES == BLOCK_M * D * 4 && fa_hopper_bwd_dq_tile_cols(BUCKET, 0) == D,
                  "the pieces make one accumulator tile");
    static_assert(Q_SLAB_BYTES % 1024 == 0 && KV_SLAB_BYTES % 1024 == 0 && DS_OFFSET % 1024 == 0 &&
                      DQ_OFFSET % 1024 == 0,
                  "every slab on a 1024-byte swizzle atom (descriptor base offset 0)");
    static_assert(fa_hopper_regs_split_ok(THREADS, PRODUCER_REGS, CONSUMER_REGS),
                  "setmaxnreg: .dec / .inc from the launch cap, within the CTA's register pool");
    static_assert(SMEM_BYTES == (FP8 ? fa_hopper_bwd_fp8_smem_bytes() : fa_hopper_bwd_smem_bytes(BUCKET, ROWS80)),
                  "sm90_tiles.h agrees with the layout");
    static_assert(!FP8 || (BUCKET == 128 && !ROWS80 && SLABS == 2), "fp8: bucket 128 at 64 rows (K and V codes: one slab each)");
    static_assert(POS_OFFSET % 16 == 0 && BAR_OFFSET % 16 == 0, "16-byte position slots");
    static_assert(2 * KV_BYTES <= DS_OFFSET - Q_OFFSET, "the epilogue's dK and dV tiles fit in the Q / dO stages");
    static_assert(SMEM_BYTES <= FA_HOPPER_SMEM_LIMIT, "H100/H200 opt-in shared memory per block");
};

/* Named barrier ids (0 is __syncthreads); each joins the 256 consumer threads. */
enum fa_bwd_sm90_named_barrier {
    FA_HBWD_BAR_DS_FULL = 1, /* both consumers' dS halves are in shared memory                      */
    FA_HBWD_BAR_KV_TAIL = 2, /* varlen: K/V rows past the sequence zeroed                           */
    FA_HBWD_BAR_Q_TAIL = 3   /* varlen: Q/dO rows past the sequence zeroed in this iteration's stage */
}; /* 4-7: FA_HBWD_BAR_DQ_EMPTY / DQ_FULL, 8-10: FA_HBWD_BAR_EPILOGUE (bwd_sm90_common.cuh) */

/* ---- device functions (the shared ones: bwd_sm90_common.cuh) --------------------------------- */

/* acc [64 keys, D] += Aᵀ-fragments (a_rmem[kk]: keys × queries 16kk..16kk+15, packed) times a
 * [BLOCK_M, D] stage (dO or Q) read MN-major: LBO = slab stride (BLOCK_M·128 B), SBO = 1024 B
 * (8 query rows), k16 step = 16 rows = +2048 B. One commit group; nothing waits here. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_issue_atb(float (&acc)[Cfg::D / 2], uint32_t (&a_rmem)[Cfg::BLOCK_M / 16][4],
                                                  uint32_t b_stage) {
    const uint64_t b_desc = wgmma_desc_sw128(b_stage, Cfg::Q_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::D / 2; ++i) wgmma_fence_operand(acc[i]);
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(a_rmem[kk][x]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
        wgmma_rs_f32_transb<Cfg::D, BF16>(acc, a_rmem[kk], b_desc + ((kk * 2048) >> 4), 1);
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::D / 2; ++i) wgmma_fence_operand(acc[i]);
}

/* dQ piece [64, 64] = dS rows (K-major over the 128 keys: step kk = slab kk/4, +32·(kk%4)) times
 * K [keys, 64 columns] read MN-major (LBO = K slab stride, SBO = 1024 B, +2048 B per 16 keys).
 * One commit group; nothing waits here. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_issue_dq(float (&acc)[32], uint32_t ds_rows, uint32_t k_cols) {
    const uint64_t a_desc = wgmma_desc_sw128(ds_rows, 16, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(k_cols, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < 32; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk) {
        const uint64_t a_step = ((kk / 4) * Cfg::Q_SLAB_BYTES + (kk % 4) * 32) >> 4;
        wgmma_ss_f32_transb<64, BF16>(acc, a_desc + a_step, b_desc + ((kk * 2048) >> 4), kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < 32; ++i) wgmma_fence_operand(acc[i]);
}

/* 80-row query blocks: the dQᵀ piece [64 columns, BLOCK_M queries] = Kᵀ dSᵀ. A = K slab
 * k_slab (columns 64c..) read MN-major along the keys (LBO unused: M = 64 is one slab, SBO =
 * 1024 B, +2048 B per 16 keys), B = the dS tile [BLOCK_M queries, 128 keys] K-major (the keys:
 * step kk = slab kk/4, +32·(kk%4)), N = BLOCK_M. One commit group; nothing waits here. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_issue_dqt(float (&acc)[Cfg::DQ_ACC], uint32_t k_slab, uint32_t ds_tile) {
    static_assert(Cfg::DQ_ACC == Cfg::BLOCK_M / 2, "a piece of 64 columns x BLOCK_M queries");
    const uint64_t a_desc = wgmma_desc_sw128(k_slab, Cfg::KV_SLAB_BYTES, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(ds_tile, 16, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::DQ_ACC; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk) {
        const uint64_t b_step = ((kk / 4) * Cfg::Q_SLAB_BYTES + (kk % 4) * 32) >> 4;
        wgmma_ss_f32_transa<Cfg::BLOCK_M, BF16>(acc, a_desc + ((kk * 2048) >> 4), b_desc + b_step, kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::DQ_ACC; ++i) wgmma_fence_operand(acc[i]);
}

/* dK (scaled) and dV rows key0 and key0 + 8 of this thread (fa_bwd_sm90_store_dkdv_rows); with a
 * split group (group_splits > 1) the split's unscaled fp32 partials, 8-byte stores (element
 * 4j + 2h + c is row key0 + 8h, column 8j + col_in + c). PARTIALS = false compiles the partial
 * store out: the instantiations with softcap and dropout spill with it at bucket 64 (84 bytes), so
 * bwd.cu never splits the group for them. */
template <class Cfg, bool BF16, bool PARTIALS = true>
__device__ __forceinline__ void fa_bwd_sm90_store_dkdv(const fa_bwd_sm90_params &prm, const float (&dk_rmem)[Cfg::D / 2],
                                                   const float (&dv_rmem)[Cfg::D / 2], int key0, int len_k,
                                                   int64_t k_start, int batch, int col_in) {
    const bool varlen = prm.cu_seqlens_q != nullptr;
    if (PARTIALS && prm.group_splits > 1) {
        const int split = (int)blockIdx.y % prm.group_splits, head_kv = (int)blockIdx.y / prm.group_splits;
        const int64_t k_packed = varlen ? k_start : (int64_t)batch * prm.seqlen_k;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = key0 + 8 * h;
            if (key >= len_k) continue;
            const int64_t row = ((int64_t)split * prm.total_k + k_packed + key) * prm.heads_kv + head_kv;
            float *dk_row = prm.dk_partial + row * prm.head_dim;
            float *dv_row = prm.dv_partial + row * prm.head_dim_v;
#pragma unroll
            for (int j = 0; j < Cfg::D / 8; ++j) {
                const int col = 8 * j + col_in;
                if (col < prm.head_dim)
                    *reinterpret_cast<float2 *>(dk_row + col) =
                        make_float2(dk_rmem[4 * j + 2 * h], dk_rmem[4 * j + 2 * h + 1]);
                if (col < prm.head_dim_v)
                    *reinterpret_cast<float2 *>(dv_row + col) =
                        make_float2(dv_rmem[4 * j + 2 * h], dv_rmem[4 * j + 2 * h + 1]);
            }
        }
        return;
    }
    fa_bwd_sm90_store_dkdv_rows<Cfg::D, BF16>(prm, dk_rmem, dv_rmem, key0, len_k, k_start, batch, (int)blockIdx.y, 0,
                                              col_in, varlen);
}

/* ---- dropout (the DROPOUT instantiations) -------------------------------------------------------- */

/* Keep bits of this warp's Sᵀ rows (keys key_w .. key_w + 15, key_w a multiple of 16) and the
 * BLOCK_M queries m0 .. of query head `head`: bit i % 32 of keep[i / 32] says element i is kept.
 * Quad q of 8-query chunks (4q .. 4q + 3) is one fa_dropout_keep_kq4 call (bit 4c + e = element
 * 4(4q + c) + e), so its 16 bits belong at bit 16q: each call's bits enter a 64-bit word from
 * the top. The unrolling is chosen for ptxas (13): at bucket 64 (four calls) unrolled (one call
 * in flight spilled 8-28 bytes, each half-word put in place 8-20), at bucket 128 (two calls) one
 * call in flight (unrolled, the deterministic LOG2 kernels spilled 4 bytes). */
template <class Cfg>
__device__ __forceinline__ void fa_bwd_sm90_dropout_bits(uint32_t (&keep)[Cfg::KEEP_WORDS], const fa_dropout_params &dp,
                                                         int batch, int head, int heads_q, int key_w, int m0) {
    constexpr int QUADS = Cfg::BLOCK_M / 32;
    static_assert(QUADS <= 4 && Cfg::BLOCK_M % 32 == 0 && Cfg::KEEP_WORDS <= 2, "one 64-bit word of keep bits");
    constexpr int UNROLL = QUADS > 2 ? QUADS : 1;
    uint64_t bits = 0;
#pragma unroll UNROLL
    for (int q = 0; q < QUADS; ++q)
        bits = (bits >> 16) | ((uint64_t)fa_dropout_keep_kq4(dp, batch, head, heads_q, key_w, m0 + 32 * q) << 48);
    bits >>= 64 - 16 * QUADS;
#pragma unroll
    for (int w = 0; w < Cfg::KEEP_WORDS; ++w) keep[w] = (uint32_t)(bits >> (32 * w));
}

/* 1 or 0: element i kept (a factor, so a NaN stays NaN as in the portable kernels' Z∘). */
template <class Cfg>
__device__ __forceinline__ float fa_bwd_sm90_kept(const uint32_t (&keep)[Cfg::KEEP_WORDS], int i) {
    return (keep[i / 32] >> (i % 32)) & 1u ? 1.0f : 0.0f;
}

/* dPᵀ -> Z∘dPᵀ, Z = keep · keep_scale. */
template <class Cfg>
__device__ __forceinline__ void fa_bwd_sm90_dropout_dp(float (&dp_rmem)[Cfg::BLOCK_M / 2],
                                                       const uint32_t (&keep)[Cfg::KEEP_WORDS], float keep_scale) {
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_M / 2; ++i) dp_rmem[i] *= fa_bwd_sm90_kept<Cfg>(keep, i) * keep_scale;
}

/* keep∘P (fp32, accumulator layout) -> the A fragments of dV += (keep∘P)ᵀ dO: fa_bwd_sm90_pack's
 * pairs with the dropped halves cleared (an AND on the packed pair: multiplying the fp32 values
 * first made ptxas spill 48 bytes at bucket 128). */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_bwd_sm90_pack_kept(const float (&acc)[Cfg::BLOCK_M / 2],
                                                      const uint32_t (&keep)[Cfg::KEEP_WORDS],
                                                      uint32_t (&frag)[Cfg::BLOCK_M / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int i = 8 * kk + 2 * x;
            const uint32_t two = keep[i / 32] >> (i % 32);
            const uint32_t mask = (two & 1u ? 0x0000FFFFu : 0u) | (two & 2u ? 0xFFFF0000u : 0u);
            frag[kk][x] = fa_bwd_sm90_pack2<BF16>(acc[i], acc[i + 1]) & mask;
        }
}

/* ---- score modifications (the MODS instantiations: LOG2, no softcap, dropout or determinism) ---- */

/* Sᵀ (unmasked) -> P = 2^(s·scale·log2e - slope·log2e·|query + shift - key| + bias·log2e - LSE2)
 * for the tile `t` (tile_of(): fa_mods_tile_of of its query block and key block, formed only
 * where needed; `full`: its block is listed full): a full block is masked
 * only at keys past the sequence, a partial one (or any, without a block mask) by the element
 * window alone when nothing else applies (a bias with contiguous keys added first), else every
 * element goes through fa_mods_score (document ids, bits, a bias at the sequence's end or with
 * strided keys; common/mods.cuh).
 * Element 4j + 2h + c: key key0 + 8h, query query0 + 8j + c (query0 = m0 + col_in); base as in
 * fa_bwd_sm90_mask. */
template <int BLOCK_M, class TileOf>
__device__ __forceinline__ void fa_bwd_sm90_probs_mods(float (&s_rmem)[BLOCK_M / 2], const fa_bwd_sm90_params &prm,
                                                       const fa_mods_params &mp, bool full, const TileOf &tile_of,
                                                       int base, int key0, int query0, int len_q, int len_k, int shift,
                                                       uint32_t lse2_pair, float alibi_slope_log2) {
    fa_bwd_sm90_exponent_log2<BLOCK_M>(s_rmem, prm, base, lse2_pair, alibi_slope_log2);
    if (full && mp.bias == nullptr && key0 + 8 < len_k) { /* nothing to mask or add */
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) s_rmem[i] = ex2_approx_ftz_f32(s_rmem[i]);
        return;
    }
    const fa_mods_tile t = tile_of();
    if (mp.doc_ids_q == nullptr && t.bits == nullptr &&
        (mp.bias == nullptr || (mp.bias_col_stride == 1 && key0 + 8 < len_k))) {
        /* no per-element rule but the window: a bias with contiguous keys is added without the
         * element rule's tests (queries past the sequence read the last row's: their LSE2 = +inf
         * makes P = 0 anyway), then the mask overwrites with -inf */
        if (mp.bias != nullptr) { /* every load of the tile in flight at once */
            const int64_t key[2] = {t.bias_base + key0, t.bias_base + key0 + 8};
            fa_mods_bias_add_chunked<BLOCK_M / 2>(mp, s_rmem, [&](int e) {
                return key[(e >> 1) & 1] + (int64_t)min(query0 + 8 * (e >> 2) + (e & 1), len_q - 1) * mp.bias_row_stride;
            }, 1.4426950408889634f);
        }
        if (t.status != FA_MODS_FULL)
            fa_bwd_sm90_mask_window<BLOCK_M>(s_rmem, mp.elem_window_left, mp.elem_window_right, base, key0, len_k);
        else if (key0 + 8 >= len_k)
            fa_bwd_sm90_mask_window<BLOCK_M>(s_rmem, -1, -1, base, key0, len_k);
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = key0 + 8 * h;
#pragma unroll
            for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int i = query0 + 8 * j + c, diag = i + shift;
                    const bool in_window = (mp.elem_window_left < 0 || key >= diag - mp.elem_window_left) &&
                                           (mp.elem_window_right < 0 || key <= diag + mp.elem_window_right);
                    float &x = s_rmem[4 * j + 2 * h + c];
                    x = fa_mods_score(mp, t, i, key, i < len_q && key < len_k, in_window, x, 1.4426950408889634f);
                }
        }
    }
#pragma unroll
    for (int i = 0; i < BLOCK_M / 2; ++i) s_rmem[i] = ex2_approx_ftz_f32(s_rmem[i]);
}

/* dL/dbias = dS = P∘(dP - D) of this thread's elements inside the sequence (the dbias target was
 * zeroed: unvisited blocks stay 0). Layout as in fa_bwd_sm90_probs_mods. */
template <int BLOCK_M>
__device__ __forceinline__ void fa_bwd_sm90_store_dbias(const fa_mods_params &mp, const float (&ds_rmem)[BLOCK_M / 2],
                                                        int batch, int head, int key0, int query0, int len_q,
                                                        int len_k) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h;
        if (key >= len_k) continue;
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int i = query0 + 8 * j + c;
                if (i < len_q) fa_mods_store_dbias(mp, batch, head, i, key, ds_rmem[4 * j + 2 * h + c]);
            }
    }
}

/* ---- main kernel ------------------------------------------------------------------------------ */

template <int BUCKET, bool BF16, bool SOFTCAP, bool LOG2, bool DET, bool DROPOUT, bool MODS, bool ROWS80, bool FP8>
__global__ void __launch_bounds__(fa_bwd_sm90_config<BUCKET, ROWS80, FP8>::THREADS, 1)
    fa_bwd_sm90_main_kernel(const __grid_constant__ CUtensorMap tmap_q,  /* {d, sq, hq, b}, box {64, BLOCK_M, 1, 1}   */
                        const __grid_constant__ CUtensorMap tmap_do, /* {dv, sq, hq, b}, box {64, BLOCK_M, 1, 1}  */
                        const __grid_constant__ CUtensorMap tmap_k,  /* {d, sk, hkv, b}, box {64, BLOCK_N, 1, 1}  */
                        const __grid_constant__ CUtensorMap tmap_v,  /* {dv, sk, hkv, b}, box {64, BLOCK_N, 1, 1} */
                        const __grid_constant__ CUtensorMap tmap_dk, /* {d, sk, hkv, b}, box {64, 64, 1, 1}: dK out  */
                        const __grid_constant__ CUtensorMap tmap_dv, /* {dv, sk, hkv, b}, box {64, 64, 1, 1}: dV out */
                        const fa_bwd_sm90_params prm,
                        const fa_dropout_params dropout /* read iff DROPOUT */,
                        const __grid_constant__ fa_mods_arg<MODS> mods /* MODS only: bias, doc ids, block map */,
                        const __grid_constant__ fa_bwd_sm90_fp8_arg<FP8> fp8 /* FP8 only: e4m3 maps, descales */) {
    using Cfg = fa_bwd_sm90_config<BUCKET, ROWS80, FP8>;
    static_assert(!FP8 || (BF16 && !SOFTCAP && !LOG2 && !DROPOUT && !MODS), "fp8: the plain bf16 path (sm90_tiles.h)");
    static_assert(!MODS || (LOG2 && !SOFTCAP && !DET && !DROPOUT), "MODS: log2 exponents, nothing else");
    static_assert(!ROWS80 || fa_hopper_bwd_rows80(BUCKET, -1, -1, 0, SOFTCAP, LOG2, DROPOUT, MODS),
                  "80-row query blocks: the plain instantiations of bucket 128 (sm90_tiles.h)");
    constexpr int D = Cfg::D, BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, STAGES = Cfg::STAGES;
    /* softcap: dV after dS at both buckets (the file comment's softcap paragraph) */
    constexpr bool EARLY_DV = Cfg::EARLY_DV && !SOFTCAP;

    /* deterministic mode: highest key block first (bwd_sm90_common.cuh, "deterministic dQ") */
    const int n_block = DET ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int n0 = n_block * BLOCK_N, batch = blockIdx.z;
    const fa_bwd_sm90_heads heads = fa_bwd_sm90_cta_heads(prm);
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
    int iterations = prm.heads_per_split * n_m;
    /* MODS with a block mask: the listed query blocks of this key block instead (uniform) */
    fa_bwd_sm90_iters iters;
    if constexpr (MODS) {
        iters.h_begin = heads.first;
        iters.m_first = m_first;
        iters.n_m = n_m;
        iters.listed = mods.block_map != nullptr;
        if (iters.listed) {
            iters.walk = fa_mods_q_walk_at(mods, batch, heads.first, heads.first + prm.heads_per_split, n0, BLOCK_M, len_q);
            iterations = fa_mods_q_count(iters.walk, heads.first);
        }
    }
    const int warpgroup = threadIdx.x / 128;

    if (iterations == 0) {
        /* no query row sees these keys: dK = dV = 0 (uniform over the CTA, before any barrier) */
        if (warpgroup > 0) {
            const int consumer = warpgroup - 1, tid = threadIdx.x % 128;
            float zero_rmem[D / 2];
#pragma unroll
            for (int i = 0; i < D / 2; ++i) zero_rmem[i] = 0.0f;
            fa_bwd_sm90_store_dkdv<Cfg, BF16>(prm, zero_rmem, zero_rmem, n0 + 64 * consumer + 16 * (tid / 32) + (tid % 32) / 4,
                                          len_k, seq.k_start, batch, 2 * (tid % 4));
        }
        return;
    }

    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t smem = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t k_smem = smem + Cfg::K_OFFSET, v_smem = smem + Cfg::V_OFFSET;
    auto q_stage = [&](int s) -> uint32_t { return smem + Cfg::Q_OFFSET + (uint32_t)s * Cfg::Q_BYTES; };
    auto do_stage = [&](int s) -> uint32_t { return smem + Cfg::DO_OFFSET + (uint32_t)s * Cfg::Q_BYTES; };
    auto ds_buffer = [&](int b) -> uint32_t { return smem + Cfg::DS_OFFSET + (uint32_t)b * Cfg::DS_BYTES; };
    const uint32_t dq_smem = smem + Cfg::DQ_OFFSET;
    /* LSE2 and D [STAGES][BLOCK_M] fp32, addressed as 32-bit shared addresses (fewer registers
     * than generic pointers in the consumers' tight budget) */
    const uint32_t lse2_smem = smem + Cfg::LSE_OFFSET, dvec_smem = smem + Cfg::DVEC_OFFSET;
    const uint32_t bars = smem + Cfg::BAR_OFFSET;
    const uint32_t kv_full = bars;
    auto stage_full = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + s); };
    auto stage_empty = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + STAGES + s); };

    fa_bwd_sm90_init_stage_barriers<Cfg>(bars);
    /* every thread sees initialised barriers before any wait or arrive */
    __syncthreads();

    /* TMA coordinates: varlen maps are {d, total, heads, 1} */
    const int k_row = (varlen ? (int)seq.k_start : 0) + n0;
    const int q_row0 = varlen ? (int)seq.q_start : 0;
    const int tma_batch = varlen ? 0 : batch;

    if (warpgroup == 0) {
        /* ================= producer ================= */
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        /* The warp index is lane 0's, which ptxas knows to be warp-uniform; with threadIdx.x / 32
         * a branch to a second producer warp made it spill the consumers' loop-invariant values
         * (softcap at buckets 64 and 256, ptxas 13). */
        const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
        const int lane = threadIdx.x % 32;
        if (warp == 0) {
            fa_bwd_sm90_load<Cfg, MODS, DET, FP8>(&tmap_q, &tmap_do, &tmap_k, &tmap_v, prm, smem, seq, q_packed0, batch,
                                             heads, k_row, q_row0, tma_batch, walk, len_q, lane,
                                             [&](int s, int phase) { mbarrier_wait_parity(stage_empty(s), phase); },
                                             [](int) {}, &iters, iterations, 0, &fp8);
        } else if (fa_bwd_sm90_is_dq_writer(DET, warp)) {
            fa_bwd_sm90_dq_writer<Cfg, DET, MODS>(prm, dq_smem, walk, batch, heads, len_q, len_k, shift, q_packed0,
                                                  lane, warp - 1, &iters, iterations);
        }
        return;
    }

    /* ================= consumers ================= */
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    /* from lane 0, which ptxas knows to be warp-uniform: the shared-memory descriptors of the
     * consumer's K and V rows are then formed in uniform registers, not per thread and moved
     * over by R2UR before every wgmma */
    const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int ct = threadIdx.x - 128; /* 0..255 over both consumers */
    const uint32_t k_wg = k_smem + (uint32_t)consumer * 64 * 128; /* keys 64c.. of slab 0 */
    const uint32_t v_wg = v_smem + (uint32_t)consumer * 64 * 128;
    /* this thread's accumulator rows (keys): key0 and key0 + 8; columns (queries / d) 8j + 2(l%4) + {0,1} */
    const int key0 = n0 + 64 * consumer + 16 * warp + lane / 4;
    const int col_in = 2 * (lane % 4);
    /* Query block m0 needs the mask iff m0 < mask_m_lo or m0 > mask_m_hi: this warpgroup's keys
     * [wg_first_key, wg_first_key + 63] run past the sequence (always), or its last key is right
     * of the first row's window, or its first key left of the last row's window. */
    const int wg_first_key = n0 + 64 * consumer, wg_last_key = wg_first_key + 63;
    const int mask_m_lo = wg_last_key >= len_k      ? INT_MAX
                          : prm.window_right >= 0 ? wg_last_key - shift - prm.window_right
                                                  : INT_MIN;
    const int mask_m_hi = prm.window_left >= 0 ? wg_first_key - (BLOCK_M - 1) - shift + prm.window_left : INT_MAX;
    const int mask_base = key0 - shift - col_in; /* key0 - shift - (query - m0 - 8j - c) */
    /* dQ piece of this consumer: rows dq_row0.., columns dq_col0.. of the [BLOCK_M, D] tile */
    const int dq_row0 = fa_hopper_bwd_dq_piece_row0(BLOCK_M, consumer);
    const int dq_col0 = fa_hopper_bwd_dq_piece_col0(BLOCK_M, D, consumer);

    float dk_rmem[D / 2], dv_rmem[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) {
        dk_rmem[i] = 0.0f;
        dv_rmem[i] = 0.0f;
    }
    /* FP8: Sᵀ and dPᵀ of the codes, times q_descale · k_descale (in the exponent's multiplier) and
     * v_descale · dout_descale (in dS) of this (sequence, kv head) */
    float score_log2 = prm.scale_log2, dp_scale = 1.0f;
    if constexpr (FP8) {
        const int64_t at = (int64_t)batch * prm.heads_kv + heads.kv;
        score_log2 *= (fp8.q_descale ? fp8.q_descale[at] : 1.0f) * (fp8.k_descale ? fp8.k_descale[at] : 1.0f);
        dp_scale = (fp8.v_descale ? fp8.v_descale[at] : 1.0f) * (fp8.do_descale ? fp8.do_descale[at] : 1.0f);
    }

    mbarrier_wait_parity(kv_full, 0);
    if (varlen && n0 + BLOCK_N > len_k)
        fa_bwd_sm90_zero_kv_tail<Cfg>(k_smem, v_smem, len_k - n0, ct, FA_HBWD_BAR_KV_TAIL);


    /* iteration t is query block walk_i of query head heads.first + head_i (t = head_i · n_m +
     * walk_i), counted along rather than divided out of t: a division by the runtime n_m took ~15
     * instructions of every iteration */
    int walk_i = 0, head_i = 0;
    for (int t = 0; t < iterations; ++t) {
        const int s = t % STAGES, use = t / STAGES;
        /* MODS: this iteration's position, from the stage's slot once the stage is full */
        fa_mods_q_pos it = {0, 0, 0, 0};
        if constexpr (MODS) {
            mbarrier_wait_parity(stage_full(s), use & 1);
            uint32_t pos[4];
            ld_shared_v4_b32(pos, smem + Cfg::POS_OFFSET + 16u * (uint32_t)s);
            it = fa_mods_q_pos{(int)pos[0], (int)pos[1], (int)pos[2], (int)pos[3]};
        }
        const int m0 = (MODS ? it.tile : fa_bwd_sm90_walk_block<DET>(walk, walk_i)) * BLOCK_M;
        /* this thread's pairs of queries 8j + col_in, + 1 start at these addresses (+32 B per j) */
        const uint32_t lse2_pair = lse2_smem + (uint32_t)(s * BLOCK_M + col_in) * 4;
        const uint32_t dvec_pair = dvec_smem + (uint32_t)(s * BLOCK_M + col_in) * 4;

        float s_rmem[BLOCK_M / 2], dp_rmem[BLOCK_M / 2];
        uint32_t p_rmem[BLOCK_M / 16][4], ds_rmem[BLOCK_M / 16][4];

        if constexpr (!MODS) mbarrier_wait_parity(stage_full(s), use & 1);
        if (varlen && m0 + BLOCK_M > len_q) {
            /* Q/dO rows past the sequence -> 0 (uniform over both consumers in this iteration) */
            fa_bwd_sm90_zero_rows(q_stage(s), Cfg::Q_SLAB_BYTES, Cfg::SLABS, BLOCK_M, len_q - m0, ct);
            fa_bwd_sm90_zero_rows(do_stage(s), Cfg::Q_SLAB_BYTES, Cfg::SLABS, BLOCK_M, len_q - m0, ct);
            if constexpr (FP8) {
                fa_bwd_sm90_zero_rows(smem + Cfg::Q8_OFFSET + (uint32_t)s * Cfg::Q8_SLAB_BYTES, Cfg::Q8_SLAB_BYTES, 1,
                                      BLOCK_M, len_q - m0, ct);
                fa_bwd_sm90_zero_rows(smem + Cfg::DO8_OFFSET + (uint32_t)s * Cfg::Q8_SLAB_BYTES, Cfg::Q8_SLAB_BYTES, 1,
                                      BLOCK_M, len_q - m0, ct);
            }
            fence_proxy_async_shared_cta();
            bar_sync(FA_HBWD_BAR_Q_TAIL, 256);
        }
        if constexpr (FP8) /* group: Sᵀ of the codes (K's in the V tile's slab 1) */
            fa_bwd_sm90_issue_abt<Cfg, BF16, true>(s_rmem, v_wg + Cfg::KV_SLAB_BYTES, smem + Cfg::Q8_OFFSET + (uint32_t)s * Cfg::Q8_SLAB_BYTES);
        else
            fa_bwd_sm90_issue_abt<Cfg, BF16>(s_rmem, k_wg, q_stage(s)); /* group: Sᵀ  */
        /* dropout: the keep bits while Sᵀ is computed, before dPᵀ's accumulator is taken too (with
         * both in flight, ptxas spilled 84 bytes with softcap at bucket 64) */
        uint32_t keep[DROPOUT ? Cfg::KEEP_WORDS : 1];
        if constexpr (DROPOUT)
            fa_bwd_sm90_dropout_bits<Cfg>(keep, dropout, batch, heads.first + head_i,
                                          prm.heads_q, key0 - lane / 4, m0);
        if constexpr (FP8) /* group: dPᵀ of the codes (V's in the V tile's slab 0) */
            fa_bwd_sm90_issue_abt<Cfg, BF16, true>(dp_rmem, v_wg, smem + Cfg::DO8_OFFSET + (uint32_t)s * Cfg::Q8_SLAB_BYTES);
        else
            fa_bwd_sm90_issue_abt<Cfg, BF16>(dp_rmem, v_wg, do_stage(s)); /* group: dPᵀ */
        if (t > 0) fa_bwd_sm90_dq_piece_staged(consumer); /* the previous iteration's, now that Sᵀ and dPᵀ run */

        wgmma_wait_group<1>(); /* Sᵀ ready; dPᵀ may still run */
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) wgmma_fence_operand(s_rmem[i]);
        /* softcap: Sᵀ -> tc = tanh(Sᵀ·scale / softcap) before the mask, which then writes tc = -inf */
        if constexpr (SOFTCAP) fa_bwd_sm90_softcap_tanh(s_rmem, prm.softcap_pre);

        /* mask: -inf into Sᵀ (softcap: into tc), or into the exponent (LOG2, fa_bwd_sm90_probs_log2) */
        const bool needs_mask = m0 < mask_m_lo || m0 > mask_m_hi;
        if constexpr (!LOG2) {
            if (needs_mask) fa_bwd_sm90_mask<BLOCK_M>(s_rmem, prm, mask_base - m0, key0, len_k);
        }
        if constexpr (MODS)
            fa_bwd_sm90_probs_mods<BLOCK_M>(
                s_rmem, prm, mods, iters.listed && it.entry == 1,
                [&]() {
                    return fa_mods_tile_of(mods, batch, it.h, varlen, seq.q_start, seq.k_start, it.qb,
                                           iters.listed ? iters.walk.kb : 0, it.entry);
                },
                mask_base - m0, key0, m0 + col_in, len_q, len_k, shift, lse2_pair,
                fa_bwd_sm90_alibi_slope(prm, batch, it.h));
        else if constexpr (LOG2)
            fa_bwd_sm90_probs_log2<BLOCK_M>(
                s_rmem, prm, needs_mask, mask_base - m0, key0, len_k, lse2_pair,
                fa_bwd_sm90_alibi_slope(prm, batch, heads.first + head_i));
        else if constexpr (!SOFTCAP)
            fa_bwd_sm90_probs<BLOCK_M>(s_rmem, score_log2, lse2_pair);
        if constexpr (EARLY_DV) {
            if constexpr (DROPOUT)
                fa_bwd_sm90_pack_kept<Cfg, BF16>(s_rmem, keep, p_rmem); /* keep∘P */
            else
                fa_bwd_sm90_pack<Cfg, BF16>(s_rmem, p_rmem);
            fa_bwd_sm90_issue_atb<Cfg, BF16>(dv_rmem, p_rmem, do_stage(s)); /* group: dV += Pᵀ dO */
            wgmma_wait_group<1>(); /* dPᵀ ready; dV may still run */
        } else {
            wgmma_wait_group<0>(); /* dPᵀ ready */
        }
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) wgmma_fence_operand(dp_rmem[i]);
        if constexpr (DROPOUT) fa_bwd_sm90_dropout_dp<Cfg>(dp_rmem, keep, dropout.keep_scale); /* Z∘dPᵀ */
        if constexpr (SOFTCAP) {
            /* P (into s_rmem, which held tc) and dS = P ∘ (1 - tc²) ∘ (dP - D) */
            fa_bwd_sm90_softcap_ds(s_rmem, dp_rmem, lse2_pair, dvec_pair, prm.softcap_post_log2);
        } else {
            /* dS = P ∘ (dP - D) (P in fp32) */
#pragma unroll
            for (int j = 0; j < BLOCK_M / 8; ++j) {
                const float2 dv2 = ld_shared_v2_f32(dvec_pair + 32 * j);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if constexpr (FP8) { /* dP = dPᵀ of the codes · v_descale · dout_descale */
                        dp_rmem[4 * j + 2 * h] = s_rmem[4 * j + 2 * h] * fmaf(dp_rmem[4 * j + 2 * h], dp_scale, -dv2.x);
                        dp_rmem[4 * j + 2 * h + 1] =
                            s_rmem[4 * j + 2 * h + 1] * fmaf(dp_rmem[4 * j + 2 * h + 1], dp_scale, -dv2.y);
                    } else {
                        dp_rmem[4 * j + 2 * h] = s_rmem[4 * j + 2 * h] * (dp_rmem[4 * j + 2 * h] - dv2.x);
                        dp_rmem[4 * j + 2 * h + 1] = s_rmem[4 * j + 2 * h + 1] * (dp_rmem[4 * j + 2 * h + 1] - dv2.y);
                    }
                }
            }
        }
        if constexpr (MODS)
            if (mods.dbias != nullptr)
                fa_bwd_sm90_store_dbias<BLOCK_M>(mods, dp_rmem, batch, it.h, key0, m0 + col_in, len_q, len_k);
        if constexpr (!EARLY_DV && DROPOUT)
            fa_bwd_sm90_pack_kept<Cfg, BF16>(s_rmem, keep, p_rmem); /* keep∘P */
        else if constexpr (!EARLY_DV)
            fa_bwd_sm90_pack<Cfg, BF16>(s_rmem, p_rmem);
        fa_bwd_sm90_pack<Cfg, BF16>(dp_rmem, ds_rmem);

        /* dSᵀ -> dS buffer t % 2, slab `consumer` (its 64 keys), rows = queries. stmatrix.trans of
         * k-slice kk: matrix i = lane / 8 (i & 1: keys +8, i >> 1: queries +8), stored row
         * R = lane % 8 is query 16kk + 8(i >> 1) + R, holding the 8 keys 16w + 8(i & 1) .. +7 of
         * the slab = 16-byte chunk 2w + (i & 1), swizzled by the row's bits 0-2 (= R). */
        {
            const int i = lane / 8, r = lane % 8;
            const uint32_t slab = ds_buffer(t & 1) + (uint32_t)consumer * Cfg::Q_SLAB_BYTES;
            const uint32_t chunk = (uint32_t)((2 * warp + (i & 1)) ^ r);
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
                const int query = 16 * kk + 8 * (i >> 1) + r;
                stmatrix_x4_trans(slab + (uint32_t)query * 128 + chunk * 16, ds_rmem[kk]);
            }
        }
        if constexpr (!EARLY_DV) fa_bwd_sm90_issue_atb<Cfg, BF16>(dv_rmem, p_rmem, do_stage(s)); /* dV += Pᵀ dO */

        /* stmatrix writes (generic proxy) -> wgmma reads (async proxy): each writer fences, then
         * both consumers meet */
        fence_proxy_async_shared_cta();
        bar_sync(FA_HBWD_BAR_DS_FULL, 256);

        /* dQ before dK: once dQ has retired, its piece is staged while dK still runs */
        float dq_rmem[Cfg::DQ_ACC];
        if constexpr (Cfg::DQ_TRANSPOSED)
            fa_bwd_sm90_issue_dqt<Cfg, BF16>(dq_rmem, k_smem + (uint32_t)(dq_col0 / 64) * Cfg::KV_SLAB_BYTES,
                                             ds_buffer(t & 1)); /* group: dQᵀ */
        else
            fa_bwd_sm90_issue_dq<Cfg, BF16>(dq_rmem, ds_buffer(t & 1) + (uint32_t)dq_row0 * 128,
                                            k_smem + (uint32_t)(dq_col0 / 64) * Cfg::KV_SLAB_BYTES); /* group: dQ */
        fa_bwd_sm90_issue_atb<Cfg, BF16>(dk_rmem, ds_rmem, q_stage(s));                           /* dK += dSᵀ Q */
        wgmma_wait_group<1>(); /* dV and dQ retired; dK may still run */
#pragma unroll
        for (int i = 0; i < Cfg::DQ_ACC; ++i) wgmma_fence_operand(dq_rmem[i]);

        /* Stage the dQ piece for the writer warp in the accumulator tile's register order: this
         * thread's dq[4j .. 4j + 3] at 16·(128j + tid), so a quarter-warp's 16-byte stores fill 128
         * contiguous bytes (no bank twice) from one base address and immediate offsets. Rows past
         * the sequence are staged as they are: their tile rows are never read. */
        bar_sync(FA_HBWD_BAR_DQ_EMPTY + consumer, FA_HBWD_DQ_HANDOFF_THREADS); /* the writer has read it */
        {
            const uint32_t slot = dq_smem + (uint32_t)consumer * Cfg::DQ_PIECE_BYTES + (uint32_t)tid * 16;
#pragma unroll
            for (int j = 0; j < Cfg::DQ_ACC / 4; ++j)
                st_shared_v4_f32(slot + (uint32_t)j * 128 * 16, dq_rmem[4 * j], dq_rmem[4 * j + 1], dq_rmem[4 * j + 2],
                                 dq_rmem[4 * j + 3]);
        }
        wgmma_wait_group<0>(); /* dK retired */
#pragma unroll
        for (int i = 0; i < D / 2; ++i) {
            wgmma_fence_operand(dk_rmem[i]);
            wgmma_fence_operand(dv_rmem[i]);
        }
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                wgmma_fence_operand(p_rmem[kk][x]);
                wgmma_fence_operand(ds_rmem[kk][x]);
            }
        /* this thread's reads of stage s (GEMMs retired, LSE2/D loads used) are done: release */
        mbarrier_arrive(stage_empty(s));
        if (++walk_i == n_m) {
            walk_i = 0;
            ++head_i;
        }
    }
    fa_bwd_sm90_dq_piece_staged(consumer); /* the last iteration's */

    if constexpr (DROPOUT) { /* dV = Σ (Z∘P)ᵀ dO: the 1 / (1 - p) of Z, once */
#pragma unroll
        for (int i = 0; i < D / 2; ++i) dv_rmem[i] *= dropout.keep_scale;
    }
    if (prm.group_splits > 1) /* fp32 partials */
        fa_bwd_sm90_store_dkdv<Cfg, BF16, !(SOFTCAP && DROPOUT)>(prm, dk_rmem, dv_rmem, key0, len_k, seq.k_start,
                                                                 batch, col_in);
    else
        fa_bwd_sm90_epilogue_dkdv<Cfg::SLABS, BLOCK_N, Cfg::SLABS, BF16>(&tmap_dk, &tmap_dv, prm, dk_rmem, dv_rmem,
                                                             smem + Cfg::Q_OFFSET, consumer, tid, 64 * consumer, 0,
                                                             n0, len_k, seq.k_start, batch);
}

/* ---- host ------------------------------------------------------------------------------------ */

template <int BUCKET, bool BF16, bool SOFTCAP, bool LOG2, bool DROPOUT, bool MODS = false, bool ROWS80 = false,
          bool FP8 = false>
static fa_status fa_bwd_sm90_launch(const fa_bwd_params *p, const fa_dropout_params *dropout, int device_ordinal,
                                    cudaStream_t stream, const fa_mods_params *mods = nullptr,
                                    const fa_params *fp8_src = nullptr /* FP8: the e4m3 problem */) {
    using Cfg = fa_bwd_sm90_config<BUCKET, ROWS80, FP8>;
    static const char *const path = "the Hopper backward";
    /* the plan chose the query rows per iteration (bwd.cu, fa_hopper_bwd_rows80) */
    if constexpr (BUCKET == 128 && !ROWS80 && !FP8 && fa_hopper_bwd_rows80(BUCKET, -1, -1, 0, SOFTCAP, LOG2, DROPOUT, MODS)) {
        if (p->block_m == 80)
            return fa_bwd_sm90_launch<BUCKET, BF16, SOFTCAP, LOG2, DROPOUT, MODS, true>(p, dropout, device_ordinal,
                                                                                       stream, mods);
    }
    if (p->block_m != Cfg::BLOCK_M)
        return fa_set_error(FA_ERR_UNSUPPORTED, "%s: no kernel with %d query rows per iteration for this problem",
                            path, p->block_m);
    const int64_t rows_q = p->cu_seqlens_q != nullptr ? p->total_q : p->seqlen_q;
    const int64_t rows_k = p->cu_seqlens_q != nullptr ? p->total_k : p->seqlen_k;
    if (rows_q == 0 || rows_k == 0) return FA_OK; /* bwd.cu never launches an empty grid */
    CUtensorMap tmap_q, tmap_do, tmap_k, tmap_v, tmap_dk, tmap_dv;
    fa_status st;
    int dkdv_tma;
    if ((st = fa_bwd_sm90_make_maps(p, BF16, Cfg::BLOCK_M, Cfg::BLOCK_N, path, &tmap_q, &tmap_do, &tmap_k, &tmap_v,
                                    !FP8)) != FA_OK ||
        (st = fa_bwd_sm90_dkdv_maps(p, BF16, path, &tmap_k, &tmap_dk, &tmap_dv, &dkdv_tma)) != FA_OK)
        return st;
    fa_bwd_sm90_fp8_arg<FP8> fp8_arg;
    if constexpr (FP8) { /* the e4m3 maps (V's in tmap_v's place: there is no 16-bit copy of V) and descales */
        const fa_params *e = fp8_src;
        const bool varlen = p->cu_seqlens_q != nullptr;
        const int64_t rows_q = varlen ? p->total_q : p->seqlen_q, rows_k = varlen ? p->total_k : p->seqlen_k;
        const int64_t map_batch = varlen ? 1 : p->batch;
        const CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
        if ((st = fa_hopper_make_map(&fp8_arg.q8, path, "q", u8, e->q, p->head_dim, rows_q, p->heads_q, map_batch,
                                     e->q_row_stride, e->q_head_stride, e->q_batch_stride, Cfg::BLOCK_M)) != FA_OK ||
            (st = fa_hopper_make_map(&fp8_arg.do8, path, "dout", u8, e->dout, p->head_dim_v, rows_q, p->heads_q,
                                     map_batch, e->do_row_stride, e->do_head_stride, e->do_batch_stride,
                                     Cfg::BLOCK_M)) != FA_OK ||
            (st = fa_hopper_make_map(&fp8_arg.k8, path, "k", u8, e->k, p->head_dim, rows_k, p->heads_kv, map_batch,
                                     e->k_row_stride, e->k_head_stride, e->k_batch_stride, Cfg::BLOCK_N)) != FA_OK ||
            (st = fa_hopper_make_map(&tmap_v, path, "v", u8, e->v, p->head_dim_v, rows_k, p->heads_kv, map_batch,
                                     e->v_row_stride, e->v_head_stride, e->v_batch_stride, Cfg::BLOCK_N)) != FA_OK)
            return st;
        fp8_arg.q_descale = e->q_descale;
        fp8_arg.k_descale = e->k_descale;
        fp8_arg.v_descale = e->v_descale;
        fp8_arg.do_descale = e->dout_descale;
    }
    const bool det = p->dq_semaphore != nullptr; /* never with MODS (fa_hopper_bwd_mods_ok) */
    auto kernel =
        det ? fa_bwd_sm90_main_kernel<BUCKET, BF16, SOFTCAP, LOG2, !MODS, DROPOUT, MODS, ROWS80, FP8>
            : fa_bwd_sm90_main_kernel<BUCKET, BF16, SOFTCAP, LOG2, false, DROPOUT, MODS, ROWS80, FP8>;
    static unsigned long long configured[2] = {0, 0};
    if ((st = fa_bwd_sm90_opt_in_smem(kernel, Cfg::SMEM_BYTES, device_ordinal, &configured[det])) != FA_OK) return st;
    fa_bwd_sm90_params prm = fa_bwd_sm90_make_params(p);
    prm.query_blocks = (p->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M;
    prm.dq_tiles = fa_hopper_bwd_dq_tiles(p->total_q, p->batch, Cfg::BLOCK_M);
    prm.dkdv_tma = dkdv_tma;
    const int64_t key_blocks = (p->seqlen_k + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N;
    if (key_blocks == 0) return FA_OK;
    if ((st = fa_bwd_sm90_set_rotation(&prm, MODS, det, key_blocks)) != FA_OK) return st;
    const int64_t grid_y = (int64_t)p->heads_kv * p->group_splits; /* kv head · group_splits + split */
    if (key_blocks > INT32_MAX || grid_y > FA_CUDA_GRID_YZ_MAX || p->batch > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "%s: grid (%lld key blocks, %d kv heads × %d group splits, %d sequences) too large", path,
                            (long long)key_blocks, p->heads_kv, p->group_splits, p->batch);
    const dim3 grid((unsigned)key_blocks, (unsigned)grid_y, (unsigned)p->batch);
    fa_mods_arg<MODS> mods_arg;
    if constexpr (MODS) static_cast<fa_mods_params &>(mods_arg) = *mods;
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(tmap_q, tmap_do, tmap_k, tmap_v, tmap_dk, tmap_dv, prm,
                                                            dropout != nullptr ? *dropout : fa_dropout_params{},
                                                            mods_arg, fp8_arg);
    FA_CUDA_CHECK_LAUNCH("Hopper backward kernel launch");
    return FA_OK;
}

/* Bucket BUCKET's instantiation for the problem's dtype and score path (fa_bwd_sm90_dispatch). */
template <int BUCKET>
static fa_status fa_bwd_sm90_launch_bucket(const fa_bwd_params *prm, const fa_dropout_params *dropout, bool bf16,
                                           int device_ordinal, cudaStream_t stream) {
    return fa_bwd_sm90_dispatch(prm, dropout != nullptr, bf16, [&](auto bf16_t, auto softcap, auto log2, auto drop) {
        return fa_bwd_sm90_launch<BUCKET, decltype(bf16_t)::value, decltype(softcap)::value, decltype(log2)::value,
                                  decltype(drop)::value>(prm, dropout, device_ordinal, stream);
    });
}

extern "C" fa_status fa_bwd_launch_hopper(const fa_bwd_params *prm, const fa_dropout_params *dropout,
                                          const fa_mods_params *mods, fa_dtype dtype, int device_ordinal,
                                          cudaStream_t stream) {
    const bool bf16 = dtype == FA_DTYPE_BF16;
    if (mods != nullptr) { /* bucket 128 (64 too), LOG2 exponents, no softcap or dropout (fa_hopper_bwd_mods_ok) */
        switch (fa_hopper_mods_bucket(fa_hopper_bwd_bucket(prm->head_dim, prm->head_dim_v))) {
        case 128:
            return bf16 ? fa_bwd_sm90_launch<128, true, false, true, false, true>(prm, nullptr, device_ordinal, stream, mods)
                        : fa_bwd_sm90_launch<128, false, false, true, false, true>(prm, nullptr, device_ordinal, stream, mods);
        default:
            return fa_set_error(FA_ERR_UNSUPPORTED, "head_dim = %d, head_dim_v = %d: no Hopper backward with score "
                                "modifications", prm->head_dim, prm->head_dim_v);
        }
    }
    switch (fa_hopper_bwd_bucket(prm->head_dim, prm->head_dim_v)) {
    case 64: return fa_bwd_sm90_launch_bucket<64>(prm, dropout, bf16, device_ordinal, stream);
    case 128: return fa_bwd_sm90_launch_bucket<128>(prm, dropout, bf16, device_ordinal, stream);
    case 256:
    case 512: return fa_bwd_launch_hopper256(prm, dropout, dtype, device_ordinal, stream);
    default:
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %d, head_dim_v = %d: no Hopper backward kernel",
                            prm->head_dim, prm->head_dim_v);
    }
}

extern "C" fa_status fa_bwd_launch_hopper_fp8(const fa_bwd_params *prm, const fa_params *fp8, int device_ordinal,
                                              cudaStream_t stream) {
    if (!fa_hopper_bwd_fp8_ok(prm->head_dim, prm->head_dim_v, prm->softcap_pre > 0.0f, fa_bwd_sm90_log2_scores(prm), 0, 0))
        return fa_set_error(FA_ERR_UNSUPPORTED, "head_dim = %d, head_dim_v = %d: no fp8 Hopper backward kernel for this "
                            "problem", prm->head_dim, prm->head_dim_v);
    return fa_bwd_sm90_launch<128, true, false, false, false, false, false, true>(prm, nullptr, device_ordinal, stream,
                                                                                 nullptr, fp8);
}
