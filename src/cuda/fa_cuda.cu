/*
 * fa_cuda.cu: host side of the CUDA engine's forward path, and the engine's shared host pieces.
 *
 *   fa_cuda_built / fa_cuda_is_available     build and device presence
 *   fa_cuda_current_device                   per-device properties, queried once per ordinal
 *   fa_cuda_check_forward                    the forward kernels' own limits (dims, alignment,
 *                                            grid and shared-memory limits); no workspace
 *   fa_cuda_forward                          fills fa_fwd_params, picks the head-dim bucket and
 *                                            calls its extern "C" launcher (fwd_hdim*.cu)
 *
 * Everything runs asynchronously on p->stream: no device synchronisation, no allocation, and
 * cu_seqlens (device memory) are never read here.
 */
#include <pthread.h>
#include <stdint.h>

#include "fa_cuda_common.cuh"
#include "fa_tiles.h"
#include "fwd_launch.h"

/* ---- availability ------------------------------------------------------------------------- */

extern "C" int fa_cuda_built(void) { return 1; }

extern "C" int fa_cuda_is_available(void) {
    /* -1 unknown, 0 no, 1 yes; racing first calls compute the same answer. */
    static int available = -1;
    int cached = __atomic_load_n(&available, __ATOMIC_ACQUIRE);
    if (cached >= 0) return cached;
    int count = 0;
    const int yes = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    if (!yes) (void)cudaGetLastError(); /* do not leave a sticky "no device" error behind */
    __atomic_store_n(&available, yes, __ATOMIC_RELEASE);
    return yes;
}

/* ---- device properties ---------------------------------------------------------------------- */

enum { FA_CUDA_MAX_CACHED_DEVICES = 64 };
static fa_cuda_device_info fa_device_cache[FA_CUDA_MAX_CACHED_DEVICES];
static int fa_device_cached[FA_CUDA_MAX_CACHED_DEVICES];
static pthread_mutex_t fa_device_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static fa_status query_device(int ordinal, fa_cuda_device_info *info) {
    int sm_count = 0, major = 0, minor = 0, smem_optin = 0, smem_sm = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, ordinal),
                  "cudaDeviceGetAttribute(multiprocessor count)");
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal),
                  "cudaDeviceGetAttribute(compute capability)");
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal),
                  "cudaDeviceGetAttribute(compute capability)");
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal),
                  "cudaDeviceGetAttribute(shared memory per block, opt-in)");
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, ordinal),
                  "cudaDeviceGetAttribute(shared memory per multiprocessor)");
    info->ordinal = ordinal;
    info->sm_count = sm_count;
    info->cc_major = major;
    info->cc_minor = minor;
    info->smem_optin = (size_t)smem_optin;
    info->smem_per_sm = (size_t)smem_sm;
    return FA_OK;
}

fa_status fa_cuda_current_device(fa_cuda_device_info *info) {
    int ordinal = 0;
    FA_CUDA_CHECK(cudaGetDevice(&ordinal), "cudaGetDevice");
    if (ordinal >= 0 && ordinal < FA_CUDA_MAX_CACHED_DEVICES &&
        __atomic_load_n(&fa_device_cached[ordinal], __ATOMIC_ACQUIRE)) {
        *info = fa_device_cache[ordinal];
        return FA_OK;
    }
    fa_status s = query_device(ordinal, info);
    if (s != FA_OK) return s;
    if (ordinal >= 0 && ordinal < FA_CUDA_MAX_CACHED_DEVICES) {
        pthread_mutex_lock(&fa_device_cache_lock);
        fa_device_cache[ordinal] = *info;
        __atomic_store_n(&fa_device_cached[ordinal], 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&fa_device_cache_lock);
    }
    return FA_OK;
}

/* ---- forward: limits ------------------------------------------------------------------------ */

enum { FA_CUDA_GRID_YZ_MAX = 65535 };

