/*
 * test_amx.c: the AMX-BF16 GEMM of the CPU engine (src/cpu/gemm_bf16_amx_impl.h).
 *
 * No CPU with AMX is at hand where the tests run, so the GEMM's blocking is compiled a second
 * time here against a tile unit written in C: eight tiles of 16 rows × 64 bytes, ldtilecfg,
 * tileloadd, tilestored, tilezero and tdpbf16ps as Intel's pseudocode defines them, and every
 * rule the hardware enforces with a fault (a configured palette; rows and bytes per row within
 * the tile and agreeing between the three tiles of tdpbf16ps) recorded as a violation. The
 * emulated GEMM must match a float64 GEMM on odd shapes (rows and k not multiples of the tiles,
 * odd k, padded strides, alpha) and commit no violation. On a CPU whose OS grants the tile state
 * the library's own AMX GEMM runs the same cases; elsewhere that part is reported as skipped.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_engine.h"
#include "test_util.h"

/* ---- the tile unit ---------------------------------------------------------------------------- */

typedef struct emu_tiles {
    int configured;
    int rows[8], colsb[8];
    uint8_t data[8][16][64];
    int violations;
    char first[160];
} emu_tiles;
static emu_tiles emu;

static void emu_violation(const char *what, int t) {
    if (emu.violations++ == 0) snprintf(emu.first, sizeof emu.first, "%s (tile %d)", what, t);
}

static void emu_config(const void *cfg64) {
    const uint8_t *b = (const uint8_t *)cfg64;
    memset(&emu, 0, offsetof(emu_tiles, violations));
    if (b[0] != 1) {
        emu_violation("palette other than 1", -1);
        return;
    }
    for (int t = 0; t < 8; t++) {
        uint16_t colsb;
        memcpy(&colsb, b + 16 + 2 * t, 2);
        emu.colsb[t] = colsb;
        emu.rows[t] = b[48 + t];
        if (emu.rows[t] > 16 || emu.colsb[t] > 64) emu_violation("tile larger than 16 x 64 bytes", t);
    }
    emu.configured = 1;
}

static int emu_ready(int t) {
    if (!emu.configured) emu_violation("tile instruction before ldtilecfg", t);
    return emu.configured;
}

static void emu_zero(int t) {
    if (emu_ready(t)) memset(emu.data[t], 0, sizeof emu.data[t]);
}

/* tileloadd: rows beyond the configuration and bytes beyond colsb become zero */
static void emu_load(int t, const void *ptr, size_t stride) {
    if (!emu_ready(t)) return;
    memset(emu.data[t], 0, sizeof emu.data[t]);
    for (int r = 0; r < emu.rows[t]; r++) memcpy(emu.data[t][r], (const uint8_t *)ptr + r * stride, (size_t)emu.colsb[t]);
}

static void emu_store(int t, void *ptr, size_t stride) {
    if (!emu_ready(t)) return;
    for (int r = 0; r < emu.rows[t]; r++) memcpy((uint8_t *)ptr + r * stride, emu.data[t][r], (size_t)emu.colsb[t]);
}

static float emu_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* tdpbf16ps c, a, b: M = rows(c), N = colsb(c) / 4, K = colsb(a) / 4 pairs; a has M rows, b has
 * K rows of colsb(c) bytes. c[m][n] += Σ_k a[m][2k]·b[k][2n] + a[m][2k+1]·b[k][2n+1] in fp32. */
