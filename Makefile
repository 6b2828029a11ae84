# flashattn: plain Makefile. Needs a C11 compiler, make and pthreads; nvcc is optional.
#
#   make            library (static + shared) and the `flashattn` tool, CUDA included if nvcc is found
#   make run        the main job: `flashattn bench` default sweep on the best device present
#                   (builds in parallel; CUDA kernels only when a GPU is present or FA_CUDA=1)
#   make install    PREFIX=/usr/local (DESTDIR too): header, libraries, tool, pkg-config, CMake
#   make wheel      the Python package as a wheel carrying the library (dist/; FA_CUDA=1: CUDA)
#   make test       all tests (unit tests, a short `flashattn check`, sanitizer build, Python tests)
#   make gpu-test   on a machine with an NVIDIA GPU: GPU check sweep, determinism, compute-sanitizer
#   make multi-gpu-test  on a machine with 2+ NVIDIA GPUs: ring attention over NCCL
#   make fuzz       libFuzzer run of the validation promise for FUZZ_SECONDS (tests/fuzz/fuzz.mk)
#   FA_NO_CUDA=1    build without CUDA even when nvcc exists
#   V=1             ptxas spill warnings for `make run` and the Python build too (make, make lib
#                   and make test always show them)
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

# The architecture the compiler targets (so CC=aarch64-linux-gnu-gcc cross-builds for AArch64).
CC_ARCH := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null)) $(shell uname -m))

# The version has one source, include/flashattn.h's FA_VERSION_MAJOR/MINOR/PATCH; the shared
# library's soname changes with the major version.
fa_version_part = $(shell sed -n 's/^.define FA_VERSION_$(1)  *\([0-9][0-9]*\).*/\1/p' include/flashattn.h)
FA_VERSION_MAJOR := $(call fa_version_part,MAJOR)
FA_VERSION := $(FA_VERSION_MAJOR).$(call fa_version_part,MINOR).$(call fa_version_part,PATCH)
FA_SONAME  := libflashattn.so.$(FA_VERSION_MAJOR)

