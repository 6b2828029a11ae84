"""hopper_lab.py: correctness, sanitizer driver and timing of the lab sm_90a forward kernel
(lab/hopper/v2: variant libraries build-hopper2/libhopper_fwd_<variant>.so, built by run_on_gpu.sh).

LIB is one library path, or a comma-separated list of NAME=PATH (check and bench then loop over
the variants; bench times them all in one process next to cuDNN and FA2, and the table shows one
column per variant).

  check LIB [--quick]      against a float64 torch reference, FlashAttention's rule:
                           max|ours - ref64| <= 2 * max|plain - ref64| + 1e-4 (plain = materialised
                           attention from the same 16-bit inputs, fp32 softmax, P rounded to the
                           dtype); LSE likewise. Outputs poisoned with NaN: every element written,
                           padding untouched; fully masked rows O = 0, LSE = -inf exactly; a second
                           call bitwise equal. Error statuses for bad arguments.
  sanitize LIB             small shapes through hopper_fwd_selftime, no torch in the process
                           (run under compute-sanitizer)
  bench LIB [--impls ours,cudnn,fa2]   standard shapes (bf16, b*s = 16k tokens, hidden 2048,
                           h = 2048/d), TFLOP/s = 4*b*h*s^2*d (halved causal) / median time
                           (triton.testing.do_bench), ours and PyTorch SDPA in one process
  selftime LIB             the same shapes, ours only, timed inside the library (no torch)
  table JSON...            merge bench/selftime results, print the compact table

Every command takes --dry: parse the arguments, print the plan, touch no GPU (and import no torch).
"""
import argparse
import ctypes as C
import json
import math
import os
import sys

I64, VP = C.c_int64, C.c_void_p
FA_OK, FA_DTYPE_F16, FA_DTYPE_BF16 = 0, 1, 2


class HopperArgs(C.Structure):
    """Mirror of hopper_fwd_args (lab/hopper/v2/hopper_fwd.h)."""
    _fields_ = [
        ("dtype", C.c_int), ("causal", C.c_int),
        ("batch", I64), ("seqlen_q", I64), ("seqlen_k", I64), ("heads_q", I64), ("heads_kv", I64),
        ("head_dim", I64),
        ("q", VP), ("k", VP), ("v", VP), ("o", VP), ("lse", VP),
        ("q_batch_stride", I64), ("q_row_stride", I64), ("q_head_stride", I64),
        ("k_batch_stride", I64), ("k_row_stride", I64), ("k_head_stride", I64),
        ("v_batch_stride", I64), ("v_row_stride", I64), ("v_head_stride", I64),
        ("o_batch_stride", I64), ("o_row_stride", I64), ("o_head_stride", I64),
        ("softmax_scale", C.c_float), ("stream", VP),
    ]


class Lib:
    def __init__(self, path):
        self.lib = C.CDLL(os.path.abspath(path))
        self.lib.hopper_fwd.argtypes = [C.POINTER(HopperArgs)]
        self.lib.hopper_fwd.restype = C.c_int
        self.lib.hopper_fwd_last_error.restype = C.c_char_p
        self.lib.hopper_fwd_tile_shape.argtypes = [C.c_int, C.c_int] + [C.POINTER(C.c_int)] * 4
        self.lib.hopper_fwd_selftime.argtypes = [C.c_int] + [I64] * 6 + [C.c_int] * 3 + [C.POINTER(C.c_float)]
        self.lib.hopper_fwd_selftime.restype = C.c_int

    def fwd(self, args):
        return self.lib.hopper_fwd(C.byref(args))

    def error(self):
        return self.lib.hopper_fwd_last_error().decode()

    def tile(self, d, causal=0):
        v = [C.c_int() for _ in range(4)]
        if self.lib.hopper_fwd_tile_shape(d, causal, *[C.byref(x) for x in v]) != 0:
            return None
        return tuple(x.value for x in v)

    def selftime(self, dtype, b, sq, sk, hq, hkv, d, causal, warmup, reps):
        ms = C.c_float()
        st = self.lib.hopper_fwd_selftime(dtype, b, sq, sk, hq, hkv, d, int(causal), warmup, reps, C.byref(ms))
        return st, ms.value


def parse_libs(spec):
    """'path' -> [('ours', path)]; 'a=p1,b=p2' -> [('a', p1), ('b', p2)]."""
    out = []
    for item in spec.split(","):
        name, _, path = item.rpartition("=")
        out.append((name or "ours", path))
    return out


