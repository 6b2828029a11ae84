/*
 * test_ring.c: ring attention (fa_ring_forward / fa_ring_backward) without a second GPU.
 *
 *   - the sharding (fa_ring_shard): every token in exactly one chunk, chunks balanced, zig-zag
 *     pairs chunk r with 2W-1-r;
 *   - the schedule (fa_ring_plan_step): replayed token by token, with the library's mask rules
 *     for each call, every visible (query, key) pair of the sequence is computed exactly once
 *     and no invisible one ever; zig-zag gives every rank the same causal work;
 *   - the whole ring on the CPU: W = 1..4 ranks as threads of this process, connected by an
 *     in-process transport (a mailbox per rank) that completes exchanges only in wait(), copying
 *     the send buffer only then, so reading a receive buffer early or reusing a send buffer too
 *     soon shows up as a wrong result. Outputs and gradients are gathered into the global layout
 *     and compared with the float64 oracle under the suite's rule (≤ 2 × the error of plain
 *     attention in the dtype + floor): causal and not, both shardings, odd lengths (shards of
 *     unequal size, empty ones), GQA / MQA, head_dim_v, softcap, sinks, f32 / f16 / bf16,
 *     varlen (empty sequences, sequences shorter than the ring), strided shards;
 *   - the same on one GPU when there is one (ranks as threads sharing it; skipped otherwise);
 *   - bad input: a clear error and nothing written.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ring/fa_ring.h"
#include "test_util.h"

#define MAX_WORLD 8

/* ---- sharding ------------------------------------------------------------------------------- */

FA_TEST(ring_shard) {
    static const int64_t lengths[] = {0, 1, 2, 5, 7, 37, 113, 203, 1024};
    for (int sh = 0; sh < 2; sh++)
        for (int world = 1; world <= 6; world++)
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                int64_t L = lengths[li];
                int64_t chunks = sh ? 2 * world : world;
                unsigned char *seen = calloc((size_t)L + 1, 1);
                int64_t min_len = L, max_len = 0, covered = 0;
                int ok = 1;
                for (int r = 0; r < world; r++) {
                    int64_t start[2], length[2];
                    int count = 0;
                    fa_status st = fa_ring_shard(L, world, r, (fa_ring_sharding)sh, start, length, &count);
                    ok &= FA_CHECK(st == FA_OK && count == (sh ? 2 : 1), "shard(L=%lld, W=%d, r=%d): %s",
                                   (long long)L, world, r, fa_last_error());
                    for (int c = 0; c < count; c++) {
                        int64_t id = c == 0 ? r : chunks - 1 - r;
                        ok &= start[c] == id * (L / chunks) + (id < L % chunks ? id : L % chunks);
                        if (length[c] < min_len) min_len = length[c];
                        if (length[c] > max_len) max_len = length[c];
                        for (int64_t t = start[c]; t < start[c] + length[c]; t++) {
                            ok &= t >= 0 && t < L && !seen[t];
                            if (t >= 0 && t < L) seen[t] = 1;
                            covered++;
                        }
                    }
                }
                FA_CHECK(ok && covered == L && max_len - min_len <= 1,
                         "%s W=%d L=%lld: covered %lld tokens, chunk sizes %lld..%lld",
                         sh ? "zigzag" : "contiguous", world, (long long)L, (long long)covered,
                         (long long)min_len, (long long)max_len);
                free(seen);
            }
    int64_t start[2], length[2];
    int count;
    FA_CHECK(fa_ring_shard(10, 0, 0, FA_RING_ZIGZAG, start, length, &count) == FA_ERR_INVALID_SIZE,
             "world_size 0 accepted");
    FA_CHECK(fa_ring_shard(10, 2, 2, FA_RING_ZIGZAG, start, length, &count) == FA_ERR_INVALID_ARGUMENT,
             "rank 2 of 2 accepted");
    FA_CHECK(fa_ring_shard(10, 2, 0, (fa_ring_sharding)7, start, length, &count) == FA_ERR_INVALID_ARGUMENT,
             "sharding 7 accepted");
    FA_CHECK(fa_ring_shard(-1, 2, 0, FA_RING_CONTIGUOUS, start, length, &count) == FA_ERR_INVALID_SIZE,
             "seqlen -1 accepted");
}

/* ---- schedule ------------------------------------------------------------------------------- */

/* Global token positions of rank r's shard part (fa_ring_part) in order; returns the count. */
static int64_t part_positions(int64_t L, int world, int r, fa_ring_sharding sh, int part, int64_t *pos) {
    int64_t start[2], length[2];
    int count;
    fa_ring_shard(L, world, r, sh, start, length, &count);
    int64_t n = 0;
    for (int c = 0; c < count; c++) {
        if ((part == FA_RING_PART_FIRST && c != 0) || (part == FA_RING_PART_SECOND && c != 1)) continue;
        for (int64_t t = 0; t < length[c]; t++) pos[n++] = start[c] + t;
    }
    return n;
}

/* Replays every step of every rank on one sequence of L tokens: the call sees the query part and
 * key part as sequences of lengths sq, sk (in shard order), masked by the library's rule
 * (causal: key j visible to query i iff j <= i + sk - sq). Counts how often each global pair
 * is computed; returns 1 if exactly the visible pairs are, once each. work[r] += pairs rank r
 * computes (mask applied). */
