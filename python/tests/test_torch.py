"""PyTorch path on the CPU: autograd against float64 autograd of a reference attention
(FlashAttention's rule for out, lse, dq, dk, dv, dsink), every function, GQA, varlen, odd head
dims and lengths, strides passed without copies, the explicit backward."""

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from attn_ref import check_rule, torch_attention  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def seeded(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def rand(shape, dtype, offset=0.0, requires_grad=True):
    x = (torch.randn(shape) + offset).to(dtype)
    return x.requires_grad_(requires_grad)


def leaf64(x):
    return x.detach().double().requires_grad_(x.requires_grad)


def leaf_same(x):
    return x.detach().clone().requires_grad_(x.requires_grad)


def leaves(make, *tensors):
    return tuple(make(x) if x is not None else None for x in tensors)


def run_and_grad(fn, inputs, dout):
    """Outputs of fn(*inputs) and gradients of (out * dout).sum() for inputs needing grad."""
    out, lse = fn(*inputs)
    grads = torch.autograd.grad(out, [x for x in inputs if x is not None and x.requires_grad],
                                dout.to(out.dtype))
    return out, lse, grads


def npy(x):
    return x.detach().double().numpy()


def check_all(dtype_name, ours, ref, base, names):
    for name, a, r, b in zip(names, ours, ref, base):
        kind = "float32" if name in ("lse", "dsink") else dtype_name
        check_rule(name, npy(a), npy(r), npy(b), kind)


CONFIGS = [
    ("plain", 2, 113, 113, 2, 2, 64, 64, {}),
    ("causal_gqa_d59", 2, 7, 203, 4, 2, 59, 59, {"causal": True}),
    ("causal_sq_gt_sk", 1, 203, 113, 4, 1, 32, 32, {"causal": True}),
    ("window_softcap_d111", 2, 97, 128, 2, 2, 111, 111, {"window_size": (17, 5), "softcap": 5.0}),
    ("alibi_bh_causal", 2, 64, 80, 4, 2, 64, 64, {"causal": True, "alibi": "batch_head"}),
    ("sink_causal", 2, 50, 20, 4, 2, 32, 32, {"causal": True, "sink": True}),
    ("decode_d128", 2, 1, 147, 2, 1, 128, 128, {"causal": True, "alibi": "head"}),
    ("dv_ne_d", 1, 31, 45, 2, 2, 64, 32, {"softmax_scale": 0.3}),
]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_autograd_matches_reference(config, dtype_name):
    name, batch, sq, sk, hq, hkv, d, dv, opt = config
    seeded(name + dtype_name)
    dtype = DTYPES[dtype_name]
    q = rand((batch, sq, hq, d), dtype)
    k = rand((batch, sk, hkv, d), dtype)
    v = rand((batch, sk, hkv, dv), dtype, offset=0.5)
    alibi = None
    if opt.get("alibi") == "head":
        alibi = torch.rand(hq) * 0.4 + 0.05
    elif opt.get("alibi") == "batch_head":
        alibi = torch.rand(batch, hq) * 0.4 + 0.05
    sink = (torch.rand(hq) * 3 - 1).requires_grad_() if opt.get("sink") else None
    kw = dict(causal=opt.get("causal", False), window_size=opt.get("window_size", (-1, -1)),
              softcap=opt.get("softcap", 0.0))
    scale = opt.get("softmax_scale")
    dout = torch.randn(batch, sq, hq, dv)

    def ours(q, k, v, sink):
        out, lse, probs = flashattn.flash_attn_func(q, k, v, softmax_scale=scale,
                                                    alibi_slopes=alibi, return_attn_probs=True,
                                                    sink_logits=sink, **kw)
        assert probs is None
        return out, lse

    def reference(upcast):
        def fn(q, k, v, sink):
            return torch_attention(q, k, v, scale=scale, causal=kw["causal"],
                                   window=kw["window_size"], softcap=kw["softcap"], alibi=alibi,
                                   sink=sink, upcast=upcast)
        return fn

    names = ["out", "lse", "dq", "dk", "dv"] + (["dsink"] if sink is not None else [])
    o, lse, g = run_and_grad(ours, (q, k, v, sink), dout)
    assert o.dtype == dtype and o.shape == (batch, sq, hq, dv)
    assert lse.dtype == torch.float32 and lse.shape == (batch, hq, sq)
    ro, rl, rg = run_and_grad(reference(True), leaves(leaf64, q, k, v, sink), dout)
    bo, bl, bg = run_and_grad(reference(False), leaves(leaf_same, q, k, v, sink), dout)
    check_all(dtype_name, (o, lse) + tuple(g), (ro, rl) + tuple(rg), (bo, bl) + tuple(bg), names)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("features", ["causal_sink", "window_alibi_softcap"])
def test_varlen_autograd(features, dtype_name):
    seeded(features + dtype_name)
    dtype = DTYPES[dtype_name]
    lens_q, lens_k = [0, 7, 1, 60], [5, 0, 33, 64]
    batch, hq, hkv, d = 4, 4, 2, 40
    cu_q = torch.tensor([0] + np.cumsum(lens_q).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(lens_k).tolist(), dtype=torch.int32)
    q = rand((int(cu_q[-1]), hq, d), dtype)
    k = rand((int(cu_k[-1]), hkv, d), dtype)
    v = rand((int(cu_k[-1]), hkv, d), dtype, offset=0.5)
    sink, alibi, kw = None, None, {}
    if features == "causal_sink":
        sink = torch.randn(hq).requires_grad_()
        kw = dict(causal=True)
    else:
        alibi = torch.rand(batch, hq) * 0.3 + 0.05
        kw = dict(window_size=(9, 3), softcap=8.0)
    dout = torch.randn(q.shape[0], hq, d)

    def ours(q, k, v, sink):
        out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q),
                                                       max(lens_k), alibi_slopes=alibi,
                                                       return_attn_probs=True, sink_logits=sink,
                                                       **kw)
        return out, lse

    def reference(upcast):
        def fn(q, k, v, sink):
            return torch_attention(q, k, v, causal=kw.get("causal", False),
                                   window=kw.get("window_size", (-1, -1)),
                                   softcap=kw.get("softcap", 0.0), alibi=alibi, sink=sink,
                                   cu_q=cu_q, cu_k=cu_k, upcast=upcast)
        return fn

    names = ["out", "lse", "dq", "dk", "dv"] + (["dsink"] if sink is not None else [])
    o, lse, g = run_and_grad(ours, (q, k, v, sink), dout)
    assert lse.shape == (hq, q.shape[0])
    ro, rl, rg = run_and_grad(reference(True), leaves(leaf64, q, k, v, sink), dout)
    bo, bl, bg = run_and_grad(reference(False), leaves(leaf_same, q, k, v, sink), dout)
    check_all(dtype_name, (o, lse) + tuple(g), (ro, rl) + tuple(rg), (bo, bl) + tuple(bg), names)


