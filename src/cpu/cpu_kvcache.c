/*
 * cpu_kvcache.c: fa_kvcache_forward on the CPU: rotary embedding, the in-place cache append,
 * and attention over a contiguous or paged cache with split-KV (flash-decoding).
 *
 * Sequence b (its geometry is resolved once into a fa_cpu_kv_sequence):
 *   cached = cache_seqlens[b] (or seqlen_k), start = cache_leftpad[b] (or 0),
 *   slots [start, cached + appended) are its keys; key j (0-based) lives in slot start + j of
 *   cache row cache_batch_idx[b] (contiguous) or of page block_table[b][slot / page_size] at
 *   row slot % page_size (paged).
 *
 * Three phases, each a parallel run over work items (cpu_threads.c):
 *   1. append (k_new set): item (b, t), t < seqlen_new, writes new token t of every kv head into
 *      slot cached + t (rotary position cached + t, the slot itself, left padding included):
 *      k rotated (rotary_cos/sin) in fp32 and rounded to the dtype, v copied bit for bit. When two
 *      items would write one physical slot (repeated cache_batch_idx, pages shared between
 *      sequences), the phase runs on one thread in (b, t) order, so the last sequence wins
 *      deterministically.
 *   2. attention: items (b, kv heads, head chunk, query block, split), as in cpu_forward.c: the
 *      query heads of a GQA group that share a kv head are packed into one item when a sequence
 *      has fewer than 64 queries (decoding), so each K/V byte is read once. When a group's rows
 *      are few (decoding: group · seqlen_q <= 16) and the AVX-512 kernels run, an item takes
 *      several whole groups (up to 64 rows) and reads the cache slot by slot across its kv heads
 *      (the "streaming layout", see layout_without_splits), scoring with AVX-512 dot products
 *      (score_tile_avx512); otherwise the scores are the engine's GEMM. q rows are rotated on
 *      load (query i at position cached + i when causal or windowed, else cached for every
 *      query, as flash_attn 2.x). A split covers a contiguous range of
 *      key blocks; with one split the item normalises and stores o / lse itself (sink included),
 *      otherwise it writes its partial state (fp32 o, lse without the sink) to the workspace.
 *   3. merge (splits > 1): item = a block of output rows, each merged over its splits with the
 *      sink (cpu_merge.c), rounded to the dtype.
 * Splits: num_splits = 0 asks fa_num_splits_heuristic (work units = items without splitting,
 * key blocks of the longest sequence, workers = threads), n >= 1 uses min(n, key blocks).
 * Results are bitwise identical for every thread count: each output row has one producer per
 * split with a fixed order of operations, and the merge order is fixed.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_decode.h"
#include "cpu_engine.h"
#include "cpu_merge.h"

/* x86-64 with GCC / clang: the AVX-512 dot-product scores below can be compiled (and are used when
 * the AVX-512 kernels are selected at run time). */
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define FA_KV_HAVE_AVX512 1
#endif

#define BLOCK_ROWS FA_CPU_BLOCK_ROWS
#define BLOCK_KEYS FA_CPU_BLOCK_KEYS

/* How the work items cover one sequence (the same for every sequence: len_q = seqlen_q). */
typedef struct kv_layout {
    int64_t heads_per_item; /* query heads of a GQA group packed into one item                 */
    int64_t head_chunks;    /* items per group and query block                                  */
    int64_t kv_per_item;    /* kv heads (whole groups) of one item (> 1: the streaming layout)  */
    int64_t kv_blocks;      /* ceil(heads_kv / kv_per_item)                                      */
    int64_t q_blocks;       /* query blocks per head                                            */
    int64_t splits;         /* key ranges per (kv block, chunk, query block)                     */
    int64_t per_sequence;   /* kv_blocks · head_chunks · q_blocks · splits                      */
} kv_layout;

/* Streaming layout: when a whole GQA group's rows (group · seqlen_q) are few, one item takes
 * several kv heads and reads, for each key tile, the rows of all its kv heads slot by slot: the
 * cache [.., slot, kv head, d] is then read nearly sequentially instead of one head's 2 KB-strided
 * rows at a time, which the hardware prefetchers follow (docs/tuning-log.md, CPU decode: 30 GB/s
 * sequential against 8 GB/s per head on one core). It needs the dot-product scores (a GEMM would
 * compute every lane for every kv head). KV_STREAM_KEYS keys per tile keep the converted V of
 * up to KV_STREAM_HEADS heads in L2. */
#define KV_STREAM_KEYS 32
#define KV_STREAM_HEADS 16

