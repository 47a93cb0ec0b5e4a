#!/usr/bin/python3
"""bench/run.py - twice side by side with the brokers directly and with HAProxy.

    python3 bench/run.py --twice build/twice [--quick] [--out DIR] [--rounds R]
                         [--threads N --haproxy-threads N]

Starts a private redis-server and RabbitMQ (as tests/integration/harness.py does: free loopback
ports, own folders, stopped at exit), HAProxy in TCP mode (`nbthread` --haproxy-threads), and
three twice processes (`threads` --threads; both 1 by default), one per configuration, each with
an AMQP and a Redis listener:

  twice-tcp     protocol tcp: the plain relay
  twice-parse   protocol amqp / protocol resp with profile celery, no rule: every message parsed
  twice-faults  the same with rules faulting about 1 % of messages: AMQP `deliver ... duplicate`
                and `ack ... redeliver`; Redis profile sidekiq (the job load's keys are
                Sidekiq's queue:NAME) with `deliver ... duplicate`

Loads (bench/amqp_load.c, bench/redis_jobs.c, built here with cc; redis-benchmark):

  amqp       2 publishers, 2 consumers, 256 B, prefetch 100, one ack per message
  jobs       4 LPUSH producers, 8 BRPOP + INCR consumers, 400 B jobs (Sidekiq/Celery JSON)
  SET/GET    redis-benchmark, 50 clients, 64 B values, -P 1 and -P 16
  busy EVAL  redis-benchmark, 50 clients, -P 1, EVAL of a Lua loop that keeps redis-server
             busy about 100 us per call: the broker is the bottleneck (one core at 100 %, the
             other with room for the load and the proxy), so every target should carry what
             the broker does directly

Every load runs against every target (direct, haproxy, twice-*) in alternation, R rounds, the
order rotated each round.  amqp and jobs run twice per target and round: once closed-loop (at
most 1000 messages in flight) for throughput and CPU, once at a fixed rate (half of what the
slowest target did in round 1) for latency, so that latency measures the path and not a
queue.  For each run the proxy's CPU (utime + stime from /proc/PID/stat) and its RSS (VmRSS
sampled every 50 ms) are read.

Then big replies: one client reads an LRANGE of 3,000,000 elements (about 37 MB) and five
clients send it and read nothing for 4 s; per target, the first and last byte's time and the
proxy's RSS growth in each case.

Then the cost curves: proxy CPU per message against the message size (16 B to 1 MiB) of AMQP
messages and of Redis SET and GET values (redis-benchmark -d, no pipeline), each point the
median of 3 runs; and against the number of open connections (1 to 10 000 idle Redis
connections, each having sent one PING, plus a small job load), with RSS per idle connection
pair, on fresh proxies.

Prints a table (medians over the rounds, ratios against direct and HAProxy), writes
DIR/results.json and PNG charts (gnuplot).  Standard library only; needs root for apt-get
when haproxy, gnuplot or a broker is missing.
"""

import argparse
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402  (raises RLIMIT_NOFILE, cleans every process up at exit)

TARGETS = ["direct", "haproxy", "twice-tcp", "twice-parse", "twice-faults"]
PROXIES = TARGETS[1:]
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Durations and counts of the full run and of --quick.  The full run takes about 12 minutes on
# two cores, --quick about 1.5 (RabbitMQ's start alone takes 5-20 s).  Five rounds: a ratio's
# median over five paired runs is not moved by one disturbed round.  The size curve's points are
# medians of size_rounds runs (one run per point moved 64 KiB's CPU by 50% between runs).
PLANS = {
    "full": dict(rounds=5, max_s=3.0, paced_s=2.0, rb_p1=100000, rb_p16=400000, eval_n=20000,
                 size_s=2.0,
                 size_rounds=3, active_s=1.5, sizes=[16, 256, 4096, 65536, 1048576],
                 levels=[1, 10, 100, 1000, 10000]),
    "quick": dict(rounds=1, max_s=1.0, paced_s=1.0, rb_p1=20000, rb_p16=100000, eval_n=4000,
                  size_s=1.0,
                  size_rounds=1, active_s=0.8, sizes=[16, 4096, 1048576],
                  levels=[1, 100, 1000, 10000]),
}

AMQP_LOAD = ["--publishers", "2", "--consumers", "2", "--size", "256", "--prefetch", "100",
             "--inflight", "1000"]
JOBS_LOAD = ["--producers", "4", "--consumers", "8", "--size", "400", "--window", "1",
             "--inflight", "1000"]
RB_CLIENTS, RB_VALUE = 50, 64
# The broker-bound load: a Lua loop that costs redis-server about 100 us a call on this project's
# machine (about 9,000 calls/s on one core) for a 70-byte command and an integer reply.
# (No comma: redis-benchmark's CSV names the row by the command's words.)
BUSY_SCRIPT = "local x = 0 local i = 0 while i < 6000 do i = i + 1 x = x + i end return x"
PACED_FRACTION = 0.5           # of the slowest target's closed-loop throughput (round 1)
ACTIVE_RATE = 2000             # jobs/s of the small load beside the idle connections
MAX_IDLE = 10000               # the last level of the connection curve, if file descriptors allow


