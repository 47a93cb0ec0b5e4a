#!/usr/bin/python3
"""Late copies on purpose, with the real frameworks, and a verdict that tells
a 2-second deduplication from a lasting one.

Each run puts twice (one listener, a journal) in front of the real broker,
runs the framework's example app of tests/e2e through it (JOBS `charge` and
JOBS `charge_safe` jobs, real workers), then asks `twice verdict --json`.
The rules fault a known number of jobs of each handler (`first COPIES`), so
the driver knows how many executions to wait for (--extra-runs): no run ends
on a guess about time.

- `when deliver ...; do duplicate after 3s` on Sidekiq, RQ, Celery on Redis
  and a plain-list app: each faulted job runs a second time, and the verdict's
  copy delays (first delivery to the copy) are all 3 s or more; RQ's and the
  list app's `when ack ...; do redeliver after 3s` the same, counted from the
  ack (one run: charge's copies by the first rule, charge_safe's by the
  second).
- Streams: twice cannot choose when a pending entry comes back (`twice
  check` refuses `after`, with the reason); `do duplicate` leaves the entry
  pending, and the worker's XAUTOCLAIM min-idle-time (3 s here) makes the
  copy come no earlier than that.
- Producer-side copies (PublishCopies): `when publish ...; do duplicate`
  with Sidekiq, RQ (its enqueue transaction), Celery on Redis, a plain-list app
  and Celery on RabbitMQ: each faulted job is enqueued twice with its id and runs twice;
  charge NOT IDEMPOTENT, charge_safe IDEMPOTENT.  And `when confirm ...; do drop` with
  Celery's own retry: its producer times out on the lost confirm and publishes again.
- Celery on RabbitMQ, a `charge_safe` whose deduplication key expires 2 s
  after it is taken (--done-ttl 2): NOT IDEMPOTENT when some acks are held
  past a 3 s visibility timeout, and under `redeliver after 5s`; IDEMPOTENT
  under immediate redeliveries alone, with a window below 2 s printed.
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import driverkit as dk  # noqa: E402

JOBS = 20          # jobs per handler and run
COPIES = 3         # jobs each rule faults (`first COPIES`)
AFTER_MS = 3000    # the late copies' D
DRIVER_TIMEOUT = 180

# framework -> (profile or None for amqp, non-idempotent task, idempotent task)
APPS = {
    "sidekiq": ("sidekiq", "Charge", "ChargeSafe"),
    "rq": ("rq", "tasks.charge", "tasks.charge_safe"),
    "celery_redis": ("celery", "tasks.charge", "tasks.charge_safe"),
    "streams": ("streams", "charge", "charge_safe"),
    "celery_amqp": (None, "tasks.charge", "tasks.charge_safe"),
    "lists": ("list", "App\\Jobs\\Charge", "App\\Jobs\\ChargeSafe"),
}
# Listener settings an app needs: where Laravel-shaped jobs keep their id and name.
LISTEN_SETTINGS = {"lists": "message-id body.json.uuid\ntask body.json.displayName\n"}


def task_word(t):
    """A task name as a matcher value: quoted (JSON's escapes are the file's) when it has a
    backslash, as Laravel's class names do."""
    return json.dumps(t) if "\\" in t else t


def rules(listener, event, action, tasks, extra=""):
    """One rule per task: the first COPIES matching events get `action`."""
    return "".join("rule r%d on %s {\n  when %s task=%s\n  first %d\n  %s\n}\n" % (
        i, listener, event, task_word(t), COPIES, action) for i, t in enumerate(tasks)) + extra


