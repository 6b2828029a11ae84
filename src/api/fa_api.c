/*
 * fa_api.c: the public entry points. Validates an fa_params completely (nothing is written to an
 * output before every check has passed), resolves defaults into an fa_problem, and dispatches to
 * the CPU or CUDA engine. Also: error strings and the per-thread detailed message.
 *
 * Validation order (the first failure is reported):
 *   1. params pointer, device, dtype, num_threads
 *   2. sizes (batch, seqlens, heads, head dims), heads_q % heads_kv
 *   3. scalars (softmax_scale, softcap, alibi_batch_stride)
 *   4. tensor pointers needed by the call
 *   5. varlen fields (both cu_seqlens or neither; totals; on the CPU the cu_seqlens contents),
 *      then the score bias / block mask / document ids fields (fa_validate_score_mods)
 *   6. strides (non-negative; outputs must not overlap themselves; offsets fit in int64)
 *      and, on the CPU, the block lists' contents (fa_check_score_mod_contents; the CUDA engine
 *      checks them on the device before it writes anything, src/cuda/mods.cu)
 *   7. the engine's own limits (fa_cuda_check_*), then the caller's workspace size
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/fa_internal.h"
#include "api/fa_validate.h"

/* ---- errors --------------------------------------------------------------------------------- */

static _Thread_local char fa_error_message[512];

fa_status fa_set_error(fa_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(fa_error_message, sizeof fa_error_message, fmt, args);
    va_end(args);
    return status;
}

const char *fa_last_error(void) { return fa_error_message; }

const char *fa_strerror(fa_status status) {
    switch (status) {
    case FA_OK: return "FA_OK: success";
    case FA_ERR_NULL_POINTER: return "FA_ERR_NULL_POINTER: a required pointer is NULL";
    case FA_ERR_INVALID_SIZE: return "FA_ERR_INVALID_SIZE: a size is out of range";
    case FA_ERR_OVERFLOW: return "FA_ERR_OVERFLOW: sizes and strides overflow 64-bit offsets";
    case FA_ERR_HEADS: return "FA_ERR_HEADS: heads_q is not a multiple of heads_kv";
    case FA_ERR_HEAD_DIM: return "FA_ERR_HEAD_DIM: head dimension out of the supported range";
    case FA_ERR_STRIDE: return "FA_ERR_STRIDE: invalid stride";
    case FA_ERR_CU_SEQLENS: return "FA_ERR_CU_SEQLENS: invalid cu_seqlens";
    case FA_ERR_SOFTCAP: return "FA_ERR_SOFTCAP: softcap must be finite and >= 0";
    case FA_ERR_SCALE: return "FA_ERR_SCALE: softmax_scale must be finite";
    case FA_ERR_DTYPE: return "FA_ERR_DTYPE: unsupported dtype";
    case FA_ERR_DEVICE: return "FA_ERR_DEVICE: device unknown or not available";
    case FA_ERR_UNSUPPORTED: return "FA_ERR_UNSUPPORTED: feature combination not supported on this path";
    case FA_ERR_WORKSPACE: return "FA_ERR_WORKSPACE: workspace too small";
    case FA_ERR_ALLOC: return "FA_ERR_ALLOC: memory allocation failed";
    case FA_ERR_CUDA: return "FA_ERR_CUDA: CUDA error";
    case FA_ERR_INVALID_ARGUMENT: return "FA_ERR_INVALID_ARGUMENT: invalid argument";
    case FA_ERR_ALIGNMENT: return "FA_ERR_ALIGNMENT: pointer or stride not aligned for this device path";
    case FA_ERR_OVERLAP: return "FA_ERR_OVERLAP: an output shares memory with another tensor";
    default: return "unknown fa_status";
    }
}

const char *fa_version(void) { return "0.1.0"; }

int fa_cuda_available(void) { return fa_cuda_is_available(); }

const char *fa_cpu_isa(void) { return fa_cpu_isa_name(); }

/* ---- internal functions ---------------------------------------------------------------------- */

