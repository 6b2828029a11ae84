#!/bin/bash
# Session 3 device call: the library's Hopper backward for head-dim bucket 256
# (src/cuda/bwd_hopper256_sm90a.cu, from lab/hopper_bwd/v2), library built locally
# (make BUILD=build-dev-256 CUDA_ARCHS=90 -j2 all; carried: build-dev-256/libflashattn.a,
# build-dev-256/libflashattn.so, build-dev-256/flashattn). Order: the small backward path cases first
# (a hang or fault in the new kernel shows in seconds and skips the rest), the full GPU sweep, the
# backward path and repeatability tests (d = 192 / 256 now through the new kernel), compute-sanitizer
# memcheck / racecheck / synccheck on `fa_gpu_bwd_paths small` and `fa_gpu_backward 0 1 2` (problem
# 2 is d = 256), then the d = 256 backward timing next to SDPA FA2 / cuDNN. Under 5 minutes.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD=build-dev-256
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
LINK="$BUILD/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c $LINK -o /tmp/bwd || exit 1
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_bwd_paths.c $LINK -o /tmp/bwdpaths || exit 1

timeout 40 /tmp/bwdpaths small > "$OUT/bwd_paths_small.log" 2>&1; rc=$?
echo "bwd paths small rc=$rc"; tail -9 "$OUT/bwd_paths_small.log"
stamp "small paths"
if [ $rc -eq 124 ] || [ $rc -eq 137 ] || grep -qiE "illegal (memory|instruction|address)|unspecified launch failure|cuda error" "$OUT/bwd_paths_small.log"; then
    echo "hang or device fault in the small cases: skipping the rest"; exit 1
fi

timeout 100 $BUILD/flashattn check --device cuda --full > "$OUT/check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/check_full.log")"; grep -E "FAIL|ERROR|error" "$OUT/check_full.log" | head -12
stamp check
timeout 45 /tmp/bwdpaths > "$OUT/bwd_paths.log" 2>&1; echo "bwd paths rc=$?"; grep -E "d192|d256|passed" "$OUT/bwd_paths.log"
grep -v "^ok" "$OUT/bwd_paths.log" | grep -v "^per tensor\|^fa_gpu_bwd_paths" | head -8
timeout 30 /tmp/bwd > "$OUT/bwd_rep.log" 2>&1; echo "bwd repeatability rc=$?"; cat "$OUT/bwd_rep.log"
stamp "path tests"

for tool in memcheck racecheck synccheck; do
    timeout 30 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bwdpaths small > "$OUT/${tool}_paths.log" 2>&1
    echo "$tool bwd_paths small rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/${tool}_paths.log" | sort | uniq -c | tr '\n' ' ')"
    timeout 30 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bwd 0 1 2 > "$OUT/${tool}_bwd.log" 2>&1
    echo "$tool bwd 0 1 2 rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/${tool}_bwd.log" | sort | uniq -c | tr '\n' ' ')"
    grep -E "Race reported|Error:|Hazard" "$OUT/${tool}_paths.log" "$OUT/${tool}_bwd.log" | sort | uniq -c | head -6
done
stamp sanitizers

# what is left of 290 s, at least 60 s
left=$(( 290 - ($(date +%s) - t0) )); [ $left -lt 60 ] && left=60
FLASHATTN_LIB=$PWD/$BUILD/libflashattn.so timeout $left python3 bench/bench_gpu.py --tool $BUILD/flashattn \
    --modes bwd --d 256 --seqlens 1024,2048,4096,8192,16384 --mem-seqlens 65536 --tag gpu-hbwd256 --out "$OUT" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$? (limit $left s)"; tail -20 "$OUT/bench.log"
stamp end
