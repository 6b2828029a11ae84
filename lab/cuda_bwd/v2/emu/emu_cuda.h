/*
 * emu_cuda.h: a CPU stand-in for the CUDA device environment of the backward main kernels, so
 * that the exact kernel source (src/cuda/bwd_kernel.cuh, lab/cuda_bwd/v2/bwd_kernel_v2.cuh) runs
 * on the host (lab/cuda_bwd/v2/emu/emu_bwd.cc). Included before them; it takes the place of
 * cuda_runtime.h, fa_cuda_common.cuh and fa_ptx.cuh (their include guards are defined here).
 *
 * Model: one fiber per CUDA thread, the 256 of a block run cooperatively (blocks one after the
 * other). Warp-collective instructions (ldmatrix, mma) complete when all 32 lanes of the warp
 * have arrived with the same instruction (a lane arriving at a different one is reported as
 * divergence); __syncthreads completes when every thread of the block has arrived. cp.async
 * lands at the issuing thread's wait_group / wait_all (its destination holds NaN bytes before),
 * so a read that is not ordered after the wait and a barrier sees garbage. Shared memory is
 * bounds-checked against the kernel's dynamic size and race-checked per byte between barriers
 * (cross-thread write/read, read/write, write/write in one barrier interval) for every access
 * made through the PTX wrappers (ldmatrix, st.shared, cp.async). Global accesses through
 * cp.async and atomics are checked against the registered buffers.
 */
#ifndef FA_EMU_CUDA_H
#define FA_EMU_CUDA_H

#define FA_BWD_EMULATOR 1
#define FA_CUDA_COMMON_CUH 1 /* replaced by this header */
#define FA_PTX_CUH 1
#define __CUDA_RUNTIME_H__ 1

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_internal.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

typedef struct CUstream_st *cudaStream_t;
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct emu_dim3 {
    unsigned x, y, z;
};

template <class T>
static inline T min(T a, T b) { return a < b ? a : b; }
template <class T>
static inline T max(T a, T b) { return a > b ? a : b; }

namespace emu {
struct Fiber;
extern Fiber *cur;
extern emu_dim3 block_idx, block_dim;
extern uint8_t *smem;                /* this block's shared memory                         */
extern uint32_t smem_size;           /* the kernel's dynamic size (bounds for every access)  */
constexpr uint32_t SMEM_BASE = 0x400; /* u32 "shared window" address of smem[0]              */
emu_dim3 &tid();
void syncthreads();
[[noreturn]] void fail(const char *fmt, ...);
/* warp collectives */
void ldmatrix(int kind, uint32_t *r, uint32_t addr);
void mma(int bf16, float *d, const uint32_t *a, const uint32_t *b);
float shfl_xor(uint32_t mask, float v, int lane_mask); /* full-warp collective */
/* shared memory through the PTX wrappers (race-checked) */
void smem_store(uint32_t addr, const void *v, int n);
void smem_load(uint32_t addr, void *v, int n);
/* cp.async */
void cp_async(uint32_t dst, const void *src, int size, int src_bytes);
void cp_async_commit();
void cp_async_wait(int n_pending_groups); /* -1: all, committed or not */
/* global memory */
void check_global(const void *p, size_t n, const char *what);
void count_atomic(int bytes);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);
} // namespace emu

#define threadIdx (emu::tid())
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
static inline void __syncthreads() { emu::syncthreads(); }
static inline void __trap() { emu::fail("__trap() reached"); }