static fa_tensor_view make_view(const char *name, int is_output, const fa_problem *pb, fa_dtype dtype,
                                const void *ptr, int64_t rows, int64_t heads, int64_t dim, int64_t bs,
                                int64_t rs, int64_t hs) {
    fa_tensor_view t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.field = strcmp(name, "do") == 0 ? "dout" : name;
    t.is_output = is_output;
    t.extent[0] = pb->varlen ? 1 : pb->p.batch;
    t.extent[1] = rows;
    t.extent[2] = heads;
    t.stride[0] = pb->varlen ? 0 : bs;
    t.stride[1] = rs;
    t.stride[2] = hs;
    t.dim = dim;
    t.ptr = ptr;
    t.elem_bytes = fa_dtype_bytes(dtype);
    return t;
}

/* cu_seqlens in host memory: starts at 0, non-decreasing, lengths <= max, last <= total.
 * max_name / total_name: the fields holding max_len and total (seqlen_q, total_q, ...). */
static fa_status check_cu_seqlens(const int32_t *cu, const char *name, int64_t batch,
                                  int64_t max_len, const char *max_name, int64_t total,
                                  const char *total_name) {
    if (cu[0] != 0)
        return fa_set_error(FA_ERR_CU_SEQLENS, "%s[0] = %d, must be 0", name, cu[0]);
    for (int64_t b = 0; b < batch; ++b) {
        int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fa_set_error(FA_ERR_CU_SEQLENS, "%s decreases: %s[%lld] = %d > %s[%lld] = %d",
                                name, name, (long long)b, cu[b], name, (long long)(b + 1), cu[b + 1]);
        if (len > max_len)
            return fa_set_error(FA_ERR_CU_SEQLENS,
                                "%s: sequence %lld has %lld tokens, more than %s = %lld",
                                name, (long long)b, (long long)len, max_name, (long long)max_len);
    }
    if (cu[batch] > total)
        return fa_set_error(FA_ERR_CU_SEQLENS, "%s[batch] = %d exceeds %s = %lld (rows of the packed "
                            "tensors)", name, cu[batch], total_name, (long long)total);
    return FA_OK;
}

typedef enum call_kind { CALL_FORWARD, CALL_BACKWARD, CALL_STANDARD } call_kind;

