"""Running the end-to-end framework drivers (tests/e2e/<framework>/driver.py) from integration
tests (test_conservation.py, test_resp_frameworks.py, test_verdict_e2e.py,
test_late_copies.py): the command line, the wait, the summary line the driver prints last, and
its logs when a test fails.  FrameworkCase is the test class of the ones that run every
framework: one Redis for the class, RabbitMQ started on first need.

    self.driver_logs = []
    self.addCleanup(dk.dump_logs, self)
    summary, files, rc = dk.run(self, "celery_redis", port, redis_port=..., jobs=..., ...)

`files` names the driver's effects, runs and enqueued lists (read them with read_lines); the
caller asserts on `rc` where its checks want it.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import clientkit as ck  # noqa: E402

E2E = os.path.join(h.SOURCE_DIR, "tests", "e2e")
LISTS = ("effects", "runs", "enqueued")


class FrameworkCase(ck.BrokerCase):
    """One Redis for the whole class (FLUSHALL before each test), RabbitMQ once a test asks
    for it (self.rabbitmq()), each driver's logs dumped when a test fails."""

    REDIS = True
    TMP_PREFIX = "twice-it-frameworks-"

    def setUp(self):
        super().setUp()
        self.assertEqual(self.redis.command("FLUSHALL"), b"OK")
        self.driver_logs = []
        self.addCleanup(dump_logs, self)

    def rabbitmq(self):
        """The class's RabbitMQ node, started on first call."""
        if self.rabbit is None:
            type(self).rabbit = h.start_rabbitmq(self.ctmp)
        return self.rabbit


def read_lines(path):
    """The non-blank lines of a driver's list ([] when the driver never wrote it)."""
    try:
        with open(path) as f:
            return [l for l in f.read().splitlines() if l.strip()]
    except FileNotFoundError:
        return []


def run(tc, framework, port, *, redis_port, jobs, workers, timeout, args=(), env=None,
        during=None):
    """Runs tests/e2e/<framework>/driver.py with its broker at twice's `port` and its effects
    in the Redis at `redis_port`, in tc.tmp/<framework>/, until it exits by itself (it gives up
    after `timeout` s; the test fails 60 s later).  `during()` is called every 0.1 s meanwhile.
    The environment is `env` (default os.environ), with HOME defaulting to tc.tmp.
    Returns (summary dict, {list name: path}, exit status)."""
    d = os.path.join(tc.tmp, framework)
    os.makedirs(d, exist_ok=True)
    files = {n: os.path.join(d, n + ".txt") for n in LISTS}
    argv = [sys.executable, os.path.join(E2E, framework, "driver.py"),
            "--broker", "127.0.0.1:%d" % port,
            "--effects", files["effects"], "--runs", files["runs"],
            "--enqueued", files["enqueued"],
            "--effect-redis", "127.0.0.1:%d" % redis_port,
            "--jobs", str(jobs), "--workers", str(workers),
            "--timeout", str(timeout), "--log-dir", d] + list(args)
    log_path = os.path.join(d, "driver.log")
    tc.driver_logs.append(log_path)
    env = dict(os.environ if env is None else env, PYTHONDONTWRITEBYTECODE="1")
    env.setdefault("HOME", tc.tmp)
    t0 = time.monotonic()
    p = h.spawn(argv, log_path=log_path, env=env, cwd=d)
    deadline = t0 + timeout + 60
    while p.poll() is None:
        if time.monotonic() > deadline:
            h.kill_group(p)
            p.wait(10)
            tc.fail("%s driver still running after %.0fs" % (framework, deadline - t0))
        if during is not None:
            during()
        time.sleep(0.1)
    h.kill_group(p)  # whatever it left behind
    with open(log_path) as f:
        out = f.read()
    summaries = [l for l in out.splitlines() if l.startswith("{")]
    tc.assertTrue(summaries, "%s driver printed no summary (rc=%s):\n%s" % (
        framework, p.returncode, out[-4000:]))
    h.log("%s driver: %.1fs, %s" % (framework, time.monotonic() - t0, summaries[-1][:400]))
    return json.loads(summaries[-1]), files, p.returncode


def dump_logs(tc):
    """When tc failed (or TWICE_IT_VERBOSE): the tail of each driver log of tc.driver_logs and
    of the worker logs beside it."""
    if not (tc._failed() or h.VERBOSE):
        return
    for path in tc.driver_logs:
        sys.stderr.write("\n----- %s -----\n%s\n" % (path, h._tail(path, 80)))
        d = os.path.dirname(path)
        for wl in sorted(os.listdir(d)):
            if wl.startswith("worker-"):
                sys.stderr.write("\n----- %s -----\n%s\n" % (wl, h._tail(os.path.join(d, wl), 40)))
