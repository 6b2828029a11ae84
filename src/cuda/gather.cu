/*
 * gather.cu: copies into and out of the CUDA workspace (gather_launch.h).
 *
 *   fa_cuda_copy16          strided 16-bit tensor -> another layout, zero-filled extra columns
 *   fa_cuda_copy_appended   a padded cache copy's appended rows -> the caller's cache
 *   fa_cuda_forward_paged   fa_forward with a paged K/V: the pages of every sequence gathered into
 *                           packed [rows, heads_kv, d] / [rows, heads_kv, dv] copies in the
 *                           workspace (row cu_seqlens_k[b] + t varlen, b·seqlen_k + t batched),
 *                           then the ordinary forward (fa_cuda_forward) on them, as the CPU engine
 *
 * The int32 arrays (cache_seqlens, block_table, cu_seqlens_k) are device memory the host never
 * read: every index taken from them is clamped, so a bad value gives wrong numbers, never an
 * access outside the tensors.
 */
#include <stdint.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/gather_launch.h"

enum { FA_GATHER_THREADS = 256 };

/* Blocks of a grid-stride launch over `items`: enough to fill the machine, capped. */
static unsigned gather_blocks(int64_t items) {
    const int64_t most = (int64_t)1 << 16;
    const int64_t blocks = (items + FA_GATHER_THREADS - 1) / FA_GATHER_THREADS;
    return (unsigned)(blocks < 1 ? 1 : (blocks > most ? most : blocks));
}

/* ---- strided copy ------------------------------------------------------------------------- */

__global__ void __launch_bounds__(FA_GATHER_THREADS) fa_copy16_kernel(const fa_copy16_args a) {
    const int64_t n = a.extent[0] * a.extent[1] * a.extent[2] * a.dst_cols;
    const uint16_t *src = (const uint16_t *)a.src;
    uint16_t *dst = (uint16_t *)a.dst;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % a.dst_cols, r = i / a.dst_cols;
        const int64_t i2 = r % a.extent[2], r1 = r / a.extent[2];
        const int64_t i1 = r1 % a.extent[1], i0 = r1 / a.extent[1];
        const uint16_t x =
            c < a.src_cols ? src[i0 * a.src_stride[0] + i1 * a.src_stride[1] + i2 * a.src_stride[2] + c] : (uint16_t)0;
        dst[i0 * a.dst_stride[0] + i1 * a.dst_stride[1] + i2 * a.dst_stride[2] + c] = x;
    }
}

fa_status fa_cuda_copy16(const fa_copy16_args *a, cudaStream_t stream, const char *what) {
    const int64_t n = a->extent[0] * a->extent[1] * a->extent[2] * a->dst_cols;
    if (n <= 0) return FA_OK;
    fa_copy16_kernel<<<gather_blocks(n), FA_GATHER_THREADS, 0, stream>>>(*a);
    FA_CUDA_CHECK_LAUNCH(what);
    return FA_OK;
}

/* ---- appended rows back into the caller's cache ------------------------------------------- */

/* Item (b, t, head, column of k then v). The slot: L0 = cache_seqlens[b] clamped to
 * [0, capacity - seqlen_new], slot L0 + t; its page and in-page row or cache row clamped as the
 * decode kernel's append (kvcache_sm80.cuh, fa_kv_append). */
