"""Context parallelism: ring attention over torch.distributed.

The sequence is sharded across the ranks of a process group; every rank keeps its query shard
while the key/value shards travel around the ring (rank r sends to r + 1, receives from r - 1),
each rank runs flashattn's forward on (its queries, the shard it holds) and merges the partial
results through their log-sum-exps. The backward sends fp32 dK/dV accumulators around the ring
behind the K/V, keeps dQ local, and runs flashattn's backward per block pair with the global O
and LSE. Transfers use torch.distributed isend/irecv (any backend: NCCL on GPUs, gloo on the
CPU), posted before the current block is computed so they overlap it.

    import torch.distributed as dist
    from flashattn.ring import shard, ring_flash_attn_func
    q_local = shard(q, dist.get_world_size(), dist.get_rank())      # [batch, tokens/W, h, d]
    ...
    out_local = ring_flash_attn_func(q_local, k_local, v_local, causal=True)
    out_local.backward(grad_local)                                   # autograd works

Sharding (the same as the C API's fa_ring_shard): each sequence of L tokens is cut into C chunks
(chunk c starts at c·(L // C) + min(c, L % C)); "contiguous": C = W, rank r holds chunk r;
"zigzag" (default): C = 2W, rank r holds chunks r and 2W-1-r, in that order, so every rank has
the same causal work. Inputs and outputs are the local shards: batched [batch, local tokens,
heads, dim] (the global length is recovered from the local one and the sharding's rule; pass
`seqlen` when shards are uneven), or varlen [local rows, heads, dim] with the GLOBAL cu_seqlens
(a list or CPU tensor) from which each rank's rows follow.

Supported: causal or not, GQA/MQA, head_dim_v, softmax_scale, softcap, sink_logits (its gradient
is this rank's contribution: sum it over the group like any replicated parameter). Not
supported: sliding windows and ALiBi (their masks depend on global positions). The C library
has the same algorithm with an NCCL transport (fa_ring_forward / fa_ring_backward).
"""

import torch
import torch.distributed as dist

from . import _torch_impl  # noqa: F401  (registers torch.ops.flashattn.fwd / bwd)
from . import _core

__all__ = ["shard", "unshard", "shard_ranges", "plan_step", "ring_flash_attn_func",
           "ring_flash_attn_varlen_func"]

SKIP, FULL, CAUSAL = 0, 1, 2
ALL, FIRST, SECOND = 0, 1, 2


# ---- sharding and schedule (pure functions, shared with the tests) ------------------------------


def _check_sharding(sharding):
    if sharding not in ("contiguous", "zigzag"):
        raise ValueError("flashattn.ring: sharding must be 'contiguous' or 'zigzag', got %r"
                         % (sharding,))


def shard_ranges(seqlen, world_size, rank, sharding="zigzag"):
    """[(start, length)] of rank's chunks in a sequence of seqlen tokens, in shard order."""
    _check_sharding(sharding)
    if not 0 <= rank < world_size:
        raise ValueError("flashattn.ring: rank %d is not in [0, %d)" % (rank, world_size))
    chunks = 2 * world_size if sharding == "zigzag" else world_size
    ids = [rank, chunks - 1 - rank] if sharding == "zigzag" else [rank]
    base, extra = divmod(int(seqlen), chunks)
    return [(c * base + min(c, extra), base + (1 if c < extra else 0)) for c in ids]


def plan_step(rank, world_size, step, sharding, causal):
    """(owner, block, q_part, k_part) of a ring step; see fa_ring_plan_step in src/ring/fa_ring.h."""
    owner = (rank - step) % world_size
    if not causal:
        return owner, FULL, ALL, ALL
    if owner == rank:
        return owner, CAUSAL, ALL, ALL
    if sharding == "contiguous":
        return owner, (SKIP if owner > rank else FULL), ALL, ALL
    if owner < rank:
        return owner, FULL, ALL, FIRST
    return owner, FULL, SECOND, ALL


