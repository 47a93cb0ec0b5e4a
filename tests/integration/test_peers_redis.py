#!/usr/bin/python3
"""Redis's own test suite through twice with no rule: the same results as a direct run.

The suite is Redis's TCL suite (`runtest`) from Debian's redis source package, which
`scripts/deps.sh test` unpacks into tests/peers/src/redis (never committed). It runs in its
external-server mode (`--host/--port`: tests tagged `external:skip` are left out by the suite
itself), with `--tags -slow` as Redis's own CI runs it against an external server, against:

- `direct`: a redis-server of the machine (its own port and folder, `--save ''`, DEBUG and
  protected configs allowed as Redis's CI allows them);
- `tcp`: another such server behind a `protocol tcp` listener;
- `resp`: another behind a `protocol resp` listener (every command parsed, every reply paired);
- `resp-list`: another behind a `protocol resp` listener with `profile list` (list commands and
  their values read as jobs too; TWICE_PEERS_PROFILES names other profiles).

The runs go side by side, each on its own server, so that one run's keys or config changes
never meet another's. For each run the test collects every result line of the suite ([ok],
[err], [skip], [ignore], per unit and test name, counted) and asserts that each listener's
multiset equals the direct run's (a test that fails directly must fail the same way through
twice), that no run aborted ([exception], TIMEOUT), that twice logged no error, and that the
direct run passed at least 90% of what it ran (else the comparison says nothing). No test of
the suite is left out.

Environment:
  TWICE_PEERS_SRC    folder holding the unpacked source packages (default tests/peers/src)
  TWICE_PEERS_FULL=1 every unit of the suite, not the short list (`make transparency`)
  TWICE_PEERS_UNITS  a space-separated list of units instead (e.g. "unit/type/list unit/multi")
  TWICE_PEERS_THREADS  twice's `threads` (default 1, see below; `auto` shows what the order of
                     commands across connections does to the suite)
  TWICE_PEERS_PROFILES  the profiles of the `resp-NAME` runs (default "list"; e.g. "list streams
                     sidekiq celery rq bullmq")
"""

import collections
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import respkit as rk  # noqa: E402

SRC = os.environ.get("TWICE_PEERS_SRC") or os.path.join(h.SOURCE_DIR, "tests", "peers", "src")
SUITE = os.path.join(SRC, "redis")
FULL = os.environ.get("TWICE_PEERS_FULL") == "1"

# The short list `make test` runs: the data types, pub/sub, MULTI/EXEC, scripting, blocking
# operations (in the list, zset and stream units), the protocol (inline commands, RESP3,
# malformed input), big replies, client-side tracking (RESP3 pushes), introspection.
# In the suite's own order: in another (unit/type/string after unit/tracking), three tests of
# unit/type/string failed directly too, on state an earlier unit left in the server.
SHORT_UNITS = [
    "unit/protocol",
    "unit/keyspace",
    "unit/info-command",
    "unit/type/string",
    "unit/type/incr",
    "unit/type/list",
    "unit/type/list-2",
    "unit/type/set",
    "unit/type/hash",
    "unit/type/stream-cgroups",
    "unit/multi",
    "unit/quit",
    "unit/pubsub",
    "unit/pubsubshard",
    "unit/scripting",
    "unit/introspection",
    "unit/bitops",
    "unit/tracking",
]

