/*
 * cpu_backward.c: the CPU engine's tiled backward pass (FlashAttention-2 math).
 *
 * Inputs q, k, v, o, lse, dO; outputs dq, dk, dv and dsink. P is recomputed tile by tile from
 * the stored LSE (P = exp(S - LSE)); no seqlen_q × seqlen_k matrix is ever formed. Parallel
 * passes, each over work items taken from an atomic counter:
 *
 *   pass 0, item (b, query head):  D_i = rowsum(dO_i ∘ O_i) for every row (fp32 buffer laid out
 *       like lse) and the item's dsink partial -Σ_i exp(t_h - LSE_i)·D_i; the partials are
 *       summed over b in a fixed order afterwards.
 *
 * then one of two schemes for dQ, dK, dV. Both are built on one key-block step
 * (backward_key_block): dK and dV of FA_CPU_BWD_BLOCK_KEYS keys, accumulated in fp32 over the
 * query heads of the GQA group and their query blocks in a fixed order, rounded to the dtype
 * once. Rows-major tiles (keys are the lanes):
 *         k_t [d][keys_pad], v_t [dv][keys_pad]      packed once per key block
 *         s  [rows][keys_pad] = scale · Q Kᵀ         dp [rows][keys_pad] = dO Vᵀ
 *         s -> P = exp(s - LSE),  dp -> dS = P ∘ (dp - D) (∘ softcap'(·)) · scale
 *         dv_acc += Pᵀ dO,  dk_acc += dSᵀ Q       (fused scheme also: dq_all += dS K)
 *
 *   fused scheme (5 GEMMs per tile pair), item (b, kv head): every key block in order, the
 *       group's dQ accumulated in a per-thread fp32 buffer [group][len_q][d_pad] and stored at
 *       the end. Used when batch · heads_kv >= 2 × online cores (enough items to fill the
 *       machine) and that buffer is at most 64 MiB.
 *   split scheme (7 GEMMs), otherwise:
 *     pass 1, item (b, kv head, key block): the key-block step without dQ;
 *     pass 2, item (b, query head, block of FA_CPU_BLOCK_ROWS queries): dQ of those rows,
 *       recomputing S and dP with keys-major tiles (query rows are the lanes, as in the forward):
 *         q_t [d][rows_pad], do_t [dv][rows_pad]     packed once per item
 *         s_t [keys][rows_pad] = scale · K Qᵀ,  dp_t = V dOᵀ,  -> P, dS as above
 *         dq_acc += dS K
 *
 * bf16 inputs with kern->gemm_bf16 (AVX512-BF16): the two GEMMs whose operands are both inputs,
 * S = Q Kᵀ and dP = dO Vᵀ (both schemes and pass 2), run on bf16 operands (vdpbf16ps): the A rows
 * are the caller's bf16 rows read in place, the B tiles are packed as bf16 pairs instead of the
 * fp32 transposes k_t / v_t / q_t / do_t. P and dS stay fp32, so do the GEMMs that read them.
 *
 * Dropout (dropout_p > 0): the mask Z (0 or the keep scale, fa_philox.h) is regenerated per tile:
 * dP is multiplied by Z before the softmax step (dS = P ∘ (Z ∘ dP - D), D = rowsum(dO ∘ O) still),
 * and P by Z before dV += (Z ∘ P)ᵀ dO.
 *
 * Score modifications (bias, document ids, block mask; cpu_mods.c) are applied on every tile
 * after softcap / ALiBi; tiles that no block list reaches are skipped. dbias (when requested)
 * has a pass of its own after the others, pass 4, item (dbias output block): it recomputes S and
 * dP for the rows and keys that add into its block, in a fixed order over the summed axes, and
 * writes dL/dbias = P ∘ (Z ∘ dP - D) (backward_dbias_item).
 *
 * Every output element is written by exactly one item, whose arithmetic order does not depend
 * on the thread that runs it, and the scheme depends on the problem and the machine's core
 * count, not on num_threads: results are bitwise identical for any thread count and run to run
 * (on one machine). No atomics, no per-thread partial sums of outputs.
 * Tiles outside every row's key range are skipped; the mask is applied only on cut tiles.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_philox.h"
#include "cpu_convert.h"
#include "cpu_engine.h"

#define BLOCK_ROWS FA_CPU_BLOCK_ROWS     /* split pass 2: query rows per item                   */
#define BLOCK_KEYS FA_CPU_BLOCK_KEYS     /* split pass 2: keys per tile                        */
#define KV_KEYS FA_CPU_BWD_BLOCK_KEYS    /* key-block step: keys per block                     */
#define KV_ROWS FA_CPU_BWD_BLOCK_ROWS    /* key-block step: query rows per tile                */

typedef struct bwd_ctx {
    const fa_problem *pb;
    const fa_cpu_kernels *kern;
    float *dsum;            /* D, laid out like lse                                            */
    double *dsink_partial;  /* [batch][heads_q]                                                */
    int64_t *item_start;    /* [batch + 1] first item of each sequence in the current pass     */
    atomic_llong next_item;
    int64_t total_items;
    int pass;  /* 0: D and dsink, 1: dK/dV per key block, 2: dQ per query block, 3: fused,
                  4: dbias per output block                                                   */
    int fused;
    char *scratch;
    size_t scratch_bytes;
    int64_t d, dv, d_pad, dv_pad;
    size_t elem;               /* bytes per element of q, k, v (dtype)                            */
    fa_dtype io_dtype;         /* o, dout, dq, dk, dv: the dtype, bf16 for fp8 inputs             */
    size_t io_elem;
    int q_direct, do_direct;   /* fp32 rows with padded width usable in place (pass 1)        */
    int k_direct, v_direct;    /* same for K (A and B operand) and V (A operand) in pass 2     */
    int bf16dot;               /* bf16 input and kern->gemm_bf16: S and dP by the bf16 GEMM    */
} bwd_ctx;

typedef struct bwd_scratch {
    /* pass 1 */
    float *k_t, *v_t, *dk_acc, *dv_acc, *q_rows, *do_rows, *s, *dp, *tanh_vals;
    /* pass 2 */
    float *q_t, *do_t, *k_rows, *v_rows, *dq_acc;
    /* fused scheme: dQ of a whole GQA group [group][len_q][d_pad] */
    float *dq_all;
    /* bf16dot: pass 1's k_t / v_t and pass 2's q_t / do_t as gemm_bf16 B operands (bf16 pairs) */
    uint16_t *k_pairs, *v_pairs, *q_pairs, *do_pairs;
    /* both */
    float *row_tmp, *row_tmp2, *stage, *lse, *dsum, *slope;
    int32_t *lo_rel, *hi_rel, *diag_rel;
    /* dbias pass: one output block [BLOCK_ROWS][BLOCK_KEYS] */
    float *dbias_acc;
} bwd_scratch;

