/* lab/tests/01: a naive fp32 CPU engine (fa_cpu_* entry points) that exercised the tests before
 * src/cpu linked. Build it with every tests/ source, src/fa_api.c and src/fa_cuda_stub.c (-lm -pthread). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "fa_internal.h"
#include "../../tests/reference.h"

static float ld(const fa_problem *pb, const void *base, int64_t i) { return (float)fa_test_load(base, pb->p.dtype, i); }
static void st(const fa_problem *pb, void *base, int64_t i, float x) { fa_test_store(base, pb->p.dtype, i, x); }

static float score(const fa_problem *pb, int64_t qa, int64_t ka, float slope, int64_t i, int64_t j, fa_seq s) {
    const fa_params *p = &pb->p;
    float acc = 0;
    for (int64_t c = 0; c < p->head_dim; c++) acc += ld(pb, p->q, qa + c) * ld(pb, p->k, ka + c);
    acc *= p->softmax_scale;
    if (p->softcap > 0) acc = p->softcap * tanhf(acc / p->softcap);
    if (p->alibi_slopes) acc += fa_alibi_bias(slope, i, j, s.len_q, s.len_k);
    return acc;
}

static fa_status run(const fa_problem *pb, int backward) {
    const fa_params *p = &pb->p;
    int64_t d = p->head_dim, dv = p->head_dim_v;
    float *srow = malloc(sizeof(float) * (size_t)(p->seqlen_k + 1));
    float *dkacc = malloc(sizeof(float) * (size_t)(p->seqlen_k * d + 1));
    float *dvacc = malloc(sizeof(float) * (size_t)(p->seqlen_k * dv + 1));
    if (backward && p->dsink) for (int64_t h = 0; h < p->heads_q; h++) p->dsink[h] = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_sequence(pb, b);
        for (int64_t kh = 0; kh < p->heads_kv; kh++) {
            if (backward) { memset(dkacc, 0, sizeof(float) * (size_t)(s.len_k * d)); memset(dvacc, 0, sizeof(float) * (size_t)(s.len_k * dv)); }
            for (int64_t g = 0; g < pb->group; g++) {
                int64_t h = kh * pb->group + g;
                float slope = p->alibi_slopes ? p->alibi_slopes[b * p->alibi_batch_stride + h] : 0;
                for (int64_t i = 0; i < s.len_q; i++) {
                    int64_t lo, hi;
                    fa_key_range(i, s.len_q, s.len_k, p->window_left, p->window_right, &lo, &hi);
                    int64_t qa = fa_row_offset(pb, b, s.q_start, i, h, p->q_batch_stride, p->q_row_stride, p->q_head_stride);
                    int64_t oa = fa_row_offset(pb, b, s.q_start, i, h, p->o_batch_stride, p->o_row_stride, p->o_head_stride);
                    float *lse_p = p->lse ? p->lse + fa_lse_offset(pb, b, s.q_start, h) + i : NULL;
                    if (!backward) {
                        float m = p->sink_logits ? p->sink_logits[h] : -INFINITY;
                        for (int64_t j = lo; j < hi; j++) {
                            int64_t ka = fa_row_offset(pb, b, s.k_start, j, kh, p->k_batch_stride, p->k_row_stride, p->k_head_stride);
                            srow[j] = score(pb, qa, ka, slope, i, j, s);
                            if (srow[j] > m) m = srow[j];
                        }
                        if (m == -INFINITY) { for (int64_t c = 0; c < dv; c++) st(pb, p->o, oa + c, 0); if (lse_p) *lse_p = -INFINITY; continue; }
                        float l = p->sink_logits ? expf(p->sink_logits[h] - m) : 0;
                        for (int64_t j = lo; j < hi; j++) l += expf(srow[j] - m);
                        for (int64_t c = 0; c < dv; c++) {
                            float acc = 0;
                            for (int64_t j = lo; j < hi; j++) {
                                int64_t va = fa_row_offset(pb, b, s.k_start, j, kh, p->v_batch_stride, p->v_row_stride, p->v_head_stride);
                                acc += expf(srow[j] - m) * ld(pb, p->v, va + c);
                            }
                            st(pb, p->o, oa + c, acc / l);
                        }
                        if (lse_p) *lse_p = m + logf(l);
                    } else {
                        float lse = *lse_p;
                        int64_t da = fa_row_offset(pb, b, s.q_start, i, h, p->do_batch_stride, p->do_row_stride, p->do_head_stride);
                        int64_t dqa = fa_row_offset(pb, b, s.q_start, i, h, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride);
                        float D = 0;
                        for (int64_t c = 0; c < dv; c++) D += ld(pb, p->dout, da + c) * ld(pb, p->o, oa + c);
                        float dq[FA_MAX_HEAD_DIM] = {0};
                        if (lse != -INFINITY)
                        for (int64_t j = lo; j < hi; j++) {
                            int64_t ka = fa_row_offset(pb, b, s.k_start, j, kh, p->k_batch_stride, p->k_row_stride, p->k_head_stride);
                            int64_t va = fa_row_offset(pb, b, s.k_start, j, kh, p->v_batch_stride, p->v_row_stride, p->v_head_stride);
                            float sc = score(pb, qa, ka, slope, i, j, s);
                            float pr = expf(sc - lse);
                            float dp = 0;
                            for (int64_t c = 0; c < dv; c++) dp += ld(pb, p->dout, da + c) * ld(pb, p->v, va + c);
                            float ds = pr * (dp - D);
                            if (p->softcap > 0) {
                                float raw = 0; for (int64_t c = 0; c < d; c++) raw += ld(pb, p->q, qa + c) * ld(pb, p->k, ka + c);
                                float t = tanhf(raw * p->softmax_scale / p->softcap); ds *= 1 - t * t;
                            }
                            for (int64_t c = 0; c < d; c++) { dq[c] += p->softmax_scale * ds * ld(pb, p->k, ka + c); dkacc[j * d + c] += p->softmax_scale * ds * ld(pb, p->q, qa + c); }
                            for (int64_t c = 0; c < dv; c++) dvacc[j * dv + c] += pr * ld(pb, p->dout, da + c);
                        }
                        for (int64_t c = 0; c < d; c++) st(pb, p->dq, dqa + c, dq[c]);
                        if (p->dsink && p->sink_logits && lse != -INFINITY) p->dsink[h] -= expf(p->sink_logits[h] - lse) * D;
                    }
                }
            }
            if (backward)
                for (int64_t j = 0; j < s.len_k; j++) {
                    int64_t dka = fa_row_offset(pb, b, s.k_start, j, kh, p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride);
                    int64_t dva = fa_row_offset(pb, b, s.k_start, j, kh, p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride);
                    for (int64_t c = 0; c < d; c++) st(pb, p->dk, dka + c, dkacc[j * d + c]);
                    for (int64_t c = 0; c < dv; c++) st(pb, p->dv, dva + c, dvacc[j * dv + c]);
                }
        }
    }
    free(srow); free(dkacc); free(dvacc);
    return FA_OK;
}
fa_status fa_cpu_forward(const fa_problem *pb) { return run(pb, 0); }
fa_status fa_cpu_backward(const fa_problem *pb) { return run(pb, 1); }
fa_status fa_cpu_standard_forward(const fa_problem *pb) { return run(pb, 0); }
size_t fa_cpu_forward_workspace(const fa_problem *pb) { (void)pb; return 0; }
size_t fa_cpu_backward_workspace(const fa_problem *pb) { (void)pb; return 4096; }
const char *fa_cpu_isa_name(void) { const char *e = getenv("FA_CPU_ISA"); return e ? e : "avx512"; }
