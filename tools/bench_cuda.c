/*
 * bench_cuda.c: one CUDA measurement of `flashattn bench`, through the runtime loaded by cudart.c.
 *
 * Inputs are generated on the host (bench_tensors.c), copied to the device, and, when one set of
 * inputs is smaller than twice the L2 cache, copied several times so consecutive calls rotate
 * through them and do not run from a warm L2. The caller-side workspace fa_check_* asks for is
 * allocated here and passed in. Timing: warm-up calls, then one pair of CUDA events per call on
 * the default stream, median. Memory: the workspace plus the drop of cudaMemGetInfo's free bytes
 * from before the first call to after the last (anything the library allocated and kept).
 * Standard attention (gpu_standard.c) is measured the same way; its "workspace" is the score and
 * probability matrices it materialises, and it is skipped when they do not fit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_run.h"
#include "cli.h"
#include "cudart.h"
#include "gpu_standard.h"

#define MAX_INPUT_SETS 8
#define ADAPTIVE_MIN_CALLS 10
#define ADAPTIVE_BUDGET_MS 1000.0
#define STANDARD_HEADROOM ((size_t)1 << 30) /* free memory left to cuBLAS and the rest         */

/* One copy of everything a call reads (o and lse are read by the backward). */
typedef struct device_set {
    void *q, *k, *v, *o, *dout;
    float *lse;
} device_set;

typedef struct cuda_run {
    const cudart_api *rt;
    device_set sets[MAX_INPUT_SETS];
    int n_sets;
    void *dq, *dk, *dv, *workspace;
    gpu_standard *standard; /* the baseline's matrices when measuring standard attention        */
    bench_result *r;
} cuda_run;

/* Record a failed CUDA call in the result; returns 1 when err is success. */
static int cuda_ok(cuda_run *run, int err, const char *what) {
    if (err == 0) return 1;
    if (run->r->status != BENCH_FAILED) {
        run->r->status = BENCH_FAILED;
        snprintf(run->r->note, sizeof run->r->note, "%s: %s", what,
                 run->rt->get_error_string(err));
    }
    return 0;
}

static int device_copy_of(cuda_run *run, void **dst, const void *src, size_t bytes) {
    if (!cuda_ok(run, run->rt->malloc_(dst, bytes ? bytes : 1), "cudaMalloc")) return 0;
    if (!src) return cuda_ok(run, run->rt->memset_(*dst, 0, bytes), "cudaMemset");
    return cuda_ok(run, run->rt->memcpy_(*dst, src, bytes, CUDART_HOST_TO_DEVICE), "cudaMemcpy");
}

static void free_run(cuda_run *run) {
    for (int s = 0; s < run->n_sets; s++) {
        device_set *set = &run->sets[s];
        void *ptrs[] = {set->q, set->k, set->v, set->o, set->dout, set->lse};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            if (ptrs[i]) run->rt->free_(ptrs[i]);
    }
    void *shared[] = {run->dq, run->dk, run->dv, run->workspace};
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++)
        if (shared[i]) run->rt->free_(shared[i]);
}

/* Input sets to rotate through: enough to cover twice the L2 cache, at most MAX_INPUT_SETS. */
static int input_set_count(const cuda_run *run, size_t set_bytes) {
    int l2_bytes = 0, device = 0;
    run->rt->get_device(&device);
    if (run->rt->device_get_attribute(&l2_bytes, CUDART_ATTR_L2_BYTES, device) != 0) l2_bytes = 0;
    if (set_bytes == 0 || set_bytes >= 2 * (size_t)l2_bytes) return 1;
    size_t sets = 2 * (size_t)l2_bytes / set_bytes + 1;
    return sets > MAX_INPUT_SETS ? MAX_INPUT_SETS : (int)sets;
}

