/*
 * gpu_util.c: the GPU test programs' seeds, random numbers, 16-bit conversions and forward buffers
 * (gpu_util.h).
 */
#include "gpu_util.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t gpu_announce_seed(const char *mode) {
    const char *env = getenv("FA_TEST_SEED");
    uint64_t seed;
    if (env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    printf("%s: seed %llu (FA_TEST_SEED=%llu reproduces)\n", mode, (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

cudaError_t gpu_buffers_upload(fa_test_buffer *bufs, int count) {
    for (int i = 0; i < count; i++) {
        if (!bufs[i].host) continue;
        cudaError_t e = bufs[i].device ? cudaSuccess : cudaMalloc(&bufs[i].device, bufs[i].bytes);
        if (e == cudaSuccess) e = cudaMemcpy(bufs[i].device, bufs[i].host, bufs[i].bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t gpu_buffers_download(fa_test_buffer *bufs, int count) {
    cudaError_t e = cudaDeviceSynchronize();
    for (int i = 0; i < count && e == cudaSuccess; i++)
        if (bufs[i].host && bufs[i].device)
            e = cudaMemcpy(bufs[i].host, bufs[i].device, bufs[i].bytes, cudaMemcpyDeviceToHost);
    return e;
}

cudaError_t gpu_buffers_release(fa_test_buffer *bufs, int count) {
    cudaError_t first = cudaSuccess;
    for (int i = 0; i < count; i++)
        if (bufs[i].device) {
            cudaError_t e = cudaFree(bufs[i].device);
            if (first == cudaSuccess) first = e;
            bufs[i].device = NULL;
        }
    return first;
}

float gpu_random_uniform(gpu_rng *rng, float lo, float hi) {
    uint32_t x = rng->state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    rng->state = x;
    return lo + (hi - lo) * (float)(x >> 8) / 16777216.0f;
}

uint16_t gpu_float_to_16(float f, fa_dtype dtype) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dtype == FA_DTYPE_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const float a = fabsf(f);
    if (a < 6.103515625e-05f) /* below 2^-14: subnormal, a multiple of 2^-24 (1024 encodes 2^-14) */
        return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
    memcpy(&u, &a, 4);
    u += 0xfffu + ((u >> 13) & 1u); /* round away the 13 low mantissa bits, ties to even */
    return (uint16_t)(sign | (uint16_t)((u >> 13) - ((127u - 15u) << 10)));
}

float gpu_float_from_16(uint16_t x, fa_dtype dtype) {
    if (dtype == FA_DTYPE_BF16) {
        const uint32_t u = (uint32_t)x << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const int exponent = (x >> 10) & 0x1f, mantissa = x & 0x3ff;
    float a;
    if (exponent == 0)
        a = ldexpf((float)mantissa, -24);
    else if (exponent == 31)
        a = mantissa ? NAN : INFINITY;
    else
        a = ldexpf((float)(mantissa | 0x400), exponent - 25);
    return (x & 0x8000) ? -a : a;
}

const char *gpu_fwd_buffers_upload(gpu_fwd_buffers *b, const gpu_fwd_sizes *n, const uint16_t *host, const int *cu_q,
                                   const int *cu_k) {
    memset(b, 0, sizeof *b);
    if (cudaMalloc(&b->q, 2 * n->q) != cudaSuccess || cudaMalloc(&b->k, 2 * n->k) != cudaSuccess ||
        cudaMalloc(&b->v, 2 * n->v) != cudaSuccess || cudaMalloc(&b->o, 2 * n->o) != cudaSuccess ||
        cudaMalloc((void **)&b->lse, 4 * n->lse) != cudaSuccess)
        return "cudaMalloc of q, k, v, o or lse";
    if (cudaMemcpy(b->q, host, 2 * n->q, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(b->k, host + n->q, 2 * n->k, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(b->v, host + n->q + n->k, 2 * n->v, cudaMemcpyHostToDevice) != cudaSuccess)
        return "cudaMemcpy of q, k or v";
    if (n->cu_count == 0) return NULL;
    if (cudaMalloc((void **)&b->cu_q, sizeof(int) * n->cu_count) != cudaSuccess ||
        cudaMalloc((void **)&b->cu_k, sizeof(int) * n->cu_count) != cudaSuccess ||
        cudaMemcpy(b->cu_q, cu_q, sizeof(int) * n->cu_count, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(b->cu_k, cu_k, sizeof(int) * n->cu_count, cudaMemcpyHostToDevice) != cudaSuccess)
        return "cudaMalloc / cudaMemcpy of cu_seqlens";
    return NULL;
}

void gpu_fwd_buffers_free(gpu_fwd_buffers *b) {
    cudaFree(b->q), cudaFree(b->k), cudaFree(b->v), cudaFree(b->o), cudaFree(b->lse);
    cudaFree(b->cu_q), cudaFree(b->cu_k);
    memset(b, 0, sizeof *b);
}

void gpu_fwd_params(fa_params *p, const gpu_fwd_buffers *b, int batch, int seqlen_q, int seqlen_k, int heads_q,
                    int heads_kv, int head_dim, int head_dim_v, long total_q, long total_k, int causal,
                    int window_left, float softcap) {
    memset(p, 0, sizeof *p);
    p->device = FA_DEVICE_CUDA;
    p->dtype = FA_DTYPE_BF16;
    p->batch = batch;
    p->seqlen_q = seqlen_q;
    p->seqlen_k = seqlen_k;
    p->heads_q = heads_q;
    p->heads_kv = heads_kv;
    p->head_dim = head_dim;
    p->head_dim_v = head_dim_v;
    p->q = b->q, p->k = b->k, p->v = b->v, p->o = b->o, p->lse = b->lse;
    if (total_q > 0) {
        p->cu_seqlens_q = b->cu_q;
        p->cu_seqlens_k = b->cu_k;
        p->total_q = total_q;
        p->total_k = total_k;
    }
    fa_set_contiguous_strides(p);
    p->causal = causal;
    p->use_window = window_left >= 0;
    p->window_left = window_left;
    p->window_right = -1;
    p->softcap = softcap;
}
