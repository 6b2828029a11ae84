/*
 * bench_sample.c: the accuracy column of `flashattn bench`: max |ours - float64 reference| over
 * the last SAMPLE_ROWS query rows of the last (batch, head), computed only for those rows.
 *
 * The sampled rows form a sub-problem of their own: batch 1, one query head, the last r query
 * rows, every key of the matching kv head, same strides. Masks are aligned to the bottom-right
 * corner (key j visible to row i depends on i + sk - sq), so the last r rows of the full problem
 * are exactly rows 0..r-1 of a problem with seqlen_q = r. Each output row of o and dq depends
 * only on its own query row, so the sub-problem's rows are the full problem's rows.
 */
#include <math.h>
#include <string.h>

#include "oracle/reference.h"
#include "bench_case.h"
#include "cli.h"

#define SAMPLE_ROWS 4

typedef struct sample_view {
    fa_params sub;      /* the sub-problem, pointing into the caller's tensors                */
    int64_t o_offset;   /* element offset of the first sampled row in o                        */
    int64_t dq_offset;  /* and in dq                                                           */
} sample_view;

static const void *offset_by(const void *base, int64_t elements, size_t elem_size) {
    return base ? (const char *)base + elements * (int64_t)elem_size : NULL;
}

/* Sub-problem of the last rows of (batch b, head h). */
static sample_view sample_of(const fa_params *p) {
    sample_view s;
    size_t es = cli_dtype_size(p->dtype);
    int64_t b = p->batch - 1, h = p->heads_q - 1;
    int64_t kv_head = h / (p->heads_q / p->heads_kv);
    int64_t rows = p->seqlen_q < SAMPLE_ROWS ? p->seqlen_q : SAMPLE_ROWS;
    int64_t first = p->seqlen_q - rows;
    s.sub = *p;
    s.sub.batch = 1;
    s.sub.heads_q = 1;
    s.sub.heads_kv = 1;
    s.sub.seqlen_q = rows;
    s.sub.device = FA_DEVICE_CPU;
    s.sub.q = offset_by(p->q, b * p->q_batch_stride + first * p->q_row_stride + h * p->q_head_stride, es);
    s.sub.k = offset_by(p->k, b * p->k_batch_stride + kv_head * p->k_head_stride, es);
    s.sub.v = offset_by(p->v, b * p->v_batch_stride + kv_head * p->v_head_stride, es);
    s.sub.dout = offset_by(p->dout, b * p->do_batch_stride + first * p->do_row_stride +
                                        h * p->do_head_stride, es);
    s.o_offset = b * p->o_batch_stride + first * p->o_row_stride + h * p->o_head_stride;
    s.dq_offset = b * p->dq_batch_stride + first * p->dq_row_stride + h * p->dq_head_stride;
    return s;
}

/* Max |out row c - ref| over the sub-problem's rows; out rows follow `row_stride`. */
static double max_row_error(const fa_params *sub, const void *out, int64_t first,
                            int64_t row_stride, int64_t width, const double *ref) {
    double err = 0.0;
    for (int64_t i = 0; i < sub->seqlen_q; i++) {
        for (int64_t c = 0; c < width; c++) {
            double ours = fa_test_load(out, sub->dtype, first + i * row_stride + c);
            double diff = fabs(ours - ref[i * width + c]);
            if (diff != diff) return INFINITY;
            if (diff > err) err = diff;
        }
    }
    return err;
}

/* Max error of o (backward = 0) or dq (backward = 1) over the sampled rows; < 0 on failure. */
static double sample_error(const fa_params *p, int backward) {
    if (p->seqlen_q <= 0 || p->cu_seqlens_q) return -1.0;
    sample_view s = sample_of(p);
    fa_ref_gathered gathered;
    fa_ref_outputs ref;
    if (fa_ref_gather(&s.sub, &gathered) != 0) return -1.0;
    if (fa_ref_outputs_alloc(&gathered.rp, backward, &ref) != 0) {
        fa_ref_gathered_free(&gathered);
        return -1.0;
    }
    fa_ref64_run(&gathered.rp, backward, &ref);
    double err = backward ? max_row_error(&s.sub, p->dq, s.dq_offset, p->dq_row_stride,
                                          p->head_dim, ref.dq)
                          : max_row_error(&s.sub, p->o, s.o_offset, p->o_row_stride,
                                          gathered.rp.head_dim_v, ref.o);
    fa_ref_outputs_free(&ref);
    fa_ref_gathered_free(&gathered);
    return err;
}

void bench_sample_errors(const bench_case *c, const fa_params *host_p, bench_result *r) {
    if (c->dropout_p > 0.0f) { /* the sub-problem's (batch, head, row) would draw another mask */
        r->max_abs_err = -1.0;
        return;
    }
    double err_o = c->mode != BENCH_BWD ? sample_error(host_p, 0) : 0.0;
    double err_dq = c->mode != BENCH_FWD ? sample_error(host_p, 1) : 0.0;
    r->max_abs_err = err_o < 0.0 || err_dq < 0.0 ? -1.0 : err_o > err_dq ? err_o : err_dq;
    strcpy(r->err_tensor, c->mode == BENCH_FWD ? "o" : c->mode == BENCH_BWD ? "dq" : "o+dq");
}
