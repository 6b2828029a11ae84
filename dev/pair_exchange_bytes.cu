/*
 * dev/pair_exchange_bytes.cu: is a CTA pair's partial-score exchange bound by its latency or by
 * the SM-to-SM network's bytes? (kernels/fwd_sm90.cu, bucket 512: 16 KiB per consumer and 64-key
 * tile, two consumers.) Two CTAs per cluster, 384 threads (an idle producer warpgroup and one or
 * two consumer warpgroups exchanging), 66 clusters (every SM busy); each consumer thread sends B
 * bytes to the same thread of the peer and adds the peer's, as fa_pair_exchange does (.cta
 * semantics, suspended waits), with W clocks of work between exchanges. Variants: st.async from
 * registers (the kernels' form) and cp.async.bulk (one 16·B·128-byte copy by the TMA unit from a
 * local staging buffer, after the warpgroup's st.shared, proxy fence and named barrier).
 * Printed: clocks per exchange beyond W, and bytes per clock per SM (one direction, all senders).
 * Build: nvcc -O3 -std=c++17 -Iinclude -Isrc -gencode arch=compute_90a,code=sm_90a dev/pair_exchange_bytes.cu -o pair_exchange_bytes
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/common/ptx.cuh"

constexpr int THREADS = 384;

/* the TMA unit's shared::cta -> shared::cluster copy, completing bytes on the peer's mbarrier */
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t dst_remote, uint32_t src, uint32_t bytes,
                                                  uint32_t bar_remote) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     dst_remote),
                 "r"(src), "r"(bytes), "r"(bar_remote)
                 : "memory");
}

