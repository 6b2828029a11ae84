/*
 * tests/gpu/large_heads.c: fa_forward and fa_backward on CUDA at head dims above 256
 * (`fa_gpu_tests large [small]`; on sm_90 up to 512 the forward is the bucket-256 Hopper tile in
 * CTA pairs, 128 rows × 64 keys, and the backward the bucket-256 kernel in CTA pairs; the rest the
 * mma.sync kernels): Gemma-class d = 512, MLA's absorbed 576 / 512, odd
 * sizes (264, 320, 384, 448), dv ≠ d, forward and backward, each with the float64 oracle's rule (fa_case_run poisons
 * every output with NaN and counts the elements left unwritten):
 *   1. random problems from a fresh seed (printed): sq != sk, GQA/MQA, varlen with empty
 *      sequences, causal with fully masked rows, windows, softcap, ALiBi, sinks, dropout, every
 *      layout, f16 and bf16, the deterministic backward;
 *   2. fixed problems at the tile edges (one key, one query, 31/33 and 63/65 keys around the
 *      backward's and forward's key tiles, 65 and 127/129 queries around their row blocks), and
 *      d = 512 with q scaled by 8 and 40 (sharp softmax, large partial scores);
 *   3. refusals: d = 584, dv = 520 (forward and backward) return FA_ERR_HEAD_DIM with a message
 *      naming the field, and write nothing.
 * `small` runs a few small problems (for compute-sanitizer).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "gpu_util.h"
#include "oracle/sweep_case.h"

static int failures;

#define EXPECT(cond, ...) GPU_EXPECT(failures, "large", cond, __VA_ARGS__)
#define CUDA_OK(call) GPU_CUDA_OK("large", call)

static fa_test_rng rng; /* the oracle's generator, seeded by gpu_announce_seed */
static uint64_t next_random(void) { return fa_test_rng_next(&rng); }
static int64_t rand_int(int64_t lo, int64_t hi) { return fa_test_rng_int(&rng, lo, hi); }
static int chance(double p) { return fa_test_rng_uniform(&rng) < p; }

/* Run one spec (forward and backward) on CUDA against the oracle. */
static void run_case(const char *label, fa_test_spec *spec) {
    spec->pad_align = 8;
    spec->backward = 1;
    fa_case_result r;
    char what[256], fwd[512], bwd[512];
    const int rc = fa_case_run(spec, FA_DEVICE_CUDA, 0, &r);
    fa_case_describe(&r.spec, what, sizeof what);
    fa_case_format(&r, 0, 0, fwd, sizeof fwd);
    fa_case_format(&r, 1, 0, bwd, sizeof bwd);
    const int ok = rc == 0 && !r.skipped && r.fwd_ok && r.bwd_ok;
    printf("%s %s seed %llu:%s |%s %s%s\n", ok ? "ok  " : "FAIL", label, (unsigned long long)spec->seed, fwd, bwd,
           r.skipped ? r.skip_reason : "", r.error);
    if (!ok) {
        printf("     %s\n", what);
        failures++;
    }
}

static fa_test_spec base_spec(int64_t d, int64_t dv, int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv) {
    fa_test_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = chance(0.5) ? FA_DTYPE_BF16 : FA_DTYPE_F16;
    s.head_dim = d, s.head_dim_v = dv;
    s.batch = batch, s.seqlen_q = sq, s.seqlen_k = sk, s.heads_q = hq, s.heads_kv = hkv;
    s.layout = (fa_test_layout)(next_random() % 3);
    s.seed = next_random();
    return s;
}

/* 1. random problems */
static void random_cases(int count, int small) {
    static const int64_t dims[] = {264, 320, 384, 448, 512, 512, 512, 576};
    static const int64_t lens[] = {1, 17, 33, 64, 65, 130, 257, 400};
    for (int c = 0; c < count; c++) {
        const int64_t d = dims[next_random() % 8];
        const int64_t dv = d == 576 ? 512 : chance(0.7) ? d : chance(0.5) ? 128 : 512;
        const int64_t hkv = rand_int(1, 2), group = rand_int(1, 3);
        int64_t sq = lens[next_random() % (small ? 4 : 8)];
        const int64_t sk = chance(0.4) ? sq : lens[next_random() % (small ? 4 : 8)];
        fa_test_spec s = base_spec(d, dv, rand_int(1, small ? 1 : 3), sq, sk, hkv * group, hkv);
        s.causal = chance(0.5);
        if (chance(0.3)) {
            s.use_window = 1;
            s.window_left = (int32_t)rand_int(0, sk + 2);
            s.window_right = s.causal ? -1 : (int32_t)rand_int(-1, sk / 2 + 1);
        }
        if (chance(0.25)) s.softcap = 5.0f;
        if (chance(0.2)) s.alibi = FA_TEST_ALIBI_BATCH_HEAD;
        if (chance(0.25)) s.sinks = 1;
        if (chance(0.3)) s.varlen = 1, s.batch = rand_int(2, 4);
        if (chance(0.2)) {
            s.dropout_p = 0.1f + 0.5f * (float)(next_random() % 100) / 100.0f;
            s.dropout_seed = next_random();
            s.dropout_offset = next_random() >> rand_int(1, 63);
        }
        s.deterministic = chance(0.3);
        char label[96];
        snprintf(label, sizeof label, "random %d d%lld/%lld", c, (long long)d, (long long)dv);
        run_case(label, &s);
    }
}

