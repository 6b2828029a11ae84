/*
 * kernels_avx512.c: the inner kernels (kernels_impl.h) on 512-bit vectors: 16 fp32 lanes, 32
 * registers. The GEMM register tile is 6 rows × 4 vectors (24 accumulators, 4 B vectors, one
 * broadcast A value), i.e. 6 × 64 floats of C per pass over k.
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c (see the Makefile) and only
 * called after cpu_dispatch.c has checked those features at run time. A second table adds the
 * AVX512-BF16 GEMM for CPUs that have it (cpu_dispatch.c checks CPUID for it as well).
 */
#include <immintrin.h>
#include <stdint.h>

#define FA_VL 16
#define FA_GEMM_ROWS 6
#define FA_GEMM_VECS 4
#define FA_ISA_NAME "avx512"
#define FA_KERNELS_GETTER fa_cpu_kernels_avx512

typedef __m512 fa_vf;
typedef __m512i fa_vi;
typedef __mmask16 fa_vmask;

static inline fa_vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_storeu(float *p, fa_vf x) { _mm512_storeu_ps(p, x); }
static inline fa_vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline fa_vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline fa_vf vf_add(fa_vf a, fa_vf b) { return _mm512_add_ps(a, b); }
static inline fa_vf vf_sub(fa_vf a, fa_vf b) { return _mm512_sub_ps(a, b); }
static inline fa_vf vf_mul(fa_vf a, fa_vf b) { return _mm512_mul_ps(a, b); }
static inline fa_vf vf_div(fa_vf a, fa_vf b) { return _mm512_div_ps(a, b); }
static inline fa_vf vf_fmadd(fa_vf a, fa_vf b, fa_vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline fa_vf vf_fnmadd(fa_vf a, fa_vf b, fa_vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline float vf_reduce_add(fa_vf a) { return _mm512_reduce_add_ps(a); }
static inline fa_vf vf_max(fa_vf a, fa_vf b) { return _mm512_max_ps(a, b); }
static inline fa_vf vf_min(fa_vf a, fa_vf b) { return _mm512_min_ps(a, b); }
static inline fa_vf vf_abs(fa_vf a) { return _mm512_abs_ps(a); }
static inline fa_vf vf_round(fa_vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline fa_vf vf_exp2i(fa_vf p, fa_vf n) { return _mm512_scalef_ps(p, n); }

static inline fa_vi vi_loadu(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline fa_vi vi_set1(int32_t x) { return _mm512_set1_epi32(x); }
static inline fa_vi vi_iota(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
static inline fa_vi vi_add(fa_vi a, fa_vi b) { return _mm512_add_epi32(a, b); }
static inline fa_vi vi_sub(fa_vi a, fa_vi b) { return _mm512_sub_epi32(a, b); }
static inline fa_vi vi_abs(fa_vi a) { return _mm512_abs_epi32(a); }
static inline fa_vf vi_to_vf(fa_vi a) { return _mm512_cvtepi32_ps(a); }

static inline fa_vmask vm_lt_vi(fa_vi a, fa_vi b) { return _mm512_cmplt_epi32_mask(a, b); }
static inline fa_vmask vm_eq_vf(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
static inline fa_vmask vm_lt_vf(fa_vf a, fa_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
static inline fa_vmask vm_andnot(fa_vmask a, fa_vmask b) { return (fa_vmask)(~a & b); }
static inline fa_vf vf_select(fa_vmask m, fa_vf a, fa_vf b) { return _mm512_mask_blend_ps(m, b, a); }

static inline fa_vf vf_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline void vf_store_f16(uint16_t *p, fa_vf x) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline fa_vf vf_load_bf16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
static inline void vf_store_bf16(uint16_t *p, fa_vf x) {
    __m512i bits = _mm512_castps_si512(x);
    __m512i high = _mm512_srli_epi32(bits, 16);
    /* round to nearest even on the 16 dropped bits; NaN becomes a quiet NaN */
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(rounded));
}

#include "kernels_impl.h"

#ifdef FA_CPU_HAVE_BF16DOT
/* Same kernels and name; the score GEMMs of bf16 problems use vdpbf16ps (gemm_bf16_avx512.c). */
static const fa_cpu_kernels kernel_table_bf16 = FA_KERNEL_TABLE(fa_cpu_gemm_bf16_avx512);
const fa_cpu_kernels *fa_cpu_kernels_avx512_bf16(void) { return &kernel_table_bf16; }
#endif
#ifdef FA_CPU_HAVE_AMX
/* Same kernels and name; the score GEMMs of bf16 problems run on AMX tiles (gemm_bf16_amx.c). */
static const fa_cpu_kernels kernel_table_amx = FA_KERNEL_TABLE(fa_cpu_gemm_bf16_amx);
const fa_cpu_kernels *fa_cpu_kernels_avx512_amx(void) { return &kernel_table_amx; }
#endif
