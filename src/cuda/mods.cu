/*
 * mods.cu: host side of the score modifications on CUDA (bias, dbias, document ids, block-sparse
 * masks; the rule and the kernels' view: common/mods.cuh), and their small kernels:
 *
 *   fa_mods_map_kernel     the dense block map [nb, nh, q_blocks, kv_blocks] and its row and
 *                          column summaries from the caller's lists, one warp per list row,
 *                          checking every row as it goes (the first bad row's position lands in a
 *                          slot the host reads back: the one synchronisation of a call with a
 *                          block mask, so that a bad mask is rejected before any output is
 *                          written)
 *   fa_dbias_kernel        dbias: zero it before the backward's main kernel (dS stored in place;
 *                          not when every tile is visited), or sum the dS workspace over the
 *                          summed axes in a fixed order after it, in dbias's dtype
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/mods.cuh"

/* ---- block map ------------------------------------------------------------------------------ */

struct fa_map_build_params {
    const int32_t *counts, *indices, *full_counts, *full_indices; /* full_*: NULL without full lists */
    int64_t count_batch_stride, count_head_stride;
    int64_t index_batch_stride, index_head_stride, index_row_stride;
    int nb, nh, q_blocks, kv_blocks;
    int32_t *map;                  /* [nb, nh, q_blocks, kv_blocks], zeroed                   */
    int4 *rows, *cols;             /* summaries [nb, nh, q_blocks] and [nb, nh, kv_blocks], zeroed */
    unsigned long long *bad_row;   /* first bad row (b·nh + h)·q_blocks + qb, or ULLONG_MAX    */
};

/* One warp per list row, its lanes over 32 entries at a time: an entry's index and the map word
 * it checks load in parallel across the lanes (one thread per row waited for two dependent loads
 * per entry). The row stops at its first bad entry, as a sequential walk would: entries before it
 * are written, none after it (so the map only ever holds in-range entries), and a bad row writes
 * no row summary. The full list's check that a block is not in the partial list reads the map
 * after the partial list's writes by the same warp (__syncwarp orders them). */
enum { FA_MODS_MAP_ROWS = 4 }; /* list rows per block, a warp each */
__global__ void __launch_bounds__(32 * FA_MODS_MAP_ROWS) fa_mods_map_kernel(const fa_map_build_params bp) {
    const int64_t row = (int64_t)blockIdx.x * FA_MODS_MAP_ROWS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= (int64_t)bp.nb * bp.nh * bp.q_blocks) return; /* uniform over the warp */
    const int qb = (int)(row % bp.q_blocks);
    const int h = (int)((row / bp.q_blocks) % bp.nh);
    const int b = (int)(row / ((int64_t)bp.q_blocks * bp.nh));
    const int64_t c_off = b * bp.count_batch_stride + h * bp.count_head_stride + qb;
    const int64_t i_off = b * bp.index_batch_stride + h * bp.index_head_stride + qb * bp.index_row_stride;
    int32_t *map = bp.map + row * bp.kv_blocks;
    /* column summaries of (b, h): the first listed query block as the largest NOT of (qb << 32 |
     * entry), so a zeroed summary means none and atomicMax keeps the smallest qb */
    int4 *cols = bp.cols + ((int64_t)b * bp.nh + h) * bp.kv_blocks;
    int listed = 0, last = -1, last_entry = 0;
    bool ok = true;
    for (int list = 0; list < 2 && ok; ++list) {
        const int32_t *counts = list == 0 ? bp.counts : bp.full_counts;
        const int32_t *indices = list == 0 ? bp.indices : bp.full_indices;
        if (counts == nullptr) break;
        const int32_t n = counts[c_off];
        ok = n >= 0 && n <= bp.kv_blocks;
        int32_t prev = -1; /* the chunk before's last entry */
        for (int32_t x0 = 0; ok && x0 < n; x0 += 32) {
            const int32_t x = x0 + lane;
            const int32_t kb = x < n ? indices[i_off + x] : INT32_MAX;
            const int32_t before = __shfl_up_sync(0xffffffffu, kb, 1);
            bool good = x >= n || ((lane == 0 ? kb > prev : kb > before) && kb < bp.kv_blocks);
            if (list == 1 && x < n && good) good = map[kb] == 0;
            const unsigned bad = __ballot_sync(0xffffffffu, !good);
            const int valid = bad ? __ffs(bad) - 1 : 32; /* entries x0 .. x0 + valid - 1 stand */
            if (lane < valid && x < n) {
                const int32_t entry = list == 0 ? 2 + x : 1;
                map[kb] = entry;
                atomicAdd(&cols[kb].x, 1);
                atomicMax(&cols[kb].y, qb + 1);
                atomicMax(reinterpret_cast<unsigned long long *>(&cols[kb].z),
                          ~((unsigned long long)qb << 32 | (uint32_t)entry));
            }
            const int32_t written = min(valid, n - x0);
            if (written > 0) {
                const int32_t top = __shfl_sync(0xffffffffu, kb, written - 1); /* a sorted list's largest so far */
                if (top > last) {
                    last = top;
                    last_entry = list == 0 ? 2 + x0 + written - 1 : 1;
                }
                listed += written;
                prev = top;
            }
            ok = bad == 0;
        }
        __syncwarp(); /* the partial list's map writes before the full list's reads */
    }
    if (!ok) {
        if (lane == 0) atomicMin(bp.bad_row, (unsigned long long)row);
        return;
    }
    if (lane == 0) bp.rows[row] = make_int4(listed, last, last_entry, 0);
}

