"""Ring attention on several GPUs, one process per GPU (torchrun), through flashattn.ring with
the NCCL backend:

  1. correctness: every rank builds the same global problem, runs its shard through the ring
     (forward + autograd backward) and compares its rows of out, lse, dq, dk, dv with a float64
     reference: the ring's error must be <= 2 x the error of plain bf16 attention + a floor
     (FlashAttention's rule, as in the test suites); the error of single-GPU flashattn on the
     whole sequence is printed next to it;
  2. scaling: time per layer (forward, backward) of the ring on W GPUs against flashattn on one
     GPU at 32k..256k tokens, and the efficiency t_1 / (W · t_W).

    torchrun --nproc_per_node=2 bench/bench_ring.py [--check] [--bench] [--tokens 32768,65536]

Prints one table per part; rank 0 prints, every rank checks. NCCL_NVLS_ENABLE=0 must stay set
(tests/multi_gpu_test.sh sets it).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import flashattn
from flashattn import ring

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from attn_ref import floor_for, torch_attention  # noqa: E402  (the test suites' reference)


def log(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)


def check(args, device):
    """Every rank compares its rows of the ring's results, and of the single-GPU result, with a
    float64 reference; the rule's baseline is plain attention in bf16 (fp32 softmax), as in the
    test suites (python/tests/attn_ref.py)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    shrink = args.shrink
    cases = [  # name, sharding, causal, batch or global sequence lengths, tokens, hq, hkv, d
        ("zigzag causal gqa", "zigzag", True, 2, 4096, 8, 2, 128),
        ("contiguous causal", "contiguous", True, 1, 4096, 4, 4, 64),
        ("zigzag full", "zigzag", False, 1, 3000, 4, 1, 128),
        ("varlen zigzag causal", "zigzag", True, [1000, 3, 2997], None, 4, 2, 128),
    ]
    log("\n== correctness: W = %d, bf16; errors against float64, tol = 2 x plain bf16 attention's "
        "+ floor" % world)
    log("%-22s %-5s %11s %11s %11s %11s %s" % ("case", "out", "ring", "1 GPU", "plain bf16", "tol",
                                               "ok"))
    failures = 0
    for name, sharding, causal, batch, tokens, hq, hkv, d in cases:
        gen = torch.Generator(device="cpu").manual_seed(len(name) * 7919 + d)
        varlen = isinstance(batch, list)
        if varlen:
            lengths = [max(n // shrink, 1) for n in batch]
            cu_list = [0]
            for n in lengths:
                cu_list.append(cu_list[-1] + n)
            sq, sk = (cu_list[-1], hq, d), (cu_list[-1], hkv, d)
        else:
            tokens = max(tokens // shrink, 1)
            sq, sk = (batch, tokens, hq, d), (batch, tokens, hkv, d)
        mk = lambda shape, off=0.0: (torch.randn(shape, generator=gen) + off).to(device, torch.bfloat16)  # noqa: E731
        q, k, v, dout = mk(sq), mk(sk), mk(sk, 0.5), mk(sq, 0.5)
        cu = torch.tensor(cu_list, dtype=torch.int32, device=device) if varlen else None

        def run_reference(upcast):
            leaves = [(t.double() if upcast else t.clone()).requires_grad_() for t in (q, k, v)]
            out, lse = torch_attention(*leaves, causal=causal, cu_q=cu, cu_k=cu, upcast=upcast)
            return (out, lse) + tuple(torch.autograd.grad(out, leaves, dout.to(out.dtype)))

        ref, base = run_reference(True), run_reference(False)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if varlen:
            n = max(lengths)
            o1, l1, _ = flashattn.flash_attn_varlen_func(*leaves, cu, cu, n, n, causal=causal,
                                                         return_attn_probs=True)
        else:
            o1, l1, _ = flashattn.flash_attn_func(*leaves, causal=causal, return_attn_probs=True)
        single = (o1, l1) + tuple(torch.autograd.grad(o1, leaves, dout))

        def local(t, dim=1):
            return ring.shard(t, world, rank, sharding, dim=dim, cu_seqlens=cu_list if varlen else None)

        def local_lse(t):
            return local(t.t()).t() if varlen else local(t, dim=2)

        ql, kl, vl = (local(t).detach().requires_grad_() for t in (q, k, v))
        if varlen:
            o_r, l_r = ring.ring_flash_attn_varlen_func(ql, kl, vl, cu_list, causal=causal,
                                                        sharding=sharding, return_lse=True)
        else:
            o_r, l_r = ring.ring_flash_attn_func(ql, kl, vl, causal=causal, sharding=sharding,
                                                 seqlen=tokens, return_lse=True)
        ours = (o_r, l_r) + tuple(torch.autograd.grad(o_r, [ql, kl, vl], local(dout)))

        for i, tensor in enumerate(("out", "lse", "dq", "dk", "dv")):
            pick = local_lse if tensor == "lse" else local
            r64 = pick(ref[i]).detach().double()
            errs = [float((x.detach().double() - r64).abs().max()) if r64.numel() else 0.0
                    for x in (ours[i], pick(single[i]), pick(base[i]))]
            ref_max = float(r64.abs().max()) if r64.numel() else 0.0
            stats = torch.tensor(errs + [ref_max], device=device, dtype=torch.float64)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            err_ring, err_single, err_base, ref_max = stats.tolist()
            tol = 2 * err_base + floor_for("float32" if tensor == "lse" else "bfloat16", ref_max)
            ok = err_ring <= tol
            failures += not ok
            log("%-22s %-5s %11.3e %11.3e %11.3e %11.3e %s" % (name, tensor, err_ring, err_single,
                                                                 err_base, tol, "ok" if ok else "FAIL"))
    return failures


def timed(fn, iters):
    fn()  # warm-up: the first call of a kernel family pays its module load and plan
    torch.cuda.synchronize()
    dist.barrier()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / iters], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the ring is as slow as its slowest rank
    return float(ms)


def single_gpu_times(args, device, tokens):
    """(fwd ms, bwd ms) of flashattn on one GPU over the whole sequence, measured on rank 0 (the
    other ranks take part in the collectives of timed() with nothing to do); nan if it does not
    fit."""
    hq, hkv, d = args.heads, args.kv_heads, args.head_dim
    fwd = bwd = lambda: None  # noqa: E731
    fits = True
    if dist.get_rank() == 0:
        try:
            gen = torch.Generator(device=device).manual_seed(tokens)
            mk = lambda h: torch.randn(1, tokens, h, d, device=device, dtype=torch.bfloat16,  # noqa: E731
                                       generator=gen).requires_grad_()
            q, k, v = mk(hq), mk(hkv), mk(hkv)
            dout = torch.randn_like(q)
            fwd = lambda: flashattn.flash_attn_func(q, k, v, causal=True)  # noqa: E731
            out = fwd()
            bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        except torch.OutOfMemoryError:
            fits = False
    tf, tb = timed(fwd, args.iters), timed(bwd, args.iters)
    return (tf, tb) if fits else (float("nan"), float("nan"))


def ring_times(args, device, tokens):
    """(fwd ms, bwd ms) of the ring, each rank holding tokens / W of the sequence."""
    hq, hkv, d = args.heads, args.kv_heads, args.head_dim
    n = tokens // dist.get_world_size()
    gen = torch.Generator(device=device).manual_seed(tokens + dist.get_rank())
    mk = lambda h: torch.randn(1, n, h, d, device=device, dtype=torch.bfloat16,  # noqa: E731
                               generator=gen).requires_grad_()
    q, k, v = mk(hq), mk(hkv), mk(hkv)
    dout = torch.randn_like(q)
    fwd = lambda: ring.ring_flash_attn_func(q, k, v, causal=True, seqlen=tokens)  # noqa: E731
    out = fwd()
    bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
    return timed(fwd, args.iters), timed(bwd, args.iters)


def bench(args, device):
    world = dist.get_world_size()
    log("\n== scaling: one layer, batch 1, hq %d, hkv %d, d %d, bf16, causal, zig-zag; W = %d"
        % (args.heads, args.kv_heads, args.head_dim, world))
    log("%8s %10s %10s %10s %10s %9s %11s" % ("tokens", "1 GPU fwd", "1 GPU bwd", "ring fwd",
                                              "ring bwd", "speed-up", "efficiency"))
    for tokens in args.tokens:
        t1f, t1b = single_gpu_times(args, device, tokens)
        torch.cuda.empty_cache()
        t1 = torch.tensor([t1f, t1b], device=device)
        dist.broadcast(t1, 0)
        t1f, t1b = float(t1[0]), float(t1[1])
        trf, trb = ring_times(args, device, tokens)
        torch.cuda.empty_cache()
        speedup = (t1f + t1b) / (trf + trb)
        log("%8d %10.2f %10.2f %10.2f %10.2f %9.2f %10.0f%%" % (tokens, t1f, t1b, trf, trb, speedup,
                                                               100 * speedup / world))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--tokens", default="32768,65536,131072,262144",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--shrink", type=int, default=1, help="divide the check's lengths by this")
    args = parser.parse_args()
    if not args.check and not args.bench:
        args.check = args.bench = True
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        sys.exit("bench_ring.py: NCCL_NVLS_ENABLE=0 must be set (NVLink multicast stays off)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    log("bench_ring: %d ranks, %s, torch %s, flashattn library %s" % (
        dist.get_world_size(), torch.cuda.get_device_name(device), torch.__version__,
        flashattn.library_version()))
    failures = 0
    t0 = time.time()
    if args.check:
        failures = check(args, device)
    if args.bench:
        bench(args, device)
    log("\nbench_ring: %d failures, %.0f s" % (failures, time.time() - t0))
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
