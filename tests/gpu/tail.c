/*
 * tests/gpu/tail.c: `fa_gpu_tests tail`, the varlen rows past the last sequence on CUDA
 * (zero_varlen_tail). A varlen forward and backward (bf16, deterministic, head dims 64 and 128,
 * causal and not, GQA) runs twice on NaN-poisoned outputs, with zero_varlen_tail = 0 and = 1.
 * What fails: a tail element (o, lse, dq rows cu_seqlens_q[batch] .. total_q; dk, dv rows
 * cu_seqlens_k[batch] .. total_k) that is not still the poison with 0 or not zero with 1, or any
 * other element that differs bitwise between the two runs.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

static const char *const MODE = "tail";

enum { T_O, T_LSE, T_DQ, T_DK, T_DV, T_COUNT };

static int run_case(int d, int causal, gpu_rng *rng) {
    enum { B = 3, HQ = 4, HKV = 2 };
    static const int32_t cu_q[B + 1] = {0, 70, 70, 199}, cu_k[B + 1] = {0, 100, 105, 235};
    const int64_t total_q = 199 + 37, total_k = 235 + 21;
    const int64_t n_q = total_q * HQ * d, n_k = total_k * HKV * d;
    uint16_t *host_in[4];
    const int64_t in_n[4] = {n_q, n_k, n_k, n_q}; /* q, k, v, dout */
    void *dev_in[4];
    for (int t = 0; t < 4; t++) {
        host_in[t] = (uint16_t *)malloc((size_t)in_n[t] * 2);
        if (host_in[t] == NULL) {
            printf("FAIL %s: out of host memory\n", MODE);
            exit(1);
        }
        for (int64_t i = 0; i < in_n[t]; i++)
            host_in[t][i] = gpu_float_to_16(gpu_random_uniform(rng, -1.0f, 1.0f), FA_DTYPE_BF16);
        GPU_CUDA_OK(MODE, cudaMalloc(&dev_in[t], (size_t)in_n[t] * 2));
        GPU_CUDA_OK(MODE, cudaMemcpy(dev_in[t], host_in[t], (size_t)in_n[t] * 2, cudaMemcpyHostToDevice));
    }
    int32_t *dev_cu;
    GPU_CUDA_OK(MODE, cudaMalloc((void **)&dev_cu, 2 * (B + 1) * sizeof(int32_t)));
    GPU_CUDA_OK(MODE, cudaMemcpy(dev_cu, cu_q, sizeof cu_q, cudaMemcpyHostToDevice));
    GPU_CUDA_OK(MODE, cudaMemcpy(dev_cu + B + 1, cu_k, sizeof cu_k, cudaMemcpyHostToDevice));
    /* outputs: bytes, rows, bytes per row, first tail row */
    const int64_t out_bytes[T_COUNT] = {n_q * 2, HQ * total_q * 4, n_q * 2, n_k * 2, n_k * 2};
    uint8_t *host_out[2][T_COUNT];
    void *dev_out[T_COUNT];
    for (int t = 0; t < T_COUNT; t++) GPU_CUDA_OK(MODE, cudaMalloc(&dev_out[t], (size_t)out_bytes[t]));
    int failures = 0;
    for (int zero = 0; zero < 2; zero++) {
        for (int t = 0; t < T_COUNT; t++) GPU_CUDA_OK(MODE, cudaMemset(dev_out[t], 0xff, (size_t)out_bytes[t]));
        fa_params p;
        memset(&p, 0, sizeof p);
        p.device = FA_DEVICE_CUDA;
        p.dtype = FA_DTYPE_BF16;
        p.batch = B;
        p.seqlen_q = 129;
        p.seqlen_k = 130;
        p.heads_q = HQ;
        p.heads_kv = HKV;
        p.head_dim = d;
        p.cu_seqlens_q = dev_cu;
        p.cu_seqlens_k = dev_cu + B + 1;
        p.total_q = total_q;
        p.total_k = total_k;
        p.zero_varlen_tail = zero;
        p.causal = causal;
        p.deterministic = 1;
        p.q = dev_in[0], p.k = dev_in[1], p.v = dev_in[2], p.dout = dev_in[3];
        p.o = dev_out[T_O], p.lse = (float *)dev_out[T_LSE];
        p.dq = dev_out[T_DQ], p.dk = dev_out[T_DK], p.dv = dev_out[T_DV];
        fa_set_contiguous_strides(&p);
        fa_status s = fa_forward(&p);
        if (s == FA_OK) s = fa_backward(&p);
        if (s != FA_OK) {
            printf("FAIL %s: d %d causal %d zero_varlen_tail %d: %s\n", MODE, d, causal, zero, fa_last_error());
            return 1;
        }
        GPU_CUDA_OK(MODE, cudaDeviceSynchronize());
        for (int t = 0; t < T_COUNT; t++) {
            host_out[zero][t] = (uint8_t *)malloc((size_t)out_bytes[t]);
            if (host_out[zero][t] == NULL) {
                printf("FAIL %s: out of host memory\n", MODE);
                exit(1);
            }
            GPU_CUDA_OK(MODE, cudaMemcpy(host_out[zero][t], dev_out[t], (size_t)out_bytes[t], cudaMemcpyDeviceToHost));
        }
    }
    static const char *const names[T_COUNT] = {"o", "lse", "dq", "dk", "dv"};
    for (int t = 0; t < T_COUNT; t++) {
        const int elem = t == T_LSE ? 4 : 2;
        const int64_t n = out_bytes[t] / elem;
        int64_t bad = 0, first_bad = -1;
        for (int64_t i = 0; i < n; i++) {
            /* the element's packed row: lse is [heads_q, total_q], the others [rows, heads, d] */
            const int64_t row = t == T_LSE ? i % total_q : i / ((t == T_DK || t == T_DV ? HKV : HQ) * d);
            const int tail = row >= (t == T_DK || t == T_DV ? cu_k[B] : cu_q[B]);
            const uint8_t *a = host_out[0][t] + i * elem, *b = host_out[1][t] + i * elem;
            int ok;
            if (tail) {
                ok = 1;
                for (int c = 0; c < elem; c++) ok &= a[c] == 0xff && b[c] == 0;
            } else {
                ok = memcmp(a, b, (size_t)elem) == 0;
            }
            if (!ok && bad++ == 0) first_bad = i;
        }
        GPU_EXPECT(failures, MODE, bad == 0, "d %d causal %d: %s: %lld elements wrong, first at %lld", d, causal,
                   names[t], (long long)bad, (long long)first_bad);
    }
    printf("%s d %d causal %d: %s\n", MODE, d, causal, failures ? "failed" : "ok");
    for (int t = 0; t < 4; t++) {
        free(host_in[t]);
        cudaFree(dev_in[t]);
    }
    for (int t = 0; t < T_COUNT; t++) {
        free(host_out[0][t]);
        free(host_out[1][t]);
        cudaFree(dev_out[t]);
    }
    cudaFree(dev_cu);
    return failures;
}

int gpu_tail_main(int argc, char **argv) {
    (void)argc, (void)argv;
    gpu_rng rng = {(uint32_t)(gpu_announce_seed(MODE) | 1u)};
    int failures = 0;
    for (int d = 64; d <= 128; d *= 2)
        for (int causal = 0; causal < 2; causal++) failures += run_case(d, causal, &rng);
    printf("%s: %s\n", MODE, failures ? "FAILED" : "passed");
    return failures != 0;
}
