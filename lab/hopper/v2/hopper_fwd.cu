/*
 * hopper_fwd.cu: FlashAttention-3-style forward kernel for Hopper (sm_90a), lab version 2
 * (v1 + tile shapes as knobs and 3 consumer warpgroups; see README.md for what was measured).
 *
 *   bf16 / fp16, d = dv = 64, 128, 256, MHA/GQA/MQA, fixed-length batches, causal (bottom-right)
 *   or not; O and LSE exactly as fa_forward defines them. Build (see run_on_gpu.sh):
 *     nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Ilab/hopper/v2 -shared ...
 *
 * One CTA = BLOCK_M query rows (128, or 192 at d = 64) of one (batch, query head); one producer
 * warpgroup and C = BLOCK_M / 64 consumer warpgroups (384 or 512 threads):
 *
 *   warpgroup 0, producer (setmaxnreg 24): one thread issues every TMA load. Q [BLOCK_M, d] once,
 *     then the visible key tiles from the last to the first, K_j and V_j [BLOCK_N, d] each into
 *     a STAGES-deep ring of shared-memory stages, in the order the consumers need them:
 *     K_0, K_1, V_0, K_2, V_1, ... (here j counts tiles in processing order).
 *   warpgroups 1 .. C, consumers (setmaxnreg 240 for C = 2, 160 for C = 3): consumer c owns
 *     query rows 64c .. 64c+63 of the tile. Per key tile j (FlashAttention-3's intra-warpgroup overlap, paper Alg. 2):
 *       issue S_j = Q K_jᵀ          (wgmma m64nBLOCK_Nk16, A = Q and B = K from smem, K-major)
 *       issue O += P_{j-1} V_{j-1}  (wgmma m64nDk16, A = P from registers, B = V MN-major)
 *       wait for S_j only; release K_j's stage; mask; online softmax of S_j (exp2, scale in one
 *       FFMA) while the P·V wgmma still runs;
 *       wait for P·V; release V_{j-1}'s stage; O *= exp2(m_old - m_new); P_j = 16-bit(S_j).
 *     Ping-pong (d <= 128): one named barrier per consumer makes them issue their GEMMs in turns
 *     (round robin), so one warpgroup's softmax overlaps the others' GEMMs (paper §3.1).
 *   Epilogue: O /= rowsum, staged through this warpgroup's rows of the Q tile (same 128-byte
 *   swizzle) and written by a TMA store (rows past seqlen_q are clipped by the tensor map); LSE
 *   by the lane holding column 0 of each row.
 *
 * Shared-memory ring (full/empty mbarriers per stage, separate for K and V):
 *   k_full[s], v_full[s]: 1 arrival (the producer's arrive.expect_tx) + the TMA's bytes.
 *   k_empty[s], v_empty[s]: 4C arrivals, lane 0 of each consumer warp, after that warp's
 *     wgmma.wait_group has retired the GEMM that read the stage.
 *   Use u of stage s (u = tile / STAGES) is phase u: consumers wait full[s] with parity u & 1;
 *   the producer waits empty[s] with parity (u & 1) ^ 1, which passes at once for u = 0.
 *
 * Every tile in shared memory (Q, each K/V stage) is d/64 slabs of [rows, 64] 16-bit elements
 * (128-byte rows), 1024-byte aligned, 128-byte swizzled; the slab layout and the descriptors are
 * documented in hopper_ptx.cuh. The TMA maps view a [b, s, h, d] tensor as 5-D
 * {64, s, d/64, h, b} (innermost first) with byte strides {row, 128, head, batch}, so one box
 * {64, rows, d/64, 1, 1} lands as exactly those slabs, and rows past the sequence are zero-filled.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <math.h>
#include <math_constants.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"
#include "hopper_fwd.h"
#include "hopper_ptx.cuh"

/* Debug build (-DHOPPER_DEBUG_HANG=1): a wait on an mbarrier longer than HOPPER_WATCHDOG_NS
 * nanoseconds prints the block, thread, barrier (shared address) and parity, then traps, so a
 * pipeline bug fails in seconds instead of hanging the device call. Not in the measured build:
 * the printf is a function call, which makes ptxas serialize the wgmma pipeline (warning C7510),
 * and even a bare trap in the consumer path makes it cap the consumers at the launch's 168
 * registers (spills, C7512). */
#ifndef HOPPER_DEBUG_HANG
#define HOPPER_DEBUG_HANG 0
#endif
#ifndef HOPPER_WATCHDOG_NS
#define HOPPER_WATCHDOG_NS 4000000000ull
#endif

/* ---- tile shapes: pure functions of (head dim, causal) ------------------------------------------
 * Lab v2 knobs: every constant below can be overridden with -D to build a variant library
 * (run_on_gpu.sh builds several and times them in one process). The defaults are v2's choices,
 * from the H200 run of 2026-11-29 (README.md): only d = 64 changed (192 × 128, 3 consumers,
 * +7-16 %); 128 × 176 / 192 at d = 128, 3 stages, and 64-key tiles or ping-pong at d = 256 were
 * within noise or slower, so those keep v1's values. The v1 tiles are the variant "v1". */
#ifndef HOPPER_D64_BLOCK_M
#define HOPPER_D64_BLOCK_M 192 /* 192: 3 consumer warpgroups (FlashAttention-3's d = 64 tile); v1: 128 */
#endif
#ifndef HOPPER_D64_BLOCK_N
#define HOPPER_D64_BLOCK_N 128
#endif
#ifndef HOPPER_D64_STAGES
#define HOPPER_D64_STAGES 3
#endif
#ifndef HOPPER_D128_BLOCK_N
#define HOPPER_D128_BLOCK_N 128 /* non-causal; FlashAttention-3 uses 176 */
#endif
#ifndef HOPPER_D128_CAUSAL_BLOCK_N
#define HOPPER_D128_CAUSAL_BLOCK_N 128
#endif
#ifndef HOPPER_D128_STAGES
#define HOPPER_D128_STAGES 2 /* non-causal */
#endif
#ifndef HOPPER_D128_CAUSAL_STAGES
#define HOPPER_D128_CAUSAL_STAGES 2
#endif
#ifndef HOPPER_D256_BLOCK_N
#define HOPPER_D256_BLOCK_N 80
#endif
#ifndef HOPPER_D256_PINGPONG
#define HOPPER_D256_PINGPONG 0
#endif

