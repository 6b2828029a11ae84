"""ncu: DRAM traffic and L2 hit rate of the causal d128 s2k forward, library order vs head groups
of 8 (one CTA per tile), and cuDNN (lab/hopper/order)."""
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

d, s = 128, 2048
h, b = 2048 // d, 16384 // s
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) + 0.1 for _ in range(3))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
flashattn.flash_attn_func(q, k, v, causal=True)
os.environ.update(FA_LAB_HEAD_GROUP="8", FA_LAB_PERSIST="0")
flashattn.flash_attn_func(q, k, v, causal=True)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
torch.cuda.synchronize()
