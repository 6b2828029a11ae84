"""The PyTorch path: two custom ops (`flashattn::fwd`, `flashattn::bwd`) registered with
torch.library, with fake (meta) implementations for torch.compile and an autograd formula that
calls our backward. That is what torch.compile traces. In eager mode the public functions skip
the dispatcher: they call the ops' Python bodies directly, through a torch.autograd.Function
when a gradient is needed (same results; the dispatcher and the generated autograd wrapper cost
about 150 us per forward+backward, which decides the speed of small models). The ops run on CPU tensors (any dtype the CPU path takes: fp32, fp16, bf16)
and CUDA tensors (fp16, bf16) on the current stream of the tensors' device.

Inside an op, a tensor is passed by address and strides; only a tensor whose last dimension is
not contiguous is copied. On CUDA, head dims that are not a multiple of 8 are zero-padded to the
next multiple (the GPU forward and backward kernels need it; a padded copy costs little next to
the attention) and the result is sliced back; the default softmax scale is computed from the
unpadded head dim before that. (flash_attn_with_kvcache leaves that to the library, which must
append into the caller's caches in place.)
"""

import contextlib
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import _core, _lib

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_autograd"):
    raise ImportError("flashattn needs torch >= 2.4 (torch.library.custom_op); found torch %s"
                      % torch.__version__)

_DTYPES = {
    torch.float32: _lib.FA_DTYPE_F32,
    torch.float16: _lib.FA_DTYPE_F16,
    torch.bfloat16: _lib.FA_DTYPE_BF16,
}
_FP8 = getattr(torch, "float8_e4m3fn", None)  # q, k, v of fp8_forward only


def is_fp8(dtype):
    return _FP8 is not None and dtype == _FP8

_empty_cache = {}  # device -> small tensor whose address stands in for empty tensors