static inline float atomicAdd(float *p, float v) {
    emu::check_global(p, 4, "atomicAdd");
    emu::count_atomic(4);
    float old = *p;
    *p = old + v;
    return old;
}
static inline float2 atomicAdd(float2 *p, float2 v) {
    emu::check_global(p, 8, "atomicAdd(float2)");
    emu::count_atomic(8);
    float2 old = *p;
    p->x += v.x;
    p->y += v.y;
    return old;
}
static inline float4 atomicAdd(float4 *p, float4 v) {
    emu::check_global(p, 16, "atomicAdd(float4)");
    if (((uintptr_t)p & 15) != 0) emu::fail("atomicAdd(float4) on a misaligned address");
    emu::count_atomic(16);
    float4 old = *p;
    p->x += v.x;
    p->y += v.y;
    p->z += v.z;
    p->w += v.w;
    return old;
}
/* bulk reductions (bwd_kernel_v2.cuh's wrappers): performed at once, reading the source row
 * through the shared-memory checker as the issuing lane */
static inline void fa_bwd2_bulk_reduce_add_f32(float *gmem_dst, uint32_t smem_src, uint32_t bytes) {
    if (bytes % 16 != 0 || smem_src % 16 != 0 || ((uintptr_t)gmem_dst & 15) != 0)
        emu::fail("cp.reduce.async.bulk: size or address not a multiple of 16");
    emu::check_global(gmem_dst, bytes, "cp.reduce.async.bulk");
    emu::count_atomic((int)bytes);
    for (uint32_t b = 0; b < bytes; b += 16) {
        float v[4];
        emu::smem_load(smem_src + b, v, 16);
        for (int i = 0; i < 4; ++i) gmem_dst[b / 4 + i] += v[i];
    }
}
static inline void fa_bwd2_bulk_commit() {}
static inline void fa_bwd2_bulk_wait_read_all() {}
static inline void fa_bwd2_bulk_wait_all() {}
static inline void fa_bwd2_fence_proxy_async() {}
static inline void st_shared_v2_f32(uint32_t a, float x, float y) {
    const float v[2] = {x, y};
    emu::smem_store(a, v, 8);
}
static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) { return emu::shfl_xor(mask, v, lane_mask); }

/* ---- fa_ptx.cuh -------------------------------------------------------------------------- */
enum { EMU_LDSM_X4 = 1, EMU_LDSM_X4_T, EMU_LDSM_X2, EMU_LDSM_X2_T, EMU_MMA_BF16, EMU_MMA_F16, EMU_SHFL_XOR };

static inline uint32_t smem_u32addr(const void *p) {
    return (uint32_t)((const uint8_t *)p - emu::smem) + emu::SMEM_BASE;
}
static inline void mma_m16n8k16_f32_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) { emu::mma(1, d, a, b); }
static inline void mma_m16n8k16_f32_f16(float d[4], const uint32_t a[4], const uint32_t b[2]) { emu::mma(0, d, a, b); }
static inline void ldmatrix_x4(uint32_t r[4], uint32_t a) { emu::ldmatrix(EMU_LDSM_X4, r, a); }
static inline void ldmatrix_x4_trans(uint32_t r[4], uint32_t a) { emu::ldmatrix(EMU_LDSM_X4_T, r, a); }
static inline void ldmatrix_x2(uint32_t r[2], uint32_t a) { emu::ldmatrix(EMU_LDSM_X2, r, a); }
static inline void ldmatrix_x2_trans(uint32_t r[2], uint32_t a) { emu::ldmatrix(EMU_LDSM_X2_T, r, a); }
static inline void cp_async_cg_16(uint32_t dst, const void *src, int n) { emu::cp_async(dst, src, 16, n); }
static inline void cp_async_ca_4(uint32_t dst, const void *src, int n) { emu::cp_async(dst, src, 4, n); }
static inline void cp_async_commit_group() { emu::cp_async_commit(); }
template <int N>
static inline void cp_async_wait_group() { emu::cp_async_wait(N); }
static inline void cp_async_wait_all() { emu::cp_async_wait(-1); }
static inline float ex2_approx_ftz_f32(float x) {
    float y = exp2f(x);
    return fabsf(y) < 1.17549435e-38f ? 0.0f : y;
}
static inline float lg2_approx_ftz_f32(float x) { return log2f(x); }
static inline float rcp_approx_ftz_f32(float x) { return 1.0f / x; }
static inline uint32_t cvt_rn_bf16x2_f32(float lo, float hi) {
    return (uint32_t)emu::float_to_bf16(lo) | ((uint32_t)emu::float_to_bf16(hi) << 16);
}
static inline uint32_t cvt_rn_f16x2_f32(float lo, float hi) {
    return (uint32_t)emu::float_to_f16(lo) | ((uint32_t)emu::float_to_f16(hi) << 16);
}
static inline void st_shared_b32(uint32_t a, uint32_t v) { emu::smem_store(a, &v, 4); }
static inline void st_shared_f32(uint32_t a, float v) { emu::smem_store(a, &v, 4); }
static inline float ld_shared_f32(uint32_t a) {
    float v;
    emu::smem_load(a, &v, 4);
    return v;
}
static inline void st_shared_u64(uint32_t a, uint64_t v) { emu::smem_store(a, &v, 8); }
static inline uint64_t ld_shared_u64(uint32_t a) {
    uint64_t v;
    emu::smem_load(a, &v, 8);
    return v;
}
static inline void ld_shared_v4_b32(uint32_t r[4], uint32_t a) { emu::smem_load(a, r, 16); }
static inline void st_global_v4_b32(void *p, const uint32_t r[4]) {
    emu::check_global(p, 16, "st.global.v4");
    memcpy(p, r, 16);
}

