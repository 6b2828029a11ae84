"""NumPy path: every function and option against the float64 reference (FlashAttention's rule),
the explicit backward, strided inputs passed without copies, varlen with empty sequences."""

import zlib

import numpy as np
import pytest

import flashattn
from attn_ref import ROUNDERS, check_rule, np_attention
from conftest import NUMPY_DTYPES, np_dtype


def rand(rng, shape, dtype_name, offset=0.0):
    x = rng.standard_normal(shape) + offset
    return x.astype(np.float32).astype(np_dtype(dtype_name))


def as64(x):
    return np.asarray(x).astype(np.float32).astype(np.float64)


# (name, batch, sq, sk, hq, hkv, d, dv, options)
CONFIGS = [
    ("plain", 2, 113, 113, 2, 2, 64, 64, {}),
    ("causal_gqa_odd_d", 2, 7, 203, 4, 2, 59, 59, {"causal": True}),
    ("causal_sq_gt_sk_mqa", 1, 203, 113, 4, 1, 32, 32, {"causal": True}),
    ("window_softcap", 2, 97, 128, 2, 2, 111, 111, {"window_size": (17, 5), "softcap": 5.0}),
    ("alibi_head_causal", 2, 64, 80, 4, 2, 64, 64, {"causal": True, "alibi": "head"}),
    ("alibi_batch_head", 2, 33, 33, 2, 1, 48, 48, {"alibi": "batch_head"}),
    ("sink_causal_masked_rows", 2, 50, 20, 4, 2, 32, 32, {"causal": True, "sink": True}),
    ("sink_window_left", 1, 40, 40, 2, 2, 16, 16, {"window_size": (3, 0), "sink": True}),
    ("decode_d256", 2, 1, 147, 2, 1, 256, 256, {"causal": True}),
    ("dv_ne_d_scale", 1, 31, 45, 2, 2, 64, 32, {"softmax_scale": 0.3}),
    ("odd_lengths", 3, 1, 7, 3, 1, 8, 8, {}),
]


def build_case(rng, dtype_name, batch, sq, sk, hq, hkv, d, dv, options):
    q = rand(rng, (batch, sq, hq, d), dtype_name)
    k = rand(rng, (batch, sk, hkv, d), dtype_name)
    v = rand(rng, (batch, sk, hkv, dv), dtype_name, offset=0.5)
    kwargs = dict(softmax_scale=options.get("softmax_scale"), causal=options.get("causal", False),
                  window_size=options.get("window_size", (-1, -1)),
                  softcap=options.get("softcap", 0.0))
    alibi = options.get("alibi")
    if alibi == "head":
        kwargs["alibi_slopes"] = rng.uniform(0.05, 0.5, hq).astype(np.float32)
    elif alibi == "batch_head":
        kwargs["alibi_slopes"] = rng.uniform(0.05, 0.5, (batch, hq)).astype(np.float32)
    if options.get("sink"):
        kwargs["sink_logits"] = rng.uniform(-1.0, 2.0, hq).astype(np.float32)
    return q, k, v, kwargs


def ref_kwargs(kwargs):
    return dict(scale=kwargs.get("softmax_scale"), causal=kwargs.get("causal", False),
                window=kwargs.get("window_size", (-1, -1)), softcap=kwargs.get("softcap", 0.0),
                alibi=kwargs.get("alibi_slopes"), sink=kwargs.get("sink_logits"))


