#!/usr/bin/python3
"""A verdict that knows races: copies that overlap a running delivery, on every framework.

Each example app of tests/e2e runs its two race handlers through twice (`--handlers races`):

  check_then_act  checks a done-marker, works WORK_MS, does its effect, then sets the marker:
                  a copy that comes after the first run finished does nothing, one that runs
                  beside it passes the check too (NOT idempotent against races)
  claim_first     takes SET NX on a claim key before the work: idempotent against any copy

For BullMQ, Sidekiq, Celery on Redis and on RabbitMQ, RQ and lists, two runs:

  sequential  a rule whose copies come after the first run was settled (a lost ack: `when ack
              ... do redeliver`; Sidekiq, which has no ack: `duplicate after` a delay longer
              than the work).  check_then_act does its effect once per job, and the verdict does
              not call it plain IDEMPOTENT: no copy overlapped, it names the missing evidence and
              the rule that brings it; `--require overlap` makes it UNTESTED, exit 4.
  duplicate   `when deliver ... do duplicate` (Sidekiq: `duplicate after 2s`, as the verdict's
              hint says: its heartbeat gives start times in whole seconds): the copy reaches
              another worker while the first still runs.  check_then_act is NOT IDEMPOTENT
              (and really did its effect twice), claim_first IDEMPOTENT with overlapping copies
              counted and no overlap evidence missing.

The workers are started first and the jobs enqueued one every PACE s (`--pace`), with more
workers than jobs in flight (each one job at a time: Celery's solo pool with a prefetch of 1,
BullMQ's concurrency 1), so that a copy finds an idle worker; Sidekiq runs one process with
threads to spare.
"""

import collections
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import driverkit as dk  # noqa: E402
from driverkit import read_lines  # noqa: E402

SEED = 11
JOBS = 4           # per handler
WORKERS = 6
WORK_MS = 3000
PACE = 1.0         # seconds between two enqueues: at most ~3 first runs at once, and their copies
SIDEKIQ_WORK_MS = 8000  # past a heartbeat (5 s) after the copy came
DRIVER_TIMEOUT = 150

# framework -> (protocol, profile, check-then-act task, claim-first task)
APPS = {
    "bullmq": ("resp", "bullmq", "check_then_act", "claim_first"),
    "sidekiq": ("resp", "sidekiq", "CheckThenAct", "ClaimFirst"),
    "celery_redis": ("resp", "celery", "tasks.check_then_act", "tasks.claim_first"),
    "celery_amqp": ("amqp", None, "tasks.check_then_act", "tasks.claim_first"),
    "rq": ("resp", "rq", "tasks.check_then_act", "tasks.claim_first"),
    "lists": ("resp", "list", "App\\Jobs\\CheckThenAct", "App\\Jobs\\ClaimFirst"),
}


