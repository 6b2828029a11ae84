/*
 * decode_avx2.c: the decode path's kernels (cpu_decode.h) on 256-bit vectors, for CPUs with AVX2,
 * FMA and F16C (also used at the AVX-512 level). Built with the AVX2 flags (Makefile) and called
 * only after cpu_dispatch.c has checked them.
 *
 * Rows are taken 4 at a time: scores hold 2 keys × 4 rows = 8 accumulators plus 2 K vectors and
 * 4 q vectors (14 of the 16 ymm registers) and reduce the 4 rows of a key with one hadd tree;
 * the accumulation holds 4 rows × 2 vectors of o. Every K / V element is loaded and converted
 * once per group of 4 rows, a Q8_0 block's scale once per key and block (scores) or per 16
 * values (accumulation). Formats convert in registers: f16 by vcvtph2ps, bf16 by a 16-bit
 * shift, int8 by sign extension, e4m3 by moving its bits into an f16 (exponent bias 7 vs 15:
 * the value is the f16's times 2^8, which the caller's k_mult / weights carry; the NaN code is
 * mapped to an f16 NaN). An int8 cache's scores are taken in integers instead (scores_block_int:
 * vpmaddwd on int16 query rows; docs/design.md), and its P·V too where the core favours it
 * (accumulate_int on int16 tile weights, t->integer_pv), with the fp32 kernels for rows or tiles
 * holding a non-finite value.
 */
#include <float.h>
#include <math.h>
#include <immintrin.h>
#include <string.h>

#include "cpu_decode.h"
#include "decode_x86.h"

/* Scores of an int8 cache from the int16 query rows (t->q16): vpmaddwd of the sign-extended K
 * values with q16, 16 values per step, pairs summed in int32 (exact: see fa_cpu_q16_max), one
 * conversion to fp32 per key and row. No int8 → fp32 conversion of K, and half the multiply
 * µops of fp32 FMAs (16 products per 256-bit vpmaddwd). */
static FA_CPU_ALWAYS_INLINE void scores_block_int(const int ROWS, const int KEYS, const fa_cpu_decode_tile *t, int64_t j,
                                                  int64_t r0) {
    const int64_t d = t->d;
    const int16_t *q = t->q16 + r0 * d;
    __m256i acc[4][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = _mm256_setzero_si256();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        __m256i kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(t->k_rows[j + k] + c)));
        for (int r = 0; r < ROWS; r++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(q + r * d + c));
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm256_add_epi32(acc[r][k], _mm256_madd_epi16(kv[k], qv));
        }
    }
    if (c < d) { /* the last 8 values (d is a multiple of 8) */
        __m128i kv[2];
        for (int k = 0; k < KEYS; k++) kv[k] = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(t->k_rows[j + k] + c)));
        for (int r = 0; r < ROWS; r++) {
            __m128i qv = _mm_loadu_si128((const __m128i *)(q + r * d + c));
            for (int k = 0; k < KEYS; k++)
                acc[r][k] = _mm256_add_epi32(acc[r][k], _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_madd_epi16(kv[k], qv), 0));
        }
    }
    for (int k = 0; k < KEYS; k++) {
        __m256 f[4];
        for (int r = 0; r < ROWS; r++) f[r] = _mm256_cvtepi32_ps(acc[r][k]);
        float mult = t->k_mult[j + k];
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS == 4) {
            __m128 m = _mm_mul_ps(_mm_loadu_ps(t->q16_scale + r0), _mm_set1_ps(mult));
            _mm_storeu_ps(s, _mm_mul_ps(hsum4(f[0], f[1], f[2], f[3]), m));
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * t->q16_scale[r0 + r] * hsum(f[r]);
        }
    }
}