def test_packed_functions_gradients():
    """qkvpacked / kvpacked / varlen packed: values and gradients reach the packed tensor."""
    seeded("packed")
    b, s, h, d = 2, 33, 2, 32
    dtype = torch.bfloat16
    qkv = rand((b, s, 3, h, d), dtype)
    dout = torch.randn(b, s, h, d)

    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    (g_packed,) = torch.autograd.grad(out, qkv, dout.to(dtype))
    q, k, v = (leaf_same(qkv[:, :, i]) for i in range(3))
    out2 = flashattn.flash_attn_func(q, k, v, causal=True)
    g2 = torch.autograd.grad(out2, (q, k, v), dout.to(dtype))
    torch.testing.assert_close(out, out2, rtol=0, atol=0)
    torch.testing.assert_close(g_packed, torch.stack(g2, dim=2), rtol=0, atol=0)

    qq = leaf_same(qkv[:, :, 0])
    kv = leaf_same(qkv[:, :, 1:])
    out3 = flashattn.flash_attn_kvpacked_func(qq, kv, causal=True)
    gq, gkv = torch.autograd.grad(out3, (qq, kv), dout.to(dtype))
    torch.testing.assert_close(out3, out2, rtol=0, atol=0)
    torch.testing.assert_close(gkv, torch.stack(g2[1:], dim=2), rtol=0, atol=0)

    cu = torch.tensor([0, 10, 10, 40, 66], dtype=torch.int32)
    packed = rand((66, 3, h, d), dtype)
    dout = torch.randn(66, h, d).to(dtype)
    out4 = flashattn.flash_attn_varlen_qkvpacked_func(packed, cu, 30, window_size=(4, 4))
    (gp,) = torch.autograd.grad(out4, packed, dout)
    q, k, v = (leaf_same(packed[:, i]) for i in range(3))
    out5 = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, window_size=(4, 4))
    g5 = torch.autograd.grad(out5, (q, k, v), dout)
    torch.testing.assert_close(out4, out5, rtol=0, atol=0)
    torch.testing.assert_close(gp, torch.stack(g5, dim=1), rtol=0, atol=0)
    kv = leaf_same(packed[:, 1:])
    out6 = flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 30, 30, window_size=(4, 4))
    torch.testing.assert_close(out6, out5, rtol=0, atol=0)


