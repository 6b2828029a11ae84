/*
 * test_paged.c: fa_forward with a paged K/V (block_table, as flash_attn_varlen_func's chunked
 * prefill) on the CPU, batched and varlen, pages of 1, 3 and 16 tokens in a shuffled pool whose
 * unread pages hold garbage, against the float64 oracle of the same problem unpaged (dropout
 * included in one variant); and the bad input of the new fields (block_table with fa_forward,
 * dropout_p, attn_probs): each rejected with its own status, a message naming the field, and
 * nothing written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct paged_pool {
    void *k, *v;
    int32_t *table;
    int64_t num_pages, table_stride;
} paged_pool;

/* The keys and values of tp, page by page into a shuffled pool (page_size tokens per page). */
static int make_pool(const fa_test_problem *tp, int64_t page_size, fa_test_rng *rng, paged_pool *pool) {
    const fa_params *p = &tp->params;
    const int64_t hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    const size_t es = fa_test_dtype_size(p->dtype);
    const int varlen = p->cu_seqlens_k != NULL;
    pool->table_stride = (p->seqlen_k + page_size - 1) / page_size + 2;
    int64_t pages = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t len = varlen ? p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->seqlen_k;
        pages += (len + page_size - 1) / page_size;
    }
    pool->num_pages = pages + 3;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)pool->num_pages);
    pool->k = malloc((size_t)(pool->num_pages * page_size * hkv * d) * es);
    pool->v = malloc((size_t)(pool->num_pages * page_size * hkv * dv) * es);
    pool->table = malloc(sizeof(int32_t) * (size_t)(p->batch * pool->table_stride));
    if (!order || !pool->k || !pool->v || !pool->table) return 0;
    for (int64_t e = 0; e < pool->num_pages * page_size * hkv * d; e++) fa_test_store(pool->k, p->dtype, e, 300.0);
    for (int64_t e = 0; e < pool->num_pages * page_size * hkv * dv; e++) fa_test_store(pool->v, p->dtype, e, -300.0);
    for (int64_t i = 0; i < pool->num_pages; i++) order[i] = i;
    for (int64_t i = pool->num_pages - 1; i > 0; i--) {
        int64_t j = fa_test_rng_int(rng, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int64_t e = 0; e < p->batch * pool->table_stride; e++) pool->table[e] = -1; /* never read */
    int64_t next = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t len = varlen ? p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->seqlen_k;
        for (int64_t t = 0; t < len; t++) {
            if (t % page_size == 0) pool->table[b * pool->table_stride + t / page_size] = (int32_t)order[next++];
            int64_t page = pool->table[b * pool->table_stride + t / page_size];
            for (int64_t h = 0; h < hkv; h++) {
                int64_t row = varlen ? (p->cu_seqlens_k[b] + t) * p->k_row_stride : b * p->k_batch_stride + t * p->k_row_stride;
                int64_t vrow = varlen ? (p->cu_seqlens_k[b] + t) * p->v_row_stride : b * p->v_batch_stride + t * p->v_row_stride;
                int64_t dst = ((page * page_size + t % page_size) * hkv + h);
                memcpy((char *)pool->k + (size_t)(dst * d) * es, (const char *)p->k + (size_t)(row + h * p->k_head_stride) * es,
                       (size_t)d * es);
                memcpy((char *)pool->v + (size_t)(dst * dv) * es, (const char *)p->v + (size_t)(vrow + h * p->v_head_stride) * es,
                       (size_t)dv * es);
            }
        }
    }
    free(order);
    return 1;
}

static void free_pool(paged_pool *pool) {
    free(pool->k);
    free(pool->v);
    free(pool->table);
}

static fa_params paged_params(const fa_test_problem *tp, const paged_pool *pool, int64_t page_size) {
    fa_params p = tp->params;
    const int64_t hkv = p.heads_kv;
    p.k = pool->k;
    p.v = pool->v;
    p.k_batch_stride = page_size * hkv * p.head_dim;
    p.k_row_stride = hkv * p.head_dim;
    p.k_head_stride = p.head_dim;
    p.v_batch_stride = page_size * hkv * p.head_dim_v;
    p.v_row_stride = hkv * p.head_dim_v;
    p.v_head_stride = p.head_dim_v;
    p.block_table = pool->table;
    p.block_table_batch_stride = pool->table_stride;
    p.page_size = page_size;
    p.num_pages = pool->num_pages;
    return p;
}

