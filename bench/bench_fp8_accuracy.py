"""Accuracy of fp8 e4m3 inputs, measured as FlashAttention-3 reports it (paper section 4.3): the
RMSE of the attention output against float64 attention of the unquantised inputs, with entries
of Q, K, V drawn from N(0, 1), and again with outlier features (N(0, 1) + N(0, 100)·Bernoulli(0.001):
0.1 % of the entries get an extra term of standard deviation 10). Rows: flashattn in bfloat16
and with e4m3 q, k, v under three scalings: one descale factor per tensor, one per (batch, kv
head) (FlashAttention-3's q_descale / k_descale / v_descale), and per (batch, kv head) after a
random orthogonal rotation of the head dimension applied to q and k (FlashAttention-3's
"incoherent processing" idea: q·k is unchanged, the outliers are spread over all columns).
Each descale is amax / 448. CPU, fp32 compute: the error is the inputs' quantisation (the GPU
kernels will add P's rounding for the P·V product).

    PYTHONPATH=python FLASHATTN_LIB=build/libflashattn.so python3 bench/bench_fp8_accuracy.py
"""
import argparse
import datetime
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import flashattn  # noqa: E402
from report import machine_and_compiler, write_result  # noqa: E402


def draw(shape, outliers, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if outliers:
        spikes = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.001
        x = x + spikes * 10.0 * torch.randn(shape, generator=gen, dtype=torch.float64)
    return x


def reference(q, k, v, causal):
    """float64 attention, (b, s, h, d) layout, heads_q == heads_kv."""
    qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    s = qh @ kh.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ vh).permute(0, 2, 1, 3)


def quantise(x, per_head):
    """(e4m3 tensor, descale) with descale = amax / 448 per tensor (broadcast to (batch, heads)) or
    per (batch, head)."""
    b, _, h, _ = x.shape
    amax = x.abs().amax(dim=(1, 3)) if per_head else x.abs().amax().expand(b, h)
    descale = (amax / 448.0).clamp_min(1e-12)
    x8 = (x / descale[:, None, :, None]).float().to(torch.float8_e4m3fn)
    return x8, descale.float().contiguous()


def rmse(out, ref):
    return ((out.double() - ref) ** 2).mean().sqrt().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    if a.threads:
        flashattn.set_num_threads(a.threads)
    b, h, s, d = a.batch, a.heads, a.seqlen, a.head_dim
    gen = torch.Generator().manual_seed(20261202)
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    rows = []
    for outliers in (False, True):
        q, k, v = (draw((b, s, h, d), outliers, gen) for _ in range(3))
        for causal in (False, True):
            ref = reference(q, k, v, causal)
            cells = [rmse(flashattn.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal), ref)]
            for per_head, rotate in ((False, False), (True, False), (True, True)):
                qr, kr = (q @ rotation, k @ rotation) if rotate else (q, k)
                (q8, qd), (k8, kd), (v8, vd) = (quantise(t, per_head) for t in (qr, kr, v))
                out = flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                                v_descale=vd)
                cells.append(rmse(out, ref))
            rows.append((outliers, causal, cells))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# fp8 e4m3 inputs: attention output RMSE against float64 (b {b}, h {h}, s {s}, d {d})", "",
             machine_and_compiler() + f"torch {torch.__version__}. Date: {date}. Written by bench/bench_fp8_accuracy.py.",
             "", "RMSE of o against float64 attention of the unquantised inputs; descale = amax / 448. "
             "Outliers: N(0, 1) + N(0, 100)·Bernoulli(0.001) entries (FlashAttention-3's test).", "",
             "| inputs | causal | bf16 | fp8, per tensor | fp8, per batch × kv head | fp8, per batch × kv head, q and k rotated |",
             "|---|---|---|---|---|---|"]
    for outliers, causal, cells in rows:
        lines.append(f"| {'with outliers' if outliers else 'N(0, 1)'} | {int(causal)} | "
                     + " | ".join(f"{c:.2e}" for c in cells) + " |")
    write_result(a.out, "fp8-accuracy.md", lines)


if __name__ == "__main__":
    main()
