#!/bin/bash
# Session 5, final code (short causal sequences back on the persistent grid): make gpu-test, then the
# standard shapes (ours through torch interleaved with SDPA FA2 / cuDNN, bench_gpu.py).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
set -o pipefail
timeout 280 make gpu-test > "$OUT/gpu_test.log" 2>&1; echo "gpu-test rc=$?"
grep -E "^== |FAILED|passed|failed|ERROR SUMMARY" "$OUT/gpu_test.log" | tail -40
stamp gpu-test
export FLASHATTN_LIB=$PWD/build-gpu/libflashattn.so PYTHONPATH=$PWD/python
timeout 300 python3 bench/bench_gpu.py --ours python --tool build-gpu/flashattn --tag gpu-session5-final --out "$OUT" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; sed -n '/^| d |/,$p' "$OUT/bench.log" | head -60
stamp bench
