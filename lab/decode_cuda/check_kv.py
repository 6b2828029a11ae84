"""check_kv.py: correctness of the CUDA KV-cache path (fa_kvcache_forward) and of the device merge
(fa_merge_states) against float64 torch references, calling the C library directly via ctypes.

Attention rule (FlashAttention's): max|ours - ref64| <= 2 * max|plain - ref64| + floor, where
`plain` is materialised attention from the same-dtype inputs (fp32 scores and softmax, P rounded
to the dtype before P V, output rounded). LSE: <= 2 * plain error + 1e-4 * max(1, |lse|).
Outputs (o, lse) are poisoned with NaN before every call; cache slots the call must not read
(before cache_leftpad, past cache_seqlens, unused pages / cache rows, and the append slots) are
NaN too, so a stray read shows up as NaN. After an append the caches are compared bit for bit
with the expected cache (v bit-exact everywhere; rotated k within 1 ulp of fp32-then-round).
Merge: 1..133 states incl. empty ones (lse = -inf with NaN partial o), all-empty rows, strided
layouts, parts f32/f16/bf16, out f16/bf16 (and f32 when the library accepts it on CUDA).

Usage (repository root, on the GPU machine):
    python3 lab/decode_cuda/check_kv.py [path/to/libflashattn.so] [--quick] [--seed N]
Default library: build/libflashattn.so. Prints PASS/FAIL per case and a summary; exit code 1 on
any failure.
"""
import ctypes
import math
import os
import random
import sys

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
if ARGS:
    os.environ["FLASHATTN_LIB"] = os.path.abspath(ARGS[0])
else:
    os.environ.setdefault("FLASHATTN_LIB", os.path.abspath("build/libflashattn.so"))
QUICK = "--quick" in sys.argv
SEED = 1234
for i, a in enumerate(sys.argv):
    if a == "--seed" and i + 1 < len(sys.argv):
        SEED = int(sys.argv[i + 1])

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from flashattn import _lib  # noqa: E402
from flashattn._lib import FaParams  # noqa: E402

lib = _lib.lib
lib.fa_kvcache_forward.argtypes = [ctypes.POINTER(FaParams)]
lib.fa_kvcache_forward.restype = ctypes.c_int
lib.fa_check_kvcache.argtypes = [ctypes.POINTER(FaParams), ctypes.POINTER(ctypes.c_size_t)]
lib.fa_check_kvcache.restype = ctypes.c_int

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p


class FaMergeParams(ctypes.Structure):
    """ctypes mirror of fa_merge_params (include/flashattn.h), field by field."""
    _fields_ = [
        ("device", ctypes.c_int), ("parts_dtype", ctypes.c_int), ("out_dtype", ctypes.c_int),
        ("num_states", _i64), ("rows", _i64), ("heads", _i64), ("head_dim_v", _i64),
        ("o_parts", _ptr),
        ("o_parts_state_stride", _i64), ("o_parts_row_stride", _i64), ("o_parts_head_stride", _i64),
        ("lse_parts", _ptr),
        ("lse_parts_state_stride", _i64), ("lse_parts_head_stride", _i64), ("lse_parts_row_stride", _i64),
        ("o", _ptr), ("o_row_stride", _i64), ("o_head_stride", _i64),
        ("lse", _ptr), ("lse_head_stride", _i64), ("lse_row_stride", _i64),
        ("num_threads", ctypes.c_int), ("stream", _ptr),
    ]


lib.fa_merge_states.argtypes = [ctypes.POINTER(FaMergeParams)]
lib.fa_merge_states.restype = ctypes.c_int

DEV = "cuda"
DT = {torch.float16: _lib.FA_DTYPE_F16, torch.bfloat16: _lib.FA_DTYPE_BF16, torch.float32: _lib.FA_DTYPE_F32}
RESULTS = []


