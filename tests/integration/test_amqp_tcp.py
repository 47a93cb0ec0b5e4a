#!/usr/bin/python3
"""A real RabbitMQ behind a `protocol tcp` listener.

The same pika scenario runs once directly against the broker and once
through twice; what the client observes (bodies by sha256, redelivered
flags, counts, confirm outcomes) must be identical, and must also be what
AMQP says it should be.  The scenario covers bodies of 0 B, 1 B, 1 KiB,
128 KiB (more than frame_max: several body frames) and 4 MiB, manual acks
with one nack/requeue and one reject, basic.get, publisher confirms
(including an unroutable mandatory message) and a transaction with a
rollback and a commit.
"""

import hashlib
import os
import random
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import clientkit as ck  # noqa: E402

import pika  # noqa: E402
from pika.exceptions import UnroutableError  # noqa: E402

SIZES = [0, 1, 1024, 128 * 1024, 4 * h.MiB]
NACKED = 1      # index of the message nacked (requeue) on first delivery
REJECTED = 2    # index of the message rejected (no requeue)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def bodies():
    rng = random.Random(5672)
    return [rng.randbytes(n) for n in SIZES]


def scenario(port, tag):
    """Run the whole AMQP scenario against 127.0.0.1:port; returns what was observed."""
    conn = ck.pika_conn(port)
    obs = {}
    try:
        ch = conn.channel()
        q = "twice-it-%s" % tag
        ch.queue_declare(q, exclusive=True)
        msgs = bodies()

        # 1. publish, consume with manual acks, one nack+requeue, one reject
        for i, b in enumerate(msgs):
            ch.basic_publish("", q, b, pika.BasicProperties(message_id=str(i), content_type="application/octet-stream"))
        ch.basic_qos(prefetch_count=1)
        deliveries = []
        seen_nack = False
        expected = len(msgs) + 1     # one redelivery
        for method, props, body in ch.consume(q, auto_ack=False, inactivity_timeout=30):
            if method is None:
                break
            idx = int(props.message_id)
            rec = {"id": idx, "len": len(body), "sha": sha(body), "redelivered": method.redelivered,
                   "content_type": props.content_type}
            if idx == NACKED and not seen_nack:
                seen_nack = True
                ch.basic_nack(method.delivery_tag, requeue=True)
                rec["action"] = "nack-requeue"
            elif idx == REJECTED:
                ch.basic_reject(method.delivery_tag, requeue=False)
                rec["action"] = "reject"
            else:
                ch.basic_ack(method.delivery_tag)
                rec["action"] = "ack"
            deliveries.append(rec)
            if len(deliveries) == expected:
                break
        ch.cancel()
        obs["deliveries"] = deliveries
        obs["left_after_consume"] = ch.queue_declare(q, passive=True).method.message_count

        # 2. basic.get
        for i, b in enumerate(msgs[:3]):
            ch.basic_publish("", q, b, pika.BasicProperties(message_id="get-%d" % i))
        gets = []
        for _ in range(4):
            method, props, body = ch.basic_get(q, auto_ack=False)
            if method is None:
                gets.append(None)
                continue
            gets.append({"id": props.message_id, "sha": sha(body), "remaining": method.message_count,
                         "redelivered": method.redelivered})
            ch.basic_ack(method.delivery_tag)
        obs["gets"] = gets

        # 3. publisher confirms
        ch.confirm_delivery()
        confirmed = 0
        for i in range(50):
            ch.basic_publish("", q, msgs[i % len(msgs)], pika.BasicProperties(message_id="c-%d" % i),
                             mandatory=True)
            confirmed += 1
        try:
            ch.basic_publish("", q + "-nobody", b"lost", mandatory=True)
            obs["unroutable"] = "published"
        except UnroutableError as e:
            obs["unroutable"] = "returned %d" % len(e.messages)
        obs["confirmed"] = confirmed
        obs["after_confirms"] = ch.queue_declare(q, passive=True).method.message_count
        obs["purged"] = ch.queue_purge(q).method.message_count
        ch.close()

        # 4. a transaction: rolled back, then committed
        tx = conn.channel()
        tx.tx_select()
        for i in range(3):
            tx.basic_publish("", q, b"rolled back %d" % i)
        tx.tx_rollback()
        obs["after_rollback"] = tx.queue_declare(q, passive=True).method.message_count
        tx.basic_publish("", q, msgs[3], pika.BasicProperties(message_id="tx-0"))
        tx.basic_publish("", q, msgs[4], pika.BasicProperties(message_id="tx-1"))
        tx.tx_commit()
        obs["after_commit"] = tx.queue_declare(q, passive=True).method.message_count
        committed = []
        for _ in range(2):
            method, props, body = tx.basic_get(q, auto_ack=True)
            committed.append((props.message_id, sha(body)) if method else None)
        tx.tx_commit()
        obs["committed"] = committed
        tx.close()
    finally:
        if conn.is_open:
            conn.close()
    return obs


