#!/bin/bash
# Session 3 final benchmarks (library built locally into build-dev, carried): the standard shapes
# forward and backward with ours through torch (flash_attn_func) and SDPA FA2 / cuDNN interleaved
# per shape in one process (same do_bench timing, same power state), peak memory; then the decode
# shapes (CLI, every page size) and SDPA on the same decode shapes.
set -u
export PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build-dev/libflashattn.so PYTHONPATH=$PWD/python
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
timeout 330 python3 bench/bench_gpu.py --ours python --tool build-dev/flashattn --tag gpu-session3 --out "$OUT" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; sed -n '/^| d |/,$p' "$OUT/bench.log" | head -60
stamp bench
# ours alone through the tool (CUDA events, no Python wrapper), for the record next to the above
for d in 64 128 256; do
    timeout 60 build-dev/flashattn bench --device cuda --dtype bf16 --tokens 16384 --hq $((2048 / d)) -d $d \
        --sq 1024,2048,4096,8192,16384 --causal both --mode fwd,bwd --impl flash --json >> "$OUT/ours_cli.json" 2>/dev/null
done
echo "ours via the tool: $(grep -c tflops "$OUT/ours_cli.json") rows"
stamp "tool sweep"
T=build-dev/flashattn
for shape in "-b 1,32 --cache-len 8192" "-b 8 --cache-len 65536" "-b 128 --cache-len 2048"; do
    timeout 60 $T bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 $shape \
        --page-size 0,1,16,256 --json >> "$OUT/decode_cli.json" 2>> "$OUT/decode_cli.err"
done
timeout 120 python3 lab/decode/sdpa_decode.py --out "$OUT" --cli-json "$OUT/decode_cli.json" > "$OUT/sdpa_decode.log" 2>&1
echo "decode rc=$?"; sed -n '/^# Decode attention/,$p' "$OUT/sdpa_decode.log"
stamp end
