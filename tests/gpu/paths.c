/*
 * fa_gpu_paths.c: the CUDA forward's two kernels on problems large enough that every CTA of the
 * Hopper kernel's persistent grid walks several query tiles (snake order, Q of the next tile
 * loaded under the epilogue): the default kernel (the Hopper one on sm_90) against the portable
 * one (FA_CUDA_FORWARD=portable), which the randomised sweep checks against float64 on smaller
 * problems. Both round P to 16 bits before P·V, so they agree to a few 16-bit ulps of O; LSE is
 * fp32 on both. Outputs are NaN-poisoned before each call, so an unwritten element fails.
 * Packed GQA/MQA tiles (small seqlen_q, fa_hopper_pack_gqa): the cases with pack = 1 run the
 * default kernel with FA_CUDA_PACK_GQA=1 (packed whenever 2 query heads fit a tile), so small
 * problems the cost model would leave unpacked are packed too; pack = 0 leaves the choice to the
 * model. `fa_gpu_paths packed` runs only the packed cases (small: for compute-sanitizer).
 * Part of `make gpu-test` (tests/gpu_test.sh). Exit status 0 = every case agrees.
 */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

typedef struct path_case {
    const char *name;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, window_left;
    float softcap;
    int varlen; /* 3 sequences of seqlen_q·{1/3, 1, 2/3} queries and seqlen_k·{1, 1/2, 1} keys */
    int pack;   /* 1: FA_CUDA_PACK_GQA=1 for the default kernel; 0: unset (the cost model decides) */
    int sinks;  /* sink logits, a different one per query head */
    int alibi;  /* ALiBi slopes 2^(-8(h+1)/heads_q), per batch × head when 2 */
    float softmax_scale; /* 0: 1/sqrt(d) */
    int head_dim_v;      /* 0: head_dim */
} path_case;

static gpu_rng rng = {88172645u};
static unsigned short random_bf16(float offset) {
    return gpu_float_to_16(gpu_random_uniform(&rng, -2.0f, 2.0f) + offset, FA_DTYPE_BF16);
}

#define CHECK_CUDA(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            printf("FAIL %s: %s: %s\n", c->name, #call, cudaGetErrorString(e_));                  \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

