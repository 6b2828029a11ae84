"""The flash_attn 2.x functions, with the same names, arguments, defaults and return values.

Each takes PyTorch tensors (CPU or CUDA; autograd through our backward) or NumPy arrays (CPU,
forward only: use `flash_attn_backward` for gradients). Layout (batch, seqlen, nheads, headdim);
varlen layout (total_tokens, nheads, headdim) with int32 cu_seqlens of shape (batch + 1,).

Additions to the flash_attn signatures (keyword-only, after all of flash_attn's arguments):
  sink_logits: (nheads,) learnable per-head sink logits joining every row's softmax denominator
               (gpt-oss style); the gradient flows to it.
Not supported: dropout_p > 0 and block_table in flash_attn_varlen_func (paged KV there) raise
NotImplementedError; flash_attn_with_kvcache takes paged caches (block_table) with any page size.
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
               causal, window_size, softcap, alibi_slopes, sink_logits, deterministic):
    if _is_torch(q):
        return _torch_impl.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k, softmax_scale, causal, window_size, softcap,
                                     alibi_slopes, sink_logits, deterministic)
    _reject_torch_mix(k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sink_logits)
    return _numpy_impl().forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 softmax_scale, causal, window_size, softcap, alibi_slopes,
                                 sink_logits)


def _result(out, lse, return_attn_probs):
    # flash_attn returns (out, softmax_lse, S_dmask); S_dmask only exists with dropout.
    return (out, lse, None) if return_attn_probs else out


def _unpack(packed, name, axis, count, rank, layout):
    shape = tuple(packed.shape)
    if len(shape) != rank or shape[axis] != count:
        raise ValueError("flashattn: %s must have shape %s, got %s" % (name, layout, shape))
    index = (slice(None),) * axis
    return [packed[index + (i,)] for i in range(count)]


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, sink_logits=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over k (batch, seqlen_k, nheads_k,
    headdim) and v (batch, seqlen_k, nheads_k, headdim_v); nheads a multiple of nheads_k (GQA/MQA:
    query head h uses kv head h // (nheads // nheads_k)).

    softmax_scale: default 1/sqrt(headdim). causal: mask aligned to the bottom-right corner.
    window_size (left, right): query i sees keys [i + sk - sq - left, i + sk - sq + right];
    -1 is unbounded. softcap > 0: scores become softcap·tanh(scores/softcap). alibi_slopes:
    (nheads,) or (batch, nheads) fp32, bias -slope·|i + sk - sq - j|. deterministic: bitwise
    reproducible backward. sink_logits: (nheads,) per-head sink logits.
    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse, None) with
    return_attn_probs; softmax_lse is (batch, nheads, seqlen_q) fp32 (natural log).
    """
    _core.check_dropout(dropout_p)
    out, lse = _attention(q, k, v, None, None, None, None, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, sink_logits, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, sink_logits=None):
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim), read in place by strides."""
    _core.check_dropout(dropout_p)
    q, k, v = _unpack(qkv, "qkv", 2, 3, 5, "(batch, seqlen, 3, nheads, headdim)")
    out, lse = _attention(q, k, v, None, None, None, None, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, sink_logits, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, sink_logits=None):
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    _core.check_dropout(dropout_p)
    k, v = _unpack(kv, "kv", 2, 2, 5, "(batch, seqlen_k, 2, nheads_k, headdim)")
    out, lse = _attention(q, k, v, None, None, None, None, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, sink_logits, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, sink_logits=None):
    """Variable-length attention: q (total_q, nheads, headdim), k (total_k, nheads_k, headdim),
    v (total_k, nheads_k, headdim_v); sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1]-1.
    max_seqlen_q/k: the longest sequence (an upper bound is fine). Masks are per sequence.
    Returns out (total_q, nheads, headdim_v), or (out, softmax_lse (nheads, total_q), None).
    """
    _core.check_dropout(dropout_p)
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table (paged KV cache) is not supported yet")
    out, lse = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                          deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, sink_logits=None):
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim) and one cu_seqlens."""
    _core.check_dropout(dropout_p)
    q, k, v = _unpack(qkv, "qkv", 1, 3, 4, "(total, 3, nheads, headdim)")
    out, lse = _attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale,
                          causal, window_size, softcap, alibi_slopes, sink_logits, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, sink_logits=None):
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim)."""
    _core.check_dropout(dropout_p)
    k, v = _unpack(kv, "kv", 1, 2, 4, "(total_k, 2, nheads_k, headdim)")
    out, lse = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                          deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            sink_logits=None):
    """Attention of q (batch, seqlen, nheads, headdim) over a KV cache, for decoding: if k and v
    (batch, seqlen, nheads_k, headdim / headdim_v) are given they are first written into the cache
    in place at cache_seqlens (k rotated when rotary_cos / rotary_sin are given, as q is), then
    q attends to the cache_seqlens (+ seqlen) valid keys of its sequence, from cache_leftpad on.

    k_cache / v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or with block_table
    (batch, max_blocks) int32 a paged pool (num_blocks, page_block_size, nheads_k, headdim[_v])
    with any page size. cache_seqlens: int or (batch,) int32 (default: the whole cache).
    cache_batch_idx: (batch,) rows of a contiguous cache. cache_leftpad: (batch,) first valid
    slot. rotary_cos / rotary_sin: (seqlen_ro, rotary_dim / 2); rotary_interleaved pairs (0, 1),
    (2, 3), .. else (i, i + rotary_dim / 2). causal aligns the new tokens to the end of the cache;
    window_size, softcap, alibi_slopes and sink_logits as in flash_attn_func. num_splits: split-KV
    (0 = heuristic, 1 = none, n = at most n). Returns out (batch, seqlen, nheads, headdim_v), or
    (out, softmax_lse (batch, nheads, seqlen)) with return_softmax_lse. No autograd.
    """
    from . import _kvcache

    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
            rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse, sink_logits)
    if _is_torch(q):
        return _kvcache.torch_with_kvcache(*args)
    _reject_torch_mix(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, sink_logits)
    return _kvcache.numpy_with_kvcache(*args)


def flash_attn_forward(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                       softcap=0.0, alibi_slopes=None, *, sink_logits=None):
    """Forward pass returning (out, softmax_lse), batched or (with cu_seqlens) varlen. With
    torch tensors this is the autograd-aware op (the lse output is not differentiable)."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, sink_logits,
                      False)


def flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None,
                        max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, *, sink_logits=None):
    """Explicit backward pass (NumPy arrays or torch tensors, no autograd): gradients of the
    attention with the given options, from dout (shaped like out) and the forward's out and
    softmax_lse. Returns (dq, dk, dv), or (dq, dk, dv, dsink) when sink_logits is given; dk/dv
    are summed over the query heads that share a kv head."""
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
