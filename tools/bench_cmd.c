/*
 * bench_cmd.c: `flashattn bench`: flag parsing, the configuration sweep and the default sweeps.
 *
 * Every flag that takes a number also takes a comma-separated list; the sweep is the product of
 * all lists, except that without --sk each sq is paired with sk = sq. Without any shape flag the
 * default sweep of the device runs (CUDA if fa_cuda_available(), else the CPU): it reproduces
 * FlashAttention's two claims over standard (materialised) attention as the sequence grows,
 * speed-up and memory saving. Results stream out as they are measured.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bench_report.h"
#include "bench_run.h"
#include "cli.h"

#define CMD "bench"
#define DEFAULT_SEED 1234
#define DEFAULT_GEMM_N 2048
#define DEFAULT_STANDARD_LIMIT (1024.0 * 1024.0 * 1024.0)
#define MAX_RESULTS 4096

typedef struct int_list {
    int64_t values[CLI_MAX_LIST];
    int count; /* 0: not given */
} int_list;

typedef struct bench_options {
    fa_device device;
    int device_given;
    fa_dtype dtypes[3];
    int n_dtypes;
    bench_mode modes[3];
    int n_modes;
    int_list b, hq, hkv, sq, sk, d, dv, causal;
    int64_t tokens; /* > 0: b = tokens / sq (the FlashAttention benchmark shapes)               */
    int use_window;
    int32_t window_left, window_right;
    int impl_flash, impl_standard;
    int impl_given; /* --impl given: standard also appears (as skipped) for bwd / fwdbwd      */
    int threads, repeats, warmups;
    int json, gemm;
    int deterministic;
    float dropout_p;
    uint64_t seed;
    double standard_limit; /* bytes the standard path may materialise; beyond it, skipped       */
} bench_options;

/* Results kept for the closing summary. */
typedef struct summary_row {
    bench_case c;
    bench_result flash, standard;
} summary_row;

static void print_help(void) {
    printf(
        "usage: flashattn bench [flags]\n"
        "\n"
        "Times flash attention (fa_forward / fa_backward) against standard materialised\n"
        "attention (see --impl) over a sweep of configurations.\n"
        "With no shape flag it runs the default sweep on the best device present: CUDA if\n"
        "available (bf16, b*s = 16k tokens, 16 heads of d=128, s = 512..16k, causal 0/1, fwd\n"
        "and bwd, standard next to fwd where it fits), else the CPU (f32, b=1, hq=8, d=64,\n"
        "s = 256..8192, causal 0/1, fwd, flash and standard while its scores stay under 1 GB,\n"
        "plus an sgemm reference when a BLAS is installed).\n"
        "\n"
        "flags (numbers accept lists: --sq 512,1024,2048):\n"
        "  --device cpu|cuda      device (default: cuda if available, else cpu)\n"
        "  --dtype f32|f16|bf16   element type, list allowed (default f32 on cpu, bf16 on cuda)\n"
        "  -b N                   batch (default 1)\n"
        "  --tokens N             set b = N / sq for each sq (FlashAttention's b*s = 16k shapes)\n"
        "  --hq N, --hkv N        query / key-value heads (default 8; hkv defaults to hq)\n"
        "  --sq N, --sk N         query / key lengths (default 1024; without --sk, sk = sq)\n"
        "  -d N, --dv N           head dim of q/k and of v (default 64; dv defaults to d)\n"
        "  --causal 0|1|both      causal mask (default 0)\n"
        "  --window L,R           sliding window, L/R keys left/right of the diagonal (-1 = none)\n"
        "  --mode fwd|bwd|fwdbwd  what is timed, list allowed (default fwd). bwd times\n"
        "                         fa_backward alone (the forward it needs runs before timing)\n"
        "  --mode decode          KV-cache decoding bandwidth (fa_kvcache_forward) instead, with\n"
        "                         flags of its own: flashattn bench --mode decode --help\n"
        "  --impl flash|standard|both   (default both; standard only next to fwd). Standard\n"
        "                         attention is forward-only: CPU fa_standard_forward (fp32\n"
        "                         scores); CUDA cuBLAS S=QK^T (fp32) + softmax (NVRTC kernel) +\n"
        "                         P (input dtype) V, skipped where S and P do not fit\n"
        "  --threads N            CPU threads (default 0 = all cores)\n"
        "  --repeats N            timed calls (default: adaptive, >= 3 on cpu, >= 10 on cuda)\n"
        "  --warmup N             untimed calls first (default 1 on cpu, 3 on cuda)\n"
        "  --seed N               input seed (default %d)\n"
        "  --deterministic        fa_params.deterministic = 1 (bitwise-repeatable backward)\n"
        "  --dropout P            attention dropout probability in [0, 1) (default 0; no error\n"
        "                         column, no standard attention)\n"
        "  --gemm                 also time an fp32 GEMM n=2048 through an installed BLAS\n"
        "  --no-gemm              do not (the CPU default sweep measures it)\n"
        "  --json                 one JSON object per measurement per line\n"
        "\n"
        "Reported per measurement: median ms; FLOP/s with FlashAttention's convention: forward\n"
        "4*b*hq*sq*sk*d (2*b*hq*sq*sk*(d+dv) when dv != d), halved when causal (the paper's\n"
        "convention, also when sq != sk); with --window the exact count of visible (query, key)\n"
        "pairs replaces sq*sk; backward = 2.5x forward, fwdbwd = 3.5x forward.\n"
        "Extra memory: CPU: each measurement runs in a forked child; the peak RSS (VmHWM) increase\n"
        "over the calls, with all inputs and outputs already allocated and touched (without /proc:\n"
        "the workspace fa_check_* reports). CUDA: the workspace fa_check_* reports (allocated by\n"
        "the tool) plus the drop of cudaMemGetInfo's free memory over the calls.\n"
        "max|err|: max abs error of o (dq for bwd) against the float64 reference on the last 4 query\n"
        "rows of the last (batch, head). speed-up and mem-save compare with the standard row.\n"
        "of sgemm: the row's FLOP/s over the fp32 GEMM's (the sgemm reference line, with --gemm).\n"
        "Progress goes to stderr: a status line on a terminal; in a pipe or a log, a line before\n"
        "each measurement that follows one of more than 2 s.\n",
        DEFAULT_SEED);
}

