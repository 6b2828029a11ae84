/*
 * fwd_hdim64.cu: forward kernels for head dims padded to 64 (see fa_fwd_hdim_bucket), f16 and bf16.
 * One file per bucket so that the instantiations compile in parallel.
 */
#include "fwd_kernel.cuh"
#include "fwd_launch.h"

extern "C" fa_status fa_fwd_launch_hdim64(const fa_fwd_params *prm, fa_dtype dtype, int device_ordinal,
                                         cudaStream_t stream) {
    if (dtype == FA_DTYPE_BF16)
        return fa_fwd_launch<fa_bf16, 64>(prm, device_ordinal, stream, "flash forward kernel (bf16, d <= 64)");
    return fa_fwd_launch<fa_f16, 64>(prm, device_ordinal, stream, "flash forward kernel (f16, d <= 64)");
}
