/*
 * sweep.c: the randomised check sweep (sweep.h) and the single-case runner it shares with the
 * unit tests (sweep_case.h).
 */
#include "oracle/sweep.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oracle/reference.h"
#include "oracle/sweep_case.h"

/* ---- the CUDA runtime, loaded at run time ------------------------------------------------- */

#define CUDA_MEMCPY_HOST_TO_DEVICE 1
#define CUDA_MEMCPY_DEVICE_TO_HOST 2

typedef struct sweep_cudart {
    int (*malloc_)(void **ptr, size_t bytes);
    int (*free_)(void *ptr);
    int (*memcpy_)(void *dst, const void *src, size_t bytes, int kind);
    int (*memset_)(void *ptr, int value, size_t bytes);
    int (*device_synchronize)(void);
    const char *(*get_error_string)(int error);
} sweep_cudart;

static int bind_symbol(void *handle, void *slot, const char *name) {
    void *fn = dlsym(handle, name);
    if (!fn) return 0;
    memcpy(slot, &fn, sizeof fn);
    return 1;
}

/* Load libcudart once; NULL with a reason when it is not there. */
static const sweep_cudart *sweep_cudart_load(char *why, size_t why_size) {
    static sweep_cudart api;
    static int state; /* 0 untried, 1 loaded, -1 failed */
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                        "libcudart.so.11.0"};
    if (state == 0) {
        state = -1;
        for (size_t i = 0; i < sizeof names / sizeof names[0] && state < 0; i++) {
            void *handle = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
            if (!handle) continue;
            if (bind_symbol(handle, &api.malloc_, "cudaMalloc") &&
                bind_symbol(handle, &api.free_, "cudaFree") &&
                bind_symbol(handle, &api.memcpy_, "cudaMemcpy") &&
                bind_symbol(handle, &api.memset_, "cudaMemset") &&
                bind_symbol(handle, &api.device_synchronize, "cudaDeviceSynchronize") &&
                bind_symbol(handle, &api.get_error_string, "cudaGetErrorString"))
                state = 1;
            else
                dlclose(handle);
        }
    }
    if (state == 1) return &api;
    snprintf(why, why_size, "no CUDA runtime could be loaded (dlopen libcudart.so, .13, .12, .11.0)");
    return NULL;
}

/* Mirror `count` buffers on the device (all of them, outputs included, as they are now). */
static int buffers_upload(const sweep_cudart *rt, fa_test_buffer *bufs, int count, char *why,
                          size_t why_size) {
    for (int i = 0; i < count; i++) {
        fa_test_buffer *buf = &bufs[i];
        if (!buf->host) continue;
        int err = buf->device ? 0 : rt->malloc_(&buf->device, buf->bytes);
        if (err == 0) err = rt->memcpy_(buf->device, buf->host, buf->bytes, CUDA_MEMCPY_HOST_TO_DEVICE);
        if (err != 0) {
            snprintf(why, why_size, "cudaMalloc/cudaMemcpy of %zu bytes: %s", buf->bytes,
                     rt->get_error_string(err));
            return -1;
        }
    }
    return 0;
}

static int buffers_download(const sweep_cudart *rt, fa_test_buffer *bufs, int count, char *why,
                            size_t why_size) {
    for (int i = 0; i < count; i++) {
        fa_test_buffer *buf = &bufs[i];
        if (!buf->host || !buf->device) continue;
        int err = rt->memcpy_(buf->host, buf->device, buf->bytes, CUDA_MEMCPY_DEVICE_TO_HOST);
        if (err != 0) {
            snprintf(why, why_size, "cudaMemcpy: %s", rt->get_error_string(err));
            return -1;
        }
    }
    return 0;
}

static void buffers_release(const sweep_cudart *rt, fa_test_buffer *bufs, int count) {
    for (int i = 0; i < count; i++)
        if (bufs[i].device) {
            rt->free_(bufs[i].device);
            bufs[i].device = NULL;
        }
}

static int device_copy(const sweep_cudart *rt, fa_test_problem *tp, int buffer, int to_device,
                       char *why, size_t why_size) {
    fa_test_buffer *buf = &tp->buffer[buffer];
    if (!buf->host || !buf->device) return 0;
    int err = to_device ? rt->memcpy_(buf->device, buf->host, buf->bytes, CUDA_MEMCPY_HOST_TO_DEVICE)
                        : rt->memcpy_(buf->host, buf->device, buf->bytes, CUDA_MEMCPY_DEVICE_TO_HOST);
    if (err != 0) {
        snprintf(why, why_size, "cudaMemcpy: %s", rt->get_error_string(err));
        return -1;
    }
    return 0;
}

static int device_copy_all(const sweep_cudart *rt, fa_test_problem *tp, int to_device, char *why,
                           size_t why_size) {
    for (int b = 0; b < FA_T_COUNT; b++)
        if (device_copy(rt, tp, b, to_device, why, why_size)) return -1;
    return 0;
}

/* ---- one case --------------------------------------------------------------------------- */

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rows of `tensor` (O, LSE, DQ) whose query sees no key: their values must be exact (O, dq
 * rows 0; LSE -inf, or the sink logit). Returns the number of violating elements. */
static int64_t masked_row_violations(const fa_test_problem *tp, int tensor) {
    const fa_params *p = &tp->params;
    const fa_test_spec *s = &tp->spec;
    int64_t violations = 0;
    int64_t left = s->use_window && s->window_left >= 0 ? s->window_left : -1;
    int64_t right = s->use_window && s->window_right >= 0 ? s->window_right : -1;
    if (s->causal) right = 0;
    const fa_test_buffer *buf = &tp->buffer[tp->view[tensor].buffer];
    for (int64_t b = 0; b < s->batch; b++) {
        int64_t q_first = 0, len_q = s->seqlen_q, len_k = s->seqlen_k;
        if (s->varlen) {
            q_first = p->cu_seqlens_q[b];
            len_q = p->cu_seqlens_q[b + 1] - q_first;
            len_k = p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
        }
        for (int64_t i = 0; i < len_q; i++) {
            int64_t diag = i + len_k - len_q;
            int64_t lo = left >= 0 && diag - left > 0 ? diag - left : 0;
            int64_t hi = right >= 0 && diag + right + 1 < len_k ? diag + right + 1 : len_k;
            if (hi > lo) continue; /* this row sees some key */
            for (int64_t h = 0; h < s->heads_q; h++) {
                if (tensor == FA_T_LSE) {
                    int64_t at = s->varlen ? h * tp->total_q + q_first + i
                                           : (b * s->heads_q + h) * s->seqlen_q + i;
                    float lse = ((const float *)buf->host)[at];
                    if (!s->sinks) {
                        violations += !(isinf(lse) && lse < 0);
                    } else {
                        float sink = p->sink_logits[h];
                        /* LSE = log(exp(t)) = t; allow 4 ulp for a base-2 round trip */
                        violations += !(fabsf(lse - sink) <= 4.0f * 1.1920929e-7f * fmaxf(1.0f, fabsf(sink)));
                    }
                    continue;
                }
                const fa_test_view *vw = &tp->view[tensor];
                int64_t dim = tensor == FA_T_O ? s->head_dim_v : s->head_dim;
                int64_t row = s->varlen ? (q_first + i) * vw->row_stride
                                        : b * vw->batch_stride + i * vw->row_stride;
                for (int64_t c = 0; c < dim; c++)
                    violations += fa_test_load(buf->host, s->dtype, vw->offset + row + h * vw->head_stride + c) != 0.0;
            }
        }
    }
    return violations;
}

