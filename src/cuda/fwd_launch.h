/*
 * fwd_launch.h: the extern "C" launchers of the forward kernels, one per head-dim bucket
 * (src/cuda/fwd_hdim<bucket>.cu). fa_cuda.cu fills fa_fwd_params and calls one of them.
 *
 * Each launcher runs the kernel for `dtype` (F16 or BF16) asynchronously on `stream`, on the
 * current device `device_ordinal`, and returns FA_OK or FA_ERR_CUDA with a message.
 */
#ifndef FA_FWD_LAUNCH_H
#define FA_FWD_LAUNCH_H

#include <cuda_runtime.h>

#include "fa_cuda_common.cuh"

extern "C" {
fa_status fa_fwd_launch_hdim64(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                               cudaStream_t stream);
fa_status fa_fwd_launch_hdim128(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
fa_status fa_fwd_launch_hdim256(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                cudaStream_t stream);
}

#endif /* FA_FWD_LAUNCH_H */