/* Scores of rows r0 .. r0 + ROWS - 1 (ROWS <= 4), keys KEYS at a time (1 or 2). */
static FA_CPU_ALWAYS_INLINE void scores_block(const int format, const int ROWS, const int KEYS,
                                              const fa_cpu_decode_tile *t, int64_t j, int64_t r0) {
    const int64_t d = t->d;
    const float *q = t->q + r0 * d;
    __m256 acc[4][2];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < KEYS; k++) acc[r][k] = _mm256_setzero_ps();
    __m256 scale[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t c = 0; c < d; c += 8) {
        __m256 kv[2];
        if (format == FA_CPU_KV_Q8_0 && (c & 31) == 0)
            for (int k = 0; k < KEYS; k++) scale[k] = q8_scale(t->k_rows[j + k], c);
        for (int k = 0; k < KEYS; k++) kv[k] = load8_scaled(format, t->k_rows[j + k], c, scale[k]);
        for (int r = 0; r < ROWS; r++) {
            __m256 qv = _mm256_loadu_ps(q + r * d + c);
            __asm__("" : "+x"(qv)); /* in a register: folded into each key's FMA, q would be loaded KEYS times */
            for (int k = 0; k < KEYS; k++) acc[r][k] = _mm256_fmadd_ps(kv[k], qv, acc[r][k]);
        }
    }
    for (int k = 0; k < KEYS; k++) {
        float mult = t->k_mult ? t->k_mult[j + k] : 1.0f;
        float *s = t->s + (j + k) * t->ld + r0;
        if (ROWS == 4) {
            _mm_storeu_ps(s, _mm_mul_ps(hsum4(acc[0][k], acc[1][k], acc[2][k], acc[3][k]), _mm_set1_ps(mult)));
        } else {
            for (int r = 0; r < ROWS; r++) s[r] = mult * hsum(acc[r][k]);
        }
    }
}

/* o[r0 + r][c .. c + 8·VECS) for ROWS rows over every key of the tile. */
static FA_CPU_ALWAYS_INLINE void accumulate_block(const int format, const int ROWS, const int VECS,
                                                  const fa_cpu_decode_tile *t, int64_t r0, int64_t c) {
    __m256 acc[4][2];
    const int64_t dv = t->dv, ld = t->ld, n = t->n_keys;
    const char *const *v_rows = t->v_rows;
    float *o = t->o + r0 * dv + c; /* locals: stores through o could alias t's fields */
    for (int r = 0; r < ROWS; r++) {
        __m256 alpha = _mm256_broadcast_ss(t->alpha + r0 + r);
        for (int v = 0; v < VECS; v++) acc[r][v] = _mm256_mul_ps(_mm256_loadu_ps(o + r * dv + 8 * v), alpha);
    }
    const float *s = t->s + r0;
    for (int64_t j = 0; j < n; j++, s += ld) {
        __m256 vv[2];
        const char *v_row = v_rows[j];
        __m256 scale = format == FA_CPU_KV_Q8_0 ? q8_scale(v_row, c) : _mm256_setzero_ps();
        for (int v = 0; v < VECS; v++) vv[v] = load8_scaled(format, v_row, c + 8 * v, scale);
        for (int r = 0; r < ROWS; r++) {
            __m256 w = _mm256_broadcast_ss(s + r);
            for (int v = 0; v < VECS; v++) acc[r][v] = _mm256_fmadd_ps(w, vv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < VECS; v++) _mm256_storeu_ps(o + r * dv + 8 * v, acc[r][v]);
}

/* o[r0 + r][c .. c + 8·PAIRS) (PAIRS = 2 or 1) of ROWS rows from the tile's key pairs
 * (accumulate_int). */
static FA_CPU_ALWAYS_INLINE void accumulate_int_block(const int ROWS, const int PAIRS, const fa_cpu_decode_tile *t, int64_t r0,
                                                      int64_t c, const int32_t (*pp)[4][8], const float *scale) {
    const int64_t n = t->n_keys, pairs = (n + 1) / 2;
    fa_cpu_decode_prefetch_v(t, r0, c);
    __m256i acc[4][2];
    for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t jp = 0; jp < pairs; jp++) {
        const char *va = t->v_rows[2 * jp] + c, *vb = 2 * jp + 1 < n ? t->v_rows[2 * jp + 1] + c : va;
        __m128i a = PAIRS == 2 ? _mm_loadu_si128((const __m128i *)va) : _mm_loadl_epi64((const __m128i *)va);
        __m128i b = PAIRS == 2 ? _mm_loadu_si128((const __m128i *)vb) : _mm_loadl_epi64((const __m128i *)vb);
        __m256i lo = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b)); /* columns c .. c+7 as (v_j, v_j+1) */
        __m256i hi = PAIRS == 2 ? _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b)) : lo; /* columns c+8 .. c+15 */
        for (int r = 0; r < ROWS; r++) {
            __m256i w = _mm256_load_si256((const __m256i *)pp[jp][r]);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(lo, w));
            if (PAIRS == 2) acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(hi, w));
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float *o = t->o + (r0 + r) * t->dv + c;
        const __m256 alpha = _mm256_broadcast_ss(t->alpha + r0 + r), top = _mm256_broadcast_ss(scale + r);
        const __m256 inv = _mm256_set1_ps(1.0f / 32767.0f);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][0]), top), inv,
                                            _mm256_mul_ps(_mm256_loadu_ps(o), alpha)));
        if (PAIRS == 2)
            _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][1]), top), inv,
                                                    _mm256_mul_ps(_mm256_loadu_ps(o + 8), alpha)));
    }
}