/* ---- parsing ----------------------------------------------------------------------------- */

static void parse_list(const char *flag, const char *value, int64_t min, int64_t max,
                       int_list *list) {
    list->count = cli_parse_int_list(CMD, flag, value, min, max, list->values);
}

static void parse_dtypes(const char *value, bench_options *o) {
    char copy[64];
    snprintf(copy, sizeof copy, "%s", value);
    o->n_dtypes = 0;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        if (o->n_dtypes == 3 || !cli_parse_dtype(item, &o->dtypes[o->n_dtypes]))
            cli_usage_error(CMD, "--dtype: '%s' is not f32, f16 or bf16", item);
        o->n_dtypes++;
    }
    if (o->n_dtypes == 0) cli_usage_error(CMD, "--dtype needs a value");
}

static void parse_modes(const char *value, bench_options *o) {
    char copy[64];
    snprintf(copy, sizeof copy, "%s", value);
    o->n_modes = 0;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        bench_mode mode;
        if (!strcmp(item, "fwd"))
            mode = BENCH_FWD;
        else if (!strcmp(item, "bwd"))
            mode = BENCH_BWD;
        else if (!strcmp(item, "fwdbwd"))
            mode = BENCH_FWDBWD;
        else
            cli_usage_error(CMD, "--mode: '%s' is not fwd, bwd or fwdbwd", item);
        if (o->n_modes == 3) cli_usage_error(CMD, "--mode: at most 3 values");
        o->modes[o->n_modes++] = mode;
    }
    if (o->n_modes == 0) cli_usage_error(CMD, "--mode needs a value");
}

static void parse_causal(const char *value, bench_options *o) {
    if (!strcmp(value, "both")) {
        o->causal.values[0] = 0;
        o->causal.values[1] = 1;
        o->causal.count = 2;
        return;
    }
    parse_list("--causal", value, 0, 1, &o->causal);
}

static void parse_impl(const char *value, bench_options *o) {
    o->impl_given = 1;
    o->impl_flash = !strcmp(value, "flash") || !strcmp(value, "both");
    o->impl_standard = !strcmp(value, "standard") || !strcmp(value, "both");
    if (!o->impl_flash && !o->impl_standard)
        cli_usage_error(CMD, "--impl: '%s' is not flash, standard or both", value);
}

