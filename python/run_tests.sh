#!/bin/sh
# python/run_tests.sh: the Python package's tests (tests/run_all.sh calls this from `make test`).
#
#   1. the test environment: a virtual environment made once and reused while the requirement
#      list below is unchanged (pytest, numpy, ml_dtypes, setuptools, wheel; torch from PyPI,
#      used on the CPU, and transformers for the torch tests), or the interpreter named by
#      FLASHATTN_TEST_PYTHON, into which nothing is installed;
#   2. the wheel: `pip wheel ./python` (CPU engine) in that environment; it must carry the
#      library, be tagged py3-none-manylinux_* (checked with `auditwheel show`) and leave no
#      python/build behind;
#   3. a fresh virtual environment with no compiler on PATH installs the wheel (pip brings NumPy,
#      its one dependency) and runs a forward from there;
#   4. the same wheel installed into the test environment, and pytest over python/tests from it
#      (GPU tests skip without a GPU). The last line printed is "N passed, N failed, N skipped";
#      the exit status is non-zero on any failure.
# With FLASHATTN_TEST_PYTHON, steps 2-3 are skipped and the tests run from the source tree
# against the library make builds (FLASHATTN_LIB).
#
# Environment:
#   FLASHATTN_TEST_PYTHON  an existing interpreter with pytest and numpy (torch optional) to test
#                          with: nothing is installed into it, no environment is made
#   FLASHATTN_VENV         where the environment lives (default: ~/.cache/flashattn/venv-<key>,
#                          shared by every checkout so CI reuses it; the key hashes the
#                          requirements and the Python version). Set it to .venv for a local one.
#                          Environments of other keys are listed, never removed.
#   FLASHATTN_BUILD_DIR    make's BUILD directory for the library (default build-python)
#   FLASHATTN_CUDA         1: the wheel gets the CUDA kernels too (default 0 here: CPU)
#   FLASHATTN_NO_TORCH=1   skip installing torch and transformers (torch tests then skip)
#   PYTHON                 interpreter to make the environment from (default python3)
#   PYTEST_ARGS            extra pytest arguments (e.g. "-k numpy -x")
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
BUILD_DIR=${FLASHATTN_BUILD_DIR:-build-python}
BASE_REQUIREMENTS="pytest numpy ml_dtypes setuptools wheel"
TORCH_REQUIREMENTS="torch==2.11.0 transformers"
say() { echo "python/run_tests.sh: $*"; }

fail() {
    echo "python/run_tests.sh: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-python.XXXXXX") || fail "cannot create a temporary directory"
trap 'rm -rf "$TMP"' EXIT INT TERM

# ---- 1. environment ---------------------------------------------------------------------------
wheel_checks=0
wheel_failed=0
start=$(date +%s)
if [ -n "${FLASHATTN_TEST_PYTHON:-}" ]; then
    VPY=$FLASHATTN_TEST_PYTHON
    "$VPY" -c 'import pytest, numpy' > /dev/null 2>&1 \
        || fail "FLASHATTN_TEST_PYTHON=$VPY cannot import pytest and numpy (nothing is installed into it)"
    say "using $VPY as it is (FLASHATTN_TEST_PYTHON): nothing installed, tests run from the source tree"
