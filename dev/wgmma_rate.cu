/*
 * dev/wgmma_rate.cu: how fast the Hopper backward's wgmma shapes run on their own, one CTA per SM,
 * two consumer warpgroups (the backward's CTA), operands random bf16 in shared memory.
 * Question: is the backward at bucket 128 bounded by its GEMM mix (SS m64n64 for Sᵀ, dPᵀ and dQ,
 * which read 4 KB of shared memory per 64K MACs) before any softmax work, and would another
 * shape mix (n80 query tiles, dQ by one warpgroup at n128) raise that bound?
 * Build: nvcc -O3 -std=c++17 -Iinclude -Isrc -gencode arch=compute_90a,code=sm_90a dev/wgmma_rate.cu -o wgmma_rate
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/common/ptx.cuh"

enum {
    SS64,       /* 8 × SS m64n64k16, K-major A and B (Sᵀ, dPᵀ)                   */
    SS64T,      /* 8 × SS m64n64k16, MN-major B (dQ)                              */
    SS80,       /* 8 × SS m64n80k16                                               */
    SS128,      /* 8 × SS m64n128k16                                              */
    RS128T,     /* 8 × RS m64n128k16, MN-major B (dV, dK)                          */
    BWD64,      /* the bucket 128 backward's GEMMs and waits, no softmax           */
    BWD64_FREE, /* the same GEMMs without the dS barrier                           */
    BWD_DQ1,    /* BWD64 with dQ [64, 128] by consumer 0 alone (SS n128, MN-major) */
    BWD80,      /* 80-query tiles: n80 Sᵀ / dPᵀ / dQ, K = 80 for dV / dK           */
    MIXES
};
static const char *const mix_name[MIXES] = {"ss n64", "ss n64 transb", "ss n80", "ss n128", "rs n128 transb",
                                            "bwd 64 rows", "bwd 64, no barrier", "bwd 64, dQ one wg", "bwd 80 rows"};

constexpr uint32_t SMEM = 200 * 1024;
constexpr uint32_t KV_SLAB = 128 * 128; /* 128 keys × 64 columns × 2 B */

__device__ __forceinline__ uint64_t desc(uint32_t a, uint32_t lbo) { return wgmma_desc_sw128(a, lbo, 1024); }

