#!/bin/sh
# lab/cpu/05_tile_sweep.sh: rebuild the library with other tile sizes and time fwd/bwd on one
# thread (CPU-time rate, robust to the shared machine). Usage: sh lab/cpu/05_tile_sweep.sh fwd|bwd
set -e
what=${1:-fwd}
run() {
    b=build-cpu-sweep
    rm -rf $b
    make -s BUILD=$b FA_NO_CUDA=1 CFLAGS="$1" $b/libflashattn.a >/dev/null
    cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc lab/cpu/03_bench.c $b/libflashattn.a -lopenblas -lm -pthread -o $b/bench
    echo "== $1"
    ./$b/bench 1 4 $what | grep -v ISA
}
if [ "$what" = fwd ]; then
    for r in 64 128; do for k in 64 128 256; do
        run "-DFA_CPU_BLOCK_ROWS=$r -DFA_CPU_BLOCK_KEYS=$k"
    done; done
else
    for r in 32 64 128; do for k in 32 64 128; do
        run "-DFA_CPU_BWD_BLOCK_ROWS=$r -DFA_CPU_BWD_BLOCK_KEYS=$k"
    done; done
fi
