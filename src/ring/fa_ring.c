/*
 * fa_ring.c: context parallelism by ring attention: fa_ring_forward / fa_ring_backward,
 * the sharding and the ring schedule, and the CPU implementation of the ring's element-wise
 * operations (the CUDA one is src/ring/ring_nccl.cu).
 *
 * Forward, rank r of W, K/V slots kv[0], kv[1] (double buffer), fp32 running state (o_acc, lse_acc):
 *   pack the local K/V into kv[0]
 *   for s = 0 .. W-1 (holding the shard of owner (r - s) mod W in kv[s % 2]):
 *     post the exchange kv[s % 2] -> rank r+1, kv[(s+1) % 2] <- rank r-1      (s < W-1)
 *     fa_forward(local queries, held shard) with the step's mask -> (o_part, lse_part)
 *     s = 0: (o_acc, lse_acc) = partial; else merge the partial into them
 *     wait for the exchange                                                  (s < W-1)
 *   o = o_acc in the dtype, lse = lse_acc
 * The exchange of step s reads kv[s % 2] while step s computes on it and fills the other slot,
 * which step s-1 finished with: the transfer runs under the computation.
 *
 * Backward, with fp32 dK/dV slots dkv[0], dkv[1] that follow the K/V around the ring one step
 * behind them:
 *   pack the local K/V into kv[0]
 *   for s = 0 .. W-1:
 *     post kv[s % 2] -> r+1, kv[(s+1) % 2] <- r-1                             (s < W-1)
 *     post dkv[(s-1) % 2] -> r+1, dkv[s % 2] <- r-1 (the accumulator of the shard held now)  (s >= 1)
 *     fa_backward(local q, o, lse, dout; held shard) -> dq_part, dk_part, dv_part
 *     dq_acc (+)= dq_part; wait; dkv[s % 2] (+)= (dk_part, dv_part)
 *   one more exchange takes dkv[(W-1) % 2] (the shard of owner r+1, now summed over every rank)
 *   home, and brings this rank's own: dk, dv = that, dq = dq_acc, in the dtype.
 * Every block pair uses the global O and LSE: P = exp(S - LSE) and D = rowsum(dO ∘ O) are the
 * single-device values, so the per-pair gradients add up to the single-device gradients.
 *
 * Masks. Query i and key j of one sequence are visible to each other iff j <= i (causal, global
 * positions). A block pair is a set of query chunks against a set of key chunks; chunk order is
 * token order, so a key chunk before a query chunk is visible whole, the same chunk is causal,
 * a later one invisible (fa_ring_plan_step). The own shard (step 0) is attended as one causal
 * call even with zig-zag: its two chunks are in token order on both sides, so the library's
 * causal mask over the concatenation is exactly the global one. The other zig-zag steps use
 * part of a shard: batched, by pointer offsets (rows of every sequence at the same offset);
 * varlen, where the parts of consecutive sequences are not adjacent, by cu_seqlens that give
 * the unused part its own sub-sequence paired with an empty one (2·batch sub-sequences): a
 * query sub-sequence with no keys gets O = 0, LSE = -inf (an empty state the merge skips), a
 * key sub-sequence with no queries gets dK = dV = 0.
 *
 * Sinks: only step 0 (the own shard, which every query row attends) passes sink_logits, so each
 * row's denominator counts exp(t_h) once; its backward call writes dsink (this rank's part).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_internal.h"
#include "cpu/cpu_convert.h"
#include "cpu/cpu_merge.h"
#include "ring/fa_ring.h"

/* ---- schedule and sharding ------------------------------------------------------------------ */

fa_ring_step fa_ring_plan_step(int rank, int world_size, int step, fa_ring_sharding sharding,
                               int causal) {
    fa_ring_step st;
    st.owner = ((rank - step) % world_size + world_size) % world_size;
    st.block = FA_RING_FULL;
    st.q_part = FA_RING_PART_ALL;
    st.k_part = FA_RING_PART_ALL;
    if (!causal) return st;
    if (st.owner == rank) {
        st.block = FA_RING_CAUSAL;
    } else if (sharding == FA_RING_CONTIGUOUS) {
        if (st.owner > rank) st.block = FA_RING_SKIP;
    } else if (st.owner < rank) {
        st.k_part = FA_RING_PART_FIRST;  /* chunk owner precedes both query chunks; 2W-1-owner follows both */
    } else {
        st.q_part = FA_RING_PART_SECOND; /* chunk rank precedes both key chunks; 2W-1-rank follows both */
    }
    return st;
}

#define FA_RING_MAX_WORLD 65536

static fa_status check_ring_geometry(int world_size, int rank, fa_ring_sharding sharding) {
    if (world_size < 1 || world_size > FA_RING_MAX_WORLD)
        return fa_set_error(FA_ERR_INVALID_SIZE, "world_size = %d is out of range [1, %d]", world_size,
                            FA_RING_MAX_WORLD);
    if (rank < 0 || rank >= world_size)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "rank = %d is out of range [0, world_size = %d)",
                            rank, world_size);
    if (sharding != FA_RING_CONTIGUOUS && sharding != FA_RING_ZIGZAG)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                            "sharding = %d is not a fa_ring_sharding value (FA_RING_CONTIGUOUS or "
                            "FA_RING_ZIGZAG)",
                            (int)sharding);
    return FA_OK;
}

/* Chunks of `rank`: count, global chunk ids and their token ranges in a sequence of L tokens. */
static int shard_chunks(int64_t seqlen, int world_size, int rank, fa_ring_sharding sharding,
                        int64_t start[2], int64_t length[2]) {
    int64_t chunks = sharding == FA_RING_ZIGZAG ? 2 * (int64_t)world_size : world_size;
    int64_t ids[2] = {rank, chunks - 1 - rank};
    int count = sharding == FA_RING_ZIGZAG ? 2 : 1;
    for (int i = 0; i < count; ++i) {
        start[i] = fa_ring_chunk_start(seqlen, chunks, ids[i]);
        length[i] = fa_ring_chunk_length(seqlen, chunks, ids[i]);
    }
    if (count == 1) start[1] = length[1] = 0;
    return count;
}

fa_status fa_ring_shard(int64_t seqlen, int world_size, int rank, fa_ring_sharding sharding,
                        int64_t start[2], int64_t length[2], int *num_chunks) {
    FA_REQUIRE_PTR(start, "start");
    FA_REQUIRE_PTR(length, "length");
    FA_REQUIRE_PTR(num_chunks, "num_chunks");
    fa_status s = check_ring_geometry(world_size, rank, sharding);
    if (s != FA_OK) return s;
    FA_REQUIRE_RANGE(seqlen, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "seqlen");
    *num_chunks = shard_chunks(seqlen, world_size, rank, sharding, start, length);
    return FA_OK;
}

