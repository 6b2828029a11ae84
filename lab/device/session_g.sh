#!/bin/bash
# Session 2 device call 4: library Hopper forward with a persistent grid (Q of the next tile loaded
# under the epilogue, own O buffer at buckets 64/128), against the previous commit's build (build-lead/prev, HEAD at the
# time) in the same call: build both, check, sanitizers, forward bench (ours, previous, cuDNN, FA2).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d build-lead/pin ] && cp -r build-lead/pin/. . && echo "pinned: $(cd build-lead/pin && find . -type f | tr '\n' ' ')"
(make BUILD=build CUDA_ARCHS=90 -j10 all > "$OUT/build.log" 2>&1 || echo "BUILD FAILED") &
(make -C build-lead/prev BUILD=build CUDA_ARCHS=90 -j6 all > "$OUT/build_prev.log" 2>&1 || echo "PREV BUILD FAILED") &
wait
[ -x build/flashattn ] || { tail -30 "$OUT/build.log"; exit 1; }
LINK="build/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_determinism.c $LINK -o build/det
stamp built
timeout 40 build/flashattn check --device cuda --quick > "$OUT/check_quick.log" 2>&1
r=$?; echo "check quick rc=$r: $(tail -1 "$OUT/check_quick.log")"; grep -E "FAIL|ERROR" "$OUT/check_quick.log" | head -8
[ $r = 124 ] && { echo "HANG in the quick check; last lines:"; tail -3 "$OUT/check_quick.log"; exit 1; }
timeout 150 build/flashattn check --device cuda --full > "$OUT/check_full.log" 2>&1
echo "check full rc=$?: $(tail -1 "$OUT/check_full.log")"; grep -E "FAIL|ERROR" "$OUT/check_full.log" | head -12
timeout 60 build/det > "$OUT/det.log" 2>&1; echo "det rc=$?: $(tail -1 "$OUT/det.log")"
for tool in memcheck racecheck synccheck; do
  for b in "build/det small" "build/flashattn check --device cuda --quick"; do
    timeout 75 compute-sanitizer --tool $tool --error-exitcode 3 $b > "$OUT/san_$tool.log" 2>&1
    echo "$tool [$b] rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1) $(grep -E '^check:' "$OUT/san_$tool.log" | tail -1)"
    grep -m3 -E "Invalid|Hazard|Barrier|Device Frame" "$OUT/san_$tool.log"
  done
done
stamp "bench"
S=2048,4096,8192,16384
timeout 150 python3 bench/bench_gpu.py --modes fwd --seqlens $S --d 64,128,256 --out "$OUT/bench" --tag new > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
timeout 60 python3 bench/bench_gpu.py --modes fwd --seqlens $S --d 64,128,256 --impls flashattn \
    --tool build-lead/prev/build/flashattn --out "$OUT/bench_prev" --tag prev > "$OUT/bench_prev.log" 2>&1
echo "bench prev rc=$?"
python3 - "$OUT" <<'PY'
import json, sys, glob
out = sys.argv[1]
def rows(tag):
    r = {}
    for line in open(f"{out}/bench{'' if tag == 'new' else '_prev'}.log"):
        if line.startswith('{"d"'):
            j = json.loads(line); r[(j["d"], j["causal"], j["s"])] = j
    return r
new, prev = rows("new"), rows("prev")
print("| d | causal | s | new | prev | cuDNN | FA2 | new/cuDNN | new/prev |")
print("|---|---|---|---|---|---|---|---|---|")
for key in sorted(new):
    n = new[key]; p = prev.get(key, {})
    f = n["flashattn"]["fwd_tflops"]; c = n["cudnn"]["fwd_tflops"]; a = n["fa2"]["fwd_tflops"]
    pf = p.get("flashattn", {}).get("fwd_tflops", float("nan"))
    print(f"| {key[0]} | {int(key[1])} | {key[2]} | {f:.0f} | {pf:.0f} | {c:.0f} | {a:.0f} | {f/c:.2f} | {f/pf:.2f} |")
PY
stamp end