/* 4·a·b·c·d + 512 bytes without overflow. */
static int workspace_product(int64_t a, int64_t b, int64_t c, int64_t d, size_t *bytes) {
    uint64_t x = 4;
    const int64_t f[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i)
        if (f[i] < 0 || __builtin_mul_overflow(x, (uint64_t)f[i], &x)) return 0;
    if (x > UINT64_MAX - 512) return 0;
    *bytes = (size_t)x;
    return 1;
}

static int64_t map_batches(const fa_params *p);
static int64_t map_heads(const fa_params *p);

fa_status fa_cuda_mods_check(const fa_problem *pb, int tile_q, int tile_k, int backward, const char *path) {
    const fa_params *p = &pb->p;
    if (pb->has_dropout)
        return fa_set_error(FA_ERR_UNSUPPORTED, "dropout_p = %g with %s: %s does not combine attention dropout "
                            "with score biases or masks (the CPU does)", (double)p->dropout_p,
                            p->bias ? "bias" : p->kv_num_blocks ? "kv_num_blocks" : "doc_ids_q", path);
    if (p->block_table != nullptr)
        return fa_set_error(FA_ERR_UNSUPPORTED, "block_table with %s: %s has no score biases or masks over a "
                            "paged K/V", p->bias ? "bias" : p->kv_num_blocks ? "kv_num_blocks" : "doc_ids_q", path);
    if (pb->has_block_mask && (p->block_q % tile_q != 0 || p->block_k % tile_k != 0))
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "%s = %lld: %s needs block_q a multiple of %d and block_k a multiple of %d at "
                            "head_dim %lld (its tiles; 128 × 128 suits every CUDA kernel)",
                            p->block_q % tile_q != 0 ? "block_q" : "block_k",
                            (long long)(p->block_q % tile_q != 0 ? p->block_q : p->block_k), path, tile_q, tile_k,
                            (long long)p->head_dim);
    fa_status s;
    if (pb->has_block_mask && (s = fa_cuda_check_aligned("workspace", p->workspace, 256)) != FA_OK) return s;
    if (pb->has_block_mask && (pb->q_blocks > INT32_MAX / 2 || pb->kv_blocks > INT32_MAX / 2))
        return fa_set_error(FA_ERR_INVALID_SIZE, "block_q / block_k: too many blocks for %s", path);
    /* the workspaces' sizes (block map, dS) must fit in 64 bits */
    size_t bytes;
    if (pb->has_block_mask && !workspace_product(map_batches(p), map_heads(p), pb->q_blocks, pb->kv_blocks, &bytes))
        return fa_set_error(FA_ERR_OVERFLOW, "kv_num_blocks: the block map of %s overflows 64-bit sizes", path);
    if (backward && fa_cuda_dbias_reduces(p) && !workspace_product(p->batch, p->heads_q, p->seqlen_q, p->seqlen_k, &bytes))
        return fa_set_error(FA_ERR_OVERFLOW, "dbias: the dS workspace of %s (batch × heads_q × seqlen_q × "
                            "seqlen_k fp32) overflows 64-bit sizes", path);
    return FA_OK;
}