/* ---- CPU element-wise operations ------------------------------------------------------------ */


static float load_element(const void *base, fa_dtype t, int64_t i) {
    switch (t) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)base)[i]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static void store_element(void *base, fa_dtype t, int64_t i, float x) {
    switch (t) {
    case FA_DTYPE_F16: ((uint16_t *)base)[i] = fa_f32_to_f16(x); break;
    case FA_DTYPE_BF16: ((uint16_t *)base)[i] = fa_f32_to_bf16(x); break;
    default: ((float *)base)[i] = x; break;
    }
}

static int64_t view_offset(const fa_ring_view *v, int64_t b, int64_t r, int64_t h) {
    return b * v->block_stride + r * v->row_stride + h * v->head_stride;
}

static fa_status cpu_alloc(size_t bytes, void **ptr, void *stream) {
    (void)stream;
    *ptr = calloc(1, bytes ? bytes : 1); /* zeroed: slot bytes past a short shard travel too */
    return *ptr ? FA_OK : fa_set_error(FA_ERR_ALLOC, "ring attention: cannot allocate %zu bytes", bytes);
}

static void cpu_release(void *ptr, void *stream) {
    (void)stream;
    free(ptr);
}

static fa_status cpu_upload(void *dst, const void *src_host, size_t bytes, void *stream) {
    (void)stream;
    memcpy(dst, src_host, bytes);
    return FA_OK;
}

static fa_status cpu_copy(fa_ring_view dst, fa_ring_view src, fa_ring_shape s, void *stream) {
    (void)stream;
    for (int64_t b = 0; b < s.blocks; ++b)
        for (int64_t r = 0; r < s.rows; ++r)
            for (int64_t h = 0; h < s.heads; ++h) {
                int64_t od = view_offset(&dst, b, r, h), os = view_offset(&src, b, r, h);
                if (dst.dtype == src.dtype) {
                    size_t es = fa_dtype_bytes(dst.dtype);
                    memcpy((char *)dst.ptr + od * (int64_t)es, (const char *)src.ptr + os * (int64_t)es,
                           (size_t)s.dim * es);
                    continue;
                }
                for (int64_t e = 0; e < s.dim; ++e)
                    store_element(dst.ptr, dst.dtype, od + e, load_element(src.ptr, src.dtype, os + e));
            }
    return FA_OK;
}

static fa_status cpu_accumulate(fa_ring_view dst, fa_ring_view src, fa_ring_shape s, void *stream) {
    (void)stream;
    float *out = dst.ptr;
    for (int64_t b = 0; b < s.blocks; ++b)
        for (int64_t r = 0; r < s.rows; ++r)
            for (int64_t h = 0; h < s.heads; ++h) {
                int64_t od = view_offset(&dst, b, r, h), os = view_offset(&src, b, r, h);
                for (int64_t e = 0; e < s.dim; ++e) out[od + e] += load_element(src.ptr, src.dtype, os + e);
            }
    return FA_OK;
}

/* (o_acc, lse_acc) <- the merge of itself and (o_part, lse_part), row by row with the CPU
 * engine's merge (cpu_merge.h: double weights, NaN propagates, an empty state is skipped). */
static fa_status cpu_merge(fa_ring_view o_acc, fa_ring_view lse_acc, fa_ring_view o_part,
                           fa_ring_view lse_part, fa_ring_shape s, void *stream) {
    (void)stream;
    float *acc = o_acc.ptr, *lse = lse_acc.ptr;
    const float *lse_in = lse_part.ptr;
    float rows[2][FA_MAX_HEAD_DIM]; /* state 0: the running o, state 1: the part, in fp32 */
    for (int64_t b = 0; b < s.blocks; ++b)
        for (int64_t r = 0; r < s.rows; ++r)
            for (int64_t h = 0; h < s.heads; ++h) {
                float *running = &lse[view_offset(&lse_acc, b, r, h)];
                const float states[2] = {*running, lse_in[view_offset(&lse_part, b, r, h)]};
                int64_t oa = view_offset(&o_acc, b, r, h), op = view_offset(&o_part, b, r, h);
                for (int64_t e = 0; e < s.dim; ++e) {
                    rows[0][e] = acc[oa + e];
                    rows[1][e] = load_element(o_part.ptr, o_part.dtype, op + e);
                }
                fa_cpu_merge_row_args m = {2, s.dim, states, 1, rows, FA_MAX_HEAD_DIM, FA_DTYPE_F32, NULL, NULL};
                *running = fa_cpu_merge_row(&m, acc + oa);
            }
    return FA_OK;
}

static const fa_ring_backend cpu_backend = {cpu_alloc, cpu_release, cpu_upload, cpu_copy,
                                            cpu_accumulate, cpu_merge};

/* ---- geometry of one ring call ------------------------------------------------------------ */

#define WORKSPACE_ALIGN 256

