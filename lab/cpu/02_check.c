/*
 * lab/cpu/02_check.c: correctness checker for the CPU engine (forward, backward, standard).
 *
 * For each case: random inputs (v offset by +0.5), the library's result, a float64 reference
 * and a "naive fp32" materialised computation (every operation rounded to fp32, outputs rounded
 * to the dtype). Rule (FlashAttention's): max|ours - ref64| <= 2·max|naive32 - ref64| + floor.
 * Also: bitwise equality across thread counts (1, 2, 3) and across repeated runs, every ISA.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc lab/cpu/02_check.c build-cpu/libflashattn.a -lm -pthread
 *   ./a.out [quick]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_convert.h"
#include "flashattn.h"

/* ---- random numbers ----------------------------------------------------------------------- */
static uint64_t rng_state = 88172645463325252ull;
static double uniform01(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double randn(void) { return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()); }

/* ---- strided tensors ---------------------------------------------------------------------- */
typedef struct tensor {
    char *data;
    int64_t bs, rs, hs, dim;
    fa_dtype dt;
    int varlen;
} tensor;

static size_t esize(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 4 : 2; }

static tensor make_tensor(int64_t batch, int64_t rows, int64_t heads, int64_t dim, fa_dtype dt, int padded,
                          int varlen) {
    tensor t;
    t.dt = dt;
    t.dim = dim;
    t.varlen = varlen;
    t.hs = padded ? dim + 3 : dim;
    t.rs = padded ? heads * t.hs + 5 : heads * t.hs;
    t.bs = (padded ? rows * t.rs + 7 : rows * t.rs) + (rows == 0 ? heads * t.hs : 0);
    int64_t elems = (varlen ? 1 : batch) * t.bs + 64;
    t.data = (char *)calloc((size_t)elems, esize(dt));
    /* fill with NaN-ish garbage so unwritten outputs show up */
    memset(t.data, 0x7f, (size_t)elems * esize(dt));
    return t;
}

static int64_t toff(const tensor *t, int64_t b, int64_t row, int64_t h, int64_t c) {
    return (t->varlen ? 0 : b * t->bs) + row * t->rs + h * t->hs + c;
}

static double tget(const tensor *t, int64_t b, int64_t row, int64_t h, int64_t c) {
    int64_t o = toff(t, b, row, h, c);
    if (t->dt == FA_DTYPE_F32) return ((float *)t->data)[o];
    if (t->dt == FA_DTYPE_F16) return fa_f16_to_f32(((uint16_t *)t->data)[o]);
    return fa_bf16_to_f32(((uint16_t *)t->data)[o]);
}

static void tset(tensor *t, int64_t b, int64_t row, int64_t h, int64_t c, double x) {
    int64_t o = toff(t, b, row, h, c);
    if (t->dt == FA_DTYPE_F32) ((float *)t->data)[o] = (float)x;
    else if (t->dt == FA_DTYPE_F16) ((uint16_t *)t->data)[o] = fa_f32_to_f16((float)x);
    else ((uint16_t *)t->data)[o] = fa_f32_to_bf16((float)x);
}

/* ---- one case --------------------------------------------------------------------------------- */
typedef struct cfg {
    const char *name;
    int b, sq, sk, hq, hkv, d, dv;
    fa_dtype dt;
    int causal, use_window, wl, wr;
    float softcap;
    int alibi; /* 0 none, 1 per head, 2 per batch × head */
    int sink;
    int varlen;
    int padded;
    int lse_null;
    float scale;
} cfg;

typedef struct seqs {
    int32_t cu_q[9], cu_k[9];
    int len_q[8], len_k[8], start_q[8], start_k[8];
} seqs;

static double R(double x, int f32) { return f32 ? (double)(float)x : x; }

static int total_fail = 0, total_pass = 0;

static void key_range(int64_t i, int64_t lq, int64_t lk, int wl, int wr, int64_t *lo, int64_t *hi) {
    int64_t diag = i + lk - lq, a = 0, b = lk;
    if (wl >= 0 && diag - wl > a) a = diag - wl;
    if (wr >= 0 && diag + wr + 1 < b) b = diag + wr + 1;
    *lo = a;
    *hi = b;
}

