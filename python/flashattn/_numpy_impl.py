"""The NumPy path: host arrays in, host arrays out, forward and an explicit backward.

Arrays are passed by address and strides (NumPy strides are bytes; they are converted to
elements). An array is copied only when its last dimension is not contiguous or a stride is not
a whole number of elements. bfloat16 arrays are accepted when their dtype is named "bfloat16"
(the `ml_dtypes` package provides one).
"""

import ctypes

import numpy as np

from . import _core, _lib

_EMPTY = (ctypes.c_char * 64)()  # stands in for the address of an empty array


def dtype_code(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return _lib.FA_DTYPE_F32
    if dtype == np.float16:
        return _lib.FA_DTYPE_F16
    if dtype.name == "bfloat16" and dtype.itemsize == 2:
        return _lib.FA_DTYPE_BF16
    raise TypeError("flashattn: unsupported dtype %s (use float32, float16 or bfloat16)" % dtype)


def _array(x, name):
    if x is None:
        raise TypeError("flashattn: %s is required" % name)
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    return x


def _prepare(x, name):
    """(array to keep alive, View). Copies only if the last dimension is not contiguous or a
    stride is not a multiple of the element size."""
    x = _array(x, name)
    item = x.dtype.itemsize
    if x.ndim == 0:
        raise ValueError("flashattn: %s must be an array, got a scalar" % name)
    if (x.shape[-1] > 1 and x.strides[-1] != item) or any(s % item for s in x.strides):
        x = np.ascontiguousarray(x)
    if x.size:
        strides = [s // item for s in x.strides]
        ptr = x.ctypes.data
    else:  # NumPy gives empty arrays all-zero strides: describe them as dense instead
        strides = [1] * x.ndim
        for axis in range(x.ndim - 2, -1, -1):
            strides[axis] = strides[axis + 1] * max(x.shape[axis + 1], 1)
        ptr = ctypes.addressof(_EMPTY)
    strides[-1] = 1
    return x, _core.View(ptr, x.shape, strides)


def _flat_f32(x, name, shape_check):
    x = np.ascontiguousarray(_array(x, name), dtype=np.float32)
    shape_check(x.shape)
    return x


def _cu(x, name):
    x = np.ascontiguousarray(_array(x, name), dtype=np.int32)
    return x


class _Call:
    """Checked inputs of one call and the FaParams that describes them."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                 deterministic=False):
        q, k, v = _array(q, "q"), _array(k, "k"), _array(v, "v")
        if not (q.dtype == k.dtype == v.dtype):
            raise TypeError("flashattn: q, k, v must have the same dtype, got %s, %s, %s"
                            % (q.dtype, k.dtype, v.dtype))
        self.dtype = q.dtype
        self.code = dtype_code(q.dtype)
        varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
            raise ValueError("flashattn: give both cu_seqlens_q and cu_seqlens_k, or neither")
        self.varlen = varlen
        batch, rows_q, rows_k, hq, hkv, d, dv = _core.check_qkv_shapes(
            q.shape, k.shape, v.shape, varlen)
        self.keep = []
        cu_q_ptr = cu_k_ptr = None
        if varlen:
            cu_q, cu_k = _cu(cu_seqlens_q, "cu_seqlens_q"), _cu(cu_seqlens_k, "cu_seqlens_k")
            batch = _core.check_cu_seqlens_shapes(cu_q.shape, cu_k.shape)
            self.keep += [cu_q, cu_k]
            cu_q_ptr, cu_k_ptr = cu_q.ctypes.data, cu_k.ctypes.data
            if max_seqlen_q is None or max_seqlen_k is None:
                raise TypeError("flashattn: max_seqlen_q and max_seqlen_k are required with "
                                "cu_seqlens")
            seqlen_q, seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        else:
            seqlen_q, seqlen_k = rows_q, rows_k
        self.batch, self.seqlen_q, self.seqlen_k = batch, seqlen_q, seqlen_k
        self.rows_q, self.rows_k, self.hq, self.dv = rows_q, rows_k, hq, dv

        alibi_ptr, alibi_stride = None, 0
        if alibi_slopes is not None:
            a = _flat_f32(alibi_slopes, "alibi_slopes",
                          lambda s: _core.check_alibi_shape(s, batch, hq))
            self.keep.append(a)
            alibi_ptr = a.ctypes.data
            alibi_stride = a.strides[0] // 4 if a.ndim == 2 else 0
        self.sink = None
        sink_ptr = None
        if sink_logits is not None:
            self.sink = _flat_f32(sink_logits, "sink_logits",
                                  lambda s: _core.check_sink_shape(s, hq))
            sink_ptr = self.sink.ctypes.data

        self.q, qv = _prepare(q, "q")
        self.k, kv = _prepare(k, "k")
        self.v, vv = _prepare(v, "v")
        self.views = (qv, kv, vv)
        self.opts = _core.Options(d, softmax_scale, causal, window_size, softcap, deterministic)
        self.extra = dict(cu_seqlens_q_ptr=cu_q_ptr, cu_seqlens_k_ptr=cu_k_ptr,
                          alibi_ptr=alibi_ptr, alibi_batch_stride=alibi_stride, sink_ptr=sink_ptr)

    def alloc(self, shape, dtype):
        return (np.zeros if self.varlen else np.empty)(shape, dtype=dtype)

    def out_shape(self):
        if self.varlen:
            return (self.rows_q, self.hq, self.dv)
        return (self.batch, self.rows_q, self.hq, self.dv)

    def lse_shape(self):
        return _core.lse_shape(self.varlen, self.batch, self.seqlen_q, self.hq, self.rows_q)

    def params(self, o_view, lse):
        qv, kv, vv = self.views
        lse_ptr = lse.ctypes.data if lse.size else ctypes.addressof(_EMPTY)
        return _core.make_params(_lib.FA_DEVICE_CPU, self.code, qv, kv, vv, o_view, lse_ptr,
                                 self.batch, self.seqlen_q, self.seqlen_k, self.opts, **self.extra)


def forward(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
            alibi_slopes=None, sink_logits=None):
    """(out, lse) for host arrays."""
    call = _Call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                 causal, window_size, softcap, alibi_slopes, sink_logits)
    out = call.alloc(call.out_shape(), call.dtype)
    lse = call.alloc(call.lse_shape(), np.float32)
    if call.batch == 0:
        return out, lse
    out_keep, o_view = _prepare(out, "out")
    _lib.forward(call.params(o_view, lse))
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
             max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
             softcap=0.0, alibi_slopes=None, sink_logits=None, deterministic=False):
    """(dq, dk, dv, dsink or None) for host arrays."""
    call = _Call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                 causal, window_size, softcap, alibi_slopes, sink_logits, deterministic)
    dout, out = _array(dout, "dout"), _array(out, "out")
    for name, x in (("dout", dout), ("out", out)):
        if tuple(x.shape) != call.out_shape():
            raise ValueError("flashattn: %s must have shape %s (that of the forward output), got %s"
                             % (name, call.out_shape(), tuple(x.shape)))
        if x.dtype != call.dtype:
            raise TypeError("flashattn: %s has dtype %s but q has %s" % (name, x.dtype, call.dtype))
    lse = np.ascontiguousarray(_array(lse, "lse"), dtype=np.float32)
    if tuple(lse.shape) != call.lse_shape():
        raise ValueError("flashattn: lse must have shape %s, got %s"
                         % (call.lse_shape(), tuple(lse.shape)))
    dq = call.alloc(call.q.shape, call.dtype)
    dk = call.alloc(call.k.shape, call.dtype)
    dv = call.alloc(call.v.shape, call.dtype)
    dsink = np.zeros((call.hq,), np.float32) if call.sink is not None else None
    if call.batch == 0:
        return dq, dk, dv, dsink
    out, o_view = _prepare(out, "out")
    dout, do_view = _prepare(dout, "dout")
    views = [_prepare(x, n)[1] for x, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
    p = call.params(o_view, lse)
    _core.set_backward(p, do_view, views[0], views[1], views[2],
                       dsink.ctypes.data if dsink is not None else None)
    _lib.backward(p)
    return dq, dk, dv, dsink
