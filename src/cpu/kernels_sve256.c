/*
 * kernels_sve256.c: the inner kernels (kernels_impl.h) on AArch64 SVE with 256-bit vectors (8 fp32
 * lanes, 32 registers; Graviton 3's Neoverse V1). Built with -march=armv8.2-a+sve
 * -msve-vector-bits=256 (Makefile): the fixed-length types below are plain values (arrays of them
 * hold the GEMM tile), and cpu_dispatch.c selects this level only on a CPU with SVE whose vector
 * length is 32 bytes; other lengths (128-bit SVE2 of Neoverse N2 / V2, where NEON has as many
 * lanes, or A64FX's 512) run the NEON kernels. The GEMM register tile is NEON's, 6 rows × 4
 * vectors (24 accumulators, 4 B vectors, one broadcast: 29 of the 32 registers), 32 columns of C
 * per pass over k.
 *
 * Every operation is predicated on all lanes (the abstraction's tails are scalar loops). max / min
 * are compare + select with the x86 rule (the second operand when unordered), as on NEON. f16
 * converts with FCVT on the low half of each 32-bit lane (loaded by ld1h into 32-bit containers,
 * stored by st1h from them): round to nearest even, exact subnormals, NaN quieted, as
 * cpu_convert.h; bf16 is a 16-bit shift on load and cpu_convert.h's bit arithmetic on store.
 */
#include <stdint.h>

#include "cpu_engine.h"

#ifdef FA_CPU_HAVE_SVE256_KERNELS
#include <arm_sve.h>

#define FA_VL 8
#define FA_GEMM_ROWS 6
#define FA_GEMM_VECS 4
#define FA_ISA_NAME "sve256"
#define FA_KERNELS_GETTER fa_cpu_kernels_sve256

typedef svfloat32_t fa_vf __attribute__((arm_sve_vector_bits(256)));
typedef svint32_t fa_vi __attribute__((arm_sve_vector_bits(256)));
typedef svbool_t fa_vmask __attribute__((arm_sve_vector_bits(256))); /* one predicate bit per lane */

#define FA_ALL svptrue_b32()

static inline fa_vf vf_loadu(const float *p) { return svld1_f32(FA_ALL, p); }
static inline void vf_storeu(float *p, fa_vf x) { svst1_f32(FA_ALL, p, x); }
static inline fa_vf vf_set1(float x) { return svdup_n_f32(x); }
static inline fa_vf vf_zero(void) { return svdup_n_f32(0.0f); }
static inline fa_vf vf_add(fa_vf a, fa_vf b) { return svadd_f32_x(FA_ALL, a, b); }
static inline fa_vf vf_sub(fa_vf a, fa_vf b) { return svsub_f32_x(FA_ALL, a, b); }
static inline fa_vf vf_mul(fa_vf a, fa_vf b) { return svmul_f32_x(FA_ALL, a, b); }
static inline fa_vf vf_div(fa_vf a, fa_vf b) { return svdiv_f32_x(FA_ALL, a, b); }
static inline fa_vf vf_fmadd(fa_vf a, fa_vf b, fa_vf c) { return svmla_f32_x(FA_ALL, c, a, b); }
static inline fa_vf vf_fnmadd(fa_vf a, fa_vf b, fa_vf c) { return svmls_f32_x(FA_ALL, c, a, b); }
static inline float vf_reduce_add(fa_vf a) { return svaddv_f32(FA_ALL, a); }
static inline fa_vf vf_max(fa_vf a, fa_vf b) { return svsel_f32(svcmpgt_f32(FA_ALL, a, b), a, b); }
static inline fa_vf vf_min(fa_vf a, fa_vf b) { return svsel_f32(svcmplt_f32(FA_ALL, a, b), a, b); }
static inline fa_vf vf_abs(fa_vf a) { return svabs_f32_x(FA_ALL, a); }
static inline fa_vf vf_round(fa_vf a) { return svrintn_f32_x(FA_ALL, a); }
static inline fa_vf vf_exp2i(fa_vf p, fa_vf n) {
    /* 2^n as two normal factors built in the exponent field, so results down to the subnormal
     * range stay exact (n integral in [-160, 160]; a NaN p stays NaN) */
    const svint32_t e = svcvt_s32_f32_x(FA_ALL, n);
    const svint32_t e1 = svasr_n_s32_x(FA_ALL, e, 1);
    const svint32_t e2 = svsub_s32_x(FA_ALL, e, e1);
    const svfloat32_t f1 = svreinterpret_f32_s32(svlsl_n_s32_x(FA_ALL, svadd_n_s32_x(FA_ALL, e1, 127), 23));
    const svfloat32_t f2 = svreinterpret_f32_s32(svlsl_n_s32_x(FA_ALL, svadd_n_s32_x(FA_ALL, e2, 127), 23));
    return svmul_f32_x(FA_ALL, svmul_f32_x(FA_ALL, p, f1), f2);
}

