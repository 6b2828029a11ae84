/*
 * cpu_item.c: the per-row state of a forward or decode work item (cpu_forward.c, cpu_kvcache.c):
 * key ranges and their span, the score tile's masks, and the normalised output row. Both drivers
 * tile their items the same way (query rows are the lanes of keys-major tiles); they differ in
 * which rows an item holds and where its keys come from. Also the tile transpose and the bf16
 * pair packing (gemm_bf16's B operand) that the forward and backward drivers share.
 */
#include <math.h>

#include "cpu_convert.h"
#include "cpu_engine.h"

void fa_cpu_item_rows_take(fa_cpu_arena *arena, fa_cpu_item_rows *rows) {
    const size_t n = FA_CPU_BLOCK_ROWS;
    rows->max = (float *)fa_cpu_take(arena, sizeof(float) * n);
    rows->sum = (float *)fa_cpu_take(arena, sizeof(float) * n);
    rows->alpha = (float *)fa_cpu_take(arena, sizeof(float) * n);
    rows->slope = (float *)fa_cpu_take(arena, sizeof(float) * n);
    rows->lo_rel = (int32_t *)fa_cpu_take(arena, sizeof(int32_t) * n);
    rows->hi_rel = (int32_t *)fa_cpu_take(arena, sizeof(int32_t) * n);
    rows->diag_rel = (int32_t *)fa_cpu_take(arena, sizeof(int32_t) * n);
    rows->head = (int64_t *)fa_cpu_take(arena, sizeof(int64_t) * n);
    rows->query = (int64_t *)fa_cpu_take(arena, sizeof(int64_t) * n);
    rows->lo = (int64_t *)fa_cpu_take(arena, sizeof(int64_t) * n);
    rows->hi = (int64_t *)fa_cpu_take(arena, sizeof(int64_t) * n);
}

fa_cpu_key_span fa_cpu_item_rows_start(const fa_cpu_item_rows *rows, const fa_problem *pb, int64_t b,
                                       int64_t len_q, int64_t len_k, int64_t n_rows, int64_t n_pad,
                                       int64_t clip_begin, int64_t clip_end) {
    const fa_params *p = &pb->p;
    fa_cpu_key_span span = {len_k, 0, 0, len_k};
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t lo, hi;
        fa_key_range(rows->query[r], len_q, len_k, p->window_left, p->window_right, &lo, &hi);
        if (lo < clip_begin) lo = clip_begin;
        if (hi > clip_end) hi = clip_end;
        rows->lo[r] = lo;
        rows->hi[r] = hi;
        if (lo < hi) {
            if (lo < span.begin) span.begin = lo;
            if (hi > span.end) span.end = hi;
        }
        if (lo > span.full_begin) span.full_begin = lo;
        if (hi < span.full_end) span.full_end = hi;
        rows->slope[r] = p->alibi_slopes ? p->alibi_slopes[b * p->alibi_batch_stride + rows->head[r]] : 0.0f;
    }
    for (int64_t r = n_rows; r < n_pad; r++) rows->slope[r] = 0.0f;
    for (int64_t r = 0; r < n_pad; r++) {
        rows->max[r] = -INFINITY;
        rows->sum[r] = 0.0f;
    }
    return span;
}

void fa_cpu_item_transform(const fa_cpu_kernels *kern, const fa_cpu_item_rows *rows, const fa_params *p, float *s_t,
                           int64_t n_rows, int64_t n_pad, int64_t j0, int64_t n_keys, int64_t shift, int needs_mask) {
    const int apply_softcap = p->softcap > 0.0f, apply_alibi = p->alibi_slopes != NULL;
    if (!apply_softcap && !apply_alibi && !needs_mask) return;
    /* padding lanes see the whole tile, their diagonal at its first key */
    for (int64_t r = 0; r < n_pad; r++) {
        int64_t lo = r < n_rows ? rows->lo[r] : j0, hi = r < n_rows ? rows->hi[r] : j0 + n_keys;
        int64_t diag = r < n_rows ? rows->query[r] + shift : j0;
        rows->lo_rel[r] = fa_cpu_clamp_i32(lo - j0, 0, n_keys);
        rows->hi_rel[r] = fa_cpu_clamp_i32(hi - j0, 0, n_keys);
        rows->diag_rel[r] = fa_cpu_clamp_i32(diag - j0, -FA_CPU_DIAG_LIMIT, FA_CPU_DIAG_LIMIT);
    }
    fa_cpu_score_tile t = {s_t, NULL, n_pad, n_keys, n_pad, 1, apply_softcap, apply_alibi,
                           needs_mask, p->softcap, rows->lo_rel, rows->hi_rel, rows->diag_rel, rows->slope};
    kern->transform_scores(&t);
}

double fa_cpu_item_finish_row(const fa_cpu_item_rows *rows, const fa_params *p, int64_t r, const float *o_row,
                              int64_t dv, float *out) {
    double row_max = rows->max[r], row_sum = rows->sum[r], lse;
    if (isnan(row_sum) || isnan(row_max)) {
        /* a NaN score (NaN or infinite q, k, softcap input) reached the sum: the row is NaN, not
         * a masked row */
        lse = NAN;
        for (int64_t k = 0; k < dv; k++) out[k] = NAN;
    } else if (p->sink_logits) {
        double sink = p->sink_logits[rows->head[r]];
        double top = row_max > sink ? row_max : sink;
        double keys_weight = row_sum > 0.0 ? exp(row_max - top) : 0.0;
        double denominator = row_sum * keys_weight + exp(sink - top);
        float factor = (float)(keys_weight / denominator);
        lse = top + log(denominator);
        for (int64_t k = 0; k < dv; k++) out[k] = o_row[k] * factor;
    } else if (row_sum > 0.0) {
        float sum = rows->sum[r];
        lse = row_max + log(row_sum);
        for (int64_t k = 0; k < dv; k++) out[k] = o_row[k] / sum;
    } else {
        lse = -INFINITY;
        for (int64_t k = 0; k < dv; k++) out[k] = 0.0f;
    }
    return lse;
}

void fa_cpu_transpose_rows(float *dst, int64_t ld, const float *src, int64_t n_rows, int64_t width) {
    for (int64_t k = 0; k < width; k++) {
        float *lane = dst + k * ld;
        for (int64_t r = 0; r < n_rows; r++) lane[r] = src[r * width + k];
        for (int64_t r = n_rows; r < ld; r++) lane[r] = 0.0f;
    }
}

void fa_cpu_pack_pairs_bf16(uint16_t *dst, int64_t ld, const float *src, int64_t src_ld, int64_t n_rows,
                            int64_t width) {
    for (int64_t k = 0; k < width; k += 2) {
        uint16_t *pair_row = dst + k * ld; /* pair k/2 starts at (k/2)·2·ld */
        const int second = k + 1 < width;
        for (int64_t r = 0; r < n_rows; r++) {
            const float *x = src + r * src_ld + k;
            pair_row[2 * r] = (uint16_t)(fa_f32_bits(x[0]) >> 16);
            pair_row[2 * r + 1] = second ? (uint16_t)(fa_f32_bits(x[1]) >> 16) : 0;
        }
        for (int64_t r = 2 * n_rows; r < 2 * ld; r++) pair_row[r] = 0;
    }
}
