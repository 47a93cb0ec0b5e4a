#!/usr/bin/python3
"""Toxiproxy and twice side by side.

1. The same ~75 HTTP requests, in the same order, to a real Toxiproxy and to
   twice's `toxiproxy-api`: every answer whose status, Content-Type, request
   id header or body (ports masked) differs is printed, both versions.
2. Each Toxiproxy toxic on real traffic through both servers (an upstream
   that sends N bytes then closes, or echoes): what a client sees, as bytes
   received, how the connection ended (EOF, RST, still open) and seconds.

Not a test (nothing is asserted): the measurement behind the list of
differences in docs/toxiproxy.md, run by scripts/toxiproxy-oracle.sh, which
builds the toxiproxy-server. Environment: TOXIPROXY_SERVER, TWICE_BIN.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

KINDS = ("toxiproxy", "twice")


def start(kind, tmp, upstream_port):
    """A Toxiproxy-speaking server on a free port: (process, port)."""
    port = h.free_port()
    if kind == "toxiproxy":
        argv = [os.environ["TOXIPROXY_SERVER"], "-host", "127.0.0.1", "-port", str(port)]
    else:
        conf = os.path.join(tmp, "twice.conf")
        with open(conf, "w") as f:
            f.write("seed 7\ntoxiproxy-api 127.0.0.1:%d\n" % port
                    + h.config(h.listen_block("file_redis", h.free_port(), upstream_port)))
        argv = [os.environ.get("TWICE_BIN", h.TWICE_BIN), "run", "-c", conf]
    p = h.spawn(argv, log_path=os.path.join(tmp, kind + ".log"))
    h.wait_until(lambda: h.port_open(port), 20, what="%s's API" % kind)
    return p, port


def stop(p):
    h.kill_group(p)
    p.wait()


def curl(base, method, path, data=None, agent="toxiproxy-cli"):
    """(status, headers, body) of one request made by curl."""
    argv = ["curl", "-sS", "-i", "-X", method, "-A", agent, "--max-time", "20"]
    if data is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", data]
    argv.append(base + path)
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head, _, body = r.stdout.decode("latin-1").partition("\r\n\r\n")
    lines = head.split("\r\n")
    status = lines[0].split(" ", 2)[1] if lines[0] else "?"
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body


# ---------------------------------------------------------------------------
# 1. the API, answer by answer

def api_requests(up, p1, p2, p3):
    """(method, path, body text or None): the sequence both servers get."""
    def j(v):
        return json.dumps(v)

    def tox(v):
        return ("POST", "/proxies/r/toxics", j(v))

    local = "127.0.0.1:%d"
    return [
        ("GET", "/version", None), ("GET", "/proxies", None),
        ("POST", "/proxies", j({"name": "r", "listen": local % p1, "upstream": up})),
        ("POST", "/proxies", j({"name": "r", "listen": local % p1, "upstream": up})),
        ("POST", "/proxies", j({"name": "z", "listen": "localhost:0", "upstream": up})),
        ("POST", "/proxies", j({"name": "d", "listen": "localhost:0", "upstream": up, "enabled": False})),
        ("POST", "/proxies", j({"Name": "caps", "Listen": "127.0.0.1:0", "Upstream": up, "extra": 1})),
        ("POST", "/proxies", j({"name": "hostup", "listen": "127.0.0.1:0",
                                "upstream": "somehost.invalid:12345"})),
        ("POST", "/proxies", j({"name": "bad", "listen": local % p1, "upstream": up})),
        ("POST", "/proxies", j({"name": "badaddr", "listen": "nonsense", "upstream": up})),
        ("POST", "/proxies", ""), ("POST", "/proxies", "null"), ("POST", "/proxies", "[]"),
        ("POST", "/proxies", "{bad"), ("POST", "/proxies", j({"name": 5, "upstream": up})),
        ("POST", "/proxies", j({"listen": "x"})), ("POST", "/proxies", j({"name": "nu"})),
        ("PUT", "/proxies", None), ("GET", "/nothing", None), ("GET", "/proxies/", None),
        ("HEAD", "/version", None),
        tox({"type": "latency", "attributes": {"latency": 100}}),
        tox({"type": "latency", "stream": "UpStream", "toxicity": 0.2}),
        tox({"type": "bogus"}), tox({"stream": "upstream"}), tox({"type": "latency", "stream": ""}),
        tox({"type": "latency", "attributes": {"latency": "x"}}),
        tox({"name": "lx", "type": "latency", "attributes": {"latency": "x"}}),
        tox({"name": "lf", "type": "latency", "attributes": {"latency": 1.5}}),
        tox({"name": "tox5", "type": "latency", "toxicity": 5}),
        tox({"name": "toxs", "type": "latency", "toxicity": "1"}),
        tox({"name": "b", "type": "bandwidth"}), tox({"name": "sc", "type": "slow_close"}),
        tox({"name": "to", "type": "timeout"}),
        tox({"name": "rp", "type": "reset_peer", "stream": "upstream"}),
        tox({"name": "sl", "type": "slicer", "attributes": {"average_size": 10, "extra": 3}}),
        tox({"name": "ld", "type": "limit_data", "attributes": {"bytes": 100}}),
        tox({"name": "no", "type": "noop"}),
        tox({"name": "", "type": "bandwidth", "stream": "upstream", "toxicity": 1, "attributes": {"rate": 5}}),
        ("POST", "/proxies/r/toxics", ""), ("POST", "/proxies/r/toxics", "null"),
        ("PATCH", "/proxies/r/toxics/latency_downstream", j({"attributes": {"jitter": 5}})),
        ("POST", "/proxies/r/toxics/latency_downstream",
         j({"toxicity": 0.5, "type": "bandwidth", "stream": "upstream", "name": "renamed"})),
        ("PATCH", "/proxies/r/toxics/latency_downstream", ""),
        ("PATCH", "/proxies/r/toxics/latency_downstream", j({"attributes": {"latency": "x"}})),
        ("GET", "/proxies/r/toxics/latency_downstream", None),
        ("GET", "/proxies/r/toxics", None), ("GET", "/proxies/r", None), ("GET", "/proxies", None),
        ("PATCH", "/proxies/r", j({"enabled": False})), ("GET", "/proxies/r", None),
        ("PATCH", "/proxies/r", j({"name": "other", "enabled": True})),
        ("POST", "/proxies/r", j({"listen": local % p2})),
        ("POST", "/proxies/r", j({"listen": "bad"})),
        ("POST", "/proxies/r", ""),
        ("POST", "/proxies/r", j({"upstream": "elsewhere.invalid:1"})),
        ("POST", "/populate", "[]"),
        ("POST", "/populate", j([{"name": "a", "upstream": up, "listen": local % p3}, {"name": ""}])),
        ("POST", "/populate", j([{"name": "a", "upstream": up, "listen": local % p3},
                                 {"name": "b2", "upstream": up, "listen": "local373"}])),
        ("POST", "/populate", j([{"name": "a", "upstream": up, "listen": local % p3, "enabled": False}])),
        ("POST", "/populate", j([{"name": "a", "upstream": up, "listen": "localhost:%d" % p3}])),
        ("POST", "/populate", "{}"), ("POST", "/populate", ""), ("POST", "/populate", "null"),
        ("GET", "/metrics", None), ("GET", "/proxies", None),
        ("DELETE", "/proxies/r/toxics/latency_UpStream", None),
        ("DELETE", "/proxies/r/toxics/latency_UpStream", None),
        ("DELETE", "/proxies/nope", None), ("DELETE", "/proxies/nope/toxics/x", None),
        ("POST", "/reset", None), ("POST", "/reset", "garbage"), ("GET", "/proxies", None),
        ("DELETE", "/proxies/r", None), ("GET", "/proxies/r", None),
    ]


def compare_api(redis_port):
    up = "127.0.0.1:%d" % redis_port
    p1, p2, p3 = h.free_port(), h.free_port(), h.free_port()
    names = {redis_port: "redis", p1: "P1", p2: "P2", p3: "P3"}
    reqs = api_requests(up, p1, p2, p3)

    def mask(text):
        for port, name in names.items():
            text = text.replace(":%d" % port, ":<%s>" % name)
        return re.sub(r"127\.0\.0\.1:\d{4,5}", "127.0.0.1:<port>", text)

    answers, loggers = {}, 0
    for kind in KINDS:
        p, port = start(kind, h.make_tmpdir("toxiproxy-compare-%s-" % kind), redis_port)
        base = "http://127.0.0.1:%d" % port
        out = []
        for method, path, data in reqs + [("GET", "/proxies", None)]:
            agent = "Mozilla/5.0 (X11)" if len(out) == len(reqs) else "toxiproxy-cli"
            status, hdrs, body = curl(base, method, path, data, agent=agent)
            body = mask(body)
            if kind == "toxiproxy" and '"Logger":{},' in body:
                # Toxiproxy's logger struct leaks into its proxy JSON (proxy.go); no client reads it.
                loggers += 1
                body = body.replace('"Logger":{},', "")
            out.append((status, hdrs.get("content-type", "-"),
                        "request-id" if "x-toxiproxy-request-id" in hdrs else "-", body))
        answers[kind] = out
        stop(p)
    labels = ["%s %s %s" % (m, path, (data or "")[:70]) for m, path, data in reqs]
    labels.append("GET /proxies, User-Agent Mozilla/5.0")
    differ = 0
    for i, label in enumerate(labels):
        a, b = answers["toxiproxy"][i], answers["twice"][i]
        if a == b:
            continue
        differ += 1
        print("### %s" % label)
        for what, x, y in zip(("status", "content-type", "request id", "body"), a, b):
            if x != y:
                print("  %s\n    toxiproxy: %r\n    twice:     %r" % (what, x, y))
    print("%d requests, %d answers differ (Toxiproxy's \"Logger\":{} member taken out of %d answers "
          "first)" % (len(labels), differ, loggers))


# ---------------------------------------------------------------------------
# 2. the toxics, on traffic

PATTERN = bytes(i % 251 for i in range(1 << 17))


class Sender(h.ThreadedServer):
    """Reads one line: "N" sends N bytes of PATTERN then closes (FIN); "E"
    echoes everything until the client closes."""

    def handle(self, c):
        line = b""
        while not line.endswith(b"\n"):
            b = c.recv(1)
            if not b:
                return
            line += b
        if line.startswith(b"E"):
            while True:
                data = c.recv(65536)
                if not data:
                    return
                c.sendall(data)
        c.sendall(PATTERN[:int(line)])
        h._finish(c)  # FIN, then wait for the client's close


def connect(port):
    return h.connect(port, timeout=20)


def read_all(s, timeout=20):
    """(bytes, how it ended: eof | rst | open, seconds, recv calls that returned data)."""
    t0 = time.monotonic()
    data, n = b"", 0
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return data, "eof", time.monotonic() - t0, n
            data += d
            n += 1
    except ConnectionResetError:
        return data, "rst", time.monotonic() - t0, n
    except socket.timeout:
        return data, "open", time.monotonic() - t0, n


def seen(r, t0=None):
    data, how, dt, _ = r
    return "%d B %s %.2fs" % (len(data), how, dt if t0 is None else time.monotonic() - t0)


class Toxics:
    """The scenarios, against one server's API at base, proxies in front of up."""

    def __init__(self, base, up):
        self.base, self.up = base, up

    def api(self, method, path, body=None):
        status, _, text = curl(self.base, method, path, json.dumps(body) if body is not None else None)
        return status, text

    def proxy(self, name, toxic=None):
        status, text = self.api("POST", "/proxies", {"name": name, "listen": "127.0.0.1:0",
                                                     "upstream": self.up})
        assert status == "201", (status, text)
        if toxic is not None:
            self.toxic(name, toxic)
        return int(json.loads(text)["listen"].rsplit(":", 1)[1])

    def toxic(self, proxy, body):
        status, text = self.api("POST", "/proxies/%s/toxics" % proxy, body)
        assert status == "200", (proxy, body, status, text)

    def fetch(self, port, n, timeout=20):
        with connect(port) as s:
            s.sendall(b"%d\n" % n)
            return read_all(s, timeout)

    def echo(self, port, first=b""):
        s = connect(port)
        s.sendall(b"E\n" + first)
        if first:
            s.settimeout(5)
            s.recv(len(first))
        return s

    def run(self):
        r = {}
        p = self.proxy("lat", {"type": "latency", "attributes": {"latency": 300}})
        r["latency 300: a 10 B reply"] = seen(self.fetch(p, 10))
        self.toxic("lat", {"name": "j", "type": "latency", "stream": "upstream",
                           "attributes": {"latency": 0, "jitter": 200}})
        r["latency 300 + upstream jitter 200: 5 replies"] = " ".join(
            "%.2f" % self.fetch(p, 10)[2] for _ in range(5))

        p = self.proxy("bw", {"type": "bandwidth", "attributes": {"rate": 50}})
        r["bandwidth 50: a 100000 B reply"] = seen(self.fetch(p, 100000))
        p = self.proxy("bw0", {"type": "bandwidth", "attributes": {"rate": 0}})
        r["bandwidth 0: a 1000 B reply, 2 s wait"] = seen(self.fetch(p, 1000, timeout=2))

        p = self.proxy("sc", {"type": "slow_close", "attributes": {"delay": 500}})
        r["slow_close 500: 10 B then the upstream's FIN"] = seen(self.fetch(p, 10))
        p = self.proxy("sc2", {"type": "slow_close", "stream": "upstream", "attributes": {"delay": 500}})
        with self.echo(p, b"x") as s:
            s.shutdown(socket.SHUT_WR)
            r["slow_close 500 upstream: the client half-closes"] = seen(read_all(s, 5))

        p = self.proxy("to", {"type": "timeout", "attributes": {"timeout": 500}})
        with self.echo(p) as s:
            t0 = time.monotonic()
            s.sendall(b"a")
            time.sleep(0.3)
            s.sendall(b"b")
            r["timeout 500, echo, data at 0 and 0.3 s"] = seen(read_all(s, 5), t0)
        p = self.proxy("to2")
        with self.echo(p, b"x") as s:
            t0 = time.monotonic()
            self.toxic("to2", {"type": "timeout", "attributes": {"timeout": 500}})
            r["timeout 500 added to an open idle connection"] = seen(read_all(s, 5), t0)
        p = self.proxy("t0", {"type": "timeout", "attributes": {"timeout": 0}})
        with self.echo(p) as s:
            s.sendall(b"hello")
            r["timeout 0: echo, 1.5 s wait"] = seen(read_all(s, 1.5))
            status, _ = self.api("DELETE", "/proxies/t0/toxics/timeout_downstream")
            s.sendall(b"more")
            r["timeout 0 removed: its open connection"] = status + " " + seen(read_all(s, 3))
        p = self.proxy("t00", {"type": "timeout", "toxicity": 0, "attributes": {"timeout": 0}})
        with self.echo(p, b"hello") as s:
            status, _ = self.api("DELETE", "/proxies/t00/toxics/timeout_downstream")
            s.sendall(b"more")
            r["timeout with toxicity 0 removed: the open connection"] = status + " " + seen(read_all(s, 2))

        p = self.proxy("rp", {"type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 0}})
        with connect(p) as s:
            idle = read_all(s, 0.3)[1]
            s.sendall(b"10\n")
            r["reset_peer 0 upstream: idle 0.3 s / then data"] = idle + " / " + seen(read_all(s, 5))
        p = self.proxy("rp2")
        with self.echo(p, b"hi") as s:
            self.toxic("rp2", {"type": "reset_peer", "attributes": {"timeout": 300}})
            s.sendall(b"again")
            r["reset_peer 300 added to an open connection, then data"] = seen(read_all(s, 5))

        p = self.proxy("sl", {"type": "slicer",
                              "attributes": {"average_size": 10, "size_variation": 0, "delay": 20000}})
        res = self.fetch(p, 100)
        r["slicer 10/0/20000 us: a 100 B reply"] = seen(res) + " in %d reads" % res[3]

        p = self.proxy("ld", {"type": "limit_data", "attributes": {"bytes": 100}})
        res = self.fetch(p, 1000)
        r["limit_data 100: a 1000 B reply"] = seen(res) + (" (the first 100 B)" if res[0] == PATTERN[:100] else "")

        p = self.proxy("tx0", {"type": "latency", "toxicity": 0, "attributes": {"latency": 500}})
        r["latency 500, toxicity 0: 3 replies"] = " ".join("%.2f" % self.fetch(p, 10)[2] for _ in range(3))
        p = self.proxy("tx5", {"type": "latency", "toxicity": 0.5, "attributes": {"latency": 200}})
        r["latency 200, toxicity 0.5: slow ones of 20 connections"] = str(
            sum(self.fetch(p, 10)[2] > 0.15 for _ in range(20)))

        p = self.proxy("lq", {"type": "latency", "attributes": {"latency": 3000}})
        with connect(p) as s:
            s.sendall(b"10\n")
            time.sleep(0.3)
            self.api("DELETE", "/proxies/lq/toxics/latency_downstream")
            r["latency 3000 removed 0.3 s after a request"] = seen(read_all(s, 5))
        return r


def compare_toxics():
    up = Sender(name="sender")
    res = {}
    for kind in KINDS:
        p, port = start(kind, h.make_tmpdir("toxiproxy-compare-%s-" % kind), up.port)
        res[kind] = Toxics("http://127.0.0.1:%d" % port, "127.0.0.1:%d" % up.port).run()
        stop(p)
    up.close()
    for k, a in res["toxiproxy"].items():
        b = res["twice"][k]
        print("%s %-56s | toxiproxy: %-26s | twice: %s" % (" " if a == b else "*", k, a, b))


if __name__ == "__main__":
    redis = h.start_redis(h.make_tmpdir("toxiproxy-compare-"))
    print("== the same requests to both servers: the answers that differ")
    compare_api(redis.port)
    print("== each toxic on traffic (* where the two differ)")
    compare_toxics()
    redis.stop()