static inline fa_vi vi_loadu(const int32_t *p) { return svld1_s32(FA_ALL, p); }
static inline fa_vi vi_set1(int32_t x) { return svdup_n_s32(x); }
static inline fa_vi vi_iota(void) { return svindex_s32(0, 1); }
static inline fa_vi vi_add(fa_vi a, fa_vi b) { return svadd_s32_x(FA_ALL, a, b); }
static inline fa_vi vi_sub(fa_vi a, fa_vi b) { return svsub_s32_x(FA_ALL, a, b); }
static inline fa_vi vi_abs(fa_vi a) { return svabs_s32_x(FA_ALL, a); }
static inline fa_vf vi_to_vf(fa_vi a) { return svcvt_f32_s32_x(FA_ALL, a); }

static inline fa_vmask vm_lt_vi(fa_vi a, fa_vi b) { return svcmplt_s32(FA_ALL, a, b); }
static inline fa_vmask vm_eq_vf(fa_vf a, fa_vf b) { return svcmpeq_f32(FA_ALL, a, b); }
static inline fa_vmask vm_lt_vf(fa_vf a, fa_vf b) { return svcmplt_f32(FA_ALL, a, b); }
static inline fa_vmask vm_andnot(fa_vmask a, fa_vmask b) { return svbic_b_z(FA_ALL, b, a); }
static inline fa_vf vf_select(fa_vmask m, fa_vf a, fa_vf b) { return svsel_f32(m, a, b); }

static inline fa_vf vf_load_f16(const uint16_t *p) {
    return svcvt_f32_f16_x(FA_ALL, svreinterpret_f16_u32(svld1uh_u32(FA_ALL, p)));
}
static inline void vf_store_f16(uint16_t *p, fa_vf x) {
    svst1h_u32(FA_ALL, p, svreinterpret_u32_f16(svcvt_f16_f32_x(FA_ALL, x)));
}
static inline fa_vf vf_load_bf16(const uint16_t *p) {
    return svreinterpret_f32_u32(svlsl_n_u32_x(FA_ALL, svld1uh_u32(FA_ALL, p), 16));
}
static inline void vf_store_bf16(uint16_t *p, fa_vf x) {
    const svuint32_t bits = svreinterpret_u32_f32(x);
    const svuint32_t high = svlsr_n_u32_x(FA_ALL, bits, 16);
    /* round to nearest even on the 16 dropped bits; NaN becomes a quiet NaN */
    const svuint32_t bias = svadd_n_u32_x(FA_ALL, svand_n_u32_x(FA_ALL, high, 1), 0x7fff);
    const svuint32_t rounded = svlsr_n_u32_x(FA_ALL, svadd_u32_x(FA_ALL, bits, bias), 16);
    const svbool_t is_number = svcmpeq_f32(FA_ALL, x, x);
    svst1h_u32(FA_ALL, p, svsel_u32(is_number, rounded, svorr_n_u32_x(FA_ALL, high, 0x40)));
}

#include "kernels_impl.h"

#ifdef FA_CPU_HAVE_BF16DOT_NEON
/* Same kernels and name; the score GEMMs of bf16 problems use NEON's BFDOT (gemm_bf16_neon.c). */
static const fa_cpu_kernels kernel_table_bf16 = FA_KERNEL_TABLE(fa_cpu_gemm_bf16_neon);
const fa_cpu_kernels *fa_cpu_kernels_sve256_bf16(void) { return &kernel_table_bf16; }
#endif

#endif /* FA_CPU_HAVE_SVE256_KERNELS */
