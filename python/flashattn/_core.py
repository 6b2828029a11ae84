"""Framework-independent part of a call: argument checks shared by the NumPy and PyTorch paths,
and filling an `FaParams` from strided tensor descriptions.

A tensor reaches this layer as a `View`: its address, shape and strides in elements. Batched
tensors are [batch, seqlen, heads, dim]; variable-length ones are [total, heads, dim] with the
batch stride ignored by the library.
"""

import math

from . import _lib

_INT32_MAX = 2**31 - 1
_num_threads = 0


def set_num_threads(n):
    """Worker threads for CPU calls (0 = all online cores, the default)."""
    global _num_threads
    n = int(n)
    if n < 0:
        raise ValueError("flashattn.set_num_threads: n = %d must be >= 0 (0 = all cores)" % n)
    _num_threads = n


def get_num_threads():
    return _num_threads


class View:
    """Address, shape and element strides of one tensor (last stride must be 1)."""

    __slots__ = ("ptr", "shape", "strides")

    def __init__(self, ptr, shape, strides):
        self.ptr = ptr
        self.shape = tuple(shape)
        self.strides = tuple(strides)


class Options:
    """Everything about a call that is not a tensor, already checked and defaulted."""

    __slots__ = ("softmax_scale", "causal", "use_window", "window_left", "window_right", "softcap",
                 "deterministic")

    def __init__(self, head_dim, softmax_scale, causal, window_size, softcap, deterministic=False):
        self.softmax_scale = default_scale(head_dim, softmax_scale)
        self.causal = bool(causal)
        self.use_window, self.window_left, self.window_right = window_fields(window_size)
        self.softcap = check_softcap(softcap)
        self.deterministic = bool(deterministic)


class PlanCache:
    """Per-signature cache of the eager PyTorch calls (flash_attn_func's ops and checks,
    flash_attn_with_kvcache).

    A key holds everything a call's checks and its FaParams depend on except data: the shape,
    strides, dtype and device of every tensor (None for an absent optional one), every option as
    given, the thread count. The plan under it holds what the first call with that signature
    derived: a fully built FaParams `template` with its addresses cleared (template_of), which
    each later call copies and completes with its own (data pointers, stream), the output
    shapes, and `workspace_bytes` (fa_check_*'s answer, filled by _lib._with_workspace; None
    until asked). A hit skips the Python checks that depend only on the signature (they passed
    for it) and the second validation in C (fa_check_*); the library still validates every
    call, and everything that depends on values (pointers, cache lengths) is checked per call as
    before. A miss, and a call without a key, builds its FaParams from scratch as before.
    Calls never share a mutable struct: each one copies the template (FaParams.from_buffer_copy)
    before patching it, and plans are not changed after insertion except for the idempotent
    workspace_bytes, so concurrent threads are safe under the GIL. Keys are only built from
    plain Python scalars (an option of another type, a tensor subclass: no key, the call takes
    the uncached path). At most `capacity` plans; when full the oldest is dropped."""

    __slots__ = ("_plans", "capacity", "get")

    def __init__(self, capacity=64):
        self._plans = {}
        self.capacity = capacity
        self.get = self._plans.get

    def put(self, key, plan):
        plans = self._plans
        while len(plans) >= self.capacity:
            try:
                del plans[next(iter(plans))]
            except (KeyError, RuntimeError, StopIteration):  # another thread changed it
                break
        plans[key] = plan

    def clear(self):
        self._plans.clear()

    def __len__(self):
        return len(self._plans)


def template_of(p):
    """p (a FaParams) as a PlanCache template: every address cleared, so that a plan never holds
    one (each call sets its own)."""
    for name in _lib.POINTER_FIELDS:
        setattr(p, name, None)
    return p


_PLAIN_SCALARS = frozenset((int, float, bool, type(None)))


def plain_scalars(*values):
    """True if every value is an int, float, bool or None (hashable, immutable, and equal only to
    values that convert the same way): what may go into a PlanCache key as given."""
    for x in values:
        if type(x) not in _PLAIN_SCALARS:
            return False
    return True


