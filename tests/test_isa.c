/*
 * test_isa.c: the key correctness cases under every SIMD level this machine has. The CPU engine
 * reads FA_CPU_ISA=scalar|avx2|avx512|neon|sve256 on every call (src/cpu/cpu_dispatch.c), so the test sets
 * it, checks fa_cpu_isa() reports that level, runs forward + backward cases (odd head dims that
 * leave vector tails, GQA, varlen, every feature, every dtype), and restores the variable.
 * A level the CPU lacks is reported as skipped (never passed).
 */
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

#include "cpu/cpu_convert.h"
#include "cpu/cpu_engine.h"
#include "test_util.h"

static int cpu_has(const char *level) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1: clang 14 does not know "f16c" for __builtin_cpu_supports */
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (!strcmp(level, "avx2")) return avx2;
    if (!strcmp(level, "avx512"))
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
#if defined(__aarch64__) && defined(__linux__) && defined(HWCAP_SVE) && defined(PR_SVE_GET_VL) && \
    defined(FA_CPU_HAVE_SVE256_KERNELS)
    /* 256-bit SVE: under qemu-aarch64, -cpu max,sve-default-vector-length=32 */
    if (!strcmp(level, "sve256"))
        return (getauxval(AT_HWCAP) & HWCAP_SVE) && (prctl(PR_SVE_GET_VL, 0, 0, 0, 0) & PR_SVE_VL_LEN_MASK) == 32;
#endif
#if defined(__aarch64__) && defined(__linux__) && defined(HWCAP_ASIMD)
    if (!strcmp(level, "neon")) return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#elif defined(__aarch64__)
    if (!strcmp(level, "neon")) return 1;
#endif
    return !strcmp(level, "scalar");
}

static void run_level(const char *level) {
    if (!cpu_has(level)) {
        fa_test_skip("this CPU has no %s", level);
        return;
    }
    char *previous = fa_test_env_set("FA_CPU_ISA", level);
    FA_CHECK(!strcmp(fa_cpu_isa(), level), "FA_CPU_ISA=%s but fa_cpu_isa() = %s", level, fa_cpu_isa());
    int small = fa_test_get_level() == FA_LEVEL_SMALL;
    struct {
        int64_t batch, sq, sk, hq, hkv, d;
        int causal, window, softcap, alibi, sinks, varlen, layout;
    } cases[] = {
        {2, 67, 45, 4, 2, 59, 1, 0, 0, 0, 1, 0, FA_TEST_LAYOUT_PADDED},  /* sq > sk, d tail 59 */
        {1, 33, 150, 3, 1, 128, 0, 1, 1, 2, 0, 0, FA_TEST_LAYOUT_BHSD},  /* window+softcap+alibi */
        {3, 40, 40, 2, 2, 17, 1, 0, 0, 1, 1, 1, FA_TEST_LAYOUT_PACKED_QKV}, /* varlen packed */
        {1, 129, 131, 2, 1, 256, 1, 1, 1, 2, 1, 0, FA_TEST_LAYOUT_PADDED}, /* everything, d 256 */
    };
    int count = small ? 3 : 4;
    for (int c = 0; c < count; c++)
        for (int t = 0; t < 3; t++) {
            fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[t], cases[c].batch, cases[c].sq, cases[c].sk,
                                                  cases[c].hq, cases[c].hkv, cases[c].d);
            spec.causal = cases[c].causal;
            spec.use_window = cases[c].window;
            spec.window_left = 13;
            spec.window_right = 2;
            spec.softcap = cases[c].softcap ? 2.5f : 0.0f;
            spec.alibi = (fa_test_alibi)cases[c].alibi;
            spec.sinks = cases[c].sinks;
            spec.varlen = cases[c].varlen;
            spec.layout = (fa_test_layout)cases[c].layout;
            char label[64];
            snprintf(label, sizeof label, "isa %s case %d", level, c);
            fa_test_expect_case(&spec, 0, label);
        }
    /* fp8 inputs: every e4m3 code (then a tail that leaves a vector partly full) through the
     * level's conversion, bit for bit cpu_convert.h's scalar one (NaN codes included) */
    {
        uint8_t codes[256 + 7];
        float got[256 + 7];
        for (int i = 0; i < 256 + 7; ++i) codes[i] = (uint8_t)(i < 256 ? i : 0x7f + 0x40 * (i - 256));
        fa_cpu_select_kernels()->to_f32(got, codes, 256 + 7, FA_DTYPE_FP8_E4M3);
        int mismatches = 0;
        for (int i = 0; i < 256 + 7; ++i) {
            const float want = fa_e4m3_to_f32(codes[i]);
            mismatches += memcmp(&got[i], &want, sizeof want) != 0;
        }
        FA_CHECK(mismatches == 0, "isa %s: %d e4m3 codes convert differently from the scalar rule", level,
                 mismatches);
    }
    /* fa_standard_forward too (it shares the kernels) */
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_BF16, 2, 50, 70, 2, 1, 40);
    spec.causal = 1;
    spec.sinks = 1;
    spec.backward = 0;
    fa_test_problem tp;
    if (FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) {
        fa_ref_gathered g;
        fa_ref_outputs ref, base;
        fa_ref_references(&tp.params, spec.dtype, 0, &g, &ref, &base);
        fa_status st = fa_standard_forward(&tp.params);
        fa_test_check co = fa_test_compare(&tp, FA_T_O, &ref, &base);
        fa_test_check cl = fa_test_compare(&tp, FA_T_LSE, &ref, &base);
        FA_CHECK(st == FA_OK && co.ok && cl.ok, "isa %s standard forward: %s, o err %.3e tol %.3e, lse err %.3e tol %.3e",
                 level, fa_strerror(st), co.err, co.tol, cl.err, cl.tol);
        fa_ref_references_free(&g, &ref, &base);
        fa_test_problem_destroy(&tp);
    }
    fa_test_env_restore("FA_CPU_ISA", previous);
}

FA_TEST(isa_scalar) { run_level("scalar"); }
FA_TEST(isa_avx2) { run_level("avx2"); }
FA_TEST(isa_avx512) { run_level("avx512"); }
FA_TEST(isa_neon) { run_level("neon"); }
FA_TEST(isa_sve256) { run_level("sve256"); }
/* On a CPU with AVX512-BF16 the avx512 level scores bf16 problems with vdpbf16ps (with AMX-BF16:
 * on AMX tiles), on one with the AArch64 BF16 extension the neon level with BFDOT; the level's
 * other score GEMMs are tested too: FA_CPU_BF16DOT=0 the fp32 one, FA_CPU_AMX=0 vdpbf16ps on an
 * AMX CPU (on other CPUs these repeat the level's test). */
static void run_level_with_off(const char *level, const char *variable) {
    char *previous = fa_test_env_set(variable, "0");
    run_level(level);
    fa_test_env_restore(variable, previous);
}
FA_TEST(isa_avx512_without_bf16dot) { run_level_with_off("avx512", "FA_CPU_BF16DOT"); }
FA_TEST(isa_avx512_without_amx) {
    if (!fa_cpu_amx_usable()) {
        fa_test_skip("this CPU or OS offers no AMX tiles: isa_avx512 already ran without them");
        return;
    }
    run_level_with_off("avx512", "FA_CPU_AMX");
}
FA_TEST(isa_neon_without_bf16dot) { run_level_with_off("neon", "FA_CPU_BF16DOT"); }
