#!/usr/bin/python3
"""Toxiproxy and twice side by side: the same HTTP requests to both (answers
compared byte for byte, ports masked), then each Toxiproxy toxic on real
traffic through both (what a client sees: bytes, EOF or RST, seconds).
Prints only what differs in the first part, a table for the second.

Not a test (nothing is asserted): the measurement behind the list of
differences in docs/toxiproxy.md. Needs TOXIPROXY_SERVER (a toxiproxy-server,
see scripts/toxiproxy-oracle.sh) and TWICE_BIN; run by toxiproxy-oracle.sh.
"""
import json, os, re, socket, subprocess, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h

def curl(base, method, path, data=None, agent="toxiproxy-cli", extra=()):
    argv = ["curl", "-sS", "-i", "-X", method, "-A", agent, "--max-time", "20"] + list(extra)
    if data is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", data]
    argv.append(base + path)
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    raw = r.stdout.decode("latin-1")
    head, _, body = raw.partition("\r\n\r\n")
    lines = head.split("\r\n")
    status = lines[0].split(" ", 2)[1] if lines and lines[0] else "?"
    hdrs = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body

def norm(s, ports):
    for p, name in ports.items():
        s = s.replace(":%d" % p, ":<%s>" % name)
    s = re.sub(r"127\.0\.0\.1:\d{4,5}", "127.0.0.1:<port>", s)
    return s

def start(kind, tmp, redis_port):
    port = h.free_port()
    if kind == "toxiproxy":
        p = h.spawn([os.environ["TOXIPROXY_SERVER"], "-host", "127.0.0.1", "-port", str(port)],
                    log_path=os.path.join(tmp, "tp.log"))
    else:
        conf = os.path.join(tmp, "t.conf")
        open(conf, "w").write("seed 7\ntoxiproxy-api 127.0.0.1:%d\n" % port + h.config(h.listen_block("file_redis", h.free_port(), redis_port)))
        p = h.spawn([os.environ["TWICE_BIN"], "run", "-c", conf], log_path=os.path.join(tmp, "twice.log"))
    h.wait_until(lambda: h.port_open(port), 20)
    return p, port



