#!/bin/bash
# run_v2.sh: the one device call for the lab backward kernel v2 (lab/cuda_bwd/v2/README.md), run
# from the repository root on the H200 (16 cores, nvcc 13, torch with SDPA FLASH_ATTENTION):
#   1. builds the default library into build-v1 and the v2 variant (-DFA_BWD_V2 added to the
#      Makefile's own NVCCFLAGS) into build-v2, sm_90, in parallel; reports warnings / spills
#   2. lab/cuda_bwd/check_bwd.py on build-v2: the full correctness suite (34 cases)
#   3. timing, v1 vs v2 vs SDPA FLASH_ATTENTION (FA2), d = 64/128/256 × causal 0/1 × s = 1k/4k/16k,
#      one process, same tensors (lab/cuda_bwd/v2/bench_v2.py, do_bench rep 60 ms)
#   4. tests/gpu/fa_gpu_backward.c linked with build-v2/libflashattn.a: repeatability, then
#      compute-sanitizer memcheck and racecheck on its problems 0, 1, 2 (d = 64, 128, 256)
# then prints a summary and the timing table last. Logs go to $OUT (default /tmp/cuda_bwd_v2_out).
# Exit status 0 only if everything built and every correctness / sanitizer step passed.
# Usage: bash lab/cuda_bwd/run_v2.sh [--dry]   (--dry: on a machine without a GPU, check the
#        Makefile flags and the Python parts' argument parsing; builds nothing)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cuda_bwd_v2_out}
mkdir -p "$OUT"
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1

# The Makefile's NVCCFLAGS (a command-line NVCCFLAGS replaces them, so v2 passes them all + the macro).
DEFAULT_NVCCFLAGS=$(make -pn BUILD=build-v2 lib 2>/dev/null | sed -n 's/^NVCCFLAGS = //p' | head -1)
if [ -z "$DEFAULT_NVCCFLAGS" ]; then echo "run_v2: cannot read NVCCFLAGS from the Makefile"; exit 1; fi
V2_NVCCFLAGS="$DEFAULT_NVCCFLAGS -DFA_BWD_V2"
echo "v2 NVCCFLAGS: $V2_NVCCFLAGS"
if [ $DRY = 1 ]; then
    python3 lab/cuda_bwd/v2/bench_v2.py build-v1/libflashattn.so build-v2/libflashattn.so --dry || exit 1
    python3 -c "import ast,sys; ast.parse(open('lab/cuda_bwd/check_bwd.py').read())" || exit 1
    echo "run_v2: dry run ok"
    exit 0
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
FAIL=""

# ---- 1. builds (fresh directories: the Makefile does not track flag changes) ----
rm -rf build-v1 build-v2
timeout 200 make BUILD=build-v1 CUDA_ARCHS=90 -j8 lib > "$OUT/build_v1.log" 2>&1 &
P1=$!
timeout 200 make BUILD=build-v2 CUDA_ARCHS=90 -j8 lib NVCCFLAGS="$V2_NVCCFLAGS" > "$OUT/build_v2.log" 2>&1 &
P2=$!
wait $P1; R1=$?
wait $P2; R2=$?
# (the forward's 20-byte spill at d = 128, NOTES.md, is older than v2: count the backward's lines only)
echo "build v1 rc=$R1, v2 rc=$R2 ($(el) s); warning lines: v1 $(grep -i warning "$OUT/build_v1.log" | grep -vc fwd_kernel), v2 $(grep -i warning "$OUT/build_v2.log" | grep -vc fwd_kernel) (backward; forward: $(grep -i warning "$OUT/build_v2.log" | grep -c fwd_kernel))"
grep -i "warning\|error" "$OUT/build_v2.log" | grep -v fwd_kernel | head -8
if [ $R1 != 0 ] || [ $R2 != 0 ] || [ ! -f build-v2/libflashattn.so ] || [ ! -f build-v1/libflashattn.so ]; then
    tail -30 "$OUT/build_v2.log"; tail -10 "$OUT/build_v1.log"
    echo "run_v2: BUILD FAILED"; exit 1
fi

# ---- 2. correctness of v2 (full suite) ----
timeout 130 python3 lab/cuda_bwd/check_bwd.py build-v2/libflashattn.so > "$OUT/check_v2.log" 2>&1
RC=$?
SUMMARY=$(grep "^check_bwd:" "$OUT/check_v2.log" | tail -1)
NFAIL=$(echo "$SUMMARY" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
NPASS=$(echo "$SUMMARY" | sed -n 's/check_bwd: \([0-9]*\) passed.*/\1/p')
echo "check_bwd v2 rc=$RC ($(el) s): ${SUMMARY:-no summary line}"
grep -v "^PASS" "$OUT/check_v2.log" | grep -v "^check_bwd:" | head -20
if [ $RC != 0 ] || [ -z "$NFAIL" ] || [ "$NFAIL" != 0 ] || [ "${NPASS:-0}" -lt 34 ]; then FAIL="$FAIL check_bwd"; fi

# ---- 3. timing ----
timeout 170 python3 lab/cuda_bwd/v2/bench_v2.py build-v1/libflashattn.so build-v2/libflashattn.so --rep 60 \
    > "$OUT/bench_v2.log" 2>&1
echo "bench rc=$? ($(el) s)"
grep -E "main kernel|WARNING|rror" "$OUT/bench_v2.log" | head -6
sed -n '/^backward TFLOP\/s/,$p' "$OUT/bench_v2.log"

# ---- 4. repeatability + sanitizers on the v2 static library ----
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
if cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c build-v2/libflashattn.a \
    -L"$CUDA_HOME/lib64" -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o build-v2/san_bwd > "$OUT/san_build.log" 2>&1; then
    timeout 20 build-v2/san_bwd > "$OUT/san_plain.log" 2>&1
    R=$?; echo "san_bwd (repeatability) rc=$R: $(tail -1 "$OUT/san_plain.log")"
    [ $R = 0 ] || { FAIL="$FAIL repeatability"; cat "$OUT/san_plain.log"; }
    for tool in memcheck racecheck; do
        T0=$(date +%s)
        LEFT=$(( 570 - $(el) )) # stay inside one 600-second device call
        if [ $LEFT -lt 20 ]; then echo "$tool skipped (time)"; FAIL="$FAIL $tool(skipped)"; continue; fi
        [ $LEFT -gt 75 ] && LEFT=75
        timeout $LEFT compute-sanitizer --tool $tool --error-exitcode 9 build-v2/san_bwd 0 1 2 > "$OUT/$tool.log" 2>&1
        R=$?
        echo "$tool rc=$R ($(( $(date +%s) - T0 )) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tr '\n' ' ')"
        [ $R = 0 ] || { FAIL="$FAIL $tool"; grep -E "Invalid|Race|hazard|rror|FAIL" "$OUT/$tool.log" | head -6; }
    done
else
    FAIL="$FAIL san_build"; tail -5 "$OUT/san_build.log"
fi

# ---- summary, table last ----
echo
echo "== run_v2 summary ($(el) s): check_bwd v2 ${SUMMARY:-?}; failures:${FAIL:- none}"
sed -n '/^backward TFLOP\/s/,$p' "$OUT/bench_v2.log"
[ -z "$FAIL" ]