int fa_case_run(const fa_test_spec *spec, fa_device device, int num_threads,
                fa_case_result *r) {
    memset(r, 0, sizeof *r);
    fa_test_problem tp;
    const sweep_cudart *rt = NULL;
    int on_device = device == FA_DEVICE_CUDA;
    /* fp8 inputs: a bf16 problem quantised to e4m3 (reference.h, fp8 inputs); on CUDA against the
     * baseline whose P·V takes P in e4m3 (the CPU engine keeps P in fp32) and whose backward runs
     * in bf16 from that O, as the CUDA fp8 backward does */
    const int fp8 = spec->dtype == FA_DTYPE_FP8_E4M3;
    fa_test_spec created = *spec;
    if (fp8) created.dtype = FA_DTYPE_BF16;
    /* codes q, k, v; descales q, k, v; dout's code and descale (an e4m3 dout) */
    void *fp8_device[8] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    fa_test_fp8 codes;
    memset(&codes, 0, sizeof codes);
    if (fa_test_problem_create(&tp, &created)) {
        snprintf(r->error, sizeof r->error, "could not create the problem (bad spec or out of memory)");
        return -1;
    }
    /* backward cases of odd seeds take dout in e4m3 too (dout_e4m3) */
    if (fp8 && (fa_test_fp8_quantise(&tp, 1, spec->seed ^ 0xf8u, &codes) ||
                (created.backward && (spec->seed & 1) && fa_test_fp8_quantise_dout(&tp, spec->seed ^ 0xd0u, &codes)))) {
        fa_test_fp8_free(&codes);
        snprintf(r->error, sizeof r->error, "fp8 inputs: out of memory");
        fa_test_problem_destroy(&tp);
        return -1;
    }
    r->spec = tp.spec;
    r->spec.dtype = spec->dtype;
    tp.params.num_threads = num_threads;
    tp.params.device = device;
    if (on_device) {
        rt = sweep_cudart_load(r->error, sizeof r->error);
        if (!rt || buffers_upload(rt, tp.buffer, FA_T_COUNT, r->error, sizeof r->error)) goto fail;
    }
    fa_params p = on_device ? fa_test_problem_device_params(&tp) : fp8 ? fa_test_fp8_params(&tp, &codes, 1) : tp.params;
    if (on_device && fp8) { /* the codes and descale factors on the device, at the host layout's offsets */
        const fa_params host = fa_test_fp8_params(&tp, &codes, 1);
        const size_t descale_bytes = sizeof(float) * (size_t)(host.batch * host.heads_kv);
        const size_t bytes[8] = {codes.count[0], codes.count[1], codes.count[2], descale_bytes, descale_bytes,
                                 descale_bytes, codes.count[3], codes.code[3] ? descale_bytes : 0};
        const void *src[8] = {codes.code[0], codes.code[1], codes.code[2],
                              codes.descale[0], codes.descale[1], codes.descale[2], codes.code[3], codes.descale[3]};
        for (int i = 0; i < 8; i++) {
            if (i >= 6 && !codes.code[3]) break;
            int err = rt->malloc_(&fp8_device[i], bytes[i] > 0 ? bytes[i] : 1);
            if (err == 0 && bytes[i] > 0) err = rt->memcpy_(fp8_device[i], src[i], bytes[i], CUDA_MEMCPY_HOST_TO_DEVICE);
            if (err != 0) {
                snprintf(r->error, sizeof r->error, "fp8 codes to the device: %s", rt->get_error_string(err));
                goto fail;
            }
        }
        p.dtype = FA_DTYPE_FP8_E4M3;
        p.q = (const uint8_t *)fp8_device[0] + ((const uint8_t *)host.q - codes.code[0]);
        p.k = (const uint8_t *)fp8_device[1] + ((const uint8_t *)host.k - codes.code[1]);
        p.v = (const uint8_t *)fp8_device[2] + ((const uint8_t *)host.v - codes.code[2]);
        p.q_descale = fp8_device[3];
        p.k_descale = fp8_device[4];
        p.v_descale = fp8_device[5];
        if (codes.code[3]) {
            p.dout = (const uint8_t *)fp8_device[6] + ((const uint8_t *)host.dout - codes.code[3]);
            p.dout_e4m3 = 1;
            p.dout_descale = fp8_device[7];
        }
    }
    p.num_threads = num_threads;
    p.device = device;

    /* Does the CUDA path take it? It rejects some head dims: counted as skipped. The CPU path
     * must take everything, so there a refusal fails the case below. */
    fa_status support = fa_check_forward(&p, NULL);
    if (support == FA_OK && created.backward) support = fa_check_backward(&p, NULL);
    if (on_device &&
        (support == FA_ERR_HEAD_DIM || support == FA_ERR_UNSUPPORTED || support == FA_ERR_ALIGNMENT)) {
        r->skipped = 1;
        snprintf(r->skip_reason, sizeof r->skip_reason, "%s", fa_last_error());
        goto done;
    }

    /* reference and baseline, from the host copies of the inputs */
    fa_ref_gathered g;
    fa_ref_outputs ref64, base;
    double t0 = seconds_now();
    if (fa_ref_references(&tp.params, fp8 && on_device ? FA_DTYPE_FP8_E4M3 : created.dtype, created.backward, &g,
                          &ref64, &base)) {
        snprintf(r->error, sizeof r->error, "out of memory in the reference");
        goto fail;
    }
    r->reference_seconds = seconds_now() - t0;

    /* forward */
    t0 = seconds_now();
    r->fwd_status = fa_forward(&p);
    if (on_device) rt->device_synchronize();
    r->fwd_seconds = seconds_now() - t0;
    r->ran_forward = 1;
    if (r->fwd_status != FA_OK) {
        snprintf(r->error, sizeof r->error, "fa_forward: %s: %s", fa_strerror(r->fwd_status), fa_last_error());
    } else {
        if (on_device && (device_copy(rt, &tp, FA_T_O, 0, r->error, sizeof r->error) ||
                          device_copy(rt, &tp, FA_T_LSE, 0, r->error, sizeof r->error)))
            goto fail_ref;
        r->o = fa_test_compare(&tp, FA_T_O, &ref64, &base);
        r->lse = fa_test_compare(&tp, FA_T_LSE, &ref64, &base);
        if (fp8 && on_device) fa_test_check_widen(&r->lse, fa_test_fp8_score_noise(spec->head_dim, r->lse.term_max));
        r->masked_violations = masked_row_violations(&tp, FA_T_O) + masked_row_violations(&tp, FA_T_LSE);
    }
    r->fwd_ok = r->fwd_status == FA_OK && r->o.ok && r->lse.ok && r->masked_violations == 0;

    /* backward, from the library's own o and lse */
    if (created.backward && r->fwd_status == FA_OK) {
        void *o_before = fa_test_snapshot(&tp, FA_T_O), *lse_before = fa_test_snapshot(&tp, FA_T_LSE);
        fa_test_poison_backward_outputs(&tp);
        static const int backward_outputs[] = {FA_T_DQ, FA_T_DK, FA_T_DV, FA_T_DSINK};
        for (int t = 0; on_device && t < 4; t++)
            if (device_copy(rt, &tp, backward_outputs[t], 1, r->error, sizeof r->error)) goto fail_ref;
        t0 = seconds_now();
        r->bwd_status = fa_backward(&p);
        if (on_device) rt->device_synchronize();
        r->bwd_seconds = seconds_now() - t0;
        r->ran_backward = 1;
        if (r->bwd_status != FA_OK) {
            snprintf(r->error, sizeof r->error, "fa_backward: %s: %s", fa_strerror(r->bwd_status),
                     fa_last_error());
        } else {
            if (on_device && device_copy_all(rt, &tp, 0, r->error, sizeof r->error)) goto fail_ref;
            r->dq = fa_test_compare(&tp, FA_T_DQ, &ref64, &base);
            r->dk = fa_test_compare(&tp, FA_T_DK, &ref64, &base);
            r->dv = fa_test_compare(&tp, FA_T_DV, &ref64, &base);
            r->has_dsink = spec->sinks;
            if (r->has_dsink) r->dsink = fa_test_compare(&tp, FA_T_DSINK, &ref64, &base);
            r->masked_violations_bwd = masked_row_violations(&tp, FA_T_DQ);
            /* o and lse are inputs of the backward */
            r->fwd_outputs_kept = fa_test_same_as_snapshot(&tp, FA_T_O, o_before) &&
                                  fa_test_same_as_snapshot(&tp, FA_T_LSE, lse_before);
        }
        free(o_before);
        free(lse_before);
        r->bwd_ok = r->bwd_status == FA_OK && r->dq.ok && r->dk.ok && r->dv.ok &&
                    (!r->has_dsink || r->dsink.ok) && r->masked_violations_bwd == 0 &&
                    r->fwd_outputs_kept;
    }
    if (on_device && device_copy_all(rt, &tp, 0, r->error, sizeof r->error)) goto fail_ref;
    r->inputs_unchanged = fa_test_inputs_unchanged(&tp) && fa_test_fp8_unchanged(&codes);
    if (!r->inputs_unchanged) {
        r->fwd_ok = 0;
        r->bwd_ok = 0;
    }
    fa_ref_references_free(&g, &ref64, &base);
done:
    if (rt) buffers_release(rt, tp.buffer, FA_T_COUNT);
    for (int i = 0; rt && i < 8; i++)
        if (fp8_device[i]) rt->free_(fp8_device[i]);
    fa_test_fp8_free(&codes);
    fa_test_problem_destroy(&tp);
    return 0;
fail_ref:
    fa_ref_references_free(&g, &ref64, &base);
fail:
    if (rt) buffers_release(rt, tp.buffer, FA_T_COUNT);
    for (int i = 0; rt && i < 8; i++)
        if (fp8_device[i]) rt->free_(fp8_device[i]);
    fa_test_fp8_free(&codes);
    fa_test_problem_destroy(&tp);
    return -1;
}

