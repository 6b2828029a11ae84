/*
 * fa_cuda_stub.c: the CUDA engine's entry points for builds without nvcc (the Makefile compiles
 * this file only when no CUDA toolkit is found, or FA_NO_CUDA is set). Every call reports that
 * CUDA is not part of this build.
 */
#include "api/fa_internal.h"

int fa_cuda_built(void) { return 0; }
int fa_cuda_is_available(void) { return 0; }

static fa_status not_built(void) {
    return fa_set_error(FA_ERR_DEVICE, "device = FA_DEVICE_CUDA but this libflashattn was built "
                                       "without CUDA (rebuild with nvcc on PATH)");
}

fa_status fa_cuda_check_forward(const fa_problem *pb, size_t *workspace_bytes) {
    (void)pb;
    if (workspace_bytes) *workspace_bytes = 0;
    return not_built();
}
fa_status fa_cuda_check_backward(const fa_problem *pb, size_t *workspace_bytes) {
    (void)pb;
    if (workspace_bytes) *workspace_bytes = 0;
    return not_built();
}
fa_status fa_cuda_forward(const fa_problem *pb) {
    (void)pb;
    return not_built();
}
fa_status fa_cuda_backward(const fa_problem *pb) {
    (void)pb;
    return not_built();
}
fa_status fa_cuda_zero_tail_rows(const fa_tail_rows *t, int n, int64_t batch, void *stream) {
    (void)t, (void)n, (void)batch, (void)stream;
    return not_built();
}
fa_status fa_cuda_check_kvcache(const fa_problem *pb, size_t *workspace_bytes) {
    (void)pb;
    if (workspace_bytes) *workspace_bytes = 0;
    return not_built();
}
fa_status fa_cuda_kvcache_forward(const fa_problem *pb) {
    (void)pb;
    return not_built();
}
fa_status fa_cuda_merge_states(const fa_merge_params *m) {
    (void)m;
    return not_built();
}