class LateCopies(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-late-"

    def run_app(self, framework, rule_text, listen_extra="", driver_args=(), upstream=None,
                env=None):
        """twice with one listener and rule_text, the app through it; returns
        ({task: verdict row}, verdict text, exit status of the verdict)."""
        profile, unsafe, safe = APPS[framework]
        port = h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        if profile is None:
            block = h.listen_block("app", port, upstream, listen_extra, protocol="amqp")
        else:
            block = h.listen_block("app", port, self.redis.port,
                                   LISTEN_SETTINGS.get(framework, "") + listen_extra,
                                   protocol="resp", profile=profile)
        conf = "journal %s\n" % journal + h.config(block, log_level="info") + rule_text
        tw = self.twice(conf)
        _, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=JOBS,
                              workers=2, timeout=DRIVER_TIMEOUT,
                              args=["--extra-runs", str(2 * COPIES)] + list(driver_args),
                              env=env)
        self.assertEqual(rc, 0, "%s driver failed" % framework)
        tw.stop()  # flushes the journal
        argv = ["verdict", "--journal", journal, "--effects", files["effects"]]
        js, text = h.run_twice(argv + ["--json"]), h.run_twice(argv)
        self.assertEqual(js.stderr, b"")
        self.assertEqual(js.returncode, text.returncode)
        table = text.stdout.decode()
        h.log("%s: twice verdict\n%s" % (framework, table))
        rows = {r["task"]: r for r in json.loads(js.stdout.decode())["tasks"]}
        self.assertEqual(sorted(rows), sorted([unsafe, safe]), table)
        return rows, table, js.returncode

    def assert_late(self, rows, table, min_ms=AFTER_MS, slack_ms=50):
        """Both handlers got COPIES copies, none sooner than min_ms after the
        first delivery (less slack_ms: the journal's clock against the timer's);
        charge doubled them, charge_safe did not."""
        for task, row in rows.items():
            self.assertEqual(row["copies"], COPIES, (task, row))
            self.assertGreaterEqual(row["copy_delay_ms"]["min"], min_ms - slack_ms, (task, row))
        unsafe = [t for t, r in rows.items() if r["verdict"] == "NOT IDEMPOTENT"]
        safe = [t for t, r in rows.items() if r["verdict"] == "IDEMPOTENT"]
        self.assertEqual((len(unsafe), len(safe)), (1, 1), table)
        self.assertEqual(rows[unsafe[0]]["more_than_one_effect"], COPIES, table)
        self.assertIn("%s: IDEMPOTENT for copies " % safe[0], table)

    # -- Redis --------------------------------------------------------------------------

    def late_duplicate(self, framework, driver_args=()):
        _, unsafe, safe = APPS[framework]
        rows, table, rc = self.run_app(framework, rules("app", "deliver",
                                                        "do duplicate after 3s", [unsafe, safe]),
                                       driver_args=["--inspect", "127.0.0.1:%d" % self.redis.port]
                                       + list(driver_args))
        self.assertEqual(rc, 1)
        self.assert_late(rows, table)

    def test_sidekiq_duplicate_after(self):
        self.late_duplicate("sidekiq")

    def test_rq_duplicate_and_redeliver_after(self):
        """charge's copies by `duplicate after` on its deliveries, charge_safe's
        by `redeliver after` on its acks (the job id pushed back 3 s after
        the ack, which is not applied)."""
        _, unsafe, safe = APPS["rq"]
        text = (rules("app", "deliver", "do duplicate after 3s", [unsafe])
                + rules("app", "ack", "do redeliver after 3s", [safe]).replace("rule r0", "rule a0"))
        rows, table, rc = self.run_app("rq", text, driver_args=["--inspect",
                                                                 "127.0.0.1:%d" % self.redis.port])
        self.assertEqual(rc, 1)
        self.assert_late(rows, table)

    def test_lists_duplicate_and_redeliver_after(self):
        """A plain-list app (Laravel-shaped jobs, a processing list): charge's copies by
        `duplicate after` on its deliveries, charge_safe's by `redeliver after` on its acks
        (the LREM applied and the job pushed back onto its queue 3 s after the ack)."""
        _, unsafe, safe = APPS["lists"]
        text = (rules("app", "deliver", "do duplicate after 3s", [unsafe])
                + rules("app", "ack", "do redeliver after 3s", [safe]).replace("rule r0", "rule a0"))
        rows, table, rc = self.run_app("lists", text, driver_args=[
            "--inspect", "127.0.0.1:%d" % self.redis.port])
        self.assertEqual(rc, 1)
        self.assert_late(rows, table)

    def test_celery_redis_duplicate_after(self):
        self.late_duplicate("celery_redis", ["--visibility-timeout", "30"])

    def test_streams_copy_follows_min_idle(self):
        _, unsafe, safe = APPS["streams"]
        # `after` is refused there, with the reason
        port = h.free_port()
        path = os.path.join(self.tmp, "streams-after.conf")
        with open(path, "w") as f:
            f.write(h.config(h.listen_block("app", port, self.redis.port, protocol="resp",
                                            profile="streams"))
                    + rules("app", "deliver", "do duplicate after 3s", [unsafe]))
        r = h.run_twice(["check", "-c", path])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"cannot do 'duplicate after' on 'deliver' events: a pending stream entry "
                      b"is handed out again when a consumer's XAUTOCLAIM", r.stderr)
        # the copy comes when the consumer's min-idle-time (3 s) has passed
        rows, table, rc = self.run_app("streams", rules("app", "deliver", "do duplicate",
                                                        [unsafe, safe]),
                                       driver_args=["--inspect", "127.0.0.1:%d" % self.redis.port,
                                                    "--visibility-timeout", "3"])
        self.assertEqual(rc, 1)
        # Redis counts the 3 s from its own delivery, the journal from the moment twice read
        # the reply: on a loaded machine twice may read the first reply later than the copy's
        self.assert_late(rows, table, min_ms=3000, slack_ms=250)

    # -- Celery on RabbitMQ: a deduplication that forgets after 2 s ------------------------

    def celery_amqp(self, rule_text, listen_extra=""):
        r = self.rabbitmq()
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        return self.run_app("celery_amqp", rule_text, listen_extra=listen_extra,
                            upstream=r.port, env=r.env,
                            driver_args=["--inspect", "127.0.0.1:%d" % r.port, "--rabbitmqctl",
                                         ctl, "--done-ttl", "2"])

    def assert_both_doubled(self, rows, table, min_ms):
        for task, row in rows.items():
            self.assertEqual(row["verdict"], "NOT IDEMPOTENT", table)
            self.assertEqual(row["more_than_one_effect"], COPIES, table)
            self.assertGreaterEqual(row["copy_delay_ms"]["min"], min_ms - 50, (task, row))

    def test_celery_amqp_dedup_ttl_acks_past_visibility_timeout(self):
        _, unsafe, safe = APPS["celery_amqp"]
        rows, table, rc = self.celery_amqp(rules("app", "ack", "do delay 5s", [unsafe, safe]),
                                           "visibility-timeout 3s")
        self.assertEqual(rc, 1)
        self.assert_both_doubled(rows, table, 3000)

    def test_celery_amqp_dedup_ttl_redeliver_after(self):
        _, unsafe, safe = APPS["celery_amqp"]
        rows, table, rc = self.celery_amqp(rules("app", "ack", "do redeliver after 5s",
                                                 [unsafe, safe]))
        self.assertEqual(rc, 1)
        self.assert_both_doubled(rows, table, 5000)

    def test_celery_amqp_dedup_ttl_immediate_redeliveries(self):
        _, unsafe, safe = APPS["celery_amqp"]
        rows, table, rc = self.celery_amqp(rules("app", "ack", "do redeliver", [unsafe, safe]))
        self.assertEqual(rc, 1)
        self.assertEqual(rows[unsafe]["verdict"], "NOT IDEMPOTENT", table)
        row = rows[safe]
        self.assertEqual((row["verdict"], row["copies"]), ("IDEMPOTENT", COPIES), table)
        # the copies came at once: the 2 s key still held them off, and the
        # verdict says that only so short a window was tested
        self.assertLess(row["copy_delay_ms"]["max"], 2000, row)
        self.assertIn("%s: IDEMPOTENT for copies " % safe, table)
        self.assertIn("every copy came within ", table)
        self.assertIn("do redeliver after D", table)


