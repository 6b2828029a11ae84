/*
 * consumer.c: a program built against an installed flashattn (tests/install_test.sh builds it
 * with pkg-config, shared and static, and through CMake's find_package). It checks that the
 * header and the library agree on the version and that a small causal GQA forward on the CPU
 * matches plain float64 attention. Prints "consumer: ok ..." and exits 0 on success.
 */
#include <flashattn.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define B 2
#define SQ 5
#define SK 7
#define HQ 4
#define HKV 2
#define D 16

#define STR_(x) #x
#define STR(x) STR_(x)

static float q[B][SQ][HQ][D], k[B][SK][HKV][D], v[B][SK][HKV][D], o[B][SQ][HQ][D];
static float lse[B][HQ][SQ];

static float input(unsigned *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Largest |o - reference| over every output, the reference in float64 (causal, bottom-right
 * aligned as in the library: query i sees keys j <= i + SK - SQ). */
static double max_error(void) {
    double worst = 0.0, scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int i = 0; i < SQ; i++) {
                int hk = h / (HQ / HKV), visible = i + SK - SQ + 1;
                double s[SK], top = -INFINITY, sum = 0.0;
                for (int j = 0; j < visible; j++) {
                    s[j] = 0.0;
                    for (int x = 0; x < D; x++) s[j] += (double)q[b][i][h][x] * k[b][j][hk][x];
                    s[j] *= scale;
                    if (s[j] > top) top = s[j];
                }
                for (int j = 0; j < visible; j++) sum += exp(s[j] - top);
                for (int x = 0; x < D; x++) {
                    double acc = 0.0;
                    for (int j = 0; j < visible; j++) acc += exp(s[j] - top) / sum * v[b][j][hk][x];
                    double err = fabs(acc - (double)o[b][i][h][x]);
                    if (!(err <= worst)) worst = err; /* NaN counts as the worst */
                }
            }
    return worst;
}

int main(void) {
    const char *want = STR(FA_VERSION_MAJOR) "." STR(FA_VERSION_MINOR) "." STR(FA_VERSION_PATCH);
    if (strcmp(fa_version(), want) != 0) {
        fprintf(stderr, "consumer: header says %s, library says %s\n", want, fa_version());
        return 1;
    }
    unsigned state = 12345u;
    for (size_t i = 0; i < sizeof q / sizeof(float); i++) (&q[0][0][0][0])[i] = input(&state);
    for (size_t i = 0; i < sizeof k / sizeof(float); i++) (&k[0][0][0][0])[i] = input(&state);
    for (size_t i = 0; i < sizeof v / sizeof(float); i++) (&v[0][0][0][0])[i] = input(&state);

    fa_params p;
    memset(&p, 0, sizeof p);
    p.device = FA_DEVICE_CPU;
    p.dtype = FA_DTYPE_F32;
    p.batch = B;
    p.seqlen_q = SQ;
    p.seqlen_k = SK;
    p.heads_q = HQ;
    p.heads_kv = HKV;
    p.head_dim = D;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = &lse[0][0][0];
    p.causal = 1;
    fa_set_contiguous_strides(&p);
    fa_status st = fa_forward(&p);
    if (st != FA_OK) {
        fprintf(stderr, "consumer: fa_forward: %s: %s\n", fa_strerror(st), fa_last_error());
        return 1;
    }
    double err = max_error();
    if (!(err < 1e-5)) {
        fprintf(stderr, "consumer: max |o - float64 reference| = %.3g (want < 1e-5)\n", err);
        return 1;
    }
    printf("consumer: ok (flashattn %s, CPU %s, max error %.1e, CUDA %s)\n", fa_version(),
           fa_cpu_isa(), err, fa_cuda_available() ? "available" : "not available");
    return 0;
}
