/*
 * cpu_forward.c: the CPU engine's tiled forward pass (FlashAttention with an online softmax).
 *
 * Work items. The query rows of one sequence b and one kv head are cut into items of at most
 * FA_CPU_BLOCK_ROWS (64) rows. Normally an item is a block of 64 consecutive query rows of one
 * query head; when a sequence has fewer than 64 queries (decoding), the query heads of a GQA
 * group that share the kv head are packed into one item (row r = head h_first + r / n_i, query
 * i0 + r % n_i), so K/V tiles are read once for the whole group and the SIMD lanes stay full.
 * Items are numbered sequence-major, kv head, head chunk, then query block in reverse (the
 * longest causal blocks first), and threads take them one at a time from an atomic counter.
 * Each output row is produced by exactly one item with a fixed order of operations, so results
 * are bitwise identical for any thread count and run to run.
 *
 * Tiling inside an item (rows_pad = rows rounded up to 16, all fp32 in per-thread scratch):
 *   q_t   [d][rows_pad]          Qᵀ of the item, packed once (rows are the SIMD lanes)
 *   for each key block of FA_CPU_BLOCK_KEYS keys inside the union of the rows' key ranges:
 *     s_t [n_keys][rows_pad] = scale · K Qᵀ         GEMM, A = K rows read in place (fp32 input);
 *                                                   dot products instead for <= 4 rows (decoding);
 *                                                   bf16 input with kern->gemm_bf16: K rows read in
 *                                                   place as bf16, Qᵀ packed once as bf16 pairs
 *     softcap / ALiBi / mask on s_t                  mask only on tiles cut by a row's range
 *     bias / block mask / doc ids (cpu_mods.c)      when set; tiles no block list reaches skipped
 *     online softmax on s_t: per-row max and sum are vectors across the lanes; s_t -> P
 *     o_acc [rows][dv_pad] = o_acc · alpha + P V     GEMM, the rescale folded into its load of C
 *   o = o_acc / row_sum (with the sink in the denominator), lse = max + log(sum)
 * Key blocks outside every row's range are never visited (causal, sliding window).
 * Dropout (dropout_p > 0) scales P by the element's Z (0 or the keep scale, fa_philox.h) after
 * the softmax step has added P to the row sums, before P V.
 * A paged K/V (block_table) is first gathered into a packed copy (fa_cpu_forward_paged), then
 * run as an ordinary (varlen) call; attn_probs is written by a separate pass (cpu_probs.c).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_philox.h"
#include "cpu_engine.h"

#define BLOCK_ROWS FA_CPU_BLOCK_ROWS
#define BLOCK_KEYS FA_CPU_BLOCK_KEYS

/* How the query rows of one sequence are split into items. */
typedef struct fwd_split {
    int64_t heads_per_item; /* query heads of a GQA group packed into one item                  */
    int64_t head_chunks;    /* items needed to cover a group's heads                             */
    int64_t q_blocks;       /* query blocks per head                                             */
    int64_t items;          /* heads_kv · head_chunks · q_blocks                                 */
} fwd_split;

static fwd_split forward_split(const fa_problem *pb, int64_t len_q) {
    fa_cpu_row_packing r = fa_cpu_pack_rows(len_q, pb->group);
    fwd_split s = {r.heads_per_item, r.head_chunks, r.q_blocks, 0};
    s.items = pb->p.heads_kv * s.head_chunks * s.q_blocks;
    return s;
}

typedef struct fwd_ctx {
    const fa_problem *pb;
    const fa_cpu_kernels *kern;
    const int64_t *item_start; /* [batch + 1] first item of each sequence                    */
    atomic_llong next_item;
    int64_t total_items;
    char *scratch;             /* thread t owns scratch + t · scratch_bytes                     */
    size_t scratch_bytes;
    int64_t d, dv, dv_pad;
    int fp32;                  /* fp32 input: K / V rows may be used in place (see forward_item) */
    int bf16dot;               /* bf16 input and kern->gemm_bf16: scores by the bf16 GEMM       */
} fwd_ctx;

