"""flash_attn_with_kvcache on the library's quantised caches: int8 with a scale per token and head,
fp8 e4m3 with a scale per kv head, llama.cpp Q8_0 blocks. Output against a float64 attention over
the dequantised cache (after the call, so the appended rows are the library's quantisation),
the appended codes against a quantisation done here, and the argument checks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from attn_ref import check_rule  # noqa: E402
from test_kvcache import kv_reference  # noqa: E402

B, HQ, HKV, D, CAP = 2, 4, 2, 64, 24
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available() or not flashattn.cuda_available(),
    reason="needs a CUDA GPU and a libflashattn built with CUDA"))]


def quant_int8(x):
    """x (..., d) float -> (int8 codes, fp32 scale per row): scale = max|x| / 127, round to nearest."""
    scale = x.abs().amax(-1) / 127.0
    codes = torch.where(scale[..., None] > 0, torch.round(x / scale[..., None].clamp_min(1e-30)), torch.zeros_like(x))
    return codes.to(torch.int8), scale.float()


def dequant_int8(codes, scale):
    return codes.double() * scale.double()[..., None]


def quant_q8_0(x):
    """x (..., d) -> uint8 (..., d / 32 * 34): per 32 values an f16 scale max|x| / 127, then the codes."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    d = (blocks.abs().amax(-1) / 127.0).half()
    codes = torch.where(d[..., None] > 0, torch.round(blocks / d.float()[..., None].clamp_min(1e-30)),
                        torch.zeros_like(blocks)).to(torch.int8)
    raw = torch.cat((d[..., None].view(torch.uint8).reshape(*d.shape, 2), codes.view(torch.uint8)), -1)
    return raw.reshape(*x.shape[:-1], -1)


def dequant_q8_0(raw):
    blocks = raw.reshape(*raw.shape[:-1], -1, 34)
    d = blocks[..., :2].contiguous().view(torch.float16).double()
    codes = blocks[..., 2:].contiguous().view(torch.int8).double()
    return (codes * d).reshape(*raw.shape[:-1], -1)


def check_attention(name, dtype, q, kc64, vc64, out, lse, seqlens, causal):
    """out / lse against float64 attention over the (dequantised, appended) caches."""
    dtype_name = str(dtype).replace("torch.", "")
    to_np = lambda t: t.detach().double().cpu().numpy()
    _, _, ref, base = kv_reference(dtype_name, to_np(q).astype(np.float32), to_np(kc64), to_np(vc64),
                                   cache_seqlens=seqlens, causal=causal)
    check_rule(name + " out", to_np(out), ref["o"], base["o"], dtype_name)
    check_rule(name + " lse", to_np(lse), ref["lse"], base["lse"], "float32")


def call_on(device, q, k_cache, v_cache, k_new, v_new, seqlens, k_scale=None, v_scale=None, **kw):
    """flash_attn_with_kvcache with every tensor moved to device; returns (out, lse) and the caches
    and scales after the call, back on the CPU."""
    to = lambda t: None if t is None else t.to(device)
    dev = [to(t) for t in (q, k_cache, v_cache, k_new, v_new, seqlens, k_scale, v_scale)]
    out, lse = flashattn.flash_attn_with_kvcache(dev[0], dev[1], dev[2], k=dev[3], v=dev[4], cache_seqlens=dev[5],
                                                 return_softmax_lse=True, k_scale=dev[6], v_scale=dev[7], **kw)
    back = [None if t is None else t.cpu() for t in (dev[1], dev[2], dev[6], dev[7])]
    return (out, lse), back


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_int8_cache(device, dtype, causal):
    g = torch.Generator().manual_seed(1)
    kf, vf = torch.randn(B, CAP, HKV, D, generator=g), torch.randn(B, CAP, HKV, D, generator=g) + 0.5
    k_cache, k_scale = quant_int8(kf)
    v_cache, v_scale = quant_int8(vf)
    kc0, vc0 = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor([10, 17], dtype=torch.int32)
    n = 3
    q = torch.randn(B, 2, HQ, D, generator=g).to(dtype)
    k_new, v_new = torch.randn(B, n, HKV, D, generator=g).to(dtype), torch.randn(B, n, HKV, D, generator=g).to(dtype)
    (out, lse), (k_cache, v_cache, k_scale, v_scale) = call_on(device, q, k_cache, v_cache, k_new, v_new, seqlens,
                                                               k_scale, v_scale, causal=causal)
    assert out.shape == (B, 2, HQ, D) and out.dtype == dtype
    for b in range(B):
        s0 = int(seqlens[b])
        codes, scale = quant_int8(k_new[b].float())
        assert (k_cache[b, s0:s0 + n].int() - codes.int()).abs().max() <= 1
        torch.testing.assert_close(k_scale[b, s0:s0 + n], scale, rtol=1e-6, atol=0)
        codes, scale = quant_int8(v_new[b].float())
        assert (v_cache[b, s0:s0 + n].int() - codes.int()).abs().max() <= 1
        keep = torch.ones(CAP, dtype=torch.bool)
        keep[s0:s0 + n] = False
        assert torch.equal(k_cache[b, keep], kc0[b, keep]) and torch.equal(v_cache[b, keep], vc0[b, keep])
    check_attention("int8", dtype, q, dequant_int8(k_cache, k_scale), dequant_int8(v_cache, v_scale), out, lse,
                    (seqlens + n).numpy(), causal)


