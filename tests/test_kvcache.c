/*
 * test_kvcache.c: fa_kvcache_forward on the CPU against the float64 oracle (reference.c), one
 * test per feature: contiguous and paged caches (pages of 1, 3, 16 tokens), cache_batch_idx,
 * left padding, appending with the cache update checked element by element (v bit-exact, k within
 * one ulp of the rotation), rotary (interleaved and half-split, partial rotary_dim, causal and
 * non-causal positions), every mask feature, GQA / MQA, head dims, split-KV (forced and
 * heuristic, bitwise identical across thread counts), the split heuristic as a pure function,
 * and bad input reported with a clear error and nothing written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/fa_internal.h"
#include "test_util.h"

static uint64_t case_seed(void) {
    static uint64_t counter;
    return fa_test_seed() * 0x9e3779b97f4a7c15ull + ++counter;
}

static fa_kv_spec kv_base(fa_dtype dtype, int64_t batch, int64_t sq, int64_t hq, int64_t hkv,
                          int64_t d, int64_t capacity) {
    fa_kv_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.batch = batch;
    s.seqlen_q = sq;
    s.heads_q = hq;
    s.heads_kv = hkv;
    s.head_dim = d;
    s.capacity = capacity;
    s.seed = case_seed();
    return s;
}

/* Run on the CPU and FA_CHECK the result. Returns 1 when it passed. */
static int expect_kv(const fa_kv_spec *spec, int threads, const char *label) {
    fa_kv_case_result r;
    char desc[256], detail[512];
    int rc = fa_kv_case_run(spec, FA_DEVICE_CPU, threads, &r);
    fa_kv_describe(&r.spec, desc, sizeof desc);
    if (!FA_CHECK(rc == 0 && r.status == FA_OK, "%s: %s: %s", label, desc, r.error)) return 0;
    fa_kv_format(&r.check, detail, sizeof detail);
    return FA_CHECK(r.ok, "%s: %s:%s", label, desc, detail);
}

/* Shapes of the per-feature tests: {batch, sq, hq, hkv, d, capacity}. */
typedef struct kv_shape {
    int64_t batch, seqlen_q, heads_q, heads_kv, head_dim, capacity;
} kv_shape;

static int kv_shapes(const kv_shape **shapes) {
    static const kv_shape all[] = {
        {3, 1, 8, 2, 64, 203},  /* decoding, GQA 4                                             */
        {2, 7, 6, 3, 59, 113},  /* speculative decoding, odd head dim                          */
        {2, 1, 11, 1, 64, 150}, /* decoding, GQA 11: a block of 8 rows and one of 3            */
        {1, 33, 4, 1, 128, 300}, /* chunked prefill, MQA                                      */
        {4, 1, 4, 4, 32, 1023}, /* long cache, MHA                                            */
        {2, 70, 2, 1, 96, 203}, /* more than one query block                                  */
    };
    fa_test_level level = fa_test_get_level();
    *shapes = all;
    return level == FA_LEVEL_SMALL ? 3 : level == FA_LEVEL_NORMAL ? 5 : 6;
}

typedef void (*kv_feature)(fa_kv_spec *s);

/* Every CPU dtype × the shapes, with `apply` on top. */
static void run_kv_feature(const char *name, kv_feature apply) {
    const kv_shape *shapes;
    int count = kv_shapes(&shapes);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < count; i++) {
            const kv_shape *sh = &shapes[i];
            fa_kv_spec s = kv_base(fa_test_cpu_dtypes[t], sh->batch, sh->seqlen_q, sh->heads_q,
                                   sh->heads_kv, sh->head_dim, sh->capacity);
            apply(&s);
            int64_t appended = s.seqlen_new ? s.seqlen_new : s.seqlen_q;
            if (s.append && s.capacity < appended) s.capacity = appended;
            expect_kv(&s, 0, name);
        }
}

