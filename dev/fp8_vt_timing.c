/*
 * dev/fp8_vt_timing.c: timing of the fp8 e4m3 forward for the experiment "V transposed in the
 * kernel" (docs/tuning-log.md). fa_forward on device buffers of random e4m3 codes, the standard
 * shapes (b·s = 16k tokens, heads = 2048 / d), median of the timed calls (CUDA events, one call
 * each after the warm-up), TFLOP/s with FlashAttention's convention (4·b·h·s²·d, halved causal).
 * One line per shape: "d causal s tflops ms". Build it against each library to compare:
 *   cc -O2 -std=c11 -Iinclude -I$(make -s print-cuda-include) dev/fp8_vt_timing.c BUILD/libflashattn.a \
 *      $(make -s print-cuda-libs \
 *      CUDART=static) -lm -o fp8_vt_timing
 *   ./fp8_vt_timing D CAUSAL S [D CAUSAL S ...]
 */
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

/* e4m3 codes of magnitude 2^-2 .. 2^2 (exponent fields 5 .. 9), random sign and mantissa */
static void *device_codes(size_t n) {
    uint8_t *host = malloc(n);
    if (!host) exit(1);
    for (size_t i = 0; i < n; i++) {
        const uint32_t r = rng_next();
        host[i] = (uint8_t)((r & 0x80u) | ((5u + (r >> 8) % 5u) << 3) | ((r >> 16) & 7u));
    }
    void *dev = NULL;
    CHECK(cudaMalloc(&dev, n));
    CHECK(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice));
    free(host);
    return dev;
}

static int compare(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
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
        fa_params p;
        memset(&p, 0, sizeof p);
        p.device = FA_DEVICE_CUDA;
        p.dtype = FA_DTYPE_FP8_E4M3;
        p.batch = b;
        p.seqlen_q = p.seqlen_k = s;
        p.heads_q = p.heads_kv = h;
        p.head_dim = p.head_dim_v = d;
        p.causal = causal;
        p.q = device_codes(n);
        p.k = device_codes(n);
        p.v = device_codes(n);
        CHECK(cudaMalloc(&p.o, 2 * n));
        CHECK(cudaMalloc((void **)&p.lse, sizeof(float) * (size_t)b * h * s));
        fa_set_contiguous_strides(&p);
        enum { WARMUP = 3, CALLS = 20 };
        float ms[CALLS];
        cudaEvent_t start, stop;
        CHECK(cudaEventCreate(&start));
        CHECK(cudaEventCreate(&stop));
        for (int i = 0; i < WARMUP + CALLS; i++) {
            CHECK(cudaEventRecord(start, 0));
            const fa_status st = fa_forward(&p);
            CHECK(cudaEventRecord(stop, 0));
            if (st != FA_OK) {
                fprintf(stderr, "d %d causal %d s %d: %s: %s\n", d, causal, s, fa_strerror(st), fa_last_error());
                return 1;
            }
            CHECK(cudaEventSynchronize(stop));
            if (i >= WARMUP) CHECK(cudaEventElapsedTime(&ms[i - WARMUP], start, stop));
        }
        qsort(ms, CALLS, sizeof ms[0], compare);
        const double median = 0.5 * (ms[CALLS / 2 - 1] + ms[CALLS / 2]);
        const double flops = 4.0 * b * h * (double)s * s * d * (causal ? 0.5 : 1.0);
        printf("%d %d %d %.1f %.4f\n", d, causal, s, flops / (median * 1e-3) / 1e12, median);
        CHECK(cudaFree((void *)p.q));
        CHECK(cudaFree((void *)p.k));
        CHECK(cudaFree((void *)p.v));
        CHECK(cudaFree(p.o));
        CHECK(cudaFree(p.lse));
        CHECK(cudaEventDestroy(start));
        CHECK(cudaEventDestroy(stop));
    }
    return 0;
}
