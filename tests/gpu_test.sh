#!/bin/sh
# tests/gpu_test.sh: what `make gpu-test` runs on a machine with an NVIDIA GPU.
#   1. build the library and the flashattn tool for the local GPU (build-gpu/)
#   2. `flashattn check --device cuda --full`: the randomised sweep against the float64 oracle
#      (default kernels; f16, bf16 and fp8 e4m3 inputs, the last on sm_90 only), then `--quick`
#      with the portable forward forced; on sm_90 the fp8 sweep again with each way of the fp8
#      forward's V transpose forced (FA_HOPPER_FP8_VT=kernel / prepass) and racecheck on both
#   3. determinism: the CUDA forward gives bitwise identical O and LSE run to run
#      (tests/gpu/determinism.c); the default forward against the portable one; NaN inputs
#      propagate through every kernel (tests/gpu/nan.c)
#   4. compute-sanitizer memcheck, racecheck and synccheck on small problems
#   5. backward repeatability and compute-sanitizer (tests/gpu/backward.c)
#   6. the default backward kernel against the portable one (tests/gpu/bwd_paths.c)
#   6b. the KV-cache path against the CPU engine and the oracle (appends of any length, head dims
#      that are not multiples of 8) and fa_forward with a paged K/V (tests/gpu/cache.c), then
#      compute-sanitizer memcheck on small problems of both; head dims above 256 (MLA latent caches:
#      tests/gpu/kvcache_large.c; again with FA_CUDA_KVCACHE=portable, the mma.sync kernel where sm_90
#      runs the wgmma one) and compute-sanitizer on its small problems; quantised caches
#      (int8, Q8_0, e4m3: tests/gpu/kvquant.c) and compute-sanitizer on its small problems
#   6c. attention dropout: forward and backward against the float64 oracle with the same mask
#      on every kernel path (Hopper and portable), the CUDA mask against the CPU's, repeatability
#      (tests/gpu/dropout.c); compute-sanitizer
#   6d. score bias, dbias, document ids, block-sparse masks against the oracle, deterministic
#      dbias, bad block lists rejected (tests/gpu/mods.c); compute-sanitizer on small problems
#   6e. head dims above 256 (512, 576 / 512, odd sizes): forward and backward against the oracle
#      with every feature, refusals (tests/gpu/large_heads.c); compute-sanitizer on small problems
#   6f. varlen rows past the last sequence: zeroed with zero_varlen_tail, untouched without
#      (tests/gpu/tail.c); compute-sanitizer memcheck
#   7. Python: the CUDA wheel (make wheel FA_CUDA=1, or FLASHATTN_WHEEL=<a wheel built elsewhere>)
#      installed into a fresh virtual environment that sees the system's torch, and the package's
#      GPU and torch tests run from it (skipped with a message when python3 has no torch/pytest)
# Exits non-zero on the first failing step. BUILD (default build-gpu) and CUDA_ARCHS (default:
# the local GPU's compute capability) can be overridden.
set -u
BUILD=${BUILD:-build-gpu}
fail() { echo "gpu-test: FAILED: $*"; exit 1; }

command -v nvidia-smi > /dev/null 2>&1 || fail "nvidia-smi not found: no NVIDIA GPU/driver here"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || fail "nvcc not found (set NVCC or put it on PATH)"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
# the GPU's compute capability, e.g. 90 (the default CUDA_ARCHS; sm_90 also runs the fp8 steps)
GPU_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
CUDA_ARCHS=${CUDA_ARCHS:-$GPU_CC}
[ -n "$CUDA_ARCHS" ] || fail "could not read the GPU's compute capability"
JOBS=$(nproc 2> /dev/null || echo 4)
echo "gpu-test: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), CUDA_ARCHS=$CUDA_ARCHS"

echo "== 1. build ($BUILD)"
make BUILD="$BUILD" CUDA_ARCHS="$CUDA_ARCHS" CUDA_PTX_ONLY= NVCC="$NVCC" -j"$JOBS" all "$BUILD/fa_gpu_tests" || fail "build"
GPU="$BUILD/fa_gpu_tests"

SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
[ -x "$SAN" ] || fail "compute-sanitizer not found"

echo "== 2. flashattn check --device cuda --full (default kernels: the Hopper forward on sm_90)"
"$BUILD/flashattn" check --device cuda --full || fail "flashattn check --device cuda"
echo "-- the same sweep (quick) with the portable forward forced (FA_CUDA_FORWARD=portable)"
FA_CUDA_FORWARD=portable "$BUILD/flashattn" check --device cuda --quick \
    || fail "flashattn check --device cuda with FA_CUDA_FORWARD=portable"
