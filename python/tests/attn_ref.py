"""Reference attention for the tests, written independently of the library.

- `np_attention`: float64 NumPy forward and backward (explicit formulas), or, with `rnd`, the
  "plain attention in the input dtype" baseline: fp32-or-better math with rounding to the dtype
  where PyTorch rounds (scores, P, outputs, and every gradient matmul).
- `torch_attention`: the same attention as differentiable torch ops, computed in float64 (the
  reference, gradients by autograd) or in the input dtype with an fp32 softmax (the baseline).
- `check_rule`: FlashAttention's rule, max|ours - ref| <= mult * max|baseline - ref| + floor.
"""

import math

import numpy as np

# ---- rounding -------------------------------------------------------------------------------


def round_f32(x):
    return np.asarray(x, np.float32).astype(np.float64)


def round_f16(x):
    return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)


def round_bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


ROUNDERS = {"float32": round_f32, "float16": round_f16, "bfloat16": round_bf16}
MANTISSA_BITS = {"float32": 23, "float16": 10, "bfloat16": 7}


def floor_for(dtype_name, ref_max):
    """Absolute floor of the tolerance: half a unit in the last place of the dtype at the
    reference's magnitude (fp32: 1e-5 relative, as accumulation orders differ)."""
    magnitude = ref_max + 0.3
    if dtype_name == "float32":
        return 1e-5 * magnitude
    return 2.0 ** (math.floor(math.log2(magnitude)) - MANTISSA_BITS[dtype_name] - 1)


# ---- NumPy reference --------------------------------------------------------------------------


def visible_mask(len_q, len_k, causal, window):
    left, right = window
    left = -1 if left is None or left < 0 else left
    right = -1 if right is None or right < 0 else right
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = np.arange(len_q)[:, None]
    j = np.arange(len_k)[None, :]
    diag = i + len_k - len_q
    vis = np.ones((len_q, len_k), bool)
    if left >= 0:
        vis &= j >= diag - left
    if right >= 0:
        vis &= j <= diag + right
    return vis


def _sequences(q, k, cu_q, cu_k):
    """[(b, q_rows slice or index, k_rows ...)] for batched (4-D) or varlen (3-D) tensors."""
    if cu_q is None:
        return [(b, (b, slice(None)), (b, slice(None))) for b in range(q.shape[0])]
    cu_q, cu_k = np.asarray(cu_q), np.asarray(cu_k)
    return [(b, (slice(int(cu_q[b]), int(cu_q[b + 1])),), (slice(int(cu_k[b]), int(cu_k[b + 1])),))
            for b in range(len(cu_q) - 1)]


