/*
 * cpu_decode.c: fa_kvcache_forward's decode path on the CPU (see cpu_decode.h for the kernels).
 *
 * Serves calls whose kv groups have few query rows (heads_q / heads_kv · seqlen_q <= 16) on CPUs
 * with AVX2 or NEON, and every call on a quantised cache (kv_dtype != FA_KV_SAME, any ISA). Not covered
 * (cpu_kvcache.c's path runs instead): rotary embedding, head dims that are not multiples of 8,
 * larger query blocks on an unquantised cache, the scalar ISA level on an unquantised cache.
 * FA_CPU_DECODE=0 in the environment sends unquantised calls to cpu_kvcache.c (comparisons).
 *
 * Phases: (1) append: k_new / v_new of every (b, t < seqlen_new), in that order on one thread (a slot written
 * twice keeps the last sequence's token), stored in the cache's format (quantised per token and
 * head, per block, or by the per-head scale); (2) attention: items (sequence, kv block, head
 * chunk, query block, split) from an atomic queue; an item holds up to 64 rows of up to 16 kv
 * heads and walks its key range in tiles of FA_CPU_DECODE_KEYS slots, each tile across all its kv
 * heads (scores, softcap / ALiBi / mask, online softmax, P V), prefetching the next tile's rows
 * into L2; (3) merge of the splits (cpu_merge.c). Sequence geometry, masks, sinks and split
 * states follow cpu_kvcache.c. Results do not depend on the thread count.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_convert.h"
#include "cpu_decode.h"
#include "cpu_merge.h"

#define TILE FA_CPU_DECODE_KEYS
#define ITEM_ROWS FA_CPU_BLOCK_ROWS /* query rows of one item, over all its kv heads          */
#define ITEM_KV 16                  /* kv heads of one item at most                           */

typedef struct dec_layout {
    int64_t heads;       /* query heads of a group per item                                      */
    int64_t head_chunks; /* ceil(group / heads)                                                  */
    int64_t queries;     /* queries per item                                                     */
    int64_t q_blocks;
    int64_t kv_per_item;
    int64_t kv_blocks;
    int64_t splits;
    int64_t per_sequence; /* items of one sequence                                             */
} dec_layout;

static dec_layout layout_of(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    dec_layout l;
    if (pb->group >= ITEM_ROWS) {
        l.heads = ITEM_ROWS;
        l.queries = 1;
    } else {
        l.heads = pb->group;
        l.queries = ITEM_ROWS / pb->group;
        if (l.queries > p->seqlen_q) l.queries = p->seqlen_q;
    }
    l.head_chunks = (pb->group + l.heads - 1) / l.heads;
    l.q_blocks = (p->seqlen_q + l.queries - 1) / l.queries;
    l.kv_per_item = ITEM_ROWS / (l.heads * l.queries);
    if (l.kv_per_item > ITEM_KV) l.kv_per_item = ITEM_KV;
    if (l.kv_per_item > p->heads_kv) l.kv_per_item = p->heads_kv;
    if (l.kv_per_item < 1) l.kv_per_item = 1;
    l.kv_blocks = (p->heads_kv + l.kv_per_item - 1) / l.kv_per_item;
    l.splits = 1;
    l.per_sequence = l.kv_blocks * l.head_chunks * l.q_blocks;
    return l;
}

int64_t fa_cpu_decode_split_count(int64_t units, int64_t keys, int threads, int requested) {
    int64_t tiles = (keys + TILE - 1) / TILE;
    if (tiles < 1) tiles = 1;
    if (requested >= 1) return requested < tiles ? requested : tiles;
    if (threads <= 1 || units < 1) return 1;
    int64_t want = (4 * (int64_t)threads + units - 1) / units;
    int64_t by_keys = keys / FA_CPU_DECODE_MIN_SPLIT;
    if (want > by_keys) want = by_keys;
    if (want > FA_KV_MAX_SPLITS) want = FA_KV_MAX_SPLITS;
    return want > 1 ? want : 1;
}

static fa_cpu_kv_format format_of(const fa_params *p) {
    switch (p->kv_dtype) {
    case FA_KV_INT8: return FA_CPU_KV_I8;
    case FA_KV_Q8_0: return FA_CPU_KV_Q8_0;
    case FA_KV_FP8_E4M3: return FA_CPU_KV_E4M3;
    default: return p->dtype == FA_DTYPE_F32 ? FA_CPU_KV_F32 : p->dtype == FA_DTYPE_F16 ? FA_CPU_KV_F16 : FA_CPU_KV_BF16;
    }
}

