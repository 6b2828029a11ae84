"""bench_bwd.py: backward speed of the CUDA path against PyTorch SDPA's FLASH_ATTENTION (FA2) and
CUDNN_ATTENTION in the same run, on the standard shapes (bf16, b·s = 16k tokens, hidden 2048,
d = 64/128/256, s = 512..16k, causal and not), plus extra memory of causal fwd+bwd at 64k tokens.

FLOPs (FlashAttention convention): bwd = 2.5 · 4·b·h·s²·d, halved when causal. Timing:
triton.testing.do_bench median. All three backwards see the same q, k, v, dO (a [b, h, s, d]
storage, viewed as [b, s, h, d] for us); ours reads FA2's O and LSE
(aten._scaled_dot_product_flash_attention), FA2 and cuDNN run torch.autograd.grad on their own
forward. Ours includes its pre-pass, memset and dq conversion; the workspace is passed in.

Usage: python3 lab/cuda_bwd/bench_bwd.py build-gpubwd/libflashattn.so [--quick]
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa_bwd_ctypes as fc  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def ours_setup(lib, q, k, v, do, causal, deterministic=False):
    """Our backward on FA2's O/LSE; returns (call, dq, dk, dv) with every view as [b, s, h, d]."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731  [b,h,s,d] storage -> [b,s,h,d] view
    dq, dk, dv = (torch.empty_like(x).transpose(1, 2) for x in (q, k, v))
    p = fc.make_params(t(q), t(k), t(v), t(out), lse, t(do), dq, dk, dv, causal=causal,
                       deterministic=deterministic, stream=torch.cuda.current_stream().cuda_stream)
    st, nbytes = lib.check_backward(p)
    if st != 0:
        raise RuntimeError(lib.last_error())
    ws = torch.empty(max(nbytes, 1), device="cuda", dtype=torch.uint8)
    p.workspace, p.workspace_bytes = ws.data_ptr(), nbytes

    def call():
        if lib.backward(p) != 0:
            raise RuntimeError(lib.last_error())

    call._keep = (out, lse, ws, p)
    return call, dq, dk, dv


def main():
    lib = fc.Lib(sys.argv[1] if len(sys.argv) > 1 else "build-gpubwd/libflashattn.so")
    quick = "--quick" in sys.argv
    rows = []
    seqs = (1024, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    only = os.environ.get("FA_BENCH_SHAPES")  # e.g. "64:4096:0,128:4096:1" (d:s:causal)
    only = {tuple(int(x) for x in item.split(":")) for item in only.split(",")} if only else None
    for d in (64, 128, 256):
        for causal in (False, True):
            for s in seqs:
                if only is not None and (d, s, int(causal)) not in only:
                    continue
                torch.manual_seed(0)
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                do = torch.randn_like(q)
                fl = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                row = {"d": d, "causal": int(causal), "s": s}
                call, dq, dk, dv = ours_setup(lib, q, k, v, do, causal)
                call()
                torch.cuda.synchronize()
                row["ours"] = fl / bench(call) / 1e9
                for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(be):
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        grads = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                        row[name] = fl / bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)) / 1e9
                        if name == "fa2" and s == 1024:
                            # same inputs and O/LSE: our gradients must agree with FA2's
                            row["diff_vs_fa2"] = max(
                                ((x.transpose(1, 2).float() - g.float()).abs().max() / g.float().abs().max()).item()
                                for x, g in zip((dq, dk, dv), grads))
                        del o, grads
                    except Exception as e:  # report, keep going
                        row[name] = float("nan")
                        row[name + "_error"] = str(e).splitlines()[0][:100]
                if d == 128 and s == 4096:
                    call_det, *_ = ours_setup(lib, q, k, v, do, causal, deterministic=True)
                    call_det()
                    row["ours_det"] = fl / bench(call_det) / 1e9
                    del call_det
                rows.append(row)
                print(json.dumps({x: (round(y, 4) if isinstance(y, float) else y) for x, y in row.items()}), flush=True)
                del q, k, v, do, call, dq, dk, dv
                torch.cuda.empty_cache()

    # extra memory of causal fwd+bwd at 64k tokens, b = 1, h = 16, d = 128 (MiB above q, k, v)
    mem = {}
    s = 65536
    for name in (("ours", "fa2") if only is None else ()):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        q, k, v = (torch.randn(1, 16, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=(name == "fa2"))
                   for _ in range(3))
        base = torch.cuda.max_memory_allocated()
        if name == "fa2":
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(torch.randn_like(o))
        else:
            do = torch.randn_like(q)
            call, dq, dk, dv = ours_setup(lib, q, k, v, do, True)
            call()
        torch.cuda.synchronize()
        mem[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"extra memory causal fwd+bwd s=64k d=128 h=16 {name}: {mem[name]:.0f} MiB", flush=True)
        q = k = v = o = do = call = dq = dk = dv = None

    json.dump({"rows": rows, "mem": mem}, open(os.path.join(OUT, "bench_bwd.json"), "w"), indent=1)
    print("\nbackward TFLOP/s, bf16, b*s=16k, hidden 2048 (same run)")
    print(f"{'d':>4} {'causal':>6} {'s':>6} {'ours':>7} {'fa2':>7} {'cudnn':>7} {'ours/fa2':>8}")
    for r in rows:
        print(f"{r['d']:>4} {r['causal']:>6} {r['s']:>6} {r['ours']:7.1f} {r['fa2']:7.1f} {r['cudnn']:7.1f} "
              f"{r['ours'] / r['fa2']:8.2f}" + (f"  det {r['ours_det']:.1f}" if "ours_det" in r else "")
              + (f"  rel.diff vs fa2 {r['diff_vs_fa2']:.1e}" if "diff_vs_fa2" in r else ""))


if __name__ == "__main__":
    main()
