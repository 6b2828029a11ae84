"""flash_attn_with_kvcache over fa_kvcache_forward, for NumPy arrays and torch tensors.

The caches are updated in place (k / v are written at cache_seqlens before attending), so they
are passed by address and strides and never copied: a cache whose last dimension is not
contiguous, or a read-only NumPy array, is rejected. The other tensors are copied only when their
last dimension is not contiguous. Integer tables are converted to int32 when they are not.
"""

import ctypes

from . import _core, _lib

_torch = None


def _torch_module():
    global _torch
    if _torch is None:
        import torch
        _torch = torch
    return _torch


def _paged_geometry(k_cache_shape, block_table_shape):
    """(seqlen_k, page_size, num_pages, cache_batch) of the cache."""
    if block_table_shape is None:
        return k_cache_shape[1], 0, 0, k_cache_shape[0]
    if len(block_table_shape) != 2:
        raise ValueError("flashattn: block_table must be 2-D (batch, max_blocks_per_seq), got shape %s"
                         % (tuple(block_table_shape),))
    page_size = k_cache_shape[1]
    return block_table_shape[1] * page_size, page_size, k_cache_shape[0], 0


def _check_shapes(q_shape, kc_shape, vc_shape, k_shape, v_shape, cos_shape, sin_shape):
    _core.check_rank("q", q_shape, 4, "(batch, seqlen, nheads, headdim)")
    _core.check_rank("k_cache", kc_shape, 4, "(batch_cache, seqlen_cache, nheads_k, headdim) or "
                     "(num_blocks, page_block_size, nheads_k, headdim)")
    _core.check_rank("v_cache", vc_shape, 4, "like k_cache with headdim_v")
    if tuple(vc_shape[:3]) != tuple(kc_shape[:3]):
        raise ValueError("flashattn: v_cache has shape %s but k_cache has %s: the first three "
                         "dimensions must match" % (tuple(vc_shape), tuple(kc_shape)))
    if q_shape[-1] != kc_shape[-1]:
        raise ValueError("flashattn: q has head dim %d but k_cache has %d" % (q_shape[-1], kc_shape[-1]))
    if (k_shape is None) != (v_shape is None):
        raise ValueError("flashattn: give both k and v (the new tokens to append), or neither")
    if k_shape is not None:
        _core.check_rank("k", k_shape, 4, "(batch, seqlen_new, nheads_k, headdim)")
        _core.check_rank("v", v_shape, 4, "(batch, seqlen_new, nheads_k, headdim_v)")
        want_k = (q_shape[0], k_shape[1], kc_shape[2], kc_shape[3])
        want_v = (q_shape[0], k_shape[1], vc_shape[2], vc_shape[3])
        if tuple(k_shape) != want_k or tuple(v_shape) != want_v:
            raise ValueError("flashattn: k / v must have shapes %s / %s (batch, seqlen_new, nheads_k, "
                             "headdim), got %s / %s" % (want_k, want_v, tuple(k_shape), tuple(v_shape)))
    if (cos_shape is None) != (sin_shape is None):
        raise ValueError("flashattn: give both rotary_cos and rotary_sin, or neither")
    if cos_shape is not None:
        if len(cos_shape) != 2 or tuple(sin_shape) != tuple(cos_shape):
            raise ValueError("flashattn: rotary_cos / rotary_sin must both be (seqlen_ro, rotary_dim / 2), "
                             "got %s / %s" % (tuple(cos_shape), tuple(sin_shape)))


# ---- quantised caches ---------------------------------------------------------------------------
# The caches' dtype picks the library's kv_dtype (include/flashattn.h, fa_kv_dtype): int8 values
# with one fp32 scale per (cache row or page, slot, kv head) in k_scale / v_scale; fp8 e4m3 with
# one fp32 scale per kv head; uint8 rows of llama.cpp Q8_0 blocks (per 32 values an f16 scale and
# 32 int8, 34 bytes; no scale tensors). The new k / v stay in q's dtype: the append quantises them.
KV_SAME, KV_INT8, KV_Q8_0, KV_FP8 = 0, 1, 2, 3
_KV_CODES = {"int8": KV_INT8, "uint8": KV_Q8_0, "float8_e4m3fn": KV_FP8}