def dtype_code(dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError("flashattn: unsupported dtype %s (use torch.float16 or torch.bfloat16; "
                        "torch.float32 on the CPU)" % dtype) from None


def _address(t):
    """data_ptr, or a valid placeholder for an empty tensor (the library rejects NULL even
    where it reads nothing)."""
    if t.numel() > 0:
        return t.data_ptr()
    holder = _empty_cache.get(t.device)
    if holder is None:
        holder = torch.empty(64, dtype=torch.uint8, device=t.device)
        _empty_cache[t.device] = holder
    return holder.data_ptr()


def _contig_last(t):
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _view(t):
    strides = list(t.stride())
    strides[-1] = 1
    return _core.View(_address(t), t.shape, strides)


# torch's own fast accessors (what torch.compile's generated code calls), when this torch has them.
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_raw_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _current_stream(t):
    """The cudaStream_t (as an int) of the current stream of CUDA tensor t's device."""
    if _raw_current_stream is not None:
        return _raw_current_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _device_and_stream(t):
    if t.is_cuda:
        return _lib.FA_DEVICE_CUDA, _current_stream(t)
    if t.device.type == "cpu":
        return _lib.FA_DEVICE_CPU, None
    raise ValueError("flashattn: tensors on device %s are not supported (cpu or cuda)" % t.device)


def _pad_last(t, multiple):
    rem = t.shape[-1] % multiple
    return t if rem == 0 else F.pad(t, (0, multiple - rem))


def _needs_padding(q, v):
    return q.is_cuda and (q.shape[-1] % 8 != 0 or v.shape[-1] % 8 != 0)


class _Geometry:
    def __init__(self, q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
        self.varlen = cu_seqlens_q is not None
        if self.varlen:
            self.batch = cu_seqlens_q.shape[0] - 1
            self.seqlen_q, self.seqlen_k = max_seqlen_q, max_seqlen_k
        else:
            self.batch = q.shape[0]
            self.seqlen_q, self.seqlen_k = q.shape[1], k.shape[1]
        self.hq, self.dv = q.shape[-2], v.shape[-1]
        self.out_shape = tuple(q.shape[:-1]) + (self.dv,)
        self.lse_shape = _core.lse_shape(self.varlen, self.batch, self.seqlen_q, self.hq,
                                         q.shape[0])

    def alloc(self, shape, dtype, device):
        # varlen: the library zeroes the rows past the last sequence (zero_varlen_tail); a call
        # without sequences is not made
        maker = torch.zeros if self.varlen and self.batch == 0 else torch.empty
        return maker(*shape, dtype=dtype, device=device)  # ints, not a tuple: faster to parse


def _params(q, k, v, o, lse, geo, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
            window_left, window_right, softcap, alibi_slopes, sink_logits, deterministic):
    device, stream = _device_and_stream(q)
    opts = _core.Options(q.shape[-1], softmax_scale, causal, (window_left, window_right), softcap,
                         deterministic)
    extra = {}
    if geo.varlen:
        extra["cu_seqlens_q_ptr"] = cu_seqlens_q.data_ptr()
        extra["cu_seqlens_k_ptr"] = cu_seqlens_k.data_ptr()
    if alibi_slopes is not None:
        extra["alibi_ptr"] = alibi_slopes.data_ptr()
        extra["alibi_batch_stride"] = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    if sink_logits is not None:
        extra["sink_ptr"] = sink_logits.data_ptr()
    dtype = _lib.FA_DTYPE_FP8_E4M3 if is_fp8(q.dtype) else dtype_code(q.dtype)
    return _core.make_params(device, dtype, _view(q), _view(k), _view(v), _view(o),
                             _address(lse), geo.batch, geo.seqlen_q, geo.seqlen_k, opts,
                             stream=stream, **extra)


def _philox_state():
    """A fresh dropout state, int64 [2] on the CPU (Philox seed, offset), drawn from torch's
    default CPU generator (which advances): torch.manual_seed reproduces the sequence of masks,
    and the backward regenerates a call's mask from the state saved with it."""
    state = torch.zeros(2, dtype=torch.int64)
    state[0] = torch.randint(0, 2**62, (1,), dtype=torch.int64)[0]
    return state


def _set_dropout(p, dropout_p, rng_state):
    """dropout fields of a FaParams (a plan template holds another call's seed: always set)."""
    if dropout_p:
        seed, offset = rng_state.tolist()
        p.dropout_p, p.dropout_seed, p.dropout_offset = dropout_p, seed, offset
    else:
        p.dropout_p, p.dropout_seed, p.dropout_offset = 0.0, 0, 0


def attn_probs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
               causal, window_left, window_right, softcap, alibi_slopes, sink_logits, dropout_p,
               rng_state):
    """flash_attn's S_dmask of a call (CPU or CUDA): the softmax probabilities (batch, nheads,
    seqlen_q, seqlen_k) in q's dtype, negated where dropout drops the element, from the library's
    attn_probs output (the forward runs once more with the same mask)."""
    with torch.no_grad():
        if _needs_padding(q, v):  # zero columns change no score (the scale is already fixed)
            q, k, v = _pad_last(q, 8), _pad_last(k, 8), _pad_last(v, 8)
        geo = _Geometry(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        q, k, v = _contig_last(q), _contig_last(k), _contig_last(v)
        out = torch.zeros(geo.out_shape, dtype=q.dtype, device=q.device)  # the call may not run
        lse = torch.zeros(geo.lse_shape, dtype=torch.float32, device=q.device)
        probs = torch.zeros(geo.batch, geo.hq, geo.seqlen_q, geo.seqlen_k, dtype=torch.float32,
                            device=q.device)
        if geo.batch > 0 and probs.numel() > 0:
            p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                        window_left, window_right, softcap, alibi_slopes, sink_logits, False)
            _set_dropout(p, dropout_p, rng_state)
            p.attn_probs = probs.data_ptr()
            with _guard(q):
                _lib.forward(p, _workspace_alloc(q))
        return probs.to(q.dtype)


def _dense_copies(err, *inputs):
    """After `err` from a call: dense copies of its inputs for one more try if err is
    FA_ERR_ALIGNMENT (an input's address or strides do not suit the device path's vector loads);
    any other error is raised again. The library writes nothing on error, so the retry starts
    clean."""
    if err.status != _lib.FA_ERR_ALIGNMENT:
        raise err
    return tuple(t.clone(memory_format=torch.contiguous_format) for t in inputs)


_allocators = {}  # device -> its `alloc` for _workspace_alloc (made once per device)


def _workspace_alloc(t):
    """For CUDA calls: the library's scratch from PyTorch's caching allocator on t's device (the
    current stream's pool, so reuse is ordered after the call), as _lib's `alloc` callback."""
    if not t.is_cuda:
        return None
    device = t.device
    alloc = _allocators.get(device)
    if alloc is None:
        def alloc(nbytes):
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            return buf, buf.data_ptr()
        _allocators[device] = alloc
    return alloc


def _needs_device_switch(t):
    """True if t is on a GPU that is not the current device (the library runs on the current
    device)."""
    if not t.is_cuda:
        return False
    return _raw_current_device is None or _raw_current_device() != t.get_device()


_NO_GUARD = contextlib.nullcontext()


def _guard(t):
    """Make t's GPU the current device for the call (the library runs on the current device);
    nothing to do when it already is, or on the CPU."""
    return torch.cuda.device(t.device) if _needs_device_switch(t) else _NO_GUARD


# ---- plans of the op bodies ------------------------------------------------------------------

# Per-signature plans of the two op bodies (see _core.PlanCache): a training step calls them with
# the same shapes and options layer after layer, so after the first call only the data pointers
# (and the stream) change. The keys hold every tensor's shape, strides, dtype and device and every
# scalar argument (the ops' schema makes them plain floats, ints and bools).
_fwd_plans = _core.PlanCache()
_bwd_plans = _core.PlanCache()


class _OpPlan:
    """What an op body derives from its call signature: the geometry, whether the head dims are
    padded (CUDA), the shape of the output it allocates, and after the first call with batch > 0
    the FaParams `template` (with `any_empty`: an input passed by address is empty and gets a
    placeholder, see _address) and `workspace_bytes` (see _lib._with_workspace)."""

    __slots__ = ("geo", "padded", "out_shape", "template", "any_empty", "workspace_bytes")

    def __init__(self, q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
        self.geo = _Geometry(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        self.padded = _needs_padding(q, v)
        dv = v.shape[-1]
        if self.padded:
            dv += -dv % 8
        self.out_shape = tuple(q.shape[:-1]) + (dv,)
        self.template = None
        self.any_empty = False
        self.workspace_bytes = None


def _sig(t):
    """A tensor's part of a plan key (None for an absent optional tensor)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _from_template(plan, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits):
    """For a plan hit: this call's own copy of the plan's FaParams with its data pointers (and
    stream). (A plan's first call, and a call without plans, builds its FaParams with _params.)"""
    p = _lib.FaParams.from_buffer_copy(plan.template)
    p.plan = plan
    if plan.any_empty:
        p.q, p.k, p.v = _address(q), _address(k), _address(v)
        p.o, p.lse = _address(o), _address(lse)
    else:
        p.q, p.k, p.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        p.o, p.lse = o.data_ptr(), lse.data_ptr()
    if cu_seqlens_q is not None:
        p.cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
    if alibi_slopes is not None:
        p.alibi_slopes = alibi_slopes.data_ptr()
    if sink_logits is not None:
        p.sink_logits = sink_logits.data_ptr()
    if q.is_cuda:
        p.stream = _current_stream(q)
    return p


def _any_empty(*tensors):
    for t in tensors:
        if 0 in t.shape:
            return True
    return False


# ---- forward op ---------------------------------------------------------------------------


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
              cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
              alibi_slopes: Optional[torch.Tensor], sink_logits: Optional[torch.Tensor],
              deterministic: bool, dropout_p: float = 0.0,
              rng_state: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """out [.., heads_q, head_dim_v] and lse (fp32). `deterministic` is unused here; it rides
    along so the autograd formula can see it. dropout_p > 0: the dropout mask of rng_state
    (int64 [2] on the CPU: Philox seed and offset, see _philox_state)."""
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           v.shape, v.stride(), v.dtype, v.device, _sig(cu_seqlens_q), _sig(cu_seqlens_k),
           max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
           _sig(alibi_slopes), _sig(sink_logits), dropout_p, _core._num_threads)
    plan = _fwd_plans.get(key)
    if plan is None:
        plan = _OpPlan(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        new = True
    else:
        new = False
    geo = plan.geo
    lse = geo.alloc(geo.lse_shape, torch.float32, q.device)
    q, k, v = _contig_last(q), _contig_last(k), _contig_last(v)
    if plan.padded:
        q, k, v = _pad_last(q, 8), _pad_last(k, 8), _pad_last(v, 8)
    out = geo.alloc(plan.out_shape, q.dtype, q.device)
    if geo.batch > 0:
        if new:
            p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                        window_left, window_right, softcap, alibi_slopes, sink_logits, False)
            p.num_threads = key[-1]  # the key's, should set_num_threads have run since (a thread)
            plan.template = _core.template_of(_lib.FaParams.from_buffer_copy(p))
            plan.any_empty = _any_empty(q, k, v, out, lse)
            p.plan = plan
        else:
            p = _from_template(plan, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                               sink_logits)
        _set_dropout(p, dropout_p, rng_state)
        with _guard(q):
            try:
                _lib.forward(p, _workspace_alloc(q))
            except _lib.FlashAttnValueError as err:
                q, k, v = _dense_copies(err, q, k, v)
                p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                            causal, window_left, window_right, softcap, alibi_slopes, sink_logits,
                            False)
                _set_dropout(p, dropout_p, rng_state)
                _lib.forward(p, _workspace_alloc(q))
    if new:
        _fwd_plans.put(key, plan)
    if plan.padded:
        out = out[..., :geo.dv].contiguous()
    return out, lse


fwd = torch.library.custom_op("flashattn::fwd", mutates_args=())(_fwd_impl)


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
              causal, window_left, window_right, softcap, alibi_slopes, sink_logits,
              deterministic, dropout_p=0.0, rng_state=None):
    geo = _Geometry(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    out = q.new_empty(geo.out_shape)
    lse = q.new_empty(geo.lse_shape, dtype=torch.float32)
    return out, lse


# ---- backward op --------------------------------------------------------------------------


def _bwd_impl(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
              cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
              alibi_slopes: Optional[torch.Tensor], sink_logits: Optional[torch.Tensor],
              deterministic: bool, dropout_p: float = 0.0, rng_state: Optional[torch.Tensor] = None
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (shaped like q, k, v) and dsink ([heads_q] fp32, or empty without sinks)."""
    key = (dout.shape, dout.stride(), dout.dtype, dout.device, q.shape, q.stride(), q.dtype,
           q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(), v.dtype,
           v.device, out.shape, out.stride(), out.dtype, out.device, _sig(lse),
           _sig(cu_seqlens_q), _sig(cu_seqlens_k), max_seqlen_q, max_seqlen_k, softmax_scale,
           causal, window_left, window_right, softcap, _sig(alibi_slopes), _sig(sink_logits),
           deterministic, dropout_p, _core._num_threads)
    plan = _bwd_plans.get(key)
    if plan is None:
        plan = _OpPlan(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        new = True
    else:
        new = False
    geo = plan.geo
    d, dv_dim = q.shape[-1], v.shape[-1]
    device = q.device
    dsink = torch.empty(geo.hq if sink_logits is not None else 0, dtype=torch.float32,
                        device=device)
    q, k, v = _contig_last(q), _contig_last(k), _contig_last(v)
    out, dout = _contig_last(out), _contig_last(dout)
    lse = lse.contiguous()
    if plan.padded:
        q, k, v, out, dout = (_pad_last(t, 8) for t in (q, k, v, out, dout))
    dq = geo.alloc(q.shape, q.dtype, device)
    dk = geo.alloc(k.shape, k.dtype, device)
    dv = geo.alloc(v.shape, v.dtype, device)
    if geo.batch > 0:
        dsink_ptr = _address(dsink) if sink_logits is not None else None
        if new:
            p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                        window_left, window_right, softcap, alibi_slopes, sink_logits,
                        deterministic)
            _core.set_backward(p, _view(dout), _view(dq), _view(dk), _view(dv), dsink_ptr)
            p.num_threads = key[-1]  # the key's, should set_num_threads have run since (a thread)
            plan.template = _core.template_of(_lib.FaParams.from_buffer_copy(p))
            plan.any_empty = _any_empty(q, k, v, out, lse, dout, dq, dk, dv)
            p.plan = plan
        else:
            p = _from_template(plan, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                               sink_logits)
            if plan.any_empty:
                p.dout, p.dq, p.dk, p.dv = _address(dout), _address(dq), _address(dk), _address(dv)
            else:
                p.dout, p.dq, p.dk, p.dv = (dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                            dv.data_ptr())
            p.dsink = dsink_ptr
        _set_dropout(p, dropout_p, rng_state)
        with _guard(q):
            try:
                _lib.backward(p, _workspace_alloc(q))
            except _lib.FlashAttnValueError as err:
                q, k, v, out, dout = _dense_copies(err, q, k, v, out, dout)
                p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                            causal, window_left, window_right, softcap, alibi_slopes, sink_logits,
                            deterministic)
                _core.set_backward(p, _view(dout), _view(dq), _view(dk), _view(dv), dsink_ptr)
                _set_dropout(p, dropout_p, rng_state)
                _lib.backward(p, _workspace_alloc(q))
    elif sink_logits is not None:
        dsink.zero_()
    if new:
        _bwd_plans.put(key, plan)
    if plan.padded:
        dq = dq[..., :d].contiguous()
        dk = dk[..., :d].contiguous()
        dv = dv[..., :dv_dim].contiguous()
    return dq, dk, dv, dsink


bwd = torch.library.custom_op("flashattn::bwd", mutates_args=())(_bwd_impl)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sink_logits,
              deterministic, dropout_p=0.0, rng_state=None):
    dsink = q.new_empty((q.shape[-2] if sink_logits is not None else 0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


# ---- autograd -----------------------------------------------------------------------------

_FWD_ARGS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
             "softmax_scale", "causal", "window_left", "window_right", "softcap", "alibi_slopes",
             "sink_logits", "deterministic", "dropout_p", "rng_state")


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, softcap, alibi, sink,
     deterministic) = inputs[:15]
    dropout_p = inputs[15] if len(inputs) > 15 else 0.0
    rng_state = inputs[16] if len(inputs) > 16 else None
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi, sink, rng_state)
    ctx.scalars = (max_q, max_k, scale, causal, wl, wr, softcap, deterministic, dropout_p)
    ctx.has_sink = sink is not None
    ctx.mark_non_differentiable(lse)


def _input_grads(ctx, grad_out, bwd):
    """The gradients of fwd's inputs (dq, dk, dv, dsink in their slots) through `bwd` (the op, or
    its body in eager mode)."""
    q, k, v, out, lse, cu_q, cu_k, alibi, sink, rng_state = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, softcap, deterministic, dropout_p = ctx.scalars
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsink = bwd(grad_out, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr,
                            softcap, alibi, sink, deterministic, dropout_p, rng_state)
    grads = [None] * len(_FWD_ARGS)
    grads[0], grads[1], grads[2] = dq, dk, dv
    if ctx.has_sink:
        grads[13] = dsink
    return tuple(grads)


def _backward(ctx, grad_out, grad_lse):
    return _input_grads(ctx, grad_out, torch.ops.flashattn.bwd)


fwd.register_autograd(_backward, setup_context=_setup_context)


class _AttentionFunction(torch.autograd.Function):
    """Eager-mode autograd: the same saved tensors and formula as the op's registered autograd
    (_setup_context, _backward), calling the ops' Python bodies directly."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _fwd_impl(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return _input_grads(ctx, grad_out, _bwd_impl)


try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # a torch without it: always take the dispatcher
    def _get_current_dispatch_mode():
        return True

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _use_ops(*tensors):
    """True when the call must go through the registered ops: while torch.compile traces (the ops
    must appear in the graph), under a dispatch mode (FakeTensorMode and the like), or for tensor
    subclasses (DTensor, ...), which all need the dispatcher and the ops' fake kernels."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return True
    return any(t is not None and type(t) not in _PLAIN_TENSOR_TYPES for t in tensors)


# ---- entry points used by the public functions ---------------------------------------------


def _check_tensor(name, t, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError("flashattn: %s must be a torch.Tensor like q, got %s"
                        % (name, type(t).__name__))
    if t.device != device:
        raise ValueError("flashattn: %s is on %s but q is on %s (all tensors must be on one "
                         "device)" % (name, t.device, device))


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  alibi_slopes, sink_logits):
    """Checks done in Python before the op (shapes, dtypes, devices); they depend only on the
    call signature. Returns max_seqlen_q, max_seqlen_k as the op takes them (0 without
    cu_seqlens)."""
    for name, t in (("k", k), ("v", v)):
        _check_tensor(name, t, q.device)
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError("flashattn: tensors on device %s are not supported (cpu or cuda)"
                         % q.device)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError("flashattn: q, k, v must have the same dtype, got %s, %s, %s"
                        % (q.dtype, k.dtype, v.dtype))
    if not is_fp8(q.dtype):  # fp8 reaches here from fp8_forward and fp8_backward only
        dtype_code(q.dtype)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("flashattn: give both cu_seqlens_q and cu_seqlens_k, or neither")
    batch, _, _, hq, _, _, _ = _core.check_qkv_shapes(q.shape, k.shape, v.shape, varlen)
    if varlen:
        _check_tensor("cu_seqlens_q", cu_seqlens_q, q.device)
        _check_tensor("cu_seqlens_k", cu_seqlens_k, q.device)
        batch = _core.check_cu_seqlens_shapes(cu_seqlens_q.shape, cu_seqlens_k.shape)
        if cu_seqlens_q.dtype.is_floating_point or cu_seqlens_k.dtype.is_floating_point:
            raise TypeError("flashattn: cu_seqlens must be integer tensors (torch.int32)")
        if max_seqlen_q is None or max_seqlen_k is None:
            raise TypeError("flashattn: max_seqlen_q and max_seqlen_k are required with "
                            "cu_seqlens")
        max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    else:
        max_seqlen_q = max_seqlen_k = 0
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, q.device)
        _core.check_alibi_shape(alibi_slopes.shape, batch, hq)
        if alibi_slopes.dtype != torch.float32:
            raise TypeError("flashattn: alibi_slopes must be torch.float32, got %s"
                            % alibi_slopes.dtype)
    if sink_logits is not None:
        _check_tensor("sink_logits", sink_logits, q.device)
        _core.check_sink_shape(sink_logits.shape, hq)
        if not sink_logits.dtype.is_floating_point:
            raise TypeError("flashattn: sink_logits must be a floating-point tensor")
    return max_seqlen_q, max_seqlen_k


def _convert_inputs(cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits):
    """The optional tensors (checked) as the op wants them: int32 contiguous cu_seqlens, fp32
    slopes and sinks; the tensor itself where it already is."""
    if cu_seqlens_q is not None:
        cu_seqlens_q = cu_seqlens_q.to(torch.int32).contiguous()
        cu_seqlens_k = cu_seqlens_k.to(torch.int32).contiguous()
    if alibi_slopes is not None:
        alibi_slopes = _contig_last(alibi_slopes)
    if sink_logits is not None:
        sink_logits = sink_logits.float().contiguous()
    return cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits


def _prepare_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    alibi_slopes, sink_logits):
    """_check_inputs, then the optional tensors converted as the op wants them."""
    max_seqlen_q, max_seqlen_k = _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                               max_seqlen_k, alibi_slopes, sink_logits)
    cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits = _convert_inputs(
        cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits)
    return cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, sink_logits


# attention(): per call signature (see _core.PlanCache), the op's scalar arguments as the
# signature's checks (which passed) and defaults made them.
_checked = _core.PlanCache()


def _attention_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                   deterministic):
    """The key of an attention() call in _checked, or None (a tensor subclass or a non-tensor
    where a tensor goes, an argument that is not a plain scalar): such calls are not cached."""
    plain = _PLAIN_TENSOR_TYPES
    if type(q) not in plain or type(k) not in plain or type(v) not in plain:
        return None
    window = _core.window_key(window_size)
    if window is None or not _core.plain_scalars(max_seqlen_q, max_seqlen_k, softmax_scale,
                                                 causal, softcap, deterministic):
        return None
    extras = None
    if not (cu_seqlens_q is None and cu_seqlens_k is None and alibi_slopes is None and
            sink_logits is None):
        extras = []
        for t in (cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits):
            if t is None:
                extras.append(None)
            elif type(t) in plain:
                extras.append((t.shape, t.stride(), t.dtype, t.device))
            else:
                return None
        extras = tuple(extras)
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device, extras, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window, softcap, deterministic)


def attention(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
              softcap=0.0, alibi_slopes=None, sink_logits=None, deterministic=False,
              dropout_p=0.0, rng_state=None, scalars_out=None):
    """(out, lse) through the autograd-aware op. dropout_p > 0 takes its mask from rng_state
    (_philox_state). scalars_out (a list): receives the op's checked scalar arguments."""
    dropout_p = float(dropout_p) if dropout_p else 0.0
    # While torch.compile traces, this runs once per graph and on fake tensors: no cache.
    compiling = torch.compiler.is_compiling()
    key = None if compiling else _attention_key(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size, softcap, alibi_slopes, sink_logits, deterministic)
    scalars = None if key is None else _checked.get(key)
    if scalars is None:
        max_seqlen_q, max_seqlen_k = _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                   max_seqlen_q, max_seqlen_k, alibi_slopes,
                                                   sink_logits)
        _, wl, wr = _core.window_fields(window_size)
        scalars = (max_seqlen_q, max_seqlen_k, _core.default_scale(q.shape[-1], softmax_scale),
                   bool(causal), wl, wr, _core.check_softcap(softcap), bool(deterministic))
        if key is not None:
            _checked.put(key, scalars)
    max_seqlen_q, max_seqlen_k, scale, causal, wl, wr, softcap, deterministic = scalars
    if not (cu_seqlens_q is None and alibi_slopes is None and sink_logits is None):
        cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits = _convert_inputs(
            cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits)
    if scalars_out is not None:
        scalars_out[:] = [cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
                          wl, wr, softcap, alibi_slopes, sink_logits]
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, wl,
            wr, softcap, alibi_slopes, sink_logits, deterministic, dropout_p,
            rng_state if dropout_p else None)
    # With a key every tensor is a plain one and nothing is being traced: only a dispatch mode
    # needs the ops.
    if _get_current_dispatch_mode() is not None if key is not None else \
            _use_ops(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits):
        return torch.ops.flashattn.fwd(*args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                    (sink_logits is not None and sink_logits.requires_grad)):
        return _AttentionFunction.apply(*args)
    return _fwd_impl(*args)


