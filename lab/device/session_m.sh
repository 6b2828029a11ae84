#!/bin/bash
# Session 3 device call 3: (1) the library's Hopper backward after the producer rework (vectors
# loaded by producer warp 0 from the forward's LSE, no LSE·log2e workspace): full GPU sweep, the
# backward path/repeatability tests, compute-sanitizer, the backward bench with peak memory;
# (2) first run of the lab d = 256 Hopper backward (lab/hopper_bwd/v2, objects built locally).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
LINK="build-dev/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c $LINK -o /tmp/bwd || exit 1
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_bwd_paths.c $LINK -o /tmp/bwdpaths || exit 1
timeout 150 build-dev/flashattn check --device cuda --full > "$OUT/check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/check_full.log")"; grep -E "FAIL|ERROR|error" "$OUT/check_full.log" | head -12
timeout 60 /tmp/bwd > "$OUT/bwd_rep.log" 2>&1; echo "bwd repeatability rc=$?: $(tail -1 "$OUT/bwd_rep.log")"
timeout 60 /tmp/bwdpaths > "$OUT/bwd_paths.log" 2>&1; echo "bwd paths rc=$?: $(tail -1 "$OUT/bwd_paths.log")"
grep -v "^ok" "$OUT/bwd_paths.log" | head -5
for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bwd 0 1 2 > "$OUT/$tool.log" 2>&1
    echo "$tool bwd rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | sort | uniq -c | tr '\n' ' ')"
done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 /tmp/bwdpaths small > "$OUT/memcheck_paths.log" 2>&1
echo "memcheck bwd paths small rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_paths.log" | sort | uniq -c | tr '\n' ' ')"
stamp "library checks"
timeout 150 python3 bench/bench_gpu.py --tool build-dev/flashattn --modes bwd --d 64,128 \
    --seqlens 1024,2048,4096,8192,16384 --mem-seqlens 65536 --tag gpu-hbwd2 --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -28 "$OUT/bench.log"
stamp "library bench"
HBWD_SKIP_BUILD=1 timeout 330 bash lab/hopper_bwd/v2/run_on_gpu.sh all > "$OUT/hbwd2.log" 2>&1
echo "hbwd2 rc=$?"; tail -45 "$OUT/hbwd2.log"
stamp end
