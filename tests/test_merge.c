/*
 * test_merge.c: fa_merge_states on the CPU: 1..133 partial states per row with empty ones
 * (lse = -inf, their o rows NaN so a read shows), rows where every state is empty (o = 0,
 * lse = -inf exactly), every parts / output dtype pair, strided layouts, lse optional; the merge
 * of two halves of an attention equals the attention over all keys; bad input rejected with
 * nothing written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static fa_merge_spec merge_base(fa_dtype parts, fa_dtype out, int64_t states, int64_t rows,
                                int64_t heads, int64_t dv) {
    static uint64_t counter;
    fa_merge_spec s;
    memset(&s, 0, sizeof s);
    s.parts_dtype = parts;
    s.out_dtype = out;
    s.num_states = states;
    s.rows = rows;
    s.heads = heads;
    s.head_dim_v = dv;
    s.empty_share = 0.25;
    s.seed = fa_test_seed() * 0x2545f4914f6cdd1dull + ++counter;
    return s;
}

static int expect_merge(const fa_merge_spec *spec, int threads) {
    fa_merge_case_result r;
    char desc[256];
    int rc = fa_merge_case_run(spec, FA_DEVICE_CPU, threads, &r);
    fa_merge_describe(&r.spec, desc, sizeof desc);
    if (!FA_CHECK(rc == 0 && r.status == FA_OK, "%s: %s", desc, r.error)) return 0;
    const fa_merge_check *c = &r.check;
    return FA_CHECK(r.ok, "%s: o %.2e/%.2e (unwritten %lld clobbered %lld nonfinite %lld) lse %.2e/%.2e "
                    "(unwritten %lld clobbered %lld nonfinite %lld) empty-rows-wrong %lld inputs %s",
                    desc, c->o.err, c->o.tol, (long long)c->o.unwritten, (long long)c->o.clobbered,
                    (long long)c->o.nonfinite, c->lse.err, c->lse.tol, (long long)c->lse.unwritten,
                    (long long)c->lse.clobbered, (long long)c->lse.nonfinite,
                    (long long)c->empty_violations, c->inputs_unchanged ? "unchanged" : "MODIFIED");
}

FA_TEST(merge_state_counts) {
    static const int64_t counts[] = {1, 2, 3, 5, 8, 17, 33, 64, 100, 133};
    int n = fa_test_get_level() == FA_LEVEL_SMALL ? 5 : 10;
    for (int i = 0; i < n; i++) {
        fa_merge_spec s = merge_base(FA_DTYPE_F32, FA_DTYPE_F32, counts[i], 23, 3, 64);
        s.empty_share = i % 3 == 0 ? 0.0 : i % 3 == 1 ? 0.3 : 0.8;
        expect_merge(&s, 0);
    }
}

FA_TEST(merge_dtypes) {
    for (int pt = 0; pt < 3; pt++)
        for (int ot = 0; ot < 3; ot++) {
            fa_merge_spec s = merge_base(fa_test_cpu_dtypes[pt], fa_test_cpu_dtypes[ot], 7 + 5 * pt, 17, 2,
                                         ot == 1 ? 59 : 128);
            expect_merge(&s, 0);
        }
}

FA_TEST(merge_layouts) {
    for (int i = 0; i < 6; i++) {
        fa_merge_spec s = merge_base(i % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32, i % 3 ? FA_DTYPE_BF16 : FA_DTYPE_F16,
                                     1 + 26 * i, 5 + 13 * i, 1 + i % 3, 1 + 50 * i);
        s.padded = 1;
        s.no_lse = i % 2;
        expect_merge(&s, i % 3);
    }
    /* rows = 0: valid, nothing to do */
    fa_merge_spec none = merge_base(FA_DTYPE_F32, FA_DTYPE_F32, 4, 0, 2, 16);
    expect_merge(&none, 0);
}

