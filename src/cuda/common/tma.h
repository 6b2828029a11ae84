/*
 * tma.h: host-side construction of the TMA tensor maps the Hopper kernels
 * (fwd_sm90.cu, bwd_sm90.cu) load their tiles with. Host code only.
 */
#ifndef FA_HOPPER_TMA_H
#define FA_HOPPER_TMA_H

#include <cuda.h>
#include <stdint.h>

#include "flashattn.h"

/* A [batch, rows, heads, dim] 16-bit (or, type UINT8, 8-bit) tensor (strides in elements) as the
 * 4-D map {dim, rows, heads, batch} with box {128-byte rows, box_rows, 1, 1} (64 or 128
 * elements), 128-byte swizzle, zero fill (columns past dim and rows past `rows` read as zeros).
 * The caller has checked the base (16-byte aligned); here: strides positive multiples of 16
 * bytes below 2^40 (FA_ERR_STRIDE otherwise,
 * so the caller can fall back to a portable kernel) and the driver's own checks (FA_ERR_CUDA).
 * `path` names the kernel in messages. */
fa_status fa_hopper_make_map(CUtensorMap *map, const char *path, const char *name, CUtensorMapDataType type,
                             const void *base, int64_t dim, int64_t rows, int64_t heads, int64_t batch,
                             int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows);

/* The same with boxes of row_bytes (128: the 128-byte swizzle, as above; 64: the 64-byte swizzle,
 * the fp8 forward's Q and K at head dims up to 64). */
fa_status fa_hopper_make_map_rows(CUtensorMap *map, const char *path, const char *name, CUtensorMapDataType type,
                                  const void *base, int64_t dim, int64_t rows, int64_t heads, int64_t batch,
                                  int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                                  int row_bytes);

/* The backward's fp32 dQ accumulator [heads, rows, dim] (dense) as the 3-D map {dim, rows, heads}
 * with box {32, box_rows, 1} (128-byte rows), 128-byte swizzle: the target of the Hopper
 * backward's bulk reduce-adds at bucket 256 (columns past dim and rows past `rows` are skipped). FA_ERR_CUDA
 * when the driver refuses it. */
fa_status fa_hopper_make_accum_map(CUtensorMap *map, const char *path, float *base, int64_t dim, int64_t rows,
                                   int64_t heads, int box_rows);

#endif /* FA_HOPPER_TMA_H */
