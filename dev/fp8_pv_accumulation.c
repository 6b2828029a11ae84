/*
 * dev/fp8_pv_accumulation.c: how the H100/H200's e4m3 wgmma forms its sums, for the oracle's fp8
 * baseline (oracle/reference.c, fp8_mma_step; docs/tuning-log.md, "the fp8 tensor cores' sums").
 *
 * fa_forward on e4m3 inputs built so that every P of a row is exactly 1: all keys of a head share
 * one K row (equal scores) and there are 128 keys (one tile: the running maximum is the final
 * one). Then O[c] = Σ_j V[j, c] / 128, summed by four k32 P·V steps and nothing else, and
 * LSE = scale·S + ln 128 with S = q·k of the fp8 S GEMM (padded to the head-dim bucket). V makes
 * the P·V sums visible at bf16's resolution: per column key 0 holds +B and key 96 -B (B = 256 or
 * 448), cancelling, the other keys values 2^-6..2^2 (multiples of 2^-9, finer than 14 bits below
 * B); q spans 2^-5..2^2 so that S's products span many binades. Each model's O, rounded to bf16,
 * is compared element by element with the GPU's, and its LSE with the GPU's.
 *
 *   cc -O2 -std=c11 [-DDIM=96] -Iinclude -I/usr/local/cuda/include dev/fp8_pv_accumulation.c \
 *      BUILD/libflashattn.a -L/usr/local/cuda/lib64 -lcudart_static -pthread -lstdc++ -ldl -lrt -lm
 *   ./a.out [V mode [dump file]]   (V mode: 0 the pair at keys 0 and 96; 4 at keys 0 and 1;
 *                                   1 no pair; 2 the pair only)
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

#define CHECK(x)                                                                                         \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                     \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

#ifndef DIM
#define DIM 128 /* head dim (also 96: the S product then has a zero k32 step) */
#endif
enum { HEADS = 32, SQ = 64, SK = 128, D = DIM };

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static double e4m3_value(uint8_t code) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    const double mag = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -mag : mag;
}

static float bf16_round(float x) { /* round to nearest even, as the kernel's cvt.rn */
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

static int compare_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* One k32 step of a model of the e4m3 wgmma: acc plus the exact products a_i·b_i, each (and, with
 * ALIGN_ACC, the accumulator) cut to BITS below the largest exponent among them, toward -inf
 * (ROUND_DOWN), toward zero (ROUND_ZERO) or to nearest; a product's exponent is its normalised
 * one (EXP_PRODUCT) or the sum of its factors' (EXP_FACTORS, before the mantissa product's
 * carry). Without ALIGN_ACC the step's sum is formed alone and added to acc in fp32. */
enum { ROUND_DOWN, ROUND_ZERO, ROUND_NEAREST };
enum { EXP_PRODUCT, EXP_FACTORS };
static double cut(double x, double unit, int rounding) {
    return (rounding == ROUND_DOWN ? floor(x / unit) : rounding == ROUND_ZERO ? trunc(x / unit) : nearbyint(x / unit)) * unit;
}
static float model_step(float acc, const double *a, const double *b, int n, int align_acc, int bits, int rounding,
                        int exp_kind) {
    int top = INT_MIN, e, ea, eb;
    if (align_acc && acc != 0.0f) {
        frexp((double)acc, &e);
        top = e;
    }
    for (int i = 0; i < n; i++) {
        const double x = a[i] * b[i];
        if (x == 0.0) continue;
        if (exp_kind == EXP_PRODUCT) {
            frexp(x, &e);
        } else {
            frexp(a[i], &ea);
            frexp(b[i], &eb);
            e = ea + eb - 1;
        }
        if (e > top) top = e;
    }
    if (top == INT_MIN) return acc;
    const double unit = ldexp(1.0, top - bits);
    double sum = align_acc ? cut((double)acc, unit, rounding) : 0.0;
    for (int i = 0; i < n; i++) sum += cut(a[i] * b[i], unit, rounding);
    return align_acc ? (float)sum : acc + (float)sum;
}

