"""Side-by-side GPU benchmark of programmable attention: masks, block sparsity and an additive
score bias with its gradient; flashattn against FlexAttention (torch.compile), FlashAttention-4
(when `flash_attn.cute` is importable) and PyTorch SDPA, measured in one run on the same inputs.

Run where PyTorch and a CUDA GPU are present, from the repository root, after `make`:

    python3 bench/bench_mods.py [--seqlens 16384] [--bias-seqlen 4096] [--out bench/results]
    python3 bench/bench_mods.py --dry-run     # CPU: build every mask small, check it, no timing

Shape: bf16, d = 128, b·s = 16k tokens, hidden 2048 (16 heads); b1 s16k by default.

1. Masks, each with the implementations that express it (interleaved per case):
   causal; sliding window of 1024 keys to the left and none to the right (query i sees keys
   i-1024 .. i); document mask of 8 equal documents, causal inside each; prefix LM (keys below
   4096 visible to every query, causal after).
   flashattn: flashattn.flex_attention with the package's block masks (causal_block_mask,
   sliding_window_block_mask, document_block_mask, prefix_lm_block_mask; blocks of 128).
   flashattn-native: flash_attn_func(causal=True), window_size=(1024, 0), flash_attn_varlen_func
   over the 8 documents (causal); no native prefix LM.
   flex: torch's flex_attention under torch.compile with create_block_mask (BLOCK_SIZE 128).
   fa4: flash_attn.cute.flash_attn_func with causal / window_size, and a CuTe mask_mod for the
   document and prefix-LM masks (with block-sparse tensors from torch's BlockMask; when those
   are refused, the mask_mod alone over every block, noted in the row).
2. Sparsity: a block mask (128 × 128 blocks) with 1/8 of the key blocks of each query block
   visible (random, seeded, the diagonal block always in, every listed block fully visible):
   flashattn block-sparse against flashattn's dense call (speed-up, fwd and bwd) and flex.
3. Additive bias [1, 16, s, s] bf16 requiring grad (s = 4096): flashattn flash_attn_func
   (attn_bias=) against SDPA with a float attn_mask requiring grad under EFFICIENT_ATTENTION,
   CUDNN_ATTENTION and MATH; fwd, bwd and fwd+bwd, ratio to the fastest SDPA backend.

TFLOP/s count the VISIBLE (query, key) pairs (counted from the mask itself): forward
4·pairs·d, backward 2.5× forward; milliseconds too. Timing: triton.testing.do_bench median
(as bench/bench_gpu.py), backward as torch.autograd.grad of the forward output. Every
implementation runs in try/except: a failure is a row with its error. --deadline: no new case
(or implementation) starts after that many seconds (the mask cases stop 45 s earlier, kept for
the bias case); what was measured is still written.

Writes <out>/<tag>.md and .json (default bench/results/mods.*) and prints the table last.
"""
import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from report import bench_ms, best_cell, drop_fa4_if_missing, err_text, gpu_line, pass_order, time_fwd_bwd  # noqa: E402

BLOCK = 128
HIDDEN = 2048
D = 128
MASK_IMPLS = ("flashattn", "flashattn-native", "flex", "fa4")




# ---- masks: one definition per case, used by every implementation ------------------------------


class MaskCase:
    """A mask case: its torch mask_mod (the definition), the pieces each implementation needs,
    and the number of visible (query, key) pairs per (batch, head)."""

    def __init__(self, name, label, mask_mod, s, device):
        self.name, self.label, self.mask_mod, self.s, self.device = name, label, mask_mod, s, device
        self.pairs = count_pairs(mask_mod, s, device)


def count_pairs(mask_mod, s, device, rows=1024):
    """Visible pairs of mask_mod over an s × s grid, evaluated in row chunks."""
    total = 0
    kv = torch.arange(s, device=device).view(1, -1)
    zero = torch.zeros((), dtype=torch.int64, device=device)
    for r0 in range(0, s, rows):
        q = torch.arange(r0, min(s, r0 + rows), device=device).view(-1, 1)
        total += int(torch.as_tensor(mask_mod(zero, zero, q, kv)).expand(q.shape[0], s).sum().item())
    return total


