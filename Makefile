# Thin wrapper around CMake.  `make test` and `make demo` are the two commands
# of the README: each installs what is missing, builds, and runs.

BUILD ?= build
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build deps test demo clean format format-check

all: build

deps:
	@scripts/deps.sh all

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo:
	@scripts/deps.sh demo
	@$(MAKE) --no-print-directory build >/dev/null 2>&1 || $(MAKE) --no-print-directory build
	@scripts/demo.sh $(BUILD)/twice

format:
	clang-format -i proxy/*.[ch] rules/*.[ch] proto/*.[ch] tests/unit/*.c

format-check:
	clang-format --dry-run --Werror proxy/*.[ch] rules/*.[ch] proto/*.[ch] tests/unit/*.c

clean:
	rm -rf $(BUILD)
