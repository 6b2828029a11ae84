/*
 * kvcache_large_sm90.cu: the large-head KV-cache decode kernel (kernels/kvcache_large_sm80.cuh)
 * with its two GEMMs on wgmma, for sm_90a (built by the Makefile's *_sm90*.cu rule); kvcache.cu
 * picks it on compute capability 9.0 when dv = 512 (fa_kvl_wgmma_ok), and the mma.sync instances
 * otherwise or with FA_CUDA_KVCACHE=portable.
 */
#include "cuda/kernels/kvcache_large_sm80.cuh"

extern "C" fa_status fa_kvl_launch_wgmma(const fa_kv_params *prm, fa_dtype dtype, int device_ordinal,
                                         cudaStream_t stream) {
    const bool bf16 = dtype == FA_DTYPE_BF16;
    if (prm->v_in_k)
        return bf16 ? fa_kvl_launch<fa_bf16, true, true>(prm, device_ordinal, stream,
                                                         "KV-cache decode kernel, large heads, wgmma, latent cache (bf16)")
                    : fa_kvl_launch<fa_f16, true, true>(prm, device_ordinal, stream,
                                                        "KV-cache decode kernel, large heads, wgmma, latent cache (f16)");
    return bf16 ? fa_kvl_launch<fa_bf16, false, true>(prm, device_ordinal, stream,
                                                      "KV-cache decode kernel, large heads, wgmma, separate K and V (bf16)")
                : fa_kvl_launch<fa_f16, false, true>(prm, device_ordinal, stream,
                                                     "KV-cache decode kernel, large heads, wgmma, separate K and V (f16)");
}