def compare_api(redis_port):
    U = "127.0.0.1:%d" % redis_port
    P1, P2, P3 = h.free_port(), h.free_port(), h.free_port()
    ports = {redis_port: "redis", P1: "P1", P2: "P2", P3: "P3"}
    reqs = [
     ("GET", "/version", None), ("GET", "/proxies", None),
     ("POST", "/proxies", json.dumps({"name": "r", "listen": "127.0.0.1:%d" % P1, "upstream": U})),
     ("POST", "/proxies", json.dumps({"name": "r", "listen": "127.0.0.1:%d" % P1, "upstream": U})),
     ("POST", "/proxies", json.dumps({"name": "z", "listen": "localhost:0", "upstream": U})),
     ("POST", "/proxies", json.dumps({"name": "d", "listen": "localhost:0", "upstream": U, "enabled": False})),
     ("POST", "/proxies", json.dumps({"Name": "caps", "Listen": "127.0.0.1:0", "Upstream": U, "extra": 1})),
     ("POST", "/proxies", json.dumps({"name": "hostup", "listen": "127.0.0.1:0", "upstream": "somehost.invalid:12345"})),
     ("POST", "/proxies", json.dumps({"name": "bad", "listen": "127.0.0.1:%d" % P1, "upstream": U})),
     ("POST", "/proxies", json.dumps({"name": "badaddr", "listen": "nonsense", "upstream": U})),
     ("POST", "/proxies", ""), ("POST", "/proxies", "null"), ("POST", "/proxies", "[]"), ("POST", "/proxies", "{bad"),
     ("POST", "/proxies", json.dumps({"name": 5, "upstream": U})),
     ("POST", "/proxies", json.dumps({"listen": "x"})), ("POST", "/proxies", json.dumps({"name": "nu"})),
     ("PUT", "/proxies", None), ("GET", "/nothing", None), ("GET", "/proxies/", None), ("HEAD", "/version", None),
     ("POST", "/proxies/r/toxics", json.dumps({"type": "latency", "attributes": {"latency": 100}})),
     ("POST", "/proxies/r/toxics", json.dumps({"type": "latency", "stream": "UpStream", "toxicity": 0.2})),
     ("POST", "/proxies/r/toxics", json.dumps({"type": "bogus"})),
     ("POST", "/proxies/r/toxics", json.dumps({"stream": "upstream"})),
     ("POST", "/proxies/r/toxics", json.dumps({"type": "latency", "stream": ""})),
     ("POST", "/proxies/r/toxics", json.dumps({"type": "latency", "attributes": {"latency": "x"}})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "lx", "type": "latency", "attributes": {"latency": "x"}})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "lf", "type": "latency", "attributes": {"latency": 1.5}})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "tox5", "type": "latency", "toxicity": 5})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "toxs", "type": "latency", "toxicity": "1"})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "b", "type": "bandwidth"})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "sc", "type": "slow_close"})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "to", "type": "timeout"})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "rp", "type": "reset_peer", "stream": "upstream"})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "sl", "type": "slicer", "attributes": {"average_size": 10, "extra": 3}})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "ld", "type": "limit_data", "attributes": {"bytes": 100}})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "no", "type": "noop"})),
     ("POST", "/proxies/r/toxics", json.dumps({"name": "", "type": "bandwidth", "stream": "upstream", "toxicity": 1, "attributes": {"rate": 5}})),
     ("POST", "/proxies/r/toxics", ""), ("POST", "/proxies/r/toxics", "null"),
     ("PATCH", "/proxies/r/toxics/latency_downstream", json.dumps({"attributes": {"jitter": 5}})),
     ("POST", "/proxies/r/toxics/latency_downstream", json.dumps({"toxicity": 0.5, "type": "bandwidth", "stream": "upstream", "name": "renamed"})),
     ("PATCH", "/proxies/r/toxics/latency_downstream", ""),
     ("PATCH", "/proxies/r/toxics/latency_downstream", json.dumps({"attributes": {"latency": "x"}})),
     ("GET", "/proxies/r/toxics/latency_downstream", None),
     ("GET", "/proxies/r/toxics", None), ("GET", "/proxies/r", None), ("GET", "/proxies", None),
     ("PATCH", "/proxies/r", json.dumps({"enabled": False})), ("GET", "/proxies/r", None),
     ("PATCH", "/proxies/r", json.dumps({"name": "other", "enabled": True})),
     ("POST", "/proxies/r", json.dumps({"listen": "127.0.0.1:%d" % P2})),
     ("POST", "/proxies/r", json.dumps({"listen": "bad"})),
     ("POST", "/proxies/r", ""),
     ("POST", "/proxies/r", json.dumps({"upstream": "elsewhere.invalid:1"})),
     ("POST", "/populate", "[]"),
     ("POST", "/populate", json.dumps([{"name": "a", "upstream": U, "listen": "127.0.0.1:%d" % P3}, {"name": ""}])),
     ("POST", "/populate", json.dumps([{"name": "a", "upstream": U, "listen": "127.0.0.1:%d" % P3}, {"name": "b2", "upstream": U, "listen": "local373"}])),
     ("POST", "/populate", json.dumps([{"name": "a", "upstream": U, "listen": "127.0.0.1:%d" % P3, "enabled": False}])),
     ("POST", "/populate", json.dumps([{"name": "a", "upstream": U, "listen": "localhost:%d" % P3}])),
     ("POST", "/populate", "{}"), ("POST", "/populate", ""), ("POST", "/populate", "null"),
     ("GET", "/metrics", None),
     ("GET", "/proxies", None),
     ("DELETE", "/proxies/r/toxics/latency_UpStream", None), ("DELETE", "/proxies/r/toxics/latency_UpStream", None),
     ("DELETE", "/proxies/nope", None), ("DELETE", "/proxies/nope/toxics/x", None),
     ("POST", "/reset", None), ("POST", "/reset", "garbage"), ("GET", "/proxies", None),
     ("DELETE", "/proxies/r", None), ("GET", "/proxies/r", None),
    ]
    results = {}
    for kind in ("toxiproxy", "twice"):
        d = h.make_tmpdir("toxiproxy-compare-%s-" % kind)
        p, port = start(kind, d, redis_port)
        base = "http://127.0.0.1:%d" % port
        out = []
        for m, path, data in reqs:
            st, hd, body = curl(base, m, path, data)
            out.append((st, hd.get("content-type", "-"), "reqid" if "x-toxiproxy-request-id" in hd else "-", norm(body, ports)))
        st, hd, body = curl(base, "GET", "/proxies", agent="Mozilla/5.0 (X11)")
        out.append((st, hd.get("content-type", "-"), "-", body))
        results[kind] = out
        h.kill_group(p); p.wait()
    labels = ["%s %s %s" % (m, path, (data or "")[:70]) for m, path, data in reqs] + ["GET /proxies as Mozilla"]
    nd = 0
    for i, lab in enumerate(labels):
        a, b = results["toxiproxy"][i], results["twice"][i]
        if a != b:
            nd += 1
            print("### %s" % lab)
            for k, x, y in zip(("status", "ctype", "reqid", "body"), a, b):
                if x != y:
                    print("  %s\n    toxiproxy: %r\n    twice:     %r" % (k, x, y))
    print("%d requests, %d differ" % (len(labels), nd))


