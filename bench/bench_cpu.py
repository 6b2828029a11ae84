"""CPU side by side: flashattn against PyTorch's CPU SDPA (its flash-attention CPU kernel), in one
process on the same tensors, forward and backward, GFLOP/s with the FlashAttention convention
(forward 4·b·h·s²·d, halved when causal; backward 2.5× forward). The shapes are SHAPES below
(b, h, s, d, causal). Median of 5 timed calls after one warm-up.

    PYTHONPATH=python FLASHATTN_LIB=build/libflashattn.so python3 bench/bench_cpu.py [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashattn  # noqa: E402

SHAPES = [(1, 16, 2048, 64, False), (1, 16, 2048, 128, True), (4, 8, 1024, 128, False)]


def median_s(fn, n=5):
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    flashattn.set_num_threads(a.threads)
    print(f"threads {a.threads}; torch {torch.__version__}; flashattn CPU ISA {flashattn.cpu_isa() if hasattr(flashattn, 'cpu_isa') else '?'}")
    print("| dtype | b | h | s | d | causal | flashattn fwd | torch fwd | flashattn bwd | torch bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dt in a.dtypes.split(","):
        dtype = getattr(torch, dt)
        for b, h, s, d, causal in SHAPES:
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
            g = lambda t, m=1.0: f"{m * flops / t / 1e9:.0f}"
            print(f"| {dt} | {b} | {h} | {s} | {d} | {int(causal)} | {g(t_of)} | {g(t_tf)} | "
                  f"{g(t_ob, 2.5)} | {g(t_tb, 2.5)} |", flush=True)


if __name__ == "__main__":
    main()
