"""Rotary position embeddings with flash_attn.layers.rotary's interface: apply_rotary_emb (alias
apply_rotary_emb_func), apply_rotary_emb_qkv_, apply_rotary_emb_kv_ and the RotaryEmbedding
module, plus flash_attn.ops.triton.rotary's apply_rotary, so programs that import them from
flash_attn can import them from here.

On torch tensors of any device and dtype, differentiable (plain torch operations, in-place ones
through views, so autograd follows them). The rotation is computed in fp32 (fp64 for fp64 x) and
rounded once to x's dtype. For position p of a sequence and i < rotary_dim / 2, the pair (x0, x1) becomes
(x0·cos[p, i] − x1·sin[p, i], x0·sin[p, i] + x1·cos[p, i]). The pair is (x[2i], x[2i + 1]) when
interleaved (GPT-J), else (x[i], x[i + rotary_dim / 2]) (GPT-NeoX). Columns from rotary_dim on
are left as they are.

Positions count from 0 in each sequence plus `seqlen_offsets` (an int, or one per sequence:
decoding with a KV cache). A position past the cos / sin tables leaves its token unrotated, as
flash_attn's kernel does; with an int offset that is refused instead, as flash_attn does.
"""

import torch

from .._lib import FlashAttnValueError


def _fail(message):
    raise FlashAttnValueError("flashattn.layers.rotary: " + message)


def _check_tables(cos, sin, headdim, name="cos"):
    if cos.dim() != 2 or sin.shape != cos.shape:
        _fail(f"{name} and sin must both be (seqlen_ro, rotary_dim / 2); got {tuple(cos.shape)} and "
              f"{tuple(sin.shape)}")
    if 2 * cos.shape[1] > headdim:
        _fail(f"{name}: rotary_dim = 2 * {cos.shape[1]} is more than the head dim {headdim}")


def _offsets(seqlen_offsets, batch, device):
    """(batch,) int64 offsets on device from an int or an integer tensor of shape (batch,)."""
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.shape != (batch,) or seqlen_offsets.dtype not in (torch.int32, torch.int64):
            _fail(f"seqlen_offsets must be an int or an int32 / int64 tensor of shape ({batch},); got "
                  f"{seqlen_offsets.dtype} {tuple(seqlen_offsets.shape)}")
        return seqlen_offsets.to(device=device, dtype=torch.int64)
    return torch.full((batch,), int(seqlen_offsets), dtype=torch.int64, device=device)


def _positions(x, seqlen_ro, seqlen_offsets, cu_seqlens, max_seqlen):
    """The position of every token of x: (batch, seqlen) for x (batch, seqlen, nheads, headdim),
    (total,) for x (total, nheads, headdim) with cu_seqlens; -1 for the tokens past the last
    sequence of a varlen x (left unrotated)."""
    if cu_seqlens is None:
        if x.dim() != 4:
            _fail(f"x must be (batch, seqlen, nheads, headdim) without cu_seqlens; got {tuple(x.shape)}")
        batch, seqlen = x.shape[0], x.shape[1]
        if seqlen > seqlen_ro:
            _fail(f"cos: its {seqlen_ro} positions are fewer than seqlen {seqlen}")
        if not isinstance(seqlen_offsets, torch.Tensor) and seqlen + int(seqlen_offsets) > seqlen_ro:
            _fail(f"seqlen_offsets: {int(seqlen_offsets)} + seqlen {seqlen} is past the {seqlen_ro} "
                  f"positions of cos / sin")
        offsets = _offsets(seqlen_offsets, batch, x.device)
        return torch.arange(seqlen, device=x.device, dtype=torch.int64)[None, :] + offsets[:, None]
    if x.dim() != 3:
        _fail(f"x must be (total_seqlen, nheads, headdim) with cu_seqlens; got {tuple(x.shape)}")
    if max_seqlen is None:
        _fail("max_seqlen must be given with cu_seqlens")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        _fail(f"cu_seqlens must be (batch + 1,); got {tuple(cu_seqlens.shape)}")
    if int(max_seqlen) > seqlen_ro:
        _fail(f"max_seqlen {int(max_seqlen)} is past the {seqlen_ro} positions of cos / sin")
    batch = cu_seqlens.shape[0] - 1
    token = torch.arange(x.shape[0], device=x.device, dtype=torch.int64)
    offsets = _offsets(seqlen_offsets, batch, x.device)
    if batch == 0:
        return torch.full_like(token, -1)
    cu = cu_seqlens.to(device=x.device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], token, right=True)  # the sequence holding each token
    inside = (token >= cu[0]) & (seq < batch)
    seq = seq.clamp(max=batch - 1)
    return torch.where(inside, token - cu[seq] + offsets[seq], torch.full_like(token, -1))


