/*
 * bench.h: types shared by the pieces of `flashattn bench`:
 *   bench_cmd.c     flag parsing, the configuration sweep, the default sweeps
 *   bench_cpu.c     one CPU measurement in a forked child (time, peak RSS increase, error)
 *   bench_cuda.c    one CUDA measurement (events, cudaMemGetInfo, error)
 *   bench_report.c  the aligned table and the JSON lines
 *   bench_sample.c  max |error| of a few output rows against the float64 reference
 *   gemm_ref.c      the fp32 GEMM reference through a BLAS found at run time
 */
#ifndef FA_TOOL_BENCH_H
#define FA_TOOL_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#define BENCH_MAX_REPEATS 1000

typedef enum bench_mode { BENCH_FWD = 0, BENCH_BWD = 1, BENCH_FWDBWD = 2 } bench_mode;
typedef enum bench_impl { IMPL_FLASH = 0, IMPL_STANDARD = 1 } bench_impl;

/* One configuration to measure. */
typedef struct bench_case {
    bench_impl impl;
    fa_device device;
    fa_dtype dtype;
    bench_mode mode;
    int64_t b, hq, hkv, sq, sk, d, dv;
    int causal;
    int use_window;
    int32_t window_left, window_right;
    int threads;        /* as passed to the library (0 = all cores)                              */
    int threads_used;   /* what that resolves to, for the report                                 */
    int repeats;        /* timed calls; 0 = adaptive (at least 3, more while under a time budget) */
    int warmups;        /* untimed calls before timing                                           */
    uint64_t seed;
    int deterministic;  /* fa_params.deterministic (the backward's bitwise-repeatable dq)          */
} bench_case;

/* Where extra_mem_bytes comes from. */
typedef enum bench_mem_source {
    MEM_RSS = 0,       /* peak VmHWM increase of a forked child over its RSS with inputs ready */
    MEM_WORKSPACE = 1, /* /proc unavailable: the workspace fa_check_* reports                  */
    MEM_CUDA = 2       /* workspace from fa_check_* plus the cudaMemGetInfo drop over the call  */
} bench_mem_source;

typedef enum bench_status { BENCH_OK = 0, BENCH_SKIPPED = 1, BENCH_FAILED = 2 } bench_status;

typedef struct bench_result {
    bench_status status;
    char note[200];          /* why skipped/failed, or a remark                                  */
    double ms;               /* median over the timed calls                                      */
    int timed_calls;
    double flops;            /* counted FLOPs of one call (see bench_flops)                      */
    size_t extra_mem_bytes;
    bench_mem_source mem_source;
    size_t workspace_bytes;  /* fa_check_* answer (flash only)                                   */
    int64_t device_mem_delta; /* CUDA: free-memory drop over the timed calls, bytes              */
    double max_abs_err;      /* against the float64 reference on sampled rows; < 0: not computed */
    char err_tensor[8];      /* which output the error is about: "o", "dq", "o+dq"                */
} bench_result;

/* ---- bench_cmd.c ---------------------------------------------------------------------------- */
int bench_main(int argc, char **argv);

/* ---- bench_decode.c: `flashattn bench --mode decode` (fa_kvcache_forward bandwidth) ------- */
int bench_decode_main(int argc, char **argv);

/* FLOPs of one call, FlashAttention's convention: forward 2·b·hq·sq·sk·(d + dv) (= 4·b·hq·sq·sk·d),
 * halved when causal without a window; with a window, the exact count of visible (query, key)
 * pairs replaces sq·sk. Backward 2.5× forward, forward+backward 3.5×. */
double bench_flops(const bench_case *c);

/* ---- measurements ------------------------------------------------------------------------- */
void bench_run_cpu(const bench_case *c, bench_result *r);
void bench_run_cuda(const bench_case *c, bench_result *r);

/* Fill p with the case's sizes, mask and threads (no tensors). */
void bench_case_params(const bench_case *c, fa_params *p);

/* Elements of each tensor of the case. */
typedef struct bench_sizes {
    size_t q, k, v, o, lse;
} bench_sizes;
bench_sizes bench_case_sizes(const bench_case *c);

/* Host tensors of one case (bench_tensors.c). */
typedef struct bench_tensors {
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
} bench_tensors;

/* Allocate and touch every tensor the case needs (dout, dq, dk, dv only with a backward), fill
 * q, k ~ N(0,1), v ~ N(0,1) + 0.5, dout ~ N(0,1) from the case's seed, and fill p (sizes, mask,
 * threads, pointers, contiguous strides). Returns 0 when out of memory. */
int bench_alloc_tensors(const bench_case *c, fa_params *p, bench_tensors *t);
void bench_free_tensors(bench_tensors *t);

/* ---- bench_sample.c ---------------------------------------------------------------------- */
/* Max |ours - float64 reference| over a few sampled query rows of one (batch, head), into
 * r->max_abs_err (-1 when it could not be computed) and r->err_tensor: o for the forward, dq for
 * the backward, the larger of both for fwdbwd. host_p describes the call just made with host
 * copies of every tensor (inputs and the outputs to check) in its dtype and layout. */
void bench_sample_errors(const bench_case *c, const fa_params *host_p, bench_result *r);

/* ---- gemm_ref.c -------------------------------------------------------------------------- */
typedef struct gemm_result {
    int found;             /* a BLAS with cblas_sgemm was loaded                                 */
    char library[64];      /* which one                                                          */
    int n;
    double ms, gflops;
    char note[160];
} gemm_result;
void gemm_measure(int n, int threads, gemm_result *g);

/* ---- bench_report.c ---------------------------------------------------------------------- */
const char *bench_impl_name(bench_impl impl);
const char *bench_mode_name(bench_mode mode);
void report_json(const bench_case *c, const bench_result *r, const gemm_result *g);
void report_json_gemm(const gemm_result *g, int threads);
void report_table_header(fa_device device, const gemm_result *g);
/* `baseline`: the standard result of the same configuration, or NULL (speed-up/memory columns). */
void report_table_row(const bench_case *c, const bench_result *r, const bench_result *baseline,
                      const gemm_result *g);
void report_gemm_line(const gemm_result *g, int threads);

/* Human-readable byte count ("12.3 MB") into buf. */
const char *bench_format_bytes(double bytes, char *buf, size_t size);
/* numerator / denominator as "12.3x" ("inf" when the denominator is 0). */
const char *bench_format_ratio(double numerator, double denominator, char *buf, size_t size);

#endif /* FA_TOOL_BENCH_H */
