#!/usr/bin/env bash
# `make demo`: a throwaway Redis on a free loopback port, twice in front of it
# with a `tcp` listener, the same redis-benchmark load run direct and through
# twice, and a summary of what twice carried.  Everything it starts is
# stopped on exit; the files it wrote stay in the printed folder.
set -euo pipefail

twice=${1:-build/twice}
[ -x "$twice" ] || { echo "demo: $twice not built (run make)" >&2; exit 1; }
twice=$(cd "$(dirname "$twice")" && pwd)/$(basename "$twice")

work=$(mktemp -d /tmp/twice-demo.XXXXXX)
redis_pid= twice_pid=
cleanup() {
    [ -n "$twice_pid" ] && kill "$twice_pid" 2>/dev/null && wait "$twice_pid" 2>/dev/null || true
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
}
trap cleanup EXIT

free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_for() { # wait_for SECONDS COMMAND...
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

redis_port=$(free_port)
twice_port=$(free_port)
slow_port=$(free_port)

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" --logfile "$work/redis.log" --daemonize no &
redis_pid=$!
wait_for 10 redis-cli -p "$redis_port" ping || { echo "demo: redis did not start" >&2; exit 1; }

cat > "$work/demo.twice" <<CONF
# The demo's configuration: one transparent listener in front of Redis,
# a journal of every connection, and one rule on a second listener.
log-level info
seed 42
journal $work/journal.pb
listen redis {
  protocol tcp
  bind 127.0.0.1:$twice_port
  upstream 127.0.0.1:$redis_port
}
listen slow {
  protocol tcp
  bind 127.0.0.1:$slow_port
  upstream 127.0.0.1:$redis_port
}
rule slow-replies on slow {
  stream downstream
  do latency 100ms
}
CONF
"$twice" check -c "$work/demo.twice" >/dev/null
"$twice" run -c "$work/demo.twice" 2>"$work/twice.log" &
twice_pid=$!
wait_for 10 grep -q 'msg=listening' "$work/twice.log" || { cat "$work/twice.log" >&2; exit 1; }

tests=set,get,lpush,rpop,incr
bench() { # bench PORT PIPELINE -> "TEST rps" lines
    redis-benchmark -h 127.0.0.1 -p "$1" -n 50000 -c 20 -P "$2" -t "$tests" --csv 2>/dev/null |
        tail -n +2 | tr -d '"' | awk -F, '{print $1, $2}'
}

echo "twice demo: Redis on 127.0.0.1:$redis_port, twice (protocol tcp) on 127.0.0.1:$twice_port"
echo
printf '%-10s %8s %16s %16s %7s\n' test pipeline "direct req/s" "via twice req/s" ratio
for pipeline in 1 16; do
    direct=$(bench "$redis_port" "$pipeline")
    proxied=$(bench "$twice_port" "$pipeline")
    join <(echo "$direct" | sort) <(echo "$proxied" | sort) |
        awk -v p="$pipeline" '{printf "%-10s %8s %16.0f %16.0f %7.2f\n", $1, p, $2, $3, $3 / $2}'
done

# Same answers both ways: a value written through twice reads back directly.
redis-cli -p "$twice_port" set twice:demo "$(head -c 65536 /dev/urandom | base64 -w0)" >/dev/null
a=$(redis-cli -p "$twice_port" get twice:demo | sha256sum)
b=$(redis-cli -p "$redis_port" get twice:demo | sha256sum)
[ "$a" = "$b" ] && same=yes || same=NO
t0=$(date +%s%N); redis-cli -p "$twice_port" ping >/dev/null; t1=$(date +%s%N)
redis-cli -p "$slow_port" ping >/dev/null; t2=$(date +%s%N)
fast_ms=$(( (t1 - t0) / 1000000 )); slow_ms=$(( (t2 - t1) / 1000000 ))

kill -TERM "$twice_pid"; wait "$twice_pid" || true; twice_pid=
sessions=$(grep -c 'msg="session closed"' "$work/twice.log" || true)
read -r up down < <(grep 'msg="session closed"' "$work/twice.log" |
    sed -E 's/.*bytes_up=([0-9]+) bytes_down=([0-9]+).*/\1 \2/' |
    awk '{u+=$1; d+=$2} END {print u+0, d+0}')
reasons=$(grep 'msg="session closed"' "$work/twice.log" | sed -E 's/.*reason=([a-z_]+).*/\1/' |
    sort | uniq -c | awk '{printf "%s%s=%s", sep, $2, $1; sep=", "}')

echo
echo "twice carried $sessions client connections: $up bytes to Redis, $down bytes back."
echo "A 64 KiB value written through twice reads back identical directly: $same"
echo "Sessions ended: $reasons"
echo "A PING through the plain listener took ${fast_ms} ms; through the listener whose rule adds"
echo "100 ms of latency to replies it took ${slow_ms} ms."
echo
"$twice" report "$work/journal.pb" | sed -n '/^Faults per rule/,/^$/p'
echo "Log (logfmt): $work/twice.log    configuration: $work/demo.twice"
echo "Journal: $work/journal.pb (twice report $work/journal.pb)"
echo "The verdict demo with real Celery workers comes with the Redis and worker milestones."
[ "$same" = yes ]