/* Query rows per CTA: one consumer warpgroup per 64 rows (wgmma's M). 2 consumers (128 rows)
 * get 240 registers each; 3 consumers (192 rows, d = 64 only) get 160, which holds d = 64's
 * S (64 fp32 for 128 keys) + P (32) + O (32) + the overlapped next S only with BLOCK_N = 128. */
__host__ __device__ constexpr int hopper_block_m(int head_dim, int causal) {
    return (void)causal, head_dim == 64 ? HOPPER_D64_BLOCK_M : head_dim == 128 || head_dim == 256 ? 128 : 0;
}

/* Keys per tile. d = 64: 128 (192 with 2 consumers measured no faster). d = 128: 128, causal or
 * not (FlashAttention-3's non-causal 176 measured the same as 128 here, 192 likewise).
 * d = 256: 80, as FlashAttention-3 (O alone is 128 registers, and Q 64 KiB + 2 stages ×
 * (K + V) 40 KiB each = 224 KiB, the shared-memory limit). */
__host__ __device__ constexpr int hopper_block_n(int head_dim, int causal) {
    return head_dim == 64    ? HOPPER_D64_BLOCK_N
           : head_dim == 128 ? (causal ? HOPPER_D128_CAUSAL_BLOCK_N : HOPPER_D128_BLOCK_N)
           : head_dim == 256 ? HOPPER_D256_BLOCK_N
                             : 0;
}

/* K/V stages: as many as the knobs say (the config asserts that they fit in shared memory). */
__host__ __device__ constexpr int hopper_stages(int head_dim, int causal) {
    return head_dim == 64 ? HOPPER_D64_STAGES : head_dim == 128 ? (causal ? HOPPER_D128_CAUSAL_STAGES : HOPPER_D128_STAGES) : 2;
}

/* Ping-pong between the consumer warpgroups: on for d <= 128 (FlashAttention-3 leaves it off at
 * d = 256, where each warpgroup's GEMMs are long enough to hide the other's softmax anyway). */
__host__ __device__ constexpr bool hopper_pingpong(int head_dim, int causal) {
    return (void)causal, head_dim <= 128 ? true : HOPPER_D256_PINGPONG != 0;
}

template <int HEAD_DIM, int BLOCK_M_, int BLOCK_N_, int STAGES_, bool PINGPONG_>
struct hopper_fwd_config {
    static constexpr int D = HEAD_DIM;
    static constexpr int BLOCK_M = BLOCK_M_;
    static constexpr int BLOCK_N = BLOCK_N_;
    static constexpr int STAGES = STAGES_;
    static constexpr bool PINGPONG = PINGPONG_;
    static constexpr int CONSUMER_WGS = BLOCK_M / 64;
    static constexpr int THREADS = 128 * (1 + CONSUMER_WGS);
    /* setmaxnreg budget (FlashAttention-3's values for 16-bit inputs): 2 consumers 24 / 240,
     * 3 consumers 24 / 160. The launch cap is 65536 / THREADS rounded down to 8 (168 or 128). */
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = CONSUMER_WGS == 2 ? 240 : 160;
    static constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8;
    static constexpr int SLABS = D / 64;                 /* 64-column slabs per row           */
    static constexpr uint32_t Q_SLAB_BYTES = BLOCK_M * 128;
    static constexpr uint32_t KV_SLAB_BYTES = BLOCK_N * 128;
    static constexpr uint32_t Q_BYTES = Q_SLAB_BYTES * SLABS;   /* also the Q TMA's tx bytes  */
    static constexpr uint32_t KV_BYTES = KV_SLAB_BYTES * SLABS; /* one K or V stage           */
    static constexpr uint32_t K_OFFSET = Q_BYTES;
    static constexpr uint32_t V_OFFSET = Q_BYTES + STAGES * KV_BYTES;
    static constexpr uint32_t BAR_OFFSET = Q_BYTES + 2 * STAGES * KV_BYTES;
    /* mbarriers: q_full, k_full[S], v_full[S], k_empty[S], v_empty[S] */
    static constexpr int NUM_BARRIERS = 1 + 4 * STAGES;
    static constexpr int EMPTY_ARRIVALS = 4 * CONSUMER_WGS; /* lane 0 of every consumer warp */
    /* + 1024: the dynamic shared window is aligned up to 1024 bytes in the kernel */
    static constexpr uint32_t SMEM_BYTES = BAR_OFFSET + 8 * NUM_BARRIERS + 1024;

    static_assert(D % 64 == 0 && D <= 256, "head dim: whole 64-column slabs, wgmma N <= 256");
    static_assert(BLOCK_M % 64 == 0 && BLOCK_M <= 256, "query tile: whole warpgroups of 64 rows; TMA box <= 256");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256, "key tile: whole k16 steps of P V; TMA box <= 256");
    static_assert(STAGES >= 2, "the K/V ring needs 2 stages (K_j is loaded while V_{j-1} is read)");
    static_assert(KV_SLAB_BYTES % 1024 == 0 && Q_SLAB_BYTES % 1024 == 0,
                  "every slab starts on a 1024-byte swizzle atom (descriptor base offset 0)");
    static_assert(CONSUMER_WGS == 2 || CONSUMER_WGS == 3,
                  "2 or 3 consumer warpgroups (named barrier ids and the register split below)");
    static_assert(128 * PRODUCER_REGS + 128 * CONSUMER_WGS * CONSUMER_REGS <= 65536,
                  "register file: producer + consumers after setmaxnreg");
    static_assert(PRODUCER_REGS <= LAUNCH_REGS && CONSUMER_REGS >= LAUNCH_REGS,
                  "setmaxnreg: the producer only gives registers back, the consumers only take");
    static_assert(SMEM_BYTES <= 232448, "H100/H200 opt-in shared memory per block");
};