def raise_nofile_to(want):
    """RLIMIT_NOFILE raised to at least `want` descriptors where this process may raise its
    hard limit (root), else to the hard limit; returns the soft limit now in force.  The
    servers started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
        except (ValueError, OSError):
            pass
    return harness.raise_nofile_limit()


def log(*a):
    print("[bench %s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Setup: packages, tools

def ensure_packages():
    """apt-get install what is missing (haproxy, gnuplot-nox, the brokers, redis-benchmark)."""
    want = {"haproxy": "haproxy", "gnuplot": "gnuplot-nox", "redis-server": "redis-server",
            "redis-benchmark": "redis-tools", "cc": "gcc", "pkg-config": "pkg-config"}
    missing = sorted({pkg for cmd, pkg in want.items() if shutil.which(cmd) is None})
    if not os.path.exists(os.path.join(harness.RABBIT_BIN, "rabbitmq-server")):
        missing.append("rabbitmq-server")
    if shutil.which("pkg-config") is None or \
            subprocess.run(["pkg-config", "--exists", "libevent_core"]).returncode != 0:
        missing.append("libevent-dev")
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit("bench: missing packages %s; install them (apt-get install %s) or run as root"
                 % (", ".join(missing), " ".join(missing)))
    log("installing", " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + missing, env=env)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + missing,
                       env=env, check=True)


def build_tools(bindir):
    """Compiles the two load generators (when their sources are newer); returns their paths."""
    os.makedirs(bindir, exist_ok=True)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libevent_core"], check=True,
                           stdout=subprocess.PIPE, text=True).stdout.split()
    out = {}
    for name in ("amqp_load", "redis_jobs"):
        src = os.path.join(HERE, name + ".c")
        exe = os.path.join(bindir, name)
        newest = max(os.path.getmtime(src), os.path.getmtime(os.path.join(HERE, "loadgen.h")))
        if not os.path.exists(exe) or os.path.getmtime(exe) < newest:
            subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-o", exe, src] + flags, check=True)
        out[name] = exe
    return out


# ---------------------------------------------------------------------------------------------
# Processes: CPU and memory

def cpu_seconds(pid):
    """utime + stime of pid (every thread), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()   # fields[0] is field 3, the state
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Probe:
    """CPU used by pid and its peak VmRSS while the with-block runs (nothing when pid is None)."""

    def __init__(self, pid):
        self.pid = pid
        self.cpu = None
        self.peak_kib = None

    def __enter__(self):
        if self.pid is None:
            return self
        self._stop = threading.Event()
        self.peak_kib = status_kib(self.pid, "VmRSS")
        self._cpu0 = cpu_seconds(self.pid)
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.05):
            try:
                self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmRSS"))
            except OSError:
                return

    def __exit__(self, *exc):
        if self.pid is None:
            return False
        self._stop.set()
        self._t.join()
        try:
            self.cpu = cpu_seconds(self.pid) - self._cpu0
            self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmRSS"))
        except OSError:   # the proxy died: reported by the caller
            self.cpu = None
        return False


# ---------------------------------------------------------------------------------------------
# Servers

def start_redis(tmp, maxclients):
    """A private redis-server that accepts maxclients connections (the connection curve)."""
    d = os.path.join(tmp, "redis")
    os.makedirs(d)
    port = harness.free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", d, "--daemonize", "no", "--unixsocket", "",
            "--protected-mode", "yes", "--maxclients", str(maxclients)]
    nofile = harness.raise_nofile_limit()
    p = harness.spawn(argv, log_path=os.path.join(d, "redis.log"), cwd=d, nofile=(nofile, nofile))
    r = harness.Redis(p, port, d, os.path.join(d, "redis.log"))
    harness.at_exit(r.stop)
    harness.wait_until(lambda: harness.port_open(port), 30, what="redis on %d" % port)
    return r


class Server:
    """A proxy process we started: its pid, its ports per broker, its log."""

    def __init__(self, name, proc, ports, log_path, stop):
        self.name, self.proc, self.ports, self.log_path, self._stop = name, proc, ports, log_path, stop

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self._stop()


def start_haproxy(tmp, name, upstreams, maxconn, threads):
    """HAProxy in TCP mode, one frontend/backend per broker, no logging, generous timeouts."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    ports = {b: harness.free_port() for b in upstreams}
    cfg = ["global", "    nbthread %d" % threads, "    maxconn %d" % maxconn, "",
           "defaults", "    mode tcp", "    timeout connect 5s", "    timeout client 1h",
           "    timeout server 1h", ""]
    for b, up in upstreams.items():
        cfg += ["frontend fe_%s" % b, "    bind 127.0.0.1:%d" % ports[b],
                "    default_backend be_%s" % b, "",
                "backend be_%s" % b, "    server s1 127.0.0.1:%d" % up, ""]
    path = os.path.join(d, "haproxy.cfg")
    with open(path, "w") as f:
        f.write("\n".join(cfg))
    log_path = os.path.join(d, "haproxy.log")
    nofile = harness.raise_nofile_limit()
    p = harness.spawn(["haproxy", "-db", "-f", path], log_path=log_path, cwd=d,
                      nofile=(nofile, nofile))

    def stop():
        harness.kill_group(p, 15)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            harness.kill_group(p)
    harness.at_exit(stop)
    for port in ports.values():
        harness.wait_until(lambda: harness.port_open(port) or p.poll() is not None, 15,
                           what="haproxy on %d" % port)
    if p.poll() is not None:
        sys.exit("haproxy exited:\n" + open(log_path).read())
    return Server(name, p, ports, log_path, stop)


# `threads` of every twice the bench starts (--threads; 1, as HAProxy's default nbthread 1).
TWICE_THREADS = 1


def twice_config(mode, ports, upstreams, max_connections=None):
    """The configuration of one twice process: mode is tcp, parse or faults.  Without
    max_connections a listener takes half of what twice's open-file limit allows."""
    head = "seed 1\nshutdown-grace 1s\nthreads %d\n" % TWICE_THREADS
    blocks, rules = [], ""
    if "amqp" in upstreams:
        proto = "tcp" if mode == "tcp" else "amqp"
        blocks.append(("amqp", proto, None))
        if mode == "faults":
            rules += ("rule dup on amqp {\n  when deliver\n  probability 1%\n  do duplicate\n}\n"
                      "rule lost-ack on amqp {\n  when ack\n  probability 1%\n  do redeliver\n}\n")
    if "redis" in upstreams:
        proto = "tcp" if mode == "tcp" else "resp"
        profile = {"parse": "celery", "faults": "sidekiq"}.get(mode)
        blocks.append(("redis", proto, profile))
        if mode == "faults":
            rules += "rule dup-job on redis {\n  when deliver\n  probability 1%\n  do duplicate\n}\n"
    text = head
    for name, proto, profile in blocks:
        text += "listen %s {\n  protocol %s\n" % (name, proto)
        if profile:
            text += "  profile %s\n" % profile
        text += "  bind 127.0.0.1:%d\n  upstream 127.0.0.1:%d\n" % (ports[name], upstreams[name])
        if max_connections:
            text += "  max-connections %d\n" % max_connections
        text += "}\n"
    return text + rules


def start_twice(tmp, name, mode, upstreams, max_connections=None):
    ports = {b: harness.free_port() for b in upstreams}
    t = harness.start_twice(twice_config(mode, ports, upstreams, max_connections), tmp,
                            nofile=(harness.raise_nofile_limit(),) * 2)

    def stop():
        if t.proc.poll() is None:
            t.proc.send_signal(15)
            try:
                t.proc.wait(15)
            except subprocess.TimeoutExpired:
                t.kill()
    harness.at_exit(stop)
    return Server(name, t.proc, ports, t.log_path, stop)