static int replay_schedule(int64_t L, int world, fa_ring_sharding sh, int causal, int64_t *work) {
    int64_t *qpos = malloc(sizeof(int64_t) * (size_t)(L + 1)), *kpos = malloc(sizeof(int64_t) * (size_t)(L + 1));
    unsigned char *count = calloc((size_t)(L * L + 1), 1);
    int ok = qpos && kpos && count;
    for (int r = 0; ok && r < world; r++) {
        work[r] = 0;
        for (int s = 0; s < world; s++) {
            fa_ring_step st = fa_ring_plan_step(r, world, s, sh, causal);
            ok &= st.owner == ((r - s) % world + world) % world;
            if (st.block == FA_RING_SKIP) continue;
            int64_t sq = part_positions(L, world, r, sh, st.q_part, qpos);
            int64_t sk = part_positions(L, world, st.owner, sh, st.k_part, kpos);
            for (int64_t i = 0; i < sq; i++)
                for (int64_t j = 0; j < sk; j++) {
                    if (st.block == FA_RING_CAUSAL && j > i + sk - sq) continue;
                    count[qpos[i] * L + kpos[j]]++;
                    work[r]++;
                }
        }
    }
    for (int64_t i = 0; ok && i < L; i++)
        for (int64_t j = 0; j < L; j++) ok &= count[i * L + j] == ((!causal || j <= i) ? 1 : 0);
    free(qpos);
    free(kpos);
    free(count);
    return ok;
}

FA_TEST(ring_schedule) {
    static const int64_t lengths[] = {1, 3, 8, 37, 64};
    for (int sh = 0; sh < 2; sh++)
        for (int causal = 0; causal < 2; causal++)
            for (int world = 1; world <= 6; world++)
                for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                    int64_t work[MAX_WORLD];
                    FA_CHECK(replay_schedule(lengths[li], world, (fa_ring_sharding)sh, causal, work),
                             "%s %s W=%d L=%lld: some (query, key) pair is computed twice, never, or "
                             "though masked",
                             sh ? "zigzag" : "contiguous", causal ? "causal" : "full", world,
                             (long long)lengths[li]);
                }
    /* load balance: with L a multiple of 2W, zig-zag gives every rank the same causal work;
     * contiguous gives the last rank about 2W - 1 times the first's */
    for (int world = 2; world <= 6; world++) {
        int64_t L = 2 * world * 5, zz[MAX_WORLD], ct[MAX_WORLD];
        replay_schedule(L, world, FA_RING_ZIGZAG, 1, zz);
        replay_schedule(L, world, FA_RING_CONTIGUOUS, 1, ct);
        int even = 1;
        for (int r = 1; r < world; r++) even &= zz[r] == zz[0];
        FA_CHECK(even, "zigzag W=%d L=%lld: causal work differs across ranks (rank 0: %lld, rank W-1: %lld)",
                 world, (long long)L, (long long)zz[0], (long long)zz[world - 1]);
        FA_CHECK(ct[world - 1] > ct[0], "contiguous W=%d: the last rank should carry more causal work", world);
        if (world == 4)
            fa_test_note("causal work per rank, W = 4, L = 40: zig-zag %lld each; contiguous %lld .. %lld",
                         (long long)zz[0], (long long)ct[0], (long long)ct[world - 1]);
    }
    /* the step table itself, W = 4, rank 1 */
    fa_ring_step st = fa_ring_plan_step(1, 4, 0, FA_RING_ZIGZAG, 1);
    FA_CHECK(st.owner == 1 && st.block == FA_RING_CAUSAL && st.q_part == FA_RING_PART_ALL &&
                 st.k_part == FA_RING_PART_ALL, "zigzag own step");
    st = fa_ring_plan_step(1, 4, 1, FA_RING_ZIGZAG, 1);
    FA_CHECK(st.owner == 0 && st.block == FA_RING_FULL && st.q_part == FA_RING_PART_ALL &&
                 st.k_part == FA_RING_PART_FIRST, "zigzag earlier owner: all queries × first key chunk");
    st = fa_ring_plan_step(1, 4, 2, FA_RING_ZIGZAG, 1);
    FA_CHECK(st.owner == 3 && st.block == FA_RING_FULL && st.q_part == FA_RING_PART_SECOND &&
                 st.k_part == FA_RING_PART_ALL, "zigzag later owner: second query chunk × all keys");
    st = fa_ring_plan_step(1, 4, 2, FA_RING_CONTIGUOUS, 1);
    FA_CHECK(st.owner == 3 && st.block == FA_RING_SKIP, "contiguous later owner skipped");
}

/* ---- in-process transport ------------------------------------------------------------------- */

/* Device memory access for the transport and the test: host memcpy, or the CUDA runtime. */
typedef struct test_cudart {
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*device_synchronize)(void);
    const char *(*get_error_string)(int);
} test_cudart;

enum { CUDA_H2D = 1, CUDA_D2H = 2 };

static const test_cudart *load_cudart(void) {
    static test_cudart api;
    static int state; /* 0 untried, 1 ok, -1 absent */
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
    if (state == 0) {
        state = -1;
        for (size_t i = 0; i < sizeof names / sizeof names[0] && state < 0; i++) {
            void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
            if (!h) continue;
            void *f[5] = {dlsym(h, "cudaMalloc"), dlsym(h, "cudaFree"), dlsym(h, "cudaMemcpy"),
                          dlsym(h, "cudaDeviceSynchronize"), dlsym(h, "cudaGetErrorString")};
            if (!f[0] || !f[1] || !f[2] || !f[3] || !f[4]) continue;
            memcpy(&api.malloc_, &f[0], sizeof f[0]);
            memcpy(&api.free_, &f[1], sizeof f[1]);
            memcpy(&api.memcpy_, &f[2], sizeof f[2]);
            memcpy(&api.device_synchronize, &f[3], sizeof f[3]);
            memcpy(&api.get_error_string, &f[4], sizeof f[4]);
            state = 1;
        }
    }
    return state == 1 ? &api : NULL;
}

typedef struct message {
    struct message *next;
    size_t bytes;
    unsigned char data[];
} message;

typedef struct mailbox {
    pthread_mutex_t mutex;
    pthread_cond_t arrived;
    message *head, *tail;
} mailbox;

typedef struct local_ring {
    int world;
    const test_cudart *cuda; /* NULL: buffers are host memory */
    mailbox box[MAX_WORLD];
} local_ring;

typedef struct pending_exchange {
    const void *send;
    void *recv;
    size_t bytes;
} pending_exchange;

typedef struct endpoint {
    local_ring *ring;
    int rank;
    pending_exchange queue[8];
    int queued;
    int exchanges; /* posted so far                                                           */
} endpoint;

