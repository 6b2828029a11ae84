/*
 * kvcache_launch.h: the KV-cache decode kernel's parameter block and its extern "C" launchers,
 * one per head-dim bucket (instances/kvcache_sm80_hdim<bucket>.cu) and, above 256, per cache kind
 * (instances/kvcache_large_sm80_<cache>.cu). kvcache.cu plans the call
 * (bucket, row tiles, splits, workspace), fills fa_kv_params and calls one of these: one launch
 * per call, the split-KV merge included (kernel step 6).
 */
#ifndef FA_KVCACHE_LAUNCH_H
#define FA_KVCACHE_LAUNCH_H

#include <cuda_runtime.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/mods.cuh"

/* Everything the decode kernel reads, passed by value: fa_kernel_base and the cache layout
 * below. Strides in elements. The int32 arrays are device memory, read and clamped by the kernel
 * only. "Slot" = position in a sequence's cache (0 .. seqlen_k - 1); key j of the attention is
 * slot pad + j (pad = cache_leftpad[b]). From the base: k and v are the cache, [cache_batch,
 * seqlen_k, heads_kv, d] or pages [num_pages, page_size, heads_kv, d] (batch stride = page
 * stride), written when appending; o and lse are written when num_splits == 1; cu_seqlens are
 * NULL; seqlen_k is the cache capacity per sequence. */
struct fa_kv_params : fa_kernel_base {
    const void *k_new; /* [batch, seqlen_new, heads_kv, d] or NULL (no append)                  */
    const void *v_new; /* [batch, seqlen_new, heads_kv, dv]                                     */
    int seqlen_new;    /* appended tokens per sequence (1 .. seqlen_k); 0 without an append      */
    int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
    int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;

    const int32_t *cache_seqlens;   /* [batch] or NULL (= seqlen_k)                             */
    const int32_t *cache_batch_idx; /* [batch] or NULL (= b)                                    */
    const int32_t *cache_leftpad;   /* [batch] or NULL (= 0)                                    */
    const int32_t *block_table;     /* [batch, block_table_batch_stride] or NULL (contiguous)  */
    int64_t block_table_batch_stride;
    int page_size;    /* paged only                                                            */
    int num_pages;    /* paged only                                                            */
    int cache_batch;  /* contiguous only: rows of k / v                                        */

    const void *rotary_cos; /* [rotary_seqlen, rotary_dim / 2], dtype of q, or NULL             */
    const void *rotary_sin;
    int rotary_dim, rotary_seqlen, rotary_interleaved;
    int rotary_q_per_token; /* 1: query t at position L0 + t (causal / windowed), 0: all at L0     */

    int rows_packed;  /* group × seqlen_q: packed query rows of one (batch, kv head)            */
    int row_tiles;    /* ceil(rows_packed / FA_KV_BLOCK_M)                                     */
    int num_splits;   /* >= 1; > 1: partial states to o_partial / lse_partial                  */

    float *o_partial;   /* [num_splits, batch, heads_q, seqlen_q, dv] fp32 (num_splits > 1)     */
    float *lse_partial; /* [num_splits, batch, heads_q, seqlen_q] fp32, natural log            */
    /* [batch, heads_kv, row_tiles, num_splits] done flags of the fused merge (num_splits > 1):
     * any value on entry, 0 after the call; split_tag: this call's flag value (never 0), see
     * the kernel's step 6 */
    unsigned long long *split_flags;
    unsigned long long split_tag;

    /* Quantised cache (fa_kv_dtype; 0 = the cache is in dtype, the fields below are unused).
     * k / v strides then count bytes; kv_copy_bytes (16, 8 or 4) divides the cache's base
     * addresses, byte strides and row bytes: the width of the kernel's cp.async copies. The
     * appended rows are quantised into the cache by fa_kvq_append before the decode kernel runs,
     * which then reads every slot, appended ones included, from the cache. */
    int kv_quant;
    int kv_copy_bytes;
    const float *k_scale; /* FA_KV_INT8: per (slab, row, kv head), strides in floats; e4m3: [heads_kv] */
    const float *v_scale;
    int64_t k_scale_batch_stride, k_scale_row_stride, k_scale_head_stride;
    int64_t v_scale_batch_stride, v_scale_row_stride, v_scale_head_stride;

    /* Large heads (fa_kvl_launch_*; 0 elsewhere): 1 when v is the first head_dim_v columns of k
     * (a latent cache, fa_kv_latent_cache): the kernel reads each cache row once, as K, and
     * takes its first dv columns as V; an append writes k_new only (v_new is its first dv
     * columns). */
    int v_in_k;
};

extern "C" {
fa_status fa_kv_launch_hdim64(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                              cudaStream_t stream);
fa_status fa_kv_launch_hdim128(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                               cudaStream_t stream);
fa_status fa_kv_launch_hdim256(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                               cudaStream_t stream);
/* the decode kernel on a quantised cache (instances/kvcache_quant_sm80_hdim<bucket>.cu) */
fa_status fa_kvq_launch_hdim64(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                               cudaStream_t stream);
fa_status fa_kvq_launch_hdim128(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
fa_status fa_kvq_launch_hdim256(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
/* k_new / v_new quantised into a quantised cache, as the CPU's append does it bit for bit
 * (kvcache_quant.cu); prm->k_new != NULL */
fa_status fa_kvq_append(const fa_kv_params *prm, fa_dtype dtype, cudaStream_t stream);
/* The decode kernel for large heads, 256 < max(d, dv), d <= 576, dv <= 512 (kvcache_large_sm80.cuh;
 * instances/kvcache_large_sm80_<cache>.cu): a latent cache (prm->v_in_k = 1) or separate K and
 * V caches (0); row_tiles counts FA_KVL_BLOCK_M-row tiles. */
fa_status fa_kvl_launch_latent(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal, cudaStream_t stream);
fa_status fa_kvl_launch_separate(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal, cudaStream_t stream);
/* Its wgmma variant (kernels/kvcache_large_sm90.cu, sm_90a; fa_kvl_wgmma_ok): either cache kind
 * (prm->v_in_k). */
fa_status fa_kvl_launch_wgmma(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal, cudaStream_t stream);
/* The same kernel with a score bias (common/mods.cuh; instances/kvcache_sm80_mods_hdim<bucket>.cu). */
fa_status fa_kv_mods_launch_hdim64(const fa_kv_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                   int device_ordinal, cudaStream_t stream);
fa_status fa_kv_mods_launch_hdim128(const fa_kv_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                    int device_ordinal, cudaStream_t stream);
fa_status fa_kv_mods_launch_hdim256(const fa_kv_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                    int device_ordinal, cudaStream_t stream);
}

#endif /* FA_KVCACHE_LAUNCH_H */
