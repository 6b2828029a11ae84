"""Programmable attention from PyTorch (CPU): flash_attn_func / flash_attn_varlen_func with
attn_bias (out and every gradient, the bias's reduced to its broadcast shape, against float64
autograd of plain attention), flex_attention with torch's BlockMask (create_block_mask) and with
the BlockSparseMask constructors against the same mask applied densely, and the rejections
(the CUDA runs of the same calls: test_gpu.py). Runs where torch is importable (torch >= 2.5 for flex_attention)."""

import zlib

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402

flex = pytest.importorskip("torch.nn.attention.flex_attention")


def seeded(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def dense_attention(q, k, v, bias=None, mask=None, causal=False, scale=None):
    """float64 attention on [batch, seq, heads, dim] with GQA, an additive bias [b, h, sq, sk]
    (broadcast) and a boolean mask [.., sq, sk]; fully masked rows give 0."""
    qq, kk, vv = (t.transpose(1, 2) for t in (q, k, v))
    group = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
    s = qq @ kk.transpose(-1, -2) * (scale if scale is not None else qq.shape[-1] ** -0.5)
    if bias is not None:
        s = s + bias
    sq, sk = s.shape[-2], s.shape[-1]
    if causal:
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(sk).unsqueeze(0)
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    return (p @ vv).transpose(1, 2)


def tol(dtype):
    return {torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 6e-2}[dtype]


BIAS_SHAPES = {
    "full": lambda b, h, sq, sk: (b, h, sq, sk),
    "per_head": lambda b, h, sq, sk: (h, sq, sk),
    "key_padding": lambda b, h, sq, sk: (b, 1, 1, sk),
    "per_row": lambda b, h, sq, sk: (b, h, sq, 1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape_name", list(BIAS_SHAPES))
def test_attn_bias_forward_backward(dtype, shape_name):
    seeded(shape_name + str(dtype))
    b, sq, sk, hq, hkv, d = 2, 37, 53, 4, 2, 24
    q = torch.randn(b, sq, hq, d).to(dtype).requires_grad_()
    k = torch.randn(b, sk, hkv, d).to(dtype).requires_grad_()
    v = torch.randn(b, sk, hkv, d).to(dtype).requires_grad_()
    bias = torch.randn(BIAS_SHAPES[shape_name](b, hq, sq, sk))
    if shape_name == "key_padding":
        bias = torch.where(torch.rand(bias.shape) < 0.3, float("-inf"), 0.0)
    bias = bias.to(dtype).requires_grad_()
    out = flashattn.flash_attn_func(q, k, v, causal=True, attn_bias=bias)
    dout = torch.randn(out.shape).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
    ref = dense_attention(*leaves[:3], bias=leaves[3], causal=True)
    ref_grads = torch.autograd.grad(ref, leaves, dout.double())
    scale = lambda t: max(t.abs().max().item(), 1.0)  # noqa: E731
    assert (out.double() - ref).abs().max().item() <= tol(dtype) * scale(ref)
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
        assert g.shape == r.shape and g.dtype == dtype, name
        err = (g.double() - torch.nan_to_num(r)).abs().max().item()
        assert err <= 4 * tol(dtype) * scale(r), (name, err)


def test_attn_bias_varlen_and_no_grad():
    seeded("varlen")
    lens = [5, 0, 17, 9]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    total, h, d, mx = sum(lens), 3, 16, max(lens)
    q, k, v = (torch.randn(total, h, d, requires_grad=True) for _ in range(3))
    bias = torch.randn(len(lens), h, mx, mx, requires_grad=True)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=True, attn_bias=bias)
    out.sum().backward()
    for b, n in enumerate(lens):
        if n == 0:
            continue
        s = slice(int(cu[b]), int(cu[b + 1]))
        ref = dense_attention(q[s].unsqueeze(0).double(), k[s].unsqueeze(0).double(),
                              v[s].unsqueeze(0).double(), bias=bias[b:b + 1, :, :n, :n].double(),
                              causal=True)
        assert (out[s].double() - ref[0]).abs().max().item() < 1e-5
    assert bias.grad is not None and bias.grad.shape == bias.shape
    assert bias.grad[1].abs().max().item() == 0.0  # the empty sequence has no gradient
    with torch.no_grad():
        again = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=True,
                                                 attn_bias=bias)
    assert torch.equal(again, out.detach())


def test_flex_attention_torch_block_mask():
    seeded("flex")
    b, h, s, d = 2, 2, 160, 32
    doc = torch.randint(0, 3, (s,)).sort().values

    def mask_mod(bi, hi, qi, ki):
        return (qi >= ki) & (doc[qi] == doc[ki]) & ((qi - ki) < 60)

    block_mask = flex.create_block_mask(mask_mod, b, h, s, s, device="cpu", BLOCK_SIZE=32)
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    out = flashattn.flex_attention(q, k, v, block_mask=block_mask)
    dense = flex.create_mask(mask_mod, b, h, s, s, device="cpu")
    qt, kt, vt = (t.transpose(1, 2).double() for t in (q, k, v))
    ref = dense_attention(qt, kt, vt, mask=dense).transpose(1, 2)
    assert (out.double() - ref).abs().max().item() < 1e-5
    dout = torch.randn(out.shape)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    for g, r in zip(grads, ref_grads):
        assert (g.double() - r).abs().max().item() < 1e-4


def test_flex_attention_torch_block_mask_converted_once(monkeypatch):
    """A torch BlockMask is converted once and the conversion reused while its lists, mask_mod
    and the lengths are unchanged; an in-place edit of a list, or another length, converts again."""
    seeded("flex once")
    s, d = 96, 16
    block_mask = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, s, s, device="cpu",
                                        BLOCK_SIZE=32)
    conversions = []
    real = flashattn.BlockSparseMask.from_torch

    def counting(bm, *args):
        conversions.append(args)
        return real(bm, *args)
    monkeypatch.setattr(flashattn.BlockSparseMask, "from_torch", staticmethod(counting))
    q, k, v = (torch.randn(1, 2, s, d) for _ in range(3))
    first = flashattn.flex_attention(q, k, v, block_mask=block_mask)
    again = flashattn.flex_attention(q, k, v, block_mask=block_mask)
    assert len(conversions) == 1 and torch.equal(first, again)
    ref = flashattn.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True).transpose(1, 2)
    assert (first - ref).abs().max().item() < 1e-5
    block_mask.kv_num_blocks.add_(0)  # an in-place edit: converted again
    flashattn.flex_attention(q, k, v, block_mask=block_mask)
    flashattn.flex_attention(q[:, :, :80], k, v, block_mask=block_mask)  # other lengths
    assert len(conversions) == 3


