"""check_fwd.py: correctness of the CUDA forward against a float64 reference (torch on the GPU).

Rule (FlashAttention's): max|ours - ref64| <= 2 * max|plain - ref64| + floor, where `plain` is
materialised attention from the same dtype inputs (fp32 scores and softmax, P rounded to the dtype
before P V, output rounded). Outputs are poisoned with NaN first; every element must be written,
padding around a strided output must stay untouched. Fresh random inputs each run.

Usage: python3 lab/cuda_fwd/check_fwd.py build-lab/liblabfwd.so [--quick]
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa_ctypes import load, make_params  # noqa: E402

LIB = sys.argv[1] if len(sys.argv) > 1 else "build-lab/liblabfwd.so"
FN = os.environ.get("FA_FN", "lab_forward")
ERR = os.environ.get("FA_ERR", "lab_last_error")
call, last_error = load(LIB, FN, ERR)
dev = "cuda"
FLOOR_O = 1e-4
FLOOR_LSE = 1e-4


def attention_ref(q, k, v, *, causal, window, softcap, scale, alibi, sinks, mode):
    """One sequence: q [sq, hq, d], k [sk, hkv, d], v [sk, hkv, dv] (dtype tensors).
    mode 'ref': float64 everything. mode 'plain': fp32 scores/softmax from dtype inputs, P rounded
    to the dtype, output rounded. Returns o [sq, hq, dv] (float64) and lse [hq, sq] (float64)."""
    dt = q.dtype
    sq, hq, d = q.shape
    sk, hkv, dv = v.shape
    g = hq // hkv
    w = torch.float64 if mode == "ref" else torch.float32
    qf, kf, vf = q.to(w), k.to(w).repeat_interleave(g, 1), v.to(w).repeat_interleave(g, 1)
    s = torch.einsum("ihd,jhd->hij", qf, kf) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=dev).view(sq, 1)
    j = torch.arange(sk, device=dev).view(1, sk)
    diag = i + sk - sq
    if alibi is not None:
        s = s - alibi.to(w).view(hq, 1, 1) * (diag - j).abs().to(w)
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=dev)
    if wl >= 0:
        vis &= j >= diag - wl
    if wr >= 0:
        vis &= j <= diag + wr
    s = s.masked_fill(~vis, float("-inf"))
    cols = s
    if sinks is not None:
        cols = torch.cat([s, sinks.to(w).view(hq, 1, 1).expand(hq, sq, 1)], dim=2)
    lse = torch.logsumexp(cols, dim=2)  # -inf for a row with nothing
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - lse_safe.unsqueeze(2))
    if mode == "plain":
        p = p.to(dt).to(w)
    o = torch.einsum("hij,jhd->ihd", p, vf)
    if mode == "plain":
        o = o.to(dt)
    return o.double(), lse.double()


def reference(q, k, v, cu_q, cu_k, **kw):
    """Whole problem, canonical [rows, hq, dv] outputs and lse in the library layout."""
    if cu_q is None:
        outs, lses = [], []
        for b in range(q.shape[0]):
            o, lse = attention_ref(q[b], k[b], v[b], alibi=kw["alibi"][b] if kw["alibi"] is not None else None,
                                   **{x: y for x, y in kw.items() if x != "alibi"})
            outs.append(o)
            lses.append(lse)
        return torch.stack(outs), torch.stack(lses)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        o, lse = attention_ref(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]],
                               alibi=kw["alibi"][b] if kw["alibi"] is not None else None,
                               **{x: y for x, y in kw.items() if x != "alibi"})
        outs.append(o)
        lses.append(lse)
    o = torch.cat(outs, 0)
    lse = torch.cat(lses, 1)
    return o, lse


results = []


def check(name, *, b=2, sq=128, sk=128, hq=4, hkv=4, d=64, dv=None, dtype=torch.bfloat16,
          causal=False, window=(-1, -1), softcap=0.0, scale=0.0, alibi=None, sinks=False,
          varlen=None, layout="dense", lse_null=False):
    dv = dv or d
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    cu_q = cu_k = None
    if varlen is not None:
        lq, lk = varlen
        cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=dev)
        tq, tk = int(cu_q[-1]), int(cu_k[-1])
        b, sq, sk = len(lq), max(lq), max(lk)
        q = torch.randn(tq, hq, d, device=dev).to(dtype)
        k = torch.randn(tk, hkv, d, device=dev).to(dtype)
        v = (torch.randn(tk, hkv, dv, device=dev) + 0.5).to(dtype)
        o_buf = torch.full((tq + 5, hq, dv), float("nan"), device=dev, dtype=dtype)
        o = o_buf[:tq]
    elif layout == "dense":
        q = torch.randn(b, sq, hq, d, device=dev).to(dtype)
        k = torch.randn(b, sk, hkv, d, device=dev).to(dtype)
        v = (torch.randn(b, sk, hkv, dv, device=dev) + 0.5).to(dtype)
        o_buf = torch.full((b, sq, hq, dv), float("nan"), device=dev, dtype=dtype)
        o = o_buf
    else:  # strided: q/k/v slices of a packed buffer, o with padded rows, BHSD-ordered k
        qkv = torch.randn(b, sq, 3, hq, max(d, dv), device=dev).to(dtype)
        q = qkv[:, :, 0, :, :d]
        kb = torch.randn(b, hkv, sk + 3, d + 16, device=dev).to(dtype)
        k = kb[:, :, :sk, 8:8 + d].transpose(1, 2)
        v = (torch.randn(b, sk, hkv, dv + 24, device=dev) + 0.5).to(dtype)[..., 16:16 + dv]
        o_buf = torch.full((b, sq + 1, hq, dv + 8), float("nan"), device=dev, dtype=dtype)
        o = o_buf[:, :sq, :, :dv]
    if scale == 0.0:
        scale_used = 1.0 / math.sqrt(d)
    else:
        scale_used = scale
    al = None
    ab_stride = 0
    if alibi == "head":
        al1 = torch.rand(hq, device=dev) * 0.3
        al = al1.view(1, hq).expand(b, hq)
        alibi_t = al1
    elif alibi == "batch":
        alibi_t = torch.rand(b, hq + 3, device=dev) * 0.3
        al = alibi_t[:, :hq]
        ab_stride = hq + 3
    else:
        alibi_t = None
    sink_t = (torch.randn(hq, device=dev) * 2) if sinks else None
    rows_q = q.shape[0] if varlen is not None else b * sq
    lse = None if lse_null else torch.full((hq * rows_q + 7,), float("nan"), device=dev)
    p = make_params(q, k, v, o, lse, cu_q=cu_q, cu_k=cu_k, max_q=sq, max_k=sk, causal=causal,
                    window=window, softcap=softcap, scale=scale, alibi=alibi_t,
                    alibi_batch_stride=ab_stride, sinks=sink_t,
                    stream=torch.cuda.current_stream().cuda_stream)
    st = call(p)
    torch.cuda.synchronize()
    if st != 0:
        results.append((name, False, f"status {st}: {last_error()}"))
        print(f"FAIL {name}: status {st}: {last_error()}", flush=True)
        return
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale_used, alibi=al, sinks=sink_t)
    o_ref, lse_ref = reference(q, k, v, cu_q, cu_k, mode="ref", **kw)
    o_pl, lse_pl = reference(q, k, v, cu_q, cu_k, mode="plain", **kw)
    if varlen is None:
        lse_ref = lse_ref.reshape(-1)
        lse_pl = lse_pl.reshape(-1)
    else:
        lse_ref = lse_ref.reshape(-1)
        lse_pl = lse_pl.reshape(-1)
    o64 = o.double()
    ok = True
    msgs = []
    if torch.isnan(o64).any():
        ok = False
        msgs.append(f"{int(torch.isnan(o64).sum())} O elements unwritten/NaN")
    if layout == "strided" and varlen is None:
        pad_ok = torch.isnan(o_buf[:, sq:]).all() and torch.isnan(o_buf[:, :sq, :, dv:]).all()
        if not pad_ok:
            ok = False
            msgs.append("wrote outside o")
    if varlen is not None and not torch.isnan(o_buf[o.shape[0]:]).all():
        ok = False
        msgs.append("wrote past total_q")
    err = (o64 - o_ref).abs().max().item() if o64.numel() else 0.0
    err_pl = (o_pl - o_ref).abs().max().item() if o64.numel() else 0.0
    tol = 2 * err_pl + FLOOR_O
    if not err <= tol:
        ok = False
        msgs.append(f"O err {err:.3g} > tol {tol:.3g}")
    lerr = 0.0
    if lse is not None:
        n = lse_ref.numel()
        got = lse[:n].double()
        if not torch.isnan(lse[n:]).all():
            ok = False
            msgs.append("wrote past lse")
        inf_ref = torch.isinf(lse_ref)
        if not torch.equal(torch.isinf(got) & (got < 0), inf_ref):
            ok = False
            msgs.append(f"LSE -inf mismatch ({int(inf_ref.sum())} expected)")
        fin = ~inf_ref
        if fin.any():
            lerr = (got[fin] - lse_ref[fin]).abs().max().item()
            lerr_pl = (lse_pl[fin] - lse_ref[fin]).abs().max().item()
            if not lerr <= 2 * lerr_pl + FLOOR_LSE:
                ok = False
                msgs.append(f"LSE err {lerr:.3g} > tol {2 * lerr_pl + FLOOR_LSE:.3g}")
    detail = f"O err {err:.2e} (plain {err_pl:.2e}) LSE err {lerr:.2e} " + "; ".join(msgs)
    results.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def expect_status(name, want, **kw):
    dtype = torch.bfloat16
    d = kw.get("d", 64)
    q = torch.randn(1, 16, 2, d + 8, device=dev).to(dtype)
    qv = q[..., :d] if kw.get("bad_stride") is None else torch.randn(1, 16, 2, d + 4, device=dev).to(dtype)[..., :d]
    k = torch.randn(1, 16, 2, d, device=dev).to(dtype)
    v = torch.randn(1, 16, 2, d, device=dev).to(dtype)
    o = torch.empty(1, 16, 2, d, device=dev, dtype=dtype)
    p = make_params(qv, k, v, o, None, ptr_offset=kw.get("offset"))
    st = call(p)
    ok = st == want
    results.append((name, ok, f"status {st} ({last_error()})"))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: status {st} want {want}: {last_error()}", flush=True)


def main():
    quick = "--quick" in sys.argv
    for dt in (torch.bfloat16, torch.float16):
        t = "bf16" if dt == torch.bfloat16 else "f16"
        for d in ([64, 128, 256] if quick else [8, 32, 40, 64, 72, 96, 128, 160, 192, 256]):
            check(f"{t} d={d} basic", d=d, dtype=dt, sq=97, sk=203)
            check(f"{t} d={d} causal sq<sk", d=d, dtype=dt, sq=113, sk=203, causal=True)
    t = "bf16"
    for d in (64, 128, 256):
        check(f"{t} d={d} causal sq>sk (masked rows)", d=d, sq=203, sk=113, causal=True)
        check(f"{t} d={d} sq=1 sk=1023", d=d, sq=1, sk=1023, b=3)
        check(f"{t} d={d} sq=1023 sk=7 causal", d=d, sq=1023, sk=7, causal=True, b=1)
        check(f"{t} d={d} window(40,10)", d=d, sq=300, sk=260, window=(40, 10))
        check(f"{t} d={d} window(0,0)", d=d, sq=150, sk=150, window=(0, 0))
        check(f"{t} d={d} causal+window(50)", d=d, sq=257, sk=300, causal=True, window=(50, -1))
        check(f"{t} d={d} softcap", d=d, sq=130, sk=190, softcap=5.0, scale=0.5)
        check(f"{t} d={d} alibi head causal", d=d, sq=140, sk=170, alibi="head", causal=True)
        check(f"{t} d={d} alibi batch", d=d, sq=140, sk=170, alibi="batch")
        check(f"{t} d={d} sinks", d=d, sq=120, sk=77, sinks=True)
        check(f"{t} d={d} sinks causal masked rows", d=d, sq=150, sk=60, sinks=True, causal=True)
        check(f"{t} d={d} GQA 8/2", d=d, hq=8, hkv=2, sq=129, sk=255, causal=True)
        check(f"{t} d={d} MQA 6/1", d=d, hq=6, hkv=1, sq=64, sk=100)
        check(f"{t} d={d} strided", d=d, sq=100, sk=150, layout="strided", causal=True)
        check(f"{t} d={d} varlen with empties", d=d, varlen=([50, 0, 130, 7], [60, 9, 0, 200]), causal=True)
        check(f"{t} d={d} varlen sinks+window", d=d, varlen=([33, 129, 1], [200, 129, 0]),
              sinks=True, window=(20, 3))
        check(f"{t} d={d} lse NULL", d=d, lse_null=True, sq=70, sk=70)
        check(f"{t} d={d} sk=0", d=d, sq=70, sk=0)
        check(f"{t} d={d} negative scale", d=d, sq=64, sk=90, scale=-0.1)
        check(f"{t} d={d} all-in softcap+alibi+sink+window+gqa", d=d, hq=4, hkv=2, sq=200, sk=180,
              softcap=10.0, alibi="head", sinks=True, window=(64, 16))
    check("bf16 d=64 dv=128", d=64, dv=128, sq=100, sk=140, causal=True)
    check("bf16 d=128 dv=64", d=128, dv=64, sq=100, sk=140)
    check("bf16 d=256 dv=32", d=256, dv=32, sq=100, sk=140)
    check("f16 d=192 dv=128 varlen", d=192, dv=128, dtype=torch.float16, varlen=([10, 300], [300, 10]))
    check("bf16 d=128 b=1 s=2048 causal h=16", d=128, b=1, sq=2048, sk=2048, hq=16, hkv=16, causal=True)
    check("bf16 d=64 sq=0", d=64, sq=0, sk=10)
    expect_status("misaligned q pointer -> FA_ERR_ALIGNMENT", 17, offset=2)
    expect_status("q_head_stride not multiple of 8 -> FA_ERR_ALIGNMENT", 17, bad_stride=True)
    expect_status("d=12 -> FA_ERR_HEAD_DIM", 5, d=12)
    # determinism: bitwise identical outputs run to run
    q = torch.randn(2, 1000, 8, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, 1100, 2, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn(2, 1100, 2, 128, device=dev, dtype=torch.bfloat16)
    outs = []
    for _ in range(3):
        o = torch.empty(2, 1000, 8, 128, device=dev, dtype=torch.bfloat16)
        lse = torch.empty(2 * 8 * 1000, device=dev)
        st = call(make_params(q, k, v, o, lse, causal=True, stream=torch.cuda.current_stream().cuda_stream))
        torch.cuda.synchronize()
        outs.append((st, o.clone(), lse.clone()))
    det = all(s == 0 for s, _, _ in outs) and all(torch.equal(outs[0][1], x[1]) and torch.equal(outs[0][2], x[2]) for x in outs[1:])
    results.append(("determinism", det, ""))
    print(f"{'ok  ' if det else 'FAIL'} determinism (3 runs bitwise)", flush=True)
    nfail = sum(1 for r in results if not r[1])
    print(f"check_fwd: {len(results) - nfail} passed, {nfail} failed")
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
