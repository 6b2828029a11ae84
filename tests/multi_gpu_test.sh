#!/bin/bash
# make multi-gpu-test: ring attention (context parallelism) on every GPU of this machine (2 or more;
# nvidia-h200-x2 or larger here).
#
#   bash tests/multi_gpu_test.sh [build|unit|c|ccheck|cbench|check|bench|test|all]   (repository root)
#   default `test` = build, unit, ccheck, check (what `make multi-gpu-test` runs); `all` adds the benches
#
#   build  library + fa_tests for the local GPU (CUDA_ARCHS) with the NCCL transport (build-ring-gpu/), nccl.h from the
#          toolkit or pip's nvidia-nccl wheel (NCCL_HOME)
#   unit   fa_tests ring: the C ring simulated on one GPU (ranks as threads) and the CPU cases
#   c      (= ccheck then cbench; RING_TOKENS="32768 ..." overrides the bench's lengths)
#          tests/multi_gpu/ring_nccl_check.c: the C API over the library's NCCL transport, one thread per
#          GPU (ncclCommInitAll): outputs and gradients against fa_forward / fa_backward on one
#          GPU; then `ring_nccl_check bench`: 32k..256k tokens, 1 GPU vs the ring
#   check  torchrun, one process per GPU: flashattn.ring with the NCCL backend against float64
#          (rule: 2 x plain bf16 attention's error + floor), single-GPU error printed beside it
#   bench  torchrun: time per layer (fwd, bwd) at 32k..256k tokens, 1 GPU vs W GPUs, efficiency
#
# On the H200 pair `test` takes about a minute (build 35 s with 32 cores), `all` about three more.
# A step rebuilds only what changed (build-ring-gpu/ is kept).
#
# NVLink multicast stays off (the device documentation requires it): NCCL_NVLS_ENABLE=0 and the
# PyTorch / NVSHMEM equivalents are exported here and inherited by every process started below.
# Logs and tables go to $OUT/ring (or /tmp/ring). Each step runs even if an earlier one failed;
# the exit status is non-zero if any failed.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
MODE=${1:-test}
OUTDIR=${OUT:-/tmp}/ring
BUILD=${BUILD:-build-ring-gpu}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$OUTDIR"
NGPU=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
echo "multi_gpu_test: $NGPU GPUs; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -12 > "$OUTDIR/topology.txt"
if [ "$NGPU" -lt 2 ]; then
    echo "multi_gpu_test: needs 2 or more GPUs (nvidia-h200-x2 or larger)"
    exit 1
fi

# nccl.h: the toolkit's, else the one of pip's nvidia-nccl wheel (PyTorch's dependency)
if [ -z "${NCCL_HOME:-}" ] && [ ! -f "$CUDA_HOME/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    NCCL_HOME=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null)
fi
export NCCL_HOME=${NCCL_HOME:-}
NCCL_LIBDIR=""
for d in "$NCCL_HOME/lib" "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu; do
    if ls "$d"/libnccl.so* > /dev/null 2>&1; then NCCL_LIBDIR=$d; break; fi
done
echo "multi_gpu_test: NCCL_HOME=${NCCL_HOME:-(toolkit)} libnccl in ${NCCL_LIBDIR:-?}"

rc=0
step() { name=$1; limit=$2; shift 2; t0=$(date +%s)
    timeout "$limit" "$@" > "$OUTDIR/$name.log" 2>&1; s=$?
    echo "== $name: status $s, $(( $(date +%s) - t0 )) s"; tail -n "${TAIL:-40}" "$OUTDIR/$name.log"
    [ $s -eq 0 ] || rc=1; }

if [ "$MODE" = all ] || [ "$MODE" = test ] || [ "$MODE" = build ] || [ ! -f "$BUILD/libflashattn.so" ]; then
    CUDA_ARCHS=${CUDA_ARCHS:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')}
    TAIL=15 step build 400 make BUILD="$BUILD" CUDA_ARCHS="$CUDA_ARCHS" -j"$(nproc)" all "$BUILD/fa_tests"
    grep -q -- "-DFA_HAVE_NCCL" "$OUTDIR/build.log" || echo "multi_gpu_test: WARNING: built without NCCL"
    if [ -n "$NCCL_LIBDIR" ]; then
        TAIL=5 step build_c 60 cc -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -Iinclude -I"$CUDA_HOME/include" \
            ${NCCL_HOME:+-I"$NCCL_HOME/include"} tests/multi_gpu/ring_nccl_check.c "$BUILD/libflashattn.a" \
            -L"$CUDA_HOME/lib64" -L"$NCCL_LIBDIR" -Wl,-rpath,"$NCCL_LIBDIR" -l:libnccl.so.2 -lcudart \
            -lstdc++ -lm -lpthread -ldl -lrt -o "$BUILD/ring_nccl_check"
    fi
fi
if [ "$MODE" = all ] || [ "$MODE" = test ] || [ "$MODE" = unit ]; then
    step unit 300 "./$BUILD/fa_tests" ring
fi
if [ "$MODE" = all ] || [ "$MODE" = test ] || [ "$MODE" = c ] || [ "$MODE" = ccheck ]; then
    step c_check 240 "./$BUILD/ring_nccl_check" check
fi
if [ "$MODE" = all ] || [ "$MODE" = c ] || [ "$MODE" = cbench ]; then
    step c_bench 400 "./$BUILD/ring_nccl_check" bench ${RING_TOKENS:-}
fi
export FLASHATTN_LIB=$PWD/$BUILD/libflashattn.so PYTHONPATH=$PWD/python
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc_per_node="$NGPU")
if [ "$MODE" = all ] || [ "$MODE" = test ] || [ "$MODE" = check ]; then
    step torch_check 400 "${TORCHRUN[@]}" bench/bench_ring.py --check
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    step torch_bench 550 "${TORCHRUN[@]}" bench/bench_ring.py --bench
fi
echo "multi_gpu_test: done (status $rc); logs in $OUTDIR"
exit $rc
