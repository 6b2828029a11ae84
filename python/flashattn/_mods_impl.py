"""Programmable attention for PyTorch tensors: an additive score bias with its gradient
(flash_attn_func(..., attn_bias=...)), block-sparse masks in FlexAttention's BlockMask format and
document ids (flex_attention, BlockSparseMask and its constructors).

The library runs these on the CPU and on CUDA tensors (the GPU kernels want block sizes that are
multiples of 128; FlexAttention's default). flex_attention with a score_mod on CUDA tensors falls
back to torch's own flex_attention (documented in python/README.md).

A call goes through one torch.autograd.Function (_ModsAttention, eager mode only: these calls are
not registered as custom ops for torch.compile). The bias is passed to the library as a
[batch, nheads, seqlen_q, seqlen_k] view with zero strides on its broadcast axes; its gradient is
computed by the library in the bias's dtype, summed over those axes (dbias with the same zero
strides), then reshaped to the bias's own shape.
"""

import torch

from . import _core, _lib, _torch_impl

_BIAS_DTYPES = {torch.float32: _lib.FA_DTYPE_F32, torch.float16: _lib.FA_DTYPE_F16,
                torch.bfloat16: _lib.FA_DTYPE_BF16}


# ---- block-sparse masks ------------------------------------------------------------------------


