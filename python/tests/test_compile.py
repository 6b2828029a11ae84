"""torch.compile(fullgraph=True) over the flashattn functions on the CPU: no graph break, same
values and gradients as eager."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn.bert_padding import pad_input, unpad_input  # noqa: E402


def block(x, wq, wk, wv, sink):
    """A tiny attention block: projections, GQA flash attention with a sink, residual."""
    b, s, _ = x.shape
    q = (x @ wq).view(b, s, 4, 16)
    k = (x @ wk).view(b, s, 2, 16)
    v = (x @ wv).view(b, s, 2, 16)
    out = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(8, 0), softcap=20.0,
                                    sink_logits=sink)
    return x + out.reshape(b, s, 64)


def make_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(2, 24, 64, dtype=dtype, requires_grad=True)
    wq = (torch.randn(64, 64) * 0.1).to(dtype).requires_grad_()
    wk = (torch.randn(64, 32) * 0.1).to(dtype).requires_grad_()
    wv = (torch.randn(64, 32) * 0.1).to(dtype).requires_grad_()
    sink = torch.zeros(4, requires_grad=True)
    return x, wq, wk, wv, sink


def eager_and_compiled(fn, inputs, backend):
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    results = []
    for f in (fn, compiled):
        leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        out = f(*leaves)
        grads = torch.autograd.grad(out.float().square().sum(), leaves)
        results.append((out, grads))
    return results


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_forward_backward(backend):
    (out, grads), (cout, cgrads) = eager_and_compiled(block, make_inputs(), backend)
    torch.testing.assert_close(cout, out, rtol=1e-5, atol=1e-5)
    for a, b in zip(cgrads, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compile_varlen_with_padding_helpers():
    def fn(x, mask, w):
        b, s, _ = x.shape
        qkv = (x @ w).view(b, s, 3, 2, 8)
        unpadded, indices, cu, max_len, _ = unpad_input(qkv, mask)
        out = flashattn.flash_attn_varlen_qkvpacked_func(unpadded, cu, max_len, causal=True)
        return pad_input(out, indices, b, s).reshape(b, s, 16)

    torch.manual_seed(1)
    x = torch.randn(3, 10, 16, requires_grad=True)
    w = (torch.randn(16, 48) * 0.2).requires_grad_()
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, 1:] = False
    eager = fn(x, mask, w)
    # unpad_input reads the mask's lengths (a data-dependent shape), so it is compiled with
    # graph breaks allowed; the attention op itself stays in the graph.
    compiled = torch.compile(fn, backend="aot_eager")(x, mask, w)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_fake_tensor_mode_and_eager_path_agree():
    """Eager calls skip the dispatcher (an autograd.Function over the ops' bodies); under a
    dispatch mode such as FakeTensorMode they must still go through the registered ops and their
    fake kernels (no data pointer is touched), with the same output shape and dtype as eager."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, wq, wk, wv, sink = make_inputs()
    eager = block(x, wq, wk, wv, sink)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fx, fwq, fwk, fwv, fsink = (mode.from_tensor(t) for t in (x, wq, wk, wv, sink))
        fake = block(fx, fwq, fwk, fwv, fsink)
    assert type(fake).__name__ == "FakeTensor"
    assert fake.shape == eager.shape and fake.dtype == eager.dtype
    grads = torch.autograd.grad(eager.square().sum(), (x, sink))
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