static void f_plain(fa_kv_spec *s) { (void)s; }
static void f_causal(fa_kv_spec *s) { s->causal = 1; }
static void f_append(fa_kv_spec *s) {
    s->append = 1;
    s->causal = 1;
}
static void f_append_noncausal(fa_kv_spec *s) { s->append = 1; }
static void f_paged_1(fa_kv_spec *s) {
    s->page_size = 1;
    s->append = 1;
    s->causal = 1;
}
static void f_paged_3(fa_kv_spec *s) {
    s->page_size = 3;
    s->append = 1;
    s->leftpad = 1;
    s->causal = 1;
}
static void f_paged_16(fa_kv_spec *s) {
    s->page_size = 16;
    s->padded = 1;
    s->sinks = 1;
}
static void f_batch_idx(fa_kv_spec *s) {
    s->batch_idx = 1;
    s->append = 1;
    s->causal = 1;
    s->padded = 1;
}
static void f_leftpad(fa_kv_spec *s) {
    s->leftpad = 1;
    s->causal = 1;
    s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
}
static void f_rotary_interleaved(fa_kv_spec *s) {
    s->append = 1;
    s->causal = 1;
    s->rotary_dim = s->head_dim - s->head_dim % 2;
    s->rotary_interleaved = 1;
    s->leftpad = 1;
}
static void f_rotary_half(fa_kv_spec *s) { /* partial rotary, GPT-NeoX pairs, non-causal: q at one position */
    s->append = 1;
    s->rotary_dim = (s->head_dim / 2) & ~(int64_t)1;
    s->rotary_interleaved = 0;
    s->page_size = 3;
}
static void f_rotary_window(fa_kv_spec *s) { /* local attention: per-query positions */
    s->append = 1;
    s->rotary_dim = 16;
    s->rotary_interleaved = 1;
    s->use_window = 1;
    s->window_left = 9;
    s->window_right = 2;
}
static void f_window(fa_kv_spec *s) {
    s->use_window = 1;
    s->window_left = 17;
    s->window_right = 3;
}
static void f_causal_window(fa_kv_spec *s) {
    s->causal = 1;
    s->use_window = 1;
    s->window_left = 40;
    s->window_right = -1;
    s->page_size = 16;
}
static void f_softcap(fa_kv_spec *s) {
    s->softcap = 2.0f;
    s->q_amplitude = 2.0;
}
static void f_alibi(fa_kv_spec *s) { s->alibi = FA_TEST_ALIBI_HEAD; }
static void f_sinks_causal(fa_kv_spec *s) {
    s->sinks = 1;
    s->causal = 1;
    s->leftpad = 1;
}
static void f_no_lse(fa_kv_spec *s) {
    s->no_lse = 1;
    s->append = 1;
}
static void f_no_seqlens(fa_kv_spec *s) {
    s->no_seqlens = 1;
    s->causal = 1;
}
static void f_head_dim_v(fa_kv_spec *s) {
    s->head_dim_v = s->head_dim / 2 + 3;
    s->append = 1;
    s->page_size = 3;
}
static void f_everything(fa_kv_spec *s) {
    s->page_size = 3;
    s->append = 1;
    s->leftpad = 1;
    s->rotary_dim = 16;
    s->rotary_interleaved = 0;
    s->causal = 1;
    s->use_window = 1;
    s->window_left = 50;
    s->softcap = 4.0f;
    s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
    s->sinks = 1;
    s->padded = 1;
    s->num_splits = 3;
}

/* k_new / v_new with another token count than q (flash_attn accepts any): the queries are the
 * last seqlen_q of the cache_seqlens + seqlen_new keys */
static void f_seqlen_new_more(fa_kv_spec *s) {
    s->append = 1;
    s->causal = 1;
    s->leftpad = 1;
    s->rotary_dim = s->head_dim & ~(int64_t)1;
    s->rotary_interleaved = 1;
    s->seqlen_new = s->seqlen_q + 6;
}
static void f_seqlen_new_fewer(fa_kv_spec *s) {
    s->append = 1;
    s->causal = 1;
    s->page_size = 3;
    s->leftpad = 1;
    s->rotary_dim = 16;
    s->use_window = 1;
    s->window_left = 9;
    s->alibi = FA_TEST_ALIBI_HEAD;
    s->seqlen_new = (s->seqlen_q + 1) / 2;
}
static void f_seqlen_new_noncausal(fa_kv_spec *s) {
    s->append = 1;
    s->rotary_dim = 16;
    s->sinks = 1;
    s->seqlen_new = s->seqlen_q > 1 ? s->seqlen_q - 1 : 3;
}

