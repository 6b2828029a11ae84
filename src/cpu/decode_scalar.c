/*
 * decode_scalar.c: the decode path's kernels (cpu_decode.h) in plain C, for CPUs without AVX2
 * (and FA_CPU_ISA=scalar), and the scalar 8-bit conversions.
 */
#include <math.h>
#include <string.h>

#include "cpu_convert.h"
#include "cpu_decode.h"

/* fp32 -> e4m3 (e4m3 -> fp32 is cpu_convert.h's fa_e4m3_to_f32). */
uint8_t fa_cpu_f32_to_e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
    float a = fabsf(x);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e); /* saturate to the largest finite value */
    /* the 126 non-negative finite codes are increasing: pick the nearest, ties to the even code */
    int lo = 0, hi = 0x7e;
    while (lo < hi) { /* largest code with value <= a */
        int mid = (lo + hi + 1) / 2;
        if (fa_e4m3_to_f32((uint8_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    int code = lo;
    if (code < 0x7e) {
        float below = fa_e4m3_to_f32((uint8_t)code), above = fa_e4m3_to_f32((uint8_t)(code + 1));
        if (a - below > above - a || (a - below == above - a && (code & 1))) code++;
    }
    return (uint8_t)(sign | code);
}

static float load1(fa_cpu_kv_format format, const char *row, int64_t c) {
    switch (format) {
    case FA_CPU_KV_F32: {
        float x;
        memcpy(&x, row + 4 * c, 4);
        return x;
    }
    case FA_CPU_KV_F16:
    case FA_CPU_KV_BF16: {
        uint16_t h;
        memcpy(&h, row + 2 * c, 2);
        return format == FA_CPU_KV_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
    }
    case FA_CPU_KV_I8: return (float)(int8_t)row[c];
    case FA_CPU_KV_Q8_0: {
        const char *block = row + (c >> 5) * 34;
        uint16_t h;
        memcpy(&h, block, 2);
        return fa_f16_to_f32(h) * (float)(int8_t)block[2 + (c & 31)];
    }
    default: return fa_e4m3_to_f32((uint8_t)row[c]) * 0.00390625f; /* 2^-8, as the AVX2 kernel */
    }
}

static void decode_scores(const fa_cpu_decode_tile *t) {
    for (int64_t j = 0; j < t->n_keys; j++) {
        float mult = t->k_mult ? t->k_mult[j] : 1.0f;
        for (int64_t r = 0; r < t->n_rows; r++) {
            float sum = 0.0f;
            for (int64_t c = 0; c < t->d; c++) sum += load1(t->format, t->k_rows[j], c) * t->q[r * t->d + c];
            t->s[j * t->ld + r] = mult * sum;
        }
    }
}

static void decode_accumulate(const fa_cpu_decode_tile *t) {
    for (int64_t r = 0; r < t->n_rows; r++) {
        float *o = t->o + r * t->dv;
        for (int64_t c = 0; c < t->dv; c++) o[c] *= t->alpha[r];
        for (int64_t j = 0; j < t->n_keys; j++) {
            float w = t->s[j * t->ld + r];
            for (int64_t c = 0; c < t->dv; c++) o[c] += w * load1(t->format, t->v_rows[j], c);
        }
    }
}

static const fa_cpu_decode_kernels kernels = {decode_scores, decode_accumulate, NULL, 0};
const fa_cpu_decode_kernels *fa_cpu_decode_kernels_scalar(void) { return &kernels; }