static kv_layout layout_without_splits(const fa_problem *pb, int streaming) {
    kv_layout l;
    int64_t len_q = pb->p.seqlen_q;
    fa_cpu_row_packing r = fa_cpu_pack_rows(len_q, pb->group);
    l.heads_per_item = r.heads_per_item;
    l.head_chunks = r.head_chunks;
    l.q_blocks = r.q_blocks;
    l.kv_per_item = 1;
    int64_t group_rows = pb->group * len_q;
    if (streaming && l.head_chunks == 1 && group_rows <= 16) {
        l.kv_per_item = BLOCK_ROWS / group_rows;
        if (l.kv_per_item > KV_STREAM_HEADS) l.kv_per_item = KV_STREAM_HEADS;
        if (l.kv_per_item > pb->p.heads_kv) l.kv_per_item = pb->p.heads_kv;
    }
    l.kv_blocks = (pb->p.heads_kv + l.kv_per_item - 1) / l.kv_per_item;
    l.splits = 1;
    l.per_sequence = l.kv_blocks * l.head_chunks * l.q_blocks;
    return l;
}

/* Whether the dot-product scores (and so the streaming layout) can serve this problem on this
 * machine; `assume_avx512` ignores the selected kernels (for a bound that holds for any). */
static int dot_scores_possible(const fa_problem *pb, const fa_cpu_kernels *kern, int assume_avx512) {
#ifdef FA_KV_HAVE_AVX512
    return pb->p.head_dim % 16 == 0 && (assume_avx512 || strcmp(kern->name, "avx512") == 0);
#else
    (void)pb;
    (void)kern;
    (void)assume_avx512;
    return 0;
#endif
}

static int64_t key_blocks_of(int64_t keys) {
    int64_t blocks = (keys + BLOCK_KEYS - 1) / BLOCK_KEYS;
    return blocks > 0 ? blocks : 1;
}

/* Largest split count a call of this problem can use (sizes the workspace): the run-time count
 * (split_count) never exceeds it, since the longest sequence has at most seqlen_k keys, the
 * heuristic returns at most min(FA_KV_MAX_SPLITS, workers, key blocks), and the fewest work
 * units (the streaming layout) are assumed. */
static int64_t split_bound(const fa_problem *pb, int threads) {
    int64_t blocks = key_blocks_of(pb->p.seqlen_k);
    if (pb->p.num_splits >= 1) return pb->p.num_splits < blocks ? pb->p.num_splits : blocks;
    int64_t units = pb->p.batch * layout_without_splits(pb, pb->p.head_dim % 16 == 0).per_sequence;
    if (10 * units >= 8 * (int64_t)threads) return 1;
    int64_t bound = FA_KV_MAX_SPLITS < threads ? FA_KV_MAX_SPLITS : threads;
    return bound < blocks ? bound : blocks;
}

static int64_t split_count(const fa_problem *pb, const kv_layout *l, int threads, int64_t longest_keys) {
    int64_t blocks = key_blocks_of(longest_keys);
    if (pb->p.num_splits >= 1) return pb->p.num_splits < blocks ? pb->p.num_splits : blocks;
    return fa_num_splits_heuristic(pb->p.batch * l->per_sequence, blocks, threads, FA_KV_MAX_SPLITS);
}

/* Element offset of (slot, head) of sequence b in a cache with the given strides. */
static inline int64_t slot_offset(const fa_params *p, const fa_cpu_kv_sequence *seq, int64_t b, int64_t slot,
                                  int64_t head, int64_t batch_stride, int64_t row_stride,
                                  int64_t head_stride) {
    if (p->block_table) {
        int64_t page = p->block_table[b * p->block_table_batch_stride + slot / p->page_size];
        return page * batch_stride + (slot % p->page_size) * row_stride + head * head_stride;
    }
    return seq->cache_row * batch_stride + slot * row_stride + head * head_stride;
}

/* Position `pos` of the rotary tables into cos_row / sin_row (rotary_dim / 2 floats each). */
static void load_rotary(const fa_params *p, const fa_cpu_kernels *kern, int64_t pos, float *cos_row,
                        float *sin_row) {
    const int64_t half = p->rotary_dim / 2;
    const size_t elem = fa_dtype_bytes(p->dtype);
    kern->to_f32(cos_row, (const char *)p->rotary_cos + pos * half * (int64_t)elem, half, p->dtype);
    kern->to_f32(sin_row, (const char *)p->rotary_sin + pos * half * (int64_t)elem, half, p->dtype);
}

/* Rotate the first rotary_dim elements of x in place: pairs (2r, 2r+1) when interleaved, else
 * (r, r + rotary_dim/2); x_a' = x_a cos - x_b sin, x_b' = x_a sin + x_b cos, in fp32. */
static void rotate(float *x, const float *cos_row, const float *sin_row, int64_t rotary_dim,
                   int interleaved) {
    const int64_t half = rotary_dim / 2;
    for (int64_t r = 0; r < half; r++) {
        int64_t ia = interleaved ? 2 * r : r, ib = interleaved ? 2 * r + 1 : r + half;
        float xa = x[ia], xb = x[ib], c = cos_row[r], s = sin_row[r];
        x[ia] = xa * c - xb * s;
        x[ib] = xa * s + xb * c;
    }
}

/* ---- scores of a few query rows against a key tile: AVX-512 dot products --------------------- */

