"""hbwd_lab.py: correctness, sanitizer driver and timing of the lab sm_90a backward for d = 256
(lab/hopper_bwd/v2, build-hbwd2/libhopper_bwd.so built by run_on_gpu.sh; v1's harness with the
d = 256 shapes).

  check LIB [--quick]   against float64 autograd of materialised attention, FlashAttention's rule
                        (as lab/cuda_bwd/check_bwd.py): for dq, dk, dv
                        max|ours - ref64| <= 2 * max|plain - ref64| + 5e-5 + 5e-4 * max|ref64|,
                        plain = autograd of attention in the inputs' dtype (QK^T in the dtype, fp32
                        softmax, P rounded to the dtype). O (rounded to the dtype) and LSE come from
                        the float64 forward, so this checks the backward alone. Random inputs, v and
                        O offset (+0.5); outputs poisoned with NaN (every element written, padding of
                        strided outputs untouched); fully masked rows (sq > sk, causal); a second
                        call bitwise equal for dk/dv (dq's fp32 atomics may land in another order:
                        within one 16-bit ulp of max|dq|); error statuses for bad arguments.
  check LIB --model     the same checks on the CPU (torch CPU) with layout_model.py's numpy
                        transcription of the kernels in place of the library: tests the harness
  sanitize LIB          small shapes through hopper_bwd_selftime, no torch in the process
                        (run under compute-sanitizer)
  bench LIB             standard shapes (bf16, b*s = 16k tokens, hidden 2048, h = 2048/d = 8),
                        backward TFLOP/s = 2.5 * 4*b*h*s^2*d (halved causal) / median time
                        (triton do_bench), ours and PyTorch SDPA FLASH_ATTENTION (FA2) and
                        CUDNN_ATTENTION backward (torch.autograd.grad of a saved graph) in one process
  selftime LIB          the same shapes, ours only, timed inside the library (no torch)
  table JSON...         merge bench/selftime results, print the compact table

Every command takes --dry: parse the arguments, print the plan, touch no GPU (and import no torch);
with an existing LIB it also loads it and calls the validation paths that need no GPU.
"""
import argparse
import ctypes as C
import json
import math
import os
import sys

I64, VP = C.c_int64, C.c_void_p
FA_OK, FA_DTYPE_F16, FA_DTYPE_BF16 = 0, 1, 2
TENSORS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


class HopperBwdArgs(C.Structure):
    """Mirror of hopper_bwd_args (lab/hopper_bwd/v2/hopper_bwd.h, the same layout as v1's)."""
    _fields_ = [
        ("dtype", C.c_int), ("causal", C.c_int),
        ("batch", I64), ("seqlen_q", I64), ("seqlen_k", I64), ("heads_q", I64), ("heads_kv", I64),
        ("head_dim", I64),
        ("q", VP), ("k", VP), ("v", VP), ("o", VP), ("dout", VP), ("lse", VP),
        ("dq", VP), ("dk", VP), ("dv", VP),
    ] + [(f"{t}_{a}_stride", I64) for t in TENSORS for a in ("batch", "row", "head")] + [
        ("softmax_scale", C.c_float), ("workspace", VP), ("workspace_bytes", I64), ("stream", VP),
    ]


class Lib:
    def __init__(self, path):
        self.lib = C.CDLL(os.path.abspath(path))
        self.lib.hopper_bwd.argtypes = [C.POINTER(HopperBwdArgs)]
        self.lib.hopper_bwd.restype = C.c_int
        self.lib.hopper_bwd_last_error.restype = C.c_char_p
        self.lib.hopper_bwd_workspace_size.argtypes = [I64] * 4
        self.lib.hopper_bwd_workspace_size.restype = I64
        self.lib.hopper_bwd_tile_shape.argtypes = [C.c_int] + [C.POINTER(C.c_int)] * 4
        self.lib.hopper_bwd_selftime.argtypes = [C.c_int] + [I64] * 6 + [C.c_int] * 3 + [C.POINTER(C.c_float)]
        self.lib.hopper_bwd_selftime.restype = C.c_int

    def bwd(self, args):
        return self.lib.hopper_bwd(C.byref(args))

    def error(self):
        return self.lib.hopper_bwd_last_error().decode()

    def workspace(self, b, sq, hq, d):
        return self.lib.hopper_bwd_workspace_size(b, sq, hq, d)

    def tile(self, d):
        v = [C.c_int() for _ in range(4)]
        if self.lib.hopper_bwd_tile_shape(d, *[C.byref(x) for x in v]) != 0:
            return None
        return tuple(x.value for x in v)

    def selftime(self, dtype, b, sq, sk, hq, hkv, d, causal, warmup, reps):
        ms = C.c_float()
        st = self.lib.hopper_bwd_selftime(dtype, b, sq, sk, hq, hkv, d, int(causal), warmup, reps, C.byref(ms))
        return st, ms.value


