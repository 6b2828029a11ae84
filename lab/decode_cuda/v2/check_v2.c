/*
 * check_v2.c: the lab decode variants (FA_KV_VARIANT = base | slim | deep | wide, see
 * lab/decode_cuda/v2/README.md) against the library's CPU path on the same inputs, no torch.
 * Every case runs on the GPU once per variant (the variable is read per call); o and lse are
 * compared with the CPU result (fp32 compute, rounded to the dtype): a variant passes when its
 * error is at most 2 × the base kernel's + one ulp of the dtype at the output's magnitude (o)
 * or 1e-3 (lse). The cases are plain decode calls the slim kernels take (d 96 / 111 / 128,
 * contiguous and pages of 8 / 16, cache_batch_idx, leftpad, empty sequences, sinks, windows,
 * sq 1-3, GQA 1 / 4 / 8, forced splits 1 / 3 / 128, lse on / off, f16 and bf16) and two that fall
 * back to the base kernel (softcap, page size 3). The GPU outputs start as NaN.
 *
 * Build (repository root): cc -std=c11 -O2 -Iinclude -I/usr/local/cuda/include lab/decode_cuda/v2/check_v2.c \
 *     BUILD/libflashattn.a -L/usr/local/cuda/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o BUILD/check_v2
 * Run:   BUILD/check_v2            prints one line per case and variant, exits 1 on any failure
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

#define CHECK(call)                                                                               \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

typedef struct v2_case {
    const char *name;
    int f16;
    int b, sq, hq, hkv, d, cap;
    int page_size; /* 0: contiguous */
    int batch_idx, leftpad, sinks, causal, wl, wr, splits, lse;
    float softcap;
} v2_case;

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static float uniform(void) { /* [0, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / 16777216.0f;
}

static uint16_t to_half_bits(float x, int f16) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (!f16) return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    /* fp16 round to nearest even, values here are normal and small */
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (exp <= 0) return (uint16_t)sign; /* |x| < 2^-14: flush (not produced by the inputs) */
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)h;
}

