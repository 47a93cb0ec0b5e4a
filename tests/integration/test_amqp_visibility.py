#!/usr/bin/python3
"""A visibility timeout on RabbitMQ, through `protocol amqp` listeners, with
pika against a real node:

- `visibility-timeout 3s` and `delay 5s` on every other ack: the held acks'
  messages come back redelivered (to whichever consumer asks), no earlier
  than the timeout; the held acks never reach RabbitMQ (no 406, every
  channel stays open); every message is acked in the end and nothing stays
  unacked at the broker; each held ack is one fault of its rule, and its
  requeue an `expired` record naming the rule (a consequence, not a second
  fault): `twice report` counts one fault per decision;
- `drop` on every other ack under the same timeout: the lost acks' messages
  come back the same way, one fault and one `expired` record each;
- a worker slower than the timeout: its message goes to another consumer,
  and the slow worker's late ack is swallowed; the requeue is journaled as
  `expired` with no rule, and no fault;
- `consumer-timeout 2s`: RabbitMQ's own consumer timeout, realised as the
  broker does it: the channel closes with 406 and RabbitMQ's text, every
  delivery unacked on it comes back, another channel of the same connection
  and another connection carry on;
- a copy later than the timeout, as docs/rules.md says to ask for one: `expire 6s` on the
  deliveries and `drop` on their acks, the copy 6 s after the delivery, not at 3 s;
- late copies on purpose: `redeliver after 3s` on acks: the worker's ack
  "succeeds", and the message comes back redelivered no earlier than 3 s
  after it; `duplicate after 3s` on deliveries: a copy goes out no earlier
  than 3 s after the delivery, whether the first worker acked at once (its
  ack is held, then discarded) or later (its late ack is swallowed).  No 406,
  nothing left at the broker, each copy journaled as a fault of its rule.
"""

import json
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
from pika.exceptions import ChannelClosedByBroker  # noqa: E402

WAIT = 60  # seconds a wait may take on a loaded, sanitized run


EXPIRED = 12  # journal.proto's Record.Kind


def journal_expired(path):
    """The journal's EXPIRED records (requeues by a listener's timeout)."""
    try:
        _, recs, _ = fk.decode_journal(path)
    except (OSError, ValueError, EOFError):
        return []
    return [r for r in recs if r.get("kind") == EXPIRED]


