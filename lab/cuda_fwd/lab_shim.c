/*
 * lab_shim.c: a stand-alone entry to the CUDA forward for lab/cuda_fwd experiments, so they do
 * not depend on the rest of the library being buildable. lab_forward() resolves defaults the way
 * src/fa_api.c does (documented in src/fa_internal.h) and calls fa_cuda_check_forward +
 * fa_cuda_forward. Built with src/cuda/fa_cuda.cu and fwd_hdim*.cu into liblabfwd.so by
 * build_lab.sh. Not part of the library.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fa_internal.h"

#define LAB_API __attribute__((visibility("default")))

static _Thread_local char lab_message[512];

fa_status fa_set_error(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lab_message, sizeof lab_message, fmt, ap);
    va_end(ap);
    return status;
}

LAB_API const char *lab_last_error(void) { return lab_message; }

LAB_API int lab_forward(const fa_params *in) {
    fa_problem pb;
    memset(&pb, 0, sizeof pb);
    pb.p = *in;
    fa_params *p = &pb.p;
    if (p->head_dim_v == 0) p->head_dim_v = p->head_dim;
    if (p->softmax_scale == 0.0f) p->softmax_scale = (float)(1.0 / sqrt((double)p->head_dim));
    pb.scale_log2 = p->softmax_scale * 1.4426950408889634f;
    if (!p->use_window) p->window_left = p->window_right = -1;
    if (p->window_left < 0) p->window_left = -1;
    if (p->window_right < 0) p->window_right = -1;
    if (p->causal && (p->window_right < 0 || p->window_right > 0)) p->window_right = 0;
    pb.has_mask = p->window_left >= 0 || p->window_right >= 0;
    pb.group = p->heads_q / p->heads_kv;
    pb.varlen = p->cu_seqlens_q != NULL;
    if (!pb.varlen) {
        p->total_q = p->batch * p->seqlen_q;
        p->total_k = p->batch * p->seqlen_k;
    }
    size_t ws = 0;
    fa_status s = fa_cuda_check_forward(&pb, &ws);
    if (s != FA_OK) return (int)s;
    return (int)fa_cuda_forward(&pb);
}
