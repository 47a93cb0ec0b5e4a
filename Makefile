# Thin wrapper around CMake.  `make test` and `make demo` are the two commands
# of the README: each installs what is missing, builds, and runs.

BUILD ?= build
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build deps test test-normal test-asan test-tsan fuzz bench demo clean format format-check \
	install deb transparency

all: build

deps:
	@scripts/deps.sh all

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# `make test`: the house format (clang-format, .clang-format), the unit tests
# and NORMAL_TESTS on the normal (optimised, LTO) build, the whole suite on an
# ASan+UBSan build (any report fails the run: twice exits non-zero on a leak,
# aborts on an error), the tests that drive several threads at once on a
# ThreadSanitizer build, then every fuzz harness for a short smoke run.  The
# integration suite runs once, sanitized: its tests wait on brokers and
# frameworks, not on twice's CPU, so a second run on the normal build would
# double the time (about 9 minutes on two cores) for the same behaviour;
# `make test-normal` runs it there too.
NORMAL_TESTS ?= ^unit/|^integration/test_bytes$$|^integration/test_verdict_e2e$$
test:
	@scripts/deps.sh test
	$(MAKE) format-check
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -R '$(NORMAL_TESTS)'
	$(MAKE) test-asan
	$(MAKE) test-tsan
	scripts/fuzz.sh $(FUZZ_SMOKE_SECONDS)

ASAN_BUILD ?= build-asan
FUZZ_SMOKE_SECONDS ?= 10
FUZZ_SECONDS ?= 300
SAN_ENV = TWICE_SANITIZED=1 \
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:quarantine_size_mb=16:malloc_context_size=10 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# The whole suite on the normal build.
test-normal: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan:
	cmake -S . -B $(ASAN_BUILD) -DTWICE_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS)

# twice built with ThreadSanitizer under the integration tests where sessions
# of several threads share rules, the Redis id map and the journal.  A data
# race aborts twice (halt_on_error) and writes a report under $(TSAN_BUILD)/:
# the run fails on a failed test or on any report, even one a test did not
# notice.
TSAN_BUILD ?= build-tsan
TSAN_TESTS ?= test_threads test_resp_frameworks test_conservation
TSAN_ENV = TWICE_SANITIZED=1 \
	TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1:log_path=$(CURDIR)/$(TSAN_BUILD)/tsan-report

test-tsan:
	cmake -S . -B $(TSAN_BUILD) -DTWICE_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target twice
	rm -f $(TSAN_BUILD)/tsan-report.*
	set -e; for t in $(TSAN_TESTS); do \
		$(TSAN_ENV) TWICE_BIN=$(CURDIR)/$(TSAN_BUILD)/twice \
			/usr/bin/python3 tests/integration/$$t.py; \
	done
	@if ls $(TSAN_BUILD)/tsan-report.* >/dev/null 2>&1; then \
		cat $(TSAN_BUILD)/tsan-report.*; echo "ThreadSanitizer reports above"; exit 1; fi

# Redis's whole test suite (external mode, `--tags -slow`) direct and through twice's tcp and
# resp listeners, one resp listener per profile of PEERS_PROFILES, the results compared test by
# test (tests/integration/test_peers_redis.py; `make test` runs a short list of its units
# through tcp, resp and resp+list).  About 8 minutes on two cores.
PEERS_PROFILES ?= list streams sidekiq celery rq bullmq
transparency:
	@scripts/deps.sh test
	$(MAKE) build
	TWICE_PEERS_FULL=1 TWICE_PEERS_PROFILES="$(PEERS_PROFILES)" TWICE_BIN=$(CURDIR)/$(BUILD)/twice \
		TWICE_SOURCE_DIR=$(CURDIR) /usr/bin/python3 tests/integration/test_peers_redis.py

# Every libFuzzer harness for FUZZ_SECONDS each (scripts/fuzz.sh).
fuzz:
	scripts/fuzz.sh $(FUZZ_SECONDS)

# Side-by-side benchmarks (bench/run.py): direct, HAProxy, twice tcp / parsing /
# with faults; BENCH_FLAGS=--quick for a short run.  Results in build/bench.
bench:
	@scripts/deps.sh bench
	$(MAKE) build
	$(MAKE) -C bench OUT=$(CURDIR)/$(BUILD)/bench/bin
	/usr/bin/python3 bench/run.py --twice $(BUILD)/twice --out $(BUILD)/bench $(BENCH_FLAGS)

demo:
	@scripts/deps.sh demo
	@$(MAKE) --no-print-directory build >/dev/null 2>&1 || $(MAKE) --no-print-directory build
	@scripts/demo.sh $(BUILD)/twice

# `make install`: the binary, man pages, bash completion, systemd unit and the default
# configuration under PREFIX (cmake/install.cmake); DESTDIR=DIR stages them under DIR.
# Installing never creates the `twice` user (the package does): `systemd-sysusers` or
# `adduser --system --group twice` does, before `systemctl enable --now twice`.
PREFIX ?= /usr/local
install:
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS) --target twice
	DESTDIR=$(DESTDIR) cmake --install $(BUILD)

# `make deb`: $(DEB_BUILD)/twice_VERSION_ARCH.deb, built by CPack's DEB generator in a tree of
# its own configured for /usr (configuration in /etc/twice), with dpkg-shlibdeps for the
# dependencies (docs/building.md).
DEB_BUILD ?= build-deb
deb:
	@scripts/deps.sh package
	cmake -S . -B $(DEB_BUILD) -DCMAKE_INSTALL_PREFIX=/usr -DTWICE_TESTS=OFF $(CMAKE_FLAGS)
	cmake --build $(DEB_BUILD) -j $(JOBS) --target twice
	cd $(DEB_BUILD) && cpack -G DEB
	@ls $(DEB_BUILD)/twice_*.deb

format:
	clang-format -i $$(find proxy proto -name "*.[ch]") offline/*.[ch] rules/*.[ch] tests/unit/*/*.c tests/lib/*.h

format-check:
	clang-format --dry-run --Werror $$(find proxy proto -name "*.[ch]") offline/*.[ch] rules/*.[ch] tests/unit/*/*.c tests/lib/*.h

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-fuzz $(DEB_BUILD)
