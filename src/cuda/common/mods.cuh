/*
 * mods.cuh: the score modifications of the portable CUDA kernels (fa_params.bias, dbias,
 * doc_ids_*, the block-sparse mask), for their MODS instantiations (fwd_sm80.cuh, bwd_sm80.cuh)
 * and the Hopper forward's (fwd_sm90.cu).
 * The rule is the CPU engine's (src/cpu/cpu_mods.c), applied per element by fa_mods_score, the
 * one place it is written down on the GPU:
 *
 *   element (i, j) of sequence b, query head h is visible iff it lies inside the sequence and
 *     block mask given: its block is listed full, or listed partial and the element masks hold;
 *     no block mask: the element masks hold;
 *   element masks: the element window (causal / window: the caller's range test, with
 *     elem_window_*), equal document ids, and its bit in partial_block_bits (partial blocks).
 *   A visible score becomes s + bias[b, h, i, j] (in the caller's units: `unit` per natural
 *   unit), an invisible one -inf whatever s and the bias hold.
 *
 * The block mask reaches the kernels as a dense map [batch or 1, heads_q or 1, q_blocks,
 * kv_blocks] int32 built on the device once per call (src/cuda/mods.cu): 0 = not listed, 1 =
 * full, 2 + n = partial, position n of its kv_indices list (for partial_block_bits). The caller's
 * block sizes are multiples of the kernels' tiles (mods.cu checks), so one map entry holds for a
 * whole tile: unlisted tiles are skipped, full tiles need no element mask. With the map come a
 * summary of each row and each column (how many blocks are listed, the last and the first one),
 * so a walk starts and counts its tiles with one load instead of a scan of the whole row or
 * column (fa_mods_first_tile, fa_mods_q_count).
 */
#ifndef FA_CUDA_MODS_CUH
#define FA_CUDA_MODS_CUH

#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "cuda/common/cuda_common.cuh"

/* Everything the MODS instantiations read, a kernel argument of its own after the parameter
 * block (and the dropout constants), so the parameter blocks keep their layout. */
struct fa_mods_params {
    const void *bias;            /* [b, heads_q, seqlen_q, seqlen_k] (strides below), or NULL   */
    int bias_dtype;              /* fa_dtype: F32, F16 or BF16                                  */
    int64_t bias_batch_stride, bias_head_stride, bias_row_stride, bias_col_stride;
    void *dbias;                 /* backward: dS = P∘(dP - D) per element at the strides below,
                                    in dbias_dtype (the caller's dbias, or a contiguous fp32
                                    workspace that mods.cu then reduces over the summed axes),
                                    or NULL                                                      */
    int dbias_dtype;             /* fa_dtype: F32, F16 or BF16                                  */
    int64_t dbias_batch_stride, dbias_head_stride, dbias_row_stride, dbias_col_stride;
    const int32_t *doc_ids_q;    /* [b, seqlen_q] (varlen: [total_q]), or NULL                  */
    const int32_t *doc_ids_k;
    int64_t doc_ids_q_batch_stride, doc_ids_k_batch_stride;
    const int32_t *block_map;    /* the dense block map above, or NULL: no block mask           */
    int64_t map_batch_stride, map_head_stride; /* 0 on broadcast axes                           */
    /* per map row (b, h, qb): {listed blocks, the last listed kb, its entry, 0}, and per column
     * (b, h, kb): {listed blocks, the last listed qb + 1, then as one uint64 the bitwise NOT of
     * (first listed qb << 32 | its entry)} (all zero when nothing is listed) */
    const int4 *map_rows, *map_cols;
    int64_t rows_batch_stride, rows_head_stride, cols_batch_stride, cols_head_stride; /* in int4s */
    int kv_blocks, block_q, block_k;
    const uint8_t *partial_block_bits; /* or NULL                                              */
    int64_t block_bytes;
    int64_t block_index_batch_stride, block_index_head_stride, block_index_row_stride;
    int elem_window_left, elem_window_right; /* the element window (-1 = unbounded side)        */
};

