/*
 * bwd_launch.h: the backward kernels' parameter block and the extern "C" launchers of the main
 * kernel, one per head-dim bucket (instances/bwd_sm80_hdim<bucket>.cu). bwd.cu plans the call,
 * runs the pre-pass, fills fa_bwd_params and calls one of these, then the dQ (and, with a split
 * GQA group, dK/dV) conversion.
 */
#ifndef FA_BWD_LAUNCH_H
#define FA_BWD_LAUNCH_H

#include <cuda_runtime.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/mods.cuh"

/* Everything the main backward kernel reads, passed by value: fa_kernel_base (q, k, v, the
 * forward's lse, sizes, window, score constants, ALiBi) and the gradients and workspace below.
 * Strides in elements; the window sides are clamped by the host so that every index expression
 * stays inside int32. "Packed row" = the row's index in [0, total): cu_seqlens_q[b] + i with
 * varlen, b·seqlen_q + i without. */
struct fa_bwd_params : fa_kernel_base {
    const void *dout; /* [b, seqlen_q, heads_q, dv]                                           */
    void *dk;         /* [b, seqlen_k, heads_kv, d]  written when group_splits == 1           */
    void *dv;         /* [b, seqlen_k, heads_kv, dv] written when group_splits == 1           */
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    float softmax_scale;
    /* workspace, filled by the pre-pass */
    const float *lse_log2; /* [heads_q, total_q] LSE·log2(e); +inf where LSE = -inf (P = 0);
                              NULL for the Hopper kernel, which converts lse itself            */
    const float *dsum;     /* [heads_q, total_q] D = rowsum(dO∘O)                              */
    float *dq_accum;       /* [splits, total_q, heads_q, d] fp32, zeroed; unscaled dS·K sums;
                              the Hopper kernels: tiles [block_m, dq_tile_cols] in register
                              order at buckets 64 and 128 and for 192 / 128, [heads_q, total_q,
                              d] at 256 (sm90_tiles.h, fa_hopper_bwd_dq_tile_cols)              */
    int64_t dq_accum_split_elems; /* 0: one buffer, atomics from all blocks; else total_q·hq·d  */
    int *dq_semaphore;     /* the Hopper kernels in deterministic mode: [batch, heads_q, query
                              blocks, 2] int32, zeroed (sm90_tiles.h); NULL otherwise         */
    float *dk_partial;     /* group_splits > 1: [group_splits, total_k, heads_kv, d] fp32      */
    float *dv_partial;     /*                   [group_splits, total_k, heads_kv, dv] fp32     */
    int group_splits;      /* query-head groups per kv head handled by separate blocks          */
    int heads_per_split;
    int blocks_per_head;   /* blocks per (b, kv head, group split): key blocks, or dQ splits   */
    int block_m;           /* the Hopper kernels: query rows per iteration, as the plan sized the
                              dQ accumulator (sm90_tiles.h, fa_hopper_bwd_block_m)              */
    int dq_tile_cols;      /* the Hopper kernels: the dQ accumulator's tile columns, 0 for the
                              row layout (fa_hopper_bwd_dq_tile_cols); 192 runs the 192 / 128
                              kernel (fa_bwd_launch_hopper192)                                  */
};