/* Broadcast list axes (both the counts' and the indices' stride 0) hold one list set. */
static int64_t map_batches(const fa_params *p) {
    return p->block_count_batch_stride == 0 && p->block_index_batch_stride == 0 ? 1 : p->batch;
}
static int64_t map_heads(const fa_params *p) {
    return p->block_count_head_stride == 0 && p->block_index_head_stride == 0 ? 1 : p->heads_q;
}

/* Bytes of the map workspace's parts: the check slot (256), the map, the row summaries and the
 * column summaries (16 bytes per row and per column), each 256-byte aligned. */
static void map_parts(const fa_problem *pb, size_t *map_bytes, size_t *rows_bytes, size_t *cols_bytes) {
    const fa_params *p = &pb->p;
    const size_t heads = (size_t)map_batches(p) * (size_t)map_heads(p);
    *map_bytes = heads * (size_t)pb->q_blocks * (size_t)pb->kv_blocks * 4;
    *rows_bytes = heads * (size_t)pb->q_blocks * 16;
    *cols_bytes = heads * (size_t)pb->kv_blocks * 16;
}

size_t fa_cuda_mods_map_bytes(const fa_problem *pb) {
    if (!pb->has_block_mask) return 0;
    size_t map_bytes, rows_bytes, cols_bytes;
    map_parts(pb, &map_bytes, &rows_bytes, &cols_bytes);
    return 256 + fa_cuda_align256(map_bytes) + fa_cuda_align256(rows_bytes) + fa_cuda_align256(cols_bytes);
}