def _kv_code(cache_dtype, q_dtype):
    """kv_dtype of caches of dtype name cache_dtype next to q of dtype name q_dtype."""
    if cache_dtype == q_dtype:
        return KV_SAME
    code = _KV_CODES.get(cache_dtype)
    if code is None:
        raise TypeError("flashattn: k_cache has dtype %s but q has %s (a cache is in q's dtype, or "
                        "int8 / float8_e4m3fn with k_scale / v_scale, or uint8 Q8_0 blocks)"
                        % (cache_dtype, q_dtype))
    return code


def _values_per_row(kv, last, name):
    """The head dim a cache row of `last` elements holds."""
    if kv != KV_Q8_0:
        return last
    if last % 34:
        raise ValueError("flashattn: %s holds Q8_0 blocks of 34 bytes per 32 values, but its rows "
                         "have %d bytes" % (name, last))
    return last // 34 * 32


def _value_shape(kv, shape, name):
    return tuple(shape[:-1]) + (_values_per_row(kv, shape[-1], name),)


def _check_scales(kv, kc_shape, k_scale_shape, v_scale_shape):
    """The scale tensors' presence and shapes for cache format kv."""
    want = {KV_INT8: tuple(kc_shape[:3]), KV_FP8: (kc_shape[2],)}.get(kv)
    for name, shape in (("k_scale", k_scale_shape), ("v_scale", v_scale_shape)):
        if want is None and shape is not None:
            raise ValueError("flashattn: %s is only for int8 and float8_e4m3fn caches" % name)
        if want is not None and shape is None:
            raise ValueError("flashattn: an %s cache needs k_scale and v_scale" %
                             ("int8" if kv == KV_INT8 else "float8_e4m3fn"))
        if want is not None and tuple(shape) != want:
            raise ValueError("flashattn: %s must have shape %s (%s), got %s" % (
                name, want, "cache rows or pages, slots, nheads_k: one scale per token and head"
                if kv == KV_INT8 else "nheads_k: one scale per kv head", tuple(shape)))


def _set_kv(p, kv, dv, k_scale, v_scale):
    """The quantised-cache fields of p: k_scale / v_scale are (address, element strides) or None;
    dv the head dim of v (a Q8_0 row's byte count is not)."""
    p.kv_dtype = kv
    p.head_dim_v = dv
    if k_scale is not None:
        p.k_scale, p.v_scale = k_scale[0], v_scale[0]
        if kv == KV_INT8:
            p.k_scale_batch_stride, p.k_scale_row_stride, p.k_scale_head_stride = k_scale[1]
            p.v_scale_batch_stride, p.v_scale_row_stride, p.v_scale_head_stride = v_scale[1]


def _fill_params(p, seqlen_k, page_size, num_pages, cache_batch, knew, vnew, cos_ptr, sin_ptr,
                 cos_shape, rotary_interleaved, seqlens_ptr, batch_idx_ptr, leftpad_ptr, table_ptr,
                 table_row_stride, num_splits):
    p.seqlen_k = seqlen_k
    p.page_size = page_size
    p.num_pages = num_pages
    p.cache_batch = cache_batch
    p.cache_seqlens = seqlens_ptr
    p.cache_batch_idx = batch_idx_ptr
    p.cache_leftpad = leftpad_ptr
    p.block_table = table_ptr
    p.block_table_batch_stride = table_row_stride
    if knew is not None:
        p.k_new, p.v_new = knew.ptr, vnew.ptr
        p.knew_batch_stride, p.knew_row_stride, p.knew_head_stride = knew.strides[:3]
        p.vnew_batch_stride, p.vnew_row_stride, p.vnew_head_stride = vnew.strides[:3]
        p.seqlen_new = knew.shape[1]  # may differ from seqlen_q (flash_attn accepts any)
    if cos_ptr is not None:
        p.rotary_cos, p.rotary_sin = cos_ptr, sin_ptr
        p.rotary_seqlen = cos_shape[0]
        p.rotary_dim = 2 * cos_shape[1]
        p.rotary_interleaved = int(bool(rotary_interleaved))
    num_splits = int(num_splits)
    if num_splits < 0:
        raise ValueError("flashattn: num_splits = %d must be >= 0 (0 = heuristic)" % num_splits)
    p.num_splits = num_splits