def make_args(q, k, v, o, lse, causal, scale=0.0, stream=0):
    """q [b, sq, hq, d], k/v [b, sk, hkv, d], o [b, sq, hq, d] torch views (last dim contiguous)."""
    import torch
    a = HopperArgs()
    a.dtype = FA_DTYPE_BF16 if q.dtype == torch.bfloat16 else FA_DTYPE_F16
    a.causal = int(causal)
    a.batch, a.seqlen_q, a.heads_q, a.head_dim = q.shape
    a.seqlen_k, a.heads_kv = k.shape[1], k.shape[2]
    a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    a.lse = lse.data_ptr() if lse is not None else None
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        setattr(a, f"{name}_batch_stride", t.stride(0))
        setattr(a, f"{name}_row_stride", t.stride(1))
        setattr(a, f"{name}_head_stride", t.stride(2))
    a.softmax_scale = scale
    a.stream = stream
    return a


# ---------------------------------------------------------------------------------------------
# check

def check_cases(quick):
    """(name, b, sq, sk, hq, hkv, d, causal, dtype, layout)."""
    cases = []
    for c in (0, 1):
        cases += [
            ("d64 one tile", 2, 128, 128, 4, 4, 64, c, "bf16", "dense"),
            ("d128 one tile", 2, 128, 128, 4, 4, 128, c, "bf16", "dense"),
            ("d64 odd 113 gqa", 2, 113, 113, 4, 2, 64, c, "bf16", "dense"),
            ("d128 odd 1023 gqa", 1, 1023, 1023, 8, 2, 128, c, "bf16", "dense"),
            ("d64 1023 mqa f16", 3, 1023, 1023, 6, 1, 64, c, "f16", "dense"),
            ("d128 sq<sk f16", 2, 200, 1000, 4, 2, 128, c, "f16", "dense"),
            ("d128 sq>sk (masked rows)", 2, 300, 100, 4, 4, 128, c, "bf16", "dense"),
            ("d64 sq=1", 2, 1, 513, 4, 2, 64, c, "bf16", "dense"),
            ("d128 sk=1", 1, 513, 1, 2, 1, 128, c, "bf16", "dense"),
            ("d128 strided", 2, 333, 333, 4, 2, 128, c, "bf16", "strided"),
            ("d256 1023 gqa", 2, 1023, 1023, 4, 2, 256, c, "bf16", "dense"),
            ("d256 sq<sk f16", 1, 200, 333, 2, 1, 256, c, "f16", "dense"),
        ]
        if not quick:
            cases += [
                ("d128 4096 gqa", 1, 4096, 4096, 16, 4, 128, c, "bf16", "dense"),
                ("d128 4096 f16", 1, 4096, 4096, 8, 8, 128, c, "f16", "dense"),
                ("d64 4096", 1, 4096, 4096, 8, 8, 64, c, "bf16", "dense"),
                ("d256 2048", 1, 2048, 2048, 4, 4, 256, c, "bf16", "dense"),
                ("d64 64 hq1", 1, 64, 64, 1, 1, 64, c, "bf16", "dense"),
                ("d128 sq>sk 1000/129", 1, 1000, 129, 4, 1, 128, c, "f16", "strided"),
            ]
    cases.append(("d64 sk=0", 2, 77, 0, 4, 2, 64, 0, "bf16", "dense"))
    return cases


