# tests/tsan/tsan.mk: concurrent callers under ThreadSanitizer (tests/tsan/tsan_callers.c),
# included by the Makefile. `make tsan-test` builds the library with -fsanitize=thread in
# $(TSAN_BUILD) (no CUDA, -O1) and runs the program; `make test` runs it too.
TSAN_BUILD ?= build-tsan

.PHONY: tsan-test
$(TSAN_BUILD)/tsan_callers: tests/tsan/tsan_callers.c $(TSAN_BUILD)/libflashattn.a
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE -Iinclude -fsanitize=thread tests/tsan/tsan_callers.c \
	    $(TSAN_BUILD)/libflashattn.a -lm -pthread -o $@

ifeq ($(BUILD),$(TSAN_BUILD))
else
$(TSAN_BUILD)/libflashattn.a: FORCE_TSAN_LIB
	$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) OPT=-O1 FA_NO_CUDA=1 SAN=-fsanitize=thread \
	    $(TSAN_BUILD)/libflashattn.a
.PHONY: FORCE_TSAN_LIB
endif

tsan-test: $(TSAN_BUILD)/tsan_callers
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)" ./$(TSAN_BUILD)/tsan_callers
