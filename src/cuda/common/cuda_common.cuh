/*
 * cuda_common.cuh: what the CUDA forward, backward and decode (kvcache) code shares: host
 * error checking, the per-device property cache, element-type traits, the shared-memory swizzle,
 * quad reductions, sequence geometry on the device, the kernel parameter base (fa_kernel_base) and
 * the forward's parameters, and (at the end) the host's common checks and workspace handling.
 * Keep names stable and add new things at the end.
 *
 * Host code here is C++ compiled by nvcc; kernels are reached only through extern "C" launchers.
 */
#ifndef FA_CUDA_COMMON_CUH
#define FA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdlib.h>

#include "api/fa_internal.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/fwd_tiles.h"

/* ---- host: CUDA error checking ------------------------------------------------------------- */

/* Evaluate a CUDA runtime call; on failure record "what: CUDA error text (file:line)" and return
 * FA_ERR_CUDA from the enclosing function. Never exits. */
#define FA_CUDA_CHECK(call, what)                                                                 \
    do {                                                                                          \
        cudaError_t fa_cuda_err_ = (call);                                                        \
        if (fa_cuda_err_ != cudaSuccess)                                                          \
            return fa_set_error(FA_ERR_CUDA, "%s: %s (%s, %s:%d)", (what),                        \
                                cudaGetErrorString(fa_cuda_err_), cudaGetErrorName(fa_cuda_err_),  \
                                __FILE__, __LINE__);                                              \
    } while (0)

/* After a <<<>>> launch: report a launch failure (bad configuration, missing kernel image). */
#define FA_CUDA_CHECK_LAUNCH(what) FA_CUDA_CHECK(cudaGetLastError(), (what))

/* Largest gridDim.y and gridDim.z of a launch. */
enum { FA_CUDA_GRID_YZ_MAX = 65535 };

/* ---- host: device properties, queried once per device ordinal ----------------------------- */

typedef struct fa_cuda_device_info {
    int ordinal;         /* CUDA device ordinal                                                 */
    int sm_count;        /* multiprocessors                                                     */
    int cc_major;        /* compute capability                                                  */
    int cc_minor;
    size_t smem_optin;   /* max dynamic shared memory per block after opting in (bytes)         */
    size_t smem_per_sm;  /* shared memory per multiprocessor (bytes)                             */
} fa_cuda_device_info;

/* Properties of the calling thread's current device (cached per ordinal, thread-safe).
 * Defined in fwd.cu. */
fa_status fa_cuda_current_device(fa_cuda_device_info *info);

/* ---- device: element types ----------------------------------------------------------------- */

/* Tag types for the two 16-bit input types: the tensor-core instruction and the fp32 -> 16-bit
 * pair conversion differ, nothing else does (kernels move elements as raw bits). */
struct fa_bf16 {
    static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
        mma_m16n8k16_f32_bf16(d, a, b);
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        return cvt_rn_bf16x2_f32(lo, hi);
    }
};
struct fa_f16 {
    static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
        mma_m16n8k16_f32_f16(d, a, b);
    }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        return cvt_rn_f16x2_f32(lo, hi);
    }
};

/* ---- device: shared-memory swizzle ---------------------------------------------------------- */
/*
 * A tile of rows × CHUNKS 16-byte chunks (8 16-bit elements each), CHUNKS a multiple of 8, is
 * stored row after row, but chunk c of row r sits at position c ^ (r & 7) within its row.
 * Why: ldmatrix reads, per 8-lane phase, one 16-byte chunk from each of 8 consecutive rows at the
 * same logical chunk. Unswizzled, with rows 128·k bytes long, all 8 land in the same 4 banks
 * (8-way conflict); XOR-ing the chunk index with the row's low 3 bits spreads them over all 32
 * banks. The XOR only touches the low 3 bits of c, so a chunk stays inside its own 128-byte
 * group of the row. The 16-byte cp.async writes of a warp cover whole rows and are not affected.
 * Returns the chunk's index (multiply by 16 for the byte offset).
 */