class Sender(h.ThreadedServer):
    """Reads 'N\n', sends N bytes ('x' pattern), then closes (FIN). 'E' = echo mode."""
    def handle(self, c):
        line = b""
        while not line.endswith(b"\n"):
            b = c.recv(1)
            if not b:
                return
            line += b
        if line.startswith(b"E"):
            while True:
                d = c.recv(65536)
                if not d:
                    return
                c.sendall(d)
        n = int(line)
        c.sendall(bytes((i % 251 for i in range(n))))
        c.shutdown(socket.SHUT_WR)
        try:
            c.settimeout(10)
            while c.recv(65536):
                pass
        except OSError:
            pass

def api(base, m, path, body=None):
    st, hd, b = curl(base, m, path, json.dumps(body) if body is not None else None)
    return st, b

def conn(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def read_all(s, timeout=20):
    """(bytes, how it ended: 'eof'|'rst'|'timeout', seconds, nchunks)"""
    t0 = time.monotonic(); data = b""; n = 0
    s.settimeout(timeout)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return data, "eof", time.monotonic() - t0, n
            data += d; n += 1
    except ConnectionResetError:
        return data, "rst", time.monotonic() - t0, n
    except socket.timeout:
        return data, "timeout", time.monotonic() - t0, n

def scenario(kind, base, up):
    R = {}
    def proxy(name):
        st, b = api(base, "POST", "/proxies", {"name": name, "listen": "127.0.0.1:0", "upstream": up})
        assert st == "201", (st, b)
        return int(json.loads(b)["listen"].rsplit(":", 1)[1])
    def tox(name, body):
        st, b = api(base, "POST", "/proxies/%s/toxics" % name, body)
        assert st == "200", (name, body, st, b)
    def fetch(port, n, timeout=20):
        s = conn(port); s.sendall(b"%d\n" % n); r = read_all(s, timeout); s.close(); return r
    # latency 300 downstream
    p = proxy("lat"); tox("lat", {"type": "latency", "attributes": {"latency": 300}})
    d, how, dt, _ = fetch(p, 10); R["latency 300ms: 10 B reply"] = "%d B %s %.2fs" % (len(d), how, dt)
    # jitter
    tox("lat", {"name": "j", "type": "latency", "stream": "upstream", "attributes": {"latency": 0, "jitter": 200}})
    ts = []
    for _ in range(5):
        d, how, dt, _ = fetch(p, 10); ts.append(dt)
    R["latency 300 + upstream jitter 200 (5 runs)"] = " ".join("%.2f" % x for x in ts)
    # bandwidth 50 KB/s, 100000 B
    p = proxy("bw"); tox("bw", {"type": "bandwidth", "attributes": {"rate": 50}})
    d, how, dt, _ = fetch(p, 100000); R["bandwidth rate 50: 100000 B"] = "%d B %s %.2fs" % (len(d), how, dt)
    # slow_close 500
    p = proxy("sc"); tox("sc", {"type": "slow_close", "attributes": {"delay": 500}})
    d, how, dt, _ = fetch(p, 10); R["slow_close 500: 10 B then upstream FIN"] = "%d B %s %.2fs" % (len(d), how, dt)
    # timeout 500 downstream on an echo connection: data at 0 and 0.3 s
    p = proxy("to"); tox("to", {"type": "timeout", "attributes": {"timeout": 500}})
    s = conn(p); s.sendall(b"E\n"); t0 = time.monotonic(); s.sendall(b"a"); time.sleep(0.3); s.sendall(b"b")
    d, how, dt, _ = read_all(s, 5); s.close()
    R["timeout 500 downstream, echo, data at 0 and 0.3s"] = "%d B %s %.2fs" % (len(d), how, time.monotonic() - t0)
    # timeout 500 added to a live idle echo connection
    p = proxy("to2"); s = conn(p); s.sendall(b"E\n"); s.sendall(b"x"); s.settimeout(5); s.recv(5)
    t0 = time.monotonic(); tox("to2", {"type": "timeout", "attributes": {"timeout": 500}})
    d, how, dt, _ = read_all(s, 5); s.close()
    R["timeout 500 added to a live idle echo connection"] = "%d B %s %.2fs" % (len(d), how, time.monotonic() - t0)
    # timeout 0: held; removing closes?
    p = proxy("t0"); tox("t0", {"type": "timeout", "attributes": {"timeout": 0}})
    s = conn(p); s.sendall(b"E\n"); s.sendall(b"hello")
    d, how, dt, _ = read_all(s, 1.5)
    R["timeout 0, echo: 1.5 s wait"] = "%d B %s" % (len(d), how)
    st, _ = api(base, "DELETE", "/proxies/t0/toxics/timeout_downstream")
    s.sendall(b"more")
    d, how, dt, _ = read_all(s, 3); s.close()
    R["timeout 0 removed: the open connection"] = "%s %d B %s %.2fs" % (st, len(d), how, dt)
    # timeout 0 with toxicity 0 removed: does removal still close?
    p = proxy("t00"); tox("t00", {"type": "timeout", "toxicity": 0, "attributes": {"timeout": 0}})
    s = conn(p); s.sendall(b"E\n"); s.sendall(b"hello"); s.settimeout(5); got = s.recv(10)
    st, _ = api(base, "DELETE", "/proxies/t00/toxics/timeout_downstream")
    s.sendall(b"more")
    d, how, dt, _ = read_all(s, 2); s.close()
    R["timeout toxicity 0 removed: the open connection (got %r before)" % got] = "%s %d B %s" % (st, len(d), how)
    # slow_close on an echo connection closed by the client
    p = proxy("sc2"); tox("sc2", {"type": "slow_close", "stream": "upstream", "attributes": {"delay": 500}})
    s = conn(p); s.sendall(b"E\n"); s.sendall(b"x"); s.settimeout(5); s.recv(5); t0 = time.monotonic()
    s.shutdown(socket.SHUT_WR); d, how, dt, _ = read_all(s, 5); s.close()
    R["slow_close 500 upstream: client half-closes an echo conn"] = "%d B %s %.2fs" % (len(d), how, dt)
    # reset_peer 0 upstream, new connection
    p = proxy("rp"); tox("rp", {"type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 0}})
    s = conn(p); time.sleep(0.3)
    s.settimeout(0.2)
    try:
        x = s.recv(10); idle = "eof" if x == b"" else "data"
    except socket.timeout:
        idle = "open"
    except ConnectionResetError:
        idle = "rst"
    s.sendall(b"10\n"); d, how, dt, _ = read_all(s, 5); s.close()
    R["reset_peer 0 upstream: idle 0.3s / after sending"] = "%s / %d B %s %.2fs" % (idle, len(d), how, dt)
    # reset_peer 300 downstream added on a live connection
    p = proxy("rp2"); s = conn(p); s.sendall(b"E\n"); s.sendall(b"hi"); s.settimeout(5); s.recv(10)
    tox("rp2", {"type": "reset_peer", "attributes": {"timeout": 300}})
    s.sendall(b"again"); d, how, dt, _ = read_all(s, 5); s.close()
    R["reset_peer 300 downstream on a live echo connection, then data"] = "%d B %s %.2fs" % (len(d), how, dt)
    # slicer
    p = proxy("sl"); tox("sl", {"type": "slicer", "attributes": {"average_size": 10, "size_variation": 0, "delay": 20000}})
    d, how, dt, n = fetch(p, 100); R["slicer avg 10 var 0 delay 20000us: 100 B"] = "%d B %s %.2fs in %d recvs" % (len(d), how, dt, n)
    # limit_data
    p = proxy("ld"); tox("ld", {"type": "limit_data", "attributes": {"bytes": 100}})
    d, how, dt, _ = fetch(p, 1000); R["limit_data 100: 1000 B reply"] = "%d B %s %.2fs prefix-ok=%s" % (len(d), how, dt, d == bytes(i % 251 for i in range(100)))
    # toxicity 0
    p = proxy("tx0"); tox("tx0", {"type": "latency", "toxicity": 0, "attributes": {"latency": 500}})
    ts = []
    for _ in range(3):
        d, how, dt, _ = fetch(p, 10); ts.append(dt)
    R["latency 500 toxicity 0 (3 runs)"] = " ".join("%.2f" % x for x in ts)
    # toxicity 0.5 over 20 connections
    p = proxy("tx5"); tox("tx5", {"type": "latency", "toxicity": 0.5, "attributes": {"latency": 200}})
    hits = 0
    for _ in range(20):
        d, how, dt, _ = fetch(p, 10); hits += dt > 0.15
    R["latency 200 toxicity 0.5: slow connections of 20"] = str(hits)
    # bandwidth rate 0
    p = proxy("bw0"); tox("bw0", {"type": "bandwidth", "attributes": {"rate": 0}})
    d, how, dt, _ = fetch(p, 1000, timeout=2); R["bandwidth rate 0: 1000 B, 2 s wait"] = "%d B %s" % (len(d), how)
    # latency removal flushes queued data
    p = proxy("lq"); tox("lq", {"type": "latency", "attributes": {"latency": 3000}})
    s = conn(p); s.sendall(b"10\n"); time.sleep(0.3)
    api(base, "DELETE", "/proxies/lq/toxics/latency_downstream")
    d, how, dt, _ = read_all(s, 5); s.close()
    R["latency 3000 removed 0.3 s after the request"] = "%d B %s %.2fs" % (len(d), how, dt)
    return R


def compare_toxics():
    up = Sender(name="sender")
    res = {}
    for kind in ("toxiproxy", "twice"):
        d = h.make_tmpdir("toxiproxy-compare-%s-" % kind)
        p, port = start(kind, d, up.port)
        res[kind] = scenario(kind, "http://127.0.0.1:%d" % port, "127.0.0.1:%d" % up.port)
        h.kill_group(p)
        p.wait()
    up.close()
    for k in res["toxiproxy"]:
        print("%-66s | toxiproxy: %-30s | twice: %s" % (k, res["toxiproxy"][k], res["twice"].get(k)))


if __name__ == "__main__":
    tmp = h.make_tmpdir("toxiproxy-compare-")
    redis = h.start_redis(tmp)
    print("== the same requests to both servers: what differs")
    compare_api(redis.port)
    print("== each toxic on real traffic")
    compare_toxics()
    redis.stop()
