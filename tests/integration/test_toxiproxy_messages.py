#!/usr/bin/python3
"""A message toxic added through twice's Toxiproxy API makes a Celery task run twice, and
`twice verdict` says so, on RabbitMQ and on Redis.

Each test runs a twice whose file has `toxiproxy-api`, a journal and a seed, and no listener.  Through the Toxiproxy API, with curl as a user following docs/toxiproxy.md would:

- POST /proxies creates a parsed proxy in front of the real broker: `"protocol": "amqp"` for
  RabbitMQ, `"protocol": "resp", "profile": "celery"` for Redis;
- a toxic with a misspelt attribute is refused with 400 and Toxiproxy's error body, naming
  the attribute and the one that was meant;
- POST /proxies/NAME/toxics adds a `duplicate` toxic {"task": "*charge", "first": 3}, and
  GET lists it;
- a Celery worker (tests/integration/celery_app, acks late, through the proxy) runs 10
  `charge` tasks, whose handler appends its task id to a file: 13 executions, exactly 3 tasks
  twice, under the ids they were sent with, each task's runs for the same order;
- DELETE of the toxic (204, the list empty): 5 more tasks run once each;
- the journal's fault records are the toxic's rule (`NAME.charge_twice`), on the 3 tasks that
  ran twice; `twice verdict` over the journal and the effect lines (one per execution) says
  NOT IDEMPOTENT for `celery_app.app.charge`: 15 messages, 3 faulted, 3 with more than one
  effect, the 3 as examples, exit status 1.
"""

import collections
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import test_celery_amqp as ca  # noqa: E402  (its Worker and broker_url)
import clientkit as ck  # noqa: E402

TASK = "celery_app.app.charge"
FIRST = 3          # tasks the toxic faults
N_TASKS = 10       # tasks sent with the toxic
N_AFTER = 5        # tasks sent after it is removed


