#!/usr/bin/python3
"""`twice verdict` on real workers: find the handler that is not idempotent.

For each of the seven example apps of tests/e2e, the example rule file of
rules/examples/ (its listener's `bind`, `upstream` and `journal` lines
replaced, as the files' headers tell users to do) runs in a twice in front of
the real broker, and the framework's example app runs through it:

  celery_amqp   rules/examples/rabbitmq-celery.conf  RabbitMQ  tasks.charge / tasks.charge_safe
  celery_redis  rules/examples/redis-celery.conf     Redis     tasks.charge / tasks.charge_safe
  sidekiq       rules/examples/sidekiq.conf          Redis     Charge / ChargeSafe
  rq            rules/examples/rq.conf               Redis     tasks.charge / tasks.charge_safe
  streams       rules/examples/streams.conf          Redis     charge / charge_safe
  lists         rules/examples/list.conf             Redis     App\\Jobs\\Charge / App\\Jobs\\ChargeSafe
  bullmq        rules/examples/bullmq.conf           Redis     charge / charge_safe
                                                               (BullMQ 5 and BullMQ 6)

The driver enqueues JOBS jobs of each handler (`charge`: one effect per
execution; `charge_safe`: SET NX on the real Redis first), runs real workers
until the broker is drained, and leaves the effects file behind.  Then
`twice verdict --journal J --effects E --json` (and the text form) must say
what a user wants to learn, and agree with the files:

- `charge` is NOT IDEMPOTENT, `charge_safe` IDEMPOTENT (delivered twice,
  never doubled; not UNTESTED), nothing else (no "(unknown)" row, no effect id the
  journal never saw), exit status 1;
- every enqueued id is in the journal, and each row's messages are the jobs
  enqueued;
- each row's counts are what the journal and the effects file say: messages
  with 2+ effect lines (and every one of them has 2+ DELIVER records), with
  2+ deliveries that reached the handler (DELIVER records less those a
  drop, error or close before withheld), with a FAULT record, delivered or
  faulted without an effect;
- the app did what it claims: `charge` one effect per execution,
  `charge_safe` one per job that ran; a job that ran twice was delivered twice;
- Sidekiq's `drop` on deliver really loses jobs: the jobs that never ran are
  exactly the ones the drop rule faulted, and the verdict counts them as
  NO EFFECT.  On the other brokers every job ran.

test_example_files_check runs `twice check` on every file of rules/examples
as shipped.  The rule files use `probability` with a fixed seed; message ids
are random (task ids, jids, entry ids), so which messages get faulted changes
from run to run, but with JOBS jobs per handler every handler is faulted many
times.  One Redis serves every test (FLUSHALL between them); RabbitMQ is
started once, by the Celery-on-RabbitMQ test.
"""

import collections
import json
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import driverkit as dk  # noqa: E402
from driverkit import read_lines  # noqa: E402

EXAMPLES = os.path.join(h.SOURCE_DIR, "rules", "examples")

# Jobs per handler, per framework (2 x JOBS jobs per run; TWICE_IT_VERDICT_JOBS
# overrides it).  Measured on two cores: the whole file takes about 1 min with
# 200, 1 min 45 s with 1000 (RQ, which forks a work horse per job, ~55 s of
# it; the others 6 to 15 s each, RabbitMQ's start 7 s); 2000 would come close
# to four minutes on a slower machine.
JOBS = int(os.environ.get("TWICE_IT_VERDICT_JOBS") or 300)
WORKERS = 2
SIDEKIQ_THREADS = 5
VISIBILITY_TIMEOUT = 3     # seconds: Celery on Redis, Streams (redis-celery.conf delays acks 6 s)
DRIVER_TIMEOUT = 180       # seconds a driver may take before it gives up by itself

# The placeholder lines of every example file, and what replaces them.
PLACEHOLDERS = {
    "amqp": ("bind 127.0.0.1:5673", "upstream 127.0.0.1:5672"),
    "resp": ("bind 127.0.0.1:6380", "upstream 127.0.0.1:6379"),
}
JOURNAL_LINE = "journal twice-journal.pb"

