#!/usr/bin/python3
"""The verdict's evidence about lost work, with real Celery workers:

  stalled      RabbitMQ's consumer timeout (the listener's `consumer-timeout 2s`, as RabbitMQ
               realises it: the channel closed under the consumer, 406) stops a Celery worker
               whose task works longer (Celery 5.2 acks on a new channel, RabbitMQ refuses the
               unknown tag, the worker exits).  The rest of the work waits; twice runs on with
               nothing delivered: `twice verdict --stall-after 3s` says STALLED with the time
               the task stopped, in the text and the JSON, and exits 5.
  set aside    a worker's connection cut at the ack of its second `tasks.charge` task (`when
               ack task=tasks.charge / nth 2 / do close before`) while its prefetch buffer held
               tasks it had not started (Celery's default prefork pool: a child runs the task
               while the worker reads ahead and acks each one as it ends): the broker requeues
               them, Celery drops its buffer and each runs once.  Their redeliveries are no
               copies: the verdict sets them aside and says so, charge_safe is UNTESTED
               (nothing else copied it), and charge, whose cut task did run twice, is still
               NOT IDEMPOTENT.  On RabbitMQ and on Redis
               (kombu restores the dropped tasks after its visibility timeout).
"""

import collections
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import driverkit as dk  # noqa: E402
from driverkit import read_lines  # noqa: E402

SEED = 5
STALL_AFTER_S = 3