template <int CHUNKS>
__device__ __forceinline__ uint32_t fa_swizzled_chunk(int row, int chunk) {
    static_assert(CHUNKS % 8 == 0, "fa_swizzled_chunk: rows must be a multiple of 8 chunks (64 elements)");
    return (uint32_t)(row * CHUNKS + (chunk ^ (row & 7)));
}

/* ---- device: reductions over the 4 lanes of a quad (lanes 4g..4g+3 share mma rows) ---------- */

__device__ __forceinline__ float fa_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}

/* Byte i of w, an e4m3 code, -> its value: sign and the 7 magnitude bits placed as an fp32 with
 * exponent field e and 3 mantissa bits, times 2^120 (bias 127 vs 7; a subnormal code becomes an
 * fp32 subnormal and lands exactly too: no flush to zero in this build). NaN codes: the caller
 * (fa_e4m3_bytes_have_nan). Every device; sm_89+ also has cvt.rn.f16x2.e4m3x2 (ptx.cuh). */
__device__ __forceinline__ float fa_e4m3_byte_to_f32(uint32_t w, int i) {
    const uint32_t b = (w >> (8 * i)) & 0xffu;
    return __fmul_rn(__uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24)), 0x1p120f);
}

/* Whether a byte of w has the magnitude bits 0x7f (e4m3 NaN): adding 1 to each 7-bit magnitude
 * carries into bit 7 only there. */