static const char *layout_name(fa_test_layout layout) {
    switch (layout) {
    case FA_TEST_LAYOUT_PADDED: return "padded";
    case FA_TEST_LAYOUT_BHSD: return "bhsd";
    case FA_TEST_LAYOUT_PACKED_QKV: return "packed-qkv";
    default: return "contiguous";
    }
}

void fa_case_describe(const fa_test_spec *s, char *buf, size_t size) {
    fa_test_problem shape; /* only spec fields are used by fa_test_describe */
    memset(&shape, 0, sizeof shape);
    shape.spec = *s;
    char features[160];
    fa_test_describe(&shape, features, sizeof features);
    snprintf(buf, size, "%-4s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld dv=%lld %s%s %s",
             fa_test_dtype_name(s->dtype), (long long)s->batch, (long long)s->seqlen_q,
             (long long)s->seqlen_k, (long long)s->heads_q, (long long)s->heads_kv,
             (long long)s->head_dim, (long long)s->head_dim_v, s->varlen ? "varlen " : "",
             layout_name(s->layout), features);
}

static int format_check(char *buf, size_t size, const char *name, const fa_test_check *c,
                        int verbose) {
    int n = snprintf(buf, size, " %s %.2e/%.2e", name, c->err, c->tol);
    if (verbose && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, "(rel %.1e base %.1e)",
                      c->ref_max > 0 ? c->err / c->ref_max : 0.0, c->base_err);
    if (!c->ok && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, "[%s%s unwritten=%lld clobbered=%lld nonfinite=%lld]",
                      c->err > c->tol ? "ERR>TOL" : "", c->err > c->tol ? "," : "",
                      (long long)c->unwritten, (long long)c->clobbered, (long long)c->nonfinite);
    return n;
}