def test_strides_passed_without_copies(captured):
    seeded("strides")
    b, s, h, d = 2, 21, 4, 32
    big = torch.randn(b, s, 3, h, d)
    q = big[:, :, 0]
    k = torch.randn(b, h, s, d).transpose(1, 2)  # BHSD storage
    v = torch.randn(b, s, 2 * h, d)[:, :, ::2]
    out = flashattn.flash_attn_func(q, k, v)
    (_, p), = captured
    assert (p.q, p.k, p.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert (p.q_batch_stride, p.q_row_stride, p.q_head_stride) == q.stride()[:3]
    assert (p.k_batch_stride, p.k_row_stride, p.k_head_stride) == k.stride()[:3]
    assert p.v_head_stride == 2 * d
    ref, _ = torch_attention(q, k, v)
    base, _ = torch_attention(q, k, v, upcast=False)
    check_rule("out", npy(out), npy(ref), npy(base), "float32")


def test_noncontiguous_last_dim_copied(captured):
    seeded("lastdim")
    q = torch.randn(1, 9, 2, 16)
    k = torch.randn(1, 9, 16, 2).transpose(-1, -2)
    assert k.stride(-1) != 1
    out = flashattn.flash_attn_func(q, k, q)
    (_, p), = captured
    assert p.k != k.data_ptr() and p.k_head_stride == 16
    ref, _ = torch_attention(q, k, q)
    base, _ = torch_attention(q, k, q, upcast=False)
    check_rule("out", npy(out), npy(ref), npy(base), "float32")


def test_explicit_backward_matches_autograd():
    seeded("explicit")
    q = rand((2, 17, 4, 24), torch.float16)
    k = rand((2, 29, 2, 24), torch.float16)
    v = rand((2, 29, 2, 24), torch.float16)
    sink = torch.randn(4).requires_grad_()
    out, lse = flashattn.flash_attn_forward(q, k, v, causal=True, sink_logits=sink)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    explicit = flashattn.flash_attn_backward(dout, q.detach(), k.detach(), v.detach(),
                                             out.detach(), lse, causal=True,
                                             sink_logits=sink.detach())
    assert len(explicit) == 4
    for a, b in zip(grads, explicit):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    three = flashattn.flash_attn_backward(dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                          lse)
    assert len(three) == 3


def test_deterministic_backward_is_bitwise_reproducible():
    seeded("det")
    q = rand((2, 64, 4, 32), torch.bfloat16)
    k = rand((2, 64, 2, 32), torch.bfloat16)
    dout = torch.randn(2, 64, 4, 32).to(torch.bfloat16)
    runs = []
    for _ in range(2):
        out = flashattn.flash_attn_func(q, k, k, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k), dout))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_sink_logits_in_bf16_parameter_gets_grad():
    seeded("sinkbf16")
    q = rand((1, 8, 2, 16), torch.bfloat16)
    sink = torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_func(q, q, q, sink_logits=sink)
    out.float().sum().backward()
    assert sink.grad is not None and sink.grad.dtype == torch.bfloat16