def _fp8_descales(geo, q, k, named):
    """The descale factors of (name, tensor or None) pairs as contiguous float32 on q's device,
    each checked to be (batch, nheads_k)."""
    out = []
    for name, t in named:
        if t is not None:
            if tuple(t.shape) != (geo.batch, k.shape[-2]):
                raise ValueError("flashattn: %s must have shape (batch, nheads_k) = (%d, %d), got %s"
                                 % (name, geo.batch, k.shape[-2], tuple(t.shape)))
            t = t.to(device=q.device, dtype=torch.float32).contiguous()
        out.append(t)
    return out


def fp8_forward(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                softcap=0.0, alibi_slopes=None, sink_logits=None, q_descale=None, k_descale=None,
                v_descale=None):
    """(out, lse) of float8_e4m3fn q, k, v with FlashAttention-3's descale factors ((batch,
    nheads_k) float32 each, or None = 1): out is bfloat16. Forward only (no autograd); CPU
    tensors, or CUDA tensors on an sm_90 GPU (H100 / H200: the Hopper fp8 kernel, P·V in e4m3
    as FlashAttention-3's)."""
    if not (is_fp8(k.dtype) and is_fp8(v.dtype)):
        raise TypeError("flashattn: fp8 q needs fp8 k and v (torch.float8_e4m3fn), got %s, %s"
                        % (k.dtype, v.dtype))
    if any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("flashattn: no backward for fp8 inputs")
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
     sink_logits) = _prepare_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, alibi_slopes, sink_logits)
    geo = _Geometry(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    q, k, v = _contig_last(q), _contig_last(k), _contig_last(v)
    out = geo.alloc(geo.out_shape, torch.bfloat16, q.device)
    lse = geo.alloc(geo.lse_shape, torch.float32, q.device)
    descales = _fp8_descales(geo, q, k, (("q_descale", q_descale), ("k_descale", k_descale),
                                         ("v_descale", v_descale)))
    if geo.batch > 0 and out.numel() > 0:
        _, wl, wr = _core.window_fields(window_size)
        p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k,
                    _core.default_scale(q.shape[-1], softmax_scale), causal, wl, wr,
                    _core.check_softcap(softcap), alibi_slopes, sink_logits, False)
        p.q_descale, p.k_descale, p.v_descale = (None if t is None else t.data_ptr() for t in descales)
        with _guard(q):
            _lib.forward(p, _workspace_alloc(q))
    return out, lse