void fa_case_format(const fa_case_result *r, int backward, int verbose, char *buf, size_t size) {
    size_t n = 0;
#define ADD(call)                                                                            \
    do {                                                                                     \
        if (n < size) n += (size_t)(call);                                                   \
    } while (0)
    if (!backward) {
        ADD(format_check(buf + n, size - n, "o", &r->o, verbose));
        ADD(format_check(buf + n, size - n, "lse", &r->lse, verbose));
        if (r->masked_violations)
            ADD(snprintf(buf + n, size - n, " masked-rows-not-exact=%lld", (long long)r->masked_violations));
    } else {
        ADD(format_check(buf + n, size - n, "dq", &r->dq, verbose));
        ADD(format_check(buf + n, size - n, "dk", &r->dk, verbose));
        ADD(format_check(buf + n, size - n, "dv", &r->dv, verbose));
        if (r->has_dsink) ADD(format_check(buf + n, size - n, "dsink", &r->dsink, verbose));
        if (r->masked_violations_bwd)
            ADD(snprintf(buf + n, size - n, " masked-dq-not-zero=%lld", (long long)r->masked_violations_bwd));
        if (r->ran_backward && r->bwd_status == FA_OK && !r->fwd_outputs_kept)
            ADD(snprintf(buf + n, size - n, " backward-wrote-o-or-lse"));
    }
    if (!r->inputs_unchanged) ADD(snprintf(buf + n, size - n, " INPUTS-MODIFIED"));
#undef ADD
    if (n == 0 && size) buf[0] = '\0';
}

/* ---- KV-cache and merge cases --------------------------------------------------------- */

static int device_refuses(fa_status s) {
    return s == FA_ERR_HEAD_DIM || s == FA_ERR_UNSUPPORTED || s == FA_ERR_ALIGNMENT;
}

int fa_kv_case_run(const fa_kv_spec *spec, fa_device device, int num_threads, fa_kv_case_result *r) {
    memset(r, 0, sizeof *r);
    r->spec = *spec;
    fa_kv_problem kp;
    const sweep_cudart *rt = NULL;
    int on_device = device == FA_DEVICE_CUDA;
    if (fa_kv_problem_create(&kp, spec)) {
        snprintf(r->error, sizeof r->error, "could not create the problem (bad spec or out of memory)");
        return -1;
    }
    r->spec = kp.spec;
    int rc = -1;
    if (on_device) {
        rt = sweep_cudart_load(r->error, sizeof r->error);
        if (!rt || buffers_upload(rt, kp.buffer, FA_KV_BUFFER_COUNT, r->error, sizeof r->error)) goto done;
    }
    fa_params p = on_device ? fa_kv_problem_device_params(&kp) : kp.params;
    p.device = device;
    p.num_threads = num_threads;
    fa_status support = fa_check_kvcache(&p, NULL);
    if (on_device && device_refuses(support)) {
        r->skipped = 1;
        snprintf(r->skip_reason, sizeof r->skip_reason, "%s", fa_last_error());
        rc = 0;
        goto done;
    }
    double t0 = seconds_now();
    r->status = fa_kvcache_forward(&p);
    if (on_device) rt->device_synchronize();
    r->seconds = seconds_now() - t0;
    if (on_device && buffers_download(rt, kp.buffer, FA_KV_BUFFER_COUNT, r->error, sizeof r->error)) goto done;
    if (r->status != FA_OK) {
        snprintf(r->error, sizeof r->error, "fa_kvcache_forward: %s: %s", fa_strerror(r->status),
                 fa_last_error());
    } else {
        t0 = seconds_now();
        r->check = fa_kv_verify(&kp);
        r->reference_seconds = seconds_now() - t0;
        r->ok = r->check.ok;
    }
    rc = 0;
done:
    if (rt) buffers_release(rt, kp.buffer, FA_KV_BUFFER_COUNT);
    fa_kv_problem_destroy(&kp);
    return rc;
}

int fa_merge_case_run(const fa_merge_spec *spec, fa_device device, int num_threads,
                      fa_merge_case_result *r) {
    memset(r, 0, sizeof *r);
    r->spec = *spec;
    fa_merge_problem mp;
    const sweep_cudart *rt = NULL;
    int on_device = device == FA_DEVICE_CUDA;
    if (fa_merge_problem_create(&mp, spec)) {
        snprintf(r->error, sizeof r->error, "could not create the problem (bad spec or out of memory)");
        return -1;
    }
    r->spec = mp.spec;
    int rc = -1;
    if (on_device) {
        rt = sweep_cudart_load(r->error, sizeof r->error);
        if (!rt || buffers_upload(rt, mp.buffer, FA_MG_BUFFER_COUNT, r->error, sizeof r->error)) goto done;
    }
    fa_merge_params m = on_device ? fa_merge_problem_device_params(&mp) : mp.params;
    m.device = device;
    m.num_threads = num_threads;
    r->status = fa_merge_states(&m);
    if (on_device) rt->device_synchronize();
    if (on_device && buffers_download(rt, mp.buffer, FA_MG_BUFFER_COUNT, r->error, sizeof r->error)) goto done;
    if (on_device && device_refuses(r->status)) {
        r->skipped = 1;
        snprintf(r->skip_reason, sizeof r->skip_reason, "%s", fa_last_error());
    } else if (r->status != FA_OK) {
        snprintf(r->error, sizeof r->error, "fa_merge_states: %s: %s", fa_strerror(r->status),
                 fa_last_error());
    } else {
        r->check = fa_merge_verify(&mp);
        r->ok = r->check.ok;
    }
    rc = 0;
done:
    if (rt) buffers_release(rt, mp.buffer, FA_MG_BUFFER_COUNT);
    fa_merge_problem_destroy(&mp);
    return rc;
}

/* ---- case generation -------------------------------------------------------------------- */

/* Feature recipes, cycled so that every level covers each at least once per dtype. */
enum recipe {
    R_PLAIN, R_CAUSAL, R_WINDOW, R_CAUSAL_WINDOW, R_SOFTCAP, R_ALIBI_HEAD, R_ALIBI_BATCH_CAUSAL,
    R_SINKS, R_SINKS_MASKED, R_GQA_CAUSAL, R_MQA_WINDOW, R_VARLEN_CAUSAL, R_VARLEN_FEATURES,
    R_MASKED_ROWS, R_PACKED_GQA, R_BHSD_SOFTCAP_WINDOW, R_EVERYTHING, R_SCALE_SHARP,
    R_HEAD_DIM_V, R_SCALE_NEGATIVE, R_DROPOUT, R_LARGE_HEADS, R_COUNT
};

static int64_t pick(fa_test_rng *rng, const int64_t *values, int count) {
    return values[fa_test_rng_int(rng, 0, count - 1)];
}

