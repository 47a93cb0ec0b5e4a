#!/usr/bin/python3
"""Toxiproxy's npm client (toxiproxy-node-client, tests/node) drives twice's Toxiproxy API in
front of a real Redis and a real RabbitMQ, and the broker's clients see what Toxiproxy's
README says each toxic does.

One twice runs with `toxiproxy-api` and no listen block.  Each test runs one scenario of
tests/node/toxiproxy_client.js, which creates its proxy through the client, opens connections
(most of them BEFORE adding the toxic: Toxiproxy adds a toxic to the open connections too),
adds and removes toxics, and measures on raw sockets (Redis) or with amqplib (RabbitMQ):

- api: the client's calls answer as Toxiproxy's do (version, create, get, list, toxics, update,
  409 for a second proxy or toxic of the same name, 400 for an unknown type, populate, remove,
  404 and a refused connection after it);
- latency: 300 ms downstream adds >= 300 ms to a PING on an open connection; 100±50 upstream
  more on top; removing both brings the round trip back under 150 ms;
- bandwidth: a 300 KB GET at 100 KB/s (1 KB = 1000 bytes, Toxiproxy's unit) takes 3 s, bytes
  equal; removed, the same GET is fast;
- slicer: a 3 KB reply (3009 bytes, one read) at average 100, variation 20 is halved five
  times, as Toxiproxy's slicer does: about 32 pieces of 70 to 120 bytes, 10 ms apart, bytes
  equal;
- limit_data: exactly 20 bytes of the reply, the first 20, then the connection closes;
- timeout 0: no reply, the connection stays open; removing the toxic closes it (Toxiproxy's);
- timeout 400: no reply, closed about 400 ms after the data;
- reset_peer 300: a TCP reset (ECONNRESET) about 300 ms after the data;
- slow_close 500: the reply at once, the end of stream 500 ms later;
- down (enabled false): the open connection closes, a new one is refused; enabled again, PING;
- toxicity: 0 spares five connections, updated to 1 every one of them gets the latency;
- reset: toxics gone (the open connection fast again), every proxy enabled;
- reload (SIGHUP) keeps the proxies, their toxics and their open connections (a Python check);
- an admin API rule on a proxy (`PUT /rules/NAME ... on PROXY`) adds to its toxics (Python);
- toxiproxy-config: a second twice reads Toxiproxy's start-up JSON and serves its proxies, the
  disabled one refusing (a Python check);
- rabbit: amqplib's handshake through a proxy with 200 ms latency takes >= 600 ms (three
  broker frames), a message still goes through; limit_data 100 cuts the broker's first frame
  at 100 bytes; a disabled proxy refuses amqplib.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import clientkit as ck  # noqa: E402

# Timers count whole milliseconds, and the test's clock is not twice's: a delay of D may be
# measured a few milliseconds short.
SLACK_MS = 10

NODE_DIR = os.path.join(h.SOURCE_DIR, "tests", "node")
SCRIPT = os.path.join(NODE_DIR, "toxiproxy_client.js")


class ToxiproxyClient(ck.BrokerCase):
    REDIS = True
    TMP_PREFIX = "twice-it-toxiclient-"

    @classmethod
    def setUpClass(cls):
        if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "toxiproxy-node-client")):
            raise AssertionError("toxiproxy-node-client is not installed in tests/node: "
                                 "run scripts/deps.sh test")
        super().setUpClass()

    @classmethod
    def twice_config(cls):
        cls.api_port, cls.admin_port = h.free_port(), h.free_port()
        text = "seed 11\ntoxiproxy-api 127.0.0.1:%d\nadmin 127.0.0.1:%d\n" % (cls.api_port,
                                                                             cls.admin_port)
        return h.config(log_level="info", grace="1s") + text

    @classmethod
    def set_up_class(cls):
        cls.tw.wait_for_log(r"toxiproxy API listening\" addr=127\.0\.0\.1:%d" % cls.api_port)

    def run_scenario(self, name, timeout=90):
        rabbit_port = self.rabbit.port if self.rabbit is not None else 0
        r = subprocess.run(["node", SCRIPT, "http://127.0.0.1:%d" % self.api_port,
                            str(self.redis.port), str(rabbit_port), name],
                           cwd=NODE_DIR, capture_output=True, timeout=timeout)
        if r.returncode != 0:
            self.fail("scenario %s failed:\n%s\n----- twice log -----\n%s" % (
                name, r.stderr.decode(errors="replace"), self.tw.log_tail(40)))
        out = json.loads(r.stdout.decode().strip().splitlines()[-1])
        h.log("%s: %s" % (name, json.dumps(out)[:600]))
        return out

    def test_api(self):
        o = self.run_scenario("api")
        self.assertRegex(json.loads(o["version"])["version"], r"^2\.12\.0\+twice\.")
        self.assertTrue(o["version"].endswith("\n"))
        self.assertEqual(o["created"]["name"], "redis_api")
        self.assertTrue(o["created"]["enabled"])
        self.assertRegex(o["created"]["listen"], r"^127\.0\.0\.1:\d+$")
        self.assertNotEqual(o["created"]["listen"], "127.0.0.1:0")
        self.assertEqual(o["got"], o["created"])
        self.assertIn("redis_api", o["all"])
        self.assertEqual(o["toxic"], {"attributes": {"latency": 10, "jitter": 0},
                                      "name": "latency_downstream", "stream": "downstream",
                                      "toxicity": 1, "type": "latency"})
        self.assertEqual(o["toxic_got"], o["toxic"])
        self.assertEqual(o["toxic_updated"]["attributes"], {"latency": 10, "jitter": 3})
        self.assertEqual(o["toxic_updated"]["toxicity"], 0.5)
        self.assertIn("409", o["duplicate"])
        self.assertIn("409", o["toxic_duplicate"])
        self.assertIn("400", o["bad_type"])
        self.assertEqual(o["populated"], ["redis_api", "redis_pop"])
        self.assertEqual(o["pop_ping"], "+PONG\r\n")
        self.assertIn("404", o["after_remove"])
        self.assertEqual(o["connect_after_remove"], "ECONNREFUSED")

    def test_latency(self):
        o = self.run_scenario("latency")
        self.assertLess(o["before"], 150)
        self.assertGreaterEqual(o["downstream_300"], 300 - SLACK_MS)
        self.assertLess(o["downstream_300"], 1300)
        self.assertGreaterEqual(o["both"], 350 - SLACK_MS)
        self.assertLess(o["both"], 1450)
        self.assertLess(o["after_remove"], 150)
        self.assertEqual(o["reply"], "+PONG\r\n")

    def test_bandwidth(self):
        o = self.run_scenario("bandwidth")
        self.assertTrue(o["equal"])
        # 300,011 bytes at 100,000 bytes/s: 3 s (a burst of 50 ms allowed), at most a few more
        self.assertGreaterEqual(o["ms"], 2700)
        self.assertLess(o["ms"], 8000)
        self.assertLess(o["after_remove_ms"], 1000)
        self.assertTrue(o["again_equal"])

    def test_slicer(self):
        o = self.run_scenario("slicer")
        self.assertTrue(o["equal"])
        # 3009 bytes halved until the pieces are at most 120 bytes: 32 pieces (a few more when
        # a cut leaves one over 120), 10 ms apart.  Node may join two pieces in one read.
        self.assertGreaterEqual(o["chunks"], 20)
        self.assertGreaterEqual(o["ms"], 250)

    def test_limit_data(self):
        o = self.run_scenario("limit_data")
        self.assertEqual(o["got"], 20)
        self.assertTrue(o["prefix_equal"])
        self.assertTrue(o["closed"])

    def test_timeout_zero(self):
        o = self.run_scenario("timeout_zero")
        self.assertFalse(o["replied_in_1s"])
        self.assertTrue(o["open_after_1s"])
        self.assertTrue(o["closed_after_remove"])

    def test_timeout(self):
        o = self.run_scenario("timeout")
        self.assertTrue(o["closed"])
        self.assertEqual(o["got"], 0)
        self.assertGreaterEqual(o["ms"], 400 - SLACK_MS)
        self.assertLess(o["ms"], 2500)

    def test_reset_peer(self):
        o = self.run_scenario("reset_peer")
        self.assertEqual(o["error"], "ECONNRESET")
        self.assertEqual(o["got"], 0)
        self.assertGreaterEqual(o["ms"], 300 - SLACK_MS)
        self.assertLess(o["ms"], 2500)

    def test_slow_close(self):
        o = self.run_scenario("slow_close")
        self.assertEqual(o["reply"], "+OK\r\n")
        self.assertLess(o["data_ms"], 300)
        self.assertGreaterEqual(o["end_ms"], 500 - SLACK_MS)
        self.assertLess(o["end_ms"], 3000)

    def test_down(self):
        o = self.run_scenario("down")
        self.assertFalse(o["enabled"])
        self.assertTrue(o["open_closed"])
        self.assertEqual(o["new_connect"], "ECONNREFUSED")
        self.assertTrue(o["enabled_again"])
        self.assertEqual(o["reply"], "+PONG\r\n")

    def test_toxicity(self):
        o = self.run_scenario("toxicity")
        self.assertTrue(all(ms < 150 for ms in o["zero"]), o)
        self.assertTrue(all(ms >= 300 - SLACK_MS for ms in o["one"]), o)

    def test_reset(self):
        o = self.run_scenario("reset")
        self.assertGreaterEqual(o["slow"], 300 - SLACK_MS)
        self.assertLess(o["fast"], 150)
        self.assertEqual(o["enabled"], [True, True])
        self.assertEqual(o["toxics"], [])

    def api(self, method, path, body=None, port=None):
        """(status, parsed JSON or None) of one request to a Toxiproxy API."""
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (port or self.api_port, path),
                                     method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read()
                return r.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ping_ms(self, sock):
        t0 = time.monotonic()
        sock.sendall(b"PING\r\n")
        self.assertEqual(h.recv_exact(sock, 7), b"+PONG\r\n")
        return (time.monotonic() - t0) * 1000

    def test_reload_keeps_proxies(self):
        st, p = self.api("POST", "/proxies", {"name": "redis_rl", "listen": "127.0.0.1:0",
                                              "upstream": "127.0.0.1:%d" % self.redis.port})
        self.assertEqual(st, 201, p)
        port = int(p["listen"].rsplit(":", 1)[1])
        sock = h.connect(port)
        try:
            st, _ = self.api("POST", "/proxies/redis_rl/toxics",
                             {"type": "latency", "attributes": {"latency": 250}})
            self.assertEqual(st, 200)
            self.assertGreaterEqual(self.ping_ms(sock), 250 - SLACK_MS)
            n = self.tw.log_text().count("msg=reloaded")
            self.tw.signal(signal.SIGHUP)
            self.tw.wait_for_log(r"msg=reloaded", count=n + 1)
            st, again = self.api("GET", "/proxies/redis_rl")
            self.assertEqual(st, 200)
            self.assertEqual(again["listen"], p["listen"])
            self.assertEqual([t["name"] for t in again["toxics"]], ["latency_downstream"])
            self.assertGreaterEqual(self.ping_ms(sock), 250 - SLACK_MS)  # the open connection, still slow
            other = h.connect(port)
            self.assertGreaterEqual(self.ping_ms(other), 250 - SLACK_MS)
            other.close()
        finally:
            sock.close()
            self.api("DELETE", "/proxies/redis_rl")

    def test_admin_rule_on_a_proxy(self):
        """A proxy is a listener: the admin API's rules may name it, next to its toxics."""
        st, p = self.api("POST", "/proxies", {"name": "redis_adm", "listen": "127.0.0.1:0",
                                              "upstream": "127.0.0.1:%d" % self.redis.port})
        self.assertEqual(st, 201, p)
        port = int(p["listen"].rsplit(":", 1)[1])
        try:
            req = urllib.request.Request(
                "http://127.0.0.1:%d/rules/slow_adm" % self.admin_port, method="PUT",
                data=b"rule slow_adm on redis_adm {\n  stream downstream\n  do latency 200ms\n}\n")
            with urllib.request.urlopen(req, timeout=10) as r:
                self.assertIn(r.status, (200, 201))
            sock = h.connect(port)
            self.assertGreaterEqual(self.ping_ms(sock), 200 - SLACK_MS)
            st, _ = self.api("POST", "/proxies/redis_adm/toxics",
                             {"type": "latency", "attributes": {"latency": 100}})
            self.assertEqual(st, 200)
            self.assertGreaterEqual(self.ping_ms(sock), 300 - SLACK_MS)  # the rule's and the toxic's
            sock.close()
        finally:
            self.api("DELETE", "/proxies/redis_adm")
            urllib.request.urlopen(urllib.request.Request(
                "http://127.0.0.1:%d/rules/slow_adm" % self.admin_port, method="DELETE"),
                timeout=10).close()

    def test_toxiproxy_config(self):
        port, off_port, api = h.free_port(), h.free_port(), h.free_port()
        path = os.path.join(self.tmp, "proxies.json")
        with open(path, "w") as f:
            json.dump([{"name": "redis_cfg", "listen": "127.0.0.1:%d" % port,
                        "upstream": "127.0.0.1:%d" % self.redis.port},
                       {"name": "redis_off", "listen": "127.0.0.1:%d" % off_port,
                        "upstream": "127.0.0.1:%d" % self.redis.port, "enabled": False}], f)
        text = "toxiproxy-api 127.0.0.1:%d\ntoxiproxy-config %s\n" % (api, path)
        tw = self.twice(h.config(log_level="info", grace="1s") + text)
        try:
            tw.wait_for_log(r"toxiproxy-config read.* proxies=2")
            tw.wait_for_log(r"toxiproxy API listening\" addr=127\.0\.0\.1:%d" % api)
            st, all_ = self.api("GET", "/proxies", port=api)
            self.assertEqual(st, 200)
            self.assertEqual(sorted(all_), ["redis_cfg", "redis_off"])
            self.assertEqual([all_["redis_cfg"]["enabled"], all_["redis_off"]["enabled"]],
                             [True, False])
            sock = h.connect(port)
            self.ping_ms(sock)
            sock.close()
            self.assertFalse(h.port_open(off_port))
        finally:
            tw.stop()

    def test_rabbit(self):
        if ToxiproxyClient.rabbit is None:
            ToxiproxyClient.rabbit = h.start_rabbitmq(self.ctmp)
        o = self.run_scenario("rabbit", timeout=180)
        self.assertLess(o["connect_ms"], 2000)
        # connection.start, .tune and .open-ok each come 200 ms late, one after the other
        self.assertGreaterEqual(o["connect_latency_ms"], 600 - SLACK_MS)
        self.assertEqual(o["message"], "hello twice")
        self.assertTrue(o["limit_closed"])
        self.assertEqual(o["limit_got"], 100)
        self.assertEqual(o["limit_frame_type"], 1)  # a method frame: connection.start
        self.assertEqual(o["down"], "ECONNREFUSED")


if __name__ == "__main__":
    unittest.main()
