/*
 * ring_nccl_check.c: the C API's ring attention (fa_ring_forward / fa_ring_backward) over NCCL on
 * every GPU of this machine: one thread per GPU in one process (ncclCommInitAll), the library's
 * NCCL transport (fa_ring_comm_nccl) on a second stream of each GPU.
 *
 *   ring_nccl_check check               bf16, GQA: causal zig-zag, causal contiguous, full,
 *                                       uneven shards, a varlen batch; every output and gradient
 *                                       of the ring against fa_forward / fa_backward over the
 *                                       whole sequence on GPU 0. Pass: max |ring - 1 GPU| <= 4
 *                                       units in the last place of bf16 at the tensor's largest
 *                                       magnitude (both round partial results differently; the
 *                                       float64 rule is checked by bench/bench_ring.py)
 *   ring_nccl_check bench [tokens ...]  one layer (batch 1, hq 32, hkv 8, d 128, causal,
 *                                       zig-zag): forward and backward ms on 1 GPU and on the
 *                                       ring, speed-up and efficiency (default 32k..256k)
 *
 * Built and run by tests/multi_gpu_test.sh (make multi-gpu-test) (needs nccl.h and libnccl). Exit status 0 when
 * every check passed.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "flashattn.h"

#define MAX_GPUS 8
#define MAX_BATCH 8

#define CUDA_OK(call)                                                                             \
    do {                                                                                          \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

#define FA_OK_OR_DIE(call)                                                                        \
    do {                                                                                          \
        fa_status st_ = (call);                                                                   \
        if (st_ != FA_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, fa_strerror(st_),   \
                    fa_last_error());                                                             \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

/* ---- host data -------------------------------------------------------------------------------- */

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

/* Near-normal (mean 0, variance 1) from one xorshift step: the sum of its four 16-bit fields is
 * Irwin-Hall(4); cheap enough for the bench's 256k-token tensors (billions of elements). */
static float fast_normal(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    uint64_t x = rng_state;
    uint32_t sum = (uint32_t)(x & 0xffff) + (uint32_t)((x >> 16) & 0xffff) + (uint32_t)((x >> 32) & 0xffff) +
                   (uint32_t)(x >> 48);
    return ((float)sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static uint16_t *random_bf16(size_t n, float offset) {
    uint16_t *x = malloc(n * 2);
    if (x == NULL) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n * 2);
        exit(2);
    }
    if (n > ((size_t)1 << 24)) { /* bench sizes */
        for (size_t i = 0; i < n; i++) x[i] = to_bf16(fast_normal() + offset);
        return x;
    }
    for (size_t i = 0; i < n; i++) x[i] = to_bf16(normal() + offset);
    return x;
}

/* ---- one problem ------------------------------------------------------------------------------ */

typedef struct problem {
    const char *name;
    fa_ring_sharding sharding;
    int causal;
    int64_t batch, tokens;     /* batched                                                   */
    int varlen;
    int32_t cu[MAX_BATCH + 1]; /* varlen: global prefix sums                                */
    int64_t hq, hkv, d;
} problem;

static int64_t total_rows(const problem *pb) { return pb->varlen ? pb->cu[pb->batch] : pb->batch * pb->tokens; }
static int64_t seq_len(const problem *pb, int64_t b) { return pb->varlen ? pb->cu[b + 1] - pb->cu[b] : pb->tokens; }
static int64_t seq_start(const problem *pb, int64_t b) { return pb->varlen ? pb->cu[b] : b * pb->tokens; }

/* Global tensors, rows in the global order ([batch·tokens] or packed), dense [rows, heads, dim]. */
typedef struct tensors {
    uint16_t *q, *k, *v, *dout, *o, *dq, *dk, *dv;
    float *lse; /* [batch, hq, tokens] or [hq, total] */
} tensors;

static size_t q_elems(const problem *pb) { return (size_t)(total_rows(pb) * pb->hq * pb->d); }
static size_t k_elems(const problem *pb) { return (size_t)(total_rows(pb) * pb->hkv * pb->d); }