/* Validate *in for `kind` and fill *pb. Writes nothing anywhere else. */
static fa_status validate(const fa_params *in, call_kind kind, fa_problem *pb) {
    if (in == NULL) return fa_set_error(FA_ERR_NULL_POINTER, "params is NULL");
    memset(pb, 0, sizeof *pb);
    pb->p = *in;
    fa_params *p = &pb->p;

    /* 1.-3. device, dtype, threads, sizes, scalars (fa_validate.c, shared with the KV-cache
     * calls); the standard path is CPU-only */
    if (kind == CALL_STANDARD && p->device == FA_DEVICE_CUDA)
        return fa_set_error(FA_ERR_DEVICE, "fa_standard_forward runs on the CPU only (device = %d)",
                            (int)p->device);
    fa_status common = fa_validate_common(pb);
    if (common != FA_OK) return common;
    common = fa_validate_dropout(pb, kind == CALL_STANDARD ? "fa_standard_forward" : NULL);
    if (common != FA_OK) return common;
    const int paged = p->block_table != NULL;
    if (paged && kind != CALL_FORWARD)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "block_table is set: a paged K/V is supported by fa_forward only (%s)",
                            kind == CALL_BACKWARD ? "no gradients into a page pool" : "fa_standard_forward");
    if (p->dtype == FA_DTYPE_FP8_E4M3 && kind == CALL_STANDARD)
        return fa_set_error(FA_ERR_DTYPE, "dtype = FA_DTYPE_FP8_E4M3: fa_standard_forward does not take fp8 inputs");
    if (p->dtype == FA_DTYPE_FP8_E4M3 && p->attn_probs != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED, "attn_probs is set: not with dtype = FA_DTYPE_FP8_E4M3");
    if (kind == CALL_BACKWARD && p->dout_e4m3 != 0 && p->dout_e4m3 != 1)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "dout_e4m3 = %d: 0 (dout in bf16) or 1 (dout in e4m3)",
                            p->dout_e4m3);
    if (kind == CALL_BACKWARD && p->dout_e4m3 && p->dtype != FA_DTYPE_FP8_E4M3)
        return fa_set_error(FA_ERR_DTYPE, "dout_e4m3 = 1: only with dtype = FA_DTYPE_FP8_E4M3 (dtype = %d)",
                            (int)p->dtype);
    if (p->kv_dtype != FA_KV_SAME || p->k_scale != NULL || p->v_scale != NULL) /* quantised caches */
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "kv_dtype = %d / k_scale / v_scale are set: quantised K/V are read by "
                            "fa_kvcache_forward only (set kv_dtype = FA_KV_SAME and the scales to NULL)",
                            (int)p->kv_dtype);

    /* 4. tensor pointers */
    FA_REQUIRE_PTR(p->q, "q");
    FA_REQUIRE_PTR(p->k, "k");
    FA_REQUIRE_PTR(p->v, "v");
    FA_REQUIRE_PTR(p->o, "o");
    if (kind == CALL_BACKWARD) {
        FA_REQUIRE_PTR(p->lse, "lse");
        FA_REQUIRE_PTR(p->dout, "dout");
        FA_REQUIRE_PTR(p->dq, "dq");
        FA_REQUIRE_PTR(p->dk, "dk");
        FA_REQUIRE_PTR(p->dv, "dv");
    }

    /* 5. varlen */
    if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL))
        return fa_set_error(FA_ERR_CU_SEQLENS, "cu_seqlens_%s is set but cu_seqlens_%s is NULL: "
                            "give both for variable length or neither",
                            p->cu_seqlens_q ? "q" : "k", p->cu_seqlens_q ? "k" : "q");
    pb->varlen = p->cu_seqlens_q != NULL;
    if (pb->varlen) {
        FA_REQUIRE_RANGE(p->total_q, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "total_q");
        FA_REQUIRE_RANGE(p->total_k, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "total_k");
        if (p->device == FA_DEVICE_CPU) {
            fa_status s = check_cu_seqlens(p->cu_seqlens_q, "cu_seqlens_q", p->batch, p->seqlen_q,
                                           "seqlen_q", p->total_q, "total_q");
            if (s != FA_OK) return s;
            /* paged: cu_seqlens_k gives lengths, the rows live in pages (total_k unused) */
            s = check_cu_seqlens(p->cu_seqlens_k, "cu_seqlens_k", p->batch, p->seqlen_k, "seqlen_k",
                                 paged ? FA_MAX_EXTENT : p->total_k, "total_k");
            if (s != FA_OK) return s;
        }
    } else {
        int64_t tq, tk;
        if (!fa_mul_add_ok(p->batch, p->seqlen_q, 0, &tq) ||
            !fa_mul_add_ok(p->batch, p->seqlen_k, 0, &tk))
            return fa_set_error(FA_ERR_OVERFLOW, "batch × seqlen overflows");
        p->total_q = tq;
        p->total_k = tk;
    }

    if (paged) {
        fa_status s = fa_validate_paged_kv(pb);
        if (s != FA_OK) return s;
    }

    /* score bias, document ids, block-sparse mask (fa_validate.c) */
    {
        const char *no_mods = kind == CALL_STANDARD                      ? "fa_standard_forward"
                              : kind == CALL_FORWARD && p->attn_probs   ? "fa_forward with attn_probs"
                                                                         : NULL;
        fa_status s = fa_validate_score_mods(pb, no_mods, kind == CALL_BACKWARD, 0);
        if (s != FA_OK) return s;
    }

    /* 6. strides, byte spans and alignment of every array the call touches (a paged K/V's page
     * pool: fa_validate_paged_kv); outputs must not share memory with anything else */
    int64_t rows_q = pb->varlen ? p->total_q : p->seqlen_q;
    int64_t rows_k = pb->varlen ? p->total_k : p->seqlen_k;
    int64_t hq = p->heads_q, hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    int64_t lse_elems;
    if (!fa_mul_add_ok(hq, p->total_q, 0, &lse_elems))
        return fa_set_error(FA_ERR_OVERFLOW, "heads_q × total_q overflows");
    const int fwd_out = kind != CALL_BACKWARD, bwd = kind == CALL_BACKWARD;
    fa_tensor_view views[19 + FA_SCORE_MOD_VIEWS];
    int nviews = 0;
    views[nviews++] = make_view("q", 0, pb, p->dtype, p->q, rows_q, hq, d, p->q_batch_stride, p->q_row_stride, p->q_head_stride);
    if (!paged) {
        views[nviews++] = make_view("k", 0, pb, p->dtype, p->k, rows_k, hkv, d, p->k_batch_stride, p->k_row_stride, p->k_head_stride);
        views[nviews++] = make_view("v", 0, pb, p->dtype, p->v, rows_k, hkv, dv, p->v_batch_stride, p->v_row_stride, p->v_head_stride);
    }
    views[nviews++] = make_view("o", fwd_out, pb, fa_out_dtype(p->dtype), p->o, rows_q, hq, dv, p->o_batch_stride,
                                p->o_row_stride, p->o_head_stride);
    views[nviews++] = fa_array_view("lse", fwd_out, p->lse, lse_elems, 4);
    if (bwd) {
        const fa_dtype do_dtype = p->dout_e4m3 ? FA_DTYPE_FP8_E4M3 : fa_out_dtype(p->dtype);
        views[nviews++] = make_view("do", 0, pb, do_dtype, p->dout, rows_q, hq, dv, p->do_batch_stride, p->do_row_stride, p->do_head_stride);
        views[nviews++] = make_view("dq", 1, pb, fa_out_dtype(p->dtype), p->dq, rows_q, hq, d, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride);
        views[nviews++] = make_view("dk", 1, pb, fa_out_dtype(p->dtype), p->dk, rows_k, hkv, d, p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride);
        views[nviews++] = make_view("dv", 1, pb, fa_out_dtype(p->dtype), p->dv, rows_k, hkv, dv, p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride);
        views[nviews++] = fa_array_view("dsink", 1, p->dsink, hq, 4);
    }
    fa_tensor_view alibi = fa_array_view("alibi_slopes", 0, p->alibi_slopes, hq, 4);
    alibi.extent[0] = p->batch;
    alibi.stride[0] = p->alibi_batch_stride;
    views[nviews++] = alibi;
    views[nviews++] = fa_array_view("sink_logits", 0, p->sink_logits, hq, 4);
    if (pb->varlen) {
        views[nviews++] = fa_array_view("cu_seqlens_q", 0, p->cu_seqlens_q, p->batch + 1, 4);
        views[nviews++] = fa_array_view("cu_seqlens_k", 0, p->cu_seqlens_k, p->batch + 1, 4);
    }
    nviews += fa_score_mod_views(pb, bwd, views + nviews);
    const int fp8 = p->dtype == FA_DTYPE_FP8_E4M3;
    int64_t descales = 0; /* [batch, heads_kv] per descale array */
    if (fp8) {
        if (!fa_mul_add_ok(p->batch, hkv, 0, &descales))
            return fa_set_error(FA_ERR_OVERFLOW, "batch × heads_kv overflows");
        views[nviews++] = fa_array_view("q_descale", 0, p->q_descale, descales, 4);
        views[nviews++] = fa_array_view("k_descale", 0, p->k_descale, descales, 4);
        views[nviews++] = fa_array_view("v_descale", 0, p->v_descale, descales, 4);
        if (bwd && p->dout_e4m3) views[nviews++] = fa_array_view("dout_descale", 0, p->dout_descale, descales, 4);
    }
    fa_status s = fa_check_views(views, nviews);
    if (s != FA_OK) return s;
    if (p->device != FA_DEVICE_CPU) { /* CUDA: the block lists are checked on the device (src/cuda/mods.cu) */
        fa_score_mods_move_window(pb);
        return FA_OK;
    }
    if ((s = fa_check_score_mod_contents(pb)) != FA_OK) return s;
    if (fp8) {
        const float *arrays[4] = {p->q_descale, p->k_descale, p->v_descale, bwd && p->dout_e4m3 ? p->dout_descale : NULL};
        const char *names[4] = {"q_descale", "k_descale", "v_descale", "dout_descale"};
        for (int a = 0; a < 4; ++a)
            for (int64_t i = 0; arrays[a] != NULL && i < descales; ++i)
                if (!(isfinite(arrays[a][i]) && arrays[a][i] > 0.0f))
                    return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                        "%s[%lld] = %g: a descale factor must be finite and > 0", names[a],
                                        (long long)i, (double)arrays[a][i]);
    }
    const int64_t nb = pb->varlen ? 1 : p->batch;
