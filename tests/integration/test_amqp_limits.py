"""Limits of the amqp layer that a user would hit under load.

- Delayed deliveries are held in memory; past AMQP_PX_HELD_MAX (64 MiB) per
  direction twice stops reading from the broker until some are released, so
  a long `delay` on a consumer with unlimited prefetch costs bounded memory
  and loses nothing: every message still arrives, intact and in order.
- Acks twice holds when `shutdown-grace` runs out (a `delay` on acks, a late
  copy's `redeliver after D`) are dropped with their connection, and said so:
  one line per channel naming the delivery tags and the rules that held them,
  as a Redis listener names the commands it had scheduled; RabbitMQ puts the
  messages back in their queue, so nothing is lost.
"""

import hashlib
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import clientkit as ck  # noqa: E402

import pika  # noqa: E402

N_MESSAGES = 200
BODY = 1024 * 1024  # 200 MiB in all: three times what twice may hold


class HeldMemoryTest(ck.BrokerCase):
    RABBITMQ = True
    TMP_PREFIX = "twice-it-amqplim-rabbit-"

    def test_delayed_deliveries_bounded_and_complete(self):
        port = h.free_port()
        listen = ck.amqp_listen("rabbit", port, self.rabbit.port)
        conf = fk.conf_text([listen], [fk.rule_block("hold", "rabbit", "when deliver queue=big",
                                                     "do delay 3s", "max-per-message 1")])
        t = self.twice(conf)
        pub = ck.pika_conn(self.rabbit.port)
        ch = pub.channel()
        ch.queue_declare("big")
        ch.queue_purge("big")
        bodies = []
        for i in range(N_MESSAGES):
            body = os.urandom(16) * (BODY // 16)
            bodies.append(hashlib.sha256(body).hexdigest())
            ch.basic_publish("", "big", body, pika.BasicProperties(message_id="b%d" % i))
        pub.close()

        con = ck.pika_conn(port)
        cch = con.channel()
        cch.basic_qos(prefetch_count=0)  # unlimited: the broker sends everything at once
        got, peak = [], 0
        deadline = time.monotonic() + 120
        for m, p, b in cch.consume("big", inactivity_timeout=1):
            peak = max(peak, t.rss_kib())
            if m is not None:
                got.append((p.message_id, hashlib.sha256(b).hexdigest()))
                cch.basic_ack(m.delivery_tag)
            if len(got) == N_MESSAGES or time.monotonic() > deadline:
                break
        cch.cancel()
        con.close()
        self.assertEqual([g[0] for g in got], ["b%d" % i for i in range(N_MESSAGES)])
        self.assertEqual([g[1] for g in got], bodies)
        # 64 MiB held at most, plus the frames in flight and the allocator.
        h.log("twice peak RSS %d KiB while holding delayed deliveries" % peak)
        self.assertLess(peak, h.rss_limit(160 * 1024), "twice RSS while holding delayed deliveries")

    def test_held_acks_dropped_at_shutdown_are_logged(self):
        port = h.free_port()
        listen = ck.amqp_listen("rabbit", port, self.rabbit.port)
        conf = fk.conf_text([listen], [
            fk.rule_block("hold-ack", "rabbit", "when ack queue=sd-hold", "do delay 10m"),
            fk.rule_block("late-ack", "rabbit", "when ack queue=sd-late", "do redeliver after 10m"),
        ], grace="1s", log_level="info")
        t = self.twice(conf)
        direct = ck.pika_conn(self.rabbit.port)
        self.addCleanup(direct.close)
        dch = direct.channel()
        for q, n in (("sd-hold", 1), ("sd-late", 3)):
            dch.queue_declare(q)
            dch.queue_purge(q)
            for i in range(n):
                dch.basic_publish("", q, b"x", pika.BasicProperties(message_id="%s-%d" % (q, i)))
        con = ck.pika_conn(port)
        self.addCleanup(ck.close_quietly, con)
        for q, n in (("sd-hold", 1), ("sd-late", 3)):
            ch = con.channel()
            for _ in range(n):
                m = h.wait_until(lambda: ch.basic_get(q, auto_ack=False)[0], 60,
                                 what="a message of %s" % q)
                ch.basic_ack(m.delivery_tag)
            con.process_data_events(time_limit=0)
        t.wait_for_records("fault", rule="hold-ack", count=1)
        t.wait_for_records("fault", rule="late-ack", count=3)
        # The consumer stays connected: the shutdown's drain sends the ack a rule only delays,
        # the grace runs out with the late copy's acks held.
        t.stop()
        lines = t.log_records("shutdown drops commands twice had scheduled")
        got = sorted((r["channel"], r["commands"], r["delivery_tags"], r["rules"]) for r in lines)
        self.assertEqual(got, [("2", "3", "1,2,3", "late-ack")], lines)
        self.assertEqual({r["listener"] for r in lines}, {"rabbit"})
        self.assertEqual({r["level"] for r in lines}, {"warn"})
        # Nothing lost: the delayed ack reached RabbitMQ, and the connection's close gave the
        # messages whose acks were dropped back to their queue.
        for q, n in (("sd-hold", 0), ("sd-late", 3)):
            h.wait_until(lambda: dch.queue_declare(q, passive=True).method.message_count == n, 60,
                         what="%d messages back in %s" % (n, q))


if __name__ == "__main__":
    unittest.main()
