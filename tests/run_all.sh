#!/bin/sh
# run_all.sh: everything `make test` runs, in order. POSIX sh.
#
#   0. tests/check_repo.sh                the repository holds the product only (no lab/, no logs)
#   1. build (make -j2: library, flashattn tool, unit-test binary)
#   2. build/fa_tests                     unit tests (oracle self-checks, every feature, errors, threads)
#   3. build/fa_gpu_tests                 the GPU test programs compile and link (CUDA builds)
#      generators --check                 src/cuda/common/ptx.cuh's wgmma block and src/cuda/instances are current
#      build/flashattn check --quick      randomised sweep against the float64 reference
#      build/flashattn bench --dropout    a dropout run completes; a bad probability is refused
#      tests/install_test.sh              make install; C (pkg-config) and CMake programs using it
#      build-aarch64/fa_tests             the unit tests cross-built for AArch64 (NEON level) and run
#                                         under qemu-aarch64, FA_TEST_LEVEL=small, in the background
#                                         alongside stages 4-6 (results printed last; skipped, and
#                                         said so, without aarch64-linux-gnu-gcc and qemu-aarch64);
#                                         then the ISA and engine suites at the SVE level (qemu with
#                                         256-bit vectors)
#   4. build-fuzz/lib/fa_tests            the unit tests again under ASan + UBSan, -O1, smaller sizes,
#                                         built by clang with the fuzzer's coverage (one sanitizer
#                                         build for stages 4 and 5; without clang: build-asan, cc)
#   5. tests/fuzz/run.sh 30               the fuzzer (libFuzzer, ASan + UBSan) for 30 s from its corpus
#      make tsan-test                     8 concurrent callers under ThreadSanitizer, bitwise checked
#   6. python/run_tests.sh                the Python package's tests, when present
#
# Each stage reports "N passed, N failed"; the closing line is the sum, exactly
# "N passed, N failed", and the exit status is non-zero if anything failed or did not build.
# Environment: JOBS (default 2), FA_TEST_LEVEL for stage 2 (default normal), FA_SKIP_ASAN=1 to
# leave out stage 4 (quick local runs only; CI runs it), BUILD_DIR / ASAN_BUILD_DIR / FUZZ_BUILD
# (default build / build-asan / build-fuzz) to keep a developer's run apart from others', FA_NO_CUDA=1 (read by make),
# AARCH64_BUILD_DIR (default build-aarch64), FA_AARCH64_TEST_LEVEL (default small: under qemu the
# tests take ~25x the CPU time), FA_SKIP_AARCH64=1 to leave out the AArch64 stage, CUDA_ARCHS
# (default 80 here: the portable kernels are compile-checked for sm_80, the branch only A100-class
# GPUs run; their sm_90 variants are built and run by make gpu-test), CUDA_PTX_ONLY (default 1
# here: every CUDA kernel, the sm_90a ones included, is compiled to PTX without ptxas; make
# gpu-test builds their machine code).
set -u
export CUDA_ARCHS="${CUDA_ARCHS:-80}"
export CUDA_PTX_ONLY="${CUDA_PTX_ONLY-1}"
cd "$(dirname "$0")/.." || exit 1

JOBS=${JOBS:-2}
BUILD_DIR=${BUILD_DIR:-build}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
AARCH64_BUILD_DIR=${AARCH64_BUILD_DIR:-build-aarch64}
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
AARCH64_CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
total_passed=0
total_failed=0
log_dir=${TMPDIR:-/tmp}/flashattn-test.$$
mkdir -p "$log_dir" || exit 1
aarch64_pid=
start=$(date +%s)
trap 'if [ -n "$aarch64_pid" ]; then kill "$aarch64_pid" 2>/dev/null; fi; rm -rf "$log_dir"' EXIT INT TERM

# banner TITLE: a stage's heading, with the seconds since the run began (where CI time goes)
banner() {
    printf '\n==== %s ==== (at %d s)\n' "$1" "$(( $(date +%s) - start ))"
}