/* Reference forward + backward for one (b, h); f32 = 1 rounds every op to fp32 (naive). Results:
 * o_ref [lq][dv], lse_ref [lq], dq [lq][d]; dk, dv accumulated into [lk][d] / [lk][dv]. */
typedef struct refout {
    double *o, *lse, *dq, *dk, *dv, dsink;
} refout;

static void reference_head(const cfg *c, const fa_params *p, int64_t b, int64_t h, const seqs *sq, tensor *q, tensor *k,
                           tensor *v, tensor *o_lib, tensor *dO, int f32, refout *out) {
    int64_t lq = sq->len_q[b], lk = sq->len_k[b], qs = sq->start_q[b], ks = sq->start_k[b];
    int64_t kvh = h / (c->hq / c->hkv);
    int64_t d = c->d, dv = c->dv;
    int wl = p->use_window ? p->window_left : -1, wr = p->use_window ? p->window_right : -1;
    if (wl < 0) wl = -1;
    if (wr < 0) wr = -1;
    if (p->causal && (wr < 0 || wr > 0)) wr = 0;
    double scale = p->softmax_scale ? p->softmax_scale : 1.0 / sqrt((double)d);
    if (f32) scale = (float)scale;
    double slope = p->alibi_slopes ? p->alibi_slopes[b * p->alibi_batch_stride + h] : 0.0;
    double sink = p->sink_logits ? p->sink_logits[h] : -INFINITY;
    double *s = (double *)malloc(sizeof(double) * (size_t)(lk + 1));
    double *th = (double *)malloc(sizeof(double) * (size_t)(lk + 1));
    double *pr = (double *)malloc(sizeof(double) * (size_t)(lk + 1));
    out->dsink = 0;
    for (int64_t i = 0; i < lq; i++) {
        int64_t lo, hi;
        key_range(i, lq, lk, wl, wr, &lo, &hi);
        double m = sink;
        for (int64_t j = lo; j < hi; j++) {
            double acc = 0;
            for (int64_t c2 = 0; c2 < d; c2++)
                acc = R(acc + R(tget(q, b, qs + i, h, c2) * tget(k, b, ks + j, kvh, c2), f32), f32);
            double x = R(acc * scale, f32);
            if (p->softcap > 0) {
                double t = R(tanh(R(x / p->softcap, f32)), f32);
                th[j] = t;
                x = R(p->softcap * t, f32);
            }
            if (p->alibi_slopes) {
                double dist = (double)llabs(i + lk - lq - j);
                x = R(x + R(-slope * dist, f32), f32);
            }
            s[j] = x;
            if (x > m) m = x;
        }
        double sum = 0, lse;
        for (int64_t j = lo; j < hi; j++) {
            pr[j] = R(exp(R(s[j] - m, f32)), f32);
            sum = R(sum + pr[j], f32);
        }
        if (p->sink_logits) sum = R(sum + R(exp(R(sink - m, f32)), f32), f32);
        lse = (m == -INFINITY || sum == 0) ? -INFINITY : R(m + R(log(sum), f32), f32);
        for (int64_t c2 = 0; c2 < dv; c2++) out->o[i * dv + c2] = 0;
        for (int64_t j = lo; j < hi; j++) {
            double pj = R(pr[j] / sum, f32);
            for (int64_t c2 = 0; c2 < dv; c2++)
                out->o[i * dv + c2] = R(out->o[i * dv + c2] + R(pj * tget(v, b, ks + j, kvh, c2), f32), f32);
        }
        out->lse[i] = lse;
        if (!dO) continue;
        /* backward of row i */
        double D = 0;
        for (int64_t c2 = 0; c2 < dv; c2++) {
            double oi = f32 ? tget(o_lib, b, qs + i, h, c2) : out->o[i * dv + c2];
            D = R(D + R(tget(dO, b, qs + i, h, c2) * oi, f32), f32);
        }
        if (p->sink_logits && lse != -INFINITY) out->dsink -= exp(sink - lse) * D;
        for (int64_t c2 = 0; c2 < d; c2++) out->dq[i * d + c2] = 0;
        if (lse == -INFINITY) continue;
        for (int64_t j = lo; j < hi; j++) {
            double pj = R(exp(R(s[j] - lse, f32)), f32);
            double dp = 0;
            for (int64_t c2 = 0; c2 < dv; c2++)
                dp = R(dp + R(tget(dO, b, qs + i, h, c2) * tget(v, b, ks + j, kvh, c2), f32), f32);
            double ds = R(pj * R(dp - D, f32), f32);
            if (p->softcap > 0) ds = R(ds * R(1 - R(th[j] * th[j], f32), f32), f32);
            ds = R(ds * scale, f32);
            for (int64_t c2 = 0; c2 < dv; c2++)
                out->dv[j * dv + c2] = R(out->dv[j * dv + c2] + R(pj * tget(dO, b, qs + i, h, c2), f32), f32);
            for (int64_t c2 = 0; c2 < d; c2++) {
                out->dq[i * d + c2] = R(out->dq[i * d + c2] + R(ds * tget(k, b, ks + j, kvh, c2), f32), f32);
                out->dk[j * d + c2] = R(out->dk[j * d + c2] + R(ds * tget(q, b, qs + i, h, c2), f32), f32);
            }
        }
    }
    free(s);
    free(th);
    free(pr);
}

