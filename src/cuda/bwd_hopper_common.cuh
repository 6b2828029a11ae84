/*
 * bwd_hopper_common.cuh: what the two Hopper backward kernels share: bwd_hopper_sm90a.cu (buckets
 * 64 and 128: each consumer warpgroup owns 64 keys) and bwd_hopper256_sm90a.cu (bucket 256: both
 * consumers share 64 keys, each owns 128 head-dim columns). The kernel arguments, the mbarrier
 * wait, the query range of a key block, the varlen row zeroing, the Sᵀ / dPᵀ GEMM (K-major A and
 * B over the head dim), the packing of an accumulator into A fragments, and on the host the TMA
 * maps, the arguments and the shared-memory opt-in. Every kernel configuration `Cfg` these
 * templates take names D, BLOCK_M, KV_SLAB_BYTES and Q_SLAB_BYTES as its file comment describes.
 * Included only by *_sm90a.cu files (sm_90a code).
 */
#ifndef FA_BWD_HOPPER_COMMON_CUH
#define FA_BWD_HOPPER_COMMON_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "bwd_launch.h"
#include "fa_cuda_common.cuh"
#include "hopper_tiles.h"
#include "hopper_tma.h"

/* Kernel arguments besides the tensor maps. Window sides -1 = unbounded (causal folded in). */
struct fa_hbwd_params {
    void *dk, *dv;                 /* [b, sk, hkv, d], [b, sk, hkv, dv] (varlen [total_k, ...])     */
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    float *dq_accum;               /* [heads_q, total_q, d] fp32 (head-major), zeroed: Σ dS·K (unscaled) */
    const float *lse;              /* the forward's LSE: [b, heads_q, seqlen_q] (varlen [heads_q, total_q]) */
    const float *dsum;             /* [heads_q, total_q] D = rowsum(dO∘O)                           */
    const int32_t *cu_seqlens_q;   /* [b + 1] device memory, or NULL                                */
    const int32_t *cu_seqlens_k;
    int64_t total_q, total_k;      /* packed rows (fixed length: batch · seqlen)                    */
    int seqlen_q, seqlen_k;        /* per sequence (varlen: the maxima)                             */
    int heads_q, group, head_dim, head_dim_v;
    int window_left, window_right;
    float scale_log2;              /* softmax_scale · log2(e)                                       */
    float softmax_scale;           /* dK's factor                                                   */
};

/* ---- device helpers -------------------------------------------------------------------------- */

