/*
 * bench_run.h: the measurements of `flashattn bench`, called by the sweep (bench_cmd.c):
 *   bench_cpu.c     one CPU measurement in a forked child (time, peak RSS increase, error)
 *   bench_cuda.c    one CUDA measurement (events, cudaMemGetInfo, error)
 *   gemm_ref.c      the fp32 GEMM reference through a BLAS found at run time
 * They depend on bench_case.h only.
 */
#ifndef FA_TOOL_BENCH_RUN_H
#define FA_TOOL_BENCH_RUN_H

#include "bench_case.h"

void bench_run_cpu(const bench_case *c, bench_result *r);
void bench_run_cuda(const bench_case *c, bench_result *r);

/* ---- gemm_ref.c -------------------------------------------------------------------------- */
typedef struct gemm_result {
    int found;             /* a BLAS with cblas_sgemm was loaded                                 */
    char library[64];      /* which one                                                          */
    int n;
    double ms, gflops;
    char note[160];
} gemm_result;
void gemm_measure(int n, int threads, gemm_result *g);

#endif /* FA_TOOL_BENCH_RUN_H */
