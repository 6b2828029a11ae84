/*
 * fa_validate.c: validation steps shared by the entry points of fa_api.c (fa_forward,
 * fa_backward, ...) and fa_kvcache.c (fa_kvcache_forward, fa_merge_states): the scalar fields
 * every attention call has, the stride / overflow / overlap check of one strided tensor, and the
 * check of a caller's workspace against the engine's need.
 * Nothing here writes anything but the fa_problem being built and the thread's error message.
 */
#include <math.h>
#include <string.h>

#include "api/fa_internal.h"
#include "api/fa_philox.h"

int fa_mul_add_ok(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t m;
    if (__builtin_mul_overflow(a, b, &m)) return 0;
    if (__builtin_add_overflow(m, c, out)) return 0;
    return 1;
}

/* Check one tensor's strides: non-negative; the largest offset fits in int64; an output must
 * not have two index tuples at the same address (checked by the nesting rule: sorted by stride,
 * each axis's stride covers the whole span of the axes below it). */
fa_status fa_check_tensor_view(const fa_tensor_view *t) {
    static const char *const default_axis[3] = {"batch", "row", "head"};
    const char *const *axis = t->axis_names ? t->axis_names : default_axis;
    int64_t span = t->dim; /* elements touched by one [.., dim] vector and below */
    int64_t max_offset = t->dim - 1;
    for (int a = 0; a < 3; ++a) {
        if (t->stride[a] < 0)
            return fa_set_error(FA_ERR_STRIDE, "%s_%s_stride = %lld is negative", t->name, axis[a],
                                (long long)t->stride[a]);
        if (t->extent[a] > 1 &&
            !fa_mul_add_ok(t->extent[a] - 1, t->stride[a], max_offset, &max_offset))
            return fa_set_error(FA_ERR_OVERFLOW,
                                "%s: %s extent %lld times stride %lld overflows 64-bit offsets",
                                t->name, axis[a], (long long)t->extent[a], (long long)t->stride[a]);
    }
    if (!t->is_output) return FA_OK;
    for (int a = 0; a < 3; ++a)
        if (t->extent[a] == 0) return FA_OK; /* an empty tensor has no elements to overlap */
    /* Sort the axes that have extent > 1 by stride, then apply the nesting rule. */
    int order[3], n = 0;
    for (int a = 0; a < 3; ++a)
        if (t->extent[a] > 1) order[n++] = a;
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; --j) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    for (int i = 0; i < n; ++i) {
        int a = order[i];
        if (t->stride[a] < span)
            return fa_set_error(FA_ERR_STRIDE,
                                "output %s: %s_%s_stride = %lld makes elements overlap (needs >= "
                                "%lld to clear the axes below it)",
                                t->name, t->name, axis[a], (long long)t->stride[a], (long long)span);
        span = t->stride[a] * t->extent[a];
    }
    return FA_OK;
}

fa_status fa_check_workspace_size(const fa_params *p, size_t needed) {
    if (p->workspace != NULL && p->workspace_bytes < needed)
        return fa_set_error(FA_ERR_WORKSPACE,
                            "workspace_bytes = %zu is smaller than the %zu bytes this call needs "
                            "(pass NULL to let the library allocate)",
                            p->workspace_bytes, needed);
    return FA_OK;
}

fa_status fa_validate_common(fa_problem *pb) {
    fa_params *p = &pb->p;

    /* 1. device, dtype, threads */
    if (p->device != FA_DEVICE_CPU && p->device != FA_DEVICE_CUDA)
        return fa_set_error(FA_ERR_DEVICE, "device = %d is not a fa_device value", (int)p->device);
    if (p->device == FA_DEVICE_CUDA && !fa_cuda_built())
        return fa_set_error(FA_ERR_DEVICE,
                            "device = FA_DEVICE_CUDA but this libflashattn was built without CUDA");
    if (p->device == FA_DEVICE_CUDA && !fa_cuda_is_available())
        return fa_set_error(FA_ERR_DEVICE, "device = FA_DEVICE_CUDA but no usable CUDA GPU is present");
    if (p->dtype != FA_DTYPE_F32 && p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "dtype = %d is not a fa_dtype value", (int)p->dtype);
    if (p->device == FA_DEVICE_CUDA && p->dtype == FA_DTYPE_F32)
        return fa_set_error(FA_ERR_DTYPE,
                            "dtype = f32 is not supported on CUDA (use f16 or bf16; f32 runs on the CPU)");
    if (p->num_threads < 0)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "num_threads = %d is negative (0 = all cores)",
                            p->num_threads);

    /* 2. sizes */
    FA_REQUIRE_RANGE(p->batch, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "batch");
    FA_REQUIRE_RANGE(p->seqlen_q, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "seqlen_q");
    FA_REQUIRE_RANGE(p->seqlen_k, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "seqlen_k");
    FA_REQUIRE_RANGE(p->heads_q, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "heads_q");
    FA_REQUIRE_RANGE(p->heads_kv, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "heads_kv");
    FA_REQUIRE_RANGE(p->head_dim, 1, FA_MAX_HEAD_DIM, FA_ERR_HEAD_DIM, "head_dim");
    if (p->head_dim_v == 0) p->head_dim_v = p->head_dim;
    FA_REQUIRE_RANGE(p->head_dim_v, 1, FA_MAX_HEAD_DIM, FA_ERR_HEAD_DIM, "head_dim_v");
    if (p->heads_q % p->heads_kv != 0)
        return fa_set_error(FA_ERR_HEADS, "heads_q = %lld is not a multiple of heads_kv = %lld",
                            (long long)p->heads_q, (long long)p->heads_kv);
    pb->group = p->heads_q / p->heads_kv;

    /* 3. scalars */
    if (!isfinite(p->softmax_scale))
        return fa_set_error(FA_ERR_SCALE, "softmax_scale = %g is not finite", (double)p->softmax_scale);
    if (p->softmax_scale == 0.0f) p->softmax_scale = (float)(1.0 / sqrt((double)p->head_dim));
    pb->scale_log2 = p->softmax_scale * 1.4426950408889634f;
    if (!isfinite(p->softcap) || p->softcap < 0.0f)
        return fa_set_error(FA_ERR_SOFTCAP, "softcap = %g must be finite and >= 0 (0 = off)",
                            (double)p->softcap);
    if (p->alibi_slopes != NULL && p->alibi_batch_stride != 0 && p->alibi_batch_stride < p->heads_q)
        return fa_set_error(FA_ERR_STRIDE,
                            "alibi_batch_stride = %lld must be 0 (per head) or >= heads_q = %lld",
                            (long long)p->alibi_batch_stride, (long long)p->heads_q);
    if (p->alibi_batch_stride < 0)
        return fa_set_error(FA_ERR_STRIDE, "alibi_batch_stride = %lld is negative",
                            (long long)p->alibi_batch_stride);
    if (!p->use_window) {
        p->window_left = -1;
        p->window_right = -1;
    }
    if (p->window_left < 0) p->window_left = -1;
    if (p->window_right < 0) p->window_right = -1;
    if (p->causal && (p->window_right < 0 || p->window_right > 0)) p->window_right = 0;
    pb->has_mask = p->window_left >= 0 || p->window_right >= 0;
    return FA_OK;
}

