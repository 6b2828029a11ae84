/*
 * kvcache_hdim128.cu: KV-cache decode kernels for head dims padded to 128 (see fa_kv_hdim_bucket),
 * f16 and bf16. One file per bucket so that the instantiations compile in parallel.
 */
#include "kvcache_kernel.cuh"

extern "C" fa_status fa_kv_launch_hdim128(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                                         cudaStream_t stream) {
    if (dtype == FA_DTYPE_BF16)
        return fa_kv_launch<fa_bf16, 128>(prm, device_ordinal, stream, "KV-cache decode kernel (bf16, d <= 128)");
    return fa_kv_launch<fa_f16, 128>(prm, device_ordinal, stream, "KV-cache decode kernel (f16, d <= 128)");
}