FA_TEST(kvcache_seqlen_new_more) { run_kv_feature("seqlen_new > seqlen_q", f_seqlen_new_more); }
FA_TEST(kvcache_seqlen_new_fewer) { run_kv_feature("seqlen_new < seqlen_q", f_seqlen_new_fewer); }
FA_TEST(kvcache_seqlen_new_noncausal) { run_kv_feature("seqlen_new non-causal", f_seqlen_new_noncausal); }
FA_TEST(kvcache_plain) { run_kv_feature("plain", f_plain); }
FA_TEST(kvcache_causal) { run_kv_feature("causal", f_causal); }
FA_TEST(kvcache_append) { run_kv_feature("append", f_append); }
FA_TEST(kvcache_append_noncausal) { run_kv_feature("append non-causal", f_append_noncausal); }
FA_TEST(kvcache_paged_page1) { run_kv_feature("paged(1)", f_paged_1); }
FA_TEST(kvcache_paged_page3) { run_kv_feature("paged(3)", f_paged_3); }
FA_TEST(kvcache_paged_page16) { run_kv_feature("paged(16)", f_paged_16); }
FA_TEST(kvcache_batch_idx) { run_kv_feature("batch_idx", f_batch_idx); }
FA_TEST(kvcache_leftpad) { run_kv_feature("leftpad", f_leftpad); }
FA_TEST(kvcache_rotary_interleaved) { run_kv_feature("rotary interleaved", f_rotary_interleaved); }
FA_TEST(kvcache_rotary_half) { run_kv_feature("rotary half-split", f_rotary_half); }
FA_TEST(kvcache_rotary_window) { run_kv_feature("rotary window", f_rotary_window); }
FA_TEST(kvcache_window) { run_kv_feature("window", f_window); }
FA_TEST(kvcache_causal_window) { run_kv_feature("causal window", f_causal_window); }
FA_TEST(kvcache_softcap) { run_kv_feature("softcap", f_softcap); }
FA_TEST(kvcache_alibi) { run_kv_feature("alibi", f_alibi); }
FA_TEST(kvcache_sinks) { run_kv_feature("sinks", f_sinks_causal); }
FA_TEST(kvcache_no_lse) { run_kv_feature("no lse", f_no_lse); }
FA_TEST(kvcache_no_seqlens) { run_kv_feature("no cache_seqlens", f_no_seqlens); }
FA_TEST(kvcache_head_dim_v) { run_kv_feature("dv != d", f_head_dim_v); }
FA_TEST(kvcache_everything) { run_kv_feature("everything", f_everything); }

/* Odd sizes: head dims, a single token cache, capacity 1, caches exactly full. */
FA_TEST(kvcache_odd_sizes) {
    static const int64_t dims[] = {1, 32, 59, 111, 256};
    int n = fa_test_get_level() == FA_LEVEL_SMALL ? 3 : 5;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < n; i++) {
            fa_kv_spec s = kv_base(fa_test_cpu_dtypes[t], 2, 1 + i % 3, 4, 2, dims[i], 1 + 37 * i);
            s.append = i % 2;
            s.page_size = i % 3 == 2 ? 3 : 0;
            s.causal = 1;
            s.full = i == 3;
            if (s.capacity < s.seqlen_q) s.capacity = s.seqlen_q;
            expect_kv(&s, 0, "odd sizes");
        }
    fa_kv_spec one = kv_base(FA_DTYPE_BF16, 1, 1, 2, 1, 64, 1); /* appends into a 1-slot cache */
    one.append = 1;
    one.page_size = 1;
    expect_kv(&one, 0, "capacity 1");
}

/* Split-KV: forced split counts (more than key blocks too), the heuristic with many threads,
 * and bitwise equality of o / lse across thread counts for a fixed split count. */
FA_TEST(kvcache_splits) {
    static const int splits[] = {1, 2, 3, 7, 64};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 5; i++) {
            fa_kv_spec s = kv_base(fa_test_cpu_dtypes[t], 2, i % 2 ? 3 : 1, 8, 2, 64, 700);
            s.num_splits = splits[i];
            s.causal = 1;
            s.sinks = i % 2;
            s.append = 1;
            s.page_size = i == 3 ? 16 : 0;
            expect_kv(&s, 0, "forced splits");
        }
    /* heuristic: 1 sequence × 1 kv head on 64 threads splits the keys */
    fa_kv_spec h = kv_base(FA_DTYPE_F32, 1, 1, 4, 1, 64, 1500);
    h.sinks = 1;
    expect_kv(&h, 64, "heuristic, 64 threads");

    fa_kv_spec s = kv_base(FA_DTYPE_BF16, 2, 2, 8, 2, 64, 900);
    s.num_splits = 5;
    s.append = 1;
    s.causal = 1;
    fa_kv_problem kp;
    if (!FA_CHECK(fa_kv_problem_create(&kp, &s) == 0, "create")) return;
    void *o_first = NULL, *lse_first = NULL;
    static const int thread_counts[] = {1, 2, 3, 7};
    for (int i = 0; i < 4; i++) {
        fa_kv_problem_reset(&kp);
        fa_params p = kp.params;
        p.num_threads = thread_counts[i];
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "threads %d: %s", thread_counts[i], fa_last_error());
        const fa_test_buffer *o = &kp.buffer[FA_KV_O], *l = &kp.buffer[FA_KV_LSE];
        if (i == 0) {
            o_first = malloc(o->bytes);
            lse_first = malloc(l->bytes);
            if (!o_first || !lse_first) break;
            memcpy(o_first, o->host, o->bytes);
            memcpy(lse_first, l->host, l->bytes);
        } else {
            FA_CHECK(!memcmp(o_first, o->host, o->bytes) && !memcmp(lse_first, l->host, l->bytes),
                     "o / lse with %d threads differ from 1 thread", thread_counts[i]);
        }
    }
    free(o_first);
    free(lse_first);
    fa_kv_problem_destroy(&kp);
}

