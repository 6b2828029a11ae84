/*
 * decode_avx512.c: the decode path's kernels (cpu_decode.h) on 512-bit vectors, for CPUs with
 * AVX-512 F/BW/VL/DQ. Built with the AVX-512 flags (Makefile) and called only after
 * cpu_dispatch.c has checked them.
 *
 * The layout of decode_avx2.c at twice the width, with blocks of 8 rows as well as 4
 * (DECODE_ROW_BLOCK 8: the 32 registers hold 8 rows × 2 keys of accumulators, so a K or V value
 * converted once serves 8 rows where a GQA group or the query tokens give that many): scores take
 * 4 or 8 rows × 2 keys (8 or 16 accumulators of 16 lanes, 2 K vectors, the q vector of each row)
 * over 16 values a step and reduce each 4 rows' 8 sums together in one transposing tree
 * (sums_4x2; partial row or key blocks fold each sum to 256 bits before AVX2's hadd tree); the
 * accumulation holds 4 or 8 rows × 2 vectors of 16 columns (32 columns a block: two V loads per
 * eight FMAs a 4-row group, each FMA broadcasting its row's weight from memory itself, where 16
 * columns would spend five loads on four). An 8-value remainder of d or dv goes through
 * the 8-wide loads of decode_x86.h in the lower half, with masked loads and stores of q and o. An
 * int8 cache's scores are taken in integers from the int16 query rows (AVX2's quantise_rows makes
 * them), its P·V in fp32, or by AVX2's integer kernel where fa_cpu_decode_integer_pv picks that.
 *
 * decode_vnni_avx512.c builds this file again with FA_DECODE_VNNI (and AVX512-VNNI's flag): the
 * int8 scores' vpmaddwd + vpaddd become one vpdpwssd (bitwise the same sums), and an int8 cache's
 * P·V runs in integers where fa_cpu_decode_integer_pv picks it (accumulate_i8_vnni: int16 weight
 * pairs, V sign-extended and interleaved key pair by key pair, one vpdpwssd per 16 columns and
 * row); the other kernels are these. cpu_decode.c takes that set on CPUs with AVX512-VNNI.
 */
#include <float.h>
#include <immintrin.h>
#include <string.h>

#include "cpu_decode.h"
#include "decode_x86.h"

/* 16 values of a row from element c (c + 16 <= the row's length), as fp32; Q8_0 takes its
 * block's scale from `scale` (c is 16-aligned, so the 16 values lie in one block of 32). */
static FA_CPU_ALWAYS_INLINE __m512 load16(const int format, const char *row, int64_t c, __m512 scale) {
    switch (format) {
    case FA_CPU_KV_F32: return _mm512_loadu_ps((const float *)row + c);
    case FA_CPU_KV_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * c)));
    case FA_CPU_KV_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * c))), 16));
    case FA_CPU_KV_I8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + c))));
    case FA_CPU_KV_Q8_0: {
        const char *values = row + (c >> 5) * 34 + 2 + (c & 31);
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)values))), scale);
    }
    default: { /* FA_CPU_KV_E4M3: as decode_x86.h's load8, 16 bytes at a time */
        __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + c)));
        __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(magnitude, 7));
        __m256i nan = _mm256_cmpeq_epi16(magnitude, _mm256_set1_epi16(0x7f));
        h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
        return _mm512_cvtph_ps(h);
    }
    }
}

/* The Q8_0 block scale of element c, broadcast to 16 lanes. */
static FA_CPU_ALWAYS_INLINE __m512 q8_scale16(const char *row, int64_t c) {
    uint16_t bits;
    memcpy(&bits, row + (c >> 5) * 34, 2);
    return _mm512_set1_ps(_cvtsh_ss(bits));
}

/* 8 values from element c in the lower lanes, zeros above (the remainder of a row). */
static FA_CPU_ALWAYS_INLINE __m512 load8_low(const int format, const char *row, int64_t c) {
    return _mm512_insertf32x8(_mm512_setzero_ps(), load8(format, row, c), 0);
}

