#!/bin/bash
# Session 4, call 1: `make gpu-test` on main (first run of the softcap predicate change `!= 0` and
# the negative-scale sweep cases), the Python GPU tests and the HF Llama client with the package's
# new torch-allocated scratch, then where the Python decode call's time goes (lab/decode/py_overhead.py)
# and the decode table through Python next to SDPA (lab/decode/sdpa_decode.py).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
step() { name=$1; limit=$2; shift 2; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "STEP $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-6} "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
TAIL=14 step gpu_test 400 env BUILD=build CUDA_ARCHS=90 sh tests/gpu_test.sh
export FLASHATTN_LIB=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python
TAIL=4 step pytest_gpu 90 python3 -m pytest -q python/tests/test_gpu.py python/tests/test_kvcache.py python/tests/test_torch.py
TAIL=8 step hf_client 80 python3 python/examples/hf_llama_check.py --device cuda
TAIL=8 step py_overhead 60 python3 lab/decode/py_overhead.py
TAIL=14 step sdpa_decode 90 python3 lab/decode/sdpa_decode.py --out /tmp/dec
echo done