__device__ __forceinline__ void busy(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

template <int VALUES, bool BULK>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(THREADS, 1)
    exchange_kernel(int consumers, int rounds, long long work, long long *cycles_out, float *sink) {
    constexpr uint32_t MSG_BYTES = 128 * VALUES * 4; /* per consumer */
    extern __shared__ __align__(128) uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[4]; /* full[2], free[2] */
    const uint32_t base = smem_u32addr(smem_raw);
    const uint32_t rank = cluster_ctarank(), peer = rank ^ 1u;
    const uint32_t full0 = smem_u32addr(&bars[0]), free0 = smem_u32addr(&bars[2]);
    if (threadIdx.x == 0) {
        for (int c = 0; c < 2; ++c) {
            mbarrier_init(full0 + 8 * c, 1);
            mbarrier_init(free0 + 8 * c, 4);
        }
        fence_mbarrier_init_release_cluster();
        for (int c = 0; c < 2; ++c) mbarrier_arrive_expect_tx(full0 + 8 * c, MSG_BYTES);
    }
    cluster_sync();
    const int wg = threadIdx.x / 128;
    if (wg == 0 || wg > consumers) return;
    const int c = wg - 1, tid = threadIdx.x % 128, lane = tid % 32;
    /* receive buffer c, then staging buffer c */
    const uint32_t my_buf = base + (uint32_t)c * MSG_BYTES, stage = base + (uint32_t)(2 + c) * MSG_BYTES;
    const uint32_t full = full0 + 8 * c, free_bar = free0 + 8 * c;
    const uint32_t peer_buf = mapa_shared_cluster(my_buf, peer), peer_full = mapa_shared_cluster(full, peer),
                   peer_free = mapa_shared_cluster(free_bar, peer);
    float x[VALUES];
    for (int i = 0; i < VALUES; ++i) x[i] = (float)(tid + i) * 1e-3f;
    __syncwarp();
    const long long t0 = clock64();
    for (int m = 0; m < rounds; ++m) {
        busy(work);
        if (m > 0) mbarrier_wait_parity(free_bar, (uint32_t)(m - 1) & 1u);
        if constexpr (BULK) {
            for (int k = 0; k < VALUES / 4; ++k) {
                const uint32_t bits[4] = {__float_as_uint(x[4 * k]), __float_as_uint(x[4 * k + 1]),
                                          __float_as_uint(x[4 * k + 2]), __float_as_uint(x[4 * k + 3])};
                st_shared_v4_b32(stage + (uint32_t)(128 * k + tid) * 16, bits);
            }
            fence_proxy_async_shared_cta(); /* the st.shared before the TMA unit's reads */
            bar_sync(1 + c, 128);
            if (tid == 0) bulk_copy_to_peer(peer_buf, stage, MSG_BYTES, peer_full);
        } else {
            for (int k = 0; k < VALUES / 4; ++k)
                st_async_v4_b32(peer_buf + (uint32_t)(128 * k + tid) * 16, x[4 * k], x[4 * k + 1], x[4 * k + 2],
                                x[4 * k + 3], peer_full);
        }
        mbarrier_wait_parity(full, (uint32_t)m & 1u);
        if (tid == 0) mbarrier_arrive_expect_tx(full, MSG_BYTES);
        for (int k = 0; k < VALUES / 4; ++k) {
            float r[4];
            ld_shared_v4_f32(r, my_buf + (uint32_t)(128 * k + tid) * 16);
            for (int i = 0; i < 4; ++i) x[4 * k + i] = 0.5f * (x[4 * k + i] + r[i]);
        }
        if (m + 1 < rounds) {
            __syncwarp();
            if (lane == 0) mbarrier_arrive_remote(peer_free);
        }
    }
    const long long t1 = clock64();
    if (tid == 0) cycles_out[blockIdx.x * 2 + c] = t1 - t0;
    float s = 0.0f;
    for (int i = 0; i < VALUES; ++i) s += x[i];
    if (s == 12345.0f) sink[0] = s; /* keeps the adds */
}

template <int VALUES, bool BULK>
static double run(int clusters, int consumers, int rounds, long long work, long long *cycles_d, float *sink) {
    const int smem = 4 * 128 * VALUES * 4;
    /* with padding to ~200 KiB: one CTA per SM, as the kernels */
    const int pad = 200 * 1024 > smem ? 200 * 1024 : smem;
    cudaFuncSetAttribute(exchange_kernel<VALUES, BULK>, cudaFuncAttributeMaxDynamicSharedMemorySize, pad);
    exchange_kernel<VALUES, BULK><<<2 * clusters, THREADS, pad>>>(consumers, rounds, work, cycles_d, sink);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return -1.0;
    }
    long long cycles[2 * 2 * 132];
    cudaMemcpy(cycles, cycles_d, sizeof(long long) * 4 * clusters, cudaMemcpyDeviceToHost);
    double sum = 0.0;
    int n = 0;
    for (int b = 0; b < 2 * clusters; ++b)
        for (int c = 0; c < consumers; ++c) {
            sum += (double)cycles[2 * b + c];
            ++n;
        }
    return sum / n / rounds - (double)work;
}

template <int VALUES>
static void row(int clusters, long long *cycles_d, float *sink) {
    const int rounds = 1000;
    for (int bulk = 0; bulk < 2; ++bulk)
        for (int consumers = 1; consumers <= 2; ++consumers) {
            printf("%-9s | %5d B | %d consumer%s", bulk ? "bulk" : "st.async", VALUES * 4, consumers,
                   consumers > 1 ? "s" : " ");
            for (long long w : {0LL, 2000LL}) {
                const double c = bulk ? run<VALUES, true>(clusters, consumers, rounds, w, cycles_d, sink)
                                      : run<VALUES, false>(clusters, consumers, rounds, w, cycles_d, sink);
                printf(" | %7.0f %6.1f", c, (double)consumers * 128 * VALUES * 4 / c);
            }
            printf("\n");
        }
}

int main(void) {
    const int clusters = 66;
    long long *cycles_d;
    float *sink;
    cudaMalloc(&cycles_d, sizeof(long long) * 4 * 132);
    cudaMalloc(&sink, sizeof(float));
    printf("clocks per exchange beyond the work, and bytes per clock per SM (%d clusters of 2 CTAs)\n", clusters);
    printf("variant   | per thr | senders    | work 0: clk  B/clk | work 2000: clk  B/clk\n");
    row<4>(clusters, cycles_d, sink);
    row<8>(clusters, cycles_d, sink);
    row<16>(clusters, cycles_d, sink);
    row<32>(clusters, cycles_d, sink);
    cudaFree(cycles_d);
    cudaFree(sink);
    return 0;
}