static void draw_case(fa_test_rng *rng, fa_sweep_level level, fa_device device, fa_dtype dtype,
                      int recipe, fa_test_spec *s) {
    static const int64_t tokens_quick[] = {1, 7, 33, 113, 128, 203};
    static const int64_t tokens_full[] = {1, 7, 64, 113, 203, 256, 1023};
    static const int64_t dims[] = {32, 59, 64, 96, 111, 128, 256};
    memset(s, 0, sizeof *s);
    s->dtype = dtype;
    s->seed = fa_test_rng_next(rng);
    s->backward = 1;
    s->pad_align = device != FA_DEVICE_CUDA ? 1 : dtype == FA_DTYPE_FP8_E4M3 ? 16 : 8; /* 16-byte rows */
    int full = level == FA_SWEEP_FULL;
    const int64_t *tokens = full ? tokens_full : tokens_quick;
    int token_count = full ? 7 : 6;
    s->seqlen_q = pick(rng, tokens, token_count);
    s->seqlen_k = fa_test_rng_uniform(rng) < 0.5 ? s->seqlen_q : pick(rng, tokens, token_count);
    s->head_dim = pick(rng, dims, 7);
    s->head_dim_v = s->head_dim;
    int64_t group = fa_test_rng_int(rng, 1, 3);
    s->heads_kv = fa_test_rng_int(rng, 1, 2);
    s->heads_q = s->heads_kv * group;
    s->batch = fa_test_rng_int(rng, 1, 3);
    s->layout = (fa_test_layout)fa_test_rng_int(rng, 0, 2);
    /* keep the float64 reference affordable: scale the batch·heads down on big problems */
    double work = (double)s->batch * (double)s->heads_q * (double)s->seqlen_q *
                  (double)s->seqlen_k * (double)s->head_dim;
    double budget = full ? 6e8 : 6e7;
    while (work > budget && (s->batch > 1 || s->heads_q > 1)) {
        if (s->batch > 1) s->batch--;
        else if (s->heads_q > s->heads_kv) s->heads_q -= s->heads_kv;
        else { s->heads_kv = 1; s->heads_q = 1; }
        work = (double)s->batch * (double)s->heads_q * (double)s->seqlen_q *
               (double)s->seqlen_k * (double)s->head_dim;
    }
    while (work > budget && s->seqlen_q > 64) {
        s->seqlen_q = s->seqlen_q / 2 + 1;
        work = (double)s->batch * (double)s->heads_q * (double)s->seqlen_q *
               (double)s->seqlen_k * (double)s->head_dim;
    }
    int32_t left = (int32_t)fa_test_rng_int(rng, 0, s->seqlen_k + 2);
    int32_t right = (int32_t)fa_test_rng_int(rng, -1, s->seqlen_k / 2 + 1);
    switch (recipe) {
    case R_CAUSAL: s->causal = 1; break;
    case R_WINDOW: s->use_window = 1; s->window_left = left; s->window_right = right; break;
    case R_CAUSAL_WINDOW: s->causal = 1; s->use_window = 1; s->window_left = left; s->window_right = -1; break;
    case R_SOFTCAP: s->softcap = fa_test_rng_uniform(rng) < 0.5 ? 1.5f : 15.0f; s->q_amplitude = 2.0; break;
    case R_ALIBI_HEAD: s->alibi = FA_TEST_ALIBI_HEAD; break;
    case R_ALIBI_BATCH_CAUSAL: s->alibi = FA_TEST_ALIBI_BATCH_HEAD; s->causal = 1; break;
    case R_SINKS: s->sinks = 1; break;
    case R_SINKS_MASKED: /* causal with sq > sk: the first sq - sk rows see only the sink */
        s->sinks = 1; s->causal = 1;
        if (s->seqlen_q <= s->seqlen_k) s->seqlen_q = s->seqlen_k + fa_test_rng_int(rng, 1, 9);
        break;
    case R_GQA_CAUSAL: s->heads_kv = 1 + (s->heads_kv > 1); s->heads_q = s->heads_kv * 4; s->causal = 1; break;
    case R_MQA_WINDOW: s->heads_kv = 1; s->heads_q = 3; s->use_window = 1; s->window_left = left; s->window_right = right; break;
    case R_VARLEN_CAUSAL: s->varlen = 1; s->batch = fa_test_rng_int(rng, 2, 5); s->causal = 1; break;
    case R_VARLEN_FEATURES:
        s->varlen = 1; s->batch = fa_test_rng_int(rng, 2, 5); s->sinks = 1; s->softcap = 4.0f;
        s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
        break;
    case R_MASKED_ROWS: /* no sink: those rows get O = 0, LSE = -inf */
        s->causal = 1;
        if (s->seqlen_q <= s->seqlen_k) s->seqlen_q = s->seqlen_k + fa_test_rng_int(rng, 1, 9);
        if (fa_test_rng_uniform(rng) < 0.5) { s->use_window = 1; s->window_left = left; }
        break;
    case R_PACKED_GQA:
        s->layout = FA_TEST_LAYOUT_PACKED_QKV; s->seqlen_k = s->seqlen_q; s->causal = 1;
        s->heads_kv = 1; s->heads_q = 2;
        if (fa_test_rng_uniform(rng) < 0.5) s->varlen = 1, s->batch = fa_test_rng_int(rng, 2, 4);
        break;
    case R_BHSD_SOFTCAP_WINDOW:
        s->layout = FA_TEST_LAYOUT_BHSD; s->softcap = 2.5f; s->use_window = 1;
        s->window_left = left; s->window_right = right;
        break;
    case R_EVERYTHING:
        s->causal = 1; s->use_window = 1; s->window_left = left; s->window_right = -1;
        s->softcap = 5.0f; s->alibi = FA_TEST_ALIBI_BATCH_HEAD; s->sinks = 1;
        s->heads_kv = 2; s->heads_q = 4; s->layout = FA_TEST_LAYOUT_PADDED;
        if (fa_test_rng_uniform(rng) < 0.5) s->varlen = 1, s->batch = fa_test_rng_int(rng, 2, 4);
        break;
    case R_SCALE_SHARP:
        s->softmax_scale = (float)(1.7 / sqrt((double)s->head_dim)); s->q_amplitude = 3.0;
        break;
    case R_SCALE_NEGATIVE: /* softmax_scale < 0 is allowed: masked scores must stay masked after it */
        s->softmax_scale = (float)(-1.0 / sqrt((double)s->head_dim));
        s->causal = 1;
        if (fa_test_rng_uniform(rng) < 0.5) s->softcap = 4.0f;
        if (fa_test_rng_uniform(rng) < 0.5) { s->use_window = 1; s->window_left = left; }
        break;
    case R_DROPOUT: /* the oracle applies the library's mask (src/api/fa_philox.h), as every engine does */
        s->dropout_p = (float)(0.05 + 0.6 * fa_test_rng_uniform(rng));
        s->dropout_seed = fa_test_rng_next(rng);
        s->dropout_offset = fa_test_rng_next(rng) >> fa_test_rng_int(rng, 1, 63);
        s->causal = fa_test_rng_uniform(rng) < 0.5;
        if (fa_test_rng_uniform(rng) < 0.5) s->sinks = 1;
        if (fa_test_rng_uniform(rng) < 0.5) s->varlen = 1, s->batch = fa_test_rng_int(rng, 2, 4);
        break;
    case R_HEAD_DIM_V: /* v and o narrower or wider than q and k */
        do s->head_dim_v = pick(rng, dims, 7); while (s->head_dim_v == s->head_dim);
        s->causal = 1; s->sinks = 1;
        break;
    case R_LARGE_HEADS: { /* head dims above 256: Gemma-class 512, MLA's 576 / 512, odd ones */
        static const int64_t large[] = {264, 320, 512, 512, 576};
        s->head_dim = pick(rng, large, 5);
        s->head_dim_v = s->head_dim == 576 ? 512 : fa_test_rng_uniform(rng) < 0.75 ? s->head_dim : 128;
        s->causal = fa_test_rng_uniform(rng) < 0.5;
        if (fa_test_rng_uniform(rng) < 0.3) { s->use_window = 1; s->window_left = left; s->window_right = right; }
        if (fa_test_rng_uniform(rng) < 0.3) s->softcap = 5.0f;
        if (fa_test_rng_uniform(rng) < 0.3) s->varlen = 1, s->batch = fa_test_rng_int(rng, 2, 4);
        while ((double)s->batch * s->heads_q * s->seqlen_q * s->seqlen_k * s->head_dim > budget && s->seqlen_q > 16)
            s->seqlen_q = s->seqlen_q / 2 + 1;
        break;
    }
    default: break;
    }
    if (s->varlen && s->batch < 2) s->batch = 2;
}

