/*
 * flashattn.c: the `flashattn` command-line tool.
 *
 *   flashattn check    randomised correctness sweep against the float64 reference (check_cmd.c)
 *   flashattn bench    timing, FLOP/s, extra memory and accuracy of flash vs standard attention
 *                      (bench_cmd.c and the bench_*.c files it uses)
 *   flashattn version  library version, CPU ISA, CUDA availability
 *
 * Exit status: 0 success, 1 a failed check or measurement, 2 a usage error.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "check.h"
#include "cli.h"
#include "cudart.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: flashattn <command> [flags]\n"
            "\n"
            "commands:\n"
            "  check     run the randomised correctness sweep against the float64 reference\n"
            "  bench     time flash attention against standard attention (speed, memory, error)\n"
            "  version   library version, CPU SIMD level, CUDA availability\n"
            "\n"
            "'flashattn <command> --help' describes a command's flags.\n");
}

static int version_main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") && strcmp(argv[i], "-h"))
            cli_usage_error("version", "unknown flag '%s'", argv[i]);
        printf("usage: flashattn version\n");
        return 0;
    }
    printf("flashattn %s\n", fa_version());
    printf("cpu: %s, %d core%s\n", fa_cpu_isa(), cli_cpu_count(), cli_cpu_count() == 1 ? "" : "s");
    if (!fa_cuda_available()) {
        fa_params probe = {0};
        probe.device = FA_DEVICE_CUDA;
        int device_error = fa_check_forward(&probe, NULL) == FA_ERR_DEVICE;
        printf("cuda: not available%s%s%s\n", device_error ? " (" : "",
               device_error ? fa_last_error() : "", device_error ? ")" : "");
        return 0;
    }
    char why[256], name[256];
    const cudart_api *rt = cudart_load(why, sizeof why);
    if (!rt) {
        printf("cuda: available to the library, but the tool cannot load the runtime: %s\n", why);
        return 0;
    }
    int device = 0, major = 0, minor = 0, sms = 0, runtime = 0;
    rt->get_device(&device);
    rt->device_get_attribute(&major, CUDART_ATTR_CC_MAJOR, device);
    rt->device_get_attribute(&minor, CUDART_ATTR_CC_MINOR, device);
    rt->device_get_attribute(&sms, CUDART_ATTR_SM_COUNT, device);
    rt->runtime_get_version(&runtime);
    printf("cuda: available: device %d %s, sm_%d%d, %d SMs (runtime %d.%d, %s)\n", device,
           cudart_device_name(rt, name, sizeof name), major, minor, sms, runtime / 1000,
           runtime % 1000 / 10, rt->library);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *command = argv[1];
    if (!strcmp(command, "--help") || !strcmp(command, "-h") || !strcmp(command, "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(command, "version") || !strcmp(command, "--version"))
        return version_main(argc - 2, argv + 2);
    if (!strcmp(command, "check")) return check_main(argc - 2, argv + 2);
    if (!strcmp(command, "bench")) return bench_main(argc - 2, argv + 2);
    fprintf(stderr, "flashattn: unknown command '%s'\n", command);
    print_usage(stderr);
    return CLI_EXIT_USAGE;
}