def test_lse_is_not_differentiable_and_out_only_grad():
    seeded("lse")
    q = rand((1, 8, 2, 16), torch.float32)
    out, lse, _ = flashattn.flash_attn_func(q, q, q, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


def test_no_grad_inference_and_requires_grad_false():
    q = torch.randn(1, 5, 2, 8)
    with torch.no_grad():
        out = flashattn.flash_attn_func(q, q, q)
    assert not out.requires_grad
    out = flashattn.flash_attn_func(q, q, q)
    assert not out.requires_grad


def test_opcheck_custom_ops():
    """torch.library.opcheck: schema, fake tensor, autograd registration and
    torch.compile-readiness of flashattn::fwd / flashattn::bwd."""
    seeded("opcheck")
    q = torch.randn(2, 9, 4, 16, requires_grad=True)
    k = torch.randn(2, 11, 2, 16, requires_grad=True)
    v = torch.randn(2, 11, 2, 16, requires_grad=True)
    sink = torch.randn(4, requires_grad=True)
    args = (q, k, v, None, None, 0, 0, 0.25, True, -1, -1, 0.0, None, sink, False)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    bargs = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, None,
             None, 0, 0, 0.25, True, -1, -1, 0.0, None, sink.detach(), False)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, bargs)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    cuk = torch.tensor([0, 6, 11], dtype=torch.int32)
    vargs = (q.detach()[0].requires_grad_(), k.detach()[0].requires_grad_(),
             v.detach()[0].requires_grad_(), cu, cuk, 5, 6, 0.25, False, 3, 0, 0.0, None, None,
             False)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, vargs)


def test_alignment_error_retries_with_dense_copies(monkeypatch, captured):
    """When the device path reports FA_ERR_ALIGNMENT, the op reruns on dense copies."""
    import flashattn._lib as lib

    real_forward = lib.forward
    state = {"calls": 0}

    def picky_forward(params, alloc=None):
        state["calls"] += 1
        if state["calls"] == 1:
            raise lib.FlashAttnValueError("flashattn: fa_forward failed (FA_ERR_ALIGNMENT): q",
                                          lib.FA_ERR_ALIGNMENT)
        return real_forward(params, alloc)

    monkeypatch.setattr(lib, "forward", picky_forward)
    base = torch.randn(1, 9, 2, 17)
    q = base[..., 1:]  # offset by one element
    out = flashattn.flash_attn_func(q, q, q)
    assert state["calls"] == 2
    expected = flashattn.flash_attn_func(q.contiguous(), q.contiguous(), q.contiguous())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_caller_workspace_from_the_allocator_hook(monkeypatch):
    """CUDA calls take the library's scratch from PyTorch's caching allocator (_workspace_alloc,
    fa_check_* gives the size) instead of cudaMallocAsync per call. The same hook driven on the CPU:
    the sizes asked are the ones fa_check_* reports, and out, lse and the gradients are bitwise the
    ones of the library's own allocation; the kv-cache call goes through it too."""
    from flashattn import _torch_impl as ti

    seeded("workspace-hook")
    q = rand((2, 113, 4, 64), torch.float32, 0.3)
    k = rand((2, 203, 2, 64), torch.float32, -0.2)
    v = rand((2, 203, 2, 64), torch.float32, 0.5)
    dout = torch.randn(2, 113, 4, 64)

    def run():
        out, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2]
        grads = torch.autograd.grad(out, (q, k, v), dout)
        return [out.detach(), lse.detach()] + list(grads)

    own = run()
    asked = []

    def hook(t):
        def alloc(nbytes):
            asked.append(nbytes)
            buf = torch.full((nbytes + 256,), 0xA5, dtype=torch.uint8)  # poisoned, 256-aligned view
            return buf, (buf.data_ptr() + 255) // 256 * 256
        return alloc

    monkeypatch.setattr(ti, "_workspace_alloc", hook)
    hooked = run()
    assert len(asked) == 2 and all(n > 0 for n in asked), asked
    for a, b in zip(own, hooked):
        assert torch.equal(a, b)
    kc = torch.randn(2, 64, 2, 64)
    vc = torch.randn(2, 64, 2, 64) + 0.5
    qd = torch.randn(2, 1, 4, 64)
    seqlens = torch.tensor([17, 64], dtype=torch.int32)
    before = len(asked)
    o_hooked = flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, num_splits=3)
    monkeypatch.undo()
    o_own = flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, num_splits=3)
    assert torch.equal(o_hooked, o_own)
    assert len(asked) == before + 1 and asked[-1] > 0, asked  # split-KV partial states


