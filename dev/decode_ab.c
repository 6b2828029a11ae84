/* dev/decode_ab.c: fa_kvcache_forward of several builds of the library (shared objects), called in
 * turn on the same cache in one process; median CPU time per call (getrusage, all threads) and
 * wall time per library. f16 queries, 32/8 heads, d 128, 1 query token.
 *   cc -O2 -Iinclude dev/decode_ab.c -ldl -lm -pthread -o /tmp/dab
 *   /tmp/dab KV(same|int8|q8_0|fp8) BATCH CTX THREADS CALLS LIB.so... */
#include <dlfcn.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "flashattn.h"

static void (*set_strides)(fa_params *);

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
static double wall_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *kv = argc > 1 ? argv[1] : "same";
    int64_t B = argc > 2 ? atoll(argv[2]) : 1, L = argc > 3 ? atoll(argv[3]) : 16384;
    int threads = argc > 4 ? atoi(argv[4]) : 2, calls = argc > 5 ? atoi(argv[5]) : 9;
    int n_libs = argc - 6;
    if (n_libs < 1 || n_libs > 8) return 2;
    fa_status (*fwd[8])(const fa_params *);
    for (int i = 0; i < n_libs; i++) {
        void *h = dlopen(argv[6 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) { printf("%s\n", dlerror()); return 1; }
        fwd[i] = (fa_status (*)(const fa_params *))dlsym(h, "fa_kvcache_forward");
        if (i == 0) set_strides = (void (*)(fa_params *))dlsym(h, "fa_set_contiguous_strides");
    }
    const int64_t HQ = 32, HKV = 8, D = 128;
    fa_kv_dtype kd = !strcmp(kv, "int8") ? FA_KV_INT8 : !strcmp(kv, "q8_0") ? FA_KV_Q8_0 : !strcmp(kv, "fp8") ? FA_KV_FP8_E4M3 : FA_KV_SAME;
    int64_t row_bytes = kd == FA_KV_SAME ? 2 * D : kd == FA_KV_Q8_0 ? D / 32 * 34 : D;
    int64_t unit = kd == FA_KV_SAME ? 2 : 1, row_units = row_bytes / unit;
    size_t kv_bytes = (size_t)(B * L * HKV * row_bytes);
    /* HUGE=1 in the environment: the cache in 2 MiB pages (madvise) */
    unsigned char *k, *v;
    if (getenv("HUGE")) {
        size_t sz = (kv_bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        k = aligned_alloc(2u << 20, sz), v = aligned_alloc(2u << 20, sz);
        madvise(k, sz, MADV_HUGEPAGE), madvise(v, sz, MADV_HUGEPAGE);
    } else {
        k = malloc(kv_bytes), v = malloc(kv_bytes);
    }
    uint16_t *q = malloc(B * HQ * D * 2), *o = malloc(B * HQ * D * 2);
    float *ks = malloc(B * L * HKV * 4), *vs = malloc(B * L * HKV * 4);
    int32_t *lens = malloc(B * 4);
    srand(1);
    for (size_t i = 0; i < kv_bytes; i++) {
        k[i] = rand() % 61;
        v[i] = rand() % 53;
    }
    if (kd == FA_KV_SAME)
        for (size_t i = 0; i < kv_bytes / 2; i++) {
            ((uint16_t *)k)[i] = 0x3000 + rand() % 0x800 + (rand() & 1) * 0x8000;
            ((uint16_t *)v)[i] = 0x3000 + rand() % 0x800;
        }
    if (kd == FA_KV_Q8_0)
        for (size_t i = 0; i < kv_bytes; i += 34) k[i] = v[i] = 0, k[i + 1] = v[i + 1] = 0x24;
    for (int64_t i = 0; i < B * L * HKV; i++) ks[i] = vs[i] = 1.0f / 64;
    for (int64_t i = 0; i < B * HQ * D; i++) q[i] = 0x3000 + rand() % 0x800 + (rand() & 1) * 0x8000;
    for (int64_t b = 0; b < B; b++) lens[b] = (int32_t)L;
    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CPU;
    p.dtype = FA_DTYPE_F16;
    p.batch = B;
    p.seqlen_q = 1;
    p.seqlen_k = L;
    p.heads_q = HQ;
    p.heads_kv = HKV;
    p.head_dim = D;
    set_strides(&p);
    p.k_batch_stride = p.v_batch_stride = L * HKV * row_units;
    p.k_row_stride = p.v_row_stride = HKV * row_units;
    p.k_head_stride = p.v_head_stride = row_units;
    p.kv_dtype = kd;
    if (kd == FA_KV_INT8 || kd == FA_KV_FP8_E4M3) p.k_scale = ks, p.v_scale = vs;
    if (kd == FA_KV_INT8) {
        p.k_scale_batch_stride = p.v_scale_batch_stride = L * HKV;
        p.k_scale_row_stride = p.v_scale_row_stride = HKV;
        p.k_scale_head_stride = p.v_scale_head_stride = 1;
    }
    p.q = q, p.o = o, p.k = k, p.v = v;
    p.cache_seqlens = lens;
    p.causal = 1;
    p.num_threads = threads;
    for (int i = 0; i < n_libs; i++)
        if (fwd[i](&p) != FA_OK) return 1;
    static double cpu[8][1000], wall[8][1000];
    if (calls > 1000) calls = 1000;
    for (int c = 0; c < calls; c++)
        for (int i0 = 0; i0 < n_libs; i0++) {
            int i = (i0 + c) % n_libs;
            double c0 = cpu_s(), w0 = wall_s();
            fwd[i](&p);
            cpu[i][c] = cpu_s() - c0;
            wall[i][c] = wall_s() - w0;
        }
    double units = (double)B * L * HKV;
    for (int i = 0; i < n_libs; i++) {
        qsort(cpu[i], calls, sizeof(double), cmp);
        qsort(wall[i], calls, sizeof(double), cmp);
        double mc = cpu[i][calls / 2], mw = wall[i][calls / 2];
        printf("%-5s b %lld ctx %lld thr %d %-22s CPU median %.3f min %.3f ms (%.0f / %.0f cycles@2GHz per key·kv head)  wall %.3f ms  %.2f GB/s\n",
               kv, (long long)B, (long long)L, threads, argv[6 + i], 1e3 * mc, 1e3 * cpu[i][0], 2e9 * mc / units, 2e9 * cpu[i][0] / units,
               1e3 * mw, 2.0 * kv_bytes / mw * 1e-9);
    }
    return 0;
}