# ---- NumPy -------------------------------------------------------------------------------------


def _np_cache_view(np, x, name):
    """View of a cache array without copying it (it is written in place)."""
    if not isinstance(x, np.ndarray):
        raise TypeError("flashattn: %s must be a NumPy array (it is updated in place)" % name)
    item = x.dtype.itemsize
    if (x.shape[-1] > 1 and x.strides[-1] != item) or any(s % item for s in x.strides) or \
            any(s < 0 for s in x.strides):
        raise ValueError("flashattn: %s must have a contiguous last dimension and non-negative "
                         "strides (it is updated in place, so it cannot be copied)" % name)
    if not x.flags.writeable:
        raise ValueError("flashattn: %s is read-only (it is updated in place)" % name)
    strides = [s // item for s in x.strides]
    strides[-1] = 1
    return _core.View(x.ctypes.data, x.shape, strides)


def _np_scale_view(np, x, name):
    """(address, element strides) of a scale array, never copied (the append writes into it)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError("flashattn: %s must be a float32 NumPy array (the append writes into it)" % name)
    if not x.flags.writeable or any(st % 4 or st < 0 for st in x.strides):
        raise ValueError("flashattn: %s must be writable with non-negative strides" % name)
    return x.ctypes.data, tuple(st // 4 for st in x.strides)


def numpy_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                       cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                       window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                       return_softmax_lse, sink_logits, k_scale=None, v_scale=None):
    import numpy as np

    from . import _numpy_impl as npi

    q = npi._array(q, "q")
    cache_dtype = np.asarray(k_cache).dtype
    kv = _kv_code(cache_dtype.name, q.dtype.name)
    if np.asarray(v_cache).dtype != cache_dtype:
        raise TypeError("flashattn: v_cache has dtype %s but k_cache has %s" % (np.asarray(v_cache).dtype,
                                                                                cache_dtype))
    kc_shape = _value_shape(kv, np.shape(k_cache), "k_cache")
    vc_shape = _value_shape(kv, np.shape(v_cache), "v_cache")
    _check_shapes(q.shape, kc_shape, vc_shape, None if k is None else np.shape(k),
                  None if v is None else np.shape(v), None if rotary_cos is None else np.shape(rotary_cos),
                  None if rotary_sin is None else np.shape(rotary_sin))
    _check_scales(kv, kc_shape, None if k_scale is None else np.shape(k_scale),
                  None if v_scale is None else np.shape(v_scale))
    code = npi.dtype_code(q.dtype)
    for name, x in (("k", k), ("v", v)):
        if x is not None and np.asarray(x).dtype != q.dtype:
            raise TypeError("flashattn: %s has dtype %s but q has %s" % (name, np.asarray(x).dtype, q.dtype))
    scales = (None, None)
    if k_scale is not None:
        scales = (_np_scale_view(np, k_scale, "k_scale"), _np_scale_view(np, v_scale, "v_scale"))
    batch, sq, hq, d = q.shape
    keep = []
    q, qv = npi._prepare(q, "q")
    kc, vc = _np_cache_view(np, k_cache, "k_cache"), _np_cache_view(np, v_cache, "v_cache")
    table = None if block_table is None else np.ascontiguousarray(block_table, dtype=np.int32)
    seqlen_k, page_size, num_pages, cache_batch = _paged_geometry(
        k_cache.shape, None if table is None else table.shape)

    def int_table(x, name):
        if x is None:
            return None
        if np.ndim(x) == 0:
            x = np.full((batch,), int(x), np.int32)
        x = np.ascontiguousarray(x, dtype=np.int32)
        if x.shape != (batch,):
            raise ValueError("flashattn: %s must have shape (batch,) = (%d,), got %s" % (name, batch, x.shape))
        keep.append(x)
        return x.ctypes.data

    seqlens_ptr = int_table(cache_seqlens, "cache_seqlens")
    batch_idx_ptr = int_table(cache_batch_idx, "cache_batch_idx")
    leftpad_ptr = int_table(cache_leftpad, "cache_leftpad")
    knew = vnew = None
    if k is not None:
        k, knew = npi._prepare(np.asarray(k), "k")
        v, vnew = npi._prepare(np.asarray(v), "v")
    cos_ptr = sin_ptr = None
    if rotary_cos is not None:
        cos = np.ascontiguousarray(rotary_cos, dtype=q.dtype)
        sin = np.ascontiguousarray(rotary_sin, dtype=q.dtype)
        keep += [cos, sin]
        cos_ptr, sin_ptr = cos.ctypes.data, sin.ctypes.data
    alibi_ptr, alibi_stride = None, 0
    if alibi_slopes is not None:
        a = npi._flat_f32(alibi_slopes, "alibi_slopes", lambda s: _core.check_alibi_shape(s, batch, hq))
        keep.append(a)
        alibi_ptr, alibi_stride = a.ctypes.data, (a.strides[0] // 4 if a.ndim == 2 else 0)
    sink_ptr = None
    if sink_logits is not None:
        sink = npi._flat_f32(sink_logits, "sink_logits", lambda s: _core.check_sink_shape(s, hq))
        keep.append(sink)
        sink_ptr = sink.ctypes.data

    dv = vc_shape[-1]
    out = np.empty((batch, sq, hq, dv), dtype=q.dtype)
    lse = np.empty((batch, hq, sq), dtype=np.float32)
    if batch > 0:
        out_keep, ov = npi._prepare(out, "out")
        opts = _core.Options(d, softmax_scale, causal, window_size, softcap)
        p = _core.make_params(_lib.FA_DEVICE_CPU, code, qv, kc, vc, ov,
                              lse.ctypes.data if lse.size else ctypes.addressof(npi._EMPTY),
                              batch, sq, seqlen_k, opts, alibi_ptr=alibi_ptr,
                              alibi_batch_stride=alibi_stride, sink_ptr=sink_ptr)
        _fill_params(p, seqlen_k, page_size, num_pages, cache_batch, knew, vnew, cos_ptr, sin_ptr,
                     None if rotary_cos is None else np.shape(rotary_cos), rotary_interleaved,
                     seqlens_ptr, batch_idx_ptr, leftpad_ptr,
                     None if table is None else table.ctypes.data,
                     0 if table is None else table.shape[1], num_splits)
        _set_kv(p, kv, dv, *scales)
        _lib.kvcache_forward(p)
    return (out, lse) if return_softmax_lse else out


# ---- torch -------------------------------------------------------------------------------------

# Plans of recent call signatures (see _core.PlanCache): a decoding loop calls this once per layer
# and token with the same shapes and options, so after the first call only the data pointers
# (and the stream) change; a hit skips the signature's checks and rebuilding the FaParams.
_plans = _core.PlanCache()

_ti = None


def _torch_impl():
    global _ti
    if _ti is None:
        from . import _torch_impl as ti
        _ti = ti
    return _ti


class _TorchPlan:
    """What torch_with_kvcache derives from a call signature: `template` (FaParams with every
    non-pointer field; None when batch = 0: nothing to call), `workspace_bytes` (see
    _lib._with_workspace), output shapes, and whether any tensor passed by address is empty (it
    then gets a placeholder address, see _torch_impl._address)."""

    __slots__ = ("template", "workspace_bytes", "batch", "out_shape", "lse_shape", "any_empty",
                 "is_cuda")


def _torch_key(torch, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
               cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
               softcap, rotary_interleaved, alibi_slopes, num_splits, sink_logits, k_scale, v_scale):
    """The PlanCache key of a call, or None when it gets none (a tensor subclass or a non-tensor
    where a tensor goes, an option that is not a plain scalar): such calls are not cached."""
    tensor = torch.Tensor
    if type(q) is not tensor or type(k_cache) is not tensor or type(v_cache) is not tensor:
        return None
    window = _core.window_key(window_size)
    if window is None or not _core.plain_scalars(softmax_scale, causal, softcap,
                                                 rotary_interleaved, num_splits):
        return None
    if type(cache_seqlens) is tensor:
        seqlens = (cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
                   cache_seqlens.device)
    elif cache_seqlens is None or type(cache_seqlens) is int:
        seqlens = type(cache_seqlens)  # the value goes into a tensor made per call
    else:
        return None
    extras = None
    if not (k is None and v is None and rotary_cos is None and rotary_sin is None and
            cache_batch_idx is None and cache_leftpad is None and block_table is None and
            alibi_slopes is None and sink_logits is None and k_scale is None and v_scale is None):
        extras = []
        for t in (k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table,
                  alibi_slopes, sink_logits, k_scale, v_scale):
            if t is None or type(t) is int:
                extras.append(type(t))
            elif type(t) is tensor:
                extras.append((t.shape, t.stride(), t.dtype, t.device))
            else:
                return None
        extras = tuple(extras)
    return (q.shape, q.stride(), q.dtype, q.device, k_cache.shape, k_cache.stride(),
            k_cache.dtype, k_cache.device, v_cache.shape, v_cache.stride(), v_cache.dtype,
            v_cache.device, seqlens, extras, softmax_scale, causal, window, softcap,
            rotary_interleaved, num_splits, _core._num_threads)


def _torch_check(torch, ti, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                 cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sink_logits, k_scale,
                 v_scale):
    """The checks that depend only on the call signature, in order, each with its message.
    Returns the dtype code, batch, (seqlen_k, page_size, num_pages, cache_batch), the cache
    format (KV_*) and v's head dim."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                    ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if t is not None:
            ti._check_tensor(name, t, q.device)
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError("flashattn: tensors on device %s are not supported (cpu or cuda)" % q.device)
    kv = _kv_code(str(k_cache.dtype).replace("torch.", ""), str(q.dtype).replace("torch.", ""))
    if v_cache.dtype != k_cache.dtype:
        raise TypeError("flashattn: v_cache has dtype %s but k_cache has %s" % (v_cache.dtype, k_cache.dtype))
    kc_shape = _value_shape(kv, k_cache.shape, "k_cache")
    vc_shape = _value_shape(kv, v_cache.shape, "v_cache")
    _check_shapes(q.shape, kc_shape, vc_shape, None if k is None else k.shape,
                  None if v is None else v.shape, None if rotary_cos is None else rotary_cos.shape,
                  None if rotary_sin is None else rotary_sin.shape)
    for name, t in (("k", k), ("v", v)):
        if t is not None and t.dtype != q.dtype:
            raise TypeError("flashattn: %s has dtype %s but q has %s" % (name, t.dtype, q.dtype))
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is not None:
            ti._check_tensor(name, t, q.device)
            if t.dtype != torch.float32:
                raise TypeError("flashattn: %s must be torch.float32 (the append writes into it), got %s"
                                % (name, t.dtype))
    _check_scales(kv, kc_shape, None if k_scale is None else tuple(k_scale.shape),
                  None if v_scale is None else tuple(v_scale.shape))
    code = ti.dtype_code(q.dtype)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError("flashattn: %s must have a contiguous last dimension (it is updated in "
                             "place, so it cannot be copied)" % name)
    batch = q.shape[0]
    table_shape = None
    for name, x, shape in (("cache_seqlens", cache_seqlens, (batch,)),
                           ("cache_batch_idx", cache_batch_idx, (batch,)),
                           ("cache_leftpad", cache_leftpad, (batch,)),
                           ("block_table", block_table, None)):
        if x is None:
            continue
        if isinstance(x, torch.Tensor):
            ti._check_tensor(name, x, q.device)
            if x.dtype.is_floating_point:
                raise TypeError("flashattn: %s must be an integer tensor (torch.int32)" % name)
            x_shape = tuple(x.shape)
        else:
            int(x)  # an int stands for (batch,) copies of itself (_int32_table)
            x_shape = (batch,)
        if shape is not None and x_shape != shape:
            raise ValueError("flashattn: %s must have shape %s, got %s" % (name, shape, x_shape))
        if name == "block_table":
            table_shape = x_shape
    geometry = _paged_geometry(tuple(k_cache.shape), table_shape)
    if table_shape is not None and table_shape[0] != batch:
        raise ValueError("flashattn: block_table has %d rows but the batch is %d" % (table_shape[0], batch))
    hq = q.shape[2]
    if alibi_slopes is not None:
        ti._check_tensor("alibi_slopes", alibi_slopes, q.device)
        _core.check_alibi_shape(alibi_slopes.shape, batch, hq)
        if alibi_slopes.dtype != torch.float32:
            raise TypeError("flashattn: alibi_slopes must be torch.float32, got %s" % alibi_slopes.dtype)
    if sink_logits is not None:
        ti._check_tensor("sink_logits", sink_logits, q.device)
        _core.check_sink_shape(sink_logits.shape, hq)
    return code, batch, geometry, kv, vc_shape[-1]


def _torch_plan(q, k_cache, v_cache, knew, vnew, batch, dv):
    """A new _TorchPlan for the signature of this call (tensors as passed to the library), with
    no template yet."""
    plan = _TorchPlan()
    _, sq, hq, _ = q.shape
    plan.batch = batch
    plan.out_shape = (batch, sq, hq, dv)
    plan.lse_shape = (batch, hq, sq)
    plan.workspace_bytes = None
    plan.is_cuda = q.is_cuda
    shapes = [q.shape, k_cache.shape, v_cache.shape, plan.out_shape, plan.lse_shape]
    if knew is not None:
        shapes += [knew.shape, vnew.shape]
    plan.any_empty = any(0 in shape for shape in shapes)
    plan.template = None
    return plan


def _torch_params(ti, q, k_cache, v_cache, out, lse, knew, vnew, cos, sin, seqlens, batch_idx,
                  leftpad, table, alibi, sink, code, geometry, softmax_scale, causal, window_size,
                  softcap, rotary_interleaved, num_splits, kv, dv, k_scale, v_scale):
    """The FaParams of a call built from scratch (a plan's first call, and calls without a plan).
    Raises for the options the signature checks do not cover (window_size, softmax_scale,
    softcap, num_splits), as the call did before it had plans."""
    batch, sq, _, d = q.shape
    seqlen_k, page_size, num_pages, cache_batch = geometry
    device_code, stream = ti._device_and_stream(q)
    opts = _core.Options(d, softmax_scale, causal, window_size, softcap)
    extra = {}
    if alibi is not None:
        extra["alibi_ptr"] = alibi.data_ptr()
        extra["alibi_batch_stride"] = alibi.stride(0) if alibi.dim() == 2 else 0
    if sink is not None:
        extra["sink_ptr"] = sink.data_ptr()
    p = _core.make_params(device_code, code, ti._view(q), ti._view(k_cache), ti._view(v_cache),
                          ti._view(out), None if lse is None else ti._address(lse), batch, sq,
                          seqlen_k, opts, stream=stream, **extra)
    _fill_params(p, seqlen_k, page_size, num_pages, cache_batch,
                 None if knew is None else ti._view(knew), None if vnew is None else ti._view(vnew),
                 None if cos is None else cos.data_ptr(), None if sin is None else sin.data_ptr(),
                 None if cos is None else tuple(cos.shape), rotary_interleaved,
                 None if seqlens is None else seqlens.data_ptr(),
                 None if batch_idx is None else batch_idx.data_ptr(),
                 None if leftpad is None else leftpad.data_ptr(),
                 None if table is None else table.data_ptr(),
                 0 if table is None else table.stride(0), num_splits)
    _set_kv(p, kv, dv, None if k_scale is None else (ti._address(k_scale), tuple(k_scale.stride())),
            None if v_scale is None else (ti._address(v_scale), tuple(v_scale.stride())))
    return p


def _int32_table(torch, x, q):
    """An integer table as the library reads it: int32, contiguous (x itself when it already is);
    an int stands for (batch,) copies of itself."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        return torch.full((q.shape[0],), int(x), dtype=torch.int32, device=q.device)
    if x.dtype is torch.int32 and x.is_contiguous():
        return x
    return x.to(torch.int32).contiguous()


def torch_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                       cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                       window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                       return_softmax_lse, sink_logits, k_scale=None, v_scale=None):
    torch = _torch or _torch_module()
    ti = _ti or _torch_impl()

    key = _torch_key(torch, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                     window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                     sink_logits, k_scale, v_scale)
    plan = None if key is None else _plans.get(key)
    if plan is None:
        code, batch, geometry, kv, dv = _torch_check(
            torch, ti, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
            cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sink_logits, k_scale, v_scale)

    # The tensors as the library reads them; no copy of those that already are.
    if q.stride(-1) != 1 and q.shape[-1] > 1:
        q = q.detach().contiguous()
    seqlens = _int32_table(torch, cache_seqlens, q)
    batch_idx = table = leftpad = knew = vnew = cos = sin = alibi = sink = None
    has_extras = not (k is None and rotary_cos is None and cache_batch_idx is None and
                      cache_leftpad is None and block_table is None and alibi_slopes is None and
                      sink_logits is None and k_scale is None)
    if has_extras:
        batch_idx = _int32_table(torch, cache_batch_idx, q)
        leftpad = _int32_table(torch, cache_leftpad, q)
        table = _int32_table(torch, block_table, q)
        if k is not None:
            knew, vnew = ti._contig_last(k.detach()), ti._contig_last(v.detach())
        if rotary_cos is not None:
            cos = rotary_cos.detach().to(q.dtype).contiguous()
            sin = rotary_sin.detach().to(q.dtype).contiguous()
        if alibi_slopes is not None:
            alibi = ti._contig_last(alibi_slopes.detach())
        if sink_logits is not None:
            sink = sink_logits.detach().float().contiguous()

    new = plan is None
    if new:
        plan = _torch_plan(q, k_cache, v_cache, knew, vnew, batch, dv)
    device = q.device
    out = torch.empty(*plan.out_shape, dtype=q.dtype, device=device)
    # Without return_softmax_lse the library writes no lse at all (lse = NULL).
    lse = torch.empty(*plan.lse_shape, dtype=torch.float32, device=device) \
        if return_softmax_lse else None
    if plan.batch == 0:
        if new and key is not None:
            _plans.put(key, plan)
        return (out, lse) if return_softmax_lse else out
    if new:
        p = _torch_params(ti, q, k_cache, v_cache, out, lse, knew, vnew, cos, sin, seqlens,
                          batch_idx, leftpad, table, alibi, sink, code, geometry, softmax_scale,
                          causal, window_size, softcap, rotary_interleaved, num_splits, kv, dv,
                          k_scale, v_scale)
        if key is not None:
            p.num_threads = key[-1]  # the key's, should set_num_threads have run since (a thread)
        plan.template = _core.template_of(_lib.FaParams.from_buffer_copy(p))
        if key is not None:
            _plans.put(key, plan)
    else:
        # A hit: the plan's FaParams, copied for this call, with this call's addresses.
        p = _lib.FaParams.from_buffer_copy(plan.template)
        if plan.any_empty:
            address = ti._address
            p.q, p.k, p.v, p.o = address(q), address(k_cache), address(v_cache), address(out)
            p.lse = None if lse is None else address(lse)
            if knew is not None:
                p.k_new, p.v_new = address(knew), address(vnew)
        else:
            p.q, p.k = q.data_ptr(), k_cache.data_ptr()
            p.v, p.o = v_cache.data_ptr(), out.data_ptr()
            p.lse = None if lse is None else lse.data_ptr()
            if knew is not None:
                p.k_new, p.v_new = knew.data_ptr(), vnew.data_ptr()
        if seqlens is not None:
            p.cache_seqlens = seqlens.data_ptr()
        if has_extras:
            if batch_idx is not None:
                p.cache_batch_idx = batch_idx.data_ptr()
            if leftpad is not None:
                p.cache_leftpad = leftpad.data_ptr()
            if table is not None:
                p.block_table = table.data_ptr()
            if cos is not None:
                p.rotary_cos, p.rotary_sin = cos.data_ptr(), sin.data_ptr()
            if alibi is not None:
                p.alibi_slopes = alibi.data_ptr()
            if sink is not None:
                p.sink_logits = sink.data_ptr()
            if k_scale is not None:
                p.k_scale, p.v_scale = ti._address(k_scale), ti._address(v_scale)
        if plan.is_cuda:
            p.stream = ti._current_stream(q)
    p.plan = plan
    if plan.is_cuda and ti._needs_device_switch(q):
        with torch.cuda.device(device):
            _lib.kvcache_forward(p, ti._workspace_alloc(q))
    else:
        _lib.kvcache_forward(p, ti._workspace_alloc(q))
    return (out, lse) if return_softmax_lse else out
