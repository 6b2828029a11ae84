/*
 * cpu_probs.c: fa_forward's optional attn_probs output (flash_attn's S_dmask, for testing at
 * small sizes): P_ij, the softmax probabilities of every (sequence, query head, query, key),
 * negated where dropout drops the element. A plain pass after the forward, one row at a time:
 * scores scale·q·k in fp32 from dtype inputs, softcap, ALiBi, the row's key range
 * (fa_key_range), then P = exp(s - LSE) with the sink in the denominator. Single-threaded: the
 * output is batch·heads_q·seqlen_q·seqlen_k floats, a size only tests ask for.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_philox.h"
#include "cpu_engine.h"

fa_status fa_cpu_attn_probs(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = fa_cpu_select_kernels();
    const int64_t d = p->head_dim, sq = p->seqlen_q, sk = p->seqlen_k, hq = p->heads_q;
    const size_t elem = fa_dtype_bytes(p->dtype);
    float *buf = malloc(sizeof(float) * (size_t)(2 * d + (sk > 0 ? sk : 1)));
    if (!buf) return fa_set_error(FA_ERR_ALLOC, "CPU engine: cannot allocate the attn_probs row buffers");
    float *q_row = buf, *k_row = buf + d, *scores = buf + 2 * d;
    memset(p->attn_probs, 0, sizeof(float) * (size_t)(p->batch * hq * sq * sk));
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq seq = fa_sequence(pb, b);
        for (int64_t h = 0; h < hq; h++) {
            const int64_t kv_head = h / pb->group;
            const float slope = p->alibi_slopes ? p->alibi_slopes[b * p->alibi_batch_stride + h] : 0.0f;
            for (int64_t i = 0; i < seq.len_q; i++) {
                int64_t lo, hi;
                fa_key_range(i, seq.len_q, seq.len_k, p->window_left, p->window_right, &lo, &hi);
                int64_t q_off = fa_row_offset(pb, b, seq.q_start, i, h, p->q_batch_stride, p->q_row_stride,
                                              p->q_head_stride);
                kern->to_f32(q_row, (const char *)p->q + q_off * (int64_t)elem, d, p->dtype);
                double row_max = p->sink_logits ? p->sink_logits[h] : -INFINITY;
                for (int64_t j = lo; j < hi; j++) {
                    int64_t k_off = fa_row_offset(pb, b, seq.k_start, j, kv_head, p->k_batch_stride, p->k_row_stride,
                                                  p->k_head_stride);
                    kern->to_f32(k_row, (const char *)p->k + k_off * (int64_t)elem, d, p->dtype);
                    float s = 0.0f;
                    for (int64_t c = 0; c < d; c++) s += q_row[c] * k_row[c];
                    s *= p->softmax_scale;
                    if (p->softcap > 0.0f) s = p->softcap * tanhf(s / p->softcap);
                    if (p->alibi_slopes) s += fa_alibi_bias(slope, i, j, seq.len_q, seq.len_k);
                    scores[j] = s;
                    if (s > row_max) row_max = s;
                }
                if (row_max == -INFINITY) continue; /* nothing visible, no sink: P = 0 */
                double sum = p->sink_logits ? exp(p->sink_logits[h] - row_max) : 0.0;
                for (int64_t j = lo; j < hi; j++) sum += exp((double)scores[j] - row_max);
                const double lse = row_max + log(sum);
                float *out = p->attn_probs + ((b * hq + h) * sq + i) * sk;
                for (int64_t j = lo; j < hi; j++) {
                    float prob = (float)exp((double)scores[j] - lse);
                    if (pb->has_dropout && !fa_dropout_keep(p->dropout_seed, p->dropout_offset, pb->dropout_threshold,
                                                            b, h, hq, i, j))
                        prob = -prob;
                    out[j] = prob;
                }
            }
        }
    }
    free(buf);
    return FA_OK;
}
