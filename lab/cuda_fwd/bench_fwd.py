"""bench_fwd.py: forward TFLOP/s of our CUDA kernel next to PyTorch SDPA's FLASH_ATTENTION (FA2)
and CUDNN_ATTENTION backends, same tensors, same run. Standard shapes: bf16, b*s = 16k tokens,
hidden 2048 (h = 2048/d), FLOPs = 4*b*h*s^2*d (halved causal). triton do_bench median.

Usage: python3 lab/cuda_fwd/bench_fwd.py build-lab/liblabfwd.so [d,...] [s,...] [impls]
impls: comma list of ours, fa2, cudnn (default all three). SDPA gets contiguous [b, h, s, d] copies
(as in ../shared/anchors/torch_sdpa_anchors.py); ours reads the [b, s, h, d] originals.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa_ctypes import load, make_params  # noqa: E402

LIB = sys.argv[1] if len(sys.argv) > 1 else "build-lab/liblabfwd.so"
if os.environ.get("LIB_FIRST"):  # load our library (and its libcudart) before torch's
    call, last_error = load(LIB, os.environ.get("FA_FN", "lab_forward"), os.environ.get("FA_ERR", "lab_last_error"))
import torch  # noqa: E402
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

DS = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 128, 256]
SS = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [512, 1024, 2048, 4096, 8192, 16384]
IMPLS = sys.argv[4].split(",") if len(sys.argv) > 4 else ["ours", "fa2", "cudnn"]
if not os.environ.get("LIB_FIRST"):
    call, last_error = load(LIB, os.environ.get("FA_FN", "lab_forward"), os.environ.get("FA_ERR", "lab_last_error"))


def sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


rows = []
for d in DS:
    h = 2048 // d
    for causal in (False, True):
        for s in SS:
            b = 16384 // s
            q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            o = torch.empty_like(q)
            lse = torch.empty(b * h * s, device="cuda")
            p = make_params(q, k, v, o, lse, causal=causal, stream=torch.cuda.current_stream().cuda_stream)
            st = call(p) if "ours" in IMPLS else 0
            torch.cuda.synchronize()
            if st != 0:
                print(f"d={d} s={s}: status {st} {last_error()}")
                continue
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            nan = float("nan")
            diff = nan
            if "fa2" in IMPLS and "ours" in IMPLS:
                ref = sdpa(SDPBackend.FLASH_ATTENTION, qt, kt, vt, causal).transpose(1, 2)
                diff = (ref.float() - o.float()).abs().max().item()
            t_ours = do_bench(lambda: call(p), warmup=10, rep=50, return_mode="median") if "ours" in IMPLS else nan
            t_fa2 = do_bench(lambda: sdpa(SDPBackend.FLASH_ATTENTION, qt, kt, vt, causal), warmup=10, rep=50,
                             return_mode="median") if "fa2" in IMPLS else nan
            t_cudnn = do_bench(lambda: sdpa(SDPBackend.CUDNN_ATTENTION, qt, kt, vt, causal), warmup=10,
                               rep=50, return_mode="median") if "cudnn" in IMPLS else nan
            tf = lambda t: flops / t / 1e9  # noqa: E731  (ms -> TFLOP/s)
            rows.append((d, int(causal), s, tf(t_ours), tf(t_fa2), tf(t_cudnn), diff))
            print(f"d={d} causal={int(causal)} s={s}: ours {tf(t_ours):.1f} fa2 {tf(t_fa2):.1f} "
                  f"cudnn {tf(t_cudnn):.1f} TFLOP/s (max|ours-fa2| {diff:.3g})", flush=True)
            del q, k, v, o, lse, qt, kt, vt

print("\n| d | causal | s | ours | fa2 | cudnn | ours/fa2 |")
print("|---|---|---|---|---|---|---|")
for d, c, s, a, f2, cd, _ in rows:
    print(f"| {d} | {c} | {s} | {a:.1f} | {f2:.1f} | {cd:.1f} | {a / f2:.2f} |")
