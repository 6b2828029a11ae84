/*
 * fa_kvquant.c: validation of the quantised-cache fields of fa_kvcache_forward (kv_dtype,
 * k_scale / v_scale and their strides), called by fa_kvcache.c after the cache geometry and
 * before the other strides are checked. The CUDA path's own limits (alignment, Q8_0 head dims)
 * are checked by src/cuda/kvcache.cu.
 */
#include <math.h>

#include "api/fa_internal.h"

static const char *kv_dtype_name(fa_kv_dtype t) {
    switch (t) {
    case FA_KV_INT8: return "FA_KV_INT8";
    case FA_KV_Q8_0: return "FA_KV_Q8_0";
    case FA_KV_FP8_E4M3: return "FA_KV_FP8_E4M3";
    default: return "FA_KV_SAME";
    }
}

static fa_tensor_view view3(const char *name, int is_output, const void *ptr, int64_t elem_bytes, int64_t n0,
                            int64_t n1, int64_t n2, int64_t dim, int64_t s0, int64_t s1, int64_t s2) {
    fa_tensor_view t = {.name = name, .is_output = is_output, .extent = {n0, n1, n2}, .stride = {s0, s1, s2},
                        .dim = dim, .ptr = ptr, .elem_bytes = elem_bytes};
    return t;
}

fa_status fa_validate_kv_quant(const fa_params *p) {
    if (p->kv_dtype == FA_KV_SAME) {
        if (p->k_scale != NULL || p->v_scale != NULL)
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "k_scale / v_scale are set but kv_dtype = FA_KV_SAME (scales belong to a "
                                "quantised cache: set kv_dtype, or leave them NULL)");
        return FA_OK;
    }
    if ((int)p->kv_dtype < FA_KV_INT8 || (int)p->kv_dtype > FA_KV_FP8_E4M3)
        return fa_set_error(FA_ERR_DTYPE, "kv_dtype = %d is not a fa_kv_dtype value", (int)p->kv_dtype);
    const char *name = kv_dtype_name(p->kv_dtype);
    if (p->rotary_cos != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "rotary_cos / rotary_sin are set with kv_dtype = %s: rotary embedding is not "
                            "supported with a quantised cache (rotate q and k_new before the call)",
                            name);
    const int64_t block = p->kv_dtype == FA_KV_Q8_0 ? 32 : 8;
    if (p->head_dim % block != 0 || p->head_dim_v % block != 0)
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld and head_dim_v = %lld must be multiples of %lld for kv_dtype = %s",
                            (long long)p->head_dim, (long long)p->head_dim_v, (long long)block, name);
    const int paged = p->block_table != NULL, append = p->k_new != NULL;
    const int64_t slabs = paged ? p->num_pages : p->cache_batch, slab_rows = paged ? p->page_size : p->seqlen_k;
    if (p->kv_dtype == FA_KV_Q8_0) {
        if (p->k_scale != NULL || p->v_scale != NULL)
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "k_scale / v_scale are set with kv_dtype = FA_KV_Q8_0, whose scales live in "
                                "the 34-byte blocks: leave them NULL");
        /* rows are head_dim / 32 blocks of 34 bytes: strides (bytes) must cover them */
        fa_tensor_view v[2] = {
            view3("k", append, p->k, 1, slabs, slab_rows, p->heads_kv, p->head_dim / 32 * 34, p->k_batch_stride,
                  p->k_row_stride, p->k_head_stride),
            view3("v", append, p->v, 1, slabs, slab_rows, p->heads_kv, p->head_dim_v / 32 * 34, p->v_batch_stride,
                  p->v_row_stride, p->v_head_stride)};
        for (int i = 0; i < 2; i++) {
            fa_status s = fa_check_tensor_view(&v[i]);
            if (s != FA_OK) return s;
        }
        return FA_OK;
    }
    fa_tensor_view data[2] = {
        view3("k", append, p->k, 1, slabs, slab_rows, p->heads_kv, p->head_dim, p->k_batch_stride, p->k_row_stride,
              p->k_head_stride),
        view3("v", append, p->v, 1, slabs, slab_rows, p->heads_kv, p->head_dim_v, p->v_batch_stride,
              p->v_row_stride, p->v_head_stride)};
    for (int i = 0; i < 2; i++) {
        fa_status s = fa_check_tensor_view(&data[i]);
        if (s != FA_OK) return s;
    }
    FA_REQUIRE_PTR(p->k_scale, p->kv_dtype == FA_KV_INT8 ? "k_scale (kv_dtype = FA_KV_INT8: one scale per token and kv head)"
                                                          : "k_scale (kv_dtype = FA_KV_FP8_E4M3: one scale per kv head)");
    FA_REQUIRE_PTR(p->v_scale, p->kv_dtype == FA_KV_INT8 ? "v_scale (kv_dtype = FA_KV_INT8: one scale per token and kv head)"
                                                          : "v_scale (kv_dtype = FA_KV_FP8_E4M3: one scale per kv head)");
    if (p->kv_dtype == FA_KV_INT8) {
        fa_tensor_view v[2] = {view3("k_scale", append, p->k_scale, 4, slabs, slab_rows, p->heads_kv, 1, p->k_scale_batch_stride,
                                     p->k_scale_row_stride, p->k_scale_head_stride),
                               view3("v_scale", append, p->v_scale, 4, slabs, slab_rows, p->heads_kv, 1, p->v_scale_batch_stride,
                                     p->v_scale_row_stride, p->v_scale_head_stride)};
        for (int i = 0; i < 2; i++) {
            fa_status s = fa_check_tensor_view(&v[i]);
            if (s != FA_OK) return s;
        }
        return FA_OK;
    }
    /* FP8: the per-head scales divide on append. On the CPU they are checked here; on CUDA they
     * are device memory, never read by the host (non-positive or non-finite scales give
     * infinite or NaN cache values there). */
    if (p->device != FA_DEVICE_CPU) return FA_OK;
    for (int64_t h = 0; h < p->heads_kv; h++) {
        if (!(p->k_scale[h] > 0.0f) || isinf(p->k_scale[h]))
            return fa_set_error(FA_ERR_INVALID_ARGUMENT, "k_scale[%lld] = %g must be positive and finite",
                                (long long)h, (double)p->k_scale[h]);
        if (!(p->v_scale[h] > 0.0f) || isinf(p->v_scale[h]))
            return fa_set_error(FA_ERR_INVALID_ARGUMENT, "v_scale[%lld] = %g must be positive and finite",
                                (long long)h, (double)p->v_scale[h]);
    }
    return FA_OK;
}