static FA_CPU_ALWAYS_INLINE __m256 fold(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
}

/* a + b as 16 fp32 lanes (fp) or 16 int32 lanes, in int32 registers */
static FA_CPU_ALWAYS_INLINE __m512i add_lanes(__m512i a, __m512i b, const int fp) {
    return fp ? _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b))) : _mm512_add_epi32(a, b);
}

/* The 16-lane sums of acc[r][k] (4 rows × 2 keys, fp32 or int32 lanes) in one vector: 128-bit
 * lane 0 holds key 0's four row sums, lane 2 key 1's. A transposing tree: the rows of a key
 * interleaved in pairs and added (32-bit, then 64-bit elements of each 128-bit lane), then the
 * 128-bit lanes of both keys folded together; 23 operations where a horizontal sum per key (a
 * fold to 256 bits, then hadd) took about twice as many, most of them shuffles. int32 sums stay
 * exact. */
static FA_CPU_ALWAYS_INLINE __m512i sums_4x2(const __m512i acc[4][2], const int fp) {
    __m512i y[2];
    for (int k = 0; k < 2; k++) {
        __m512i x[2];
        for (int p = 0; p < 2; p++)
            x[p] = add_lanes(_mm512_unpacklo_epi32(acc[2 * p][k], acc[2 * p + 1][k]),
                             _mm512_unpackhi_epi32(acc[2 * p][k], acc[2 * p + 1][k]), fp);
        y[k] = add_lanes(_mm512_unpacklo_epi64(x[0], x[1]), _mm512_unpackhi_epi64(x[0], x[1]), fp);
    }
    const __m512i z = add_lanes(_mm512_shuffle_i32x4(y[0], y[1], 0x88), _mm512_shuffle_i32x4(y[0], y[1], 0xdd), fp);
    return add_lanes(z, _mm512_shuffle_i32x4(z, z, 0xb1), fp);
}

