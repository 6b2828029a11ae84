#!/bin/bash
# Device call 2: static-cudart repro check, our timings (C, no torch), then SDPA FA2/cuDNN timings.
export PYTHONUNBUFFERED=1
OUTDIR=${OUT:-/tmp/fwd_out}; mkdir -p "$OUTDIR"
sh lab/cuda_fwd/build_lab.sh build-lab 90 > "$OUTDIR/build.log" 2>&1 || { tail -30 "$OUTDIR/build.log"; exit 1; }
echo "== repro, static cudart"
timeout 60 python3 -X faulthandler lab/cuda_fwd/repro_segv.py build-lab/liblabfwd_static.so plain 2>&1 | grep -v "^  File\|Extension" | head -8
echo "== ours"
build-lab/bench_ours ${1:-64,128,256} ${2:-512,1024,2048,4096,8192,16384} 2>&1 | tee "$OUTDIR/bench_ours.log"
echo "== sdpa"
python3 lab/cuda_fwd/bench_fwd.py build-lab/liblabfwd.so ${1:-64,128,256} ${2:-512,1024,2048,4096,8192,16384} fa2,cudnn > "$OUTDIR/bench_sdpa.log" 2>&1
grep "^|" "$OUTDIR/bench_sdpa.log" | cut -d'|' -f2-4,6,7
