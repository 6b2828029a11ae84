/*
 * gpu_standard.h: standard (materialised) attention on the GPU, the baseline of the CUDA
 * benchmark, written the way PyTorch's plain attention runs: S = scale·Q Kᵀ in fp32 (cuBLAS),
 * a row softmax with the mask (a small kernel compiled at run time with NVRTC, launched through
 * the driver API), P rounded to the input dtype, O = P V (cuBLAS, fp32 accumulation).
 * cuBLAS, NVRTC and the driver are loaded with dlopen(); forward only.
 */
#ifndef FA_TOOL_GPU_STANDARD_H
#define FA_TOOL_GPU_STANDARD_H

#include <stddef.h>

#include "cudart.h"
#include "flashattn.h"

typedef struct gpu_standard {
    const cudart_api *rt;
    float *scores;       /* [batch, heads_q, seqlen_q, seqlen_k] fp32                            */
    void *probs;         /* same shape, in the input dtype                                       */
    size_t bytes;        /* of scores + probs                                                   */
} gpu_standard;

/* Bytes of the materialised matrices for p's sizes. */
size_t gpu_standard_bytes(const fa_params *p);

/* Load the libraries, compile the kernel (once per process) and allocate the matrices for p's
 * sizes. Returns 0 with a message in `why` on failure (library missing, out of memory, ...). */
int gpu_standard_init(gpu_standard *st, const cudart_api *rt, const fa_params *p, char *why,
                      size_t why_size);

/* O = softmax(mask(scale·Q Kᵀ)) V for p (device pointers, contiguous [b, s, h, d] strides,
 * no softcap/ALiBi/sinks), on the default stream. Returns 0 with a message on failure. */
int gpu_standard_forward(gpu_standard *st, const fa_params *p, char *why, size_t why_size);

void gpu_standard_free(gpu_standard *st);

#endif /* FA_TOOL_GPU_STANDARD_H */
