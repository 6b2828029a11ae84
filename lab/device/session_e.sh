#!/bin/bash
# Session 2 device call 2: the Hopper forward in the library (src/cuda/fwd_hopper_sm90a.cu):
# build, SASS check, full GPU sweep (default kernels = Hopper on sm_90), determinism, forward
# bench against SDPA cuDNN/FA2, portable sweep, sanitizers, backward repeatability. Logs in $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d build-lead/pin ] && cp -r build-lead/pin/. . && echo "pinned: $(cd build-lead/pin && find . -type f | tr "\n" " ")"
make BUILD=build CUDA_ARCHS=90 -j16 all > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
LINK="build/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_determinism.c $LINK -o build/det
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c $LINK -o build/bwd
stamp built
TD=$(python3 -c "import triton, os; print(os.path.dirname(triton.__file__))" 2>/dev/null)
CUOBJDUMP=$TD/backends/nvidia/bin/cuobjdump
if [ -x "$CUOBJDUMP" ]; then
  $CUOBJDUMP -sass build/obj/src/cuda/fwd_hopper_sm90a.o > "$OUT/sass.txt" 2>&1
  awk '/Function :/ {f = $3} /HGMMA/ {h[f]++} /LDL|STL/ {l[f]++}
       END {for (f in h) printf "SASS %s: %d HGMMA, %d LDL/STL\n", f, h[f], l[f] + 0}' "$OUT/sass.txt" | sort
fi
timeout 150 build/flashattn check --device cuda --full > "$OUT/check_full.log" 2>&1
echo "check full (hopper) rc=$?: $(tail -1 "$OUT/check_full.log")"; grep -E "FAIL|ERROR" "$OUT/check_full.log" | head -12
timeout 60 build/det > "$OUT/det.log" 2>&1; echo "det rc=$?: $(tail -1 "$OUT/det.log")"
stamp "bench"
timeout 200 python3 bench/bench_gpu.py --modes fwd --seqlens 2048,4096,8192,16384 --d 64,128,256 \
    --out "$OUT/bench" --tag hopper-fwd > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -28 "$OUT/bench.log"
stamp "portable quick"
FA_CUDA_FORWARD=portable timeout 60 build/flashattn check --device cuda --quick > "$OUT/check_portable.log" 2>&1
echo "check quick (portable) rc=$?: $(tail -1 "$OUT/check_portable.log")"; grep -E "FAIL|ERROR" "$OUT/check_portable.log" | head -5
timeout 40 build/bwd > "$OUT/bwd.log" 2>&1; echo "bwd rc=$?: $(tail -1 "$OUT/bwd.log")"
for tool in memcheck racecheck synccheck; do
  for b in "build/det small" "build/flashattn check --device cuda --quick"; do
    [ $(( $(date +%s) - t0 )) -gt 540 ] && { echo "skip $tool $b (time)"; continue; }
    timeout 75 compute-sanitizer --tool $tool --error-exitcode 3 $b > "$OUT/san_$tool.log" 2>&1
    echo "$tool [$b] rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1) $(grep -E '^check:' "$OUT/san_$tool.log" | tail -1)"
    grep -m3 -E "Invalid|Hazard|Barrier|Device Frame" "$OUT/san_$tool.log"
  done
done
stamp end
