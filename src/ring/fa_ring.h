/*
 * fa_ring.h: internals of ring attention (public API in include/flashattn.h, algorithm
 * in src/ring/fa_ring.c).
 *
 *   - the ring schedule: which K/V shard a rank holds at each step and which part of the block
 *     pair (local queries × that shard) it computes, as a pure function (tested directly);
 *   - the element-wise operations the ring needs besides attention (pack K/V, merge partial
 *     states, accumulate gradients, store results), one implementation per device: plain loops
 *     on the CPU (fa_ring.c), small kernels on CUDA (src/ring/ring_nccl.cu; stubs in
 *     src/ring/fa_ring_cuda_stub.c when built without CUDA).
 */
#ifndef FA_RING_H
#define FA_RING_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- schedule --------------------------------------------------------------------------- */

typedef enum fa_ring_block {
    FA_RING_SKIP = 0,    /* the shard is entirely in the queries' future (causal): no work   */
    FA_RING_FULL = 1,    /* no mask                                                          */
    FA_RING_CAUSAL = 2   /* the rank's own shard: the causal mask (query and key rows align) */
} fa_ring_block;

typedef enum fa_ring_part {
    FA_RING_PART_ALL = 0,    /* every chunk of the shard                                      */
    FA_RING_PART_FIRST = 1,  /* its first chunk only (zig-zag: chunk owner)                   */
    FA_RING_PART_SECOND = 2  /* its second chunk only (zig-zag: chunk 2W-1-owner)             */
} fa_ring_part;

typedef struct fa_ring_step {
    int owner;  /* rank whose K/V shard this rank holds: (rank - step) mod W                  */
    int block;  /* fa_ring_block                                                              */
    int q_part; /* fa_ring_part of the local queries that attend                              */
    int k_part; /* fa_ring_part of the held K/V shard that is attended                        */
} fa_ring_step;

/* Step `step` (0 <= step < W) of rank `rank`. Contiguous, causal: owner < rank FULL, owner ==
 * rank CAUSAL, owner > rank SKIP. Zig-zag, causal: owner == rank CAUSAL (ALL × ALL); owner <
 * rank FULL, ALL queries × FIRST chunk; owner > rank FULL, SECOND query chunk × ALL. Not causal:
 * FULL, ALL × ALL. */
fa_ring_step fa_ring_plan_step(int rank, int world_size, int step, fa_ring_sharding sharding,
                               int causal);

/* Chunk c of C over a sequence of `seqlen` tokens: start c·(L/C) + min(c, L%C). */
static inline int64_t fa_ring_chunk_start(int64_t seqlen, int64_t chunks, int64_t c) {
    int64_t base = seqlen / chunks, extra = seqlen % chunks;
    return c * base + (c < extra ? c : extra);
}
static inline int64_t fa_ring_chunk_length(int64_t seqlen, int64_t chunks, int64_t c) {
    return seqlen / chunks + (c < seqlen % chunks ? 1 : 0);
}

/* ---- element-wise operations ------------------------------------------------------------ */

/* A strided 4-D tensor [blocks, rows, heads, dim] with a contiguous last dimension; strides in
 * elements. Blocks are sequences (batched layouts) or a single block of packed rows (varlen).
 * LSE tensors are views with dim = 1 (their heads and rows strides say the layout). */
typedef struct fa_ring_view {
    void *ptr;
    fa_dtype dtype;
    int64_t block_stride, row_stride, head_stride;
} fa_ring_view;

typedef struct fa_ring_shape {
    int64_t blocks, rows, heads, dim;
} fa_ring_shape;

/* One device's implementation. Every operation is enqueued on `stream` (CUDA) or done before it
 * returns (CPU). */
typedef struct fa_ring_backend {
    fa_status (*alloc)(size_t bytes, void **ptr, void *stream); /* stream-ordered on CUDA   */
    void (*release)(void *ptr, void *stream);
    /* host -> device memory (CPU: memcpy); the host buffer may be freed on return */
    fa_status (*upload)(void *dst, const void *src_host, size_t bytes, void *stream);
    /* dst = src over shape, converting between f32 / f16 / bf16 (round to nearest even) */
    fa_status (*copy)(fa_ring_view dst, fa_ring_view src, fa_ring_shape shape, void *stream);
    /* dst (f32) += src */
    fa_status (*accumulate)(fa_ring_view dst, fa_ring_view src, fa_ring_shape shape, void *stream);
    /* (o_acc, lse_acc) := merge of itself with (o_part, lse_part); o_acc and lse_acc are f32, lse
     * views use shape.dim = 1. An lse of -inf is an empty state: its o is not read. */
    fa_status (*merge)(fa_ring_view o_acc, fa_ring_view lse_acc, fa_ring_view o_part,
                       fa_ring_view lse_part, fa_ring_shape shape, void *stream);
} fa_ring_backend;

/* CUDA: the backend, or NULL when built without CUDA (src/ring/fa_ring_cuda_stub.c). */
const fa_ring_backend *fa_cuda_ring_backend(void);
/* The NCCL transport (src/ring/ring_nccl.cu; the stub reports FA_ERR_UNSUPPORTED). */
fa_status fa_cuda_ring_comm_nccl(void *nccl_comm, void *comm_stream, fa_ring_comm *comm, int *rank,
                                 int *world_size);
void fa_cuda_ring_comm_nccl_release(fa_ring_comm *comm);
int fa_cuda_ring_nccl_built(void);

#ifdef __cplusplus
}
#endif
#endif /* FA_RING_H */
