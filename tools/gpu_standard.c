/*
 * gpu_standard.c: standard attention on the GPU for the CUDA benchmark (see gpu_standard.h).
 *
 * Three steps per call, all on the default stream:
 *   1. S = scale·Q Kᵀ, fp32 [b, hq, sq, sk]: cublasGemmStridedBatchedEx, one call per batch
 *      (per batch and kv head under GQA). Column-major view: Sᵀ (sk×sq) = K (sk×d) · Qᵀ (d×sq),
 *      where the row-major [s, h, d] tensors are read as column-major d×s matrices with
 *      leading dimension h·d.
 *   2. P = softmax(mask(S)) rounded to the input dtype: the kernel below, one block per row.
 *   3. O = P V: Oᵀ (dv×sq) = Vᵀ (dv×sk) · Pᵀ (sk×sq), written straight into o's [s, h, dv] rows.
 */
#include "gpu_standard.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* cuBLAS / CUDA enum values (stable across releases). */
#define CUBLAS_OP_N 0
#define CUBLAS_OP_T 1
#define CUDA_R_32F 0
#define CUDA_R_16F 2
#define CUDA_R_16BF 14
#define CUBLAS_COMPUTE_32F 68
#define CUBLAS_GEMM_DEFAULT (-1)
#define SOFTMAX_THREADS 256

typedef int (*gemm_strided_batched_fn)(void *handle, int trans_a, int trans_b, int m, int n, int k,
                                       const void *alpha, const void *a, int a_type, int lda,
                                       long long stride_a, const void *b, int b_type, int ldb,
                                       long long stride_b, const void *beta, void *c, int c_type,
                                       int ldc, long long stride_c, int batch_count,
                                       int compute_type, int algo);

/* Everything loaded once per process. */
typedef struct gpu_libs {
    int state; /* 0 not tried, 1 ready, -1 failed */
    char error[256];
    void *cublas_handle;
    gemm_strided_batched_fn gemm;
    void *softmax_kernel; /* CUfunction */
    int (*launch)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                  unsigned bz, unsigned shared_bytes, void *stream, void **params, void **extra);
} gpu_libs;

static gpu_libs libs;

/* The softmax kernel, compiled by NVRTC for the current device. The 16-bit stores round to
 * nearest even with the PTX cvt instructions, so no CUDA header is needed. */
static const char softmax_source[] =
    "#define THREADS 256\n"
    "/* Block-wide max (is_max) or sum; `partial` holds one value per warp. */\n"
    "__device__ float block_reduce(float v, int is_max, float *partial) {\n"
    "    for (int offset = 16; offset > 0; offset >>= 1) {\n"
    "        float other = __shfl_xor_sync(0xffffffffu, v, offset);\n"
    "        v = is_max ? fmaxf(v, other) : v + other;\n"
    "    }\n"
    "    __syncthreads(); /* earlier readers of partial are done */\n"
    "    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;\n"
    "    __syncthreads(); /* every warp's value is in partial */\n"
    "    float r = partial[0];\n"
    "    for (int w = 1; w < THREADS / 32; w++) r = is_max ? fmaxf(r, partial[w]) : r + partial[w];\n"
    "    return r;\n"
    "}\n"
    "/* scores/probs [rows, seqlen_k], row = (b·hq + h)·seqlen_q + i. Keys outside the row's\n"
    "   window (bottom-right aligned, -1 = unbounded) get probability 0. */\n"
    "extern \"C\" __global__ void __launch_bounds__(THREADS)\n"
    "fa_tool_softmax_rows(const float *scores, unsigned short *probs, long long seqlen_q,\n"
    "                     long long seqlen_k, long long window_left, long long window_right,\n"
    "                     int to_bf16) {\n"
    "    __shared__ float partial[THREADS / 32];\n"
    "    long long row = blockIdx.x, i = row % seqlen_q;\n"
    "    long long diag = i + seqlen_k - seqlen_q, lo = 0, hi = seqlen_k;\n"
    "    if (window_left >= 0 && diag - window_left > lo) lo = diag - window_left;\n"
    "    if (window_right >= 0 && diag + window_right + 1 < hi) hi = diag + window_right + 1;\n"
    "    const float *s = scores + row * seqlen_k;\n"
    "    unsigned short *p = probs + row * seqlen_k;\n"
    "    float m = __int_as_float(0xff800000);\n"
    "    for (long long j = lo + threadIdx.x; j < hi; j += THREADS) m = fmaxf(m, s[j]);\n"
    "    m = block_reduce(m, 1, partial);\n"
    "    float sum = 0.0f;\n"
    "    for (long long j = lo + threadIdx.x; j < hi; j += THREADS) sum += expf(s[j] - m);\n"
    "    sum = block_reduce(sum, 0, partial);\n"
    "    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;\n"
    "    for (long long j = threadIdx.x; j < seqlen_k; j += THREADS) {\n"
    "        float v = (j >= lo && j < hi) ? expf(s[j] - m) * inv : 0.0f;\n"
    "        unsigned short h;\n"
    "        if (to_bf16) asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));\n"
    "        else asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));\n"
    "        p[j] = h;\n"
    "    }\n"
    "}\n";