FA_TEST(paged_forward) {
    static const int64_t page_sizes[3] = {1, 3, 16};
    fa_test_rng rng;
    fa_test_rng_seed(&rng, fa_test_seed() + 404);
    for (int di = 0; di < 3; di++)
        for (int varlen = 0; varlen < 2; varlen++)
            for (int pi = 0; pi < 3; pi++) {
                fa_test_spec spec = fa_test_base_spec(fa_test_cpu_dtypes[di], varlen ? 4 : 2, 37, 61, 6, 2, 40);
                spec.varlen = varlen;
                spec.causal = 1;
                spec.sinks = pi == 1;
                spec.layout = FA_TEST_LAYOUT_PADDED;
                spec.backward = 0;
                if (pi == 2) {
                    spec.dropout_p = 0.2f;
                    spec.dropout_seed = spec.seed + 3;
                }
                fa_test_problem tp;
                if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
                fa_ref_gathered g;
                fa_ref_outputs ref, base;
                paged_pool pool;
                memset(&pool, 0, sizeof pool);
                if (FA_CHECK(fa_ref_references(&tp.params, spec.dtype, 0, &g, &ref, &base) == 0 &&
                                 make_pool(&tp, page_sizes[pi], &rng, &pool),
                             "allocation")) {
                    fa_params p = paged_params(&tp, &pool, page_sizes[pi]);
                    size_t ws = 0;
                    fa_status c = fa_check_forward(&p, &ws);
                    fa_test_poison_forward_outputs(&tp);
                    fa_status s = fa_forward(&p);
                    char label[256];
                    fa_test_describe(&tp, label, sizeof label);
                    FA_CHECK(c == FA_OK && s == FA_OK, "%s page %lld: %s", label, (long long)page_sizes[pi],
                             fa_last_error());
                    if (s == FA_OK) {
                        static const int tensors[2] = {FA_T_O, FA_T_LSE};
                        for (int t = 0; t < 2; t++) {
                            fa_test_check r = fa_test_compare(&tp, tensors[t], &ref, &base);
                            FA_CHECK(r.ok, "%s %s page %lld varlen %d: err %.3e tol %.3e unwritten %lld clobbered %lld",
                                     fa_test_dtype_name(spec.dtype), fa_test_tensor_name(tensors[t]),
                                     (long long)page_sizes[pi], varlen, r.err, r.tol, (long long)r.unwritten,
                                     (long long)r.clobbered);
                        }
                    }
                    /* a caller workspace of exactly the size fa_check_forward reported */
                    void *buffer = malloc(ws);
                    p.workspace = buffer;
                    p.workspace_bytes = ws;
                    fa_test_poison_forward_outputs(&tp);
                    s = fa_forward(&p);
                    fa_test_check r = fa_test_compare(&tp, FA_T_O, &ref, &base);
                    FA_CHECK(buffer && s == FA_OK && r.ok, "page %lld with a caller workspace of %zu bytes: %s",
                             (long long)page_sizes[pi], ws, s == FA_OK ? "wrong o" : fa_last_error());
                    free(buffer);
                    fa_ref_references_free(&g, &ref, &base);
                }
                free_pool(&pool);
                fa_test_problem_destroy(&tp);
            }
}

/* ---- bad input ------------------------------------------------------------------------------ */

/* `word` occurs in `text` not as part of a longer identifier */
static int mentions(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *at = strstr(text, word); at; at = strstr(at + 1, word)) {
        char b = at > text ? at[-1] : ' ', c = at[n];
        int before = b == '_' || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9');
        int after = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!before && !after) return 1;
    }
    return 0;
}

enum { C_FWD = 1, C_CFWD = 2, C_STD = 4, C_BWD = 8, C_CBWD = 16, C_ALL = 31 };

static fa_status call(int which, const fa_params *p) {
    switch (which) {
    case C_FWD: return fa_forward(p);
    case C_CFWD: return fa_check_forward(p, NULL);
    case C_STD: return fa_standard_forward(p);
    case C_BWD: return fa_backward(p);
    default: return fa_check_backward(p, NULL);
    }
}

