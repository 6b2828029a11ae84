"""lab/decode/py_overhead.py: where the Python kv-cache call's time goes at batch 1 x 8k.

Times flashattn.flash_attn_with_kvcache (contiguous bf16 cache, 1 query token, 32/8 heads,
d = 128) next to SDPA's CUDNN_ATTENTION on the same values:
  host us   wall time of the Python call alone (launches are asynchronous; 300 calls, no flush)
  flushed   CUDA-event time of one call after a 256 MiB L2-evicting write (as sdpa_decode.py)
  chained   CUDA-event time per call of 50 back-to-back calls (no flush: L2-warm, launch-bound)
for the library allocating its split-KV scratch itself (cudaMallocAsync per call) and for the
scratch taken from PyTorch's caching allocator (the package's default since session 4).
  PYTHONPATH=python FLASHATTN_LIB=build/libflashattn.so python3 lab/decode/py_overhead.py
"""
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from flashattn import _torch_impl as ti

B, CTX, HQ, HKV, D = 1, 8192, 32, 8, 128
torch.manual_seed(0)
q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
kc = torch.randn(B, CTX, HKV, D, device="cuda", dtype=torch.bfloat16)
vc = torch.randn(B, CTX, HKV, D, device="cuda", dtype=torch.bfloat16) + 0.5
seqlens = torch.full((B,), CTX, dtype=torch.int32, device="cuda")
qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, kc, vc))
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def ours():
    return flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True)


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def flushed_us(fn, calls=40):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for _ in range(3):
        fn()
    for s, e in ev:
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev) * 1e3


def chained_us(fn, n=50):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / n


rows = []
own_alloc = ti._workspace_alloc
for name, fn, hook in (("flashattn, torch-allocated scratch", ours, own_alloc),
                       ("flashattn, library cudaMallocAsync", ours, lambda t: None),
                       ("sdpa CUDNN_ATTENTION", cudnn, own_alloc)):
    ti._workspace_alloc = hook
    r = [name]
    for rep in range(2):
        r = [name, host_us(fn), flushed_us(fn), chained_us(fn)]
    rows.append(r)
ti._workspace_alloc = own_alloc
print("| 1 x 8k decode | host us/call | flushed us | chained us |")
print("|---|---|---|---|")
for name, h, f, c in rows:
    print("| %s | %.1f | %.1f | %.1f |" % (name, h, f, c))
