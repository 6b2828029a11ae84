/* dev/decode_kernel_cycles.c: TSC cycles per key·kv head of the decode kernels alone (one tile of
 * 16 keys, 4 rows, d 128, in L1), per format. Build: cc -O2 -Iinclude -Isrc dev/decode_kernel_cycles.c
 * build/libflashattn.a -lm -pthread */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
#include "cpu/cpu_decode.h"

int main(int argc, char **argv) {
    const fa_cpu_decode_kernels *dk = (getenv("KSET") && atoi(getenv("KSET")) == 0 ? fa_cpu_decode_kernels_avx512() : fa_cpu_decode_kernels_avx512_vnni());
    enum { N = 16, R = 4, D = 128, TILES = 64 }; /* TILES tiles of N keys cycled through: 64 × 16 × 1 KB in L2 */
    static char kbuf[TILES * N][D * 4] __attribute__((aligned(64))), vbuf[TILES * N][D * 4] __attribute__((aligned(64)));
    const int tiles = getenv("TILES") ? atoi(getenv("TILES")) : 1;
    static float q[R * D], o[R * D], s[N * 16], alpha[R], km[N], vm[N];
    const char *kr[TILES][N], *vr[TILES][N];
    for (int j = 0; j < TILES * N; j++) {
        kr[j / N][j % N] = kbuf[j]; vr[j / N][j % N] = vbuf[j]; km[j % N] = vm[j % N] = 0.01f;
        for (int i = 0; i < D * 4; i++) { kbuf[j][i] = (char)(rand() & 0x3f); vbuf[j][i] = (char)(rand() & 0x3f); }
        if (1) for (int c = 0; c < D / 32; c++) { kbuf[j][c * 34 + 1] = 0x20; vbuf[j][c * 34 + 1] = 0x20; }
    }
    for (int i = 0; i < R * D; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < N * 16; i++) s[i] = (float)rand() / RAND_MAX;
    for (int r = 0; r < R; r++) alpha[r] = 1.0f;
    const char *names[] = {"f32", "f16", "bf16", "int8", "q8_0", "e4m3"};
    int reps = argc > 1 ? atoi(argv[1]) : 20000, use_q16 = argc > 2 ? atoi(argv[2]) : 1;
    static int16_t q16[R * D];
    static float q16s[R];
    for (int i = 0; i < R * D; i++) q16[i] = (int16_t)(q[i] * 60000);
    for (int r = 0; r < R; r++) q16s[r] = 1.0f / 60000;
    for (int f = 1; f < 6; f++) {
        fa_cpu_decode_tile t = {.format = (fa_cpu_kv_format)f, .n_keys = N, .k_rows = kr[0], .v_rows = vr[0],
                                .k_mult = (f == 3 || f == 5) ? km : NULL, .v_mult = (f == 3 || f == 5) ? vm : NULL,
                                .d = D, .dv = D, .q = q, .n_rows = R, .s = s, .ld = 16, .o = o, .alpha = alpha};
        if (use_q16 && (f == 3 || f == 4)) t.q16 = q16, t.q16_scale = q16s;
        t.integer_pv = getenv("INT_PV") ? atoi(getenv("INT_PV")) : 0;
        double best_s = 1e30, best_a = 1e30;
        for (int round = 0; round < 600; round++) {
            unsigned long long t0 = __rdtsc();
            for (int i = 0; i < reps; i++) { t.k_rows = kr[i % tiles]; dk->scores(&t); }
            unsigned long long t1 = __rdtsc();
            for (int i = 0; i < reps; i++) { memset(o, 0, sizeof o); t.v_rows = vr[i % tiles]; dk->accumulate(&t); }
            unsigned long long t2 = __rdtsc();
            double cs = (double)(t1 - t0) / reps / N, ca = (double)(t2 - t1) / reps / N;
            if (cs < best_s) best_s = cs;
            if (ca < best_a) best_a = ca;
        }
        printf("%-5s scores %6.1f  accumulate %6.1f  total %6.1f TSC cycles per key·kv head (o[0]=%g)\n", names[f], best_s, best_a,
               best_s + best_a, o[0]);
    }
    return 0;
}