/* acc + the int32 sums of the int16 pair products of a and b (exact: fa_cpu_q16_max) */
static FA_CPU_ALWAYS_INLINE __m512i dot_pairs(__m512i acc, __m512i a, __m512i b) {
#ifdef FA_DECODE_VNNI
    /* vpdpwssd: the same pair sums added in one instruction. In asm: through the intrinsic gcc 12
     * copied every accumulator of the loop to a new register and back each step (16 moves per 8
     * vpdpwssd) */
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

/* The scores of rows r0 .. r0 + 3 and keys j, j + 1 from their int32 sums: sum · row scale ·
 * k_mult. */
static FA_CPU_ALWAYS_INLINE void store_int_4x2(const __m512i acc[4][2], const fa_cpu_decode_tile *t, int64_t j,
                                               int64_t r0) {
    const __m512 sums = _mm512_cvtepi32_ps(sums_4x2(acc, 0));
    const __m128 row_scale = _mm_loadu_ps(t->q16_scale + r0);
    _mm_storeu_ps(t->s + j * t->ld + r0,
                  _mm_mul_ps(_mm512_castps512_ps128(sums), _mm_mul_ps(row_scale, _mm_set1_ps(t->k_mult[j]))));
    _mm_storeu_ps(t->s + (j + 1) * t->ld + r0,
                  _mm_mul_ps(_mm512_extractf32x4_ps(sums, 2), _mm_mul_ps(row_scale, _mm_set1_ps(t->k_mult[j + 1]))));
}

/* Scores of an int8 cache from the int16 query rows (t->q16), as decode_avx2.c's
 * scores_block_int at twice the width: vpmaddwd of the sign-extended K values with q16, 32 values
 * a step (a remainder of 8, 16 or 24 by masked loads, the masked-off lanes zero), pairs summed in
 * int32 (exact: fa_cpu_q16_max), one conversion to fp32 per key and row. */
static FA_CPU_ALWAYS_INLINE void scores_block_int(const int ROWS, const int KEYS, const fa_cpu_decode_tile *t, int64_t j,
                                                  int64_t r0) {
    const int64_t d = t->d;
    const int16_t *q = t->q16 + r0 * d;
    const char *k_row[2] = {t->k_rows[j], t->k_rows[j + KEYS - 1]};
    __m512i acc[8][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_setzero_si512();
    /* whole steps unmasked (a mask formed in the loop kept gcc from holding the accumulators in
     * place: it copied all eight every step), then the remainder under one mask */
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
        __m512i kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(k_row[k] + c)));
        for (int r = 0; r < ROWS; r++) {
            const __m512i qv = _mm512_loadu_si512(q + r * d + c);
            for (int k = 0; k < KEYS; k++) acc[r][k] = dot_pairs(acc[r][k], kv[k], qv);
        }
    }
    if (c < d) {
        const __mmask32 m = (1u << (d - c)) - 1u;
        __m512i kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, k_row[k] + c));
        for (int r = 0; r < ROWS; r++) {
            const __m512i qv = _mm512_maskz_loadu_epi16(m, q + r * d + c);
            for (int k = 0; k < KEYS; k++) acc[r][k] = dot_pairs(acc[r][k], kv[k], qv);
        }
    }
    if (ROWS % 4 == 0 && KEYS == 2) {
        store_int_4x2(acc, t, j, r0);
        if (ROWS == 8) store_int_4x2(acc + 4, t, j, r0 + 4);
        return;
    }
    for (int k = 0; k < KEYS; k++) {
        float mult = t->k_mult[j + k];
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS % 4 == 0) {
            for (int g = 0; g < ROWS; g += 4) {
                __m128 m = _mm_mul_ps(_mm_loadu_ps(t->q16_scale + r0 + g), _mm_set1_ps(mult));
                __m128 sums = hsum4(fold(_mm512_cvtepi32_ps(acc[g][k])), fold(_mm512_cvtepi32_ps(acc[g + 1][k])),
                                    fold(_mm512_cvtepi32_ps(acc[g + 2][k])), fold(_mm512_cvtepi32_ps(acc[g + 3][k])));
                _mm_storeu_ps(s + g, _mm_mul_ps(sums, m));
            }
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * t->q16_scale[r0 + r] * hsum(fold(_mm512_cvtepi32_ps(acc[r][k])));
        }
    }
}

/* The scores of rows r0 .. r0 + 3 and keys j, j + 1 from their fp32 sums (times k_mult). */
static FA_CPU_ALWAYS_INLINE void store_fp_4x2(const __m512 acc[4][2], const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
    const __m512i acc_bits[4][2] = {{_mm512_castps_si512(acc[0][0]), _mm512_castps_si512(acc[0][1])},
                                    {_mm512_castps_si512(acc[1][0]), _mm512_castps_si512(acc[1][1])},
                                    {_mm512_castps_si512(acc[2][0]), _mm512_castps_si512(acc[2][1])},
                                    {_mm512_castps_si512(acc[3][0]), _mm512_castps_si512(acc[3][1])}};
    const __m512 sums = _mm512_castsi512_ps(sums_4x2(acc_bits, 1));
    __m128 lo = _mm512_castps512_ps128(sums), hi = _mm512_extractf32x4_ps(sums, 2);
    if (t->k_mult) {
        lo = _mm_mul_ps(lo, _mm_set1_ps(t->k_mult[j]));
        hi = _mm_mul_ps(hi, _mm_set1_ps(t->k_mult[j + 1]));
    }
    _mm_storeu_ps(t->s + j * t->ld + r0, lo);
    _mm_storeu_ps(t->s + (j + 1) * t->ld + r0, hi);
}

/* The scores of rows r0 .. r0 + ROWS - 1 and keys j .. j + KEYS - 1 from their fp32 sums (16
 * lanes each; times k_mult where there is one). */
