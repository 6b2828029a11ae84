"""The ctypes mirror of fa_params matches include/flashattn.h: field names in order (parsed from
the header), and every offset and size as the system C compiler lays them out; enum values too."""

import os
import re
import shutil
import subprocess

import pytest

from flashattn import _lib

HEADER = os.environ.get("FLASHATTN_HEADER") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "flashattn.h")

needs_header = pytest.mark.skipif(not os.path.isfile(HEADER),
                                  reason="include/flashattn.h not found")


def header_text():
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_fields():
    body = re.search(r"typedef\s+struct\s+fa_params\s*\{(.*?)\}\s*fa_params\s*;", header_text(),
                     re.S).group(1)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        parts = decl.split(",")
        names.append(re.findall(r"[A-Za-z_]\w*", parts[0])[-1])
        for part in parts[1:]:
            names.append(re.findall(r"[A-Za-z_]\w*", part)[-1])
    return names


@needs_header
def test_field_names_and_order_match_header():
    ours = [name for name, _ in _lib.FaParams._fields_]
    assert ours == header_fields()


@needs_header
def test_enum_values_match_header():
    values = dict(re.findall(r"\b(FA_(?:ERR|DTYPE|DEVICE)_\w+|FA_OK)\s*=\s*(\d+)", header_text()))
    assert values, "no enum values parsed"
    for name, value in values.items():
        if name.endswith("_"):
            continue
        assert getattr(_lib, name) == int(value), name
    statuses = {n for n in values if n.startswith(("FA_ERR", "FA_OK")) and not n.endswith("_")}
    assert set(_lib.STATUS_NAMES.values()) == statuses


@needs_header
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
def test_offsets_and_sizes_match_c_compiler(tmp_path):
    fields = header_fields()
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "flashattn.h"',
             "int main(void) {", '    printf("sizeof %zu\\n", sizeof(fa_params));']
    for name in fields:
        lines.append('    printf("%s %%zu %%zu\\n", offsetof(fa_params, %s), '
                     'sizeof(((fa_params *)0)->%s));' % (name, name, name))
    lines += ["    return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.check_call(["cc", "-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o",
                           str(exe)])
    report = subprocess.check_output([str(exe)], text=True).split("\n")
    size_line, field_lines = report[0], [line for line in report[1:] if line]
    assert int(size_line.split()[1]) == _lib.ctypes.sizeof(_lib.FaParams)
    for line in field_lines:
        name, offset, size = line.split()
        descriptor = getattr(_lib.FaParams, name)
        assert (descriptor.offset, descriptor.size) == (int(offset), int(size)), name