static size_t backward_scratch_layout(const fa_problem *pb, int fused, char *base, bwd_scratch *s) {
    int64_t d = pb->p.head_dim, dv = pb->p.head_dim_v;
    int64_t d_pad = fa_cpu_round_up(d, FA_CPU_PAD), dv_pad = fa_cpu_round_up(dv, FA_CPU_PAD);
    int64_t rows_max = BLOCK_ROWS > KV_ROWS ? BLOCK_ROWS : KV_ROWS;
    int64_t tile = BLOCK_KEYS * BLOCK_ROWS > KV_ROWS * KV_KEYS ? BLOCK_KEYS * BLOCK_ROWS : KV_ROWS * KV_KEYS;
    fa_cpu_arena a = {base, 0};
    bwd_scratch dummy;
    if (!s) s = &dummy;
#define TAKE_F32(n) (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(n))
    s->s = TAKE_F32(tile);
    s->dp = TAKE_F32(tile);
    s->tanh_vals = TAKE_F32(tile);
    s->k_t = TAKE_F32(d * KV_KEYS);
    s->v_t = TAKE_F32(dv * KV_KEYS);
    s->dk_acc = TAKE_F32(KV_KEYS * d_pad);
    s->dv_acc = TAKE_F32(KV_KEYS * dv_pad);
    s->q_rows = TAKE_F32(KV_ROWS * d_pad);
    s->do_rows = TAKE_F32(KV_ROWS * dv_pad);
    s->q_t = TAKE_F32(d * BLOCK_ROWS);
    s->do_t = TAKE_F32(dv * BLOCK_ROWS);
    s->k_rows = TAKE_F32((BLOCK_KEYS > KV_KEYS ? BLOCK_KEYS : KV_KEYS) * d_pad);
    s->v_rows = TAKE_F32(BLOCK_KEYS * dv);
    s->dq_acc = TAKE_F32(BLOCK_ROWS * d_pad);
    s->dq_all = fused ? TAKE_F32(pb->group * pb->p.seqlen_q * d_pad) : NULL;
    s->row_tmp = TAKE_F32(d_pad > dv_pad ? d_pad : dv_pad);
    s->row_tmp2 = TAKE_F32(d_pad > dv_pad ? d_pad : dv_pad);
    s->stage = TAKE_F32((rows_max > KV_KEYS ? rows_max : KV_KEYS) * (d_pad > dv_pad ? d_pad : dv_pad));
    s->lse = TAKE_F32(rows_max);
    s->dsum = TAKE_F32(rows_max);
    s->slope = TAKE_F32(rows_max);
    s->dbias_acc = pb->p.dbias ? TAKE_F32(BLOCK_ROWS * BLOCK_KEYS) : NULL;
#undef TAKE_F32
    int64_t d_even = fa_cpu_round_up(d, 2), dv_even = fa_cpu_round_up(dv, 2);
    s->k_pairs = (uint16_t *)fa_cpu_take(&a, sizeof(uint16_t) * (size_t)(d_even * KV_KEYS));
    s->v_pairs = (uint16_t *)fa_cpu_take(&a, sizeof(uint16_t) * (size_t)(dv_even * KV_KEYS));
    s->q_pairs = (uint16_t *)fa_cpu_take(&a, sizeof(uint16_t) * (size_t)(d_even * BLOCK_ROWS));
    s->do_pairs = (uint16_t *)fa_cpu_take(&a, sizeof(uint16_t) * (size_t)(dv_even * BLOCK_ROWS));
    s->lo_rel = (int32_t *)fa_cpu_take(&a, sizeof(int32_t) * (size_t)rows_max);
    s->hi_rel = (int32_t *)fa_cpu_take(&a, sizeof(int32_t) * (size_t)rows_max);
    s->diag_rel = (int32_t *)fa_cpu_take(&a, sizeof(int32_t) * (size_t)rows_max);
    return a.used;
}

/* Convert `n_rows` rows of a caller tensor (row r at base + r·row_stride elements) to fp32 rows
 * of width `width`, leading dimension ld; columns width..ld-1 are zero. */
static void load_rows(const fa_cpu_kernels *kern, float *dst, int64_t ld, const void *base, int64_t row_stride,
                      int64_t n_rows, int64_t width, fa_dtype dtype) {
    size_t elem = (size_t)fa_dtype_bytes(dtype);
    for (int64_t r = 0; r < n_rows; r++) {
        kern->to_f32(dst + r * ld, (const char *)base + r * row_stride * (int64_t)elem, width, dtype);
        for (int64_t k = width; k < ld; k++) dst[r * ld + k] = 0.0f;
    }
}

/* Transposed fp32 copy: dst[k][r] = row r, column k, for r < n_rows; lanes n_rows..ld-1 zero.
 * The rows are first copied as they are into `stage` [n_rows][width] (a burst of independent
 * loads from rows that lie far apart), then transposed from L1. */
static void load_rows_transposed(const fa_cpu_kernels *kern, float *dst, int64_t ld, float *stage, const void *base,
                                 int64_t row_stride, int64_t n_rows, int64_t width, fa_dtype dtype) {
    size_t elem = (size_t)fa_dtype_bytes(dtype);
    for (int64_t r = 0; r < n_rows; r++)
        kern->to_f32(stage + r * width, (const char *)base + r * row_stride * (int64_t)elem, width, dtype);
    fa_cpu_transpose_rows(dst, ld, stage, n_rows, width);
}

/* bf16 rows of a caller tensor as gemm_bf16's B operand: dst [ceil(width/2)][ld][2] pairs, lanes
 * n_rows..ld-1 zero (converted into `stage` [n_rows][width] first, then packed from L1). */
static void load_rows_pairs(const fa_cpu_kernels *kern, uint16_t *dst, int64_t ld, float *stage, const void *base,
                            int64_t row_stride, int64_t n_rows, int64_t width) {
    for (int64_t r = 0; r < n_rows; r++)
        kern->to_f32(stage + r * width, (const uint16_t *)base + r * row_stride, width, FA_DTYPE_BF16);
    fa_cpu_pack_pairs_bf16(dst, ld, stage, width, n_rows, width);
}

/* n_rows rows of a caller tensor as a GEMM operand (row r at element offset off + r·row_stride):
 * the caller's own rows when `direct` (fp32 with a usable width; *ld = row_stride), else
 * converted by load_rows into buf (*ld = buf_ld). */
static const float *operand_rows(const fa_cpu_kernels *kern, int direct, const void *base, int64_t off,
                                 int64_t row_stride, int64_t n_rows, int64_t width, fa_dtype dtype, float *buf,
                                 int64_t buf_ld, int64_t *ld) {
    if (direct) {
        *ld = row_stride;
        return (const float *)base + off;
    }
    size_t elem = (size_t)fa_dtype_bytes(dtype);
    load_rows(kern, buf, buf_ld, (const char *)base + off * (int64_t)elem, row_stride, n_rows, width, dtype);
    *ld = buf_ld;
    return buf;
}