/* Block until the phase of parity `parity` of the mbarrier at `bar` has completed. */
__device__ __forceinline__ void fa_hbwd_wait(uint32_t bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

template <bool BF16>
__device__ __forceinline__ uint32_t fa_hbwd_pack2(float lo, float hi) {
    return BF16 ? cvt_rn_bf16x2_f32(lo, hi) : cvt_rn_f16x2_f32(lo, hi);
}

/* Query rows [q_lo, q_hi) that see at least one key of [n0, n1) (n1 <= len_k): key j is visible
 * to row i iff i + shift - window_left <= j <= i + shift + window_right (sides -1 unbounded). */
__device__ __forceinline__ void fa_hopper_bwd_query_range(const fa_hbwd_params &prm, int n0, int n1, int len_q,
                                                          int shift, int &q_lo, int &q_hi) {
    q_lo = 0;
    q_hi = len_q;
    if (prm.window_right >= 0) q_lo = max(0, n0 - shift - prm.window_right);
    if (prm.window_left >= 0) q_hi = min(len_q, n1 - 1 - shift + prm.window_left + 1);
}

/* Zero rows [row_lo, rows) of `slabs` slabs of [rows, 64] 16-bit elements (128-byte rows; the
 * swizzle permutes 16-byte chunks inside a row, so whole rows are contiguous either way). Called
 * by all 256 consumer threads (thread index ct = threadIdx.x - 128). */
__device__ __forceinline__ void fa_hbwd_zero_rows(uint32_t tile, uint32_t slab_bytes, int slabs, int rows, int row_lo,
                                                  int ct) {
    const uint32_t zero[4] = {0u, 0u, 0u, 0u};
    const int chunks = (rows - row_lo) * 8;
    for (int s = 0; s < slabs; ++s)
        for (int i = ct; i < chunks; i += 256)
            st_shared_v4_b32(tile + (uint32_t)s * slab_bytes + (uint32_t)row_lo * 128 + (uint32_t)i * 16, zero);
}


/* A = 64 rows of a K-major [rows, D] tile (K or V, slab stride KV_SLAB_BYTES) starting at a_wg, B = a
 * K-major [BLOCK_M, D] stage (Q or dO): acc = A Bᵀ, D/16 k16 steps over the head dim (step kk:
 * slab kk/4, +32·(kk%4) bytes). One commit group; nothing waits here. */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_hbwd_issue_abt(float (&acc)[Cfg::BLOCK_M / 2], uint32_t a_wg, uint32_t b_stage) {
    const uint64_t a_desc = wgmma_desc_sw128(a_wg, 16, 1024);
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

/* fp32 accumulator (keys × queries, accumulator layout) -> 16-bit A fragments with K = queries:
 * k-slice kk (queries 16kk .. 16kk+15) is acc[8kk .. 8kk+7], packed pairwise (fa_ptx.cuh). */
template <class Cfg, bool BF16>
__device__ __forceinline__ void fa_hbwd_pack(const float (&acc)[Cfg::BLOCK_M / 2],
                                             uint32_t (&frag)[Cfg::BLOCK_M / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < Cfg::BLOCK_M / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) frag[kk][x] = fa_hbwd_pack2<BF16>(acc[8 * kk + 2 * x], acc[8 * kk + 2 * x + 1]);
}

/* Producer warp: the LSE2 and D rows m0 .. m0 + BLOCK_M - 1 of one query block into stage s
 * (lane-strided rows; the LSE converted to log2 units, +inf where it is -inf so that P = 0, and
 * +inf / 0 for rows past the sequence). lse_head / dsum_head point at the query head's row 0. */
template <int BLOCK_M>
__device__ __forceinline__ void fa_hbwd_store_vectors(uint32_t lse2_smem, uint32_t dvec_smem, int s, int lane, int m0,
                                                      int len_q, const float *lse_head, const float *dsum_head) {
#pragma unroll 1
    for (int r = lane; r < BLOCK_M; r += 32) {
        const bool in_seq = m0 + r < len_q;
        const uint32_t at = (uint32_t)(s * BLOCK_M + r) * 4;
        const float lse = in_seq ? lse_head[m0 + r] : -CUDART_INF_F;
        st_shared_f32(lse2_smem + at, lse == -CUDART_INF_F ? CUDART_INF_F : lse * 1.4426950408889634f);
        st_shared_f32(dvec_smem + at, in_seq ? dsum_head[m0 + r] : 0.0f);
    }
}

/* Masked scores of the Sᵀ accumulator -> -inf. Element 4j + 2h + c is key key0 + 8h and query
 * m0 + 8j + col_in + c. Key k sees queries [k - shift - window_right, k - shift + window_left] (a
 * side -1: unbounded), none when k is past the sequence; in this thread's local column units
 * (query = m0 + col_in + 8j + c) that is [lo, hi], with mask_base = key0 - shift - col_in: two
 * compares per element against compile-time constants. */
template <int BLOCK_M>
__device__ __forceinline__ void fa_hbwd_mask(float (&s_rmem)[BLOCK_M / 2], const fa_hbwd_params &prm, int key0,
                                             int len_k, int mask_base, int m0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h, base = mask_base + 8 * h - m0;
        int lo = prm.window_right >= 0 ? base - prm.window_right : -BLOCK_M;
        const int hi = prm.window_left >= 0 ? base + prm.window_left : BLOCK_M;
        if (key >= len_k) lo = BLOCK_M;
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if (8 * j + c < lo || 8 * j + c > hi) s_rmem[4 * j + 2 * h + c] = -CUDART_INF_F;
    }
}

/* P = 2^(s·scale·log2e - LSE2[query]) in place: one FFMA + one MUFU.EX2 per element; LSE2 = +inf
 * gives 0. lse2_pair: this thread's pair of queries 8j + col_in, + 1 of the stage (+32 B per j). */
template <int BLOCK_M>
__device__ __forceinline__ void fa_hbwd_probs(float (&s_rmem)[BLOCK_M / 2], uint32_t lse2_pair, float scale_log2) {
#pragma unroll
    for (int j = 0; j < BLOCK_M / 8; ++j) {
        const float2 lse2 = ld_shared_v2_f32(lse2_pair + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            s_rmem[4 * j + 2 * h] = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h], scale_log2, -lse2.x));
            s_rmem[4 * j + 2 * h + 1] = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h + 1], scale_log2, -lse2.y));
        }
    }
}

/* dS = P ∘ (dP - D[query]) in place in the dPᵀ accumulator (P in fp32); dvec_pair as lse2_pair. */
template <int BLOCK_M>
__device__ __forceinline__ void fa_hbwd_dscores(float (&dp_rmem)[BLOCK_M / 2], const float (&s_rmem)[BLOCK_M / 2],
                                                uint32_t dvec_pair) {
#pragma unroll
    for (int j = 0; j < BLOCK_M / 8; ++j) {
        const float2 dv2 = ld_shared_v2_f32(dvec_pair + 32 * j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            dp_rmem[4 * j + 2 * h] = s_rmem[4 * j + 2 * h] * (dp_rmem[4 * j + 2 * h] - dv2.x);
            dp_rmem[4 * j + 2 * h + 1] = s_rmem[4 * j + 2 * h + 1] * (dp_rmem[4 * j + 2 * h + 1] - dv2.y);
        }
    }
}

