"""bench3.py: backward speed of several builds of libflashattn.so, loaded side by side in one
process, against PyTorch SDPA's FLASH_ATTENTION (FA2) on the same tensors: bf16, b*s = 16k
tokens, hidden 2048, d = 64/128/256, causal 0/1, s = 1k/4k/16k (lab/cuda_bwd/bench_bwd.py shapes).
FLOPs = 2.5 * 4*b*h*s^2*d, halved when causal; ours includes pre-pass, memset, dq conversion.
--split: also the per-kernel time split of the first library (torch profiler) at d = 128,
s = 4k/16k, non-causal. Usage: python3 bench3.py NAME=LIB.so [NAME=LIB.so ...] [--rep MS]
[--shapes d:s:causal,...] [--split]"""
import argparse
import ctypes as C
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "v2"))
sys.path.insert(0, os.path.dirname(HERE))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from bench_v2 import make_bench, ours_setup  # noqa: E402


def load_libs(specs):
    import fa_bwd_ctypes as fc
    libs, cls = [], None
    for spec in specs:
        name, path = spec.split("=", 1)
        lib = fc.Lib(path)
        if cls is None:
            cls = fc.FaParams
        libs.append((name, lib))
    fc.FaParams = cls
    for _, lib in libs:
        for fn in ("fa_backward", "fa_forward"):
            getattr(lib.lib, fn).argtypes = [C.POINTER(cls)]
        lib.lib.fa_check_backward.argtypes = [C.POINTER(cls), C.POINTER(C.c_size_t)]
    return fc, libs


def tensors(d, s, causal):
    torch.manual_seed(0)
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, bool(causal))[:2]
    return q, k, v, do, out, lse, 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)


def split(fc, lib, bench):
    from torch.profiler import ProfilerActivity, profile
    for s in (4096, 16384):
        q, k, v, do, out, lse, fl = tensors(128, s, 0)
        call, *_ = ours_setup(fc, lib, q, k, v, do, out, lse, 0)
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        tot = 0.0
        parts = []
        for e in prof.key_averages():
            us = e.device_time_total / 5 if hasattr(e, "device_time_total") else e.cuda_time_total / 5
            if us > 0:
                parts.append((us, e.key[:70]))
                tot += us
        print(f"split d=128 s={s} nc: total {tot:.0f} us/call, {fl / tot / 1e6:.1f} TFLOP/s on kernel time")
        for us, key in sorted(parts, reverse=True):
            print(f"   {us:9.1f} us {100 * us / tot:5.1f} %  {key}")
        del call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("libs", nargs="+")
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--split", action="store_true")
    a = ap.parse_args()
    only = {tuple(int(y) for y in x.split(":")) for x in a.shapes.split(",") if x} or None
    fc, libs = load_libs(a.libs)
    bench = make_bench(a.rep)
    if a.split:
        split(fc, libs[0][1], bench)
    names = [n for n, _ in libs]
    rows = []
    for d in (64, 128, 256):
        for causal in (0, 1):
            for s in [int(x) for x in a.seqs.split(",")]:
                if only is not None and (d, s, causal) not in only:
                    continue
                q, k, v, do, out, lse, fl = tensors(d, s, causal)
                row = {"d": d, "causal": causal, "s": s}
                ref = None
                for name, lib in libs:
                    try:
                        call, dq, dk, dv = ours_setup(fc, lib, q, k, v, do, out, lse, causal)
                        call()
                        torch.cuda.synchronize()
                        row[name] = fl / bench(call) / 1e9
                        if ref is None:
                            ref = (dq.clone(), dk.clone(), dv.clone())
                        else:  # max rel. difference to the first library (same inputs)
                            row["diff_" + name] = max(((x.float() - r.float()).abs().max() / r.float().abs().max()).item()
                                                      for x, r in zip((dq, dk, dv), ref))
                        del call, dq, dk, dv
                    except Exception as e:  # report, keep going
                        row[name] = float("nan")
                        print(f"{name} d={d} s={s} c={causal}: {str(e).splitlines()[0][:120]}", flush=True)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                row["fa2"] = fl / bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)) / 1e9
                rows.append(row)
                print(json.dumps({x: (round(y, 5) if isinstance(y, float) else y) for x, y in row.items()}), flush=True)
                del q, k, v, do, out, lse, o, ref
                torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "bench3.json"), "w"), indent=1)
    print("\nbackward TFLOP/s, bf16, b*s=16k, hidden 2048 (same process); x = ours/fa2")
    print(f"{'d':>4} {'c':>2} {'s':>6} " + " ".join(f"{n:>9}" for n in names) + f" {'fa2':>7} "
          + " ".join(f"{'x' + n:>9}" for n in names))
    for r in rows:
        print(f"{r['d']:>4} {r['causal']:>2} {r['s']:>6} " + " ".join(f"{r[n]:9.1f}" for n in names)
              + f" {r['fa2']:7.1f} " + " ".join(f"{r[n] / r['fa2']:9.3f}" for n in names))
    for n in names:
        lg = [math.log(r[n] / r["fa2"]) for r in rows if r[n] > 0]
        print(f"{n}: >= FA2 on {sum(r[n] >= r['fa2'] for r in rows)}/{len(rows)}, geomean x "
              f"{math.exp(sum(lg) / max(len(lg), 1)):.3f}")


if __name__ == "__main__":
    main()