static void emu_dpbf16ps(int c, int a, int b) {
    if (!emu_ready(c)) return;
    const int m_rows = emu.rows[c], n_cols = emu.colsb[c] / 4, k_pairs = emu.colsb[a] / 4;
    if (emu.colsb[c] % 4 || emu.colsb[a] % 4) emu_violation("tdpbf16ps: colsb not a multiple of 4", c);
    if (emu.rows[a] != m_rows) emu_violation("tdpbf16ps: rows(a) != rows(c)", a);
    if (emu.rows[b] != k_pairs) emu_violation("tdpbf16ps: rows(b) != colsb(a) / 4", b);
    if (emu.colsb[b] != emu.colsb[c]) emu_violation("tdpbf16ps: colsb(b) != colsb(c)", b);
    if (c == a || c == b || a == b) emu_violation("tdpbf16ps: the same tile twice", c);
    for (int m = 0; m < m_rows; m++)
        for (int n = 0; n < n_cols; n++) {
            float acc;
            memcpy(&acc, &emu.data[c][m][4 * n], 4);
            for (int k = 0; k < k_pairs; k++) {
                acc += emu_bf16(&emu.data[a][m][4 * k]) * emu_bf16(&emu.data[b][k][4 * n]);
                acc += emu_bf16(&emu.data[a][m][4 * k + 2]) * emu_bf16(&emu.data[b][k][4 * n + 2]);
            }
            memcpy(&emu.data[c][m][4 * n], &acc, 4);
        }
}

#define AMX_TARGET
#define AMX_ENTRY test_gemm_bf16_amx_emulated
#define AMX_CONFIG(cfg) emu_config(cfg)
#define AMX_RELEASE() (emu.configured = 0)
#define AMX_ZERO(t) emu_zero(t)
#define AMX_LOAD(t, ptr, stride) emu_load(t, ptr, stride)
#define AMX_STORE(t, ptr, stride) emu_store(t, ptr, stride)
#define AMX_DP(c, a, b) emu_dpbf16ps(c, a, b)
#define AMX_STORE_ROW(dst, src, alpha)                                                                             \
    do {                                                                                                           \
        for (int x_ = 0; x_ < 16; x_++) (dst)[x_] = (alpha) * (src)[x_];                                           \
    } while (0)
void test_gemm_bf16_amx_emulated(const fa_cpu_gemm_bf16_args *g);
#include "cpu/gemm_bf16_amx_impl.h"

/* ---- the cases ---------------------------------------------------------------------------------- */

/* C = alpha · A B with A [m][lda] bf16, B given as gemm_bf16's pair rows [ceil(k/2)][ldb][2] (an
 * odd k's last pair 0 in its second slot), against float64; C's padding columns must stay as
 * written before (NaN). Returns 1 if the GEMM held. */
static int gemm_case(void (*gemm)(const fa_cpu_gemm_bf16_args *), const char *name, int64_t m, int64_t n, int64_t k,
                     int64_t pad, float alpha, uint64_t seed) {
    const int64_t lda = k + pad, ldb = n + 16 * (pad > 0), ldc = n + pad, pairs = (k + 1) / 2;
    uint16_t *a = calloc((size_t)(m * lda + 1), sizeof *a);
    uint16_t *b = calloc((size_t)(pairs * ldb * 2 + 1), sizeof *b);
    float *c = malloc(sizeof *c * (size_t)(m * ldc + 1));
    double *bf = calloc((size_t)(k * n + 1), sizeof *bf);
    int ok = a && b && c && bf;
    if (!FA_CHECK(ok, "out of memory")) goto done;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    for (int64_t i = 0; i < m * lda; i++) a[i] = fa_test_f32_to_bf16((float)fa_test_rng_normal(&rng));
    for (int64_t kk = 0; kk < k; kk++)
        for (int64_t j = 0; j < n; j++) {
            const uint16_t h = fa_test_f32_to_bf16((float)fa_test_rng_normal(&rng));
            b[(kk / 2) * 2 * ldb + 2 * j + (kk % 2)] = h;
            bf[kk * n + j] = fa_test_bf16_to_f32(h);
        }
    for (int64_t i = 0; i < m * ldc; i++) c[i] = NAN;
    fa_cpu_gemm_bf16_args g = {m, n, k, a, lda, b, ldb, c, ldc, alpha};
    gemm(&g);
    int64_t bad = 0, stray = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t kk = 0; kk < k; kk++) {
                const double x = fa_test_bf16_to_f32(a[i * lda + kk]) * bf[kk * n + j];
                ref += x;
                mag += fabs(x);
            }
            ref *= alpha;
            mag *= fabs(alpha);
            /* fp32 products of bf16 are exact; k fp32 additions round at most k times */
            const double tol = (double)(k + 2) * ldexp(1.0, -24) * mag + 1e-30;
            const double err = fabs((double)c[i * ldc + j] - ref);
            if (!(err <= tol)) bad++;
            if (err / tol > worst) worst = err / tol;
        }
        for (int64_t j = n; j < ldc; j++) stray += !isnan(c[i * ldc + j]);
    }
    ok = FA_CHECK(bad == 0 && stray == 0, "%s m=%lld n=%lld k=%lld pad=%lld alpha=%g: %lld of %lld wrong (worst %.2f x tol), "
                  "%lld padding elements written",
                  name, (long long)m, (long long)n, (long long)k, (long long)pad, alpha, (long long)bad,
                  (long long)(m * n), worst, (long long)stray);