# framework -> (example file, protocol, non-idempotent task, idempotent task)
FRAMEWORKS = {
    "celery_amqp": ("rabbitmq-celery.conf", "amqp", "tasks.charge", "tasks.charge_safe"),
    "celery_redis": ("redis-celery.conf", "resp", "tasks.charge", "tasks.charge_safe"),
    "sidekiq": ("sidekiq.conf", "resp", "Charge", "ChargeSafe"),
    "rq": ("rq.conf", "resp", "tasks.charge", "tasks.charge_safe"),
    "streams": ("streams.conf", "resp", "charge", "charge_safe"),
    "lists": ("list.conf", "resp", "App\\Jobs\\Charge", "App\\Jobs\\ChargeSafe"),
    "bullmq": ("bullmq.conf", "resp", "charge", "charge_safe"),
}


def replace_line(text, old, new, path):
    """Replaces the directive line `old` (the whole line, blanks aside: the
    comments that mention it stay) with `new`; it must be there once."""
    rx = re.compile(r"^([ \t]*)%s[ \t]*$" % re.escape(old), re.M)
    text, n = rx.subn(lambda m: m.group(1) + new, text)
    if n != 1:
        raise AssertionError("%s: expected the line %r exactly once, found it %d times" % (
            path, old, n))
    return text