def np_attention(q, k, v, cu_q=None, cu_k=None, scale=None, causal=False, window=(-1, -1),
                 softcap=0.0, alibi=None, sink=None, dout=None, rnd=None):
    """Returns dict with o, lse (library layouts) and, if dout is given, dq, dk, dv, dsink.
    Inputs are read as float64. rnd=None: exact float64; else the dtype baseline."""
    exact = rnd is None
    r = (lambda x: x) if exact else rnd
    q, k, v = (np.asarray(t).astype(np.float64) for t in (q, k, v))
    varlen = cu_q is not None
    hq, d = q.shape[-2], q.shape[-1]
    hkv, dv_dim = k.shape[-2], v.shape[-1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = np.zeros(q.shape[:-1] + (dv_dim,))
    if varlen:
        lse = np.zeros((hq, q.shape[0]))
    else:
        lse = np.zeros((q.shape[0], hq, q.shape[1]))
    grads = dout is not None
    if grads:
        dout = np.asarray(dout).astype(np.float64)
        dq, dk, dvv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        dsink = np.zeros(hq) if sink is not None else None
    alibi = None if alibi is None else np.asarray(alibi, np.float64)
    sink = None if sink is None else np.asarray(sink, np.float64)
    for b, qi, ki in _sequences(q, k, cu_q, cu_k):
        Qb, Kb, Vb = q[qi], k[ki], v[ki]  # [len, heads, dim]
        lq, lk = Qb.shape[0], Kb.shape[0]
        vis = visible_mask(lq, lk, causal, window)
        dist = np.abs(np.arange(lq)[:, None] + lk - lq - np.arange(lk)[None, :])
        for h in range(hq):
            hk = h // group
            Q, K, V = Qb[:, h], Kb[:, hk], Vb[:, hk]
            S = r(scale * (Q @ K.T))
            C = None
            if softcap > 0:
                C = r(softcap * np.tanh(S / softcap))
                S = C
            if alibi is not None:
                slope = alibi[h] if alibi.ndim == 1 else alibi[b, h]
                S = r(S - slope * dist)
            Sm = np.where(vis, S, -np.inf)
            cols = [Sm] + ([np.full((lq, 1), sink[h])] if sink is not None else [])
            ext = np.concatenate(cols, axis=1) if cols[1:] else Sm
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                m = ext.max(axis=1, initial=-np.inf) if ext.shape[1] else np.full(lq, -np.inf)
                m_safe = np.where(np.isfinite(m), m, 0.0)
                row_lse = np.log(np.exp(ext - m_safe[:, None]).sum(axis=1)) + m_safe
                P = np.where(vis, np.exp(Sm - row_lse[:, None]), 0.0)
            P = np.nan_to_num(P)
            Pr = P if exact else r(P)
            out = r(Pr @ V)
            if varlen:
                o[qi[0], h] = out
                lse[h, qi[0]] = row_lse
            else:
                o[b, :, h] = out
                lse[b, h] = row_lse
            if not grads:
                continue
            dO = dout[qi][:, h]
            Dr = (dO * out).sum(axis=1)
            dV = r(Pr.T @ dO)
            dP = r(dO @ V.T)
            dS = r(P * (dP - Dr[:, None]))
            if C is not None:
                dS = r(dS * (1.0 - (C / softcap) ** 2))
            dQ = r(scale * (dS @ K))
            dK = r(scale * (dS.T @ Q))
            if varlen:
                dq[qi[0], h] = dQ
                dk[ki[0], hk] += dK
                dvv[ki[0], hk] += dV
            else:
                dq[b, :, h] = dQ
                dk[b, :, hk] += dK
                dvv[b, :, hk] += dV
            if sink is not None:
                with np.errstate(invalid="ignore"):
                    w = np.where(np.isfinite(row_lse), np.exp(sink[h] - row_lse), 0.0)
                dsink[h] -= (w * Dr).sum()
    result = {"o": o, "lse": lse}
    if grads:
        if not exact:
            dk, dvv = r(dk), r(dvv)
        result.update(dq=dq, dk=dk, dv=dvv, dsink=dsink)
    return result


# ---- torch reference -------------------------------------------------------------------------


def torch_attention(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                    sink=None, cu_q=None, cu_k=None, upcast=True):
    """Differentiable attention. upcast=True: float64 reference; False: in q's dtype with an fp32
    softmax (PyTorch baseline). Returns (out in q's layout, lse)."""
    import torch

    if cu_q is not None:
        outs, lses = [], []
        cq, ck = cu_q.tolist(), cu_k.tolist()
        for b in range(len(cq) - 1):
            a = None
            if alibi is not None:
                a = alibi if alibi.dim() == 1 else alibi[b]
            ob, lb = torch_attention(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]],
                                     v[None, ck[b]:ck[b + 1]], scale, causal, window, softcap, a,
                                     sink, upcast=upcast)
            outs.append(ob[0])
            lses.append(lb[0])
        return torch.cat(outs, 0), torch.cat(lses, 1)

    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    lq, lk = q.shape[1], k.shape[1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k * scale)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    work = torch.float64 if upcast else torch.float32
    scores = scores.to(work)
    if alibi is not None:
        slopes = alibi.to(work)
        slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:, :, None, None]
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        dist = (i + lk - lq - j).abs().to(work)
        scores = scores - slopes * dist
    vis = torch.from_numpy(visible_mask(lq, lk, causal, window)).to(q.device)
    scores = scores.masked_fill(~vis, float("-inf"))
    if sink is not None:
        col = sink.to(work)[None, :, None, None].expand(scores.shape[0], hq, lq, 1)
        scores = torch.cat([scores, col], dim=-1)
    dead = torch.isinf(scores).all(dim=-1, keepdim=True)
    safe = scores.masked_fill(dead, 0.0)
    lse = torch.logsumexp(safe, dim=-1).masked_fill(dead[..., 0], float("-inf"))
    probs = torch.softmax(safe, dim=-1).masked_fill(dead, 0.0)
    if sink is not None:
        probs = probs[..., :-1]
    probs = probs.to(torch.float64 if upcast else dtype)
    out = torch.einsum("bhij,bjhd->bihd", probs, v)
    return out, lse.float() if not upcast else lse


def quantised_e4m3(shape, descale, group, device="cpu"):
    """(float8_e4m3fn tensor, its dequantised bfloat16 values) of randn values with per-(batch,
    kv head) descales ((batch, kv heads); query heads use column h // group)."""
    import torch

    x = torch.randn(shape, device=device)
    scale = descale.repeat_interleave(group, dim=1)[:, None, :, None]  # (b, 1, heads, 1)
    x8 = (x / scale).to(torch.float8_e4m3fn)
    return x8, (x8.float() * scale).to(torch.bfloat16)


def attention_grads(q, k, v, dout, causal=False):
    """(float64 reference, q's-dtype baseline) gradients (dq, dk, dv) of torch_attention for dout."""
    import torch

    want = []
    for upcast in (True, False):
        leaves = [(t.double() if upcast else t).detach().requires_grad_() for t in (q, k, v)]
        o, _ = torch_attention(*leaves, causal=causal, upcast=upcast)
        want.append(torch.autograd.grad(o, leaves, dout.to(o.dtype)))
    return want


# ---- the rule ----------------------------------------------------------------------------------


def check_rule(name, ours, ref, base, dtype_name, mult=2.0):
    """Assert FlashAttention's rule; -inf entries of ref must be -inf in ours too."""
    ours = np.asarray(ours, np.float64)
    ref = np.asarray(ref, np.float64)
    base = np.asarray(base, np.float64)
    assert ours.shape == ref.shape, "%s: shape %s != %s" % (name, ours.shape, ref.shape)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(ours), finite), (
        "%s: non-finite entries differ from the reference (ours %d, ref %d)"
        % (name, int((~np.isfinite(ours)).sum()), int((~finite).sum())))
    assert np.array_equal(ours[~finite], ref[~finite]), "%s: infinities differ" % name
    if not finite.any():
        return
    err = np.abs(ours[finite] - ref[finite]).max()
    base_err = np.abs(base[finite] - ref[finite]).max()
    ref_max = np.abs(ref[finite]).max()
    tol = mult * base_err + floor_for(dtype_name, ref_max)
    assert err <= tol, ("%s: max error %.3g > %.3g = %g x baseline error %.3g + floor (max|ref| "
                        "%.3g)" % (name, err, tol, mult, base_err, ref_max))
