/*
 * cpu_dispatch.c: which SIMD kernels the CPU engine runs.
 *
 * The best level the CPU and OS support is detected once (__builtin_cpu_supports also checks
 * that the OS saves the vector state). The environment variable
 *
 *     FA_CPU_ISA=scalar|avx2|avx512 (x86-64), scalar|neon|sve256 (AArch64)
 *
 * lowers the level for testing and comparisons (it is read on every call, so a test can switch
 * levels between calls; asking for a level the CPU lacks, or another architecture's, gives the
 * best one it has). AArch64 has the NEON level (HWCAP_ASIMD; Linux reads it with getauxval, other
 * AArch64 systems always have it) and, on Linux, the SVE level for 256-bit vectors (HWCAP_SVE and
 * a vector length of 32 bytes from prctl(PR_SVE_GET_VL): the kernels are compiled for that length).
 * On other architectures only the scalar kernels exist.
 *
 * On CPUs with AVX512-BF16 the avx512 level (detected or forced) also computes the score GEMMs
 * of bf16 problems with vdpbf16ps (gemm_bf16_avx512.c); on AArch64 CPUs with the BF16 extension
 * (HWCAP2_BF16) the neon and sve256 levels do with BFDOT (gemm_bf16_neon.c). The level's name
 * stays the same, and FA_CPU_BF16DOT=0 turns that off (and, in cpu_decode.c, the decode path's
 * bf16 dot-product scores, which follow this table's gemm_bf16). On CPUs with AMX-BF16 whose OS
 * grants the tile state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM, asked once per process) the
 * avx512 level computes those GEMMs on AMX tiles instead (gemm_bf16_amx.c); FA_CPU_AMX=0 keeps
 * them on vdpbf16ps, FA_CPU_BF16DOT=0 on the fp32 GEMM.
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
#if defined(FA_CPU_HAVE_NEON_KERNELS) && defined(__linux__)
#include <sys/auxv.h>
#endif
#ifdef FA_CPU_HAVE_SVE256_KERNELS
#include <sys/prctl.h>
#endif
#ifdef FA_CPU_HAVE_AMX
#include <sys/syscall.h>
#include <unistd.h>
#define FA_ARCH_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an XSAVE feature's state (Linux 5.16) */
#define FA_XFEATURE_XTILEDATA 18
#endif

/* Levels are ordered within an architecture (x86-64: scalar < avx2 < avx512; AArch64: scalar < neon
 * < sve256). */
typedef enum { FA_ISA_SCALAR = 0, FA_ISA_AVX2 = 1, FA_ISA_AVX512 = 2, FA_ISA_NEON = 3, FA_ISA_SVE256 = 4 } fa_cpu_isa_level;

#ifdef FA_CPU_HAVE_SVE256_KERNELS
/* SVE with 32-byte vectors (the length this thread runs with; Linux gives every thread the
 * system's default unless the program changes it). */
static int sve256_usable(void) {
#if defined(HWCAP_SVE) && defined(PR_SVE_GET_VL) && defined(PR_SVE_VL_LEN_MASK)
    if (!(getauxval(AT_HWCAP) & HWCAP_SVE)) return 0;
    const int vl = prctl(PR_SVE_GET_VL, 0, 0, 0, 0);
    return vl >= 0 && (vl & PR_SVE_VL_LEN_MASK) == 32;
#else
    return 0;
#endif
}
#endif

/* Bit of the cached detection that records AVX512-BF16 (with the AVX-512 level). */
#define FA_ISA_BF16DOT_BIT 4

/* The detected level; *bf16dot = the level may use its bf16 GEMM (AVX512-BF16 on x86-64, BFDOT on
 * AArch64). */
static fa_cpu_isa_level detected_level(int *bf16dot) {
    *bf16dot = 0;
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
#ifdef FA_CPU_HAVE_BF16DOT
        /* AVX512_BF16: CPUID leaf 7, subleaf 1, EAX bit 5 (its state is the AVX-512 state) */
        if (avx512 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)))
            level |= 1 << FA_ISA_BF16DOT_BIT;
#endif
        atomic_store(&cached, level);
    }
    *bf16dot = (level >> FA_ISA_BF16DOT_BIT) & 1;
    return (fa_cpu_isa_level)(level & ((1 << FA_ISA_BF16DOT_BIT) - 1));
#elif defined(FA_CPU_HAVE_NEON_KERNELS)
#if defined(FA_CPU_HAVE_BF16DOT_NEON) && defined(HWCAP2_BF16)
    *bf16dot = (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#endif
#ifdef FA_CPU_HAVE_SVE256_KERNELS
    if (sve256_usable()) return FA_ISA_SVE256;
#endif
#if defined(__linux__) && defined(HWCAP_ASIMD)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) ? FA_ISA_NEON : FA_ISA_SCALAR;
#else
    return FA_ISA_NEON;
#endif
#else
    return FA_ISA_SCALAR;
#endif
}

