/* dev/decode_int8_error.c: error of fa_kvcache_forward on an int8 cache (fp32 queries and output)
 * against float64 attention on the same dequantised cache, for several builds of the library
 * (shared objects), next to the cache quantisation's own error (float64 attention on the
 * unquantised K / V against the quantised one). 1 sequence, 32 / 8 heads, d 128.
 *   cc -O2 -Iinclude dev/decode_int8_error.c -ldl -lm -o /tmp/die && /tmp/die CTX QSCALE LIB.so... */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "flashattn.h"

static double gauss(void) {
    double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* float64 attention of one query row over L keys of kv head h; k / v [L][HKV][D] */
static void attend(const float *q, const double *k, const double *v, int64_t L, int64_t HKV, int64_t h, int64_t D, double *out) {
    double *s = malloc(sizeof(double) * L), top = -INFINITY, z = 0;
    for (int64_t j = 0; j < L; j++) {
        double a = 0;
        for (int64_t e = 0; e < D; e++) a += (double)q[e] * k[(j * HKV + h) * D + e];
        s[j] = a / sqrt((double)D);
        if (s[j] > top) top = s[j];
    }
    for (int64_t e = 0; e < D; e++) out[e] = 0;
    for (int64_t j = 0; j < L; j++) {
        double p = exp(s[j] - top);
        z += p;
        for (int64_t e = 0; e < D; e++) out[e] += p * v[(j * HKV + h) * D + e];
    }
    for (int64_t e = 0; e < D; e++) out[e] /= z;
    free(s);
}

int main(int argc, char **argv) {
    const int64_t L = argc > 1 ? atoll(argv[1]) : 4096, HQ = 32, HKV = 8, D = 128, G = HQ / HKV;
    const double qscale = argc > 2 ? atof(argv[2]) : 1.0;
    srand(3);
    size_t n = (size_t)(L * HKV * D);
    double *kf = malloc(n * 8), *vf = malloc(n * 8), *kq = malloc(n * 8), *vq = malloc(n * 8);
    int8_t *k8 = malloc(n), *v8 = malloc(n);
    float *ks = malloc(L * HKV * 4), *vs = malloc(L * HKV * 4), *q = malloc(HQ * D * 4), *o = malloc(HQ * D * 4);
    for (size_t i = 0; i < n; i++) kf[i] = gauss(), vf[i] = gauss() + 0.5;
    for (int64_t r = 0; r < L * HKV; r++) /* per token and head, as the library's append */
        for (int w = 0; w < 2; w++) {
            double *x = w ? vf : kf, *xq = w ? vq : kq, amax = 0;
            int8_t *x8 = w ? v8 : k8;
            for (int64_t e = 0; e < D; e++) amax = fmax(amax, fabs(x[r * D + e]));
            float sc = (float)(amax / 127);
            (w ? vs : ks)[r] = sc;
            for (int64_t e = 0; e < D; e++) {
                x8[r * D + e] = (int8_t)lrint(x[r * D + e] / sc);
                xq[r * D + e] = (double)x8[r * D + e] * sc;
            }
        }
    for (int64_t i = 0; i < HQ * D; i++) q[i] = (float)(gauss() * qscale);
    int32_t len = (int32_t)L;
    double *ref = malloc(HQ * D * 8), *exact = malloc(HQ * D * 8), quant_err = 0, quant_rms = 0;
    for (int64_t hq = 0; hq < HQ; hq++) {
        attend(q + hq * D, kq, vq, L, HKV, hq / G, D, ref + hq * D);
        attend(q + hq * D, kf, vf, L, HKV, hq / G, D, exact + hq * D);
    }
    for (int64_t i = 0; i < HQ * D; i++) {
        quant_err = fmax(quant_err, fabs(ref[i] - exact[i]));
        quant_rms += (ref[i] - exact[i]) * (ref[i] - exact[i]);
    }
    printf("ctx %lld q scale %g: cache quantisation error (float64 on int8 vs on float K/V): max %.3g rms %.3g\n", (long long)L, qscale,
           quant_err, sqrt(quant_rms / (HQ * D)));
    for (int a = 3; a < argc; a++) {
        void *h = dlopen(argv[a], RTLD_NOW | RTLD_LOCAL);
        if (!h) return 1;
        fa_status (*fwd)(const fa_params *) = (fa_status (*)(const fa_params *))dlsym(h, "fa_kvcache_forward");
        void (*strides)(fa_params *) = (void (*)(fa_params *))dlsym(h, "fa_set_contiguous_strides");
        fa_params p;
        memset(&p, 0, sizeof p);
        p.device = FA_DEVICE_CPU;
        p.dtype = FA_DTYPE_F32;
        p.batch = 1, p.seqlen_q = 1, p.seqlen_k = L, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
        strides(&p);
        p.k_batch_stride = p.v_batch_stride = L * HKV * D;
        p.k_row_stride = p.v_row_stride = HKV * D;
        p.k_head_stride = p.v_head_stride = D;
        p.kv_dtype = FA_KV_INT8;
        p.k_scale = ks, p.v_scale = vs;
        p.k_scale_batch_stride = p.v_scale_batch_stride = L * HKV;
        p.k_scale_row_stride = p.v_scale_row_stride = HKV;
        p.k_scale_head_stride = p.v_scale_head_stride = 1;
        p.q = q, p.o = o, p.k = k8, p.v = v8, p.cache_seqlens = &len, p.causal = 1, p.num_threads = 1;
        if (fwd(&p) != FA_OK) return 1;
        double err = 0, rms = 0;
        for (int64_t i = 0; i < HQ * D; i++) {
            err = fmax(err, fabs(o[i] - ref[i]));
            rms += (o[i] - ref[i]) * (o[i] - ref[i]);
        }
        printf("  %-22s error vs float64 on the same cache: max %.3g rms %.3g\n", argv[a], err, sqrt(rms / (HQ * D)));
    }
    return 0;
}
