"""flashattn.ring (ring attention over torch.distributed) on the CPU.

- sharding and schedule as pure functions: shard/unshard invert each other, every visible
  (query, key) pair is computed once across the ring's steps;
- the real thing with the gloo backend: 2 and 3 processes (torch.multiprocessing.spawn), each
  running its shard through ring_flash_attn_func / ring_flash_attn_varlen_func with autograd,
  compared shard by shard with float64 single-process attention under FlashAttention's rule
  (≤ 2 × the error of plain attention in the dtype + floor): causal and not, both shardings,
  uneven shards, GQA, softcap, sinks (dsink summed over the ranks), varlen with an empty
  sequence and sequences shorter than the ring.
"""

import datetime
import os
import tempfile
import traceback
import zlib

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flashattn import ring  # noqa: E402


# ---- pure functions --------------------------------------------------------------------------------


@pytest.mark.parametrize("sharding", ["contiguous", "zigzag"])
def test_shard_roundtrip(sharding):
    x = torch.arange(2 * 23 * 3).view(2, 23, 3)
    for world in (1, 2, 3, 5):
        shards = [ring.shard(x, world, r, sharding) for r in range(world)]
        assert sum(s.shape[1] for s in shards) == 23
        assert max(s.shape[1] for s in shards) - min(s.shape[1] for s in shards) <= 2
        assert torch.equal(ring.unshard(shards, sharding), x)
    cu = [0, 7, 7, 10, 31]
    y = torch.arange(31 * 2).view(31, 2)
    shards = [ring.shard(y, 3, r, sharding, cu_seqlens=cu) for r in range(3)]
    assert torch.equal(ring.unshard(shards, sharding, cu_seqlens=cu), y)
    if sharding == "zigzag":
        # 4 chunks of 10 tokens: 3, 3, 2, 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
        assert ring.shard_ranges(10, 2, 0, "zigzag") == [(0, 3), (8, 2)]
        assert ring.shard_ranges(10, 2, 1, "zigzag") == [(3, 3), (6, 2)]