static FA_CPU_ALWAYS_INLINE void store_fp_sums(const int ROWS, const int KEYS, __m512 acc[8][2],
                                               const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
    if (ROWS % 4 == 0 && KEYS == 2) {
        store_fp_4x2(acc, t, j, r0);
        if (ROWS == 8) store_fp_4x2(acc + 4, t, j, r0 + 4);
        return;
    }
    for (int k = 0; k < KEYS; k++) {
        float mult = t->k_mult ? t->k_mult[j + k] : 1.0f;
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS % 4 == 0) {
            for (int g = 0; g < ROWS; g += 4)
                _mm_storeu_ps(s + g, _mm_mul_ps(hsum4(fold(acc[g][k]), fold(acc[g + 1][k]), fold(acc[g + 2][k]),
                                                      fold(acc[g + 3][k])),
                                                _mm_set1_ps(mult)));
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * hsum(fold(acc[r][k]));
        }
    }
}

/* Scores of rows r0 .. r0 + ROWS - 1 (ROWS 1-4 or 8), keys KEYS at a time (1 or 2). */
static FA_CPU_ALWAYS_INLINE void scores_block(const int format, const int ROWS, const int KEYS,
                                              const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
    const int64_t d = t->d;
    const float *q = t->q + r0 * d;
    __m512 acc[8][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_setzero_ps();
    __m512 scale[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        __m512 kv[2];
        if (format == FA_CPU_KV_Q8_0 && (c & 31) == 0)
            for (int k = 0; k < KEYS; k++) scale[k] = q8_scale16(t->k_rows[j + k], c);
        for (int k = 0; k < KEYS; k++) kv[k] = load16(format, t->k_rows[j + k], c, scale[k]);
        for (int r = 0; r < ROWS; r++) {
            __m512 qv = _mm512_loadu_ps(q + r * d + c);
            __asm__("" : "+v"(qv)); /* in a register: folded into each key's FMA, q would be loaded KEYS times */
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_fmadd_ps(kv[k], qv, acc[r][k]);
        }
    }
    if (c < d) { /* the last 8 values (d is a multiple of 8) */
        __m512 kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = load8_low(format, t->k_rows[j + k], c);
        for (int r = 0; r < ROWS; r++) {
            __m512 qv = _mm512_maskz_loadu_ps(0x00ff, q + r * d + c);
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_fmadd_ps(kv[k], qv, acc[r][k]);
        }
    }
    store_fp_sums(ROWS, KEYS, acc, t, j, r0);
}

#if defined(FA_DECODE_VNNI) && defined(__AVX512BF16__)
/* Scores of a bf16 cache from the query rows' own bf16 bits (t->q_bf16), by bf16 dot products:
 * vdpbf16ps multiplies the two bf16 pairs of each 32-bit lane exactly and adds both products to
 * an fp32 lane, so one instruction does two FMAs' work on the same values without converting K
 * (inputs and results below 2^-126 count as zero there); 32 values a step, a remainder of 8, 16
 * or 24 by masked loads (zero lanes add nothing); the sums then × k_mult, which holds the score
 * scale. */
#define DECODE_BF16_SCORES 1
static FA_CPU_ALWAYS_INLINE void scores_block_bf16(const int ROWS, const int KEYS, const fa_cpu_decode_tile *t,
                                                   int64_t j, int64_t r0) {
    const int64_t d = t->d;
    const uint16_t *q = t->q_bf16 + r0 * d;
    const char *k_row[2] = {t->k_rows[j], t->k_rows[j + KEYS - 1]};
    __m512 acc[8][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
        __m512i kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = _mm512_loadu_si512((const void *)(k_row[k] + 2 * c));
        for (int r = 0; r < ROWS; r++) {
            const __m512i qv = _mm512_loadu_si512((const void *)(q + r * d + c));
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], (__m512bh)kv[k], (__m512bh)qv);
        }
    }
    if (c < d) {
        const __mmask32 m = (1u << (d - c)) - 1u;
        __m512i kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = _mm512_maskz_loadu_epi16(m, k_row[k] + 2 * c);
        for (int r = 0; r < ROWS; r++) {
            const __m512i qv = _mm512_maskz_loadu_epi16(m, q + r * d + c);
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], (__m512bh)kv[k], (__m512bh)qv);
        }
    }
    store_fp_sums(ROWS, KEYS, acc, t, j, r0);
}
#endif

