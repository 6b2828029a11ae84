# flashattn: plain Makefile. Needs a C11 compiler, make and pthreads; nvcc is optional.
#
#   make            library (static + shared) and the `flashattn` tool, CUDA included if nvcc is found
#   make run        the main job: `flashattn bench` default sweep on the best device present
#   make test       all tests (unit tests, a short `flashattn check`, sanitizer build, Python tests)
#   make gpu-test   on a machine with an NVIDIA GPU: GPU check sweep, determinism, compute-sanitizer
#   make multi-gpu-test  on a machine with 2+ NVIDIA GPUs: ring attention over NCCL
#   make fuzz       libFuzzer run of the validation promise for FUZZ_SECONDS (tests/fuzz/fuzz.mk)
#   FA_NO_CUDA=1    build without CUDA even when nvcc exists
#   CUDA_ARCHS="80 90"  SASS targets for the portable kernels (default 80 90; PTX for the highest)

CC      ?= cc
BUILD   ?= build
OPT     ?= -O3
SAN     ?=
CFLAGS_COMMON = -std=c11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wshadow -fPIC \
                -fvisibility=hidden -Iinclude -Isrc -I. -D_GNU_SOURCE -pthread $(SAN)
CFLAGS  ?=
ALL_CFLAGS = $(CFLAGS_COMMON) $(CFLAGS)
LDLIBS  = -lm -pthread

UNAME_M := $(shell uname -m)