static int upload(const bench_case *c, const bench_tensors *host, cuda_run *run) {
    bench_sizes n = bench_case_sizes(c);
    size_t es = cli_dtype_size(c->dtype);
    int backward = c->mode != BENCH_FWD;
    size_t set_bytes = (n.q + n.k + n.v + (backward ? 2 * n.o : 0)) * es;
    run->n_sets = input_set_count(run, set_bytes);
    for (int s = 0; s < run->n_sets; s++) {
        device_set *set = &run->sets[s];
        if (!device_copy_of(run, &set->q, host->q, n.q * es) ||
            !device_copy_of(run, &set->k, host->k, n.k * es) ||
            !device_copy_of(run, &set->v, host->v, n.v * es) ||
            !device_copy_of(run, &set->o, NULL, n.o * es) ||
            !device_copy_of(run, (void **)&set->lse, NULL, n.lse * sizeof(float)))
            return 0;
        if (backward && !device_copy_of(run, &set->dout, host->dout, n.o * es)) return 0;
    }
    if (backward && (!device_copy_of(run, &run->dq, NULL, n.q * es) ||
                     !device_copy_of(run, &run->dk, NULL, n.k * es) ||
                     !device_copy_of(run, &run->dv, NULL, n.v * es)))
        return 0;
    return 1;
}

static void point_at_set(fa_params *p, const cuda_run *run, int s) {
    const device_set *set = &run->sets[s];
    p->q = set->q;
    p->k = set->k;
    p->v = set->v;
    p->o = set->o;
    p->lse = set->lse;
    p->dout = set->dout;
    p->dq = run->dq;
    p->dk = run->dk;
    p->dv = run->dv;
    p->workspace = run->workspace;
    p->workspace_bytes = run->workspace ? run->r->workspace_bytes : 0;
}

static int library_ok(cuda_run *run, fa_status st, const char *what) {
    if (st == FA_OK) return 1;
    run->r->status = BENCH_FAILED;
    snprintf(run->r->note, sizeof run->r->note, "%s: %s: %s", what, fa_strerror(st),
             fa_last_error());
    return 0;
}

/* One measured call (forward, backward or both; or the standard baseline's forward). */
static int call_once(const bench_case *c, const fa_params *p, cuda_run *run) {
    if (run->standard) {
        char why[sizeof run->r->note];
        if (gpu_standard_forward(run->standard, p, why, sizeof why)) return 1;
        run->r->status = BENCH_FAILED;
        snprintf(run->r->note, sizeof run->r->note, "%s", why);
        return 0;
    }
    fa_status st = FA_OK;
    if (c->mode != BENCH_BWD) st = fa_forward(p);
    if (st == FA_OK && c->mode != BENCH_FWD) st = fa_backward(p);
    return library_ok(run, st, "call");
}

static int allocate_standard(const fa_params *p, cuda_run *run) {
    size_t free_bytes = 0, total = 0, need = gpu_standard_bytes(p);
    char why[sizeof run->r->note], need_text[32], free_text[32];
    if (!cuda_ok(run, run->rt->mem_get_info(&free_bytes, &total), "cudaMemGetInfo")) return 0;
    if (need + STANDARD_HEADROOM > free_bytes) {
        run->r->status = BENCH_SKIPPED;
        snprintf(run->r->note, sizeof run->r->note, "does not fit: needs %s, %s free",
                 cli_format_bytes((double)need, need_text, sizeof need_text),
                 cli_format_bytes((double)free_bytes, free_text, sizeof free_text));
        return 0;
    }
    if (!gpu_standard_init(run->standard, run->rt, p, why, sizeof why)) {
        run->r->status = BENCH_FAILED;
        snprintf(run->r->note, sizeof run->r->note, "%s", why);
        return 0;
    }
    run->r->workspace_bytes = run->standard->bytes;
    return 1;
}

/* The backward reads o and lse: compute them once per input set, untimed. */
static int prepare_backward(const bench_case *c, fa_params *p, cuda_run *run) {
    if (c->mode != BENCH_BWD) return 1;
    for (int s = 0; s < run->n_sets; s++) {
        point_at_set(p, run, s);
        if (!library_ok(run, fa_forward(p), "forward for the backward")) return 0;
    }
    return cuda_ok(run, run->rt->device_synchronize(), "cudaDeviceSynchronize");
}

