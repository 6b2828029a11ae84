#!/bin/bash
# Device call 4: verify the register-trimmed kernel (row sums and load pointers in shared memory,
# P packed at exp time): full correctness sweep, sanitizers, a timing subset, and the torch
# segfault repro with the new library. Logs in $OUT.
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/fwd_out}; mkdir -p "$O"
sh lab/cuda_fwd/build_lab.sh build-lab 90 > "$O/build.log" 2>&1 || { tail -20 "$O/build.log"; exit 1; }
python3 lab/cuda_fwd/check_fwd.py build-lab/liblabfwd.so > "$O/check.log" 2>&1; grep -v "^ok" "$O/check.log" | tail -6
for t in memcheck racecheck; do
  echo "$t: $(timeout 120 compute-sanitizer --tool $t --error-exitcode 3 build-lab/san_fwd 2>&1 | tail -1)"
done
build-lab/bench_ours 64,128,256 1024,2048,4096,16384 > "$O/bench.log" 2>&1; grep "^| [0-9]" "$O/bench.log" | cut -d'|' -f2-5 | tr '\n' ';'
echo
timeout 40 python3 -X faulthandler lab/cuda_fwd/repro_segv.py build-lab/liblabfwd.so plain 2>&1 | grep -v "^  File\|Extension" | head -8