/* ---- pass 0: D = rowsum(dO ∘ O) and dsink partials ---------------------------------------------- */

static void backward_dsum_item(bwd_ctx *c, const bwd_scratch *w, int64_t b, int64_t h) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    fa_seq seq = fa_sequence(pb, b);
    int64_t lse_base = fa_lse_offset(pb, b, seq.q_start, h);
    double sink_sum = 0.0;
    for (int64_t i = 0; i < seq.len_q; i++) {
        int64_t o_off = fa_row_offset(pb, b, seq.q_start, i, h, p->o_batch_stride, p->o_row_stride, p->o_head_stride);
        int64_t do_off =
            fa_row_offset(pb, b, seq.q_start, i, h, p->do_batch_stride, p->do_row_stride, p->do_head_stride);
        c->kern->to_f32(w->row_tmp, (const char *)p->o + o_off * (int64_t)c->io_elem, c->dv, c->io_dtype);
        c->kern->to_f32(w->row_tmp2, (const char *)p->dout + do_off * (int64_t)c->io_elem, c->dv, c->io_dtype);
        double dot = 0.0;
        for (int64_t k = 0; k < c->dv; k++) dot += (double)w->row_tmp[k] * (double)w->row_tmp2[k];
        c->dsum[lse_base + i] = (float)dot;
        float lse = p->lse[lse_base + i];
        if (p->sink_logits && lse != -INFINITY) sink_sum += exp((double)p->sink_logits[h] - (double)lse) * dot;
    }
    c->dsink_partial[b * p->heads_q + h] = -sink_sum;
}

/* ---- pass 1: dK, dV of one key block (and, fused, the block's dQ contributions) ------------------ */

/* dK / dV of keys [j0, j0 + KV_KEYS) of (b, kv_head), summed over the group's query heads and
 * query blocks in a fixed order. If dq_all is non-NULL (fused scheme) the block's dQ
 * contributions dS K are also added to dq_all [group][len_q][d_pad]. */
