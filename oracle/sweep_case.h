/*
 * sweep_case.h: one correctness case, end to end (shared by the sweep and the unit tests).
 *
 * fa_case_run builds the problem of `spec` (random strides, NaN-poisoned outputs), computes the
 * float64 reference and the dtype baseline, runs fa_forward and (if spec->backward) fa_backward
 * on `device` (CUDA: through device copies), and checks every output tensor (fa_test_compare),
 * exact zeros / -inf / sink LSE on rows that see no key, that the backward left o and lse alone,
 * and that no input changed.
 */
#ifndef FA_TESTS_SWEEP_CASE_H
#define FA_TESTS_SWEEP_CASE_H

#include "oracle/reference.h"

typedef struct fa_case_result {
    fa_test_spec spec;             /* as run (layout and lengths resolved)                   */
    int skipped;                   /* the device path does not take this configuration        */
    char skip_reason[256];
    int ran_forward, ran_backward;
    fa_status fwd_status, bwd_status;
    fa_test_check o, lse, dq, dk, dv, dsink;
    int has_dsink;
    int64_t masked_violations;     /* forward: rows with no key whose O != 0 or LSE wrong    */
    int64_t masked_violations_bwd; /* backward: such rows whose dq != 0                      */
    int fwd_outputs_kept;          /* the backward left o and lse bit-identical               */
    int inputs_unchanged;
    int fwd_ok, bwd_ok;
    double fwd_seconds, bwd_seconds, reference_seconds;
    char error[512];               /* status message of a failed call, or why the case failed */
} fa_case_result;

/* Returns 0 when the case ran (look at fwd_ok / bwd_ok / skipped), -1 when it could not be set
 * up (error says why). */
int fa_case_run(const fa_test_spec *spec, fa_device device, int num_threads, fa_case_result *r);

/* "bf16 b=2 sq=113 sk=203 hq=4 hkv=2 d=59 dv=59 varlen padded causal+sink" */
void fa_case_describe(const fa_test_spec *spec, char *buf, size_t size);
/* Per-tensor "name err/tol" list for the forward (backward = 0) or backward part. */
void fa_case_format(const fa_case_result *r, int backward, int verbose, char *buf, size_t size);

/* ---- KV-cache and merge cases --------------------------------------------------------- */

/* fa_kvcache_forward on `device` (CUDA: every buffer mirrored on the device, results copied
 * back) checked by fa_kv_verify; configurations the CUDA path refuses (head dim, alignment,
 * unsupported) are skipped. */
typedef struct fa_kv_case_result {
    fa_kv_spec spec;
    int skipped;
    char skip_reason[256];
    fa_status status;
    fa_kv_check check;
    int ok;
    double seconds, reference_seconds;
    char error[512];
} fa_kv_case_result;

int fa_kv_case_run(const fa_kv_spec *spec, fa_device device, int num_threads, fa_kv_case_result *r);

/* fa_merge_states on `device`, checked by fa_merge_verify. */
typedef struct fa_merge_case_result {
    fa_merge_spec spec;
    int skipped;
    char skip_reason[256];
    fa_status status;
    fa_merge_check check;
    int ok;
    char error[512];
} fa_merge_case_result;

int fa_merge_case_run(const fa_merge_spec *spec, fa_device device, int num_threads,
                      fa_merge_case_result *r);

#endif /* FA_TESTS_SWEEP_CASE_H */
