#!/bin/bash
# Session 3: d = 256 backward, lab v2 kernel (selftime: its own timing, no torch) against the
# library's bucket-256 kernel (flashattn bench --mode bwd: pre-pass + main + conversion), same
# shapes, alternated twice. Is the library's 256 kernel slower than the lab's 293 TFLOP/s at 16k?
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for rep in 1 2; do
    timeout 60 python3 lab/hopper_bwd/v2/hbwd_lab.py selftime build-hbwd2/libhopper_bwd.so --d 256 \
        --seqlens 4096,16384 --json "$OUT/lab_$rep.json" 2>&1 | tail -4
    timeout 60 build-dev/flashattn bench --device cuda --dtype bf16 --tokens 16384 --hq 8 -d 256 \
        --sq 4096,16384 --causal both --mode bwd --impl flash 2>&1 | tail -6
done
