/*
 * hopper_bwd.h: C entry points of the lab sm_90a backward for d = 256 (lab/hopper_bwd/v2/hopper_bwd.cu).
 * Standalone: no other part of the library is linked. Statuses are fa_status values
 * (include/flashattn.h). The Python harness (hbwd_lab.py) mirrors hopper_bwd_args with ctypes:
 * change both together.
 */
#ifndef HOPPER_BWD_H
#define HOPPER_BWD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One backward call, exactly as fa_backward defines it for this subset: with P = exp(S - LSE),
 * S = scale · Q Kᵀ [causal mask], D = rowsum(dO ∘ O):
 *   dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D), dQ = scale · dS K, dK = scale · dSᵀ Q,
 * dK / dV summed over the query heads of a kv group. A row with LSE = -inf contributes nothing.
 * Strides in elements; the last dimension is contiguous. */
typedef struct hopper_bwd_args {
    int dtype;   /* FA_DTYPE_F16 (1) or FA_DTYPE_BF16 (2)                                        */
    int causal;  /* nonzero: causal mask aligned to the bottom-right corner (key j visible to
                    query i iff j <= i + seqlen_k - seqlen_q)                                     */
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    int64_t head_dim; /* d of q, k, v, o: 256 (dv = d)                                             */
    const void *q;    /* [batch, seqlen_q, heads_q, d]                                             */
    const void *k;    /* [batch, seqlen_k, heads_kv, d]                                            */
    const void *v;    /* [batch, seqlen_k, heads_kv, d]                                            */
    const void *o;    /* [batch, seqlen_q, heads_q, d] (the forward's output)                      */
    const void *dout; /* [batch, seqlen_q, heads_q, d]                                             */
    const float *lse; /* [batch, heads_q, seqlen_q] fp32 contiguous, natural log (the forward's)   */
    void *dq;         /* [batch, seqlen_q, heads_q, d]                                             */
    void *dk;         /* [batch, seqlen_k, heads_kv, d]                                            */
    void *dv;         /* [batch, seqlen_k, heads_kv, d]                                            */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    float softmax_scale; /* 0: 1/sqrt(d); must be > 0 otherwise                                   */
    void *workspace;     /* device memory, 16-byte aligned, hopper_bwd_workspace_size() bytes      */
    int64_t workspace_bytes;
    void *stream;        /* cudaStream_t (NULL = default stream)                                  */
} hopper_bwd_args;

/* Bytes of workspace a call with these sizes needs (dQ accumulator fp32, LSE·log2e and D rows,
 * each padded to whole query tiles), or -1 for an unsupported head dim. */
int64_t hopper_bwd_workspace_size(int64_t batch, int64_t seqlen_q, int64_t heads_q, int64_t head_dim);

/* Validate, build the TMA tensor maps and launch the three kernels (pre-pass, main, dQ
 * conversion) asynchronously on a->stream. Returns FA_OK or an fa_status with a message in
 * hopper_bwd_last_error(). Nothing is written on error. */
int hopper_bwd(const hopper_bwd_args *a);
const char *hopper_bwd_last_error(void);

/* The main kernel's tile shape for this head dim (a pure function). Returns 0 and fills the
 * outputs, or -1 for an unsupported head dim. */
int hopper_bwd_tile_shape(int head_dim, int *block_m, int *block_n, int *stages, int *smem_bytes);

/* Self-contained timing without any other CUDA user in the process: allocates every tensor for
 * the given dense shape, fills q/k/v/o/dO with pseudo-random values in [-1, 1) and LSE with
 * log(seqlen_k) (finite, so every P stays bounded), runs `warmup` calls, then `reps` timed calls,
 * each after a 256 MiB memset that evicts L2, and stores the median time in *ms_median (reps = 0:
 * one call, no timing; what compute-sanitizer drives). Frees everything. */
int hopper_bwd_selftime(int dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                        int64_t heads_kv, int64_t head_dim, int causal, int warmup, int reps, float *ms_median);

#ifdef __cplusplus
}
#endif
#endif /* HOPPER_BWD_H */
