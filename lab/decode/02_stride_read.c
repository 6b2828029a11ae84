/*
 * lab/decode/02_stride_read.c: one core reading a bf16 KV cache [ctx, 8 heads, 128] the way the
 * decode items do (one head at a time: 256 B rows 2 KB apart) versus sequentially, to see whether
 * the access pattern or the compute bounds fa_kvcache_forward on the CPU.
 *   cc -O2 -mavx512f -std=c11 -D_GNU_SOURCE lab/decode/02_stride_read.c -o /tmp/stride && /tmp/stride
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float sum_rows(const char *base, size_t rows, size_t stride, size_t row_bytes) {
    __m512 acc = _mm512_setzero_ps();
    for (size_t r = 0; r < rows; r++)
        for (size_t at = 0; at < row_bytes; at += 64)
            acc = _mm512_add_ps(acc, _mm512_loadu_ps((const float *)(base + r * stride + at)));
    return _mm512_reduce_add_ps(acc);
}

int main(void) {
    const size_t ctx = 65536, heads = 8, row = 256, bytes = ctx * heads * row;
    char *k = malloc(bytes);
    memset(k, 1, bytes);
    float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        sink += sum_rows(k, ctx * heads, row, row); /* sequential */
        double t1 = now();
        for (size_t h = 0; h < heads; h++) sink += sum_rows(k + h * row, ctx, heads * row, row); /* per head */
        double t2 = now();
        printf("sequential %.1f GB/s   per-head strided %.1f GB/s\n", bytes / (t1 - t0) * 1e-9, bytes / (t2 - t1) * 1e-9);
    }
    return sink == 1.0f;
}