/* With few query rows per item (decoding: a GQA group of 4 to 8 heads, one token) the engine's
 * keys-major GEMM fills 4 of 16 lanes and needs K converted to fp32 first. Here each K row is
 * read once in its own dtype as d / 16 vectors and dotted with up to 4 query rows at a time
 * (4 keys × 4 rows = 16 accumulators), then reduced across lanes: a quarter of the FMAs and no
 * conversion pass. Used when the AVX-512 kernels are selected and head_dim % 16 == 0. */
#ifdef FA_KV_HAVE_AVX512
#include <immintrin.h>
#define FA_KV_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))

FA_KV_TARGET static inline __m512 load16_as_f32(const char *src, fa_dtype dtype) {
    if (dtype == FA_DTYPE_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src)), 16));
    if (dtype == FA_DTYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
    return _mm512_loadu_ps((const float *)src);
}

/* s[j·ld + r] = scale · k_j · q_{r0 + r} for r < ROWS (<= 4), every key j < n_keys. */
FA_KV_TARGET static inline __attribute__((always_inline)) void dot_rows(
    const int ROWS, const char *const *k_rows, int64_t n_keys, fa_dtype dtype, int64_t d,
    const float *q_rows, int64_t r0, float scale, float *s, int64_t ld) {
    const int64_t step = dtype == FA_DTYPE_F32 ? 64 : 32; /* bytes of 16 elements          */
    int64_t j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        __m512 acc[4][4];
        for (int r = 0; r < ROWS; r++)
            for (int k = 0; k < 4; k++) acc[r][k] = _mm512_setzero_ps();
        for (int64_t c = 0, at = 0; c < d; c += 16, at += step) {
            __m512 kv[4];
            for (int k = 0; k < 4; k++) kv[k] = load16_as_f32(k_rows[j + k] + at, dtype);
            for (int r = 0; r < ROWS; r++) {
                __m512 qv = _mm512_loadu_ps(q_rows + (r0 + r) * d + c);
                for (int k = 0; k < 4; k++) acc[r][k] = _mm512_fmadd_ps(kv[k], qv, acc[r][k]);
            }
        }
        for (int k = 0; k < 4; k++)
            for (int r = 0; r < ROWS; r++) s[(j + k) * ld + r0 + r] = scale * _mm512_reduce_add_ps(acc[r][k]);
    }
    for (; j < n_keys; j++) {
        __m512 acc[4];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t c = 0, at = 0; c < d; c += 16, at += step) {
            __m512 kv = load16_as_f32(k_rows[j] + at, dtype);
            for (int r = 0; r < ROWS; r++)
                acc[r] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q_rows + (r0 + r) * d + c), acc[r]);
        }
        for (int r = 0; r < ROWS; r++) s[j * ld + r0 + r] = scale * _mm512_reduce_add_ps(acc[r]);
    }
}

/* Columns 0..rows-1 of the keys-major score tile s[n_keys][ld] for `rows` query rows (q_rows
 * [rows][d] fp32); other columns are left alone. */
FA_KV_TARGET static void score_tile_avx512(const char *const *k_rows, int64_t n_keys, fa_dtype dtype,
                                           int64_t d, const float *q_rows, int64_t rows, float scale,
                                           float *s, int64_t ld) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        switch (rows - r0 >= 4 ? 4 : rows - r0) {
        case 4: dot_rows(4, k_rows, n_keys, dtype, d, q_rows, r0, scale, s, ld); break;
        case 3: dot_rows(3, k_rows, n_keys, dtype, d, q_rows, r0, scale, s, ld); break;
        case 2: dot_rows(2, k_rows, n_keys, dtype, d, q_rows, r0, scale, s, ld); break;
        default: dot_rows(1, k_rows, n_keys, dtype, d, q_rows, r0, scale, s, ld); break;
        }
    }
}
#endif

/* ---- shared state of one call ----------------------------------------------------------------- */

typedef struct kv_ctx {
    const fa_problem *pb;
    const fa_cpu_kernels *kern;
    const fa_cpu_kv_sequence *seqs; /* [batch]                                                     */
    kv_layout layout;
    atomic_llong next_item;
    int64_t total_items;
    char *scratch;           /* thread t owns scratch + t · scratch_bytes                    */
    size_t scratch_bytes;
    float *o_part;           /* splits > 1: [splits][batch][heads_q][seqlen_q][head_dim_v]    */
    float *lse_part;         /* splits > 1: [splits][batch][heads_q][seqlen_q]                */
    int64_t d, dv, dv_pad;
    size_t elem;
    int k_direct, v_direct;  /* fp32 cache rows used in place when a tile is contiguous      */
    int dot_scores;          /* score tiles by score_tile_avx512 (few rows, d % 16 == 0)       */
} kv_ctx;

/* Per-thread scratch (shapes as in cpu_forward.c, plus the rotary rows). */
typedef struct kv_scratch {
    float *q_t, *q_rows, *s_t, *o_acc, *k_buf, *v_buf, *row_tmp, *cos_row, *sin_row;
    fa_cpu_item_rows row;
    const char **k_ptrs; /* K rows of the tile (dot scores): [BLOCK_KEYS], or streaming
                            [KV_STREAM_HEADS][KV_STREAM_KEYS]                                 */
} kv_scratch;

