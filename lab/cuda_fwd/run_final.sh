#!/bin/bash
# Device call 3: base and tile variant V (build_lab.sh): correctness, sanitizers, timing; then
# PyTorch SDPA FA2/cuDNN on the same shapes. Logs in $OUT.
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/fwd_out}; mkdir -p "$O"
(sh lab/cuda_fwd/build_lab.sh build-lab 90 > "$O/build.log" 2>&1; echo "base build rc $?") &
(sh lab/cuda_fwd/build_lab.sh build-labV 90 V > "$O/buildV.log" 2>&1; echo "V build rc $?") &
wait
python3 lab/cuda_fwd/check_fwd.py build-labV/liblabfwd.so --quick > "$O/checkV.log" 2>&1; grep -v "^ok" "$O/checkV.log" | tail -8
for b in build-labV; do for t in memcheck racecheck; do
  echo "$b $t: $(timeout 120 compute-sanitizer --tool $t --error-exitcode 3 $b/san_fwd 2>&1 | tail -1) rc=$?"
done; done
build-lab/bench_ours > "$O/bench_base.log" 2>&1
build-labV/bench_ours > "$O/bench_V.log" 2>&1
python3 lab/cuda_fwd/bench_fwd.py build-lab/liblabfwd.so 64,128,256 512,1024,2048,4096,8192,16384 fa2,cudnn > "$O/bench_sdpa.log" 2>&1
paste -d'|' <(grep "^| [0-9]" "$O/bench_base.log" | cut -d'|' -f2-5) <(grep "^| [0-9]" "$O/bench_V.log" | cut -d'|' -f5) <(grep "^| [0-9]" "$O/bench_sdpa.log" | cut -d'|' -f6,7)
echo "cols: d | causal | s | base | V | fa2 | cudnn"
