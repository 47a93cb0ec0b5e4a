#!/usr/bin/python3
"""A message toxic added through twice's Toxiproxy API makes a Celery task run twice, and
`twice verdict` says so.

twice runs with `toxiproxy-api` and a journal, and nothing in its file about the app. Through
the Toxiproxy API, with curl as a user following docs/toxiproxy.md would:

- POST /proxies creates a parsed proxy (`"protocol": "amqp"`) in front of a real RabbitMQ;
- a toxic with a misspelt attribute is refused with 400 and Toxiproxy's error body, naming
  the attribute and the one that was meant;
- POST /proxies/rabbit/toxics adds a `duplicate` toxic: {"task": "*charge", "first": 3};
- a Celery worker (tests/integration/celery_app, acks late, through the proxy) runs 10
  `charge` tasks, whose handler appends its task id to a file: 13 executions, exactly 3 tasks
  twice, under the ids they were sent with, and each task's runs are for the same order;
- DELETE of the toxic: 5 more tasks run once each;
- the journal's fault records are the toxic's rule (`rabbit.charge_twice`), on the 3 tasks
  that ran twice; `twice verdict` over the journal and the effect lines (one per execution)
  says NOT IDEMPOTENT for `celery_app.app.charge`: 15 messages, 3 faulted, 3 with more than one
  effect, exit status 1.
"""

import collections
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import test_celery_amqp as ca  # noqa: E402  (its Worker and broker_url)

import pika  # noqa: E402

TASK = "celery_app.app.charge"
FIRST = 3          # tasks the toxic faults
N_TASKS = 10       # tasks sent with the toxic
N_AFTER = 5        # tasks sent after it is removed


