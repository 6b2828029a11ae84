#!/bin/sh
# Build lab/cuda_fwd/liblabfwd.so (the CUDA forward + lab_shim.c) and san_fwd (sanitizer driver)
# into $1 (default build-lab). Usage: sh lab/cuda_fwd/build_lab.sh [outdir] [archs, e.g. "90"]
set -e
OUT=${1:-build-lab}
ARCHS=${2:-90}
NVCC=${NVCC:-nvcc}
mkdir -p "$OUT"
GEN=""
for a in $ARCHS; do GEN="$GEN -gencode arch=compute_$a,code=sm_$a"; done
OBJS=""
for f in src/cuda/fa_cuda.cu src/cuda/fwd_hdim64.cu src/cuda/fwd_hdim128.cu src/cuda/fwd_hdim256.cu; do
    o="$OUT/$(basename "$f" .cu).o"
    $NVCC -O3 -std=c++17 -lineinfo -Xcompiler -fPIC -Iinclude -Isrc --expt-relaxed-constexpr $GEN -c "$f" -o "$o" &
    OBJS="$OBJS $o"
done
wait
cc -std=c11 -O2 -fPIC -Iinclude -Isrc -c lab/cuda_fwd/lab_shim.c -o "$OUT/lab_shim.o"
CUDA_HOME=$(dirname "$(dirname "$(command -v $NVCC)")")
cc -shared -o "$OUT/liblabfwd.so" $OBJS "$OUT/lab_shim.o" -L"$CUDA_HOME/lib64" -lcudart -lstdc++ -lm -lpthread
cc -std=c11 -O2 -Iinclude -Isrc -I"$CUDA_HOME/include" lab/cuda_fwd/san_fwd.c -o "$OUT/san_fwd" \
    $OBJS "$OUT/lab_shim.o" -L"$CUDA_HOME/lib64" -lcudart -lstdc++ -lm -lpthread
echo "built $OUT/liblabfwd.so $OUT/san_fwd"
