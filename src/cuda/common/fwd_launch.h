/*
 * fwd_launch.h: the extern "C" launchers of the forward kernels, one per head-dim bucket
 * (instances/fwd_sm80_hdim<bucket>.cu). fwd.cu fills fa_fwd_params and calls one of them.
 *
 * Each launcher runs the kernel for `dtype` (F16 or BF16) asynchronously on `stream`, on the
 * current device `device_ordinal`, and returns FA_OK or FA_ERR_CUDA with a message.
 */
#ifndef FA_FWD_LAUNCH_H
#define FA_FWD_LAUNCH_H

#include <cuda_runtime.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/mods.cuh"

extern "C" {
typedef enum fa_cuda_fwd_kernel { FA_CUDA_FWD_PORTABLE = 0, FA_CUDA_FWD_HOPPER = 1 } fa_cuda_fwd_kernel;

/* The kernel fa_cuda_forward runs for a validated problem on `dev` (fwd.cu). */
fa_cuda_fwd_kernel fa_cuda_forward_kernel(const fa_problem *pb, const fa_cuda_device_info *dev);

fa_status fa_fwd_launch_hdim64(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                               cudaStream_t stream);
fa_status fa_fwd_launch_hdim128(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
fa_status fa_fwd_launch_hdim256(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
fa_status fa_fwd_launch_hdim512(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
fa_status fa_fwd_launch_hdim576(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
/* The same kernels with attention dropout (instances/fwd_sm80_dropout_hdim<bucket>.cu). */
fa_status fa_fwd_dropout_launch_hdim64(const fa_fwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                       int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_dropout_launch_hdim128(const fa_fwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_dropout_launch_hdim256(const fa_fwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_dropout_launch_hdim512(const fa_fwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_dropout_launch_hdim576(const fa_fwd_params *prm, const fa_dropout_params *dropout, fa_dtype dtype,
                                        int device_ordinal, cudaStream_t stream);
/* The same kernels with the score bias, document ids and block-sparse masks of
 * common/mods.cuh (instances/fwd_sm80_mods_hdim<bucket>.cu). */
fa_status fa_fwd_mods_launch_hdim64(const fa_fwd_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                    int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_mods_launch_hdim128(const fa_fwd_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                     int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_mods_launch_hdim256(const fa_fwd_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                     int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_mods_launch_hdim512(const fa_fwd_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                     int device_ordinal, cudaStream_t stream);
fa_status fa_fwd_mods_launch_hdim576(const fa_fwd_params *prm, const fa_mods_params *mods, fa_dtype dtype,
                                     int device_ordinal, cudaStream_t stream);
/* The Hopper kernel (fwd_sm90.cu), for compute capability 9.0 and the problems
 * fa_hopper_fwd_unsupported() (sm90_tiles.h) accepts; dropout != NULL: its DROPOUT
 * instantiations; mods != NULL (never with dropout; a block mask only when
 * fa_hopper_fwd_mods_blocks_ok): its MODS instantiations. FA_ERR_STRIDE when a tensor's strides do not fit a TMA tensor map (positive
 * multiples of 16 bytes below 2^40), before anything is launched: the caller then runs the
 * portable kernel. */
fa_status fa_fwd_launch_hopper(const fa_fwd_params *prm, const fa_dropout_params *dropout,
                               const fa_mods_params *mods, fa_dtype dtype, int device_ordinal, cudaStream_t stream);

/* The Hopper fp8 forward (fwd_sm90.cu's FP8 instantiations) for the problems
 * fa_hopper_fp8_unsupported() (sm90_tiles.h) accepts: q, k, v e4m3 (strides in elements =
 * bytes), o bf16; the descale factors [batch, heads_kv] fp32 in device memory (NULL = 1);
 * vt_in_kernel: the kernel transposes V itself (sm90_tiles.h, fa_hopper_fp8_vt_in_kernel; buckets
 * 64 and 128), else the pre-pass writes Vᵀ into `workspace` on `stream` before the kernel;
 * `workspace` holds fa_hopper_fp8_workspace_bytes() bytes (256-byte aligned) for that choice.
 * FA_ERR_STRIDE when a stride does not fit a TMA tensor map, before anything is launched. */
fa_status fa_fwd_launch_hopper_fp8(const fa_fwd_params *prm, const float *q_descale, const float *k_descale,
                                   const float *v_descale, void *workspace, int vt_in_kernel, int device_ordinal,
                                   cudaStream_t stream);
}

#endif /* FA_FWD_LAUNCH_H */