if [ "$GPU_CC" = 90 ]; then
    for vt in kernel prepass; do
        echo "-- the fp8 sweep with V transposed by the ${vt} (FA_HOPPER_FP8_VT=$vt; the rule picks per shape)"
        FA_HOPPER_FP8_VT=$vt "$BUILD/flashattn" check --device cuda --dtype e4m3 --full \
            || fail "flashattn check --device cuda --dtype e4m3 with FA_HOPPER_FP8_VT=$vt"
        FA_HOPPER_FP8_VT=$vt "$SAN" --tool racecheck --error-exitcode 3 "$BUILD/flashattn" check --device cuda \
            --dtype e4m3 --quick || fail "racecheck on the fp8 sweep with FA_HOPPER_FP8_VT=$vt"
    done
fi

echo "== 3. determinism"
"$GPU" determinism || fail "forward determinism"
echo "-- the default forward kernel against the portable one on large problems"
"$GPU" paths || fail "forward kernels disagree (tests/gpu/paths.c)"
echo "-- NaN inputs propagate through every kernel (tests/gpu/nan.c)"
"$GPU" nan || fail "NaN propagation (tests/gpu/nan.c)"

echo "== 4. compute-sanitizer"
for tool in memcheck racecheck synccheck; do
    echo "-- $tool: forward (small problems)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" determinism small || fail "$tool on determinism small"
    echo "-- $tool: flashattn check --device cuda --quick"
    "$SAN" --tool "$tool" --error-exitcode 3 "$BUILD/flashattn" check --device cuda --quick \
        || fail "$tool on flashattn check --quick"
    echo "-- $tool: Hopper forward with packed GQA/MQA tiles (paths packed)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" paths packed || fail "$tool on paths packed"
    echo "-- $tool: Hopper forward, many tiles per CTA (FA_HOPPER_FWD_GRID_MAX=1: persistent and dynamic grids)"
    FA_HOPPER_FWD_GRID_MAX=1 "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" determinism small \
        || fail "$tool on determinism small with FA_HOPPER_FWD_GRID_MAX=1"
    FA_HOPPER_FWD_GRID_MAX=1 "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" paths packed \
        || fail "$tool on paths packed with FA_HOPPER_FWD_GRID_MAX=1"
done

# ---- 5. CUDA backward ---------------------------------------------------------------------------
# Repeatability (each problem runs twice: dk/dv bitwise equal in every mode, dq too with
# deterministic = 1) and compute-sanitizer memcheck/racecheck on small problems that reach every
# backward kernel path (tests/gpu/backward.c). Value checks of the backward are in step 2.
echo "== 5. backward repeatability and compute-sanitizer"
"$GPU" backward || fail "backward repeatability"
for tool in memcheck racecheck; do
    echo "-- $tool: backward (small problems)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" backward 0 1 2 || fail "$tool on backward 0 1 2"
done

# ---- 6. the CUDA backward's two kernels ---------------------------------------------------------
# The default backward (the Hopper kernel on sm_90 for the problems it covers) against the
# portable one (FA_CUDA_BACKWARD=portable) on 1k-4k-token problems: dq/dk/dv/dsink within a
# tolerance, nothing left unwritten or written outside the tensors, no NaN leaking from padding,
# dk/dv bitwise repeatable (tests/gpu/bwd_paths.c); then memcheck on its small problems.
echo "== 6. backward kernels: default against portable"
"$GPU" bwd_paths || fail "backward kernels disagree (tests/gpu/bwd_paths.c)"
echo "-- the same with deterministic = 1 (semaphore-ordered dQ; dq/dk/dv bitwise equal over 3 runs)"
"$GPU" bwd_paths det || fail "deterministic backward (tests/gpu/bwd_paths.c det)"
for tool in memcheck racecheck synccheck; do
    echo "-- $tool: backward kernels (small problems, every Hopper backward bucket, both modes)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" bwd_paths small || fail "$tool on bwd_paths small"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" bwd_paths small det || fail "$tool on bwd_paths small det"
done

# ---- 6b. KV cache and paged K/V ------------------------------------------------------------------
echo "== 6b. KV cache (any seqlen_new, odd head dims) and paged fa_forward"
"$GPU" kvcache || fail "KV cache against the CPU engine and the oracle (tests/gpu/cache.c kvcache)"
"$GPU" paged || fail "paged fa_forward against the oracle (tests/gpu/cache.c paged)"
for mode in kvcache paged; do
    echo "-- memcheck: $mode (small problems)"
    "$SAN" --tool memcheck --error-exitcode 3 "$GPU" "$mode" small || fail "memcheck on $mode small"
done
echo "-- head dims above 256 (MLA latent caches 576 / 512, other shapes): the oracle and the CPU engine"
"$GPU" kvlarge || fail "large-head KV cache (tests/gpu/kvcache_large.c)"
echo "-- the same with the mma.sync kernel forced (FA_CUDA_KVCACHE=portable; sm_90 runs wgmma at dv = 512)"
FA_CUDA_KVCACHE=portable "$GPU" kvlarge || fail "large-head KV cache with FA_CUDA_KVCACHE=portable"
echo "-- quantised caches (int8, Q8_0, e4m3): appended bytes equal the CPU's, o / lse against the oracle"
"$GPU" kvquant || fail "quantised KV caches (tests/gpu/kvquant.c)"
# racecheck follows the latent-cache kernel's cp.async copies only when its producer waits for them
# (FA_CUDA_KVL_WAIT_COPIES=1; by default their completion reaches the consumers through
# cp.async.mbarrier.arrive.noinc, which racecheck reports as unsynchronised)
for mode in kvlarge kvquant; do
    for tool in memcheck racecheck synccheck; do
        echo "-- $tool: $mode (small problems)"
        wait_copies=0
        [ "$tool" = racecheck ] && wait_copies=1
        FA_CUDA_KVL_WAIT_COPIES=$wait_copies "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" "$mode" small \
            || fail "$tool on $mode small"
    done