class PublishCopies(LateCopies):
    """The producer's half of at-least-once: `when publish ...; do duplicate` makes the broker
    get a job twice, with the same id, as from a producer that retried after a lost confirm or
    a cut connection.  Each faulted job runs twice; charge doubles its effect, charge_safe (its
    key is the job's own id) does not."""

    TMP_PREFIX = "twice-it-pubcopy-"

    def publish_copies(self, framework, **kw):
        _, unsafe, safe = APPS[framework]
        rows, table, rc = self.run_app(framework, rules("app", "publish", "do duplicate",
                                                        [unsafe, safe]), **kw)
        self.assertEqual(rc, 1)
        self.assert_late(rows, table, min_ms=0, slack_ms=0)

    def redis_app(self, framework, *args):
        self.publish_copies(framework,
                            driver_args=["--inspect", "127.0.0.1:%d" % self.redis.port] + list(args))

    def test_sidekiq_publish_twice(self):
        self.redis_app("sidekiq")

    def test_rq_publish_twice(self):
        """RQ enqueues in a MULTI (the job's hash, then the push): the copy of the push goes
        after EXEC, once the hash is saved."""
        self.redis_app("rq")

    def test_lists_publish_twice(self):
        self.redis_app("lists")

    def test_celery_redis_publish_twice(self):
        self.redis_app("celery_redis", "--visibility-timeout", "30")

    def test_celery_amqp_publish_twice(self):
        r = self.rabbitmq()
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        self.publish_copies("celery_amqp", upstream=r.port, env=r.env,
                            driver_args=["--inspect", "127.0.0.1:%d" % r.port, "--rabbitmqctl",
                                         ctl])


    def test_celery_amqp_lost_confirm_republished(self):
        """`drop` on confirms with Celery's own retry: its producer, in confirm mode, stops
        waiting after 2 s, reconnects and publishes the task again (kombu's
        Connection.ensure), so each job whose confirm was lost reaches the queue twice with
        its id, and runs twice."""
        r = self.rabbitmq()
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        _, unsafe, safe = APPS["celery_amqp"]
        rows, table, rc = self.run_app(
            "celery_amqp", rules("app", "confirm", "do drop", [unsafe, safe]), upstream=r.port,
            env=r.env, driver_args=["--inspect", "127.0.0.1:%d" % r.port, "--rabbitmqctl", ctl,
                                    "--confirm-timeout", "2"])
        self.assertEqual(rc, 1)
        self.assert_late(rows, table, min_ms=0, slack_ms=0)
        for task in (unsafe, safe):
            self.assertEqual(rows[task]["faulted"], COPIES, table)


# The late-copy tests run once, in their own class.
for _name in [n for n in dir(LateCopies) if n.startswith("test_")]:
    setattr(PublishCopies, _name, None)


if __name__ == "__main__":
    unittest.main(verbosity=2)
