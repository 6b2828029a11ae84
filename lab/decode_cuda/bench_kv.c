/*
 * bench_kv.c: decode speed of fa_kvcache_forward on the GPU, no torch in the process.
 * bf16, one query token, 32 query heads / 8 kv heads, d = 128 (the anchors' decode shapes,
 * ../shared/anchors/README.md: cuDNN 1.5 TB/s at 1 × 8k, 4.2-4.4 TB/s at 32 × 8k and 8 × 64k),
 * contiguous and paged (page size 16 and 256; block table a random permutation). Effective
 * bandwidth = K + V bytes of the attended cache / time. Each timed call follows a 256 MB
 * cudaMemsetAsync (cold L2, as triton's do_bench); median of the runs.
 *
 * Build: cc -std=c11 -O2 -Iinclude -I/usr/local/cuda/include lab/decode_cuda/bench_kv.c build/libflashattn.a \
 *            -L/usr/local/cuda/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o build/bench_kv
 * Run:   build/bench_kv [num_splits (0 = heuristic)] [runs (default 30)]
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* One shape; page_size 0 = contiguous. Returns the median time in µs. */
static double bench(int batch, int seqlen, int page_size, int splits, int runs, void *flush, size_t flush_bytes) {
    const int hq = 32, hkv = 8, d = 128;
    const size_t kv_elems = (size_t)batch * seqlen * hkv * d;
    void *k, *v, *q, *o;
    float *lse;
    int32_t *seqlens, *table = NULL;
    CHECK(cudaMalloc(&k, 2 * kv_elems));
    CHECK(cudaMalloc(&v, 2 * kv_elems));
    CHECK(cudaMemset(k, 0x3c, 2 * kv_elems)); /* bf16 0x3c3c ≈ 0.0115: finite */
    CHECK(cudaMemset(v, 0x3c, 2 * kv_elems));
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
    for (int r = -3; r < runs; ++r) { /* 3 warm-up calls */
        CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, 0));
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

int main(int argc, char **argv) {
    const int splits = argc > 1 ? atoi(argv[1]) : 0;
    const int runs = argc > 2 ? atoi(argv[2]) : 30;
    if (!fa_cuda_available()) {
        printf("no CUDA device / library built without CUDA\n");
        return 2;
    }
    const size_t flush_bytes = (size_t)256 << 20;
    void *flush;
    CHECK(cudaMalloc(&flush, flush_bytes));
    static const int shapes[][2] = {{1, 8192}, {32, 8192}, {8, 65536}, {128, 2048}, {1, 65536}, {4, 16384}};
    static const int pages[] = {0, 16, 256};
    printf("bf16, sq 1, hq 32, hkv 8, d 128, num_splits %d (0 = heuristic), median of %d\n", splits, runs);
    printf("%6s %7s %6s %10s %10s\n", "batch", "seqlen", "page", "us", "TB/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i)
        for (size_t j = 0; j < sizeof pages / sizeof pages[0]; ++j) {
            const int batch = shapes[i][0], seqlen = shapes[i][1];
            const double us = bench(batch, seqlen, pages[j], splits, runs, flush, flush_bytes);
            const double bytes = 2.0 * 2.0 * batch * (double)seqlen * 8 * 128;
            printf("%6d %7d %6d %10.1f %10.3f\n", batch, seqlen, pages[j], us, bytes / (us * 1e-6) / 1e12);
            fflush(stdout);
        }
    CHECK(cudaFree(flush));
    return 0;
}
