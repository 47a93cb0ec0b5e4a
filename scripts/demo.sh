#!/usr/bin/env bash
# `make demo`: the main job of twice, end to end, on this machine.
#
# A throwaway Redis on a free loopback port; twice in front of it with the
# example rule file rules/examples/redis-celery.conf (its two addresses and
# its journal path replaced); the Celery example app (tests/e2e/celery_redis:
# `tasks.charge`, which is not idempotent, and `tasks.charge_safe`, which is)
# run with real Celery workers through twice; then `twice verdict`, which
# names the task that did its side effect twice and the evidence it had.
# Then a second, shorter act with rules/examples/redis-celery-races.conf: a
# check-then-act task and an atomic claim, each copied while it runs, and the
# verdict that tells them apart by the copies that overlapped.  Everything it
# starts is stopped on exit; the files stay in the folder it prints.
set -euo pipefail

twice=${1:-build/twice}
jobs=${TWICE_DEMO_JOBS:-200}
[ -x "$twice" ] || { echo "demo: $twice not built (run make)" >&2; exit 1; }
twice=$(cd "$(dirname "$twice")" && pwd)/$(basename "$twice")
src=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3

work=$(mktemp -d /tmp/twice-demo.XXXXXX)
redis_pid= twice_pid=
cleanup() {
    [ -n "$twice_pid" ] && kill "$twice_pid" 2>/dev/null && wait "$twice_pid" 2>/dev/null || true
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
}
trap cleanup EXIT

free_port() {
    "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
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

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" --logfile "$work/redis.log" --daemonize no &
redis_pid=$!
wait_for 10 redis-cli -p "$redis_port" ping || { echo "demo: redis did not start" >&2; exit 1; }

# start_twice EXAMPLE NAME: twice with rules/examples/EXAMPLE pointed at this Redis (the two
# addresses and the journal, $work/NAME.pb), its log $work/NAME.log.
start_twice() {
    sed -e "s/^\(  *\)bind 127\.0\.0\.1:6380/\1bind 127.0.0.1:$twice_port/" \
        -e "s/^\(  *\)upstream 127\.0\.0\.1:6379/\1upstream 127.0.0.1:$redis_port/" \
        -e "s|^journal twice-journal\.pb|journal $work/$2.pb|" \
        "$src/rules/examples/$1" > "$work/$2.conf"
    "$twice" check "$work/$2.conf" >/dev/null
    "$twice" run "$work/$2.conf" 2>"$work/$2.log" &
    twice_pid=$!
    wait_for 10 grep -q 'msg=listening' "$work/$2.log" || { cat "$work/$2.log" >&2; exit 1; }
}
stop_twice() {
    kill -TERM "$twice_pid"; wait "$twice_pid" || true; twice_pid=
}

start_twice redis-celery.conf twice

cat <<EOF
twice demo: find the Celery task that is not idempotent

  Redis    127.0.0.1:$redis_port (throwaway, for this demo only)
  twice    127.0.0.1:$twice_port, in front of it, with rules/examples/redis-celery.conf:
             lost-ack     8% of acks never applied   (the task comes back after the visibility timeout)
             racing-copy  5% of deliveries copied    (a second worker gets the same task)
             late-ack     4% of acks applied 6 s late (past the 3 s visibility timeout)
  workers  2 Celery workers (task_acks_late=True, visibility timeout 3 s) connected to twice
  load     $jobs x tasks.charge      (records a charge every time it runs: not idempotent)
           $jobs x tasks.charge_safe (SET NX on the task id first: idempotent)

running the load through twice (well under a minute)...
EOF

set +e
"$py" "$src/tests/e2e/celery_redis/driver.py" --broker "127.0.0.1:$twice_port" \
    --inspect "127.0.0.1:$redis_port" --effect-redis "127.0.0.1:$redis_port" \
    --effects "$work/effects.txt" --runs "$work/runs.txt" --enqueued "$work/enqueued.txt" \
    --jobs "$jobs" --workers 2 --visibility-timeout 3 --timeout 100 --log-dir "$work" \
    > "$work/summary.json" 2> "$work/driver.log"
drv=$?
set -e
stop_twice
if [ $drv -ne 0 ]; then
    echo "demo: the load did not drain (driver exit $drv); see $work/driver.log" >&2
    tail -20 "$work/driver.log" >&2
    exit 1
fi

"$py" - "$work/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
runs, eff = s["executions"], s["effects"]
print("done in %.0f s: every task ran; some ran more than once, because twice made Redis hand them out again:"
      % s["elapsed_s"])
for t in sorted(s["jobs"]):
    print("  %-18s %4d enqueued  %4d executions  %4d side effects"
          % (t, s["jobs"][t], runs.get(t, 0), eff.get(t, 0)))
EOF
echo
"$twice" report "$work/twice.pb" | sed -n '/^Faults per rule/,/^$/p'
echo "twice verdict twice.pb --effects effects.txt"
set +e
"$twice" verdict "$work/twice.pb" --effects "$work/effects.txt"
verdict=$?
set -e
cat <<EOF

Read it as: tasks.charge did its side effect twice for some tasks that were delivered twice, so
it is NOT IDEMPOTENT; tasks.charge_safe was delivered twice just as often and still did it once.
But no copy of it ran beside its first run (OVERLAPPED 0/N): that tests its dedup key, not a
guard that two runs at once could both pass.  The verdict says so (IDEMPOTENT*) and which rule
would test it.  So, a second act: two tasks copied while they run, with free workers for the
copies (rules/examples/redis-celery-races.conf):

  tasks.check_then_act  checks a done-marker, works 2 s, charges, then sets the marker
  tasks.claim_first     takes SET NX on a claim key first, then works and charges

running them through twice (about 20 s)...
EOF

start_twice redis-celery-races.conf races
set +e
"$py" "$src/tests/e2e/celery_redis/driver.py" --broker "127.0.0.1:$twice_port" \
    --inspect "127.0.0.1:$redis_port" --effect-redis "127.0.0.1:$redis_port" \
    --effects "$work/races-effects.txt" --runs "$work/races-runs.txt" \
    --enqueued "$work/races-enqueued.txt" --handlers races --work-ms 2000 --jobs 4 \
    --workers 5 --prefetch 1 --pace 1 --visibility-timeout 5 --timeout 100 \
    --log-dir "$work/races" > "$work/races-summary.json" 2> "$work/races-driver.log"
drv=$?
set -e
stop_twice
if [ $drv -ne 0 ]; then
    echo "demo: the second load did not drain (driver exit $drv); see $work/races-driver.log" >&2
    tail -20 "$work/races-driver.log" >&2
    exit 1
fi
echo
echo "twice verdict races.pb --effects races-effects.txt"
set +e
"$twice" verdict "$work/races.pb" --effects "$work/races-effects.txt" |
    sed '/^MESSAGES  /,/^$/d'
races=${PIPESTATUS[0]}
set -e
cat <<EOF

Read it as: the copies ran beside their first runs (OVERLAPPED), so both tasks were tested
against a race: tasks.check_then_act charged twice (NOT IDEMPOTENT), tasks.claim_first did not.
(The verdict exits 1 when a task is not idempotent, as a CI step would want; the demo expects
exactly that, both times.)

Files: $work
  twice.conf, races.conf  the rules used         twice.pb, races.pb  every delivery, ack, fault
  effects.txt             one task id per charge twice.log           twice's log (one per fault)
EOF
[ $verdict -eq 1 ] && [ $races -eq 1 ]