else
    command -v "$PYTHON" > /dev/null 2>&1 || fail "no $PYTHON"
    PY_VERSION=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || fail "$PYTHON does not run"
    WANT_TORCH=1
    [ -n "${FLASHATTN_NO_TORCH:-}" ] && WANT_TORCH=0
    KEY=$(printf '%s|%s|%s|%s' "$PY_VERSION" "$BASE_REQUIREMENTS" "$TORCH_REQUIREMENTS" "$WANT_TORCH" \
          | cksum | cut -d' ' -f1)
    CACHE_HOME=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
    VENV=${FLASHATTN_VENV:-$CACHE_HOME/flashattn/venv-$KEY}
    case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
    VPY=$VENV/bin/python
    STAMP=$VENV/.flashattn-ready

    # Runs sharing an environment (two checkouts on one machine) take turns: each reinstalls the
    # package into it.
    mkdir -p "$(dirname "$VENV")" || fail "cannot create $(dirname "$VENV")"
    if command -v flock > /dev/null 2>&1; then
        exec 9> "$VENV.lock"
        flock 9
    fi
    if [ -z "${FLASHATTN_VENV:-}" ]; then
        others=
        for old in "$CACHE_HOME"/flashattn/venv-*; do
            [ -d "$old" ] && [ "$old" != "$VENV" ] && others="$others $(basename "$old")"
        done
        [ -n "$others" ] && say "note: other test environments in $CACHE_HOME/flashattn are not used" \
            "by this checkout (left alone; remove them if nothing else needs them):$others"
    fi
    if [ ! -f "$STAMP" ] || ! "$VPY" -c 'import pytest, numpy' > /dev/null 2>&1; then
        say "creating the test environment $VENV (Python $PY_VERSION), once for this requirement list"
        say "  (FLASHATTN_TEST_PYTHON=/path/to/python uses an existing interpreter instead)"
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV" || fail "cannot create a virtual environment at $VENV"
        say "installing $BASE_REQUIREMENTS: the test runner, the NumPy path and its bfloat16," \
            "and what builds the wheel"
        "$VPY" -m pip install -q --disable-pip-version-check $BASE_REQUIREMENTS \
            || fail "pip could not install: $BASE_REQUIREMENTS"
        if [ "$WANT_TORCH" = 1 ]; then
            # PyPI's Linux torch wheel (with its CUDA libraries, ~4 GB installed); the tests use it
            # on the CPU. If it cannot be installed, the torch tests skip and the NumPy tests run.
            say "installing $TORCH_REQUIREMENTS: the torch path's tests and the Hugging Face example" \
                "(~4 GB, a few minutes; FLASHATTN_NO_TORCH=1 leaves them out and those tests skip)"
            "$VPY" -m pip install -q --disable-pip-version-check $TORCH_REQUIREMENTS \
                || say "WARNING: torch/transformers not installed; their tests skip"
        fi
        touch "$STAMP"
    fi
    if ! "$VPY" -c 'import auditwheel' > /dev/null 2>&1; then
        say "installing auditwheel into the test environment: it checks the wheel's manylinux tag"
        "$VPY" -m pip install -q --disable-pip-version-check auditwheel \
            || say "WARNING: auditwheel not installed; the wheel's tag is checked by name only"
    fi
fi
say "environment ready in $(( $(date +%s) - start )) s"

if [ -n "${FLASHATTN_TEST_PYTHON:-}" ]; then
    # ---- tests from the source tree, against the library make builds ---------------------------
    start=$(date +%s)
    if [ "${FLASHATTN_CUDA:-0}" = 1 ]; then cuda_flag=; else cuda_flag=FA_NO_CUDA=1; fi
    make -C "$ROOT" -s -j"$(nproc 2> /dev/null || echo 2)" BUILD="$BUILD_DIR" $cuda_flag PTXAS_WARN= \
        "$BUILD_DIR/libflashattn.so" > "$TMP/make.log" 2>&1 \
        || { cat "$TMP/make.log" >&2; fail "make $BUILD_DIR/libflashattn.so failed"; }
    say "library built in $(( $(date +%s) - start )) s: $BUILD_DIR/libflashattn.so"
    export FLASHATTN_LIB="$ROOT/$BUILD_DIR/libflashattn.so"
    export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
else
    # ---- 2. the wheel -------------------------------------------------------------------------
    start=$(date +%s)
    WHEELS=$TMP/wheelhouse
    FLASHATTN_BUILD_DIR=$BUILD_DIR FLASHATTN_CUDA=${FLASHATTN_CUDA:-0} \
        "$VPY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
        -w "$WHEELS" "$ROOT/python" > "$TMP/wheel.log" 2>&1 \
        || { cat "$TMP/wheel.log" >&2; fail "pip wheel ./python failed"; }
    WHEEL=$(ls "$WHEELS"/flashattn-*.whl 2> /dev/null | head -n 1)
    [ -n "$WHEEL" ] || fail "pip wheel ./python made no wheel"
    say "wheel built in $(( $(date +%s) - start )) s: $(basename "$WHEEL")"
    check() { # check WHAT COMMAND...: one counted wheel check
        what=$1
        shift
        if "$@" > "$TMP/check.log" 2>&1; then
            say "ok: $what"
        else
            cat "$TMP/check.log"
            say "FAILED: $what"
            wheel_failed=$((wheel_failed + 1))
        fi
        wheel_checks=$((wheel_checks + 1))
    }
    check "the wheel carries flashattn/lib/libflashattn.so and declares numpy" \
        "$VPY" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); names = z.namelist()
assert "flashattn/lib/libflashattn.so" in names, names
meta = z.read([n for n in names if n.endswith(".dist-info/METADATA")][0]).decode()
assert "Requires-Dist: numpy\n" in meta, meta' "$WHEEL"
    check "tagged py3-none-manylinux_2_N (ctypes: any Python 3, any torch)" \
        sh -c 'case $(basename "$1") in *-py3-none-manylinux_2_*_*.whl) ;; *) exit 1 ;; esac' sh "$WHEEL"
    if "$VPY" -c 'import auditwheel' > /dev/null 2>&1; then
        # auditwheel names the most compatible tag the wheel's libraries allow; ours must not
        # claim an older glibc than that.
        check "auditwheel show agrees with the tag" "$VPY" -c 'import re, subprocess, sys
