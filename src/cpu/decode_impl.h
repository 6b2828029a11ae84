/*
 * decode_impl.h: the part of the decode kernels (cpu_decode.h) that is the same at every SIMD
 * level: the row and key blocks of the scores, the row blocks of the accumulation (4 rows, or 8
 * with DECODE_ROW_BLOCK 8), the switch from the cache format to the format's own kernels (one
 * function per format and step), and the kernel table. The including file (decode_avx2.c,
 * decode_avx512.c, decode_neon.c) defines scores_block(format, ROWS, KEYS, tile, j, r0), which
 * scores KEYS keys from key j for ROWS rows from row r0,
 * scores_block_int(ROWS, KEYS, tile, j, r0), the same for an int8 cache from t->q16, and
 * accumulate_block(format, ROWS, UNITS, tile, r0, c), which accumulates UNITS × 8 columns of ROWS
 * output rows from column c (UNITS up to DECODE_BLOCK_UNITS, default 2), then includes this file
 * and returns &kernels from its level's getter.
 */
#ifndef FA_CPU_DECODE_IMPL_H
#define FA_CPU_DECODE_IMPL_H

/* KEYS keys from key j: an int8 cache with int16 query rows (t->q16, made by the level's
 * quantise_rows) in integers by the level's scores_block_int, a bf16 cache with the query rows'
 * bf16 bits (t->q_bf16) by the level's scores_block_bf16 where it has one (DECODE_BF16_SCORES),
 * everything else by scores_block. */
static FA_CPU_ALWAYS_INLINE void scores_keys(const int format, const int ROWS, const int KEYS,
                                             const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
#ifdef DECODE_BF16_SCORES
    if (format == FA_CPU_KV_BF16 && t->q_bf16) {
        scores_block_bf16(ROWS, KEYS, t, j, r0);
        return;
    }
#endif
    if (format == FA_CPU_KV_I8 && t->q16) scores_block_int(ROWS, KEYS, t, j, r0);
    else scores_block(format, ROWS, KEYS, t, j, r0);
}

static FA_CPU_ALWAYS_INLINE void scores_rows(const int format, const int ROWS, const fa_cpu_decode_tile *t,
                                             int64_t r0) {
    const int64_t n_next = r0 == 0 ? t->n_next : 0; /* prefetches: first row block only */
    int64_t j = 0;
    for (; j + 2 <= t->n_keys; j += 2) {
        if (j < n_next) fa_cpu_decode_prefetch(t->k_next, j, j + 2 < n_next ? j + 2 : n_next, t->k_bytes);
        scores_keys(format, ROWS, 2, t, j, r0);
    }
    if (j < t->n_keys) scores_keys(format, ROWS, 1, t, j, r0);
    if (j < n_next) fa_cpu_decode_prefetch(t->k_next, j, n_next, t->k_bytes);
}

/* Rows per block of the kernels: 4, or 8 where the level's registers hold 8 rows × 2 keys of
 * accumulators (the including file sets DECODE_ROW_BLOCK 8), so each K / V value loaded and
 * converted serves 8 rows (GQA groups of 8 and more, or several query tokens). Blocks of 4 and a
 * last one of 1-3 rows take the rows an 8-row block leaves. Only formats whose values cost more
 * to convert than f16's one vcvtph2ps take 8-row blocks: f32 and f16 measured no faster with
 * them (docs/tuning-log.md). */
#ifndef DECODE_ROW_BLOCK
#define DECODE_ROW_BLOCK 4
#endif
static FA_CPU_ALWAYS_INLINE int rows8(const int format) {
    return DECODE_ROW_BLOCK > 4 && format != FA_CPU_KV_F32 && format != FA_CPU_KV_F16;
}

