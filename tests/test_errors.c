/*
 * test_errors.c: every bad input gets its own fa_status, a per-thread message naming the field,
 * and leaves every output bit-identical (poisoned buffers stay poisoned) and every input alone.
 * Each case runs through every call it applies to: fa_forward, fa_check_forward,
 * fa_standard_forward, fa_backward, fa_check_backward.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum {
    C_FWD = 1,   /* fa_forward          */
    C_CFWD = 2,  /* fa_check_forward    */
    C_STD = 4,   /* fa_standard_forward */
    C_BWD = 8,   /* fa_backward         */
    C_CBWD = 16, /* fa_check_backward   */
    C_FWDS = C_FWD | C_CFWD | C_STD,
    C_BWDS = C_BWD | C_CBWD,
    C_ALL = C_FWDS | C_BWDS
};

static fa_status call(int which, const fa_params *p) {
    switch (which) {
    case C_FWD: return fa_forward(p);
    case C_CFWD: return fa_check_forward(p, NULL);
    case C_STD: return fa_standard_forward(p);
    case C_BWD: return fa_backward(p);
    default: return fa_check_backward(p, NULL);
    }
}

static const char *call_name(int which) {
    switch (which) {
    case C_FWD: return "fa_forward";
    case C_CFWD: return "fa_check_forward";
    case C_STD: return "fa_standard_forward";
    case C_BWD: return "fa_backward";
    default: return "fa_check_backward";
    }
}

/* `word` occurs in `text` not as part of a longer identifier */
static int mentions(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *at = strstr(text, word); at; at = strstr(at + 1, word)) {
        int before = at > text && (at[-1] == '_' || (at[-1] >= 'a' && at[-1] <= 'z') ||
                                   (at[-1] >= 'A' && at[-1] <= 'Z') || (at[-1] >= '0' && at[-1] <= '9'));
        char c = at[n];
        int after = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!before && !after) return 1;
    }
    return 0;
}

static int outputs_untouched(const fa_test_problem *tp) {
    static const int outputs[] = {FA_T_O, FA_T_LSE, FA_T_DQ, FA_T_DK, FA_T_DV, FA_T_DSINK};
    for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++)
        if (!fa_test_buffer_all_poison(tp, outputs[i])) return 0;
    return 1;
}

/* Run p through every call in `calls`; each must return `want`, set a fresh message naming one
 * of `fields` (NULL-terminated), and write nothing. p == NULL tests the NULL params pointer. */
static void expect_error(const char *label, const fa_test_problem *tp, const fa_params *p,
                         int calls, fa_status want, const char *const *fields) {
    for (int which = 1; which <= C_CBWD; which <<= 1) {
        if (!(calls & which)) continue;
        /* leave a different message behind first, so a stale one cannot pass */
        fa_params other = tp->params;
        other.device = (fa_device)77;
        fa_status primed = p ? fa_forward(NULL) : fa_forward(&other);
        (void)primed;
        char before[512];
        snprintf(before, sizeof before, "%s", fa_last_error());
        fa_status got = call(which, p);
        const char *message = fa_last_error();
        FA_CHECK(got == want, "%s: %s returned %s, want %s (message: %s)", label, call_name(which),
                 fa_strerror(got), fa_strerror(want), message);
        int named = 0;
        for (const char *const *f = fields; *f; f++) named |= mentions(message, *f);
        FA_CHECK(message && message[0] && strcmp(message, before) != 0,
                 "%s: %s left no fresh message (still \"%s\")", label, call_name(which), before);
        FA_CHECK(named, "%s: %s message does not name the field %s: \"%s\"", label,
                 call_name(which), fields[0], message);
        FA_CHECK(outputs_untouched(tp), "%s: %s wrote to an output despite failing", label,
                 call_name(which));
        FA_CHECK(fa_test_inputs_unchanged(tp), "%s: %s modified an input", label, call_name(which));
    }
}

#define FIELDS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The valid problem every case starts from: f32, GQA, sinks, ALiBi, backward tensors. */
static int make_base(fa_test_problem *tp, int varlen) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 3, 5, 6, 4, 2, 8);
    spec.sinks = 1;
    spec.alibi = FA_TEST_ALIBI_BATCH_HEAD;
    spec.varlen = varlen;
    spec.layout = FA_TEST_LAYOUT_PADDED;
    static const int32_t lens_q[3] = {5, 0, 3}, lens_k[3] = {2, 6, 6};
    if (varlen) {
        spec.lens_q = lens_q;
        spec.lens_k = lens_k;
    }
    if (fa_test_problem_create(tp, &spec)) return 0;
    /* the base must itself be valid for every call */
    int ok = fa_check_forward(&tp->params, NULL) == FA_OK &&
             fa_check_backward(&tp->params, NULL) == FA_OK;
    FA_CHECK(ok, "base problem (varlen %d) rejected: %s", varlen, fa_last_error());
    return ok;
}