def test_flex_attention_additive_score_mod():
    """An additive score_mod (relative positions, per-head ALiBi slopes that require grad, a -inf
    mask) with a torch BlockMask: out and every gradient, the slopes' included, against float64
    attention with the same bias; the evaluated bias has only the axes score_mod reads."""
    seeded("score_mod")
    b, h, sq, sk, d = 2, 3, 70, 96, 16
    slopes = torch.tensor([0.5, 0.25, 0.125], requires_grad=True)

    def score_mod(score, bi, hi, qi, ki):
        rel = (qi - ki).float()
        return torch.where(ki % 7 == 3, float("-inf"), score + 0.1 * rel - slopes[hi] * rel.abs())

    def mask_mod(bi, hi, qi, ki):
        return qi + 40 >= ki

    assert flashattn._mods_impl._score_mod_bias(score_mod, b, h, sq, sk, "cpu").shape == (1, h, sq, sk)
    block_mask = flex.create_block_mask(mask_mod, b, h, sq, sk, device="cpu", BLOCK_SIZE=32)
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for n in (sq, sk, sk))
    out = flashattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    qi, ki = torch.arange(sq).view(-1, 1), torch.arange(sk).view(1, -1)
    rel = (qi - ki).double()
    bias = torch.where(ki % 7 == 3, float("-inf"), 0.1 * rel - slopes.double().view(-1, 1, 1) * rel.abs())
    dense = flex.create_mask(mask_mod, b, h, sq, sk, device="cpu")
    qt, kt, vt = (t.transpose(1, 2).double() for t in (q, k, v))
    ref = dense_attention(qt, kt, vt, bias=bias, mask=dense).transpose(1, 2)
    assert (out.double() - ref).abs().max().item() < 1e-5
    dout = torch.randn(out.shape)
    grads = torch.autograd.grad(out, (q, k, v, slopes), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v, slopes), dout.double())
    for g, r in zip(grads, ref_grads):
        assert (g.double() - r).abs().max().item() < 1e-4 * max(1.0, r.abs().max().item())


def test_flex_attention_score_mod_not_additive():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="not additive"):
        flashattn.flex_attention(q, q, q, score_mod=lambda s, bi, hi, qi, ki: 20 * torch.tanh(s / 20))
    with pytest.raises(NotImplementedError, match="not additive"):  # per-element Python control flow
        flashattn.flex_attention(q, q, q, score_mod=lambda s, bi, hi, qi, ki: s if qi > ki else s + 1)


