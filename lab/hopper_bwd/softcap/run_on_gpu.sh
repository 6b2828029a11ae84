#!/bin/sh
# run_on_gpu.sh: validate softcap.patch (Hopper backward softcap) on the H200. From the repository
# root:  sh lab/hopper_bwd/softcap/run_on_gpu.sh [OUT_DIR]
# Copies the tree (no build dirs, no .git) to a scratch dir, applies the patch, builds the library
# (sm_90 + sm_90a), and runs, each step timed, logs under OUT_DIR (default $OUT or /tmp/softcap-out):
#   1. ptxas spill / wgmma-serialisation warnings of the build (grep of the build log)
#   2. tests/gpu/fa_gpu_bwd_paths.c (patched: + softcap cases), big problems
#   3. flashattn check --device cuda --full (float64 reference; softcap recipes included)
#   4. compute-sanitizer memcheck / racecheck / synccheck on fa_gpu_bwd_paths small
#   5. bench_softcap: backward ms with / without softcap, default (Hopper) vs portable
# Exit status: number of failed steps (0 = all passed). Budget: ~4-5 min on 16 cores.
set -u
ROOT=$(pwd)
HERE="$ROOT/lab/hopper_bwd/softcap"
OUT_DIR=${1:-${OUT:-/tmp/softcap-out}}
SCRATCH=${SCRATCH:-/tmp/softcap-tree}
mkdir -p "$OUT_DIR"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
failed=0
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
fail() { echo "FAILED: $1"; failed=$((failed + 1)); }
t0=$(date +%s)

step "copy + patch"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$SCRATCH" || exit 100
cd "$SCRATCH" || exit 100
if command -v git > /dev/null; then
    git apply --check "$HERE/softcap.patch" && git apply "$HERE/softcap.patch" || { echo "patch does not apply"; exit 100; }
else
    patch -p1 < "$HERE/softcap.patch" > "$OUT_DIR/patch.log" || { echo "patch does not apply"; exit 100; }
fi

step "build (make BUILD=build-softcap CUDA_ARCHS=90 -j16 all)"
if ! make BUILD=build-softcap CUDA_ARCHS=90 -j16 all > "$OUT_DIR/build.log" 2>&1; then
    tail -40 "$OUT_DIR/build.log"; echo "build failed"; exit 100
fi
nvcc --version | tail -2
echo "build done in $(( $(date +%s) - t0 )) s"

step "1. ptxas warnings of the Hopper backward (fa_hbwd*: spills, wgmma serialisation) in the build log"
grep -E "warning" "$OUT_DIR/build.log" | grep -v "fa_hbwd" | sed 's/^/(elsewhere, not this patch) /'
if grep -E "warning" "$OUT_DIR/build.log" | grep -E "fa_hbwd|wgmma"; then
    fail "the Hopper backward kernels printed warnings (see above)"
else
    echo "none in fa_hbwd*"
fi

CUDA_LIBS=$(make -s BUILD=build-softcap print-cuda-libs)
step "2. fa_gpu_bwd_paths (big problems, softcap cases included)"
BWDP=build-softcap/fa_gpu_bwd_paths
cc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_bwd_paths.c \
    build-softcap/libflashattn.a -lm -pthread $CUDA_LIBS -o "$BWDP" || { fail "build $BWDP"; BWDP=; }
if [ -n "$BWDP" ]; then
    "$BWDP" 2>&1 | tee "$OUT_DIR/bwd_paths.log" | grep -E "FAIL|softcap|softmax_scale|passed"
    grep -q " 0 failed" "$OUT_DIR/bwd_paths.log" || fail "fa_gpu_bwd_paths"
fi

step "3. flashattn check --device cuda --full"
./build-softcap/flashattn check --device cuda --full > "$OUT_DIR/check_full.log" 2>&1 || fail "check --full"
grep -iE "fail|softcap" "$OUT_DIR/check_full.log" | head -20
tail -3 "$OUT_DIR/check_full.log"

step "4. compute-sanitizer on fa_gpu_bwd_paths small"
if [ -n "$BWDP" ]; then
    for tool in memcheck racecheck synccheck; do
        "$SAN" --tool "$tool" --error-exitcode 3 "$BWDP" small > "$OUT_DIR/san_$tool.log" 2>&1 || fail "$tool"
        echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed' "$OUT_DIR/san_$tool.log" | tr '\n' ' ')"
    done
fi

step "5. bench_softcap (backward ms, default vs portable)"
cc -std=c11 -O2 -Wall -Wextra -Iinclude -I"$CUDA_HOME/include" "$HERE/bench_softcap.c" build-softcap/libflashattn.a \
    -lm -pthread $CUDA_LIBS -o build-softcap/bench_softcap && ./build-softcap/bench_softcap | tee "$OUT_DIR/bench.log" \
    || fail "bench_softcap"

echo
echo "run_on_gpu.sh: $failed failed step(s), $(( $(date +%s) - t0 )) s in all; logs in $OUT_DIR"
exit "$failed"