/* The argument type of the instantiations: empty without MODS (the kernels never touch it). */
template <bool MODS>
struct fa_mods_arg {};
template <>
struct fa_mods_arg<true> : fa_mods_params {};

enum { FA_MODS_NONE = 0, FA_MODS_FULL = 1, FA_MODS_PARTIAL = 2, FA_MODS_ELEMENT = 3 };

/* What one tile of (b, h) with its rows in one query block and its keys in one key block shares. */
struct fa_mods_tile {
    int status;            /* FA_MODS_*: ELEMENT without a block mask                            */
    const uint8_t *bits;   /* PARTIAL with partial_block_bits: the block's bytes, else NULL       */
    int bit_row0, bit_col0; /* first query row and key of the block                               */
    const int32_t *doc_q, *doc_k; /* the sequence's doc ids (row 0), or NULL                     */
    int64_t bias_base;     /* b·bias_batch_stride + h·bias_head_stride                            */
};

/* The map entry row of (b, h, query block of row i0): kv_blocks entries. */
__device__ __forceinline__ const int32_t *fa_mods_map_row(const fa_mods_params &mp, int b, int h, int i0) {
    return mp.block_map + b * mp.map_batch_stride + h * mp.map_head_stride +
           (int64_t)(i0 / mp.block_q) * mp.kv_blocks;
}

/* The tile of sequence b (packed starts q_start, k_start when varlen), query head h, whose rows lie
 * in query block qb and keys in key block kb, that block's map entry `entry` (ignored without a
 * block map). The walks below carry qb / kb and the entry, so the kernels on them pay no division
 * and no reload of the map per tile. */
__device__ __forceinline__ fa_mods_tile fa_mods_tile_of(const fa_mods_params &mp, int b, int h, bool varlen,
                                                        int64_t q_start, int64_t k_start, int qb, int kb,
                                                        int entry) {
    fa_mods_tile t;
    t.status = FA_MODS_ELEMENT;
    t.bits = nullptr;
    t.bit_row0 = t.bit_col0 = 0;
    if (mp.block_map != nullptr) {
        t.status = entry == 0 ? FA_MODS_NONE : entry == 1 ? FA_MODS_FULL : FA_MODS_PARTIAL;
        t.bit_row0 = qb * mp.block_q;
        t.bit_col0 = kb * mp.block_k;
        if (entry >= 2 && mp.partial_block_bits != nullptr)
            t.bits = mp.partial_block_bits +
                     (b * mp.block_index_batch_stride + h * mp.block_index_head_stride +
                      qb * mp.block_index_row_stride + (entry - 2)) * mp.block_bytes;
    }
    t.doc_q = t.doc_k = nullptr;
    if (mp.doc_ids_q != nullptr) {
        t.doc_q = mp.doc_ids_q + (varlen ? q_start : b * mp.doc_ids_q_batch_stride);
        t.doc_k = mp.doc_ids_k + (varlen ? k_start : b * mp.doc_ids_k_batch_stride);
    }
    t.bias_base = b * mp.bias_batch_stride + h * mp.bias_head_stride;
    return t;
}
/* The tile whose first row is query i0 and first key j0 (its blocks and entry looked up). */
__device__ __forceinline__ fa_mods_tile fa_mods_tile_at(const fa_mods_params &mp, int b, int h, bool varlen,
                                                        int64_t q_start, int64_t k_start, int i0, int j0) {
    if (mp.block_map == nullptr) return fa_mods_tile_of(mp, b, h, varlen, q_start, k_start, 0, 0, 0);
    const int qb = i0 / mp.block_q, kb = j0 / mp.block_k;
    return fa_mods_tile_of(mp, b, h, varlen, q_start, k_start, qb, kb, fa_mods_map_row(mp, b, h, i0)[kb]);
}

