// ring_nccl.cu: the CUDA side of ring attention (algorithm in src/ring/fa_ring.c):
//
//   - the ring's element-wise operations on device memory (fa_ring_backend): strided copies with
//     dtype conversion (pack K/V, store results), fp32 accumulation of gradient parts, and the
//     merge of a partial attention state into the running one; all enqueued on the caller's
//     stream, memory-bound and small next to the attention of a block pair;
//   - the NCCL transport (fa_ring_comm_nccl), compiled when the Makefile finds nccl.h
//     (FA_HAVE_NCCL). libnccl.so.2 is resolved at run time with dlopen/dlsym, preferring the copy
//     the process already loaded (PyTorch's), so libflashattn does not link NCCL and an ncclComm_t
//     made by the application is always used with the library that made it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "api/fa_internal.h"
#include "ring/fa_ring.h"

#ifdef FA_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>
#endif

namespace {

fa_status cuda_error(cudaError_t err, const char *what) {
    return fa_set_error(FA_ERR_CUDA, "ring attention: %s failed: %s", what, cudaGetErrorString(err));
}

__device__ __forceinline__ float load_element(const void *base, fa_dtype dtype, int64_t i) {
    switch (dtype) {
    case FA_DTYPE_F16: return __half2float(static_cast<const __half *>(base)[i]);
    case FA_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    default: return static_cast<const float *>(base)[i];
    }
}

__device__ __forceinline__ void store_element(void *base, fa_dtype dtype, int64_t i, float x) {
    switch (dtype) {
    case FA_DTYPE_F16: static_cast<__half *>(base)[i] = __float2half_rn(x); break;
    case FA_DTYPE_BF16: static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(x); break;
    default: static_cast<float *>(base)[i] = x; break;
    }
}

__device__ __forceinline__ int64_t view_offset(const fa_ring_view &v, int64_t b, int64_t r, int64_t h) {
    return b * v.block_stride + r * v.row_stride + h * v.head_stride;
}

// Thread layout of every kernel: threadIdx.y picks one [.., dim] vector (block, row, head) of
// the shape, threadIdx.x walks its dim elements; blocks stride over the vectors. Vector v is
// (b, r, h) with v = (b·rows + r)·heads + h.
struct vector_index {
    int64_t b, r, h;
};

__device__ __forceinline__ vector_index split_vector(int64_t v, const fa_ring_shape &s) {
    vector_index ix;
    ix.h = v % s.heads;
    int64_t block_row = v / s.heads;
    ix.r = block_row % s.rows;
    ix.b = block_row / s.rows;
    return ix;
}

// dst = src (converted) over shape s.
__global__ void copy_kernel(fa_ring_view dst, fa_ring_view src, fa_ring_shape s) {
    const int64_t vectors = s.blocks * s.rows * s.heads;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; v < vectors;
         v += (int64_t)gridDim.x * blockDim.y) {
        vector_index ix = split_vector(v, s);
        int64_t od = view_offset(dst, ix.b, ix.r, ix.h), os = view_offset(src, ix.b, ix.r, ix.h);
        for (int64_t e = threadIdx.x; e < s.dim; e += blockDim.x)
            store_element(dst.ptr, dst.dtype, od + e, load_element(src.ptr, src.dtype, os + e));
    }
}

// dst (fp32) += src over shape s.
__global__ void accumulate_kernel(fa_ring_view dst, fa_ring_view src, fa_ring_shape s) {
    const int64_t vectors = s.blocks * s.rows * s.heads;
    float *out = static_cast<float *>(dst.ptr);
    for (int64_t v = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; v < vectors;
         v += (int64_t)gridDim.x * blockDim.y) {
        vector_index ix = split_vector(v, s);
        int64_t od = view_offset(dst, ix.b, ix.r, ix.h), os = view_offset(src, ix.b, ix.r, ix.h);
        for (int64_t e = threadIdx.x; e < s.dim; e += blockDim.x)
            out[od + e] += load_element(src.ptr, src.dtype, os + e);
    }
}

