#!/usr/bin/python3
"""When is a run finished: what twice still holds back or has scheduled, in GET /stats and
GET /metrics, POST /drain that waits for it, and a shutdown that does the same without
waiting out `shutdown-grace`.  Real RabbitMQ and Redis, pika and raw RESP clients:

- held acks (amqp, `delay 60s` on acks): /stats and /metrics count them; POST /drain answers
  200 at once with nothing pending, faults off (said in the answer and the log), and RabbitMQ
  has the acks while the consumer is still connected; a later ack is not held; POST
  /faults/on resumes; the journal has every delivery, ack and fault;
- late copies (amqp, `redeliver after 8s`): counted; a drain whose timeout is shorter answers
  504 with them still pending; a longer one answers once they were made, not sooner, and the
  copies reach another consumer;
- an ack held past a visibility timeout (amqp, `visibility-timeout 4s`, `delay 60s` on acks):
  the drain leaves it to expire, as the rule says (the copy comes at the timeout), then
  answers;
- Redis (`profile list`): a delayed ack and a late copy are commands twice scheduled on its own
  connection, counted, and sent at their time before the drain answers; a reply `delay` holds
  is released to its worker at once;
- SIGTERM with nothing pending: twice exits well before a 60 s `shutdown-grace`, though an
  AMQP consumer and Redis workers (one blocked in BLMOVE) are still connected; with an ack
  held, the ack reaches RabbitMQ first; with a delivery its worker has not acked, twice waits
  for the ack, then exits.
"""

import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import respkit as rk  # noqa: E402
import clientkit as ck  # noqa: E402

import pika  # noqa: E402

WAIT = 60        # seconds a wait may take on a loaded, sanitized run
GRACE = "60s"    # the shutdown tests' grace: twice must exit well before it
EXIT_WITHIN = 25  # ... within this many seconds of SIGTERM


