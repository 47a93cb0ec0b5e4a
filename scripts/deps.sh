#!/usr/bin/env bash
# Installs the Debian packages twice needs to build, test and run its demo,
# and does nothing when they are all present.  Non-interactive; needs root
# (or sudo) only when something is missing.
#
# Usage: scripts/deps.sh [build|test|demo|bench|package|oracle|all]   (default: all; `oracle` is
# not part of `all`: Go and the Go libraries scripts/toxiproxy-oracle.sh builds Toxiproxy with)
set -euo pipefail

build_pkgs=(cmake make gcc pkg-config libevent-dev libssl-dev
            libprotobuf-c-dev protobuf-c-compiler libcmocka-dev libjansson-dev)
test_pkgs=(openssl procps curl redis-server redis-tools rabbitmq-server
           python3 python3-pika python3-celery python3-redis python3-rq
           ruby ruby-sidekiq ruby-bunny clang libclang-rt-14-dev clang-format
           chromium-headless-shell)
# make deb: dpkg-shlibdeps (dpkg-dev) names the packages of the libraries twice links.
# test_install.py also reads `man twice` (man-db) and builds the package.
package_pkgs=(dpkg-dev)
test_pkgs+=(dpkg-dev man-db)
# Redis's own test suite (test_peers_redis.py): its runtest is a Tcl program; dpkg-dev's
# dpkg-source unpacks its source package.
test_pkgs+=(tcl)
demo_pkgs=(python3 redis-server redis-tools python3-celery python3-redis)
bench_pkgs=(python3 redis-server redis-tools rabbitmq-server haproxy gnuplot-nox)
oracle_pkgs=(golang-go golang-github-gorilla-mux-dev golang-github-rs-zerolog-dev
             golang-gopkg-tomb.v1-dev golang-github-prometheus-client-golang-dev)

want=()
case "${1:-all}" in
    build) want=("${build_pkgs[@]}") ;;
    test)  want=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
    demo)  want=("${build_pkgs[@]}" "${demo_pkgs[@]}") ;;
    bench) want=("${build_pkgs[@]}" "${bench_pkgs[@]}") ;;
    package) want=("${build_pkgs[@]}" "${package_pkgs[@]}") ;;
    oracle) want=("${build_pkgs[@]}" "${test_pkgs[@]}" "${oracle_pkgs[@]}") ;;
    all)   want=("${build_pkgs[@]}" "${test_pkgs[@]}" "${demo_pkgs[@]}" "${bench_pkgs[@]}") ;;
    *) echo "usage: $0 [build|test|demo|bench|package|oracle|all]" >&2; exit 2 ;;
esac

# Node.js and npm for the Node.js clients the tests run (tests/node): Debian's, unless the
# machine has a node and an npm already (a NodeSource build brings its own npm, which Debian's
# npm package would conflict with).
node_wanted=0
case "${1:-all}" in test|oracle|all) node_wanted=1 ;; esac
if [ "$node_wanted" = 1 ]; then
    command -v node >/dev/null 2>&1 || want+=(nodejs)
    command -v npm >/dev/null 2>&1 || want+=(npm)
fi

# The npm packages of tests/node (amqplib; BullMQ 5 as `bullmq` and BullMQ 6 as `bullmq6`, an npm
# alias; ioredis, a dependency of BullMQ 5 and the peer dependency of BullMQ 6; Toxiproxy's client
# toxiproxy-node-client, which drives twice's Toxiproxy API), as its committed
# lockfile pins them, into tests/node/node_modules (never global): again only when the lockfile
# changed since the last install.
node_modules() {
    local dir lock stamp
    dir="$(cd "$(dirname "$0")/.." && pwd)/tests/node"
    lock="$dir/package-lock.json"
    stamp="$dir/node_modules/.twice-lock"
    if [ -f "$stamp" ] && cmp -s "$lock" "$stamp"; then
        return 0
    fi
    echo "deps: npm ci in tests/node" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$lock" "$stamp"
}

