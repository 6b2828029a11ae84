#!/bin/bash
# Session 3: the Hopper backward kernels' dQ accumulator as [heads_q, total_q, d] (one head's rows
# contiguous) instead of [total_q, heads_q, d]. A/B timing (build-dev-256 = before, build-dev =
# after; the tool, bwd) at d = 64/128/256, then the checks of the new build: backward kernel vs
# portable on large problems, the full GPU sweep, compute-sanitizer on the small path cases.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
for rep in 1 2; do for b in build-dev-256 build-dev; do
    for d in 64 128 256; do
        $b/flashattn bench --device cuda --dtype bf16 --tokens 16384 --hq $((2048 / d)) -d $d --sq 4096,16384 \
            --causal both --mode bwd --impl flash --json 2>/dev/null | \
            python3 -c "import sys,json; r=[json.loads(l) for l in sys.stdin if l.startswith('{')]; print('$b', $d, ' '.join('c%d/%d:%.1f' % (x['causal'], x['sq'], x['tflops']) for x in r))"
    done
done; done
stamp "A/B"
LINK="build-dev/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_bwd_paths.c $LINK -o /tmp/bwdpaths || exit 1
timeout 60 /tmp/bwdpaths > "$OUT/bwd_paths.log" 2>&1; echo "bwd paths rc=$?: $(tail -1 "$OUT/bwd_paths.log")"
grep -v "^ok" "$OUT/bwd_paths.log" | grep -v "^per tensor\|^fa_gpu_bwd_paths" | head -5
timeout 100 build-dev/flashattn check --device cuda --full > "$OUT/check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/check_full.log")"; grep -E "FAIL|ERROR" "$OUT/check_full.log" | head -5
for tool in memcheck racecheck synccheck; do
    timeout 40 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bwdpaths small > "$OUT/$tool.log" 2>&1
    echo "$tool bwd paths small rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | sort | uniq -c | tr '\n' ' ')"
done
stamp end
