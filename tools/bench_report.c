/*
 * bench_report.c: output of `flashattn bench`: an aligned table for people, or one JSON object
 * per measurement per line (--json) for scripts.
 */
#include <stdio.h>
#include <string.h>

#include "bench_report.h"
#include "cli.h"

const char *bench_impl_name(bench_impl impl) {
    return impl == IMPL_STANDARD ? "standard" : "flashattn";
}

const char *bench_mode_name(bench_mode mode) {
    return mode == BENCH_BWD ? "bwd" : mode == BENCH_FWDBWD ? "fwdbwd" : "fwd";
}

static const char *mem_source_name(bench_mem_source source) {
    return source == MEM_WORKSPACE ? "workspace" : source == MEM_CUDA ? "cuda" : "rss";
}

static const char *status_name(bench_status status) {
    return status == BENCH_SKIPPED ? "skipped" : status == BENCH_FAILED ? "failed" : "ok";
}

const char *bench_format_ratio(double numerator, double denominator, char *buf, size_t size) {
    if (denominator <= 0.0)
        snprintf(buf, size, numerator > 0.0 ? "inf" : "-");
    else
        snprintf(buf, size, numerator / denominator >= 100.0 ? "%.0fx" : "%.1fx",
                 numerator / denominator);
    return buf;
}

/* Print s as a JSON string literal. */
static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* A double as JSON: non-finite or "not computed" (< 0 when allowed) becomes null. */
static void json_number(const char *key, double value, int negative_is_null) {
    printf(",\"%s\":", key);
    if (value != value || value > 1e308 || value < -1e308 || (negative_is_null && value < 0.0))
        printf("null");
    else
        printf("%.6g", value);
}

void report_json(const bench_case *c, const bench_result *r, const gemm_result *g) {
    int ok = r->status == BENCH_OK;
    double seconds = r->ms * 1e-3;
    double flops_per_s = ok && seconds > 0.0 ? r->flops / seconds : -1.0;
    printf("{\"impl\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"mode\":\"%s\"",
           bench_impl_name(c->impl), cli_device_name(c->device), cli_dtype_name(c->dtype),
           bench_mode_name(c->mode));
    printf(",\"b\":%lld,\"hq\":%lld,\"hkv\":%lld,\"sq\":%lld,\"sk\":%lld,\"d\":%lld,\"dv\":%lld",
           (long long)c->b, (long long)c->hq, (long long)c->hkv, (long long)c->sq,
           (long long)c->sk, (long long)c->d, (long long)c->dv);
    printf(",\"causal\":%d,\"window_left\":%d,\"window_right\":%d,\"threads\":%d,\"dropout_p\":%g",
           c->causal, c->use_window ? (int)c->window_left : -1,
           c->use_window ? (int)c->window_right : -1, c->threads_used, (double)c->dropout_p);
    printf(",\"status\":\"%s\"", status_name(r->status));
    json_number("ms", ok ? r->ms : -1.0, 1);
    json_number("tflops", flops_per_s * 1e-12, 1);
    json_number("gflops", flops_per_s * 1e-9, 1);
    json_number("flop", r->flops, 0);
    printf(",\"timed_calls\":%d", r->timed_calls);
    if (ok) {
        printf(",\"extra_mem_bytes\":%zu,\"extra_mem_source\":\"%s\",\"workspace_bytes\":%zu",
               r->extra_mem_bytes, mem_source_name(r->mem_source), r->workspace_bytes);
        if (r->mem_source == MEM_CUDA)
            printf(",\"device_mem_delta_bytes\":%lld", (long long)r->device_mem_delta);
    } else {
        printf(",\"extra_mem_bytes\":null");
    }
    json_number("max_abs_err", r->max_abs_err, 1);
    if (r->err_tensor[0]) printf(",\"err_tensor\":\"%s\"", r->err_tensor);
    if (ok && g && g->found && g->gflops > 0.0)
        json_number("ratio_to_sgemm", flops_per_s * 1e-9 / g->gflops, 1);
    if (r->note[0]) {
        printf(",\"note\":");
        json_string(r->note);
    }
    printf("}\n");
    fflush(stdout);
}