/* Bytes per unit of the cache strides. */
static int64_t cache_unit(const fa_params *p) {
    if (p->kv_dtype != FA_KV_SAME) return 1;
    return fa_dtype_bytes(p->dtype);
}

/* The avx512 level's int8 scores on AVX512-VNNI (decode_vnni_avx512.c) where the CPU has it and
 * FA_CPU_DECODE_VNNI=0 is not set (read on every call, so tests run both). */
#if defined(__x86_64__) || defined(_M_X64)
static int use_vnni(void) {
    const char *env = getenv("FA_CPU_DECODE_VNNI");
    if (env != NULL && strcmp(env, "0") == 0) return 0;
    return __builtin_cpu_supports("avx512vnni");
}
#endif

static const fa_cpu_decode_kernels *decode_kernels(void) {
#if defined(__x86_64__) || defined(_M_X64)
    const char *isa = fa_cpu_select_kernels()->name;
    if (strcmp(isa, "avx512") == 0) return use_vnni() ? fa_cpu_decode_kernels_avx512_vnni() : fa_cpu_decode_kernels_avx512();
    if (strcmp(isa, "avx2") == 0) return fa_cpu_decode_kernels_avx2();
#endif
#ifdef FA_CPU_HAVE_NEON_KERNELS
    /* the SVE level's CPUs have NEON: its decode kernels there too */
    const char *arm = fa_cpu_select_kernels()->name;
    if (strcmp(arm, "neon") == 0 || strcmp(arm, "sve256") == 0) return fa_cpu_decode_kernels_neon();
#endif
    return fa_cpu_decode_kernels_scalar();
}

int fa_cpu_decode_integer_pv(int amd, int family, int model, int avx512_vnni) {
    if (avx512_vnni) return amd && family >= 0x19;
    return amd && family == 0x17 && model < 0x30;
}

/* Whether a bf16 cache is scored by bf16 dot products: the kernel set has them and the CPU has
 * AVX512-BF16 (the engine's table then carries its bf16 GEMM; FA_CPU_BF16DOT=0 turns both off). */
static int bf16_scores_here(const fa_cpu_decode_kernels *dk, fa_cpu_kv_format format) {
    return dk->bf16_scores && format == FA_CPU_KV_BF16 && fa_cpu_select_kernels()->gemm_bf16 != NULL;
}

/* The rule for this CPU (fa_cpu_identify); FA_CPU_DECODE_INT_PV=0 / 1 overrides it (read per call,
 * so tests run both kernels on any CPU). */
static int integer_pv_here(const fa_cpu_decode_kernels *dk) {
    const char *forced = getenv("FA_CPU_DECODE_INT_PV");
    if (forced && (forced[0] == '0' || forced[0] == '1')) return forced[0] == '1';
#if defined(__x86_64__) || defined(_M_X64)
    const fa_cpu_model_id id = fa_cpu_identify();
    return fa_cpu_decode_integer_pv(id.amd, id.family, id.model, dk == fa_cpu_decode_kernels_avx512_vnni());
#else
    return 1;
#endif
}

int fa_cpu_decode_applies(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    if (p->kv_dtype != FA_KV_SAME) return 1;
    if (p->rotary_cos || p->head_dim % 8 || p->head_dim_v % 8 || pb->group * p->seqlen_q > 16) return 0;
    const char *off = getenv("FA_CPU_DECODE");
    if (off && off[0] == '0') return 0;
    return decode_kernels() != fa_cpu_decode_kernels_scalar();
}

/* ---- workspace ---------------------------------------------------------------------------------- */

typedef struct dec_scratch {
    float *q, *o, *s, *out, *k_mult, *q16_scale;
    int16_t *q16;
    const char **k_base, **v_base, **k_base_next, **v_base_next, **k_rows, **v_rows, **k_next, **v_next;
    const float **k_scale_row, **v_scale_row;
    fa_cpu_item_rows rows;
} dec_scratch;