static void parse_window(const char *value, bench_options *o) {
    int64_t sides[CLI_MAX_LIST];
    int n = cli_parse_int_list(CMD, "--window", value, -1, INT32_MAX, sides);
    if (n != 2) cli_usage_error(CMD, "--window takes L,R (e.g. 128,0; -1 = unbounded)");
    o->use_window = 1;
    o->window_left = (int32_t)sides[0];
    o->window_right = (int32_t)sides[1];
}

/* Flags with a numeric (list) value; returns 1 when argv[*i] was one of them. */
static int parse_shape_flag(int argc, char **argv, int *i, bench_options *o) {
    static const int64_t big = (int64_t)1 << 40;
    const char *v;
    if ((v = cli_flag_value(CMD, argc, argv, i, "-b")) ||
        (v = cli_flag_value(CMD, argc, argv, i, "--batch")))
        parse_list("-b", v, 1, big, &o->b);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "--hq")))
        parse_list("--hq", v, 1, big, &o->hq);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "--hkv")))
        parse_list("--hkv", v, 1, big, &o->hkv);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "--sq")))
        parse_list("--sq", v, 1, big, &o->sq);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "--sk")))
        parse_list("--sk", v, 1, big, &o->sk);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "-d")) ||
             (v = cli_flag_value(CMD, argc, argv, i, "--d")))
        parse_list("-d", v, 1, FA_MAX_HEAD_DIM, &o->d);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "--dv")))
        parse_list("--dv", v, 1, FA_MAX_HEAD_DIM, &o->dv);
    else if ((v = cli_flag_value(CMD, argc, argv, i, "--tokens")))
        o->tokens = cli_parse_int(CMD, "--tokens", v, 1, big);
    else
        return 0;
    return 1;
}

/* Every other flag; returns 1 when argv[*i] was one of them. */
static int parse_run_flag(int argc, char **argv, int *i, bench_options *o) {
    const char *v;
    if ((v = cli_flag_value(CMD, argc, argv, i, "--device"))) {
        if (!cli_parse_device(v, &o->device))
            cli_usage_error(CMD, "--device: '%s' is not cpu or cuda", v);
        o->device_given = 1;
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--dtype"))) {
        parse_dtypes(v, o);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--mode"))) {
        parse_modes(v, o);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--causal"))) {
        parse_causal(v, o);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--window"))) {
        parse_window(v, o);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--impl"))) {
        parse_impl(v, o);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--threads"))) {
        o->threads = (int)cli_parse_int(CMD, "--threads", v, 0, 4096);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--repeats"))) {
        o->repeats = (int)cli_parse_int(CMD, "--repeats", v, 1, BENCH_MAX_REPEATS);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--warmup"))) {
        o->warmups = (int)cli_parse_int(CMD, "--warmup", v, 0, BENCH_MAX_REPEATS);
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--seed"))) {
        o->seed = (uint64_t)cli_parse_int(CMD, "--seed", v, 0, INT64_MAX);
    } else if (!strcmp(argv[*i], "--json")) {
        o->json = 1;
    } else if (!strcmp(argv[*i], "--deterministic")) {
        o->deterministic = 1;
    } else if ((v = cli_flag_value(CMD, argc, argv, i, "--dropout"))) {
        char *end = NULL;
        const double p = strtod(v, &end);
        if (end == v || *end != '\0' || !(p >= 0.0 && p < 1.0))
            cli_usage_error(CMD, "--dropout: '%s' is not a probability in [0, 1)", v);
        o->dropout_p = (float)p;
    } else if (!strcmp(argv[*i], "--gemm")) {
        o->gemm = 1;
    } else if (!strcmp(argv[*i], "--no-gemm")) {
        o->gemm = 0;
    } else {
        return 0;
    }
    return 1;
}

static void set_list(int_list *list, int count, const int64_t *values) {
    if (list->count) return;
    list->count = count;
    memcpy(list->values, values, (size_t)count * sizeof values[0]);
}