@pytest.mark.parametrize("name", ["causal", "window", "document", "prefix_lm"])
def test_block_mask_constructors(name):
    seeded(name)
    s, d = 203, 16
    doc = torch.randint(0, 4, (s,)).sort().values
    i = torch.arange(s).unsqueeze(1)
    j = torch.arange(s).unsqueeze(0)
    if name == "causal":
        mask, dense = flashattn.causal_block_mask(s, block_size=32), i >= j
    elif name == "window":
        mask = flashattn.sliding_window_block_mask(s, s, (40, 7), block_size=(16, 48))
        dense = (j >= i - 40) & (j <= i + 7)
    elif name == "document":
        mask = flashattn.document_block_mask(doc, block_size=24)
        dense = (i >= j) & (doc.unsqueeze(1) == doc.unsqueeze(0))
    else:
        mask = flashattn.prefix_lm_block_mask(s, 70, block_size=64)
        dense = (j < 70) | (j <= i)
    q, k, v = (torch.randn(1, 3, s, d) for _ in range(3))
    out = flashattn.flex_attention(q, k, v, block_mask=mask)
    qt, kt, vt = (t.transpose(1, 2).double() for t in (q, k, v))
    ref = dense_attention(qt, kt, vt, mask=dense).transpose(1, 2)
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_window_block_masks_take_the_native_kernels():
    """causal_block_mask / sliding_window_block_mask run the native causal / window path (same
    output as flash_attn_func's), and the block-list path gives the same result."""
    seeded("native window")
    s, d = 150, 16
    q, k, v = (torch.randn(1, 2, s, d) for _ in range(3))
    for make, kw in ((lambda: flashattn.causal_block_mask(s, block_size=32), {"causal": True}),
                     (lambda: flashattn.sliding_window_block_mask(s, s, (40, 7), block_size=32),
                      {"window_size": (40, 7)})):
        native = flashattn.flex_attention(q, k, v, block_mask=make())
        lists = make()
        lists._window_only = False  # the same mask through the block lists
        via_lists = flashattn.flex_attention(q, k, v, block_mask=lists)
        ref = flashattn.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), **kw).transpose(1, 2)
        assert (native - ref).abs().max().item() < 1e-6
        assert (via_lists - ref).abs().max().item() < 1e-5
    doc = torch.tensor([0] * 40 + [1] * 3 + [2] * 70 + [5] * 37)  # 150 ids, 4 documents
    for ids, b in ((doc, 1), (torch.stack([doc, doc.roll(17).sort().values]), 2)):
        qb, kb, vb = (torch.randn(b, 2, s, d, requires_grad=True) for _ in range(3))
        reused = flashattn.document_block_mask(ids, block_size=32)
        native = flashattn.flex_attention(qb, kb, vb, block_mask=reused)
        again = flashattn.flex_attention(qb, kb, vb, block_mask=reused)  # the packing computed once
        assert len(reused._document_packing) == 1 and torch.equal(native, again)
        lists = flashattn.document_block_mask(ids, block_size=32)
        lists._documents_only = False  # the same mask through the block lists and the id compares
        via_lists = flashattn.flex_attention(qb, kb, vb, block_mask=lists)
        assert (native - via_lists).abs().max().item() < 1e-5
        g_native = torch.autograd.grad(native.sum(), (qb, kb, vb))
        g_lists = torch.autograd.grad(via_lists.sum(), (qb, kb, vb))
        for x, y in zip(g_native, g_lists):
            assert (x - y).abs().max().item() < 1e-4
    edited = flashattn.causal_block_mask(s, block_size=32)
    edited.full_kv_num_blocks = edited.full_kv_num_blocks.clone()
    edited.full_kv_num_blocks[..., -1] -= 1  # the last query block loses its last full key block
    edited._window_only = False  # what a caller's edit means: not the window any more
    out = flashattn.flex_attention(q, k, v, block_mask=edited)
    ref = flashattn.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True).transpose(1, 2)
    assert (out - ref).abs().max().item() > 1e-3


