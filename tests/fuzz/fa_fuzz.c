/*
 * fa_fuzz.c: the validation promise under a fuzzer. Bytes become an fa_params (forward,
 * backward, standard), a KV-cache call (unquantised or int8 / Q8_0 / e4m3 caches with their
 * scales), an fa_merge_params or a ring call (CPU device, small sizes), with buffers allocated to match the strides the bytes chose; some fields then get
 * hostile values (huge, negative or overflowing strides and sizes, misaligned or aliased
 * pointers, unused fields set, NaN inputs). Every check function and call runs; asserted:
 *   - no crash, no sanitizer report (built with ASan + UBSan),
 *   - a call that does not return FA_OK writes nothing: every output buffer keeps its poison,
 *   - the check function and the call agree on the status,
 *   - a hostile value whose byte span cannot be allocated is rejected.
 * Built two ways (tests/fuzz/Makefile.inc): with libFuzzer (clang -fsanitize=fuzzer), and as a
 * standalone driver (any C compiler) whose main replays files and directories given on the
 * command line, then runs random inputs for FA_FUZZ_SECONDS seconds (default 0).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

/* ---- bytes -> values ------------------------------------------------------------------------ */

typedef struct reader {
    const uint8_t *data;
    size_t size, at;
} reader;

static uint32_t take(reader *r, uint32_t n) { /* uniform-ish in [0, n) */
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = (v << 8) | (r->at < r->size ? r->data[r->at++] : 0);
    return n ? v % n : 0;
}
static int chance(reader *r, uint32_t one_in) { return take(r, one_in) == 0; }

static const int64_t hostile_values[] = {
    -1, -5, 0, 1, 2, 3, 7, INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)1 << 31, (int64_t)1 << 40,
    (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1,
    (int64_t)1 << 32, 1000003};
static int64_t hostile(reader *r) {
    return hostile_values[take(r, sizeof hostile_values / sizeof hostile_values[0])];
}

/* ---- buffers -------------------------------------------------------------------------------- */

#define MAX_BUFFERS 24
#define POISON 0xA5
#define MAX_ELEMS ((int64_t)1 << 16) /* a buffer larger than this is never allocated             */

typedef struct buffer {
    uint8_t *bytes;
    size_t size;
    int output;
} buffer;

typedef struct arena {
    buffer b[MAX_BUFFERS];
    int n;
    int must_reject; /* a chosen span overflows int64: every check must reject the call      */
    int no_call;     /* the params imply more memory than was allocated (a valid but large
                        size or stride): only the check functions run, never the call      */
} arena;

/* A buffer for `elems` elements of `elem` bytes (+ 16 bytes slack for pointer shifts), filled
 * with small values (inputs) or poison (outputs). */
static void *alloc_buf(arena *a, reader *r, int64_t elems, int elem, int output) {
    if (elems < 1) elems = 1;
    if (elems > MAX_ELEMS) {
        a->no_call = 1;
        elems = 1;
    }
    size_t size = (size_t)elems * (size_t)elem + 16;
    uint8_t *p = malloc(size);
    if (!p || a->n == MAX_BUFFERS) abort();
    if (output) {
        memset(p, POISON, size);
    } else if (elem == 2) {
        for (size_t i = 0; i + 1 < size; i += 2) {
            uint16_t v = (uint16_t)(0x3c00 + (take(r, 64) << 2) - 0x80); /* f16/bf16: modest values */
            memcpy(p + i, &v, 2);
        }
    } else {
        for (size_t i = 0; i + 3 < size; i += 4) {
            float v = ((float)take(r, 2001) - 1000.0f) / 500.0f;
            memcpy(p + i, &v, 4);
        }
    }
    a->b[a->n].bytes = p;
    a->b[a->n].size = size;
    a->b[a->n].output = output;
    a->n++;
    return p;
}

static int outputs_poisoned(const arena *a) {
    for (int i = 0; i < a->n; i++)
        if (a->b[i].output)
            for (size_t j = 0; j < a->b[i].size; j++)
                if (a->b[i].bytes[j] != POISON) return 0;
    return 1;
}

static void repoison(arena *a) {
    for (int i = 0; i < a->n; i++)
        if (a->b[i].output) memset(a->b[i].bytes, POISON, a->b[i].size);
}

static void free_all(arena *a) {
    for (int i = 0; i < a->n; i++) free(a->b[i].bytes);
    a->n = 0;
}

/* elements spanned by a [n0, n1, n2, dim] view with strides s0..s2 (-1: overflow or negative) */
static int64_t span_of(int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t n2, int64_t s2, int64_t dim) {
    int64_t n[3] = {n0, n1, n2}, s[3] = {s0, s1, s2}, total = dim;
    if (dim <= 0 || n0 <= 0 || n1 <= 0 || n2 <= 0) return 0; /* empty: no element is addressed */
    for (int i = 0; i < 3; i++) {
        if (n[i] == 1) continue;
        int64_t m;
        if (s[i] < 0 || __builtin_mul_overflow(n[i] - 1, s[i], &m) || __builtin_add_overflow(total, m, &total))
            return -1;
    }
    return total;
}

