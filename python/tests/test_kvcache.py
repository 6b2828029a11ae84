"""flash_attn_with_kvcache: NumPy, torch CPU and torch CUDA (skipped without a GPU) against a float64
reference written here from flash_attn's semantics: contiguous and paged caches (pages of 1, 3,
16), cache_batch_idx, cache_leftpad, appending k / v in place (v bit-exact, k within one ulp of
the fp32 rotation, nothing else in the cache touched, visible to the caller), rotary interleaved
and half-split, masks, softcap, ALiBi, sinks, GQA, split-KV, return_softmax_lse, errors."""

import zlib

import numpy as np
import pytest

import flashattn
from attn_ref import ROUNDERS, check_rule, np_attention
from conftest import NUMPY_DTYPES, np_dtype

# ---- reference -------------------------------------------------------------------------------


def _rotate(x, cos, sin, interleaved, exact, rnd):
    """Rotate the first 2*cos.shape[-1] dims of x (last axis). exact: float64; else fp32 math
    rounded with rnd (the library's order: a*c - b*s, a*s + b*c)."""
    half = cos.shape[-1]
    x = np.array(x, np.float64)
    if interleaved:
        ia, ib = np.arange(half) * 2, np.arange(half) * 2 + 1
    else:
        ia, ib = np.arange(half), np.arange(half) + half
    a, b = x[..., ia], x[..., ib]
    if exact:
        x[..., ia], x[..., ib] = a * cos - b * sin, a * sin + b * cos
    else:
        f = np.float32
        a, b, c, s = a.astype(f), b.astype(f), cos.astype(f), sin.astype(f)
        x[..., ia] = rnd((a * c - b * s).astype(np.float64))
        x[..., ib] = rnd((a * s + b * c).astype(np.float64))
    return x


