#!/bin/bash
# Session 3 device call 1: (1) first run of the lab wgmma backward (lab/hopper_bwd/v1, objects
# built locally and carried in build-hbwd); (2) memcheck and synccheck of the final Hopper forward
# (library built locally into build-dev, carried) on the quick sweep and the determinism test's small set.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
HBWD_SKIP_BUILD=1 timeout 400 bash lab/hopper_bwd/v1/run_on_gpu.sh ${HBWD_MODE:-all} > "$OUT/hbwd.log" 2>&1
echo "hbwd rc=$?"; cat "$OUT/hbwd.log" | tail -60
stamp "hbwd done"
LINK="build-dev/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_determinism.c $LINK -o /tmp/det
for tool in memcheck synccheck; do
    [ $(( $(date +%s) - t0 )) -gt 500 ] && { echo "skip $tool (time)"; continue; }
    timeout 40 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/det small > /tmp/$tool.det.log 2>&1
    echo "$tool det small rc=$?: $(grep -E 'ERROR SUMMARY' /tmp/$tool.det.log)"
    timeout 45 compute-sanitizer --tool $tool --error-exitcode 3 build-dev/flashattn check --device cuda --quick > /tmp/$tool.log 2>&1
    echo "$tool check quick rc=$?: $(grep -E 'ERROR SUMMARY' /tmp/$tool.log) $(tail -1 /tmp/$tool.log)"
done
stamp end