typedef struct errstat {
    double ours, naive, maxref, sq_ours, sq_naive;
    int bad_inf;
} errstat;

static void acc_err(errstat *e, double ours, double naive, double ref) {
    if (isinf(ref) || isinf(ours) || isinf(naive)) {
        if (!(ours == ref)) e->bad_inf++;
        return;
    }
    if (isnan(ours) || isnan(ref)) {
        e->bad_inf++;
        return;
    }
    double a = fabs(ours - ref), n = fabs(naive - ref);
    e->sq_ours += a * a;
    e->sq_naive += n * n;
    if (a > e->ours) e->ours = a;
    if (n > e->naive) e->naive = n;
    if (fabs(ref) > e->maxref) e->maxref = fabs(ref);
}

static int judge(const char *cname, const char *what, errstat *e, fa_dtype dt) {
    double floor_abs = (dt == FA_DTYPE_F32 ? 4e-6 : 1e-4) * (e->maxref > 1 ? e->maxref : 1);
    int ok = e->bad_inf == 0 && e->ours <= 2 * e->naive + floor_abs;
    if (!ok || getenv("VERBOSE"))
        printf("  %s %-6s %-5s ours %.3e naive %.3e (ratio %.2f, rms ratio %.2f) maxref %.2e inf-mismatch %d\n",
               ok ? "ok  " : "FAIL", what, cname, e->ours, e->naive, e->naive > 0 ? e->ours / e->naive : 0.0,
               e->sq_naive > 0 ? sqrt(e->sq_ours / e->sq_naive) : 0.0, e->maxref, e->bad_inf);
    return ok;
}

