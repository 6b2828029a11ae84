#!/bin/bash
# Session 2 device call 7: the final Hopper forward (persistent grid with snake order for buckets
# 64/128, causal included): full GPU sweep, the kernels against each other on large problems
# (tests/gpu/fa_gpu_paths.c), determinism, racecheck on the quick sweep.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d build-lead/pin ] && cp -r build-lead/pin/. . && echo "pinned: $(cd build-lead/pin && find . -type f | tr '\n' ' ')"
make BUILD=build CUDA_ARCHS=90 -j16 all > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
LINK="build/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_determinism.c $LINK -o build/det
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_paths.c $LINK -o build/paths
stamp built
timeout 40 build/paths > "$OUT/gpu_paths.log" 2>&1; echo "paths rc=$?"; cat "$OUT/gpu_paths.log"
timeout 100 build/flashattn check --device cuda --full > "$OUT/gpu_check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/gpu_check_full.log")"; grep -E "FAIL|ERROR" "$OUT/gpu_check_full.log" | head -8
timeout 30 build/det > /tmp/det.log 2>&1; echo "det rc=$?: $(tail -1 /tmp/det.log)"
timeout 40 compute-sanitizer --tool racecheck --error-exitcode 3 build/flashattn check --device cuda --quick > /tmp/race.log 2>&1
echo "racecheck rc=$?: $(grep 'RACECHECK SUMMARY' /tmp/race.log)"
stamp end
