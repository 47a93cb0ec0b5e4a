"""Limits of the amqp layer that a user would hit under load.

- Delayed deliveries are held in memory; past AMQP_PX_HELD_MAX (64 MiB) per
  direction twice stops reading from the broker until some are released, so
  a long `delay` on a consumer with unlimited prefetch costs bounded memory
  and loses nothing: every message still arrives, intact and in order.
"""

import hashlib
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402

import pika  # noqa: E402

N_MESSAGES = 200
BODY = 1024 * 1024  # 200 MiB in all: three times what twice may hold


class HeldMemoryTest(h.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rabbit = h.start_rabbitmq(h.make_tmpdir("twice-it-amqplim-rabbit-"))

    @classmethod
    def tearDownClass(cls):
        cls.rabbit.stop()

    def test_delayed_deliveries_bounded_and_complete(self):
        port = h.free_port()
        listen = h.listen_block("rabbit", port, self.rabbit.port).replace(
            "protocol tcp", "protocol amqp")
        conf = fk.conf_text([listen], [fk.rule_block("hold", "rabbit", "when deliver queue=big",
                                                     "do delay 3s", "max-per-message 1")])
        t = self.twice(conf)
        params = pika.ConnectionParameters("127.0.0.1", self.rabbit.port)
        pub = pika.BlockingConnection(params)
        ch = pub.channel()
        ch.queue_declare("big")
        ch.queue_purge("big")
        bodies = []
        for i in range(N_MESSAGES):
            body = os.urandom(16) * (BODY // 16)
            bodies.append(hashlib.sha256(body).hexdigest())
            ch.basic_publish("", "big", body, pika.BasicProperties(message_id="b%d" % i))
        pub.close()

        con = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
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


if __name__ == "__main__":
    unittest.main()