class ModelLib(Lib):
    """`check --model`: the same checks on the CPU (torch CPU build), with layout_model.py's numpy
    transcription of the kernels in place of the library: a dry run of the harness itself. The
    validation statuses still come from the real library (it is loaded; no GPU call happens
    before validation), the numbers from the model."""

    def __init__(self, path):
        super().__init__(path)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import layout_model
        self.model = layout_model

    def bwd(self, args):
        import numpy as np
        import torch
        t, lse, ws, causal, scale = args.tensors
        st = self.lib.hopper_bwd(C.byref(args)) if ws is None or args.workspace_bytes < ws.numel() \
            or args.head_dim != t["q"].shape[3] or args.heads_kv != t["k"].shape[2] or args.softmax_scale < 0 \
            or args.q_row_stride % 8 or args.seqlen_k != t["k"].shape[1] else FA_OK
        if st != FA_OK:
            return st
        m = self.model
        m.ROUND["fn"] = m.bf16 if t["q"].dtype == torch.bfloat16 else m.f16
        sc = scale if scale > 0 else 1.0 / math.sqrt(t["q"].shape[3])
        arr = {n: t[n].double().cpu().numpy() for n in ("q", "k", "v", "o", "do")}
        dq, dk, dv = m.run_kernel(arr["q"], arr["k"], arr["v"], arr["o"], arr["do"], lse.cpu().numpy(),
                                  causal, sc)
        for n, x in (("dq", dq), ("dk", dk), ("dv", dv)):
            t[n].copy_(torch.from_numpy(np.ascontiguousarray(x)))
        return FA_OK


def make_args(t, lse, workspace, causal, scale=0.0, stream=0):
    """t: dict of torch [b, s, h, d] views q, k, v, o, do, dq, dk, dv (last dim contiguous);
    lse [b, hq, sq] fp32 contiguous; workspace a uint8 tensor (or None)."""
    import torch
    a = HopperBwdArgs()
    a.dtype = FA_DTYPE_BF16 if t["q"].dtype == torch.bfloat16 else FA_DTYPE_F16
    a.causal = int(causal)
    a.batch, a.seqlen_q, a.heads_q, a.head_dim = t["q"].shape
    a.seqlen_k, a.heads_kv = t["k"].shape[1], t["k"].shape[2]
    for name in TENSORS:
        setattr(a, "dout" if name == "do" else name, t[name].data_ptr())
        for i, ax in enumerate(("batch", "row", "head")):
            setattr(a, f"{name}_{ax}_stride", t[name].stride(i))
    a.lse = lse.data_ptr()
    a.softmax_scale = scale
    if workspace is not None:
        a.workspace = workspace.data_ptr()
        a.workspace_bytes = workspace.numel()
    a.stream = stream
    a.tensors = (t, lse, workspace, causal, scale)  # for ModelLib (check --model)
    return a


# ---------------------------------------------------------------------------------------------
# check

