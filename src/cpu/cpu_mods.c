/*
 * cpu_mods.c: the score modifications of the CPU engine in one place: the additive bias, document
 * ids and the block-sparse mask (fa_params.bias, doc_ids_*, kv_num_blocks ...). Every driver
 * (forward, both backward passes, the dbias pass, the KV-cache paths) calls fa_cpu_apply_mods on
 * a score tile after softcap and ALiBi, and fa_cpu_mods_see_keys to skip key tiles that no row's
 * block list reaches.
 *
 * Element (i, j) of sequence b, head h is visible iff
 *   block mask given: its block (i / block_q, j / block_k) is listed full, or listed partial and
 *     the element masks hold;  no block mask: the element masks hold;
 *   element masks: j in fa_key_range(i) for the element window (causal / window), the same
 *     document (doc_ids), and its bit in partial_block_bits (partial blocks, when given).
 * A visible score becomes s + bias[b, h, i, j]; an invisible one -inf (whatever s and the bias
 * hold, so a NaN bias of a masked element does not reach the row).
 */
#include <math.h>

#include "cpu_convert.h"
#include "cpu_engine.h"

/* First position n in list[0 .. count) with list[n] >= value (count if none). */
static int32_t lower_bound(const int32_t *list, int32_t count, int64_t value) {
    int32_t lo = 0, hi = count;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (list[mid] < value) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The block lists of (b, h, query block qb): partial and full, with their counts, and the
 * element offset of the partial list in kv_indices (for partial_block_bits). */
typedef struct block_lists {
    const int32_t *part, *full;
    int32_t n_part, n_full;
    int64_t part_offset;
} block_lists;

static block_lists lists_of(const fa_params *p, int64_t b, int64_t h, int64_t qb) {
    block_lists l;
    const int64_t c_off = b * p->block_count_batch_stride + h * p->block_count_head_stride + qb;
    l.part_offset = b * p->block_index_batch_stride + h * p->block_index_head_stride + qb * p->block_index_row_stride;
    l.part = p->kv_indices + l.part_offset;
    l.n_part = p->kv_num_blocks[c_off];
    l.full = p->full_kv_indices ? p->full_kv_indices + l.part_offset : NULL;
    l.n_full = p->full_kv_indices ? p->full_kv_num_blocks[c_off] : 0;
    return l;
}

static inline int64_t row_head(const fa_cpu_mod_rows *m, int64_t r) { return m->head ? m->head[r] : m->head0; }
static inline int64_t row_query(const fa_cpu_mod_rows *m, int64_t r) { return m->query ? m->query[r] : m->query0 + r; }

int fa_cpu_mods_see_keys(const fa_problem *pb, const fa_cpu_mod_rows *m, int64_t j0, int64_t j1) {
    if (!pb->has_block_mask || j1 <= j0) return j1 > j0;
    const fa_params *p = &pb->p;
    const int64_t kb_first = j0 / p->block_k, kb_last = (j1 - 1) / p->block_k;
    int64_t last_h = -1, last_qb = -1;
    for (int64_t r = 0; r < m->n_rows; r++) {
        const int64_t h = row_head(m, r), qb = row_query(m, r) / p->block_q;
        if (h == last_h && qb == last_qb) continue;
        last_h = h;
        last_qb = qb;
        const block_lists l = lists_of(p, m->b, h, qb);
        int32_t x = lower_bound(l.part, l.n_part, kb_first);
        if (x < l.n_part && l.part[x] <= kb_last) return 1;
        x = l.full ? lower_bound(l.full, l.n_full, kb_first) : 0;
        if (x < l.n_full && l.full[x] <= kb_last) return 1;
    }
    return 0;
}

static inline float load_bias(const void *bias, fa_dtype dtype, int64_t at) {
    if (dtype == FA_DTYPE_F32) return ((const float *)bias)[at];
    const uint16_t x = ((const uint16_t *)bias)[at];
    return dtype == FA_DTYPE_F16 ? fa_f16_to_f32(x) : fa_bf16_to_f32(x);
}

enum { BLOCK_NONE = 0, BLOCK_PARTIAL = 1, BLOCK_FULL = 2 };

void fa_cpu_apply_mods(const fa_problem *pb, const fa_cpu_mod_rows *m, float *s, int64_t ld, int keys_major,
                       int64_t j0, int64_t n_keys) {
    const fa_params *p = &pb->p;
    const int64_t b = m->b, len_q = m->seq.len_q, len_k = m->seq.len_k;
    const int64_t lane_step = keys_major ? ld : 1; /* distance between keys j and j + 1 */
    const int varlen = pb->varlen;
    for (int64_t r = 0; r < m->n_rows; r++) {
        const int64_t h = row_head(m, r), i = row_query(m, r);
        float *row = keys_major ? s + r : s + r * ld;
        int64_t lo, hi;
        fa_key_range(i, len_q, len_k, pb->elem_window_left, pb->elem_window_right, &lo, &hi);
        const int32_t *doc_k = NULL;
        int32_t doc_q = 0;
        if (p->doc_ids_q) {
            doc_q = p->doc_ids_q[varlen ? m->seq.q_start + i : b * p->doc_ids_q_batch_stride + i];
            doc_k = p->doc_ids_k + (varlen ? m->seq.k_start : b * p->doc_ids_k_batch_stride);
        }
        const void *bias = p->bias;
        int64_t bias_row = 0;
        if (bias)
            bias_row = b * p->bias_batch_stride + h * p->bias_head_stride + i * p->bias_row_stride +
                       m->bias_col0 * p->bias_col_stride;
        /* walk the key blocks of the tile; without a block mask the whole tile is one partial run */
        block_lists l = {0};
        int64_t qb = 0, block_k = n_keys > 0 ? n_keys : 1;
        int32_t xp = 0, xf = 0;
        if (pb->has_block_mask) {
            qb = i / p->block_q;
            block_k = p->block_k;
            l = lists_of(p, b, h, qb);
            xp = lower_bound(l.part, l.n_part, j0 / block_k);
            xf = l.full ? lower_bound(l.full, l.n_full, j0 / block_k) : 0;
        }
        for (int64_t j = j0; j < j0 + n_keys;) {
            int64_t run_end = j0 + n_keys, kb = 0;
            int status = BLOCK_PARTIAL;
            const uint8_t *bits = NULL;
            if (pb->has_block_mask) {
                kb = j / block_k;
                if ((kb + 1) * block_k < run_end) run_end = (kb + 1) * block_k;
                while (xp < l.n_part && l.part[xp] < kb) xp++;
                while (xf < l.n_full && l.full[xf] < kb) xf++;
                status = xp < l.n_part && l.part[xp] == kb ? BLOCK_PARTIAL
                       : xf < l.n_full && l.full[xf] == kb ? BLOCK_FULL : BLOCK_NONE;
                if (status == BLOCK_PARTIAL && p->partial_block_bits)
                    bits = p->partial_block_bits + (l.part_offset + xp) * pb->block_bytes;
            }
            for (; j < run_end; j++) {
                float *x = row + (j - j0) * lane_step;
                int visible = status == BLOCK_FULL;
                if (status == BLOCK_PARTIAL) {
                    visible = j >= lo && j < hi && (!doc_k || doc_k[j] == doc_q);
                    if (visible && bits) {
                        const int64_t bit = (i - qb * p->block_q) * block_k + (j - kb * block_k);
                        visible = (bits[bit >> 3] >> (bit & 7)) & 1;
                    }
                }
                if (!visible) *x = -INFINITY;
                else if (bias) *x += load_bias(bias, p->bias_dtype, bias_row + j * p->bias_col_stride);
            }
        }
    }
}
