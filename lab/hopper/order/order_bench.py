"""Tile order of the Hopper forward under causal masks (lab/hopper/order): the library's order
(longest first over all (batch, head) units, persistent snake) against head-grouped orders (the
units in groups of G, longest first within a group, so the CTAs running together share K/V in L2)
with the persistent grid or one CTA per tile. Every variant in one process (the knobs are
environment variables the lab library reads per call), interleaved with cuDNN, each timed under
sustained load with the GPU's energy counter read around the window. Outputs must be bitwise
equal to the library order's (the order changes which CTA computes a tile, not how).

    FLASHATTN_LIB=<lab build>/libflashattn.so PYTHONPATH=python python3 lab/hopper/order/order_bench.py
"""
import os
import statistics
import sys
import threading
import time

import pynvml
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

VARIANTS = {  # name: (FA_LAB_HEAD_GROUP, FA_LAB_PERSIST, FA_LAB_SNAKE)
    "lib": (None, None, None),
    "np": (None, "0", None),
    "g8 p": ("8", "1", "1"),
    "g8 np": ("8", "0", None),
    "g16 np": ("16", "0", None),
    "g4 np": ("4", "0", None),
}


def set_variant(v):
    for key, val in zip(("FA_LAB_HEAD_GROUP", "FA_LAB_PERSIST", "FA_LAB_SNAKE"), VARIANTS[v]):
        if val is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = val


def window(fn, seconds, handle):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(3, int(seconds / max(time.perf_counter() - t0, 1e-5)))
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
            time.sleep(0.02)

    th = threading.Thread(target=sample)
    th.start()
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    stop.set()
    th.join()
    sec = start.elapsed_time(end) / 1e3 / n
    return sec, (e1 - e0) / 1e3 / n, statistics.median(clocks) if clocks else float("nan")


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    shapes = [(128, 2048), (128, 4096), (128, 8192), (64, 2048), (64, 4096), (256, 2048), (256, 4096)]
    rows, mismatches = [], 0
    for d, s in shapes:
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) + 0.1 for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flop = 4 * b * h * s * s * d / 2
        set_variant("lib")
        ref = flashattn.flash_attn_func(q, k, v, causal=True)
        for name in VARIANTS:
            set_variant(name)
            out = flashattn.flash_attn_func(q, k, v, causal=True)
            if not torch.equal(out, ref):
                mismatches += 1
                print("MISMATCH", d, s, name, float((out.float() - ref.float()).abs().max()))
            sec, joules, mhz = window(lambda: flashattn.flash_attn_func(q, k, v, causal=True), seconds, handle)
            rows.append((f"d{d} s{s} c", name, flop / sec / 1e12, flop / joules / 1e12, mhz))
        set_variant("lib")

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        sec, joules, mhz = window(cudnn, seconds, handle)
        rows.append((f"d{d} s{s} c", "cuDNN", flop / sec / 1e12, flop / joules / 1e12, mhz))
        del q, k, v, qt, kt, vt, ref, out
        torch.cuda.empty_cache()
    print("\n| shape | variant | TFLOP/s | TFLOP/J | SM MHz |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %.0f | %.3f | %.0f |" % r)
    print("bitwise mismatches against the library order:", mismatches)


if __name__ == "__main__":
    main()
