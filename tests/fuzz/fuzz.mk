# tests/fuzz/fuzz.mk: the fuzzer (tests/fuzz/fa_fuzz.c), included by the Makefile.
#
#   make fuzz                 build $(FUZZ_BUILD)/fa_fuzz (clang, libFuzzer, ASan + UBSan) and run it
#                             for FUZZ_SECONDS (default 900) from tests/fuzz/corpus; new inputs go to
#                             $(FUZZ_BUILD)/corpus, findings (crash-*, leak-*) to $(FUZZ_BUILD)/
#   make fuzz-build           the libFuzzer binary only (fails if clang has no libFuzzer)
#   make fuzz-standalone      $(FUZZ_BUILD)/fa_fuzz_standalone: the same harness with a replay main,
#                             any C compiler, ASan + UBSan (used when libFuzzer is missing)
#   make fuzz-unit-tests      $(FUZZ_BUILD)/lib/fa_tests: the unit tests on the fuzzer's library, so
#                             make test's sanitizer stage and fuzzer share one sanitizer build
# The library is compiled again for it (clang, -O1, sanitizers, no CUDA) in $(FUZZ_BUILD)/lib.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 900
FUZZ_JOBS    ?= 1   # > 1: parallel workers (libFuzzer then logs to fuzz-N.log)
FUZZ_SAN      = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

# make in $(FUZZ_BUILD)/lib with the fuzzer's compiler and flags (coverage for libFuzzer, no main)
FUZZ_LIB_MAKE = $(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD)/lib CC=$(FUZZ_CC) OPT=-O1 FA_NO_CUDA=1 \
                SAN="$(FUZZ_SAN) -fsanitize=fuzzer-no-link"

.PHONY: fuzz fuzz-build fuzz-standalone fuzz-unit-tests
fuzz-build:
	$(FUZZ_LIB_MAKE) $(FUZZ_BUILD)/lib/libflashattn.a
	$(FUZZ_CC) -std=c11 -O1 -g -D_GNU_SOURCE -Iinclude $(FUZZ_SAN) -fsanitize=fuzzer \
	    tests/fuzz/fa_fuzz.c $(FUZZ_BUILD)/lib/libflashattn.a -lm -pthread -o $(FUZZ_BUILD)/fa_fuzz

fuzz-unit-tests:
	$(FUZZ_LIB_MAKE) $(FUZZ_BUILD)/lib/fa_tests

fuzz-standalone:
	$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD)/lib-standalone OPT=-O1 FA_NO_CUDA=1 \
	    SAN="$(FUZZ_SAN)" $(FUZZ_BUILD)/lib-standalone/libflashattn.a
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE -DFA_FUZZ_STANDALONE -Iinclude $(FUZZ_SAN) \
	    tests/fuzz/fa_fuzz.c $(FUZZ_BUILD)/lib-standalone/libflashattn.a -lm -pthread \
	    -o $(FUZZ_BUILD)/fa_fuzz_standalone

fuzz: fuzz-build
	@mkdir -p $(FUZZ_BUILD)/corpus
	$(abspath $(FUZZ_BUILD))/fa_fuzz -max_total_time=$(FUZZ_SECONDS) \
	    $(if $(filter-out 1,$(FUZZ_JOBS)),-jobs=$(FUZZ_JOBS) -workers=$(FUZZ_JOBS)) \
	    -max_len=512 -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus tests/fuzz/corpus
