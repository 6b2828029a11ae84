/*
 * gemm_bf16_neon.c: the bf16 × bf16 GEMM of the CPU engine (fa_cpu_gemm_bf16_args) on AArch64's
 * BF16 extension (ARMv8.6 FEAT_BF16: Neoverse V1 / V2 / N2, Graviton 3 and 4, Grace). BFDOT
 * multiplies the two bf16 pairs of each 32-bit lane and adds both products to an fp32 lane, the
 * counterpart of AVX512-BF16's vdpbf16ps (gemm_bf16_avx512.c), with the same operand layout:
 * B as [ceil(k / 2)][ldb][2] pairs, A's pair of a row broadcast to every lane.
 *
 * Register tile: 6 rows × 4 vectors of C (24 accumulators, 16 columns), as kernels_neon.c's fp32
 * micro-kernel; per pair of k 4 loads of B (4 columns × 2 k each), one broadcast of A's pair per
 * row, 24 BFDOT. An odd k's last element is broadcast alone (second half 0; B's second slot of
 * that pair is 0 as well).
 *
 * Numerics: BFDOT (without FEAT_EBF16) rounds its sums to odd and flushes subnormal inputs and
 * results to zero, whatever FPCR says; the products of two bf16 are exact in fp32, so the
 * difference from fp32 FMAs on converted operands is the rounding of the accumulation, within
 * the tests' tolerance (every bf16 case of the unit tests runs through it under qemu-aarch64).
 * BF16 is enabled for this file alone (Makefile: +bf16); cpu_dispatch.c calls it only on CPUs
 * with HWCAP2_BF16, and FA_CPU_BF16DOT=0 turns it off as on x86.
 */
#include <stdint.h>
#include <string.h>

#include "cpu_engine.h"

#ifdef FA_CPU_HAVE_BF16DOT_NEON
#include <arm_neon.h>

#define BF16_ROWS 6
#define BF16_VECS 4
#define BF16_LANES 4
#define BF16_TARGET /* the whole file is built with +bf16 (Makefile) */
#define BF16_ENTRY fa_cpu_gemm_bf16_neon

/* C[m0 .. m0+rows)[n0 .. n0+vecs·4) = alpha · A B; rows / vecs are constants at every call. */
static inline __attribute__((always_inline)) void gemm_bf16_tile(const int rows, const int vecs,
                                                                 const fa_cpu_gemm_bf16_args *g, int64_t m0,
                                                                 int64_t n0) {
    float32x4_t acc[BF16_ROWS][BF16_VECS];
    const uint16_t *a_row[BF16_ROWS];
    for (int r = 0; r < rows; r++) {
        a_row[r] = g->a + (m0 + r) * g->lda;
        for (int v = 0; v < vecs; v++) acc[r][v] = vdupq_n_f32(0.0f);
    }
    const uint16_t *b = g->b + 2 * n0; /* pair row kp at b + kp · 2·ldb */
    const int64_t pair_step = 2 * g->ldb, pairs = g->k / 2;
    for (int64_t kp = 0; kp < pairs; kp++) {
        bfloat16x8_t b_vec[BF16_VECS];
        for (int v = 0; v < vecs; v++) b_vec[v] = vreinterpretq_bf16_u16(vld1q_u16(b + v * 8));
        for (int r = 0; r < rows; r++) {
            uint32_t pair; /* A[m][2kp], A[m][2kp+1] */
            memcpy(&pair, a_row[r] + 2 * kp, sizeof pair);
            const bfloat16x8_t a_val = vreinterpretq_bf16_u32(vdupq_n_u32(pair));
            for (int v = 0; v < vecs; v++) acc[r][v] = vbfdotq_f32(acc[r][v], a_val, b_vec[v]);
        }
        b += pair_step;
    }
    if (g->k & 1) {
        bfloat16x8_t b_vec[BF16_VECS];
        for (int v = 0; v < vecs; v++) b_vec[v] = vreinterpretq_bf16_u16(vld1q_u16(b + v * 8));
        for (int r = 0; r < rows; r++) {
            const bfloat16x8_t a_val = vreinterpretq_bf16_u32(vdupq_n_u32((uint32_t)a_row[r][g->k - 1]));
            for (int v = 0; v < vecs; v++) acc[r][v] = vbfdotq_f32(acc[r][v], a_val, b_vec[v]);
        }
    }
    float *c = g->c + m0 * g->ldc + n0;
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) vst1q_f32(c + r * g->ldc + v * 4, vmulq_n_f32(acc[r][v], g->alpha));
}

#include "gemm_bf16_impl.h"

#endif /* FA_CPU_HAVE_BF16DOT_NEON */