static fa_status local_send_recv(void *user, const void *send_buf, void *recv_buf, size_t bytes, void *stream) {
    (void)stream;
    endpoint *e = user;
    if (e->queued == (int)(sizeof e->queue / sizeof e->queue[0])) return FA_ERR_INVALID_ARGUMENT;
    e->queue[e->queued].send = send_buf;
    e->queue[e->queued].recv = recv_buf;
    e->queue[e->queued].bytes = bytes;
    e->queued++;
    e->exchanges++;
    return FA_OK;
}

/* Sends are read and receives written here only (the strictest behaviour the contract allows). */
static fa_status local_wait(void *user, void *stream) {
    (void)stream;
    endpoint *e = user;
    local_ring *ring = e->ring;
    mailbox *out = &ring->box[(e->rank + 1) % ring->world], *in = &ring->box[e->rank];
    fa_status status = FA_OK;
    for (int i = 0; i < e->queued; i++) {
        message *m = malloc(sizeof *m + e->queue[i].bytes);
        if (!m) return FA_ERR_ALLOC;
        m->next = NULL;
        m->bytes = e->queue[i].bytes;
        if (ring->cuda) ring->cuda->memcpy_(m->data, e->queue[i].send, m->bytes, CUDA_D2H);
        else memcpy(m->data, e->queue[i].send, m->bytes);
        pthread_mutex_lock(&out->mutex);
        if (out->tail) out->tail->next = m;
        else out->head = m;
        out->tail = m;
        pthread_cond_broadcast(&out->arrived);
        pthread_mutex_unlock(&out->mutex);
    }
    for (int i = 0; i < e->queued; i++) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 60; /* a rank that never sends (a bug) fails the test, not hangs it */
        pthread_mutex_lock(&in->mutex);
        int rc = 0;
        while (!in->head && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&in->arrived, &in->mutex, &deadline);
        message *m = in->head;
        if (m) {
            in->head = m->next;
            if (!in->head) in->tail = NULL;
        }
        pthread_mutex_unlock(&in->mutex);
        if (!m) return FA_ERR_INVALID_ARGUMENT;
        if (m->bytes != e->queue[i].bytes) status = FA_ERR_INVALID_SIZE;
        else if (ring->cuda) ring->cuda->memcpy_(e->queue[i].recv, m->data, m->bytes, CUDA_H2D);
        else memcpy(e->queue[i].recv, m->data, m->bytes);
        free(m);
    }
    e->queued = 0;
    return status;
}

static void local_ring_init(local_ring *ring, int world, const test_cudart *cuda) {
    memset(ring, 0, sizeof *ring);
    ring->world = world;
    ring->cuda = cuda;
    for (int r = 0; r < world; r++) {
        pthread_mutex_init(&ring->box[r].mutex, NULL);
        pthread_cond_init(&ring->box[r].arrived, NULL);
    }
}

/* Leftover messages mean the ranks disagreed on the exchanges; returns their count. */
static int local_ring_destroy(local_ring *ring) {
    int leftover = 0;
    for (int r = 0; r < ring->world; r++) {
        while (ring->box[r].head) {
            message *m = ring->box[r].head;
            ring->box[r].head = m->next;
            free(m);
            leftover++;
        }
        pthread_mutex_destroy(&ring->box[r].mutex);
        pthread_cond_destroy(&ring->box[r].arrived);
    }
    return leftover;
}

/* ---- one case: shard, run the ring, gather, compare ----------------------------------------- */

typedef struct ring_case {
    fa_dtype dtype;
    int world;
    fa_ring_sharding sharding;
    int causal;
    int64_t batch, seqlen, heads_q, heads_kv, head_dim, head_dim_v;
    const int32_t *lens; /* varlen: [batch] sequence lengths                                      */
    float softcap;
    int sinks;
    int padded;          /* strided shards (padding after heads, rows, sequences)                */
    int extra_rows;      /* varlen: total_q / total_k larger than the shard's rows                */
    int workspace;       /* pass a caller-allocated ring workspace                               */
    fa_device device;
} ring_case;

enum { T_Q, T_K, T_V, T_DO, T_O, T_DQ, T_DK, T_DV, T_STRIDED, T_LSE = T_STRIDED, T_SINK, T_DSINK, T_WS, T_COUNT };

typedef struct shard_tensor {
    void *host, *device;
    size_t bytes;
    int64_t batch_stride, row_stride, head_stride; /* strided tensors                          */
} shard_tensor;

typedef struct rank_state {
    int64_t n;                     /* batched: tokens per sequence; varlen: packed rows         */
    int64_t rows_alloc;            /* rows per sequence (batched) or packed rows in the tensors */
    int32_t cu[FA_TEST_MAX_BATCH + 1];
    int64_t start[FA_TEST_MAX_BATCH][2], length[FA_TEST_MAX_BATCH][2];
    shard_tensor t[T_COUNT];
    fa_ring_params params;
    endpoint ep;
    int backward;
    fa_status status;
    char error[512];
} rank_state;

static void *rank_main(void *arg) {
    rank_state *rs = arg;
    rs->status = rs->backward ? fa_ring_backward(&rs->params) : fa_ring_forward(&rs->params);
    if (rs->status != FA_OK) snprintf(rs->error, sizeof rs->error, "%s", fa_last_error());
    return NULL;
}