def check_cases(quick):
    """(name, b, sq, sk, hq, hkv, d, causal, dtype, layout)."""
    cases = []
    for c in (0, 1):
        cases += [
            ("one tile", 1, 64, 64, 1, 1, 256, c, "bf16", "dense"),
            ("two key blocks", 1, 128, 128, 2, 2, 256, c, "bf16", "dense"),
            ("odd 113 gqa", 2, 113, 113, 4, 2, 256, c, "bf16", "dense"),
            ("odd 203 gqa f16", 2, 203, 203, 4, 2, 256, c, "f16", "dense"),
            ("sq<sk f16", 2, 200, 1000, 4, 2, 256, c, "f16", "dense"),
            ("sq<sk mqa", 1, 77, 333, 2, 1, 256, c, "bf16", "dense"),
            ("sq>sk (masked rows)", 2, 300, 100, 4, 4, 256, c, "bf16", "dense"),
            ("sq>sk (masked rows) f16", 1, 203, 59, 2, 2, 256, c, "f16", "dense"),
            ("sq=1", 2, 1, 513, 4, 2, 256, c, "bf16", "dense"),
            ("sk=1", 1, 513, 1, 2, 1, 256, c, "bf16", "dense"),
            ("sq=7 sk=7", 1, 7, 7, 2, 2, 256, c, "bf16", "dense"),
            ("strided", 2, 333, 333, 4, 2, 256, c, "bf16", "strided"),
            ("strided gqa f16", 1, 259, 130, 6, 2, 256, c, "f16", "strided"),
        ]
        if not quick:
            cases += [
                ("1023 mqa f16", 1, 1023, 1023, 4, 1, 256, c, "f16", "dense"),
                ("1023 gqa", 1, 1023, 1023, 8, 2, 256, c, "bf16", "dense"),
                ("2048", 1, 2048, 2048, 4, 4, 256, c, "bf16", "dense"),
                ("2048 f16", 1, 2048, 2048, 2, 2, 256, c, "f16", "dense"),
                ("sq>sk 1000/129", 1, 1000, 129, 4, 1, 256, c, "f16", "strided"),
            ]
    return cases


def attention(q, k, v, causal, scale, mode):
    """q [b, sq, hq, d], k/v [b, sk, hkv, d] leaf tensors (float64 for 'ref', the dtype for
    'plain'). Returns o [b, sq, hq, d] and lse [b, hq, sq] (natural log, -inf for a row with no
    visible key; such rows give o = 0)."""
    import torch
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    kf, vf = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, kf)
    if mode == "plain":
        s = s.float()
    s = s * scale
    i = torch.arange(sq, device=q.device).view(sq, 1)
    j = torch.arange(sk, device=q.device).view(1, sk)
    vis = (j <= i + (sk - sq)) if causal else torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    s = s.masked_fill(~vis, -1e30)  # finite: no inf - inf in autograd
    lse = torch.logsumexp(s, dim=3)
    live = vis.any(1).view(1, 1, sq, 1).to(s.dtype)
    p = torch.exp(s - lse.unsqueeze(3)) * live
    if mode == "plain":
        p = p.to(q.dtype)
    o = torch.einsum("bhij,bjhd->bihd", p, vf)
    lse = torch.where(vis.any(1).view(1, 1, sq), lse.detach(), torch.full_like(lse, float("-inf")))
    return o, lse


def gradients(q, k, v, do, causal, scale, mode):
    import torch
    w = torch.float64 if mode == "ref" else q.dtype
    leaves = [x.detach().to(w).requires_grad_() for x in (q, k, v)]
    o, lse = attention(*leaves, causal, scale, mode)
    grads = torch.autograd.grad(o, leaves, grad_outputs=do.to(o.dtype))
    return grads, o.detach(), lse


def make_tensors(b, sq, sk, hq, hkv, d, dtype, layout, dev):
    """Inputs (q, k, v, do) and NaN-poisoned outputs (dq, dk, dv) plus buffers holding them
    (strided: padded rows/heads/dims that must stay NaN), and O's buffer."""
    import torch

    def buf(bb, s, h, dd, fill_nan):
        if layout == "dense":
            big = torch.empty(bb, s, h, dd, device=dev, dtype=dtype)
            view = big
        else:  # [b, s + 1, h + 1, d + 8] storage, viewed at offset (0, 0, 1, 8)
            big = torch.empty(bb, s + 1, h + 1, dd + 8 + 8, device=dev, dtype=dtype)
            view = big[:, :s, 1:, 8:8 + dd]
        if fill_nan:
            big.fill_(float("nan"))
        return big, view

    t, bigs = {}, {}
    for name, s, h in (("q", sq, hq), ("k", sk, hkv), ("v", sk, hkv), ("o", sq, hq), ("do", sq, hq),
                       ("dq", sq, hq), ("dk", sk, hkv), ("dv", sk, hkv)):
        bigs[name], t[name] = buf(b, s, h, d, name.startswith("d") and name != "do")
    t["q"].copy_(torch.randn(b, sq, hq, d, device=dev))
    t["k"].copy_(torch.randn(b, sk, hkv, d, device=dev))
    t["v"].copy_(torch.randn(b, sk, hkv, d, device=dev) + 0.5)
    t["do"].copy_(torch.randn(b, sq, hq, d, device=dev))
    return t, bigs