static size_t align_up(size_t x) { return (x + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN; }

typedef enum ring_pass { PASS_FORWARD, PASS_BACKWARD } ring_pass;

typedef struct ring_ctx {
    fa_ring_params in;      /* the caller's params                                              */
    fa_params a;            /* in.attn with defaults resolved (head_dim_v, softmax_scale)       */
    ring_pass pass;
    const fa_ring_backend *be;
    int world, rank, varlen, causal;
    int64_t batch, hq, hkv, d, dv;
    size_t es;              /* bytes per element of the dtype                                   */

    /* Per owner o: batched: tokens per sequence (seq_rows) and of its first chunk (first_rows);
     * varlen: local prefix sums cu[o·(batch+1) + b] and first-chunk lengths first[o·batch + b].
     * rows[o]: rows of the whole shard (batch·seq_rows or cu[batch]). */
    int64_t *rows, *seq_rows, *first_rows;
    int32_t *cu, *first;
    int64_t max_rows;       /* max over owners of rows[o]                                       */
    int64_t user_total_q;   /* varlen: the caller's total_q (its lse layout), >= rows[rank]     */

    /* varlen calls: per step s, cu_seqlens_q / _k of the call at call_cu[(2s + {0,1})·stride] on
     * the host and call_cu_dev on the device (same pointer on the CPU). */
    int32_t *call_cu;
    int32_t *call_cu_dev;
    int64_t call_cu_stride; /* 2·batch + 1                                                      */
    int64_t *call_batch, *call_max_q, *call_max_k;

    /* workspace regions (byte offsets), see layout_workspace */
    size_t kv_slot, k_region;         /* one K/V slot; V starts at k_region                     */
    size_t dkv_slot, dk_region;       /* backward: one fp32 dK/dV slot; dV starts at dk_region  */
    size_t off_kv[2], off_acc, off_lse_acc, off_part, off_lse_part, off_cu;
    size_t off_dkv[2], off_dk_part, off_dv_part, off_lse_second;
    size_t off_inner, inner_bytes;    /* the inner fa_forward / fa_backward calls' workspace    */
    size_t total_bytes;
    int lse_relayout;       /* backward, varlen: the caller's lse is [hq, total_q > rows]: the
                               calls read a copy laid out [hq, rows] (lse_second)               */

    char *ws;               /* device workspace base                                           */
    void *host_block;       /* every host array above, one allocation                          */
} ring_ctx;

/* Rows of the shard part `part` of owner o within each sequence (batched): [*lo, *lo + *count). */
static void part_rows(const ring_ctx *c, int owner, int part, int64_t *lo, int64_t *count) {
    int64_t n = c->seq_rows[owner], first = c->first_rows[owner];
    *lo = part == FA_RING_PART_SECOND ? first : 0;
    *count = part == FA_RING_PART_ALL ? n : part == FA_RING_PART_FIRST ? first : n - first;
}

/* Varlen cu_seqlens of step s's call (see the top of the file): writes both arrays and the
 * call's batch and maxima. */
static void build_varlen_call(ring_ctx *c, int step) {
    fa_ring_step st = fa_ring_plan_step(c->rank, c->world, step, c->in.sharding, c->causal);
    int64_t B = c->batch;
    int32_t *cq = c->call_cu + (2 * (int64_t)step) * c->call_cu_stride;
    int32_t *ck = cq + c->call_cu_stride;
    const int32_t *cu_r = c->cu + (int64_t)c->rank * (B + 1), *cu_o = c->cu + (int64_t)st.owner * (B + 1);
    const int32_t *first_r = c->first + (int64_t)c->rank * B, *first_o = c->first + (int64_t)st.owner * B;
    int64_t call_batch = B;
    if (st.q_part == FA_RING_PART_ALL && st.k_part == FA_RING_PART_ALL) {
        memcpy(cq, cu_r, sizeof(int32_t) * (size_t)(B + 1));
        memcpy(ck, cu_o, sizeof(int32_t) * (size_t)(B + 1));
    } else if (st.k_part == FA_RING_PART_FIRST) {
        /* sub-sequence 2b: the queries of b against the owner's first chunk of b;
         * 2b+1: no queries against its second chunk */
        call_batch = 2 * B;
        for (int64_t b = 0; b < B; ++b) {
            cq[2 * b] = cu_r[b];
            cq[2 * b + 1] = cu_r[b + 1];
            ck[2 * b] = cu_o[b];
            ck[2 * b + 1] = cu_o[b] + first_o[b];
        }
        cq[2 * B] = cu_r[B];
        ck[2 * B] = cu_o[B];
    } else {
        /* sub-sequence 2b: the first query chunk of b against no keys; 2b+1: the second query
         * chunk against every key of b */
        call_batch = 2 * B;
        for (int64_t b = 0; b < B; ++b) {
            cq[2 * b] = cu_r[b];
            cq[2 * b + 1] = cu_r[b] + first_r[b];
            ck[2 * b] = cu_o[b];
            ck[2 * b + 1] = cu_o[b];
        }
        cq[2 * B] = cu_r[B];
        ck[2 * B] = cu_o[B];
    }
    int64_t max_q = 0, max_k = 0;
    for (int64_t i = 0; i < call_batch; ++i) {
        if (cq[i + 1] - cq[i] > max_q) max_q = cq[i + 1] - cq[i];
        if (ck[i + 1] - ck[i] > max_k) max_k = ck[i + 1] - ck[i];
    }
    c->call_batch[step] = call_batch;
    c->call_max_q[step] = max_q;
    c->call_max_k[step] = max_k;
}

static void layout_workspace(ring_ctx *c) {
    size_t off = 0;
    const size_t f32 = sizeof(float);
    const size_t rows_r = (size_t)c->rows[c->rank], max_rows = (size_t)c->max_rows;
    const size_t hq = (size_t)c->hq, hkv = (size_t)c->hkv, d = (size_t)c->d, dv = (size_t)c->dv;
    c->k_region = align_up(max_rows * hkv * d * c->es);
    c->kv_slot = c->k_region + align_up(max_rows * hkv * dv * c->es);
    c->off_kv[0] = off;
    off += c->kv_slot;
    c->off_kv[1] = off;
    if (c->world > 1) off += c->kv_slot;
    if (c->pass == PASS_FORWARD) {
        c->off_acc = off;
        off += align_up(rows_r * hq * dv * f32);
        c->off_lse_acc = off;
        off += align_up(rows_r * hq * f32);
        c->off_part = off;
        off += align_up(rows_r * hq * dv * c->es);
        c->off_lse_part = off;
        off += align_up(rows_r * hq * f32);
    } else {
        c->dk_region = align_up(max_rows * hkv * d * f32);
        c->dkv_slot = c->dk_region + align_up(max_rows * hkv * dv * f32);
        c->off_dkv[0] = off;
        off += c->dkv_slot;
        c->off_dkv[1] = off;
        if (c->world > 1) off += c->dkv_slot;
        c->off_acc = off; /* dq_acc, fp32 */
        off += align_up(rows_r * hq * d * f32);
        c->off_part = off; /* dq_part, dtype */
        off += align_up(rows_r * hq * d * c->es);
        c->off_dk_part = off;
        off += align_up(max_rows * hkv * d * c->es);
        c->off_dv_part = off;
        off += align_up(max_rows * hkv * dv * c->es);
        c->off_lse_second = off; /* lse re-laid out for the calls (see run_backward) */
        off += align_up(rows_r * hq * f32);
    }
    c->off_cu = off;
    off += align_up(c->varlen ? sizeof(int32_t) * (size_t)(2 * c->world * c->call_cu_stride) : 0);
    c->off_inner = off; /* sized by prepare once every step's call is known */
    c->total_bytes = off;
}

/* Host arrays: geometry of every owner and (varlen) the calls' cu_seqlens. */
static fa_status build_geometry(ring_ctx *c) {
    const int64_t W = c->world, B = c->batch;
    const int64_t stride = 2 * B + 1;
    size_t bytes = sizeof(int64_t) * (size_t)(3 * W + 3 * W);
    if (c->varlen)
        bytes += sizeof(int32_t) * (size_t)(W * (B + 1) + W * B + 2 * W * stride);
    c->host_block = calloc(1, bytes);
    if (!c->host_block) return fa_set_error(FA_ERR_ALLOC, "ring attention: cannot allocate %zu bytes", bytes);
    int64_t *i64 = c->host_block;
    c->rows = i64;
    c->seq_rows = i64 + W;
    c->first_rows = i64 + 2 * W;
    c->call_batch = i64 + 3 * W;
    c->call_max_q = i64 + 4 * W;
    c->call_max_k = i64 + 5 * W;
    c->max_rows = 0;
    if (!c->varlen) {
        for (int o = 0; o < W; ++o) {
            int64_t start[2], length[2];
            shard_chunks(c->in.seqlen, c->world, o, c->in.sharding, start, length);
            c->seq_rows[o] = length[0] + length[1];
            c->first_rows[o] = length[0];
            c->rows[o] = B * c->seq_rows[o];
            if (c->rows[o] > c->max_rows) c->max_rows = c->rows[o];
        }
        return FA_OK;
    }
    int32_t *i32 = (int32_t *)(i64 + 6 * W);
    c->cu = i32;
    c->first = i32 + W * (B + 1);
    c->call_cu = c->first + W * B;
    c->call_cu_stride = stride;
    for (int o = 0; o < W; ++o) {
        int32_t *cu = c->cu + o * (B + 1);
        cu[0] = 0;
        for (int64_t b = 0; b < B; ++b) {
            int64_t start[2], length[2];
            int64_t len = (int64_t)c->in.cu_seqlens[b + 1] - c->in.cu_seqlens[b];
            shard_chunks(len, c->world, o, c->in.sharding, start, length);
            cu[b + 1] = cu[b] + (int32_t)(length[0] + length[1]);
            c->first[o * B + b] = (int32_t)length[0];
        }
        c->rows[o] = cu[B];
        if (c->rows[o] > c->max_rows) c->max_rows = c->rows[o];
    }
    for (int s = 0; s < W; ++s) build_varlen_call(c, s);
    return FA_OK;
}

/* ---- views ---------------------------------------------------------------------------------- */

static fa_ring_view make_view(void *ptr, fa_dtype dtype, int64_t block_stride, int64_t row_stride,
                              int64_t head_stride) {
    fa_ring_view v = {ptr, dtype, block_stride, row_stride, head_stride};
    return v;
}

static void *offset_bytes(const void *base, int64_t elements, size_t es) {
    return (char *)base + elements * (int64_t)es;
}

/* Dense [blocks, rows, heads, dim] of owner o's shard (batched: one block per sequence of
 * seq_rows; varlen: one block of packed rows) in memory at `ptr`. */
static fa_ring_view dense_view(const ring_ctx *c, int owner, void *ptr, fa_dtype dtype, int64_t heads,
                               int64_t dim) {
    int64_t per_row = heads * dim;
    return make_view(ptr, dtype, c->varlen ? 0 : c->seq_rows[owner] * per_row, per_row, dim);
}

static fa_ring_shape shard_shape(const ring_ctx *c, int owner, int64_t heads, int64_t dim) {
    fa_ring_shape s = {c->varlen ? 1 : c->batch, c->varlen ? c->rows[owner] : c->seq_rows[owner], heads, dim};
    return s;
}

/* The caller's tensor (batched: its batch stride; varlen: packed rows). */
static fa_ring_view user_view(const ring_ctx *c, const void *ptr, int64_t bs, int64_t rs, int64_t hs) {
    return make_view((void *)ptr, c->a.dtype, c->varlen ? 0 : bs, rs, hs);
}

/* The lse layout of a call or a buffer with `rows_per_seq` rows per sequence (batched
 * [batch, heads, rows]) or `total` packed rows (varlen [heads, total]). */
static fa_ring_view lse_view(const ring_ctx *c, float *ptr, int64_t rows_per_seq, int64_t total) {
    if (c->varlen) return make_view(ptr, FA_DTYPE_F32, 0, 1, total);
    return make_view(ptr, FA_DTYPE_F32, c->hq * rows_per_seq, 1, rows_per_seq);
}

/* ---- steps ---------------------------------------------------------------------------------- */

typedef struct ring_call {
    fa_ring_step st;
    int64_t q_lo, q_rows; /* batched: the query rows of every sequence this call covers      */
    int64_t k_rows;       /* batched: the key rows (from 0) of the held shard it covers        */
} ring_call;

static ring_call plan_call(const ring_ctx *c, int step) {
    ring_call call;
    int64_t k_lo;
    call.st = fa_ring_plan_step(c->rank, c->world, step, c->in.sharding, c->causal);
    if (c->varlen) {
        call.q_lo = 0;
        call.q_rows = c->rows[c->rank];
        call.k_rows = c->rows[call.st.owner];
        return call;
    }
    part_rows(c, c->rank, call.st.q_part, &call.q_lo, &call.q_rows);
    part_rows(c, call.st.owner, call.st.k_part, &k_lo, &call.k_rows); /* k_lo = 0: FIRST or ALL */
    return call;
}

/* fa_params of step `step`'s inner call: local queries (rows q_lo..), the held shard in `slot`. */
static fa_params call_params(const ring_ctx *c, const ring_call *call, int step, const char *slot) {
    fa_params p = c->a;
    const int owner = call->st.owner;
    const int64_t hkv = c->hkv;
    p.q = offset_bytes(c->a.q, call->q_lo * c->a.q_row_stride, c->es);
    p.k = slot;
    p.v = slot + c->k_region;
    p.k_batch_stride = c->varlen ? 0 : c->seq_rows[owner] * hkv * c->d;
    p.k_row_stride = hkv * c->d;
    p.k_head_stride = c->d;
    p.v_batch_stride = c->varlen ? 0 : c->seq_rows[owner] * hkv * c->dv;
    p.v_row_stride = hkv * c->dv;
    p.v_head_stride = c->dv;
    p.causal = call->st.block == FA_RING_CAUSAL;
    p.use_window = 0;
    if (step != 0) p.sink_logits = NULL; /* the sink joins each row's softmax once */
    p.workspace = c->inner_bytes ? c->ws + c->off_inner : NULL;
    p.workspace_bytes = c->inner_bytes;
    if (c->varlen) {
        p.batch = c->call_batch[step];
        p.cu_seqlens_q = c->call_cu_dev + (2 * (int64_t)step) * c->call_cu_stride;
        p.cu_seqlens_k = p.cu_seqlens_q + c->call_cu_stride;
        p.seqlen_q = c->call_max_q[step];
        p.seqlen_k = c->call_max_k[step];
        p.total_k = c->rows[owner];
    } else {
        p.seqlen_q = call->q_rows;
        p.seqlen_k = call->k_rows;
    }
    return p;
}

/* The complete fa_forward params of step `step`: partial output in o_part (rows of the call at
 * their place in a dense [.., n_r, hq, dv] buffer), lse in lse_part (the call's layout). */
static fa_params forward_call(const ring_ctx *c, const ring_call *call, int step) {
    const int64_t hq = c->hq, dv = c->dv, rows_r = c->rows[c->rank];
    const int64_t n_r = c->varlen ? rows_r : c->seq_rows[c->rank];
    fa_params p = call_params(c, call, step, c->ws + c->off_kv[step % 2]);
    p.o = offset_bytes(c->ws + c->off_part, call->q_lo * hq * dv, c->es);
    p.o_batch_stride = c->varlen ? 0 : n_r * hq * dv;
    p.o_row_stride = hq * dv;
    p.o_head_stride = dv;
    p.lse = (float *)(c->ws + c->off_lse_part);
    if (c->varlen) p.total_q = rows_r;
    return p;
}

/* The complete fa_backward params of step `step`: the caller's q, o, dout (rows of the call) and
 * an lse in the call's layout; dq into dq_part (dense [.., n_r, hq, d]), dk / dv into dk_part /
 * dv_part (dense, the held shard's layout); dsink only at step 0. */
static fa_params backward_call(const ring_ctx *c, const ring_call *call, int step) {
    const fa_params *a = &c->a;
    const int64_t hq = c->hq, hkv = c->hkv, d = c->d, dv = c->dv, rows_r = c->rows[c->rank];
    const int64_t n_r = c->varlen ? rows_r : c->seq_rows[c->rank];
    const int owner = call->st.owner;
    float *lse_second = (float *)(c->ws + c->off_lse_second);
    fa_params p = call_params(c, call, step, c->ws + c->off_kv[step % 2]);
    p.o = offset_bytes(a->o, call->q_lo * a->o_row_stride, c->es);
    p.dout = offset_bytes(a->dout, call->q_lo * a->do_row_stride, c->es);
    if (c->varlen) {
        p.total_q = rows_r;
        if (c->lse_relayout) p.lse = lse_second;
    } else if (call->q_lo != 0) {
        p.lse = lse_second; /* [batch, hq, rows of the second chunk] */
    }
    p.dq = offset_bytes(c->ws + c->off_part, call->q_lo * hq * d, c->es);
    p.dq_batch_stride = c->varlen ? 0 : n_r * hq * d;
    p.dq_row_stride = hq * d;
    p.dq_head_stride = d;
    p.dk = c->ws + c->off_dk_part;
    p.dk_batch_stride = c->varlen ? 0 : c->seq_rows[owner] * hkv * d;
    p.dk_row_stride = hkv * d;
    p.dk_head_stride = d;
    p.dv = c->ws + c->off_dv_part;
    p.dv_batch_stride = c->varlen ? 0 : c->seq_rows[owner] * hkv * dv;
    p.dv_row_stride = hkv * dv;
    p.dv_head_stride = dv;
    if (step != 0) p.dsink = NULL;
    return p;
}

static fa_status exchange(const ring_ctx *c, void *send, void *recv, size_t bytes, int step,
                          const char *what) {
    fa_status s = c->in.comm.send_recv(c->in.comm.user, send, recv, bytes, c->a.stream);
    if (s != FA_OK)
        return fa_set_error(s, "ring attention rank %d: the transport's send_recv of %s failed at step "
                            "%d: %s", c->rank, what, step, fa_strerror(s));
    return FA_OK;
}

static fa_status wait_exchanges(const ring_ctx *c, int step) {
    fa_status s = c->in.comm.wait(c->in.comm.user, c->a.stream);
    if (s != FA_OK)
        return fa_set_error(s, "ring attention rank %d: the transport's wait failed at step %d: %s",
                            c->rank, step, fa_strerror(s));
    return FA_OK;
}

/* Copy the local K and V into a slot (dense). */
static fa_status pack_local_kv(const ring_ctx *c, char *slot) {
    const fa_params *a = &c->a;
    void *stream = a->stream;
    fa_status s = c->be->copy(dense_view(c, c->rank, slot, a->dtype, c->hkv, c->d),
                              user_view(c, a->k, a->k_batch_stride, a->k_row_stride, a->k_head_stride),
                              shard_shape(c, c->rank, c->hkv, c->d), stream);
    if (s != FA_OK) return s;
    return c->be->copy(dense_view(c, c->rank, slot + c->k_region, a->dtype, c->hkv, c->dv),
                       user_view(c, a->v, a->v_batch_stride, a->v_row_stride, a->v_head_stride),
                       shard_shape(c, c->rank, c->hkv, c->dv), stream);
}

/* ---- validation ----------------------------------------------------------------------------- */

static fa_status check_global_cu(const int32_t *cu, int64_t batch) {
    if (cu[0] != 0) return fa_set_error(FA_ERR_CU_SEQLENS, "cu_seqlens[0] = %d, must be 0", cu[0]);
    for (int64_t b = 0; b < batch; ++b)
        if (cu[b + 1] < cu[b])
            return fa_set_error(FA_ERR_CU_SEQLENS, "cu_seqlens decreases: cu_seqlens[%lld] = %d > "
                                "cu_seqlens[%lld] = %d",
                                (long long)b, cu[b], (long long)(b + 1), cu[b + 1]);
    return FA_OK;
}

/* The params of one inner call over the whole local shard (what step 0 runs), for validation. */
static fa_params whole_shard_params(const ring_ctx *c) {
    fa_params p = c->in.attn;
    if (c->varlen) {
        const int32_t *cu_r = c->cu + (int64_t)c->rank * (c->batch + 1);
        p.cu_seqlens_q = cu_r; /* host arrays: on CUDA the check reads only total_q / total_k  */
        p.cu_seqlens_k = cu_r;
        int64_t max_len = 0;
        for (int64_t b = 0; b < c->batch; ++b)
            if (cu_r[b + 1] - cu_r[b] > max_len) max_len = cu_r[b + 1] - cu_r[b];
        p.seqlen_q = p.seqlen_k = max_len;
        if (p.total_q == 0) p.total_q = c->rows[c->rank];
        if (p.total_k == 0) p.total_k = c->rows[c->rank];
    } else {
        p.seqlen_q = p.seqlen_k = c->seq_rows[c->rank];
    }
    return p;
}

/* Every step's inner call, validated before anything is exchanged (a call failing half-way would
 * leave the other ranks waiting), with the workspace regions at a placeholder address (nothing
 * is dereferenced; CUDA alignment holds: the regions are 256-byte aligned). Sets the inner
 * calls' workspace (the largest any step wants) and the total. */
static fa_status check_inner_calls(ring_ctx *c) {
    c->ws = (char *)(uintptr_t)((uintptr_t)1 << 30);
    c->call_cu_dev = c->call_cu; /* host copies: the CPU check reads them, CUDA does not */
    size_t most = 0;
    fa_status s = FA_OK;
    for (int step = 0; step < c->world && s == FA_OK; ++step) {
        ring_call call = plan_call(c, step);
        if (call.st.block == FA_RING_SKIP) continue;
        fa_params p = c->pass == PASS_FORWARD ? forward_call(c, &call, step) : backward_call(c, &call, step);
        p.workspace = NULL;
        size_t bytes = 0;
        s = c->pass == PASS_FORWARD ? fa_check_forward(&p, &bytes) : fa_check_backward(&p, &bytes);
        if (s != FA_OK) {
            char why[400];
            snprintf(why, sizeof why, "%s", fa_last_error());
            s = fa_set_error(s, "ring attention rank %d, step %d (the shard of rank %d): %s", c->rank, step,
                             call.st.owner, why);
        }
        if (bytes > most) most = bytes;
    }
    c->ws = NULL;
    c->call_cu_dev = NULL;
    c->inner_bytes = most;
    c->total_bytes = c->off_inner + align_up(most);
    return s;
}

static void free_ctx(ring_ctx *c) {
    free(c->host_block);
    c->host_block = NULL;
}

/* Everything before any exchange: fills *c (host arrays owned by c) and the workspace size. */
static fa_status prepare(const fa_ring_params *r, ring_pass pass, ring_ctx *c) {
    memset(c, 0, sizeof *c);
    if (r == NULL) return fa_set_error(FA_ERR_NULL_POINTER, "ring params is NULL");
    c->in = *r;
    c->pass = pass;
    const fa_params *a = &r->attn;
    fa_status s = check_ring_geometry(r->world_size, r->rank, r->sharding);
    if (s != FA_OK) return s;
    if (r->world_size > 1 && (r->comm.send_recv == NULL || r->comm.wait == NULL))
        return fa_set_error(FA_ERR_NULL_POINTER,
                            "comm.%s is NULL: world_size = %d needs a transport (fa_ring_comm_nccl, or "
                            "your own send_recv / wait)",
                            r->comm.send_recv == NULL ? "send_recv" : "wait", r->world_size);
    if (a->use_window)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "ring attention does not support sliding windows (use_window = 1): the "
                            "window of a block pair depends on the global positions of both shards");
    if (a->bias != NULL || a->kv_num_blocks != NULL || a->doc_ids_q != NULL || a->doc_ids_k != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "ring attention does not support %s: its positions are global, the inner "
                            "calls see one shard at a time",
                            a->bias != NULL ? "a score bias (bias set)"
                            : a->kv_num_blocks != NULL ? "block-sparse masks (kv_num_blocks set)"
                                                       : "document ids (doc_ids_q / doc_ids_k set)");
    if (a->alibi_slopes != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "ring attention does not support ALiBi (alibi_slopes set): the bias depends "
                            "on global positions");
    if (a->dropout_p != 0.0f || a->attn_probs != NULL || a->block_table != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "ring attention does not support %s: the inner calls see one shard's "
                            "keys at a time",
                            a->dropout_p != 0.0f ? "dropout (dropout_p != 0)"
                            : a->attn_probs != NULL ? "attn_probs"
                                                    : "a paged K/V (block_table)");
    if (a->cu_seqlens_q != NULL || a->cu_seqlens_k != NULL)
        return fa_set_error(FA_ERR_CU_SEQLENS,
                            "attn.cu_seqlens_q / cu_seqlens_k must be NULL in ring attention: set "
                            "fa_ring_params.cu_seqlens (the GLOBAL lengths, host memory) and the ring "
                            "derives each shard's");
    if (a->batch < 1 || a->batch > FA_MAX_EXTENT)
        return fa_set_error(FA_ERR_INVALID_SIZE, "batch = %lld is out of range [1, %lld]",
                            (long long)a->batch, (long long)FA_MAX_EXTENT);
    c->world = r->world_size;
    c->rank = r->rank;
    c->varlen = r->cu_seqlens != NULL;
    c->causal = a->causal != 0;
    c->batch = a->batch;
    if (c->varlen) {
        s = check_global_cu(r->cu_seqlens, a->batch);
        if (s != FA_OK) return s;
    } else {
        FA_REQUIRE_RANGE(r->seqlen, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "seqlen");
    }
    s = build_geometry(c);
    if (s != FA_OK) return s;

    /* sizes of the shard as the caller gave them */
    const int64_t rows_r = c->rows[c->rank];
    if (!c->varlen) {
        int64_t n = c->seq_rows[c->rank];
        if ((a->seqlen_q != 0 && a->seqlen_q != n) || (a->seqlen_k != 0 && a->seqlen_k != n))
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "attn.seqlen_q = %lld / seqlen_k = %lld: rank %d of %d holds %lld tokens "
                                "of each %lld-token sequence (set both to that, or 0)",
                                (long long)a->seqlen_q, (long long)a->seqlen_k, c->rank, c->world,
                                (long long)n, (long long)r->seqlen);
    } else if ((a->total_q != 0 && a->total_q < rows_r) || (a->total_k != 0 && a->total_k < rows_r)) {
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "attn.total_q = %lld / total_k = %lld: rank %d of %d holds %lld rows of the "
                            "batch (0 or at least that)",
                            (long long)a->total_q, (long long)a->total_k, c->rank, c->world,
                            (long long)rows_r);
    }

    if (a->dtype == FA_DTYPE_FP8_E4M3)
        return fa_set_error(FA_ERR_DTYPE, "attn.dtype = FA_DTYPE_FP8_E4M3: ring attention takes f32 / f16 / bf16");
    /* everything fa_forward / fa_backward check, on the whole shard */
    fa_params whole = whole_shard_params(c);
    size_t inner_ws = 0;
    s = pass == PASS_FORWARD ? fa_check_forward(&whole, &inner_ws) : fa_check_backward(&whole, &inner_ws);
    if (s != FA_OK) return s;
    c->a = whole;
    c->a.cu_seqlens_q = c->a.cu_seqlens_k = NULL;
    if (c->a.head_dim_v == 0) c->a.head_dim_v = c->a.head_dim;
    c->user_total_q = whole.total_q;
    c->hq = a->heads_q;
    c->hkv = a->heads_kv;
    c->d = c->a.head_dim;
    c->dv = c->a.head_dim_v;
    c->es = fa_dtype_bytes(a->dtype);
    c->be = a->device == FA_DEVICE_CUDA ? fa_cuda_ring_backend() : &cpu_backend;
    if (c->be == NULL)
        return fa_set_error(FA_ERR_DEVICE, "device = FA_DEVICE_CUDA but this libflashattn was built without CUDA");
    c->lse_relayout = c->varlen && c->user_total_q != rows_r;
    layout_workspace(c);
    s = check_inner_calls(c);
    if (s != FA_OK) return s;
    if (r->workspace != NULL && r->workspace_bytes < c->total_bytes)
        return fa_set_error(FA_ERR_WORKSPACE,
                            "ring workspace_bytes = %zu is smaller than the %zu bytes this call needs "
                            "(fa_ring_check_*; pass NULL to let the library allocate)",
                            r->workspace_bytes, c->total_bytes);
    return FA_OK;
}