/* Per-thread scratch of one item (see the file comment for the shapes). */
typedef struct fwd_scratch {
    float *q_t, *q_rows, *s_t, *o_acc, *k_buf, *v_buf, *row_tmp;
    uint16_t *q_pairs; /* [ceil(d/2)][BLOCK_ROWS][2] Qᵀ for gemm_bf16                         */
    fa_cpu_item_rows row;
} fwd_scratch;

static size_t forward_scratch_layout(const fa_problem *pb, char *base, fwd_scratch *s) {
    int64_t d = pb->p.head_dim, dv = pb->p.head_dim_v;
    int64_t dv_pad = fa_cpu_round_up(dv, FA_CPU_PAD);
    int64_t tmp = d > dv_pad ? d : dv_pad;
    fa_cpu_arena a = {base, 0};
    fwd_scratch dummy;
    if (!s) s = &dummy;
    s->q_t = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d * BLOCK_ROWS));
    s->q_rows = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d * BLOCK_ROWS));
    s->s_t = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_KEYS * BLOCK_ROWS));
    s->o_acc = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_ROWS * dv_pad));
    s->k_buf = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_KEYS * d));
    s->v_buf = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_KEYS * dv_pad));
    s->row_tmp = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)tmp);
    s->q_pairs = (uint16_t *)fa_cpu_take(&a, sizeof(uint16_t) * (size_t)(fa_cpu_round_up(d, 2) * BLOCK_ROWS));
    fa_cpu_item_rows_take(&a, &s->row);
    return a.used;
}