@pytest.mark.parametrize("dtype_name", NUMPY_DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_forward_backward(config, dtype_name):
    rng = np.random.default_rng(zlib.crc32((config[0] + dtype_name).encode()))
    q, k, v, kwargs = build_case(rng, dtype_name, *config[1:])
    out, lse, probs = flashattn.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
    assert probs is None
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert lse.dtype == np.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    dout = rand(rng, out.shape, dtype_name)
    rk = ref_kwargs(kwargs)
    ref = np_attention(q, k, v, dout=dout, **rk)
    base = np_attention(q, k, v, dout=dout, rnd=ROUNDERS[dtype_name], **rk)
    check_rule("out", as64(out), ref["o"], base["o"], dtype_name)
    check_rule("lse", lse, ref["lse"], round_lse(base["lse"]), "float32")

    grads = flashattn.flash_attn_backward(dout, q, k, v, out, lse, **kwargs)
    names = ["dq", "dk", "dv"] + (["dsink"] if "sink_logits" in kwargs else [])
    assert len(grads) == len(names)
    for name, g, x in zip(names, grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
    for name, g in zip(names, grads):
        check_rule(name, as64(g), ref[name], base[name],
                   "float32" if name == "dsink" else dtype_name)


def round_lse(x):
    return np.asarray(x, np.float32).astype(np.float64)


VARLEN_LENS = [
    ("mixed_empty", [0, 7, 1, 113], [5, 0, 64, 128]),
    ("equal", [33, 64], [33, 64]),
]


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("features", ["plain", "causal_sink", "window_alibi_softcap"])
@pytest.mark.parametrize("lens", VARLEN_LENS, ids=[x[0] for x in VARLEN_LENS])
def test_varlen(lens, features, dtype_name):
    rng = np.random.default_rng(7)
    _, lens_q, lens_k = lens
    batch, hq, hkv, d = len(lens_q), 4, 2, 40
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rand(rng, (cu_q[-1], hq, d), dtype_name)
    k = rand(rng, (cu_k[-1], hkv, d), dtype_name)
    v = rand(rng, (cu_k[-1], hkv, d), dtype_name, offset=0.5)
    kwargs = {}
    if features == "causal_sink":
        kwargs = dict(causal=True, sink_logits=rng.uniform(-1, 1, hq).astype(np.float32))
    elif features == "window_alibi_softcap":
        kwargs = dict(window_size=(9, 3), softcap=8.0,
                      alibi_slopes=rng.uniform(0.05, 0.3, (batch, hq)).astype(np.float32))
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                   return_attn_probs=True, **kwargs)
    assert out.shape == (cu_q[-1], hq, d) and lse.shape == (hq, cu_q[-1])
    dout = rand(rng, out.shape, dtype_name)
    rk = ref_kwargs(kwargs)
    ref = np_attention(q, k, v, cu_q=cu_q, cu_k=cu_k, dout=dout, **rk)
    base = np_attention(q, k, v, cu_q=cu_q, cu_k=cu_k, dout=dout, rnd=ROUNDERS[dtype_name], **rk)
    check_rule("out", as64(out), ref["o"], base["o"], dtype_name)
    check_rule("lse", lse, ref["lse"], round_lse(base["lse"]), "float32")
    grads = flashattn.flash_attn_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lens_q),
                                          max(lens_k), **kwargs)
    for name, g in zip(["dq", "dk", "dv", "dsink"], grads):
        check_rule(name, as64(g), ref[name], base[name],
                   "float32" if name == "dsink" else dtype_name)


def test_packed_functions():
    rng = np.random.default_rng(3)
    b, s, h, d = 2, 37, 3, 24
    qkv = rand(rng, (b, s, 3, h, d), "float16")
    qkv[:, :, 2] += np.float16(0.5)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref = np_attention(q, k, v, causal=True)
    base = np_attention(q, k, v, causal=True, rnd=ROUNDERS["float16"])
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    check_rule("qkvpacked", as64(out), ref["o"], base["o"], "float16")
    out = flashattn.flash_attn_kvpacked_func(np.ascontiguousarray(q), qkv[:, :, 1:], causal=True)
    check_rule("kvpacked", as64(out), ref["o"], base["o"], "float16")

    cu = np.array([0, 10, 10, 37, 37 + 20], np.int32)
    packed = rand(rng, (57, 3, h, d), "float16")
    q, k, v = packed[:, 0], packed[:, 1], packed[:, 2]
    ref = np_attention(q, k, v, cu_q=cu, cu_k=cu, window=(4, 4))
    base = np_attention(q, k, v, cu_q=cu, cu_k=cu, window=(4, 4), rnd=ROUNDERS["float16"])
    out = flashattn.flash_attn_varlen_qkvpacked_func(packed, cu, 27, window_size=(4, 4))
    check_rule("varlen_qkvpacked", as64(out), ref["o"], base["o"], "float16")
    out = flashattn.flash_attn_varlen_kvpacked_func(q, packed[:, 1:], cu, cu, 27, 27,
                                                    window_size=(4, 4))
    check_rule("varlen_kvpacked", as64(out), ref["o"], base["o"], "float16")