static int run_case(const cfg *c, int do_backward) {
    seqs sq;
    memset(&sq, 0, sizeof sq);
    int64_t total_q = 0, total_k = 0;
    static const int vl_q[8] = {5, 0, 17, 1, 70, 3, 0, 33}, vl_k[8] = {9, 3, 0, 20, 70, 130, 4, 33};
    for (int b = 0; b < c->b; b++) {
        sq.len_q[b] = c->varlen ? (vl_q[b] * c->sq) / 70 : c->sq;
        sq.len_k[b] = c->varlen ? (vl_k[b] * c->sk) / 70 : c->sk;
        sq.start_q[b] = c->varlen ? (int)total_q : 0;
        sq.start_k[b] = c->varlen ? (int)total_k : 0;
        sq.cu_q[b] = (int32_t)total_q;
        sq.cu_k[b] = (int32_t)total_k;
        total_q += sq.len_q[b];
        total_k += sq.len_k[b];
    }
    sq.cu_q[c->b] = (int32_t)total_q;
    sq.cu_k[c->b] = (int32_t)total_k;
    int64_t max_q = 0, max_k = 0;
    for (int b = 0; b < c->b; b++) {
        if (sq.len_q[b] > max_q) max_q = sq.len_q[b];
        if (sq.len_k[b] > max_k) max_k = sq.len_k[b];
    }
    if (!c->varlen) {
        max_q = c->sq;
        max_k = c->sk;
    }
    int64_t rows_q = c->varlen ? total_q + 2 : max_q, rows_k = c->varlen ? total_k + 1 : max_k;

    tensor q = make_tensor(c->b, rows_q, c->hq, c->d, c->dt, c->padded, c->varlen);
    tensor k = make_tensor(c->b, rows_k, c->hkv, c->d, c->dt, c->padded, c->varlen);
    tensor v = make_tensor(c->b, rows_k, c->hkv, c->dv, c->dt, c->padded, c->varlen);
    tensor o = make_tensor(c->b, rows_q, c->hq, c->dv, c->dt, c->padded, c->varlen);
    tensor dO = make_tensor(c->b, rows_q, c->hq, c->dv, c->dt, c->padded, c->varlen);
    tensor dq = make_tensor(c->b, rows_q, c->hq, c->d, c->dt, c->padded, c->varlen);
    tensor dk = make_tensor(c->b, rows_k, c->hkv, c->d, c->dt, c->padded, c->varlen);
    tensor dv = make_tensor(c->b, rows_k, c->hkv, c->dv, c->dt, c->padded, c->varlen);
    int nb = c->varlen ? 1 : c->b;
    for (int b = 0; b < nb; b++) {
        for (int64_t r = 0; r < rows_q; r++)
            for (int h = 0; h < c->hq; h++) {
                for (int x = 0; x < c->d; x++) tset(&q, b, r, h, x, randn());
                for (int x = 0; x < c->dv; x++) tset(&dO, b, r, h, x, randn());
            }
        for (int64_t r = 0; r < rows_k; r++)
            for (int h = 0; h < c->hkv; h++) {
                for (int x = 0; x < c->d; x++) tset(&k, b, r, h, x, randn());
                for (int x = 0; x < c->dv; x++) tset(&v, b, r, h, x, randn() + 0.5);
            }
    }
    float slopes[64], sinks[16];
    for (int i = 0; i < 64; i++) slopes[i] = (float)(0.05 + 0.3 * uniform01());
    for (int i = 0; i < 16; i++) sinks[i] = (float)(randn() + 1.0);
    int64_t lse_n = (int64_t)c->hq * (c->varlen ? total_q : c->b * max_q);
    float *lse = (float *)malloc(sizeof(float) * (size_t)(lse_n + 1));
    float *lse2 = (float *)malloc(sizeof(float) * (size_t)(lse_n + 1));
    float dsink[16], dsink2[16];

    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = c->dt;
    p.batch = c->b;
    p.seqlen_q = max_q;
    p.seqlen_k = max_k;
    p.heads_q = c->hq;
    p.heads_kv = c->hkv;
    p.head_dim = c->d;
    p.head_dim_v = c->dv == c->d ? 0 : c->dv;
    p.q = q.data;
    p.k = k.data;
    p.v = v.data;
    p.o = o.data;
    p.lse = c->lse_null && !do_backward ? NULL : lse;
    p.q_batch_stride = q.bs, p.q_row_stride = q.rs, p.q_head_stride = q.hs;
    p.k_batch_stride = k.bs, p.k_row_stride = k.rs, p.k_head_stride = k.hs;
    p.v_batch_stride = v.bs, p.v_row_stride = v.rs, p.v_head_stride = v.hs;
    p.o_batch_stride = o.bs, p.o_row_stride = o.rs, p.o_head_stride = o.hs;
    if (c->varlen) {
        p.cu_seqlens_q = sq.cu_q;
        p.cu_seqlens_k = sq.cu_k;
        p.total_q = total_q;
        p.total_k = total_k;
    }
    p.softmax_scale = c->scale;
    p.causal = c->causal;
    p.use_window = c->use_window;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.softcap = c->softcap;
    if (c->alibi) {
        p.alibi_slopes = slopes;
        p.alibi_batch_stride = c->alibi == 2 ? c->hq + 1 : 0;
    }
    if (c->sink) p.sink_logits = sinks;
    p.dout = dO.data;
    p.dq = dq.data;
    p.dk = dk.data;
    p.dv = dv.data;
    p.dsink = c->sink ? dsink : NULL;
    p.do_batch_stride = dO.bs, p.do_row_stride = dO.rs, p.do_head_stride = dO.hs;
    p.dq_batch_stride = dq.bs, p.dq_row_stride = dq.rs, p.dq_head_stride = dq.hs;
    p.dk_batch_stride = dk.bs, p.dk_row_stride = dk.rs, p.dk_head_stride = dk.hs;
    p.dv_batch_stride = dv.bs, p.dv_row_stride = dv.rs, p.dv_head_stride = dv.hs;
    p.num_threads = 2;

    int ok = 1;
    fa_status st = fa_forward(&p);
    if (st != FA_OK) {
        printf("FAIL %s: fa_forward: %s\n", c->name, fa_last_error());
        return 0;
    }
    if (do_backward) {
        st = fa_backward(&p);
        if (st != FA_OK) {
            printf("FAIL %s: fa_backward: %s\n", c->name, fa_last_error());
            return 0;
        }
    }

    /* references */
    errstat e_o = {0}, e_lse = {0}, e_dq = {0}, e_dk = {0}, e_dv = {0}, e_ds = {0};
    double *dk64 = calloc((size_t)(max_k * c->d + 1), 8), *dv64 = calloc((size_t)(max_k * c->dv + 1), 8);
    double *dk32 = calloc((size_t)(max_k * c->d + 1), 8), *dv32 = calloc((size_t)(max_k * c->dv + 1), 8);
    double dsink64[16] = {0}, dsink32[16] = {0};
    refout r64, r32;
    r64.o = malloc(8 * (size_t)(max_q * c->dv + 1));
    r64.lse = malloc(8 * (size_t)(max_q + 1));
    r64.dq = malloc(8 * (size_t)(max_q * c->d + 1));
    r32.o = malloc(8 * (size_t)(max_q * c->dv + 1));
    r32.lse = malloc(8 * (size_t)(max_q + 1));
    r32.dq = malloc(8 * (size_t)(max_q * c->d + 1));
    int group = c->hq / c->hkv;
    for (int b = 0; b < c->b; b++) {
        for (int kvh = 0; kvh < c->hkv; kvh++) {
            memset(dk64, 0, 8 * (size_t)(max_k * c->d + 1));
            memset(dv64, 0, 8 * (size_t)(max_k * c->dv + 1));
            memset(dk32, 0, 8 * (size_t)(max_k * c->d + 1));
            memset(dv32, 0, 8 * (size_t)(max_k * c->dv + 1));
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                r64.dk = dk64, r64.dv = dv64, r32.dk = dk32, r32.dv = dv32;
                reference_head(c, &p, b, h, &sq, &q, &k, &v, &o, do_backward ? &dO : NULL, 0, &r64);
                reference_head(c, &p, b, h, &sq, &q, &k, &v, &o, do_backward ? &dO : NULL, 1, &r32);
                dsink64[h] += r64.dsink;
                dsink32[h] += r32.dsink;
                for (int i = 0; i < sq.len_q[b]; i++) {
                    for (int x = 0; x < c->dv; x++) {
                        double ours = tget(&o, b, sq.start_q[b] + i, h, x);
                        double naive = r32.o[i * c->dv + x];
                        /* naive output rounded to the dtype like a real store */
                        if (c->dt == FA_DTYPE_F16) naive = fa_f16_to_f32(fa_f32_to_f16((float)naive));
                        if (c->dt == FA_DTYPE_BF16) naive = fa_bf16_to_f32(fa_f32_to_bf16((float)naive));
                        acc_err(&e_o, ours, naive, r64.o[i * c->dv + x]);
                    }
                    if (p.lse) {
                        int64_t lo = c->varlen ? (int64_t)h * total_q + sq.start_q[b] + i
                                               : ((int64_t)b * c->hq + h) * max_q + i;
                        acc_err(&e_lse, lse[lo], r32.lse[i], r64.lse[i]);
                    }
                    if (do_backward)
                        for (int x = 0; x < c->d; x++) {
                            double naive = r32.dq[i * c->d + x];
                            if (c->dt == FA_DTYPE_F16) naive = fa_f16_to_f32(fa_f32_to_f16((float)naive));
                            if (c->dt == FA_DTYPE_BF16) naive = fa_bf16_to_f32(fa_f32_to_bf16((float)naive));
                            acc_err(&e_dq, tget(&dq, b, sq.start_q[b] + i, h, x), naive, r64.dq[i * c->d + x]);
                        }
                }
            }
            if (do_backward)
                for (int j = 0; j < sq.len_k[b]; j++) {
                    for (int x = 0; x < c->d; x++) {
                        double naive = dk32[j * c->d + x];
                        if (c->dt == FA_DTYPE_F16) naive = fa_f16_to_f32(fa_f32_to_f16((float)naive));
                        if (c->dt == FA_DTYPE_BF16) naive = fa_bf16_to_f32(fa_f32_to_bf16((float)naive));
                        acc_err(&e_dk, tget(&dk, b, sq.start_k[b] + j, kvh, x), naive, dk64[j * c->d + x]);
                    }
                    for (int x = 0; x < c->dv; x++) {
                        double naive = dv32[j * c->dv + x];
                        if (c->dt == FA_DTYPE_F16) naive = fa_f16_to_f32(fa_f32_to_f16((float)naive));
                        if (c->dt == FA_DTYPE_BF16) naive = fa_bf16_to_f32(fa_f32_to_bf16((float)naive));
                        acc_err(&e_dv, tget(&dv, b, sq.start_k[b] + j, kvh, x), naive, dv64[j * c->dv + x]);
                    }
                }
        }
    }
    ok &= judge(c->name, "o", &e_o, c->dt);
    if (p.lse) ok &= judge(c->name, "lse", &e_lse, FA_DTYPE_F32);
    if (do_backward) {
        ok &= judge(c->name, "dq", &e_dq, c->dt);
        ok &= judge(c->name, "dk", &e_dk, c->dt);
        ok &= judge(c->name, "dv", &e_dv, c->dt);
        if (c->sink) {
            for (int h = 0; h < c->hq; h++) acc_err(&e_ds, dsink[h], dsink32[h], dsink64[h]);
            ok &= judge(c->name, "dsink", &e_ds, FA_DTYPE_F32);
        }
    }

    /* standard baseline: same outputs */
    {
        tensor o2 = make_tensor(c->b, rows_q, c->hq, c->dv, c->dt, c->padded, c->varlen);
        fa_params ps = p;
        ps.o = o2.data;
        ps.lse = p.lse ? lse2 : NULL;
        if (fa_standard_forward(&ps) != FA_OK) {
            printf("FAIL %s: standard: %s\n", c->name, fa_last_error());
            ok = 0;
        } else {
            errstat e = {0};
            for (int b = 0; b < c->b; b++)
                for (int h = 0; h < c->hq; h++)
                    for (int i = 0; i < sq.len_q[b]; i++)
                        for (int x = 0; x < c->dv; x++)
                            acc_err(&e, tget(&o2, b, sq.start_q[b] + i, h, x), tget(&o, b, sq.start_q[b] + i, h, x),
                                    tget(&o, b, sq.start_q[b] + i, h, x));
            /* standard vs ours: should agree to a few fp32 ulps (not the 2x rule: just sanity) */
            double tol = (c->dt == FA_DTYPE_F32 ? 1e-5 : c->dt == FA_DTYPE_F16 ? 2e-3 : 1.6e-2) * (e.maxref > 1 ? e.maxref : 1);
            if (e.ours > tol || e.bad_inf) {
                printf("  FAIL std    %s vs ours %.3e inf-mismatch %d\n", c->name, e.ours, e.bad_inf);
                ok = 0;
            }
        }
        free(o2.data);
    }

    /* determinism: threads 1 and 3 and a repeat give identical bits */
    {
        size_t obytes = (size_t)((c->varlen ? 1 : c->b) * o.bs + 64) * esize(c->dt);
        size_t qbytes = (size_t)((c->varlen ? 1 : c->b) * dq.bs + 64) * esize(c->dt);
        size_t kbytes = (size_t)((c->varlen ? 1 : c->b) * dk.bs + 64) * esize(c->dt);
        size_t vbytes = (size_t)((c->varlen ? 1 : c->b) * dv.bs + 64) * esize(c->dt);
        char *o_ref = malloc(obytes), *dq_ref = malloc(qbytes), *dk_ref = malloc(kbytes), *dv_ref = malloc(vbytes);
        memcpy(o_ref, o.data, obytes);
        memcpy(dq_ref, dq.data, qbytes);
        memcpy(dk_ref, dk.data, kbytes);
        memcpy(dv_ref, dv.data, vbytes);
        float *lse_ref = malloc(sizeof(float) * (size_t)(lse_n + 1));
        memcpy(lse_ref, lse, sizeof(float) * (size_t)lse_n);
        memcpy(dsink2, dsink, sizeof dsink);
        int threads[3] = {1, 3, 2};
        for (int t = 0; t < 3; t++) {
            fa_params pt = p;
            pt.num_threads = threads[t];
            /* exercise the caller-workspace path on one of the runs */
            size_t ws = 0;
            void *wsm = NULL;
            if (t == 1 && fa_check_forward(&pt, &ws) == FA_OK && ws) {
                wsm = malloc(ws);
                pt.workspace = wsm;
                pt.workspace_bytes = ws;
            }
            fa_forward(&pt);
            free(wsm);
            pt.workspace = NULL;
            pt.workspace_bytes = 0;
            if (do_backward) fa_backward(&pt);
            int same = memcmp(o_ref, o.data, obytes) == 0 && (!p.lse || memcmp(lse_ref, lse, sizeof(float) * (size_t)lse_n) == 0);
            if (do_backward)
                same = same && memcmp(dq_ref, dq.data, qbytes) == 0 && memcmp(dk_ref, dk.data, kbytes) == 0 &&
                       memcmp(dv_ref, dv.data, vbytes) == 0 && (!c->sink || memcmp(dsink2, dsink, sizeof(float) * (size_t)c->hq) == 0);
            if (!same) {
                printf("  FAIL determinism %s threads=%d\n", c->name, threads[t]);
                ok = 0;
            }
        }
        free(o_ref);
        free(dq_ref);
        free(dk_ref);
        free(dv_ref);
        free(lse_ref);
    }

    free(q.data), free(k.data), free(v.data), free(o.data), free(dO.data), free(dq.data), free(dk.data), free(dv.data);
    free(lse), free(lse2), free(dk64), free(dv64), free(dk32), free(dv32);
    free(r64.o), free(r64.lse), free(r64.dq), free(r32.o), free(r32.lse), free(r32.dq);
    printf("%s %s\n", ok ? "pass" : "FAIL", c->name);
    if (ok) total_pass++;
    else total_fail++;
    return ok;
}

