/*
 * fwd.cu: host side of the CUDA engine's forward path, and the engine's shared host pieces.
 *
 *   fa_cuda_built / fa_cuda_is_available     build and device presence
 *   fa_cuda_current_device                   per-device properties, queried once per ordinal
 *   fa_cuda_check_* / fa_cuda_workspace_*    checks and workspace handling the forward, backward
 *                                            and decode host code share (cuda_common.cuh)
 *   fa_cuda_check_forward                    the forward kernels' own limits (dims, alignment,
 *                                            grid and shared-memory limits); workspace only
 *                                            for a paged K/V (its packed copy, gather.cu)
 *   fa_cuda_forward                          fills fa_fwd_params, picks the head-dim bucket and
 *                                            calls its extern "C" launcher (fwd_hdim*.cu); a
 *                                            paged K/V goes through fa_cuda_forward_paged
 *
 * Everything runs asynchronously on p->stream: no device synchronisation, no allocation in the
 * forward (but the paged K/V's copy without a caller workspace), and cu_seqlens (device memory)
 * are never read here.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/fwd_tiles.h"
#include "cuda/common/fwd_launch.h"
#include "cuda/common/gather_launch.h"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/mods.cuh"

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

fa_status fa_cuda_current_device_sm80(fa_cuda_device_info *dev) {
    fa_status s = fa_cuda_current_device(dev);
    if (s != FA_OK) return s;
    if (dev->cc_major < 8)
        return fa_set_error(FA_ERR_DEVICE,
                            "CUDA device %d has compute capability %d.%d; the CUDA path needs 8.0 or newer",
                            dev->ordinal, dev->cc_major, dev->cc_minor);
    return FA_OK;
}

/* ---- checks shared by the forward, backward and decode paths -------------------------------- */

fa_status fa_cuda_check_dtype_and_dims(const fa_params *p, const char *path, int max_head_dim, int max_head_dim_v) {
    if (p->dtype == FA_DTYPE_FP8_E4M3)
        return fa_set_error(FA_ERR_DTYPE, "dtype = FA_DTYPE_FP8_E4M3: %s takes f16 and bf16 (fp8 inputs on CUDA: "
                                          "fa_forward on an sm_90 GPU)", path);
    if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "dtype = %d: %s supports f16 and bf16", (int)p->dtype, path);
    if (p->head_dim < 8 || p->head_dim > max_head_dim || p->head_dim % 8 != 0)
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld: %s needs a multiple of 8 in 8..%d",
                            (long long)p->head_dim, path, max_head_dim);
    if (p->head_dim_v < 8 || p->head_dim_v > max_head_dim_v || p->head_dim_v % 8 != 0)
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim_v = %lld: %s needs a multiple of 8 in 8..%d",
                            (long long)p->head_dim_v, path, max_head_dim_v);
    return FA_OK;
}

fa_status fa_cuda_check_aligned(const char *name, const void *ptr, unsigned bytes) {
    if (((uintptr_t)ptr & (uintptr_t)(bytes - 1)) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "%s = %p is not %u-byte aligned", name, ptr, bytes);
    return FA_OK;
}

fa_status fa_cuda_check_tensor(const char *name, const void *ptr, int64_t batch_stride, int64_t row_stride,
                               int64_t head_stride, int check_batch, int elem_bytes, const char *path) {
    if (((uintptr_t)ptr & 15u) != 0)
        return fa_set_error(FA_ERR_ALIGNMENT, "%s = %p is not 16-byte aligned (%s moves 16-byte vectors)",
                            name, ptr, path);
    const int64_t strides[3] = {batch_stride, row_stride, head_stride};
    static const char *const axis[3] = {"batch", "row", "head"};
    const int per_16_bytes = 16 / elem_bytes;
    for (int i = check_batch ? 0 : 1; i < 3; ++i)
        if (strides[i] % per_16_bytes != 0)
            return fa_set_error(FA_ERR_ALIGNMENT,
                                "%s_%s_stride = %lld is not a multiple of %d elements (16 bytes), which %s needs",
                                name, axis[i], (long long)strides[i], per_16_bytes, path);
    return FA_OK;
}

fa_status fa_cuda_check_tensor16(const char *name, const void *ptr, int64_t batch_stride, int64_t row_stride,
                                 int64_t head_stride, int check_batch, const char *path) {
    return fa_cuda_check_tensor(name, ptr, batch_stride, row_stride, head_stride, check_batch, 2, path);
}

