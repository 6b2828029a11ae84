#!/bin/bash
# run_on_gpu.sh: one device call for the CUDA backward: build (sm_90), correctness + determinism
# (check_bwd.py), compute-sanitizer memcheck (san_bwd.c), timing against SDPA FA2 and cuDNN
# (bench_bwd.py), racecheck last. Logs go to $OUT; summaries are printed as each step ends.
# Usage (repository root, on the GPU machine):
#   bash lab/cuda_bwd/run_on_gpu.sh [--quick] [--no-check] [--no-san] [--no-bench]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cuda_bwd_out}
mkdir -p "$OUT"
QUICK=""; SAN=1; BENCH=1; CHECK=1
for a in "$@"; do
    case "$a" in
        --quick) QUICK=--quick ;;
        --no-san) SAN=0 ;;
        --no-bench) BENCH=0 ;;
        --no-check) CHECK=0 ;;
    esac
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv,noheader
START=$(date +%s)
# -lstdc++: the nvcc host stubs need the C++ runtime when the .so is loaded from C/ctypes.
if ! make BUILD=build-gpubwd CUDA_ARCHS=90 LDLIBS="-lm -pthread -lstdc++" -j16 lib > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - START )) s; backward warnings: $(grep -i warning "$OUT/build.log" | grep -ci bwd)"
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
sanitize() { # tool timeout problem-indexes...
    local tool=$1 limit=$2; shift 2
    local T0=$(date +%s)
    timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 build-gpubwd/san_bwd "$@" > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$? ($(( $(date +%s) - T0 )) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|san_bwd:' "$OUT/$tool.log" | tr '\n' ' ')"
    grep -E "^FAIL|Invalid|Race|hazard|rror" "$OUT/$tool.log" | head -4
}
if [ $CHECK = 1 ]; then
    timeout 110 python3 lab/cuda_bwd/check_bwd.py build-gpubwd/libflashattn.so $QUICK > "$OUT/check.log" 2>&1
    echo "check rc=$? ($(( $(date +%s) - START )) s)"; grep -v "^PASS" "$OUT/check.log" | tail -25
    echo "passing cases: $(grep -c '^PASS' "$OUT/check.log")"
fi
if [ $SAN = 1 ]; then
    cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c build-gpubwd/libflashattn.a \
        -L"$CUDA_HOME/lib64" -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o build-gpubwd/san_bwd
    sanitize memcheck 50
fi
if [ $BENCH = 1 ]; then
    timeout 150 python3 lab/cuda_bwd/bench_bwd.py build-gpubwd/libflashattn.so $QUICK > "$OUT/bench.log" 2>&1
    echo "bench rc=$? ($(( $(date +%s) - START )) s)"; grep -v "^{" "$OUT/bench.log" | tail -40
fi
if [ $SAN = 1 ]; then
    sanitize racecheck 60 0 1 2
fi
echo "total $(( $(date +%s) - START )) s"