def report(name, ok, detail):
    RESULTS.append((name, ok))
    print("%s %s  %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)


def last_error():
    return lib.fa_last_error().decode(errors="replace")


def ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else None


# ---- references ----------------------------------------------------------------------------------


def rotate(x, cos, sin, pos, rd, interleaved):
    """x [n, h, d] (dtype), pos [n] long: rotary in fp32 with separately rounded products (as the
    library), rounded to the dtype."""
    xf = x.float().clone()
    c = cos[pos].float().unsqueeze(1)
    s = sin[pos].float().unsqueeze(1)
    if interleaved:
        xa, xb = xf[..., 0:rd:2].clone(), xf[..., 1:rd:2].clone()
    else:
        xa, xb = xf[..., : rd // 2].clone(), xf[..., rd // 2: rd].clone()
    ya = (xa * c) - (xb * s)
    yb = (xa * s) + (xb * c)
    if interleaved:
        xf[..., 0:rd:2], xf[..., 1:rd:2] = ya, yb
    else:
        xf[..., : rd // 2], xf[..., rd // 2: rd] = ya, yb
    return xf.to(x.dtype)


def attention(q, k, v, *, window, softcap, scale, alibi, sinks, mode):
    """One sequence: q [sq, hq, d], k [sk, hkv, d], v [sk, hkv, dv] (dtype). mode 'ref': float64;
    'plain': fp32 from the dtype inputs, P and O rounded to the dtype. Returns o [sq, hq, dv] and
    lse [hq, sq] (float64). window = (left, right), causal already folded in, -1 = unbounded."""
    dt = q.dtype
    sq, hq, _ = q.shape
    sk, hkv, _ = v.shape
    g = hq // hkv
    w = torch.float64 if mode == "ref" else torch.float32
    qf, kf, vf = q.to(w), k.to(w).repeat_interleave(g, 1), v.to(w).repeat_interleave(g, 1)
    s = torch.einsum("ihd,jhd->hij", qf, kf) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=DEV).view(sq, 1)
    j = torch.arange(sk, device=DEV).view(1, sk)
    diag = i + sk - sq
    if alibi is not None:
        s = s - alibi.to(w).view(hq, 1, 1) * (diag - j).abs().to(w)
    wl, wr = window
    vis = torch.ones(sq, sk, dtype=torch.bool, device=DEV)
    if wl >= 0:
        vis &= j >= diag - wl
    if wr >= 0:
        vis &= j <= diag + wr
    s = s.masked_fill(~vis, float("-inf"))
    cols = s
    if sinks is not None:
        cols = torch.cat([s, sinks.to(w).view(hq, 1, 1).expand(hq, sq, 1)], dim=2)
    lse = torch.logsumexp(cols, dim=2)
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - lse_safe.unsqueeze(2))
    if mode == "plain":
        p = p.to(dt).to(w)
    o = torch.einsum("hij,jhd->ihd", p, vf)
    if mode == "plain":
        o = o.to(dt)
    return o.double(), lse.double()


def bits_equal(a, b):
    return torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def max_ulp_diff(a, b):
    """Largest difference in units of the last place between two 16-bit tensors (same sign)."""
    ai = a.contiguous().view(torch.int16).to(torch.int32)
    bi = b.contiguous().view(torch.int16).to(torch.int32)
    return int((ai - bi).abs().max().item()) if ai.numel() else 0


# ---- one fa_kvcache_forward case ------------------------------------------------------------------


def kv_case(name, *, b=3, sq=1, hq=8, hkv=2, d=128, dv=None, cap=300, dtype=torch.bfloat16,
            page_size=0, batch_idx=False, leftpad=False, append=False, rotary=None, rotary_dim=None,
            causal=False, window=(-1, -1), softcap=0.0, alibi=False, sinks=False, splits=0,
            with_lse=True, lens=None, scale=0.0, user_workspace=False, strided_o=False):
    dv = dv or d
    gen = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32)

    n_new = sq if append else 0
    # per-sequence lengths: L0 + n_new <= cap, leftpad <= L0
    if lens is None:
        lens = [random.randint(0, cap - n_new) for _ in range(b)]
        lens[0] = cap - n_new  # one full sequence
        if b > 2:
            lens[2] = 0          # and an empty cache
    pads = [random.randint(0, L) if leftpad else 0 for L in lens]
    if leftpad and b > 1:
        pads[1] = lens[1]        # everything padded away
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    leftpads = torch.tensor(pads, dtype=torch.int32, device=DEV)

    # caches (logical [b, cap, hkv, d]) with NaN wherever the call must not read
    nan = float("nan")
    k_log = randn(b, cap, hkv, d).to(dtype)
    v_log = (randn(b, cap, hkv, dv) + 0.5).to(dtype)
    for i in range(b):
        k_log[i, : pads[i]] = nan
        v_log[i, : pads[i]] = nan
        k_log[i, lens[i]:] = nan
        v_log[i, lens[i]:] = nan
    if page_size:
        pages_per_seq = (cap + page_size - 1) // page_size
        num_pages = b * pages_per_seq + 3
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(random.randrange(1 << 30)))
        table = perm[: b * pages_per_seq].view(b, pages_per_seq).to(torch.int32).to(DEV)
        k_pool = torch.full((num_pages, page_size, hkv, d), nan, device=DEV, dtype=dtype)
        v_pool = torch.full((num_pages, page_size, hkv, dv), nan, device=DEV, dtype=dtype)
        pad_slots = pages_per_seq * page_size - cap
        for i in range(b):
            kk = torch.cat([k_log[i], torch.full((pad_slots, hkv, d), nan, device=DEV, dtype=dtype)])
            vv = torch.cat([v_log[i], torch.full((pad_slots, hkv, dv), nan, device=DEV, dtype=dtype)])
            k_pool[table[i].long()] = kk.view(pages_per_seq, page_size, hkv, d)
            v_pool[table[i].long()] = vv.view(pages_per_seq, page_size, hkv, dv)
        k_cache, v_cache = k_pool, v_pool
        cache_idx = None
    else:
        table = None
        if batch_idx:
            cache_batch = b + 2
            rows = torch.randperm(cache_batch, generator=torch.Generator().manual_seed(random.randrange(1 << 30)))[:b]
            k_cache = torch.full((cache_batch, cap, hkv, d), nan, device=DEV, dtype=dtype)
            v_cache = torch.full((cache_batch, cap, hkv, dv), nan, device=DEV, dtype=dtype)
            k_cache[rows.to(DEV)] = k_log
            v_cache[rows.to(DEV)] = v_log
            cache_idx = rows.to(torch.int32).to(DEV)
        else:
            k_cache, v_cache = k_log.clone(), v_log.clone()
            cache_idx = None
    k_cache_before, v_cache_before = k_cache.clone(), v_cache.clone()

    q = randn(b, sq, hq, d).to(dtype)
    k_new = randn(b, sq, hkv, d).to(dtype) if append else None
    v_new = (randn(b, sq, hkv, dv) + 0.5).to(dtype) if append else None
    cos = sin = None
    rd = 0
    if rotary is not None:
        rd = rotary_dim or d
        angles = torch.rand(cap, rd // 2, generator=gen, device=DEV) * 2 * math.pi
        cos, sin = torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)
    slopes = (torch.rand(hq, generator=gen, device=DEV) * 0.3).float() if alibi else None
    sink = (randn(hq) * 2).float() if sinks else None
    if strided_o:
        o_store = torch.full((b, sq, hq + 1, dv + 8), nan, device=DEV, dtype=dtype)
        o = o_store[:, :, :hq, :dv]
    else:
        o = torch.full((b, sq, hq, dv), nan, device=DEV, dtype=dtype)
    lse = torch.full((b, hq, sq), nan, device=DEV, dtype=torch.float32) if with_lse else None

    p = FaParams()
    p.device = _lib.FA_DEVICE_CUDA
    p.dtype = DT[dtype]
    p.batch, p.seqlen_q, p.seqlen_k = b, sq, cap
    p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v = hq, hkv, d, dv
    p.q, p.k, p.v, p.o = ptr(q), ptr(k_cache), ptr(v_cache), ptr(o)
    p.lse = ptr(lse)
    p.q_batch_stride, p.q_row_stride, p.q_head_stride = q.stride()[:3]
    p.k_batch_stride, p.k_row_stride, p.k_head_stride = k_cache.stride()[:3]
    p.v_batch_stride, p.v_row_stride, p.v_head_stride = v_cache.stride()[:3]
    p.o_batch_stride, p.o_row_stride, p.o_head_stride = o.stride()[:3]
    p.softmax_scale = scale
    wl, wr = window
    p.causal = int(causal)
    p.use_window = int(wl >= 0 or wr >= 0)
    p.window_left, p.window_right = wl, wr
    p.softcap = softcap
    p.alibi_slopes = ptr(slopes)
    p.sink_logits = ptr(sink)
    p.cache_seqlens = ptr(seqlens)
    p.cache_leftpad = ptr(leftpads) if leftpad else None
    p.cache_batch_idx = ptr(cache_idx)
    if page_size:
        p.block_table = ptr(table)
        p.block_table_batch_stride = table.stride(0)
        p.page_size = page_size
        p.num_pages = k_cache.shape[0]
    else:
        p.cache_batch = k_cache.shape[0]
    if append:
        p.k_new, p.v_new = ptr(k_new), ptr(v_new)
        p.knew_batch_stride, p.knew_row_stride, p.knew_head_stride = k_new.stride()[:3]
        p.vnew_batch_stride, p.vnew_row_stride, p.vnew_head_stride = v_new.stride()[:3]
    if rotary is not None:
        p.rotary_cos, p.rotary_sin = ptr(cos), ptr(sin)
        p.rotary_dim, p.rotary_seqlen = rd, cap
        p.rotary_interleaved = int(rotary == "interleaved")
    p.num_splits = splits
    ws = None
    if user_workspace:
        need = ctypes.c_size_t(0)
        st = lib.fa_check_kvcache(ctypes.byref(p), ctypes.byref(need))
        if st != 0:
            report(name, False, "fa_check_kvcache: %s" % last_error())
            return
        ws = torch.empty(max(need.value, 1) + 256, dtype=torch.uint8, device=DEV)
        p.workspace = ctypes.c_void_p((ws.data_ptr() + 255) // 256 * 256)
        p.workspace_bytes = need.value
    torch.cuda.synchronize()
    st = lib.fa_kvcache_forward(ctypes.byref(p))
    torch.cuda.synchronize()
    if st != 0:
        report(name, False, "status %d: %s" % (st, last_error()))
        return

    # ---- expected cache and reference attention
    causal_or_local = causal or wl >= 0 or wr >= 0
    eff_wr = (0 if wr < 0 else min(wr, 0)) if causal else wr
    k_exp, v_exp = k_cache_before.clone(), v_cache_before.clone()
    o_ref = torch.zeros(b, sq, hq, dv, dtype=torch.float64, device=DEV)
    o_plain = torch.zeros_like(o_ref)
    lse_ref = torch.zeros(b, hq, sq, dtype=torch.float64, device=DEV)
    lse_plain = torch.zeros_like(lse_ref)
    k_new_rot = []
    for i in range(b):
        L0, pad = lens[i], pads[i]
        keys, vals = k_log[i, pad:L0], v_log[i, pad:L0]
        qi = q[i]
        if append:
            kn = k_new[i]
            if rotary is not None:
                pos = torch.arange(sq, device=DEV) + (L0 - pad)
                kn = rotate(kn, cos, sin, pos, rd, rotary == "interleaved")
            k_new_rot.append(kn)
            keys = torch.cat([keys, kn])
            vals = torch.cat([vals, v_new[i]])
            for t in range(sq):
                slot = L0 + t
                if page_size:
                    pg = int(table[i, slot // page_size])
                    k_exp[pg, slot % page_size] = kn[t]
                    v_exp[pg, slot % page_size] = v_new[i, t]
                else:
                    row = int(cache_idx[i]) if cache_idx is not None else i
                    k_exp[row, slot] = kn[t]
                    v_exp[row, slot] = v_new[i, t]
        if rotary is not None:
            pos = (L0 - pad) + (torch.arange(sq, device=DEV) if causal_or_local else torch.zeros(sq, dtype=torch.long, device=DEV))
            qi = rotate(qi, cos, sin, pos, rd, rotary == "interleaved")
        sc = scale if scale != 0 else 1.0 / math.sqrt(d)
        kw = dict(window=(wl, eff_wr), softcap=softcap, scale=sc,
                  alibi=slopes, sinks=sink)
        o_r, l_r = attention(qi, keys, vals, mode="ref", **kw)
        o_p, l_p = attention(qi, keys, vals, mode="plain", **kw)
        o_ref[i], lse_ref[i], o_plain[i], lse_plain[i] = o_r, l_r, o_p, l_p

    problems = []
    o_d = o.double()
    if not torch.isfinite(o_d).all():
        problems.append("o has %d non-finite" % int((~torch.isfinite(o_d)).sum()))
    err = (o_d - o_ref).abs().nan_to_num(float("inf")).max().item()
    err_plain = (o_plain - o_ref).abs().max().item()
    if not err <= 2 * err_plain + 1e-4:
        problems.append("o err %.3g > 2*%.3g+1e-4" % (err, err_plain))
    lse_err = 0.0
    if with_lse:
        same_inf = torch.isinf(lse_ref) & (lse.double() == lse_ref)
        fin = torch.isfinite(lse_ref)
        if not bool((same_inf | fin).all()) or not bool(torch.isfinite(lse.double()[fin]).all()):
            problems.append("lse -inf/finite pattern differs")
        if fin.any():
            lse_err = (lse.double()[fin] - lse_ref[fin]).abs().max().item()
            lse_plain_err = (lse_plain[fin] - lse_ref[fin]).abs().max().item()
            tol = 2 * lse_plain_err + 1e-4 * max(1.0, lse_ref[fin].abs().max().item())
            if not lse_err <= tol:
                problems.append("lse err %.3g > %.3g" % (lse_err, tol))
    if strided_o:
        pad_region = torch.cat([o_store[:, :, hq:, :].flatten(), o_store[:, :, :hq, dv:].flatten()])
        if not bool(torch.isnan(pad_region.float()).all()):
            problems.append("o padding written")
    # caches: v bit-exact everywhere; k bit-exact except rotated new rows (<= 1 ulp)
    if not bits_equal(v_cache, v_exp):
        problems.append("v cache differs")
    if rotary is not None and append:
        ulps = max_ulp_diff(k_cache, k_exp) if not bits_equal(k_cache, k_exp) else 0
        if ulps > 1:
            problems.append("k cache differs by %d ulp" % ulps)
    elif not bits_equal(k_cache, k_exp):
        problems.append("k cache differs")
    report(name, not problems, "o err %.2e (plain %.2e) lse err %.2e %s" % (err, err_plain, lse_err,
                                                                        "; ".join(problems)))


# ---- fa_merge_states ----------------------------------------------------------------------------------


def merge_case(name, *, states, rows, heads, dv, parts_dtype=torch.float32, out_dtype=torch.bfloat16,
               empty_frac=0.3, strided=False, with_lse=True):
    gen = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
    pad_h = 3 if strided else 0
    pad_d = 5 if strided else 0
    parts_store = torch.randn(states, rows, heads + pad_h, dv + pad_d, generator=gen, device=DEV).to(parts_dtype)
    parts = parts_store[:, :, :heads, :dv]
    lse_store = (torch.rand(states, heads, rows + pad_h, generator=gen, device=DEV) * 10 - 5).float()
    lse_parts = lse_store[:, :, :rows]
    empty = torch.rand(states, heads, rows, generator=gen, device=DEV) < empty_frac
    if rows > 1:
        empty[:, :, 1] = True  # a row with every state empty
    lse_parts[empty] = float("-inf")
    parts.permute(0, 2, 1, 3)[empty] = float("nan")  # never read: must not leak
    o_store = torch.full((rows, heads + pad_h, dv + pad_d), float("nan"), device=DEV, dtype=out_dtype)
    o = o_store[:, :heads, :dv]
    lse_store_out = torch.full((heads, rows + pad_h), float("nan"), device=DEV) if with_lse else None
    lse = lse_store_out[:, :rows] if with_lse else None

    m = FaMergeParams()
    m.device = _lib.FA_DEVICE_CUDA
    m.parts_dtype, m.out_dtype = DT[parts_dtype], DT[out_dtype]
    m.num_states, m.rows, m.heads, m.head_dim_v = states, rows, heads, dv
    m.o_parts = ptr(parts)
    m.o_parts_state_stride, m.o_parts_row_stride, m.o_parts_head_stride = parts.stride()[:3]
    m.lse_parts = ptr(lse_parts)
    m.lse_parts_state_stride, m.lse_parts_head_stride, m.lse_parts_row_stride = lse_parts.stride()
    m.o = ptr(o)
    m.o_row_stride, m.o_head_stride = o.stride()[:2]
    m.lse = ptr(lse)
    if with_lse:
        m.lse_head_stride, m.lse_row_stride = lse.stride()
    torch.cuda.synchronize()
    st = lib.fa_merge_states(ctypes.byref(m))
    torch.cuda.synchronize()
    if st != 0:
        msg = last_error()
        if out_dtype == torch.float32 and st == _lib.FA_ERR_DTYPE:
            report(name, True, "f32 output rejected on CUDA by the API layer (%s)" % msg)
        else:
            report(name, False, "status %d: %s" % (st, msg))
        return

    lp = lse_parts.double()                                        # [S, H, R]
    mx = lp.max(dim=0).values
    mx_safe = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    w = torch.exp(lp - mx_safe)                                    # 0 for empty
    z = w.sum(0)
    pp = torch.where(empty.permute(0, 2, 1).unsqueeze(-1), torch.zeros((), device=DEV, dtype=torch.float64),
                     parts.double())                               # [S, R, H, dv]
    o_ref = torch.einsum("shr,srhd->rhd", w, pp) / torch.where(z > 0, z, torch.ones_like(z)).t().unsqueeze(-1)
    lse_ref = torch.where(z > 0, mx_safe + torch.log(torch.where(z > 0, z, torch.ones_like(z))),
                          torch.full_like(z, float("-inf")))
    problems = []
    od = o.double()
    if not torch.isfinite(od).all():
        problems.append("o non-finite")
    eps = {torch.float32: 1e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[out_dtype]
    err = ((od - o_ref).abs() / (o_ref.abs() + 1e-3)).nan_to_num(float("inf")).max().item()
    if not err <= eps + 1e-5:
        problems.append("o rel err %.3g" % err)
    if with_lse:
        ld = lse.double()
        ok_pattern = bool(((torch.isinf(lse_ref) & (ld == lse_ref)) | torch.isfinite(lse_ref)).all())
        fin = torch.isfinite(lse_ref)
        lerr = (ld[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0
        if not ok_pattern or not lerr <= 1e-5:
            problems.append("lse err %.3g pattern %s" % (lerr, ok_pattern))
        if strided and not bool(torch.isnan(lse_store_out[:, rows:]).all()):
            problems.append("lse padding written")
    if strided:
        padv = torch.cat([o_store[:, heads:, :].flatten(), o_store[:, :heads, dv:].flatten()])
        if not bool(torch.isnan(padv.float()).all()):
            problems.append("o padding written")
    report(name, not problems, "rel err %.2e %s" % (err, "; ".join(problems)))


# ---- the sweep -------------------------------------------------------------------------------------


def main():
    random.seed(SEED)
    torch.manual_seed(SEED)
    if not torch.cuda.is_available():
        print("no CUDA device")
        sys.exit(2)
    print("library: %s" % _lib.library_path)
    bf, fp = torch.bfloat16, torch.float16

    # basics: contiguous, GQA 4, split counts
    for s in ([0, 1, 3] if QUICK else [0, 1, 2, 3, 4, 5, 6, 7, 8]):
        kv_case("contig gqa4 d128 splits=%d" % s, splits=s)
    kv_case("contig f16 splits=0", dtype=fp)
    kv_case("contig long cap=5000 splits=0", b=2, cap=5000)
    kv_case("contig long cap=5000 splits=8 f16", b=2, cap=5000, splits=8, dtype=fp)
    kv_case("contig b=1 hkv=1 heuristic (many splits)", b=1, hq=8, hkv=1, cap=4000)
    # the fused merge staging the partials in batches (16 rows x dv > what one pass holds)
    kv_case("merge batches: 16 rows d=128 splits=40", b=1, hq=16, hkv=1, cap=4000, splits=40)
    kv_case("merge batches: 16 rows d=256 splits=64 sinks", b=1, hq=16, hkv=1, d=256, cap=8000, splits=64,
            sinks=True)
    kv_case("merge batches: 2 row tiles d=64 splits=128 paged 16", b=2, hq=24, hkv=1, d=64, cap=9000,
            splits=128, page_size=16)
    kv_case("no lse", with_lse=False, splits=3)
    kv_case("no lse 1 split", with_lse=False, splits=1)
    kv_case("user workspace splits=4", splits=4, user_workspace=True)
    kv_case("strided o", strided_o=True, splits=2)
    kv_case("strided o 1 split", strided_o=True, splits=1)

    # paged, page sizes 1, 3, 16, 64, 256
    for ps in [1, 3, 16, 64, 256]:
        for s in ([0] if QUICK else [1, 0, 5]):
            kv_case("paged ps=%d splits=%d" % (ps, s), page_size=ps, splits=s)
    kv_case("paged ps=16 long", b=2, cap=3000, page_size=16)

    # append, rotary (both layouts), contiguous and paged, sq 1 and 5
    for sq in [1, 5]:
        for rot in [None, "interleaved", "half"]:
            for ps in [0, 3, 16]:
                for causal in ([True] if rot is None else [True, False]):
                    kv_case("append sq=%d rotary=%s ps=%d causal=%d" % (sq, rot, ps, causal), sq=sq, append=True,
                            rotary=rot, page_size=ps, causal=causal, splits=0 if ps else 2)
    kv_case("append rotary_dim=40 half", sq=3, append=True, rotary="half", rotary_dim=40, causal=True)
    kv_case("append rotary_dim=64 interleaved d=64", d=64, sq=2, append=True, rotary="interleaved", rotary_dim=64)
    kv_case("append leftpad batch_idx rotary", sq=4, append=True, rotary="half", leftpad=True, batch_idx=True,
            causal=True, splits=3)
    kv_case("append f16 rotary paged 1", sq=2, append=True, rotary="interleaved", page_size=1, dtype=fp)
    kv_case("append cap=sq (empty cache)", b=2, sq=5, cap=5, append=True, causal=True, lens=[0, 0])

    # cache_batch_idx, leftpad
    kv_case("batch_idx", batch_idx=True)
    kv_case("batch_idx splits=4", batch_idx=True, splits=4)
    kv_case("leftpad", leftpad=True)
    kv_case("leftpad splits=5 paged 3", leftpad=True, splits=5, page_size=3)
    kv_case("leftpad batch_idx causal sq=5", leftpad=True, batch_idx=True, causal=True, sq=5)

    # masks and score transforms, sq 1 and 5
    for sq in [1, 5]:
        kv_case("causal sq=%d" % sq, sq=sq, causal=True)
        kv_case("causal sq=%d splits=4" % sq, sq=sq, causal=True, splits=4)
        kv_case("window(100,0) sq=%d" % sq, sq=sq, window=(100, 0))
        kv_case("window(7,2) sq=%d splits=3" % sq, sq=sq, window=(7, 2), splits=3)
        kv_case("window(0,0) sq=%d" % sq, sq=sq, window=(0, 0))
        kv_case("window(-1,3) sq=%d" % sq, sq=sq, window=(-1, 3))
        kv_case("causal+window(50) sq=%d" % sq, sq=sq, causal=True, window=(50, -1), splits=2)
        kv_case("softcap sq=%d" % sq, sq=sq, softcap=5.0, splits=2)
        kv_case("alibi sq=%d" % sq, sq=sq, alibi=True, causal=True)
        kv_case("alibi splits=4 sq=%d" % sq, sq=sq, alibi=True, splits=4)
        kv_case("sinks sq=%d" % sq, sq=sq, sinks=True, causal=True)
        kv_case("sinks splits=6 sq=%d" % sq, sq=sq, sinks=True, splits=6)
        kv_case("sinks leftpad (empty rows) sq=%d" % sq, sq=sq, sinks=True, leftpad=True, splits=2)
        kv_case("everything sq=%d" % sq, sq=sq, causal=True, window=(60, -1), softcap=8.0, alibi=True, sinks=True,
                append=True, rotary="half", leftpad=True, page_size=16, splits=3)
    kv_case("negative scale", scale=-0.05)
    kv_case("scale 0.3 splits=2", scale=0.3, splits=2)

    # GQA ratios, MQA (2 row tiles), seqlen_q 5 with 2+ row tiles
    for hq, hkv in [(4, 4), (8, 2), (16, 2), (8, 1), (32, 1)]:
        kv_case("hq=%d hkv=%d" % (hq, hkv), hq=hq, hkv=hkv, splits=0)
        kv_case("hq=%d hkv=%d sq=5 causal splits=3" % (hq, hkv), hq=hq, hkv=hkv, sq=5, causal=True, splits=3)
    kv_case("hq=32 hkv=1 sq=3 window", hq=32, hkv=1, sq=3, window=(20, 0), sinks=True)

    # head dims, d != dv
    for d, dv in [(64, 64), (256, 256), (32, 32), (96, 96), (128, 64), (64, 128), (256, 128), (8, 8), (200, 40)]:
        kv_case("d=%d dv=%d" % (d, dv), d=d, dv=dv, splits=2)
        if not QUICK:
            kv_case("d=%d dv=%d paged 16 append causal" % (d, dv), d=d, dv=dv, page_size=16, append=True,
                    causal=True, sq=2)
    kv_case("d=256 rotary interleaved append", d=256, append=True, rotary="interleaved", sq=2, causal=True)

    # lengths: all empty, all full
    kv_case("all empty caches", b=2, lens=[0, 0], splits=3, sinks=True)
    kv_case("all empty caches no sink", b=2, lens=[0, 0], splits=1)
    kv_case("cap=1", b=2, cap=1, lens=[1, 0])
    kv_case("exact tile multiple", b=2, cap=256, lens=[256, 128], splits=2)

    # fa_merge_states
    for states in ([1, 2, 33, 133] if QUICK else [1, 2, 3, 7, 16, 32, 33, 64, 100, 133]):
        merge_case("merge S=%d f32->bf16" % states, states=states, rows=5, heads=3, dv=128)
    for pdt in [torch.float32, torch.float16, torch.bfloat16]:
        for odt in [torch.float16, torch.bfloat16, torch.float32]:
            merge_case("merge parts %s out %s strided" % (str(pdt)[6:], str(odt)[6:]), states=9, rows=7, heads=2,
                       dv=72, parts_dtype=pdt, out_dtype=odt, strided=True)
    for dv in [1, 31, 129, 512]:
        merge_case("merge dv=%d" % dv, states=5, rows=3, heads=2, dv=dv)
    merge_case("merge no lse", states=4, rows=9, heads=4, dv=64, with_lse=False)
    merge_case("merge all empty", states=6, rows=3, heads=2, dv=16, empty_frac=1.0)
    merge_case("merge 1100 states (lse beyond the smem cache)", states=1100, rows=2, heads=1, dv=64)
    merge_case("merge many rows", states=3, rows=3000, heads=8, dv=128)

    passed = sum(1 for _, ok in RESULTS if ok)
    failed = [n for n, ok in RESULTS if not ok]
    print("\n%d passed, %d failed" % (passed, len(failed)))
    for n in failed:
        print("  FAILED: " + n)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
