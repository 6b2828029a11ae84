#!/bin/bash
# One device call: build for the H200, GPU test suite, the torch-process crash diagnosis, the Python
# GPU tests and the Hugging Face client. Each step has its own time limit; logs go to $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
step() { name=$1; limit=$2; shift 2; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "STEP $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-6} "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
step build 150 make BUILD=build CUDA_ARCHS=90 -j16 all
TAIL=12 step gpu_test 250 env BUILD=build CUDA_ARCHS=90 sh tests/gpu_test.sh
export FLASHATTN_LIB=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python
cat > /tmp/big.py <<'PY'
import torch, flashattn, sys
for s in (512, 1024, 4096):
    b, h, d = 16384 // s, 2048 // 64, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o = flashattn.flash_attn_func(q, k, v, causal=True)
    o.backward(torch.randn_like(o)); torch.cuda.synchronize()
    print("ok", s, float(o.float().abs().mean()), flush=True)
PY
TAIL=15 step big_default 60 python3 -X faulthandler /tmp/big.py
grep -q "^ok 4096" "$OUT/big_default.log" || {
  TAIL=15 step big_eager 60 env CUDA_MODULE_LOADING=EAGER python3 -X faulthandler /tmp/big.py
  TAIL=40 step big_gdb 120 cuda-gdb -batch -ex run -ex bt -ex "info threads" --args python3 /tmp/big.py; }
TAIL=25 step pytest_gpu 120 python3 -m pytest -q -x python/tests/test_gpu.py
TAIL=25 step hf_client 110 python3 python/examples/hf_llama_check.py --device cuda
echo done
