#!/bin/sh
# ab_cli.sh BASE_BUILD NEW_BUILD: the `flashattn bench` bf16 A/B of README.md, alternating
# base, new, base, new for every shape (2 threads, forward and backward, flash only).
base=${1:?base build dir} new=${2:?new build dir}
for shape in "--hq 16 --sq 2048 -d 64" "--hq 16 --sq 2048 -d 128 --causal 1" "-b 4 --hq 8 --sq 1024 -d 128" \
             "--hq 8 --hkv 1 --sq 2048 -d 128" "--hq 16 --sq 1024 -d 256" "--hq 16 --sq 1023 -d 59" \
             "--hq 16 --sq 512 -d 64 --causal 1" "--hq 32 --hkv 8 --sq 64 --sk 4096 -d 128"; do
    for round in 1 2; do
        for build in "$base" "$new"; do
            # shellcheck disable=SC2086
            "$build/flashattn" bench --device cpu --dtype bf16 $shape --mode fwd,bwd --impl flash --threads 2 2>&1 |
                grep '^flashattn bf16' | sed "s|^|$(basename "$build") r$round |"
        done
    done
done