def kv_reference(dtype_name, q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                 cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                 softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 rotary_interleaved=True, alibi_slopes=None, sink_logits=None):
    """(expected k_cache, v_cache after the call as float64, ref dict, baseline dict); o / lse in
    the library's (batch, seqlen, nheads, dv) / (batch, nheads, seqlen) layouts."""
    rnd = ROUNDERS[dtype_name]
    f64 = lambda x: None if x is None else np.asarray(x).astype(np.float32).astype(np.float64)
    q, kc, vc, k, v = f64(q), f64(k_cache), f64(v_cache), f64(k), f64(v)
    cos, sin = f64(rotary_cos), f64(rotary_sin)
    batch, sq, hq, d = q.shape
    paged = block_table is not None
    page = kc.shape[1]
    capacity = block_table.shape[1] * page if paged else kc.shape[1]
    seqlens = np.full(batch, capacity) if cache_seqlens is None else np.broadcast_to(
        np.asarray(cache_seqlens), (batch,))
    pads = np.zeros(batch, int) if cache_leftpad is None else np.asarray(cache_leftpad)
    rows = np.arange(batch) if cache_batch_idx is None else np.asarray(cache_batch_idx)
    local = (window_size[0] >= 0 or window_size[1] >= 0)

    def where(b, slot):
        if paged:
            return int(block_table[b, slot // page]), slot % page
        return int(rows[b]), slot

    new_k, new_v = kc.copy(), vc.copy()
    q64, qb, keys64, keysb, vals, cu_k = [], [], [], [], [], [0]
    for b in range(batch):
        L0, pad = int(seqlens[b]), int(pads[b])
        # flash_attn 2.x: rotary positions are cache slots, left padding included
        qpos = L0 + (np.arange(sq) if (causal or local) else np.zeros(sq, int))
        qx, qr = q[b], q[b].copy()
        if cos is not None:
            qx = np.stack([_rotate(q[b, i], cos[qpos[i]], sin[qpos[i]], rotary_interleaved, True, rnd)
                           for i in range(sq)])
            qr = np.stack([_rotate(q[b, i], cos[qpos[i]], sin[qpos[i]], rotary_interleaved, False, rnd)
                           for i in range(sq)])
        q64.append(qx)
        qb.append(qr)
        appended = k.shape[1] if k is not None else 0  # seqlen_new, may differ from sq
        for slot in range(pad, L0 + appended):
            r, c = where(b, slot)
            if slot < L0:
                keys64.append(kc[r, c])
                keysb.append(kc[r, c])
                vals.append(vc[r, c])
                continue
            t, pos = slot - L0, slot
            kx, kr = k[b, t], k[b, t]
            if cos is not None:
                kx = _rotate(k[b, t], cos[pos], sin[pos], rotary_interleaved, True, rnd)
                kr = _rotate(k[b, t], cos[pos], sin[pos], rotary_interleaved, False, rnd)
            new_k[r, c], new_v[r, c] = kr, v[b, t]
            keys64.append(kx)
            keysb.append(kr)
            vals.append(v[b, t])
        cu_k.append(cu_k[-1] + L0 + appended - pad)
    dk = kc.shape[-1]
    shape_k = (0, kc.shape[2], dk)
    stack = lambda xs, shp: np.stack(xs) if xs else np.zeros(shp)
    K64, Kb = stack(keys64, shape_k), stack(keysb, shape_k)
    V = stack(vals, (0, vc.shape[2], vc.shape[3]))
    Q64, Qb = np.concatenate(q64), np.concatenate(qb)
    cu_q = np.arange(batch + 1) * sq
    cu_k = np.asarray(cu_k)
    common = dict(cu_q=cu_q, cu_k=cu_k, scale=softmax_scale, causal=causal, window=window_size,
                  softcap=softcap, alibi=alibi_slopes, sink=sink_logits)
    results = []
    for Q, K, r in ((Q64, K64, None), (Qb, Kb, rnd)):
        res = np_attention(Q, K, V, rnd=r, **common)
        o = res["o"].reshape(batch, sq, hq, -1)
        lse = res["lse"].reshape(hq, batch, sq).transpose(1, 0, 2)
        results.append({"o": o, "lse": lse})
    return new_k, new_v, results[0], results[1]


def ulp(dtype_name, x):
    bits = {"float32": 23, "float16": 10, "bfloat16": 7}[dtype_name]
    e = np.floor(np.log2(np.maximum(np.abs(x), 1e-30)))
    return 2.0 ** (e - bits)


def check_cache(name, dtype_name, after, before, expected, rotary, is_v):
    after, before = np.asarray(after), np.asarray(before)
    a64 = after.astype(np.float32).astype(np.float64)
    changed = a64 != before.astype(np.float32).astype(np.float64)
    wrong = np.abs(a64 - expected)
    if is_v or not rotary:
        assert np.array_equal(a64, expected), "%s: cache differs from the expected update" % name
    else:
        tol = ulp(dtype_name, expected) + 4 * ulp("float32", np.abs(expected) + 2)
        assert (wrong <= tol).all(), "%s: appended k off by %.3g" % (name, wrong.max())
    assert not (changed & (expected == before.astype(np.float32).astype(np.float64)) & (wrong > 0)).any(), \
        "%s: elements outside the appended slots changed" % name


# ---- problems --------------------------------------------------------------------------------

# (name, batch, sq, hq, hkv, d, dv, capacity, options)
CASES = [
    ("decode_gqa", 3, 1, 8, 2, 64, 64, 203, {"causal": True}),
    ("append_causal", 2, 1, 4, 2, 64, 64, 113, {"append": True, "causal": True}),
    ("paged1_append", 2, 1, 4, 1, 32, 32, 37, {"page": 1, "append": True, "causal": True}),
    ("paged3_leftpad_rotary_i", 3, 3, 6, 2, 64, 64, 50,
     {"page": 3, "append": True, "leftpad": True, "rotary": 32, "interleaved": True, "causal": True}),
    ("paged16_rotary_half_noncausal", 2, 4, 4, 2, 48, 48, 70,
     {"page": 16, "append": True, "rotary": 48, "interleaved": False}),
    ("batch_idx_append", 2, 2, 4, 2, 32, 32, 40, {"batch_idx": True, "append": True, "causal": True}),
    ("window_softcap_alibi_sink", 2, 5, 4, 1, 59, 59, 90,
     {"append": True, "window_size": (20, 0), "softcap": 3.0, "alibi": True, "sink": True}),
    ("splits_dv", 1, 1, 4, 2, 64, 40, 600, {"num_splits": 4, "append": True, "causal": True,
                                              "seqlens_int": True}),
    # k / v of another length than q ("new": seqlen_new): the queries are the last keys
    ("new_more_rotary_leftpad", 2, 2, 4, 2, 64, 64, 90,
     {"append": True, "new": 9, "causal": True, "rotary": 32, "leftpad": True}),
    ("new_fewer_paged_odd_dims", 2, 6, 4, 2, 59, 33, 70,
     {"page": 5, "append": True, "new": 2, "causal": True, "rotary": 16, "window_size": (10, 0)}),
    ("new_more_batch_idx_d100_noncausal", 2, 3, 6, 3, 100, 100, 50,
     {"batch_idx": True, "append": True, "new": 7, "rotary": 20, "interleaved": False, "sink": True}),
]


def make_problem(rng, dtype, batch, sq, hq, hkv, d, dv, capacity, o):
    """Host NumPy arrays (dtype; a callable stores float32 values its own way) and the flash_attn
    keyword arguments."""
    store = dtype if callable(dtype) else (lambda x: x.astype(dtype))

    def rand(shape, offset=0.0):
        return store((rng.standard_normal(shape) + offset).astype(np.float32))

    appended = o.get("new", sq) if o.get("append") else 0
    seqlens = rng.integers(0, capacity - appended + 1, batch).astype(np.int32)
    seqlens[0] = capacity - appended
    kw = dict(causal=o.get("causal", False), window_size=o.get("window_size", (-1, -1)),
              softcap=o.get("softcap", 0.0), num_splits=o.get("num_splits", 0))
    if o.get("seqlens_int"):
        seqlens[:] = capacity - appended
        kw["cache_seqlens"] = int(capacity - appended)
    else:
        kw["cache_seqlens"] = seqlens
    if o.get("leftpad"):
        kw["cache_leftpad"] = np.array([rng.integers(0, s + 1) for s in seqlens], np.int32)
    page = o.get("page")
    if page:
        per_seq = -(-capacity // page)
        pool = batch * per_seq + 2
        perm = rng.permutation(pool).astype(np.int32)
        kw["block_table"] = perm[:batch * per_seq].reshape(batch, per_seq)
        k_cache, v_cache = rand((pool, page, hkv, d)), rand((pool, page, hkv, dv), 0.5)
    else:
        rows = batch + 2 if o.get("batch_idx") else batch
        if o.get("batch_idx"):
            kw["cache_batch_idx"] = rng.permutation(rows)[:batch].astype(np.int32)
        k_cache, v_cache = rand((rows, capacity, hkv, d)), rand((rows, capacity, hkv, dv), 0.5)
    q = rand((batch, sq, hq, d))
    if o.get("append"):
        kw["k"], kw["v"] = rand((batch, appended, hkv, d)), rand((batch, appended, hkv, dv), 0.5)
    if o.get("rotary"):
        rd = o["rotary"]
        # >= seqlen_k as flash_attn, and every query's position L0 + i
        rows = (-(-capacity // page) * page if page else capacity) + sq + 3
        pos = np.arange(rows)[:, None]
        angle = pos * 10000.0 ** (-2.0 * np.arange(rd // 2)[None, :] / rd)
        kw["rotary_cos"] = store(np.cos(angle).astype(np.float32))
        kw["rotary_sin"] = store(np.sin(angle).astype(np.float32))
        kw["rotary_interleaved"] = o.get("interleaved", True)
    if o.get("alibi"):
        kw["alibi_slopes"] = rng.uniform(0.01, 0.3, hq).astype(np.float32)
    if o.get("sink"):
        kw["sink_logits"] = rng.uniform(0.0, 3.0, hq).astype(np.float32)
    return q, k_cache, v_cache, kw


def reference_kwargs(kw):
    names = ("k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
             "cache_leftpad", "block_table", "causal", "window_size", "softcap",
             "rotary_interleaved", "alibi_slopes", "sink_logits")
    return {n: kw[n] for n in names if n in kw}


def bf16_values_in_f32(x):
    """bfloat16 values held in float32 arrays (for torch when ml_dtypes is missing)."""
    return ROUNDERS["bfloat16"](x).astype(np.float32)


def run_and_check(dtype_name, case, convert, to_numpy, call_kwargs=None):
    name, batch, sq, hq, hkv, d, dv, capacity, o = case
    rng = np.random.default_rng(zlib.crc32((name + dtype_name).encode()))
    dtype = bf16_values_in_f32 if dtype_name == "bfloat16" and convert is not np_identity \
        else np_dtype(dtype_name)
    q, k_cache, v_cache, kw = make_problem(rng, dtype, batch, sq, hq, hkv, d, dv, capacity, o)
    new_k, new_v, ref, base = kv_reference(dtype_name, q, k_cache, v_cache, **reference_kwargs(kw))
    kc0, vc0 = k_cache.copy(), v_cache.copy()
    args = {key: convert(val, key) for key, val in kw.items()}
    kc, vc = convert(k_cache, "k_cache"), convert(v_cache, "v_cache")
    out, lse = flashattn.flash_attn_with_kvcache(convert(q), kc, vc, return_softmax_lse=True,
                                                 **args, **(call_kwargs or {}))
    check_rule(name + " out", to_numpy(out), ref["o"], base["o"], dtype_name)
    check_rule(name + " lse", to_numpy(lse), ref["lse"], base["lse"], "float32")
    rotary = "rotary_cos" in kw
    check_cache(name + " k_cache", dtype_name, to_numpy(kc), kc0, new_k, rotary, False)
    check_cache(name + " v_cache", dtype_name, to_numpy(vc), vc0, new_v, rotary, True)
    return out


def np_identity(x, name=None):
    return x


def np_to64(x):
    return np.asarray(x).astype(np.float32).astype(np.float64) if np.asarray(x).dtype.kind == "f" \
        or np.asarray(x).dtype.name == "bfloat16" else np.asarray(x)


@pytest.mark.parametrize("dtype_name", NUMPY_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_numpy(dtype_name, case):
    run_and_check(dtype_name, case, np_identity, np_to64)


def test_numpy_plain_output_and_no_copy_of_cache():
    rng = np.random.default_rng(3)
    q, kc, vc, kw = make_problem(rng, np.float32, 2, 1, 4, 2, 32, 32, 20, {"append": True})
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, **kw)
    assert isinstance(out, np.ndarray) and out.shape == (2, 1, 4, 32)
    # a strided view of a larger cache is updated in place
    big = np.zeros((2, 20, 2, 64), np.float32)
    view = big[:, :, :, :32]
    view[...] = kc
    flashattn.flash_attn_with_kvcache(q, view, vc.copy(), **kw)
    seq = kw["cache_seqlens"]
    assert np.array_equal(big[0, seq[0], :, :32], kw["k"][0, 0])
    assert not big[:, :, :, 32:].any()


def test_numpy_errors():
    rng = np.random.default_rng(4)
    q, kc, vc, kw = make_problem(rng, np.float32, 2, 1, 4, 2, 32, 32, 20,
                                 {"append": True, "page": 4})
    with pytest.raises(ValueError, match="both k and v"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, k=kw["k"])
    with pytest.raises(ValueError, match="contiguous last dimension"):
        flashattn.flash_attn_with_kvcache(q, np.repeat(kc, 2, axis=-1)[..., ::2], vc)
    ro = kc.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        flashattn.flash_attn_with_kvcache(q, ro, vc, **kw)
    bad = dict(kw)
    bad["block_table"] = kw["block_table"].copy()
    bad["block_table"][1, kw["cache_seqlens"][1] // 4] = 10_000
    before = kc.copy()
    with pytest.raises(flashattn.FlashAttnValueError, match="block_table"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, **bad)
    assert np.array_equal(kc, before), "a rejected call changed the cache"
    over = dict(kw)
    over["cache_seqlens"] = np.full(2, 100, np.int32)
    with pytest.raises(flashattn.FlashAttnValueError, match="capacity"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, **over)
    with pytest.raises(ValueError, match="k / v must have shapes"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, **dict(kw, k=kw["k"][:1], v=kw["v"][:1]))


# ---- torch ----------------------------------------------------------------------------------


try:
    import torch
except ImportError:  # NumPy-only installs
    torch = None

TORCH_DTYPES = ["float32", "float16", "bfloat16"]


def torch_converter(device, dtype_name):
    """NumPy -> torch on `device`: floating arrays (not the fp32 slopes / sinks) as dtype_name."""
    def convert(x, name=None):
        if x is None or isinstance(x, (int, float, bool, tuple)):
            return x
        x = np.asarray(x)
        t = torch.from_numpy(np.ascontiguousarray(x.astype(np.float32) if x.dtype.kind == "V" or
                                                  x.dtype.name == "bfloat16" else x))
        if t.is_floating_point() and name not in ("alibi_slopes", "sink_logits"):
            t = t.to(getattr(torch, dtype_name))
        return t.to(device)
    return convert


def torch_to_numpy(x):
    return x.detach().float().cpu().numpy().astype(np.float64) if x.dtype.is_floating_point \
        else x.cpu().numpy()


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("dtype_name", TORCH_DTYPES)
@pytest.mark.parametrize("case", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_torch_cpu(dtype_name, case):
    out = run_and_check(dtype_name, case, torch_converter("cpu", dtype_name), torch_to_numpy)
    assert isinstance(out, torch.Tensor) and not out.requires_grad


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_in_place_update_visible():
    rng = np.random.default_rng(5)
    q, kc, vc, kw = make_problem(rng, np.float32, 2, 1, 4, 2, 32, 32, 12, {"append": True})
    conv = torch_converter("cpu", "float32")
    kct, vct = conv(kc), conv(vc)
    args = {key: conv(val, key) for key, val in kw.items()}
    alias = kct[:1]  # a view the caller holds
    flashattn.flash_attn_with_kvcache(conv(q), kct, vct, **args)
    s0 = int(kw["cache_seqlens"][0])
    assert torch.equal(alias[0, s0], args["k"][0, 0])
    assert torch.equal(vct[1, int(kw["cache_seqlens"][1])], args["v"][1, 0])


@pytest.mark.skipif(torch is None or not torch.cuda.is_available() or not flashattn.cuda_available(),
                    reason="needs a CUDA GPU and a libflashattn built with CUDA")
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_torch_cuda(dtype_name, case):
    """Every case on CUDA, k / v of another length than q and head dims that are not multiples
    of 8 included (the library pads those in its workspace; the caches are updated in place)."""
    run_and_check(dtype_name, case, torch_converter("cuda", dtype_name), torch_to_numpy)


class NoPlans:
    """Stands in for a _core.PlanCache that never holds a plan: every call takes the uncached
    path (all checks, a FaParams built from scratch)."""

    def get(self, key):
        return None

    def put(self, key, plan):
        pass


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_plan_cache_is_keyed_by_signature(monkeypatch):
    """torch_with_kvcache keeps a plan per call signature (shapes, strides, dtypes, devices,
    options) and on a hit only patches the data pointers: every call of a sequence that hits
    plans (other shapes and options in between) gives bitwise the results of the same call with
    no plan at all (caches appended too), and an option change (causal, window, softcap,
    num_splits, an int cache_seqlens) gets its own plan and its own answer."""
    from flashattn import _kvcache

    conv = torch_converter("cpu", "float32")
    full = {"append": True, "rotary": 16, "leftpad": True, "batch_idx": True, "alibi": True,
            "sink": True, "causal": True}

    def problem(seed, o, batch=3, capacity=24):
        q, kc, vc, kw = make_problem(np.random.default_rng(seed), np.float32, batch, 2, 4, 2, 32,
                                     32, capacity, o)
        if "rotary_cos" in kw:  # tables that differ from seed to seed, as the other data do
            kw["rotary_cos"] = kw["rotary_cos"] * (1.0 + 0.01 * seed)
            kw["rotary_sin"] = kw["rotary_sin"] * (1.0 - 0.01 * seed)
        return conv(q), conv(kc), conv(vc), {key: conv(val, key) for key, val in kw.items()}

    def run(prob, **options):
        q, kc, vc, kw = prob
        kc, vc = kc.clone(), vc.clone()  # appended in place: each run starts from the same cache
        out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, return_softmax_lse=True,
                                                     **dict(kw, **options))
        return out, lse, kc, vc

    a1, a2 = problem(1, full), problem(2, full)  # one signature, other data
    b = problem(3, full, batch=2)  # another shape
    p1, p2 = problem(4, {"page": 3, "append": True}), problem(5, {"page": 3, "append": True})
    i1, i2 = problem(6, {"seqlens_int": True}), problem(7, {"seqlens_int": True})
    i2[3]["cache_seqlens"] -= 5  # another int than i1's: the same signature
    sequence = [
        (a1, {}), (b, {}), (a1, {"causal": False}), (a1, {"window_size": (3, 1)}),
        (p1, {}), (i1, {}), (a2, {}), (a2, {"causal": False}), (a2, {"window_size": (3, 1)}),
        (a2, {"softcap": 2.0}), (a2, {"num_splits": 2}), (p2, {}), (i2, {}), (b, {}),
        (a1, {"softcap": 2.0}), (a2, {"softmax_scale": 0.3}),
    ]
    made = []
    real_plan = _kvcache._torch_plan
    monkeypatch.setattr(_kvcache, "_torch_plan", lambda *a: made.append(1) or real_plan(*a))
    _kvcache._plans.clear()
    cached = [run(prob, **o) for prob, o in sequence]
    # a1 {}, b, a1 causal=False, a1 window, p1, i1, a2 softcap, a2 num_splits, a2 scale; the
    # rest are hits
    assert len(made) == 9, "plans made: %d (hits missing or signatures confused)" % len(made)
    monkeypatch.setattr(_kvcache, "_plans", NoPlans())
    fresh = [run(prob, **o) for prob, o in sequence]
    assert len(made) == 9 + len(sequence)
    for (prob, o), got, want in zip(sequence, cached, fresh):
        for name, x, y in zip(("out", "lse", "k_cache", "v_cache"), got, want):
            assert torch.equal(x, y), "%s differs for options %s" % (name, o)
    # the masks and softcap that share a problem give different answers (so the check above can
    # tell them apart; split-KV is meant to give the same one)
    outs = [got[0] for (prob, o), got in zip(sequence, cached)
            if prob is a2 and "num_splits" not in o]
    assert len(outs) == 5
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            assert not torch.equal(outs[i], outs[j])
    assert not torch.equal(cached[0][0], cached[6][0])  # a1 and a2: other data, other result
    # without return_softmax_lse (no lse written at all) out is the same
    q, kc, vc, kw = a2
    assert torch.equal(flashattn.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), **kw),
                       cached[6][0])


@pytest.mark.parametrize("dtype_name", NUMPY_DTYPES)
@pytest.mark.parametrize("page", [None, 16])
def test_numpy_mla_latent_cache(dtype_name, page):
    """DeepSeek-style MLA decode: one latent cache [.., 1, 576] whose first 512 columns are the
    values (v_cache and v are views of k_cache and k), 16 query heads, 2 speculative tokens,
    causal, an append; the output against float64 and the latent cache written once."""
    rng = np.random.default_rng(zlib.crc32(("mla" + dtype_name + str(page)).encode()))
    dtype = np_dtype(dtype_name)
    batch, sq, hq, d, dv, capacity = 2, 2, 16, 576, 512, 40
    store = lambda x: x.astype(np.float32).astype(dtype)
    seqlens = np.array([capacity - sq, 11], np.int32)
    kw = dict(causal=True, cache_seqlens=seqlens)
    if page:
        per_seq = -(-capacity // page)
        kw["block_table"] = rng.permutation(batch * per_seq).astype(np.int32).reshape(batch, per_seq)
        latent = store(rng.standard_normal((batch * per_seq, page, 1, d)))
    else:
        latent = store(rng.standard_normal((batch, capacity, 1, d)))
    q = store(rng.standard_normal((batch, sq, hq, d)))
    k_new = store(rng.standard_normal((batch, sq, 1, d)))
    ref_kw = dict(kw, k=k_new, v=k_new[..., :dv].copy())
    new_k, _, ref, base = kv_reference(dtype_name, q, latent.copy(), latent[..., :dv].copy(), **ref_kw)
    out, lse = flashattn.flash_attn_with_kvcache(q, latent, latent[..., :dv], k=k_new, v=k_new[..., :dv],
                                                 return_softmax_lse=True, **kw)
    check_rule("mla out", np_to64(out), ref["o"], base["o"], dtype_name)
    check_rule("mla lse", np_to64(lse), ref["lse"], base["lse"], "float32")
    assert np.array_equal(np_to64(latent), new_k), "the latent cache after the append"
