/*
 * gemm_bf16_amx_impl.h: the bf16 × bf16 GEMM of the CPU engine (fa_cpu_gemm_bf16_args) on AMX
 * tiles (AMX-TILE + AMX-BF16, Intel Sapphire Rapids and later). Not a public header: it is
 * included by gemm_bf16_amx.c, which maps the tile operations below to the instructions, and by
 * tests/test_amx.c, which maps them to a tile unit written in C so that this code runs on CPUs
 * without AMX. The includer defines
 *   AMX_TARGET                  the function attribute that enables the instructions (or nothing)
 *   AMX_ENTRY                   the name of the GEMM this file defines
 *   AMX_CONFIG(cfg)             ldtilecfg from the 64-byte amx_tile_config
 *   AMX_RELEASE()               tilerelease
 *   AMX_ZERO(t)                 tilezero tmm t
 *   AMX_LOAD(t, ptr, stride)    tileloadd: tmm t's rows from ptr, stride bytes apart
 *   AMX_STORE(t, ptr, stride)   tilestored
 *   AMX_DP(c, a, b)             tdpbf16ps: tmm c += tmm a · tmm b
 *   AMX_STORE_ROW(dst, src, alpha)  dst[0..16) = alpha · src[0..16) (fp32)
 * with t, c, a, b constants (the instructions encode the tile number).
 *
 * Tiles: every one 16 rows × 64 bytes. tdpbf16ps takes A as 16 rows of 16 bf16 pairs (32 k)
 * and B as 16 rows of pairs, row p holding (B[2p][n], B[2p+1][n]) for 16 columns n: the layout
 * of fa_cpu_gemm_bf16_args's B operand (pair row kp at b + kp · 2·ldb), so B loads straight
 * from it; C is 16 rows × 16 fp32. A block of C is 2 × 2 tiles (32 rows × 32 columns):
 *   tmm0..3  C, tile 2i + j = rows 16i.., columns 16j..
 *   tmm4, 5  A, rows 16i.. of the block, 32 k
 *   tmm6, 7  B, columns 16j.., 16 pairs
 * Edges (rows past m, a last k chunk shorter than 32) are staged through zero-padded copies, so
 * one tile configuration serves every call and no load reads outside the operands. C leaves
 * each tile through a stack copy, scaled by alpha row by row.
 */
#ifndef FA_CPU_GEMM_BF16_AMX_IMPL_H
#define FA_CPU_GEMM_BF16_AMX_IMPL_H

#include <stdint.h>
#include <string.h>

#include "cpu_engine.h"

#define AMX_TILE_ROWS 16
#define AMX_TILE_BYTES 64 /* per row: 32 bf16, 16 bf16 pairs or 16 fp32 */
#define AMX_K 32          /* k per A tile */

