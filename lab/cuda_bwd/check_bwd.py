"""check_bwd.py: correctness and determinism of the CUDA backward (fa_backward through ctypes on
torch CUDA tensors) against float64 autograd of the same attention, built in torch with masks,
softcap, ALiBi and sinks.

Rule (FlashAttention's): for dq, dk, dv, dsink, max|ours - ref64| <= 2 * max|plain - ref64| + floor,
where `plain` is the autograd gradient of materialised attention from the same dtype inputs (QK^T in
the dtype, fp32 scale/softcap/softmax, P rounded to the dtype, PV in the dtype) and floor is tiny
(5e-5 + 5e-4 * max|ref|). O and LSE fed to the backward come from the float64 forward (O rounded
to the dtype), so this checks the backward alone. Outputs are poisoned with NaN first: every
element must be written, and the padding of strided outputs must stay untouched. Fresh random
inputs per case (v offset by +0.5).

Usage: python3 lab/cuda_bwd/check_bwd.py build-gpubwd/libflashattn.so [--quick]
Prints one line per case and a final "check_bwd: N passed, M failed".
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa_bwd_ctypes as fc  # noqa: E402

DEV = os.environ.get("FA_CHECK_DEVICE", "cuda")  # "cpu": dry run of the harness itself
NEG = -1e30  # finite mask value: no inf - inf in autograd


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def stream():
    return torch.cuda.current_stream().cuda_stream if DEV == "cuda" else 0


def attention_seq(q, k, v, sinks, alibi, *, mode, scale, causal, window, softcap):
    """One sequence: q [sq, hq, d], k [sk, hkv, d], v [sk, hkv, dv] (leaf tensors: float64 for
    'ref', the dtype for 'plain'). Returns o [sq, hq, dv] and lse [hq, sq] (natural log, -inf for
    a row with no visible key and no sink)."""
    sq, hq, _ = q.shape
    sk, hkv, _ = v.shape
    g = hq // hkv
    kf, vf = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("ihd,jhd->hij", q, kf)
    if mode == "plain":
        s = s.float()
    s = s * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=DEV).view(sq, 1)
    j = torch.arange(sk, device=DEV).view(1, sk)
    diag = i + sk - sq
    if alibi is not None:
        s = s - alibi.to(s.dtype).view(hq, 1, 1) * (diag - j).abs().to(s.dtype)
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=DEV)
    if wl >= 0:
        vis &= j >= diag - wl
    if wr >= 0:
        vis &= j <= diag + wr
    s = s.masked_fill(~vis, NEG)
    cols = s
    if sinks is not None:
        cols = torch.cat([s, sinks.to(s.dtype).view(hq, 1, 1).expand(hq, sq, 1)], dim=2)
    lse = torch.logsumexp(cols, dim=2)
    live = vis.any(1) if sinks is None else torch.ones(sq, dtype=torch.bool, device=DEV)
    p = torch.exp(s - lse.unsqueeze(2)) * live.view(1, sq, 1).to(s.dtype)
    if mode == "plain":
        p = p.to(q.dtype)
    o = torch.einsum("hij,jhd->ihd", p, vf)
    lse = torch.where(live.view(1, sq), lse.detach(), torch.full_like(lse, float("-inf")))
    return o, lse


def run_reference(case, q, k, v, do, sinks, alibi, mode):
    """Gradients (dq, dk, dv, dsink) and (o, lse) of the whole problem in `mode`."""
    dt = q.dtype
    w = torch.float64 if mode == "ref" else None
    leaves = [x.detach().to(w or dt).requires_grad_() for x in (q, k, v)]
    sink_leaf = None
    if sinks is not None:
        sink_leaf = sinks.detach().to(torch.float64 if mode == "ref" else torch.float32).requires_grad_()
    ql, kl, vl = leaves
    kw = dict(mode=mode, scale=case["scale"], causal=case["causal"], window=case["window"], softcap=case["softcap"])
    outs, lses = [], []
    if case["cu_q"] is None:
        for b in range(q.shape[0]):
            a = None
            if alibi is not None:
                a = alibi[b] if alibi.dim() == 2 else alibi
            o, lse = attention_seq(ql[b], kl[b], vl[b], sink_leaf, a, **kw)
            outs.append(o)
            lses.append(lse)
        o_all = torch.stack(outs)
        lse_all = torch.stack(lses)  # [b, hq, sq]
    else:
        cq, ck = case["cu_q"], case["cu_k"]
        for b in range(len(cq) - 1):
            a = None
            if alibi is not None:
                a = alibi[b] if alibi.dim() == 2 else alibi
            o, lse = attention_seq(ql[cq[b]:cq[b + 1]], kl[ck[b]:ck[b + 1]], vl[ck[b]:ck[b + 1]], sink_leaf, a, **kw)
            outs.append(o)
            lses.append(lse)
        o_all = torch.cat(outs, 0)
        lse_all = torch.cat(lses, 1)  # [hq, rows in sequences]
    wrt = leaves + ([sink_leaf] if sink_leaf is not None else [])
    grad_o = (do[: o_all.shape[0]] if case["cu_q"] is not None else do).to(o_all.dtype)
    grads = torch.autograd.grad(o_all, wrt, grad_outputs=grad_o, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, wrt)]
    dq, dk, dv = grads[:3]
    dsink = grads[3] if sink_leaf is not None else None
    return (dq, dk, dv, dsink), (o_all.detach(), lse_all)


def make_case(name, *, b=1, sq=128, sk=128, hq=2, hkv=None, d=64, dv=None, dtype=torch.bfloat16,
              causal=False, window=(-1, -1), softcap=0.0, alibi=None, sinks=False, varlen=None,
              layout="bshd", strided_out=False, deterministic=False, workspace=False, scale=0.0,
              lib_forward=False):
    return dict(name=name, b=b, sq=sq, sk=sk, hq=hq, hkv=hkv or hq, d=d, dv=dv or d, dtype=dtype,
                causal=causal, window=window, softcap=softcap, alibi=alibi, sinks=sinks,
                varlen=varlen, layout=layout, strided_out=strided_out, deterministic=deterministic,
                workspace=workspace, scale=scale, lib_forward=lib_forward)


def alloc(shape, dtype, layout, fill=None):
    """[b, s, h, d] tensor, contiguous ('bshd') or a [b, h, s, d] storage viewed as bshd ('bhsd')."""
    if layout == "bhsd" and len(shape) == 4:
        b, s, h, d = shape
        t = torch.empty(b, h, s, d, device=DEV, dtype=dtype).transpose(1, 2)
    else:
        t = torch.empty(shape, device=DEV, dtype=dtype)
    if fill is not None:
        t.copy_(fill)
    return t


def padded_output(shape, dtype):
    """Output view whose rows have 8 extra NaN elements after each head (strides not dense)."""
    big = torch.full(tuple(shape[:-1]) + (shape[-1] + 8,), float("nan"), device=DEV, dtype=dtype)
    return big, big[..., : shape[-1]]


def run_case(lib, case):
    torch.manual_seed(hash(case["name"]) % (2**31))
    dt = case["dtype"]
    hq, hkv, d, dv = case["hq"], case["hkv"], case["d"], case["dv"]
    varlen = case["varlen"] is not None
    if varlen:
        lq, lk = case["varlen"]
        cu_q = [0]
        cu_k = [0]
        for x, y in zip(lq, lk):
            cu_q.append(cu_q[-1] + x)
            cu_k.append(cu_k[-1] + y)
        case["cu_q"], case["cu_k"] = cu_q, cu_k
        pad = 3  # packed rows after the last sequence (never read as sequence data)
        tq, tk = cu_q[-1] + pad, cu_k[-1] + pad
        qshape, kshape, vshape, oshape = (tq, hq, d), (tk, hkv, d), (tk, hkv, dv), (tq, hq, dv)
        nb = len(lq)
        max_q, max_k = max(lq), max(lk)
    else:
        case["cu_q"] = case["cu_k"] = None
        b, sq, sk = case["b"], case["sq"], case["sk"]
        qshape, kshape, vshape, oshape = (b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, dv), (b, sq, hq, dv)
        nb = b
        max_q, max_k = sq, sk
    lay = case["layout"]
    q = alloc(qshape, dt, lay, torch.randn(qshape, device=DEV))
    k = alloc(kshape, dt, lay, torch.randn(kshape, device=DEV))
    v = alloc(vshape, dt, lay, torch.randn(vshape, device=DEV) + 0.5)
    do = alloc(oshape, dt, lay, torch.randn(oshape, device=DEV))
    sinks = torch.randn(hq, device=DEV, dtype=torch.float32) if case["sinks"] else None
    alibi = None
    alibi_bs = 0
    if case["alibi"] == "head":
        alibi = torch.rand(hq, device=DEV, dtype=torch.float32) * 0.3
    elif case["alibi"] == "batch":
        alibi = torch.rand(nb, hq, device=DEV, dtype=torch.float32) * 0.3
        alibi_bs = hq
    scale = case["scale"] if case["scale"] != 0.0 else 1.0 / math.sqrt(d)
    case["scale"] = scale

    ref_g, (o_ref, lse_ref) = run_reference(case, q, k, v, do, sinks, alibi, "ref")
    pl_g, _ = run_reference(case, q, k, v, do, sinks, alibi, "plain")
    for name, gr in zip(("dq", "dk", "dv"), ref_g[:3]):
        if not torch.isfinite(gr).all():
            return False, f"reference {name} not finite"

    # O (rounded to the dtype) and LSE in the library layout
    o = alloc(oshape, dt, lay)
    o.fill_(0.0)
    if varlen:
        o[: o_ref.shape[0]] = o_ref.to(dt)
        lse = torch.zeros(hq, qshape[0], device=DEV, dtype=torch.float32)
        lse[:, : lse_ref.shape[1]] = lse_ref.float()
    else:
        o.copy_(o_ref.to(dt))
        lse = lse_ref.float().contiguous()

    if case["strided_out"]:
        dq_big, dq = padded_output(qshape, dt)
        dk_big, dk = padded_output(kshape, dt)
        dv_big, dvt = padded_output(vshape, dt)
    else:
        dq = torch.full(qshape, float("nan"), device=DEV, dtype=dt)
        dk = torch.full(kshape, float("nan"), device=DEV, dtype=dt)
        dvt = torch.full(vshape, float("nan"), device=DEV, dtype=dt)
    dsink = torch.full((hq,), float("nan"), device=DEV, dtype=torch.float32) if sinks is not None else None
    cu_q_t = torch.tensor(case["cu_q"], device=DEV, dtype=torch.int32) if varlen else None
    cu_k_t = torch.tensor(case["cu_k"], device=DEV, dtype=torch.int32) if varlen else None

    def call(det):
        p = fc.make_params(q, k, v, o, lse, do, dq, dk, dvt, cu_q=cu_q_t, cu_k=cu_k_t, max_q=max_q,
                           max_k=max_k, causal=case["causal"], window=case["window"],
                           softcap=case["softcap"], scale=scale, alibi=alibi, alibi_batch_stride=alibi_bs,
                           sinks=sinks, dsink=dsink, deterministic=det,
                           stream=stream())
        ws = None
        if case["workspace"]:
            st, nbytes = lib.check_backward(p)
            if st != 0:
                return st
            ws = torch.empty(nbytes + 256, device=DEV, dtype=torch.uint8)
            off = (-ws.data_ptr()) % 256
            p.workspace, p.workspace_bytes = ws.data_ptr() + off, nbytes
        st = lib.backward(p)
        sync()
        return st

    if case["lib_forward"]:
        # end to end: O and LSE from the library's own CUDA forward instead of the reference
        p = fc.make_params(q, k, v, o, lse, do, dq, dk, dvt, cu_q=cu_q_t, cu_k=cu_k_t, max_q=max_q,
                           max_k=max_k, causal=case["causal"], window=case["window"],
                           softcap=case["softcap"], scale=scale, alibi=alibi, alibi_batch_stride=alibi_bs,
                           sinks=sinks, stream=stream())
        st = lib.lib.fa_forward(fc.C.byref(p))
        sync()
        if st != 0:
            return False, f"fa_forward status {st}: {lib.last_error()}"
    st = call(case["deterministic"])
    if st != 0:
        return False, f"fa_backward status {st}: {lib.last_error()}"

    msgs = []
    ok = True
    if varlen:
        rows_q = torch.cat([torch.arange(case["cu_q"][i], case["cu_q"][i + 1]) for i in range(nb)]).to(DEV)
        rows_k = torch.cat([torch.arange(case["cu_k"][i], case["cu_k"][i + 1]) for i in range(nb)]).to(DEV)
        ours = (dq.index_select(0, rows_q), dk.index_select(0, rows_k), dvt.index_select(0, rows_k))
        ref3 = (ref_g[0][: len(rows_q)], ref_g[1][: len(rows_k)], ref_g[2][: len(rows_k)])
        pl3 = (pl_g[0][: len(rows_q)], pl_g[1][: len(rows_k)], pl_g[2][: len(rows_k)])
    else:
        ours, ref3, pl3 = (dq, dk, dvt), ref_g[:3], pl_g[:3]
    names = ["dq", "dk", "dv"]
    if sinks is not None:
        ours, ref3, pl3 = ours + (dsink,), ref3 + (ref_g[3],), pl3 + (pl_g[3],)
        names.append("dsink")
    for name, x, r, pl in zip(names, ours, ref3, pl3):
        if x.numel() == 0:
            continue
        nan = torch.isnan(x).sum().item()
        if nan:
            ok = False
            msgs.append(f"{name}: {nan} NaN (unwritten?)")
            continue
        err = (x.double() - r).abs().max().item()
        perr = (pl.double() - r).abs().max().item()
        floor = 5e-5 + 5e-4 * r.abs().max().item()
        tol = 2 * perr + floor
        good = err <= tol
        ok &= good
        msgs.append(f"{name} {err:.2e}/{tol:.2e}{'' if good else ' FAIL'}")
    if case["strided_out"]:
        for name, big, dim in (("dq", dq_big, d), ("dk", dk_big, d), ("dv", dv_big, dv)):
            if not torch.isnan(big[..., dim:]).all():
                ok = False
                msgs.append(f"{name} padding overwritten")
    if case["deterministic"]:
        first = [x.clone() for x in (dq, dk, dvt)]
        call(True)
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(first, (dq, dk, dvt)))
        ok &= same
        msgs.append("bitwise-repeatable" if same else "NOT repeatable")
    return ok, "  ".join(msgs)


def cases(quick):
    bf, f16 = torch.bfloat16, torch.float16
    c = [
        make_case("basic d64", b=2, sq=128, sk=128, hq=2, d=64),
        make_case("odd causal f16", b=1, sq=113, sk=203, hq=3, d=64, dtype=f16, causal=True),
        make_case("sq>sk causal GQA d128 (masked rows)", b=2, sq=203, sk=113, hq=4, hkv=2, d=128, causal=True),
        make_case("d256 causal", b=1, sq=257, sk=257, hq=2, d=256, causal=True),
        make_case("d256 noncausal f16 GQA", b=2, sq=190, sk=333, hq=4, hkv=2, d=256, dtype=f16),
        make_case("d32 MQA f16", b=2, sq=77, sk=300, hq=4, hkv=1, d=32, dtype=f16),
        make_case("d64 dv128", b=1, sq=190, sk=190, hq=2, d=64, dv=128, causal=True),
        make_case("d128 dv64 window", b=1, sq=150, sk=260, hq=2, d=128, dv=64, window=(40, 7)),
        make_case("d96 window", b=2, sq=200, sk=200, hq=2, d=96, window=(32, 16)),
        make_case("d8 tiny", b=1, sq=50, sk=37, hq=2, d=8),
        make_case("d200 dv256 f16", b=1, sq=96, sk=140, hq=2, d=200, dv=256, dtype=f16, causal=True),
        make_case("softcap causal d128", b=1, sq=256, sk=256, hq=2, d=128, causal=True, softcap=5.0, scale=0.5),
        make_case("alibi head causal", b=2, sq=160, sk=160, hq=4, d=64, causal=True, alibi="head"),
        make_case("alibi batch window f16", b=2, sq=100, sk=180, hq=2, d=128, dtype=f16, alibi="batch", window=(50, 20)),
        make_case("sinks window GQA d128", b=2, sq=150, sk=150, hq=4, hkv=2, d=128, window=(30, 0), sinks=True),
        make_case("sinks masked rows", b=1, sq=200, sk=90, hq=2, d=64, causal=True, sinks=True),
        make_case("softcap+alibi+sinks d256", b=1, sq=130, sk=130, hq=2, d=256, causal=True, softcap=8.0, alibi="head", sinks=True),
        make_case("varlen causal GQA d64", hq=4, hkv=2, d=64, causal=True, varlen=([0, 37, 128, 1, 200], [5, 37, 300, 0, 130])),
        make_case("varlen sinks softcap alibi d128 f16", hq=2, d=128, dtype=f16, softcap=6.0, alibi="batch", sinks=True,
                  varlen=([70, 0, 129], [64, 10, 257])),
        make_case("varlen d256 window", hq=2, d=256, window=(20, 20), varlen=([100, 3], [70, 300])),
        make_case("bhsd layout + strided outputs d128", b=2, sq=200, sk=260, hq=4, hkv=2, d=128, causal=True,
                  layout="bhsd", strided_out=True),
        make_case("bhsd + strided d64 workspace", b=1, sq=300, sk=300, hq=2, d=64, layout="bhsd", strided_out=True, workspace=True),
        make_case("seqlen_q 0", b=1, sq=0, sk=70, hq=2, d=64),
        make_case("seqlen_k 0 sinks", b=1, sq=70, sk=0, hq=2, d=64, sinks=True),
        make_case("GQA group split d64", b=1, sq=256, sk=256, hq=16, hkv=1, d=64, causal=True),
        make_case("GQA group split d256 varlen", hq=8, hkv=2, d=256, varlen=([64, 90], [64, 100])),
        make_case("large noncausal d128", b=2, sq=1024, sk=1024, hq=4, d=128),
        make_case("large causal d64 f16", b=1, sq=1000, sk=1000, hq=4, hkv=2, d=64, dtype=f16, causal=True),
        make_case("deterministic causal d128 GQA", b=1, sq=1000, sk=1100, hq=4, hkv=2, d=128, causal=True, deterministic=True),
        make_case("deterministic d256 window", b=2, sq=300, sk=300, hq=2, d=256, window=(100, 30), deterministic=True),
        make_case("deterministic d64 varlen sinks", hq=4, hkv=1, d=64, sinks=True, deterministic=True,
                  varlen=([300, 0, 17], [400, 5, 17])),
        make_case("fa_forward -> fa_backward d128 causal GQA sinks", b=2, sq=300, sk=300, hq=4, hkv=2, d=128,
                  causal=True, sinks=True, lib_forward=True),
        make_case("fa_forward -> fa_backward varlen softcap alibi d64", hq=2, d=64, softcap=5.0, alibi="head",
                  varlen=([90, 200], [120, 200]), lib_forward=True),
    ]
    return c[:8] if quick else c


def determinism_default(lib):
    """Default (non-deterministic) mode: dk, dv must still be bitwise equal run to run; report dq."""
    torch.manual_seed(7)
    b, s, hq, hkv, d = 2, 2048, 8, 2, 128
    q = torch.randn(b, s, hq, d, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(b, s, hkv, d, device=DEV, dtype=torch.bfloat16)
    do = torch.randn(b, s, hq, d, device=DEV, dtype=torch.bfloat16)
    o = torch.randn(b, s, hq, d, device=DEV, dtype=torch.bfloat16)
    lse = torch.randn(b, hq, s, device=DEV, dtype=torch.float32) + 8.0
    outs = []
    for _ in range(2):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        p = fc.make_params(q, k, v, o, lse, do, dq, dk, dv, causal=True, stream=stream())
        st = lib.backward(p)
        sync()
        if st != 0:
            return False, f"status {st}: {lib.last_error()}"
        outs.append((dq, dk, dv))
    eq = [torch.equal(a.view(torch.int16), b_.view(torch.int16)) for a, b_ in zip(*outs)]
    return eq[1] and eq[2], f"default mode, two runs: dq equal={eq[0]} dk equal={eq[1]} dv equal={eq[2]}"


def main():
    lib = fc.Lib(sys.argv[1] if len(sys.argv) > 1 else "build-gpubwd/libflashattn.so")
    quick = "--quick" in sys.argv
    npass = nfail = 0
    for case in cases(quick):
        try:
            ok, msg = run_case(lib, case)
        except Exception as e:  # a crash in one case must not hide the others
            ok, msg = False, f"exception: {type(e).__name__}: {e}"
        npass += ok
        nfail += not ok
        print(f"{'PASS' if ok else 'FAIL'} {case['name']:40s} {msg}", flush=True)
    ok, msg = determinism_default(lib)
    npass += ok
    nfail += not ok
    print(f"{'PASS' if ok else 'FAIL'} {'determinism (default mode)':40s} {msg}", flush=True)
    print(f"check_bwd: {npass} passed, {nfail} failed", flush=True)


if __name__ == "__main__":
    main()
