/*
 * gather_launch.h: copies the CUDA paths make into their workspace (gather.cu).
 *
 *   fa_cuda_copy16            a strided [n0, n1, n2, cols] 16-bit tensor into another layout,
 *                             columns past the source's zero-filled: the head-dim padding of the
 *                             KV-cache path (head dims that are not multiples of 8)
 *   fa_cuda_copy_appended     the appended rows of a padded cache copy back into the caller's
 *                             cache, at its own head dims and strides
 *   fa_cuda_*_paged           fa_forward with a paged K/V: the pages gathered into a packed copy,
 *                             then the ordinary forward on it
 * All run on the call's stream, element by element (any stride, any alignment of 2 bytes).
 */
#ifndef FA_GATHER_LAUNCH_H
#define FA_GATHER_LAUNCH_H

#include <cuda_runtime.h>

#include "cuda/common/cuda_common.cuh"

/* dst[i0, i1, i2, c] = c < src_cols ? src[i0, i1, i2, c] : 0 for c < dst_cols. Strides in
 * elements. */
struct fa_copy16_args {
    const void *src;
    int64_t src_stride[3];
    int src_cols;
    void *dst;
    int64_t dst_stride[3];
    int dst_cols;
    int64_t extent[3];
};
fa_status fa_cuda_copy16(const fa_copy16_args *a, cudaStream_t stream, const char *what);

/* The slots a KV-cache append wrote, from the padded cache copy (k_pad, v_pad: dense, the
 * caller's cache geometry, head dims d_pad / dv_pad) into the caller's cache (k, v, their
 * strides, head dims d / dv). The slot of appended token t of sequence b is clamped exactly as
 * the decode kernel clamps it (kvcache_sm80.cuh, step 1), so the copy takes what the kernel
 * wrote. */
struct fa_kv_copy_back_args {
    const void *k_pad, *v_pad;
    int d_pad, dv_pad;
    void *k, *v;
    int d, dv;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    const int32_t *cache_seqlens, *cache_batch_idx, *block_table;
    int64_t block_table_batch_stride;
    int batch, heads_kv, seqlen_new, capacity, page_size, num_pages, cache_batch;
};
fa_status fa_cuda_copy_appended(const fa_kv_copy_back_args *a, cudaStream_t stream);

/* fa_forward with block_table: the limits of the gather (FA_OK or an error naming the field),
 * the workspace of the packed copy (batch · seqlen_k keys), and the call. */
fa_status fa_cuda_check_paged(const fa_problem *pb);
size_t fa_cuda_paged_workspace(const fa_problem *pb);
fa_status fa_cuda_forward_paged(const fa_problem *pb);

#endif /* FA_GATHER_LAUNCH_H */
