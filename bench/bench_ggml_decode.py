"""bench/bench_ggml_decode.py: CPU decode attention, flashattn against ggml's CPU FLASH_ATTN_EXT,
side by side in one process on the same cache bytes (bench/ggml_decode.c), next to the memcpy
bandwidth of the same run. Writes <out>/cpu-ggml.md.

Shapes: one query token, 32 query / 8 kv heads, d = 128, batch x context 1 x 16384 and 8 x 4096,
2 threads for both libraries, the cache token-major as llama.cpp stores it ([ctx, heads_kv, d] per
sequence) and head-major ([heads_kv, ctx, d], the layout test-backend-ops times). Caches: f16 (both), Q8_0 (both, the same bytes), and our int8
(one fp32 scale per token and head) against ggml's 8-bit cache type Q8_0.

Needs a ggml source tree (github.com/ggml-org/ggml, or llama.cpp, whose ggml/ is used); it builds
ggml's CPU backend (cmake, Release, native ISA, no BLAS, no GPU backend), our CPU library, and the
timing program, then runs the configurations in rounds, interleaved:

  python3 bench/bench_ggml_decode.py --ggml-dir ~/src/ggml            (or GGML_DIR=~/src/ggml)

Not part of `make test`.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from report import machine_and_compiler, write_result  # noqa: E402

SHAPES = [(1, 16384), (8, 4096)]
CACHES = ["f16", "q8_0", "int8"]
LAYOUTS = ["token", "head"]  # llama.cpp's cache [ctx, heads_kv, d] per sequence; [heads_kv, ctx, d]


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def ggml_source(path):
    """The directory holding ggml's CMakeLists.txt and include/ (llama.cpp keeps it in ggml/)."""
    for d in (os.path.join(path, "ggml"), path):
        if os.path.isfile(os.path.join(d, "include", "ggml.h")) and os.path.isfile(os.path.join(d, "CMakeLists.txt")):
            return d
    sys.exit(f"--ggml-dir {path}: no ggml source tree there (include/ggml.h and CMakeLists.txt, or ggml/...)")


def build(args):
    src = ggml_source(args.ggml_dir)
    gbuild = os.path.abspath(args.ggml_build)
    sh(["cmake", "-S", src, "-B", gbuild, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF",
        "-DGGML_BLAS=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DBUILD_SHARED_LIBS=OFF"], stdout=subprocess.DEVNULL)
    sh(["cmake", "--build", gbuild, f"-j{args.jobs}", "--target", "ggml-base", "ggml-cpu"], stdout=subprocess.DEVNULL)
    sh(["make", "-C", ROOT, f"-j{args.jobs}", "FA_NO_CUDA=1", f"BUILD={args.fa_build}",
        f"{args.fa_build}/libflashattn.a"], stdout=subprocess.DEVNULL)
    libs = {}
    for dirpath, _, files in os.walk(gbuild):
        for f in files:
            if f in ("libggml-cpu.a", "libggml-base.a"):
                libs[f] = os.path.join(dirpath, f)
    if len(libs) != 2:
        sys.exit(f"{gbuild}: libggml-cpu.a / libggml-base.a not found")
    exe = os.path.join(gbuild, "ggml_decode")
    cc = os.environ.get("CC", "cc")
    sh([cc, "-std=c11", "-O2", "-D_GNU_SOURCE", "-o", exe, os.path.join(ROOT, "bench", "ggml_decode.c"),
        "-I", os.path.join(ROOT, "include"), "-I", os.path.join(src, "include"),
        os.path.join(ROOT, args.fa_build, "libflashattn.a"), libs["libggml-cpu.a"], libs["libggml-base.a"],
        "-fopenmp", "-lstdc++", "-lm", "-pthread"])
    return src, exe


