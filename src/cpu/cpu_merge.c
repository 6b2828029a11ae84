/*
 * cpu_merge.c: fa_merge_states on the CPU, and the row merge (cpu_merge.h) it shares with the
 * split-KV paths of cpu_kvcache.c and cpu_decode.c (fa_cpu_merge_splits).
 *
 * Work items are blocks of MERGE_BLOCK (row, head) pairs, taken by the threads from an atomic
 * counter; each output row depends on its own inputs only, so the result does not depend on the
 * thread count. Small merges run on the calling thread (a pool wake-up costs more than them).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_merge.h"

#define MERGE_BLOCK 64
/* Rows of a split-KV merge work item. */
#define SPLIT_MERGE_ROWS 32
/* Below this many input elements (states × rows × heads × head_dim_v) one thread does it all. */
#define MERGE_SERIAL_ELEMENTS ((int64_t)1 << 16)

float fa_cpu_merge_row(const fa_cpu_merge_row_args *a, float *out) {
    double acc[FA_MAX_HEAD_DIM];
    float row[FA_MAX_HEAD_DIM];
    const int64_t dim = a->dim;
    const size_t elem = fa_dtype_bytes(a->o_dtype);

    /* the largest logit among the non-empty states and the sink */
    double top = a->sink ? (double)*a->sink : -INFINITY;
    int saw_nan = a->sink && isnan(*a->sink);
    for (int64_t s = 0; s < a->n_states; s++) {
        float lse = a->lse[s * a->lse_stride];
        if (isnan(lse)) saw_nan = 1;
        else if (lse > top) top = lse;
    }
    if (saw_nan || top == INFINITY) {
        for (int64_t c = 0; c < dim; c++) out[c] = NAN;
        return NAN;
    }
    if (top == -INFINITY) {
        for (int64_t c = 0; c < dim; c++) out[c] = 0.0f;
        return -INFINITY;
    }

    double total = a->sink ? exp((double)*a->sink - top) : 0.0;
    for (int64_t s = 0; s < a->n_states; s++) {
        float lse = a->lse[s * a->lse_stride];
        if (lse > -INFINITY) total += exp((double)lse - top);
    }
    for (int64_t c = 0; c < dim; c++) acc[c] = 0.0;
    for (int64_t s = 0; s < a->n_states; s++) {
        float lse = a->lse[s * a->lse_stride];
        if (!(lse > -INFINITY)) continue; /* empty state: its o is never read */
        double weight = exp((double)lse - top) / total;
        const char *src = (const char *)a->o + s * a->o_stride * (int64_t)elem;
        const float *values = (const float *)src;
        if (a->o_dtype != FA_DTYPE_F32) {
            a->kern->to_f32(row, src, dim, a->o_dtype);
            values = row;
        }
        for (int64_t c = 0; c < dim; c++) acc[c] += weight * (double)values[c];
    }
    for (int64_t c = 0; c < dim; c++) out[c] = (float)acc[c];
    return (float)(top + log(total));
}

/* ---- fa_merge_states ------------------------------------------------------------------------- */

typedef struct merge_ctx {
    const fa_merge_params *m;
    const fa_cpu_kernels *kern;
    atomic_llong next_block;
    int64_t pairs, blocks; /* (row, head) pairs and blocks of MERGE_BLOCK of them           */
} merge_ctx;

static void merge_pair(const merge_ctx *c, int64_t row, int64_t head) {
    const fa_merge_params *m = c->m;
    const size_t parts_elem = fa_dtype_bytes(m->parts_dtype);
    const size_t out_elem = fa_dtype_bytes(m->out_dtype);
    float merged[FA_MAX_HEAD_DIM];
    fa_cpu_merge_row_args a;
    a.n_states = m->num_states;
    a.dim = m->head_dim_v;
    a.lse = m->lse_parts + head * m->lse_parts_head_stride + row * m->lse_parts_row_stride;
    a.lse_stride = m->lse_parts_state_stride;
    a.o = (const char *)m->o_parts +
          (row * m->o_parts_row_stride + head * m->o_parts_head_stride) * (int64_t)parts_elem;
    a.o_stride = m->o_parts_state_stride;
    a.o_dtype = m->parts_dtype;
    a.sink = NULL;
    a.kern = c->kern;
    float lse = fa_cpu_merge_row(&a, merged);
    char *dst = (char *)m->o + (row * m->o_row_stride + head * m->o_head_stride) * (int64_t)out_elem;
    c->kern->from_f32(dst, merged, m->head_dim_v, m->out_dtype);
    if (m->lse) m->lse[head * m->lse_head_stride + row * m->lse_row_stride] = lse;
}

