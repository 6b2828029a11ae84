#!/bin/sh
# lab/decode/gpu_check.sh: KV-cache decoding (issue 5) on an NVIDIA GPU, in about 4 minutes after
# the build. Run from the repository root; results go to $OUT (default ./out-decode).
#   1. build (make BUILD=build CUDA_ARCHS=90 -j16 all)
#   2. flashattn check --device cuda --only kvcache: fa_kvcache_forward and fa_merge_states cases
#      against the float64 oracle (quick, then full with another seed)
#   3. python/tests/test_kvcache.py on CUDA (and CPU) through the Python package
#   4. flashattn bench --device cuda --mode decode: bf16, 1 query token, 32 / 8 heads, d = 128,
#      batch x context 1 x 8k, 32 x 8k, 8 x 64k, 128 x 2k, contiguous and pages of 1, 16, 256
#   5. lab/decode/sdpa_decode.py: flashattn (Python) and PyTorch SDPA FLASH_ATTENTION /
#      CUDNN_ATTENTION on the same shapes; prints the combined table last and writes
#      $OUT/decode_results.{md,json}
# Every step runs even if an earlier one failed; the exit status is non-zero if any failed.
set -u
OUT=${OUT:-./out-decode}
BUILD=${BUILD:-build}
mkdir -p "$OUT"
status=0
step() { echo; echo "== $*"; }
note_fail() { echo "gpu_check: FAILED: $*"; status=1; }

step "1. build"
start=$(date +%s)
make BUILD="$BUILD" CUDA_ARCHS="${CUDA_ARCHS:-90}" -j16 all > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; note_fail build; }
echo "build: $(( $(date +%s) - start )) s; warnings: $(grep -c 'warning' "$OUT/build.log")"
"$BUILD/flashattn" version

step "2. flashattn check --device cuda --only kvcache"
timeout 60 "$BUILD/flashattn" check --device cuda --only kvcache --seed 5 > "$OUT/check_quick.txt" 2>&1 || note_fail "check quick"
grep -E 'FAIL|ERROR' "$OUT/check_quick.txt" | head -20
tail -1 "$OUT/check_quick.txt"
timeout 100 "$BUILD/flashattn" check --device cuda --only kvcache --full --seed 6 > "$OUT/check_full.txt" 2>&1 || note_fail "check full"
grep -E 'FAIL|ERROR' "$OUT/check_full.txt" | head -20
grep -c SKIP "$OUT/check_full.txt" | sed 's/^/skipped cases: /'
tail -1 "$OUT/check_full.txt"

step "3. Python kvcache tests (CUDA and CPU)"
FLASHATTN_LIB="$PWD/$BUILD/libflashattn.so" PYTHONPATH="$PWD/python" timeout 120 \
    python3 -m pytest -q -p no:cacheprovider -rs python/tests/test_kvcache.py > "$OUT/pytest_kvcache.txt" 2>&1 \
    || note_fail "pytest test_kvcache.py"
tail -15 "$OUT/pytest_kvcache.txt"

step "4. flashattn bench --device cuda --mode decode"
timeout 150 "$BUILD/flashattn" bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 \
    -b 1,32 --cache-len 8192 --page-size 0,1,16,256 --json > "$OUT/decode_cli.json" 2> "$OUT/decode_cli.err" \
    || note_fail "decode bench (1, 32 x 8k)"
timeout 150 "$BUILD/flashattn" bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 \
    -b 8 --cache-len 65536 --page-size 0,1,16,256 --json >> "$OUT/decode_cli.json" 2>> "$OUT/decode_cli.err" \
    || note_fail "decode bench (8 x 64k)"
timeout 150 "$BUILD/flashattn" bench --device cuda --mode decode --dtype bf16 --hq 32 --hkv 8 -d 128 \
    -b 128 --cache-len 2048 --page-size 0,1,16,256 --json >> "$OUT/decode_cli.json" 2>> "$OUT/decode_cli.err" \
    || note_fail "decode bench (128 x 2k)"
cat "$OUT/decode_cli.err"
# the same, split-KV off, to see what the heuristic buys at batch 1
timeout 60 "$BUILD/flashattn" bench --device cuda --mode decode -b 1 --cache-len 8192,65536 --splits 1 \
    > "$OUT/decode_cli_nosplit.txt" 2>&1 || note_fail "decode bench without splits"
cat "$OUT/decode_cli_nosplit.txt"

step "5. PyTorch SDPA on the same shapes, and the table"
FLASHATTN_LIB="$PWD/$BUILD/libflashattn.so" PYTHONPATH="$PWD/python" timeout 150 \
    python3 lab/decode/sdpa_decode.py --out "$OUT" --cli-json "$OUT/decode_cli.json" > "$OUT/sdpa_decode.log" 2>&1 \
    || note_fail "sdpa_decode.py"
sed -n '/^# Decode attention/,$p' "$OUT/sdpa_decode.log"
[ -s "$OUT/decode_results.md" ] || tail -20 "$OUT/sdpa_decode.log"
echo "gpu_check: $( [ $status -eq 0 ] && echo all steps passed || echo some step FAILED ); results in $OUT"
exit $status
