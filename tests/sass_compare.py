#!/usr/bin/env python3
"""Compares the SASS of every CUDA kernel in two builds of the library (cuobjdump -sass).

    python3 tests/sass_compare.py OLD/libflashattn.a NEW/libflashattn.a [--rename OLD=NEW ...] [--registers]

CUOBJDUMP names the cuobjdump to use (default: the one on PATH, else the toolkit's).
For a change that only moves or renames code, every kernel's instructions must be byte-identical.
Kernels are matched by (architecture, function name); --rename applies a plain substring
replacement to the old build's demangled names first (for renamed identifiers), and the hash in
an anonymous namespace's name (_INTERNAL_<hash>_, which changes with the file's contents) is
ignored. Prints one line per kernel that differs or exists on one side only, then "N identical,
N differ, N only-old, N only-new"; exits 1 if anything differs. --registers: a kernel whose
instructions are the same but for the numbers of their registers, predicates and barriers (the
same opcodes, immediates and branch targets in the same order) counts as "registers only"
(ptxas allocated differently) and not as a difference.
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
    anon = re.compile(r"_INTERNAL_[0-9a-f]+_")
    plain = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                           text=True).stdout.splitlines()
    demangled = dict(zip(names, plain))
    return {(arch, anon.sub("_INTERNAL_", demangled[n])): sass for (arch, n), sass in out.items()}


def anonymous_registers(sass):
    """The instructions without addresses and encodings and with every register (R, UR),
    predicate (P, UP) and barrier (B) number dropped: equal for two register allocations of the
    same instructions in the same order, immediates and branch targets included."""
    out = []
    for line in sass.split("\n"):
        code = re.sub(r"/\*\s*[0-9a-fx]+\s*\*/", "", line)
        out.append(re.sub(r"\b(UR|R|UP|P|B)[0-9]+\b", r"\1", code))
    return out


def main(argv):
    renames = [argv[i + 1].split("=", 1) for i in range(3, len(argv) - 1) if argv[i] == "--rename"]
    registers = "--registers" in argv
    old, new = kernels(argv[1]), kernels(argv[2])

    def rename(name):
        for a, b in renames:
            name = name.replace(a, b)
        return name

    old = {(arch, rename(n)): sass for (arch, n), sass in old.items()}
    same = differ = allocation = 0
    for key in sorted(set(old) | set(new)):
        if key not in new:
            print("only in old:", *key)
        elif key not in old:
            print("only in new:", *key)
        elif old[key] == new[key]:
            same += 1
        elif registers and anonymous_registers(old[key]) == anonymous_registers(new[key]):
            allocation += 1
            print("registers only:", *key)
        else:
            differ += 1
            print("differs:", *key)
    only_old, only_new = len(set(old) - set(new)), len(set(new) - set(old))
    print(f"{same} identical, " + (f"{allocation} registers only, " if registers else "") +
          f"{differ} differ, {only_old} only-old, {only_new} only-new")
    return 1 if differ or only_old or only_new else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
