#!/usr/bin/python3
"""Several twice instances, one answer (docs/instances.md).

Two real Redis servers, each with a stream of jobs consumed by the Streams example worker
(tests/e2e/streams/worker.py: redis-py, XREADGROUP / XACK / XAUTOCLAIM, the `charge` and
`charge_safe` handlers).  The jobs have fixed entry ids, so that the same seed faults the same
jobs run after run.

- test_two_instances_equal_one_process: two twice processes (`instance zone-a` and `instance
  zone-b`, the same seed and rules), one in front of each Redis, then one twice carrying both
  listeners, on the same jobs.  `twice verdict` over the two instances' journals (named by a
  glob, each instance's effects file by its own --effects) gives the rows the one process's
  journal gives: the same counts, verdicts and example ids (the times aside, and the instance
  each row names).
- test_delivered_through_one_acked_through_other: two twice instances in front of one Redis;
  the worker reads through the first and sends its XACKs through the second (as behind a load
  balancer).  Each journal alone misses half of each message's story (zone-a's: deliveries
  never settled); read together every message is one message, delivered once and settled.
"""

import json
import os
import signal
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

WORKER = os.path.join(h.SOURCE_DIR, "tests", "e2e", "streams", "worker.py")
SEED = 4242
JOBS = 24            # per task and per Redis
STREAM, GROUP = "jobs", "workers"
VISIBILITY_S = 1     # the workers' XAUTOCLAIM min-idle time


def listen(name, port, upstream):
    return ("listen %s {\n  protocol resp\n  profile streams\n  bind 127.0.0.1:%d\n"
            "  upstream 127.0.0.1:%d\n}\n" % (name, port, upstream))


def rules(name):
    """The same rules on every listener (rule names decide with the seed: the same in every
    instance)."""
    return ("rule copy-%s on %s {\n  when deliver\n  probability 20%%\n  do duplicate\n}\n"
            "rule lost-ack-%s on %s {\n  when ack\n  probability 20%%\n  do redeliver\n}\n"
            % (name, name, name, name))


def conf(instance, journal, listeners, with_rules=True, admin=None):
    text = "seed %d\ninstance %s\njournal %s\nlog-level info\nshutdown-grace 2s\n" % (
        SEED, instance, journal)
    if admin is not None:
        text += "admin 127.0.0.1:%d\n" % admin
    for name, port, upstream in listeners:
        text += listen(name, port, upstream) + (rules(name) if with_rules else "")
    return text


