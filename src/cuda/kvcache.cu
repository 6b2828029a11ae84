/*
 * kvcache.cu: host side of the CUDA KV-cache decode path, and the merge of partial attention
 * states on the device.
 *
 *   fa_cuda_check_kvcache     the decode kernel's limits (dims, alignment, grid, shared memory)
 *                             and its workspace (partial states when the key range is split)
 *   fa_cuda_kvcache_forward   plans the call (head-dim bucket, row tiles, splits) and runs the
 *                             decode kernel (kvcache_sm80.cuh; above 256, kvcache_large_sm80.cuh),
 *                             in which the block that finds every split of its row tile done
 *                             merges them: one launch per call.
 *                             Head dims that are not multiples of 8 (the kernel moves 16-byte
 *                             vectors): q, k_new, v_new and both caches are copied, zero-padded
 *                             to the next multiple of 8, into the workspace, the kernel runs on
 *                             the copies, then o and the appended cache rows are copied back at
 *                             the caller's head dims and strides (gather.cu), as flash_attn pads
 *                             (its copy of the cache is as large)
 *   fa_cuda_merge_states      the public fa_merge_states on the device (the merge kernel below)
 *
 * Everything runs asynchronously on the caller's stream: no synchronisation, the int32 cache
 * arrays (device memory) are never read here, the workspace is the caller's or comes from
 * cudaMallocAsync / cudaFreeAsync on the stream.
 */
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/gather_launch.h"
#include "cuda/common/kvcache_launch.h"
#include "cuda/common/kvcache_tiles.h"

/* ---- merge kernel ------------------------------------------------------------------------- */

/* A merge of num_states partial states per output row. Output rows are indexed by (outer, inner,
 * head) so that both the public layout ([rows, heads], outer = 1) and the decode kernel's
 * ([batch, seqlen_q, heads_q] for o, [batch, heads_q, seqlen_q] for lse) are plain strides.
 * Strides in elements of the tensor's own type. */
struct fa_merge_args {
    const void *o_parts; /* [state][outer][inner][head][dv]                                     */
    int parts_dtype;     /* fa_dtype                                                             */
    int64_t part_state_stride, part_outer_stride, part_inner_stride, part_head_stride;
    const float *lse_parts; /* [state][outer][inner][head], natural log                         */
    int64_t lsep_state_stride, lsep_outer_stride, lsep_inner_stride, lsep_head_stride;
    void *o;       /* [outer][inner][head][dv]                                                   */
    int out_dtype; /* fa_dtype                                                                   */
    int64_t o_outer_stride, o_inner_stride, o_head_stride;
    float *lse; /* [outer][inner][head] or NULL                                                  */
    int64_t lse_outer_stride, lse_inner_stride, lse_head_stride;
    int64_t num_states, outer, inner, heads;
    int head_dim_v; /* <= FA_MERGE_MAX_DV                                                         */
};

enum {
    FA_MERGE_WARPS = 4,
    FA_MERGE_THREADS = 32 * FA_MERGE_WARPS,
    FA_MERGE_COLS = 128,      /* columns per pass: lane l holds l + 32·i, i < 4              */
    FA_MERGE_MAX_DV = 512,    /* at most 4 passes (checked: the CPU merge takes up to FA_MAX_HEAD_DIM) */
    FA_MERGE_BATCH = 8,       /* states one warp loads at once (independent loads in flight)  */
    FA_MERGE_LSE_CACHE = 1024 /* states whose lse is kept in shared memory; more: re-read     */
};

__device__ __forceinline__ float fa_merge_load(const void *base, int dtype, int64_t index) {
    if (dtype == FA_DTYPE_F32) return ((const float *)base)[index];
    const uint16_t bits = ((const uint16_t *)base)[index];
    return dtype == FA_DTYPE_F16 ? __half2float(__ushort_as_half(bits)) : __uint_as_float((uint32_t)bits << 16);
}

__device__ __forceinline__ void fa_merge_store(void *base, int dtype, int64_t index, float x) {
    if (dtype == FA_DTYPE_F32) {
        ((float *)base)[index] = x;
    } else if (dtype == FA_DTYPE_F16) {
        ((uint16_t *)base)[index] = (uint16_t)(fa_f16::pack2(x, 0.0f) & 0xffffu);
    } else {
        ((uint16_t *)base)[index] = (uint16_t)(fa_bf16::pack2(x, 0.0f) & 0xffffu);
    }
}

/* Shared memory of one merge block. */
struct fa_merge_smem {
    float lse[FA_MERGE_LSE_CACHE];
    float acc[FA_MERGE_WARPS][FA_MERGE_MAX_DV];
    float max[FA_MERGE_WARPS];
    float sum[FA_MERGE_WARPS];
};

/* One output row (out, in, head), by the whole block: lse = m + log Σ_s e^{lse_s - m} with
 * m = max_s lse_s, o = Σ_s e^{lse_s - m} o_s / Σ_s e^{lse_s - m}. A state with lse_s = -inf (or
 * NaN) is empty: its o_s is never read. All states empty: o = 0, lse = -inf.
 * Pass 1 reads every lse once (the first FA_MERGE_LSE_CACHE into shared memory) for the max;
 * pass 2 walks 128-column slices: warp w takes states 8w .. 8w + 7, then + 32, ..., lane l
 * columns l + 32i, so each warp has up to 32 independent loads in flight; the warps' sums meet
 * in shared memory. Ends with a barrier, so the caller may reuse `sm` at once. */
__device__ __forceinline__ void fa_merge_row(const fa_merge_args &a, int64_t out, int64_t in, int64_t head,
                                             fa_merge_smem &sm) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int dv = a.head_dim_v;
    const int64_t states = a.num_states;
    const int64_t elem_bytes = a.parts_dtype == FA_DTYPE_F32 ? 4 : 2;
    const float *lse_row = a.lse_parts + out * a.lsep_outer_stride + in * a.lsep_inner_stride +
                           head * a.lsep_head_stride;
    const char *part_row =
        (const char *)a.o_parts +
        (out * a.part_outer_stride + in * a.part_inner_stride + head * a.part_head_stride) * elem_bytes;
    auto lse_of = [&](int64_t s) -> float {
        return s < FA_MERGE_LSE_CACHE ? sm.lse[s] : lse_row[s * a.lsep_state_stride];
    };

    /* pass 1: the largest lse */
    float m = -CUDART_INF_F;
    int saw_nan = 0; /* fmaxf skips NaN: a NaN state is tracked apart and makes the row NaN */
    for (int64_t s = tid; s < states; s += FA_MERGE_THREADS) {
        const float v = lse_row[s * a.lsep_state_stride];
        if (s < FA_MERGE_LSE_CACHE) sm.lse[s] = v;
        m = fmaxf(m, v);
        saw_nan |= isnan(v);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) sm.max[warp] = m;
    const bool nan_state = __syncthreads_or(saw_nan) != 0; /* sm.max and sm.lse complete */
