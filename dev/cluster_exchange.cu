/*
 * dev/cluster_exchange.cu: what one exchange of the bucket-512 backward's CTA pairs costs on its
 * own (kernels/bwd_sm90_hdim256.cu, CTAS = 2): two CTAs per cluster, 384 threads each (an idle
 * producer warpgroup and two consumer warpgroups), every consumer thread sending 16 fp32 to the
 * same thread of the peer, waiting for the peer's, adding them and freeing the peer's buffer, as
 * the kernel does twice per iteration; 66 clusters (every SM of an H100 / H200 busy).
 * Question: the d = 512 backward spends ~3,600 clocks per iteration more than the d = 256 kernel
 * for the same GEMM work (docs/tuning-log.md, "Hopper backward at d = 512"). How much of that is
 * the exchange itself (latency of st.async + complete_tx + wake-up, bandwidth of 32 KiB per CTA
 * and iteration), with the waits suspended or spinning, and with plain remote stores instead?
 * Each variant runs R exchanges with W clocks of busy work between them (the softmax / GEMM time
 * that could hide the exchange); printed: clocks per exchange beyond W, averaged over the CTAs.
 * Build: nvcc -O3 -std=c++17 -Iinclude -Isrc -gencode arch=compute_90a,code=sm_90a dev/cluster_exchange.cu -o cluster_exchange
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/common/ptx.cuh"

enum {
    ASYNC_SUSPEND, /* the kernel's protocol: st.async; waits acquire.cluster with the suspend-time
                      hint (SASS: CCTL.IVALL after each), free by arrive.release.cluster (SASS:
                      MEMBAR.ALL.CTA + MEMBAR.ALL.GPU before each)                               */
    ASYNC_SPIN,    /* the same, waits without the hint (acquire.cta)                             */
    ASYNC_CTA,     /* CUTLASS's cluster-barrier form: waits and the remote arrive with the default
                      (.cta) semantics, no CCTL / MEMBAR.GPU; suspended waits                    */
    ASYNC_CTA_SPIN,/* the same, spinning waits                                                   */
    REMOTE_ST,     /* st.shared::cluster.v4 + every thread's release arrive on the peer's barrier */
    VARIANTS
};
static const char *const variant_name[VARIANTS] = {"st.async, the kernel's form", "st.async, spinning waits",
                                                   "st.async, .cta semantics", "st.async, .cta, spinning",
                                                   "remote st + 128 arrivals"};

constexpr int THREADS = 384, VALUES = 16;
constexpr uint32_t MSG_BYTES = 128 * VALUES * 4; /* per consumer */

__device__ __forceinline__ void st_cluster_v4(uint32_t remote, const float *x) {
    asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(remote), "r"(__float_as_uint(x[0])),
                 "r"(__float_as_uint(x[1])), "r"(__float_as_uint(x[2])), "r"(__float_as_uint(x[3]))
                 : "memory");
}

/* the earlier forms: the remote arrive with release at cluster scope, the wait with acquire at
 * cluster scope (suspend-time hint as mbarrier_wait_parity) */
__device__ __forceinline__ void arrive_remote_release_cluster(uint32_t remote_bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
__device__ __forceinline__ void wait_acquire_cluster(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2, %3;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity), "n"(10000000)
                     : "memory");
}

template <int V>
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
    if constexpr (V == ASYNC_SPIN || V == ASYNC_CTA_SPIN)
        while (!mbarrier_try_wait_parity<false>(bar, parity)) {
        }
    else if constexpr (V == ASYNC_CTA)
        mbarrier_wait_parity(bar, parity);
    else
        wait_acquire_cluster(bar, parity);
}

template <int V>
__device__ __forceinline__ void arrive_free(uint32_t remote_bar) {
    if constexpr (V == ASYNC_CTA || V == ASYNC_CTA_SPIN) mbarrier_arrive_remote(remote_bar);
    else arrive_remote_release_cluster(remote_bar);
}

