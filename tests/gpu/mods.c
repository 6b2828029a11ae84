/*
 * mods.c: `fa_gpu_tests mods`: the CUDA engine has no score bias, document ids or block-sparse
 * masks yet, so fa_forward, fa_backward, fa_kvcache_forward and the fa_check_* calls answer
 * FA_ERR_UNSUPPORTED with a message naming the field, and write nothing (o, lse, dq, dbias keep
 * their poison). Part of `make gpu-test` (tests/gpu_test.sh). Exit status 0 = every check held.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

static int failures;

#define EXPECT(cond, ...) GPU_EXPECT(failures, "mods", cond, __VA_ARGS__)

#define CUDA_OK(call) GPU_CUDA_OK("mods", call)

enum { B = 1, S = 64, H = 2, D = 64, N = B * S * H * D };

/* 1 if the n bytes at device address p all still hold `byte`. */
static int untouched(const void *p, size_t n, unsigned char byte) {
    unsigned char *host = malloc(n);
    CUDA_OK(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += host[i] != byte;
    free(host);
    return bad == 0;
}

typedef enum call { FORWARD, BACKWARD, KVCACHE } call;

static void expect_rejected(const char *label, const fa_params *p, call which, const char *field) {
    size_t ws = 0;
    fa_status check = which == FORWARD ? fa_check_forward(p, &ws) : which == BACKWARD ? fa_check_backward(p, &ws)
                                                                                       : fa_check_kvcache(p, &ws);
    EXPECT(check == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), field), "%s: fa_check_*: %s (%s)", label,
           fa_strerror(check), fa_last_error());
    fa_status s = which == FORWARD ? fa_forward(p) : which == BACKWARD ? fa_backward(p) : fa_kvcache_forward(p);
    EXPECT(s == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), field), "%s: %s (%s)", label, fa_strerror(s),
           fa_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT(untouched(p->o, sizeof(unsigned short) * N, 0x7f), "%s: o was written", label);
    EXPECT(untouched(p->lse, sizeof(float) * B * H * S, 0x7f), "%s: lse was written", label);
    if (which == BACKWARD) {
        EXPECT(untouched(p->dq, sizeof(unsigned short) * N, 0x7f), "%s: dq was written", label);
        if (p->dbias) EXPECT(untouched(p->dbias, sizeof(float) * S * S, 0x7f), "%s: dbias was written", label);
    }
}

int gpu_mods_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    if (!fa_cuda_available()) {
        printf("mods: no CUDA device\n");
        return 1;
    }
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *bias, *dbias, *lse, *ints;
    const size_t t = sizeof(unsigned short) * N;
    void **bufs[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++) {
        CUDA_OK(cudaMalloc(bufs[i], t));
        CUDA_OK(cudaMemset(*bufs[i], i < 5 ? 0 : 0x7f, t));
    }
    CUDA_OK(cudaMemset(o, 0x7f, t));
    CUDA_OK(cudaMalloc(&bias, sizeof(float) * S * S));
    CUDA_OK(cudaMemset(bias, 0, sizeof(float) * S * S));
    CUDA_OK(cudaMalloc(&dbias, sizeof(float) * S * S));
    CUDA_OK(cudaMemset(dbias, 0x7f, sizeof(float) * S * S));
    CUDA_OK(cudaMalloc(&lse, sizeof(float) * B * H * S));
    CUDA_OK(cudaMemset(lse, 0x7f, sizeof(float) * B * H * S));
    CUDA_OK(cudaMalloc(&ints, sizeof(int32_t) * 4 * S));
    CUDA_OK(cudaMemset(ints, 0, sizeof(int32_t) * 4 * S));

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = B;
    p.seqlen_q = p.seqlen_k = S;
    p.heads_q = p.heads_kv = H;
    p.head_dim = D;
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse;
    p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
    fa_set_contiguous_strides(&p);
    p.causal = 1;
    EXPECT(fa_check_forward(&p, NULL) == FA_OK, "base problem rejected: %s", fa_last_error());

    fa_params b = p;
    b.bias = bias;
    b.bias_row_stride = S;
    b.bias_col_stride = 1;
    expect_rejected("forward with bias", &b, FORWARD, "bias");
    b.dbias = dbias;
    b.dbias_row_stride = S;
    b.dbias_col_stride = 1;
    expect_rejected("backward with bias and dbias", &b, BACKWARD, "bias");

    fa_params m = p;
    m.block_q = m.block_k = 16;
    m.kv_num_blocks = (const int32_t *)ints;
    m.kv_indices = (const int32_t *)ints + S;
    m.block_index_row_stride = S / 16;
    expect_rejected("forward with a block mask", &m, FORWARD, "kv_num_blocks");
    expect_rejected("backward with a block mask", &m, BACKWARD, "kv_num_blocks");

    fa_params d = p;
    d.doc_ids_q = (const int32_t *)ints;
    d.doc_ids_k = (const int32_t *)ints + S;
    d.doc_ids_q_batch_stride = d.doc_ids_k_batch_stride = S;
    expect_rejected("forward with document ids", &d, FORWARD, "doc_ids");

    fa_params kv = p;
    kv.seqlen_q = 1;
    kv.bias = bias;
    kv.bias_row_stride = S;
    kv.bias_col_stride = 1;
    expect_rejected("kvcache with bias", &kv, KVCACHE, "bias");

    for (int i = 0; i < 8; i++) CUDA_OK(cudaFree(*bufs[i]));
    CUDA_OK(cudaFree(bias));
    CUDA_OK(cudaFree(dbias));
    CUDA_OK(cudaFree(lse));
    CUDA_OK(cudaFree(ints));
    printf("mods: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