FA_TEST(errors_null_pointers) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    expect_error("params NULL", &tp, NULL, C_ALL, FA_ERR_NULL_POINTER, FIELDS("params"));
    struct {
        const char *field;
        size_t offset;
        int calls;
    } pointers[] = {
        {"q", offsetof(fa_params, q), C_ALL},         {"k", offsetof(fa_params, k), C_ALL},
        {"v", offsetof(fa_params, v), C_ALL},         {"o", offsetof(fa_params, o), C_ALL},
        {"lse", offsetof(fa_params, lse), C_BWDS},    {"dout", offsetof(fa_params, dout), C_BWDS},
        {"dq", offsetof(fa_params, dq), C_BWDS},      {"dk", offsetof(fa_params, dk), C_BWDS},
        {"dv", offsetof(fa_params, dv), C_BWDS},
    };
    for (size_t i = 0; i < sizeof pointers / sizeof pointers[0]; i++) {
        fa_params p = tp.params;
        memset((char *)&p + pointers[i].offset, 0, sizeof(void *));
        char label[64];
        snprintf(label, sizeof label, "%s NULL", pointers[i].field);
        expect_error(label, &tp, &p, pointers[i].calls, FA_ERR_NULL_POINTER, FIELDS(pointers[i].field));
    }
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_sizes) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    struct {
        const char *label, *field;
        size_t offset;
        int64_t value;
        fa_status want;
    } sizes[] = {
        {"batch 0", "batch", offsetof(fa_params, batch), 0, FA_ERR_INVALID_SIZE},
        {"batch -1", "batch", offsetof(fa_params, batch), -1, FA_ERR_INVALID_SIZE},
        {"seqlen_q -1", "seqlen_q", offsetof(fa_params, seqlen_q), -1, FA_ERR_INVALID_SIZE},
        {"seqlen_k -3", "seqlen_k", offsetof(fa_params, seqlen_k), -3, FA_ERR_INVALID_SIZE},
        {"heads_q 0", "heads_q", offsetof(fa_params, heads_q), 0, FA_ERR_INVALID_SIZE},
        {"heads_kv 0", "heads_kv", offsetof(fa_params, heads_kv), 0, FA_ERR_INVALID_SIZE},
        {"heads_kv -2", "heads_kv", offsetof(fa_params, heads_kv), -2, FA_ERR_INVALID_SIZE},
        {"heads 4 % 3", "heads_q", offsetof(fa_params, heads_kv), 3, FA_ERR_HEADS},
        {"head_dim 0", "head_dim", offsetof(fa_params, head_dim), 0, FA_ERR_HEAD_DIM},
        {"head_dim -8", "head_dim", offsetof(fa_params, head_dim), -8, FA_ERR_HEAD_DIM},
        {"head_dim max+1", "head_dim", offsetof(fa_params, head_dim), FA_MAX_HEAD_DIM + 1, FA_ERR_HEAD_DIM},
        {"head_dim_v -1", "head_dim_v", offsetof(fa_params, head_dim_v), -1, FA_ERR_HEAD_DIM},
        {"head_dim_v max+1", "head_dim_v", offsetof(fa_params, head_dim_v), FA_MAX_HEAD_DIM + 1, FA_ERR_HEAD_DIM},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fa_params p = tp.params;
        memcpy((char *)&p + sizes[i].offset, &sizes[i].value, sizeof(int64_t));
        expect_error(sizes[i].label, &tp, &p, C_ALL, sizes[i].want,
                     FIELDS(sizes[i].field, sizes[i].want == FA_ERR_HEADS ? "heads_kv" : sizes[i].field));
    }
    fa_test_problem_destroy(&tp);
}

/* offsetof the three strides of each strided tensor, in fa_params order */
static const struct {
    const char *name;
    size_t batch, row, head;
    int calls_as_input, is_output;
} strided[] = {
    {"q", offsetof(fa_params, q_batch_stride), offsetof(fa_params, q_row_stride), offsetof(fa_params, q_head_stride), C_ALL, 0},
    {"k", offsetof(fa_params, k_batch_stride), offsetof(fa_params, k_row_stride), offsetof(fa_params, k_head_stride), C_ALL, 0},
    {"v", offsetof(fa_params, v_batch_stride), offsetof(fa_params, v_row_stride), offsetof(fa_params, v_head_stride), C_ALL, 0},
    {"o", offsetof(fa_params, o_batch_stride), offsetof(fa_params, o_row_stride), offsetof(fa_params, o_head_stride), C_ALL, C_FWDS},
    {"do", offsetof(fa_params, do_batch_stride), offsetof(fa_params, do_row_stride), offsetof(fa_params, do_head_stride), C_BWDS, 0},
    {"dq", offsetof(fa_params, dq_batch_stride), offsetof(fa_params, dq_row_stride), offsetof(fa_params, dq_head_stride), C_BWDS, C_BWDS},
    {"dk", offsetof(fa_params, dk_batch_stride), offsetof(fa_params, dk_row_stride), offsetof(fa_params, dk_head_stride), C_BWDS, C_BWDS},
    {"dv", offsetof(fa_params, dv_batch_stride), offsetof(fa_params, dv_row_stride), offsetof(fa_params, dv_head_stride), C_BWDS, C_BWDS},
};

