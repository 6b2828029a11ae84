#!/bin/bash
# run_variants.sh: build lab variants of the backward main kernel (compile-time knobs) next to
# build-gpubwd, time them on a few shapes in one process each, and take one Nsight Compute
# warp-state profile of the default build. Usage: bash lab/cuda_bwd/run_variants.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cuda_bwd_out}
NVFLAGS='-O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc --expt-relaxed-constexpr -Xptxas=--warn-on-spills'
variant() { # name extra-nvcc-flags
    local dir=build-gpubwd-$1
    rm -rf "$dir"; cp -r build-gpubwd "$dir"; rm -f "$dir"/obj/src/cuda/bwd_* "$dir"/libflashattn.*
    make BUILD="$dir" CUDA_ARCHS=90 LDLIBS="-lm -pthread -lstdc++" NVCCFLAGS="$NVFLAGS $2" -j16 "$dir/libflashattn.so" > "$OUT/build_$1.log" 2>&1 \
        || { echo "variant $1 build failed"; tail -5 "$OUT/build_$1.log"; }
}
variant chunk64 "-DFA_BWD_CHUNK_Q=64"
variant bq128 "-DFA_BWD_BLOCK_Q_D64=128"
SHAPES="64:4096:0,64:4096:1,128:4096:0,128:4096:1,128:16384:0"
for v in chunk64 bq128; do
    FA_BENCH_SHAPES=$SHAPES timeout 60 python3 lab/cuda_bwd/bench_bwd.py build-gpubwd-$v/libflashattn.so > "$OUT/bench_$v.log" 2>&1
    echo "== variant $v (spills: $(grep -c spill "$OUT/build_$v.log"))"; grep -v "^{" "$OUT/bench_$v.log" | grep -v "^$" | tail -7
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 "$NCU" --clock-control none -k regex:fa_bwd_main --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy \
    python3 lab/cuda_bwd/ncu_one.py build-gpubwd/libflashattn.so 128 4096 0 > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "Duration|Throughput|Stall|Warp Cycles|Issued|Active Warps|Theoretical Occ|Registers" "$OUT/ncu.txt" | head -40
