#!/bin/bash
# Session 2 device call 5: the committed library (Hopper forward with its grid heuristic, v2
# backward): full GPU sweep, determinism, then the standard benchmark (bench/bench_gpu.py: fwd+bwd,
# d 64/128/256, s 512..16k, causal and not, peak memory) against SDPA FA2 and cuDNN in one run.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOGS=/tmp/logs; mkdir -p $LOGS
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d build-lead/pin ] && cp -r build-lead/pin/. . && echo "pinned: $(cd build-lead/pin && find . -type f | tr '\n' ' ')"
make BUILD=build CUDA_ARCHS=90 -j16 all > $LOGS/build.log 2>&1 || { tail -30 $LOGS/build.log; exit 1; }
LINK="build/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_determinism.c $LINK -o build/det
stamp built
timeout 120 build/flashattn check --device cuda --full > "$OUT/gpu_check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/gpu_check_full.log")"; grep -E "FAIL|ERROR" "$OUT/gpu_check_full.log" | head -8
timeout 60 build/det > $LOGS/det.log 2>&1; echo "det rc=$?: $(tail -1 $LOGS/det.log)"
stamp bench
timeout 400 python3 bench/bench_gpu.py --out "$OUT" > "$OUT/bench_gpu.log" 2>&1
echo "bench rc=$?"; tail -45 "$OUT/bench_gpu.log"
stamp end
