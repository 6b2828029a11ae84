"""The flash_attn 2.x functions, with the same names, arguments, defaults and return values.

Each takes PyTorch tensors (CPU or CUDA; autograd through our backward) or NumPy arrays (CPU,
forward only: use `flash_attn_backward` for gradients). Layout (batch, seqlen, nheads, headdim);
varlen layout (total_tokens, nheads, headdim) with int32 cu_seqlens of shape (batch + 1,).

Additions to the flash_attn signatures (keyword-only, after all of flash_attn's arguments):
  sink_logits: (nheads,) learnable per-head sink logits joining every row's softmax denominator
               (gpt-oss style); the gradient flows to it.
Dropout (dropout_p > 0, torch tensors on the CPU or CUDA): as FlashAttention, each attention
weight is dropped with probability
p = round(dropout_p · 256) / 256 (8-bit random numbers, as FlashAttention-2: dropout_p is
quantised to 1/256) and the kept ones are scaled by 1 / (1 - p), so the expectation is exact;
softmax_lse is not affected. The
mask comes from a counter-based generator (Philox4x32-7, one call per sixteen keys) whose seed
is drawn from torch's
default CPU generator on every call (the counter offset stays 0: each call has its own seed), so
torch.manual_seed reproduces a run; the backward
regenerates the same mask. CPU and CUDA draw the same mask from the same seed, so a run moves
between devices bit for bit. return_attn_probs=True with dropout returns S_dmask: the softmax
probabilities (batch, nheads, seqlen_q, seqlen_k) (varlen: the max seqlens; flash_attn rounds
them up to multiples of 128), negated where dropout dropped the element (for tests, small
sizes). NumPy arrays take no dropout.
flash_attn_varlen_func takes block_table (a paged KV cache, chunked prefill; forward only) and
flash_attn_with_kvcache paged caches with any page size.
attn_bias (flash_attn_func, flash_attn_varlen_func; torch tensors, CPU or CUDA): an additive score
bias broadcastable to (batch, nheads, seqlen_q, seqlen_k) with its gradient through autograd.
"""

import os

from . import _core

_torch = _torch_impl = None
if not os.environ.get("FLASHATTN_NO_TORCH"):
    try:
        import torch as _torch
        from . import _torch_impl
    except ImportError:  # NumPy-only installs
        _torch = _torch_impl = None


def _is_torch(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


def _numpy_impl():
    from . import _numpy_impl as impl
    return impl


def _reject_torch_mix(*tensors):
    for t in tensors:
        if _is_torch(t):
            raise TypeError("flashattn: mixing NumPy arrays and torch tensors in one call; pass "
                            "all tensors as torch.Tensor or all as NumPy arrays")


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
               causal, window_size, softcap, alibi_slopes, sink_logits, deterministic,
               dropout_p=0.0, return_attn_probs=False, block_table=None, attn_bias=None,
               descales=(None, None, None), rng_state=None):
    """(out, lse, S_dmask or None). rng_state: the dropout state to use (torch tensors with
    dropout_p > 0; drawn from torch's generator when None)."""
    dropout_p = _core.check_dropout(dropout_p)
    if _is_torch(q) and _torch_impl.is_fp8(q.dtype):
        if dropout_p > 0 or block_table is not None or attn_bias is not None:
            raise NotImplementedError("flashattn: fp8 inputs take no dropout, block_table or "
                                      "attn_bias")
        out, lse = _torch_impl.fp8_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, softmax_scale, causal, window_size,
                                           softcap, alibi_slopes, sink_logits, *descales)
        return out, lse, None
    if any(d is not None for d in descales):
        raise TypeError("flashattn: q_descale / k_descale / v_descale need float8_e4m3fn q, k, v")
    if attn_bias is not None:
        if not _is_torch(q):
            raise NotImplementedError("flashattn: attn_bias needs torch tensors")
        if dropout_p > 0 or block_table is not None:
            raise NotImplementedError("flashattn: attn_bias with %s is not supported"
                                      % ("dropout_p > 0" if dropout_p > 0 else "block_table"))
        from . import _mods_impl
        out, lse = _mods_impl.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, softmax_scale, causal, window_size, softcap,
                                        alibi_slopes, sink_logits, deterministic, attn_bias=attn_bias)
        return out, lse, None
    if _is_torch(q):
        if dropout_p > 0 and rng_state is None:
            rng_state = _torch_impl._philox_state()
        if block_table is not None:
            out, lse = _torch_impl.paged_attention(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
                softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                dropout_p, rng_state)
            return out, lse, None
        want_probs = return_attn_probs and dropout_p > 0
        scalars = [] if want_probs else None
        out, lse = _torch_impl.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                         max_seqlen_k, softmax_scale, causal, window_size,
                                         softcap, alibi_slopes, sink_logits, deterministic,
                                         dropout_p, rng_state, scalars)
        s_dmask = None
        if want_probs:
            s_dmask = _torch_impl.attn_probs(q.detach(), k.detach(), v.detach(), *scalars,
                                             dropout_p, rng_state)
        return out, lse, s_dmask
    _reject_torch_mix(k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits, block_table)
    if dropout_p > 0 or block_table is not None:
        raise NotImplementedError("flashattn: %s with NumPy arrays: pass torch tensors"
                                  % ("dropout_p > 0" if dropout_p > 0 else "block_table"))
    out, lse = _numpy_impl().forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, softmax_scale, causal, window_size, softcap,
                                     alibi_slopes, sink_logits)
    return out, lse, None