static void backward_key_block(bwd_ctx *c, const bwd_scratch *w, int64_t b, int64_t kv_head, int64_t j0,
                               float *dq_all) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = c->d, dv = c->dv, d_pad = c->d_pad, dv_pad = c->dv_pad;
    const size_t elem = c->elem;
    fa_seq seq = fa_sequence(pb, b);
    int64_t n_keys = seq.len_k - j0 < KV_KEYS ? seq.len_k - j0 : KV_KEYS;
    int64_t keys_pad = fa_cpu_round_up(n_keys, FA_CPU_PAD);
    int64_t shift = seq.len_k - seq.len_q;

    int64_t k_off = fa_row_offset(pb, b, seq.k_start, j0, kv_head, p->k_batch_stride, p->k_row_stride, p->k_head_stride);
    int64_t v_off = fa_row_offset(pb, b, seq.k_start, j0, kv_head, p->v_batch_stride, p->v_row_stride, p->v_head_stride);
    if (c->bf16dot) {
        load_rows_pairs(kern, w->k_pairs, keys_pad, w->stage, (const uint16_t *)p->k + k_off, p->k_row_stride, n_keys, d);
        load_rows_pairs(kern, w->v_pairs, keys_pad, w->stage, (const uint16_t *)p->v + v_off, p->v_row_stride, n_keys,
                        dv);
    } else {
        load_rows_transposed(kern, w->k_t, keys_pad, w->stage, (const char *)p->k + k_off * (int64_t)elem,
                             p->k_row_stride, n_keys, d, p->dtype);
        load_rows_transposed(kern, w->v_t, keys_pad, w->stage, (const char *)p->v + v_off * (int64_t)elem,
                             p->v_row_stride, n_keys, dv, p->dtype);
    }
    memset(w->dk_acc, 0, sizeof(float) * (size_t)(n_keys * d_pad));
    memset(w->dv_acc, 0, sizeof(float) * (size_t)(n_keys * dv_pad));
    /* fused dQ needs K rows as a GEMM B operand (padded width) */
    const float *k_rows = NULL;
    int64_t ldk = d_pad;
    if (dq_all)
        k_rows = operand_rows(kern, c->k_direct, p->k, k_off, p->k_row_stride, n_keys, d, p->dtype, w->k_rows, d_pad,
                              &ldk);

    const int apply_softcap = p->softcap > 0.0f, apply_alibi = p->alibi_slopes != NULL;
    const fa_cpu_descale ds = fa_cpu_descale_of(p, b, kv_head);
    const float score_scale = (apply_softcap ? p->softmax_scale / p->softcap : p->softmax_scale) * ds.qk;

    for (int64_t h = kv_head * pb->group; h < (kv_head + 1) * pb->group; h++) {
        int64_t lse_base = fa_lse_offset(pb, b, seq.q_start, h);
        float slope = apply_alibi ? p->alibi_slopes[b * p->alibi_batch_stride + h] : 0.0f;
        for (int64_t i0 = 0; i0 < seq.len_q; i0 += KV_ROWS) {
            int64_t n_rows = seq.len_q - i0 < KV_ROWS ? seq.len_q - i0 : KV_ROWS;
            /* key ranges are nondecreasing in the row: the block's union and intersection come
             * from its first and last rows */
            int64_t lo_first, hi_first, lo_last, hi_last;
            fa_key_range(i0, seq.len_q, seq.len_k, p->window_left, p->window_right, &lo_first, &hi_first);
            fa_key_range(i0 + n_rows - 1, seq.len_q, seq.len_k, p->window_left, p->window_right, &lo_last, &hi_last);
            if (hi_last <= j0 || lo_first >= j0 + n_keys) continue;
            const fa_cpu_mod_rows mods = {b, seq, 0, NULL, NULL, h, i0, n_rows};
            if (pb->has_block_mask && !fa_cpu_mods_see_keys(pb, &mods, j0, j0 + n_keys)) continue;
            int needs_mask = pb->has_mask && !(lo_last <= j0 && hi_first >= j0 + n_keys);

            /* Q and dO rows: in place when fp32 with a padded width, else converted */
            int64_t q_off = fa_row_offset(pb, b, seq.q_start, i0, h, p->q_batch_stride, p->q_row_stride, p->q_head_stride);
            int64_t do_off =
                fa_row_offset(pb, b, seq.q_start, i0, h, p->do_batch_stride, p->do_row_stride, p->do_head_stride);
            int64_t ldq, lddo;
            const float *q_rows = operand_rows(kern, c->q_direct, p->q, q_off, p->q_row_stride, n_rows, d, p->dtype,
                                               w->q_rows, d_pad, &ldq);
            const float *do_rows = operand_rows(kern, c->do_direct, p->dout, do_off, p->do_row_stride, n_rows, dv,
                                                c->io_dtype, w->do_rows, dv_pad, &lddo);
            for (int64_t r = 0; r < n_rows; r++) {
                w->lse[r] = p->lse[lse_base + i0 + r];
                w->dsum[r] = c->dsum[lse_base + i0 + r];
            }

            /* s[r][j] = scale · q_r · k_j */
            if (c->bf16dot) {
                fa_cpu_gemm_bf16_args qk = {n_rows, keys_pad, d, (const uint16_t *)p->q + q_off, p->q_row_stride,
                                            w->k_pairs, keys_pad, w->s, keys_pad, score_scale};
                kern->gemm_bf16(&qk);
            } else {
                fa_cpu_gemm_args qk = {n_rows, keys_pad, d, q_rows, ldq, 1, w->k_t, keys_pad, w->s, keys_pad,
                                       FA_CPU_GEMM_STORE, score_scale, NULL};
                kern->gemm(&qk);
            }
            if (apply_softcap || apply_alibi || needs_mask) {
                for (int64_t r = 0; r < n_rows; r++) {
                    int64_t lo, hi;
                    fa_key_range(i0 + r, seq.len_q, seq.len_k, p->window_left, p->window_right, &lo, &hi);
                    w->lo_rel[r] = fa_cpu_clamp_i32(lo - j0, 0, n_keys);
                    w->hi_rel[r] = fa_cpu_clamp_i32(hi - j0, 0, n_keys);
                    w->diag_rel[r] = fa_cpu_clamp_i32(i0 + r + shift - j0, -FA_CPU_DIAG_LIMIT, FA_CPU_DIAG_LIMIT);
                    w->slope[r] = slope;
                }
                fa_cpu_score_tile t = {w->s, apply_softcap ? w->tanh_vals : NULL, keys_pad, keys_pad, n_rows, 0,
                                       apply_softcap, apply_alibi, needs_mask, p->softcap, w->lo_rel, w->hi_rel,
                                       w->diag_rel, w->slope};
                kern->transform_scores(&t);
            }
            if (pb->has_mods) fa_cpu_apply_mods(pb, &mods, w->s, keys_pad, 0, j0, n_keys);
            /* dp[r][j] = do_r · v_j */
            if (c->bf16dot) {
                fa_cpu_gemm_bf16_args dov = {n_rows, keys_pad, dv, (const uint16_t *)p->dout + do_off, p->do_row_stride,
                                             w->v_pairs, keys_pad, w->dp, keys_pad, 1.0f};
                kern->gemm_bf16(&dov);
            } else {
                fa_cpu_gemm_args dov = {n_rows, keys_pad, dv, do_rows, lddo, 1, w->v_t, keys_pad, w->dp, keys_pad,
                                        FA_CPU_GEMM_STORE, ds.v, NULL};
                kern->gemm(&dov);
            }
            if (pb->has_dropout) /* dP -> Z ∘ dP */
                for (int64_t r = 0; r < n_rows; r++)
                    fa_dropout_apply_row(p->dropout_seed, p->dropout_offset, pb->dropout_threshold,
                                         pb->dropout_keep_scale, b, h, p->heads_q, i0 + r, j0, n_keys,
                                         w->dp + r * keys_pad, 1);
            fa_cpu_grad_tile g = {w->s, w->dp, apply_softcap ? w->tanh_vals : NULL, keys_pad, keys_pad, n_rows, 0,
                                  w->lse, w->dsum, p->softmax_scale};
            kern->grad_scores(&g);
            if (pb->has_dropout) /* P -> Z ∘ P for dV */
                for (int64_t r = 0; r < n_rows; r++)
                    fa_dropout_apply_row(p->dropout_seed, p->dropout_offset, pb->dropout_threshold,
                                         pb->dropout_keep_scale, b, h, p->heads_q, i0 + r, j0, n_keys,
                                         w->s + r * keys_pad, 1);
            /* dv_acc[j][:] += sum_r P[r][j] · do_r ;  dk_acc[j][:] += sum_r dS[r][j] · q_r */
            fa_cpu_gemm_args pdo = {n_keys, dv_pad, n_rows, w->s, 1, keys_pad, do_rows, lddo, w->dv_acc, dv_pad,
                                    FA_CPU_GEMM_ACCUMULATE, 1.0f, NULL};
            kern->gemm(&pdo);
            fa_cpu_gemm_args dsq = {n_keys, d_pad, n_rows, w->dp, 1, keys_pad, q_rows, ldq, w->dk_acc, d_pad,
                                    FA_CPU_GEMM_ACCUMULATE, 1.0f, NULL};
            kern->gemm(&dsq);
            if (dq_all) {
                /* dq[r][:] += sum_j dS[r][j] · k_j */
                float *dq_rows = dq_all + ((h - kv_head * pb->group) * seq.len_q + i0) * d_pad;
                fa_cpu_gemm_args dsk = {n_rows, d_pad, n_keys, w->dp, keys_pad, 1, k_rows, ldk, dq_rows, d_pad,
                                        FA_CPU_GEMM_ACCUMULATE, 1.0f, NULL};
                kern->gemm(&dsk);
            }
        }
    }

    for (int64_t j = 0; j < n_keys; j++) {
        int64_t dk_off = fa_row_offset(pb, b, seq.k_start, j0 + j, kv_head, p->dk_batch_stride, p->dk_row_stride,
                                       p->dk_head_stride);
        int64_t dv_off = fa_row_offset(pb, b, seq.k_start, j0 + j, kv_head, p->dv_batch_stride, p->dv_row_stride,
                                       p->dv_head_stride);
        fa_cpu_scale_row(w->dk_acc + j * d_pad, d, ds.q); /* fp8: dK takes q's factor */
        kern->from_f32((char *)p->dk + dk_off * (int64_t)c->io_elem, w->dk_acc + j * d_pad, d, c->io_dtype);
        kern->from_f32((char *)p->dv + dv_off * (int64_t)c->io_elem, w->dv_acc + j * dv_pad, dv, c->io_dtype);
    }
}

/* Split scheme, pass 1 item (b, kv head, key block). */
static void backward_kv_item(bwd_ctx *c, const bwd_scratch *w, int64_t b, int64_t local) {
    int64_t key_blocks = (fa_sequence(c->pb, b).len_k + KV_KEYS - 1) / KV_KEYS;
    backward_key_block(c, w, b, local / key_blocks, (local % key_blocks) * KV_KEYS, NULL);
}

/* Fused scheme, item (b, kv head): every key block in order, dQ of the whole group accumulated
 * in the thread's dq_all, stored once at the end. */
