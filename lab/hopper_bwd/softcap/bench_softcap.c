/*
 * bench_softcap.c: backward timing with and without softcap, the default kernel (the Hopper one on
 * sm_90 for the problems it covers) against the portable one (FA_CUDA_BACKWARD=portable, read by
 * every fa_backward call). `flashattn bench` has no softcap flag, hence this program.
 * One fa_forward per configuration, then per kernel 3 untimed and 10 timed fa_backward calls
 * (median of cudaEvent times). bf16, dense [b, s, h, d], b·s = 8k tokens.
 * FLOPs as `flashattn bench`: backward = 2.5 × 4·b·h·s²·d, halved when causal.
 * Usage: bench_softcap (built by run_on_gpu.sh against the patched library)
 */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("bench_softcap: %s: %s\n", #call, cudaGetErrorString(e_));                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint32_t rng_state = 12345u;
static uint16_t random_bf16(float amplitude) { /* uniform in ±amplitude, truncated to bf16 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    const float f = amplitude * (2.0f * (float)(rng_state >> 8) / 16777216.0f - 1.0f);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median ms of 10 fa_backward calls (after 3 untimed ones); portable: FA_CUDA_BACKWARD=portable. */
static float time_backward(const fa_params *p, int portable) {
    if (portable) setenv("FA_CUDA_BACKWARD", "portable", 1);
    else unsetenv("FA_CUDA_BACKWARD");
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    float ms[10];
    for (int i = 0; i < 13; ++i) {
        CHECK(cudaEventRecord(start, 0));
        fa_status s = fa_backward(p);
        if (s != FA_OK) {
            printf("bench_softcap: fa_backward: %s: %s\n", fa_strerror(s), fa_last_error());
            exit(1);
        }
        CHECK(cudaEventRecord(stop, 0));
        CHECK(cudaEventSynchronize(stop));
        if (i >= 3) CHECK(cudaEventElapsedTime(&ms[i - 3], start, stop));
    }
    unsetenv("FA_CUDA_BACKWARD");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    qsort(ms, 10, sizeof ms[0], compare_floats);
    return 0.5f * (ms[4] + ms[5]);
}

int main(void) {
    static const int dims[] = {64, 128, 256}, lengths[] = {2048, 8192};
    printf("bench_softcap: bf16 backward, b·s = 8k tokens; ms and TFLOP/s (2.5 × 4·b·h·s²·d, /2 causal)\n");
    printf("%4s %5s %3s %6s %7s | %9s %7s | %9s %7s | %s\n", "d", "s", "h", "causal", "softcap", "default", "TFLOP/s",
           "portable", "TFLOP/s", "speed-up");
    for (int di = 0; di < 3; ++di)
        for (int si = 0; si < 2; ++si) {
            const int d = dims[di], s = lengths[si], b = 8192 / s, h = d == 256 ? 8 : 16;
            const size_t elems = (size_t)b * s * h * d;
            uint16_t *host = malloc(elems * 2);
            void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
            float *lse;
            void **bufs[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
            for (int t = 0; t < 8; ++t) {
                CHECK(cudaMalloc(bufs[t], elems * 2));
                if (t == 3 || t > 4) continue;
                for (size_t e = 0; e < elems; ++e) host[e] = random_bf16(t == 0 ? 20.0f : 2.0f); /* q: tanh saturates partly */
                CHECK(cudaMemcpy(*bufs[t], host, elems * 2, cudaMemcpyHostToDevice));
            }
            CHECK(cudaMalloc((void **)&lse, (size_t)b * h * s * 4));
            for (int causal = 0; causal < 2; ++causal)
                for (int cap = 0; cap < 2; ++cap) {
                    fa_params p;
                    memset(&p, 0, sizeof p);
                    p.device = FA_DEVICE_CUDA;
                    p.dtype = FA_DTYPE_BF16;
                    p.batch = b;
                    p.seqlen_q = s;
                    p.seqlen_k = s;
                    p.heads_q = h;
                    p.heads_kv = h;
                    p.head_dim = d;
                    p.head_dim_v = d;
                    p.q = q, p.k = k, p.v = v, p.o = o, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
                    p.lse = lse;
                    fa_set_contiguous_strides(&p);
                    p.causal = causal;
                    p.softcap = cap ? 30.0f : 0.0f;
                    fa_status st = fa_forward(&p);
                    if (st != FA_OK) {
                        printf("bench_softcap: fa_forward: %s: %s\n", fa_strerror(st), fa_last_error());
                        return 1;
                    }
                    const float ms_default = time_backward(&p, 0), ms_portable = time_backward(&p, 1);
                    const double flops = 2.5 * 4.0 * b * h * (double)s * s * d / (causal ? 2.0 : 1.0);
                    printf("%4d %5d %3d %6d %7.0f | %9.3f %7.1f | %9.3f %7.1f | %.2fx\n", d, s, h, causal, p.softcap,
                           ms_default, flops / ms_default * 1e-9, ms_portable, flops / ms_portable * 1e-9,
                           ms_portable / ms_default);
                }
            for (int t = 0; t < 8; ++t) cudaFree(*bufs[t]);
            cudaFree(lse);
            free(host);
        }
    return 0;
}
