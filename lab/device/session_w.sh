#!/bin/bash
# Session 4, call 4: the two Hopper-backward lab patches, each in its own patched copy of the tree:
# lab/hopper_bwd/softcap (softcap in both Hopper backward kernels) then lab/hopper_bwd/deterministic
# (semaphore-ordered dQ). Logs under /tmp/w, packed into $OUT/session_w_logs.tgz.
set -u
OUTW=${OUT:-/tmp/out}; mkdir -p "$OUTW" /tmp/w
t0=$(date +%s)
timeout -k 5 290 sh lab/hopper_bwd/softcap/run_on_gpu.sh /tmp/w/softcap > /tmp/w/softcap.txt 2>&1
echo "== softcap rc=$? ($(( $(date +%s) - t0 )) s)"; grep -vE "^ok |^\s*$" /tmp/w/softcap.txt | tail -40
OUT=/tmp/w/det timeout -k 5 290 bash lab/hopper_bwd/deterministic/run_on_gpu.sh > /tmp/w/det.txt 2>&1
echo "== deterministic rc=$? ($(( $(date +%s) - t0 )) s)"; grep -vE "^ok |^\s*$" /tmp/w/det.txt | tail -60
tar czf "$OUTW/session_w_logs.tgz" -C /tmp w