static int run_case(const path_case *c) {
    const int hq = c->heads_q, hkv = c->heads_kv, d = c->head_dim, dv = c->head_dim_v > 0 ? c->head_dim_v : d;
    int cu_q[4] = {0, c->seqlen_q / 3, c->seqlen_q / 3 + c->seqlen_q, c->seqlen_q / 3 + c->seqlen_q + 2 * c->seqlen_q / 3};
    int cu_k[4] = {0, c->seqlen_k, c->seqlen_k + c->seqlen_k / 2, 2 * c->seqlen_k + c->seqlen_k / 2};
    const int batch = c->varlen ? 3 : c->batch;
    const long rows_q = c->varlen ? cu_q[3] : (long)batch * c->seqlen_q;
    const long rows_k = c->varlen ? cu_k[3] : (long)batch * c->seqlen_k;
    const size_t nq = (size_t)rows_q * hq * d, nk = (size_t)rows_k * hkv * d, nv = (size_t)rows_k * hkv * dv;
    const size_t no = (size_t)rows_q * hq * dv, nl = (size_t)rows_q * hq;
    unsigned short *h = malloc(2 * (nq + nk + nv)), *o_out[2] = {malloc(2 * no), malloc(2 * no)};
    float *l_out[2] = {malloc(4 * nl), malloc(4 * nl)};
    for (size_t i = 0; i < nq + nk + nv; ++i) h[i] = random_bf16(i >= nq + nk ? 0.5f : 0.0f); /* v offset */
    float *sink = NULL, *alibi = NULL;
    gpu_fwd_buffers buf;
    const gpu_fwd_sizes sizes = {nq, nk, nv, no, nl, c->varlen ? 4u : 0u};
    const char *err = gpu_fwd_buffers_upload(&buf, &sizes, h, cu_q, cu_k);
    if (err != NULL) {
        printf("FAIL %s: %s\n", c->name, err);
        gpu_fwd_buffers_free(&buf);
        return 1;
    }
    void *o = buf.o;
    float *lse = buf.lse;
    if (c->alibi) {
        const int n_slopes = c->alibi == 2 ? batch * hq : hq;
        float slope_h[1024];
        for (int i = 0; i < n_slopes && i < 1024; ++i)
            slope_h[i] = exp2f(-8.0f * (float)(i % hq + 1) / (float)hq) * (i >= hq ? 1.5f : 1.0f);
        CHECK_CUDA(cudaMalloc((void **)&alibi, sizeof(float) * (size_t)n_slopes));
        CHECK_CUDA(cudaMemcpy(alibi, slope_h, sizeof(float) * (size_t)n_slopes, cudaMemcpyHostToDevice));
    }
    if (c->sinks) {
        float sink_h[256];
        for (int i = 0; i < hq && i < 256; ++i) sink_h[i] = -1.5f + 0.37f * (float)(i % 11);
        CHECK_CUDA(cudaMalloc((void **)&sink, sizeof(float) * (size_t)hq));
        CHECK_CUDA(cudaMemcpy(sink, sink_h, sizeof(float) * (size_t)hq, cudaMemcpyHostToDevice));
    }

    fa_params p; /* varlen: seqlen_q / seqlen_k are the longest sequence (the middle one) */
    gpu_fwd_params(&p, &buf, batch, c->seqlen_q, c->seqlen_k, hq, hkv, d, dv, c->varlen ? rows_q : 0, rows_k,
                   c->causal, c->window_left, c->softcap);
    p.sink_logits = sink;
    p.alibi_slopes = alibi;
    p.alibi_batch_stride = c->alibi == 2 ? hq : 0;
    p.softmax_scale = c->softmax_scale;
    for (int path = 0; path < 2; ++path) { /* 0: default kernel, 1: portable */
        if (path == 1)
            setenv("FA_CUDA_FORWARD", "portable", 1);
        else
            unsetenv("FA_CUDA_FORWARD");
        if (path == 0 && c->pack)
            setenv("FA_CUDA_PACK_GQA", "1", 1);
        else
            unsetenv("FA_CUDA_PACK_GQA");
        CHECK_CUDA(cudaMemset(o, 0xff, 2 * no)); /* NaN poison */
        CHECK_CUDA(cudaMemset(lse, 0xff, 4 * nl));
        fa_status s = fa_forward(&p);
        if (s != FA_OK) {
            printf("FAIL %s: fa_forward (%s): %s: %s\n", c->name, path ? "portable" : "default", fa_strerror(s),
                   fa_last_error());
            return 1;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(o_out[path], o, 2 * no, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(l_out[path], lse, 4 * nl, cudaMemcpyDeviceToHost));
    }
    unsetenv("FA_CUDA_FORWARD");
    unsetenv("FA_CUDA_PACK_GQA");
    double max_o = 0.0, max_do = 0.0, max_dl = 0.0;
    long unwritten = 0;
    for (size_t i = 0; i < no; ++i) {
        const float a = gpu_float_from_16(o_out[0][i], FA_DTYPE_BF16), b = gpu_float_from_16(o_out[1][i], FA_DTYPE_BF16);
        if (isnan(a) || isnan(b)) {
            ++unwritten;
            continue;
        }
        if (fabs(b) > max_o) max_o = fabs(b);
        if (fabs(a - b) > max_do) max_do = fabs(a - b);
    }
    for (size_t i = 0; i < nl; ++i) {
        const float a = l_out[0][i], b = l_out[1][i];
        if (isnan(a) || isnan(b)) {
            ++unwritten;
            continue;
        }
        if (!(isinf(a) && isinf(b) && a == b) && fabs(a - b) > max_dl) max_dl = fabs(a - b);
    }
    /* a few bf16 ulps (2^-8 relative) of the largest output; LSE within 2e-3 */
    const int ok = unwritten == 0 && max_do <= 3.0 * 0.0078125 * max_o && max_dl <= 2e-3;
    printf("%s %s: max|O| %.3f, max|dO| %.2e, max|dLSE| %.2e, unwritten %ld\n", ok ? "ok  " : "FAIL", c->name, max_o,
           max_do, max_dl, unwritten);
    gpu_fwd_buffers_free(&buf);
    if (sink) cudaFree(sink);
    if (alibi) cudaFree(alibi);
    free(h), free(o_out[0]), free(o_out[1]), free(l_out[0]), free(l_out[1]);
    return !ok;
}

int gpu_paths_main(int argc, char **argv) {
    const path_case cases[] = {
        {"d128 s=4096 b=2 h=16", 2, 4096, 4096, 16, 16, 128, 0, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        /* K/V multicast pairs (even query tiles per head, no mask): buckets 128, 192, 256, sq != sk,
         * a partial last key tile, GQA, softcap, sinks; an odd tile count and bucket 64 (no pairs) */
        {"d256 s=2048 b=2 h=8", 2, 2048, 2048, 8, 8, 256, 0, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        {"d192 dv128 sq=1024 sk=1100 h=4", 2, 1024, 1100, 4, 4, 192, 0, -1, 0.0f, 0, 0, 0, 0, 0.0f, 128},
        {"d128 GQA 16/4 softcap sinks sq=1024 sk=1000", 2, 1024, 1000, 16, 4, 128, 0, -1, 30.0f, 0, 0, 1, 0, 0.0f, 0},
        {"d64 sq=768 sk=1500 h=12", 2, 768, 1500, 12, 12, 64, 0, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        {"d256 dv128 sq=512 sk=77 h=4", 3, 512, 77, 4, 4, 256, 0, -1, 0.0f, 0, 0, 0, 0, 0.0f, 128},
        {"d128 sq=640 sk=900 h=6 (odd query tiles)", 2, 640, 900, 6, 6, 128, 0, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        {"d128 causal s=4096 b=2 h=16 GQA 16/4", 2, 4096, 4096, 16, 4, 128, 1, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        {"d64 causal s=3000 b=2 h=32", 2, 3000, 3000, 32, 32, 64, 1, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        {"d256 causal s=2048 b=2 h=8", 2, 2048, 2048, 8, 8, 256, 1, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        {"d128 varlen causal h=16 softcap", 0, 3000, 3000, 16, 8, 128, 1, -1, 20.0f, 1, 0, 0, 0, 0.0f, 0},
        {"d64 window 300 sq=2000 sk=5000 h=16", 2, 2000, 5000, 16, 16, 64, 0, 300, 0.0f, 0, 0, 0, 0, 0.0f, 0},
        /* packed GQA/MQA tiles (pack = 1), sq 1..64, groups 2..16 */
        {"pack d128 GQA 32/8 causal sq=4 sk=1000", 2, 4, 1000, 32, 8, 128, 1, -1, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d128 GQA 8/4 sq=1 sk=517", 3, 1, 517, 8, 4, 128, 0, -1, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d128 MQA 16/1 causal sinks sq=7 sk=300", 2, 7, 300, 16, 1, 128, 1, -1, 0.0f, 0, 1, 1, 0, 0.0f, 0},
        {"pack d96 GQA 12/4 sq=5 sk=333", 2, 5, 333, 12, 4, 96, 0, -1, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d64 GQA 24/3 window 64 sq=13 sk=700", 2, 13, 700, 24, 3, 64, 0, 64, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d64 MQA 6/1 causal sq=64 sk=640 (3 heads/tile)", 1, 64, 640, 6, 1, 64, 1, -1, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d256 GQA 16/2 causal softcap sinks sq=33 sk=411 (3+3+2)", 2, 33, 411, 16, 2, 256, 1, -1, 30.0f, 0, 1, 1, 0, 0.0f, 0},
        {"pack d256 GQA 4/2 causal sq=sk=64", 3, 64, 64, 4, 2, 256, 1, -1, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d128 GQA 6/2 window 100 sinks sq=40 sk=2000", 2, 40, 2000, 6, 2, 128, 0, 100, 0.0f, 0, 1, 1, 0, 0.0f, 0},
        {"pack d128 GQA 8/2 causal sq=20 > sk=10 (rows with no key)", 2, 20, 10, 8, 2, 128, 1, -1, 0.0f, 0, 1, 0, 0, 0.0f, 0},
        {"pack d128 GQA 8/2 causal sinks sq=20 > sk=10", 2, 20, 10, 8, 2, 128, 1, -1, 0.0f, 0, 1, 1, 0, 0.0f, 0},
        /* ALiBi (per head, per batch × head) and a negative scale: scores in log2 units before the mask */
        {"d128 causal ALiBi s=2048 b=2 h=16 GQA 16/4", 2, 2048, 2048, 16, 4, 128, 1, -1, 0.0f, 0, 0, 0, 1, 0.0f, 0},
        {"d64 ALiBi (batch x head) softcap sinks sq=1000 sk=3000 h=8", 2, 1000, 3000, 8, 8, 64, 0, -1, 30.0f, 0, 0, 1, 2, 0.0f, 0},
        {"d256 varlen causal ALiBi h=8", 0, 1500, 1500, 8, 8, 256, 1, -1, 0.0f, 1, 0, 0, 1, 0.0f, 0},
        {"d128 causal scale -0.09 s=2048 b=2 h=8", 2, 2048, 2048, 8, 8, 128, 1, -1, 0.0f, 0, 0, 0, 0, -0.09f, 0},
        {"d64 window 200 scale -0.125 ALiBi sq=1500 sk=2500 h=8", 2, 1500, 2500, 8, 8, 64, 0, 200, 0.0f, 0, 0, 0, 1, -0.125f, 0},
        {"pack d128 GQA 16/2 causal ALiBi sq=9 sk=700", 2, 9, 700, 16, 2, 128, 1, -1, 0.0f, 0, 1, 0, 1, 0.0f, 0},
        /* d ≠ dv across the buckets (MLA's 192 / 128, 64 / 128): the larger bucket's kernel */
        {"d192 dv128 causal s=2048 b=2 GQA 16/4", 2, 2048, 2048, 16, 4, 192, 1, -1, 0.0f, 0, 0, 0, 0, 0.0f, 128},
        {"d192 dv128 varlen h=8", 0, 1500, 1500, 8, 8, 192, 0, -1, 0.0f, 1, 0, 0, 0, 0.0f, 128},
        {"d64 dv128 window 300 sq=2000 sk=3000 h=8", 2, 2000, 3000, 8, 8, 64, 0, 300, 0.0f, 0, 0, 0, 0, 0.0f, 128},
        {"pack d192 dv128 GQA 16/2 causal sq=7 sk=900", 2, 7, 900, 16, 2, 192, 1, -1, 0.0f, 0, 1, 0, 0, 0.0f, 128},
        /* the cost model's own choice on a decode-like batch (it packs: 512 -> 128 tiles) */
        {"model d128 GQA 32/8 causal sq=4 sk=2048 b=16", 16, 4, 2048, 32, 8, 128, 1, -1, 0.0f, 0, 0, 0, 0, 0.0f, 0},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    const int packed_only = argc > 1 && strcmp(argv[1], "packed") == 0;
    int fails = 0, runs = 0;
    for (int i = 0; i < n; ++i) {
        if (packed_only && !cases[i].pack) continue;
        fails += run_case(&cases[i]);
        ++runs;
    }
    printf("fa_gpu_paths: %d passed, %d failed\n", runs - fails, fails);
    return fails ? 1 : 0;
}