/* The configuration the host launches for (d, causal): the pure functions above. Equal tiles
 * give the same type, so causal and non-causal share a kernel when their tiles agree. */
template <int D, int CAUSAL>
using hopper_tiles = hopper_fwd_config<D, hopper_block_m(D, CAUSAL), hopper_block_n(D, CAUSAL),
                                       hopper_stages(D, CAUSAL), hopper_pingpong(D, CAUSAL)>;

/* Named barrier ids (0 is __syncthreads), for up to 3 consumer warpgroups. */
enum hopper_named_barrier {
    HOPPER_BAR_SCHED_FIRST = 1,    /* 1 + c: consumer c may issue its GEMMs (256 threads: c and the
                                      consumer before it in the round-robin order)               */
    HOPPER_BAR_EPILOGUE_FIRST = 4  /* 4 + c: consumer c's O tile is in smem (128 threads)          */
};

struct hopper_fwd_kernel_params {
    float *lse;        /* [b, hq, sq] or NULL                                              */
    int seqlen_q, seqlen_k, heads_q, group;
    int num_m_blocks;
    int causal;
    int heavy_first;   /* grid (hq, b, m blocks), last (longest under causal) m block first */
    float scale_log2;  /* softmax_scale · log2(e), > 0                                     */
};

/* ---- device helpers -------------------------------------------------------------------------- */

#if HOPPER_DEBUG_HANG
__device__ __noinline__ void hopper_report_hang(uint32_t bar, uint32_t parity) {
    printf("hopper_fwd: block (%d,%d,%d) thread %d waited more than %llu ms on the mbarrier at smem "
           "0x%x for parity %u\n",
           (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)threadIdx.x,
           (unsigned long long)(HOPPER_WATCHDOG_NS / 1000000ull), bar, parity);
}
#endif

/* Block until the phase of parity `parity` of the mbarrier at `bar` has completed. */
__device__ __forceinline__ void hopper_mbarrier_wait(uint32_t bar, uint32_t parity) {
#if HOPPER_DEBUG_HANG
    if (mbarrier_try_wait_parity(bar, parity)) return;
    const uint64_t start = globaltimer_ns();
    while (!mbarrier_try_wait_parity(bar, parity))
        if (globaltimer_ns() - start > HOPPER_WATCHDOG_NS) {
            hopper_report_hang(bar, parity);
            __trap();
        }
#else
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
#endif
}

template <bool BF16>
__device__ __forceinline__ uint32_t hopper_pack2(float lo, float hi) {
    return BF16 ? cvt_rn_bf16x2_f32(lo, hi) : cvt_rn_f16x2_f32(lo, hi);
}

__device__ __forceinline__ float hopper_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float hopper_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* S = Q K_jᵀ for this consumer's 64 rows: D/16 wgmma (k16 steps over the head dim). A = Q rows
 * [64c, 64c+64) at q_wg, B = the K stage at k_tile, both K-major: step kk reads slab kk/4 at
 * +32·(kk%4) bytes. The first step has scale-d = 0 (S is overwritten). Issued and committed as
 * one wgmma group; nothing waits here. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void hopper_issue_qk(float (&s_rmem)[Cfg::BLOCK_N / 2], uint32_t q_wg, uint32_t k_tile) {
    const uint64_t q_desc = wgmma_desc_sw128(q_wg, 16, 1024);
    const uint64_t k_desc = wgmma_desc_sw128(k_tile, 16, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::D / 16; ++kk) {
        /* descriptors advance in 16-byte units in their low bits (start-address field) */
        const uint64_t q_step = ((kk / 4) * Cfg::Q_SLAB_BYTES + (kk % 4) * 32) >> 4;
        const uint64_t k_step = ((kk / 4) * Cfg::KV_SLAB_BYTES + (kk % 4) * 32) >> 4;
        wgmma_ss_f32<Cfg::BLOCK_N, BF16>(s_rmem, q_desc + q_step, k_desc + k_step, kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
}

/* O += P V_j: BLOCK_N/16 wgmma (k16 steps over the keys). A = P from registers (p_rmem[kk] is
 * the A fragment of keys 16kk .. 16kk+15, see hopper_ptx.cuh), B = the V stage at v_tile read
 * MN-major: LBO = slab stride (BLOCK_N·128 B), SBO = 1024 B (8 keys), k16 step = +2048 B. One
 * wgmma group; nothing waits here. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void hopper_issue_pv(float (&o_rmem)[Cfg::D / 2], uint32_t (&p_rmem)[Cfg::BLOCK_N / 16][4],
                                                uint32_t v_tile) {
    const uint64_t v_desc = wgmma_desc_sw128(v_tile, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::D / 2; ++i) wgmma_fence_operand(o_rmem[i]);
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(p_rmem[kk][x]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk)
        wgmma_rs_f32_transb<Cfg::D, BF16>(o_rmem, p_rmem[kk], v_desc + ((kk * 2048) >> 4), 1);
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::D / 2; ++i) wgmma_fence_operand(o_rmem[i]);
}

/* Mask S of the tile starting at key n0: key col is visible to query row i iff col < len_k and,
 * causal, col <= i + shift. This thread's elements: rows row0 + 8h, columns n0 + 2(l%4) + 8j + c
 * for s_rmem[4j + 2h + c] (accumulator layout). */
template <class Cfg>
__device__ __forceinline__ void hopper_mask(float (&s_rmem)[Cfg::BLOCK_N / 2], int n0, int row0, int lane,
                                            int len_k, int shift, int causal) {
    const int col0 = n0 + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int limit = len_k;
        if (causal) limit = min(limit, row0 + 8 * h + shift + 1);
        const int visible = limit - col0; /* local columns 8j + c below this are visible */
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if (8 * j + c >= visible) s_rmem[4 * j + 2 * h + c] = -CUDART_INF_F;
    }
}

/* Online softmax of one S tile, base 2. For each of this thread's 2 rows: new max m (raw score
 * units, the quad's 4 lanes agree), alpha = 2^((m_old - m)·scale_log2) (returned: O must be
 * multiplied by it), s <- 2^(s·scale_log2 - m·scale_log2) in place (one FFMA + one MUFU.EX2 per
 * score), row_sum = row_sum·alpha + Σ s (this thread's columns only; the quad is summed once at
 * the end). A row whose max is still -inf uses 0 in place of m·scale_log2: every exp2 is then
 * 2^-inf = 0 and no inf - inf appears. */
template <class Cfg>
__device__ __forceinline__ void hopper_softmax(float (&s_rmem)[Cfg::BLOCK_N / 2], float (&row_max)[2],
                                               float (&row_sum)[2], float (&alpha)[2], float scale_log2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float m = row_max[h];
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j) m = fmaxf(m, fmaxf(s_rmem[4 * j + 2 * h], s_rmem[4 * j + 2 * h + 1]));
        m = hopper_quad_max(m);
        const float m_scaled = m == -CUDART_INF_F ? 0.0f : m * scale_log2;
        alpha[h] = ex2_approx_ftz_f32(row_max[h] * scale_log2 - m_scaled);
        row_max[h] = m;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float p = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h + c], scale_log2, -m_scaled));
                s_rmem[4 * j + 2 * h + c] = p;
                sum += p;
            }
        row_sum[h] = fmaf(row_sum[h], alpha[h], sum);
    }
}