#define ZERO_UNUSED(t, rows, heads)                                                                \
    fa_zero_unused_strides(nb, &p->t##_batch_stride, rows, &p->t##_row_stride, heads, &p->t##_head_stride)
    ZERO_UNUSED(q, rows_q, hq);
    if (!paged) {
        ZERO_UNUSED(k, rows_k, hkv);
        ZERO_UNUSED(v, rows_k, hkv);
    }
    ZERO_UNUSED(o, rows_q, hq);
    ZERO_UNUSED(do, rows_q, hq);
    ZERO_UNUSED(dq, rows_q, hq);
    ZERO_UNUSED(dk, rows_k, hkv);
    ZERO_UNUSED(dv, rows_k, hkv);
#undef ZERO_UNUSED
    if (p->batch <= 1) p->alibi_batch_stride = 0;
    return FA_OK;
}

/* Engine limits and workspace, shared by the check functions and the calls. */
static fa_status engine_check(const fa_problem *pb, call_kind kind, size_t *ws) {
    *ws = 0;
    if (pb->p.device == FA_DEVICE_CUDA)
        return kind == CALL_BACKWARD ? fa_cuda_check_backward(pb, ws) : fa_cuda_check_forward(pb, ws);
    if (kind == CALL_FORWARD) *ws = fa_cpu_forward_workspace(pb);
    if (kind == CALL_BACKWARD) *ws = fa_cpu_backward_workspace(pb);
    return FA_OK;
}