static size_t scratch_layout(const fa_problem *pb, char *base, kv_scratch *s) {
    int64_t d = pb->p.head_dim, dv = pb->p.head_dim_v;
    int64_t dv_pad = fa_cpu_round_up(dv, FA_CPU_PAD);
    int64_t tmp = d > dv_pad ? d : dv_pad;
    int64_t half = pb->p.rotary_dim / 2 > 0 ? pb->p.rotary_dim / 2 : 1;
    fa_cpu_arena a = {base, 0};
    kv_scratch dummy;
    if (!s) s = &dummy;
    s->q_t = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d * BLOCK_ROWS));
    s->q_rows = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(d * BLOCK_ROWS));
    s->s_t = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_KEYS * BLOCK_ROWS));
    s->o_acc = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_ROWS * dv_pad));
    s->k_buf = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(BLOCK_KEYS * d));
    int64_t v_rows = BLOCK_KEYS > KV_STREAM_HEADS * KV_STREAM_KEYS ? BLOCK_KEYS : KV_STREAM_HEADS * KV_STREAM_KEYS;
    s->v_buf = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)(v_rows * dv_pad));
    s->row_tmp = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)tmp);
    s->cos_row = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)half);
    s->sin_row = (float *)fa_cpu_take(&a, sizeof(float) * (size_t)half);
    fa_cpu_item_rows_take(&a, &s->row);
    s->k_ptrs = (const char **)fa_cpu_take(&a, sizeof(char *) * (size_t)v_rows);
    return a.used;
}

/* ---- phase 1: rotary + append ------------------------------------------------------------------ */

/* Write new token t of sequence b (every kv head) into its cache slot. */
static void append_token(const kv_ctx *c, const kv_scratch *w, int64_t b, int64_t t) {
    const fa_params *p = &c->pb->p;
    const fa_cpu_kv_sequence *seq = &c->seqs[b];
    const int64_t slot = seq->cached + t;
    const int64_t elem = (int64_t)c->elem;
    if (p->rotary_cos) load_rotary(p, c->kern, slot, w->cos_row, w->sin_row);
    for (int64_t h = 0; h < p->heads_kv; h++) {
        const char *k_src = (const char *)p->k_new +
                            (b * p->knew_batch_stride + t * p->knew_row_stride + h * p->knew_head_stride) * elem;
        const char *v_src = (const char *)p->v_new +
                            (b * p->vnew_batch_stride + t * p->vnew_row_stride + h * p->vnew_head_stride) * elem;
        char *k_dst = (char *)p->k + slot_offset(p, seq, b, slot, h, p->k_batch_stride, p->k_row_stride,
                                                 p->k_head_stride) * elem;
        char *v_dst = (char *)p->v + slot_offset(p, seq, b, slot, h, p->v_batch_stride, p->v_row_stride,
                                                 p->v_head_stride) * elem;
        if (p->rotary_cos) {
            c->kern->to_f32(w->row_tmp, k_src, c->d, p->dtype);
            rotate(w->row_tmp, w->cos_row, w->sin_row, p->rotary_dim, p->rotary_interleaved);
            c->kern->from_f32(k_dst, w->row_tmp, c->d, p->dtype);
        } else {
            memmove(k_dst, k_src, (size_t)(c->d * elem));
        }
        memmove(v_dst, v_src, (size_t)(c->dv * elem)); /* v is never rotated: a bitwise copy */
    }
}

static void append_task(void *arg, int thread_index) {
    kv_ctx *c = (kv_ctx *)arg;
    kv_scratch w;
    scratch_layout(c->pb, c->scratch + (size_t)thread_index * c->scratch_bytes, &w);
    const int64_t n_new = c->pb->p.seqlen_new;
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        append_token(c, &w, item / n_new, item % n_new);
    }
}

static int compare_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* 1 if two (b, t) items would write the same physical cache slot. ids: batch · seqlen_new. */
static int appends_collide(const kv_ctx *c, int64_t *ids) {
    const fa_params *p = &c->pb->p;
    int64_t n = 0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t t = 0; t < p->seqlen_new; t++) {
            const fa_cpu_kv_sequence *seq = &c->seqs[b];
            int64_t slot = seq->cached + t;
            ids[n++] = p->block_table
                           ? p->block_table[b * p->block_table_batch_stride + slot / p->page_size] *
                                     p->page_size + slot % p->page_size
                           : seq->cache_row * p->seqlen_k + slot;
        }
    qsort(ids, (size_t)n, sizeof ids[0], compare_i64);
    for (int64_t i = 1; i < n; i++)
        if (ids[i] == ids[i - 1]) return 1;
    return 0;
}

/* ---- phase 2: attention ------------------------------------------------------------------------ */