fa_status fa_ring_check_forward(const fa_ring_params *r, size_t *workspace_bytes) {
    ring_ctx c;
    fa_status s = prepare(r, PASS_FORWARD, &c);
    if (s == FA_OK && workspace_bytes) *workspace_bytes = c.total_bytes;
    free_ctx(&c);
    return s;
}

fa_status fa_ring_check_backward(const fa_ring_params *r, size_t *workspace_bytes) {
    ring_ctx c;
    fa_status s = prepare(r, PASS_BACKWARD, &c);
    if (s == FA_OK && workspace_bytes) *workspace_bytes = c.total_bytes;
    free_ctx(&c);
    return s;
}

static fa_status setup(ring_ctx *c) {
    void *stream = c->a.stream;
    if (c->in.workspace != NULL) {
        c->ws = c->in.workspace;
    } else {
        void *ws = NULL;
        fa_status s = c->be->alloc(c->total_bytes, &ws, stream);
        if (s != FA_OK) return s;
        c->ws = ws;
    }
    if (c->varlen) {
        c->call_cu_dev = (int32_t *)(c->ws + c->off_cu);
        size_t bytes = sizeof(int32_t) * (size_t)(2 * c->world * c->call_cu_stride);
        if (c->a.device == FA_DEVICE_CPU) c->call_cu_dev = c->call_cu; /* host memory already */
        else return c->be->upload(c->call_cu_dev, c->call_cu, bytes, stream);
    }
    return FA_OK;
}

