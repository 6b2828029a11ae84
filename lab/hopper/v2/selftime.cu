/*
 * selftime.cu: hopper_fwd_selftime (hopper_fwd.h), the lab kernel timed with no other CUDA user in
 * the process: the fallback when calling the library from a PyTorch process misbehaves
 * (lab/cuda_fwd/README.md records a crash there), and the driver for compute-sanitizer runs.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "flashattn.h"
#include "hopper_fwd.h"

/* x[i] = lo + (hi - lo)·u with u uniform in [0, 1) from a hash of (i, seed), rounded to 16 bits. */
__global__ void hopper_fill_kernel(uint16_t *x, int64_t n, uint32_t seed, float lo, float hi, int bf16) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) * 0x85EBCA77u ^ seed;
        h ^= h >> 15;
        h *= 0x2C1B3C6Du;
        h ^= h >> 12;
        h *= 0x297A2D39u;
        h ^= h >> 15;
        const float v = lo + (hi - lo) * (float)(h >> 8) * (1.0f / 16777216.0f);
        x[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16(v)) : __half_as_ushort(__float2half(v));
    }
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" int hopper_fwd_selftime(int dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                   int64_t heads_kv, int64_t head_dim, int causal, int warmup, int reps,
                                   float *ms_median) {
    const int64_t nq = batch * seqlen_q * heads_q * head_dim, nk = batch * seqlen_k * heads_kv * head_dim;
    const size_t flush_bytes = (size_t)256 << 20;
    uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    float *lse = nullptr, *times = nullptr;
    void *flush = nullptr;
    cudaEvent_t *events = nullptr;
    int status = FA_OK;
    if (ms_median) *ms_median = 0.0f;
    if (cudaMalloc(&q, 2 * (size_t)(nq > 0 ? nq : 1)) != cudaSuccess ||
        cudaMalloc(&k, 2 * (size_t)(nk > 0 ? nk : 1)) != cudaSuccess ||
        cudaMalloc(&v, 2 * (size_t)(nk > 0 ? nk : 1)) != cudaSuccess ||
        cudaMalloc(&o, 2 * (size_t)(nq > 0 ? nq : 1)) != cudaSuccess ||
        cudaMalloc(&lse, 4 * (size_t)(batch * heads_q * seqlen_q > 0 ? batch * heads_q * seqlen_q : 1)) != cudaSuccess ||
        (reps > 0 && cudaMalloc(&flush, flush_bytes) != cudaSuccess)) {
        status = FA_ERR_ALLOC;
        goto done;
    }
    hopper_fill_kernel<<<1024, 256>>>(q, nq, 1u, -1.0f, 1.0f, dtype == FA_DTYPE_BF16);
    hopper_fill_kernel<<<1024, 256>>>(k, nk, 2u, -1.0f, 1.0f, dtype == FA_DTYPE_BF16);
    hopper_fill_kernel<<<1024, 256>>>(v, nk, 3u, -0.5f, 1.5f, dtype == FA_DTYPE_BF16);
    {
        hopper_fwd_args a = {};
        a.dtype = dtype;
        a.causal = causal;
        a.batch = batch;
        a.seqlen_q = seqlen_q;
        a.seqlen_k = seqlen_k;
        a.heads_q = heads_q;
        a.heads_kv = heads_kv;
        a.head_dim = head_dim;
        a.q = q;
        a.k = k;
        a.v = v;
        a.o = o;
        a.lse = lse;
        a.q_row_stride = a.o_row_stride = heads_q * head_dim;
        a.q_head_stride = a.o_head_stride = head_dim;
        a.q_batch_stride = a.o_batch_stride = seqlen_q * heads_q * head_dim;
        a.k_row_stride = a.v_row_stride = heads_kv * head_dim;
        a.k_head_stride = a.v_head_stride = head_dim;
        a.k_batch_stride = a.v_batch_stride = seqlen_k * heads_kv * head_dim;
        for (int i = 0; i < warmup && status == FA_OK; ++i) status = hopper_fwd(&a);
        if (status != FA_OK || reps <= 0) goto done;
        events = (cudaEvent_t *)calloc(2 * (size_t)reps, sizeof(cudaEvent_t));
        times = (float *)calloc((size_t)reps, sizeof(float));
        if (events == nullptr || times == nullptr) {
            status = FA_ERR_ALLOC;
            goto done;
        }
        for (int i = 0; i < 2 * reps; ++i)
            if (cudaEventCreate(&events[i]) != cudaSuccess) {
                status = FA_ERR_CUDA;
                goto done;
            }
        for (int r = 0; r < reps && status == FA_OK; ++r) {
            cudaMemsetAsync(flush, r & 0xff, flush_bytes, 0); /* evict q, k, v from L2 */
            cudaEventRecord(events[2 * r], 0);
            status = hopper_fwd(&a);
            cudaEventRecord(events[2 * r + 1], 0);
        }
        if (status == FA_OK && cudaEventSynchronize(events[2 * reps - 1]) != cudaSuccess) status = FA_ERR_CUDA;
        for (int r = 0; r < reps && status == FA_OK; ++r)
            if (cudaEventElapsedTime(&times[r], events[2 * r], events[2 * r + 1]) != cudaSuccess) status = FA_ERR_CUDA;
        if (status == FA_OK) {
            qsort(times, (size_t)reps, sizeof(float), cmp_float);
            if (ms_median) *ms_median = times[reps / 2];
        }
    }
done:
    if (cudaDeviceSynchronize() != cudaSuccess && status == FA_OK) status = FA_ERR_CUDA;
    if (events)
        for (int i = 0; i < 2 * reps; ++i)
            if (events[i]) cudaEventDestroy(events[i]);
    free(events);
    free(times);
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(flush);
    return status;
}
