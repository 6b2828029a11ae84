"""bench/bench_decode.py: decode attention on the GPU, flashattn next to PyTorch SDPA, and
flashattn's quantised KV caches next to bf16 ones.

Times, on the standard decode shapes (one query token, 32 query / 8 kv heads, d = 128, bf16;
batch x context 1 x 8k, 32 x 8k, 8 x 64k, 128 x 2k):
  - flashattn.flash_attn_with_kvcache on a contiguous cache (through the Python package),
  - torch SDPA with the FLASH_ATTENTION and CUDNN_ATTENTION backends (enable_gqa=True) on the
    same values in SDPA's (batch, heads, seq, dim) layout,
each call between CUDA events after a 256 MiB write that evicts the L2, median of the timed calls.
With --cli BIN (the `flashattn` tool of the build) it also runs `flashattn bench --mode decode`
on every standard shape for GQA 32/8 and 64/8, 1 query token (contiguous and page-16 caches)
and 4 (contiguous), in bf16 and as int8 and fp8 e4m3 caches (plus d 64 and 256 at 32 x 8k), and
reports each quantised cache's tokens/s against the bf16 cache of the same shape (the target: an
8-bit cache reads half the bytes, so ~2x). Effective bandwidth = K and V bytes read / time (for
a quantised cache its own bytes: 8-bit values plus the int8 per-token or Q8_0 block scales);
tokens/s = query tokens decoded per second. Results of an earlier `flashattn bench --mode decode
--json` run can be merged instead with --cli-json. Prints a markdown table last and writes
<out>/decode.{md,json} (default bench/results/).

With --mla (needs --cli) it also times DeepSeek-style MLA decoding through the tool: one latent
kv head (v = the first 512 columns of the 576-dim k cache, each row read once), 128 query heads,
1 and 2 query tokens, batch 32 and 128, contexts 4k-32k, pages of 64 tokens, bf16, reported as
GB/s (latent cache bytes read / median time) and TFLOP/s (2 · heads · (576 + 512) · keys seen
per query token / median time), in <out>/decode-mla.{md,json}: the kernel the library picks (on
sm_90 the wgmma latent-cache kernel) next to the mma.sync one (FA_CUDA_KVCACHE=portable), the two
alternated per query-token count for two rounds, the faster round of each kept. --mla-only runs
just that (no torch needed); --mla-quick keeps contexts 4k and 32k.

  PYTHONPATH=python FLASHATTN_LIB=build/libflashattn.so \
      python bench/bench_decode.py --cli build/flashattn
  python3 bench/bench_decode.py --cli build/flashattn --mla-only --out /tmp/mla
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess

SHAPES = [(1, 8192), (32, 8192), (8, 65536), (128, 2048)]
HQ, HKV, D = 32, 8, 128
KV_LABELS = {"same": "bf16", "int8": "int8", "q8_0": "q8_0", "fp8": "fp8 e4m3"}
MLA_BATCHES, MLA_CONTEXTS, MLA_QUICK_CONTEXTS = (32, 128), (4096, 8192, 16384, 32768), (4096, 32768)
MLA_HQ, MLA_D, MLA_DV, MLA_PAGE = 128, 576, 512, 64


def mla_runs(cli, quick):
    """The tool's MLA decode runs (latent cache, page 64), one per query-token count."""
    contexts = MLA_QUICK_CONTEXTS if quick else MLA_CONTEXTS
    return [[cli, "bench", "--mode", "decode", "--device", "cuda", "--json", "--hq", str(MLA_HQ), "--hkv", "1",
             "-d", str(MLA_D), "--dv", str(MLA_DV), "--latent", "1", "--sq", str(sq), "--page-size", str(MLA_PAGE),
             "-b", ",".join(map(str, MLA_BATCHES)), "--cache-len", ",".join(map(str, contexts))]
            for sq in (1, 2)]


def run_cli(argvs, env=None):
    """Run the tool once per argument list (with `env` added to the environment); its output lines."""
    lines = []
    for argv in argvs:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, **env) if env else None)
        if done.returncode != 0:
            print("%s: exit %d: %s" % (" ".join(argv), done.returncode, done.stderr.strip()[-400:]), flush=True)
        print(done.stdout, end="", flush=True)
        lines += done.stdout.splitlines()
    return lines