out = subprocess.run([sys.executable, "-m", "auditwheel", "show", sys.argv[1]],
                     capture_output=True, text=True)
print(out.stdout, out.stderr)
found = re.search(r"consistent with\s+the following platform tag:\s+\"manylinux_2_(\d+)_", out.stdout)
ours = re.search(r"manylinux_2_(\d+)_", sys.argv[1].rsplit("/", 1)[-1])
assert out.returncode == 0 and found and ours, "no verdict"
assert int(ours.group(1)) >= int(found.group(1)), "tagged %s, auditwheel allows %s" % (
    ours.group(0), found.group(0))' "$WHEEL"
    fi
    check "the build left no python/build or egg-info behind" \
        sh -c '! ls -d "$1"/python/build "$1"/python/*.egg-info 2> /dev/null' sh "$ROOT"

    # ---- 3. a fresh environment, no compiler on PATH --------------------------------------------
    start=$(date +%s)
    FRESH=$TMP/fresh
    say "installing the wheel into a fresh virtual environment ($FRESH; pip brings numpy) with" \
        "only the environment's bin/ on PATH (no compiler, no make)"
    # The environment gets no pip of its own (faster): the test environment's pip installs into
    # it (pip --python).
    if "$PYTHON" -m venv --without-pip "$FRESH" > "$TMP/fresh.log" 2>&1 &&
       env PATH="$FRESH/bin" CC=/nonexistent/cc "$VPY" -m pip --python "$FRESH/bin/python" install \
           -q --disable-pip-version-check --only-binary=:all: "$WHEEL" >> "$TMP/fresh.log" 2>&1; then
        check "fresh environment: import, forward vs plain attention, library from the wheel" \
            env PATH="$FRESH/bin" "$FRESH/bin/python" -c 'import os, sys
os.chdir("/")
import numpy as np, flashattn
assert flashattn.library_path.startswith(sys.prefix), flashattn.library_path
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 33, 4, 64)).astype(np.float32) for _ in range(3))
o = flashattn.flash_attn_func(q, k, v, causal=True)
s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / 8.0
s = np.where(np.tril(np.ones((33, 33), bool)), s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
ref = np.einsum("bhqk,bkhd->bqhd", p, v.astype(np.float64))
err = float(np.abs(o - ref).max())
assert err < 1e-5, err
print("flashattn", flashattn.__version__, "CPU", flashattn.cpu_isa(), "max error %.1e" % err)'
    else
        cat "$TMP/fresh.log"
        say "FAILED: the wheel did not install into a fresh environment"
        wheel_failed=$((wheel_failed + 1))
        wheel_checks=$((wheel_checks + 1))
    fi
    say "fresh environment checked in $(( $(date +%s) - start )) s"

    # ---- 4. the wheel into the test environment ---------------------------------------------------
    start=$(date +%s)
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$WHEEL" \
        > "$TMP/install.log" 2>&1 || { cat "$TMP/install.log" >&2; fail "pip install of the wheel failed"; }
    say "wheel installed into the test environment in $(( $(date +%s) - start )) s"
fi

# ---- tests -------------------------------------------------------------------------------------
LOG=$TMP/pytest.log
cd "$ROOT" || fail "cannot cd to $ROOT"
FLASHATTN_BUILD_DIR=$BUILD_DIR "$VPY" -m pytest -p no:cacheprovider -q -rs ${PYTEST_ARGS:-} \
    python/tests 2>&1 | tee "$LOG"
summary=$(grep -E '(passed|failed|errors?|skipped|no tests ran).* in [0-9.]+s' "$LOG" | tail -n 1)
count() {
    printf '%s\n' "$summary" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' | head -n 1
}
passed=$(count passed)
failed=$(count failed)
errors=$(count 'errors?')
skipped=$(count skipped)
passed=${passed:-0}
failed=$(( ${failed:-0} + ${errors:-0} ))
if [ -z "$summary" ] || [ "$passed" -eq 0 ]; then
    failed=$(( failed > 0 ? failed : 1 ))
fi
if [ "$wheel_checks" -gt 0 ]; then
    say "wheel checks: $((wheel_checks - wheel_failed)) passed, $wheel_failed failed"
    passed=$((passed + wheel_checks - wheel_failed))
    failed=$((failed + wheel_failed))
fi
echo "$passed passed, $failed failed, ${skipped:-0} skipped"
[ "$failed" -eq 0 ]
