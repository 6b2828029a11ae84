/*
 * fa_ptx.cuh: tiny inline-PTX wrappers, one per instruction, named after it. Shared by the CUDA
 * forward (fwd_*.cu) and backward (bwd_*.cu) kernels: both helpers include this header, so keep
 * every existing name and signature stable; new wrappers go at the end (the backward's under its
 * "backward" comment).
 *
 * Conventions:
 *   - shared-memory operands are 32-bit shared-window addresses (smem_u32addr), as PTX wants them;
 *   - matrix fragments are arrays of 32-bit registers holding two 16-bit elements each, the
 *     lower-indexed element in the low half (the PTX fragment layouts below);
 *   - each wrapper cites the PTX ISA section (by its heading in the PTX ISA 9.0 manual) it implements.
 *
 * Everything here needs sm_80 or newer (mma.sync m16n8k16 with bf16, cp.async).
 */
#ifndef FA_PTX_CUH
#define FA_PTX_CUH

#include <stdint.h>

/* ---- addresses -------------------------------------------------------------------------------- */

/* Generic pointer into shared memory -> 32-bit .shared address (PTX ISA: Data Movement, "cvta"). */
__device__ __forceinline__ uint32_t smem_u32addr(const void *smem_ptr) {
    return (uint32_t)__cvta_generic_to_shared(smem_ptr);
}

/* ---- tensor-core matrix multiply-accumulate (PTX ISA: Warp-level MMA, "mma") -------------- */
/*
 * D[16x8] += A[16x16] · B[16x8], fp32 accumulators, 16-bit inputs. Per lane (g = lane/4, t = lane%4;
 * PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type"):
 *   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..]   a[3] = A[g+8][2t+8..]
 *   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
 *   d[0..1] = D[g][2t..2t+1] d[2..3] = D[g+8][2t..2t+1]
 */
__device__ __forceinline__ void mma_m16n8k16_f32_bf16(float d[4], const uint32_t a[4],
                                                      const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_m16n8k16_f32_f16(float d[4], const uint32_t a[4],
                                                     const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ---- shared -> register matrix loads (PTX ISA: Warp-level matrix load, "ldmatrix") -------------------------- */
/*
 * .x4: lanes 8i..8i+7 give the 8 row addresses (16 bytes each, 16-byte aligned) of matrix i;
 * r[i] receives matrix i, lane l holding row l/4, columns 2(l%4)..2(l%4)+1. .trans delivers the
 * transposed 8x8 matrix instead (lane l: column l/4, rows 2(l%4)..+1). .x2 uses lanes 0..15.
 */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], uint32_t smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr));
}

/* ---- asynchronous global -> shared copies (PTX ISA: Data Movement, "cp.async") ---------------------- */
/*
 * Copies src_bytes (0 or 16) from global memory and zero-fills the rest of the 16-byte
 * destination; src_bytes = 0 reads nothing (gmem_src must still be a valid address, pass the
 * tensor's base). .cg caches in L2 only (the tile is used once per block from shared memory).
 */
__device__ __forceinline__ void cp_async_cg_16(uint32_t smem_dst, const void *gmem_src,
                                               int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
}

/* Close the cp.async operations issued so far by this thread into one group (PTX ISA "cp.async.commit_group"). */
__device__ __forceinline__ void cp_async_commit_group() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Wait until at most N of this thread's most recent groups are pending (PTX ISA "cp.async.wait_group"). Only the
 * issuing thread's copies are covered: a barrier must follow before other threads read them. */
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* ---- special functions (PTX ISA: Floating-point, "ex2", "lg2", "rcp") --------------------------------- */

/* 2^x, approximate (max relative error about 2^-22), subnormal results flushed; ex2(-inf) = +0. */
__device__ __forceinline__ float ex2_approx_ftz_f32(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* log2(x), approximate (max absolute error about 2^-22 in [0.5, 2]). */
__device__ __forceinline__ float lg2_approx_ftz_f32(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* 1/x, approximate. */
__device__ __forceinline__ float rcp_approx_ftz_f32(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* ---- conversions (PTX ISA: Data Movement and Conversion, "cvt") ------------------------------------------------------ */
/* Two fp32 -> one register of two 16-bit values, round to nearest even; `lo` lands in the low
 * half. (cvt's first source goes to the upper half, so the operands are passed hi, lo.) */
__device__ __forceinline__ uint32_t cvt_rn_bf16x2_f32(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ uint32_t cvt_rn_f16x2_f32(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* ---- shared / global vector accesses (PTX ISA: Data Movement, "ld", "st") ---------------------- */

__device__ __forceinline__ void st_shared_b32(uint32_t smem_addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_addr), "r"(v) : "memory");
}

__device__ __forceinline__ void st_shared_f32(uint32_t smem_addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(smem_addr), "f"(v) : "memory");
}

__device__ __forceinline__ float ld_shared_f32(uint32_t smem_addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_u64(uint32_t smem_addr, uint64_t v) {
    asm volatile("st.shared.u64 [%0], %1;\n" ::"r"(smem_addr), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_shared_u64(uint32_t smem_addr) {
    uint64_t v;
    asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v) : "r"(smem_addr) : "memory");
    return v;
}

__device__ __forceinline__ void ld_shared_v4_b32(uint32_t r[4], uint32_t smem_addr) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr)
                 : "memory");
}

__device__ __forceinline__ void st_global_v4_b32(void *gmem_dst, const uint32_t r[4]) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem_dst), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* ---- backward ----------------------------------------------------------------------------------
 * Wrappers added by the backward kernels go below this line. */

/* 4-byte cp.async (PTX ISA "cp.async"; sizes 4 and 8 need .ca): copies src_bytes (0 or 4) and
 * zero-fills the rest; src_bytes = 0 reads nothing (gmem_src must still be a valid address).
 * Used for per-row fp32 vectors (LSE, D) whose rows need not be 16-byte aligned. */
__device__ __forceinline__ void cp_async_ca_4(uint32_t smem_dst, const void *gmem_src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_dst), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
}

/* ---- kvcache -----------------------------------------------------------------------------------
 * Wrappers added by the KV-cache decode kernels (kvcache_*.cu) go below this line. */

/* Programmatic dependent launch (PTX ISA "griddepcontrol", sm_90+; no-ops when compiled for older
 * targets, where the host never asks for a programmatic launch). launch_dependents: this block no
 * longer holds back the launch of the grid that depends on this one (it still waits for our
 * completion in griddepcontrol.wait). wait: block until every prerequisite grid has completed and
 * its memory operations are visible; returns at once when the grid was launched normally. */
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void griddepcontrol_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* 16-bit shared-memory accesses for the in-place rotary of q / k_new rows (PTX ISA "ld", "st"). */
__device__ __forceinline__ uint16_t ld_shared_u16(uint32_t smem_addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(smem_addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_u16(uint32_t smem_addr, uint16_t v) {
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(smem_addr), "h"(v) : "memory");
}

__device__ __forceinline__ void st_shared_v2_f32(uint32_t smem_addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ void ld_shared_v4_f32(float r[4], uint32_t smem_addr) {
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3])
                 : "r"(smem_addr)
                 : "memory");
}

#endif /* FA_PTX_CUH */
