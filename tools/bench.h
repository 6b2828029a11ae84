/*
 * bench.h: the entry points of `flashattn bench`. Its pieces, each depending only on the headers
 * below it:
 *   bench_cmd.c     flag parsing, the configuration sweep, the default sweeps (bench_run.h,
 *                   bench_report.h)
 *   bench_decode.c  `--mode decode`: fa_kvcache_forward bandwidth
 *   bench_report.c  the aligned table and the JSON lines (bench_report.h)
 *   bench_cpu.c, bench_cuda.c, gemm_ref.c: the measurements (bench_run.h)
 *   bench_tensors.c, bench_sample.c: one case's tensors, FLOPs and sampled error (bench_case.h)
 */
#ifndef FA_TOOL_BENCH_H
#define FA_TOOL_BENCH_H

/* `flashattn bench` (bench_cmd.c). */
int bench_main(int argc, char **argv);

/* `flashattn bench --mode decode` (bench_decode.c): fa_kvcache_forward bandwidth. */
int bench_decode_main(int argc, char **argv);

#endif /* FA_TOOL_BENCH_H */
