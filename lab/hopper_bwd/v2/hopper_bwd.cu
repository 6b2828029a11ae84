/*
 * hopper_bwd.cu: a FlashAttention-3-style backward for Hopper (sm_90a) at head dim d = dv = 256,
 * lab version 2 (v1 covers d = 64 and 128 and is the base of this file). TMA loads, wgmma, warp
 * specialisation, dK/dV accumulated in registers across the query loop, dQ reduced in fp32
 * global memory. Written without a GPU; see README.md for the design choice, the register and
 * shared-memory arithmetic and what was checked. Compiled for `-gencode arch=compute_90a,code=sm_90a`.
 *
 * Covers: f16 / bf16; d = dv = 256; MHA / GQA / MQA; fixed-length batches; causal (bottom-right)
 * or not; seqlen_q, seqlen_k >= 1. Semantics exactly as fa_backward (include/flashattn.h) for that
 * subset; not here: varlen, windows, softcap, ALiBi, sinks, deterministic dQ.
 *
 * Three kernels per call (as v1):
 *   1. pre-pass (one warp per query row, padded to whole 128-row tiles): D = rowsum(dO ∘ O),
 *      LSE2 = LSE·log2(e) (+inf for a row with LSE = -inf and for padding rows, so P = 2^-inf = 0
 *      there), and the row of the fp32 dQ accumulator set to 0;
 *   2. main kernel, below;
 *   3. dQ = scale · accumulator, rounded to the 16-bit type.
 *
 * Main kernel: one CTA per (key block of BLOCK_N = 64 keys, kv head, batch); 384 threads.
 *   warpgroup 0, producer (setmaxnreg 24):
 *     warp 0, one thread: K and V of the key block once (kv_full), then for every iteration
 *       t = (query head of the group, query block) the tiles Q_t and dO_t (TMA, BLOCK_M = 64 rows,
 *       zero-filled past seqlen_q) into stage t % STAGES of a ring;
 *     warp 1: the rows LSE2_t and D_t of the same iteration, ld.global then st.shared into the
 *       stage (generic proxy, so the consumers' ld.shared of them and the next overwrite are
 *       ordered by the mbarriers alone, which compute-sanitizer racecheck can see; v1 used a
 *       bulk copy and racecheck flagged it), __syncwarp, lane 0 arrives on stage_full.
 *   warpgroups 1 and 2, consumers (setmaxnreg 240): BOTH work on all 64 keys of the block;
 *     consumer c owns head-dim columns 128c .. 128c+127 of dK, dV (fp32 registers, 64 + 64 per
 *     thread, over all iterations) and of every dQ tile.
 *
 * Why this split (README.md has the arithmetic): at d = 256 a warpgroup cannot hold dK and dV for
 * 64 keys × 256 columns (256 registers), so the columns are split between the two consumers.
 * Then each consumer needs the whole Pᵀ and dSᵀ [64 keys, 64 queries] as register A fragments for
 * its dV and dK columns, so each computes Sᵀ and dPᵀ in full itself (7 instead of 5 GEMM units of
 * 64×64×256 per iteration and CTA). In exchange the two consumers share nothing but the stage
 * ring: each writes its own copy of dS to its own shared buffer for its own dQ columns, so there
 * is no barrier between them, they drift apart freely and one's softmax overlaps the other's
 * GEMMs. The alternatives (P and dS through shared memory, FA3's hdim-256 layout; Sᵀ/dPᵀ split
 * over d and summed through shared memory) do not fit 227 KiB with a 2-stage ring (README.md).
 *
 * GEMM orientation (M = 64 rows per warpgroup, A from registers only in K-major form, B from
 * shared memory K-major or, for 16-bit types, MN-major with imm-trans-b = 1; as v1):
 *   Sᵀ   = K Qᵀ             SS  A = K [64 keys, 256] K-major, B = Q stage K-major,  N = 64 queries
 *   dPᵀ  = V dOᵀ            SS  A = V, B = dO,                                       N = 64
 *   dV_c += Pᵀ dO[:, c]     RS  A = Pᵀ packed from the Sᵀ accumulator (K = queries); B = dO columns
 *                               128c.. (two 64-column slabs) MN-major (trans-b),     N = 128
 *   dK_c += dSᵀ Q[:, c]     RS  the same with dSᵀ and Q,                             N = 128
 *   dQ_c  = dS K[:, c]      SS  A = dS [64 queries, 64 keys] K-major: this consumer's own copy,
 *                               written from its dSᵀ fragment with stmatrix.trans; B = K columns
 *                               128c.. MN-major (trans-b),                           N = 128
 *
 * One consumer iteration t (stage s = t % STAGES, dS buffer b = t % 2):
 *   wait stage_full[s]; issue Sᵀ (group 1) and dPᵀ (group 2);
 *   wait_group 1 (Sᵀ ready): mask (key past seqlen_k, causal), P = 2^(Sᵀ·scale·log2e - LSE2);
 *   pack P; issue dV_c += Pᵀ dO (group 3); wait_group 1 (dPᵀ ready): dS = P ∘ (dPᵀ - D); pack dS;
 *   stmatrix.trans dS into this consumer's buffer b; issue dK_c += dSᵀ Q (group 4);
 *   fence.proxy.async; named barrier DS_READY_c (this warpgroup's 128 threads);
 *   issue dQ_c (group 5); wait_group 0; __syncwarp; lane 0 of each warp arrives on stage_empty[s];
 *   red.global.add.v2.f32 of dQ_c [64 queries, 128 columns] into the fp32 accumulator.
 * The dS double buffer: warp w of consumer c writes buffer t % 2 at iteration t only after passing
 * DS_READY_c of iteration t-1, which the other warps of c reach only after their wait_group 0 of
 * iteration t-2, the last GEMM that read buffer t % 2 (pipeline_model.py checks this).
 *
 * mbarriers: kv_full (1 arrival + K and V bytes; phase 0 only), stage_full[s] (2 arrivals: the TMA
 * thread with the Q and dO bytes, lane 0 of the vector warp), stage_empty[s] (8 arrivals: lane 0
 * of every consumer warp, after a __syncwarp so the whole warp's reads of the stage are before
 * it). Use u of stage s (u = t / STAGES) is phase u: waits on full with parity u & 1, on empty
 * with parity (u & 1) ^ 1 (passes at once for u = 0).
 *
 * Shared memory (1024-byte aligned; every tile is 64-column slabs of 128-byte rows in the
 * 128-byte swizzle, each slab 1024-byte aligned; layout and descriptors as fa_ptx.cuh's Hopper
 * section): K [4][64][64] | V [4][64][64] | Q [STAGES][4][64][64] | dO [STAGES][4][64][64] |
 * dS [2 consumers][2 buffers][64][64] | LSE2 [STAGES][64] fp32 | D [STAGES][64] fp32 | mbarriers.
 * TMA maps view a [b, rows, heads, d] tensor as 4-D {d, rows, heads, b}; one box {64, 64, 1, 1} at
 * column 64·s lands as slab s.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <math_constants.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"
#include "hbwd_ptx.cuh"
#include "hopper_bwd.h"

/* Debug build (-DHBWD_DEBUG_HANG=1): a wait on an mbarrier longer than HBWD_WATCHDOG_NS prints
 * the block, thread, barrier (shared offset from the aligned base) and parity, then traps, so a
 * pipeline bug fails in seconds instead of hanging the device call. Not in the measured build
 * (printf and trap cost registers and serialise the wgmma pipeline; lab/hopper/v1/README.md). */