/* The first bad row, copied back and checked on the host for the CPU's message. */
static fa_status report_bad_row(const fa_problem *pb, unsigned long long row, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    const int64_t nh = map_heads(p), qbs = pb->q_blocks;
    const int64_t qb = (int64_t)(row % (unsigned long long)qbs), h = (int64_t)((row / qbs) % nh),
                  b = (int64_t)(row / ((unsigned long long)qbs * nh));
    const int64_t c_off = b * p->block_count_batch_stride + h * p->block_count_head_stride + qb;
    const int64_t i_off = b * p->block_index_batch_stride + h * p->block_index_head_stride + qb * p->block_index_row_stride;
    const size_t list_bytes = (size_t)pb->kv_blocks * 4;
    int32_t counts[2] = {0, 0};
    int32_t *lists = static_cast<int32_t *>(malloc(2 * list_bytes + 8));
    if (lists == nullptr) return fa_set_error(FA_ERR_ALLOC, "block mask check: out of host memory");
    fa_status s = FA_OK;
    cudaError_t e = cudaMemcpyAsync(&counts[0], p->kv_num_blocks + c_off, 4, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(lists, p->kv_indices + i_off, list_bytes, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess && p->full_kv_num_blocks != nullptr)
        e = cudaMemcpyAsync(&counts[1], p->full_kv_num_blocks + c_off, 4, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess && p->full_kv_indices != nullptr)
        e = cudaMemcpyAsync(lists + pb->kv_blocks, p->full_kv_indices + i_off, list_bytes, cudaMemcpyDeviceToHost,
                            stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
        s = fa_set_error(FA_ERR_CUDA, "block mask check: reading the bad row back: %s", cudaGetErrorString(e));
    } else {
        /* the host check reads at most kv_blocks entries per list: clamp the counts it loops over
         * only after it has judged them (it reports an out-of-range count first) */
        s = fa_check_block_row(pb, b, h, qb, counts[0], lists, counts[1],
                               p->full_kv_indices != nullptr ? lists + pb->kv_blocks : NULL);
        if (s == FA_OK)
            s = fa_set_error(FA_ERR_INVALID_ARGUMENT, "kv_num_blocks / kv_indices: block-list row [%lld][%lld][%lld] "
                             "changed while the call read it", (long long)b, (long long)h, (long long)qb);
    }
    free(lists);
    return s;
}

fa_status fa_cuda_mods_prepare(const fa_problem *pb, void *map_ws, cudaStream_t stream, fa_mods_params *mp) {
    const fa_params *p = &pb->p;
    memset(mp, 0, sizeof *mp);
    mp->bias = p->bias;
    mp->bias_dtype = (int)p->bias_dtype;
    mp->bias_batch_stride = p->bias_batch_stride;
    mp->bias_head_stride = p->bias_head_stride;
    mp->bias_row_stride = p->bias_row_stride;
    mp->bias_col_stride = p->bias_col_stride;
    mp->doc_ids_q = p->doc_ids_q;
    mp->doc_ids_k = p->doc_ids_k;
    mp->doc_ids_q_batch_stride = p->doc_ids_q_batch_stride;
    mp->doc_ids_k_batch_stride = p->doc_ids_k_batch_stride;
    /* a side at least as wide as the longest sequence is unbounded (int32 math in the kernels) */
    mp->elem_window_left = pb->elem_window_left < 0 || pb->elem_window_left >= p->seqlen_k ? -1 : (int)pb->elem_window_left;
    mp->elem_window_right = pb->elem_window_right < 0 || pb->elem_window_right >= p->seqlen_q + p->seqlen_k
                                ? -1 : (int)pb->elem_window_right;
    if (!pb->has_block_mask) return FA_OK;

    const int64_t nb = map_batches(p), nh = map_heads(p);
    size_t map_bytes, rows_bytes, cols_bytes;
    map_parts(pb, &map_bytes, &rows_bytes, &cols_bytes);
    uint8_t *ws = static_cast<uint8_t *>(map_ws);
    unsigned long long *bad_row = reinterpret_cast<unsigned long long *>(ws);
    int32_t *map = reinterpret_cast<int32_t *>(ws + 256);
    int4 *row_sums = reinterpret_cast<int4 *>(ws + 256 + fa_cuda_align256(map_bytes));
    int4 *col_sums = reinterpret_cast<int4 *>(ws + 256 + fa_cuda_align256(map_bytes) + fa_cuda_align256(rows_bytes));
    const size_t zeroed = fa_cuda_align256(map_bytes) + fa_cuda_align256(rows_bytes) + cols_bytes;
    FA_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, 8, stream), "cudaMemsetAsync(block mask check slot)");
    if (zeroed > 0) FA_CUDA_CHECK(cudaMemsetAsync(map, 0, zeroed, stream), "cudaMemsetAsync(block map)");
    fa_map_build_params bp;
    bp.counts = p->kv_num_blocks;
    bp.indices = p->kv_indices;
    bp.full_counts = p->full_kv_num_blocks;
    bp.full_indices = p->full_kv_indices;
    bp.count_batch_stride = nb > 1 ? p->block_count_batch_stride : 0;
    bp.count_head_stride = nh > 1 ? p->block_count_head_stride : 0;
    bp.index_batch_stride = nb > 1 ? p->block_index_batch_stride : 0;
    bp.index_head_stride = nh > 1 ? p->block_index_head_stride : 0;
    bp.index_row_stride = p->block_index_row_stride;
    bp.nb = (int)nb;
    bp.nh = (int)nh;
    bp.q_blocks = (int)pb->q_blocks;
    bp.kv_blocks = (int)pb->kv_blocks;
    bp.map = map;
    bp.rows = row_sums;
    bp.cols = col_sums;
    bp.bad_row = bad_row;
    const int64_t rows = nb * nh * pb->q_blocks;
    if (rows > 0) {
        const int64_t blocks = (rows + FA_MODS_MAP_ROWS - 1) / FA_MODS_MAP_ROWS;
        if (blocks > INT32_MAX) return fa_set_error(FA_ERR_INVALID_SIZE, "block mask: too many list rows");
        fa_mods_map_kernel<<<(unsigned)blocks, 32 * FA_MODS_MAP_ROWS, 0, stream>>>(bp);
        FA_CUDA_CHECK_LAUNCH("block map kernel launch");
    }
    /* the verdict, unless an earlier call accepted these lists: a bad row stops at its first bad
     * entry, so the map only ever holds in-range entries either way */
    if (!p->block_lists_checked) {
        unsigned long long bad = 0;
        FA_CUDA_CHECK(cudaMemcpyAsync(&bad, bad_row, 8, cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync(block mask check)");
        FA_CUDA_CHECK(cudaStreamSynchronize(stream), "cudaStreamSynchronize(block mask check)");
        if (bad != ~0ull) return report_bad_row(pb, bad, stream);
    }

    mp->block_map = map;
    mp->map_batch_stride = nb > 1 ? nh * pb->q_blocks * pb->kv_blocks : 0;
    mp->map_head_stride = nh > 1 ? pb->q_blocks * pb->kv_blocks : 0;
    mp->map_rows = row_sums;
    mp->map_cols = col_sums;
    mp->rows_batch_stride = nb > 1 ? nh * pb->q_blocks : 0;
    mp->rows_head_stride = nh > 1 ? pb->q_blocks : 0;
    mp->cols_batch_stride = nb > 1 ? nh * pb->kv_blocks : 0;
    mp->cols_head_stride = nh > 1 ? pb->kv_blocks : 0;
    mp->kv_blocks = (int)pb->kv_blocks;
    mp->block_q = (int)p->block_q;
    mp->block_k = (int)p->block_k;
    mp->partial_block_bits = p->partial_block_bits;
    mp->block_bytes = pb->block_bytes;
    mp->block_index_batch_stride = p->block_index_batch_stride;
    mp->block_index_head_stride = p->block_index_head_stride;
    mp->block_index_row_stride = p->block_index_row_stride;
    return FA_OK;
}

/* ---- dbias ---------------------------------------------------------------------------------- */

struct fa_dbias_params {
    const float *ws;     /* [batch, heads_q, seqlen_q, seqlen_k] dS, or NULL: write zeros   */
    void *dbias;
    int dbias_dtype;     /* fa_dtype: F32, F16 or BF16                                      */
    int64_t batch_stride, head_stride, row_stride, col_stride;
    int64_t ext[4];      /* output extents (1 on summed and stride-0 axes)                  */
    int sum[4];          /* axis summed over                                                */
    int64_t full[4];     /* batch, heads_q, seqlen_q, seqlen_k                               */
};

/* One output row (b, h, i) per block and step, its keys across the threads: the index arithmetic
 * (64-bit divisions) once per row, not per element. */
__global__ void __launch_bounds__(256) fa_dbias_kernel(const fa_dbias_params dp) {
    const int64_t rows = dp.ext[0] * dp.ext[1] * dp.ext[2];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t o[3], rest = r;
        for (int a = 2; a >= 0; --a) {
            o[a] = rest % dp.ext[a];
            rest /= dp.ext[a];
        }
        const int64_t out = o[0] * dp.batch_stride + o[1] * dp.head_stride + o[2] * dp.row_stride;
        int64_t lo[3], hi[3];
        for (int a = 0; a < 3; ++a) {
            lo[a] = dp.sum[a] ? 0 : o[a];
            hi[a] = dp.sum[a] ? dp.full[a] : o[a] + 1;
        }
        for (int64_t j = threadIdx.x; j < dp.ext[3]; j += 256) {
            float acc = 0.0f;
            if (dp.ws != nullptr) {
                const int64_t j_lo = dp.sum[3] ? 0 : j, j_hi = dp.sum[3] ? dp.full[3] : j + 1;
                for (int64_t b = lo[0]; b < hi[0]; ++b)
                    for (int64_t h = lo[1]; h < hi[1]; ++h)
                        for (int64_t i = lo[2]; i < hi[2]; ++i) {
                            const float *row = dp.ws + ((b * dp.full[1] + h) * dp.full[2] + i) * dp.full[3];
                            for (int64_t k = j_lo; k < j_hi; ++k) acc += row[k];
                        }
            }
            fa_mods_store_as(dp.dbias, dp.dbias_dtype, out + j * dp.col_stride, acc);
        }
    }
}