class Races(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-races-"

    def run_app(self, framework, rule, extra=()):
        """twice with one rule in front of the framework's broker, the race handlers through it;
        returns (verdict JSON, verdict text, journal, effects file, Counter of effects)."""
        proto, profile, _, _ = APPS[framework]
        upstream = self.rabbitmq().port if proto == "amqp" else self.redis.port
        port = h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        ids = "  message-id body.json.uuid\n" if profile == "list" else ""
        listen = "listen app {\n  protocol %s\n%s%s  bind 127.0.0.1:%d\n  upstream 127.0.0.1:%d\n}\n" % (
            proto, "  profile %s\n" % profile if profile else "", ids, port, upstream)
        tw = self.twice(fk.conf_text([listen], ["rule race on app {\n%s}\n" % rule], seed=SEED,
                                     journal=journal, grace="1s"))
        args = ["--handlers", "races", "--inspect", "127.0.0.1:%d" % upstream] + list(extra)
        env = None
        workers = WORKERS
        if framework == "sidekiq":
            args += ["--work-ms", str(SIDEKIQ_WORK_MS)]
            workers = 4 * JOBS
        else:
            args += ["--work-ms", str(WORK_MS), "--pace", str(PACE)]
        if framework == "celery_amqp":
            r = self.rabbitmq()
            args += ["--prefetch", "1", "--rabbitmqctl",
                     "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)]
            env = r.env
        elif framework == "celery_redis":
            # a visibility timeout longer than the work: kombu restores no running task
            args += ["--prefetch", "1", "--visibility-timeout", "5", "--restore-every", "1"]
        elif framework == "bullmq":
            args += ["--concurrency", "1", "--lock-ms", "2000", "--stalled-ms", "1000"]
            env = dict(os.environ, HOME=self.tmp)
        summary, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=JOBS,
                                    workers=workers, timeout=DRIVER_TIMEOUT, args=args, env=env)
        self.assertEqual(rc, 0, "%s driver failed: %s" % (framework, summary["reason"]))
        tw.stop()
        effects = collections.Counter(l.strip() for l in read_lines(files["effects"]))
        runs = collections.Counter(l.split()[0] for l in read_lines(files["runs"]))
        enqueued = [tuple(l.split()) for l in read_lines(files["enqueued"])]
        self.assertEqual(len(enqueued), 2 * JOBS)
        self.assertEqual(sorted(m for m, _ in enqueued if runs[m] == 0), [], "jobs never run")
        js = h.run_twice(["verdict", "--journal", journal, "--effects", files["effects"],
                          "--json"])
        text = h.run_twice(["verdict", "--journal", journal, "--effects", files["effects"]])
        self.assertEqual(js.returncode, text.returncode)
        h.log("%s: twice verdict (exit %d)\n%s" % (framework, text.returncode,
                                                   text.stdout.decode(errors="replace")))
        self.enqueued = enqueued
        return (json.loads(js.stdout.decode()), text.stdout.decode(), text.returncode, journal,
                files["effects"], effects)

    def rows(self, v):
        return {t["task"]: t for t in v["tasks"]}

    def sequential(self, framework, rule):
        _, _, cta, claim = APPS[framework]
        v, text, rc, journal, effects_path, effects = self.run_app(framework, rule)
        rows = self.rows(v)
        self.assertEqual(sorted(rows), sorted([cta, claim]), text)
        # The app's truth: copies after the first run never double a check-then-act.
        for m, t in self.enqueued:
            self.assertEqual(effects[m], 1, "effects of %s (%s)" % (m, t))
        r = rows[cta]
        self.assertGreater(r["copies"], 0, "no copy reached %s: %s" % (cta, r))
        self.assertEqual(r["overlapping_copies"], 0, r)
        self.assertEqual(r["verdict"], "IDEMPOTENT", r)
        self.assertIn("overlap", r["evidence_missing"], r)
        self.assertEqual(rc, 0, text)
        self.assertIn("%s: IDEMPOTENT for copies " % cta, text)
        self.assertIn("IDEMPOTENT*", text)
        self.assertIn("no copy ran while an earlier one was running: check-then-act races "
                      "untested", text)
        self.assertIn("`when deliver task=%s` + `do duplicate" % cta, text)
        # CI asks for the overlap: not there, UNTESTED, exit 4
        req = h.run_twice(["verdict", "--journal", journal, "--effects", effects_path,
                           "--require", "overlap", "--json"])
        self.assertEqual(req.returncode, 4, req)
        self.assertEqual(self.rows(json.loads(req.stdout.decode()))[cta]["verdict"], "UNTESTED")

    def duplicate(self, framework, rule):
        _, _, cta, claim = APPS[framework]
        v, text, rc, journal, effects_path, effects = self.run_app(framework, rule)
        rows = self.rows(v)
        self.assertEqual(sorted(rows), sorted([cta, claim]), text)
        # The app's truth: a check-then-act run beside its copy did its effect twice; a claim,
        # never.
        doubled = sorted(m for m, t in self.enqueued if t == cta and effects[m] >= 2)
        self.assertTrue(doubled, "no check-then-act job did its effect twice: %s" % effects)
        for m, t in self.enqueued:
            if t == claim:
                self.assertEqual(effects[m], 1, "effects of %s (%s)" % (m, t))
        self.assertEqual(rows[cta]["verdict"], "NOT IDEMPOTENT", rows[cta])
        self.assertEqual(sorted(rows[cta]["examples"]), doubled[:5])
        r = rows[claim]
        self.assertEqual(r["verdict"], "IDEMPOTENT", r)
        self.assertGreater(r["overlapping_copies"], 0, r)
        self.assertNotIn("overlap", r["evidence_missing"], r)
        self.assertEqual(rc, 1, text)
        self.assertIn("reached a worker while an earlier delivery was still running", text)
        self.assertIn("check-then-act races tested", text)
        req = h.run_twice(["verdict", "--journal", journal, "--effects", effects_path,
                           "--require", "overlap", "--json"])
        self.assertEqual(req.returncode, 1, req)  # NOT IDEMPOTENT comes first
        self.assertEqual(self.rows(json.loads(req.stdout.decode()))[claim]["verdict"],
                         "IDEMPOTENT")

    # -- BullMQ -----------------------------------------------------------------------------------

    def test_bullmq_sequential(self):
        # a lost completion: the lock lapses, the stalled checker hands the job out again
        self.sequential("bullmq", "  when ack\n  do redeliver\n")

    def test_bullmq_duplicate(self):
        self.duplicate("bullmq", "  when deliver\n  do duplicate\n")

    # -- Sidekiq ----------------------------------------------------------------------------------

    def test_sidekiq_sequential(self):
        self.sequential("sidekiq", "  when deliver\n  do duplicate after %dms\n" % (
            SIDEKIQ_WORK_MS + 2000))

    def test_sidekiq_duplicate(self):
        self.duplicate("sidekiq", "  when deliver\n  do duplicate after 2s\n")

    # -- Celery on Redis --------------------------------------------------------------------------

    def test_celery_redis_sequential(self):
        # the ack answered, not applied: kombu's restore brings the task back after its
        # visibility timeout
        self.sequential("celery_redis", "  when ack\n  do redeliver\n")

    def test_celery_redis_duplicate(self):
        self.duplicate("celery_redis", "  when deliver\n  do duplicate\n")

    # -- Celery on RabbitMQ -----------------------------------------------------------------------

    def test_celery_amqp_sequential(self):
        self.sequential("celery_amqp", "  when ack queue=celery\n  do redeliver\n")

    def test_celery_amqp_duplicate(self):
        self.duplicate("celery_amqp", "  when deliver queue=celery\n  do duplicate\n")

    # -- RQ -------------------------------------------------------------------------------------

    def test_rq_sequential(self):
        self.sequential("rq", "  when ack\n  do redeliver\n")

    def test_rq_duplicate(self):
        self.duplicate("rq", "  when deliver\n  do duplicate\n")

    # -- lists ----------------------------------------------------------------------------------

    def test_lists_sequential(self):
        self.sequential("lists", "  when ack\n  do redeliver\n")

    def test_lists_duplicate(self):
        self.duplicate("lists", "  when deliver\n  do duplicate\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