static void backward_head_item(bwd_ctx *c, const bwd_scratch *w, int64_t b, int64_t kv_head) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    fa_seq seq = fa_sequence(pb, b);
    memset(w->dq_all, 0, sizeof(float) * (size_t)(pb->group * seq.len_q * c->d_pad));
    for (int64_t j0 = 0; j0 < seq.len_k; j0 += KV_KEYS) backward_key_block(c, w, b, kv_head, j0, w->dq_all);
    const float dq_descale = fa_cpu_descale_of(p, b, kv_head).k; /* fp8: dQ takes k's factor */
    for (int64_t g = 0; g < pb->group; g++) {
        int64_t h = kv_head * pb->group + g;
        for (int64_t i = 0; i < seq.len_q; i++) {
            int64_t dq_off =
                fa_row_offset(pb, b, seq.q_start, i, h, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride);
            fa_cpu_scale_row(w->dq_all + (g * seq.len_q + i) * c->d_pad, c->d, dq_descale);
            c->kern->from_f32((char *)p->dq + dq_off * (int64_t)c->io_elem, w->dq_all + (g * seq.len_q + i) * c->d_pad,
                              c->d, c->io_dtype);
        }
    }
}

/* ---- pass 2: dQ of one query block ---------------------------------------------------------------- */

/* Qᵀ and dOᵀ (keys-major B operands, or bf16 pairs), LSE, D and ALiBi slopes of query rows
 * i0 .. i0 + n_rows of head h, lanes rows_pad (padding lanes: LSE -inf makes their P and dS 0). */
static void load_q_block(bwd_ctx *c, const bwd_scratch *w, int64_t b, const fa_seq *seq, int64_t h, int64_t i0,
                         int64_t n_rows, int64_t rows_pad) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const size_t elem = c->elem;
    int64_t lse_base = fa_lse_offset(pb, b, seq->q_start, h);
    int64_t q_off = fa_row_offset(pb, b, seq->q_start, i0, h, p->q_batch_stride, p->q_row_stride, p->q_head_stride);
    int64_t do_off = fa_row_offset(pb, b, seq->q_start, i0, h, p->do_batch_stride, p->do_row_stride, p->do_head_stride);
    if (c->bf16dot) {
        load_rows_pairs(kern, w->q_pairs, rows_pad, w->stage, (const uint16_t *)p->q + q_off, p->q_row_stride, n_rows,
                        c->d);
        load_rows_pairs(kern, w->do_pairs, rows_pad, w->stage, (const uint16_t *)p->dout + do_off, p->do_row_stride,
                        n_rows, c->dv);
    } else {
        load_rows_transposed(kern, w->q_t, rows_pad, w->stage, (const char *)p->q + q_off * (int64_t)elem,
                             p->q_row_stride, n_rows, c->d, p->dtype);
        load_rows_transposed(kern, w->do_t, rows_pad, w->stage, (const char *)p->dout + do_off * (int64_t)c->io_elem,
                             p->do_row_stride, n_rows, c->dv, c->io_dtype);
    }
    for (int64_t r = 0; r < rows_pad; r++) {
        w->lse[r] = r < n_rows ? p->lse[lse_base + i0 + r] : -INFINITY;
        w->dsum[r] = r < n_rows ? c->dsum[lse_base + i0 + r] : 0.0f;
        w->slope[r] = p->alibi_slopes && r < n_rows ? p->alibi_slopes[b * p->alibi_batch_stride + h] : 0.0f;
    }
}

/* Keys-major tiles of the rows load_q_block loaded against keys j0 .. j0 + n_keys: w->s = the
 * transformed scores (softcap, ALiBi, masks, bias; softcap's tanh into w->tanh_vals when
 * want_tanh) and w->dp = Z ∘ dO Vᵀ. Returns the K rows (GEMM operand, leading dimension *ldk). */
static const float *q_block_tile(bwd_ctx *c, const bwd_scratch *w, int64_t b, const fa_seq *seq, int64_t h,
                                 int64_t i0, int64_t n_rows, int64_t rows_pad, int64_t j0, int64_t n_keys,
                                 int needs_mask, int want_tanh, int64_t *ldk) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = c->d, dv = c->dv, d_pad = c->d_pad;
    const int64_t kv_head = h / pb->group, shift = seq->len_k - seq->len_q;
    const int apply_softcap = p->softcap > 0.0f, apply_alibi = p->alibi_slopes != NULL;
    const fa_cpu_descale ds = fa_cpu_descale_of(p, b, kv_head);
    const float score_scale = (apply_softcap ? p->softmax_scale / p->softcap : p->softmax_scale) * ds.qk;
    int64_t k_off = fa_row_offset(pb, b, seq->k_start, j0, kv_head, p->k_batch_stride, p->k_row_stride, p->k_head_stride);
    int64_t v_off = fa_row_offset(pb, b, seq->k_start, j0, kv_head, p->v_batch_stride, p->v_row_stride, p->v_head_stride);
    int64_t ldv = 0;
    const float *k_rows =
        operand_rows(kern, c->k_direct, p->k, k_off, p->k_row_stride, n_keys, d, p->dtype, w->k_rows, d_pad, ldk);
    /* V is only the A operand of dP: the bf16 GEMM reads the caller's rows itself */
    const float *v_rows = c->bf16dot ? NULL
                                     : operand_rows(kern, c->v_direct, p->v, v_off, p->v_row_stride, n_keys, dv,
                                                    p->dtype, w->v_rows, dv, &ldv);

    /* s_t[j][r] = scale · k_j · q_r */
    if (c->bf16dot) {
        fa_cpu_gemm_bf16_args qk = {n_keys, rows_pad, d, (const uint16_t *)p->k + k_off, p->k_row_stride,
                                    w->q_pairs, rows_pad, w->s, rows_pad, score_scale};
        kern->gemm_bf16(&qk);
    } else {
        fa_cpu_gemm_args qk = {n_keys, rows_pad, d, k_rows, *ldk, 1, w->q_t, rows_pad, w->s, rows_pad,
                               FA_CPU_GEMM_STORE, score_scale, NULL};
        kern->gemm(&qk);
    }
    if (apply_softcap || apply_alibi || needs_mask) {
        for (int64_t r = 0; r < rows_pad; r++) {
            int64_t lo = j0, hi = j0 + n_keys, diag = j0;
            if (r < n_rows) {
                fa_key_range(i0 + r, seq->len_q, seq->len_k, p->window_left, p->window_right, &lo, &hi);
                diag = i0 + r + shift;
            }
            w->lo_rel[r] = fa_cpu_clamp_i32(lo - j0, 0, n_keys);
            w->hi_rel[r] = fa_cpu_clamp_i32(hi - j0, 0, n_keys);
            w->diag_rel[r] = fa_cpu_clamp_i32(diag - j0, -FA_CPU_DIAG_LIMIT, FA_CPU_DIAG_LIMIT);
        }
        fa_cpu_score_tile t = {w->s, apply_softcap && want_tanh ? w->tanh_vals : NULL, rows_pad, n_keys, rows_pad, 1,
                               apply_softcap, apply_alibi, needs_mask, p->softcap, w->lo_rel, w->hi_rel,
                               w->diag_rel, w->slope};
        kern->transform_scores(&t);
    }
    if (pb->has_mods) {
        const fa_cpu_mod_rows mods = {b, *seq, 0, NULL, NULL, h, i0, n_rows};
        fa_cpu_apply_mods(pb, &mods, w->s, rows_pad, 1, j0, n_keys);
    }
    /* dp_t[j][r] = v_j · do_r */
    if (c->bf16dot) {
        fa_cpu_gemm_bf16_args vdo = {n_keys, rows_pad, dv, (const uint16_t *)p->v + v_off, p->v_row_stride,
                                     w->do_pairs, rows_pad, w->dp, rows_pad, 1.0f};
        kern->gemm_bf16(&vdo);
    } else {
        fa_cpu_gemm_args vdo = {n_keys, rows_pad, dv, v_rows, ldv, 1, w->do_t, rows_pad, w->dp, rows_pad,
                                FA_CPU_GEMM_STORE, ds.v, NULL};
        kern->gemm(&vdo);
    }
    if (pb->has_dropout) /* dP -> Z ∘ dP */
        for (int64_t r = 0; r < n_rows; r++)
            fa_dropout_apply_row(p->dropout_seed, p->dropout_offset, pb->dropout_threshold, pb->dropout_keep_scale, b,
                                 h, p->heads_q, i0 + r, j0, n_keys, w->dp + r, rows_pad);
    return k_rows;
}