class BlockSparseMask:
    """A block-sparse attention mask in the library's layout (FlexAttention's BlockMask with
    sorted lists and an explicit element mask).

    Query block qb = i // block_size[0] attends the key blocks listed for (b, h, qb):
    kv_num_blocks / kv_indices ("partial": the element masks apply inside) and
    full_kv_num_blocks / full_kv_indices (every element visible). Arrays are int32 of shape
    [B, H, q_blocks] and [B, H, q_blocks, kv_blocks] with B, H = 1 broadcasting, every list
    strictly increasing. Element masks inside partial blocks: causal, window (left, right),
    document ids (doc_ids_q / doc_ids_k, [batch, seqlen] or 1-D shared by the batch), and
    partial_block_bits (uint8, per slot of kv_indices ceil(bq·bk / 8) bytes of row-major bits,
    least significant first). Build one with causal_block_mask, sliding_window_block_mask,
    document_block_mask, prefix_lm_block_mask, or from torch's BlockMask (from_torch)."""

    def __init__(self, block_size, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
                 full_kv_indices=None, partial_block_bits=None, causal=False, window=(-1, -1),
                 doc_ids_q=None, doc_ids_k=None, seq_lengths=None):
        self.block_size = (int(block_size[0]), int(block_size[1]))
        self.kv_num_blocks = kv_num_blocks
        self.kv_indices = kv_indices
        self.full_kv_num_blocks = full_kv_num_blocks
        self.full_kv_indices = full_kv_indices
        self.partial_block_bits = partial_block_bits
        self.causal = bool(causal)
        self.window = (int(window[0]), int(window[1]))
        self.doc_ids_q = doc_ids_q
        self.doc_ids_k = doc_ids_k
        self.seq_lengths = seq_lengths
        # set by sliding_window_block_mask (and causal_block_mask): the lists are exactly the
        # window's blocks, so the call can take the native causal / window kernels instead
        self._window_only = False
        # set by document_block_mask with one set of ids: the mask is a packing of sequences
        self._documents_only = False
        # set by prefix_lm_block_mask: the prefix length (the mask is that prefix LM, square)
        self._prefix_lm = None
        # (batch, seqlen, device) -> (cu_seqlens, longest document) of that packing, computed on
        # the first call (one host synchronisation) and reused by the next ones
        self._document_packing = {}

    # The lists a call has accepted, by device, problem geometry and the list tensors' versions
    # (an in-place change bumps a version; assigning a list attribute forgets them all): later
    # calls tell the library so (fa_params.block_lists_checked), and CUDA then builds its block
    # map without waiting for the device's check, the one host synchronisation of a call.
    _LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")

    def __setattr__(self, name, value):
        if name in BlockSparseMask._LISTS:
            self.__dict__["_accepted"] = set()
        object.__setattr__(self, name, value)

    def _lists_key(self, device, geo):
        return (str(device), geo.batch, geo.hq, geo.seqlen_q, geo.seqlen_k, self.block_size,
                tuple(-1 if t is None else t._version for t in
                      (getattr(self, n) for n in BlockSparseMask._LISTS)))

    @staticmethod
    def from_torch(block_mask, seqlen_q=None, seqlen_k=None):
        """torch.nn.attention.flex_attention.BlockMask -> BlockSparseMask: lists sorted and cut
        to the key blocks of seqlen_k, and the partial blocks' elements evaluated by the mask's
        mask_mod (in PyTorch) into partial_block_bits; the arrays on the BlockMask's device."""
        bq, bk = block_mask.BLOCK_SIZE
        q_len, kv_len = block_mask.seq_lengths
        seqlen_q = q_len if seqlen_q is None else seqlen_q
        seqlen_k = kv_len if seqlen_k is None else seqlen_k
        q_blocks, kv_blocks = -(-seqlen_q // bq), -(-seqlen_k // bk)
        counts, index = _sorted_lists(block_mask.kv_num_blocks, block_mask.kv_indices, q_blocks,
                                      kv_blocks)
        full_counts = full_index = None
        if block_mask.full_kv_num_blocks is not None:
            full_counts, full_index = _sorted_lists(block_mask.full_kv_num_blocks,
                                                    block_mask.full_kv_indices, q_blocks,
                                                    kv_blocks)
        device = block_mask.kv_num_blocks.device
        bits = _evaluate_bits(block_mask.mask_mod, counts, index, bq, bk, seqlen_q, seqlen_k, device)
        # on the mask's device, as torch's lists were (the calls then copy nothing)
        arrays = [None if t is None else t.to(device) for t in (counts, index, full_counts, full_index, bits)]
        return BlockSparseMask((bq, bk), *arrays, seq_lengths=(seqlen_q, seqlen_k))


def _from_torch_cached(block_mask, seqlen_q, seqlen_k):
    """BlockSparseMask.from_torch, kept on the torch BlockMask and reused while its list tensors
    (the same objects, unchanged in place), its mask_mod and the sequence lengths stay the same:
    the conversion sorts the lists on the host and evaluates mask_mod on the partial blocks,
    milliseconds a call."""
    tensors = tuple(getattr(block_mask, n) for n in BlockSparseMask._LISTS)
    key = (seqlen_q, seqlen_k, block_mask.mask_mod,
           tuple(None if t is None else t._version for t in tensors))
    cached = getattr(block_mask, "_flashattn_converted", None)
    if (cached is not None and cached[0] == key and
            all(a is b for a, b in zip(cached[1], tensors))):
        return cached[2]
    m = BlockSparseMask.from_torch(block_mask, seqlen_q, seqlen_k)
    try:
        block_mask._flashattn_converted = (key, tensors, m)
    except (AttributeError, TypeError):  # a mask type that takes no new attribute: convert every call
        pass
    return m


def _sorted_lists(counts, indices, q_blocks, kv_blocks):
    """Counts [B, H, q_blocks] and strictly increasing index lists [B, H, q_blocks, kv_blocks]
    (int32, contiguous, on the CPU) from torch's (any order, padded, possibly more blocks)."""
    counts = counts.to(torch.int64).cpu()
    indices = indices.to(torch.int64).cpu()
    if counts.shape[-1] < q_blocks:
        raise ValueError("flashattn: the block mask has %d query blocks, the call needs %d"
                         % (counts.shape[-1], q_blocks))
    counts, indices = counts[..., :q_blocks], indices[..., :q_blocks, :]
    width = indices.shape[-1]
    slot = torch.arange(width)
    valid = (slot < counts.unsqueeze(-1)) & (indices >= 0) & (indices < kv_blocks)
    big = kv_blocks + width + 1
    keyed = torch.where(valid, indices, torch.full_like(indices, big))
    keyed, _ = torch.sort(keyed, dim=-1)
    new_counts = (keyed < kv_blocks).sum(-1)
    out = torch.zeros(indices.shape[:-1] + (kv_blocks,), dtype=torch.int64)
    take = min(width, kv_blocks)
    out[..., :take] = torch.where(keyed[..., :take] < kv_blocks, keyed[..., :take],
                                  torch.zeros_like(keyed[..., :take]))
    return new_counts.to(torch.int32).contiguous(), out.to(torch.int32).contiguous()


def _pack_bits(visible):
    """bool [n, bq, bk] -> uint8 [n, ceil(bq·bk / 8)], row-major, least significant bit first."""
    n = visible.shape[0]
    flat = visible.reshape(n, -1).to(torch.uint8)
    pad = -flat.shape[1] % 8
    if pad:
        flat = torch.cat([flat, torch.zeros(n, pad, dtype=torch.uint8)], dim=1)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32)
    return (flat.reshape(n, -1, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)


def _partial_slots(counts, index):
    """(b, h, qb, slot, kb) of every listed partial block."""
    width = index.shape[-1]
    listed = torch.arange(width) < counts.unsqueeze(-1).to(torch.int64)
    b, h, qb, slot = listed.nonzero(as_tuple=True)
    return b, h, qb, slot, index[b, h, qb, slot].to(torch.int64)


def _bits_tensor(counts, index, block_bytes, fill):
    """partial_block_bits for (counts, index): `fill(b, h, qb, kb)` gives the packed bytes of the
    listed blocks ([n, block_bytes] uint8); None when nothing is listed."""
    b, h, qb, slot, kb = _partial_slots(counts, index)
    bits = torch.zeros(index.shape + (block_bytes,), dtype=torch.uint8)
    if b.numel():
        bits[b, h, qb, slot] = fill(b, h, qb, kb)
    return bits


def _evaluate_bits(mask_mod, counts, index, bq, bk, seqlen_q, seqlen_k, device=None):
    """mask_mod evaluated by PyTorch on the listed partial blocks only (on `device`, the block
    mask's: a mask_mod may index tensors that live there)."""
    if mask_mod is None:
        return None
    block_bytes = (bq * bk + 7) // 8

    def fill(b, h, qb, kb):
        q_idx = (qb.unsqueeze(1) * bq + torch.arange(bq)).clamp(max=max(seqlen_q - 1, 0))
        kv_idx = (kb.unsqueeze(1) * bk + torch.arange(bk)).clamp(max=max(seqlen_k - 1, 0))
        out = []
        for start in range(0, b.numel(), 4096):  # bounded memory per chunk
            sl = slice(start, start + 4096)
            args = (b[sl].view(-1, 1, 1), h[sl].view(-1, 1, 1), q_idx[sl].unsqueeze(2),
                    kv_idx[sl].unsqueeze(1))
            vis = mask_mod(*(t.to(device) for t in args) if device is not None else args)
            vis = torch.as_tensor(vis).to(torch.bool).expand(b[sl].numel(), bq, bk)
            out.append(_pack_bits(vis.cpu()))
        return torch.cat(out)

    return _bits_tensor(counts, index, block_bytes, fill)


def _block_lists(seqlen_q, seqlen_k, block_size, state):
    """Lists [1, 1, QB, KB] from a dense block state (0 none, 1 partial, 2 full) [QB, KB]."""
    def lists(which):
        chosen = state == which
        counts = chosen.sum(-1).to(torch.int32)
        order = torch.sort(torch.where(chosen, torch.arange(state.shape[1]),
                                       torch.full_like(state, state.shape[1] + 1)), dim=-1)[0]
        order = torch.where(order < state.shape[1], order, torch.zeros_like(order))
        return counts.view(1, 1, -1).contiguous(), order.to(torch.int32).view(1, 1, *state.shape).contiguous()
    return lists(1) + lists(2)


def _window_state(seqlen_q, seqlen_k, block_size, left, right):
    """Block states of the element window (left / right < 0 unbounded; causal is right = 0)."""
    bq, bk = block_size
    qb = torch.arange(-(-seqlen_q // bq))
    kb = torch.arange(-(-seqlen_k // bk))
    shift = seqlen_k - seqlen_q
    i0 = (qb * bq).unsqueeze(1)
    i1 = torch.clamp((qb + 1) * bq, max=seqlen_q).unsqueeze(1) - 1
    j0 = (kb * bk).unsqueeze(0)
    j1 = torch.clamp((kb + 1) * bk, max=seqlen_k).unsqueeze(0) - 1
    big = 1 << 40
    lft = big if left < 0 else left
    rgt = big if right < 0 else right
    # some element visible: j0 <= i1 + shift + right and j1 >= i0 + shift - left
    some = (j0 <= i1 + shift + rgt) & (j1 >= i0 + shift - lft)
    # every element visible: j1 <= i0 + shift + right and j0 >= i1 + shift - left
    every = (j1 <= i0 + shift + rgt) & (j0 >= i1 + shift - lft)
    return torch.where(every, 2, torch.where(some, 1, 0))


def causal_block_mask(seqlen_q, seqlen_k=None, block_size=128):
    """Causal (bottom-right aligned) as a block mask: blocks below the diagonal full, diagonal
    blocks partial with the causal element mask; no mask_mod to evaluate."""
    return sliding_window_block_mask(seqlen_q, seqlen_k, (-1, 0), block_size)


def sliding_window_block_mask(seqlen_q, seqlen_k=None, window_size=(-1, -1), block_size=128):
    """flash_attn's window_size=(left, right) as a block mask (blocks outside the window are
    skipped, blocks inside it full, the cut ones partial with the window as element mask)."""
    seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
    bs = _pair(block_size)
    left, right = int(window_size[0]), int(window_size[1])
    state = _window_state(seqlen_q, seqlen_k, bs, left, right)
    c, i, fc, fi = _block_lists(seqlen_q, seqlen_k, bs, state)
    m = BlockSparseMask(bs, c, i, fc, fi, causal=False, window=(left, right),
                        seq_lengths=(seqlen_q, seqlen_k))
    m._window_only = True
    return m


def document_block_mask(doc_ids_q, doc_ids_k=None, causal=True, block_size=128):
    """Packed-sequence training: query i sees key j only within its document (doc_ids, int
    tensors [seqlen] or [batch, seqlen], non-decreasing along the sequence), and causally when
    causal. Blocks whose queries and keys all share one document are full (below the diagonal),
    blocks with no common document skipped."""
    doc_ids_k = doc_ids_q if doc_ids_k is None else doc_ids_k
    dq = doc_ids_q.to(torch.int64).cpu()
    dk = doc_ids_k.to(torch.int64).cpu()
    if dq.dim() == 1:
        dq, dk = dq.unsqueeze(0), dk.unsqueeze(0)
    bq, bk = _pair(block_size)
    sq, sk = dq.shape[-1], dk.shape[-1]
    QB, KB = -(-sq // bq), -(-sk // bk)

    def ranges(ids, block, n_blocks):
        pad = n_blocks * block - ids.shape[-1]
        lo = torch.nn.functional.pad(ids, (0, pad), value=ids.max().item() if ids.numel() else 0)
        hi = torch.nn.functional.pad(ids, (0, pad), value=ids.min().item() if ids.numel() else 0)
        lo = lo.view(ids.shape[0], n_blocks, block).min(-1).values
        hi = hi.view(ids.shape[0], n_blocks, block).max(-1).values
        return lo, hi

    qlo, qhi = ranges(dq, bq, QB)
    klo, khi = ranges(dk, bk, KB)
    overlap = (qlo.unsqueeze(2) <= khi.unsqueeze(1)) & (klo.unsqueeze(1) <= qhi.unsqueeze(2))
    single = (qlo == qhi).unsqueeze(2) & (klo == khi).unsqueeze(1) & (qlo.unsqueeze(2) == klo.unsqueeze(1))
    state = torch.where(single, 2, torch.where(overlap, 1, 0))
    if causal:
        window = _window_state(sq, sk, (bq, bk), -1, 0).unsqueeze(0)
        state = torch.where(window == 0, 0, torch.where((window == 2) & (state == 2), 2,
                                                        torch.where(state == 0, 0, 1)))
    lists = [_block_lists(sq, sk, (bq, bk), state[b]) for b in range(state.shape[0])]
    c, i, fc, fi = (torch.cat([x[n] for x in lists], dim=0) for n in range(4))
    m = BlockSparseMask((bq, bk), c, i, fc, fi, causal=causal,
                        doc_ids_q=dq.to(torch.int32), doc_ids_k=dk.to(torch.int32),
                        seq_lengths=(sq, sk))
    # one set of ids for queries and keys: every document is a sequence of its own, so the call
    # can take the native varlen kernels (causal within each document when causal)
    m._documents_only = doc_ids_k is doc_ids_q or torch.equal(dq, dk)
    return m


def _document_cu_seqlens(doc_ids, batch, seqlen, device):
    """cu_seqlens (int32, on device) and the longest document of the packed rows b·seqlen + i,
    a document starting at every change of id within a row and at every row's start."""
    ids = doc_ids.to(device).expand(batch, seqlen) if doc_ids.shape[0] == 1 else doc_ids.to(device)
    starts = torch.ones(batch, seqlen, dtype=torch.bool, device=device)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first = torch.nonzero(starts.reshape(-1)).flatten()
    cu = torch.cat([first, torch.tensor([batch * seqlen], device=device)]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max().item())


def prefix_lm_block_mask(seqlen, prefix_length, block_size=128):
    """Prefix LM: every query sees the first prefix_length keys and, after them, the keys up to
    itself (causal). Blocks cut by the prefix boundary get bits computed from that rule."""
    bq, bk = _pair(block_size)
    causal = _window_state(seqlen, seqlen, (bq, bk), -1, 0)
    kb = torch.arange(-(-seqlen // bk))
    in_prefix = ((kb + 1) * bk <= prefix_length).unsqueeze(0)  # every key of the block
    touches = (kb * bk < prefix_length).unsqueeze(0)            # some key of the block
    state = torch.where(in_prefix | (causal == 2), 2, torch.where(touches | (causal == 1), 1, 0))
    c, i, fc, fi = _block_lists(seqlen, seqlen, (bq, bk), state)

    def fill(b, h, qb, kbs):
        q_idx = (qb.unsqueeze(1) * bq + torch.arange(bq)).unsqueeze(2)
        kv_idx = (kbs.unsqueeze(1) * bk + torch.arange(bk)).unsqueeze(1)
        return _pack_bits((kv_idx < prefix_length) | (kv_idx <= q_idx))

    bits = _bits_tensor(c, i, (bq * bk + 7) // 8, fill)
    m = BlockSparseMask((bq, bk), c, i, fc, fi, bits, seq_lengths=(seqlen, seqlen))
    # the call can take the native kernels on two sets of query rows (_PrefixLMAttention)
    m._prefix_lm = max(0, int(prefix_length))
    return m


def _pair(block_size):
    if isinstance(block_size, (tuple, list)):
        return int(block_size[0]), int(block_size[1])
    return int(block_size), int(block_size)


# ---- the call --------------------------------------------------------------------------------


class _Config:
    """Everything of a call that is not differentiable (kept alive for the backward)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _bias4(bias, batch, heads, sq, sk):
    """The bias as a [batch, heads, sq, sk] view (zero strides where it broadcasts), its dtype
    code, and the 4-D shape with 1s that its gradient is summed to."""
    if bias.dtype == torch.bool:
        raise TypeError("flashattn: a boolean attn_bias is a mask: pass "
                        "torch.where(mask, 0.0, -inf) (or use flex_attention)")
    if bias.dtype not in _BIAS_DTYPES:
        raise TypeError("flashattn: attn_bias must be float32, float16 or bfloat16, got %s"
                        % bias.dtype)
    if bias.dim() > 4:
        raise ValueError("flashattn: attn_bias must broadcast to (batch, nheads, seqlen_q, "
                         "seqlen_k) = %s, got shape %s" % ((batch, heads, sq, sk), tuple(bias.shape)))
    b = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if b.shape[-1] > 1 and b.stride(-1) != 1:
        b = b.contiguous()
    try:
        expanded = b.expand(batch, heads, sq, sk)
    except RuntimeError:
        raise ValueError("flashattn: attn_bias of shape %s does not broadcast to (batch, nheads, "
                         "seqlen_q, seqlen_k) = %s" % (tuple(bias.shape), (batch, heads, sq, sk))) \
            from None
    return expanded, _BIAS_DTYPES[bias.dtype], tuple(b.shape)


def _strides4(t, extents):
    return [0 if n <= 1 else s for s, n in zip(t.stride(), extents)]


def _set_mods(p, cfg, bias4):
    if bias4 is not None:
        p.bias = _torch_impl._address(bias4)
        p.bias_dtype = cfg.bias_dtype
        (p.bias_batch_stride, p.bias_head_stride, p.bias_row_stride,
         p.bias_col_stride) = _strides4(bias4, bias4.shape)
    m = cfg.block_mask
    if m is not None:
        # the lists as they are now (a call's forward and backward each look again)
        cfg.lists_key = m._lists_key(cfg.block_arrays[0].device, cfg.geo)
        p.block_lists_checked = 1 if cfg.lists_key in m.__dict__.get("_accepted", ()) else 0
        p.block_q, p.block_k = m.block_size
        counts, index = cfg.block_arrays[0], cfg.block_arrays[1]
        p.kv_num_blocks, p.kv_indices = counts.data_ptr(), index.data_ptr()
        p.block_count_batch_stride = counts.stride(0) if counts.shape[0] > 1 else 0
        p.block_count_head_stride = counts.stride(1) if counts.shape[1] > 1 else 0
        p.block_index_batch_stride = index.stride(0) if index.shape[0] > 1 else 0
        p.block_index_head_stride = index.stride(1) if index.shape[1] > 1 else 0
        p.block_index_row_stride = index.stride(2)
        if cfg.block_arrays[2] is not None:
            p.full_kv_num_blocks = cfg.block_arrays[2].data_ptr()
            p.full_kv_indices = cfg.block_arrays[3].data_ptr()
        if cfg.block_arrays[4] is not None:
            p.partial_block_bits = cfg.block_arrays[4].data_ptr()
    if cfg.doc_ids is not None:
        dq, dk = cfg.doc_ids
        p.doc_ids_q, p.doc_ids_k = dq.data_ptr(), dk.data_ptr()
        p.doc_ids_q_batch_stride = dq.stride(0) if dq.dim() == 2 and dq.shape[0] > 1 else 0
        p.doc_ids_k_batch_stride = dk.stride(0) if dk.dim() == 2 and dk.shape[0] > 1 else 0


def _params(q, k, v, out, lse, cfg, bias4):
    p = _torch_impl._params(q, k, v, out, lse, cfg.geo, cfg.cu_q, cfg.cu_k, cfg.scale, cfg.causal,
                            cfg.wl, cfg.wr, cfg.softcap, cfg.alibi, cfg.sink, cfg.deterministic)
    _set_mods(p, cfg, bias4)
    return p


def _accepted(cfg):
    """After a call that returned: its block lists passed the library's check."""
    if cfg.block_mask is not None:
        cfg.block_mask.__dict__.setdefault("_accepted", set()).add(cfg.lists_key)


class _ModsAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, sink, cfg):
        geo = cfg.geo
        bias4 = None
        if bias is not None:
            bias4, cfg.bias_dtype, cfg.bias_shape4 = _bias4(bias, geo.batch, geo.hq, geo.seqlen_q,
                                                            geo.seqlen_k)
        qc, kc, vc = (_torch_impl._contig_last(t.detach()) for t in (q, k, v))
        out = geo.alloc(geo.out_shape, q.dtype, q.device)
        lse = geo.alloc(geo.lse_shape, torch.float32, q.device)
        if geo.batch > 0:
            with _torch_impl._guard(q):
                _lib.forward(_params(qc, kc, vc, out, lse, cfg, bias4), _torch_impl._workspace_alloc(q))
            _accepted(cfg)
        ctx.save_for_backward(q, k, v, out, lse, bias, sink)
        ctx.cfg = cfg
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, bias, sink = ctx.saved_tensors
        cfg = ctx.cfg
        geo = cfg.geo
        if dout is None:
            dout = torch.zeros_like(out)
        qc, kc, vc, oc, doc = (_torch_impl._contig_last(t.detach()) for t in (q, k, v, out, dout))
        dq = geo.alloc(qc.shape, q.dtype, q.device)
        dk = geo.alloc(kc.shape, k.dtype, k.device)
        dv = geo.alloc(vc.shape, v.dtype, v.device)
        dsink = torch.zeros(geo.hq, dtype=torch.float32, device=q.device) if sink is not None else None
        bias4 = dbias = None
        if bias is not None:
            bias4, bias_code, _ = _bias4(bias, geo.batch, geo.hq, geo.seqlen_q, geo.seqlen_k)
            if ctx.needs_input_grad[3]:
                # in the bias's dtype (the library converts); every element is written unless
                # the problem is empty
                alloc = torch.empty if min(geo.batch, geo.seqlen_q, geo.seqlen_k) > 0 else torch.zeros
                dbias = alloc(cfg.bias_shape4, dtype=bias.dtype, device=q.device)
        if geo.batch > 0:
            p = _params(qc, kc, vc, oc, lse, cfg, bias4)
            _core.set_backward(p, _torch_impl._view(doc), _torch_impl._view(dq),
                               _torch_impl._view(dk), _torch_impl._view(dv),
                               dsink.data_ptr() if dsink is not None else None)
            if dbias is not None and dbias.numel() > 0:
                full = dbias.expand(geo.batch, geo.hq, geo.seqlen_q, geo.seqlen_k)
                p.dbias = dbias.data_ptr()
                p.dbias_dtype = bias_code
                (p.dbias_batch_stride, p.dbias_head_stride, p.dbias_row_stride,
                 p.dbias_col_stride) = _strides4(full, full.shape)
            with _torch_impl._guard(q):
                _lib.backward(p, _torch_impl._workspace_alloc(q))
            _accepted(cfg)
        if dbias is not None:
            dbias = dbias.reshape(bias.shape)
        if dsink is not None:
            dsink = dsink.to(sink.dtype)
        return dq, dk, dv, dbias, dsink, None


def attention(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, softmax_scale=None, causal=False, window_size=(-1, -1),
              softcap=0.0, alibi_slopes=None, sink_logits=None, deterministic=False,
              attn_bias=None, block_mask=None):
    """(out, lse) of q, k, v in flash_attn's layout with a score bias and / or a BlockSparseMask,
    with autograd (dq, dk, dv, the bias's gradient, dsink)."""
    max_q, max_k = _torch_impl._check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                             max_seqlen_k, alibi_slopes, sink_logits)
    cu_q, cu_k, alibi, sink_c = _torch_impl._convert_inputs(cu_seqlens_q, cu_seqlens_k,
                                                            alibi_slopes, sink_logits)
    geo = _torch_impl._Geometry(q, k, v, cu_q, max_q, max_k)
    _, wl, wr = _core.window_fields(window_size)
    causal = bool(causal)
    block_arrays = doc_ids = None
    if block_mask is not None:
        if not isinstance(block_mask, BlockSparseMask):
            block_mask = _from_torch_cached(block_mask, geo.seqlen_q, geo.seqlen_k)
        m = block_mask
        if (m._window_only and m.seq_lengths == (geo.seqlen_q, geo.seqlen_k) and cu_q is None and
                m.partial_block_bits is None and m.doc_ids_q is None):
            # a window (or causal) mask from sliding_window_block_mask: the native kernels skip
            # the same blocks and apply the same element mask, without the block lists
            _, wl, wr = _core.window_fields(m.window)
            block_mask = None
        elif (m._documents_only and m.seq_lengths == (geo.seqlen_q, geo.seqlen_k) and cu_q is None and
              geo.seqlen_q == geo.seqlen_k and m.partial_block_bits is None and attn_bias is None and
              wl < 0 and wr < 0 and alibi_slopes is None and sink_logits is None):
            # documents of one set of ids from document_block_mask: each document is a sequence
            # of the varlen kernels (the same visible pairs, no block lists or id compares)
            b, s = q.shape[0], q.shape[1]
            key = (b, s, str(q.device))
            if key not in m._document_packing:
                m._document_packing[key] = _document_cu_seqlens(m.doc_ids_q, b, s, q.device)
            cu, longest = m._document_packing[key]
            out, lse = attention(q.reshape(b * s, *q.shape[2:]), k.reshape(b * s, *k.shape[2:]),
                                 v.reshape(b * s, *v.shape[2:]), cu_seqlens_q=cu, cu_seqlens_k=cu,
                                 max_seqlen_q=longest, max_seqlen_k=longest, softmax_scale=softmax_scale,
                                 causal=causal or m.causal, softcap=softcap, deterministic=deterministic)
            return (out.view(b, s, *out.shape[1:]),
                    lse.view(lse.shape[0], b, s).permute(1, 0, 2))
        elif (m._prefix_lm is not None and m.seq_lengths == (geo.seqlen_q, geo.seqlen_k) and
              cu_q is None and geo.seqlen_q == geo.seqlen_k and geo.seqlen_q > 0 and geo.batch > 0
              and attn_bias is None and not causal and wl < 0 and wr < 0 and alibi_slopes is None
              and sink_logits is None):
            return _prefix_lm_attention(q, k, v, m._prefix_lm, geo,
                                        _core.default_scale(q.shape[-1], softmax_scale),
                                        _core.check_softcap(softcap), bool(deterministic))
    if block_mask is not None:
        m = block_mask
        block_arrays = tuple(None if t is None else t.to(q.device, dtype).contiguous() for t, dtype in
                             ((m.kv_num_blocks, torch.int32), (m.kv_indices, torch.int32),
                              (m.full_kv_num_blocks, torch.int32), (m.full_kv_indices, torch.int32),
                              (m.partial_block_bits, torch.uint8)))
        if m.causal:
            causal = True
        if m.window != (-1, -1):
            _, wl, wr = _core.window_fields(m.window)
        if m.doc_ids_q is not None:
            doc_ids = (m.doc_ids_q.to(q.device, torch.int32).contiguous(),
                       m.doc_ids_k.to(q.device, torch.int32).contiguous())
    if attn_bias is not None and attn_bias.device != q.device:
        raise ValueError("flashattn: attn_bias is on %s but q on %s" % (attn_bias.device, q.device))
    cfg = _Config(geo=geo, cu_q=cu_q, cu_k=cu_k, scale=_core.default_scale(q.shape[-1], softmax_scale),
                  causal=causal, wl=wl, wr=wr, softcap=_core.check_softcap(softcap), alibi=alibi,
                  sink=sink_c, deterministic=bool(deterministic), block_mask=block_mask,
                  block_arrays=block_arrays, doc_ids=doc_ids, bias_dtype=None, bias_shape4=None,
                  lists_key=None)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, attn_bias, sink_logits))
    if needs_grad:
        return _ModsAttention.apply(q, k, v, attn_bias, sink_c if sink_logits is None or not
                                    sink_logits.requires_grad else sink_logits, cfg)
    with torch.no_grad():
        return _ModsAttention.forward(_NoCtx(), q, k, v, attn_bias, sink_c, cfg)


class _PrefixLMAttention(torch.autograd.Function):
    """Prefix LM (every query sees the first `prefix` keys, and the keys up to itself) as the native
    kernels on two sets of query rows: rows below the prefix see exactly the prefix keys (no
    mask), the others see the keys up to themselves (causal, bottom-right aligned: query row
    prefix + i of the second call sees keys 0 .. prefix + i). Outputs and dq are written in place
    by row; dk and dv are the sum of both calls (the prefix call's added into the first rows)."""

    @staticmethod
    def _parts(s, prefix):
        """(query rows, key count, causal) of each call; the first call's keys are all s keys."""
        if prefix >= s:
            return [((0, s), s, False)]
        if prefix == 0:
            return [((0, s), s, True)]
        return [((prefix, s), s, True), ((0, prefix), prefix, False)]

    @staticmethod
    def _cfg(q, k, v, scale, causal, softcap, deterministic):
        geo = _torch_impl._Geometry(q, k, v, None, None, None)
        return _Config(geo=geo, cu_q=None, cu_k=None, scale=scale, causal=causal, wl=-1, wr=-1,
                       softcap=softcap, alibi=None, sink=None, deterministic=deterministic,
                       block_mask=None, block_arrays=None, doc_ids=None)

    @staticmethod
    def forward(ctx, q, k, v, prefix, scale, softcap, deterministic):
        qc, kc, vc = (_torch_impl._contig_last(t.detach()) for t in (q, k, v))
        b, s = q.shape[0], q.shape[1]
        out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
        lse = torch.empty(b, q.shape[2], s, dtype=torch.float32, device=q.device)
        lse_parts = []
        with _torch_impl._guard(q):
            for (r0, r1), keys, causal in _PrefixLMAttention._parts(s, prefix):
                qp, kp, vp = qc[:, r0:r1], kc[:, :keys], vc[:, :keys]
                lp = torch.empty(b, q.shape[2], r1 - r0, dtype=torch.float32, device=q.device)
                cfg = _PrefixLMAttention._cfg(qp, kp, vp, scale, causal, softcap, deterministic)
                _lib.forward(_params(qp, kp, vp, out[:, r0:r1], lp, cfg, None),
                             _torch_impl._workspace_alloc(q))
                lse[:, :, r0:r1] = lp
                lse_parts.append(lp)
        ctx.save_for_backward(q, k, v, out, *lse_parts)
        ctx.prefix, ctx.scale, ctx.softcap, ctx.deterministic = prefix, scale, softcap, deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out = ctx.saved_tensors[:4]
        lse_parts = ctx.saved_tensors[4:]
        if dout is None:
            dout = torch.zeros_like(out)
        qc, kc, vc, oc, doc = (_torch_impl._contig_last(t.detach()) for t in (q, k, v, out, dout))
        dq, dk, dv = torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)
        with _torch_impl._guard(q):
            for n, (((r0, r1), keys, causal), lp) in enumerate(
                    zip(_PrefixLMAttention._parts(q.shape[1], ctx.prefix), lse_parts)):
                qp, kp, vp = qc[:, r0:r1], kc[:, :keys], vc[:, :keys]
                # the first call covers every key and writes dk, dv; the second adds its own
                dkp, dvp = (dk, dv) if n == 0 else (torch.empty_like(kp), torch.empty_like(vp))
                cfg = _PrefixLMAttention._cfg(qp, kp, vp, ctx.scale, causal, ctx.softcap,
                                              ctx.deterministic)
                p = _params(qp, kp, vp, oc[:, r0:r1], lp, cfg, None)
                _core.set_backward(p, _torch_impl._view(doc[:, r0:r1]),
                                   _torch_impl._view(dq[:, r0:r1]), _torch_impl._view(dkp),
                                   _torch_impl._view(dvp), None)
                _lib.backward(p, _torch_impl._workspace_alloc(q))
                if n > 0:
                    dk[:, :keys] += dkp
                    dv[:, :keys] += dvp
        return dq, dk, dv, None, None, None, None


def _prefix_lm_attention(q, k, v, prefix, geo, scale, softcap, deterministic):
    args = (q, k, v, min(prefix, geo.seqlen_k), scale, softcap, deterministic)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _PrefixLMAttention.apply(*args)
    with torch.no_grad():
        return _PrefixLMAttention.forward(_NoCtx(), *args)


class _NoCtx:
    """A stand-in autograd context for calls without gradients."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass


# The largest bias an additive score_mod is evaluated into (elements of its broadcast shape, fp32).
_SCORE_MOD_BIAS_MAX = 1 << 28


def _score_mod_bias(score_mod, b, h, sq, sk, device):
    """The bias an additive score_mod adds (score_mod(s, b, h, q_idx, kv_idx) = s + bias[b, h,
    q_idx, kv_idx]), evaluated by PyTorch once over index tensors that broadcast, so the bias has
    only the axes score_mod reads; tensors score_mod captures keep their autograd graph (their
    gradients flow through the bias's). None when score_mod is not additive on probe scores, fails
    on whole index tensors (FlexAttention calls it per element), or its bias would exceed
    _SCORE_MOD_BIAS_MAX elements."""
    idx = [torch.arange(n, device=device).view([n if a == i else 1 for a in range(4)])
           for i, n in enumerate((b, h, sq, sk))]
    zero = torch.zeros((), dtype=torch.float32, device=device)
    try:
        bias = score_mod(zero, *idx)
        if not torch.is_tensor(bias) or bias.dim() > 4 or bias.numel() > _SCORE_MOD_BIAS_MAX:
            return None
        bias = torch.broadcast_to(bias.float(), [1] * (4 - bias.dim()) + list(bias.shape))
        torch.broadcast_shapes(bias.shape, (b, h, sq, sk))
        with torch.no_grad():
            # constant scores and random ones on a corner of the grid must give score + bias
            base = bias.detach()
            for c in (1.5, -3.25):
                got = score_mod(torch.full((), c, dtype=torch.float32, device=device), *idx).float()
                if not _same_scores(got, base + c):
                    return None
            corner = [min(n, 8) for n in (b, h, sq, sk)]
            probe = torch.randn(corner, dtype=torch.float32, device=device) * 4
            sub = [t.narrow(i, 0, corner[i]) for i, t in enumerate(idx)]
            got = score_mod(probe, *sub).float()
            want = probe + base.expand(b, h, sq, sk)[:corner[0], :corner[1], :corner[2], :corner[3]]
            if not _same_scores(got, want):
                return None
    except Exception:  # a score_mod written for FlexAttention's per-element calls only
        return None
    return bias


def _same_scores(got, want):
    got, finite = got.expand_as(want), torch.isfinite(want)
    return bool(torch.equal(torch.isfinite(got), finite) and torch.equal(got[~finite], want[~finite]) and
                torch.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5))


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False):
    """torch.nn.attention.flex_attention.flex_attention's signature on [batch, heads, seq, dim]
    tensors, computed by the library (CPU, and CUDA with block sizes multiples of 128): block_mask
    is torch's BlockMask (its mask_mod is evaluated by PyTorch on the partial blocks only, once per
    mask: the conversion is kept on the BlockMask and reused while its list tensors, mask_mod and
    the sequence lengths are unchanged, so a mask_mod that reads tensors changed in place needs a
    new create_block_mask) or a BlockSparseMask. An additive score_mod (score + f(b, h, q_idx, kv_idx): relative positions,
    ALiBi, a bias table, -inf masks) is evaluated by PyTorch once into a score bias with only the
    axes it reads, and gradients reach the tensors it captures. Other score_mods (tanh softcap,
    score-dependent ones): CUDA tensors go to torch's own flex_attention, CPU ones raise
    NotImplementedError. Returns out [batch, heads, seq_q, dim_v] (and the LSE [batch, heads,
    seq_q] with return_lse)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError("flashattn.flex_attention: %s must be [batch, heads, seq, dim], got %s"
                             % (name, tuple(t.shape)))
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError("flashattn.flex_attention: query has %d heads, key %d (enable_gqa=True "
                         "for GQA)" % (query.shape[1], key.shape[1]))
    attn_bias = None
    if score_mod is not None:
        attn_bias = _score_mod_bias(score_mod, query.shape[0], query.shape[1], query.shape[2],
                                    key.shape[2], query.device)
        if attn_bias is None and query.is_cuda:
            from torch.nn.attention.flex_attention import flex_attention as torch_flex
            if isinstance(block_mask, BlockSparseMask):
                raise NotImplementedError("flashattn.flex_attention with a score_mod that is not "
                                          "additive on CUDA tensors falls back to torch's "
                                          "flex_attention, which takes torch's BlockMask only")
            return torch_flex(query, key, value, score_mod=score_mod, block_mask=block_mask,
                              scale=scale, enable_gqa=enable_gqa, return_lse=return_lse)
        if attn_bias is None:
            raise NotImplementedError("flashattn.flex_attention: this score_mod is not additive "
                                      "(score + a function of b, h, q_idx, kv_idx) or cannot run on "
                                      "whole index tensors; give the scores' changes as attn_bias "
                                      "to flash_attn_func, or a mask as block_mask")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse = attention(q, k, v, softmax_scale=scale, block_mask=block_mask, attn_bias=attn_bias)
    out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


__all__ = ["BlockSparseMask", "causal_block_mask", "sliding_window_block_mask",
           "document_block_mask", "prefix_lm_block_mask", "flex_attention", "attention"]