# ---- CPU sources ------------------------------------------------------------------------------
# src/api: validation and dispatch; src/cpu: the CPU engine; src/ring: ring attention.
# src/cpu/*_avx512.c and *_avx2.c are compiled with their ISA flags and picked at run time on
# x86-64; src/cpu/*_neon.c on AArch64 (NEON is part of the base ISA there: no extra flags), and
# *_sve256.c with the SVE flags. On other architectures all are left out and the scalar kernels
# are used.
LIB_C      := $(wildcard src/api/*.c) $(wildcard src/cpu/*.c) $(wildcard src/ring/*.c)
SIMD512_C  := $(filter %_avx512.c,$(LIB_C))
SIMD2_C    := $(filter %_avx2.c,$(LIB_C))
ARM_C      := $(filter %_neon.c %_sve256.c,$(LIB_C))
ifneq ($(filter x86_64 amd64,$(CC_ARCH)),)
  AVX512_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mbmi2
  AVX2_FLAGS   = -mavx2 -mfma -mf16c -mbmi2
  LIB_C := $(filter-out $(ARM_C),$(LIB_C))
else ifneq ($(filter aarch64 arm64,$(CC_ARCH)),)
  # 256-bit SVE, fixed length (kernels_sve256.c; selected at run time only on such CPUs)
  SVE256_FLAGS = -march=armv8.2-a+sve -msve-vector-bits=256
  # BFDOT (gemm_bf16_neon.c; called only on CPUs with the BF16 extension)
  BF16_NEON_FLAGS = -march=armv8.2-a+bf16
  LIB_C := $(filter-out $(SIMD512_C) $(SIMD2_C),$(LIB_C))
else
  LIB_C := $(filter-out $(SIMD512_C) $(SIMD2_C) $(ARM_C),$(LIB_C))
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
  # CUDA_PTX_ONLY=1 embeds PTX only, without running ptxas (make test: a compile check on a machine
  # without a GPU; make gpu-test builds and runs the machine code). Nothing runs that PTX, so the
  # device optimiser (cicc) runs at -O1: the front end's diagnostics are the same, the build half.
  ifneq ($(strip $(CUDA_PTX_ONLY)),)
    GENCODE       := -gencode arch=compute_$(LAST_ARCH),code=compute_$(LAST_ARCH) -Xcicc -O1
    GENCODE_SM90A := -gencode arch=compute_90a,code=compute_90a -Xcicc -O1
  endif
  SM90A_SRC     := $(wildcard src/cuda/kernels/*_sm90*.cu)
  NVCCFLAGS ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc \
               --expt-relaxed-constexpr $(PTXAS_WARN)
  # Register spills are reported for developers (make, make test); the user-facing builds
  # (make run, pip) pass PTXAS_WARN= because the reported spills are known and measured.
  PTXAS_WARN ?= -Xptxas=--warn-on-spills
  # CUDART=static links the CUDA runtime into the library (the wheel does: it then needs only
  # the driver, whatever CUDA runtime torch brings).
  CUDART    ?= shared
  CUDA_LIBS  = -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs \
               $(if $(filter static,$(CUDART)),-lcudart_static -pthread,-lcudart) -lstdc++ -ldl -lrt
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

# PORTABLE_GLIBC=1 (x86-64, the Python wheel): the library's C code binds to glibc 2.17-era symbol
# versions (packaging/glibc_compat.h) so it loads on older systems than the one it is built on.
ifneq ($(PORTABLE_GLIBC),)
  ALL_CFLAGS += -include packaging/glibc_compat.h
  LDLIBS     += -Wl,--push-state,--no-as-needed -l:libpthread.so.0 -Wl,--pop-state
endif

LIB_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_C)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
# oracle/: the float64 reference and the randomised sweep, shared by the tests and the tool.
ORACLE_C := $(wildcard oracle/*.c)
TOOL_C  := $(wildcard tools/*.c) $(ORACLE_C)
TEST_C  := $(wildcard tests/*.c) $(ORACLE_C)

.PHONY: all lib run test gpu-test multi-gpu-test clean bench check print-cuda-libs print-cuda-include print-nccl-h \
        install uninstall wheel print-version
all: $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so $(BUILD)/flashattn
lib: $(BUILD)/libflashattn.a $(BUILD)/libflashattn.so

# decode_avx512.c again, with its int8 scores on AVX512-VNNI (picked at run time on such CPUs) and,
# where the compiler knows AVX512-BF16, a bf16 cache's scores by vdpbf16ps (used on CPUs with it)
AVX512_BF16_FLAG := $(shell $(CC) -mavx512bf16 -E -x c /dev/null >/dev/null 2>&1 && echo -mavx512bf16)
$(BUILD)/obj/src/cpu/decode_vnni_avx512.o: AVX512_FLAGS += -mavx512vnni $(AVX512_BF16_FLAG)
$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_sve256.o: %_sve256.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SVE256_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_bf16_neon.o: %_bf16_neon.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(BF16_NEON_FLAGS) -MMD -MP -c $< -o $@
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
# The shared library carries its soname (libflashattn.so.0); the link next to it lets programs
# linked against $(BUILD)/ run from there. make install names the file libflashattn.so.$(FA_VERSION).
$(BUILD)/libflashattn.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(FA_SONAME) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)
	@ln -sf libflashattn.so $(BUILD)/$(FA_SONAME)

$(BUILD)/flashattn: $(patsubst %.c,$(BUILD)/obj/%.o,$(TOOL_C)) $(BUILD)/libflashattn.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)
$(BUILD)/fa_tests: $(patsubst %.c,$(BUILD)/obj/%.o,$(TEST_C)) $(BUILD)/libflashattn.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The GPU test programs, one binary with modes (tests/gpu/main.c), with the float64 oracle;
# needs a CUDA build.
GPU_TEST_C := $(wildcard tests/gpu/*.c)
$(patsubst %.c,$(BUILD)/obj/%.o,$(GPU_TEST_C)): CFLAGS += -Werror $(if $(CUDA_HOME),-I$(CUDA_HOME)/include)
$(BUILD)/fa_gpu_tests: $(patsubst %.c,$(BUILD)/obj/%.o,$(GPU_TEST_C) $(ORACLE_C)) $(BUILD)/libflashattn.a
	$(if $(strip $(NVCC)),,@echo "fa_gpu_tests needs a CUDA build (nvcc not found or FA_NO_CUDA set)"; exit 1)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The main job: the default benchmark sweep (speed-up and memory saving over standard attention).
# It builds what it runs, in parallel (-j$(RUN_JOBS) unless make was given -j): the CPU library
# and tool in $(RUN_CPU_BUILD)/, or, when nvidia-smi lists a GPU or FA_CUDA=1 asks for it, the
# CUDA kernels too in $(BUILD)/. FA_CUDA=0 or FA_NO_CUDA=1: CPU even with a GPU.
RUN_JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
RUN_CPU_BUILD ?= $(BUILD)-cpu
RUN_MAKE       = $(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(RUN_JOBS)) \
                 $(if $(V),,PTXAS_WARN=)
run:
	@if [ "$(FA_CUDA)" = 1 ] && [ -z "$(strip $(NVCC))" ]; then \
	    echo "make run: FA_CUDA=1 but nvcc was not found (set NVCC=/path/to/nvcc)"; exit 1; fi; \
	if [ "$(FA_CUDA)" = 1 ] || { [ -z "$(FA_NO_CUDA)" ] && [ "$(FA_CUDA)" != 0 ] && \
	        [ -n "$(strip $(NVCC))" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then \
	    dir=$(BUILD); \
	    echo "make run: building the library with its CUDA kernels and the flashattn tool in $$dir/" \
	         "(a few minutes the first time; FA_CUDA=0: CPU only)"; \
	    $(RUN_MAKE) BUILD=$$dir $$dir/flashattn || exit 1; \
	else \
	    dir=$(RUN_CPU_BUILD); \
	    echo "make run: building the CPU library and the flashattn tool in $$dir/" \
	         "($(if $(strip $(NVCC)),no GPU found: CUDA kernels not built; FA_CUDA=1 builds them,nvcc not found: CPU only))"; \
	    $(RUN_MAKE) BUILD=$$dir FA_NO_CUDA=1 $$dir/flashattn || exit 1; \
	fi; \
	echo "make run: ./$$dir/flashattn bench"; \
	./$$dir/flashattn bench

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

# ---- install ----------------------------------------------------------------------------------
# make install PREFIX=/usr/local [DESTDIR=/staging]: include/flashattn.h, libflashattn.a,
# libflashattn.so.$(FA_VERSION) with the links .so.$(FA_VERSION_MAJOR) and .so, the flashattn tool,
# lib/pkgconfig/flashattn.pc and lib/cmake/flashattn/ (find_package(flashattn), target
# flashattn::flashattn). The paths written into the pkg-config and CMake files leave DESTDIR out;
# the CMake files locate the tree relative to themselves.
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
CMAKEDIR     ?= $(LIBDIR)/cmake/flashattn
INSTALL      ?= install
fa_empty :=
fa_space := $(fa_empty) $(fa_empty)
# What a static link needs besides the library (the CUDA part without the driver stubs).
FA_STATIC_LIBS := $(filter-out -L%/stubs,$(CUDA_LIBS))
fa_relative = $(shell realpath -m --relative-to='$(1)' '$(2)')
fa_prefixed = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))

install: all
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(CMAKEDIR)
	$(INSTALL) -m 644 include/flashattn.h $(DESTDIR)$(INCLUDEDIR)/flashattn.h
	$(INSTALL) -m 644 $(BUILD)/libflashattn.a $(DESTDIR)$(LIBDIR)/libflashattn.a
	$(INSTALL) -m 755 $(BUILD)/libflashattn.so $(DESTDIR)$(LIBDIR)/libflashattn.so.$(FA_VERSION)
	ln -sf libflashattn.so.$(FA_VERSION) $(DESTDIR)$(LIBDIR)/$(FA_SONAME)
	ln -sf $(FA_SONAME) $(DESTDIR)$(LIBDIR)/libflashattn.so
	$(INSTALL) -m 755 $(BUILD)/flashattn $(DESTDIR)$(BINDIR)/flashattn
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(call fa_prefixed,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(call fa_prefixed,$(INCLUDEDIR))|' -e 's|@VERSION@|$(FA_VERSION)|' \
	    -e 's|@LIBS_PRIVATE@|$(strip -lm -pthread $(FA_STATIC_LIBS))|' \
	    packaging/flashattn.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/flashattn.pc
	sed -e 's|@VERSION@|$(FA_VERSION)|g' -e 's|@SOVERSION@|$(FA_VERSION_MAJOR)|g' \
	    -e 's|@LIBDIR_FROM_CMAKEDIR@|$(call fa_relative,$(CMAKEDIR),$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR_FROM_CMAKEDIR@|$(call fa_relative,$(CMAKEDIR),$(INCLUDEDIR))|' \
	    -e 's|@WITH_CUDA@|$(if $(strip $(NVCC)),ON,OFF)|' \
	    -e 's|@STATIC_LINK_DIRS@|$(subst $(fa_space),;,$(patsubst -L%,%,$(filter -L%,$(FA_STATIC_LIBS))))|' \
	    -e 's|@STATIC_LINK_LIBS@|$(subst $(fa_space),;,$(patsubst -l%,%,$(filter -l%,$(FA_STATIC_LIBS))))|' \
	    packaging/flashattnConfig.cmake.in > $(DESTDIR)$(CMAKEDIR)/flashattnConfig.cmake
	sed -e 's|@VERSION@|$(FA_VERSION)|g' -e 's|@SOVERSION@|$(FA_VERSION_MAJOR)|g' \
	    packaging/flashattnConfigVersion.cmake.in > $(DESTDIR)$(CMAKEDIR)/flashattnConfigVersion.cmake

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/flashattn.h $(DESTDIR)$(LIBDIR)/libflashattn.a \
	    $(DESTDIR)$(LIBDIR)/libflashattn.so.$(FA_VERSION) $(DESTDIR)$(LIBDIR)/$(FA_SONAME) \
	    $(DESTDIR)$(LIBDIR)/libflashattn.so $(DESTDIR)$(BINDIR)/flashattn \
	    $(DESTDIR)$(PKGCONFIGDIR)/flashattn.pc $(DESTDIR)$(CMAKEDIR)/flashattnConfig.cmake \
	    $(DESTDIR)$(CMAKEDIR)/flashattnConfigVersion.cmake
	-rmdir $(DESTDIR)$(CMAKEDIR) 2>/dev/null

print-version:
	@echo $(FA_VERSION)

# ---- wheel --------------------------------------------------------------------------------------
# The Python package as a wheel that carries the compiled library (python/setup.py builds it with
# this Makefile): CPU engine by default, FA_CUDA=1 adds the CUDA kernels (sm80, sm90, sm90a;
# the CUDA runtime linked in statically). Written to $(WHEEL_DIR)/.
PYTHON    ?= python3
WHEEL_DIR ?= dist
# e.g. --no-build-isolation on a machine without a package index (setuptools already installed)
WHEEL_PIP_FLAGS ?=
wheel:
	FLASHATTN_CUDA=$(if $(filter 1,$(FA_CUDA)),1,0) $(PYTHON) -m pip wheel --no-deps $(WHEEL_PIP_FLAGS) \
	    -w $(WHEEL_DIR) ./python

clean:
	rm -rf $(BUILD) build-asan

# The fuzzer (make fuzz) and the concurrent-callers ThreadSanitizer program.
include tests/fuzz/fuzz.mk
include tests/tsan/tsan.mk

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
