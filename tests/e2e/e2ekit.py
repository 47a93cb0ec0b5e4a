"""Shared code of the end-to-end example apps in tests/e2e/<framework>/.

Two halves, both standard library + python3-redis only:

* The handler side, imported by the Python workers (Celery tasks, RQ jobs, the
  Streams consumer): `charge()` and `charge_safe()`, the two handlers every app
  implements, the race handlers `check_then_act()` and `claim_first()`, and the
  files they write.  Sidekiq's app.rb and BullMQ's app.js do the same.

* The driver side, imported by each <framework>/driver.py: the common command
  line, starting and always stopping worker processes, waiting until the broker
  is drained, and the one-line JSON summary.

The files the handlers write (paths from the environment):

  TWICE_EFFECTS  one line "<message-id>\\n" per side effect: what a
                 non-idempotent handler would do to a database (charge a card).
  TWICE_RUNS     one line "<message-id> <task-name>\\n" per execution of either
                 handler, written after the effect, so counting lines counts
                 finished executions.

Every line is appended with a single write() on a file opened with O_APPEND:
concurrent workers (threads or processes) never interleave partial lines.

The idempotent handler takes a unique key before its side effect:
`SET twice:done:<message-id> 1 NX` on TWICE_EFFECT_REDIS (host:port), a
connection to the REAL Redis, never through the proxy, so that faults injected
on the broker connection cannot touch the idempotency check itself.
"""

import argparse
import atexit
import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

E2E_DIR = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# Handler side

DONE_KEY = "twice:done:%s"


