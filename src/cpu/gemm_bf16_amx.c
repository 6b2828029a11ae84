/*
 * gemm_bf16_amx.c: the bf16 × bf16 GEMM of the CPU engine on AMX tiles (tdpbf16ps: a 16 × 16
 * fp32 tile += 16 × 32 bf16 · 32 × 16 bf16 in one instruction), for CPUs with AMX-TILE and
 * AMX-BF16 (Intel Sapphire Rapids and later). The blocking is in gemm_bf16_amx_impl.h; this file
 * maps its tile operations to the instructions. The instructions are enabled per function by the
 * target attribute, so the library builds with any flags; cpu_dispatch.c calls this GEMM only
 * after CPUID, XCR0 and Linux's permission request (arch_prctl ARCH_REQ_XCOMP_PERM) all say the
 * tile state is usable. No CPU with AMX was at hand where this was written: the same blocking
 * runs in tests/test_amx.c on a tile unit written in C (see docs/testing.md).
 */
#include "cpu_engine.h"

#ifdef FA_CPU_HAVE_AMX
#include <immintrin.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))
#define AMX_ENTRY fa_cpu_gemm_bf16_amx
#define AMX_CONFIG(cfg) _tile_loadconfig(cfg)
#define AMX_RELEASE() _tile_release()
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, ptr, stride) _tile_loadd(t, ptr, stride)
#define AMX_STORE(t, ptr, stride) _tile_stored(t, ptr, stride)
#define AMX_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_STORE_ROW(dst, src, alpha) _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_load_ps(src), _mm512_set1_ps(alpha)))

#include "gemm_bf16_amx_impl.h"

#endif /* FA_CPU_HAVE_AMX */
