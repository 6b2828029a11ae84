/*
 * san_kv.c: a few small fa_kvcache_forward calls and one fa_merge_states call on the GPU, for
 * compute-sanitizer (memcheck, racecheck, synccheck, initcheck), no torch. Covers contiguous and
 * paged caches (page sizes 1, 3, 16, 64), cache_batch_idx, cache_leftpad, append with and without
 * rotary (both layouts), sq 1 and 5, GQA 4 / MQA, d 64 / 128 / 256 and d != dv, forced splits, the
 * heuristic, lse on/off, sinks / ALiBi / softcap / window, and a merge with empty states.
 * Exits non-zero if a call fails or an output that must be finite is not.
 *
 * Build (repository root): cc -std=c11 -O2 -Iinclude -I/usr/local/cuda/include lab/decode_cuda/san_kv.c \
 *     build/libflashattn.a -L/usr/local/cuda/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o build/san_kv
 * Run:   compute-sanitizer --tool memcheck --error-exitcode 3 build/san_kv
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

static unsigned short to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(unsigned short h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void *dev_bf16(size_t n, float offset) {
    unsigned short *h = malloc(2 * n + 2);
    for (size_t i = 0; i < n; ++i) h[i] = to_bf16((float)rand() / RAND_MAX - 0.5f + offset);
    void *d = NULL;
    if (cudaMalloc(&d, 2 * n + 16) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(2);
    }
    cudaMemcpy(d, h, 2 * n, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes + 16) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(2);
    }
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

typedef struct kv_case {
    const char *name;
    int b, sq, hq, hkv, d, dv, cap;
    int page_size;   /* 0: contiguous                                                  */
    int batch_idx, leftpad, append, rotary; /* rotary: 0 off, 1 interleaved, 2 half       */
    int causal, wl, wr;
    float softcap;
    int alibi, sink, splits, lse;
} kv_case;