/* Fill what the flags left open: the device's default sweep when no shape flag was given. */
static void apply_defaults(bench_options *o, int shape_given, int gemm_given) {
    static const int64_t cpu_lengths[] = {256, 512, 1024, 2048, 4096, 8192};
    static const int64_t cuda_lengths[] = {512, 1024, 2048, 4096, 8192, 16384};
    static const int64_t both[] = {0, 1}, one[] = {1}, zero[] = {0};
    static const int64_t eight[] = {8}, sixteen[] = {16}, d64[] = {64}, d128[] = {128};
    static const int64_t one_k[] = {1024};
    int cuda = o->device == FA_DEVICE_CUDA;
    if (o->n_dtypes == 0) {
        o->dtypes[0] = cuda ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        o->n_dtypes = 1;
    }
    if (!shape_given) {
        if (cuda) {
            set_list(&o->sq, 6, cuda_lengths);
            set_list(&o->hq, 1, sixteen);
            set_list(&o->d, 1, d128);
            o->tokens = 16384;
            if (o->n_modes == 0) {
                o->modes[0] = BENCH_FWD;
                o->modes[1] = BENCH_BWD;
                o->n_modes = 2;
            }
        } else {
            set_list(&o->sq, 6, cpu_lengths);
            set_list(&o->hq, 1, eight);
            set_list(&o->d, 1, d64);
            if (!gemm_given) o->gemm = 1;
        }
        set_list(&o->causal, 2, both);
        o->standard_limit = DEFAULT_STANDARD_LIMIT;
    }
    set_list(&o->b, 1, one);
    set_list(&o->hq, 1, eight);
    set_list(&o->d, 1, d64);
    set_list(&o->sq, 1, one_k);
    set_list(&o->causal, 1, zero);
    if (o->n_modes == 0) {
        o->modes[0] = BENCH_FWD;
        o->n_modes = 1;
    }
    if (!o->impl_given) {
        o->impl_flash = 1;
        o->impl_standard = 1;
    }
    if (o->warmups < 0) o->warmups = cuda ? 3 : 1;
}

static void parse_options(int argc, char **argv, bench_options *o) {
    int shape_given = 0, gemm_given = 0;
    memset(o, 0, sizeof *o);
    o->seed = DEFAULT_SEED;
    o->warmups = -1;
    o->standard_limit = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 2.0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            exit(0);
        }
        if (!strcmp(argv[i], "--gemm") || !strcmp(argv[i], "--no-gemm")) gemm_given = 1;
        if (parse_shape_flag(argc, argv, &i, o)) {
            shape_given = 1;
        } else if (!parse_run_flag(argc, argv, &i, o)) {
            cli_usage_error(CMD, "unknown flag '%s'", argv[i]);
        }
    }
    if (!o->device_given) o->device = fa_cuda_available() ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
    apply_defaults(o, shape_given, gemm_given);
}

/* ---- the sweep ----------------------------------------------------------------------------- */

/* Bytes fa_standard_forward materialises: one fp32 sq×sk score matrix per busy worker. */
static double standard_bytes(const bench_case *c) {
    int64_t workers = c->threads_used < c->b * c->hq ? c->threads_used : c->b * c->hq;
    return (double)workers * (double)c->sq * (double)c->sk * 4.0;
}

static void measure_case(const bench_options *o, const bench_case *c, bench_result *r) {
    if (c->impl == IMPL_STANDARD && c->device == FA_DEVICE_CPU && c->mode == BENCH_FWD &&
        standard_bytes(c) > o->standard_limit) {
        char need[32], limit[32];
        memset(r, 0, sizeof *r);
        r->status = BENCH_SKIPPED;
        r->max_abs_err = -1.0;
        r->flops = bench_flops(c);
        snprintf(r->note, sizeof r->note, "would materialise %s of scores (limit %s)",
                 cli_format_bytes(standard_bytes(c), need, sizeof need),
                 cli_format_bytes(o->standard_limit, limit, sizeof limit));
        return;
    }
    if (c->device == FA_DEVICE_CUDA)
        bench_run_cuda(c, r);
    else
        bench_run_cpu(c, r);
}

/* Progress: on a terminal, a status line on stderr, rewritten in place; elsewhere (a pipe, a
 * log) the rows themselves, printed as each measurement finishes, and a line on stderr before a
 * measurement that follows a slow one (> SLOW_MEASUREMENT_S), so a log never stays silent for
 * long without saying what runs. */
#define SLOW_MEASUREMENT_S 2.0

typedef struct sweep_state {
    const bench_options *o;
    const gemm_result *gemm;
    int total, done, failures, progress;
    double last_seconds; /* wall time of the previous measurement */
    summary_row *rows;
    int n_rows;
} sweep_state;

