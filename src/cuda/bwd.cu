/*
 * bwd.cu: the CUDA backward's host side and its small kernels.
 *
 *   fa_cuda_check_backward   the backward kernels' own limits (dtype, dims, alignment, sizes,
 *                            shared memory) and the workspace size
 *   fa_cuda_backward         plans the call and runs, asynchronously on p->stream:
 *     0. workspace: p->workspace, or cudaMallocAsync / cudaFreeAsync on the stream
 *     1. the fp32 dQ accumulator(s) (and the Hopper kernels' dQ semaphores) zeroed, by the
 *        pre-pass kernel (a slice per block), or by cudaMemsetAsync where it does not run
 *     2. pre-pass kernel: D = rowsum(dO∘O), LSE in log2 units (+inf where LSE = -inf, so P = 0),
 *        and per-block dsink partials
 *     3. main kernel: dK, dV (or fp32 partials), dQ accumulation. On compute capability 9.0 a
 *        Hopper kernel (bwd_sm90.cu for buckets 64/128, bwd_sm90_hdim256.cu for
 *        256 and, as CTA pairs, 512) for the problems it covers (sm90_tiles.h and the plan
 *        below), else the portable one (instances/bwd_sm80_hdim<bucket>.cu);
 *        FA_CUDA_BACKWARD=portable forces the latter, FA_CUDA_BACKWARD=sm80 the sm_80 kernel
 *        (bwd_sm80.cuh) even where the bigsmem one fits
 *     4. convert kernel: dq = softmax_scale · Σ_splits dq_accum, to the dtype (the Hopper
 *        kernels' tiled accumulator: fa_bwd_convert_tiled_kernel; and, when the GQA
 *        group was split, dk = scale · Σ partials, dv = Σ partials)
 *     5. dsink kernel: dsink_h = -Σ partials, in a fixed order
 *   fp8 e4m3 q, k, v (dtype = FA_DTYPE_FP8_E4M3, o / dout / dq / dk / dv in bf16, dout in e4m3 with
 *   dout_e4m3): the gradients
 *   of the dequantised inputs, as on the CPU. A conversion kernel first writes descale · x of
 *   each input, rounded to bf16, into contiguous copies at the front of the workspace; the steps
 *   above then run on them as a bf16 backward (every feature of the bf16 backward).
 *   With score mods (bias, dbias, doc ids, block masks; common/mods.cuh) the main kernel is the
 *   Hopper kernel's MODS instantiation where fa_hopper_bwd_mods_ok (sm90_tiles.h), else the
 *   sm_80 kernel's on every device, preceded by the block map's build and
 *   check (mods.cu: the call's one synchronisation) and the dbias zeroing, and followed by the
 *   dbias reduction when dbias sums an axis.
 *
 * No device synchronisation (but the block-mask check above), no host read of cu_seqlens. Every CUDA call
 * and launch is checked.
 *
 * Workspace (each region 256-byte aligned), with S = dQ splits (1, or the portable kernels'
 * deterministic-mode split count of bwd_tiles.h) and G = GQA group splits:
 *   dq_accum     S × total_q × heads_q × d × 4 bytes  (Hopper kernels: one; at buckets 64 and
 *                128 tiles of [BLOCK_M, bucket], (total_q / BLOCK_M + batch) per query head,
 *                sm90_tiles.h's fa_hopper_bwd_dq_elems; at 256 head-major)
 *   dq semaphores  Hopper kernels, deterministic mode: batch × heads_q × query blocks × 2 × 4
 *                bytes (sm90_tiles.h; zeroed with dq_accum, which it follows)
 *   lse_log2, D  2 × heads_q × total_q × 4   (Hopper kernel: D only; it converts the LSE itself,
 *                                             so its workspace is no larger than FlashAttention-2's)
 *   dsink parts  heads_q × pre-pass blocks per head × 4      (only with sinks and dsink)
 *   dk/dv parts  G × total_k × heads_kv × (d + dv) × 4       (only when G > 1)
 *   block map    256 + batch × heads_q × q_blocks × kv_blocks × 4 (a block mask; broadcast
 *                list axes count once)
 *   dS           batch × heads_q × seqlen_q × seqlen_k × 4   (dbias with a summed axis only)
 * Deterministic mode on the portable kernels costs (S - 1) extra dQ buffers: S ≈ SMs / (batch ×
 * heads_kv × G), capped by the number of key blocks; e.g. b = 1, 16 heads, d = 128 on 132 SMs:
 * S = 9, 9 × the 512 MiB of one fp32 dQ at 64k tokens. The Hopper kernels instead order each dQ
 * tile's additions by key block (bwd_sm90_common.cuh, "deterministic dQ"): one dQ buffer and
 * a few KiB of semaphores.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/common/bwd_launch.h"
#include "cuda/common/bwd_tiles.h"
#include "cuda/common/cuda_common.cuh"
#include "cuda/common/bwd_bigsmem_launch.h" /* main kernel v2 (bwd_sm80_bigsmem.cuh) on sm_90+, where its smem fits */
#include "cuda/common/sm90_tiles.h"   /* the Hopper main kernel's coverage (bwd_sm90.cu) */
#include "cuda/common/mods.cuh"     /* score bias, dbias, document ids, block masks (mods.cu) */

#include <stdlib.h>
#include <string.h>

/* ---- small kernels ------------------------------------------------------------------------- */

/* fp8 inputs: one tensor's e4m3 codes -> descale · value in bf16, contiguous [rows, heads, dim]. */
struct fa_bwd_fp8_dequant_params {
    const uint8_t *src;         /* [b, seqlen, heads, dim] codes (varlen: [total, heads, dim])   */
    int64_t src_batch_stride, src_row_stride, src_head_stride; /* bytes; batch ignored with varlen */
    __nv_bfloat16 *dst;         /* [total rows, heads, dim]                                      */
    const float *descale;       /* [b, heads_kv] or NULL (1)                                     */
    const int32_t *cu_seqlens;  /* device, or NULL                                               */
    int64_t seqlen;             /* rows per sequence (varlen: at most)                           */
    int heads, dim, group, heads_kv; /* descale column of head h: h / group                     */
};

enum { FA_BWD_FP8_ROWS = 32 }; /* rows of one head per block */

/* One e4m3 code (byte i of w) -> descale · value, NaN codes kept. */
__device__ __forceinline__ float fa_bwd_fp8_value(uint32_t w, int i, float descale) {
    return fa_e4m3_bytes_have_nan((w >> (8 * i)) & 0xffu) ? CUDART_NAN_F : fa_e4m3_byte_to_f32(w, i) * descale;
}

/* Block (row tile, head, sequence): the tile's rows of one head. With 8-byte aligned rows and dim
 * a multiple of 8 (`vec`), 8 codes per thread and step (one 8-byte load, one 16-byte store); else
 * a byte per thread and step. */
__global__ void __launch_bounds__(256) fa_bwd_fp8_dequant_kernel(const fa_bwd_fp8_dequant_params dp, int vec) {
    const int b = (int)blockIdx.z, h = (int)blockIdx.y;
    const int64_t first = dp.cu_seqlens ? dp.cu_seqlens[b] : (int64_t)b * dp.seqlen;
    const int64_t count = dp.cu_seqlens ? dp.cu_seqlens[b + 1] - dp.cu_seqlens[b] : dp.seqlen;
    const int64_t row0 = (int64_t)blockIdx.x * FA_BWD_FP8_ROWS;
    if (row0 >= count) return;
    const int rows = (int)(count - row0 < FA_BWD_FP8_ROWS ? count - row0 : FA_BWD_FP8_ROWS);
    const float descale = dp.descale ? dp.descale[(int64_t)b * dp.heads_kv + h / dp.group] : 1.0f;
    const uint8_t *src = dp.src + (dp.cu_seqlens ? first * dp.src_row_stride : (int64_t)b * dp.src_batch_stride) +
                         row0 * dp.src_row_stride + (int64_t)h * dp.src_head_stride;
    __nv_bfloat16 *dst = dp.dst + ((first + row0) * dp.heads + h) * (int64_t)dp.dim;
    if (vec) {
        const int per_row = dp.dim / 8;
        for (int e = (int)threadIdx.x; e < rows * per_row; e += (int)blockDim.x) {
            const int r = e / per_row, c = 8 * (e % per_row);
            const uint2 w = *reinterpret_cast<const uint2 *>(src + (int64_t)r * dp.src_row_stride + c);
            uint4 out;
            uint32_t *o = &out.x;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint32_t word = i < 2 ? w.x : w.y;
                const __nv_bfloat162 pair = __floats2bfloat162_rn(fa_bwd_fp8_value(word, 2 * (i % 2), descale),
                                                                  fa_bwd_fp8_value(word, 2 * (i % 2) + 1, descale));
                o[i] = *reinterpret_cast<const uint32_t *>(&pair);
            }
            *reinterpret_cast<uint4 *>(dst + (int64_t)r * dp.heads * dp.dim + c) = out;
        }
        return;
    }
    for (int e = (int)threadIdx.x; e < rows * dp.dim; e += (int)blockDim.x) {
        const int r = e / dp.dim, c = e % dp.dim;
        const uint32_t code = src[(int64_t)r * dp.src_row_stride + c];
        dst[(int64_t)r * dp.heads * dp.dim + c] = __float2bfloat16_rn(fa_bwd_fp8_value(code, 0, descale));
    }
}