/* Attention over keys [0, sk) equals the merge of the attentions over [0, s1) and [s1, sk). */
FA_TEST(merge_splits_attention) {
    const int64_t b = 2, sq = 5, sk = 301, s1 = 120, hq = 4, hkv = 2, d = 64;
    fa_test_rng rng;
    fa_test_rng_seed(&rng, fa_test_seed());
    float *q = malloc(sizeof(float) * (size_t)(b * sq * hq * d));
    float *k = malloc(sizeof(float) * (size_t)(b * sk * hkv * d));
    float *v = malloc(sizeof(float) * (size_t)(b * sk * hkv * d));
    float *o_full = malloc(sizeof(float) * (size_t)(b * sq * hq * d));
    float *lse_full = malloc(sizeof(float) * (size_t)(b * hq * sq));
    float *parts = malloc(sizeof(float) * (size_t)(2 * b * sq * hq * d));
    float *lse_parts = malloc(sizeof(float) * (size_t)(2 * b * hq * sq));
    float *o_merged = malloc(sizeof(float) * (size_t)(b * sq * hq * d));
    float *lse_merged = malloc(sizeof(float) * (size_t)(b * hq * sq));
    if (!FA_CHECK(q && k && v && o_full && lse_full && parts && lse_parts && o_merged && lse_merged, "oom"))
        goto done;
    for (int64_t i = 0; i < b * sq * hq * d; i++) q[i] = (float)fa_test_rng_normal(&rng);
    for (int64_t i = 0; i < b * sk * hkv * d; i++) {
        k[i] = (float)fa_test_rng_normal(&rng);
        v[i] = (float)fa_test_rng_normal(&rng) + 0.5f;
    }
    fa_params p;
    memset(&p, 0, sizeof p);
    p.batch = b;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    fa_set_contiguous_strides(&p);
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o_full;
    p.lse = lse_full;
    FA_CHECK(fa_forward(&p) == FA_OK, "full: %s", fa_last_error());
    /* the two halves: same strides, fewer keys; o in [state][b][sq][hq][d] */
    for (int half = 0; half < 2; half++) {
        fa_params h = p;
        h.seqlen_k = half ? sk - s1 : s1;
        h.k = k + (half ? s1 * hkv * d : 0);
        h.v = v + (half ? s1 * hkv * d : 0);
        h.o = parts + half * b * sq * hq * d;
        h.lse = lse_parts + half * b * hq * sq;
        FA_CHECK(fa_forward(&h) == FA_OK, "half %d: %s", half, fa_last_error());
    }
    /* rows = b·sq (o rows [b][sq], lse [b][hq][sq]: one lse row stride per b is not expressible,
     * so merge one sequence at a time) */
    for (int64_t bi = 0; bi < b; bi++) {
        fa_merge_params m;
        memset(&m, 0, sizeof m);
        m.parts_dtype = FA_DTYPE_F32;
        m.out_dtype = FA_DTYPE_F32;
        m.num_states = 2;
        m.rows = sq;
        m.heads = hq;
        m.head_dim_v = d;
        m.o_parts = parts + bi * sq * hq * d;
        m.o_parts_state_stride = b * sq * hq * d;
        m.o_parts_row_stride = hq * d;
        m.o_parts_head_stride = d;
        m.lse_parts = lse_parts + bi * hq * sq;
        m.lse_parts_state_stride = b * hq * sq;
        m.lse_parts_head_stride = sq;
        m.lse_parts_row_stride = 1;
        m.o = o_merged + bi * sq * hq * d;
        m.o_row_stride = hq * d;
        m.o_head_stride = d;
        m.lse = lse_merged + bi * hq * sq;
        m.lse_head_stride = sq;
        m.lse_row_stride = 1;
        FA_CHECK(fa_merge_states(&m) == FA_OK, "merge: %s", fa_last_error());
    }
    double err_o = 0.0, err_lse = 0.0;
    for (int64_t i = 0; i < b * sq * hq * d; i++) {
        double e = fabs((double)o_merged[i] - o_full[i]);
        if (e > err_o) err_o = e;
    }
    for (int64_t i = 0; i < b * hq * sq; i++) {
        double e = fabs((double)lse_merged[i] - lse_full[i]);
        if (e > err_lse) err_lse = e;
    }
    FA_CHECK(err_o < 2e-6 && err_lse < 2e-6, "merged halves vs full attention: o %.2e lse %.2e", err_o, err_lse);
done:
    free(q);
    free(k);
    free(v);
    free(o_full);
    free(lse_full);
    free(parts);
    free(lse_parts);
    free(o_merged);
    free(lse_merged);
}

