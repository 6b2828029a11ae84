"""Builds libflashattn with the repository's Makefile and ships it inside the package.

    pip install ./python                 # CUDA included when nvcc is found (make decides)
    FA_NO_CUDA=1 pip install ./python    # CPU only
    pip install -e ./python              # editable: the library lands in python/flashattn/lib/
                                         # (rerun after rebuilding the C library)

Environment: FLASHATTN_BUILD_DIR (make's BUILD directory, relative to the repository root;
default "build"), FLASHATTN_SOURCE_DIR (repository root, when this directory was copied away
from it), and everything the Makefile reads (FA_NO_CUDA, CUDA_ARCHS, CC, NVCC, ...).
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY_FILE = "libflashattn.dylib" if sys.platform == "darwin" else "libflashattn.so"


def _repo_root():
    root = os.environ.get("FLASHATTN_SOURCE_DIR") or os.path.dirname(HERE)
    if not os.path.isfile(os.path.join(root, "include", "flashattn.h")):
        sys.exit("flashattn setup: no C sources at %s (include/flashattn.h missing); set "
                 "FLASHATTN_SOURCE_DIR to the repository root" % root)
    return root


def build_library(package_dir):
    """Run make for the shared library and copy it into <package_dir>/lib/."""
    root = _repo_root()
    build_dir = os.environ.get("FLASHATTN_BUILD_DIR", "build")
    target = os.path.join(build_dir, LIBRARY_FILE)
    built = os.path.join(root, target)
    make = shutil.which("make")
    if make is not None:
        jobs = str(os.cpu_count() or 1)
        cmd = [make, "-C", root, "-j" + jobs, "BUILD=" + build_dir, target]
        print("flashattn setup: " + " ".join(cmd), flush=True)
        subprocess.check_call(cmd)
    elif not os.path.isfile(built):
        sys.exit("flashattn setup: `make` not found and no prebuilt %s" % built)
    dest_dir = os.path.join(package_dir, "lib")
    os.makedirs(dest_dir, exist_ok=True)
    shutil.copy2(built, os.path.join(dest_dir, LIBRARY_FILE))


class BuildPyWithLibrary(build_py):
    """build_py that also builds libflashattn: into the build tree for a regular install, into
    the source package for an editable one (which imports from the source)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            build_library(os.path.join(HERE, "flashattn"))
        else:
            build_library(os.path.join(self.build_lib, "flashattn"))


class BinaryDistribution(Distribution):
    """The wheel carries a shared library, so it is platform specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
