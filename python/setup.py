"""Builds libflashattn with the repository's Makefile and ships it inside the package.

    pip install ./python                    # from source; CUDA kernels when nvcc is found and
                                            # nvidia-smi lists a GPU
    pip wheel ./python                      # a wheel carrying the library (CPU engine)
    FLASHATTN_CUDA=1 pip wheel ./python     # ... with the CUDA kernels (sm80, sm90, sm90a)
    pip install -e ./python                 # editable: the library lands in python/flashattn/lib/
                                            # (rerun after rebuilding the C library)

The library is loaded with ctypes: no Python or torch ABI is involved, so the wheel is tagged
py3-none-<platform> and serves every Python 3 and torch version. On x86-64 Linux it is built with
glibc 2.17-era symbol versions (PORTABLE_GLIBC=1) and tagged manylinux_2_<N> from the newest
glibc version it needs; CUDA builds link the CUDA runtime statically (CUDART=static), so only the
NVIDIA driver is needed at run time, not a particular libcudart.

Environment:
  FLASHATTN_CUDA       1: build the CUDA kernels (fails without nvcc); 0: CPU only; unset: CUDA
                       when nvcc is found and a GPU is present (FA_NO_CUDA=1 also means CPU only)
  FLASHATTN_BUILD_DIR  make's BUILD directory, relative to the repository root (default
                       build-python-cpu or build-python-cuda)
  FLASHATTN_SOURCE_DIR the repository root, when python/ was copied away from it
  V=1                  show ptxas register-spill warnings (hidden in this build)
  and what the Makefile reads (CUDA_ARCHS, CC, NVCC, CUDART, ...).
The build writes nothing under python/ except, for an editable install, flashattn/lib/: the
setuptools build and egg-info directories live in a temporary directory.
"""

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY_FILE = "libflashattn.dylib" if sys.platform == "darwin" else "libflashattn.so"
LINUX_X86_64 = sys.platform.startswith("linux") and os.uname().machine == "x86_64"
_built = {}  # "library": path of the library copied into the package


def _repo_root():
    root = os.environ.get("FLASHATTN_SOURCE_DIR") or os.path.dirname(HERE)
    if not os.path.isfile(os.path.join(root, "include", "flashattn.h")):
        sys.exit("flashattn setup: no C sources at %s (include/flashattn.h missing); set "
                 "FLASHATTN_SOURCE_DIR to the repository root" % root)
    return root


def library_version():
    """The version, from include/flashattn.h's FA_VERSION_MAJOR/MINOR/PATCH (its one source)."""
    with open(os.path.join(_repo_root(), "include", "flashattn.h")) as f:
        text = f.read()
    parts = [re.search(r"^#define FA_VERSION_%s\s+(\d+)" % name, text, re.M)
             for name in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        sys.exit("flashattn setup: FA_VERSION_MAJOR/MINOR/PATCH not found in flashattn.h")
    return ".".join(p.group(1) for p in parts)


def _nvcc():
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _gpu_present():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and any(line.startswith("GPU") for line in out.stdout.splitlines())


def want_cuda():
    """(build the CUDA kernels?, why) from FLASHATTN_CUDA, FA_NO_CUDA, nvcc and the GPU."""
    choice = os.environ.get("FLASHATTN_CUDA", "").strip()
    if choice not in ("", "0", "1"):
        sys.exit("flashattn setup: FLASHATTN_CUDA=%r: use 1 (CUDA kernels) or 0 (CPU only)" % choice)
    if choice == "1":
        if _nvcc() is None:
            sys.exit("flashattn setup: FLASHATTN_CUDA=1 but nvcc was not found (set NVCC or PATH)")
        return True, "FLASHATTN_CUDA=1"
    if choice == "0":
        return False, "FLASHATTN_CUDA=0"
    if os.environ.get("FA_NO_CUDA"):
        return False, "FA_NO_CUDA is set"
    if _nvcc() is None:
        return False, "nvcc not found"
    if not _gpu_present():
        return False, "nvcc found but no GPU (nvidia-smi); FLASHATTN_CUDA=1 builds the kernels anyway"
    return True, "nvcc and a GPU found"


def build_library(package_dir):
    """Run make for the shared library and copy it into <package_dir>/lib/."""
    root = _repo_root()
    cuda, why = want_cuda()
    build_dir = os.environ.get("FLASHATTN_BUILD_DIR") or (
        "build-python-cuda" if cuda else "build-python-cpu")
    target = os.path.join(build_dir, LIBRARY_FILE)
    built = os.path.join(root, target)
    make = shutil.which("make")
    if make is not None:
        jobs = str(os.cpu_count() or 1)
        cmd = [make, "-C", root, "-j" + jobs, "BUILD=" + build_dir]
        if cuda:
            cmd += ["CUDART=" + os.environ.get("CUDART", "static")]
        else:
            cmd += ["FA_NO_CUDA=1"]
        if LINUX_X86_64:
            cmd += ["PORTABLE_GLIBC=1"]
        if not os.environ.get("V"):
            cmd += ["PTXAS_WARN="]
        cmd += [target]
        print("flashattn setup: %s library (%s): %s" % ("CUDA + CPU" if cuda else "CPU",
                                                       why, " ".join(cmd)), flush=True)
        # Relink every time: the link flags (CUDART, PORTABLE_GLIBC) are not make prerequisites.
        if os.path.isfile(built):
            os.remove(built)
        subprocess.check_call(cmd)
    elif not os.path.isfile(built):
        sys.exit("flashattn setup: `make` not found and no prebuilt %s" % built)
    dest_dir = os.path.join(package_dir, "lib")
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, LIBRARY_FILE)
    shutil.copy2(built, dest)
    _built["library"] = dest


def _glibc_needed(path):
    """Newest GLIBC_2.N symbol version the ELF file needs (its .gnu.version_r names, which sit
    in .dynstr): N, or None."""
    with open(path, "rb") as f:
        data = f.read()
    minors = [int(m) for m in re.findall(rb"\0GLIBC_2\.(\d+)(?:\.\d+)?\0", data)]
    return max(minors) if minors else None


class BuildPyWithLibrary(build_py):
    """build_py that also builds libflashattn: into the build tree for a regular install, into
    the source package for an editable one (which imports from the source)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            build_library(os.path.join(HERE, "flashattn"))
        else:
            build_library(os.path.join(self.build_lib, "flashattn"))


class WheelForAnyPython(bdist_wheel):
    """py3-none-<platform>: the package has no extension module (ctypes only). On Linux the
    platform is manylinux_2_<N>_<arch>, N being the newest glibc the library needs (check it
    with `auditwheel show`)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        library = _built.get("library")
        if platform.startswith("linux_") and library and os.path.isfile(library):
            minor = _glibc_needed(library)
            platform = "manylinux_2_%d_%s" % (max(minor or 17, 17), platform[len("linux_"):])
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    """The wheel carries a shared library, so it is platform specific."""

    def has_ext_modules(self):
        return True


def _temporary_build_base():
    """setuptools' build/ and egg-info directories, kept out of python/."""
    base = tempfile.mkdtemp(prefix="flashattn-setup-")
    atexit.register(shutil.rmtree, base, True)
    return base


_BASE = _temporary_build_base()

setup(
    version=library_version(),
    cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": WheelForAnyPython},
    distclass=BinaryDistribution,
    options={"build": {"build_base": os.path.join(_BASE, "build")},
             "egg_info": {"egg_base": _BASE}},
)
