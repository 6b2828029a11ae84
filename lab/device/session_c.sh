#!/bin/bash
# One device call: the sink-overflow fix (forward and decode epilogues) through the full CUDA
# check sweep and compute-sanitizer, then the backward v2 lab run (lab/cuda_bwd/run_v2.sh).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
make BUILD=build CUDA_ARCHS=90 -j16 all > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
LINK="build/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_determinism.c $LINK -o build/det
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" lab/decode_cuda/san_kv.c $LINK -o build/san_kv
for seed in 185262742454144 7; do
  timeout 100 build/flashattn check --device cuda --full --seed $seed > "$OUT/check_$seed.log" 2>&1
  echo "check seed $seed rc=$?: $(tail -1 "$OUT/check_$seed.log")"; grep FAIL "$OUT/check_$seed.log" | head -5
done
for tool in memcheck racecheck; do
  for b in "build/det small" build/san_kv; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 $b > "$OUT/san.log" 2>&1
    echo "$tool $b rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san.log")"
  done
done
OUT=$OUT/v2 timeout 330 bash lab/cuda_bwd/run_v2.sh 2>&1 | tail -45