@pytest.mark.parametrize("sharding", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_schedule_covers_each_pair_once(sharding, causal):
    for world in (1, 2, 3, 4):
        for L in (1, 5, 17):
            count = torch.zeros(L, L, dtype=torch.int64)
            for r in range(world):
                for step in range(world):
                    owner, block, qp, kp = ring.plan_step(r, world, step, sharding, causal)
                    if block == ring.SKIP:
                        continue
                    qpos = _part_positions(L, world, r, sharding, qp)
                    kpos = _part_positions(L, world, owner, sharding, kp)
                    sq, sk = len(qpos), len(kpos)
                    for i, gi in enumerate(qpos):
                        for j, gj in enumerate(kpos):
                            if block == ring.CAUSAL and j > i + sk - sq:
                                continue
                            count[gi, gj] += 1
            want = torch.tril(torch.ones(L, L, dtype=torch.int64)) if causal else torch.ones(L, L, dtype=torch.int64)
            assert torch.equal(count, want), (sharding, causal, world, L)


def _part_positions(L, world, rank, sharding, part):
    ranges = ring.shard_ranges(L, world, rank, sharding)
    if part == ring.FIRST:
        ranges = ranges[:1]
    elif part == ring.SECOND:
        ranges = ranges[1:]
    return [s + t for s, n in ranges for t in range(n)]


def test_needs_initialised_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised here")
    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(RuntimeError, match="not initialised"):
        ring.ring_flash_attn_func(q, q, q)


# ---- gloo ranks ------------------------------------------------------------------------------------

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# name, dtype, sharding, causal, batch or global cu_seqlens, seqlen, hq, hkv, d, extra options
CASES = [
    ("zigzag_causal_gqa", "bfloat16", "zigzag", True, 2, 53, 4, 2, 32, {}),
    ("contiguous_causal_uneven", "float32", "contiguous", True, 1, 41, 2, 2, 64, {}),
    ("zigzag_full", "float32", "zigzag", False, 2, 36, 2, 1, 32, {}),
    ("contiguous_full_f16", "float16", "contiguous", False, 1, 30, 3, 3, 16, {}),
    ("zigzag_softcap_sink", "float32", "zigzag", True, 1, 45, 4, 2, 32, {"softcap": 4.0, "sink": True}),
    ("varlen_zigzag_causal", "float32", "zigzag", True, [0, 37, 37, 40, 104], None, 2, 1, 32, {}),
    ("varlen_contiguous_bf16", "bfloat16", "contiguous", True, [0, 5, 70], None, 4, 2, 32, {}),
]


def _check_rule(name, ours, ref, base, dtype_name):
    from attn_ref import check_rule
    kind = "float32" if name in ("lse", "dsink") else dtype_name
    check_rule(name, ours.detach().double().numpy(), ref.detach().double().numpy(),
               base.detach().double().numpy(), kind)


def _run_case(case, rank, world):
    from attn_ref import torch_attention
    name, dtype_name, sharding, causal, batch, seqlen, hq, hkv, d, opt = case
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    varlen = isinstance(batch, list)
    rows = batch[-1] if varlen else None
    shape_q = (rows, hq, d) if varlen else (batch, seqlen, hq, d)
    shape_k = (rows, hkv, d) if varlen else (batch, seqlen, hkv, d)
    q = torch.randn(shape_q, generator=gen).to(dtype)
    k = torch.randn(shape_k, generator=gen).to(dtype)
    v = (torch.randn(shape_k, generator=gen) + 0.5).to(dtype)
    dout = (torch.randn(shape_q, generator=gen) + 0.5).to(dtype)
    sink = (torch.rand(hq, generator=gen) * 3 - 1) if opt.get("sink") else None
    softcap = opt.get("softcap", 0.0)
    cu = torch.tensor(batch, dtype=torch.int32) if varlen else None

    def reference(upcast):
        leaf = (lambda t: t.double()) if upcast else (lambda t: t.clone())
        ins = [leaf(t).requires_grad_() for t in (q, k, v)]
        s = sink.double().requires_grad_() if (sink is not None and upcast) else (
            sink.clone().requires_grad_() if sink is not None else None)
        out, lse = torch_attention(*ins, causal=causal, softcap=softcap, sink=s, cu_q=cu, cu_k=cu,
                                   upcast=upcast)
        wrt = ins + ([s] if s is not None else [])
        grads = torch.autograd.grad(out, wrt, dout.to(out.dtype))
        return out, lse, grads

    ro, rl, rg = reference(True)
    bo, bl, bg = reference(False)

    def local(t, dim=1):
        return ring.shard(t, world, rank, sharding, dim=dim, cu_seqlens=batch if varlen else None)

    def local_lse(t):
        return local(t.t()).t() if varlen else local(t, dim=2)

    ql, kl, vl = (local(t).requires_grad_() for t in (q, k, v))
    sl = sink.clone().requires_grad_() if sink is not None else None
    kw = dict(causal=causal, softcap=softcap, sharding=sharding, sink_logits=sl, return_lse=True)
    if varlen:
        out, lse = ring.ring_flash_attn_varlen_func(ql, kl, vl, batch, **kw)
    else:
        out, lse = ring.ring_flash_attn_func(ql, kl, vl, seqlen=seqlen, **kw)
    wrt = [ql, kl, vl] + ([sl] if sl is not None else [])
    grads = list(torch.autograd.grad(out, wrt, local(dout)))
    _check_rule("out", out, local(ro), local(bo), dtype_name)
    _check_rule("lse", lse, local_lse(rl), local_lse(bl), dtype_name)
    for i, gname in enumerate(["dq", "dk", "dv"]):
        _check_rule(gname, grads[i], local(rg[i]), local(bg[i]), dtype_name)
    if sl is not None:  # each rank holds its rows' contribution; the gradient is the sum
        dsink = grads[3].clone()
        dist.all_reduce(dsink)
        _check_rule("dsink", dsink, rg[3], bg[3], dtype_name)


def _worker(rank, world, init_file, result_dir):
    torch.set_num_threads(1)
    import flashattn
    flashattn.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    failures = []
    try:
        for case in CASES:
            try:
                _run_case(case, rank, world)
            except Exception:  # every case runs on every rank, so the collectives stay matched
                failures.append("%s (rank %d): %s" % (case[0], rank, traceback.format_exc()))
        with open(os.path.join(result_dir, "rank%d.txt" % rank), "w") as f:
            f.write("\n".join(failures))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ring_gloo(world):
    if not dist.is_gloo_available():
        pytest.skip("torch.distributed has no gloo backend")
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(world, init_file, tmp), nprocs=world, join=True)
        failures = []
        for rank in range(world):
            with open(os.path.join(tmp, "rank%d.txt" % rank)) as f:
                text = f.read()
            if text:
                failures.append(text)
    assert not failures, "\n".join(failures)