/* P (fp32, accumulator layout) -> 16-bit A fragments of the P V GEMM: k-slice kk of keys
 * 16kk .. 16kk+15 is s_rmem[8kk .. 8kk+7], packed pairwise (see hopper_ptx.cuh). */
template <class Cfg, bool BF16>
__device__ __forceinline__ void hopper_convert_p(const float (&s_rmem)[Cfg::BLOCK_N / 2],
                                                 uint32_t (&p_rmem)[Cfg::BLOCK_N / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_N / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x)
            p_rmem[kk][x] = hopper_pack2<BF16>(s_rmem[8 * kk + 2 * x], s_rmem[8 * kk + 2 * x + 1]);
}

/* Ping-pong turn-taking (see the file comment), generalised to C = 2 or 3 consumers as a
 * round robin 0, 1, .., C-1, 0, ...: consumer c waits on barrier SCHED_FIRST + c before issuing
 * its GEMMs and then arrives on the barrier of consumer (c + 1) % C. Consumer C-1 pre-arrives
 * once on SCHED_FIRST (consumer 0 goes first) and skips its arrival after its last round, so
 * every barrier ends balanced: barrier c sees n syncs by c and n arrivals by c - 1 (mod C), one
 * of them the pre-arrival for c = 0. An arrival can never run ahead into the next phase: the
 * arrival of c - 1 in round j + 1 needs the whole circle of round j, which includes c's sync. */
template <class Cfg>
__device__ __forceinline__ void hopper_sched_wait_turn(int consumer) {
    if (Cfg::PINGPONG) bar_sync(HOPPER_BAR_SCHED_FIRST + consumer, 256);
}

template <class Cfg>
__device__ __forceinline__ void hopper_sched_pass_turn(int consumer, bool last_round) {
    if (!Cfg::PINGPONG) return;
    if (consumer < Cfg::CONSUMER_WGS - 1)
        bar_arrive(HOPPER_BAR_SCHED_FIRST + consumer + 1, 256);
    else if (!last_round)
        bar_arrive(HOPPER_BAR_SCHED_FIRST, 256);
}