static fa_status prepare(const fa_params *in, call_kind kind, fa_problem *pb, size_t *ws_out) {
    fa_status s = validate(in, kind, pb);
    if (s != FA_OK) return s;
    size_t ws = 0;
    s = engine_check(pb, kind, &ws);
    if (s != FA_OK) return s;
    if ((s = fa_check_workspace_size(&pb->p, ws)) != FA_OK) return s;
    if (ws_out) *ws_out = ws;
    return FA_OK;
}

/* ---- public calls --------------------------------------------------------------------------- */

fa_status fa_check_forward(const fa_params *p, size_t *workspace_bytes) {
    fa_problem pb;
    return prepare(p, CALL_FORWARD, &pb, workspace_bytes);
}

fa_status fa_check_backward(const fa_params *p, size_t *workspace_bytes) {
    fa_problem pb;
    return prepare(p, CALL_BACKWARD, &pb, workspace_bytes);
}

/* p.zero_varlen_tail: the rows past the last sequence, which the engines leave, set to zero
 * (the outputs' views were checked over total_q / total_k rows). */
static fa_status zero_varlen_tail(const fa_problem *pb, call_kind kind) {
    const fa_params *p = &pb->p;
    if (!pb->varlen || !p->zero_varlen_tail) return FA_OK;
    /* an fp8 forward writes o in bf16 */
    const int64_t out_bytes = p->dtype == FA_DTYPE_FP8_E4M3 ? 2 : fa_dtype_bytes(p->dtype);
    fa_tail_rows t[4];
    int n = 0;
    if (kind == CALL_BACKWARD) {
        t[n++] = (fa_tail_rows){p->dq, out_bytes, p->dq_row_stride, p->dq_head_stride, p->heads_q, p->head_dim,
                                p->total_q, p->cu_seqlens_q};
        t[n++] = (fa_tail_rows){p->dk, out_bytes, p->dk_row_stride, p->dk_head_stride, p->heads_kv, p->head_dim,
                                p->total_k, p->cu_seqlens_k};
        t[n++] = (fa_tail_rows){p->dv, out_bytes, p->dv_row_stride, p->dv_head_stride, p->heads_kv,
                                p->head_dim_v, p->total_k, p->cu_seqlens_k};
    } else {
        t[n++] = (fa_tail_rows){p->o, out_bytes, p->o_row_stride, p->o_head_stride, p->heads_q, p->head_dim_v,
                                p->total_q, p->cu_seqlens_q};
        if (p->lse != NULL) /* [heads_q, total_q] */
            t[n++] = (fa_tail_rows){p->lse, 4, 1, p->total_q, p->heads_q, 1, p->total_q, p->cu_seqlens_q};
    }
    if (p->device == FA_DEVICE_CUDA) return fa_cuda_zero_tail_rows(t, n, p->batch, p->stream);
    for (int i = 0; i < n; ++i) /* CPU: cu_seqlens were checked on the host */
        for (int64_t r = t[i].cu_seqlens[p->batch]; r < t[i].total; ++r)
            for (int64_t h = 0; h < t[i].heads; ++h)
                memset((char *)t[i].base + (r * t[i].row_stride + h * t[i].head_stride) * t[i].elem_bytes, 0,
                       (size_t)(t[i].cols * t[i].elem_bytes));
    return FA_OK;
}