fa_cpu_model_id fa_cpu_identify(void) {
    fa_cpu_model_id id = {0, 0, 0};
#ifdef FA_CPU_HAVE_X86_KERNELS
    /* amd << 20 | family << 8 | model (family <= 0x10e); every racing thread stores the same */
    static atomic_int cached = -1;
    int packed = atomic_load(&cached);
    if (packed < 0) {
        unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
        int amd = 0, family = 0, model = 0;
        if (__get_cpuid(0, &eax, &ebx, &ecx, &edx))
            amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u; /* "AuthenticAMD" */
        if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
            family = (int)((eax >> 8) & 0xf);
            model = (int)((eax >> 4) & 0xf);
            if (family == 0xf) {
                family += (int)((eax >> 20) & 0xff);
                model |= (int)((eax >> 16) & 0xf) << 4;
            }
        }
        packed = amd << 20 | family << 8 | model;
        atomic_store(&cached, packed);
    }
    id.amd = packed >> 20;
    id.family = (packed >> 8) & 0xfff;
    id.model = packed & 0xff;
#endif
    return id;
}

int fa_cpu_amx_usable(void) {
#ifdef FA_CPU_HAVE_AMX
    static atomic_int cached = -1; /* racing threads ask the same and store the same */
    int usable = atomic_load(&cached);
    if (usable < 0) {
        usable = 0;
        unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
        /* CPUID leaf 7.0 EDX: bit 22 AMX-BF16, bit 24 AMX-TILE; leaf 1 ECX bit 27: OSXSAVE (xgetbv) */
        int amx = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 22)) && (edx & (1u << 24));
        if (amx && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 27))) {
            unsigned int xcr0_lo, xcr0_hi;
            __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
            /* XCR0 bits 17-18: the OS saves XTILECFG and XTILEDATA; then the process asks for them */
            if ((xcr0_lo & (3u << 17)) == (3u << 17))
                usable = syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) == 0;
        }
        atomic_store(&cached, usable);
    }
    return usable;
#else
    return 0;
#endif
}

static fa_cpu_isa_level selected_level(int *bf16dot) {
    fa_cpu_isa_level level = detected_level(bf16dot);
    const char *forced = getenv("FA_CPU_ISA");
    if (forced) {
        fa_cpu_isa_level want = level;
        if (strcmp(forced, "scalar") == 0) want = FA_ISA_SCALAR;
#ifdef FA_CPU_HAVE_X86_KERNELS
        else if (strcmp(forced, "avx2") == 0) want = FA_ISA_AVX2;
        else if (strcmp(forced, "avx512") == 0) want = FA_ISA_AVX512;
#endif
#ifdef FA_CPU_HAVE_NEON_KERNELS
        else if (strcmp(forced, "neon") == 0) want = FA_ISA_NEON;
#endif
#ifdef FA_CPU_HAVE_SVE256_KERNELS
        else if (strcmp(forced, "sve256") == 0) want = FA_ISA_SVE256;
#endif
        if (want < level) level = want;
    }
    return level;
}

#if defined(FA_CPU_HAVE_BF16DOT) || defined(FA_CPU_HAVE_BF16DOT_NEON)
/* An environment switch set to 0, read on every call like FA_CPU_ISA (so tests run both ways on a
 * CPU that has the instructions): FA_CPU_BF16DOT=0 keeps bf16 problems on the fp32 GEMM at the
 * avx512 / neon / sve256 level, FA_CPU_AMX=0 keeps them off the AMX tiles. */
static int switched_off(const char *variable) {
    const char *s = getenv(variable);
    return s != NULL && s[0] == '0';
}
#endif

const fa_cpu_kernels *fa_cpu_select_kernels(void) {
    int bf16dot;
    switch (selected_level(&bf16dot)) {
#ifdef FA_CPU_HAVE_X86_KERNELS
    case FA_ISA_AVX512:
#ifdef FA_CPU_HAVE_AMX
        if (!switched_off("FA_CPU_BF16DOT") && !switched_off("FA_CPU_AMX") && fa_cpu_amx_usable())
            return fa_cpu_kernels_avx512_amx();
#endif
#ifdef FA_CPU_HAVE_BF16DOT
        if (bf16dot && !switched_off("FA_CPU_BF16DOT")) return fa_cpu_kernels_avx512_bf16();
#endif
        return fa_cpu_kernels_avx512();
    case FA_ISA_AVX2: return fa_cpu_kernels_avx2();
#endif
#ifdef FA_CPU_HAVE_NEON_KERNELS
    case FA_ISA_NEON:
#ifdef FA_CPU_HAVE_BF16DOT_NEON
        if (bf16dot && !switched_off("FA_CPU_BF16DOT")) return fa_cpu_kernels_neon_bf16();
#endif
        return fa_cpu_kernels_neon();
#endif
#ifdef FA_CPU_HAVE_SVE256_KERNELS
    case FA_ISA_SVE256:
#ifdef FA_CPU_HAVE_BF16DOT_NEON
        if (bf16dot && !switched_off("FA_CPU_BF16DOT")) return fa_cpu_kernels_sve256_bf16();
#endif
        return fa_cpu_kernels_sve256();
#endif
    default: return fa_cpu_kernels_scalar();
    }
}

const char *fa_cpu_isa_name(void) { return fa_cpu_select_kernels()->name; }