/* acc + v · *w, the weight broadcast by the FMA's own memory operand ({1to16}). In asm: gcc
 * broadcast a weight used by two FMAs into a register first, and on Zen 4 such a broadcast takes
 * a vector pipe slot (an FMA and a vbroadcastss 1.33 cycles, an FMA with {1to16} 1.0). */
static FA_CPU_ALWAYS_INLINE __m512 fmadd_broadcast(__m512 acc, __m512 v, const float *w) {
    __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*w));
    return acc;
}

/* o[r0 + r][c .. c + 8·UNITS) for ROWS rows over every key of the tile: vectors of 16 columns,
 * the last one masked to 8 when UNITS is odd. */
static FA_CPU_ALWAYS_INLINE void accumulate_block(const int format, const int ROWS, const int UNITS,
                                                  const fa_cpu_decode_tile *t, int64_t r0, int64_t c) {
    enum { MAX_VECS = 2 };
    const int VECS = (UNITS + 1) / 2;
    const __mmask16 last = UNITS % 2 ? 0x00ff : 0xffff;
    __m512 acc[8][MAX_VECS];
    const int64_t dv = t->dv, ld = t->ld, n = t->n_keys;
    const char *const *v_rows = t->v_rows;
    float *o = t->o + r0 * dv + c; /* locals: stores through o could alias t's fields */
    for (int r = 0; r < ROWS; r++) {
        __m512 alpha = _mm512_set1_ps(t->alpha[r0 + r]);
        for (int v = 0; v < VECS; v++)
            acc[r][v] = _mm512_mul_ps(_mm512_maskz_loadu_ps(v == VECS - 1 ? last : 0xffff, o + r * dv + 16 * v), alpha);
    }
    const float *s = t->s + r0;
    for (int64_t j = 0; j < n; j++, s += ld) {
        __m512 vv[MAX_VECS];
        const char *v_row = v_rows[j];
        __m512 scale = format == FA_CPU_KV_Q8_0 ? q8_scale16(v_row, c) : _mm512_setzero_ps();
        for (int v = 0; v < VECS; v++) /* c is 32-aligned: a Q8_0 block's 32 columns share `scale` */
            vv[v] = v == VECS - 1 && UNITS % 2 ? load8_low(format, v_row, c + 16 * v) : load16(format, v_row, c + 16 * v, scale);
        for (int r = 0; r < ROWS; r++)
            for (int v = 0; v < VECS; v++) acc[r][v] = fmadd_broadcast(acc[r][v], vv[v], s + r);
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < VECS; v++) _mm512_mask_storeu_ps(o + r * dv + 16 * v, v == VECS - 1 ? last : 0xffff, acc[r][v]);
}

#define DECODE_BLOCK_UNITS 4
#define DECODE_ROW_BLOCK 8

#ifdef FA_DECODE_VNNI
/* acc + the int32 sums of the int16 pairs of v with the pair at *w broadcast to every lane
 * (vpdpwssd m32{1to16}: the weight pair comes from memory with the instruction). */
static FA_CPU_ALWAYS_INLINE __m512i dot_pairs_broadcast(__m512i acc, __m512i v, const int32_t *w) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*w));
    return acc;
}

/* The int16 weight pairs of rows r0 .. r0 + 3 for an int8 tile's integer P·V: w[j][r] =
 * round(p[j][r] · 32767 / m[r]) with m[r] = max_j |p[j][r]| (rounding error at most 2^-16 of the
 * row's largest weight in the tile), pairs[4·i + r] = w[2i][r] | w[2i + 1][r] << 16 (a missing
 * last key weighs 0), scale[r] = m[r] / 32767. Returns 0, having written nothing the caller
 * reads, when a weight is not finite (the fp32 kernel then carries the NaN or infinity) or when a
 * row's largest weight is below 2^-100 but not 0 (32767 / m would overflow and m / 32767 lose
 * bits: the fp32 kernel is exact there). */
