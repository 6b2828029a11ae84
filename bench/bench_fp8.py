"""Side-by-side fp8 benchmark on a Hopper GPU: flashattn's e4m3 forward and backward against cuDNN's
fp8 SDPA (the cuDNN frontend's `pygraph.sdpa_fp8` / `sdpa_fp8_backward`, when `import cudnn` works)
and flashattn's own bf16 forward and backward, interleaved shape by shape in one process.

Run where PyTorch and an sm_90 GPU are present, from the repository root, after `make`:

    python3 bench/bench_fp8.py [--quick] [--out bench/results] [--d 64,128,256] [--seqlens 1024,...]
                               [--what fwd,bwd]

Shapes: the FlashAttention papers' standard ones, b·s = 16k tokens, hidden 2048 (h = 2048/d),
causal and not. FLOPs: 4·b·h·s²·d, halved when causal, 2.5× for the backward. Timing: triton.testing.do_bench median,
the same for every implementation. Inputs: randn quantised to e4m3 with per-tensor descale 1
(ours takes [batch, heads_kv] factors, cuDNN one scalar each: both read their factors every
call). Ours writes o in bf16; cuDNN on Hopper writes o in fp8 (its bf16 output is Blackwell-only),
which saves it half of the output's bytes.

Also the accuracy of each fp8 output against float64 attention of the dequantised inputs at
one small shape (RMSE), so a fast wrong kernel cannot hide here.

Writes bench/results/fp8.md (forward) and fp8-backward.md, each only for what it measured
(--what), and prints the tables last.
"""
import argparse
import datetime
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
from report import bench_ms  # noqa: E402

E4M3 = torch.float8_e4m3fn


def ours_fp8(q8, k8, v8, causal):
    import flashattn
    return lambda: flashattn.flash_attn_func(q8, k8, v8, causal=causal)


def ours_bf16(q, k, v, causal):
    import flashattn
    return lambda: flashattn.flash_attn_func(q, k, v, causal=causal)


def _cudnn_scalars(g, names):
    """One [1, 1, 1, 1] float32 graph tensor per name (descales, scales, amax outputs)."""
    import cudnn
    return {n: g.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=cudnn.data_type.FLOAT)
            for n in names}


def _cudnn_build(g, device):
    """Validate and plan a graph; returns its workspace."""
    import cudnn
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=device)


def _cudnn_one(device):
    return torch.ones(1, 1, 1, 1, dtype=torch.float32, device=device)


class CudnnFp8:
    """cuDNN's fp8 SDPA forward on [b, s, h, d] tensors (viewed as [b, h, s, d]), o in fp8, every
    descale and scale 1; with stats=True it also writes the softmax stats [b, h, s, 1] (for
    CudnnFp8Backward)."""

    def __init__(self, q8, k8, v8, causal, stats=False):
        import cudnn
        b, s, h, d = q8.shape
        dev = q8.device
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32,
                          handle=self.handle)
        dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)
        tq, tk, tv = (g.tensor(name=n, dim=dims, stride=strides, data_type=e4m3) for n in "qkv")
        scal = _cudnn_scalars(g, ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"))
        o, t_stats, amax_s, amax_o = g.sdpa_fp8(q=tq, k=tk, v=tv, **scal, attn_scale=1.0 / math.sqrt(d),
                                                use_causal_mask=causal, generate_stats=stats)
        o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        self.out = torch.empty(b, s, h, d, dtype=E4M3, device=dev)
        self.pack = {tq: q8, tk: k8, tv: v8, o: self.out, amax_s: _cudnn_one(dev), amax_o: _cudnn_one(dev)}
        self.pack.update({t: _cudnn_one(dev) for t in scal.values()})
        self.stats = None
        if stats:
            t_stats.set_output(True).set_dim((b, h, s, 1)).set_stride((h * s, s, 1, 1)).set_data_type(f32)
            self.stats = torch.empty(b, h, s, 1, dtype=torch.float32, device=dev)
            self.pack[t_stats] = self.stats
        self.ws = _cudnn_build(g, dev)
        self.g = g

    def __call__(self):
        self.g.execute(self.pack, self.ws, handle=self.handle)
        return self.out


class CudnnFp8Backward:
    """cuDNN's fp8 SDPA backward (`pygraph.sdpa_fp8_backward`) on [b, s, h, d] tensors: q, k, v, o,
    dO in e4m3, dQ, dK, dV written in e4m3 (as NVIDIA's sdpa_benchmark_training runs it); o and the
    softmax stats from its own fp8 forward (CudnnFp8, run once), every descale and scale 1."""

    def __init__(self, q8, k8, v8, dout8, causal):
        import cudnn
        b, s, h, d = q8.shape
        dev = q8.device
        fwd = CudnnFp8(q8, k8, v8, causal, stats=True)
        fwd()
        self.handle = fwd.handle
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32,
                          handle=self.handle)
        t = {n: g.tensor(name=n, dim=dims, stride=strides, data_type=e4m3) for n in ("q", "k", "v", "o", "dO")}
        t["stats"] = g.tensor(name="stats", dim=(b, h, s, 1), stride=(h * s, s, 1, 1), data_type=f32)
        sb = _cudnn_scalars(g, ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_s",
                                "descale_dP", "scale_s", "scale_dQ", "scale_dK", "scale_dV", "scale_dP"))
        outs = g.sdpa_fp8_backward(**t, **sb, attn_scale=1.0 / math.sqrt(d), use_causal_mask=causal)
        for x in outs[:3]:
            x.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
        for x in outs[3:]:
            x.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        self.ws = _cudnn_build(g, dev)
        self.grads = [torch.empty(b, s, h, d, dtype=E4M3, device=dev) for _ in range(3)]
        self.pack = {t["q"]: q8, t["k"]: k8, t["v"]: v8, t["o"]: fwd.out, t["dO"]: dout8, t["stats"]: fwd.stats}
        self.pack.update(dict(zip(outs[:3], self.grads)))
        self.pack.update({x: _cudnn_one(dev) for x in list(outs[3:]) + list(sb.values())})
        self.g = g

    def __call__(self):
        self.g.execute(self.pack, self.ws, handle=self.handle)
        return self.grads


