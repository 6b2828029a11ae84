/*
 * lab/cpu/08_bf16dot/bench_tile.c: the score GEMM of one CPU work item with bf16 inputs, two ways.
 *
 *   fp32  (the engine today): the key tile's bf16 rows are converted to fp32 (k_buf), Qᵀ is an
 *         fp32 tile [d][rows] (converted once per item), and the 6 × 4-vector FMA micro-kernel
 *         of kernels_impl.h computes s_t[key][row] = scale · Σ_c k[key][c] · qᵀ[c][row].
 *   bf16  AVX512-BF16: Qᵀ is packed once per item as bf16 pairs [d/2][rows][2] (the B operand),
 *         the key rows are read in place as bf16 and broadcast two at a time (one 32-bit pair),
 *         and vdpbf16ps accumulates both products of a pair in fp32. Products of two bf16 are
 *         exact in fp32, so the only difference to fp32 is the order of the additions (and
 *         denormals, which the instruction flushes).
 *
 * Shapes: rows = 64 query rows (FA_CPU_BLOCK_ROWS), keys 64 / 128, d 64 / 128 (and odd 59).
 * Reports GFLOP/s (2·keys·rows·d per tile) on one thread for
 *   gemm      the GEMM alone (fp32: K already converted)
 *   tile      the per-key-block work: convert K + GEMM (fp32), GEMM from the bf16 rows (bf16)
 * and the max |difference| of the two results relative to max |s|.
 *
 * Build: gcc -O2 -march=x86-64-v3 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 \
 *            -o bench_tile bench_tile.c -lm
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AI inline __attribute__((always_inline))
#define ROWS 6
#define VECS 4

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 -> fp32 for n elements (the engine's vf_load_bf16 loop) */
static void convert_row(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
    for (; i < n; i++) dst[i] = from_bf16(src[i]);
}

/* ---- fp32: the engine's micro-kernel (A broadcast one float, B fp32 rows) ---- */
static AI void f32_tile(const int rows, const int vecs, int64_t k_len, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc, float alpha) {
    __m512 acc[ROWS][VECS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_len; k++) {
        __m512 bv[VECS];
        for (int v = 0; v < vecs; v++) bv[v] = _mm512_loadu_ps(b + k * ldb + v * 16);
        for (int r = 0; r < rows; r++) {
            __m512 av = _mm512_set1_ps(a[r * lda + k]);
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) _mm512_storeu_ps(c + r * ldc + v * 16, _mm512_mul_ps(acc[r][v], al));
}

static void gemm_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                     float *c, int64_t ldc, float alpha) {
    for (int64_t n0 = 0; n0 < n; n0 += VECS * 16) {
        int64_t m0 = 0;
        for (; m0 + ROWS <= m; m0 += ROWS)
            f32_tile(ROWS, VECS, k, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, alpha);
        switch (m - m0) {
        case 5: f32_tile(5, VECS, k, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, alpha); break;
        case 4: f32_tile(4, VECS, k, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, alpha); break;
        case 3: f32_tile(3, VECS, k, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, alpha); break;
        case 2: f32_tile(2, VECS, k, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, alpha); break;
        case 1: f32_tile(1, VECS, k, a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, alpha); break;
        default: break;
        }
    }
}

/* ---- bf16: A rows bf16 (broadcast 32-bit pairs), B packed [k/2][n][2] bf16 ---- */
static AI void bf16_tile(const int rows, const int vecs, int64_t k_len, const uint16_t *a, int64_t lda,
                         const uint16_t *b, int64_t ldb_pairs, float *c, int64_t ldc, float alpha) {
    __m512 acc[ROWS][VECS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_setzero_ps();
    const int64_t pairs = k_len / 2;
    for (int64_t kp = 0; kp < pairs; kp++) {
        __m512bh bv[VECS];
        for (int v = 0; v < vecs; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + kp * ldb_pairs + v * 32);
        for (int r = 0; r < rows; r++) {
            uint32_t pair;
            memcpy(&pair, a + r * lda + 2 * kp, 4);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
    if (k_len & 1) {
        /* last column alone: the pair's upper half is 0 in A (and B's padding slot is 0) */
        int64_t kp = pairs;
        __m512bh bv[VECS];
        for (int v = 0; v < vecs; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + kp * ldb_pairs + v * 32);
        for (int r = 0; r < rows; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * lda + k_len - 1]);
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) _mm512_storeu_ps(c + r * ldc + v * 16, _mm512_mul_ps(acc[r][v], al));
}

static void gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b,
                      int64_t ldb_pairs, float *c, int64_t ldc, float alpha) {
    for (int64_t n0 = 0; n0 < n; n0 += VECS * 16) {
        const uint16_t *bp = b + 2 * n0;
        int64_t m0 = 0;
        for (; m0 + ROWS <= m; m0 += ROWS)
            bf16_tile(ROWS, VECS, k, a + m0 * lda, lda, bp, ldb_pairs, c + m0 * ldc + n0, ldc, alpha);
        switch (m - m0) {
        case 5: bf16_tile(5, VECS, k, a + m0 * lda, lda, bp, ldb_pairs, c + m0 * ldc + n0, ldc, alpha); break;
        case 4: bf16_tile(4, VECS, k, a + m0 * lda, lda, bp, ldb_pairs, c + m0 * ldc + n0, ldc, alpha); break;
        case 3: bf16_tile(3, VECS, k, a + m0 * lda, lda, bp, ldb_pairs, c + m0 * ldc + n0, ldc, alpha); break;
        case 2: bf16_tile(2, VECS, k, a + m0 * lda, lda, bp, ldb_pairs, c + m0 * ldc + n0, ldc, alpha); break;
        case 1: bf16_tile(1, VECS, k, a + m0 * lda, lda, bp, ldb_pairs, c + m0 * ldc + n0, ldc, alpha); break;
        default: break;
        }
    }
}

/* Qᵀ packed as pairs: dst[(c/2)·(2·rows_pad) + 2·r + c%2] = q[r][c]; odd d: the last pair's
 * second slot 0; padding rows 0. */
static void pack_pairs(uint16_t *dst, const uint16_t *q, int64_t ldq, int64_t n_rows, int64_t rows_pad, int64_t d) {
    int64_t pairs = (d + 1) / 2;
    memset(dst, 0, sizeof(uint16_t) * (size_t)(pairs * 2 * rows_pad));
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t c = 0; c < d; c++) dst[(c / 2) * 2 * rows_pad + 2 * r + (c & 1)] = q[r * ldq + c];
}

