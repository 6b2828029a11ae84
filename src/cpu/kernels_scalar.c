/*
 * kernels_scalar.c: the inner kernels (kernels_impl.h) in portable C11, one float per "vector".
 * Used on CPUs without AVX2 (and on every non-x86 architecture) or when FA_CPU_ISA=scalar.
 * The GEMM register tile is 4 rows × 4 columns; compilers may auto-vectorise the rest.
 */
#include <math.h>
#include <stdint.h>

#include "cpu_convert.h"

#define FA_VL 1
#define FA_GEMM_ROWS 4
#define FA_GEMM_VECS 4
#define FA_ISA_NAME "scalar"
#define FA_KERNELS_GETTER fa_cpu_kernels_scalar

typedef float fa_vf;
typedef int32_t fa_vi;
typedef int fa_vmask;

static inline fa_vf vf_loadu(const float *p) { return *p; }
static inline void vf_storeu(float *p, fa_vf x) { *p = x; }
static inline fa_vf vf_set1(float x) { return x; }
static inline fa_vf vf_zero(void) { return 0.0f; }
static inline fa_vf vf_add(fa_vf a, fa_vf b) { return a + b; }
static inline fa_vf vf_sub(fa_vf a, fa_vf b) { return a - b; }
static inline fa_vf vf_mul(fa_vf a, fa_vf b) { return a * b; }
static inline fa_vf vf_div(fa_vf a, fa_vf b) { return a / b; }
static inline fa_vf vf_fmadd(fa_vf a, fa_vf b, fa_vf c) { return a * b + c; }
static inline fa_vf vf_fnmadd(fa_vf a, fa_vf b, fa_vf c) { return c - a * b; }
static inline float vf_reduce_add(fa_vf a) { return a; }
/* x86 semantics: the second operand when the comparison is unordered */
static inline fa_vf vf_max(fa_vf a, fa_vf b) { return a > b ? a : b; }
static inline fa_vf vf_min(fa_vf a, fa_vf b) { return a < b ? a : b; }
static inline fa_vf vf_abs(fa_vf a) { return fabsf(a); }
static inline fa_vf vf_round(fa_vf a) { return rintf(a); }
static inline fa_vf vf_exp2i(fa_vf p, fa_vf n) {
    /* 2^n as two normal factors so results down to the subnormal range stay exact */
    if (!(n >= -160.0f && n <= 160.0f)) return p + n; /* NaN: keep it NaN */
    int32_t e = (int32_t)n;
    int32_t e1 = e / 2, e2 = e - e1;
    return p * fa_f32_from_bits((uint32_t)(e1 + 127) << 23) * fa_f32_from_bits((uint32_t)(e2 + 127) << 23);
}

static inline fa_vi vi_loadu(const int32_t *p) { return *p; }
static inline fa_vi vi_set1(int32_t x) { return x; }
static inline fa_vi vi_iota(void) { return 0; }
static inline fa_vi vi_add(fa_vi a, fa_vi b) { return a + b; }
static inline fa_vi vi_sub(fa_vi a, fa_vi b) { return a - b; }
static inline fa_vi vi_abs(fa_vi a) { return a < 0 ? -a : a; }
static inline fa_vf vi_to_vf(fa_vi a) { return (float)a; }

static inline fa_vmask vm_lt_vi(fa_vi a, fa_vi b) { return a < b; }
static inline fa_vmask vm_eq_vf(fa_vf a, fa_vf b) { return a == b; }
static inline fa_vmask vm_lt_vf(fa_vf a, fa_vf b) { return a < b; }
static inline fa_vmask vm_andnot(fa_vmask a, fa_vmask b) { return !a && b; }
static inline fa_vf vf_select(fa_vmask m, fa_vf a, fa_vf b) { return m ? a : b; }

static inline fa_vf vf_load_f16(const uint16_t *p) { return fa_f16_to_f32(*p); }
static inline void vf_store_f16(uint16_t *p, fa_vf x) { *p = fa_f32_to_f16(x); }
static inline fa_vf vf_load_bf16(const uint16_t *p) { return fa_bf16_to_f32(*p); }
static inline void vf_store_bf16(uint16_t *p, fa_vf x) { *p = fa_f32_to_bf16(x); }

#include "kernels_impl.h"
