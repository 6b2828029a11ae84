/*
 * timing.h: the clock, the median and the memcpy bandwidth probe of the CPU benchmarks (the
 * flashattn tool's and the standalone bench/ggml_decode.c). Header-only, so that a program built
 * outside the library's Makefile can include it.
 */
#ifndef FA_TOOLS_TIMING_H
#define FA_TOOLS_TIMING_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Monotonic clock, seconds. */
static inline double bench_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of values[0..n) (sorts them in place). */
static inline double bench_median(double *values, int n) {
    qsort(values, (size_t)n, sizeof values[0], bench_compare_doubles);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

typedef struct bench_copy_job {
    char *dst;
    const char *src;
    size_t bytes;
} bench_copy_job;

static inline void *bench_copy_part(void *arg) {
    bench_copy_job *job = (bench_copy_job *)arg;
    memcpy(job->dst, job->src, job->bytes);
    return NULL;
}

/* One memcpy of `bytes` from src to dst split among `threads` threads (1..256; the caller copies
 * the first part, a part whose thread cannot start is copied by the caller too); seconds. */
static inline double bench_copy_seconds(char *dst, const char *src, size_t bytes, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    bench_copy_job jobs[256];
    pthread_t ids[256];
    int started[256] = {0};
    size_t part = bytes / (size_t)threads / 64 * 64;
    double t0 = bench_now_seconds();
    for (int t = 1; t < threads; t++) {
        size_t offset = (size_t)t * part;
        jobs[t] = (bench_copy_job){dst + offset, src + offset, t == threads - 1 ? bytes - offset : part};
        started[t] = pthread_create(&ids[t], NULL, bench_copy_part, &jobs[t]) == 0;
        if (!started[t]) bench_copy_part(&jobs[t]);
    }
    jobs[0] = (bench_copy_job){dst, src, threads > 1 ? part : bytes};
    bench_copy_part(&jobs[0]);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(ids[t], NULL);
    return bench_now_seconds() - t0;
}

#endif /* FA_TOOLS_TIMING_H */