static size_t scratch_layout(const fa_problem *pb, char *base, dec_scratch *s) {
    const int64_t d = pb->p.head_dim, dv = pb->p.head_dim_v;
    fa_cpu_arena a = {base, 0};
    dec_scratch dummy;
    if (!s) s = &dummy;
    s->q = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(ITEM_ROWS * d));
    s->q16 = (int16_t *)fa_cpu_take(&a, sizeof(int16_t) * (size_t)(ITEM_ROWS * d));
    s->q16_scale = (float *)fa_cpu_take(&a, sizeof(float) * ITEM_ROWS);
    s->o = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(ITEM_ROWS * dv));
    s->s = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(TILE * ITEM_ROWS));
    s->out = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d > dv ? d : dv));
    s->k_mult = (float *)fa_cpu_take(&a, sizeof(float) * TILE);
    const char ***ptrs[] = {&s->k_base, &s->v_base, &s->k_base_next, &s->v_base_next,
                            &s->k_rows, &s->v_rows, &s->k_next, &s->v_next};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) *ptrs[i] = (const char **)fa_cpu_take(&a, sizeof(char *) * TILE);
    s->k_scale_row = (const float **)fa_cpu_take(&a, sizeof(float *) * TILE);
    s->v_scale_row = (const float **)fa_cpu_take(&a, sizeof(float *) * TILE);
    fa_cpu_item_rows_take(&a, &s->rows);
    return a.used;
}

/* No slot ids: the decode path appends on the calling thread. */
static fa_cpu_kv_plan plan_of(const fa_problem *pb, int threads, int64_t splits) {
    return fa_cpu_kv_plan_of(&pb->p, 0, splits, scratch_layout(pb, NULL, NULL), threads);
}

static int64_t split_bound(const fa_problem *pb, int threads) {
    dec_layout l = layout_of(pb);
    return fa_cpu_decode_split_count(pb->p.batch * l.per_sequence, pb->p.seqlen_k, threads, pb->p.num_splits);
}

size_t fa_cpu_decode_workspace(const fa_problem *pb) {
    int threads = fa_cpu_thread_count(pb);
    return plan_of(pb, threads, split_bound(pb, threads)).total;
}

/* ---- shared state ------------------------------------------------------------------------------ */

typedef struct dec_ctx {
    const fa_problem *pb;
    const fa_cpu_kernels *kern;
    const fa_cpu_decode_kernels *dk;
    const fa_cpu_kv_sequence *seqs;
    dec_layout layout;
    fa_cpu_kv_format format;
    int64_t unit; /* bytes per stride unit of k / v */
    int integer_pv; /* fa_cpu_decode_tile.integer_pv */
    int bf16_scores; /* a bf16 cache scored by bf16 dot products (fa_cpu_decode_tile.q_bf16) */
    atomic_llong next_item;
    int64_t total_items;
    char *scratch;
    size_t scratch_bytes;
    float *o_part, *lse_part;
} dec_ctx;

/* Stride units of (slot, head) of sequence b (paged or contiguous). */
static inline int64_t slot_offset(const fa_params *p, const fa_cpu_kv_sequence *seq, int64_t b, int64_t slot, int64_t head,
                                  int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
    if (p->block_table) {
        int64_t page = p->block_table[b * p->block_table_batch_stride + slot / p->page_size];
        return page * batch_stride + (slot % p->page_size) * row_stride + head * head_stride;
    }
    return seq->cache_row * batch_stride + slot * row_stride + head * head_stride;
}

/* ---- phase 1: append ----------------------------------------------------------------------------- */

/* Store the fp32 row x[n] in the cache's format at dst (its scale at *scale for int8). */
static void store_row(const dec_ctx *c, char *dst, float *scale, const float *x, int64_t n, float head_scale) {
    const fa_params *p = &c->pb->p;
    switch (p->kv_dtype) {
    case FA_KV_INT8:
    case FA_KV_Q8_0: {
        const int64_t block = p->kv_dtype == FA_KV_Q8_0 ? 32 : n;
        for (int64_t b0 = 0; b0 < n; b0 += block) {
            float amax = 0.0f;
            int nan = 0;
            for (int64_t i = 0; i < block; i++) {
                nan |= isnan(x[b0 + i]);
                amax = fmaxf(amax, fabsf(x[b0 + i]));
            }
            float d = nan ? NAN : amax / 127.0f;
            int8_t *q;
            if (p->kv_dtype == FA_KV_Q8_0) {
                char *blk = dst + (b0 / 32) * 34;
                uint16_t h = fa_f32_to_f16(d);
                memcpy(blk, &h, 2);
                q = (int8_t *)(blk + 2);
            } else {
                *scale = d;
                q = (int8_t *)dst;
            }
            float inv = d > 0.0f ? 1.0f / d : 0.0f; /* 0 for an all-zero row (and NaN rows) */
            for (int64_t i = 0; i < block; i++) {
                float v = rintf(x[b0 + i] * inv);
                q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
            }
        }
        break;
    }
    case FA_KV_FP8_E4M3:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fa_cpu_f32_to_e4m3(x[i] / head_scale);
        break;
    default: c->kern->from_f32(dst, x, n, p->dtype); break;
    }
}

