/*
 * sweep.h: the randomised correctness sweep behind `flashattn check`.
 *
 * Each case draws a problem (odd token counts 1..1023, sq != sk both ways, head dims 32..256,
 * GQA/MQA, varlen with empty sequences, causal / window / softcap / ALiBi / sinks and their
 * combinations, strided and packed layouts, every dtype the device takes: on the CPU also fp8
 * e4m3 inputs, through a bf16 problem quantised as reference.h describes), poisons the outputs
 * with NaN, runs fa_forward and fa_backward, and compares o, lse, dq, dk, dv, dsink with a
 * float64 reference: ok iff max|ours - ref64| <= 2·max|baseline - ref64| + floor, where the
 * baseline is standard attention computed in the input dtype (see reference.h). It also checks
 * that every output element was written, nothing around the outputs was, and the inputs are
 * unchanged. One line per case and direction, then a summary.
 *
 * CUDA: device buffers come from the CUDA runtime loaded with dlopen at run time, so this file
 * needs no CUDA headers; head dims the CUDA path rejects (fa_check_forward) are counted as
 * skipped, not passed.
 *
 * KV-cache decoding adds two families after those: fa_kvcache_forward cases (contiguous
 * and paged caches with pages of 1..256 tokens, appends with rotary, cache_batch_idx, left
 * padding, speculative / chunked query lengths, every mask feature, forced split counts) checked
 * by fa_kv_verify, and fa_merge_states cases (1..133 states with empty ones) checked by
 * fa_merge_verify. `only` picks a family; their cases are drawn from their own random stream, so
 * a seed reproduces them with or without the others.
 */
#ifndef FA_TESTS_SWEEP_H
#define FA_TESTS_SWEEP_H

#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"

typedef enum fa_sweep_level {
    FA_SWEEP_QUICK = 0, /* a few dozen cases, small shapes: seconds (part of `make test`)       */
    FA_SWEEP_FULL = 1   /* hundreds of cases up to 1023 tokens and d = 256: minutes              */
} fa_sweep_level;

/* Which families of cases run. */
typedef enum fa_sweep_only {
    FA_SWEEP_ALL = 0,       /* everything                                                        */
    FA_SWEEP_ATTENTION = 1, /* fa_forward / fa_backward cases only                               */
    FA_SWEEP_KVCACHE = 2    /* fa_kvcache_forward and fa_merge_states cases only                 */
} fa_sweep_only;

typedef struct fa_sweep_options {
    fa_device device;     /* FA_DEVICE_CPU or FA_DEVICE_CUDA                                   */
    fa_sweep_level level;
    int dtype_filter;     /* -1: every dtype the device supports; else an fa_dtype value       */
    uint64_t seed;        /* 0: a fresh random seed (printed); otherwise reproduces that run   */
    int verbose;          /* 1: also print tolerances and per-tensor errors of passing cases   */
    int num_threads;      /* CPU worker threads (fa_params.num_threads); 0 = all cores         */
    fa_sweep_only only;   /* families of cases (0 = all)                                       */
} fa_sweep_options;

/* Run the sweep, printing to `out`. Counts passed and failed checks (one per case and
 * direction) into *n_pass / *n_fail (either may be NULL). Returns 0 when everything ran and
 * passed, 1 when some case failed, 2 when the sweep could not run (CUDA not available, bad
 * options, out of memory); the reason is printed to `out`. */
int fa_sweep_run(const fa_sweep_options *opt, FILE *out, int *n_pass, int *n_fail);

#endif /* FA_TESTS_SWEEP_H */
