#!/bin/bash
# Session 5: the portable forward's causal order (lab/cuda_fwd_order): library (3-D grid, head
# fastest) vs head groups on a 1-D grid, both built here; B's sweep with the portable kernel; then
# sustained-load TFLOP/s / TFLOP/J / clock, processes alternated A B A B; checksums must agree.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for t in a b; do rm -rf /tmp/$t; mkdir -p /tmp/$t; cp -r include src tools tests python Makefile /tmp/$t/; done
cp lab/cuda_fwd_order/fwd_kernel.cuh lab/cuda_fwd_order/fa_cuda.cu /tmp/b/src/cuda/
(cd /tmp/a && make BUILD=build CUDA_ARCHS=90 -j8 all > "$OUT/build_a.log" 2>&1) &
(cd /tmp/b && make BUILD=build CUDA_ARCHS=90 -j8 all > "$OUT/build_b.log" 2>&1) &
wait
ls -la /tmp/a/build/libflashattn.so /tmp/b/build/libflashattn.so | awk '{print $5, $9}'
grep -h "spill stores" "$OUT/build_b.log" | grep -v " 0 bytes spill" | head -3
FA_CUDA_FORWARD=portable timeout 120 /tmp/b/build/flashattn check --device cuda --quick 2>&1 | tail -2
FA_CUDA_FORWARD=portable timeout 120 /tmp/b/build/flashattn check --device cuda --quick 2>&1 | tail -1
export PYTHONPATH=$PWD/python
for i in 1 2; do
  for t in a b; do
    FLASHATTN_LIB=/tmp/$t/build/libflashattn.so timeout 100 python3 lab/cuda_fwd_order/portable_bench.py $t >> "$OUT/bench.txt" 2>&1
  done
done
echo "| build | shape | TFLOP/s | TFLOP/J | SM MHz | checksum |"
sort -t'|' -k3,3 -k2,2 "$OUT/bench.txt"