static void append_all(const dec_ctx *c, float *row) {
    const fa_params *p = &c->pb->p;
    const int64_t es = fa_dtype_bytes(p->dtype), unit = c->unit;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_cpu_kv_sequence *seq = &c->seqs[b];
        for (int64_t t = 0; t < p->seqlen_new; t++) {
            const int64_t slot = seq->cached + t;
            for (int64_t h = 0; h < p->heads_kv; h++) {
                const char *k_src = (const char *)p->k_new +
                                    (b * p->knew_batch_stride + t * p->knew_row_stride + h * p->knew_head_stride) * es;
                const char *v_src = (const char *)p->v_new +
                                    (b * p->vnew_batch_stride + t * p->vnew_row_stride + h * p->vnew_head_stride) * es;
                char *k_dst = (char *)p->k + slot_offset(p, seq, b, slot, h, p->k_batch_stride, p->k_row_stride,
                                                         p->k_head_stride) * unit;
                char *v_dst = (char *)p->v + slot_offset(p, seq, b, slot, h, p->v_batch_stride, p->v_row_stride,
                                                         p->v_head_stride) * unit;
                if (p->kv_dtype == FA_KV_SAME) { /* bit for bit, as cpu_kvcache.c without rotary */
                    memmove(k_dst, k_src, (size_t)(p->head_dim * es));
                    memmove(v_dst, v_src, (size_t)(p->head_dim_v * es));
                    continue;
                }
                float *k_scale = NULL, *v_scale = NULL;
                float k_head = 1.0f, v_head = 1.0f;
                if (p->kv_dtype == FA_KV_INT8) {
                    k_scale = p->k_scale + slot_offset(p, seq, b, slot, h, p->k_scale_batch_stride,
                                                       p->k_scale_row_stride, p->k_scale_head_stride);
                    v_scale = p->v_scale + slot_offset(p, seq, b, slot, h, p->v_scale_batch_stride,
                                                       p->v_scale_row_stride, p->v_scale_head_stride);
                } else if (p->kv_dtype == FA_KV_FP8_E4M3) {
                    k_head = p->k_scale[h];
                    v_head = p->v_scale[h];
                }
                c->kern->to_f32(row, k_src, p->head_dim, p->dtype);
                store_row(c, k_dst, k_scale, row, p->head_dim, k_head);
                c->kern->to_f32(row, v_src, p->head_dim_v, p->dtype);
                store_row(c, v_dst, v_scale, row, p->head_dim_v, v_head);
            }
        }
    }
}

/* ---- phase 2: attention ---------------------------------------------------------------------------- */

/* Slot base pointers (head 0) of keys [j0, j0 + n) of sequence b. */
static void tile_bases(const dec_ctx *c, const fa_cpu_kv_sequence *seq, int64_t b, int64_t j0, int64_t n, const char **k_base,
                       const char **v_base) {
    const fa_params *p = &c->pb->p;
    for (int64_t j = 0; j < n; j++) {
        int64_t slot = seq->start + j0 + j;
        k_base[j] = (const char *)p->k +
                    slot_offset(p, seq, b, slot, 0, p->k_batch_stride, p->k_row_stride, 0) * c->unit;
        v_base[j] = (const char *)p->v +
                    slot_offset(p, seq, b, slot, 0, p->v_batch_stride, p->v_row_stride, 0) * c->unit;
    }
}

static int64_t row_bytes(const dec_ctx *c, int64_t dim) {
    switch (c->format) {
    case FA_CPU_KV_F32: return 4 * dim;
    case FA_CPU_KV_F16:
    case FA_CPU_KV_BF16: return 2 * dim;
    case FA_CPU_KV_Q8_0: return dim / 32 * 34;
    default: return dim;
    }
}