static void *open_first(const char *const *names, size_t count) {
    for (size_t i = 0; i < count; i++) {
        void *handle = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (handle) return handle;
    }
    return NULL;
}

/* dlsym into a function-pointer slot; records the missing name. */
static int bind(void *handle, void *slot, const char *symbol) {
    void *fn = handle ? dlsym(handle, symbol) : NULL;
    if (!fn) {
        snprintf(libs.error, sizeof libs.error, "symbol %s not found", symbol);
        return 0;
    }
    memcpy(slot, &fn, sizeof fn);
    return 1;
}

static int load_cublas(void) {
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    int (*create)(void **handle);
    void *handle = open_first(names, sizeof names / sizeof names[0]);
    if (!handle) {
        snprintf(libs.error, sizeof libs.error, "no cuBLAS found (libcublas.so.13/.12)");
        return 0;
    }
    if (!bind(handle, &create, "cublasCreate_v2") ||
        !bind(handle, &libs.gemm, "cublasGemmStridedBatchedEx"))
        return 0;
    int status = create(&libs.cublas_handle);
    if (status != 0) snprintf(libs.error, sizeof libs.error, "cublasCreate failed (%d)", status);
    return status == 0;
}

/* NVRTC: CUDA C -> PTX for compute_<cc>. Returns 0 with the compiler log in libs.error. */
static int compile_softmax(int cc, char *ptx, size_t ptx_size) {
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    int (*create)(void **prog, const char *src, const char *name, int n_headers,
                  const char *const *headers, const char *const *include_names);
    int (*compile)(void *prog, int n_options, const char *const *options);
    int (*get_size)(void *prog, size_t *size);
    int (*get_ptx)(void *prog, char *ptx_out);
    int (*get_log)(void *prog, char *log);
    int (*destroy)(void **prog);
    void *handle = open_first(names, sizeof names / sizeof names[0]);
    if (!handle) {
        snprintf(libs.error, sizeof libs.error, "no NVRTC found (libnvrtc.so.13/.12)");
        return 0;
    }
    if (!bind(handle, &create, "nvrtcCreateProgram") ||
        !bind(handle, &compile, "nvrtcCompileProgram") ||
        !bind(handle, &get_size, "nvrtcGetPTXSize") || !bind(handle, &get_ptx, "nvrtcGetPTX") ||
        !bind(handle, &get_log, "nvrtcGetProgramLog") ||
        !bind(handle, &destroy, "nvrtcDestroyProgram"))
        return 0;
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=compute_%d", cc);
    const char *options[] = {arch};
    void *prog = NULL;
    size_t size = 0;
    int ok = create(&prog, softmax_source, "fa_tool_softmax.cu", 0, NULL, NULL) == 0;
    if (ok && compile(prog, 1, options) != 0) {
        char log[4096] = "";
        get_log(prog, log);
        snprintf(libs.error, sizeof libs.error, "NVRTC failed: %.200s", log);
        ok = 0;
    }
    ok = ok && get_size(prog, &size) == 0 && size <= ptx_size && get_ptx(prog, ptx) == 0;
    if (prog) destroy(&prog);
    if (!ok && !libs.error[0]) snprintf(libs.error, sizeof libs.error, "NVRTC: no PTX");
    return ok;
}

