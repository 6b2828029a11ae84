/*
 * fa_gpu_backward.c: the CUDA backward's repeatability check and compute-sanitizer driver
 * (tests/gpu_test.sh step 5):
 * a few small problems that between them reach every kernel path (head-dim buckets 64/128/256,
 * GQA with and without a split group, varlen with an empty sequence, masks, softcap, ALiBi,
 * sinks, deterministic mode, caller workspace). Inputs are random; memory behaviour and
 * run-to-run repeatability are checked here (each problem runs twice: dk and dv must match
 * bitwise, dq too in deterministic mode); check_bwd.py checks the values.
 *
 * Build (see tests/gpu_test.sh): cc -Iinclude -I$CUDA/include fa_gpu_backward.c libflashattn.a -lcudart ...
 * Usage: ./fa_gpu_backward [problem indexes]   (exit status 1 on any failure)
 *        compute-sanitizer --tool memcheck ./fa_gpu_backward [problem indexes]
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

#define CHECK_CUDA(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static gpu_rng rng = {12345u};
static float rnd(void) { return gpu_random_uniform(&rng, -1.0f, 1.0f); }

/* Device buffer of n 16-bit values (bf16 bit patterns of random numbers in [-1, 1)). */
static void *device_bf16(size_t n) {
    uint16_t *h = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) {
        h[i] = gpu_float_to_16(rnd(), FA_DTYPE_BF16);
    }
    void *d;
    CHECK_CUDA(cudaMalloc(&d, n * 2 + 16));
    CHECK_CUDA(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static float *device_f32(size_t n, float base, float spread) {
    float *h = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) h[i] = base + spread * rnd();
    float *d;
    CHECK_CUDA(cudaMalloc((void **)&d, n * 4 + 16));
    CHECK_CUDA(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct problem {
    const char *name;
    int64_t batch, sq, sk, hq, hkv, d, dv;
    int causal, window_left, window_right, alibi, sinks, deterministic, caller_workspace;
    float softcap;
    const int32_t *lens_q, *lens_k; /* varlen when non-NULL (batch entries)                    */
} problem;

static int run(const problem *pr) {
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = pr->batch;
    p.seqlen_q = pr->sq;
    p.seqlen_k = pr->sk;
    p.heads_q = pr->hq;
    p.heads_kv = pr->hkv;
    p.head_dim = pr->d;
    p.head_dim_v = pr->dv;
    int64_t rows_q = pr->batch * pr->sq, rows_k = pr->batch * pr->sk;
    int32_t *cu_q_dev = NULL, *cu_k_dev = NULL;
    if (pr->lens_q) {
        int32_t cu_q[17] = {0}, cu_k[17] = {0};
        for (int64_t b = 0; b < pr->batch; b++) {
            cu_q[b + 1] = cu_q[b] + pr->lens_q[b];
            cu_k[b + 1] = cu_k[b] + pr->lens_k[b];
        }
        rows_q = cu_q[pr->batch] + 2; /* two padding rows after the last sequence */
        rows_k = cu_k[pr->batch] + 2;
        CHECK_CUDA(cudaMalloc((void **)&cu_q_dev, sizeof cu_q));
        CHECK_CUDA(cudaMalloc((void **)&cu_k_dev, sizeof cu_k));
        CHECK_CUDA(cudaMemcpy(cu_q_dev, cu_q, sizeof cu_q, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(cu_k_dev, cu_k, sizeof cu_k, cudaMemcpyHostToDevice));
        p.cu_seqlens_q = cu_q_dev;
        p.cu_seqlens_k = cu_k_dev;
        p.total_q = rows_q;
        p.total_k = rows_k;
    }
    p.q = device_bf16((size_t)(rows_q * pr->hq * pr->d));
    p.k = device_bf16((size_t)(rows_k * pr->hkv * pr->d));
    p.v = device_bf16((size_t)(rows_k * pr->hkv * pr->dv));
    p.o = device_bf16((size_t)(rows_q * pr->hq * pr->dv));
    p.dout = device_bf16((size_t)(rows_q * pr->hq * pr->dv));
    p.dq = device_bf16((size_t)(rows_q * pr->hq * pr->d));
    p.dk = device_bf16((size_t)(rows_k * pr->hkv * pr->d));
    p.dv = device_bf16((size_t)(rows_k * pr->hkv * pr->dv));
    p.lse = device_f32((size_t)(rows_q * pr->hq), 6.0f, 1.0f);
    p.causal = pr->causal;
    p.use_window = pr->window_left >= 0 || pr->window_right >= 0;
    p.window_left = pr->window_left;
    p.window_right = pr->window_right;
    p.softcap = pr->softcap;
    float *alibi = pr->alibi ? device_f32((size_t)pr->hq, 0.2f, 0.1f) : NULL;
    float *sinks = pr->sinks ? device_f32((size_t)pr->hq, 0.0f, 1.0f) : NULL;
    float *dsink = pr->sinks ? device_f32((size_t)pr->hq, 0.0f, 0.0f) : NULL;
    p.alibi_slopes = alibi;
    p.sink_logits = sinks;
    p.dsink = dsink;
    p.deterministic = pr->deterministic;
    fa_set_contiguous_strides(&p);
    void *ws = NULL;
    if (pr->caller_workspace) {
        size_t bytes = 0;
        if (fa_check_backward(&p, &bytes) != FA_OK) {
            printf("FAIL %s: fa_check_backward: %s\n", pr->name, fa_last_error());
            return 1;
        }
        CHECK_CUDA(cudaMalloc(&ws, bytes + 1));
        p.workspace = ws;
        p.workspace_bytes = bytes;
    }
    /* Run twice; dk and dv must repeat bitwise in every mode, dq too in deterministic mode. */
    const size_t bytes_q = (size_t)(rows_q * pr->hq * pr->d) * 2, bytes_k = (size_t)(rows_k * pr->hkv * pr->d) * 2,
                 bytes_v = (size_t)(rows_k * pr->hkv * pr->dv) * 2;
    uint8_t *first = malloc(bytes_q + bytes_k + bytes_v + 1), *second = malloc(bytes_q + bytes_k + bytes_v + 1);
    fa_status st = FA_OK;
    cudaError_t e = cudaSuccess;
    for (int rep = 0; rep < 2 && st == FA_OK && e == cudaSuccess; rep++) {
        uint8_t *dst = rep == 0 ? first : second;
        st = fa_backward(&p);
        e = cudaDeviceSynchronize();
        if (st == FA_OK && e == cudaSuccess) {
            CHECK_CUDA(cudaMemcpy(dst, p.dq, bytes_q, cudaMemcpyDeviceToHost));
            CHECK_CUDA(cudaMemcpy(dst + bytes_q, p.dk, bytes_k, cudaMemcpyDeviceToHost));
            CHECK_CUDA(cudaMemcpy(dst + bytes_q + bytes_k, p.dv, bytes_v, cudaMemcpyDeviceToHost));
        }
    }
    int fail = st != FA_OK || e != cudaSuccess;
    const int dq_same = memcmp(first, second, bytes_q) == 0;
    const int dkdv_same = memcmp(first + bytes_q, second + bytes_q, bytes_k + bytes_v) == 0;
    if (!fail && (!dkdv_same || (pr->deterministic && !dq_same))) fail = 1;
    printf("%s %s: status %d (%s) %s; repeat: dq %s, dk/dv %s\n", fail ? "FAIL" : "ok", pr->name, (int)st,
           st == FA_OK ? "" : fa_last_error(), cudaGetErrorString(e), dq_same ? "same" : "differs",
           dkdv_same ? "same" : "DIFFER");
    free(first);
    free(second);
    void *bufs[] = {(void *)p.q, (void *)p.k, (void *)p.v, p.o, (void *)p.dout, p.dq, p.dk, p.dv,
                    p.lse, alibi, sinks, dsink, ws, cu_q_dev, cu_k_dev};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    return fail;
}

int gpu_backward_main(int argc, char **argv) {
    static const int32_t lq[3] = {100, 0, 37}, lk[3] = {150, 9, 37};
    const problem problems[] = {
        {"d64 varlen GQA causal sinks", 3, 100, 150, 4, 2, 64, 64, 1, -1, -1, 0, 1, 0, 0, 0.0f, lq, lk},
        {"d128 window alibi softcap deterministic", 1, 150, 170, 2, 2, 128, 128, 0, 40, 10, 1, 0, 1, 1, 5.0f, NULL, NULL},
        {"d256 MQA split group", 1, 130, 100, 8, 1, 256, 256, 1, -1, -1, 0, 0, 0, 0, 0.0f, NULL, NULL},
        {"d64 dv128 seqlen_q 0", 1, 0, 60, 2, 1, 64, 128, 0, -1, -1, 0, 1, 0, 0, 0.0f, NULL, NULL},
    };
    int fails = 0;
    /* Arguments (optional): indexes of the problems to run; default all. */
    for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++) {
        int wanted = argc <= 1;
        for (int a = 1; a < argc; a++) wanted |= (size_t)atoi(argv[a]) == i;
        if (wanted) fails += run(&problems[i]);
    }
    printf("fa_gpu_backward: %d failed\n", fails);
    return fails != 0;
}