def reference(q, k, v, causal, scale, mode):
    """Per (batch, head): o [b, sq, hq, d] and lse [b, hq, sq], float64. mode 'ref': float64
    everything; 'plain': fp32 scores/softmax from the dtype inputs, P rounded to the dtype, o
    rounded (materialised attention in the inputs' precision)."""
    import torch
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    w = torch.float64 if mode == "ref" else torch.float32
    o = torch.zeros(b, sq, hq, d, dtype=torch.float64, device=q.device)
    lse = torch.full((b, hq, sq), float("-inf"), dtype=torch.float64, device=q.device)
    if sk == 0:
        return o, lse
    i = torch.arange(sq, device=q.device).view(sq, 1)
    j = torch.arange(sk, device=q.device).view(1, sk)
    visible = (j <= i + (sk - sq)) if causal else torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    for bi in range(b):
        for h in range(hq):
            qf, kf, vf = q[bi, :, h].to(w), k[bi, :, h // g].to(w), v[bi, :, h // g].to(w)
            s = (qf @ kf.T) * scale
            s = s.masked_fill(~visible, float("-inf"))
            row_lse = torch.logsumexp(s, dim=1)
            safe = torch.where(torch.isinf(row_lse), torch.zeros_like(row_lse), row_lse)
            p = torch.exp(s - safe.unsqueeze(1))
            if mode == "plain":
                p = p.to(q.dtype).to(w)
            oh = p @ vf
            if mode == "plain":
                oh = oh.to(q.dtype)
            o[bi, :, h] = oh.double()
            lse[bi, h] = row_lse.double()
    return o, lse


def make_inputs(b, sq, sk, hq, hkv, d, dtype, layout, dev):
    import torch
    if layout == "dense":
        q = torch.randn(b, sq, hq, d, device=dev).to(dtype)
        k = torch.randn(b, sk, hkv, d, device=dev).to(dtype)
        v = (torch.randn(b, sk, hkv, d, device=dev) + 0.5).to(dtype)
        o_buf = torch.full((b, sq, hq, d), float("nan"), device=dev, dtype=dtype)
        return q, k, v, o_buf, o_buf
    # strided: q a slice of a packed [b, sq, 3, hq, d] buffer, k stored [b, hkv, sk + 3, d + 16]
    # (BHSD with padding) and viewed as [b, sk, hkv, d], v with padded heads, o with padded rows
    # and head dims (the padding must stay NaN)
    q = torch.randn(b, sq, 3, hq, d, device=dev).to(dtype)[:, :, 1]
    k = torch.randn(b, hkv, sk + 3, d + 16, device=dev).to(dtype)[:, :, :sk, 8:8 + d].transpose(1, 2)
    v = (torch.randn(b, sk, hkv, d + 24, device=dev) + 0.5).to(dtype)[..., 16:16 + d]
    o_buf = torch.full((b, sq + 1, hq, d + 8), float("nan"), device=dev, dtype=dtype)
    return q, k, v, o_buf, o_buf[:, :sq, :, :d]


def run_check(lib, quick, d_filter=None):
    import torch
    dev = "cuda"
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}
    fails = 0
    results = []
    for name, b, sq, sk, hq, hkv, d, causal, dt, layout in check_cases(quick):
        if d_filter and d not in d_filter:
            continue
        label = f"{name} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} {dt} {layout}"
        q, k, v, o_buf, o = make_inputs(b, sq, sk, hq, hkv, d, dtypes[dt], layout, dev)
        lse_buf = torch.full((b * hq * sq + 7,), float("nan"), device=dev)
        args = make_args(q, k, v, o, lse_buf, causal, stream=torch.cuda.current_stream().cuda_stream)
        st = lib.fwd(args)
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:  # a device fault or a watchdog trap: the context is gone
            print(f"FAIL {label}: {e}", flush=True)
            raise
        if st != FA_OK:
            print(f"FAIL {label}: status {st}: {lib.error()}")
            fails += 1
            continue
        o1, lse1 = o.clone(), lse_buf.clone()
        problems = []
        lse = lse_buf[:b * hq * sq].view(b, hq, sq)
        if torch.isnan(o).any():
            problems.append(f"{int(torch.isnan(o).sum())} o elements not written")
        if torch.isnan(lse).any():
            problems.append(f"{int(torch.isnan(lse).sum())} lse elements not written")
        if not torch.isnan(lse_buf[b * hq * sq:]).all():
            problems.append("lse written past its end")
        if layout == "strided":
            pad = o_buf.clone()
            pad[:, :sq, :, :d] = float("nan")
            if not torch.isnan(pad).all():
                problems.append("o padding written")
        scale = 1.0 / math.sqrt(d)
        ref_o, ref_lse = reference(q, k, v, causal, scale, "ref")
        pl_o, pl_lse = reference(q, k, v, causal, scale, "plain")
        err = (o.double() - ref_o).abs().max().item() if o.numel() else 0.0
        err_plain = (pl_o - ref_o).abs().max().item() if o.numel() else 0.0
        if not (err <= 2 * err_plain + 1e-4):
            problems.append(f"o error {err:.3g} > 2 x plain {err_plain:.3g} + 1e-4")
        masked = torch.isinf(ref_lse)
        if masked.any():
            if not torch.equal(lse[masked], ref_lse[masked].float()):
                problems.append("fully masked rows: lse != -inf")
            rows = masked.permute(0, 2, 1)  # [b, sq, hq]
            if o[rows].abs().max().item() != 0.0:
                problems.append("fully masked rows: o != 0")
        fin = ~masked
        lerr = (lse.double() - ref_lse)[fin].abs().max().item() if fin.any() else 0.0
        lerr_plain = (pl_lse - ref_lse)[fin].abs().max().item() if fin.any() else 0.0
        if not (lerr <= 2 * lerr_plain + 1e-4):
            problems.append(f"lse error {lerr:.3g} > 2 x plain {lerr_plain:.3g} + 1e-4")
        st = lib.fwd(args)
        torch.cuda.synchronize()
        if st != FA_OK or not torch.equal(o, o1) or not torch.equal(lse_buf.nan_to_num(), lse1.nan_to_num()):
            problems.append("second call not bitwise identical")
        results.append({"case": label, "o_err": err, "o_err_plain": err_plain, "lse_err": lerr, "ok": not problems})
        if problems:
            fails += 1
            print(f"FAIL {label}: " + "; ".join(problems))
        else:
            print(f"ok   {label}: o err {err:.2e} (plain {err_plain:.2e}), lse err {lerr:.2e}")
        del q, k, v, o_buf, o, lse_buf, ref_o, pl_o
    fails += check_errors(lib)
    n = len(results) + 1
    print(f"check: {n - fails} passed, {fails} failed")
    return fails


