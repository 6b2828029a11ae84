#!/bin/bash
# run3a.sh: device call 1 of lab/cuda_bwd/v3: timing of prebuilt libraries (build-bwd3-carry/*.so,
# built on the dev machine with nvcc 13, sm_90) vs FA2, the kernel-time split, Nsight Compute on the
# main kernel (d = 128 s = 4k/16k, d = 64/256 s = 16k, non-causal), SASS of the main kernels.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bwd3}; mkdir -p "$OUT"
L=build-bwd3-carry
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
timeout 120 python3 lab/cuda_bwd/v3/bench3.py base=$L/base.so kvfirst=$L/kvfirst.so nodqred=$L/nodqred.so \
    --rep 30 --split > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(el) s)"
if [ -n "$NCU" ]; then
    timeout 150 "$NCU" --clock-control none --set full -k regex:fa_bwd2_main -c 4 -f -o "$OUT/prof" \
        python3 lab/cuda_bwd/v3/prof3.py $L/base.so 128:4096:0 128:16384:0 64:16384:0 256:16384:0 > "$OUT/ncu_run.log" 2>&1
    echo "ncu rc=$? ($(el) s)"; tail -3 "$OUT/ncu_run.log"
    "$NCU" -i "$OUT/prof.ncu-rep" --page details > "$OUT/details.txt" 2>&1
    "$NCU" -i "$OUT/prof.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
    "$NCU" -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
    echo "ncu export ($(el) s): $(wc -c < "$OUT/details.txt") $(wc -c < "$OUT/raw.csv") $(wc -c < "$OUT/source.csv") bytes"
    grep -E "^  [a-z_]+.*\(|Duration|Registers|Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy" "$OUT/details.txt" | head -60
fi
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for f in '_Z19fa_bwd2_main_kernelI7fa_bf16Li128EEv13fa_bwd_params' '_Z19fa_bwd2_main_kernelI7fa_bf16Li64EEv13fa_bwd_params' '_Z19fa_bwd2_main_kernelI7fa_bf16Li256EEv13fa_bwd_params'; do
    "$CUOBJ" -sass -fun "$f" $L/base.so
done > "$OUT/sass.txt" 2>&1
echo "sass $(wc -l < "$OUT/sass.txt") lines ($(el) s)"
sed -n '/^split/,/^{/p' "$OUT/bench.log" | head -30
sed -n '/^backward TFLOP/,$p' "$OUT/bench.log"