def ours_fp8_backward(q8, k8, v8, dout8, causal):
    """Our backward of e4m3 q, k, v with an e4m3 dout (descales 1), from our fp8 forward's out."""
    import flashattn
    out, lse, _ = flashattn.flash_attn_func(q8, k8, v8, causal=causal, return_attn_probs=True)
    ones = torch.ones(q8.shape[0], k8.shape[2], device=q8.device)
    return lambda: flashattn.flash_attn_backward(dout8, q8, k8, v8, out, lse, causal=causal, dout_descale=ones)


def ours_bf16_backward(q, k, v, dout, causal):
    import flashattn
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    return lambda: flashattn.flash_attn_backward(dout, q, k, v, out, lse, causal=causal)


def reference_rmse(device):
    """RMSE of each fp8 output against float64 attention of the dequantised inputs."""
    torch.manual_seed(0)
    b, s, h, d = 2, 1024, 8, 128
    out = {}
    for causal in (False, True):
        q8, k8, v8 = (torch.randn(b, s, h, d, device=device).to(E4M3) for _ in range(3))
        q, k, v = (t.double().transpose(1, 2) for t in (q8, k8, v8))
        sc = q @ k.transpose(-1, -2) / math.sqrt(d)
        if causal:
            sc.masked_fill_(torch.ones(s, s, dtype=torch.bool, device=device).triu(1), float("-inf"))
        ref = (sc.softmax(-1) @ v).transpose(1, 2)
        rows = {"flashattn": ours_fp8(q8, k8, v8, causal)()}
        try:
            rows["cudnn"] = CudnnFp8(q8, k8, v8, causal)()
        except Exception as e:  # noqa: BLE001
            print(f"cudnn fp8 unavailable: {e}", flush=True)
        for name, o in rows.items():
            out[(name, causal)] = (o.double() - ref).pow(2).mean().sqrt().item()
    return out


def time_rows(impls, flops, row):
    """Interleaved: every implementation once per round, best of two rounds kept (TFLOP/s)."""
    for _ in range(2):
        for name, fn in impls.items():
            row[name] = max(row.get(name, 0.0), round(flops / bench_ms(fn) / 1e9, 1))
    print(json.dumps(row), flush=True)
    return row


def table(title, rows, names, ratios):
    lines = [title, "", "| d | causal | seqlen | " + " | ".join(names) + " | " +
             " | ".join(r[0] for r in ratios) + " |", "|---|---|---|" + "---|" * (len(names) + len(ratios))]
    for r in rows:
        cells = [f"{r[n]:.1f}" if n in r else "-" for n in names]
        cells += [f"{r[a] / r[b]:.2f}" if a in r and b in r else "-" for _, a, b in ratios]
        lines.append(f"| {r['d']} | {r['causal']} | {r['s']} | " + " | ".join(cells) + " |")
    return lines


