/*
 * test_threads.c: the CPU result does not depend on the thread count beyond rounding (1, 2, 3,
 * 7 threads and "all cores" each pass the reference check and agree with each other within the
 * tolerance), and for a fixed thread count it is bitwise identical run to run, forward and
 * backward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static const int output_tensors[] = {FA_T_O, FA_T_LSE, FA_T_DQ, FA_T_DK, FA_T_DV, FA_T_DSINK};
#define OUTPUTS ((int)(sizeof output_tensors / sizeof output_tensors[0]))

typedef struct thread_run {
    void *snapshot[OUTPUTS];
    fa_test_check check[OUTPUTS];
    int ok;
} thread_run;

typedef struct threads_fixture {
    fa_test_problem tp;
    fa_ref_gathered g;
    fa_ref_outputs ref, base;
} threads_fixture;

static int fixture_create(threads_fixture *f, const fa_test_spec *spec) {
    if (fa_test_problem_create(&f->tp, spec)) return 0;
    fa_ref_references(&f->tp.params, spec->dtype, 1, &f->g, &f->ref, &f->base);
    return 1;
}

static void fixture_destroy(threads_fixture *f) {
    fa_ref_references_free(&f->g, &f->ref, &f->base);
    fa_test_problem_destroy(&f->tp);
}

/* forward + backward with `threads`; snapshots and reference checks of every output */
static void run_with_threads(threads_fixture *f, int threads, thread_run *run, const char *label) {
    fa_params p = f->tp.params;
    p.num_threads = threads;
    fa_test_poison_forward_outputs(&f->tp);
    fa_test_poison_backward_outputs(&f->tp);
    fa_status fs = fa_forward(&p);
    fa_status bs = fs == FA_OK ? fa_backward(&p) : fs;
    FA_CHECK(fs == FA_OK && bs == FA_OK, "%s threads=%d: forward %s backward %s: %s", label, threads,
             fa_strerror(fs), fa_strerror(bs), fa_last_error());
    run->ok = 1;
    for (int t = 0; t < OUTPUTS; t++) {
        int tensor = output_tensors[t];
        run->snapshot[t] = NULL;
        if (f->tp.view[tensor].buffer < 0) continue;
        run->snapshot[t] = fa_test_snapshot(&f->tp, tensor);
        run->check[t] = fa_test_compare(&f->tp, tensor, &f->ref, &f->base);
        run->ok &= run->check[t].ok;
        FA_CHECK(run->check[t].ok, "%s threads=%d %s: err %.3e tol %.3e unwritten %lld clobbered %lld",
                 label, threads, fa_test_tensor_name(tensor), run->check[t].err, run->check[t].tol,
                 (long long)run->check[t].unwritten, (long long)run->check[t].clobbered);
    }
}

static void free_run(thread_run *run) {
    for (int t = 0; t < OUTPUTS; t++) free(run->snapshot[t]);
}

static void thread_invariance(fa_dtype dtype, int varlen, const char *label) {
    int small = fa_test_get_level() == FA_LEVEL_SMALL;
    fa_test_spec spec = fa_test_base_spec(dtype, 2, small ? 70 : 200, small ? 90 : 333, 4, 2, small ? 40 : 64);
    spec.causal = 1;
    spec.sinks = 1;
    spec.alibi = FA_TEST_ALIBI_HEAD;
    spec.varlen = varlen;
    if (varlen) spec.batch = 4;
    spec.layout = FA_TEST_LAYOUT_PADDED;
    threads_fixture f;
    if (!FA_CHECK(fixture_create(&f, &spec), "create")) return;
    static const int counts[] = {1, 2, 3, 7, 0};
    thread_run runs[5];
    for (int c = 0; c < 5; c++) run_with_threads(&f, counts[c], &runs[c], label);
    for (int c = 1; c < 5; c++)
        for (int t = 0; t < OUTPUTS; t++) {
            if (!runs[0].snapshot[t] || !runs[c].snapshot[t]) continue;
            int tensor = output_tensors[t];
            double diff = fa_test_max_diff(&f.tp, tensor, runs[0].snapshot[t], runs[c].snapshot[t]);
            double tol = runs[0].check[t].tol;
            FA_CHECK(diff <= tol, "%s %s: threads=%d differs from threads=1 by %.3e > tol %.3e", label,
                     fa_test_tensor_name(tensor), counts[c], diff, tol);
        }
    /* the same thread count twice more: bitwise identical */
    for (int c = 2; c <= 3; c++) {
        thread_run again;
        run_with_threads(&f, counts[c], &again, label);
        for (int t = 0; t < OUTPUTS; t++) {
            if (!runs[c].snapshot[t]) continue;
            int tensor = output_tensors[t];
            FA_CHECK(fa_test_same_as_snapshot(&f.tp, tensor, runs[c].snapshot[t]),
                     "%s %s: threads=%d is not bitwise reproducible (max diff %.3e)", label,
                     fa_test_tensor_name(tensor), counts[c],
                     fa_test_max_diff(&f.tp, tensor, runs[c].snapshot[t], again.snapshot[t]));
        }
        free_run(&again);
    }
    for (int c = 0; c < 5; c++) free_run(&runs[c]);
    fixture_destroy(&f);
}

FA_TEST(threads_invariance_f32) { thread_invariance(FA_DTYPE_F32, 0, "f32"); }
FA_TEST(threads_invariance_bf16) { thread_invariance(FA_DTYPE_BF16, 0, "bf16"); }
FA_TEST(threads_invariance_f16_varlen) { thread_invariance(FA_DTYPE_F16, 1, "f16 varlen"); }
