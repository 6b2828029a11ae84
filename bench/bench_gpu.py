"""Side-by-side GPU benchmark: flashattn against FlashAttention-4 (when `flash_attn.cute` is
importable) and PyTorch SDPA's CUDNN_ATTENTION and FLASH_ATTENTION (FlashAttention-2) backends,
measured in one run on the same inputs.

Run where PyTorch and a CUDA GPU are present, from the repository root, after `make`:

    python3 bench/bench_gpu.py [--quick] [--out bench/results] [--d 64,128,256] [--seqlens 512,...]

Shapes are the FlashAttention papers' standard ones: b·s = 16k tokens, hidden 2048 (h = 2048/d),
bf16, causal and not, plus the GQA shape NVIDIA publishes for cuDNN (b1, s16k, 64 query / 8 kv
heads, d128; --no-gqa leaves it out). FLOPs: forward 4·b·h·s²·d (halved when causal), backward
2.5× forward. Timing: triton.testing.do_bench median (events, warm-up, repeats), the same method
for every implementation (docs/design.md, "Measurement method"), in --rounds passes per shape
(default 2) whose order of implementations alternates, each implementation's faster pass kept. Backward is timed as
torch.autograd.grad of the forward output for every
implementation alike. Also measured: peak extra memory of causal fwd+bwd at long sequence
(b=1, h=16, d=128) above q, k, v.

Our numbers come, by default (--ours python), from flashattn.flash_attn_func timed through torch
exactly like the SDPA backends, interleaved with them shape by shape in one process: the same
do_bench timing and the same power state. That matters on an H200: under sustained load these
kernels run at the software power cap (SM clock ~1740 MHz instead of 1980), and a tool that times
short bursts between pauses measures up to ~10 % more (docs/tuning-log.md, "Power cap"). The
price is the Python wrapper's launch cost (a few % at the shortest shapes). --ours cli takes our
numbers from the `flashattn bench --device cuda --json` tool instead (CUDA events, median,
L2-sized input rotation, no wrapper cost). Memory for ours always comes from the tool when it is
built (--tool): its measured extra bytes (workspace + device allocations during the calls) plus
the outputs it preallocates (o, lse, dq, dk, dv), which SDPA's number includes.

Attention dropout (--dropout P, default 0.1; 0 leaves it out): fwd+bwd at d128, bf16, b·s = 16k,
causal and not, ours with dropout next to SDPA's FLASH_ATTENTION backend with the same dropout_p
and ours without dropout (what the mask costs), in its own table.

Writes bench/results/gpu.md (Markdown table), .json (all numbers) and .svg (TFLOP/s
against sequence length) and prints the table last.
"""
import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from report import best_cell, drop_fa4_if_missing, err_text, gpu_line, pass_order, time_fwd_bwd, write_svg  # noqa: E402

import subprocess  # noqa: E402

SDPA_BACKENDS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}




def cli_rows(tool, d_list, s_list, modes, causal_list=(0, 1), mem_only=False):
    """Our TFLOP/s from the flashattn tool: {(d, causal, s): {fwd_tflops, bwd_tflops, ...}}."""
    out = {}
    for d in d_list:
        cmd = [tool, "bench", "--device", "cuda", "--dtype", "bf16", "--tokens", "16384",
               "--hq", str(2048 // d), "-d", str(d), "--sq", ",".join(map(str, s_list)),
               "--causal", "both" if len(causal_list) == 2 else str(causal_list[0]),
               "--mode", ",".join(modes), "--impl", "flash", "--json"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        for line in res.stdout.splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            cell = out.setdefault((d, bool(r["causal"]), r["sq"]), {})
            if r.get("status") != "ok":
                cell["error"] = r.get("status", "?")
                continue
            cell[f"{r['mode']}_tflops"] = round(r["tflops"], 1)
            cell[f"{r['mode']}_ms"] = round(r["ms"], 4)
        if res.returncode != 0:
            print(f"flashattn bench exited {res.returncode}: {res.stderr[-400:]}", flush=True)
    return out


def make_fns(name, q, k, v, causal, dropout_p=0.0):
    """Forward closures. q, k, v are [b, s, h, d] (flashattn's layout); SDPA gets [b, h, s, d]
    views of the same storage, so no implementation pays for a copy. dropout_p: attention
    dropout for ours and SDPA ("flashattn-nodrop": ours without it)."""
    if name in ("flashattn", "flashattn-nodrop"):
        import flashattn
        p = dropout_p if name == "flashattn" else 0.0
        return lambda: flashattn.flash_attn_func(q, k, v, causal=causal, dropout_p=p)
    if name == "fa4":
        from flash_attn.cute import flash_attn_func as fa4_func

        def f4():
            r = fa4_func(q, k, v, causal=causal)
            return r[0] if isinstance(r, tuple) else r
        return f4
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    be = SDPA_BACKENDS[name]
    gqa = kt.shape[1] != qt.shape[1]

    def f():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=dropout_p,
                                                  enable_gqa=gqa).transpose(1, 2)
    return f


def standard_shapes(d_list, s_list, gqa=True):
    """(b, s, hq, hkv, d, causal): b·s = 16k tokens, hidden 2048, then the GQA 64/8 shape."""
    shapes = [(16384 // s, s, 2048 // d, 2048 // d, d, causal)
              for d in d_list for causal in (False, True) for s in s_list]
    if gqa:
        shapes += [(1, 16384, 64, 8, 128, causal) for causal in (False, True)]
    return shapes


def time_impl(name, q, k, v, do, causal, flops, modes, dropout_p):
    """One implementation's fwd / bwd timings on one shape (report.time_fwd_bwd): a cell of
    TFLOP/s and ms, or the backend's refusal as {"error": ...} (an unsupported shape for one
    backend is a result too; a refused backward alone is the cell's "bwd_error")."""
    try:
        return time_fwd_bwd(make_fns(name, q, k, v, causal, dropout_p), (q, k, v), do, flops, modes)
    except Exception as e:  # noqa: BLE001
        return {"error": err_text(e)}


def measure_speed(shapes, impls, modes, ours_cli=None, dropout_p=0.0, rounds=2):
    """Every shape: `rounds` passes over the implementations, the order reversed on every other
    pass (so none always runs first, after the previous shape's last kernel, in the same power
    state), keeping each implementation's faster pass per mode."""
    rows = []
    for b, s, h, hkv, d, causal in shapes:
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True) for _ in range(2))
        do = torch.randn_like(q)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        row = {"d": d, "causal": causal, "s": s, "b": b, "h": h, "hkv": hkv}
        for r in range(rounds):
            for name in pass_order(impls, r):
                if name == "flashattn" and ours_cli is not None and hkv == h:
                    row[name] = ours_cli.get((d, causal, s), {"error": "no result"})
                    continue
                row[name] = best_cell(row.get(name), time_impl(name, q, k, v, do, causal, flops, modes,
                                                               dropout_p))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    return rows