fa_status fa_forward(const fa_params *p) {
    fa_problem pb;
    fa_status s = prepare(p, CALL_FORWARD, &pb, NULL);
    if (s != FA_OK) return s;
    s = pb.p.device == FA_DEVICE_CUDA ? fa_cuda_forward(&pb) : fa_cpu_forward(&pb);
    return s == FA_OK ? zero_varlen_tail(&pb, CALL_FORWARD) : s;
}

fa_status fa_backward(const fa_params *p) {
    fa_problem pb;
    fa_status s = prepare(p, CALL_BACKWARD, &pb, NULL);
    if (s != FA_OK) return s;
    s = pb.p.device == FA_DEVICE_CUDA ? fa_cuda_backward(&pb) : fa_cpu_backward(&pb);
    return s == FA_OK ? zero_varlen_tail(&pb, CALL_BACKWARD) : s;
}

fa_status fa_standard_forward(const fa_params *p) {
    fa_problem pb;
    fa_status s = prepare(p, CALL_STANDARD, &pb, NULL);
    if (s != FA_OK) return s;
    return fa_cpu_standard_forward(&pb);
}

/* a·b, or INT64_MAX when it overflows (the validation then reports the stride) */
static int64_t saturating_mul(int64_t a, int64_t b) {
    int64_t m;
    return __builtin_mul_overflow(a, b, &m) ? INT64_MAX : m;
}

void fa_set_contiguous_strides(fa_params *p) {
    if (p == NULL) return;
    int64_t d = p->head_dim, dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    int64_t hq = p->heads_q, hkv = p->heads_kv;
    int varlen = p->cu_seqlens_q != NULL;
    int64_t sq = p->seqlen_q, sk = p->seqlen_k;
#define SET_STRIDES(prefix, heads, dim, rows)                                                     \
    do {                                                                                          \
        p->prefix##_head_stride = (dim);                                                          \
        p->prefix##_row_stride = saturating_mul((heads), (dim));                                  \
        p->prefix##_batch_stride = varlen ? 0 : saturating_mul((rows), p->prefix##_row_stride);   \
    } while (0)
    SET_STRIDES(q, hq, d, sq);
    SET_STRIDES(k, hkv, d, sk);
    SET_STRIDES(v, hkv, dv, sk);
    SET_STRIDES(o, hq, dv, sq);
    SET_STRIDES(do, hq, dv, sq);
    SET_STRIDES(dq, hq, d, sq);
    SET_STRIDES(dk, hkv, d, sk);
    SET_STRIDES(dv, hkv, dv, sk);
#undef SET_STRIDES
}
