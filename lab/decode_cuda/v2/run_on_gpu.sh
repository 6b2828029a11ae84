#!/bin/bash
# lab/decode_cuda/v2: the one device call. From the repository root on the H200:
#     bash lab/decode_cuda/v2/run_on_gpu.sh
# Copies the tree (without build dirs) to /tmp/decode_v2/tree, applies lab/decode_cuda/v2/decode_v2.patch
# there (src/ of this checkout is never touched), builds (sm_90, build-v2/), then:
#   1. check_v2 (no torch): every case × FA_KV_VARIANT = base / slim / deep / wide against the CPU path
#   2. flashattn check --device cuda --only kvcache: --full with wide (slim kernels at every batch),
#      --quick with slim and deep
#   3. compute-sanitizer on san_kv: memcheck with slim / deep / wide, racecheck with deep / wide
#   4. bench_kv (L2 flushed by a 256 MB memset before each timed call, caller workspace, median of 20)
#      per variant: 6 shapes × contiguous / page 16 / page 256, and the 1 × 8k split sweep (detail)
#   5. the side-by-side table, last
# Logs in /tmp/decode_v2/logs, packed into $OUT/decode_v2_logs.tgz. Exit status non-zero if a check failed.
export PYTHONUNBUFFERED=1
SRC=$(pwd)
ROOT=/tmp/decode_v2
TREE=$ROOT/tree
LOGS=$ROOT/logs
BUILD=build-v2
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
VARIANTS="base slim deep wide"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rm -rf "$ROOT" && mkdir -p "$TREE" "$LOGS" || exit 1
tar -C "$SRC" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$TREE" -xf - || exit 1
cd "$TREE" || exit 1
if ! git apply --check lab/decode_cuda/v2/decode_v2.patch; then echo "patch does not apply"; exit 1; fi
git apply lab/decode_cuda/v2/decode_v2.patch || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
if ! make BUILD=$BUILD CUDA_ARCHS=90 -j16 lib $BUILD/flashattn > "$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"; exit 1
fi
grep -E "warning|spill" "$LOGS/build.log" | grep -v " 0 bytes spill" | head -5
stamp built
LIBS="-L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
for prog in lab/decode_cuda/v2/check_v2.c lab/decode_cuda/san_kv.c lab/decode_cuda/bench_kv.c; do
    cc -std=c11 -O2 -Wall -Wextra -Iinclude -I"$CUDA_HOME/include" $prog $BUILD/libflashattn.a $LIBS \
        -o $BUILD/$(basename $prog .c) || exit 1
done
rc=0

timeout 120 $BUILD/check_v2 > "$LOGS/check_v2.log" 2>&1 || rc=1
grep -v PASS "$LOGS/check_v2.log" | tail -20
stamp check_v2
for v in wide slim deep; do
    level=--quick; [ $v = wide ] && level=--full
    FA_KV_VARIANT=$v timeout 120 $BUILD/flashattn check --device cuda --only kvcache $level > "$LOGS/check_$v.log" 2>&1 || rc=1
    echo "flashattn check $level ($v): $(grep -E "^check: [0-9]+ passed" "$LOGS/check_$v.log" | tail -1)"
    grep FAIL "$LOGS/check_$v.log" | head -5
done
stamp checked

SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
for run in memcheck:slim memcheck:deep memcheck:wide racecheck:deep racecheck:wide; do
    tool=${run%%:*} v=${run##*:}
    FA_KV_VARIANT=$v timeout 90 "$SAN" --tool $tool --error-exitcode 3 $BUILD/san_kv > "$LOGS/${tool}_$v.log" 2>&1 || rc=1
    echo "$tool ($v): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/${tool}_$v.log" | tail -1) $(tail -1 "$LOGS/${tool}_$v.log")"
done
stamp sanitized

for v in $VARIANTS; do
    FA_KV_VARIANT=$v timeout 60 $BUILD/bench_kv 0 20 > "$LOGS/sweep_$v.log" 2>&1 || rc=1
done
stamp sweeps
for v in $VARIANTS; do
    FA_KV_VARIANT=$v timeout 60 $BUILD/bench_kv detail 20 > "$LOGS/detail_$v.log" 2>&1 || rc=1
done
stamp details
NCU=$(command -v ncu || echo "$CUDA_HOME/bin/ncu")
for v in base wide; do
    FA_KV_VARIANT=$v timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
        -k regex:fa_kv --launch-skip 3 --launch-count 1 $BUILD/bench_kv ncu > "$LOGS/ncu_$v.log" 2>&1
    echo "== ncu 1 x 8k ($v): $(grep -E "^ +Duration|DRAM Throughput|Warp Cycles Per Issued|No Instruction" "$LOGS/ncu_$v.log" |
        sed 's/  */ /g' | tr '\n' ';')"
done
stamp ncu

for v in $VARIANTS; do echo "== 1 x 8192 split sweep, FA_KV_VARIANT=$v"; cat "$LOGS/detail_$v.log"; done
echo "== bench_kv sweep (dirty flush, heuristic splits): us per call (TB/s); deep / wide fall back to slim when batch x kv heads >= SMs"
awk 'FNR == 1 { v = FILENAME; sub(/.*sweep_/, "", v); sub(/\.log/, "", v); names[++nv] = v }
     $1 ~ /^[0-9]+$/ && NF == 5 { key = $1 " " $2 " " $3; if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
                                   us[key, v] = $4; tb[key, v] = $5 }
     END { printf "%6s %7s %5s", "batch", "seqlen", "page"; for (i = 1; i <= nv; i++) printf " %16s", names[i]; printf "\n"
           for (k = 1; k <= nk; k++) { split(order[k], f, " "); printf "%6s %7s %5s", f[1], f[2], f[3]
               for (i = 1; i <= nv; i++) printf " %7s (%6s)", us[order[k], names[i]], tb[order[k], names[i]]; printf "\n" } }' \
    $(for v in $VARIANTS; do echo "$LOGS/sweep_$v.log"; done)
[ -n "$OUT" ] && tar czf "$OUT/decode_v2_logs.tgz" -C "$ROOT" logs
exit $rc
