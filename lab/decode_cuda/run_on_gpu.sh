#!/bin/bash
# One device call for the CUDA KV-cache path: build the library (sm_90 only, build-dec/), the
# correctness sweep (check_kv.py), compute-sanitizer on san_kv (memcheck, racecheck, synccheck,
# initcheck) and the decode bench (bench_kv). Each step runs even if an earlier one failed.
# Usage (repository root, on the GPU machine): bash lab/decode_cuda/run_on_gpu.sh [check|san|bench|all]
# Logs go to $OUT/decode_cuda (or /tmp/decode_cuda).
export PYTHONUNBUFFERED=1
OUTDIR=${OUT:-/tmp}/decode_cuda
MODE=${1:-all}
BUILD=build-dec
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if ! make BUILD=$BUILD CUDA_ARCHS=90 -j"$(nproc)" lib > "$OUTDIR/build.log" 2>&1; then
    tail -40 "$OUTDIR/build.log"; exit 1
fi
LINK="$BUILD/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" lab/decode_cuda/san_kv.c $LINK -o $BUILD/san_kv || exit 1
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" lab/decode_cuda/bench_kv.c $LINK -o $BUILD/bench_kv || exit 1
rc=0
if [ "$MODE" = all ] || [ "$MODE" = check ]; then
    timeout 300 python3 lab/decode_cuda/check_kv.py $BUILD/libflashattn.so > "$OUTDIR/check.log" 2>&1 || rc=1
    grep -v "^PASS" "$OUTDIR/check.log" | tail -40
fi
if [ "$MODE" = all ] || [ "$MODE" = san ]; then
    $BUILD/san_kv > "$OUTDIR/san_plain.log" 2>&1 || rc=1
    tail -3 "$OUTDIR/san_plain.log"
    SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
    for tool in memcheck racecheck synccheck initcheck; do
        timeout 240 "$SAN" --tool $tool --error-exitcode 3 $BUILD/san_kv > "$OUTDIR/$tool.log" 2>&1 || rc=1
        echo "$tool:"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|san_kv:" "$OUTDIR/$tool.log" | tail -3
    done
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    timeout 200 $BUILD/bench_kv 0 30 > "$OUTDIR/bench.log" 2>&1 || rc=1
    cat "$OUTDIR/bench.log"
fi
exit $rc