static void alloc_outputs(const problem *pb, tensors *t) {
    t->o = calloc(q_elems(pb), 2);
    t->dq = calloc(q_elems(pb), 2);
    t->dk = calloc(k_elems(pb), 2);
    t->dv = calloc(k_elems(pb), 2);
    t->lse = calloc((size_t)(total_rows(pb) * pb->hq), 4);
}

static void *device_copy(const void *host, size_t bytes) {
    void *dev;
    CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 16));
    if (host && bytes) CUDA_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    else CUDA_OK(cudaMemset(dev, 0, bytes ? bytes : 16));
    return dev;
}

/* Dense [.., rows, heads, dim] strides (varlen: the batch strides are ignored). */
static void set_dense(fa_params *p, int64_t rows_per_seq) {
    p->seqlen_q = p->seqlen_k = rows_per_seq;
    fa_set_contiguous_strides(p);
}

/* ---- single GPU over the whole sequence ------------------------------------------------------- */

typedef struct timing {
    float fwd_ms, bwd_ms;
} timing;

static timing single_gpu(const problem *pb, const tensors *in, tensors *out, int iters) {
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    size_t qb = q_elems(pb) * 2, kb = k_elems(pb) * 2, lb = (size_t)(total_rows(pb) * pb->hq) * 4;
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = pb->batch;
    p.heads_q = pb->hq;
    p.heads_kv = pb->hkv;
    p.head_dim = pb->d;
    p.causal = pb->causal;
    p.stream = stream;
    int64_t max_len = 0;
    for (int64_t b = 0; b < pb->batch; b++)
        if (seq_len(pb, b) > max_len) max_len = seq_len(pb, b);
    set_dense(&p, max_len);
    int32_t *cu_dev = NULL;
    if (pb->varlen) {
        cu_dev = device_copy(pb->cu, sizeof(int32_t) * (size_t)(pb->batch + 1));
        p.cu_seqlens_q = p.cu_seqlens_k = cu_dev;
        p.total_q = p.total_k = total_rows(pb);
    }
    p.q = device_copy(in->q, qb);
    p.k = device_copy(in->k, kb);
    p.v = device_copy(in->v, kb);
    p.dout = device_copy(in->dout, qb);
    p.o = device_copy(NULL, qb);
    p.lse = device_copy(NULL, lb);
    p.dq = device_copy(NULL, qb);
    p.dk = device_copy(NULL, kb);
    p.dv = device_copy(NULL, kb);
    size_t ws_f = 0, ws_b = 0;
    FA_OK_OR_DIE(fa_check_forward(&p, &ws_f));
    FA_OK_OR_DIE(fa_check_backward(&p, &ws_b));
    p.workspace_bytes = ws_f > ws_b ? ws_f : ws_b;
    p.workspace = p.workspace_bytes ? device_copy(NULL, p.workspace_bytes) : NULL;
    cudaEvent_t e0, e1, e2;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventCreate(&e2));
    FA_OK_OR_DIE(fa_forward(&p)); /* warm-up, and the results compared */
    FA_OK_OR_DIE(fa_backward(&p));
    CUDA_OK(cudaEventRecord(e0, stream));
    for (int i = 0; i < iters; i++) FA_OK_OR_DIE(fa_forward(&p));
    CUDA_OK(cudaEventRecord(e1, stream));
    for (int i = 0; i < iters; i++) FA_OK_OR_DIE(fa_backward(&p));
    CUDA_OK(cudaEventRecord(e2, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    timing t = {0, 0};
    if (iters) {
        CUDA_OK(cudaEventElapsedTime(&t.fwd_ms, e0, e1));
        CUDA_OK(cudaEventElapsedTime(&t.bwd_ms, e1, e2));
        t.fwd_ms /= iters;
        t.bwd_ms /= iters;
    }
    if (out) {
        CUDA_OK(cudaMemcpy(out->o, p.o, qb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(out->lse, p.lse, lb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(out->dq, p.dq, qb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(out->dk, p.dk, kb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(out->dv, p.dv, kb, cudaMemcpyDeviceToHost));
    }
    void *bufs[] = {(void *)p.q, (void *)p.k, (void *)p.v, (void *)p.dout, p.o, p.lse, p.dq, p.dk, p.dv,
                    p.workspace, cu_dev};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) CUDA_OK(cudaFree(bufs[i]));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    cudaStreamDestroy(stream);
    return t;
}

/* ---- the ring: one thread per GPU ----------------------------------------------------------- */

typedef struct rank_job {
    const problem *pb;
    const tensors *in;
    tensors *out; /* NULL: timing only */
    int rank, world, iters;
    ncclComm_t comm;
    pthread_barrier_t *barrier;
    timing t;
} rank_job;

/* Global row of local row t of sequence b on rank r, and the shard's rows per sequence. */
typedef struct shard_map {
    int64_t start[MAX_BATCH][2], length[MAX_BATCH][2];
    int64_t local_start[MAX_BATCH + 1]; /* local row of the first token of each sequence */
} shard_map;

static void make_map(const problem *pb, int world, int rank, shard_map *m) {
    m->local_start[0] = 0;
    for (int64_t b = 0; b < pb->batch; b++) {
        int count;
        FA_OK_OR_DIE(fa_ring_shard(seq_len(pb, b), world, rank, pb->sharding, m->start[b], m->length[b], &count));
        m->local_start[b + 1] = m->local_start[b] + m->length[b][0] + m->length[b][1];
    }
}

static int64_t global_row(const problem *pb, const shard_map *m, int64_t b, int64_t t) {
    int64_t pos = t < m->length[b][0] ? m->start[b][0] + t : m->start[b][1] + (t - m->length[b][0]);
    return seq_start(pb, b) + pos;
}

/* Copy rows between a global dense tensor and a local one (to_local: global -> local). */
static void move_rows(const problem *pb, const shard_map *m, void *global, void *local, size_t row_bytes,
                      int to_local) {
    for (int64_t b = 0; b < pb->batch; b++)
        for (int64_t t = 0; t < m->local_start[b + 1] - m->local_start[b]; t++) {
            char *g = (char *)global + global_row(pb, m, b, t) * row_bytes;
            char *l = (char *)local + (m->local_start[b] + t) * row_bytes;
            memcpy(to_local ? l : g, to_local ? g : l, row_bytes);
        }
}

static void *rank_main(void *arg) {
    rank_job *job = arg;
    const problem *pb = job->pb;
    CUDA_OK(cudaSetDevice(job->rank));
    cudaStream_t compute, comm_stream;
    CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    shard_map m;
    make_map(pb, job->world, job->rank, &m);
    const int64_t rows = m.local_start[pb->batch];
    const size_t qrow = (size_t)(pb->hq * pb->d) * 2, krow = (size_t)(pb->hkv * pb->d) * 2;
    uint16_t *hq_ = malloc(rows * qrow + 16), *hk = malloc(rows * krow + 16), *hv = malloc(rows * krow + 16),
             *hd = malloc(rows * qrow + 16);
    move_rows(pb, &m, job->in->q, hq_, qrow, 1);
    move_rows(pb, &m, job->in->k, hk, krow, 1);
    move_rows(pb, &m, job->in->v, hv, krow, 1);
    move_rows(pb, &m, job->in->dout, hd, qrow, 1);

    fa_ring_params r;
    memset(&r, 0, sizeof r);
    fa_params *a = &r.attn;
    a->device = FA_DEVICE_CUDA;
    a->dtype = FA_DTYPE_BF16;
    a->batch = pb->batch;
    a->heads_q = pb->hq;
    a->heads_kv = pb->hkv;
    a->head_dim = pb->d;
    a->causal = pb->causal;
    a->stream = compute;
    set_dense(a, pb->varlen ? 0 : rows / pb->batch); /* varlen: seqlens 0 = from cu_seqlens */
    a->q = device_copy(hq_, rows * qrow);
    a->k = device_copy(hk, rows * krow);
    a->v = device_copy(hv, rows * krow);
    a->dout = device_copy(hd, rows * qrow);
    a->o = device_copy(NULL, rows * qrow);
    a->lse = device_copy(NULL, (size_t)(rows * pb->hq) * 4);
    a->dq = device_copy(NULL, rows * qrow);
    a->dk = device_copy(NULL, rows * krow);
    a->dv = device_copy(NULL, rows * krow);
    r.sharding = pb->sharding;
    r.seqlen = pb->varlen ? 0 : pb->tokens;
    r.cu_seqlens = pb->varlen ? pb->cu : NULL;
    FA_OK_OR_DIE(fa_ring_comm_nccl(job->comm, comm_stream, &r.comm, &r.rank, &r.world_size));
    if (r.rank != job->rank || r.world_size != job->world) {
        fprintf(stderr, "rank %d: the NCCL communicator says rank %d of %d\n", job->rank, r.rank, r.world_size);
        exit(2);
    }
    size_t ws_f = 0, ws_b = 0;
    FA_OK_OR_DIE(fa_ring_check_forward(&r, &ws_f));
    FA_OK_OR_DIE(fa_ring_check_backward(&r, &ws_b));
    r.workspace_bytes = ws_f > ws_b ? ws_f : ws_b;
    r.workspace = device_copy(NULL, r.workspace_bytes);

    FA_OK_OR_DIE(fa_ring_forward(&r)); /* warm-up, and the results compared */
    FA_OK_OR_DIE(fa_ring_backward(&r));
    CUDA_OK(cudaStreamSynchronize(compute));
    cudaEvent_t e0, e1, e2;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventCreate(&e2));
    pthread_barrier_wait(job->barrier);
    CUDA_OK(cudaEventRecord(e0, compute));
    for (int i = 0; i < job->iters; i++) FA_OK_OR_DIE(fa_ring_forward(&r));
    CUDA_OK(cudaEventRecord(e1, compute));
    for (int i = 0; i < job->iters; i++) FA_OK_OR_DIE(fa_ring_backward(&r));
    CUDA_OK(cudaEventRecord(e2, compute));
    CUDA_OK(cudaStreamSynchronize(compute));
    if (job->iters) {
        CUDA_OK(cudaEventElapsedTime(&job->t.fwd_ms, e0, e1));
        CUDA_OK(cudaEventElapsedTime(&job->t.bwd_ms, e1, e2));
        job->t.fwd_ms /= job->iters;
        job->t.bwd_ms /= job->iters;
    }
    if (job->out) {
        CUDA_OK(cudaMemcpy(hq_, a->o, rows * qrow, cudaMemcpyDeviceToHost));
        move_rows(pb, &m, job->out->o, hq_, qrow, 0);
        CUDA_OK(cudaMemcpy(hq_, a->dq, rows * qrow, cudaMemcpyDeviceToHost));
        move_rows(pb, &m, job->out->dq, hq_, qrow, 0);
        CUDA_OK(cudaMemcpy(hk, a->dk, rows * krow, cudaMemcpyDeviceToHost));
        move_rows(pb, &m, job->out->dk, hk, krow, 0);
        CUDA_OK(cudaMemcpy(hk, a->dv, rows * krow, cudaMemcpyDeviceToHost));
        move_rows(pb, &m, job->out->dv, hk, krow, 0);
        float *lse = malloc((size_t)(rows * pb->hq) * 4 + 16);
        CUDA_OK(cudaMemcpy(lse, a->lse, (size_t)(rows * pb->hq) * 4, cudaMemcpyDeviceToHost));
        for (int64_t b = 0; b < pb->batch; b++)
            for (int64_t h = 0; h < pb->hq; h++)
                for (int64_t t = 0; t < m.local_start[b + 1] - m.local_start[b]; t++) {
                    int64_t g = global_row(pb, &m, b, t) - seq_start(pb, b);
                    int64_t gi = pb->varlen ? h * total_rows(pb) + pb->cu[b] + g : (b * pb->hq + h) * pb->tokens + g;
                    int64_t li = pb->varlen ? h * rows + m.local_start[b] + t
                                            : (b * pb->hq + h) * (rows / pb->batch) + t;
                    job->out->lse[gi] = lse[li];
                }
        free(lse);
    }
    fa_ring_comm_nccl_release(&r.comm);
    void *bufs[] = {(void *)a->q, (void *)a->k, (void *)a->v, (void *)a->dout, a->o, a->lse, a->dq, a->dk, a->dv,
                    r.workspace};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_OK(cudaFree(bufs[i]));
    free(hq_);
    free(hk);
    free(hv);
    free(hd);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    cudaStreamDestroy(compute);
    cudaStreamDestroy(comm_stream);
    return NULL;
}

static timing run_ring(const problem *pb, const tensors *in, tensors *out, ncclComm_t *comms, int world,
                       int iters) {
    pthread_t threads[MAX_GPUS];
    rank_job jobs[MAX_GPUS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)world);
    for (int r = 0; r < world; r++) {
        jobs[r] = (rank_job){pb, in, out, r, world, iters, comms[r], &barrier, {0, 0}};
        pthread_create(&threads[r], NULL, rank_main, &jobs[r]);
    }
    timing slowest = {0, 0};
    for (int r = 0; r < world; r++) {
        pthread_join(threads[r], NULL);
        if (jobs[r].t.fwd_ms > slowest.fwd_ms) slowest.fwd_ms = jobs[r].t.fwd_ms;
        if (jobs[r].t.bwd_ms > slowest.bwd_ms) slowest.bwd_ms = jobs[r].t.bwd_ms;
    }
    pthread_barrier_destroy(&barrier);
    return slowest;
}

/* ---- modes ----------------------------------------------------------------------------------- */

static int compare_bf16(const char *name, const uint16_t *ring, const uint16_t *single, size_t n) {
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        double a = from_bf16(ring[i]), b = from_bf16(single[i]);
        if (fabs(a - b) > max_diff || isnan(a - b)) max_diff = isnan(a - b) ? INFINITY : fabs(a - b);
        if (fabs(b) > max_ref) max_ref = fabs(b);
    }
    double ulp = ldexp(1.0, (int)floor(log2(max_ref + 1e-30)) - 7);
    int ok = max_diff <= 4 * ulp;
    printf("    %-4s max|ring - 1 GPU| %.3e  (max|1 GPU| %.3e, bf16 ulp there %.3e)  %s\n", name, max_diff,
           max_ref, ulp, ok ? "ok" : "FAIL");
    return ok;
}

static int check(ncclComm_t *comms, int world) {
    problem cases[] = {
        {"zigzag causal gqa, 4096 tokens", FA_RING_ZIGZAG, 1, 2, 4096, 0, {0}, 16, 4, 128},
        {"contiguous causal, 4099 tokens (uneven)", FA_RING_CONTIGUOUS, 1, 1, 4099, 0, {0}, 8, 8, 64},
        {"zigzag full, 3000 tokens", FA_RING_ZIGZAG, 0, 1, 3000, 0, {0}, 8, 2, 128},
        {"varlen zigzag causal", FA_RING_ZIGZAG, 1, 3, 0, 1, {0, 1000, 1003, 4000}, 8, 2, 128},
    };
    int ok = 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        problem *pb = &cases[c];
        printf("  %s (W = %d, bf16, hq %lld, hkv %lld, d %lld)\n", pb->name, world, (long long)pb->hq,
               (long long)pb->hkv, (long long)pb->d);
        tensors in, single, ring;
        memset(&in, 0, sizeof in);
        in.q = random_bf16(q_elems(pb), 0.0f);
        in.k = random_bf16(k_elems(pb), 0.0f);
        in.v = random_bf16(k_elems(pb), 0.5f);
        in.dout = random_bf16(q_elems(pb), 0.5f);
        alloc_outputs(pb, &single);
        alloc_outputs(pb, &ring);
        single_gpu(pb, &in, &single, 0);
        run_ring(pb, &in, &ring, comms, world, 0);
        ok &= compare_bf16("o", ring.o, single.o, q_elems(pb));
        double lse_diff = 0;
        for (int64_t i = 0; i < total_rows(pb) * pb->hq; i++)
            if (fabs(ring.lse[i] - single.lse[i]) > lse_diff) lse_diff = fabs(ring.lse[i] - single.lse[i]);
        printf("    lse  max|ring - 1 GPU| %.3e  %s\n", lse_diff, lse_diff <= 1e-3 ? "ok" : "FAIL");
        ok &= lse_diff <= 1e-3;
        ok &= compare_bf16("dq", ring.dq, single.dq, q_elems(pb));
        ok &= compare_bf16("dk", ring.dk, single.dk, k_elems(pb));
        ok &= compare_bf16("dv", ring.dv, single.dv, k_elems(pb));
        void *all[] = {in.q, in.k, in.v, in.dout, single.o, single.dq, single.dk, single.dv, single.lse,
                       ring.o, ring.dq, ring.dk, ring.dv, ring.lse};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    }
    return ok;
}

