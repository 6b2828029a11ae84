/*
 * fa_ring_cuda_stub.c: the CUDA side of ring attention (src/ring/ring_nccl.cu) for builds
 * without nvcc (the Makefile compiles this file only then): no CUDA backend, no NCCL transport.
 */
#include <stddef.h>

#include "api/fa_internal.h"
#include "ring/fa_ring.h"

const fa_ring_backend *fa_cuda_ring_backend(void) { return NULL; }

fa_status fa_cuda_ring_comm_nccl(void *nccl_comm, void *comm_stream, fa_ring_comm *comm, int *rank,
                                 int *world_size) {
    (void)nccl_comm;
    (void)comm_stream;
    (void)comm;
    (void)rank;
    (void)world_size;
    return fa_set_error(FA_ERR_UNSUPPORTED,
                        "fa_ring_comm_nccl: this libflashattn was built without NCCL (built without "
                        "CUDA: rebuild with nvcc on PATH and nccl.h installed)");
}

void fa_cuda_ring_comm_nccl_release(fa_ring_comm *comm) { (void)comm; }

int fa_cuda_ring_nccl_built(void) { return 0; }