static float from_half_bits(uint16_t h, int f16) {
    if (!f16) {
        uint32_t u = (uint32_t)h << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (exp == 0) return sign * ldexpf((float)mant, -24);
    if (exp == 31) return mant ? NAN : sign * INFINITY;
    return sign * ldexpf((float)(mant | 0x400), exp - 25);
}

static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    CHECK(cudaMalloc(&d, bytes > 0 ? bytes : 16));
    if (h != NULL && bytes) CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static const char *const variants[] = {"base", "slim", "deep", "wide"};
enum { VARIANTS = 4 };

/* Returns the number of failures. */
static int run_case(const v2_case *c) {
    const int b = c->b, sq = c->sq, hq = c->hq, hkv = c->hkv, d = c->d, cap = c->cap, f16 = c->f16;
    const int dp = (d + 7) & ~7; /* head stride: the CUDA path needs 16-byte aligned rows */
    int32_t lens[8], pads[8], rows[8];
    for (int i = 0; i < b; ++i) {
        lens[i] = i == 0 ? cap : i == 1 && b > 2 ? 0 : cap - 1 - (int)(uniform() * (float)(cap / 2));
        pads[i] = c->leftpad ? lens[i] / 5 : 0;
        rows[i] = c->batch_idx ? b - i : i; /* cache rows b .. 1 */
    }
    const int cache_batch = c->batch_idx ? b + 1 : b;
    const int pages_per_seq = c->page_size ? (cap + c->page_size - 1) / c->page_size : 0;
    const int num_pages = b * pages_per_seq + 3;
    const size_t slabs = c->page_size ? (size_t)num_pages : (size_t)cache_batch;
    const size_t slab_rows = c->page_size ? (size_t)c->page_size : (size_t)cap;
    const size_t kv_elems = slabs * slab_rows * hkv * dp, q_elems = (size_t)b * sq * hq * dp;
    uint16_t *k = malloc(2 * kv_elems), *v = malloc(2 * kv_elems), *q = malloc(2 * q_elems);
    for (size_t i = 0; i < kv_elems; ++i) k[i] = to_half_bits(uniform() - 0.5f, f16);
    for (size_t i = 0; i < kv_elems; ++i) v[i] = to_half_bits(uniform() - 0.5f + 0.5f, f16); /* offset v */
    for (size_t i = 0; i < q_elems; ++i) q[i] = to_half_bits(2.0f * (uniform() - 0.5f), f16);
    int32_t *table = NULL;
    if (c->page_size) { /* a random permutation of pages 3 .. num_pages - 1 */
        const int n = b * pages_per_seq;
        table = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; ++i) table[i] = 3 + i;
        for (int i = n - 1; i > 0; --i) {
            const int j = (int)(uniform() * (float)(i + 1)) % (i + 1), t = table[i];
            table[i] = table[j];
            table[j] = t;
        }
    }
    float sinks[64];
    for (int h = 0; h < hq; ++h) sinks[h] = 2.0f * uniform() - 1.0f;

    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = f16 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
    p.batch = b;
    p.seqlen_q = sq;
    p.seqlen_k = c->page_size ? (int64_t)pages_per_seq * c->page_size : cap;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.head_dim = d;
    p.q_head_stride = p.o_head_stride = dp;
    p.q_row_stride = p.o_row_stride = (int64_t)hq * dp;
    p.q_batch_stride = p.o_batch_stride = (int64_t)sq * hq * dp;
    p.k_head_stride = p.v_head_stride = dp;
    p.k_row_stride = p.v_row_stride = (int64_t)hkv * dp;
    p.k_batch_stride = p.v_batch_stride = (int64_t)slab_rows * hkv * dp;
    p.causal = c->causal;
    if (c->wl >= 0 || c->wr >= 0) {
        p.use_window = 1;
        p.window_left = c->wl;
        p.window_right = c->wr;
    }
    p.softcap = c->softcap;
    p.num_splits = c->splits;
    if (c->page_size) {
        p.block_table_batch_stride = pages_per_seq;
        p.page_size = c->page_size;
        p.num_pages = num_pages;
    } else {
        p.cache_batch = cache_batch;
    }

    /* CPU reference run (host arrays) */
    const size_t o_elems = (size_t)b * sq * hq * dp, lse_elems = (size_t)b * hq * sq;
    uint16_t *o_cpu = malloc(2 * o_elems), *o_gpu = malloc(2 * o_elems);
    float *lse_cpu = malloc(4 * lse_elems), *lse_gpu = malloc(4 * lse_elems);
    fa_params pc = p;
    pc.device = FA_DEVICE_CPU;
    pc.q = q;
    pc.k = k;
    pc.v = v;
    pc.o = o_cpu;
    pc.lse = lse_cpu;
    pc.cache_seqlens = lens;
    pc.cache_leftpad = c->leftpad ? pads : NULL;
    pc.cache_batch_idx = c->batch_idx ? rows : NULL;
    pc.block_table = table;
    pc.sink_logits = c->sinks ? sinks : NULL;
    if (fa_kvcache_forward(&pc) != FA_OK) {
        printf("%-28s CPU reference failed: %s\n", c->name, fa_last_error());
        return 1;
    }

    fa_params pg = p;
    pg.device = FA_DEVICE_CUDA;
    pg.q = to_device(q, 2 * q_elems);
    pg.k = to_device(k, 2 * kv_elems);
    pg.v = to_device(v, 2 * kv_elems);
    void *o_dev = to_device(NULL, 2 * o_elems);
    float *lse_dev = to_device(NULL, 4 * lse_elems);
    pg.o = o_dev;
    pg.lse = c->lse ? lse_dev : NULL;
    pg.cache_seqlens = to_device(lens, sizeof(int32_t) * b);
    pg.cache_leftpad = c->leftpad ? to_device(pads, sizeof(int32_t) * b) : NULL;
    pg.cache_batch_idx = c->batch_idx ? to_device(rows, sizeof(int32_t) * b) : NULL;
    pg.block_table = table ? to_device(table, sizeof(int32_t) * b * pages_per_seq) : NULL;
    pg.sink_logits = c->sinks ? to_device(sinks, sizeof(float) * hq) : NULL;

    double o_max = 0.0;
    for (size_t i = 0; i < o_elems; ++i)
        if ((int)(i % dp) < d) o_max = fmax(o_max, fabs(from_half_bits(o_cpu[i], f16)));
    const double ulp = (f16 ? ldexp(1.0, -10) : ldexp(1.0, -7)) * (o_max > 0.0 ? o_max : 1.0);
    double base_o = 0.0, base_lse = 0.0;
    int failures = 0;
    for (int var = 0; var < VARIANTS; ++var) {
        setenv("FA_KV_VARIANT", variants[var], 1);
        CHECK(cudaMemset(o_dev, 0xff, 2 * o_elems)); /* NaN */
        CHECK(cudaMemset(lse_dev, 0xff, 4 * lse_elems));
        size_t ws = 0;
        fa_status s = fa_check_kvcache(&pg, &ws);
        if (s == FA_OK) s = fa_kvcache_forward(&pg);
        if (s == FA_OK && cudaDeviceSynchronize() != cudaSuccess) s = FA_ERR_CUDA;
        if (s != FA_OK) {
            printf("%-28s %-5s FAIL: %s: %s\n", c->name, variants[var], fa_strerror(s), fa_last_error());
            ++failures;
            continue;
        }
        CHECK(cudaMemcpy(o_gpu, o_dev, 2 * o_elems, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(lse_gpu, lse_dev, 4 * lse_elems, cudaMemcpyDeviceToHost));
        double err_o = 0.0, err_lse = 0.0;
        for (size_t i = 0; i < o_elems; ++i) {
            if ((int)(i % dp) >= d) continue; /* row padding: written by neither */
            const double x = from_half_bits(o_gpu[i], f16), y = from_half_bits(o_cpu[i], f16);
            err_o = isnan(x) ? INFINITY : fmax(err_o, fabs(x - y));
        }
        if (c->lse)
            for (size_t i = 0; i < lse_elems; ++i) {
                const double x = lse_gpu[i], y = lse_cpu[i];
                const double e = isinf(x) && isinf(y) && (x > 0) == (y > 0) ? 0.0 : isnan(x) ? INFINITY : fabs(x - y);
                err_lse = fmax(err_lse, e);
            }
        if (var == 0) {
            base_o = err_o;
            base_lse = err_lse;
        }
        const int ok = err_o <= 2.0 * base_o + ulp && err_lse <= 2.0 * base_lse + 1e-3 && (var > 0 || err_o <= 8 * ulp);
        printf("%-28s %-5s o err %.3g (base %.3g, ulp %.3g)  lse err %.3g (base %.3g)  ws %zu B  %s\n", c->name,
               variants[var], err_o, base_o, ulp, err_lse, base_lse, ws, ok ? "PASS" : "FAIL");
        failures += !ok;
    }
    unsetenv("FA_KV_VARIANT");
    CHECK(cudaFree((void *)pg.q));
    CHECK(cudaFree((void *)pg.k));
    CHECK(cudaFree((void *)pg.v));
    CHECK(cudaFree(o_dev));
    CHECK(cudaFree(lse_dev));
    CHECK(cudaFree((void *)pg.cache_seqlens));
    if (pg.cache_leftpad) CHECK(cudaFree((void *)pg.cache_leftpad));
    if (pg.cache_batch_idx) CHECK(cudaFree((void *)pg.cache_batch_idx));
    if (pg.block_table) CHECK(cudaFree((void *)pg.block_table));
    if (pg.sink_logits) CHECK(cudaFree((void *)pg.sink_logits));
    free(k);
    free(v);
    free(q);
    free(table);
    free(o_cpu);
    free(o_gpu);
    free(lse_cpu);
    free(lse_gpu);
    return failures;
}

int main(void) {
    if (!fa_cuda_available()) {
        printf("no CUDA device / library built without CUDA\n");
        return 2;
    }
    /*  name                          f16 b  sq hq hkv d    cap    page idx pad sink caus wl  wr  splits lse softcap */
    static const v2_case cases[] = {
        {"1x8192 contiguous", 0, 1, 1, 32, 8, 128, 8192, 0, 0, 0, 0, 0, -1, -1, 0, 1, 0.0f},
        {"1x8192 page 16", 0, 1, 1, 32, 8, 128, 8192, 16, 0, 0, 0, 0, -1, -1, 0, 1, 0.0f},
        {"1x8192 f16 sinks", 1, 1, 1, 32, 8, 128, 8192, 0, 0, 0, 1, 0, -1, -1, 0, 1, 0.0f},
        {"1x8192 128 splits", 0, 1, 1, 32, 8, 128, 8192, 0, 0, 0, 0, 0, -1, -1, 128, 1, 0.0f},
        {"1x8192 no split", 0, 1, 1, 32, 8, 128, 8192, 0, 0, 0, 0, 0, -1, -1, 1, 1, 0.0f},
        {"1x65536 contiguous", 0, 1, 1, 32, 8, 128, 65536, 0, 0, 0, 0, 0, -1, -1, 0, 1, 0.0f},
        {"4x16384 page 16", 0, 4, 1, 32, 8, 128, 16384, 16, 0, 0, 0, 0, -1, -1, 0, 1, 0.0f},
        {"3x1000 idx leftpad empty", 0, 3, 1, 8, 2, 128, 1000, 0, 1, 1, 1, 1, -1, -1, 0, 1, 0.0f},
        {"3x2049 page 8 no lse", 1, 3, 1, 32, 8, 128, 2049, 8, 0, 1, 0, 1, -1, -1, 0, 0, 0.0f},
        {"2x777 d96 sq3 window", 0, 2, 3, 4, 4, 96, 777, 0, 0, 0, 1, 1, 100, -1, 0, 1, 0.0f},
        {"2x300 d111 gqa2 3 splits", 1, 2, 2, 6, 3, 111, 300, 16, 0, 0, 0, 0, 50, 10, 3, 1, 0.0f},
        {"5x4000 mqa 32 heads", 0, 5, 1, 32, 1, 128, 4000, 0, 0, 0, 1, 0, -1, -1, 0, 1, 0.0f},
        {"2x1500 softcap (base)", 0, 2, 1, 32, 8, 128, 1500, 0, 0, 0, 0, 0, -1, -1, 0, 1, 30.0f},
        {"2x1500 page 3 (base)", 0, 2, 1, 32, 8, 128, 1500, 3, 0, 0, 0, 0, -1, -1, 0, 1, 0.0f},
    };
    int failures = 0, n = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i, ++n) failures += run_case(&cases[i]);
    printf("check_v2: %d cases × %d variants, %d failed\n", n, VARIANTS, failures);
    return failures ? 1 : 0;
}
