/*
 * lab/cpu/04_kernels.c: single-thread speed of the engine's inner kernels in isolation
 * (GEMM shapes of the forward's QK and PV steps, softmax step), to see where the time goes.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc lab/cpu/04_kernels.c build-cpu/libflashattn.a -lm -pthread
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_engine.h"

fa_status fa_set_error(fa_status status, const char *fmt, ...);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_gemm(const fa_cpu_kernels *kern, const char *name, int64_t m, int64_t n, int64_t k, int64_t a_row,
                       int64_t a_k, fa_cpu_gemm_mode mode) {
    int64_t a_len = (m - 1) * a_row + (k - 1) * a_k + 64;
    float *a = aligned_alloc(64, sizeof(float) * (size_t)a_len);
    float *b = aligned_alloc(64, sizeof(float) * (size_t)(k * n + 64));
    float *c = aligned_alloc(64, sizeof(float) * (size_t)(m * n + 64));
    float *rs = aligned_alloc(64, sizeof(float) * (size_t)(m + 64));
    for (int64_t i = 0; i < a_len; i++) a[i] = (float)(i % 13) * 0.01f;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)(i % 7) * 0.01f;
    for (int64_t i = 0; i < m * n; i++) c[i] = 0.0f;
    for (int64_t i = 0; i < m; i++) rs[i] = 1.0f;
    fa_cpu_gemm_args g = {m, n, k, a, a_row, a_k, b, n, c, n, mode, 1.0f, rs};
    int iters = (int)(2e8 / (2.0 * m * n * k)) + 1;
    double best = 1e30;
    for (int rep = 0; rep < 40; rep++) {
        double t0 = now();
        for (int it = 0; it < iters; it++) kern->gemm(&g);
        double t = (now() - t0) / iters;
        if (t < best) best = t;
    }
    printf("%-8s %-34s m=%4lld n=%4lld k=%4lld  %6.1f GFLOP/s\n", kern->name, name, (long long)m, (long long)n,
           (long long)k, 2.0 * m * n * k / best * 1e-9);
    free(a), free(b), free(c), free(rs);
}

static void bench_softmax(const fa_cpu_kernels *kern, int64_t keys, int64_t rows) {
    float *s = aligned_alloc(64, sizeof(float) * (size_t)(keys * rows));
    float mx[256], sum[256], alpha[256];
    for (int64_t i = 0; i < keys * rows; i++) s[i] = (float)(i % 17) * 0.1f - 0.8f;
    for (int i = 0; i < 256; i++) mx[i] = -1e30f, sum[i] = 0;
    int iters = 2000;
    double best = 1e30;
    for (int rep = 0; rep < 40; rep++) {
        double t0 = now();
        for (int it = 0; it < iters; it++) {
            kern->softmax_step(s, rows, keys, rows, mx, sum, alpha);
            s[0] = 0.3f;
        }
        double t = (now() - t0) / iters;
        if (t < best) best = t;
    }
    printf("%-8s softmax_step keys=%lld rows=%lld: %.2f ns/element (%.1f cycles per 16 at 3.7 GHz)\n", kern->name,
           (long long)keys, (long long)rows, best / (keys * rows) * 1e9, best / (keys * rows) * 1e9 * 3.7 * 16);
    free(s);
}

int main(void) {
    const fa_cpu_kernels *ks[2] = {fa_cpu_kernels_avx512(), fa_cpu_kernels_avx2()};
    for (int i = 0; i < 2; i++) {
        const fa_cpu_kernels *kern = ks[i];
        bench_gemm(kern, "QK  s_t = K Qt (A rows, ld 64·d)", 128, 64, 64, 1024, 1, FA_CPU_GEMM_STORE);
        bench_gemm(kern, "QK  d=128", 128, 64, 128, 2048, 1, FA_CPU_GEMM_STORE);
        bench_gemm(kern, "PV  o += Pt V (A transposed)", 64, 64, 128, 1, 64, FA_CPU_GEMM_SCALE_ROWS);
        bench_gemm(kern, "PV  dv=128", 64, 128, 128, 1, 64, FA_CPU_GEMM_SCALE_ROWS);
        bench_gemm(kern, "big square", 384, 256, 256, 256, 1, FA_CPU_GEMM_STORE);
        bench_softmax(kern, 128, 64);
    }
    return 0;
}