static void attention_item(dec_ctx *c, dec_scratch *w, int64_t b, int64_t local) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const dec_layout *l = &c->layout;
    const fa_cpu_kv_sequence *seq = &c->seqs[b];
    const int64_t d = p->head_dim, dv = p->head_dim_v, len_q = p->seqlen_q, len_k = seq->len_k;
    const int64_t es = fa_dtype_bytes(p->dtype);

    int64_t split = local % l->splits, rest = local / l->splits;
    int64_t q_block = rest % l->q_blocks;
    int64_t chunk = (rest / l->q_blocks) % l->head_chunks;
    int64_t kv_first = (rest / (l->q_blocks * l->head_chunks)) * l->kv_per_item;
    int64_t n_kv = p->heads_kv - kv_first < l->kv_per_item ? p->heads_kv - kv_first : l->kv_per_item;
    int64_t h0 = chunk * l->heads, n_h = pb->group - h0 < l->heads ? pb->group - h0 : l->heads;
    int64_t i0 = q_block * l->queries, n_i = len_q - i0 < l->queries ? len_q - i0 : l->queries;
    const int64_t rows = n_h * n_i; /* per kv head */

    int64_t per_split = (len_k + l->splits - 1) / l->splits;
    per_split = (per_split + TILE - 1) / TILE * TILE;
    int64_t split_begin = split * per_split, split_end = split_begin + per_split;
    if (split_end > len_k) split_end = len_k;
    if (split_begin > len_k) split_begin = len_k;

    /* rows of the item: kv head g, then query head, then query (r = g · rows + head · n_i + i);
     * they are the lanes of one keys-major score tile, so the masks and the online softmax run
     * once per tile for all kv heads */
    const int64_t all = n_kv * rows, all_pad = fa_cpu_round_up(all, FA_CPU_PAD);
    const float score_scale = p->softcap > 0.0f ? p->softmax_scale / p->softcap : p->softmax_scale;
    fa_cpu_item_rows *row = &w->rows;
    for (int64_t r = 0; r < all; r++) {
        int64_t g = r / rows, within = r % rows;
        row->head[r] = (kv_first + g) * pb->group + h0 + within / n_i;
        row->query[r] = i0 + within % n_i;
    }
    const fa_cpu_key_span span = fa_cpu_item_rows_start(row, pb, b, len_q, len_k, all, all_pad, split_begin, split_end);
    /* the query rows: fp32 times the score scale, or, for a bf16 cache scored by bf16 dot
     * products, the rows' own bf16 bits (in q16's storage) with the score scale in k_mult (the
     * same for every key) */
    uint16_t *q_bits = c->bf16_scores ? (uint16_t *)w->q16 : NULL;
    for (int64_t r = 0; r < all; r++) {
        int64_t off = b * p->q_batch_stride + row->query[r] * p->q_row_stride + row->head[r] * p->q_head_stride;
        if (q_bits) {
            memcpy(q_bits + r * d, (const uint16_t *)p->q + off, sizeof(uint16_t) * (size_t)d);
            continue;
        }
        float *q_row = w->q + r * d;
        c->kern->to_f32(q_row, (const char *)p->q + off * es, d, p->dtype);
        for (int64_t k = 0; k < d; k++) q_row[k] *= score_scale;
    }
    if (q_bits)
        for (int64_t j = 0; j < TILE; j++) w->k_mult[j] = score_scale;
    /* int8 cache: the rows as int16 for integer scores, each scaled to fa_cpu_q16_max (a
     * relative rounding error of at most 2^-16 of the row's largest element, far below the
     * cache's 8-bit quantisation; docs/design.md); fp32 rows if one is not finite (NaN kept) */
    const int16_t *q16 = NULL;
    if (c->dk->quantise_rows && c->format == FA_CPU_KV_I8 && c->dk->quantise_rows(w->q, all, d, w->q16, w->q16_scale))
        q16 = w->q16;
    memset(w->o, 0, sizeof(float) * (size_t)(all * dv));
    memset(w->s, 0, sizeof(float) * (size_t)(TILE * all_pad));

    const int64_t shift = len_k - len_q;
    const int64_t k_bytes = row_bytes(c, d), v_bytes = row_bytes(c, dv);
    fa_cpu_decode_tile t;
    t.format = c->format;
    t.integer_pv = c->integer_pv;
    t.k_rows = w->k_rows;
    t.v_rows = w->v_rows;
    t.d = d;
    t.dv = dv;
    t.n_rows = rows;
    t.ld = all_pad;
    t.k_next = w->k_next;
    t.v_next = w->v_next;
    t.k_bytes = k_bytes;
    t.v_bytes = v_bytes;
    int64_t j0 = span.begin;
    if (j0 < span.end) tile_bases(c, seq, b, j0, span.end - j0 < TILE ? span.end - j0 : TILE, w->k_base_next, w->v_base_next);
    for (; j0 < span.end; j0 += TILE) {
        const int64_t n = span.end - j0 < TILE ? span.end - j0 : TILE;
        const char **swap = w->k_base;
        w->k_base = w->k_base_next;
        w->k_base_next = swap;
        swap = w->v_base;
        w->v_base = w->v_base_next;
        w->v_base_next = swap;
        /* the next tile's rows of this item's kv heads go into L2 while this tile computes,
         * prefetched by the kernels (fa_cpu_decode_tile.k_next) */
        const int64_t j1 = j0 + TILE;
        int64_t n1 = 0;
        if (j1 < span.end) {
            n1 = span.end - j1 < TILE ? span.end - j1 : TILE;
            tile_bases(c, seq, b, j1, n1, w->k_base_next, w->v_base_next);
        }
        if (p->kv_dtype == FA_KV_INT8)
            for (int64_t j = 0; j < n; j++) {
                int64_t slot = seq->start + j0 + j;
                w->k_scale_row[j] = p->k_scale + slot_offset(p, seq, b, slot, 0, p->k_scale_batch_stride,
                                                             p->k_scale_row_stride, 0);
                w->v_scale_row[j] = p->v_scale + slot_offset(p, seq, b, slot, 0, p->v_scale_batch_stride,
                                                             p->v_scale_row_stride, 0);
            }
        t.n_keys = n;
        t.n_next = n1;
        /* scores of every kv head into its lanes of the tile */
        for (int64_t g = 0; g < n_kv; g++) {
            const int64_t h = kv_first + g;
            for (int64_t j = 0; j < n1; j++) w->k_next[j] = w->k_base_next[j] + h * p->k_head_stride * c->unit;
            for (int64_t j = 0; j < n; j++) w->k_rows[j] = w->k_base[j] + h * p->k_head_stride * c->unit;
            t.k_mult = q_bits ? w->k_mult : NULL;
            if (p->kv_dtype == FA_KV_INT8) {
                for (int64_t j = 0; j < n; j++) w->k_mult[j] = w->k_scale_row[j][h * p->k_scale_head_stride];
                t.k_mult = w->k_mult;
            } else if (p->kv_dtype == FA_KV_FP8_E4M3) {
                for (int64_t j = 0; j < n; j++) w->k_mult[j] = 256.0f * p->k_scale[h];
                t.k_mult = w->k_mult;
            }
            t.q = w->q + g * rows * d;
            t.q16 = q16 ? q16 + g * rows * d : NULL;
            t.q16_scale = w->q16_scale + g * rows;
            t.q_bf16 = q_bits ? q_bits + g * rows * d : NULL;
            t.s = w->s + g * rows;
            c->dk->scores(&t);
        }
        /* softcap / ALiBi / masks and the online softmax, all rows at once */
        const int needs_mask = !(span.full_begin <= j0 && j0 + n <= span.full_end);
        fa_cpu_item_transform(c->kern, row, p, w->s, all, all_pad, j0, n, shift, needs_mask);
        if (pb->has_mods) { /* the bias over (query, cache slot) */
            const fa_cpu_mod_rows mods = {b, {0, 0, len_q, len_k}, seq->start, row->head, row->query, 0, 0, all};
            fa_cpu_apply_mods(pb, &mods, w->s, all_pad, 1, j0, n);
        }
        c->kern->softmax_step(w->s, all_pad, n, all_pad, row->max, row->sum, row->alpha);
        /* o += P V per kv head (P times the values' dequantisation factors) */
        for (int64_t g = 0; g < n_kv; g++) {
            const int64_t h = kv_first + g;
            for (int64_t j = 0; j < n1; j++) w->v_next[j] = w->v_base_next[j] + h * p->v_head_stride * c->unit;
            for (int64_t j = 0; j < n; j++) w->v_rows[j] = w->v_base[j] + h * p->v_head_stride * c->unit;
            if (p->kv_dtype == FA_KV_INT8 || p->kv_dtype == FA_KV_FP8_E4M3)
                for (int64_t j = 0; j < n; j++) {
                    float m = p->kv_dtype == FA_KV_INT8 ? w->v_scale_row[j][h * p->v_scale_head_stride]
                                                        : 256.0f * p->v_scale[h];
                    float *s_row = w->s + j * all_pad + g * rows;
                    for (int64_t r = 0; r < rows; r++) s_row[r] *= m;
                }
            t.s = w->s + g * rows;
            t.o = w->o + g * rows * dv;
            t.alpha = row->alpha + g * rows;
            c->dk->accumulate(&t);
        }
    }

    /* ---- store: the final o / lse (one split) or this split's partial state ---- */
    for (int64_t r = 0; r < all; r++) {
        int64_t h = row->head[r], i = row->query[r];
        const float *o_row = w->o + r * dv;
        int64_t row_index = (b * p->heads_q + h) * len_q + i;
        if (l->splits > 1) {
            int64_t part = split * p->batch * p->heads_q * len_q + row_index;
            if (isnan(row->sum[r]) || isnan(row->max[r])) { /* a NaN score: the merge makes the row NaN */
                float *dst = c->o_part + part * dv;
                for (int64_t k = 0; k < dv; k++) dst[k] = NAN;
                c->lse_part[part] = NAN;
            } else if (row->sum[r] > 0.0f) {
                float *dst = c->o_part + part * dv;
                for (int64_t k = 0; k < dv; k++) dst[k] = o_row[k] / row->sum[r];
                c->lse_part[part] = (float)((double)row->max[r] + log((double)row->sum[r]));
            } else {
                c->lse_part[part] = -INFINITY;
            }
            continue;
        }
        double lse = fa_cpu_item_finish_row(row, p, r, o_row, dv, w->out);
        int64_t off = b * p->o_batch_stride + i * p->o_row_stride + h * p->o_head_stride;
        c->kern->from_f32((char *)p->o + off * es, w->out, dv, p->dtype);
        if (p->lse) p->lse[row_index] = (float)lse;
    }
}

