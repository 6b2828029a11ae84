/*
 * test_util.c: functions shared by the unit tests.
 */
#include "test_util.h"

#include <string.h>

const fa_dtype fa_test_cpu_dtypes[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

fa_test_spec fa_test_base_spec(fa_dtype dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t heads_q, int64_t heads_kv, int64_t head_dim) {
    fa_test_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.batch = batch;
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    s.heads_q = heads_q;
    s.heads_kv = heads_kv;
    s.head_dim = head_dim;
    s.head_dim_v = head_dim;
    s.backward = 1;
    s.seed = fa_test_seed() ^ (uint64_t)(batch * 1000003 + seqlen_q * 10007 + seqlen_k * 101 +
                                         heads_q * 13 + head_dim * 7 + dtype);
    return s;
}

static void check_tensor(const char *label, const char *shape, const char *name,
                         const fa_test_check *c) {
    FA_CHECK(c->ok, "%s [%s] %s: err %.3e > tol %.3e (baseline err %.3e, floor %.1e, max|ref| %.3e, "
             "rel %.2e) unwritten %lld clobbered %lld nonfinite %lld",
             label, shape, name, c->err, c->tol, c->base_err, c->floor, c->ref_max,
             c->ref_max > 0 ? c->err / c->ref_max : 0.0, (long long)c->unwritten,
             (long long)c->clobbered, (long long)c->nonfinite);
}

int fa_test_expect_case(const fa_test_spec *spec, int num_threads, const char *label) {
    fa_case_result r;
    char shape[256];
    int rc = fa_case_run(spec, FA_DEVICE_CPU, num_threads, &r);
    fa_case_describe(rc == 0 ? &r.spec : spec, shape, sizeof shape);
    if (!FA_CHECK(rc == 0, "%s [%s]: case could not run: %s", label, shape, r.error)) return 0;
    if (!FA_CHECK(!r.skipped, "%s [%s]: CPU path rejected it: %s", label, shape, r.skip_reason))
        return 0;
    FA_CHECK(r.fwd_status == FA_OK, "%s [%s]: %s", label, shape, r.error);
    if (r.fwd_status == FA_OK) {
        check_tensor(label, shape, "o", &r.o);
        check_tensor(label, shape, "lse", &r.lse);
        FA_CHECK(r.masked_violations == 0,
                 "%s [%s]: %lld elements of rows with no visible key are not exact (O = 0, LSE = -inf or sink)",
                 label, shape, (long long)r.masked_violations);
    }
    if (spec->backward && r.fwd_status == FA_OK) {
        FA_CHECK(r.bwd_status == FA_OK, "%s [%s]: %s", label, shape, r.error);
        if (r.bwd_status == FA_OK) {
            check_tensor(label, shape, "dq", &r.dq);
            check_tensor(label, shape, "dk", &r.dk);
            check_tensor(label, shape, "dv", &r.dv);
            if (r.has_dsink) check_tensor(label, shape, "dsink", &r.dsink);
            FA_CHECK(r.masked_violations_bwd == 0,
                     "%s [%s]: %lld dq elements of rows with no visible key are not 0", label,
                     shape, (long long)r.masked_violations_bwd);
            FA_CHECK(r.fwd_outputs_kept, "%s [%s]: fa_backward modified o or lse", label, shape);
        }
    }
    FA_CHECK(r.inputs_unchanged, "%s [%s]: an input buffer was modified", label, shape);
    return r.fwd_ok && (!spec->backward || r.bwd_ok);
}

int fa_test_feature_shapes(const fa_test_shape **shapes) {
    /* odd sizes, sq < sk and sq > sk, GQA, one token, and (normal) a longer one */
    static const fa_test_shape all[] = {
        {2, 7, 113, 4, 2, 59},
        {1, 113, 7, 2, 1, 64},
        {2, 1, 1, 3, 3, 32},
        {1, 130, 203, 2, 2, 128},
        {1, 1023, 1023, 1, 1, 96},
    };
    *shapes = all;
    switch (fa_test_get_level()) {
    case FA_LEVEL_SMALL: return 3;
    case FA_LEVEL_FULL: return 5;
    default: return 4;
    }
}