class ToxiproxyMessages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = h.make_tmpdir("twice-it-toximsg-")
        cls.rabbit = h.start_rabbitmq(cls.tmp)
        cls.api_port = h.free_port()
        cls.journal = os.path.join(cls.tmp, "journal.pb")
        # The file names no app listener: the proxy comes through the API.  (One tcp listener,
        # unused, as a twice file has at least one.)
        text = "seed 7\njournal %s\ntoxiproxy-api 127.0.0.1:%d\n" % (cls.journal, cls.api_port)
        text += h.config(h.listen_block("unused", h.free_port(), cls.rabbit.port), grace="1s")
        cls.tw = h.start_twice(text, cls.tmp)
        cls.tw.wait_for_log(r"msg=listening.*127\.0\.0\.1:%d" % cls.api_port)
        os.environ.setdefault("TWICE_CELERY_OUT", os.path.join(cls.tmp, "unused.txt"))
        from celery_app.app import app, charge
        cls.app, cls.charge = app, charge

    @classmethod
    def tearDownClass(cls):
        try:
            if cls.tw.proc.poll() is None:
                cls.tw.stop()
        finally:
            cls.tw.kill()
            cls.rabbit.stop()

    def setUp(self):
        self.workers = []
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=self.rabbit.port, connection_attempts=1, heartbeat=0))
        try:
            ch = conn.channel()
            ch.queue_declare("celery", durable=True)
            ch.queue_purge("celery")
        finally:
            conn.close()

    def tearDown(self):
        for w in self.workers:
            w.stop()
        outcome = getattr(self, "_outcome", None)
        if (outcome is not None and not getattr(outcome, "success", True)) or h.VERBOSE:
            for w in self.workers:
                sys.stderr.write("\n----- worker log -----\n%s\n" % w.log_text()[-6000:])
            sys.stderr.write("\n----- twice log -----\n%s\n-----\n" % self.tw.log_tail(120))

    # -- the API, with curl -------------------------------------------------------------

    def api(self, method, path, body=None):
        """(status, parsed JSON body or None) of one curl request."""
        argv = ["curl", "-sS", "-X", method, "-o", "-", "-w", "\n%{http_code}",
                "http://127.0.0.1:%d%s" % (self.api_port, path)]
        if body is not None:
            argv += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        r = subprocess.run(argv, capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        text, _, status = r.stdout.decode().rpartition("\n")
        return int(status), json.loads(text) if text.strip() else None

    # -- Celery ----------------------------------------------------------------------------

    def queue_state(self):
        """(ready, unacked) of the `celery` queue, or None."""
        r = self.rabbit.ctl("list_queues", "-q", "--no-table-headers", "name", "messages_ready",
                            "messages_unacknowledged")
        for line in r.stdout.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "celery" and parts[1].isdigit() and parts[2].isdigit():
                return int(parts[1]), int(parts[2])
        return None

    def send_and_wait(self, port, out, n_tasks, first, expect_lines):
        """Sends n_tasks tasks through `port` (orders first..), waits for expect_lines
        executions in `out` and for RabbitMQ to have settled every message (acks late: once
        the queue has nothing ready or unacked, no execution can follow); returns the ids."""
        sent = []
        with self.app.connection_for_write(ca.broker_url(port)) as conn:
            for i in range(first, first + n_tasks):
                sent.append(self.charge.apply_async(("order-%d" % i,), connection=conn).id)
        h.wait_until(lambda: len(read_runs(out)) >= expect_lines, 90, interval=0.2,
                     what="%d executions" % expect_lines)
        h.eventually(lambda: self.queue_state() == (0, 0), 60, interval=0.5)
        return sent

    # -- the test ----------------------------------------------------------------------------

    def test_duplicate_toxic_runs_task_twice(self):
        port = h.free_port()
        status, proxy = self.api("POST", "/proxies", {
            "name": "rabbit", "listen": "127.0.0.1:%d" % port,
            "upstream": "127.0.0.1:%d" % self.rabbit.port, "protocol": "amqp"})
        self.assertEqual(status, 201, proxy)
        self.assertEqual((proxy["name"], proxy["listen"], proxy["toxics"]),
                         ("rabbit", "127.0.0.1:%d" % port, []))

        toxic = {"name": "charge_twice", "type": "duplicate", "stream": "downstream",
                 "toxicity": 1.0, "attributes": {"task": "*charge", "first": FIRST}}
        wrong = dict(toxic, attributes={"task": "*charge", "frist": FIRST})
        status, err = self.api("POST", "/proxies/rabbit/toxics", wrong)
        self.assertEqual((status, err), (400, {
            "error": "unknown attribute 'frist' of toxic type duplicate (did you mean 'first'?)",
            "status": 400}))
        status, got = self.api("POST", "/proxies/rabbit/toxics", toxic)
        self.assertEqual(status, 200, got)
        for k in ("name", "type", "stream", "toxicity"):
            self.assertEqual(got[k], toxic[k], got)
        self.assertEqual({k: got["attributes"].get(k) for k in toxic["attributes"]},
                         toxic["attributes"], got)
        status, listed = self.api("GET", "/proxies/rabbit/toxics")
        self.assertEqual((status, [t["name"] for t in listed]), (200, ["charge_twice"]))

        out = os.path.join(self.tmp, "charges.txt")
        open(out, "w").close()
        w = ca.Worker(self.tmp, "toxi", port, out)
        self.workers.append(w)
        w.wait_ready()
        sent = self.send_and_wait(port, out, N_TASKS, 0, N_TASKS + FIRST)
        runs = read_runs(out)
        per_id = collections.Counter(t for t, _ in runs)
        self.assertEqual(set(per_id), set(sent), "every task ran, under the id it was sent with")
        self.assertEqual(sorted(per_id.values()), [1] * (N_TASKS - FIRST) + [2] * FIRST, per_id)
        twice_ids = sorted(t for t, n in per_id.items() if n == 2)
        orders = collections.defaultdict(set)
        for t, o in runs:
            orders[t].add(o)
        self.assertTrue(all(len(v) == 1 for v in orders.values()), orders)

        # Removed, the toxic faults nothing more.
        status, body = self.api("DELETE", "/proxies/rabbit/toxics/charge_twice")
        self.assertEqual((status, body), (204, None))
        status, listed = self.api("GET", "/proxies/rabbit/toxics")
        self.assertEqual((status, listed), (200, []))
        later = self.send_and_wait(port, out, N_AFTER, N_TASKS, N_TASKS + FIRST + N_AFTER)
        w.stop()
        self.assertNotIn("Unrecoverable error", w.log_text())
        per_id = collections.Counter(t for t, _ in read_runs(out))
        self.assertEqual([per_id[t] for t in later], [1] * N_AFTER, per_id)

        self.tw.stop()                      # flushes the journal
        _, recs, truncated = fk.decode_journal(self.journal)
        self.assertFalse(truncated)
        faults = [r for r in recs if fk.KIND_NAMES.get(r.get("kind")) == "fault"]
        self.assertEqual(sorted(r.get("message_id") for r in faults), twice_ids, faults)
        self.assertEqual({r.get("rule") for r in faults}, {"rabbit.charge_twice"}, faults)
        self.check_verdict(out, twice_ids)

    def check_verdict(self, out, twice_ids):
        """`twice verdict` over the journal and one effect line per execution."""
        effects = os.path.join(self.tmp, "effects.txt")
        with open(effects, "w") as f:
            f.write("".join("%s\n" % t for t, _ in read_runs(out)))
        js = h.run_twice(["verdict", "--journal", self.journal, "--effects", effects, "--json"])
        text = h.run_twice(["verdict", "--journal", self.journal, "--effects", effects])
        h.log("twice verdict\n%s" % text.stdout.decode(errors="replace"))
        for r in (js, text):
            self.assertEqual(r.returncode, 1, r)    # 1: NOT IDEMPOTENT
        v = json.loads(js.stdout.decode())
        self.assertEqual(v["verdict"], "NOT IDEMPOTENT")
        rows = {r["task"]: r for r in v["tasks"]}
        self.assertEqual(sorted(rows), [TASK], "verdict rows")
        row = rows[TASK]
        self.assertEqual((row["verdict"], row["messages"], row["faulted"],
                          row["more_than_one_effect"]),
                         ("NOT IDEMPOTENT", N_TASKS + N_AFTER, FIRST, FIRST), row)
        self.assertEqual(sorted(row["examples"]), twice_ids, row)
        line = [l for l in text.stdout.decode().splitlines() if l.split()[:1] == [TASK]]
        self.assertEqual(len(line), 1, text.stdout)
        self.assertIn("NOT IDEMPOTENT", line[0])


def read_runs(path):
    """[(task_id, order_id)] of the handler's file, one per execution."""
    with open(path) as f:
        return [tuple(l.split()) for l in f.read().splitlines() if l.strip()]


if __name__ == "__main__":
    unittest.main(verbosity=2)
