"""Kernels for an ncu look at the forward at short causal sequences (issue 6): ours and cuDNN,
bf16, b·s = 16k, d = 128, s = 2k, causal and not; each run twice (ncu profiles every launch the
-k filter matches). Run under ncu (lab/device/session_y.sh)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

for causal in (True, False):
    d, s = 128, 2048
    h, b = 2048 // d, 16384 // s
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) + 0.1 for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    for _ in range(2):
        flashattn.flash_attn_func(q, k, v, causal=causal)
    for _ in range(2):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch.cuda.synchronize()