static void show_progress(sweep_state *s, const bench_case *c) {
    if (!s->progress && s->last_seconds <= SLOW_MEASUREMENT_S) return;
    fprintf(stderr, "%s[%d/%d] %s %s %s sq=%lld sk=%lld causal=%d ...%s",
            s->progress ? "\r\033[K" : "", s->done + 1, s->total, bench_impl_name(c->impl),
            cli_dtype_name(c->dtype), bench_mode_name(c->mode), (long long)c->sq, (long long)c->sk,
            c->causal, s->progress ? "" : "\n");
    fflush(stderr);
}

static void clear_progress(const sweep_state *s) {
    if (s->progress) fprintf(stderr, "\r\033[K");
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One measurement with its progress line. */
static void measure_with_progress(sweep_state *s, const bench_case *c, bench_result *r) {
    show_progress(s, c);
    double t0 = wall_seconds();
    measure_case(s->o, c, r);
    s->last_seconds = wall_seconds() - t0;
    s->done++;
    clear_progress(s);
}

/* Standard attention runs next to the forward, or in every mode when --impl asked for it. */
static int wants_standard(const bench_options *o, const bench_case *c) {
    return o->impl_standard && (c->mode == BENCH_FWD || o->impl_given) && c->dropout_p == 0.0f;
}

static void count_configuration(sweep_state *s, bench_case c) {
    s->total += s->o->impl_flash + wants_standard(s->o, &c);
}

/* Measure every implementation of one configuration, then print them together so the flash row
 * can show its speed-up and memory saving over the standard row. */
static void run_configuration(sweep_state *s, bench_case base) {
    const bench_options *o = s->o;
    bench_result standard, flash;
    int have_standard = 0;
    memset(&standard, 0, sizeof standard);
    if (wants_standard(o, &base)) {
        bench_case std_case = base;
        std_case.impl = IMPL_STANDARD;
        measure_with_progress(s, &std_case, &standard);
        have_standard = 1;
        if (o->json) report_json(&std_case, &standard, s->gemm);
        else report_table_row(&std_case, &standard, NULL, s->gemm);
        s->failures += standard.status == BENCH_FAILED;
    }
    if (o->impl_flash) {
        base.impl = IMPL_FLASH;
        measure_with_progress(s, &base, &flash);
        if (o->json) report_json(&base, &flash, s->gemm);
        else report_table_row(&base, &flash, have_standard ? &standard : NULL, s->gemm);
        s->failures += flash.status == BENCH_FAILED;
    }
    if (have_standard && o->impl_flash && s->n_rows < MAX_RESULTS) {
        summary_row *row = &s->rows[s->n_rows++];
        row->c = base;
        row->flash = flash;
        row->standard = standard;
    }
}

/* Calls fn for every configuration of the sweep (sizes, mask, dtype, mode). */
static void for_each_configuration(const bench_options *o, sweep_state *s,
                                   void (*fn)(sweep_state *, bench_case)) {
    bench_case c;
    memset(&c, 0, sizeof c);
    c.device = o->device;
    c.use_window = o->use_window;
    c.window_left = o->use_window ? o->window_left : -1;
    c.window_right = o->use_window ? o->window_right : -1;
    c.threads = o->threads;
    c.threads_used = o->device == FA_DEVICE_CUDA ? 0 : o->threads ? o->threads : cli_cpu_count();
    c.repeats = o->repeats;
    c.warmups = o->warmups;
    c.seed = o->seed;
    c.deterministic = o->deterministic;
    c.dropout_p = o->dropout_p;
    int n_sk = o->sk.count ? o->sk.count : 1;
    for (int t = 0; t < o->n_dtypes; t++)
    for (int m = 0; m < o->n_modes; m++)
    for (int ca = 0; ca < o->causal.count; ca++)
    for (int bi = 0; bi < o->b.count; bi++)
    for (int h = 0; h < o->hq.count; h++)
    for (int hk = 0; hk < (o->hkv.count ? o->hkv.count : 1); hk++)
    for (int di = 0; di < o->d.count; di++)
    for (int dvi = 0; dvi < (o->dv.count ? o->dv.count : 1); dvi++)
    for (int qi = 0; qi < o->sq.count; qi++)
    for (int ki = 0; ki < n_sk; ki++) {
        c.dtype = o->dtypes[t];
        c.mode = o->modes[m];
        c.causal = (int)o->causal.values[ca];
        c.sq = o->sq.values[qi];
        c.sk = o->sk.count ? o->sk.values[ki] : c.sq;
        c.b = o->tokens > 0 ? (o->tokens / c.sq > 0 ? o->tokens / c.sq : 1) : o->b.values[bi];
        c.hq = o->hq.values[h];
        c.hkv = o->hkv.count ? o->hkv.values[hk] : c.hq;
        c.d = o->d.values[di];
        c.dv = o->dv.count ? o->dv.values[dvi] : c.d;
        fn(s, c);
    }
}

static void print_summary(const sweep_state *s) {
    if (s->n_rows == 0) return;
    printf("\nflashattn vs standard attention (same inputs, same threads):\n");
    printf("%-6s %-6s %6s %6s %10s %12s %12s %9s\n", "mode", "causal", "sq", "sk", "speed-up",
           "std mem", "flash mem", "mem-save");
    for (int i = 0; i < s->n_rows; i++) {
        const summary_row *row = &s->rows[i];
        char std_mem[32], flash_mem[32], saving[16];
        if (row->flash.status != BENCH_OK || row->standard.status != BENCH_OK) continue;
        printf("%-6s %-6d %6lld %6lld %9.2fx %12s %12s %9s\n", bench_mode_name(row->c.mode),
               row->c.causal, (long long)row->c.sq, (long long)row->c.sk,
               row->standard.ms / row->flash.ms,
               cli_format_bytes((double)row->standard.extra_mem_bytes, std_mem, sizeof std_mem),
               cli_format_bytes((double)row->flash.extra_mem_bytes, flash_mem, sizeof flash_mem),
               bench_format_ratio((double)row->standard.extra_mem_bytes,
                                  (double)row->flash.extra_mem_bytes, saving, sizeof saving));
    }
}

static void print_banner(const bench_options *o, int threads) {
    printf("flashattn %s bench on %s", fa_version(), cli_device_name(o->device));
    if (o->device == FA_DEVICE_CPU)
        printf(" (%s, %d thread%s)", fa_cpu_isa(), threads, threads == 1 ? "" : "s");
    printf("; FLOP/s: FlashAttention convention (see --help); extra mem: %s\n",
           o->device == FA_DEVICE_CUDA ? "workspace + cudaMemGetInfo drop"
                                       : "peak RSS increase of the call");
}

/* --mode decode (KV-cache decoding) has flags and a report of its own: bench_decode.c. */
static int wants_decode(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--mode=decode")) return 1;
        if (!strcmp(argv[i], "--mode") && i + 1 < argc && !strcmp(argv[i + 1], "decode")) return 1;
    }
    return 0;
}

