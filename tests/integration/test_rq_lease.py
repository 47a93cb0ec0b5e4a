#!/usr/bin/python3
"""RQ's heartbeat as a lease, through `profile rq`: real Redis, real `rq worker`s (Debian's
python3-rq, tests/e2e/rq/tasks.py), and what an RQ user sees when a worker's heartbeat is lost.

While its work horse runs a job, an RQ worker renews the job's entry in the started registry
(rq:wip:default) every --job-monitoring-interval seconds, each renewal good for that interval
plus 60 s.  The rule drops the first renewal of each job and, with it, that worker's later ones:
the entry lapses about 61 s after the job started, while the job still runs.  Then a reader of
the registry (here StartedJobRegistry.get_job_ids() through twice, as a dashboard or a worker's
maintenance runs it) reaps the job: moved to the failed registry when it has no retries left,
requeued when it has.  Three jobs, each of them working until the test lets them finish:

  A  tasks.charge_held                      lands in the failed registry ("Moved to
                                              FailedJobRegistry") although it then succeeds
                                              (status finished, one effect); the journal has its
                                              lease fault, the NACK and then the ACK; the verdict
                                              and the report say abandoned, with A as example
  B  tasks.charge_held, Retry(max=1)        requeued and run by a second worker while the first
                                              still runs it: two effects, NOT IDEMPOTENT (the
                                              requeue is no retry the app asked for: a copy)
  C  tasks.charge_safe_held, Retry(max=1)   run twice the same way, one effect: IDEMPOTENT

The test waits for events (a job's run line, a lapsed score read from the real Redis, a job's
status), never for a time.  It takes about 70 s: RQ's 60 s of slack on every heartbeat is not
a setting.
"""

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

SEED = 7
WORKERS = 5              # A, B and C, and the second runs of B and C
LAPSE_TIMEOUT = 150      # seconds a lease may take to lapse (61 s expected) on a busy machine
E2E_RQ = os.path.join(h.SOURCE_DIR, "tests", "e2e", "rq")
QUEUE = "default"


