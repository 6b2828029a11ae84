/*
 * test_util.h: functions shared by the unit tests (on top of reference.h and sweep_case.h).
 */
#ifndef FA_TESTS_TEST_UTIL_H
#define FA_TESTS_TEST_UTIL_H

#include "oracle/reference.h"
#include "oracle/sweep_case.h"
#include "test.h"

/* A spec with the given dtype and shape, everything else off (contiguous, backward on). */
fa_test_spec fa_test_base_spec(fa_dtype dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                               int64_t heads_q, int64_t heads_kv, int64_t head_dim);

/* Run spec on the CPU through fa_case_run and FA_CHECK every result (status, each tensor
 * within tolerance, all written, nothing clobbered, masked rows exact, inputs unchanged).
 * `label` prefixes the messages. Returns 1 if everything passed. */
int fa_test_expect_case(const fa_test_spec *spec, int num_threads, const char *label);

/* The dtypes the CPU path takes. */
extern const fa_dtype fa_test_cpu_dtypes[3];

/* Shapes used by the per-feature tests: {batch, sq, sk, hq, hkv, d}; count depends on level. */
typedef struct fa_test_shape {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
} fa_test_shape;
int fa_test_feature_shapes(const fa_test_shape **shapes); /* returns the count */

#endif /* FA_TESTS_TEST_UTIL_H */
