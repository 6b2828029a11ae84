/*
 * cli.c: usage errors, flag matching and value parsing for the `flashattn` tool (see cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_usage_error(const char *command, const char *fmt, ...) {
    va_list args;
    fprintf(stderr, "flashattn %s: ", command);
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\nTry 'flashattn %s --help'.\n", command);
    exit(CLI_EXIT_USAGE);
}

const char *cli_flag_value(const char *command, int argc, char **argv, int *i, const char *name) {
    const char *arg = argv[*i];
    size_t len = strlen(name);
    if (strncmp(arg, name, len) != 0) return NULL;
    if (arg[len] == '=') return arg + len + 1;
    if (arg[len] != '\0') return NULL;
    if (*i + 1 >= argc) cli_usage_error(command, "%s needs a value", name);
    *i += 1;
    return argv[*i];
}

int64_t cli_parse_int(const char *command, const char *flag, const char *text, int64_t min,
                      int64_t max) {
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        cli_usage_error(command, "%s: '%s' is not an integer", flag, text);
    if (value < min || value > max)
        cli_usage_error(command, "%s: %lld is out of range [%lld, %lld]", flag, value,
                        (long long)min, (long long)max);
    return (int64_t)value;
}

int cli_parse_int_list(const char *command, const char *flag, const char *text, int64_t min,
                       int64_t max, int64_t *out) {
    char item[64];
    int count = 0;
    const char *cursor = text;
    for (;;) {
        const char *comma = strchr(cursor, ',');
        size_t len = comma ? (size_t)(comma - cursor) : strlen(cursor);
        if (len == 0 || len >= sizeof item)
            cli_usage_error(command, "%s: bad list '%s' (expected e.g. 512,1024)", flag, text);
        if (count == CLI_MAX_LIST)
            cli_usage_error(command, "%s: at most %d values", flag, CLI_MAX_LIST);
        memcpy(item, cursor, len);
        item[len] = '\0';
        out[count++] = cli_parse_int(command, flag, item, min, max);
        if (!comma) break;
        cursor = comma + 1;
    }
    return count;
}

int cli_parse_dtype(const char *text, fa_dtype *dtype) {
    if (!strcmp(text, "f32") || !strcmp(text, "fp32") || !strcmp(text, "float32")) {
        *dtype = FA_DTYPE_F32;
    } else if (!strcmp(text, "f16") || !strcmp(text, "fp16") || !strcmp(text, "float16")) {
        *dtype = FA_DTYPE_F16;
    } else if (!strcmp(text, "bf16") || !strcmp(text, "bfloat16")) {
        *dtype = FA_DTYPE_BF16;
    } else {
        return 0;
    }
    return 1;
}

const char *cli_dtype_name(fa_dtype dtype) {
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_FP8_E4M3: return "e4m3";
    }
    return "?";
}

size_t cli_dtype_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : 2; }

int cli_parse_device(const char *text, fa_device *device) {
    if (!strcmp(text, "cpu")) {
        *device = FA_DEVICE_CPU;
    } else if (!strcmp(text, "cuda") || !strcmp(text, "gpu")) {
        *device = FA_DEVICE_CUDA;
    } else {
        return 0;
    }
    return 1;
}

const char *cli_device_name(fa_device device) { return device == FA_DEVICE_CUDA ? "cuda" : "cpu"; }

int cli_cpu_count(void) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0)
        return CPU_COUNT(&allowed);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

const char *cli_format_bytes(double bytes, char *buf, size_t size) {
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 4) {
        bytes /= 1024.0;
        unit++;
    }
    snprintf(buf, size, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
    return buf;
}
