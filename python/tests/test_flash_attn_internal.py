"""flash_attn 2.8's internal entry points (_flash_attn_forward, _flash_attn_varlen_forward,
_flash_attn_backward, _flash_attn_varlen_backward and their _wrapped_* names), which ring and
context-parallel attention libraries call directly: their positional signatures and return
values, the gradients written into the caller's buffers, and dropout through rng_state.
Fresh random inputs on every run (the seed is in each failure message)."""

import math
import os

import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import flash_attn_interface as fai  # noqa: E402
from test_flash_attn_compat import attention64, kept_rate  # noqa: E402


def fresh_seed():
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def problem(dtype, b=2, sq=37, sk=45, h=4, hk=2, d=24):
    mk = lambda *s: torch.randn(*s).to(dtype)
    return mk(b, sq, h, d), mk(b, sk, hk, d), mk(b, sk, hk, d)


def poisoned_like(t):
    return torch.full_like(t, float("nan"))


def public_grads(q, k, v, dout, **kw):
    """(out, lse, dq, dk, dv) of flash_attn_func through autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashattn.flash_attn_func(*leaves, return_attn_probs=True, deterministic=True, **kw)
    grads = torch.autograd.grad(out, leaves, dout)
    return (out.detach(), lse) + tuple(grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_internal_forward_backward_equal_the_public_functions(dtype, causal):
    seed = fresh_seed()
    q, k, v = problem(dtype)
    scale = 0.3
    window = (9, 3) if causal else (-1, -1)
    out, lse, s_dmask, rng_state = fai._flash_attn_forward(q, k, v, 0.0, scale, causal, *window,
                                                           0.0, None, False)
    dout = torch.randn_like(out)
    want = public_grads(q, k, v, dout, softmax_scale=scale, causal=causal, window_size=window)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1]), seed
    assert lse.shape == (2, 4, 37) and lse.dtype == torch.float32
    assert s_dmask.shape == (0,) and s_dmask.dtype == dtype
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64 and not rng_state.any()
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    softmax_d = fai._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, scale, causal,
                                         *window, 0.0, None, True, rng_state)
    for name, got, ref in (("dq", dq, want[2]), ("dk", dk, want[3]), ("dv", dv, want[4])):
        assert torch.equal(got, ref), "%s differs from autograd's (seed %d)" % (name, seed)
    assert softmax_d.shape == (2, 4, 128) and softmax_d.dtype == torch.float32
    d = (dout.double() * out.double()).sum(-1).transpose(1, 2)
    assert torch.allclose(softmax_d[:, :, :37].double(), d, rtol=1e-5, atol=1e-5), seed
    assert not softmax_d[:, :, 37:].any()
    if not causal:  # the float64 attention (attention64 has no window)
        ref = torch.stack([attention64(q[i].double(), k[i].double(), v[i].double(), False, scale)
                           for i in range(2)])
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        assert (out.double() - ref).abs().max().item() <= tol, seed


def test_internal_wrapped_names_and_none_buffers():
    fresh_seed()
    q, k, v = problem(torch.float32, b=1, sq=5, sk=5)
    assert fai._wrapped_flash_attn_forward is fai._flash_attn_forward
    assert fai._wrapped_flash_attn_varlen_forward is fai._flash_attn_varlen_forward
    assert fai._wrapped_flash_attn_backward is fai._flash_attn_backward
    assert fai._wrapped_flash_attn_varlen_backward is fai._flash_attn_varlen_backward
    out, lse, _, rng = fai._wrapped_flash_attn_forward(q, k, v, 0.0, 0.2, False, -1, -1, 0.0, None,
                                                       False)
    dv = poisoned_like(v)
    fai._wrapped_flash_attn_backward(torch.ones_like(out), q, k, v, out, lse, None, None, dv, 0.0,
                                     0.2, False, -1, -1, 0.0, None, False, rng)
    assert torch.isfinite(dv).all(), "dv not written when dq and dk are None"


def test_internal_dropout_reproduces_its_mask_from_rng_state():
    """The forward's rng_state regenerates its mask in the backward: S_dmask's sign gives the
    mask, the output and the gradients equal the float64 attention with that mask, and
    torch.manual_seed reproduces the state."""
    seed = fresh_seed()
    p_drop = 0.3
    q, k, v = problem(torch.float32)
    torch.manual_seed(seed)
    out, lse, s_dmask, rng_state = fai._flash_attn_forward(q, k, v, p_drop, 0.25, True, -1, -1,
                                                           0.0, None, True)
    torch.manual_seed(seed)
    out2, _, _, rng_state2 = fai._flash_attn_forward(q, k, v, p_drop, 0.25, True, -1, -1, 0.0,
                                                     None, False)
    assert torch.equal(rng_state, rng_state2) and torch.equal(out, out2), seed
    assert rng_state.any(), "a dropout call returned an empty rng_state"
    assert s_dmask.shape == (2, 4, 37, 45)
    keep = (s_dmask >= 0).double()
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = torch.stack([attention64(q64[i], k64[i], v64[i], True, 0.25, mask=keep[i], p_drop=p_drop)
                       for i in range(2)])
    assert (out.double() - ref).abs().max().item() <= 1e-4, seed
    dout = torch.randn_like(out)
    ref.backward(dout.double())
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    fai._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, p_drop, 0.25, True, -1, -1, 0.0,
                             None, False, rng_state)
    for name, got, want in (("dq", dq, q64.grad), ("dk", dk, k64.grad), ("dv", dv, v64.grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= 1e-4 * (want.abs().max().item() + 1), "%s: %g (seed %d)" % (name, err, seed)
    assert 0 < keep.mean().item() < 1 and kept_rate(p_drop) < 1
    with pytest.raises(ValueError, match="rng_state"):
        fai._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, p_drop, 0.25, True, -1, -1,
                                 0.0, None, False, None)


def test_internal_varlen_equal_the_public_functions():
    seed = fresh_seed()
    cu = torch.tensor([0, 13, 13, 40], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 20, 51], dtype=torch.int32)
    q, k, v = torch.randn(40, 4, 16), torch.randn(51, 2, 16), torch.randn(51, 2, 16)
    args = (cu, cu_k, 27, 31, 0.0, 0.25, True)
    out, lse, s_dmask, rng_state = fai._flash_attn_varlen_forward(q, k, v, *args)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want, want_lse, _ = flashattn.flash_attn_varlen_func(*leaves, cu, cu_k, 27, 31, softmax_scale=0.25,
                                                         causal=True, deterministic=True,
                                                         return_attn_probs=True)
    assert torch.equal(out, want.detach()) and torch.equal(lse, want_lse), seed
    assert lse.shape == (4, 40) and s_dmask.shape == (0,)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(want, leaves, dout)
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    softmax_d = fai._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu, cu_k, 27, 31,
                                                0.0, 0.25, True, -1, -1, 0.0, None, True, rng_state)
    for name, got, ref in (("dq", dq, grads[0]), ("dk", dk, grads[1]), ("dv", dv, grads[2])):
        assert torch.equal(got, ref), "%s differs from autograd's (seed %d)" % (name, seed)
    assert softmax_d.shape == (4, 40 + 128 * 3)
    d = (dout.double() * out.double()).sum(-1).t()
    assert torch.allclose(softmax_d[:, :40].double(), d, rtol=1e-5, atol=1e-5), seed


def test_internal_rejections():
    fresh_seed()
    q, k, v = problem(torch.float32, b=1, sq=4, sk=4)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    flat = [t[0] for t in (q, k, v)]
    with pytest.raises(NotImplementedError, match="leftpad_k"):
        fai._flash_attn_varlen_forward(*flat, cu, cu, 4, 4, 0.0, 0.5, False, leftpad_k=cu[:1])
    with pytest.raises(NotImplementedError, match="seqused_k"):
        fai._flash_attn_varlen_forward(*flat, cu, cu, 4, 4, 0.0, 0.5, False, seqused_k=cu[:1])
    with pytest.raises(TypeError, match="torch tensors"):
        fai._flash_attn_forward(q.numpy(), k.numpy(), v.numpy(), 0.0, 0.5, False)
    out, lse, _, rng = fai._flash_attn_forward(q, k, v, 0.0, 0.5, False)
    with pytest.raises(ValueError, match="dq has shape"):
        fai._flash_attn_backward(out, q, k, v, out, lse, torch.empty(1, 4, 4, 3), None, None, 0.0,
                                 0.5, False, -1, -1, 0.0, None, False, rng)
    assert math.isfinite(float(lse.sum()))