static void dbias_axes(const fa_params *p, int sum[4], int64_t ext[4], int64_t full[4]) {
    const int64_t stride[4] = {p->dbias_batch_stride, p->dbias_head_stride, p->dbias_row_stride, p->dbias_col_stride};
    full[0] = p->batch;
    full[1] = p->heads_q;
    full[2] = p->seqlen_q;
    full[3] = p->seqlen_k;
    for (int a = 0; a < 4; ++a) {
        sum[a] = stride[a] == 0 && full[a] > 1;
        ext[a] = stride[a] == 0 ? 1 : full[a];
    }
}

int fa_cuda_dbias_reduces(const fa_params *p) {
    if (p->dbias == nullptr) return 0;
    int sum[4];
    int64_t ext[4], full[4];
    dbias_axes(p, sum, ext, full);
    return sum[0] || sum[1] || sum[2] || sum[3];
}

size_t fa_cuda_dbias_workspace_bytes(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    if (!fa_cuda_dbias_reduces(p)) return 0;
    return fa_cuda_align256((size_t)p->batch * (size_t)p->heads_q * (size_t)p->seqlen_q * (size_t)p->seqlen_k * 4);
}

static fa_status launch_dbias(const fa_params *p, const float *ws, cudaStream_t stream, const char *what) {
    fa_dbias_params dp;
    dp.ws = ws;
    dp.dbias = p->dbias;
    dp.dbias_dtype = (int)p->dbias_dtype;
    dp.batch_stride = p->dbias_batch_stride;
    dp.head_stride = p->dbias_head_stride;
    dp.row_stride = p->dbias_row_stride;
    dp.col_stride = p->dbias_col_stride;
    dbias_axes(p, dp.sum, dp.ext, dp.full);
    const int64_t n = dp.ext[0] * dp.ext[1] * dp.ext[2] * dp.ext[3];
    if (n == 0) return FA_OK;
    const int64_t rows = dp.ext[0] * dp.ext[1] * dp.ext[2];
    fa_dbias_kernel<<<(unsigned)(rows < (1 << 20) ? rows : (1 << 20)), 256, 0, stream>>>(dp);
    FA_CUDA_CHECK_LAUNCH(what);
    return FA_OK;
}

