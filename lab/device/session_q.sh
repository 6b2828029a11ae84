#!/bin/bash
# Session 3 final validation: `make gpu-test` (tests/gpu_test.sh: build for the local GPU, full
# sweep both forward kernels, determinism, kernel-vs-kernel tests forward and backward,
# compute-sanitizer memcheck/racecheck/synccheck), the Python package's GPU tests and the Hugging
# Face Llama client, all against the library built on the device from this tree.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
step() { name=$1; limit=$2; shift 2; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "STEP $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-6} "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
TAIL=14 step gpu_test 420 env BUILD=build CUDA_ARCHS=90 sh tests/gpu_test.sh
export FLASHATTN_LIB=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python
TAIL=6 step pytest_gpu 90 python3 -m pytest -q python/tests/test_gpu.py python/tests/test_kvcache.py
TAIL=20 step hf_client 80 python3 python/examples/hf_llama_check.py --device cuda
echo done