static void bench(ncclComm_t *comms, int world, const int64_t *tokens, int count) {
    printf("  one layer: batch 1, hq 32, hkv 8, d 128, bf16, causal, zig-zag; W = %d; ms per call\n", world);
    printf("  %8s %10s %10s %10s %10s %9s %11s\n", "tokens", "1 GPU fwd", "1 GPU bwd", "ring fwd", "ring bwd",
           "speed-up", "efficiency");
    for (int i = 0; i < count; i++) {
        problem pb = {"bench", FA_RING_ZIGZAG, 1, 1, tokens[i], 0, {0}, 32, 8, 128};
        tensors in;
        memset(&in, 0, sizeof in);
        in.q = random_bf16(q_elems(&pb), 0.0f);
        in.k = random_bf16(k_elems(&pb), 0.0f);
        in.v = random_bf16(k_elems(&pb), 0.5f);
        in.dout = random_bf16(q_elems(&pb), 0.5f);
        timing t1 = single_gpu(&pb, &in, NULL, 3);
        timing tw = run_ring(&pb, &in, NULL, comms, world, 3);
        double speedup = (t1.fwd_ms + t1.bwd_ms) / (tw.fwd_ms + tw.bwd_ms);
        printf("  %8lld %10.2f %10.2f %10.2f %10.2f %9.2f %10.0f%%\n", (long long)tokens[i], t1.fwd_ms, t1.bwd_ms,
               tw.fwd_ms, tw.bwd_ms, speedup, 100.0 * speedup / world);
        fflush(stdout);
        free(in.q);
        free(in.k);
        free(in.v);
        free(in.dout);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "check";
    int world = 0;
    CUDA_OK(cudaGetDeviceCount(&world));
    if (world > MAX_GPUS) world = MAX_GPUS;
    if (!fa_ring_nccl_built()) {
        fprintf(stderr, "ring_nccl_check: libflashattn was built without NCCL\n");
        return 2;
    }
    ncclComm_t comms[MAX_GPUS];
    ncclResult_t nr = ncclCommInitAll(comms, world, NULL);
    if (nr != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetErrorString(nr));
        return 2;
    }
    printf("ring_nccl_check %s: %d GPUs, flashattn %s\n", mode, world, fa_version());
    int ok = 1;
    if (strcmp(mode, "bench") == 0) {
        int64_t tokens[16] = {32768, 65536, 131072, 262144};
        int count = 4;
        if (argc > 2) {
            count = 0;
            for (int i = 2; i < argc && count < 16; i++) tokens[count++] = atoll(argv[i]);
        }
        bench(comms, world, tokens, count);
    } else {
        ok = check(comms, world);
        printf("ring_nccl_check: %s\n", ok ? "all passed" : "FAILED");
    }
    for (int r = 0; r < world; r++) ncclCommDestroy(comms[r]);
    return ok ? 0 : 1;
}