static void fail(const char *what, fa_status s) {
    fprintf(stderr, "fa_fuzz: %s (status %s: %s)\n", what, fa_strerror(s), fa_last_error());
    abort();
}

/* Strides of one [batch, rows, heads, dim] tensor: contiguous, padded, or (rarely) hostile. */
static void pick_strides(reader *r, int64_t batch_rows, int64_t rows, int64_t heads, int64_t dim, int64_t *bs,
                         int64_t *rs, int64_t *hs) {
    int64_t pad = take(r, 4) == 0 ? take(r, 5) : 0;
    *hs = dim + pad;
    *rs = heads * *hs + (take(r, 4) == 0 ? take(r, 7) : 0);
    *bs = rows * *rs + (take(r, 4) == 0 ? take(r, 9) : 0);
    (void)batch_rows;
    if (chance(r, 24)) *hs = hostile(r);
    if (chance(r, 24)) *rs = hostile(r);
    if (chance(r, 24)) *bs = hostile(r);
}

/* Pointer to a tensor with the given view, allocated to its span. */
static void *tensor(arena *a, reader *r, int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t n2, int64_t s2,
                    int64_t dim, int elem, int output) {
    int64_t span = span_of(n0, s0, n1, s1, n2, s2, dim);
    if (span < 0) {
        if (getenv("FA_FUZZ_DEBUG"))
            fprintf(stderr, "overflowing view [%lld %lld, %lld %lld, %lld %lld] dim %lld\n", (long long)n0,
                    (long long)s0, (long long)n1, (long long)s1, (long long)n2, (long long)s2, (long long)dim);
        a->must_reject = 1;
        span = 1;
    }
    return alloc_buf(a, r, span, elem, output);
}

/* ---- attention calls ------------------------------------------------------------------------ */

/* Sometimes a score bias (and its gradient), a block mask (lists valid or broken: unsorted,
 * duplicated, out of range, a block both partial and full, a count past the blocks), bits and
 * document ids, with broadcast or hostile strides. */