/* One work item: `local` is the item's index within sequence b. */
static void forward_item(fwd_ctx *c, const fwd_scratch *w, int64_t b, int64_t local) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = c->d, dv = c->dv, dv_pad = c->dv_pad;
    const size_t elem = (size_t)fa_dtype_bytes(p->dtype), out_elem = (size_t)fa_dtype_bytes(fa_out_dtype(p->dtype));
    fa_seq seq = fa_sequence(pb, b);
    fwd_split split = forward_split(pb, seq.len_q);

    /* ---- which rows: (kv head, head chunk, query block) ---- */
    int64_t per_kv_head = split.head_chunks * split.q_blocks;
    int64_t kv_head = local / per_kv_head;
    int64_t chunk = (local % per_kv_head) / split.q_blocks;
    int64_t q_block = split.q_blocks - 1 - (local % per_kv_head) % split.q_blocks;
    int64_t head_first = kv_head * pb->group + chunk * split.heads_per_item;
    int64_t n_heads = pb->group - chunk * split.heads_per_item;
    if (n_heads > split.heads_per_item) n_heads = split.heads_per_item;
    int64_t i0 = q_block * BLOCK_ROWS;
    int64_t n_i = seq.len_q - i0 < BLOCK_ROWS ? seq.len_q - i0 : BLOCK_ROWS;
    int64_t rows = n_heads * n_i;
    int64_t rows_pad = fa_cpu_round_up(rows, FA_CPU_PAD);

    /* ---- per-row key ranges, their union and the range every row sees ---- */
    const fa_cpu_item_rows *row = &w->row;
    for (int64_t r = 0; r < rows; r++) {
        row->head[r] = head_first + r / n_i;
        row->query[r] = i0 + r % n_i;
    }
    const fa_cpu_key_span keys = fa_cpu_item_rows_start(row, pb, b, seq.len_q, seq.len_k, rows, rows_pad, 0, seq.len_k);

    /* ---- Qᵀ of the item, padding lanes zero. The rows are first copied as they are (a burst
     * of independent loads from rows far apart in memory), then transposed from L1. ---- */
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = fa_row_offset(pb, b, seq.q_start, row->query[r], row->head[r], p->q_batch_stride,
                                    p->q_row_stride, p->q_head_stride);
        kern->to_f32(w->q_rows + r * d, (const char *)p->q + off * (int64_t)elem, d, p->dtype);
    }
    /* bf16 scores by vdpbf16ps: Qᵀ as bf16 pairs, K rows in place (decoding tiles keep keys_dot) */
    const int bf16dot = c->bf16dot && rows > FA_CPU_DOT_MAX_ROWS;
    if (bf16dot) fa_cpu_pack_pairs_bf16(w->q_pairs, rows_pad, w->q_rows, d, rows, d);
    else fa_cpu_transpose_rows(w->q_t, rows_pad, w->q_rows, rows, d);
    memset(w->o_acc, 0, sizeof(float) * (size_t)(rows * dv_pad));
    /* fp32 K and V rows are used in place (no copy) unless the GEMM would stream them more than
     * twice (one pass per panel of columns): rows of one head lie far apart and conflict in L1,
     * so then a contiguous copy is faster (AVX2: +12-20 %, docs/tuning-log.md) */
    const int k_direct = c->fp32 && rows_pad <= 2 * kern->gemm_panel;
    const int v_direct = c->fp32 && dv == dv_pad && dv_pad <= 2 * kern->gemm_panel;
    if (!v_direct) memset(w->v_buf, 0, sizeof(float) * (size_t)(BLOCK_KEYS * dv_pad));

    /* fp8 inputs: q and k are converted exactly and their descale factors (this item's batch
     * and kv head) folded into the score scale; v's multiplies o once per row */
    const fa_cpu_descale ds = fa_cpu_descale_of(p, b, kv_head);
    const float score_scale = (p->softcap > 0.0f ? p->softmax_scale / p->softcap : p->softmax_scale) * ds.qk;
    const int64_t shift = seq.len_k - seq.len_q;

    const fa_cpu_mod_rows mods = {b, seq, 0, row->head, row->query, 0, 0, rows};

    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += BLOCK_KEYS) {
        int64_t n_keys = keys.end - j0 < BLOCK_KEYS ? keys.end - j0 : BLOCK_KEYS;
        if (pb->has_block_mask && !fa_cpu_mods_see_keys(pb, &mods, j0, j0 + n_keys)) continue; /* unlisted */

        /* K as the GEMM's A operand (row j at k_rows + j·ldk), V as B (row j at v_rows + j·ldv) */
        const float *k_rows, *v_rows;
        int64_t ldk, ldv;
        int64_t k_off = fa_row_offset(pb, b, seq.k_start, j0, kv_head, p->k_batch_stride, p->k_row_stride,
                                      p->k_head_stride);
        int64_t v_off = fa_row_offset(pb, b, seq.k_start, j0, kv_head, p->v_batch_stride, p->v_row_stride,
                                      p->v_head_stride);
        if (bf16dot) {
            k_rows = NULL; /* the bf16 GEMM reads the caller's rows itself */
            ldk = 0;
        } else if (k_direct) {
            k_rows = (const float *)p->k + k_off;
            ldk = p->k_row_stride;
        } else {
            for (int64_t j = 0; j < n_keys; j++)
                kern->to_f32(w->k_buf + j * d, (const char *)p->k + (k_off + j * p->k_row_stride) * (int64_t)elem, d,
                             p->dtype);
            k_rows = w->k_buf;
            ldk = d;
        }
        if (v_direct) {
            v_rows = (const float *)p->v + v_off;
            ldv = p->v_row_stride;
        } else {
            for (int64_t j = 0; j < n_keys; j++)
                kern->to_f32(w->v_buf + j * dv_pad, (const char *)p->v + (v_off + j * p->v_row_stride) * (int64_t)elem,
                             dv, p->dtype);
            v_rows = w->v_buf;
            ldv = dv_pad;
        }

        /* s_t[j][r] = scale · k_j · q_r: a GEMM, or dot products when a few rows (decoding) would
         * leave most of the GEMM's lanes empty */
        if (bf16dot) {
            fa_cpu_gemm_bf16_args qk = {n_keys, rows_pad, d, (const uint16_t *)p->k + k_off, p->k_row_stride,
                                        w->q_pairs, rows_pad, w->s_t, rows_pad, score_scale};
            kern->gemm_bf16(&qk);
        } else if (rows <= FA_CPU_DOT_MAX_ROWS) {
            kern->keys_dot(k_rows, ldk, n_keys, w->q_rows, d, rows, d, score_scale, w->s_t, rows_pad, rows_pad, v_rows,
                           ldv, dv);
        } else {
            fa_cpu_gemm_args qk = {n_keys, rows_pad, d, k_rows, ldk, 1, w->q_t, rows_pad, w->s_t, rows_pad,
                                   FA_CPU_GEMM_STORE, score_scale, NULL};
            kern->gemm(&qk);
        }

        int needs_mask = pb->has_mask && !(keys.full_begin <= j0 && j0 + n_keys <= keys.full_end);
        fa_cpu_item_transform(kern, row, p, w->s_t, rows, rows_pad, j0, n_keys, shift, needs_mask);
        if (pb->has_mods) fa_cpu_apply_mods(pb, &mods, w->s_t, rows_pad, 1, j0, n_keys); /* bias, blocks, docs */

        /* online softmax: s_t -> P, row max / sum updated, alpha = exp(old max - new max) */
        kern->softmax_step(w->s_t, rows_pad, n_keys, rows_pad, row->max, row->sum, row->alpha);
        /* dropout acts on P after the row sums took it whole: O = Σ Z·P·v / Σ P, LSE unchanged */
        if (pb->has_dropout)
            for (int64_t r = 0; r < rows; r++)
                fa_dropout_apply_row(p->dropout_seed, p->dropout_offset, pb->dropout_threshold,
                                     pb->dropout_keep_scale, b, row->head[r], p->heads_q, row->query[r], j0,
                                     n_keys, w->s_t + r, rows_pad);

        /* o_acc[r][:] = o_acc[r][:] · alpha[r] + sum_j P[j][r] · v_j */
        fa_cpu_gemm_args pv = {rows, dv_pad, n_keys, w->s_t, 1, rows_pad, v_rows, ldv, w->o_acc, dv_pad,
                               FA_CPU_GEMM_SCALE_ROWS, 1.0f, row->alpha};
        kern->gemm(&pv);
    }

    /* ---- normalise, add the sink to the denominator, store o and lse ---- */
    for (int64_t r = 0; r < rows; r++) {
        int64_t h = row->head[r], i = row->query[r];
        double lse = fa_cpu_item_finish_row(row, p, r, w->o_acc + r * dv_pad, dv, w->row_tmp);
        fa_cpu_scale_row(w->row_tmp, dv, ds.v);
        int64_t off = fa_row_offset(pb, b, seq.q_start, i, h, p->o_batch_stride, p->o_row_stride, p->o_head_stride);
        kern->from_f32((char *)p->o + off * (int64_t)out_elem, w->row_tmp, dv, fa_out_dtype(p->dtype));
        if (p->lse) p->lse[fa_lse_offset(pb, b, seq.q_start, h) + i] = (float)lse;
    }
}