/* ---- KV-cache and merge case generation ---------------------------------------------------- */

enum kv_recipe {
    K_DECODE, K_DECODE_APPEND, K_PAGED_1, K_PAGED_3, K_PAGED_16, K_PAGED_256, K_BATCH_IDX,
    K_LEFTPAD_ALIBI, K_ROTARY_INTERLEAVED, K_ROTARY_HALF, K_SPECULATIVE_WINDOW, K_CHUNKED_PREFILL,
    K_SOFTCAP_SINKS, K_SPLITS, K_NO_SEQLENS, K_EVERYTHING, K_SEQLEN_NEW_MORE, K_SEQLEN_NEW_FEWER,
    K_ODD_DIMS, K_COUNT
};

static void draw_kv_case(fa_test_rng *rng, fa_sweep_level level, fa_device device, fa_dtype dtype,
                         int recipe, fa_kv_spec *s) {
    static const int64_t capacities_quick[] = {1, 7, 33, 113, 203, 300};
    static const int64_t capacities_full[] = {1, 7, 64, 113, 203, 1023, 2049};
    static const int64_t dims[] = {32, 59, 64, 96, 111, 128, 256};
    static const int64_t odd_dims[] = {1, 6, 33, 59, 100, 111, 130, 250};
    int full = level == FA_SWEEP_FULL;
    memset(s, 0, sizeof *s);
    s->dtype = dtype;
    s->seed = fa_test_rng_next(rng);
    s->pad_align = device == FA_DEVICE_CUDA ? 8 : 1;
    s->capacity = full ? pick(rng, capacities_full, 7) : pick(rng, capacities_quick, 6);
    s->head_dim = pick(rng, dims, 7);
    s->heads_kv = fa_test_rng_int(rng, 1, 3);
    s->heads_q = s->heads_kv * fa_test_rng_int(rng, 1, 5);
    s->batch = fa_test_rng_int(rng, 1, full ? 6 : 3);
    s->seqlen_q = 1;
    s->padded = fa_test_rng_uniform(rng) < 0.3;
    int32_t left = (int32_t)fa_test_rng_int(rng, 0, s->capacity + 2);
    switch (recipe) {
    case K_DECODE: s->causal = fa_test_rng_uniform(rng) < 0.5; break;
    case K_DECODE_APPEND: s->append = 1; s->causal = 1; break;
    case K_PAGED_1: s->page_size = 1; s->append = 1; s->causal = 1; break;
    case K_PAGED_3: s->page_size = 3; s->append = 1; s->leftpad = 1; s->seqlen_q = fa_test_rng_int(rng, 1, 4); break;
    case K_PAGED_16: s->page_size = 16; s->sinks = 1; s->causal = 1; break;
    case K_PAGED_256:
        s->page_size = 256; s->append = 1; s->causal = 1;
        s->capacity = full ? 2049 : 700;
        break;
    case K_BATCH_IDX: s->batch_idx = 1; s->append = 1; s->causal = 1; break;
    case K_LEFTPAD_ALIBI: s->leftpad = 1; s->alibi = FA_TEST_ALIBI_BATCH_HEAD; s->causal = 1; break;
    case K_ROTARY_INTERLEAVED:
        s->append = 1; s->causal = 1; s->rotary_dim = s->head_dim & ~(int64_t)1; s->rotary_interleaved = 1;
        s->leftpad = 1; s->seqlen_q = fa_test_rng_int(rng, 1, 5);
        break;
    case K_ROTARY_HALF: /* non-causal: every query at the position of the first new token */
        s->append = 1; s->rotary_dim = 2 * fa_test_rng_int(rng, 1, s->head_dim / 2); s->rotary_interleaved = 0;
        s->page_size = 16; s->seqlen_q = fa_test_rng_int(rng, 1, 5);
        break;
    case K_SPECULATIVE_WINDOW:
        s->seqlen_q = fa_test_rng_int(rng, 2, 8); s->append = 1; s->causal = 1;
        s->use_window = 1; s->window_left = left; s->window_right = -1;
        break;
    case K_CHUNKED_PREFILL:
        s->seqlen_q = fa_test_rng_int(rng, 9, full ? 130 : 70); s->append = 1; s->causal = 1;
        s->page_size = fa_test_rng_uniform(rng) < 0.5 ? 16 : 0;
        break;
    case K_SOFTCAP_SINKS: s->softcap = 3.0f; s->q_amplitude = 2.0; s->sinks = 1; s->alibi = FA_TEST_ALIBI_HEAD; break;
    case K_SPLITS:
        s->num_splits = (int)fa_test_rng_int(rng, 2, 9); s->append = 1; s->causal = 1; s->sinks = fa_test_rng_uniform(rng) < 0.5;
        s->capacity = full ? 2049 : 1023;
        break;
    case K_NO_SEQLENS: s->no_seqlens = 1; s->no_lse = 1; break;
    case K_EVERYTHING:
        s->page_size = fa_test_rng_int(rng, 1, 20); s->append = 1; s->leftpad = 1; s->causal = 1;
        s->rotary_dim = 16; s->rotary_interleaved = fa_test_rng_uniform(rng) < 0.5;
        s->use_window = 1; s->window_left = left; s->softcap = 5.0f; s->alibi = FA_TEST_ALIBI_BATCH_HEAD;
        s->sinks = 1; s->seqlen_q = fa_test_rng_int(rng, 1, 6); s->num_splits = (int)fa_test_rng_int(rng, 0, 4);
        break;
    /* k_new / v_new of another token count than q: the queries are the last seqlen_q keys */
    case K_SEQLEN_NEW_MORE:
        s->append = 1; s->causal = fa_test_rng_uniform(rng) < 0.7; s->leftpad = 1;
        s->seqlen_q = fa_test_rng_int(rng, 1, 6); s->seqlen_new = s->seqlen_q + fa_test_rng_int(rng, 1, 40);
        s->rotary_dim = s->head_dim & ~(int64_t)1; s->rotary_interleaved = fa_test_rng_uniform(rng) < 0.5;
        s->page_size = fa_test_rng_uniform(rng) < 0.5 ? fa_test_rng_int(rng, 1, 20) : 0;
        s->num_splits = (int)fa_test_rng_int(rng, 0, 4);
        break;
    case K_SEQLEN_NEW_FEWER:
        s->append = 1; s->causal = fa_test_rng_uniform(rng) < 0.7; s->leftpad = 1;
        s->seqlen_q = fa_test_rng_int(rng, 2, 40); s->seqlen_new = fa_test_rng_int(rng, 1, s->seqlen_q - 1);
        s->rotary_dim = 16; s->use_window = fa_test_rng_uniform(rng) < 0.5; s->window_left = left; s->window_right = -1;
        s->alibi = FA_TEST_ALIBI_HEAD; s->sinks = fa_test_rng_uniform(rng) < 0.5;
        s->page_size = fa_test_rng_uniform(rng) < 0.5 ? 16 : 0; s->batch_idx = s->page_size == 0;
        break;
    /* head dims that are not multiples of 8 (d != dv too), every cache feature */
    case K_ODD_DIMS:
        s->head_dim = pick(rng, odd_dims, 8);
        s->head_dim_v = fa_test_rng_uniform(rng) < 0.5 ? s->head_dim : pick(rng, odd_dims, 8);
        s->append = 1; s->causal = 1; s->leftpad = 1; s->seqlen_q = fa_test_rng_int(rng, 1, 6);
        s->seqlen_new = fa_test_rng_int(rng, 1, 8);
        s->rotary_dim = s->head_dim >= 2 ? 2 * fa_test_rng_int(rng, 1, s->head_dim / 2) : 0;
        s->rotary_interleaved = fa_test_rng_uniform(rng) < 0.5;
        s->page_size = fa_test_rng_uniform(rng) < 0.5 ? fa_test_rng_int(rng, 1, 20) : 0;
        s->batch_idx = s->page_size == 0 && fa_test_rng_uniform(rng) < 0.5;
        s->softcap = fa_test_rng_uniform(rng) < 0.3 ? 4.0f : 0.0f; s->sinks = fa_test_rng_uniform(rng) < 0.5;
        s->num_splits = (int)fa_test_rng_int(rng, 0, 4);
        break;
    default: break;
    }
    if (s->rotary_dim > s->head_dim) s->rotary_dim = s->head_dim & ~(int64_t)1;
    const int64_t appended = s->seqlen_new ? s->seqlen_new : s->seqlen_q;
    if (s->append && s->capacity < appended) s->capacity = appended + fa_test_rng_int(rng, 0, 5);
    /* keep the float64 oracle affordable */
    while ((double)s->batch * s->heads_q * s->seqlen_q * s->capacity * s->head_dim > (full ? 4e8 : 3e7) &&
           s->batch > 1)
        s->batch--;
}

