#!/usr/bin/env bash
# fuzz.sh - builds twice's libFuzzer harnesses (tests/fuzz/fuzz_*.c) and runs each for a while.
#
#   scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]
#
#   SECONDS_PER_HARNESS   how long each harness runs (libFuzzer -max_total_time); default 60
#   HARNESS               amqp, amqp_plan, resp, resp_profile, conf, journal, resp_job, ledger, jobs, toxic, hmap (default: every
#                         tests/fuzz/fuzz_*.c), one after the other
#
# Needs only Debian packages: clang, libclang-rt-14-dev (libFuzzer's runtime), libjansson-dev,
# libprotobuf-c-dev, protobuf-c-compiler (and make).  `scripts/deps.sh test` installs them.
#
# Environment:
#   TWICE_FUZZ_DIR    work directory (default: build-fuzz/ in the repository): the build, and
#                     per harness run/<harness>/ with its scratch corpus, log and artifacts
#   TWICE_FUZZ_JOBS   parallel compiles (default 2)
#   TWICE_FUZZ_CC     compiler (default clang)
#   TWICE_FUZZ_ARGS   extra libFuzzer flags, e.g. "-seed=1"
#
# Each run starts from a fresh copy of tests/fuzz/corpus/<harness>/ (the committed seeds are
# never written to) and uses tests/fuzz/<harness>.dict when there is one.  Prints, per harness,
# the executions, exec/s and coverage reached.  Exits 1 when any harness crashed, leaked, ran
# out of memory or timed out on an input, naming the reproducer; rerun it with
#   TWICE_FUZZ_DIR/bin/fuzz_<harness> REPRODUCER
# Exits 2 on a usage or build error.  Safe to run again: the build is incremental.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
    echo "usage: $0 [SECONDS_PER_HARNESS] [HARNESS...]" >&2
    exit 2
fi
shift $(($# > 0 ? 1 : 0))

work=${TWICE_FUZZ_DIR:-$root/build-fuzz}
mkdir -p "$work"
work=$(cd "$work" && pwd)
cc=${TWICE_FUZZ_CC:-clang}
jobs=${TWICE_FUZZ_JOBS:-2}

all=()
for src in tests/fuzz/fuzz_*.c; do
    name=${src#tests/fuzz/fuzz_}
    all+=("${name%.c}")
done
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
    harnesses=("${all[@]}")
fi
for h in "${harnesses[@]}"; do
    if [ ! -f "tests/fuzz/fuzz_$h.c" ]; then
        echo "fuzz: no harness '$h' (have: ${all[*]})" >&2
        exit 2
    fi
done

# ---- tools -------------------------------------------------------------------------------

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "fuzz: '$1' not found (Debian package $2)" >&2
        exit 2
    fi
}
need "$cc" clang
need protoc-c protobuf-c-compiler
need make make
runtime="$("$cc" -print-resource-dir)/lib/linux/libclang_rt.fuzzer-$(uname -m).a"
if [ ! -f "$runtime" ]; then
    echo "fuzz: libFuzzer's runtime $runtime is missing (Debian package libclang-rt-14-dev)" >&2
    exit 2
fi

# ---- build -------------------------------------------------------------------------------

echo "fuzz: building ${harnesses[*]} in $work"
build_start=$(date +%s)
if ! make --no-print-directory -s -f tests/fuzz/fuzz.mk -j"$jobs" W="$work" FUZZ_CC="$cc" \
    HARNESSES="${harnesses[*]}" >"$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    echo "fuzz: build failed" >&2
    exit 2
fi
echo "fuzz: built in $(($(date +%s) - build_start)) s"

# ---- run ---------------------------------------------------------------------------------

# One value of libFuzzer's -print_final_stats output, or "?".
final_stat() {
    local v
    v=$(sed -n "s/^stat::$1: *//p" "$2" | tail -n 1)
    echo "${v:-?}"
}

# "cov: N ft: N corp: N/SIZE" from the last status line.
coverage() {
    local line
    line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$1" | tail -n 1 || true)
    sed -nE 's/.*(cov: [0-9]+) (ft: [0-9]+) (corp: [0-9]+\/[0-9]+[a-zA-Z]*).*/\1 \2 \3/p' \
        <<<"$line"
}

failed=()
run_one() {
    local h=$1
    local dir=$work/run/$h
    local bin=$work/bin/fuzz_$h
    rm -rf "$dir"
    mkdir -p "$dir/corpus" "$dir/artifacts"
    if [ -d "tests/fuzz/corpus/$h" ]; then
        cp -R "tests/fuzz/corpus/$h/." "$dir/corpus/"
    fi
    local args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=25 -jobs=1
                -print_final_stats=1 -artifact_prefix="$dir/artifacts/")
    if [ -f "tests/fuzz/$h.dict" ]; then
        args+=(-dict="$root/tests/fuzz/$h.dict")
    fi
    # shellcheck disable=SC2206 # TWICE_FUZZ_ARGS is a list of flags
    args+=(${TWICE_FUZZ_ARGS:-})
    # -jobs=1: the fuzzing runs in a child that logs to fuzz-0.log; this process survives it.
    (cd "$dir" && timeout -k 10 $((seconds + 300)) "$bin" "${args[@]}" corpus \
        >"$dir/driver.log" 2>&1) || true
    local log=$dir/fuzz-0.log
    [ -f "$log" ] || log=$dir/driver.log
    local artifacts
    artifacts=$(find "$dir/artifacts" -type f | sort)
    local status=ok
    if [ -n "$artifacts" ]; then
        status=FAILED
    elif grep -qE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:' "$log"; then
        status=FAILED
    elif ! grep -q '^stat::number_of_executed_units' "$log"; then
        status=FAILED # killed, or never started
    fi
    printf 'fuzz_%-9s %s: %s execs, %s exec/s, %s, peak rss %s MB\n' "$h" "$status" \
        "$(final_stat number_of_executed_units "$log")" \
        "$(final_stat average_exec_per_sec "$log")" "$(coverage "$log")" \
        "$(final_stat peak_rss_mb "$log")"
    if [ "$status" != ok ]; then
        failed+=("$h")
        grep -E 'ERROR:|SUMMARY:|runtime error:|invariant failed' "$log" | head -n 5 | sed 's/^/    /'
        for a in $artifacts; do
            echo "    reproducer: $a   (rerun: $bin $a)"
        done
        echo "    log: $log"
    fi
}

for h in "${harnesses[@]}"; do
    run_one "$h"
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: all ${#harnesses[@]} harnesses ran ${seconds} s without a finding"