def log_problems(server):
    """warn/error lines of a twice log (HAProxy's WARNING/ALERT lines), grouped by message:
    what broke under load."""
    out = {}
    try:
        with open(server.log_path, errors="replace") as f:
            for line in f:
                m = (re.search(r"level=(warn|error) msg=(\"[^\"]*\"|\S+)", line) or
                     re.search(r"\[(WARNING|ALERT)\][^:]*: (.{0,60})", line))
                if m:
                    key = m.group(2).strip('"')
                    e = out.setdefault(key, {"count": 0, "example": line.strip()[:400]})
                    e["count"] += 1
    except OSError:
        pass
    return out


# ---------------------------------------------------------------------------------------------
# Loads

def run_json_tool(argv, timeout):
    """Runs a load generator; returns its JSON line (with "error" set on failure)."""
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout, preexec_fn=harness._child_setup)
    except subprocess.TimeoutExpired:
        return {"error": "no answer within %ds" % timeout}
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"error": "exit %d: %s" % (r.returncode, r.stderr.strip()[-300:])}
    return json.loads(lines[-1])


class Bench:
    def __init__(self, tools, plan):
        self.tools, self.plan = tools, plan
        self.seq = 0

    def _name(self):
        self.seq += 1
        return "bench-%d-%d" % (os.getpid(), self.seq)

    def amqp(self, port, duration, rate=0.0, size=None, inflight=None):
        argv = [self.tools["amqp_load"], "--addr", "127.0.0.1:%d" % port,
                "--duration", "%.2f" % duration, "--queue", self._name(), "--timeout",
                "%d" % (duration + 30)] + AMQP_LOAD
        if size is not None:
            argv += ["--size", str(size), "--inflight", str(inflight)]
        if rate:
            argv += ["--rate", "%.0f" % rate]
        return run_json_tool(argv, duration + 45)

    def jobs(self, port, duration, rate=0.0, extra=()):
        argv = [self.tools["redis_jobs"], "--addr", "127.0.0.1:%d" % port,
                "--duration", "%.2f" % duration, "--key", "queue:" + self._name(), "--timeout",
                "%d" % (duration + 30)] + JOBS_LOAD + list(extra)
        if rate:
            argv += ["--rate", "%.0f" % rate]
        return run_json_tool(argv, duration + 45)

    def redis_benchmark(self, port, test, pipeline, n, value=None, command=None):
        """redis-benchmark's test `test` (set, get), or with `command` (a list of arguments)
        that command, whose CSV row is named by its words."""
        argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n),
                "-P", str(pipeline), "-c", str(RB_CLIENTS), "-d", str(value or RB_VALUE), "--csv"]
        argv += list(command) if command else ["-t", test]
        if command:
            test = " ".join(command)
        try:
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=120, preexec_fn=harness._child_setup)
        except subprocess.TimeoutExpired:
            return {"error": "redis-benchmark took more than 120 s"}
        rows = [l.replace('"', "").split(",") for l in r.stdout.splitlines()]
        rows = [x for x in rows if x and x[0].upper() == test.upper()]
        if r.returncode != 0 or not rows:
            return {"error": "redis-benchmark exit %d: %s" % (r.returncode, r.stderr[-300:])}
        x = rows[-1]
        return {"sent": n, "throughput": float(x[1]), "p50_us": float(x[4]) * 1000,
                "p99_us": float(x[6]) * 1000, "max_us": float(x[7]) * 1000,
                "complete": True, "error": None}


def messages_of(res):
    """Messages a run carried through the proxy: publishes (each is also delivered)."""
    return res.get("sent") or 0


def record(runs, rnd, load, target, mode, res, probe, server):
    rec = {"round": rnd, "load": load, "target": target, "mode": mode,
           "throughput": res.get("throughput"), "p50_us": res.get("p50_us"),
           "p99_us": res.get("p99_us"), "max_us": res.get("max_us"),
           "messages": messages_of(res), "error": res.get("error"),
           "complete": res.get("complete"), "duplicates": res.get("duplicates"),
           "proxy_cpu_s": probe.cpu, "proxy_peak_rss_kib": probe.peak_kib, "raw": res}
    if server is not None and not server.alive():
        rec["error"] = (rec["error"] or "") + " proxy exited with %s" % server.proc.returncode
    if probe.cpu is not None and rec["messages"]:
        rec["cpu_s_per_100k"] = probe.cpu / rec["messages"] * 1e5
    runs.append(rec)
    if rec["error"] or not rec["complete"]:
        log("  %s %s %s: PROBLEM %s" % (load, target, mode, rec["error"] or "incomplete"))
    return rec


# ---------------------------------------------------------------------------------------------
# The side-by-side rounds

LOADS = ["amqp", "jobs", "SET -P1", "GET -P1", "SET -P16", "GET -P16", "busy EVAL"]
LOAD_TITLES = {"amqp": "amqp 256B", "jobs": "redis jobs"}