def test_int8_paged_cache():
    g = torch.Generator().manual_seed(2)
    page, pages = 8, 9
    k_cache, k_scale = quant_int8(torch.randn(pages, page, HKV, D, generator=g))
    v_cache, v_scale = quant_int8(torch.randn(pages, page, HKV, D, generator=g))
    table = torch.tensor([[4, 0, 7], [2, 8, 5]], dtype=torch.int32)
    seqlens = torch.tensor([9, 20], dtype=torch.int32)
    q = torch.randn(B, 1, HQ, D, generator=g).half()
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                 return_softmax_lse=True, k_scale=k_scale, v_scale=v_scale)
    # the reference over the pages in table order, as contiguous caches
    kc, vc = dequant_int8(k_cache, k_scale), dequant_int8(v_cache, v_scale)
    kc = torch.stack([kc[table[b].long()].reshape(-1, HKV, D) for b in range(B)])
    vc = torch.stack([vc[table[b].long()].reshape(-1, HKV, D) for b in range(B)])
    check_attention("int8 paged", torch.float16, q, kc, vc, out, lse, seqlens.numpy(), False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_cache(device, dtype):
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        pytest.skip("this torch has no float8_e4m3fn")
    g = torch.Generator().manual_seed(3)
    k_scale = torch.tensor([0.02, 0.05])
    v_scale = torch.tensor([0.03, 0.01])
    kf, vf = torch.randn(B, CAP, HKV, D, generator=g), torch.randn(B, CAP, HKV, D, generator=g)
    k_cache = (kf / k_scale[:, None]).to(fp8)
    v_cache = (vf / v_scale[:, None]).to(fp8)
    seqlens = torch.tensor([5, 12], dtype=torch.int32)
    n = 2
    q = torch.randn(B, 1, HQ, D, generator=g).to(dtype)
    k_new, v_new = torch.randn(B, n, HKV, D, generator=g).to(dtype), torch.randn(B, n, HKV, D, generator=g).to(dtype)
    (out, lse), (k_cache, v_cache, _, _) = call_on(device, q, k_cache, v_cache, k_new, v_new, seqlens, k_scale,
                                                   v_scale)
    deq = lambda c, s: c.double() * s.double()[:, None]
    for b in range(B):
        s0 = int(seqlens[b])
        expected = (k_new[b].float() / k_scale[:, None]).to(fp8).double() * k_scale.double()[:, None]
        got = deq(k_cache[b, s0:s0 + n], k_scale)
        torch.testing.assert_close(got, expected, rtol=2 ** -3, atol=1e-9)  # within one e4m3 step
    check_attention("fp8", dtype, q, deq(k_cache, k_scale), deq(v_cache, v_scale), out, lse,
                    (seqlens + n).numpy(), False)


@pytest.mark.parametrize("device", DEVICES)
def test_q8_0_cache(device):
    g = torch.Generator().manual_seed(4)
    k_cache = quant_q8_0(torch.randn(B, CAP, HKV, D, generator=g))
    v_cache = quant_q8_0(torch.randn(B, CAP, HKV, D, generator=g))
    assert k_cache.dtype == torch.uint8 and k_cache.shape[-1] == D // 32 * 34
    seqlens = torch.tensor([7, 15], dtype=torch.int32)
    n = 2
    q = torch.randn(B, n, HQ, D, generator=g).half()
    k_new, v_new = torch.randn(B, n, HKV, D, generator=g).half(), torch.randn(B, n, HKV, D, generator=g).half()
    (out, lse), (k_cache, v_cache, _, _) = call_on(device, q, k_cache, v_cache, k_new, v_new, seqlens, causal=True)
    assert out.shape == (B, n, HQ, D)
    for b in range(B):
        s0 = int(seqlens[b])
        torch.testing.assert_close(dequant_q8_0(k_cache[b, s0:s0 + n]), k_new[b].double(),
                                   rtol=0, atol=float(k_new[b].abs().max()) / 127 * 0.51 + 1e-3)
    check_attention("q8_0", torch.float16, q, dequant_q8_0(k_cache), dequant_q8_0(v_cache), out, lse,
                    (seqlens + n).numpy(), True)


def test_numpy_int8_cache():
    rng = np.random.default_rng(5)
    kf = torch.from_numpy(rng.standard_normal((B, CAP, HKV, D)).astype(np.float32))
    vf = torch.from_numpy(rng.standard_normal((B, CAP, HKV, D)).astype(np.float32))
    k_cache, k_scale = (t.numpy() for t in quant_int8(kf))
    v_cache, v_scale = (t.numpy() for t in quant_int8(vf))
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float16)
    seqlens = np.array([11, 24], np.int32)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                 return_softmax_lse=True, k_scale=k_scale, v_scale=v_scale)
    check_attention("numpy int8", torch.float16, torch.from_numpy(q),
                    dequant_int8(torch.from_numpy(k_cache), torch.from_numpy(k_scale)),
                    dequant_int8(torch.from_numpy(v_cache), torch.from_numpy(v_scale)),
                    torch.from_numpy(out), torch.from_numpy(lse), seqlens, False)