#ifndef HBWD_DEBUG_HANG
#define HBWD_DEBUG_HANG 0
#endif
#ifndef HBWD_WATCHDOG_NS
#define HBWD_WATCHDOG_NS 4000000000ull
#endif
/* 1 (default): issue dQ_c only after dV_c and dK_c retired (32 fewer live registers at the dQ issue;
 * 0, v1's order, issues it behind them and ptxas then serialises the wgmma, C7512). README.md. */
#ifndef HBWD_DQ_AFTER_DKV
#define HBWD_DQ_AFTER_DKV 1
#endif

/* ---- tile shapes ----------------------------------------------------------------------------- */

#define HBWD_HEAD_DIM 256
#define HBWD_ROW_PAD 128 /* workspace rows per (batch, head) are padded to a multiple of this */

struct hbwd_config {
    static constexpr int D = HBWD_HEAD_DIM;
    static constexpr int BLOCK_M = 64;  /* queries per iteration (Sᵀ, dPᵀ: 32 fp32 registers each) */
    static constexpr int BLOCK_N = 64;  /* keys per CTA (wgmma M; both consumers) */
    static constexpr int STAGES = 2;    /* Q/dO ring depth */
    static constexpr int CONSUMER_WGS = 2;
    static constexpr int COLS = D / CONSUMER_WGS; /* head-dim columns of dK, dV, dQ per consumer: 128 */
    static constexpr int THREADS = 128 * (1 + CONSUMER_WGS);
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = 240;
    static constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8; /* 168: the cap __launch_bounds__ sets */
    static constexpr int SLABS = D / 64;
    static constexpr uint32_t KV_SLAB_BYTES = BLOCK_N * 128;
    static constexpr uint32_t KV_BYTES = KV_SLAB_BYTES * SLABS;   /* K or V */
    static constexpr uint32_t Q_SLAB_BYTES = BLOCK_M * 128;       /* Q and dO slabs */
    static constexpr uint32_t Q_BYTES = Q_SLAB_BYTES * SLABS;     /* one Q or dO stage */
    static constexpr uint32_t DS_BYTES = BLOCK_M * 128;           /* one dS copy: [64 queries][64 keys] */
    static constexpr uint32_t VEC_BYTES = BLOCK_M * 4;            /* one LSE2 or D stage */
    static constexpr uint32_t K_OFFSET = 0;
    static constexpr uint32_t V_OFFSET = KV_BYTES;
    static constexpr uint32_t Q_OFFSET = 2 * KV_BYTES;
    static constexpr uint32_t DO_OFFSET = Q_OFFSET + STAGES * Q_BYTES;
    static constexpr uint32_t DS_OFFSET = DO_OFFSET + STAGES * Q_BYTES;
    static constexpr uint32_t LSE_OFFSET = DS_OFFSET + CONSUMER_WGS * 2 * DS_BYTES;
    static constexpr uint32_t DVEC_OFFSET = LSE_OFFSET + STAGES * VEC_BYTES;
    static constexpr uint32_t BAR_OFFSET = DVEC_OFFSET + STAGES * VEC_BYTES;
    static constexpr int NUM_BARRIERS = 1 + 2 * STAGES; /* kv_full, stage_full[S], stage_empty[S] */
    static constexpr uint32_t SMEM_BYTES = BAR_OFFSET + 8 * NUM_BARRIERS + 1024; /* + alignment slack */
    static constexpr uint32_t STAGE_TX = 2 * Q_BYTES;   /* Q and dO by TMA; LSE2/D by st.shared */
    static constexpr int FULL_ARRIVALS = 2;             /* TMA thread + vector warp */
    static constexpr int EMPTY_ARRIVALS = 4 * CONSUMER_WGS; /* lane 0 of every consumer warp */
    /* Issue dV += Pᵀ dO before dPᵀ is awaited (it then overlaps the dS arithmetic): v1's d = 128
     * order, whose register shape (dK, dV 64 + 64, Sᵀ, dPᵀ 32 + 32) this kernel has too. */
    static constexpr bool EARLY_DV = true;
    static constexpr bool DQ_AFTER_DKV = HBWD_DQ_AFTER_DKV != 0;

    static_assert(BLOCK_N == 64, "both consumers share the 64 keys of the block (wgmma M)");
    static_assert(COLS == 128 && COLS % 64 == 0, "each consumer owns two 64-column slabs");
    static_assert(BLOCK_M % 16 == 0 && BLOCK_M <= 256 && BLOCK_M == 64, "wgmma N of Sᵀ; 2 vector rows per lane");
    static_assert(Q_SLAB_BYTES % 1024 == 0 && KV_SLAB_BYTES % 1024 == 0 && DS_OFFSET % 1024 == 0 &&
                      DS_BYTES % 1024 == 0,
                  "every slab on a 1024-byte swizzle atom (descriptor base offset 0)");
    static_assert(LSE_OFFSET % 16 == 0 && BAR_OFFSET % 8 == 0, "vector and mbarrier alignment");
    static_assert(HBWD_ROW_PAD % BLOCK_M == 0, "workspace rows cover whole query blocks");
    static_assert(128 * PRODUCER_REGS + 128 * CONSUMER_WGS * CONSUMER_REGS <= 65536, "register file");
    static_assert(PRODUCER_REGS <= LAUNCH_REGS && CONSUMER_REGS >= LAUNCH_REGS, "setmaxnreg directions");
    static_assert(SMEM_BYTES <= 232448, "H100/H200 opt-in shared memory per block");
};

/* Named barrier ids (0 is __syncthreads): one per consumer, its 128 threads. */
enum hbwd_named_barrier {
    HBWD_BAR_DS_READY = 1 /* + consumer: this consumer's dS copy is in shared memory */
};

