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

static const char *view_field(const fa_tensor_view *t) { return t->field ? t->field : t->name; }

fa_tensor_view fa_array_view(const char *field, int is_output, const void *ptr, int64_t count,
                             int64_t elem_bytes) {
    fa_tensor_view t;
    memset(&t, 0, sizeof t);
    t.name = field;
    t.field = field;
    t.is_output = is_output;
    t.extent[0] = t.extent[1] = t.extent[2] = 1;
    t.dim = count;
    t.ptr = ptr;
    t.elem_bytes = elem_bytes;
    return t;
}

/* Check one tensor's strides: non-negative; the largest offset fits in int64, in elements and in
 * bytes, and the span does not run past the end of the address space; the pointer is aligned to
 * its element; an output must not have two index tuples at the same address (checked by the
 * nesting rule: sorted by stride, each axis's stride covers the whole span of the axes below it). */
fa_status fa_check_tensor_view(fa_tensor_view *t) {
    static const char *const default_axis[3] = {"batch", "row", "head"};
    const char *const *axis = t->axis_names ? t->axis_names : default_axis;
    int64_t max_offset = t->dim - 1;
    int empty = t->dim <= 0;
    t->bytes = 0;
    for (int a = 0; a < 3; ++a) {
        if (t->stride[a] < 0)
            return fa_set_error(FA_ERR_STRIDE, "%s_%s_stride = %lld is negative", t->name, axis[a],
                                (long long)t->stride[a]);
        if (t->extent[a] <= 0) empty = 1;
        if (t->extent[a] > 1 &&
            !fa_mul_add_ok(t->extent[a] - 1, t->stride[a], max_offset, &max_offset))
            return fa_set_error(FA_ERR_OVERFLOW,
                                "%s: %s extent %lld times stride %lld overflows 64-bit offsets",
                                t->name, axis[a], (long long)t->extent[a], (long long)t->stride[a]);
    }
    if (empty || t->ptr == NULL) return FA_OK; /* no element is ever addressed */
    const int64_t elem = t->elem_bytes > 0 ? t->elem_bytes : 1;
    int64_t bytes;
    if (max_offset == INT64_MAX || !fa_mul_add_ok(max_offset + 1, elem, 0, &bytes))
        return fa_set_error(FA_ERR_OVERFLOW,
                            "%s: the last element lies %lld elements of %lld bytes past %s, which "
                            "overflows 64-bit byte offsets",
                            t->name, (long long)max_offset, (long long)elem, view_field(t));
    if ((uintptr_t)t->ptr > UINTPTR_MAX - (uint64_t)bytes)
        return fa_set_error(FA_ERR_OVERFLOW,
                            "%s: %lld bytes from %s = %p run past the end of the address space",
                            t->name, (long long)bytes, view_field(t), t->ptr);
    if ((uintptr_t)t->ptr % (uintptr_t)elem != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "%s = %p is not aligned to its %lld-byte elements",
                            view_field(t), t->ptr, (long long)elem);
    t->bytes = bytes;
    if (!t->is_output) return FA_OK;
    /* Sort the axes that have extent > 1 by stride, then apply the nesting rule. */
    int64_t span = t->dim; /* elements touched by one [.., dim] vector and below */
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
        /* no overflow: stride · (extent - 1) + span <= max_offset + 1 was checked above */
        span = t->stride[a] * (t->extent[a] - 1) + span;
    }
    return FA_OK;
}

/* Overlap of two strided views, exactly for the layouts that occur (separate buffers, and
 * tensors interleaved in one buffer such as q, k, v packed as [batch, seq, heads_q + 2·heads_kv,
 * dim] with padding). Element (i) of a starts at byte pa + Σ i_a·sa_a and covers wa = dim·elem
 * bytes, likewise for b; they share a byte iff x + Σ k_t·s_t lies in (-wb, wa) for x = pa - pb
 * and integers k_t in [lo_t, hi_t], one term per distinct byte stride (a's index minus b's where
 * the strides agree). A depth-first search over the terms, largest stride first, keeps only the
 * k that the smaller terms can still bring into range; it gives up (reports an overlap) when a
 * term leaves more than a few candidates or the search grows, so it never accepts an overlap. */