static void expect_error(const char *label, fa_test_problem *tp, const fa_params *p, int calls, fa_status want,
                         const char *field) {
    for (int which = 1; which <= C_CBWD; which <<= 1) {
        if (!(calls & which)) continue;
        fa_params other = tp->params;
        other.device = (fa_device)77;
        (void)fa_forward(&other); /* leave another message behind */
        fa_test_poison_forward_outputs(tp);
        fa_test_poison_backward_outputs(tp);
        fa_status got = call(which, p);
        const char *message = fa_last_error();
        FA_CHECK(got == want, "%s (call %d): %s, want %s: %s", label, which, fa_strerror(got), fa_strerror(want),
                 message);
        FA_CHECK(mentions(message, field), "%s (call %d): message does not name %s: \"%s\"", label, which, field,
                 message);
        static const int outputs[] = {FA_T_O, FA_T_LSE, FA_T_DQ, FA_T_DK, FA_T_DV};
        int untouched = 1;
        for (int t = 0; t < 5; t++) untouched &= fa_test_buffer_all_poison(tp, outputs[t]);
        FA_CHECK(untouched, "%s (call %d): an output was written", label, which);
        FA_CHECK(fa_test_inputs_unchanged(tp), "%s (call %d): an input changed", label, which);
    }
}

FA_TEST(paged_dropout_errors) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 3, 5, 7, 4, 2, 8);
    spec.varlen = 1;
    spec.layout = FA_TEST_LAYOUT_PADDED;
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
    float probs[3 * 4 * 5 * 7];
    fa_params p;
#define BAD(edit, calls, status, field) \
    do {                                \
        p = tp.params;                  \
        edit;                           \
        expect_error(#edit, &tp, &p, calls, status, field); \
    } while (0)
    BAD(p.dropout_p = -0.1f, C_ALL, FA_ERR_INVALID_ARGUMENT, "dropout_p");
    BAD(p.dropout_p = 1.0f, C_ALL, FA_ERR_INVALID_ARGUMENT, "dropout_p");
    BAD(p.dropout_p = NAN, C_ALL, FA_ERR_INVALID_ARGUMENT, "dropout_p");
    BAD(p.dropout_p = INFINITY, C_ALL, FA_ERR_INVALID_ARGUMENT, "dropout_p");
    BAD(p.dropout_p = 0.5f, C_STD, FA_ERR_UNSUPPORTED, "dropout_p");
    BAD(p.attn_probs = probs, C_STD, FA_ERR_UNSUPPORTED, "attn_probs");
    BAD((p.dropout_p = 0.5f, p.batch = (int64_t)1 << 30, p.heads_q = 8, p.heads_kv = 8, p.cu_seqlens_q = NULL,
         p.cu_seqlens_k = NULL),
        C_FWD | C_CFWD, FA_ERR_INVALID_SIZE, "heads_q");

    fa_test_rng rng;
    fa_test_rng_seed(&rng, spec.seed);
    paged_pool pool;
    memset(&pool, 0, sizeof pool);
    if (FA_CHECK(make_pool(&tp, 3, &rng, &pool), "pool")) {
        const fa_params paged = paged_params(&tp, &pool, 3);
        FA_CHECK(fa_check_forward(&paged, NULL) == FA_OK, "the paged problem is valid: %s", fa_last_error());
#define BAD_PAGED(edit, calls, status, field) \
    do {                                      \
        p = paged;                            \
        edit;                                 \
        expect_error(#edit, &tp, &p, calls, status, field); \
    } while (0)
        BAD_PAGED((void)0, C_STD | C_BWD | C_CBWD, FA_ERR_UNSUPPORTED, "block_table");
        BAD_PAGED(p.page_size = 0, C_FWD | C_CFWD, FA_ERR_INVALID_SIZE, "page_size");
        BAD_PAGED(p.num_pages = 0, C_FWD | C_CFWD, FA_ERR_INVALID_SIZE, "num_pages");
        BAD_PAGED(p.block_table_batch_stride = 2, C_FWD | C_CFWD, FA_ERR_STRIDE, "block_table_batch_stride");
        BAD_PAGED(p.k_batch_stride = -1, C_FWD | C_CFWD, FA_ERR_STRIDE, "k_batch_stride");
        BAD_PAGED(p.v_row_stride = -4, C_FWD | C_CFWD, FA_ERR_STRIDE, "v_row_stride");
        /* the first page of the first sequence with keys (a page the call reads) */
        int64_t seq = 0;
        while (seq + 1 < paged.batch && paged.cu_seqlens_k[seq + 1] == paged.cu_seqlens_k[seq]) seq++;
        int32_t *entry = &pool.table[seq * pool.table_stride], kept = *entry;
        *entry = (int32_t)pool.num_pages;
        BAD_PAGED((void)0, C_FWD | C_CFWD, FA_ERR_INVALID_ARGUMENT, "block_table");
        *entry = -1;
        BAD_PAGED((void)0, C_FWD | C_CFWD, FA_ERR_INVALID_ARGUMENT, "block_table");
        *entry = kept;
#undef BAD_PAGED
    }
#undef BAD
    free_pool(&pool);
    fa_test_problem_destroy(&tp);
}