static void draw_merge_case(fa_test_rng *rng, fa_sweep_level level, fa_device device, fa_dtype dtype,
                            int index, fa_merge_spec *s) {
    static const int64_t dims[] = {1, 32, 64, 96, 111, 128, 256};
    memset(s, 0, sizeof *s);
    s->parts_dtype = index % 3 == 0 ? dtype : FA_DTYPE_F32;
    s->out_dtype = dtype;
    s->num_states = fa_test_rng_int(rng, 1, 133);
    s->rows = fa_test_rng_int(rng, 0, level == FA_SWEEP_FULL ? 300 : 40);
    s->heads = fa_test_rng_int(rng, 1, 8);
    s->head_dim_v = pick(rng, dims, 7);
    s->empty_share = fa_test_rng_uniform(rng) * 0.6;
    s->no_lse = index % 4 == 1;
    s->padded = fa_test_rng_uniform(rng) < 0.4;
    s->pad_align = device == FA_DEVICE_CUDA ? 8 : 1;
    s->seed = fa_test_rng_next(rng);
}

typedef struct sweep_counts {
    int passed, failed, skipped, index;
} sweep_counts;

static void run_kv_family(const fa_sweep_options *opt, FILE *out, uint64_t seed, const fa_dtype *dtypes,
                          int dtype_count, sweep_counts *n) {
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed ^ 0x6b76636163686521ull); /* a stream of its own */
    int rounds = opt->level == FA_SWEEP_FULL ? 4 : 1;
    for (int round = 0; round < rounds; round++)
        for (int recipe = 0; recipe < K_COUNT; recipe++)
            for (int t = 0; t < dtype_count; t++, n->index++) {
                fa_kv_spec spec;
                fa_kv_case_result r;
                char shape[320], detail[640];
                draw_kv_case(&rng, opt->level, opt->device, dtypes[t], recipe, &spec);
                int rc = fa_kv_case_run(&spec, opt->device, opt->num_threads, &r);
                fa_kv_describe(rc == 0 ? &r.spec : &spec, shape, sizeof shape);
                if (rc == 0 && r.skipped) {
                    fprintf(out, "%4d  --   kv %s | SKIP (%s)\n", n->index, shape, r.skip_reason);
                    n->skipped++;
                    continue;
                }
                if (rc != 0 || r.status != FA_OK)
                    snprintf(detail, sizeof detail, " ERROR %s", r.error);
                else
                    fa_kv_format(&r.check, detail, sizeof detail);
                int ok = rc == 0 && r.ok;
                fprintf(out, "%4d  kv   %s |%s %s\n", n->index, shape, detail, ok ? "PASS" : "FAIL");
                if (ok) n->passed++;
                else n->failed++;
                fflush(out);
            }
    int merges = opt->level == FA_SWEEP_FULL ? 24 : 6;
    for (int i = 0; i < merges; i++)
        for (int t = 0; t < dtype_count; t++, n->index++) {
            fa_merge_spec spec;
            fa_merge_case_result r;
            char shape[256];
            draw_merge_case(&rng, opt->level, opt->device, dtypes[t], i, &spec);
            int rc = fa_merge_case_run(&spec, opt->device, opt->num_threads, &r);
            fa_merge_describe(&spec, shape, sizeof shape);
            if (rc == 0 && r.skipped) {
                fprintf(out, "%4d  --   %s | SKIP (%s)\n", n->index, shape, r.skip_reason);
                n->skipped++;
                continue;
            }
            int ok = rc == 0 && r.ok;
            if (rc != 0 || r.status != FA_OK)
                fprintf(out, "%4d  mrg  %s | ERROR %s FAIL\n", n->index, shape, r.error);
            else
                fprintf(out, "%4d  mrg  %s | o %.2e/%.2e lse %.2e/%.2e%s%s %s\n", n->index, shape,
                        r.check.o.err, r.check.o.tol, r.check.lse.err, r.check.lse.tol,
                        r.check.empty_violations ? " EMPTY-ROWS-WRONG" : "",
                        r.check.inputs_unchanged ? "" : " INPUTS-MODIFIED", ok ? "PASS" : "FAIL");
            if (ok) n->passed++;
            else n->failed++;
            fflush(out);
        }
}