/* Run every rank in its own thread; 1 if all returned FA_OK. */
static int run_ring(rank_state *ranks, int world, int backward, const char *label) {
    pthread_t threads[MAX_WORLD];
    for (int r = 0; r < world; r++) {
        ranks[r].backward = backward;
        ranks[r].ep.queued = 0;
        pthread_create(&threads[r], NULL, rank_main, &ranks[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(threads[r], NULL);
    int ok = 1;
    for (int r = 0; r < world; r++)
        ok &= FA_CHECK(ranks[r].status == FA_OK, "%s: rank %d %s: %s", label, r,
                       backward ? "fa_ring_backward" : "fa_ring_forward", ranks[r].error);
    return ok;
}

/* Element offsets of (sequence b, token t, head h) in the global tensor / a rank's shard. */
static int64_t global_offset(const fa_test_problem *tp, int64_t bs, int64_t rs, int64_t hs, int64_t b,
                             int64_t t, int64_t h) {
    if (tp->spec.varlen) return (tp->params.cu_seqlens_q[b] + t) * rs + h * hs;
    return b * bs + t * rs + h * hs;
}

static int64_t shard_offset(const rank_state *rs, int varlen, const shard_tensor *st, int64_t b, int64_t t,
                            int64_t h) {
    if (varlen) return (rs->cu[b] + t) * st->row_stride + h * st->head_stride;
    return b * st->batch_stride + t * st->row_stride + h * st->head_stride;
}

/* Global token of local token t of sequence b. */
static int64_t global_token(const rank_state *rs, int64_t b, int64_t t) {
    return t < rs->length[b][0] ? rs->start[b][0] + t : rs->start[b][1] + (t - rs->length[b][0]);
}

typedef struct tensor_map {
    int shard;        /* T_* */
    int global;       /* FA_T_* */
    int64_t heads, dim;
} tensor_map;

/* Copy between the global tensor of tp and rank rs's shard (to_shard: global -> shard). */
static void move_tensor(fa_test_problem *tp, rank_state *rs, const tensor_map *m, int to_shard) {
    const fa_params *g = &tp->params;
    const void *gptr[] = {g->q, g->k, g->v, g->dout, g->o, g->dq, g->dk, g->dv};
    const int64_t gstr[][3] = {
        {g->q_batch_stride, g->q_row_stride, g->q_head_stride},     {g->k_batch_stride, g->k_row_stride, g->k_head_stride},
        {g->v_batch_stride, g->v_row_stride, g->v_head_stride},     {g->do_batch_stride, g->do_row_stride, g->do_head_stride},
        {g->o_batch_stride, g->o_row_stride, g->o_head_stride},     {g->dq_batch_stride, g->dq_row_stride, g->dq_head_stride},
        {g->dk_batch_stride, g->dk_row_stride, g->dk_head_stride},  {g->dv_batch_stride, g->dv_row_stride, g->dv_head_stride}};
    shard_tensor *st = &rs->t[m->shard];
    const int varlen = tp->spec.varlen;
    for (int64_t b = 0; b < tp->spec.batch; b++) {
        int64_t tokens = rs->length[b][0] + rs->length[b][1];
        for (int64_t t = 0; t < tokens; t++)
            for (int64_t h = 0; h < m->heads; h++) {
                int64_t go = global_offset(tp, gstr[m->shard][0], gstr[m->shard][1], gstr[m->shard][2], b,
                                           global_token(rs, b, t), h);
                int64_t so = shard_offset(rs, varlen, st, b, t, h);
                for (int64_t e = 0; e < m->dim; e++) {
                    if (to_shard)
                        fa_test_store(st->host, tp->spec.dtype, so + e,
                                      fa_test_load(gptr[m->shard], tp->spec.dtype, go + e));
                    else
                        fa_test_store((void *)gptr[m->shard], tp->spec.dtype, go + e,
                                      fa_test_load(st->host, tp->spec.dtype, so + e));
                }
            }
    }
}

/* lse of the shard -> global lse. */
static void gather_lse(fa_test_problem *tp, rank_state *rs) {
    const fa_test_spec *s = &tp->spec;
    float *glse = tp->params.lse, *lse = rs->t[T_LSE].host;
    int64_t total = rs->params.attn.total_q ? rs->params.attn.total_q : rs->n;
    for (int64_t b = 0; b < s->batch; b++) {
        int64_t tokens = rs->length[b][0] + rs->length[b][1];
        for (int64_t h = 0; h < s->heads_q; h++)
            for (int64_t t = 0; t < tokens; t++) {
                int64_t gt = global_token(rs, b, t);
                int64_t gi = s->varlen ? h * tp->params.total_q + tp->params.cu_seqlens_q[b] + gt
                                       : (b * s->heads_q + h) * s->seqlen_q + gt;
                int64_t li = s->varlen ? h * total + rs->cu[b] + t : (b * s->heads_q + h) * rs->n + t;
                glse[gi] = lse[li];
            }
    }
}

static int alloc_shard_tensor(shard_tensor *st, size_t bytes, const test_cudart *cuda) {
    st->bytes = bytes ? bytes : 16;
    st->host = malloc(st->bytes);
    if (!st->host) return -1;
    memset(st->host, 0xff, st->bytes); /* NaN in every dtype: an unwritten output shows */
    if (cuda && cuda->malloc_(&st->device, st->bytes) != 0) return -1;
    return 0;
}

static void sync_tensor(shard_tensor *st, const test_cudart *cuda, int to_device) {
    if (!cuda) return;
    if (to_device) cuda->memcpy_(st->device, st->host, st->bytes, CUDA_H2D);
    else cuda->memcpy_(st->host, st->device, st->bytes, CUDA_D2H);
}

static void describe_case(const ring_case *c, char *buf, size_t size) {
    snprintf(buf, size, "%s %s W=%d %s%s b=%lld L=%lld hq=%lld hkv=%lld d=%lld dv=%lld%s%s%s%s%s",
             c->device == FA_DEVICE_CUDA ? "cuda" : "cpu", fa_test_dtype_name(c->dtype), c->world,
             c->sharding == FA_RING_ZIGZAG ? "zigzag" : "contiguous", c->causal ? " causal" : "",
             (long long)c->batch, (long long)c->seqlen, (long long)c->heads_q, (long long)c->heads_kv,
             (long long)c->head_dim, (long long)(c->head_dim_v ? c->head_dim_v : c->head_dim),
             c->lens ? " varlen" : "", c->softcap > 0 ? " softcap" : "", c->sinks ? " sinks" : "",
             c->padded ? " strided" : "", c->workspace ? " workspace" : "");
}

static void check_output(const char *label, const char *name, const fa_test_check *c) {
    FA_CHECK(c->ok, "%s %s: err %.3e > tol %.3e (baseline %.3e, floor %.1e, max|ref| %.3e) unwritten %lld "
             "nonfinite %lld", label, name, c->err, c->tol, c->base_err, c->floor, c->ref_max,
             (long long)c->unwritten, (long long)c->nonfinite);
}

/* Rank r's shards of tp (q, k, v, dout copied in; every tensor allocated, strided as the case
 * asks) and its fa_ring_params on the local ring; 0 when out of memory. */
static int setup_rank(const ring_case *c, fa_test_problem *tp, rank_state *rs, int r, local_ring *ring,
                      const tensor_map *maps, const test_cudart *cuda, const char *label) {
    const fa_test_spec *s = &tp->spec;
    const int varlen = s->varlen, world = c->world;
    const int64_t hq = s->heads_q, hkv = s->heads_kv, d = s->head_dim, dv = s->head_dim_v;
    const size_t es = fa_test_dtype_size(s->dtype);
    int ok = 1;
    memset(rs, 0, sizeof *rs);
    rs->cu[0] = 0;
    int64_t max_tokens = 0;
    for (int64_t b = 0; b < s->batch; b++) {
        int64_t L = varlen ? s->lens_q[b] : s->seqlen_q;
        int count;
        fa_ring_shard(L, world, r, c->sharding, rs->start[b], rs->length[b], &count);
        int64_t tokens = rs->length[b][0] + rs->length[b][1];
        rs->cu[b + 1] = rs->cu[b] + (int32_t)tokens;
        if (tokens > max_tokens) max_tokens = tokens;
    }
    rs->n = varlen ? rs->cu[s->batch] : max_tokens;
    rs->rows_alloc = rs->n + (varlen && c->extra_rows ? 2 : 0);
    int64_t blocks = varlen ? 1 : s->batch;
    for (int i = 0; i < T_STRIDED && ok; i++) {
        shard_tensor *st = &rs->t[i];
        int64_t dim = maps[i].dim, heads = maps[i].heads;
        st->head_stride = dim + (c->padded ? 3 : 0);
        st->row_stride = heads * st->head_stride + (c->padded ? 5 : 0);
        st->batch_stride = varlen ? 0 : rs->rows_alloc * st->row_stride + (c->padded ? 7 : 0);
        int64_t elements = varlen ? rs->rows_alloc * st->row_stride : blocks * st->batch_stride;
        ok &= FA_CHECK(alloc_shard_tensor(st, (size_t)elements * es, cuda) == 0, "%s: out of memory", label);
    }
    size_t lse_bytes = sizeof(float) * (size_t)(hq * (varlen ? rs->rows_alloc : s->batch * rs->n));
    ok &= FA_CHECK(alloc_shard_tensor(&rs->t[T_LSE], lse_bytes, cuda) == 0 &&
                       alloc_shard_tensor(&rs->t[T_SINK], sizeof(float) * (size_t)hq, cuda) == 0 &&
                       alloc_shard_tensor(&rs->t[T_DSINK], sizeof(float) * (size_t)hq, cuda) == 0,
                   "%s: out of memory", label);
    if (!ok) return 0;
    for (int i = 0; i < 4; i++) move_tensor(tp, rs, &maps[i], 1); /* q, k, v, dout */
    if (c->sinks) memcpy(rs->t[T_SINK].host, tp->params.sink_logits, sizeof(float) * (size_t)hq);
    for (int i = 0; i < T_COUNT; i++)
        if (rs->t[i].host && i != T_WS) sync_tensor(&rs->t[i], cuda, 1);

    fa_ring_params *p = &rs->params;
    fa_params *a = &p->attn;
    a->device = c->device;
    a->dtype = s->dtype;
    a->batch = s->batch;
    a->heads_q = hq;
    a->heads_kv = hkv;
    a->head_dim = d;
    a->head_dim_v = dv;
    a->causal = c->causal;
    a->softcap = c->softcap;
    a->num_threads = 1;
    if (varlen) {
        a->total_q = a->total_k = c->extra_rows ? rs->rows_alloc : 0;
    } else {
        a->seqlen_q = a->seqlen_k = r % 2 ? rs->n : 0; /* 0 = from the sharding */
    }
#define BIND(pointer, prefix, index)                                                              \
do {                                                                                          \
    shard_tensor *st_ = &rs->t[index];                                                        \
    a->pointer = cuda ? st_->device : st_->host;                                              \
    a->prefix##_batch_stride = st_->batch_stride;                                             \
    a->prefix##_row_stride = st_->row_stride;                                                 \
    a->prefix##_head_stride = st_->head_stride;                                               \
} while (0)
    BIND(q, q, T_Q);
    BIND(k, k, T_K);
    BIND(v, v, T_V);
    BIND(o, o, T_O);
    BIND(dout, do, T_DO);
    BIND(dq, dq, T_DQ);
    BIND(dk, dk, T_DK);
    BIND(dv, dv, T_DV);
#undef BIND
    a->lse = cuda ? rs->t[T_LSE].device : rs->t[T_LSE].host;
    if (c->sinks) {
        a->sink_logits = cuda ? rs->t[T_SINK].device : rs->t[T_SINK].host;
        a->dsink = cuda ? rs->t[T_DSINK].device : rs->t[T_DSINK].host;
    }
    p->rank = r;
    p->world_size = world;
    p->sharding = c->sharding;
    p->seqlen = varlen ? 0 : s->seqlen_q;
    p->cu_seqlens = varlen ? tp->params.cu_seqlens_q : NULL;
    rs->ep.ring = ring;
    rs->ep.rank = r;
    p->comm.send_recv = local_send_recv;
    p->comm.wait = local_wait;
    p->comm.user = &rs->ep;
    return ok;
}

/* A caller-owned workspace per rank, big enough for both passes; 0 on failure. */
static int alloc_workspaces(rank_state *ranks, int world, const test_cudart *cuda, const char *label) {
    int ok = 1;
    for (int r = 0; r < world && ok; r++) {
        size_t fwd_ws = 0, bwd_ws = 0;
        ok &= FA_CHECK(fa_ring_check_forward(&ranks[r].params, &fwd_ws) == FA_OK &&
                           fa_ring_check_backward(&ranks[r].params, &bwd_ws) == FA_OK,
                       "%s: check: %s", label, fa_last_error());
        size_t bytes = fwd_ws > bwd_ws ? fwd_ws : bwd_ws;
        ok &= FA_CHECK(alloc_shard_tensor(&ranks[r].t[T_WS], bytes, cuda) == 0, "%s: out of memory", label);
        sync_tensor(&ranks[r].t[T_WS], cuda, 1);
        ranks[r].params.workspace = cuda ? ranks[r].t[T_WS].device : ranks[r].t[T_WS].host;
        ranks[r].params.workspace_bytes = bytes;
    }
    return ok;
}

/* The backward on the ring's own o and lse: gather dq, dk, dv (and dsink, summed over ranks)
 * into tp's global outputs and compare; 1 when every check passed. */
static int check_ring_backward(const ring_case *c, fa_test_problem *tp, rank_state *ranks, const tensor_map *maps,
                               const test_cudart *cuda, const fa_ref_outputs *ref64, const fa_ref_outputs *base,
                               const char *label) {
    const int world = c->world;
    const int64_t hq = tp->spec.heads_q;
    int ok = 1;
    for (int r = 0; r < world; r++) ranks[r].ep.exchanges = 0;
    if (!run_ring(ranks, world, 1, label)) return 0;
    int64_t exchanges_bwd = 0;
    float *gdsink = tp->params.dsink;
    if (c->sinks)
        for (int64_t h = 0; h < hq; h++) gdsink[h] = 0.0f;
    for (int r = 0; r < world; r++) {
        for (int i = 5; i < 8; i++) { /* dq, dk, dv */
            sync_tensor(&ranks[r].t[maps[i].shard], cuda, 0);
            move_tensor(tp, &ranks[r], &maps[i], 0);
        }
        if (c->sinks) {
            sync_tensor(&ranks[r].t[T_DSINK], cuda, 0);
            const float *part = ranks[r].t[T_DSINK].host;
            for (int64_t h = 0; h < hq; h++) gdsink[h] += part[h]; /* dsink sums over ranks */
        }
        exchanges_bwd += ranks[r].ep.exchanges;
    }
    /* per rank: W-1 K/V hops, W-1 dK/dV hops behind them and one that takes dK/dV home */
    FA_CHECK(exchanges_bwd == (world > 1 ? (int64_t)world * (2 * world - 1) : 0),
             "%s: backward made %lld exchanges, expected W(2W-1)", label, (long long)exchanges_bwd);
    static const int grads[] = {FA_T_DQ, FA_T_DK, FA_T_DV};
    static const char *const names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        fa_test_check cg = fa_test_compare(tp, grads[i], ref64, base);
        check_output(label, names[i], &cg);
        ok &= cg.ok;
    }
    if (c->sinks) {
        fa_test_check cs = fa_test_compare(tp, FA_T_DSINK, ref64, base);
        check_output(label, "dsink", &cs);
        ok &= cs.ok;
    }
    return ok;
}

/* The whole case; returns 1 when every check passed. */
static int expect_ring(const ring_case *c) {
    char label[256];
    describe_case(c, label, sizeof label);
    const test_cudart *cuda = NULL;
    if (c->device == FA_DEVICE_CUDA) {
        cuda = load_cudart();
        if (!cuda || !fa_cuda_available()) {
            fa_test_skip("no usable CUDA GPU");
            return 1;
        }
    }
    fa_test_spec spec = fa_test_base_spec(c->dtype, c->batch, c->seqlen, c->seqlen, c->heads_q, c->heads_kv,
                                          c->head_dim);
    spec.head_dim_v = c->head_dim_v ? c->head_dim_v : c->head_dim;
    spec.causal = c->causal;
    spec.softcap = c->softcap;
    spec.sinks = c->sinks;
    spec.layout = FA_TEST_LAYOUT_CONTIGUOUS;
    spec.backward = 1;
    if (c->lens) {
        spec.varlen = 1;
        spec.lens_q = spec.lens_k = c->lens;
    }
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "%s: problem could not be created", label)) return 0;
    const fa_test_spec *s = &tp.spec;
    const int world = c->world;
    const int64_t hq = s->heads_q, hkv = s->heads_kv, d = s->head_dim, dv = s->head_dim_v;
    int ok = 1;

    /* float64 oracle and the dtype baseline on the whole (unsharded) problem */
    fa_ref_gathered g;
    fa_ref_outputs ref64, base;
    memset(&ref64, 0, sizeof ref64);
    memset(&base, 0, sizeof base);
    if (!FA_CHECK(fa_ref_gather(&tp.params, &g) == 0 && fa_ref_outputs_alloc(&g.rp, 1, &ref64) == 0 &&
                      fa_ref_outputs_alloc(&g.rp, 1, &base) == 0, "%s: oracle out of memory", label)) {
        fa_test_problem_destroy(&tp);
        return 0;
    }
    fa_ref64_run(&g.rp, 1, &ref64);
    fa_ref_baseline_run(&g.rp, s->dtype, 1, &base);

    /* shards */
    static rank_state ranks[MAX_WORLD];
    local_ring ring;
    local_ring_init(&ring, world, cuda);
    const tensor_map maps[T_STRIDED] = {{T_Q, FA_T_Q, hq, d},   {T_K, FA_T_K, hkv, d},  {T_V, FA_T_V, hkv, dv},
                                        {T_DO, FA_T_DO, hq, dv}, {T_O, FA_T_O, hq, dv},  {T_DQ, FA_T_DQ, hq, d},
                                        {T_DK, FA_T_DK, hkv, d}, {T_DV, FA_T_DV, hkv, dv}};
    for (int r = 0; r < world && ok; r++) ok &= setup_rank(c, &tp, &ranks[r], r, &ring, maps, cuda, label);

    /* forward, then gather o and lse into tp's (poisoned) global outputs and compare */
    if (ok && c->workspace) ok &= alloc_workspaces(ranks, world, cuda, label);
    int64_t exchanges_fwd = 0;
    if (ok && run_ring(ranks, world, 0, label)) {
        for (int r = 0; r < world; r++) {
            sync_tensor(&ranks[r].t[T_O], cuda, 0);
            sync_tensor(&ranks[r].t[T_LSE], cuda, 0);
            move_tensor(&tp, &ranks[r], &maps[4], 0);
            gather_lse(&tp, &ranks[r]);
            exchanges_fwd += ranks[r].ep.exchanges;
        }
        FA_CHECK(exchanges_fwd == (int64_t)world * (world - 1), "%s: forward made %lld exchanges, expected W(W-1)",
                 label, (long long)exchanges_fwd);
        fa_test_check co = fa_test_compare(&tp, FA_T_O, &ref64, &base);
        fa_test_check cl = fa_test_compare(&tp, FA_T_LSE, &ref64, &base);
        check_output(label, "o", &co);
        check_output(label, "lse", &cl);
        ok &= co.ok && cl.ok;

        /* backward on the ring's own o and lse */
        ok &= check_ring_backward(c, &tp, ranks, maps, cuda, &ref64, &base, label);
    } else {
        ok = 0;
    }
    FA_CHECK(local_ring_destroy(&ring) == 0, "%s: messages left in the mailboxes", label);
    for (int r = 0; r < world; r++)
        for (int i = 0; i < T_COUNT; i++) {
            free(ranks[r].t[i].host);
            if (cuda && ranks[r].t[i].device) cuda->free_(ranks[r].t[i].device);
        }
    fa_ref_outputs_free(&ref64);
    fa_ref_outputs_free(&base);
    fa_ref_gathered_free(&g);
    fa_test_problem_destroy(&tp);
    return ok;
}