def report_json(path):
    r = h.run_twice(["report", path, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.decode())


class VisibilityTest(ck.BrokerCase):
    RABBITMQ = True
    TMP_PREFIX = "twice-it-vt-"

    @classmethod
    def twice_config(cls):
        cls.ports = {n: h.free_port() for n in ("vt", "ct", "late")}
        cls.journal = os.path.join(cls.ctmp, "journal.pb")
        rules = """rule slow-ack on vt {
  when ack queue=vt-held
  every 2
  do delay 5s
}
rule late-window on vt {
  when deliver queue=vt-late
  do expire 6s
}
rule late-lost on vt {
  when ack queue=vt-late
  do drop
}
rule lost-ack on vt {
  when ack queue=vt-drop
  every 2
  do drop
}
rule late-ack on late {
  when ack queue=late-ack
  do redeliver after 3s
}
rule late-dup on late {
  when deliver queue=late-dup
  do duplicate after 3s
}
"""
        return ("journal %s\n" % cls.journal +
                h.config(ck.amqp_listen("vt", cls.ports["vt"], cls.rabbit.port,
                                        "visibility-timeout 3s"),
                         ck.amqp_listen("ct", cls.ports["ct"], cls.rabbit.port,
                                        "consumer-timeout 2s"),
                         ck.amqp_listen("late", cls.ports["late"], cls.rabbit.port),
                         log_level="info") + rules)

    @classmethod
    def set_up_class(cls):
        ck.declare_queues(cls.rabbit.port, "vt-held", "vt-drop", "vt-slow", "vt-late", "ct-q",
                          "ct-other", "late-ack", "late-dup")

    def publish(self, queue, ids):
        c = ck.pika_conn(self.rabbit.port)
        ch = c.channel()
        for i in ids:
            ch.basic_publish("", queue, i.encode(), pika.BasicProperties(message_id=i))
        c.close()

    def ready(self, queue):
        c = ck.pika_conn(self.rabbit.port)
        n = c.channel().queue_declare(queue, passive=True).method.message_count
        c.close()
        return n

    def test_acks_held_past_the_timeout_come_back(self):
        ids = ["held-%d" % i for i in range(6)]
        self.publish("vt-held", ids)
        a, b = ck.pika_conn(self.ports["vt"]), ck.pika_conn(self.ports["vt"])
        cha, chb = a.channel(), b.channel()
        first = {}
        for _ in ids:  # A takes every message and acks it at once
            m, props, _ = ck.get_one(cha, "vt-held")
            self.assertFalse(m.redelivered)
            first[props.message_id] = time.monotonic()
            cha.basic_ack(m.delivery_tag)
        # every other ack is held for 5 s, past the 3 s timeout: those
        # messages come back, to B
        again = {}
        while len(again) < len(ids) // 2:
            m, props, _ = ck.get_one(chb, "vt-held")
            self.assertTrue(m.redelivered, props.message_id)
            self.assertNotIn(props.message_id, again)
            again[props.message_id] = time.monotonic()
            chb.basic_ack(m.delivery_tag)
        for mid, at in again.items():
            self.assertGreaterEqual(at - first[mid], 2.8, "%s back too early" % mid)
        # the held acks never reach RabbitMQ: no 406 once they are due
        h.wait_until(lambda: self.tw.log_text().count("rule=slow-ack timeout=visibility-timeout")
                     >= len(again), WAIT, what="the requeues logged")
        self.assert_one_fault_each("slow-ack", "delay", again)
        a.process_data_events(time_limit=max(0.5, max(first.values()) + 5.5 - time.monotonic()))
        self.assertTrue(cha.is_open and chb.is_open)
        self.assertIsNone(cha.basic_get("vt-held")[0])
        a.close()
        b.close()
        self.assertEqual(self.ready("vt-held"), 0)  # nothing was left unacked

    def test_late_copy_past_the_visibility_timeout(self):
        """The recipe of docs/rules.md for a copy later than the listener's 3 s timeout, which
        refuses `redeliver after 6s`: `expire 6s` on the deliveries, `drop` on their acks.  The
        worker's ack is lost, and the message comes back 6 s after its delivery, not at 3 s;
        its copy is acked for good."""
        self.publish("vt-late", ["vl-1"])
        a, b = ck.pika_conn(self.ports["vt"]), ck.pika_conn(self.ports["vt"])
        cha, chb = a.channel(), b.channel()
        m, _, _ = ck.get_one(cha, "vt-late")
        t0 = time.monotonic()
        cha.basic_ack(m.delivery_tag)  # "succeeds"; twice drops it
        m2, props, _ = ck.get_one(chb, "vt-late")
        self.assertGreaterEqual(time.monotonic() - t0, 5.8, "the copy came before the expire")
        self.assertEqual((m2.redelivered, props.message_id), (True, "vl-1"))
        chb.basic_ack(m2.delivery_tag)  # neither rule faults the copy (max-per-message)
        self.assertIsNone(chb.basic_get("vt-late")[0])  # a round trip: the ack went through
        self.assertTrue(cha.is_open and chb.is_open)
        for rule in ("late-window", "late-lost"):
            faults = rk.wait_journal_faults(self.journal, rule, 1, timeout=WAIT)
            self.assertEqual([r.get("message_id") for r in faults], ["vl-1"], rule)
        a.close()
        b.close()
        self.assertEqual(self.ready("vt-late"), 0)
        # the form it replaces is refused, and the refusal points at it
        rc, errs = rk.check_config(self.tw.conf_text + "rule r on vt {\n  when ack\n"
                                   "  do redeliver after 6s\n}\n", self.tmp)
        self.assertEqual(rc, 1)
        self.assertIn("'redeliver after 6s' cannot happen at that time: listener 'vt' has a "
                      "visibility-timeout of 3s", errs[0])
        self.assertIn("for a copy 6s after the delivery, 'do expire 6s' on these deliveries "
                      "with 'do drop' on their acks", errs[0])

    def assert_one_fault_each(self, rule, action, again):
        """One fault of `rule` per held or dropped ack, and one `expired` record naming it per
        requeue its visibility timeout made: `twice report` counts the decisions only."""
        ids = sorted(again)
        h.wait_until(lambda: len([r for r in journal_expired(self.journal)
                                  if r.get("rule") == rule]) >= len(ids), WAIT,
                     what="the journal's expired records of %s" % rule)
        faults = rk.journal_faults(self.journal, rule)
        self.assertEqual(sorted(r.get("message_id") for r in faults), ids)
        expired = [r for r in journal_expired(self.journal) if r.get("rule") == rule]
        self.assertEqual(sorted(r.get("message_id") for r in expired), ids)
        rep = report_json(self.journal)
        row = [r for r in rep["faults"] if r["rule"] == rule]
        self.assertEqual([(r["faults"], r["action"]) for r in row], [(len(ids), action)], rep)
        self.assertIn({"rule": rule, "expired": len(ids)}, rep["expired"])

    def test_dropped_acks_come_back_once_faulted(self):
        ids = ["drop-%d" % i for i in range(6)]
        self.publish("vt-drop", ids)
        a, b = ck.pika_conn(self.ports["vt"]), ck.pika_conn(self.ports["vt"])
        cha, chb = a.channel(), b.channel()
        first = {}
        for _ in ids:
            m, props, _ = ck.get_one(cha, "vt-drop")
            first[props.message_id] = time.monotonic()
            cha.basic_ack(m.delivery_tag)
        again = {}
        while len(again) < len(ids) // 2:  # every other ack was lost: back after 3 s
            m, props, _ = ck.get_one(chb, "vt-drop")
            self.assertTrue(m.redelivered, props.message_id)
            self.assertNotIn(props.message_id, again)
            again[props.message_id] = time.monotonic()
            chb.basic_ack(m.delivery_tag)
        for mid, at in again.items():
            self.assertGreaterEqual(at - first[mid], 2.8, "%s back too early" % mid)
        self.assert_one_fault_each("lost-ack", "drop", again)
        self.assertIsNone(cha.basic_get("vt-drop")[0])
        self.assertTrue(cha.is_open and chb.is_open)
        a.close()
        b.close()
        self.assertEqual(self.ready("vt-drop"), 0)

    def test_slow_worker_loses_its_message(self):
        self.publish("vt-slow", ["slow-1"])
        a, b = ck.pika_conn(self.ports["vt"]), ck.pika_conn(self.ports["vt"])
        cha, chb = a.channel(), b.channel()
        m, _, _ = ck.get_one(cha, "vt-slow")
        t0 = time.monotonic()
        m2, props, _ = ck.get_one(chb, "vt-slow")  # A never acked within 3 s
        self.assertGreaterEqual(time.monotonic() - t0, 2.8)
        self.assertTrue(m2.redelivered)
        self.assertEqual(props.message_id, "slow-1")
        cha.basic_ack(m.delivery_tag)  # late: swallowed
        chb.basic_ack(m2.delivery_tag)
        # journaled as a requeue by the listener's timeout, of no rule: no fault
        h.wait_until(lambda: [r for r in journal_expired(self.journal)
                              if r.get("message_id") == "slow-1"], WAIT,
                     what="slow-1's expired record")
        self.assertEqual([r.get("rule", "") for r in journal_expired(self.journal)
                          if r.get("message_id") == "slow-1"], [""])
        self.assertEqual([r for r in rk.journal_faults(self.journal)
                          if r.get("message_id") == "slow-1"], [])
        self.assertIsNone(cha.basic_get("vt-slow")[0])  # a round trip: A's channel is open
        self.assertTrue(cha.is_open and chb.is_open)
        a.close()
        b.close()
        self.assertEqual(self.ready("vt-slow"), 0)

    def test_consumer_timeout_closes_the_channel(self):
        self.publish("ct-q", ["ct-1", "ct-2", "ct-3"])
        self.publish("ct-other", ["other-1"])
        a, b = ck.pika_conn(self.ports["ct"]), ck.pika_conn(self.ports["ct"])
        cha, side = a.channel(), a.channel()
        got = [ck.get_one(cha, "ct-q") for _ in range(3)]
        cha.basic_ack(got[0][0].delivery_tag)
        # the other channel acks within the timeout, again and again
        m, _, _ = ck.get_one(side, "ct-other")
        side.basic_ack(m.delivery_tag)
        closed = []
        cha._impl.add_on_close_callback(lambda _ch, reason: closed.append(reason))
        h.wait_until(lambda: a.process_data_events(time_limit=0.05) or closed, WAIT,
                     what="the consumer timeout's channel.close")
        self.assertIsInstance(closed[0], ChannelClosedByBroker)
        self.assertEqual(closed[0].reply_code, 406)
        self.assertEqual(closed[0].reply_text,
                         "PRECONDITION_FAILED - delivery acknowledgement on channel %d timed out. "
                         "Timeout value used: 2000 ms. This timeout value can be configured, see "
                         "consumers doc guide to learn more" % cha.channel_number)
        # both unacked deliveries come back, to another connection
        chb = b.channel()
        back = [ck.get_one(chb, "ct-q") for _ in range(2)]
        self.assertEqual(sorted(p.message_id for _, p, _ in back), ["ct-2", "ct-3"])
        self.assertTrue(all(m.redelivered for m, _, _ in back))
        for m, _, _ in back:
            chb.basic_ack(m.delivery_tag)
        # ... whose channel is not closed by them while it acks in time
        self.publish("ct-other", ["other-2"])
        m, props, _ = ck.get_one(side, "ct-other")
        self.assertEqual(props.message_id, "other-2")
        side.basic_ack(m.delivery_tag)
        self.assertTrue(side.is_open and a.is_open)
        a.close()
        b.close()
        self.assertEqual(self.ready("ct-q"), 0)

    def test_redeliver_after_brings_the_message_back_later(self):
        ids = ["la-1", "la-2"]
        self.publish("late-ack", ids)
        a, b = ck.pika_conn(self.ports["late"]), ck.pika_conn(self.ports["late"])
        cha, chb = a.channel(), b.channel()
        acked = {}
        for _ in ids:
            m, props, _ = ck.get_one(cha, "late-ack")
            self.assertFalse(m.redelivered)
            cha.basic_ack(m.delivery_tag)  # "succeeds": nothing tells the worker otherwise
            acked[props.message_id] = time.monotonic()
        self.assertIsNone(cha.basic_get("late-ack")[0])  # a round trip: channel open
        back = {}
        while len(back) < len(ids):
            m, props, _ = ck.get_one(chb, "late-ack")
            self.assertTrue(m.redelivered, props.message_id)
            back[props.message_id] = time.monotonic()
            chb.basic_ack(m.delivery_tag)  # the copy is not faulted again (max-per-message)
        for mid in ids:
            self.assertGreaterEqual(back[mid] - acked[mid], 2.9, "%s came back too early" % mid)
        faults = rk.wait_journal_faults(self.journal, "late-ack", len(ids), timeout=WAIT)
        self.assertEqual(sorted(r.get("message_id") for r in faults), ids)
        late = [l for l in self.tw.log_text().splitlines()
                if 'msg="late copy"' in l and "action=redeliver" in l]
        self.assertEqual(len(late), 2, late)
        self.assertIsNone(chb.basic_get("late-ack")[0])
        self.assertTrue(cha.is_open and chb.is_open)
        a.close()
        b.close()
        self.assertEqual(self.ready("late-ack"), 0)

    def test_duplicate_after_copies_later(self):
        self.publish("late-dup", ["ld-fast"])
        a, b = ck.pika_conn(self.ports["late"]), ck.pika_conn(self.ports["late"])
        cha, chb = a.channel(), b.channel()
        # A acks at once: the ack is held until the copy, then discarded
        m, props, _ = ck.get_one(cha, "late-dup")
        t0 = time.monotonic()
        cha.basic_ack(m.delivery_tag)
        m2, props2, _ = ck.get_one(chb, "late-dup")
        self.assertGreaterEqual(time.monotonic() - t0, 2.9)
        self.assertTrue(m2.redelivered)
        self.assertEqual(props2.message_id, "ld-fast")
        chb.basic_ack(m2.delivery_tag)
        # A acks after the copy went out: its late ack is swallowed (no 406)
        self.publish("late-dup", ["ld-slow"])
        m, _, _ = ck.get_one(cha, "late-dup")
        t0 = time.monotonic()
        m2, props2, _ = ck.get_one(chb, "late-dup")
        self.assertGreaterEqual(time.monotonic() - t0, 2.9)
        self.assertEqual((m2.redelivered, props2.message_id), (True, "ld-slow"))
        cha.basic_ack(m.delivery_tag)
        chb.basic_ack(m2.delivery_tag)
        self.assertIsNone(cha.basic_get("late-dup")[0])  # a round trip: A's channel is open
        self.assertTrue(cha.is_open and chb.is_open)
        faults = rk.wait_journal_faults(self.journal, "late-dup", 2, timeout=WAIT)
        self.assertEqual(sorted(r.get("message_id") for r in faults), ["ld-fast", "ld-slow"])
        a.close()
        b.close()
        self.assertEqual(self.ready("late-dup"), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