/* Key tile [j0, j0 + n_keys) of sequence b and kv head h as fp32 rows: *rows / *ld point at the
 * cache itself (fp32 and contiguous in memory) or at `buf` (converted, leading dimension
 * buf_ld). `dim` elements per row. */
static void load_key_tile(const kv_ctx *c, const fa_cpu_kv_sequence *seq, int64_t b, int64_t h, int64_t j0,
                          int64_t n_keys, const void *cache, int64_t batch_stride, int64_t row_stride,
                          int64_t head_stride, int64_t dim, int direct, float *buf, int64_t buf_ld,
                          const float **rows, int64_t *ld) {
    const fa_params *p = &c->pb->p;
    const int64_t first = seq->start + j0, last = first + n_keys - 1;
    if (direct && (!p->block_table || first / p->page_size == last / p->page_size)) {
        *rows = (const float *)cache + slot_offset(p, seq, b, first, h, batch_stride, row_stride, head_stride);
        *ld = row_stride;
        return;
    }
    for (int64_t j = 0; j < n_keys; j++) {
        int64_t off = slot_offset(p, seq, b, first + j, h, batch_stride, row_stride, head_stride);
        c->kern->to_f32(buf + j * buf_ld, (const char *)cache + off * (int64_t)c->elem, dim, p->dtype);
    }
    *rows = buf;
    *ld = buf_ld;
}

#ifdef FA_KV_HAVE_AVX512 /* the streaming layout runs only on the AVX-512 path */
/* K and V of one streaming tile: for each slot, the rows of every kv head of the item (the
 * order the cache holds them in), K as row pointers for the dot products, V converted to fp32
 * into v_buf[g][j][dv_pad]. */
static void load_stream_tile(const kv_ctx *c, const kv_scratch *w, const fa_cpu_kv_sequence *seq, int64_t b,
                             int64_t kv_first, int64_t n_kv, int64_t j0, int64_t n_keys) {
    const fa_params *p = &c->pb->p;
    const int64_t elem = (int64_t)c->elem;
    for (int64_t j = 0; j < n_keys; j++) {
        int64_t slot = seq->start + j0 + j;
        for (int64_t g = 0; g < n_kv; g++) {
            int64_t h = kv_first + g;
            w->k_ptrs[g * KV_STREAM_KEYS + j] =
                (const char *)p->k + slot_offset(p, seq, b, slot, h, p->k_batch_stride, p->k_row_stride,
                                                 p->k_head_stride) * elem;
            const char *v_row = (const char *)p->v + slot_offset(p, seq, b, slot, h, p->v_batch_stride,
                                                                 p->v_row_stride, p->v_head_stride) * elem;
            c->kern->to_f32(w->v_buf + (g * KV_STREAM_KEYS + j) * c->dv_pad, v_row, c->dv, p->dtype);
        }
    }
}
#endif

/* One work item's rows and keys: (kv block, head chunk, query block, split). Rows are numbered
 * kv head of the item (g), then query head of its group, then query:
 * row r = (g · n_heads + head) · n_i + i. */
typedef struct kv_item {
    int64_t split;
    int64_t kv_first, n_kv;         /* kv heads [kv_first, kv_first + n_kv)               */
    int64_t chunk, n_heads;         /* query-head chunk of the group, heads in it         */
    int64_t i0, n_i;                /* queries [i0, i0 + n_i)                              */
    int64_t rows_per_kv, rows, rows_pad;
    int streaming;                  /* several kv heads per item: the AVX-512 stream path  */
    int dot;                        /* scores by dot products instead of a GEMM            */
    int64_t tile;                   /* keys per step                                       */
    int64_t split_begin, split_end; /* this split's keys: a range of whole key blocks      */
} kv_item;

/* Item `local` (its index within sequence b). */
static kv_item item_of(const kv_ctx *c, int64_t b, int64_t local) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const kv_layout *l = &c->layout;
    const int64_t len_q = p->seqlen_q, len_k = c->seqs[b].len_k;
    kv_item it;
    it.split = local % l->splits;
    int64_t rest = local / l->splits;
    int64_t per_kv_block = l->head_chunks * l->q_blocks;
    it.kv_first = (rest / per_kv_block) * l->kv_per_item;
    it.n_kv = p->heads_kv - it.kv_first < l->kv_per_item ? p->heads_kv - it.kv_first : l->kv_per_item;
    it.chunk = (rest % per_kv_block) / l->q_blocks;
    int64_t q_block = l->q_blocks - 1 - (rest % per_kv_block) % l->q_blocks;
    it.n_heads = pb->group - it.chunk * l->heads_per_item;
    if (it.n_heads > l->heads_per_item) it.n_heads = l->heads_per_item;
    it.i0 = q_block * BLOCK_ROWS;
    it.n_i = len_q - it.i0 < BLOCK_ROWS ? len_q - it.i0 : BLOCK_ROWS;
    it.rows_per_kv = it.n_heads * it.n_i;
    it.rows = it.n_kv * it.rows_per_kv;
    it.rows_pad = fa_cpu_round_up(it.rows, FA_CPU_PAD);
    it.streaming = l->kv_per_item > 1;
    it.dot = c->dot_scores && it.rows_per_kv <= 16;
    it.tile = it.streaming ? KV_STREAM_KEYS : BLOCK_KEYS;
    int64_t blocks_per_split = (key_blocks_of(len_k) + l->splits - 1) / l->splits;
    it.split_begin = it.split * blocks_per_split * BLOCK_KEYS;
    it.split_end = it.split_begin + blocks_per_split * BLOCK_KEYS;
    if (it.split_end > len_k) it.split_end = len_k;
    return it;
}

