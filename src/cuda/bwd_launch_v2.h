/*
 * bwd_launch_v2.h: extern "C" launchers of the backward main kernel v2, one per head-dim bucket
 * (defined in src/cuda/bwd_hdim<bucket>.cu). Same parameters and contract as
 * fa_bwd_launch_hdim<bucket> (src/cuda/bwd_launch.h); the grid must be planned with the v2 block
 * size (fa_bwd2_block_k) and the device must allow fa_bwd2_smem_bytes of shared memory.
 */
#ifndef FA_BWD_LAUNCH_V2_H
#define FA_BWD_LAUNCH_V2_H

#include "bwd_tiles_v2.h"
#include "bwd_launch.h"

extern "C" {
fa_status fa_bwd2_launch_hdim64(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd2_launch_hdim128(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
fa_status fa_bwd2_launch_hdim256(const fa_bwd_params *prm, fa_dtype dtype, int grid, cudaStream_t stream);
}

#endif /* FA_BWD_LAUNCH_V2_H */
