/*
 * bwd_hdim64.cu: backward main kernels for head dims padded to 64 (see fa_bwd_hdim_bucket), f16
 * and bf16. One file per bucket so that the instantiations compile in parallel.
 */
#include "bwd_kernel.cuh"
#include "bwd_launch.h"

extern "C" fa_status fa_bwd_launch_hdim64(const fa_bwd_params *prm, fa_dtype dtype, int grid,
                                         cudaStream_t stream) {
    if (dtype == FA_DTYPE_BF16) return fa_bwd_launch_main<fa_bf16, 64>(prm, grid, stream);
    return fa_bwd_launch_main<fa_f16, 64>(prm, grid, stream);
}

#include "bwd_kernel_v2.cuh"
#include "bwd_launch_v2.h"

extern "C" fa_status fa_bwd2_launch_hdim64(const fa_bwd_params *prm, fa_dtype dtype, int grid,
                                          cudaStream_t stream) {
    if (dtype == FA_DTYPE_BF16) return fa_bwd2_launch_main<fa_bf16, 64>(prm, grid, stream);
    return fa_bwd2_launch_main<fa_f16, 64>(prm, grid, stream);
}