typedef struct overlap_term {
    __int128 stride, lo, hi;
} overlap_term;

enum { OVERLAP_MAX_CANDIDATES = 8, OVERLAP_MAX_NODES = 4096 };

static int overlap_search(const overlap_term *t, const __int128 *rest_lo, const __int128 *rest_hi, int n,
                          int i, __int128 x, __int128 wa, __int128 wb, int *nodes) {
    if (++*nodes > OVERLAP_MAX_NODES) return 1;
    if (i == n) return x > -wb && x < wa;
    /* k·s < wa - x - rest_lo[i + 1] and k·s > -wb - x - rest_hi[i + 1] */
    __int128 s = t[i].stride, up = wa - x - rest_lo[i + 1], down = -wb - x - rest_hi[i + 1];
    __int128 k_max = up > 0 ? (up - 1) / s : -((-up) / s) - 1;       /* largest k: k·s < up   */
    __int128 k_min = down >= 0 ? down / s + 1 : -((-down - 1) / s); /* smallest k: k·s > down */
    if (k_max > t[i].hi) k_max = t[i].hi;
    if (k_min < t[i].lo) k_min = t[i].lo;
    if (k_min > k_max) return 0;
    if (k_max - k_min >= OVERLAP_MAX_CANDIDATES) return 1;
    for (__int128 k = k_min; k <= k_max; ++k)
        if (overlap_search(t, rest_lo, rest_hi, n, i + 1, x + k * s, wa, wb, nodes)) return 1;
    return 0;
}

static int views_disjoint(const fa_tensor_view *a, const fa_tensor_view *b) {
    if (a->bytes == 0 || b->bytes == 0) return 1;
    uintptr_t a0 = (uintptr_t)a->ptr, b0 = (uintptr_t)b->ptr;
    if (a0 + (uintptr_t)a->bytes <= b0 || b0 + (uintptr_t)b->bytes <= a0) return 1;
    overlap_term t[6];
    int n = 0;
    const fa_tensor_view *both[2] = {a, b};
    for (int v = 0; v < 2; ++v)
        for (int axis = 0; axis < 3; ++axis) {
            const fa_tensor_view *view = both[v];
            if (view->extent[axis] <= 1 || view->stride[axis] == 0) continue;
            __int128 stride = (__int128)view->stride[axis] * view->elem_bytes;
            __int128 lo = v == 0 ? 0 : -(__int128)(view->extent[axis] - 1);
            __int128 hi = v == 0 ? (__int128)(view->extent[axis] - 1) : 0;
            int merged = 0;
            for (int j = 0; j < n && !merged; ++j)
                if (t[j].stride == stride) {
                    t[j].lo += lo;
                    t[j].hi += hi;
                    merged = 1;
                }
            if (!merged) t[n++] = (overlap_term){stride, lo, hi};
        }
    for (int i = 1; i < n; ++i) /* largest stride first */
        for (int j = i; j > 0 && t[j].stride > t[j - 1].stride; --j) {
            overlap_term tmp = t[j];
            t[j] = t[j - 1];
            t[j - 1] = tmp;
        }
    __int128 rest_lo[7], rest_hi[7];
    rest_lo[n] = rest_hi[n] = 0;
    for (int i = n - 1; i >= 0; --i) {
        rest_lo[i] = rest_lo[i + 1] + t[i].lo * t[i].stride;
        rest_hi[i] = rest_hi[i + 1] + t[i].hi * t[i].stride;
    }
    int nodes = 0;
    __int128 x = (__int128)a0 - (__int128)b0;
    return !overlap_search(t, rest_lo, rest_hi, n, 0, x, (__int128)a->dim * a->elem_bytes,
                           (__int128)b->dim * b->elem_bytes, &nodes);
}

