/*
 * bench_report.h: the aligned table and the JSON lines of `flashattn bench` (bench_report.c).
 */
#ifndef FA_TOOL_BENCH_REPORT_H
#define FA_TOOL_BENCH_REPORT_H

#include <stddef.h>

#include "bench_run.h"

const char *bench_impl_name(bench_impl impl);
const char *bench_mode_name(bench_mode mode);
void report_json(const bench_case *c, const bench_result *r, const gemm_result *g);
void report_json_gemm(const gemm_result *g, int threads);
void report_table_header(fa_device device, const gemm_result *g);
/* `baseline`: the standard result of the same configuration, or NULL (speed-up/memory columns). */
void report_table_row(const bench_case *c, const bench_result *r, const bench_result *baseline,
                      const gemm_result *g);
void report_gemm_line(const gemm_result *g, int threads);

/* numerator / denominator as "12.3x" ("inf" when the denominator is 0). */
const char *bench_format_ratio(double numerator, double denominator, char *buf, size_t size);

#endif /* FA_TOOL_BENCH_REPORT_H */