/* Raw 16-bit element -> float. */
template <bool BF16>
__device__ __forceinline__ float fa_bwd_to_float(uint32_t bits16) {
    if (BF16) return __uint_as_float(bits16 << 16);
    return __half2float(__ushort_as_half((unsigned short)bits16));
}

struct fa_bwd_prepass_params {
    const void *o;              /* [b, seqlen_q, heads_q, dv]                                  */
    const void *dout;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    const float *lse;           /* [b, heads_q, seqlen_q] or varlen [heads_q, total_q], natural log */
    const float *sink_logits;   /* [heads_q] or NULL                                           */
    const int32_t *cu_seqlens_q; /* device, or NULL                                           */
    int64_t total_q;
    int batch, seqlen_q, heads_q, head_dim_v;
    int lanes_per_row;          /* power of two >= dv / 8, at most 32                           */
    int rows_per_block;         /* 256 / lanes_per_row                                        */
    int blocks_per_head;
    float *lse_log2;            /* [heads_q, total_q], or NULL: not needed (Hopper kernel)     */
    float *dsum;                /* [heads_q, total_q]                                          */
    float *sink_partial;        /* [heads_q, blocks_per_head] or NULL                          */
    uint4 *zero16;              /* the dQ accumulators (and semaphores) to zero, 16-byte units, or NULL */
    int64_t zero16_count;       /* units in all                                                 */
    int64_t zero16_per_block;   /* units each block zeroes: its slice of the flat region        */
};

/* One block: rows_per_block packed rows of one head. lanes_per_row lanes read 16 bytes each of
 * the row's O and dO (every lanes_per_row-th 16 bytes when dv > 256) and reduce the dot product
 * with shuffles. */
template <bool BF16>
__global__ void __launch_bounds__(256) fa_bwd_prepass_kernel(const fa_bwd_prepass_params pp) {
    __shared__ float sink_terms[256];
    /* The dQ accumulators are zeroed here rather than by a memset before this kernel: the zero
     * stores then share the pass with the O and dO reads (one kernel over the bandwidth instead
     * of two). Each block zeroes a contiguous slice; the slices tile the region. */
    if (pp.zero16 != nullptr) {
        const int64_t begin = (int64_t)blockIdx.x * pp.zero16_per_block;
        const int64_t end = begin + pp.zero16_per_block < pp.zero16_count ? begin + pp.zero16_per_block
                                                                          : pp.zero16_count;
        for (int64_t u = begin + threadIdx.x; u < end; u += blockDim.x) pp.zero16[u] = make_uint4(0u, 0u, 0u, 0u);
    }
    const int h = blockIdx.x / pp.blocks_per_head;
    const int chunk = blockIdx.x % pp.blocks_per_head;
    const int item = threadIdx.x / pp.lanes_per_row;
    const int lane_in_row = threadIdx.x % pp.lanes_per_row;
    const int64_t row = (int64_t)chunk * pp.rows_per_block + item;
    const bool row_ok = row < pp.total_q;
    const bool varlen = pp.cu_seqlens_q != nullptr;
    /* Rows past the last sequence (varlen padding up to total_q) are never read: the caller's O
     * and dO need not cover them. */
    const bool in_sequence = row_ok && (!varlen || row < pp.cu_seqlens_q[pp.batch]);
    int64_t b = 0, i = row;
    if (!varlen) {
        b = row / pp.seqlen_q;
        i = row - b * pp.seqlen_q;
    }

    float dot = 0.0f;
    for (int c = lane_in_row; in_sequence && c * 8 < pp.head_dim_v; c += pp.lanes_per_row) {
        const int64_t o_off = varlen ? row * pp.o_row_stride + (int64_t)h * pp.o_head_stride
                                     : b * pp.o_batch_stride + i * pp.o_row_stride + (int64_t)h * pp.o_head_stride;
        const int64_t do_off = varlen ? row * pp.do_row_stride + (int64_t)h * pp.do_head_stride
                                      : b * pp.do_batch_stride + i * pp.do_row_stride + (int64_t)h * pp.do_head_stride;
        const uint4 ov = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(pp.o) + o_off) + c);
        const uint4 dv = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(pp.dout) + do_off) + c);
        const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            dot = fmaf(fa_bwd_to_float<BF16>(ow[w] & 0xffffu), fa_bwd_to_float<BF16>(dw[w] & 0xffffu), dot);
            dot = fmaf(fa_bwd_to_float<BF16>(ow[w] >> 16), fa_bwd_to_float<BF16>(dw[w] >> 16), dot);
        }
    }
    /* Reduce over the row's lanes (aligned groups of lanes_per_row inside a warp). */
    for (int off = pp.lanes_per_row / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);

    float sink_term = 0.0f;
    if (row_ok && lane_in_row == 0) {
        const float lse = varlen ? pp.lse[(int64_t)h * pp.total_q + row]
                                 : pp.lse[(b * pp.heads_q + h) * pp.seqlen_q + i];
        const int64_t out = (int64_t)h * pp.total_q + row;
        if (pp.lse_log2 != nullptr) pp.lse_log2[out] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
        pp.dsum[out] = dot;
        /* Rows past the last sequence and fully masked rows contribute nothing. */
        if (pp.sink_partial != nullptr && in_sequence && lse != -INFINITY)
            sink_term = expf(pp.sink_logits[h] - lse) * dot;
    }
    if (pp.sink_partial == nullptr) return;
    /* Fixed-order block sum of the rows' exp(t_h - LSE)·D (deterministic). */
    if (lane_in_row == 0) sink_terms[item] = sink_term;
    __syncthreads();
    if (threadIdx.x < 32) {
        float sum = 0.0f;
        for (int r = threadIdx.x; r < pp.rows_per_block; r += 32) sum += sink_terms[r];
        for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (threadIdx.x == 0) pp.sink_partial[(int64_t)h * pp.blocks_per_head + chunk] = sum;
    }
}

/* dsink_h = -Σ partials of head h, one warp per head, fixed order. */
__global__ void __launch_bounds__(32) fa_bwd_dsink_kernel(const float *sink_partial, int blocks_per_head,
                                                        float *dsink) {
    const int h = blockIdx.x;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < blocks_per_head; c += 32) sum += sink_partial[(int64_t)h * blocks_per_head + c];
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (threadIdx.x == 0) dsink[h] = -sum;
}

/* Where a conversion kernel writes: dst = scale · (fp32 sums), rounded to the dtype. */
struct fa_bwd_convert_dst {
    int64_t total_rows;         /* packed rows (varlen bound)                                  */
    int heads, dim;
    float scale;
    void *dst;                  /* [b, seqlen, heads, dim] 16-bit, strides below               */
    int64_t batch_stride, row_stride, head_stride;
    const int32_t *cu_seqlens;  /* device, or NULL                                             */
    int batch, seqlen;
};

struct fa_bwd_convert_params {
    const float *src;           /* [splits, total_rows, heads, dim] fp32, or with head_major    */
    int head_major;             /* 1: src is [heads, total_rows, dim] (one split)               */
    int splits;
    int64_t split_elems;        /* total_rows · heads · dim                                     */
    fa_bwd_convert_dst out;
};

/* dst = scale · Σ_s src[s] for 8 consecutive elements per thread, summed in split order. Rows
 * past the last sequence (varlen padding) are not written. */
template <bool BF16>
__global__ void __launch_bounds__(256) fa_bwd_convert_kernel(const fa_bwd_convert_params cp) {
    const fa_bwd_convert_dst &out = cp.out;
    const int chunks = out.dim / 8;
    const int64_t item = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const int chunk = (int)(item % chunks);
    const int64_t rest = item / chunks;
    const int h = (int)(rest % out.heads);
    const int64_t row = rest / out.heads;
    if (row >= out.total_rows) return;
    int64_t off;
    if (out.cu_seqlens != nullptr) {
        if (row >= out.cu_seqlens[out.batch]) return;
        off = row * out.row_stride + (int64_t)h * out.head_stride;
    } else {
        const int64_t b = row / out.seqlen, i = row - b * out.seqlen;
        off = b * out.batch_stride + i * out.row_stride + (int64_t)h * out.head_stride;
    }
    const int64_t src_row = cp.head_major ? (int64_t)h * out.total_rows + row : row * out.heads + h;
    const float4 *src = reinterpret_cast<const float4 *>(cp.src + src_row * out.dim + chunk * 8);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < cp.splits; ++s) {
        const float4 lo = __ldg(src), hi = __ldg(src + 1);
        acc[0] += lo.x; acc[1] += lo.y; acc[2] += lo.z; acc[3] += lo.w;
        acc[4] += hi.x; acc[5] += hi.y; acc[6] += hi.z; acc[7] += hi.w;
        src += cp.split_elems / 4;
    }
    uint32_t packed[4];
