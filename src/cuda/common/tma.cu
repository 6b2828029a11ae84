/*
 * tma.cu: TMA tensor maps for the Hopper kernels (tma.h). Host code only; built
 * with the other CUDA sources (no device code, so every -gencode target is fine).
 */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/tma.h"

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda at link time). */
static PFN_cuTensorMapEncodeTiled_v12000 fa_hopper_encode_fn(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
        void *ptr = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)ptr;
        else
            (void)cudaGetLastError();
    });
    return fn;
}

fa_status fa_hopper_make_map(CUtensorMap *map, const char *path, const char *name, CUtensorMapDataType type,
                             const void *base, int64_t dim, int64_t rows, int64_t heads, int64_t batch,
                             int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
    return fa_hopper_make_map_rows(map, path, name, type, base, dim, rows, heads, batch, row_stride, head_stride,
                                   batch_stride, box_rows, 128);
}

fa_status fa_hopper_make_map_rows(CUtensorMap *map, const char *path, const char *name, CUtensorMapDataType type,
                                  const void *base, int64_t dim, int64_t rows, int64_t heads, int64_t batch,
                                  int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                                  int row_bytes) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = fa_hopper_encode_fn();
    if (encode == nullptr)
        return fa_set_error(FA_ERR_CUDA, "cuTensorMapEncodeTiled is not available from the CUDA driver");
    const int64_t strides_el[3] = {row_stride, head_stride, batch_stride};
    const int64_t extents[3] = {rows, heads, batch};
    static const char *const axis[3] = {"row", "head", "batch"};
    const int64_t elem_bytes = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 2;
    cuuint64_t stride_bytes[3];
    for (int i = 0; i < 3; ++i) {
        if (!fa_hopper_tma_stride_elems_ok(strides_el[i], (int)elem_bytes, extents[i]))
            return fa_set_error(FA_ERR_STRIDE,
                                "%s_%s_stride = %lld: %s (TMA) needs a positive multiple of %d elements below 2^%d",
                                name, axis[i], (long long)strides_el[i], path, (int)(16 / elem_bytes),
                                elem_bytes == 1 ? 40 : 39);
        /* an axis of extent 1 is never stepped along: any valid stride will do */
        stride_bytes[i] = (cuuint64_t)(extents[i] == 1 ? 16 : elem_bytes * strides_el[i]);
    }
    const cuuint64_t dims[4] = {(cuuint64_t)dim, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)batch};
    const cuuint32_t box[4] = {(cuuint32_t)(row_bytes / elem_bytes), (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, type, 4, const_cast<void *>(base), dims, stride_bytes, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE,
                              row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fa_set_error(FA_ERR_CUDA,
                            "cuTensorMapEncodeTiled(%s) failed with CUresult %d: dims {%llu, %llu, %llu, %llu}, "
                            "byte strides {%llu, %llu, %llu}, box {%d, %d, 1, 1}",
                            name, (int)r, (unsigned long long)dims[0], (unsigned long long)dims[1],
                            (unsigned long long)dims[2], (unsigned long long)dims[3],
                            (unsigned long long)stride_bytes[0], (unsigned long long)stride_bytes[1],
                            (unsigned long long)stride_bytes[2], (int)box[0], box_rows);
    return FA_OK;
}

fa_status fa_hopper_make_accum_map(CUtensorMap *map, const char *path, float *base, int64_t dim, int64_t rows,
                                   int64_t heads, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = fa_hopper_encode_fn();
    if (encode == nullptr)
        return fa_set_error(FA_ERR_CUDA, "cuTensorMapEncodeTiled is not available from the CUDA driver");
    const cuuint64_t dims[3] = {(cuuint64_t)dim, (cuuint64_t)rows, (cuuint64_t)heads};
    const cuuint64_t stride_bytes[2] = {(cuuint64_t)(4 * dim), (cuuint64_t)(4 * dim * rows)};
    const cuuint32_t box[3] = {32, (cuuint32_t)box_rows, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, dims, stride_bytes, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fa_set_error(FA_ERR_CUDA,
                            "cuTensorMapEncodeTiled(%s dq accumulator) failed with CUresult %d: dims {%llu, %llu, "
                            "%llu}, box {32, %d, 1}",
                            path, (int)r, (unsigned long long)dims[0], (unsigned long long)dims[1],
                            (unsigned long long)dims[2], box_rows);
    return FA_OK;
}