done:
    free(a);
    free(b);
    free(c);
    free(bf);
    return ok;
}

static const struct {
    int64_t m, n, k, pad;
    float alpha;
} amx_cases[] = {
    {1, 16, 1, 0, 1.0f},     {16, 16, 32, 0, 1.0f},    {17, 16, 33, 3, 0.125f}, {31, 48, 64, 0, -2.0f},
    {32, 32, 31, 1, 1.0f},   {33, 80, 127, 5, 0.5f},   {64, 128, 128, 0, 0.0883883f}, {7, 32, 256, 8, 1.0f},
    {100, 64, 96, 0, 1.5f},  {64, 144, 59, 2, 0.13f},  {5, 16, 512, 0, 0.044f},
};

FA_TEST(amx_gemm_emulated_tile_unit) {
    const int count = (int)(sizeof amx_cases / sizeof amx_cases[0]);
    int held = 0;
    for (int i = 0; i < count; i++) {
        emu.violations = 0;
        emu.first[0] = 0;
        held += gemm_case(test_gemm_bf16_amx_emulated, "emulated AMX", amx_cases[i].m, amx_cases[i].n, amx_cases[i].k,
                          amx_cases[i].pad, amx_cases[i].alpha, fa_test_seed() + (uint64_t)i);
        FA_CHECK(emu.violations == 0, "emulated AMX case %d: %d tile-rule violations, first: %s", i, emu.violations,
                 emu.first);
    }
    FA_CHECK(held == count, "%d of %d emulated AMX GEMM cases held", held, count);
}

/* The tile unit itself against the rules it models: a tdpbf16ps on tiles whose shapes disagree
 * is recorded, as the hardware would fault. */
FA_TEST(amx_tile_unit_flags_bad_shapes) {
    amx_tile_config cfg;
    amx_tile_config_init(&cfg);
    cfg.rows[6] = 8; /* B with 8 pair rows against an A of 16 pairs */
    emu.violations = 0;
    emu_config(&cfg);
    emu_zero(0);
    emu_dpbf16ps(0, 4, 6);
    FA_CHECK(emu.violations == 1, "rows(b) != colsb(a) / 4 not flagged (%d violations)", emu.violations);
    emu.configured = 0;
    emu.violations = 0;
    emu_zero(1);
    FA_CHECK(emu.violations == 1, "a tile instruction before ldtilecfg not flagged");
}

/* The library's own AMX GEMM, where the CPU and OS allow it. */
FA_TEST(amx_gemm_on_this_cpu) {
#ifdef FA_CPU_HAVE_AMX
    if (!fa_cpu_amx_usable()) {
        fa_test_skip("this CPU or OS offers no AMX-BF16 tiles (the emulated run covers the blocking)");
        return;
    }
    const int count = (int)(sizeof amx_cases / sizeof amx_cases[0]);
    for (int i = 0; i < count; i++)
        gemm_case(fa_cpu_gemm_bf16_amx, "AMX", amx_cases[i].m, amx_cases[i].n, amx_cases[i].k, amx_cases[i].pad,
                  amx_cases[i].alpha, fa_test_seed() + (uint64_t)i);
#else
    FA_CHECK(!fa_cpu_amx_usable(), "fa_cpu_amx_usable() without the AMX GEMM built");
    fa_test_skip("the AMX GEMM is not built with this compiler or OS");
#endif
}