/* The weights of rows 0 .. R-1 (R <= 4) of one key, zeros in the lanes past R (which may lie past
 * the score tile). */
static FA_CPU_ALWAYS_INLINE __m128 load_rows(const float *s, int R) {
    if (R == 4) return _mm_loadu_ps(s);
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(x, s, sizeof(float) * (size_t)R);
    return _mm_loadu_ps(x);
}

/* P·V of an int8 cache by integer multiply-adds, per block of 4 rows: P (which carries v_mult)
 * quantised per row to int16 against the row's largest |P| in the tile (rounding error at most
 * 2^-16 of it), the V rows of a key pair interleaved byte by byte and sign-extended so that one
 * vpmaddwd with the broadcast pair (p_j, p_j+1) sums both keys into each int32 lane, summed over
 * the tile in int32 (|sum| <= 16 · 128 · 32767 < 2^27), then o = alpha · o + (sum · top) / 32767 in
 * fp32. Returns 0, having written nothing, when a P of the tile is not finite (the fp32 kernels
 * then carry the NaN / infinity). */
static int accumulate_int(const fa_cpu_decode_tile *t) {
    const int64_t n = t->n_keys, pairs = (n + 1) / 2, ld = t->ld;
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)), big = _mm_set1_ps(FLT_MAX);
    for (int64_t r0 = 0; r0 < t->n_rows; r0 += 4) {
        const int R = t->n_rows - r0 >= 4 ? 4 : (int)(t->n_rows - r0);
        __m128i finite = _mm_set1_epi32(-1);
        for (int64_t j = 0; j < n; j++) {
            __m128 x = _mm_and_ps(load_rows(t->s + j * ld + r0, R), abs_mask);
            finite = _mm_and_si128(finite, _mm_castps_si128(_mm_cmple_ps(x, big)));
        }
        if ((_mm_movemask_ps(_mm_castsi128_ps(finite)) & ((1 << R) - 1)) != (1 << R) - 1) return 0;
    }
    for (int64_t r0 = 0; r0 < t->n_rows; r0 += 4) {
        const int R = t->n_rows - r0 >= 4 ? 4 : (int)(t->n_rows - r0);
        __m128 top = _mm_setzero_ps();
        for (int64_t j = 0; j < n; j++) top = _mm_max_ps(top, _mm_and_ps(load_rows(t->s + j * ld + r0, R), abs_mask));
        top = _mm_and_ps(top, _mm_cmple_ps(top, big));
        /* 32767 / top in double: finite for every top > 0, denormal weights included */
        const __m256d top_d = _mm256_cvtps_pd(top);
        const __m256d inv = _mm256_and_pd(_mm256_cmp_pd(top_d, _mm256_setzero_pd(), _CMP_GT_OQ),
                                          _mm256_div_pd(_mm256_set1_pd(32767.0), _mm256_max_pd(top_d, _mm256_set1_pd(DBL_MIN))));
        float scale[4]; /* the largest weights: the block applies (sum · top) / 32767 */
        _mm_storeu_ps(scale, top);
        int32_t pp[(FA_CPU_DECODE_KEYS + 1) / 2][4][8] __attribute__((aligned(32)));
        for (int64_t jp = 0; jp < pairs; jp++) {
            __m128i a = _mm256_cvtpd_epi32(_mm256_mul_pd(_mm256_cvtps_pd(load_rows(t->s + 2 * jp * ld + r0, R)), inv));
            __m128i b = 2 * jp + 1 < n
                            ? _mm256_cvtpd_epi32(_mm256_mul_pd(_mm256_cvtps_pd(load_rows(t->s + (2 * jp + 1) * ld + r0, R)), inv))
                            : _mm_setzero_si128();
            __m128i ab = _mm_blend_epi16(a, _mm_slli_epi32(b, 16), 0xaa);
            __m256i ab2 = _mm256_broadcastsi128_si256(ab);
            _mm256_store_si256((__m256i *)pp[jp][0], _mm256_shuffle_epi32(ab2, 0x00));
            _mm256_store_si256((__m256i *)pp[jp][1], _mm256_shuffle_epi32(ab2, 0x55));
            _mm256_store_si256((__m256i *)pp[jp][2], _mm256_shuffle_epi32(ab2, 0xaa));
            _mm256_store_si256((__m256i *)pp[jp][3], _mm256_shuffle_epi32(ab2, 0xff));
        }
        FA_DECODE_INT_ROWS(R, t, r0, pp, scale);
    }
    return 1;
}

