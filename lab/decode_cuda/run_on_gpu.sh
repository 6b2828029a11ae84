#!/bin/bash
# One device call for the CUDA KV-cache path: build the library (sm_90 only, build-dec/), the
# correctness sweep (check_kv.py), compute-sanitizer on san_kv, the decode bench (bench_kv) and,
# with ncu, the decode kernels' own durations. Each step runs even if an earlier one failed; the
# bench table comes last.
# Usage (repository root, on the GPU machine): bash lab/decode_cuda/run_on_gpu.sh [check|san|bench|all]
#   SAN_TOOLS="memcheck racecheck synccheck initcheck" (default memcheck racecheck)
#   BASE=<dir with a libflashattn.a built from another revision>: its bench runs first, for an
#   A/B comparison in one call (e.g. a copy of an earlier build carried along).
# Logs go to /tmp/decode_cuda, packed into $OUT/decode_cuda_logs.tgz at the end (a call returns at
# most 8 files).
export PYTHONUNBUFFERED=1
OUTDIR=/tmp/decode_cuda
MODE=${1:-all}
BUILD=build-dec
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SAN_TOOLS=${SAN_TOOLS:-memcheck racecheck}
mkdir -p "$OUTDIR"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if ! make BUILD=$BUILD CUDA_ARCHS=90 -j"$(nproc)" lib > "$OUTDIR/build.log" 2>&1; then
    tail -40 "$OUTDIR/build.log"; exit 1
fi
stamp built
LIBS="-L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" lab/decode_cuda/san_kv.c $BUILD/libflashattn.a $LIBS -o $BUILD/san_kv || exit 1
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" lab/decode_cuda/bench_kv.c $BUILD/libflashattn.a $LIBS -o $BUILD/bench_kv || exit 1
if [ -n "$BASE" ]; then
    cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" lab/decode_cuda/bench_kv.c "$BASE/libflashattn.a" $LIBS \
        -o $BUILD/bench_base || exit 1
fi
rc=0
if [ "$MODE" = all ] || [ "$MODE" = check ]; then
    timeout 200 python3 lab/decode_cuda/check_kv.py $BUILD/libflashattn.so > "$OUTDIR/check.log" 2>&1 || rc=1
    grep -v "^PASS" "$OUTDIR/check.log" | tail -30
    stamp checked
fi
if [ "$MODE" = all ] || [ "$MODE" = san ]; then
    $BUILD/san_kv > "$OUTDIR/san_plain.log" 2>&1 || rc=1
    tail -2 "$OUTDIR/san_plain.log"
    SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
    for tool in $SAN_TOOLS; do
        timeout 120 "$SAN" --tool $tool --error-exitcode 3 $BUILD/san_kv > "$OUTDIR/$tool.log" 2>&1 || rc=1
        echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUTDIR/$tool.log" | tail -1)"
    done
    stamp sanitized
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for exe in ${BASE:+bench_base} bench_kv; do
        # ncu flushes and invalidates the caches before each kernel: clean cold L2
        timeout 60 "$NCU" --clock-control none --metrics gpu__time_duration.sum -k regex:fa_ $BUILD/$exe ncu \
            > "$OUTDIR/ncu_$exe.log" 2>&1
        echo "$exe kernels (ncu, clean L2):"
        grep -E "^  [a-z_]+|gpu__time_duration" "$OUTDIR/ncu_$exe.log" | sed 's/(fa_[a-z_]*params).*//' | paste - - |
            awk '{print "   ", $1, $2, $(NF-1), $NF}' | tail -6
        # SM / memory clocks sampled every 20 ms while the detail bench runs (clocks are left alone)
        nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader,nounits -lms 20 > "$OUTDIR/clocks_$exe.log" &
        sampler=$!
        timeout 60 $BUILD/$exe detail 20 > "$OUTDIR/detail_$exe.log" 2>&1 || rc=1
        kill $sampler
        echo "== $exe detail (SM clock MHz while it ran: min / median / max" \
            "$(cut -d, -f1 "$OUTDIR/clocks_$exe.log" | sort -n | awk '{a[NR]=$1} END {print a[1], a[int((NR+1)/2)], a[NR]}'))"
        cat "$OUTDIR/detail_$exe.log"
    done
    stamp detail
    # where the 1 x 8k kernel's time goes: one launch, ncu's throughput and warp-stall sections
    timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
        -k regex:fa_kv --launch-skip 3 --launch-count 1 $BUILD/bench_kv ncu > "$OUTDIR/ncu_sections.log" 2>&1
    echo "== bench_kv 1 x 8k kernel (ncu sections)"
    grep -E "Duration|Throughput|Warp Cycles Per|Achieved Occupancy|Theoretical Occupancy|Stall|stall" \
        "$OUTDIR/ncu_sections.log" | sed 's/  */ /g' | head -24
    stamp sections
    for exe in ${BASE:+bench_base} bench_kv; do
        timeout 120 $BUILD/$exe table 20 > "$OUTDIR/table_$exe.log" 2>&1 || rc=1
    done
    stamp tables
    for exe in ${BASE:+bench_base} bench_kv; do echo "== $exe table"; cat "$OUTDIR/table_$exe.log"; done
fi
[ -n "$OUT" ] && tar czf "$OUT/decode_cuda_logs.tgz" -C /tmp decode_cuda
exit $rc