static int run_kv(const kv_case *c) {
    const int b = c->b, sq = c->sq, hq = c->hq, hkv = c->hkv, d = c->d, dv = c->dv, cap = c->cap;
    const int n_new = c->append ? sq : 0;
    int lens[8], pads[8], rows[8];
    for (int i = 0; i < b; ++i) {
        lens[i] = i == 0 ? cap - n_new : (i == 1 ? 0 : (cap - n_new) / (i + 1));
        pads[i] = c->leftpad ? lens[i] / 3 : 0;
        rows[i] = c->batch_idx ? b - 1 - i + 1 : i; /* cache rows 1..b in reverse */
    }
    const int cache_batch = c->batch_idx ? b + 1 : b;
    const int pages_per_seq = c->page_size ? (cap + c->page_size - 1) / c->page_size : 0;
    const int num_pages = b * pages_per_seq + 2;
    const size_t slabs = c->page_size ? (size_t)num_pages : (size_t)cache_batch;
    const size_t slab_rows = c->page_size ? (size_t)c->page_size : (size_t)cap;
    void *q = dev_bf16((size_t)b * sq * hq * d, 0.0f);
    void *k = dev_bf16(slabs * slab_rows * hkv * d, 0.0f);
    void *v = dev_bf16(slabs * slab_rows * hkv * dv, 0.5f);
    void *kn = c->append ? dev_bf16((size_t)b * sq * hkv * d, 0.0f) : NULL;
    void *vn = c->append ? dev_bf16((size_t)b * sq * hkv * dv, 0.5f) : NULL;
    void *cs = c->rotary ? dev_bf16((size_t)cap * d / 2, 0.3f) : NULL;
    void *sn = c->rotary ? dev_bf16((size_t)cap * d / 2, 0.0f) : NULL;
    void *o = NULL;
    float *lse = NULL;
    cudaMalloc(&o, (size_t)b * sq * hq * dv * 2);
    cudaMemset(o, 0xff, (size_t)b * sq * hq * dv * 2); /* NaN poison */
    if (c->lse) {
        cudaMalloc((void **)&lse, (size_t)b * hq * sq * 4);
        cudaMemset(lse, 0xff, (size_t)b * hq * sq * 4);
    }
    int32_t *table = NULL;
    if (c->page_size) {
        int32_t *h = malloc(sizeof(int32_t) * (size_t)b * pages_per_seq);
        for (int i = 0; i < b * pages_per_seq; ++i) h[i] = num_pages - 1 - i; /* distinct pages, reversed */
        table = dev_copy(h, sizeof(int32_t) * (size_t)b * pages_per_seq);
        free(h);
    }
    int32_t *d_lens = dev_copy(lens, sizeof(int32_t) * b);
    int32_t *d_pads = dev_copy(pads, sizeof(int32_t) * b);
    int32_t *d_rows = dev_copy(rows, sizeof(int32_t) * b);
    float slopes[64], sinks[64];
    for (int h = 0; h < hq; ++h) {
        slopes[h] = 0.05f * (float)(h + 1);
        sinks[h] = 0.5f * (float)h - 1.0f;
    }
    float *d_slopes = dev_copy(slopes, sizeof(float) * hq);
    float *d_sinks = dev_copy(sinks, sizeof(float) * hq);

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = b;
    p.seqlen_q = sq;
    p.seqlen_k = cap;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.q_head_stride = d;
    p.q_row_stride = (int64_t)hq * d;
    p.q_batch_stride = (int64_t)sq * hq * d;
    p.o_head_stride = dv;
    p.o_row_stride = (int64_t)hq * dv;
    p.o_batch_stride = (int64_t)sq * hq * dv;
    p.k_head_stride = d;
    p.k_row_stride = (int64_t)hkv * d;
    p.k_batch_stride = (int64_t)slab_rows * hkv * d;
    p.v_head_stride = dv;
    p.v_row_stride = (int64_t)hkv * dv;
    p.v_batch_stride = (int64_t)slab_rows * hkv * dv;
    p.cache_seqlens = d_lens;
    p.cache_leftpad = c->leftpad ? d_pads : NULL;
    if (c->page_size) {
        p.block_table = table;
        p.block_table_batch_stride = pages_per_seq;
        p.page_size = c->page_size;
        p.num_pages = num_pages;
    } else {
        p.cache_batch = cache_batch;
        p.cache_batch_idx = c->batch_idx ? d_rows : NULL;
    }
    if (c->append) {
        p.k_new = kn;
        p.v_new = vn;
        p.knew_head_stride = d;
        p.knew_row_stride = (int64_t)hkv * d;
        p.knew_batch_stride = (int64_t)sq * hkv * d;
        p.vnew_head_stride = dv;
        p.vnew_row_stride = (int64_t)hkv * dv;
        p.vnew_batch_stride = (int64_t)sq * hkv * dv;
    }
    if (c->rotary) {
        p.rotary_cos = cs;
        p.rotary_sin = sn;
        p.rotary_dim = d;
        p.rotary_seqlen = cap;
        p.rotary_interleaved = c->rotary == 1;
    }
    p.causal = c->causal;
    p.use_window = c->wl >= 0 || c->wr >= 0;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.softcap = c->softcap;
    p.alibi_slopes = c->alibi ? d_slopes : NULL;
    p.sink_logits = c->sink ? d_sinks : NULL;
    p.num_splits = c->splits;

    int bad = 0;
    fa_status s = fa_kvcache_forward(&p);
    if (s != FA_OK) {
        printf("FAIL %s: %s: %s\n", c->name, fa_strerror(s), fa_last_error());
        bad = 1;
    } else if (cudaDeviceSynchronize() != cudaSuccess) {
        printf("FAIL %s: %s\n", c->name, cudaGetErrorString(cudaGetLastError()));
        bad = 1;
    } else {
        size_t no = (size_t)b * sq * hq * dv;
        unsigned short *h = malloc(2 * no);
        cudaMemcpy(h, o, 2 * no, cudaMemcpyDeviceToHost);
        size_t nonfinite = 0;
        for (size_t i = 0; i < no; ++i) nonfinite += !isfinite(from_bf16(h[i]));
        free(h);
        size_t lse_nan = 0;
        if (lse) {
            float *hl = malloc(4 * (size_t)b * hq * sq);
            cudaMemcpy(hl, lse, 4 * (size_t)b * hq * sq, cudaMemcpyDeviceToHost);
            for (size_t i = 0; i < (size_t)b * hq * sq; ++i) lse_nan += isnan(hl[i]);
            free(hl);
        }
        bad = nonfinite != 0 || lse_nan != 0;
        printf("%s %s (o non-finite %zu, lse NaN %zu)\n", bad ? "FAIL" : "ok  ", c->name, nonfinite, lse_nan);
    }
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(kn);
    cudaFree(vn);
    cudaFree(cs);
    cudaFree(sn);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(table);
    cudaFree(d_lens);
    cudaFree(d_pads);
    cudaFree(d_rows);
    cudaFree(d_slopes);
    cudaFree(d_sinks);
    return bad;
}