def side_by_side(bench, plan, servers, runs):
    """R rounds.  In each, one load after the other, every target takes its closed-loop run of
    that load back to back with the others (the order rotated each round), so that the targets
    of one comparison run within seconds of each other: this machine's speed drifts over
    minutes, with its neighbours, by more than the differences measured.  Then, per load, every
    target its paced run.  The paced rate is fixed after round 1: PACED_FRACTION of the slowest
    target's closed-loop throughput, so that no target is near saturation and the latency
    measures the path, not a queue."""
    paced = {}
    order = list(TARGETS)
    closed = [("amqp", lambda port: bench.amqp(port, plan["max_s"]), "amqp"),
              ("jobs", lambda port: bench.jobs(port, plan["max_s"]), "redis")]
    for pipeline, n in ((1, plan["rb_p1"]), (16, plan["rb_p16"])):
        for test in ("set", "get"):
            closed.append(("%s -P%d" % (test.upper(), pipeline),
                           lambda port, t=test, pl=pipeline, k=n: bench.redis_benchmark(
                               port, t, pl, k), "redis"))
    closed.append(("busy EVAL", lambda port: bench.redis_benchmark(
        port, "eval", 1, plan["eval_n"], command=["EVAL", BUSY_SCRIPT, "0"]), "redis"))
    for rnd in range(plan["rounds"]):
        log("round %d/%d" % (rnd + 1, plan["rounds"]))
        targets = order[rnd % len(order):] + order[:rnd % len(order)]

        def each_target():
            for target in targets:
                s = servers.get(target)
                if s is not None and not s.alive():
                    continue
                yield target, s, (s.ports if s else servers["ports_direct"])
        for load, fn, proto in closed:
            for target, s, ports in each_target():
                with Probe(s.pid if s else None) as p:
                    res = fn(ports[proto])
                record(runs, rnd, load, target, "max", res, p, s)
        for load in ("amqp", "jobs"):
            if load not in paced:
                got = [r["throughput"] for r in runs if r["load"] == load and r["mode"] == "max"
                       and r["throughput"] and not r["error"]]
                paced[load] = round(min(got) * PACED_FRACTION, -1) if got else 1000.0
        for load, fn, proto in (("amqp", bench.amqp, "amqp"), ("jobs", bench.jobs, "redis")):
            for target, s, ports in each_target():
                with Probe(s.pid if s else None) as p:
                    res = fn(ports[proto], plan["paced_s"], rate=paced[load])
                record(runs, rnd, load, target, "paced", res, p, s)
        log("  round %d done" % (rnd + 1))
    return paced


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def paired(runs, load, target, ref, value):
    """Per round, value(run of target) / value(run of ref) for the same load and round: the
    ratio of two runs seconds apart.  (median, lowest, highest) over the rounds, or Nones."""
    ratios = []
    for rnd in sorted({r["round"] for r in runs}):
        def one(t):
            got = [value(r) for r in runs if r["round"] == rnd and r["load"] == load
                   and r["target"] == t and not r["error"] and r["complete"]]
            got = [v for v in got if v]
            return got[0] if got else None
        mine, base = one(target), one(ref)
        if mine and base:
            ratios.append(mine / base)
    if not ratios:
        return None, None, None
    return statistics.median(ratios), min(ratios), max(ratios)


def summarize(runs):
    """Medians over rounds per (load, target): throughput and CPU from the closed-loop runs,
    latency from the paced ones (redis-benchmark: its own); and against HAProxy, the median of
    the per-round ratios with their range."""
    out = []
    for load in LOADS:
        row = {}
        for target in TARGETS:
            ok = [r for r in runs if r["load"] == load and r["target"] == target
                  and not r["error"] and r["complete"]]
            mx = [r for r in ok if r["mode"] == "max"]
            lat = [r for r in ok if r["mode"] == "paced"] or mx
            peaks = [r["proxy_peak_rss_kib"] for r in runs if r["load"] == load
                     and r["target"] == target and r["proxy_peak_rss_kib"]]
            row[target] = {
                "load": load, "target": target, "rounds": len(mx),
                "throughput": median([r["throughput"] for r in mx]),
                "p50_us": median([r["p50_us"] for r in lat]),
                "p99_us": median([r["p99_us"] for r in lat]),
                "cpu_s_per_100k": median([r.get("cpu_s_per_100k") for r in mx]),
                "cpu_s_per_100k_paced": median([r.get("cpu_s_per_100k") for r in ok
                                                if r["mode"] == "paced"]),
                "peak_rss_kib": max(peaks) if peaks else None,
                "dup_pct": median([100.0 * (r["duplicates"] or 0) / r["messages"] for r in mx
                                   if r["messages"] and r["duplicates"] is not None]),
                "failed_runs": len([r for r in runs if r["load"] == load and r["target"] == target
                                    and (r["error"] or not r["complete"])]),
            }
        for target in TARGETS:
            e = row[target]
            for ref in ("direct", "haproxy"):
                base = row[ref]["throughput"]
                e["vs_" + ref] = e["throughput"] / base if e["throughput"] and base else None
            # CPU per message is compared at the same message rate when there is one: in the
            # closed loop a slower target also batches less per wakeup.
            key = "cpu_s_per_100k_paced" if row["haproxy"]["cpu_s_per_100k_paced"] else \
                "cpu_s_per_100k"
            hc, mine = row["haproxy"][key], e[key]
            e["cpu_vs_haproxy"] = mine / hc if mine and hc else None
            mode = "paced" if key == "cpu_s_per_100k_paced" else "max"
            tp = paired(runs, load, target, "haproxy",
                        lambda r: r["throughput"] if r["mode"] == "max" else None)
            e["vs_direct_paired"], e["vs_direct_lo"], e["vs_direct_hi"] = paired(
                runs, load, target, "direct",
                lambda r: r["throughput"] if r["mode"] == "max" else None)
            cpu = paired(runs, load, target, "haproxy",
                         lambda r: r.get("cpu_s_per_100k") if r["mode"] == mode else None)
            e["vs_haproxy_paired"], e["vs_haproxy_lo"], e["vs_haproxy_hi"] = tp
            e["cpu_vs_haproxy_paired"], e["cpu_vs_haproxy_lo"], e["cpu_vs_haproxy_hi"] = cpu
            out.append(e)
    return out


def fmt(v, spec, dash="-"):
    return dash if v is None else format(v, spec)