static double frand(void) { return (double)rand() / RAND_MAX * 2.0 - 1.0; }

int main(int argc, char **argv) {
    const int64_t rows = 64, heads = 16; /* K rows of one head lie heads·d apart, as in [b, s, h, d] */
    static const int64_t shapes[][2] = {{64, 64}, {128, 64}, {64, 128}, {128, 128}, {128, 59}, {128, 256}};
    double seconds = argc > 1 ? atof(argv[1]) : 0.3;
    printf("%-6s %-4s %-10s %-10s %-10s %-10s %-8s %-8s %s\n", "keys", "d", "f32_gemm", "bf16_gemm", "f32_tile",
           "bf16_tile", "gemm_x", "tile_x", "max|diff|/max|s|");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t keys = shapes[si][0], d = shapes[si][1];
        int64_t ldk = heads * d; /* caller stride between key rows of one head */
        uint16_t *k16 = aligned_alloc(64, sizeof(uint16_t) * (size_t)(keys * ldk + 64));
        uint16_t *q16 = aligned_alloc(64, sizeof(uint16_t) * (size_t)(rows * d + 64));
        float *k32 = aligned_alloc(64, sizeof(float) * (size_t)(keys * d + 64));
        float *qt32 = aligned_alloc(64, sizeof(float) * (size_t)(d * rows + 64));
        uint16_t *qtp = aligned_alloc(64, sizeof(uint16_t) * (size_t)((d + 1) / 2 * 2 * rows + 64));
        float *s_a = aligned_alloc(64, sizeof(float) * (size_t)(keys * rows));
        float *s_b = aligned_alloc(64, sizeof(float) * (size_t)(keys * rows));
        for (int64_t i = 0; i < keys * ldk; i++) k16[i] = to_bf16((float)frand());
        for (int64_t i = 0; i < rows * d; i++) q16[i] = to_bf16((float)frand());
        for (int64_t c = 0; c < d; c++)
            for (int64_t r = 0; r < rows; r++) qt32[c * rows + r] = from_bf16(q16[r * d + c]);
        pack_pairs(qtp, q16, d, rows, rows, d);
        float scale = 1.0f / sqrtf((float)d);
        for (int64_t j = 0; j < keys; j++) convert_row(k32 + j * d, k16 + j * ldk, d);

        /* accuracy: both against a double reference */
        gemm_f32(keys, rows, d, k32, d, qt32, rows, s_a, rows, scale);
        gemm_bf16(keys, rows, d, k16, ldk, qtp, 2 * rows, s_b, rows, scale);
        double max_diff = 0, max_s = 0, err_a = 0, err_b = 0;
        for (int64_t j = 0; j < keys; j++)
            for (int64_t r = 0; r < rows; r++) {
                double ref = 0;
                for (int64_t c = 0; c < d; c++) ref += (double)k32[j * d + c] * from_bf16(q16[r * d + c]);
                ref *= scale;
                double a = s_a[j * rows + r], b = s_b[j * rows + r];
                max_diff = fmax(max_diff, fabs(a - b));
                max_s = fmax(max_s, fabs(ref));
                err_a = fmax(err_a, fabs(a - ref));
                err_b = fmax(err_b, fabs(b - ref));
            }

        double flops = 2.0 * keys * rows * d, rate[4];
        for (int method = 0; method < 4; method++) {
            long iters = 0;
            double t0 = now(), t;
            do {
                for (int rep = 0; rep < 64; rep++) {
                    if (method == 0) gemm_f32(keys, rows, d, k32, d, qt32, rows, s_a, rows, scale);
                    else if (method == 1) gemm_bf16(keys, rows, d, k16, ldk, qtp, 2 * rows, s_b, rows, scale);
                    else if (method == 2) {
                        for (int64_t j = 0; j < keys; j++) convert_row(k32 + j * d, k16 + j * ldk, d);
                        gemm_f32(keys, rows, d, k32, d, qt32, rows, s_a, rows, scale);
                    } else gemm_bf16(keys, rows, d, k16, ldk, qtp, 2 * rows, s_b, rows, scale);
                }
                iters += 64;
                t = now() - t0;
            } while (t < seconds);
            rate[method] = flops * iters / t * 1e-9;
        }
        printf("%-6ld %-4ld %-10.1f %-10.1f %-10.1f %-10.1f %-8.2f %-8.2f %.2e  (err vs f64: f32 %.2e bf16 %.2e)\n",
               (long)keys, (long)d, rate[0], rate[1], rate[2], rate[3], rate[1] / rate[0], rate[3] / rate[2],
               max_diff / max_s, err_a / max_s, err_b / max_s);
        free(k16), free(q16), free(k32), free(qt32), free(qtp), free(s_a), free(s_b);
    }
    return 0;
}