# ---- CPU sources ------------------------------------------------------------------------------
# src/api: validation and dispatch; src/cpu: the CPU engine; src/ring: ring attention.
# src/cpu/*_avx512.c and *_avx2.c are compiled with their ISA flags and picked at run time;
# on other architectures they are left out and the scalar kernels are used.
LIB_C      := $(wildcard src/api/*.c) $(wildcard src/cpu/*.c) $(wildcard src/ring/*.c)
SIMD512_C  := $(filter %_avx512.c,$(LIB_C))
SIMD2_C    := $(filter %_avx2.c,$(LIB_C))
ifneq ($(filter x86_64 amd64,$(UNAME_M)),)
  AVX512_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mbmi2
  AVX2_FLAGS   = -mavx2 -mfma -mf16c -mbmi2
else
  LIB_C := $(filter-out $(SIMD512_C) $(SIMD2_C),$(LIB_C))
endif

# ---- CUDA -------------------------------------------------------------------------------------
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
ifneq ($(FA_NO_CUDA),)
  NVCC :=
endif
CUDA_ARCHS ?= 80 90
ifneq ($(strip $(NVCC)),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  # src/cuda: host-side planning and launch; common/: PTX wrappers, params, tiles; kernels/: one
  # file per technique and architecture; instances/: generated per-head-dim instantiations.
  CU_SRC    := $(wildcard src/cuda/*.cu src/cuda/common/*.cu src/cuda/kernels/*.cu \
                 src/cuda/instances/*.cu src/ring/*.cu)
  LIB_C     := $(filter-out src/api/fa_cuda_stub.c src/ring/fa_ring_cuda_stub.c,$(LIB_C))
  LAST_ARCH := $(lastword $(CUDA_ARCHS))
  GENCODE   := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
               -gencode arch=compute_$(LAST_ARCH),code=compute_$(LAST_ARCH)
  # Hopper-only kernels (wgmma/TMA/setmaxnreg), src/cuda/kernels/*_sm90*.cu, are built for sm_90a alone.
  GENCODE_SM90A := -gencode arch=compute_90a,code=sm_90a
  SM90A_SRC     := $(wildcard src/cuda/kernels/*_sm90*.cu)
  NVCCFLAGS ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc \
               --expt-relaxed-constexpr -Xptxas=--warn-on-spills
  CUDA_LIBS  = -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs -lcudart -lstdc++ -ldl -lrt
  # NCCL, ring attention's transport (src/ring/ring_nccl.cu): compiled in when nccl.h is found
  # (NCCL_HOME=<dir with include/nccl.h>, e.g. pip's nvidia/nccl, else the toolkit, /usr, /usr/local);
  # libnccl.so.2 itself is opened at run time, so the library does not link it.
  NCCL_H     := $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) \
                  $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
  NCCL_FLAGS := $(if $(NCCL_H),-DFA_HAVE_NCCL $(addprefix -I,$(filter-out /usr/include /usr/local/include \
                  $(CUDA_HOME)/include,$(patsubst %/,%,$(dir $(NCCL_H))))))
else
  CU_SRC    :=
  CUDA_LIBS :=
endif

LIB_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_C)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
# oracle/: the float64 reference and the randomised sweep, shared by the tests and the tool.
ORACLE_C := $(wildcard oracle/*.c)
TOOL_C  := $(wildcard tools/*.c) $(ORACLE_C)
TEST_C  := $(wildcard tests/*.c) $(ORACLE_C)

.PHONY: all lib run test gpu-test multi-gpu-test clean bench check print-cuda-libs print-cuda-include print-nccl-h
all: $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so $(BUILD)/flashattn
lib: $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(GENCODE) -MMD -MP -c $< -o $@
$(patsubst %.cu,$(BUILD)/obj/%.o,$(SM90A_SRC)): GENCODE = $(GENCODE_SM90A)
$(BUILD)/obj/src/ring/ring_nccl.o: NVCCFLAGS += $(NCCL_FLAGS)

$(BUILD)/libflashattn.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libflashattn.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/flashattn: $(patsubst %.c,$(BUILD)/obj/%.o,$(TOOL_C)) $(BUILD)/libflashattn.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)
$(BUILD)/fa_tests: $(patsubst %.c,$(BUILD)/obj/%.o,$(TEST_C)) $(BUILD)/libflashattn.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The GPU test programs, one binary with modes (tests/gpu/main.c); needs a CUDA build.
GPU_TEST_C := $(wildcard tests/gpu/*.c)
$(patsubst %.c,$(BUILD)/obj/%.o,$(GPU_TEST_C)): CFLAGS += -Werror $(if $(CUDA_HOME),-I$(CUDA_HOME)/include)
$(BUILD)/fa_gpu_tests: $(patsubst %.c,$(BUILD)/obj/%.o,$(GPU_TEST_C)) $(BUILD)/libflashattn.a
	$(if $(strip $(NVCC)),,@echo "fa_gpu_tests needs a CUDA build (nvcc not found or FA_NO_CUDA set)"; exit 1)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The main job: the default benchmark sweep (speed-up and memory saving over standard attention).
run: $(BUILD)/flashattn
	./$(BUILD)/flashattn bench

check: $(BUILD)/flashattn
	./$(BUILD)/flashattn check

# All tests. tests/run_all.sh prints the closing line "N passed, N failed".
test:
	@sh tests/run_all.sh

gpu-test:
	@sh tests/gpu_test.sh

# On a machine with 2 or more NVIDIA GPUs: ring attention over NCCL against one GPU and float64.
multi-gpu-test:
	@bash tests/multi_gpu_test.sh test

# nccl.h as the build found it (empty: no NCCL, the ring's NCCL transport is compiled out).
print-nccl-h:
	@echo $(NCCL_H)

# The link flags a program using libflashattn.a needs for the CUDA part (empty without CUDA).
print-cuda-libs:
	@echo $(CUDA_LIBS)

# The CUDA include directory (empty for a CPU-only build): tests/run_all.sh compiles the GPU test
# programs with it, so a change that breaks them fails CI, which has nvcc but no GPU.
print-cuda-include:
	@echo $(if $(strip $(NVCC)),$(CUDA_HOME)/include)

clean:
	rm -rf $(BUILD) build-asan

# The fuzzer (make fuzz) and the concurrent-callers ThreadSanitizer program.
include tests/fuzz/fuzz.mk
include tests/tsan/tsan.mk

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
