"""Energy and clock under sustained load: flashattn against FlashAttention-4 (when
`flash_attn.cute` is importable) and PyTorch SDPA's CUDNN_ATTENTION backend, in one process.

Run where PyTorch and a CUDA GPU are present, from the repository root, after `make`:

    python3 bench/bench_energy.py [--seconds 2] [--rounds 2] [--out bench/results]

A Hopper card under attention's load runs at its power cap, so a kernel's speed is its work per
clock times the clock the cap leaves it, and the clock depends on the energy the kernel spends per
clock. This benchmark separates the two: each implementation is called back to back for
--seconds per shape (after a warm-up), NVML's energy counter is read around that window and the
SM clock sampled every 20 ms during it. Reported per implementation and shape: TFLOP/s (FLOPs as
bench_gpu.py: forward 4·b·h·s²·d, halved when causal, backward 2.5× forward), average power (W),
TFLOP per joule, the median SM clock (MHz) and GFLOP per clock cycle of the whole GPU (TFLOP/s /
clock). Shapes: b1, 16k tokens, hidden 2048 (h = 2048 / d), bf16. Implementations alternate
within each round; the round with the highest TFLOP/s is reported.

Writes bench/results/energy.md and .json and prints the table last. NVML is loaded from
libnvidia-ml.so.1 through ctypes (no Python package needed).
"""
import argparse
import ctypes
import datetime
import json
import os
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from bench_gpu import make_fns  # noqa: E402
from report import drop_fa4_if_missing, gpu_line  # noqa: E402

NVML_CLOCK_SM = 1


class Nvml:
    """The two NVML readings this benchmark needs, for device 0 (CUDA_VISIBLE_DEVICES applies)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(0) failed")

    def energy_mj(self):
        e = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(e)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed (not supported here?)")
        return e.value

    def sm_mhz(self):
        c = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.dev, NVML_CLOCK_SM, ctypes.byref(c))
        return c.value


def sustained(nvml, fn, seconds):
    """(s per call, W, J per call, median SM MHz) of fn called back to back for ~seconds."""
    fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < 0.5:  # warm-up, and the call's length
        fn()
        n += 1
    torch.cuda.synchronize()
    reps = max(1, int(seconds / ((time.time() - t0) / n)))
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(nvml.sm_mhz())
            time.sleep(0.02)

    th = threading.Thread(target=sample)
    th.start()
    e0, t0 = nvml.energy_mj(), time.time()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    t, joules = time.time() - t0, (nvml.energy_mj() - e0) / 1000.0
    stop.set()
    th.join()
    clocks.sort()
    return t / reps, joules / t, joules / reps, clocks[len(clocks) // 2] if clocks else 0


def callable_for(name, q, k, v, do, causal, mode):
    f = make_fns(name, q, k, v, causal)
    if mode == "fwd":
        return f
    o = f()
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128:0:fwd,64:0:fwd,128:1:fwd,256:0:fwd,128:0:bwd,128:1:bwd",
                    help="d:causal:mode items, comma-separated")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--impls", default="flashattn,fa4,cudnn")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    impls = a.impls.split(",")
    drop_fa4_if_missing(impls)
    nvml = Nvml()
    env = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "impls": impls}
    if "fa4" in impls:
        import importlib.metadata as md
        try:
            env["fa4"] = md.version("flash-attn-4")
        except Exception:
            env["fa4"] = "unknown version"
    print(env, flush=True)
    rows = []
    s = a.seqlen
    for item in a.shapes.split(","):
        d, causal, mode = item.split(":")
        d, causal = int(d), causal == "1"
        h = 2048 // d
        q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)
        flop = 4 * h * s * s * d / (2 if causal else 1) * (2.5 if mode == "bwd" else 1)
        best = {}
        for _ in range(a.rounds):
            for name in impls:
                try:
                    with torch.set_grad_enabled(mode == "bwd"):
                        sec, watts, joules, mhz = sustained(nvml, callable_for(name, q, k, v, do, causal, mode),
                                                            a.seconds)
                except Exception as e:  # an unsupported shape for one implementation is a result too
                    best[name] = {"error": str(e).splitlines()[0][:160]}
                    continue
                tflops = flop / sec / 1e12
                if tflops > best.get(name, {}).get("tflops", 0):
                    best[name] = {"tflops": round(tflops, 1), "watts": round(watts),
                                  "tflop_per_j": round(flop / joules / 1e12, 3), "sm_mhz": mhz,
                                  "gflop_per_cycle": round(tflops / mhz * 1000, 1) if mhz else 0}
        row = {"d": d, "causal": causal, "mode": mode, "s": s, "h": h, **best}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    lines = [f"# Energy and clock under sustained load {env['date']}", "",
             gpu_line(env) + f"bf16; b1, {s} tokens, hidden 2048 (heads = 2048 / d). Each implementation "
             f"called back to back for {a.seconds:g} s per shape, best of {a.rounds} alternating rounds; "
             "NVML energy counter and SM clock. Written by bench/bench_energy.py.", "",
             "| d | causal | mode | impl | TFLOP/s | W | TFLOP/J | SM MHz | GFLOP/cycle |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name in impls:
            c = r.get(name, {})
            if "tflops" in c:
                lines.append(f"| {r['d']} | {int(r['causal'])} | {r['mode']} | {name} | {c['tflops']} | "
                             f"{c['watts']} | {c['tflop_per_j']} | {c['sm_mhz']} | {c['gflop_per_cycle']} |")
            else:
                lines.append(f"| {r['d']} | {int(r['causal'])} | {r['mode']} | {name} | "
                             f"{c.get('error', 'no result')} | | | | |")
    md_text = "\n".join(lines) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "energy.md"), "w") as fh:
        fh.write(md_text)
    with open(os.path.join(a.out, "energy.json"), "w") as fh:
        json.dump({"env": env, "rows": rows}, fh, indent=1)
    print(md_text)


if __name__ == "__main__":
    main()