/* Several user threads call fa_forward at once (the shared pool is busy for all but one of
 * them, so the others start temporary threads); every result must equal the serial one. */
#include <pthread.h>
typedef struct concurrent_job {
    fa_params p;
    float *o;
    int ok;
} concurrent_job;

static void *concurrent_main(void *arg) {
    concurrent_job *j = (concurrent_job *)arg;
    for (int rep = 0; rep < 20 && j->ok; rep++) j->ok = fa_forward(&j->p) == FA_OK;
    return NULL;
}

static int concurrency_test(void) {
    enum { N_USERS = 4, S = 96, H = 4, D = 32 };
    size_t n = (size_t)S * H * D;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o_serial = malloc(n * 4);
    for (size_t i = 0; i < n; i++) q[i] = (float)randn(), k[i] = (float)randn(), v[i] = (float)randn() + 0.5f;
    concurrent_job jobs[N_USERS];
    pthread_t th[N_USERS];
    fa_params p;
    memset(&p, 0, sizeof p);
    p.batch = 1, p.seqlen_q = S, p.seqlen_k = S, p.heads_q = H, p.heads_kv = H, p.head_dim = D;
    p.q = q, p.k = k, p.v = v, p.o = o_serial, p.causal = 1, p.num_threads = 2;
    fa_set_contiguous_strides(&p);
    fa_forward(&p);
    for (int u = 0; u < N_USERS; u++) {
        jobs[u].p = p;
        jobs[u].o = malloc(n * 4);
        jobs[u].p.o = jobs[u].o;
        jobs[u].p.num_threads = 1 + u % 3;
        jobs[u].ok = 1;
        pthread_create(&th[u], NULL, concurrent_main, &jobs[u]);
    }
    int ok = 1;
    for (int u = 0; u < N_USERS; u++) {
        pthread_join(th[u], NULL);
        ok &= jobs[u].ok && memcmp(jobs[u].o, o_serial, n * 4) == 0;
        free(jobs[u].o);
    }
    free(q), free(k), free(v), free(o_serial);
    printf("%s concurrent calls from %d user threads\n", ok ? "pass" : "FAIL", (int)N_USERS);
    return ok;
}