def run_check(lib, quick, dev="cuda", max_rows=1 << 30):
    import torch
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}
    fails, n = 0, 0
    cuda = dev == "cuda"
    stream = torch.cuda.current_stream().cuda_stream if cuda else 0

    def sync():
        if cuda:
            torch.cuda.synchronize()
    for name, b, sq, sk, hq, hkv, d, causal, dt, layout in check_cases(quick):
        if max(sq, sk) > max_rows:
            continue
        n += 1
        label = f"{name} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} {dt} {layout}"
        t, bigs = make_tensors(b, sq, sk, hq, hkv, d, dtypes[dt], layout, dev)
        scale = 1.0 / math.sqrt(d)
        (rq, rk, rv), o_ref, lse_ref = gradients(t["q"], t["k"], t["v"], t["do"], causal, scale, "ref")
        (pq, pk, pv), _, _ = gradients(t["q"], t["k"], t["v"], t["do"], causal, scale, "plain")
        t["o"].copy_(o_ref.to(t["o"].dtype))
        lse = lse_ref.float().contiguous()
        ws = torch.full((lib.workspace(b, sq, hq, d),), 0xFF, dtype=torch.uint8, device=dev)  # NaN-poisoned
        args = make_args(t, lse, ws, causal, stream=stream)
        st = lib.bwd(args)
        try:
            sync()
        except RuntimeError as e:  # a device fault or a watchdog trap: the context is gone
            print(f"FAIL {label}: {e}", flush=True)
            raise
        if st != FA_OK:
            print(f"FAIL {label}: status {st}: {lib.error()}")
            fails += 1
            continue
        problems = []
        errs = {}
        for gname, ours, ref, plain in (("dq", t["dq"], rq, pq), ("dk", t["dk"], rk, pk), ("dv", t["dv"], rv, pv)):
            if torch.isnan(ours).any():
                problems.append(f"{gname}: {int(torch.isnan(ours).sum())} elements NaN (not written or NaN)")
                continue
            err = (ours.double() - ref).abs().max().item()
            err_plain = (plain.double() - ref).abs().max().item()
            floor = 5e-5 + 5e-4 * ref.abs().max().item()
            errs[gname] = (err, err_plain)
            if not (err <= 2 * err_plain + floor):
                problems.append(f"{gname} error {err:.3g} > 2 x plain {err_plain:.3g} + {floor:.2g}")
        if layout == "strided":
            for gname in ("dq", "dk", "dv"):
                pad = bigs[gname].clone()
                view = pad[:, :t[gname].shape[1], 1:, 8:8 + d]
                view.fill_(float("nan"))
                if not torch.isnan(pad).all():
                    problems.append(f"{gname} padding written")
        first = {g: t[g].clone() for g in ("dq", "dk", "dv")}
        st = lib.bwd(args)
        sync()
        if st != FA_OK or not torch.equal(t["dk"], first["dk"]) or not torch.equal(t["dv"], first["dv"]):
            problems.append("second call: dk/dv not bitwise identical")
        else:  # dq sums fp32 atomics in whatever order they land: equal up to rounding
            dq_diff = (t["dq"].float() - first["dq"].float()).abs().max().item()
            ulp = first["dq"].float().abs().max().item() * (2 ** -7 if dt == "bf16" else 2 ** -10)
            if dq_diff > ulp:
                problems.append(f"second call: dq differs by {dq_diff:.3g} (> one 16-bit ulp of max|dq|)")
        if problems:
            fails += 1
            print(f"FAIL {label}: " + "; ".join(problems))
        else:
            print(f"ok   {label}: " + ", ".join(f"{g} {e:.2e} (plain {p:.2e})" for g, (e, p) in errs.items()))
        del t, bigs, ws
    fails += check_errors(lib, dev)
    n += 1
    print(f"check: {n - fails} passed, {fails} failed")
    return fails