static fa_status check_tensor_alignment(const char *name, const void *ptr, int64_t batch_stride,
                                        int64_t row_stride, int64_t head_stride, int varlen) {
    if (((uintptr_t)ptr & 15u) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT,
                            "%s = %p is not 16-byte aligned (the CUDA path moves 16-byte vectors)",
                            name, ptr);
    if (row_stride % 8 != 0)
        return fa_set_error(FA_ERR_ALIGNMENT,
                            "%s_row_stride = %lld is not a multiple of 8 elements (16 bytes), "
                            "which the CUDA path needs", name, (long long)row_stride);
    if (head_stride % 8 != 0)
        return fa_set_error(FA_ERR_ALIGNMENT,
                            "%s_head_stride = %lld is not a multiple of 8 elements (16 bytes), "
                            "which the CUDA path needs", name, (long long)head_stride);
    if (!varlen && batch_stride % 8 != 0)
        return fa_set_error(FA_ERR_ALIGNMENT,
                            "%s_batch_stride = %lld is not a multiple of 8 elements (16 bytes), "
                            "which the CUDA path needs", name, (long long)batch_stride);
    return FA_OK;
}

static fa_status check_forward(const fa_problem *pb, fa_cuda_device_info *dev) {
    const fa_params *p = &pb->p;
    if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "dtype = %d: the CUDA forward supports f16 and bf16",
                            (int)p->dtype);
    if (p->head_dim < 8 || p->head_dim > 256 || p->head_dim % 8 != 0)
        return fa_set_error(FA_ERR_HEAD_DIM,
                            "head_dim = %lld: the CUDA forward needs a multiple of 8 in 8..256",
                            (long long)p->head_dim);
    if (p->head_dim_v < 8 || p->head_dim_v > 256 || p->head_dim_v % 8 != 0)
        return fa_set_error(FA_ERR_HEAD_DIM,
                            "head_dim_v = %lld: the CUDA forward needs a multiple of 8 in 8..256",
                            (long long)p->head_dim_v);
    fa_status s;
    if ((s = check_tensor_alignment("q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, pb->varlen)) != FA_OK ||
        (s = check_tensor_alignment("k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, pb->varlen)) != FA_OK ||
        (s = check_tensor_alignment("v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, pb->varlen)) != FA_OK ||
        (s = check_tensor_alignment("o", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride, pb->varlen)) != FA_OK)
        return s;
    if (((uintptr_t)p->lse & 3u) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "lse = %p is not 4-byte aligned", (void *)p->lse);
    if (((uintptr_t)p->alibi_slopes & 3u) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "alibi_slopes = %p is not 4-byte aligned",
                            (const void *)p->alibi_slopes);
    if (((uintptr_t)p->sink_logits & 3u) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "sink_logits = %p is not 4-byte aligned",
                            (const void *)p->sink_logits);
    if (((uintptr_t)p->cu_seqlens_q & 3u) != 0 || ((uintptr_t)p->cu_seqlens_k & 3u) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "cu_seqlens_%s is not 4-byte aligned",
                            ((uintptr_t)p->cu_seqlens_q & 3u) ? "q" : "k");

    /* Sizes: rows and keys are int in the kernels; the grid has 65535 in y and z. */
    const int64_t int_max = 2147483647;
    if (p->seqlen_q > int_max - 256 || p->seqlen_k > int_max - 256)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "seqlen_q = %lld, seqlen_k = %lld: the CUDA forward needs both below 2^31 - 256",
                            (long long)p->seqlen_q, (long long)p->seqlen_k);
    if (pb->varlen && (p->total_q > int_max - 256 || p->total_k > int_max - 256))
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "total_q = %lld, total_k = %lld: the CUDA forward needs both below 2^31 - 256",
                            (long long)p->total_q, (long long)p->total_k);
    if (p->heads_q > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "heads_q = %lld exceeds %d, the CUDA grid limit of the forward",
                            (long long)p->heads_q, FA_CUDA_GRID_YZ_MAX);
    if (p->batch > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "batch = %lld exceeds %d, the CUDA grid limit of the forward",
                            (long long)p->batch, FA_CUDA_GRID_YZ_MAX);

    if ((s = fa_cuda_current_device(dev)) != FA_OK) return s;
    if (dev->cc_major < 8)
        return fa_set_error(FA_ERR_DEVICE,
                            "CUDA device %d has compute capability %d.%d; the CUDA path needs 8.0 or newer",
                            dev->ordinal, dev->cc_major, dev->cc_minor);
    const int bucket = fa_fwd_hdim_bucket((int)p->head_dim, (int)p->head_dim_v);
    const size_t smem = fa_fwd_smem_bytes(bucket);
    if (smem > dev->smem_optin)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "head_dim = %lld, head_dim_v = %lld: the CUDA forward kernel needs %zu bytes of "
                            "shared memory per block, device %d allows %zu",
                            (long long)p->head_dim, (long long)p->head_dim_v, smem, dev->ordinal,
                            dev->smem_optin);
    return FA_OK;
}

extern "C" fa_status fa_cuda_check_forward(const fa_problem *pb, size_t *workspace_bytes) {
    if (workspace_bytes) *workspace_bytes = 0;
    fa_cuda_device_info dev;
    return check_forward(pb, &dev);
}

/* ---- forward: launch ------------------------------------------------------------------------ */

extern "C" fa_status fa_cuda_forward(const fa_problem *pb) {
    fa_cuda_device_info dev;
    fa_status s = check_forward(pb, &dev);
    if (s != FA_OK) return s;
    const fa_params *p = &pb->p;
    const int64_t rows_q = pb->varlen ? p->total_q : p->batch * p->seqlen_q;
    if (rows_q == 0 || p->seqlen_q == 0) return FA_OK; /* no query row: nothing to write */

    const int bucket = fa_fwd_hdim_bucket((int)p->head_dim, (int)p->head_dim_v);
    fa_fwd_params prm;
    prm.q = p->q;
    prm.k = p->k;
    prm.v = p->v;
    prm.o = p->o;
    prm.lse = p->lse;
    prm.q_batch_stride = p->q_batch_stride;
    prm.q_row_stride = p->q_row_stride;
    prm.q_head_stride = p->q_head_stride;
    prm.k_batch_stride = p->k_batch_stride;
    prm.k_row_stride = p->k_row_stride;
    prm.k_head_stride = p->k_head_stride;
    prm.v_batch_stride = p->v_batch_stride;
    prm.v_row_stride = p->v_row_stride;
    prm.v_head_stride = p->v_head_stride;
    prm.o_batch_stride = p->o_batch_stride;
    prm.o_row_stride = p->o_row_stride;
    prm.o_head_stride = p->o_head_stride;
    prm.cu_seqlens_q = pb->varlen ? p->cu_seqlens_q : nullptr;
    prm.cu_seqlens_k = pb->varlen ? p->cu_seqlens_k : nullptr;
    prm.total_q = p->total_q;
    prm.total_k = p->total_k;
    prm.batch = (int)p->batch;
    prm.seqlen_q = (int)p->seqlen_q;
    prm.seqlen_k = (int)p->seqlen_k;
    prm.heads_q = (int)p->heads_q;
    prm.heads_kv = (int)p->heads_kv;
    prm.group = (int)pb->group;
    prm.head_dim = (int)p->head_dim;
    prm.head_dim_v = (int)p->head_dim_v;
    prm.window_left = p->window_left;
    prm.window_right = p->window_right;
    prm.scale_log2 = pb->scale_log2;
    prm.softcap_pre = p->softcap > 0.0f ? p->softmax_scale / p->softcap : 0.0f;
    prm.softcap_post_log2 = p->softcap > 0.0f ? p->softcap * 1.4426950408889634f : 0.0f;
    prm.alibi_slopes = p->alibi_slopes;
    prm.alibi_batch_stride = p->alibi_batch_stride;
    prm.sink_logits = p->sink_logits;
    /* The plain path keeps raw scores and tracks their max, which orders like the scaled scores
     * only for a positive scale; anything else goes through the transformed (log2-unit) path. */
    prm.transform_scores = p->softcap > 0.0f || p->alibi_slopes != nullptr || !(pb->scale_log2 > 0.0f);
    prm.score_mul = prm.transform_scores ? 1.0f : pb->scale_log2;
    prm.num_m_blocks = (int)((p->seqlen_q + fa_fwd_block_m(bucket) - 1) / fa_fwd_block_m(bucket));
    prm.heavy_first = fa_fwd_heavy_first(p->window_left, p->window_right) &&
                      prm.num_m_blocks <= FA_CUDA_GRID_YZ_MAX;

    cudaStream_t stream = (cudaStream_t)p->stream;
    switch (bucket) {
    case 64: return fa_fwd_launch_hdim64(&prm, p->dtype, dev.ordinal, stream);
    case 128: return fa_fwd_launch_hdim128(&prm, p->dtype, dev.ordinal, stream);
    case 256: return fa_fwd_launch_hdim256(&prm, p->dtype, dev.ordinal, stream);
    default:
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld, head_dim_v = %lld: no CUDA forward kernel",
                            (long long)p->head_dim, (long long)p->head_dim_v);
    }
}
