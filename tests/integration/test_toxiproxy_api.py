#!/usr/bin/python3
"""Toxiproxy's HTTP API as its README documents it, replayed with curl against
twice's `toxiproxy-api` listener: the same status codes, the same JSON fields,
the same error bodies, and what a Redis client notices through the proxies.

Every request is made by the curl command-line tool, as a user following
Toxiproxy's README would (its "HTTP API", "Toxics", "Populating Proxies" and
"CLI Example" sections, README.md of Shopify/toxiproxy v2.12.0); error texts
and the status of each answer are those of Toxiproxy's api.go (its error
table) and toxic_collection.go. docs/toxiproxy.md lists where twice differs.

- GET /version; POST /proxies (201, `enabled` true by default, a port 0 in
  `listen` answered with the real port, `toxics` []), GET /proxies (an object
  keyed by name), GET /proxies/{proxy}; 409, 400 and 404 with
  {"error": ..., "status": ...};
- every toxic of the README with its attributes, echoed back in full;
- toxics: the defaults (`<type>_<stream>`, downstream, toxicity 1), list,
  show, update (partial: attributes not sent keep their value), delete (204),
  and each documented error;
- the README's CLI example: SET/GET through a proxy in front of a real Redis,
  a 1000 ms latency toxic makes each reply take a second, also on a
  connection opened before the toxic was added; removing it makes them fast;
  deleting the proxy refuses connections;
- `down`: enabled false refuses new connections and closes open ones,
  enabled true brings the proxy back with its toxics;
- POST /populate: creates, keeps an unchanged proxy untouched (its toxics, its
  open connection), replaces a changed one, refuses a list with a nameless
  proxy before creating anything;
- POST /reset: every proxy enabled again, every toxic gone, proxies kept;
- changing a proxy's upstream restarts it and drops its connections;
- `bandwidth` at rate 0 holds the reply of an open connection (no byte, the connection open)
  until the toxic is removed, then delivers it (Toxiproxy's bandwidth.go);
- `slicer` cuts a 1700-byte Redis reply, average 100, variation 0, by halving it: about 32
  reads of 53 or 54 bytes, 20 ms apart (Toxiproxy's slicer.go), not 17 reads of 100;
- twice exits cleanly (SIGTERM, status 0) with the proxies and toxics the
  test left.

TOXIPROXY_SERVER=/path/to/toxiproxy-server runs the same cases against a
real Toxiproxy as well (scripts/toxiproxy-oracle.sh builds one from a
Toxiproxy source tree): the oracle for this test itself.
"""

import json
import os
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import clientkit as ck  # noqa: E402
import faultkit as fk  # noqa: E402

LATENCY_MS = 1000
SLOW_MIN = 0.95     # a reply behind the 1000 ms latency toxic takes at least this
FAST_MAX = 0.8      # and one without it less (loose for a loaded sanitized run)
UA = "toxiproxy-cli"  # what Toxiproxy's Go client sends (client/client.go)