__global__ void __launch_bounds__(FA_GATHER_THREADS) fa_kv_copy_back_kernel(const fa_kv_copy_back_args a) {
    const int cols = a.d + a.dv;
    const int64_t n = (int64_t)a.batch * a.seqlen_new * a.heads_kv * cols;
    const uint16_t *k_pad = (const uint16_t *)a.k_pad, *v_pad = (const uint16_t *)a.v_pad;
    uint16_t *k = (uint16_t *)a.k, *v = (uint16_t *)a.v;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int col = (int)(i % cols);
        int64_t r = i / cols;
        const int h = (int)(r % a.heads_kv);
        r /= a.heads_kv;
        const int t = (int)(r % a.seqlen_new);
        const int b = (int)(r / a.seqlen_new);
        const int l0_max = max(0, a.capacity - a.seqlen_new);
        const int cache_len = min(max(a.cache_seqlens != nullptr ? a.cache_seqlens[b] : a.capacity, 0), l0_max);
        const int c = cache_len + t;
        if (c >= a.capacity) continue;
        int64_t slab, row; /* page id and in-page row, or cache row and slot */
        if (a.block_table != nullptr) {
            const int64_t table_last = a.block_table_batch_stride - 1;
            const int64_t pidx = min((int64_t)(c / a.page_size), table_last);
            slab = min(max((int64_t)a.block_table[(int64_t)b * a.block_table_batch_stride + pidx], (int64_t)0),
                       (int64_t)a.num_pages - 1);
            row = min((int64_t)c - pidx * a.page_size, (int64_t)a.page_size - 1);
        } else {
            slab = min(max(a.cache_batch_idx != nullptr ? a.cache_batch_idx[b] : b, 0), a.cache_batch - 1);
            row = c;
        }
        const int64_t rows = a.block_table != nullptr ? a.page_size : a.capacity;
        const int64_t pad_row = (slab * rows + row) * a.heads_kv + h; /* dense padded copy */
        if (col < a.d)
            k[slab * a.k_batch_stride + row * a.k_row_stride + h * a.k_head_stride + col] =
                k_pad[pad_row * a.d_pad + col];
        else
            v[slab * a.v_batch_stride + row * a.v_row_stride + h * a.v_head_stride + (col - a.d)] =
                v_pad[pad_row * a.dv_pad + (col - a.d)];
    }
}

fa_status fa_cuda_copy_appended(const fa_kv_copy_back_args *a, cudaStream_t stream) {
    const int64_t n = (int64_t)a->batch * a->seqlen_new * a->heads_kv * (a->d + a->dv);
    if (n <= 0) return FA_OK;
    fa_kv_copy_back_kernel<<<gather_blocks(n), FA_GATHER_THREADS, 0, stream>>>(*a);
    FA_CUDA_CHECK_LAUNCH("KV-cache append copy");
    return FA_OK;
}

/* ---- fa_forward with a paged K/V ---------------------------------------------------------- */

struct fa_page_gather_args {
    const uint16_t *k, *v; /* page pools [num_pages, page_size, heads_kv, d / dv]                */
    int64_t k_page_stride, k_row_stride, k_head_stride;
    int64_t v_page_stride, v_row_stride, v_head_stride;
    const int32_t *block_table;
    int64_t block_table_batch_stride;
    const int32_t *cu_seqlens_k; /* varlen: rows of sequence b, clamped to [0, total_k); NULL */
    int64_t total_k;             /* rows of the packed copies: batch · seqlen_k                */
    uint16_t *k_packed, *v_packed; /* [total_k, heads_kv, d] / [total_k, heads_kv, dv]         */
    int batch, seqlen_k, heads_kv, d_chunks, dv_chunks, page_size, num_pages;
};

/* Item (b, t < seqlen_k, head, 16-byte chunk of k then v). Varlen rows as the forward kernels
 * read them (fa_sequence_rows with total_k): a token past its sequence's clamped length is
 * skipped, so every write lands inside the packed copies. */
