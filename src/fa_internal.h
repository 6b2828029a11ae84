/*
 * fa_internal.h: what every engine (CPU, CUDA) sees after the API layer has validated a call.
 *
 * fa_api.c turns the caller's fa_params into an fa_problem: a validated copy with every default
 * resolved (head_dim_v, softmax_scale, window folded with causal) plus derived sizes. Engines
 * receive only fa_problem and may assume everything documented here holds.
 *
 * This header is C11 and also compiles as CUDA C++ (the mask helpers are host+device).
 */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

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
} fa_problem;

/* Record a detailed message for the calling thread and return `status` (printf-style). */
fa_status fa_set_error(fa_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

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

/* Visible keys of query row i form one contiguous range [*lo, *hi) (empty when *hi <= *lo).
 * shift = len_k - len_q aligns the diagonal to the bottom-right corner. */
FA_HD void fa_key_range(int64_t i, int64_t len_q, int64_t len_k, int64_t window_left,
                        int64_t window_right, int64_t *lo, int64_t *hi) {
    int64_t diag = i + len_k - len_q;
    int64_t a = 0, b = len_k;
    if (window_left >= 0 && diag - window_left > a) a = diag - window_left;
    if (window_right >= 0 && diag + window_right + 1 < b) b = diag + window_right + 1;
    *lo = a;
    *hi = b;
}

/* ALiBi bias of (query i, key j): -slope·|i + len_k - len_q - j|. */
FA_HD float fa_alibi_bias(float slope, int64_t i, int64_t j, int64_t len_q, int64_t len_k) {
    int64_t dist = i + len_k - len_q - j;
    if (dist < 0) dist = -dist;
    return -slope * (float)dist;
}

/* ---- engines -------------------------------------------------------------------------------- */

/* CPU engine (src/cpu/). All take a validated problem. */
fa_status fa_cpu_forward(const fa_problem *pb);
fa_status fa_cpu_backward(const fa_problem *pb);
fa_status fa_cpu_standard_forward(const fa_problem *pb);
size_t fa_cpu_forward_workspace(const fa_problem *pb);  /* bytes; 0 if none                   */
size_t fa_cpu_backward_workspace(const fa_problem *pb);
const char *fa_cpu_isa_name(void);

/* CUDA engine (src/cuda/, or src/fa_cuda_stub.c when built without nvcc). The check functions
 * apply the device path's own limits (head dims, alignment) and report its workspace. */
int fa_cuda_is_available(void);
int fa_cuda_built(void);
fa_status fa_cuda_check_forward(const fa_problem *pb, size_t *workspace_bytes);
fa_status fa_cuda_check_backward(const fa_problem *pb, size_t *workspace_bytes);
fa_status fa_cuda_forward(const fa_problem *pb);
fa_status fa_cuda_backward(const fa_problem *pb);

/* ==== KV cache (issue 5: fa_kvcache_forward, fa_merge_states) ============================= */

/* The fa_problem given to the KV-cache engines has the same resolution as for fa_forward (window
 * folded with causal, scale, head_dim_v, group), plus: varlen = 0, p.cache_batch defaulted to
 * batch when 0. CPU: the int32 arrays (cache_seqlens, cache_batch_idx, cache_leftpad,
 * block_table) were validated on the host. CUDA: none of them is read on the host (device memory);
 * the kernels clamp to bounds. */
fa_status fa_cuda_check_kvcache(const fa_problem *pb, size_t *workspace_bytes);
fa_status fa_cuda_kvcache_forward(const fa_problem *pb);
fa_status fa_cuda_merge_states(const fa_merge_params *m); /* m validated by fa_merge_states   */

#ifdef __cplusplus
}
#endif
#endif /* FA_INTERNAL_H */