/* A fragment's bias values with many loads in flight (one load per element, each used right away,
 * exposed the memory latency once per element). fa_mods_bias_load: raw[e] = the bits of element e
 * at offset at(e) (fp32, or a 16-bit value in the low half), every load issued before any is used;
 * fa_mods_bias_value: one raw value as fp32. The dtype is tested once per call (uniform). */
template <int N, class At>
__device__ __forceinline__ void fa_mods_bias_load(const fa_mods_params &mp, uint32_t (&raw)[N], At at) {
    if (mp.bias_dtype == FA_DTYPE_F32) {
        const float *b = static_cast<const float *>(mp.bias);
#pragma unroll
        for (int e = 0; e < N; ++e) raw[e] = __float_as_uint(__ldg(b + at(e)));
    } else {
        const unsigned short *b = static_cast<const unsigned short *>(mp.bias);
#pragma unroll
        for (int e = 0; e < N; ++e) raw[e] = __ldg(b + at(e));
    }
}
__device__ __forceinline__ float fa_mods_bias_value(int dtype, uint32_t raw) {
    return dtype == FA_DTYPE_F32    ? __uint_as_float(raw)
           : dtype == FA_DTYPE_BF16 ? __uint_as_float(raw << 16)
                                    : __half2float(__ushort_as_half((unsigned short)raw));
}
/* The bias element at offset `at` as fp32 (one load, used at once: the per-element rule). */
__device__ __forceinline__ float fa_mods_load_bias(const fa_mods_params &mp, int64_t at) {
    uint32_t raw[1];
    fa_mods_bias_load(mp, raw, [&](int) { return at; });
    return fa_mods_bias_value(mp.bias_dtype, raw[0]);
}
/* x[e] += unit · bias value e, CH loads in flight at a time (the backward: the whole tile; the
 * forward's fallback for a bias that cannot be loaded early: 8, for registers). */
template <int CH, int N, class At>
__device__ __forceinline__ void fa_mods_bias_add_chunked(const fa_mods_params &mp, float (&x)[N], At at, float unit) {
    static_assert(N % CH == 0, "whole chunks");
#pragma unroll
    for (int c0 = 0; c0 < N; c0 += CH) {
        uint32_t raw[CH];
        fa_mods_bias_load(mp, raw, [&](int e) { return at(c0 + e); });
#pragma unroll
        for (int e = 0; e < CH; ++e) x[c0 + e] = fmaf(unit, fa_mods_bias_value(mp.bias_dtype, raw[e]), x[c0 + e]);
    }
}
/* Loaded early (before the GEMM the scores wait for, the loads in flight under it): elements in
 * pairs of neighbouring keys (x[2p], x[2p + 1] at at(p), at(p) + 1) of a 16-bit bias whose pairs
 * are 4-byte aligned (fa_mods_bias_pairs_ok), one 32-bit load per pair into raw[p]; added by
 * fa_mods_bias_add_pairs. */
__device__ __forceinline__ bool fa_mods_bias_pairs_ok(const fa_mods_params &mp) {
    return mp.bias_dtype != FA_DTYPE_F32 && mp.bias_col_stride == 1 && ((uintptr_t)mp.bias & 3u) == 0 &&
           ((mp.bias_batch_stride | mp.bias_head_stride | mp.bias_row_stride) & 1) == 0;
}
template <int P, class At>
__device__ __forceinline__ void fa_mods_bias_load_pairs(const fa_mods_params &mp, uint32_t (&raw)[P], At at) {
    const unsigned short *b = static_cast<const unsigned short *>(mp.bias);
#pragma unroll
    for (int p = 0; p < P; ++p) raw[p] = __ldg(reinterpret_cast<const unsigned int *>(b + at(p)));
}
template <int P>
__device__ __forceinline__ void fa_mods_bias_add_pairs(const fa_mods_params &mp, float (&x)[2 * P],
                                                       const uint32_t (&raw)[P], float unit) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        x[2 * p] = fmaf(unit, fa_mods_bias_value(mp.bias_dtype, raw[p] & 0xFFFFu), x[2 * p]);
        x[2 * p + 1] = fmaf(unit, fa_mods_bias_value(mp.bias_dtype, raw[p] >> 16), x[2 * p + 1]);
    }
}