/* Sᵀ-like: acc[64 keys, M queries] over d = 128 */
template <int M>
__device__ __forceinline__ void abt(float (&acc)[M / 2], uint32_t a, uint32_t b) {
    const uint64_t ad = desc(a, 16), bd = desc(b, 16);
    for (int i = 0; i < M / 2; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
        wgmma_ss_f32<M, true>(acc, ad + (((kk / 4) * KV_SLAB + (kk % 4) * 32) >> 4),
                              bd + (((kk / 4) * M * 128 + (kk % 4) * 32) >> 4), kk > 0);
    wgmma_commit_group();
    for (int i = 0; i < M / 2; ++i) wgmma_fence_operand(acc[i]);
}
/* dV-like: acc[64 keys, 128] += frag (K = M queries) × B [M, 128] MN-major */
template <int M>
__device__ __forceinline__ void atb(float (&acc)[64], uint32_t (&frag)[M / 16][4], uint32_t b) {
    const uint64_t bd = desc(b, M * 128);
    for (int i = 0; i < 64; ++i) wgmma_fence_operand(acc[i]);
    for (int kk = 0; kk < M / 16; ++kk)
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(frag[kk][x]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < M / 16; ++kk) wgmma_rs_f32_transb<128, true>(acc, frag[kk], bd + ((kk * 2048) >> 4), 1);
    wgmma_commit_group();
    for (int i = 0; i < 64; ++i) wgmma_fence_operand(acc[i]);
}
/* dQ-like: acc[64 queries, N] = dS rows (K-major over 128 keys) × K [128 keys, N] MN-major */
template <int N, int M>
__device__ __forceinline__ void dq(float (&acc)[N / 2], uint32_t ds, uint32_t k) {
    const uint64_t ad = desc(ds, 16), bd = desc(k, KV_SLAB);
    for (int i = 0; i < N / 2; ++i) wgmma_fence_operand(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
        wgmma_ss_f32_transb<N, true>(acc, ad + (((kk / 4) * M * 128 + (kk % 4) * 32) >> 4), bd + ((kk * 2048) >> 4),
                                     kk > 0);
    wgmma_commit_group();
    for (int i = 0; i < N / 2; ++i) wgmma_fence_operand(acc[i]);
}
/* dQ at 80 rows, approximated by K-major operands (FA4 computes dQᵀ with a transposed A) */
__device__ __forceinline__ void dq80(float (&acc)[40], uint32_t ds, uint32_t k) { abt<80>(acc, k, ds); }

template <int M>
__device__ __forceinline__ void pack(const float (&acc)[M / 2], uint32_t (&frag)[M / 16][4]) {
    for (int kk = 0; kk < M / 16; ++kk)
        for (int x = 0; x < 4; ++x) frag[kk][x] = cvt_rn_bf16x2_f32(acc[8 * kk + 2 * x], acc[8 * kk + 2 * x + 1]);
}


/* One shape alone: OP 0 = SS K-major, 1 = SS MN-major B, 2 = RS MN-major B; N columns; WGS consumer
 * warpgroups issuing (the others idle); DISTINCT: each consumer reads its own A and B. */
template <int OP, int N, int WGS, bool DISTINCT>
__global__ void __launch_bounds__(384, 1) shape_kernel(int iters, float *sink, unsigned long long *clocks) {
    extern __shared__ __align__(1024) uint8_t raw[];
    const uint32_t smem = (smem_u32addr(raw) + 1023u) & ~1023u;
    uint16_t *fill = reinterpret_cast<uint16_t *>(raw + (smem - smem_u32addr(raw)));
    for (uint32_t i = threadIdx.x; i < (SMEM - 1024) / 2; i += blockDim.x) {
        uint32_t u = i * 2654435761u ^ (blockIdx.x * 40503u);
        u ^= u >> 15;
        u *= 2246822519u;
        u ^= u >> 13;
        fill[i] = (uint16_t)((u & 0x8000u) | (0x3D80u + (u & 0xFFu)));
    }
    fence_proxy_async_shared_cta();
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0 || wg > WGS) {
        setmaxnreg_dec<24>();
        return;
    }
    setmaxnreg_inc<240>();
    const int c = DISTINCT ? __shfl_sync(0xffffffffu, wg - 1, 0) : 0;
    const uint32_t a = smem + c * 32768, b = smem + 65536 + c * 32768; /* A [64 × 128] 16 KB, B [N × 128] or [128 × N] */
    float a0[N / 2], a1[N / 2];
    uint32_t frag[8][4];
    for (int i = 0; i < N / 2; ++i) a0[i] = a1[i] = 0.0f;
    for (int i = 0; i < 32; ++i) frag[i / 4][i % 4] = 0x3D803D80u + threadIdx.x;
    auto one = [&](float(&acc)[N / 2]) {
        for (int i = 0; i < N / 2; ++i) wgmma_fence_operand(acc[i]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            if constexpr (OP == 0)
                wgmma_ss_f32<N, true>(acc, desc(a, 16) + (((kk / 4) * 8192 + (kk % 4) * 32) >> 4),
                                      desc(b, 16) + (((kk / 4) * N * 128 + (kk % 4) * 32) >> 4), kk > 0);
            else if constexpr (OP == 1)
                wgmma_ss_f32_transb<N, true>(acc, desc(a, 16) + (((kk / 4) * 8192 + (kk % 4) * 32) >> 4),
                                             desc(b, 128 * 128) + ((kk * 2048) >> 4), kk > 0);
            else
                wgmma_rs_f32_transb<N, true>(acc, frag[kk], desc(b, 128 * 128) + ((kk * 2048) >> 4), kk > 0);
        }
        wgmma_commit_group();
        for (int i = 0; i < N / 2; ++i) wgmma_fence_operand(acc[i]);
        wgmma_wait_group<1>();
    };
    unsigned long long t0 = clock64();
    for (int it = 0; it < iters; it += 2) {
        one(a0);
        one(a1);
    }
    wgmma_wait_group<0>();
    unsigned long long t1 = clock64();
    float keep = 0.0f;
    for (int i = 0; i < N / 2; ++i) keep += a0[i] + a1[i];
    if (keep == 1234.5f) sink[threadIdx.x] = keep;
    if (threadIdx.x == 128) clocks[blockIdx.x] = t1 - t0;
}

template <int OP, int N, int WGS, bool DISTINCT>
static void shape(int sms, int iters, float *sink, unsigned long long *clocks_d) {
    auto kern = shape_kernel<OP, N, WGS, DISTINCT>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    kern<<<sms, 384, SMEM>>>(iters / 10, sink, clocks_d);
    float best = 1e30f;
    for (int r = 0; r < 3; ++r) {
        cudaEventRecord(e0);
        kern<<<sms, 384, SMEM>>>(iters, sink, clocks_d);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best) best = ms;
    }
    cudaError_t err = cudaGetLastError();
    unsigned long long clk = 0;
    cudaMemcpy(&clk, clocks_d, sizeof clk, cudaMemcpyDeviceToHost);
    const double hgmma = 8.0 * iters * WGS; /* per SM */
    const double mac = hgmma * 64.0 * N * 16;
    printf("%-9s n%-3d wgs %d %-8s %7.1f TFLOP/s  %6.1f clk per wgmma (SM)  %5.0f MAC/clk/SM  %5.2f ms %s\n",
           OP == 0 ? "ss" : OP == 1 ? "ss transb" : "rs transb", N, WGS, DISTINCT ? "distinct" : "shared",
           2 * mac * sms / (best * 1e-3) / 1e12, (double)clk / hgmma, mac / (double)clk, best,
           err == cudaSuccess ? "" : cudaGetErrorString(err));
}

