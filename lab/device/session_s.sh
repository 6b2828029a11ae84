#!/bin/bash
# Session 3: which kernel and which read does racecheck pair with the LSE2/D st.shared of the
# Hopper backward producer? Full racecheck logs of the small backward path cases.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD=build-dev-256
LINK="$BUILD/libflashattn.a -L$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl -lrt"
cc -std=c11 -O2 -Iinclude -I"$CUDA_HOME/include" tests/gpu/fa_gpu_bwd_paths.c $LINK -o /tmp/bwdpaths || exit 1
timeout 60 compute-sanitizer --tool racecheck --racecheck-report all /tmp/bwdpaths small > "$OUT/race.log" 2>&1
echo "rc=$?"
grep -E "^ok|^FAIL|Race reported|and Read|and Write|RACECHECK SUMMARY" "$OUT/race.log" | sed -E 's/\(CUtensorMap_st.*\)\+/+/' | uniq -c | head -60