def check_errors(lib, dev="cuda"):
    """Bad arguments return the documented status and write nothing."""
    import torch
    t, _ = make_tensors(1, 64, 64, 2, 2, 256, torch.bfloat16, "dense", dev)
    lse = torch.zeros(1, 2, 64, device=dev)
    ws = torch.empty(lib.workspace(1, 64, 2, 256), dtype=torch.uint8, device=dev)
    bad = []
    a = make_args(t, lse, ws, 0)
    a.head_dim = 128
    bad.append(("head_dim 128 (v1's)", a, 5))
    a = make_args(t, lse, ws, 0)
    a.q_row_stride = 2 * 256 + 2  # 1028 bytes: not a multiple of 16
    bad.append(("row stride 130", a, 17))
    a = make_args(t, lse, ws, 0)
    a.heads_kv = 3
    bad.append(("heads_q % heads_kv", a, 4))
    a = make_args(t, lse, ws, 0)
    a.softmax_scale = -1.0
    bad.append(("negative scale", a, 9))
    a = make_args(t, lse, ws, 0)
    a.workspace_bytes = 16
    bad.append(("workspace too small", a, 13))
    a = make_args(t, lse, ws, 0)
    a.seqlen_k = 0
    bad.append(("seqlen_k 0", a, 2))
    fails = 0
    for name, a, want in bad:
        st = lib.bwd(a)
        if st != want:
            print(f"FAIL error case {name}: status {st}, wanted {want}: {lib.error()}")
            fails += 1
    if dev == "cuda":
        torch.cuda.synchronize()
    if not all(torch.isnan(t[g]).all() for g in ("dq", "dk", "dv")):
        print("FAIL error cases wrote an output")
        fails += 1
    if not fails:
        print("ok   error statuses")
    return fails


# ---------------------------------------------------------------------------------------------
# sanitize / selftime / bench

SAN_SHAPES = [  # (b, sq, sk, hq, hkv, d, causal)
    (1, 200, 200, 4, 2, 256, 1),
    (1, 130, 300, 2, 1, 256, 0),
    (1, 300, 100, 2, 2, 256, 1),
    (1, 77, 333, 2, 1, 256, 0),
]


def run_sanitize(lib, max_runs=1 << 30):
    """Every shape in both dtypes; with max_runs below that, the shapes in order with alternating
    dtypes (racecheck is slow)."""
    runs = [(shape, dtype) for shape in SAN_SHAPES for dtype in (FA_DTYPE_BF16, FA_DTYPE_F16)]
    if max_runs < len(runs):
        runs = [(shape, (FA_DTYPE_BF16, FA_DTYPE_F16)[i % 2]) for i, shape in enumerate(SAN_SHAPES)][:max_runs]
    fails = 0
    for (b, sq, sk, hq, hkv, d, causal), dtype in runs:
        st, _ = lib.selftime(dtype, b, sq, sk, hq, hkv, d, causal, 1, 0)
        print(f"sanitize b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} dtype{dtype}: status {st}", flush=True)
        fails += st != FA_OK
    return fails


def bench_shapes(a):
    return [(d, c, s) for d in a.d_list for c in a.causal_list for s in a.seq_list]


def flops(d, c, s):
    """Backward FLOPs, FlashAttention's convention: 2.5 x the forward's 4*b*h*s^2*d."""
    b, h = 16384 // s, 2048 // d
    return 2.5 * 4 * b * h * s * s * d / (2 if c else 1)


