/*
 * cli.h: small functions shared by the `flashattn` sub-commands: usage errors (exit status 2),
 * flag matching ("--sq 512" and "--sq=512"), integer and list parsing, dtype/device names.
 */
#ifndef FA_CLI_H
#define FA_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#define CLI_EXIT_USAGE 2
#define CLI_MAX_LIST 32 /* most values one list flag (--sq 256,512,...) accepts */

/* Print "flashattn <command>: <message>" and a hint to stderr, then exit with status 2. */
void cli_usage_error(const char *command, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3), noreturn))
#endif
    ;

/* If argv[*i] is `name` or `name=VALUE`, return the value (consuming argv[*i + 1] for the first
 * form) and advance *i past it; return NULL when argv[*i] is another flag. A flag given without
 * its value is a usage error. */
const char *cli_flag_value(const char *command, int argc, char **argv, int *i, const char *name);

/* Parse a decimal integer in [min, max] given to `flag`; anything else is a usage error. */
int64_t cli_parse_int(const char *command, const char *flag, const char *text, int64_t min,
                      int64_t max);

/* Parse "a,b,c" into out[] (at most CLI_MAX_LIST values, each in [min, max]); returns the count. */
int cli_parse_int_list(const char *command, const char *flag, const char *text, int64_t min,
                       int64_t max, int64_t *out);

/* dtype names: "f32", "f16", "bf16" (also "fp32", "float32", "fp16", "float16", "bfloat16"). */
int cli_parse_dtype(const char *text, fa_dtype *dtype);
const char *cli_dtype_name(fa_dtype dtype);
size_t cli_dtype_size(fa_dtype dtype);

/* device names: "cpu", "cuda". */
int cli_parse_device(const char *text, fa_device *device);
const char *cli_device_name(fa_device device);

/* CPU cores this process may run on (at least 1). */
int cli_cpu_count(void);

/* Human-readable byte count ("12.3 MB") into buf. */
const char *cli_format_bytes(double bytes, char *buf, size_t size);

#endif /* FA_CLI_H */