// (o_acc, lse_acc) := merge with (o_part, lse_part): lse = log(e^a + e^p), o = e^(a-lse)·o_acc +
// e^(p-lse)·o_part; an empty partial (lse -inf) is skipped without reading its o, an empty
// running state takes the partial as is. Every thread of a vector reads the old lse before the
// vector's thread x = 0 writes the new one: the loop's trip count is the same for the whole
// block (it depends on blockIdx only), so one __syncthreads per iteration separates the reads
// from the write.
__global__ void merge_kernel(fa_ring_view o_acc, fa_ring_view lse_acc, fa_ring_view o_part,
                             fa_ring_view lse_part, fa_ring_shape s) {
    const int64_t vectors = s.blocks * s.rows * s.heads;
    float *acc = static_cast<float *>(o_acc.ptr), *lse = static_cast<float *>(lse_acc.ptr);
    const float *lse_in = static_cast<const float *>(lse_part.ptr);
    for (int64_t base = (int64_t)blockIdx.x * blockDim.y; base < vectors;
         base += (int64_t)gridDim.x * blockDim.y) {
        const int64_t v = base + threadIdx.y;
        const bool active = v < vectors;
        vector_index ix = {0, 0, 0};
        float running = -INFINITY, part = -INFINITY;
        if (active) {
            ix = split_vector(v, s);
            running = lse[view_offset(lse_acc, ix.b, ix.r, ix.h)];
            part = lse_in[view_offset(lse_part, ix.b, ix.r, ix.h)];
        }
        __syncthreads(); // every read of lse_acc in this iteration happens before any write below
        if (active && part != -INFINITY) {
            float w_acc = 0.0f, w_part = 1.0f, merged = part;
            if (running != -INFINITY) {
                float hi = fmaxf(running, part), lo = fminf(running, part);
                merged = hi + log1pf(expf(lo - hi));
                w_acc = expf(running - merged);
                w_part = expf(part - merged);
            }
            int64_t oa = view_offset(o_acc, ix.b, ix.r, ix.h), op = view_offset(o_part, ix.b, ix.r, ix.h);
            for (int64_t e = threadIdx.x; e < s.dim; e += blockDim.x)
                acc[oa + e] = w_acc * acc[oa + e] + w_part * load_element(o_part.ptr, o_part.dtype, op + e);
            if (threadIdx.x == 0) lse[view_offset(lse_acc, ix.b, ix.r, ix.h)] = merged;
        }
    }
}

// Block shape for vectors of `dim` elements: up to 128 threads along dim, 256 threads in all.
void launch_shape(const fa_ring_shape &s, dim3 *grid, dim3 *block) {
    unsigned x = 1;
    while (x < 128 && (int64_t)x < s.dim) x *= 2;
    block->x = x;
    block->y = 256 / x;
    block->z = 1;
    int64_t vectors = s.blocks * s.rows * s.heads;
    int64_t blocks = (vectors + block->y - 1) / block->y;
    grid->x = (unsigned)(blocks < 1 ? 1 : blocks > 8192 ? 8192 : blocks);
    grid->y = grid->z = 1;
}

bool empty_shape(const fa_ring_shape &s) { return s.blocks <= 0 || s.rows <= 0 || s.heads <= 0 || s.dim <= 0; }

fa_status launched(const char *what) {
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? FA_OK : cuda_error(err, what);
}

fa_status ring_alloc(size_t bytes, void **ptr, void *stream) {
    cudaError_t err = cudaMallocAsync(ptr, bytes ? bytes : 1, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess)
        return fa_set_error(FA_ERR_ALLOC, "ring attention: cudaMallocAsync of %zu bytes failed: %s", bytes,
                            cudaGetErrorString(err));
    return FA_OK;
}

void ring_release(void *ptr, void *stream) { cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)); }

fa_status ring_upload(void *dst, const void *src_host, size_t bytes, void *stream) {
    // from pageable memory: the call returns once the bytes are staged, so the host buffer may
    // be freed right after
    cudaError_t err = cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice,
                                      static_cast<cudaStream_t>(stream));
    return err == cudaSuccess ? FA_OK : cuda_error(err, "cudaMemcpyAsync (cu_seqlens of the ring calls)");
}