class VerdictE2E(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-verdict-"

    # -- the example file, made concrete -----------------------------------------

    def example_conf(self, framework, port, upstream_port, journal):
        """The text of the framework's example file with its bind, upstream
        and journal lines replaced (each must be there exactly once)."""
        name, proto, _, _ = FRAMEWORKS[framework]
        path = os.path.join(EXAMPLES, name)
        with open(path) as f:
            text = f.read()
        bind, upstream = PLACEHOLDERS[proto]
        text = replace_line(text, bind, "bind 127.0.0.1:%d" % port, path)
        text = replace_line(text, upstream, "upstream 127.0.0.1:%d" % upstream_port, path)
        return replace_line(text, JOURNAL_LINE, "journal %s" % journal, path)

    # -- one run -------------------------------------------------------------------

    def run_driver(self, framework, port, extra_args=(), env=None, workers=WORKERS):
        """Run tests/e2e/<framework>/driver.py through twice's port until the
        broker is drained; returns (summary, {name: path of its file})."""
        summary, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=JOBS,
                                    workers=workers, timeout=DRIVER_TIMEOUT, args=extra_args,
                                    env=env)
        self.assertEqual(rc, 0, "%s driver failed: %s" % (framework, summary["reason"]))
        return summary, files

    def verdict(self, journal, effects):
        """(JSON verdict, text verdict); both must exit 1 (NOT IDEMPOTENT)."""
        js = h.run_twice(["verdict", "--journal", journal, "--effects", effects, "--json"])
        text = h.run_twice(["verdict", "--journal", journal, "--effects", effects])
        for r in (js, text):
            self.assertEqual(r.returncode, 1, "twice verdict exit status (1: NOT IDEMPOTENT); "
                             "stdout:\n%s\nstderr:\n%s" % (r.stdout.decode(errors="replace"),
                                                          r.stderr.decode(errors="replace")))
            self.assertEqual(r.stderr, b"")
        return json.loads(js.stdout.decode()), text.stdout.decode()

    def run_framework(self, framework, upstream_port, extra_args=(), env=None, workers=WORKERS):
        """The whole run: twice with the example file, the driver, the
        verdict and every check.  Returns (verdict JSON, Counts)."""
        _, _, unsafe, safe = FRAMEWORKS[framework]
        t0 = time.monotonic()
        port = h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        text = self.example_conf(framework, port, upstream_port, journal)
        conf = os.path.join(self.tmp, "example.conf")
        with open(conf, "w") as f:
            f.write(text)
        check = h.run_twice(["check", "-c", conf])
        self.assertEqual(check.returncode, 0, check.stderr.decode(errors="replace"))
        tw = self.twice(text)
        self.summary, files = self.run_driver(framework, port, extra_args, env, workers)
        tw.stop()                    # flushes the journal
        verdict, table = self.verdict(journal, files["effects"])
        h.log("%s: twice verdict\n%s" % (framework, table))
        c = Counts(files, journal)
        self.check_app(c, unsafe, safe)
        self.check_verdict(verdict, table, c, unsafe, safe)
        h.log("%s: %d jobs per handler, %.1fs from twice's start to the verdict" % (
            framework, JOBS, time.monotonic() - t0))
        return verdict, c

    # -- checks ------------------------------------------------------------------------

    def check_app(self, c, unsafe, safe):
        """The files say what the app claims to do."""
        self.assertEqual(collections.Counter(c.task_of.values()), {unsafe: JOBS, safe: JOBS},
                         "jobs enqueued per task")
        self.assertEqual(set(c.runs) - set(c.task_of), set(), "executions of ids never enqueued")
        self.assertEqual(set(c.effects) - set(c.task_of), set(), "effects of ids never enqueued")
        for m, t in c.task_of.items():
            want = c.runs[m] if t == unsafe else min(c.runs[m], 1)
            self.assertEqual(c.effects[m], want, "effect lines of %s (%s, ran %d times)" % (
                m, t, c.runs[m]))
            if c.runs[m] >= 2:
                self.assertGreaterEqual(c.delivers[m], 2, "DELIVER records of %s (%s), which "
                                        "ran %d times" % (m, t, c.runs[m]))

    def check_verdict(self, v, table, c, unsafe, safe):
        rows = {r["task"]: r for r in v["tasks"]}
        self.assertEqual(sorted(rows), sorted([unsafe, safe]),
                         "verdict rows (a \"(unknown)\" row means records without a task)")
        self.assertEqual(v["verdict"], "NOT IDEMPOTENT")
        self.assertEqual(rows[unsafe]["verdict"], "NOT IDEMPOTENT", rows[unsafe])
        self.assertEqual(rows[safe]["verdict"], "IDEMPOTENT", rows[safe])
        self.assertFalse(v["journal_truncated"])
        self.assertEqual(v["effect_lines"], sum(c.effects.values()))
        self.assertEqual(v["unknown_effects"]["ids"], 0, v["unknown_effects"])
        missing = sorted(set(c.task_of) - c.in_journal)
        self.assertEqual(missing, [], "enqueued ids the journal never names")
        for task in (unsafe, safe):
            ids = [m for m, t in c.task_of.items() if t == task]
            want = {
                "messages": len(ids),
                "faulted": sum(1 for m in ids if c.faults[m] > 0),
                "delivered_more_than_once": sum(1 for m in ids if c.reached(m) >= 2),
                "more_than_one_effect": sum(1 for m in ids if c.effects[m] >= 2),
                "no_effect": sum(1 for m in ids if (c.delivers[m] >= 1 or c.faults[m] >= 1)
                                 and c.effects[m] == 0),
                "doubled_without_second_delivery": 0,
            }
            got = {k: rows[task][k] for k in want}
            self.assertEqual(got, want, "verdict row %s vs the journal and the effects file" % task)
            self.assertGreater(want["faulted"], 0, "no fault reached %s" % task)
            doubled = sorted(m for m in ids if c.effects[m] >= 2)
            self.assertEqual(rows[task]["examples"], doubled[:5], "examples of %s" % task)
            for m in doubled:
                self.assertGreaterEqual(c.delivers[m], 2, "DELIVER records of %s, which has %d "
                                        "effects" % (m, c.effects[m]))
        self.assertGreater(rows[unsafe]["more_than_one_effect"], 0)
        # The text form says the same.
        for task in (unsafe, safe):
            r = rows[task]
            line, seen = h.verdict_text_rows(table, task)
            self.assertEqual(len(line), 1, table)
            self.assertIsNotNone(seen, table)   # which instance and listener it went through
            self.assertEqual(line[0].split()[1:6], [str(r[k]) for k in (
                "messages", "faulted", "delivered_more_than_once", "more_than_one_effect",
                "no_effect")], table)
            self.assertIn(r["verdict"], line[0])
        self.assertIn("\nverdict: NOT IDEMPOTENT\n", table)

    # -- the files as shipped ------------------------------------------------------------

    def test_example_files_check(self):
        """Every example file passes `twice check` as it is, without a warning, and has
        each line the header tells users to change exactly once."""
        shipped = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".conf"))
        for name in shipped:
            path = os.path.join(EXAMPLES, name)
            r = h.run_twice(["check", "-c", path])
            self.assertEqual(r.returncode, 0, "%s:\n%s" % (path, r.stderr.decode(errors="replace")))
            self.assertIn(b": OK: 1 listener", r.stdout)
            # a first run starts from these: nothing in them to be warned about
            self.assertIn(b", 0 warnings\n", r.stdout, "%s:\n%s" % (
                path, r.stderr.decode(errors="replace")))
        for framework, (name, proto, _, _) in sorted(FRAMEWORKS.items()):
            path = os.path.join(EXAMPLES, name)
            self.assertIn(name, shipped)
            with open(path) as f:
                text = f.read()
            for line in PLACEHOLDERS[proto] + (JOURNAL_LINE,):
                replace_line(text, line, line, path)
            self.assertIn("change these two lines", text)

    # -- the six apps -------------------------------------------------------------

    def test_celery_amqp(self):
        r = self.rabbitmq()
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        # The driver runs rabbitmqctl for the unacked count: it needs the
        # node's environment (HOME with the Erlang cookie, loopback-only
        # distribution).
        _, c = self.run_framework("celery_amqp", r.port,
                                  ["--inspect", "127.0.0.1:%d" % r.port, "--rabbitmqctl", ctl],
                                  env=r.env)
        self.assert_every_job_ran(c)

    def test_celery_redis(self):
        _, c = self.run_framework("celery_redis", self.redis.port,
                                  ["--inspect", "127.0.0.1:%d" % self.redis.port,
                                   "--visibility-timeout", str(VISIBILITY_TIMEOUT)])
        self.assert_every_job_ran(c)

    def test_sidekiq(self):
        v, c = self.run_framework("sidekiq", self.redis.port,
                                  ["--inspect", "127.0.0.1:%d" % self.redis.port,
                                   "--lost-grace", "4"], workers=SIDEKIQ_THREADS)
        # drop on deliver: those jobs never ran, and nothing else went missing
        lost = sorted(m for m in c.task_of if c.runs[m] == 0)
        dropped = sorted(c.faulted_by("killed-after-pop"))
        self.assertTrue(lost, "no job was lost: did the drop rule fire?")
        self.assertEqual(lost, sorted(m for m in dropped if c.runs[m] == 0))
        never_redelivered = [m for m in dropped if c.delivers[m] < 2]
        self.assertEqual(sorted(never_redelivered), lost,
                         "dropped jobs that were not delivered again are the lost ones")
        rows = {r["task"]: r for r in v["tasks"]}
        self.assertEqual(sum(r["no_effect"] for r in rows.values()), len(lost),
                         "NO EFFECT counts the lost jobs")
        self.assertEqual(self.summary["dead"], 0, "jobs that failed (Sidekiq's Dead set)")

    def test_rq(self):
        _, c = self.run_framework("rq", self.redis.port,
                                  ["--inspect", "127.0.0.1:%d" % self.redis.port])
        self.assert_every_job_ran(c)
        self.assertEqual(self.summary["failed"], 0, "jobs that failed (rq:failed:default)")

    def test_streams(self):
        _, c = self.run_framework("streams", self.redis.port,
                                  ["--inspect", "127.0.0.1:%d" % self.redis.port,
                                   "--visibility-timeout", str(VISIBILITY_TIMEOUT)])
        self.assert_every_job_ran(c)

    def test_lists(self):
        _, c = self.run_framework("lists", self.redis.port,
                                  ["--inspect", "127.0.0.1:%d" % self.redis.port])
        self.assert_every_job_ran(c)

    def test_bullmq(self):
        self.bullmq("bullmq", 5)

    def test_bullmq6(self):
        self.bullmq("bullmq6", 6)

    def bullmq(self, package, major):
        """The BullMQ app with the npm package `package` of tests/node, BullMQ `major`.x."""
        # Short locks, as the example file suggests for staging: a lapsed lock is found within
        # seconds, not BullMQ's default 30 s + 2 x 30 s.
        v, c = self.run_framework("bullmq", self.redis.port,
                                  ["--inspect", "127.0.0.1:%d" % self.redis.port,
                                   "--lock-ms", "2000", "--stalled-ms", "1000",
                                   "--bullmq", package])
        self.assertRegex(self.summary.get("bullmq") or "", r"^bullmq:%d\." % major,
                         "the BullMQ version Redis saw")
        self.assert_every_job_ran(c)
        # A job two of the file's rules faulted stalls twice: past BullMQ's maxStalledCount (1)
        # it fails ("job stalled more than allowable limit"), though it ran.  The verdict counts
        # exactly those as failed, each with two faults.
        rows = {r["task"]: r for r in v["tasks"]}
        self.assertEqual(sum(r["failed"] for r in rows.values()), self.summary["failed"],
                         "jobs in bull:twice:failed, and the verdict's failed counts")
        for r in rows.values():
            for m in r["failed_examples"]:
                self.assertGreaterEqual(c.faults[m], 2, "faults of %s, which failed" % m)

    def assert_every_job_ran(self, c):
        never = sorted(m for m in c.task_of if c.runs[m] == 0)
        self.assertEqual(never, [], "jobs that never ran (no rule here loses jobs)")