/* The score of element (query i, key j) of the tile: x (the caller's units, `unit` of them per
 * natural unit of the bias) plus the bias when visible, else -inf. in_bounds: i < len_q and
 * j < len_k; in_window: the element window holds (elem_window_*; ignored in full blocks). */
template <bool BIAS = true> /* false: a kernel instantiated for problems without a bias */
__device__ __forceinline__ float fa_mods_score(const fa_mods_params &mp, const fa_mods_tile &t, int i, int j,
                                               bool in_bounds, bool in_window, float x, float unit) {
    bool visible = in_bounds && t.status != FA_MODS_NONE;
    if (visible && t.status != FA_MODS_FULL) {
        visible = in_window;
        if (visible && t.doc_q != nullptr) visible = __ldg(t.doc_q + i) == __ldg(t.doc_k + j);
        if (visible && t.bits != nullptr) {
            const int64_t bit = (int64_t)(i - t.bit_row0) * mp.block_k + (j - t.bit_col0);
            visible = (__ldg(t.bits + (bit >> 3)) >> (bit & 7)) & 1;
        }
    }
    if (!visible) return -CUDART_INF_F;
    if (BIAS && mp.bias != nullptr)
        x += unit * fa_mods_load_bias(mp, t.bias_base + (int64_t)i * mp.bias_row_stride + (int64_t)j * mp.bias_col_stride);
    return x;
}

/* One value into a dbias of dtype `dtype` (fa_dtype: F32, F16 or BF16; rounded to nearest even). */
__device__ __forceinline__ void fa_mods_store_as(void *base, int dtype, int64_t at, float v) {
    if (dtype == FA_DTYPE_F32)
        static_cast<float *>(base)[at] = v;
    else
        static_cast<unsigned short *>(base)[at] =
            (unsigned short)(dtype == FA_DTYPE_BF16 ? cvt_rn_bf16x2_f32(v, 0.0f) : cvt_rn_f16x2_f32(v, 0.0f));
}
/* dL/dbias of element (b, h, i, j) (visible or 0) into the dS target. */
__device__ __forceinline__ void fa_mods_store_dbias(const fa_mods_params &mp, int b, int h, int i, int j, float ds) {
    fa_mods_store_as(mp.dbias, mp.dbias_dtype,
                     b * mp.dbias_batch_stride + h * mp.dbias_head_stride + (int64_t)i * mp.dbias_row_stride +
                         (int64_t)j * mp.dbias_col_stride,
                     ds);
}

/* The walks test the next block's entry alone first (a dense map stops there), then read the map
 * FA_MODS_SCAN entries at a time, every load issued before any is tested: a scan over unlisted
 * blocks then waits one memory latency per FA_MODS_SCAN entries, not one per entry (a column of
 * the map is kv_blocks entries apart, a cache line each). */
#define FA_MODS_SCAN 8

/* Entries first, first + dir, ..., FA_MODS_SCAN of them, of a map row (stride 1) or column
 * (stride kv_blocks) at `base`; positions outside [0, n) read as 0. */
__device__ __forceinline__ void fa_mods_load_entries(const int32_t *base, int first, int dir, int n, int64_t stride,
                                                     int32_t (&e)[FA_MODS_SCAN]) {
#pragma unroll
    for (int u = 0; u < FA_MODS_SCAN; ++u) {
        const int x = first + dir * u;
        e[u] = x >= 0 && x < n ? __ldg(base + x * stride) : 0;
    }
}

