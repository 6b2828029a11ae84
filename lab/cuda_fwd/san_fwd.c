/*
 * san_fwd.c: a few small CUDA forward calls for compute-sanitizer (memcheck, racecheck), no torch.
 * Exits non-zero if a call fails or an output is not finite where it must be.
 * Usage: compute-sanitizer --tool memcheck build-lab/san_fwd
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

int lab_forward(const fa_params *p);
const char *lab_last_error(void);

static unsigned short to_bf16(float x) {
    unsigned int u;
    memcpy(&u, &x, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* One call on dense [b, s, h, d] tensors; varlen packs `batch` sequences of the given lengths. */
static int run_case(const char *name, int batch, int sq, int sk, int hq, int hkv, int d, int dv,
                    int causal, int wl, int wr, float softcap, int alibi, int sink, int varlen) {
    const int *lens_q = NULL;
    int lq[3] = {sq, 0, sq / 2 + 1}, lk[3] = {sk, sk / 3, 0};
    long rows_q = (long)batch * sq, rows_k = (long)batch * sk;
    int cu_q[4] = {0}, cu_k[4] = {0};
    if (varlen) {
        batch = 3;
        lens_q = lq;
        for (int b = 0; b < 3; ++b) {
            cu_q[b + 1] = cu_q[b] + lq[b];
            cu_k[b + 1] = cu_k[b] + lk[b];
        }
        rows_q = cu_q[3];
        rows_k = cu_k[3];
    }
    (void)lens_q;
    size_t nq = (size_t)rows_q * hq * d, nk = (size_t)rows_k * hkv * d, nv = (size_t)rows_k * hkv * dv,
           no = (size_t)rows_q * hq * dv;
    unsigned short *h = malloc(2 * (nq + nk + nv + 1));
    for (size_t i = 0; i < nq + nk + nv; ++i) h[i] = to_bf16((float)rand() / RAND_MAX - 0.3f);
    void *q, *k, *v, *o;
    float *lse, *slopes, *sinks;
    int *dcu_q, *dcu_k;
    cudaMalloc(&q, 2 * nq + 16);
    cudaMalloc(&k, 2 * nk + 16);
    cudaMalloc(&v, 2 * nv + 16);
    cudaMalloc(&o, 2 * no + 16);
    cudaMalloc((void **)&lse, 4 * (size_t)hq * rows_q + 16);
    cudaMalloc((void **)&slopes, 4 * hq * 4);
    cudaMalloc((void **)&sinks, 4 * hq);
    cudaMalloc((void **)&dcu_q, sizeof cu_q);
    cudaMalloc((void **)&dcu_k, sizeof cu_k);
    cudaMemcpy(q, h, 2 * nq, cudaMemcpyHostToDevice);
    cudaMemcpy(k, h + nq, 2 * nk, cudaMemcpyHostToDevice);
    cudaMemcpy(v, h + nq + nk, 2 * nv, cudaMemcpyHostToDevice);
    float hs[64];
    for (int i = 0; i < 64; ++i) hs[i] = 0.05f * (i % 7) + 0.01f;
    cudaMemcpy(slopes, hs, 4 * hq, cudaMemcpyHostToDevice);
    cudaMemcpy(sinks, hs, 4 * hq, cudaMemcpyHostToDevice);
    cudaMemcpy(dcu_q, cu_q, sizeof cu_q, cudaMemcpyHostToDevice);
    cudaMemcpy(dcu_k, cu_k, sizeof cu_k, cudaMemcpyHostToDevice);

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = batch;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.q_row_stride = (long)hq * d, p.q_head_stride = d, p.q_batch_stride = (long)sq * hq * d;
    p.k_row_stride = (long)hkv * d, p.k_head_stride = d, p.k_batch_stride = (long)sk * hkv * d;
    p.v_row_stride = (long)hkv * dv, p.v_head_stride = dv, p.v_batch_stride = (long)sk * hkv * dv;
    p.o_row_stride = (long)hq * dv, p.o_head_stride = dv, p.o_batch_stride = (long)sq * hq * dv;
    p.causal = causal;
    p.use_window = wl >= 0 || wr >= 0;
    p.window_left = wl;
    p.window_right = wr;
    p.softcap = softcap;
    if (alibi) p.alibi_slopes = slopes;
    if (sink) p.sink_logits = sinks;
    if (varlen) {
        p.cu_seqlens_q = dcu_q;
        p.cu_seqlens_k = dcu_k;
        p.total_q = rows_q;
        p.total_k = rows_k;
    }
    int fail = 0;
    int s = lab_forward(&p);
    cudaError_t e = cudaDeviceSynchronize();
    if (s != 0 || e != cudaSuccess) {
        printf("FAIL %s: status %d (%s), cuda %s\n", name, s, lab_last_error(), cudaGetErrorString(e));
        fail = 1;
    } else {
        unsigned short *ho = malloc(2 * no + 2);
        cudaMemcpy(ho, o, 2 * no, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < no; ++i) {
            unsigned int u = (unsigned int)ho[i] << 16;
            float f;
            memcpy(&f, &u, 4);
            if (!isfinite(f)) {
                printf("FAIL %s: o[%zu] not finite\n", name, i);
                fail = 1;
                break;
            }
        }
        free(ho);
        if (!fail) printf("ok   %s\n", name);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(slopes);
    cudaFree(sinks), cudaFree(dcu_q), cudaFree(dcu_k);
    free(h);
    return fail;
}

int main(int argc, char **argv) {
    int fail = 0;
    if (argc > 1 && strcmp(argv[1], "big") == 0) { /* bench shapes, no sanitizer */
        for (int s = 512; s <= 4096; s *= 2) {
            char name[64];
            snprintf(name, sizeof name, "big s=%d d=64", s);
            fail |= run_case(name, 16384 / s, s, s, 32, 32, 64, 64, 0, -1, -1, 0, 0, 0, 0);
        }
        return fail;
    }
    fail |= run_case("d64 sq=130 sk=77 causal", 2, 130, 77, 4, 2, 64, 64, 1, -1, -1, 0, 0, 0, 0);
    fail |= run_case("d128 sq=70 sk=200 window+alibi+sink", 1, 70, 200, 2, 1, 128, 128, 0, 30, 5, 0, 1, 1, 0);
    fail |= run_case("d256/dv128 sq=129 sk=65 softcap", 1, 129, 65, 2, 2, 256, 128, 0, -1, -1, 20.f, 0, 0, 0);
    fail |= run_case("d96 varlen (empty seqs) causal", 3, 150, 140, 4, 4, 96, 96, 1, -1, -1, 0, 0, 1, 1);
    fail |= run_case("d64 sk=0", 1, 33, 0, 2, 1, 64, 64, 0, -1, -1, 0, 0, 0, 0);
    printf("%s\n", fail ? "san_fwd: FAILED" : "san_fwd: all ok");
    return fail;
}
