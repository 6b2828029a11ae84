"""Large-head benchmark: flashattn's forward and backward at head dims above 256 next to its own
d = 256, measured in one process, interleaved shape by shape.

Run where PyTorch and a CUDA GPU are present, from the repository root, after `make`:

    python3 bench/bench_large_heads.py [--quick] [--out bench/results]

Shapes: bf16, b·s = 16k tokens, hidden 2048 (h = 2048 / dv): d = 512 (4 heads) and d = 256
(8 heads) at s = 1k..16k, causal and not; the d = 512 / d = 256 ratio is the figure the
large-head target is stated in (forward ≥ 0.85, backward ≥ 0.75). Also MLA's absorbed 576 / 512
(4 heads). No other library on Hopper runs these head dims (FlashAttention-4 and cuDNN
stop at 256), so there is no anchor column. Second table: MLA's training shape 192 / 128 (16
heads) next to FlashAttention-4 (when `flash_attn.cute` is importable) and PyTorch SDPA's cuDNN
backend, the same inputs, interleaved shape by shape. FLOPs: forward 2·b·h·s²·(d + dv) (the papers'
4·b·h·s²·d when dv = d), halved when causal; backward 2.5× forward. Timing: the same
triton.testing.do_bench median as bench_gpu.py; the backward is torch.autograd.grad of the
forward output.

Writes bench/results/large-heads.md and .json and prints the table last.
"""
import argparse
import datetime
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from report import bench_ms, gpu_line  # noqa: E402


def forward_fn(impl, q, k, v, causal):
    """The forward closure of one implementation; q, k, v [b, s, h, d] (SDPA gets views)."""
    if impl == "flashattn":
        import flashattn
        return lambda: flashattn.flash_attn_func(q, k, v, causal=causal)
    if impl == "fa4":
        from flash_attn.cute import flash_attn_func as fa4_func

        def f4():
            r = fa4_func(q, k, v, causal=causal)
            return r[0] if isinstance(r, tuple) else r
        return f4
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return sdpa


def measure(b, s, h, d, dv, causal, modes, impl="flashattn"):
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    flops = 2 * b * h * s * s * (d + dv) / (2 if causal else 1)
    cell = {}
    try:
        f = forward_fn(impl, q, k, v, causal)
        if "fwd" in modes:
            with torch.no_grad():
                f()
                cell["fwd_tflops"] = round(flops / bench_ms(f) / 1e9, 1)
        if "bwd" in modes:
            o = f()
            do = torch.randn_like(o)
            g = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
            g()
            cell["bwd_tflops"] = round(2.5 * flops / bench_ms(g) / 1e9, 1)
    except Exception as e:  # a refusal is a result too
        cell["error"] = str(e).splitlines()[0][:160]
    del q, k, v
    torch.cuda.empty_cache()
    return cell


def markdown(res):
    env = res["env"]
    lines = [f"# Large-head benchmark {env['date']}", "",
             gpu_line(env) + "bf16; b·s = 16k tokens, hidden 2048 (h = 2048 / dv). TFLOP/s (fwd 2·b·h·s²·(d + dv), "
             "halved causal; bwd 2.5× fwd), median of triton.testing.do_bench, every column interleaved shape by "
             "shape in one process. No other Hopper library runs d > 256. Written by bench/bench_large_heads.py.", "",
             "| causal | seqlen | d512 fwd | d256 fwd | fwd ratio | d512 bwd | d256 bwd | bwd ratio | 576/512 fwd / bwd |",
             "|---|---|---|---|---|---|---|---|---|"]

    def val(cell, key):
        return cell.get(key, cell.get("error", "—"))

    def ratio(a, b, key):
        x, y = a.get(key), b.get(key)
        return f"{x / y:.2f}" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else "—"

    for r in res["rows"]:
        d512, d256, mla = r["d512"], r["d256"], r["mla"]
        lines.append(f"| {int(r['causal'])} | {r['s']} | {val(d512, 'fwd_tflops')} | {val(d256, 'fwd_tflops')} | "
                     f"{ratio(d512, d256, 'fwd_tflops')} | {val(d512, 'bwd_tflops')} | {val(d256, 'bwd_tflops')} | "
                     f"{ratio(d512, d256, 'bwd_tflops')} | {val(mla, 'fwd_tflops')} / {val(mla, 'bwd_tflops')} |")
    impls = res["mla_impls"]
    lines += ["", "MLA's training shape, d / dv = 192 / 128, 16 heads, b·s = 16k: TFLOP/s fwd / bwd, and ours over "
              "FlashAttention-4 (\"—\" where an implementation is not installed or refuses the shape).", "",
              "| causal | seqlen | " + " | ".join(impls) + " | ours / fa4 fwd | ours / fa4 bwd |",
              "|---|---|" + "---|" * (len(impls) + 2)]
    for r in res["mla_rows"]:
        cells = [f"{val(r[i], 'fwd_tflops')} / {val(r[i], 'bwd_tflops')}" for i in impls]
        fa4 = r.get("fa4", {})
        lines.append(f"| {int(r['causal'])} | {r['s']} | " + " | ".join(cells) +
                     f" | {ratio(r['flashattn'], fa4, 'fwd_tflops')} | {ratio(r['flashattn'], fa4, 'bwd_tflops')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="s = 2k and 8k only")
    ap.add_argument("--mla-only", action="store_true", help="the 192 / 128 table only")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    seqlens = [2048, 8192] if a.quick else [1024, 2048, 4096, 8192, 16384]
    date = datetime.date.today().isoformat()
    res = {"env": {"date": date, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cudnn": torch.backends.cudnn.version()}, "rows": [], "mla_rows": []}
    impls = ["flashattn", "cudnn"]
    try:
        import importlib.metadata as md
        import flash_attn.cute  # noqa: F401
        impls.insert(1, "fa4")
        res["env"]["fa4"] = md.version("flash-attn-4")
    except Exception:  # FlashAttention-4 not installed: no column for it
        pass
    res["mla_impls"] = impls
    for causal in (False, True):
        for s in seqlens:
            row = {"causal": causal, "s": s}
            for impl in impls:
                row[impl] = measure(16384 // s, s, 16, 192, 128, causal, ("fwd", "bwd"), impl)
            res["mla_rows"].append(row)
            print(json.dumps(row), flush=True)
    for causal in (False, True) if not a.mla_only else ():
        for s in seqlens:
            b = 16384 // s
            row = {"causal": causal, "s": s,
                   "d512": measure(b, s, 4, 512, 512, causal, ("fwd", "bwd")),
                   "d256": measure(b, s, 8, 256, 256, causal, ("fwd", "bwd")),
                   "mla": measure(b, s, 4, 576, 512, causal, ("fwd", "bwd"))}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(a.out, exist_ok=True)
    md = markdown(res)
    with open(os.path.join(a.out, "large-heads.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(a.out, "large-heads.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(md)


if __name__ == "__main__":
    main()
