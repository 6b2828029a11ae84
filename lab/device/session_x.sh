#!/bin/bash
# Session 4, last call: (1) the deterministic Hopper backward rebased onto the softcap kernels
# (lab/hopper_bwd/deterministic/run_on_gpu.sh: build, 40 det cases, sweep, sanitizers, timing);
# (2) the library of this tree for Python: host cost and flushed time of the decode call
# (lab/decode/py_overhead.py), the decode table through Python, the HF Llama client.
set -u
export PYTHONUNBUFFERED=1
OUTX=${OUT:-/tmp/out}; mkdir -p "$OUTX" /tmp/x
t0=$(date +%s)
OUT=/tmp/x/det timeout -k 5 330 bash lab/hopper_bwd/deterministic/run_on_gpu.sh > /tmp/x/det.txt 2>&1
echo "== deterministic rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "passed|FAIL|TIMED|!!|spill|SUMMARY" /tmp/x/det.txt | grep -v "0 bytes spill" | head -30
sed -n '/bench_hopper (timeout/,$p' /tmp/x/det.txt | grep -E "^flashattn bf16|==|done"
make BUILD=build CUDA_ARCHS=90 -j16 lib > /tmp/x/build.log 2>&1 || { tail -20 /tmp/x/build.log; exit 1; }
echo "== lib built ($(( $(date +%s) - t0 )) s)"
export FLASHATTN_LIB=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python
timeout 60 python3 lab/decode/py_overhead.py 2>&1 | tail -6
timeout 60 python3 lab/decode/sdpa_decode.py --out /tmp/x/dec 2>&1 | grep "^| 1 x\|^| 32 x"
timeout 80 python3 python/examples/hf_llama_check.py --device cuda > /tmp/x/hf.txt 2>&1; echo "hf rc=$?"; tail -3 /tmp/x/hf.txt
tar czf "$OUTX/session_x_logs.tgz" -C /tmp x
echo "done ($(( $(date +%s) - t0 )) s)"