static void teardown(ring_ctx *c) {
    if (c->ws != NULL && c->in.workspace == NULL) c->be->release(c->ws, c->a.stream);
    c->ws = NULL;
    free_ctx(c);
}

#define TRY(expr)                                                                                 \
    do {                                                                                          \
        status = (expr);                                                                          \
        if (status != FA_OK) goto done;                                                           \
    } while (0)

/* ---- forward -------------------------------------------------------------------------------- */

static fa_status run_forward(ring_ctx *c) {
    const fa_params *a = &c->a;
    const fa_ring_backend *be = c->be;
    void *stream = a->stream;
    const int r = c->rank;
    const int64_t hq = c->hq, dv = c->dv, rows_r = c->rows[r];
    const int64_t n_r = c->varlen ? rows_r : c->seq_rows[r];
    float *o_acc = (float *)(c->ws + c->off_acc), *lse_acc = (float *)(c->ws + c->off_lse_acc);
    float *lse_part = (float *)(c->ws + c->off_lse_part);
    fa_status status = FA_OK;

    TRY(pack_local_kv(c, c->ws + c->off_kv[0]));
    for (int step = 0; step < c->world; ++step) {
        char *slot = c->ws + c->off_kv[step % 2];
        const int more = step + 1 < c->world;
        if (more) TRY(exchange(c, slot, c->ws + c->off_kv[(step + 1) % 2], c->kv_slot, step, "K/V"));
        ring_call call = plan_call(c, step);
        if (call.st.block != FA_RING_SKIP) {
            fa_params p = forward_call(c, &call, step);
            TRY(fa_forward(&p));
            fa_ring_shape shape = {c->varlen ? 1 : c->batch, call.q_rows, hq, dv};
            fa_ring_view acc = make_view(o_acc + call.q_lo * hq * dv, FA_DTYPE_F32,
                                         c->varlen ? 0 : n_r * hq * dv, hq * dv, dv);
            fa_ring_view part = make_view(p.o, a->dtype, acc.block_stride, hq * dv, dv);
            fa_ring_view lacc = lse_view(c, lse_acc + call.q_lo, n_r, rows_r);
            fa_ring_view lpart = lse_view(c, lse_part, call.q_rows, rows_r);
            if (step == 0) { /* step 0 covers every row: the running state starts as its partial */
                TRY(be->copy(acc, part, shape, stream));
                fa_ring_shape lshape = shape;
                lshape.dim = 1;
                TRY(be->copy(lacc, lpart, lshape, stream));
            } else {
                TRY(be->merge(acc, lacc, part, lpart, shape, stream));
            }
        }
        if (more) TRY(wait_exchanges(c, step));
    }

    /* results in the caller's layouts */
    {
        fa_ring_shape shape = shard_shape(c, r, hq, dv);
        TRY(be->copy(user_view(c, a->o, a->o_batch_stride, a->o_row_stride, a->o_head_stride),
                     dense_view(c, r, o_acc, FA_DTYPE_F32, hq, dv), shape, stream));
        if (a->lse != NULL) {
            shape.dim = 1;
            TRY(be->copy(lse_view(c, a->lse, n_r, c->user_total_q), lse_view(c, lse_acc, n_r, rows_r),
                         shape, stream));
        }
    }
done:
    return status;
}