static void set_i64(fa_params *p, size_t offset, int64_t value) { memcpy((char *)p + offset, &value, sizeof value); }

FA_TEST(errors_negative_strides) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    for (size_t t = 0; t < sizeof strided / sizeof strided[0]; t++) {
        size_t axes[3] = {strided[t].batch, strided[t].row, strided[t].head};
        static const char *axis_names[3] = {"batch", "row", "head"};
        for (int a = 0; a < 3; a++) {
            fa_params p = tp.params;
            set_i64(&p, axes[a], -1);
            char label[64], field[64];
            snprintf(label, sizeof label, "%s_%s_stride -1", strided[t].name, axis_names[a]);
            snprintf(field, sizeof field, "%s_%s_stride", strided[t].name, axis_names[a]);
            expect_error(label, &tp, &p, strided[t].calls_as_input, FA_ERR_STRIDE, FIELDS(field));
        }
    }
    fa_params p = tp.params;
    p.alibi_batch_stride = -4;
    expect_error("alibi_batch_stride -4", &tp, &p, C_ALL, FA_ERR_STRIDE, FIELDS("alibi_batch_stride"));
    p.alibi_batch_stride = p.heads_q - 1; /* per batch×head rows would overlap */
    expect_error("alibi_batch_stride < heads_q", &tp, &p, C_ALL, FA_ERR_STRIDE, FIELDS("alibi_batch_stride"));
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_overlapping_output_strides) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    const fa_params *base = &tp.params;
    for (size_t t = 0; t < sizeof strided / sizeof strided[0]; t++) {
        if (!strided[t].is_output) continue;
        int64_t dim = (!strcmp(strided[t].name, "o") || !strcmp(strided[t].name, "dv")) ? base->head_dim_v : base->head_dim;
        int64_t heads = (!strcmp(strided[t].name, "dk") || !strcmp(strided[t].name, "dv")) ? base->heads_kv : base->heads_q;
        int64_t rows = (!strcmp(strided[t].name, "dk") || !strcmp(strided[t].name, "dv")) ? base->seqlen_k : base->seqlen_q;
        char b_field[64], r_field[64], h_field[64];
        snprintf(b_field, sizeof b_field, "%s_batch_stride", strided[t].name);
        snprintf(r_field, sizeof r_field, "%s_row_stride", strided[t].name);
        snprintf(h_field, sizeof h_field, "%s_head_stride", strided[t].name);
        struct {
            const char *what;
            int64_t batch, row, head;
        } layouts[] = {
            {"heads overlap (head stride < dim)", -1, -1, dim - 1},
            {"rows overlap (row stride < heads·dim)", -1, heads * dim - 1, dim},
            {"row stride 0", -1, 0, dim},
            {"head stride 0", -1, heads * dim, 0},
            {"batches overlap", rows * heads * dim - 1, heads * dim, dim},
            {"batch stride = head stride", dim, rows * heads * dim, dim},
        };
        for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
            fa_params p = *base;
            /* start from the dense layout, then break one stride */
            set_i64(&p, strided[t].head, dim);
            set_i64(&p, strided[t].row, heads * dim);
            set_i64(&p, strided[t].batch, rows * heads * dim);
            if (layouts[l].head >= 0) set_i64(&p, strided[t].head, layouts[l].head);
            if (layouts[l].row >= 0) set_i64(&p, strided[t].row, layouts[l].row);
            if (layouts[l].batch >= 0) set_i64(&p, strided[t].batch, layouts[l].batch);
            char label[128];
            snprintf(label, sizeof label, "%s: %s", strided[t].name, layouts[l].what);
            expect_error(label, &tp, &p, strided[t].is_output, FA_ERR_STRIDE, FIELDS(b_field, r_field, h_field));
        }
    }
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_stride_overflow) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    for (size_t t = 0; t < sizeof strided / sizeof strided[0]; t++) {
        size_t axes[3] = {strided[t].batch, strided[t].row, strided[t].head};
        static const char *axis_names[3] = {"batch", "row", "head"};
        for (int a = 0; a < 3; a++) {
            fa_params p = tp.params;
            /* every axis has extent >= 2 in the base problem and dim > 1, so
             * (extent - 1)·stride + (dim - 1) exceeds INT64_MAX */
            set_i64(&p, axes[a], INT64_MAX - 4);
            char label[64], field[64];
            snprintf(label, sizeof label, "%s_%s_stride overflow", strided[t].name, axis_names[a]);
            snprintf(field, sizeof field, "%s_%s_stride", strided[t].name, axis_names[a]);
            expect_error(label, &tp, &p, strided[t].calls_as_input, FA_ERR_OVERFLOW,
                         FIELDS(field, strided[t].name));
        }
    }
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_cu_seqlens) {
    fa_test_problem tp;
    if (!make_base(&tp, 1)) return;
    const fa_params *base = &tp.params;
    int32_t cu_q[4], cu_k[4];
    memcpy(cu_q, base->cu_seqlens_q, sizeof cu_q); /* {0, 5, 5, 8} */
    memcpy(cu_k, base->cu_seqlens_k, sizeof cu_k); /* {0, 2, 8, 14} */
    fa_params p = *base;
    p.cu_seqlens_k = NULL;
    expect_error("only cu_seqlens_q", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_k", "cu_seqlens_q"));
    p = *base;
    p.cu_seqlens_q = NULL;
    expect_error("only cu_seqlens_k", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_q", "cu_seqlens_k"));

    int32_t bad[4];
    memcpy(bad, cu_q, sizeof bad);
    bad[0] = 1;
    p = *base;
    p.cu_seqlens_q = bad;
    expect_error("cu_seqlens_q[0] = 1", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_q"));
    memcpy(bad, cu_k, sizeof bad);
    bad[2] = 1; /* 0, 2, 1, 14: decreases */
    p = *base;
    p.cu_seqlens_k = bad;
    expect_error("cu_seqlens_k decreasing", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_k"));
    p = *base;
    p.seqlen_q = 4; /* sequence 0 has 5 query tokens */
    expect_error("length > seqlen_q", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_q", "seqlen_q"));
    p = *base;
    p.seqlen_k = 5; /* sequences 1 and 2 have 6 keys */
    expect_error("length > seqlen_k", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_k", "seqlen_k"));
    p = *base;
    p.total_q = cu_q[3] - 1;
    expect_error("cu_seqlens_q[batch] > total_q", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_q", "total_q"));
    p = *base;
    p.total_k = cu_k[3] - 1;
    expect_error("cu_seqlens_k[batch] > total_k", &tp, &p, C_ALL, FA_ERR_CU_SEQLENS, FIELDS("cu_seqlens_k", "total_k"));
    p = *base;
    p.total_q = -1;
    expect_error("total_q -1", &tp, &p, C_ALL, FA_ERR_INVALID_SIZE, FIELDS("total_q"));
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_scalars) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    float softcaps[] = {NAN, INFINITY, -1.0f, -INFINITY};
    for (size_t i = 0; i < sizeof softcaps / sizeof softcaps[0]; i++) {
        fa_params p = tp.params;
        p.softcap = softcaps[i];
        char label[64];
        snprintf(label, sizeof label, "softcap %g", (double)softcaps[i]);
        expect_error(label, &tp, &p, C_ALL, FA_ERR_SOFTCAP, FIELDS("softcap"));
    }
    float scales[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        fa_params p = tp.params;
        p.softmax_scale = scales[i];
        char label[64];
        snprintf(label, sizeof label, "softmax_scale %g", (double)scales[i]);
        expect_error(label, &tp, &p, C_ALL, FA_ERR_SCALE, FIELDS("softmax_scale"));
    }
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_enums_device_threads) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    int dtypes[] = {4, -1, 1000}; /* 3 is FA_DTYPE_FP8_E4M3 (test_fp8.c) */
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        fa_params p = tp.params;
        p.dtype = (fa_dtype)dtypes[i];
        expect_error("bad dtype", &tp, &p, C_ALL, FA_ERR_DTYPE, FIELDS("dtype"));
    }
    int devices[] = {2, -1, 99};
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        fa_params p = tp.params;
        p.device = (fa_device)devices[i];
        expect_error("bad device", &tp, &p, C_ALL, FA_ERR_DEVICE, FIELDS("device"));
    }
    fa_params p = tp.params;
    p.num_threads = -1;
    expect_error("num_threads -1", &tp, &p, C_ALL, FA_ERR_INVALID_ARGUMENT, FIELDS("num_threads"));

    /* fa_standard_forward is CPU only, whatever the build */
    p = tp.params;
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    expect_error("standard on cuda", &tp, &p, C_STD, FA_ERR_DEVICE, FIELDS("device", "fa_standard_forward"));
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_cuda_unavailable) {
    if (fa_cuda_available()) {
        fa_test_skip("a CUDA GPU is present");
        return;
    }
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    fa_params p = tp.params;
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    /* refused before anything is touched (the pointers are host memory) */
    expect_error("cuda unavailable", &tp, &p, C_FWD | C_CFWD | C_BWDS, FA_ERR_DEVICE, FIELDS("device"));
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_f32_on_cuda) {
    if (!fa_cuda_available()) {
        fa_test_skip("no CUDA GPU: f32 on CUDA is refused as FA_ERR_DEVICE before the dtype is looked at");
        return;
    }
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    fa_params p = tp.params;
    p.device = FA_DEVICE_CUDA;
    expect_error("f32 on cuda", &tp, &p, C_FWD | C_CFWD | C_BWDS, FA_ERR_DTYPE, FIELDS("dtype"));
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_workspace_too_small) {
    int tested = 0;
    for (int varlen = 0; varlen < 2; varlen++) {
        fa_test_problem tp;
        if (!make_base(&tp, varlen)) return;
        size_t need_fwd = 0, need_bwd = 0;
        FA_CHECK(fa_check_forward(&tp.params, &need_fwd) == FA_OK, "check_forward");
        FA_CHECK(fa_check_backward(&tp.params, &need_bwd) == FA_OK, "check_backward");
        size_t need[2] = {need_fwd, need_bwd};
        int calls[2] = {C_FWD | C_CFWD, C_BWDS};
        for (int dir = 0; dir < 2; dir++) {
            if (need[dir] == 0) continue;
            void *workspace = malloc(need[dir]);
            fa_params p = tp.params;
            p.workspace = workspace;
            p.workspace_bytes = need[dir] - 1;
            expect_error(dir ? "backward workspace too small" : "forward workspace too small", &tp, &p,
                         calls[dir], FA_ERR_WORKSPACE, FIELDS("workspace_bytes", "workspace"));
            p.workspace_bytes = 0;
            expect_error(dir ? "backward workspace of 0 bytes" : "forward workspace of 0 bytes", &tp, &p,
                         calls[dir], FA_ERR_WORKSPACE, FIELDS("workspace_bytes", "workspace"));
            free(workspace);
            tested++;
        }
        fa_test_problem_destroy(&tp);
    }
    if (!tested) fa_test_skip("neither CPU call needs a workspace, so none can be too small");
}

FA_TEST(errors_strerror_covers_every_status) {
    const char *unknown = fa_strerror((fa_status)FA_STATUS_COUNT_);
    FA_CHECK(unknown && unknown[0], "fa_strerror(FA_STATUS_COUNT_) gives a string");
    FA_CHECK(fa_strerror((fa_status)-1) && fa_strerror((fa_status)-1)[0], "fa_strerror(-1) gives a string");
    for (int s = 0; s < FA_STATUS_COUNT_; s++) {
        const char *text = fa_strerror((fa_status)s);
        FA_CHECK(text && text[0] && strcmp(text, unknown) != 0, "fa_strerror(%d) is missing", s);
        for (int t = 0; t < s; t++)
            FA_CHECK(strcmp(text, fa_strerror((fa_status)t)) != 0, "fa_strerror(%d) == fa_strerror(%d)", s, t);
    }
    FA_CHECK(!strcmp(fa_version(), "0.1.0") || fa_version()[0] != '\0', "fa_version");
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    FA_CHECK(!strcmp(fa_version(), expected), "fa_version() %s != header %s", fa_version(), expected);
}

/* ---- fa_last_error is per thread ---------------------------------------------------------- */

typedef struct thread_state {
    const fa_test_problem *tp;
    pthread_barrier_t *barrier;
    int which; /* 0: NULL q, 1: bad softcap */
    fa_status status;
    char after_own[512], after_other[512];
} thread_state;

static void *error_thread(void *arg) {
    thread_state *st = arg;
    fa_params p = st->tp->params;
    /* step 1: thread 0 fails; step 2: thread 1 fails; step 3: both read their messages */
    if (st->which == 0) {
        p.q = NULL;
        st->status = fa_forward(&p);
        snprintf(st->after_own, sizeof st->after_own, "%s", fa_last_error());
        pthread_barrier_wait(st->barrier);
        pthread_barrier_wait(st->barrier);
    } else {
        pthread_barrier_wait(st->barrier);
        p.softcap = -2.0f;
        st->status = fa_forward(&p);
        snprintf(st->after_own, sizeof st->after_own, "%s", fa_last_error());
        pthread_barrier_wait(st->barrier);
    }
    snprintf(st->after_other, sizeof st->after_other, "%s", fa_last_error());
    return NULL;
}

FA_TEST(errors_last_error_is_per_thread) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    thread_state states[2];
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        memset(&states[i], 0, sizeof states[i]);
        states[i].tp = &tp;
        states[i].barrier = &barrier;
        states[i].which = i;
        pthread_create(&threads[i], NULL, error_thread, &states[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&barrier);
    FA_CHECK(states[0].status == FA_ERR_NULL_POINTER && states[1].status == FA_ERR_SOFTCAP,
             "statuses %d %d", (int)states[0].status, (int)states[1].status);
    FA_CHECK(mentions(states[0].after_other, "q") && !strstr(states[0].after_other, "softcap"),
             "thread 0's message changed after thread 1 failed: \"%s\"", states[0].after_other);
    FA_CHECK(!strcmp(states[0].after_own, states[0].after_other), "thread 0: \"%s\" became \"%s\"",
             states[0].after_own, states[0].after_other);
    FA_CHECK(mentions(states[1].after_other, "softcap"), "thread 1's message: \"%s\"", states[1].after_other);
    /* and the main thread saw neither */
    fa_params other = tp.params;
    other.heads_kv = 3;
    fa_forward(&other);
    FA_CHECK(mentions(fa_last_error(), "heads_q") || mentions(fa_last_error(), "heads_kv"),
             "main thread message: \"%s\"", fa_last_error());
    fa_test_problem_destroy(&tp);
}

/* ---- hostile values: overflow in bytes, unused fields, alignment, aliasing ------------------ */

FA_TEST(errors_alibi_batch_stride_overflow) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    /* batch = 3: the last batch's slopes would lie at 2·stride + head, past int64 in elements or
     * in bytes; accepted before, the engines then read alibi_slopes[-1] */
    static const int64_t strides[] = {INT64_MAX, (int64_t)1 << 62, (int64_t)1 << 61};
    for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++) {
        fa_params p = tp.params;
        p.alibi_batch_stride = strides[i];
        char label[64];
        snprintf(label, sizeof label, "alibi_batch_stride %lld", (long long)strides[i]);
        expect_error(label, &tp, &p, C_ALL, FA_ERR_OVERFLOW, FIELDS("alibi_batch_stride"));
    }
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_unused_alibi_batch_stride_ignored) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    fa_params p = tp.params;
    p.alibi_slopes = NULL;
    static const int64_t strides[] = {-5, 1, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++) {
        p.alibi_batch_stride = strides[i];
        fa_status f = fa_check_forward(&p, NULL), b = fa_check_backward(&p, NULL);
        FA_CHECK(f == FA_OK && b == FA_OK,
                 "alibi_slopes NULL, alibi_batch_stride %lld: %s / %s (%s), want FA_OK (unused)",
                 (long long)strides[i], fa_strerror(f), fa_strerror(b), fa_last_error());
    }
    FA_CHECK(fa_forward(&p) == FA_OK, "fa_forward with an unused alibi_batch_stride: %s", fa_last_error());
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_byte_offset_overflow) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    fa_params p = tp.params;
    /* 2 · 2^61 elements fit in int64, their bytes do not */
    p.o_batch_stride = (int64_t)1 << 61;
    expect_error("o_batch_stride 2^61", &tp, &p, C_ALL, FA_ERR_OVERFLOW, FIELDS("o"));
    p = tp.params;
    p.k_batch_stride = (int64_t)1 << 61;
    expect_error("k_batch_stride 2^61", &tp, &p, C_ALL, FA_ERR_OVERFLOW, FIELDS("k"));
    /* heads_kv = 2: one stride of 2^62 fits in elements; the span 2 · 2^62 does not */
    p = tp.params;
    p.dk_head_stride = (int64_t)1 << 62;
    expect_error("dk_head_stride 2^62", &tp, &p, C_BWDS, FA_ERR_OVERFLOW, FIELDS("dk"));
    p = tp.params;
    p.o_head_stride = (int64_t)1 << 62;
    p.heads_q = 2;
    p.heads_kv = 2;
    expect_error("o_head_stride 2^62", &tp, &p, C_FWDS, FA_ERR_OVERFLOW, FIELDS("o"));
    fa_test_problem_destroy(&tp);
}