def _rotated(x, cos, sin, positions, interleaved):
    """x[..., :rotary_dim] rotated (x's dtype; computed in fp32, fp64 for fp64 x), positions
    broadcasting over x's leading axes; positions outside [0, seqlen_ro) rotate by the identity."""
    seqlen_ro, half = cos.shape
    ro = 2 * half
    compute = torch.promote_types(x.dtype, torch.float32)
    valid = (positions >= 0) & (positions < seqlen_ro)
    index = torch.where(valid, positions, torch.zeros_like(positions))
    one, zero = torch.ones((), dtype=compute, device=x.device), torch.zeros((), dtype=compute, device=x.device)
    c = torch.where(valid[..., None], cos.to(device=x.device, dtype=compute)[index], one)
    s = torch.where(valid[..., None], sin.to(device=x.device, dtype=compute)[index], zero)
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)  # over the heads axis
    xr = x[..., :ro].to(compute)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
    else:
        x0, x1 = xr[..., :half], xr[..., half:]
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    y = torch.stack((y0, y1), dim=-1).flatten(-2) if interleaved else torch.cat((y0, y1), dim=-1)
    return y.to(x.dtype)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """Rotary embedding of the first rotary_dim = 2 * cos.shape[1] columns of x.

    x: (batch, seqlen, nheads, headdim), or (total_seqlen, nheads, headdim) with cu_seqlens
    (batch + 1,) and max_seqlen. cos, sin: (seqlen_ro, rotary_dim / 2). seqlen_offsets: int or
    (batch,) integer tensor added to every position of a sequence. interleaved: rotate pairs
    (0, 1), (2, 3), ... instead of the halves. inplace: write into x and return it.
    Returns a tensor shaped as x."""
    _check_tables(cos, sin, x.shape[-1])
    positions = _positions(x, cos.shape[0], seqlen_offsets, cu_seqlens, max_seqlen)
    y = _rotated(x, cos, sin, positions, interleaved)
    ro = y.shape[-1]
    if inplace:
        x[..., :ro].copy_(y)
        return x
    return y if ro == x.shape[-1] else torch.cat((y, x[..., ro:]), dim=-1)


apply_rotary_emb_func = apply_rotary_emb


def apply_rotary(x, cos, sin, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None, interleaved=False, inplace=False,
                 conjugate=False):
    """flash_attn.ops.triton.rotary.apply_rotary's form of apply_rotary_emb: conjugate rotates by
    the opposite angles (the inverse rotation, which the backward applies)."""
    return apply_rotary_emb(x, cos, -sin if conjugate else sin, interleaved=interleaved, inplace=inplace,
                            seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


def apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0,
                          num_heads_q=None):
    """Rotary embedding, in place, of the q and k parts of qkv (v untouched); returns qkv.

    qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, num_heads_q + 2 * num_heads_k,
    headdim) with num_heads_q (GQA / MQA). cos, sin: (seqlen_ro, rotary_dim / 2); cos_k, sin_k
    (optional, both or neither) rotate k instead of cos, sin."""
    if (cos_k is None) != (sin_k is None):
        _fail("give both cos_k and sin_k, or neither")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            _fail(f"qkv must be (batch, seqlen, 3, nheads, headdim); got {tuple(qkv.shape)}")
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    elif qkv.dim() == 4:
        if num_heads_q is None:
            _fail("num_heads_q must be given with qkv of shape (batch, seqlen, num_heads_q + 2 * num_heads_k, "
                  "headdim)")
        heads_k2 = qkv.shape[2] - int(num_heads_q)
        if int(num_heads_q) < 1 or heads_k2 < 2 or heads_k2 % 2:
            _fail(f"num_heads_q = {num_heads_q} does not split the {qkv.shape[2]} heads of qkv into "
                  f"num_heads_q + 2 * num_heads_k")
        q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + heads_k2 // 2]
    else:
        _fail(f"qkv must be 5-D (batch, seqlen, 3, nheads, headdim) or 4-D; got {tuple(qkv.shape)}")
    apply_rotary_emb(q, cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=seqlen_offsets)
    apply_rotary_emb(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k,
                     interleaved=interleaved, inplace=True, seqlen_offsets=seqlen_offsets)
    return qkv