/* Does the tile of rows [i0, i0 + n_rows) and keys [j0, j1) hold any visible element (key
 * ranges, then the block lists)? *needs_mask: some element is outside a row's key range. */
static int q_block_tile_visible(const fa_problem *pb, int64_t b, const fa_seq *seq, int64_t h, int64_t i0,
                                int64_t n_rows, int64_t j0, int64_t j1, int *needs_mask) {
    const fa_params *p = &pb->p;
    int64_t lo_first, hi_first, lo_last, hi_last;
    fa_key_range(i0, seq->len_q, seq->len_k, p->window_left, p->window_right, &lo_first, &hi_first);
    fa_key_range(i0 + n_rows - 1, seq->len_q, seq->len_k, p->window_left, p->window_right, &lo_last, &hi_last);
    if (hi_last <= j0 || lo_first >= j1) return 0;
    *needs_mask = pb->has_mask && !(lo_last <= j0 && hi_first >= j1);
    const fa_cpu_mod_rows mods = {b, *seq, 0, NULL, NULL, h, i0, n_rows};
    return !pb->has_block_mask || fa_cpu_mods_see_keys(pb, &mods, j0, j1);
}

static void backward_q_item(bwd_ctx *c, const bwd_scratch *w, int64_t b, int64_t local) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = c->d, d_pad = c->d_pad;
    fa_seq seq = fa_sequence(pb, b);
    int64_t q_blocks = (seq.len_q + BLOCK_ROWS - 1) / BLOCK_ROWS;
    int64_t h = local / q_blocks;
    int64_t i0 = (q_blocks - 1 - local % q_blocks) * BLOCK_ROWS;
    int64_t n_rows = seq.len_q - i0 < BLOCK_ROWS ? seq.len_q - i0 : BLOCK_ROWS;
    int64_t rows_pad = fa_cpu_round_up(n_rows, FA_CPU_PAD);

    int64_t lo_first, hi_first, lo_last, hi_last;
    fa_key_range(i0, seq.len_q, seq.len_k, p->window_left, p->window_right, &lo_first, &hi_first);
    fa_key_range(i0 + n_rows - 1, seq.len_q, seq.len_k, p->window_left, p->window_right, &lo_last, &hi_last);
    load_q_block(c, w, b, &seq, h, i0, n_rows, rows_pad);
    memset(w->dq_acc, 0, sizeof(float) * (size_t)(n_rows * d_pad));
    const int apply_softcap = p->softcap > 0.0f;

    for (int64_t j0 = lo_first; j0 < hi_last; j0 += BLOCK_KEYS) {
        int64_t n_keys = hi_last - j0 < BLOCK_KEYS ? hi_last - j0 : BLOCK_KEYS;
        int needs_mask = 0;
        if (!q_block_tile_visible(pb, b, &seq, h, i0, n_rows, j0, j0 + n_keys, &needs_mask)) continue;
        int64_t ldk;
        const float *k_rows = q_block_tile(c, w, b, &seq, h, i0, n_rows, rows_pad, j0, n_keys, needs_mask, 1, &ldk);
        fa_cpu_grad_tile g = {w->s, w->dp, apply_softcap ? w->tanh_vals : NULL, rows_pad, n_keys, rows_pad, 1,
                              w->lse, w->dsum, p->softmax_scale};
        kern->grad_scores(&g);
        /* dq_acc[r][:] += sum_j dS[j][r] · k_j */
        fa_cpu_gemm_args dsk = {n_rows, d_pad, n_keys, w->dp, 1, rows_pad, k_rows, ldk, w->dq_acc, d_pad,
                                FA_CPU_GEMM_ACCUMULATE, 1.0f, NULL};
        kern->gemm(&dsk);
    }

    const float dq_descale = fa_cpu_descale_of(p, b, h / pb->group).k; /* fp8: dQ takes k's factor */
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t dq_off =
            fa_row_offset(pb, b, seq.q_start, i0 + r, h, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride);
        fa_cpu_scale_row(w->dq_acc + r * d_pad, d, dq_descale);
        kern->from_f32((char *)p->dq + dq_off * (int64_t)c->io_elem, w->dq_acc + r * d_pad, d, c->io_dtype);
    }
}

/* ---- pass 4: dbias ------------------------------------------------------------------------------ */

/* dbias has an output block per item: (batch ob, head oh, up to BLOCK_ROWS rows, up to BLOCK_KEYS
 * keys), where a summed axis (dbias stride 0) has extent 1 and its item loops over every index
 * of that axis in a fixed order; dL/dbias = P ∘ (Z ∘ dP - D) (no scale, no softcap factor: the
 * bias is added after both). Every dbias element is written by exactly one item. */
typedef struct dbias_shape {
    int sum_b, sum_h, sum_i, sum_j;
    int64_t heads, row_blocks, key_blocks; /* per output batch index                            */
} dbias_shape;