/* Driver API: load the PTX into the current (runtime primary) context. */
static int load_kernel(const char *ptx) {
    int (*init)(unsigned flags);
    int (*load)(void **module, const void *image);
    int (*get_function)(void **fn, void *module, const char *name);
    void *module = NULL;
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        snprintf(libs.error, sizeof libs.error, "libcuda.so.1 not found");
        return 0;
    }
    if (!bind(handle, &init, "cuInit") || !bind(handle, &load, "cuModuleLoadData") ||
        !bind(handle, &get_function, "cuModuleGetFunction") ||
        !bind(handle, &libs.launch, "cuLaunchKernel"))
        return 0;
    int status = init(0);
    if (status == 0) status = load(&module, ptx);
    if (status == 0) status = get_function(&libs.softmax_kernel, module, "fa_tool_softmax_rows");
    if (status != 0)
        snprintf(libs.error, sizeof libs.error, "loading the softmax kernel failed (CUresult %d)",
                 status);
    return status == 0;
}

static int load_libs(const cudart_api *rt) {
    static char ptx[1 << 16];
    if (libs.state != 0) return libs.state == 1;
    libs.state = -1;
    int device = 0, major = 0, minor = 0;
    rt->get_device(&device);
    rt->device_get_attribute(&major, CUDART_ATTR_CC_MAJOR, device);
    rt->device_get_attribute(&minor, CUDART_ATTR_CC_MINOR, device);
    if (!load_cublas() || !compile_softmax(major * 10 + minor, ptx, sizeof ptx) ||
        !load_kernel(ptx))
        return 0;
    libs.state = 1;
    return 1;
}

size_t gpu_standard_bytes(const fa_params *p) {
    size_t elements = (size_t)(p->batch * p->heads_q * p->seqlen_q * p->seqlen_k);
    return elements * (sizeof(float) + 2);
}

int gpu_standard_init(gpu_standard *st, const cudart_api *rt, const fa_params *p, char *why,
                      size_t why_size) {
    memset(st, 0, sizeof *st);
    st->rt = rt;
    if (p->softcap > 0.0f || p->alibi_slopes || p->sink_logits || p->cu_seqlens_q ||
        p->dtype == FA_DTYPE_F32) {
        snprintf(why, why_size, "the GPU baseline covers f16/bf16 dense masks only");
        return 0;
    }
    if (!load_libs(rt)) {
        snprintf(why, why_size, "%s", libs.error);
        return 0;
    }
    size_t elements = (size_t)(p->batch * p->heads_q * p->seqlen_q * p->seqlen_k);
    st->bytes = gpu_standard_bytes(p);
    if (rt->malloc_((void **)&st->scores, elements * sizeof(float)) != 0 ||
        rt->malloc_(&st->probs, elements * 2) != 0) {
        snprintf(why, why_size, "cudaMalloc of the %zu-byte score matrices failed", st->bytes);
        gpu_standard_free(st);
        return 0;
    }
    return 1;
}

void gpu_standard_free(gpu_standard *st) {
    if (st->scores) st->rt->free_(st->scores);
    if (st->probs) st->rt->free_(st->probs);
    st->scores = NULL;
    st->probs = NULL;
}

/* Element pointer arithmetic on device addresses. */
static const void *at(const void *base, long long elements, size_t elem_size) {
    return (const char *)base + elements * (long long)elem_size;
}

/* Step 1 (probs_step 0) or 3 (probs_step 1) for query heads [h0, h0 + n) of batch b, as one
 * strided batched GEMM; kv_per_head: each query head has its own kv head (else the n heads form
 * one GQA group and share kv head h0 / group). */