static void fuzz_score_mods(reader *r, arena *a, fa_params *p, int64_t b, int64_t hq, int64_t sq, int64_t sk,
                            int64_t tokens_q, int64_t tokens_k, int backward) {
    if (take(r, 4) == 0) {
        p->bias_dtype = (fa_dtype)take(r, 3);
        const int elem = p->bias_dtype == FA_DTYPE_F32 ? 4 : 2;
        p->bias_col_stride = take(r, 4) ? 1 : 0;
        p->bias_row_stride = take(r, 4) ? sk + take(r, 3) : 0;
        p->bias_head_stride = take(r, 3) ? (sq > 0 ? sq : 1) * (sk + 3) : 0;
        p->bias_batch_stride = take(r, 3) ? hq * (sq > 0 ? sq : 1) * (sk + 3) : 0;
        if (chance(r, 16)) p->bias_row_stride = hostile(r);
        if (chance(r, 24)) p->bias_col_stride = hostile(r);
        const int64_t dim = p->bias_col_stride == 0 ? 1 : sk;
        p->bias = tensor(a, r, b, p->bias_batch_stride, hq, p->bias_head_stride, sq, p->bias_row_stride, dim, elem, 0);
        if (backward && take(r, 2)) {
            p->dbias_col_stride = p->bias_col_stride == 1 ? 1 : 0;
            p->dbias_row_stride = p->bias_row_stride ? sk : 0;
            p->dbias_head_stride = p->bias_head_stride ? (sq > 0 ? sq : 1) * sk : 0;
            p->dbias_batch_stride = p->bias_batch_stride ? hq * (sq > 0 ? sq : 1) * sk : 0;
            if (chance(r, 16)) p->dbias_head_stride = hostile(r);
            /* f32, f16 or bf16; now and then a value that is none of them (rejected) */
            p->dbias_dtype = chance(r, 24) ? (fa_dtype)(3 + take(r, 5)) : (fa_dtype)take(r, 3);
            p->dbias = tensor(a, r, p->dbias_batch_stride ? b : 1, p->dbias_batch_stride,
                              p->dbias_head_stride ? hq : 1, p->dbias_head_stride, p->dbias_row_stride ? sq : 1,
                              p->dbias_row_stride, p->dbias_col_stride ? sk : 1,
                              p->dbias_dtype == FA_DTYPE_F16 || p->dbias_dtype == FA_DTYPE_BF16 ? 2 : 4, 1);
        }
    }
    if (take(r, 5) == 0) {
        p->block_q = 1 + take(r, 9);
        p->block_k = 1 + take(r, 9);
        const int64_t qb = (sq + p->block_q - 1) / p->block_q, kb = (sk + p->block_k - 1) / p->block_k;
        const int64_t nb = take(r, 2) ? b : 1, nh = take(r, 2) ? hq : 1;
        const int64_t lists = nb * nh * (qb > 0 ? qb : 1), width = kb > 0 ? kb : 1;
        if (lists * width > MAX_ELEMS / 16) return; /* the check functions read every list */
        int32_t *counts = alloc_buf(a, r, lists, 4, 0), *index = alloc_buf(a, r, lists * width, 4, 0);
        int32_t *full_counts = alloc_buf(a, r, lists, 4, 0), *full_index = alloc_buf(a, r, lists * width, 4, 0);
        for (int64_t l = 0; l < lists; l++) {
            int32_t n_part = 0, n_full = 0;
            for (int64_t k = 0; k < kb; k++) {
                const uint32_t u = take(r, 3);
                if (u == 1) index[l * width + n_part++] = (int32_t)k;
                if (u == 2) full_index[l * width + n_full++] = (int32_t)k;
            }
            counts[l] = n_part;
            full_counts[l] = n_full;
        }
        if (chance(r, 4) && lists > 0) { /* one broken list */
            const int64_t l = take(r, (uint32_t)lists);
            switch (take(r, 5)) {
            case 0: counts[l] = (int32_t)kb + 1; break;                                     /* too many */
            case 1: counts[l] = 1, index[l * width] = (int32_t)(take(r, 2) ? kb : -1); break; /* range */
            case 2: if (kb >= 2) counts[l] = 2, index[l * width] = 1, index[l * width + 1] = 0; break;
            case 3: if (kb >= 1) counts[l] = 1, full_counts[l] = 1, index[l * width] = full_index[l * width] = 0; break;
            default: full_counts[l] = -1; break;
            }
        }
        p->kv_num_blocks = counts;
        p->kv_indices = index;
        if (take(r, 2)) {
            p->full_kv_num_blocks = full_counts;
            p->full_kv_indices = full_index;
        }
        p->block_count_batch_stride = nb > 1 ? nh * qb : 0;
        p->block_count_head_stride = nh > 1 ? qb : 0;
        p->block_index_row_stride = width;
        p->block_index_head_stride = nh > 1 ? qb * width : 0;
        p->block_index_batch_stride = nb > 1 ? nh * qb * width : 0;
        if (chance(r, 16)) { /* only values the validation must reject: the lists are read */
            const int64_t hv = hostile(r);
            if (hv < 0 || span_of(nb, p->block_index_batch_stride, nh, p->block_index_head_stride, qb, hv, kb) < 0) {
                p->block_index_row_stride = hv;
                a->must_reject = 1;
            }
        }
        if (take(r, 2)) {
            const int64_t bytes = (p->block_q * p->block_k + 7) / 8;
            p->partial_block_bits = alloc_buf(a, r, lists * width * bytes, 1, 0);
        }
        if (chance(r, 16)) { /* out of range: rejected; larger: fewer query blocks, other bits */
            const int64_t hv = hostile(r);
            if (hv < 1 || hv > INT32_MAX) p->block_q = hv, a->must_reject = 1;
            else if (hv >= p->block_q) p->block_q = hv, a->no_call = 1;
        }
    }
    if (take(r, 6) == 0) {
        int32_t *dq = alloc_buf(a, r, tokens_q, 4, 0), *dk = alloc_buf(a, r, tokens_k, 4, 0);
        for (int64_t t = 0; t < tokens_q; t++) dq[t] = (int32_t)take(r, 3);
        for (int64_t t = 0; t < tokens_k; t++) dk[t] = (int32_t)take(r, 3);
        p->doc_ids_q = dq;
        p->doc_ids_k = dk;
        p->doc_ids_q_batch_stride = sq;
        p->doc_ids_k_batch_stride = sk;
        if (chance(r, 8)) p->doc_ids_k = NULL;
    }
}

