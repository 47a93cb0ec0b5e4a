#!/usr/bin/env bash
# Runs twice's Toxiproxy API tests against a real Toxiproxy as well, so that
# every difference between the two shows up as a test that passes on one and
# fails on the other.
#
# Usage: scripts/toxiproxy-oracle.sh TOXIPROXY_SOURCE_DIR [NODE_CLIENT_SOURCE_DIR]
#
# TOXIPROXY_SOURCE_DIR is a Toxiproxy 2.x source tree you already have (a
# clone of github.com/Shopify/toxiproxy): no package registry ships it and
# this script downloads nothing. It is built offline with Debian's Go
# (golang-go) and Debian's packages of its libraries, in GOPATH mode
# (`scripts/deps.sh oracle` installs them), into a temporary directory; the
# tree itself is not modified. Then:
#   1. tests/integration/test_toxiproxy_api.py, both classes: against twice
#      (TWICE_BIN, default build/twice) and against the Toxiproxy just built;
#   2. `go test` of Toxiproxy's own client package (client/client_test.go:
#      it only checks the client's headers against a stub, no server);
#   3. Toxiproxy's API tests (api_test.go: its Go client against a server at
#      localhost:8475), each test alone, first against Toxiproxy's own
#      in-process server, then against twice: twice is started afresh for each
#      test with `toxiproxy-api 127.0.0.1:8475`, so the test's in-process
#      server cannot bind (its error is ignored there) and the client talks to
#      twice. Port 8475 and the fixed ports api_test.go uses must be free.
#      A table of both results per test is printed.
#   4. with NODE_CLIENT_SOURCE_DIR (a clone of github.com/ihsw/toxiproxy-node-client:
#      its tests are not in its npm package), its jest suite, installed in a
#      copy with `npm ci` from its lockfile, against Toxiproxy and then
#      against twice, both on 127.0.0.1:8474 (the port its tests use).
#   5. tests/integration/toxiproxy_compare.py: the same ~75 requests to both
#      servers (what differs in the answers), then each toxic on real traffic
#      through both (what a client sees).
# The exit status is non-zero when steps 1 or 2 failed (steps 3 to 5 report).
set -euo pipefail

src="${1:-}"
if [ -z "$src" ] || [ ! -f "$src/api.go" ] || [ ! -d "$src/client" ]; then
    echo "usage: $0 TOXIPROXY_SOURCE_DIR [NODE_CLIENT_SOURCE_DIR]   (Toxiproxy 2.x sources: api.go, client/, toxics/)" >&2
    exit 2
fi
src="$(cd "$src" && pwd)"
repo="$(cd "$(dirname "$0")/.." && pwd)"
command -v go >/dev/null || { echo "no go: run scripts/deps.sh oracle" >&2; exit 2; }

work="$(mktemp -d /tmp/toxiproxy-oracle.XXXXXX)"
trap 'rm -rf "$work"' EXIT
pkg="$work/gopath/src/github.com/Shopify/toxiproxy/v2"
mkdir -p "$pkg"
# Its own copy, without the module files: GOPATH mode resolves imports in
# $work/gopath and in Debian's /usr/share/gocode, never on the network.
(cd "$src" && tar --exclude=.git --exclude=vendor --exclude=go.mod --exclude=go.sum -cf - .) |
    (cd "$pkg" && tar -xf -)
export GOPATH="$work/gopath:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS= \
       GOCACHE="$work/cache" GOTOOLCHAIN=local

version="$(git -C "$src" describe --tags 2>/dev/null || echo oracle)"
version="${version#v}"
ldflags="-X github.com/Shopify/toxiproxy/v2.Version=$version"
server="$work/toxiproxy-server"
if ! (cd "$pkg" && go build -ldflags "$ldflags" -o "$server" ./cmd/server) 2>"$work/build.log"; then
    # Toxiproxy's cmd/server may need a newer zerolog than Debian's (its
    # CallerMarshalFunc signature changed in zerolog 1.29): serve the same
    # API from a main of our own, which only wires up the library.
    echo "oracle: cmd/server does not build here ($(head -c 300 "$work/build.log" | tr '\n' ' ')); using a minimal main" >&2
    mkdir -p "$work/gopath/src/toxiproxyoracle"
    cat >"$work/gopath/src/toxiproxyoracle/main.go" <<'EOF'
package main

import (
	"flag"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
)

func main() {
	host := flag.String("host", "localhost", "API host")
	port := flag.String("port", "8474", "API port")
	config := flag.String("config", "", "JSON file of proxies to create at start")
	proxyMetrics := flag.Bool("proxy-metrics", false, "proxy metrics on /metrics")
	flag.Parse()
	logger := zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	if *proxyMetrics {
		server.Metrics.ProxyMetrics = collectors.NewProxyMetricCollectors()
	}
	if *config != "" {
		server.PopulateConfig(*config)
	}
	if err := server.Listen(net.JoinHostPort(*host, *port)); err != nil {
		os.Exit(1)
	}
}
EOF
    (cd "$work/gopath/src/toxiproxyoracle" && go build -ldflags "$ldflags" -o "$server" .)