#pragma unroll
    for (int w = 0; w < 4; ++w)
        packed[w] = BF16 ? cvt_rn_bf16x2_f32(acc[2 * w] * out.scale, acc[2 * w + 1] * out.scale)
                         : cvt_rn_f16x2_f32(acc[2 * w] * out.scale, acc[2 * w + 1] * out.scale);
    st_global_v4_b32(static_cast<uint16_t *>(out.dst) + off + chunk * 8, packed);
}

/* The Hopper kernels' tiled dQ accumulator (sm90_tiles.h, fa_hopper_bwd_dq_tile_cols) -> dq. */
struct fa_bwd_convert_tiled_params {
    const float *src;           /* [heads, tiles, 2 pieces, piece_elems / 512, 128, 4] fp32     */
    int64_t tiles;              /* per head (fa_hopper_bwd_dq_tiles)                            */
    int block_m;                /* 128: piece c = rows 64c.. (bucket 64); 64 and 80: columns
                                   (tile_cols / 2)·c.. (bucket 128, 192 / 128; 80: transposed)   */
    int tile_cols;              /* 64, 128 or 192 (fa_hopper_bwd_dq_tile_cols)                  */
    int query_blocks;           /* ceil(seqlen_q / block_m): grid x = heads · query_blocks · 2    */
    fa_bwd_convert_dst out;
};

/* 8 values · scale of a dq row, columns col .. col + 7, as one 16-byte store. */
template <bool BF16>
__device__ __forceinline__ void fa_bwd_convert_store8(const fa_bwd_convert_dst &out, int64_t q_packed0, int b, int h,
                                                      int row, int col, const float (&x)[8]) {
    uint32_t packed[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
        packed[q] = BF16 ? cvt_rn_bf16x2_f32(x[2 * q] * out.scale, x[2 * q + 1] * out.scale)
                         : cvt_rn_f16x2_f32(x[2 * q] * out.scale, x[2 * q + 1] * out.scale);
    const int64_t off = out.cu_seqlens != nullptr
                            ? (q_packed0 + row) * out.row_stride + (int64_t)h * out.head_stride
                            : (int64_t)b * out.batch_stride + (int64_t)row * out.row_stride + (int64_t)h * out.head_stride;
    st_global_v4_b32(static_cast<uint16_t *>(out.dst) + off + col, packed);
}

/* Transposed pieces (block_m 80: dQᵀ [64 columns, 80 rows]) go through shared memory: the block
 * reads the piece's 20 KiB as float4s in order (thread u takes float4s u, u + 256, ...), float4 f
 * = 128j + 32w + lane being lane's dq[4j .. 4j + 3] of warp w, and puts each value at [row][column]
 * of an [80][68] fp32 tile (row 8j + 2(lane % 4) + e % 2, column 16w + lane / 4 + 8(e / 2); the
 * pitch of 68 floats puts a warp's 32 stores of one e in 32 banks); then 8 threads per row write
 * 16-byte chunks of 8 columns, a row's 128 bytes contiguous (a thread gathering its columns
 * straight from the piece writes half sectors: docs/tuning-log.md). */
enum { FA_BWD_CONVERT_T_PITCH = 68 };

template <bool BF16>
__device__ __forceinline__ void fa_bwd_convert_transposed(const fa_bwd_convert_tiled_params &cp, const float *piece_src,
                                                          float *tile_smem /* [block_m][FA_BWD_CONVERT_T_PITCH] */,
                                                          int64_t q_packed0, int len_q, int b, int h, int m,
                                                          int col0) {
    const int rows = cp.block_m, float4s = rows * 64 / 4;
    const float4 *src = reinterpret_cast<const float4 *>(piece_src);
    for (int f = threadIdx.x; f < float4s; f += blockDim.x) {
        const float4 v = __ldg(src + f);
        const int j = f / 128, w = (f / 32) % 4, lane = f % 32;
        const int row = 8 * j + 2 * (lane % 4), col = 16 * w + lane / 4;
        tile_smem[row * FA_BWD_CONVERT_T_PITCH + col] = v.x;
        tile_smem[(row + 1) * FA_BWD_CONVERT_T_PITCH + col] = v.y;
        tile_smem[row * FA_BWD_CONVERT_T_PITCH + col + 8] = v.z;
        tile_smem[(row + 1) * FA_BWD_CONVERT_T_PITCH + col + 8] = v.w;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < rows * 8; c += blockDim.x) {
        const int r = c / 8, col = 8 * (c % 8);
        if (m * rows + r >= len_q || col0 + col >= cp.out.dim) continue;
        const float4 *at = reinterpret_cast<const float4 *>(tile_smem + r * FA_BWD_CONVERT_T_PITCH + col);
        const float4 lo = at[0], hi = at[1];
        const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        fa_bwd_convert_store8<BF16>(cp.out, q_packed0, b, h, m * rows + r, col0 + col, x);
    }
}

/* One block per piece (query head, sequence blockIdx.y, query block, piece), 256 threads: thread
 * u reads the 64 contiguous bytes of lanes 4r .. 4r + 3 of warp w in store j (u = 64w + 8r + j % 8,
 * j = u % 8 and, for pieces of 96 columns, u % 8 + 8 < 12 too), i.e. columns 8j .. 8j + 7 of the
 * piece's rows 16w + r (the floats' .x .y) and 16w + r + 8 (.z .w), and writes 16 bytes of each
 * row. Rows past the sequence and columns past dim are not written. Transposed pieces:
 * fa_bwd_convert_transposed. */
template <bool BF16>
__global__ void __launch_bounds__(256) fa_bwd_convert_tiled_kernel(const fa_bwd_convert_tiled_params cp) {
    const fa_bwd_convert_dst &out = cp.out;
    const int piece = (int)(blockIdx.x % 2), m = (int)((blockIdx.x / 2) % cp.query_blocks);
    const int h = (int)(blockIdx.x / 2 / cp.query_blocks), b = (int)blockIdx.y;
    const fa_seq_rows seq = fa_sequence_rows(out.cu_seqlens, out.cu_seqlens, out.total_rows, out.total_rows, out.seqlen,
                                             out.seqlen, b);
    const int64_t q_packed0 = out.cu_seqlens != nullptr ? seq.q_start : (int64_t)b * out.seqlen;
    const int64_t piece_elems = fa_hopper_bwd_dq_piece_elems(cp.block_m, cp.tile_cols);
    const int col0 = fa_hopper_bwd_dq_piece_col0(cp.block_m, cp.tile_cols, piece);
    if (fa_hopper_bwd_dq_transposed(cp.block_m)) {
        /* query blocks past this sequence (varlen: grid x counts the longest's) own no tile */
        if ((int64_t)m * cp.block_m >= seq.len_q || col0 >= out.dim) return;
        const int64_t tile = (int64_t)h * cp.tiles + fa_hopper_bwd_dq_tile0(q_packed0, b, cp.block_m) + m;
        __shared__ __align__(16) float tile_smem[fa_hopper_bwd_block_m(128, 1) * FA_BWD_CONVERT_T_PITCH];
        fa_bwd_convert_transposed<BF16>(cp, cp.src + (tile * 2 + piece) * piece_elems, tile_smem, q_packed0, seq.len_q,
                                        b, h, m, col0);
        return;
    }
    const int u = threadIdx.x, r = (u / 8) % 8, w = u / 64;
    const int row0 = m * cp.block_m + fa_hopper_bwd_dq_piece_row0(cp.block_m, piece) + 16 * w + r; /* and row0 + 8 */
    if (row0 >= seq.len_q) return;
    const int64_t tile = (int64_t)h * cp.tiles + fa_hopper_bwd_dq_tile0(q_packed0, b, cp.block_m) + m;
    const int groups = (int)(piece_elems / (64 * 8)); /* 8-column groups of a 64-row piece: 8 or 12 */
    for (int j = u % 8; j < groups; j += 8) {
        const int col = col0 + 8 * j;
        if (col >= out.dim) return;
        const float4 *src =
            reinterpret_cast<const float4 *>(cp.src + (tile * 2 + piece) * piece_elems) + 128 * j + 32 * w + 4 * r;
        float4 f[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) f[q] = __ldg(src + q);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row0 + 8 * half;
            if (row >= seq.len_q) break;
            float x[8];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                x[2 * q] = half ? f[q].z : f[q].x;
                x[2 * q + 1] = half ? f[q].w : f[q].y;
            }
            fa_bwd_convert_store8<BF16>(out, q_packed0, b, h, row, col, x);
        }
    }
}

/* ---- planning ------------------------------------------------------------------------------ */