def append_line(path, line):
    """Append one line with a single write() (O_APPEND: atomic w.r.t. other
    appenders for lines far below PIPE_BUF-ish sizes on a local file)."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        n = os.write(fd, data)
        if n != len(data):
            raise OSError("short write to %s: %d of %d bytes" % (path, n, len(data)))
    finally:
        os.close(fd)


def host_port(text):
    """"host:port" -> (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError("expected HOST:PORT, got %r" % text)
    return host, int(port)


_effect_redis = {}  # pid -> client: a forked RQ work horse must not reuse its parent's socket


def effect_redis():
    """The redis-py client of TWICE_EFFECT_REDIS, one per process."""
    pid = os.getpid()
    r = _effect_redis.get(pid)
    if r is None:
        import redis  # python3-redis; imported here so the driver side does not need it at import
        host, port = host_port(os.environ["TWICE_EFFECT_REDIS"])
        r = redis.Redis(host=host, port=port, socket_timeout=10, socket_connect_timeout=10)
        _effect_redis.clear()
        _effect_redis[pid] = r
    return r


def work():
    """A handler's work before its effect: TWICE_WORK_MS milliseconds (0 by default)."""
    ms = float(os.environ.get("TWICE_WORK_MS") or 0)
    if ms > 0:
        time.sleep(ms / 1000.0)


def charge(message_id, task):
    """NOT idempotent: every execution records one effect (after TWICE_WORK_MS of work)."""
    work()
    append_line(os.environ["TWICE_EFFECTS"], message_id)
    append_line(os.environ["TWICE_RUNS"], "%s %s" % (message_id, task))


def charge_safe(message_id, task):
    """Idempotent: the effect is recorded only by the execution that took the
    message's unique key (SET NX is atomic, so two concurrent copies cannot
    both win).  Returns True when this execution produced the effect.  With
    TWICE_DONE_TTL (seconds) the key expires that long after it was taken, as
    a "dedup with a TTL" does: idempotent only against copies that come
    sooner."""
    work()
    ttl = float(os.environ.get("TWICE_DONE_TTL") or 0)
    px = int(ttl * 1000) if ttl > 0 else None
    first = bool(effect_redis().set(DONE_KEY % message_id, 1, nx=True, px=px))
    if first:
        append_line(os.environ["TWICE_EFFECTS"], message_id)
    append_line(os.environ["TWICE_RUNS"], "%s %s" % (message_id, task))
    return first


# The two race handlers (`--handlers races`): both work TWICE_WORK_MS before their effect, so that
# a copy can reach a worker while the first run still runs.  Their keys live in the real Redis,
# as charge_safe's do.
MARK_KEY = "twice:mark:%s"
CLAIM_KEY = "twice:claim:%s"
RACE_HANDLERS = ("check_then_act", "claim_first")


def check_then_act(message_id, task):
    """NOT idempotent against a copy that runs beside it: checks a done-marker, works, does its
    effect, then sets the marker.  A copy that comes after the first run finished finds the
    marker and does nothing; one that comes while the first still works passes the check too."""
    r = effect_redis()
    if not r.exists(MARK_KEY % message_id):
        work()
        append_line(os.environ["TWICE_EFFECTS"], message_id)
        r.set(MARK_KEY % message_id, 1)
    append_line(os.environ["TWICE_RUNS"], "%s %s" % (message_id, task))


def claim_first(message_id, task):
    """Idempotent against any copy: claims the message atomically (SET NX) before the work; only
    the run that took the claim works and does the effect."""
    if effect_redis().set(CLAIM_KEY % message_id, 1, nx=True):
        work()
        append_line(os.environ["TWICE_EFFECTS"], message_id)
    append_line(os.environ["TWICE_RUNS"], "%s %s" % (message_id, task))


# The handler that asks for a retry RETRIES times before it charges (`--retried`): each retry
# is a new delivery of the same id that the app asked for, not a copy.
RETRIES = 2


class RetryAsked(Exception):
    """Raised by a handler to have its framework retry the job."""


# ---------------------------------------------------------------------------
# Driver side: command line

def parse_args(framework, description, defaults=None, extra=None):
    """The command line every driver.py shares.  `extra(parser)` may add
    framework options; `defaults` overrides option defaults."""
    p = argparse.ArgumentParser(prog="%s/driver.py" % framework, description=description)
    p.add_argument("--broker", required=True, metavar="HOST:PORT",
                   help="where the workers and the producer connect (twice's bind address, "
                        "or Redis itself for a run without twice)")
    p.add_argument("--effects", required=True, metavar="FILE",
                   help="effects file (truncated at start): one message id per side effect")
    p.add_argument("--runs", required=True, metavar="FILE",
                   help="runs file (truncated at start): '<message-id> <task>' per execution")
    p.add_argument("--effect-redis", required=True, metavar="HOST:PORT",
                   help="the real Redis the idempotent handler keeps its keys in (not the proxy)")
    p.add_argument("--inspect", metavar="HOST:PORT",
                   help="where the driver looks at queue state to decide the run is over "
                        "(default: --broker; point it at the real Redis so that the driver's "
                        "own polling is not subject to faults)")
    p.add_argument("--jobs", type=int, default=10, metavar="N",
                   help="jobs enqueued per handler (default 10: N charge + N charge_safe)")
    p.add_argument("--workers", type=int, default=2, metavar="W", help="worker count (default 2)")
    p.add_argument("--visibility-timeout", type=float, default=None, metavar="S",
                   help="seconds before an unacknowledged message is handed out again "
                        "(frameworks that have one)")
    p.add_argument("--timeout", type=float, default=120, metavar="T",
                   help="give up after T seconds in all (default 120)")
    p.add_argument("--quiet", type=float, default=2.0, metavar="S",
                   help="once every job ran and the broker is idle, wait for S seconds "
                        "without a new execution before stopping (default 2)")
    p.add_argument("--lost-grace", type=float, default=8.0, metavar="S",
                   help="when the broker is idle but some jobs never ran, wait this long "
                        "without a new execution before calling them lost (default 8)")
    p.add_argument("--log-dir", metavar="DIR",
                   help="where worker logs go (default: the directory of --runs)")
    p.add_argument("--extra-runs", type=int, default=0, metavar="N",
                   help="executions expected beyond one per job (copies a rule makes at a known "
                        "count, e.g. `first 3` with `duplicate after D`): the run is not over "
                        "before them")
    p.add_argument("--done-ttl", type=float, default=0, metavar="S",
                   help="the idempotent handler's key expires S seconds after it is taken "
                        "(default: never; Python apps only)")
    p.add_argument("--enqueued", metavar="FILE",
                   help="also write '<message-id> <task>' for every job enqueued there")
    p.add_argument("--retried", type=int, default=0, metavar="N",
                   help="also enqueue N jobs of the handler that fails RETRIES times, each time "
                        "asking its framework for a retry, before it charges once (celery_amqp, "
                        "rq, sidekiq; default 0)")
    p.add_argument("--handlers", choices=("charge", "races"), default="charge",
                   help="which pair of handlers the jobs name: charge and charge_safe (default), "
                        "or the race handlers check_then_act (a done-marker set after the work) "
                        "and claim_first (SET NX before the work), which work --work-ms first")
    p.add_argument("--work-ms", type=float, default=0, metavar="MS",
                   help="how long each handler works before its effect (default 0; the Python "
                        "apps' charge handlers too, BullMQ's every handler, Sidekiq's race "
                        "handlers)")
    p.add_argument("--pace", type=float, default=0, metavar="S",
                   help="start the workers first, wait until each is ready, then enqueue one job "
                        "every S seconds (default 0: enqueue everything, then start the workers)")
    if extra:
        extra(p)
    if defaults:
        p.set_defaults(**defaults)
    a = p.parse_args()
    a.inspect = a.inspect or a.broker
    a.log_dir = a.log_dir or os.path.dirname(os.path.abspath(a.runs))
    os.makedirs(a.log_dir, exist_ok=True)
    for path in (a.effects, a.runs):
        open(path, "w").close()
    if a.jobs < 1 or a.workers < 1 or a.retried < 0:
        p.error("--jobs and --workers must be at least 1, --retried at least 0")
    return a


def worker_env(args, **more):
    """The environment of the worker processes: the handler files and the
    effect Redis, plus framework settings."""
    env = dict(os.environ)
    env.update({
        "TWICE_EFFECTS": os.path.abspath(args.effects),
        "TWICE_RUNS": os.path.abspath(args.runs),
        "TWICE_EFFECT_REDIS": args.effect_redis,
        "TWICE_DONE_TTL": str(args.done_ttl or ""),
        "TWICE_WORK_MS": str(args.work_ms or ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update({k: str(v) for k, v in more.items()})
    return env


def log(*a):
    """Progress on stderr; stdout carries only the JSON summary."""
    print("[driver %s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Driver side: processes

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def _child_setup():
    # In the child between fork and exec: die with the driver, even if the
    # driver is SIGKILLed (e.g. by a test timeout).
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Workers:
    """Worker processes, each the leader of its own process group, so that a
    stop reaches whatever they forked (RQ work horses, Celery pool children).
    Killed (SIGKILL to the group) at exit whatever happens."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.procs = []  # (name, Popen, log path)
        atexit.register(self.kill)

    def start(self, name, argv, env, cwd):
        path = os.path.join(self.log_dir, "worker-%s.log" % name)
        with open(path, "wb") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=env, cwd=cwd, start_new_session=True, preexec_fn=_child_setup)
        self.procs.append((name, p, path))
        log("started %s (pid %d): %s; log %s" % (name, p.pid, " ".join(argv), path))
        return p

    def wait_ready(self, marker, timeout=60.0):
        """Wait until every worker's log holds `marker` (its framework's "ready" line); False
        when one never says it within timeout or exits first."""
        deadline = time.monotonic() + timeout
        pending = {path for _, _, path in self.procs}
        while pending and time.monotonic() < deadline and not self.dead():
            for path in list(pending):
                try:
                    with open(path, "rb") as f:
                        if marker.encode() in f.read():
                            pending.discard(path)
                except OSError:
                    pass
            time.sleep(0.05)
        return not pending

    def dead(self):
        """[(name, returncode)] of workers that exited on their own."""
        return [(n, p.returncode) for n, p, _ in self.procs if p.poll() is not None]

    def logs(self):
        return [path for _, _, path in self.procs]

    def log_tail(self, n=40):
        out = []
        for name, _, path in self.procs:
            try:
                with open(path, "rb") as f:
                    lines = f.read().decode(errors="replace").splitlines()[-n:]
            except OSError:
                lines = []
            out.append("--- %s ---\n%s" % (name, "\n".join(lines)))
        return "\n".join(out)

    def stop(self, sig=signal.SIGTERM, grace=20.0):
        """A clean stop: `sig` to every group, wait up to `grace` seconds,
        then SIGKILL.  Returns the names of workers that had to be killed."""
        for _, p, _ in self.procs:
            if p.poll() is None:
                _killpg(p, sig)
        deadline = time.monotonic() + grace
        killed = []
        for name, p, _ in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(name)
        self.kill()
        if killed:
            log("workers that ignored %s for %.0fs and were killed: %s" % (
                signal.Signals(sig).name, grace, ", ".join(killed)))
        return killed

    def kill(self):
        for _, p, _ in self.procs:
            _killpg(p, signal.SIGKILL)   # stragglers in the group too, even if the leader is gone
        for _, p, _ in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _killpg(p, sig):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)   # runs the atexit handlers: workers die with us


def install_signal_handlers():
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)


# ---------------------------------------------------------------------------
# Driver side: waiting and the summary

def read_runs(path):
    """[(message_id, task)] in execution order."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    out.append((parts[0], parts[1]))
    except FileNotFoundError:
        pass
    return out


def read_effects(path):
    try:
        with open(path) as f:
            return [l.strip() for l in f if l.strip()]
    except FileNotFoundError:
        return []


def wait_drained(args, workers, broker_idle, expected):
    """Wait until the run is over; returns (ok, reason).

    Over means: `broker_idle()` (queue empty and nothing delivered-but-unacked,
    as the framework defines it; called with exceptions meaning "not idle")
    holds and the runs file has not grown for --quiet seconds, with at least
    `expected` executions; or, with fewer executions (jobs lost), for
    --lost-grace seconds.  A worker that exits, or --timeout, ends it too."""
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    expected += args.extra_runs
    last_n, last_change = -1, t0
    idle_since = None
    last_report = t0
    while True:
        now = time.monotonic()
        n = len(read_runs(args.runs))
        if n != last_n:
            last_n, last_change = n, now
        try:
            idle = bool(broker_idle())
        except Exception as e:  # noqa: a broker hiccup is "not idle yet"
            log("broker state unavailable: %r" % (e,))
            idle = False
        idle_since = (idle_since or now) if idle else None
        if idle:
            quiet_for = now - max(last_change, idle_since)
            if n >= expected and quiet_for >= args.quiet:
                return True, "drained"
            if n < expected and quiet_for >= args.lost_grace:
                return True, "drained, %d executions missing" % (expected - n)
        dead = workers.dead()
        if dead:
            return False, "worker exited: %s" % ", ".join("%s rc=%s" % d for d in dead)
        if now >= deadline:
            return False, "timeout after %.0fs (%d of at least %d executions, broker %s)" % (
                args.timeout, n, expected, "idle" if idle else "busy")
        if now - last_report >= 5:
            log("%d executions so far (at least %d expected), broker %s" % (
                n, expected, "idle" if idle else "busy"))
            last_report = now
        time.sleep(0.1)


def summary(framework, args, enqueued, ok, reason, started, extra=None):
    """The one-line JSON summary.  enqueued: [(message_id, task)]."""
    task_of = dict(enqueued)
    tasks = sorted(set(t for _, t in enqueued))
    runs = read_runs(args.runs)
    effects = read_effects(args.effects)
    per_id_runs = collections.Counter(m for m, _ in runs)
    per_id_effects = collections.Counter(effects)
    execs = collections.Counter(t for _, t in runs)
    effs = collections.Counter(task_of.get(m, "unknown") for m in effects)
    out = {
        "framework": framework,
        "ok": ok,
        "reason": reason,
        "elapsed_s": round(time.monotonic() - started, 2),
        "jobs": {t: sum(1 for _, x in enqueued if x == t) for t in tasks},
        "executions": {t: execs.get(t, 0) for t in tasks},
        "effects": {t: effs.get(t, 0) for t in tasks},
        "ran_more_than_once": {t: sum(1 for m, x in enqueued if x == t and per_id_runs[m] > 1)
                               for t in tasks},
        "never_ran": {t: sum(1 for m, x in enqueued if x == t and per_id_runs[m] == 0)
                      for t in tasks},
        "extra_effects": {t: sum(max(0, per_id_effects[m] - 1) for m, x in enqueued if x == t)
                          for t in tasks},
    }
    unknown = sorted(set(m for m, _ in runs) - set(task_of))
    if unknown:
        out["unknown_ids_ran"] = unknown[:10]
    if "unknown" in effs:
        out["effects"]["unknown"] = effs["unknown"]
    if extra:
        out.update(extra)
    return out


def job_tasks(args, charge, charge_safe, races):
    """The task names the jobs of one round name, by --handlers: (charge, charge_safe) or the
    pair `races` (check_then_act, claim_first)."""
    return tuple(races) if args.handlers == "races" else (charge, charge_safe)


def enqueue_rounds(args, workers, ready_marker, enqueue_round):
    """Enqueues args.jobs rounds (enqueue_round(i) -> [(message_id, task)] for round i).  With
    --pace, after the workers said `ready_marker`, one job of a round every --pace seconds, so
    that a copy finds an idle worker; else all at once.  Returns the (message_id, task) list,
    or None when a worker never got ready."""
    if args.pace > 0 and not workers.wait_ready(ready_marker):
        return None
    enqueued = []
    for i in range(args.jobs):
        for job in enqueue_round(i):
            enqueued.append(job)
            if args.pace > 0:
                time.sleep(args.pace)
    return enqueued


def run_jobs(args, start_workers, ready_marker, enqueue_round):
    """Enqueues the jobs (enqueue_rounds()) and starts the workers (start_workers() -> Workers):
    the jobs first, or with --pace the workers first.  Returns (workers, enqueued), enqueued
    None when a worker never said it was ready."""
    if args.pace > 0:
        workers = start_workers()
        return workers, enqueue_rounds(args, workers, ready_marker, enqueue_round)
    enqueued = enqueue_rounds(args, None, ready_marker, enqueue_round)
    return start_workers(), enqueued


def write_enqueued(args, enqueued):
    if args.enqueued:
        with open(args.enqueued, "w") as f:
            for m, t in enqueued:
                f.write("%s %s\n" % (m, t))


def finish(framework, args, workers, enqueued, ok, reason, started, extra=None):
    """Stop the workers, print the summary, return the exit code: 0 when the
    run drained, 1 otherwise (worker logs are tailed on stderr then)."""
    killed = workers.stop()
    if killed:
        reason += "; killed after the stop grace: %s" % ", ".join(killed)
    if not ok:
        log("run failed: %s\n%s" % (reason, workers.log_tail()))
    extra = dict(extra or {})
    extra["worker_logs"] = workers.logs()
    s = summary(framework, args, enqueued, ok, reason, started, extra)
    print(json.dumps(s, sort_keys=True), flush=True)
    return 0 if ok else 1


def redis_client(addr):
    """A redis-py client for the driver (producer, inspection)."""
    import redis
    host, port = host_port(addr)
    return redis.Redis(host=host, port=port, socket_timeout=15, socket_connect_timeout=10)