FA_TEST(errors_misaligned_pointers) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    fa_params p = tp.params;
    p.lse = (float *)(void *)((char *)p.lse + 2);
    expect_error("lse + 2 bytes", &tp, &p, C_ALL, FA_ERR_ALIGNMENT, FIELDS("lse"));
    p = tp.params;
    p.q = (const char *)p.q + 2;
    expect_error("q + 2 bytes (f32)", &tp, &p, C_ALL, FA_ERR_ALIGNMENT, FIELDS("q"));
    p = tp.params;
    p.dsink = (float *)(void *)((char *)p.dsink + 1);
    expect_error("dsink + 1 byte", &tp, &p, C_BWDS, FA_ERR_ALIGNMENT, FIELDS("dsink"));
    p = tp.params;
    p.sink_logits = (const float *)(const void *)((const char *)p.sink_logits + 3);
    expect_error("sink_logits + 3 bytes", &tp, &p, C_ALL, FA_ERR_ALIGNMENT, FIELDS("sink_logits"));
    fa_test_problem_destroy(&tp);
}

/* Outputs that share memory with another tensor are rejected, naming both. */
FA_TEST(errors_aliased_outputs) {
    fa_test_problem tp;
    if (!make_base(&tp, 0)) return;
    const fa_params base = tp.params;
    fa_params p = base;
    p.o = (void *)base.k; /* GQA: o is larger than k, the rows of one would clobber the other's */
    expect_error("o == k", &tp, &p, C_FWDS, FA_ERR_OVERLAP, FIELDS("o", "k"));
    p = base;
    p.o = (void *)base.v;
    expect_error("o == v", &tp, &p, C_FWDS, FA_ERR_OVERLAP, FIELDS("o", "v"));
    p = base;
    p.o = (void *)base.q;
    expect_error("o == q", &tp, &p, C_FWDS, FA_ERR_OVERLAP, FIELDS("o", "q"));
    p = base;
    p.lse = (float *)base.o + 3;
    expect_error("lse inside o", &tp, &p, C_FWDS, FA_ERR_OVERLAP, FIELDS("lse", "o"));
    p = base;
    p.dk = base.dq;
    expect_error("dk == dq", &tp, &p, C_BWDS, FA_ERR_OVERLAP, FIELDS("dk", "dq"));
    p = base;
    p.dv = base.dk;
    p.dv_batch_stride = base.dk_batch_stride;
    p.dv_row_stride = base.dk_row_stride;
    p.dv_head_stride = base.dk_head_stride;
    expect_error("dv == dk", &tp, &p, C_BWDS, FA_ERR_OVERLAP, FIELDS("dv", "dk"));
    p = base;
    p.dq = (void *)base.dout;
    expect_error("dq == dout", &tp, &p, C_BWDS, FA_ERR_OVERLAP, FIELDS("dq", "dout"));
    p = base;
    p.dv = (char *)base.dv + 4 * (base.dv_head_stride > 0 ? base.dv_head_stride : 1) - 4;
    p.dk = base.dv;
    p.dk_batch_stride = base.dv_batch_stride;
    p.dk_row_stride = base.dv_row_stride;
    p.dk_head_stride = base.dv_head_stride;
    expect_error("dv shifted into dk", &tp, &p, C_BWDS, FA_ERR_OVERLAP, FIELDS("dv", "dk"));
    p = base;
    p.dsink = (float *)base.sink_logits;
    expect_error("dsink == sink_logits", &tp, &p, C_BWDS, FA_ERR_OVERLAP, FIELDS("dsink", "sink_logits"));
    p = base;
    p.dq = (void *)base.lse;
    expect_error("dq == lse", &tp, &p, C_BWDS, FA_ERR_OVERLAP, FIELDS("dq", "lse"));
    fa_test_problem_destroy(&tp);
}

