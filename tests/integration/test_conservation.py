#!/usr/bin/python3
"""Conservation: rules that imitate at-least-once delivery may run a job
twice, never zero times.  Under every such rule at once (no `drop`), each
message id that was published is processed at least once.

AMQP (a real RabbitMQ, pika; `AmqpConservation`):
  one `protocol amqp` listener with a journal, seed 11, and seven rules on
  queue `conserve`, each with probability 10%:
    redeliver   on acks        (ack -> reject(requeue) upstream)
    duplicate   on deliveries  (a second copy at once, the first ack swallowed)
    delay 400ms on acks        (the ack reaches the broker late)
    expire 300ms on deliveries (a visibility timeout: reject(requeue) if not
                                acked within 300 ms; one message in eight is
                                processed slowly, 600 ms, so it fires)
    close before on acks       (the connection is cut instead of the ack)
    redeliver after 300ms on acks, duplicate after 300ms on deliveries (late
                               copies: the ack held, the message requeued at D)
  N = 300 messages with unique message ids are published through twice in
  confirm mode (every publish confirmed); three consumers, through twice,
  prefetch 10, manual acks (one of them acks in batches of three with
  multiple=True), reconnecting after a cut, record every id they process.
  Asserted: the set of processed ids is the set of published ids
  (duplicates allowed, losses not); the broker ends with nothing ready or
  unacked; no consumer ever sees a channel error (an ack of a tag the broker
  did not expect would close the channel with 406); the journal has a
  DELIVER record for every published id; every rule injected faults; twice
  is still running, logged no protocol error, and exits cleanly.

Redis (real framework apps of tests/e2e through `protocol resp` listeners
with a profile; `RedisConservation`): a driver run per framework under the
rules that do not mean to lose jobs, each at probability 15% (seed 11):
    celery   (visibility timeout 3 s): redeliver on acks, duplicate (and
             duplicate after 1s) on deliveries, delay 4s on acks (past the visibility timeout),
             close before on acks with `limit 3`: kombu 5.2.4 keeps counting
             a message whose ack failed (the cut connection) against the
             worker's prefetch (QoS.ack raises before it frees the slot, and
             only an ack of the same tag by the same worker frees it), so a
             worker that sees 4 failed acks (its prefetch) stops fetching and
             the jobs still queued never run: Celery's own loss (seen with
             seed 3 and no limit), which three cuts cannot cause
    streams  (XAUTOCLAIM after 3 s): redeliver on acks, duplicate on
             deliveries, delay 1s on acks
    rq       duplicate (and duplicate after 1s) on deliveries, redeliver (and
             redeliver after 1s) on acks, delay 1s on acks, close before on
             acks (the work horse's finish transaction)
    sidekiq  duplicate (and duplicate after 1s) on deliveries (Sidekiq never
             acks)
    bullmq   (lockDuration 1 s, stalledInterval 0.5 s, jobs that work 1.5 s)
             drop and delay 2s on lock renewals, duplicate on deliveries,
             redeliver, delay 3s and close before (`limit 3`) on completions;
             max-stalled 5: a job two rules fault stalls twice, which BullMQ's
             default maxStalledCount of 1 turns into a failure (it ran, and the
             verdict counts it failed), not a loss of twice's making
  Asserted: the driver drained (exit 0), its summary's `never_ran` is zero
  for every task, every enqueued id has a run in the runs file, and the
  journal has a DELIVER record for every enqueued id.  `close before` is
  left out of streams: the example consumer (worker.py) does not reconnect
  after a cut connection, it exits, and a worker that exits ends the
  driver's run; that says nothing about twice.

No durations are asserted: every wait has a generous timeout.
TWICE_CONSERVE_SEED=N runs the same tests with another seed.
"""

import collections
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import driverkit as dk  # noqa: E402
import clientkit as ck  # noqa: E402
from driverkit import read_lines  # noqa: E402

import pika  # noqa: E402
from pika.exceptions import AMQPChannelError, AMQPConnectionError, ChannelClosedByBroker  # noqa: E402

SEED = int(os.environ.get("TWICE_CONSERVE_SEED") or 11)


def journal_kinds(path):
    """[(kind name, record)] of a journal (after twice stopped)."""
    _, recs, truncated = fk.decode_journal(path)
    return [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs], truncated


# ---------------------------------------------------------------------------
# AMQP

