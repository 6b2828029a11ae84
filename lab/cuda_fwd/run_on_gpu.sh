#!/bin/bash
# One device call: build the lab library, correctness sweep, compute-sanitizer, timing vs SDPA.
# Usage (device): bash lab/cuda_fwd/run_on_gpu.sh [check|bench|all] [bench d list] [bench s list]
# Logs go to $OUT (or /tmp/fwd_out).
export PYTHONUNBUFFERED=1
OUTDIR=${OUT:-/tmp/fwd_out}
MODE=${1:-all}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if ! sh lab/cuda_fwd/build_lab.sh build-lab 90 > "$OUTDIR/build.log" 2>&1; then
    tail -40 "$OUTDIR/build.log"; exit 1
fi
rc=0
if [ "$MODE" = all ] || [ "$MODE" = check ]; then
    python3 lab/cuda_fwd/check_fwd.py build-lab/liblabfwd.so > "$OUTDIR/check.log" 2>&1 || rc=1
    grep -v "^ok" "$OUTDIR/check.log" | tail -40
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 build-lab/san_fwd > "$OUTDIR/memcheck.log" 2>&1 || rc=1
    echo "memcheck:"; tail -4 "$OUTDIR/memcheck.log"
    timeout 200 compute-sanitizer --tool racecheck --error-exitcode 3 build-lab/san_fwd > "$OUTDIR/racecheck.log" 2>&1 || rc=1
    echo "racecheck:"; tail -4 "$OUTDIR/racecheck.log"
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    D=${2:-64,128,256}; S=${3:-512,1024,2048,4096,8192,16384}
    python3 lab/cuda_fwd/bench_fwd.py build-lab/liblabfwd.so $D $S ours,fa2 > "$OUTDIR/bench.log" 2>&1 || rc=1
    grep -v "^d=" "$OUTDIR/bench.log" | tail -40
    # cuDNN in its own process: a crash there must not lose the numbers above
    python3 lab/cuda_fwd/bench_fwd.py build-lab/liblabfwd.so $D $S cudnn > "$OUTDIR/bench_cudnn.log" 2>&1 || echo "cudnn bench failed"
    grep -v "^d=" "$OUTDIR/bench_cudnn.log" | tail -40 | cut -d'|' -f2,3,4,7
fi
exit $rc
