"""bench_v2.py: backward speed of two builds of libflashattn.so (v1 = default kernel, v2 = lab
kernel, -DFA_BWD_V2), loaded side by side in one process, against PyTorch SDPA's FLASH_ATTENTION
(FA2) on the same tensors: bf16, b·s = 16k tokens, hidden 2048, d = 64/128/256, causal 0/1,
s = 1k/4k/16k (the standard shapes of lab/cuda_bwd/bench_bwd.py, fewer lengths).

FLOPs (FlashAttention convention): bwd = 2.5 · 4·b·h·s²·d, halved when causal. Timing:
triton.testing.do_bench median (CUDA events if triton is missing), short rep. Ours reads FA2's O
and LSE and includes its pre-pass, memset and dq conversion (workspace passed in); FA2 runs
torch.autograd.grad on its own forward. Also: which main kernel each library launched (torch
profiler), and at s = 1k the max relative difference of dq, dk, dv to FA2's.

Usage: python3 lab/cuda_bwd/v2/bench_v2.py build-v1/libflashattn.so build-v2/libflashattn.so
       [--rep MS] [--shapes d:s:causal,...] [--dry]   (--dry: argument parsing only, no GPU)
"""
import argparse
import ctypes as C
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # lab/cuda_bwd: fa_bwd_ctypes

OUT = os.environ.get("OUT", "/tmp")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib_v1")
    ap.add_argument("lib_v2")
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep in ms (default 60)")
    ap.add_argument("--shapes", default="", help="only these d:s:causal items, comma separated")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--dry", action="store_true", help="parse arguments and print the plan only")
    a = ap.parse_args(argv)
    a.seq_list = [int(x) for x in a.seqs.split(",") if x]
    a.only = {tuple(int(y) for y in x.split(":")) for x in a.shapes.split(",") if x} or None
    return a


def shape_list(a):
    return [(d, causal, s) for d in (64, 128, 256) for causal in (0, 1) for s in a.seq_list
            if a.only is None or (d, s, causal) in a.only]


def load_libs(p1, p2):
    """Both libraries with one FaParams class (ctypes checks argtypes by class identity)."""
    import fa_bwd_ctypes as fc
    lib1 = fc.Lib(p1)
    cls = fc.FaParams
    lib2 = fc.Lib(p2)
    fc.FaParams = cls
    for lib in (lib1, lib2):
        for fn in ("fa_backward", "fa_forward"):
            getattr(lib.lib, fn).argtypes = [C.POINTER(cls)]
        lib.lib.fa_check_backward.argtypes = [C.POINTER(cls), C.POINTER(C.c_size_t)]
    return fc, lib1, lib2