static void merge_task(void *arg, int thread_index) {
    merge_ctx *c = (merge_ctx *)arg;
    (void)thread_index;
    for (;;) {
        int64_t block = atomic_fetch_add(&c->next_block, 1);
        if (block >= c->blocks) break;
        int64_t end = (block + 1) * MERGE_BLOCK < c->pairs ? (block + 1) * MERGE_BLOCK : c->pairs;
        for (int64_t pair = block * MERGE_BLOCK; pair < end; pair++)
            merge_pair(c, pair / c->m->heads, pair % c->m->heads);
    }
}

fa_status fa_cpu_merge_states(const fa_merge_params *m) {
    merge_ctx c;
    c.m = m;
    c.kern = fa_cpu_select_kernels();
    atomic_init(&c.next_block, 0);
    c.pairs = m->rows * m->heads;
    c.blocks = (c.pairs + MERGE_BLOCK - 1) / MERGE_BLOCK;
    int64_t threads = m->num_threads > 0 ? m->num_threads : fa_cpu_online_cores();
    if (threads > FA_CPU_MAX_THREADS) threads = FA_CPU_MAX_THREADS;
    if (threads > c.blocks) threads = c.blocks;
    if (c.pairs * m->num_states * m->head_dim_v < MERGE_SERIAL_ELEMENTS) threads = 1;
    fa_cpu_parallel_run((int)threads, merge_task, &c);
    return FA_OK;
}

/* ---- the split-KV merge of fa_kvcache_forward ------------------------------------------------ */

typedef struct split_merge_ctx {
    const fa_params *p;
    const fa_cpu_kernels *kern;
    int64_t splits;
    const float *lse_part, *o_part;
    atomic_llong next_item;
    int64_t total_items;
} split_merge_ctx;

static void split_merge_task(void *arg, int thread_index) {
    split_merge_ctx *c = (split_merge_ctx *)arg;
    const fa_params *p = c->p;
    const int64_t rows = p->batch * p->heads_q * p->seqlen_q, dv = p->head_dim_v;
    const int64_t es = fa_dtype_bytes(p->dtype);
    float merged[FA_MAX_HEAD_DIM];
    (void)thread_index;
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        int64_t end = (item + 1) * SPLIT_MERGE_ROWS < rows ? (item + 1) * SPLIT_MERGE_ROWS : rows;
        for (int64_t row = item * SPLIT_MERGE_ROWS; row < end; row++) {
            int64_t i = row % p->seqlen_q, h = (row / p->seqlen_q) % p->heads_q, b = row / (p->seqlen_q * p->heads_q);
            fa_cpu_merge_row_args a;
            a.n_states = c->splits;
            a.dim = dv;
            a.lse = c->lse_part + row;
            a.lse_stride = rows;
            a.o = c->o_part + row * dv;
            a.o_stride = rows * dv;
            a.o_dtype = FA_DTYPE_F32;
            a.sink = p->sink_logits ? &p->sink_logits[h] : NULL;
            a.kern = c->kern;
            float lse = fa_cpu_merge_row(&a, merged);
            int64_t off = b * p->o_batch_stride + i * p->o_row_stride + h * p->o_head_stride;
            c->kern->from_f32((char *)p->o + off * es, merged, dv, p->dtype);
            if (p->lse) p->lse[row] = lse;
        }
    }
}

void fa_cpu_merge_splits(const fa_params *p, const fa_cpu_kernels *kern, int64_t splits, const float *lse_part,
                         const float *o_part, int threads) {
    split_merge_ctx c = {.p = p, .kern = kern, .splits = splits, .lse_part = lse_part, .o_part = o_part};
    c.total_items = (p->batch * p->heads_q * p->seqlen_q + SPLIT_MERGE_ROWS - 1) / SPLIT_MERGE_ROWS;
    atomic_init(&c.next_item, 0);
    fa_cpu_parallel_run(threads < c.total_items ? threads : (int)c.total_items, split_merge_task, &c);
}