fa_status fa_cuda_check_smem(const fa_params *p, const fa_cuda_device_info *dev, size_t smem, const char *kernel) {
    if (smem > dev->smem_optin)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "head_dim = %lld, head_dim_v = %lld: %s needs %zu bytes of shared memory per "
                            "block, device %d allows %zu",
                            (long long)p->head_dim, (long long)p->head_dim_v, kernel, smem, dev->ordinal,
                            dev->smem_optin);
    return FA_OK;
}

/* ---- workspace shared by the backward and the split-KV decode -------------------------------- */

fa_status fa_cuda_workspace_acquire(void *given, size_t bytes, cudaStream_t stream, const char *what,
                                    fa_cuda_workspace *ws) {
    ws->base = static_cast<uint8_t *>(given);
    ws->owned = given == nullptr && bytes > 0;
    if (!ws->owned) return FA_OK;
    void *mem = nullptr;
    const cudaError_t e = cudaMallocAsync(&mem, bytes, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* allocation failures are not sticky; do not leave it set */
        ws->owned = false;
        return fa_set_error(FA_ERR_ALLOC, "cudaMallocAsync(%zu bytes of %s workspace): %s", bytes, what,
                            cudaGetErrorString(e));
    }
    ws->base = static_cast<uint8_t *>(mem);
    return FA_OK;
}

fa_status fa_cuda_workspace_release(fa_cuda_workspace *ws, cudaStream_t stream, const char *what, fa_status status) {
    if (!ws->owned) return status;
    ws->owned = false;
    /* Stream-ordered: freed after the kernels queued before it have run. */
    const cudaError_t e = cudaFreeAsync(ws->base, stream);
    if (e != cudaSuccess && status == FA_OK)
        status = fa_set_error(FA_ERR_CUDA, "cudaFreeAsync(%s workspace): %s", what, cudaGetErrorString(e));
    return status;
}

/* ---- forward: limits ------------------------------------------------------------------------ */

/* Whether the fp8 forward transposes V in its kernel or by the pre-pass (sm90_tiles.h,
 * fa_hopper_fp8_vt_in_kernel); the one place that decides it, for the shared-memory check, the
 * workspace and the launch. FA_HOPPER_FP8_VT=kernel / prepass forces either where it fits (tests
 * and timing). */
static int fp8_vt_in_kernel(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    const int bucket = fa_hopper_fp8_bucket((int)p->head_dim, (int)p->head_dim_v);
    const char *forced = getenv("FA_HOPPER_FP8_VT");
    if (forced != nullptr && strcmp(forced, "kernel") == 0) return fa_hopper_fp8_vt_fits(bucket);
    if (forced != nullptr && strcmp(forced, "prepass") == 0) return 0;
    return fa_hopper_fp8_vt_in_kernel(bucket, p->seqlen_q, p->heads_q, p->heads_kv);
}

/* fp8 e4m3 inputs: the Hopper fp8 forward only (sm90_tiles.h, fa_hopper_fp8_unsupported); q, k
 * and v 8-bit with 16-byte rows for the TMA, o bf16. */
