/*
 * kernels_impl.h: the CPU engine's inner kernels, written once over a small vector abstraction
 * and compiled once per instruction set. Not a public header: kernels_scalar.c, kernels_avx2.c,
 * kernels_avx512.c, kernels_neon.c and kernels_sve256.c each define the abstraction below and
 * then include this file.
 *
 * The including file provides
 *   FA_VL                 floats per vector (16, 8 or 1)
 *   FA_GEMM_ROWS/VECS     register tile of the GEMM micro-kernel: ROWS rows × VECS vectors
 *   FA_ISA_NAME, FA_KERNELS_GETTER   name of the level and of its fa_cpu_kernels getter
 *   types  fa_vf (FA_VL floats), fa_vi (FA_VL int32), fa_vmask (a lane predicate)
 *   float  vf_loadu vf_storeu vf_set1 vf_zero vf_add vf_sub vf_mul vf_div vf_fmadd (a·b + c)
 *          vf_reduce_add (sum of the lanes, in a fixed order)
 *          vf_fnmadd (c - a·b) vf_max vf_min (x86 semantics: the second operand if either is
 *          NaN) vf_abs vf_round (to nearest even) vf_exp2i (p · 2^n for integral n in [-160, 160])
 *   int    vi_loadu vi_set1 vi_iota (0, 1, ..., FA_VL-1) vi_add vi_sub vi_abs vi_to_vf
 *   masks  vm_lt_vi vm_eq_vf vm_lt_vf vm_andnot (~a & b) vf_select (m ? a : b)
 *   16-bit vf_load_f16 vf_store_f16 vf_load_bf16 vf_store_bf16 (round to nearest even)
 *
 * Numerics. exp uses Cody-Waite range reduction x = n·ln2 + r, |r| <= ln2/2, and a degree-6
 * polynomial fitted offline (< 1 ulp before the final scaling; docs/tuning-log.md). tanh uses an
 * odd polynomial for |y| < 0.625 and 1 - 2/(e^{2|y|} + 1) above; both measured below 1.5 ulp.
 */
#include <math.h>
#include <string.h>

#include "cpu_convert.h"
#include "cpu_engine.h"

/* ---- elementary functions --------------------------------------------------------------------- */

static FA_CPU_ALWAYS_INLINE fa_vf fa_vexp(fa_vf x) {
    /* clamp (NaN passes through: vf_max / vf_min return the second operand): e^-104 underflows
     * to 0 after scaling, e^88.37 is just below FLT_MAX */
    x = vf_min(vf_set1(88.37f), vf_max(vf_set1(-104.0f), x));
    fa_vf n = vf_round(vf_mul(x, vf_set1(1.44269504088896341f)));
    fa_vf r = vf_fnmadd(n, vf_set1(0.693359375f), x); /* ln2 = 0.693359375 - 2.12194440e-4 */
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    fa_vf q = vf_set1(1.381461120e-03f);
    q = vf_fmadd(q, r, vf_set1(8.368710256e-03f));
    q = vf_fmadd(q, r, vf_set1(4.166838742e-02f));
    q = vf_fmadd(q, r, vf_set1(1.666652069e-01f));
    q = vf_fmadd(q, r, vf_set1(4.999999345e-01f));
    fa_vf p = vf_add(vf_fmadd(q, vf_mul(r, r), r), vf_set1(1.0f)); /* e^r = 1 + r + r²·q(r) */
    return vf_exp2i(p, n);
}