/* The forward's key-tile walk over a block-map row (tiles of TILE_N keys, tiles_per_block per key
 * block, key_tiles = ceil(len_k / TILE_N)), from the last visited tile down. A position is the
 * tile, its key block and that block's map entry; tile -1: none left. */
struct fa_mods_k_pos {
    int tile, kb, entry;
};
__device__ __forceinline__ int fa_mods_last_tile_of(int kb, int tiles_per_block, int key_tiles) {
    return min((kb + 1) * tiles_per_block, key_tiles) - 1;
}
/* The last listed block at or below kb (its last tile), or tile -1. */
__device__ __forceinline__ fa_mods_k_pos fa_mods_k_scan_down(const int32_t *map_row, int kb, int tiles_per_block,
                                                             int key_tiles) {
    fa_mods_k_pos p = {-1, -1, 0};
    if (kb >= 0) {
        const int32_t e = __ldg(map_row + kb);
        if (e != 0) return fa_mods_k_pos{fa_mods_last_tile_of(kb, tiles_per_block, key_tiles), kb, e};
        --kb;
    }
    for (; kb >= 0; kb -= FA_MODS_SCAN) {
        int32_t e[FA_MODS_SCAN];
        fa_mods_load_entries(map_row, kb, -1, kb + 1, 1, e);
#pragma unroll
        for (int u = 0; u < FA_MODS_SCAN; ++u)
            if (e[u] != 0) {
                p.kb = kb - u;
                p.entry = e[u];
                p.tile = fa_mods_last_tile_of(p.kb, tiles_per_block, key_tiles);
                return p;
            }
    }
    return p;
}
/* The next visited tile below p's (tile -1: none). */
__device__ __forceinline__ void fa_mods_prev_tile(const int32_t *map_row, int tiles_per_block, int key_tiles,
                                                  fa_mods_k_pos &p) {
    if (p.tile > p.kb * tiles_per_block) {
        --p.tile;
        return;
    }
    p = fa_mods_k_scan_down(map_row, p.kb - 1, tiles_per_block, key_tiles);
}
/* The first (highest) visited tile (tile -1: none), and how many tiles are visited, of the map
 * row map_row of (b, h, query block qb). From the row's summary: the listed blocks below the last
 * are whole tiles_per_block tiles, the last may end at key_tiles; a row listing a block past the
 * sequence's keys (varlen) is scanned. */
__device__ __forceinline__ fa_mods_k_pos fa_mods_first_tile(const fa_mods_params &mp, int b, int h, int qb,
                                                            const int32_t *map_row, int tiles_per_block,
                                                            int key_tiles, int *count) {
    const int kb_end = min(mp.kv_blocks, (key_tiles + tiles_per_block - 1) / tiles_per_block);
    const int4 sum = __ldg(mp.map_rows + b * mp.rows_batch_stride + h * mp.rows_head_stride + qb);
    if (sum.x == 0) {
        *count = 0;
        return fa_mods_k_pos{-1, -1, 0};
    }
    if (sum.y < kb_end) {
        const int last = fa_mods_last_tile_of(sum.y, tiles_per_block, key_tiles);
        *count = (sum.x - 1) * tiles_per_block + last + 1 - sum.y * tiles_per_block;
        return fa_mods_k_pos{last, sum.y, sum.z};
    }
    int n = 0;
    for (int kb = 0; kb < kb_end; kb += FA_MODS_SCAN) {
        int32_t e[FA_MODS_SCAN];
        fa_mods_load_entries(map_row, kb, 1, kb_end, 1, e);
#pragma unroll
        for (int u = 0; u < FA_MODS_SCAN; ++u)
            if (e[u] != 0) n += fa_mods_last_tile_of(kb + u, tiles_per_block, key_tiles) + 1 - (kb + u) * tiles_per_block;
    }
    *count = n;
    return fa_mods_k_scan_down(map_row, kb_end - 1, tiles_per_block, key_tiles);
}