template <class Cfg, bool BF16>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    hopper_fwd_kernel(const __grid_constant__ CUtensorMap tmap_q, /* {64, sq, d/64, hq, b}, box {64, BLOCK_M, d/64, 1, 1}*/
                      const __grid_constant__ CUtensorMap tmap_k, /* {64, sk, d/64, hkv, b}, box {64, BLOCK_N, d/64, 1, 1} */
                      const __grid_constant__ CUtensorMap tmap_v, /* as tmap_k                                          */
                      const __grid_constant__ CUtensorMap tmap_o, /* {64, sq, d/64, hq, b}, box {64, 64, 1, 1, 1}      */
                      const hopper_fwd_kernel_params prm) {
    constexpr int BLOCK_M = Cfg::BLOCK_M, BLOCK_N = Cfg::BLOCK_N, STAGES = Cfg::STAGES, D = Cfg::D;

    /* Shared memory, aligned up to 1024 bytes (the swizzle atom): q [SLABS][BLOCK_M][64] |
     * k [STAGES][SLABS][BLOCK_N][64] | v [STAGES][SLABS][BLOCK_N][64] | mbarriers. */
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t smem = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t q_smem = smem;
    auto k_stage = [&](int s) -> uint32_t { return smem + Cfg::K_OFFSET + (uint32_t)s * Cfg::KV_BYTES; };
    auto v_stage = [&](int s) -> uint32_t { return smem + Cfg::V_OFFSET + (uint32_t)s * Cfg::KV_BYTES; };
    const uint32_t bars = smem + Cfg::BAR_OFFSET;
    const uint32_t q_full = bars;
    auto k_full = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + s); };
    auto v_full = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + STAGES + s); };
    auto k_empty = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + 2 * STAGES + s); };
    auto v_empty = [&](int s) -> uint32_t { return bars + 8u * (uint32_t)(1 + 3 * STAGES + s); };

    /* ---- which tile */
    int m_block, head, batch;
    if (prm.heavy_first) {
        head = blockIdx.x;
        batch = blockIdx.y;
        m_block = prm.num_m_blocks - 1 - (int)blockIdx.z;
    } else {
        m_block = blockIdx.x;
        head = blockIdx.y;
        batch = blockIdx.z;
    }
    const int m0 = m_block * BLOCK_M;
    const int len_q = prm.seqlen_q, len_k = prm.seqlen_k;
    const int shift = len_k - len_q; /* bottom-right alignment: row i's diagonal key is i + shift */
    const int head_kv = head / prm.group;
    /* Keys [0, key_end) are visible to some row of the tile (the last valid row sees the most). */
    int key_end = len_k;
    if (prm.causal) key_end = max(0, min(len_k, min(m0 + BLOCK_M, len_q) - 1 + shift + 1));
    const int n_tiles = (key_end + BLOCK_N - 1) / BLOCK_N;

    /* ---- barriers: initialised by one thread, made visible to every thread and to the TMA unit
     * (fence.mbarrier_init), then a CTA barrier before anyone waits or arrives. */
    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(k_full(s), 1);
            mbarrier_init(v_full(s), 1);
            mbarrier_init(k_empty(s), Cfg::EMPTY_ARRIVALS);
            mbarrier_init(v_empty(s), Cfg::EMPTY_ARRIVALS);
        }
        fence_mbarrier_init_release_cluster();
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        /* ================= producer ================= */
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            tma_prefetch_tensormap(&tmap_q);
            tma_prefetch_tensormap(&tmap_k);
            tma_prefetch_tensormap(&tmap_v);
            /* Q: all d/64 slabs in one box; rows past seqlen_q are zero-filled but still counted
             * in the transaction bytes (the full box always lands). */
            mbarrier_arrive_expect_tx(q_full, Cfg::Q_BYTES);
            tma_load_5d(q_smem, &tmap_q, q_full, 0, m0, 0, head, batch);
            /* Tile j (processing order) is key block n_tiles - 1 - j. Order K_0, then K_j before
             * V_{j-1}: the consumers' round j needs K_j first. */
            for (int j = 0; j <= n_tiles; ++j) {
                if (j < n_tiles) {
                    const int s = j % STAGES;
                    hopper_mbarrier_wait(k_empty(s), ((j / STAGES) & 1) ^ 1);
                    mbarrier_arrive_expect_tx(k_full(s), Cfg::KV_BYTES);
                    tma_load_5d(k_stage(s), &tmap_k, k_full(s), 0, (n_tiles - 1 - j) * BLOCK_N, 0, head_kv, batch);
                }
                if (j > 0) {
                    const int jv = j - 1, s = jv % STAGES;
                    hopper_mbarrier_wait(v_empty(s), ((jv / STAGES) & 1) ^ 1);
                    mbarrier_arrive_expect_tx(v_full(s), Cfg::KV_BYTES);
                    tma_load_5d(v_stage(s), &tmap_v, v_full(s), 0, (n_tiles - 1 - jv) * BLOCK_N, 0, head_kv, batch);
                }
            }
        }
        return;
    }

    /* ================= consumers ================= */
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int consumer = warpgroup - 1;
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32;
    const uint32_t q_wg = q_smem + (uint32_t)consumer * 64 * 128; /* rows 64c.. of slab 0       */
    const int row0 = m0 + 64 * consumer + 16 * warp + lane / 4;  /* query row of d[i], (i>>1)&1 = 0 */
    const int wg_row_first = m0 + 64 * consumer;
    const float scale_log2 = prm.scale_log2;

    float o_rmem[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o_rmem[i] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f};
    uint32_t p_rmem[BLOCK_N / 16][4];

    /* Q landed (also before the epilogue reuses q_smem when there is no key tile: the TMA write
     * must be complete before our st.shared). */
    hopper_mbarrier_wait(q_full, 0);

    if (n_tiles > 0) {
        if (Cfg::PINGPONG && consumer == Cfg::CONSUMER_WGS - 1)
            bar_arrive(HOPPER_BAR_SCHED_FIRST, 256); /* consumer 0 goes first */

        /* ---- round 0: S_0 alone */
        {
            float s_rmem[BLOCK_N / 2];
            hopper_mbarrier_wait(k_full(0), 0);
            hopper_sched_wait_turn<Cfg>(consumer);
            hopper_issue_qk<Cfg, BF16>(s_rmem, q_wg, k_stage(0));
            hopper_sched_pass_turn<Cfg>(consumer, n_tiles == 1);
            wgmma_wait_group<0>();
#pragma unroll
            for (int i = 0; i < BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
            if (lane == 0) mbarrier_arrive(k_empty(0)); /* this warp is done reading K_0 */
            const int n0 = (n_tiles - 1) * BLOCK_N;
            if (n0 + BLOCK_N > len_k || (prm.causal && n0 + BLOCK_N - 1 > wg_row_first + shift))
                hopper_mask<Cfg>(s_rmem, n0, row0, lane, len_k, shift, prm.causal);
            float alpha[2];
            hopper_softmax<Cfg>(s_rmem, row_max, row_sum, alpha, scale_log2); /* O = 0: alpha unused */
            hopper_convert_p<Cfg, BF16>(s_rmem, p_rmem);
        }

        /* ---- rounds 1 .. n_tiles-1: S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} in flight together */
        for (int j = 1; j < n_tiles; ++j) {
            const int ks = j % STAGES, vs = (j - 1) % STAGES;
            float s_rmem[BLOCK_N / 2];
            hopper_mbarrier_wait(k_full(ks), (j / STAGES) & 1);
            hopper_sched_wait_turn<Cfg>(consumer);
            hopper_issue_qk<Cfg, BF16>(s_rmem, q_wg, k_stage(ks));
            hopper_mbarrier_wait(v_full(vs), ((j - 1) / STAGES) & 1);
            hopper_issue_pv<Cfg, BF16>(o_rmem, p_rmem, v_stage(vs));
            hopper_sched_pass_turn<Cfg>(consumer, j == n_tiles - 1);

            wgmma_wait_group<1>(); /* S_j is ready; P_{j-1} V_{j-1} may still run */
#pragma unroll
            for (int i = 0; i < BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
            if (lane == 0) mbarrier_arrive(k_empty(ks));
            const int n0 = (n_tiles - 1 - j) * BLOCK_N;
            if (n0 + BLOCK_N > len_k || (prm.causal && n0 + BLOCK_N - 1 > wg_row_first + shift))
                hopper_mask<Cfg>(s_rmem, n0, row0, lane, len_k, shift, prm.causal);
            float alpha[2];
            hopper_softmax<Cfg>(s_rmem, row_max, row_sum, alpha, scale_log2);

            wgmma_wait_group<0>(); /* P_{j-1} V_{j-1} done: O and P_{j-1} are ours again */
#pragma unroll
            for (int i = 0; i < D / 2; ++i) wgmma_fence_operand(o_rmem[i]);
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk)
#pragma unroll
                for (int x = 0; x < 4; ++x) wgmma_fence_operand(p_rmem[kk][x]);
            if (lane == 0) mbarrier_arrive(v_empty(vs));
            /* O was relative to the old max; P_j (next round's A) is relative to the new one */
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o_rmem[i] *= alpha[(i >> 1) & 1];
            hopper_convert_p<Cfg, BF16>(s_rmem, p_rmem);
        }

        /* ---- last: O += P_{n-1} V_{n-1} */
        {
            const int jv = n_tiles - 1, vs = jv % STAGES;
            hopper_mbarrier_wait(v_full(vs), (jv / STAGES) & 1);
            hopper_issue_pv<Cfg, BF16>(o_rmem, p_rmem, v_stage(vs));
            wgmma_wait_group<0>();
#pragma unroll
            for (int i = 0; i < D / 2; ++i) wgmma_fence_operand(o_rmem[i]);
            if (lane == 0) mbarrier_arrive(v_empty(vs));
        }
    }

    /* ---- epilogue: normalise, LSE */
    float inv_sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float sum = hopper_quad_sum(row_sum[h]);
        inv_sum[h] = sum > 0.0f ? 1.0f / sum : 0.0f; /* no visible key: O = 0 */
        const int row = row0 + 8 * h;
        if (prm.lse != nullptr && lane % 4 == 0 && row < len_q)
            prm.lse[((int64_t)batch * prm.heads_q + head) * len_q + row] =
                sum > 0.0f ? (row_max[h] * scale_log2 + log2f(sum)) * 0.6931471805599453f : -CUDART_INF_F;
    }

    /* O -> this consumer's 64 rows of the Q tile (its own rows only, and its wgmma reads of them
     * are retired), in the TMA's 128-byte swizzle: element (r, col) of slab col/64 sits at
     * r·128 + ((col%64/8) ^ (r%8))·16 + (col%8)·2. Each thread stores the pair d[4j+2h], d[4j+2h+1]
     * (row r0 + 8h, columns 8j + 2(l%4) + {0,1}): one 4-byte store; per store instruction the 8
     * rows of a warp hit 8 different 16-byte chunks and the 4 lanes of a quad the 4 words of each,
     * so the 32 lanes cover all 32 banks. */
    {
        const int r = 64 * consumer + 16 * warp + lane / 4; /* tile row of h = 0; (r + 8) % 8 == r % 8 */
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t addr = q_smem + (uint32_t)(j / 8) * Cfg::Q_SLAB_BYTES + (uint32_t)(r + 8 * h) * 128 +
                                      (uint32_t)(((j % 8) ^ (r % 8)) * 16) + (uint32_t)(lane % 4) * 4;
                st_shared_b32(addr, hopper_pack2<BF16>(o_rmem[4 * j + 2 * h] * inv_sum[h],
                                                       o_rmem[4 * j + 2 * h + 1] * inv_sum[h]));
            }
    }
    /* st.shared (generic proxy) -> TMA store (async proxy): each writer fences, then the
     * warpgroup's 128 threads meet before one of them issues the stores. */
    fence_proxy_async_shared_cta();
    bar_sync(HOPPER_BAR_EPILOGUE_FIRST + consumer, 128);
    if (tid == 0 && wg_row_first < len_q) {
#pragma unroll
        for (int slab = 0; slab < Cfg::SLABS; ++slab)
            tma_store_5d(&tmap_o, q_wg + (uint32_t)slab * Cfg::Q_SLAB_BYTES, 0, wg_row_first, slab, head, batch);
        tma_store_commit_group();
        tma_store_wait_group_read<0>(); /* the smem source must outlive the reads of the store */
    }
}