/* Kernel arguments besides the tensor maps. */
struct hbwd_params {
    void *dk, *dv;                   /* [b, sk, hkv, d] */
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    float *dq_accum;                 /* [b, hq, sq_pad, d] fp32 (zeroed by the pre-pass) */
    const float *lse2;               /* [b, hq, sq_pad] LSE·log2(e), +inf where P must be 0 */
    const float *dvec;               /* [b, hq, sq_pad] rowsum(dO ∘ O), 0 on padding rows */
    int seqlen_q, seqlen_k, sq_pad, heads_q, group, num_m_blocks, causal;
    float scale_log2;                /* softmax_scale · log2(e) */
    float scale;                     /* softmax_scale (dK's factor) */
};

/* ---- device helpers -------------------------------------------------------------------------- */

/* The dynamic shared memory of the main kernel (its only shared memory); the kernel rounds its
 * address up to 1024 bytes (the base every offset of hbwd_config is from). */
extern __shared__ __align__(1024) uint8_t smem_raw[];

#if HBWD_DEBUG_HANG
/* Prints the barrier as its offset from the aligned base: kv_full = BAR_OFFSET, then
 * stage_full[0 .. STAGES-1], stage_empty[0 .. STAGES-1], 8 bytes apart (README.md lists them). */
__device__ __noinline__ void hbwd_report_hang(uint32_t bar, uint32_t parity) {
    const uint32_t base = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    printf("hopper_bwd: block (%d,%d,%d) thread %d waited more than %llu ms on the mbarrier at base + 0x%x "
           "for parity %u\n",
           (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)threadIdx.x,
           (unsigned long long)(HBWD_WATCHDOG_NS / 1000000ull), bar - base, parity);
}
#endif

/* Block until the phase of parity `parity` of the mbarrier at `bar` has completed. */
__device__ __forceinline__ void hbwd_wait(uint32_t bar, uint32_t parity) {
#if HBWD_DEBUG_HANG
    if (mbarrier_try_wait_parity(bar, parity)) return;
    const uint64_t start = globaltimer_ns();
    while (!mbarrier_try_wait_parity(bar, parity))
        if (globaltimer_ns() - start > HBWD_WATCHDOG_NS) {
            hbwd_report_hang(bar, parity);
            __trap();
        }
#else
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
#endif
}

template <bool BF16>
__device__ __forceinline__ uint32_t hbwd_pack2(float lo, float hi) {
    return BF16 ? cvt_rn_bf16x2_f32(lo, hi) : cvt_rn_f16x2_f32(lo, hi);
}

template <bool BF16>
__device__ __forceinline__ float hbwd_to_float(uint16_t x) {
    if constexpr (BF16) return __bfloat162float(__ushort_as_bfloat16(x));
    else return __half2float(__ushort_as_half(x));
}

/* The iterations of key block n0: (query head of the kv group, query block), query block fastest.
 * Causal: query blocks before the first one whose last row sees key n0 are skipped (key n0 is
 * visible to row i iff n0 <= i + seqlen_k - seqlen_q; some row always sees it, n0 < seqlen_k). */
__device__ __forceinline__ int hbwd_first_m_block(const hbwd_params &prm, int n0) {
    return prm.causal ? max(0, n0 - (prm.seqlen_k - prm.seqlen_q)) / hbwd_config::BLOCK_M : 0;
}

/* acc [64 keys, BLOCK_M queries] = A Bᵀ: A = a K-major [64, d] tile (K or V, slab stride
 * KV_SLAB_BYTES), B = a K-major [BLOCK_M, d] stage (Q or dO); d/16 = 16 k16 steps over the head
 * dim (step kk: slab kk/4, +32·(kk%4) bytes). One commit group; nothing waits here. */