template <int MIX>
__global__ void __launch_bounds__(384, 1) rate_kernel(int iters, float *sink, unsigned long long *clocks) {
    extern __shared__ __align__(1024) uint8_t raw[];
    const uint32_t smem = (smem_u32addr(raw) + 1023u) & ~1023u;
    uint16_t *fill = reinterpret_cast<uint16_t *>(raw + (smem - smem_u32addr(raw)));
    for (uint32_t i = threadIdx.x; i < (SMEM - 1024) / 2; i += blockDim.x) {
        uint32_t u = i * 2654435761u ^ (blockIdx.x * 40503u);
        u ^= u >> 15;
        u *= 2246822519u;
        u ^= u >> 13;
        fill[i] = (uint16_t)((u & 0x8000u) | (0x3D80u + (u & 0xFFu))); /* ±[0.0625, 0.125) */
    }
    fence_proxy_async_shared_cta();
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        setmaxnreg_dec<24>();
        return;
    }
    setmaxnreg_inc<240>();
    const int c = __shfl_sync(0xffffffffu, wg - 1, 0);
    /* K 32 KB | V 32 KB | Q 20 KB | dO 20 KB | dS 20 KB */
    const uint32_t k = smem, v = smem + 2 * KV_SLAB, q = smem + 4 * KV_SLAB, dO = q + 20480, dS = dO + 20480;
    const uint32_t k_c = k + c * 64 * 128, v_c = v + c * 64 * 128;
    unsigned long long t0 = clock64();
    float keep = 0.0f;
    if constexpr (MIX <= RS128T) {
        constexpr int N = MIX == SS80 ? 80 : MIX == SS128 || MIX == RS128T ? 128 : 64;
        float a0[N / 2], a1[N / 2];
        uint32_t frag[4][4];
        for (int i = 0; i < N / 2; ++i) a0[i] = a1[i] = 0.0f;
        for (int i = 0; i < 16; ++i) frag[i / 4][i % 4] = 0x3D803D80u + threadIdx.x;
        auto one = [&](float(&acc)[N / 2]) {
            if constexpr (MIX == SS64T) dq<64, 64>(reinterpret_cast<float(&)[32]>(acc), dS, k);
            else if constexpr (MIX == RS128T) {
                atb<64>(reinterpret_cast<float(&)[64]>(acc), frag, q); /* 4 k16 steps */
                atb<64>(reinterpret_cast<float(&)[64]>(acc), frag, dO);
            } else abt<N>(acc, k_c, q);
            wgmma_wait_group<1>();
        };
        for (int it = 0; it < iters; it += 2) {
            one(a0);
            one(a1);
        }
        wgmma_wait_group<0>();
        for (int i = 0; i < N / 2; ++i) keep += a0[i] + a1[i];
    } else {
        constexpr int M = MIX == BWD80 ? 80 : 64;
        float dk[64], dv[64];
        for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.0f;
        for (int it = 0; it < iters; ++it) {
            float s[M / 2], dp[M / 2];
            uint32_t p[M / 16][4], ds[M / 16][4];
            abt<M>(s, k_c, q);
            abt<M>(dp, v_c, dO);
            wgmma_wait_group<1>();
            for (int i = 0; i < M / 2; ++i) s[i] *= 0.01f;
            pack<M>(s, p);
            atb<M>(dv, p, dO);
            wgmma_wait_group<1>();
            for (int i = 0; i < M / 2; ++i) dp[i] *= 0.01f;
            pack<M>(dp, ds);
            if constexpr (MIX != BWD64_FREE) bar_sync(1, 256);
            if constexpr (MIX == BWD_DQ1) {
                if (c == 0) {
                    float acc[64];
                    dq<128, 64>(acc, dS, k);
                    atb<M>(dk, ds, q);
                    wgmma_wait_group<1>();
                    keep += acc[0];
                } else {
                    atb<M>(dk, ds, q);
                }
            } else if constexpr (MIX == BWD80) {
                float acc[40];
                dq80(acc, dS, k + c * KV_SLAB);
                atb<M>(dk, ds, q);
                wgmma_wait_group<1>();
                keep += acc[0];
            } else {
                float acc[32];
                dq<64, 64>(acc, dS, k + c * KV_SLAB);
                atb<M>(dk, ds, q);
                wgmma_wait_group<1>();
                keep += acc[0];
            }
            wgmma_wait_group<0>();
            for (int kk = 0; kk < M / 16; ++kk)
                for (int x = 0; x < 4; ++x) {
                    wgmma_fence_operand(p[kk][x]);
                    wgmma_fence_operand(ds[kk][x]);
                }
        }
        for (int i = 0; i < 64; ++i) keep += dk[i] + dv[i];
    }
    unsigned long long t1 = clock64();
    if (keep == 1234.5f) sink[threadIdx.x] = keep;
    if (threadIdx.x == 128) clocks[blockIdx.x] = t1 - t0;
}