int main(int argc, char **argv) {
    if (concurrency_test()) total_pass++;
    else total_fail++;
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    static const char *isas[3] = {"avx512", "avx2", "scalar"};
    fa_dtype dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    /*            name          b  sq   sk  hq hkv  d   dv  dt  causal win wl wr softcap alibi sink varlen pad lsenull scale */
    cfg base[] = {
        {"tiny",            1, 1,   1,   1, 1,  32,  32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"odd",             2, 7,   113, 4, 2,  59,  59, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"odd-causal",      2, 113, 7,   4, 2,  59,  59, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"causal-203",      1, 203, 203, 2, 1,  64,  64, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"dv-ne-d",         1, 77,  150, 3, 1,  40,  96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0},
        {"window",          2, 150, 130, 4, 4,  32,  32, 0, 0, 1, 17, 5, 0, 0, 0, 0, 0, 0, 0},
        {"window-causal",   1, 140, 200, 2, 2,  111, 111, 0, 1, 1, 30, -1, 0, 0, 0, 0, 1, 0, 0},
        {"softcap",         1, 90,  90,  2, 1,  64,  64, 0, 1, 0, 0, 0, 5.0f, 0, 0, 0, 0, 0, 0.9f},
        {"alibi-head",      1, 100, 120, 4, 2,  48,  48, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
        {"alibi-batch",     2, 65,  65,  4, 1,  16,  16, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0},
        {"sink",            2, 70,  80,  4, 2,  64,  64, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
        {"sink-masked",     1, 50,  30,  2, 1,  32,  32, 0, 0, 1, 3, 0, 0, 0, 1, 0, 1, 0, 0},
        {"all-features",    2, 129, 140, 6, 2,  96,  80, 0, 1, 1, 40, -1, 20.0f, 1, 1, 0, 1, 0, 0},
        {"varlen",          8, 70,  70,  4, 2,  64,  64, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
        {"varlen-causal",   8, 70,  70,  4, 1,  64,  64, 0, 1, 0, 0, 0, 0, 2, 1, 1, 1, 0, 0},
        {"mqa-decode",      3, 1,   300, 8, 1,  128, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"gqa-decode-sink", 2, 3,   77,  8, 2,  64,  64, 0, 1, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0},
        {"mha-decode-dot",  2, 1,   300, 4, 4,  59,  59, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0},
        {"gqa-decode-dot",  2, 2,   200, 4, 2,  128, 40, 0, 1, 1, 90, -1, 8.0f, 1, 1, 0, 1, 0, 0},
        {"seqlen-k-0",      2, 5,   0,   2, 1,  32,  32, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
        {"seqlen-q-0",      2, 0,   9,   2, 1,  32,  32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"fully-masked",    1, 60,  20,  2, 1,  32,  32, 0, 1, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0},
        {"diagonal-only",   1, 40,  40,  2, 1,  32,  32, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"d1",              1, 33,  17,  2, 2,  1,   1,  0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"d256",            1, 70,  90,  2, 1,  256, 256, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"d512-dv7",        1, 20,  40,  1, 1,  512, 7,  0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0},
        {"lse-null",        1, 30,  40,  2, 1,  32,  32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
        {"neg-scale",       1, 64,  64,  2, 2,  32,  32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.3f},
        {"big-1023",        1, 1023, 1023, 2, 1, 128, 128, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    int n = (int)(sizeof base / sizeof base[0]);
    for (int ii = 0; ii < 3; ii++) {
        setenv("FA_CPU_ISA", isas[ii], 1);
        printf("== ISA %s (engine reports %s)\n", isas[ii], fa_cpu_isa());
        for (int di = 0; di < 3; di++) {
            for (int ci = 0; ci < n; ci++) {
                cfg c = base[ci];
                c.dt = dts[di];
                if (quick && (ii > 0 || di > 0) && ci > 12) continue;
                if (strcmp(c.name, "big-1023") == 0 && (ii > 0 || di > 0)) continue;
                char name[128];
                snprintf(name, sizeof name, "%s/%s/%s", isas[ii], c.name, di == 0 ? "f32" : di == 1 ? "f16" : "bf16");
                c.name = name;
                run_case(&c, 1);
            }
        }
    }
    printf("%d passed, %d failed\n", total_pass, total_fail);
    return total_fail != 0;
}
