#!/bin/sh
# Scratch: exercise `flashattn` on a GPU machine (run from the repository root; $OUT collects logs).
BIN=${BIN:-./build-cli-cuda/flashattn}
OUT=${OUT:-/tmp}
$BIN version
timeout 120 $BIN bench --device cuda --dtype bf16,f16 -d 64,128 --hq 8 --hkv 8,2 --sq 1000 --sk 1000,3000 --causal both --mode fwd,bwd,fwdbwd --repeats 5 --json > $OUT/small.json 2> $OUT/small.err
echo "small: rc=$? lines=$(wc -l < $OUT/small.json)"; head -c 1500 $OUT/small.err
grep -c '"status":"ok"' $OUT/small.json
start=$(date +%s)
timeout 330 $BIN bench > $OUT/cuda_default.txt 2> $OUT/cuda_default.err
echo "default: rc=$? seconds=$(( $(date +%s) - start ))"
cat $OUT/cuda_default.txt; tail -c 600 $OUT/cuda_default.err
timeout 60 $BIN check --device cuda --quick > $OUT/check.txt 2>&1; echo "check: rc=$?"; tail -2 $OUT/check.txt
