#!/bin/bash
# lab/hopper/v2: tile-shape and scheduling variants of the sm_90a forward, from the repository root.
#   build   (no GPU needed) one library per variant, build-hopper2/libhopper_fwd_<name>.so, from
#           the same source with the -D knobs of the VARIANTS table below; ptxas spills/C75xx and a
#           SASS summary per kernel (HGMMA count, LDL/STL, highest register) when cuobjdump exists.
#   device  (the GPU call; the libraries are carried, not rebuilt): quick check of every variant
#           (only the head dims it changes), compute-sanitizer on SANITIZE_VARIANTS, then every
#           variant, cuDNN and FA2 timed in one process on the standard shapes; the table comes last.
#   all     build, then device.
# Env: VARIANTS_ONLY="v1 a" (subset), BENCH_D (default 64,128,256), BENCH_S (default 2048..16384).
set -u
export PYTHONUNBUFFERED=1
MODE=${1:-all}
OUTDIR=${OUT:-/tmp/hopper2_out}
mkdir -p "$OUTDIR"
HERE=lab/hopper/v2
B=build-hopper2
LAB="python3 $HERE/hopper_lab.py"
NVCC=${NVCC:-nvcc}
rc=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

# name | head dims it changes (checked) | -D knobs (hopper_fwd.cu, "tile shapes"). v2 = the
# defaults (d = 64: 192 x 128, 3 consumers; d = 128/256 as v1); the others are the variants of the
# 2026-11-29 run (README.md), each spelled out in full so that it does not depend on the defaults.
VARIANTS="
v1   | 64,128,256 | -DHOPPER_D64_BLOCK_M=128
v2   | 64         |
n176 | 128,64,256 | -DHOPPER_D128_BLOCK_N=176 -DHOPPER_D64_BLOCK_M=192 -DHOPPER_D256_PINGPONG=1
n192 | 128,64,256 | -DHOPPER_D128_BLOCK_N=192 -DHOPPER_D64_BLOCK_M=128 -DHOPPER_D64_BLOCK_N=192 -DHOPPER_D64_STAGES=2 -DHOPPER_D256_BLOCK_N=64
st3  | 128,64,256 | -DHOPPER_D128_CAUSAL_STAGES=3 -DHOPPER_D128_STAGES=3 -DHOPPER_D64_BLOCK_M=192 -DHOPPER_D64_STAGES=2 -DHOPPER_D256_BLOCK_N=64 -DHOPPER_D256_PINGPONG=1
st4  | 64         | -DHOPPER_D64_BLOCK_M=192 -DHOPPER_D64_STAGES=4
"
SANITIZE_VARIANTS=${SANITIZE_VARIANTS:-n176}
names() { echo "$VARIANTS" | awk -F'|' 'NF >= 2 {gsub(/ /, "", $1); print $1}'; }
field() { echo "$VARIANTS" | awk -F'|' -v n="$1" -v f="$2" '{k = $1; gsub(/ /, "", k)} k == n {v = $f; gsub(/^ +| +$/, "", v); print v}'; }
SEL=${VARIANTS_ONLY:-$(names | tr '\n' ' ')}

