/* Scratch stub of the CPU engine so the CLI can be exercised before src/cpu lands. Naive. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "fa_internal.h"
#include "../../tests/reference.h"

typedef struct job { const fa_problem *pb; int64_t first, last; int standard, backward; } job;

static float ld(const void *base, fa_dtype dt, int64_t i) { return (float)fa_test_load(base, dt, i); }

static void do_head(const fa_problem *pb, int64_t b, int64_t h, float *buf, int standard, int backward) {
    const fa_params *p = &pb->p;
    int64_t sq = p->seqlen_q, sk = p->seqlen_k, d = p->head_dim, dv = p->head_dim_v, hk = h / pb->group;
    float *s = buf;
    for (int64_t i = 0; i < sq; i++) {
        float *row = standard ? s + i * sk : s;
        int64_t lo, hi; fa_key_range(i, sq, sk, p->window_left, p->window_right, &lo, &hi);
        float mx = -INFINITY;
        for (int64_t j = lo; j < hi; j++) {
            float acc = 0;
            for (int64_t c = 0; c < d; c++)
                acc += ld(p->q, p->dtype, b*p->q_batch_stride+i*p->q_row_stride+h*p->q_head_stride+c) *
                       ld(p->k, p->dtype, b*p->k_batch_stride+j*p->k_row_stride+hk*p->k_head_stride+c);
            row[j] = acc * p->softmax_scale; if (row[j] > mx) mx = row[j];
        }
        float sum = 0; for (int64_t j = lo; j < hi; j++) { row[j] = expf(row[j]-mx); sum += row[j]; }
        if (!backward) {
            for (int64_t c = 0; c < dv; c++) {
                float acc = 0;
                for (int64_t j = lo; j < hi; j++) acc += row[j] * ld(p->v, p->dtype, b*p->v_batch_stride+j*p->v_row_stride+hk*p->v_head_stride+c);
                fa_test_store(p->o, p->dtype, b*p->o_batch_stride+i*p->o_row_stride+h*p->o_head_stride+c, hi > lo ? acc/sum : 0);
            }
            if (p->lse) p->lse[(b*p->heads_q+h)*sq+i] = hi > lo ? mx + logf(sum) : -INFINITY;
        } else {
            /* dq only: dP_j = dO·v_j, D = sum P dP, dS = P(dP - D), dq = scale sum dS k */
            float D = 0; float *dp = malloc(sizeof(float) * (size_t)sk);
            for (int64_t j = lo; j < hi; j++) { float acc = 0; for (int64_t c = 0; c < dv; c++) acc += ld(p->dout,p->dtype,b*p->do_batch_stride+i*p->do_row_stride+h*p->do_head_stride+c)*ld(p->v,p->dtype,b*p->v_batch_stride+j*p->v_row_stride+hk*p->v_head_stride+c); dp[j]=acc; row[j]/=sum; D += row[j]*acc; }
            for (int64_t c = 0; c < d; c++) { float acc = 0; for (int64_t j = lo; j < hi; j++) acc += row[j]*(dp[j]-D)*ld(p->k,p->dtype,b*p->k_batch_stride+j*p->k_row_stride+hk*p->k_head_stride+c);
                fa_test_store(p->dq, p->dtype, b*p->dq_batch_stride+i*p->dq_row_stride+h*p->dq_head_stride+c, acc*p->softmax_scale); }
            free(dp);
        }
    }
}

static void *worker(void *arg) {
    job *jb = arg; const fa_problem *pb = jb->pb;
    size_t n = jb->standard ? (size_t)(pb->p.seqlen_q * pb->p.seqlen_k) : (size_t)pb->p.seqlen_k;
    float *buf = calloc(n + 1, sizeof(float));
    for (int64_t w = jb->first; w < jb->last; w++) do_head(pb, w / pb->p.heads_q, w % pb->p.heads_q, buf, jb->standard, jb->backward);
    free(buf); return NULL;
}

static fa_status run(const fa_problem *pb, int standard, int backward) {
    int nt = pb->p.num_threads ? pb->p.num_threads : 2; if (nt > 64) nt = 64;
    int64_t work = pb->p.batch * pb->p.heads_q; pthread_t t[64]; job j[64];
    for (int i = 0; i < nt; i++) { j[i] = (job){pb, work*i/nt, work*(i+1)/nt, standard, backward}; pthread_create(&t[i], NULL, worker, &j[i]); }
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    return FA_OK;
}
fa_status fa_cpu_forward(const fa_problem *pb) { return run(pb, 0, 0); }
fa_status fa_cpu_backward(const fa_problem *pb) { return run(pb, 0, 1); }
fa_status fa_cpu_standard_forward(const fa_problem *pb) { return run(pb, 1, 0); }
size_t fa_cpu_forward_workspace(const fa_problem *pb) { return 0; }
size_t fa_cpu_backward_workspace(const fa_problem *pb) { return 0; }
const char *fa_cpu_isa_name(void) { return "stub"; }
