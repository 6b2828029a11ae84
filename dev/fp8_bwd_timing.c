/*
 * dev/fp8_bwd_timing.c: timing of the fp8 backward for the experiment "e4m3 Sᵀ and dPᵀ in the
 * Hopper backward" (docs/tuning-log.md). Per shape (the standard ones: b·s = 16k tokens, heads =
 * 2048 / d) one process times, interleaved for two rounds, fa_backward on e4m3 q, k, v and an e4m3
 * dout with the fp8 kernel (fp8), the same call with FA_HOPPER_BWD_FP8=0 (the bf16 backward on the
 * dequantised copies: copy), and the bf16 backward on bf16 tensors of the shape (bf16); median of
 * 20 calls after 3 (CUDA events), TFLOP/s with FlashAttention's convention (2.5 · 4·b·h·s²·d,
 * halved causal), the best round. One line per shape: "d causal s fp8 copy bf16".
 *   cc -O2 -std=c11 -Iinclude -I$(make -s print-cuda-include) dev/fp8_bwd_timing.c BUILD/libflashattn.a \
 *      $(make -s print-cuda-libs CUDART=static) -lm -o fp8_bwd_timing
 *   ./fp8_bwd_timing D CAUSAL S [D CAUSAL S ...]
 */
#define _POSIX_C_SOURCE 200112L
#include <cuda_runtime.h>
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

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* n random elements on the device: e4m3 codes of magnitude 2^-2 .. 2^2 (bytes = 1), or bf16
 * values of magnitude 2^-2 .. 2^2 (bytes = 2) */
static void *device_random(size_t n, int bytes) {
    uint8_t *host = malloc(n * bytes);
    if (!host) exit(1);
    for (size_t i = 0; i < n; i++) {
        const uint32_t r = rng_next();
        if (bytes == 1) {
            host[i] = (uint8_t)((r & 0x80u) | ((5u + (r >> 8) % 5u) << 3) | ((r >> 16) & 7u));
        } else {
            const uint16_t v = (uint16_t)((r & 0x8000u) | ((125u + (r >> 8) % 5u) << 7) | ((r >> 16) & 0x7fu));
            memcpy(host + 2 * i, &v, 2);
        }
    }
    void *dev = NULL;
    CHECK(cudaMalloc(&dev, n * bytes));
    CHECK(cudaMemcpy(dev, host, n * bytes, cudaMemcpyHostToDevice));
    free(host);
    return dev;
}

static int compare(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double time_backward(const fa_params *p, const char *fp8_env) {
    enum { WARMUP = 3, CALLS = 20 };
    float ms[CALLS];
    setenv("FA_HOPPER_BWD_FP8", fp8_env, 1);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < WARMUP + CALLS; i++) {
        CHECK(cudaEventRecord(start, 0));
        const fa_status st = fa_backward(p);
        CHECK(cudaEventRecord(stop, 0));
        if (st != FA_OK) {
            fprintf(stderr, "fa_backward: %s: %s\n", fa_strerror(st), fa_last_error());
            exit(1);
        }
        CHECK(cudaEventSynchronize(stop));
        if (i >= WARMUP) CHECK(cudaEventElapsedTime(&ms[i - WARMUP], start, stop));
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    qsort(ms, CALLS, sizeof ms[0], compare);
    return 0.5 * (ms[CALLS / 2 - 1] + ms[CALLS / 2]);
}

int main(int argc, char **argv) {
    if (argc < 4 || (argc - 1) % 3 != 0) {
        fprintf(stderr, "usage: %s D CAUSAL S [D CAUSAL S ...]\n", argv[0]);
        return 2;
    }
    for (int a = 1; a + 2 < argc; a += 3) {
        const int d = atoi(argv[a]), causal = atoi(argv[a + 1]), s = atoi(argv[a + 2]);
        const int h = 2048 / d, b = 16384 / s;
        const size_t n = (size_t)b * s * h * d;
        fa_params f8, bf;
        memset(&f8, 0, sizeof f8);
        f8.device = FA_DEVICE_CUDA;
        f8.dtype = FA_DTYPE_FP8_E4M3;
        f8.batch = b;
        f8.seqlen_q = f8.seqlen_k = s;
        f8.heads_q = f8.heads_kv = h;
        f8.head_dim = f8.head_dim_v = d;
        f8.causal = causal;
        bf = f8;
        bf.dtype = FA_DTYPE_BF16;
        f8.q = device_random(n, 1);
        f8.k = device_random(n, 1);
        f8.v = device_random(n, 1);
        f8.dout = device_random(n, 1);
        f8.dout_e4m3 = 1;
        bf.q = device_random(n, 2);
        bf.k = device_random(n, 2);
        bf.v = device_random(n, 2);
        bf.dout = device_random(n, 2);
        CHECK(cudaMalloc(&f8.o, 2 * n));
        CHECK(cudaMalloc((void **)&f8.lse, sizeof(float) * (size_t)b * h * s));
        CHECK(cudaMalloc(&bf.o, 2 * n));
        CHECK(cudaMalloc((void **)&bf.lse, sizeof(float) * (size_t)b * h * s));
        CHECK(cudaMalloc(&f8.dq, 2 * n));
        CHECK(cudaMalloc(&f8.dk, 2 * n));
        CHECK(cudaMalloc(&f8.dv, 2 * n));
        bf.dq = f8.dq;
        bf.dk = f8.dk;
        bf.dv = f8.dv;
        fa_set_contiguous_strides(&f8);
        fa_set_contiguous_strides(&bf);
        if (fa_forward(&f8) != FA_OK || fa_forward(&bf) != FA_OK) {
            fprintf(stderr, "fa_forward: %s\n", fa_last_error());
            return 1;
        }
        const double flops = 2.5 * 4.0 * b * h * (double)s * s * d * (causal ? 0.5 : 1.0);
        double best[3] = {0, 0, 0};
        for (int round = 0; round < 2; round++) {
            const double t[3] = {time_backward(&f8, "1"), time_backward(&f8, "0"), time_backward(&bf, "1")};
            for (int i = 0; i < 3; i++) {
                const double tf = flops / (t[i] * 1e-3) / 1e12;
                if (tf > best[i]) best[i] = tf;
            }
        }
        printf("%d %d %d %.1f %.1f %.1f\n", d, causal, s, best[0], best[1], best[2]);
        fflush(stdout);
        void *bufs[] = {(void *)f8.q, (void *)f8.k, (void *)f8.v, (void *)f8.dout, (void *)bf.q, (void *)bf.k,
                        (void *)bf.v, (void *)bf.dout, f8.o, f8.lse, bf.o, bf.lse, f8.dq, f8.dk, f8.dv};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CHECK(cudaFree(bufs[i]));
    }
    return 0;
}