static int compare_floats(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Elapsed ms of `calls` consecutive calls, each between its own pair of events. */
static int time_calls(const bench_case *c, fa_params *p, cuda_run *run, int first_set, int calls,
                      float *elapsed_ms) {
    void *events[2 * BENCH_MAX_REPEATS] = {0};
    int created = 0, ok = 1;
    while (created < 2 * calls && ok) {
        ok = cuda_ok(run, run->rt->event_create(&events[created]), "cudaEventCreate");
        if (ok) created++;
    }
    for (int i = 0; i < calls && ok; i++) {
        point_at_set(p, run, (first_set + i) % run->n_sets);
        ok = cuda_ok(run, run->rt->event_record(events[2 * i], NULL), "cudaEventRecord") &&
             call_once(c, p, run) &&
             cuda_ok(run, run->rt->event_record(events[2 * i + 1], NULL), "cudaEventRecord");
    }
    if (ok) ok = cuda_ok(run, run->rt->event_synchronize(events[2 * calls - 1]), "kernel");
    for (int i = 0; i < calls && ok; i++)
        ok = cuda_ok(run, run->rt->event_elapsed_time(&elapsed_ms[i], events[2 * i],
                                                      events[2 * i + 1]),
                     "cudaEventElapsedTime");
    for (int i = 0; i < created; i++) run->rt->event_destroy(events[i]);
    return ok;
}

/* Warm-up, then the timed calls (adaptive count when c->repeats is 0). */
static int timed_median(const bench_case *c, fa_params *p, cuda_run *run) {
    float samples[BENCH_MAX_REPEATS];
    int warmups = c->warmups > 0 ? c->warmups : 1;
    if (warmups > BENCH_MAX_REPEATS) warmups = BENCH_MAX_REPEATS;
    if (!time_calls(c, p, run, 0, warmups, samples)) return 0;
    int calls = c->repeats;
    if (calls == 0) {
        float slowest = 0.0f;
        for (int i = 0; i < warmups; i++) slowest = samples[i] > slowest ? samples[i] : slowest;
        double fit = slowest > 0.0f ? ADAPTIVE_BUDGET_MS / slowest : BENCH_MAX_REPEATS;
        calls = fit < ADAPTIVE_MIN_CALLS ? ADAPTIVE_MIN_CALLS
                : fit > 100 ? 100 : (int)fit;
    }
    if (!time_calls(c, p, run, warmups, calls, samples)) return 0;
    qsort(samples, (size_t)calls, sizeof samples[0], compare_floats);
    run->r->ms = calls % 2 ? samples[calls / 2]
                           : 0.5 * ((double)samples[calls / 2 - 1] + samples[calls / 2]);
    run->r->timed_calls = calls;
    return 1;
}

/* Copy the checked outputs back (from set 0, whose inputs equal the host copies) and compare. */
static void check_outputs(const bench_case *c, fa_params *p, cuda_run *run, bench_tensors *host) {
    bench_sizes n = bench_case_sizes(c);
    size_t es = cli_dtype_size(c->dtype);
    point_at_set(p, run, 0);
    if (!call_once(c, p, run)) return;
    const device_set *set = &run->sets[0];
    int ok = cuda_ok(run, run->rt->memcpy_(host->o, set->o, n.o * es, CUDART_DEVICE_TO_HOST),
                     "cudaMemcpy") &&
             cuda_ok(run, run->rt->memcpy_(host->lse, set->lse, n.lse * sizeof(float),
                                           CUDART_DEVICE_TO_HOST), "cudaMemcpy");
    if (ok && c->mode != BENCH_FWD)
        ok = cuda_ok(run, run->rt->memcpy_(host->dq, run->dq, n.q * es, CUDART_DEVICE_TO_HOST),
                     "cudaMemcpy");
    if (!ok) return;
    fa_params host_p;
    bench_case_params(c, &host_p);
    host_p.device = FA_DEVICE_CPU;
    host_p.q = host->q; host_p.k = host->k; host_p.v = host->v; host_p.o = host->o;
    host_p.lse = host->lse; host_p.dout = host->dout; host_p.dq = host->dq;
    host_p.dk = host->dk; host_p.dv = host->dv;
    fa_set_contiguous_strides(&host_p);
    bench_sample_errors(c, &host_p, run->r);
}

/* Flash: the workspace fa_check_* asks for. Standard: its score and probability matrices,
 * when they fit in the free device memory. Both count as workspace_bytes. */
static int allocate_workspace(const bench_case *c, fa_params *p, cuda_run *run) {
    point_at_set(p, run, 0);
    if (run->standard) return allocate_standard(p, run);
    fa_status st = c->mode == BENCH_FWD ? fa_check_forward(p, &run->r->workspace_bytes)
                                        : fa_check_backward(p, &run->r->workspace_bytes);
    if (st == FA_OK && c->mode == BENCH_FWDBWD) {
        size_t forward_bytes = 0;
        st = fa_check_forward(p, &forward_bytes);
        if (forward_bytes > run->r->workspace_bytes) run->r->workspace_bytes = forward_bytes;
    }
    if (!library_ok(run, st, "check")) return 0;
    if (run->r->workspace_bytes == 0) return 1;
    return cuda_ok(run, run->rt->malloc_(&run->workspace, run->r->workspace_bytes),
                   "cudaMalloc(workspace)");
}

static void measure(const bench_case *c, const cudart_api *rt, bench_result *r) {
    fa_params p;
    bench_tensors host;
    cuda_run run;
    gpu_standard standard;
    memset(&run, 0, sizeof run);
    memset(&standard, 0, sizeof standard);
    run.rt = rt;
    run.r = r;
    run.standard = c->impl == IMPL_STANDARD ? &standard : NULL;
    if (!bench_alloc_tensors(c, &p, &host)) {
        r->status = BENCH_FAILED;
        snprintf(r->note, sizeof r->note, "out of host memory for the inputs");
        return;
    }
    p.device = FA_DEVICE_CUDA;
    size_t free_before = 0, free_after = 0, total = 0;
    if (upload(c, &host, &run) && allocate_workspace(c, &p, &run) &&
        prepare_backward(c, &p, &run) &&
        cuda_ok(&run, rt->mem_get_info(&free_before, &total), "cudaMemGetInfo") &&
        timed_median(c, &p, &run) &&
        cuda_ok(&run, rt->device_synchronize(), "cudaDeviceSynchronize") &&
        cuda_ok(&run, rt->mem_get_info(&free_after, &total), "cudaMemGetInfo")) {
        r->device_mem_delta = (int64_t)free_before - (int64_t)free_after;
        r->extra_mem_bytes =
            r->workspace_bytes + (r->device_mem_delta > 0 ? (size_t)r->device_mem_delta : 0);
        r->mem_source = MEM_CUDA;
        check_outputs(c, &p, &run, &host);
    }
    if (run.standard) gpu_standard_free(&standard);
    free_run(&run);
    bench_free_tensors(&host);
}

void bench_run_cuda(const bench_case *c, bench_result *r) {
    char why[sizeof r->note];
    if (bench_result_start(c, r)) return;
    if (c->impl == IMPL_FLASH && !fa_cuda_available()) {
        r->status = BENCH_SKIPPED;
        snprintf(r->note, sizeof r->note, "CUDA is not available in this build or machine");
        return;
    }
    const cudart_api *rt = cudart_load(why, sizeof why);
    if (!rt) {
        r->status = BENCH_FAILED;
        snprintf(r->note, sizeof r->note, "%s", why);
        return;
    }
    measure(c, rt, r);
}