def gpu_name():
    """The first GPU's name from nvidia-smi (the MLA-only run needs no torch), or "unknown GPU"."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


MLA_KERNELS = (("default", None), ("mma.sync", {"FA_CUDA_KVCACHE": "portable"}))


def mla_measure(cli, quick, rounds=2):
    """The MLA runs with each kernel of MLA_KERNELS, alternated per run, `rounds` times: the tool's
    JSON rows, each tagged with its kernel ("kernel")."""
    rows = []
    for _ in range(rounds):
        for argv in mla_runs(cli, quick):
            for name, env in MLA_KERNELS:
                for line in run_cli([argv], env):
                    if line.strip().startswith("{"):
                        rows.append(dict(json.loads(line), kernel=name))
    return rows


def mla_report(rows, out, machine=None, date=None):
    """The fastest round of each MLA case and kernel as a markdown table, the library's kernel next
    to the mma.sync one; written to <out>/decode-mla.*."""
    copy_gbps = next((r["copy_GBps"] for r in rows if r.get("copy_GBps")), None)
    best = {}
    for r in rows:
        key = (r["kernel"], r["sq"], r["b"], r["cache_len"])
        if r.get("status") != "ok" or key not in best or best[key].get("status") != "ok" or r["ms"] < best[key]["ms"]:
            best[key] = r
    machine = machine or gpu_name()
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = ["# MLA decode (latent cache, d %d / dv %d, hq %d, hkv 1, page %d, bf16)" % (MLA_D, MLA_DV, MLA_HQ, MLA_PAGE),
            "",
            "GPU: %s; flashattn's `flashattn bench --mode decode --latent`: the kernel the library picks (on "
            "sm_90 the wgmma latent-cache kernel) and, last two columns, the mma.sync large-head kernel "
            "(FA_CUDA_KVCACHE=portable), alternated; %s. Written by bench/bench_decode.py --mla." % (machine, date),
            "",
            "GB/s = latent cache bytes read (each row once) / median time (inputs rotated or larger than "
            "twice the L2); TFLOP/s = 2 · hq · (d + dv) · keys seen per query token / median time; the "
            "faster of two rounds%s." % (
                "; device copy bandwidth (read + write) %.0f GB/s" % copy_gbps if copy_gbps else ""),
            "",
            "| batch x ctx | sq | splits | ms | GB/s | % of copy | TFLOP/s | tok/s | mma.sync ms | speed-up | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(k for k in best if k[0] == "default"):
        r, m = best[key], best.get(("mma.sync",) + key[1:])
        ok, m_ok = r.get("status") == "ok", m is not None and m.get("status") == "ok"
        text.append("| %d x %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["b"], r["cache_len"], r["sq"], r["splits"] or "auto",
            "%.4f" % r["ms"] if ok else "-", "%.0f" % r["GBps"] if ok else "-",
            "%.0f%%" % (100 * r["GBps"] / copy_gbps) if ok and copy_gbps else "-",
            "%.1f" % r["TFLOPs"] if ok else "-", "%.0f" % r["tokens_per_s"] if ok else "-",
            "%.4f" % m["ms"] if m_ok else "-", "%.2fx" % (m["ms"] / r["ms"]) if ok and m_ok else "-",
            "" if ok else r.get("note", "failed")))
    body = "\n".join(text) + "\n"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "decode-mla.md"), "w") as f:
        f.write(body)
    with open(os.path.join(out, "decode-mla.json"), "w") as f:
        json.dump({"copy_GBps": copy_gbps, "rows": rows}, f, indent=1)
    print()
    print(body)
    return all(r.get("status") == "ok" for r in best.values()) and bool(best)


def cli_runs(cli):
    """The flashattn tool's decode runs: (arguments, description) per run, one JSON object per case."""
    base = [cli, "bench", "--mode", "decode", "--device", "cuda", "--hkv", str(HKV), "--json"]
    runs = []
    for batch, ctx in SHAPES:
        for sq, pages in ((1, "0,16"), (4, "0")):
            runs.append(base + ["-b", str(batch), "--cache-len", str(ctx), "--hq", "32,64", "-d", str(D),
                                "--sq", str(sq), "--page-size", pages, "--kv-dtype", "same,int8,fp8"])
    runs.append(base + ["-b", "32", "--cache-len", "8192", "--hq", "32", "-d", "64,256", "--sq", "1",
                        "--page-size", "0", "--kv-dtype", "same,int8,fp8"])
    return runs


def cli_rows(lines):
    """Table rows from the tool's JSON lines, and the copy bandwidth it measured."""
    rows, copy_gbps = [], None
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        copy_gbps = r.get("copy_GBps") or copy_gbps
        layout = "contiguous" if r["page_size"] == 0 else "page %d" % r["page_size"]
        kv = r.get("kv_dtype", "same")
        row = {"impl": "flashattn (CLI, %s, %s cache)" % (layout, KV_LABELS.get(kv, kv)), "kv": kv,
               "b": r["b"], "ctx": r["cache_len"], "hq": r.get("hq", HQ), "sq": r.get("sq", 1), "d": r.get("d", D),
               "page_size": r["page_size"], "kv_bytes": r["kv_bytes"],
               "ms": r.get("ms"), "GBps": r.get("GBps"), "tokens_per_s": r.get("tokens_per_s")}
        if r.get("status") != "ok":
            row["error"] = r.get("note", "failed")
        rows.append(row)
    return rows, copy_gbps