typedef struct fa_bwd_plan {
    int bucket;
    int block_k;
    int64_t key_blocks;      /* ceil(seqlen_k / block_k)                                       */
    int group_splits, heads_per_split;
    int dq_splits;           /* 1, or deterministic splits                                     */
    int blocks_per_head;     /* key_blocks, or dq_splits                                        */
    int64_t grid;            /* main-kernel blocks                                              */
    int prepass_lanes, prepass_rows;
    int64_t prepass_blocks_per_head;
    int need_sink;           /* sinks given and dsink requested                                 */
    int v2;                  /* 1: the v2 main kernel (its block_k), 0: the v1 kernel (sm_8x)      */
    int hopper;              /* 1: a Hopper main kernel (fa_bwd_launch_hopper) instead                */
    int fp8_kernel;          /* 1: the fp8 one (fa_bwd_launch_hopper_fp8; 64 rows per iteration)      */
    int window_left, window_right; /* the kernels' window sides: one at least as wide as the longest
                                      sequence is unbounded, -1 (keeps their int32 math safe)  */
    int device_ordinal;
    size_t sem_bytes;        /* Hopper kernels, deterministic mode: the dQ semaphores, else 0   */
    int block_m;             /* Hopper kernels: query rows per iteration (fa_hopper_bwd_block_m), else 0 */
    int dq_tile_cols;        /* Hopper kernels with a tiled dQ accumulator: its tiles' columns
                                (fa_hopper_bwd_dq_tile_cols; rows: block_m), else 0              */
    size_t dq_elems;         /* fp32 elements of one dQ accumulator                            */
    size_t off_dq, off_sem, off_lse, off_dsum, off_sink, off_dkp, off_dvp;
    size_t off_map, off_dbias; /* score mods: the block map, the dbias workspace (mods.cu)  */
    size_t bytes;
} fa_bwd_plan;

/* Every stride the Hopper kernel's TMA maps step along (sm90_tiles.h's rule; an axis of
 * extent 1 is never stepped along). Checked while planning, so the pre-pass knows which kernel
 * follows it. */
static int hopper_bwd_strides_ok(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const int64_t batch = pb->varlen ? 1 : p->batch;
    const int64_t rows_q = pb->varlen ? p->total_q : p->seqlen_q, rows_k = pb->varlen ? p->total_k : p->seqlen_k;
    return fa_hopper_tma_stride_ok(p->q_row_stride, rows_q) && fa_hopper_tma_stride_ok(p->q_head_stride, p->heads_q) &&
           fa_hopper_tma_stride_ok(p->q_batch_stride, batch) && fa_hopper_tma_stride_ok(p->do_row_stride, rows_q) &&
           fa_hopper_tma_stride_ok(p->do_head_stride, p->heads_q) &&
           fa_hopper_tma_stride_ok(p->do_batch_stride, batch) && fa_hopper_tma_stride_ok(p->k_row_stride, rows_k) &&
           fa_hopper_tma_stride_ok(p->k_head_stride, p->heads_kv) && fa_hopper_tma_stride_ok(p->k_batch_stride, batch) &&
           fa_hopper_tma_stride_ok(p->v_row_stride, rows_k) && fa_hopper_tma_stride_ok(p->v_head_stride, p->heads_kv) &&
           fa_hopper_tma_stride_ok(p->v_batch_stride, batch);
}

