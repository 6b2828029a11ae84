#!/bin/bash
# Session 5, issue 6: tile order of the causal Hopper forward (lab/hopper/order): the library's
# order against head-grouped orders, persistent or one CTA per tile, sustained-load TFLOP/s, TFLOP/J
# and SM clock, bitwise equality of the outputs; ncu DRAM bytes / L2 hit rate at d128 s2k causal.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
V=/tmp/var; rm -rf $V; mkdir -p $V
cp -r include src tools tests python Makefile $V/
cp lab/hopper/order/fwd_hopper_sm90a.cu $V/src/cuda/fwd_hopper_sm90a.cu
(cd $V && make BUILD=build CUDA_ARCHS=90 -j16 lib) > "$OUT/build.log" 2>&1; echo "build status $?"
grep -i "spill\|error" "$OUT/build.log" | grep -v "0 bytes spill" | head -5
export FLASHATTN_LIB=$V/build/libflashattn.so PYTHONPATH=$PWD/python
timeout 330 python3 lab/hopper/order/order_bench.py 1.5 > "$OUT/order.txt" 2>&1; echo "order status $?"
M="gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg"
timeout 150 ncu --clock-control none -k regex:"hopper|sdpa|fprop" --metrics "$M" \
    python3 lab/hopper/order/ncu_order.py > "$OUT/ncu.txt" 2>&1; echo "ncu status $?"
grep -E "^  [a-zA-Z_]|gpu__time|dram__bytes|lts__t_sector_hit|sm__cycles" "$OUT/ncu.txt" | cut -c1-140
grep "MISMATCH\|mismatches\|Error\|error" "$OUT/order.txt" | head
grep "^|" "$OUT/order.txt"
