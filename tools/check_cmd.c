/*
 * check_cmd.c: `flashattn check`: parses the flags into fa_sweep_options and runs fa_sweep_run
 * (oracle/sweep.c), which prints one line per case and direction and a summary.
 * Exit status: 0 all passed, 1 a check failed or the sweep could not run, 2 a usage error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle/sweep.h"
#include "check.h"
#include "cli.h"

#define CMD "check"

static void print_help(void) {
    printf("usage: flashattn check [flags]\n"
           "\n"
           "Randomised correctness sweep: forward and backward on random problems (odd lengths,\n"
           "sq != sk, GQA, varlen with empty sequences, masks, softcap, ALiBi, sinks, strided\n"
           "layouts) against a float64 reference. A check passes when its error is at most twice\n"
           "that of standard attention computed in the input dtype, plus a tiny floor.\n"
           "\n"
           "flags:\n"
           "  --device cpu|cuda   device to check (default cpu)\n"
           "  --quick             a few dozen small cases, seconds (default)\n"
           "  --full              hundreds of cases up to 1023 tokens and d = 256, minutes\n"
           "  --dtype f32|f16|bf16|e4m3  only this dtype (default: every dtype the device takes;\n"
           "                      e4m3: fp8 inputs, forward and backward)\n"
           "  --seed N            reproduce a run (default: a fresh seed, printed)\n"
           "  --threads N         CPU worker threads (default 0 = all cores)\n"
           "  --only attention|kvcache  only the fa_forward / fa_backward cases, or only the\n"
           "                      KV-cache decoding cases (fa_kvcache_forward: contiguous and\n"
           "                      paged caches, appends, rotary, splits) and fa_merge_states\n"
           "                      cases (default: all)\n"
           "  -v, --verbose       also print tolerances and errors of passing cases\n"
           "\n"
           "Exit status: 0 when every check passed, 1 otherwise, 2 for a usage error.\n");
}

static void parse_options(int argc, char **argv, fa_sweep_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->device = FA_DEVICE_CPU;
    opt->level = FA_SWEEP_QUICK;
    opt->dtype_filter = -1;
    for (int i = 0; i < argc; i++) {
        const char *v;
        fa_dtype dtype;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            exit(0);
        } else if (!strcmp(argv[i], "--quick")) {
            opt->level = FA_SWEEP_QUICK;
        } else if (!strcmp(argv[i], "--full")) {
            opt->level = FA_SWEEP_FULL;
        } else if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
            opt->verbose = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--device"))) {
            if (!cli_parse_device(v, &opt->device))
                cli_usage_error(CMD, "--device: '%s' is not cpu or cuda", v);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--dtype"))) {
            if (!strcmp(v, "e4m3") || !strcmp(v, "fp8"))
                dtype = FA_DTYPE_FP8_E4M3;
            else if (!cli_parse_dtype(v, &dtype))
                cli_usage_error(CMD, "--dtype: '%s' is not f32, f16, bf16 or e4m3", v);
            opt->dtype_filter = (int)dtype;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--seed"))) {
            opt->seed = (uint64_t)cli_parse_int(CMD, "--seed", v, 0, INT64_MAX);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--threads"))) {
            opt->num_threads = (int)cli_parse_int(CMD, "--threads", v, 0, 4096);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--only"))) {
            if (!strcmp(v, "attention"))
                opt->only = FA_SWEEP_ATTENTION;
            else if (!strcmp(v, "kvcache"))
                opt->only = FA_SWEEP_KVCACHE;
            else
                cli_usage_error(CMD, "--only: '%s' is not attention or kvcache", v);
        } else {
            cli_usage_error(CMD, "unknown flag '%s'", argv[i]);
        }
    }
    if (opt->device == FA_DEVICE_CUDA && opt->dtype_filter == FA_DTYPE_F32)
        cli_usage_error(CMD, "--dtype f32 is CPU-only (the CUDA path takes f16 and bf16)");
}

int check_main(int argc, char **argv) {
    fa_sweep_options opt;
    int n_pass = 0, n_fail = 0;
    parse_options(argc, argv, &opt);
    int status = fa_sweep_run(&opt, stdout, &n_pass, &n_fail);
    fflush(stdout);
    return status == 0 && n_fail == 0 ? 0 : 1;
}