/* ---- host -------------------------------------------------------------------------------------- */

/* The kernel arguments from the backward's parameter block (window sides already clamped and
 * causal folded in by bwd_cuda.cu). */
static inline fa_hbwd_params fa_hbwd_make_params(const fa_bwd_params *p) {
    fa_hbwd_params prm;
    prm.dk = p->dk;
    prm.dv = p->dv;
    prm.dk_batch_stride = p->dk_batch_stride;
    prm.dk_row_stride = p->dk_row_stride;
    prm.dk_head_stride = p->dk_head_stride;
    prm.dv_batch_stride = p->dv_batch_stride;
    prm.dv_row_stride = p->dv_row_stride;
    prm.dv_head_stride = p->dv_head_stride;
    prm.dq_accum = p->dq_accum;
    prm.lse = p->lse;
    prm.dsum = p->dsum;
    prm.cu_seqlens_q = p->cu_seqlens_q;
    prm.cu_seqlens_k = p->cu_seqlens_k;
    prm.total_q = p->total_q;
    prm.total_k = p->total_k;
    prm.seqlen_q = p->seqlen_q;
    prm.seqlen_k = p->seqlen_k;
    prm.heads_q = p->heads_q;
    prm.group = p->group;
    prm.head_dim = p->head_dim;
    prm.head_dim_v = p->head_dim_v;
    prm.window_left = p->window_left;
    prm.window_right = p->window_right;
    prm.scale_log2 = p->scale_log2;
    prm.softmax_scale = p->softmax_scale;
    return prm;
}

/* TMA maps of Q and dO (box rows block_m) and of K and V (box rows block_n): a tensor as the 4-D
 * {d, rows, heads, batch}, varlen {d, total, heads, 1}. The caller has returned early when a
 * tensor has no rows. `path` names the kernel in messages. */
static inline fa_status fa_hbwd_make_maps(const fa_bwd_params *p, bool bf16, int block_m, int block_n,
                                          const char *path, CUtensorMap *tmap_q, CUtensorMap *tmap_do,
                                          CUtensorMap *tmap_k, CUtensorMap *tmap_v) {
    const CUtensorMapDataType type = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const bool varlen = p->cu_seqlens_q != nullptr;
    const int64_t rows_q = varlen ? p->total_q : p->seqlen_q;
    const int64_t rows_k = varlen ? p->total_k : p->seqlen_k;
    const int64_t map_batch = varlen ? 1 : p->batch;
    fa_status st;
    if ((st = fa_hopper_make_map(tmap_q, path, "q", type, p->q, p->head_dim, rows_q, p->heads_q, map_batch,
                                 p->q_row_stride, p->q_head_stride, p->q_batch_stride, block_m)) != FA_OK ||
        (st = fa_hopper_make_map(tmap_do, path, "dout", type, p->dout, p->head_dim_v, rows_q, p->heads_q, map_batch,
                                 p->do_row_stride, p->do_head_stride, p->do_batch_stride, block_m)) != FA_OK ||
        (st = fa_hopper_make_map(tmap_k, path, "k", type, p->k, p->head_dim, rows_k, p->heads_kv, map_batch,
                                 p->k_row_stride, p->k_head_stride, p->k_batch_stride, block_n)) != FA_OK ||
        (st = fa_hopper_make_map(tmap_v, path, "v", type, p->v, p->head_dim_v, rows_k, p->heads_kv, map_batch,
                                 p->v_row_stride, p->v_head_stride, p->v_batch_stride, block_n)) != FA_OK)
        return st;
    return FA_OK;
}

/* > 48 KiB of dynamic shared memory needs the per-device opt-in for each kernel, set once per
 * device: bit d of *configured (one word per kernel instantiation) records device d. */
template <class Kernel>
static inline fa_status fa_hbwd_opt_in_smem(Kernel *kernel, uint32_t smem_bytes, int device_ordinal,
                                            unsigned long long *configured) {
    const unsigned long long bit = device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (bit == 0 || !(__atomic_load_n(configured, __ATOMIC_ACQUIRE) & bit)) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes),
                      "cudaFuncSetAttribute(Hopper backward shared memory)");
        __atomic_fetch_or(configured, bit, __ATOMIC_RELEASE);
    }
    return FA_OK;
}

#endif /* FA_BWD_HOPPER_COMMON_CUH */
