/*
 * stub_engine.c: a stand-in CPU engine for testing the Python bindings before src/cpu/ is done.
 * Computes with the float64 oracle of tests/reference.c and scatters results through the
 * caller's strides. Lab use only (slow, O(sq*sk) memory).
 */
#include <math.h>
#include <stdlib.h>

#include "fa_internal.h"
#include "reference.h"

static void scatter(const fa_problem *pb, const double *src, void *dst, int is_q, int64_t heads,
                    int64_t dim, int64_t bs, int64_t rs, int64_t hs) {
    for (int64_t b = 0; b < pb->p.batch; ++b) {
        fa_seq s = fa_sequence(pb, b);
        int64_t len = is_q ? s.len_q : s.len_k;
        int64_t start = is_q ? s.q_start : s.k_start;
        int64_t seqlen = is_q ? pb->p.seqlen_q : pb->p.seqlen_k;
        for (int64_t i = 0; i < len; ++i) {
            int64_t crow = pb->varlen ? start + i : b * seqlen + i;
            for (int64_t h = 0; h < heads; ++h) {
                int64_t off = fa_row_offset(pb, b, start, i, h, bs, rs, hs);
                for (int64_t e = 0; e < dim; ++e)
                    fa_test_store(dst, pb->p.dtype, off + e, src[(crow * heads + h) * dim + e]);
            }
        }
    }
}

static fa_status run(const fa_problem *pb, int backward) {
    fa_ref_gathered g;
    fa_ref_outputs out;
    if (fa_ref_gather(&pb->p, &g) != 0) return fa_set_error(FA_ERR_ALLOC, "stub: oom");
    if (fa_ref_outputs_alloc(&g.rp, backward, &out) != 0) {
        fa_ref_gathered_free(&g);
        return fa_set_error(FA_ERR_ALLOC, "stub: oom");
    }
    fa_ref64_run(&g.rp, backward, &out);
    const fa_params *p = &pb->p;
    int64_t hq = p->heads_q, hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    if (!backward) {
        scatter(pb, out.o, p->o, 1, hq, dv, p->o_batch_stride, p->o_row_stride, p->o_head_stride);
        if (p->lse) {
            for (int64_t b = 0; b < p->batch; ++b) {
                fa_seq s = fa_sequence(pb, b);
                for (int64_t h = 0; h < hq; ++h) {
                    int64_t off = fa_lse_offset(pb, b, s.q_start, h);
                    for (int64_t i = 0; i < s.len_q; ++i)
                        p->lse[off + i] = (float)out.lse[fa_ref_lse_index(&g.rp, b, h, i)];
                }
            }
        }
    } else {
        scatter(pb, out.dq, p->dq, 1, hq, d, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride);
        scatter(pb, out.dk, p->dk, 0, hkv, d, p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride);
        scatter(pb, out.dv, p->dv, 0, hkv, dv, p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride);
        if (p->dsink && out.dsink)
            for (int64_t h = 0; h < hq; ++h) p->dsink[h] = (float)out.dsink[h];
    }
    fa_ref_outputs_free(&out);
    fa_ref_gathered_free(&g);
    return FA_OK;
}

fa_status fa_cpu_forward(const fa_problem *pb) { return run(pb, 0); }
fa_status fa_cpu_backward(const fa_problem *pb) { return run(pb, 1); }
fa_status fa_cpu_standard_forward(const fa_problem *pb) { return run(pb, 0); }
size_t fa_cpu_forward_workspace(const fa_problem *pb) { return 0; }
size_t fa_cpu_backward_workspace(const fa_problem *pb) { return 0; }
const char *fa_cpu_isa_name(void) { return "stub"; }