class RQLease(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-rq-lease-"

    def start_twice(self, *rules):
        port = h.free_port()
        self.journal = os.path.join(self.tmp, "run.pb")
        listen = ("listen jobs {\n  protocol resp\n  profile rq\n  bind 127.0.0.1:%d\n"
                  "  upstream 127.0.0.1:%d\n}\n" % (port, self.redis.port))
        tw = self.twice(fk.conf_text([listen], list(rules), seed=SEED, journal=self.journal,
                                     grace="1s"))
        return tw, port

    def start_workers(self, port, n):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HOME=self.tmp,
                   PYTHONPATH=os.pathsep.join([E2E_RQ, os.path.dirname(E2E_RQ)]),
                   TWICE_EFFECTS=self.effects, TWICE_RUNS=self.runs,
                   TWICE_EFFECT_REDIS="127.0.0.1:%d" % self.redis.port,
                   TWICE_RELEASE=self.release, TWICE_HOLD_S=str(LAPSE_TIMEOUT + 60))
        procs = []
        for i in range(n):
            log_path = os.path.join(self.tmp, "worker-%d.log" % i)
            self.driver_logs.append(log_path)
            p = h.spawn(["/usr/bin/python3", "-m", "rq.cli", "worker",
                         "--url", "redis://127.0.0.1:%d/0" % port, "--path", E2E_RQ,
                         "--name", "w%d-%d" % (i, os.getpid()), "--job-monitoring-interval", "1",
                         QUEUE], log_path=log_path, env=env, cwd=self.tmp)
            procs.append(p)
        self.addCleanup(self.stop_workers, procs)
        return procs

    def stop_workers(self, procs):
        for p in procs:
            if p.poll() is None:
                h.kill_group(p)
                p.wait(10)

    def runs_of(self):
        out = {}
        for line in read_lines(self.runs):
            m = line.split()[0]
            out[m] = out.get(m, 0) + 1
        return out

    def test_lost_heartbeat_job_failed_though_it_succeeded(self):
        import redis
        import rq
        from rq.registry import FailedJobRegistry, StartedJobRegistry
        self.effects = os.path.join(self.tmp, "effects.txt")
        self.runs = os.path.join(self.tmp, "runs.txt")
        self.release = os.path.join(self.tmp, "release")
        tw, port = self.start_twice("rule lapse on jobs {\n  when lease\n  do drop\n}\n")
        via = redis.Redis(host="127.0.0.1", port=port)
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        q = rq.Queue(QUEUE, connection=via)
        a = q.enqueue("tasks.charge_held", "a").id
        b = q.enqueue("tasks.charge_held", "b", retry=rq.Retry(max=1)).id
        c = q.enqueue("tasks.charge_safe_held", "c", retry=rq.Retry(max=1)).id
        self.start_workers(port, WORKERS)

        # All three run; their renewals are dropped; their entries lapse.
        h.wait_until(lambda: all(self.runs_of().get(m) == 1 for m in (a, b, c)), 60,
                     interval=0.1, what="the three jobs started")

        def lapsed():
            now = float(b"%d.%06d" % tuple(int(x) for x in real.time()))
            scores = [real.zscore("rq:wip:" + QUEUE, m) for m in (a, b, c)]
            return all(s is not None and s < now for s in scores)
        h.wait_until(lapsed, LAPSE_TIMEOUT, interval=0.2,
                     what="the three jobs' entries in rq:wip:default past their score (the "
                          "heartbeats kept them alive: the lease was not dropped?)")
        for m in (a, b, c):
            self.assertEqual(rq.job.Job.fetch(m, connection=real).get_status(), "started")

        # A reader of the started registry reaps them: A to the failed registry, B and C back
        # onto the queue, where the idle workers take them while the first runs go on.
        reaped = StartedJobRegistry(QUEUE, connection=via).get_job_ids()
        self.assertNotIn(a, reaped)
        self.assertIn(a, FailedJobRegistry(QUEUE, connection=real).get_job_ids())
        h.wait_until(lambda: self.runs_of().get(b) == 2 and self.runs_of().get(c) == 2, 60,
                     interval=0.1, what="B and C run a second time")

        # Now every run finishes.
        with open(self.release, "w"):
            pass
        h.wait_until(lambda: len(read_lines(self.runs)) == 5 and all(
            rq.job.Job.fetch(m, connection=real).get_status() == "finished" for m in (a, b, c))
            and real.zcard("rq:wip:" + QUEUE) == 0 and real.llen("rq:queue:" + QUEUE) == 0,
            60, interval=0.2, what="every run finished")

        # What the RQ user sees: A succeeded, yet sits in the failed registry; B charged twice.
        job_a = rq.job.Job.fetch(a, connection=real)
        self.assertEqual(job_a.get_status(), "finished")
        self.assertIn(a, FailedJobRegistry(QUEUE, connection=real).get_job_ids())
        self.assertIn("Moved to FailedJobRegistry", job_a.exc_info or "")
        effects = read_lines(self.effects)
        self.assertEqual(effects.count(a), 1)
        self.assertEqual(effects.count(b), 2)
        self.assertEqual(effects.count(c), 1)
        self.assertEqual(self.runs_of(), {a: 1, b: 2, c: 2})

        tw.stop()
        _, recs, truncated = fk.decode_journal(self.journal)
        self.assertFalse(truncated)
        recs = [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs]
        faulted = {r.get("message_id") for k, r in recs if k == "fault" and r.get("rule") == "lapse"}
        self.assertEqual(faulted, {a, b, c}, "a lease fault per job")
        story = [k for k, r in recs if r.get("message_id") == a and k in ("fault", "nack", "ack")]
        self.assertEqual(story, ["fault", "nack", "ack"], "A: lease lost, failed, then completed")
        self.assertEqual([k for k, r in recs if k == "nack"], ["nack"], "only A was failed")
        retries = [r for k, r in recs if k == "publish" and r.get("message_id") in (b, c)]
        self.assertEqual(len(retries), 4)
        self.assertFalse(any(r.get("retry") for r in retries),
                         "the requeue of a lapsed job is no retry the app asked for")

        # The verdict and the report tell it.
        r = h.run_twice(["verdict", "--journal", self.journal, "--effects", self.effects,
                         "--json"])
        self.assertEqual(r.returncode, 1, r)
        rows = {t["task"]: t for t in json.loads(r.stdout.decode())["tasks"]}
        held, safe = rows["tasks.charge_held"], rows["tasks.charge_safe_held"]
        self.assertEqual(held["verdict"], "NOT IDEMPOTENT", rows)
        self.assertEqual(held["examples"], [b], rows)
        self.assertEqual((held["abandoned"], held["abandoned_examples"]), (1, [a]), rows)
        self.assertEqual(held["failed"], 0, rows)
        self.assertEqual(safe["verdict"], "IDEMPOTENT", rows)
        r = h.run_twice(["verdict", "--journal", self.journal, "--effects", self.effects])
        self.assertIn("tasks.charge_held: 1 message ids were failed by the framework while a "
                      "worker still ran them", r.stdout.decode())
        r = h.run_twice(["report", self.journal])
        self.assertEqual(r.returncode, 0, r)
        out = r.stdout.decode()
        self.assertRegex(out, r"\nFailed by the framework .*\n.*\n  tasks\.charge_held +0 +1  %s\n"
                         % a)
        self.assertRegex(out, r"\n  lapse +[1-9]\d* +drop +lease=")
        r = h.run_twice(["report", self.journal, "--message", a])
        timeline = r.stdout.decode()
        self.assertRegex(timeline, r"fault .*rule=lapse(.|\n)*nack (.|\n)*ack ")

    # -- the renewal itself, as RQ's worker sends it --------------------------------------------

    def heartbeat(self, conn, job_id, score, worker="w1"):
        """RQ 1.13's maintain_heartbeats() transaction for job_id; returns EXEC's results."""
        p = conn.pipeline()  # MULTI ... EXEC, as the worker's
        p.expire("rq:worker:" + worker, 61)
        p.hset("rq:worker:" + worker, "last_heartbeat", "2026-12-02T10:00:00.000000Z")
        p.hset("rq:job:" + job_id, "last_heartbeat", "2026-12-02T10:00:0%d.000000Z" % (score % 10))
        p.zadd("rq:wip:" + QUEUE, {job_id: score}, xx=True)
        return p.execute()

    def test_renewals_dropped_and_delayed_per_connection(self):
        """drop: the renewal and the job hash's last_heartbeat never reach Redis, EXEC answers
        as if they did, this connection's later renewals of the job (in a transaction or not)
        are dropped without a second fault until it pops its next job, and another
        connection's renewal is decided anew.  delay: applied D later, the next one too, and a
        late heartbeat makes no job hash again once RQ deleted it.  close: the connection cut
        before the transaction, nothing of it applied."""
        import redis
        tw, port = self.start_twice(
            "rule lapse on jobs {\n  when lease message_id=j-drop\n  do drop\n}\n"
            "rule slow on jobs {\n  when lease message_id=j-late\n  do delay 1500ms\n}\n"
            "rule raw on jobs {\n  when lease message_id=j-raw\n  do drop\n}\n"
            "rule again on jobs {\n  when lease message_id=j-again\n  do drop\n}\n"
            "rule gone on jobs {\n  when lease message_id=j-gone\n  do delay 1500ms\n}\n"
            "rule cut on jobs {\n  when lease message_id=j-cut\n  do close before\n}\n")
        real = redis.Redis(host="127.0.0.1", port=self.redis.port)
        for m in ("j-drop", "j-late", "j-again", "j-gone", "j-cut"):
            real.zadd("rq:wip:" + QUEUE, {m: 100})
            real.hset("rq:job:" + m, "last_heartbeat", "start")
        w1 = redis.Redis(host="127.0.0.1", port=port)
        # the job's two answered by twice (no field new, no member added)
        self.assertEqual(self.heartbeat(w1, "j-drop", 200)[2:], [0, 0])
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-drop"), 100)
        self.assertEqual(real.hget("rq:job:j-drop", "last_heartbeat"), b"start")
        self.assertEqual(real.hget("rq:worker:w1", "last_heartbeat"),
                         b"2026-12-02T10:00:00.000000Z", "the worker's own heartbeat goes on")
        self.assertEqual(self.heartbeat(w1, "j-drop", 300), [True, 0, 0, 0])  # w1's key is there
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-drop"), 100)
        # another worker connection's renewal of the job is decided anew, and the rule has
        # faulted this job once already (a rule faults a message once): applied
        w2 = redis.Redis(host="127.0.0.1", port=port)
        self.heartbeat(w2, "j-drop", 400, worker="w2")
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-drop"), 400)
        # delay
        self.assertEqual(self.heartbeat(w1, "j-late", 600), [True, 0, 0, 0])
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-late"), 100)
        h.wait_until(lambda: real.zscore("rq:wip:" + QUEUE, "j-late") == 600, 30,
                     what="the delayed renewal applied")
        self.assertEqual(real.hget("rq:job:j-late", "last_heartbeat"),
                         b"2026-12-02T10:00:00.000000Z")
        self.heartbeat(w1, "j-late", 700)
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-late"), 600)
        h.wait_until(lambda: real.zscore("rq:wip:" + QUEUE, "j-late") == 700, 30,
                     what="the next renewal delayed too")
        # renewals outside a transaction (a pipeline without one)
        real.zadd("rq:wip:" + QUEUE, {"j-raw": 100})
        w4 = redis.Redis(host="127.0.0.1", port=port)
        for score in (800, 900):
            p = w4.pipeline(transaction=False)
            p.zadd("rq:wip:" + QUEUE, {"j-raw": score}, xx=True)
            p.zscore("rq:wip:" + QUEUE, "j-raw")
            self.assertEqual(p.execute(), [0, 100])
        # the lost lease ends when the worker connection pops its next job: a run of the same
        # job again is decided anew (and the rule faulted it once already: applied)
        w5 = redis.Redis(host="127.0.0.1", port=port)
        self.assertEqual(self.heartbeat(w5, "j-again", 200, worker="w5")[2:], [0, 0])
        real.rpush("rq:queue:" + QUEUE, "j-again")
        self.assertEqual(w5.blpop(["rq:queue:" + QUEUE], 5), (b"rq:queue:" + QUEUE.encode(),
                                                              b"j-again"))
        self.heartbeat(w5, "j-again", 300, worker="w5")
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-again"), 300)
        # a delayed heartbeat of a job whose hash RQ deleted meanwhile (result_ttl=0, or its
        # TTL): the renewal applied, no hash made again
        w6 = redis.Redis(host="127.0.0.1", port=port)
        self.assertEqual(self.heartbeat(w6, "j-gone", 500, worker="w6")[2:], [0, 0])
        real.delete("rq:job:j-gone")
        h.wait_until(lambda: real.zscore("rq:wip:" + QUEUE, "j-gone") == 500, 30,
                     what="the delayed renewal of j-gone applied")
        self.assertFalse(real.exists("rq:job:j-gone"), "a late heartbeat made the hash again")
        # close: the worker's connection cut instead of its transaction
        w7 = redis.Redis(host="127.0.0.1", port=port)
        with self.assertRaises(redis.exceptions.ConnectionError):
            self.heartbeat(w7, "j-cut", 200, worker="w7")
        self.assertEqual(real.zscore("rq:wip:" + QUEUE, "j-cut"), 100)
        self.assertEqual(real.hget("rq:job:j-cut", "last_heartbeat"), b"start")
        self.assertFalse(real.exists("rq:worker:w7"), "nothing of the transaction applied")
        tw.stop()
        _, recs, _ = fk.decode_journal(self.journal)
        faults = sorted((r.get("rule"), r.get("message_id")) for r in recs
                        if fk.KIND_NAMES.get(r.get("kind")) == "fault")
        self.assertEqual(faults, [("again", "j-again"), ("cut", "j-cut"), ("gone", "j-gone"),
                                  ("lapse", "j-drop"), ("raw", "j-raw"), ("slow", "j-late")])


if __name__ == "__main__":
    unittest.main()
