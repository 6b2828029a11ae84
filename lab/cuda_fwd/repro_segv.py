"""repro_segv.py: isolate a host segfault seen in bench_fwd.py (second shape after do_bench).
Usage: python3 lab/cuda_fwd/repro_segv.py build-lab/liblabfwd.so MODE  (MODE: plain | loop | bench)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa_ctypes import load, make_params  # noqa: E402

if os.environ.get("LIB_FIRST"):
    call, last_error = load(sys.argv[1])
import torch  # noqa: E402

if not os.environ.get("LIB_FIRST"):
    call, last_error = load(sys.argv[1])
mode = sys.argv[2]
for s in (512, 1024, 2048):
    b, h, d = 16384 // s, 32, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(b * h * s, device="cuda")
    p = make_params(q, k, v, o, lse, stream=torch.cuda.current_stream().cuda_stream)
    print(mode, s, "first call", call(p), flush=True)
    if mode == "loop":
        for _ in range(300):
            call(p)
    if mode == "bench":
        from triton.testing import do_bench
        do_bench(lambda: call(p), warmup=10, rep=50, return_mode="median")
    torch.cuda.synchronize()
    print(mode, s, "done", flush=True)
