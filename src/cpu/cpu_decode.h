/*
 * cpu_decode.h: the CPU decode path of fa_kvcache_forward (cpu_decode.c) and its inner kernels
 * (decode_avx512.c, decode_avx2.c, decode_neon.c, decode_scalar.c).
 *
 * Decoding reads the whole cache once per generated token and does two multiply-adds per cached
 * element and query row, so it is memory-bound when every K/V byte is read once for all the
 * query rows that use it. An item holds the query rows of several whole kv groups (every query
 * head of a kv head, every query of a query block) and walks a key range tile by tile, slot by
 * slot across its kv heads (the order the cache is stored in). Per tile and kv head the kernels
 * read each K / V row once in its storage format, converting in registers (the rows of all
 * kv heads share one score tile, so masks and the online softmax run once per tile):
 *   scores:     s[j][r] = k_mult[j] · (k_j · q_r)         (q already holds the score scale)
 *   accumulate: o[r] = alpha[r] · o[r] + Σ_j s[j][r] · v_j
 * k_mult carries K's per-key dequantisation factor (NULL: 1); V's is in s, which cpu_decode.c
 * multiplies by it after the softmax.
 */
#ifndef FA_CPU_DECODE_H
#define FA_CPU_DECODE_H

#include "cpu_engine.h"

/* Storage formats of a cache row (head_dim values). */
typedef enum fa_cpu_kv_format {
    FA_CPU_KV_F32 = 0,
    FA_CPU_KV_F16,
    FA_CPU_KV_BF16,
    FA_CPU_KV_I8,   /* int8 values, scale per row (K: k_mult; V: folded into s)              */
    FA_CPU_KV_Q8_0, /* blocks of 32: f16 scale, then 32 int8 (34 bytes), scale inside the row   */
    FA_CPU_KV_E4M3  /* fp8 e4m3 values, scale per kv head (K: k_mult; V: folded into s)        */
} fa_cpu_kv_format;

/* Keys per tile of the decode path (experiments override it with -D). */
#ifndef FA_CPU_DECODE_KEYS
#define FA_CPU_DECODE_KEYS 16
#endif

typedef struct fa_cpu_decode_tile {
    fa_cpu_kv_format format;
    int64_t n_keys;              /* 1..FA_CPU_DECODE_KEYS                                      */
    const char *const *k_rows;   /* [n_keys] K rows, d values in `format`                       */
    const char *const *v_rows;   /* [n_keys] V rows, dv values                                  */
    const float *k_mult;         /* [n_keys] K's dequantisation factors, or NULL               */
    int64_t d, dv;               /* multiples of 8 (Q8_0: of 32)                               */
    const float *q;              /* [n_rows][d] fp32                                            */
    const int16_t *q16;          /* int8 cache, kernels with quantise_rows: [n_rows][d] the
                                  * rows as int16 (q ≈ q16 · q16_scale, |q16| <= fa_cpu_q16_max(d)),
                                  * or NULL (a row not finite: the fp32 rows are used)         */
    const float *q16_scale;      /* [n_rows]                                                    */
    const uint16_t *q_bf16;      /* bf16 cache, kernels with bf16_scores on a CPU with AVX512-BF16:
                                  * [n_rows][d] the query rows' own bf16 bits, unscaled (k_mult
                                  * then holds the score scale), or NULL                      */
    int integer_pv;              /* int8 cache: 1 = P·V in integers (the AVX2 level's
                                  * accumulate_int, the VNNI set's accumulate_i8_vnni), 0 = the fp32
                                  * kernel (fa_cpu_decode_integer_pv)                           */
    int64_t n_rows;
    float *s;                    /* keys-major [n_keys][ld]: lanes 0..n_rows-1 (others untouched) */
    int64_t ld;
    float *o;                    /* [n_rows][dv] fp32 accumulators                              */
    const float *alpha;          /* [n_rows]                                                    */
    /* The next tile's rows of this kv head, prefetched into L2 by the kernels a few at a time
     * between their steps (the scores: key by key; P·V: a share per block of columns), so the
     * prefetches never queue up in one burst; n_next = 0: none. */
    const char *const *k_next, *const *v_next; /* [n_next]                                     */
    int64_t n_next, k_bytes, v_bytes;           /* row bytes                                     */
} fa_cpu_decode_tile;

/* Every 64-byte line of one row into L2. */
static inline void fa_cpu_decode_prefetch_row(const char *row, int64_t bytes) {
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(row + at, 0, 2);
}

static inline void fa_cpu_decode_prefetch(const char *const *rows, int64_t from, int64_t to, int64_t bytes) {
    for (int64_t j = from; j < to; j++) fa_cpu_decode_prefetch_row(rows[j], bytes);
}

/* The V rows to prefetch alongside the P·V block of columns from c (first row block only):
 * rows b, b + blocks, b + 2·blocks, ... for block b, an even share without a division per block. */
static inline void fa_cpu_decode_prefetch_v(const fa_cpu_decode_tile *t, int64_t r0, int64_t c) {
    if (r0 != 0 || t->n_next == 0) return;
    const int64_t blocks = (t->dv + 15) / 16;
    for (int64_t j = c / 16; j < t->n_next; j += blocks) fa_cpu_decode_prefetch_row(t->v_next[j], t->v_bytes);
}