/* 1 when the main kernels visit every (query block, key block) tile of every sequence and head, so
 * an in-place dbias gets every element written (dS, 0 where masked) and needs no zeroing: fixed,
 * nonzero lengths, no mask that skips tiles (causal, window, block mask, document ids). */
static int dbias_every_tile(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    return p->seqlen_q > 0 && p->seqlen_k > 0 && p->cu_seqlens_q == nullptr && p->cu_seqlens_k == nullptr &&
           !pb->has_mask && p->kv_num_blocks == nullptr && p->doc_ids_q == nullptr && p->doc_ids_k == nullptr;
}

fa_status fa_cuda_dbias_begin(const fa_problem *pb, float *dbias_ws, cudaStream_t stream, fa_mods_params *mp) {
    const fa_params *p = &pb->p;
    if (p->dbias == nullptr) return FA_OK;
    if (fa_cuda_dbias_reduces(p)) {
        const size_t bytes = fa_cuda_dbias_workspace_bytes(pb);
        if (bytes > 0) FA_CUDA_CHECK(cudaMemsetAsync(dbias_ws, 0, bytes, stream), "cudaMemsetAsync(dbias workspace)");
        mp->dbias = dbias_ws;
        mp->dbias_dtype = FA_DTYPE_F32;
        mp->dbias_col_stride = 1;
        mp->dbias_row_stride = p->seqlen_k;
        mp->dbias_head_stride = p->seqlen_q * p->seqlen_k;
        mp->dbias_batch_stride = p->heads_q * p->seqlen_q * p->seqlen_k;
        return FA_OK;
    }
    mp->dbias = p->dbias; /* every element written in place: zero the ones no tile reaches first */
    mp->dbias_dtype = (int)p->dbias_dtype;
    mp->dbias_batch_stride = p->dbias_batch_stride;
    mp->dbias_head_stride = p->dbias_head_stride;
    mp->dbias_row_stride = p->dbias_row_stride;
    mp->dbias_col_stride = p->dbias_col_stride;
    if (dbias_every_tile(pb)) return FA_OK;
    return launch_dbias(p, nullptr, stream, "dbias zero kernel launch");
}

fa_status fa_cuda_dbias_finish(const fa_problem *pb, const float *dbias_ws, cudaStream_t stream) {
    const fa_params *p = &pb->p;
    if (!fa_cuda_dbias_reduces(p)) return FA_OK;
    return launch_dbias(p, dbias_ws, stream, "dbias reduction kernel launch");
}
