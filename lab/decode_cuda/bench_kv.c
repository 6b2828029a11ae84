/*
 * bench_kv.c: decode speed of fa_kvcache_forward on the GPU, no torch in the process.
 * bf16, one query token, 32 query heads / 8 kv heads, d = 128 (the anchors' decode shapes,
 * ../shared/anchors/README.md: cuDNN 1.5 TB/s at 1 × 8k, 4.2-4.4 TB/s at 32 × 8k and 8 × 64k),
 * contiguous and paged (block table a random permutation). Effective bandwidth = K + V bytes of
 * the attended cache / time; median of the runs, caller workspace.
 *
 * L2 state before each timed call ("flush"):
 *   dirty  a 256 MB cudaMemsetAsync (as triton's do_bench): the L2 ends full of dirty lines, so
 *          the call's first ~60 MB of misses also write those back to HBM
 *   clean  a decode call over another 256 MB cache: the L2 ends full of clean lines of it
 *   warm   nothing: a cache under the L2's 60 MB is still there from the previous call (the
 *          fixed cost: launch, ramp, merge)
 *   stream `runs` calls back to back over 8 copies of the cache (each cold in L2, clean), queued
 *          behind ~0.7 ms of memsets so the host never starves the GPU: GPU time per call with
 *          no launch latency or host time in it, at the clock a busy GPU runs at
 *
 * Build: cc -std=c11 -O2 -Iinclude -I/usr/local/cuda/include lab/decode_cuda/bench_kv.c build/libflashattn.a \
 *            -L/usr/local/cuda/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o build/bench_kv
 * Run:   build/bench_kv table [runs]    4 shapes × contiguous / page 1 / 16 / 256, dirty flush
 *        build/bench_kv detail [runs]   1 × 8k contiguous: split counts × dirty / clean / warm / stream
 *        build/bench_kv ncu             1 × 8k contiguous, 2 runs (for ncu's kernel durations)
 *        build/bench_kv [num_splits] [runs]   the original sweep (6 shapes × contiguous / 16 / 256)
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"

#define CHECK(call)                                                                               \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

enum { FLUSH_DIRTY, FLUSH_CLEAN, FLUSH_WARM, FLUSH_STREAM };

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

/* The "clean" flush: a decode call over an L2-sized-plus cache of its own (8 × 8k: 268 MB). */
static fa_params cleaner;

static void cleaner_init(void) {
    const int batch = 8, seqlen = 8192, hq = 32, hkv = 8, d = 128;
    const size_t kv_elems = (size_t)batch * seqlen * hkv * d;
    void *k, *v, *q, *o;
    CHECK(cudaMalloc(&k, 2 * kv_elems));
    CHECK(cudaMalloc(&v, 2 * kv_elems));
    CHECK(cudaMemset(k, 0x3c, 2 * kv_elems));
    CHECK(cudaMemset(v, 0x3c, 2 * kv_elems));
    CHECK(cudaMalloc(&q, (size_t)2 * batch * hq * d));
    CHECK(cudaMemset(q, 0x3c, (size_t)2 * batch * hq * d));
    CHECK(cudaMalloc(&o, (size_t)2 * batch * hq * d));
    memset(&cleaner, 0, sizeof cleaner);
    cleaner.device = FA_DEVICE_CUDA;
    cleaner.dtype = FA_DTYPE_BF16;
    cleaner.batch = batch;
    cleaner.seqlen_q = 1;
    cleaner.seqlen_k = seqlen;
    cleaner.heads_q = hq;
    cleaner.heads_kv = hkv;
    cleaner.head_dim = d;
    cleaner.q = q;
    cleaner.k = k;
    cleaner.v = v;
    cleaner.o = o;
    cleaner.q_head_stride = cleaner.o_head_stride = d;
    cleaner.q_row_stride = cleaner.q_batch_stride = (int64_t)hq * d;
    cleaner.o_row_stride = cleaner.o_batch_stride = (int64_t)hq * d;
    cleaner.k_head_stride = cleaner.v_head_stride = d;
    cleaner.k_row_stride = cleaner.v_row_stride = (int64_t)hkv * d;
    cleaner.k_batch_stride = cleaner.v_batch_stride = (int64_t)seqlen * hkv * d;
    cleaner.num_splits = 0; /* the heuristic: every SM streams */
}

