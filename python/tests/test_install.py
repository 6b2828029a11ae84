"""Finding the library (package dir, then $FLASHATTN_LIB, then the repository's build/), the
message when it cannot be found, and `pip install ./python` shipping the library."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import flashattn

PACKAGE_DIR = os.path.dirname(os.path.abspath(flashattn.__file__))
PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REPO_ROOT = os.path.join(PYTHON_DIR, "..")


def copy_package(dest):
    """A copy of the pure-Python package (no shared library) under dest/pkg/flashattn."""
    target = os.path.join(dest, "pkg", "flashattn")
    shutil.copytree(PACKAGE_DIR, target,
                    ignore=shutil.ignore_patterns("lib", "*.so", "*.dylib", "__pycache__"))
    return os.path.join(dest, "pkg")


def run_python(code, cwd, env_extra):
    env = {k: v for k, v in os.environ.items() if k != "FLASHATTN_LIB"}
    env.update(env_extra)
    env["FLASHATTN_NO_TORCH"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_versions_agree():
    """The package, the loaded library and include/flashattn.h (the version's one source, which
    setup.py, the Makefile's soname and the pkg-config / CMake files read) say the same."""
    header = os.path.join(REPO_ROOT, "include", "flashattn.h")
    assert flashattn.__version__ == flashattn.library_version()
    if os.path.isfile(header):
        with open(header) as f:
            text = f.read()
        parts = [re.search(r"^#define FA_VERSION_%s\s+(\d+)" % name, text, re.M).group(1)
                 for name in ("MAJOR", "MINOR", "PATCH")]
        assert flashattn.__version__ == ".".join(parts)


def test_missing_library_gives_clear_import_error(tmp_path):
    pkg = copy_package(str(tmp_path))
    result = run_python("import flashattn", pkg, {"FLASHATTN_LIB": str(tmp_path / "nope.so")})
    assert result.returncode != 0
    assert "ImportError: flashattn: cannot load libflashattn.so" in result.stderr
    assert "FLASHATTN_LIB: %s (not found)" % (tmp_path / "nope.so") in result.stderr
    assert "pip install ./python" in result.stderr


def test_search_order(tmp_path):
    pkg = copy_package(str(tmp_path))
    real = flashattn.library_path
    show = "import flashattn; print(flashattn.library_path)"
    # 3. the repository's build/ next to python/
    build = tmp_path / "build"
    build.mkdir()
    shutil.copy(real, build / "libflashattn.so")
    out = run_python(show, pkg, {})
    assert out.stdout.strip() == str(build / "libflashattn.so"), out.stderr
    # 2. $FLASHATTN_LIB (a file or a directory) wins over build/
    env_dir = tmp_path / "envlib"
    env_dir.mkdir()
    shutil.copy(real, env_dir / "libflashattn.so")
    out = run_python(show, pkg, {"FLASHATTN_LIB": str(env_dir)})
    assert out.stdout.strip() == str(env_dir / "libflashattn.so"), out.stderr
    # 1. the package's own lib/ wins over both
    lib_dir = tmp_path / "pkg" / "flashattn" / "lib"
    lib_dir.mkdir()
    shutil.copy(real, lib_dir / "libflashattn.so")
    out = run_python(show, pkg, {"FLASHATTN_LIB": str(env_dir)})
    assert out.stdout.strip() == str(lib_dir / "libflashattn.so"), out.stderr


def _have_build_tools():
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError:
        return False
    return shutil.which("make") is not None and os.path.isfile(
        os.path.join(REPO_ROOT, "include", "flashattn.h"))


@pytest.mark.skipif(not _have_build_tools(), reason="needs make, setuptools, wheel and the sources")
def test_pip_install_ships_the_library(tmp_path):
    # Build from a copy of python/ so the source tree gets no build/ or flashattn/lib/.
    source = tmp_path / "python"
    shutil.copytree(PYTHON_DIR, source, ignore=shutil.ignore_patterns(
        "build", "lib", "*.egg-info", "__pycache__", "tests", "examples"))
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
           "--target", str(target), str(source)]
    env = dict(os.environ)
    env["FLASHATTN_SOURCE_DIR"] = os.path.abspath(REPO_ROOT)
    env.setdefault("FA_NO_CUDA", "1")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = run_python("""
        import numpy as np, flashattn
        q = np.ones((1, 3, 2, 8), np.float32)
        print(flashattn.library_path)
        print(flashattn.flash_attn_func(q, q, q).sum())
    """, str(target), {})
    assert out.returncode == 0, out.stderr
    path, total = out.stdout.split()
    assert path == str(target / "flashattn" / "lib" / "libflashattn.so")
    assert float(total) == pytest.approx(48.0)
