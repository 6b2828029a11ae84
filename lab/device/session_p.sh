#!/bin/bash
# Session 3: why does the Hopper forward lose ~10 % from 4k to 8k/16k at d = 128/256 non-causal
# while cuDNN does not? Hypothesis: clocks (power/thermal) under the CLI's back-to-back sweep, not
# the kernel. SM clock, power and temperature sampled every 50 ms during: the CLI on one length at
# a time (cold, 8k first), the CLI sweep 2k..16k, then ours through torch (flash_attn_func) and
# cuDNN interleaved per shape in one process (bench_gpu.py --ours python).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASHATTN_LIB=$PWD/build-dev/libflashattn.so PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 50 > "$OUT/clocks.csv" &
SAMPLER=$!
mark() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $*" >> "$OUT/marks.txt"; echo "$*"; }
B="build-dev/flashattn bench --device cuda --dtype bf16 --tokens 16384 --mode fwd --impl flash --causal 0"
for s in 8192 4096 8192 16384; do
    mark "cli d128 s$s start"; $B --hq 16 -d 128 --sq $s --json | grep -o '"tflops": *[0-9.]*' | sed "s/^/  d128 s$s /"
    mark "cli d128 s$s end"; sleep 2
done
mark "cli sweep d128 start"; $B --hq 16 -d 128 --sq 2048,4096,8192,16384 --json | grep -o '"sq": *[0-9]*\|"tflops": *[0-9.]*' | paste - - | sed 's/^/  sweep d128 /'
mark "cli sweep d128 end"; sleep 2
mark "cli sweep d256 start"; $B --hq 8 -d 256 --sq 2048,4096,8192,16384 --json | grep -o '"sq": *[0-9]*\|"tflops": *[0-9.]*' | paste - - | sed 's/^/  sweep d256 /'
mark "cli sweep d256 end"; sleep 2
mark "python interleaved start"
timeout 200 python3 bench/bench_gpu.py --ours python --modes fwd --d 128,256 --seqlens 2048,4096,8192,16384 \
    --impls flashattn,cudnn --mem-seqlens 4096 --tag fwd-interleaved --out "$OUT" > "$OUT/interleaved.log" 2>&1
mark "python interleaved end"
kill $SAMPLER
grep "^|" "$OUT/interleaved.log" | head -20
python3 - "$OUT" <<'PY'
import sys, datetime
out = sys.argv[1]
rows = []
for line in open(out + "/clocks.csv"):
    p = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(p[0].split(" ")[1][:12], "%H:%M:%S.%f")
        rows.append((t, float(p[1]), float(p[2]), float(p[3]), p[4]))
    except Exception:
        pass
marks = []
for line in open(out + "/marks.txt"):
    t, what = line.split(" ", 1)
    marks.append((datetime.datetime.strptime(t, "%H:%M:%S.%f"), what.strip()))
for (t0, a), (t1, b) in zip(marks, marks[1:]):
    if not a.endswith("start"): continue
    sel = [r for r in rows if t0 <= r[0] <= t1 and r[2] > 200]
    if not sel: print(a, "no busy samples"); continue
    clk = sorted(r[1] for r in sel); pw = sorted(r[2] for r in sel)
    reasons = sorted(set(r[4] for r in sel))
    print(f"{a[:-6]:28s} busy samples {len(sel):4d}  SM MHz median {clk[len(clk)//2]:.0f} min {clk[0]:.0f}  "
          f"power median {pw[len(pw)//2]:.0f} W max {pw[-1]:.0f}  temp max {max(r[3] for r in sel):.0f}  throttle {reasons}")
PY
