/*
 * lab/decode/01_cpu_decode_time.c: time fa_kvcache_forward alone on one decode shape (for perf).
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude lab/decode/01_cpu_decode_time.c build-dec/libflashattn.a -lm -pthread
 *   ./a.out [ctx] [threads] [dtype 0/1/2] [iters]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int ctx = argc > 1 ? atoi(argv[1]) : 8192, threads = argc > 2 ? atoi(argv[2]) : 0;
    fa_dtype dtype = argc > 3 ? (fa_dtype)atoi(argv[3]) : FA_DTYPE_BF16;
    int iters = argc > 4 ? atoi(argv[4]) : 50;
    const int hq = 32, hkv = 8, d = 128;
    size_t es = dtype == FA_DTYPE_F32 ? 4 : 2;
    size_t nkv = (size_t)ctx * hkv * d;
    char *k = malloc(nkv * es), *v = malloc(nkv * es), *q = calloc((size_t)hq * d, es), *o = calloc((size_t)hq * d, es);
    for (size_t i = 0; i < nkv * es; i++) k[i] = (char)(i * 7 % 61), v[i] = (char)(i * 5 % 37);
    if (dtype != FA_DTYPE_F32) for (size_t i = 1; i < nkv * es; i += 2) k[i] = 0x3c, v[i] = 0x3c;
    else for (size_t i = 3; i < nkv * es; i += 4) k[i] = 0x3c, v[i] = 0x3c;
    int32_t seqlen = ctx;
    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = dtype, p.batch = 1, p.seqlen_q = 1, p.seqlen_k = ctx, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
    fa_set_contiguous_strides(&p);
    p.q = q, p.k = k, p.v = v, p.o = o, p.cache_seqlens = &seqlen, p.num_threads = threads, p.num_splits = 0;
    for (int i = 0; i < 3; i++) fa_kvcache_forward(&p);
    double best = 1e9;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        if (fa_kvcache_forward(&p) != FA_OK) { printf("%s\n", fa_last_error()); return 1; }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("ctx %d threads %d dtype %d: best %.3f ms, %.2f GB/s of K+V\n", ctx, threads, (int)dtype, best * 1e3,
           2.0 * nkv * es / best * 1e-9);
    return 0;
}