/* One shape; page_size 0 = contiguous. Returns the median time in µs. */
static double bench(int batch, int seqlen, int page_size, int splits, int runs, void *flush, size_t flush_bytes,
                    int flush_mode) {
    const int hq = 32, hkv = 8, d = 128;
    const size_t kv_elems = (size_t)batch * seqlen * hkv * d;
    void *k, *v, *q, *o;
    float *lse;
    int32_t *seqlens, *table = NULL;
    const int copies = flush_mode == FLUSH_STREAM ? 8 : 1;
    CHECK(cudaMalloc(&k, 2 * kv_elems * copies));
    CHECK(cudaMalloc(&v, 2 * kv_elems * copies));
    CHECK(cudaMemset(k, 0x3c, 2 * kv_elems * copies)); /* bf16 0x3c3c ≈ 0.0115: finite */
    CHECK(cudaMemset(v, 0x3c, 2 * kv_elems * copies));
    CHECK(cudaMalloc(&q, (size_t)2 * batch * hq * d));
    CHECK(cudaMemset(q, 0x3c, (size_t)2 * batch * hq * d));
    CHECK(cudaMalloc(&o, (size_t)2 * batch * hq * d));
    CHECK(cudaMalloc((void **)&lse, (size_t)4 * batch * hq));
    int32_t *h_lens = malloc(sizeof(int32_t) * batch);
    for (int b = 0; b < batch; ++b) h_lens[b] = seqlen;
    CHECK(cudaMalloc((void **)&seqlens, sizeof(int32_t) * batch));
    CHECK(cudaMemcpy(seqlens, h_lens, sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
    free(h_lens);
    const int pages_per_seq = page_size ? seqlen / page_size : 0;
    if (page_size) {
        const int n = batch * pages_per_seq;
        int32_t *h = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; ++i) h[i] = i;
        srand(5);
        for (int i = n - 1; i > 0; --i) {
            int j = rand() % (i + 1), t = h[i];
            h[i] = h[j];
            h[j] = t;
        }
        CHECK(cudaMalloc((void **)&table, sizeof(int32_t) * n));
        CHECK(cudaMemcpy(table, h, sizeof(int32_t) * n, cudaMemcpyHostToDevice));
        free(h);
    }

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = batch;
    p.seqlen_q = 1;
    p.seqlen_k = seqlen;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.q_head_stride = d;
    p.q_row_stride = (int64_t)hq * d;
    p.q_batch_stride = (int64_t)hq * d;
    p.o_head_stride = d;
    p.o_row_stride = (int64_t)hq * d;
    p.o_batch_stride = (int64_t)hq * d;
    p.k_head_stride = p.v_head_stride = d;
    p.k_row_stride = p.v_row_stride = (int64_t)hkv * d;
    p.k_batch_stride = p.v_batch_stride = (int64_t)(page_size ? page_size : seqlen) * hkv * d;
    p.cache_seqlens = seqlens;
    if (page_size) {
        p.block_table = table;
        p.block_table_batch_stride = pages_per_seq;
        p.page_size = page_size;
        p.num_pages = (int64_t)batch * pages_per_seq;
    }
    p.num_splits = splits;
    /* a caller workspace (as an inference engine would keep one): no per-call pool allocation */
    size_t ws_bytes = 0;
    fa_status cs = fa_check_kvcache(&p, &ws_bytes);
    if (cs != FA_OK) {
        fprintf(stderr, "fa_check_kvcache: %s: %s\n", fa_strerror(cs), fa_last_error());
        exit(1);
    }
    void *ws = NULL;
    if (ws_bytes) {
        CHECK(cudaMalloc(&ws, ws_bytes));
        p.workspace = ws;
        p.workspace_bytes = ws_bytes;
    }

    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    float *times = malloc(sizeof(float) * runs);
    if (flush_mode == FLUSH_STREAM) {
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
            for (int i = 0; i < 8; ++i) CHECK(cudaMemsetAsync(flush, i, flush_bytes, 0));
            CHECK(cudaEventRecord(start, 0));
            const double host0 = now_us();
            for (int c = 0; c < runs; ++c) {
                p.k = (char *)k + (size_t)(c % copies) * 2 * kv_elems;
                p.v = (char *)v + (size_t)(c % copies) * 2 * kv_elems;
                if (fa_kvcache_forward(&p) != FA_OK) {
                    fprintf(stderr, "fa_kvcache_forward: %s\n", fa_last_error());
                    exit(1);
                }
            }
            const double host_us = now_us() - host0;
            CHECK(cudaEventRecord(stop, 0));
            CHECK(cudaEventSynchronize(stop));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, start, stop));
            if (host_us > 1000.0 * ms)
                fprintf(stderr, "stream: host enqueue %.0f us > GPU %.0f us\n", host_us, 1000.0 * ms);
            if (1000.0 * ms / runs < best) best = 1000.0 * ms / runs;
        }
        for (int r = 0; r < runs; ++r) times[r] = (float)(best / 1000.0);
    }
    for (int r = flush_mode == FLUSH_STREAM ? runs : -3; r < runs; ++r) { /* 3 warm-up calls */
        if (flush_mode == FLUSH_DIRTY) CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, 0));
        if (flush_mode == FLUSH_CLEAN && fa_kvcache_forward(&cleaner) != FA_OK) {
            fprintf(stderr, "cleaner: %s\n", fa_last_error());
            exit(1);
        }
        CHECK(cudaEventRecord(start, 0));
        fa_status s = fa_kvcache_forward(&p);
        if (s != FA_OK) {
            fprintf(stderr, "fa_kvcache_forward: %s: %s\n", fa_strerror(s), fa_last_error());
            exit(1);
        }
        CHECK(cudaEventRecord(stop, 0));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 0) times[r] = ms;
    }
    qsort(times, runs, sizeof(float), cmp_float);
    const double us = 1000.0 * times[runs / 2];
    free(times);
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
    CHECK(cudaFree(q));
    CHECK(cudaFree(o));
    CHECK(cudaFree(lse));
    CHECK(cudaFree(seqlens));
    if (table) CHECK(cudaFree(table));
    if (ws) CHECK(cudaFree(ws));
    return us;
}