def window_key(window_size):
    """window_size as a key part (a tuple of plain scalars), or None if it cannot be one."""
    if type(window_size) is tuple or type(window_size) is list:
        if len(window_size) == 2 and plain_scalars(*window_size):
            return tuple(window_size)
    return None


def default_scale(head_dim, softmax_scale):
    """softmax_scale=None means 1/sqrt(head_dim) of the caller's (unpadded) head_dim. The C API
    reads 0 as "default", so an explicit 0 is passed as the smallest normal float (the scores
    then vanish in fp32, which is what a zero scale means)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(softmax_scale)
    if scale == 0.0:
        return 1.1754943508222875e-38
    return scale


def window_fields(window_size):
    """flash_attn's window_size=(left, right), -1 = unbounded -> (use_window, left, right)."""
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise TypeError("flashattn: window_size must be a pair of ints (left, right), got %r"
                        % (window_size,)) from None
    left = -1 if left < 0 else min(left, _INT32_MAX)
    right = -1 if right < 0 else min(right, _INT32_MAX)
    return int(left >= 0 or right >= 0), left, right


def check_softcap(softcap):
    if softcap is None:
        return 0.0
    return float(softcap)


def check_dropout(dropout_p):
    """dropout_p as a float in [0, 1) (None means 0)."""
    p = 0.0 if dropout_p is None else float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError("flashattn: dropout_p = %r must be in [0, 1)" % (dropout_p,))
    return p


def check_rank(name, shape, rank, layout):
    if len(shape) != rank:
        raise ValueError("flashattn: %s must have %d dimensions %s, got shape %s"
                         % (name, rank, layout, tuple(shape)))


def check_qkv_shapes(q_shape, k_shape, v_shape, varlen):
    """Ranks and matching extents of q, k, v. Returns (batch or None, seqlen_q, seqlen_k,
    heads_q, heads_kv, head_dim, head_dim_v); seqlens are row counts (total_q/total_k) in varlen.
    Head counts and dims are range-checked by the library itself."""
    if varlen:
        check_rank("q", q_shape, 3, "(total_q, nheads, headdim)")
        check_rank("k", k_shape, 3, "(total_k, nheads_k, headdim)")
        check_rank("v", v_shape, 3, "(total_k, nheads_k, headdim_v)")
        rows_q, hq, d = q_shape
        rows_k, hkv, dk = k_shape
        if tuple(v_shape[:2]) != (rows_k, hkv):
            raise ValueError("flashattn: v has shape %s but k has %s: the first two dimensions "
                             "(total_k, nheads_k) must match" % (tuple(v_shape), tuple(k_shape)))
        batch = None
    else:
        check_rank("q", q_shape, 4, "(batch, seqlen_q, nheads, headdim)")
        check_rank("k", k_shape, 4, "(batch, seqlen_k, nheads_k, headdim)")
        check_rank("v", v_shape, 4, "(batch, seqlen_k, nheads_k, headdim_v)")
        batch, rows_q, hq, d = q_shape
        bk, rows_k, hkv, dk = k_shape
        if bk != batch:
            raise ValueError("flashattn: q has batch %d but k has batch %d" % (batch, bk))
        if tuple(v_shape[:3]) != (bk, rows_k, hkv):
            raise ValueError("flashattn: v has shape %s but k has %s: the first three dimensions "
                             "(batch, seqlen_k, nheads_k) must match"
                             % (tuple(v_shape), tuple(k_shape)))
    if dk != d:
        raise ValueError("flashattn: q has head dim %d but k has %d (they must match)" % (d, dk))
    return batch, rows_q, rows_k, hq, hkv, d, v_shape[-1]