EV_DELIVER = 2           # enum rule_event (rules/rule.h)
ACT_DROP, ACT_ERROR = 4, 6  # enum rule_action_kind


class Counts:
    """What the driver's files and the journal say, per message id."""

    def __init__(self, files, journal):
        self.task_of = dict(tuple(l.split()) for l in read_lines(files["enqueued"]))
        self.runs = collections.Counter(l.split()[0] for l in read_lines(files["runs"]))
        self.effects = collections.Counter(l.strip() for l in read_lines(files["effects"]))
        _, recs, truncated = fk.decode_journal(journal)
        if truncated:
            raise AssertionError("journal %s ends mid-record after a clean stop" % journal)
        self.records = [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs]
        self.in_journal = {r.get("message_id") for _, r in self.records if r.get("message_id")}
        self.delivers = collections.Counter(r.get("message_id") for k, r in self.records
                                            if k == "deliver")
        self.faults = collections.Counter(r.get("message_id") for k, r in self.records
                                          if k == "fault")
        self.settles = collections.Counter(r.get("message_id") for k, r in self.records
                                           if k in ("ack", "nack"))
        self.settling = any(k in ("ack", "nack") for k, _ in self.records)
        # Deliveries a fault kept from the worker (drop, error, close before on a deliver):
        # journaled, but the handler never ran for them.
        self.withheld = collections.Counter(
            r.get("message_id") for k, r in self.records
            if k == "fault" and r.get("event") == EV_DELIVER and
            (r.get("action") in (ACT_DROP, ACT_ERROR) or r.get("detail") == "close before"))

    def reached(self, m):
        """Deliveries of m that reached a handler, as the verdict counts them: on a listener
        whose framework settles deliveries (every one here but Sidekiq), those a worker was
        seen to finish (an ack, nack or completion, refused ones included: one settlement
        each); on Sidekiq's, every delivery no fault withheld."""
        live = self.delivers[m] - self.withheld[m]
        return live if not self.settling else min(live, self.settles[m])

    def faulted_by(self, rule):
        return {r.get("message_id") for k, r in self.records
                if k == "fault" and r.get("rule") == rule}


if __name__ == "__main__":
    unittest.main(verbosity=2)
