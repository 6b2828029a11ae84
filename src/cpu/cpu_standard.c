/*
 * cpu_standard.c: "standard attention", the materialised baseline of the FlashAttention paper,
 * for comparison only.
 *
 * Per (sequence, query head), the paper's Algorithm 0 in separate passes over full fp32
 * matrices, as a framework running one operator after another would:
 *   S [len_q][len_k] = scale · Q Kᵀ         (the engine's SIMD GEMM, Kᵀ packed once)
 *   S = softcap · tanh(S / softcap)          (if softcap)
 *   S += ALiBi bias                          (if alibi)
 *   S = -inf outside each row's key range    (if a mask)
 *   P [len_q][len_k] = softmax(S) row by row with libm expf (the sink joins the denominator),
 *                      LSE = max + log(sum)
 *   O = P V                                  (the engine's SIMD GEMM)
 * Work items are (sequence, query head), threads take them from an atomic counter. Each thread
 * holds S and P: O(seqlen_q · seqlen_k) memory per thread, the cost the tiled engine avoids.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_engine.h"

typedef struct std_ctx {
    const fa_problem *pb;
    const fa_cpu_kernels *kern;
    atomic_llong next_item;
    int64_t total_items; /* batch · heads_q                                                   */
    char *scratch;
    size_t scratch_bytes;
    int64_t d, dv, dv_pad, keys_pad_max;
} std_ctx;

typedef struct std_scratch {
    float *scores, *probs, *k_t, *v_rows, *q_rows, *o_rows, *row_tmp;
} std_scratch;

static size_t standard_scratch_layout(const fa_problem *pb, char *base, std_scratch *s) {
    const fa_params *p = &pb->p;
    int64_t max_q = p->seqlen_q, max_k = p->seqlen_k;
    int64_t keys_pad = fa_cpu_round_up(max_k, FA_CPU_PAD);
    int64_t d = p->head_dim, dv_pad = fa_cpu_round_up(p->head_dim_v, FA_CPU_PAD);
    fa_cpu_arena a = {base, 0};
    std_scratch dummy;
    if (!s) s = &dummy;
    s->scores = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(max_q * keys_pad));
    s->probs = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(max_q * keys_pad));
    s->k_t = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d * keys_pad));
    s->v_rows = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(max_k * dv_pad));
    s->q_rows = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(max_q * d));
    s->o_rows = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(max_q * dv_pad));
    s->row_tmp = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d > dv_pad ? d : dv_pad));
    return a.used;
}