fa_status fa_ring_forward(const fa_ring_params *r) {
    ring_ctx c;
    fa_status s = prepare(r, PASS_FORWARD, &c);
    if (s == FA_OK) s = setup(&c);
    if (s == FA_OK) s = run_forward(&c);
    teardown(&c);
    return s;
}

/* ---- backward ------------------------------------------------------------------------------- */

static fa_status run_backward(ring_ctx *c) {
    const fa_params *a = &c->a;
    const fa_ring_backend *be = c->be;
    void *stream = a->stream;
    const int r = c->rank;
    const int64_t hq = c->hq, hkv = c->hkv, d = c->d, dv = c->dv, rows_r = c->rows[r];
    const int64_t n_r = c->varlen ? rows_r : c->seq_rows[r];
    float *dq_acc = (float *)(c->ws + c->off_acc);
    char *dk_part = c->ws + c->off_dk_part, *dv_part = c->ws + c->off_dv_part;
    float *lse_second = (float *)(c->ws + c->off_lse_second);
    fa_status status = FA_OK;

    TRY(pack_local_kv(c, c->ws + c->off_kv[0]));
    /* The lse the calls read must have the call's layout: batched zig-zag calls of the second
     * query chunk read [batch, hq, its rows]; varlen calls, whose total_q is the shard's rows (the
     * scratch dq holds no more), read [hq, rows_r] (the caller's may be [hq, total_q > rows_r]). */
    if (!c->varlen && c->causal && c->in.sharding == FA_RING_ZIGZAG && c->world > 1) {
        int64_t second_lo, second_rows;
        part_rows(c, r, FA_RING_PART_SECOND, &second_lo, &second_rows);
        fa_ring_shape shape = {c->batch, second_rows, hq, 1};
        TRY(be->copy(lse_view(c, lse_second, second_rows, 0), lse_view(c, a->lse + second_lo, n_r, 0),
                     shape, stream));
    } else if (c->lse_relayout) {
        fa_ring_shape shape = {1, rows_r, hq, 1};
        TRY(be->copy(lse_view(c, lse_second, 0, rows_r), lse_view(c, a->lse, 0, c->user_total_q), shape,
                     stream));
    }
    for (int step = 0; step < c->world; ++step) {
        char *slot = c->ws + c->off_kv[step % 2];
        char *dkv = c->ws + c->off_dkv[step % 2];
        const int more = step + 1 < c->world;
        if (more) TRY(exchange(c, slot, c->ws + c->off_kv[(step + 1) % 2], c->kv_slot, step, "K/V"));
        if (step > 0)
            TRY(exchange(c, c->ws + c->off_dkv[(step - 1) % 2], dkv, c->dkv_slot, step, "dK/dV"));
        ring_call call = plan_call(c, step);
        const int owner = call.st.owner;
        if (call.st.block != FA_RING_SKIP) {
            fa_params p = backward_call(c, &call, step);
            const int64_t q_shift = call.q_lo;
            TRY(fa_backward(&p));
            fa_ring_shape qshape = {c->varlen ? 1 : c->batch, call.q_rows, hq, d};
            fa_ring_view dq_dst = make_view(dq_acc + q_shift * hq * d, FA_DTYPE_F32, p.dq_batch_stride, hq * d, d);
            fa_ring_view dq_src = make_view(p.dq, a->dtype, p.dq_batch_stride, hq * d, d);
            TRY(step == 0 ? be->copy(dq_dst, dq_src, qshape, stream) : be->accumulate(dq_dst, dq_src, qshape, stream));
        }
        if (more || step > 0) TRY(wait_exchanges(c, step));
        if (call.st.block != FA_RING_SKIP) {
            /* the held shard's accumulator: received (step > 0) plus this rank's part */
            fa_ring_shape kshape = {c->varlen ? 1 : c->batch, call.k_rows, hkv, d};
            fa_ring_shape vshape = kshape;
            vshape.dim = dv;
            fa_ring_view dk_dst = dense_view(c, owner, dkv, FA_DTYPE_F32, hkv, d);
            fa_ring_view dv_dst = dense_view(c, owner, dkv + c->dk_region, FA_DTYPE_F32, hkv, dv);
            fa_ring_view dk_src = dense_view(c, owner, dk_part, a->dtype, hkv, d);
            fa_ring_view dv_src = dense_view(c, owner, dv_part, a->dtype, hkv, dv);
            if (step == 0) {
                TRY(be->copy(dk_dst, dk_src, kshape, stream));
                TRY(be->copy(dv_dst, dv_src, vshape, stream));
            } else {
                TRY(be->accumulate(dk_dst, dk_src, kshape, stream));
                TRY(be->accumulate(dv_dst, dv_src, vshape, stream));
            }
        }
    }
    /* the last accumulator belongs to rank r+1: one more hop takes it home and brings ours */
    char *final_dkv = c->ws + c->off_dkv[(c->world - 1) % 2];
    if (c->world > 1) {
        char *home = c->ws + c->off_dkv[c->world % 2];
        TRY(exchange(c, final_dkv, home, c->dkv_slot, c->world, "dK/dV"));
        TRY(wait_exchanges(c, c->world));
        final_dkv = home;
    }
    TRY(be->copy(user_view(c, a->dq, a->dq_batch_stride, a->dq_row_stride, a->dq_head_stride),
                 dense_view(c, r, dq_acc, FA_DTYPE_F32, hq, d), shard_shape(c, r, hq, d), stream));
    TRY(be->copy(user_view(c, a->dk, a->dk_batch_stride, a->dk_row_stride, a->dk_head_stride),
                 dense_view(c, r, final_dkv, FA_DTYPE_F32, hkv, d), shard_shape(c, r, hkv, d), stream));
    TRY(be->copy(user_view(c, a->dv, a->dv_batch_stride, a->dv_row_stride, a->dv_head_stride),
                 dense_view(c, r, final_dkv + c->dk_region, FA_DTYPE_F32, hkv, dv),
                 shard_shape(c, r, hkv, dv), stream));
done:
    return status;
}

fa_status fa_ring_backward(const fa_ring_params *r) {
    ring_ctx c;
    fa_status s = prepare(r, PASS_BACKWARD, &c);
    if (s == FA_OK) s = setup(&c);
    if (s == FA_OK) s = run_backward(&c);
    teardown(&c);
    return s;
}

/* ---- NCCL transport ------------------------------------------------------------------------- */

fa_status fa_ring_comm_nccl(void *nccl_comm, void *comm_stream, fa_ring_comm *comm, int *rank,
                            int *world_size) {
    return fa_cuda_ring_comm_nccl(nccl_comm, comm_stream, comm, rank, world_size);
}

void fa_ring_comm_nccl_release(fa_ring_comm *comm) { fa_cuda_ring_comm_nccl_release(comm); }

int fa_ring_nccl_built(void) { return fa_cuda_ring_nccl_built(); }
