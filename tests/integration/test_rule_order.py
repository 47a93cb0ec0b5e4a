#!/usr/bin/python3
"""Several rules on one event: one acts, the first in the file that fires, on every protocol.

- RabbitMQ (`protocol amqp`, pika): `lost` (redeliver) and then `dropped` (drop), both on the
  acks of queue `order`.  The worker's ack is turned into a requeue: the message comes back at
  once, on the same open channel, and its copy's ack settles it (nothing left at the broker).
  `dropped` never saw the ack: no fault of it in the log or the journal, `seen` 0 in
  GET /rules.  Before, both acted on the ack: the drop won (the message stayed unacked until the
  channel closed) and both were journaled as faults.  At start, the log warns that `dropped`
  never acts on what it shares with `lost`, naming both and where they are.
- Redis (`protocol resp`): `refused` (first 1, error LOADING) and then `readonly` (error
  READONLY), both on `INCR hits`.  The first INCR is answered LOADING, the second READONLY;
  Redis never got either; each rule saw what it faulted.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import respkit as rk  # noqa: E402
import clientkit as ck  # noqa: E402

import pika  # noqa: E402


class RuleOrder(h.TestCase):
    def start(self, listener, rules):
        """twice with one listener, an admin API and a journal; (twice, admin, journal)."""
        admin = h.free_port()
        journal = os.path.join(self.tmp, "journal.pb")
        tw = self.twice(fk.conf_text([listener], rules, seed=1, admin_port=admin,
                                     journal=journal, log_level="info"))
        fk.wait_admin(admin)
        return tw, fk.Admin(admin), journal

    def test_amqp_first_rule_acts(self):
        rabbit = h.start_rabbitmq(self.tmp)
        self.addCleanup(rabbit.stop)
        port = h.free_port()
        listener = ck.amqp_listen("a", port, rabbit.port)
        tw, api, journal = self.start(listener, [
            fk.rule_block("lost", "a", "when ack queue=order redelivered=false", "do redeliver"),
            fk.rule_block("dropped", "a", "when ack queue=order redelivered=false", "do drop"),
        ])
        # the start says which rule will not act, and where both are
        lost_line = tw.conf_text.splitlines().index("rule lost on a {") + 1
        warned = tw.log_records("config", level="warn")
        self.assertEqual(len(warned), 1, tw.log_text())
        self.assertTrue(warned[0]["at"].startswith("%s:%d:1" % (
            tw.conf_path, lost_line + 4)), warned[0])
        self.assertIn("rule 'dropped' never acts on the 'ack' events it shares with rule 'lost' "
                      "(%s:%d)" % (tw.conf_path, lost_line), warned[0]["problem"])

        direct = ck.pika_conn(rabbit.port)
        direct.channel().queue_declare("order", durable=False)
        direct.channel().basic_publish("", "order", b"charge",
                                       pika.BasicProperties(message_id="order-1"))
        c = ck.pika_conn(port)
        ch = c.channel()
        m, props, _ = ck.get_one(ch, "order")
        self.assertFalse(m.redelivered)
        ch.basic_ack(m.delivery_tag)
        # `lost` turned the ack into a requeue: the message is back at once, on this channel
        m, props, _ = ck.get_one(ch, "order")
        self.assertTrue(m.redelivered)
        self.assertEqual(props.message_id, "order-1")
        ch.basic_ack(m.delivery_tag)  # the copy's ack: neither rule (redelivered=false)
        self.assertIsNone(ch.basic_get("order")[0])  # a round trip: the ack has gone through
        c.close()
        self.assertEqual(direct.channel().queue_declare("order", passive=True)
                         .method.message_count, 0)
        direct.close()

        stats = {r["name"]: (r["seen"], r["faults"]) for r in api.json("/rules")["rules"]}
        self.assertEqual(stats, {"lost": (1, 1), "dropped": (0, 0)})
        self.assertEqual([r["rule"] for r in fk.fault_records(tw)], ["lost"])
        tw.stop()
        self.assertEqual([r.get("rule") for r in rk.journal_faults(journal)], ["lost"])

    def test_resp_first_rule_acts(self):
        redis = h.start_redis(self.tmp)
        self.addCleanup(redis.stop)
        port = h.free_port()
        tw, api, _ = self.start(rk.resp_listen_block("r", port, redis.port), [
            fk.rule_block("refused", "r", "when command command=INCR key=hits", "first 1",
                          "do error LOADING"),
            fk.rule_block("readonly", "r", "when command command=INCR key=hits",
                          "do error READONLY"),
        ])
        self.assertEqual(tw.log_records("config"), [])  # `refused` leaves events: no warning
        with rk.Conn(port) as c:
            first, second = c.cmd("INCR", "hits"), c.cmd("INCR", "hits")
            self.assertIsInstance(first, rk.Err)
            self.assertEqual(first.code, b"LOADING")
            self.assertIsInstance(second, rk.Err)
            self.assertEqual(second.code, b"READONLY")
        self.assertIsNone(redis.command("GET", "hits"))  # neither reached Redis
        stats = {r["name"]: (r["seen"], r["faults"]) for r in api.json("/rules")["rules"]}
        self.assertEqual(stats, {"refused": (2, 1), "readonly": (1, 1)})
        self.assertEqual(sorted(r["rule"] for r in fk.fault_records(tw)), ["readonly", "refused"])


if __name__ == "__main__":
    unittest.main()