/* q rows of the item (rotated, rounded to the dtype as flash_attn's rotary kernel stores them),
 * and Qᵀ with padding lanes zero for the GEMM path. */
static void load_item_q(const kv_ctx *c, const kv_scratch *w, const kv_item *it, int64_t b) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const fa_cpu_kv_sequence *seq = &c->seqs[b];
    const int64_t d = c->d, elem = (int64_t)c->elem;
    const fa_cpu_item_rows *row = &w->row;
    int per_query_position = pb->has_mask; /* flash_attn: causal or local */
    for (int64_t r = 0; r < it->rows; r++) {
        int64_t i = row->query[r], h = row->head[r];
        int64_t off = b * p->q_batch_stride + i * p->q_row_stride + h * p->q_head_stride;
        float *q_row = w->q_rows + r * d;
        kern->to_f32(q_row, (const char *)p->q + off * elem, d, p->dtype);
        if (p->rotary_cos) {
            if (r == 0 || per_query_position)
                load_rotary(p, kern, seq->cached + (per_query_position ? i : 0), w->cos_row, w->sin_row);
            rotate(q_row, w->cos_row, w->sin_row, p->rotary_dim, p->rotary_interleaved);
            kern->from_f32(w->row_tmp, q_row, d, p->dtype);
            kern->to_f32(q_row, w->row_tmp, d, p->dtype);
        }
    }
    if (!it->dot) fa_cpu_transpose_rows(w->q_t, it->rows_pad, w->q_rows, it->rows, d);
}

/* Scores s_t[j][r] = scale · k_j · q_r of keys [j0, j0 + n_keys); *v_rows / *ldv: where the
 * tile's V rows are for P·V (not set on the streaming path, which stages V itself). */
static void item_scores(kv_ctx *c, const kv_scratch *w, const kv_item *it, int64_t b, int64_t j0, int64_t n_keys,
                        float score_scale, const float **v_rows, int64_t *ldv) {
    const fa_params *p = &c->pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const fa_cpu_kv_sequence *seq = &c->seqs[b];
    const int64_t d = c->d, dv = c->dv, dv_pad = c->dv_pad, elem = (int64_t)c->elem;
    const int64_t rows_pad = it->rows_pad, kv_first = it->kv_first;
#ifdef FA_KV_HAVE_AVX512
    const int64_t rows = it->rows; /* the AVX-512 score tiles only: the rows past them are zeroed */
#endif
    if (it->streaming) {
#ifdef FA_KV_HAVE_AVX512
        load_stream_tile(c, w, seq, b, kv_first, it->n_kv, j0, n_keys);
        for (int64_t g = 0; g < it->n_kv; g++)
            score_tile_avx512(w->k_ptrs + g * KV_STREAM_KEYS, n_keys, p->dtype, d,
                              w->q_rows + g * it->rows_per_kv * d, it->rows_per_kv, score_scale,
                              w->s_t + g * it->rows_per_kv, rows_pad);
        for (int64_t j = 0; j < n_keys; j++)
            for (int64_t r = rows; r < rows_pad; r++) w->s_t[j * rows_pad + r] = 0.0f;
#endif
        return;
    }
    const float *k_rows = NULL;
    int64_t ldk = 0;
    if (it->dot) {
        for (int64_t j = 0; j < n_keys; j++)
            w->k_ptrs[j] = (const char *)p->k + slot_offset(p, seq, b, seq->start + j0 + j, kv_first,
                                                            p->k_batch_stride, p->k_row_stride,
                                                            p->k_head_stride) * elem;
    } else {
        load_key_tile(c, seq, b, kv_first, j0, n_keys, p->k, p->k_batch_stride, p->k_row_stride,
                      p->k_head_stride, d, c->k_direct, w->k_buf, d, &k_rows, &ldk);
    }
    load_key_tile(c, seq, b, kv_first, j0, n_keys, p->v, p->v_batch_stride, p->v_row_stride,
                  p->v_head_stride, dv, c->v_direct, w->v_buf, dv_pad, v_rows, ldv);
#ifdef FA_KV_HAVE_AVX512
    if (it->dot) {
        score_tile_avx512(w->k_ptrs, n_keys, p->dtype, d, w->q_rows, rows, score_scale, w->s_t, rows_pad);
        for (int64_t j = 0; j < n_keys; j++)
            for (int64_t r = rows; r < rows_pad; r++) w->s_t[j * rows_pad + r] = 0.0f;
        return;
    }
#endif
    fa_cpu_gemm_args qk = {n_keys, rows_pad, d, k_rows, ldk, 1, w->q_t, rows_pad, w->s_t, rows_pad,
                           FA_CPU_GEMM_STORE, score_scale, NULL};
    kern->gemm(&qk);
}

