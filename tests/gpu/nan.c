/*
 * nan.c: `fa_gpu_tests nan`: a NaN in the inputs propagates through every CUDA kernel as on the
 * CPU (tests/test_nan.c) and is never turned into a masked row. bf16, contiguous, causal, with
 * and without sinks:
 *   forward (the default kernel, the portable one, packed GQA): a NaN in a q row makes that row's
 *     O and LSE NaN; a NaN in key j of a kv head makes NaN exactly the rows of its query heads
 *     that see j (sq = sk: rows i >= j); every other row is bit-identical to the clean run, and
 *     rows with no visible key (sq > sk) stay O = 0, LSE = -inf.
 *   backward: the NaN q row's dq is NaN, the other sequence's dq / dk / dv stay finite.
 *   KV cache (one split and four): a NaN in one new token's q makes exactly that row NaN.
 *   fa_merge_states: a state with LSE NaN makes the merged row NaN, also when every other state
 *     is empty.
 * Part of `make gpu-test` (tests/gpu_test.sh). Exit status 0 = every check held.
 */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"

static int failures;

#define EXPECT(cond, ...) GPU_EXPECT(failures, "nan", cond, __VA_ARGS__)

#define CUDA_OK(call) GPU_CUDA_OK("nan", call)

static const unsigned short BF16_NAN = 0x7fc0;

