#!/bin/bash
# Session 3 device call 2: the Hopper backward in the library (src/cuda/bwd_hopper_sm90a.cu),
# library built locally (build-dev, carried): full GPU sweep (default kernels = Hopper forward and
# backward), the backward repeatability test and compute-sanitizer on its small problems (now
# through the Hopper kernel), then the backward timing next to SDPA FA2 / cuDNN.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
LINK="build-dev/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c $LINK -o /tmp/bwd || exit 1
[ -f tests/gpu/fa_gpu_bwd_paths.c ] && cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_bwd_paths.c $LINK -o /tmp/bwdpaths
timeout 150 build-dev/flashattn check --device cuda --full > "$OUT/check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/check_full.log")"; grep -E "FAIL|ERROR|error" "$OUT/check_full.log" | head -12
stamp check
timeout 60 /tmp/bwd > "$OUT/bwd_rep.log" 2>&1; echo "bwd repeatability rc=$?: $(tail -1 "$OUT/bwd_rep.log")"
if [ -x /tmp/bwdpaths ]; then timeout 60 /tmp/bwdpaths > "$OUT/bwd_paths.log" 2>&1; echo "bwd paths rc=$?"; tail -30 "$OUT/bwd_paths.log"; fi
for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bwd 0 1 2 > "$OUT/$tool.log" 2>&1
    echo "$tool bwd rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | sort | uniq -c | tr '\n' ' ')"
done
stamp sanitizers
timeout 240 python3 bench/bench_gpu.py --tool build-dev/flashattn --modes bwd --d 64,128 \
    --seqlens 1024,2048,4096,8192,16384 --mem-seqlens 65536 --tag gpu-hbwd --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -30 "$OUT/bench.log"
stamp end