__device__ __forceinline__ bool fa_e4m3_bytes_have_nan(uint32_t w) {
    return (((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0;
}

__device__ __forceinline__ float fa_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

/* cp.async of a swizzled [ROWS, CHUNKS] tile of 16-byte chunks (16-bit elements; row r of the
 * source at gmem_row0 + r·row_stride) when THREADS does not divide CHUNKS' multiples evenly (rows
 * of 72 chunks, head dim 576): item i = thread + pass · THREADS is (i / CHUNKS, i % CHUNKS).
 * Rows >= valid_rows and chunks >= valid_chunks are zero-filled from `zero_src`, a readable
 * address. The kernels' own loaders cover the rows whose chunks divide THREADS. */
template <int THREADS, int CHUNKS, int ROWS>
__device__ __forceinline__ void fa_load_tile_items(uint32_t smem_tile, const uint16_t *gmem_row0, int64_t row_stride,
                                                   int valid_rows, int valid_chunks, const void *zero_src) {
    static_assert(ROWS * CHUNKS % THREADS == 0, "whole passes");
#pragma unroll
    for (int pass = 0; pass < ROWS * CHUNKS / THREADS; ++pass) {
        const int i = threadIdx.x + pass * THREADS;
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        const bool ok = chunk < valid_chunks && row < valid_rows;
        cp_async_cg_16(smem_tile + 16 * fa_swizzled_chunk<CHUNKS>(row, chunk),
                       ok ? (const void *)(gmem_row0 + (int64_t)row * row_stride + chunk * 8) : zero_src, ok ? 16 : 0);
    }
}

/* The layout of every partial-score exchange (fa_pair_add_scores below; the bucket-512 Hopper
 * kernels' CTA pairs, fa_pair_exchange): a thread's V4 float4 of
 * accumulator fragments, float4 v at slot + v·STRIDE, where slot = a base + 16·(thread in its
 * warp or warpgroup) and STRIDE = 16 × those threads: the threads' 16-byte accesses to one v
 * cover contiguous bytes, without bank conflicts. Both sides hold the same elements in the same
 * registers, and a + b = b + a exactly, so both end with the same scores. */
template <int V4, uint32_t STRIDE>
__device__ __forceinline__ void fa_store_partial_scores(uint32_t slot, const float *s) {
#pragma unroll
    for (int v = 0; v < V4; ++v) {
        const uint32_t bits[4] = {__float_as_uint(s[4 * v]), __float_as_uint(s[4 * v + 1]),
                                  __float_as_uint(s[4 * v + 2]), __float_as_uint(s[4 * v + 3])};
        st_shared_v4_b32(slot + STRIDE * v, bits);
    }
}

/* s += the other side's partial scores at `slot` (the layout above). */
template <int V4, uint32_t STRIDE>
__device__ __forceinline__ void fa_add_partial_scores(uint32_t slot, float *s) {
#pragma unroll
    for (int v = 0; v < V4; ++v) {
        uint32_t x[4];
        ld_shared_v4_b32(x, slot + STRIDE * v);
#pragma unroll
        for (int e = 0; e < 4; ++e) s[4 * v + e] += __uint_as_float(x[e]);
    }
}

/* A CTA pair's partial-score exchange (a thread-block cluster of two; the bucket-512 Hopper
 * forward and backward, each CTA on half of the head-dim columns): thread tid of a 128-thread
 * warpgroup sends its V4 float4 of partial scores to the same thread of the same warpgroup in the
 * peer CTA, which holds the same accumulator elements, in the layout above (stride 2048 bytes), by
 * st.async completing transactions on the peer's `full` mbarrier; then it adds the peer's from its
 * own buffer. Message m goes into the peer's buffer once the peer has read message m - 1 there
 * (our `free` barrier, 4 arrivals: the peer warpgroup's warps, parity (m - 1) & 1); the peer's
 * message m lands in ours (`full`, parity m & 1), whose next phase thread 0 then arms with the
 * next message's bytes (the peer sends it only after our free signal for m, so never into an
 * unarmed phase). After reading, each warp's lane 0 frees the peer's buffer, except after the last
 * message: nothing is sent to a CTA that may have exited. */
struct fa_pair_link {
    uint32_t slot, peer_slot;     /* this thread's slot (base + 16·tid) in our buffer, in the peer's */
    uint32_t full, peer_full;     /* our receive buffer's full mbarrier, the peer's (mapa)         */
    uint32_t free_bar, peer_free; /* our send side's free mbarrier, the peer's (mapa)              */
};

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL) /* mapa: sm_90 (ptx.cuh's Hopper section) */
/* Thread tid's link: its slot in this warpgroup's receive buffer `buffer`, the warpgroup's full and
 * free mbarriers, and the peer CTA's addresses of the three. */
__device__ __forceinline__ fa_pair_link fa_pair_link_of(uint32_t buffer, uint32_t full, uint32_t free_bar, int tid,
                                                        uint32_t peer) {
    fa_pair_link l;
    l.slot = buffer + 16u * (uint32_t)tid;
    l.peer_slot = mapa_shared_cluster(l.slot, peer);
    l.full = full;
    l.peer_full = mapa_shared_cluster(full, peer);
    l.free_bar = free_bar;
    l.peer_free = mapa_shared_cluster(free_bar, peer);
    return l;
}
#endif

template <int V4>
__device__ __forceinline__ void fa_pair_exchange(const fa_pair_link &l, float *x, int msg, bool last, int tid,
                                                 int lane) {
    constexpr uint32_t STRIDE = 128 * 16, MSG_BYTES = V4 * STRIDE;
    if (msg > 0) mbarrier_wait_parity(l.free_bar, (uint32_t)(msg - 1) & 1u);
#pragma unroll
    for (int v = 0; v < V4; ++v)
        st_async_v4_b32(l.peer_slot + STRIDE * v, x[4 * v], x[4 * v + 1], x[4 * v + 2], x[4 * v + 3], l.peer_full);
    mbarrier_wait_parity(l.full, (uint32_t)msg & 1u);
    if (tid == 0) mbarrier_arrive_expect_tx(l.full, MSG_BYTES);
    fa_add_partial_scores<V4, STRIDE>(l.slot, x);
    if (!last) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive_remote(l.peer_free);
    }
}

/* Two warps that split the k16 steps of the same rows' scores (the large-head forward and decode
 * kernels) add each other's partial sums: store this warp's V4 accumulator fragments, meet the
 * other warp (`partner`) at named barrier `barrier_id` (the two warps only), add the other's.
 * Lane l's fragment v sits at exchange_smem + (warp·V4 + v)·512 + 16·l. The caller rewrites the
 * slots only after a __syncthreads that the other warp reaches after its reads. */
template <int V4>
__device__ __forceinline__ void fa_pair_add_scores(uint32_t exchange_smem, int warp, int partner, int barrier_id,
                                                   int lane, float (*s)[4]) {
    const uint32_t mine = exchange_smem + (uint32_t)(warp * V4) * 512u + 16u * (uint32_t)lane;
    const uint32_t other = exchange_smem + (uint32_t)(partner * V4) * 512u + 16u * (uint32_t)lane;
    fa_store_partial_scores<V4, 512u>(mine, &s[0][0]);
    bar_sync(barrier_id, 64); /* the other warp's partial scores stored */
    fa_add_partial_scores<V4, 512u>(other, &s[0][0]);
}

/* One step of a row's online softmax (the portable and decode kernels): the running max takes
 * the tile's max (raw scores; -inf while no key was visible); returns the factor that rescales
 * the row's O and sum, exp2((old - new)·score_mul), and sets max_scaled to the new max in
 * exponent units (0 while it is -inf, so masked scores give p = exp2(-inf) = 0, never NaN). */
__device__ __forceinline__ float fa_online_max_step(float &row_max, float tile_max, float score_mul,
                                                    float &max_scaled) {
    const float new_max = fmaxf(row_max, tile_max);
    max_scaled = (new_max == -CUDART_INF_F ? 0.0f : new_max) * score_mul;
    const float rescale = ex2_approx_ftz_f32(row_max * score_mul - max_scaled);
    row_max = new_max;
    return rescale;
}

/* The mask of a score tile whose rows are queries and columns keys (the Hopper forward's S, the
 * 192 / 128 backward's S). Where a tile needs a mask: key columns [lo_r, hi_r) are visible to query row r, with
 * lo_r = r + shift - window_left (0 when unbounded) and hi_r = min(len_k, r + shift +
 * window_right + 1) (len_k when unbounded): fa_key_lo / fa_key_hi (fa_internal.h) in int32,
 * which these register-bound kernels need (the int64 forms spill). This thread's elements of
 * the S tile starting at key n0: rows row0 + 8h (packed: the rows' indices i in their heads, pack_i[h]), columns
 * n0 + 2(l%4) + 8j + c for s_rmem[4j + 2h + c] (accumulator layout).
 * Masked scores are overwritten with -inf (whatever they held, NaN from rows past a varlen
 * sequence included). */
template <int BLOCK_N, bool PACK>
__device__ __forceinline__ void fa_hopper_mask(float (&s_rmem)[BLOCK_N / 2], int n0, int row0,
                                               const int (&pack_i)[2], int lane, int len_k, int shift,
                                               int window_left, int window_right) {
    const int col0 = n0 + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int diag = (PACK ? pack_i[h] : row0 + 8 * h) + shift;
        const int hi = window_right >= 0 ? min(len_k, diag + window_right + 1) : len_k;
        /* local columns 8j + c of this thread are visible iff first <= 8j + c < end */
        const int first = window_left >= 0 ? diag - window_left - col0 : 0, end = hi - col0;
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if (8 * j + c >= end || 8 * j + c < first) s_rmem[4 * j + 2 * h + c] = -CUDART_INF_F;
    }
}

