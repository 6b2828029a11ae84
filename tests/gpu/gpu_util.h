/*
 * gpu_util.h: what the GPU test programs (tests/gpu/) share: the base seed of a randomised mode,
 * a small random-number generator for their inputs and the conversions between fp32 and the
 * 16-bit dtypes of their host buffers.
 */
#ifndef FA_GPU_UTIL_H
#define FA_GPU_UTIL_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "flashattn.h"
#include "oracle/reference.h"

/* A failed check of a GPU test mode: counted in `failures` and printed as "FAIL <mode>: <message>". */
#define GPU_EXPECT(failures, mode, cond, ...)                                                     \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            printf("FAIL %s: ", mode);                                                            \
            printf(__VA_ARGS__);                                                                  \
            printf("\n");                                                                         \
            (failures)++;                                                                         \
        }                                                                                         \
    } while (0)

/* A CUDA call a mode cannot go on without: on an error it prints the call and stops (exit 1). */
#define GPU_CUDA_OK(mode, call)                                                                   \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            printf("FAIL %s: %s: %s\n", mode, #call, cudaGetErrorString(e_));                     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* The base seed of a randomised mode: FA_TEST_SEED when set, else from the clock; printed as
 * "<mode>: seed N (FA_TEST_SEED=N reproduces)". */
uint64_t gpu_announce_seed(const char *mode);

/* Device mirrors of the oracle's host buffers (fa_test_buffer.device): upload allocates the
 * missing ones and copies every buffer that has a host array, download copies back every buffer
 * that has both (after a device synchronisation), release frees them. cudaSuccess, or the error
 * of the first call that failed. */
cudaError_t gpu_buffers_upload(fa_test_buffer *bufs, int count);
cudaError_t gpu_buffers_download(fa_test_buffer *bufs, int count);
cudaError_t gpu_buffers_release(fa_test_buffer *bufs, int count);

/* xorshift32; each program seeds its own (state != 0). */
typedef struct gpu_rng {
    uint32_t state;
} gpu_rng;

/* Uniform in [lo, hi). */
float gpu_random_uniform(gpu_rng *rng, float lo, float hi);

/* fp32 -> bf16 / f16 bits, round to nearest even (f16: |f| < 65504, subnormals exact). */
uint16_t gpu_float_to_16(float f, fa_dtype dtype);

/* bf16 / f16 bits -> fp32 (exact). */
float gpu_float_from_16(uint16_t x, fa_dtype dtype);

/* Device buffers of a bf16 forward problem: q, k, v uploaded from one host array (q, then k,
 * then v, contiguous), o and lse allocated, and the varlen offsets. */
typedef struct gpu_fwd_buffers {
    void *q, *k, *v, *o;
    float *lse;
    int *cu_q, *cu_k;
} gpu_fwd_buffers;

/* Element counts of the five tensors; cu_q / cu_k of cu_count entries each (0: fixed length). */
typedef struct gpu_fwd_sizes {
    size_t q, k, v, o, lse, cu_count;
} gpu_fwd_sizes;

/* Allocates and uploads. NULL on success, else a description of the CUDA call that failed
 * (whatever was allocated stays in b for gpu_fwd_buffers_free). */
const char *gpu_fwd_buffers_upload(gpu_fwd_buffers *b, const gpu_fwd_sizes *n, const uint16_t *host, const int *cu_q,
                                   const int *cu_k);
void gpu_fwd_buffers_free(gpu_fwd_buffers *b);

/* fa_params of a bf16 CUDA forward over b: shapes, pointers, contiguous strides, varlen offsets
 * when total_q > 0 (cu_seqlens and totals), causal and a left window (< 0: none), softcap. */
void gpu_fwd_params(fa_params *p, const gpu_fwd_buffers *b, int batch, int seqlen_q, int seqlen_k, int heads_q,
                    int heads_kv, int head_dim, int head_dim_v, long total_q, long total_k, int causal,
                    int window_left, float softcap);

#endif /* FA_GPU_UTIL_H */
