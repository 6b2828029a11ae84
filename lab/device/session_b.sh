#!/bin/bash
# One device call after the decode path landed: build, the full CUDA check sweep (attention +
# kvcache + merge), determinism, compute-sanitizer on forward/backward/decode, the standalone
# decode checker, the Python kvcache tests, and the decode benchmark next to PyTorch SDPA.
# Each step has its own time limit; logs under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
step() { name=$1; limit=$2; shift 2; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "STEP $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-4} "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
step build 120 make BUILD=build CUDA_ARCHS=90 -j16 all
LINK="build/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
for t in tests/gpu/fa_gpu_determinism.c tests/gpu/fa_gpu_backward.c lab/decode_cuda/san_kv.c; do
  cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" $t $LINK -o build/$(basename $t .c) || echo "BUILD FAIL $t"
done
TAIL=3 step check_full 150 build/flashattn check --device cuda --full
grep FAIL "$OUT/check_full.log" | head -5
TAIL=2 step det_fwd 30 build/fa_gpu_determinism
TAIL=2 step det_bwd 30 build/fa_gpu_backward
SAN=$(command -v compute-sanitizer || echo $CUDA_HOME/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  TAIL=2 step ${tool}_fwd 45 $SAN --tool $tool --error-exitcode 3 build/fa_gpu_determinism small
  TAIL=2 step ${tool}_bwd 60 $SAN --tool $tool --error-exitcode 3 build/fa_gpu_backward 0 1 2
  TAIL=2 step ${tool}_kv 60 $SAN --tool $tool --error-exitcode 3 build/san_kv
done
TAIL=6 step check_kv 90 python3 lab/decode_cuda/check_kv.py build/libflashattn.so
export FLASHATTN_LIB=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python
TAIL=3 step pytest_kv 60 python3 -m pytest -q -p no:cacheprovider python/tests/test_kvcache.py
build/flashattn bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 -b 1,32 --cache-len 8192 --page-size 0,16 --json > "$OUT/decode_cli.json" 2>/dev/null
build/flashattn bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 -b 8 --cache-len 65536 --page-size 0,16 --json >> "$OUT/decode_cli.json" 2>/dev/null
build/flashattn bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 -b 128 --cache-len 2048 --page-size 0,16 --json >> "$OUT/decode_cli.json" 2>/dev/null
TAIL=30 step sdpa_decode 100 python3 lab/decode/sdpa_decode.py --out "$OUT" --cli-json "$OUT/decode_cli.json"
echo done