def _global_lengths(cu_seqlens):
    cu = [int(x) for x in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError("flashattn.ring: cu_seqlens must start at 0 and not decrease, got %s" % cu)
    return [b - a for a, b in zip(cu, cu[1:])]


def _positions(length, world_size, rank, sharding):
    return [t for start, n in shard_ranges(length, world_size, rank, sharding)
            for t in range(start, start + n)]


def shard(x, world_size, rank, sharding="zigzag", dim=1, cu_seqlens=None):
    """Rank's shard of a global tensor: batched along `dim`, or (cu_seqlens given) the packed
    rows (dim 0) of every sequence's chunks, sequence after sequence."""
    if cu_seqlens is None:
        index = _positions(x.shape[dim], world_size, rank, sharding)
    else:
        index, start = [], 0
        for length in _global_lengths(cu_seqlens):
            index += [start + t for t in _positions(length, world_size, rank, sharding)]
            start += length
        dim = 0
    return x.index_select(dim, torch.tensor(index, dtype=torch.long, device=x.device))


def unshard(shards, sharding="zigzag", dim=1, cu_seqlens=None):
    """The global tensor from the list of every rank's shard (inverse of shard)."""
    world_size = len(shards)
    if cu_seqlens is None:
        dim = dim % shards[0].dim()
        seqlen = sum(s.shape[dim] for s in shards)
        shape = list(shards[0].shape)
        shape[dim] = seqlen
        out = shards[0].new_empty(shape)
        for rank, s in enumerate(shards):
            index = _positions(seqlen, world_size, rank, sharding)
            out.index_copy_(dim, torch.tensor(index, dtype=torch.long, device=s.device), s)
        return out
    lengths = _global_lengths(cu_seqlens)
    shape = list(shards[0].shape)
    shape[0] = sum(lengths)
    out = shards[0].new_empty(shape)
    for rank, s in enumerate(shards):
        index, start = [], 0
        for length in lengths:
            index += [start + t for t in _positions(length, world_size, rank, sharding)]
            start += length
        out.index_copy_(0, torch.tensor(index, dtype=torch.long, device=s.device), s)
    return out


# ---- geometry of one rank's ring -----------------------------------------------------------------


class _Geometry:
    """Per owner: rows of its shard (tokens per sequence, batched; packed rows, varlen) and of
    its first chunk; varlen: the cu_seqlens of every step's call (see src/ring/fa_ring.c)."""

    def __init__(self, rank, world, sharding, causal, batch, seqlen=None, lengths=None):
        self.rank, self.world, self.sharding, self.causal = rank, world, sharding, causal
        self.batch = batch
        self.varlen = lengths is not None
        self.rows, self.first = [], []
        self.cu = []  # varlen: per owner, local prefix sums
        for owner in range(world):
            if self.varlen:
                cu, firsts = [0], []
                for length in lengths:
                    parts = shard_ranges(length, world, owner, sharding)
                    cu.append(cu[-1] + sum(n for _, n in parts))
                    firsts.append(parts[0][1])
                self.cu.append(cu)
                self.first.append(firsts)
                self.rows.append(cu[-1])
            else:
                parts = shard_ranges(seqlen, world, owner, sharding)
                self.rows.append(sum(n for _, n in parts))
                self.first.append(parts[0][1])

    def part(self, owner, which):
        """(lo, count) of an owner's shard part within each sequence (batched)."""
        n, first = self.rows[owner], self.first[owner]
        if which == ALL:
            return 0, n
        if which == FIRST:
            return 0, first
        return first, n - first

    def varlen_call(self, step, device):
        """(block, cu_q, cu_k, max_q, max_k) of step's call, as int32 tensors on device."""
        owner, block, q_part, k_part = plan_step(self.rank, self.world, step, self.sharding,
                                                 self.causal)
        cu_r, cu_o = self.cu[self.rank], self.cu[owner]
        if q_part == ALL and k_part == ALL:
            cq, ck = list(cu_r), list(cu_o)
        elif k_part == FIRST:  # queries of b × first key chunk; no queries × second key chunk
            cq, ck = [], []
            for b in range(self.batch):
                cq += [cu_r[b], cu_r[b + 1]]
                ck += [cu_o[b], cu_o[b] + self.first[owner][b]]
            cq.append(cu_r[-1])
            ck.append(cu_o[-1])
        else:  # first query chunk × no keys; second query chunk × every key of b
            cq, ck = [], []
            for b in range(self.batch):
                cq += [cu_r[b], cu_r[b] + self.first[self.rank][b]]
                ck += [cu_o[b], cu_o[b]]
            cq.append(cu_r[-1])
            ck.append(cu_o[-1])
        max_q = max([b - a for a, b in zip(cq, cq[1:])] or [0])
        max_k = max([b - a for a, b in zip(ck, ck[1:])] or [0])
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        return block, as_tensor(cq), as_tensor(ck), max_q, max_k


# ---- transport -------------------------------------------------------------------------------------


class _Ring:
    """isend to the next rank and irecv from the previous one, as one batch."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group)
        self.next = ranks[(self.rank + 1) % self.world]
        self.prev = ranks[(self.rank - 1) % self.world]
        self.pending = []

    def post(self, send, recv):
        ops = [dist.P2POp(dist.isend, send, self.next, self.group),
               dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        self.pending += dist.batch_isend_irecv(ops)

    def wait(self):
        for request in self.pending:
            request.wait()
        self.pending = []


class _Slots:
    """Flat buffers holding two tensors (e.g. K and V) of an owner's shape each; every buffer has
    the size of the largest owner, so sends and receives always match."""

    def __init__(self, shapes_a, shapes_b, dtype, device, count):
        numel = lambda s: int(torch.Size(s).numel())  # noqa: E731
        self.shapes_a, self.shapes_b = shapes_a, shapes_b
        self.size_a = max(numel(s) for s in shapes_a)
        size = self.size_a + max(numel(s) for s in shapes_b)
        self.buffers = [torch.zeros(size, dtype=dtype, device=device) for _ in range(count)]

    def views(self, slot, owner):
        buf = self.buffers[slot]
        sa, sb = self.shapes_a[owner], self.shapes_b[owner]
        a = buf[:torch.Size(sa).numel()].view(sa)
        b = buf[self.size_a:self.size_a + torch.Size(sb).numel()].view(sb)
        return a, b


# ---- the ring --------------------------------------------------------------------------------------


def _shapes(geo, heads, dim):
    if geo.varlen:
        return [(rows, heads, dim) for rows in geo.rows]
    return [(geo.batch, rows, heads, dim) for rows in geo.rows]


def _lse_rows_last(lse, varlen):
    """lse [B, h, n] / [h, T] -> [B, n, h] / [T, h] (aligned with o's rows and heads)."""
    return lse.t() if varlen else lse.transpose(1, 2)


def _merge(o_acc, lse_acc, o_part, lse_part):
    """Running state (fp32 o, lse with rows before heads) merged in place with a partial."""
    merged = torch.logaddexp(lse_acc, lse_part)
    empty = torch.isneginf(merged)
    w_acc = torch.where(empty, torch.zeros_like(merged), torch.exp(lse_acc - merged))
    w_part = torch.where(empty, torch.zeros_like(merged), torch.exp(lse_part - merged))
    o_acc.mul_(w_acc.unsqueeze(-1)).add_(o_part.float() * w_part.unsqueeze(-1))
    lse_acc.copy_(merged)


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, sink, geo, group, scale, softcap, deterministic):
        ring = _Ring(group)
        varlen, r = geo.varlen, geo.rank
        hq, hkv, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        slots = _Slots(_shapes(geo, hkv, d), _shapes(geo, hkv, dv), k.dtype, k.device,
                       2 if geo.world > 1 else 1)
        k0, v0 = slots.views(0, r)
        k0.copy_(k)
        v0.copy_(v)
        rows_shape = (q.shape[0],) if varlen else (q.shape[0], q.shape[1])
        o_acc = torch.zeros(rows_shape + (hq, dv), dtype=torch.float32, device=q.device)
        lse_acc = torch.full(rows_shape + (hq,), float("-inf"), dtype=torch.float32,
                             device=q.device)
        for step in range(geo.world):
            more = step + 1 < geo.world
            if more:
                ring.post(slots.buffers[step % 2], slots.buffers[(step + 1) % 2])
            owner = (r - step) % geo.world
            kh, vh = slots.views(step % 2, owner)
            call_sink = sink if step == 0 else None  # the sink joins each row's softmax once
            if varlen:
                block, cu_q, cu_k, max_q, max_k = geo.varlen_call(step, q.device)
                if block != SKIP:
                    out, lse = torch.ops.flashattn.fwd(q, kh, vh, cu_q, cu_k, max_q, max_k, scale,
                                                       block == CAUSAL, -1, -1, softcap, None,
                                                       call_sink, False)
                    _merge(o_acc, lse_acc, out, _lse_rows_last(lse, True))
            else:
                _, block, q_part, k_part = plan_step(r, geo.world, step, geo.sharding, geo.causal)
                if block != SKIP:
                    q_lo, q_rows = geo.part(r, q_part)
                    _, k_rows = geo.part(owner, k_part)
                    qs = q[:, q_lo:q_lo + q_rows]
                    out, lse = torch.ops.flashattn.fwd(qs, kh[:, :k_rows], vh[:, :k_rows], None,
                                                       None, 0, 0, scale, block == CAUSAL, -1, -1,
                                                       softcap, None, call_sink, False)
                    _merge(o_acc[:, q_lo:q_lo + q_rows], lse_acc[:, q_lo:q_lo + q_rows], out,
                           _lse_rows_last(lse, False))
            if more:
                ring.wait()
        out = o_acc.to(q.dtype)
        lse = _lse_rows_last(lse_acc, varlen).contiguous()
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.geo, ctx.group, ctx.scale, ctx.softcap = geo, group, scale, softcap
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        geo, scale, softcap = ctx.geo, ctx.scale, ctx.softcap
        ring = _Ring(ctx.group)
        varlen, r, world = geo.varlen, geo.rank, geo.world
        hkv, d, dv = k.shape[-2], k.shape[-1], v.shape[-1]
        dout = dout.contiguous() if dout is not None else torch.zeros_like(out)
        count = 2 if world > 1 else 1
        kv = _Slots(_shapes(geo, hkv, d), _shapes(geo, hkv, dv), k.dtype, k.device, count)
        dkv = _Slots(_shapes(geo, hkv, d), _shapes(geo, hkv, dv), torch.float32, k.device, count)
        k0, v0 = kv.views(0, r)
        k0.copy_(k)
        v0.copy_(v)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dsink = None
        for step in range(world):
            more = step + 1 < world
            owner = (r - step) % world
            if more:
                ring.post(kv.buffers[step % 2], kv.buffers[(step + 1) % 2])
            if step > 0:  # the accumulator of the held shard arrives one step behind it
                ring.post(dkv.buffers[(step - 1) % 2], dkv.buffers[step % 2])
            kh, vh = kv.views(step % 2, owner)
            call_sink = sink if step == 0 else None
            if varlen:
                block, cu_q, cu_k, max_q, max_k = geo.varlen_call(step, q.device)
                if block != SKIP:
                    dq_s, dk_s, dv_s, ds = torch.ops.flashattn.bwd(
                        dout, q, kh, vh, out, lse, cu_q, cu_k, max_q, max_k, scale,
                        block == CAUSAL, -1, -1, softcap, None, call_sink, ctx.deterministic)
                    dq.add_(dq_s)
            else:
                _, block, q_part, k_part = plan_step(r, world, step, geo.sharding, geo.causal)
                if block != SKIP:
                    q_lo, q_rows = geo.part(r, q_part)
                    _, k_rows = geo.part(owner, k_part)
                    rows = slice(q_lo, q_lo + q_rows)
                    dq_s, dk_s, dv_s, ds = torch.ops.flashattn.bwd(
                        dout[:, rows], q[:, rows], kh[:, :k_rows], vh[:, :k_rows], out[:, rows],
                        lse[:, :, rows], None, None, 0, 0, scale, block == CAUSAL, -1, -1, softcap,
                        None, call_sink, ctx.deterministic)
                    dq[:, rows].add_(dq_s)
            if step == 0 and sink is not None:
                dsink = ds
            if more or step > 0:
                ring.wait()
            if block != SKIP:
                dk_acc, dv_acc = dkv.views(step % 2, owner)
                if step == 0:
                    dk_acc.zero_()
                    dv_acc.zero_()
                if varlen:
                    dk_acc.add_(dk_s)
                    dv_acc.add_(dv_s)
                else:
                    dk_acc[:, :k_rows].add_(dk_s)
                    dv_acc[:, :k_rows].add_(dv_s)
        final = (world - 1) % 2
        if world > 1:  # one more hop takes the last accumulator home and brings ours
            ring.post(dkv.buffers[final], dkv.buffers[world % 2])
            ring.wait()
            final = world % 2
        dk, dv = dkv.views(final, r)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink, None, None, None, None,
                None)


