/*
 * cpu_merge.h: merging partial attention states on the CPU (cpu_merge.c), shared by
 * fa_merge_states and the split-KV paths of fa_kvcache_forward (cpu_kvcache.c, cpu_decode.c).
 *
 * States s = 0..n-1 of one output row hold (o_s, lse_s) over disjoint key sets; the merged state
 * over their union (plus an optional sink logit t, a key with no value) is
 *     m = max(max_s lse_s, t),  Z = Σ_s exp(lse_s - m) + exp(t - m),  lse = m + log Z,
 *     o = Σ_s exp(lse_s - m) / Z · o_s.
 * A state with lse_s = -inf is empty: it is skipped and its o_s never read (it may hold
 * anything). No state and no sink: o = 0, lse = -inf. A NaN lse_s makes the row NaN.
 * Weights are computed in double and o is accumulated in double, so the merge adds no error of
 * its own beyond the final rounding.
 */
#ifndef FA_CPU_MERGE_H
#define FA_CPU_MERGE_H

#include "cpu_engine.h"

typedef struct fa_cpu_merge_row_args {
    int64_t n_states;
    int64_t dim;             /* elements of one o row (head_dim_v)                              */
    const float *lse;        /* lse of state s at lse[s · lse_stride]                          */
    int64_t lse_stride;
    const void *o;           /* row of state s at o + s · o_stride elements, of o_dtype        */
    int64_t o_stride;
    fa_dtype o_dtype;
    const float *sink;       /* NULL, or the sink logit                                       */
    const fa_cpu_kernels *kern; /* conversions of 16-bit rows                                  */
} fa_cpu_merge_row_args;

/* Merge one row into out[dim] (fp32) and return its lse. */
float fa_cpu_merge_row(const fa_cpu_merge_row_args *a, float *out);

/* The last phase of a split-KV call of p: the `splits` fp32 partial states of every row, rows =
 * batch·heads_q·seqlen_q in (b, h, i) order with i fastest (lse_part [splits][rows], o_part
 * [splits][rows][head_dim_v]), merged with p's sinks into p->o and p->lse (when set), on at most
 * `threads` threads. */
void fa_cpu_merge_splits(const fa_params *p, const fa_cpu_kernels *kern, int64_t splits, const float *lse_part,
                         const float *o_part, int threads);

#endif /* FA_CPU_MERGE_H */