#pragma unroll
    for (int w = 0; w < FA_MERGE_WARPS; ++w) m = fmaxf(m, sm.max[w]);
    const bool any = m > -CUDART_INF_F || nan_state; /* block-uniform */

    /* the normaliser: thread-strided partial sums, warp-reduced, block-reduced below */
    float z = 0.0f;
    if (any)
        for (int64_t s = tid; s < states; s += FA_MERGE_THREADS) {
            const float v = lse_of(s);
            z += v == -CUDART_INF_F ? 0.0f : expf(v - m); /* NaN state: NaN */
        }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) z += __shfl_xor_sync(0xffffffffu, z, off);

    /* pass 2: weighted sums of o, 128 columns at a time */
    constexpr int PER_LANE = FA_MERGE_COLS / 32;
    for (int col0 = 0; col0 < dv; col0 += FA_MERGE_COLS) {
        float acc[PER_LANE];
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.0f;
        for (int64_t s0 = (int64_t)warp * FA_MERGE_BATCH; any && s0 < states;
             s0 += (int64_t)FA_MERGE_WARPS * FA_MERGE_BATCH) {
            float wgt[FA_MERGE_BATCH];
#pragma unroll
            for (int j = 0; j < FA_MERGE_BATCH; ++j) {
                const float v = s0 + j < states ? lse_of(s0 + j) : -CUDART_INF_F;
                wgt[j] = v == -CUDART_INF_F ? 0.0f : expf(v - m);
            }
            float x[FA_MERGE_BATCH][PER_LANE];
#pragma unroll
            for (int j = 0; j < FA_MERGE_BATCH; ++j) {
                const char *state = part_row + (s0 + j) * a.part_state_stride * elem_bytes;
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    const int col = col0 + lane + 32 * i;
                    x[j][i] = wgt[j] > 0.0f && col < dv ? fa_merge_load(state, a.parts_dtype, col) : 0.0f;
                }
            }
#pragma unroll
            for (int j = 0; j < FA_MERGE_BATCH; ++j)
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) acc[i] = fmaf(wgt[j], x[j][i], acc[i]);
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (col0 + lane + 32 * i < dv) sm.acc[warp][col0 + lane + 32 * i] = acc[i];
    }
    if (lane == 0) sm.sum[warp] = z;
    __syncthreads(); /* sm.acc and sm.sum complete */

    float z_all = 0.0f;
#pragma unroll
    for (int w = 0; w < FA_MERGE_WARPS; ++w) z_all += sm.sum[w];
    const float inv = fa_row_scale(1.0f, z_all); /* 0: every state empty; NaN: a NaN state */
    const int64_t o_row = out * a.o_outer_stride + in * a.o_inner_stride + head * a.o_head_stride;
    for (int col = tid; col < dv; col += FA_MERGE_THREADS) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < FA_MERGE_WARPS; ++w) sum += sm.acc[w][col];
        fa_merge_store(a.o, a.out_dtype, o_row + col, sum * inv);
    }
    if (tid == 0 && a.lse != nullptr)
        a.lse[out * a.lse_outer_stride + in * a.lse_inner_stride + head * a.lse_head_stride] =
            z_all > 0.0f ? m + logf(z_all) : fa_row_lse_degenerate(z_all);
    __syncthreads(); /* every read of sm done before the next row overwrites it */
}

/* Grid-stride over output rows: x = head, y = inner, z = outer (no 64-bit division). */
__global__ void __launch_bounds__(FA_MERGE_THREADS, 1) fa_merge_kernel(const fa_merge_args a) {
    __shared__ fa_merge_smem sm;
    for (int64_t out = blockIdx.z; out < a.outer; out += gridDim.z)
        for (int64_t in = blockIdx.y; in < a.inner; in += gridDim.y)
            for (int64_t head = blockIdx.x; head < a.heads; head += gridDim.x) fa_merge_row(a, out, in, head, sm);
}

/* Launch the merge on `stream`. */
static fa_status launch_merge(const fa_merge_args *args, cudaStream_t stream) {
    if (args->outer <= 0 || args->inner <= 0 || args->heads <= 0) return FA_OK;
    const int64_t max_x = (int64_t)1 << 20, max_yz = 65535;
    const dim3 grid((unsigned)(args->heads < max_x ? args->heads : max_x),
                    (unsigned)(args->inner < max_yz ? args->inner : max_yz),
                    (unsigned)(args->outer < max_yz ? args->outer : max_yz));
    fa_merge_kernel<<<grid, FA_MERGE_THREADS, 0, stream>>>(*args);
    FA_CUDA_CHECK_LAUNCH("merge kernel");
    return FA_OK;
}

/* ---- decode: limits and plan ----------------------------------------------------------------- */

typedef struct fa_kv_plan {
    fa_cuda_device_info dev;
    int bucket;             /* fa_kv_hdim_bucket; 0 with large heads                           */
    int large;              /* 256 < max(d, dv): the large-head kernel (kvcache_large_sm80.cuh)  */
    int v_in_k;             /* large heads on a latent cache (fa_kv_latent_cache)              */
    int large_wgmma;        /* large heads on the wgmma variant (fa_kvl_wgmma_ok)              */
    int row_tiles;
    int num_splits;
    size_t off_lse_partial; /* byte offsets in the workspace of lse_partial and split_flags     */
    size_t off_flags;
    /* head dims not multiples of 8: the kernel runs on zero-padded copies (d_pad, dv_pad) of q,
     * o, k_new, v_new and the caches, at these byte offsets in the workspace */
    int pad_dims, d_pad, dv_pad;
    size_t off_q, off_o, off_knew, off_vnew, off_kc, off_vc;
    /* quantised cache (kv_dtype != FA_KV_SAME): the width of the raw row copies (16, 8 or 4) */
    int kv_copy_bytes;
    size_t workspace_bytes; /* 0 without splits or padding                                      */
} fa_kv_plan;