extern "C" {
/* Run the main kernel for `dtype` (F16 or BF16) on `grid` blocks, asynchronously on `stream`.
 * Returns FA_OK or FA_ERR_CUDA with a message. */
fa_status fa_bwd_launch_hdim64(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_launch_hdim128(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_launch_hdim256(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_launch_hdim512(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_launch_hdim576(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
/* The same kernels with attention dropout (instances/bwd_sm80_dropout_hdim<bucket>.cu). */
fa_status fa_bwd_dropout_launch_hdim64(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                       int grid, cudaStream_t stream);
fa_status fa_bwd_dropout_launch_hdim128(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int grid, cudaStream_t stream);
fa_status fa_bwd_dropout_launch_hdim256(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int grid, cudaStream_t stream);
fa_status fa_bwd_dropout_launch_hdim512(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int grid, cudaStream_t stream);
fa_status fa_bwd_dropout_launch_hdim576(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int grid, cudaStream_t stream);
/* The same kernels with the score bias, dbias, document ids and block-sparse masks of
 * common/mods.cuh (instances/bwd_sm80_mods_hdim<bucket>.cu). */
fa_status fa_bwd_mods_launch_hdim64(const fa_bwd_params *prm, const fa_mods_params *mods, fa_dtype dtype, int grid,
                                    cudaStream_t stream);
fa_status fa_bwd_mods_launch_hdim128(const fa_bwd_params *prm, const fa_mods_params *mods, fa_dtype dtype, int grid,
                                     cudaStream_t stream);
fa_status fa_bwd_mods_launch_hdim256(const fa_bwd_params *prm, const fa_mods_params *mods, fa_dtype dtype, int grid,
                                     cudaStream_t stream);
fa_status fa_bwd_mods_launch_hdim512(const fa_bwd_params *prm, const fa_mods_params *mods, fa_dtype dtype, int grid,
                                     cudaStream_t stream);
fa_status fa_bwd_mods_launch_hdim576(const fa_bwd_params *prm, const fa_mods_params *mods, fa_dtype dtype, int grid,
                                     cudaStream_t stream);
/* The Hopper main kernel (bwd_sm90.cu) in place of the above, for the problems
 * fa_hopper_bwd_unsupported() (sm90_tiles.h) accepts, with group_splits from fa_hopper_bwd_group_splits
 * (1 at bucket 256) and one dQ
 * accumulator, lse in place of lse_log2; its own grid. The caller has checked the strides
 * (sm90_tiles.h's fa_hopper_tma_stride_ok). dq_semaphore != NULL: deterministic dQ. dropout !=
 * NULL: the DROPOUT instantiations. mods != NULL (fa_hopper_bwd_mods_ok: bucket 128, no
 * softcap, dropout or deterministic mode; the map built, dbias begun): the MODS instantiations. */
fa_status fa_bwd_launch_hopper(const fa_bwd_params *prm, const fa_dropout_params *dropout,
                               const fa_mods_params *mods, fa_dtype dtype,
                               int device_ordinal, cudaStream_t stream);
/* The fp8 backward's kernel (bwd_sm90.cu's FP8 instantiation; sm90_tiles.h's fa_hopper_bwd_fp8_ok):
 * prm as above for the bf16 problem of the dequantised copies (Q, K, dO: the dK, dQ and dV GEMMs;
 * block_m 64), fp8 the caller's problem, whose e4m3 q, k, v and dout (strides multiples of 16
 * bytes, bases 16-byte aligned) and descale factors feed Sᵀ = K Qᵀ and dPᵀ = V dOᵀ on the e4m3
 * tensor cores; deterministic as above. */
fa_status fa_bwd_launch_hopper_fp8(const fa_bwd_params *prm, const fa_params *fp8, int device_ordinal,
                                   cudaStream_t stream);
/* Its bucket-256 kernel (bwd_sm90_hdim256.cu), which fa_bwd_launch_hopper calls for d and dv in
 * 136..256, and in 264..512 as cluster pairs (each CTA half the head-dim columns); same contract. */
fa_status fa_bwd_launch_hopper256(const fa_bwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                  int device_ordinal, cudaStream_t stream);
/* Its kernel for MLA's 192 / 128 (bwd_sm90_hdim192.cu), which fa_bwd_launch_hopper256 calls
 * when the plan chose it (dq_tile_cols = 192: sm90_tiles.h's fa_hopper_bwd_d192); same contract,
 * no dropout. */
fa_status fa_bwd_launch_hopper192(const fa_bwd_params *prm, fa_dtype dtype, int device_ordinal, cudaStream_t stream);
}

#endif /* FA_BWD_LAUNCH_H */