class AmqpTcpTest(ck.BrokerCase):
    RABBITMQ = True
    TMP_PREFIX = "twice-it-amqp-"

    @classmethod
    def twice_config(cls):
        cls.port = h.free_port()
        return h.config(ck.listen("amqp", cls.port, cls.rabbit.port), log_level="info")

    def test_scenario_identical(self):
        direct = scenario(self.rabbit.port, "direct")
        mark = len(self.tw.log_lines())
        try:
            via = scenario(self.port, "via-twice")
        except Exception as e:
            self.fail("AMQP scenario through twice failed: %r\n--- twice log ---\n%s" % (e, self.tw.log_tail(30)))

        # The reference run is what AMQP promises.
        msgs = bodies()
        d = direct["deliveries"]
        self.assertEqual([r["id"] for r in d], [0, 1, 1, 2, 3, 4])
        self.assertEqual([r["redelivered"] for r in d], [False, False, True, False, False, False])
        self.assertEqual([r["sha"] for r in d], [sha(msgs[i]) for i in (0, 1, 1, 2, 3, 4)])
        self.assertEqual(direct["left_after_consume"], 0)
        self.assertEqual([g["remaining"] if g else None for g in direct["gets"]], [2, 1, 0, None])
        self.assertEqual(direct["unroutable"], "returned 1")
        self.assertEqual(direct["after_confirms"], 50)
        self.assertEqual(direct["purged"], 50)
        self.assertEqual(direct["after_rollback"], 0)
        self.assertEqual(direct["after_commit"], 2)
        self.assertEqual(direct["committed"], [("tx-0", sha(msgs[3])), ("tx-1", sha(msgs[4]))])

        # Through twice, the client sees exactly the same.
        for key in direct:
            self.assertEqual(via.get(key), direct[key], "AMQP observation %r differs through twice" % key)
        self.assertEqual(via, direct)

        # The session is accounted: more than the bodies went up and down.
        def recs():
            lines = self.tw.log_lines()[mark:]
            rs = [h.parse_logfmt(l) for l in lines if 'msg="session closed"' in l]
            return [r for r in rs if r.get("listener") == "amqp" and int(r.get("bytes_up", "0")) > 0]
        h.wait_until(recs, 60, what="session closed line for the AMQP connection")
        rec = recs()[0]
        payload = sum(SIZES)
        # up: 5 bodies + 3 for basic.get + 50 confirmed + 2 committed (>= 51 * 128 KiB + 4 MiB...)
        self.assertGreater(int(rec["bytes_up"]), 2 * payload, rec)
        self.assertGreater(int(rec["bytes_down"]), payload, rec)
        h.log("AMQP session through twice: %s" % {k: rec.get(k) for k in ("bytes_up", "bytes_down", "reason")})

    def test_many_connections_and_channels(self):
        """Ten connections with three channels each, publishing and consuming
        at the same time through twice."""
        errors = []
        counts = []

        def worker(k):
            try:
                conn = ck.pika_conn(self.port)
                try:
                    got = 0
                    for c in range(3):
                        ch = conn.channel()
                        q = ch.queue_declare("", exclusive=True).method.queue
                        for i in range(20):
                            ch.basic_publish("", q, b"%d-%d-%d" % (k, c, i) * 100)
                        for method, props, body in ch.consume(q, auto_ack=True, inactivity_timeout=20):
                            if method is None:
                                break
                            got += 1
                            if got % 20 == 0:
                                break
                        ch.cancel()
                        ch.close()
                    counts.append(got)
                finally:
                    conn.close()
            except Exception as e:  # noqa
                errors.append(repr(e))

        ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(counts), [60] * 10)


if __name__ == "__main__":
    unittest.main(verbosity=2)