typedef struct fa_cpu_decode_kernels {
    void (*scores)(const fa_cpu_decode_tile *t);
    void (*accumulate)(const fa_cpu_decode_tile *t);
    /* Levels with integer scores for int8 caches: q[n_rows][d] → q16 (row r scaled by
     * q16_scale[r] = max |q_r| / fa_cpu_q16_max(d), rounded to nearest); 0 when a value is not
     * finite (q16 then unused). NULL: scores from the fp32 rows. */
    int (*quantise_rows)(const float *q, int64_t n_rows, int64_t d, int16_t *q16, float *q16_scale);
    /* 1: the set scores a bf16 cache from t->q_bf16 by bf16 dot products (vdpbf16ps) where the
     * caller passes them (CPUs with AVX512-BF16); 0: never. */
    int bf16_scores;
} fa_cpu_decode_kernels;

/* The largest |q16| for head dim d: 128 · d · q16_max < 2^31, so an int32 sum of d products with
 * int8 values (-128 included) cannot overflow (32767 up to d = 516). */
static inline int32_t fa_cpu_q16_max(int64_t d) {
    int64_t m = 2147483647 / (128 * (d > 0 ? d : 1));
    return (int32_t)(m < 32767 ? m : 32767);
}

/* A level's integer P·V of an int8 tile (its DECODE_ACCUMULATE_INT): the level's
 * accumulate_int_block(ROWS, PAIRS, t, r0, c, weights, scale) over rows r0 .. r0 + R - 1 (R = 1..4,
 * passed on as a compile-time ROWS) and all dv columns, 16 at a time (PAIRS = 2) and then an
 * 8-column tail (PAIRS = 1). A macro: the weights' type is the level's own. */
#define FA_DECODE_INT_COLUMNS(ROWS, t, r0, weights, scale)                                                     \
    do {                                                                                                        \
        int64_t c_ = 0;                                                                                         \
        for (; c_ + 16 <= (t)->dv; c_ += 16) accumulate_int_block(ROWS, 2, t, r0, c_, weights, scale);        \
        if (c_ < (t)->dv) accumulate_int_block(ROWS, 1, t, r0, c_, weights, scale);                            \
    } while (0)
#define FA_DECODE_INT_ROWS(R, t, r0, weights, scale)                                                           \
    do {                                                                                                        \
        switch (R) {                                                                                            \
        case 4: FA_DECODE_INT_COLUMNS(4, t, r0, weights, scale); break;                                        \
        case 3: FA_DECODE_INT_COLUMNS(3, t, r0, weights, scale); break;                                        \
        case 2: FA_DECODE_INT_COLUMNS(2, t, r0, weights, scale); break;                                        \
        default: FA_DECODE_INT_COLUMNS(1, t, r0, weights, scale); break;                                       \
        }                                                                                                       \
    } while (0)

/* Whether an int8 cache's P·V runs in integers (pure). At the AVX2 level: on cores that split
 * 256-bit operations into two 128-bit halves (AMD family 0x17 models below 0x30: Zen, Zen+) a
 * vpmaddwd does twice the products of an fp32 FMA and wins; with two full-width 256-bit FMA pipes
 * (Zen 2 and later, Intel) the fp32 kernel does. With the AVX512-VNNI kernels (`avx512_vnni`):
 * on AMD (family 0x19 and later: Zen 4, whose 512-bit FMAs and vpdpwssd both issue one a cycle,
 * so a vpdpwssd's 32 products beat an FMA's 16 plus the int8 -> fp32 conversions), not on Intel
 * (two 512-bit FMA ports against one for vpdpwssd; an integer kernel measured slower on a Xeon).
 * docs/tuning-log.md. `amd`: the vendor is AMD; family and model as CPUID leaf 1 reports them
 * with the extended fields folded in. */
int fa_cpu_decode_integer_pv(int amd, int family, int model, int avx512_vnni);

const fa_cpu_decode_kernels *fa_cpu_decode_kernels_scalar(void);
#if defined(__x86_64__) || defined(_M_X64)
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx2(void);
/* 512-bit kernels for every format; an int8 cache's integer P·V is AVX2's in the plain set and
 * the set's own with AVX512-VNNI (fa_cpu_decode_integer_pv). */
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx512(void);
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx512_vnni(void); /* AVX512-VNNI CPUs only */
int fa_cpu_decode_quantise_rows_avx2(const float *q, int64_t n_rows, int64_t d, int16_t *q16, float *q16_scale);
#endif
#ifdef FA_CPU_HAVE_NEON_KERNELS
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_neon(void);
#endif

/* fp32 -> e4m3 (shared by the append and the tests; the other direction is cpu_convert.h's
 * fa_e4m3_to_f32). */
uint8_t fa_cpu_f32_to_e4m3(float x); /* round to nearest even, saturating to ±448; NaN kept    */

/* Whether cpu_decode.c serves this call (quantised caches always; otherwise few query rows per
 * kv group on a CPU with AVX2 or NEON, no rotary, head dims multiples of 8). */
int fa_cpu_decode_applies(const fa_problem *pb);
size_t fa_cpu_decode_workspace(const fa_problem *pb);
fa_status fa_cpu_decode_forward(const fa_problem *pb);

/* Split count of the decode path (pure): `units` items without splitting, `keys` keys of the
 * longest sequence, `threads` workers, `requested` = num_splits (0 = choose). Chooses at least
 * 4 items per thread when the keys allow splits of at least FA_CPU_DECODE_MIN_SPLIT keys, so a
 * dynamic queue balances threads slowed by other work; at most FA_KV_MAX_SPLITS. */
#define FA_CPU_DECODE_MIN_SPLIT 512
int64_t fa_cpu_decode_split_count(int64_t units, int64_t keys, int threads, int requested);

#endif /* FA_CPU_DECODE_H */