class NoPlans:
    """Stands in for a _core.PlanCache that never holds a plan: every call takes the uncached
    path (all checks, each FaParams built from scratch)."""

    def get(self, key):
        return None

    def put(self, key, plan):
        pass


def test_plan_caches_are_keyed_by_signature(monkeypatch):
    """The eager calls keep plans per call signature (attention()'s checks, each op body's
    FaParams) and on a hit only patch the data pointers: every call of a sequence that hits plans
    (other shapes and options in between) gives bitwise the outputs and gradients of the same
    call with no plans, and an option change gets its own plan and its own answer."""
    from flashattn import _torch_impl as ti

    def problem(seed, batch=2, hkv=2):
        seeded("plans-%d" % seed)
        q = rand((batch, 33, 4, 32), torch.float32, 0.2)
        k = rand((batch, 47, hkv, 32), torch.float32, -0.1)
        v = rand((batch, 47, hkv, 32), torch.float32, 0.5)
        extra = {"alibi_slopes": torch.rand(4) * 0.3,
                 "sink_logits": torch.randn(4).requires_grad_()}
        return q, k, v, torch.randn(batch, 33, 4, 32), extra

    def varlen_problem(seed, lens_q, lens_k):
        seeded("plans-varlen-%d" % seed)
        q = rand((sum(lens_q), 4, 32), torch.float32)
        k = rand((sum(lens_k), 2, 32), torch.float32)
        v = rand((sum(lens_k), 2, 32), torch.float32, 0.5)
        cu = [torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)
              for lens in (lens_q, lens_k)]
        return q, k, v, torch.randn(sum(lens_q), 4, 32), {"cu": cu}

    def run(prob, **options):
        q, k, v, dout, extra = prob
        kw = {name: extra[name] for name in ("alibi_slopes", "sink_logits")
              if options.pop(name, False)}
        if "cu" in extra:
            out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, *extra["cu"], 30, 30,
                                                           return_attn_probs=True, **options)
        else:
            out, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True,
                                                    **options, **kw)
        leaves = [q, k, v] + ([kw["sink_logits"]] if "sink_logits" in kw else [])
        return [out.detach(), lse] + list(torch.autograd.grad(out, leaves, dout))

    a1, a2, b = problem(1), problem(2), problem(3, batch=1, hkv=4)
    v1 = varlen_problem(1, [5, 20, 8], [30, 0, 17])
    v2 = varlen_problem(2, [11, 11, 11], [7, 25, 15])  # the same totals, other cu_seqlens
    window = {"causal": True, "window_size": (7, 3)}
    sequence = [
        (a1, {"causal": True}), (b, {"causal": True}), (a1, {}), (a1, window),
        (a1, {"alibi_slopes": True, "softcap": 3.0}), (a1, {"sink_logits": True}),
        (v1, {"causal": True}), (a2, {"causal": True}), (a2, {}), (a2, window),
        (a2, {"alibi_slopes": True, "softcap": 3.0}), (a2, {"sink_logits": True}),
        (v2, {"causal": True}), (b, {"causal": True}),
        (a2, {"causal": True, "deterministic": True}),
        (a2, {"alibi_slopes": True, "softcap": 1.0}), (a2, {"causal": True, "softmax_scale": 0.3}),
    ]
    for plans in (ti._checked, ti._fwd_plans, ti._bwd_plans):
        plans.clear()
    cached = [run(prob, **dict(o)) for prob, o in sequence]
    # a1 x 5 options, b, v1, another softcap, a scale; deterministic: the forward's plan, its
    # own backward plan
    assert (len(ti._checked), len(ti._fwd_plans), len(ti._bwd_plans)) == (10, 9, 10)
    for name in ("_checked", "_fwd_plans", "_bwd_plans"):
        monkeypatch.setattr(ti, name, NoPlans())
    fresh = [run(prob, **dict(o)) for prob, o in sequence]
    for (prob, o), got, want in zip(sequence, cached, fresh):
        assert len(got) == len(want)
        for x, y in zip(got, want):
            assert torch.equal(x, y), "differs for options %s" % o
    # the options that share a problem give different answers (so the check above can tell)
    outs = [got[0] for (prob, o), got in zip(sequence, cached) if prob is a2 and
            "deterministic" not in o]
    assert len(outs) == 7
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            assert not torch.equal(outs[i], outs[j])
    assert not torch.equal(cached[0][0], cached[7][0])
    assert not torch.equal(cached[6][0], cached[12][0])