static void standard_item(std_ctx *c, const std_scratch *w, int64_t b, int64_t h) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = c->d, dv = c->dv, dv_pad = c->dv_pad;
    const size_t elem = fa_dtype_bytes(p->dtype);
    fa_seq seq = fa_sequence(pb, b);
    const int64_t len_q = seq.len_q, len_k = seq.len_k, kv_head = h / pb->group;
    const int64_t keys_pad = fa_cpu_round_up(len_k, FA_CPU_PAD);
    if (len_q == 0) return;

    /* Kᵀ [d][keys_pad] and V [len_k][dv_pad] in fp32, padding zero */
    memset(w->k_t, 0, sizeof(float) * (size_t)(d * keys_pad));
    for (int64_t j = 0; j < len_k; j++) {
        int64_t k_off = fa_row_offset(pb, b, seq.k_start, j, kv_head, p->k_batch_stride, p->k_row_stride, p->k_head_stride);
        int64_t v_off = fa_row_offset(pb, b, seq.k_start, j, kv_head, p->v_batch_stride, p->v_row_stride, p->v_head_stride);
        kern->to_f32(w->row_tmp, (const char *)p->k + k_off * (int64_t)elem, d, p->dtype);
        for (int64_t k = 0; k < d; k++) w->k_t[k * keys_pad + j] = w->row_tmp[k];
        kern->to_f32(w->v_rows + j * dv_pad, (const char *)p->v + v_off * (int64_t)elem, dv, p->dtype);
        for (int64_t k = dv; k < dv_pad; k++) w->v_rows[j * dv_pad + k] = 0.0f;
    }
    for (int64_t i = 0; i < len_q; i++) {
        int64_t q_off = fa_row_offset(pb, b, seq.q_start, i, h, p->q_batch_stride, p->q_row_stride, p->q_head_stride);
        kern->to_f32(w->q_rows + i * d, (const char *)p->q + q_off * (int64_t)elem, d, p->dtype);
    }

    /* S = scale · Q Kᵀ */
    float *scores = w->scores;
    fa_cpu_gemm_args qk = {len_q, keys_pad, d, w->q_rows, d, 1, w->k_t, keys_pad, scores, keys_pad,
                           FA_CPU_GEMM_STORE, p->softmax_scale, NULL};
    kern->gemm(&qk);

    if (p->softcap > 0.0f) {
        for (int64_t i = 0; i < len_q; i++)
            for (int64_t j = 0; j < len_k; j++) {
                float *s = &scores[i * keys_pad + j];
                *s = p->softcap * tanhf(*s / p->softcap);
            }
    }
    if (p->alibi_slopes) {
        float slope = p->alibi_slopes[b * p->alibi_batch_stride + h];
        for (int64_t i = 0; i < len_q; i++)
            for (int64_t j = 0; j < len_k; j++) scores[i * keys_pad + j] += fa_alibi_bias(slope, i, j, len_q, len_k);
    }
    if (pb->has_mask) {
        for (int64_t i = 0; i < len_q; i++) {
            int64_t lo, hi;
            fa_key_range(i, len_q, len_k, p->window_left, p->window_right, &lo, &hi);
            for (int64_t j = 0; j < len_k; j++)
                if (j < lo || j >= hi) scores[i * keys_pad + j] = -INFINITY;
        }
    }

    /* P = softmax(S) by rows; padding columns become 0 so the P V GEMM can run over keys_pad */
    int64_t lse_base = fa_lse_offset(pb, b, seq.q_start, h);
    for (int64_t i = 0; i < len_q; i++) {
        const float *row = scores + i * keys_pad;
        float *prob = w->probs + i * keys_pad;
        float row_max = p->sink_logits ? p->sink_logits[h] : -INFINITY;
        int saw_nan = 0; /* a NaN score makes the row NaN (a max that skips it would not) */
        for (int64_t j = 0; j < len_k; j++) {
            row_max = row[j] > row_max ? row[j] : row_max;
            saw_nan |= isnan(row[j]);
        }
        if (saw_nan) row_max = NAN;
        float row_sum = 0.0f, lse = -INFINITY;
        if (row_max != -INFINITY) {
            for (int64_t j = 0; j < len_k; j++) {
                prob[j] = expf(row[j] - row_max);
                row_sum += prob[j];
            }
            if (p->sink_logits) row_sum += expf(p->sink_logits[h] - row_max);
            for (int64_t j = 0; j < len_k; j++) prob[j] /= row_sum;
            lse = row_max + logf(row_sum);
        } else {
            for (int64_t j = 0; j < len_k; j++) prob[j] = 0.0f;
        }
        for (int64_t j = len_k; j < keys_pad; j++) prob[j] = 0.0f;
        if (p->lse) p->lse[lse_base + i] = lse;
    }

    /* O = P V */
    if (len_k > 0) {
        fa_cpu_gemm_args pv = {len_q, dv_pad, len_k, w->probs, keys_pad, 1, w->v_rows, dv_pad, w->o_rows, dv_pad,
                               FA_CPU_GEMM_STORE, 1.0f, NULL};
        kern->gemm(&pv);
    } else {
        memset(w->o_rows, 0, sizeof(float) * (size_t)(len_q * dv_pad));
    }
    for (int64_t i = 0; i < len_q; i++) {
        int64_t o_off = fa_row_offset(pb, b, seq.q_start, i, h, p->o_batch_stride, p->o_row_stride, p->o_head_stride);
        kern->from_f32((char *)p->o + o_off * (int64_t)elem, w->o_rows + i * dv_pad, dv, p->dtype);
    }
}

static void standard_task(void *arg, int thread_index) {
    std_ctx *c = (std_ctx *)arg;
    std_scratch w;
    standard_scratch_layout(c->pb, c->scratch + (size_t)thread_index * c->scratch_bytes, &w);
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        standard_item(c, &w, item / c->pb->p.heads_q, item % c->pb->p.heads_q);
    }
}

fa_status fa_cpu_standard_forward(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    std_ctx c;
    c.pb = pb;
    c.kern = fa_cpu_select_kernels();
    atomic_init(&c.next_item, 0);
    c.total_items = p->batch * p->heads_q;
    c.d = p->head_dim;
    c.dv = p->head_dim_v;
    c.dv_pad = fa_cpu_round_up(c.dv, FA_CPU_PAD);
    c.scratch_bytes = fa_cpu_align64(standard_scratch_layout(pb, NULL, NULL));
    int threads = fa_cpu_thread_count(pb);
    if (threads > c.total_items) threads = (int)c.total_items;
    void *memory = malloc((size_t)threads * c.scratch_bytes + 64);
    if (!memory)
        return fa_set_error(FA_ERR_ALLOC, "standard attention: cannot allocate %zu bytes of score matrices",
                            (size_t)threads * c.scratch_bytes + 64);
    c.scratch = (char *)(((uintptr_t)memory + 63) & ~(uintptr_t)63);
    fa_cpu_parallel_run(threads, standard_task, &c);
    free(memory);
    return FA_OK;
}