def time_ms(fn, flush, calls):
    import torch
    start = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for _ in range(3):
        fn()
    for i in range(calls):
        flush.zero_()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--cli-json", default=None)
    ap.add_argument("--cli", default=None, help="the flashattn tool: also run its decode benchmark")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--mla", action="store_true", help="also the MLA decode cases (needs --cli)")
    ap.add_argument("--mla-only", action="store_true", help="only the MLA decode cases (needs --cli; no torch)")
    ap.add_argument("--mla-quick", action="store_true", help="MLA contexts 4k and 32k only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if (args.mla or args.mla_only) and not args.cli:
        ap.error("--mla / --mla-only need --cli (the flashattn tool)")
    if args.mla_only:
        return 0 if mla_report(mla_measure(args.cli, args.mla_quick), args.out) else 1
    import torch
    import torch.nn.functional as F
    import flashattn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for batch, ctx in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.bfloat16) + 0.5
        kv_bytes = 2 * batch * ctx * HKV * D * 2
        seqlens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        impls = {"flashattn (python, contiguous)": lambda: flashattn.flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=seqlens, causal=True)}
        qs, ks, vs = q.transpose(1, 2).contiguous(), kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
        for name, backend in (("sdpa FLASH_ATTENTION", SDPBackend.FLASH_ATTENTION),
                              ("sdpa CUDNN_ATTENTION", SDPBackend.CUDNN_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
            impls[name] = run
        reference = None
        for name, fn in impls.items():
            row = {"impl": name, "b": batch, "ctx": ctx, "page_size": 0, "kv_bytes": kv_bytes}
            try:
                out = fn()
                out = out if name.startswith("flashattn") else out.transpose(1, 2)
                if reference is None:
                    reference = out.float()
                row["max_diff_vs_first"] = float((out.float() - reference).abs().max())
                row["ms"] = time_ms(fn, flush, args.calls)
                row["GBps"] = kv_bytes / (row["ms"] * 1e-3) * 1e-9
                row["tokens_per_s"] = batch / (row["ms"] * 1e-3)
            except Exception as err:  # a backend that refuses the shape or enable_gqa
                row["error"] = "%s: %s" % (type(err).__name__, str(err).splitlines()[0][:160])
            rows.append(row)
            print(json.dumps(row), flush=True)

    copy_gbps = None
    lines = []
    if args.cli_json and os.path.exists(args.cli_json):
        with open(args.cli_json) as f:
            lines += f.readlines()
    if args.cli:
        lines += run_cli(cli_runs(args.cli))
    found, copy_gbps = cli_rows(lines)
    rows += found
    # tokens/s of a quantised cache against the bf16 cache of the same shape and layout
    bf16 = {(r["b"], r["ctx"], r["hq"], r["sq"], r["d"], r["page_size"]): r for r in found if r["kv"] == "same"}
    for r in found:
        ref = bf16.get((r["b"], r["ctx"], r["hq"], r["sq"], r["d"], r["page_size"]))
        if r["kv"] != "same" and ref and r.get("tokens_per_s") and ref.get("tokens_per_s"):
            r["vs_bf16"] = r["tokens_per_s"] / ref["tokens_per_s"]

    for r in rows:
        r.setdefault("hq", HQ), r.setdefault("sq", 1), r.setdefault("d", D)
    rows.sort(key=lambda r: (SHAPES.index((r["b"], r["ctx"])) if (r["b"], r["ctx"]) in SHAPES else 99, r["hq"], r["sq"],
                             r["d"], r["impl"]))
    lines = ["# Decode attention on %s (bf16 queries, hkv 8)" % torch.cuda.get_device_name(),
             "",
             "torch %s, CUDA %s, %s." % (torch.__version__, torch.version.cuda,
                                         datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")),
             "GB/s = bytes of the K and V cache / median time (L2 flushed or inputs rotated between calls; a "
             "quantised cache counts its own bytes, 8-bit values and scales); tok/s = query tokens decoded per "
             "second; vs bf16 = tok/s against the bf16 cache of the same shape and layout%s." % (
                 "; device copy bandwidth (read + write) %.0f GB/s" % copy_gbps if copy_gbps else ""),
             "",
             "| batch x ctx | hq | sq | d | implementation | ms | tok/s | GB/s | % of copy | vs bf16 | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = "%.4f" % r["ms"] if r.get("ms") else "-"
        gbps = "%.0f" % r["GBps"] if r.get("GBps") else "-"
        frac = "%.0f%%" % (100 * r["GBps"] / copy_gbps) if r.get("GBps") and copy_gbps else "-"
        tps = "%.0f" % r["tokens_per_s"] if r.get("tokens_per_s") else "-"
        ratio = "%.2fx" % r["vs_bf16"] if r.get("vs_bf16") else "-"
        note = r.get("error", "")
        if "max_diff_vs_first" in r and r["max_diff_vs_first"] > 0:
            note = (note + " max|diff| vs flashattn %.1e" % r["max_diff_vs_first"]).strip()
        lines.append("| %d x %d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r["b"], r["ctx"], r["hq"], r["sq"], r["d"], r["impl"], ms, tps, gbps, frac, ratio, note))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "decode.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "decode.json"), "w") as f:
        json.dump({"copy_GBps": copy_gbps, "rows": rows}, f, indent=1)
    print()
    print(text)
    if args.mla:
        mla_report(mla_measure(args.cli, args.mla_quick), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
