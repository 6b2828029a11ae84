/*
 * kvcache_quant.cu: the append of k_new / v_new into a quantised cache on the device
 * (fa_kvq_append), run on the caller's stream before the quantised decode kernel
 * (kernels/kvcache_quant_sm80.cuh), which then reads the appended slots from the cache.
 *
 * Bit for bit the CPU's append (src/cpu/cpu_decode.c, store_row), so that a cache appended to on
 * either device holds the same bytes:
 *   int8  per (token, kv head): amax = max |x| over the row, d = amax / 127 (NaN if the row
 *         holds a NaN), q = rint(x · (d > 0 ? 1 / d : 0)) clamped to ±127, scale d (fp32)
 *   Q8_0  the same per block of 32 values, d stored as f16 (nearest even; the CPU's conversion,
 *         NaN payload included), q from the fp32 d
 *   e4m3  x / scale[kv head] to the nearest e4m3 (ties to even), saturating to ±448, NaN kept
 * Every fp32 operation is the correctly rounded one written out (__fdiv_rn, __frcp_rn,
 * __fmul_rn), so no contraction or approximation can differ from the host's.
 *
 * One warp per (sequence, appended token, kv head): lane l holds elements l + 32·i (i < 8,
 * d <= 256), so a Q8_0 block is one i and its amax one warp reduction. The cache slot is
 * cache_seqlens[b] + t, clamped as the decode kernel clamps (device arrays the host never read).
 * Two sequences appending to one slot race (as in the unquantised path).
 */
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/kvcache_launch.h"

enum { FA_KVQ_APPEND_WARPS = 4 };

/* fp32 -> f16 bits, the CPU's fa_f32_to_f16 (cpu_convert.h) written for the device. */
__device__ __forceinline__ uint16_t fa_kvq_f32_to_f16_bits(float f) {
    const uint32_t u = __float_as_uint(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {
        magnitude += 0x0fffu + ((magnitude >> 13) & 1u);
        return (uint16_t)(sign | ((magnitude - 0x38000000u) >> 13));
    }
    const float units = __fmul_rn(__uint_as_float(magnitude), 16777216.0f);
    return (uint16_t)(sign | (uint16_t)rintf(units));
}

/* e4m3 code (7 magnitude bits) -> value, as the CPU's fa_e4m3_to_f32 (cpu_convert.h) for finite codes. */
__device__ __forceinline__ float fa_kvq_e4m3_magnitude(int code) {
    return (code >> 3) == 0 ? __fmul_rn((float)(code & 7), 0.001953125f)
                            : ldexpf(__fadd_rn(1.0f, __fmul_rn((float)(code & 7), 0.125f)), (code >> 3) - 7);
}

/* fp32 -> e4m3, the CPU's fa_cpu_f32_to_e4m3: the nearest of the 126 finite magnitudes by a
 * binary search, ties to the even code. */
__device__ __forceinline__ uint8_t fa_kvq_f32_to_e4m3(float x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
    const float a = fabsf(x);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
    int lo = 0, hi = 0x7e;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (fa_kvq_e4m3_magnitude(mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    int code = lo;
    if (code < 0x7e) {
        const float below = fa_kvq_e4m3_magnitude(code), above = fa_kvq_e4m3_magnitude(code + 1);
        const float d_below = __fsub_rn(a, below), d_above = __fsub_rn(above, a);
        if (d_below > d_above || (d_below == d_above && (code & 1))) code++;
    }
    return (uint8_t)(sign | code);
}

/* rint(x · inv) clamped to ±127, as an int8 byte (a NaN product gives 0, as the host's
 * truncating conversion does). */
__device__ __forceinline__ uint8_t fa_kvq_round_i8(float x, float inv) {
    float v = rintf(__fmul_rn(x, inv));
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    return (uint8_t)(int8_t)(isnan(v) ? 0 : (int)v);
}

/* amax over the warp's values (only those in the row) and whether one is NaN */
__device__ __forceinline__ float fa_kvq_warp_max(float m) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    return m;
}

/* One row of n values (src, 16-bit) into the quantised row dst (and *scale_dst for int8), by
 * the whole warp. */
template <class Cvt>
__device__ __forceinline__ void fa_kvq_store_row(int quant, const uint16_t *src, int n, uint8_t *dst,
                                                 float *scale_dst, float head_scale, int lane) {
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int e = lane + 32 * i;
        x[i] = e < n ? Cvt::to_float(src[e]) : 0.0f;
    }
    if (quant == FA_KV_FP8_E4M3) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (lane + 32 * i < n) dst[lane + 32 * i] = fa_kvq_f32_to_e4m3(__fdiv_rn(x[i], head_scale));
        return;
    }
    if (quant == FA_KV_Q8_0) { /* n is a multiple of 32: block i = values 32i .. 32i + 31 */
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (32 * i >= n) break; /* warp-uniform */
            const float amax = fa_kvq_warp_max(fabsf(x[i]));
            const bool nan = __any_sync(0xffffffffu, isnan(x[i]));
            const float d = nan ? CUDART_NAN_F : __fdiv_rn(amax, 127.0f);
            const float inv = d > 0.0f ? __frcp_rn(d) : 0.0f;
            uint8_t *block = dst + 34 * i;
            if (lane == 0) *(uint16_t *)block = fa_kvq_f32_to_f16_bits(d); /* rows are 4-byte aligned */
            block[2 + lane] = fa_kvq_round_i8(x[i], inv);
        }
        return;
    }
    /* int8: one scale for the row */
    float amax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (lane + 32 * i < n) {
            amax = fmaxf(amax, fabsf(x[i]));
            nan |= isnan(x[i]);
        }
    amax = fa_kvq_warp_max(amax);
    nan = __any_sync(0xffffffffu, nan);
    const float d = nan ? CUDART_NAN_F : __fdiv_rn(amax, 127.0f);
    const float inv = d > 0.0f ? __frcp_rn(d) : 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (lane + 32 * i < n) dst[lane + 32 * i] = fa_kvq_round_i8(x[i], inv);
    if (lane == 0) *scale_dst = d;
}