void report_json_gemm(const gemm_result *g, int threads) {
    printf("{\"impl\":\"sgemm\",\"device\":\"cpu\",\"dtype\":\"f32\",\"n\":%d,\"threads\":%d", g->n,
           threads);
    printf(",\"status\":\"%s\",\"library\":", g->found && g->gflops > 0.0 ? "ok" : "skipped");
    json_string(g->found ? g->library : "");
    json_number("ms", g->found ? g->ms : -1.0, 1);
    json_number("gflops", g->found ? g->gflops : -1.0, 1);
    json_number("tflops", g->found ? g->gflops * 1e-3 : -1.0, 1);
    if (g->note[0]) {
        printf(",\"note\":");
        json_string(g->note);
    }
    printf("}\n");
    fflush(stdout);
}

void report_table_header(fa_device device, const gemm_result *g) {
    printf("%-9s %-4s %-6s %3s %4s %4s %6s %6s %4s %4s %3s %3s %10s %9s %11s %9s %8s %8s",
           "impl", "type", "mode", "b", "hq", "hkv", "sq", "sk", "d", "dv", "cau", "thr", "ms",
           device == FA_DEVICE_CUDA ? "TFLOP/s" : "GFLOP/s", "extra mem", "max|err|",
           "speed-up", "mem-save");
    if (g && g->found && g->gflops > 0.0) printf(" %8s", "of sgemm");
    printf("\n");
    fflush(stdout);
}

static void print_case_columns(const bench_case *c) {
    printf("%-9s %-4s %-6s %3lld %4lld %4lld %6lld %6lld %4lld %4lld %3d %3d",
           bench_impl_name(c->impl), cli_dtype_name(c->dtype), bench_mode_name(c->mode),
           (long long)c->b, (long long)c->hq, (long long)c->hkv, (long long)c->sq,
           (long long)c->sk, (long long)c->d, (long long)c->dv, c->causal, c->threads_used);
}

void report_table_row(const bench_case *c, const bench_result *r, const bench_result *baseline,
                      const gemm_result *g) {
    char mem[32], err[16];
    print_case_columns(c);
    if (r->status != BENCH_OK) {
        printf("  %s: %s\n", status_name(r->status), r->note);
        return;
    }
    double rate = r->flops / (r->ms * 1e-3);
    double shown = c->device == FA_DEVICE_CUDA ? rate * 1e-12 : rate * 1e-9;
    if (r->max_abs_err >= 0.0)
        snprintf(err, sizeof err, "%.1e", r->max_abs_err);
    else
        snprintf(err, sizeof err, "-");
    printf(" %10.3f %9.1f %11s %9s", r->ms, shown,
           cli_format_bytes((double)r->extra_mem_bytes, mem, sizeof mem), err);
    int with_gemm = g && g->found && g->gflops > 0.0;
    if (baseline && baseline->status == BENCH_OK && r != baseline) {
        char saving[16];
        printf(" %7.2fx %8s", baseline->ms / r->ms,
               bench_format_ratio((double)baseline->extra_mem_bytes, (double)r->extra_mem_bytes,
                                  saving, sizeof saving));
    } else if (with_gemm) {
        printf(" %8s %8s", "-", "-"); /* keeps the "of sgemm" column under its header */
    }
    if (with_gemm) printf(" %8.2f", rate * 1e-9 / g->gflops);
    if (r->mem_source == MEM_WORKSPACE) printf("  [mem: workspace, no /proc]");
    if (r->note[0]) printf("  [%s]", r->note);
    printf("\n");
    fflush(stdout);
}

void report_gemm_line(const gemm_result *g, int threads) {
    if (!g->found || g->gflops <= 0.0) {
        printf("sgemm reference: %s\n", g->note[0] ? g->note : "no BLAS found");
        return;
    }
    printf("sgemm reference: n=%d fp32, %s, %d thread%s: %.1f ms, %.1f GFLOP/s%s%s\n", g->n,
           g->library, threads, threads == 1 ? "" : "s", g->ms, g->gflops,
           g->note[0] ? "  " : "", g->note);
}