/* A quantised cache (kv_dtype != FA_KV_SAME; its fields passed fa_validate_kv_quant): what the
 * CUDA kernel needs on top. The decode kernel copies raw cache rows by cp.async in units of 16, 8
 * or 4 bytes: the largest that divides both caches' base addresses, byte strides and row bytes.
 * Q8_0 rows (head_dim / 32 blocks of 34 bytes) are 4-byte multiples when head_dim is a multiple
 * of 64. q, o, k_new and v_new are 16-bit tensors moved in 16-byte vectors as on an
 * unquantised cache; no rotary (as on the CPU). */
static fa_status plan_kv_quant(const fa_params *p, fa_kv_plan *plan, const char *path) {
    fa_status s;
    const char *name = p->kv_dtype == FA_KV_INT8 ? "FA_KV_INT8" : p->kv_dtype == FA_KV_Q8_0 ? "FA_KV_Q8_0" : "FA_KV_FP8_E4M3";
    if (p->kv_dtype == FA_KV_Q8_0 && (p->head_dim % 64 != 0 || p->head_dim_v % 64 != 0))
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "head_dim = %lld, head_dim_v = %lld with kv_dtype = FA_KV_Q8_0: %s needs multiples of "
                            "64 (rows of whole 4-byte words)",
                            (long long)p->head_dim, (long long)p->head_dim_v, path);
    if ((s = fa_cuda_check_dtype_and_dims(p, path, 256, 256)) != FA_OK ||
        (s = fa_cuda_check_tensor16("q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, 1, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("o", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride, 1, path)) != FA_OK ||
        (p->k_new != NULL &&
         ((s = fa_cuda_check_tensor16("knew", p->k_new, p->knew_batch_stride, p->knew_row_stride, p->knew_head_stride,
                                      1, path)) != FA_OK ||
          (s = fa_cuda_check_tensor16("vnew", p->v_new, p->vnew_batch_stride, p->vnew_row_stride, p->vnew_head_stride,
                                      1, path)) != FA_OK)) ||
        (s = fa_cuda_check_aligned("k_scale", p->k_scale, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("v_scale", p->v_scale, 4)) != FA_OK)
        return s;
    const int q8 = p->kv_dtype == FA_KV_Q8_0, paged = p->block_table != NULL;
    /* strides of axes of extent 1 are never used: they do not count */
    const int one_slab = (paged ? p->num_pages : p->cache_batch) == 1, one_row = (paged ? p->page_size : p->seqlen_k) == 1,
              one_head = p->heads_kv == 1;
    const int64_t parts[8] = {(int64_t)(uintptr_t)p->k,
                              (int64_t)(uintptr_t)p->v,
                              one_slab ? 0 : p->k_batch_stride,
                              one_row ? 0 : p->k_row_stride,
                              one_head ? 0 : p->k_head_stride,
                              one_slab ? 0 : p->v_batch_stride,
                              one_row ? 0 : p->v_row_stride,
                              one_head ? 0 : p->v_head_stride};
    const int64_t row_bytes[2] = {q8 ? p->head_dim / 32 * 34 : p->head_dim, q8 ? p->head_dim_v / 32 * 34 : p->head_dim_v};
    int64_t unit = 16;
    for (int i = 0; i < 8; i++)
        while (unit > 1 && parts[i] % unit != 0) unit /= 2;
    for (int i = 0; i < 2; i++)
        while (unit > 1 && row_bytes[i] % unit != 0) unit /= 2;
    if (unit < 4)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "k / v with kv_dtype = %s: %s needs the caches' base addresses and byte strides "
                            "(k_batch_stride %lld, k_row_stride %lld, k_head_stride %lld, v_batch_stride %lld, "
                            "v_row_stride %lld, v_head_stride %lld) to be multiples of 4",
                            name, path, (long long)p->k_batch_stride, (long long)p->k_row_stride,
                            (long long)p->k_head_stride, (long long)p->v_batch_stride, (long long)p->v_row_stride,
                            (long long)p->v_head_stride);
    plan->kv_copy_bytes = (int)unit;
    return FA_OK;
}

/* q, k, v, o and the appended k_new / v_new as the 16-bit kernels read them: 16-byte aligned rows
 * (paged caches: the batch stride is the page stride). */
static fa_status check_tensors16(const fa_params *p, const char *path) {
    fa_status s;
    if ((s = fa_cuda_check_tensor16("q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, 1, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, 1, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, 1, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("o", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride, 1, path)) != FA_OK)
        return s;
    if (p->k_new != NULL &&
        ((s = fa_cuda_check_tensor16("knew", p->k_new, p->knew_batch_stride, p->knew_row_stride, p->knew_head_stride, 1,
                                     path)) != FA_OK ||
         (s = fa_cuda_check_tensor16("vnew", p->v_new, p->vnew_batch_stride, p->vnew_row_stride, p->vnew_head_stride, 1,
                                     path)) != FA_OK))
        return s;
    return FA_OK;
}

/* Head dims above 256 (256 < max(d, dv)): the large-head kernel's limits. It takes d <= 576 and
 * dv <= 512, multiples of 8 (no padded copies: a 576-wide cache is copied for no one), f16 / bf16
 * unquantised caches, contiguous or paged, every mask, softcap, ALiBi, sinks, rotary (not on a
 * latent cache, as everywhere), appends, splits; no score bias. A v that is k itself (same
 * pointer and strides) with dv > d is refused: it is no latent cache, its rows would run into
 * the next head's keys. */
static fa_status check_large_heads(const fa_problem *pb, const char *path) {
    const fa_params *p = &pb->p;
    static const char *const kernel = "the CUDA KV-cache kernel for head dims above 256";
    if (p->kv_dtype != FA_KV_SAME)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "kv_dtype = %d with head_dim = %lld, head_dim_v = %lld: %s takes f16 / bf16 caches "
                            "only (quantised caches: head dims up to 256 on CUDA, any on the CPU)",
                            (int)p->kv_dtype, (long long)p->head_dim, (long long)p->head_dim_v, kernel);
    if (pb->has_mods)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "bias is set with head_dim = %lld, head_dim_v = %lld: %s has no score bias (head dims "
                            "up to 256 on CUDA, any on the CPU)",
                            (long long)p->head_dim, (long long)p->head_dim_v, kernel);
    if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "dtype = %d: %s supports f16 and bf16", (int)p->dtype, path);
    if (p->head_dim < 8 || p->head_dim > FA_KVL_MAX_D || p->head_dim % 8 != 0)
        return fa_set_error(FA_ERR_HEAD_DIM,
                            "head_dim = %lld (head_dim_v = %lld): %s needs a multiple of 8 in 8..%d",
                            (long long)p->head_dim, (long long)p->head_dim_v, kernel, (int)FA_KVL_MAX_D);
    if (p->head_dim_v < 8 || p->head_dim_v > FA_KVL_MAX_DV || p->head_dim_v % 8 != 0)
        return fa_set_error(FA_ERR_HEAD_DIM,
                            "head_dim_v = %lld (head_dim = %lld): %s needs a multiple of 8 in 8..%d",
                            (long long)p->head_dim_v, (long long)p->head_dim, kernel, (int)FA_KVL_MAX_DV);
    if (p->v == p->k && p->head_dim_v > p->head_dim && p->v_batch_stride == p->k_batch_stride &&
        p->v_row_stride == p->k_row_stride && p->v_head_stride == p->k_head_stride)
        return fa_set_error(FA_ERR_HEAD_DIM,
                            "head_dim_v = %lld > head_dim = %lld with v == k (same pointer and strides): a latent "
                            "cache's values are the first head_dim_v columns of k, so head_dim_v <= head_dim",
                            (long long)p->head_dim_v, (long long)p->head_dim);
    return check_tensors16(p, path);
}

static fa_status plan_kvcache(const fa_problem *pb, fa_kv_plan *plan) {
    const fa_params *p = &pb->p;
    static const char *const path = "the CUDA KV-cache path";
    fa_status s;
    const int quant = p->kv_dtype != FA_KV_SAME;
    plan->kv_copy_bytes = 0;
    plan->large = fa_kvl_wanted((int)p->head_dim, (int)p->head_dim_v);
    plan->v_in_k = plan->large && fa_kv_latent_cache(p);
    /* Head dims that are not multiples of 8 run on padded copies (element-wise, any stride). */
    plan->pad_dims = !quant && !plan->large && (p->head_dim % 8 != 0 || p->head_dim_v % 8 != 0);
    plan->d_pad = (int)((p->head_dim + 7) / 8 * 8);
    plan->dv_pad = (int)((p->head_dim_v + 7) / 8 * 8);
    if (plan->large) {
        if ((s = check_large_heads(pb, path)) != FA_OK) return s;
    } else if (quant) {
        if (pb->has_mods) /* the quantised kernel has no MODS instantiation */
            return fa_set_error(FA_ERR_UNSUPPORTED,
                                "bias / block mask / doc_ids with kv_dtype = %d: %s does not combine a score bias or "
                                "block mask with a quantised cache",
                                (int)p->kv_dtype, path);
        if ((s = plan_kv_quant(p, plan, path)) != FA_OK) return s;
    } else if (plan->pad_dims) {
        if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
            return fa_set_error(FA_ERR_DTYPE, "dtype = %d: %s supports f16 and bf16", (int)p->dtype, path);
        if (p->head_dim < 1 || p->head_dim > 256 || p->head_dim_v < 1 || p->head_dim_v > 256)
            return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld, head_dim_v = %lld: %s supports 1..256",
                                (long long)p->head_dim, (long long)p->head_dim_v, path);
    } else if ((s = fa_cuda_check_dtype_and_dims(p, path, 256, 256)) != FA_OK || (s = check_tensors16(p, path)) != FA_OK)
        return s;
    if ((s = fa_cuda_check_aligned("lse", p->lse, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("alibi_slopes", p->alibi_slopes, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("sink_logits", p->sink_logits, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cache_seqlens", p->cache_seqlens, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cache_batch_idx", p->cache_batch_idx, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cache_leftpad", p->cache_leftpad, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("block_table", p->block_table, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("rotary_cos", p->rotary_cos, 2)) != FA_OK ||
        (s = fa_cuda_check_aligned("rotary_sin", p->rotary_sin, 2)) != FA_OK ||
        (s = fa_cuda_check_aligned("workspace", p->workspace, 256)) != FA_OK)
        return s;
    if (p->rotary_cos != NULL && (p->rotary_dim < 2 || p->rotary_dim > p->head_dim || p->rotary_dim % 2 != 0 ||
                                  p->rotary_seqlen < 1 || p->rotary_seqlen > INT32_MAX))
        return fa_set_error(FA_ERR_INVALID_SIZE, "rotary_dim = %lld / rotary_seqlen = %lld: out of range",
                            (long long)p->rotary_dim, (long long)p->rotary_seqlen);

    /* Slots, rows and their mask arithmetic are int32 in the kernel; the grid has 65535 in y/z. */
    const int64_t max_len = (int64_t)1 << 30;
    if (p->seqlen_q >= max_len || p->seqlen_k >= max_len || p->seqlen_q * pb->group >= max_len)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "seqlen_q = %lld, seqlen_k = %lld, group = %lld: the CUDA KV-cache path needs "
                            "seqlen_k and seqlen_q × heads_q / heads_kv below 2^30",
                            (long long)p->seqlen_q, (long long)p->seqlen_k, (long long)pb->group);
    if (p->batch > 65535 || p->heads_kv > 65535)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "batch = %lld, heads_kv = %lld: the CUDA KV-cache grid allows at most 65535 of each",
                            (long long)p->batch, (long long)p->heads_kv);
    if (p->block_table != NULL && (p->page_size > INT32_MAX || p->num_pages > INT32_MAX))
        return fa_set_error(FA_ERR_INVALID_SIZE, "page_size = %lld, num_pages = %lld: must be below 2^31",
                            (long long)p->page_size, (long long)p->num_pages);
    if (p->block_table == NULL && (p->cache_batch < 1 || p->cache_batch > INT32_MAX))
        return fa_set_error(FA_ERR_INVALID_SIZE, "cache_batch = %lld is out of range", (long long)p->cache_batch);

    if ((s = fa_cuda_current_device_sm80(&plan->dev)) != FA_OK) return s;
    plan->bucket = plan->large ? 0 : fa_kv_hdim_bucket(plan->d_pad, plan->dv_pad);
    /* FA_CUDA_KVCACHE=portable in the environment keeps the mma.sync kernel (tests run both) */
    const char *force = getenv("FA_CUDA_KVCACHE");
    plan->large_wgmma = plan->large && !(force != NULL && strcmp(force, "portable") == 0) &&
                        fa_kvl_wgmma_ok(plan->dev.cc_major, plan->dev.cc_minor, (int)p->head_dim, (int)p->head_dim_v,
                                        p->rotary_cos != NULL);
    const size_t smem = plan->large_wgmma && plan->v_in_k ? fa_kvl_latent_smem_bytes()
                        : plan->large_wgmma           ? fa_kvl_wgmma_smem_bytes(plan->v_in_k)
                        : plan->large               ? fa_kvl_smem_bytes(plan->v_in_k)
                        : !quant                    ? fa_kv_smem_bytes(plan->bucket)
                        : p->kv_dtype == FA_KV_Q8_0 ? fa_kvq_smem_bytes(plan->bucket)
                                                    : fa_kvq_regs_smem_bytes(plan->bucket);
    if ((s = fa_cuda_check_smem(p, &plan->dev, smem,
                                !plan->large   ? "the CUDA KV-cache kernel"
                                : plan->v_in_k ? "the CUDA KV-cache kernel for head dims above 256 (latent cache)"
                                               : "the CUDA KV-cache kernel for head dims above 256 (separate K and V "
                                                 "caches; a latent cache, v the first head_dim_v columns of k, needs "
                                                 "less)")) != FA_OK)
        return s;
    /* the tile shape of the kernel that runs */
    const int block_m = plan->large ? (int)FA_KVL_BLOCK_M : (int)FA_KV_BLOCK_M;
    const int block_n = plan->large_wgmma && plan->v_in_k ? (int)FA_KVL_LATENT_BLOCK_N
                        : plan->large                       ? (int)FA_KVL_BLOCK_N
                                                            : (int)FA_KV_BLOCK_N;
    const int64_t max_splits = plan->large ? (int64_t)FA_KVL_MAX_SPLITS : (int64_t)FA_KV_MAX_SPLITS;

    /* Splits. The cache lengths are on the device, so the plan uses the capacity seqlen_k (which
     * includes the appended tokens), narrowed by a two-sided window; a range of n slots touches
     * at most (n + 126) / 64 slot-aligned tiles. */
    const int64_t rows_packed = p->seqlen_q * pb->group;
    plan->row_tiles = (int)((rows_packed + block_m - 1) / block_m);
    int64_t est_keys = p->seqlen_k;
    if (p->window_left >= 0 && p->window_right >= 0) {
        const int64_t tokens = p->seqlen_q < block_m ? p->seqlen_q : block_m;
        const int64_t span = (int64_t)p->window_left + p->window_right + tokens;
        if (span < est_keys) est_keys = span;
    }
    const int64_t key_blocks = est_keys > 0 ? (est_keys + 2 * block_n - 2) / block_n : 0;
    const int64_t units = p->batch * p->heads_kv * plan->row_tiles;
    const int64_t workers = (int64_t)plan->dev.sm_count * fa_kv_blocks_per_sm(smem, plan->dev.smem_per_sm);
    int64_t splits;
    if (p->num_splits == 0) {
        /* The wave rule's count, but no more than one block per SM unless every split still
         * streams FA_KV_MIN_SPLIT_TILES key tiles: a block has a fixed cost of several µs (start,
         * instruction fetch of a ~100 KB kernel, epilogue, done flag) that short splits do not
         * amortise, and two blocks per SM at different points of that code stall more on
         * instruction fetch. H200, 1 × 8k (129 tiles, 8 kv heads), per call back to back: 16
         * splits × 8 tiles (128 blocks) 18.9 µs, 24 × 6 21.0, 33 × 4 (the wave rule's 264) 23.0. */
        const int64_t per_sm = (int64_t)plan->dev.sm_count / units;
        const int64_t long_splits = key_blocks / FA_KV_MIN_SPLIT_TILES;
        const int64_t most = per_sm > long_splits ? per_sm : long_splits;
        splits = fa_num_splits_heuristic(units, key_blocks, workers, max_splits);
        if (splits > most) splits = most;
    } else {
        /* num_splits = n: at most n, and never more than there are key tiles (or the cap) */
        splits = p->num_splits;
        if (splits > key_blocks) splits = key_blocks;
        if (splits > max_splits) splits = max_splits;
    }
    if (splits < 1) splits = 1;
    plan->num_splits = (int)splits;
    if ((int64_t)plan->row_tiles * splits > INT32_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE, "seqlen_q × group = %lld: too many query row tiles for the grid",
                            (long long)rows_packed);

    /* Workspace with splits: o_partial fp32 [splits][b][hq][t][dv], lse_partial fp32
     * [splits][b][hq][t], then one 64-bit done flag per (b, kv head, row tile, split). With
     * padded head dims (dv = dv_pad there) the padded copies follow: q [b][t][hq][d_pad],
     * o [b][t][hq][dv_pad], k_new / v_new [b][seqlen_new][hkv][d_pad / dv_pad], the caches
     * [cache rows or pages][rows][hkv][d_pad / dv_pad], all dense. */
    const int64_t dv_kernel = plan->pad_dims ? plan->dv_pad : p->head_dim_v;
    plan->off_lse_partial = 0;
    plan->off_flags = 0;
    plan->workspace_bytes = 0;
    if (splits > 1) {
        const double rows = (double)splits * (double)p->batch * (double)p->heads_q * (double)p->seqlen_q;
        if (rows * (double)(dv_kernel + 1) * 4.0 + 8.0 * (double)units * (double)splits > 9.0e18)
            return fa_set_error(FA_ERR_OVERFLOW, "the split-KV workspace size overflows");
        const size_t part_rows = (size_t)splits * (size_t)p->batch * (size_t)p->heads_q * (size_t)p->seqlen_q;
        plan->off_lse_partial = fa_cuda_align256(part_rows * (size_t)dv_kernel * 4);
        plan->off_flags = fa_cuda_align256(plan->off_lse_partial + part_rows * 4);
        plan->workspace_bytes = fa_cuda_align256(plan->off_flags + (size_t)units * (size_t)splits * 8);
    }
    if (plan->pad_dims) {
        const int paged = p->block_table != NULL;
        const double slab_elems = (paged ? (double)p->num_pages * (double)p->page_size
                                         : (double)p->cache_batch * (double)p->seqlen_k) *
                                  (double)p->heads_kv;
        const double q_rows = (double)p->batch * (double)p->seqlen_q * (double)p->heads_q;
        const double new_rows = (double)p->batch * (double)p->seqlen_new * (double)p->heads_kv;
        if ((slab_elems + q_rows + new_rows) * (double)(plan->d_pad + plan->dv_pad) * 2.0 +
                (double)plan->workspace_bytes > 9.0e18)
            return fa_set_error(FA_ERR_OVERFLOW,
                                "head_dim = %lld, head_dim_v = %lld: the padded copies of q and the caches "
                                "overflow the workspace size",
                                (long long)p->head_dim, (long long)p->head_dim_v);
        const size_t ds = (size_t)plan->d_pad * 2, dvs = (size_t)plan->dv_pad * 2;
        const size_t qn = (size_t)q_rows, nn = p->k_new != NULL ? (size_t)new_rows : 0, cn = (size_t)slab_elems;
        plan->off_q = plan->workspace_bytes;
        plan->off_o = fa_cuda_align256(plan->off_q + qn * ds);
        plan->off_knew = fa_cuda_align256(plan->off_o + qn * dvs);
        plan->off_vnew = fa_cuda_align256(plan->off_knew + nn * ds);
        plan->off_kc = fa_cuda_align256(plan->off_vnew + nn * dvs);
        plan->off_vc = fa_cuda_align256(plan->off_kc + cn * ds);
        plan->workspace_bytes = fa_cuda_align256(plan->off_vc + cn * dvs);
    }
    return FA_OK;
}

extern "C" fa_status fa_cuda_check_kvcache(const fa_problem *pb, size_t *workspace_bytes) {
    if (workspace_bytes) *workspace_bytes = 0;
    fa_kv_plan plan;
    fa_status s = plan_kvcache(pb, &plan);
    if (s == FA_OK && workspace_bytes) *workspace_bytes = plan.workspace_bytes;
    return s;
}

/* ---- decode: run ------------------------------------------------------------------------------ */

/* A tag per call for the fused merge's done flags (kvcache_sm80.cuh, step 6): a flag holding
 * another value counts as not done, so consecutive calls get different tags; never 0 (the value
 * a merging block leaves). The call counter goes through a 64-bit mix (splitmix64's finaliser,
 * a bijection) so that tags look random: a caller's workspace that held other data (small
 * integers, say) before its first use cannot plausibly contain this call's tag. */
static unsigned long long next_split_tag(void) {
    static unsigned long long calls = 0;
    unsigned long long tag;
    do {
        unsigned long long z = __atomic_add_fetch(&calls, 1ull, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        tag = z ^ (z >> 31);
    } while (tag == 0);
    return tag;
}

static fa_status run_kvcache(const fa_problem *pb, const fa_kv_plan *plan, uint8_t *ws, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    fa_kv_params prm;
    fa_cuda_fill_kernel_base(&prm, pb); /* k, v: the cache, written when appending */
    prm.k_new = p->k_new;
    prm.v_new = p->v_new;
    prm.seqlen_new = p->k_new != NULL ? (int)p->seqlen_new : 0;
    prm.knew_batch_stride = p->knew_batch_stride;
    prm.knew_row_stride = p->knew_row_stride;
    prm.knew_head_stride = p->knew_head_stride;
    prm.vnew_batch_stride = p->vnew_batch_stride;
    prm.vnew_row_stride = p->vnew_row_stride;
    prm.vnew_head_stride = p->vnew_head_stride;
    prm.cache_seqlens = p->cache_seqlens;
    prm.cache_batch_idx = p->block_table != NULL ? NULL : p->cache_batch_idx;
    prm.cache_leftpad = p->cache_leftpad;
    prm.block_table = p->block_table;
    prm.block_table_batch_stride = p->block_table != NULL ? p->block_table_batch_stride : 0;
    prm.page_size = p->block_table != NULL ? (int)p->page_size : 1;
    prm.num_pages = p->block_table != NULL ? (int)p->num_pages : 1;
    prm.cache_batch = p->block_table != NULL ? 1 : (int)p->cache_batch;
    prm.rotary_cos = p->rotary_cos;
    prm.rotary_sin = p->rotary_sin;
    prm.rotary_dim = p->rotary_cos != NULL ? (int)p->rotary_dim : 0;
    prm.rotary_seqlen = p->rotary_cos != NULL ? (int)p->rotary_seqlen : 1;
    prm.rotary_interleaved = p->rotary_interleaved != 0;
    prm.rotary_q_per_token = pb->has_mask;
    prm.rows_packed = (int)(p->seqlen_q * pb->group);
    prm.row_tiles = plan->row_tiles;
    prm.num_splits = plan->num_splits;
    prm.o_partial = plan->num_splits > 1 ? (float *)ws : NULL;
    prm.lse_partial = plan->num_splits > 1 ? (float *)(ws + plan->off_lse_partial) : NULL;
    prm.split_flags = plan->num_splits > 1 ? (unsigned long long *)(ws + plan->off_flags) : NULL;
    prm.split_tag = next_split_tag();
    prm.kv_quant = (int)p->kv_dtype;
    prm.kv_copy_bytes = plan->kv_copy_bytes;
    prm.k_scale = p->k_scale;
    prm.v_scale = p->v_scale;
    prm.k_scale_batch_stride = p->k_scale_batch_stride;
    prm.k_scale_row_stride = p->k_scale_row_stride;
    prm.k_scale_head_stride = p->k_scale_head_stride;
    prm.v_scale_batch_stride = p->v_scale_batch_stride;
    prm.v_scale_row_stride = p->v_scale_row_stride;
    prm.v_scale_head_stride = p->v_scale_head_stride;
    prm.v_in_k = plan->v_in_k;

    fa_status s;
    if (plan->large_wgmma) return fa_kvl_launch_wgmma(&prm, p->dtype, plan->dev.ordinal, stream);
    if (plan->large) /* unquantised, no score bias (check_large_heads) */
        return plan->v_in_k ? fa_kvl_launch_latent(&prm, p->dtype, plan->dev.ordinal, stream)
                            : fa_kvl_launch_separate(&prm, p->dtype, plan->dev.ordinal, stream);
    if (p->kv_dtype != FA_KV_SAME) {
        /* the append first (stream-ordered), then the decode kernel reads every slot from the cache */
        if (p->k_new != NULL && (s = fa_kvq_append(&prm, p->dtype, stream)) != FA_OK) return s;
        switch (plan->bucket) {
        case 64: return fa_kvq_launch_hdim64(&prm, p->dtype, plan->dev.ordinal, stream);
        case 128: return fa_kvq_launch_hdim128(&prm, p->dtype, plan->dev.ordinal, stream);
        case 256: return fa_kvq_launch_hdim256(&prm, p->dtype, plan->dev.ordinal, stream);
        default:
            return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld, head_dim_v = %lld: no CUDA KV-cache kernel",
                                (long long)p->head_dim, (long long)p->head_dim_v);
        }
    }
    if (pb->has_mods) { /* the score bias (common/mods.cuh), added in the transformed path's log2 units */
        fa_mods_params mods;
        if ((s = fa_cuda_mods_prepare(pb, nullptr, stream, &mods)) != FA_OK) return s;
        prm.transform_scores = 1;
        prm.score_mul = 1.0f;
        switch (plan->bucket) {
        case 64: return fa_kv_mods_launch_hdim64(&prm, &mods, p->dtype, plan->dev.ordinal, stream);
        case 128: return fa_kv_mods_launch_hdim128(&prm, &mods, p->dtype, plan->dev.ordinal, stream);
        case 256: return fa_kv_mods_launch_hdim256(&prm, &mods, p->dtype, plan->dev.ordinal, stream);
        default: break;
        }
    }
    switch (plan->bucket) {
    case 64: s = fa_kv_launch_hdim64(&prm, p->dtype, plan->dev.ordinal, stream); break;
    case 128: s = fa_kv_launch_hdim128(&prm, p->dtype, plan->dev.ordinal, stream); break;
    case 256: s = fa_kv_launch_hdim256(&prm, p->dtype, plan->dev.ordinal, stream); break;
    default:
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld, head_dim_v = %lld: no CUDA KV-cache kernel",
                            (long long)p->head_dim, (long long)p->head_dim_v);
    }
    return s;
}

/* Head dims that are not multiples of 8: pad q, k_new, v_new and both caches into the workspace,
 * run the kernel on the copies (its append lands in the cache copy), then copy o and the appended
 * cache rows back at the caller's dims and strides. Stream-ordered; nothing is read on the host. */
static fa_status run_kvcache_padded(const fa_problem *pb, const fa_kv_plan *plan, uint8_t *ws, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    const int paged = p->block_table != NULL, append = p->k_new != NULL;
    const int64_t b = p->batch, sq = p->seqlen_q, hq = p->heads_q, hkv = p->heads_kv, sn = p->seqlen_new;
    const int64_t d = p->head_dim, dv = p->head_dim_v, d8 = plan->d_pad, dv8 = plan->dv_pad;
    const int64_t slabs = paged ? p->num_pages : p->cache_batch, slab_rows = paged ? p->page_size : p->seqlen_k;
    fa_problem inner = *pb;
    fa_params *ip = &inner.p;
    ip->head_dim = d8;
    ip->head_dim_v = dv8;
    ip->q = ws + plan->off_q;
    ip->q_batch_stride = sq * hq * d8, ip->q_row_stride = hq * d8, ip->q_head_stride = d8;
    ip->o = ws + plan->off_o;
    ip->o_batch_stride = sq * hq * dv8, ip->o_row_stride = hq * dv8, ip->o_head_stride = dv8;
    ip->k = ws + plan->off_kc;
    ip->k_batch_stride = slab_rows * hkv * d8, ip->k_row_stride = hkv * d8, ip->k_head_stride = d8;
    ip->v = ws + plan->off_vc;
    ip->v_batch_stride = slab_rows * hkv * dv8, ip->v_row_stride = hkv * dv8, ip->v_head_stride = dv8;
    if (append) {
        ip->k_new = ws + plan->off_knew;
        ip->knew_batch_stride = sn * hkv * d8, ip->knew_row_stride = hkv * d8, ip->knew_head_stride = d8;
        ip->v_new = ws + plan->off_vnew;
        ip->vnew_batch_stride = sn * hkv * dv8, ip->vnew_row_stride = hkv * dv8, ip->vnew_head_stride = dv8;
    }
    /* (from, its strides and dims) -> (to, its strides and dims), over [n0, n1, n2] */
    struct copy_job {
        const void *src;
        int64_t s0, s1, s2, src_cols;
        const void *dst;
        int64_t t0, t1, t2, dst_cols, n0, n1, n2;
        const char *what;
    };
    const copy_job in_jobs[5] = {
        {p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, d, ip->q, ip->q_batch_stride, ip->q_row_stride,
         ip->q_head_stride, d8, b, sq, hq, "KV-cache head-dim padding of q"},
        {p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, d, ip->k, ip->k_batch_stride, ip->k_row_stride,
         ip->k_head_stride, d8, slabs, slab_rows, hkv, "KV-cache head-dim padding of k"},
        {p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, dv, ip->v, ip->v_batch_stride, ip->v_row_stride,
         ip->v_head_stride, dv8, slabs, slab_rows, hkv, "KV-cache head-dim padding of v"},
        {p->k_new, p->knew_batch_stride, p->knew_row_stride, p->knew_head_stride, d, ip->k_new, ip->knew_batch_stride,
         ip->knew_row_stride, ip->knew_head_stride, d8, b, sn, hkv, "KV-cache head-dim padding of k_new"},
        {p->v_new, p->vnew_batch_stride, p->vnew_row_stride, p->vnew_head_stride, dv, ip->v_new, ip->vnew_batch_stride,
         ip->vnew_row_stride, ip->vnew_head_stride, dv8, b, sn, hkv, "KV-cache head-dim padding of v_new"},
    };
    const copy_job out_job = {ip->o, ip->o_batch_stride, ip->o_row_stride, ip->o_head_stride, dv8, p->o,
                              p->o_batch_stride, p->o_row_stride, p->o_head_stride, dv, b, sq, hq,
                              "KV-cache head-dim padding of o"};
    auto run_copy = [&](const copy_job &j) -> fa_status {
        fa_copy16_args a;
        a.src = j.src;
        a.src_stride[0] = j.s0, a.src_stride[1] = j.s1, a.src_stride[2] = j.s2;
        a.src_cols = (int)j.src_cols;
        a.dst = (void *)j.dst;
        a.dst_stride[0] = j.t0, a.dst_stride[1] = j.t1, a.dst_stride[2] = j.t2;
        a.dst_cols = (int)j.dst_cols;
        a.extent[0] = j.n0, a.extent[1] = j.n1, a.extent[2] = j.n2;
        return fa_cuda_copy16(&a, stream, j.what);
    };
    fa_status s;
    for (int i = 0; i < (append ? 5 : 3); ++i)
        if ((s = run_copy(in_jobs[i])) != FA_OK) return s;
    if ((s = run_kvcache(&inner, plan, ws, stream)) != FA_OK || (s = run_copy(out_job)) != FA_OK) return s;
    if (!append) return FA_OK;
    fa_kv_copy_back_args a;
    a.k_pad = ip->k, a.v_pad = ip->v;
    a.d_pad = (int)d8, a.dv_pad = (int)dv8;
    a.k = (void *)p->k, a.v = (void *)p->v;
    a.d = (int)d, a.dv = (int)dv;
    a.k_batch_stride = p->k_batch_stride, a.k_row_stride = p->k_row_stride, a.k_head_stride = p->k_head_stride;
    a.v_batch_stride = p->v_batch_stride, a.v_row_stride = p->v_row_stride, a.v_head_stride = p->v_head_stride;
    a.cache_seqlens = p->cache_seqlens;
    a.cache_batch_idx = paged ? NULL : p->cache_batch_idx;
    a.block_table = p->block_table;
    a.block_table_batch_stride = paged ? p->block_table_batch_stride : 0;
    a.batch = (int)b, a.heads_kv = (int)hkv, a.seqlen_new = (int)sn, a.capacity = (int)p->seqlen_k;
    a.page_size = paged ? (int)p->page_size : 1;
    a.num_pages = paged ? (int)p->num_pages : 1;
    a.cache_batch = paged ? 1 : (int)p->cache_batch;
    return fa_cuda_copy_appended(&a, stream);
}

extern "C" fa_status fa_cuda_kvcache_forward(const fa_problem *pb) {
    fa_kv_plan plan;
    fa_status s = plan_kvcache(pb, &plan);
    if (s != FA_OK) return s;
    const fa_params *p = &pb->p;
    if (p->seqlen_q < 1) return FA_OK; /* nothing to attend or append */
    if ((s = fa_check_workspace_size(p, plan.workspace_bytes)) != FA_OK) return s;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);

    fa_cuda_workspace ws;
    if ((s = fa_cuda_workspace_acquire(p->workspace, plan.workspace_bytes, stream, "split-KV", &ws)) != FA_OK)
        return s;
    s = plan.pad_dims ? run_kvcache_padded(pb, &plan, ws.base, stream) : run_kvcache(pb, &plan, ws.base, stream);
    return fa_cuda_workspace_release(&ws, stream, "split-KV", s);
}