/* Limits of the CUDA backward and its plan (workspace layout, grid, splits). */
static fa_status plan_backward(const fa_problem *pb, fa_bwd_plan *plan,
                               int fp8_kernel = 0 /* the bf16 problem of an e4m3 one the fp8 kernel may take */) {
    const fa_params *p = &pb->p;
    static const char *const path = "the CUDA backward";
    const int check_batch = !pb->varlen; /* batch strides are ignored with varlen */
    fa_status s;
    if ((s = fa_cuda_check_dtype_and_dims(p, path, 576, 512)) != FA_OK ||
        (s = fa_cuda_check_tensor16("q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("o", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("dout", p->dout, p->do_batch_stride, p->do_row_stride, p->do_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("dq", p->dq, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("dk", p->dk, p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("dv", p->dv, p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_aligned("lse", p->lse, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("dsink", p->dsink, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("sink_logits", p->sink_logits, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("alibi_slopes", p->alibi_slopes, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cu_seqlens_q", p->cu_seqlens_q, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cu_seqlens_k", p->cu_seqlens_k, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("workspace", p->workspace, 256)) != FA_OK)
        return s;
    /* Rows, keys and mask arithmetic are int32 in the kernel: keep every sequence below 2^30. */
    const int64_t max_len = (int64_t)1 << 30;
    if (p->seqlen_q >= max_len || p->seqlen_k >= max_len)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "seqlen_q = %lld, seqlen_k = %lld: the CUDA backward needs both below 2^30",
                            (long long)p->seqlen_q, (long long)p->seqlen_k);

    fa_cuda_device_info dev;
    if ((s = fa_cuda_current_device_sm80(&dev)) != FA_OK) return s;

    const int bucket = fa_bwd_hdim_bucket((int)p->head_dim, (int)p->head_dim_v);
    /* FA_CUDA_BACKWARD=sm80 forces the sm_80 kernel (bwd_sm80.cuh), the one sm_8x devices run,
     * so that tests on sm_90 reach it too; =portable forces the portable kernels (not Hopper's). */
    const char *force = getenv("FA_CUDA_BACKWARD");
    const int force_sm80 = force != NULL && strcmp(force, "sm80") == 0;
    /* score mods (common/mods.cuh): the sm_80 kernel's MODS instantiation, on every device */
    plan->v2 = !force_sm80 && !pb->has_mods && dev.cc_major >= 9 && bucket > 0 && bucket <= 256 &&
               fa_bwd_bigsmem_smem_bytes(bucket) <= dev.smem_optin;
    const size_t smem = plan->v2 ? fa_bwd_bigsmem_smem_bytes(bucket) : fa_bwd_smem_bytes(bucket);
    if ((s = fa_cuda_check_smem(p, &dev, smem, "the CUDA backward kernel")) != FA_OK) return s;

    /* The Hopper kernel has one dQ accumulator (deterministic mode: semaphores instead of dQ
     * splits) and splits a kv group's query heads across CTAs only as fa_hopper_bwd_group_splits
     * decides (sm90_tiles.h). */
    /* score mods: the Hopper kernel's MODS instantiations where fa_hopper_bwd_mods_ok, else the
     * portable kernel's */
    const int hopper_mods_ok =
        !pb->has_mods || fa_hopper_bwd_mods_ok(fa_hopper_bwd_bucket((int)p->head_dim, (int)p->head_dim_v),
                                               p->softcap > 0.0f, p->deterministic != 0,
                                               pb->has_block_mask ? p->block_q : 0, pb->has_block_mask ? p->block_k : 0);
    plan->hopper = (force == NULL || (strcmp(force, "portable") != 0 && !force_sm80)) && hopper_mods_ok &&
                   fa_hopper_bwd_unsupported(dev.cc_major, dev.cc_minor, p->dtype, (int)p->head_dim,
                                             (int)p->head_dim_v, p->alibi_slopes != NULL, pb->scale_log2,
                                             p->softcap) == NULL &&
                   p->heads_kv <= FA_CUDA_GRID_YZ_MAX && p->batch <= FA_CUDA_GRID_YZ_MAX &&
                   hopper_bwd_strides_ok(pb) &&
                   fa_hopper_bwd_smem_bytes(fa_hopper_bwd_bucket((int)p->head_dim, (int)p->head_dim_v), 0) <=
                       dev.smem_optin;
    if (pb->has_mods && (s = fa_cuda_mods_check(pb, fa_bwd_block_q(bucket), fa_bwd_block_k(bucket), 1, path)) != FA_OK)
        return s;
    plan->device_ordinal = dev.ordinal;
    plan->bucket = bucket;
    plan->window_left = p->window_left >= p->seqlen_k ? -1 : (int)p->window_left;
    plan->window_right = p->window_right >= p->seqlen_q ? -1 : (int)p->window_right;
    plan->block_k = plan->v2 ? fa_bwd_bigsmem_block_k(bucket) : fa_bwd_block_k(bucket);
    plan->key_blocks = (p->seqlen_k + plan->block_k - 1) / plan->block_k;
    if (plan->hopper) {
        /* FA_HOPPER_BWD_GROUP_SPLITS=N forces N splits (timing and A/B runs) */
        const char *forced = getenv("FA_HOPPER_BWD_GROUP_SPLITS");
        plan->group_splits = fa_hopper_bwd_group_splits(
            fa_hopper_bwd_bucket((int)p->head_dim, (int)p->head_dim_v), p->batch, p->heads_kv, pb->group, p->seqlen_q,
            p->seqlen_k, plan->window_left, plan->window_right, dev.sm_count, forced != NULL ? atoi(forced) : 0);
        /* grid y; softcap with dropout: those instantiations keep the group whole (bwd_sm90.cu) */
        if (p->heads_kv * plan->group_splits > FA_CUDA_GRID_YZ_MAX || (p->softcap > 0.0f && pb->has_dropout))
            plan->group_splits = 1;
    } else {
        plan->group_splits = fa_bwd_group_splits(plan->key_blocks, p->batch, p->heads_kv, pb->group, dev.sm_count);
    }
    plan->heads_per_split = (int)((pb->group + plan->group_splits - 1) / plan->group_splits);
    const int64_t bhs = p->batch * p->heads_kv * plan->group_splits;
    const int split_dq = p->deterministic && !plan->hopper; /* the portable kernels' deterministic mode */
    plan->dq_splits = split_dq ? fa_bwd_deterministic_splits(plan->key_blocks, bhs, dev.sm_count) : 1;
    plan->blocks_per_head = (int)(split_dq ? plan->dq_splits : plan->key_blocks);
    if (plan->key_blocks > INT32_MAX || bhs > INT32_MAX / (plan->blocks_per_head > 0 ? plan->blocks_per_head : 1))
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "batch × heads_kv × key blocks = %lld × %lld × %lld exceeds the CUDA grid limit",
                            (long long)p->batch, (long long)p->heads_kv, (long long)plan->key_blocks);
    plan->grid = bhs * plan->blocks_per_head;

    int lanes = 1;
    while (lanes * 8 < p->head_dim_v && lanes < 32) lanes *= 2;
    plan->prepass_lanes = lanes;
    plan->prepass_rows = 256 / lanes;
    plan->prepass_blocks_per_head = (p->total_q + plan->prepass_rows - 1) / plan->prepass_rows;
    if (plan->prepass_blocks_per_head * p->heads_q > INT32_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE, "total_q × heads_q = %lld × %lld exceeds the CUDA grid limit",
                            (long long)p->total_q, (long long)p->heads_q);
    plan->need_sink = p->sink_logits != NULL && p->dsink != NULL;

    /* the Hopper kernels' query rows per iteration: 80 at bucket 128 for the problems
     * fa_hopper_bwd_rows80 names (sm90_tiles.h; FA_HOPPER_BWD_ROWS=64 keeps 64, for A/B runs);
     * at buckets 64 and 128 they tile their dQ accumulator by it */
    const int kernel_bucket =
        fa_hopper_bwd_kernel_bucket(fa_hopper_bwd_bucket((int)p->head_dim, (int)p->head_dim_v), pb->has_mods);
    const int log2_scores = p->alibi_slopes != NULL || !(pb->scale_log2 > 0.0f); /* ALiBi or a negative scale */
    const char *rows_forced = getenv("FA_HOPPER_BWD_ROWS");
    plan->fp8_kernel = fp8_kernel && plan->hopper &&
                       fa_hopper_bwd_fp8_ok((int)p->head_dim, (int)p->head_dim_v, p->softcap > 0.0f, log2_scores,
                                            pb->has_dropout, pb->has_mods) &&
                       fa_hopper_bwd_fp8_smem_bytes() <= dev.smem_optin;
    const int rows80 =
        plan->hopper && !plan->fp8_kernel && (rows_forced == NULL || atoi(rows_forced) != 64) &&
        fa_hopper_bwd_rows80(kernel_bucket, plan->window_left, plan->window_right,
                             p->batch > 0 ? p->total_q / p->batch : 0, p->softcap > 0.0f, log2_scores,
                             pb->has_dropout, pb->has_mods) &&
        fa_hopper_bwd_smem_bytes(kernel_bucket, 1) <= dev.smem_optin;
    plan->block_m = plan->hopper ? fa_hopper_bwd_block_m(kernel_bucket, rows80) : 0;
    /* MLA's 192 / 128 on its own kernel where fa_hopper_bwd_d192 says so (FA_HOPPER_BWD_192=0
     * keeps the bucket-256 kernel, d and dv padded to 256, for A/B runs); it tiles its dQ
     * accumulator [64, 192] */
    const char *d192_forced = getenv("FA_HOPPER_BWD_192");
    const int d192 = plan->hopper && !pb->has_mods && (d192_forced == NULL || strcmp(d192_forced, "0") != 0) &&
                     fa_hopper_bwd_d192((int)p->head_dim, (int)p->head_dim_v, p->softcap > 0.0f, log2_scores,
                                        pb->has_dropout);
    plan->dq_tile_cols = plan->hopper ? fa_hopper_bwd_dq_tile_cols(kernel_bucket, d192) : 0;
    plan->dq_elems = plan->hopper ? (size_t)fa_hopper_bwd_dq_elems(plan->dq_tile_cols, plan->block_m, p->total_q,
                                                                    p->batch, p->heads_q, p->head_dim)
                                  : (size_t)p->total_q * (size_t)p->heads_q * (size_t)p->head_dim;
    const size_t dq_elems = plan->dq_elems;
    const size_t row_elems = (size_t)p->heads_q * (size_t)p->total_q;
    size_t off = 0;
    plan->off_dq = off;
    off = fa_cuda_align256(off + (size_t)plan->dq_splits * dq_elems * 4);
    plan->off_sem = off;
    plan->sem_bytes =
        plan->hopper && p->deterministic
            ? (size_t)fa_hopper_bwd_semaphores(fa_hopper_bwd_bucket((int)p->head_dim, (int)p->head_dim_v), rows80,
                                               p->batch, p->heads_q, p->seqlen_q) * 4
            : 0;
    off = fa_cuda_align256(off + plan->sem_bytes);
    plan->off_lse = off;
    if (!plan->hopper) off = fa_cuda_align256(off + row_elems * 4);
    plan->off_dsum = off;
    off = fa_cuda_align256(off + row_elems * 4);
    plan->off_sink = off;
    if (plan->need_sink)
        off = fa_cuda_align256(off + (size_t)p->heads_q * (size_t)plan->prepass_blocks_per_head * 4);
    plan->off_dkp = off;
    plan->off_dvp = off;
    if (plan->group_splits > 1) {
        const size_t kv_rows = (size_t)plan->group_splits * (size_t)p->total_k * (size_t)p->heads_kv;
        off = fa_cuda_align256(off + kv_rows * (size_t)p->head_dim * 4);
        plan->off_dvp = off;
        off = fa_cuda_align256(off + kv_rows * (size_t)p->head_dim_v * 4);
    }
    plan->off_map = off;
    off = fa_cuda_align256(off + (pb->has_mods ? fa_cuda_mods_map_bytes(pb) : 0));
    plan->off_dbias = off;
    off = fa_cuda_align256(off + fa_cuda_dbias_workspace_bytes(pb));
    plan->bytes = off;
    return FA_OK;
}

/* fp8 inputs: the bf16 copies of q, k, (with_v) v and (dout_e4m3) dout at the front of the
 * workspace (256-byte aligned). The fp8 kernel reads V's codes alone: no V copy (off_v = off_do). */
struct fa_bwd_fp8_copies {
    size_t off_q, off_k, off_v, off_do, bytes;
};

static fa_bwd_fp8_copies fp8_copies(const fa_params *p, int with_v) {
    fa_bwd_fp8_copies c;
    size_t off = 0;
    c.off_q = off;
    off = fa_cuda_align256(off + (size_t)p->total_q * (size_t)p->heads_q * (size_t)p->head_dim * 2);
    c.off_k = off;
    off = fa_cuda_align256(off + (size_t)p->total_k * (size_t)p->heads_kv * (size_t)p->head_dim * 2);
    c.off_v = off;
    if (with_v) off = fa_cuda_align256(off + (size_t)p->total_k * (size_t)p->heads_kv * (size_t)p->head_dim_v * 2);
    c.off_do = off;
    if (p->dout_e4m3) off = fa_cuda_align256(off + (size_t)p->total_q * (size_t)p->heads_q * (size_t)p->head_dim_v * 2);
    c.bytes = off;
    return c;
}

/* The bf16 problem the backward of fp8 inputs runs: pb with q, k, v (and an e4m3 dout) replaced
 * by the contiguous copies at `base` (planning only: any 256-byte aligned address). */
static void fp8_as_bf16(const fa_problem *pb, const fa_bwd_fp8_copies *c, uint8_t *base, fa_problem *out) {
    *out = *pb;
    fa_params *p = &out->p;
    p->dtype = FA_DTYPE_BF16;
    p->q = base + c->off_q;
    p->k = base + c->off_k;
    p->v = base + c->off_v;
    p->q_head_stride = p->head_dim;
    p->q_row_stride = p->heads_q * p->head_dim;
    p->q_batch_stride = pb->varlen ? 0 : p->seqlen_q * p->q_row_stride;
    p->k_head_stride = p->head_dim;
    p->k_row_stride = p->heads_kv * p->head_dim;
    p->k_batch_stride = pb->varlen ? 0 : p->seqlen_k * p->k_row_stride;
    p->v_head_stride = p->head_dim_v;
    p->v_row_stride = p->heads_kv * p->head_dim_v;
    p->v_batch_stride = pb->varlen ? 0 : p->seqlen_k * p->v_row_stride;
    if (p->dout_e4m3) {
        p->dout = base + c->off_do;
        p->do_head_stride = p->head_dim_v;
        p->do_row_stride = p->heads_q * p->head_dim_v;
        p->do_batch_stride = pb->varlen ? 0 : p->seqlen_q * p->do_row_stride;
    }
    p->q_descale = p->k_descale = p->v_descale = p->dout_descale = NULL;
    p->dout_e4m3 = 0;
}

/* Limits of the fp8 backward beyond the bf16 backward's: the conversion kernel's grid. */
static fa_status check_fp8(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    if (p->batch > FA_CUDA_GRID_YZ_MAX || p->heads_q > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "dtype = FA_DTYPE_FP8_E4M3: batch = %lld, heads_q = %lld: the CUDA fp8 backward's "
                            "conversion grid takes at most %d of each",
                            (long long)p->batch, (long long)p->heads_q, FA_CUDA_GRID_YZ_MAX);
    return FA_OK;
}

/* The fp8 kernel may take it (the plan decides the rest: sm90_tiles.h's fa_hopper_bwd_fp8_ok):
 * dout in e4m3 and every e4m3 tensor readable by TMA. FA_HOPPER_BWD_FP8=0 keeps the bf16 backward
 * on the copies (A/B runs). */
static int fp8_kernel_candidate(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const char *forced = getenv("FA_HOPPER_BWD_FP8");
    if (!p->dout_e4m3 || (forced != NULL && strcmp(forced, "0") == 0)) return 0;
    const int64_t batch = pb->varlen ? 1 : p->batch;
    const int64_t rows_q = pb->varlen ? p->total_q : p->seqlen_q, rows_k = pb->varlen ? p->total_k : p->seqlen_k;
    /* every e4m3 tensor TMA-readable (strides in bytes: multiples of 16) */
    return fa_hopper_tma_tensor_ok((uintptr_t)p->q, 1, p->q_row_stride, p->q_head_stride, p->q_batch_stride,
                                   rows_q, p->heads_q, batch) &&
           fa_hopper_tma_tensor_ok((uintptr_t)p->k, 1, p->k_row_stride, p->k_head_stride, p->k_batch_stride,
                                   rows_k, p->heads_kv, batch) &&
           fa_hopper_tma_tensor_ok((uintptr_t)p->v, 1, p->v_row_stride, p->v_head_stride, p->v_batch_stride,
                                   rows_k, p->heads_kv, batch) &&
           fa_hopper_tma_tensor_ok((uintptr_t)p->dout, 1, p->do_row_stride, p->do_head_stride, p->do_batch_stride,
                                   rows_q, p->heads_q, batch);
}

/* fp8 inputs: the limits, the copies' layout, the bf16 problem (at a placeholder base) and its plan. */
static fa_status plan_backward_fp8(const fa_problem *pb, fa_bwd_fp8_copies *copies, fa_problem *bf16,
                                   fa_bwd_plan *plan) {
    fa_status s = check_fp8(pb);
    if (s != FA_OK) return s;
    *copies = fp8_copies(&pb->p, 1);
    fp8_as_bf16(pb, copies, reinterpret_cast<uint8_t *>(256), bf16);
    if ((s = plan_backward(bf16, plan, fp8_kernel_candidate(pb))) != FA_OK || !plan->fp8_kernel) return s;
    /* the plan does not depend on where the copies lie (all 256-byte aligned); the bf16 problem's v
     * then names the dout copy's address, which nothing reads: the fp8 kernel's launcher maps V's
     * codes and no 16-bit V */
    *copies = fp8_copies(&pb->p, 0);
    fp8_as_bf16(pb, copies, reinterpret_cast<uint8_t *>(256), bf16);
    return FA_OK;
}

extern "C" fa_status fa_cuda_check_backward(const fa_problem *pb, size_t *workspace_bytes) {
    if (workspace_bytes) *workspace_bytes = 0;
    fa_bwd_plan plan;
    fa_status s;
    if (pb->p.dtype == FA_DTYPE_FP8_E4M3) {
        fa_bwd_fp8_copies copies;
        fa_problem bf16;
        s = plan_backward_fp8(pb, &copies, &bf16, &plan);
        if (s == FA_OK && workspace_bytes) *workspace_bytes = copies.bytes + plan.bytes;
        return s;
    }
    s = plan_backward(pb, &plan);
    if (s == FA_OK && workspace_bytes) *workspace_bytes = plan.bytes;
    return s;
}

/* ---- run ----------------------------------------------------------------------------------- */

static fa_status launch_convert(const fa_bwd_convert_params *cp, fa_dtype dtype, cudaStream_t stream,
                                const char *what) {
    const int64_t items = cp->out.total_rows * cp->out.heads * (cp->out.dim / 8);
    if (items == 0) return FA_OK;
    const int64_t blocks = (items + 255) / 256;
    if (blocks > INT32_MAX) return fa_set_error(FA_ERR_INVALID_SIZE, "%s: too many elements", what);
    if (dtype == FA_DTYPE_BF16)
        fa_bwd_convert_kernel<true><<<(unsigned)blocks, 256, 0, stream>>>(*cp);
    else
        fa_bwd_convert_kernel<false><<<(unsigned)blocks, 256, 0, stream>>>(*cp);
    FA_CUDA_CHECK_LAUNCH(what);
    return FA_OK;
}

/* dq as a conversion's destination. */
static fa_bwd_convert_dst dq_destination(const fa_params *p) {
    fa_bwd_convert_dst out;
    out.total_rows = p->total_q;
    out.heads = (int)p->heads_q;
    out.dim = (int)p->head_dim;
    out.scale = p->softmax_scale;
    out.dst = p->dq;
    out.batch_stride = p->dq_batch_stride;
    out.row_stride = p->dq_row_stride;
    out.head_stride = p->dq_head_stride;
    out.cu_seqlens = p->cu_seqlens_q;
    out.batch = (int)p->batch;
    out.seqlen = (int)p->seqlen_q;
    return out;
}

/* dq from the Hopper kernels' tiled accumulator: one block per (query head, query block, piece)
 * in grid x, sequences in grid y (the plan keeps batch within FA_CUDA_GRID_YZ_MAX). */
static fa_status launch_convert_tiled(const fa_problem *pb, const fa_bwd_plan *plan, const float *dq_accum,
                                      cudaStream_t stream) {
    const fa_params *p = &pb->p;
    static const char *const what = "backward dq conversion kernel launch";
    fa_bwd_convert_tiled_params cp;
    cp.src = dq_accum;
    cp.block_m = plan->block_m;
    cp.tile_cols = plan->dq_tile_cols;
    cp.tiles = fa_hopper_bwd_dq_tiles(p->total_q, p->batch, cp.block_m);
    const int64_t query_blocks = (p->seqlen_q + cp.block_m - 1) / cp.block_m;
    const int64_t blocks = p->heads_q * query_blocks * 2;
    if (blocks == 0 || p->batch == 0) return FA_OK;
    if (blocks > INT32_MAX) return fa_set_error(FA_ERR_INVALID_SIZE, "%s: too many elements", what);
    cp.query_blocks = (int)query_blocks;
    cp.out = dq_destination(p);
    const dim3 grid((unsigned)blocks, (unsigned)p->batch);
    if (p->dtype == FA_DTYPE_BF16)
        fa_bwd_convert_tiled_kernel<true><<<grid, 256, 0, stream>>>(cp);
    else
        fa_bwd_convert_tiled_kernel<false><<<grid, 256, 0, stream>>>(cp);
    FA_CUDA_CHECK_LAUNCH(what);
    return FA_OK;
}

/* The workspace regions of one call (bwd_plan's offsets). */
typedef struct fa_bwd_buffers {
    float *dq_accum;
    float *lse_log2;     /* NULL for the Hopper kernels, which convert lse themselves   */
    float *dsum;
    float *sink_partial; /* NULL without sinks                                         */
    const fa_mods_params *mods; /* score mods (pb->has_mods), else NULL                  */
    const fa_params *fp8;       /* plan->fp8_kernel: the caller's e4m3 problem, else NULL */
} fa_bwd_buffers;

/* 2. the pre-pass: D = rowsum(dO∘O), LSE·log2(e), the sinks' partial sums. */
static fa_status run_prepass(const fa_problem *pb, const fa_bwd_plan *plan, const fa_bwd_buffers *buf,
                             void *zero, size_t zero_bytes, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    float *lse_log2 = buf->lse_log2, *dsum = buf->dsum, *sink_partial = buf->sink_partial;
    fa_bwd_prepass_params pp;
    pp.o = p->o;
    pp.dout = p->dout;
    pp.o_batch_stride = p->o_batch_stride;
    pp.o_row_stride = p->o_row_stride;
    pp.o_head_stride = p->o_head_stride;
    pp.do_batch_stride = p->do_batch_stride;
    pp.do_row_stride = p->do_row_stride;
    pp.do_head_stride = p->do_head_stride;
    pp.lse = p->lse;
    pp.sink_logits = p->sink_logits;
    pp.cu_seqlens_q = p->cu_seqlens_q;
    pp.total_q = p->total_q;
    pp.batch = (int)p->batch;
    pp.seqlen_q = (int)p->seqlen_q;
    pp.heads_q = (int)p->heads_q;
    pp.head_dim_v = (int)p->head_dim_v;
    pp.lanes_per_row = plan->prepass_lanes;
    pp.rows_per_block = plan->prepass_rows;
    pp.blocks_per_head = (int)plan->prepass_blocks_per_head;
    pp.lse_log2 = lse_log2;
    pp.dsum = dsum;
    pp.sink_partial = sink_partial;
    const unsigned blocks = (unsigned)(plan->prepass_blocks_per_head * p->heads_q);
    pp.zero16 = static_cast<uint4 *>(zero);
    pp.zero16_count = (int64_t)(zero_bytes / 16);
    pp.zero16_per_block = (pp.zero16_count + blocks - 1) / blocks;
    if (p->dtype == FA_DTYPE_BF16)
        fa_bwd_prepass_kernel<true><<<blocks, 256, 0, stream>>>(pp);
    else
        fa_bwd_prepass_kernel<false><<<blocks, 256, 0, stream>>>(pp);
    FA_CUDA_CHECK_LAUNCH("backward pre-pass kernel launch");
    return FA_OK;
}

/* 3. the main kernel: dK, dV (or their per-group-split partials) and the dQ accumulator. */
static fa_status run_main(const fa_problem *pb, const fa_bwd_plan *plan, const fa_bwd_buffers *buf, uint8_t *ws,
                          cudaStream_t stream) {
    const fa_params *p = &pb->p;
    float *dq_accum = buf->dq_accum, *lse_log2 = buf->lse_log2, *dsum = buf->dsum;
    fa_bwd_params prm;
    fa_cuda_fill_kernel_base(&prm, pb);
    prm.dout = p->dout;
    prm.dk = p->dk;
    prm.dv = p->dv;
    prm.do_batch_stride = p->do_batch_stride;
    prm.do_row_stride = p->do_row_stride;
    prm.do_head_stride = p->do_head_stride;
    prm.dk_batch_stride = p->dk_batch_stride;
    prm.dk_row_stride = p->dk_row_stride;
    prm.dk_head_stride = p->dk_head_stride;
    prm.dv_batch_stride = p->dv_batch_stride;
    prm.dv_row_stride = p->dv_row_stride;
    prm.dv_head_stride = p->dv_head_stride;
    prm.window_left = plan->window_left;
    prm.window_right = plan->window_right;
    prm.softmax_scale = p->softmax_scale;
    prm.lse_log2 = lse_log2;
    prm.dsum = dsum;
    prm.dq_accum = dq_accum;
    prm.dq_accum_split_elems = p->deterministic && !plan->hopper ? (int64_t)plan->dq_elems : 0;
    prm.dq_semaphore = plan->sem_bytes > 0 ? reinterpret_cast<int *>(ws + plan->off_sem) : nullptr;
    prm.dk_partial = plan->group_splits > 1 ? reinterpret_cast<float *>(ws + plan->off_dkp) : nullptr;
    prm.dv_partial = plan->group_splits > 1 ? reinterpret_cast<float *>(ws + plan->off_dvp) : nullptr;
    prm.group_splits = plan->group_splits;
    prm.heads_per_split = plan->heads_per_split;
    prm.blocks_per_head = plan->blocks_per_head;
    prm.block_m = plan->block_m;
    prm.dq_tile_cols = plan->dq_tile_cols;
    const fa_dropout_params drop = fa_cuda_dropout_params(pb);
    const bool dropout = pb->has_dropout; /* the DROPOUT instantiations */
    fa_status s;
    if (pb->has_mods && !plan->hopper) { /* score mods: the map was built and dbias begun by run_backward */
        const fa_mods_params *mods = buf->mods;
        const int grid = (int)plan->grid;
        switch (plan->bucket) {
        case 64: return fa_bwd_mods_launch_hdim64(&prm, mods, p->dtype, grid, stream);
        case 128: return fa_bwd_mods_launch_hdim128(&prm, mods, p->dtype, grid, stream);
        case 256: return fa_bwd_mods_launch_hdim256(&prm, mods, p->dtype, grid, stream);
        case 512: return fa_bwd_mods_launch_hdim512(&prm, mods, p->dtype, grid, stream);
        default: return fa_bwd_mods_launch_hdim576(&prm, mods, p->dtype, grid, stream);
        }
    }
    if (plan->fp8_kernel) {
        if ((s = fa_bwd_launch_hopper_fp8(&prm, buf->fp8, plan->device_ordinal, stream)) != FA_OK) return s;
    } else if (plan->hopper) {
        if ((s = fa_bwd_launch_hopper(&prm, dropout ? &drop : NULL, buf->mods, p->dtype, plan->device_ordinal,
                                      stream)) != FA_OK)
            return s;
    } else if (plan->v2) {
        const int grid = (int)plan->grid;
        switch (plan->bucket) {
        case 64:
            s = dropout ? fa_bwd_bigsmem_dropout_launch_hdim64(&prm, &drop, p->dtype, grid, stream)
                        : fa_bwd_bigsmem_launch_hdim64(&prm, p->dtype, grid, stream);
            break;
        case 128:
            s = dropout ? fa_bwd_bigsmem_dropout_launch_hdim128(&prm, &drop, p->dtype, grid, stream)
                        : fa_bwd_bigsmem_launch_hdim128(&prm, p->dtype, grid, stream);
            break;
        default:
            s = dropout ? fa_bwd_bigsmem_dropout_launch_hdim256(&prm, &drop, p->dtype, grid, stream)
                        : fa_bwd_bigsmem_launch_hdim256(&prm, p->dtype, grid, stream);
            break;
        }
        if (s != FA_OK) return s;
    } else
    switch (plan->bucket) {
    case 64:
        s = dropout ? fa_bwd_dropout_launch_hdim64(&prm, &drop, p->dtype, (int)plan->grid, stream)
                    : fa_bwd_launch_hdim64(&prm, p->dtype, (int)plan->grid, stream);
        break;
    case 128:
        s = dropout ? fa_bwd_dropout_launch_hdim128(&prm, &drop, p->dtype, (int)plan->grid, stream)
                    : fa_bwd_launch_hdim128(&prm, p->dtype, (int)plan->grid, stream);
        break;
    case 256:
        s = dropout ? fa_bwd_dropout_launch_hdim256(&prm, &drop, p->dtype, (int)plan->grid, stream)
                    : fa_bwd_launch_hdim256(&prm, p->dtype, (int)plan->grid, stream);
        break;
    case 512:
        s = dropout ? fa_bwd_dropout_launch_hdim512(&prm, &drop, p->dtype, (int)plan->grid, stream)
                    : fa_bwd_launch_hdim512(&prm, p->dtype, (int)plan->grid, stream);
        break;
    default:
        s = dropout ? fa_bwd_dropout_launch_hdim576(&prm, &drop, p->dtype, (int)plan->grid, stream)
                    : fa_bwd_launch_hdim576(&prm, p->dtype, (int)plan->grid, stream);
        break;
    }
    if (s != FA_OK) return s;
    return FA_OK;
}

/* 4. the conversions: dQ from its accumulator, and with group splits dK and dV from their
 * partials. */
static fa_status run_conversions(const fa_problem *pb, const fa_bwd_plan *plan, const fa_bwd_buffers *buf,
                                 uint8_t *ws, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    fa_status s;
    if (plan->dq_tile_cols > 0) {
        if ((s = launch_convert_tiled(pb, plan, buf->dq_accum, stream)) != FA_OK) return s;
    } else {
        fa_bwd_convert_params cp;
        cp.src = buf->dq_accum;
        cp.head_major = plan->hopper; /* the Hopper kernel's accumulator layout at bucket 256 */
        cp.splits = plan->dq_splits;
        cp.split_elems = (int64_t)plan->dq_elems;
        cp.out = dq_destination(p);
        if ((s = launch_convert(&cp, p->dtype, stream, "backward dq conversion kernel launch")) != FA_OK) return s;
    }
    if (plan->group_splits > 1) {
        const int64_t kv_rows = p->total_k * p->heads_kv;
        fa_bwd_convert_params cp;
        cp.head_major = 0;
        cp.splits = plan->group_splits;
        cp.out.total_rows = p->total_k;
        cp.out.heads = (int)p->heads_kv;
        cp.out.cu_seqlens = p->cu_seqlens_k;
        cp.out.batch = (int)p->batch;
        cp.out.seqlen = (int)p->seqlen_k;
        cp.src = reinterpret_cast<const float *>(ws + plan->off_dkp);
        cp.split_elems = kv_rows * p->head_dim;
        cp.out.dim = (int)p->head_dim;
        cp.out.scale = p->softmax_scale;
        cp.out.dst = p->dk;
        cp.out.batch_stride = p->dk_batch_stride;
        cp.out.row_stride = p->dk_row_stride;
        cp.out.head_stride = p->dk_head_stride;
        if ((s = launch_convert(&cp, p->dtype, stream, "backward dk reduction kernel launch")) != FA_OK) return s;
        cp.src = reinterpret_cast<const float *>(ws + plan->off_dvp);
        cp.split_elems = kv_rows * p->head_dim_v;
        cp.out.dim = (int)p->head_dim_v;
        cp.out.scale = 1.0f;
        cp.out.dst = p->dv;
        cp.out.batch_stride = p->dv_batch_stride;
        cp.out.row_stride = p->dv_row_stride;
        cp.out.head_stride = p->dv_head_stride;
        if ((s = launch_convert(&cp, p->dtype, stream, "backward dv reduction kernel launch")) != FA_OK) return s;
    }
    return FA_OK;
}

static fa_status run_backward(const fa_problem *pb, const fa_bwd_plan *plan, uint8_t *ws, cudaStream_t stream,
                              const fa_params *fp8 = NULL /* plan->fp8_kernel: the caller's e4m3 problem */) {
    const fa_params *p = &pb->p;
    fa_bwd_buffers buf;
    buf.fp8 = fp8;
    buf.dq_accum = reinterpret_cast<float *>(ws + plan->off_dq);
    buf.lse_log2 = plan->hopper ? nullptr : reinterpret_cast<float *>(ws + plan->off_lse);
    buf.dsum = reinterpret_cast<float *>(ws + plan->off_dsum);
    buf.sink_partial = plan->need_sink ? reinterpret_cast<float *>(ws + plan->off_sink) : nullptr;
    float *dq_accum = buf.dq_accum, *sink_partial = buf.sink_partial;
    const size_t dq_elems = plan->dq_elems;
    fa_status s;

    /* 0. score mods: the block map, checked before anything is written; dbias zeroed */
    fa_mods_params mods;
    buf.mods = nullptr;
    if (pb->has_mods) {
        if ((s = fa_cuda_mods_prepare(pb, ws + plan->off_map, stream, &mods)) != FA_OK) return s;
        if ((s = fa_cuda_dbias_begin(pb, reinterpret_cast<float *>(ws + plan->off_dbias), stream, &mods)) != FA_OK)
            return s;
        buf.mods = &mods;
    }

    /* 1. zero dQ accumulators (and the semaphores right after them): by the pre-pass where it
     * runs and the region is whole 16-byte units (the workspace regions are 256-byte aligned) */
    const size_t zero_bytes = plan->sem_bytes > 0 ? plan->off_sem + plan->sem_bytes - plan->off_dq
                                                  : (size_t)plan->dq_splits * dq_elems * 4;
    const int zero_in_prepass = dq_elems > 0 && p->total_q > 0 && zero_bytes % 16 == 0;
    if (dq_elems > 0 && !zero_in_prepass)
        FA_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, zero_bytes, stream), "cudaMemsetAsync(dq accumulator)");

    if (p->total_q > 0 &&
        (s = run_prepass(pb, plan, &buf, zero_in_prepass ? dq_accum : nullptr, zero_in_prepass ? zero_bytes : 0,
                         stream)) != FA_OK)
        return s;
    if (plan->grid > 0 && (s = run_main(pb, plan, &buf, ws, stream)) != FA_OK) return s;
    if ((s = run_conversions(pb, plan, &buf, ws, stream)) != FA_OK) return s;
    if (pb->has_mods && (s = fa_cuda_dbias_finish(pb, reinterpret_cast<const float *>(ws + plan->off_dbias), stream)) != FA_OK)
        return s;

    /* 5. dsink */
    if (p->dsink != NULL) {
        if (plan->need_sink && plan->prepass_blocks_per_head > 0) {
            fa_bwd_dsink_kernel<<<(unsigned)p->heads_q, 32, 0, stream>>>(
                sink_partial, (int)plan->prepass_blocks_per_head, p->dsink);
            FA_CUDA_CHECK_LAUNCH("backward dsink kernel launch");
        } else {
            FA_CUDA_CHECK(cudaMemsetAsync(p->dsink, 0, (size_t)p->heads_q * sizeof(float), stream),
                          "cudaMemsetAsync(dsink)");
        }
    }
    return FA_OK;
}