def _check(q, k, v, group, varlen):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashattn.ring: torch.distributed is not initialised "
                           "(dist.init_process_group)")
    for name, t in (("k", k), ("v", v)):
        _torch_impl._check_tensor(name, t, q.device)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError("flashattn.ring: q, k, v must have the same dtype, got %s, %s, %s"
                        % (q.dtype, k.dtype, v.dtype))
    _torch_impl.dtype_code(q.dtype)
    _core.check_qkv_shapes(q.shape, k.shape, v.shape, varlen)
    return group if group is not None else dist.group.WORLD


def _run(q, k, v, geo, group, softmax_scale, softcap, sink_logits, deterministic, return_lse):
    scale = _core.default_scale(q.shape[-1], softmax_scale)
    if sink_logits is not None:
        sink_logits = sink_logits.float().contiguous()
    out, lse = _RingAttention.apply(q, k, v, sink_logits, geo, group, scale,
                                    _core.check_softcap(softcap), bool(deterministic))
    return (out, lse) if return_lse else out


def ring_flash_attn_func(q, k, v, causal=False, softmax_scale=None, softcap=0.0, group=None,
                         sharding="zigzag", seqlen=None, sink_logits=None, deterministic=False,
                         return_lse=False):
    """Ring attention on this rank's shards q [batch, n, heads_q, d], k/v [batch, n, heads_kv,
    d/dv]. seqlen: the global tokens per sequence (default: derived from n, exact when every
    rank holds the same count). Returns out [batch, n, heads_q, dv] (and lse [batch, heads_q,
    n] with return_lse), differentiable in q, k, v (and sink_logits)."""
    _check_sharding(sharding)
    group = _check(q, k, v, group, False)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    n = q.shape[1]
    if seqlen is None:
        seqlen = n * world
    seqlen = int(seqlen)
    local = sum(length for _, length in shard_ranges(seqlen, world, rank, sharding))
    if local != n or k.shape[1] != n:
        raise ValueError("flashattn.ring: rank %d of %d holds %d tokens of each %d-token sequence "
                         "(%s), but q has %d and k %d (pass seqlen= for uneven shards)"
                         % (rank, world, local, seqlen, sharding, n, k.shape[1]))
    geo = _Geometry(rank, world, sharding, bool(causal), q.shape[0], seqlen=seqlen)
    return _run(q, k, v, geo, group, softmax_scale, softcap, sink_logits, deterministic,
                return_lse)


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, causal=False, softmax_scale=None,
                                softcap=0.0, group=None, sharding="zigzag", sink_logits=None,
                                deterministic=False, return_lse=False):
    """Ring attention on packed shards q [rows, heads_q, d], k/v [rows, heads_kv, d/dv]: the
    chunks of every sequence of the batch whose GLOBAL prefix sums are cu_seqlens (a list or a
    CPU tensor; shard(..., cu_seqlens=...) makes the shards). lse is [heads_q, rows]."""
    _check_sharding(sharding)
    group = _check(q, k, v, group, True)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    lengths = _global_lengths(cu_seqlens)
    geo = _Geometry(rank, world, sharding, bool(causal), len(lengths), lengths=lengths)
    rows = geo.rows[rank]
    if q.dim() != 3 or q.shape[0] != rows or k.shape[0] != rows:
        raise ValueError("flashattn.ring: rank %d of %d holds %d rows of this batch (%s), but q "
                         "has shape %s and k %s" % (rank, world, rows, sharding, tuple(q.shape),
                                                    tuple(k.shape)))
    return _run(q, k, v, geo, group, softmax_scale, softcap, sink_logits, deterministic,
                return_lse)