template <bool BF16>
__device__ __forceinline__ void hbwd_issue_abt(float (&acc)[hbwd_config::BLOCK_M / 2], uint32_t a_tile,
                                               uint32_t b_stage) {
    using Cfg = hbwd_config;
    const uint64_t a_desc = wgmma_desc_sw128(a_tile, 16, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(b_stage, 16, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_M / 2; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::D / 16; ++kk) {
        const uint64_t a_step = ((kk / 4) * Cfg::KV_SLAB_BYTES + (kk % 4) * 32) >> 4;
        const uint64_t b_step = ((kk / 4) * Cfg::Q_SLAB_BYTES + (kk % 4) * 32) >> 4;
        wgmma_ss_f32<Cfg::BLOCK_M, BF16>(acc, a_desc + a_step, b_desc + b_step, kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_M / 2; ++i) wgmma_fence_operand(acc[i]);
}

/* acc [64 keys, 128 columns] += Aᵀ-fragments (a_rmem[kk]: keys × queries 16kk..16kk+15, packed)
 * times the 128 columns of a [BLOCK_M, d] stage (dO or Q) that start at b_cols (slab 2c), read
 * MN-major: LBO = slab stride (BLOCK_M·128 B), SBO = 1024 B (8 query rows), k16 step = 16 rows =
 * +2048 B. One commit group; nothing waits here. */
template <bool BF16>
__device__ __forceinline__ void hbwd_issue_atb(float (&acc)[hbwd_config::COLS / 2],
                                               uint32_t (&a_rmem)[hbwd_config::BLOCK_M / 16][4], uint32_t b_cols) {
    using Cfg = hbwd_config;
    const uint64_t b_desc = wgmma_desc_sw128(b_cols, Cfg::Q_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::COLS / 2; ++i) wgmma_fence_operand(acc[i]);
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(a_rmem[kk][x]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
        wgmma_rs_f32_transb<Cfg::COLS, BF16>(acc, a_rmem[kk], b_desc + ((kk * 2048) >> 4), 1);
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::COLS / 2; ++i) wgmma_fence_operand(acc[i]);
}

/* dQ_c [64 queries, 128 columns] = dS (K-major over the 64 keys of one slab: step kk = +32·kk
 * bytes) times K [64 keys, columns 128c..] read MN-major (LBO = K slab stride, SBO = 1024 B,
 * +2048 B per 16 keys). One commit group; nothing waits here. */
template <bool BF16>
__device__ __forceinline__ void hbwd_issue_dq(float (&acc)[hbwd_config::COLS / 2], uint32_t ds_tile, uint32_t k_cols) {
    using Cfg = hbwd_config;
    const uint64_t a_desc = wgmma_desc_sw128(ds_tile, 16, 1024);
    const uint64_t b_desc = wgmma_desc_sw128(k_cols, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::COLS / 2; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk)
        hbwd2_wgmma_ss_f32_transb<Cfg::COLS, BF16>(acc, a_desc + ((kk * 32) >> 4), b_desc + ((kk * 2048) >> 4),
                                                   kk > 0 ? 1 : 0);
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::COLS / 2; ++i) wgmma_fence_operand(acc[i]);
}

/* fp32 accumulator (keys × queries, accumulator layout) -> 16-bit A fragments with K = queries:
 * k-slice kk (queries 16kk .. 16kk+15) is acc[8kk .. 8kk+7], packed pairwise (fa_ptx.cuh). */
template <bool BF16>
__device__ __forceinline__ void hbwd_pack(const float (&acc)[hbwd_config::BLOCK_M / 2],
                                          uint32_t (&frag)[hbwd_config::BLOCK_M / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < hbwd_config::BLOCK_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) frag[kk][x] = hbwd_pack2<BF16>(acc[8 * kk + 2 * x], acc[8 * kk + 2 * x + 1]);
}

/* ---- main kernel ------------------------------------------------------------------------------ */

template <bool BF16>
__global__ void __launch_bounds__(hbwd_config::THREADS, 1)
    hbwd_main_kernel(const __grid_constant__ CUtensorMap tmap_q,  /* {d, sq, hq, b}, box {64, BLOCK_M, 1, 1}  */
                     const __grid_constant__ CUtensorMap tmap_do, /* {d, sq, hq, b}, box {64, BLOCK_M, 1, 1}  */
                     const __grid_constant__ CUtensorMap tmap_k,  /* {d, sk, hkv, b}, box {64, BLOCK_N, 1, 1} */
                     const __grid_constant__ CUtensorMap tmap_v,  /* {d, sk, hkv, b}, box {64, BLOCK_N, 1, 1} */
                     const hbwd_params prm) {
    using Cfg = hbwd_config;
    constexpr int D = Cfg::D, BLOCK_M = Cfg::BLOCK_M, STAGES = Cfg::STAGES, COLS = Cfg::COLS;

    const uint32_t smem = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    uint8_t *const smem_gen = smem_raw + (smem - smem_u32addr(smem_raw)); /* generic view of the same base */
    const uint32_t k_smem = smem + Cfg::K_OFFSET, v_smem = smem + Cfg::V_OFFSET;
    auto q_stage = [&](int s) -> uint32_t { return smem + Cfg::Q_OFFSET + (uint32_t)s * Cfg::Q_BYTES; };
    auto do_stage = [&](int s) -> uint32_t { return smem + Cfg::DO_OFFSET + (uint32_t)s * Cfg::Q_BYTES; };
    const uint32_t bars = smem + Cfg::BAR_OFFSET;
    const uint32_t kv_full = bars;
    auto stage_full = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + s); };
    auto stage_empty = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + STAGES + s); };
    auto lse_stage = [&](int s) -> float * {
        return reinterpret_cast<float *>(smem_gen + Cfg::LSE_OFFSET + s * Cfg::VEC_BYTES);
    };
    auto dvec_stage = [&](int s) -> float * {
        return reinterpret_cast<float *>(smem_gen + Cfg::DVEC_OFFSET + s * Cfg::VEC_BYTES);
    };

    const int n0 = blockIdx.x * Cfg::BLOCK_N, head_kv = blockIdx.y, batch = blockIdx.z;
    const int m_first = hbwd_first_m_block(prm, n0);
    const int n_m = prm.num_m_blocks - m_first;
    const int iterations = prm.group * n_m;

    /* barriers: initialised by one thread, fence.mbarrier_init, then a CTA barrier */
    if (threadIdx.x == 0) {
        mbarrier_init(kv_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(stage_full(s), Cfg::FULL_ARRIVALS);
            mbarrier_init(stage_empty(s), Cfg::EMPTY_ARRIVALS);
        }
        fence_mbarrier_init_release_cluster();
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        /* ================= producer ================= */
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        const int pwarp = threadIdx.x / 32, plane = threadIdx.x % 32;
        if (pwarp == 0 && plane == 0) {
            /* TMA thread */
            tma_prefetch_tensormap(&tmap_q);
            tma_prefetch_tensormap(&tmap_do);
            tma_prefetch_tensormap(&tmap_k);
            tma_prefetch_tensormap(&tmap_v);
            /* K and V once; rows past seqlen_k are zero-filled and counted */
            mbarrier_arrive_expect_tx(kv_full, 2 * Cfg::KV_BYTES);
#pragma unroll
            for (int slab = 0; slab < Cfg::SLABS; ++slab) {
                tma_load_4d(k_smem + (uint32_t)slab * Cfg::KV_SLAB_BYTES, &tmap_k, kv_full, 64 * slab, n0, head_kv,
                            batch);
                tma_load_4d(v_smem + (uint32_t)slab * Cfg::KV_SLAB_BYTES, &tmap_v, kv_full, 64 * slab, n0, head_kv,
                            batch);
            }
            for (int t = 0; t < iterations; ++t) {
                const int s = t % STAGES, use = t / STAGES;
                const int head = head_kv * prm.group + t / n_m, m0 = (m_first + t % n_m) * BLOCK_M;
                hbwd_wait(stage_empty(s), (use & 1) ^ 1);
                mbarrier_arrive_expect_tx(stage_full(s), Cfg::STAGE_TX);
#pragma unroll
                for (int slab = 0; slab < Cfg::SLABS; ++slab) {
                    tma_load_4d(q_stage(s) + (uint32_t)slab * Cfg::Q_SLAB_BYTES, &tmap_q, stage_full(s), 64 * slab,
                                m0, head, batch);
                    tma_load_4d(do_stage(s) + (uint32_t)slab * Cfg::Q_SLAB_BYTES, &tmap_do, stage_full(s),
                                64 * slab, m0, head, batch);
                }
            }
        } else if (pwarp == 1) {
            /* vector warp: LSE2_t and D_t (BLOCK_M = 64 rows: 2 per lane) into stage s by st.shared */
            for (int t = 0; t < iterations; ++t) {
                const int s = t % STAGES, use = t / STAGES;
                const int head = head_kv * prm.group + t / n_m, m0 = (m_first + t % n_m) * BLOCK_M;
                const int64_t vec_row = ((int64_t)batch * prm.heads_q + head) * prm.sq_pad + m0;
                /* global loads first: their latency overlaps the wait */
                const float l0 = prm.lse2[vec_row + plane], l1 = prm.lse2[vec_row + 32 + plane];
                const float d0 = prm.dvec[vec_row + plane], d1 = prm.dvec[vec_row + 32 + plane];
                hbwd_wait(stage_empty(s), (use & 1) ^ 1);
                float *lse_s = lse_stage(s), *dvec_s = dvec_stage(s);
                lse_s[plane] = l0;
                lse_s[32 + plane] = l1;
                dvec_s[plane] = d0;
                dvec_s[32 + plane] = d1;
                __syncwarp(); /* every lane's st.shared before lane 0's release-arrive */
                if (plane == 0) mbarrier_arrive(stage_full(s));
            }
        }
        return;
    }

    /* ================= consumers ================= */
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int consumer = warpgroup - 1;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    /* this thread's accumulator rows (keys): key0 and key0 + 8; columns (queries or head-dim
     * columns) 8j + 2(l%4) + {0,1} */
    const int key0 = n0 + 16 * warp + lane / 4;
    const int col_in = 2 * (lane % 4);
    const int shift = prm.seqlen_k - prm.seqlen_q;
    const int col0 = COLS * consumer;                                   /* this consumer's head-dim columns */
    const uint32_t col_slab_off = (uint32_t)(col0 / 64) * Cfg::Q_SLAB_BYTES; /* in a Q/dO stage */
    const uint32_t k_cols = k_smem + (uint32_t)(col0 / 64) * Cfg::KV_SLAB_BYTES;
    const uint32_t ds_base = smem + Cfg::DS_OFFSET + (uint32_t)consumer * 2 * Cfg::DS_BYTES;
    /* Does the block need a mask against query block m0? Its last key is past the keys, or
     * (causal) not visible to the block's first row. */
    const int last_key = n0 + Cfg::BLOCK_N - 1;

    float dk_rmem[COLS / 2], dv_rmem[COLS / 2];