int fa_sweep_run(const fa_sweep_options *opt, FILE *out, int *n_pass, int *n_fail) {
    int passed = 0, failed = 0, skipped = 0;
    if (n_pass) *n_pass = 0;
    if (n_fail) *n_fail = 0;
    if (!opt || !out) return 2;
    if (opt->device != FA_DEVICE_CPU && opt->device != FA_DEVICE_CUDA) {
        fprintf(out, "check: unknown device %d\n", (int)opt->device);
        return 2;
    }
    int on_device = opt->device == FA_DEVICE_CUDA;
    if (on_device) {
        char why[200];
        if (!fa_cuda_available()) {
            fprintf(out, "check: CUDA not available (%s)\n",
                    "this libflashattn has no CUDA support or no GPU is present");
            return 2;
        }
        if (!sweep_cudart_load(why, sizeof why)) {
            fprintf(out, "check: CUDA not available: %s\n", why);
            return 2;
        }
    }
    fa_dtype dtypes[4]; /* fp8 inputs too (not the KV-cache family) */
    int dtype_count = 0;
    for (int t = on_device ? FA_DTYPE_F16 : FA_DTYPE_F32; t <= FA_DTYPE_FP8_E4M3; t++)
        if (opt->dtype_filter < 0 || opt->dtype_filter == t) dtypes[dtype_count++] = (fa_dtype)t;
    if (dtype_count == 0) {
        fprintf(out, "check: dtype %d is not supported on %s\n", opt->dtype_filter,
                on_device ? "cuda" : "cpu");
        return 2;
    }
    uint64_t seed = opt->seed ? opt->seed : fa_test_fresh_seed();
    int rounds = opt->level == FA_SWEEP_FULL ? 6 : 1;
    fprintf(out, "check: device %s (isa %s), level %s, seed %llu, %d threads%s\n",
            on_device ? "cuda" : "cpu", fa_cpu_isa(), opt->level == FA_SWEEP_FULL ? "full" : "quick",
            (unsigned long long)seed, opt->num_threads,
            opt->num_threads == 0 ? " (all cores)" : "");
    fprintf(out, "check: pass iff max|ours - ref64| <= 2*max|baseline - ref64| + floor per tensor "
                 "(shown as err/tol)\n");
    fflush(out);
    fa_test_rng rng;
    fa_test_rng_seed(&rng, seed);
    double start = seconds_now();
    int index = 0;
    if (opt->only == FA_SWEEP_KVCACHE) rounds = 0;
    for (int round = 0; round < rounds; round++)
        for (int recipe = 0; recipe < R_COUNT; recipe++)
            for (int t = 0; t < dtype_count; t++, index++) {
                fa_test_spec spec;
                draw_case(&rng, opt->level, opt->device, dtypes[t], recipe, &spec);
                fa_case_result r;
                char shape[256], detail[640];
                int rc = fa_case_run(&spec, opt->device, opt->num_threads, &r);
                fa_case_describe(rc == 0 ? &r.spec : &spec, shape, sizeof shape);
                if (rc != 0) {
                    fprintf(out, "%4d  ---  %s | ERROR %s FAIL\n", index, shape, r.error);
                    failed++;
                    continue;
                }
                if (r.skipped) {
                    fprintf(out, "%4d  --   %s | SKIP (%s)\n", index, shape, r.skip_reason);
                    skipped++;
                    continue;
                }
                for (int bwd = 0; bwd < 2; bwd++) {
                    if (bwd && !r.ran_backward) {
                        if (r.fwd_status != FA_OK) { /* the forward error already failed it */
                            fprintf(out, "%4d  bwd  %s | not run: forward failed FAIL\n", index, shape);
                            failed++;
                        }
                        continue;
                    }
                    int ok = bwd ? r.bwd_ok : r.fwd_ok;
                    fa_status status = bwd ? r.bwd_status : r.fwd_status;
                    if (status != FA_OK)
                        snprintf(detail, sizeof detail, " %s", r.error);
                    else
                        fa_case_format(&r, bwd, opt->verbose, detail, sizeof detail);
                    fprintf(out, "%4d  %s  %s |%s %s\n", index, bwd ? "bwd" : "fwd", shape, detail,
                            ok ? "PASS" : "FAIL");
                    if (ok) passed++;
                    else failed++;
                }
                fflush(out);
            }
    if (opt->only != FA_SWEEP_ATTENTION) {
        sweep_counts counts = {passed, failed, skipped, index};
        const int kv_dtypes = dtype_count - (dtypes[dtype_count - 1] == FA_DTYPE_FP8_E4M3);
        run_kv_family(opt, out, seed, dtypes, kv_dtypes, &counts);
        passed = counts.passed;
        failed = counts.failed;
        skipped = counts.skipped;
    }
    fprintf(out, "check: %d passed, %d failed, %d skipped in %.1f s (seed %llu; rerun with that seed to reproduce)\n",
            passed, failed, skipped, seconds_now() - start, (unsigned long long)seed);
    if (n_pass) *n_pass = passed;
    if (n_fail) *n_fail = failed;
    return failed ? 1 : 0;
}