def random_block_table(s, keep_every, seed):
    """[QB, KB] bool: for each query block, the diagonal block plus random others, 1/keep_every
    of the key blocks in all (at least 1)."""
    nb = -(-s // BLOCK)
    per_row = max(1, nb // keep_every)
    g = torch.Generator().manual_seed(seed)
    table = torch.zeros(nb, nb, dtype=torch.bool)
    for qb in range(nb):
        table[qb, qb] = True
        others = [kb for kb in torch.randperm(nb, generator=g).tolist() if kb != qb]
        for kb in others[:per_row - 1]:
            table[qb, kb] = True
    return table


def block_sparse_from_table(table, s):
    """flashattn.BlockSparseMask listing the table's blocks as fully visible (no partial ones)."""
    import flashattn
    nb_q, nb_k = table.shape
    counts = table.sum(-1).to(torch.int32)
    order = torch.sort(torch.where(table, torch.arange(nb_k), torch.full((nb_q, nb_k), nb_k + 1)),
                       dim=-1)[0]
    order = torch.where(order < nb_k, order, torch.zeros_like(order)).to(torch.int32)
    zeros_c = torch.zeros(1, 1, nb_q, dtype=torch.int32)
    zeros_i = torch.zeros(1, 1, nb_q, nb_k, dtype=torch.int32)
    return flashattn.BlockSparseMask((BLOCK, BLOCK), zeros_c, zeros_i, counts.view(1, 1, nb_q),
                                     order.view(1, 1, nb_q, nb_k), seq_lengths=(s, s))


def mask_to_device(m, device):
    """A BlockSparseMask with its tensors moved once to the device (no copy inside the timing)."""
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "partial_block_bits", "doc_ids_q", "doc_ids_k"):
        t = getattr(m, name)
        if t is not None:
            setattr(m, name, t.to(device).contiguous())
    return m


def build_cases(s, b, device, window, prefix, docs, keep_every, seed):
    """The mask cases at sequence length s (block masks for flashattn built on the CPU and moved
    to the device, doc ids, cu_seqlens)."""
    import flashattn
    L = s // docs
    doc_ids = (torch.arange(s) // L).clamp(max=docs - 1).to(torch.int32)
    doc_dev = doc_ids.to(device)
    table = random_block_table(s, keep_every, seed)
    table_dev = table.to(device)

    cases = []
    c = MaskCase("causal", "causal", lambda b_, h, q, kv: q >= kv, s, device)
    c.fa_mask = flashattn.causal_block_mask(s, block_size=BLOCK)
    c.native = {"causal": True}
    c.fa4 = {"causal": True}
    cases.append(c)

    c = MaskCase("window", f"sliding window left {window}, right 0",
                 lambda b_, h, q, kv: (q >= kv) & (q - kv <= window), s, device)
    c.fa_mask = flashattn.sliding_window_block_mask(s, window_size=(window, 0), block_size=BLOCK)
    c.native = {"window_size": (window, 0)}
    c.fa4 = {"window_size": (window, 0)}
    cases.append(c)

    c = MaskCase("document", f"{docs} equal documents, causal inside",
                 lambda b_, h, q, kv: (doc_dev[q] == doc_dev[kv]) & (q >= kv), s, device)
    c.fa_mask = flashattn.document_block_mask(doc_ids, causal=True, block_size=BLOCK)
    starts = [0] + [int(x) for x in torch.nonzero(doc_ids[1:] != doc_ids[:-1]).flatten() + 1] + [s]
    lens = [starts[i + 1] - starts[i] for i in range(len(starts) - 1)]
    cu = [0]
    for _ in range(b):
        for n in lens:
            cu.append(cu[-1] + n)
    c.native = {"varlen": torch.tensor(cu, dtype=torch.int32, device=device), "max_len": max(lens)}
    c.fa4 = {"mask_mod": ("document", L)}
    cases.append(c)

    c = MaskCase("prefix_lm", f"prefix LM, prefix {prefix}",
                 lambda b_, h, q, kv: (kv < prefix) | (q >= kv), s, device)
    c.fa_mask = flashattn.prefix_lm_block_mask(s, prefix, block_size=BLOCK)
    c.native = None
    c.fa4 = {"mask_mod": ("prefix_lm", prefix)}
    cases.append(c)

    c = MaskCase("sparse", f"block-sparse 1/{keep_every} of key blocks (seed {seed})",
                 lambda b_, h, q, kv: table_dev[q // BLOCK, kv // BLOCK], s, device)
    c.fa_mask = block_sparse_from_table(table, s)
    c.native = None
    c.fa4 = None
    cases.append(c)
    for c in cases:
        mask_to_device(c.fa_mask, device)
    return cases


def fa4_mask_mod(kind, value):
    """FlashAttention-4 mask_mods (CuTe DSL; indices are TensorSSA of one element)."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    if kind == "document":  # equal documents of `value` tokens, causal inside
        @cute.jit
        def document_causal(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
            length = utils.scalar_to_ssa(value, cutlass.Int32)
            return ((m_idx // length) == (n_idx // length)) & (m_idx >= n_idx)
        return document_causal

    @cute.jit
    def prefix_lm(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        prefix = utils.scalar_to_ssa(value, cutlass.Int32)
        return (n_idx < prefix) | (m_idx >= n_idx)
    return prefix_lm


# ---- implementations: forward closures returning out [b, s, h, d] ----------------------------


class Ctx:
    """Per-case state shared by the implementations (compiled flex, torch BlockMask)."""
    flex_compiled = None

    def __init__(self, case):
        self.case = case
        self.torch_block_mask = None
        self.note = None

    def block_mask(self, b, h):
        if self.torch_block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask
            s = self.case.s
            self.torch_block_mask = create_block_mask(self.case.mask_mod, None, None, s, s,
                                                      device=self.case.device,
                                                      BLOCK_SIZE=BLOCK)
        return self.torch_block_mask


def make_fn(name, ctx, q, k, v, compile_flex=True):
    import flashattn
    case = ctx.case
    b, s, h, d = q.shape
    if name == "flashattn":
        m = case.fa_mask
        return lambda: flashattn.flex_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                v.transpose(1, 2), block_mask=m).transpose(1, 2)
    if name == "flashattn-dense":
        return lambda: flashattn.flash_attn_func(q, k, v)
    if name == "flashattn-native":
        nat = case.native
        if nat is None:
            return None
        if "varlen" in nat:
            cu, ml = nat["varlen"], nat["max_len"]
            return lambda: flashattn.flash_attn_varlen_func(
                q.reshape(b * s, h, d), k.reshape(b * s, h, d), v.reshape(b * s, h, d), cu, cu,
                ml, ml, causal=True).view(b, s, h, d)
        return lambda: flashattn.flash_attn_func(q, k, v, **nat)
    if name == "flex":
        from torch.nn.attention.flex_attention import flex_attention
        if compile_flex and Ctx.flex_compiled is None:
            # `from torch import` keeps `torch` the module-level name in this function (an `import
            # torch._dynamo` here would make it a local, unbound in the other branches)
            from torch import _dynamo
            for knob in ("cache_size_limit", "recompile_limit"):  # one compile per mask_mod
                if hasattr(_dynamo.config, knob):
                    setattr(_dynamo.config, knob, 64)
            Ctx.flex_compiled = torch.compile(flex_attention, dynamic=False)
        fx = Ctx.flex_compiled if compile_flex else flex_attention
        bm = ctx.block_mask(b, h)
        return lambda: fx(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          block_mask=bm).transpose(1, 2)
    if name == "fa4":
        spec = case.fa4
        if spec is None:
            return None
        from flash_attn.cute import flash_attn_func as fa4_func
        if "mask_mod" not in spec:
            def f4():
                r = fa4_func(q, k, v, **spec)
                return r[0] if isinstance(r, tuple) else r
            return f4
        mm = fa4_mask_mod(*spec["mask_mod"])
        kw = {"mask_mod": mm}
        try:
            from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
            bm = ctx.block_mask(b, h)
            kw["block_sparse_tensors"] = BlockSparseTensorsTorch(
                bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
                block_size=(BLOCK, BLOCK))
            kw["block_sparse_tensors_bwd"] = BlockSparseTensorsTorch(
                bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices,
                block_size=(BLOCK, BLOCK))
        except Exception as e:
            ctx.note = "no block-sparse tensors (%s): mask_mod over every block" % err_text(e)

        def f4m():
            r = fa4_func(q, k, v, **kw)
            return r[0] if isinstance(r, tuple) else r
        try:  # compile and check once; without block sparsity when that is refused
            with torch.no_grad():
                f4m()
        except Exception as e:
            if "block_sparse_tensors" not in kw:
                raise
            kw.pop("block_sparse_tensors")
            kw.pop("block_sparse_tensors_bwd")
            ctx.note = "block-sparse tensors refused (%s): mask_mod over every block" % err_text(e)
        return f4m
    raise ValueError("unknown implementation " + name)


class Guard:
    def __init__(self, seconds):
        self.t0, self.seconds = time.time(), seconds

    def over(self):
        return time.time() - self.t0 > self.seconds

    def elapsed(self):
        return round(time.time() - self.t0, 1)


def run_mask_cases(rows, seqlens, impls, guard, args, case_names):
    """Appends one row per (seqlen, case) to rows as it is measured (a failure keeps the rest)."""
    for s in seqlens:
        b = max(1, args.tokens // s)
        h = HIDDEN // D
        if guard.over():
            rows.append({"s": s, "error": "not started: --deadline reached"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        try:
            cases = build_cases(s, b, args.device, args.window, args.prefix, args.docs,
                                args.keep_every, args.seed)
        except Exception as e:
            rows.append({"s": s, "error": "building the masks: " + err_text(e)})
            print(json.dumps(rows[-1]), flush=True)
            continue
        for case in cases:
            if case.name not in case_names:
                continue
            row = {"case": case.name, "mask": case.label, "s": s, "b": b, "h": h, "d": D,
                   "density": round(case.pairs / (s * s), 4)}
            if guard.over():
                row["error"] = "not started: --deadline reached"
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            try:
                measure_case(row, case, impls, guard, args, b, s, h)
            except Exception as e:  # inputs that did not fit, a broken context: still a row
                row["error"] = err_text(e)
            row["elapsed_s"] = guard.elapsed()
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    return rows


def measure_case(row, case, impls, guard, args, b, s, h):
    """One mask case: every implementation in turn on the same inputs, cells into row; then
    args.rounds - 1 more passes, the order reversed every other pass, each implementation
    keeping its faster timings (what ran before a kernel moves it: docs/design.md)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, D, device=args.device, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    flops = 4.0 * b * h * case.pairs * D
    ctx = Ctx(case)
    ref_out = ref_name = None
    names = list(impls)
    if case.name == "sparse":
        names = [n for n in ("flashattn", "flashattn-dense", "flex") if n in impls or
                 (n == "flashattn-dense" and "flashattn" in impls)]
    timed = {}  # name -> (its function, its FLOP count), for the later passes
    for name in names:
        if guard.over():
            row[name] = {"error": "not started: --deadline reached"}
            continue
        try:
            ctx.note = None
            f = make_fn(name, ctx, q, k, v)
            if f is None:
                continue
            dense_flops = 4.0 * b * h * s * s * D
            timed[name] = (f, dense_flops if name == "flashattn-dense" else flops)
            cell = time_fwd_bwd(f, (q, k, v), do, timed[name][1])
            if ctx.note:
                cell["note"] = ctx.note
            if name != "flashattn-dense":  # cross-check: the first implementation's output
                with torch.no_grad():
                    out = f().float()
                if ref_out is None:
                    ref_out, ref_name = out, name
                else:
                    cell[f"max_diff_vs_{ref_name}"] = round(float((out - ref_out).abs().max()), 4)
                out = None
            row[name] = cell
        except Exception as e:  # an unsupported mask for one implementation is a result too
            row[name] = {"error": err_text(e)}
        torch.cuda.empty_cache()
    for r in range(1, args.rounds):
        for name in pass_order(names, r):
            if name not in timed or "error" in row[name] or guard.over():  # timed: row[name] is set
                continue
            try:
                row[name] = best_cell(row[name], time_fwd_bwd(timed[name][0], (q, k, v), do, timed[name][1]))
            except Exception:  # the first pass's numbers stand
                pass
    if case.name == "sparse":
        sp, de = row.get("flashattn", {}), row.get("flashattn-dense", {})
        for mode in ("fwd", "bwd"):
            if f"{mode}_ms" in sp and f"{mode}_ms" in de:
                row[f"speedup_{mode}"] = round(de[f"{mode}_ms"] / sp[f"{mode}_ms"], 2)


SDPA_BIAS = ("sdpa-efficient", "sdpa-cudnn", "sdpa-math")


def run_bias_case(row, s, impls, guard, args):
    """Fills row (the caller's, so that a failure keeps what was measured)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import flashattn
    h = HIDDEN // D
    row.update({"case": "bias", "mask": f"additive bias [1, {h}, {s}, {s}] bf16 with gradient",
                "s": s, "b": 1, "h": h, "d": D})
    if guard.over():
        row["error"] = "not started: --deadline reached"
        print(json.dumps(row), flush=True)
        return row
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, s, h, D, device=args.device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    bias = torch.randn(1, h, s, s, device=args.device, dtype=torch.bfloat16).requires_grad_(True)
    do = torch.randn_like(q)
    flops = 4.0 * h * s * s * D
    backends = {"sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
                "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-math": SDPBackend.MATH}
    names = [n for n in ("flashattn",) + SDPA_BIAS
             if n in impls or (n in SDPA_BIAS and "sdpa" in impls)]
    for name in names:
        if guard.over():
            row[name] = {"error": "not started: --deadline reached"}
            continue
        try:
            if name == "flashattn":
                f = lambda: flashattn.flash_attn_func(q, k, v, attn_bias=bias)
            else:
                be = backends[name]
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def f(be=be, qt=qt, kt=kt, vt=vt):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(qt, kt, vt,
                                                              attn_mask=bias).transpose(1, 2)
            cell = time_fwd_bwd(f, (q, k, v, bias), do, flops)
            row[name] = cell
            if "bwd_ms" in cell:
                def fb():
                    o = f()
                    return torch.autograd.grad(o, (q, k, v, bias), do)
                fb()
                ms = bench_ms(fb)
                cell["fwdbwd_ms"] = round(ms, 4)
                cell["fwdbwd_tflops"] = round(3.5 * flops / ms / 1e9, 1)
        except Exception as e:
            row.setdefault(name, {})["error"] = err_text(e)
        torch.cuda.empty_cache()
    best = [row[n]["fwdbwd_ms"] for n in SDPA_BIAS if "fwdbwd_ms" in row.get(n, {})]
    if best and "fwdbwd_ms" in row.get("flashattn", {}):
        row["ratio_vs_best_sdpa"] = round(min(best) / row["flashattn"]["fwdbwd_ms"], 2)
    row["elapsed_s"] = guard.elapsed()
    print(json.dumps(row), flush=True)
    torch.cuda.empty_cache()
    return row


# ---- report ----------------------------------------------------------------------------------


def fmt_cell(c, mode):
    """'TFLOP/s (ms)' of one mode of a cell; err / - when it failed / was not run."""
    if not c:
        return "-"
    if "error" in c or f"{mode}_error" in c:
        return "err"
    if f"{mode}_ms" not in c:
        return "-"
    return f"{c[mode + '_tflops']} ({c[mode + '_ms']} ms)"


def markdown(res):
    env = res["env"]
    lines = [f"# Programmable attention benchmark {env['date']}", "",
             gpu_line(env) + "bf16, d = 128, "
             "hidden 2048 (16 heads), b·s = 16k tokens. TFLOP/s over the VISIBLE (query, key) pairs "
             "(fwd 4·pairs·d, bwd 2.5× fwd), then milliseconds; median of triton.testing.do_bench, "
             f"implementations interleaved case by case in one process, the faster of {env.get('rounds', 1)} "
             "passes per implementation (the order reversed every other pass; the bias case one pass). "
             f"Window: left {env['window'][0]}, right 0. "
             "Written by bench/bench_mods.py.", ""]
    impls = [n for n in MASK_IMPLS if any(n in r for r in res["masks"])]
    lines += ["| mask | seqlen | density | " + " | ".join(f"{n} fwd | {n} bwd" for n in impls) + " |",
              "|" + "---|" * (3 + 2 * len(impls))]
    for r in res["masks"]:
        if r.get("case") == "sparse" or "case" not in r:
            continue
        cells = []
        for n in impls:
            c = r.get(n, {})
            cells += [fmt_cell(c, "fwd"), fmt_cell(c, "bwd")]
        lines.append(f"| {r['mask']} | {r['s']} | {r['density']} | " + " | ".join(cells) + " |")
    sparse = [r for r in res["masks"] if r.get("case") == "sparse"]
    if sparse:
        lines += ["", "Block sparsity (1/8 of the key blocks of each query block, fully visible; "
                  "dense = flash_attn_func without a mask, TFLOP/s of dense over all s² pairs):", "",
                  "| seqlen | density | flashattn fwd / bwd ms | dense fwd / bwd ms | speed-up fwd | "
                  "speed-up bwd | flex fwd / bwd ms |", "|---|---|---|---|---|---|---|"]
        def sx(r, key):
            return f"{r[key]}×" if key in r else "-"
        for r in sparse:
            def ms(n):
                c = r.get(n, {})
                return "err" if "error" in c else f"{c.get('fwd_ms', '-')} / {c.get('bwd_ms', '-')}"
            lines.append(f"| {r['s']} | {r['density']} | {ms('flashattn')} | {ms('flashattn-dense')} "
                         f"| {sx(r, 'speedup_fwd')} | {sx(r, 'speedup_bwd')} | {ms('flex')} |")
    if res.get("bias"):
        r = res["bias"]
        lines += ["", f"{r.get('mask', 'bias')}, fwd + bwd (dq, dk, dv, dbias), milliseconds:", "",
                  "| impl | fwd ms | bwd ms | fwd+bwd ms | fwd+bwd TFLOP/s |", "|---|---|---|---|---|"]
        for n in ("flashattn",) + SDPA_BIAS:
            c = r.get(n)
            if c is None:
                continue
            vals = [c.get(key, "err" if ("error" in c or "bwd_error" in c) else "-")
                    for key in ("fwd_ms", "bwd_ms", "fwdbwd_ms", "fwdbwd_tflops")]
            lines.append(f"| {n} | " + " | ".join(str(x) for x in vals) + " |")
        if "ratio_vs_best_sdpa" in r:
            lines += ["", f"flashattn fwd+bwd is {r['ratio_vs_best_sdpa']}× the fastest SDPA backend."]
    errors = []
    for r in res["masks"] + ([res["bias"]] if res.get("bias") else []):
        tag = f"{r.get('case', 'every case')} s{r.get('s', '?')}"
        if "error" in r:
            errors.append(f"- {tag}: {r['error']}")
        for n, c in r.items():
            if isinstance(c, dict):
                for key in ("error", "bwd_error", "note"):
                    if key in c:
                        errors.append(f"- {tag} {n} ({key}): {c[key]}")
    checks = []
    for r in res["masks"]:
        diffs = [f"{n} vs {key[len('max_diff_vs_'):]}: {c[key]}" for n, c in r.items()
                 if isinstance(c, dict) for key in c if key.startswith("max_diff_vs_")]
        if diffs:
            checks.append(f"- {r['case']} s{r['s']}: " + ", ".join(diffs))
    if checks:
        lines += ["", "Cross-check, largest |out - out of the first implementation| (bf16):", ""] + checks
    if errors:
        lines += ["", "Errors and notes:", ""] + errors
    return "\n".join(lines) + "\n"


# ---- dry run: every mask at a small size, checked against a dense masked reference on the CPU --


def dry_run(args):
    """Builds every mask, block mask and cu_seqlens at a small size on the CPU and checks each
    implementation that runs on the CPU (flashattn, flashattn-native, eager flex) against SDPA
    with the dense boolean mask, float32; the bias case likewise with its gradient."""
    import flashattn
    s, b, h, d = args.dry_seqlen, 2, 2, 32
    window, prefix = min(args.window, s // 4), min(args.prefix, s // 4)
    cases = build_cases(s, b, "cpu", window, prefix, args.docs, args.keep_every, args.seed)
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.float32, requires_grad=True) for _ in range(3))
    worst = 0.0
    for case in cases:
        qi = torch.arange(s).view(-1, 1)
        dense = torch.as_tensor(case.mask_mod(0, 0, qi, torch.arange(s).view(1, -1))).expand(s, s)
        assert int(dense.sum()) == case.pairs, (case.name, int(dense.sum()), case.pairs)
        ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=dense).transpose(1, 2)
        ctx = Ctx(case)
        line = {"case": case.name, "s": s, "density": round(case.pairs / (s * s), 4),
                "flashattn_blocks": int(case.fa_mask.kv_num_blocks.sum() +
                                        case.fa_mask.full_kv_num_blocks.sum())}
        for name in ("flashattn", "flashattn-native", "flex", "flashattn-dense"):
            if name == "flashattn-dense" and case.name != "sparse":
                continue
            try:
                f = make_fn(name, ctx, q.detach(), k.detach(), v.detach(), compile_flex=False)
                if f is None:
                    continue
                with torch.no_grad():  # eager flex has no CPU backward; the bias case checks grads
                    out = f()
                if name == "flashattn-dense":
                    line[name] = "ran"
                    continue
                err = float((out - ref).abs().max())
                worst = max(worst, err)
                line[name] = round(err, 7)
            except Exception as e:
                line[name] = "error: " + err_text(e)
                worst = float("inf")
        print(json.dumps(line), flush=True)
    # bias with gradient against SDPA's float mask
    bias = torch.randn(1, h, s, s, dtype=torch.float32, requires_grad=True)
    o1 = flashattn.flash_attn_func(q, k, v, attn_bias=bias)
    g1 = torch.autograd.grad(o1, (q, k, v, bias), torch.ones_like(o1))
    o2 = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        attn_mask=bias).transpose(1, 2)
    g2 = torch.autograd.grad(o2, (q, k, v, bias), torch.ones_like(o2))
    err = max([float((o1 - o2).abs().max())] + [float((a - c).abs().max()) for a, c in zip(g1, g2)])
    worst = max(worst, err)
    print(json.dumps({"case": "bias", "s": s, "max_err_out_and_grads": round(err, 7)}), flush=True)
    ok = worst < 1e-3
    print("dry run:", "all masks agree with the dense reference" if ok else
          f"MISMATCH (worst error {worst})", flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="16384", help="mask and sparsity cases (b = 16384 / s)")
    ap.add_argument("--tokens", type=int, default=16384, help="b·s")
    ap.add_argument("--bias-seqlen", type=int, default=4096, help="bias case (b1); 0 leaves it out")
    ap.add_argument("--cases", default="causal,window,document,prefix_lm,sparse")
    ap.add_argument("--impls", default="flashattn,flashattn-native,flex,fa4,sdpa",
                    help="sdpa: the bias case's SDPA backends (or name sdpa-efficient, ...)")
    ap.add_argument("--window", type=int, default=1024, help="sliding window, keys to the left")
    ap.add_argument("--prefix", type=int, default=4096, help="prefix LM: prefix length")
    ap.add_argument("--docs", type=int, default=8, help="document mask: equal documents")
    ap.add_argument("--keep-every", type=int, default=8, help="sparsity: 1/N of the key blocks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2,
                    help="passes over the implementations per mask case, the order reversed every other "
                         "pass; each keeps its faster timings")
    ap.add_argument("--deadline", type=float, default=420.0,
                    help="seconds after which no new case or implementation starts")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default="mods")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU: build every mask at --dry-seqlen and check it, no timing, no files")
    ap.add_argument("--dry-seqlen", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="cuda (cpu only to try the script itself)")
    a = ap.parse_args()
    if a.dry_run:
        return dry_run(a)
    guard = Guard(a.deadline)
    impls = a.impls.split(",")
    drop_fa4_if_missing(impls)
    res = {"env": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                   "gpu": (torch.cuda.get_device_name() if a.device == "cuda" else a.device), "torch": torch.__version__,
                   "cudnn": torch.backends.cudnn.version(), "impls": impls,
                   "window": [a.window, 0], "prefix": a.prefix, "docs": a.docs,
                   "keep_every": a.keep_every, "seed": a.seed, "block": BLOCK, "rounds": a.rounds}}
    if "fa4" in impls:
        import importlib.metadata as md
        try:
            res["env"]["fa4"] = md.version("flash-attn-4")
        except Exception:
            res["env"]["fa4"] = "unknown version"
    print(json.dumps(res["env"]), flush=True)
    res["masks"], res["bias"] = [], None
    # the bias case (no compiler, ~20 s) keeps a reserve of the time when the masks' compiles run long
    mask_guard = Guard(a.deadline - (45 if a.bias_seqlen > 0 else 0))
    try:
        run_mask_cases(res["masks"], [int(x) for x in a.seqlens.split(",") if x],
                       [n for n in impls if n in MASK_IMPLS], mask_guard, a, a.cases.split(","))
    except Exception as e:  # keep what the other parts measure
        res["masks"].append({"case": "masks", "error": err_text(e)})
    if a.bias_seqlen > 0:
        res["bias"] = {"case": "bias", "s": a.bias_seqlen}
        try:
            run_bias_case(res["bias"], a.bias_seqlen, impls, guard, a)
        except Exception as e:
            res["bias"]["error"] = err_text(e)
    res["env"]["elapsed_s"] = guard.elapsed()
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, a.tag)
    md_text = markdown(res)
    with open(stem + ".md", "w") as fh:
        fh.write(md_text)
    with open(stem + ".json", "w") as fh:
        json.dump(res, fh, indent=1)
    print(md_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