/* A caller's workspace of exactly the size fa_check_kvcache asks for (at an odd address) gives
 * bit-identical results to the library's own allocation; one byte less is refused. */
FA_TEST(kvcache_caller_workspace) {
    fa_kv_spec s = kv_base(FA_DTYPE_F16, 2, 3, 8, 2, 64, 500);
    s.num_splits = 4;
    s.append = 1;
    s.page_size = 16;
    fa_kv_problem kp;
    if (!FA_CHECK(fa_kv_problem_create(&kp, &s) == 0, "create")) return;
    size_t ws = 0;
    FA_CHECK(fa_check_kvcache(&kp.params, &ws) == FA_OK && ws > 0, "check: %s", fa_last_error());
    FA_CHECK(fa_kvcache_forward(&kp.params) == FA_OK, "own workspace: %s", fa_last_error());
    const fa_test_buffer *o = &kp.buffer[FA_KV_O];
    void *first = malloc(o->bytes);
    char *mine = malloc(ws + 1);
    if (FA_CHECK(first && mine, "oom")) {
        memcpy(first, o->host, o->bytes);
        fa_kv_problem_reset(&kp);
        fa_params p = kp.params;
        p.workspace = mine + 1;
        p.workspace_bytes = ws;
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "caller workspace: %s", fa_last_error());
        FA_CHECK(!memcmp(first, o->host, o->bytes), "results differ with the caller's workspace");
        p.workspace_bytes = ws - 1;
        FA_CHECK(fa_kvcache_forward(&p) == FA_ERR_WORKSPACE, "one byte short is refused");
    }
    free(first);
    free(mine);
    fa_kv_problem_destroy(&kp);
}

/* Sequences sharing a cache row (repeated cache_batch_idx) and appending into the same slots:
 * the append runs in sequence order, so the last sequence's tokens are in the cache, every run. */
FA_TEST(kvcache_repeated_cache_rows) {
    const int64_t d = 16, cap = 8;
    float k_cache[2 * 8 * 16], v_cache[2 * 8 * 16], q[3 * 16], k_new[3 * 16], v_new[3 * 16], o[3 * 16];
    int32_t seqlens[3] = {4, 4, 2}, rows[3] = {1, 1, 0};
    for (int i = 0; i < 2 * 8 * 16; i++) k_cache[i] = v_cache[i] = 0.25f * (float)(i % 7);
    for (int i = 0; i < 3 * 16; i++) {
        q[i] = 0.1f * (float)(i % 5);
        k_new[i] = (float)(i / 16 + 1);
        v_new[i] = (float)(10 * (i / 16 + 1));
    }
    fa_params p;
    memset(&p, 0, sizeof p);
    p.batch = 3;
    p.seqlen_q = 1;
    p.seqlen_k = cap;
    p.heads_q = 1;
    p.heads_kv = 1;
    p.head_dim = d;
    fa_set_contiguous_strides(&p);
    p.cache_batch = 2;
    p.q = q, p.k = k_cache, p.v = v_cache, p.o = o, p.k_new = k_new, p.v_new = v_new;
    p.knew_batch_stride = p.vnew_batch_stride = d;
    p.knew_row_stride = p.vnew_row_stride = d;
    p.knew_head_stride = p.vnew_head_stride = d;
    p.cache_seqlens = seqlens;
    p.cache_batch_idx = rows;
    for (int threads = 1; threads <= 3; threads++) {
        p.num_threads = threads;
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "%s", fa_last_error());
        /* row 1 slot 4: written by sequences 0 and 1; sequence 1 is last */
        FA_CHECK(k_cache[(1 * cap + 4) * d] == 2.0f && v_cache[(1 * cap + 4) * d] == 20.0f,
                 "threads %d: row 1 slot 4 holds k %g v %g, want sequence 1's 2 / 20", threads,
                 (double)k_cache[(1 * cap + 4) * d], (double)v_cache[(1 * cap + 4) * d]);
        FA_CHECK(k_cache[(0 * cap + 2) * d] == 3.0f, "row 0 slot 2 holds sequence 2's token");
    }
}