static FA_CPU_ALWAYS_INLINE fa_vf fa_vtanh(fa_vf y) {
    fa_vf magnitude = vf_abs(y);
    /* |y| < 0.625: y + y³·P(y²) */
    fa_vf z = vf_mul(y, y);
    fa_vf q = vf_set1(-5.704974344e-03f);
    q = vf_fmadd(q, z, vf_set1(2.063907528e-02f));
    q = vf_fmadd(q, z, vf_set1(-5.373971114e-02f));
    q = vf_fmadd(q, z, vf_set1(1.333144215e-01f));
    q = vf_fmadd(q, z, vf_set1(-3.333328194e-01f));
    fa_vf small = vf_fmadd(q, vf_mul(z, y), y);
    /* otherwise: sign(y) · (1 - 2 / (e^{2|y|} + 1)) */
    fa_vf e = fa_vexp(vf_add(magnitude, magnitude));
    fa_vf large = vf_sub(vf_set1(1.0f), vf_div(vf_set1(2.0f), vf_add(e, vf_set1(1.0f))));
    large = vf_select(vm_lt_vf(y, vf_zero()), vf_sub(vf_zero(), large), large);
    return vf_select(vm_lt_vf(magnitude, vf_set1(0.625f)), small, large);
}

/* ---- GEMM micro-kernel ------------------------------------------------------------------------- */

/* C[m0 .. m0+rows)[n0 .. n0+vecs·FA_VL) (op)= A B over the whole k range, with the tile's
 * rows × vecs accumulators held in registers. rows / vecs are compile-time constants at every
 * call site (the dispatch below), so the loops unroll completely. */
static FA_CPU_ALWAYS_INLINE void gemm_tile(const int rows, const int vecs, const fa_cpu_gemm_args *g,
                                           int64_t m0, int64_t n0) {
    fa_vf acc[FA_GEMM_ROWS][FA_GEMM_VECS];
    const float *a_row[FA_GEMM_ROWS];
    for (int r = 0; r < rows; r++) {
        a_row[r] = g->a + (m0 + r) * g->a_row_step;
        for (int v = 0; v < vecs; v++) acc[r][v] = vf_zero();
    }
    const float *b = g->b + n0;
    const int64_t ldb = g->ldb, a_k_step = g->a_k_step, k_len = g->k;
    int64_t a_offset = 0;
    for (int64_t k = 0; k < k_len; k++) {
        fa_vf b_vec[FA_GEMM_VECS];
        for (int v = 0; v < vecs; v++) b_vec[v] = vf_loadu(b + v * FA_VL);
        for (int r = 0; r < rows; r++) {
            fa_vf a_val = vf_set1(a_row[r][a_offset]);
            for (int v = 0; v < vecs; v++) acc[r][v] = vf_fmadd(a_val, b_vec[v], acc[r][v]);
        }
        a_offset += a_k_step;
        b += ldb;
    }
    float *c = g->c + m0 * g->ldc + n0;
    const int64_t ldc = g->ldc;
    if (g->mode == FA_CPU_GEMM_STORE) {
        fa_vf alpha = vf_set1(g->alpha);
        for (int r = 0; r < rows; r++)
            for (int v = 0; v < vecs; v++) vf_storeu(c + r * ldc + v * FA_VL, vf_mul(acc[r][v], alpha));
    } else if (g->mode == FA_CPU_GEMM_ACCUMULATE) {
        for (int r = 0; r < rows; r++)
            for (int v = 0; v < vecs; v++) {
                float *cp = c + r * ldc + v * FA_VL;
                vf_storeu(cp, vf_add(vf_loadu(cp), acc[r][v]));
            }
    } else {
        for (int r = 0; r < rows; r++) {
            fa_vf scale = vf_set1(g->row_scale[m0 + r]);
            for (int v = 0; v < vecs; v++) {
                float *cp = c + r * ldc + v * FA_VL;
                vf_storeu(cp, vf_fmadd(vf_loadu(cp), scale, acc[r][v]));
            }
        }
    }
}

static FA_CPU_ALWAYS_INLINE void gemm_tile_vecs(const int rows, int vecs, const fa_cpu_gemm_args *g,
                                                int64_t m0, int64_t n0) {
    switch (vecs) {
#if FA_GEMM_VECS >= 4
    case 4: gemm_tile(rows, 4, g, m0, n0); break;
#endif
#if FA_GEMM_VECS >= 3
    case 3: gemm_tile(rows, 3, g, m0, n0); break;
#endif
#if FA_GEMM_VECS >= 2
    case 2: gemm_tile(rows, 2, g, m0, n0); break;
#endif
    default: gemm_tile(rows, 1, g, m0, n0); break;
    }
}