def cli_memory(tool, s):
    """Ours through the tool: measured extra device bytes of causal fwd+bwd at b=1, h=16, d=128
    plus the outputs the tool preallocates (o, dq, dk, dv in bf16 and the fp32 lse)."""
    cmd = [tool, "bench", "--device", "cuda", "--dtype", "bf16", "-b", "1", "--hq", "16", "-d", "128",
           "--sq", str(s), "--causal", "1", "--mode", "fwdbwd", "--impl", "flash", "--json",
           "--repeats", "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("status") == "ok":
                outputs = 4 * s * 16 * 128 * 2 + s * 16 * 4
                return {"s": s, "impl": "flashattn",
                        "extra_MiB": round((r["extra_mem_bytes"] + outputs) / 2**20)}
    return {"s": s, "impl": "flashattn", "error": (res.stderr or "no output")[-160:]}


def measure_memory(seqlens, impls, tool=None):
    """Peak extra memory of causal fwd+bwd above q, k, v, dO (b=1, h=16, d=128, bf16)."""
    out = []
    for s in seqlens:
        for name in impls:
            if name == "flashattn" and tool is not None:
                out.append(cli_memory(tool, s))
                print(json.dumps(out[-1]), flush=True)
                continue
            torch.cuda.empty_cache()
            q, k, v = (torch.randn(1, s, 16, 128, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                o = make_fns(name, q, k, v, True)()
                o.backward(do)
                torch.cuda.synchronize()
                extra = torch.cuda.max_memory_allocated() - base
                out.append({"s": s, "impl": name, "extra_MiB": round(extra / 2**20)})
            except Exception as e:
                out.append({"s": s, "impl": name, "error": str(e).splitlines()[0][:160]})
            print(json.dumps(out[-1]), flush=True)
            del q, k, v, do
            o = None
    return out


def table_cells(c):
    """A cell's fwd and bwd columns: TFLOP/s, "err" for a refusal, "-" for a mode not timed."""
    if "error" in c:
        return ["err", "err"]
    bwd = c.get("bwd_tflops", "err" if "bwd_error" in c else "-")
    return [str(c.get("fwd_tflops", "-")), str(bwd)]


def markdown(res, impls):
    env = res["env"]
    lines = [f"# GPU benchmark {env['date']}", "",
             gpu_line(env) + "bf16; b·s = 16k tokens, hidden 2048 (heads = 2048 / d) unless the heads column says "
             "otherwise. TFLOP/s (FlashAttention convention: fwd 4·b·h·s²·d, halved causal; bwd 2.5× fwd); "
             f"median of triton.testing.do_bench, the faster of {env.get('rounds', 1)} rounds per implementation, "
             "all implementations interleaved shape by shape in one process (the order reversed every other "
             "round). Written by bench/bench_gpu.py.", ""]
    head = "| d | causal | seqlen | heads q/kv | " + " | ".join(f"{n} fwd | {n} bwd" for n in impls) + " |"
    lines += [head, "|" + "---|" * (4 + 2 * len(impls))]
    for r in res["speed"]:
        cells = []
        for n in impls:
            c = r.get(n, {})
            cells += table_cells(c)
        heads = f"{r['h']}/{r.get('hkv', r['h'])}" + (f" (b{r['b']})" if r.get("hkv", r["h"]) != r["h"] else "")
        lines.append(f"| {r['d']} | {int(r['causal'])} | {r['s']} | {heads} | " + " | ".join(cells) + " |")
    if res.get("dropout"):
        dimpls = res["dropout"]["impls"]
        lines += ["", f"Attention dropout p = {res['dropout']['p']}, d = 128, bf16, b·s = 16k "
                  "(flashattn-nodrop: ours without dropout), TFLOP/s:", "",
                  "| causal | seqlen | " + " | ".join(f"{n} fwd | {n} bwd" for n in dimpls) + " |",
                  "|" + "---|" * (2 + 2 * len(dimpls))]
        for r in res["dropout"]["speed"]:
            cells = []
            for n in dimpls:
                c = r.get(n, {})
                cells += table_cells(c)
            lines.append(f"| {int(r['causal'])} | {r['s']} | " + " | ".join(cells) + " |")
    if res["memory"]:
        lines += ["", "Peak extra memory, causal fwd+bwd, b=1, h=16, d=128 (MiB above q, k, v, dO):", "",
                  "| seqlen | impl | extra MiB |", "|---|---|---|"]
        for m in res["memory"]:
            lines.append(f"| {m['s']} | {m['impl']} | {m.get('extra_MiB', 'err')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d=128 only, fewer lengths")
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--impls", default="flashattn,fa4,cudnn,fa2",
                    help="fa4 is dropped (with the reason printed) when flash_attn.cute is not importable")
    ap.add_argument("--no-gqa", action="store_true", help="leave out the b1 64/8-head GQA shape")
    ap.add_argument("--mem-seqlens", default="4096,16384,65536")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--ours", choices=("cli", "python"), default="python")
    ap.add_argument("--tool", default=os.path.join(HERE, "..", "build", "flashattn"))
    ap.add_argument("--rounds", type=int, default=2,
                    help="passes over the implementations per shape, the order reversed every other pass; "
                         "each implementation's faster pass is kept")
    ap.add_argument("--dropout", type=float, default=0.1,
                    help="dropout_p of the dropout table (d128, fwd+bwd); 0 leaves it out")
    a = ap.parse_args()
    d_list = [128] if a.quick else [int(x) for x in a.d.split(",")]
    s_list = [1024, 4096, 16384] if a.quick else [int(x) for x in a.seqlens.split(",")]
    impls = a.impls.split(",")
    drop_fa4_if_missing(impls)
    modes = a.modes.split(",")
    date = datetime.date.today().isoformat()
    res = {"env": {"date": date, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cudnn": torch.backends.cudnn.version(), "impls": impls, "rounds": a.rounds}}
    if "fa4" in impls:
        import importlib.metadata as md
        try:
            res["env"]["fa4"] = md.version("flash-attn-4")
        except Exception:
            res["env"]["fa4"] = "unknown version"
    print(res["env"], flush=True)
    tool = a.tool if a.ours == "cli" else None
    res["env"]["ours_via"] = "flashattn bench (CUDA events)" if tool else "flash_attn_func (torch)"
    ours = cli_rows(tool, d_list, s_list, modes) if tool and "flashattn" in impls else None
    shapes = standard_shapes(d_list, s_list, gqa=not (a.no_gqa or a.quick))
    res["speed"] = measure_speed(shapes, impls, modes, ours, rounds=a.rounds)
    if a.dropout > 0 and "flashattn" in impls:
        dimpls = ["flashattn", "flashattn-nodrop"] + [n for n in impls if n == "fa2"]
        dshapes = standard_shapes([128], s_list, gqa=False)
        res["dropout"] = {"p": a.dropout, "impls": dimpls,
                          "speed": measure_speed(dshapes, dimpls, ["fwd", "bwd"], None, a.dropout,
                                                a.rounds)}
    mem_s = [int(x) for x in a.mem_seqlens.split(",")] if a.mem_seqlens else []
    # Memory of ours always through the tool when it is built: the library's workspace comes from
    # cudaMallocAsync, which torch's allocator statistics do not see.
    mem_tool = a.tool if os.path.exists(a.tool) else None
    res["memory"] = measure_memory(mem_s, impls, mem_tool) if "bwd" in modes else []
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, a.tag)
    md = markdown(res, impls)
    with open(stem + ".md", "w") as fh:
        fh.write(md)
    with open(stem + ".json", "w") as fh:
        json.dump(res, fh, indent=1)
    write_svg([r for r in res["speed"] if r.get("hkv", r["h"]) == r["h"]], impls, stem + ".svg",
              title=f"{res['env']['gpu']}, bf16, b·s = 16k, hidden 2048 ({date})")
    print(md)


if __name__ == "__main__":
    main()