/* Every SIMD level (FA_CPU_ISA lowers it per call; another architecture's name gives the best
 * level): the AVX-512 level scores few-row tiles with its own dot-product kernel, the others
 * with the engine's GEMM. */
FA_TEST(kvcache_isa_levels) {
    static const char *const levels[] = {"scalar", "avx2", "avx512", "neon", "sve256"};
    char *previous = fa_test_env_set("FA_CPU_ISA", levels[0]);
    for (int i = 0; i < 5; i++) {
        setenv("FA_CPU_ISA", levels[i], 1);
        for (int t = 0; t < 3; t++) {
            fa_kv_spec s = kv_base(fa_test_cpu_dtypes[t], 2, 1 + 2 * (t == 1), 8, 2, 64 + 32 * t, 150);
            s.append = 1;
            s.causal = 1;
            s.page_size = t == 2 ? 3 : 0;
            s.softcap = t == 0 ? 5.0f : 0.0f;
            expect_kv(&s, 0, levels[i]);
        }
    }
    fa_test_env_restore("FA_CPU_ISA", previous);
}

/* The split heuristic as a pure function. */
FA_TEST(kvcache_split_heuristic) {
    /* enough parallel work: no split */
    FA_CHECK(fa_num_splits_heuristic(132, 64, 132, 128) == 1, "full machine");
    FA_CHECK(fa_num_splits_heuristic(106, 64, 132, 128) == 1, ">= 80%% of the workers");
    /* nothing to split */
    FA_CHECK(fa_num_splits_heuristic(1, 1, 132, 128) == 1, "one key block");
    FA_CHECK(fa_num_splits_heuristic(8, 64, 1, 128) == 1, "one worker");
    FA_CHECK(fa_num_splits_heuristic(8, 64, 132, 1) == 1, "max_splits 1");
    /* one unit, many workers, many blocks: the smallest s within 85 % of the best efficiency */
    for (int64_t units = 1; units <= 100; units += 3)
        for (int64_t blocks = 1; blocks <= 300; blocks += 7) {
            int s = fa_num_splits_heuristic(units, blocks, 132, 128);
            int64_t limit = blocks < 128 ? blocks : 128;
            if (!FA_CHECK(s >= 1 && s <= (limit > 132 ? 132 : limit), "range: units %lld blocks %lld -> %d",
                          (long long)units, (long long)blocks, s))
                return;
            if (10 * units >= 8 * 132) {
                FA_CHECK(s == 1, "units %lld fill the machine but s = %d", (long long)units, s);
                continue;
            }
            /* recompute the rule independently */
            double best = 0.0, mine = 0.0;
            int expect = 1, found = 0;
            for (int pass = 0; pass < 2 && !found; pass++)
                for (int64_t k = 1; k <= limit && !found; k++) {
                    if (k > 1 && (blocks + k - 1) / k == (blocks + k - 2) / (k - 1)) continue;
                    double w = (double)(units * k) / 132.0, e = w / ceil(w);
                    if (pass == 0 && e > best) best = e;
                    if (pass == 1 && e >= 0.85 * best) {
                        expect = (int)k;
                        mine = e;
                        found = 1;
                    }
                }
            FA_CHECK(s == expect, "units %lld blocks %lld: %d, the rule says %d (efficiency %.2f)",
                     (long long)units, (long long)blocks, s, expect, mine);
        }
    /* a known case: 1 unit on 132 SMs, 512 blocks: 128 splits give 0.97 of a wave */
    FA_CHECK(fa_num_splits_heuristic(1, 512, 132, 128) >= 100, "b=1 h=1 long cache splits widely");
}

/* ---- bad input ---------------------------------------------------------------------------- */

typedef struct bad_case {
    const char *what;
    fa_status expect;
    const char *message_part; /* expected inside fa_last_error()                             */
} bad_case;