/* fa_cpu_decode_kernels.quantise_rows (the AVX-512 level's too). */
int fa_cpu_decode_quantise_rows_avx2(const float *q, int64_t n_rows, int64_t d, int16_t *q16, float *q16_scale) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const float q_max = (float)fa_cpu_q16_max(d);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = q + r * d;
        __m256 top8 = _mm256_setzero_ps(), nan8 = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= d; k += 8) {
            __m256 v = _mm256_loadu_ps(x + k);
            top8 = _mm256_max_ps(top8, _mm256_and_ps(v, abs_mask));
            nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        float lanes[8], top = 0.0f;
        int nan = _mm256_movemask_ps(nan8);
        _mm256_storeu_ps(lanes, top8);
        for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
        for (; k < d; k++) {
            nan |= isnan(x[k]);
            top = fabsf(x[k]) > top ? fabsf(x[k]) : top;
        }
        /* a non-finite row, or one so small that q_max / top would overflow: the fp32 scores */
        if (nan || !(top <= FLT_MAX) || (top > 0.0f && top < 0x1p-100f)) return 0;
        const float inv = top > 0.0f ? q_max / top : 0.0f;
        q16_scale[r] = top / q_max;
        const __m256 vinv = _mm256_set1_ps(inv);
        int16_t *y = q16 + r * d;
        for (k = 0; k + 16 <= d; k += 16) {
            __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
            __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv));
            _mm256_storeu_si256((__m256i *)(y + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
        }
        for (; k < d; k++) y[k] = (int16_t)_mm_cvtss_si32(_mm_set_ss(x[k] * inv));
    }
    return 1;
}

#define DECODE_QUANTISE_ROWS fa_cpu_decode_quantise_rows_avx2
#define DECODE_ACCUMULATE_INT(t) ((t)->integer_pv && accumulate_int(t))
#include "decode_impl.h"

const fa_cpu_decode_kernels *fa_cpu_decode_kernels_avx2(void) { return &kernels; }
