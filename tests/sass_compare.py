#!/usr/bin/env python3
"""Compares the SASS of every CUDA kernel in two builds of the library (cuobjdump -sass).

    python3 tests/sass_compare.py OLD/libflashattn.a NEW/libflashattn.a [--rename OLD=NEW ...]

CUOBJDUMP names the cuobjdump to use (default: the one on PATH, else the toolkit's).
For a change that only moves or renames code, every kernel's instructions must be byte-identical.
Kernels are matched by (architecture, function name); --rename applies a plain substring
replacement to the old build's demangled names first (for renamed identifiers). Prints one line per kernel
that differs or exists on one side only, then "N identical, N differ, N only-old, N only-new";
exits 1 if anything differs.
"""
import os
import re
import shutil
import subprocess
import sys


def kernels(path):
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    text = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True, text=True).stdout
    out, arch, key, body = {}, "?", None, []
    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if key:
                out[key] = "\n".join(body)
            key, body = (arch, m.group(1)), []
            continue
        if key and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            body.append(" ".join(line.split()))  # column widths follow the name lengths
    if key:
        out[key] = "\n".join(body)
    names = sorted({n for _, n in out})
    plain = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                           text=True).stdout.splitlines()
    demangled = dict(zip(names, plain))
    return {(arch, demangled[n]): sass for (arch, n), sass in out.items()}


def main(argv):
    renames = [argv[i + 1].split("=", 1) for i in range(3, len(argv) - 1) if argv[i] == "--rename"]
    old, new = kernels(argv[1]), kernels(argv[2])

    def rename(name):
        for a, b in renames:
            name = name.replace(a, b)
        return name

    old = {(arch, rename(n)): sass for (arch, n), sass in old.items()}
    same = differ = 0
    for key in sorted(set(old) | set(new)):
        if key not in new:
            print("only in old:", *key)
        elif key not in old:
            print("only in new:", *key)
        elif old[key] == new[key]:
            same += 1
        else:
            differ += 1
            print("differs:", *key)
    only_old, only_new = len(set(old) - set(new)), len(set(new) - set(old))
    print(f"{same} identical, {differ} differ, {only_old} only-old, {only_new} only-new")
    return 1 if differ or only_old or only_new else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