__global__ void __launch_bounds__(FA_GATHER_THREADS) fa_page_gather_kernel(const fa_page_gather_args a) {
    const int chunks = a.d_chunks + a.dv_chunks;
    const int64_t n = (int64_t)a.batch * a.seqlen_k * a.heads_kv * chunks;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int ch = (int)(i % chunks);
        int64_t r = i / chunks;
        const int h = (int)(r % a.heads_kv);
        r /= a.heads_kv;
        const int t = (int)(r % a.seqlen_k);
        const int b = (int)(r / a.seqlen_k);
        int64_t first = (int64_t)b * a.seqlen_k;
        if (a.cu_seqlens_k != nullptr) {
            const int64_t k0 = fa_clamp64(a.cu_seqlens_k[b], 0, a.total_k);
            const int64_t k1 = fa_clamp64(a.cu_seqlens_k[b + 1], k0, a.total_k);
            if (t >= k1 - k0) continue;
            first = k0;
        }
        const int64_t pidx = t / a.page_size; /* < block_table_batch_stride: t < seqlen_k */
        const int64_t page = fa_clamp64(a.block_table[(int64_t)b * a.block_table_batch_stride + pidx], 0,
                                        (int64_t)a.num_pages - 1);
        const int64_t in_page = t - pidx * a.page_size;
        const int64_t row = first + t;
        if (ch < a.d_chunks) {
            const uint4 x = *(const uint4 *)(a.k + page * a.k_page_stride + in_page * a.k_row_stride +
                                             h * a.k_head_stride + 8 * ch);
            *(uint4 *)(a.k_packed + (row * a.heads_kv + h) * (8 * a.d_chunks) + 8 * ch) = x;
        } else {
            const int cv = ch - a.d_chunks;
            const uint4 x = *(const uint4 *)(a.v + page * a.v_page_stride + in_page * a.v_row_stride +
                                             h * a.v_head_stride + 8 * cv);
            *(uint4 *)(a.v_packed + (row * a.heads_kv + h) * (8 * a.dv_chunks) + 8 * cv) = x;
        }
    }
}

/* Bytes of one packed copy (k or v) of batch · seqlen_k rows, 256-aligned. */
static size_t packed_bytes(const fa_params *p, int64_t dim) {
    return fa_cuda_align256((size_t)p->batch * (size_t)p->seqlen_k * (size_t)p->heads_kv * (size_t)dim * 2);
}

fa_status fa_cuda_check_paged(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const double rows = (double)p->batch * (double)p->seqlen_k;
    if (rows * (double)p->heads_kv * (double)(p->head_dim + p->head_dim_v) * 2.0 > 9.0e18)
        return fa_set_error(FA_ERR_OVERFLOW,
                            "batch × seqlen_k × heads_kv × (head_dim + head_dim_v): the packed copy of a "
                            "paged K/V (block_table) overflows");
    if (rows > 2147483647.0 - 256.0)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "batch × seqlen_k = %.0f: the CUDA forward gathers a paged K/V (block_table) "
                            "into batch × seqlen_k rows, which must stay below 2^31 - 256",
                            rows);
    if (p->page_size > INT32_MAX || p->num_pages > INT32_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE, "page_size = %lld, num_pages = %lld: must be below 2^31",
                            (long long)p->page_size, (long long)p->num_pages);
    /* the packed copies are written in 16-byte vectors */
    return fa_cuda_check_aligned("workspace", p->workspace, 256);
}

size_t fa_cuda_paged_workspace(const fa_problem *pb) {
    return packed_bytes(&pb->p, pb->p.head_dim) + packed_bytes(&pb->p, pb->p.head_dim_v);
}