#pragma unroll
    for (int i = 0; i < COLS / 2; ++i) {
        dk_rmem[i] = 0.0f;
        dv_rmem[i] = 0.0f;
    }

    hbwd_wait(kv_full, 0);

    for (int t = 0; t < iterations; ++t) {
        const int s = t % STAGES, use = t / STAGES;
        const int head = head_kv * prm.group + t / n_m, m0 = (m_first + t % n_m) * BLOCK_M;
        const float *lse2_smem = lse_stage(s);
        const float *dvec_smem = dvec_stage(s);
        const uint32_t ds_tile = ds_base + (uint32_t)(t & 1) * Cfg::DS_BYTES;

        float s_rmem[BLOCK_M / 2], dp_rmem[BLOCK_M / 2];
        uint32_t p_rmem[BLOCK_M / 16][4], ds_rmem[BLOCK_M / 16][4];

        hbwd_wait(stage_full(s), use & 1);
        hbwd_issue_abt<BF16>(s_rmem, k_smem, q_stage(s));   /* group: Sᵀ  */
        hbwd_issue_abt<BF16>(dp_rmem, v_smem, do_stage(s)); /* group: dPᵀ */

        wgmma_wait_group<1>(); /* Sᵀ ready; dPᵀ may still run */
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) wgmma_fence_operand(s_rmem[i]);

        /* mask: element 4j + 2h + c is key key0 + 8h, query m0 + 8j + col_in + c */
        if (last_key >= prm.seqlen_k || (prm.causal && last_key > m0 + shift)) {
#pragma unroll
            for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int key = key0 + 8 * h, query = m0 + 8 * j + col_in + c;
                        if (key >= prm.seqlen_k || (prm.causal && key > query + shift))
                            s_rmem[4 * j + 2 * h + c] = -CUDART_INF_F;
                    }
        }
        /* P = 2^(s·scale·log2e - LSE2[query]): one FFMA + one MUFU.EX2; LSE2 = +inf gives 0 */
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j) {
            const float2 lse2 = *reinterpret_cast<const float2 *>(lse2_smem + 8 * j + col_in);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                s_rmem[4 * j + 2 * h] = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h], prm.scale_log2, -lse2.x));
                s_rmem[4 * j + 2 * h + 1] =
                    ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h + 1], prm.scale_log2, -lse2.y));
            }
        }
        if constexpr (Cfg::EARLY_DV) {
            hbwd_pack<BF16>(s_rmem, p_rmem);
            hbwd_issue_atb<BF16>(dv_rmem, p_rmem, do_stage(s) + col_slab_off); /* group: dV_c += Pᵀ dO */
            wgmma_wait_group<1>(); /* dPᵀ ready; dV may still run */
        } else {
            wgmma_wait_group<0>(); /* dPᵀ ready */
        }
#pragma unroll
        for (int i = 0; i < BLOCK_M / 2; ++i) wgmma_fence_operand(dp_rmem[i]);
        /* dS = P ∘ (dP - D[query]) (P in fp32) */
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j) {
            const float2 dv2 = *reinterpret_cast<const float2 *>(dvec_smem + 8 * j + col_in);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                dp_rmem[4 * j + 2 * h] = s_rmem[4 * j + 2 * h] * (dp_rmem[4 * j + 2 * h] - dv2.x);
                dp_rmem[4 * j + 2 * h + 1] = s_rmem[4 * j + 2 * h + 1] * (dp_rmem[4 * j + 2 * h + 1] - dv2.y);
            }
        }
        if constexpr (!Cfg::EARLY_DV) hbwd_pack<BF16>(s_rmem, p_rmem);
        hbwd_pack<BF16>(dp_rmem, ds_rmem);

        /* dSᵀ -> this consumer's dS buffer t % 2, rows = queries, 64 keys per row. stmatrix.trans
         * of k-slice kk: matrix i = lane / 8 (i & 1: keys +8, i >> 1: queries +8), stored row
         * R = lane % 8 is query 16kk + 8(i >> 1) + R, holding the 8 keys 16w + 8(i & 1) .. +7 =
         * 16-byte chunk 2w + (i & 1) of the row, swizzled by the row's bits 0-2 (= R). */
        {
            const int i = lane / 8, r = lane % 8;
            const uint32_t chunk = (uint32_t)((2 * warp + (i & 1)) ^ r);
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
                const int query = 16 * kk + 8 * (i >> 1) + r;
                hbwd2_stmatrix_x4_trans(ds_tile + (uint32_t)query * 128 + chunk * 16, ds_rmem[kk]);
            }
        }
        if constexpr (!Cfg::EARLY_DV)
            hbwd_issue_atb<BF16>(dv_rmem, p_rmem, do_stage(s) + col_slab_off); /* group: dV_c += Pᵀ dO */
        hbwd_issue_atb<BF16>(dk_rmem, ds_rmem, q_stage(s) + col_slab_off);    /* group: dK_c += dSᵀ Q */

        /* st.shared-class writes (generic proxy) -> wgmma reads (async proxy): each writer fences,
         * then the 4 warps of this consumer meet (the dQ GEMM reads all their rows) */
        fence_proxy_async_shared_cta();
        bar_sync(HBWD_BAR_DS_READY + consumer, 128);
        if constexpr (Cfg::DQ_AFTER_DKV) {
            wgmma_wait_group<0>(); /* dV_c, dK_c retired: their A fragments are free */
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk)
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    wgmma_fence_operand(p_rmem[kk][x]);
                    wgmma_fence_operand(ds_rmem[kk][x]);
                }
        }

        float dq_rmem[COLS / 2];
        hbwd_issue_dq<BF16>(dq_rmem, ds_tile, k_cols); /* group: dQ_c */
        wgmma_wait_group<0>();
