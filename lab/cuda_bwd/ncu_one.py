"""ncu_one.py: one standard-shape backward (bf16, b*s = 16k, hidden 2048) for Nsight Compute:
runs our backward twice (the second launch is the one to profile).
Usage: ncu -k regex:fa_bwd_main --launch-skip 1 --launch-count 1 python3 lab/cuda_bwd/ncu_one.py LIB D S CAUSAL"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa_bwd_ctypes as fc  # noqa: E402
from bench_bwd import ours_setup  # noqa: E402

lib = fc.Lib(sys.argv[1])
d, s, causal = int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4]))
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
do = torch.randn_like(q)
call, *_ = ours_setup(lib, q, k, v, do, causal)
for _ in range(2):
    call()
torch.cuda.synchronize()
print("ncu_one done", flush=True)