/* K + V bytes of the shape (bf16, 8 kv heads, d 128) per second, in TB/s */
static double tbps(int batch, int seqlen, double us) {
    return 2.0 * 2.0 * batch * (double)seqlen * 8 * 128 / (us * 1e-6) / 1e12;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "0";
    const int named = !strcmp(mode, "table") || !strcmp(mode, "detail") || !strcmp(mode, "ncu");
    const int splits = named ? 0 : atoi(mode);
    const int runs = !strcmp(mode, "ncu") ? 2 : argc > 2 ? atoi(argv[2]) : 30;
    if (!fa_cuda_available()) {
        printf("no CUDA device / library built without CUDA\n");
        return 2;
    }
    const size_t flush_bytes = (size_t)256 << 20;
    void *flush;
    CHECK(cudaMalloc(&flush, flush_bytes));
    cleaner_init();
    if (!strcmp(mode, "ncu")) {
        const double us = bench(1, 8192, 0, 0, runs, flush, flush_bytes, FLUSH_DIRTY);
        printf("ncu mode: 1 x 8192 contiguous %.1f us\n", us);
    } else if (!strcmp(mode, "detail")) {
        static const int split_counts[] = {0, 16, 24, 32, 48, 64, 96, 128};
        printf("1 x 8192 contiguous, bf16, sq 1, hq 32, hkv 8, d 128, median of %d: us (TB/s)\n", runs);
        printf("%8s %16s %16s %16s %16s\n", "splits", "dirty", "clean", "warm", "stream");
        for (size_t i = 0; i < sizeof split_counts / sizeof split_counts[0]; ++i) {
            double us[4];
            for (int f = 0; f < 4; ++f) us[f] = bench(1, 8192, 0, split_counts[i], runs, flush, flush_bytes, f);
            printf("%8d", split_counts[i]);
            for (int f = 0; f < 4; ++f) printf(" %7.1f (%5.3f)", us[f], tbps(1, 8192, us[f]));
            printf("\n");
            fflush(stdout);
        }
    } else if (!strcmp(mode, "table")) {
        static const int shapes[][2] = {{1, 8192}, {32, 8192}, {8, 65536}, {128, 2048}};
        static const int pages[] = {0, 1, 16, 256};
        printf("bf16, sq 1, hq 32, hkv 8, d 128, heuristic splits, dirty flush, median of %d: "
               "TB/s (page / contiguous)\n", runs);
        printf("%6s %7s %16s %16s %16s %16s\n", "batch", "seqlen", "contiguous", "page 1", "page 16", "page 256");
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
            const int batch = shapes[i][0], seqlen = shapes[i][1];
            double t[4];
            for (size_t j = 0; j < 4; ++j)
                t[j] = tbps(batch, seqlen, bench(batch, seqlen, pages[j], 0, runs, flush, flush_bytes, FLUSH_DIRTY));
            printf("%6d %7d %9.3f       ", batch, seqlen, t[0]);
            for (size_t j = 1; j < 4; ++j) printf(" %7.3f (%4.0f%%)", t[j], 100.0 * t[j] / t[0]);
            printf("\n");
            fflush(stdout);
        }
    } else {
        static const int shapes[][2] = {{1, 8192}, {32, 8192}, {8, 65536}, {128, 2048}, {1, 65536}, {4, 16384}};
        static const int pages[] = {0, 16, 256};
        printf("bf16, sq 1, hq 32, hkv 8, d 128, num_splits %d (0 = heuristic), median of %d\n", splits, runs);
        printf("%6s %7s %6s %10s %10s\n", "batch", "seqlen", "page", "us", "TB/s");
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
            for (size_t j = 0; j < sizeof pages / sizeof pages[0]; ++j) {
                const int batch = shapes[i][0], seqlen = shapes[i][1];
                const double us = bench(batch, seqlen, pages[j], splits, runs, flush, flush_bytes, FLUSH_DIRTY);
                printf("%6d %7d %6d %10.1f %10.3f\n", batch, seqlen, pages[j], us, tbps(batch, seqlen, us));
                fflush(stdout);
            }
    }
    CHECK(cudaFree(flush));
    return 0;
}
