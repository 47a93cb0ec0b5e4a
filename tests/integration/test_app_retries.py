#!/usr/bin/python3
"""Retries the app asks for are not copies: the journal tells them apart, the report and the
verdict count them, and a handler is never called tested (or doubled) on their evidence.

- Celery on RabbitMQ: `tasks.charge_retried` calls self.retry() twice before it charges
  once (tests/e2e/celery_amqp/tasks.py).  Each retry is a new message with the task's id and
  its `retries` header one up: twice journals the publish with retry set and each delivery
  with its count.  A rule redelivers the first COPIES `tasks.charge` jobs on their ack, so the
  run has real copies beside the retries.
- RQ: `tasks.charge_retried` fails twice under Retry(max=2) (tests/e2e/rq/tasks.py); RQ's
  worker saves the job, its start time set, and pushes its id again in one transaction.
- Sidekiq: `ChargeRetried` fails twice under `retry: 2` (tests/e2e/sidekiq/app.rb); Sidekiq
  puts it in its retry set with its retry_count, and its scheduler pushes it back onto the
  queue (LPUSH) when due.
- A pika consumer that nacks each message once with requeue=True, then acks its redelivery.

In each: the retried task's row has every message retried, at most 2 (1 for the nacks)
retries, no fault, no copy, no doubled effect, and UNTESTED; `twice report` lists the task
with its retries.  Before twice counted retries, the same runs made the row IDEMPOTENT on the
evidence of the app's own retries alone.
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import driverkit as dk  # noqa: E402
import faultkit as fk  # noqa: E402

JOBS = 10        # charge and charge_safe jobs each
RETRIED = 10     # charge_retried jobs
RETRIES = 2      # the retries each asks for (tests/e2e/e2ekit.py, RETRIES)
COPIES = 3       # charge jobs redelivered by the rule
DRIVER_TIMEOUT = 180


class AppRetries(dk.FrameworkCase):
    TMP_PREFIX = "twice-it-retries-"

    def run_app(self, framework, block, rule_text, driver_args, env=None):
        """twice with `block` and rule_text, the app through it with RETRIED retried jobs;
        returns ({task: verdict row}, verdict text, report JSON, decoded journal records)."""
        port = int(block.split("bind 127.0.0.1:")[1].split()[0])
        journal = os.path.join(self.tmp, "journal.pb")
        tw = self.twice("journal %s\n" % journal + h.config(block, log_level="info") + rule_text)
        _, files, rc = dk.run(self, framework, port, redis_port=self.redis.port, jobs=JOBS,
                              workers=2, timeout=DRIVER_TIMEOUT, env=env,
                              args=["--retried", str(RETRIED), "--extra-runs", str(COPIES)]
                              + list(driver_args))
        self.assertEqual(rc, 0, "%s driver failed" % framework)
        tw.stop()  # flushes the journal
        argv = ["verdict", "--journal", journal, "--effects", files["effects"]]
        js, text = h.run_twice(argv + ["--json"]), h.run_twice(argv)
        self.assertEqual(js.stderr, b"")
        table = text.stdout.decode()
        h.log("%s: twice verdict\n%s" % (framework, table))
        rows = {r["task"]: r for r in json.loads(js.stdout.decode())["tasks"]}
        rep = h.run_twice(["report", journal, "--json"])
        self.assertEqual(rep.returncode, 0, rep.stderr.decode(errors="replace"))
        _, recs, _ = fk.decode_journal(journal)
        return rows, table, json.loads(rep.stdout.decode()), recs

    def assert_retried_row(self, rows, table, report, task, messages, retries):
        """The row of a task whose every message the app retried `retries` times."""
        row = rows[task]
        want = {"messages": messages, "faulted": 0, "delivered_more_than_once": 0,
                "more_than_one_effect": 0, "copies": 0, "retried": messages,
                "max_retries": retries, "doubled_by_retries": 0, "verdict": "UNTESTED"}
        self.assertEqual({k: row[k] for k in want}, want, table)
        line, _ = h.verdict_text_rows(table, task)
        self.assertEqual(line[0].split()[1:7], ["%d" % messages, "0", "0", "0", "0",
                                                "%d" % messages], table)
        self.assertIn("%s: %d messages retried by the app, at most %d %s of one" % (
            task, messages, retries, "retry" if retries == 1 else "retries"), table)
        self.assertIn({"task": task, "retried": messages, "max_retries": retries},
                      report["retries"])

    def assert_deliveries(self, recs, task, per_message):
        """Each message of task was delivered per_message times through twice."""
        counts = {}
        for r in recs:
            if fk.KIND_NAMES.get(r.get("kind")) == "deliver" and r.get("task") == task:
                counts[r["message_id"]] = counts.get(r["message_id"], 0) + 1
        self.assertEqual(sorted(set(counts.values())), [per_message], counts)
        return counts

    def test_celery_amqp_self_retry(self):
        r = self.rabbitmq()
        ctl = "%s -n %s" % (os.path.join(h.RABBIT_BIN, "rabbitmqctl"), r.nodename)
        block = h.listen_block("app", h.free_port(), r.port, protocol="amqp")
        rule = ("rule copies on app {\n  when ack task=tasks.charge\n  first %d\n"
                "  do redeliver\n}\n" % COPIES)
        rows, table, report, recs = self.run_app(
            "celery_amqp", block, rule, ["--inspect", "127.0.0.1:%d" % r.port,
                                         "--rabbitmqctl", ctl], env=r.env)
        self.assert_deliveries(recs, "tasks.charge_retried", 1 + RETRIES)
        # the journal: every retry publish says so, every delivery its count
        pubs = [x for x in recs if fk.KIND_NAMES.get(x.get("kind")) == "publish"
                and x.get("task") == "tasks.charge_retried"]
        self.assertEqual(sorted((x.get("retries", 0), bool(x.get("retry"))) for x in pubs),
                         sorted([(0, False)] * RETRIED + [(1, True)] * RETRIED
                                + [(2, True)] * RETRIED))
        self.assert_retried_row(rows, table, report, "tasks.charge_retried", RETRIED, RETRIES)
        # the copies twice made are copies still
        self.assertEqual((rows["tasks.charge"]["verdict"], rows["tasks.charge"]["copies"]),
                         ("NOT IDEMPOTENT", COPIES), table)
        self.assertEqual(rows["tasks.charge"]["retried"], 0, table)

    def test_rq_retry(self):
        block = h.listen_block("app", h.free_port(), self.redis.port, protocol="resp",
                               profile="rq")
        rule = ("rule copies on app {\n  when deliver task=tasks.charge\n  first %d\n"
                "  do duplicate\n}\n" % COPIES)
        rows, table, report, recs = self.run_app(
            "rq", block, rule, ["--inspect", "127.0.0.1:%d" % self.redis.port])
        self.assert_deliveries(recs, "tasks.charge_retried", 1 + RETRIES)
        self.assert_retried_row(rows, table, report, "tasks.charge_retried", RETRIED, RETRIES)
        self.assertEqual((rows["tasks.charge"]["verdict"], rows["tasks.charge"]["copies"]),
                         ("NOT IDEMPOTENT", COPIES), table)

    def test_sidekiq_retry(self):
        block = h.listen_block("app", h.free_port(), self.redis.port, protocol="resp",
                               profile="sidekiq")
        rule = ("rule copies on app {\n  when deliver task=Charge\n  first %d\n"
                "  do duplicate\n}\n" % COPIES)
        rows, table, report, recs = self.run_app(
            "sidekiq", block, rule, ["--inspect", "127.0.0.1:%d" % self.redis.port])
        self.assert_deliveries(recs, "ChargeRetried", 1 + RETRIES)
        # the scheduler's pushes of a job that failed say so; the enqueue does not
        pubs = [x for x in recs if fk.KIND_NAMES.get(x.get("kind")) == "publish"
                and x.get("task") == "ChargeRetried"]
        self.assertEqual(sorted((x.get("retries", 0), bool(x.get("retry"))) for x in pubs),
                         sorted([(0, False)] * RETRIED + [(1, True)] * RETRIED
                                + [(2, True)] * RETRIED))
        self.assert_retried_row(rows, table, report, "ChargeRetried", RETRIED, RETRIES)
        self.assertEqual((rows["Charge"]["verdict"], rows["Charge"]["copies"]),
                         ("NOT IDEMPOTENT", COPIES), table)

    def test_pika_nack_requeue(self):
        """A consumer's nack with requeue asks for a new attempt: the broker's redelivery after
        it is no copy."""
        import pika  # python3-pika
        n = 8
        rabbit = self.rabbitmq()
        port = h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        block = h.listen_block("app", port, rabbit.port, protocol="amqp")
        tw = self.twice("journal %s\n" % journal + h.config(block, log_level="info"))
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=port, heartbeat=0, connection_attempts=3, retry_delay=0.5))
        ch = conn.channel()
        ch.queue_declare("jobs", durable=False, auto_delete=False)
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", "jobs", b"job %d" % i, pika.BasicProperties(
                message_id="m%d" % i, type="jobs.resize",
                headers={"task": "jobs.resize"}), mandatory=True)
        acked = set()
        nacked = set()
        effects = os.path.join(self.tmp, "effects.txt")
        with open(effects, "w") as out:
            for method, props, _ in ch.consume("jobs", inactivity_timeout=30):
                self.assertIsNotNone(method, "no delivery within 30 s")
                mid = props.message_id
                if mid not in nacked:
                    nacked.add(mid)
                    ch.basic_nack(method.delivery_tag, requeue=True)
                    continue
                self.assertTrue(method.redelivered)
                out.write(mid + "\n")
                ch.basic_ack(method.delivery_tag)
                acked.add(mid)
                if len(acked) == n:
                    break
        ch.cancel()
        conn.close()
        tw.stop()
        _, recs, _ = fk.decode_journal(journal)
        nacks = [r for r in recs if fk.KIND_NAMES.get(r.get("kind")) == "nack"]
        self.assertEqual(len(nacks), n)
        self.assertTrue(all(r.get("retry") for r in nacks), nacks)
        js = h.run_twice(["verdict", "--journal", journal, "--effects", effects, "--json"])
        self.assertEqual(js.returncode, 0, js.stdout.decode(errors="replace"))
        row = json.loads(js.stdout.decode())["tasks"][0]
        want = {"task": "jobs.resize", "messages": n, "delivered_more_than_once": 0,
                "copies": 0, "retried": n, "max_retries": 1, "verdict": "UNTESTED"}
        self.assertEqual({k: row[k] for k in want}, want)


if __name__ == "__main__":
    unittest.main(verbosity=2)