/* The remainder rows (fewer than FA_GEMM_ROWS) of a panel. */
static void gemm_tail_rows(int rows, int vecs, const fa_cpu_gemm_args *g, int64_t m0, int64_t n0) {
    switch (rows) {
#if FA_GEMM_ROWS > 7
    case 7: gemm_tile_vecs(7, vecs, g, m0, n0); break;
#endif
#if FA_GEMM_ROWS > 6
    case 6: gemm_tile_vecs(6, vecs, g, m0, n0); break;
#endif
#if FA_GEMM_ROWS > 5
    case 5: gemm_tile_vecs(5, vecs, g, m0, n0); break;
#endif
#if FA_GEMM_ROWS > 4
    case 4: gemm_tile_vecs(4, vecs, g, m0, n0); break;
#endif
#if FA_GEMM_ROWS > 3
    case 3: gemm_tile_vecs(3, vecs, g, m0, n0); break;
#endif
#if FA_GEMM_ROWS > 2
    case 2: gemm_tile_vecs(2, vecs, g, m0, n0); break;
#endif
    default: gemm_tile_vecs(1, vecs, g, m0, n0); break;
    }
}

/* Column panels of FA_GEMM_VECS vectors (B's panel stays in L1 while the rows stream past),
 * then row tiles of FA_GEMM_ROWS. */
static void kernel_gemm(const fa_cpu_gemm_args *g) {
    for (int64_t n0 = 0; n0 < g->n; n0 += FA_GEMM_VECS * FA_VL) {
        int64_t left = (g->n - n0) / FA_VL;
        int vecs = left < FA_GEMM_VECS ? (int)left : FA_GEMM_VECS;
        int64_t m0 = 0;
        for (; m0 + FA_GEMM_ROWS <= g->m; m0 += FA_GEMM_ROWS) gemm_tile_vecs(FA_GEMM_ROWS, vecs, g, m0, n0);
        if (m0 < g->m) gemm_tail_rows((int)(g->m - m0), vecs, g, m0, n0);
    }
}

/* ---- scores by dot products (few query rows) ----------------------------------------------------- */

