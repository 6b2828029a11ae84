"""CPU benchmark: bench/results/cpu.md, two parts.

1. The flashattn tool (`--tool`, default build/flashattn): fp32, b = 1, 16 heads, 2048 tokens,
   d 64 / 128, causal and not, forward and backward, flash attention next to the materialised
   standard attention and an fp32 GEMM (n = 2048) through the installed BLAS in the same run;
   the tool's table as it prints it.
2. Side by side with PyTorch's CPU SDPA (its flash-attention CPU kernel), in one process on the
   same tensors, forward and backward, fp32 and bf16, GFLOP/s with the FlashAttention convention
   (forward 4·b·h·s²·d, halved when causal; backward 2.5× forward) for the shapes in SHAPES
   (b, h, s, d, causal); each cell the median over `--rounds` rounds (ours and torch's calls
   alternate per shape and round) of the median of 5 timed calls after one warm-up.

    PYTHONPATH=python FLASHATTN_LIB=build/libflashattn.so python3 bench/bench_cpu.py \
        [--tool build/flashattn] [--threads 2] [--rounds 3]
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashattn  # noqa: E402
from report import machine_and_compiler, write_result  # noqa: E402

SHAPES = [(1, 16, 2048, 64, False), (1, 16, 2048, 128, True), (4, 8, 1024, 128, False)]


def median_s(fn, n=5):
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def tool_table(tool, threads):
    """The flashattn tool's fp32 sweep with its sgemm reference, as printed (stderr dropped)."""
    cmd = [tool, "bench", "--device", "cpu", "--dtype", "f32", "-b", "1", "--hq", "16", "--sq", "2048",
           "-d", "64,128", "--causal", "both", "--mode", "fwd,bwd", "--threads", str(threads), "--gemm"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return " ".join(cmd[1:]), out.rstrip("\n").splitlines()


def sdpa_rows(dtypes, rounds):
    """{(dtype, shape): [fwd ours, fwd torch, bwd ours, bwd torch] GFLOP/s}, medians over rounds."""
    samples = {}
    for _ in range(rounds):
        for dt in dtypes:
            dtype = getattr(torch, dt)
            for shape in SHAPES:
                b, h, s, d, causal = shape
                q, k, v = (torch.randn(b, s, h, d, dtype=dtype, requires_grad=True) for _ in range(3))
                do = torch.randn(b, s, h, d, dtype=dtype)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

                def ours():
                    return flashattn.flash_attn_func(q, k, v, causal=causal)

                def theirs():
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                with torch.no_grad():
                    t_of = median_s(ours)
                    t_tf = median_s(theirs)
                o1 = ours()
                t_ob = median_s(lambda: torch.autograd.grad(o1, (q, k, v), do, retain_graph=True))
                o2 = theirs()
                dot = do.transpose(1, 2)
                t_tb = median_s(lambda: torch.autograd.grad(o2, (qt, kt, vt), dot, retain_graph=True))
                cells = [flops / t_of, flops / t_tf, 2.5 * flops / t_ob, 2.5 * flops / t_tb]
                samples.setdefault((dt, shape), []).append([c / 1e9 for c in cells])
                print(dt, shape, " ".join(f"{c / 1e9:.0f}" for c in cells), flush=True)
    return {key: [statistics.median(r[i] for r in rs) for i in range(4)] for key, rs in samples.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default="build/flashattn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    flashattn.set_num_threads(a.threads)
    load_before = os.getloadavg()[0]
    tool_cmd, tool_out = tool_table(a.tool, a.threads)
    dtypes = a.dtypes.split(",")
    rows = sdpa_rows(dtypes, a.rounds)
    load_after = os.getloadavg()[0]
    isa = flashattn.cpu_isa() if hasattr(flashattn, "cpu_isa") else "?"
    lines = [
        f"# CPU attention ({a.threads} threads): flash against standard attention and an sgemm, and against PyTorch's CPU SDPA",
        "",
        f"{machine_and_compiler()}torch {torch.__version__}; flashattn CPU ISA {isa}. "
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
        f"Load average {load_before:.1f} before, {load_after:.1f} after.",
        "",
        f"## flashattn {tool_cmd}",
        "",
        "```",
        *tool_out,
        "```",
        "",
        "## Side by side with PyTorch's CPU SDPA (same process, same tensors; GFLOP/s, FlashAttention convention)",
        "",
        f"Medians over {a.rounds} rounds of the median of 5 timed calls.",
        "",
        "| dtype | b | h | s | d | causal | flashattn fwd | torch fwd | flashattn bwd | torch bwd |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dt in dtypes:
        for shape in SHAPES:
            b, h, s, d, causal = shape
            c = rows[(dt, shape)]
            lines.append(f"| {dt} | {b} | {h} | {s} | {d} | {int(causal)} | " + " | ".join(f"{x:.0f}" for x in c) + " |")
    write_result(a.out, "cpu.md", lines)


if __name__ == "__main__":
    main()