def check_errors(lib):
    """Bad arguments return the documented status and write nothing."""
    import torch
    q = torch.randn(1, 64, 2, 64, device="cuda").to(torch.bfloat16)
    o = torch.full_like(q, float("nan"))
    bad = []
    a = make_args(q, q, q, o, None, 0)
    a.head_dim = 96
    bad.append(("head_dim 96", a, 5))
    a = make_args(q, q, q, o, None, 0)
    a.q_row_stride = 130  # 260 bytes: not a multiple of 16
    bad.append(("row stride 130", a, 17))
    a = make_args(q, q, q, o, None, 0)
    a.heads_kv = 3
    bad.append(("heads_q % heads_kv", a, 4))
    a = make_args(q, q, q, o, None, 0)
    a.softmax_scale = -1.0
    bad.append(("negative scale", a, 12))
    fails = 0
    for name, a, want in bad:
        st = lib.fwd(a)
        if st != want:
            print(f"FAIL error case {name}: status {st}, wanted {want}: {lib.error()}")
            fails += 1
    torch.cuda.synchronize()
    if not torch.isnan(o).all():
        print("FAIL error cases wrote o")
        fails += 1
    if not fails:
        print("ok   error statuses")
    return fails


# ---------------------------------------------------------------------------------------------
# sanitize / selftime / bench

SAN_SHAPES = [  # (b, sq, sk, hq, hkv, d, causal)
    (1, 200, 200, 4, 2, 64, 1),
    (1, 130, 300, 2, 1, 128, 0),
    (1, 300, 100, 2, 2, 128, 1),
    (1, 100, 100, 2, 1, 256, 1),
]


def run_sanitize(lib):
    fails = 0
    for b, sq, sk, hq, hkv, d, causal in SAN_SHAPES:
        for dtype in (FA_DTYPE_BF16, FA_DTYPE_F16):
            st, _ = lib.selftime(dtype, b, sq, sk, hq, hkv, d, causal, 1, 0)
            print(f"sanitize b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} dtype{dtype}: status {st}",
                  flush=True)
            fails += st != FA_OK
    return fails


def bench_shapes(a):
    return [(d, c, s) for d in a.d_list for c in a.causal_list for s in a.seq_list]


def flops(d, c, s):
    b, h = 16384 // s, 2048 // d
    return 4 * b * h * s * s * d / (2 if c else 1)


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


