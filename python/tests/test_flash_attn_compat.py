"""flash_attn 2.x behaviours, written from its documented semantics (flash_attn itself is not a
dependency): rotary positions with cache_leftpad, k / v of another length than q in
flash_attn_with_kvcache, flash_attn_varlen_func with block_table, and attention dropout with
torch's RNG state and return_attn_probs (S_dmask)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402


def rotate64(x, cos, sin, interleaved):
    """x [..., d] float64 rotated by one table row (cos / sin [rotary_dim / 2])."""
    x = x.clone()
    half = cos.shape[-1]
    if interleaved:
        a, b = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., :half].clone(), x[..., half:2 * half].clone()
        x[..., :half], x[..., half:2 * half] = a * cos - b * sin, a * sin + b * cos
    return x


def kept_rate(p_drop):
    """The rate the library keeps at dropout_p = p_drop: 1 - threshold / 256, threshold =
    round(p · 256) of the float32 p clamped to 255 (8-bit numbers, src/api/fa_philox.h); kept
    elements are scaled by its inverse."""
    threshold = min(255, math.floor(float(torch.tensor(p_drop, dtype=torch.float32)) * 256 + 0.5))
    return 1.0 - threshold / 256.0


def attention64(q, k, v, causal, scale=None, mask=None, p_drop=0.0):
    """q [sq, h, d], k / v [sk, hk, d] float64; bottom-right causal; `mask` [h, sq, sk] keep
    flags for dropout."""
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    g = h // hk
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * (scale if scale is not None else 1 / math.sqrt(d))
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if mask is not None:
        p = p * mask / kept_rate(p_drop)
    return torch.einsum("hqk,khd->qhd", p, v)


# ---- flash_attn_with_kvcache ------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("sq,sn", [(64, 54), (3, 3), (5, 9), (1, 1)])
def test_kvcache_leftpad_rotary_and_seqlen_new(interleaved, sq, sn):
    """k / v with seqlen_new tokens (any count, like flash_attn), cache_leftpad and rotary: the new
    keys are rotated at their cache slot cache_seqlens + t and q at cache_seqlens + i (causal),
    left padding included (flash_attn 2.x); queries are the last sq of the L0 + sn keys."""
    torch.manual_seed(1)
    batch, h, hk, d, cap, rot = 2, 4, 2, 32, 160, 16
    q = torch.randn(batch, sq, h, d)
    kc, vc = torch.randn(batch, cap, hk, d), torch.randn(batch, cap, hk, d)
    k, v = torch.randn(batch, sn, hk, d), torch.randn(batch, sn, hk, d)
    seqlens = torch.tensor([40, 70], dtype=torch.int32)
    leftpad = torch.tensor([5, 0], dtype=torch.int32)
    angle = torch.arange(cap, dtype=torch.float64)[:, None] * 0.1 / (1.0 + torch.arange(rot // 2))
    cos, sin = angle.cos().float(), angle.sin().float()
    kc0, vc0 = kc.clone(), vc.clone()
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin,
                                            cache_seqlens=seqlens, cache_leftpad=leftpad,
                                            causal=True, rotary_interleaved=interleaved)
    assert out.shape == (batch, sq, h, d)
    for b in range(batch):
        L0, pad = int(seqlens[b]), int(leftpad[b])
        newk = torch.stack([rotate64(k[b, t].double(), cos[L0 + t].double(), sin[L0 + t].double(),
                                     interleaved) for t in range(sn)])
        assert torch.allclose(kc[b, L0:L0 + sn].double(), newk, atol=1e-5), "appended keys"
        assert torch.equal(vc[b, L0:L0 + sn], v[b]), "appended values"
        assert torch.equal(kc[b, :L0], kc0[b, :L0]) and torch.equal(kc[b, L0 + sn:], kc0[b, L0 + sn:])
        qr = torch.stack([rotate64(q[b, i].double(), cos[L0 + i].double(), sin[L0 + i].double(),
                                   interleaved) for i in range(sq)])
        keys = torch.cat([kc0[b, pad:L0].double(), newk])
        vals = torch.cat([vc0[b, pad:L0].double(), v[b].double()])
        ref = attention64(qr, keys, vals, causal=True)
        assert torch.allclose(out[b].double(), ref, atol=2e-5), (out[b].double() - ref).abs().max()


# ---- flash_attn_varlen_func with block_table ------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page", [1, 16, 256])
def test_varlen_block_table(dtype, page):
    """Chunked prefill: q (total_q, h, d) against a paged cache; cu_seqlens_k gives the key
    lengths (each sequence's queries are its last keys, causal bottom-right)."""
    torch.manual_seed(3)
    h, hk, d = 4, 2, 64
    lens_q, lens_k = [5, 0, 17], [40, 9, 300]
    pages_per = max(-(-n // page) for n in lens_k)
    num_pages = sum(-(-n // page) for n in lens_k) + 2
    kc = torch.randn(num_pages, page, hk, d).to(dtype)
    vc = torch.randn(num_pages, page, hk, d).to(dtype)
    perm = torch.randperm(num_pages).tolist()
    table = torch.full((3, pages_per), -1, dtype=torch.int32)
    keys, vals, nxt = [], [], 0
    for b, n in enumerate(lens_k):
        for pg in range(-(-n // page)):
            table[b, pg] = perm[nxt]
            nxt += 1
        idx = [(int(table[b, t // page]), t % page) for t in range(n)]
        keys.append(torch.stack([kc[i, j] for i, j in idx]) if n else kc.new_zeros(0, hk, d))
        vals.append(torch.stack([vc[i, j] for i, j in idx]) if n else vc.new_zeros(0, hk, d))
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), h, d).to(dtype)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k),
                                                   causal=True, block_table=table,
                                                   return_attn_probs=True)
    k_flat, v_flat = torch.cat(keys), torch.cat(vals)
    want, want_lse, _ = flashattn.flash_attn_varlen_func(q, k_flat, v_flat, cu_q, cu_k, max(lens_q),
                                                         max(lens_k), causal=True,
                                                         return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    for b in range(3):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref = attention64(q[rows].double(), keys[b].double(), vals[b].double(), causal=True)
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(out[rows].double(), ref, atol=tol)


def test_varlen_block_table_has_no_backward():
    q = torch.randn(4, 2, 16, requires_grad=True)
    kc, vc = torch.randn(2, 4, 2, 16), torch.randn(2, 4, 2, 16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(q, kc, vc, cu, cu, 4, 4,
                                           block_table=torch.tensor([[1]], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()


# ---- dropout ----------------------------------------------------------------------------------


def _problem(dtype=torch.float32, b=2, sq=33, sk=47, h=4, hk=2, d=32, seed=5):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype).requires_grad_()
    return mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d)


def test_dropout_follows_torch_rng():
    q, k, v = _problem()
    torch.manual_seed(123)
    o1 = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    o1.sum().backward()
    g1 = [t.grad.clone() for t in (q, k, v)]
    o_next = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    for t in (q, k, v):
        t.grad = None
    torch.manual_seed(123)
    o2 = flashattn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    o2.sum().backward()
    assert torch.equal(o1, o2), "torch.manual_seed does not reproduce the forward"
    assert all(torch.equal(a, t.grad) for a, t in zip(g1, (q, k, v))), "nor the backward"
    assert not torch.equal(o1, o_next), "consecutive calls reused one mask"
    o0 = flashattn.flash_attn_func(q, k, v, dropout_p=0.0, causal=True)
    assert not torch.equal(o0, o1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_s_dmask(dtype, causal):
    """As flash_attn's own tests: S_dmask's sign gives the mask (>= 0 kept); the output equals
    (P ∘ kept / q) V (q = kept_rate(p)), softmax_lse equals the lse without dropout, and the
    gradients equal those of that reference (float64 autograd with the same mask); keep rate ~ q."""
    p_drop = 0.37
    q, k, v = _problem(dtype)
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, dropout_p=p_drop, causal=causal,
                                                  return_attn_probs=True)
    b, sq, h, d = q.shape
    sk = k.shape[1]
    assert s_dmask.shape == (b, h, sq, sk) and s_dmask.dtype == dtype
    keep = (s_dmask >= 0).double()
    _, lse0, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert torch.equal(lse, lse0), "dropout changed softmax_lse"
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.stack([attention64(q64[i], k64[i], v64[i], causal, mask=keep[i], p_drop=p_drop)
                       for i in range(b)])
    probs = torch.stack([torch.softmax(
        (torch.einsum("qhd,khd->hqk", q64[i], k64[i].repeat_interleave(h // k.shape[2], 1)) /
         math.sqrt(d)).masked_fill(
            torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + sk - sq if causal else
            torch.zeros(sq, sk, dtype=torch.bool), float("-inf")), -1) for i in range(b)])
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    assert torch.allclose(s_dmask.abs().double(), probs.detach(), atol=tol / 10 + 1e-6, rtol=tol)
    assert torch.allclose(out.double(), ref, atol=tol), (out.double() - ref).abs().max()
    visible = probs.detach() > 0
    rate = keep[visible].mean().item()
    n = visible.sum().item()
    q_keep = kept_rate(p_drop)
    assert abs(rate - q_keep) <= 6 * math.sqrt(q_keep * (1 - q_keep) / n) + 1e-9
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    for name, ours, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad),
                             ("dv", v.grad, v64.grad)):
        scale = want.abs().max().item() + 1e-3
        assert (ours.double() - want).abs().max().item() <= 5 * tol * scale, name


def test_dropout_varlen_and_packed():
    torch.manual_seed(9)
    qkv = torch.randn(30, 3, 2, 16, requires_grad=True)
    cu = torch.tensor([0, 11, 11, 30], dtype=torch.int32)
    torch.manual_seed(10)
    o1, lse1, s1 = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 19, dropout_p=0.25,
                                                              causal=True, return_attn_probs=True)
    torch.manual_seed(10)
    o2 = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 19, dropout_p=0.25, causal=True)
    assert torch.equal(o1, o2)
    assert s1.shape == (3, 2, 19, 19)
    assert not s1[1].any(), "an empty sequence has no probabilities"
    o1.sum().backward()
    assert torch.isfinite(qkv.grad).all() and qkv.grad.abs().sum() > 0


def test_dropout_without_attn_probs_returns_none():
    q, k, v = _problem()
    out, lse, s = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
    assert s is None