def check_cu_seqlens_shapes(cu_q_shape, cu_k_shape):
    """Both 1-D with the same length >= 1; returns batch."""
    for name, shape in (("cu_seqlens_q", cu_q_shape), ("cu_seqlens_k", cu_k_shape)):
        if len(shape) != 1 or shape[0] < 1:
            raise ValueError("flashattn: %s must be 1-D of shape (batch + 1,), got shape %s"
                             % (name, tuple(shape)))
    if cu_q_shape[0] != cu_k_shape[0]:
        raise ValueError("flashattn: cu_seqlens_q has %d entries but cu_seqlens_k has %d (both "
                         "must be batch + 1)" % (cu_q_shape[0], cu_k_shape[0]))
    return cu_q_shape[0] - 1


def check_alibi_shape(shape, batch, heads_q):
    if tuple(shape) == (heads_q,):
        return
    if len(shape) == 2 and tuple(shape) == (batch, heads_q):
        return
    raise ValueError("flashattn: alibi_slopes must have shape (nheads,) = (%d,) or "
                     "(batch, nheads) = (%d, %d), got %s" % (heads_q, batch, heads_q, tuple(shape)))


def check_sink_shape(shape, heads_q):
    if tuple(shape) != (heads_q,):
        raise ValueError("flashattn: sink_logits must have shape (nheads,) = (%d,), got %s"
                         % (heads_q, tuple(shape)))


def lse_shape(varlen, batch, seqlen_q, heads_q, total_q):
    return (heads_q, total_q) if varlen else (batch, heads_q, seqlen_q)


def _set_strides(p, prefix, view, varlen):
    if varlen:
        row, head = view.strides[0], view.strides[1]
        batch = 0
    else:
        batch, row, head = view.strides[0], view.strides[1], view.strides[2]
    setattr(p, prefix + "_batch_stride", batch)
    setattr(p, prefix + "_row_stride", row)
    setattr(p, prefix + "_head_stride", head)


def make_params(device, dtype, q, k, v, o, lse_ptr, batch, seqlen_q, seqlen_k, opts,
                cu_seqlens_q_ptr=None, cu_seqlens_k_ptr=None, alibi_ptr=None,
                alibi_batch_stride=0, sink_ptr=None, stream=None):
    """FaParams for a forward call. q, k, v, o are Views; in varlen, seqlen_q / seqlen_k are the
    maximum lengths and the Views' first extent gives total_q / total_k."""
    varlen = cu_seqlens_q_ptr is not None
    p = _lib.FaParams()
    p.device = device
    p.dtype = dtype
    p.batch = batch
    p.seqlen_q = seqlen_q
    p.seqlen_k = seqlen_k
    p.heads_q = q.shape[-2]
    p.heads_kv = k.shape[-2]
    p.head_dim = q.shape[-1]
    p.head_dim_v = v.shape[-1]
    p.q, p.k, p.v, p.o, p.lse = q.ptr, k.ptr, v.ptr, o.ptr, lse_ptr
    for prefix, view in (("q", q), ("k", k), ("v", v), ("o", o)):
        _set_strides(p, prefix, view, varlen)
    if varlen:
        p.cu_seqlens_q = cu_seqlens_q_ptr
        p.cu_seqlens_k = cu_seqlens_k_ptr
        p.total_q = q.shape[0]
        p.total_k = k.shape[0]
        p.zero_varlen_tail = 1  # rows past the last sequence: zeros, from the library
    p.softmax_scale = opts.softmax_scale
    p.causal = int(opts.causal)
    p.use_window = opts.use_window
    p.window_left = opts.window_left
    p.window_right = opts.window_right
    p.softcap = opts.softcap
    p.alibi_slopes = alibi_ptr
    p.alibi_batch_stride = alibi_batch_stride
    p.sink_logits = sink_ptr
    p.deterministic = int(opts.deterministic)
    p.num_threads = _num_threads
    p.stream = stream
    return p


def set_backward(p, dout, dq, dk, dv, dsink_ptr):
    """Add the backward tensors (Views) to a forward FaParams."""
    varlen = bool(p.cu_seqlens_q)
    p.dout, p.dq, p.dk, p.dv, p.dsink = dout.ptr, dq.ptr, dk.ptr, dv.ptr, dsink_ptr
    for prefix, view in (("do", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        _set_strides(p, prefix, view, varlen)