/* Tensors interleaved in one buffer ([batch, seq, heads, dim] sharing rows) are disjoint and
 * accepted; a packed layout whose head ranges collide by one head is not. */
FA_TEST(errors_interleaved_outputs_accepted) {
    enum { B = 2, S = 5, HQ = 4, HKV = 2, D = 8, ALL = HQ + 2 * HKV, PAD = 3 };
    const int64_t row = ALL * D + PAD, batch_stride = S * row + 5;
    float *qkv = calloc((size_t)(B * batch_stride), sizeof(float));
    float *dqkv = calloc((size_t)(B * batch_stride), sizeof(float));
    float *o = calloc((size_t)(B * S * HQ * D), sizeof(float)), *dout = calloc((size_t)(B * S * HQ * D), sizeof(float));
    float *lse = calloc((size_t)(B * HQ * S), sizeof(float));
    if (!FA_CHECK(qkv && dqkv && o && dout && lse, "allocation")) goto done;
    fa_params p = {0};
    p.batch = B;
    p.seqlen_q = p.seqlen_k = S;
    p.heads_q = HQ;
    p.heads_kv = HKV;
    p.head_dim = D;
    p.q = qkv;
    p.k = qkv + HQ * D;
    p.v = qkv + (HQ + HKV) * D;
    p.o = o;
    p.lse = lse;
    p.dout = dout;
    p.dq = dqkv;
    p.dk = dqkv + HQ * D;
    p.dv = dqkv + (HQ + HKV) * D;
    fa_set_contiguous_strides(&p);
#define PACKED(t) (p.t##_batch_stride = batch_stride, p.t##_row_stride = row, p.t##_head_stride = D)
    PACKED(q), PACKED(k), PACKED(v), PACKED(dq), PACKED(dk), PACKED(dv);
#undef PACKED
    FA_CHECK(fa_check_backward(&p, NULL) == FA_OK, "packed q/k/v and dq/dk/dv: %s", fa_last_error());
    FA_CHECK(fa_check_forward(&p, NULL) == FA_OK, "packed q/k/v: %s", fa_last_error());
    FA_CHECK(fa_backward(&p) == FA_OK, "fa_backward, packed: %s", fa_last_error());
    p.dk = dqkv + (HQ - 1) * D; /* dk's first head is dq's last */
    fa_status s = fa_check_backward(&p, NULL);
    FA_CHECK(s == FA_ERR_OVERLAP && strstr(fa_last_error(), "dk") && strstr(fa_last_error(), "dq"),
             "dk one head into dq: %s (%s)", fa_strerror(s), fa_last_error());
done:
    free(qkv);
    free(dqkv);
    free(o);
    free(dout);
    free(lse);
}