/* ldtilecfg's operand (palette 1): bytes per row of each tile at 16 + 2t, rows at 48 + t. */
typedef struct amx_tile_config {
    uint8_t palette, start_row;
    uint8_t reserved0[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

typedef struct amx_stage {
    _Alignas(64) uint16_t a[2][AMX_TILE_ROWS][AMX_K];      /* A edge tiles, zero-padded            */
    _Alignas(64) uint16_t b[2][AMX_TILE_ROWS][AMX_K];      /* B edge tiles: 16 pair rows           */
    _Alignas(64) float c[AMX_TILE_ROWS][AMX_TILE_ROWS];    /* one C tile on its way out           */
} amx_stage;

static inline void amx_tile_config_init(amx_tile_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->colsb[t] = AMX_TILE_BYTES;
        cfg->rows[t] = AMX_TILE_ROWS;
    }
}

/* A rows [r0, r0 + rows) × k [k0, k0 + kc) into a zero-padded 16 × 32 tile. */
static inline void amx_stage_a(uint16_t (*dst)[AMX_K], const fa_cpu_gemm_bf16_args *g, int64_t r0, int rows, int64_t k0,
                               int kc) {
    memset(dst, 0, sizeof(uint16_t) * AMX_TILE_ROWS * AMX_K);
    for (int r = 0; r < rows; r++) memcpy(dst[r], g->a + (r0 + r) * g->lda + k0, sizeof(uint16_t) * (size_t)kc);
}

/* B pair rows [p0, p0 + pairs) × columns [n0, n0 + 16) into a zero-padded tile. */
static inline void amx_stage_b(uint16_t (*dst)[AMX_K], const fa_cpu_gemm_bf16_args *g, int64_t p0, int pairs,
                               int64_t n0) {
    memset(dst, 0, sizeof(uint16_t) * AMX_TILE_ROWS * AMX_K);
    for (int p = 0; p < pairs; p++) memcpy(dst[p], g->b + (p0 + p) * 2 * g->ldb + 2 * n0, sizeof(uint16_t) * AMX_K);
}

/* The block of C at (m0, n0): MB row tiles × NB column tiles (constants at every call). */
static inline __attribute__((always_inline)) AMX_TARGET void
amx_block(const int MB, const int NB, const fa_cpu_gemm_bf16_args *g, int64_t m0, int64_t n0, amx_stage *st) {
    const int64_t left = g->m - m0;
    const int rows0 = left < AMX_TILE_ROWS ? (int)left : AMX_TILE_ROWS;
    const int rows1 = MB > 1 ? (left - AMX_TILE_ROWS < AMX_TILE_ROWS ? (int)(left - AMX_TILE_ROWS) : AMX_TILE_ROWS) : 0;
    const size_t a_stride = (size_t)g->lda * sizeof(uint16_t), b_stride = (size_t)g->ldb * 2 * sizeof(uint16_t);
    AMX_ZERO(0);
    if (NB > 1) AMX_ZERO(1);
    if (MB > 1) {
        AMX_ZERO(2);
        if (NB > 1) AMX_ZERO(3);
    }
    for (int64_t k0 = 0; k0 < g->k; k0 += AMX_K) {
        const int kc = g->k - k0 < AMX_K ? (int)(g->k - k0) : AMX_K;
        const int pairs = (kc + 1) / 2; /* an odd k's last pair has 0 in its second slot (caller) */
        const uint16_t *a = g->a + m0 * g->lda + k0;
        if (kc == AMX_K && rows0 == AMX_TILE_ROWS) {
            AMX_LOAD(4, a, a_stride);
        } else {
            amx_stage_a(st->a[0], g, m0, rows0, k0, kc);
            AMX_LOAD(4, st->a[0], AMX_TILE_BYTES);
        }
        if (MB > 1) {
            if (kc == AMX_K && rows1 == AMX_TILE_ROWS) {
                AMX_LOAD(5, a + AMX_TILE_ROWS * g->lda, a_stride);
            } else {
                amx_stage_a(st->a[1], g, m0 + AMX_TILE_ROWS, rows1, k0, kc);
                AMX_LOAD(5, st->a[1], AMX_TILE_BYTES);
            }
        }
        const uint16_t *b = g->b + (k0 / 2) * 2 * g->ldb + 2 * n0;
        if (kc == AMX_K) {
            AMX_LOAD(6, b, b_stride);
            if (NB > 1) AMX_LOAD(7, b + 2 * AMX_TILE_ROWS, b_stride);
        } else {
            amx_stage_b(st->b[0], g, k0 / 2, pairs, n0);
            AMX_LOAD(6, st->b[0], AMX_TILE_BYTES);
            if (NB > 1) {
                amx_stage_b(st->b[1], g, k0 / 2, pairs, n0 + AMX_TILE_ROWS);
                AMX_LOAD(7, st->b[1], AMX_TILE_BYTES);
            }
        }
        AMX_DP(0, 4, 6);
        if (NB > 1) AMX_DP(1, 4, 7);
        if (MB > 1) {
            AMX_DP(2, 5, 6);
            if (NB > 1) AMX_DP(3, 5, 7);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NB; j++) {
            switch (2 * i + j) {
            case 0: AMX_STORE(0, st->c, AMX_TILE_BYTES); break;
            case 1: AMX_STORE(1, st->c, AMX_TILE_BYTES); break;
            case 2: AMX_STORE(2, st->c, AMX_TILE_BYTES); break;
            default: AMX_STORE(3, st->c, AMX_TILE_BYTES); break;
            }
            float *c = g->c + (m0 + AMX_TILE_ROWS * i) * g->ldc + n0 + AMX_TILE_ROWS * j;
            const int rows = i == 0 ? rows0 : rows1;
            for (int r = 0; r < rows; r++) AMX_STORE_ROW(c + r * g->ldc, st->c[r], g->alpha);
        }
}

/* Column panels of 32 (B's panel stays in L1 while A's rows stream past; n is a multiple of 16:
 * the callers pad the keys to FA_CPU_PAD), then blocks of 32 rows. */
AMX_TARGET void AMX_ENTRY(const fa_cpu_gemm_bf16_args *g) {
    amx_tile_config cfg;
    amx_tile_config_init(&cfg);
    AMX_CONFIG(&cfg);
    amx_stage st;
    for (int64_t n0 = 0; n0 < g->n; n0 += 2 * AMX_TILE_ROWS) {
        const int two_cols = g->n - n0 >= 2 * AMX_TILE_ROWS;
        for (int64_t m0 = 0; m0 < g->m; m0 += 2 * AMX_TILE_ROWS) {
            const int two_rows = g->m - m0 > AMX_TILE_ROWS;
            if (two_rows && two_cols) amx_block(2, 2, g, m0, n0, &st);
            else if (two_rows) amx_block(2, 1, g, m0, n0, &st);
            else if (two_cols) amx_block(1, 2, g, m0, n0, &st);
            else amx_block(1, 1, g, m0, n0, &st);
        }
    }
    AMX_RELEASE();
}

#endif /* FA_CPU_GEMM_BF16_AMX_IMPL_H */