/* ---- fa_merge_states on the device ---------------------------------------------------------- */

extern "C" fa_status fa_cuda_merge_states(const fa_merge_params *mp) {
    if (mp->parts_dtype != FA_DTYPE_F32 && mp->parts_dtype != FA_DTYPE_F16 && mp->parts_dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "parts_dtype = %d: the CUDA merge supports f32, f16 and bf16",
                            (int)mp->parts_dtype);
    if (mp->out_dtype != FA_DTYPE_F32 && mp->out_dtype != FA_DTYPE_F16 && mp->out_dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "out_dtype = %d: the CUDA merge supports f32, f16 and bf16",
                            (int)mp->out_dtype);
    if (mp->head_dim_v < 1 || mp->head_dim_v > FA_MERGE_MAX_DV)
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim_v = %lld: the CUDA merge supports 1..%d",
                            (long long)mp->head_dim_v, (int)FA_MERGE_MAX_DV);
    fa_status s;
    fa_cuda_device_info dev;
    if ((s = fa_cuda_check_aligned("o_parts", mp->o_parts, mp->parts_dtype == FA_DTYPE_F32 ? 4 : 2)) != FA_OK ||
        (s = fa_cuda_check_aligned("lse_parts", mp->lse_parts, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("o", mp->o, mp->out_dtype == FA_DTYPE_F32 ? 4 : 2)) != FA_OK ||
        (s = fa_cuda_check_aligned("lse", mp->lse, 4)) != FA_OK ||
        (s = fa_cuda_current_device_sm80(&dev)) != FA_OK)
        return s;
    if (mp->rows == 0) return FA_OK;
    fa_merge_args m;
    m.o_parts = mp->o_parts;
    m.parts_dtype = mp->parts_dtype;
    m.part_state_stride = mp->o_parts_state_stride;
    m.part_outer_stride = 0;
    m.part_inner_stride = mp->o_parts_row_stride;
    m.part_head_stride = mp->o_parts_head_stride;
    m.lse_parts = mp->lse_parts;
    m.lsep_state_stride = mp->lse_parts_state_stride;
    m.lsep_outer_stride = 0;
    m.lsep_inner_stride = mp->lse_parts_row_stride;
    m.lsep_head_stride = mp->lse_parts_head_stride;
    m.o = mp->o;
    m.out_dtype = mp->out_dtype;
    m.o_outer_stride = 0;
    m.o_inner_stride = mp->o_row_stride;
    m.o_head_stride = mp->o_head_stride;
    m.lse = mp->lse;
    m.lse_outer_stride = 0;
    m.lse_inner_stride = mp->lse_row_stride;
    m.lse_head_stride = mp->lse_head_stride;
    m.num_states = mp->num_states;
    m.outer = 1;
    m.inner = mp->rows;
    m.heads = mp->heads;
    m.head_dim_v = (int)mp->head_dim_v;
    return launch_merge(&m, static_cast<cudaStream_t>(mp->stream));
}