/* ---- device: the end of a row's softmax (epilogues only, never in a loop) -------------------- */

/* The running max (fmaxf) skips a NaN score, but the NaN reaches the row's sum (2^(NaN - m)), so
 * the sum tells the three kinds of row apart: > 0 normal, 0 no visible key (O = 0, LSE = -inf),
 * NaN a NaN score (O and LSE NaN, as PyTorch: never a plausible masked row). */

/* numer / sum, 0 for an empty row, NaN for a NaN row */
__device__ __forceinline__ float fa_row_scale(float numer, float sum) {
    return sum > 0.0f ? numer / sum : (sum == 0.0f ? 0.0f : __int_as_float(0x7fc00000));
}

/* LSE of a row whose sum is not > 0: -inf for an empty row, NaN for a NaN row */
__device__ __forceinline__ float fa_row_lse_degenerate(float sum) {
    return sum == 0.0f ? -__int_as_float(0x7f800000) : __int_as_float(0x7fc00000);
}

/* natural-log LSE from the base-2 max m_log2 and the sum */
__device__ __forceinline__ float fa_row_lse(float m_log2, float sum) {
    return sum > 0.0f ? (m_log2 + log2f(sum)) * 0.6931471805599453f : fa_row_lse_degenerate(sum);
}

/* A row's softmax, closed: from its running max (score units; -inf: no key seen), the factor
 * score_mul to base 2, its row sum (relative to that max) and the sink logit in base 2 (-inf
 * without one). The sink joins the denominator under the larger of the row max and the sink, so
 * that a sink far above every score cannot overflow exp2: m = max(max_scaled, sink), 0 when both
 * are -inf (no visible key and no sink: the sum stays 0); O, built relative to max_scaled, takes
 * corr = 2^(max_scaled - m), and the sum becomes sum·corr + 2^(sink - m). */