static FA_CPU_ALWAYS_INLINE void scores_format(const int format, const fa_cpu_decode_tile *t) {
    int64_t r0 = 0;
    if (rows8(format))
        for (; r0 + 8 <= t->n_rows; r0 += 8) scores_rows(format, 8, t, r0);
    for (; r0 < t->n_rows; r0 += 4) {
        switch (t->n_rows - r0 >= 4 ? 4 : t->n_rows - r0) {
        case 4: scores_rows(format, 4, t, r0); break;
        case 3: scores_rows(format, 3, t, r0); break;
        case 2: scores_rows(format, 2, t, r0); break;
        default: scores_rows(format, 1, t, r0); break;
        }
    }
}

/* Columns per accumulate block, in units of 8 (the including file may set 4: 32 columns). */
#ifndef DECODE_BLOCK_UNITS
#define DECODE_BLOCK_UNITS 2
#endif

/* Columns c .. dv - 1 of rows r0 .. r0 + ROWS - 1, fewer than DECODE_BLOCK_UNITS units: the rest
 * after the whole blocks. */
static FA_CPU_ALWAYS_INLINE void accumulate_rest(const int format, const int ROWS, const fa_cpu_decode_tile *t,
                                                 int64_t r0, int64_t c) {
    if (c == t->dv) return;
    fa_cpu_decode_prefetch_v(t, r0, c);
#if DECODE_BLOCK_UNITS > 3
    if (t->dv - c >= 24) {
        fa_cpu_decode_prefetch_v(t, r0, c + 16);
        accumulate_block(format, ROWS, 3, t, r0, c);
        return;
    }
#endif
#if DECODE_BLOCK_UNITS > 2
    if (t->dv - c >= 16) {
        accumulate_block(format, ROWS, 2, t, r0, c);
        return;
    }
#endif
    accumulate_block(format, ROWS, 1, t, r0, c);
}

static FA_CPU_ALWAYS_INLINE void accumulate_rows(const int format, const int ROWS, const fa_cpu_decode_tile *t,
                                                 int64_t r0) {
    int64_t c = 0;
    for (; c + 8 * DECODE_BLOCK_UNITS <= t->dv; c += 8 * DECODE_BLOCK_UNITS) {
        for (int h = 0; h < DECODE_BLOCK_UNITS; h += 2) fa_cpu_decode_prefetch_v(t, r0, c + 8 * h);
        accumulate_block(format, ROWS, DECODE_BLOCK_UNITS, t, r0, c);
    }
    accumulate_rest(format, ROWS, t, r0, c);
}

/* The block of rows from r0: 4 rows, or the 1-3 left at the end (ROWS passed on as a constant);
 * never 8, so a level's own P·V can hand one 4-row block to it (accumulate_i8_vnni). */
static FA_CPU_ALWAYS_INLINE void accumulate_row_block(const int format, const fa_cpu_decode_tile *t, int64_t r0) {
    switch (t->n_rows - r0 >= 4 ? 4 : t->n_rows - r0) {
    case 4: accumulate_rows(format, 4, t, r0); break;
    case 3: accumulate_rows(format, 3, t, r0); break;
    case 2: accumulate_rows(format, 2, t, r0); break;
    default: accumulate_rows(format, 1, t, r0); break;
    }
}

static FA_CPU_ALWAYS_INLINE void accumulate_format(const int format, const fa_cpu_decode_tile *t) {
    int64_t r0 = 0;
    if (rows8(format))
        for (; r0 + 8 <= t->n_rows; r0 += 8) accumulate_rows(format, 8, t, r0);
    for (; r0 < t->n_rows; r0 += 4) accumulate_row_block(format, t, r0);
}

/* A level's integer P·V for int8 caches (1 when done; 0: the fp32 kernels run). */
#ifndef DECODE_ACCUMULATE_INT
#define DECODE_ACCUMULATE_INT(t) 0
#endif

/* A level may hand an int8 cache's P·V to another level's kernels (decode_avx512.c: AVX2's
 * integer P·V where the rule picks it). */
