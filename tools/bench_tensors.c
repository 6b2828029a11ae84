/*
 * bench_tensors.c: the FLOPs, sizes, fa_params and host tensors of one benchmark case (bench_case.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_case.h"
#include "cli.h"
#include "tensors.h"

static int64_t visible_pairs(const bench_case *c) {
    int64_t pairs = 0;
    for (int64_t i = 0; i < c->sq; i++) {
        int64_t diag = i + c->sk - c->sq, lo = 0, hi = c->sk;
        int64_t right = c->causal ? 0 : c->window_right; /* causal: right = min(right, 0) */
        if (c->window_left >= 0 && diag - c->window_left > lo) lo = diag - c->window_left;
        if (right >= 0 && diag + right + 1 < hi) hi = diag + right + 1;
        if (hi > lo) pairs += hi - lo;
    }
    return pairs;
}

double bench_flops(const bench_case *c) {
    double pairs = (double)c->sq * (double)c->sk;
    if (c->use_window)
        pairs = (double)visible_pairs(c);
    else if (c->causal)
        pairs *= 0.5;
    double forward = 2.0 * (double)c->b * (double)c->hq * pairs * (double)(c->d + c->dv);
    return c->mode == BENCH_BWD ? 2.5 * forward : c->mode == BENCH_FWDBWD ? 3.5 * forward : forward;
}

int bench_result_start(const bench_case *c, bench_result *r) {
    memset(r, 0, sizeof *r);
    r->flops = bench_flops(c);
    r->max_abs_err = -1.0;
    if (c->impl == IMPL_STANDARD && c->mode != BENCH_FWD) {
        r->status = BENCH_SKIPPED;
        snprintf(r->note, sizeof r->note, "standard attention is forward-only (not timed)");
        return 1;
    }
    return 0;
}

void bench_case_params(const bench_case *c, fa_params *p) {
    memset(p, 0, sizeof *p);
    p->device = c->device;
    p->dtype = c->dtype;
    p->batch = c->b;
    p->seqlen_q = c->sq;
    p->seqlen_k = c->sk;
    p->heads_q = c->hq;
    p->heads_kv = c->hkv;
    p->head_dim = c->d;
    p->head_dim_v = c->dv;
    p->causal = c->causal;
    p->use_window = c->use_window;
    p->window_left = c->window_left;
    p->window_right = c->window_right;
    p->num_threads = c->threads;
    p->deterministic = c->deterministic;
    p->dropout_p = c->dropout_p;
    p->dropout_seed = c->seed;
}

bench_sizes bench_case_sizes(const bench_case *c) {
    bench_sizes n;
    n.q = (size_t)(c->b * c->sq * c->hq * c->d);
    n.k = (size_t)(c->b * c->sk * c->hkv * c->d);
    n.v = (size_t)(c->b * c->sk * c->hkv * c->dv);
    n.o = (size_t)(c->b * c->sq * c->hq * c->dv);
    n.lse = (size_t)(c->b * c->hq * c->sq);
    return n;
}

void bench_free_tensors(bench_tensors *t) {
    free(t->q);
    free(t->k);
    free(t->v);
    free(t->o);
    free(t->lse);
    free(t->dout);
    free(t->dq);
    free(t->dk);
    free(t->dv);
    memset(t, 0, sizeof *t);
}

int bench_alloc_tensors(const bench_case *c, fa_params *p, bench_tensors *t) {
    bench_sizes n = bench_case_sizes(c);
    size_t es = cli_dtype_size(c->dtype);
    int backward = c->mode != BENCH_FWD;
    memset(t, 0, sizeof *t);
    t->q = tool_alloc_touched(n.q * es);
    t->k = tool_alloc_touched(n.k * es);
    t->v = tool_alloc_touched(n.v * es);
    t->o = tool_alloc_touched(n.o * es);
    t->lse = tool_alloc_touched(n.lse * sizeof(float));
    if (backward) {
        t->dout = tool_alloc_touched(n.o * es);
        t->dq = tool_alloc_touched(n.q * es);
        t->dk = tool_alloc_touched(n.k * es);
        t->dv = tool_alloc_touched(n.v * es);
    }
    if (!t->q || !t->k || !t->v || !t->o || !t->lse ||
        (backward && (!t->dout || !t->dq || !t->dk || !t->dv))) {
        bench_free_tensors(t);
        return 0;
    }
    tool_rng rng = tool_rng_seeded(c->seed);
    tool_fill_normal(t->q, c->dtype, n.q, 1.0f, 0.0f, &rng);
    tool_fill_normal(t->k, c->dtype, n.k, 1.0f, 0.0f, &rng);
    tool_fill_normal(t->v, c->dtype, n.v, 1.0f, 0.5f, &rng);
    if (backward) tool_fill_normal(t->dout, c->dtype, n.o, 1.0f, 0.0f, &rng);
    bench_case_params(c, p);
    p->q = t->q;
    p->k = t->k;
    p->v = t->v;
    p->o = t->o;
    p->lse = t->lse;
    p->dout = t->dout;
    p->dq = t->dq;
    p->dk = t->dk;
    p->dv = t->dv;
    fa_set_contiguous_strides(p);
    return 1;
}
