#!/bin/bash
# One H200 device call for the deterministic Hopper backward (lab/hopper_bwd/deterministic/det.patch),
# from the repository root; about 4 minutes, every step under a timeout (a semaphore bug hangs a
# kernel: the timeout kills the process, the last "ok" line printed names the case before it):
#   1. copy the tree to a scratch directory, git apply the patch, make BUILD=build-det
#      CUDA_ARCHS=90 -j16 all (warnings counted), ptxas -v of the two Hopper backward files
#      (registers, spills of every instantiation, deterministic ones included);
#   2. tests/gpu/fa_gpu_bwd_paths.c det: deterministic = 1 on the 23 cases of the file (non-causal,
#      causal, GQA/MQA, varlen with empty sequences, windows, sinks, packed and padded layouts,
#      d 64/96/128/192/256) + 5 cases of 4k-8k tokens whose key-block chains span several waves:
#      against the portable kernel, nothing unwritten or stray, dq/dk/dv bitwise equal over 3
#      default runs; then without det (the non-deterministic kernels unchanged);
#   3. tests/gpu/fa_gpu_backward.c and fa_gpu_determinism.c (repeatability, all paths);
#   4. flashattn check --device cuda --full (the randomised sweep; non-deterministic path);
#   5. compute-sanitizer memcheck / racecheck / synccheck on fa_gpu_bwd_paths small det;
#   6. timing, d = 128, 16k tokens, h = 16, s = 4k and 16k, causal and not: Hopper backward,
#      Hopper deterministic, portable deterministic (FA_CUDA_BACKWARD=portable).
# Usage: bash lab/hopper_bwd/deterministic/run_on_gpu.sh [all|test|sanitize|bench]
# Logs in $OUT (default /tmp/hopper_det_out). Exit status: number of failed steps.
set -u
MODE=${1:-all}
ROOT=$(pwd)
HERE=lab/hopper_bwd/deterministic
OUTDIR=${OUT:-/tmp/hopper_det_out}
mkdir -p "$OUTDIR"
SCRATCH=${DET_SCRATCH:-/tmp/fa_det_tree}
B=build-det
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
fails=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
step() { # step NAME SECONDS COMMAND...: run under a timeout, log, count failures
    local name=$1 secs=$2; shift 2
    stamp "== $name (timeout $secs s)"
    timeout -k 5 "$secs" "$@" > "$OUTDIR/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$OUTDIR/$name.log"
    if [ $rc -ne 0 ]; then
        fails=$((fails + 1))
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "!! $name: TIMED OUT (hang?)"; else echo "!! $name: rc=$rc"; fi
    fi
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
"$NVCC" --version | tail -1

# ---- 1. patched copy and build -------------------------------------------------------------------
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$SCRATCH" || exit 99
cd "$SCRATCH" || exit 99
if git apply --check "$ROOT/$HERE/det.patch" 2> /dev/null; then
    git apply "$ROOT/$HERE/det.patch" || exit 99
else # the tree moved since the patch was made: context fuzz, loudly
    echo "!! git apply --check failed; trying patch -p1 -F3 (check the hunks it reports)"
    patch -p1 -F3 --no-backup-if-mismatch < "$ROOT/$HERE/det.patch" || { echo "PATCH DOES NOT APPLY"; exit 99; }
fi
stamp "patched copy in $SCRATCH"
make BUILD=$B CUDA_ARCHS=90 NVCC="$NVCC" -j16 all > "$OUTDIR/build.log" 2>&1 || { tail -40 "$OUTDIR/build.log"; echo "BUILD FAILED"; exit 99; }
echo "build warnings: $(grep -ci 'warning' "$OUTDIR/build.log")"
grep -i -B2 'warning' "$OUTDIR/build.log" | head -20
F="-O3 -std=c++17 -Xcompiler -fPIC -Iinclude -Isrc --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Xptxas -v"
for f in bwd_hopper_sm90a bwd_hopper256_sm90a; do
    "$NVCC" $F -c src/cuda/$f.cu -o /tmp/$f.ptxas.o > "$OUTDIR/ptxas_$f.log" 2>&1 &
done
wait
echo "ptxas: <kernel template args> registers, spills (ILi<bucket>ELb<bf16>ELb<det>, 256: ILb<bf16>ELb<det>)"
cat "$OUTDIR"/ptxas_*.log | grep -E "Compiling entry|spill|Used" | grep -A2 "main_kernel" | grep -v "^--" |
    sed -E 's/.*(fa_hbwd[0-9]*_main_kernelI[^E]*E[^E]*E[^E]*E[^E]*E).*/\1/; s/ptxas info *: //' | paste - - - | sed -E 's/ +/ /g'
CC_FLAGS="-std=c11 -O2 -Wall -Wextra -Iinclude -I$CUDA_HOME/include"
LIBS="$B/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
for t in fa_gpu_bwd_paths fa_gpu_backward fa_gpu_determinism; do
    cc $CC_FLAGS tests/gpu/$t.c $LIBS -o $B/$t || { echo "BUILD FAILED: $t"; exit 99; }
done
stamp "built"

# ---- 2-4. tests ----------------------------------------------------------------------------------
if [ "$MODE" = all ] || [ "$MODE" = test ]; then
    step bwd_paths_det 240 ./$B/fa_gpu_bwd_paths det
    step bwd_paths 60 ./$B/fa_gpu_bwd_paths
    step gpu_backward 30 ./$B/fa_gpu_backward
    step determinism 30 ./$B/fa_gpu_determinism
    step check_full 120 ./$B/flashattn check --device cuda --full
fi

# ---- 5. compute-sanitizer ------------------------------------------------------------------------
if [ "$MODE" = all ] || [ "$MODE" = sanitize ]; then
    for tool in memcheck racecheck synccheck; do
        step "san_$tool" 120 "$SAN" --tool $tool --error-exitcode 3 ./$B/fa_gpu_bwd_paths small det
    done
fi

# ---- 6. timing -----------------------------------------------------------------------------------
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    BENCH="./$B/flashattn bench --device cuda --mode bwd --impl flash -d 128 --hq 16 --tokens 16384 --sq 4096,16384 --causal both --warmup 3 --repeats 20"
    step bench_hopper 60 $BENCH
    step bench_hopper_det 60 $BENCH --deterministic
    step bench_portable_det 90 env FA_CUDA_BACKWARD=portable $BENCH --deterministic
    echo "== backward, d = 128, 16k tokens, h = 16 (tables above: Hopper, Hopper det, portable det)"
fi
stamp "done: $fails failed step(s)"
exit $fails
