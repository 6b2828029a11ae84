#!/bin/sh
# run_on_gpu.sh: validate gqa_pack.patch (packed GQA/MQA tiles in the Hopper forward) on the H200.
# From the repository root:  sh lab/hopper/gqa_pack/run_on_gpu.sh [OUT_DIR]
# Copies the tree (no build dirs, no .git) to a scratch dir, applies the patch, builds (sm_90 +
# sm_90a), then, each step timed, logs under OUT_DIR (default $OUT or /tmp/gqa-pack-out):
#   1. ptxas warnings of the Hopper forward (spills, C75xx wgmma serialisation) in the build log
#   2. fa_gpu_paths: default (Hopper) vs portable kernel, the 11 packed cases included
#   3. flashattn check --device cuda --full with FA_CUDA_PACK_GQA=1 (float64 reference; every
#      GQA/MQA recipe with sq <= 64 runs packed), then --quick with FA_CUDA_PACK_GQA=0
#   4. compute-sanitizer memcheck / racecheck / synccheck on `fa_gpu_paths packed`
#   5. timing: packed (FA_CUDA_PACK_GQA=1) vs unpacked (=0) vs portable (FA_CUDA_FORWARD=portable)
#      on small-sq GQA shapes, interleaved shape by shape, the table last
# Exit status: number of failed steps (0 = all passed). Budget: ~4 min on 16 cores.
set -u
ROOT=$(pwd)
HERE="$ROOT/lab/hopper/gqa_pack"
OUT_DIR=${1:-${OUT:-/tmp/gqa-pack-out}}
SCRATCH=${SCRATCH:-/tmp/gqa-pack-tree}
B=build-gqapack
mkdir -p "$OUT_DIR"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
failed=0
step() { printf '\n== %s (%s, %s s)\n' "$1" "$(date +%T)" "$(( $(date +%s) - t0 ))"; }
fail() { echo "FAILED: $1"; failed=$((failed + 1)); }
t0=$(date +%s)

step "copy + patch"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$SCRATCH" || exit 100
cd "$SCRATCH" || exit 100
if command -v git > /dev/null; then
    git apply --check "$HERE/gqa_pack.patch" && git apply "$HERE/gqa_pack.patch" || { echo "patch does not apply"; exit 100; }
else
    patch -p1 < "$HERE/gqa_pack.patch" > "$OUT_DIR/patch.log" || { echo "patch does not apply"; exit 100; }
fi

step "build (make BUILD=$B CUDA_ARCHS=90 -j16 all)"
if ! make BUILD=$B CUDA_ARCHS=90 -j16 all > "$OUT_DIR/build.log" 2>&1; then
    tail -40 "$OUT_DIR/build.log"; echo "build failed"; exit 100
fi
nvcc --version | tail -1

step "1. ptxas warnings of the Hopper forward (fa_hopper_fwd_kernel: spills, C75xx) in the build log"
grep -E "warning" "$OUT_DIR/build.log" | grep -v "fa_hopper_fwd" | sed 's/^/(elsewhere, not this patch) /'
if grep -E "warning" "$OUT_DIR/build.log" | grep -E "fa_hopper_fwd|fwd_hopper"; then
    fail "the Hopper forward printed warnings (see above)"
else
    echo "none in fa_hopper_fwd_kernel (12 instantiations: 3 buckets x 2 dtypes x packed/unpacked)"
fi

CUDA_LIBS=$(make -s BUILD=$B print-cuda-libs)
PATHS=$B/fa_gpu_paths
step "2. fa_gpu_paths (default vs portable; packed cases)"
cc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_paths.c \
    $B/libflashattn.a -lm -pthread $CUDA_LIBS -o "$PATHS" || { fail "build $PATHS"; PATHS=; }
if [ -n "$PATHS" ]; then
    "$PATHS" > "$OUT_DIR/paths.log" 2>&1
    cat "$OUT_DIR/paths.log"
    grep -q " 0 failed" "$OUT_DIR/paths.log" || fail "fa_gpu_paths"
fi

step "3. flashattn check --device cuda --full, packed forced (FA_CUDA_PACK_GQA=1)"
FA_CUDA_PACK_GQA=1 ./$B/flashattn check --device cuda --full > "$OUT_DIR/check_full.log" 2>&1 || fail "check --full (packed)"
grep -iE "fail" "$OUT_DIR/check_full.log" | head -20
tail -2 "$OUT_DIR/check_full.log"
echo "-- --quick, packing off (FA_CUDA_PACK_GQA=0)"
FA_CUDA_PACK_GQA=0 ./$B/flashattn check --device cuda --quick > "$OUT_DIR/check_quick_off.log" 2>&1 || fail "check --quick (unpacked)"
tail -1 "$OUT_DIR/check_quick_off.log"

step "4. compute-sanitizer on fa_gpu_paths packed"
if [ -n "$PATHS" ]; then
    for tool in memcheck racecheck synccheck; do
        "$SAN" --tool "$tool" --error-exitcode 3 "$PATHS" packed > "$OUT_DIR/san_$tool.log" 2>&1 || fail "$tool"
        echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed' "$OUT_DIR/san_$tool.log" | tr '\n' ' ')"
    done
fi

step "5. timing (flashattn bench --impl flash, median ms, bf16 forward)"
ms() { grep -o '"ms":[-0-9.e]*' | head -1 | cut -d: -f2; }
TABLE="$OUT_DIR/table.txt"
printf '%-44s %10s %10s %10s %8s %8s\n' "shape (bf16 fwd)" "packed" "unpacked" "portable" "unp/pk" "port/pk" > "$TABLE"
# b sq sk hq hkv d causal
for shape in "1 4 8192 32 8 128 1" "4 4 8192 32 8 128 1" "16 4 8192 32 8 128 1" "8 16 4096 32 4 128 1" \
             "16 1 8192 64 8 64 0" "4 64 8192 32 8 128 1" "16 32 4096 16 2 256 1"; do
    set -- $shape
    args="--device cuda --impl flash --json --repeats 30 --warmup 5 -b $1 --sq $2 --sk $3 --hq $4 --hkv $5 -d $6 --causal $7"
    pk=$(FA_CUDA_PACK_GQA=1 ./$B/flashattn bench $args 2>/dev/null | ms)
    un=$(FA_CUDA_PACK_GQA=0 ./$B/flashattn bench $args 2>/dev/null | ms)
    po=$(FA_CUDA_FORWARD=portable ./$B/flashattn bench $args 2>/dev/null | ms)
    printf '%-44s %10s %10s %10s %8s %8s\n' "b$1 sq$2 sk$3 hq$4/hkv$5 d$6 causal$7" "${pk:-?}" "${un:-?}" "${po:-?}" \
        "$(awk -v a="${un:-0}" -v b="${pk:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "?" }')" \
        "$(awk -v a="${po:-0}" -v b="${pk:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "?" }')" >> "$TABLE"
done

echo
echo "run_on_gpu.sh: $failed failed step(s), $(( $(date +%s) - t0 )) s in all; logs in $OUT_DIR"
cat "$TABLE"
exit "$failed"