static int gemms_for_heads(gpu_standard *st, const fa_params *p, long long b, long long h0,
                           int n, int kv_per_head, int probs_step) {
    size_t es = 2;
    int type = p->dtype == FA_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    long long group = p->heads_q / p->heads_kv, kv = h0 / group;
    long long d = p->head_dim, dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    long long sq = p->seqlen_q, sk = p->seqlen_k, matrix = sq * sk;
    float scale = p->softmax_scale != 0.0f ? p->softmax_scale : 1.0f / sqrtf((float)d);
    float one = 1.0f, zero = 0.0f;
    float *s = st->scores + (b * p->heads_q + h0) * matrix;
    const void *probs = at(st->probs, (b * p->heads_q + h0) * matrix, es);
    if (!probs_step) {
        const void *k = at(p->k, b * p->k_batch_stride + kv * p->k_head_stride, es);
        const void *q = at(p->q, b * p->q_batch_stride + h0 * p->q_head_stride, es);
        return libs.gemm(libs.cublas_handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)sk, (int)sq, (int)d,
                         &scale, k, type, (int)p->k_row_stride, kv_per_head ? p->k_head_stride : 0,
                         q, type, (int)p->q_row_stride, p->q_head_stride, &zero, s, CUDA_R_32F,
                         (int)sk, matrix, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    const void *v = at(p->v, b * p->v_batch_stride + kv * p->v_head_stride, es);
    void *o = (void *)at(p->o, b * p->o_batch_stride + h0 * p->o_head_stride, es);
    return libs.gemm(libs.cublas_handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)dv, (int)sq, (int)sk, &one,
                     v, type, (int)p->v_row_stride, kv_per_head ? p->v_head_stride : 0, probs, type,
                     (int)sk, matrix, &zero, o, type, (int)p->o_row_stride, p->o_head_stride, n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* Step 1 or 3 over every batch and head: one GEMM call per batch, or per (batch, kv head). */
static int gemm_step(gpu_standard *st, const fa_params *p, int probs_step) {
    long long group = p->heads_q / p->heads_kv;
    for (long long b = 0; b < p->batch; b++) {
        if (group == 1) {
            if (gemms_for_heads(st, p, b, 0, (int)p->heads_q, 1, probs_step) != 0) return 0;
            continue;
        }
        for (long long kv = 0; kv < p->heads_kv; kv++)
            if (gemms_for_heads(st, p, b, kv * group, (int)group, 0, probs_step) != 0) return 0;
    }
    return 1;
}

static int softmax_step(gpu_standard *st, const fa_params *p) {
    float *scores = st->scores;
    void *probs = st->probs;
    long long sq = p->seqlen_q, sk = p->seqlen_k;
    long long left = p->use_window && p->window_left >= 0 ? p->window_left : -1;
    long long right = p->use_window && p->window_right >= 0 ? p->window_right : -1;
    int to_bf16 = p->dtype == FA_DTYPE_BF16;
    if (p->causal) right = 0; /* causal folds into the window: right = min(right, 0) */
    void *args[] = {&scores, &probs, &sq, &sk, &left, &right, &to_bf16};
    unsigned rows = (unsigned)(p->batch * p->heads_q * sq);
    return libs.launch(libs.softmax_kernel, rows, 1, 1, SOFTMAX_THREADS, 1, 1, 0, NULL, args,
                       NULL) == 0;
}

int gpu_standard_forward(gpu_standard *st, const fa_params *p, char *why, size_t why_size) {
    if (!gemm_step(st, p, 0)) {
        snprintf(why, why_size, "cuBLAS GEMM (S = Q K^T) failed");
        return 0;
    }
    if (!softmax_step(st, p)) {
        snprintf(why, why_size, "softmax kernel launch failed");
        return 0;
    }
    if (!gemm_step(st, p, 1)) {
        snprintf(why, why_size, "cuBLAS GEMM (O = P V) failed");
        return 0;
    }
    return 1;
}