FA_TEST(merge_errors) {
    fa_merge_spec s = merge_base(FA_DTYPE_F32, FA_DTYPE_BF16, 3, 4, 2, 8);
    fa_merge_problem mp;
    if (!FA_CHECK(fa_merge_problem_create(&mp, &s) == 0, "create")) return;
    const fa_merge_params good = mp.params;
    struct {
        const char *what;
        fa_merge_params m;
        fa_status expect;
        const char *part;
    } cases[40];
    int n = 0;
#define CASE(edit, status, text)                                                                 \
    do {                                                                                         \
        cases[n].what = #edit;                                                                   \
        cases[n].m = good;                                                                       \
        {                                                                                        \
            fa_merge_params *m = &cases[n].m;                                                    \
            edit;                                                                                \
        }                                                                                        \
        cases[n].expect = status;                                                                \
        cases[n].part = text;                                                                    \
        n++;                                                                                     \
    } while (0)
    CASE(m->num_states = 0, FA_ERR_INVALID_SIZE, "num_states");
    CASE(m->rows = -1, FA_ERR_INVALID_SIZE, "rows");
    CASE(m->heads = 0, FA_ERR_INVALID_SIZE, "heads");
    CASE(m->head_dim_v = 0, FA_ERR_HEAD_DIM, "head_dim_v");
    CASE(m->head_dim_v = FA_MAX_HEAD_DIM + 1, FA_ERR_HEAD_DIM, "head_dim_v");
    CASE(m->o = NULL, FA_ERR_NULL_POINTER, "o");
    CASE(m->o_parts = NULL, FA_ERR_NULL_POINTER, "o_parts");
    CASE(m->lse_parts = NULL, FA_ERR_NULL_POINTER, "lse_parts");
    CASE(m->parts_dtype = (fa_dtype)9, FA_ERR_DTYPE, "parts_dtype");
    CASE(m->out_dtype = (fa_dtype)-1, FA_ERR_DTYPE, "out_dtype");
    CASE(m->device = (fa_device)5, FA_ERR_DEVICE, "device");
    CASE(m->num_threads = -2, FA_ERR_INVALID_ARGUMENT, "num_threads");
    CASE(m->o_row_stride = 1, FA_ERR_STRIDE, "overlap");
    CASE(m->lse_head_stride = 0, FA_ERR_STRIDE, "lse_head_stride");
    CASE(m->o_parts_state_stride = -3, FA_ERR_STRIDE, "o_parts_state_stride");
    CASE(m->lse_parts_row_stride = -1, FA_ERR_STRIDE, "lse_parts_row_stride");
    CASE(m->o_parts_state_stride = INT64_MAX / 2, FA_ERR_OVERFLOW, "overflow");
    /* the largest element offset fits in int64, its byte offset does not */
    CASE((m->num_states = 1, m->heads = 1, m->rows = 2, m->lse_parts_row_stride = INT64_MAX), FA_ERR_OVERFLOW,
         "lse_parts");
    CASE((m->num_states = 1, m->heads = 1, m->rows = 2, m->o_parts_row_stride = INT64_MAX / 2), FA_ERR_OVERFLOW,
         "o_parts");
    CASE(m->o = (void *)m->o_parts, FA_ERR_OVERLAP, "o_parts");
    CASE(m->lse = (float *)m->lse_parts, FA_ERR_OVERLAP, "lse_parts");
    CASE(m->lse = (float *)m->o, FA_ERR_OVERLAP, "lse");
    CASE(m->lse = (float *)(void *)((char *)m->lse + 2), FA_ERR_ALIGNMENT, "lse");
    CASE(m->o = (char *)m->o + 1, FA_ERR_ALIGNMENT, "o");
#undef CASE
    for (int i = 0; i < n; i++) {
        fa_status st = fa_merge_states(&cases[i].m);
        FA_CHECK(st == cases[i].expect, "%s: got %s, want %s (%s)", cases[i].what, fa_strerror(st),
                 fa_strerror(cases[i].expect), fa_last_error());
        FA_CHECK(strstr(fa_last_error(), cases[i].part) != NULL, "%s: message '%s' lacks '%s'",
                 cases[i].what, fa_last_error(), cases[i].part);
    }
    FA_CHECK(fa_merge_states(NULL) == FA_ERR_NULL_POINTER, "NULL params");
    /* nothing written by any of them */
    int untouched = 1;
    for (int i = FA_MG_O; i <= FA_MG_LSE; i++) {
        const fa_test_buffer *buf = &mp.buffer[i];
        fa_merge_problem fresh;
        if (fa_merge_problem_create(&fresh, &s)) break;
        if (memcmp(buf->host, fresh.buffer[i].host, buf->bytes)) untouched = 0;
        fa_merge_problem_destroy(&fresh);
    }
    FA_CHECK(untouched, "a rejected merge wrote its outputs");
    fa_merge_problem_destroy(&mp);
}