/* ---- fa_cuda_common.cuh ------------------------------------------------------------------ */
#define FA_CUDA_CHECK(call, what) (void)0
#define FA_CUDA_CHECK_LAUNCH(what) (void)0

struct fa_bf16 {
    static inline void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) { mma_m16n8k16_f32_bf16(d, a, b); }
    static inline uint32_t pack2(float lo, float hi) { return cvt_rn_bf16x2_f32(lo, hi); }
};
struct fa_f16 {
    static inline void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) { mma_m16n8k16_f32_f16(d, a, b); }
    static inline uint32_t pack2(float lo, float hi) { return cvt_rn_f16x2_f32(lo, hi); }
};

template <int CHUNKS>
static inline uint32_t fa_swizzled_chunk(int row, int chunk) {
    static_assert(CHUNKS % 8 == 0, "fa_swizzled_chunk");
    return (uint32_t)(row * CHUNKS + (chunk ^ (row & 7)));
}

/* softcap's tanh, the same formula as fa_cuda_common.cuh on the emulated ex2/rcp units */
static inline float fa_tanh(float x) {
    const float e2x = ex2_approx_ftz_f32(x * 2.8853900817779268f);
    return 1.0f - 2.0f * rcp_approx_ftz_f32(1.0f + e2x);
}

struct fa_seq_rows {
    int64_t q_start, k_start;
    int len_q, len_k;
};
static inline int64_t fa_clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }
static inline fa_seq_rows fa_sequence_rows(const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, int64_t total_q,
                                           int64_t total_k, int seqlen_q, int seqlen_k, int b) {
    fa_seq_rows s;
    if (cu_seqlens_q == nullptr) {
        s.q_start = 0;
        s.k_start = 0;
        s.len_q = seqlen_q;
        s.len_k = seqlen_k;
        return s;
    }
    int64_t q0 = fa_clamp64(cu_seqlens_q[b], 0, total_q);
    int64_t q1 = fa_clamp64(cu_seqlens_q[b + 1], q0, total_q);
    int64_t k0 = fa_clamp64(cu_seqlens_k[b], 0, total_k);
    int64_t k1 = fa_clamp64(cu_seqlens_k[b + 1], k0, total_k);
    s.q_start = q0;
    s.k_start = k0;
    s.len_q = (int)(q1 - q0);
    s.len_k = (int)(k1 - k0);
    return s;
}

#endif /* FA_EMU_CUDA_H */