N_AMQP = 300
QUEUE = "conserve"
SLOW_EVERY = 8          # one message in eight is processed slowly (600 ms > expire 300 ms)
AMQP_RULES = {
    "lost-ack": ["when ack queue=%s" % QUEUE, "probability 10%", "do redeliver"],
    "dup": ["when deliver queue=%s" % QUEUE, "probability 10%", "do duplicate"],
    "late-ack": ["when ack queue=%s" % QUEUE, "probability 10%", "do delay 400ms"],
    "vt": ["when deliver queue=%s" % QUEUE, "probability 10%", "do expire 300ms"],
    "crash": ["when ack queue=%s" % QUEUE, "probability 10%", "do close before"],
    "late-copy": ["when ack queue=%s" % QUEUE, "probability 10%", "do redeliver after 300ms"],
    "late-dup": ["when deliver queue=%s" % QUEUE, "probability 10%", "do duplicate after 300ms"],
}


class Consumer(threading.Thread):
    """Consumes QUEUE through twice with manual acks until stopped; records
    every message id it processed (before acking it).  A cut connection
    (close before) is reconnected; a channel closed by the broker is an
    error (it would mean twice acked a tag the broker did not expect)."""

    def __init__(self, name, port, processed, lock, multiple=False):
        super().__init__(daemon=True, name=name)
        self.port = port
        self.multiple = multiple    # ack in batches with multiple=True
        self.pending = []
        self.processed, self.lock = processed, lock
        self.cuts = 0
        self.errors = []
        self.stopping = threading.Event()

    def _on(self, ch, method, props, body):
        mid = props.message_id
        if body != b"job " + (mid or "").encode():
            self.errors.append("body %r for message id %r" % (body[:60], mid))
        n = int(mid.split("-")[1]) if mid and "-" in mid else 0
        if n % SLOW_EVERY == 0 and not method.redelivered:
            time.sleep(0.6)          # a slow handler: past `expire 300ms`
        with self.lock:
            self.processed.append((mid, method.redelivered, self.name))
        if not self.multiple:
            ch.basic_ack(method.delivery_tag)
            return
        self.pending.append(method.delivery_tag)
        if len(self.pending) >= 3:
            self._ack_pending(ch)

    def _ack_pending(self, ch):
        if self.pending:
            ch.basic_ack(max(self.pending), multiple=True)
            self.pending = []

    def run(self):
        while not self.stopping.is_set():
            self.conn = None
            try:
                self.conn = ck.pika_conn(self.port)
                ch = self.conn.channel()
                ch.basic_qos(prefetch_count=10)
                ch.basic_consume(QUEUE, self._on, auto_ack=False)
                self.pending = []
                while not self.stopping.is_set():
                    self.conn.process_data_events(time_limit=0.1)
                    self._ack_pending(ch)
            except (ChannelClosedByBroker, AMQPChannelError) as e:
                self.errors.append("channel error: %r" % (e,))
                time.sleep(0.2)
            except AMQPConnectionError:
                self.cuts += 1          # `close before` cut us: reconnect
                time.sleep(0.05)
            except Exception as e:  # noqa
                self.errors.append("unexpected: %r" % (e,))
                time.sleep(0.2)
            finally:
                try:
                    if self.conn is not None and self.conn.is_open:
                        self.conn.close()
                except Exception:  # noqa
                    pass

    def stop(self):
        self.stopping.set()
        self.join(30)