fa_status ring_copy(fa_ring_view dst, fa_ring_view src, fa_ring_shape s, void *stream) {
    if (empty_shape(s)) return FA_OK;
    dim3 grid, block;
    launch_shape(s, &grid, &block);
    copy_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, s);
    return launched("the ring copy kernel");
}

fa_status ring_accumulate(fa_ring_view dst, fa_ring_view src, fa_ring_shape s, void *stream) {
    if (empty_shape(s)) return FA_OK;
    dim3 grid, block;
    launch_shape(s, &grid, &block);
    accumulate_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, s);
    return launched("the ring accumulate kernel");
}

fa_status ring_merge(fa_ring_view o_acc, fa_ring_view lse_acc, fa_ring_view o_part, fa_ring_view lse_part,
                     fa_ring_shape s, void *stream) {
    if (empty_shape(s)) return FA_OK;
    dim3 grid, block;
    launch_shape(s, &grid, &block);
    merge_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(o_acc, lse_acc, o_part, lse_part, s);
    return launched("the ring merge kernel");
}

const fa_ring_backend cuda_backend = {ring_alloc, ring_release, ring_upload, ring_copy, ring_accumulate,
                                      ring_merge};

#ifdef FA_HAVE_NCCL

// The NCCL entry points the transport uses, resolved once per process.
struct nccl_api {
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclCommCount) count;
    decltype(&ncclCommUserRank) user_rank;
    decltype(&ncclGetErrorString) error_string;
    const char *failure; // why it could not be resolved, or nullptr
};

template <typename F> bool resolve(void *handle, const char *name, F *out) {
    *out = reinterpret_cast<F>(dlsym(handle, name));
    return *out != nullptr;
}

bool resolve_all(void *handle, nccl_api *api) {
    return resolve(handle, "ncclGroupStart", &api->group_start) &&
           resolve(handle, "ncclGroupEnd", &api->group_end) && resolve(handle, "ncclSend", &api->send) &&
           resolve(handle, "ncclRecv", &api->recv) && resolve(handle, "ncclCommCount", &api->count) &&
           resolve(handle, "ncclCommUserRank", &api->user_rank) &&
           resolve(handle, "ncclGetErrorString", &api->error_string);
}

// Order: $FA_NCCL_LIBRARY; symbols already global in the process (an application linked with
// NCCL, or PyTorch's copy loaded RTLD_GLOBAL); libnccl.so.2 already loaded (same soname);
// libnccl.so.2 / libnccl.so found by the dynamic loader.
nccl_api load_nccl() {
    nccl_api api = {};
    const char *path = getenv("FA_NCCL_LIBRARY");
    if (path != nullptr && *path != '\0') {
        void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (handle == nullptr || !resolve_all(handle, &api)) api.failure = "FA_NCCL_LIBRARY does not name a usable libnccl";
        return api;
    }
    if (resolve_all(RTLD_DEFAULT, &api)) return api;
    void *handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) handle = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr || !resolve_all(handle, &api))
        api.failure = "libnccl.so.2 could not be loaded (set FA_NCCL_LIBRARY to its path)";
    return api;
}

const nccl_api &nccl() {
    static const nccl_api api = load_nccl(); // thread-safe initialisation (C++11)
    return api;
}

struct nccl_ring {
    ncclComm_t comm;
    cudaStream_t comm_stream;
    cudaEvent_t ready; // recorded on the compute stream before each exchange
    cudaEvent_t done;  // recorded on comm_stream by wait
    int rank, size;
};

fa_status nccl_failure(ncclResult_t result, const char *what) {
    return fa_set_error(FA_ERR_CUDA, "ring attention: %s failed: %s", what, nccl().error_string(result));
}

