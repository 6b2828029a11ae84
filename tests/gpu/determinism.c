/*
 * fa_gpu_determinism.c: the CUDA forward through the public API must give bitwise identical O and
 * LSE run to run (each output row is owned by one thread block, no atomics). Part of
 * `make gpu-test` (tests/gpu_test.sh); also a small workload for compute-sanitizer ("small").
 * Not in build/fa_tests: it needs a GPU. Exit status 0 = all identical and every call FA_OK.
 *
 * Usage: fa_gpu_determinism [small]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

typedef struct det_case {
    const char *name;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, causal, window_left;
    float softcap;
    int varlen;
} det_case;

static gpu_rng rng = {2463534242u};
static unsigned short random_bf16(void) { return gpu_float_to_16(gpu_random_uniform(&rng, -2.0f, 2.0f), FA_DTYPE_BF16); }

#define CHECK_CUDA(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            printf("FAIL %s: %s: %s\n", c->name, #call, cudaGetErrorString(e_));                  \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

/* Runs case c three times; returns 0 when every run succeeded with identical outputs. */
static int run_case(const det_case *c) {
    const int b = c->batch, sq = c->seqlen_q, sk = c->seqlen_k, hq = c->heads_q, hkv = c->heads_kv;
    const int d = c->head_dim, dv = c->head_dim_v;
    int cu_q[3] = {0, sq, sq + sq / 3}, cu_k[3] = {0, sk / 2, sk / 2 + sk};
    const long rows_q = c->varlen ? cu_q[2] : (long)b * sq, rows_k = c->varlen ? cu_k[2] : (long)b * sk;
    const size_t nq = (size_t)rows_q * hq * d, nk = (size_t)rows_k * hkv * d, nv = (size_t)rows_k * hkv * dv;
    const size_t no = (size_t)rows_q * hq * dv, nl = (size_t)rows_q * hq;
    unsigned short *h = malloc(2 * (nq + nk + nv));
    unsigned char *ref_o = malloc(2 * no), *got_o = malloc(2 * no), *ref_l = malloc(4 * nl), *got_l = malloc(4 * nl);
    for (size_t i = 0; i < nq + nk + nv; ++i) h[i] = random_bf16();
    gpu_fwd_buffers buf;
    const gpu_fwd_sizes sizes = {nq, nk, nv, no, nl, c->varlen ? 3u : 0u};
    const char *err = gpu_fwd_buffers_upload(&buf, &sizes, h, cu_q, cu_k);
    if (err != NULL) {
        printf("FAIL %s: %s\n", c->name, err);
        gpu_fwd_buffers_free(&buf);
        return 1;
    }
    fa_params p;
    gpu_fwd_params(&p, &buf, c->varlen ? 2 : b, sq, sk, hq, hkv, d, dv, c->varlen ? rows_q : 0, rows_k, c->causal,
                   c->window_left, c->softcap);
    void *o = buf.o;
    float *lse = buf.lse;
    int fail = 0;
    for (int run = 0; run < 3 && !fail; ++run) {
        CHECK_CUDA(cudaMemset(o, 0xff, 2 * no)); /* NaN poison: a skipped write shows as a diff */
        CHECK_CUDA(cudaMemset(lse, 0xff, 4 * nl));
        fa_status s = fa_forward(&p);
        if (s != FA_OK) {
            printf("FAIL %s: fa_forward: %s: %s\n", c->name, fa_strerror(s), fa_last_error());
            fail = 1;
            break;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(run == 0 ? ref_o : got_o, o, 2 * no, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(run == 0 ? ref_l : got_l, lse, 4 * nl, cudaMemcpyDeviceToHost));
        if (run > 0 && (memcmp(ref_o, got_o, 2 * no) != 0 || memcmp(ref_l, got_l, 4 * nl) != 0)) {
            printf("FAIL %s: run %d differs from run 0\n", c->name, run);
            fail = 1;
        }
    }
    if (!fail) printf("ok   %s: 3 runs bitwise identical\n", c->name);
    gpu_fwd_buffers_free(&buf);
    free(h), free(ref_o), free(got_o), free(ref_l), free(got_l);
    return fail;
}

int gpu_determinism_main(int argc, char **argv) {
    const int small = argc > 1 && strcmp(argv[1], "small") == 0;
    const det_case big_cases[] = {
        {"d128 causal GQA 8/2 s=1000", 2, 1000, 1000, 8, 2, 128, 128, 1, -1, 0.0f, 0},
        {"d64 sq=777 sk=1500", 2, 777, 1500, 4, 4, 64, 64, 0, -1, 0.0f, 0},
        {"d256/dv128 window softcap", 1, 600, 700, 4, 1, 256, 128, 0, 100, 15.0f, 0},
        {"d96 varlen causal", 2, 500, 450, 4, 2, 96, 96, 1, -1, 0.0f, 1},
        /* non-causal, even query tiles per head: the Hopper forward's K/V multicast pairs */
        {"d128 s=2048 GQA 8/4", 2, 2048, 2048, 8, 4, 128, 128, 0, -1, 0.0f, 0},
    };
    const det_case small_cases[] = {
        {"d64 causal s=130", 1, 130, 77, 2, 1, 64, 64, 1, -1, 0.0f, 0},
        {"d128 window softcap", 1, 70, 150, 2, 2, 128, 128, 0, 30, 10.0f, 0},
        {"d256 varlen", 1, 65, 90, 2, 1, 256, 256, 1, -1, 0.0f, 1},
        /* a K/V multicast pair (two query tiles per head), walking every tile under
         * FA_HOPPER_FWD_GRID_MAX=1 (tests/gpu_test.sh) */
        {"d128 sq=256 sk=150", 1, 256, 150, 2, 2, 128, 128, 0, -1, 0.0f, 0},
    };
    const det_case *cases = small ? small_cases : big_cases;
    const int n = small ? (int)(sizeof small_cases / sizeof small_cases[0])
                        : (int)(sizeof big_cases / sizeof big_cases[0]);
    int fails = 0;
    for (int i = 0; i < n; ++i) fails += run_case(&cases[i]);
    printf("fa_gpu_determinism: %d passed, %d failed\n", n - fails, fails);
    return fails ? 1 : 0;
}
