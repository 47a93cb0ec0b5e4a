#!/usr/bin/python3
"""Any AMQP app, not only Celery: a listener's `message-id` and `task` settings name the
fields where the app keeps its messages' ids and task names, and the journal, the matchers and
the verdict use them.  Real RabbitMQ, pika producers and consumers through twice:

- Spring/MassTransit-shaped messages: the type in a `__TypeId__` header (or the `type`
  property when the header is absent), the id in an `MT-MessageId` header (or the message_id
  property).  With `when deliver, first 4, do duplicate`: two messages of each type come back
  to the consumer (redelivered, same id), the journal names every publish and
  delivery by the app's own id and type, and `twice verdict` calls Charge (a handler that
  records an effect per execution) NOT IDEMPOTENT and ChargeSafe (it skips an id it has seen)
  IDEMPOTENT, by name.
- Laravel-shaped JSON bodies ({"uuid": ..., "displayName": "App\\\\Jobs\\\\Charge", ...}) with
  `message-id body.json.uuid` and `task body.json.displayName`: the journal names them; a
  body without those fields goes unnamed, and the message still goes through unchanged.
- A consumer in Ruby with Bunny (Debian's ruby-bunny), reading the `type` property, and one
  in Node.js with amqplib (npm, installed into tests/node), reading a `type` header: the
  verdict names their handlers by type.
- `duplicate` on publishes: the queue gets a publish twice, on a plain channel and on one in
  confirm mode, where the publisher still gets exactly one confirm per publish.
- The evidence the journal adds for the verdict: a swallowed ack journaled `kept_back`, a
  no-ack delivery `auto_ack`; a pika worker's connection cut with prefetched messages it never
  started: their redeliveries set aside, not counted as copies.
"""

import collections
import json
import os
import subprocess
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import clientkit as ck  # noqa: E402

import pika  # noqa: E402

WAIT = 60