/* One input's codes -> its bf16 copy (heads = its heads, group = query heads per descale column). */
static fa_status launch_fp8_dequant(const fa_problem *pb, const void *src, int64_t batch_stride, int64_t row_stride,
                                    int64_t head_stride, const float *descale, const int32_t *cu_seqlens,
                                    int64_t seqlen, int64_t heads, int64_t dim, int64_t group, uint8_t *dst,
                                    cudaStream_t stream, const char *what) {
    const fa_params *p = &pb->p;
    if (seqlen <= 0 || heads <= 0 || p->batch <= 0) return FA_OK;
    fa_bwd_fp8_dequant_params dp;
    dp.src = static_cast<const uint8_t *>(src);
    dp.src_batch_stride = batch_stride;
    dp.src_row_stride = row_stride;
    dp.src_head_stride = head_stride;
    dp.dst = reinterpret_cast<__nv_bfloat16 *>(dst);
    dp.descale = descale;
    dp.cu_seqlens = pb->varlen ? cu_seqlens : NULL;
    dp.seqlen = seqlen;
    dp.heads = (int)heads;
    dp.dim = (int)dim;
    dp.group = (int)group;
    dp.heads_kv = (int)p->heads_kv;
    const dim3 grid((unsigned)((seqlen + FA_BWD_FP8_ROWS - 1) / FA_BWD_FP8_ROWS), (unsigned)heads, (unsigned)p->batch);
    /* 8 codes per load where every row start is 8-byte aligned (the copy's rows are 16-byte
     * aligned: dim is a multiple of 8 bf16) */
    const int vec = dim % 8 == 0 && (uintptr_t)src % 8 == 0 && row_stride % 8 == 0 && head_stride % 8 == 0 &&
                    (pb->varlen || batch_stride % 8 == 0);
    fa_bwd_fp8_dequant_kernel<<<grid, 256, 0, stream>>>(dp, vec);
    FA_CUDA_CHECK_LAUNCH(what);
    return FA_OK;
}

