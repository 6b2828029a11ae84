/*
 * bwd_bigsmem_launch.h: extern "C" launchers of the backward main kernel v2, one per head-dim bucket
 * (defined in instances/bwd_sm80_hdim<bucket>.cu). Same parameters and contract as
 * fa_bwd_launch_hdim<bucket> (src/cuda/bwd_launch.h); the grid must be planned with the v2 block
 * size (fa_bwd_bigsmem_block_k) and the device must allow fa_bwd_bigsmem_smem_bytes of shared memory.
 */
#ifndef FA_BWD_BIGSMEM_LAUNCH_H
#define FA_BWD_BIGSMEM_LAUNCH_H

#include "cuda/common/bwd_bigsmem_tiles.h"
#include "cuda/common/bwd_launch.h"

extern "C" {
fa_status fa_bwd_bigsmem_launch_hdim64(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_bigsmem_launch_hdim128(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_bigsmem_launch_hdim256(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
/* With attention dropout (instances/bwd_sm80_bigsmem_dropout_hdim<bucket>.cu). */
fa_status fa_bwd_bigsmem_dropout_launch_hdim64(const fa_bwd_params *prm, const fa_dropout_params *dropout,
                                               fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_bigsmem_dropout_launch_hdim128(const fa_bwd_params *prm, const fa_dropout_params *dropout,
                                                fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd_bigsmem_dropout_launch_hdim256(const fa_bwd_params *prm, const fa_dropout_params *dropout,
                                                fa_dtype dtype, int grid, cudaStream_t stream);
}

#endif /* FA_BWD_BIGSMEM_LAUNCH_H */