/* Store: the final o / lse (one split) or this split's partial state. */
static void store_item(kv_ctx *c, const kv_scratch *w, const kv_item *it, int64_t b) {
    const fa_params *p = &c->pb->p;
    const int64_t dv = c->dv, dv_pad = c->dv_pad, elem = (int64_t)c->elem, len_q = p->seqlen_q;
    const fa_cpu_item_rows *row = &w->row;
    for (int64_t r = 0; r < it->rows; r++) {
        int64_t h = row->head[r], i = row->query[r];
        float *o_row = w->o_acc + r * dv_pad;
        int64_t row_index = (b * p->heads_q + h) * len_q + i; /* [batch][heads_q][seqlen_q]  */
        if (c->layout.splits > 1) {
            int64_t part = it->split * p->batch * p->heads_q * len_q + row_index;
            double row_max = row->max[r], row_sum = row->sum[r];
            if (isnan(row_sum) || isnan(row_max)) { /* a NaN score: the merge makes the row NaN */
                float *dst = c->o_part + part * dv;
                for (int64_t k = 0; k < dv; k++) dst[k] = NAN;
                c->lse_part[part] = NAN;
            } else if (row_sum > 0.0) {
                float sum = row->sum[r];
                float *dst = c->o_part + part * dv;
                for (int64_t k = 0; k < dv; k++) dst[k] = o_row[k] / sum;
                c->lse_part[part] = (float)(row_max + log(row_sum));
            } else {
                c->lse_part[part] = -INFINITY; /* empty: the merge skips it, o is not read */
            }
            continue;
        }
        double lse = fa_cpu_item_finish_row(row, p, r, o_row, dv, w->row_tmp);
        int64_t off = b * p->o_batch_stride + i * p->o_row_stride + h * p->o_head_stride;
        c->kern->from_f32((char *)p->o + off * elem, w->row_tmp, dv, p->dtype);
        if (p->lse) p->lse[row_index] = (float)lse;
    }
}

/* One work item: `local` is the item's index within sequence b (item_of). */
static void attention_item(kv_ctx *c, const kv_scratch *w, int64_t b, int64_t local) {
    const fa_problem *pb = c->pb;
    const fa_params *p = &pb->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t dv_pad = c->dv_pad;
    const int64_t len_q = p->seqlen_q, len_k = c->seqs[b].len_k;
    const kv_item it = item_of(c, b, local);
    const int64_t rows = it.rows, rows_pad = it.rows_pad, rows_per_kv = it.rows_per_kv;

    /* ---- per-row key ranges (within the split), their union and the range every row sees ---- */
    const fa_cpu_item_rows *row = &w->row;
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = r / rows_per_kv, within = r % rows_per_kv;
        row->head[r] = (it.kv_first + g) * pb->group + it.chunk * c->layout.heads_per_item + within / it.n_i;
        row->query[r] = it.i0 + within % it.n_i;
    }
    const fa_cpu_key_span keys =
        fa_cpu_item_rows_start(row, pb, b, len_q, len_k, rows, rows_pad, it.split_begin, it.split_end);

    load_item_q(c, w, &it, b);
    memset(w->o_acc, 0, sizeof(float) * (size_t)(rows * dv_pad));
    if (it.streaming || !c->v_direct) /* padding columns of the V tiles stay 0 */
        memset(w->v_buf, 0, sizeof(float) * (size_t)((it.streaming ? it.n_kv * KV_STREAM_KEYS : BLOCK_KEYS) * dv_pad));

    const float score_scale = p->softcap > 0.0f ? p->softmax_scale / p->softcap : p->softmax_scale;
    const int64_t shift = len_k - len_q;

    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += it.tile) {
        int64_t n_keys = keys.end - j0 < it.tile ? keys.end - j0 : it.tile;
        const float *v_rows = NULL;
        int64_t ldv = 0;
        item_scores(c, w, &it, b, j0, n_keys, score_scale, &v_rows, &ldv);

        /* ---- softcap / ALiBi / masks, then the online softmax: s_t -> P ---- */
        int needs_mask = !(keys.full_begin <= j0 && j0 + n_keys <= keys.full_end);
        fa_cpu_item_transform(kern, row, p, w->s_t, rows, rows_pad, j0, n_keys, shift, needs_mask);
        if (pb->has_mods) { /* the bias over (query, cache slot) */
            const fa_cpu_mod_rows mods = {b, {0, 0, len_q, len_k}, c->seqs[b].start, row->head, row->query, 0, 0, rows};
            fa_cpu_apply_mods(pb, &mods, w->s_t, rows_pad, 1, j0, n_keys);
        }
        kern->softmax_step(w->s_t, rows_pad, n_keys, rows_pad, row->max, row->sum, row->alpha);

        /* ---- o_acc[r][:] = o_acc[r][:] · alpha[r] + Σ_j P[j][r] · v_j (per kv head) ---- */
        if (it.streaming) {
            for (int64_t g = 0; g < it.n_kv; g++) {
                int64_t r0 = g * rows_per_kv;
                fa_cpu_gemm_args pv = {rows_per_kv, dv_pad, n_keys, w->s_t + r0, 1, rows_pad,
                                       w->v_buf + g * KV_STREAM_KEYS * dv_pad, dv_pad, w->o_acc + r0 * dv_pad,
                                       dv_pad, FA_CPU_GEMM_SCALE_ROWS, 1.0f, row->alpha + r0};
                kern->gemm(&pv);
            }
        } else {
            fa_cpu_gemm_args pv = {rows, dv_pad, n_keys, w->s_t, 1, rows_pad, v_rows, ldv, w->o_acc, dv_pad,
                                   FA_CPU_GEMM_SCALE_ROWS, 1.0f, row->alpha};
            kern->gemm(&pv);
        }
    }
    store_item(c, w, &it, b);
}

