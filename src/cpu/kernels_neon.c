/*
 * kernels_neon.c: the inner kernels (kernels_impl.h) on AArch64 Advanced SIMD (NEON): 128-bit
 * vectors of 4 fp32 lanes, 32 registers. The GEMM register tile is 6 rows × 4 vectors (24
 * accumulators, 4 B vectors, one broadcast A value: 29 of the 32 registers), 16 columns of C per
 * pass over k, as the AVX-512 tile's 6 rows.
 * NEON is part of the AArch64 base ISA, so this file needs no extra compiler flags (Makefile); it
 * is built on AArch64 only and cpu_dispatch.c still checks HWCAP_ASIMD before using it.
 *
 * NEON's fmax / fmin return NaN when either operand is NaN; the abstraction's vf_max / vf_min
 * (x86 semantics: the second operand when the comparison is unordered) are compare + select.
 * f16 converts with fcvtl / fcvtn (base AArch64; round to nearest even under the default FPCR,
 * exact subnormals, NaN quieted with its payload's top bits, as cpu_convert.h). bf16 is a 16-bit
 * shift on load and the bit arithmetic of cpu_convert.h on store.
 */
#include <arm_neon.h>
#include <stdint.h>

#define FA_VL 4
#define FA_GEMM_ROWS 6
#define FA_GEMM_VECS 4
#define FA_ISA_NAME "neon"
#define FA_KERNELS_GETTER fa_cpu_kernels_neon

typedef float32x4_t fa_vf;
typedef int32x4_t fa_vi;
typedef uint32x4_t fa_vmask; /* all-ones / all-zeros lanes */

static inline fa_vf vf_loadu(const float *p) { return vld1q_f32(p); }
static inline void vf_storeu(float *p, fa_vf x) { vst1q_f32(p, x); }
static inline fa_vf vf_set1(float x) { return vdupq_n_f32(x); }
static inline fa_vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline fa_vf vf_add(fa_vf a, fa_vf b) { return vaddq_f32(a, b); }
static inline fa_vf vf_sub(fa_vf a, fa_vf b) { return vsubq_f32(a, b); }
static inline fa_vf vf_mul(fa_vf a, fa_vf b) { return vmulq_f32(a, b); }
static inline fa_vf vf_div(fa_vf a, fa_vf b) { return vdivq_f32(a, b); }
static inline fa_vf vf_fmadd(fa_vf a, fa_vf b, fa_vf c) { return vfmaq_f32(c, a, b); }
static inline fa_vf vf_fnmadd(fa_vf a, fa_vf b, fa_vf c) { return vfmsq_f32(c, a, b); }
static inline float vf_reduce_add(fa_vf a) { return vaddvq_f32(a); }
static inline fa_vf vf_max(fa_vf a, fa_vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline fa_vf vf_min(fa_vf a, fa_vf b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
static inline fa_vf vf_abs(fa_vf a) { return vabsq_f32(a); }
static inline fa_vf vf_round(fa_vf a) { return vrndnq_f32(a); }
static inline fa_vf vf_exp2i(fa_vf p, fa_vf n) {
    /* 2^n as two normal factors built in the exponent field, so results down to the subnormal
     * range stay exact (n integral in [-160, 160]; a NaN p stays NaN) */
    int32x4_t e = vcvtq_s32_f32(n);
    int32x4_t e1 = vshrq_n_s32(e, 1);
    int32x4_t e2 = vsubq_s32(e, e1);
    float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e1, vdupq_n_s32(127)), 23));
    float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, f1), f2);
}

static inline fa_vi vi_loadu(const int32_t *p) { return vld1q_s32(p); }
static inline fa_vi vi_set1(int32_t x) { return vdupq_n_s32(x); }
static inline fa_vi vi_iota(void) {
    static const int32_t iota[4] = {0, 1, 2, 3};
    return vld1q_s32(iota);
}
static inline fa_vi vi_add(fa_vi a, fa_vi b) { return vaddq_s32(a, b); }
static inline fa_vi vi_sub(fa_vi a, fa_vi b) { return vsubq_s32(a, b); }
static inline fa_vi vi_abs(fa_vi a) { return vabsq_s32(a); }
static inline fa_vf vi_to_vf(fa_vi a) { return vcvtq_f32_s32(a); }

static inline fa_vmask vm_lt_vi(fa_vi a, fa_vi b) { return vcltq_s32(a, b); }
static inline fa_vmask vm_eq_vf(fa_vf a, fa_vf b) { return vceqq_f32(a, b); }
static inline fa_vmask vm_lt_vf(fa_vf a, fa_vf b) { return vcltq_f32(a, b); }
static inline fa_vmask vm_andnot(fa_vmask a, fa_vmask b) { return vbicq_u32(b, a); }
static inline fa_vf vf_select(fa_vmask m, fa_vf a, fa_vf b) { return vbslq_f32(m, a, b); }

static inline fa_vf vf_load_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline void vf_store_f16(uint16_t *p, fa_vf x) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x))); }
static inline fa_vf vf_load_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
static inline void vf_store_bf16(uint16_t *p, fa_vf x) {
    uint32x4_t bits = vreinterpretq_u32_f32(x);
    uint32x4_t high = vshrq_n_u32(bits, 16);
    /* round to nearest even on the 16 dropped bits; NaN becomes a quiet NaN */
    uint32x4_t bias = vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(high, vdupq_n_u32(1)));
    uint32x4_t rounded = vshrq_n_u32(vaddq_u32(bits, bias), 16);
    uint32x4_t is_number = vceqq_f32(x, x);
    rounded = vbslq_u32(is_number, rounded, vorrq_u32(high, vdupq_n_u32(0x40)));
    vst1_u16(p, vmovn_u32(rounded));
}

#include "kernels_impl.h"

#ifdef FA_CPU_HAVE_BF16DOT_NEON
/* Same kernels and name; the score GEMMs of bf16 problems use BFDOT (gemm_bf16_neon.c). */
static const fa_cpu_kernels kernel_table_bf16 = FA_KERNEL_TABLE(fa_cpu_gemm_bf16_neon);
const fa_cpu_kernels *fa_cpu_kernels_neon_bf16(void) { return &kernel_table_bf16; }
#endif