#pragma unroll
        for (int i = 0; i < COLS / 2; ++i) {
            wgmma_fence_operand(dq_rmem[i]);
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
        /* this warp's GEMMs on Q_t, dO_t are retired and all its lanes' ld.shared of LSE2_t, D_t
         * are done (__syncwarp orders them before lane 0's release-arrive) */
        __syncwarp();
        if (lane == 0) mbarrier_arrive(stage_empty(s));

        /* dQ_c += into the fp32 accumulator: rows 16w + l/4 + 8h, columns col0 + 8j + col_in +
         * {0,1}; rows past seqlen_q are skipped (their dS is 0 anyway) */
        float *dq_head = prm.dq_accum + (((int64_t)batch * prm.heads_q + head) * prm.sq_pad + m0) * D + col0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * warp + lane / 4 + 8 * h;
            if (m0 + row < prm.seqlen_q) {
#pragma unroll
                for (int j = 0; j < COLS / 8; ++j)
                    hbwd2_red_add_v2_f32(dq_head + (int64_t)row * D + 8 * j + col_in, dq_rmem[4 * j + 2 * h],
                                         dq_rmem[4 * j + 2 * h + 1]);
            }
        }
    }

    /* ---- epilogue: dK (scaled) and dV rows key0, key0 + 8, columns col0.. of this kv head,
     * 4-byte stores */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h;
        if (key >= prm.seqlen_k) continue;
        uint16_t *dk_row = static_cast<uint16_t *>(prm.dk) + (int64_t)batch * prm.dk_batch_stride +
                           (int64_t)key * prm.dk_row_stride + (int64_t)head_kv * prm.dk_head_stride + col0;
        uint16_t *dv_row = static_cast<uint16_t *>(prm.dv) + (int64_t)batch * prm.dv_batch_stride +
                           (int64_t)key * prm.dv_row_stride + (int64_t)head_kv * prm.dv_head_stride + col0;
#pragma unroll
        for (int j = 0; j < COLS / 8; ++j) {
            const int col = 8 * j + col_in;
            *reinterpret_cast<uint32_t *>(dk_row + col) =
                hbwd_pack2<BF16>(dk_rmem[4 * j + 2 * h] * prm.scale, dk_rmem[4 * j + 2 * h + 1] * prm.scale);
            *reinterpret_cast<uint32_t *>(dv_row + col) = hbwd_pack2<BF16>(dv_rmem[4 * j + 2 * h], dv_rmem[4 * j + 2 * h + 1]);
        }
    }
}

/* ---- pre-pass and dQ conversion ---------------------------------------------------------------- */

/* One warp per workspace row (b, h, i), i < sq_pad: D = rowsum(dO ∘ O) in fp32 and LSE2 for
 * i < seqlen_q (LSE = -inf: +inf), D = 0 and LSE2 = +inf on padding rows; the dQ accumulator
 * row set to 0. Lanes read pairs of columns. */
template <bool BF16>
__global__ void __launch_bounds__(256) hbwd_prepass_kernel(const uint16_t *o, int64_t o_bs, int64_t o_rs, int64_t o_hs,
                                                          const uint16_t *dout, int64_t do_bs, int64_t do_rs,
                                                          int64_t do_hs, const float *lse, float *lse2, float *dvec,
                                                          float *dq_accum, int heads_q, int seqlen_q, int sq_pad,
                                                          int head_dim, int64_t total_rows) {
    const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= total_rows) return;
    const int i = (int)(row % sq_pad);
    const int64_t bh = row / sq_pad;
    const int h = (int)(bh % heads_q), b = (int)(bh / heads_q);
    float *dq_row = dq_accum + row * head_dim;
    for (int c = lane; c < head_dim; c += 32) dq_row[c] = 0.0f;
    float sum = 0.0f, l2 = CUDART_INF_F;
    if (i < seqlen_q) {
        const uint16_t *o_row = o + (int64_t)b * o_bs + (int64_t)i * o_rs + (int64_t)h * o_hs;
        const uint16_t *do_row = dout + (int64_t)b * do_bs + (int64_t)i * do_rs + (int64_t)h * do_hs;
        for (int c = 2 * lane; c < head_dim; c += 64) {
            const uint32_t ov = *reinterpret_cast<const uint32_t *>(o_row + c);
            const uint32_t dv = *reinterpret_cast<const uint32_t *>(do_row + c);
            sum += hbwd_to_float<BF16>((uint16_t)(ov & 0xFFFF)) * hbwd_to_float<BF16>((uint16_t)(dv & 0xFFFF));
            sum += hbwd_to_float<BF16>((uint16_t)(ov >> 16)) * hbwd_to_float<BF16>((uint16_t)(dv >> 16));
        }
        const float x = lse[bh * seqlen_q + i];
        l2 = x == -CUDART_INF_F ? CUDART_INF_F : x * 1.4426950408889634f;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
        dvec[row] = sum;
        lse2[row] = l2;
    }
}

/* dQ[b, i, h, c] = 16-bit(scale · accumulator[b, h, i, c]), one thread per pair of columns. */
template <bool BF16>
__global__ void __launch_bounds__(256) hbwd_convert_dq_kernel(const float *dq_accum, uint16_t *dq, int64_t dq_bs,
                                                             int64_t dq_rs, int64_t dq_hs, int heads_q, int seqlen_q,
                                                             int sq_pad, int head_dim, float scale, int64_t pairs) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    const int c = (int)(idx % (head_dim / 2)) * 2;
    int64_t rest = idx / (head_dim / 2);
    const int h = (int)(rest % heads_q);
    rest /= heads_q;
    const int i = (int)(rest % seqlen_q);
    const int b = (int)(rest / seqlen_q);
    const float2 acc =
        *reinterpret_cast<const float2 *>(dq_accum + (((int64_t)b * heads_q + h) * sq_pad + i) * head_dim + c);
    *reinterpret_cast<uint32_t *>(dq + (int64_t)b * dq_bs + (int64_t)i * dq_rs + (int64_t)h * dq_hs + c) =
        hbwd_pack2<BF16>(acc.x * scale, acc.y * scale);
}

/* ---- host ------------------------------------------------------------------------------------ */

static __thread char hbwd_error_text[512];

static int hbwd_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hbwd_error_text, sizeof hbwd_error_text, fmt, ap);
    va_end(ap);
    return status;
}

extern "C" const char *hopper_bwd_last_error(void) { return hbwd_error_text; }

static int64_t hbwd_sq_pad(int64_t seqlen_q) { return (seqlen_q + HBWD_ROW_PAD - 1) / HBWD_ROW_PAD * HBWD_ROW_PAD; }

