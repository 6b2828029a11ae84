/*
 * gemm_bf16_avx512.c: the bf16 × bf16 GEMM of the CPU engine (fa_cpu_gemm_bf16_args) on
 * AVX512-BF16. vdpbf16ps multiplies the two bf16 pairs of each 32-bit lane and adds both
 * products to an fp32 accumulator lane, so one instruction does the work of two FMAs on
 * converted operands (2.0× on the score GEMM's tile on Zen 4; docs/tuning-log.md).
 *
 * Register tile: 6 rows × 4 vectors of C (24 accumulators), as the fp32 micro-kernel of
 * kernels_avx512.c. Per pair of k: 4 loads of B (16 columns × 2 k each), one 32-bit broadcast
 * of A's pair (A[m][k], A[m][k+1]) per row, 24 vdpbf16ps. An odd k's last element is broadcast
 * alone (second half 0; B's second slot of that pair is 0 as well).
 *
 * The Makefile builds this file with the AVX-512 flags; AVX512-BF16 is enabled per function by
 * the target attribute, so the rest of the library builds with compilers or flags without it,
 * and cpu_dispatch.c calls it only after checking CPUID leaf 7.1 EAX bit 5 (AVX512_BF16).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu_engine.h"

#ifdef FA_CPU_HAVE_BF16DOT

#define BF16_ROWS 6
#define BF16_VECS 4
#define BF16_LANES 16
#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#define BF16_ENTRY fa_cpu_gemm_bf16_avx512

/* C[m0 .. m0+rows)[n0 .. n0+vecs·16) = alpha · A B; rows / vecs are constants at every call. */
static inline __attribute__((always_inline)) BF16_TARGET void
gemm_bf16_tile(const int rows, const int vecs, const fa_cpu_gemm_bf16_args *g, int64_t m0, int64_t n0) {
    __m512 acc[BF16_ROWS][BF16_VECS];
    const uint16_t *a_row[BF16_ROWS];
    for (int r = 0; r < rows; r++) {
        a_row[r] = g->a + (m0 + r) * g->lda;
        for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_setzero_ps();
    }
    const uint16_t *b = g->b + 2 * n0;        /* pair row kp at b + kp · 2·ldb */
    const int64_t pair_step = 2 * g->ldb, pairs = g->k / 2;
    for (int64_t kp = 0; kp < pairs; kp++) {
        __m512bh b_vec[BF16_VECS];
        for (int v = 0; v < vecs; v++) b_vec[v] = (__m512bh)_mm512_loadu_si512((const void *)(b + v * 32));
        for (int r = 0; r < rows; r++) {
            uint32_t pair; /* A[m][2kp], A[m][2kp+1] */
            memcpy(&pair, a_row[r] + 2 * kp, sizeof pair);
            __m512bh a_val = (__m512bh)_mm512_set1_epi32((int)pair);
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_val, b_vec[v]);
        }
        b += pair_step;
    }
    if (g->k & 1) {
        __m512bh b_vec[BF16_VECS];
        for (int v = 0; v < vecs; v++) b_vec[v] = (__m512bh)_mm512_loadu_si512((const void *)(b + v * 32));
        for (int r = 0; r < rows; r++) {
            __m512bh a_val = (__m512bh)_mm512_set1_epi32((int)a_row[r][g->k - 1]);
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_val, b_vec[v]);
        }
    }
    float *c = g->c + m0 * g->ldc + n0;
    const __m512 alpha = _mm512_set1_ps(g->alpha);
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) _mm512_storeu_ps(c + r * g->ldc + v * 16, _mm512_mul_ps(acc[r][v], alpha));
}

#include "gemm_bf16_impl.h"

#endif /* FA_CPU_HAVE_BF16DOT */