static ring_case base_case(fa_dtype dtype, int world, fa_ring_sharding sharding, int causal, int64_t batch,
                           int64_t seqlen, int64_t hq, int64_t hkv, int64_t d) {
    ring_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.world = world;
    c.sharding = sharding;
    c.causal = causal;
    c.batch = batch;
    c.seqlen = seqlen;
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.head_dim = d;
    c.device = FA_DEVICE_CPU;
    return c;
}

/* W = 1..4, both shardings, causal and not; odd lengths so shards differ in size, GQA. */
FA_TEST(ring_batched) {
    int small = fa_test_get_level() == FA_LEVEL_SMALL;
    for (int world = 1; world <= 4; world++)
        for (int sh = 0; sh < 2; sh++)
            for (int causal = 0; causal < 2; causal++) {
                if (small && (world + sh + causal) % 2) continue;
                fa_dtype dtype = (world + causal) % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32;
                ring_case c = base_case(dtype, world, (fa_ring_sharding)sh, causal, 2, 61 + 26 * world, 4, 2, 64);
                expect_ring(&c);
            }
}

/* Variable lengths: an empty sequence, sequences shorter than the number of chunks, long ones. */
FA_TEST(ring_varlen) {
    static const int32_t lens[] = {47, 0, 3, 130, 1};
    for (int world = 2; world <= 4; world++)
        for (int sh = 0; sh < 2; sh++) {
            ring_case c = base_case(world == 3 ? FA_DTYPE_BF16 : FA_DTYPE_F32, world, (fa_ring_sharding)sh, 1, 5,
                                    130, 6, 2, 32);
            c.lens = lens;
            c.extra_rows = world == 4;
            expect_ring(&c);
        }
    ring_case c = base_case(FA_DTYPE_F16, 3, FA_RING_ZIGZAG, 0, 5, 130, 4, 4, 48);
    c.lens = lens;
    expect_ring(&c);
}

