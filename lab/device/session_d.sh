#!/bin/bash
# Session 2 device call 1: `make gpu-test` (first GPU run after the host-side refactor) and the
# first run of the lab Hopper forward (lab/hopper/v1/run_on_gpu.sh). Logs in $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
(OUT=$OUT/hopper bash lab/hopper/v1/run_on_gpu.sh build > "$OUT/hopper_build.log" 2>&1) &
make BUILD=build CUDA_ARCHS=90 -j14 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; }
wait
stamp "built"
timeout 200 env BUILD=build CUDA_ARCHS=90 bash tests/gpu_test.sh > "$OUT/gpu_test.log" 2>&1
echo "gpu-test rc=$?"; grep -E "FAIL|passed|SUMMARY|gpu-test" "$OUT/gpu_test.log" | head -20
stamp "gpu-test done"
cat "$OUT/hopper_build.log" | tail -12
HOPPER_SKIP_BUILD=1 OUT=$OUT/hopper timeout $(( 570 - ($(date +%s) - t0) )) bash lab/hopper/v1/run_on_gpu.sh all 2>&1 | tail -60
stamp "end"