static int run_merge(int states, int rows, int heads, int dv) {
    size_t np = (size_t)states * rows * heads * dv, nl = (size_t)states * heads * rows;
    float *hp = malloc(4 * np), *hl = malloc(4 * nl);
    for (size_t i = 0; i < np; ++i) hp[i] = (float)rand() / RAND_MAX;
    for (size_t i = 0; i < nl; ++i) hl[i] = (i % 3 == 0) ? -INFINITY : (float)rand() / RAND_MAX * 4.0f - 2.0f;
    for (int s = 0; s < states; ++s) /* head 0, row 0: every state empty */
        hl[(size_t)s * heads * rows] = -INFINITY;
    float *parts = dev_copy(hp, 4 * np), *lse_parts = dev_copy(hl, 4 * nl);
    void *o = NULL;
    float *lse = NULL;
    cudaMalloc(&o, 2 * (size_t)rows * heads * dv);
    cudaMalloc((void **)&lse, 4 * (size_t)rows * heads);
    fa_merge_params m;
    memset(&m, 0, sizeof m);
    m.device = FA_DEVICE_CUDA;
    m.parts_dtype = FA_DTYPE_F32;
    m.out_dtype = FA_DTYPE_BF16;
    m.num_states = states;
    m.rows = rows;
    m.heads = heads;
    m.head_dim_v = dv;
    m.o_parts = parts;
    m.o_parts_state_stride = (int64_t)rows * heads * dv;
    m.o_parts_row_stride = (int64_t)heads * dv;
    m.o_parts_head_stride = dv;
    m.lse_parts = lse_parts;
    m.lse_parts_state_stride = (int64_t)heads * rows;
    m.lse_parts_head_stride = rows;
    m.lse_parts_row_stride = 1;
    m.o = o;
    m.o_row_stride = (int64_t)heads * dv;
    m.o_head_stride = dv;
    m.lse = lse;
    m.lse_head_stride = rows;
    m.lse_row_stride = 1;
    fa_status s = fa_merge_states(&m);
    int bad = s != FA_OK || cudaDeviceSynchronize() != cudaSuccess;
    printf("%s merge S=%d rows=%d heads=%d dv=%d%s%s\n", bad ? "FAIL" : "ok  ", states, rows, heads, dv,
           s != FA_OK ? ": " : "", s != FA_OK ? fa_last_error() : "");
    cudaFree(parts);
    cudaFree(lse_parts);
    cudaFree(o);
    cudaFree(lse);
    free(hp);
    free(hl);
    return bad;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    if (!fa_cuda_available()) {
        printf("no CUDA device / library built without CUDA\n");
        return 2;
    }
    /* name, b, sq, hq, hkv, d, dv, cap, page, bidx, lpad, append, rotary, causal, wl, wr, softcap,
     * alibi, sink, splits, lse */
    static const kv_case cases[] = {
        {"contig gqa4 d128 1 split", 3, 1, 8, 2, 128, 128, 200, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, 0, 1, 1},
        {"contig gqa4 d128 heuristic", 2, 1, 8, 2, 128, 128, 700, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, 0, 0, 1},
        {"contig batch_idx leftpad splits 3", 3, 1, 8, 2, 128, 128, 300, 0, 1, 1, 0, 0, 0, -1, -1, 0, 0, 1, 3, 1},
        {"paged 1 append rotary-i splits 4", 2, 1, 8, 2, 128, 128, 150, 1, 0, 0, 1, 1, 1, -1, -1, 0, 0, 0, 4, 1},
        {"paged 3 append rotary-h sq 5 causal", 3, 5, 8, 2, 64, 64, 130, 3, 0, 1, 1, 2, 1, -1, -1, 0, 1, 0, 2, 1},
        {"paged 16 leftpad window softcap", 3, 2, 16, 2, 128, 128, 500, 16, 0, 1, 0, 0, 0, 40, 0, 5.0f, 0, 1, 0, 1},
        {"paged 64 append sq 5 mqa 2 row tiles", 2, 5, 8, 1, 128, 64, 260, 64, 0, 0, 1, 0, 1, -1, -1, 0, 0, 1, 3, 0},
        {"contig d256 append rotary-i", 2, 3, 4, 2, 256, 256, 140, 0, 0, 0, 1, 1, 1, -1, -1, 0, 1, 1, 2, 1},
        {"contig d64 dv128 mha", 2, 1, 4, 4, 64, 128, 90, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, 0, 5, 1},
        {"contig one empty cache, sink", 2, 1, 8, 2, 128, 128, 64, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, 1, 2, 1},
        {"paged 16 mqa 16 rows splits 40 (merge batches)", 1, 1, 16, 1, 128, 128, 3000, 16, 0, 0, 0, 0, 0, -1, -1, 0,
         0, 1, 40, 1},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) bad |= run_kv(&cases[i]);
    bad |= run_merge(33, 5, 3, 128);
    bad |= run_merge(2, 1, 1, 40);
    printf("%s\n", bad ? "san_kv: FAILED" : "san_kv: all calls ok");
    return bad;
}
