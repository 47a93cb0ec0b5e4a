#!/usr/bin/python3
"""Hostile bodies for the Toxiproxy API (review findings; fails until fixed).

- an `upstream` holding newlines is written into the text of the proxy's listen block
  (proxy/api/toxi.c proxy_conf) and becomes directives of it: a `max-connections 1` rides along
  and is obeyed, a `tls cert FILE key FILE` makes twice open any file it can read;
- a toxicity no float32 holds (1e300) is answered 500 yet the toxic is added, and is then
  missing from every listing while still acting on connections;
- a toxic name as long as the proxy's allowed a rule name past 64 bytes, and a name cut in the
  middle of a character made the error answer 500;
- a message toxic named as a rule of the file took that rule's place, and its delete removed it;
- proxies had no bound: each is a socket, and a client could take every descriptor.
"""

import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402


class ToxiproxyHostileTest(h.TestCase):
    def setUp(self):
        super().setUp()
        self.port = h.free_port()
        self.redis_port = h.free_port()
        self.proc = self.twice("seed 7\ntoxiproxy-api 127.0.0.1:%d\n" % self.port + h.config(
            "listen jobs {\n  protocol resp\n  bind 127.0.0.1:%d\n  upstream 127.0.0.1:%d\n}\n"
            % (h.free_port(), self.redis_port),
            "rule p.m on jobs {\n  when command\n  every 1000\n  do error ERR\n}\n"))
        h.wait_until(lambda: h.port_open(self.port), 30, what="the Toxiproxy API")

    def call(self, method, path, body):
        r = subprocess.run(["curl", "-sS", "-X", method, "-A", "toxiproxy-cli", "-o", "-",
                            "-w", "\n%{http_code}", "--max-time", "30", "--data-binary",
                            json.dumps(body), "http://127.0.0.1:%d%s" % (self.port, path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        text, _, code = r.stdout.decode().rpartition("\n")
        return int(code), text

    def test_upstream_cannot_add_directives_to_the_listen_block(self):
        for up in ("127.0.0.1:6379\n  max-connections 1",
                   "127.0.0.1:6379\n  tls cert /etc/hostname key /etc/hostname"):
            code, text = self.call("POST", "/proxies", {"name": "inj", "upstream": up})
            self.assertEqual(code, 400, "upstream %r accepted: %d %s" % (up, code, text))
            self.assertNotIn("certificate", text, "twice opened a file the client named")

    def test_disabled_proxy_upstream_is_checked_too(self):
        code, text = self.call("POST", "/proxies",
                               {"name": "off", "enabled": False, "upstream": "a\n}\n"})
        self.assertEqual(code, 400, "garbage upstream accepted while disabled: %s" % text)

    def test_unrepresentable_toxicity_is_refused_and_leaves_no_hidden_toxic(self):
        code, _ = self.call("POST", "/proxies", {"name": "p", "upstream": "127.0.0.1:6379"})
        self.assertEqual(code, 201)
        code, text = self.call("POST", "/proxies/p/toxics",
                               {"name": "inf", "type": "latency", "toxicity": 1e300})
        self.assertEqual(code, 400, "toxicity 1e300: %d %s" % (code, text))
        code, text = self.call("GET", "/proxies/p/toxics/inf", None)
        self.assertEqual(code, 404, "a toxic the API refused is there: %d %s" % (code, text))

    def test_toxic_names_are_bounded_and_answers_stay_json(self):
        code, _ = self.call("POST", "/proxies", {"name": "a" * 64, "upstream": "127.0.0.1:6379"})
        self.assertEqual(code, 201)
        code, text = self.call("POST", "/proxies/%s/toxics" % ("a" * 64),
                               {"name": "b" * 70, "type": "latency"})
        self.assertEqual(code, 400, text)
        for name in ("x" * 70 + "\u00e9", "\u00e9" * 300):
            code, text = self.call("POST", "/proxies", {"name": name, "upstream": "127.0.0.1:6379"})
            self.assertEqual(code, 400, text)
            self.assertEqual(json.loads(text)["status"], 400, text)

    def test_message_toxic_named_as_a_file_rule_is_refused(self):
        code, text = self.call("POST", "/proxies", {"name": "p", "upstream": "127.0.0.1:%d" %
                                                    self.redis_port, "protocol": "resp"})
        self.assertEqual(code, 201, text)
        code, text = self.call("POST", "/proxies/p/toxics",
                               {"name": "m", "type": "error", "attributes": {"code": "ERR"}})
        self.assertEqual(code, 409, text)
        self.assertIn("p.m", text)

    def test_proxies_are_bounded(self):
        many = [{"name": "p%d" % i, "upstream": "127.0.0.1:6379", "enabled": False}
                for i in range(1001)]
        code, text = self.call("POST", "/populate", many)
        self.assertEqual(code, 507, text[:300])
        self.assertIn("at most 1000 proxies", text)


if __name__ == "__main__":
    unittest.main()
