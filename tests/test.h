/*
 * test.h: a tiny unit-test registry.
 *
 *   FA_TEST(forward_causal) { ... FA_CHECK(x == y, "x = %d", x); ... }
 *
 * FA_TEST registers the function before main() (a constructor); build/fa_tests runs every test
 * (or those whose name contains one of the command-line arguments), prints one line per test
 * and ends with "N passed, N failed". A test fails if any FA_CHECK fails, and also if it made
 * no check at all (a test that asserts nothing proves nothing); fa_test_skip() marks it skipped
 * when the machine cannot run it (the reason is printed, and a skip never counts as a pass).
 *
 * FA_TEST_LEVEL=small|normal|full (default normal) scales problem sizes and case counts: the
 * sanitizer build runs small. FA_TEST_SEED=<n> changes the inputs of the randomised tests;
 * FA_TEST_REF_THREADS=<n> caps the threads of the float64 reference (default: online cores).
 */
#ifndef FA_TESTS_TEST_H
#define FA_TESTS_TEST_H

#include <stdint.h>

typedef void (*fa_test_function)(void);

void fa_test_register(const char *name, fa_test_function fn);

#define FA_TEST(name)                                                                        \
    static void fa_test_body_##name(void);                                                   \
    __attribute__((constructor)) static void fa_test_register_##name(void) {                 \
        fa_test_register(#name, fa_test_body_##name);                                        \
    }                                                                                        \
    static void fa_test_body_##name(void)

/* Record one check; on failure print file:line and the message (first few per test). Returns
 * the condition so callers may stop early: if (!FA_CHECK(...)) return; */
int fa_test_check_at(int condition, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define FA_CHECK(cond, ...) fa_test_check_at(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* Mark the running test skipped, with a reason (still fails if a check failed). */
void fa_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Informational line under the test's result. */
void fa_test_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef enum fa_test_level { FA_LEVEL_SMALL = 0, FA_LEVEL_NORMAL = 1, FA_LEVEL_FULL = 2 } fa_test_level;
fa_test_level fa_test_get_level(void);
/* Seed for randomised tests: FA_TEST_SEED if set, else a fixed per-test default mixed with the
 * run seed printed at start. */
uint64_t fa_test_seed(void);

/* Environment switches a test sets and puts back: fa_test_env_set returns the variable's earlier
 * value (a copy, NULL when it was unset) for fa_test_env_restore, which frees it. */
char *fa_test_env_set(const char *name, const char *value);
void fa_test_env_restore(const char *name, char *previous);

#endif /* FA_TESTS_TEST_H */
