#!/bin/bash
# Session 2 device call 6: Hopper forward scheduling variants, one build tree each under
# build-lead/var (base = the working tree: round robin, persistent only non-causal; A = key-tile
# order rotated per query block; B = snake tile order and persistent causal too; AB = both).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOGS=/tmp/logs; mkdir -p $LOGS
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
V="base A B AB"
for v in $V; do (make -C build-lead/var/$v BUILD=build CUDA_ARCHS=90 -j4 all > $LOGS/build_$v.log 2>&1 || echo "BUILD $v FAILED") & done
wait
stamp built
for v in $V; do
  timeout 40 build-lead/var/$v/build/flashattn check --device cuda --quick > $LOGS/check_$v.log 2>&1
  r=$?; echo "check $v rc=$r: $(tail -1 $LOGS/check_$v.log)"; grep -E "FAIL|ERROR" $LOGS/check_$v.log | head -4
done
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 3 build-lead/var/AB/build/flashattn check --device cuda --quick > $LOGS/race.log 2>&1
echo "racecheck AB rc=$?: $(grep 'RACECHECK SUMMARY' $LOGS/race.log)"
S=2048,4096,8192,16384
for v in $V; do
  IMPLS=flashattn; [ $v = base ] && IMPLS=flashattn,cudnn
  timeout 80 python3 bench/bench_gpu.py --modes fwd --seqlens $S --d 64,128,256 --impls $IMPLS \
      --tool build-lead/var/$v/build/flashattn --out $LOGS/b_$v --tag $v > $LOGS/bench_$v.log 2>&1 || echo "bench $v failed"
done
stamp benched
python3 - $LOGS $V <<'PY'
import json, sys
logs, vs = sys.argv[1], sys.argv[2:]
res = {}
for v in vs:
    for line in open(f"{logs}/bench_{v}.log"):
        if line.startswith('{"d"'):
            j = json.loads(line); res.setdefault((j["d"], j["causal"], j["s"]), {})[v] = j
print("| d | causal | s | " + " | ".join(vs) + " | cuDNN | " + " | ".join(f"{v}/cuDNN" for v in vs) + " |")
print("|---" * (4 + 2 * len(vs)) + "|")
for key in sorted(res):
    r = res[key]; c = r["base"]["cudnn"]["fwd_tflops"]
    f = [r.get(v, {}).get("flashattn", {}).get("fwd_tflops", float("nan")) for v in vs]
    print(f"| {key[0]} | {int(key[1])} | {key[2]} | " + " | ".join(f"{x:.0f}" for x in f) + f" | {c:.0f} | " + " | ".join(f"{x/c:.2f}" for x in f) + " |")
PY
stamp end