class ToxiproxyMessages(ck.BrokerCase):
    REDIS = True
    RABBITMQ = True
    TMP_PREFIX = "twice-it-toximsg-"

    @classmethod
    def set_up_class(cls):
        os.environ.setdefault("TWICE_CELERY_OUT", os.path.join(cls.ctmp, "unused.txt"))
        from celery_app.app import app, charge
        cls.app, cls.charge = app, charge

    def setUp(self):
        super().setUp()
        self.workers = []
        self.api_port = h.free_port()
        self.journal = os.path.join(self.tmp, "%s.pb" % self._testMethodName)
        # No listener in the file: the proxy comes through the API.
        text = "seed 7\njournal %s\ntoxiproxy-api 127.0.0.1:%d\n" % (self.journal, self.api_port)
        text += h.config(grace="1s")
        self.tw = self.twice(text)
        self.tw.wait_for_log(r"toxiproxy API listening.*127\.0\.0\.1:%d" % self.api_port)

    def tearDown(self):
        for w in self.workers:
            w.stop()
        if self._failed() or h.VERBOSE:
            for w in self.workers:
                sys.stderr.write("\n----- worker log -----\n%s\n" % w.log_text()[-6000:])
        if self.tw.proc.poll() is None:
            self.tw.stop()

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

    # -- the brokers ---------------------------------------------------------------------

    def rabbit_settled(self):
        """Whether the `celery` queue has nothing ready or unacked."""
        return ck.queue_counts(self.rabbit).get("celery") == (0, 0)

    def redis_settled(self):
        """Whether kombu's `celery` list and its `unacked` hash are empty."""
        with ck.Conn(self.redis.port) as c:
            return c.cmd("LLEN", "celery") == 0 and c.cmd("HLEN", "unacked") == 0

    def purge_rabbit(self):
        ck.declare_queues(self.rabbit.port, "celery", durable=True, purge=True)

    def purge_redis(self):
        self.assertEqual(self.redis.command("FLUSHALL"), b"OK")

    # -- the tests -------------------------------------------------------------------------

    def test_rabbitmq_duplicate_toxic(self):
        self.purge_rabbit()
        self.run_case("rabbit", {"protocol": "amqp"}, self.rabbit.port, ca.broker_url,
                      self.rabbit_settled)

    def test_redis_duplicate_toxic(self):
        self.purge_redis()
        self.run_case("redis", {"protocol": "resp", "profile": "celery"}, self.redis.port,
                      lambda port: "redis://127.0.0.1:%d/0" % port, self.redis_settled)

    def run_case(self, name, fields, upstream, url, settled):
        """The whole story on proxy `name` (extra POST /proxies `fields`) in front of the
        broker at port `upstream`; url(port) is Celery's broker URL, settled() whether the
        broker holds no message ready or unacked."""
        port = self.create_proxy(name, fields, upstream)
        self.add_toxic(name)
        out = os.path.join(self.tmp, "charges-%s.txt" % name)
        open(out, "w").close()
        w = ca.Worker(self.tmp, name, port, out, broker=url(port))
        self.workers.append(w)
        w.wait_ready()
        sent = self.send_and_wait(url(port), out, N_TASKS, 0, N_TASKS + FIRST, settled)
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
        status, body = self.api("DELETE", "/proxies/%s/toxics/charge_twice" % name)
        self.assertEqual((status, body), (204, None))
        status, listed = self.api("GET", "/proxies/%s/toxics" % name)
        self.assertEqual((status, listed), (200, []))
        later = self.send_and_wait(url(port), out, N_AFTER, N_TASKS,
                                   N_TASKS + FIRST + N_AFTER, settled)
        w.stop()
        self.assertNotIn("Unrecoverable error", w.log_text())
        per_id = collections.Counter(t for t, _ in read_runs(out))
        self.assertEqual([per_id[t] for t in later], [1] * N_AFTER, per_id)

        self.tw.stop()                      # flushes the journal
        _, recs, truncated = fk.decode_journal(self.journal)
        self.assertFalse(truncated)
        faults = [r for r in recs if fk.KIND_NAMES.get(r.get("kind")) == "fault"]
        self.assertEqual(sorted(r.get("message_id") for r in faults), twice_ids, faults)
        self.assertEqual({r.get("rule") for r in faults}, {"%s.charge_twice" % name}, faults)
        self.check_verdict(out, twice_ids)

    def create_proxy(self, name, fields, upstream):
        """POST /proxies; returns the proxy's port."""
        port = h.free_port()
        status, proxy = self.api("POST", "/proxies", dict(
            fields, name=name, listen="127.0.0.1:%d" % port, upstream="127.0.0.1:%d" % upstream))
        self.assertEqual(status, 201, proxy)
        self.assertEqual((proxy["name"], proxy["listen"], proxy["toxics"]),
                         (name, "127.0.0.1:%d" % port, []))
        return port

    def add_toxic(self, name):
        """A wrong toxic refused, then the `duplicate` toxic added and listed."""
        toxic = {"name": "charge_twice", "type": "duplicate", "stream": "downstream",
                 "toxicity": 1.0, "attributes": {"task": "*charge", "first": FIRST}}
        path = "/proxies/%s/toxics" % name
        wrong = dict(toxic, attributes={"task": "*charge", "frist": FIRST})
        status, err = self.api("POST", path, wrong)
        self.assertEqual((status, err), (400, {
            "error": "unknown attribute 'frist' of toxic type duplicate (did you mean 'first'?)",
            "status": 400}))
        status, got = self.api("POST", path, toxic)
        self.assertEqual(status, 200, got)
        for k in ("name", "type", "stream", "toxicity"):
            self.assertEqual(got[k], toxic[k], got)
        self.assertEqual({k: got["attributes"].get(k) for k in toxic["attributes"]},
                         toxic["attributes"], got)
        status, listed = self.api("GET", path)
        self.assertEqual((status, [t["name"] for t in listed]), (200, ["charge_twice"]))

    def send_and_wait(self, url, out, n_tasks, first, expect_lines, settled):
        """Sends n_tasks tasks to `url` (orders first..), waits for expect_lines executions in
        `out` and for the broker to have settled every message (acks late: once it holds
        nothing ready or unacked, no execution can follow); returns the ids sent."""
        sent = []
        with self.app.connection_for_write(url) as conn:
            for i in range(first, first + n_tasks):
                sent.append(self.charge.apply_async(("order-%d" % i,), connection=conn).id)
        h.wait_until(lambda: len(read_runs(out)) >= expect_lines, 90, interval=0.2,
                     what="%d executions" % expect_lines)
        h.eventually(settled, 60, interval=0.5)
        return sent

    def check_verdict(self, out, twice_ids):
        """`twice verdict` over the journal and one effect line per execution."""
        effects = os.path.join(self.tmp, "effects-%s.txt" % self._testMethodName)
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
        line, seen = h.verdict_text_rows(text.stdout.decode(), TASK)
        self.assertEqual(len(line), 1, text.stdout)
        self.assertIn("NOT IDEMPOTENT", line[0])
        # seen through the one proxy the test made, a listener made at run time
        self.assertEqual(len(row["listeners"]), 1, row)
        self.assertTrue(seen.endswith("; " + row["listeners"][0]), text.stdout)


def read_runs(path):
    """[(task_id, order_id)] of the handler's file, one per execution."""
    with open(path) as f:
        return [tuple(l.split()) for l in f.read().splitlines() if l.strip()]


if __name__ == "__main__":
    unittest.main(verbosity=2)