class IdentityTest(ck.BrokerCase):
    RABBITMQ = True
    TMP_PREFIX = "twice-it-identity-"

    def setUp(self):
        super().setUp()
        self.queue = "identity-" + uuid.uuid4().hex[:8]
        ck.declare_queues(self.rabbit.port, self.queue)

    def start(self, listener_extra, rules=()):
        self.port = h.free_port()
        self.journal = os.path.join(self.tmp, "journal.pb")
        text = fk.conf_text([ck.amqp_listen("app", self.port, self.rabbit.port, listener_extra)],
                            list(rules), seed=7, journal=self.journal, log_level="info")
        self.tw = self.twice(text)
        self.addCleanup(self.tw.stop)

    def records(self):
        self.tw.stop()
        _, recs, truncated = fk.decode_journal(self.journal)
        self.assertFalse(truncated)
        return [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs]

    def consume(self, n_runs, handle):
        """Consumes self.queue through twice, calling handle(props, body, redelivered) and
        acking each delivery, until n_runs deliveries were handled."""
        c = ck.pika_conn(self.port)
        ch = c.channel()
        ch.basic_qos(prefetch_count=1)
        runs = []

        def on_msg(chan, method, props, body):
            handle(props, body, method.redelivered)
            runs.append(method.redelivered)
            chan.basic_ack(method.delivery_tag)

        ch.basic_consume(self.queue, on_msg)
        deadline = time.monotonic() + WAIT
        while len(runs) < n_runs:
            if time.monotonic() > deadline:
                raise AssertionError("%d deliveries of %d within %ss" % (len(runs), n_runs, WAIT))
            c.process_data_events(time_limit=0.1)
        c.close()
        return runs

    def verdict(self, effects):
        path = os.path.join(self.tmp, "effects.txt")
        with open(path, "w") as f:
            f.write("".join("%s\n" % e for e in effects))
        r = h.run_twice(["verdict", "--journal", self.journal, "--effects", path, "--json"])
        self.assertIn(r.returncode, (0, 1), r)
        return {t["task"]: t for t in json.loads(r.stdout.decode())["tasks"]}

    def test_typed_messages_named_by_header_and_property(self):
        self.start("message-id header.MT-MessageId property.message_id\n"
                   "task header.__TypeId__ property.type",
                   [fk.rule_block("dup", "app", "when deliver", "first 4", "do duplicate")])
        sent = []  # (id, task)
        c = ck.pika_conn(self.port)
        ch = c.channel()
        for i in range(6):
            task = "Charge" if i % 2 == 0 else "ChargeSafe"
            mid = "order-%d" % i
            if i < 3:  # MassTransit's way: id and type in headers
                props = pika.BasicProperties(headers={"MT-MessageId": mid, "__TypeId__": task},
                                             message_id="not-this-" + mid)
            else:      # properties only
                props = pika.BasicProperties(message_id=mid, type=task)
            ch.basic_publish("", self.queue, b"payload-%d" % i, props)
            sent.append((mid, task))
        c.close()

        effects, seen = [], set()

        def handle(props, body, redelivered):
            mid = (props.headers or {}).get("MT-MessageId") or props.message_id
            task = (props.headers or {}).get("__TypeId__") or props.type
            if task == "Charge":
                effects.append(mid)          # not idempotent: one effect per run
            elif mid not in seen:
                seen.add(mid)
                effects.append(mid)          # idempotent: once per id

        runs = self.consume(len(sent) + 4, handle)
        self.assertEqual(runs.count(True), 4, "four deliveries duplicated: %s" % runs)
        recs = self.records()
        published = {r.get("message_id"): r.get("task") for k, r in recs if k == "publish"}
        self.assertEqual(published, dict(sent))
        delivered = [(r.get("message_id"), r.get("task")) for k, r in recs if k == "deliver"]
        self.assertEqual(sorted(set(delivered)), sorted(sent))
        faults = [r.get("message_id") for k, r in recs if k == "fault" and r.get("rule") == "dup"]
        self.assertEqual(sorted(faults), ["order-0", "order-1", "order-2", "order-3"])
        rows = self.verdict(effects)
        self.assertEqual(rows["Charge"]["verdict"], "NOT IDEMPOTENT", rows)
        self.assertEqual(rows["ChargeSafe"]["verdict"], "IDEMPOTENT", rows)

    def test_laravel_shaped_json_bodies(self):
        self.start("message-id body.json.uuid\ntask body.json.displayName")
        jobs = [(str(uuid.uuid4()), "App\\Jobs\\SendInvoice"),
                (str(uuid.uuid4()), "App\\Jobs\\ChargeCard")]
        bodies = [json.dumps({"uuid": u, "displayName": t, "job": "Illuminate\\Queue\\CallQueuedHandler@call",
                              "maxTries": None, "data": {"commandName": t}}).encode()
                  for u, t in jobs]
        bodies.append(b"not json at all")
        c = ck.pika_conn(self.port)
        ch = c.channel()
        for b in bodies:
            ch.basic_publish("", self.queue, b)
        c.close()
        got = []
        self.consume(len(bodies), lambda props, body, again: got.append(body))
        self.assertEqual(got, bodies, "the bodies arrive unchanged")
        recs = self.records()
        for kind in ("publish", "deliver"):
            named = {r.get("message_id"): r.get("task") for k, r in recs
                     if k == kind and r.get("message_id") in dict(jobs)}
            self.assertEqual(named, dict(jobs), kind)
            self.assertEqual(len([1 for k, r in recs if k == kind]), 3, kind)

    def typed_consumer(self, task_source, prefix, props, command):
        """Six messages, `charge` and `charge_safe` in turn, published with props(task) and
        their ids PREFIX-N; `when deliver, first 4, do duplicate`; the consumer run as
        command(effects file, deliveries to handle).  The journal names every delivery by its
        type, and the verdict names the handlers."""
        self.start(task_source,
                   [fk.rule_block("dup", "app", "when deliver", "first 4", "do duplicate")])
        sent = {}
        c = ck.pika_conn(self.port)
        ch = c.channel()
        for i in range(6):
            task = "charge" if i % 2 == 0 else "charge_safe"
            mid = "%s-%d" % (prefix, i)
            ch.basic_publish("", self.queue, b"x", props(mid, task))
            sent[mid] = task
        c.close()
        effects = os.path.join(self.tmp, "%s-effects.txt" % prefix)
        r = subprocess.run(command(effects, len(sent) + 4), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=WAIT + 30)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        named = {r.get("message_id"): r.get("task") for k, r in self.records() if k == "deliver"}
        self.assertEqual(named, sent)
        with open(effects) as f:
            rows = self.verdict(f.read().split())
        self.assertEqual(rows["charge"]["verdict"], "NOT IDEMPOTENT", rows)
        self.assertEqual(rows["charge_safe"]["verdict"], "IDEMPOTENT", rows)

    def test_bunny_consumer_named_by_type(self):
        script = os.path.join(h.SOURCE_DIR, "tests", "integration", "bunny_consumer.rb")
        self.typed_consumer(
            "task property.type", "bunny",
            lambda mid, task: pika.BasicProperties(message_id=mid, type=task),
            lambda effects, n: ["ruby", script, "127.0.0.1", str(self.port), self.queue, str(n),
                                effects])

    def test_amqplib_consumer_named_by_type_header(self):
        """A Node.js worker on amqplib (npm, tests/node): its handler named by a `type`
        header."""
        node_dir = os.path.join(h.SOURCE_DIR, "tests", "node")
        self.assertTrue(os.path.isdir(os.path.join(node_dir, "node_modules", "amqplib")),
                        "amqplib is not installed in tests/node: run scripts/deps.sh test")
        script = os.path.join(node_dir, "amqplib_consumer.js")
        self.typed_consumer(
            "task header.type", "amqplib",
            lambda mid, task: pika.BasicProperties(message_id=mid, headers={"type": task}),
            lambda effects, n: ["node", script, "127.0.0.1", str(self.port), self.queue, str(n),
                                effects])

    def test_swallowed_acks_and_no_ack_deliveries_are_marked(self):
        """The journal tells the verdict what the wire alone does not: the worker's ack of a
        delivery `duplicate` had already requeued is swallowed (RabbitMQ never gets it) and
        journaled `kept_back`; a delivery to a no-ack consumer is journaled `auto_ack` (it is
        never settled, and is no unfinished work)."""
        self.start("", [fk.rule_block("dup", "app", "when deliver", "first 1", "do duplicate")])
        c = ck.pika_conn(self.port)
        ch = c.channel()
        for mid in ("k-1", "k-2"):
            ch.basic_publish("", self.queue, b"x", pika.BasicProperties(message_id=mid))
        c.close()
        runs = self.consume(3, lambda props, body, again: None)
        self.assertEqual(runs.count(True), 1, runs)
        c = ck.pika_conn(self.port)
        ch = c.channel()
        ch.basic_publish("", self.queue, b"y", pika.BasicProperties(message_id="n-1"))
        got = []
        ch.basic_consume(self.queue, lambda chan, m, p, b: got.append(p.message_id),
                         auto_ack=True)
        deadline = time.monotonic() + WAIT
        while not got:
            self.assertLess(time.monotonic(), deadline, "no delivery to the no-ack consumer")
            c.process_data_events(time_limit=0.1)
        c.close()
        self.assertEqual(got, ["n-1"])
        recs = self.records()
        acks = [(r.get("message_id"), bool(r.get("kept_back"))) for k, r in recs if k == "ack"]
        self.assertEqual(sorted(acks), [("k-1", False), ("k-1", True), ("k-2", False)])
        delivered = [(r.get("message_id"), bool(r.get("auto_ack"))) for k, r in recs
                     if k == "deliver"]
        self.assertEqual(sorted(delivered),
                         [("k-1", False), ("k-1", False), ("k-2", False), ("n-1", True)])
        r = h.run_twice(["report", self.journal, "--message", "n-1"])
        self.assertEqual(r.returncode, 0, r)
        self.assertIn(b" auto-ack (no ack asked) ", r.stdout)

    def test_cut_with_prefetched_messages_sets_their_redeliveries_aside(self):
        """Any AMQP worker, not only Celery: a pika consumer with a prefetch of 8 holds every
        message when twice cuts its connection at its second ack (`when ack / nth 2 / do close
        before`).  RabbitMQ requeues the six it never started and the one whose ack was cut;
        a second consumer runs them.  Those six redeliveries are no copies: the verdict sets
        them aside, charge_safe (once per id) is UNTESTED with nothing copied, and charge, whose
        cut message did run twice, is NOT IDEMPOTENT."""
        self.start("task property.type",
                   [fk.rule_block("cut", "app", "when ack", "nth 2", "do close before")])
        task_of = {"m-%d" % i: "charge" if i % 2 else "charge_safe" for i in range(8)}
        c = ck.pika_conn(self.port)
        ch = c.channel()
        for mid, task in sorted(task_of.items()):
            ch.basic_publish("", self.queue, b"x", pika.BasicProperties(message_id=mid, type=task))
        c.close()
        effects, seen, runs = [], set(), collections.Counter()

        def run(props):
            runs[props.message_id] += 1
            if props.type == "charge" or props.message_id not in seen:
                effects.append(props.message_id)
            seen.add(props.message_id)

        # the first worker: all eight in its buffer before it starts the first
        c = ck.pika_conn(self.port)
        ch = c.channel()
        ch.basic_qos(prefetch_count=8)
        buffered = []
        ch.basic_consume(self.queue, lambda chan, m, p, b: buffered.append((m, p)))
        deadline = time.monotonic() + WAIT
        while len(buffered) < 8:
            self.assertLess(time.monotonic(), deadline, "the prefetch never filled")
            c.process_data_events(time_limit=0.1)
        with self.assertRaises(pika.exceptions.AMQPError):
            for m, p in buffered:
                run(p)
                ch.basic_ack(m.delivery_tag)
                c.process_data_events(time_limit=0.2)
            while True:  # the cut reaches pika at its next read
                c.process_data_events(time_limit=0.1)
                self.assertLess(time.monotonic(), deadline, "the connection was never cut")
        self.assertEqual(sum(runs.values()), 2)
        # the second worker runs what came back
        self.consume(6 + 1, lambda props, body, again: run(props))
        self.assertEqual(set(runs), set(task_of))
        self.assertEqual(sorted(m for m in runs if runs[m] == 2), ["m-1"])
        recs = self.records()
        delivers = collections.Counter(r.get("message_id") for k, r in recs if k == "deliver")
        self.assertEqual(sorted(m for m in delivers if delivers[m] == 2),
                         ["m-%d" % i for i in range(1, 8)])
        rows = self.verdict(effects)
        safe, charge = rows["charge_safe"], rows["charge"]
        self.assertEqual(safe["verdict"], "UNTESTED", safe)
        self.assertEqual(safe["copies"], 0, safe)
        self.assertEqual(safe["set_aside_messages"], 3, safe)
        self.assertEqual(sorted(safe["set_aside_examples"]), ["m-2", "m-4", "m-6"])
        self.assertEqual(charge["verdict"], "NOT IDEMPOTENT", charge)
        self.assertEqual(charge["examples"], ["m-1"])
        self.assertEqual(charge["set_aside_messages"], 3, charge)

    def test_publish_duplicated_with_and_without_confirms(self):
        """`duplicate` on publishes: the queue gets each message twice, same id and body, after
        a plain publish and on a channel in confirm mode; there the broker numbers the copy
        too, and twice swallows its confirm and renumbers the later ones, so the publisher
        gets exactly one confirm per publish (pika's BlockingChannel raises on any other)."""
        self.start("task property.type",
                   [fk.rule_block("twice", "app", "when publish", "do duplicate")])
        c = ck.pika_conn(self.port)
        ch = c.channel()
        ch.basic_publish("", self.queue, b"plain", pika.BasicProperties(message_id="p-1"))
        ch.confirm_delivery()
        for i in (2, 3, 4):
            # each returns once its confirm (an ack) came
            ch.basic_publish("", self.queue, b"confirmed-%d" % i,
                             pika.BasicProperties(message_id="p-%d" % i), mandatory=True)
        c.close()
        got = []
        self.consume(8, lambda props, body, again: got.append((props.message_id, body)))
        self.assertEqual(got, [("p-1", b"plain")] * 2 + [
            ("p-%d" % i, b"confirmed-%d" % i) for i in (2, 3, 4) for _ in range(2)])
        c = ck.pika_conn(self.rabbit.port)
        self.assertEqual(c.channel().queue_declare(self.queue, passive=True).method.message_count, 0)
        c.close()
        recs = self.records()
        self.assertEqual([r.get("message_id") for k, r in recs if k == "fault"],
                         ["p-1", "p-2", "p-3", "p-4"])
        self.assertEqual([r.get("message_id") for k, r in recs if k == "confirm"],
                         ["p-2", "p-3", "p-4"])

if __name__ == "__main__":
    unittest.main(verbosity=2)