def print_table(summary, paced, meta):
    cols = "%-11s %-13s %9s %14s %14s %7s %7s %8s %8s %14s %7s %6s"
    head = cols % ("load", "target", "msgs/s", "/direct", "/haproxy", "p50 us", "p99 us",
                   "cpu max", "cpu@rate", "cpu/haproxy", "RSS MiB", "dup %")
    print()
    print("%s (threads %d) vs %s (nbthread %d); %s, load average %.1f before the run; "
          "medians of %d round(s)" % (meta["twice_version"], meta.get("twice_threads", 1),
                                      meta["haproxy_version"], meta["haproxy_threads"],
                                      meta["cpus"], meta["loadavg_before"][0], meta["rounds"]))
    if meta.get("neighbours"):
        print("warning: running beside the bench: %s" % ", ".join(meta["neighbours"]))
    print("latency (p50, p99) of amqp and jobs at a fixed rate every target sustains: %s" %
          ", ".join("%s %.0f/s" % (k, v) for k, v in paced.items()))
    print(head)
    print("-" * len(head))
    last = None
    def ratio(med, lo, hi):
        if med is None:
            return "-"
        if lo is None or hi is None or lo == hi:
            return "%.2f" % med
        return "%.2f %.2f-%.2f" % (med, lo, hi)
    for e in summary:
        if last is not None and e["load"] != last:
            print()
        last = e["load"]
        print(cols % (
            LOAD_TITLES.get(e["load"], e["load"]), e["target"], fmt(e["throughput"], ".0f"),
            ratio(e["vs_direct_paired"], e["vs_direct_lo"], e["vs_direct_hi"]),
            ratio(e["vs_haproxy_paired"], e["vs_haproxy_lo"], e["vs_haproxy_hi"]),
            fmt(e["p50_us"], ".0f"), fmt(e["p99_us"], ".0f"), fmt(e["cpu_s_per_100k"], ".3f"),
            fmt(e["cpu_s_per_100k_paced"], ".3f"),
            ratio(e["cpu_vs_haproxy_paired"], e["cpu_vs_haproxy_lo"], e["cpu_vs_haproxy_hi"]),
            fmt(e["peak_rss_kib"] / 1024 if e["peak_rss_kib"] else None, ".1f"),
            fmt(e["dup_pct"], ".2f")))
    print("/direct, /haproxy and cpu/haproxy: the median over the rounds of the ratio to the "
          "direct run's or HAProxy's run\nof the same round (seconds apart), and its "
          "lowest-highest.  cpu: proxy CPU seconds per "
          "100k messages (utime+stime), closed loop\nand at the fixed rate; cpu/haproxy compares "
          "cpu@rate where there is one.  RSS: the proxy's VmRSS peak\nduring that load's runs "
          "(process-wide: it includes what earlier loads left).")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------
# Cost curves

