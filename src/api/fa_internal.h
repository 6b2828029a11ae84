/*
 * fa_internal.h: what every engine (CPU, CUDA) sees after the API layer has validated a call.
 *
 * fa_api.c turns the caller's fa_params into an fa_problem: a validated copy with every default
 * resolved (head_dim_v, softmax_scale, window folded with causal) plus derived sizes. Engines
 * receive only fa_problem and may assume everything documented here holds.
 *
 * This header is C11 and also compiles as CUDA C++ (the mask functions are host+device).
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

/* Bytes per element of q, k, v (and of the backward's tensors) stored in `dtype`. */
static inline int64_t fa_dtype_bytes(fa_dtype dtype) {
    return dtype == FA_DTYPE_F32 ? 4 : dtype == FA_DTYPE_FP8_E4M3 ? 1 : 2;
}

/* The element type of o: bfloat16 for fp8 inputs (as FlashAttention-3), else the inputs' own. */
static inline fa_dtype fa_out_dtype(fa_dtype dtype) {
    return dtype == FA_DTYPE_FP8_E4M3 ? FA_DTYPE_BF16 : dtype;
}

#ifdef __CUDACC__
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa_problem {
    /* The caller's params after validation, with:
     *   head_dim_v    != 0 (defaulted to head_dim)
     *   softmax_scale != 0 (defaulted to 1/sqrt(head_dim))
     *   window_left / window_right: the effective window with causal folded in; -1 = unbounded.
     *     (use_window = 0 sets both to -1 first; causal then sets window_right = min(right, 0).)
     *   varlen: total_q / total_k as given; non-varlen: total_q = batch*seqlen_q, same for k. */
    fa_params p;
    int varlen;          /* cu_seqlens given                                                   */
    int has_mask;        /* window_left >= 0 or window_right >= 0                              */
    int64_t group;       /* heads_q / heads_kv: query heads sharing one kv head                 */
    float scale_log2;    /* softmax_scale · log2(e): scores in base-2 units with one FMA        */
    /* dropout (p.dropout_p > 0): drop iff the element's 8-bit Philox number < dropout_threshold
     * (round(p · 256)), kept elements scaled by dropout_keep_scale = 256 / (256 - threshold)
     * (src/api/fa_philox.h) */
    int has_dropout;
    uint32_t dropout_threshold;
    float dropout_keep_scale;
    /* score modifications (p.bias, p.doc_ids_*, the block mask; fa_validate_score_mods):
     * has_mods: any of them, the engine runs its tile function (src/cpu/cpu_mods.c) on every score
     * tile. With a block mask the element window moves to elem_window_left / right and
     * p.window_left / right become -1 (the engines' range logic then sees no window: causal and
     * window hold inside partial blocks only); without one elem_window_* equal p.window_*. */
    int has_mods;
    int has_block_mask;
    int64_t q_blocks, kv_blocks;   /* block mask: ceil(seqlen_q / block_q), ceil(seqlen_k / block_k) */
    int64_t block_bytes;           /* partial_block_bits bytes per block: ceil(block_q·block_k / 8)  */
    int64_t elem_window_left, elem_window_right;
} fa_problem;

