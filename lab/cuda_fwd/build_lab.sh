#!/bin/sh
# Build the CUDA forward + lab_shim.c into $1 (default build-lab): liblabfwd.so (for torch/ctypes
# harnesses), san_fwd (sanitizer driver), bench_ours (timing without torch).
# Usage: sh lab/cuda_fwd/build_lab.sh [outdir] [archs, e.g. "90"] [variant]
# variant "V": tile experiment (lab/cuda_fwd/README.md): Q in shared memory for d <= 64, 32-key
# tiles for d = 128 and 256, 2 K/V stages everywhere; applied to a copy of src/ in $OUT.
set -e
OUT=${1:-build-lab}
ARCHS=${2:-90}
VARIANT=${3:-}
NVCC=${NVCC:-nvcc}
mkdir -p "$OUT"
SRC=src
if [ -n "$VARIANT" ]; then
    rm -rf "$OUT/src"
    cp -r src "$OUT/src"
    SRC="$OUT/src"
    T="$SRC/cuda/fa_tiles.h"
    sed -i 's/int fa_fwd_q_in_regs(int bucket) { return bucket <= 64; }/int fa_fwd_q_in_regs(int bucket) { return 0; }/' "$T"
    sed -i 's/int fa_fwd_block_n(int bucket) { return bucket > 0 ? 64 : 0; }/int fa_fwd_block_n(int bucket) { return bucket == 64 ? 64 : bucket > 0 ? 32 : 0; }/' "$T"
    sed -i 's/int fa_fwd_kv_stages(int bucket) { return bucket >= 256 ? 1 : 2; }/int fa_fwd_kv_stages(int bucket) { return 2; }/' "$T"
    grep -c "return 0; }\|? 32 : 0\|return 2; }" "$T"
fi
GEN=""
for a in $ARCHS; do GEN="$GEN -gencode arch=compute_$a,code=sm_$a"; done
OBJS=""
for f in fa_cuda fwd_hdim64 fwd_hdim128 fwd_hdim256; do
    o="$OUT/$f.o"
    $NVCC -O3 -std=c++17 -lineinfo -Xcompiler -fPIC -Iinclude -I"$SRC" -I"$SRC/cuda" --expt-relaxed-constexpr $GEN \
        -c "$SRC/cuda/$f.cu" -o "$o" &
    OBJS="$OBJS $o"
done
wait
for f in $OBJS; do test -f "$f" || { echo "compile failed: $f"; exit 1; }; done
cc -std=c11 -O2 -fPIC -Iinclude -I"$SRC" -c lab/cuda_fwd/lab_shim.c -o "$OUT/lab_shim.o"
CUDA_HOME=$(dirname "$(dirname "$(command -v $NVCC)")")
LIBS="-L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread"
cc -shared -o "$OUT/liblabfwd.so" $OBJS "$OUT/lab_shim.o" $LIBS
cc -std=c11 -O2 -Iinclude -I"$SRC" -I"$CUDA_HOME/include" lab/cuda_fwd/san_fwd.c -o "$OUT/san_fwd" $OBJS "$OUT/lab_shim.o" $LIBS
cc -std=c11 -O2 -Iinclude -I"$SRC" -I"$CUDA_HOME/include" lab/cuda_fwd/bench_ours.c -o "$OUT/bench_ours" $OBJS "$OUT/lab_shim.o" $LIBS
echo "built $OUT: liblabfwd.so san_fwd bench_ours"
