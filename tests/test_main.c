/*
 * test_main.c: runs the registered unit tests (test.h).
 *
 *   build/fa_tests                 every test
 *   build/fa_tests forward errors  tests whose name contains "forward" or "errors"
 *   build/fa_tests --list          names only
 * Environment: FA_TEST_LEVEL=small|normal|full, FA_TEST_SEED=<n>.
 * Exit status 0 when no test failed. The last line is "N passed, N failed" (a child run started
 * by a test, FA_TEST_CHILD=1, prints "child: N passed, N failed" instead).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"
#include "test.h"

#define MAX_TESTS 512
#define MAX_PRINTED_FAILURES 12

typedef struct registered_test {
    const char *name;
    fa_test_function fn;
} registered_test;

static registered_test tests[MAX_TESTS];
static int test_count;

/* state of the running test */
static int checks_made, checks_failed, skip_requested;
static char skip_reason[256];

void fa_test_register(const char *name, fa_test_function fn) {
    if (test_count < MAX_TESTS) {
        tests[test_count].name = name;
        tests[test_count].fn = fn;
        test_count++;
    }
}

int fa_test_check_at(int condition, const char *file, int line, const char *fmt, ...) {
    checks_made++;
    if (condition) return 1;
    checks_failed++;
    if (checks_failed <= MAX_PRINTED_FAILURES) {
        va_list args;
        va_start(args, fmt);
        printf("    %s:%d: ", file, line);
        vprintf(fmt, args);
        printf("\n");
        va_end(args);
    } else if (checks_failed == MAX_PRINTED_FAILURES + 1) {
        printf("    (further failures of this test not printed)\n");
    }
    fflush(stdout);
    return 0;
}

void fa_test_skip(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(skip_reason, sizeof skip_reason, fmt, args);
    va_end(args);
    skip_requested = 1;
}

void fa_test_note(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    printf("    note: ");
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
    fflush(stdout);
}

fa_test_level fa_test_get_level(void) {
    const char *env = getenv("FA_TEST_LEVEL");
    if (env && !strcmp(env, "small")) return FA_LEVEL_SMALL;
    if (env && !strcmp(env, "full")) return FA_LEVEL_FULL;
    return FA_LEVEL_NORMAL;
}

uint64_t fa_test_seed(void) {
    const char *env = getenv("FA_TEST_SEED");
    if (env && *env) return strtoull(env, NULL, 0);
    return 20251129ull;
}

char *fa_test_env_set(const char *name, const char *value) {
    const char *now = getenv(name);
    char *previous = now ? strdup(now) : NULL;
    setenv(name, value, 1);
    return previous;
}

void fa_test_env_restore(const char *name, char *previous) {
    if (previous) setenv(name, previous, 1);
    else unsetenv(name);
    free(previous);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int selected(const char *name, int argc, char **argv) {
    int filters = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue;
        filters++;
        if (strstr(name, argv[i])) return 1;
    }
    return filters == 0;
}

static int compare_names(const void *a, const void *b) {
    const registered_test *x = a, *y = b;
    return strcmp(x->name, y->name);
}

int main(int argc, char **argv) {
    int child = getenv("FA_TEST_CHILD") != NULL;
    qsort(tests, (size_t)test_count, sizeof tests[0], compare_names);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--list")) {
            for (int t = 0; t < test_count; t++) printf("%s\n", tests[t].name);
            return 0;
        }
    static const char *level_names[] = {"small", "normal", "full"};
    if (!child)
        printf("fa_tests: flashattn %s, cpu isa %s, level %s, seed %llu\n", fa_version(),
               fa_cpu_isa(), level_names[fa_test_get_level()], (unsigned long long)fa_test_seed());
    int passed = 0, failed = 0, skipped = 0;
    double start = now_seconds();
    for (int t = 0; t < test_count; t++) {
        if (!selected(tests[t].name, argc, argv)) continue;
        checks_made = checks_failed = skip_requested = 0;
        skip_reason[0] = '\0';
        fflush(stdout);
        double t0 = now_seconds();
        tests[t].fn();
        double elapsed = now_seconds() - t0;
        const char *prefix = child ? "  [child] " : "";
        if (checks_failed) {
            printf("%sFAIL  %s  (%d of %d checks failed, %.2f s)\n", prefix, tests[t].name,
                   checks_failed, checks_made, elapsed);
            failed++;
        } else if (skip_requested) {
            printf("%sSKIP  %s  (%s; %d checks, %.2f s)\n", prefix, tests[t].name, skip_reason,
                   checks_made, elapsed);
            skipped++;
        } else if (checks_made == 0) {
            printf("%sFAIL  %s  (made no checks)\n", prefix, tests[t].name);
            failed++;
        } else {
            printf("%sPASS  %s  (%d checks, %.2f s)\n", prefix, tests[t].name, checks_made, elapsed);
            passed++;
        }
        fflush(stdout);
    }
    if (child) {
        printf("child: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    } else {
        printf("fa_tests: %d skipped, %.1f s in all\n", skipped, now_seconds() - start);
        printf("%d passed, %d failed\n", passed, failed);
    }
    return failed ? 1 : 0;
}
