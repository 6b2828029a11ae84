/*
 * bench_case.h: one configuration of `flashattn bench` and its result, and what the measurements
 * share about a case: its FLOPs, sizes, fa_params and host tensors (bench_tensors.c) and the
 * sampled error against the float64 reference (bench_sample.c). Depends on nothing else of the
 * tool.
 */
#ifndef FA_TOOL_BENCH_CASE_H
#define FA_TOOL_BENCH_CASE_H

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
    float dropout_p;    /* fa_params.dropout_p (0: none), the mask seeded with `seed`             */
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

/* ---- bench_tensors.c ---------------------------------------------------------------------- */
/* FLOPs of one call, FlashAttention's convention: forward 2·b·hq·sq·sk·(d + dv) (= 4·b·hq·sq·sk·d),
 * halved when causal without a window; with a window, the exact count of visible (query, key)
 * pairs replaces sq·sk. Backward 2.5× forward, forward+backward 3.5×. */
double bench_flops(const bench_case *c);


/* Start a measurement's result: zeroed, FLOPs set, no error computed yet. Returns 1 (status
 * BENCH_SKIPPED, with the note) for what no measurement does: standard attention's backward. */
int bench_result_start(const bench_case *c, bench_result *r);

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

#endif /* FA_TOOL_BENCH_CASE_H */