/* MACs per consumer warpgroup and iteration */
static double macs(int mix) {
    const double u = 64.0 * 64 * 128;
    switch (mix) {
    case SS64: case SS64T: return 8 * 64.0 * 64 * 16;
    case SS80: return 8 * 64.0 * 80 * 16;
    case SS128: case RS128T: return 8 * 64.0 * 128 * 16;
    case BWD64: case BWD64_FREE: case BWD_DQ1: return 5 * u;
    case BWD80: return 5 * u * 80 / 64;
    }
    return 0;
}

template <int MIX>
static void run(int sms, int iters, float *sink, unsigned long long *clocks_d) {
    cudaFuncSetAttribute(rate_kernel<MIX>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    rate_kernel<MIX><<<sms, 384, SMEM>>>(iters / 10, sink, clocks_d); /* warm-up */
    float best = 1e30f;
    for (int r = 0; r < 3; ++r) {
        cudaEventRecord(e0);
        rate_kernel<MIX><<<sms, 384, SMEM>>>(iters, sink, clocks_d);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best) best = ms;
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        printf("%s: %s\n", mix_name[MIX], cudaGetErrorString(err));
        return;
    }
    unsigned long long clk = 0;
    cudaMemcpy(&clk, clocks_d, sizeof clk, cudaMemcpyDeviceToHost);
    const double total = macs(MIX) * 2 * iters; /* both consumers, one CTA */
    printf("%-20s %8.1f TFLOP/s  %7.0f MAC/clk/SM  %6.1f clk per iteration  %5.2f GHz\n", mix_name[MIX],
           2 * total * sms / (best * 1e-3) / 1e12, total / (double)clk, (double)clk / iters,
           (double)clk / (best * 1e-3) / 1e9);
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float *sink;
    unsigned long long *clocks;
    cudaMalloc(&sink, 4096);
    cudaMalloc(&clocks, sms * sizeof(unsigned long long));
    const int iters = 20000;
    printf("%d SMs, one CTA each, 2 consumer warpgroups; peak 2048 MAC/clk/SM (dense bf16)\n", sms);
    shape<0, 64, 1, true>(sms, iters, sink, clocks);
    shape<0, 64, 2, false>(sms, iters, sink, clocks);
    shape<0, 64, 2, true>(sms, iters, sink, clocks);
    shape<0, 128, 1, true>(sms, iters, sink, clocks);
    shape<0, 128, 2, true>(sms, iters, sink, clocks);
    shape<1, 64, 1, true>(sms, iters, sink, clocks);
    shape<1, 64, 2, false>(sms, iters, sink, clocks);
    shape<1, 64, 2, true>(sms, iters, sink, clocks);
    shape<2, 64, 1, true>(sms, iters, sink, clocks);
    shape<2, 64, 2, true>(sms, iters, sink, clocks);
    shape<2, 128, 1, true>(sms, iters, sink, clocks);
    shape<2, 128, 2, false>(sms, iters, sink, clocks);
    shape<2, 128, 2, true>(sms, iters, sink, clocks);
    shape<1, 128, 2, true>(sms, iters, sink, clocks);
    run<SS64>(sms, iters, sink, clocks);
    run<SS64T>(sms, iters, sink, clocks);
    run<SS80>(sms, iters, sink, clocks);
    run<SS128>(sms, iters, sink, clocks);
    run<RS128T>(sms, iters, sink, clocks);
    run<BWD64>(sms, iters / 4, sink, clocks);
    run<BWD64_FREE>(sms, iters / 4, sink, clocks);
    run<BWD_DQ1>(sms, iters / 4, sink, clocks);
    run<BWD80>(sms, iters / 4, sink, clocks);
    return 0;
}