static FA_CPU_ALWAYS_INLINE void keys_dot_rows(const int rows, const float *kj, const float *q, int64_t ldq, int64_t d,
                                               float alpha, float *s_row) {
    fa_vf acc[FA_CPU_DOT_MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = vf_zero();
    int64_t c = 0;
    for (; c + FA_VL <= d; c += FA_VL) {
        fa_vf k_vec = vf_loadu(kj + c);
        for (int r = 0; r < rows; r++) acc[r] = vf_fmadd(k_vec, vf_loadu(q + r * ldq + c), acc[r]);
    }
    for (int r = 0; r < rows; r++) {
        float sum = vf_reduce_add(acc[r]);
        for (int64_t t = c; t < d; t++) sum += kj[t] * q[r * ldq + t];
        s_row[r] = alpha * sum;
    }
}

static void kernel_keys_dot(const float *k, int64_t ldk, int64_t n_keys, const float *q, int64_t ldq, int64_t n_rows,
                            int64_t d, float alpha, float *s, int64_t lds, int64_t n_lanes, const float *v, int64_t ldv,
                            int64_t dv) {
    /* rows of a head lie ldk floats apart (other heads in between), which hardware prefetchers
     * do not follow across pages: prefetch K and V rows a few keys ahead, one 64-byte line at a time */
    enum { AHEAD = 8 };
    for (int64_t j = 0; j < n_keys; j++) {
        const float *kj = k + j * ldk;
        float *s_row = s + j * lds;
        if (j + AHEAD < n_keys) {
            for (int64_t c = 0; c < d; c += 16) FA_CPU_PREFETCH(kj + AHEAD * ldk + c);
            for (int64_t c = 0; c < dv; c += 16) FA_CPU_PREFETCH(v + (j + AHEAD) * ldv + c);
        }
        switch (n_rows) {
        case 1: keys_dot_rows(1, kj, q, ldq, d, alpha, s_row); break;
        case 2: keys_dot_rows(2, kj, q, ldq, d, alpha, s_row); break;
        case 3: keys_dot_rows(3, kj, q, ldq, d, alpha, s_row); break;
        default: keys_dot_rows(FA_CPU_DOT_MAX_ROWS, kj, q, ldq, d, alpha, s_row); break;
        }
        for (int64_t r = n_rows; r < n_lanes; r++) s_row[r] = 0.0f;
    }
}

/* ---- score transformation (softcap, ALiBi, mask) ------------------------------------------------ */

static FA_CPU_ALWAYS_INLINE fa_vf transform_vector(const fa_cpu_score_tile *t, fa_vf x, float *tanh_dst,
                                                   fa_vi key, fa_vi lo, fa_vi hi, fa_vi diag, fa_vf slope) {
    if (t->apply_softcap) {
        fa_vf th = fa_vtanh(x);
        if (tanh_dst) vf_storeu(tanh_dst, th);
        x = vf_mul(th, vf_set1(t->softcap));
    }
    if (t->apply_alibi) x = vf_fnmadd(slope, vi_to_vf(vi_abs(vi_sub(diag, key))), x);
    if (t->apply_mask) {
        fa_vmask visible = vm_andnot(vm_lt_vi(key, lo), vm_lt_vi(key, hi));
        x = vf_select(visible, x, vf_set1(-INFINITY));
    }
    return x;
}

static void kernel_transform_scores(const fa_cpu_score_tile *t) {
    const int64_t ld = t->ld;
    if (t->keys_major) {
        /* s[j][r]: lanes are query rows, per-row parameters are vectors */
        for (int64_t r0 = 0; r0 < t->n_rows; r0 += FA_VL) {
            fa_vi lo = vi_loadu(t->lo_rel + r0), hi = vi_loadu(t->hi_rel + r0);
            fa_vi diag = vi_loadu(t->diag_rel + r0);
            fa_vf slope = t->apply_alibi ? vf_loadu(t->slope + r0) : vf_zero();
            for (int64_t j = 0; j < t->n_keys; j++) {
                float *sp = t->s + j * ld + r0;
                float *tp = t->tanh_out ? t->tanh_out + j * ld + r0 : NULL;
                vf_storeu(sp, transform_vector(t, vf_loadu(sp), tp, vi_set1((int32_t)j), lo, hi, diag, slope));
            }
        }
    } else {
        /* s[r][j]: lanes are keys, per-row parameters are broadcast */
        for (int64_t r = 0; r < t->n_rows; r++) {
            fa_vi lo = vi_set1(t->lo_rel[r]), hi = vi_set1(t->hi_rel[r]), diag = vi_set1(t->diag_rel[r]);
            fa_vf slope = vf_set1(t->apply_alibi ? t->slope[r] : 0.0f);
            for (int64_t j0 = 0; j0 < t->n_keys; j0 += FA_VL) {
                float *sp = t->s + r * ld + j0;
                float *tp = t->tanh_out ? t->tanh_out + r * ld + j0 : NULL;
                fa_vi key = vi_add(vi_iota(), vi_set1((int32_t)j0));
                vf_storeu(sp, transform_vector(t, vf_loadu(sp), tp, key, lo, hi, diag, slope));
            }
        }
    }
}

/* ---- forward online-softmax step ---------------------------------------------------------------- */

static void kernel_softmax_step(float *s, int64_t ld, int64_t n_keys, int64_t n_rows, float *row_max,
                                float *row_sum, float *alpha) {
    const fa_vf neg_inf = vf_set1(-INFINITY);
    for (int64_t r0 = 0; r0 < n_rows; r0 += FA_VL) {
        fa_vf max_old = vf_loadu(row_max + r0);
        fa_vf tile_max0 = neg_inf, tile_max1 = neg_inf;
        int64_t j = 0;
        for (; j + 1 < n_keys; j += 2) {
            tile_max0 = vf_max(tile_max0, vf_loadu(s + j * ld + r0));
            tile_max1 = vf_max(tile_max1, vf_loadu(s + (j + 1) * ld + r0));
        }
        if (j < n_keys) tile_max0 = vf_max(tile_max0, vf_loadu(s + j * ld + r0));
        fa_vf max_new = vf_max(max_old, vf_max(tile_max0, tile_max1));
        /* a row that has seen only masked keys keeps max -inf; exponentiate against 0 then so
         * exp(-inf - 0) = 0 instead of NaN */
        fa_vf max_use = vf_select(vm_eq_vf(max_new, neg_inf), vf_zero(), max_new);
        fa_vf rescale = fa_vexp(vf_sub(max_old, max_use));
        fa_vf sum0 = vf_zero(), sum1 = vf_zero();
        for (j = 0; j + 1 < n_keys; j += 2) {
            float *p0 = s + j * ld + r0, *p1 = p0 + ld;
            fa_vf e0 = fa_vexp(vf_sub(vf_loadu(p0), max_use));
            fa_vf e1 = fa_vexp(vf_sub(vf_loadu(p1), max_use));
            vf_storeu(p0, e0);
            vf_storeu(p1, e1);
            sum0 = vf_add(sum0, e0);
            sum1 = vf_add(sum1, e1);
        }
        if (j < n_keys) {
            float *p0 = s + j * ld + r0;
            fa_vf e0 = fa_vexp(vf_sub(vf_loadu(p0), max_use));
            vf_storeu(p0, e0);
            sum0 = vf_add(sum0, e0);
        }
        vf_storeu(row_sum + r0, vf_fmadd(vf_loadu(row_sum + r0), rescale, vf_add(sum0, sum1)));
        vf_storeu(row_max + r0, max_new);
        vf_storeu(alpha + r0, rescale);
    }
}

/* ---- backward elementwise step ------------------------------------------------------------------ */

static FA_CPU_ALWAYS_INLINE void grad_vector(float *sp, float *dpp, const float *tp, fa_vf lse_use, fa_vf dsum,
                                             fa_vf scale) {
    fa_vf p = fa_vexp(vf_sub(vf_loadu(sp), lse_use));
    fa_vf ds = vf_mul(vf_mul(p, vf_sub(vf_loadu(dpp), dsum)), scale);
    if (tp) {
        fa_vf th = vf_loadu(tp);
        ds = vf_mul(ds, vf_fnmadd(th, th, vf_set1(1.0f))); /* d(c·tanh(y))/dy / c = 1 - tanh² */
    }
    vf_storeu(sp, p);
    vf_storeu(dpp, ds);
}

static void kernel_grad_scores(const fa_cpu_grad_tile *t) {
    const int64_t ld = t->ld;
    const fa_vf scale = vf_set1(t->scale), pos_inf = vf_set1(INFINITY), neg_inf = vf_set1(-INFINITY);
    if (t->keys_major) {
        for (int64_t r0 = 0; r0 < t->n_rows; r0 += FA_VL) {
            fa_vf lse = vf_loadu(t->lse + r0);
            /* rows with LSE = -inf (nothing visible) get p = exp(s - inf) = 0 */
            fa_vf lse_use = vf_select(vm_eq_vf(lse, neg_inf), pos_inf, lse);
            fa_vf dsum = vf_loadu(t->dsum + r0);
            for (int64_t j = 0; j < t->n_keys; j++) {
                int64_t off = j * ld + r0;
                grad_vector(t->s + off, t->dp + off, t->tanh_vals ? t->tanh_vals + off : NULL, lse_use, dsum, scale);
            }
        }
    } else {
        for (int64_t r = 0; r < t->n_rows; r++) {
            float lse_r = t->lse[r];
            fa_vf lse_use = vf_set1(lse_r == -INFINITY ? INFINITY : lse_r);
            fa_vf dsum = vf_set1(t->dsum[r]);
            for (int64_t j0 = 0; j0 < t->n_keys; j0 += FA_VL) {
                int64_t off = r * ld + j0;
                grad_vector(t->s + off, t->dp + off, t->tanh_vals ? t->tanh_vals + off : NULL, lse_use, dsum, scale);
            }
        }
    }
}

/* ---- dtype conversions -------------------------------------------------------------------------- */

#if defined(__AVX2__) && defined(__F16C__)
/* e4m3 -> fp32, eight at a time (cpu_convert.h's fa_e4m3_to_f32, bit for bit): the code's sign
 * and magnitude bits placed into an f16 (exponent bias 15 instead of 7, so the f16 is the value ·
 * 2^-8, exact for every finite code, subnormals included), converted, times 256; the NaN codes
 * (magnitude 0x7f, read as 1.875) replaced by a quiet NaN of their sign. */
static inline void e4m3_to_f32_x8(float *dst, const uint8_t *src) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)src));
    const __m128i mag = _mm_and_si128(w, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
    const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m256 is_nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
    const __m256 nan = _mm256_or_ps(_mm256_and_ps(f, _mm256_set1_ps(-0.0f)),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    _mm256_storeu_ps(dst, _mm256_blendv_ps(f, nan, is_nan));
}
#endif

static void kernel_to_f32(float *dst, const void *src, int64_t n, fa_dtype dtype) {
    int64_t i = 0;
    if (dtype == FA_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == FA_DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)src;
        for (; i + FA_VL <= n; i += FA_VL) vf_storeu(dst + i, vf_load_f16(h + i));
        for (; i < n; i++) dst[i] = fa_f16_to_f32(h[i]);
    } else if (dtype == FA_DTYPE_FP8_E4M3) { /* exact; the descale factors are applied by the caller */
        const uint8_t *e = (const uint8_t *)src;
#if defined(__AVX2__) && defined(__F16C__)
        for (; i + 8 <= n; i += 8) e4m3_to_f32_x8(dst + i, e + i);
#endif
        for (; i < n; i++) dst[i] = fa_e4m3_to_f32(e[i]);
    } else {
        const uint16_t *h = (const uint16_t *)src;
        for (; i + FA_VL <= n; i += FA_VL) vf_storeu(dst + i, vf_load_bf16(h + i));
        for (; i < n; i++) dst[i] = fa_bf16_to_f32(h[i]);
    }
}

