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

missing=()
for p in "${want[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
# Deduplicate while keeping order.
if [ ${#missing[@]} -eq 0 ]; then
    if [ "$node_wanted" = 1 ]; then node_modules; fi
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
if [ "$node_wanted" = 1 ]; then
    cleanup
    added_policy=0
    node_modules
fi