#ifndef DECODE_ACCUMULATE_I8
#define DECODE_ACCUMULATE_I8(t)                                                                                 \
    do {                                                                                                        \
        if (!DECODE_ACCUMULATE_INT(t)) accumulate_format(FA_CPU_KV_I8, t);                                      \
    } while (0)
#endif

/* One function per format and step, kept out of the switch: each format's kernels then lie
 * together, and their placement does not move when another format's code grows (f16, whose code
 * was unchanged, measured 3 % slower when the other formats' 8-row blocks were inlined beside it). */
static FA_CPU_NOINLINE void scores_f32(const fa_cpu_decode_tile *t) { scores_format(FA_CPU_KV_F32, t); }
static FA_CPU_NOINLINE void scores_f16(const fa_cpu_decode_tile *t) { scores_format(FA_CPU_KV_F16, t); }
static FA_CPU_NOINLINE void scores_bf16(const fa_cpu_decode_tile *t) { scores_format(FA_CPU_KV_BF16, t); }
static FA_CPU_NOINLINE void scores_i8(const fa_cpu_decode_tile *t) { scores_format(FA_CPU_KV_I8, t); }
static FA_CPU_NOINLINE void scores_q8_0(const fa_cpu_decode_tile *t) { scores_format(FA_CPU_KV_Q8_0, t); }
static FA_CPU_NOINLINE void scores_e4m3(const fa_cpu_decode_tile *t) { scores_format(FA_CPU_KV_E4M3, t); }
static FA_CPU_NOINLINE void accumulate_f32(const fa_cpu_decode_tile *t) { accumulate_format(FA_CPU_KV_F32, t); }
static FA_CPU_NOINLINE void accumulate_f16(const fa_cpu_decode_tile *t) { accumulate_format(FA_CPU_KV_F16, t); }
static FA_CPU_NOINLINE void accumulate_bf16(const fa_cpu_decode_tile *t) { accumulate_format(FA_CPU_KV_BF16, t); }
static FA_CPU_NOINLINE void accumulate_i8(const fa_cpu_decode_tile *t) { DECODE_ACCUMULATE_I8(t); }
static FA_CPU_NOINLINE void accumulate_q8_0(const fa_cpu_decode_tile *t) { accumulate_format(FA_CPU_KV_Q8_0, t); }
static FA_CPU_NOINLINE void accumulate_e4m3(const fa_cpu_decode_tile *t) { accumulate_format(FA_CPU_KV_E4M3, t); }

static void decode_scores(const fa_cpu_decode_tile *t) {
    switch (t->format) {
    case FA_CPU_KV_F32: scores_f32(t); break;
    case FA_CPU_KV_F16: scores_f16(t); break;
    case FA_CPU_KV_BF16: scores_bf16(t); break;
    case FA_CPU_KV_I8: scores_i8(t); break;
    case FA_CPU_KV_Q8_0: scores_q8_0(t); break;
    default: scores_e4m3(t); break;
    }
}

static void decode_accumulate(const fa_cpu_decode_tile *t) {
    switch (t->format) {
    case FA_CPU_KV_F32: accumulate_f32(t); break;
    case FA_CPU_KV_F16: accumulate_f16(t); break;
    case FA_CPU_KV_BF16: accumulate_bf16(t); break;
    case FA_CPU_KV_I8: accumulate_i8(t); break;
    case FA_CPU_KV_Q8_0: accumulate_q8_0(t); break;
    default: accumulate_e4m3(t); break;
    }
}

#ifndef DECODE_QUANTISE_ROWS
#define DECODE_QUANTISE_ROWS NULL
#endif
#ifdef DECODE_BF16_SCORES
#define DECODE_HAS_BF16_SCORES 1
#else
#define DECODE_HAS_BF16_SCORES 0
#endif
static const fa_cpu_decode_kernels kernels = {decode_scores, decode_accumulate, DECODE_QUANTISE_ROWS,
                                              DECODE_HAS_BF16_SCORES};

#endif /* FA_CPU_DECODE_IMPL_H */