struct fa_row_end {
    float m;    /* the row's base-2 max (fa_row_lse) */
    float corr; /* O's factor before 1 / sum (fa_row_scale) */
    float sum;
};
__device__ __forceinline__ fa_row_end fa_row_end_with_sink(float row_max, float score_mul, float sum, float sink_log2,
                                                           bool has_sink) {
    fa_row_end e;
    const float max_scaled = row_max == -CUDART_INF_F ? -CUDART_INF_F : row_max * score_mul;
    e.m = fmaxf(max_scaled, sink_log2);
    if (e.m == -CUDART_INF_F) e.m = 0.0f;
    e.corr = exp2f(max_scaled - e.m);
    e.sum = sum * e.corr + (has_sink ? exp2f(sink_log2 - e.m) : 0.0f);
    return e;
}

/* ---- device: softcap's tanh ---------------------------------------------------------------- */

/* tanh(x) = 1 - 2 / (1 + e^{2x}) with the ex2/rcp units: absolute error ~1e-7, exact limits ±1
 * (tanh.approx.f32 is only good to ~5e-4, too coarse for softcap). Every kernel uses this one, so
 * the backward recomputes exactly the scores the forward normalised. */
__device__ __forceinline__ float fa_tanh(float x) {
    const float e2x = ex2_approx_ftz_f32(x * 2.8853900817779268f); /* 2·log2(e) */
    return 1.0f - 2.0f * rcp_approx_ftz_f32(1.0f + e2x);
}

/* ---- device: sequence geometry ------------------------------------------------------------- */

/* Rows of sequence b. Non-varlen: starts 0, lengths seqlen_q/k. Varlen: read from cu_seqlens in
 * device memory and clamped so that every row index stays inside [0, total) even when the
 * cu_seqlens contents are inconsistent (the host never reads them, so it could not check). */
struct fa_seq_rows {
    int64_t q_start, k_start; /* first packed row (varlen) or 0                               */
    int len_q, len_k;         /* tokens in this sequence, >= 0                                */
};