def _check_backward_tensors(geo, q, dout, out, lse, wants):
    """dout and out on q's device, shaped as the forward output, with the dtypes of wants ((dtype,
    what the message says is expected) for dout, then out); lse float32 of the forward's shape."""
    for name, t, (want, expected) in (("dout", dout, wants[0]), ("out", out, wants[1])):
        _check_tensor(name, t, q.device)
        if tuple(t.shape) != geo.out_shape:
            raise ValueError("flashattn: %s must have shape %s (that of the forward output), "
                             "got %s" % (name, geo.out_shape, tuple(t.shape)))
        if t.dtype != want:
            raise TypeError("flashattn: %s has dtype %s but %s" % (name, t.dtype, expected))
    _check_tensor("lse", lse, q.device)
    if tuple(lse.shape) != geo.lse_shape or lse.dtype != torch.float32:
        raise ValueError("flashattn: lse must be float32 of shape %s, got %s %s"
                         % (geo.lse_shape, lse.dtype, tuple(lse.shape)))


def fp8_backward(dout, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                 max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                 softcap=0.0, alibi_slopes=None, sink_logits=None, deterministic=False,
                 q_descale=None, k_descale=None, v_descale=None, dout_descale=None):
    """(dq, dk, dv, dsink or None) in bfloat16 of float8_e4m3fn q, k, v (FlashAttention-3's
    descale factors), from fp8_forward's bfloat16 out and lse and a dout in bfloat16 or in
    float8_e4m3fn (then dout_descale · dout, (batch, nheads_k) float32 like q_descale, as cuDNN's
    fp8 backward takes dO). No autograd. On an sm_90 GPU with an e4m3 dout and head dims 65..128
    the score and dP products run on the e4m3 tensor cores."""
    if not (is_fp8(k.dtype) and is_fp8(v.dtype)):
        raise TypeError("flashattn: fp8 q needs fp8 k and v (torch.float8_e4m3fn), got %s, %s"
                        % (k.dtype, v.dtype))
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
     sink_logits) = _prepare_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, alibi_slopes, sink_logits)
    geo = _Geometry(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    dout_e4m3 = is_fp8(dout.dtype)
    _check_backward_tensors(geo, q, dout, out, lse,
                            ((dout.dtype if dout_e4m3 else torch.bfloat16,
                              "fp8 inputs take it in bfloat16 or float8_e4m3fn"),
                             (torch.bfloat16, "fp8 inputs take it in bfloat16")))
    if dout_descale is not None and not dout_e4m3:
        raise TypeError("flashattn: dout_descale needs a float8_e4m3fn dout")
    descales = _fp8_descales(geo, q, k, (("q_descale", q_descale), ("k_descale", k_descale),
                                         ("v_descale", v_descale), ("dout_descale", dout_descale)))
    q, k, v, out, dout = (_contig_last(t) for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    dq, dk, dv = (geo.alloc(t.shape, torch.bfloat16, q.device) for t in (q, k, v))
    dsink = torch.zeros(geo.hq if sink_logits is not None else 0, dtype=torch.float32,
                        device=q.device)
    if geo.batch > 0 and dq.numel() + dk.numel() > 0:
        _, wl, wr = _core.window_fields(window_size)
        p = _params(q, k, v, out, lse, geo, cu_seqlens_q, cu_seqlens_k,
                    _core.default_scale(q.shape[-1], softmax_scale), causal, wl, wr,
                    _core.check_softcap(softcap), alibi_slopes, sink_logits, bool(deterministic))
        _core.set_backward(p, _view(dout), _view(dq), _view(dk), _view(dv),
                           _address(dsink) if sink_logits is not None else None)
        p.q_descale, p.k_descale, p.v_descale, p.dout_descale = (
            None if t is None else t.data_ptr() for t in descales)
        p.dout_e4m3 = int(dout_e4m3)
        with _guard(q):
            _lib.backward(p, _workspace_alloc(q))
    return dq, dk, dv, (dsink if sink_logits is not None else None)


def attention_backward(dout, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=False,
                       window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink_logits=None,
                       deterministic=False, dropout_p=0.0, rng_state=None):
    """(dq, dk, dv, dsink or None) without autograd; dropout_p > 0 regenerates the mask of
    rng_state (_philox_state's int64 [2], any device)."""
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
     sink_logits) = _prepare_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, alibi_slopes, sink_logits)
    geo = _Geometry(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    same = (q.dtype, "q has %s" % q.dtype)
    _check_backward_tensors(geo, q, dout, out, lse, (same, same))
    _, wl, wr = _core.window_fields(window_size)
    scale = _core.default_scale(q.shape[-1], softmax_scale)
    dropout_p = _core.check_dropout(dropout_p)
    if dropout_p > 0:
        if not isinstance(rng_state, torch.Tensor) or rng_state.numel() != 2:
            raise ValueError("flashattn: dropout_p > 0 needs rng_state, the forward's int64 tensor "
                             "of 2 elements (seed, offset)")
        rng_state = rng_state.detach().to("cpu", torch.int64).reshape(2)
    args = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
            bool(causal), wl, wr, _core.check_softcap(softcap), alibi_slopes, sink_logits,
            bool(deterministic), dropout_p, rng_state if dropout_p > 0 else None)
    with torch.no_grad():
        use_ops = _use_ops(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits)
        dq, dk, dv, dsink = torch.ops.flashattn.bwd(*args) if use_ops else _bwd_impl(*args)
    return dq, dk, dv, (dsink if sink_logits is not None else None)