static void forward_task(void *arg, int thread_index) {
    fwd_ctx *c = (fwd_ctx *)arg;
    fwd_scratch w;
    forward_scratch_layout(c->pb, c->scratch + (size_t)thread_index * c->scratch_bytes, &w);
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        int64_t b = fa_cpu_item_sequence(c->item_start, c->pb->p.batch, item);
        forward_item(c, &w, b, item - c->item_start[b]);
    }
}

static size_t forward_workspace_unpaged(const fa_problem *pb) {
    size_t per_thread = fa_cpu_align64(forward_scratch_layout(pb, NULL, NULL));
    size_t starts = fa_cpu_align64(sizeof(int64_t) * (size_t)(pb->p.batch + 1));
    return 64 + starts + (size_t)fa_cpu_thread_count(pb) * per_thread;
}

/* Paged K/V: bytes of the packed copy (batch · seqlen_k keys at most). */
static size_t paged_copy_bytes(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const size_t elem = (size_t)fa_dtype_bytes(p->dtype);
    return fa_cpu_align64((size_t)(p->batch * p->seqlen_k * p->heads_kv * (p->head_dim + p->head_dim_v)) * elem);
}

size_t fa_cpu_forward_workspace(const fa_problem *pb) {
    size_t bytes = forward_workspace_unpaged(pb);
    if (pb->p.block_table) bytes += paged_copy_bytes(pb);
    return bytes;
}

