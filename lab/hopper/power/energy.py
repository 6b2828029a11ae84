"""Energy per FLOP of the forward on the H200: ours (flashattn through torch) against cuDNN
(SDPA CUDNN_ATTENTION) and a dense bf16 GEMM (cuBLAS), each run under sustained load for a fixed
wall time, in one process. The GPU's energy counter (NVML, mJ) is read before and after each
window, so TFLOP per joule comes straight from the hardware; the SM clock is sampled on a thread.

    python3 lab/hopper/power/energy.py [--seconds 2.0]

Question (issue 6): with every kernel at the 700 W cap, speed = (FLOP per joule) x 700 W, so
1.10x cuDNN needs 10 % less energy per FLOP. How far is each kernel from the GEMM's FLOP/J?
"""
import argparse
import statistics
import threading
import time

import pynvml
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn


def window(fn, seconds, handle):
    """Run fn back to back for `seconds`; return (calls/s, joules/call, median SM MHz, mean W)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
            time.sleep(0.02)

    th = threading.Thread(target=sample)
    # calibrate: how many calls fill the window
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-5)
    n = max(3, int(seconds / one))
    th.start()
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    w0 = time.perf_counter()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - w0
    e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    stop.set()
    th.join()
    gpu_s = start.elapsed_time(end) / 1e3
    joules = (e1 - e0) / 1e3
    return n / gpu_s, joules / n, statistics.median(clocks) if clocks else float("nan"), joules / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    dev = "cuda"
    rows = []

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    flop = 2 * 8192 ** 3
    cps, jpc, mhz, watts = window(lambda: a @ b, args.seconds, handle)
    rows.append(("GEMM 8192^3 (cuBLAS)", "", flop * cps / 1e12, flop / jpc / 1e12, mhz, watts))
    del a, b

    shapes = [(128, 16384, False), (128, 2048, True), (128, 16384, True), (64, 2048, True), (64, 16384, False),
              (256, 16384, False), (256, 2048, True)]
    for d, s, causal in shapes:
        h, bsz = 2048 // d, 16384 // s
        q, k, v = (torch.randn(bsz, s, h, d, device=dev, dtype=torch.bfloat16) + 0.1 for _ in range(3))
        flop = 4 * bsz * h * s * s * d / (2 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def ours():
            return flashattn.flash_attn_func(q, k, v, causal=causal)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        for name, fn in (("ours", ours), ("cuDNN", cudnn), ("ours", ours), ("cuDNN", cudnn)):
            cps, jpc, mhz, watts = window(fn, args.seconds, handle)
            rows.append((f"d{d} s{s} {'c' if causal else 'nc'}", name, flop * cps / 1e12, flop / jpc / 1e12, mhz,
                         watts))
        del q, k, v, qt, kt, vt
        torch.cuda.empty_cache()

    print("\n| shape | kernel | TFLOP/s | TFLOP/J (GPU energy counter) | SM MHz median | W mean |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %.0f | %.3f | %.0f | %.0f |" % r)


if __name__ == "__main__":
    main()
