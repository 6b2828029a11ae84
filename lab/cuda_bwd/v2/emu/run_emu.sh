#!/bin/bash
# run_emu.sh: build and run the CPU emulator of the backward main kernels (v1 and v2) on this
# machine (no GPU needed). Usage (repository root): bash lab/cuda_bwd/v2/emu/run_emu.sh [case-substring]
# EMU_DEFS="-DNAME=value ..." passes lab knobs (e.g. -DFA_BWD2_DQ_BULK=1) to the kernels.
# The v1 header is used as it is, minus its launcher (<<< >>> does not parse in host C++).
set -eu
EMU=${EMU_BUILD:-/tmp/fa_emu_build}
mkdir -p "$EMU/inc/cuda"
# v2 now lives in src/cuda (promoted); copy it next to the stripped v1 header so its plain includes find that
for f in bwd_launch.h bwd_tiles.h fa_tiles.h fa_cuda_common.cuh fa_ptx.cuh bwd_kernel_v2.cuh bwd_tiles_v2.h bwd_launch_v2.h; do cp src/cuda/$f "$EMU/inc/cuda/"; done
: > "$EMU/inc/cuda_runtime.h" # its guard is defined by emu_cuda.h; the file only has to exist
python3 - "$EMU/inc/cuda/bwd_kernel.cuh" <<'PY'
import sys
s = open("src/cuda/bwd_kernel.cuh").read()
a = s.index("/* Launch the main kernel")
b = s.index("#endif /* FA_BWD_KERNEL_CUH */")
open(sys.argv[1], "w").write(s[:a] + s[b:])
PY
g++ -std=c++17 -O2 -g -Wall -Wextra ${EMU_DEFS:-} -Wno-unknown-pragmas -Wno-unused-parameter -Wno-unused-function \
    -I"$EMU/inc" -I"$EMU/inc/cuda" -Iinclude -Isrc -Ilab/cuda_bwd/v2/emu \
    lab/cuda_bwd/v2/emu/emu_bwd.cc lab/cuda_bwd/v2/emu/emu_runtime.cc -o "$EMU/emu_bwd"
"$EMU/emu_bwd" "$@"