fi
echo "oracle: built Toxiproxy $version at $server" >&2

rc=0
echo "== test_toxiproxy_api.py: twice (TwiceToxiproxyApiTest) and Toxiproxy $version (RealToxiproxyApiTest)"
TOXIPROXY_SERVER="$server" TWICE_SOURCE_DIR="$repo" \
    /usr/bin/python3 "$repo/tests/integration/test_toxiproxy_api.py" -v || rc=1

echo "== go test github.com/Shopify/toxiproxy/v2/client (Toxiproxy's client package tests)"
(cd "$pkg" && go test -v -count=1 ./client) || rc=1

echo "== api_test.go: Toxiproxy's client against Toxiproxy, then against twice"
twice_bin="${TWICE_BIN:-$repo/build/twice}"
(cd "$pkg" && go test -c -o "$work/api.test" .)
tests="$(sed -n 's/^func \(Test[A-Za-z0-9_]*\)(t \*testing.T) {$/\1/p' "$pkg/api_test.go")"
free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
run_one() { # NAME LOG: one api_test.go test, alone
    (cd "$pkg" && timeout 120 "$work/api.test" -test.run "^$1\$" -test.count=1 -test.v) >"$2" 2>&1
}
start_twice() {
    cat >"$work/twice.conf" <<EOF
log-level warn
toxiproxy-api 127.0.0.1:8475
listen oracle_placeholder {
  protocol tcp
  bind 127.0.0.1:$(free_port)
  upstream 127.0.0.1:9
}
EOF
    "$twice_bin" run -c "$work/twice.conf" >>"$work/twice.log" 2>&1 &
    twice_pid=$!
    for _ in $(seq 200); do
        if (exec 3<>/dev/tcp/127.0.0.1/8475) 2>/dev/null; then return 0; fi
        kill -0 "$twice_pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "oracle: twice did not open 127.0.0.1:8475 (see $work/twice.log)" >&2
    return 1
}
stop_twice() {
    kill "$twice_pid" 2>/dev/null || true
    wait "$twice_pid" 2>/dev/null || true
}
mkdir -p "$work/logs"
same=0 differ=0
printf '%-48s %-10s %-10s\n' test toxiproxy twice
for t in $tests; do
    if run_one "$t" "$work/logs/$t.toxiproxy"; then a=PASS; else a=FAIL; fi
    b=SKIP
    if [ -x "$twice_bin" ] && start_twice; then
        if run_one "$t" "$work/logs/$t.twice"; then b=PASS; else b=FAIL; fi
        stop_twice
    fi
    printf '%-48s %-10s %-10s\n' "$t" "$a" "$b"
    if [ "$a" = "$b" ]; then same=$((same + 1)); else differ=$((differ + 1)); fi
done
for t in $tests; do
    if [ -f "$work/logs/$t.twice" ] && ! grep -q '^--- PASS' "$work/logs/$t.twice"; then
        echo "--- $t against twice:"
        grep -E '_test.go:[0-9]+:' "$work/logs/$t.twice" | head -5
    fi
done
echo "api_test.go: $same tests with the same result, $differ different"

node_src="${2:-}"
if [ -n "$node_src" ] && [ ! -f "$node_src/package.json" ]; then
    echo "oracle: $node_src has no package.json: not a toxiproxy-node-client source tree" >&2
    exit 2
fi
if [ -n "$node_src" ]; then
    echo "== toxiproxy-node-client's jest suite: against Toxiproxy, then against twice (port 8474)"
    node="$work/node-client"
    mkdir -p "$node"
    (cd "$node_src" && tar --exclude=.git --exclude=node_modules -cf - .) | (cd "$node" && tar -xf -)
    (cd "$node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    "$server" -host 127.0.0.1 -port 8474 >"$work/toxiproxy-8474.log" 2>&1 &
    tp_pid=$!
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8474) 2>/dev/null && break; sleep 0.05; done
    (cd "$node" && npx jest --runInBand --verbose 2>&1 | grep -E '✓|✕|^Tests:') || true
    kill "$tp_pid"; wait "$tp_pid" 2>/dev/null || true
    [ -f "$work/twice.conf" ] || { echo "no twice run: skipped" >&2; exit $rc; }
    sed -i 's/^toxiproxy-api .*/toxiproxy-api 127.0.0.1:8474/' "$work/twice.conf"
    "$twice_bin" run -c "$work/twice.conf" >>"$work/twice.log" 2>&1 &
    twice_pid=$!
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8474) 2>/dev/null && break; sleep 0.05; done
    echo "-- against twice:"
    (cd "$node" && npx jest --runInBand --verbose 2>&1 | grep -E '✓|✕|^Tests:|Expected|Received|status code' | head -80) || true
    stop_twice
fi

echo "== toxiproxy_compare.py: Toxiproxy $version and twice side by side"
TOXIPROXY_SERVER="$server" TWICE_BIN="$twice_bin" TWICE_SOURCE_DIR="$repo" \
    /usr/bin/python3 "$repo/tests/integration/toxiproxy_compare.py" || rc=1
exit $rc