/* Record a detailed message for the calling thread and return `status` (printf-style). */
fa_status fa_set_error(fa_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* 1 when v is the first head_dim_v columns of k (an MLA latent cache; src/api/fa_kvcache.c). */
int fa_kv_latent_cache(const fa_params *p);

/* ---- validation steps shared by fa_api.c and fa_kvcache.c (src/api/fa_validate.c) --------------- */

/* Sizes are kept below 2^31 so every engine may index rows and heads with 32-bit integers and
 * varlen offsets fit the int32 cu_seqlens. */
#define FA_MAX_EXTENT ((int64_t)INT32_MAX)

#define FA_REQUIRE_PTR(ptr, field)                                                                \
    do {                                                                                          \
        if ((ptr) == NULL) return fa_set_error(FA_ERR_NULL_POINTER, "%s is NULL", field);         \
    } while (0)

#define FA_REQUIRE_RANGE(value, lo, hi, status, field)                                            \
    do {                                                                                          \
        if ((value) < (lo) || (value) > (hi))                                                     \
            return fa_set_error(status, "%s = %lld is out of range [%lld, %lld]", field,          \
                                (long long)(value), (long long)(lo), (long long)(hi));            \
    } while (0)

/* a*b + c without overflow into *out; 0 on overflow. All operands non-negative. */
int fa_mul_add_ok(int64_t a, int64_t b, int64_t c, int64_t *out);

/* One tensor (or array) as the validator sees it: three strided axes of known extent over a
 * contiguous last dimension. A varlen tensor has no batch axis (extent 1) and `rows` packed
 * rows; a plain array is extents {1, 1, 1} and dim = its length. */
typedef struct fa_tensor_view {
    const char *name;               /* field prefix in messages: "<name>_<axis>_stride"        */
    const char *const *axis_names;  /* names of the three axes; NULL = batch, row, head        */
    const char *field;              /* pointer field in messages (NULL: name)                  */
    int is_output;
    int64_t extent[3];
    int64_t stride[3];
    int64_t dim;        /* contiguous last dimension                                           */
    const void *ptr;    /* first element (NULL: absent, never checked)                         */
    int64_t elem_bytes; /* bytes per element: 1, 2 or 4 (also the alignment required of ptr)    */
    int64_t bytes;      /* set by fa_check_tensor_view: bytes from ptr to past the last element */
} fa_tensor_view;

/* Strides non-negative, largest offset within int64 in elements and in bytes, the byte span
 * within the address space, ptr aligned to elem_bytes, and (outputs) no two elements at one
 * address. Sets t->bytes. Returns FA_OK or sets the error. */
fa_status fa_check_tensor_view(fa_tensor_view *t);

/* fa_check_tensor_view on views[0 .. n), then: no output shares a byte with any other view
 * (FA_ERR_OVERLAP naming both fields). Interleaved tensors of one buffer, e.g. q, k, v (or
 * dq, dk, dv) packed as [batch, seq, 3, heads, dim], are recognised as disjoint. */
fa_status fa_check_views(fa_tensor_view *views, int n);

/* A plain array of `count` elements of `elem_bytes` at ptr (1-D view). */
fa_tensor_view fa_array_view(const char *field, int is_output, const void *ptr, int64_t count,
                             int64_t elem_bytes);

/* Steps every attention call shares, on pb->p in place (pb->p already holds the caller's copy):
 * device / dtype / num_threads, sizes and heads (head_dim_v defaulted, group set), scalars
 * (softmax_scale defaulted, scale_log2, softcap, ALiBi stride) and the window folded with causal
 * (has_mask set). */
fa_status fa_validate_common(fa_problem *pb);

/* dropout_p, dropout_seed / offset and attn_probs for fa_forward / fa_backward (sets
 * has_dropout, dropout_threshold, dropout_keep_scale), and their rejection where a call has no
 * dropout (`call`, e.g. "fa_kvcache_forward", names it; NULL: the call supports them). */
fa_status fa_validate_dropout(fa_problem *pb, const char *call);

/* ---- score modifications: bias, document ids, block-sparse mask (src/api/fa_validate.c) ---- */

/* Scalar fields of p.bias / p.dbias / the block mask / doc ids for a call (`call` names it in
 * messages; backward: dbias is used; kvcache: bias only, the others FA_ERR_UNSUPPORTED naming
 * the field); sets has_mods, has_block_mask, q_blocks, kv_blocks, block_bytes. Call
 * after the varlen fields are checked. */
fa_status fa_validate_score_mods(fa_problem *pb, const char *call, int backward, int kvcache);
/* Append the views of the arrays above (bias, dbias, counts, indices, bits, doc ids) to
 * views; returns how many (at most FA_SCORE_MOD_VIEWS). */
#define FA_SCORE_MOD_VIEWS 8
int fa_score_mod_views(const fa_problem *pb, int backward, fa_tensor_view *views);
/* One block-list row (b, h, qb) of a block mask: the counts and lists as given (full NULL: no
 * full lists); FA_ERR_INVALID_ARGUMENT naming the field and position when a count or an entry is
 * out of range, a list is not strictly increasing, or a block is in both lists. The CPU checks
 * every row with it; the CUDA engine checks on the device and calls it on the first bad row. */
fa_status fa_check_block_row(const fa_problem *pb, int64_t b, int64_t h, int64_t qb, int32_t n_part,
                             const int32_t *part, int32_t n_full, const int32_t *full);
/* With a block mask: the window moves to elem_window_* and p.window_* become -1 (has_mask 0);
 * without one elem_window_* = p.window_*. After the block lists are known to be valid. */
void fa_score_mods_move_window(fa_problem *pb);
/* After the views passed, on the CPU: the block lists' contents (counts, ranges, order, no
 * block both partial and full); then the window resolution described at fa_problem. */
fa_status fa_check_score_mod_contents(fa_problem *pb);

/* fa_forward with a paged K/V (p.block_table set): page_size, num_pages, the table's row
 * stride, the page pool's strides (k / v [num_pages, page_size, heads_kv, d]) and, on the CPU,
 * every table entry a sequence reads. Call after the varlen fields are checked. */
fa_status fa_validate_paged_kv(const fa_problem *pb);

/* ---- per-sequence geometry (host side; CPU engines) ----------------------------------------- */

/* Start rows and lengths of sequence b. Non-varlen: starts are 0 and the batch stride selects
 * the sequence (see fa_row_offset). Varlen: starts are the cu_seqlens entries. */
typedef struct fa_seq {
    int64_t q_start, k_start; /* first packed row (varlen) or 0                               */
    int64_t len_q, len_k;     /* tokens in this sequence                                      */
} fa_seq;

static inline fa_seq fa_sequence(const fa_problem *pb, int64_t b) {
    fa_seq s;
    if (pb->varlen) {
        s.q_start = pb->p.cu_seqlens_q[b];
        s.k_start = pb->p.cu_seqlens_k[b];
        s.len_q = pb->p.cu_seqlens_q[b + 1] - s.q_start;
        s.len_k = pb->p.cu_seqlens_k[b + 1] - s.k_start;
    } else {
        s.q_start = 0;
        s.k_start = 0;
        s.len_q = pb->p.seqlen_q;
        s.len_k = pb->p.seqlen_k;
    }
    return s;
}

/* Element offset of (sequence b, row `row` within it, head h) for a tensor with the given
 * strides; row_start is fa_seq.q_start or .k_start. */
static inline int64_t fa_row_offset(const fa_problem *pb, int64_t b, int64_t row_start, int64_t row,
                                    int64_t h, int64_t batch_stride, int64_t row_stride,
                                    int64_t head_stride) {
    int64_t base = pb->varlen ? (row_start + row) * row_stride : b * batch_stride + row * row_stride;
    return base + h * head_stride;
}

/* Offset of the first lse element of (sequence b, head h); rows follow contiguously. */
static inline int64_t fa_lse_offset(const fa_problem *pb, int64_t b, int64_t q_start, int64_t h) {
    return pb->varlen ? h * pb->p.total_q + q_start : (b * pb->p.heads_q + h) * pb->p.seqlen_q;
}

/* ---- masks (host and device) ---------------------------------------------------------------- */

/* The mask in one place for every engine. Query row i of a sequence has its diagonal at key
 * diag = i + shift, shift = len_k - len_q (the diagonal aligned to the bottom-right corner), and
 * sees keys j with diag - window_left <= j <= diag + window_right inside [0, len_k) (a side < 0 is
 * unbounded; causal is window_right = 0). Both ends below are non-decreasing in i, so query rows
 * [i0, i1] see, between them, keys [lo(i0), hi(i1)), and every one of them sees [lo(i1), hi(i0)):
 * tiled kernels skip and leave unmasked whole tiles with fa_tile_none_visible and
 * fa_tile_all_visible. 64-bit throughout: diag ± window can pass 2^31. */

/* First visible key of the row with diagonal diag (>= 0; may exceed len_k: nothing visible). */
FA_HD int64_t fa_key_lo(int64_t diag, int64_t window_left) {
    return window_left >= 0 && diag - window_left > 0 ? diag - window_left : 0;
}

/* One past its last visible key (<= len_k; may be negative: nothing visible). */
FA_HD int64_t fa_key_hi(int64_t diag, int64_t window_right, int64_t len_k) {
    return window_right >= 0 && diag + window_right + 1 < len_k ? diag + window_right + 1 : len_k;
}

/* Visible keys of query row i form one contiguous range [*lo, *hi) (empty when *hi <= *lo). */
FA_HD void fa_key_range(int64_t i, int64_t len_q, int64_t len_k, int64_t window_left,
                        int64_t window_right, int64_t *lo, int64_t *hi) {
    int64_t diag = i + len_k - len_q;
    *lo = fa_key_lo(diag, window_left);
    *hi = fa_key_hi(diag, window_right, len_k);
}

/* fa_key_lo and fa_key_hi clamped into [0, len_k] (an empty range keeps hi <= lo), as int: the
 * per-row ends the CUDA kernels tile with. */
FA_HD int fa_key_lo_clamped(int64_t diag, int64_t window_left, int64_t len_k) {
    int64_t lo = window_left >= 0 ? diag - window_left : 0;
    return (int)(lo < 0 ? 0 : (lo > len_k ? len_k : lo));
}
FA_HD int fa_key_hi_clamped(int64_t diag, int64_t window_right, int64_t len_k) {
    int64_t hi = window_right >= 0 ? diag + window_right + 1 : len_k;
    return (int)(hi < 0 ? 0 : (hi > len_k ? len_k : hi));
}

/* Rows with diagonals [diag_first, diag_last] against keys [k0, k1), 0 <= k0 < k1: every key
 * visible to every row, i.e. k0 >= fa_key_lo(diag_last) and k1 <= fa_key_hi(diag_first) (no
 * per-element mask needed; false when k1 > len_k) ... */
FA_HD int fa_tile_all_visible(int64_t diag_first, int64_t diag_last, int64_t k0, int64_t k1,
                              int64_t window_left, int64_t window_right, int64_t len_k) {
    return k1 <= len_k && (window_left < 0 || k0 >= diag_last - window_left) &&
           (window_right < 0 || k1 <= diag_first + window_right + 1);
}
/* ... or no key visible to any row, i.e. k0 >= fa_key_hi(diag_last) or k1 <= fa_key_lo(diag_first)
 * (the tile contributes nothing; true when k0 >= len_k). */
FA_HD int fa_tile_none_visible(int64_t diag_first, int64_t diag_last, int64_t k0, int64_t k1,
                               int64_t window_left, int64_t window_right, int64_t len_k) {
    return k0 >= len_k || (window_right >= 0 && k0 > diag_last + window_right) ||
           (window_left >= 0 && k1 <= diag_first - window_left);
}

/* Transposed, for key-major loops (the backward): the query rows that see at least one key of
 * [k0, k1) (0 <= k0 < k1 <= len_k) form [*lo, *hi) (empty when *hi <= *lo). */
FA_HD void fa_query_range(int64_t k0, int64_t k1, int64_t len_q, int64_t len_k, int64_t window_left,
                          int64_t window_right, int64_t *lo, int64_t *hi) {
    int64_t shift = len_k - len_q;
    *lo = window_right >= 0 && k0 - shift - window_right > 0 ? k0 - shift - window_right : 0;
    *hi = window_left >= 0 && k1 - shift + window_left < len_q ? k1 - shift + window_left : len_q;
}

/* Per element, by the distance d = j - diag of key j from its row's diagonal: the window holds
 * -left_limit <= d <= right_limit with the limits below (an unbounded side: 2^30, beyond any
 * distance of an int32-indexed tile). Kernels that test elements this way check 0 <= j < len_k
 * themselves. */
FA_HD int fa_window_limit(int64_t window) { return window < 0 ? (1 << 30) : (int)window; }
FA_HD int fa_window_holds(int d, int left_limit, int right_limit) { return d >= -left_limit && d <= right_limit; }

/* ALiBi bias of (query i, key j): -slope·|i + len_k - len_q - j|. */
FA_HD float fa_alibi_bias(float slope, int64_t i, int64_t j, int64_t len_q, int64_t len_k) {
    int64_t dist = i + len_k - len_q - j;
    if (dist < 0) dist = -dist;
    return -slope * (float)dist;
}

/* ---- engines -------------------------------------------------------------------------------- */

/* FA_ERR_WORKSPACE when the caller gave a workspace (p->workspace) smaller than the `needed` bytes
 * the engine reported (src/api/fa_validate.c). */
fa_status fa_check_workspace_size(const fa_params *p, size_t needed);

/* CPU engine (src/cpu/). All take a validated problem. */
fa_status fa_cpu_forward(const fa_problem *pb);
fa_status fa_cpu_backward(const fa_problem *pb);
fa_status fa_cpu_standard_forward(const fa_problem *pb);
size_t fa_cpu_forward_workspace(const fa_problem *pb);  /* bytes; 0 if none                   */
size_t fa_cpu_backward_workspace(const fa_problem *pb);
const char *fa_cpu_isa_name(void);

/* CUDA engine (src/cuda/, or src/api/fa_cuda_stub.c when built without nvcc). The check functions
 * apply the device path's own limits (head dims, alignment) and report its workspace. */
int fa_cuda_is_available(void);
int fa_cuda_built(void);
fa_status fa_cuda_check_forward(const fa_problem *pb, size_t *workspace_bytes);
fa_status fa_cuda_check_backward(const fa_problem *pb, size_t *workspace_bytes);
fa_status fa_cuda_forward(const fa_problem *pb);
fa_status fa_cuda_backward(const fa_problem *pb);

/* Rows cu_seqlens[batch] .. total - 1 of a [total, heads, cols] tensor (element strides, last
 * axis contiguous) set to zero: the varlen tail (p.zero_varlen_tail). */
typedef struct fa_tail_rows {
    void *base;
    int64_t elem_bytes, row_stride, head_stride, heads, cols, total;
    const int32_t *cu_seqlens; /* the first row is cu_seqlens[batch] (CUDA: device memory)    */
} fa_tail_rows;
/* The tails of n tensors zeroed on stream (one launch; nothing happens where a tail is empty). */
fa_status fa_cuda_zero_tail_rows(const fa_tail_rows *t, int n, int64_t batch, void *stream);

/* ==== KV cache (fa_kvcache_forward, fa_merge_states) ====================================== */

/* The fa_problem given to the KV-cache engines has the same resolution as for fa_forward (window
 * folded with causal, scale, head_dim_v, group), plus: varlen = 0, p.cache_batch defaulted to
 * batch when 0. CPU: the int32 arrays (cache_seqlens, cache_batch_idx, cache_leftpad,
 * block_table) were validated on the host. CUDA: none of them is read on the host (device memory);
 * the kernels clamp to bounds. */
fa_status fa_cuda_check_kvcache(const fa_problem *pb, size_t *workspace_bytes);
fa_status fa_cuda_kvcache_forward(const fa_problem *pb);
fa_status fa_cuda_merge_states(const fa_merge_params *m); /* m validated by fa_merge_states   */

/* The quantised-cache fields (kv_dtype, k_scale / v_scale) and the byte-strided k / v of a
 * KV-cache call whose cache geometry is already checked (src/api/fa_kvquant.c). */
fa_status fa_validate_kv_quant(const fa_params *p);

/* CPU engine (src/cpu/cpu_kvcache.c, src/cpu/cpu_merge.c). */
fa_status fa_cpu_kvcache_forward(const fa_problem *pb);
size_t fa_cpu_kvcache_workspace(const fa_problem *pb); /* bytes, an upper bound for the call  */
fa_status fa_cpu_merge_states(const fa_merge_params *m);

/* Most splits the engines use when num_splits = 0 (the heuristic's cap). */
#define FA_KV_MAX_SPLITS 128

/* Split-KV (flash-decoding) heuristic, shared by the CPU and CUDA engines. `work_units` is what
 * runs in parallel without splitting (e.g. batch × heads_kv × query blocks), `key_blocks` the
 * key blocks of the longest sequence, `workers` the parallel workers (CPU threads, GPU SMs ×
 * blocks per SM), `max_splits` a cap (>= 1). Rule (FlashAttention-2's): when the units nearly
 * fill the workers (>= 80 %) do not split; otherwise, for each split count s that changes the
 * blocks per split (ceil(key_blocks / s) differs from s - 1's), the wave efficiency is
 * e(s) = w / ceil(w) with w = work_units · s / workers; return the smallest s whose
 * efficiency is at least 85 % of the best. Returns 1..min(max_splits, workers, key_blocks). */
FA_HD int fa_num_splits_heuristic(int64_t work_units, int64_t key_blocks, int64_t workers,
                                  int64_t max_splits) {
    if (work_units < 1 || key_blocks <= 1 || workers <= 1 || max_splits <= 1) return 1;
    if (10 * work_units >= 8 * workers) return 1;
    int64_t limit = max_splits;
    if (limit > workers) limit = workers;
    if (limit > key_blocks) limit = key_blocks;
    if (limit > 1024) limit = 1024;
    double best = 0.0;
    /* pass 0 finds the best efficiency, pass 1 the smallest split count within 85 % of it */
    for (int pass = 0; pass < 2; ++pass) {
        for (int64_t s = 1; s <= limit; ++s) {
            if (s > 1 && (key_blocks + s - 1) / s == (key_blocks + s - 2) / (s - 1)) continue;
            double waves = (double)(work_units * s) / (double)workers;
            double efficiency = waves / ceil(waves);
            if (pass == 0 && efficiency > best) best = efficiency;
            if (pass == 1 && efficiency >= 0.85 * best) return (int)s;
        }
    }
    return 1;
}

#ifdef __cplusplus
}
#endif
#endif /* FA_INTERNAL_H */