if [ "$MODE" = build ] || [ "$MODE" = all ]; then
    mkdir -p $B
    FLAGS="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -I$HERE -Xcompiler -fPIC -lineinfo"
    $NVCC $FLAGS -c $HERE/selftime.cu -o $B/selftime.o || exit 1
    for n in $SEL; do
        ( $NVCC $FLAGS $(field $n 3) -Xptxas -v -c $HERE/hopper_fwd.cu -o $B/fwd_$n.o > $B/ptxas_$n.log 2>&1 &&
          $NVCC -shared -o $B/libhopper_fwd_$n.so $B/fwd_$n.o $B/selftime.o ) || { echo "BUILD FAILED: $n"; grep -m5 error $B/ptxas_$n.log; } &
    done
    wait
    CUOBJDUMP=$(command -v cuobjdump || true)
    for c in /usr/local/cuda/bin/cuobjdump /root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump; do
        [ -z "$CUOBJDUMP" ] && [ -x $c ] && CUOBJDUMP=$c
    done
    for n in $SEL; do
        echo "== $n: $(field $n 3)"
        grep -E "spill|C75[0-9][0-9]" $B/ptxas_$n.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head -4
        [ -n "$CUOBJDUMP" ] || continue
        # highest register index = what the consumers use after setmaxnreg; kernel named by its
        # config <D, BLOCK_M, BLOCK_N, STAGES, PINGPONG> and bf16 flag
        $CUOBJDUMP -sass $B/fwd_$n.o | awk '/Function :/ {f = $3} /HGMMA/ {h[f]++} /LDL|STL/ {l[f]++}
            /USETMAXREG.TRY_ALLOC/ {match($0, /0x[0-9a-f]+/); a[f] = substr($0, RSTART, RLENGTH)}
            {s = $0; while (match(s, /R[0-9]+/)) {x = substr(s, RSTART + 1, RLENGTH - 1) + 0; if (x > m[f]) m[f] = x; s = substr(s, RSTART + RLENGTH)}}
            END {for (f in h) {k = f; sub(/.*configILi/, "", k); sub(/EEv.*/, "", k); gsub(/ELi|ELb|EELb/, ",", k);
                 printf "  <%s>: %d HGMMA, %d LDL/STL, setmaxnreg.inc %s, highest R%d\n", k, h[f], l[f], a[f], m[f]}}' | sort
    done
fi
[ "$MODE" = build ] && exit 0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
LIBS=""
for n in $SEL; do LIBS="$LIBS${LIBS:+,}$n=$B/libhopper_fwd_$n.so"; done

# ---- correctness: each variant on the head dims it changes (one process per variant) ------------
for n in $SEL; do
    [ "$n" = v1 ] && continue  # v1 passed its full check and the sanitizers on the H200
    stamp "check $n (quick, d $(field $n 2))"
    timeout 60 $LAB check "$n=$B/libhopper_fwd_$n.so" --quick --d "$(field $n 2)" > "$OUTDIR/check_$n.log" 2>&1
    r=$?; [ $r -ne 0 ] && rc=1
    grep -v "^ok" "$OUTDIR/check_$n.log" | tail -8; echo "  (rc $r)"
done

# ---- compute-sanitizer on the variants with a new protocol (3 consumers) ------------------------
for n in $SANITIZE_VARIANTS; do
    for tool in memcheck synccheck racecheck; do
        stamp "compute-sanitizer $tool $n"
        timeout 45 compute-sanitizer --tool $tool --error-exitcode 3 $LAB sanitize $B/libhopper_fwd_$n.so \
            > "$OUTDIR/${tool}_$n.log" 2>&1
        r=$?; [ $r -ne 0 ] && rc=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|status [1-9]" "$OUTDIR/${tool}_$n.log" | sort | uniq -c | head -4
        echo "  (rc $r)"
    done
done

# ---- timing: all variants, cuDNN, FA2 in one process -----------------------------------------
D=${BENCH_D:-64,128,256}; S=${BENCH_S:-2048,4096,8192,16384}
rm -f "$OUTDIR/bench.json"
stamp "bench (d $D, s $S): $SEL cudnn fa2"
timeout ${BENCH_TIMEOUT:-150} $LAB bench "$LIBS" --d $D --seqlens $S --rep-ms ${REP_MS:-60} --json "$OUTDIR/bench.json" \
    > "$OUTDIR/bench.log" 2>&1 || { rc=1; echo "bench failed:"; tail -5 "$OUTDIR/bench.log"; }
grep -h '"status": [1-9]' "$OUTDIR/bench.json" 2>/dev/null | head -3
stamp "done"
$LAB table "$OUTDIR/bench.json"
exit $rc