# The profiles whose listeners run the suite too (one run each, `resp-NAME`).
PROFILES = os.environ.get("TWICE_PEERS_PROFILES", "list").split()
# Every listener's run and the direct one.
TARGETS = ("direct", "tcp", "resp") + tuple("resp-" + p for p in PROFILES)
RESULT = re.compile(r"^\[(ok|err|skip|ignore|exception|TIMEOUT)\]: ?(.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
UNIT = re.compile(r"^Testing (\S+)$")
THREADS = os.environ.get("TWICE_PEERS_THREADS", "1")
RUN_TIMEOUT = 3600 if FULL else 900


def units():
    if os.environ.get("TWICE_PEERS_UNITS"):
        return os.environ["TWICE_PEERS_UNITS"].split()
    return None if FULL else SHORT_UNITS


def redis_version():
    out = subprocess.run(["redis-server", "--version"], stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else "?"


def suite_version():
    try:
        with open(os.path.join(SUITE, ".twice-unpacked")) as f:
            return f.read().strip()
    except OSError:
        return "?"


def work_dir(tmp, name):
    """A copy of the suite's tests/ and runtest (the suite writes into tests/tmp), with src/
    naming the machine's Redis programs, which some external-mode units run (redis-cli)."""
    d = os.path.join(tmp, "suite-" + name)
    shutil.copytree(os.path.join(SUITE, "tests"), os.path.join(d, "tests"),
                    ignore=shutil.ignore_patterns("tmp"))
    os.makedirs(os.path.join(d, "tests", "tmp"))
    shutil.copy2(os.path.join(SUITE, "runtest"), d)
    os.makedirs(os.path.join(d, "src"))
    for prog in ("redis-server", "redis-cli", "redis-benchmark", "redis-check-aof",
                 "redis-check-rdb"):
        path = shutil.which(prog)
        if path:
            os.symlink(path, os.path.join(d, "src", prog))
    return d


def parse(text):
    """(Counter of (unit, status, test) results, [aborts], {failed test: the lines after it})
    of a runtest output."""
    results = collections.Counter()
    aborts = []
    details = {}
    unit = "?"
    lines = ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        m = UNIT.match(line)
        if m:
            unit = m.group(1)
            continue
        m = RESULT.match(line)
        if not m:
            continue
        status, data = m.groups()
        if status in ("exception", "TIMEOUT"):
            aborts.append("%s: [%s] %s" % (unit, status, data))
            continue
        if status == "ok":
            data = re.sub(r" \(\d+ ms\)$", "", data)
        elif status == "err":
            data = re.sub(r" in tests/\S+\.tcl$", "", data)
            details[(unit, data)] = "\n".join(lines[i + 1:i + 6])
        results[(unit, status, data)] += 1
    return results, aborts, details


class Run:
    def __init__(self, name, port, wd, baseport):
        self.name, self.port, self.wd, self.baseport = name, port, wd, baseport
        self.rc, self.seconds, self.text = None, 0.0, ""

    def argv(self, unit_list):
        argv = ["./runtest", "--host", "127.0.0.1", "--port", str(self.port), "--tags", "-slow",
                "--timeout", "300" if FULL else "120", "--baseport", str(self.baseport)]
        for u in unit_list or []:
            argv += ["--single", u]
        return argv

    def go(self, unit_list):
        log_path = os.path.join(self.wd, "runtest.log")
        env = dict(os.environ, TERM="dumb")
        t0 = time.monotonic()
        p = h.spawn(self.argv(unit_list), log_path=log_path, cwd=self.wd, env=env)
        try:
            self.rc = p.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            h.kill_group(p)
            p.wait(10)
            self.rc = "timeout"
        self.seconds = time.monotonic() - t0
        h.kill_group(p)  # the suite's own test client, if it outlived the server
        with open(log_path, errors="replace") as f:
            self.text = f.read()
        self.results, self.aborts, self.details = parse(self.text)

    def counts(self):
        c = collections.Counter(status for (_, status, _), n in self.results.items()
                                for _ in range(n))
        return "%s: %d ok, %d err, %d skipped (%d ignore) in %.0f s, rc %s" % (
            self.name, c["ok"], c["err"], c["skip"] + c["ignore"], c["ignore"], self.seconds,
            self.rc)


@unittest.skipUnless(os.path.exists(os.path.join(SUITE, "runtest")),
                     "Redis's test suite is not in %s (scripts/deps.sh test fetches it)" % SUITE)
@unittest.skipUnless(shutil.which("tclsh8.6") or shutil.which("tclsh8.5"),
                     "no tclsh (Debian package tcl; scripts/deps.sh test installs it)")
class RedisSuiteTest(unittest.TestCase):
    def test_same_results_direct_and_through_twice(self):
        tmp = h.make_tmpdir("twice-it-peers-redis-")
        h.log("Redis's suite %s, redis-server %s, units: %s" % (
            suite_version(), redis_version(), "all" if units() is None else " ".join(units())))
        servers = {t: h.start_redis(tmp, "--enable-protected-configs", "yes",
                                    "--enable-debug-command", "yes",
                                    "--enable-module-command", "yes", maxclients=None)
                   for t in TARGETS}
        ports = {t: h.free_port() for t in TARGETS if t != "direct"}
        # One event loop: Redis's suite sends a command on one connection and, right after,
        # another on a second connection, and expects Redis to get them in that order
        # (docs/redis.md: connections of different loops are not ordered with each other).
        conf = "threads %s\n" % THREADS + h.config(
            h.listen_block("tcp", ports["tcp"], servers["tcp"].port),
            rk.resp_listen_block("resp", ports["resp"], servers["resp"].port),
            *(rk.resp_listen_block("resp_" + p, ports["resp-" + p], servers["resp-" + p].port,
                                   profile=p) for p in PROFILES),
            log_level="info")
        tw = h.start_twice(conf, tmp)
        ports["direct"] = servers["direct"].port

        # The suite's own test server listens on a port below --baseport (and checks that
        # port + 10000 is free too): a range of its own per run, away from the suite's
        # default (21111) and from other runs of this test.
        base = 22000 + (os.getpid() % 40) * 256
        runs = [Run(t, ports[t], work_dir(tmp, t), base + 64 * (i + 1))
                for i, t in enumerate(TARGETS)]
        threads = [threading.Thread(target=r.go, args=(units(),)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in runs:
            h.log(r.counts())
        rk.assert_twice_healthy(self, tw)
        rk.stop_twice(tw)

        direct = runs[0]
        problems = []
        for r in runs:
            if r.aborts:
                problems.append("%s run aborted: %s" % (r.name, "; ".join(r.aborts)[:2000]))
        # A test that fails directly too is no sign against twice (the comparison wants the same
        # failure through twice), but a direct run that mostly fails compares nothing.
        ok = sum(n for (_, s, _), n in direct.results.items() if s == "ok")
        if ok < 0.9 * sum(n for (_, s, _), n in direct.results.items() if s in ("ok", "err")) \
                or ok == 0:
            problems.append("the direct run itself failed (rc %s), %d ok:\n%s" % (
                direct.rc, ok, direct.text[-3000:]))
        for (unit, test), lines in direct.details.items():
            h.log("NOTE: failed directly too: %s in %s:\n%s" % (test, unit, lines))
        for r in runs[1:]:
            only_direct = direct.results - r.results
            only_twice = r.results - direct.results
            if only_direct or only_twice:
                problems.append("%s differs from direct:\n  only direct: %s\n  only through "
                                "twice: %s" % (r.name, sorted(only_direct)[:30],
                                               sorted(only_twice)[:30]))
            if r.rc != direct.rc:
                problems.append("%s: runtest exited %s, direct %s" % (r.name, r.rc, direct.rc))
        if problems:
            for r in runs:
                h.log("---- %s: last lines ----\n%s" % (r.name, r.text[-3000:]))
                for (unit, test), lines in r.details.items():
                    h.log("---- %s: [err] %s in %s ----\n%s" % (r.name, test, unit, lines))
        self.assertEqual(problems, [], "\n".join(problems))


if __name__ == "__main__":
    unittest.main(verbosity=2)
