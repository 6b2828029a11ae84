"""What the benchmark scripts write into bench/results/, with the standard library only.

machine_and_compiler() and write_result(out_dir, name, lines): the CPU benchmarks' machine line
(CPU model, cores, SIMD level, L3, OS, compiler) and the results file, written and printed.

drop_fa4_if_missing(impls), bench_ms(fn) and gpu_line(env): the GPU benchmarks' FlashAttention-4 import check and their timing
(triton.testing.do_bench median, 25 ms warm-up, 200 ms of repeats) and
their software line.

write_svg(rows, impls, path, title): an SVG chart of TFLOP/s against sequence length; it takes the "speed" rows of bench_gpu.py (one dict per
(d, causal, s) with a {fwd_tflops, bwd_tflops} cell per implementation) and draws one panel per
(mode, d, causal): x = sequence length (log scale), y = TFLOP/s, one line per implementation.
"""
import math
import os
import platform
import subprocess


def machine_and_compiler():
    """The machine line of a CPU benchmark's results: 'Machine: <CPU model>, <cores> cores, <SIMD level>,
    L3 <size>; <OS> <release>. Compiler: <cc --version>. '"""
    model, flags = "?", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = line.split()
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    l3 = subprocess.run(["sh", "-c", "lscpu | grep 'L3 cache' | sed 's/.*: *//'"], capture_output=True, text=True).stdout.strip()
    cc = subprocess.run(["sh", "-c", "${CC:-cc} --version | head -1"], capture_output=True, text=True).stdout.strip()
    return (f"Machine: {model}, {os.cpu_count()} cores, {isa}, L3 {l3 or '?'}; {platform.system()} {platform.release()}. "
            f"Compiler: {cc}. ")


def write_result(out_dir, name, lines):
    """The table's lines as <out_dir>/<name> (the one current file of that benchmark), also printed."""
    text = "\n".join(lines) + "\n"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        f.write(text)
    print(text)


COLORS = {"flashattn": "#d62728", "fa4": "#ff7f0e", "fa2": "#1f77b4", "cudnn": "#2ca02c", "standard": "#7f7f7f"}
PANEL_W, PANEL_H, MARGIN = 260, 190, 48