extern "C" int64_t hopper_bwd_workspace_size(int64_t batch, int64_t seqlen_q, int64_t heads_q, int64_t head_dim) {
    if (head_dim != HBWD_HEAD_DIM) return -1;
    const int64_t rows = batch * heads_q * hbwd_sq_pad(seqlen_q);
    return rows * head_dim * 4 + 2 * rows * 4; /* dq_accum | lse2 | dvec, each a multiple of 512 bytes */
}

extern "C" int hopper_bwd_tile_shape(int head_dim, int *block_m, int *block_n, int *stages, int *smem_bytes) {
    if (head_dim != HBWD_HEAD_DIM) return -1;
    if (block_m) *block_m = hbwd_config::BLOCK_M;
    if (block_n) *block_n = hbwd_config::BLOCK_N;
    if (stages) *stages = hbwd_config::STAGES;
    if (smem_bytes) *smem_bytes = (int)hbwd_config::SMEM_BYTES;
    return 0;
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda at link time). */
static PFN_cuTensorMapEncodeTiled_v12000 hbwd_encode_fn(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
        void *ptr = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)ptr;
        else
            (void)cudaGetLastError();
    });
    return fn;
}

/* A [batch, rows, heads, d] 16-bit tensor (strides in elements, checked by the caller: multiples
 * of 8) as the 4-D map {d, rows, heads, batch} with box {64, box_rows, 1, 1}, 128-byte swizzle,
 * zero fill (the library forward's convention, src/cuda/fwd_hopper_sm90a.cu). */
static int hbwd_make_map(CUtensorMap *map, const char *name, CUtensorMapDataType type, const void *base, int64_t d,
                         int64_t rows, int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                         int64_t batch_stride, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = hbwd_encode_fn();
    if (encode == nullptr) return hbwd_fail(FA_ERR_CUDA, "cuTensorMapEncodeTiled is not available from the CUDA driver");
    const int64_t strides_el[3] = {row_stride, head_stride, batch_stride};
    const int64_t extents[3] = {rows, heads, batch};
    cuuint64_t stride_bytes[3];
    for (int i = 0; i < 3; ++i) {
        const int64_t s = extents[i] == 1 ? 8 : strides_el[i]; /* never stepped along: any valid stride */
        stride_bytes[i] = (cuuint64_t)(2 * s);
    }
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)batch};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, type, 4, const_cast<void *>(base), dims, stride_bytes, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return hbwd_fail(FA_ERR_CUDA,
                         "cuTensorMapEncodeTiled(%s) failed with CUresult %d: dims {%llu, %llu, %llu, %llu}, byte "
                         "strides {%llu, %llu, %llu}, box {64, %d, 1, 1}",
                         name, (int)r, (unsigned long long)dims[0], (unsigned long long)dims[1],
                         (unsigned long long)dims[2], (unsigned long long)dims[3], (unsigned long long)stride_bytes[0],
                         (unsigned long long)stride_bytes[1], (unsigned long long)stride_bytes[2], box_rows);
    return FA_OK;
}

#define HBWD_CUDA(call, what)                                                                           \
    do {                                                                                                \
        const cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) return hbwd_fail(FA_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e_));   \
    } while (0)