/* Grid: x strides over (token, kv head) pairs, FA_KVQ_APPEND_WARPS per block; y = sequence. */
template <class Cvt>
__global__ void __launch_bounds__(32 * FA_KVQ_APPEND_WARPS) fa_kvq_append_kernel(const fa_kv_params prm) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.y;
    const bool paged = prm.block_table != nullptr;
    const int capacity = prm.seqlen_k, n_new = prm.seqlen_new;
    const int l0_max = max(0, capacity - n_new);
    const int cache_len = min(max(prm.cache_seqlens != nullptr ? prm.cache_seqlens[b] : capacity, 0), l0_max);
    const int cache_row =
        paged ? 0 : min(max(prm.cache_batch_idx != nullptr ? prm.cache_batch_idx[b] : b, 0), prm.cache_batch - 1);
    const int32_t *table_row = paged ? prm.block_table + (int64_t)b * prm.block_table_batch_stride : nullptr;
    const int table_last = !paged ? 0
                           : prm.block_table_batch_stride - 1 > INT32_MAX ? INT32_MAX
                                                                          : (int)(prm.block_table_batch_stride - 1);
    const int64_t items = (int64_t)n_new * prm.heads_kv;
    for (int64_t item = (int64_t)blockIdx.x * FA_KVQ_APPEND_WARPS + warp; item < items;
         item += (int64_t)gridDim.x * FA_KVQ_APPEND_WARPS) {
        const int t = (int)(item / prm.heads_kv), h = (int)(item % prm.heads_kv);
        const int c = cache_len + t;
        if (c >= capacity) continue; /* warp-uniform */
        int64_t slab, row;
        if (paged) {
            const int pidx = min(c / prm.page_size, table_last);
            slab = min(max(table_row[pidx], 0), prm.num_pages - 1);
            row = min(c - pidx * prm.page_size, prm.page_size - 1);
        } else {
            slab = cache_row;
            row = c;
        }
#pragma unroll 1
        for (int kv = 0; kv < 2; ++kv) {
            const uint16_t *src =
                kv ? (const uint16_t *)prm.v_new + (int64_t)b * prm.vnew_batch_stride + (int64_t)t * prm.vnew_row_stride +
                         (int64_t)h * prm.vnew_head_stride
                   : (const uint16_t *)prm.k_new + (int64_t)b * prm.knew_batch_stride + (int64_t)t * prm.knew_row_stride +
                         (int64_t)h * prm.knew_head_stride;
            uint8_t *dst = kv ? (uint8_t *)prm.v + slab * prm.v_batch_stride + row * prm.v_row_stride +
                                    (int64_t)h * prm.v_head_stride
                              : (uint8_t *)prm.k + slab * prm.k_batch_stride + row * prm.k_row_stride +
                                    (int64_t)h * prm.k_head_stride;
            float *scale_dst = nullptr;
            float head_scale = 1.0f;
            if (prm.kv_quant == FA_KV_INT8)
                scale_dst = kv ? (float *)prm.v_scale + slab * prm.v_scale_batch_stride + row * prm.v_scale_row_stride +
                                     (int64_t)h * prm.v_scale_head_stride
                               : (float *)prm.k_scale + slab * prm.k_scale_batch_stride + row * prm.k_scale_row_stride +
                                     (int64_t)h * prm.k_scale_head_stride;
            else if (prm.kv_quant == FA_KV_FP8_E4M3)
                head_scale = kv ? prm.v_scale[h] : prm.k_scale[h];
            fa_kvq_store_row<Cvt>(prm.kv_quant, src, kv ? prm.head_dim_v : prm.head_dim, dst, scale_dst, head_scale,
                                  lane);
        }
    }
}

template <class Elem>
struct fa_kvq_convert16;
template <>
struct fa_kvq_convert16<fa_bf16> {
    static __device__ __forceinline__ float to_float(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
};
template <>
struct fa_kvq_convert16<fa_f16> {
    static __device__ __forceinline__ float to_float(uint16_t x) { return __half2float(__ushort_as_half(x)); }
};

extern "C" fa_status fa_kvq_append(const fa_kv_params *prm, fa_dtype dtype, cudaStream_t stream) {
    const int64_t items = (int64_t)prm->seqlen_new * prm->heads_kv;
    if (items <= 0 || prm->batch <= 0) return FA_OK;
    const int64_t blocks = (items + FA_KVQ_APPEND_WARPS - 1) / FA_KVQ_APPEND_WARPS;
    const dim3 grid((unsigned)(blocks < 65536 ? blocks : 65536), (unsigned)prm->batch);
    if (dtype == FA_DTYPE_BF16)
        fa_kvq_append_kernel<fa_kvq_convert16<fa_bf16>><<<grid, 32 * FA_KVQ_APPEND_WARPS, 0, stream>>>(*prm);
    else
        fa_kvq_append_kernel<fa_kvq_convert16<fa_f16>><<<grid, 32 * FA_KVQ_APPEND_WARPS, 0, stream>>>(*prm);
    FA_CUDA_CHECK_LAUNCH("quantised KV-cache append");
    return FA_OK;
}