static float bf16_to_float(unsigned short x) {
    unsigned int u = (unsigned int)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static unsigned int rng_state = 2463534242u;
static unsigned short random_bf16(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    float f = (float)(rng_state >> 8) / 16777216.0f * 4.0f - 2.0f;
    unsigned int u;
    memcpy(&u, &f, 4);
    return (unsigned short)(u >> 16);
}

static void *device_copy(const void *host, size_t bytes) {
    void *d;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static int row_all_nan(const unsigned short *o, size_t n) {
    for (size_t c = 0; c < n; c++)
        if (!isnan(bf16_to_float(o[c]))) return 0;
    return 1;
}

typedef struct fwd_case {
    const char *name;
    int sq, sk, d, sinks;
    const char *kernel; /* FA_CUDA_FORWARD value or NULL */
    int pack;           /* FA_CUDA_PACK_GQA=1 */
} fwd_case;

/* One forward case with a NaN in q (where = 0) or k (where = 1). */
static void forward_case(const fwd_case *c, int where) {
    enum { B = 2, HQ = 4, HKV = 2 };
    const int sq = c->sq, sk = c->sk, d = c->d;
    const size_t nq = (size_t)B * sq * HQ * d, nk = (size_t)B * sk * HKV * d, nl = (size_t)B * HQ * sq;
    unsigned short *q = malloc(2 * nq), *k = malloc(2 * nk), *v = malloc(2 * nk);
    unsigned short *o_clean = malloc(2 * nq), *o_nan = malloc(2 * nq);
    float *l_clean = malloc(4 * nl), *l_nan = malloc(4 * nl), sinks[HQ] = {-1.0f, 0.5f, 2.0f, -3.0f};
    for (size_t i = 0; i < nq; i++) q[i] = random_bf16();
    for (size_t i = 0; i < nk; i++) k[i] = random_bf16(), v[i] = random_bf16();
    void *dq = device_copy(q, 2 * nq), *dk = device_copy(k, 2 * nk), *dv = device_copy(v, 2 * nk);
    void *dsinks = device_copy(sinks, sizeof sinks), *dout, *dlse;
    CUDA_OK(cudaMalloc(&dout, 2 * nq));
    CUDA_OK(cudaMalloc(&dlse, 4 * nl));
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = B, p.seqlen_q = sq, p.seqlen_k = sk, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = d;
    p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = (float *)dlse;
    p.causal = 1;
    p.sink_logits = c->sinks ? (const float *)dsinks : NULL;
    fa_set_contiguous_strides(&p);
    if (c->kernel) setenv("FA_CUDA_FORWARD", c->kernel, 1);
    if (c->pack) setenv("FA_CUDA_PACK_GQA", "1", 1);
    /* the NaN: q (b 1, row sq - 1, head 3), or k (b 1, key 2, kv head 1) */
    const int b0 = 1, head_kv0 = 1, row_q = sq - 1, head_q = 3, key0 = 2;
    for (int run = 0; run < 2; run++) {
        if (run == 1) {
            size_t at = where == 0 ? (((size_t)b0 * sq + row_q) * HQ + head_q) * d + 1
                                   : (((size_t)b0 * sk + key0) * HKV + head_kv0) * d + 1;
            CUDA_OK(cudaMemcpy((unsigned short *)(where == 0 ? dq : dk) + at, &BF16_NAN, 2, cudaMemcpyHostToDevice));
        }
        CUDA_OK(cudaMemset(dout, 0x7f, 2 * nq));
        CUDA_OK(cudaMemset(dlse, 0x7f, 4 * nl));
        fa_status s = fa_forward(&p);
        EXPECT(s == FA_OK, "%s: fa_forward: %s", c->name, fa_last_error());
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(run ? o_nan : o_clean, dout, 2 * nq, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(run ? l_nan : l_clean, dlse, 4 * nl, cudaMemcpyDeviceToHost));
    }
    unsetenv("FA_CUDA_FORWARD");
    unsetenv("FA_CUDA_PACK_GQA");
    int nan_rows = 0, wrong = 0, masked_wrong = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int i = 0; i < sq; i++) {
                const int diag = i + sk - sq;
                const int expect_nan =
                    b == b0 && (where == 0 ? h == head_q && i == row_q : h / 2 == head_kv0 && key0 <= diag);
                const size_t o_at = (((size_t)b * sq + i) * HQ + h) * d, l_at = ((size_t)b * HQ + h) * sq + i;
                if (expect_nan) {
                    nan_rows++;
                    wrong += !(row_all_nan(o_nan + o_at, d) && isnan(l_nan[l_at]));
                } else {
                    wrong += memcmp(o_nan + o_at, o_clean + o_at, 2 * (size_t)d) != 0 ||
                             memcmp(&l_nan[l_at], &l_clean[l_at], 4) != 0;
                }
                if (diag < 0 && !c->sinks) {
                    int zero = 1;
                    for (int e = 0; e < d; e++) zero &= bf16_to_float(o_nan[o_at + e]) == 0.0f;
                    masked_wrong += !zero || l_nan[l_at] != -INFINITY;
                }
            }
    EXPECT(nan_rows > 0 && wrong == 0, "%s, NaN in %s: %d rows wrong of %d NaN rows expected", c->name,
           where ? "k" : "q", wrong, nan_rows);
    EXPECT(masked_wrong == 0, "%s: %d rows without keys are not O = 0, LSE = -inf", c->name, masked_wrong);
    printf("%s %s, NaN in %s: %d NaN rows, %d wrong\n", wrong || masked_wrong ? "FAIL" : "ok  ", c->name,
           where ? "k" : "q", nan_rows, wrong + masked_wrong);

    /* backward of the NaN-q run (forward outputs as they are) */
    if (where == 0 && !c->pack) {
        void *ddo = device_copy(q, 2 * nq), *ddq, *ddk, *ddv;
        CUDA_OK(cudaMalloc(&ddq, 2 * nq));
        CUDA_OK(cudaMalloc(&ddk, 2 * nk));
        CUDA_OK(cudaMalloc(&ddv, 2 * nk));
        fa_params g = p;
        g.dout = ddo, g.dq = ddq, g.dk = ddk, g.dv = ddv;
        fa_set_contiguous_strides(&g);
        fa_status s = fa_backward(&g);
        EXPECT(s == FA_OK, "%s: fa_backward: %s", c->name, fa_last_error());
        CUDA_OK(cudaDeviceSynchronize());
        unsigned short *hq_ = malloc(2 * nq), *hk_ = malloc(2 * nk), *hv_ = malloc(2 * nk);
        CUDA_OK(cudaMemcpy(hq_, ddq, 2 * nq, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(hk_, ddk, 2 * nk, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(hv_, ddv, 2 * nk, cudaMemcpyDeviceToHost));
        EXPECT(row_all_nan(hq_ + (((size_t)b0 * sq + row_q) * HQ + head_q) * d, d), "%s: dq of the NaN row", c->name);
        int other = 0; /* batch 0 holds no NaN */
        for (size_t e = 0; e < nq / B; e++) other += isnan(bf16_to_float(hq_[e]));
        for (size_t e = 0; e < nk / B; e++) other += isnan(bf16_to_float(hk_[e])) + isnan(bf16_to_float(hv_[e]));
        EXPECT(other == 0, "%s: backward: %d NaN elements in the other sequence", c->name, other);
        free(hq_), free(hk_), free(hv_);
        cudaFree(ddo), cudaFree(ddq), cudaFree(ddk), cudaFree(ddv);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dsinks);
    free(q), free(k), free(v), free(o_clean), free(o_nan), free(l_clean), free(l_nan);
}

static void kvcache_case(int d, int splits) {
    enum { B = 2, SQ = 2, HQ = 8, HKV = 2, CAP = 700 };
    const size_t nq = (size_t)B * SQ * HQ * d, nc = (size_t)B * CAP * HKV * d, nl = (size_t)B * HQ * SQ;
    unsigned short *q = malloc(2 * nq), *cache = malloc(2 * nc), *o = malloc(2 * nq);
    float *lse = malloc(4 * nl);
    for (size_t i = 0; i < nq; i++) q[i] = random_bf16();
    for (size_t i = 0; i < nc; i++) cache[i] = random_bf16();
    const size_t bad = (((size_t)1 * SQ + 1) * HQ + 5) * d + 2; /* b 1, token 1, head 5 */
    q[bad] = BF16_NAN;
    void *dq = device_copy(q, 2 * nq), *dk = device_copy(cache, 2 * nc), *dv = device_copy(cache, 2 * nc), *dout, *dlse;
    CUDA_OK(cudaMalloc(&dout, 2 * nq));
    CUDA_OK(cudaMalloc(&dlse, 4 * nl));
    CUDA_OK(cudaMemset(dout, 0x7f, 2 * nq));
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CUDA;
    p.dtype = FA_DTYPE_BF16;
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = CAP, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = d;
    p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = (float *)dlse;
    p.causal = 1;
    p.num_splits = splits;
    fa_set_contiguous_strides(&p);
    fa_status s = fa_kvcache_forward(&p);
    EXPECT(s == FA_OK, "kvcache d %d splits %d: %s", d, splits, fa_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(o, dout, 2 * nq, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lse, dlse, 4 * nl, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < HQ; h++) {
                const size_t at = (((size_t)b * SQ + i) * HQ + h) * d;
                const float l = lse[((size_t)b * HQ + h) * SQ + i];
                const int expect = b == 1 && i == 1 && h == 5;
                int any = isnan(l);
                for (int e = 0; e < d; e++) any |= isnan(bf16_to_float(o[at + e]));
                wrong += expect ? !(row_all_nan(o + at, d) && isnan(l)) : any;
            }
    EXPECT(wrong == 0, "kvcache d %d splits %d: %d rows wrong", d, splits, wrong);
    printf("%s kvcache d %d splits %d: %d rows wrong\n", wrong ? "FAIL" : "ok  ", d, splits, wrong);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse);
    free(q), free(cache), free(o), free(lse);
}

static void merge_case(void) {
    enum { S = 3, R = 4, H = 2, D = 64 };
    unsigned short parts[S * R * H * D], out[R * H * D];
    float lse_parts[S * H * R], lse[H * R];
    for (int i = 0; i < S * R * H * D; i++) parts[i] = random_bf16();
    for (int i = 0; i < S * H * R; i++) lse_parts[i] = (float)(i % 5) - 2.0f;
    lse_parts[(1 * H + 0) * R + 2] = NAN;      /* state 1, head 0, row 2: NaN among finite states */
    for (int s = 0; s < S; s++) lse_parts[(s * H + 1) * R + 3] = s == 2 ? NAN : -INFINITY; /* NaN among empty */
    void *dparts = device_copy(parts, sizeof parts), *dlp = device_copy(lse_parts, sizeof lse_parts), *dout, *dlse;
    CUDA_OK(cudaMalloc(&dout, sizeof out));
    CUDA_OK(cudaMalloc(&dlse, sizeof lse));
    fa_merge_params m;
    memset(&m, 0, sizeof m);
    m.device = FA_DEVICE_CUDA;
    m.parts_dtype = m.out_dtype = FA_DTYPE_BF16;
    m.num_states = S, m.rows = R, m.heads = H, m.head_dim_v = D;
    m.o_parts = dparts, m.o_parts_state_stride = R * H * D, m.o_parts_row_stride = H * D, m.o_parts_head_stride = D;
    m.lse_parts = (const float *)dlp, m.lse_parts_state_stride = H * R, m.lse_parts_head_stride = R,
    m.lse_parts_row_stride = 1;
    m.o = dout, m.o_row_stride = H * D, m.o_head_stride = D;
    m.lse = (float *)dlse, m.lse_head_stride = R, m.lse_row_stride = 1;
    fa_status s = fa_merge_states(&m);
    EXPECT(s == FA_OK, "merge: %s", fa_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lse, dlse, sizeof lse, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) {
            const int expect = (h == 0 && r == 2) || (h == 1 && r == 3);
            const int is_nan = row_all_nan(out + (r * H + h) * D, D) && isnan(lse[h * R + r]);
            int any = isnan(lse[h * R + r]);
            for (int e = 0; e < D; e++) any |= isnan(bf16_to_float(out[(r * H + h) * D + e]));
            wrong += expect ? !is_nan : any;
        }
    EXPECT(wrong == 0, "merge: %d rows wrong", wrong);
    printf("%s merge: %d rows wrong\n", wrong ? "FAIL" : "ok  ", wrong);
    cudaFree(dparts), cudaFree(dlp), cudaFree(dout), cudaFree(dlse);
}

int gpu_nan_main(int argc, char **argv) {
    (void)argc, (void)argv;
    static const fwd_case cases[] = {
        {"default d128 sq=sk=300", 300, 300, 128, 0, NULL, 0},
        {"default d64 sq=sk=200 sinks", 200, 200, 64, 1, NULL, 0},
        {"default d128 sq 150 > sk 90", 150, 90, 128, 0, NULL, 0},
        {"portable d128 sq=sk=300", 300, 300, 128, 0, "portable", 0},
        {"portable d256 sq=sk=130 sinks", 130, 130, 256, 1, "portable", 0},
        {"portable d64 sq 150 > sk 90", 150, 90, 64, 0, "portable", 0},
        {"large heads d512 sq=sk=100 sinks", 100, 100, 512, 1, NULL, 0},
        {"packed GQA d128 sq 3 sk 3", 3, 3, 128, 1, NULL, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        forward_case(&cases[i], 0);
        forward_case(&cases[i], 1);
    }
    kvcache_case(128, 1);
    kvcache_case(128, 4);
    kvcache_case(64, 3);
    merge_case();
    printf("nan: %s\n", failures ? "FAILED" : "all checks held");
    return failures ? 1 : 0;
}