FA_TEST(errors_set_contiguous_strides_saturates) {
    fa_params p = {0};
    p.batch = 4;
    p.seqlen_q = p.seqlen_k = (int64_t)1 << 40;
    p.heads_q = p.heads_kv = (int64_t)1 << 30;
    p.head_dim = 512;
    fa_set_contiguous_strides(&p); /* sizes × strides overflow: no undefined behaviour */
    FA_CHECK(p.q_batch_stride == INT64_MAX && p.o_batch_stride == INT64_MAX,
             "q_batch_stride %lld, o_batch_stride %lld: want INT64_MAX (saturated)",
             (long long)p.q_batch_stride, (long long)p.o_batch_stride);
    FA_CHECK(p.q_head_stride == 512 && p.q_row_stride == ((int64_t)1 << 39), "row / head strides exact");
    p.head_dim = -3;
    p.heads_q = INT64_MIN;
    fa_set_contiguous_strides(&p);
    FA_CHECK(fa_check_forward(&p, NULL) != FA_OK, "nonsense sizes are rejected");
}

FA_TEST(errors_varlen_messages_name_fields) {
    fa_test_problem tp;
    if (!make_base(&tp, 1)) return;
    fa_params p = tp.params;
    p.total_q = p.cu_seqlens_q[p.batch] - 1;
    FA_CHECK(fa_check_forward(&p, NULL) == FA_ERR_CU_SEQLENS && strstr(fa_last_error(), "total_q"),
             "cu_seqlens_q[batch] > total_q: message '%s' names total_q", fa_last_error());
    p = tp.params;
    p.total_k = p.cu_seqlens_k[p.batch] - 1;
    FA_CHECK(fa_check_forward(&p, NULL) == FA_ERR_CU_SEQLENS && strstr(fa_last_error(), "total_k"),
             "cu_seqlens_k[batch] > total_k: message '%s' names total_k", fa_last_error());
    p = tp.params;
    p.seqlen_q = 4; /* sequence 0 has 5 queries */
    FA_CHECK(fa_check_forward(&p, NULL) == FA_ERR_CU_SEQLENS && strstr(fa_last_error(), "seqlen_q"),
             "length > seqlen_q: message '%s' names seqlen_q", fa_last_error());
    p = tp.params;
    p.seqlen_k = 5;
    FA_CHECK(fa_check_forward(&p, NULL) == FA_ERR_CU_SEQLENS && strstr(fa_last_error(), "seqlen_k"),
             "length > seqlen_k: message '%s' names seqlen_k", fa_last_error());
    fa_test_problem_destroy(&tp);
}

