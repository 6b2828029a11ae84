/*
 * lab/cpu/03_bench.c: GFLOP/s of the CPU engine (forward, backward, standard baseline) against
 * OpenBLAS sgemm n=2048 measured in the same run.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc lab/cpu/03_bench.c build-cpu/libflashattn.a \
 *      -lopenblas -lm -pthread -o build-cpu/bench && ./build-cpu/bench [threads] [reps] [what]
 *   what: all | fwd | bwd | std | gemm    (FA_CPU_ISA is honoured)
 *
 * FLOPs: forward 4·b·hq·sq·sk·d (halved for causal), backward 2.5× forward, sgemm 2·n³.
 * Prints best and median over `reps` runs (the machine is shared: use the best).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                 int ldb, float beta, float *c, int ldc);
void openblas_set_num_threads(int n);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process: on a shared machine, cpu_time / threads is the wall time the
 * call would take with the cores to itself (if its threads are balanced). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int bench_threads = 1;
static double cpu_times[64];

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef fa_status (*call_fn)(const fa_params *);

static void report(const char *what, double flops, double *times, int reps) {
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    qsort(cpu_times, (size_t)reps, sizeof(double), cmp_double);
    printf("%-40s wall: best %6.1f median %6.1f GFLOP/s (%.1f ms) | cpu-time: best %6.1f GFLOP/s\n", what,
           flops / times[0] * 1e-9, flops / times[reps / 2] * 1e-9, times[0] * 1e3,
           flops / (cpu_times[0] / bench_threads) * 1e-9);
}

static double sgemm_rate(int threads, int reps) {
    int n = 2048;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    openblas_set_num_threads(threads);
    double times[64];
    cblas_sgemm(101, 111, 111, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    for (int r = 0; r < reps; r++) {
        double t0 = now(), c0 = cpu_now();
        cblas_sgemm(101, 111, 111, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        times[r] = now() - t0;
        cpu_times[r] = cpu_now() - c0;
    }
    char name[64];
    snprintf(name, sizeof name, "sgemm n=2048 threads=%d", threads);
    report(name, 2.0 * n * n * n, times, reps);
    free(a), free(b), free(c);
    return 2.0 * n * n * n / times[0] * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *what = argc > 3 ? argv[3] : "all";
    int only_d = argc > 4 ? atoi(argv[4]) : 0;
    bench_threads = threads;
    int all = strcmp(what, "all") == 0;
    printf("ISA %s, threads %d, reps %d\n", fa_cpu_isa(), threads, reps);
    if (all || strcmp(what, "gemm") == 0) sgemm_rate(threads, reps);

    int b = 1, hq = 16, s = 2048;
    int dims[2] = {64, 128};
    for (int di = 0; di < 2; di++) {
        int d = dims[di];
        if (only_d && d != only_d) continue;
        size_t n = (size_t)b * s * hq * d;
        float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *dout = malloc(n * 4);
        float *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4), *lse = malloc((size_t)b * hq * s * 4);
        srand(1);
        for (size_t i = 0; i < n; i++) {
            q[i] = (float)rand() / RAND_MAX - 0.5f;
            k[i] = (float)rand() / RAND_MAX - 0.5f;
            v[i] = (float)rand() / RAND_MAX;
            dout[i] = (float)rand() / RAND_MAX - 0.5f;
        }
        for (int causal = 0; causal < 2; causal++) {
            fa_params p;
            memset(&p, 0, sizeof p);
            p.dtype = FA_DTYPE_F32;
            p.batch = b, p.seqlen_q = s, p.seqlen_k = s, p.heads_q = hq, p.heads_kv = hq, p.head_dim = d;
            p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
            fa_set_contiguous_strides(&p);
            p.causal = causal;
            p.num_threads = threads;
            double fwd_flops = 4.0 * b * hq * (double)s * s * d * (causal ? 0.5 : 1.0);
            struct {
                const char *name;
                call_fn fn;
                double flops;
            } calls[3] = {{"fwd", fa_forward, fwd_flops}, {"bwd", fa_backward, 2.5 * fwd_flops},
                          {"std", fa_standard_forward, fwd_flops}};
            fa_forward(&p);
            for (int ci = 0; ci < 3; ci++) {
                if (!all && strcmp(what, calls[ci].name) != 0) continue;
                double times[64];
                if (calls[ci].fn(&p) != FA_OK) {
                    printf("error: %s\n", fa_last_error());
                    return 1;
                }
                for (int r = 0; r < reps; r++) {
                    double t0 = now(), c0 = cpu_now();
                    calls[ci].fn(&p);
                    times[r] = now() - t0;
                    cpu_times[r] = cpu_now() - c0;
                }
                char name[96];
                snprintf(name, sizeof name, "%s d=%d %s b=%d hq=%d s=%d", calls[ci].name, d,
                         causal ? "causal" : "full  ", b, hq, s);
                report(name, calls[ci].flops, times, reps);
            }
        }
        free(q), free(k), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
    }
    return 0;
}
