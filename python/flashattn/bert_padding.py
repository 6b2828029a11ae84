"""Moving between padded batches and the packed (varlen) layout, with flash_attn.bert_padding's
semantics. Works on torch tensors (differentiable) and NumPy arrays.

    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, attention_mask)
    out = flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_seqlens, cu_seqlens,
                                 max_seqlen, max_seqlen)
    padded = pad_input(out, indices, batch, seqlen)
"""

try:
    import numpy as np
except ImportError:  # torch-only installs
    np = None

from .flash_attn_interface import _torch


def _is_torch(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


def index_first_axis(x, indices):
    """x[indices] along the first axis (a gather; differentiable for torch tensors)."""
    if _is_torch(x):
        return x.index_select(0, indices)
    return np.asarray(x)[np.asarray(indices)]


def index_put_first_axis(values, indices, first_axis_dim):
    """A zero tensor of first dimension first_axis_dim with rows `indices` set to values."""
    if _is_torch(values):
        out = values.new_zeros((first_axis_dim,) + tuple(values.shape[1:]))
        return out.index_copy(0, indices, values)
    values = np.asarray(values)
    out = np.zeros((first_axis_dim,) + values.shape[1:], dtype=values.dtype)
    out[np.asarray(indices)] = values
    return out


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int, 1 = token.
    unused_mask (batch, seqlen), optional: tokens that are kept in the packed layout but are not
    real (they count in cu_seqlens, not in seqused).

    Returns (hidden (total_nnz, ...), indices (total_nnz,) into the flattened (batch·seqlen)
    axis, cu_seqlens (batch + 1,) int32, max_seqlen (int), seqused (batch,) int32: the tokens of
    each sequence selected by attention_mask alone).
    """
    if _is_torch(hidden_states):
        all_masks = attention_mask.bool()
        if unused_mask is not None:
            all_masks = all_masks | unused_mask.bool()
        seqlens = all_masks.sum(dim=-1, dtype=_torch.int32)
        used_seqlens = attention_mask.bool().sum(dim=-1, dtype=_torch.int32)
        indices = _torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
        max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
        cu_seqlens = _torch.nn.functional.pad(_torch.cumsum(seqlens, dim=0, dtype=_torch.int32),
                                              (1, 0))
        flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
        return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used_seqlens
    hidden_states = np.asarray(hidden_states)
    attention_mask = np.asarray(attention_mask).astype(bool)
    all_masks = attention_mask
    if unused_mask is not None:
        all_masks = all_masks | np.asarray(unused_mask).astype(bool)
    seqlens = all_masks.sum(axis=-1).astype(np.int32)
    used_seqlens = attention_mask.sum(axis=-1).astype(np.int32)
    indices = np.flatnonzero(all_masks.reshape(-1))
    max_seqlen = int(seqlens.max()) if seqlens.size else 0
    cu_seqlens = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int32)
    flat = hidden_states.reshape((-1,) + hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, max_seqlen, used_seqlens


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of unpad_input: hidden_states (total_nnz, ...) -> (batch, seqlen, ...), zeros at
    the padding positions."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape((batch, seqlen) + tuple(out.shape[1:]))