def emit(path, rec):
    print(json.dumps(rec), flush=True)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def run_selftime(lib, a):
    for d, c, s in bench_shapes(a):
        b, h = 16384 // s, 2048 // d
        st, ms = lib.selftime(FA_DTYPE_BF16, b, s, s, h, h, d, c, 3, a.reps)
        rec = {"d": d, "causal": c, "s": s, "impl": "ours_selftime", "status": st}
        if st == FA_OK:
            rec["ms"] = ms
            rec["tflops"] = flops(d, c, s) / ms / 1e9
        else:
            rec["error"] = lib.error()
        emit(a.json, rec)


def run_bench(lib, a):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
    stream = torch.cuda.current_stream().cuda_stream
    for d, c, s in bench_shapes(a):
        b, h = 16384 // s, 2048 // d
        mk = lambda: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        q, k, v, do = mk(), mk(), mk(), mk()
        fns = {}
        for name in ("cudnn", "fa2"):
            if name not in a.impls:
                continue
            leaves = [x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v)]  # [b, h, s, d] views
            try:
                with sdpa_kernel(backends[name]):
                    o = F.scaled_dot_product_attention(*leaves, is_causal=bool(c))
            except RuntimeError as e:
                emit(a.json, {"d": d, "causal": c, "s": s, "impl": name, "status": 99, "error": str(e)[:200]})
                continue
            dot = do.transpose(1, 2)
            fns[name] = (lambda o=o, leaves=leaves, dot=dot:
                         torch.autograd.grad(o, leaves, grad_outputs=dot, retain_graph=True))
        if "ours" in a.impls:
            t = {"q": q, "k": k, "v": v, "do": do}
            for name in ("o", "dq", "dk", "dv"):
                t[name] = torch.empty_like(q)
            # O random and LSE = log(s): the time does not depend on the values (check covers them);
            # every P = exp(S - LSE) stays bounded
            t["o"].copy_(torch.randn_like(q))
            lse = torch.full((b, h, s), math.log(s), device="cuda", dtype=torch.float32)
            ws = torch.empty(lib.workspace(b, s, h, d), dtype=torch.uint8, device="cuda")
            args = make_args(t, lse, ws, c, stream=stream)
            st = lib.bwd(args)
            torch.cuda.synchronize()
            if st != FA_OK:
                emit(a.json, {"d": d, "causal": c, "s": s, "impl": "ours", "status": st, "error": lib.error()})
            else:
                fns["ours"] = lambda args=args: lib.bwd(args)
        for name, fn in fns.items():
            ms = do_bench(fn, warmup=25, rep=a.rep_ms, return_mode="median")
            rec = {"d": d, "causal": c, "s": s, "impl": name, "status": 0, "ms": ms,
                   "tflops": flops(d, c, s) / ms / 1e9}
            emit(a.json, rec)
        del q, k, v, do, fns
        torch.cuda.empty_cache()


def run_table(paths):
    cells = {}
    for p in paths:
        if not os.path.exists(p):
            continue
        for line in open(p):
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("status") != 0 or "tflops" not in r:
                continue
            impl = r["impl"]
            key = (r["d"], r["causal"], r["s"])
            cells.setdefault(key, {})
            if impl == "ours_selftime" and "ours" in cells[key]:
                continue  # the same-process number wins
            cells[key]["ours" if impl.startswith("ours") else impl] = r["tflops"]
            if impl == "ours_selftime":
                cells[key]["ours_src"] = "self"
    print("\n| d | causal | s | ours | cuDNN | FA2 | ours/cuDNN | ours/FA2 |   (backward TFLOP/s)")
    print("|---|---|---|---|---|---|---|---|")
    for (d, c, s) in sorted(cells):
        x = cells[(d, c, s)]

        def f(name):
            return f"{x[name]:.0f}" if name in x else "-"

        def ratio(name):
            return f"{x['ours'] / x[name]:.2f}" if "ours" in x and name in x else "-"
        mark = "*" if x.get("ours_src") == "self" else ""
        print(f"| {d} | {c} | {s} | {f('ours')}{mark} | {f('cudnn')} | {f('fa2')} | {ratio('cudnn')} | {ratio('fa2')} |")
    if any(x.get("ours_src") == "self" for x in cells.values()):
        print("(* ours timed by hopper_bwd_selftime in a process without torch)")


