/*
 * hopper_fwd.h: C entry points of the lab sm_90a forward kernel (lab/hopper/v2/hopper_fwd.cu).
 * Standalone: no other part of the library is linked. Statuses are fa_status values
 * (include/flashattn.h). The Python harness (hopper_lab.py) mirrors hopper_fwd_args with ctypes:
 * change both together.
 */
#ifndef HOPPER_FWD_H
#define HOPPER_FWD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One forward call: O = softmax(scale · Q Kᵀ [causal mask]) V and the row LSE, exactly as
 * fa_forward defines them (natural log; a row with no visible key gets O = 0, LSE = -inf).
 * Strides in elements; the last dimension is contiguous. */
typedef struct hopper_fwd_args {
    int dtype;   /* FA_DTYPE_F16 (1) or FA_DTYPE_BF16 (2)                                        */
    int causal;  /* nonzero: causal mask aligned to the bottom-right corner (key j visible to
                    query i iff j <= i + seqlen_k - seqlen_q)                                     */
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    int64_t head_dim; /* d of q, k and v (head_dim_v = head_dim): 64, 128 or 256                 */
    const void *q;    /* [batch, seqlen_q, heads_q, d]                                             */
    const void *k;    /* [batch, seqlen_k, heads_kv, d]                                            */
    const void *v;    /* [batch, seqlen_k, heads_kv, d]                                            */
    void *o;          /* [batch, seqlen_q, heads_q, d]                                             */
    float *lse;       /* [batch, heads_q, seqlen_q] fp32 contiguous, or NULL (not written)         */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    float softmax_scale; /* 0: 1/sqrt(d); must be > 0 otherwise                                   */
    void *stream;        /* cudaStream_t (NULL = default stream)                                  */
} hopper_fwd_args;

/* Validate, build the TMA tensor maps and launch asynchronously on a->stream. Returns FA_OK or an
 * fa_status with a message in hopper_fwd_last_error(). Nothing is written on error. */
int hopper_fwd(const hopper_fwd_args *a);
const char *hopper_fwd_last_error(void);

/* The tile shape the kernel uses for (head dim, causal): pure functions of the two and of the
 * build's -D knobs (hopper_fwd.cu, "tile shapes"). Returns 0 and fills the outputs, or -1 for an
 * unsupported head dim. */
int hopper_fwd_tile_shape(int head_dim, int causal, int *block_m, int *block_n, int *stages,
                          int *smem_bytes);

/* Self-contained timing without any other CUDA user in the process: allocates q, k, v, o, lse for
 * the given dense shape, fills q/k/v with pseudo-random values in [-1, 1) (v in [-0.5, 1.5)),
 * runs `warmup` calls, then `reps` timed calls, each after a 256 MiB memset that evicts L2 (as
 * triton's do_bench), and stores the median kernel time in *ms_median. Frees everything. */
int hopper_fwd_selftime(int dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                        int64_t heads_kv, int64_t head_dim, int causal, int warmup, int reps,
                        float *ms_median);

#ifdef __cplusplus
}
#endif
#endif /* HOPPER_FWD_H */