static void kernel_from_f32(void *dst, const float *src, int64_t n, fa_dtype dtype) {
    int64_t i = 0;
    if (dtype == FA_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == FA_DTYPE_F16) {
        uint16_t *h = (uint16_t *)dst;
        for (; i + FA_VL <= n; i += FA_VL) vf_store_f16(h + i, vf_loadu(src + i));
        for (; i < n; i++) h[i] = fa_f32_to_f16(src[i]);
    } else {
        uint16_t *h = (uint16_t *)dst;
        for (; i + FA_VL <= n; i += FA_VL) vf_store_bf16(h + i, vf_loadu(src + i));
        for (; i < n; i++) h[i] = fa_f32_to_bf16(src[i]);
    }
}

/* This level's table with the given bf16 GEMM (NULL, or an AVX512-BF16 one: kernels_avx512.c). */
#define FA_KERNEL_TABLE(gemm_bf16_fn)                                                                          \
    {                                                                                                          \
        FA_ISA_NAME, FA_GEMM_VECS * FA_VL, kernel_gemm, kernel_transform_scores, kernel_softmax_step,          \
            kernel_grad_scores, kernel_keys_dot, kernel_to_f32, kernel_from_f32, gemm_bf16_fn,                 \
    }

static const fa_cpu_kernels kernel_table = FA_KERNEL_TABLE(NULL);

const fa_cpu_kernels *FA_KERNELS_GETTER(void) { return &kernel_table; }