/* 2. tile edges: keys around the 32- and 64-key tiles, queries around the 64- and 128-row blocks */
static void edge_cases(void) {
    static const int64_t shapes[][7] = {
        /* d, dv, batch, sq, sk, hq, hkv */
        {512, 512, 2, 1, 1, 2, 1},   {512, 512, 1, 65, 31, 4, 2}, {512, 512, 1, 64, 33, 2, 2},
        {512, 128, 2, 129, 97, 4, 1}, {576, 512, 1, 65, 200, 8, 1}, {320, 320, 1, 100, 63, 3, 3},
        {512, 512, 1, 127, 65, 2, 1}, {384, 384, 2, 129, 63, 2, 2},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t *sh = shapes[i];
            fa_test_spec s = base_spec(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6]);
            s.causal = causal;
            char label[96];
            snprintf(label, sizeof label, "edge d%lld/%lld sq %lld sk %lld%s", (long long)sh[0], (long long)sh[1],
                     (long long)sh[3], (long long)sh[4], causal ? " causal" : "");
            run_case(label, &s);
        }
    /* sharp softmax: q = amplitude·randn makes scores (and the d = 512 pairs' partial scores) large */
    static const double amplitudes[] = {8.0, 40.0};
    for (size_t i = 0; i < sizeof amplitudes / sizeof amplitudes[0]; i++) {
        fa_test_spec s = base_spec(512, 512, 1, 130, 200, 2, 1);
        s.q_amplitude = amplitudes[i];
        s.causal = (int)i;
        char label[96];
        snprintf(label, sizeof label, "edge d512 q amplitude %g%s", amplitudes[i], i ? " causal" : "");
        run_case(label, &s);
    }
}

/* 3. refusals: FA_ERR_HEAD_DIM naming the field, nothing written */
static void refusal_cases(void) {
    enum { B = 1, S = 16, H = 1, D = 640 };
    const size_t elems = (size_t)B * S * H * D;
    uint16_t *buf[8];
    for (int i = 0; i < 8; i++) {
        CUDA_OK(cudaMalloc((void **)&buf[i], 2 * elems));
        CUDA_OK(cudaMemset(buf[i], 0x7f, 2 * elems));
    }
    float *lse;
    CUDA_OK(cudaMalloc((void **)&lse, 4 * B * H * S));
    static const struct { int64_t d, dv; int backward; const char *field; } cases[] = {
        {584, 512, 0, "head_dim"}, {512, 520, 0, "head_dim_v"}, {584, 512, 1, "head_dim"},
        {576, 520, 1, "head_dim_v"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fa_params p;
        memset(&p, 0, sizeof p);
        p.device = FA_DEVICE_CUDA;
        p.dtype = FA_DTYPE_BF16;
        p.batch = B, p.seqlen_q = S, p.seqlen_k = S, p.heads_q = H, p.heads_kv = H;
        p.head_dim = cases[c].d, p.head_dim_v = cases[c].dv;
        p.q = buf[0], p.k = buf[1], p.v = buf[2], p.o = buf[3], p.lse = lse;
        p.dout = buf[4], p.dq = buf[5], p.dk = buf[6], p.dv = buf[7];
        fa_set_contiguous_strides(&p);
        const fa_status s = cases[c].backward ? fa_backward(&p) : fa_forward(&p);
        const char *msg = fa_last_error();
        EXPECT(s == FA_ERR_HEAD_DIM && strstr(msg, cases[c].field) != NULL,
               "d %lld dv %lld %s: status %d, message '%s' (want FA_ERR_HEAD_DIM naming %s)", (long long)cases[c].d,
               (long long)cases[c].dv, cases[c].backward ? "backward" : "forward", (int)s, msg, cases[c].field);
        CUDA_OK(cudaDeviceSynchronize());
        uint16_t first[2];
        int untouched = 1;
        for (int i = 3; i < 8; i++) {
            CUDA_OK(cudaMemcpy(first, buf[i], sizeof first, cudaMemcpyDeviceToHost));
            untouched &= first[0] == 0x7f7f && first[1] == 0x7f7f;
        }
        EXPECT(untouched, "d %lld dv %lld: a refused call wrote an output", (long long)cases[c].d,
               (long long)cases[c].dv);
        printf("%s refused d %lld dv %lld %s: %s\n", s == FA_ERR_HEAD_DIM && untouched ? "ok  " : "FAIL",
               (long long)cases[c].d, (long long)cases[c].dv, cases[c].backward ? "backward" : "forward", msg);
    }
    for (int i = 0; i < 8; i++) cudaFree(buf[i]);
    cudaFree(lse);
}

int gpu_large_main(int argc, char **argv) {
    const int small = argc >= 2 && strcmp(argv[1], "small") == 0;
    fa_test_rng_seed(&rng, gpu_announce_seed("large"));
    random_cases(small ? 4 : 40, small);
    if (!small) edge_cases();
    refusal_cases();
    printf("large heads: %s\n", failures ? "FAILED" : "all checks held");
    return failures ? 1 : 0;
}