def test_strided_inputs_not_copied(captured):
    """Views with a contiguous last dimension go to the library as they are."""
    rng = np.random.default_rng(11)
    b, s, h, d = 2, 19, 4, 32
    qkv = rand(rng, (b, s, 3, h, d), "float32")
    bhsd = rand(rng, (b, h, s, d), "float32")
    q = qkv[:, :, 0]
    k = bhsd.transpose(0, 2, 1, 3)  # (b, s, h, d) view of a [b, h, s, d] buffer
    v = rand(rng, (b, s, 2 * h, d), "float32")[:, :, ::2]  # every other head
    out = flashattn.flash_attn_func(q, k, v)
    (_, p), = captured
    assert p.q == q.ctypes.data and p.k == k.ctypes.data and p.v == v.ctypes.data
    assert (p.q_batch_stride, p.q_row_stride, p.q_head_stride) == (s * 3 * h * d, 3 * h * d, d)
    assert (p.k_row_stride, p.k_head_stride) == (d, s * d)
    assert p.v_head_stride == 2 * d
    ref = np_attention(q, k, v)
    base = np_attention(q, k, v, rnd=ROUNDERS["float32"])
    check_rule("out", out, ref["o"], base["o"], "float32")


def test_noncontiguous_last_dim_is_copied(captured):
    rng = np.random.default_rng(12)
    q = rand(rng, (1, 9, 2, 16), "float32")
    k_t = rand(rng, (1, 9, 16, 2), "float32")
    k = k_t.transpose(0, 1, 3, 2)  # last dim strided
    v = rand(rng, (1, 9, 2, 16), "float32")
    out = flashattn.flash_attn_func(q, k, v)
    (_, p), = captured
    assert p.k != k.ctypes.data and p.k_head_stride == 16
    ref = np_attention(q, k, v)
    base = np_attention(q, k, v, rnd=ROUNDERS["float32"])
    check_rule("out", out, ref["o"], base["o"], "float32")


def test_zero_length_and_empty_batch():
    rng = np.random.default_rng(5)
    q = rand(rng, (2, 0, 2, 8), "float32")
    k = rand(rng, (2, 5, 2, 8), "float32")
    out, lse, _ = flashattn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert out.shape == (2, 0, 2, 8) and lse.shape == (2, 2, 0)
    # no keys: output 0, lse -inf (or the sink logit with a sink)
    q = rand(rng, (1, 3, 2, 8), "float32")
    k = rand(rng, (1, 0, 2, 8), "float32")
    out, lse, _ = flashattn.flash_attn_func(q, k, k, return_attn_probs=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    sink = np.array([0.5, -1.0], np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, k, k, return_attn_probs=True, sink_logits=sink)
    assert np.all(out == 0)
    np.testing.assert_allclose(lse, np.broadcast_to(sink[None, :, None], lse.shape))
    q = rand(rng, (0, 4, 2, 8), "float32")
    out = flashattn.flash_attn_func(q, q, q)
    assert out.shape == (0, 4, 2, 8)


def test_default_scale_and_explicit_zero_scale():
    rng = np.random.default_rng(9)
    q = rand(rng, (1, 6, 1, 20), "float32")
    k = rand(rng, (1, 6, 1, 20), "float32")
    v = rand(rng, (1, 6, 1, 20), "float32")
    np.testing.assert_allclose(flashattn.flash_attn_func(q, k, v),
                               flashattn.flash_attn_func(q, k, v, softmax_scale=20 ** -0.5),
                               rtol=0, atol=0)
    # scale 0 means uniform attention, as in flash_attn
    out = flashattn.flash_attn_func(q, k, v, softmax_scale=0.0)
    np.testing.assert_allclose(out[0, :, 0], np.broadcast_to(v[0, :, 0].mean(0), (6, 20)),
                               rtol=1e-5, atol=1e-6)


def test_num_threads_setting():
    rng = np.random.default_rng(4)
    q = rand(rng, (2, 64, 2, 32), "float32")
    before = flashattn.get_num_threads()
    try:
        flashattn.set_num_threads(1)
        one = flashattn.flash_attn_func(q, q, q, causal=True)
        flashattn.set_num_threads(0)
        all_cores = flashattn.flash_attn_func(q, q, q, causal=True)
    finally:
        flashattn.set_num_threads(before)
    np.testing.assert_allclose(one, all_cores, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError):
        flashattn.set_num_threads(-1)


def test_forward_function_matches_func():
    rng = np.random.default_rng(6)
    q = rand(rng, (1, 12, 2, 16), "float16")
    out, lse = flashattn.flash_attn_forward(q, q, q, causal=True)
    out2, lse2, _ = flashattn.flash_attn_func(q, q, q, causal=True, return_attn_probs=True)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)


def test_library_introspection():
    assert flashattn.library_version() == "0.1.0"
    assert isinstance(flashattn.cpu_isa(), str) and flashattn.cpu_isa()
    assert isinstance(flashattn.cuda_available(), bool)
    assert flashattn.library_path.endswith(("libflashattn.so", "libflashattn.dylib"))