static void attention_task(void *arg, int thread_index) {
    kv_ctx *c = (kv_ctx *)arg;
    kv_scratch w;
    scratch_layout(c->pb, c->scratch + (size_t)thread_index * c->scratch_bytes, &w);
    const int64_t per_sequence = c->layout.per_sequence;
    for (;;) {
        int64_t item = atomic_fetch_add(&c->next_item, 1);
        if (item >= c->total_items) break;
        attention_item(c, &w, item / per_sequence, item % per_sequence);
    }
}

/* ---- driver ------------------------------------------------------------------------------------ */

/* With slot ids: the appends run in parallel unless two of them write the same slot. */
static fa_cpu_kv_plan plan_workspace(const fa_problem *pb, int threads, int64_t splits) {
    return fa_cpu_kv_plan_of(&pb->p, 1, splits, scratch_layout(pb, NULL, NULL), threads);
}

size_t fa_cpu_kvcache_workspace(const fa_problem *pb) {
    if (fa_cpu_decode_applies(pb)) return fa_cpu_decode_workspace(pb); /* cpu_decode.c */
    int threads = fa_cpu_thread_count(pb);
    return plan_workspace(pb, threads, split_bound(pb, threads)).total;
}

fa_status fa_cpu_kvcache_forward(const fa_problem *pb) {
    if (fa_cpu_decode_applies(pb)) return fa_cpu_decode_forward(pb); /* cpu_decode.c */
    const fa_params *p = &pb->p;
    const int threads = fa_cpu_thread_count(pb);
    fa_cpu_kv_plan plan = plan_workspace(pb, threads, split_bound(pb, threads));
    fa_cpu_workspace ws;
    if (!fa_cpu_workspace_acquire(pb, plan.total, &ws)) return FA_ERR_ALLOC;

    kv_ctx c;
    memset(&c, 0, sizeof c);
    c.pb = pb;
    c.kern = fa_cpu_select_kernels();
    c.d = p->head_dim;
    c.dv = p->head_dim_v;
    c.dv_pad = fa_cpu_round_up(c.dv, FA_CPU_PAD);
    c.elem = fa_dtype_bytes(p->dtype);
    c.k_direct = p->dtype == FA_DTYPE_F32;
    c.v_direct = p->dtype == FA_DTYPE_F32 && c.dv == c.dv_pad;
    c.dot_scores = dot_scores_possible(pb, c.kern, 0);

    const fa_cpu_kv_pieces at = fa_cpu_kv_pieces_at(&plan, ws.base);
    c.o_part = at.o_part;
    c.lse_part = at.lse_part;
    c.scratch = at.scratch;
    c.scratch_bytes = plan.per_thread;
    c.seqs = at.seqs;

    const int64_t longest = fa_cpu_kv_sequences(p, at.seqs);

    /* 1. append */
    if (p->k_new) {
        c.total_items = p->batch * p->seqlen_new;
        atomic_init(&c.next_item, 0);
        int n = appends_collide(&c, at.slot_ids) ? 1 : threads;
        if (n > c.total_items) n = (int)c.total_items;
        fa_cpu_parallel_run(n, append_task, &c);
    }

    /* 2. attention */
    c.layout = layout_without_splits(pb, c.dot_scores);
    c.layout.splits = split_count(pb, &c.layout, threads, longest);
    c.layout.per_sequence *= c.layout.splits;
    c.total_items = p->batch * c.layout.per_sequence;
    atomic_init(&c.next_item, 0);
    fa_cpu_parallel_run(threads < c.total_items ? threads : (int)c.total_items, attention_task, &c);

    /* 3. merge */
    if (c.layout.splits > 1) fa_cpu_merge_splits(p, c.kern, c.layout.splits, c.lse_part, c.o_part, threads);
    fa_cpu_workspace_release(&ws);
    return FA_OK;
}