static fa_status forward_unpaged(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    fa_cpu_workspace ws;
    if (!fa_cpu_workspace_acquire(pb, forward_workspace_unpaged(pb), &ws)) return FA_ERR_ALLOC;

    fwd_ctx c;
    fa_cpu_arena arena = {ws.base, 0};
    int64_t *item_start = (int64_t *)fa_cpu_take(&arena, sizeof(int64_t) * (size_t)(p->batch + 1));
    item_start[0] = 0;
    for (int64_t b = 0; b < p->batch; b++) item_start[b + 1] = item_start[b] + forward_split(pb, fa_sequence(pb, b).len_q).items;

    c.pb = pb;
    c.kern = fa_cpu_select_kernels();
    c.item_start = item_start;
    atomic_init(&c.next_item, 0);
    c.total_items = item_start[p->batch];
    c.scratch_bytes = fa_cpu_align64(forward_scratch_layout(pb, NULL, NULL));
    c.scratch = ws.base + arena.used;
    c.d = p->head_dim;
    c.dv = p->head_dim_v;
    c.dv_pad = fa_cpu_round_up(c.dv, FA_CPU_PAD);
    c.fp32 = p->dtype == FA_DTYPE_F32;
    c.bf16dot = p->dtype == FA_DTYPE_BF16 && c.kern->gemm_bf16 != NULL;

    int threads = fa_cpu_thread_count(pb);
    if (threads > c.total_items) threads = (int)c.total_items;
    if (threads > 0) fa_cpu_parallel_run(threads, forward_task, &c);
    fa_cpu_workspace_release(&ws);
    if (p->attn_probs) return fa_cpu_attn_probs(pb);
    return FA_OK;
}

/* A paged K/V: key t of sequence b is row t % page_size of page block_table[b][t / page_size].
 * The keys are copied into packed [rows, heads_kv, d] / [rows, heads_kv, dv] buffers (row
 * cu_seqlens_k[b] + t in varlen, b·seqlen_k + t batched), then the call runs unpaged on them. */
static fa_status forward_paged(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const int64_t hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    const size_t elem = (size_t)fa_dtype_bytes(p->dtype);
    const size_t copy_bytes = paged_copy_bytes(pb), inner_bytes = forward_workspace_unpaged(pb);
    fa_cpu_workspace ws;
    if (!fa_cpu_workspace_acquire(pb, copy_bytes + inner_bytes, &ws)) return FA_ERR_ALLOC;
    const int64_t rows = pb->varlen ? p->cu_seqlens_k[p->batch] : p->batch * p->seqlen_k;
    char *k_packed = ws.base, *v_packed = ws.base + (size_t)(rows * hkv * d) * elem;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq seq = fa_sequence(pb, b);
        const int64_t first = pb->varlen ? seq.k_start : b * p->seqlen_k;
        for (int64_t t = 0; t < seq.len_k; t++) {
            const int64_t page = p->block_table[b * p->block_table_batch_stride + t / p->page_size];
            const int64_t in_page = t % p->page_size;
            for (int64_t h = 0; h < hkv; h++) {
                const int64_t k_off = page * p->k_batch_stride + in_page * p->k_row_stride + h * p->k_head_stride;
                const int64_t v_off = page * p->v_batch_stride + in_page * p->v_row_stride + h * p->v_head_stride;
                memcpy(k_packed + (size_t)(((first + t) * hkv + h) * d) * elem, (const char *)p->k + k_off * (int64_t)elem,
                       (size_t)d * elem);
                memcpy(v_packed + (size_t)(((first + t) * hkv + h) * dv) * elem, (const char *)p->v + v_off * (int64_t)elem,
                       (size_t)dv * elem);
            }
        }
    }
    fa_problem inner = *pb;
    fa_params *ip = &inner.p;
    ip->block_table = NULL;
    ip->page_size = 0;
    ip->num_pages = 0;
    ip->k = k_packed;
    ip->v = v_packed;
    ip->k_batch_stride = pb->varlen ? 0 : p->seqlen_k * hkv * d;
    ip->k_row_stride = hkv * d;
    ip->k_head_stride = d;
    ip->v_batch_stride = pb->varlen ? 0 : p->seqlen_k * hkv * dv;
    ip->v_row_stride = hkv * dv;
    ip->v_head_stride = dv;
    ip->total_k = rows;
    ip->workspace = ws.base + copy_bytes;
    ip->workspace_bytes = inner_bytes;
    fa_status s = forward_unpaged(&inner);
    fa_cpu_workspace_release(&ws);
    return s;
}

fa_status fa_cpu_forward(const fa_problem *pb) {
    return pb->p.block_table ? forward_paged(pb) : forward_unpaged(pb);
}