/* The backward's walk over the transposed structure: for the key block of key j0, the query
 * tiles (of TILE_Q rows, tiles_per_block per query block, q_tiles = ceil(len_q / TILE_Q)) of the
 * listed query blocks, head by head over [h_begin, h_end), ascending: the map's column of that
 * key block. A position is the head h, the query tile, its query block and that block's map
 * entry; fa_mods_next_q_tile steps to the next listed one (h == h_end: none left). */
struct fa_mods_q_walk {
    const int32_t *column; /* map entry of (b, h_begin, query block 0, key block)             */
    int64_t head_step;     /* map_head_stride                                                 */
    const int4 *summary;   /* the column's summary of (b, h_begin, key block)                 */
    int64_t summary_step;  /* cols_head_stride                                                */
    int kv_blocks, tiles_per_block, q_tiles, q_blocks, h_end, kb;
};
struct fa_mods_q_pos {
    int h, tile, qb, entry;
};
__device__ __forceinline__ fa_mods_q_walk fa_mods_q_walk_at(const fa_mods_params &mp, int b, int h_begin, int h_end,
                                                          int j0, int tile_q, int len_q) {
    fa_mods_q_walk w;
    w.kb = j0 / mp.block_k;
    w.column = mp.block_map + b * mp.map_batch_stride + h_begin * mp.map_head_stride + w.kb;
    w.head_step = mp.map_head_stride;
    w.summary = mp.map_cols + b * mp.cols_batch_stride + h_begin * mp.cols_head_stride + w.kb;
    w.summary_step = mp.cols_head_stride;
    w.kv_blocks = mp.kv_blocks;
    w.tiles_per_block = mp.block_q / tile_q;
    w.q_tiles = (len_q + tile_q - 1) / tile_q;
    w.q_blocks = (w.q_tiles + w.tiles_per_block - 1) / w.tiles_per_block;
    w.h_end = h_end;
    return w;
}
/* The first listed position at or after query block qb of head p.h (h relative to h_begin). */
__device__ __forceinline__ void fa_mods_q_scan(const fa_mods_q_walk &w, int h_begin, int qb, fa_mods_q_pos &p) {
    for (; p.h < w.h_end; ++p.h, qb = 0) {
        const int32_t *col = w.column + (p.h - h_begin) * w.head_step;
        if (qb < w.q_blocks) {
            const int32_t e = __ldg(col + (int64_t)qb * w.kv_blocks);
            if (e != 0) {
                p.qb = qb;
                p.entry = e;
                p.tile = qb * w.tiles_per_block;
                return;
            }
            ++qb;
        }
        for (; qb < w.q_blocks; qb += FA_MODS_SCAN) {
            int32_t e[FA_MODS_SCAN];
            fa_mods_load_entries(col, qb, 1, w.q_blocks, w.kv_blocks, e);
#pragma unroll
            for (int u = 0; u < FA_MODS_SCAN; ++u)
                if (e[u] != 0) {
                    p.qb = qb + u;
                    p.entry = e[u];
                    p.tile = p.qb * w.tiles_per_block;
                    return;
                }
        }
    }
    p.tile = p.qb = p.entry = 0;
}
/* The first listed position: the first head whose column lists a block, its first listed block
 * from the column's summary (scanned when that block lies past the sequence's queries). */