static dbias_shape dbias_shape_of(const fa_params *p) {
    dbias_shape s;
    s.sum_b = p->dbias_batch_stride == 0 && p->batch > 1;
    s.sum_h = p->dbias_head_stride == 0 && p->heads_q > 1;
    s.sum_i = p->dbias_row_stride == 0;
    s.sum_j = p->dbias_col_stride == 0;
    s.heads = s.sum_h ? 1 : p->heads_q;
    s.row_blocks = s.sum_i ? 1 : (p->seqlen_q + BLOCK_ROWS - 1) / BLOCK_ROWS; /* a sum over no rows is 0 */
    s.key_blocks = s.sum_j ? 1 : (p->seqlen_k + BLOCK_KEYS - 1) / BLOCK_KEYS;
    return s;
}

static void backward_dbias_item(bwd_ctx *c, const bwd_scratch *w, int64_t ob, int64_t local) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const dbias_shape sh = dbias_shape_of(p);
    const int64_t oh = local / (sh.row_blocks * sh.key_blocks);
    const int64_t orb = (local / sh.key_blocks) % sh.row_blocks, okb = local % sh.key_blocks;
    const int64_t out_i0 = sh.sum_i ? 0 : orb * BLOCK_ROWS, out_j0 = sh.sum_j ? 0 : okb * BLOCK_KEYS;
    const int64_t out_rows = sh.sum_i ? 1 : (p->seqlen_q - out_i0 < BLOCK_ROWS ? p->seqlen_q - out_i0 : BLOCK_ROWS);
    const int64_t out_keys = sh.sum_j ? 1 : (p->seqlen_k - out_j0 < BLOCK_KEYS ? p->seqlen_k - out_j0 : BLOCK_KEYS);
    float *acc = w->dbias_acc; /* [out_rows][BLOCK_KEYS] */
    memset(acc, 0, sizeof(float) * (size_t)(BLOCK_ROWS * BLOCK_KEYS));

    for (int64_t b = sh.sum_b ? 0 : ob; b < (sh.sum_b ? p->batch : ob + 1); b++) {
        const fa_seq seq = fa_sequence(pb, b);
        for (int64_t h = sh.sum_h ? 0 : oh; h < (sh.sum_h ? p->heads_q : oh + 1); h++) {
            const int64_t i_begin = out_i0, i_end = sh.sum_i ? seq.len_q : (out_i0 + out_rows < seq.len_q ? out_i0 + out_rows : seq.len_q);
            const int64_t j_begin = out_j0, j_end = sh.sum_j ? seq.len_k : (out_j0 + out_keys < seq.len_k ? out_j0 + out_keys : seq.len_k);
            for (int64_t i0 = i_begin; i0 < i_end; i0 += BLOCK_ROWS) {
                const int64_t n_rows = i_end - i0 < BLOCK_ROWS ? i_end - i0 : BLOCK_ROWS;
                const int64_t rows_pad = fa_cpu_round_up(n_rows, FA_CPU_PAD);
                int loaded = 0;
                for (int64_t j0 = j_begin; j0 < j_end; j0 += BLOCK_KEYS) {
                    const int64_t n_keys = j_end - j0 < BLOCK_KEYS ? j_end - j0 : BLOCK_KEYS;
                    int needs_mask = 0;
                    if (!q_block_tile_visible(pb, b, &seq, h, i0, n_rows, j0, j0 + n_keys, &needs_mask)) continue;
                    if (!loaded) load_q_block(c, w, b, &seq, h, i0, n_rows, rows_pad);
                    loaded = 1;
                    int64_t ldk;
                    q_block_tile(c, w, b, &seq, h, i0, n_rows, rows_pad, j0, n_keys, needs_mask, 0, &ldk);
                    for (int64_t j = 0; j < n_keys; j++) {
                        float *out = acc + (sh.sum_j ? 0 : j0 + j - out_j0);
                        const float *s_row = w->s + j * rows_pad, *dp_row = w->dp + j * rows_pad;
                        for (int64_t r = 0; r < n_rows; r++) {
                            const float lse = w->lse[r];
                            const float prob = lse == -INFINITY ? 0.0f : expf(s_row[r] - lse);
                            const float g = prob == 0.0f ? 0.0f : prob * (dp_row[r] - w->dsum[r]);
                            out[(sh.sum_i ? 0 : i0 + r - out_i0) * BLOCK_KEYS] += g;
                        }
                    }
                }
            }
        }
    }
    /* a row's keys are contiguous (col stride 1) or one summed element (0): one conversion per row */
    for (int64_t r = 0; r < out_rows; r++)
        c->kern->from_f32((char *)p->dbias + (ob * p->dbias_batch_stride + oh * p->dbias_head_stride +
                                              (out_i0 + r) * p->dbias_row_stride + out_j0 * p->dbias_col_stride) *
                                                 fa_dtype_bytes(p->dbias_dtype),
                          acc + r * BLOCK_KEYS, out_keys, p->dbias_dtype);
}

/* ---- driver ----------------------------------------------------------------------------------------- */

static void backward_task(void *arg, int thread_index) {
    bwd_ctx *c = (bwd_ctx *)arg;
    bwd_scratch w;
    backward_scratch_layout(c->pb, c->fused, c->scratch + (size_t)thread_index * c->scratch_bytes, &w);
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        int64_t b = fa_cpu_item_sequence(c->item_start, c->pb->p.batch, item);
        int64_t local = item - c->item_start[b];
        if (c->pass == 0) backward_dsum_item(c, &w, b, local);
        else if (c->pass == 1) backward_kv_item(c, &w, b, local);
        else if (c->pass == 2) backward_q_item(c, &w, b, local);
        else if (c->pass == 4) backward_dbias_item(c, &w, b, local);
        else backward_head_item(c, &w, b, local);
    }
}

/* Items of sequence b in pass `pass`. */
static int64_t pass_items(const fa_problem *pb, int pass, int64_t b) {
    fa_seq seq = fa_sequence(pb, b);
    if (pass == 0) return pb->p.heads_q;
    if (pass == 1) return pb->p.heads_kv * ((seq.len_k + KV_KEYS - 1) / KV_KEYS);
    if (pass == 2) return pb->p.heads_q * ((seq.len_q + BLOCK_ROWS - 1) / BLOCK_ROWS);
    if (pass == 4) { /* dbias output blocks; a summed batch axis: every item under sequence 0 */
        const dbias_shape sh = dbias_shape_of(&pb->p);
        return sh.sum_b && b > 0 ? 0 : sh.heads * sh.row_blocks * sh.key_blocks;
    }
    return pb->p.heads_kv;
}

/* The fused scheme (5 GEMMs per tile pair instead of 7) has one item per (sequence, kv head),
 * so it is used only when those items alone keep every core busy, and when one group's dQ in
 * fp32 stays small. The choice depends on the problem and the machine's core count, never on
 * num_threads, so results stay bitwise independent of the thread count. */