class Instances(h.TestCase):

    def setUp(self):
        super().setUp()
        self.workers = []
        self.addCleanup(self.stop_workers)

    def stop_workers(self):
        for p in self.workers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.workers:
            try:
                p.wait(15)
            except Exception:
                h.kill_group(p)
        self.workers = []

    def redis(self):
        r = h.start_redis(self.tmp)
        self.addCleanup(r.stop)
        return r

    def produce(self, r, port, first_ms):
        """JOBS jobs of each task onto r's stream through twice at port, with entry ids
        <first_ms + i>-1, after creating the group on r itself."""
        import redis
        r.command("DEL", STREAM)
        r.command("XGROUP", "CREATE", STREAM, GROUP, "0", "MKSTREAM")
        c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        for i in range(2 * JOBS):
            task = "charge" if i % 2 == 0 else "charge_safe"
            c.xadd(STREAM, {"task": task, "order_id": str(i)}, id="%d-1" % (first_ms + i))
        c.close()
        return ["%d-1" % (first_ms + i) for i in range(2 * JOBS)]

    def start_worker(self, name, port, effect_redis, files, ack_port=None):
        env = dict(os.environ, TWICE_EFFECTS=files + "-effects.txt", TWICE_RUNS=files + "-runs.txt",
                   TWICE_EFFECT_REDIS="127.0.0.1:%d" % effect_redis.port,
                   PYTHONDONTWRITEBYTECODE="1")
        argv = [sys.executable, WORKER, "--broker", "127.0.0.1:%d" % port, "--stream", STREAM,
                "--group", GROUP, "--consumer", name, "--visibility-timeout", str(VISIBILITY_S),
                "--block-ms", "200"]
        if ack_port is not None:
            argv += ["--ack-broker", "127.0.0.1:%d" % ack_port]
        p = h.spawn(argv, log_path=files + "-worker.log", env=env, cwd=self.tmp)
        self.workers.append(p)
        return files + "-effects.txt"

    def drained(self, r, last_id):
        """Every entry read by the group and none pending (a copy twice left pending comes back
        through XAUTOCLAIM first)."""
        info = r.command("XINFO", "GROUPS", STREAM)
        fields = dict(zip(info[0][::2], info[0][1::2]))
        pending = int(r.command("XPENDING", STREAM, GROUP)[0])
        return fields[b"last-delivered-id"] == last_id.encode() and pending == 0

    def wait_drained(self, pairs):
        h.wait_until(lambda: all(self.drained(r, last) for r, last in pairs), 120,
                     what="streams drained")
        self.stop_workers()

    def verdict(self, args, want_rc):
        r = h.run_twice(["verdict"] + args + ["--json"])
        self.assertEqual(r.returncode, want_rc, r.stderr.decode(errors="replace"))
        return json.loads(r.stdout.decode())

    # -- the two tests --------------------------------------------------------------------

    def test_two_instances_equal_one_process(self):
        r1, r2 = self.redis(), self.redis()
        runs = os.path.join(self.tmp, "runs")
        os.makedirs(runs)
        p1, p2 = h.free_port(), h.free_port()
        a = self.twice(conf("zone-a", os.path.join(runs, "zone-a.pb"), [("jobs1", p1, r1.port)]))
        b = self.twice(conf("zone-b", os.path.join(runs, "zone-b.pb"), [("jobs2", p2, r2.port)]))
        ids1 = self.produce(r1, p1, 1000)
        ids2 = self.produce(r2, p2, 5000)
        e1 = self.start_worker("w1", p1, r1, os.path.join(self.tmp, "two-1"))
        e2 = self.start_worker("w2", p2, r2, os.path.join(self.tmp, "two-2"))
        self.wait_drained([(r1, ids1[-1]), (r2, ids2[-1])])
        a.stop()
        b.stop()
        merged = self.verdict(["--journal", os.path.join(runs, "*.pb"), "--effects", e1,
                               "--effects", e2], 1)

        for r in (r1, r2):
            r.command("FLUSHALL")
        q1, q2 = h.free_port(), h.free_port()
        one = os.path.join(self.tmp, "one.pb")
        c = self.twice(conf("one", one, [("jobs1", q1, r1.port), ("jobs2", q2, r2.port)]))
        self.produce(r1, q1, 1000)
        self.produce(r2, q2, 5000)
        f1 = self.start_worker("w1", q1, r1, os.path.join(self.tmp, "one-1"))
        f2 = self.start_worker("w2", q2, r2, os.path.join(self.tmp, "one-2"))
        self.wait_drained([(r1, ids1[-1]), (r2, ids2[-1])])
        c.stop()
        single = self.verdict([one, "--effects", f1, "--effects", f2], 1)

        h.log("merged verdict: %s" % json.dumps(merged["tasks"])[:3000])
        self.assertEqual([j["instance"] for j in merged["journals"]], ["zone-a", "zone-b"])
        self.assertEqual([j["instance"] for j in single["journals"]], ["one"])
        rows = {t["task"]: t for t in merged["tasks"]}
        self.assertEqual(rows["charge"]["verdict"], "NOT IDEMPOTENT", rows["charge"])
        self.assertEqual(rows["charge_safe"]["verdict"], "IDEMPOTENT", rows["charge_safe"])
        for t in merged["tasks"]:
            self.assertEqual(t["instances"], ["zone-a", "zone-b"])
            self.assertEqual(t["listeners"], ["jobs1", "jobs2"])
            self.assertEqual(t["messages"], 2 * JOBS)
        self.assertEqual(self.comparable(merged), self.comparable(single))

    def comparable(self, v):
        """The verdict without what names the journals and instances, and without the times of
        one run (when it started, how long copies took)."""
        v = dict(v)
        for k in ("journal", "effects", "effects_files", "journals", "start_unix_ms",
                  "end_unix_us", "records", "journal_runs"):
            v.pop(k, None)
        tasks = []
        for t in v.pop("tasks"):
            t = dict(t)
            for k in ("instances", "copy_delay_ms", "overlap_ms", "last_progress_unix_us"):
                t.pop(k, None)
            tasks.append(t)
        v["tasks"] = tasks
        return v

    def test_delivered_through_one_acked_through_other(self):
        r = self.redis()
        runs = os.path.join(self.tmp, "runs")
        os.makedirs(runs)
        pa, pb = h.free_port(), h.free_port()
        ja, jb = os.path.join(runs, "a.pb"), os.path.join(runs, "b.pb")
        admin = h.free_port()
        a = self.twice(conf("zone-a", ja, [("jobs", pa, r.port)], with_rules=False, admin=admin))
        # Prometheus tells the instances apart by their targets; twice says its own name too
        metrics = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=10).read()
        self.assertRegex(metrics.decode(), r'(?m)^twice_build_info\{version="[^"]*",'
                         r'twice_instance="zone-a"\} 1$')
        b = self.twice(conf("zone-b", jb, [("jobs", pb, r.port)], with_rules=False))
        ids = self.produce(r, pa, 1000)
        effects = self.start_worker("w", pa, r, os.path.join(self.tmp, "split"), ack_port=pb)
        self.wait_drained([(r, ids[-1])])
        a.stop()
        b.stop()
        # zone-a alone saw every delivery and no settlement; zone-b alone only acks
        alone = self.verdict([ja, "--effects", effects], 0)
        self.assertEqual(sum(t["unfinished"] for t in alone["tasks"]), 2 * JOBS, alone)
        both = self.verdict([ja, jb, "--effects", effects], 0)
        self.assertEqual(sorted(t["task"] for t in both["tasks"]), ["charge", "charge_safe"])
        for t in both["tasks"]:
            self.assertEqual(t["messages"], JOBS, t)
            self.assertEqual(t["delivered_more_than_once"], 0, t)
            self.assertEqual(t["unfinished"], 0, t)
            self.assertEqual(t["more_than_one_effect"], 0, t)
            self.assertEqual(t["instances"], ["zone-a", "zone-b"], t)
        rep = h.run_twice(["report", "--json", ja, jb])
        self.assertEqual(rep.returncode, 0, rep.stderr)
        report = json.loads(rep.stdout.decode())
        self.assertEqual(report["deliveries"]["messages"], 2 * JOBS)
        self.assertEqual(report["deliveries"]["delivered_more_than_once"], 0)
        self.assertEqual([j["instance"] for j in report["journals"]], ["zone-a", "zone-b"])
        self.assertEqual(report["by_kind"]["deliver"], 2 * JOBS)
        self.assertEqual(report["by_kind"]["ack"], 2 * JOBS)
        text = h.run_twice(["report", ja, jb]).stdout.decode()
        self.assertIn("journals  2, read together", text)
        self.assertRegex(text, r"(?m)^  zone-b +\d+ +1 +stop +%s$" % jb)


if __name__ == "__main__":
    unittest.main(verbosity=2)