def _result(result, return_attn_probs):
    # flash_attn returns (out, softmax_lse, S_dmask); S_dmask only exists with dropout.
    out, lse, s_dmask = result
    return (out, lse, s_dmask) if return_attn_probs else out


def _unpack(packed, name, axis, count, rank, layout):
    shape = tuple(packed.shape)
    if len(shape) != rank or shape[axis] != count:
        raise ValueError("flashattn: %s must have shape %s, got %s" % (name, layout, shape))
    index = (slice(None),) * axis
    return [packed[index + (i,)] for i in range(count)]


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, sink_logits=None, attn_bias=None,
                    q_descale=None, k_descale=None, v_descale=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over k (batch, seqlen_k, nheads_k,
    headdim) and v (batch, seqlen_k, nheads_k, headdim_v); nheads a multiple of nheads_k (GQA/MQA:
    query head h uses kv head h // (nheads // nheads_k)).

    softmax_scale: default 1/sqrt(headdim). causal: mask aligned to the bottom-right corner.
    window_size (left, right): query i sees keys [i + sk - sq - left, i + sk - sq + right];
    -1 is unbounded. softcap > 0: scores become softcap·tanh(scores/softcap). alibi_slopes:
    (nheads,) or (batch, nheads) fp32, bias -slope·|i + sk - sq - j|. deterministic: bitwise
    reproducible backward. sink_logits: (nheads,) per-head sink logits.
    dropout_p: attention dropout (torch tensors, CPU or CUDA; see the module docstring): the mask's
    seed is drawn from torch's default generator, so torch.manual_seed reproduces the call.
    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse, S_dmask) with
    return_attn_probs; softmax_lse is (batch, nheads, seqlen_q) fp32 (natural log); S_dmask is
    None without dropout, else (batch, nheads, seqlen_q, seqlen_k) in q's dtype: the softmax
    probabilities, negated where dropout dropped the element (S_dmask >= 0 is the kept mask).
    attn_bias: a float32 / float16 / bfloat16 tensor broadcastable to (batch, nheads, seqlen_q,
    seqlen_k), added to the scores after softcap (-inf masks); its gradient is returned by
    autograd reduced to attn_bias's own shape. CPU and CUDA tensors.
    q, k, v in torch.float8_e4m3fn (CPU tensors, or CUDA tensors on sm_90; no autograd, the
    gradients through flash_attn_backward with the same descales): the values attended are
    q_descale[b, h // (nheads // nheads_k)]·q, k_descale[b, hk]·k and v_descale[b, hk]·v
    (FlashAttention-3's (batch, nheads_k) float32 factors; None = 1), and out is bfloat16.
    """
    result = _attention(q, k, v, None, None, None, None, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, sink_logits, deterministic, dropout_p, return_attn_probs,
                          attn_bias=attn_bias, descales=(q_descale, k_descale, v_descale))
    return _result(result, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, sink_logits=None,
                              q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim), read in place by strides
    (float8_e4m3fn qkv with the descale factors as in flash_attn_func)."""
    q, k, v = _unpack(qkv, "qkv", 2, 3, 5, "(batch, seqlen, 3, nheads, headdim)")
    result = _attention(q, k, v, None, None, None, None, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, sink_logits, deterministic, dropout_p, return_attn_probs,
                          descales=(q_descale, k_descale, v_descale))
    return _result(result, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, sink_logits=None,
                             q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim) (float8_e4m3fn q and kv
    with the descale factors as in flash_attn_func)."""
    k, v = _unpack(kv, "kv", 2, 2, 5, "(batch, seqlen_k, 2, nheads_k, headdim)")
    result = _attention(q, k, v, None, None, None, None, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, sink_logits, deterministic, dropout_p, return_attn_probs,
                          descales=(q_descale, k_descale, v_descale))
    return _result(result, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, sink_logits=None,
                           attn_bias=None, q_descale=None, k_descale=None, v_descale=None):
    """Variable-length attention: q (total_q, nheads, headdim), k (total_k, nheads_k, headdim),
    v (total_k, nheads_k, headdim_v); sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1]-1.
    max_seqlen_q/k: the longest sequence (an upper bound is fine). Masks are per sequence.
    block_table (batch, max_blocks) int32: k and v are a paged KV cache (num_blocks,
    page_block_size, nheads_k, headdim[_v]), any page size; key t of sequence b is row
    t % page_block_size of block block_table[b, t // page_block_size], and cu_seqlens_k gives
    the key lengths (chunked prefill; forward only: no gradients flow into the cache).
    dropout_p / return_attn_probs as in flash_attn_func (S_dmask (batch, nheads, max_seqlen_q,
    max_seqlen_k)). Returns out (total_q, nheads, headdim_v), or (out, softmax_lse (nheads,
    total_q), S_dmask).
    attn_bias: as in flash_attn_func, broadcastable to (batch, nheads, max_seqlen_q,
    max_seqlen_k) and indexed by positions within each sequence (flash_attn's padded layout).
    q_descale / k_descale / v_descale: float8_e4m3fn q, k, v as in flash_attn_func, (batch,
    nheads_k) with batch = len(cu_seqlens_q) - 1 (not with block_table).
    """
    result = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                          deterministic, dropout_p, return_attn_probs, block_table,
                          attn_bias=attn_bias, descales=(q_descale, k_descale, v_descale))
    return _result(result, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, sink_logits=None,
                                     q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim) and one cu_seqlens (float8_e4m3fn
    qkv with the descale factors as in flash_attn_varlen_func)."""
    q, k, v = _unpack(qkv, "qkv", 1, 3, 4, "(total, 3, nheads, headdim)")
    result = _attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale,
                          causal, window_size, softcap, alibi_slopes, sink_logits, deterministic, dropout_p, return_attn_probs,
                          descales=(q_descale, k_descale, v_descale))
    return _result(result, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, sink_logits=None,
                                    q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim) (float8_e4m3fn q and kv with
    the descale factors as in flash_attn_varlen_func)."""
    k, v = _unpack(kv, "kv", 1, 2, 4, "(total_k, 2, nheads_k, headdim)")
    result = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                          deterministic, dropout_p, return_attn_probs,
                          descales=(q_descale, k_descale, v_descale))
    return _result(result, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            sink_logits=None, k_scale=None, v_scale=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over a KV cache, for decoding: if k and
    v (batch, seqlen_new, nheads_k, headdim / headdim_v; seqlen_new may differ from seqlen_q) are
    given they are first written into the cache in place at cache_seqlens (k rotated when
    rotary_cos / rotary_sin are given, as q is), then q attends to the cache_seqlens (+
    seqlen_new) valid keys of its sequence, from cache_leftpad on; the queries are the last
    seqlen_q of those keys for causal / window masks (bottom-right aligned).
    Rotary positions are cache slots, left padding included (flash_attn 2.x): new key t at
    cache_seqlens + t; query i at cache_seqlens + i when causal or windowed, else every query at
    cache_seqlens. On CUDA, head dims that are not a multiple of 8 are taken as they are: the
    library pads copies of q and the caches in its workspace and appends into the caches in
    place.

    k_cache / v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or with block_table
    (batch, max_blocks) int32 a paged pool (num_blocks, page_block_size, nheads_k, headdim[_v])
    with any page size. cache_seqlens: int or (batch,) int32 (default: the whole cache).
    cache_batch_idx: (batch,) rows of a contiguous cache. cache_leftpad: (batch,) first valid
    slot. rotary_cos / rotary_sin: (seqlen_ro, rotary_dim / 2); rotary_interleaved pairs (0, 1),
    (2, 3), .. else (i, i + rotary_dim / 2). causal aligns the new tokens to the end of the cache;
    window_size, softcap, alibi_slopes and sink_logits as in flash_attn_func. num_splits: split-KV
    (0 = heuristic, 1 = none, n = at most n). Returns out (batch, seqlen, nheads, headdim_v), or
    (out, softmax_lse (batch, nheads, seqlen)) with return_softmax_lse. No autograd.

    Quantised caches (the library's own, not flash_attn's; no rotary): k_cache / v_cache in int8
    with k_scale / v_scale float32 (batch_cache or num_blocks, seqlen_cache or page_block_size,
    nheads_k), one scale per token and head (x = scale · int8); in float8_e4m3fn with k_scale /
    v_scale float32 (nheads_k,); or uint8 rows of llama.cpp Q8_0 blocks (headdim / 32 blocks of 34
    bytes: an f16 scale, then 32 int8). New k / v stay in q's dtype: the append quantises them
    (int8 and Q8_0 writing their scales).
    """
    from . import _kvcache

    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
            rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse, sink_logits, k_scale,
            v_scale)
    if _is_torch(q):
        return _kvcache.torch_with_kvcache(*args)
    _reject_torch_mix(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sink_logits, k_scale,
                      v_scale)
    return _kvcache.numpy_with_kvcache(*args)


def flash_attn_forward(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                       softcap=0.0, alibi_slopes=None, *, sink_logits=None):
    """Forward pass returning (out, softmax_lse), batched or (with cu_seqlens) varlen. With
    torch tensors this is the autograd-aware op (the lse output is not differentiable)."""
    out, lse, _ = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                      False)
    return out, lse


def flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None,
                        max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, *, sink_logits=None, q_descale=None,
                        k_descale=None, v_descale=None, dout_descale=None):
    """Explicit backward pass (NumPy arrays or torch tensors, no autograd): gradients of the
    attention with the given options, from dout (shaped like out) and the forward's out and
    softmax_lse. Returns (dq, dk, dv), or (dq, dk, dv, dsink) when sink_logits is given; dk/dv
    are summed over the query heads that share a kv head.

    float8_e4m3fn q, k, v (torch tensors) take the fp8 forward's descale factors, its bfloat16
    out, and dout in bfloat16 or float8_e4m3fn (with dout_descale, (batch, nheads_k) float32 like
    q_descale); the gradients come back in bfloat16."""
    if _is_torch(q) and _torch_impl.is_fp8(q.dtype):
        result = _torch_impl.fp8_backward(
            dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
            deterministic, q_descale, k_descale, v_descale, dout_descale)
        return result if sink_logits is not None else result[:3]
    if any(d is not None for d in (q_descale, k_descale, v_descale, dout_descale)):
        raise TypeError("flashattn: q_descale / k_descale / v_descale / dout_descale need "
                        "float8_e4m3fn q, k, v")
    if _is_torch(q):
        result = _torch_impl.attention_backward(
            dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
            deterministic)
    else:
        _reject_torch_mix(dout, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                          sink_logits)
        result = _numpy_impl().backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q,
                                        cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                        causal, window_size, softcap, alibi_slopes, sink_logits,
                                        deterministic)
    return result if sink_logits is not None else result[:3]