def run_bench(libs, a):
    """libs: [(name, Lib)]. Every variant, cuDNN and FA2 on the same tensors, in this process."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
    for d, c, s in bench_shapes(a):
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(b * h * s, device="cuda")
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views, no copy
        fns = {}
        for name in ("cudnn", "fa2"):
            if name in a.impls:
                def sdpa(be=backends[name]):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(c))
                fns[name] = sdpa
        ref = fns["fa2"]().transpose(1, 2).float() if "fa2" in fns else None
        diffs = {}
        if "ours" in a.impls:
            for name, lib in libs:
                args = make_args(q, k, v, o, lse, c, stream=torch.cuda.current_stream().cuda_stream)
                o.fill_(float("nan"))
                st = lib.fwd(args)
                torch.cuda.synchronize()
                if st != FA_OK:
                    emit(a.json, {"d": d, "causal": c, "s": s, "impl": name, "status": st, "error": lib.error()})
                    continue
                if ref is not None:
                    diffs[name] = (ref - o.float()).abs().max().item()
                fns[name] = lambda args=args, lib=lib: lib.fwd(args)
        for name, fn in fns.items():
            ms = do_bench(fn, warmup=25, rep=a.rep_ms, return_mode="median")
            rec = {"d": d, "causal": c, "s": s, "impl": name, "status": 0, "ms": ms,
                   "tflops": flops(d, c, s) / ms / 1e9}
            if name in diffs:
                rec["max_abs_diff_vs_fa2"] = diffs[name]
            emit(a.json, rec)
        del q, k, v, o, lse, qt, kt, vt, fns, ref
        torch.cuda.empty_cache()


def run_table(paths):
    """One row per shape: every variant (in first-seen order), cuDNN, FA2, best variant / cuDNN.
    A variant whose bench diff vs FA2 exceeded 0.05 is marked '!'."""
    cells, order, bad = {}, [], set()
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
            if impl not in ("cudnn", "fa2") and impl not in order:
                order.append(impl)
            cells.setdefault(key, {})[impl] = r["tflops"]
            if r.get("max_abs_diff_vs_fa2", 0.0) > 0.05:
                bad.add((key, impl))
    print("\n| d | causal | s | " + " | ".join(order) + " | cuDNN | FA2 | best | best/cuDNN |")
    print("|---" * (len(order) + 7) + "|")
    for key in sorted(cells):
        x = cells[key]
        ours = {n: x[n] for n in order if n in x and (key, n) not in bad}
        best = max(ours, key=ours.get) if ours else None
        row = [f"{x[n]:.0f}" + ("!" if (key, n) in bad else "") if n in x else "-" for n in order]
        cud = f"{x['cudnn']:.0f}" if "cudnn" in x else "-"
        fa2 = f"{x['fa2']:.0f}" if "fa2" in x else "-"
        ratio = f"{ours[best] / x['cudnn']:.2f}" if best and "cudnn" in x else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(row) + f" | {cud} | {fa2} | {best or '-'} | {ratio} |")
    if bad:
        print("(! = max |ours - FA2| > 0.05 on the bench tensors)")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "sanitize", "bench", "selftime"):
        p = sub.add_parser(name)
        p.add_argument("lib")
        p.add_argument("--dry", action="store_true", help="print the plan only (no GPU, no torch)")
        if name == "check":
            p.add_argument("--quick", action="store_true", help="skip the 2k-4k shapes")
            p.add_argument("--d", default="", help="only these head dims (default: all)")
        if name in ("bench", "selftime"):
            p.add_argument("--d", default="64,128", help="head dims (default 64,128)")
            p.add_argument("--seqlens", default="2048,4096,8192,16384")
            p.add_argument("--causal", default="0,1")
            p.add_argument("--json", default="", help="append one JSON line per measurement here")
        if name == "bench":
            p.add_argument("--impls", default="ours,cudnn,fa2")
            p.add_argument("--rep-ms", type=int, default=100, help="do_bench rep (ms)")
        if name == "selftime":
            p.add_argument("--reps", type=int, default=30)
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
            if d not in (64, 128, 256):
                ap.error(f"head dim {d}: the kernel has 64, 128, 256")
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
                  f"{getattr(a, 'impls', ['ours_selftime'])}, est. FLOP of the first {flops(*shapes[0]):.3g}")
        for name, path in parse_libs(a.lib):  # the library loads here even without a GPU: ABI smoke test
            if os.path.exists(path):
                lib = Lib(path)
                print(f"{name}: tile shapes (block_m, block_n, stages, smem) non-causal / causal:",
                      {d: (lib.tile(d, 0), lib.tile(d, 1)) for d in (64, 128, 256)}, "d=96:", lib.tile(96))
        return 0
    libs = [(name, Lib(path)) for name, path in parse_libs(a.lib)]
    if a.cmd == "check":
        d_filter = [int(x) for x in a.d.split(",") if x]
        fails = 0
        for name, lib in libs:
            print(f"== check {name}: tiles non-causal / causal",
                  {d: (lib.tile(d, 0), lib.tile(d, 1)) for d in (64, 128, 256)}, flush=True)
            fails += run_check(lib, a.quick, d_filter)
        return 1 if fails else 0
    if a.cmd == "sanitize":
        return 1 if sum(run_sanitize(lib) for _, lib in libs) else 0
    if a.cmd == "selftime":
        run_selftime(libs[0][1], a)
        return 0
    run_bench(libs, a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