static void attention_task(void *arg, int thread_index) {
    dec_ctx *c = (dec_ctx *)arg;
    dec_scratch w;
    scratch_layout(c->pb, c->scratch + (size_t)thread_index * c->scratch_bytes, &w);
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        attention_item(c, &w, item / c->layout.per_sequence, item % c->layout.per_sequence);
    }
}

/* ---- driver ------------------------------------------------------------------------------------------ */

fa_status fa_cpu_decode_forward(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const int threads = fa_cpu_thread_count(pb);
    fa_cpu_kv_plan plan = plan_of(pb, threads, split_bound(pb, threads));
    fa_cpu_workspace ws;
    if (!fa_cpu_workspace_acquire(pb, plan.total, &ws)) return FA_ERR_ALLOC;

    dec_ctx c;
    memset(&c, 0, sizeof c);
    c.pb = pb;
    c.kern = fa_cpu_select_kernels();
    c.dk = decode_kernels();
    c.format = format_of(p);
    c.integer_pv = integer_pv_here(c.dk);
    c.bf16_scores = bf16_scores_here(c.dk, c.format);
    c.unit = cache_unit(p);
    const fa_cpu_kv_pieces at = fa_cpu_kv_pieces_at(&plan, ws.base);
    c.o_part = at.o_part;
    c.lse_part = at.lse_part;
    c.scratch = at.scratch;
    c.scratch_bytes = plan.per_thread;
    c.seqs = at.seqs;

    const int64_t longest = fa_cpu_kv_sequences(p, at.seqs);

    if (p->k_new) {
        dec_scratch w;
        scratch_layout(pb, c.scratch, &w);
        append_all(&c, w.out);
    }

    c.layout = layout_of(pb);
    c.layout.splits = fa_cpu_decode_split_count(p->batch * c.layout.per_sequence, longest, threads, p->num_splits);
    c.layout.per_sequence *= c.layout.splits;
    c.total_items = p->batch * c.layout.per_sequence;
    atomic_init(&c.next_item, 0);
    fa_cpu_parallel_run(threads < c.total_items ? threads : (int)c.total_items, attention_task, &c);

    if (c.layout.splits > 1) fa_cpu_merge_splits(p, c.kern, c.layout.splits, c.lse_part, c.o_part, threads);
    fa_cpu_workspace_release(&ws);
    return FA_OK;
}