int bench_main(int argc, char **argv) {
    if (wants_decode(argc, argv)) return bench_decode_main(argc, argv);
    bench_options o;
    parse_options(argc, argv, &o);
    if (o.device == FA_DEVICE_CUDA && o.impl_flash && !fa_cuda_available()) {
        fa_params probe = {0};
        probe.device = FA_DEVICE_CUDA;
        fprintf(stderr, "flashattn bench: CUDA is not available (%s)\n",
                fa_check_forward(&probe, NULL) == FA_ERR_DEVICE ? fa_last_error()
                                                                : "no usable GPU");
        return 1;
    }
    int threads = o.threads ? o.threads : cli_cpu_count();
    gemm_result gemm;
    memset(&gemm, 0, sizeof gemm);
    if (!o.json) print_banner(&o, threads);
    if (o.gemm) {
        gemm_measure(DEFAULT_GEMM_N, threads, &gemm);
        if (o.json) report_json_gemm(&gemm, threads);
        else report_gemm_line(&gemm, threads);
    }
    sweep_state s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    s.gemm = o.gemm ? &gemm : NULL;
    for_each_configuration(&o, &s, count_configuration);
    s.progress = isatty(STDERR_FILENO);
    s.rows = calloc(MAX_RESULTS, sizeof *s.rows);
    if (!s.rows) {
        fprintf(stderr, "flashattn bench: out of memory\n");
        return 1;
    }
    if (!o.json) report_table_header(o.device, s.gemm);
    for_each_configuration(&o, &s, run_configuration);
    if (!o.json) print_summary(&s);
    free(s.rows);
    return s.failures ? 1 : 0;
}