done

# ---- 6c. attention dropout ----------------------------------------------------------------------
# The DROPOUT instantiations of the Hopper forward and backward (default on sm_90, every bucket),
# then with the portable forward and each portable backward forced
# (FA_CUDA_FORWARD=portable, FA_CUDA_BACKWARD=portable / sm80), deterministic mode too, against the
# float64 oracle with the library's mask over fresh seeds and odd shapes, the attn_probs signs of
# CUDA and CPU equal bit for bit, same seed -> same bits (tests/gpu/dropout.c); then
# compute-sanitizer on its small problems (buckets 64, 128 and 256 on every path).
echo "== 6c. attention dropout"
"$GPU" dropout || fail "attention dropout (tests/gpu/dropout.c)"
for tool in memcheck racecheck synccheck; do
    echo "-- $tool: dropout (small problems, Hopper and portable kernels, attn_probs)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" dropout small || fail "$tool on dropout small"
done

# ---- 6d. score bias, dbias, document ids, block-sparse masks --------------------------------------
# The portable kernels' MODS instantiations against the float64 oracle (biases of every broadcast
# pattern and dtype with -inf rows, dbias, doc ids, random block masks with bits, varlen, GQA),
# deterministic dbias bitwise repeatable, bad block lists rejected on the device with nothing
# written (tests/gpu/mods.c); then compute-sanitizer on its small problems.
echo "== 6d. score bias, dbias, document ids, block-sparse masks"
"$GPU" mods || fail "score mods (tests/gpu/mods.c)"
for tool in memcheck racecheck synccheck; do
    echo "-- $tool: mods (small problems)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" mods small || fail "$tool on mods small"
done

# ---- 6e. head dims above 256 ------------------------------------------------------------------
echo "== 6e. head dims above 256: forward and backward against the oracle"
"$GPU" large || fail "large heads (tests/gpu/large_heads.c)"
for tool in memcheck racecheck synccheck; do
    echo "-- $tool: large heads (small problems)"
    "$SAN" --tool "$tool" --error-exitcode 3 "$GPU" large small || fail "$tool on large small"
done

# ---- 6f. varlen tails ---------------------------------------------------------------------------
echo "== 6f. varlen rows past the last sequence (zero_varlen_tail)"
"$GPU" tail || fail "varlen tails (tests/gpu/tail.c)"
"$SAN" --tool memcheck --error-exitcode 3 "$GPU" tail || fail "memcheck on tail"

# ---- 7. Python: the CUDA wheel against the local torch -------------------------------------------
echo "== 7. python: the CUDA wheel, GPU and torch tests"
if python3 -c "import torch, pytest" > /dev/null 2>&1; then
    WHEEL=${FLASHATTN_WHEEL:-}
    if [ -z "$WHEEL" ]; then
        # with build isolation (fetches setuptools), else with the installed setuptools (offline)
        make wheel FA_CUDA=1 WHEEL_DIR="$BUILD/dist" PYTHON=python3 > "$BUILD/wheel.log" 2>&1 \
            || make wheel FA_CUDA=1 WHEEL_DIR="$BUILD/dist" PYTHON=python3 \
                WHEEL_PIP_FLAGS=--no-build-isolation >> "$BUILD/wheel.log" 2>&1 \
            || { tail -20 "$BUILD/wheel.log"; fail "make wheel FA_CUDA=1"; }
        WHEEL=$(ls -t "$BUILD"/dist/flashattn-*.whl | head -1)
    fi
    VENV="$BUILD/wheel-venv"
    rm -rf "$VENV"
    python3 -m venv --system-site-packages "$VENV" || fail "python3 -m venv"
    "$VENV/bin/pip" install -q --no-deps --no-index "$WHEEL" || fail "install $WHEEL"
    SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    REPO=$(pwd)
    # run from outside the tree so that the installed package, not python/flashattn, is imported
    (cd /tmp && PYTHONPATH="$SITE" python3 -c "import flashattn; print('gpu-test: wheel', flashattn.__file__)" \
        && PYTHONPATH="$SITE" python3 -m pytest -q -p no:cacheprovider "$REPO/python/tests/test_gpu.py" \
            "$REPO/python/tests/test_kvcache.py" \
            "$REPO/python/tests/test_torch.py" "$REPO/python/tests/test_bias_mask.py") || fail "Python tests from the CUDA wheel"
else
    echo "python3 has no torch or pytest: the Python step is skipped"
fi
echo "gpu-test: all passed"