# add_counts STAGE LOG STATUS: take the stage's last "N passed, N failed" line from LOG; a stage
# that exits non-zero with no failure counted (a crash, a sanitizer report, a leak) counts as
# one failure, and so does a stage that printed no count at all.
add_counts() {
    stage=$1
    log=$2
    status=$3
    line=$(grep -E '^(check: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    passed=0
    failed=0
    if [ -n "$line" ]; then
        passed=$(printf '%s\n' "$line" | sed -E 's/^(check: )?([0-9]+) passed, ([0-9]+) failed.*/\2/')
        failed=$(printf '%s\n' "$line" | sed -E 's/^(check: )?([0-9]+) passed, ([0-9]+) failed.*/\3/')
    fi
    if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
        failed=1
        echo "run_all: $stage exited with status $status without counting a failure: counted as 1 failure"
    elif [ -z "$line" ]; then
        failed=$((failed + 1))
        echo "run_all: $stage printed no \"N passed, N failed\" line: counted as 1 failure"
    fi
    echo "run_all: $stage: $passed passed, $failed failed"
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
}

# run_stage NAME COMMAND...: run, show the output as it comes, and count
run_stage() {
    stage=$1
    shift
    log="$log_dir/$(printf '%s' "$stage" | tr -c 'a-zA-Z0-9' '_').log"
    status_file="$log.status"
    { "$@" 2>&1; echo $? > "$status_file"; } | tee "$log"
    add_counts "$stage" "$log" "$(cat "$status_file")"
}

fail_stage() {
    echo "run_all: $1"
    total_failed=$((total_failed + 1))
}

banner "repository hygiene (tests/check_repo.sh)"
run_stage "repository hygiene" sh tests/check_repo.sh

banner "build"
if make -j"$JOBS" BUILD="$BUILD_DIR" lib "$BUILD_DIR/fa_tests"; then
    built=1
else
    built=0
    fail_stage "the build of the library or $BUILD_DIR/fa_tests failed"
fi
if [ "$built" -eq 1 ] && ! make -j"$JOBS" BUILD="$BUILD_DIR" all; then
    fail_stage "make all failed (the flashattn tool did not build)"
fi

if [ "$built" -eq 1 ]; then
    banner "unit tests ($BUILD_DIR/fa_tests)"
    run_stage "unit tests" "./$BUILD_DIR/fa_tests"

    banner "C++ use of the header (tests/header_cxx.cc)"
    if ${CXX:-c++} -std=c++11 -Wall -Wextra -pedantic -Werror -Iinclude tests/header_cxx.cc \
        "$BUILD_DIR/libflashattn.a" -lm -pthread $(make -s BUILD="$BUILD_DIR" print-cuda-libs) \
        -o "$BUILD_DIR/header_cxx"; then
        run_stage "C++ header" "./$BUILD_DIR/header_cxx"
    else
        fail_stage "tests/header_cxx.cc did not compile or link as C++"
    fi

    banner "GPU test programs compile and link (tests/gpu/*.c as $BUILD_DIR/fa_gpu_tests; they run in make gpu-test)"
    cuda_include=$(make -s BUILD="$BUILD_DIR" print-cuda-include)
    if [ -n "$cuda_include" ]; then
        run_stage "GPU test programs" sh -c 'if make -j"$1" BUILD="$2" "$2/fa_gpu_tests"; then
            echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi' sh "$JOBS" "$BUILD_DIR"
        nccl_h=$(make -s BUILD="$BUILD_DIR" print-nccl-h)
        if [ -n "$nccl_h" ]; then
            run_stage "multi-GPU test program (compile only; runs in make multi-gpu-test)" sh -c '
                if ${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -I"$1" -I"$2" \
                    -c tests/multi_gpu/ring_nccl_check.c -o "$3/ring_nccl_check.o"; then
                    echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi' sh "$cuda_include" \
                "$(dirname "$nccl_h")" "$BUILD_DIR"
        else
            echo "nccl.h not found: tests/multi_gpu/ring_nccl_check.c not compiled (NCCL transport compiled out)"
        fi
    else
        echo "CPU-only build (no nvcc): nothing to compile"
    fi

    banner "generated sources are current (src/cuda/common/gen_wgmma.py, src/cuda/instances/generate.py)"
    run_stage "generated sources" sh -c 'p=0; f=0
        for g in src/cuda/common/gen_wgmma.py src/cuda/instances/generate.py; do
            if python3 "$g" --check; then p=$((p + 1)); else echo "stale: run python3 $g"; f=$((f + 1)); fi
        done; echo "$p passed, $f failed"'

    banner "check sweep ($BUILD_DIR/flashattn check --quick)"
    if [ -x "$BUILD_DIR/flashattn" ]; then
        run_stage "check sweep" "./$BUILD_DIR/flashattn" check --quick
        # bench flags that reach fa_params: a dropout run completes (forward and backward) and
        # echoes its p; a probability outside [0, 1) is a usage error (status 2)
        run_stage "bench tool" sh -c 'p=0; f=0
            out=$("$1" bench --device cpu --sq 64 --hq 2 -d 32 --mode fwd,bwd --dropout 0.2 --repeats 1 --json)
            n=$(printf "%s\n" "$out" | grep -c "\"dropout_p\":0.2,\"status\":\"ok\"")
            if [ "$n" = 2 ]; then p=$((p + 1)); else echo "bench --dropout 0.2: $out"; f=$((f + 1)); fi
            "$1" bench --device cpu --sq 64 --dropout 1.5 > /dev/null 2>&1
            if [ $? = 2 ]; then p=$((p + 1)); else echo "bench --dropout 1.5 was not refused"; f=$((f + 1)); fi
            echo "$p passed, $f failed"' sh "./$BUILD_DIR/flashattn"
    else
        fail_stage "$BUILD_DIR/flashattn was not built: the check sweep could not run"
    fi

    banner "make install and programs using it (tests/install_test.sh: pkg-config, CMake)"
    run_stage "install" env BUILD_DIR="$BUILD_DIR" sh tests/install_test.sh
fi

# AArch64: the CPU library and unit tests cross-built (no CUDA) and run under qemu-user, where
# the NEON level is detected (HWCAP_ASIMD); test_isa runs it and the scalar level explicitly.
aarch64_level=${FA_AARCH64_TEST_LEVEL:-small}
if [ "${FA_SKIP_AARCH64:-0}" = 1 ]; then
    banner "AArch64 under qemu: skipped (FA_SKIP_AARCH64=1)"
elif ! command -v "$AARCH64_CC" >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    banner "AArch64 under qemu: skipped: no aarch64 cross compiler/qemu"
    echo "($AARCH64_CC and qemu-aarch64 not found; Debian: apt-get install gcc-aarch64-linux-gnu" \
         "libc6-dev-arm64-cross qemu-user, as .ci/run does)"
else
    banner "AArch64 cross build ($AARCH64_BUILD_DIR, CC=$AARCH64_CC, FA_NO_CUDA=1)"
    if make -j"$JOBS" BUILD="$AARCH64_BUILD_DIR" CC="$AARCH64_CC" FA_NO_CUDA=1 "$AARCH64_BUILD_DIR/fa_tests"; then
        # qemu runs the tests on one core for minutes: in the background, while the sanitizer,
        # fuzzer, TSan and Python stages use the other; the output is shown after them.
        aarch64_log="$log_dir/aarch64_stage.log" aarch64_sve_log="$log_dir/aarch64_sve_stage.log"
        aarch64_start=$(date +%s)
        ( sh -c '{ env QEMU_LD_PREFIX="${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}" \
                FA_TEST_LEVEL="$2" qemu-aarch64 "./$1/fa_tests" 2>&1; echo $? > "$3.status"; } > "$3"
            cat "$3"
            if ! grep -q "^fa_tests: .*, cpu isa neon," "$3"; then
                echo "the AArch64 tests did not run at the NEON level"; echo "0 passed, 1 failed"; exit 1; fi
            exit "$(cat "$3.status")"' sh "$AARCH64_BUILD_DIR" "$aarch64_level" "$log_dir/aarch64_fa_tests.out" \
            > "$aarch64_log" 2>&1
          echo $? > "$aarch64_log.status"
          echo "(the NEON stage ran $(( $(date +%s) - aarch64_start )) s)" >> "$aarch64_log"
          aarch64_start=$(date +%s)
          # then the SVE level (256-bit vectors: qemu's default length is 512, which runs NEON):
          # test_isa's cases (every kernel of the level against the scalar ones) and the suites
          # whose results depend on the level's kernels (forward / backward, accuracy against the
          # float64 oracle, NaN propagation through its max / select, decode); dropout, bias and
          # block masks are the engine's scalar code around those same kernels, run at NEON above
          sh -c '{ env QEMU_LD_PREFIX="${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}" FA_TEST_LEVEL="$2" \
                qemu-aarch64 -cpu max,sve-default-vector-length=32 "./$1/fa_tests" isa_sve256 attention \
                accuracy nan kvcache_isa_levels 2>&1; echo $? > "$3.status"; } > "$3"
            cat "$3"
            if ! grep -q "^fa_tests: .*, cpu isa sve256," "$3"; then
                echo "the AArch64 SVE tests did not run at the sve256 level"; echo "0 passed, 1 failed"; exit 1; fi
            exit "$(cat "$3.status")"' sh "$AARCH64_BUILD_DIR" "$aarch64_level" "$log_dir/aarch64_sve_fa_tests.out" \
            > "$aarch64_sve_log" 2>&1
          echo $? > "$aarch64_sve_log.status"
          echo "(the SVE stage ran $(( $(date +%s) - aarch64_start )) s)" >> "$aarch64_sve_log" ) &
        aarch64_pid=$!
        echo "(the AArch64 unit tests run under qemu in the background; their results follow the last stage)"
    else
        fail_stage "the AArch64 cross build of the library or $AARCH64_BUILD_DIR/fa_tests failed"
    fi
fi

if [ "${FA_SKIP_ASAN:-0}" = 1 ]; then
    banner "sanitizers: skipped (FA_SKIP_ASAN=1)"
else
    # One sanitizer build serves this stage and the fuzzer's: clang's, with libFuzzer's coverage
    # instrumentation (tests/fuzz/fuzz.mk); without clang, the default compiler's in $ASAN_BUILD_DIR.
    asan_tests=
    banner "sanitizer build ($FUZZ_BUILD/lib with clang for the fuzzer too, else $ASAN_BUILD_DIR; ASan + UBSan, -O1)"
    if command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1 &&
        make --no-print-directory -j"$JOBS" FUZZ_BUILD="$FUZZ_BUILD" fuzz-unit-tests; then
        asan_tests=$FUZZ_BUILD/lib/fa_tests
    elif make -j"$JOBS" BUILD="$ASAN_BUILD_DIR" OPT=-O1 \
        SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
        FA_NO_CUDA=1 "$ASAN_BUILD_DIR/fa_tests"; then
        asan_tests=$ASAN_BUILD_DIR/fa_tests
    else
        fail_stage "the sanitizer build failed"
    fi
    if [ -n "$asan_tests" ]; then
        banner "unit tests under sanitizers ($asan_tests, FA_TEST_LEVEL=small)"
        run_stage "sanitizer unit tests" env FA_TEST_LEVEL=small \
            ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}" \
            UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" "./$asan_tests"
    fi
fi

banner "fuzzer (tests/fuzz/run.sh: ${FA_FUZZ_TEST_SECONDS:-30} s from tests/fuzz/corpus, ASan + UBSan)"
run_stage "fuzzer" env FUZZ_BUILD="$FUZZ_BUILD" JOBS="$JOBS" sh tests/fuzz/run.sh "${FA_FUZZ_TEST_SECONDS:-30}"

banner "concurrent callers under ThreadSanitizer (tests/tsan/tsan_callers.c, build-tsan)"
run_stage "TSan concurrent callers" make --no-print-directory -s tsan-test

if [ -f python/run_tests.sh ]; then
    banner "python tests (python/run_tests.sh)"
    run_stage "python tests" sh python/run_tests.sh
else
    banner "python tests: python/run_tests.sh does not exist yet, nothing to run"
fi

if [ -n "$aarch64_pid" ]; then
    banner "AArch64 unit tests under qemu-aarch64 (NEON level, FA_TEST_LEVEL=$aarch64_level), run in the background"
    wait "$aarch64_pid"
    aarch64_pid=
    cat "$aarch64_log"
    add_counts "AArch64 unit tests" "$aarch64_log" "$(cat "$aarch64_log.status" 2>/dev/null || echo 1)"
    banner "AArch64 unit tests under qemu-aarch64 at the SVE level (256-bit vectors), run in the background"
    cat "$aarch64_sve_log"
    add_counts "AArch64 SVE unit tests" "$aarch64_sve_log" "$(cat "$aarch64_sve_log.status" 2>/dev/null || echo 1)"
fi

end=$(date +%s)
echo
echo "run_all: finished in $((end - start)) s"
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
