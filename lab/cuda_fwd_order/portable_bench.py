"""Portable forward (FA_CUDA_FORWARD=portable), causal: sustained-load TFLOP/s, TFLOP/J and SM
clock of whatever library FLASHATTN_LIB names (lab/cuda_fwd_order: run once per build, alternated).
Prints one line per shape tagged with argv[1]; also the outputs' checksum (the order must not
change them)."""
import os
import statistics
import sys
import threading
import time

import pynvml
import torch

os.environ["FA_CUDA_FORWARD"] = "portable"
import flashattn  # noqa: E402


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
    return start.elapsed_time(end) / 1e3 / n, (e1 - e0) / 1e3 / n, statistics.median(clocks)


pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
tag = sys.argv[1]
for d, s in [(128, 2048), (128, 4096), (128, 8192), (64, 2048), (64, 4096), (256, 2048)]:
    h, b = 2048 // d, 16384 // s
    g = torch.Generator(device="cuda").manual_seed(d * 100000 + s)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) + 0.1 for _ in range(3))
    flop = 4 * b * h * s * s * d / 2
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    sec, joules, mhz = window(lambda: flashattn.flash_attn_func(q, k, v, causal=True), 1.5, handle)
    print("| %s | d%d s%d c | %.0f | %.3f | %.0f | %.6f |" % (tag, d, s, flop / sec / 1e12, flop / joules / 1e12, mhz,
                                                        float(out.float().sum())), flush=True)