fa_status fa_check_views(fa_tensor_view *views, int n) {
    for (int i = 0; i < n; ++i) {
        fa_status s = fa_check_tensor_view(&views[i]);
        if (s != FA_OK) return s;
    }
    for (int i = 0; i < n; ++i) {
        if (!views[i].is_output) continue;
        for (int j = 0; j < n; ++j) {
            if (j == i || (views[j].is_output && j < i)) continue; /* each output pair once */
            if (!views_disjoint(&views[i], &views[j]))
                return fa_set_error(FA_ERR_OVERLAP,
                                    "output %s overlaps %s %s: outputs must not share memory with "
                                    "any other tensor of the call",
                                    view_field(&views[i]), views[j].is_output ? "output" : "input",
                                    view_field(&views[j]));
        }
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
    if (p->dtype != FA_DTYPE_F32 && p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16 &&
        p->dtype != FA_DTYPE_FP8_E4M3)
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
    if (p->alibi_slopes == NULL) {
        p->alibi_batch_stride = 0; /* unused */
    } else {
        int64_t last;
        if (p->alibi_batch_stride < 0)
            return fa_set_error(FA_ERR_STRIDE, "alibi_batch_stride = %lld is negative",
                                (long long)p->alibi_batch_stride);
        if (p->alibi_batch_stride != 0 && p->alibi_batch_stride < p->heads_q)
            return fa_set_error(FA_ERR_STRIDE,
                                "alibi_batch_stride = %lld must be 0 (per head) or >= heads_q = %lld",
                                (long long)p->alibi_batch_stride, (long long)p->heads_q);
        if (!fa_mul_add_ok(p->batch - 1, p->alibi_batch_stride, p->heads_q, &last) ||
            last > INT64_MAX / 4)
            return fa_set_error(FA_ERR_OVERFLOW,
                                "alibi_batch_stride = %lld times batch - 1 = %lld overflows 64-bit "
                                "offsets of alibi_slopes",
                                (long long)p->alibi_batch_stride, (long long)(p->batch - 1));
    }
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
        pb->dropout_keep_scale = fa_dropout_keep_scale(pb->dropout_threshold);
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
    const int64_t elem = fa_dtype_bytes(p->dtype);
    fa_tensor_view pool[2] = {
        {.name = "k", .extent = {p->num_pages, p->page_size, p->heads_kv},
         .stride = {p->k_batch_stride, p->k_row_stride, p->k_head_stride}, .dim = p->head_dim, .ptr = p->k,
         .elem_bytes = elem},
        {.name = "v", .extent = {p->num_pages, p->page_size, p->heads_kv},
         .stride = {p->v_batch_stride, p->v_row_stride, p->v_head_stride}, .dim = p->head_dim_v, .ptr = p->v,
         .elem_bytes = elem},
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

/* ==== score modifications: bias, document ids, block-sparse mask ============================ */


fa_status fa_validate_score_mods(fa_problem *pb, const char *call, int backward, int kvcache) {
    const fa_params *p = &pb->p;
    pb->has_mods = 0;
    pb->has_block_mask = 0;
    pb->q_blocks = pb->kv_blocks = pb->block_bytes = 0;
    pb->elem_window_left = p->window_left;
    pb->elem_window_right = p->window_right;
    const int has_bias = p->bias != NULL, has_dbias = backward && p->dbias != NULL;
    const int has_blocks = p->kv_num_blocks != NULL, has_docs = p->doc_ids_q != NULL || p->doc_ids_k != NULL;
    if (!has_bias && !has_dbias && !has_blocks && !has_docs && p->partial_block_bits == NULL &&
        p->kv_indices == NULL && p->full_kv_num_blocks == NULL && p->full_kv_indices == NULL)
        return FA_OK;
    const char *field = has_bias ? "bias" : has_dbias ? "dbias" : has_blocks ? "kv_num_blocks"
                      : has_docs ? "doc_ids_q / doc_ids_k" : "a block-mask array";
    if (call != NULL && (has_bias || has_blocks || has_docs))
        return fa_set_error(FA_ERR_UNSUPPORTED, "%s is set: %s does not support score biases or masks beyond "
                            "causal / window (fa_forward and fa_backward do)", field, call);
    if (has_dbias && !has_bias)
        return fa_set_error(FA_ERR_NULL_POINTER, "dbias is set but bias is NULL: the bias gradient needs the bias");
    if (has_bias) {
        if (p->bias_dtype != FA_DTYPE_F32 && p->bias_dtype != FA_DTYPE_F16 && p->bias_dtype != FA_DTYPE_BF16)
            return fa_set_error(FA_ERR_DTYPE, "bias_dtype = %d is not a fa_dtype value", (int)p->bias_dtype);
        if (p->bias_col_stride != 0 && p->bias_col_stride != 1)
            return fa_set_error(FA_ERR_STRIDE,
                                "bias_col_stride = %lld: the key axis of bias must be contiguous (1) or "
                                "broadcast (0)", (long long)p->bias_col_stride);
    }
    if (has_dbias && p->dbias_dtype != FA_DTYPE_F32 && p->dbias_dtype != FA_DTYPE_F16 &&
        p->dbias_dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "dbias_dtype = %d: dbias is F32, F16 or BF16", (int)p->dbias_dtype);
    if (has_dbias && p->dbias_col_stride != 0 && p->dbias_col_stride != 1)
        return fa_set_error(FA_ERR_STRIDE,
                            "dbias_col_stride = %lld: the key axis of dbias must be contiguous (1) or summed "
                            "over (0)", (long long)p->dbias_col_stride);
    if ((p->doc_ids_q == NULL) != (p->doc_ids_k == NULL))
        return fa_set_error(FA_ERR_NULL_POINTER, "doc_ids_%s is set but doc_ids_%s is NULL: give both or neither",
                            p->doc_ids_q ? "q" : "k", p->doc_ids_q ? "k" : "q");
    if (has_docs && (p->doc_ids_q_batch_stride < 0 || p->doc_ids_k_batch_stride < 0))
        return fa_set_error(FA_ERR_STRIDE, "doc_ids_%s_batch_stride = %lld is negative",
                            p->doc_ids_q_batch_stride < 0 ? "q" : "k",
                            (long long)(p->doc_ids_q_batch_stride < 0 ? p->doc_ids_q_batch_stride
                                                                      : p->doc_ids_k_batch_stride));
    if (p->block_lists_checked != 0 && p->block_lists_checked != 1)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "block_lists_checked = %d: 0 (check the block lists) or 1 "
                            "(accepted by an earlier call)", p->block_lists_checked);
    if (!has_blocks && (p->kv_indices || p->full_kv_num_blocks || p->full_kv_indices || p->partial_block_bits))
        return fa_set_error(FA_ERR_NULL_POINTER,
                            "%s is set but kv_num_blocks is NULL: a block mask needs kv_num_blocks and kv_indices",
                            p->kv_indices ? "kv_indices" : p->full_kv_num_blocks ? "full_kv_num_blocks"
                            : p->full_kv_indices ? "full_kv_indices" : "partial_block_bits");
    if (has_blocks) {
        if (kvcache)
            return fa_set_error(FA_ERR_UNSUPPORTED, "kv_num_blocks is set: fa_kvcache_forward has no block-sparse "
                                "masks (fa_forward / fa_backward do)");
        FA_REQUIRE_PTR(p->kv_indices, "kv_indices");
        if ((p->full_kv_num_blocks == NULL) != (p->full_kv_indices == NULL))
            return fa_set_error(FA_ERR_NULL_POINTER, "%s is set but %s is NULL: give both or neither",
                                p->full_kv_num_blocks ? "full_kv_num_blocks" : "full_kv_indices",
                                p->full_kv_num_blocks ? "full_kv_indices" : "full_kv_num_blocks");
        FA_REQUIRE_RANGE(p->block_q, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "block_q");
        FA_REQUIRE_RANGE(p->block_k, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "block_k");
        pb->q_blocks = (p->seqlen_q + p->block_q - 1) / p->block_q;
        pb->kv_blocks = (p->seqlen_k + p->block_k - 1) / p->block_k;
        if (p->partial_block_bits) {
            int64_t bits;
            if (!fa_mul_add_ok(p->block_q, p->block_k, 7, &bits))
                return fa_set_error(FA_ERR_OVERFLOW, "block_q × block_k overflows");
            pb->block_bytes = bits / 8;
        }
        pb->has_block_mask = 1;
    }
    if (kvcache && has_docs)
        return fa_set_error(FA_ERR_UNSUPPORTED, "doc_ids_q is set: fa_kvcache_forward has no document masks");
    pb->has_mods = has_bias || has_blocks || has_docs;
    return FA_OK;
}

int fa_score_mod_views(const fa_problem *pb, int backward, fa_tensor_view *views) {
    const fa_params *p = &pb->p;
    static const char *const bias_axes[3] = {"batch", "head", "row"};
    static const char *const count_axes[3] = {"batch", "head", "unused"};
    static const char *const doc_axes[3] = {"batch", "unused", "unused"};
    const int64_t b = p->batch, hq = p->heads_q, sq = p->seqlen_q, sk = p->seqlen_k;
    int n = 0;
    if (p->bias) {
        fa_tensor_view t = {.name = "bias", .axis_names = bias_axes, .extent = {b, hq, sq},
                            .stride = {p->bias_batch_stride, p->bias_head_stride, p->bias_row_stride},
                            .dim = p->bias_col_stride == 0 ? 1 : sk, .ptr = p->bias,
                            .elem_bytes = fa_dtype_bytes(p->bias_dtype)};
        views[n++] = t;
    }
    if (backward && p->dbias) {
        /* a summed axis (stride 0) is one element wide in memory */
        fa_tensor_view t = {.name = "dbias", .axis_names = bias_axes, .is_output = 1,
                            .extent = {p->dbias_batch_stride ? b : 1, p->dbias_head_stride ? hq : 1,
                                       p->dbias_row_stride ? sq : 1},
                            .stride = {p->dbias_batch_stride, p->dbias_head_stride, p->dbias_row_stride},
                            .dim = p->dbias_col_stride == 0 ? 1 : sk, .ptr = p->dbias,
                            .elem_bytes = fa_dtype_bytes(p->dbias_dtype)};
        views[n++] = t;
    }
    if (pb->has_block_mask) {
        const int64_t qb = pb->q_blocks, kb = pb->kv_blocks;
        fa_tensor_view counts = {.name = "block_count", .axis_names = count_axes, .field = "kv_num_blocks",
                                 .extent = {b, hq, 1},
                                 .stride = {p->block_count_batch_stride, p->block_count_head_stride, 0},
                                 .dim = qb, .ptr = p->kv_num_blocks, .elem_bytes = 4};
        fa_tensor_view index = {.name = "block_index", .field = "kv_indices", .axis_names = bias_axes,
                                .extent = {b, hq, qb},
                                .stride = {p->block_index_batch_stride, p->block_index_head_stride,
                                           p->block_index_row_stride},
                                .dim = kb, .ptr = p->kv_indices, .elem_bytes = 4};
        views[n++] = counts;
        views[n++] = index;
        if (p->full_kv_num_blocks) {
            counts.field = "full_kv_num_blocks";
            counts.ptr = p->full_kv_num_blocks;
            index.field = "full_kv_indices";
            index.ptr = p->full_kv_indices;
            views[n++] = counts;
            views[n++] = index;
        }
        if (p->partial_block_bits) {
            fa_tensor_view bits = index;
            bits.field = "partial_block_bits";
            bits.ptr = p->partial_block_bits;
            bits.elem_bytes = 1;
            int ok = 1;
            for (int a = 0; a < 3; a++) ok &= fa_mul_add_ok(bits.stride[a], pb->block_bytes, 0, &bits.stride[a]);
            ok &= fa_mul_add_ok(bits.dim, pb->block_bytes, 0, &bits.dim);
            if (!ok) bits.stride[0] = INT64_MAX; /* reported as an overflow by the view check */
            views[n++] = bits;
        }
    }
    if (p->doc_ids_q) {
        const int varlen = p->cu_seqlens_q != NULL;
        fa_tensor_view dq = {.name = "doc_ids_q", .axis_names = doc_axes, .extent = {varlen ? 1 : b, 1, 1},
                             .stride = {varlen ? 0 : p->doc_ids_q_batch_stride, 0, 0},
                             .dim = varlen ? p->total_q : sq, .ptr = p->doc_ids_q, .elem_bytes = 4};
        fa_tensor_view dk = {.name = "doc_ids_k", .axis_names = doc_axes, .extent = {varlen ? 1 : b, 1, 1},
                             .stride = {varlen ? 0 : p->doc_ids_k_batch_stride, 0, 0},
                             .dim = varlen ? p->total_k : sk, .ptr = p->doc_ids_k, .elem_bytes = 4};
        views[n++] = dq;
        views[n++] = dk;
    }
    return n;
}

/* One list of block indices: count in [0, kv_blocks], entries strictly increasing in range. */
static fa_status check_block_list(const char *count_name, const char *index_name, int32_t count,
                                  const int32_t *list, int64_t kv_blocks, int64_t b, int64_t h, int64_t qb) {
    if (count < 0 || count > kv_blocks)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "%s[%lld][%lld][%lld] = %d is out of range [0, kv_blocks = %lld]",
                            count_name, (long long)b, (long long)h, (long long)qb, count, (long long)kv_blocks);
    for (int32_t n = 0; n < count; n++) {
        if (list[n] < 0 || list[n] >= kv_blocks)
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "%s[%lld][%lld][%lld][%d] = %d is out of range [0, kv_blocks = %lld)", index_name,
                                (long long)b, (long long)h, (long long)qb, n, list[n], (long long)kv_blocks);
        if (n > 0 && list[n] <= list[n - 1])
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "%s[%lld][%lld][%lld]: entries %d and %d are %d and %d; the list must be strictly "
                                "increasing (sorted, no duplicates)", index_name, (long long)b, (long long)h,
                                (long long)qb, n - 1, n, list[n - 1], list[n]);
    }
    return FA_OK;
}

