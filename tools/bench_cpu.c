/*
 * bench_cpu.c: one CPU measurement of `flashattn bench`.
 *
 * Each measurement runs in a forked child so its memory is measured on its own: the child
 * allocates and touches every input and output, reads VmRSS from /proc/self/status, resets the
 * peak (writing "5" to /proc/self/clear_refs sets VmHWM to the current RSS), makes the warm-up and
 * timed calls, then reads VmHWM. The peak increase is everything the library allocated during the
 * calls: workspace, per-thread buffers, thread stacks it touched, the standard path's score matrix.
 * The child sends its bench_result back through a pipe. Where /proc is missing the calls run in
 * this process and the memory column falls back to the workspace fa_check_* reports.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_run.h"
#include "child.h"
#include "timing.h"

/* Adaptive timing: at least this many timed calls, more while under the time budget. */
#define ADAPTIVE_MIN_CALLS 3
#define ADAPTIVE_MAX_CALLS 10
#define ADAPTIVE_BUDGET_S 1.0

/* Value in bytes of a "VmXXX:   1234 kB" line of /proc/self/status; -1 if unavailable. */
static long long proc_status_bytes(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    size_t key_len = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, key_len) == 0 && line[key_len] == ':') {
            kb = strtoll(line + key_len + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Reset VmHWM to the current RSS; 0 when the kernel refuses. */
static int reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return (fclose(f) == 0) && ok;
}

/* One measured call: forward, backward, or both, of the case's implementation. */
static fa_status call_once(const bench_case *c, const fa_params *p) {
    if (c->impl == IMPL_STANDARD) return fa_standard_forward(p);
    fa_status st = FA_OK;
    if (c->mode != BENCH_BWD) st = fa_forward(p);
    if (st == FA_OK && c->mode != BENCH_FWD) st = fa_backward(p);
    return st;
}

static void set_failure(bench_result *r, fa_status st, const char *what) {
    r->status = BENCH_FAILED;
    snprintf(r->note, sizeof r->note, "%s: %s: %s", what, fa_strerror(st), fa_last_error());
}

/* Warm-up plus timed calls; fills r->ms and r->timed_calls. */
static int time_calls(const bench_case *c, const fa_params *p, bench_result *r) {
    double samples[BENCH_MAX_REPEATS];
    int max_calls = c->repeats > 0 ? c->repeats : ADAPTIVE_MAX_CALLS;
    for (int i = 0; i < c->warmups; i++) {
        fa_status st = call_once(c, p);
        if (st != FA_OK) { set_failure(r, st, "warm-up call"); return 0; }
    }
    double total = 0.0;
    int calls = 0;
    while (calls < max_calls) {
        double t0 = bench_now_seconds();
        fa_status st = call_once(c, p);
        double elapsed = bench_now_seconds() - t0;
        if (st != FA_OK) { set_failure(r, st, "timed call"); return 0; }
        samples[calls++] = elapsed;
        total += elapsed;
        if (c->repeats == 0 && calls >= ADAPTIVE_MIN_CALLS && total > ADAPTIVE_BUDGET_S) break;
    }
    r->ms = 1e3 * bench_median(samples, calls);
    r->timed_calls = calls;
    return 1;
}

/* Estimate of the standard path's buffers for the no-/proc fallback: one fp32 score row block of
 * seqlen_q × seqlen_k per worker. */
static size_t standard_estimate(const bench_case *c) {
    int64_t workers = c->threads_used < c->b * c->hq ? c->threads_used : c->b * c->hq;
    return (size_t)workers * (size_t)c->sq * (size_t)c->sk * sizeof(float);
}

/* The whole measurement; `use_proc`: measure the RSS (in a child) rather than report the workspace. */
static void measure(const bench_case *c, bench_result *r, int use_proc) {
    fa_params p;
    bench_tensors t;
    if (!bench_alloc_tensors(c, &p, &t)) {
        r->status = BENCH_FAILED;
        snprintf(r->note, sizeof r->note, "out of host memory for the inputs");
        return;
    }
    fa_status st = FA_OK;
    if (c->impl == IMPL_FLASH) {
        st = c->mode == BENCH_FWD ? fa_check_forward(&p, &r->workspace_bytes)
                                  : fa_check_backward(&p, &r->workspace_bytes);
        if (st == FA_OK && c->mode == BENCH_BWD) st = fa_forward(&p);
    }
    if (st != FA_OK) {
        set_failure(r, st, c->mode == BENCH_BWD ? "forward for the backward" : "check");
        bench_free_tensors(&t);
        return;
    }
    long long rss_before = use_proc ? proc_status_bytes("VmRSS") : -1;
    int peak_reset = use_proc && reset_peak_rss();
    long long hwm_before = use_proc ? proc_status_bytes("VmHWM") : -1;
    if (time_calls(c, &p, r)) {
        long long hwm_after = use_proc ? proc_status_bytes("VmHWM") : -1;
        if (rss_before >= 0 && hwm_after >= 0) {
            long long base = rss_before;
            if (!peak_reset && hwm_before > base) base = hwm_before;
            r->extra_mem_bytes = hwm_after > base ? (size_t)(hwm_after - base) : 0;
            r->mem_source = MEM_RSS;
            if (!peak_reset)
                snprintf(r->note, sizeof r->note, "VmHWM could not be reset: memory is a lower bound");
        } else {
            r->mem_source = MEM_WORKSPACE;
            r->extra_mem_bytes = c->impl == IMPL_FLASH ? r->workspace_bytes : standard_estimate(c);
            if (c->impl == IMPL_STANDARD)
                snprintf(r->note, sizeof r->note, "memory estimated: sq*sk floats per thread");
        }
        bench_sample_errors(c, &p, r);
    }
    bench_free_tensors(&t);
}

/* child_run() adapter: measure with the RSS. */
static void measure_child(const void *arg, void *out) { measure(arg, out, 1); }

void bench_run_cpu(const bench_case *c, bench_result *r) {
    if (bench_result_start(c, r)) return;
    if (proc_status_bytes("VmRSS") < 0) {
        measure(c, r, 0);
        return;
    }
    char why[sizeof r->note];
    bench_result child = *r;
    if (child_run(measure_child, c, &child, sizeof child, why, sizeof why)) {
        *r = child;
    } else {
        r->status = BENCH_FAILED;
        snprintf(r->note, sizeof r->note, "%s", why);
    }
}
