"""bench/bench_cpu_decode.py: CPU decode attention (fa_kvcache_forward, one query token, 32 query /
8 kv heads, d = 128, f16 queries) at batch x context 1 x 16k and 8 x 4k, cache in f16 and in the
quantised formats (int8 per token and head, Q8_0, fp8 e4m3), next to the memcpy bandwidth of the
same run, and the previous CPU path (FA_CPU_DECODE=0) for reference.

Each configuration is one `flashattn bench --mode decode --device cpu --json` process, which
alternates a 512 MiB memcpy and a few decode calls and reports both medians; the configurations
are run in rounds, interleaved, and the table gives medians over the rounds (the machine may be
shared: compare the ratios, which are taken within one process). GB/s = K+V bytes read (scales
included) / time; copy GB/s = (read + written) / time. Writes <out>/cpu-decode.md.

  python3 bench/bench_cpu_decode.py --tool build/flashattn --threads 2 --rounds 5
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import machine_and_compiler, write_result  # noqa: E402

SHAPES = [(1, 16384), (8, 4096)]
VARIANTS = [  # (label, kv dtype, environment)
    ("previous path, f16", "same", {"FA_CPU_DECODE": "0"}),
    ("f16", "same", {}),
    ("int8", "int8", {}),
    ("q8_0", "q8_0", {}),
    ("fp8 e4m3", "fp8", {}),
]


def run(tool, threads, batch, ctx, kv, env, repeats):
    cmd = [tool, "bench", "--mode", "decode", "--device", "cpu", "--dtype", "f16", "--kv-dtype", kv,
           "-b", str(batch), "--cache-len", str(ctx), "--threads", str(threads), "--repeats", str(repeats), "--json"]
    out = subprocess.run(cmd, env={**os.environ, **env}, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default="build/flashattn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    samples = {}
    for _ in range(args.rounds):
        for batch, ctx in SHAPES:
            for label, kv, env in VARIANTS:
                r = run(args.tool, args.threads, batch, ctx, kv, env, args.repeats)
                samples.setdefault((batch, ctx, label), []).append(r)
    load_after = os.getloadavg()[0]
    lines = [
        f"# CPU decode attention ({args.threads} threads; f16 queries, 1 query token, hq 32, hkv 8, d 128)",
        "",
        f"{machine_and_compiler()}Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
        f"Load average {load_before:.1f} before, {load_after:.1f} after (the machine was shared).",
        "",
        "GB/s = K+V bytes read (scales included) / median call time; copy GB/s = (read + written) / time of "
        "a 512 MiB memcpy on the same threads, measured between the calls of the same process. Medians over "
        f"{args.rounds} interleaved rounds of {args.repeats} calls; \"of copy\" and \"tok/s vs f16\" are "
        "medians of the per-round ratios. Every cache here is larger than the L3.",
        "",
        "| batch x ctx | cache | ms | tok/s | KV bytes | GB/s | copy GB/s | of copy | tok/s vs f16 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch, ctx in SHAPES:
        f16 = samples[(batch, ctx, "f16")]
        for label, _, _ in VARIANTS:
            rs = samples[(batch, ctx, label)]
            ms = statistics.median(r["ms"] for r in rs)
            gbps = statistics.median(r["GBps"] for r in rs)
            copy = statistics.median(r["copy_GBps"] for r in rs)
            share = statistics.median(r["GBps"] / r["copy_GBps"] for r in rs)
            speed = statistics.median(r["tokens_per_s"] / f["tokens_per_s"] for r, f in zip(rs, f16))
            lines.append(f"| {batch} x {ctx} | {label} | {ms:.2f} | {batch * 1e3 / ms:.1f} | "
                         f"{rs[0]['kv_bytes'] / 2**20:.1f} MiB | {gbps:.2f} | {copy:.2f} | {100 * share:.0f}% | {speed:.2f}x |")
    write_result(args.out, "cpu-decode.md", lines)


if __name__ == "__main__":
    main()