fa_status fa_validate_dropout(fa_problem *pb, const char *call) {
    const fa_params *p = &pb->p;
    pb->has_dropout = 0;
    pb->dropout_threshold = 0;
    pb->dropout_keep_scale = 1.0f;
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f)) /* NaN fails too */
        return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                            "dropout_p = %g must be in [0, 1) (the probability of dropping an "
                            "attention weight; 0 = no dropout)",
                            (double)p->dropout_p);
    if (call != NULL && p->dropout_p > 0.0f)
        return fa_set_error(FA_ERR_UNSUPPORTED, "dropout_p = %g: %s has no attention dropout (set 0)",
                            (double)p->dropout_p, call);
    if (call != NULL && p->attn_probs != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED, "attn_probs is set: %s does not return the "
                            "probabilities (fa_forward does, on the CPU)", call);
    if (p->dropout_p > 0.0f) {
        int64_t rows;
        if (!fa_mul_add_ok(p->batch, p->heads_q, 0, &rows) || rows > ((int64_t)1 << 32))
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "dropout_p > 0 with batch × heads_q = %lld × %lld > 2^32: the dropout "
                                "counter holds b·heads_q + h in 32 bits",
                                (long long)p->batch, (long long)p->heads_q);
        pb->has_dropout = 1;
        pb->dropout_threshold = fa_dropout_threshold(p->dropout_p);
        pb->dropout_keep_scale = 1.0f / (1.0f - p->dropout_p);
    }
    if (p->attn_probs != NULL) {
        int64_t n;
        if (!fa_mul_add_ok(p->batch * p->heads_q, p->seqlen_q, 0, &n) || !fa_mul_add_ok(n, p->seqlen_k, 0, &n) ||
            n > INT64_MAX / 4)
            return fa_set_error(FA_ERR_OVERFLOW, "attn_probs: batch × heads_q × seqlen_q × seqlen_k overflows");
    }
    return FA_OK;
}

fa_status fa_validate_paged_kv(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    if (p->page_size < 1 || p->page_size > FA_MAX_EXTENT)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "page_size = %lld: a paged K/V (block_table set) needs pages of at least 1 "
                            "token",
                            (long long)p->page_size);
    FA_REQUIRE_RANGE(p->num_pages, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "num_pages");
    const int64_t pages_per_sequence = (p->seqlen_k + p->page_size - 1) / p->page_size;
    if (p->block_table_batch_stride < pages_per_sequence)
        return fa_set_error(FA_ERR_STRIDE,
                            "block_table_batch_stride = %lld is less than the pages per sequence "
                            "ceil(seqlen_k / page_size) = %lld",
                            (long long)p->block_table_batch_stride, (long long)pages_per_sequence);
    int64_t table_elements;
    if (!fa_mul_add_ok(p->batch, p->block_table_batch_stride, 0, &table_elements))
        return fa_set_error(FA_ERR_OVERFLOW, "batch × block_table_batch_stride overflows");
    fa_tensor_view pool[2] = {
        {"k", NULL, 0, {p->num_pages, p->page_size, p->heads_kv}, {p->k_batch_stride, p->k_row_stride, p->k_head_stride}, p->head_dim},
        {"v", NULL, 0, {p->num_pages, p->page_size, p->heads_kv}, {p->v_batch_stride, p->v_row_stride, p->v_head_stride}, p->head_dim_v},
    };
    for (int t = 0; t < 2; ++t) {
        fa_status s = fa_check_tensor_view(&pool[t]);
        if (s != FA_OK) return s;
    }
    if (p->device != FA_DEVICE_CPU) return FA_OK; /* device memory: not read by the host */
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t len_k = pb->varlen ? (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->seqlen_k;
        for (int64_t page = 0; page * p->page_size < len_k; ++page) {
            const int64_t id = p->block_table[b * p->block_table_batch_stride + page];
            if (id < 0 || id >= p->num_pages)
                return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                    "block_table[%lld][%lld] = %lld is out of range [0, num_pages = %lld)",
                                    (long long)b, (long long)page, (long long)id, (long long)p->num_pages);
        }
    }
    return FA_OK;
}