int main(int argc, char **argv) {
    /* V: 0 = the cancelling pair (keys 0 and 96) and small values, 1 = small values only, 2 = the
     * pair only, 4 = the pair at keys 0 and 1 (one k32 step) and small values */
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    const size_t nq = (size_t)SQ * HEADS * D, nk = (size_t)SK * HEADS * D;
    uint8_t *q = malloc(nq), *k = malloc(nk), *v = malloc(nk);
    uint16_t *o = malloc(2 * nq);
    if (!q || !k || !v || !o) return 1;
    for (size_t i = 0; i < nq; i++) q[i] = (uint8_t)((rng_next() & 0x80u) | ((2u + rng_next() % 7u) << 3) | (rng_next() & 7u));
    for (int h = 0; h < HEADS; h++) { /* one K row per head, shared by every key */
        uint8_t row[D];
        for (int c = 0; c < D; c++) row[c] = (uint8_t)((rng_next() & 0x80u) | ((5u + rng_next() % 3u) << 3) | (rng_next() & 7u));
        for (int j = 0; j < SK; j++) memcpy(k + ((size_t)j * HEADS + h) * D, row, D);
    }
    for (int h = 0; h < HEADS; h++)
        for (int c = 0; c < D; c++)
            for (int j = 0; j < SK; j++) {
                /* small values 2^-6 .. 2^2 with 3 mantissa bits: multiples of 2^-9, finer than
                 * 14 bits below a 2^8 term (2^-5) */
                uint8_t code = (uint8_t)((rng_next() & 0x80u) | ((1u + rng_next() % 8u) << 3) | (rng_next() & 7u));
                /* the cancelling pair: head parity picks 256 or 448 */
                const uint8_t big = (h & 1) ? 0x7E : 0x78; /* 448 = 1.75·2^8, 256 = 2^8 */
                if (mode == 2) code = 0;
                if (j == 0 && mode != 1) code = big;
                if (j == (mode == 4 ? 1 : 96) && mode != 1) code = (uint8_t)(big | 0x80u);
                v[((size_t)j * HEADS + h) * D + c] = code;
            }

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_FP8_E4M3;
    p.batch = 1;
    p.seqlen_q = SQ;
    p.seqlen_k = SK;
    p.heads_q = p.heads_kv = HEADS;
    p.head_dim = p.head_dim_v = D;
    void *dq, *dk, *dv, *dout, *dlse;
    CHECK(cudaMalloc(&dq, nq));
    CHECK(cudaMalloc(&dk, nk));
    CHECK(cudaMalloc(&dv, nk));
    CHECK(cudaMalloc(&dout, 2 * nq));
    CHECK(cudaMalloc(&dlse, sizeof(float) * SQ * HEADS));
    CHECK(cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, k, nk, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv, v, nk, cudaMemcpyHostToDevice));
    p.q = dq;
    p.k = dk;
    p.v = dv;
    p.o = dout;
    p.lse = dlse;
    fa_set_contiguous_strides(&p);
    const fa_status st = fa_forward(&p);
    if (st != FA_OK) {
        fprintf(stderr, "fa_forward: %s: %s\n", fa_strerror(st), fa_last_error());
        return 1;
    }
    CHECK(cudaMemcpy(o, dout, 2 * nq, cudaMemcpyDeviceToHost));
    if (argc > 2) { /* V's codes, the GPU's O [sq][h][d] bf16, Q's and K's codes, the LSE [h][sq] */
        float *lse = malloc(sizeof(float) * SQ * HEADS);
        if (!lse) return 1;
        CHECK(cudaMemcpy(lse, dlse, sizeof(float) * SQ * HEADS, cudaMemcpyDeviceToHost));
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(v, 1, nk, f) != nk || fwrite(o, 2, nq, f) != nq || fwrite(q, 1, nq, f) != nq ||
            fwrite(k, 1, nk, f) != nk || fwrite(lse, sizeof(float), SQ * HEADS, f) != (size_t)SQ * HEADS || fclose(f))
            return 1;
        free(lse);
    }

    struct model { const char *name; int kind, bits, rounding, exp_kind; } models[] = {
        /* kind: 0 exact (double), 1 fp32 in key order, 2 accumulator aligned, 3 step alone + fp32 */
        {"exact", 0, 0, 0, 0},
        {"fp32", 1, 0, 0, 0},
        {"acc-aligned 14 toward -inf, product exp", 2, 14, ROUND_DOWN, EXP_PRODUCT},
        {"acc-aligned 14 toward zero, product exp", 2, 14, ROUND_ZERO, EXP_PRODUCT},
        {"acc-aligned 14 toward zero, factor exps", 2, 14, ROUND_ZERO, EXP_FACTORS},
        {"acc-aligned 14 nearest, factor exps", 2, 14, ROUND_NEAREST, EXP_FACTORS},
        {"acc-aligned 13 toward zero, factor exps", 2, 13, ROUND_ZERO, EXP_FACTORS},
        {"acc-aligned 15 toward zero, factor exps", 2, 15, ROUND_ZERO, EXP_FACTORS},
        {"step alone 14 toward zero + fp32", 3, 14, ROUND_ZERO, EXP_FACTORS},
    };
    const int nmodels = (int)(sizeof models / sizeof models[0]);
    /* the S behind the LSE: every key of a head has the same score, so LSE = scale·S + ln 128 */
    float *lse = malloc(sizeof(float) * SQ * HEADS);
    if (!lse) return 1;
    CHECK(cudaMemcpy(lse, dlse, sizeof(float) * SQ * HEADS, cudaMemcpyDeviceToHost));
    const double scale = 1.0 / sqrt((double)D);
    const int padded = D <= 64 ? 64 : D <= 128 ? 128 : 256; /* the kernel's K of S: the head-dim bucket */
    printf("d %d, V mode %d; O: P·V over %d keys (k32 steps), S: Q Kᵀ over %d columns\n", D, mode, SK, padded);
    printf("model | O bf16-equal of %d | |LSE_model - LSE_gpu| median / 90%% / max over %d rows\n", HEADS * D,
           SQ * HEADS);
    static double lse_err[SQ * HEADS];
    for (int mi = 0; mi < nmodels; mi++) {
        const struct model m = models[mi];
        int equal = 0;
        for (int h = 0; h < HEADS; h++)
            for (int c = 0; c < D; c++) { /* row 0's O: P = 1 for every key */
                double ones[SK], vals[SK], exact = 0.0;
                for (int j = 0; j < SK; j++) {
                    ones[j] = 1.0;
                    vals[j] = e4m3_value(v[((size_t)j * HEADS + h) * D + c]);
                    exact += vals[j];
                }
                float acc = 0.0f;
                if (m.kind == 0) acc = (float)exact;
                else if (m.kind == 1)
                    for (int j = 0; j < SK; j++) acc += (float)vals[j];
                else
                    for (int j0 = 0; j0 < SK; j0 += 32)
                        acc = model_step(acc, ones + j0, vals + j0, 32, m.kind == 2, m.bits, m.rounding, m.exp_kind);
                if (bf16_round(acc / 128.0f) == bf16_value(o[(size_t)h * D + c])) equal++;
            }
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < HEADS; h++) {
                double qv[256] = {0}, kv[256] = {0}, exact = 0.0;
                for (int c = 0; c < D; c++) {
                    qv[c] = e4m3_value(q[((size_t)i * HEADS + h) * D + c]);
                    kv[c] = e4m3_value(k[(size_t)h * D + c]); /* key 0's row: every key's */
                    exact += qv[c] * kv[c];
                }
                float acc = 0.0f;
                if (m.kind == 0) acc = (float)exact;
                else if (m.kind == 1)
                    for (int c = 0; c < D; c++) acc += (float)(qv[c] * kv[c]);
                else
                    for (int c0 = 0; c0 < padded; c0 += 32)
                        acc = model_step(acc, qv + c0, kv + c0, 32, m.kind == 2, m.bits, m.rounding, m.exp_kind);
                lse_err[i * HEADS + h] = fabs(scale * acc + log(128.0) - lse[(size_t)h * SQ + i]); /* LSE [h][sq] */
            }
        qsort(lse_err, SQ * HEADS, sizeof lse_err[0], compare_double);
        printf("%-42s | %5d | %.1e / %.1e / %.1e\n", m.name, equal, lse_err[SQ * HEADS / 2],
               lse_err[SQ * HEADS * 9 / 10], lse_err[SQ * HEADS - 1]);
    }
    free(lse);
    return 0;
}
