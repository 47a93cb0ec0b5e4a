#!/usr/bin/python3
"""BullMQ through `profile bullmq`: real Redis, real BullMQ workers (tests/e2e/bullmq, BullMQ and
ioredis from tests/node), and each fault as a BullMQ user would see it.  Here with BullMQ 5
(npm package `bullmq`); test_bullmq6.py runs every test again with BullMQ 6.  Each driver run
checks that Redis saw the version it meant (the `version` of the queue's meta hash).

Per test, one twice (listener `jobs`, protocol resp, profile bullmq, a journal) in front of the
real Redis, and one run of the example app through it: it adds JOBS `charge` (one effect per
execution) and JOBS `charge_safe` (SET NX on the real Redis first) jobs, runs 2 workers until
the queue is drained, and leaves the runs, spans and effects files.  All but the no-rule test
give the workers a short lock (lockDuration LOCK_MS, stalledInterval STALLED_MS; BullMQ's
defaults are 30 s each), so that a lapsed lock is found within seconds; the lease tests' jobs
also work WORK_MS, longer than a lock lasts, with room for more jobs than there are
(concurrency 8), so that a job whose lock lapses is taken again at once.

  no rule                               every job once; each job's add, delivery and completion
                                          journaled under its id, its name as task
  when lease task=charge; do drop       every charge job runs twice, the two runs at once (their
                                          spans overlap), BullMQ's `stalled` event for it, and its
                                          first worker told "Missing lock" or "Lock mismatch"
                                          (its completion journaled as refused); the verdict:
                                          charge NOT IDEMPOTENT
  when lease; do drop                   every job twice: charge NOT IDEMPOTENT, charge_safe
                                          IDEMPOTENT, on lease faults alone
  when lease task=charge; do delay D    (D past the lock) every charge job twice
  when deliver task=charge, first 2;    exactly 2 jobs twice, the copy handed out at once (with
    do duplicate                          BullMQ's own 30 s lock, the two 6 s runs overlap), marked
                                          redelivered (BullMQ's stalled count); the first
                                          worker's completion refused, journaled as refused
  when deliver, first 2; do drop        every job once: the 2 dropped deliveries come back
  when ack task=charge, first 2;        those 2 jobs twice: their completion answered, not
    do redeliver                          applied, the lock lapses
  when ack, first 2; do delay 6s        those 2 jobs twice: the completion lands after the lock
  when publish, first 2; do drop        2 adds answered with ids of jobs that never exist
  BullMQ's features, no rule             delayed jobs, a job scheduler, a flow, a rate-limited
                                          worker, updateProgress, a retried job, addBulk: the
                                          same as directly (tests/e2e/bullmq/features.js); the
                                          retry journaled as the app's; every add journaled
                                          with its id, the flow's (queued in a MULTI) and
                                          addBulk's (pipelined) too
  `twice check`                         `lease` on a bullmq listener; duplicate on publish and
                                          `after D` refused, with the reason
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
import driverkit as dk  # noqa: E402
import respkit as rk  # noqa: E402
from driverkit import read_lines  # noqa: E402
from test_resp_frameworks import Run  # noqa: E402

SEED = 7
JOBS = 4            # per handler
LOCK_MS = 2000      # the lease tests' lockDuration
STALLED_MS = 1000   # ... and stalledInterval
WORK_MS = 6000      # ... and how long each job works: past a lock and two checks
DRIVER_TIMEOUT = 120
NODE = "/usr/bin/node"
E2E = os.path.join(h.SOURCE_DIR, "tests", "e2e", "bullmq")


def fault_ids(recs, rule):
    """The message ids of the FAULT records of `rule`, sorted."""
    return sorted(r.get("message_id") for k, r in recs if k == "fault" and r.get("rule") == rule)


class BullMQ(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-bullmq-"
    package = "bullmq"      # the BullMQ package of tests/node
    major = 5               # ... and its major version

    def assert_version(self, summary):
        """The driver's run used this class's BullMQ: Redis has the queue's version."""
        self.assertRegex(summary.get("bullmq") or "", r"^bullmq:%d\." % self.major, summary)

    def start_twice(self, *rules):
        port = h.free_port()
        self.journal = os.path.join(self.tmp, "run.pb")
        listen = ("listen jobs {\n  protocol resp\n  profile bullmq\n  bind 127.0.0.1:%d\n"
                  "  upstream 127.0.0.1:%d\n}\n" % (port, self.redis.port))
        tw = self.twice(fk.conf_text([listen], list(rules), seed=SEED, journal=self.journal,
                                     grace="1s"))
        return tw, port

    def run_app(self, port, lock=True, work=False, extra_runs=0, concurrency=2):
        """One driver run, the workers' locks short (lock), each job working WORK_MS (work);
        returns (Run, spans [(id, name, start, end, worker)], worker log text)."""
        args = ["--inspect", "127.0.0.1:%d" % self.redis.port, "--concurrency", str(concurrency),
                "--bullmq", self.package]
        if lock:
            args += ["--lock-ms", str(LOCK_MS), "--stalled-ms", str(STALLED_MS)]
        if work:
            args += ["--work-ms", str(WORK_MS)]
        if extra_runs:
            args += ["--extra-runs", str(extra_runs)]
        summary, files, rc = dk.run(self, "bullmq", port, redis_port=self.redis.port, jobs=JOBS,
                                    workers=2, timeout=DRIVER_TIMEOUT, args=args,
                                    env=dict(os.environ, HOME=self.tmp))
        self.assertEqual(rc, 0, "bullmq driver failed: %s" % summary["reason"])
        self.assert_version(summary)
        enqueued, runs, effects = ([tuple(l.split()) for l in read_lines(files[n])]
                                   for n in ("enqueued", "runs", "effects"))
        run = Run(summary, enqueued, runs, [e for (e,) in effects])
        d = os.path.dirname(files["runs"])
        spans = [tuple(l.split()) for l in read_lines(os.path.join(d, "spans.txt"))]
        logs = ""
        for name in sorted(os.listdir(d)):
            if name.startswith("worker-"):
                with open(os.path.join(d, name)) as f:
                    logs += f.read()
        return run, spans, logs

    def records(self, tw):
        tw.stop()
        _, recs, truncated = fk.decode_journal(self.journal)
        self.assertFalse(truncated)
        return [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs]

    def verdict(self, run):
        path = os.path.join(self.tmp, "effects-for-verdict.txt")
        with open(path, "w") as f:
            f.write("".join("%s\n" % m for m in run.effects.elements()))
        r = h.run_twice(["verdict", "--journal", self.journal, "--effects", path, "--json"])
        self.assertIn(r.returncode, (0, 1), r)
        return {t["task"]: t for t in json.loads(r.stdout.decode())["tasks"]}

    def assert_runs(self, run, twice=()):
        """Every job ran once, those of `twice` twice; charge's effects one per run, charge_safe's
        one per job."""
        want = {m: 2 if m in twice else 1 for m in run.ids()}
        got = {m: run.runs[m] for m in run.ids()}
        self.assertEqual(got, want, "executions per job id")
        for m in run.ids():
            n = run.runs[m]
            self.assertEqual(run.effects[m], n if run.task_of[m] == "charge" else 1,
                             "effects of %s (%s)" % (m, run.task_of[m]))

    def assert_overlap(self, spans, ids):
        """Each of ids ran twice at once: its two spans overlap."""
        by_id = collections.defaultdict(list)
        for m, _, start, end, _w in spans:
            by_id[m].append((int(start), int(end)))
        for m in ids:
            (s1, e1), (s2, e2) = sorted(by_id[m])
            self.assertLess(s2, e1, "job %s's second run started after its first ended: %s" % (
                m, by_id[m]))

    # -- no rule -----------------------------------------------------------------------------

    def test_no_rule_each_job_once_journaled_by_id_and_name(self):
        tw, port = self.start_twice()
        run, _, _ = self.run_app(port, lock=False)
        self.assert_runs(run)
        self.assertEqual(run.summary["failed"], 0)
        recs = self.records(tw)
        for kind in ("publish", "deliver", "ack"):
            got = sorted((r.get("message_id"), r.get("task"), r.get("queue"))
                         for k, r in recs if k == kind)
            want = sorted((m, t, "twice") for m, t in run.enqueued)
            self.assertEqual(got, want, "%s records" % kind)

    # -- lease ---------------------------------------------------------------------------------

    def test_lease_drop_second_run_while_the_first_still_runs(self):
        tw, port = self.start_twice("rule lapse on jobs {\n  when lease task=charge\n"
                                    "  do drop\n}\n")
        run, spans, logs = self.run_app(port, work=True, extra_runs=JOBS, concurrency=8)
        charge = run.ids("charge")
        self.assert_runs(run, twice=charge)
        self.assert_overlap(spans, charge)
        for m in charge:
            self.assertRegex(logs, r"\] stalled %s\n" % m, "BullMQ's stalled event for %s" % m)
            self.assertRegex(logs, r"error (Missing lock|Lock mismatch) for job %s\b" % m,
                             "the first worker's completion of %s refused" % m)
        recs = self.records(tw)
        faulted = fault_ids(recs, "lapse")
        self.assertEqual(faulted, sorted(charge), "one lease fault per charge job")
        # the first worker's refused completion is journaled, marked refused: it ends that run
        refused = {r.get("message_id") for k, r in recs if k == "ack" and r.get("refused")}
        self.assertEqual(sorted(refused), sorted(charge), "refused completions journaled")
        rows = self.verdict(run)
        self.assertEqual(rows["charge"]["verdict"], "NOT IDEMPOTENT", rows)

    def test_lease_faults_alone_tell_charge_from_charge_safe(self):
        tw, port = self.start_twice("rule lapse on jobs {\n  when lease\n  do drop\n}\n")
        run, _, _ = self.run_app(port, work=True, extra_runs=2 * JOBS, concurrency=8)
        self.assert_runs(run, twice=run.ids())
        tw.stop()
        rows = self.verdict(run)
        self.assertEqual(rows["charge"]["verdict"], "NOT IDEMPOTENT", rows)
        self.assertEqual(rows["charge_safe"]["verdict"], "IDEMPOTENT", rows)

    def test_lease_delay_past_the_lock(self):
        tw, port = self.start_twice("rule slow on jobs {\n  when lease task=charge\n"
                                    "  do delay %dms\n}\n" % (2 * LOCK_MS))
        run, spans, _ = self.run_app(port, work=True, extra_runs=JOBS, concurrency=8)
        self.assert_runs(run, twice=run.ids("charge"))
        self.assert_overlap(spans, run.ids("charge"))

    # -- deliver ---------------------------------------------------------------------------------

    def test_deliver_duplicate_a_second_worker_takes_it(self):
        """duplicate hands the job out again at once, while the first worker still runs it:
        with BullMQ's own 30 s lock and stalled check, only an immediate requeue can start a
        second run inside a 6 s job.  The copy is marked as BullMQ marks a stalled job's; the
        first worker's completion is refused (the lock is the second's) and journaled as
        refused, like the copy's applied one after both deliveries."""
        tw, port = self.start_twice("rule racing on jobs {\n  when deliver task=charge\n"
                                    "  first 2\n  do duplicate\n}\n")
        run, spans, logs = self.run_app(port, lock=False, work=True, extra_runs=2, concurrency=8)
        recs = self.records(tw)
        faulted = fault_ids(recs, "racing")
        self.assertEqual(len(faulted), 2, recs)
        self.assert_runs(run, twice=faulted)
        self.assert_overlap(spans, faulted)
        for m in faulted:
            mine = [(k, r) for k, r in recs if r.get("message_id") == m]
            d = [r for k, r in mine if k == "deliver"]
            self.assertEqual([bool(r.get("redelivered")) for r in d], [False, True],
                             "deliveries of %s" % m)
            self.assertRegex(logs, r"error (Lock mismatch|Missing lock) for job %s\b" % m,
                             "the first worker's completion of %s refused" % m)
            # both deliveries before either completion; one completion refused, one applied
            order = [(k, bool(r.get("refused"))) for k, r in mine if k in ("deliver", "ack")]
            self.assertEqual(order[:2], [("deliver", False), ("deliver", False)], mine)
            self.assertEqual(sorted(order[2:]), [("ack", False), ("ack", True)], mine)

    def test_deliver_drop_the_job_comes_back(self):
        tw, port = self.start_twice("rule lost on jobs {\n  when deliver\n  first 2\n"
                                    "  do drop\n}\n")
        run, _, _ = self.run_app(port)
        self.assert_runs(run)
        recs = self.records(tw)
        faulted = fault_ids(recs, "lost")
        self.assertEqual(len(faulted), 2)
        delivers = collections.Counter(r.get("message_id") for k, r in recs if k == "deliver")
        for m in faulted:
            self.assertEqual(delivers[m], 2, "the dropped delivery of %s and the one after" % m)

    # -- ack --------------------------------------------------------------------------------------

    def test_ack_redeliver_completion_not_applied(self):
        tw, port = self.start_twice("rule lost-ack on jobs {\n  when ack task=charge\n"
                                    "  first 2\n  do redeliver\n}\n")
        run, _, _ = self.run_app(port, extra_runs=2)
        recs = self.records(tw)
        faulted = fault_ids(recs, "lost-ack")
        self.assertEqual(len(faulted), 2)
        self.assertEqual({run.task_of[m] for m in faulted}, {"charge"})
        self.assert_runs(run, twice=faulted)
        self.assertEqual(run.summary["failed"], 0)

    def test_ack_delay_past_the_lock(self):
        tw, port = self.start_twice("rule late-ack on jobs {\n  when ack\n  first 2\n"
                                    "  do delay 6s\n}\n")
        run, _, _ = self.run_app(port, extra_runs=2)
        recs = self.records(tw)
        faulted = fault_ids(recs, "late-ack")
        self.assertEqual(len(faulted), 2)
        self.assert_runs(run, twice=faulted)

    # -- publish --------------------------------------------------------------------------------

    def test_publish_drop_jobs_that_never_exist(self):
        tw, port = self.start_twice("rule lost-add on jobs {\n  when publish\n  first 2\n"
                                    "  do drop\n}\n")
        summary, files, rc = dk.run(self, "bullmq", port, redis_port=self.redis.port, jobs=JOBS,
                                    workers=2, timeout=DRIVER_TIMEOUT,
                                    args=["--inspect", "127.0.0.1:%d" % self.redis.port,
                                          "--lost-grace", "2", "--bullmq", self.package],
                                    env=dict(os.environ, HOME=self.tmp))
        self.assert_version(summary)
        enqueued = [tuple(l.split()) for l in read_lines(files["enqueued"])]
        runs = collections.Counter(l.split()[0] for l in read_lines(files["runs"]))
        dropped = [m for m, _ in enqueued if m.startswith("twice-dropped-")]
        self.assertEqual(len(dropped), 2, enqueued)
        self.assertEqual([m for m, _ in enqueued if runs[m] == 0], dropped)
        self.assertEqual(self.redis.command("EXISTS", "bull:twice:" + dropped[0]), b"0")
        recs = self.records(tw)
        self.assertEqual(sorted(r.get("message_id") for k, r in recs if k == "fault"),
                         sorted(dropped))

    # -- transparency ---------------------------------------------------------------------------

    def features(self, port):
        env = dict(os.environ, HOME=self.tmp, TWICE_BROKER="127.0.0.1:%d" % port,
                   TWICE_BULLMQ=self.package)
        r = subprocess.run([NODE, os.path.join(E2E, "features.js")], env=env, cwd=E2E,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        return json.loads(r.stdout.decode().strip().splitlines()[-1])

    def test_features_as_directly(self):
        direct = self.features(self.redis.port)
        self.assertEqual(self.redis.command("FLUSHALL"), b"OK")
        tw, port = self.start_twice()
        through = self.features(port)
        self.assertEqual(through, direct)
        self.assertRegex(direct["bullmq"], r"^%d\." % self.major, "the BullMQ that ran")
        self.assertEqual(direct["retried"]["state"], "completed", direct)
        self.assertEqual(tw.log_records(level="error") + tw.log_records(level="warn"), [])
        recs = self.records(tw)
        retries = [r for k, r in recs if k == "nack" and r.get("queue") == "feat-retried"]
        self.assertEqual([(r.get("message_id"), bool(r.get("retry"))) for r in retries],
                         [(direct["retried"]["id"], True)], "the retry BullMQ made")
        # Adds pipelined (Queue.addBulk) or queued in a MULTI (FlowProducer.add, journaled from
        # EXEC's reply): each with the id BullMQ gave it, the one its delivery has.
        for queue, task, n in (("feat-bulk", "bulk", 3), ("feat-flow-parent", "parent", 1),
                               ("feat-flow-child", "child", 2)):
            added = sorted((r.get("message_id"), r.get("task")) for k, r in recs
                           if k == "publish" and r.get("queue") == queue)
            ran = sorted({(r.get("message_id"), r.get("task")) for k, r in recs
                          if k == "deliver" and r.get("queue") == queue})
            self.assertEqual(len(added), n, (queue, added))
            self.assertEqual(added, ran, queue)
            self.assertEqual({t for _, t in added}, {task}, queue)

    # -- twice check ------------------------------------------------------------------------------

    def test_check_lease_and_refusals(self):
        head = "listen jobs {\n  protocol resp\n  profile bullmq\n  bind 127.0.0.1:1\n" \
               "  upstream 127.0.0.1:2\n}\n"
        rc, errs = rk.check_config(
            head + "rule r on jobs {\n  when lease task=charge\n  do drop\n}\n", self.tmp)
        self.assertEqual((rc, errs), (0, []))
        for rule, why in (("when publish\n  do duplicate", "second add is a second job"),
                          ("when deliver\n  do duplicate after 3s", "stalledInterval"),
                          ("when lease\n  do redeliver", "redeliver")):
            rc, errs = rk.check_config(head + "rule r on jobs {\n  %s\n}\n" % rule, self.tmp)
            self.assertNotEqual(rc, 0, rule)
            self.assertIn(why, "\n".join(errs), rule)
        rc, errs = rk.check_config(head.replace("bullmq", "sidekiq") +
                                   "rule r on jobs {\n  when lease\n  do drop\n}\n", self.tmp)
        self.assertNotEqual(rc, 0)
        self.assertIn("lease", "\n".join(errs))


if __name__ == "__main__":
    unittest.main()