def make_bench(rep):
    import torch
    try:
        import triton

        def bench(fn):
            return triton.testing.do_bench(fn, warmup=15, rep=rep, return_mode="median")
    except ImportError:  # CUDA events, 256 MB memset between calls (as do_bench does)
        def bench(fn):
            flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            for _ in range(3):
                fn()
            times = []
            for _ in range(max(5, rep // 5)):
                flush.zero_()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1))
            times.sort()
            return times[len(times) // 2]
    return bench


def ours_setup(fc, lib, q, k, v, do, out, lse, causal, deterministic=False):
    """Our backward on FA2's O/LSE; returns (call, dq, dk, dv), views [b, s, h, d]."""
    import torch
    t = lambda x: x.detach().transpose(1, 2)  # noqa: E731  [b,h,s,d] storage -> [b,s,h,d] view
    dq, dk, dv = (torch.empty_like(x).transpose(1, 2) for x in (q, k, v))
    p = fc.make_params(t(q), t(k), t(v), t(out), lse, t(do), dq, dk, dv, causal=bool(causal),
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


def launched_kernels(fn):
    """Names of the CUDA kernels fn() launches (torch profiler / CUPTI), or None if unavailable."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sorted({e.key for e in prof.key_averages()})
    except Exception as e:  # report, keep going
        print(f"profiler unavailable: {str(e).splitlines()[0][:100]}", flush=True)
        return None


def main(argv):
    a = parse_args(argv)
    shapes = shape_list(a)
    if a.dry:
        print(f"dry run: v1={a.lib_v1} v2={a.lib_v2} rep={a.rep} shapes={shapes}")
        return 0
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fc, lib1, lib2 = load_libs(a.lib_v1, a.lib_v2)
    bench = make_bench(a.rep)
    rows = []
    kernels_checked = False
    for d, causal, s in shapes:
        torch.manual_seed(0)
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)
        fl = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
        row = {"d": d, "causal": causal, "s": s}
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, bool(causal))[:2]
        grads = {}
        for name, lib in (("v1", lib1), ("v2", lib2)):
            try:
                call, dq, dk, dv = ours_setup(fc, lib, q, k, v, do, out, lse, causal)
                call()
                torch.cuda.synchronize()
                if not kernels_checked:
                    names = launched_kernels(call)
                    if names is not None:
                        main_k = [n for n in names if "fa_bwd" in n and "main" in n]
                        row_note = f"{name} main kernel: {main_k}"
                        print(row_note, flush=True)
                        want = "fa_bwd2_main_kernel" if name == "v2" else "fa_bwd_main_kernel"
                        if not any(want in n for n in main_k):
                            print(f"WARNING: {name} library did not launch {want}", flush=True)
                row[name] = fl / bench(call) / 1e9
                grads[name] = (dq, dk, dv)
                del call
            except Exception as e:  # report, keep going
                row[name] = float("nan")
                row[name + "_error"] = str(e).splitlines()[0][:120]
        kernels_checked = True
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            g_fa2 = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            row["fa2"] = fl / bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)) / 1e9
            if s == 1024:
                for name, gr in grads.items():
                    row[f"diff_{name}_vs_fa2"] = max(
                        ((x.transpose(1, 2).float() - g.float()).abs().max() / g.float().abs().max()).item()
                        for x, g in zip(gr, g_fa2))
            del o, g_fa2
        except Exception as e:  # report, keep going
            row["fa2"] = float("nan")
            row["fa2_error"] = str(e).splitlines()[0][:120]
        if d == 128 and s == 4096:
            for name, lib in (("v1", lib1), ("v2", lib2)):
                try:
                    call_det, *_ = ours_setup(fc, lib, q, k, v, do, out, lse, causal, deterministic=True)
                    call_det()
                    row[name + "_det"] = fl / bench(call_det) / 1e9
                    del call_det
                except Exception as e:  # report, keep going
                    row[name + "_det_error"] = str(e).splitlines()[0][:120]
        rows.append(row)
        print(json.dumps({x: (round(y, 4) if isinstance(y, float) else y) for x, y in row.items()}), flush=True)
        del q, k, v, do, out, lse, grads
        torch.cuda.empty_cache()

    json.dump(rows, open(os.path.join(OUT, "bench_v2.json"), "w"), indent=1)
    print("\nbackward TFLOP/s, bf16, b*s = 16k tokens, hidden 2048, H200 (same process, same tensors)")
    print(f"{'d':>4} {'causal':>6} {'s':>6} {'v1':>7} {'v2':>7} {'fa2':>7} {'v2/v1':>6} {'v2/fa2':>6}")
    wins = 0
    logs = []
    for r in rows:
        v1, v2, f2 = r.get("v1", math.nan), r.get("v2", math.nan), r.get("fa2", math.nan)
        wins += v2 >= f2
        if v2 > 0 and f2 > 0:
            logs.append(math.log(v2 / f2))
        extra = ""
        if "v2_det" in r:
            extra += f"  det v1 {r.get('v1_det', math.nan):.1f} v2 {r['v2_det']:.1f}"
        if "diff_v2_vs_fa2" in r:
            extra += f"  rel.diff vs fa2: v1 {r.get('diff_v1_vs_fa2', math.nan):.1e} v2 {r['diff_v2_vs_fa2']:.1e}"
        print(f"{r['d']:>4} {r['causal']:>6} {r['s']:>6} {v1:7.1f} {v2:7.1f} {f2:7.1f} {v2 / v1:6.2f} {v2 / f2:6.2f}"
              + extra)
    if logs:
        print(f"v2 >= FA2 on {wins}/{len(rows)} shapes; geometric mean v2/FA2 = {math.exp(sum(logs) / len(logs)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