/* The stride of an axis of extent 1 is unused and may hold anything: the call succeeds and gives
 * the same result (the CPU engines once stepped a pointer by a huge unused stride, undefined
 * behaviour that the fuzzer found under UBSan). */
FA_TEST(errors_unused_strides_of_single_extent_axes) {
    fa_test_spec spec = fa_test_base_spec(FA_DTYPE_F32, 1, 1, 1, 2, 1, 16);
    spec.backward = 1;
    fa_test_problem tp;
    if (!FA_CHECK(fa_test_problem_create(&tp, &spec) == 0, "create")) return;
    fa_params p = tp.params;
    FA_CHECK(fa_forward(&p) == FA_OK && fa_backward(&p) == FA_OK, "clean: %s", fa_last_error());
    const size_t o_bytes = (size_t)(p.heads_q * p.head_dim) * 4;
    float clean_o[64], clean_dk[64];
    memcpy(clean_o, p.o, o_bytes);
    memcpy(clean_dk, p.dk, (size_t)p.head_dim * 4);
    p.q_batch_stride = p.k_batch_stride = p.o_batch_stride = INT64_MAX;
    p.v_row_stride = p.k_row_stride = p.dk_row_stride = INT64_MAX - 1;
    p.q_row_stride = p.o_row_stride = p.do_row_stride = p.dq_row_stride = INT64_MAX - 3;
    p.k_head_stride = p.v_head_stride = p.dv_head_stride = INT64_MAX / 3;
    p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = p.do_batch_stride = p.v_batch_stride = INT64_MAX;
    FA_CHECK(fa_forward(&p) == FA_OK, "forward with unused huge strides: %s", fa_last_error());
    FA_CHECK(!memcmp(p.o, clean_o, o_bytes), "forward result changed");
    FA_CHECK(fa_backward(&p) == FA_OK, "backward with unused huge strides: %s", fa_last_error());
    FA_CHECK(!memcmp(p.dk, clean_dk, (size_t)p.head_dim * 4), "backward result changed");
    FA_CHECK(fa_standard_forward(&p) == FA_OK, "standard: %s", fa_last_error());
    fa_test_problem_destroy(&tp);
}