/* ---- host ------------------------------------------------------------------------------------ */

static __thread char hopper_error_text[512];

static int hopper_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hopper_error_text, sizeof hopper_error_text, fmt, ap);
    va_end(ap);
    return status;
}

extern "C" const char *hopper_fwd_last_error(void) { return hopper_error_text; }

extern "C" int hopper_fwd_tile_shape(int head_dim, int causal, int *block_m, int *block_n, int *stages,
                                     int *smem_bytes) {
    causal = causal != 0;
    int bytes;
    switch (head_dim) {
    case 64: bytes = (int)(causal ? hopper_tiles<64, 1>::SMEM_BYTES : hopper_tiles<64, 0>::SMEM_BYTES); break;
    case 128: bytes = (int)(causal ? hopper_tiles<128, 1>::SMEM_BYTES : hopper_tiles<128, 0>::SMEM_BYTES); break;
    case 256: bytes = (int)(causal ? hopper_tiles<256, 1>::SMEM_BYTES : hopper_tiles<256, 0>::SMEM_BYTES); break;
    default: return -1;
    }
    if (block_m) *block_m = hopper_block_m(head_dim, causal);
    if (block_n) *block_n = hopper_block_n(head_dim, causal);
    if (stages) *stages = hopper_stages(head_dim, causal);
    if (smem_bytes) *smem_bytes = bytes;
    return 0;
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda at link time). */
static PFN_cuTensorMapEncodeTiled_v12000 hopper_encode_fn(void) {
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

/* A [b, rows, heads, d] 16-bit tensor as the 5-D map {64, rows, d/64, heads, b} with byte strides
 * {row, 128, head, batch}, box {64, box_rows, box_slabs, 1, 1}, 128-byte swizzle, zero fill.
 * Checks every precondition of cuTensorMapEncodeTiled first (cuda.h): base 16-byte aligned,
 * strides multiples of 16 bytes below 2^40, dims in [1, 2^32], box dims in [1, 256], the inner
 * box row (64 · 2 = 128 bytes) within the swizzle span. */
static int hopper_make_map(CUtensorMap *map, const char *name, CUtensorMapDataType type, const void *base,
                           int64_t d, int64_t rows, int64_t heads, int64_t batch, int64_t row_stride,
                           int64_t head_stride, int64_t batch_stride, int box_rows, int box_slabs) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = hopper_encode_fn();
    if (encode == nullptr)
        return hopper_fail(FA_ERR_CUDA, "cuTensorMapEncodeTiled is not available from the CUDA driver");
    if (((uintptr_t)base & 15u) != 0)
        return hopper_fail(FA_ERR_ALIGNMENT, "%s = %p is not 16-byte aligned (TMA)", name, base);
    const int64_t strides_el[3] = {row_stride, head_stride, batch_stride};
    const int64_t extents[3] = {rows, heads, batch};
    const char *axis[3] = {"row", "head", "batch"};
    cuuint64_t stride_bytes[4];
    stride_bytes[1] = 128; /* the 64-column slab axis: 64 elements × 2 bytes */
    for (int i = 0; i < 3; ++i) {
        int64_t s = strides_el[i];
        if (extents[i] == 1) s = row_stride > 0 ? row_stride : 64; /* never multiplied by a nonzero index */
        if (s < 0 || s % 8 != 0)
            return hopper_fail(FA_ERR_ALIGNMENT,
                               "%s_%s_stride = %lld: TMA needs a non-negative multiple of 8 elements (16 bytes)",
                               name, axis[i], (long long)strides_el[i]);
        if (2 * s >= ((int64_t)1 << 40))
            return hopper_fail(FA_ERR_STRIDE, "%s_%s_stride = %lld: TMA strides must be below 2^40 bytes", name,
                               axis[i], (long long)strides_el[i]);
        stride_bytes[i == 0 ? 0 : i + 1] = (cuuint64_t)(2 * s);
    }
    const cuuint64_t dims[5] = {64, (cuuint64_t)rows, (cuuint64_t)(d / 64), (cuuint64_t)heads, (cuuint64_t)batch};
    for (int i = 0; i < 5; ++i)
        if (dims[i] < 1 || dims[i] > ((cuuint64_t)1 << 32))
            return hopper_fail(FA_ERR_INVALID_SIZE, "%s: TMA dimension %d = %llu out of [1, 2^32]", name, i,
                               (unsigned long long)dims[i]);
    const cuuint32_t box[5] = {64, (cuuint32_t)box_rows, (cuuint32_t)box_slabs, 1, 1};
    for (int i = 0; i < 5; ++i)
        if (box[i] < 1 || box[i] > 256)
            return hopper_fail(FA_ERR_INVALID_SIZE, "%s: TMA box dimension %d = %u out of [1, 256]", name, i,
                               (unsigned)box[i]);
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    const CUresult r = encode(map, type, 5, const_cast<void *>(base), dims, stride_bytes, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return hopper_fail(FA_ERR_CUDA,
                           "cuTensorMapEncodeTiled(%s) failed with CUresult %d: dims {64, %llu, %llu, %llu, %llu}, "
                           "byte strides {%llu, %llu, %llu, %llu}, box {64, %u, %u, 1, 1}",
                           name, (int)r, (unsigned long long)dims[1], (unsigned long long)dims[2],
                           (unsigned long long)dims[3], (unsigned long long)dims[4],
                           (unsigned long long)stride_bytes[0], (unsigned long long)stride_bytes[1],
                           (unsigned long long)stride_bytes[2], (unsigned long long)stride_bytes[3],
                           (unsigned)box[1], (unsigned)box[2]);
    return FA_OK;
}

template <class Cfg, bool BF16>
static int hopper_launch(const hopper_fwd_args *a, float scale, int device) {
    constexpr int D = Cfg::D;
    const CUtensorMapDataType type = BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    /* seqlen_k = 0: no key tile is ever loaded, but the maps must still be valid */
    const int64_t rows_k = a->seqlen_k > 0 ? a->seqlen_k : 1;
    const void *k = a->seqlen_k > 0 ? a->k : a->q, *v = a->seqlen_k > 0 ? a->v : a->q;
    CUtensorMap tmap_q, tmap_k, tmap_v, tmap_o;
    int st;
    if ((st = hopper_make_map(&tmap_q, "q", type, a->q, D, a->seqlen_q, a->heads_q, a->batch, a->q_row_stride,
                              a->q_head_stride, a->q_batch_stride, Cfg::BLOCK_M, Cfg::SLABS)) != FA_OK ||
        (st = hopper_make_map(&tmap_k, "k", type, k, D, rows_k, a->heads_kv, a->batch, a->k_row_stride,
                              a->k_head_stride, a->k_batch_stride, Cfg::BLOCK_N, Cfg::SLABS)) != FA_OK ||
        (st = hopper_make_map(&tmap_v, "v", type, v, D, rows_k, a->heads_kv, a->batch, a->v_row_stride,
                              a->v_head_stride, a->v_batch_stride, Cfg::BLOCK_N, Cfg::SLABS)) != FA_OK ||
        (st = hopper_make_map(&tmap_o, "o", type, a->o, D, a->seqlen_q, a->heads_q, a->batch, a->o_row_stride,
                              a->o_head_stride, a->o_batch_stride, 64, 1)) != FA_OK)
        return st;

    /* > 48 KiB of dynamic shared memory needs the per-device opt-in, set once per device. */
    static unsigned long long configured = 0;
    const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
    if (bit == 0 || !(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & bit)) {
        cudaError_t e = cudaFuncSetAttribute(hopper_fwd_kernel<Cfg, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)Cfg::SMEM_BYTES);
        if (e != cudaSuccess)
            return hopper_fail(FA_ERR_CUDA, "cudaFuncSetAttribute(%u bytes of shared memory): %s",
                               (unsigned)Cfg::SMEM_BYTES, cudaGetErrorString(e));
        __atomic_fetch_or(&configured, bit, __ATOMIC_RELEASE);
    }

    hopper_fwd_kernel_params prm;
    prm.lse = a->lse;
    prm.seqlen_q = (int)a->seqlen_q;
    prm.seqlen_k = (int)a->seqlen_k;
    prm.heads_q = (int)a->heads_q;
    prm.group = (int)(a->heads_q / a->heads_kv);
    prm.num_m_blocks = (int)((a->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M);
    prm.causal = a->causal != 0;
    /* causal: the last query blocks see the most keys; launching them first shortens the tail */
    prm.heavy_first = prm.causal && prm.num_m_blocks <= 65535;
    prm.scale_log2 = scale * 1.4426950408889634f;
    const dim3 grid = prm.heavy_first ? dim3((unsigned)a->heads_q, (unsigned)a->batch, (unsigned)prm.num_m_blocks)
                                      : dim3((unsigned)prm.num_m_blocks, (unsigned)a->heads_q, (unsigned)a->batch);
    hopper_fwd_kernel<Cfg, BF16><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, (cudaStream_t)a->stream>>>(tmap_q, tmap_k,
                                                                                                   tmap_v, tmap_o, prm);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return hopper_fail(FA_ERR_CUDA, "hopper_fwd_kernel launch: %s", cudaGetErrorString(e));
    return FA_OK;
}

/* The tiles depend on the causal flag (hopper_tiles): pick the kernel for this call. */
template <int D, bool BF16>
static int hopper_launch_d(const hopper_fwd_args *a, float scale, int device) {
    return a->causal ? hopper_launch<hopper_tiles<D, 1>, BF16>(a, scale, device)
                     : hopper_launch<hopper_tiles<D, 0>, BF16>(a, scale, device);
}

extern "C" int hopper_fwd(const hopper_fwd_args *a) {
    if (a == nullptr) return hopper_fail(FA_ERR_NULL_POINTER, "args is NULL");
    if (a->dtype != FA_DTYPE_F16 && a->dtype != FA_DTYPE_BF16)
        return hopper_fail(FA_ERR_DTYPE, "dtype = %d: the Hopper forward supports f16 (1) and bf16 (2)", a->dtype);
    if (a->head_dim != 64 && a->head_dim != 128 && a->head_dim != 256)
        return hopper_fail(FA_ERR_HEAD_DIM, "head_dim = %lld: the Hopper forward v2 supports 64, 128, 256",
                           (long long)a->head_dim);
    const int64_t int_limit = 2147483647 - 256;
    if (a->batch < 1 || a->batch > 65535 || a->heads_q < 1 || a->heads_q > 65535 || a->heads_kv < 1 ||
        a->seqlen_q < 0 || a->seqlen_q > int_limit || a->seqlen_k < 0 || a->seqlen_k > int_limit)
        return hopper_fail(FA_ERR_INVALID_SIZE,
                           "batch = %lld, heads_q = %lld, heads_kv = %lld, seqlen_q = %lld, seqlen_k = %lld: "
                           "need batch, heads_q in [1, 65535], heads_kv >= 1, seqlens in [0, 2^31 - 256]",
                           (long long)a->batch, (long long)a->heads_q, (long long)a->heads_kv,
                           (long long)a->seqlen_q, (long long)a->seqlen_k);
    if (a->heads_q % a->heads_kv != 0)
        return hopper_fail(FA_ERR_HEADS, "heads_q = %lld is not a multiple of heads_kv = %lld",
                           (long long)a->heads_q, (long long)a->heads_kv);
    if (a->q == nullptr || a->o == nullptr || (a->seqlen_k > 0 && (a->k == nullptr || a->v == nullptr)))
        return hopper_fail(FA_ERR_NULL_POINTER, "q, k, v or o is NULL");
    if (((uintptr_t)a->lse & 3u) != 0) return hopper_fail(FA_ERR_ALIGNMENT, "lse is not 4-byte aligned");
    float scale = a->softmax_scale;
    if (scale == 0.0f) scale = 1.0f / sqrtf((float)a->head_dim);
    if (!(scale > 0.0f) || isinf(scale))
        return hopper_fail(FA_ERR_UNSUPPORTED, "softmax_scale = %g: the Hopper forward needs a finite positive scale",
                           (double)a->softmax_scale);
    if (a->seqlen_q == 0) return FA_OK; /* no query row: nothing to write */

    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return hopper_fail(FA_ERR_DEVICE, "no usable CUDA device");
    }
    if (major != 9 || minor != 0)
        return hopper_fail(FA_ERR_DEVICE, "device %d has compute capability %d.%d; this kernel is sm_90a only",
                           device, major, minor);

    const bool bf16 = a->dtype == FA_DTYPE_BF16;
    switch (a->head_dim) {
    case 64: return bf16 ? hopper_launch_d<64, true>(a, scale, device) : hopper_launch_d<64, false>(a, scale, device);
    case 128: return bf16 ? hopper_launch_d<128, true>(a, scale, device) : hopper_launch_d<128, false>(a, scale, device);
    default: return bf16 ? hopper_launch_d<256, true>(a, scale, device) : hopper_launch_d<256, false>(a, scale, device);
    }
}