fa_status fa_cuda_forward_paged(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    cudaStream_t stream = static_cast<cudaStream_t>(p->stream);
    const size_t k_bytes = packed_bytes(p, p->head_dim);
    fa_cuda_workspace ws;
    fa_status s = fa_cuda_workspace_acquire(p->workspace, fa_cuda_paged_workspace(pb), stream, "paged K/V", &ws);
    if (s != FA_OK) return s;

    fa_page_gather_args a;
    a.k = (const uint16_t *)p->k;
    a.v = (const uint16_t *)p->v;
    a.k_page_stride = p->k_batch_stride;
    a.k_row_stride = p->k_row_stride;
    a.k_head_stride = p->k_head_stride;
    a.v_page_stride = p->v_batch_stride;
    a.v_row_stride = p->v_row_stride;
    a.v_head_stride = p->v_head_stride;
    a.block_table = p->block_table;
    a.block_table_batch_stride = p->block_table_batch_stride;
    a.cu_seqlens_k = pb->varlen ? p->cu_seqlens_k : nullptr;
    a.total_k = p->batch * p->seqlen_k;
    a.k_packed = (uint16_t *)ws.base;
    a.v_packed = (uint16_t *)(ws.base + k_bytes);
    a.batch = (int)p->batch;
    a.seqlen_k = (int)p->seqlen_k;
    a.heads_kv = (int)p->heads_kv;
    a.d_chunks = (int)(p->head_dim / 8);
    a.dv_chunks = (int)(p->head_dim_v / 8);
    a.page_size = (int)p->page_size;
    a.num_pages = (int)p->num_pages;
    const int64_t items = a.total_k * a.heads_kv * (a.d_chunks + a.dv_chunks);
    if (items > 0) {
        fa_page_gather_kernel<<<gather_blocks(items), FA_GATHER_THREADS, 0, stream>>>(a);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            s = fa_set_error(FA_ERR_CUDA, "paged K/V gather: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (s == FA_OK) {
        /* the same call on the packed copies: unpaged, varlen rows bounded by total_k */
        fa_problem inner = *pb;
        fa_params *ip = &inner.p;
        const int64_t hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
        ip->block_table = nullptr;
        ip->block_table_batch_stride = 0;
        ip->page_size = 0;
        ip->num_pages = 0;
        ip->k = a.k_packed;
        ip->v = a.v_packed;
        ip->k_batch_stride = pb->varlen ? 0 : p->seqlen_k * hkv * d;
        ip->k_row_stride = hkv * d;
        ip->k_head_stride = d;
        ip->v_batch_stride = pb->varlen ? 0 : p->seqlen_k * hkv * dv;
        ip->v_row_stride = hkv * dv;
        ip->v_head_stride = dv;
        ip->total_k = a.total_k;
        ip->workspace = nullptr; /* the unpaged forward takes no workspace */
        ip->workspace_bytes = 0;
        s = fa_cuda_forward(&inner);
    }
    return fa_cuda_workspace_release(&ws, stream, "paged K/V", s);
}

/* ---- varlen tails (p.zero_varlen_tail) ------------------------------------------------------ */

enum { FA_TAIL_MAX = 4 };
struct fa_tail_rows_args {
    fa_tail_rows t[FA_TAIL_MAX];
    int64_t batch;
};

/* blockIdx.y: the tensor. Its rows from cu_seqlens[batch] on, every (row, head), zeroed in
 * 16-bit units (each row's elem_bytes · cols bytes are even) by a grid-stride loop. */
__global__ void __launch_bounds__(FA_GATHER_THREADS) fa_zero_tail_rows_kernel(const fa_tail_rows_args a) {
    const fa_tail_rows t = a.t[blockIdx.y];
    const int64_t first = min((int64_t)max(t.cu_seqlens[a.batch], 0), t.total);
    const int64_t units = t.cols * t.elem_bytes / 2; /* 16-bit units per (row, head) */
    const int64_t n = (t.total - first) * t.heads * units;
    uint16_t *base = (uint16_t *)t.base;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t u = i % units, rh = i / units;
        const int64_t h = rh % t.heads, r = first + rh / t.heads;
        base[(r * t.row_stride + h * t.head_stride) * t.elem_bytes / 2 + u] = 0;
    }
}

extern "C" fa_status fa_cuda_zero_tail_rows(const fa_tail_rows *t, int n, int64_t batch, void *stream) {
    if (n <= 0) return FA_OK;
    if (n > FA_TAIL_MAX)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "varlen tail: %d tensors (at most %d)", n, FA_TAIL_MAX);
    fa_tail_rows_args a;
    int64_t most = 0; /* the largest possible tail, bounding the grid */
    for (int i = 0; i < n; ++i) {
        a.t[i] = t[i];
        const int64_t items = t[i].total * t[i].heads * (t[i].cols * t[i].elem_bytes / 2);
        most = items > most ? items : most;
    }
    a.batch = batch;
    /* a tail is usually empty: a few blocks read cu_seqlens and leave; a long one is walked by
     * the grid-stride loop */
    unsigned blocks = gather_blocks(most);
    blocks = blocks > 64 ? 64 : blocks;
    fa_zero_tail_rows_kernel<<<dim3(blocks, (unsigned)n), FA_GATHER_THREADS, 0, (cudaStream_t)stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("varlen tail zero fill");
    return FA_OK;
}