def apply_rotary_emb_kv_(kv, cos, sin, interleaved=False, seqlen_offsets=0):
    """Rotary embedding, in place, of the k part of kv (batch, seqlen, 2, nheads, headdim); returns
    kv."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        _fail(f"kv must be (batch, seqlen, 2, nheads, headdim); got {tuple(kv.shape)}")
    apply_rotary_emb(kv[:, :, 0], cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=seqlen_offsets)
    return kv


class RotaryEmbedding(torch.nn.Module):
    """flash_attn's RotaryEmbedding: frequencies base^(-2i / dim) for i < dim / 2, cos / sin tables
    made in fp32 at the first call that needs more positions (or a new device or dtype) and kept
    in the input's dtype; with scale_base, XPos: q's tables times and k's divided by
    ((2i + 0.4·dim) / (1.4·dim))^((p − seqlen // 2) / scale_base).

    forward(qkv, kv=None, seqlen_offset=0, max_seqlen=None, num_heads_q=None) rotates in place and
    returns qkv (as apply_rotary_emb_qkv_), or with kv given, q = qkv (batch, seqlen, nheads,
    headdim) and kv (batch, seqlen, 2, nheads, headdim) and returns (q, kv). With per-sequence
    offsets (a tensor) give max_seqlen, the number of positions the tables must cover."""

    def __init__(self, dim, base=10000.0, interleaved=False, scale_base=None, device=None):
        super().__init__()
        self.dim = int(dim)
        self.base = float(base)
        self.interleaved = interleaved
        self.scale_base = scale_base
        self.register_buffer("inv_freq", self._inv_freq(device), persistent=False)
        scale = None
        if scale_base is not None:
            scale = (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) + 0.4 * self.dim) / (1.4 * self.dim)
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = self._sin_cached = self._cos_k_cached = self._sin_k_cached = None

    def _inv_freq(self, device=None):
        return 1.0 / self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim)

    def _update_cos_sin_cache(self, seqlen, device=None, dtype=None):
        if (seqlen > self._seq_len_cached or self._cos_cached is None or self._cos_cached.device != device
                or self._cos_cached.dtype != dtype or (self.training and self._cos_cached.is_inference())):
            self._seq_len_cached = seqlen
            inv_freq = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._inv_freq(device)
            t = torch.arange(seqlen, device=device, dtype=torch.float32)
            freqs = torch.outer(t, inv_freq.to(device))
            cos, sin = torch.cos(freqs), torch.sin(freqs)
            if self.scale is None:
                self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            else:
                power = (torch.arange(seqlen, device=device, dtype=torch.float32) - seqlen // 2) / self.scale_base
                scale = self.scale.to(device)[None, :] ** power[:, None]
                self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
                self._cos_k_cached, self._sin_k_cached = (cos / scale).to(dtype), (sin / scale).to(dtype)

    def forward(self, qkv, kv=None, seqlen_offset=0, max_seqlen=None, num_heads_q=None):
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(int(max_seqlen), device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, device=qkv.device, dtype=qkv.dtype)
        elif self._cos_cached is None:
            _fail("max_seqlen must be given with per-sequence seqlen_offset before the tables exist")
        cos_k, sin_k = self._cos_k_cached, self._sin_k_cached  # None without XPos
        if kv is None:
            return apply_rotary_emb_qkv_(qkv, self._cos_cached, self._sin_cached, cos_k, sin_k,
                                         interleaved=self.interleaved, seqlen_offsets=seqlen_offset,
                                         num_heads_q=num_heads_q)
        q = apply_rotary_emb(qkv, self._cos_cached, self._sin_cached, interleaved=self.interleaved, inplace=True,
                             seqlen_offsets=seqlen_offset)
        kv = apply_rotary_emb_kv_(kv, self._cos_cached if cos_k is None else cos_k,
                                  self._sin_cached if sin_k is None else sin_k, interleaved=self.interleaved,
                                  seqlen_offsets=seqlen_offset)
        return q, kv
