/*
 * gemm_ref.c: an fp32 GEMM (C = A·B, n×n) timed through whatever BLAS is installed, as a
 * reference point for the attention numbers. The BLAS is found with dlopen() (OpenBLAS first,
 * then the system libblas) so it is never a build dependency; without one the result says
 * "no BLAS found". OpenBLAS gets the same thread count as the attention runs. The GEMM runs in a
 * forked child so the BLAS's threads never compete with later measurements.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_run.h"
#include "child.h"
#include "tensors.h"
#include "timing.h"

#define CBLAS_ROW_MAJOR 101
#define CBLAS_NO_TRANS 111
#define GEMM_BUDGET_S 2.0
#define GEMM_MAX_CALLS 10

typedef void (*sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef void (*set_threads_fn)(int threads);

typedef struct gemm_request {
    int n, threads;
} gemm_request;

static void *open_blas(gemm_result *g) {
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3",
                                        "libblas.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (handle && dlsym(handle, "cblas_sgemm")) {
            snprintf(g->library, sizeof g->library, "%s", names[i]);
            return handle;
        }
        if (handle) dlclose(handle);
    }
    return NULL;
}

/* One untimed call, then timed calls while under the budget; median ms. 0 when out of memory. */
static double time_sgemm(sgemm_fn sgemm, int n) {
    size_t elems = (size_t)n * (size_t)n;
    float *a = tool_alloc_touched(elems * sizeof(float));
    float *b = tool_alloc_touched(elems * sizeof(float));
    float *c = tool_alloc_touched(elems * sizeof(float));
    double median = 0.0;
    if (a && b && c) {
        tool_rng rng = tool_rng_seeded(7);
        tool_fill_normal(a, FA_DTYPE_F32, elems, 1.0f, 0.0f, &rng);
        tool_fill_normal(b, FA_DTYPE_F32, elems, 1.0f, 0.0f, &rng);
        double samples[GEMM_MAX_CALLS], total = 0.0;
        int calls = 0;
        for (int i = -1; i < GEMM_MAX_CALLS; i++) {
            double t0 = bench_now_seconds();
            sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, n, n, n, 1.0f, a, n, b, n, 0.0f,
                  c, n);
            double elapsed = bench_now_seconds() - t0;
            /* The first call is a warm-up unless it alone exceeds the budget (a slow BLAS). */
            if (i >= 0 || elapsed > GEMM_BUDGET_S) samples[calls++] = elapsed;
            total += elapsed;
            if (calls > 0 && total > GEMM_BUDGET_S) break;
        }
        qsort(samples, (size_t)calls, sizeof samples[0], bench_compare_doubles);
        median = 1e3 * samples[calls / 2];
    }
    free(a);
    free(b);
    free(c);
    return median;
}

/* Child side. A slow BLAS (the unoptimised reference libblas takes tens of seconds for one
 * n = 2048 call on two cores) is timed at n / 4 only, when n would take over the budget. */
static void gemm_child(const void *arg, void *out) {
    const gemm_request *req = arg;
    gemm_result *g = out;
    void *handle = open_blas(g);
    if (!handle) return;
    g->found = 1;
    sgemm_fn sgemm;
    set_threads_fn set_threads;
    void *sym = dlsym(handle, "cblas_sgemm");
    memcpy(&sgemm, &sym, sizeof sym);
    sym = dlsym(handle, "openblas_set_num_threads");
    memcpy(&set_threads, &sym, sizeof sym);
    if (set_threads) {
        set_threads(req->threads);
    } else {
        snprintf(g->note, sizeof g->note, "this BLAS has no openblas_set_num_threads");
    }
    int n = req->n, probe = req->n / 4;
    double ms = 0.0;
    if (probe >= 64) {
        ms = time_sgemm(sgemm, probe);
        double predicted_s = ms * 1e-3 * 64.0;
        if (ms > 0.0 && predicted_s > GEMM_BUDGET_S) {
            n = probe;
            size_t used = strlen(g->note);
            snprintf(g->note + used, sizeof g->note - used, "%sslow BLAS: n=%d timed, not %d (~%.0f s a call)",
                     used ? "; " : "", probe, req->n, predicted_s);
        } else {
            ms = 0.0;
        }
    }
    if (n == req->n) ms = time_sgemm(sgemm, n);
    if (ms <= 0.0) {
        g->found = 0;
        snprintf(g->note, sizeof g->note, "out of memory");
        return;
    }
    g->n = n;
    g->ms = ms;
    g->gflops = 2.0 * (double)n * (double)n * (double)n / (ms * 1e6);
}

void gemm_measure(int n, int threads, gemm_result *g) {
    gemm_request req = {n, threads};
    char why[160];
    memset(g, 0, sizeof *g);
    g->n = n;
    if (!child_run(gemm_child, &req, g, sizeof *g, why, sizeof why)) {
        memset(g, 0, sizeof *g);
        g->n = n;
        snprintf(g->note, sizeof g->note, "%s", why);
        return;
    }
    if (!g->found) snprintf(g->note, sizeof g->note, "no BLAS found");
}
