#!/usr/bin/python3
"""The admin HTTP API, through real HTTP calls, judged by what a user notices
on the proxied connections (an echo upstream behind `protocol tcp`):

- bearer token: 401 without / with a wrong token, even for POSTs (which then
  change nothing), 200 with the right one;
- POST /rules/NAME/disable|enable: new connections fast / slow again, open
  connections keep what they got; 404 for an unknown rule;
- GET/PUT/DELETE /rules/NAME: one rule read, replaced in place (counters and
  switch kept), added, removed; 400 for a bad body and nothing changes;
- every error is JSON with its status; 405 with `Allow` for a wrong method;
  /healthz answers without the token and says nothing but "ok";
- POST /faults/off|on: the kill switch, which also survives PUT and reload;
- PUT /rules: new rules apply to new connections, counters of same-named
  rules carry over; a broken body is a 400 with every `PUT /rules:LINE:COL`
  diagnostic and changes nothing;
- GET /rules counters, GET /metrics (valid Prometheus text, right values;
  journal records dropped when the journal's disk is full),
  GET /stats (JSON, connection counts);
- POST /reload and SIGHUP after editing the file; a broken file is a 400 /
  `reload failed` and the old behaviour stays;
- ~20 MB through twice while it reloads a dozen times: intact, no session
  closed abnormally;
- every descriptor in use: a request to the API waits for one without
  spinning or flooding the log, and is answered once a session ends.
"""

import json
import os
import re
import signal
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402

LAT = 1.0          # seconds of the `lat` rule
SLOW_MIN = 0.97    # a connection with the rule takes at least this
FAST_MAX = 0.6     # a connection without it takes less: loose, for a loaded sanitized run
                   # (the rule's latency is 1 s so that the two stay well apart)

LAT_RULE = fk.rule_block("lat", "echo", "stream downstream", "do latency 1000ms")