static void fuzz_attention(reader *r, arena *a, int mode) {
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CPU;
    p.dtype = (fa_dtype)take(r, 3);
    if (chance(r, 40)) p.dtype = (fa_dtype)(int)hostile(r);
    const int elem = p.dtype == FA_DTYPE_F32 ? 4 : 2;
    p.batch = 1 + take(r, 3);
    p.seqlen_q = take(r, 10);
    p.seqlen_k = take(r, 12);
    p.heads_kv = 1 + take(r, 2);
    p.heads_q = p.heads_kv * (1 + take(r, 3));
    p.head_dim = 1 + take(r, 20);
    p.head_dim_v = take(r, 3) == 0 ? 1 + take(r, 20) : 0;
    p.num_threads = 1 + take(r, 2);
    if (chance(r, 30)) p.heads_q = hostile(r);
    if (chance(r, 30)) p.seqlen_q = hostile(r);
    if (chance(r, 30)) p.head_dim = hostile(r);
    const int64_t b = p.batch, sk = p.seqlen_k, hkv = p.heads_kv;
    const int64_t sq = p.seqlen_q >= 0 && p.seqlen_q < 64 ? p.seqlen_q : 1;
    const int64_t hq = p.heads_q > 0 && p.heads_q < 64 ? p.heads_q : 1;
    const int64_t d = p.head_dim > 0 && p.head_dim < 64 ? p.head_dim : 1, dv = p.head_dim_v ? p.head_dim_v : d;
    if (sq != p.seqlen_q || hq != p.heads_q || d != p.head_dim) a->no_call = 1; /* buffers follow the clamped sizes */
    int varlen = take(r, 4) == 0;
    int64_t rows_q = sq, rows_k = sk, nb = b;
    static int32_t cu_q[9], cu_k[9];
    if (varlen) {
        cu_q[0] = cu_k[0] = 0;
        for (int64_t i = 0; i < b; i++) {
            cu_q[i + 1] = cu_q[i] + (int32_t)take(r, (uint32_t)sq + 1);
            cu_k[i + 1] = cu_k[i] + (int32_t)take(r, (uint32_t)sk + 1);
        }
        if (chance(r, 10)) cu_q[take(r, (uint32_t)b + 1)] += (int32_t)take(r, 5) - 2;
        p.cu_seqlens_q = cu_q;
        p.cu_seqlens_k = cu_k;
        p.total_q = cu_q[b] + take(r, 3);
        p.total_k = cu_k[b] + take(r, 3);
        if (chance(r, 20)) p.total_q = hostile(r);
        rows_q = p.total_q >= 0 && p.total_q < 1024 ? p.total_q : 1;
        if (rows_q != p.total_q) a->no_call = 1;
        rows_k = p.total_k;
        nb = 1;
    }
    pick_strides(r, b, rows_q, hq, d, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
    pick_strides(r, b, rows_k, hkv, d, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
    pick_strides(r, b, rows_k, hkv, dv, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
    pick_strides(r, b, rows_q, hq, dv, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
    pick_strides(r, b, rows_q, hq, dv, &p.do_batch_stride, &p.do_row_stride, &p.do_head_stride);
    pick_strides(r, b, rows_q, hq, d, &p.dq_batch_stride, &p.dq_row_stride, &p.dq_head_stride);
    pick_strides(r, b, rows_k, hkv, d, &p.dk_batch_stride, &p.dk_row_stride, &p.dk_head_stride);
    pick_strides(r, b, rows_k, hkv, dv, &p.dv_batch_stride, &p.dv_row_stride, &p.dv_head_stride);
    if (varlen) p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = p.do_batch_stride =
        p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = take(r, 2) ? 0 : hostile(r);
#define T(name, rows, heads, dim, out)                                                            \
    tensor(a, r, nb, p.name##_batch_stride, rows, p.name##_row_stride, heads, p.name##_head_stride, dim, elem, out)
    int backward = mode == 1;
    p.q = T(q, rows_q, hq, d, 0);
    p.k = T(k, rows_k, hkv, d, 0);
    p.v = T(v, rows_k, hkv, dv, 0);
    p.o = T(o, rows_q, hq, dv, !backward);
    p.lse = alloc_buf(a, r, hq * rows_q * (varlen ? 1 : b), 4, !backward);
    if (backward) {
        p.dout = T(do, rows_q, hq, dv, 0);
        p.dq = T(dq, rows_q, hq, d, 1);
        p.dk = T(dk, rows_k, hkv, d, 1);
        p.dv = T(dv, rows_k, hkv, dv, 1);
        if (take(r, 2)) p.dsink = alloc_buf(a, r, hq, 4, 1);
    }
#undef T
    /* features */
    p.causal = take(r, 2);
    p.use_window = take(r, 3) == 0;
    p.window_left = (int32_t)take(r, 6) - 1;
    p.window_right = (int32_t)take(r, 6) - 1;
    if (take(r, 3) == 0) p.softcap = (float)take(r, 8);
    if (take(r, 3) == 0) {
        p.alibi_batch_stride = take(r, 2) ? 0 : hq + take(r, 3);
        p.alibi_slopes = alloc_buf(a, r, (b - 1) * p.alibi_batch_stride + hq, 4, 0);
    }
    if (chance(r, 8)) {
        p.alibi_batch_stride = hostile(r);
        if (p.alibi_slopes) a->no_call = 1; /* a valid large stride reads past the slopes */
    }
    if (take(r, 3) == 0) p.sink_logits = alloc_buf(a, r, hq, 4, 0);
    fuzz_score_mods(r, a, &p, b, hq, sq, sk, varlen ? rows_q : b * sq, varlen ? rows_k : b * sk, backward);
    if (chance(r, 16)) p.softmax_scale = take(r, 2) ? NAN : INFINITY;
    /* hostile pointers: misaligned, aliased */
    if (chance(r, 16)) p.lse = (float *)(void *)((char *)p.lse + 1 + take(r, 3));
    if (chance(r, 16)) p.q = (const char *)p.q + 1;
    /* aliased outputs: rejected unless the tensors share no element (an empty one), and then the
     * other buffer may be too small for the output: checks only */
    if (chance(r, 12)) p.o = (void *)(take(r, 2) ? p.k : p.q), a->no_call = 1;
    if (backward && chance(r, 12)) p.dk = take(r, 2) ? p.dq : p.dv, a->no_call = 1;
    if (chance(r, 12)) { /* a NaN input */
        float nanf_ = NAN;
        uint16_t nan16 = 0x7e00;
        if (elem == 4) memcpy((void *)(uintptr_t)p.q, &nanf_, 4);
        else memcpy((void *)(uintptr_t)p.k, &nan16, 2);
    }
    if (backward && !a->no_call) { /* a plausible lse: run the forward into it first (o and lse are inputs here) */
        fa_params f = p;
        f.dout = NULL, f.dq = f.dk = f.dv = NULL, f.dsink = NULL;
        (void)fa_forward(&f);
    }

    size_t ws = 0;
    fa_status check = backward ? fa_check_backward(&p, &ws) : fa_check_forward(&p, &ws);
    if (check == FA_OK && a->must_reject) fail("a span past int64 was accepted", check);
    if (!outputs_poisoned(a)) fail("a check function wrote an output", check);
    if (check == FA_OK && !a->no_call && ws > ((size_t)1 << 30)) fail("absurd workspace for a small problem", check);
    if (a->no_call) return;
    if (getenv("FA_FUZZ_DEBUG"))
        fprintf(stderr,
                "mode %d dtype %d b %lld sq %lld sk %lld hq %lld hkv %lld d %lld dv %lld varlen %d\n"
                "q %p [%lld %lld %lld] k %p [%lld %lld %lld] v %p o %p [%lld %lld %lld] lse %p\n",
                mode, (int)p.dtype, (long long)p.batch, (long long)p.seqlen_q, (long long)p.seqlen_k,
                (long long)p.heads_q, (long long)p.heads_kv, (long long)p.head_dim, (long long)p.head_dim_v, varlen,
                p.q, (long long)p.q_batch_stride, (long long)p.q_row_stride, (long long)p.q_head_stride, p.k,
                (long long)p.k_batch_stride, (long long)p.k_row_stride, (long long)p.k_head_stride, p.v, p.o,
                (long long)p.o_batch_stride, (long long)p.o_row_stride, (long long)p.o_head_stride, (void *)p.lse);
    fa_status call = mode == 0 ? fa_forward(&p) : mode == 1 ? fa_backward(&p) : fa_standard_forward(&p);
    if (mode != 2 && check != call) fail("check and call disagree", call);
    if (call != FA_OK && !outputs_poisoned(a)) fail("a failed call wrote an output", call);
}

/* ---- KV cache -------------------------------------------------------------------------------- */

static void fuzz_kvcache(reader *r, arena *a) {
    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = (fa_dtype)take(r, 3);
    const int elem = p.dtype == FA_DTYPE_F32 ? 4 : 2;
    const int64_t b = 1 + take(r, 3), sq = 1 + take(r, 4), cap = 1 + take(r, 40);
    const int64_t hkv = 1 + take(r, 2), hq = hkv * (1 + take(r, 3));
    /* a quantised cache now and then (int8 with per-row scales, Q8_0, e4m3 with per-head scales;
     * rarely a value that is none of them): one byte per element, strides in bytes, head dims
     * multiples of 8 (of 32 for Q8_0) mostly */
    p.kv_dtype = take(r, 3) == 0 ? (fa_kv_dtype)(1 + take(r, 3)) : FA_KV_SAME;
    if (chance(r, 40)) p.kv_dtype = (fa_kv_dtype)(int)hostile(r);
    const int quant = p.kv_dtype != FA_KV_SAME;
    const int64_t d = !quant ? 2 + 2 * take(r, 12) : p.kv_dtype == FA_KV_Q8_0 && take(r, 4) ? 32 * (1 + take(r, 2))
                                                                                     : 8 * (1 + take(r, 9)) - (chance(r, 8) ? 2 : 0);
    const int64_t row_bytes = p.kv_dtype == FA_KV_Q8_0 ? (d + 31) / 32 * 34 : d;
    const int cache_elem = quant ? 1 : elem;
    p.batch = b, p.seqlen_q = sq, p.seqlen_k = cap, p.heads_q = hq, p.heads_kv = hkv, p.head_dim = d;
    p.num_threads = 1 + take(r, 2);
    p.num_splits = (int)take(r, 5);
    p.causal = take(r, 2);
    const int paged = take(r, 3) == 0, append = take(r, 2);
    int64_t slabs = b, slab_rows = cap;
    static int32_t seqlens[4], table[64], leftpad[4];
    if (paged) {
        p.page_size = 1 + take(r, 8);
        int64_t per_seq = (cap + p.page_size - 1) / p.page_size;
        p.num_pages = b * per_seq;
        p.block_table_batch_stride = per_seq;
        for (int64_t i = 0; i < b * per_seq && i < 64; i++) table[i] = (int32_t)take(r, (uint32_t)p.num_pages + 1);
        p.block_table = b * per_seq <= 64 ? table : NULL;
        if (!p.block_table) return;
        slabs = p.num_pages;
        slab_rows = p.page_size;
    }
    for (int64_t i = 0; i < b; i++) {
        seqlens[i] = (int32_t)take(r, (uint32_t)cap + 2);
        leftpad[i] = (int32_t)take(r, (uint32_t)seqlens[i] + 2);
    }
    if (take(r, 4)) p.cache_seqlens = seqlens;
    if (take(r, 4) == 0) p.cache_leftpad = leftpad;
    int64_t s0, s1, s2;
    pick_strides(r, b, sq, hq, d, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
    pick_strides(r, b, sq, hq, d, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
    pick_strides(r, slabs, slab_rows, hkv, row_bytes, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
    pick_strides(r, slabs, slab_rows, hkv, row_bytes, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
    p.q = tensor(a, r, b, p.q_batch_stride, sq, p.q_row_stride, hq, p.q_head_stride, d, elem, 0);
    p.o = tensor(a, r, b, p.o_batch_stride, sq, p.o_row_stride, hq, p.o_head_stride, d, elem, 1);
    p.k = tensor(a, r, slabs, p.k_batch_stride, slab_rows, p.k_row_stride, hkv, p.k_head_stride, quant ? row_bytes : d,
                 cache_elem, append);
    p.v = tensor(a, r, slabs, p.v_batch_stride, slab_rows, p.v_row_stride, hkv, p.v_head_stride, quant ? row_bytes : d,
                 cache_elem, append);
    const int k_scale_as = quant && chance(r, 12) ? 1 + (int)take(r, 2) : 0; /* 1: missing, 2: v_scale's */
    if (p.kv_dtype == FA_KV_INT8) { /* [slabs, rows, heads_kv] floats, written by an append */
        pick_strides(r, slabs, slab_rows, hkv, 1, &p.v_scale_batch_stride, &p.v_scale_row_stride, &p.v_scale_head_stride);
        p.v_scale = tensor(a, r, slabs, p.v_scale_batch_stride, slab_rows, p.v_scale_row_stride, hkv,
                           p.v_scale_head_stride, 1, 4, append);
        if (k_scale_as == 0) {
            pick_strides(r, slabs, slab_rows, hkv, 1, &p.k_scale_batch_stride, &p.k_scale_row_stride,
                         &p.k_scale_head_stride);
            p.k_scale = tensor(a, r, slabs, p.k_scale_batch_stride, slab_rows, p.k_scale_row_stride, hkv,
                               p.k_scale_head_stride, 1, 4, append);
        }
    } else if (p.kv_dtype == FA_KV_FP8_E4M3) {
        p.v_scale = alloc_buf(a, r, hkv, 4, 0);
        if (k_scale_as == 0) p.k_scale = alloc_buf(a, r, hkv, 4, 0);
    }
    if (k_scale_as == 2) { /* one array (and view) for both */
        p.k_scale = p.v_scale;
        p.k_scale_batch_stride = p.v_scale_batch_stride;
        p.k_scale_row_stride = p.v_scale_row_stride;
        p.k_scale_head_stride = p.v_scale_head_stride;
    }
    if (take(r, 2)) p.lse = alloc_buf(a, r, b * hq * sq, 4, 1);
    if (append) {
        pick_strides(r, b, sq, hkv, d, &s0, &s1, &s2);
        p.knew_batch_stride = s0, p.knew_row_stride = s1, p.knew_head_stride = s2;
        p.k_new = tensor(a, r, b, s0, sq, s1, hkv, s2, d, elem, 0);
        p.vnew_batch_stride = s0, p.vnew_row_stride = s1, p.vnew_head_stride = s2;
        p.v_new = tensor(a, r, b, s0, sq, s1, hkv, s2, d, elem, 0);
        if (take(r, 3) == 0) {
            p.rotary_dim = 2 * (1 + take(r, (uint32_t)d / 2));
            p.rotary_seqlen = cap + take(r, 3);
            p.rotary_cos = alloc_buf(a, r, p.rotary_seqlen * (p.rotary_dim / 2), elem, 0);
            p.rotary_sin = alloc_buf(a, r, p.rotary_seqlen * (p.rotary_dim / 2), elem, 0);
            p.rotary_interleaved = take(r, 2);
        }
    }
    if (chance(r, 6)) p.rotary_dim = hostile(r); /* unused without tables, a size with them */
    if (chance(r, 6)) p.rotary_seqlen = hostile(r);
    if (chance(r, 12)) p.o = (void *)p.k, a->no_call = 1; /* aliased: checks only */
    if (chance(r, 16)) p.lse = (float *)(void *)((char *)(p.lse ? p.lse : (float *)p.o) + 2);
    size_t ws = 0;
    fa_status check = fa_check_kvcache(&p, &ws);
    if (check == FA_OK && a->must_reject) fail("a KV-cache span past int64 was accepted", check);
    if (check == FA_OK && ws > ((size_t)1 << 30)) fail("absurd KV-cache workspace for a small problem", check);
    if (a->no_call) return;
    if (getenv("FA_FUZZ_DEBUG"))
        fprintf(stderr,
                "kvcache dtype %d kv_dtype %d b %lld sq %lld cap %lld hq %lld hkv %lld d %lld paged %d page %lld "
                "append %d k %p [%lld %lld %lld] k_scale %p [%lld %lld %lld] v_scale %p [%lld %lld %lld]\n",
                (int)p.dtype, (int)p.kv_dtype, (long long)b, (long long)sq, (long long)cap, (long long)hq, (long long)hkv,
                (long long)d, paged, (long long)p.page_size, append, p.k, (long long)p.k_batch_stride,
                (long long)p.k_row_stride, (long long)p.k_head_stride, (void *)p.k_scale, (long long)p.k_scale_batch_stride,
                (long long)p.k_scale_row_stride, (long long)p.k_scale_head_stride, (void *)p.v_scale,
                (long long)p.v_scale_batch_stride, (long long)p.v_scale_row_stride, (long long)p.v_scale_head_stride);
    fa_status call = fa_kvcache_forward(&p);
    if (check != call) fail("fa_check_kvcache and fa_kvcache_forward disagree", call);
    if (call != FA_OK && !outputs_poisoned(a)) fail("a failed KV-cache call wrote an output", call);
}

/* ---- merge ----------------------------------------------------------------------------------- */

static void fuzz_merge(reader *r, arena *a) {
    fa_merge_params m;
    memset(&m, 0, sizeof m);
    m.parts_dtype = (fa_dtype)take(r, 3);
    m.out_dtype = (fa_dtype)take(r, 3);
    const int pe = m.parts_dtype == FA_DTYPE_F32 ? 4 : 2, oe = m.out_dtype == FA_DTYPE_F32 ? 4 : 2;
    m.num_states = 1 + take(r, 5);
    m.rows = take(r, 6);
    m.heads = 1 + take(r, 3);
    m.head_dim_v = 1 + take(r, 24);
    m.num_threads = 1;
    int64_t s = m.num_states, n = m.rows, h = m.heads, dv = m.head_dim_v;
    pick_strides(r, s, n, h, dv, &m.o_parts_state_stride, &m.o_parts_row_stride, &m.o_parts_head_stride);
    m.lse_parts_row_stride = 1;
    m.lse_parts_head_stride = n + take(r, 2);
    m.lse_parts_state_stride = h * m.lse_parts_head_stride + take(r, 2);
    if (chance(r, 8)) m.lse_parts_row_stride = hostile(r);
    if (chance(r, 8)) m.lse_parts_state_stride = hostile(r);
    m.o_head_stride = dv + take(r, 2);
    m.o_row_stride = h * m.o_head_stride;
    if (chance(r, 10)) m.o_row_stride = hostile(r);
    m.lse_row_stride = 1;
    m.lse_head_stride = n;
    m.o_parts = tensor(a, r, s, m.o_parts_state_stride, n, m.o_parts_row_stride, h, m.o_parts_head_stride, dv, pe, 0);
    m.lse_parts = tensor(a, r, s, m.lse_parts_state_stride, h, m.lse_parts_head_stride, n, m.lse_parts_row_stride, 1,
                         4, 0);
    m.o = tensor(a, r, 1, 0, n, m.o_row_stride, h, m.o_head_stride, dv, oe, 1);
    if (take(r, 2)) m.lse = alloc_buf(a, r, n * h, 4, 1);
    if (chance(r, 10)) m.o = (void *)m.o_parts, a->no_call = 1; /* aliased: not run */
    if (chance(r, 10) && m.lse) m.lse = (float *)(void *)((char *)m.lse + 2);
    { /* lse_parts: finite, -inf or NaN */
        float *lp = (float *)(uintptr_t)m.lse_parts;
        size_t count = a->b[a->n - (m.lse ? 3 : 2)].size / 4;
        for (size_t i = 0; i < count && i < 64; i++) {
            uint32_t kind = take(r, 8);
            if (kind == 0) lp[i] = -INFINITY;
            else if (kind == 1) lp[i] = NAN;
        }
    }
    if (a->no_call) return; /* fa_merge_states has no check function */
    fa_status call = fa_merge_states(&m);
    if (call == FA_OK && a->must_reject) fail("a merge span past int64 was accepted", call);
    if (call != FA_OK && !outputs_poisoned(a)) fail("a failed merge wrote an output", call);
}

/* ---- ring (one rank: checks and the world_size = 1 call) ------------------------------------- */

static void fuzz_ring(reader *r, arena *a) {
    fa_ring_params rp;
    memset(&rp, 0, sizeof rp);
    fa_params *p = &rp.attn;
    p->dtype = (fa_dtype)take(r, 3);
    const int elem = p->dtype == FA_DTYPE_F32 ? 4 : 2;
    rp.world_size = 1 + (int)take(r, 3);
    rp.rank = (int)take(r, (uint32_t)rp.world_size + 1);
    rp.sharding = (fa_ring_sharding)take(r, 3);
    rp.seqlen = take(r, 12);
    if (chance(r, 10)) rp.seqlen = hostile(r);
    p->batch = 1 + take(r, 2);
    p->heads_kv = 1 + take(r, 2);
    p->heads_q = p->heads_kv * (1 + take(r, 2));
    p->head_dim = 1 + take(r, 16);
    p->num_threads = 1;
    p->causal = take(r, 2);
    int64_t start[2], length[2];
    int chunks = 0;
    int64_t shard = 0;
    if (rp.rank < rp.world_size && rp.seqlen >= 0 && rp.seqlen < 64 &&
        fa_ring_shard(rp.seqlen, rp.world_size, rp.rank, rp.sharding, start, length, &chunks) == FA_OK)
        for (int c = 0; c < chunks; c++) shard += length[c];
    const int64_t b = p->batch, hq = p->heads_q, hkv = p->heads_kv, d = p->head_dim;
    p->seqlen_q = p->seqlen_k = shard;
    fa_set_contiguous_strides(p);
    if (chance(r, 8)) {
        p->k_row_stride = hostile(r);
        a->no_call = 1;
    }
    const int backward = take(r, 2);
    p->q = alloc_buf(a, r, b * shard * hq * d, elem, 0);
    p->k = alloc_buf(a, r, b * shard * hkv * d, elem, 0);
    p->v = alloc_buf(a, r, b * shard * hkv * d, elem, 0);
    p->o = alloc_buf(a, r, b * shard * hq * d, elem, !backward);
    p->lse = alloc_buf(a, r, b * shard * hq, 4, !backward);
    if (backward) {
        p->dout = alloc_buf(a, r, b * shard * hq * d, elem, 0);
        p->dq = alloc_buf(a, r, b * shard * hq * d, elem, 1);
        p->dk = alloc_buf(a, r, b * shard * hkv * d, elem, 1);
        p->dv = alloc_buf(a, r, b * shard * hkv * d, elem, 1);
    }
    if (chance(r, 8)) p->alibi_slopes = p->lse;
    size_t ws = 0;
    fa_status check = backward ? fa_ring_check_backward(&rp, &ws) : fa_ring_check_forward(&rp, &ws);
    if (check != FA_OK && !outputs_poisoned(a)) fail("a failed ring check wrote an output", check);
    if (rp.world_size == 1 && !a->no_call && !(rp.seqlen < 0 || rp.seqlen >= 64)) {
        repoison(a);
        fa_status call = backward ? fa_ring_backward(&rp) : fa_ring_forward(&rp);
        if (call != check) fail("fa_ring_check_* and the ring call disagree", call);
        if (call != FA_OK && !outputs_poisoned(a)) fail("a failed ring call wrote an output", call);
    }
}

/* ---- entry points ----------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size, 0};
    arena a;
    memset(&a, 0, sizeof a);
    switch (take(&r, 6)) {
    case 0: fuzz_attention(&r, &a, 0); break;
    case 1: fuzz_attention(&r, &a, 1); break;
    case 2: fuzz_attention(&r, &a, 2); break;
    case 3: fuzz_kvcache(&r, &a); break;
    case 4: fuzz_merge(&r, &a); break;
    default: fuzz_ring(&r, &a); break;
    }
    free_all(&a);
    return 0;
}

#ifdef FA_FUZZ_STANDALONE
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

static long replayed;

static void replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    replayed++;
}

static void replay(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        replay_file(path);
        return;
    }
    DIR *dir = opendir(path);
    if (!dir) return;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        replay_file(full);
    }
    closedir(dir);
}

/* fa_fuzz_standalone [FILE|DIR]...: replay, then FA_FUZZ_SECONDS of random inputs. */
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) replay(argv[i]);
    double seconds = getenv("FA_FUZZ_SECONDS") ? atof(getenv("FA_FUZZ_SECONDS")) : 0.0;
    uint64_t state = (uint64_t)time(NULL) * 2654435761u + 1;
    long random_runs = 0;
    time_t start = time(NULL);
    while (difftime(time(NULL), start) < seconds) {
        uint8_t buf[256];
        for (size_t i = 0; i < sizeof buf; i++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            buf[i] = (uint8_t)state;
        }
        LLVMFuzzerTestOneInput(buf, 16 + (size_t)(state % 240));
        random_runs++;
    }
    printf("fa_fuzz_standalone: %ld inputs replayed, %ld random inputs, no finding\n", replayed, random_runs);
    return 0;
}
#endif
