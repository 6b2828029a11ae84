#!/bin/sh
# python/run_tests.sh: the Python package's tests (tests/run_all.sh calls this from `make test`).
#
#   1. a virtual environment with pytest, numpy, ml_dtypes, torch (PyPI's wheel, used on the CPU)
#      and transformers; made once and reused while the requirement list below is unchanged;
#   2. the package installed into it with `pip install ./python`, which builds libflashattn with
#      make (CPU only, its own build directory) and ships it inside the package;
#   3. pytest over python/tests (GPU tests skip without a GPU); the last line printed is
#      "N passed, N failed" and the exit status is non-zero on any failure.
#
# Environment:
#   FLASHATTN_VENV       where the environment lives (default: ~/.cache/flashattn/venv-<key>,
#                        shared by every checkout so CI reuses it; the key hashes the
#                        requirements and the Python version). Set it to .venv for a local one.
#   FLASHATTN_BUILD_DIR  make's BUILD directory for the library (default build-python)
#   FA_NO_CUDA           unset: the library is built CPU-only (FA_NO_CUDA=1); set it empty
#                        (FA_NO_CUDA=) to let make include CUDA where nvcc exists
#   FLASHATTN_NO_TORCH=1 skip installing torch and transformers (torch tests then skip)
#   PYTHON               interpreter to make the environment from (default python3)
#   PYTEST_ARGS          extra pytest arguments (e.g. "-k numpy -x")
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
BUILD_DIR=${FLASHATTN_BUILD_DIR:-build-python}
BASE_REQUIREMENTS="pytest numpy ml_dtypes setuptools wheel"
TORCH_REQUIREMENTS="torch==2.11.0 transformers"

fail() {
    echo "python/run_tests.sh: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}

command -v "$PYTHON" >/dev/null 2>&1 || fail "no $PYTHON"
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
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    flock 9
fi

# ---- 1. environment ---------------------------------------------------------------------------
start=$(date +%s)
if [ ! -f "$STAMP" ] || ! "$VPY" -c 'import pytest, numpy' >/dev/null 2>&1; then
    echo "python/run_tests.sh: creating $VENV (Python $PY_VERSION)"
    rm -rf "$VENV"
    if [ -z "${FLASHATTN_VENV:-}" ]; then
        # environments for older requirement lists (each several GB) are not reused: drop them
        for old in "$CACHE_HOME"/flashattn/venv-*; do
            [ -d "$old" ] && [ "$old" != "$VENV" ] && rm -rf "$old" "$old.lock"
        done
    fi
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" || fail "cannot create a virtual environment at $VENV"
    "$VPY" -m pip install -q --disable-pip-version-check $BASE_REQUIREMENTS \
        || fail "pip could not install: $BASE_REQUIREMENTS"
    if [ "$WANT_TORCH" = 1 ]; then
        # PyPI's Linux torch wheel (with its CUDA libraries, ~4 GB installed); the tests use it on
        # the CPU. If it cannot be installed, the torch tests skip and the NumPy tests still run.
        "$VPY" -m pip install -q --disable-pip-version-check $TORCH_REQUIREMENTS \
            || echo "python/run_tests.sh: WARNING: torch/transformers not installed; their tests skip"
    fi
    touch "$STAMP"
fi
echo "python/run_tests.sh: environment ready in $(( $(date +%s) - start )) s"

# ---- 2. the package, with the library built by make ---------------------------------------------
start=$(date +%s)
FLASHATTN_BUILD_DIR=$BUILD_DIR FA_NO_CUDA=${FA_NO_CUDA-1} \
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
    --force-reinstall "$ROOT/python" >"$VENV/install.log" 2>&1 \
    || { cat "$VENV/install.log" >&2; fail "pip install ./python failed"; }
rm -rf "$ROOT/python/build" "$ROOT/python/flashattn.egg-info"
echo "python/run_tests.sh: package installed in $(( $(date +%s) - start )) s"

# ---- 3. tests --------------------------------------------------------------------------------------
LOG=$VENV/pytest.log
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
echo "$passed passed, $failed failed, ${skipped:-0} skipped"
[ "$failed" -eq 0 ]