__device__ __forceinline__ int64_t fa_clamp64(int64_t x, int64_t lo, int64_t hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

__device__ __forceinline__ fa_seq_rows fa_sequence_rows(const int32_t *cu_seqlens_q,
                                                        const int32_t *cu_seqlens_k, int64_t total_q,
                                                        int64_t total_k, int seqlen_q, int seqlen_k,
                                                        int b) {
    fa_seq_rows s;
    if (cu_seqlens_q == nullptr) {
        s.q_start = 0;
        s.k_start = 0;
        s.len_q = seqlen_q;
        s.len_k = seqlen_k;
        return s;
    }
    int64_t q0 = fa_clamp64(cu_seqlens_q[b], 0, total_q);
    int64_t q1 = fa_clamp64(cu_seqlens_q[b + 1], q0, total_q);
    int64_t k0 = fa_clamp64(cu_seqlens_k[b], 0, total_k);
    int64_t k1 = fa_clamp64(cu_seqlens_k[b + 1], k0, total_k);
    s.q_start = q0;
    s.k_start = k0;
    s.len_q = (int)(q1 - q0);
    s.len_k = (int)(k1 - k0);
    return s;
}

/* ---- kernel parameters: the base every parameter block extends ------------------------------ */

/* What every kernel parameter block shares, passed by value as its first part (fa_fwd_params,
 * fa_bwd_params, fa_kv_params extend it by C++ inheritance, so kernels read prm.q_row_stride
 * whatever the block). Filled from the validated problem by fa_cuda_fill_kernel_base, and only
 * there. Strides in elements; window sides -1 = unbounded (causal already folded into
 * window_right). The field order is the forward's original one: the forward kernels are bound by
 * registers, and ptxas allocates differently when their parameters move. */
struct fa_kernel_base {
    const void *q; /* [b, seqlen_q, heads_q, d]  (varlen: [total_q, heads_q, d])               */
    const void *k; /* [b, seqlen_k, heads_kv, d]  (KV cache: the cache, written when appending) */
    const void *v; /* [b, seqlen_k, heads_kv, dv]                                              */
    void *o;       /* [b, seqlen_q, heads_q, dv]: the output (the backward: the forward's)      */
    float *lse;    /* [b, heads_q, seqlen_q] or varlen [heads_q, total_q]; may be NULL in the
                      forward; the backward reads the forward's                                */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    const int32_t *cu_seqlens_q; /* [b + 1] device memory, or NULL (always NULL: KV cache)     */
    const int32_t *cu_seqlens_k;
    int64_t total_q, total_k;    /* packed rows (bounds every varlen access)                  */
    int batch;
    int seqlen_q, seqlen_k;      /* per sequence (varlen: the maxima; they size the grid)     */
    int heads_q, heads_kv, group; /* group = heads_q / heads_kv                               */
    int head_dim, head_dim_v;    /* actual dims; the kernel's bucket may be larger            */
    int window_left, window_right;
    /* The forward's score path: p = 2^(acc·score_mul - max·score_mul) with score_mul =
     * scale·log2(e); transform_scores = 1 (softcap, ALiBi, or a non-positive scale) rewrites
     * every score into log2 units first and then uses score_mul = 1. (The backward uses
     * scale_log2 and the softcap constants directly.) */
    int transform_scores;
    float score_mul;
    float scale_log2;            /* softmax_scale · log2(e)                                    */
    float softcap_pre;           /* softmax_scale / softcap (0 when softcap is off)           */
    float softcap_post_log2;     /* softcap · log2(e); read only when softcap_pre != 0        */
    const float *alibi_slopes;   /* [heads_q] or [b, heads_q] via alibi_batch_stride, or NULL */
    int64_t alibi_batch_stride;
    const float *sink_logits;    /* [heads_q] or NULL                                         */
};

/* The fields of fa_kernel_base from the validated problem; the one place they are filled. */
static inline void fa_cuda_fill_kernel_base(fa_kernel_base *prm, const fa_problem *pb) {
    const fa_params *p = &pb->p;
    prm->q = p->q;
    prm->k = p->k;
    prm->v = p->v;
    prm->o = p->o;
    prm->lse = p->lse;
    prm->q_batch_stride = p->q_batch_stride;
    prm->q_row_stride = p->q_row_stride;
    prm->q_head_stride = p->q_head_stride;
    prm->k_batch_stride = p->k_batch_stride;
    prm->k_row_stride = p->k_row_stride;
    prm->k_head_stride = p->k_head_stride;
    prm->v_batch_stride = p->v_batch_stride;
    prm->v_row_stride = p->v_row_stride;
    prm->v_head_stride = p->v_head_stride;
    prm->o_batch_stride = p->o_batch_stride;
    prm->o_row_stride = p->o_row_stride;
    prm->o_head_stride = p->o_head_stride;
    prm->cu_seqlens_q = pb->varlen ? p->cu_seqlens_q : nullptr;
    prm->cu_seqlens_k = pb->varlen ? p->cu_seqlens_k : nullptr;
    prm->total_q = p->total_q;
    prm->total_k = p->total_k;
    prm->batch = (int)p->batch;
    prm->seqlen_q = (int)p->seqlen_q;
    prm->seqlen_k = (int)p->seqlen_k;
    prm->heads_q = (int)p->heads_q;
    prm->heads_kv = (int)p->heads_kv;
    prm->group = (int)pb->group;
    prm->head_dim = (int)p->head_dim;
    prm->head_dim_v = (int)p->head_dim_v;
    prm->window_left = (int)p->window_left;
    prm->window_right = (int)p->window_right;
    /* The plain path keeps raw scores and tracks their max, which orders like the scaled scores
     * only for a positive scale; anything else goes through the transformed (log2-unit) path. */
    prm->transform_scores = p->softcap > 0.0f || p->alibi_slopes != nullptr || !(pb->scale_log2 > 0.0f);
    prm->score_mul = prm->transform_scores ? 1.0f : pb->scale_log2;
    prm->scale_log2 = pb->scale_log2;
    /* softcap_post_log2 is read only when softcap_pre != 0 (it is negative with a negative scale) */
    prm->softcap_pre = p->softcap > 0.0f ? p->softmax_scale / p->softcap : 0.0f;
    prm->softcap_post_log2 = p->softcap > 0.0f ? p->softcap * 1.4426950408889634f : 0.0f;
    prm->alibi_slopes = p->alibi_slopes;
    prm->alibi_batch_stride = p->alibi_batch_stride;
    prm->sink_logits = p->sink_logits;
}

/* ---- attention dropout (kernels/dropout.cuh applies it) ------------------------------------ */

/* The dropout constants of a call (fa_params.dropout_*; src/api/fa_philox.h gives the mapping),
 * a kernel argument of its own after the parameter block (fa_fwd_params and fa_bwd_params, which
 * the Hopper kernels share, keep their layout); zero without dropout. */
struct fa_dropout_params {
    uint64_t seed, offset;       /* Philox key and counter offset                              */
    uint32_t threshold;          /* dropped iff the element's 8-bit number < threshold         */
    float keep_scale;            /* 256 / (256 - threshold)                                    */
};

static inline fa_dropout_params fa_cuda_dropout_params(const fa_problem *pb) {
    fa_dropout_params d;
    d.seed = pb->has_dropout ? pb->p.dropout_seed : 0;
    d.offset = pb->has_dropout ? pb->p.dropout_offset : 0;
    d.threshold = pb->has_dropout ? pb->dropout_threshold : 0;
    d.keep_scale = pb->has_dropout ? pb->dropout_keep_scale : 1.0f;
    return d;
}

/* ---- forward kernel parameters (filled by fwd.cu, read by fwd_*.cu) --------------------- */

/* Everything a forward kernel needs, passed by value: fa_kernel_base and the tile order. */
struct fa_fwd_params : fa_kernel_base {
    int heavy_first;             /* portable: grid (heads_q, b, m_blocks), last query block first;
                                    Hopper: tiles in head groups, longest first (fa_fwd_grouped_tile) */
    int head_group;              /* Hopper, heavy_first: (batch, head) units per group         */
    int num_m_blocks;
};

/* Units per group of the heavy-first tile order (fwd_tiles.h) for `resident_ctas` CTAs running
 * at once; FA_CUDA_HEAD_GROUP=N in the environment overrides it (tuning and A/B runs: N at least
 * batch · heads_q gives the plain longest-first order over all units). */
static inline int fa_cuda_head_group(int num_m_blocks, int resident_ctas) {
    const char *env = getenv("FA_CUDA_HEAD_GROUP");
    const int forced = env != nullptr ? atoi(env) : 0;
    return forced > 0 ? forced : fa_fwd_head_group(num_m_blocks, resident_ctas);
}

/* ---- host: checks and workspace shared by the three host files ------------ */
/*
 * fwd.cu (forward), bwd.cu (backward) and kvcache.cu (decode) validate and launch
 * alike. `path` / `kernel` / `what` name the caller in error messages ("the CUDA backward",
 * "the CUDA backward kernel", "backward"). Defined in fwd.cu except the templates.
 */

/* dtype f16 or bf16; head_dim multiple of 8 in 8..max_head_dim, head_dim_v in 8..max_head_dim_v. */
fa_status fa_cuda_check_dtype_and_dims(const fa_params *p, const char *path, int max_head_dim, int max_head_dim_v);

/* ptr (NULL passes) aligned to `bytes`, a power of two: "name = ptr is not N-byte aligned". */
fa_status fa_cuda_check_aligned(const char *name, const void *ptr, unsigned bytes);

/* A tensor of elem_bytes-byte elements the kernels move in 16-byte vectors: base 16-byte aligned,
 * row and head strides (and the batch stride when check_batch) multiples of 16 bytes. */
fa_status fa_cuda_check_tensor(const char *name, const void *ptr, int64_t batch_stride, int64_t row_stride,
                               int64_t head_stride, int check_batch, int elem_bytes, const char *path);

/* The same for a 16-bit tensor: strides multiples of 8 elements. */
fa_status fa_cuda_check_tensor16(const char *name, const void *ptr, int64_t batch_stride, int64_t row_stride,
                                 int64_t head_stride, int check_batch, const char *path);

/* The current device's properties (fa_cuda_current_device); FA_ERR_DEVICE below sm_80. */
fa_status fa_cuda_current_device_sm80(fa_cuda_device_info *dev);

/* FA_ERR_UNSUPPORTED when `kernel` needs more shared memory per block than dev allows. */
fa_status fa_cuda_check_smem(const fa_params *p, const fa_cuda_device_info *dev, size_t smem, const char *kernel);

/* A launch configuration with `threads` threads and `smem` bytes of dynamic shared memory per CTA,
 * in thread-block clusters of `ctas` CTAs along x (ctas = 1: no cluster attribute); `attr` holds
 * the attribute the configuration points at. */
static inline cudaLaunchConfig_t fa_cuda_cluster_config(cudaLaunchAttribute *attr, dim3 grid, int threads, size_t smem,
                                                        cudaStream_t stream, int ctas) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = (unsigned)ctas;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3((unsigned)threads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = ctas > 1 ? 1 : 0;
    return config;
}

/* Launches `kernel` in clusters of `ctas` CTAs along x (grid.x a multiple of ctas: the bucket-512
 * Hopper kernels' CTA pairs, the Hopper forward's K/V multicast pairs); ctas = 1 is a plain
 * launch. Returns the launch's error. */
template <class... Params, class... Args>
static inline cudaError_t fa_cuda_launch_clusters(void (*kernel)(Params...), dim3 grid, int threads, size_t smem,
                                                  cudaStream_t stream, int ctas, Args &&...args) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = fa_cuda_cluster_config(&attr, grid, threads, smem, stream, ctas);
    return cudaLaunchKernelEx(&config, kernel, static_cast<Args &&>(args)...);
}