# ---- flash_attn 2.8's internal entry points --------------------------------------------------
# Libraries built on flash_attn (ring and context-parallel attention, sink-attention wrappers)
# call these directly: the same names, positional arguments and return values. No autograd; the
# backward writes into the caller's dq / dk / dv.


def _private_inputs(name, *tensors):
    if _torch is None or not all(t is None or isinstance(t, _torch.Tensor) for t in tensors):
        raise TypeError("flashattn: %s takes torch tensors (as flash_attn's does)" % name)


def _rng_state_out(q, rng_state):
    """flash_attn's rng_state output: int64 (2,) on q's device ((seed, offset); zeros without
    dropout)."""
    state = rng_state if rng_state is not None else _torch.zeros(2, dtype=_torch.int64)
    return state.to(q.device)


def _private_forward(name, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                     softcap, alibi_slopes, return_softmax, block_table=None):
    _private_inputs(name, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, block_table)
    dropout_p = _core.check_dropout(dropout_p)
    rng_state = _torch_impl._philox_state() if dropout_p > 0 else None
    with _torch.no_grad():
        out, lse, s_dmask = _attention(
            q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, softmax_scale, causal, (window_size_left, window_size_right), softcap,
            alibi_slopes, None, False, dropout_p, bool(return_softmax), block_table,
            rng_state=rng_state)
    if s_dmask is None:
        s_dmask = _torch.empty((0,), dtype=q.dtype, device=q.device)
    return out, lse, s_dmask, _rng_state_out(q, rng_state)