/* Features on top: MQA with f16, head_dim_v != head_dim, softcap with sinks, strided shards,
 * a caller workspace, one-token and empty shards. */
FA_TEST(ring_features) {
    ring_case c = base_case(FA_DTYPE_F16, 3, FA_RING_ZIGZAG, 1, 1, 113, 3, 1, 64);
    expect_ring(&c);
    c = base_case(FA_DTYPE_BF16, 4, FA_RING_ZIGZAG, 1, 2, 90, 2, 2, 59);
    c.head_dim_v = 40;
    expect_ring(&c);
    c = base_case(FA_DTYPE_F32, 3, FA_RING_ZIGZAG, 1, 2, 77, 4, 2, 32);
    c.softcap = 5.0f;
    c.sinks = 1;
    expect_ring(&c);
    c = base_case(FA_DTYPE_BF16, 2, FA_RING_CONTIGUOUS, 0, 2, 50, 2, 1, 32);
    c.sinks = 1;
    expect_ring(&c);
    c = base_case(FA_DTYPE_BF16, 3, FA_RING_CONTIGUOUS, 1, 3, 41, 4, 2, 64);
    c.padded = 1;
    c.workspace = 1;
    expect_ring(&c);
    c = base_case(FA_DTYPE_F32, 4, FA_RING_ZIGZAG, 1, 2, 5, 2, 1, 16); /* 8 chunks, 5 tokens */
    expect_ring(&c);
    c = base_case(FA_DTYPE_F32, 3, FA_RING_CONTIGUOUS, 1, 1, 1, 1, 1, 8); /* ranks 1, 2 hold nothing */
    c.padded = 1;
    expect_ring(&c);
}

