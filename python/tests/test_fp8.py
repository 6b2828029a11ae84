"""fp8 e4m3 q, k, v with FlashAttention-3's descale factors (CPU, forward only): out in bfloat16
against float64 attention of the dequantised values, FlashAttention's rule with the bfloat16
baseline; power-of-two descales per (batch, kv head) keep descale·e4m3 exact in bfloat16."""

import zlib

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)

import flashattn  # noqa: E402
from attn_ref import attention_grads, check_rule, quantised_e4m3, torch_attention  # noqa: E402


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 37, 53, 4, 2, 64), (1, 9, 130, 6, 3, 40)])
def test_fp8_forward(shape, causal):
    b, sq, sk, hq, hk, d = shape
    torch.manual_seed(zlib.crc32(repr((shape, causal)).encode()))
    ds = [2.0 ** torch.randint(-3, 4, (b, hk)).float() for _ in range(3)]
    q8, q = quantised_e4m3((b, sq, hq, d), ds[0], hq // hk)
    k8, k = quantised_e4m3((b, sk, hk, d), ds[1], 1)
    v8, v = quantised_e4m3((b, sk, hk, d), ds[2], 1)
    out = flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=ds[0], k_descale=ds[1],
                                    v_descale=ds[2])
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d)
    ref, _ = torch_attention(q.double(), k.double(), v.double(), causal=causal)
    base, _ = torch_attention(q, k, v, causal=causal, upcast=False)
    check_rule("fp8 out", out.float().numpy(), ref.detach().numpy(), base.detach().float().numpy(),
               "bfloat16")


def test_fp8_varlen():
    torch.manual_seed(7)
    lens_q, lens_k, hq, hk, d = [5, 0, 17], [9, 4, 30], 4, 2, 48
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    ds = [2.0 ** torch.randint(-2, 3, (3, hk)).float() for _ in range(3)]
    seqs = []  # per sequence: (q8, k8, v8, q, k, v), each (1, len, heads, d)
    for b in range(3):
        one = [x[b:b + 1] for x in ds]
        seqs.append(quantised_e4m3((1, lens_q[b], hq, d), one[0], hq // hk)
                    + quantised_e4m3((1, lens_k[b], hk, d), one[1], 1)
                    + quantised_e4m3((1, lens_k[b], hk, d), one[2], 1))
    q8, _, k8, _, v8, _ = (torch.cat([s[i][0] for s in seqs]) for i in range(6))
    out = flashattn.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(lens_q), max(lens_k),
                                           causal=True, q_descale=ds[0], k_descale=ds[1],
                                           v_descale=ds[2])
    assert out.dtype == torch.bfloat16 and out.shape == (sum(lens_q), hq, d)
    for b in (0, 2):  # sequence 1 has no queries
        _, q, _, k, _, v = seqs[b]
        ref, _ = torch_attention(q.double(), k.double(), v.double(), causal=True)
        base, _ = torch_attention(q, k, v, causal=True, upcast=False)
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        check_rule("fp8 varlen out %d" % b, out[rows].float().numpy(), ref[0].detach().numpy(),
                   base[0].detach().float().numpy(), "bfloat16")


def test_fp8_rejections():
    q8 = torch.randn(1, 4, 2, 32).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError):
        flashattn.flash_attn_func(torch.randn(1, 4, 2, 32), torch.randn(1, 4, 2, 32),
                                  torch.randn(1, 4, 2, 32), q_descale=torch.ones(1, 2))
    with pytest.raises(NotImplementedError):
        flashattn.flash_attn_func(q8, q8, q8, dropout_p=0.1)
    with pytest.raises(ValueError):
        flashattn.flash_attn_func(q8, q8, q8, k_descale=torch.ones(2, 2))
    with pytest.raises(Exception, match="k_descale"):
        flashattn.flash_attn_func(q8, q8, q8, k_descale=torch.full((1, 2), -1.0))