class Api:
    """curl against one Toxiproxy-speaking server."""

    def __init__(self, port, tmp):
        self.base = "http://127.0.0.1:%d" % port
        self.tmp = tmp
        self.n = 0

    def call(self, method, path, body=None, raw=None, agent=UA):
        """(status, headers, body bytes, parsed JSON or None)."""
        self.n += 1
        hdr = os.path.join(self.tmp, "curl-%d.headers" % self.n)
        out = os.path.join(self.tmp, "curl-%d.body" % self.n)
        argv = ["curl", "-sS", "-X", method, "-A", agent, "-H", "Content-Type: application/json",
                "-D", hdr, "-o", out, "-w", "%{http_code}", "--max-time", "30"]
        if body is not None or raw is not None:
            data = raw if raw is not None else json.dumps(body)
            argv += ["--data-binary", data]
        argv.append(self.base + path)
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        if r.returncode != 0:
            raise AssertionError("curl %s %s failed: %s" % (method, path, r.stderr.decode()))
        status = int(r.stdout.decode())
        headers = {}
        with open(hdr, "rb") as f:
            for line in f.read().decode("latin-1").split("\r\n")[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
        with open(out, "rb") as f:
            data = f.read()
        try:
            parsed = json.loads(data) if data.strip() else None
        except ValueError:
            parsed = None
        return status, headers, data, parsed


class Server:
    """twice with `toxiproxy-api`, or (TOXIPROXY_SERVER) a real Toxiproxy."""

    def __init__(self, test, kind, redis_port):
        self.kind = kind
        self.port = h.free_port()
        if kind == "twice":
            # twice needs one listener of its own: a plain one nobody uses here.
            text = ("seed 7\ntoxiproxy-api 127.0.0.1:%d\n" % self.port
                    + h.config(ck.listen("file_redis", h.free_port(), redis_port)))
            self.proc = test.twice(text)
            # After the test (before the harness's kill): a clean exit with the run-time
            # proxies and toxics still there (their memory, under ASan).
            test.addCleanup(self.proc.stop)
        else:
            self.proc = h.spawn([os.environ["TOXIPROXY_SERVER"], "-host", "127.0.0.1",
                                 "-port", str(self.port)],
                                log_path=os.path.join(test.tmp, "toxiproxy.log"))
            test.addCleanup(lambda: (h.kill_group(self.proc), self.proc.wait()))
        h.wait_until(lambda: h.port_open(self.port), 30, what="the Toxiproxy API on %d" % self.port)
        self.api = Api(self.port, test.tmp)


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


class ToxiproxyApiCase:
    """The cases; KIND says which server answers."""

    KIND = "twice"
    REDIS = True
    TMP_PREFIX = "twice-it-toxiapi-"

    def setUp(self):
        super().setUp()
        self.server = Server(self, self.KIND, self.redis.port)
        self.api = self.server.api
        self.upstream = "127.0.0.1:%d" % self.redis.port

    # -- helpers ----------------------------------------------------------

    def ok(self, method, path, body=None, status=200, **kw):
        st, hdrs, data, js = self.api.call(method, path, body, **kw)
        self.assertEqual(st, status, "%s %s %r answered %d %r" % (method, path, body, st, data))
        return js

    def err(self, method, path, body, status, message, raw=None):
        """A Toxiproxy error: the status, and {"error": message, "status": status}."""
        st, hdrs, data, js = self.api.call(method, path, body, raw=raw)
        self.assertEqual(st, status, "%s %s %r answered %d %r" % (method, path, body, st, data))
        self.assertIsInstance(js, dict, "%s %s: error body is not a JSON object: %r" % (method, path, data))
        self.assertEqual(js.get("status"), status, "%s %s: %r" % (method, path, js))
        if message.endswith("*"):
            self.assertTrue(str(js.get("error", "")).startswith(message[:-1]),
                            "%s %s: error %r, want %r" % (method, path, js.get("error"), message))
        else:
            self.assertEqual(js.get("error"), message, "%s %s: %r" % (method, path, js))
        return js

    def create(self, name, listen=None, upstream=None, status=201, **extra):
        body = {"name": name, "listen": listen or "127.0.0.1:%d" % h.free_port(),
                "upstream": upstream or self.upstream}
        body.update(extra)
        p = self.ok("POST", "/proxies", body, status=status)
        return p

    def port_of(self, proxy):
        host, _, port = proxy["listen"].rpartition(":")
        self.assertIn(host, ("127.0.0.1", "localhost"), proxy)
        self.assertGreater(int(port), 0, proxy)
        return int(port)

    def add_toxic(self, proxy, body, status=200):
        return self.ok("POST", "/proxies/%s/toxics" % proxy, body, status=status)

    def assert_proxy(self, p, name, upstream=None, enabled=True, ntoxics=0):
        self.assertEqual(p["name"], name, p)
        self.assertEqual(p["upstream"], upstream or self.upstream, p)
        self.assertIs(p["enabled"], enabled, p)
        self.assertIsInstance(p["listen"], str, p)
        self.assertIsInstance(p["toxics"], list, p)
        self.assertEqual(len(p["toxics"]), ntoxics, p)

    # -- the cases ---------------------------------------------------------

    def test_version(self):
        # README "Endpoints": GET /version - Returns the server version number.
        js = self.ok("GET", "/version")
        self.assertIsInstance(js, dict)
        self.assertIsInstance(js.get("version"), str)
        self.assertTrue(js["version"])

    def test_proxy_lifecycle_and_errors(self):
        # README "Proxy fields": enabled defaults to true on creation; a port of 0 in
        # `listen` makes Toxiproxy pick one, and the answer carries the actual port.
        p = self.create("shopify_test_redis_master", listen="localhost:0")
        self.assert_proxy(p, "shopify_test_redis_master")
        port = self.port_of(p)
        self.assertEqual(p["listen"], "127.0.0.1:%d" % port)
        with fk.RespConn(port) as c:
            self.assertEqual(c.call("PING"), b"PONG")

        # GET /proxies: an object keyed by proxy name, with each proxy's toxics.
        all_ = self.ok("GET", "/proxies")
        self.assertIsInstance(all_, dict)
        self.assertEqual(all_["shopify_test_redis_master"], p)
        # GET /proxies/{proxy}
        self.assertEqual(self.ok("GET", "/proxies/shopify_test_redis_master"), p)

        # Errors, with Toxiproxy's texts (api.go's error table).
        self.err("POST", "/proxies", {"name": "shopify_test_redis_master", "listen": "127.0.0.1:0",
                                      "upstream": self.upstream}, 409, "proxy already exists")
        self.err("POST", "/proxies", {"listen": "127.0.0.1:0", "upstream": self.upstream}, 400,
                 "missing required field: name")
        self.err("POST", "/proxies", {"name": "x", "listen": "127.0.0.1:0"}, 400,
                 "missing required field: upstream")
        self.err("POST", "/proxies", None, 400, "bad request body*", raw="{not json")
        self.err("GET", "/proxies/nope", None, 404, "proxy not found")
        self.err("POST", "/proxies/nope", {"enabled": False}, 404, "proxy not found")
        self.err("DELETE", "/proxies/nope", None, 404, "proxy not found")
        self.err("GET", "/proxies/nope/toxics", None, 404, "proxy not found")
        self.err("POST", "/proxies/nope/toxics", {"type": "latency"}, 404, "proxy not found")

        # A proxy created disabled does not listen.
        q_port = h.free_port()
        q = self.create("disabled_one", listen="127.0.0.1:%d" % q_port, enabled=False)
        self.assert_proxy(q, "disabled_one", enabled=False)
        self.assertTrue(refused(q_port), "a proxy created with enabled false accepts connections")

        # DELETE: 204, gone from the list, its port refuses.
        st, _, data, _ = self.api.call("DELETE", "/proxies/shopify_test_redis_master")
        self.assertEqual((st, data), (204, b""))
        self.err("GET", "/proxies/shopify_test_redis_master", None, 404, "proxy not found")
        self.assertNotIn("shopify_test_redis_master", self.ok("GET", "/proxies"))
        self.assertTrue(h.eventually(lambda: refused(port), 10), "a deleted proxy still accepts")

    def test_toxic_fields_and_errors(self):
        self.create("redis")
        # README "Toxic fields": name defaults to <type>_<stream>, stream to downstream,
        # toxicity to 1.0; attributes are the toxic's own.
        t = self.add_toxic("redis", {"type": "latency", "attributes": {"latency": 1000}})
        self.assertEqual(t["name"], "latency_downstream", t)
        self.assertEqual(t["type"], "latency", t)
        self.assertEqual(t["stream"], "downstream", t)
        self.assertEqual(t["toxicity"], 1, t)
        self.assertEqual(t["attributes"]["latency"], 1000, t)
        self.assertEqual(t["attributes"].get("jitter", 0), 0, t)

        u = self.add_toxic("redis", {"type": "latency", "stream": "upstream", "toxicity": 0.5,
                                     "attributes": {"latency": 10, "jitter": 2}})
        self.assertEqual((u["name"], u["stream"], u["toxicity"]), ("latency_upstream", "upstream", 0.5))
        named = self.add_toxic("redis", {"name": "slow", "type": "bandwidth", "stream": "downstream",
                                         "attributes": {"rate": 100}})
        self.assertEqual((named["name"], named["type"], named["attributes"]["rate"]),
                         ("slow", "bandwidth", 100))

        # GET /proxies/{proxy}/toxics and /toxics/{toxic}; the proxy carries them too.
        lst = self.ok("GET", "/proxies/redis/toxics")
        self.assertEqual(sorted(x["name"] for x in lst), ["latency_downstream", "latency_upstream", "slow"])
        self.assertEqual(self.ok("GET", "/proxies/redis/toxics/latency_upstream"), u)
        self.assertEqual(sorted(x["name"] for x in self.ok("GET", "/proxies/redis")["toxics"]),
                         ["latency_downstream", "latency_upstream", "slow"])

        # Errors (api.go, toxic_collection.go).
        self.err("POST", "/proxies/redis/toxics", {"type": "latency"}, 409, "toxic already exists")
        self.err("POST", "/proxies/redis/toxics", {"name": "slow", "type": "latency",
                                                   "stream": "upstream"}, 409, "toxic already exists")
        self.err("POST", "/proxies/redis/toxics", {"type": "latency", "stream": "sideways"}, 400,
                 "stream was invalid, can be either upstream or downstream")
        self.err("POST", "/proxies/redis/toxics", {"type": "no_such_toxic"}, 400, "invalid toxic type")
        self.err("POST", "/proxies/redis/toxics", None, 400, "bad request body*", raw="[")
        self.err("GET", "/proxies/redis/toxics/nope", None, 404, "toxic not found")
        self.err("POST", "/proxies/redis/toxics/nope", {"attributes": {}}, 404, "toxic not found")
        self.err("DELETE", "/proxies/redis/toxics/nope", None, 404, "toxic not found")

        # Update (POST, and PATCH as the Go client sends it): attributes not sent keep
        # their value, toxicity changes when sent.
        up = self.ok("POST", "/proxies/redis/toxics/latency_upstream", {"attributes": {"latency": 20}})
        self.assertEqual((up["attributes"]["latency"], up["attributes"]["jitter"], up["toxicity"]),
                         (20, 2, 0.5), up)
        up = self.ok("PATCH", "/proxies/redis/toxics/latency_upstream",
                     {"attributes": {"jitter": 3}, "toxicity": 1})
        self.assertEqual((up["attributes"]["latency"], up["attributes"]["jitter"], up["toxicity"]),
                         (20, 3, 1), up)
        self.assertEqual(self.ok("GET", "/proxies/redis/toxics/latency_upstream"), up)

        # DELETE: 204, then 404.
        st, _, data, _ = self.api.call("DELETE", "/proxies/redis/toxics/latency_upstream")
        self.assertEqual((st, data), (204, b""))
        self.err("DELETE", "/proxies/redis/toxics/latency_upstream", None, 404, "toxic not found")
        self.assertEqual(sorted(x["name"] for x in self.ok("GET", "/proxies/redis/toxics")),
                         ["latency_downstream", "slow"])

    def test_each_readme_toxic(self):
        # README "Toxics": every toxic type with its attributes, echoed back in full.
        self.create("redis")
        readme = [("latency", {"latency": 1000, "jitter": 100}), ("bandwidth", {"rate": 1000}),
                  ("slow_close", {"delay": 1000}), ("timeout", {"timeout": 5000}),
                  ("reset_peer", {"timeout": 100}),
                  ("slicer", {"average_size": 64, "size_variation": 32, "delay": 10}),
                  ("limit_data", {"bytes": 1024})]
        for typ, attrs in readme:
            t = self.add_toxic("redis", {"type": typ, "stream": "upstream", "attributes": attrs})
            self.assertEqual((t["name"], t["type"], t["stream"], t["toxicity"], t["attributes"]),
                             (typ + "_upstream", typ, "upstream", 1, attrs))
        # Attributes not given are 0 (Go's zero values: toxics/*.go).
        t = self.add_toxic("redis", {"type": "slicer", "attributes": {"average_size": 8}})
        self.assertEqual(t["attributes"], {"average_size": 8, "size_variation": 0, "delay": 0})
        names = [x["name"] for x in self.ok("GET", "/proxies/redis/toxics")]
        self.assertEqual(sorted(names), sorted([typ + "_upstream" for typ, _ in readme] + ["slicer_downstream"]))

    def test_cli_example_latency_on_redis(self):
        # README "CLI Example", as HTTP: create, SET/GET, add a 1000 ms latency toxic
        # (each reply takes a second), remove it, delete the proxy (connection refused).
        p = self.create("redis", listen="127.0.0.1:0")
        port = self.port_of(p)
        with fk.RespConn(port) as c:
            self.assertEqual(c.call("SET", "omg", "pandas"), b"OK")
            r, dt = c.timed("GET", "omg")
            self.assertEqual(r, b"pandas")
            self.assertLess(dt, FAST_MAX)

        early = fk.RespConn(port)   # opened before the toxic: Toxiproxy adds toxics to live links
        self.addCleanup(early.close)
        self.assertEqual(early.call("PING"), b"PONG")

        # What `toxiproxy-cli toxic add -t latency -a latency=1000 redis` sends.
        # (cmd/cli/cli.go: the Go client posts an empty name, stream downstream, toxicity 1.)
        t = self.add_toxic("redis", {"name": "", "type": "latency", "stream": "downstream",
                                     "toxicity": 1, "attributes": {"latency": LATENCY_MS}})
        self.assertEqual(t["name"], "latency_downstream")
        with fk.RespConn(port) as c:
            r, dt = c.timed("GET", "omg")
            self.assertEqual(r, b"pandas")
            self.assertGreaterEqual(dt, SLOW_MIN, "GET through a 1000 ms latency toxic took %.3fs" % dt)
            r, dt = c.timed("DEL", "omg")
            self.assertEqual(r, b"1")
            self.assertGreaterEqual(dt, SLOW_MIN, "DEL through a 1000 ms latency toxic took %.3fs" % dt)
        r, dt = early.timed("PING")
        self.assertEqual(r, b"PONG")
        self.assertGreaterEqual(dt, SLOW_MIN, "a connection opened before the toxic was added "
                                "did not get it (%.3fs)" % dt)

        # `toxiproxy-cli toxic remove -n latency_downstream redis`
        st, _, _, _ = self.api.call("DELETE", "/proxies/redis/toxics/latency_downstream")
        self.assertEqual(st, 204)
        with fk.RespConn(port) as c:
            r, dt = c.timed("GET", "omg")
            self.assertIsNone(r)
            self.assertLess(dt, FAST_MAX)
        r, dt = early.timed("PING")
        self.assertEqual(r, b"PONG")
        self.assertLess(dt, FAST_MAX, "the removed toxic still delays an open connection")

        # `toxiproxy-cli delete redis`: "Could not connect ... Connection refused".
        st, _, _, _ = self.api.call("DELETE", "/proxies/redis")
        self.assertEqual(st, 204)
        self.assertTrue(h.eventually(lambda: refused(port), 10))

    def test_bandwidth_rate_zero_holds(self):
        # bandwidth.go: at rate 0 no byte leaves while the toxic is there; removing it delivers
        # what it held (its Interrupt writes the rest).
        port = self.port_of(self.create("redis"))
        c = fk.RespConn(port)
        self.addCleanup(c.close)
        self.assertEqual(c.call("PING"), b"PONG")
        self.add_toxic("redis", {"type": "bandwidth", "attributes": {"rate": 0}})
        c.sock.sendall(fk.resp_cmd("PING"))
        c.sock.settimeout(1.0)
        with self.assertRaises(socket.timeout, msg="a reply came through bandwidth rate 0"):
            c.sock.recv(100)    # nothing, and no end of stream (recv would return b"")
        c.sock.settimeout(10)
        st, _, _, _ = self.api.call("DELETE", "/proxies/redis/toxics/bandwidth_downstream")
        self.assertEqual(st, 204)
        self.assertEqual(c.read_reply(), b"PONG")
        self.assertEqual(c.call("PING"), b"PONG")

    def test_slicer_halves_a_reply(self):
        # slicer.go: a chunk is halved until the pieces are at most average + variation:
        # 1700 -> 850 -> 425 -> 212/213 -> 106 -> 53/54, 32 pieces, each followed by `delay`.
        port = self.port_of(self.create("redis"))
        value = b"v" * 1691             # "$1691\r\n" + 1691 + "\r\n": a 1700-byte reply
        c = fk.RespConn(port)
        self.addCleanup(c.close)
        self.assertEqual(c.call("SET", "sliced", value), b"OK")
        self.add_toxic("redis", {"type": "slicer", "attributes": {
            "average_size": 100, "size_variation": 0, "delay": 20000}})
        t0 = time.monotonic()
        c.sock.sendall(fk.resp_cmd("GET", "sliced"))
        sizes, got = [], b""
        while len(got) < 1700:
            data = c.sock.recv(4096)
            self.assertTrue(data, "closed after %d bytes" % len(got))
            sizes.append(len(data))
            got += data
        dt = time.monotonic() - t0
        self.assertEqual(got, b"$1691\r\n" + value + b"\r\n")
        # 20 ms apart, each piece comes in a read of its own; a slow reader may join a few.
        self.assertGreaterEqual(len(sizes), 24, sizes)
        self.assertLessEqual(len(sizes), 40, sizes)
        self.assertGreaterEqual(sum(1 for n in sizes if n in (53, 54)), len(sizes) * 3 // 4, sizes)
        self.assertGreaterEqual(dt, 0.6, "32 pieces 20 ms apart in %.3fs" % dt)

    def test_down_and_up(self):
        # README "down": POST /proxies/{proxy} with enabled false takes the proxy down;
        # true brings it back.
        p = self.create("redis")
        port = self.port_of(p)
        self.add_toxic("redis", {"type": "latency", "attributes": {"latency": 5}})
        live = fk.RespConn(port)
        self.addCleanup(live.close)
        self.assertEqual(live.call("PING"), b"PONG")

        d = self.ok("POST", "/proxies/redis", {"enabled": False})
        self.assert_proxy(d, "redis", enabled=False, ntoxics=1)
        self.assertTrue(refused(port), "a disabled proxy accepts new connections")
        h.wait_closed(live.sock, 10)

        e = self.ok("POST", "/proxies/redis", {"enabled": True})
        self.assert_proxy(e, "redis", enabled=True, ntoxics=1)
        self.assertEqual(e["listen"], p["listen"])
        with fk.RespConn(port) as c:
            self.assertEqual(c.call("PING"), b"PONG")

    def test_populate(self):
        # README "Populating Proxies" and "2. Populating Toxiproxy".
        a_port, b_port = h.free_port(), h.free_port()
        conf = [{"name": "shopify_test_redis_master", "listen": "127.0.0.1:%d" % a_port,
                 "upstream": self.upstream},
                {"name": "shopify_test_mysql_master", "listen": "127.0.0.1:%d" % b_port,
                 "upstream": "127.0.0.1:%d" % h.free_port(), "enabled": True}]
        js = self.ok("POST", "/populate", conf, status=201)
        self.assertEqual([p["name"] for p in js["proxies"]],
                         ["shopify_test_redis_master", "shopify_test_mysql_master"])
        for got, want in zip(js["proxies"], conf):
            self.assert_proxy(got, want["name"], upstream=want["upstream"])
            self.assertEqual(got["listen"], want["listen"])

        # Safe to call again: an unchanged proxy keeps its toxics and its connections.
        self.add_toxic("shopify_test_redis_master", {"type": "latency", "attributes": {"latency": 1}})
        live = fk.RespConn(a_port)
        self.addCleanup(live.close)
        self.assertEqual(live.call("PING"), b"PONG")
        js = self.ok("POST", "/populate", conf, status=201)
        self.assertEqual(len(js["proxies"]), 2)
        self.assertEqual(len(js["proxies"][0]["toxics"]), 1, js)
        self.assertEqual(live.call("PING"), b"PONG")

        # A changed upstream replaces the proxy (a new one, without toxics).
        conf[0]["upstream"] = "127.0.0.1:%d" % h.free_port()
        js = self.ok("POST", "/populate", conf[:1], status=201)
        self.assert_proxy(js["proxies"][0], "shopify_test_redis_master", upstream=conf[0]["upstream"])
        self.assertIn("shopify_test_mysql_master", self.ok("GET", "/proxies"))

        # Checked before anything is created.
        st, _, data, js = self.api.call("POST", "/populate", [
            {"name": "one_more", "listen": "127.0.0.1:%d" % h.free_port(), "upstream": self.upstream},
            {"name": "", "upstream": self.upstream}])
        self.assertEqual(st, 400, data)
        self.assertEqual((js["error"], js["status"]), ("missing required field: name at proxy 2", 400))
        self.assertNotIn("one_more", self.ok("GET", "/proxies"))

    def test_reset(self):
        # README "Endpoints": POST /reset - Enable all proxies and remove all active toxics.
        p = self.create("one")
        q = self.create("two")
        self.add_toxic("one", {"type": "latency", "attributes": {"latency": 1000}})
        self.add_toxic("two", {"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 1}})
        self.ok("POST", "/proxies/two", {"enabled": False})
        st, _, data, _ = self.api.call("POST", "/reset")
        self.assertEqual((st, data), (204, b""))
        all_ = self.ok("GET", "/proxies")
        self.assert_proxy(all_["one"], "one")
        self.assert_proxy(all_["two"], "two")
        with fk.RespConn(self.port_of(q)) as c:
            self.assertEqual(c.call("PING"), b"PONG")
        with fk.RespConn(self.port_of(p)) as c:
            r, dt = c.timed("PING")
            self.assertLess(dt, FAST_MAX)

    def test_update_upstream_drops_connections(self):
        # README "Proxy fields": changing listen or upstream restarts the proxy and drops
        # any active connections.
        p = self.create("redis")
        port = self.port_of(p)
        live = fk.RespConn(port)
        self.addCleanup(live.close)
        self.assertEqual(live.call("PING"), b"PONG")
        other = h.start_redis(self.tmp)
        self.addCleanup(other.stop)
        up = self.ok("POST", "/proxies/redis", {"upstream": "127.0.0.1:%d" % other.port})
        self.assert_proxy(up, "redis", upstream="127.0.0.1:%d" % other.port)
        h.wait_closed(live.sock, 10)
        with fk.RespConn(port) as c:
            self.assertEqual(c.call("SET", "where", "other"), b"OK")
        self.assertEqual(other.command("GET", "where"), b"other")


class TwiceToxiproxyApiTest(ToxiproxyApiCase, ck.BrokerCase):
    KIND = "twice"


@unittest.skipUnless(os.environ.get("TOXIPROXY_SERVER"), "TOXIPROXY_SERVER not set")
class RealToxiproxyApiTest(ToxiproxyApiCase, ck.BrokerCase):
    KIND = "toxiproxy"


if __name__ == "__main__":
    unittest.main()
