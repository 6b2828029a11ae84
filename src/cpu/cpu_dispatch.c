/*
 * cpu_dispatch.c: which SIMD kernels the CPU engine runs.
 *
 * The best level the CPU and OS support is detected once (__builtin_cpu_supports also checks
 * that the OS saves the vector state). The environment variable
 *
 *     FA_CPU_ISA=scalar|avx2|avx512
 *
 * lowers the level for testing and comparisons (it is read on every call, so a test can switch
 * levels between calls; asking for a level the CPU lacks gives the best one it has). On
 * architectures other than x86-64 only the scalar kernels exist and are always used.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_engine.h"

/* the SIMD kernel files are built (Makefile) and detectable (GCC/clang builtins) */
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define FA_CPU_HAVE_X86_KERNELS 1
#include <cpuid.h>
#endif

typedef enum { FA_ISA_SCALAR = 0, FA_ISA_AVX2 = 1, FA_ISA_AVX512 = 2 } fa_cpu_isa_level;

static fa_cpu_isa_level detected_level(void) {
#ifdef FA_CPU_HAVE_X86_KERNELS
    /* the features the kernels_avx512.c / kernels_avx2.c objects are compiled for */
    static atomic_int cached = -1; /* every thread that races here computes the same value */
    int level = atomic_load(&cached);
    if (level < 0) {
        __builtin_cpu_init();
        /* F16C from CPUID leaf 1 (not every compiler knows "f16c" for __builtin_cpu_supports) */
        unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
        int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
        int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
        level = avx512 ? FA_ISA_AVX512 : avx2 ? FA_ISA_AVX2 : FA_ISA_SCALAR;
        atomic_store(&cached, level);
    }
    return (fa_cpu_isa_level)level;
#else
    return FA_ISA_SCALAR;
#endif
}

static fa_cpu_isa_level selected_level(void) {
    fa_cpu_isa_level level = detected_level();
    const char *forced = getenv("FA_CPU_ISA");
    if (forced) {
        fa_cpu_isa_level want = level;
        if (strcmp(forced, "scalar") == 0) want = FA_ISA_SCALAR;
        else if (strcmp(forced, "avx2") == 0) want = FA_ISA_AVX2;
        else if (strcmp(forced, "avx512") == 0) want = FA_ISA_AVX512;
        if (want < level) level = want;
    }
    return level;
}

const fa_cpu_kernels *fa_cpu_select_kernels(void) {
    switch (selected_level()) {
#ifdef FA_CPU_HAVE_X86_KERNELS
    case FA_ISA_AVX512: return fa_cpu_kernels_avx512();
    case FA_ISA_AVX2: return fa_cpu_kernels_avx2();
#endif
    default: return fa_cpu_kernels_scalar();
    }
}

const char *fa_cpu_isa_name(void) { return fa_cpu_select_kernels()->name; }