/* The same ring with the shards on one GPU (ranks as threads sharing it). */
FA_TEST(ring_cuda_simulated) {
    if (!fa_cuda_available() || !load_cudart()) {
        fa_test_skip("no usable CUDA GPU");
        return;
    }
    static const int32_t lens[] = {300, 0, 17, 129};
    for (int sh = 0; sh < 2; sh++)
        for (int causal = 0; causal < 2; causal++) {
            ring_case c = base_case(sh ? FA_DTYPE_BF16 : FA_DTYPE_F16, 2 + sh + causal, (fa_ring_sharding)sh, causal,
                                    2, 333, 8, 2, 64);
            c.device = FA_DEVICE_CUDA;
            expect_ring(&c);
            c.batch = 4;
            c.lens = lens;
            c.head_dim = 128;
            c.sinks = causal;
            expect_ring(&c);
        }
}

/* ---- errors ---------------------------------------------------------------------------------- */

FA_TEST(ring_errors) {
    enum { B = 1, N = 8, H = 2, D = 16 };
    float q[B * N * H * D], k[B * N * H * D], v[B * N * H * D], o[B * N * H * D], lse[B * H * N];
    for (int i = 0; i < B * N * H * D; i++) q[i] = k[i] = v[i] = 0.25f, o[i] = NAN;
    for (int i = 0; i < B * H * N; i++) lse[i] = NAN;
    local_ring ring;
    local_ring_init(&ring, 2, NULL);
    endpoint ep = {&ring, 0, {{0}}, 0, 0};
    fa_ring_params p;
    memset(&p, 0, sizeof p);
    p.attn.batch = B;
    p.attn.heads_q = p.attn.heads_kv = H;
    p.attn.head_dim = D;
    p.attn.q = q;
    p.attn.k = k;
    p.attn.v = v;
    p.attn.o = o;
    p.attn.lse = lse;
    p.attn.seqlen_q = p.attn.seqlen_k = N;
    fa_set_contiguous_strides(&p.attn);
    p.rank = 0;
    p.world_size = 2;
    p.sharding = FA_RING_ZIGZAG;
    p.seqlen = 2 * N;
    p.comm.send_recv = local_send_recv;
    p.comm.wait = local_wait;
    p.comm.user = &ep;
    size_t ws = 0;
    FA_CHECK(fa_ring_check_forward(&p, &ws) == FA_OK && ws > 0, "valid params rejected: %s", fa_last_error());

    fa_ring_params bad;
#define EXPECT_ERROR(mutation, status, text)                                                      \
    do {                                                                                          \
        bad = p;                                                                                  \
        mutation;                                                                                 \
        fa_status st_ = fa_ring_forward(&bad);                                                    \
        FA_CHECK(st_ == (status) && strstr(fa_last_error(), (text)) != NULL,                      \
                 "%s: got %s (%s), expected %s mentioning \"%s\"", #mutation, fa_strerror(st_),    \
                 fa_last_error(), fa_strerror(status), text);                                    \
    } while (0)
    EXPECT_ERROR(bad.attn.use_window = 1, FA_ERR_UNSUPPORTED, "sliding windows");
    EXPECT_ERROR(bad.attn.alibi_slopes = lse, FA_ERR_UNSUPPORTED, "ALiBi");
    EXPECT_ERROR(bad.rank = 2, FA_ERR_INVALID_ARGUMENT, "rank");
    EXPECT_ERROR(bad.world_size = 0, FA_ERR_INVALID_SIZE, "world_size");
    EXPECT_ERROR(bad.sharding = (fa_ring_sharding)3, FA_ERR_INVALID_ARGUMENT, "sharding");
    EXPECT_ERROR(bad.comm.wait = NULL, FA_ERR_NULL_POINTER, "comm.wait");
    EXPECT_ERROR(bad.seqlen = 3 * N, FA_ERR_INVALID_SIZE, "seqlen_q");
    EXPECT_ERROR(bad.attn.cu_seqlens_q = (const int32_t *)lse, FA_ERR_CU_SEQLENS, "fa_ring_params.cu_seqlens");
    EXPECT_ERROR(bad.attn.heads_kv = 3, FA_ERR_HEADS, "heads_kv");
    EXPECT_ERROR(bad.attn.k = NULL, FA_ERR_NULL_POINTER, "k");
    EXPECT_ERROR((bad.workspace = o, bad.workspace_bytes = ws - 1), FA_ERR_WORKSPACE, "workspace");
    EXPECT_ERROR(bad.attn.o_row_stride = 1, FA_ERR_STRIDE, "o_row_stride");
    static const int32_t decreasing[] = {0, 9, 4};
    EXPECT_ERROR((bad.cu_seqlens = decreasing, bad.attn.batch = 2), FA_ERR_CU_SEQLENS, "decreases");
#undef EXPECT_ERROR
    bad = p;
    FA_CHECK(fa_ring_backward(&bad) == FA_ERR_NULL_POINTER, "backward without dout/dq/dk/dv accepted");
    int untouched = 1;
    for (int i = 0; i < B * N * H * D; i++) untouched &= isnan(o[i]);
    for (int i = 0; i < B * H * N; i++) untouched &= isnan(lse[i]);
    FA_CHECK(untouched && ep.exchanges == 0, "a rejected call wrote an output or exchanged data");
    local_ring_destroy(&ring);

    /* the NCCL transport: compiled in (argument errors) or not (says so) */
    fa_ring_comm comm;
    memset(&comm, 0, sizeof comm);
    fa_status st = fa_ring_comm_nccl(NULL, NULL, &comm, NULL, NULL);
    if (fa_ring_nccl_built()) {
        FA_CHECK(st == FA_ERR_NULL_POINTER, "fa_ring_comm_nccl(NULL comm): %s", fa_strerror(st));
        fa_test_note("NCCL transport compiled in");
    } else {
        FA_CHECK(st == FA_ERR_UNSUPPORTED && strstr(fa_last_error(), "built without NCCL") != NULL,
                 "fa_ring_comm_nccl without NCCL: %s (%s)", fa_strerror(st), fa_last_error());
        fa_test_note("built without NCCL: %s", fa_last_error());
    }
    fa_ring_comm_nccl_release(&comm); /* a comm it did not make: nothing happens */
}