class _NoPagedBackward(torch.autograd.Function):
    """Marks the output of a paged-K/V call: there are no gradients into a page pool."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("flashattn: no backward through flash_attn_varlen_func with "
                                  "block_table (a paged KV cache is for inference; flash_attn has "
                                  "no such backward either)")


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    sink_logits, dropout_p, rng_state):
    """flash_attn_varlen_func with block_table (chunked prefill over a paged KV cache): q
    (total_q, nheads, d); k_cache / v_cache (num_blocks, page_block_size, nheads_k, d / dv);
    block_table (batch, max_blocks) int32; cu_seqlens_k gives the key lengths. Forward only.
    Returns (out, lse)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _check_tensor(name, t, q.device)
    if k_cache.dim() != 4 or v_cache.dim() != 4 or tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError("flashattn: with block_table, k and v must be page pools (num_blocks, "
                         "page_block_size, nheads_k, headdim), got %s / %s"
                         % (tuple(k_cache.shape), tuple(v_cache.shape)))
    if q.dim() != 3 or q.shape[-1] != k_cache.shape[-1]:
        raise ValueError("flashattn: q must be (total_q, nheads, headdim) with k's headdim, got %s"
                         % (tuple(q.shape),))
    if block_table.dim() != 2:
        raise ValueError("flashattn: block_table must be (batch, max_blocks), got %s"
                         % (tuple(block_table.shape),))
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError("flashattn: q, k, v must have the same dtype, got %s, %s, %s"
                        % (q.dtype, k_cache.dtype, v_cache.dtype))
    if _needs_padding(q, v_cache):
        # The CUDA forward takes head dims in multiples of 8: zero-padded copies (of the page
        # pools too, as flash_attn pads them), the output sliced back.
        dv = v_cache.shape[-1]
        with torch.no_grad():
            out, lse = paged_attention(
                _pad_last(q.detach(), 8), _pad_last(k_cache.detach(), 8),
                _pad_last(v_cache.detach(), 8), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, block_table, _core.default_scale(q.shape[-1], softmax_scale), causal,
                window_size, softcap, alibi_slopes, sink_logits, dropout_p, rng_state)
        out = out[..., :dv].contiguous()
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (q, k_cache, v_cache, sink_logits)):
            out = _NoPagedBackward.apply(out, q, k_cache, v_cache)
        return out, lse
    batch = _core.check_cu_seqlens_shapes(cu_seqlens_q.shape, cu_seqlens_k.shape)
    if block_table.shape[0] != batch:
        raise ValueError("flashattn: block_table has %d rows but cu_seqlens has batch %d"
                         % (block_table.shape[0], batch))
    hq = q.shape[1]
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, q.device)
        _core.check_alibi_shape(alibi_slopes.shape, batch, hq)
    if sink_logits is not None:
        _check_tensor("sink_logits", sink_logits, q.device)
        _core.check_sink_shape(sink_logits.shape, hq)
    cu_q, cu_k, alibi, sink = _convert_inputs(cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                                              sink_logits)
    table = block_table.to(torch.int32).contiguous()
    page_size = k_cache.shape[1]
    with torch.no_grad():
        qc = _contig_last(q.detach())
        kc, vc = _contig_last(k_cache.detach()), _contig_last(v_cache.detach())
        geo = _Geometry(qc, kc, vc, cu_q, int(max_seqlen_q), int(max_seqlen_k))
        out = geo.alloc(geo.out_shape, q.dtype, q.device)
        lse = geo.alloc(geo.lse_shape, torch.float32, q.device)
        if batch > 0:
            _, wl, wr = _core.window_fields(window_size)
            # k / v are described as varlen here (their batch stride is ignored); the page pool's
            # own strides follow
            p = _params(qc, kc[0], vc[0], out, lse, geo, cu_q, cu_k,
                        _core.default_scale(q.shape[-1], softmax_scale), bool(causal), wl, wr,
                        _core.check_softcap(softcap), alibi, sink, False)
            p.k = _address(kc)
            p.v = _address(vc)
            p.k_batch_stride, p.k_row_stride, p.k_head_stride = kc.stride()[:3]
            p.v_batch_stride, p.v_row_stride, p.v_head_stride = vc.stride()[:3]
            p.block_table = table.data_ptr()
            p.block_table_batch_stride = table.stride(0)
            p.page_size = page_size
            p.num_pages = k_cache.shape[0]
            p.total_k = 0
            _set_dropout(p, dropout_p, rng_state)
            with _guard(q):
                _lib.forward(p, _workspace_alloc(q))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (q, k_cache, v_cache, sink_logits)):
        out = _NoPagedBackward.apply(out, q, k_cache, v_cache)
    return out, lse