class Evidence(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-evidence-"

    def start(self, proto, upstream, rules=(), extra=""):
        port = h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        listen = "listen app {\n  protocol %s\n  bind 127.0.0.1:%d\n  upstream 127.0.0.1:%d\n%s}\n" % (
            proto, port, upstream, extra)
        tw = self.twice(fk.conf_text([listen], list(rules), seed=SEED, journal=journal,
                                     grace="1s"))
        return tw, port, journal

    def verdict(self, journal, effects, *more):
        js = h.run_twice(["verdict", "--journal", journal, "--effects", effects, "--json"]
                         + list(more))
        text = h.run_twice(["verdict", "--journal", journal, "--effects", effects] + list(more))
        self.assertEqual(js.returncode, text.returncode)
        out = text.stdout.decode(errors="replace")
        h.log("twice verdict (exit %d)\n%s" % (text.returncode, out))
        return json.loads(js.stdout.decode()), out, text.returncode

    def test_consumer_timeout_stalls_the_work(self):
        r = self.rabbitmq()
        self.addCleanup(r.ctl, "purge_queue", "celery")  # the tasks it leaves waiting
        tw, port, journal = self.start("amqp", r.port, extra="  consumer-timeout 2s\n")
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        summary, files, rc = dk.run(
            self, "celery_amqp", port, redis_port=self.redis.port, jobs=3, workers=1,
            timeout=15, env=r.env,
            args=["--handlers", "races", "--work-ms", "4000", "--prefetch", "1",
                  "--inspect", "127.0.0.1:%d" % r.port, "--rabbitmqctl", ctl])
        # The worker exits (Celery 5.2 acks on a new channel, RabbitMQ refuses the tag) or hangs:
        # either way the run does not drain.
        self.assertEqual(rc, 1, summary)
        self.assertRegex(summary["reason"], "worker exited|timeout")
        tw.wait_for_log(r"msg=expired .*timeout=consumer-timeout")
        # The run goes on past the stall time with nothing delivered: the absence of work is
        # what a stall is.
        stopped_at = time.time()
        h.wait_until(lambda: time.time() >= stopped_at + STALL_AFTER_S + 1, 30,
                     what="the stall time to pass")
        tw.stop()
        v, text, code = self.verdict(journal, files["effects"], "--stall-after",
                                     "%ds" % STALL_AFTER_S)
        self.assertEqual(code, 5, text)
        self.assertTrue(v["stalled"])
        rows = {t["task"]: t for t in v["tasks"]}
        for task in ("tasks.check_then_act", "tasks.claim_first"):
            self.assertTrue(rows[task]["stalled"], rows[task])
            self.assertGreater(rows[task]["never_delivered"] + rows[task]["unfinished"], 0)
            self.assertIn("warning: %s: STALLED since " % task, text)
        # the task that was running when the channel closed: requeued, never delivered again
        self.assertGreaterEqual(rows["tasks.check_then_act"]["unfinished"], 1)
        self.assertIn("\nstalled: tasks.check_then_act, tasks.claim_first\n", text)
        # a longer stall time: only outstanding work, noted, exit 0
        _, text, code = self.verdict(journal, files["effects"], "--stall-after", "10m")
        self.assertEqual(code, 0, text)
        self.assertIn("note: tasks.claim_first: at the end of the journal, ", text)

    def cut_sets_aside(self, framework, proto, upstream, extra_args, env=None,
                       cut="when ack task=tasks.charge\n  nth 2\n  do close before"):
        tw, port, journal = self.start(
            proto, upstream, ["rule cut on app {\n  %s\n}\n" % cut],
            extra="" if proto == "amqp" else "  profile celery\n")
        summary, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=8,
                                    workers=1, timeout=120, env=env,
                                    args=["--work-ms", "300", "--pool", "prefork"]
                                    + list(extra_args))
        self.assertEqual(rc, 0, summary["reason"])
        tw.stop()
        self.verdict_of_cut(journal, files, cut.startswith("when ack"))

    def verdict_of_cut(self, journal, files, ack_cut):
        runs = collections.Counter(l.split()[0] for l in read_lines(files["runs"]))
        effects = collections.Counter(l.strip() for l in read_lines(files["effects"]))
        task_of = dict(tuple(l.split()) for l in read_lines(files["enqueued"]))
        _, recs, _ = fk.decode_journal(journal)
        delivers = collections.Counter(r.get("message_id") for r in recs
                                       if fk.KIND_NAMES.get(r.get("kind")) == "deliver")
        # the app's truth: a charge ran twice (on RabbitMQ the one whose ack was cut; on Redis
        # the one running when the consuming connection went, restored with the buffer); tasks
        # the buffer held ran once each, though delivered twice
        doubled = sorted(m for m in task_of if effects[m] >= 2)
        self.assertTrue(doubled, "no task did its effect twice")
        self.assertEqual({task_of[m] for m in doubled}, {"tasks.charge"})
        cut = sorted({r.get("message_id") for r in recs
                      if fk.KIND_NAMES.get(r.get("kind")) == "fault" and r.get("rule") == "cut"})
        self.assertEqual(len(cut), 1, recs)
        if ack_cut:
            self.assertIn(cut[0], doubled)
        unstarted = sorted(m for m in task_of if runs[m] == 1 and delivers[m] >= 2)
        self.assertTrue(any(task_of[m] == "tasks.charge_safe" for m in unstarted),
                        "no charge_safe task was prefetched when the connection was cut: %s"
                        % dict(delivers))
        v, text, code = self.verdict(journal, files["effects"])
        rows = {t["task"]: t for t in v["tasks"]}
        self.assertEqual(code, 1, text)
        charge, safe = rows["tasks.charge"], rows["tasks.charge_safe"]
        self.assertEqual(charge["verdict"], "NOT IDEMPOTENT", charge)
        self.assertEqual(charge["examples"], doubled[:5])
        self.assertEqual(safe["verdict"], "UNTESTED", safe)
        self.assertEqual(safe["copies"], 0, safe)
        # Every charge_safe redelivery followed a delivery no worker was seen to finish (its
        # connection went first): all set aside, those of tasks that never started among them.
        redelivered = sorted(m for m in task_of
                             if task_of[m] == "tasks.charge_safe" and delivers[m] >= 2)
        self.assertEqual(safe["set_aside_messages"], len(redelivered), safe)
        self.assertEqual(sorted(safe["set_aside_examples"]), redelivered[:5])
        self.assertIn("tasks.charge_safe: %d %s of %d %s set aside, not counted as copies" % (
            safe["set_aside"], "redelivery" if safe["set_aside"] == 1 else "redeliveries",
            len(redelivered), "message" if len(redelivered) == 1 else "messages"), text)
        self.assertIn("tasks.charge_safe: UNTESTED: no copy reached the handler", text)
        want_aside = [m for m in unstarted if task_of[m] == "tasks.charge_safe"]
        for m in unstarted:
            self.assertEqual(effects[m], 1, m)
        # the report's timeline of one of them says it
        rep = h.run_twice(["report", journal, "--message", want_aside[0]])
        self.assertEqual(rep.returncode, 0)
        self.assertIn(b"set aside", rep.stdout)

    def test_rabbitmq_cut_sets_unstarted_redeliveries_aside(self):
        r = self.rabbitmq()
        # the class's node: no task of another test left in the queue
        r.ctl("purge_queue", "celery")
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        self.cut_sets_aside("celery_amqp", "amqp", r.port,
                            ["--inspect", "127.0.0.1:%d" % r.port, "--rabbitmqctl", ctl], env=r.env)

    def test_redis_cut_sets_unstarted_redeliveries_aside(self):
        # Here the consuming connection (kombu's BRPOP) is cut just after a delivery: its acks
        # go over pooled connections.
        self.cut_sets_aside("celery_redis", "resp", self.redis.port,
                            ["--inspect", "127.0.0.1:%d" % self.redis.port,
                             "--visibility-timeout", "3", "--restore-every", "1"],
                            cut="when deliver task=tasks.charge\n  nth 2\n  do close after")


if __name__ == "__main__":
    unittest.main(verbosity=2)