class AdminTest(h.TestCase):

    def setUp(self):
        super().setUp()
        self.echo = h.EchoServer(name="admin-echo")
        self.addCleanup(self.echo.close)

    def start(self, rules=(LAT_RULE,), token=fk.TOKEN, extra_listeners=(), seed=3, journal=None,
              log_level="debug", **kw):
        self.admin_port = h.free_port()
        self.echo_port = h.free_port()
        blocks = [h.listen_block("echo", self.echo_port, self.echo.port)]
        blocks += list(extra_listeners)
        self.conf = fk.conf_text(blocks, rules, seed=seed, admin_port=self.admin_port, token=token,
                                 journal=journal, log_level=log_level)
        t = self.twice(self.conf, **kw)
        if log_level in ("info", "debug"):
            t.wait_for_log(r"msg=\"admin listening\"")
        else:
            fk.wait_admin(self.admin_port)
        self.api = fk.Admin(self.admin_port, token)
        return t

    def rtt(self, port=None):
        return fk.echo_rtt(port or self.echo_port)

    def assert_slow(self, port=None, what=""):
        dt, addr = self.rtt(port)
        self.assertGreaterEqual(dt, SLOW_MIN, "%s: a new connection took %.3fs, the latency rule "
                                "did not apply" % (what, dt))
        return addr

    def assert_fast(self, port=None, what=""):
        dt, addr = self.rtt(port)
        self.assertLess(dt, FAST_MAX, "%s: a new connection took %.3fs although no rule should "
                        "apply" % (what, dt))
        return addr

    def ok(self, resp, code=200):
        st, hdrs, body = resp
        self.assertEqual(st, code, "HTTP %s (want %s): %s" % (st, code, body))
        return body

    # ---------------------------------------------------------------------

    def error(self, resp, code):
        """The JSON error of an answer that must be one: {"error": "..."} with `code`."""
        st, hdrs, body = resp
        self.assertEqual(st, code, "HTTP %s (want %s): %s" % (st, code, body))
        self.assertEqual(hdrs.get("content-type"), "application/json", (st, hdrs, body))
        doc = json.loads(body)
        self.assertIsInstance(doc.get("error"), str, body)
        self.assertTrue(doc["error"], body)
        return doc

    def test_healthz_and_token(self):
        t = self.start()
        body = self.ok(self.api.get("/healthz"))
        self.assertEqual(body.strip(), "ok")
        for tok in (None, "wrong-token-wrong-token", fk.TOKEN[:-1], fk.TOKEN + "x", ""):
            # /healthz is for load balancers, which carry no token: it says "ok" and no more
            st, hdrs, body = self.api.get("/healthz", token=tok)
            self.assertEqual((st, body), (200, "ok\n"), "token %r" % tok)
            for path in ("/rules", "/metrics", "/stats", "/rules/lat", "/nope"):
                st, hdrs, body = self.api.get(path, token=tok)
                self.assertEqual(st, 401, "token %r, %s: %s %s" % (tok, path, st, body))
                self.assertIn("bearer", hdrs.get("www-authenticate", "").lower())
                self.assertIn("Authorization: Bearer", self.error((st, hdrs, body), 401)["error"])
        # Basic auth with the token is not a bearer token
        st, _, _ = self.api.get("/rules", token=None,
                                headers={"Authorization": "Basic %s" % fk.TOKEN})
        self.assertEqual(st, 401)
        # state-changing calls without the token change nothing
        self.assertEqual(self.api.post("/faults/off", token=None)[0], 401)
        self.assertEqual(self.api.post("/rules/lat/disable", token="nope-nope-nope-nope")[0], 401)
        self.assertEqual(self.api.put("/rules", "", token=None)[0], 401)
        self.assertEqual(self.api.post("/reload", token=None)[0], 401)
        rules = self.api.json("/rules")
        self.assertTrue(rules["faults_enabled"])
        self.assertEqual([(r["name"], r["enabled"]) for r in rules["rules"]], [("lat", True)])
        self.assert_slow(what="after unauthorized calls")
        # unknown endpoints; known ones with the wrong method
        self.error(self.api.get("/nope"), 404)
        st, hdrs, _ = self.api.get("/rules/lat/disable")   # GET, not POST
        self.assertEqual((st, hdrs.get("allow")), (405, "POST"))
        st, hdrs, _ = self.api.request("DELETE", "/rules")
        self.assertEqual((st, hdrs.get("allow")), (405, "GET, HEAD, PUT"))
        t.stop()

    def test_healthz_reveals_nothing(self):
        """Without a token /healthz answers "ok" and nothing else: no counters, no version, no
        rule; every other method on it is a 405 that names only GET and HEAD."""
        t = self.start()
        st, hdrs, body = self.api.get("/healthz", token=None)
        self.assertEqual((st, body), (200, "ok\n"))
        self.assertEqual(sorted(hdrs), ["cache-control", "content-length", "content-type", "date"])
        st, hdrs, body = self.api.request("HEAD", "/healthz", token=None)
        self.assertEqual((st, body, hdrs.get("content-length")), (200, "", "3"))
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            resp = self.api.request(method, "/healthz", body=b"", token=None)
            self.assertEqual(resp[1].get("allow"), "GET, HEAD", method)
            self.assertNotIn("lat", self.error(resp, 405)["error"])
        t.stop()

    def test_errors_are_json(self):
        """Every error is {"error": "..."} with its status: 401, 404 (no such path, no such
        rule), 405 with `Allow` for every method a path does not take (never libevent's 501
        page), 400 with the diagnostics of a rule text or of the file; and nothing changes."""
        t = self.start()
        allowed = {
            "/rules": {"GET", "HEAD", "PUT"},
            "/rules/lat": {"GET", "HEAD", "PUT", "DELETE"},
            "/rules/lat/enable": {"POST"},
            "/rules/lat/disable": {"POST"},
            "/faults/off": {"POST"},
            "/faults/on": {"POST"},
            "/reload": {"POST"},
            "/stats": {"GET", "HEAD"},
            "/metrics": {"GET", "HEAD"},
        }
        order = ["GET", "HEAD", "POST", "PUT", "DELETE"]
        for path, methods in allowed.items():
            for method in order + ["OPTIONS", "PATCH", "TRACE"]:
                if method in methods:
                    continue
                resp = self.api.request(method, path, body=b"")
                doc = self.error(resp, 405) if method != "HEAD" else {"error": ""}
                self.assertEqual(resp[1].get("allow"),
                                 ", ".join(m for m in order if m in methods), (method, path))
                if method != "HEAD":
                    self.assertIn("%s is not allowed on %s" % (method, path), doc["error"])
        self.assertEqual(self.api.request("HEAD", "/rules/lat/enable")[2], "", "a HEAD with a body")
        for path in ("/nope", "/rules/", "/rules//disable", "/rules/lat/toggle", "/stats/x"):
            self.assertIn("not found", self.error(self.api.get(path), 404)["error"], path)
        for method, path in (("GET", "/rules/nosuch"), ("DELETE", "/rules/nosuch"),
                             ("POST", "/rules/nosuch/enable"), ("POST", "/rules/nosuch/disable")):
            doc = self.error(self.api.request(method, path, body=b""), 404)
            self.assertEqual(doc["error"], "no rule named 'nosuch'")

        doc = self.error(self.api.put("/rules", "rule x on echo {\n  do latncy 1ms\n}\n"), 400)
        self.assertEqual(doc["error"], "1 error in the rules: nothing changed")
        self.assertEqual(len(doc["diagnostics"]), 1, doc)
        self.assertTrue(doc["diagnostics"][0].startswith("PUT /rules:2:6: error: unknown action "
                                                         "'latncy'"), doc)
        t.write_config(self.conf + "rule broken on echo {\n}\n")
        doc = self.error(self.api.post("/reload"), 400)
        self.assertEqual(doc["error"], "reload failed: nothing changed")
        self.assertRegex(doc["diagnostics"][0], r"^%s:\d+:\d+: error: " % re.escape(t.conf_path))
        t.write_config(self.conf)
        self.assertEqual([(r["name"], r["enabled"]) for r in self.api.json("/rules")["rules"]],
                         [("lat", True)])
        self.assert_slow(what="after the errors")
        t.stop()

    def test_no_token_configured(self):
        t = self.start(token=None)
        self.assertEqual(self.ok(self.api.get("/healthz")).strip(), "ok")
        self.ok(self.api.get("/rules"))
        t.stop()

    def test_rule_disabled_in_file(self):
        rule = fk.rule_block("lat", "echo", "stream downstream", "disabled", "do latency 1000ms")
        t = self.start(rules=(rule,))
        self.assertFalse(self.api.rule("lat")["enabled"])
        self.assert_fast(what="rule written `disabled`")
        self.ok(self.api.post("/rules/lat/enable"))
        self.assert_slow(what="`disabled` rule enabled through the API")
        t.stop()

    def test_check_admin_settings(self):
        """`twice check`: a non-loopback admin address needs a token; a token
        is at least 16 characters."""
        listen = h.listen_block("echo", h.free_port(), 1)
        cases = [
            ("admin 0.0.0.0:%d\n" % h.free_port(), False),
            ("admin 0.0.0.0:%d\nadmin-token %s\n" % (h.free_port(), fk.TOKEN), True),
            ("admin 127.0.0.1:%d\nadmin-token short\n" % h.free_port(), False),
            ("admin 127.0.0.1:%d\n" % h.free_port(), True),
        ]
        for i, (head, valid) in enumerate(cases):
            path = os.path.join(self.tmp, "check-%d.conf" % i)
            with open(path, "w") as f:
                f.write(head + listen)
            r = h.run_twice(["check", "-c", path])
            out = (r.stdout + r.stderr).decode()
            self.assertEqual(r.returncode, 0 if valid else 1, "%r:\n%s" % (head, out))
            if not valid:
                self.assertRegex(out, r"%s:\d+:\d+: error: " % re.escape(path))

    def test_disable_enable(self):
        t = self.start()
        # a connection opened while the rule is on keeps it
        early = h.connect(self.echo_port)
        self.addCleanup(early.close)
        early.sendall(b"x")
        self.assertEqual(h.recv_exact(early, 1), b"x")
        self.assert_slow(what="rule on")

        body = self.ok(self.api.post("/rules/lat/disable"))
        self.assertEqual(json.loads(body), {"rule": "lat", "enabled": False})
        self.assertFalse(self.api.rule("lat")["enabled"])
        before = len(fk.fault_records(t))
        for _ in range(3):
            self.assert_fast(what="rule disabled")
        self.assertEqual(len(fk.fault_records(t)), before, "a disabled rule logged a fault")
        # the early connection still has its latency
        t0 = time.monotonic()
        early.sendall(b"y")
        self.assertEqual(h.recv_exact(early, 1), b"y")
        self.assertGreaterEqual(time.monotonic() - t0, SLOW_MIN,
                                "disabling a rule changed a connection opened before")

        self.ok(self.api.post("/rules/lat/enable"))
        self.assertTrue(self.api.rule("lat")["enabled"])
        self.assert_slow(what="rule enabled again")

        self.error(self.api.post("/rules/nosuch/disable"), 404)
        self.error(self.api.post("/rules/lat/toggle"), 404)
        self.error(self.api.post("/rules//disable"), 404)
        self.assert_slow(what="after 404s")
        t.wait_for_log(r"msg=\"rule disabled\" rule=lat source=admin")
        early.close()
        t.stop()

    def test_kill_switch(self):
        t = self.start()
        self.assert_slow(what="faults on")
        self.assertEqual(json.loads(self.ok(self.api.post("/faults/off"))), {"faults_enabled": False})
        self.assertFalse(self.api.json("/rules")["faults_enabled"])
        n_faults = len(fk.fault_records(t))
        self.assert_fast(what="faults off")
        self.assert_fast(what="faults off")
        # the switch stays off across PUT /rules and a reload
        self.ok(self.api.put("/rules", fk.rule_block("lat", "echo", "stream downstream",
                                                     "do latency 1000ms")))
        self.assertFalse(self.api.json("/rules")["faults_enabled"])
        self.assert_fast(what="faults off, after PUT /rules")
        self.ok(self.api.post("/reload"))
        self.assertFalse(self.api.json("/rules")["faults_enabled"])
        self.assert_fast(what="faults off, after reload")
        self.assertEqual(len(fk.fault_records(t)), n_faults, "faults logged while switched off")
        self.ok(self.api.post("/faults/on"))
        self.assertTrue(self.api.json("/rules")["faults_enabled"])
        self.assert_slow(what="faults on again")
        t.stop()

    def test_put_rules(self):
        t = self.start()
        self.assert_slow(what="initial rule")
        new = fk.rule_block("lat2", "echo", "stream downstream", "do latency 250ms")
        body = self.ok(self.api.put("/rules", new))
        self.assertEqual(json.loads(body), {"rules": 1})
        t.wait_for_log(r"msg=\"rules replaced\" source=admin")
        rules = self.api.json("/rules")["rules"]
        self.assertEqual([r["name"] for r in rules], ["lat2"])
        self.assertEqual((rules[0]["listener"], rules[0]["action"], rules[0]["event"]),
                         ("echo", "latency", "stream"))
        self.assertIn("250ms", rules[0]["detail"])
        dt, addr = self.rtt()
        self.assertGreaterEqual(dt, 0.23)
        sid = fk.sid_of(t, addr)
        self.assertEqual([r["rule"] for r in fk.fault_records(t, sid=sid)], ["lat2"])
        self.assertEqual(self.api.rule("lat2")["faults"], 1)

        # a body with two mistakes: 400, both reported, nothing changes
        bad = ("rule bad on echo {\n"        # line 1
               "  do latncy 100ms\n"         # line 2: unknown action at col 6
               "}\n"
               "rule worse on nosuch {\n"    # line 4: unknown listener
               "  do latency 100ms\n"
               "}\n")
        doc = self.error(self.api.put("/rules", bad), 400)
        self.assertEqual(doc["error"], "2 errors in the rules: nothing changed")
        diags = doc["diagnostics"]
        self.assertEqual(len(diags), 2, diags)
        self.assertRegex(diags[0], r"^PUT /rules:2:6: error: ")
        self.assertRegex(diags[1], r"^PUT /rules:4:\d+: error: .*nosuch")
        self.assertEqual([r["name"] for r in self.api.json("/rules")["rules"]], ["lat2"])
        dt, _ = self.rtt()
        self.assertGreaterEqual(dt, 0.23, "the old rules stopped applying after a rejected PUT")
        # a listen block is not a rule
        self.error(self.api.put("/rules", h.listen_block("x", h.free_port(), 1)), 400)
        self.assertEqual([r["name"] for r in self.api.json("/rules")["rules"]], ["lat2"])

        # same name again: counters carry over; a new rule starts at 0
        both = new + fk.rule_block("other", "echo", "stream upstream", "do latency 1ms", "nth 1000")
        self.assertEqual(json.loads(self.ok(self.api.put("/rules", both))), {"rules": 2})
        r = self.api.rule("lat2")
        self.assertGreaterEqual(r["seen"], 2)
        self.assertEqual(r["faults"], 2)
        self.assertEqual((self.api.rule("other")["seen"], self.api.rule("other")["faults"]), (0, 0))

        # no rules at all: everything fast
        self.assertEqual(json.loads(self.ok(self.api.put("/rules", ""))), {"rules": 0})
        self.assertEqual(self.api.json("/rules")["rules"], [])
        self.assert_fast(what="all rules removed by PUT")
        t.stop()

    def test_rules_show_triggers(self):
        """GET /rules (and GET /rules/NAME) shows what each rule acts on: its matchers and its
        triggers (a bare `probability 1` is every event: the JSON says 1, the text 100%)."""
        mq = h.listen_block("mq", h.free_port(), 1, protocol="amqp")
        rules = (fk.rule_block("lat", "echo", "stream downstream", "probability 1",
                               "do latency 1000ms"),
                 fk.rule_block("lost", "mq", "when ack queue=pay* task!=refund", "every 10",
                               "probability 5%", "between 0s 10m", "limit 7",
                               "max-per-message 2", "do redeliver"),
                 fk.rule_block("slow", "mq", "when ack", "do delay 1s"))
        t = self.start(rules=rules, extra_listeners=(mq,))
        got = {r["name"]: r for r in self.api.json("/rules")["rules"]}
        self.assertEqual((got["lat"]["matchers"], got["lat"]["triggers"],
                          got["lat"]["triggers_text"]),
                         ("", {"probability": 1, "max_per_message": 1}, "probability 100%"))
        self.assertEqual(got["lost"]["matchers"], "queue=pay* task!=refund")
        self.assertEqual(got["lost"]["triggers"],
                         {"probability": 0.05, "every": 10, "limit": 7,
                          "between_ms": [0, 600000], "max_per_message": 2})
        self.assertEqual(got["lost"]["triggers_text"],
                         "between 0s 10m, every 10, probability 5%, limit 7, max-per-message 2")
        self.assertEqual((got["slow"]["matchers"], got["slow"]["triggers"],
                          got["slow"]["triggers_text"]), ("", {"max_per_message": 1}, ""))
        # one rule by name, the same
        one = self.api.json("/rules/lost")
        self.assertEqual((one["matchers"], one["triggers"], one["triggers_text"]),
                         (got["lost"]["matchers"], got["lost"]["triggers"],
                          got["lost"]["triggers_text"]))
        t.stop()

    def test_put_rules_warnings(self):
        """A PUT /rules whose rules are valid but warned about: they replace the old ones, the
        answer lists each warning as `twice check` prints it, and the log has each one."""
        mq = h.listen_block("mq", h.free_port(), 1, protocol="amqp")
        t = self.start(extra_listeners=(mq,))
        rules = (fk.rule_block("lost", "mq", "when ack", "do redeliver") +    # line 1
                 fk.rule_block("slow", "mq", "when ack", "do delay 5s"))      # line 5
        body = json.loads(self.ok(self.api.put("/rules", rules)))
        self.assertEqual(body["rules"], 2)
        self.assertEqual(len(body["warnings"]), 1, body)
        self.assertTrue(body["warnings"][0].startswith(
            "PUT /rules:5:1: warning: rule 'slow' never acts on the 'ack' events it shares with "
            "rule 'lost' (PUT /rules:1)"), body)
        self.assertEqual([r["name"] for r in self.api.json("/rules")["rules"]], ["lost", "slow"])
        warned = t.wait_for_log(r"level=warn msg=config at=\"PUT /rules:5:1\"")
        self.assertIn("rule 'slow' never acts", warned[0])
        t.stop()

    def test_rule_by_name(self):
        """GET /rules/NAME is one rule with its switch and counters; PUT /rules/NAME replaces
        that rule in its place (its counters and switch carry over, as with PUT /rules) or adds
        it (201), validated like PUT /rules; DELETE /rules/NAME removes it. New connections
        show each change; a rejected PUT changes nothing."""
        other_port = h.free_port()
        t = self.start(extra_listeners=(h.listen_block("other", other_port, self.echo.port),))
        rule = self.api.json("/rules/lat")
        self.assertEqual((rule["name"], rule["listener"], rule["action"], rule["enabled"]),
                         ("lat", "echo", "latency", True))
        self.assertIn("1000ms", rule["detail"])
        self.ok(self.api.post("/rules/lat/disable"))
        self.assertFalse(self.api.json("/rules/lat")["enabled"])
        self.ok(self.api.post("/rules/lat/enable"))
        self.assert_slow(what="before any PUT")
        self.assertEqual(self.api.json("/rules/lat")["faults"], 1)

        # replace: the new latency applies, the counters go on
        body = fk.rule_block("lat", "echo", "stream downstream", "do latency 250ms")
        st, hdrs, text = self.api.put("/rules/lat", body)
        self.assertEqual(st, 200, text)
        self.assertEqual(hdrs.get("content-type"), "application/json")
        rule = json.loads(text)
        self.assertEqual((rule["name"], rule["faults"], rule["enabled"]), ("lat", 1, True))
        self.assertIn("250ms", rule["detail"])
        t.wait_for_log(r"msg=\"rule replaced\" rule=lat source=admin rules=1")
        dt, _ = self.rtt()
        self.assertTrue(0.23 <= dt < SLOW_MIN, "a connection took %.3fs after lat became 250ms" % dt)
        self.assertEqual(self.api.json("/rules/lat")["faults"], 2)
        # the switch carries over too: a replaced rule stays off until enabled
        self.ok(self.api.post("/rules/lat/disable"))
        self.ok(self.api.put("/rules/lat", body))
        self.assertFalse(self.api.json("/rules/lat")["enabled"])
        self.assert_fast(what="lat replaced while disabled")
        self.ok(self.api.post("/rules/lat/enable"))

        # add: after the others, 201
        added = fk.rule_block("lat_other", "other", "stream downstream", "do latency 1000ms")
        st, _, text = self.api.put("/rules/lat_other", added)
        self.assertEqual(st, 201, text)
        self.assertEqual((json.loads(text)["name"], json.loads(text)["faults"]), ("lat_other", 0))
        t.wait_for_log(r"msg=\"rule added\" rule=lat_other source=admin rules=2")
        self.assertEqual([r["name"] for r in self.api.json("/rules")["rules"]], ["lat", "lat_other"])
        self.assert_slow(other_port, "rule added by PUT /rules/lat_other")

        # rejected: a mistake, another name, two rules, none; nothing changes
        bad = fk.rule_block("lat", "nosuch", "stream downstream", "do latency 1ms")
        doc = self.error(self.api.put("/rules/lat", bad), 400)
        self.assertEqual(doc["error"], "1 error in the rules: nothing changed")
        self.assertRegex(doc["diagnostics"][0], r"^PUT /rules/lat:1:\d+: error: unknown listener "
                         r"'nosuch'")
        doc = self.error(self.api.put("/rules/lat", added), 400)
        self.assertEqual(doc["error"], "the body's rule is named 'lat_other', the path's 'lat'")
        doc = self.error(self.api.put("/rules/lat", body + added), 400)
        self.assertIn("the body has 2 rules", doc["error"])
        self.error(self.api.put("/rules/lat", ""), 400)
        self.assertEqual([(r["name"], r["enabled"], r["faults"])
                          for r in self.api.json("/rules")["rules"]],
                         [("lat", True, 2), ("lat_other", True, 1)])
        dt, _ = self.rtt()
        self.assertTrue(0.23 <= dt < SLOW_MIN, "lat changed after rejected PUTs: %.3fs" % dt)

        # delete: gone from new connections; added again, it starts afresh
        st, _, text = self.api.request("DELETE", "/rules/lat_other")
        self.assertEqual((st, json.loads(text)), (200, {"rule": "lat_other", "deleted": True,
                                                        "rules": 1}))
        t.wait_for_log(r"msg=\"rule deleted\" rule=lat_other source=admin rules=1")
        self.assert_fast(other_port, "rule deleted")
        self.error(self.api.get("/rules/lat_other"), 404)
        self.error(self.api.request("DELETE", "/rules/lat_other"), 404)
        self.assertEqual(self.api.put("/rules/lat_other", added)[0], 201)
        self.assertEqual(self.api.json("/rules/lat_other")["faults"], 0)
        # the file's rules come back with a reload, as after PUT /rules
        self.ok(self.api.post("/reload"))
        self.assertEqual([r["name"] for r in self.api.json("/rules")["rules"]], ["lat"])
        self.assert_slow(what="lat from the file again")
        t.stop()

    def test_rule_count_limit(self):
        """PUT /rules/NAME adds no rule past the limit of a file (4096), and still replaces."""
        t = self.start(rules=())
        many = "".join(fk.rule_block("r%d" % i, "echo", "stream upstream", "nth 1000000000",
                                     "do latency 1ms") for i in range(4096))
        self.assertEqual(json.loads(self.ok(self.api.put("/rules", many))), {"rules": 4096})
        one = fk.rule_block("one_more", "echo", "stream downstream", "do latency 1000ms")
        doc = self.error(self.api.put("/rules/one_more", one), 400)
        self.assertEqual(doc["error"], "too many rules (at most 4096): nothing changed")
        self.assert_fast(what="a rule past the limit")
        r0 = fk.rule_block("r0", "echo", "stream downstream", "do latency 1000ms")
        self.assertEqual(self.api.put("/rules/r0", r0)[0], 200)
        self.assert_slow(what="r0 replaced at the limit")
        self.assertEqual(self.api.request("DELETE", "/rules/r1")[0], 200)
        self.assertEqual(self.api.put("/rules/one_more", one)[0], 201)
        self.assertEqual(len(self.api.json("/rules")["rules"]), 4096)
        t.stop()

    def test_counters_metrics_stats(self):
        other_port = h.free_port()
        rule = fk.rule_block("lat", "echo", "stream downstream", "every 2", "do latency 100ms")
        t = self.start(rules=(rule,),
                       extra_listeners=(h.listen_block("other", other_port, self.echo.port),))
        payload = b"hello"
        for _ in range(4):
            fk.echo_rtt(self.echo_port, payload)
        for _ in range(2):
            fk.echo_rtt(other_port, payload)
        fk.wait_closed_sids(t, range(1, 7))
        # A session's `session closed` line is written before it is freed,
        # and only then does it leave the open counts (sessions_open, the
        # listeners' `open`, twice_connections_open): wait for that too.
        h.wait_until(lambda: self.api.json("/stats")["sessions_open"] == 0, 60,
                     what="the six closed sessions to be freed")
        r = self.api.rule("lat")
        self.assertEqual((r["seen"], r["faults"]), (4, 2), r)
        self.assertEqual(fk.fault_sids(t, rule="lat"), [2, 4])

        # one connection held open
        held = h.connect(other_port)
        self.addCleanup(held.close)
        held.sendall(payload)
        h.recv_exact(held, len(payload))

        st, hdrs, text = self.api.get("/metrics")
        self.assertEqual(st, 200)
        self.assertTrue(hdrs.get("content-type", "").startswith("text/plain"), hdrs)
        types, samples = fk.parse_prometheus(text)
        self.assertEqual(types.get("twice_faults_total"), "counter")
        self.assertEqual(types.get("twice_events_total"), "counter")
        self.assertEqual(types.get("twice_connections_total"), "counter")
        self.assertEqual(types.get("twice_connections_open"), "gauge")
        self.assertEqual(types.get("twice_bytes_total"), "counter")
        pv = lambda name, **lb: fk.prom_value(samples, name, **lb)  # noqa: E731
        # the version that runs, as `twice --version` says it
        version = h.run_twice(["--version"]).stdout.decode().split()[1]
        self.assertEqual(types.get("twice_build_info"), "gauge")
        # and which twice it is (`instance`, by default the host name: docs/instances.md)
        self.assertEqual([(lb, v) for nm, lb, v in samples if nm == "twice_build_info"],
                         [({"version": version, "twice_instance": socket.gethostname()}, 1)])
        self.assertEqual(pv("twice_faults_total", rule="lat", action="latency", listener="echo"), 2)
        self.assertEqual(pv("twice_connections_total", listener="echo"), 4)
        self.assertEqual(pv("twice_connections_total", listener="other"), 3)
        self.assertEqual(pv("twice_connections_open", listener="echo"), 0)
        self.assertEqual(pv("twice_connections_open", listener="other"), 1)
        self.assertEqual(pv("twice_bytes_total", listener="echo", direction="upstream"), 4 * len(payload))
        self.assertEqual(pv("twice_bytes_total", listener="echo", direction="downstream"), 4 * len(payload))
        self.assertEqual(pv("twice_bytes_total", listener="other", direction="upstream"), 3 * len(payload))
        # events per listener: each connection is a stream and a connect event of its own
        for listener, n in (("echo", 4), ("other", 3)):
            for kind in ("stream", "connect"):
                self.assertEqual(pv("twice_events_total", listener=listener, kind=kind), n,
                                 (listener, kind))
            self.assertEqual(pv("twice_events_total", listener=listener, kind="deliver"), 0)
        kinds = set(self.api.json("/stats")["events"])
        for listener in ("echo", "other"):   # every kind, zeros too
            self.assertEqual({lb["kind"] for nm, lb, _ in samples if nm == "twice_events_total"
                              and lb["listener"] == listener}, kinds, listener)

        stats = self.api.json("/stats")
        self.assertGreater(stats["uptime_ms"], 0)
        self.assertEqual(stats["sessions_open"], 1)
        self.assertEqual(stats["listeners"]["echo"],
                         {"connections": 4, "open": 0, "bytes_up": 20, "bytes_down": 20})
        self.assertEqual(stats["listeners"]["other"]["connections"], 3)
        self.assertEqual(stats["listeners"]["other"]["open"], 1)
        self.assertEqual(stats["events"]["stream"], 7)
        self.assertTrue(stats["faults_enabled"])
        self.assertEqual([(x["name"], x["seen"], x["faults"]) for x in stats["rules"]], [("lat", 4, 2)])
        held.close()
        h.wait_until(lambda: self.api.json("/stats")["sessions_open"] == 0, 60, what="sessions_open 0")
        time.sleep(0.05)   # uptime_ms must move on: at least 50 ms more
        self.assertGreater(self.api.json("/stats")["uptime_ms"], stats["uptime_ms"])
        t.stop()

    def test_journal_records_dropped(self):
        """The journal's disk is full (RLIMIT_FSIZE keeps twice's files under 4 KiB): its
        writer logs the failed write once and goes on, and
        twice_journal_records_dropped_total counts every record that did not reach the file,
        the records of later connections too; the proxy keeps serving."""
        journal = os.path.join(self.tmp, "full.pb")
        # log-level warn: the log, under the same limit, stays small
        # (the admin API answers once the listeners are bound: no probe of the echo listener,
        # which would be a connection of its own)
        t = self.start(rules=(), journal=journal, log_level="warn", wait=False, fsize=4096)

        def dropped():
            types, samples = fk.parse_prometheus(self.ok(self.api.get("/metrics")))
            self.assertEqual(types.get("twice_journal_records_dropped_total"), "counter")
            return fk.prom_value(samples, "twice_journal_records_dropped_total")

        def settled():
            return self.api.json("/stats")["sessions_open"] == 0

        self.assertEqual(dropped(), 0)
        # a connect and a close record each: 100 connections write past 4 KiB
        n = 100
        for _ in range(n):
            fk.echo_rtt(self.echo_port)
        t.wait_for_log(r"level=error msg=\"journal write failed, dropping records\" path=%s "
                       r"error=\"File too large\"" % re.escape(journal))
        h.wait_until(settled, 60, what="the sessions to close")
        before = dropped()
        self.assertGreater(before, 0)
        more = 10
        for _ in range(more):
            fk.echo_rtt(self.echo_port)
        h.wait_until(settled, 60, what="the sessions to close")
        total = 2 * (n + more)

        def accounted():
            with open(journal, "rb") as f:
                frames, _ = fk.journal_frames(f.read())
            return len(frames) - 1 + dropped()   # less the header

        # every record made is in the file or counted (a record of the buffer whose write
        # failed may be both), and each later connection's two are counted
        h.wait_until(lambda: accounted() >= total, 60, what="every record in the file or counted")
        self.assertGreaterEqual(dropped(), before + 2 * more)
        self.assertLessEqual(dropped(), total)
        self.assertLessEqual(os.path.getsize(journal), 4096)
        self.assertEqual(len(t.log_records("journal write failed, dropping records")), 1)
        self.assertLess(fk.echo_rtt(self.echo_port)[0], FAST_MAX)
        t.stop()

    def test_reload_from_file(self):
        other_port = h.free_port()
        extra = (h.listen_block("other", other_port, self.echo.port),)
        t = self.start(extra_listeners=extra)
        self.assert_fast(other_port, "other before reload")
        added = fk.rule_block("lat_other", "other", "stream downstream", "do latency 1000ms")
        t.write_config(self.conf + added)
        self.assertEqual(json.loads(self.ok(self.api.post("/reload"))), {"reloaded": True})
        self.assert_slow(other_port, "rule added by POST /reload")
        self.assert_slow(self.echo_port, "kept rule after reload")
        self.assertEqual(sorted(r["name"] for r in self.api.json("/rules")["rules"]),
                         ["lat", "lat_other"])

        # a broken file: 400 with the diagnostic, nothing changes
        broken = self.conf + added + "rule typo on other {\n  do latency\n}\n"
        t.write_config(broken)
        line = broken.count("\n", 0, broken.index("  do latency\n")) + 1
        diags = self.error(self.api.post("/reload"), 400)["diagnostics"]
        self.assertEqual(len(diags), 1, diags)
        self.assertRegex(diags[0], r"^%s:%d:\d+: error: " % (re.escape(t.conf_path), line))
        t.wait_for_log(r"msg=\"reload failed\"")
        self.assert_slow(other_port, "after a failed reload")
        # SIGHUP with the broken file: logged, nothing changes
        n_failed = len(t.log_records("reload failed"))
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=\"reload failed\"", count=n_failed + 1)
        self.assert_slow(other_port, "after a failed SIGHUP reload")
        self.assertIsNone(t.proc.poll())
        # fixed file, removing the rule: SIGHUP applies it
        n_ok = len(t.log_records("reloaded"))
        t.write_config(self.conf)
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded", count=n_ok + 1)
        self.assert_fast(other_port, "rule removed by SIGHUP reload")
        self.assertEqual([r["name"] for r in self.api.json("/rules")["rules"]], ["lat"])
        t.stop()

    def test_reload_moves_admin_and_token(self):
        """A reload that changes `admin` / `admin-token` moves the API and
        switches the token; the proxy keeps running either way."""
        t = self.start()
        a2, a3 = h.free_port(), h.free_port()
        tok2 = "fedcba9876543210fedcba98"
        # SIGHUP: new address and token
        conf2 = self.conf.replace("admin 127.0.0.1:%d" % self.admin_port, "admin 127.0.0.1:%d" % a2)
        conf2 = conf2.replace(fk.TOKEN, tok2)
        t.write_config(conf2)
        n = len(t.log_records("reloaded"))
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded", count=n + 1)
        api2 = fk.Admin(a2, tok2)
        h.wait_until(lambda: h.port_open(a2), 60, what="admin API on its new port")
        self.assertEqual(self.ok(api2.get("/healthz")).strip(), "ok")
        self.assertEqual(api2.get("/rules", token=fk.TOKEN)[0], 401, "the old token still works")
        h.wait_until(lambda: not h.port_open(self.admin_port), 60, what="old admin port closed")
        self.assert_slow(what="after moving the admin API")
        # POST /reload on the API that the reload itself moves
        conf3 = conf2.replace("admin 127.0.0.1:%d" % a2, "admin 127.0.0.1:%d" % a3)
        t.write_config(conf3)
        try:
            resp = api2.post("/reload")
        except OSError as e:   # http.client.RemoteDisconnected is an OSError
            resp = (None, {}, repr(e))
        # The API the reload moved away from is freed (its port closed) a
        # second after that request was answered: had that gone wrong, twice
        # would have died by the time the port is closed.
        h.eventually(lambda: t.proc.poll() is not None or not h.port_open(a2), 60)
        self.assertIsNone(t.proc.poll(), "twice died (rc=%s) handling a POST /reload that moves the "
                          "admin API; POST answered %r; log:\n%s" % (t.proc.poll(), resp, t.log_tail(15)))
        self.assertEqual(resp[0], 200, "POST /reload that moves the admin API: %r" % (resp,))
        api3 = fk.Admin(a3, tok2)
        h.wait_until(lambda: h.port_open(a3), 60, what="admin API on its third port")
        self.assertEqual(self.ok(api3.get("/healthz")).strip(), "ok")
        self.assert_slow(what="after POST /reload moved the admin API")
        t.stop()

    def test_descriptors_run_out(self):
        """Every descriptor twice may open is in use (idle sessions through a listener up to
        its cap, idle API connections), and a request comes to the API: twice waits for a descriptor
        without spinning or flooding its log (libevent retried accept() at once and logged
        each failure: a core at 100 % and 6.5 GB of log in 80 s once), says once a second
        that accept failed, and answers the request once a session ends."""
        limit = 96
        t = self.start(rules=(), nofile=(limit, limit))
        sessions, idle = [], []
        self.addCleanup(lambda: [s.close() for s in sessions + idle])
        while t.fd_count() < limit - 1:   # two descriptors each, up to twice's session cap
            s = h.connect(self.echo_port)
            s.sendall(b"x")
            try:
                served = h.recv_exact(s, 1) == b"x"
            except (OSError, EOFError):
                served = False
            if not served:   # refused: the cap keeps descriptors for the rest of twice
                s.close()
                break
            sessions.append(s)
        self.assertTrue(sessions, "no session served")
        while t.fd_count() < limit:       # one each: the API's connections are not capped
            n = t.fd_count()
            idle.append(socket.create_connection(("127.0.0.1", self.admin_port), timeout=30))
            h.wait_until(lambda: t.fd_count() > n, 30, what="twice accepting an API connection")
        mark, size0, cpu0 = t.log_mark(), os.path.getsize(t.log_path), t.cpu_seconds()
        pending = socket.create_connection(("127.0.0.1", self.admin_port), timeout=30)
        self.addCleanup(pending.close)
        pending.sendall(b"GET /healthz HTTP/1.1\r\nHost: twice\r\nConnection: close\r\n"
                        b"Authorization: Bearer %s\r\n\r\n" % fk.TOKEN.encode())

        def accept_failures():
            return [l for l in t.log_lines()[mark:] if 'msg="accept failed" admin=' in l]

        def waited_or_spinning():
            if os.path.getsize(t.log_path) - size0 > h.MiB or t.cpu_seconds() - cpu0 > 5:
                return "spinning"
            return len(accept_failures()) >= 3   # two seconds at least
        h.eventually(waited_or_spinning, 60)
        cpu = t.cpu_seconds() - cpu0
        grown = os.path.getsize(t.log_path) - size0
        lines = t.log_lines()[mark:]
        h.log("%d sessions, %d idle API connections; while the request waited: %.2f s of CPU, "
              "%d log lines (%d bytes)" % (len(sessions), len(idle), cpu, len(lines), grown))
        self.assertLess(grown, 64 * h.KiB, "the log grew by %d bytes while the request waited; "
                        "it ends:\n%s" % (grown, "\n".join(lines[-5:])))
        fails = accept_failures()
        self.assertGreaterEqual(len(fails), 3, "no `accept failed` for the API once a second: "
                                "%s" % lines[-5:])
        self.assertLess(len(lines), 20, lines)
        rec = h.parse_logfmt(fails[0])
        self.assertEqual((rec["level"], rec["admin"], rec["error"], rec["retry_ms"]),
                         ("warn", "127.0.0.1:%d" % self.admin_port, "Too many open files", "1000"))
        self.assertLess(cpu, 1.0, "twice used %.2f s of CPU waiting for a descriptor" % cpu)

        sessions.pop().close()
        pending.settimeout(30)
        reply = h.recv_all(pending)
        self.assertTrue(reply.startswith(b"HTTP/1.1 200 "), reply)
        self.assertTrue(reply.endswith(b"\r\n\r\nok\n"), reply)
        for s in idle:
            s.close()
        self.assertEqual(self.ok(self.api.get("/healthz")).strip(), "ok")
        t.stop()

    def test_reload_under_traffic(self):
        """~20 MB cross twice while it reloads (SIGHUP and POST /reload) a
        dozen times, with a file that changes every time (a listener comes and
        goes, a rule changes): the transfer is intact and no session ends
        abnormally."""
        hs = h.HashServer(name="admin-hash")
        self.addCleanup(hs.close)
        bulk_port, extra_port = h.free_port(), h.free_port()
        bulk = h.listen_block("bulk", bulk_port, hs.port)
        shaped = fk.rule_block("shape", "bulk", "do bandwidth 5MB/s")
        t = self.start(rules=(LAT_RULE, shaped), extra_listeners=(bulk,))
        base = self.conf
        variant = (base + h.listen_block("extra", extra_port, self.echo.port)
                   + fk.rule_block("lat_extra", "extra", "do latency 10ms"))
        variant = variant.replace("do latency 1000ms", "do latency 1000ms jitter 10ms")

        sock = h.connect(bulk_port, timeout=60)
        self.addCleanup(sock.close)
        addr = h.client_addr(sock)
        size = 10 * h.MiB
        job = fk.Bg(h.hash_exchange, sock, size, size, concurrent=True, pattern=True, seed=11,
                    upload_seed=12, timeout=60)
        t0 = time.monotonic()
        job.start()
        n_ok0 = len(t.log_records("reloaded"))
        during = 0
        i = 0
        while job.is_alive() or i < 10:
            t.write_config(variant if i % 2 == 0 else base)
            if i % 3 == 2:
                self.ok(self.api.post("/reload"))
            else:
                n = len(t.log_records("reloaded"))
                t.signal(signal.SIGHUP)
                t.wait_for_log(r"msg=reloaded", count=n + 1)
            if job.is_alive():
                during += 1
            i += 1
            if i > 400:
                break
            time.sleep(0.05)
        job.join(120)
        dt = time.monotonic() - t0
        h.log("transfer of 2 x %d bytes took %.2fs, %d reloads (%d during the transfer)" % (
            size, dt, i, during))
        self.assertIsNone(job.error)
        res = job.result
        self.assertEqual(h.exchange_problems(res), [], res)
        self.assertGreaterEqual(during, 8, "the transfer ended before the reloads could overlap it")
        self.assertEqual(len(t.log_records("reloaded")) - n_ok0, i)
        self.assertEqual(t.log_records("reload failed"), [])
        sock.close()
        rec = t.wait_sessions([addr])[addr]
        self.assertIn(rec["reason"], ("client_closed", "upstream_closed"), rec)
        self.assertEqual(int(rec["bytes_up"]), size + h.HASH_HDR.size)
        self.assertEqual(int(rec["bytes_down"]), size + h.HASH_TRAILER.size)
        bad = [r for r in t.log_records("session closed")
               if r["reason"] not in ("client_closed", "upstream_closed")]
        self.assertEqual(bad, [], "sessions closed abnormally during reloads")
        # still serving, on the last configuration
        self.assertIsNone(t.proc.poll())
        self.assert_slow(what="after the reload storm")
        t.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