def sized_redis(bench, port, size):
    """SET then GET of `size`-byte values (redis-benchmark, no pipeline): one result, the two
    runs' requests and mean throughput."""
    n = max(200, min(20000, (64 << 20) // size))
    a = bench.redis_benchmark(port, "set", 1, n, value=size)
    b = bench.redis_benchmark(port, "get", 1, n, value=size)
    tp = [x["throughput"] for x in (a, b) if x.get("throughput")]
    return {"sent": 2 * n, "throughput": sum(tp) / len(tp) if len(tp) == 2 else None,
            "complete": bool(a.get("complete") and b.get("complete")),
            "error": a.get("error") or b.get("error")}


def size_curve(bench, plan, servers, direct_ports, proto="amqp"):
    """Proxy CPU per message for each size, closed loop: AMQP (at most ~8 MiB in flight) or
    Redis SET and GET (sized_redis).  Per size, size_rounds runs of every target back to back
    (order rotated), the median of each."""
    targets = ("direct", "haproxy", "twice-tcp", "twice-parse")
    out = []
    for size in plan["sizes"]:
        inflight = max(16, min(1000, (8 << 20) // size))
        runs = {t: [] for t in targets}
        for rnd in range(plan.get("size_rounds", 1)):
            for target in targets[rnd % len(targets):] + targets[:rnd % len(targets)]:
                s = servers.get(target)
                if s is not None and not s.alive():
                    continue
                port = (s.ports if s else direct_ports)[proto]
                with Probe(s.pid if s else None) as p:
                    if proto == "amqp":
                        res = bench.amqp(port, plan["size_s"], size=size, inflight=inflight)
                    else:
                        res = sized_redis(bench, port, size)
                r = {"throughput": res.get("throughput"), "messages": messages_of(res),
                     "error": res.get("error"), "complete": res.get("complete"),
                     "proxy_cpu_s": p.cpu, "proxy_peak_rss_kib": p.peak_kib}
                if p.cpu is not None and r["messages"]:
                    r["cpu_us_per_msg"] = p.cpu / r["messages"] * 1e6
                if r["error"] or not r["complete"]:
                    log("  size %d %s: PROBLEM %s" % (size, target, r["error"] or "incomplete"))
                runs[target].append(r)
        for target in targets:
            rs = runs[target]
            good = [r for r in rs if r["throughput"] and not r["error"] and r["complete"]]
            cpus = [r["cpu_us_per_msg"] for r in good if r.get("cpu_us_per_msg") is not None]
            e = {"size": size, "target": target, "proto": proto, "runs": rs,
                 "throughput": median([r["throughput"] for r in good]),
                 "error": next((r["error"] for r in rs if r["error"]), None),
                 "complete": bool(rs) and all(r["complete"] for r in rs),
                 "proxy_peak_rss_kib": max((r["proxy_peak_rss_kib"] or 0 for r in rs),
                                           default=None)}
            if cpus:
                e["cpu_us_per_msg"] = median(cpus)
                e["cpu_us_per_msg_range"] = [min(cpus), max(cpus)]
                e["cpu_s_per_100k"] = e["cpu_us_per_msg"] / 10
            if e["throughput"]:
                e["mib_per_s"] = e["throughput"] * size / (1 << 20)
            out.append(e)
        log("  %s size %7d done" % (proto, size))
    return out


RESP_PING = b"*1\r\n$4\r\nPING\r\n"


def open_idle(port, n, socks):
    """Opens n connections that each PING once (a connected, idle worker) and stay open."""
    batch = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        s.sendall(RESP_PING)
        batch.append(s)
        if len(batch) == 500:
            _read_pongs(batch)
            socks += batch
            batch = []
    _read_pongs(batch)
    socks += batch


def _read_pongs(batch):
    for s in batch:
        got = b""
        while len(got) < 7:
            chunk = s.recv(7 - len(got))
            if not chunk:
                raise EOFError("connection closed before +PONG")
            got += chunk


def connection_curve(bench, plan, tmp, redis_port, levels, haproxy_threads, problems):
    """For each proxy (a fresh process): RSS and CPU per job as idle connections pile up.
    RSS per pair counts only what opening the idle connections added, not what the active
    load left (twice's Celery profile remembers every delivery until its ack)."""
    out = []
    up = {"redis": redis_port}
    starters = {
        "haproxy": lambda: start_haproxy(tmp, "haproxy-conns", up, levels[-1] + 64,
                                         haproxy_threads),
        # One listener holding (nearly) every session the descriptors allow, as HAProxy's maxconn.
        "twice-tcp": lambda: start_twice(tmp, "twice-tcp-conns", "tcp", up, levels[-1] + 64),
        "twice-parse": lambda: start_twice(tmp, "twice-parse-conns", "parse", up,
                                           levels[-1] + 64),
    }
    active = ["--producers", "1", "--consumers", "2"]
    for target, start in starters.items():
        s = start()
        port = s.ports["redis"]
        socks = []
        idle_kib = 0   # RSS growth while idle connections were opened, active load left out
        try:
            bench.jobs(port, 0.3, rate=ACTIVE_RATE, extra=active)   # warm-up: buffers, code
            for level in levels:
                before = status_kib(s.pid, "VmRSS")
                open_idle(port, level - len(socks), socks)
                time.sleep(0.3)
                rss = status_kib(s.pid, "VmRSS")
                idle_kib += rss - before
                with Probe(s.pid) as p:
                    res = bench.jobs(port, plan["active_s"], rate=ACTIVE_RATE, extra=active)
                e = {"target": target, "connections": level, "rss_kib": rss,
                     "idle_growth_kib": idle_kib, "rss_per_pair_kib": idle_kib / level,
                     "throughput": res.get("throughput"), "p99_us": res.get("p99_us"),
                     "messages": messages_of(res), "proxy_cpu_s": p.cpu,
                     "error": res.get("error"), "complete": res.get("complete")}
                if p.cpu is not None and e["messages"]:
                    e["cpu_us_per_msg"] = p.cpu / e["messages"] * 1e6
                if e["error"] or not e["complete"] or not s.alive():
                    log("  conns %d %s: PROBLEM %s" % (level, target, e["error"] or "incomplete"))
                out.append(e)
                if not s.alive():
                    break
            log("  %-12s %5d idle connections: %.1f KiB per pair" % (
                target, levels[-1], out[-1]["rss_per_pair_kib"]))
        except OSError as err:
            log("  %s: %s" % (target, err))
            out.append({"target": target, "connections": len(socks) + 1, "error": str(err)})
        finally:
            for x in socks:
                x.close()
            s.stop()
            problems[s.name] = log_problems(s)
    return out


# ---------------------------------------------------------------------------------------------
# Charts

def gnuplot(outdir, name, script, data):
    """Writes name.dat and name.gp, renders name.png; returns the png path or None."""
    dat = os.path.join(outdir, name + ".dat")
    with open(dat, "w") as f:
        f.write(data)
    gp = os.path.join(outdir, name + ".gp")
    png = os.path.join(outdir, name + ".png")
    with open(gp, "w") as f:
        f.write("set terminal pngcairo size 1000,560 font ',10'\nset output '%s'\n" % png)
        f.write("set grid ytics\nset key outside right top\n")
        f.write(script.replace("DATA", "'%s'" % dat))
    r = subprocess.run(["gnuplot", gp], stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        log("gnuplot %s failed: %s" % (name, r.stderr.strip()[-300:]))
        return None
    return png


def charts(outdir, summary, sizes, conns):
    pngs = []
    rows = ["# load " + " ".join(TARGETS)]
    for load in LOADS:
        vals = [next((e["throughput"] for e in summary if e["load"] == load
                      and e["target"] == t), None) for t in TARGETS]
        rows.append('"%s" ' % LOAD_TITLES.get(load, load) + " ".join(
            "%.1f" % v if v else "NaN" for v in vals))
    plot = ", ".join("DATA using %d%s title '%s'" % (i + 2, ":xtic(1)" if i == 0 else "", t)
                     for i, t in enumerate(TARGETS))
    pngs.append(gnuplot(outdir, "throughput",
                        "set title 'Throughput per target and load (median)'\n"
                        "set style data histograms\nset style histogram clustered gap 1\n"
                        "set style fill solid 0.85 border -1\nset logscale y\n"
                        "set xrange [-0.6:%.1f]\n" % (len(LOADS) - 0.4) +
                        "set ylabel 'messages / s (log)'\nset yrange [1000:*]\n"
                        "plot " + plot + "\n", "\n".join(rows) + "\n"))

    def curve(name, title, xlabel, ylabel, key, ykey, targets, entries, logy=True):
        lines = []
        for t in targets:
            pts = sorted((e[key], e[ykey]) for e in entries if e.get("target") == t
                         and e.get(ykey) is not None and e.get(key))
            if pts:
                lines.append((t, pts))
        if not lines:
            return None
        data = "\n\n\n".join("# %s\n" % t + "\n".join("%g %g" % p for p in pts)
                             for t, pts in lines) + "\n"
        plot = ", ".join("DATA index %d with linespoints lw 2 title '%s'" % (i, t)
                         for i, (t, _) in enumerate(lines))
        return gnuplot(outdir, name,
                       "set title '%s'\nset xlabel '%s'\nset ylabel '%s'\nset logscale x\n%s"
                       "plot %s\n" % (title, xlabel, ylabel, "set logscale y\n" if logy else "",
                                      plot), data)

    pngs.append(curve("cost_size", "Proxy CPU per AMQP message vs message size",
                      "message size (bytes)", "proxy CPU microseconds per message", "size",
                      "cpu_us_per_msg", ["haproxy", "twice-tcp", "twice-parse"],
                      [e for e in sizes if e.get("proto", "amqp") == "amqp"]))
    pngs.append(curve("cost_size_redis", "Proxy CPU per Redis SET or GET vs value size",
                      "value size (bytes)", "proxy CPU microseconds per request", "size",
                      "cpu_us_per_msg", ["haproxy", "twice-tcp", "twice-parse"],
                      [e for e in sizes if e.get("proto") == "redis"]))
    pngs.append(curve("cost_conns_cpu", "Proxy CPU per job vs open connections (2000 jobs/s)",
                      "open connections", "proxy CPU microseconds per job", "connections",
                      "cpu_us_per_msg", ["haproxy", "twice-tcp", "twice-parse"], conns))
    pngs.append(curve("cost_conns_rss", "Proxy RSS per idle connection pair",
                      "open connections", "KiB per client+upstream pair", "connections",
                      "rss_per_pair_kib", ["haproxy", "twice-tcp", "twice-parse"], conns))
    return [p for p in pngs if p]


# ---------------------------------------------------------------------------------------------
# Big replies: one LRANGE of BIG_LIST elements (about 37 MB), read at once by one client, and
# sent by BIG_IDLE clients that read nothing for BIG_STALL_S seconds.

BIG_LIST = 3000000
BIG_IDLE = 5
BIG_STALL_S = 4.0


def big_list(port):
    """The list (built once, directly) and the length of its LRANGE reply."""
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    script = ("local t = {} for i = 1, tonumber(ARGV[1]) do t[#t + 1] = i "
              "if #t == 5000 then redis.call('RPUSH', KEYS[1], unpack(t)) t = {} end end "
              "if #t > 0 then redis.call('RPUSH', KEYS[1], unpack(t)) end return 1")
    for a in ([b"DEL", b"bench:big"],
              [b"EVAL", script.encode(), b"1", b"bench:big", str(BIG_LIST).encode()]):
        s.sendall(b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in a))
        buf = b""
        while not buf.endswith(b"\r\n"):
            buf += s.recv(100)
    s.close()
    # "$L\r\n" (L < 10 digits), the digits, "\r\n": L + 6 bytes an element.
    return len(b"*%d\r\n" % BIG_LIST) + sum(len(str(i)) + 6 for i in range(1, BIG_LIST + 1))


LRANGE = b"*4\r\n$6\r\nLRANGE\r\n$9\r\nbench:big\r\n$1\r\n0\r\n$2\r\n-1\r\n"


def read_n(sock, n):
    """n bytes from sock: (seconds to the first byte, seconds to the last)."""
    t0 = time.monotonic()
    first, got = None, 0
    while got < n:
        d = sock.recv(min(1 << 20, n - got))
        if not d:
            raise OSError("closed after %d of %d bytes" % (got, n))
        if first is None:
            first = time.monotonic() - t0
        got += len(d)
    return first, time.monotonic() - t0


def big_replies(servers, want):
    """Per target: first-byte and last-byte time of one big reply read at once, the proxy's RSS
    growth while passing it, and while BIG_IDLE clients do not read theirs."""
    out = []
    s = socket.create_connection(("127.0.0.1", servers["ports_direct"]["redis"]), timeout=120)
    s.sendall(LRANGE)
    read_n(s, want)   # warm: the first LRANGE of a list is slower in Redis itself
    s.close()
    for t in ("direct", "haproxy", "twice-tcp", "twice-parse"):
        port = servers["ports_direct"]["redis"] if t == "direct" else servers[t].ports["redis"]
        pid = None if t == "direct" else servers[t].pid
        e = {"target": t}
        try:
            base = status_kib(pid, "VmRSS") if pid else None
            with Probe(pid) as pr:
                s = socket.create_connection(("127.0.0.1", port), timeout=120)
                s.sendall(LRANGE)
                e["first_byte_s"], e["last_byte_s"] = read_n(s, want)
                s.close()
            if pid:
                e["rss_growth_kib"] = pr.peak_kib - base
            socks = []
            with Probe(pid) as pr:
                for _ in range(BIG_IDLE):
                    s = socket.create_connection(("127.0.0.1", port), timeout=120)
                    s.sendall(LRANGE)
                    socks.append(s)
                time.sleep(BIG_STALL_S)   # the scenario: clients that do not read
            if pid:
                e["idle_rss_growth_kib"] = pr.peak_kib - base
            for s in socks:
                read_n(s, want)
                s.close()
        except OSError as err:
            e["error"] = str(err)
        out.append(e)
    return out


def print_big(big, want):
    print("\nbig reply: LRANGE of %d elements (%.1f MB); %d clients not reading it for %.0f s"
          % (BIG_LIST, want / 1e6, BIG_IDLE, BIG_STALL_S))
    direct = next((e for e in big if e["target"] == "direct"), {})
    hap = next((e for e in big if e["target"] == "haproxy"), {})
    print("%12s %12s %12s %10s %16s %20s %12s" % ("target", "first byte", "last byte", "x direct",
                                                   "RSS growth", "RSS, 5 not reading", "x haproxy"))
    for e in big:
        if e.get("error"):
            print("%12s  error: %s" % (e["target"], e["error"]))
            continue
        ratio = e["last_byte_s"] / direct["last_byte_s"] if direct.get("last_byte_s") else None
        hr = (e.get("idle_rss_growth_kib") or 0) / max(1, hap.get("idle_rss_growth_kib") or 1) \
            if e.get("idle_rss_growth_kib") is not None and hap else None
        print("%12s %11.3fs %11.3fs %10s %12s KiB %16s KiB %12s" % (
            e["target"], e["first_byte_s"], e["last_byte_s"], fmt(ratio, ".2f"),
            fmt(e.get("rss_growth_kib"), "d"), fmt(e.get("idle_rss_growth_kib"), "d"),
            fmt(hr, ".1f")))
    sys.stdout.flush()


def print_curves(sizes, conns):
    titles = {"amqp": "proxy CPU per AMQP message vs size (closed loop",
              "redis": "proxy CPU per Redis SET or GET vs value size (redis-benchmark -P1, closed loop"}
    for proto in ("amqp", "redis"):
        entries = [e for e in sizes if e.get("proto", "amqp") == proto]
        if not entries:
            continue
        n = max((len(e.get("runs", [])) for e in entries), default=1)
        print("\n%s; medians of %d run(s): us per message (lowest-highest), messages/s)"
              % (titles[proto], n))
        targets = ("direct", "haproxy", "twice-tcp", "twice-parse")
        print("%9s " % "size" + " ".join("%30s" % t for t in targets))
        for size in sorted({e["size"] for e in entries}):
            cells = []
            for t in targets:
                e = next((x for x in entries if x["size"] == size and x["target"] == t), None)
                if e is None or not e.get("throughput"):
                    cells.append("%30s" % "-")
                    continue
                rng = e.get("cpu_us_per_msg_range")
                spread = " (%s-%s)" % (fmt(rng[0], ".1f"), fmt(rng[1], ".1f")) if rng and n > 1 else ""
                cells.append("%30s" % ("%s%s us %.0f/s" % (fmt(e.get("cpu_us_per_msg"), ".1f"),
                                                            spread, e["throughput"])))
            print("%9d " % size + " ".join(cells))
    print("\nidle connections: proxy RSS per client+upstream pair, CPU per job of a %d jobs/s "
          "load beside them" % ACTIVE_RATE)
    targets = ("haproxy", "twice-tcp", "twice-parse")
    print("%7s " % "conns" + " ".join("%26s" % t for t in targets))
    for level in sorted({e["connections"] for e in conns}):
        cells = []
        for t in targets:
            e = next((x for x in conns if x["connections"] == level and x["target"] == t), None)
            if e is None or e.get("rss_kib") is None:
                cells.append("%26s" % "-")
            else:
                cells.append("%26s" % ("%.1f KiB/pair %s us/job" % (
                    e["rss_per_pair_kib"], fmt(e.get("cpu_us_per_msg"), ".1f"))))
        print("%7d " % level + " ".join(cells))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------

def version_of(argv):
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=10)
        return r.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


# Programs whose presence beside the bench skews its numbers (brokers, proxies, loads).
NEIGHBOURS = ("beam.smp", "redis-server", "haproxy", "redis-benchmark", "amqp_load",
              "redis_jobs", "twice", "valgrind", "memcheck-amd64-", "callgrind-amd64")


def busy_neighbours():
    """Brokers, proxies and loads already running (before the bench starts its own):
    ["name pid", ...].  They share the cores with the run and move its numbers."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/comm" % pid) as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in NEIGHBOURS or comm.startswith("twice"):
            found.append("%s %s" % (comm, pid))
    return sorted(found)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--twice", required=True, help="the twice binary")
    ap.add_argument("--quick", action="store_true", help="one short round (under 2 minutes)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"),
                    help="results.json and charts go here (default build/bench)")
    ap.add_argument("--rounds", type=int, help="rounds of the side-by-side runs")
    ap.add_argument("--haproxy-threads", type=int, default=1,
                    help="HAProxy nbthread (default 1)")
    ap.add_argument("--threads", type=int, default=1,
                    help="twice's `threads` (default 1; compare with --haproxy-threads)")
    ap.add_argument("--skip-curves", action="store_true", help="only the side-by-side table")
    args = ap.parse_args()

    global TWICE_THREADS
    TWICE_THREADS = args.threads
    plan = dict(PLANS["quick" if args.quick else "full"])
    if args.rounds:
        plan["rounds"] = args.rounds
    harness.TWICE_BIN = os.path.abspath(args.twice)
    if not os.access(harness.TWICE_BIN, os.X_OK):
        sys.exit("bench: %s is not an executable" % args.twice)
    t0 = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    ensure_packages()
    tools = build_tools(os.path.join(args.out, "bin"))
    bench = Bench(tools, plan)

    # Two descriptors per proxied connection, all in one process: the hard limit caps the
    # connection curve.  Root may raise it (up to fs.nr_open); others keep what they have.
    nofile = raise_nofile_to(2 * MAX_IDLE + 1024)
    top = min(MAX_IDLE, (nofile - 256) // 2)
    levels = sorted({min(x, top) for x in plan["levels"]})

    neighbours = busy_neighbours()
    if neighbours:
        log("warning: already running beside the bench, its numbers will move: %s" %
            ", ".join(neighbours))
    tmp = harness.make_tmpdir("twice-bench-")
    log("starting redis and rabbitmq")
    redis = start_redis(tmp, maxclients=top + 100)
    rabbit = harness.start_rabbitmq(tmp)
    up = {"amqp": rabbit.port, "redis": redis.port}
    servers = {"ports_direct": up,
               "haproxy": start_haproxy(tmp, "haproxy", up, 4096, args.haproxy_threads)}
    for mode in ("tcp", "parse", "faults"):
        servers["twice-" + mode] = start_twice(tmp, "twice-" + mode, mode, up)

    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": args.quick,
            "rounds": plan["rounds"], "plan": plan, "cpus": "%d CPUs" % os.cpu_count(),
            "loadavg_before": os.getloadavg(), "kernel": platform.release(),
            "neighbours": neighbours,
            "twice": harness.TWICE_BIN,
            "twice_version": version_of([harness.TWICE_BIN, "--version"]),
            "haproxy_version": version_of(["haproxy", "-v"]).split(" - ")[0],
            "haproxy_threads": args.haproxy_threads,
            "twice_threads": args.threads,
            "redis_version": version_of(["redis-server", "--version"]),
            "amqp_load": AMQP_LOAD, "jobs_load": JOBS_LOAD, "nofile": nofile,
            "twice_configs": {m: twice_config(m, {"amqp": 0, "redis": 0}, up)
                              for m in ("tcp", "parse", "faults")}}
    runs = []
    paced = side_by_side(bench, plan, servers, runs)
    summary = summarize(runs)
    print_table(summary, paced, meta)

    sizes, conns = [], []
    if not args.skip_curves:
        log("cost curve: message size")
        sizes = size_curve(bench, plan, servers, up)
        log("cost curve: Redis value size")
        sizes += size_curve(bench, plan, servers, up, proto="redis")
    log("big replies")
    want = big_list(up["redis"])
    big = big_replies(servers, want)
    print_big(big, want)
    problems = {name: log_problems(servers[name]) for name in PROXIES}
    exited = {name: servers[name].proc.returncode for name in PROXIES if not servers[name].alive()}
    hwm = {name: status_kib(servers[name].pid, "VmHWM") for name in PROXIES
           if servers[name].alive()}
    for name in PROXIES:
        servers[name].stop()
    if not args.skip_curves:
        log("cost curve: idle connections %s" % levels)
        conns = connection_curve(bench, plan, tmp, redis.port, levels, args.haproxy_threads,
                                 problems)
        print_curves(sizes, conns)

    meta["seconds"] = round(time.monotonic() - t0, 1)
    meta["loadavg_after"] = os.getloadavg()
    result = {"meta": meta, "paced_rates": paced, "summary": summary, "runs": runs,
              "cost_size": sizes, "cost_conns": conns, "big_replies": big,
              "proxy_vm_hwm_kib": hwm,
              "proxy_exits": exited, "twice_log_problems": problems}
    path = os.path.join(args.out, "results.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    pngs = charts(args.out, summary, sizes, conns)
    for name, p in problems.items():
        for msg, e in p.items():
            print("%s logged %d x %s, e.g. %s" % (name, e["count"], msg, e["example"]))
    for name, rc in exited.items():
        print("%s EXITED with %s during the run" % (name, rc))
    print("\nresults: %s\ncharts: %s\n(%.0f s)" % (path, " ".join(pngs), meta["seconds"]))
    redis.stop()
    rabbit.stop()
    failed = [r for r in runs if r["error"] or not r["complete"]]
    return 1 if exited or len(failed) > len(runs) // 10 else 0


if __name__ == "__main__":
    sys.exit(main())
