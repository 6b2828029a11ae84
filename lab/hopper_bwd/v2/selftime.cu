/*
 * selftime.cu: hopper_bwd_selftime (hopper_bwd.h), the lab d = 256 backward (lab/hopper_bwd/v2) timed with no other CUDA user
 * in the process (the fallback when the same-process bench with torch dies; also what
 * compute-sanitizer drives, with reps = 0).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "flashattn.h"
#include "hopper_bwd.h"

/* x[i] = 16-bit(lo + (hi - lo) · u), u in [0, 1) from a hash of (seed, i). */
__global__ void hbwd_fill_kernel(uint16_t *x, int64_t n, uint32_t seed, float lo, float hi, int bf16) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15;
    h *= 2654435761u;
    h ^= h >> 13;
    const float v = lo + (hi - lo) * (float)(h >> 8) * (1.0f / 16777216.0f);
    if (bf16) {
        uint32_t b = __float_as_uint(v);
        x[i] = (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
    } else {
        x[i] = __half_as_ushort(__float2half_rn(v));
    }
}

__global__ void hbwd_fill_f32_kernel(float *x, int64_t n, float v) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" int hopper_bwd_selftime(int dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                   int64_t heads_kv, int64_t head_dim, int causal, int warmup, int reps,
                                   float *ms_median) {
    const int64_t nq = batch * seqlen_q * heads_q * head_dim, nk = batch * seqlen_k * heads_kv * head_dim;
    const int64_t ws = hopper_bwd_workspace_size(batch, seqlen_q, heads_q, head_dim);
    if (ws < 0) return FA_ERR_HEAD_DIM;
    void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr,
         *dv = nullptr, *work = nullptr, *flush = nullptr;
    float *lse = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    float *times = reps > 0 ? (float *)calloc((size_t)reps, sizeof(float)) : nullptr;
    int st = FA_ERR_ALLOC;
    if (cudaMalloc(&q, 2 * nq) || cudaMalloc(&o, 2 * nq) || cudaMalloc(&dout, 2 * nq) || cudaMalloc(&dq, 2 * nq) ||
        cudaMalloc(&k, 2 * nk) || cudaMalloc(&v, 2 * nk) || cudaMalloc(&dk, 2 * nk) || cudaMalloc(&dv, 2 * nk) ||
        cudaMalloc((void **)&lse, 4 * batch * heads_q * seqlen_q) || cudaMalloc(&work, ws) ||
        cudaMalloc(&flush, 256 << 20) || (reps > 0 && times == nullptr))
        goto done;
    {
        const int bf16 = dtype == FA_DTYPE_BF16;
        void *fills[5] = {q, k, v, o, dout};
        const int64_t sizes[5] = {nq, nk, nk, nq, nq};
        for (int i = 0; i < 5; ++i)
            hbwd_fill_kernel<<<(unsigned)((sizes[i] + 255) / 256), 256>>>((uint16_t *)fills[i], sizes[i], 17u + i,
                                                                          -1.0f, 1.0f, bf16);
        const int64_t nl = batch * heads_q * seqlen_q;
        hbwd_fill_f32_kernel<<<(unsigned)((nl + 255) / 256), 256>>>(lse, nl, logf((float)seqlen_k));
        hopper_bwd_args a = {};
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
        a.dout = dout;
        a.lse = lse;
        a.dq = dq;
        a.dk = dk;
        a.dv = dv;
        /* dense [b, s, h, d] */
        a.q_batch_stride = a.o_batch_stride = a.do_batch_stride = a.dq_batch_stride = seqlen_q * heads_q * head_dim;
        a.q_row_stride = a.o_row_stride = a.do_row_stride = a.dq_row_stride = heads_q * head_dim;
        a.q_head_stride = a.o_head_stride = a.do_head_stride = a.dq_head_stride = head_dim;
        a.k_batch_stride = a.v_batch_stride = a.dk_batch_stride = a.dv_batch_stride = seqlen_k * heads_kv * head_dim;
        a.k_row_stride = a.v_row_stride = a.dk_row_stride = a.dv_row_stride = heads_kv * head_dim;
        a.k_head_stride = a.v_head_stride = a.dk_head_stride = a.dv_head_stride = head_dim;
        a.workspace = work;
        a.workspace_bytes = ws;
        if (reps <= 0) {
            st = hopper_bwd(&a);
            if (st == FA_OK && cudaDeviceSynchronize() != cudaSuccess) st = FA_ERR_CUDA;
            goto done;
        }
        for (int i = 0; i < warmup; ++i)
            if ((st = hopper_bwd(&a)) != FA_OK) goto done;
        if (cudaEventCreate(&e0) || cudaEventCreate(&e1)) {
            st = FA_ERR_CUDA;
            goto done;
        }
        for (int r = 0; r < reps; ++r) {
            cudaMemsetAsync(flush, r & 0xFF, 256 << 20);
            cudaEventRecord(e0);
            if ((st = hopper_bwd(&a)) != FA_OK) goto done;
            cudaEventRecord(e1);
            if (cudaEventSynchronize(e1) != cudaSuccess) {
                st = FA_ERR_CUDA;
                goto done;
            }
            cudaEventElapsedTime(&times[r], e0, e1);
        }
        qsort(times, (size_t)reps, sizeof(float), cmp_float);
        *ms_median = times[reps / 2];
        st = FA_OK;
    }
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    cudaFree(dout);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(lse);
    cudaFree(work);
    cudaFree(flush);
    free(times);
    return st;
}