def test_remembered_workspace_size_is_asked_again_when_short(monkeypatch):
    """A plan remembers the workspace size fa_check_* gave for its signature (asked once, not per
    call); should the library want more later (an environment switch that changes a kernel's
    plan), the call asks fa_check_* again and succeeds instead of failing with FA_ERR_WORKSPACE."""
    from flashattn import _kvcache
    from flashattn import _torch_impl as ti

    asked = []

    def hook(t):
        def alloc(nbytes):
            asked.append(nbytes)
            buf = torch.full((nbytes + 256,), 0xA5, dtype=torch.uint8)  # 256-aligned view
            return buf, (buf.data_ptr() + 255) // 256 * 256
        return alloc

    monkeypatch.setattr(ti, "_workspace_alloc", hook)
    seeded("stale-workspace")
    kc, vc = torch.randn(2, 64, 2, 64), torch.randn(2, 64, 2, 64) + 0.5
    q = torch.randn(2, 1, 4, 64)
    seqlens = torch.tensor([17, 64], dtype=torch.int32)
    _kvcache._plans.clear()
    first = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=3)
    second = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=3)
    (plan,) = list(_kvcache._plans._plans.values())
    need = plan.workspace_bytes
    assert need > 0 and asked == [need, need]
    plan.workspace_bytes = 8  # stale: less than the library wants
    third = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=3)
    assert asked == [need, need, 8, need] and plan.workspace_bytes == need
    assert torch.equal(first, second) and torch.equal(first, third)


def test_plan_keeps_the_thread_count_of_its_key(monkeypatch):
    """A plan's FaParams carries the thread count of its key, even when set_num_threads runs (in
    another thread) between the key and the FaParams of the call that makes the plan: the later
    calls that hit the plan run with the key's count."""
    from flashattn import _core, _kvcache, _lib
    from flashattn import _torch_impl as ti

    seen = []

    def recording(fn):
        def call(params, alloc=None):
            seen.append(params.num_threads)
            return fn(params, alloc)
        return call

    for name in ("forward", "backward", "kvcache_forward"):
        monkeypatch.setattr(_lib, name, recording(getattr(_lib, name)))
    real_make_params = _core.make_params

    def make_params_racing(*args, **kwargs):
        flashattn.set_num_threads(1)  # another thread, between this call's key and its FaParams
        try:
            return real_make_params(*args, **kwargs)
        finally:
            flashattn.set_num_threads(2)

    monkeypatch.setattr(_core, "_num_threads", 2)
    for plans in (ti._checked, ti._fwd_plans, ti._bwd_plans, _kvcache._plans):
        plans.clear()
    seeded("thread-race")
    q, k, v = (rand((1, 9, 2, 16), torch.float32) for _ in range(3))
    kc, vc = torch.randn(1, 16, 2, 16), torch.randn(1, 16, 2, 16)

    def forward_backward():
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        torch.autograd.grad(out.sum(), (q, k, v))

    def decode():
        flashattn.flash_attn_with_kvcache(q[:, :1].detach(), kc, vc, cache_seqlens=5)

    for call, calls in ((forward_backward, 2), (decode, 1)):
        monkeypatch.setattr(_core, "make_params", make_params_racing)
        call()  # misses: the plans are made
        monkeypatch.setattr(_core, "make_params", real_make_params)
        del seen[:]
        call()  # hits
        assert seen == [2] * calls, seen