class AmqpConservation(ck.BrokerCase):
    RABBITMQ = True
    TMP_PREFIX = "twice-it-conserve-rabbit-"

    def queue_state(self):
        """(ready, unacked) of QUEUE from rabbitmqctl, or None."""
        return ck.queue_counts(self.rabbit).get(QUEUE)

    def test_no_message_lost_under_every_delivery_fault(self):
        port = h.free_port()
        journal = os.path.join(self.tmp, "amqp.pb")
        rules = [fk.rule_block(name, "rabbit", *lines) for name, lines in AMQP_RULES.items()]
        tw = self.twice(fk.conf_text([ck.amqp_listen("rabbit", port, self.rabbit.port)], rules,
                                     seed=SEED, journal=journal, log_level="info", grace="2s"))

        # Publish through twice, confirm mode: every message reached the queue.
        ids = ["m-%d" % i for i in range(N_AMQP)]
        pub = ck.pika_conn(port)
        pch = pub.channel()
        pch.queue_declare(QUEUE)
        pch.queue_purge(QUEUE)
        pch.confirm_delivery()
        for mid in ids:
            # BlockingChannel in confirm mode raises if the broker nacks or returns it
            pch.basic_publish("", QUEUE, b"job " + mid.encode(),
                              pika.BasicProperties(message_id=mid, delivery_mode=2),
                              mandatory=True)
        self.assertEqual(pch.queue_declare(QUEUE, passive=True).method.message_count, N_AMQP)
        pub.close()

        processed, lock = [], threading.Lock()
        consumers = [Consumer("c%d" % i, port, processed, lock, multiple=(i == 2)) for i in range(3)]
        for c in consumers:
            c.start()
        self.addCleanup(lambda: [c.stop() for c in consumers])

        # Until every id was processed, and then until the broker has nothing
        # ready or unacked (late acks and expiries settle) and nothing new
        # was processed for 3 s.
        want = set(ids)
        deadline = time.monotonic() + 240
        last_n, last_change = -1, time.monotonic()
        state = None
        while time.monotonic() < deadline:
            with lock:
                n = len(processed)
                seen = {m for m, _, _ in processed}
            if n != last_n:
                last_n, last_change = n, time.monotonic()
            if want <= seen and time.monotonic() - last_change >= 3:
                state = self.queue_state()
                if state == (0, 0):
                    break
            time.sleep(0.3)
        for c in consumers:
            c.stop()
        with lock:
            got = list(processed)
        seen = collections.Counter(m for m, _, _ in got)
        missing = sorted(want - set(seen), key=lambda m: int(m.split("-")[1]))
        unknown = sorted(set(seen) - want)
        h.log("AMQP: %d publishes, %d processings (%d ids more than once), %d cuts, broker %r" % (
            N_AMQP, len(got), sum(1 for v in seen.values() if v > 1), sum(c.cuts for c in consumers),
            state))
        self.assertEqual(missing, [], "published message ids never processed (lost): %d of %d" % (
            len(missing), N_AMQP))
        self.assertEqual(unknown, [], "processed ids nobody published")
        for c in consumers:
            self.assertEqual(c.errors, [], "consumer %s" % c.name)
        self.assertEqual(self.queue_state(), (0, 0), "the broker still has (ready, unacked) messages")
        self.assertIsNone(tw.proc.poll(), "twice exited")
        perr = tw.log_records("amqp protocol error")
        self.assertEqual(perr, [], "twice logged protocol errors")
        tw.stop()

        recs, truncated = journal_kinds(journal)
        self.assertFalse(truncated)
        delivered = collections.Counter(r.get("message_id") for k, r in recs if k == "deliver")
        no_deliver = [m for m in ids if delivered[m] == 0]
        self.assertEqual(no_deliver, [], "published ids without a DELIVER record in the journal")
        faults = collections.Counter(r.get("rule") for k, r in recs if k == "fault")
        h.log("AMQP faults per rule: %s" % dict(faults))
        for rule in AMQP_RULES:
            self.assertGreater(faults[rule], 0, "rule %s injected no fault: the test did not "
                               "exercise it (faults: %s)" % (rule, dict(faults)))
        faulted = {r.get("message_id") for k, r in recs if k == "fault"}
        self.assertEqual(faulted - want, set(), "faults on message ids nobody published")


# ---------------------------------------------------------------------------
# Redis: the example apps

JOBS = 30                # per handler: 60 jobs per run
DRIVER_TIMEOUT = 150