def test_fp8_packed_equal_unpacked():
    """The packed functions read fp8 qkv / kv in place (strided views) and give flash_attn_func's
    and flash_attn_varlen_func's results bit for bit."""
    torch.manual_seed(11)
    b, s, h, d = 2, 21, 4, 32
    ds = [2.0 ** torch.randint(-2, 3, (b, h)).float() for _ in range(3)]
    qkv8 = (torch.randn(b, s, 3, h, d) * 4).to(torch.float8_e4m3fn)
    q8, k8, v8 = (qkv8[:, :, i].contiguous() for i in range(3))
    kw = dict(causal=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    want = flashattn.flash_attn_func(q8, k8, v8, **kw)
    assert torch.equal(flashattn.flash_attn_qkvpacked_func(qkv8, **kw), want)
    assert torch.equal(flashattn.flash_attn_kvpacked_func(q8, qkv8[:, :, 1:], **kw), want)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
    flat = qkv8.reshape(b * s, 3, h, d)
    want_v = flashattn.flash_attn_varlen_func(q8.reshape(b * s, h, d), k8.reshape(b * s, h, d),
                                              v8.reshape(b * s, h, d), cu, cu, s, s, **kw)
    assert torch.equal(want_v.reshape(b, s, h, d), want)
    assert torch.equal(flashattn.flash_attn_varlen_qkvpacked_func(flat, cu, s, **kw), want_v)
    assert torch.equal(flashattn.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, s, s, **kw),
                       want_v)


SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("dout_fp8", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device,shape", [("cpu", (2, 37, 53, 4, 2, 64)), ("cpu", (1, 9, 130, 6, 3, 40)),
                                          ("cuda", (2, 37, 300, 4, 2, 64)), ("cuda", (1, 333, 260, 6, 3, 128)),
                                          ("cuda", (2, 65, 200, 2, 1, 256))])
def test_fp8_backward(device, shape, causal, dout_fp8):
    """flash_attn_backward of fp8 q, k, v (and dout in bfloat16 or e4m3 with dout_descale; on sm_90
    at d = 128 the e4m3 tensor-core backward): bfloat16 gradients against float64 autograd of the
    dequantised values, the bfloat16 baseline's rule. out and lse come from the bfloat16 forward of
    the same values (on the GPU the fp8 forward's P in e4m3 would move out beyond the rule), so the
    rule sees the backward's error alone."""
    if device == "cuda" and not SM90:
        pytest.skip("the CUDA fp8 backward runs on sm_90 (H100 / H200)")
    b, sq, sk, hq, hk, d = shape
    torch.manual_seed(zlib.crc32(repr((device, shape, causal, dout_fp8, "bwd")).encode()))
    ds = [2.0 ** torch.randint(-3, 4, (b, hk), device=device).float() for _ in range(4)]
    q8, q = quantised_e4m3((b, sq, hq, d), ds[0], hq // hk, device)
    k8, k = quantised_e4m3((b, sk, hk, d), ds[1], 1, device)
    v8, v = quantised_e4m3((b, sk, hk, d), ds[2], 1, device)
    if dout_fp8:
        dout8, dout = quantised_e4m3((b, sq, hq, d), ds[3], hq // hk, device)
        extra = dict(dout_descale=ds[3])
    else:
        dout = dout8 = torch.randn(b, sq, hq, d, device=device).to(torch.bfloat16)
        extra = {}
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    grads = flashattn.flash_attn_backward(dout8, q8, k8, v8, out, lse, causal=causal, q_descale=ds[0],
                                          k_descale=ds[1], v_descale=ds[2], **extra)
    for name, ours, ref, base in zip(("dq", "dk", "dv"), grads, *attention_grads(q, k, v, dout, causal)):
        assert ours.dtype == torch.bfloat16 and ours.device.type == device
        check_rule("fp8 " + name, ours.double().cpu().numpy(), ref.detach().cpu().numpy(),
                   base.detach().double().cpu().numpy(), "bfloat16")


def test_fp8_backward_rejections():
    q8 = torch.randn(1, 4, 2, 32).to(torch.float8_e4m3fn)
    out, lse, _ = flashattn.flash_attn_func(q8, q8, q8, return_attn_probs=True)
    dout = torch.randn(1, 4, 2, 32).to(torch.bfloat16)
    with pytest.raises(TypeError, match="dout_descale"):
        flashattn.flash_attn_backward(dout, q8, q8, q8, out, lse, dout_descale=torch.ones(1, 2))
    with pytest.raises(TypeError, match="out"):
        flashattn.flash_attn_backward(dout, q8, q8, q8, out.float(), lse)
    with pytest.raises(ValueError, match="dout_descale"):
        flashattn.flash_attn_backward(q8, q8, q8, q8, out, lse, dout_descale=torch.ones(2, 2))
    with pytest.raises(Exception, match="dout_descale"):
        flashattn.flash_attn_backward(q8, q8, q8, q8, out, lse, dout_descale=torch.zeros(1, 2))
    with pytest.raises(TypeError, match="dout_descale"):
        flashattn.flash_attn_backward(dout, dout, dout, dout, dout, lse, dout_descale=torch.ones(1, 2))
