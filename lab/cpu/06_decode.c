/*
 * lab/cpu/06_decode.c: latency of decode-size calls (sq = 1), to see the thread pool's cost.
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude lab/cpu/06_decode.c build-cpu/libflashattn.a -lm -pthread
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

static void run(int sk, int hq, int hkv, int d, int threads) {
    size_t nq = (size_t)hq * d, nk = (size_t)sk * hkv * d;
    float *q = calloc(nq, 4), *k = calloc(nk, 4), *v = calloc(nk, 4), *o = calloc(nq, 4), *lse = calloc(hq, 4);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(i % 11) * 0.01f, v[i] = (float)(i % 5);
    fa_params p;
    memset(&p, 0, sizeof p);
    p.batch = 1, p.seqlen_q = 1, p.seqlen_k = sk, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse, p.num_threads = threads;
    fa_set_contiguous_strides(&p);
    double t_first = now();
    fa_forward(&p);
    t_first = now() - t_first;
    int iters = (int)(0.1 / (t_first + 1e-7)) + 1;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        for (int it = 0; it < iters; it++) fa_forward(&p);
        double t = (now() - t0) / iters;
        if (t < best) best = t;
    }
    double bytes = 2.0 * nk * 4;
    printf("decode sk=%5d hq=%2d hkv=%d d=%3d threads=%d: %8.1f us/call  (K+V %.1f GB/s)\n", sk, hq, hkv, d, threads,
           best * 1e6, bytes / best * 1e-9);
    free(q), free(k), free(v), free(o), free(lse);
}

int main(void) {
    for (int t = 1; t <= 2; t++) {
        run(128, 8, 8, 64, t);
        run(4096, 32, 8, 128, t);
        run(4096, 32, 32, 128, t);
    }
    return 0;
}