/* fp8 inputs: the bf16 copies, then the bf16 backward on them. */
static fa_status run_backward_fp8(const fa_problem *pb, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    fa_bwd_fp8_copies copies;
    fa_problem bf16;
    fa_bwd_plan plan;
    fa_status s = plan_backward_fp8(pb, &copies, &bf16, &plan);
    if (s != FA_OK) return s;
    fa_cuda_workspace ws;
    if ((s = fa_cuda_workspace_acquire(p->workspace, copies.bytes + plan.bytes, stream, "fp8 backward", &ws)) != FA_OK)
        return s;
    fp8_as_bf16(pb, &copies, ws.base, &bf16);
    /* varlen: seqlen_q / seqlen_k are the longest sequence's rows (flash_attn's max_seqlen), as
     * every CUDA kernel's grid takes them */
    s = launch_fp8_dequant(pb, p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, p->q_descale,
                           p->cu_seqlens_q, p->seqlen_q, p->heads_q, p->head_dim, pb->group, ws.base + copies.off_q,
                           stream, "fp8 backward: q conversion kernel launch");
    if (s == FA_OK)
        s = launch_fp8_dequant(pb, p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, p->k_descale,
                               p->cu_seqlens_k, p->seqlen_k, p->heads_kv, p->head_dim, 1, ws.base + copies.off_k, stream,
                               "fp8 backward: k conversion kernel launch");
    if (s == FA_OK && !plan.fp8_kernel) /* the fp8 kernel reads V's codes alone */
        s = launch_fp8_dequant(pb, p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, p->v_descale,
                               p->cu_seqlens_k, p->seqlen_k, p->heads_kv, p->head_dim_v, 1, ws.base + copies.off_v, stream,
                               "fp8 backward: v conversion kernel launch");
    if (s == FA_OK && p->dout_e4m3)
        s = launch_fp8_dequant(pb, p->dout, p->do_batch_stride, p->do_row_stride, p->do_head_stride, p->dout_descale,
                               p->cu_seqlens_q, p->seqlen_q, p->heads_q, p->head_dim_v, pb->group,
                               ws.base + copies.off_do, stream, "fp8 backward: dout conversion kernel launch");
    if (s == FA_OK) s = run_backward(&bf16, &plan, ws.base + copies.bytes, stream, &pb->p);
    return fa_cuda_workspace_release(&ws, stream, "fp8 backward", s);
}

extern "C" fa_status fa_cuda_backward(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    if (p->dtype == FA_DTYPE_FP8_E4M3) return run_backward_fp8(pb, stream);
    fa_bwd_plan plan;
    fa_status s = plan_backward(pb, &plan);
    if (s != FA_OK) return s;

    fa_cuda_workspace ws;
    if ((s = fa_cuda_workspace_acquire(p->workspace, plan.bytes, stream, "backward", &ws)) != FA_OK) return s;
    s = run_backward(pb, &plan, ws.base, stream);
    return fa_cuda_workspace_release(&ws, stream, "backward", s);
}