fa_status fa_check_block_row(const fa_problem *pb, int64_t b, int64_t h, int64_t qb, int32_t n_part,
                             const int32_t *part, int32_t n_full, const int32_t *full) {
    fa_status s = check_block_list("kv_num_blocks", "kv_indices", n_part, part, pb->kv_blocks, b, h, qb);
    if (s != FA_OK || full == NULL) return s;
    s = check_block_list("full_kv_num_blocks", "full_kv_indices", n_full, full, pb->kv_blocks, b, h, qb);
    if (s != FA_OK) return s;
    for (int32_t x = 0, y = 0; x < n_part && y < n_full;) { /* merge of two sorted lists */
        if (part[x] == full[y])
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "key block %d is listed both in kv_indices[%lld][%lld][%lld] (partial) "
                                "and in full_kv_indices[%lld][%lld][%lld] (full)",
                                part[x], (long long)b, (long long)h, (long long)qb, (long long)b,
                                (long long)h, (long long)qb);
        if (part[x] < full[y]) x++;
        else y++;
    }
    return FA_OK;
}

void fa_score_mods_move_window(fa_problem *pb) {
    fa_params *p = &pb->p;
    pb->elem_window_left = p->window_left;
    pb->elem_window_right = p->window_right;
    if (!pb->has_block_mask) return;
    /* causal / window hold inside partial blocks only: the engines' range logic sees none */
    p->window_left = p->window_right = -1;
    pb->has_mask = 0;
}

fa_status fa_check_score_mod_contents(fa_problem *pb) {
    fa_params *p = &pb->p;
    if (!pb->has_block_mask) return FA_OK;
    /* broadcast axes (stride 0) hold one list set */
    const int64_t nb = p->block_count_batch_stride == 0 && p->block_index_batch_stride == 0 ? 1 : p->batch;
    const int64_t nh = p->block_count_head_stride == 0 && p->block_index_head_stride == 0 ? 1 : p->heads_q;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t qb = 0; qb < pb->q_blocks; qb++) {
                const int64_t c_off = b * p->block_count_batch_stride + h * p->block_count_head_stride + qb;
                const int64_t i_off = b * p->block_index_batch_stride + h * p->block_index_head_stride +
                                      qb * p->block_index_row_stride;
                const fa_status s = fa_check_block_row(
                    pb, b, h, qb, p->kv_num_blocks[c_off], p->kv_indices + i_off,
                    p->full_kv_num_blocks ? p->full_kv_num_blocks[c_off] : 0,
                    p->full_kv_indices ? p->full_kv_indices + i_off : NULL);
                if (s != FA_OK) return s;
            }
    fa_score_mods_move_window(pb);
    return FA_OK;
}
