/*
 * tsan_callers.c: concurrent callers under ThreadSanitizer. Eight threads call fa_forward,
 * fa_backward, fa_kvcache_forward and fa_merge_states at once, each on its own problem (dtype,
 * sizes, features and num_threads differ per thread), several rounds each; every result must be
 * bitwise identical to the same call made alone beforehand, and TSan must report no race in the
 * library (its worker pool, per-thread error messages, kernel selection). Built with
 * -fsanitize=thread in its own directory (tests/tsan/tsan.mk); `make test` runs it.
 * Prints "N passed, N failed" (one count per thread and call kind).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

enum { THREADS = 8, ROUNDS = 3 };

typedef struct job {
    int id;
    fa_params fwd, bwd, kv;
    fa_merge_params merge;
    void *buffers[32];
    int nbuf;
    size_t o_bytes, dq_bytes, dk_bytes, kv_o_bytes, merge_o_bytes;
    void *ref_o, *ref_dq, *ref_dk, *ref_dv, *ref_kv_o, *ref_merge_o;
    float *ref_lse;
    int passed, failed;
} job;

static uint32_t rng(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s;
}

static void *buf(job *j, size_t bytes, uint32_t *s, int fill) {
    uint8_t *p = calloc(1, bytes + 16);
    if (!p) abort();
    if (fill)
        for (size_t i = 0; i + 1 < bytes; i += 2) {
            uint16_t v = (uint16_t)(0x3800 + (rng(s) & 0x3ff)); /* f16/bf16 halves in a sane range */
            memcpy(p + i, &v, 2);
        }
    j->buffers[j->nbuf++] = p;
    return p;
}

static void *copy_of(const void *src, size_t bytes) {
    void *p = malloc(bytes);
    if (!p) abort();
    memcpy(p, src, bytes);
    return p;
}

static void setup(job *j) {
    uint32_t s = 12345u + 977u * (uint32_t)j->id;
    const fa_dtype dtype = j->id % 3 == 0 ? FA_DTYPE_F32 : j->id % 3 == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    const size_t e = dtype == FA_DTYPE_F32 ? 4 : 2;
    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = dtype;
    p.batch = 1 + j->id % 2;
    p.seqlen_q = 40 + 13 * j->id;
    p.seqlen_k = 50 + 7 * j->id;
    p.heads_kv = 1 + j->id % 2;
    p.heads_q = p.heads_kv * (1 + j->id % 3);
    p.head_dim = 16 + 8 * (j->id % 3);
    p.causal = j->id % 2;
    p.softcap = j->id == 5 ? 7.0f : 0.0f;
    p.num_threads = 1 + j->id % 3;
    const int64_t nq = p.batch * p.seqlen_q * p.heads_q * p.head_dim, nk = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
    p.q = buf(j, nq * e, &s, 1);
    p.k = buf(j, nk * e, &s, 1);
    p.v = buf(j, nk * e, &s, 1);
    p.o = buf(j, nq * e, &s, 0);
    p.lse = buf(j, p.batch * p.heads_q * p.seqlen_q * 4, &s, 0);
    p.dout = buf(j, nq * e, &s, 1);
    p.dq = buf(j, nq * e, &s, 0);
    p.dk = buf(j, nk * e, &s, 0);
    p.dv = buf(j, nk * e, &s, 0);
    fa_set_contiguous_strides(&p);
    j->fwd = p;
    j->bwd = p;
    j->o_bytes = (size_t)nq * e;
    j->dq_bytes = (size_t)nq * e;
    j->dk_bytes = (size_t)nk * e;
    /* KV cache: decoding against a cache of 300, appending nothing */
    fa_params k;
    memset(&k, 0, sizeof k);
    k.dtype = dtype;
    k.batch = 2;
    k.seqlen_q = 1 + j->id % 2;
    k.seqlen_k = 300;
    k.heads_kv = 2;
    k.heads_q = 8;
    k.head_dim = 32;
    k.num_threads = 2;
    k.num_splits = j->id % 2 ? 0 : 3;
    const int64_t kq = k.batch * k.seqlen_q * k.heads_q * k.head_dim, kc = k.batch * k.seqlen_k * k.heads_kv * k.head_dim;
    k.q = buf(j, kq * e, &s, 1);
    k.k = buf(j, kc * e, &s, 1);
    k.v = buf(j, kc * e, &s, 1);
    k.o = buf(j, kq * e, &s, 0);
    fa_set_contiguous_strides(&k);
    j->kv = k;
    j->kv_o_bytes = (size_t)kq * e;
    /* merge: 5 states of 64 rows */
    fa_merge_params m;
    memset(&m, 0, sizeof m);
    m.parts_dtype = FA_DTYPE_F32;
    m.out_dtype = dtype;
    m.num_states = 5, m.rows = 64, m.heads = 4, m.head_dim_v = 32;
    m.num_threads = 2;
    float *parts = buf(j, 5 * 64 * 4 * 32 * 4, &s, 0), *lse_parts = buf(j, 5 * 4 * 64 * 4, &s, 0);
    for (int i = 0; i < 5 * 64 * 4 * 32; i++) parts[i] = (float)(rng(&s) % 1000) / 250.0f - 2.0f;
    for (int i = 0; i < 5 * 4 * 64; i++) lse_parts[i] = (float)(rng(&s) % 100) / 20.0f;
    m.o_parts = parts, m.o_parts_state_stride = 64 * 4 * 32, m.o_parts_row_stride = 4 * 32, m.o_parts_head_stride = 32;
    m.lse_parts = lse_parts, m.lse_parts_state_stride = 4 * 64, m.lse_parts_head_stride = 64, m.lse_parts_row_stride = 1;
    m.o = buf(j, 64 * 4 * 32 * e, &s, 0), m.o_row_stride = 4 * 32, m.o_head_stride = 32;
    j->merge = m;
    j->merge_o_bytes = 64 * 4 * 32 * e;
}