def _panel(x0, y0, series, title, ymax, seqlens):
    out = [f'<g transform="translate({x0},{y0})">',
           f'<rect x="0" y="0" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#ccc"/>',
           f'<text x="{PANEL_W / 2}" y="-8" font-size="12" text-anchor="middle">{title}</text>']
    lo, hi = math.log2(min(seqlens)), math.log2(max(seqlens))
    span = max(hi - lo, 1e-9)

    def px(s):
        return (math.log2(s) - lo) / span * (PANEL_W - 20) + 10

    def py(t):
        return PANEL_H - t / ymax * (PANEL_H - 10)

    for frac in (0.25, 0.5, 0.75, 1.0):
        t = ymax * frac
        out.append(f'<line x1="0" x2="{PANEL_W}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="-4" y="{py(t) + 4:.1f}" font-size="9" text-anchor="end">{t:.0f}</text>')
    for s in seqlens:
        label = f"{s // 1024}k" if s >= 1024 else str(s)
        out.append(f'<text x="{px(s):.1f}" y="{PANEL_H + 12}" font-size="9" text-anchor="middle">{label}</text>')
    for name, pts in series.items():
        pts = [(s, t) for s, t in pts if t is not None]
        if not pts:
            continue
        color = COLORS.get(name, "#9467bd")
        path = " ".join(f"{px(s):.1f},{py(t):.1f}" for s, t in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for s, t in pts:
            out.append(f'<circle cx="{px(s):.1f}" cy="{py(t):.1f}" r="2.5" fill="{color}"/>')
    out.append("</g>")
    return out


def write_svg(rows, impls, path, title=""):
    keys = sorted({(r["d"], bool(r["causal"])) for r in rows})
    modes = [m for m in ("fwd", "bwd") if any(f"{m}_tflops" in r.get(i, {}) for r in rows for i in impls)]
    seqlens = sorted({r["s"] for r in rows})
    ymax = 0.0
    for r in rows:
        for i in impls:
            for m in modes:
                ymax = max(ymax, r.get(i, {}).get(f"{m}_tflops", 0.0) or 0.0)
    ymax = max(100.0, math.ceil(ymax / 100.0) * 100.0)
    width = MARGIN + len(keys) * (PANEL_W + MARGIN)
    height = 70 + len(modes) * (PANEL_H + 60)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif">', f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{MARGIN}" y="20" font-size="14">{title} — TFLOP/s vs sequence length</text>']
    lx = MARGIN
    for name in impls:
        color = COLORS.get(name, "#9467bd")
        out.append(f'<rect x="{lx}" y="30" width="12" height="4" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="36" font-size="11">{name}</text>')
        lx += 110
    for mi, m in enumerate(modes):
        for ki, (d, causal) in enumerate(keys):
            series = {}
            for name in impls:
                pts = []
                for r in rows:
                    if r["d"] == d and bool(r["causal"]) == causal:
                        pts.append((r["s"], r.get(name, {}).get(f"{m}_tflops")))
                series[name] = sorted(pts)
            x0 = MARGIN + ki * (PANEL_W + MARGIN)
            y0 = 70 + mi * (PANEL_H + 60)
            out += _panel(x0, y0, series, f"{m} d={d} {'causal' if causal else 'non-causal'}", ymax, seqlens)
    out.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")


def drop_fa4_if_missing(impls):
    """Removes "fa4" from the list impls, saying why, when FlashAttention-4's interface
    (flash_attn.cute) cannot be imported."""
    if "fa4" not in impls:
        return
    try:
        from flash_attn.cute import flash_attn_func  # noqa: F401
    except Exception as e:  # not installed, or no kernel for this GPU
        print(f"FlashAttention-4 not measured: {repr(e).splitlines()[0][:200]}", flush=True)
        impls.remove("fa4")


def bench_ms(fn):
    import triton
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def err_text(e):
    """An exception as one line for a results cell: its type and first non-empty line."""
    lines = [x for x in str(e).splitlines() if x.strip()]
    return (type(e).__name__ + ": " + (lines[0] if lines else repr(e)))[:240]


def time_fwd_bwd(f, inputs, do, flops, modes=("fwd", "bwd")):
    """One implementation's cell on one shape: the forward f() under no_grad and the backward
    (torch.autograd.grad of f()'s output with respect to `inputs`, gradient `do`), each the
    bench_ms median, with TFLOP/s from the forward's `flops` (the backward's: 2.5×). A forward
    failure raises; a backward failure keeps the forward's numbers and is the cell's "bwd_error"."""
    import torch
    cell = {}
    if "fwd" in modes:
        with torch.no_grad():
            f()
            ms = bench_ms(f)
        cell["fwd_ms"] = round(ms, 4)
        cell["fwd_tflops"] = round(flops / ms / 1e9, 1)
    if "bwd" in modes:
        try:
            o = f()
            g = lambda: torch.autograd.grad(o, tuple(inputs), do, retain_graph=True)  # noqa: E731
            g()
            ms = bench_ms(g)
            cell["bwd_ms"] = round(ms, 4)
            cell["bwd_tflops"] = round(2.5 * flops / ms / 1e9, 1)
        except Exception as e:  # noqa: BLE001 (a backend's refusal is a result)
            cell["bwd_error"] = err_text(e)
        o = None
    return cell


def pass_order(names, r):
    """The implementations' order in timing pass r: reversed on every other pass, so none always
    runs first, after the same predecessor, in the same power state (docs/design.md)."""
    return names if r % 2 == 0 else names[::-1]


def best_cell(a, b):
    """Per mode (fwd, bwd), the faster of two passes' cells of one implementation ({mode}_ms,
    {mode}_tflops; a cell with "error" loses to one without)."""
    if a is None or "error" in a:
        return b
    if "error" in b:
        return a
    out = dict(a)
    for m in ("fwd", "bwd"):
        if f"{m}_ms" in b and (f"{m}_ms" not in a or b[f"{m}_ms"] < a[f"{m}_ms"]):
            out[f"{m}_ms"], out[f"{m}_tflops"] = b[f"{m}_ms"], b[f"{m}_tflops"]
    if "bwd_ms" in out:
        out.pop("bwd_error", None)  # one pass's backward ran
    return out


def gpu_line(env):
    """The software line of a GPU benchmark's results: 'GPU: <name>; torch <v>; cuDNN <v>[;
    FlashAttention-4 <v>]; ' from the env dict the scripts record."""
    fa4 = f"; FlashAttention-4 {env['fa4']}" if "fa4" in env else ""
    return f"GPU: {env['gpu']}; torch {env['torch']}; cuDNN {env['cudnn']}{fa4}; "
