#!/usr/bin/python3
"""Real job frameworks on Redis through a `protocol resp` listener.

One real redis-server; per test, a twice with one `protocol resp` listener
(`profile sidekiq|celery|rq|streams|list`) in front of it, and one run of the
framework's example app (tests/e2e/<framework>/driver.py): it enqueues N jobs
of `charge` (not idempotent: one effect per execution) and N of `charge_safe`
(idempotent: SET NX on the real Redis first) through twice, runs real workers
through twice until the broker is drained, and leaves behind the runs file
("<message-id> <task>" per execution) and the effects file ("<message-id>" per
side effect).  The tests assert what a user would notice:

  sidekiq   no rule                               every job once
            when deliver task=Charge, first 3,    exactly 3 Charge jids twice, the rest once;
              do duplicate                          3 extra Charge effects, ChargeSafe none
            when deliver, first 2, do drop        exactly 2 jobs never run, the rest once
  celery    no rule (visibility timeout 5 s)      every task once
            when ack task=tasks.charge, first 2,  those 2 task ids run again (same id) once
              do redeliver (vt 3 s)                 the visibility timeout restores them
            when ack, first 2, do delay 8s        the 2 tasks run again (vt 3 s < 8 s)
            when ack, first 2, do delay 1s        nothing runs twice (vt 6 s > 1 s)
  rq        no rule                               every job once
            when deliver task=tasks.charge,       2 job ids run twice
              first 2, do duplicate
            when ack task=tasks.charge, first 2,  2 job ids run twice (twice pushes them
              do redeliver                          back: RQ never redelivers by itself)
            enqueue_many() of 3 jobs, no rule     each publish journaled with its own task
  streams   no rule                               every entry once
            when ack, first 2, do redeliver       the 2 entries stay pending after their XACK
                                                    (XPENDING on the real Redis) and come back
                                                    through XAUTOCLAIM (same entry id)
  bullmq    no profile, no rule                   every job once (the scripts relayed)
  list      no rule (Laravel-shaped jobs,         every job once; publishes, deliveries and
              message-id/task from the JSON)        acks journaled by uuid and displayName
            when deliver, first 4, do duplicate   4 uuids run twice; the verdict calls
                                                    App\\Jobs\\Charge NOT IDEMPOTENT and
                                                    App\\Jobs\\ChargeSafe IDEMPOTENT
            when ack task=App\\Jobs\\Charge,        2 uuids run twice: the LREM is applied and
              first 2, do redeliver                 the job pushed back onto its queue
            when publish, first 2, do duplicate   2 jobs run twice (default sources: `id`)
            LMOVE from the head, redeliver        pushed back onto the head; an LREM on a
                                                    list without moves is no ack; a job the
                                                    app requeued itself is not copied
            drop / delay on an LREM               the job stays in the processing list / is
                                                    removed later

and, for every run with a rule, that the journal has at least two DELIVER
records and a FAULT record of the rule for every message id that ran twice,
and that the messages the rule faulted are exactly the ones the user sees
doubled (or lost).  Every message id here is the framework's own: Sidekiq jid,
Celery task id, RQ job id, stream entry id, a list job's uuid.
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
import respkit as rk  # noqa: E402
from driverkit import read_lines  # noqa: E402

SEED = 7
JOBS = 8                 # per handler: 16 jobs per run
DRIVER_TIMEOUT = 90      # seconds a driver may take before it gives up by itself


class Run:
    """What one driver run left behind."""

    def __init__(self, summary, enqueued, runs, effects):
        self.summary = summary                         # the driver's JSON summary
        self.enqueued = enqueued                       # [(message_id, task)]
        self.task_of = dict(enqueued)
        self.runs = collections.Counter(m for m, _ in runs)
        self.effects = collections.Counter(effects)

    def ids(self, task=None):
        return [m for m, t in self.enqueued if task is None or t == task]

    def ran(self, times):
        """Enqueued ids that ran exactly `times` times."""
        return sorted(m for m in self.ids() if self.runs[m] == times)


class RespFrameworks(dk.FrameworkCase):
    # -- twice ---------------------------------------------------------------

    def start_twice(self, profile, *rules, settings=""):
        """twice with listener `jobs` (protocol resp, the profile, more `settings` lines) in
        front of the real Redis, a journal and seed 7; returns (twice, port, journal)."""
        port = h.free_port()
        journal = os.path.join(self.tmp, "run.pb")
        self.journal = journal
        listen = ("listen jobs {\n  protocol resp\n%s  bind 127.0.0.1:%d\n"
                  "  upstream 127.0.0.1:%d\n%s}\n" % (
                      "  profile %s\n" % profile if profile else "", port, self.redis.port,
                      settings))
        text = fk.conf_text([listen], list(rules), seed=SEED, journal=journal, grace="1s")
        try:
            tw = self.twice(text)
        except AssertionError as e:
            raise AssertionError("twice did not start with `protocol resp` + `profile %s`%s: is "
                                 "the RESP session layer built?\n%s" % (
                                     profile, " and the rule" if rules else "", e)) from None
        return tw, port, journal

    # -- a driver run ----------------------------------------------------------

    def run_app(self, framework, port, workers=2, visibility_timeout=None, lost_grace=None,
                during=None):
        """Run tests/e2e/<framework>/driver.py through twice's port; returns a
        Run.  `during()` is called every 0.1 s while the driver runs."""
        args = ["--inspect", "127.0.0.1:%d" % self.redis.port]
        if visibility_timeout is not None:
            args += ["--visibility-timeout", str(visibility_timeout)]
        if lost_grace is not None:
            args += ["--lost-grace", str(lost_grace)]
        summary, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=JOBS,
                                    workers=workers, timeout=DRIVER_TIMEOUT, args=args,
                                    env=dict(os.environ, HOME=self.tmp), during=during)
        self.assertEqual(rc, 0, "%s driver failed: %s" % (framework, summary["reason"]))
        enqueued, runs, effects = ([tuple(l.split()) for l in read_lines(files[n])]
                                   for n in ("enqueued", "runs", "effects"))
        self.assertEqual(len(enqueued), 2 * JOBS, enqueued)
        run = Run(summary, enqueued, runs, [e for (e,) in effects])
        unknown = set(run.runs) - set(run.task_of)
        self.assertEqual(unknown, set(), "executions of message ids nobody enqueued")
        for m, t in runs:
            self.assertEqual(t, run.task_of[m], "message %s ran as %s, enqueued as %s" % (
                m, t, run.task_of[m]))
        return run

    # -- assertions --------------------------------------------------------------

    def assert_outcome(self, run, twice=(), lost=(), unsafe=None):
        """Every enqueued job ran once, except `twice` (two runs) and `lost`
        (none); the non-idempotent task (`unsafe`) has one effect per run,
        the idempotent one one effect per job that ran."""
        want = {m: 2 if m in twice else 0 if m in lost else 1 for m in run.ids()}
        got = {m: run.runs[m] for m in run.ids()}
        wrong = {m: "ran %d times, expected %d (%s)" % (got[m], want[m], run.task_of[m])
                 for m in want if got[m] != want[m]}
        self.assertEqual(wrong, {}, "executions per message id")
        for m in run.ids():
            n = run.runs[m]
            expect = n if run.task_of[m] == unsafe else min(n, 1)
            self.assertEqual(run.effects[m], expect, "effects of %s (%s, ran %d times)" % (
                m, run.task_of[m], n))

    def journal_records(self, tw, journal):
        """Stop twice (flushes the journal) and decode it: [(kind name, record)]."""
        tw.stop()
        _, recs, truncated = fk.decode_journal(journal)
        self.assertFalse(truncated, "journal %s ends mid-record after a clean stop" % journal)
        return [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs]

    def rule_faults(self, tw, journal, rule):
        """(all records, the FAULT records of `rule`); fails if there is none."""
        recs = self.journal_records(tw, journal)
        faults = [r for k, r in recs if k == "fault" and r.get("rule") == rule]
        self.assertTrue(faults, "no FAULT record of rule %r in the journal: no fault was injected "
                        "(records by kind: %s)" % (rule, dict(collections.Counter(k for k, _ in recs))))
        return recs, faults

    def assert_journal(self, tw, journal, rule, ran_twice, faulted=None):
        """Every id in ran_twice has >= 2 DELIVER records and a FAULT record of
        `rule`; the ids `rule` faulted are exactly `faulted` (default:
        ran_twice).  Returns the FAULT records of the rule."""
        recs, faults = self.rule_faults(tw, journal, rule)
        delivers = collections.Counter(r.get("message_id") for k, r in recs if k == "deliver")
        fault_ids = collections.Counter(r.get("message_id") for r in faults)
        for m in ran_twice:
            self.assertGreaterEqual(delivers[m], 2, "DELIVER records of %s, which ran twice" % m)
            self.assertGreaterEqual(fault_ids[m], 1, "FAULT records of rule %r for %s" % (rule, m))
        self.assertEqual(sorted(fault_ids), sorted(ran_twice if faulted is None else faulted),
                         "message ids faulted by rule %r" % rule)
        return faults

    # -- Sidekiq -------------------------------------------------------------------

    def test_sidekiq_no_rule_each_job_once(self):
        tw, port, _ = self.start_twice("sidekiq")
        run = self.run_app("sidekiq", port, workers=3)
        self.assert_outcome(run, unsafe="Charge")
        self.assertEqual(run.summary["dead"], 0)

    def test_sidekiq_duplicate_three_charges(self):
        tw, port, journal = self.start_twice(
            "sidekiq", fk.rule_block("dup", "jobs", "when deliver task=Charge", "first 3",
                                     "do duplicate"))
        run = self.run_app("sidekiq", port, workers=3)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 3, "Charge jids run twice: %s (no duplicate delivered?)"
                         % doubled)
        self.assertEqual({run.task_of[m] for m in doubled}, {"Charge"})
        self.assert_outcome(run, twice=doubled, unsafe="Charge")
        self.assertEqual(run.summary["extra_effects"], {"Charge": 3, "ChargeSafe": 0})
        self.assert_journal(tw, journal, "dup", doubled)

    def test_sidekiq_drop_two_jobs_lost(self):
        tw, port, journal = self.start_twice(
            "sidekiq", fk.rule_block("drop", "jobs", "when deliver", "first 2", "do drop"))
        run = self.run_app("sidekiq", port, workers=3, lost_grace=4)
        lost = run.ran(0)
        self.assertEqual(len(lost), 2, "jobs that never ran: %s (no delivery dropped?)" % lost)
        self.assert_outcome(run, lost=lost, unsafe="Charge")
        self.assert_journal(tw, journal, "drop", [], faulted=lost)

    # -- Celery on Redis -----------------------------------------------------------

    def test_celery_no_rule_each_task_once(self):
        tw, port, _ = self.start_twice("celery")
        run = self.run_app("celery_redis", port, visibility_timeout=5)
        self.assert_outcome(run, unsafe="tasks.charge")

    def test_celery_publish_copy_has_its_own_delivery_tag(self):
        """`duplicate` on a Celery publish: the copy is the message a retrying kombu producer
        pushes again, the same task id with a new delivery tag (a uuid4), so the two never
        share kombu's `unacked` entry."""
        import uuid as uuidlib
        import redis
        from celery import Celery
        tw, port, journal = self.start_twice(
            "celery", fk.rule_block("dup", "jobs", "when publish", "do duplicate"))
        app = Celery("copy", broker="redis://127.0.0.1:%d/0" % port)
        app.conf.update(task_ignore_result=True, result_backend=None, task_default_queue="celery")
        r = app.send_task("tasks.charge", ("o1",))
        app.close()
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        h.wait_until(lambda: real.llen("celery") == 2, timeout=30, what="two messages queued")
        msgs = [json.loads(m) for m in real.lrange("celery", 0, -1)]
        self.assertEqual([m["headers"]["id"] for m in msgs], [r.id, r.id])
        tags = [m["properties"]["delivery_tag"] for m in msgs]
        self.assertNotEqual(tags[0], tags[1])
        self.assertEqual([uuidlib.UUID(t).version for t in tags], [4, 4])
        for m in msgs:
            del m["properties"]["delivery_tag"]
        self.assertEqual(msgs[0], msgs[1], "the copy differs in its delivery tag alone")
        faults = [x for k, x in self.journal_records(tw, journal) if k == "fault"]
        self.assertEqual([x.get("message_id") for x in faults], [r.id])

    def test_celery_lost_ack_redelivered_after_visibility_timeout(self):
        tw, port, journal = self.start_twice(
            "celery", fk.rule_block("lost-ack", "jobs", "when ack task=tasks.charge", "first 2",
                                    "do redeliver"))
        run = self.run_app("celery_redis", port, visibility_timeout=3)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "task ids run twice: %s (no ack lost?)" % doubled)
        self.assertEqual({run.task_of[m] for m in doubled}, {"tasks.charge"})
        self.assert_outcome(run, twice=doubled, unsafe="tasks.charge")
        self.assert_journal(tw, journal, "lost-ack", doubled)

    def test_celery_ack_delayed_past_visibility_timeout_runs_again(self):
        tw, port, journal = self.start_twice(
            "celery", fk.rule_block("late-ack", "jobs", "when ack", "first 2", "do delay 8s"))
        run = self.run_app("celery_redis", port, visibility_timeout=3)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "task ids run twice: %s (no ack delayed?)" % doubled)
        # either task may have been faulted: the idempotent one keeps one effect
        self.assert_outcome(run, twice=doubled, unsafe="tasks.charge")
        self.assert_journal(tw, journal, "late-ack", doubled)

    def test_celery_ack_delayed_within_visibility_timeout_runs_once(self):
        tw, port, journal = self.start_twice(
            "celery", fk.rule_block("short-delay", "jobs", "when ack", "first 2", "do delay 1s"))
        run = self.run_app("celery_redis", port, visibility_timeout=6)
        self.assert_outcome(run, unsafe="tasks.charge")
        # not vacuous: two acks were held (and applied before the timeout)
        _, faults = self.rule_faults(tw, journal, "short-delay")
        self.assertEqual(len({r.get("message_id") for r in faults}), 2, faults)

    # -- RQ ---------------------------------------------------------------------------

    def test_rq_no_rule_each_job_once(self):
        tw, port, _ = self.start_twice("rq")
        run = self.run_app("rq", port)
        self.assert_outcome(run, unsafe="tasks.charge")
        self.assertEqual(run.summary["failed"], 0)

    def test_rq_duplicate_two_charges(self):
        tw, port, journal = self.start_twice(
            "rq", fk.rule_block("dup", "jobs", "when deliver task=tasks.charge", "first 2",
                                "do duplicate"))
        run = self.run_app("rq", port)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "job ids run twice: %s (no duplicate delivered?)" % doubled)
        self.assertEqual({run.task_of[m] for m in doubled}, {"tasks.charge"})
        self.assert_outcome(run, twice=doubled, unsafe="tasks.charge")
        self.assert_journal(tw, journal, "dup", doubled)

    def test_rq_lost_finish_pushed_back(self):
        # RQ never redelivers by itself: twice swallows the removal from the
        # started registry and pushes the job id back on its queue.
        tw, port, journal = self.start_twice(
            "rq", fk.rule_block("lost-ack", "jobs", "when ack task=tasks.charge", "first 2",
                                "do redeliver"))
        run = self.run_app("rq", port)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "job ids run twice: %s (no ack lost?)" % doubled)
        self.assertEqual({run.task_of[m] for m in doubled}, {"tasks.charge"})
        self.assert_outcome(run, twice=doubled, unsafe="tasks.charge")
        self.assert_journal(tw, journal, "lost-ack", doubled)

    def test_rq_enqueue_many_names_each_job(self):
        """RQ's enqueue_many() saves and pushes several jobs in one transaction: each publish
        is journaled with its own job's task, not the transaction's last."""
        import redis
        import rq
        tw, port, journal = self.start_twice("rq")
        q = rq.Queue("default", connection=redis.Redis(host="127.0.0.1", port=port))
        funcs = ["tasks.charge", "tasks.charge_safe", "tasks.charge"]
        jobs = q.enqueue_many([rq.Queue.prepare_data(f, args=(i,)) for i, f in enumerate(funcs)])
        self.assertEqual(len(jobs), 3)
        recs = self.journal_records(tw, journal)
        published = {r.get("message_id"): r.get("task") for k, r in recs if k == "publish"}
        self.assertEqual(published, {j.id: f for j, f in zip(jobs, funcs)})

    # -- Redis Streams -----------------------------------------------------------------

    def test_streams_no_rule_each_entry_once(self):
        tw, port, _ = self.start_twice("streams")
        run = self.run_app("streams", port, visibility_timeout=3)
        self.assert_outcome(run, unsafe="charge")

    def test_streams_task_longer_than_the_limit(self):
        """A `task` field longer than twice keeps (255 bytes) is relayed unchanged, logged
        once with the limit, and the entry's events go without a task (a cut name would be
        another task's); the entry next to it keeps its own."""
        tw, port, journal = self.start_twice("streams")
        long_task = "t" * 300
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("XGROUP", "CREATE", "limits", "g", "$", "MKSTREAM"), b"OK")
            long_id = c.cmd("XADD", "limits", "*", "task", long_task)
            short_id = c.cmd("XADD", "limits", "*", "task", "short.task")
            got = c.cmd("XREADGROUP", "GROUP", "g", "c1", "COUNT", "10", "STREAMS", "limits", ">")
        self.assertEqual(got, [[b"limits", [[long_id, [b"task", long_task.encode()]],
                                           [short_id, [b"task", b"short.task"]]]]])
        lines = tw.wait_for_log(r'msg="resp field too long"')
        self.assertIn("field=task bytes=300 limit=255", lines[0])
        recs = self.journal_records(tw, journal)
        tasks = {(k, r.get("message_id")): r.get("task") for k, r in recs
                 if k in ("publish", "deliver")}
        for kind in ("publish", "deliver"):
            self.assertIsNone(tasks[(kind, long_id.decode())], (kind, tasks))
            self.assertEqual(tasks[(kind, short_id.decode())], "short.task")
        self.assertEqual(tw.log_text().count('msg="resp field too long"'), 1)

    def test_streams_lost_xack_reclaimed(self):
        tw, port, journal = self.start_twice(
            "streams", fk.rule_block("lost-xack", "jobs", "when ack", "first 2", "do redeliver"))
        stuck = set()   # entry ids seen pending for >= 1.5 s

        def watch_pending():
            # The real Redis, not twice: what is still pending 1.5 s after
            # delivery (a handler takes milliseconds) had its XACK swallowed.
            try:
                rows = self.redis.command("XPENDING", "twice:e2e:jobs", "workers", "IDLE", "1500",
                                          "-", "+", "100", timeout=2)
            except (OSError, EOFError):
                return
            if not isinstance(rows, list):   # -ERR before the stream and group exist
                return
            stuck.update(row[0].decode() for row in rows)

        run = self.run_app("streams", port, visibility_timeout=3, during=watch_pending)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "entries run twice: %s (no XACK lost?)" % doubled)
        self.assert_outcome(run, twice=doubled, unsafe="charge")
        self.assertEqual(sorted(stuck), doubled,
                         "entries XPENDING showed pending >= 1.5 s after delivery")
        # ... and nothing is pending any more: the reclaimed copies were acked for real
        summary = self.redis.command("XPENDING", "twice:e2e:jobs", "workers")
        self.assertEqual(summary[0], b"0", summary)
        self.assert_journal(tw, journal, "lost-xack", doubled)

    # -- BullMQ without its profile (test_bullmq.py has profile bullmq) -------------------

    def test_bullmq_without_a_profile_each_job_once(self):
        """BullMQ's workers (Lua scripts through ioredis: EVAL, then EVALSHA; BZPOPMIN on a
        blocking connection) through a resp listener without a profile: every job runs once,
        and the scripts' replies reach the workers as Redis sent them."""
        tw, port, _ = self.start_twice(None)
        run = self.run_app("bullmq", port)
        self.assert_outcome(run, unsafe="charge")
        self.assertEqual(run.summary["failed"], 0)

    # -- any app's JSON jobs on a plain list (profile list) ---------------------------------

    def verdict(self, run):
        """`twice verdict --json` over the journal (twice stopped first) and the run's effects:
        {task: row}."""
        path = os.path.join(self.tmp, "effects-for-verdict.txt")
        with open(path, "w") as f:
            f.write("".join("%s\n" % m for m in run.effects.elements()))
        r = h.run_twice(["verdict", "--journal", self.journal, "--effects", path, "--json"])
        self.assertIn(r.returncode, (0, 1), r)
        return {t["task"]: t for t in json.loads(r.stdout.decode())["tasks"]}

    def test_list_no_rule_each_job_once_named_by_its_payload(self):
        """Laravel-shaped jobs on a plain list: every job runs once, and each publish, delivery
        and ack is journaled under the payload's uuid and displayName, the delivery and the
        ack with the queue list the job was popped from."""
        tw, port, journal = self.start_twice("list", settings=LARAVEL)
        run = self.run_app("lists", port)
        self.assert_outcome(run, unsafe=CHARGE)
        recs = self.journal_records(tw, journal)
        for kind in ("publish", "deliver", "ack"):
            named = {r.get("message_id"): r.get("task") for k, r in recs if k == kind}
            self.assertEqual(named, run.task_of, "%s records by id" % kind)
            queues = {r.get("queue") for k, r in recs if k == kind}
            self.assertEqual(queues, {"queues:default"}, kind)

    def test_list_duplicate_on_deliver_verdict_names_the_handler(self):
        """`duplicate` on deliver pushes a copy back where the worker pops: four jobs run twice,
        and the verdict calls App\\Jobs\\Charge NOT IDEMPOTENT and App\\Jobs\\ChargeSafe
        IDEMPOTENT by the payload's own names."""
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("dup", "jobs", "when deliver", "first 4", "do duplicate"),
            settings=LARAVEL)
        run = self.run_app("lists", port)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 4, "job uuids run twice: %s (no copy delivered?)" % doubled)
        self.assert_outcome(run, twice=doubled, unsafe=CHARGE)
        self.assert_journal(tw, journal, "dup", doubled)
        rows = self.verdict(run)
        self.assertEqual(rows[CHARGE]["verdict"], "NOT IDEMPOTENT", rows)
        self.assertEqual(rows[CHARGE_SAFE]["verdict"], "IDEMPOTENT", rows)

    def test_list_lost_ack_pushed_back(self):
        """`redeliver` on the LREM that settles a job (its task matched by name): twice applies
        the removal and pushes the job back onto the queue it came from, as a recovery of
        the processing list would; those two jobs run twice, under their uuids."""
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("lost-ack", "jobs", 'when ack task="App\\\\Jobs\\\\Charge"',
                                  "first 2", "do redeliver"),
            settings=LARAVEL)
        run = self.run_app("lists", port)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "job uuids run twice: %s (no ack lost?)" % doubled)
        self.assertEqual({run.task_of[m] for m in doubled}, {CHARGE})
        self.assert_outcome(run, twice=doubled, unsafe=CHARGE)
        self.assert_journal(tw, journal, "lost-ack", doubled)

    def test_list_publish_duplicated_default_sources(self):
        """`duplicate` on publish: Redis gets the push twice, the consumer runs the same job
        twice.  Without `message-id`/`task` settings the profile's defaults name the job:
        Laravel's Redis `id` and its displayName."""
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("dup-pub", "jobs", "when publish", "first 2", "do duplicate"))
        run = self.run_app("lists", port)
        doubled = run.ran(2)
        self.assertEqual(len(doubled), 2, "job uuids run twice: %s (no push doubled?)" % doubled)
        self.assert_outcome(run, twice=doubled, unsafe=CHARGE)
        recs, faults = self.rule_faults(tw, journal, "dup-pub")
        ids = {r.get("message_id") for k, r in recs if k == "publish"}
        self.assertEqual(len(ids), 2 * JOBS)
        self.assertEqual([len(m) for m in ids], [32] * len(ids), "Laravel's 32-character ids")
        self.assertEqual({r.get("task") for k, r in recs if k == "publish"}, {CHARGE, CHARGE_SAFE})
        self.assertEqual(len({r.get("message_id") for r in faults}), 2)

    def test_list_redeliver_pushes_back_to_the_end_it_was_taken_from(self):
        """A move from a queue's head (LMOVE q p LEFT LEFT), then `redeliver` on its LREM: the
        client gets Redis's answer (1), the job leaves the processing list and goes back to the
        head of q, where the next LMOVE LEFT takes it first."""
        import redis
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("lost", "jobs", "when ack", "do redeliver"), settings=LARAVEL)
        a = json.dumps({"uuid": "u-a", "displayName": CHARGE})
        b = json.dumps({"uuid": "u-b", "displayName": CHARGE})
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        real.rpush("q", a, b)
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("LMOVE", "q", "p", "LEFT", "LEFT"), a.encode())
            self.assertEqual(c.cmd("LREM", "p", "1", a), 1)
        h.wait_until(lambda: real.lrange("q", 0, -1) == [a.encode(), b.encode()], timeout=30,
                     what="the job pushed back onto the head of q")
        self.assertEqual(real.llen("p"), 0)
        recs = self.journal_records(tw, journal)
        self.assertEqual([(k, r.get("message_id"), r.get("queue")) for k, r in recs
                          if k in ("deliver", "ack", "fault")],
                         [("deliver", "u-a", "q"), ("ack", "u-a", "q"), ("fault", "u-a", "q")])

    def test_list_lrem_on_a_list_without_moves_is_no_ack(self):
        """An LREM on a list no move onto which went through twice (a queue's cancel, or a
        processing list filled before twice started) is a plain command: applied as sent, with
        Redis's own count, no ack event, no fault."""
        import redis
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("lost", "jobs", "when ack", "do redeliver"), settings=LARAVEL)
        job = json.dumps({"uuid": "u-1", "displayName": CHARGE})
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        real.lpush("elsewhere", job, job)
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("LREM", "elsewhere", "0", job), 2)
        self.assertEqual(real.llen("elsewhere"), 0)
        recs = self.journal_records(tw, journal)
        self.assertEqual([k for k, _ in recs if k in ("ack", "fault")], [])

    def test_list_redeliver_makes_no_copy_of_a_job_already_requeued(self):
        """`redeliver after 1s` on an LREM whose job the app's own recovery put back meanwhile
        (it moved it from the processing list to the queue): twice's removal finds nothing, so
        it pushes nothing, and the queue holds the job once.  (A second job, redelivered after
        it on the same connection of twice's, shows that twice's commands for the first ran.)"""
        import redis
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("late", "jobs", "when ack", "do redeliver after 1s"),
            settings=LARAVEL)
        a = json.dumps({"uuid": "u-a", "displayName": CHARGE})
        b = json.dumps({"uuid": "u-b", "displayName": CHARGE})
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        real.rpush("q", a)
        real.rpush("q2", b)
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("LMOVE", "q", "p", "LEFT", "LEFT"), a.encode())
            self.assertEqual(c.cmd("LMOVE", "q2", "p2", "LEFT", "LEFT"), b.encode())
            # the app's recovery: a back onto q, on its own connection
            self.assertEqual(real.lmove("p", "q", "LEFT", "LEFT"), a.encode())
            self.assertEqual(c.cmd("LREM", "p", "1", a), 1)    # answered as kept back
            self.assertEqual(c.cmd("LREM", "p2", "1", b), 1)
        h.wait_until(lambda: real.lrange("q2", 0, -1) == [b.encode()], timeout=30,
                     what="the second job pushed back onto q2")
        self.assertEqual(real.lrange("q", 0, -1), [a.encode()], "the first job once, no copy")
        self.assertEqual((real.llen("p"), real.llen("p2")), (0, 0))

    def test_list_ack_dropped_and_delayed(self):
        """`drop` on an LREM: answered 1, never applied, the job stays in the processing list
        for the app's own recovery; `delay 1s`: answered 1, applied later."""
        import redis
        tw, port, journal = self.start_twice(
            "list", fk.rule_block("lost", "jobs", 'when ack queue=q1', "do drop"),
            fk.rule_block("slow", "jobs", 'when ack queue=q2', "do delay 1s"), settings=LARAVEL)
        a = json.dumps({"uuid": "u-a", "displayName": CHARGE})
        b = json.dumps({"uuid": "u-b", "displayName": CHARGE})
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        real.rpush("q1", a)
        real.rpush("q2", b)
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("BLMOVE", "q1", "p1", "RIGHT", "LEFT", "1"), a.encode())
            self.assertEqual(c.cmd("BLMOVE", "q2", "p2", "RIGHT", "LEFT", "1"), b.encode())
            self.assertEqual(c.cmd("LREM", "p1", "1", a), 1)
            self.assertEqual(c.cmd("LREM", "p2", "1", b), 1)
            self.assertEqual(c.cmd("PING"), b"PONG")
        h.wait_until(lambda: real.llen("p2") == 0, timeout=30, what="the delayed LREM applied")
        self.assertEqual(real.lrange("p1", 0, -1), [a.encode()])
        self.assertEqual(real.llen("q1") + real.llen("q2"), 0)
        recs = self.journal_records(tw, journal)
        self.assertEqual(sorted((r.get("rule"), r.get("message_id")) for k, r in recs
                                if k == "fault"), [("lost", "u-a"), ("slow", "u-b")])

LARAVEL = "  message-id body.json.uuid\n  task body.json.displayName\n"
CHARGE, CHARGE_SAFE = "App\\Jobs\\Charge", "App\\Jobs\\ChargeSafe"


if __name__ == "__main__":
    unittest.main(verbosity=2)