class RedisConservation(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-conserve-redis-"

    def run_conserving(self, framework, profile, rules, visibility_timeout=None, workers=2,
                       args=()):
        port = h.free_port()
        journal = os.path.join(self.tmp, "run.pb")
        listen = ck.resp_listen("jobs", port, self.redis.port, profile=profile)
        blocks = [fk.rule_block(name, "jobs", *lines) for name, lines in rules.items()]
        tw = self.twice(fk.conf_text([listen], blocks, seed=SEED, journal=journal,
                                     log_level="info", grace="1s"))
        extra = args
        args = ["--inspect", "127.0.0.1:%d" % self.redis.port]
        if visibility_timeout is not None:
            args += ["--visibility-timeout", str(visibility_timeout)]
        args += list(extra)
        summary, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=JOBS,
                                    workers=workers, timeout=DRIVER_TIMEOUT, args=args,
                                    env=dict(os.environ, HOME=self.tmp))
        enqueued = [tuple(l.split()) for l in read_lines(files["enqueued"])]
        runs = collections.Counter(l.split()[0] for l in read_lines(files["runs"]))
        never = [m for m, _ in enqueued if runs[m] == 0]

        self.assertEqual(len(enqueued), 2 * JOBS, "jobs the driver enqueued")
        self.assertEqual(never, [], "%s: enqueued jobs that never ran (lost) under rules that "
                         "must not lose any; summary %s" % (framework, summary))
        self.assertEqual(summary["never_ran"], {t: 0 for t in summary["never_ran"]})
        self.assertEqual(rc, 0, "%s driver did not drain: %s" % (framework, summary["reason"]))
        self.assertIsNone(tw.proc.poll(), "twice exited")
        self.assertEqual(tw.log_records("resp protocol error"), [])
        tw.stop()
        recs, truncated = journal_kinds(journal)
        self.assertFalse(truncated)
        delivered = collections.Counter(r.get("message_id") for k, r in recs if k == "deliver")
        self.assertEqual([m for m, _ in enqueued if delivered[m] == 0], [],
                         "enqueued ids without a DELIVER record in the journal")
        faults = collections.Counter(r.get("rule") for k, r in recs if k == "fault")
        doubled = sum(1 for m, _ in enqueued if runs[m] > 1)
        h.log("%s: %d jobs, %d ran more than once; faults per rule %s" % (
            framework, len(enqueued), doubled, dict(faults)))
        self.assertGreater(sum(faults.values()), 0, "no fault was injected at all")
        return summary, faults

    def test_celery(self):
        self.run_conserving("celery_redis", "celery", {
            "lost-ack": ["when ack", "probability 15%", "do redeliver"],
            "dup": ["when deliver", "probability 15%", "do duplicate"],
            "late-dup": ["when deliver", "probability 15%", "do duplicate after 1s"],
            "late-ack": ["when ack", "probability 15%", "do delay 4s"],
            # at most 3 cuts in all: see the module docstring
            "crash": ["when ack", "probability 15%", "limit 3", "do close before"],
        }, visibility_timeout=3)

    def test_streams(self):
        self.run_conserving("streams", "streams", {
            "lost-ack": ["when ack", "probability 15%", "do redeliver"],
            "dup": ["when deliver", "probability 15%", "do duplicate"],
            "late-ack": ["when ack", "probability 15%", "do delay 1s"],
        }, visibility_timeout=3)

    def test_rq(self):
        self.run_conserving("rq", "rq", {
            "dup": ["when deliver", "probability 15%", "do duplicate"],
            "late-dup": ["when deliver", "probability 15%", "do duplicate after 1s"],
            "lost-ack": ["when ack", "probability 15%", "do redeliver"],
            "late-copy": ["when ack", "probability 15%", "do redeliver after 1s"],
            "late-ack": ["when ack", "probability 15%", "do delay 1s"],
            "crash": ["when ack", "probability 15%", "do close before"],
        })

    def test_bullmq(self):
        # Short locks, and jobs that work longer than one (1.5 s against 1 s): a renewal lost
        # lapses the lock while the job runs.  Room for every job at once (2 workers x 40).
        self.run_conserving("bullmq", "bullmq", {
            "stalled-worker": ["when lease", "probability 15%", "do drop"],
            "late-renewal": ["when lease", "probability 15%", "do delay 2s"],
            "dup": ["when deliver", "probability 15%", "do duplicate"],
            "lost-ack": ["when ack", "probability 15%", "do redeliver"],
            "late-ack": ["when ack", "probability 15%", "do delay 3s"],
            "crash": ["when ack", "probability 15%", "limit 3", "do close before"],
        }, args=["--lock-ms", "1000", "--stalled-ms", "500", "--work-ms", "1500",
                 "--concurrency", "40", "--max-stalled", "5"])

    def test_sidekiq(self):
        self.run_conserving("sidekiq", "sidekiq", {
            "dup": ["when deliver", "probability 15%", "do duplicate"],
            "late-dup": ["when deliver", "probability 15%", "do duplicate after 1s"],
        }, workers=3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
