#!/bin/bash
# run3b.sh: device call 2 of lab/cuda_bwd/v3. Prebuilt (dev machine, nvcc 13, sm_90) libraries and
# test programs in build-bwd3-carry/pk.tar.xz: base (before), v4 (dQ fast path, 16-byte reductions),
# v2f (fast path, 8-byte reductions), bulk (dQ staged in smem + cp.reduce.async.bulk at d <= 128).
#   1. timing of all four vs FA2 (bench3.py, same process)
#   2. for v4 and bulk, in parallel: check_bwd.py (34 cases), flashattn check --device cuda --full,
#      fa_gpu_backward repeatability, compute-sanitizer memcheck and racecheck (problems 0 1 2)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/bwd3b}; mkdir -p "$OUT"
P=/tmp/pk3; rm -rf $P; mkdir -p $P; xz -dc build-bwd3-carry/pk.tar.xz | tar -C $P -xf -
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 45 python3 lab/cuda_bwd/v3/bench3.py base=$P/base.so v4=$P/v4.so bulk=$P/bulk.so --rep 25 \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(el) s)"
for v in v4 bulk; do
    ( timeout 65 python3 lab/cuda_bwd/check_bwd.py $P/$v.so > "$OUT/chk_$v.log" 2>&1; echo "rc=$?" >> "$OUT/chk_$v.log" ) &
    ( timeout 65 $P/flashattn_$v check --device cuda --full > "$OUT/fa_$v.log" 2>&1; echo "rc=$?" >> "$OUT/fa_$v.log" ) &
    ( timeout 20 $P/san_$v > "$OUT/rep_$v.log" 2>&1; echo "rc=$?" >> "$OUT/rep_$v.log"
      timeout 55 compute-sanitizer --tool memcheck --error-exitcode 9 $P/san_$v 0 1 2 > "$OUT/mem_$v.log" 2>&1; echo "rc=$?" >> "$OUT/mem_$v.log" ) &
    ( timeout 65 compute-sanitizer --tool racecheck --error-exitcode 9 $P/san_$v 0 1 2 > "$OUT/race_$v.log" 2>&1; echo "rc=$?" >> "$OUT/race_$v.log" ) &
done
wait
echo "validation done ($(el) s)"
for v in v4 bulk; do
    echo "== $v: check_bwd: $(grep '^check_bwd:' "$OUT/chk_$v.log" | tail -1) $(tail -1 "$OUT/chk_$v.log")"
    grep -v "^PASS" "$OUT/chk_$v.log" | grep -v "^check_bwd:\|^rc=" | head -5
    echo "   flashattn check: $(tail -3 "$OUT/fa_$v.log" | tr '\n' ' ' | cut -c1-300)"
    grep -i "fail" "$OUT/fa_$v.log" | head -5
    echo "   repeat: $(tail -2 "$OUT/rep_$v.log" | tr '\n' ' ')"
    echo "   memcheck: $(grep -E 'ERROR SUMMARY' "$OUT/mem_$v.log" | tr '\n' ' ') $(tail -1 "$OUT/mem_$v.log")"
    echo "   racecheck: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/race_$v.log" | tr '\n' ' ') $(tail -1 "$OUT/race_$v.log")"
    grep -E "Invalid|hazard|Error" "$OUT/mem_$v.log" "$OUT/race_$v.log" | head -4
done
sed -n '/^backward TFLOP/,$p' "$OUT/bench.log"
grep -i "error\|Traceback" "$OUT/bench.log" | head -3