static int backward_use_fused(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    if (p->batch * p->heads_kv < 2 * (int64_t)fa_cpu_online_cores()) return 0;
    double dq_bytes = 4.0 * (double)pb->group * (double)p->seqlen_q * (double)fa_cpu_round_up(p->head_dim, FA_CPU_PAD);
    return dq_bytes <= 64.0 * 1024 * 1024;
}

/* dout_e4m3: bytes of dout's bf16 copy [total_q, heads_q, dv] (dout_descale · code, rounded). */
static size_t dout_copy_bytes(const fa_params *p) {
    return p->dout_e4m3 ? fa_cpu_align64(2 * (size_t)(p->total_q * p->heads_q * p->head_dim_v)) : 0;
}

/* dout_e4m3: writes the bf16 copy of dout (dout_descale[b, h / group] · code, rounded to bf16;
 * rows past a varlen batch's last sequence stay unwritten, and nothing reads them) and points
 * *out (a copy of pb) at it, as a bf16 dout. */
static void dout_to_bf16(const fa_problem *pb, uint16_t *copy, fa_problem *out) {
    const fa_params *p = &pb->p;
    const uint8_t *src = (const uint8_t *)p->dout;
    const int64_t hq = p->heads_q, dv = p->head_dim_v;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq seq = fa_sequence(pb, b);
        for (int64_t i = 0; i < seq.len_q; i++)
            for (int64_t h = 0; h < hq; h++) {
                const int64_t kvh = h / pb->group;
                const float ds = p->dout_descale ? p->dout_descale[b * p->heads_kv + kvh] : 1.0f;
                const int64_t row = seq.q_start + i, at = (pb->varlen ? 0 : b * p->do_batch_stride) +
                                                          row * p->do_row_stride + h * p->do_head_stride;
                uint16_t *dst = copy + ((pb->varlen ? row : b * p->seqlen_q + i) * hq + h) * dv;
                for (int64_t c = 0; c < dv; c++) dst[c] = fa_f32_to_bf16(fa_e4m3_to_f32(src[at + c]) * ds);
            }
    }
    *out = *pb;
    out->p.dout = copy;
    out->p.do_head_stride = dv;
    out->p.do_row_stride = hq * dv;
    out->p.do_batch_stride = pb->varlen ? 0 : p->seqlen_q * hq * dv;
    out->p.dout_e4m3 = 0;
    out->p.dout_descale = NULL;
}

size_t fa_cpu_backward_workspace(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    size_t per_thread = fa_cpu_align64(backward_scratch_layout(pb, backward_use_fused(pb), NULL, NULL));
    size_t shared = fa_cpu_align64(sizeof(float) * (size_t)(p->heads_q * p->total_q)) +
                    fa_cpu_align64(sizeof(double) * (size_t)(p->batch * p->heads_q)) +
                    fa_cpu_align64(sizeof(int64_t) * (size_t)(p->batch + 1)) + dout_copy_bytes(p);
    return 64 + shared + (size_t)fa_cpu_thread_count(pb) * per_thread;
}

fa_status fa_cpu_backward(const fa_problem *caller_pb) {
    fa_cpu_workspace ws;
    if (!fa_cpu_workspace_acquire(caller_pb, fa_cpu_backward_workspace(caller_pb), &ws)) return FA_ERR_ALLOC;

    bwd_ctx c;
    fa_cpu_arena arena = {ws.base, 0};
    /* an e4m3 dout: the rest runs on its bf16 copy */
    fa_problem dout_bf16;
    const fa_problem *pb = caller_pb;
    if (caller_pb->p.dout_e4m3) {
        dout_to_bf16(caller_pb, (uint16_t *)fa_cpu_take(&arena, dout_copy_bytes(&caller_pb->p)), &dout_bf16);
        pb = &dout_bf16;
    }
    const fa_params *p = &pb->p;
    c.pb = pb;
    c.kern = fa_cpu_select_kernels();
    c.dsum = (float *)fa_cpu_take(&arena, sizeof(float) * (size_t)(p->heads_q * p->total_q));
    c.dsink_partial = (double *)fa_cpu_take(&arena, sizeof(double) * (size_t)(p->batch * p->heads_q));
    c.item_start = (int64_t *)fa_cpu_take(&arena, sizeof(int64_t) * (size_t)(p->batch + 1));
    c.fused = backward_use_fused(pb);
    c.scratch_bytes = fa_cpu_align64(backward_scratch_layout(pb, c.fused, NULL, NULL));
    c.scratch = ws.base + arena.used;
    c.d = p->head_dim;
    c.dv = p->head_dim_v;
    c.d_pad = fa_cpu_round_up(c.d, FA_CPU_PAD);
    c.dv_pad = fa_cpu_round_up(c.dv, FA_CPU_PAD);
    c.elem = (size_t)fa_dtype_bytes(p->dtype);
    c.io_dtype = fa_out_dtype(p->dtype);
    c.io_elem = (size_t)fa_dtype_bytes(c.io_dtype);
    c.bf16dot = p->dtype == FA_DTYPE_BF16 && c.kern->gemm_bf16 != NULL;
    /* fp32 rows are used in place unless a GEMM would stream them more than twice (one pass per
     * panel of columns; rows of one head lie far apart and conflict in L1): see cpu_forward.c */
    const int fp32 = p->dtype == FA_DTYPE_F32, panel2 = (int)(2 * c.kern->gemm_panel);
    c.q_direct = fp32 && c.d == c.d_pad && c.d_pad <= panel2;
    c.do_direct = fp32 && c.dv == c.dv_pad && c.dv_pad <= panel2;
    c.k_direct = c.q_direct;
    c.v_direct = fp32 && BLOCK_ROWS <= panel2;

    int max_threads = fa_cpu_thread_count(pb);
    static const int split_passes[4] = {0, 1, 2, 4}, fused_passes[3] = {0, 3, 4};
    const int *passes = c.fused ? fused_passes : split_passes;
    int n_passes = (c.fused ? 2 : 3) + (p->dbias != NULL);
    for (int pi = 0; pi < n_passes; pi++) {
        int pass = passes[pi];
        c.item_start[0] = 0;
        for (int64_t b = 0; b < p->batch; b++) c.item_start[b + 1] = c.item_start[b] + pass_items(pb, pass, b);
        c.pass = pass;
        c.total_items = c.item_start[p->batch];
        atomic_init(&c.next_item, 0);
        int threads = max_threads < c.total_items ? max_threads : (int)c.total_items;
        if (threads > 0) fa_cpu_parallel_run(threads, backward_task, &c);
    }

    if (p->dsink) {
        for (int64_t h = 0; h < p->heads_q; h++) {
            double sum = 0.0;
            for (int64_t b = 0; b < p->batch; b++) sum += c.dsink_partial[b * p->heads_q + h];
            p->dsink[h] = p->sink_logits ? (float)sum : 0.0f;
        }
    }
    fa_cpu_workspace_release(&ws);
    return FA_OK;
}