/* How many clusters of `ctas` CTAs of `kernel` can be resident at once (a persistent grid of
 * clusters no larger than that never waits for one of its own clusters to finish). */
template <class... Params>
static inline cudaError_t fa_cuda_max_clusters(void (*kernel)(Params...), int threads, size_t smem, int ctas,
                                               int *clusters) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = fa_cuda_cluster_config(&attr, dim3((unsigned)ctas), threads, smem, nullptr, ctas);
    return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
}

/* Workspace regions start at multiples of 256 bytes. */
static inline size_t fa_cuda_align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* The device workspace of one call: the caller's, or cudaMallocAsync'd on the stream. */
typedef struct fa_cuda_workspace {
    uint8_t *base;
    bool owned; /* cudaFreeAsync it in fa_cuda_workspace_release */
} fa_cuda_workspace;

/* ws->base = given, or (given NULL, bytes > 0) `bytes` from cudaMallocAsync on `stream`;
 * FA_ERR_ALLOC when that fails. */
fa_status fa_cuda_workspace_acquire(void *given, size_t bytes, cudaStream_t stream, const char *what,
                                    fa_cuda_workspace *ws);

/* Frees an owned workspace, stream-ordered (after the work queued before it). Returns `status`,
 * or FA_ERR_CUDA when status was FA_OK and the free failed. */
fa_status fa_cuda_workspace_release(fa_cuda_workspace *ws, cudaStream_t stream, const char *what, fa_status status);

#endif /* FA_CUDA_COMMON_CUH */
