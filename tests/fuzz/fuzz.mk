# fuzz.mk - builds the libFuzzer harnesses tests/fuzz/fuzz_*.c.  Run by scripts/fuzz.sh from the
# repository root; by hand:
#
#     make -f tests/fuzz/fuzz.mk W=build-fuzz -j2 [HARNESSES="conf journal"]
#
# Every source of proto/, rules/ and offline/ (the journal tools) is compiled once, with
# coverage instrumentation and ASan/UBSan, into one static library; each harness links against
# it and so takes only the objects it needs.  The journal's C code is generated into $(W)/gen
# by protoc-c, as CMake does into build/proto/.  -MMD keeps the build incremental.

W ?= build-fuzz
FUZZ_CC ?= clang
PROTOC_C ?= protoc-c
HARNESSES ?= $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wwrite-strings -Wformat=2 \
        -Wno-format-nonliteral
CFLAGS := -g -O1 -std=c11 -D_GNU_SOURCE -I. -I$(W)/gen $(SAN) -MMD -MP
LIBS := -ljansson -lprotobuf-c

GEN_C := $(W)/gen/proto/journal/journal.pb-c.c
# offline/: the journal tools, which need neither libevent nor OpenSSL.
LIB_SRC := $(wildcard proto/*.c proto/*/*.c rules/*.c offline/*.c)
LIB_OBJ := $(patsubst %.c,$(W)/obj/%.o,$(LIB_SRC)) $(W)/obj/gen/journal.pb-c.o
LIB := $(W)/libtwice_fuzz.a
BINS := $(patsubst %,$(W)/bin/fuzz_%,$(HARNESSES))

.PHONY: all
all: $(BINS)

# Keep the harness objects (make would delete them as intermediates) and never keep a half
# written file.
.SECONDARY:
.DELETE_ON_ERROR:

$(GEN_C): proto/journal/journal.proto
	@mkdir -p $(W)/gen
	$(PROTOC_C) --proto_path=. --c_out=$(W)/gen proto/journal/journal.proto

# Every object may include the generated header.
$(W)/obj/%.o: %.c | $(GEN_C)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CFLAGS) $(WARN) -fsanitize=fuzzer-no-link -c $< -o $@

# Generated code is not ours to fix: no warnings of ours.
$(W)/obj/gen/journal.pb-c.o: $(GEN_C)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(LIB): $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(W)/bin/fuzz_%: $(W)/obj/tests/fuzz/fuzz_%.o $(LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(SAN) -fsanitize=fuzzer $< $(LIB) $(LIBS) -o $@

-include $(shell find $(W)/obj -name '*.d' 2>/dev/null)