template <bool BF16>
static int hbwd_launch(const hopper_bwd_args *a, float scale) {
    using Cfg = hbwd_config;
    constexpr int HEAD_DIM = Cfg::D;
    const CUtensorMapDataType type = BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    cudaStream_t stream = (cudaStream_t)a->stream;
    CUtensorMap tmap_q, tmap_do, tmap_k, tmap_v;
    int st;
    if ((st = hbwd_make_map(&tmap_q, "q", type, a->q, HEAD_DIM, a->seqlen_q, a->heads_q, a->batch, a->q_row_stride,
                            a->q_head_stride, a->q_batch_stride, Cfg::BLOCK_M)) != FA_OK ||
        (st = hbwd_make_map(&tmap_do, "dout", type, a->dout, HEAD_DIM, a->seqlen_q, a->heads_q, a->batch,
                            a->do_row_stride, a->do_head_stride, a->do_batch_stride, Cfg::BLOCK_M)) != FA_OK ||
        (st = hbwd_make_map(&tmap_k, "k", type, a->k, HEAD_DIM, a->seqlen_k, a->heads_kv, a->batch, a->k_row_stride,
                            a->k_head_stride, a->k_batch_stride, Cfg::BLOCK_N)) != FA_OK ||
        (st = hbwd_make_map(&tmap_v, "v", type, a->v, HEAD_DIM, a->seqlen_k, a->heads_kv, a->batch, a->v_row_stride,
                            a->v_head_stride, a->v_batch_stride, Cfg::BLOCK_N)) != FA_OK)
        return st;

    static int configured[64];
    int device = 0;
    HBWD_CUDA(cudaGetDevice(&device), "cudaGetDevice");
    if (device >= 64 || !__atomic_load_n(&configured[device], __ATOMIC_ACQUIRE)) {
        HBWD_CUDA(cudaFuncSetAttribute(hbwd_main_kernel<BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)Cfg::SMEM_BYTES),
                  "cudaFuncSetAttribute(backward shared memory)");
        if (device < 64) __atomic_store_n(&configured[device], 1, __ATOMIC_RELEASE);
    }

    const int64_t sq_pad = hbwd_sq_pad(a->seqlen_q);
    const int64_t rows = a->batch * a->heads_q * sq_pad;
    float *dq_accum = static_cast<float *>(a->workspace);
    float *lse2 = dq_accum + rows * HEAD_DIM;
    float *dvec = lse2 + rows;

    hbwd_prepass_kernel<BF16><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
        static_cast<const uint16_t *>(a->o), a->o_batch_stride, a->o_row_stride, a->o_head_stride,
        static_cast<const uint16_t *>(a->dout), a->do_batch_stride, a->do_row_stride, a->do_head_stride, a->lse, lse2,
        dvec, dq_accum, (int)a->heads_q, (int)a->seqlen_q, (int)sq_pad, HEAD_DIM, rows);
    HBWD_CUDA(cudaGetLastError(), "pre-pass launch");

    hbwd_params prm;
    prm.dk = a->dk;
    prm.dv = a->dv;
    prm.dk_batch_stride = a->dk_batch_stride;
    prm.dk_row_stride = a->dk_row_stride;
    prm.dk_head_stride = a->dk_head_stride;
    prm.dv_batch_stride = a->dv_batch_stride;
    prm.dv_row_stride = a->dv_row_stride;
    prm.dv_head_stride = a->dv_head_stride;
    prm.dq_accum = dq_accum;
    prm.lse2 = lse2;
    prm.dvec = dvec;
    prm.seqlen_q = (int)a->seqlen_q;
    prm.seqlen_k = (int)a->seqlen_k;
    prm.sq_pad = (int)sq_pad;
    prm.heads_q = (int)a->heads_q;
    prm.group = (int)(a->heads_q / a->heads_kv);
    prm.num_m_blocks = (int)((a->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M);
    prm.causal = a->causal != 0;
    prm.scale_log2 = scale * 1.4426950408889634f;
    prm.scale = scale;
    const dim3 grid((unsigned)((a->seqlen_k + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N), (unsigned)a->heads_kv,
                    (unsigned)a->batch);
    hbwd_main_kernel<BF16><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(tmap_q, tmap_do, tmap_k, tmap_v,
                                                                                     prm);
    HBWD_CUDA(cudaGetLastError(), "main kernel launch");

    const int64_t pairs = a->batch * a->seqlen_q * a->heads_q * (HEAD_DIM / 2);
    hbwd_convert_dq_kernel<BF16><<<(unsigned)((pairs + 255) / 256), 256, 0, stream>>>(
        dq_accum, static_cast<uint16_t *>(a->dq), a->dq_batch_stride, a->dq_row_stride, a->dq_head_stride,
        (int)a->heads_q, (int)a->seqlen_q, (int)sq_pad, HEAD_DIM, scale, pairs);
    HBWD_CUDA(cudaGetLastError(), "dQ conversion launch");
    return FA_OK;
}

/* Every precondition, before anything is launched or written. */
static int hbwd_validate(const hopper_bwd_args *a, float *scale) {
    if (a == nullptr) return hbwd_fail(FA_ERR_NULL_POINTER, "args is NULL");
    if (a->dtype != FA_DTYPE_F16 && a->dtype != FA_DTYPE_BF16)
        return hbwd_fail(FA_ERR_DTYPE, "dtype %d: the Hopper backward takes f16 (1) or bf16 (2)", a->dtype);
    if (a->head_dim != HBWD_HEAD_DIM)
        return hbwd_fail(FA_ERR_HEAD_DIM, "head_dim = %lld: this lab Hopper backward (v2) has d = 256 only",
                         (long long)a->head_dim);
    if (a->batch < 1 || a->seqlen_q < 1 || a->seqlen_k < 1 || a->heads_q < 1 || a->heads_kv < 1)
        return hbwd_fail(FA_ERR_INVALID_SIZE,
                         "batch %lld, seqlen_q %lld, seqlen_k %lld, heads_q %lld, heads_kv %lld: all must be >= 1",
                         (long long)a->batch, (long long)a->seqlen_q, (long long)a->seqlen_k, (long long)a->heads_q,
                         (long long)a->heads_kv);
    if (a->seqlen_q > (1 << 30) || a->seqlen_k > (1 << 30) || a->heads_q > 65535 || a->batch > 65535)
        return hbwd_fail(FA_ERR_INVALID_SIZE, "sizes too large for the lab kernel's grid and int rows");
    if (a->heads_q % a->heads_kv != 0)
        return hbwd_fail(FA_ERR_HEADS, "heads_q = %lld is not a multiple of heads_kv = %lld", (long long)a->heads_q,
                         (long long)a->heads_kv);
    const struct {
        const char *name;
        const void *ptr;
    } ptrs[] = {{"q", a->q},   {"k", a->k},   {"v", a->v},   {"o", a->o},       {"dout", a->dout}, {"lse", a->lse},
                {"dq", a->dq}, {"dk", a->dk}, {"dv", a->dv}, {"workspace", a->workspace}};
    for (const auto &p : ptrs) {
        if (p.ptr == nullptr) return hbwd_fail(FA_ERR_NULL_POINTER, "%s is NULL", p.name);
        if (((uintptr_t)p.ptr & 15u) != 0)
            return hbwd_fail(FA_ERR_ALIGNMENT, "%s = %p is not 16-byte aligned", p.name, p.ptr);
    }
    const struct {
        const char *name;
        int64_t v;
    } strides[] = {{"q_batch_stride", a->q_batch_stride},   {"q_row_stride", a->q_row_stride},
                   {"q_head_stride", a->q_head_stride},     {"k_batch_stride", a->k_batch_stride},
                   {"k_row_stride", a->k_row_stride},       {"k_head_stride", a->k_head_stride},
                   {"v_batch_stride", a->v_batch_stride},   {"v_row_stride", a->v_row_stride},
                   {"v_head_stride", a->v_head_stride},     {"o_batch_stride", a->o_batch_stride},
                   {"o_row_stride", a->o_row_stride},       {"o_head_stride", a->o_head_stride},
                   {"do_batch_stride", a->do_batch_stride}, {"do_row_stride", a->do_row_stride},
                   {"do_head_stride", a->do_head_stride},   {"dq_batch_stride", a->dq_batch_stride},
                   {"dq_row_stride", a->dq_row_stride},     {"dq_head_stride", a->dq_head_stride},
                   {"dk_batch_stride", a->dk_batch_stride}, {"dk_row_stride", a->dk_row_stride},
                   {"dk_head_stride", a->dk_head_stride},   {"dv_batch_stride", a->dv_batch_stride},
                   {"dv_row_stride", a->dv_row_stride},     {"dv_head_stride", a->dv_head_stride}};
    for (const auto &s : strides) {
        if (s.v < 0 || s.v % 8 != 0)
            return hbwd_fail(FA_ERR_ALIGNMENT, "%s = %lld: must be a non-negative multiple of 8 elements (16 bytes)",
                             s.name, (long long)s.v);
        if (2 * s.v >= ((int64_t)1 << 40))
            return hbwd_fail(FA_ERR_STRIDE, "%s = %lld: TMA strides must be below 2^40 bytes", s.name, (long long)s.v);
    }
    float sc = a->softmax_scale;
    if (sc == 0.0f) sc = 1.0f / sqrtf((float)a->head_dim);
    if (!(sc > 0.0f) || isinf(sc))
        return hbwd_fail(FA_ERR_SCALE, "softmax_scale = %g: must be finite and > 0 (0 = 1/sqrt(d))",
                         (double)a->softmax_scale);
    const int64_t need = hopper_bwd_workspace_size(a->batch, a->seqlen_q, a->heads_q, a->head_dim);
    if (a->workspace_bytes < need)
        return hbwd_fail(FA_ERR_WORKSPACE, "workspace_bytes = %lld < %lld (hopper_bwd_workspace_size)",
                         (long long)a->workspace_bytes, (long long)need);
    *scale = sc;
    return FA_OK;
}

extern "C" int hopper_bwd(const hopper_bwd_args *a) {
    float scale = 0.0f;
    const int st = hbwd_validate(a, &scale);
    if (st != FA_OK) return st;
    return a->dtype == FA_DTYPE_BF16 ? hbwd_launch<true>(a, scale) : hbwd_launch<false>(a, scale);
}