def dry_abi(lib):
    """Library loads and its GPU-free paths answer: tile shapes, workspace sizes, validation
    errors raised before any CUDA call."""
    print("tile shape d=256 (block_m, block_n, stages, smem):", lib.tile(256), "d=128:", lib.tile(128))
    print("workspace b1 sq1000 h8 d256:", lib.workspace(1, 1000, 8, 256), "bytes; d=128:", lib.workspace(1, 1, 1, 128))
    a = HopperBwdArgs()
    a.dtype, a.head_dim = FA_DTYPE_BF16, 128
    print("head_dim 128 ->", lib.bwd(a), lib.error())
    a.head_dim, a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv = 256, 1, 10, 10, 4, 3
    print("heads 4/3 ->", lib.bwd(a), lib.error())
    a.heads_kv = 2
    print("NULL q ->", lib.bwd(a), lib.error())


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "sanitize", "bench", "selftime"):
        p = sub.add_parser(name)
        p.add_argument("lib")
        p.add_argument("--dry", action="store_true", help="print the plan only (no GPU, no torch)")
        if name == "sanitize":
            p.add_argument("--max", type=int, default=1 << 30, help="at most this many runs (racecheck is slow)")
        if name == "check":
            p.add_argument("--quick", action="store_true", help="skip the 1k-2k shapes")
            p.add_argument("--model", action="store_true",
                           help="CPU dry run of the harness: layout_model.py computes the gradients "
                                "(torch CPU; shapes up to 400 rows)")
        if name in ("bench", "selftime"):
            p.add_argument("--d", default="256", help="head dims (default 256, the only one)")
            p.add_argument("--seqlens", default="2048,4096,8192,16384")
            p.add_argument("--causal", default="0,1")
            p.add_argument("--json", default="", help="append one JSON line per measurement here")
        if name == "bench":
            p.add_argument("--impls", default="ours,cudnn,fa2")
            p.add_argument("--rep-ms", type=int, default=100, help="do_bench rep (ms)")
        if name == "selftime":
            p.add_argument("--reps", type=int, default=20)
    p = sub.add_parser("table")
    p.add_argument("json", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd in ("bench", "selftime"):
        a.d_list = [int(x) for x in a.d.split(",") if x]
        a.seq_list = [int(x) for x in a.seqlens.split(",") if x]
        a.causal_list = [int(x) for x in a.causal.split(",") if x]
        for s in a.seq_list:
            if 16384 % s:
                ap.error(f"seqlen {s} does not divide 16384 tokens")
        for d in a.d_list:
            if d != 256:
                ap.error(f"head dim {d}: this kernel (v2) has 256 only")
    if a.cmd == "bench":
        a.impls = [x for x in a.impls.split(",") if x]
        for x in a.impls:
            if x not in ("ours", "cudnn", "fa2"):
                ap.error(f"unknown impl {x}")
    return a


def main(argv):
    a = parse(argv)
    if a.cmd == "table":
        run_table(a.json)
        return 0
    if getattr(a, "dry", False):
        if a.cmd == "check":
            cases = check_cases(a.quick)
            print(f"check: {len(cases)} cases + error statuses, e.g. {cases[0]}")
        elif a.cmd == "sanitize":
            print(f"sanitize: {len(SAN_SHAPES)} shapes x 2 dtypes")
        else:
            shapes = bench_shapes(a)
            print(f"{a.cmd}: {len(shapes)} shapes {shapes[:3]}..., impls "
                  f"{getattr(a, 'impls', ['ours_selftime'])}, FLOP of the first {flops(*shapes[0]):.3g}")
        if os.path.exists(a.lib):
            dry_abi(Lib(a.lib))
        return 0
    if a.cmd == "check" and a.model:
        return 1 if run_check(ModelLib(a.lib), True, dev="cpu", max_rows=400) else 0
    lib = Lib(a.lib)
    if a.cmd == "check":
        return 1 if run_check(lib, a.quick) else 0
    if a.cmd == "sanitize":
        return 1 if run_sanitize(lib, a.max) else 0
    if a.cmd == "selftime":
        run_selftime(lib, a)
        return 0
    run_bench(lib, a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