def test_bad_arguments():
    q = torch.randn(B, 1, HQ, D).half()
    kc8 = torch.zeros(B, CAP, HKV, D, dtype=torch.int8)
    scale = torch.ones(B, CAP, HKV)
    same = torch.zeros(B, CAP, HKV, D).half()
    cases = [
        (dict(k_cache=kc8, v_cache=kc8), ValueError, "needs k_scale and v_scale"),
        (dict(k_cache=kc8, v_cache=kc8, k_scale=scale, v_scale=scale[:, :5]), ValueError, "v_scale must have shape"),
        (dict(k_cache=kc8, v_cache=kc8, k_scale=scale.half(), v_scale=scale), TypeError, "k_scale must be torch.float32"),
        (dict(k_cache=same, v_cache=same, k_scale=scale, v_scale=scale), ValueError, "only for int8"),
        (dict(k_cache=kc8, v_cache=same, k_scale=scale, v_scale=scale), TypeError, "v_cache has dtype"),
        (dict(k_cache=torch.zeros(B, CAP, HKV, D, dtype=torch.int16), v_cache=kc8), TypeError, "k_cache has dtype"),
        (dict(k_cache=torch.zeros(B, CAP, HKV, 70, dtype=torch.uint8),
              v_cache=torch.zeros(B, CAP, HKV, 70, dtype=torch.uint8)), ValueError, "34 bytes"),
    ]
    for kw, exc, message in cases:
        with pytest.raises(exc, match=message):
            flashattn.flash_attn_with_kvcache(q, kw.pop("k_cache"), kw.pop("v_cache"), **kw)


def test_plan_cache_takes_each_calls_scales():
    """A repeated call signature reuses its plan; the scale addresses are this call's."""
    g = torch.Generator().manual_seed(6)
    k_cache, k_scale = quant_int8(torch.randn(B, CAP, HKV, D, generator=g))
    v_cache, v_scale = quant_int8(torch.randn(B, CAP, HKV, D, generator=g))
    q = torch.randn(B, 1, HQ, D, generator=g).half()
    first = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=CAP, k_scale=k_scale,
                                             v_scale=v_scale)
    second = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=CAP, k_scale=k_scale.clone(),
                                              v_scale=2 * v_scale)
    torch.testing.assert_close(second.float(), 2 * first.float(), rtol=2e-3, atol=2e-3)


def test_numpy_fp8_and_q8_0_caches():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    q = rng.standard_normal((B, 1, HQ, D)).astype(np.float16)
    seqlens = np.array([6, 24], np.int32)
    scale = np.array([0.02, 0.04], np.float32)
    kf, vf = rng.standard_normal((2, B, CAP, HKV, D)).astype(np.float32)
    k_cache = (kf / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    v_cache = (vf / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, return_softmax_lse=True,
                                                 k_scale=scale.copy(), v_scale=scale.copy())
    deq = lambda c: torch.from_numpy(c.astype(np.float64) * scale.astype(np.float64)[:, None])
    check_attention("numpy fp8", torch.float16, torch.from_numpy(q), deq(k_cache), deq(v_cache),
                    torch.from_numpy(out), torch.from_numpy(lse), seqlens, False)
    k_raw = quant_q8_0(torch.from_numpy(kf)).numpy()
    v_raw = quant_q8_0(torch.from_numpy(vf)).numpy()
    out, lse = flashattn.flash_attn_with_kvcache(q, k_raw, v_raw, cache_seqlens=seqlens, return_softmax_lse=True)
    check_attention("numpy q8_0", torch.float16, torch.from_numpy(q), dequant_q8_0(torch.from_numpy(k_raw)),
                    dequant_q8_0(torch.from_numpy(v_raw)), torch.from_numpy(out), torch.from_numpy(lse), seqlens, False)