def _softmax_d(dout, out, cu_seqlens_q):
    """flash_attn's softmax_d output: D = rowsum(dout ∘ out) in fp32, (batch, nheads,
    seqlen_q rounded up to 128) or, varlen, (nheads, total_q + 128 · batch) with packed row t at
    column t; the padding columns are zero."""
    d = (dout.float() * out.float()).sum(-1)
    if cu_seqlens_q is None:
        b, sq, h = d.shape
        full = _torch.zeros(b, h, (sq + 127) // 128 * 128, dtype=_torch.float32, device=d.device)
        full[:, :, :sq] = d.transpose(1, 2)
    else:
        total, h = d.shape
        full = _torch.zeros(h, total + 128 * (cu_seqlens_q.numel() - 1), dtype=_torch.float32,
                            device=d.device)
        full[:, :total] = d.t()
    return full


def _private_backward(name, dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                      cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                      window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
                      rng_state):
    _private_inputs(name, dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                    alibi_slopes, rng_state)
    if _torch_impl.is_fp8(q.dtype):
        raise NotImplementedError("flashattn: %s on float8_e4m3fn inputs: use "
                                  "flash_attn_backward with the descale factors" % name)
    with _torch.no_grad():
        grads = _torch_impl.attention_backward(
            dout, q.detach(), k.detach(), v.detach(), out.detach(), softmax_lse, cu_seqlens_q,
            cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            (window_size_left, window_size_right), softcap, alibi_slopes, None, deterministic,
            dropout_p, rng_state)
        pairs = [(dst, g, what) for dst, g, what in ((dq, grads[0], "dq"), (dk, grads[1], "dk"),
                                                      (dv, grads[2], "dv")) if dst is not None]
        for dst, g, what in pairs:  # every buffer checked before any is written
            if dst.shape != g.shape or dst.dtype != g.dtype:
                raise ValueError("flashattn: %s: %s has shape %s and dtype %s, the gradient %s %s"
                                 % (name, what, tuple(dst.shape), dst.dtype, tuple(g.shape),
                                    g.dtype))
        for dst, g, _ in pairs:
            dst.copy_(g)
        return _softmax_d(dout, out, cu_seqlens_q)


def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left=-1,
                        window_size_right=-1, softcap=0.0, alibi_slopes=None,
                        return_softmax=False):
    """flash_attn 2.8's internal forward: (out, softmax_lse, S_dmask, rng_state). S_dmask is an
    empty tensor unless return_softmax and dropout_p > 0; rng_state (int64 (2,), q's device)
    regenerates the dropout mask in _flash_attn_backward."""
    return _private_forward("_flash_attn_forward", q, k, v, None, None, None, None, dropout_p,
                            softmax_scale, causal, window_size_left, window_size_right, softcap,
                            alibi_slopes, return_softmax)


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p, softmax_scale, causal, window_size_left=-1,
                               window_size_right=-1, softcap=0.0, alibi_slopes=None,
                               return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None):
    """flash_attn 2.8's internal varlen forward (block_table: a paged KV cache, as
    flash_attn_varlen_func takes it); leftpad_k and seqused_k are not supported."""
    if leftpad_k is not None or seqused_k is not None:
        raise NotImplementedError("flashattn: _flash_attn_varlen_forward with %s is not supported"
                                  % ("leftpad_k" if leftpad_k is not None else "seqused_k"))
    return _private_forward("_flash_attn_varlen_forward", q, k, v, cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                            window_size_left, window_size_right, softcap, alibi_slopes,
                            return_softmax, block_table)


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, alibi_slopes,
                         deterministic, rng_state=None):
    """flash_attn 2.8's internal backward: writes the gradients into dq, dk, dv (each may be None:
    not written) and returns softmax_d (_softmax_d). With dropout, rng_state is the forward's."""
    return _private_backward("_flash_attn_backward", dout, q, k, v, out, softmax_lse, dq, dk, dv,
                             None, None, None, None, dropout_p, softmax_scale, causal,
                             window_size_left, window_size_right, softcap, alibi_slopes,
                             deterministic, rng_state)


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False):
    """flash_attn 2.8's internal varlen backward (as _flash_attn_backward; zero_tensors is
    accepted and has no effect: every gradient element is written)."""
    return _private_backward("_flash_attn_varlen_backward", dout, q, k, v, out, softmax_lse, dq,
                             dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p, softmax_scale, causal, window_size_left,
                             window_size_right, softcap, alibi_slopes, deterministic, rng_state)


# flash_attn 2.8 names the torch.library wrappers of the same functions _wrapped_*.
_wrapped_flash_attn_forward = _flash_attn_forward
_wrapped_flash_attn_varlen_forward = _flash_attn_varlen_forward
_wrapped_flash_attn_backward = _flash_attn_backward
_wrapped_flash_attn_varlen_backward = _flash_attn_varlen_backward
