"""prof3.py: our backward once per shape (bf16, b*s = 16k, hidden 2048) for Nsight Compute.
Usage: ncu -k regex:fa_bwd2_main ... python3 prof3.py LIB d:s:causal [d:s:causal ...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fa_bwd_ctypes as fc  # noqa: E402
from bench_bwd import ours_setup  # noqa: E402

lib = fc.Lib(sys.argv[1])
for item in sys.argv[2:]:
    d, s, causal = (int(x) for x in item.split(":"))
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    call, *_ = ours_setup(lib, q, k, v, do, bool(causal))
    call()
    torch.cuda.synchronize()
    del call, q, k, v, do
print("prof3 done", flush=True)
