#!/bin/sh
# tests/fuzz/run.sh SECONDS: the fuzzer stage of `make test`. Builds tests/fuzz/fa_fuzz.c with
# libFuzzer (clang, ASan + UBSan) and runs it for SECONDS from the checked-in corpus (new inputs go
# to a scratch directory, not into tests/fuzz/corpus). Without libFuzzer: the standalone driver
# (cc, ASan + UBSan) replays the corpus and runs random inputs for SECONDS. Without either: a skip.
# Prints "N passed, N failed" last (a skip is "0 passed, 0 failed" with the reason above it).
# Environment: JOBS, make's parallel jobs for the build (default: the number of cores).
seconds=${1:-60}
jobs=${JOBS:-$(nproc 2> /dev/null || echo 2)}
build=${FUZZ_BUILD:-build-fuzz}
scratch=$build/corpus-run
if make --no-print-directory -s -j"$jobs" FUZZ_BUILD="$build" fuzz-build >"$build.log" 2>&1; then
    rm -rf "$scratch" && mkdir -p "$scratch"
    if ./"$build"/fa_fuzz -max_total_time="$seconds" -max_len=512 -timeout=20 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="$build"/ "$scratch" tests/fuzz/corpus 2>"$build/run.log"; then
        grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$build/run.log"
        grep -E 'cov: [0-9]+' "$build/run.log" | tail -n 1
        echo "fuzz: no finding in $seconds s"
        echo "1 passed, 0 failed"
    else
        tail -n 60 "$build/run.log"
        echo "fuzz: finding above; the input is in $build/ (crash-*, leak-*, timeout-*)"
        echo "0 passed, 1 failed"
    fi
    exit 0
fi
echo "fuzz: libFuzzer build failed (clang -fsanitize=fuzzer unavailable?); trying the standalone driver"
tail -n 5 "$build.log"
if make --no-print-directory -s -j"$jobs" FUZZ_BUILD="$build" fuzz-standalone >"$build.log" 2>&1; then
    if FA_FUZZ_SECONDS="$seconds" ./"$build"/fa_fuzz_standalone tests/fuzz/corpus; then
        echo "1 passed, 0 failed"
    else
        echo "0 passed, 1 failed"
    fi
    exit 0
fi
tail -n 5 "$build.log"
echo "fuzz: skipped: neither libFuzzer (clang) nor the standalone driver with ASan + UBSan could be built"
echo "0 passed, 0 failed"
