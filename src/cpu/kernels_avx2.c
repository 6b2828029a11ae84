/*
 * kernels_avx2.c: the inner kernels (kernels_impl.h) on 256-bit vectors: 8 fp32 lanes, 16
 * registers. The GEMM register tile is 6 rows × 2 vectors (12 accumulators, 2 B vectors, one
 * broadcast: 15 of the 16 ymm registers).
 * Built with -mavx2 -mfma -mf16c (see the Makefile) and only called after cpu_dispatch.c has
 * checked those features at run time. AVX2 has no scalef: 2^n is built in the exponent field,
 * in two halves so that results down to the subnormal range stay exact.
 */
#include <immintrin.h>
#include <stdint.h>

#define FA_VL 8
#define FA_GEMM_ROWS 6
#define FA_GEMM_VECS 2
#define FA_ISA_NAME "avx2"
#define FA_KERNELS_GETTER fa_cpu_kernels_avx2

typedef __m256 fa_vf;
typedef __m256i fa_vi;
typedef __m256 fa_vmask; /* all-ones / all-zeros lanes */

static inline fa_vf vf_loadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_storeu(float *p, fa_vf x) { _mm256_storeu_ps(p, x); }
static inline fa_vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline fa_vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline fa_vf vf_add(fa_vf a, fa_vf b) { return _mm256_add_ps(a, b); }
static inline fa_vf vf_sub(fa_vf a, fa_vf b) { return _mm256_sub_ps(a, b); }
static inline fa_vf vf_mul(fa_vf a, fa_vf b) { return _mm256_mul_ps(a, b); }
static inline fa_vf vf_div(fa_vf a, fa_vf b) { return _mm256_div_ps(a, b); }
static inline fa_vf vf_fmadd(fa_vf a, fa_vf b, fa_vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline fa_vf vf_fnmadd(fa_vf a, fa_vf b, fa_vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline float vf_reduce_add(fa_vf a) {
    __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
    return _mm_cvtss_f32(_mm_add_ss(sum2, _mm_movehdup_ps(sum2)));
}
static inline fa_vf vf_max(fa_vf a, fa_vf b) { return _mm256_max_ps(a, b); }
static inline fa_vf vf_min(fa_vf a, fa_vf b) { return _mm256_min_ps(a, b); }
static inline fa_vf vf_abs(fa_vf a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
static inline fa_vf vf_round(fa_vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline fa_vf vf_exp2i(fa_vf p, fa_vf n) {
    __m256i e = _mm256_cvtps_epi32(n);
    __m256i e1 = _mm256_srai_epi32(e, 1);
    __m256i e2 = _mm256_sub_epi32(e, e1);
    __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, _mm256_set1_epi32(127)), 23));
    __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

static inline fa_vi vi_loadu(const int32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline fa_vi vi_set1(int32_t x) { return _mm256_set1_epi32(x); }
static inline fa_vi vi_iota(void) { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
static inline fa_vi vi_add(fa_vi a, fa_vi b) { return _mm256_add_epi32(a, b); }
static inline fa_vi vi_sub(fa_vi a, fa_vi b) { return _mm256_sub_epi32(a, b); }
static inline fa_vi vi_abs(fa_vi a) { return _mm256_abs_epi32(a); }
static inline fa_vf vi_to_vf(fa_vi a) { return _mm256_cvtepi32_ps(a); }

static inline fa_vmask vm_lt_vi(fa_vi a, fa_vi b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, a)); }
static inline fa_vmask vm_eq_vf(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
static inline fa_vmask vm_lt_vf(fa_vf a, fa_vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline fa_vmask vm_andnot(fa_vmask a, fa_vmask b) { return _mm256_andnot_ps(a, b); }
static inline fa_vf vf_select(fa_vmask m, fa_vf a, fa_vf b) { return _mm256_blendv_ps(b, a, m); }

static inline fa_vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void vf_store_f16(uint16_t *p, fa_vf x) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline fa_vf vf_load_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static inline void vf_store_bf16(uint16_t *p, fa_vf x) {
    __m256i bits = _mm256_castps_si256(x);
    __m256i high = _mm256_srli_epi32(bits, 16);
    /* round to nearest even on the 16 dropped bits; NaN becomes a quiet NaN */
    __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    rounded = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
    _mm_storeu_si128((__m128i *)p, packed);
}

#include "kernels_impl.h"