__device__ __forceinline__ fa_mods_q_pos fa_mods_first_q_tile(const fa_mods_q_walk &w, int h_begin) {
    fa_mods_q_pos p;
    for (p.h = h_begin; p.h < w.h_end; ++p.h) {
        const int4 sum = __ldg(w.summary + (p.h - h_begin) * w.summary_step);
        if (sum.x == 0) continue;
        const uint64_t first = ~((uint64_t)(uint32_t)sum.w << 32 | (uint32_t)sum.z);
        p.qb = (int)(first >> 32);
        if (p.qb >= w.q_blocks) break;
        p.entry = (int)(uint32_t)first;
        p.tile = p.qb * w.tiles_per_block;
        return p;
    }
    fa_mods_q_scan(w, h_begin, 0, p);
    return p;
}
__device__ __forceinline__ void fa_mods_next_q_tile(const fa_mods_q_walk &w, int h_begin, fa_mods_q_pos &p) {
    if (p.tile + 1 < min((p.qb + 1) * w.tiles_per_block, w.q_tiles)) {
        ++p.tile;
        return;
    }
    fa_mods_q_scan(w, h_begin, p.qb + 1, p);
}
/* How many positions the walk has: per head from the column's summary (the listed blocks below
 * the last are whole tiles_per_block tiles, the last may end at q_tiles), or a scan of the column
 * when it lists a block past the sequence's queries (varlen). */
__device__ __forceinline__ int fa_mods_q_count(const fa_mods_q_walk &w, int h_begin) {
    int n = 0;
    for (int h = h_begin; h < w.h_end; ++h) {
        const int4 sum = __ldg(w.summary + (h - h_begin) * w.summary_step);
        const int last = sum.y - 1;
        if (last < w.q_blocks) {
            if (sum.x > 0)
                n += (sum.x - 1) * w.tiles_per_block + min(w.q_tiles, (last + 1) * w.tiles_per_block) -
                     last * w.tiles_per_block;
            continue;
        }
        const int32_t *col = w.column + (h - h_begin) * w.head_step;
        for (int qb = 0; qb < w.q_blocks; qb += FA_MODS_SCAN) {
            int32_t e[FA_MODS_SCAN];
            fa_mods_load_entries(col, qb, 1, w.q_blocks, w.kv_blocks, e);
#pragma unroll
            for (int u = 0; u < FA_MODS_SCAN; ++u)
                if (e[u] != 0)
                    n += min(w.q_tiles, (qb + u + 1) * w.tiles_per_block) - (qb + u) * w.tiles_per_block;
        }
    }
    return n;
}

/* ---- host side (src/cuda/mods.cu) ---------------------------------------------------------- */

/* The CUDA limits of a call with score modifications (pb->has_mods or dbias): no dropout, no
 * paged K/V, block sizes multiples of the kernel tiles (tile_q × tile_k, the largest of the
 * kernels the call runs), workspace sizes (the backward's dS too) within 64 bits. `path` names
 * the caller. */
fa_status fa_cuda_mods_check(const fa_problem *pb, int tile_q, int tile_k, int backward, const char *path);
/* Workspace of the block map and its check slot (0 without a block mask). */
size_t fa_cuda_mods_map_bytes(const fa_problem *pb);
/* Fills *mp from the problem; with a block mask builds the map in map_ws (map_bytes) on the
 * device, checks every list there and waits for the verdict: FA_ERR_INVALID_ARGUMENT naming
 * the field and position (the CPU's message) before anything is written. */
fa_status fa_cuda_mods_prepare(const fa_problem *pb, void *map_ws, cudaStream_t stream, fa_mods_params *mp);
/* dbias: 1 when a summed axis (stride 0) has more than one index, so dS goes to a workspace
 * [batch, heads_q, seqlen_q, seqlen_k] fp32 and a reduction writes dbias. */
int fa_cuda_dbias_reduces(const fa_params *p);
size_t fa_cuda_dbias_workspace_bytes(const fa_problem *pb);
/* Before the main kernel: zero the dS target (dbias, or the workspace) and point mp at it. */
fa_status fa_cuda_dbias_begin(const fa_problem *pb, float *dbias_ws, cudaStream_t stream, fa_mods_params *mp);
/* After it: the fixed-order sums over the summed axes into dbias (when it reduces). */
fa_status fa_cuda_dbias_finish(const fa_problem *pb, const float *dbias_ws, cudaStream_t stream);

#endif /* FA_CUDA_MODS_CUH */