@pytest.mark.parametrize("prefix", [0, 1, 70, 150, 400])
def test_prefix_lm_block_mask_takes_the_native_kernels(prefix):
    """prefix_lm_block_mask runs the native kernels on two sets of query rows; out, lse and every
    gradient equal the block-list path's (bits) and float64 attention with the dense mask (GQA)."""
    seeded("prefix lm %d" % prefix)
    s, d = 150, 16
    q = torch.randn(2, 4, s, d, requires_grad=True)
    k, v = (torch.randn(2, 2, s, d, requires_grad=True) for _ in range(2))
    native = flashattn.prefix_lm_block_mask(s, prefix, block_size=32)
    assert native._prefix_lm == prefix
    lists = flashattn.prefix_lm_block_mask(s, prefix, block_size=32)
    lists._prefix_lm = None  # the same mask through the block lists and the bits
    out, lse = flashattn.flex_attention(q, k, v, block_mask=native, enable_gqa=True, return_lse=True)
    out_l, lse_l = flashattn.flex_attention(q, k, v, block_mask=lists, enable_gqa=True,
                                            return_lse=True)
    i = torch.arange(s).unsqueeze(1)
    j = torch.arange(s).unsqueeze(0)
    qt, kt, vt = (t.detach().transpose(1, 2).double().requires_grad_() for t in (q, k, v))
    ref = dense_attention(qt, kt, vt, mask=(j < prefix) | (j <= i)).transpose(1, 2)
    assert (out.double() - ref).abs().max().item() < 1e-5
    assert (out - out_l).abs().max().item() < 1e-5
    assert (lse - lse_l).abs().max().item() < 1e-5
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    grads_l = torch.autograd.grad(out_l, (q, k, v), dout)
    grads_ref = torch.autograd.grad(ref, (qt, kt, vt), dout.double())
    for g, gl, gr in zip(grads, grads_l, grads_ref):
        assert (g - gl).abs().max().item() < 1e-4
        assert (g.double() - gr.transpose(1, 2)).abs().max().item() < 1e-4
    with torch.no_grad():  # the forward without autograd
        assert torch.equal(flashattn.flex_attention(q, k, v, block_mask=native, enable_gqa=True), out)


def test_block_lists_remembered_once_accepted(monkeypatch):
    """A BlockSparseMask whose lists a call accepted tells the next calls so
    (block_lists_checked = 1: CUDA then skips its host synchronisation); an in-place edit of a
    list or a new list tensor makes the next call check again. Outputs are the same either way."""
    from flashattn import _mods_impl
    seeded("lists remembered")
    s, d = 150, 16
    q, k, v = (torch.randn(1, 2, s, d, requires_grad=True) for _ in range(3))
    mask = flashattn.causal_block_mask(s, block_size=32)
    mask._window_only = False  # through the block lists
    seen = []
    for name in ("forward", "backward"):
        real = getattr(_mods_impl._lib, name)

        def record(p, ws, real=real, name=name):
            seen.append((name, p.block_lists_checked))
            return real(p, ws)
        monkeypatch.setattr(_mods_impl._lib, name, record)
    first = flashattn.flex_attention(q, k, v, block_mask=mask)
    grads = torch.autograd.grad(first.sum(), (q, k, v))
    again = flashattn.flex_attention(q, k, v, block_mask=mask)
    grads_again = torch.autograd.grad(again.sum(), (q, k, v))
    assert seen == [("forward", 0), ("backward", 1), ("forward", 1), ("backward", 1)]
    assert torch.equal(first, again) and all(torch.equal(x, y) for x, y in zip(grads, grads_again))
    seen.clear()
    mask.kv_indices[..., 0] += 0  # an in-place edit (the version moves)
    flashattn.flex_attention(q.detach(), k.detach(), v.detach(), block_mask=mask)
    mask.full_kv_indices = mask.full_kv_indices.clone()  # a new list tensor
    flashattn.flex_attention(q.detach(), k.detach(), v.detach(), block_mask=mask)
    flashattn.flex_attention(q.detach(), k.detach(), v.detach(), block_mask=mask)
    flashattn.flex_attention(q[:, :, :140].detach(), k.detach(), v.detach(), block_mask=mask)  # other geometry
    assert seen == [("forward", 0), ("forward", 0), ("forward", 1), ("forward", 0)]


def test_rejections():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match="attn_bias"):
        flashattn.flash_attn_func(q, q, q, attn_bias=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="broadcast"):
        flashattn.flash_attn_func(q, q, q, attn_bias=torch.zeros(3, 8, 8))
    with pytest.raises(NotImplementedError, match="score_mod"):
        flashattn.flex_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2),
                                 score_mod=lambda s, b, h, i, j: 2 * s)
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn.flash_attn_func(q, q, q, dropout_p=0.1, attn_bias=torch.zeros(8, 8))