# The peers' own test suites that tests/integration/test_peers_*.py run direct and through twice
# (Redis's TCL suite), from Debian's source packages (the only registry of source code the
# machines reach), unpacked into tests/peers/src/NAME (ignored by git: upstream code is never
# committed), only when missing.  apt works on a private state: a sources list of its own, made
# of the machine's own Debian sources with deb-src in place of deb (the same mirror, suites and
# keys), and its own lists and cache in a temporary folder; the machine's apt setup is untouched
# and no root is needed.  The version fetched is the source of the installed package named after
# the colon (redis:redis-server: the suite of the redis-server the tests run), else the newest.
# A failed fetch only warns: the tests that need the suite then skip.
peer_sources() {
    local root state name pkg ver src f rc=0
    root="$(cd "$(dirname "$0")/.." && pwd)/tests/peers/src"
    local -a need=() apt_opts
    for name in "$@"; do
        [ -f "$root/${name%%:*}/.twice-unpacked" ] || need+=("$name")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    if ! command -v dpkg-source >/dev/null 2>&1; then
        echo "deps: dpkg-source (dpkg-dev) missing: peers' test suites not fetched" >&2
        return 0
    fi
    state="$(mktemp -d)"
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/sources.list.d" "$root"
    for f in /etc/apt/sources.list.d/*.sources; do
        if [ -f "$f" ]; then
            sed -E 's/^Types:.*/Types: deb-src/' "$f" > "$state/sources.list.d/${f##*/}"
        fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        if [ -f "$f" ]; then
            sed -nE 's/^deb[[:space:]]+/deb-src /p' "$f" >> "$state/sources.list.d/machine.list"
        fi
    done
    apt_opts=(-q -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$state/sources.list.d"
              -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
              -o APT::Sandbox::User=root)
    echo "deps: fetching the source packages ${need[*]%%:*} into tests/peers/src" >&2
    # A source of the machine's without deb-src only fails its own index: go on.
    apt-get "${apt_opts[@]}" update >"$state/log" 2>&1 || true
    for name in "${need[@]}"; do
        pkg="${name#*:}" name="${name%%:*}"
        ver=$(dpkg-query -W -f='${source:Version}' "$pkg" 2>/dev/null || true)
        rm -rf "${root:?}/$name"
        if (cd "$state" && { { [ -n "$ver" ] && apt-get "${apt_opts[@]}" source --download-only \
                "$name=$ver"; } || apt-get "${apt_opts[@]}" source --download-only "$name"; } \
                >>"$state/log" 2>&1) &&
            src=$(ls "$state/${name}"_*.dsc 2>/dev/null | head -n1) && [ -n "$src" ] &&
            dpkg-source --no-copy -x "$src" "$root/$name" >>"$state/log" 2>&1; then
            basename "$src" .dsc > "$root/$name/.twice-unpacked"
        else
            echo "deps: warning: could not fetch the source package $name" >&2
            rc=1
        fi
    done
    [ "$rc" = 0 ] || tail -n 5 "$state/log" >&2
    rm -rf "$state"
    return 0
}
peers_wanted=0
case "${1:-all}" in test|all) peers_wanted=1 ;; esac
finish() {
    if [ "$node_wanted" = 1 ]; then node_modules; fi
    if [ "$peers_wanted" = 1 ]; then peer_sources redis:redis-server; fi
}

missing=()
for p in "${want[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
# Deduplicate while keeping order.
if [ ${#missing[@]} -eq 0 ]; then
    finish
    exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++')

echo "deps: installing ${missing[*]}" >&2
SUDO=
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
fi

# Package scripts must not start system-wide brokers: the tests start their
# own on free ports.  A policy-rc.d that answers 101 tells invoke-rc.d "not
# allowed"; we only add one when the machine has none, and remove it after.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    added_policy=1
fi
cleanup() { if [ "$added_policy" = 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
cleanup
added_policy=0
finish