/* alone: the reference results */
static void reference(job *j) {
    if (fa_forward(&j->fwd) || fa_backward(&j->bwd) || fa_kvcache_forward(&j->kv) || fa_merge_states(&j->merge)) {
        fprintf(stderr, "tsan_callers: reference call of thread %d failed: %s\n", j->id, fa_last_error());
        exit(1);
    }
    j->ref_o = copy_of(j->fwd.o, j->o_bytes);
    j->ref_lse = copy_of(j->fwd.lse, (size_t)(j->fwd.batch * j->fwd.heads_q * j->fwd.seqlen_q) * 4);
    j->ref_dq = copy_of(j->bwd.dq, j->dq_bytes);
    j->ref_dk = copy_of(j->bwd.dk, j->dk_bytes);
    j->ref_dv = copy_of(j->bwd.dv, j->dk_bytes);
    j->ref_kv_o = copy_of(j->kv.o, j->kv_o_bytes);
    j->ref_merge_o = copy_of(j->merge.o, j->merge_o_bytes);
}

static void count(job *j, int ok, const char *what, int round) {
    if (ok) {
        j->passed++;
    } else {
        j->failed++;
        printf("FAIL thread %d round %d: %s differs from the single-threaded call (%s)\n", j->id, round, what,
               fa_last_error());
    }
}

static void *worker(void *arg) {
    job *j = arg;
    for (int round = 0; round < ROUNDS; round++) {
        memset(j->fwd.o, 0, j->o_bytes);
        memset(j->bwd.dq, 0, j->dq_bytes);
        memset(j->kv.o, 0, j->kv_o_bytes);
        memset(j->merge.o, 0, j->merge_o_bytes);
        /* the forward rewrites o and lse, which the backward reads: same values as the reference */
        int ok = fa_forward(&j->fwd) == FA_OK && !memcmp(j->fwd.o, j->ref_o, j->o_bytes) &&
                 !memcmp(j->fwd.lse, j->ref_lse, (size_t)(j->fwd.batch * j->fwd.heads_q * j->fwd.seqlen_q) * 4);
        count(j, ok, "fa_forward", round);
        ok = fa_backward(&j->bwd) == FA_OK && !memcmp(j->bwd.dq, j->ref_dq, j->dq_bytes) &&
             !memcmp(j->bwd.dk, j->ref_dk, j->dk_bytes) && !memcmp(j->bwd.dv, j->ref_dv, j->dk_bytes);
        count(j, ok, "fa_backward", round);
        ok = fa_kvcache_forward(&j->kv) == FA_OK && !memcmp(j->kv.o, j->ref_kv_o, j->kv_o_bytes);
        count(j, ok, "fa_kvcache_forward", round);
        ok = fa_merge_states(&j->merge) == FA_OK && !memcmp(j->merge.o, j->ref_merge_o, j->merge_o_bytes);
        count(j, ok, "fa_merge_states", round);
        /* a failing call on this thread leaves its own message, whatever the others do */
        fa_params bad = j->fwd;
        bad.head_dim = -1 - j->id;
        char want[32];
        snprintf(want, sizeof want, "head_dim = %d", -1 - j->id);
        ok = fa_forward(&bad) == FA_ERR_HEAD_DIM && strstr(fa_last_error(), want) != NULL;
        count(j, ok, "the per-thread error message", round);
    }
    return NULL;
}

int main(void) {
    static job jobs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t].id = t;
        setup(&jobs[t]);
        reference(&jobs[t]);
    }
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&threads[t], NULL, worker, &jobs[t]) != 0) return 1;
    int passed = 0, failed = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        passed += jobs[t].passed;
        failed += jobs[t].failed;
        for (int b = 0; b < jobs[t].nbuf; b++) free(jobs[t].buffers[b]);
        free(jobs[t].ref_o), free(jobs[t].ref_lse), free(jobs[t].ref_dq), free(jobs[t].ref_dk), free(jobs[t].ref_dv);
        free(jobs[t].ref_kv_o), free(jobs[t].ref_merge_o);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
