#!/usr/bin/python3
"""Real Celery 5.2 (python3-celery, py-amqp) through a `protocol amqp`
listener in front of RabbitMQ, with task_acks_late=True.

A worker (`celery worker --pool=solo`, a subprocess) runs the task
celery_app.app.charge, which appends "<task_id> <order_id>" to a file; the
test process sends 10 tasks with .delay() through twice too.

- no rule: every task runs exactly once (10 lines, 10 distinct task ids);
- `when ack task=*charge; first 3; do redeliver`: the worker's first three
  acks become reject(requeue) upstream, RabbitMQ redelivers those tasks and
  the worker runs them again under the SAME task id: 13 lines, exactly 3 ids
  twice, and the fault log lines name those 3 task ids as message_id;
- rules/examples/rabbitmq-celery.conf as shipped, two workers started with Celery's defaults
  and events on: the example's rules fault tasks of the `celery` queue only, none of the
  messages Celery sends itself (events, gossip, heartbeats, remote control).
"""

import collections
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import clientkit as ck  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
N_TASKS = 10


def broker_url(port):
    return "amqp://guest:guest@127.0.0.1:%d//" % port


class Worker:
    """`celery worker` in its own process group; stop() = SIGTERM, then SIGKILL.  Its broker
    is RabbitMQ at `port`, or the URL `broker` (Celery on Redis: redis://...)."""

    def __init__(self, tmp, name, port, out_path, defaults=False, broker=None):
        self.log_path = os.path.join(tmp, "worker-%s.log" % name)
        env = dict(os.environ)
        env.update({
            "PYTHONPATH": HERE,
            "TWICE_CELERY_BROKER": broker or broker_url(port),
            "TWICE_CELERY_OUT": out_path,
            "HOME": tmp,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        })
        argv = ["/usr/bin/python3", "-m", "celery", "-A", "celery_app.app", "worker",
                "--pool=solo", "--concurrency=1", "-Q", "celery", "-l", "info",
                "-n", "%s@localhost" % name]
        # Celery's own traffic (heartbeats, gossip, mingle) off, unless the test wants a worker
        # as a user starts it, with events on (-E) too.
        argv += ["-E"] if defaults else ["--without-heartbeat", "--without-gossip",
                                         "--without-mingle"]
        self.proc = h.spawn(argv, log_path=self.log_path, env=env, cwd=tmp)
        h.at_exit(self.kill)

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout=60):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("celery worker exited with %s:\n%s" % (
                    self.proc.returncode, self.log_text()[-4000:]))
            return " ready." in self.log_text()
        h.wait_until(ready, timeout, interval=0.2, what="the celery worker to be ready")

    def stop(self):
        if self.proc.poll() is None:
            h.kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                h.log("celery worker ignored SIGTERM for 20s: SIGKILL")
        self.kill()

    def kill(self):
        h.kill_group(self.proc, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


class CeleryAmqp(ck.BrokerCase):
    RABBITMQ = True
    TMP_PREFIX = "twice-it-celery-"

    @classmethod
    def twice_config(cls):
        cls.plain_port = h.free_port()
        cls.fault_port = h.free_port()
        return fk.conf_text(
            [ck.amqp_listen("plain", cls.plain_port, cls.rabbit.port),
             ck.amqp_listen("rabbit", cls.fault_port, cls.rabbit.port)],
            [fk.rule_block("lost-ack", "rabbit", "when ack task=*charge", "first 3", "do redeliver")],
            seed=1, grace="1s")

    @classmethod
    def set_up_class(cls):
        os.environ.setdefault("TWICE_CELERY_OUT", os.path.join(cls.ctmp, "unused.txt"))
        from celery_app.app import app, charge
        cls.app, cls.charge = app, charge

    def setUp(self):
        super().setUp()
        self.workers = []
        # start from an empty `celery` queue
        ck.declare_queues(self.rabbit.port, "celery", durable=True, purge=True)

    def tearDown(self):
        for w in self.workers:
            w.stop()
        if self._failed() or h.VERBOSE:
            for w in self.workers:
                sys.stderr.write("\n----- worker log -----\n%s\n" % w.log_text()[-6000:])

    def queue_state(self):
        """(ready, unacked) of the `celery` queue from rabbitmqctl, or None."""
        return ck.queue_counts(self.rabbit).get("celery")

    def run_tasks(self, name, port, expect_lines, n_tasks=N_TASKS, workers=1, defaults=False,
                  during=None):
        """Start `workers` workers on `port` (as a user starts them with `defaults`), send
        n_tasks tasks through `port`, call during() once they are sent, wait for `expect_lines`
        executions (and until the broker has settled every message); returns (sent task ids,
        [(task_id, order_id)] lines)."""
        out = os.path.join(self.tmp, "charges-%s.txt" % name)
        open(out, "w").close()
        ws = [Worker(self.tmp, "%s%d" % (name, i), port, out, defaults) for i in range(workers)]
        self.workers += ws
        for w in ws:
            w.wait_ready()
        sent = []
        with self.app.connection_for_write(broker_url(port)) as conn:
            for i in range(n_tasks):
                r = self.charge.apply_async(("order-%d" % i,), connection=conn)
                sent.append(r.id)

        if during is not None:
            during()

        def lines():
            with open(out) as f:
                return [tuple(l.split()) for l in f.read().splitlines() if l.strip()]
        # Wait for `expect_lines` executions; give up early once every task
        # ran and nothing new happened for 10 s (a redelivery comes at once).
        deadline = time.monotonic() + 60
        n, changed = -1, time.monotonic()
        while time.monotonic() < deadline:
            now = len(lines())
            if now != n:
                n, changed = now, time.monotonic()
            if n >= expect_lines:
                break
            if n >= n_tasks and time.monotonic() - changed > 10:
                break
            time.sleep(0.2)
        # Anything more would come from a message the broker still has ready
        # or unacknowledged (a task is acked after it ran: acks_late); once it
        # has neither, every message is settled and no execution can follow.
        h.eventually(lambda: self.queue_state() == (0, 0), 60, interval=0.5)
        got = lines()
        for w in ws:
            w.stop()
            self.assertNotIn("Unrecoverable error", w.log_text())
        return sent, got

    def test_no_rule_each_task_once(self):
        sent, got = self.run_tasks("plain", self.plain_port, N_TASKS)
        self.assertEqual(len(got), N_TASKS, got)
        self.assertEqual(sorted(t for t, _ in got), sorted(sent), "every task ran exactly once")
        self.assertEqual(sorted(o for _, o in got), sorted("order-%d" % i for i in range(N_TASKS)))
        self.assertEqual(fk.fault_records(self.tw, listener="plain"), [])

    def test_lost_ack_three_tasks_twice(self):
        sent, got = self.run_tasks("faulty", self.fault_port, N_TASKS + 3)
        self.assertEqual(len(got), N_TASKS + 3, got)
        per_id = collections.Counter(t for t, _ in got)
        self.assertEqual(set(per_id), set(sent), "every task ran, under the id it was sent with")
        twice_ids = sorted(t for t, n in per_id.items() if n == 2)
        self.assertEqual(len(twice_ids), 3, per_id)
        self.assertEqual(sorted(per_id.values()), [1] * 7 + [2] * 3, per_id)
        # each task's two runs were for the same order
        orders = collections.defaultdict(set)
        for t, o in got:
            orders[t].add(o)
        self.assertTrue(all(len(v) == 1 for v in orders.values()), orders)
        recs = [r for r in fk.fault_records(self.tw, rule="lost-ack")]
        self.assertEqual(len(recs), 3, recs)
        self.assertEqual(sorted(r.get("message_id") for r in recs), twice_ids)
        self.assertTrue(all(r.get("action") == "redeliver" and r.get("event") == "ack"
                            and r.get("queue") == "celery" for r in recs), recs)
        h.log("tasks run twice: %s" % " ".join(twice_ids))

    def test_example_faults_only_tasks(self):
        """rules/examples/rabbitmq-celery.conf as shipped (its addresses and journal replaced),
        in front of two workers started as a user starts them (heartbeats, gossip, mingle,
        events): Celery sends itself messages through RabbitMQ all along (queues celeryev.*,
        *.celery.pidbox, *.reply.celery.pidbox: a `celery inspect ping` too), and the example's
        rules fault none of them, only tasks of the `celery` queue."""
        port = h.free_port()
        journal = os.path.join(self.tmp, "example.pb")
        path = os.path.join(h.SOURCE_DIR, "rules", "examples", "rabbitmq-celery.conf")
        with open(path) as f:
            text = f.read()
        for old, new in (("bind 127.0.0.1:5673", "bind 127.0.0.1:%d" % port),
                         ("upstream 127.0.0.1:5672", "upstream 127.0.0.1:%d" % self.rabbit.port),
                         ("journal twice-journal.pb", "journal %s" % journal)):
            self.assertEqual(text.count("\n%s\n" % old) + text.count("\n  %s\n" % old), 1, old)
            text = text.replace(old, new)
        conf = os.path.join(self.tmp, "example.conf")
        with open(conf, "w") as f:
            f.write(text)
        # what twice check says each rule acts on: the `celery` queue
        check = h.run_twice(["check", "-c", conf])
        self.assertEqual(check.returncode, 0, check)
        summary = [l for l in check.stdout.decode().splitlines() if l.startswith("  rule ")]
        self.assertTrue(summary and all(" queue=celery" in l for l in summary), summary)
        tw = self.twice(text)

        def inspect():
            # A broadcast and its replies cross twice untouched: some worker answers.  Each try
            # waits 10 s for replies (celery's default, 1 s, is not enough on a busy machine),
            # and a worker whose connection a `crash-before-ack` just cut is reconnecting and
            # answers the next one: the test waits for a pong, bounded, not for a time.
            env = dict(os.environ, PYTHONPATH=HERE, TWICE_CELERY_BROKER=broker_url(port),
                       HOME=self.tmp)
            tries = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                r = subprocess.run(["/usr/bin/python3", "-m", "celery", "-A", "celery_app.app",
                                    "inspect", "ping", "--timeout", "10"], env=env, cwd=self.tmp,
                                   timeout=120, capture_output=True)
                tries.append(r)
                if b"pong" in r.stdout:
                    break
            self.assertIn(b"pong", tries[-1].stdout, tries)
        try:
            sent, got = self.run_tasks("defaults", port, 40, n_tasks=40, workers=2,
                                       defaults=True, during=inspect)
        finally:
            tw.stop()
        self.assertEqual(set(t for t, _ in got), set(sent), "every task ran")
        _, recs, _ = fk.decode_journal(journal)
        kinds = [(fk.KIND_NAMES.get(r.get("kind")), r.get("queue") or "") for r in recs]
        own = [q for k, q in kinds if k == "deliver" and q != "celery"]
        self.assertTrue(any(q.startswith("celeryev.") for q in own), own)
        self.assertTrue(any(q.endswith(".reply.celery.pidbox") for q in own), own)
        faulted = [q for k, q in kinds if k == "fault"]
        self.assertTrue(faulted, "no fault in %d tasks" % len(sent))
        self.assertEqual(set(faulted), {"celery"}, "queues faulted")


if __name__ == "__main__":
    unittest.main(verbosity=2)