static FA_CPU_ALWAYS_INLINE int weight_pairs4(const fa_cpu_decode_tile *t, int64_t r0, int32_t *pairs, float *scale) {
    const int64_t n = t->n_keys, ld = t->ld;
    const float *s = t->s + r0;
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)), big = _mm_set1_ps(FLT_MAX);
    __m128 m = _mm_setzero_ps(), finite = _mm_castsi128_ps(_mm_set1_epi32(-1));
    for (int64_t j = 0; j < n; j++) {
        const __m128 x = _mm_and_ps(_mm_loadu_ps(s + j * ld), abs_mask);
        finite = _mm_and_ps(finite, _mm_cmple_ps(x, big));
        m = _mm_max_ps(m, x);
    }
    const __m128 positive = _mm_cmpgt_ps(m, _mm_setzero_ps());
    if (_mm_movemask_ps(finite) != 0xf || _mm_movemask_ps(_mm_and_ps(positive, _mm_cmplt_ps(m, _mm_set1_ps(0x1p-100f)))))
        return 0;
    const __m128 inv = _mm_and_ps(positive, _mm_div_ps(_mm_set1_ps(32767.0f), _mm_max_ps(m, _mm_set1_ps(0x1p-100f))));
    _mm_storeu_ps(scale, _mm_mul_ps(m, _mm_set1_ps(1.0f / 32767.0f)));
    const __m128i low = _mm_set1_epi32(0xffff);
    for (int64_t j = 0; j < n; j += 2) {
        const __m128i w0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(s + j * ld), inv));
        const __m128i w1 = j + 1 < n ? _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(s + (j + 1) * ld), inv)) : _mm_setzero_si128();
        _mm_store_si128((__m128i *)(pairs + 2 * j), _mm_or_si128(_mm_and_si128(w0, low), _mm_slli_epi32(w1, 16)));
    }
    return 1;
}

/* o[r0 .. r0 + 3][c .. c + COLS) (COLS 32 or 64) += the tile's P·V in integers: per key pair and
 * 32 columns the two V rows sign-extended to int16 and interleaved word by word (vpunpcklwd /
 * vpunpckhwd within 128-bit lanes: `lo` holds columns 0-3, 8-11, 16-19, 24-27 of the 32 as
 * (key 2i, key 2i + 1) pairs, `hi` the other four of each eight), one vpdpwssd per 16 columns and
 * row with the broadcast weight pair; int32 sums exact (|sum| <= 8 · 2 · 32767 · 128 < 2^27),
 * then o = alpha · o + scale · sum in fp32 with the columns put back in order. */
