#!/bin/bash
# Session 5 (nvidia-h200-x2): (A) make multi-gpu-test after the move out of lab/ring, then the
# torch ring bench again (warm-up fixed); (B) issue 6: energy per FLOP of ours / cuDNN / cuBLAS
# GEMM under sustained load (GPU 0); (C) ncu of ours vs cuDNN at d128 s2k causal / non-causal.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/ringout; mkdir -p $R
OUT=$R bash tests/multi_gpu_test.sh test > "$OUT/ring_test.txt" 2>&1; echo "ring test status $?"
OUT=$R bash tests/multi_gpu_test.sh bench > "$OUT/ring_bench.txt" 2>&1; echo "ring bench status $?"
tar czf "$OUT/ring_logs.tgz" -C $R ring
export FLASHATTN_LIB=$PWD/build-ring-gpu/libflashattn.so PYTHONPATH=$PWD/python CUDA_VISIBLE_DEVICES=0
timeout 200 python3 lab/hopper/power/energy.py --seconds 2 > "$OUT/energy.txt" 2>&1; echo "energy status $?"
M="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active"
M="$M,regex:sm__pipe_tensor_op.*cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_tensor.*sum"
M="$M,sm__ops_path_tensor_src_bf16_dst_fp32.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg,launch__grid_size,launch__registers_per_thread"
timeout 200 ncu --clock-control none -k regex:"hopper|sdpa|fprop|fmha|flash" --metrics "$M" \
    python3 lab/hopper/power/ncu_fwd.py > "$OUT/ncu.txt" 2>&1; echo "ncu status $?"
grep -A8 "ring fwd\|correctness" "$OUT/ring_test.txt" | head -30
grep -B2 -A8 "scaling" "$OUT/ring_bench.txt"
grep -c "PASS\|ok" "$OUT/ring_test.txt"
grep "status" "$OUT/ring_test.txt"
cat "$OUT/energy.txt" | tail -35
grep -E "^  [a-zA-Z_]|^    [a-z]" "$OUT/ncu.txt" | grep -v "^    ---" | cut -c1-150 | head -120