static fa_status check_forward_fp8(const fa_problem *pb, fa_cuda_device_info *dev) {
    const fa_params *p = &pb->p;
    static const char *const path = "the CUDA fp8 forward";
    fa_status s;
    if ((s = fa_cuda_current_device_sm80(dev)) != FA_OK) return s;
    const char *why = fa_hopper_fp8_unsupported(dev->cc_major, dev->cc_minor, (int)p->head_dim, (int)p->head_dim_v,
                                                p->alibi_slopes != nullptr, pb->scale_log2, pb->has_dropout,
                                                pb->has_mods, p->block_table != nullptr);
    if (why != nullptr)
        return fa_set_error(fa_hopper_fp8_bucket((int)p->head_dim, (int)p->head_dim_v) == 0 ? FA_ERR_HEAD_DIM
                                                                                             : FA_ERR_UNSUPPORTED,
                            "dtype = FA_DTYPE_FP8_E4M3 (head_dim = %lld, head_dim_v = %lld): %s %s",
                            (long long)p->head_dim, (long long)p->head_dim_v, path, why);
    const int check_batch = !pb->varlen;
    if ((s = fa_cuda_check_tensor("q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, check_batch, 1,
                                  path)) != FA_OK ||
        (s = fa_cuda_check_tensor("k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, check_batch, 1,
                                  path)) != FA_OK ||
        (s = fa_cuda_check_tensor("v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, check_batch, 1,
                                  path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("o", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride, check_batch,
                                    path)) != FA_OK ||
        (s = fa_cuda_check_aligned("lse", p->lse, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("sink_logits", p->sink_logits, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cu_seqlens_q", p->cu_seqlens_q, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cu_seqlens_k", p->cu_seqlens_k, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("q_descale", p->q_descale, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("k_descale", p->k_descale, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("v_descale", p->v_descale, 4)) != FA_OK)
        return s;
    const int64_t int_max = 2147483647;
    const int64_t keys = pb->varlen ? p->total_k : p->seqlen_k;
    if (p->seqlen_q > int_max - 256 || keys + 128 * p->batch > int_max - 256 || p->total_q > int_max - 256)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "seqlen_q = %lld, keys = %lld (plus 128 per sequence): %s needs both below 2^31 - 256",
                            (long long)p->seqlen_q, (long long)keys, path);
    if (p->heads_q > FA_CUDA_GRID_YZ_MAX || p->batch > FA_CUDA_GRID_YZ_MAX)
        return fa_set_error(FA_ERR_INVALID_SIZE, "heads_q = %lld, batch = %lld: %s takes at most %d of each",
                            (long long)p->heads_q, (long long)p->batch, path, FA_CUDA_GRID_YZ_MAX);
    return fa_cuda_check_smem(p, dev,
                              fa_hopper_fp8_smem_bytes(fa_hopper_fp8_bucket((int)p->head_dim, (int)p->head_dim_v),
                                                       fp8_vt_in_kernel(pb)),
                              "the Hopper fp8 forward kernel");
}

/* vt_in_kernel: fp8_vt_in_kernel(pb) */
static size_t fp8_workspace_bytes(const fa_problem *pb, int vt_in_kernel) {
    const fa_params *p = &pb->p;
    return fa_hopper_fp8_workspace_bytes(fa_hopper_fp8_bucket((int)p->head_dim, (int)p->head_dim_v),
                                         vt_in_kernel, pb->varlen, p->batch, p->heads_kv, p->head_dim_v,
                                         p->seqlen_k, p->total_k);
}

static fa_status check_forward(const fa_problem *pb, fa_cuda_device_info *dev) {
    const fa_params *p = &pb->p;
    static const char *const path = "the CUDA forward";
    fa_status s;
    if (p->dtype == FA_DTYPE_FP8_E4M3) return check_forward_fp8(pb, dev);
    const int check_batch = !pb->varlen;
    const int paged = p->block_table != nullptr; /* the page pool's batch stride is its page stride */
    if (paged && (s = fa_cuda_check_paged(pb)) != FA_OK) return s;
    if ((s = fa_cuda_check_dtype_and_dims(p, path, 576, 512)) != FA_OK ||
        (s = fa_cuda_check_tensor16("q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride, check_batch || paged, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride, check_batch || paged, path)) != FA_OK ||
        (s = fa_cuda_check_tensor16("o", p->o, p->o_batch_stride, p->o_row_stride, p->o_head_stride, check_batch, path)) != FA_OK ||
        (s = fa_cuda_check_aligned("lse", p->lse, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("attn_probs", p->attn_probs, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("alibi_slopes", p->alibi_slopes, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("sink_logits", p->sink_logits, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cu_seqlens_q", p->cu_seqlens_q, 4)) != FA_OK ||
        (s = fa_cuda_check_aligned("cu_seqlens_k", p->cu_seqlens_k, 4)) != FA_OK)
        return s;

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

    if ((s = fa_cuda_current_device_sm80(dev)) != FA_OK) return s;
    const int bucket = fa_fwd_hdim_bucket((int)p->head_dim, (int)p->head_dim_v);
    if (pb->has_mods && (s = fa_cuda_mods_check(pb, fa_fwd_block_m(bucket), fa_fwd_block_n(bucket), 0, path)) != FA_OK)
        return s;
    return fa_cuda_check_smem(p, dev, fa_fwd_smem_bytes(bucket), "the CUDA forward kernel");
}

extern "C" fa_status fa_cuda_check_forward(const fa_problem *pb, size_t *workspace_bytes) {
    if (workspace_bytes) *workspace_bytes = 0;
    fa_cuda_device_info dev;
    fa_status s = check_forward(pb, &dev);
    if (s == FA_OK && workspace_bytes && pb->p.block_table != nullptr) *workspace_bytes = fa_cuda_paged_workspace(pb);
    if (s == FA_OK && workspace_bytes && pb->has_mods) *workspace_bytes = fa_cuda_mods_map_bytes(pb);
    if (s == FA_OK && workspace_bytes && pb->p.dtype == FA_DTYPE_FP8_E4M3)
        *workspace_bytes = fp8_workspace_bytes(pb, fp8_vt_in_kernel(pb));
    return s;
}

/* ---- forward: launch ------------------------------------------------------------------------ */

/* Which forward kernel runs: the Hopper one on compute capability 9.0 for the problems it covers
 * (sm90_tiles.h), else the portable one. FA_CUDA_FORWARD=portable in the environment forces
 * the portable kernel (tests run the GPU sweep through both). */
extern "C" fa_cuda_fwd_kernel fa_cuda_forward_kernel(const fa_problem *pb, const fa_cuda_device_info *dev) {
    const fa_params *p = &pb->p;
    const char *force = getenv("FA_CUDA_FORWARD");
    if (force != nullptr && strcmp(force, "portable") == 0) return FA_CUDA_FWD_PORTABLE;
    /* score modifications: the Hopper MODS instantiations when a block mask's blocks are whole
     * Hopper tiles, else the portable ones */
    if (pb->has_mods && !fa_hopper_fwd_mods_blocks_ok(fa_hopper_bucket((int)p->head_dim, (int)p->head_dim_v),
                                                      pb->has_block_mask ? p->block_q : 0,
                                                      pb->has_block_mask ? p->block_k : 0))
        return FA_CUDA_FWD_PORTABLE;
    const char *why = fa_hopper_fwd_unsupported(dev->cc_major, dev->cc_minor, p->dtype, (int)p->head_dim,
                                                (int)p->head_dim_v, p->alibi_slopes != nullptr, pb->scale_log2,
                                                p->softcap, pb->has_dropout);
    return why == nullptr ? FA_CUDA_FWD_HOPPER : FA_CUDA_FWD_PORTABLE;
}

/* The MODS instantiations: the block map (if any) built and checked first, every score through
 * the transformed path (the bias is added in log2 units there); the Hopper ones when
 * fa_cuda_forward_kernel picks them. */
static fa_status forward_mods(const fa_problem *pb, fa_fwd_params *prm, int bucket, const fa_cuda_device_info *dev,
                              cudaStream_t stream) {
    const int device_ordinal = dev->ordinal;
    const fa_params *p = &pb->p;
    fa_cuda_workspace ws;
    fa_status s = fa_cuda_workspace_acquire(p->workspace, fa_cuda_mods_map_bytes(pb), stream, "block map", &ws);
    if (s != FA_OK) return s;
    fa_mods_params mods;
    s = fa_cuda_mods_prepare(pb, ws.base, stream, &mods);
    int done = 0;
    if (s == FA_OK && fa_cuda_forward_kernel(pb, dev) == FA_CUDA_FWD_HOPPER) {
        s = fa_fwd_launch_hopper(prm, NULL, &mods, p->dtype, device_ordinal, stream);
        done = s != FA_ERR_STRIDE; /* strides TMA cannot express: the portable kernel */
        if (!done) s = FA_OK;
    }
    if (s == FA_OK && !done) {
        prm->transform_scores = 1;
        prm->score_mul = 1.0f;
        switch (bucket) {
        case 64: s = fa_fwd_mods_launch_hdim64(prm, &mods, p->dtype, device_ordinal, stream); break;
        case 128: s = fa_fwd_mods_launch_hdim128(prm, &mods, p->dtype, device_ordinal, stream); break;
        case 256: s = fa_fwd_mods_launch_hdim256(prm, &mods, p->dtype, device_ordinal, stream); break;
        case 512: s = fa_fwd_mods_launch_hdim512(prm, &mods, p->dtype, device_ordinal, stream); break;
        case 576: s = fa_fwd_mods_launch_hdim576(prm, &mods, p->dtype, device_ordinal, stream); break;
        default:
            s = fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld, head_dim_v = %lld: no CUDA forward kernel",
                             (long long)p->head_dim, (long long)p->head_dim_v);
        }
    }
    return fa_cuda_workspace_release(&ws, stream, "block map", s);
}

/* probs.cu: attn_probs (flash_attn's S_dmask) by a separate pass */
extern "C" fa_status fa_cuda_attn_probs(const fa_problem *pb);

extern "C" fa_status fa_cuda_forward(const fa_problem *pb) {
    fa_cuda_device_info dev;
    fa_status s = check_forward(pb, &dev);
    if (s != FA_OK) return s;
    const fa_params *p = &pb->p;
    if (p->attn_probs != nullptr && (s = fa_cuda_attn_probs(pb)) != FA_OK) return s;
    const int64_t rows_q = pb->varlen ? p->total_q : p->batch * p->seqlen_q;
    if (rows_q == 0 || p->seqlen_q == 0) return FA_OK; /* no query row: nothing to write */
    if (p->block_table != nullptr) return fa_cuda_forward_paged(pb);

    const int bucket = fa_fwd_hdim_bucket((int)p->head_dim, (int)p->head_dim_v);
    fa_fwd_params prm;
    fa_cuda_fill_kernel_base(&prm, pb);
    prm.num_m_blocks = (int)((p->seqlen_q + fa_fwd_block_m(bucket) - 1) / fa_fwd_block_m(bucket));
    prm.heavy_first = fa_fwd_heavy_first(p->window_left, p->window_right) &&
                      prm.num_m_blocks <= FA_CUDA_GRID_YZ_MAX;
    prm.head_group = 0; /* the Hopper launcher sets its own; the portable kernel's grid is 3-D */

    cudaStream_t stream = (cudaStream_t)p->stream;
    if (p->dtype == FA_DTYPE_FP8_E4M3) { /* Vᵀ into the workspace unless the kernel transposes V */
        fa_cuda_workspace ws;
        const int vt_in_kernel = fp8_vt_in_kernel(pb);
        if ((s = fa_cuda_workspace_acquire(p->workspace, fp8_workspace_bytes(pb, vt_in_kernel), stream, "fp8 forward",
                                           &ws)) != FA_OK)
            return s;
        s = fa_fwd_launch_hopper_fp8(&prm, p->q_descale, p->k_descale, p->v_descale, ws.base, vt_in_kernel, dev.ordinal,
                                     stream);
        return fa_cuda_workspace_release(&ws, stream, "fp8 forward", s);
    }
    if (pb->has_mods) return forward_mods(pb, &prm, bucket, &dev, stream);
    const bool dropout = pb->has_dropout; /* the DROPOUT instantiations */
    const fa_dropout_params drop = fa_cuda_dropout_params(pb);
    if (fa_cuda_forward_kernel(pb, &dev) == FA_CUDA_FWD_HOPPER) {
        s = fa_fwd_launch_hopper(&prm, dropout ? &drop : NULL, NULL, p->dtype, dev.ordinal, stream);
        if (s != FA_ERR_STRIDE) return s; /* strides TMA cannot express: the portable kernel */
    }
    switch (bucket) {
    case 64:
        return dropout ? fa_fwd_dropout_launch_hdim64(&prm, &drop, p->dtype, dev.ordinal, stream)
                       : fa_fwd_launch_hdim64(&prm, p->dtype, dev.ordinal, stream);
    case 128:
        return dropout ? fa_fwd_dropout_launch_hdim128(&prm, &drop, p->dtype, dev.ordinal, stream)
                       : fa_fwd_launch_hdim128(&prm, p->dtype, dev.ordinal, stream);
    case 256:
        return dropout ? fa_fwd_dropout_launch_hdim256(&prm, &drop, p->dtype, dev.ordinal, stream)
                       : fa_fwd_launch_hdim256(&prm, p->dtype, dev.ordinal, stream);
    case 512:
        return dropout ? fa_fwd_dropout_launch_hdim512(&prm, &drop, p->dtype, dev.ordinal, stream)
                       : fa_fwd_launch_hdim512(&prm, p->dtype, dev.ordinal, stream);
    case 576:
        return dropout ? fa_fwd_dropout_launch_hdim576(&prm, &drop, p->dtype, dev.ordinal, stream)
                       : fa_fwd_launch_hdim576(&prm, p->dtype, dev.ordinal, stream);
    default:
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %lld, head_dim_v = %lld: no CUDA forward kernel",
                            (long long)p->head_dim, (long long)p->head_dim_v);
    }
}