static FA_CPU_ALWAYS_INLINE void accumulate_int_cols(const int COLS, const fa_cpu_decode_tile *t, int64_t r0, int64_t c,
                                                     const int32_t *pairs, const float *scale) {
    enum { MAX_VECS = 4 };
    const int VECS = COLS / 16;
    const int64_t n = t->n_keys, dv = t->dv;
    const char *const *v_rows = t->v_rows;
    for (int64_t cc = c; cc < c + COLS; cc += 16) fa_cpu_decode_prefetch_v(t, r0, cc);
    __m512i acc[4][MAX_VECS];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < VECS; v++) acc[r][v] = _mm512_setzero_si512();
    for (int64_t j = 0; j < n; j += 2) {
        const char *ra = v_rows[j] + c, *rb = j + 1 < n ? v_rows[j + 1] + c : ra;
        __m512i x[MAX_VECS];
        for (int h = 0; h < VECS / 2; h++) {
            const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(ra + 32 * h)));
            const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rb + 32 * h)));
            x[2 * h] = _mm512_unpacklo_epi16(a, b);
            x[2 * h + 1] = _mm512_unpackhi_epi16(a, b);
        }
        const int32_t *w = pairs + 2 * j;
        for (int r = 0; r < 4; r++) {
            if (VECS == 4)
                __asm__("vpdpwssd %4%{1to16%}, %5, %0\n\t"
                        "vpdpwssd %4%{1to16%}, %6, %1\n\t"
                        "vpdpwssd %4%{1to16%}, %7, %2\n\t"
                        "vpdpwssd %4%{1to16%}, %8, %3"
                        : "+v"(acc[r][0]), "+v"(acc[r][1]), "+v"(acc[r][2]), "+v"(acc[r][3])
                        : "m"(w[r]), "v"(x[0]), "v"(x[1]), "v"(x[2]), "v"(x[3]));
            else
                for (int v = 0; v < VECS; v++) acc[r][v] = dot_pairs_broadcast(acc[r][v], x[v], w + r);
        }
    }
    /* columns 0-15 of 32 are lo's 128-bit lanes 0, 1 and hi's 0, 1 interleaved; 16-31 lanes 2, 3 */
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int r = 0; r < 4; r++) {
        float *o = t->o + (r0 + r) * dv + c;
        const __m512 alpha = _mm512_set1_ps(t->alpha[r0 + r]), sc = _mm512_set1_ps(scale[r]);
        for (int h = 0; h < VECS / 2; h++) {
            const __m512 lo = _mm512_cvtepi32_ps(acc[r][2 * h]), hi = _mm512_cvtepi32_ps(acc[r][2 * h + 1]);
            float *oh = o + 32 * h;
            _mm512_storeu_ps(oh, _mm512_fmadd_ps(_mm512_permutex2var_ps(lo, first, hi), sc, _mm512_mul_ps(_mm512_loadu_ps(oh), alpha)));
            _mm512_storeu_ps(oh + 16, _mm512_fmadd_ps(_mm512_permutex2var_ps(lo, second, hi), sc,
                                                      _mm512_mul_ps(_mm512_loadu_ps(oh + 16), alpha)));
        }
    }
}

static void accumulate_i8_vnni(const fa_cpu_decode_tile *t);
#define DECODE_ACCUMULATE_I8(t)                                                                                 \
    do {                                                                                                        \
        if ((t)->integer_pv) accumulate_i8_vnni(t);                                                             \
        else accumulate_format(FA_CPU_KV_I8, t);                                                                \
    } while (0)
#else
/* an int8 cache's integer P·V (where fa_cpu_decode_integer_pv picks it) is AVX2's */
#define DECODE_ACCUMULATE_I8(t)                                                                                 \
    do {                                                                                                        \
        if ((t)->integer_pv) fa_cpu_decode_kernels_avx2()->accumulate(t);                                       \
        else accumulate_format(FA_CPU_KV_I8, t);                                                                \
    } while (0)
#endif
#define DECODE_QUANTISE_ROWS fa_cpu_decode_quantise_rows_avx2
#include "decode_impl.h"

#ifdef FA_DECODE_VNNI
/* An int8 tile's P·V with VNNI: blocks of 4 rows in integers (64, then 32 columns at a time; an
 * 8-24 column rest and blocks of fewer rows by the fp32 kernel), a block with a non-finite
 * weight by the fp32 kernel. */
static void accumulate_i8_vnni(const fa_cpu_decode_tile *t) {
    int32_t pairs[FA_CPU_DECODE_KEYS * 2] __attribute__((aligned(16)));
    float scale[4];
    for (int64_t r0 = 0; r0 < t->n_rows; r0 += 4) {
        if (t->n_rows - r0 < 4 || !weight_pairs4(t, r0, pairs, scale)) {
            accumulate_row_block(FA_CPU_KV_I8, t, r0);
            continue;
        }
        int64_t c = 0;
        for (; c + 64 <= t->dv; c += 64) accumulate_int_cols(64, t, r0, c, pairs, scale);
        if (t->dv - c >= 32) {
            accumulate_int_cols(32, t, r0, c, pairs, scale);
            c += 32;
        }
        accumulate_rest(FA_CPU_KV_I8, 4, t, r0, c); /* an 8-24 column rest */
    }
}
#endif

#ifdef FA_DECODE_VNNI
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx512_vnni(void) { return &kernels; }
#else
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx512(void) { return &kernels; }
#endif
