#!/bin/bash
# run_final.sh: the short device call: build (sm_90), full correctness suite, san_bwd repeatability
# + memcheck + racecheck, then, if time is left, the two lab variants on two shapes.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cuda_bwd_out}; mkdir -p "$OUT"
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
make BUILD=build-gpubwd CUDA_ARCHS=90 -j16 lib > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "build $(el) s, bwd warnings: $(grep -i warning "$OUT/build.log" | grep -ci bwd)"
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_backward.c build-gpubwd/libflashattn.a \
    -L"$CUDA_HOME/lib64" -lcudart -lstdc++ -lm -lpthread -ldl -lrt -o build-gpubwd/san_bwd
build-gpubwd/san_bwd > "$OUT/san_plain.log" 2>&1; echo "san_bwd (repeat) rc=$?"; cat "$OUT/san_plain.log"
timeout 60 python3 lab/cuda_bwd/check_bwd.py build-gpubwd/libflashattn.so > "$OUT/check.log" 2>&1
echo "check rc=$? ($(el) s)"; grep -v "^PASS" "$OUT/check.log" | grep -v "Warning\|run_backward" | tail -12
echo "passing: $(grep -c '^PASS' "$OUT/check.log")"
for tool in memcheck racecheck; do
    timeout 25 compute-sanitizer --tool $tool --error-exitcode 9 build-gpubwd/san_bwd 0 1 2 > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log")"
done
if [ "$(el)" -lt 40 ]; then
    NVFLAGS='-O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc --expt-relaxed-constexpr'
    for v in "chunk64 -DFA_BWD_CHUNK_Q=64" "bq128 -DFA_BWD_BLOCK_Q_D64=128"; do
        set -- $v; dir=build-gpubwd-$1
        rm -rf "$dir"; cp -r build-gpubwd "$dir"; rm -f "$dir"/obj/src/cuda/bwd_* "$dir"/libflashattn.*
        make BUILD="$dir" CUDA_ARCHS=90 NVCCFLAGS="$NVFLAGS $2" -j16 "$dir/libflashattn.so" > "$OUT/build_$1.log" 2>&1
    done
    for v in base chunk64 bq128; do
        lib=build-gpubwd-$v/libflashattn.so; [ $v = base ] && lib=build-gpubwd/libflashattn.so
        FA_BENCH_SHAPES="64:4096:0,128:4096:1" timeout 15 python3 lab/cuda_bwd/bench_bwd.py $lib > "$OUT/bench_$v.log" 2>&1
        echo "== $v"; grep -E "^ +(64|128) " "$OUT/bench_$v.log"
    done
fi
echo "total $(el) s"