def ggml_version(src):
    commit = subprocess.run(["git", "-C", src, "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    text = commit.stdout.strip() if commit.returncode == 0 else os.environ.get("GGML_COMMIT", "commit unknown")
    version = "?"
    try:
        with open(os.path.join(src, "CMakeLists.txt")) as f:
            parts = {}
            for line in f:
                for key in ("MAJOR", "MINOR", "PATCH"):
                    tag = f"set(GGML_VERSION_{key} "
                    if line.strip().startswith(tag):
                        parts[key] = line.strip()[len(tag):].rstrip(")").strip()
            if len(parts) == 3:
                version = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    except OSError:
        pass
    return f"ggml {version} ({text})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml-dir", default=os.environ.get("GGML_DIR"), help="ggml or llama.cpp source tree")
    ap.add_argument("--ggml-build", default=os.path.join(ROOT, "build-ggml"))
    ap.add_argument("--fa-build", default="build-cpu")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="processes per configuration, interleaved")
    ap.add_argument("--inner-rounds", type=int, default=3, help="copy + calls rounds inside a process")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    if not args.ggml_dir:
        sys.exit("give a ggml (or llama.cpp) source tree: --ggml-dir DIR or GGML_DIR=DIR")
    src, exe = build(args)

    # ggml's OpenMP workers would spin between its calls, on the cores ours runs on (and slow ggml's
    # own next call: 55 against 35 ms at 1 x 7680, 64/8 heads, d 64, where test-backend-ops gives 41)
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    load_before = os.getloadavg()[0]
    samples = {}
    for _ in range(args.rounds):
        for layout in LAYOUTS:
            for batch, ctx in SHAPES:
                for cache in CACHES:
                    out = subprocess.run([exe, "--layout", layout, "--cache", cache, "--batch", str(batch), "--ctx", str(ctx),
                                          "--threads", str(args.threads), "--rounds", str(args.inner_rounds),
                                          "--repeats", str(args.repeats)], env=env, check=True, capture_output=True,
                                         text=True).stdout
                    r = json.loads(out.strip().splitlines()[-1])
                    print(json.dumps(r), file=sys.stderr, flush=True)
                    samples.setdefault((layout, batch, ctx, cache), []).append(r)
    load_after = os.getloadavg()[0]

    fa_version = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %cs"], capture_output=True, text=True).stdout.strip()
    isa = samples[(LAYOUTS[0], SHAPES[0][0], SHAPES[0][1], CACHES[0])][0]["isa"]
    lines = [
        f"# CPU decode attention against ggml ({args.threads} threads; 1 query token, hq 32, hkv 8, d 128)",
        "",
        f"{machine_and_compiler()}"
        f"flashattn {fa_version} (CPU SIMD level {isa}); {ggml_version(src)}, CPU backend built Release, "
        f"GGML_NATIVE=ON, no BLAS, OpenMP (OMP_WAIT_POLICY=passive). Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
        f"Load average {load_before:.1f} before, {load_after:.1f} after (the machine was shared).",
        "",
        "Both libraries in one process (`bench/ggml_decode.c`), on the same cache: token-major "
        "[batch, ctx, heads_kv, d] as llama.cpp stores it, ggml reading it through the view llama.cpp builds (one "
        "stream per sequence), or head-major [batch, heads_kv, ctx, d] as test-backend-ops lays it out "
        "(`ggml_flash_attn_ext`, no mask, scale 1/sqrt(d), GGML_PREC_F32), "
        "flashattn through `fa_kvcache_forward` (f16 queries and output; ggml takes the same query values in f32). "
        "f16 and Q8_0 rows: both read the same bytes; int8 rows: ours is int8 with an fp32 scale per token and head, "
        "ggml's is its 8-bit cache type Q8_0.",
        "",
        "GB/s = K+V bytes a call reads (scales included) / median call time; copy GB/s = (read + written) / time of "
        "a 512 MiB memcpy on the same threads, between the calls of the same process. Each of "
        f"{args.rounds} processes per row runs {args.inner_rounds} rounds of [copy, {args.repeats} calls of one "
        f"library, {args.repeats} of the other (order alternating)]; ms are medians over all calls, ggml / ours is "
        "the median of per-round ratios. Error: largest |output - float64 attention over the library's own "
        "cache| on 3 heads of the first and last sequence; diff: largest |ours - ggml| over every output element. "
        "ggml's f16 kernel keeps its output accumulator in f16, hence its larger error on f16 rows.",
        "",
        "| layout | batch x ctx | cache ours / ggml | ours ms | ours GB/s | ours of copy | ggml ms | ggml GB/s | ggml of copy | ggml / ours time | copy GB/s | error ours / ggml | diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for layout, batch, ctx, cache in [(l, b, c, k) for l in LAYOUTS for b, c in SHAPES for k in CACHES]:
        rs = samples[(layout, batch, ctx, cache)]
        med = lambda key: statistics.median(r[key] for r in rs)
        ours_share = statistics.median(r["ours_GBps"] / r["copy_GBps"] for r in rs)
        ggml_share = statistics.median(r["ggml_GBps"] / r["copy_GBps"] for r in rs)
        diffs = [r["max_diff"] for r in rs if r["max_diff"] is not None]
        diff = f"{max(diffs):.1e}" if diffs else "—"
        lines.append(
            f"| {layout} | {batch} x {ctx} | {cache} / {rs[0]['ggml_type']} | {med('ours_ms'):.2f} | {med('ours_GBps'):.2f} | "
            f"{100 * ours_share:.0f}% | {med('ggml_ms'):.2f} | {med('ggml_GBps'):.2f} | {100 * ggml_share:.0f}% | "
            f"{med('speedup'):.2f}x | {med('copy_GBps'):.2f} | {max(r['err_ours'] for r in rs):.1e} / "
            f"{max(r['err_ggml'] for r in rs):.1e} | {diff} |")
    write_result(args.out, "cpu-ggml.md", lines)


if __name__ == "__main__":
    main()
