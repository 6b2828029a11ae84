"""flashattn.layers.rotary against a float64 rotation written out position by position, with
flash_attn.layers.rotary's conventions: interleaved pairs or halves, a partial rotary_dim,
offsets per call or per sequence, varlen batches, in-place forms, XPos scaling, autograd."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashattn import FlashAttnValueError  # noqa: E402
from test_flash_attn_compat import rotate64  # noqa: E402
from flashattn.layers.rotary import (RotaryEmbedding, apply_rotary, apply_rotary_emb,  # noqa: E402
                                     apply_rotary_emb_func, apply_rotary_emb_kv_, apply_rotary_emb_qkv_)


def ref_rotate(x, cos, sin, positions, interleaved):
    """x (..., tokens, heads, d), positions (..., tokens): the float64 NumPy rotated copy, one
    token at a time by test_flash_attn_compat's rotate64; a position outside the tables leaves the
    token as it is."""
    as64 = lambda t: t.detach().double() if torch.is_tensor(t) else torch.from_numpy(np.asarray(t, np.float64))
    x, cos, sin = as64(x), as64(cos), as64(sin)
    flat = x.reshape(-1, *x.shape[-2:]).clone()
    for t, p in enumerate(np.asarray(positions).reshape(-1)):
        if 0 <= p < cos.shape[0]:
            flat[t] = rotate64(flat[t], cos[p], sin[p], interleaved)
    return flat.reshape(x.shape).numpy()


def tables(seqlen_ro, half, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    angle = torch.rand(seqlen_ro, half, generator=g, dtype=torch.float64) * 2 * math.pi
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def close(ours, ref, dtype):
    """fp32 arithmetic rounded once to dtype: within half an ulp of dtype (plus fp32 noise)."""
    rtol = {torch.float32: 1e-6, torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8}[dtype]
    np.testing.assert_allclose(ours.detach().double().numpy(), ref, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [32, 64])
def test_apply_rotary_emb(dtype, interleaved, rotary_dim):
    b, s, h, d = 2, 7, 3, 64
    x = torch.randn(b, s, h, d).to(dtype)
    cos, sin = tables(20, rotary_dim // 2)
    for offsets in (0, 5, torch.tensor([3, 13], dtype=torch.int32)):
        pos = np.arange(s)[None, :] + (offsets.numpy()[:, None] if torch.is_tensor(offsets) else offsets)
        ref = ref_rotate(x.double(), cos, sin, np.broadcast_to(pos, (b, s)), interleaved)
        out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
        assert out.dtype == dtype and out.shape == x.shape
        close(out, ref, dtype)
    assert apply_rotary_emb_func is apply_rotary_emb


def test_apply_rotary_and_its_conjugate_undo_each_other():
    x = torch.randn(2, 6, 2, 32, dtype=torch.float64)
    cos, sin = tables(9, 16, torch.float64)
    y = apply_rotary(x, cos, sin, seqlen_offsets=3, interleaved=True)
    close(y, ref_rotate(x, cos, sin, np.broadcast_to(np.arange(6)[None] + 3, (2, 6)), True), torch.float32)
    torch.testing.assert_close(apply_rotary(y, cos, sin, seqlen_offsets=3, interleaved=True, conjugate=True), x)


def test_positions_past_the_tables_stay_unrotated():
    x = torch.randn(2, 4, 1, 16)
    cos, sin = tables(6, 8)
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([0, 4]))
    ref = ref_rotate(x, cos, sin, np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), False)
    close(out, ref, torch.float32)
    torch.testing.assert_close(out[1, 2:], x[1, 2:])  # positions 6 and 7: past the 6 rows


@pytest.mark.parametrize("interleaved", [False, True])
def test_varlen(interleaved):
    cu = torch.tensor([0, 3, 3, 8, 10], dtype=torch.int32)  # one empty sequence
    total, h, d = 12, 2, 32  # two tokens past the last sequence
    x = torch.randn(total, h, d)
    cos, sin = tables(16, 12)
    offsets = torch.tensor([1, 2, 0, 6])
    pos = np.full(total, -1)
    for i in range(4):
        for t in range(int(cu[i]), int(cu[i + 1])):
            pos[t] = t - int(cu[i]) + int(offsets[i])
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets, cu_seqlens=cu,
                           max_seqlen=5)
    close(out, ref_rotate(x, cos, sin, pos, interleaved), torch.float32)
    torch.testing.assert_close(out[10:], x[10:])


def test_inplace_writes_x_and_returns_it():
    x = torch.randn(1, 5, 2, 32, dtype=torch.bfloat16)
    before = x.clone()
    cos, sin = tables(5, 8)
    out = apply_rotary_emb(x, cos, sin, inplace=True)
    assert out is x
    close(x, ref_rotate(before.double(), cos, sin, np.arange(5)[None], False), torch.bfloat16)
    assert torch.equal(x[..., 16:], before[..., 16:])
    y = torch.randn(1, 5, 2, 32)
    kept = y.clone()
    apply_rotary_emb(y, cos, sin)
    assert torch.equal(y, kept)  # not in place: x untouched


def test_gradient_is_the_inverse_rotation():
    x = torch.randn(2, 5, 2, 16, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(9, 6, torch.float64)
    offsets = torch.tensor([0, 4])
    torch.autograd.gradcheck(lambda t: apply_rotary_emb(t, cos, sin, interleaved=True, seqlen_offsets=offsets),
                             (x,))
    # through an in-place use on an intermediate tensor, as models apply it
    w = torch.randn(2, 5, 2, 16, dtype=torch.float64)
    (apply_rotary_emb(x * 1.0, cos, sin, inplace=True, seqlen_offsets=offsets) * w).sum().backward()
    g = x.grad.clone()
    x.grad = None
    (apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets) * w).sum().backward()
    torch.testing.assert_close(g, x.grad)


@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_and_kv_in_place(interleaved):
    b, s, h, d = 2, 6, 2, 32
    cos, sin = tables(10, 16, seed=1)
    cos_k, sin_k = tables(10, 16, seed=2)
    pos = np.broadcast_to(np.arange(s)[None] + 3, (b, s))
    qkv = torch.randn(b, s, 3, h, d)
    before = qkv.clone()
    assert apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, interleaved=interleaved, seqlen_offsets=3) is qkv
    close(qkv[:, :, 0], ref_rotate(before[:, :, 0], cos, sin, pos, interleaved), torch.float32)
    close(qkv[:, :, 1], ref_rotate(before[:, :, 1], cos_k, sin_k, pos, interleaved), torch.float32)
    assert torch.equal(qkv[:, :, 2], before[:, :, 2])
    # GQA packing: 4 query heads, 2 kv heads
    qkv = torch.randn(b, s, 4 + 2 * 2, d)
    before = qkv.clone()
    apply_rotary_emb_qkv_(qkv, cos, sin, interleaved=interleaved, seqlen_offsets=3, num_heads_q=4)
    close(qkv[:, :, :6], ref_rotate(before[:, :, :6], cos, sin, pos, interleaved), torch.float32)
    assert torch.equal(qkv[:, :, 6:], before[:, :, 6:])
    kv = torch.randn(b, s, 2, h, d)
    before = kv.clone()
    assert apply_rotary_emb_kv_(kv, cos, sin, interleaved=interleaved, seqlen_offsets=3) is kv
    close(kv[:, :, 0], ref_rotate(before[:, :, 0], cos, sin, pos, interleaved), torch.float32)
    assert torch.equal(kv[:, :, 1], before[:, :, 1])


@pytest.mark.parametrize("scale_base", [None, 512.0])
def test_rotary_embedding_module(scale_base):
    dim, b, s, h, d = 16, 2, 5, 2, 32
    rope = RotaryEmbedding(dim, base=10000.0, interleaved=False, scale_base=scale_base)
    qkv = torch.randn(b, s, 3, h, d)
    before = qkv.clone()
    offset = 4
    out = rope(qkv, seqlen_offset=offset)
    assert out is qkv
    n = s + offset  # the tables cover the positions used
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    angle = np.outer(np.arange(n), inv_freq)
    cos, sin = np.cos(angle), np.sin(angle)
    cos_k, sin_k = cos, sin
    if scale_base is not None:
        scale = (np.arange(0, dim, 2) + 0.4 * dim) / (1.4 * dim)
        power = (np.arange(n) - n // 2) / scale_base
        factor = scale[None, :] ** power[:, None]
        cos, sin, cos_k, sin_k = cos * factor, sin * factor, cos_k / factor, sin_k / factor
    pos = np.broadcast_to(np.arange(s)[None] + offset, (b, s))
    np.testing.assert_allclose(qkv[:, :, 0].double().numpy(), ref_rotate(before[:, :, 0], cos, sin, pos, False),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(qkv[:, :, 1].double().numpy(), ref_rotate(before[:, :, 1], cos_k, sin_k, pos, False),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(qkv[:, :, 2], before[:, :, 2])
    # q and kv apart, per-sequence offsets with max_seqlen
    q, kv = torch.randn(b, s, h, d), torch.randn(b, s, 2, h, d)
    q0, kv0 = q.clone(), kv.clone()
    offsets = torch.tensor([0, 3])
    q_out, kv_out = rope(q, kv, seqlen_offset=offsets, max_seqlen=s + 3)
    assert q_out is q and kv_out is kv
    pos = np.arange(s)[None] + offsets.numpy()[:, None]
    n = s + 3
    angle = np.outer(np.arange(n), inv_freq)
    cos, sin = np.cos(angle), np.sin(angle)
    cos_k, sin_k = cos, sin
    if scale_base is not None:
        factor = scale[None, :] ** ((np.arange(n) - n // 2) / scale_base)[:, None]
        cos, sin, cos_k, sin_k = cos * factor, sin * factor, cos_k / factor, sin_k / factor
    np.testing.assert_allclose(q.double().numpy(), ref_rotate(q0, cos, sin, pos, False), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kv[:, :, 0].double().numpy(), ref_rotate(kv0[:, :, 0], cos_k, sin_k, pos, False),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(kv[:, :, 1], kv0[:, :, 1])


@pytest.mark.parametrize("call, field", [
    (lambda x, c, s: apply_rotary_emb(x, *tables(12, 20)), "cos"),                # rotary_dim 40 > 32
    (lambda x, c, s: apply_rotary_emb(x, c, s[:4]), "cos"),                       # tables differ
    (lambda x, c, s: apply_rotary_emb(x, c, s, seqlen_offsets=8), "seqlen_offsets"),  # 8 + 5 > 12
    (lambda x, c, s: apply_rotary_emb(x, c[:4], s[:4], seqlen_offsets=torch.tensor([0, 0])), "fewer than seqlen"),
    (lambda x, c, s: apply_rotary_emb(x, c, s, seqlen_offsets=torch.tensor([1, 2, 3])), "seqlen_offsets"),
    (lambda x, c, s: apply_rotary_emb(x[0], c, s, cu_seqlens=torch.tensor([0, 5])), "max_seqlen"),
    (lambda x, c, s: apply_rotary_emb(x[0], c, s), "x must be"),
    (lambda x, c, s: apply_rotary_emb_qkv_(torch.randn(2, 5, 8, 32), c, s), "num_heads_q"),
    (lambda x, c, s: apply_rotary_emb_qkv_(torch.randn(2, 5, 8, 32), c, s, num_heads_q=5), "num_heads_q"),
    (lambda x, c, s: apply_rotary_emb_qkv_(torch.randn(2, 5, 3, 2, 32), c, s, cos_k=c), "cos_k"),
    (lambda x, c, s: apply_rotary_emb_kv_(torch.randn(2, 5, 3, 2, 32), c, s), "kv must be"),
])
def test_bad_arguments(call, field):
    x = torch.randn(2, 5, 2, 32)
    cos, sin = tables(12, 8)
    with pytest.raises(FlashAttnValueError, match=field):
        call(x, cos, sin)


@pytest.mark.parametrize("interleaved", [False, True])
def test_agrees_with_the_kvcache_append(interleaved):
    """flash_attn_with_kvcache rotates the appended keys (the C library's rotary) at positions
    cache_seqlens + i: the same keys as apply_rotary_emb with seqlen_offsets = cache_seqlens."""
    import flashattn
    b, cap, h, d, n = 2, 16, 2, 32, 3
    k_cache, v_cache = torch.zeros(b, cap, h, d), torch.zeros(b, cap, h, d)
    k_new, v_new = torch.randn(b, n, h, d), torch.randn(b, n, h, d)
    q = torch.randn(b, n, h, d)
    cos, sin = tables(cap, 8)
    seqlens = torch.tensor([2, 9], dtype=torch.int32)
    flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=seqlens, causal=True, rotary_interleaved=interleaved)
    expected = apply_rotary_emb(k_new, cos, sin, interleaved=interleaved, seqlen_offsets=seqlens)
    for i in range(b):
        s0 = int(seqlens[i])
        torch.testing.assert_close(k_cache[i, s0:s0 + n], expected[i], rtol=1e-5, atol=1e-6)