/* Call with p, expect `bc`, and check that nothing was written. `undo` restores table edits. */
static void expect_rejected(fa_kv_problem *kp, const fa_params *p, const bad_case *bc) {
    size_t ws = 12345;
    fa_status check = fa_check_kvcache(p, &ws);
    fa_status call = fa_kvcache_forward(p);
    const char *message = fa_last_error();
    FA_CHECK(call == bc->expect && check == bc->expect, "%s: got %s / %s, want %s (%s)", bc->what,
             fa_strerror(check), fa_strerror(call), fa_strerror(bc->expect), message);
    FA_CHECK(strstr(message, bc->message_part) != NULL, "%s: message '%s' does not mention '%s'",
             bc->what, message, bc->message_part);
    (void)kp;
}

FA_TEST(kvcache_errors) {
    fa_kv_spec s = kv_base(FA_DTYPE_F16, 3, 2, 4, 2, 64, 50);
    s.page_size = 3;
    s.append = 1;
    s.leftpad = 1;
    s.rotary_dim = 32;
    s.rotary_interleaved = 1;
    s.causal = 1;
    fa_kv_problem kp;
    if (!FA_CHECK(fa_kv_problem_create(&kp, &s) == 0, "create")) return;
    const fa_params good = kp.params;
    FA_CHECK(fa_check_kvcache(&good, NULL) == FA_OK, "the unmodified problem is valid: %s", fa_last_error());
    int32_t *table = kp.buffer[FA_KV_BLOCK_TABLE].host, *seqlens = kp.buffer[FA_KV_SEQLENS].host;
    int32_t *leftpad = kp.buffer[FA_KV_LEFTPAD].host;
    /* a block_table entry the call reads: sequence 1's page of slot cache_seqlens[1] */
    int64_t used = 1 * good.block_table_batch_stride + kp.cached[1] / s.page_size;

#define BAD(field_edit, status, part)                                                            \
    do {                                                                                         \
        fa_params p = good;                                                                      \
        field_edit;                                                                              \
        bad_case bc = {#field_edit, status, part};                                               \
        expect_rejected(&kp, &p, &bc);                                                           \
    } while (0)
    /* host arrays: edited in place, restored right after */
#define BAD_ARRAY(array, index, value, status, part)                                             \
    do {                                                                                         \
        int32_t kept = (array)[index];                                                           \
        (array)[index] = (value);                                                                \
        bad_case bc = {#array "[" #index "] = " #value, status, part};                          \
        expect_rejected(&kp, &good, &bc);                                                        \
        (array)[index] = kept;                                                                   \
    } while (0)

    BAD_ARRAY(table, used, (int32_t)kp.cache_rows, FA_ERR_INVALID_ARGUMENT, "block_table[1]");
    BAD_ARRAY(table, used, -1, FA_ERR_INVALID_ARGUMENT, "out of range");
    BAD_ARRAY(seqlens, 2, (int32_t)(s.capacity - s.seqlen_q + 1), FA_ERR_INVALID_SIZE, "capacity");
    BAD_ARRAY(seqlens, 0, -1, FA_ERR_INVALID_SIZE, "cache_seqlens[0]");
    BAD_ARRAY(leftpad, 1, kp.cached[1] + 1, FA_ERR_INVALID_SIZE, "cache_leftpad[1]");
    BAD_ARRAY(leftpad, 0, -2, FA_ERR_INVALID_SIZE, "cache_leftpad[0]");
    BAD(p.page_size = 0, FA_ERR_INVALID_SIZE, "page_size");
    BAD(p.num_pages = 0, FA_ERR_INVALID_SIZE, "num_pages");
    BAD(p.block_table_batch_stride = 1, FA_ERR_STRIDE, "block_table_batch_stride");
    BAD(p.cache_batch_idx = kp.buffer[FA_KV_SEQLENS].host, FA_ERR_INVALID_ARGUMENT, "cache_batch_idx");
    BAD(p.v_new = NULL, FA_ERR_NULL_POINTER, "v_new");
    BAD(p.cache_seqlens = NULL, FA_ERR_NULL_POINTER, "cache_seqlens");
    BAD((p.k_new = NULL, p.v_new = NULL), FA_ERR_INVALID_ARGUMENT, "k_new");
    BAD(p.rotary_sin = NULL, FA_ERR_NULL_POINTER, "rotary_sin");
    BAD(p.rotary_dim = 31, FA_ERR_INVALID_SIZE, "rotary_dim");
    BAD(p.rotary_dim = 66, FA_ERR_INVALID_SIZE, "rotary_dim");
    BAD(p.rotary_dim = 0, FA_ERR_INVALID_SIZE, "rotary_dim");
    BAD(p.rotary_seqlen = good.seqlen_k - 1, FA_ERR_INVALID_SIZE, "rotary_seqlen");
    { /* one appended token for two queries at a full cache: query 1 rotates at L0 + 1 = seqlen_k,
       * one row past tables of seqlen_k rows */
        int32_t kept = seqlens[0];
        seqlens[0] = (int32_t)(good.seqlen_k - 1);
        BAD((p.seqlen_new = good.seqlen_q - 1, p.rotary_seqlen = good.seqlen_k), FA_ERR_INVALID_SIZE,
            "past the cos/sin tables");
        seqlens[0] = kept;
    }
    BAD(p.seqlen_q = 0, FA_ERR_INVALID_SIZE, "seqlen_q");
    BAD(p.seqlen_new = -1, FA_ERR_INVALID_SIZE, "seqlen_new");
    BAD(p.seqlen_new = good.seqlen_k + 1, FA_ERR_INVALID_SIZE, "seqlen_new");
    BAD((p.k_new = NULL, p.v_new = NULL, p.rotary_cos = NULL, p.rotary_sin = NULL, p.seqlen_new = 2),
        FA_ERR_INVALID_ARGUMENT, "seqlen_new");
    BAD(p.dropout_p = 0.1f, FA_ERR_UNSUPPORTED, "dropout_p");
    BAD(p.dropout_p = 1.0f, FA_ERR_INVALID_ARGUMENT, "dropout_p");
    BAD(p.attn_probs = (float *)kp.buffer[FA_KV_LSE].host, FA_ERR_UNSUPPORTED, "attn_probs");
    BAD(p.num_splits = -1, FA_ERR_INVALID_ARGUMENT, "num_splits");
    BAD(p.cu_seqlens_q = kp.buffer[FA_KV_SEQLENS].host, FA_ERR_UNSUPPORTED, "cu_seqlens");
    BAD(p.q = NULL, FA_ERR_NULL_POINTER, "q");
    BAD(p.k = NULL, FA_ERR_NULL_POINTER, "key cache");
    BAD(p.o = NULL, FA_ERR_NULL_POINTER, "o");
    BAD(p.heads_q = 3, FA_ERR_HEADS, "heads_q");
    BAD(p.o_row_stride = good.o_head_stride, FA_ERR_STRIDE, "overlap");
    BAD(p.k_row_stride = 1, FA_ERR_STRIDE, "k_row_stride");
    BAD(p.knew_head_stride = -1, FA_ERR_STRIDE, "knew_head_stride");
    BAD((p.workspace = &kp, p.workspace_bytes = 16), FA_ERR_WORKSPACE, "workspace_bytes");
    BAD(p.dtype = (fa_dtype)7, FA_ERR_DTYPE, "dtype");
    BAD(p.softcap = -1.0f, FA_ERR_SOFTCAP, "softcap");
    if (!fa_cuda_available()) BAD(p.device = FA_DEVICE_CUDA, FA_ERR_DEVICE, "CUDA");
    /* outputs sharing memory with another array */
    BAD(p.o = (void *)p.k, FA_ERR_OVERLAP, "key cache");
    BAD(p.o = (char *)p.v + 2 * 64 * 2, FA_ERR_OVERLAP, "value cache");
    BAD(p.k_new = p.k, FA_ERR_OVERLAP, "k_new");
    BAD(p.lse = (float *)p.o + 1, FA_ERR_OVERLAP, "lse");
    /* rotary_cos and cache_seqlens inside o (o moved onto either would also cover whatever the
     * heap put after it, and the message could name that array instead) */
    BAD(p.rotary_cos = (const void *)p.o, FA_ERR_OVERLAP, "rotary_cos");
    BAD(p.cache_seqlens = (const int32_t *)p.o, FA_ERR_OVERLAP, "cache_seqlens");
    /* byte offsets past int64, misaligned arrays */
    BAD((p.alibi_slopes = kp.buffer[FA_KV_SEQLENS].host, p.alibi_batch_stride = INT64_MAX), FA_ERR_OVERFLOW,
        "alibi_batch_stride");
    BAD(p.q_batch_stride = (int64_t)1 << 62, FA_ERR_OVERFLOW, "q");
    BAD(p.lse = (float *)(void *)((char *)p.lse + 2), FA_ERR_ALIGNMENT, "lse");
    BAD(p.cache_seqlens = (const int32_t *)(const void *)((const char *)p.cache_seqlens + 1), FA_ERR_ALIGNMENT,
        "cache_seqlens");
    FA_CHECK(fa_kv_untouched(&kp), "a rejected call wrote an output or the cache");
    /* contiguous caches */
    fa_kv_spec cs = kv_base(FA_DTYPE_F32, 2, 1, 2, 1, 32, 20);
    cs.batch_idx = 1;
    cs.append = 1;
    fa_kv_problem cp;
    if (FA_CHECK(fa_kv_problem_create(&cp, &cs) == 0, "create contiguous")) {
        const fa_params cgood = cp.params;
        int32_t *rows = cp.buffer[FA_KV_BATCH_IDX].host;
        fa_kv_problem *saved_kp = &cp;
        {
            int32_t kept = rows[1];
            rows[1] = (int32_t)cp.cache_rows;
            bad_case bc = {"cache_batch_idx[1] = cache_batch", FA_ERR_INVALID_ARGUMENT, "cache_batch_idx[1]"};
            expect_rejected(saved_kp, &cgood, &bc);
            rows[1] = kept;
        }
        fa_params p = cgood;
        p.cache_batch_idx = NULL;
        p.cache_batch = 1;
        bad_case bc = {"cache_batch < batch without cache_batch_idx", FA_ERR_INVALID_SIZE, "cache_batch"};
        expect_rejected(&cp, &p, &bc);
        p = cgood;
        p.page_size = 16;
        bad_case bc2 = {"page_size without block_table", FA_ERR_INVALID_ARGUMENT, "block_table"};
        expect_rejected(&cp, &p, &bc2);
        FA_CHECK(fa_kv_untouched(&cp), "a rejected contiguous call wrote something");
        fa_kv_problem_destroy(&cp);
    }
#undef BAD
#undef BAD_ARRAY
    fa_kv_problem_destroy(&kp);
    FA_CHECK(fa_kvcache_forward(NULL) == FA_ERR_NULL_POINTER, "NULL params");
}

/* Without rotary tables rotary_dim / rotary_seqlen are unused and ignored: huge values once gave
 * FA_OK with a workspace of terabytes (or a wrapped, too small one). */
FA_TEST(kvcache_unused_rotary_fields_ignored) {
    fa_kv_spec s = kv_base(FA_DTYPE_F16, 2, 3, 4, 2, 32, 40);
    s.append = 1;
    fa_kv_problem kp;
    if (!FA_CHECK(fa_kv_problem_create(&kp, &s) == 0, "create")) return;
    fa_params p = kp.params;
    size_t plain = 0;
    FA_CHECK(fa_check_kvcache(&p, &plain) == FA_OK, "base: %s", fa_last_error());
    static const int64_t dims[] = {(int64_t)1 << 31, (int64_t)1 << 40, INT64_MAX, -6, 7};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        p.rotary_dim = dims[i];
        p.rotary_seqlen = -dims[i];
        size_t ws = 0;
        fa_status st = fa_check_kvcache(&p, &ws);
        FA_CHECK(st == FA_OK && ws == plain, "rotary_dim %lld without tables: %s, workspace %zu (want %zu)",
                 (long long)dims[i], fa_strerror(st), ws, plain);
    }
    p.rotary_dim = INT64_MAX;
    FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "fa_kvcache_forward with an unused rotary_dim: %s", fa_last_error());
    fa_kv_problem_destroy(&kp);
}

/* A cache of capacity 1: the row strides of the caches are unused and may be huge (the engine
 * once stepped a pointer by them: undefined behaviour the fuzzer found under UBSan). */
FA_TEST(kvcache_unused_cache_row_stride) {
    for (int splits = 1; splits <= 3; splits += 2) {
        fa_kv_spec s = kv_base(FA_DTYPE_F32, 1, 1, 1, 1, 16, 1);
        s.full = 1;
        s.num_splits = splits;
        fa_kv_problem kp;
        if (!FA_CHECK(fa_kv_problem_create(&kp, &s) == 0, "create")) return;
        fa_params p = kp.params;
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "clean: %s", fa_last_error());
        float clean[16];
        memcpy(clean, p.o, sizeof clean);
        p.k_row_stride = p.v_row_stride = INT64_MAX - 1;
        p.k_batch_stride = p.v_batch_stride = p.q_batch_stride = p.o_batch_stride = INT64_MAX;
        FA_CHECK(fa_kvcache_forward(&p) == FA_OK, "huge unused strides: %s", fa_last_error());
        FA_CHECK(!memcmp(p.o, clean, sizeof clean), "splits %d: result changed", splits);
        fa_kv_problem_destroy(&kp);
    }
}