// Transfer after the compute stream's work so far; send and receive in one group so the ring
// cannot deadlock.
fa_status nccl_send_recv(void *user, const void *send_buf, void *recv_buf, size_t bytes, void *stream) {
    nccl_ring *t = static_cast<nccl_ring *>(user);
    const nccl_api &api = nccl();
    cudaError_t err = cudaEventRecord(t->ready, static_cast<cudaStream_t>(stream));
    if (err == cudaSuccess) err = cudaStreamWaitEvent(t->comm_stream, t->ready, 0);
    if (err != cudaSuccess) return cuda_error(err, "ordering the NCCL exchange after the compute stream");
    const int next = (t->rank + 1) % t->size, prev = (t->rank + t->size - 1) % t->size;
    ncclResult_t result = api.group_start();
    if (result == ncclSuccess) result = api.send(send_buf, bytes, ncclChar, next, t->comm, t->comm_stream);
    if (result == ncclSuccess) result = api.recv(recv_buf, bytes, ncclChar, prev, t->comm, t->comm_stream);
    ncclResult_t ended = api.group_end();
    if (result == ncclSuccess) result = ended;
    return result == ncclSuccess ? FA_OK : nccl_failure(result, "ncclSend/ncclRecv to the ring neighbours");
}

fa_status nccl_wait(void *user, void *stream) {
    nccl_ring *t = static_cast<nccl_ring *>(user);
    cudaError_t err = cudaEventRecord(t->done, t->comm_stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), t->done, 0);
    return err == cudaSuccess ? FA_OK : cuda_error(err, "making the compute stream wait for NCCL");
}

#endif // FA_HAVE_NCCL

} // namespace

extern "C" const fa_ring_backend *fa_cuda_ring_backend(void) { return &cuda_backend; }

extern "C" int fa_cuda_ring_nccl_built(void) {
#ifdef FA_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

extern "C" fa_status fa_cuda_ring_comm_nccl(void *nccl_comm, void *comm_stream, fa_ring_comm *comm,
                                            int *rank, int *world_size) {
#ifdef FA_HAVE_NCCL
    FA_REQUIRE_PTR(nccl_comm, "nccl_comm");
    FA_REQUIRE_PTR(comm, "comm");
    const nccl_api &api = nccl();
    if (api.failure != nullptr) return fa_set_error(FA_ERR_UNSUPPORTED, "fa_ring_comm_nccl: %s", api.failure);
    nccl_ring *t = static_cast<nccl_ring *>(calloc(1, sizeof(nccl_ring)));
    if (t == nullptr) return fa_set_error(FA_ERR_ALLOC, "fa_ring_comm_nccl: out of host memory");
    t->comm = static_cast<ncclComm_t>(nccl_comm);
    t->comm_stream = static_cast<cudaStream_t>(comm_stream);
    ncclResult_t result = api.count(t->comm, &t->size);
    if (result == ncclSuccess) result = api.user_rank(t->comm, &t->rank);
    if (result != ncclSuccess) {
        free(t);
        return nccl_failure(result, "ncclCommCount / ncclCommUserRank");
    }
    cudaError_t err = cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming);
    if (err == cudaSuccess) {
        err = cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming);
        if (err != cudaSuccess) cudaEventDestroy(t->ready);
    }
    if (err != cudaSuccess) {
        free(t);
        return cuda_error(err, "cudaEventCreate");
    }
    comm->send_recv = nccl_send_recv;
    comm->wait = nccl_wait;
    comm->user = t;
    if (rank) *rank = t->rank;
    if (world_size) *world_size = t->size;
    return FA_OK;
#else
    (void)nccl_comm;
    (void)comm_stream;
    (void)comm;
    (void)rank;
    (void)world_size;
    return fa_set_error(FA_ERR_UNSUPPORTED,
                        "fa_ring_comm_nccl: this libflashattn was built without NCCL (nccl.h was not found "
                        "at build time; set NCCL_HOME to a directory with include/nccl.h and rebuild)");
#endif
}

extern "C" void fa_cuda_ring_comm_nccl_release(fa_ring_comm *comm) {
#ifdef FA_HAVE_NCCL
    if (comm == nullptr || comm->send_recv != nccl_send_recv || comm->user == nullptr) return;
    nccl_ring *t = static_cast<nccl_ring *>(comm->user);
    cudaEventDestroy(t->ready);
    cudaEventDestroy(t->done);
    free(t);
    comm->send_recv = nullptr;
    comm->wait = nullptr;
    comm->user = nullptr;
#else
    (void)comm;
#endif
}