def write_results(out_dir, cudnn_version, fwd_rows, bwd_rows, acc):
    """bench/results/fp8.md (forward) and fp8-backward.md from the rows so far, each only when
    this run measured it (rewritten after every shape, so a run cut short still leaves its
    measurements); returns the text."""
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn_frontend_backend": cudnn_version,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    names = ["flashattn fp8", "cudnn fp8", "flashattn bf16"]
    ratios = [("fp8 / cuDNN", "flashattn fp8", "cudnn fp8"), ("fp8 / bf16", "flashattn fp8", "flashattn bf16")]
    head = (f"GPU: {env['gpu']}; torch {env['torch']}; cuDNN (frontend's backend) {env['cudnn_frontend_backend']}; "
            f"{env['date']}. b·s = 16k tokens, hidden 2048 (heads = 2048 / d); TFLOP/s (forward 4·b·h·s²·d, "
            "halved causal; backward 2.5× that), median of triton.testing.do_bench, implementations interleaved "
            "shape by shape in one process (best of two rounds). Written by bench/bench_fp8.py.")
    texts = []
    if fwd_rows:
        lines = [f"# fp8 e4m3 forward on the GPU {env['date'][:10]}", "", head, ""]
        lines += table("## Forward", fwd_rows, names, ratios)
        lines += ["", "Ours: e4m3 q, k, v, o bf16; cuDNN: e4m3 q, k, v, o e4m3 (its bf16 output is Blackwell-only).", ""]
        if acc:
            lines += ["Accuracy, b 2, s 1024, h 8, d 128, randn inputs quantised to e4m3: RMSE of o against "
                      "float64 attention of the dequantised inputs.", "", "| impl | causal | RMSE |", "|---|---|---|"]
            for (name, causal), e in sorted(acc.items()):
                lines.append(f"| {name} | {int(causal)} | {e:.2e} |")
        texts.append(("fp8.md", "\n".join(lines) + "\n"))
    if bwd_rows:
        lines = [f"# fp8 e4m3 backward on the GPU {env['date'][:10]}", "", head, ""]
        lines += table("## Backward", bwd_rows, names, ratios)
        lines += ["", "Ours: `flash_attn_backward` of e4m3 q, k, v with an e4m3 dout (dout_descale 1), o bf16 from our "
                  "fp8 forward, dq, dk, dv written in bf16; bf16: the same values' backward in bf16. cuDNN "
                  "(`sdpa_fp8_backward`): e4m3 q, k, v, o, dO, dQ, dK, dV written in e4m3. Ours runs the e4m3 "
                  "tensor-core backward for d = 65..128 and the bf16 backward on dequantised copies elsewhere."]
        texts.append(("fp8-backward.md", "\n".join(lines) + "\n"))
    os.makedirs(out_dir, exist_ok=True)
    for name, text in texts:
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
    return "\n".join(t for _, t in texts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--seqlens", default=None)
    ap.add_argument("--what", default="fwd,bwd", help="fwd, bwd or both (fwd,bwd)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    seqlens = [int(x) for x in args.seqlens.split(",")] if args.seqlens else \
        ([2048, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384])
    d_list = [int(x) for x in args.d.split(",")]
    what = set(args.what.split(","))
    try:
        import cudnn
        have_cudnn = True
        cudnn_version = cudnn.backend_version()
    except Exception as e:  # noqa: BLE001
        print(f"cudnn frontend not importable ({e}): ours only", flush=True)
        have_cudnn, cudnn_version = False, None
    fwd_rows, bwd_rows = [], []
    for d in d_list:
        h = 2048 // d
        for causal in (False, True):
            for s in seqlens:
                b = max(1, 16384 // s)
                torch.manual_seed(s + d)
                q, k, v, dout = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
                q8, k8, v8, dout8 = (t.to(E4M3) for t in (q, k, v, dout))
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                key = {"d": d, "causal": int(causal), "s": s, "b": b, "h": h}
                if "fwd" in what:
                    impls = {"flashattn fp8": ours_fp8(q8, k8, v8, causal), "flashattn bf16": ours_bf16(q, k, v, causal)}
                    if have_cudnn:
                        try:
                            impls["cudnn fp8"] = CudnnFp8(q8, k8, v8, causal)
                        except Exception as e:  # noqa: BLE001
                            print(f"cudnn fp8 d{d} s{s} causal {causal}: {e}", flush=True)
                    fwd_rows.append(time_rows(impls, flops, dict(key)))
                if "bwd" in what:
                    impls = {"flashattn fp8": ours_fp8_backward(q8, k8, v8, dout8, causal),
                             "flashattn bf16": ours_bf16_backward(q, k, v, dout, causal)}
                    if have_cudnn:
                        try:
                            impls["cudnn fp8"] = CudnnFp8Backward(q8, k8, v8, dout8, causal)
                        except Exception as e:  # noqa: BLE001
                            print(f"cudnn fp8 backward d{d} s{s} causal {causal}: {str(e)[:200]}", flush=True)
                    bwd_rows.append(time_rows(impls, 2.5 * flops, dict(key)))
                del impls
                torch.cuda.empty_cache()
                write_results(args.out, cudnn_version, fwd_rows, bwd_rows, None)
    acc = reference_rmse(dev) if "fwd" in what else None
    print(write_results(args.out, cudnn_version, fwd_rows, bwd_rows, acc))


if __name__ == "__main__":
    main()