class DrainTest(ck.BrokerCase):
    RABBITMQ = True
    REDIS = True
    TMP_PREFIX = "twice-it-drain-"

    @classmethod
    def set_up_class(cls):
        ck.declare_queues(cls.rabbit.port, "dr-held", "dr-late", "dr-vt", "dr-term", "dr-busy",
                          "dr-idle")

    def start(self, listeners, rules=(), grace="2s"):
        self.admin_port = h.free_port()
        self.journal = os.path.join(self.tmp, "journal.pb")
        tw = self.twice(fk.conf_text(listeners, rules, admin_port=self.admin_port,
                                     journal=self.journal, log_level="info", grace=grace))
        tw.wait_for_log(r"msg=\"admin listening\"")
        self.api = fk.Admin(self.admin_port)
        return tw

    def consumer(self, port):
        c = ck.pika_conn(port)
        self.addCleanup(ck.close_quietly, c)
        return c

    def publish(self, queue, ids):
        c = ck.pika_conn(self.rabbit.port)
        ch = c.channel()
        for i in ids:
            ch.basic_publish("", queue, i.encode(), pika.BasicProperties(message_id=i))
        c.close()

    def pending(self, listener=None):
        p = self.api.json("/stats")["pending"]
        return p if listener is None else p["listeners"].get(listener, {})

    def wait_pending(self, listener, kind, n):
        h.wait_until(lambda: self.pending(listener).get(kind) == n, WAIT,
                     what="/stats to count %d %s on %s (now %r)" % (n, kind, listener,
                                                                     self.pending()))

    def drain(self, timeout):
        st, _, body = self.api.post("/drain?timeout=%s" % timeout, timeout=WAIT + 30)
        return st, json.loads(body)

    def records(self, tw):
        tw.stop()
        _, recs, truncated = fk.decode_journal(self.journal)
        self.assertFalse(truncated)
        return [(fk.KIND_NAMES.get(r.get("kind"), r.get("kind")), r) for r in recs]

    def wait_broker(self, queue, want):
        h.wait_until(lambda: ck.queue_counts(self.rabbit).get(queue) == want, WAIT,
                     what="RabbitMQ to have (ready, unacked) = %r in %s" % (want, queue))

    # -- amqp -----------------------------------------------------------------------------

    def test_drain_releases_held_acks(self):
        port = h.free_port()
        tw = self.start([ck.amqp_listen("rabbit", port, self.rabbit.port)],
                        [fk.rule_block("slow-ack", "rabbit", "when ack queue=dr-held",
                                       "do delay 60s")])
        ids = ["held-%d" % i for i in range(3)]
        self.publish("dr-held", ids)
        a = self.consumer(port)
        cha = a.channel()
        for _ in ids:
            m, _, _ = ck.get_one(cha, "dr-held")
            cha.basic_ack(m.delivery_tag)
        t_acked = time.monotonic()
        self.wait_pending("rabbit", "held_acks", 3)
        self.assertEqual(self.pending()["total"], 3)
        _, samples = fk.parse_prometheus(self.api.get("/metrics")[2])
        self.assertEqual(fk.prom_value(samples, "twice_pending", listener="rabbit",
                                       kind="held_acks"), 3)
        self.assertEqual(ck.queue_counts(self.rabbit).get("dr-held"), (0, 3))  # held from RabbitMQ
        st, body = self.drain("30s")
        self.assertEqual(st, 200, body)
        self.assertTrue(body["drained"])
        self.assertFalse(body["faults_enabled"])
        self.assertEqual(body["pending"]["total"], 0, body)
        self.assertEqual(body["resume"], "POST /faults/on")
        # the acks went to RabbitMQ now, not 60 s after they were sent, the consumer still there
        self.wait_broker("dr-held", (0, 0))
        self.assertLess(time.monotonic() - t_acked, 45)
        self.assertTrue(cha.is_open)
        tw.wait_for_log(r"msg=draining source=admin faults=off timeout_ms=30000")
        tw.wait_for_log(r'msg="drain released" loop=\d+ held_acks=3 held_messages=0')
        tw.wait_for_log(r"msg=drained waited_ms=\d+")
        self.assertFalse(self.api.json("/rules")["faults_enabled"])
        # rules stay off: the next ack goes straight on
        self.publish("dr-held", ["after"])
        m, _, _ = ck.get_one(cha, "dr-held")
        cha.basic_ack(m.delivery_tag)
        self.wait_broker("dr-held", (0, 0))
        self.assertEqual(self.pending("rabbit").get("held_acks"), 0)
        st, _, body = self.api.post("/faults/on")
        self.assertEqual((st, json.loads(body)), (200, {"faults_enabled": True}))
        a.close()
        recs = self.records(tw)
        for kind, n in (("deliver", 4), ("ack", 4), ("fault", 3)):
            self.assertEqual(len([1 for k, r in recs if k == kind]), n, kind)

    def test_drain_waits_for_late_copies(self):
        port = h.free_port()
        tw = self.start([ck.amqp_listen("rabbit", port, self.rabbit.port)],
                        [fk.rule_block("late-ack", "rabbit", "when ack queue=dr-late",
                                       "do redeliver after 8s")])
        ids = ["late-%d" % i for i in range(2)]
        self.publish("dr-late", ids)
        a, b = self.consumer(port), self.consumer(port)
        cha, chb = a.channel(), b.channel()
        for _ in ids:
            m, _, _ = ck.get_one(cha, "dr-late")
            cha.basic_ack(m.delivery_tag)
        t_acked = time.monotonic()
        self.wait_pending("rabbit", "late_copies", 2)
        # a drain that cannot wait for them says what is still pending
        st, body = self.drain("500ms")
        self.assertEqual(st, 504, body)
        self.assertFalse(body["drained"])
        self.assertEqual(body["pending"]["listeners"]["rabbit"]["late_copies"], 2, body)
        tw.wait_for_log(r'msg="drain timed out" waited_ms=\d+ pending=2')
        # one that can: answered once the copies were made, at their time, not sooner
        st, body = self.drain("60s")
        self.assertEqual(st, 200, body)
        self.assertGreaterEqual(time.monotonic() - t_acked, 7.5)
        self.assertEqual(body["pending"]["total"], 0, body)
        got = sorted(ck.get_one(chb, "dr-late")[1].message_id for _ in ids)
        self.assertEqual(got, ids)
        self.assertEqual(len(rk.journal_faults(self.journal, "late-ack")), 2)
        a.close()
        b.close()
        tw.stop()

    def test_drain_leaves_an_ack_past_the_visibility_timeout_to_expire(self):
        port = h.free_port()
        tw = self.start([ck.amqp_listen("vt", port, self.rabbit.port, "visibility-timeout 4s")],
                        [fk.rule_block("slow-ack", "vt", "when ack queue=dr-vt", "do delay 60s")])
        self.publish("dr-vt", ["vt-1"])
        a, b = self.consumer(port), self.consumer(port)
        cha, chb = a.channel(), b.channel()
        m, _, _ = ck.get_one(cha, "dr-vt")
        t_delivered = time.monotonic()
        cha.basic_ack(m.delivery_tag)
        self.wait_pending("vt", "held_acks", 1)
        st, body = self.drain("60s")
        self.assertEqual(st, 200, body)
        # not released: the timeout requeued it, as the rule meant, and then the drain answered
        self.assertGreaterEqual(time.monotonic() - t_delivered, 3.8)
        tw.wait_for_log(r"msg=expired .* rule=slow-ack timeout=visibility-timeout")
        self.assertEqual(len(tw.log_records('drain released')), 0)
        m2, props, _ = ck.get_one(chb, "dr-vt")
        self.assertEqual((m2.redelivered, props.message_id), (True, "vt-1"))
        chb.basic_ack(m2.delivery_tag)
        a.close()
        b.close()
        recs = self.records(tw)
        self.assertEqual([(k, r.get("rule")) for k, r in recs if k in ("fault", "expired")],
                         [("fault", "slow-ack"), ("expired", "slow-ack")])

    # -- redis ----------------------------------------------------------------------------

    def test_drain_redis_scheduled_commands_and_held_reply(self):
        port = h.free_port()
        block = ck.resp_listen("jobs", port, self.redis.port, profile="list")
        tw = self.start([block], [
            fk.rule_block("slow-ack", "jobs", "when ack task=slowack", "do delay 5s"),
            fk.rule_block("late-ack", "jobs", "when ack task=lateack", "do redeliver after 5s"),
            fk.rule_block("held-pop", "jobs", "when deliver task=heldpop", "do delay 60s")])
        real = ck.redis_py(self.redis.port)
        real.delete("q", "p", "q2", "p2")
        a = json.dumps({"id": "a1", "task": "slowack"})
        r = json.dumps({"id": "r1", "task": "lateack"})
        held = json.dumps({"id": "h1", "task": "heldpop"})
        real.rpush("q", a, r)
        with rk.Conn(port) as w, rk.Conn(port) as w2:
            self.assertEqual(w.cmd("BLMOVE", "q", "p", "LEFT", "LEFT", "5"), a.encode())
            self.assertEqual(w.cmd("BLMOVE", "q", "p", "LEFT", "LEFT", "5"), r.encode())
            self.assertEqual(w.cmd("LREM", "p", "1", a), 1)  # applied 5 s later
            self.assertEqual(w.cmd("LREM", "p", "1", r), 1)  # pushed back 5 s later
            t_acked = time.monotonic()
            real.rpush("q2", held)
            w2.send(rk.enc("BLMOVE", "q2", "p2", "LEFT", "LEFT", "5"))
            self.wait_pending("jobs", "held_messages", 1)
            self.wait_pending("jobs", "scheduled_commands", 2)
            _, samples = fk.parse_prometheus(self.api.get("/metrics")[2])
            self.assertEqual(fk.prom_value(samples, "twice_pending", listener="jobs",
                                           kind="scheduled_commands"), 2)
            self.assertEqual(real.lrange("p", 0, -1), [r.encode(), a.encode()])
            st, body = self.drain("60s")
            self.assertEqual(st, 200, body)
            self.assertEqual(body["pending"]["total"], 0, body)
            # the scheduled commands went at their time: the ack applied, the copy pushed back
            self.assertGreaterEqual(time.monotonic() - t_acked, 4.5)
            self.assertEqual(real.lrange("p", 0, -1), [])
            self.assertEqual(real.lrange("q", 0, -1), [r.encode()])
            # the held reply was released at once, not 60 s after the pop
            w2.settimeout(20)
            self.assertEqual(w2.read(), held.encode())
        recs = self.records(tw)
        self.assertEqual(sorted((r.get("rule"), r.get("message_id")) for k, r in recs
                                if k == "fault"),
                         [("held-pop", "h1"), ("late-ack", "r1"), ("slow-ack", "a1")])
        self.assertEqual(sorted(r.get("message_id") for k, r in recs if k == "deliver"),
                         ["a1", "h1", "r1"])

    # -- shutdown -------------------------------------------------------------------------

    def test_sigterm_with_nothing_pending_exits_before_the_grace(self):
        aport, rport = h.free_port(), h.free_port()
        tw = self.start([ck.amqp_listen("rabbit", aport, self.rabbit.port),
                         ck.resp_listen("jobs", rport, self.redis.port, profile="list")],
                        grace=GRACE)
        consumer = self.consumer(aport)
        ch = consumer.channel()
        ch.basic_consume("dr-idle", lambda *a: None)
        consumer.process_data_events(time_limit=0.1)
        idle, blocked = rk.Conn(rport), rk.Conn(rport)
        self.addCleanup(idle.close)
        self.addCleanup(blocked.close)
        self.assertEqual(idle.cmd("PING"), b"PONG")
        blocked.send(rk.enc("BLMOVE", "dr-empty", "dr-p", "LEFT", "LEFT", "0"))  # waits for a job
        clients = [idle.addr, blocked.addr]
        h.wait_until(lambda: self.api.json("/stats")["sessions_open"] == 3, WAIT,
                     what="the three sessions open")
        t0 = time.monotonic()
        tw.signal(signal.SIGTERM)
        try:
            rc = tw.proc.wait(EXIT_WITHIN)
        except Exception:
            self.fail("twice still running %.0fs after SIGTERM (grace %s, nothing pending)" % (
                time.monotonic() - t0, GRACE))
        self.assertEqual(rc, 0)
        h.log("twice exited %.1fs after SIGTERM" % (time.monotonic() - t0))
        for rec in tw.wait_sessions(clients, timeout=1).values():
            self.assertEqual(rec["reason"], "shutdown")
        self.assertEqual(len(tw.log_records("session closed", listener="rabbit",
                                            reason="shutdown")), 1)
        self.assertEqual(tw.log_records("grace period over"), [])

    def test_sigterm_releases_a_held_ack_and_waits_for_a_busy_worker(self):
        port = h.free_port()
        tw = self.start([ck.amqp_listen("rabbit", port, self.rabbit.port)],
                        [fk.rule_block("slow-ack", "rabbit", "when ack queue=dr-term",
                                       "do delay 60s")], grace=GRACE)
        self.publish("dr-term", ["t-held"])
        self.publish("dr-busy", ["t-busy"])
        a, b = self.consumer(port), self.consumer(port)
        cha, chb = a.channel(), b.channel()
        m, _, _ = ck.get_one(cha, "dr-term")
        cha.basic_ack(m.delivery_tag)
        self.wait_pending("rabbit", "held_acks", 1)
        busy, _, _ = ck.get_one(chb, "dr-busy")  # b's worker is still at it
        t0 = time.monotonic()
        tw.signal(signal.SIGTERM)
        tw.wait_for_log(r"msg=\"shutting down\"")
        tw.wait_for_log(r"msg=\"faults off\" source=shutdown")
        # a: its held ack went to RabbitMQ, and its session was closed; b: still relayed
        h.wait_until(lambda: len(tw.log_records("session closed", reason="shutdown")) == 1, WAIT,
                     what="the quiet session closed")
        self.assertIsNone(chb.basic_get("dr-term")[0])  # a round trip: b's session is open
        self.assertIsNone(tw.proc.poll())
        chb.basic_ack(busy.delivery_tag)
        try:
            rc = tw.proc.wait(EXIT_WITHIN)
        except Exception:
            self.fail("twice still running %.0fs after SIGTERM and the last ack" % (
                time.monotonic() - t0))
        self.assertEqual(rc, 0)
        self.assertLess(time.monotonic() - t0, 50)
        # had the held ack been lost with the connection, RabbitMQ would have it ready again
        self.assertEqual(ck.queue_counts(self.rabbit).get("dr-term"), (0, 0))
        self.assertEqual(ck.queue_counts(self.rabbit).get("dr-busy"), (0, 0))
        _, recs, _ = fk.decode_journal(self.journal)
        acks = sorted(r.get("message_id") for r in recs if fk.KIND_NAMES.get(r.get("kind")) == "ack")
        self.assertEqual(acks, ["t-busy", "t-held"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
