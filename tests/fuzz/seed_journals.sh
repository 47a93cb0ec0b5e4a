#!/usr/bin/env bash
# seed_journals.sh - write the seed journals of tests/fuzz/corpus/journal/ with a real twice.
#
#   tests/fuzz/seed_journals.sh TWICE_BINARY OUT_DIR
#
# For each Redis job framework (Celery, Sidekiq, RQ) and a plain RESP listener, starts a
# throwaway redis-server and twice in front of it with rules that always fire, pushes and pops
# a few jobs with redis-cli, stops twice with SIGTERM (which flushes the journal) and keeps the
# journal as OUT_DIR/<profile>.pb; then OUT_DIR/runs.pb: two Celery runs on one journal
# (`journal PATH append`), the rules changed during the second (admin API, SIGHUP).  Needs redis-server and redis-cli (Debian: redis-server,
# redis-tools).  The committed seeds were made this way; run it again after a journal format
# change.
set -euo pipefail

twice=$(realpath "$1")
out=$(realpath -m "$2")
here=$(cd "$(dirname "$0")/../.." && pwd)
jobs=$here/tests/unit/data/jobs
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() {
    for _ in $(seq 100); do
        redis-cli -p "$1" PING >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "port $1 never answered" >&2
    return 1
}

# run NAME PROFILE_LINE RULES COMMANDS_FUNCTION [GLOBALS [AFTER_FUNCTION]]
# GLOBALS: more lines at the top of the configuration; AFTER_FUNCTION: called with twice's pid
# after the commands, before it is stopped.  JOURNAL_MODE (environment): `journal PATH MODE`.
run() {
    local name=$1 profile=$2 rules=$3 commands=$4 globals=${5:-} after=${6:-}
    local rport tport
    rport=$(free_port)
    tport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" &
    local rpid=$!
    pids+=("$rpid")
    wait_port "$rport"
    cat >"$work/$name.conf" <<EOF
seed 7
journal $work/$name.pb ${JOURNAL_MODE:-}
$globals
listen redis {
  protocol resp
  $profile
  bind 127.0.0.1:$tport
  upstream 127.0.0.1:$rport
}
$rules
EOF
    "$twice" run -c "$work/$name.conf" 2>"$work/$name.log" &
    local tpid=$!
    pids+=("$tpid")
    wait_port "$tport" || { cat "$work/$name.log" >&2; return 1; }
    "$commands" "$tport" >/dev/null 2>&1 || true
    [ -z "$after" ] || "$after" "$tpid" "$work/$name.log"
    kill -TERM "$tpid"
    wait "$tpid" || true
    kill -TERM "$rpid"
    wait "$rpid" || true
    cp "$work/$name.pb" "$out/$name.pb"
    echo "$out/$name.pb: $(stat -c %s "$out/$name.pb") bytes"
}

celery_commands() {
    local c=(redis-cli -p "$1")
    for f in celery celery_redelivered; do
        "${c[@]}" LPUSH celery "$(cat "$jobs/$f.json")"
    done
    "${c[@]}" BRPOP celery 1
    "${c[@]}" HSET unacked 7d0c "[$(cat "$jobs/celery.json")]"
    "${c[@]}" ZADD unacked_index 1700000000 7d0c
    "${c[@]}" HDEL unacked 7d0c
    "${c[@]}" BRPOP celery 1
    "${c[@]}" PING
}

sidekiq_commands() {
    local c=(redis-cli -p "$1")
    for f in sidekiq sidekiq_activejob sidekiq_retry; do
        "${c[@]}" LPUSH queue:default "$(cat "$jobs/$f.json")"
    done
    for _ in 1 2 3; do "${c[@]}" BRPOP queue:default 1; done
}

rq_commands() {
    local c=(redis-cli -p "$1")
    "${c[@]}" HSET rq:job:42 description "$(cat "$jobs/rq_description.txt")" status queued
    "${c[@]}" RPUSH rq:queue:default 42
    "${c[@]}" LPOP rq:queue:default
    "${c[@]}" ZADD rq:wip:default 1700000000 42
    "${c[@]}" ZREM rq:wip:default 42
    "${c[@]}" HSET rq:job:42 status finished
}

plain_commands() {
    local c=(redis-cli -p "$1")
    "${c[@]}" SET k v
    "${c[@]}" GET k
    "${c[@]}" LPUSH q a b
    "${c[@]}" BRPOP q 1
    "${c[@]}" QUIT
}

event_rules='rule dup on redis {
  when deliver
  do duplicate
}
rule late on redis {
  when ack
  do delay 10ms
}'

sidekiq_rules='rule dup on redis {
  when deliver
  do duplicate
}
rule slow-push on redis {
  when publish
  do delay 5ms
}
rule err on redis {
  when command command=PING
  do error READONLY
}'

# rule_changes PID LOG: the rules changed through the admin API ($admin_port) and by SIGHUP.
rule_changes() {
    local p
    for p in /rules/dup/disable /rules/dup/enable /faults/off /faults/on; do
        python3 -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], data=b"", method="POST"))' "http://127.0.0.1:$admin_port$p"
    done
    kill -HUP "$1"
    for _ in $(seq 100); do
        grep -q 'msg=reloaded' "$2" && return 0
        sleep 0.05
    done
    echo "twice did not reload" >&2
    return 1
}

run celery "profile celery" "$event_rules" celery_commands
run sidekiq "profile sidekiq" "$sidekiq_rules" sidekiq_commands
run rq "profile rq" "$event_rules" rq_commands
run plain "" 'rule slow on redis {
  do latency 1ms
}
rule cut on redis {
  when connect
  nth 5
  do close before
}' plain_commands
# Two runs on one journal (`journal PATH append`), the rules changed during the second.
admin_port=$(free_port)
JOURNAL_MODE=append run runs "profile celery" "$event_rules" celery_commands
JOURNAL_MODE=append run runs "profile celery" "$event_rules" celery_commands \
    "admin 127.0.0.1:$admin_port" rule_changes