__device__ __forceinline__ void busy(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

template <int V>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(THREADS, 1)
    exchange_kernel(int rounds, long long work, long long *cycles_out, float *sink) {
    __shared__ __align__(16) float buf[2][128 * VALUES];
    __shared__ __align__(8) uint64_t bars[4]; /* full[2], free[2] */
    const uint32_t rank = cluster_ctarank(), peer = rank ^ 1u;
    const uint32_t full0 = smem_u32addr(&bars[0]), free0 = smem_u32addr(&bars[2]);
    const uint32_t free_count = V == REMOTE_ST ? 128 : 4, full_count = V == REMOTE_ST ? 128 : 1;
    if (threadIdx.x == 0) {
        for (int c = 0; c < 2; ++c) {
            mbarrier_init(full0 + 8 * c, full_count);
            mbarrier_init(free0 + 8 * c, free_count);
        }
        fence_mbarrier_init_release_cluster();
        if (V != REMOTE_ST)
            for (int c = 0; c < 2; ++c) mbarrier_arrive_expect_tx(full0 + 8 * c, MSG_BYTES);
    }
    cluster_sync();
    const int wg = threadIdx.x / 128;
    if (wg == 0) return; /* the producer warpgroup idles, as it mostly does */
    const int c = wg - 1, tid = threadIdx.x % 128, lane = tid % 32;
    const uint32_t my_buf = smem_u32addr(&buf[c][0]), full = full0 + 8 * c, free_bar = free0 + 8 * c;
    const uint32_t peer_buf = mapa_shared_cluster(my_buf, peer), peer_full = mapa_shared_cluster(full, peer),
                   peer_free = mapa_shared_cluster(free_bar, peer);
    float x[VALUES];
    for (int i = 0; i < VALUES; ++i) x[i] = (float)(tid + i) * 1e-3f;
    __syncwarp();
    const long long t0 = clock64();
    for (int m = 0; m < rounds; ++m) {
        busy(work);
        if (m > 0) wait<V>(free_bar, (uint32_t)(m - 1) & 1u);
        if constexpr (V == REMOTE_ST) {
            for (int k = 0; k < VALUES / 4; ++k) st_cluster_v4(peer_buf + (uint32_t)(128 * k + tid) * 16, &x[4 * k]);
            arrive_remote_release_cluster(peer_full);
        } else {
            for (int k = 0; k < VALUES / 4; ++k)
                st_async_v4_b32(peer_buf + (uint32_t)(128 * k + tid) * 16, x[4 * k], x[4 * k + 1], x[4 * k + 2],
                                x[4 * k + 3], peer_full);
        }
        wait<V>(full, (uint32_t)m & 1u);
        if (V != REMOTE_ST && tid == 0) mbarrier_arrive_expect_tx(full, MSG_BYTES);
        for (int k = 0; k < VALUES / 4; ++k) {
            float r[4];
            ld_shared_v4_f32(r, my_buf + (uint32_t)(128 * k + tid) * 16);
            for (int i = 0; i < 4; ++i) x[4 * k + i] = 0.5f * (x[4 * k + i] + r[i]);
        }
        if (m + 1 < rounds) {
            if constexpr (V == REMOTE_ST) {
                arrive_remote_release_cluster(peer_free);
            } else {
                __syncwarp();
                if (lane == 0) arrive_free<V>(peer_free);
            }
        }
    }
    const long long t1 = clock64();
    if (tid == 0) cycles_out[blockIdx.x * 2 + c] = t1 - t0;
    float s = 0.0f;
    for (int i = 0; i < VALUES; ++i) s += x[i];
    if (s == 12345.0f) sink[0] = s; /* keeps the adds */
}

template <int V>
static double run(int clusters, int rounds, long long work, long long *cycles_d, float *sink) {
    /* 200 KiB of (unused) dynamic shared memory: one CTA per SM, as the backward */
    const int pad = 200 * 1024;
    cudaFuncSetAttribute(exchange_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, pad);
    exchange_kernel<V><<<2 * clusters, THREADS, pad>>>(rounds, work, cycles_d, sink);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return -1.0;
    }
    long long cycles[2 * 2 * 132];
    cudaMemcpy(cycles, cycles_d, sizeof(long long) * 4 * clusters, cudaMemcpyDeviceToHost);
    double sum = 0.0;
    for (int i = 0; i < 4 * clusters; ++i) sum += (double)cycles[i];
    return sum / (4 * clusters) / rounds - (double)work;
}

int main(void) {
    const int clusters = 66, rounds = 2000;
    long long *cycles_d;
    float *sink;
    cudaMalloc(&cycles_d, sizeof(long long) * 4 * 132);
    cudaMalloc(&sink, sizeof(float));
    static const long long works[] = {0, 500, 2000};
    printf("clocks per exchange beyond the work between them (%d clusters of 2 CTAs, %d rounds, 8 KiB per consumer)\n",
           clusters, rounds);
    printf("%-28s | work 0 | work 500 | work 2000\n", "variant");
    for (int v = 0; v < VARIANTS; ++v) {
        printf("%-28s", variant_name[v]);
        for (long long w : works) {
            double c = v == ASYNC_SUSPEND    ? run<ASYNC_SUSPEND>(clusters, rounds, w, cycles_d, sink)
                       : v == ASYNC_SPIN     ? run<ASYNC_SPIN>(clusters, rounds, w, cycles_d, sink)
                       : v == ASYNC_CTA      ? run<ASYNC_CTA>(clusters, rounds, w, cycles_d, sink)
                       : v == ASYNC_CTA_SPIN ? run<ASYNC_CTA_SPIN>(clusters, rounds, w, cycles_d, sink)
                                             : run<REMOTE_ST>(clusters, rounds, w, cycles_d, sink);
            printf(" | %8.0f", c);
        }
        printf("\n");
    }
    cudaFree(cycles_d);
    cudaFree(sink);
    return 0;
}
