/*
 * gemm_bf16_impl.h: the part of the bf16 × bf16 GEMMs (fa_cpu_gemm_bf16_args) that is the same on
 * every instruction set: the dispatch of a tile's rows and vectors to compile-time constants and
 * the walk over column panels and row tiles. Not a public header: gemm_bf16_avx512.c and
 * gemm_bf16_neon.c define
 *   BF16_ROWS, BF16_VECS   the register tile: ROWS rows × VECS vectors of C
 *   BF16_LANES             fp32 lanes per vector (columns of C per vector)
 *   BF16_TARGET            the function attribute that enables the instructions (or nothing)
 *   BF16_ENTRY             the name of the GEMM this file defines
 *   gemm_bf16_tile(rows, vecs, g, m0, n0)   C[m0 .. m0+rows)[n0 .. n0+vecs·LANES) = alpha · A B
 * and then include this file.
 */
#ifndef FA_CPU_GEMM_BF16_IMPL_H
#define FA_CPU_GEMM_BF16_IMPL_H

static inline __attribute__((always_inline)) BF16_TARGET void
gemm_bf16_tile_vecs(const int rows, int vecs, const fa_cpu_gemm_bf16_args *g, int64_t m0, int64_t n0) {
    switch (vecs) {
    case 4: gemm_bf16_tile(rows, 4, g, m0, n0); break;
    case 3: gemm_bf16_tile(rows, 3, g, m0, n0); break;
    case 2: gemm_bf16_tile(rows, 2, g, m0, n0); break;
    default: gemm_bf16_tile(rows, 1, g, m0, n0); break;
    }
}

/* The remainder rows (fewer than BF16_ROWS) of a panel. */
static BF16_TARGET void gemm_bf16_tail_rows(int rows, int vecs, const fa_cpu_gemm_bf16_args *g, int64_t m0, int64_t n0) {
    switch (rows) {
    case 5: gemm_bf16_tile_vecs(5, vecs, g, m0, n0); break;
    case 4: gemm_bf16_tile_vecs(4, vecs, g, m0, n0); break;
    case 3: gemm_bf16_tile_vecs(3, vecs, g, m0, n0); break;
    case 2: gemm_bf16_tile_vecs(2, vecs, g, m0, n0); break;
    default: gemm_bf16_tile_vecs(1, vecs, g, m0, n0); break;
    }
}

/* Column panels of BF16_VECS vectors (B's panel stays in L1 while A's rows stream past; n is a
 * multiple of BF16_LANES: the callers pad the keys to FA_CPU_PAD), then row tiles of BF16_ROWS. */
BF16_TARGET void BF16_ENTRY(const fa_cpu_gemm_bf16_args *g) {
    for (int64_t n0 = 0; n0 < g->n; n0 += BF16_VECS * BF16_LANES) {
        const int64_t left = (g->n - n0) / BF16_LANES;
        const int vecs = left < BF16_VECS ? (int)left : BF16_VECS;
        int64_t m0 = 0;
        for (; m0 + BF16_ROWS <= g->m; m0 += BF16_ROWS) gemm_bf16_tile_vecs(BF16_ROWS, vecs, g, m0, n0);
        if (m0 < g->m) gemm_bf16_tail_rows((int)(g->m - m0), vecs, g, m0, n0);
    }
}

#endif /* FA_CPU_GEMM_BF16_IMPL_H */
