#!/usr/bin/python3
"""Robustness of twice's tcp listeners: many connections, slow peers,
upstream failures, TLS verification, signals, the CLI, and twice's own
sockets (loops back into twice, ports another process holds, the
descriptors one listener may take).

Each test starts its own twice (and its own upstream servers) on free
ports; see harness.py."""

import hashlib
import json
import os
import re
import resource
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402

RSS_LIMIT_KIB = h.rss_limit(64 * 1024)


def setUpModule():
    global CERTS
    CERTS = h.gen_certs(h.make_tmpdir("twice-it-robust-certs-"))


class RssSampler(threading.Thread):
    """Samples twice's VmRSS every 100 ms until stopped; keeps the maximum."""

    def __init__(self, tw):
        super().__init__(daemon=True)
        self.tw = tw
        self.max_kib = 0
        self.samples = 0
        self._stop_ev = threading.Event()

    def run(self):
        while not self._stop_ev.is_set():
            try:
                self.max_kib = max(self.max_kib, self.tw.rss_kib())
                self.samples += 1
            except (OSError, RuntimeError):
                pass
            self._stop_ev.wait(0.1)

    def stop(self):
        self._stop_ev.set()
        self.join(5)
        return self.max_kib


def echo_roundtrip(sock, msg, timeout=10):
    sock.settimeout(timeout)
    sock.sendall(msg)
    return h.recv_exact(sock, len(msg))


class ConcurrencyTest(h.TestCase):
    N = 1000

    def test_1000_concurrent_connections(self):
        """1000 clients connected at once through one listener are all served."""
        echo = h.EchoServer(name="echo-many")
        self.addCleanup(echo.close)
        port = h.free_port()
        # Started like from a login shell: soft limit 1024, well under the
        # ~2000 descriptors 1000 proxied connections need.
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        tw = self.twice(h.config(h.listen_block("many", port, echo.port), log_level="info"),
                        nofile=(min(1024, hard), hard))
        with open("/proc/%d/limits" % tw.pid) as f:
            lim = [l for l in f if l.startswith("Max open files")][0].split()
        self.assertEqual(lim[3], lim[4], "twice did not raise its RLIMIT_NOFILE soft limit to the hard limit: %s"
                         % " ".join(lim))
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        t0 = time.monotonic()
        for i in range(self.N):
            try:
                socks.append(h.connect(port, timeout=30))
            except OSError as e:
                self.fail("connection %d of %d to twice failed: %r" % (i + 1, self.N, e))
        msgs = [("conn-%04d-%s\n" % (i, os.urandom(6).hex())).encode() for i in range(self.N)]
        for s, m in zip(socks, msgs):
            s.sendall(m)
        bad = []
        deadline = time.monotonic() + 60
        for i, (s, m) in enumerate(zip(socks, msgs)):
            # one shared deadline: a proxy that forwards nothing fails this in ~60 s
            s.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                got = h.recv_exact(s, len(m))
            except (OSError, EOFError) as e:
                got = repr(e).encode()
            if got != m:
                bad.append((i, m, got))
        self.assertEqual(bad[:5], [], "%d of %d connections did not get their message back" % (len(bad), self.N))
        # Everything is still open: the upstream has N connections at once.
        st = echo.stats()
        self.assertEqual(st["active"], self.N, "upstream connections open at the same time: %r" % st)
        h.log("%d connections served, all open at once, in %.1fs" % (self.N, time.monotonic() - t0))
        clients = [h.client_addr(s) for s in socks]
        for s in socks:
            s.close()
        recs = tw.wait_sessions(clients, timeout=60)
        wrong = [r for r in recs.values()
                 if int(r["bytes_up"]) != len(msgs[0]) or int(r["bytes_down"]) != len(msgs[0])]
        self.assertEqual(wrong[:3], [], "sessions with wrong byte counts")
        tw.stop()


class SlowPeerTest(h.TestCase):
    SIZE = h.GiB
    STALL = 5.0

    def test_slow_client_reader_memory_bounded(self):
        """Upstream streams 1 GiB to a client that reads nothing for 5 s:
        twice's RSS stays < 64 MiB and the client then gets exactly 1 GiB."""
        srv = h.HashServer(name="hash-slow-client")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("down", port, srv.port), log_level="info"))
        seed = 4242
        expected = h.pattern_sha256(seed, self.SIZE)
        s = h.connect(port, timeout=30)
        self.addCleanup(s.close)
        sampler = RssSampler(tw)
        sampler.start()
        s.sendall(h.HASH_HDR.pack(h.HASH_MAGIC, h.FLAG_PATTERN, 0, self.SIZE, seed, 0))
        time.sleep(self.STALL)   # the scenario: the client reads nothing for 5 s
        stall_rss = sampler.max_kib
        prog = list(srv.progress.values())
        sent_during_stall = prog[0]["sent"] if prog else -1
        h.log("after %.0fs stall: twice max RSS %d KiB, upstream had sent %d MiB" % (
            self.STALL, stall_rss, sent_during_stall >> 20))
        # now read everything
        hsh = hashlib.sha256()
        buf = bytearray(1 << 20)
        mv = memoryview(buf)
        n = 0
        tail = bytearray()
        total = self.SIZE + h.HASH_TRAILER.size
        t0 = time.monotonic()
        while n < total:
            k = s.recv_into(mv, min(len(buf), total - n))
            if k == 0:
                break
            pay = max(0, min(k, self.SIZE - n))
            hsh.update(mv[:pay])
            if pay < k:
                tail += mv[pay:k]
            n += k
        max_rss = sampler.stop()
        h.log("read %d bytes in %.1fs; twice max RSS %d KiB over %d samples" % (
            n, time.monotonic() - t0, max_rss, sampler.samples))
        self.assertEqual(n, total, "client received %d of %d bytes (payload + trailer)" % (n, total))
        self.assertEqual(hsh.digest(), expected, "1 GiB download corrupted")
        _, _, srv_sent = h.HASH_TRAILER.unpack(bytes(tail))
        self.assertEqual(srv_sent, expected)
        self.assertLess(stall_rss, RSS_LIMIT_KIB, "twice RSS while the client did not read")
        self.assertLess(max_rss, RSS_LIMIT_KIB, "twice RSS during the 1 GiB transfer")
        s.close()
        tw.stop()

    def test_slow_upstream_reader_memory_bounded(self):
        """A client uploads 1 GiB to an upstream that reads nothing for 5 s:
        twice's RSS stays < 64 MiB and the upstream then gets exactly 1 GiB."""
        srv = h.HashServer(name="hash-slow-upstream")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("up", port, srv.port), log_level="info"))
        s = h.connect(port, timeout=30)
        self.addCleanup(s.close)
        sampler = RssSampler(tw)
        sampler.start()
        out = {}

        def run():
            out["res"] = h.hash_exchange(s, self.SIZE, 0, concurrent=False, delay_ms=int(self.STALL * 1000),
                                         upload_seed=777, timeout=30)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(self.STALL - 0.5)   # inside the upstream's 5 s without reading
        stall_rss = sampler.max_kib
        t.join(240)
        max_rss = sampler.stop()
        self.assertFalse(t.is_alive(), "upload did not finish")
        res = out["res"]
        h.log("upload done; twice max RSS during stall %d KiB, overall %d KiB" % (stall_rss, max_rss))
        self.assertEqual(h.exchange_problems(res), [], "1 GiB upload through twice")
        self.assertEqual(res.sent_sha, h.pattern_sha256(777, self.SIZE))
        self.assertLess(stall_rss, RSS_LIMIT_KIB, "twice RSS while the upstream did not read")
        self.assertLess(max_rss, RSS_LIMIT_KIB, "twice RSS during the 1 GiB transfer")
        s.close()
        tw.stop()


class UpstreamFailureTest(h.TestCase):
    def test_upstream_refused(self):
        """Nobody listens upstream: the client is closed quickly and the log
        names the listener and the upstream."""
        dead = h.free_port()
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("dead", port, dead), connect_timeout="2s"))
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        try:
            s.sendall(b"hello?\n")
        except OSError:
            pass
        took = h.wait_closed(s, 10)
        self.assertLess(took, 3.0, "client closed only after %.1fs (connect-timeout 2s)" % took)
        recs = tw.wait_for_records("upstream connect failed", listener="dead",
                                   upstream="127.0.0.1:%d" % dead)
        self.assertIn("level=warn", self._line_of(tw, recs[0]))
        self.assertTrue(recs[0].get("error"), "error= is empty in %r" % recs[0])
        rec = tw.wait_sessions([client])[client]
        self.assertEqual(rec["reason"], "upstream_connect_failed", rec)
        self.assertEqual(rec["listener"], "dead")
        # twice is still serving: a second client gets the same treatment
        s2 = h.connect(port)
        self.addCleanup(s2.close)
        self.assertLess(h.wait_closed(s2, 10), 3.0)
        tw.stop()

    @staticmethod
    def _line_of(tw, rec):
        for line in tw.log_lines():
            if h.parse_logfmt(line) == rec:
                return line
        return ""

    def _blackhole(self):
        """A 127.0.0.1 port whose accept queue is full, so that the kernel
        drops new SYNs and connect() hangs.  Skips if that doesn't hold."""
        l = socket.socket()
        self.addCleanup(l.close)
        bport = None
        for _ in range(10):
            try:
                bport = h.free_port()
                l.bind(("127.0.0.1", bport))
                break
            except OSError:
                continue
        l.listen(0)
        fill = []
        self.addCleanup(lambda: [f.close() for f in fill])
        for _ in range(4):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", bport))
            fill.append(f)
        time.sleep(0.3)   # let the handshakes settle; the probe below checks the premise (or skips)
        probe = socket.socket()
        probe.settimeout(1.5)
        try:
            probe.connect(("127.0.0.1", bport))
            self.skipTest("cannot make a connect() hang on loopback here")
        except socket.timeout:
            pass
        except OSError as e:
            self.skipTest("cannot make a connect() hang on loopback here: %r" % e)
        finally:
            probe.close()
        return bport

    def test_upstream_connect_timeout(self):
        """An upstream that never answers the SYN: the per-listener
        connect-timeout (1s, global 10s) closes the client."""
        bport = self._blackhole()
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("hang", port, bport, "connect-timeout 1s"),
                                 connect_timeout="10s"))
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        took = h.wait_closed(s, 15)
        self.assertLess(took, 4.0, "client closed after %.1fs with connect-timeout 1s" % took)
        self.assertGreater(took, 0.5, "closed after %.2fs: that is not a 1 s connect timeout" % took)
        recs = tw.wait_for_records("upstream connect failed", listener="hang",
                                   upstream="127.0.0.1:%d" % bport)
        rec = tw.wait_sessions([client])[client]
        self.assertEqual(rec["reason"], "upstream_connect_failed", rec)
        h.log("connect timeout: client closed after %.2fs; error=%r" % (took, recs[0].get("error")))
        tw.stop()

    def test_idle_timeout(self):
        echo = h.EchoServer(name="echo-idle")
        self.addCleanup(echo.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("idle", port, echo.port, "idle-timeout 1s")))
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        self.assertEqual(echo_roundtrip(s, b"ping"), b"ping")
        took = h.wait_closed(s, 15)
        self.assertLess(took, 5.0, "idle session closed only after %.1fs (idle-timeout 1s)" % took)
        self.assertEqual(tw.wait_sessions([client])[client]["reason"], "idle_timeout")
        tw.stop()

    def test_idle_timeout_spares_busy_sessions(self):
        """idle-timeout 1s must not close sessions that carry traffic in
        either direction for 3 s: echo ping-pong, a download trickle with a
        silent client, an upload trickle with a silent upstream."""
        class Trickle(h.ThreadedServer):
            def handle(self, c):
                c.settimeout(30)
                cmd = h.recv_exact(c, 1)
                if cmd == b"D":             # trickle down, client says nothing
                    for _ in range(10):
                        c.sendall(b".")
                        time.sleep(0.3)
                    c.sendall(b"END")
                    h._finish(c)
                elif cmd == b"S":           # sink: say nothing until EOF
                    n = len(h.recv_all(c))
                    c.sendall(b"%d" % n)
                    h._finish(c)
                else:                       # echo
                    while True:
                        d = c.recv(65536)
                        if not d:
                            break
                        c.sendall(d)
                    h._finish(c)
        srv = Trickle(name="trickle")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("busy", port, srv.port, "idle-timeout 1s")))

        with self.subTest("ping-pong"):
            s = h.connect(port)
            self.addCleanup(s.close)
            s.sendall(b"E")
            for i in range(10):
                self.assertEqual(echo_roundtrip(s, b"p%d" % i), b"p%d" % i, "ping %d (t=%.1fs)" % (i, 0.3 * i))
                time.sleep(0.3)
            s.close()
        with self.subTest("download trickle"):
            s = h.connect(port)
            self.addCleanup(s.close)
            s.settimeout(10)
            s.sendall(b"D")
            self.assertEqual(h.recv_all(s), b"." * 10 + b"END",
                             "a session receiving a byte every 0.3s was cut")
            s.close()
        with self.subTest("upload trickle"):
            s = h.connect(port)
            self.addCleanup(s.close)
            s.settimeout(10)
            s.sendall(b"S")
            try:
                for _ in range(10):
                    s.sendall(b".")
                    time.sleep(0.3)
                s.shutdown(socket.SHUT_WR)
                got = h.recv_all(s)
            except OSError as e:
                got = repr(e).encode()
            self.assertEqual(got, b"10", "a session sending a byte every 0.3s was cut")
            s.close()
        tw.stop()

    def test_max_connections(self):
        echo = h.EchoServer(name="echo-max")
        self.addCleanup(echo.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("max", port, echo.port, "max-connections 2")))
        a, b = h.connect(port), h.connect(port)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        self.assertEqual(echo_roundtrip(a, b"a"), b"a")
        self.assertEqual(echo_roundtrip(b, b"b"), b"b")
        c = h.connect(port)
        self.addCleanup(c.close)
        client_c = h.client_addr(c)
        self.assertLess(h.wait_closed(c, 10), 5.0)
        self.assertEqual(tw.wait_sessions([client_c])[client_c]["reason"], "max_connections")
        # the first two still work, and after one closes a new one is accepted
        self.assertEqual(echo_roundtrip(a, b"a2"), b"a2")
        ca = h.client_addr(a)
        a.close()
        tw.wait_sessions([ca])
        d = h.connect(port)
        self.addCleanup(d.close)
        self.assertEqual(echo_roundtrip(d, b"d"), b"d")
        tw.stop()


class OwnSocketsTest(h.TestCase):
    """twice never connects to itself, and one listener never takes every descriptor."""

    @staticmethod
    def _loopback_name():
        """A name other than localhost (which `twice check` refuses outright) that this host
        resolves to a loopback address, or None."""
        name = socket.gethostname()
        try:
            addrs = {ai[4][0] for ai in socket.getaddrinfo(name, None, socket.AF_INET)}
        except OSError:
            return None
        return name if addrs and all(a.startswith("127.") for a in addrs) else None

    def test_loop_through_a_name_is_cut_before_connecting(self):
        """An upstream name that resolves to the listener's own bind: `check` cannot know it,
        but the first client's session is closed before twice connects anywhere, with a log line
        naming the listener and where it binds; no second session starts, and twice keeps
        serving its other listener."""
        name = self._loopback_name()
        if name is None:
            self.skipTest("this host's name does not resolve to a loopback address only")
        echo = h.EchoServer(name="echo-own")
        self.addCleanup(echo.close)
        port, p_other = h.free_port(), h.free_port()
        conf = h.config(h.listen_block("me", port, "%s:%d" % (name, port)),
                        h.listen_block("other", p_other, echo.port))
        # Few descriptors: were the loop not cut, it would stop at ~120 sessions, not 10,000.
        tw = self.twice(conf, nofile=(256, 256))
        mark = tw.log_mark()
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        self.assertLess(h.wait_closed(s, 15), 10)
        rec = tw.wait_sessions([client], since=mark)[client]
        self.assertEqual(rec["reason"], "upstream_connect_failed", rec)
        bind_line = conf.count("\n", 0, conf.index("bind 127.0.0.1:%d" % port)) + 1
        loops = tw.wait_for_records("upstream is twice itself", listener="me")
        self.assertEqual(loops[0]["error"],
                         "127.0.0.1:%d is twice's own listener 'me' (bind 127.0.0.1:%d at %s:%d:8)"
                         % (port, port, tw.conf_path, bind_line), loops[0])
        # one session, the client's own: twice did not accept a connection from itself
        opened = tw.log_records("session closed", listener="me")
        self.assertEqual([r["client"] for r in opened], [client], "sessions on 'me': %r" % opened)
        with h.connect(p_other) as o:
            self.assertEqual(echo_roundtrip(o, b"still here\n"), b"still here\n")
        tw.stop()


    def _with_admin(self, listeners, rules=(), nofile=None):
        """Start twice with the admin API; returns (twice, its Admin, the file's text)."""
        admin_port = h.free_port()
        conf = fk.conf_text(listeners, rules, admin_port=admin_port, token=fk.TOKEN)
        tw = self.twice(conf, nofile=nofile)
        tw.wait_for_log(r"msg=\"admin listening\"")
        return tw, fk.Admin(admin_port, fk.TOKEN), conf

    @staticmethod
    def _line_of(text, needle):
        return text.count("\n", 0, text.index(needle)) + 1

    def test_reload_onto_a_taken_port_names_the_listener(self):
        """A reload that adds a listener on a port another process holds is refused: POST
        /reload and the log name the listener and FILE:LINE:COL of its bind, and the running
        listener keeps serving."""
        echo = h.EchoServer(name="echo-taken")
        self.addCleanup(echo.close)
        blocker = socket.socket()
        self.addCleanup(blocker.close)
        taken, p_a = h.free_port(), h.free_port()
        blocker.bind(("127.0.0.1", taken))
        blocker.listen(1)
        tw, api, conf = self._with_admin([h.listen_block("a", p_a, echo.port)])
        new = conf + h.listen_block("b", taken, echo.port)
        tw.write_config(new)
        st, _, text = api.post("/reload")
        want = "%s:%d:8: listener 'b' cannot listen on 127.0.0.1:%d: Address already in use" % (
            tw.conf_path, self._line_of(new, "bind 127.0.0.1:%d" % taken), taken)
        self.assertEqual((st, json.loads(text)),
                         (400, {"error": "reload failed: nothing changed", "diagnostics": [want]}))
        self.assertEqual(tw.wait_for_records("reload failed", error=want)[0]["error"], want)
        with h.connect(p_a) as s:
            self.assertEqual(echo_roundtrip(s, b"a\n"), b"a\n")
        self.assertEqual(blocker.getsockname()[1], taken)
        tw.stop()

    def test_reload_to_a_self_loop_is_refused(self):
        """A reload to a file whose listener is its own upstream is refused, naming the listener
        and FILE:LINE:COL, over the admin API and SIGHUP; the old listeners and rules stay."""
        echo = h.EchoServer(banner=b"A>", name="echo-kept")
        self.addCleanup(echo.close)
        port = h.free_port()
        kept = fk.rule_block("kept", "a", "stream downstream", "do latency 1ms")
        tw, api, conf = self._with_admin([h.listen_block("a", port, echo.port)], [kept])
        looping = conf.replace("upstream 127.0.0.1:%d" % echo.port, "upstream 127.0.0.1:%d" % port)
        looping = looping.replace(kept, fk.rule_block("new", "a", "stream downstream",
                                                      "do latency 1ms"))
        self.assertNotEqual(looping, conf)
        tw.write_config(looping)
        st, _, text = api.post("/reload")
        line = self._line_of(looping, "upstream 127.0.0.1:%d" % port)
        self.assertEqual(st, 400, text)
        self.assertIn("%s:%d:12: error: listener 'a' would connect to itself: upstream "
                      "127.0.0.1:%d reaches its own bind 127.0.0.1:%d at %d:8"
                      % (tw.conf_path, line, port, port, line - 1),
                      json.loads(text)["diagnostics"][0])
        mark = tw.log_mark()
        tw.signal(signal.SIGHUP)
        tw.wait_for_log(r'msg="reload failed"', start=mark)
        self.assertTrue(any(r.get("at") == "%s:%d:12" % (tw.conf_path, line)
                            and "would connect to itself" in r.get("problem", "")
                            for r in tw.log_records("config")[-5:]), tw.log_tail(10))
        self.assertEqual([r["name"] for r in api.json("/rules")["rules"]], ["kept"])
        with h.connect(port) as s:
            s.settimeout(10)
            self.assertEqual(h.recv_exact(s, 2), b"A>", "listener 'a' left its old upstream")
            self.assertEqual(echo_roundtrip(s, b"old rules\n"), b"old rules\n")
        tw.stop()


    NOFILE = 256  # descriptors twice gets in the cap tests: ~120 sessions at most

    def _fill(self, ports, limit):
        """Connect to `ports` in turn, each client served (an echo), until twice closes one;
        returns (the clients served, the refused one's address).  At most `limit` clients."""
        served = []
        self.addCleanup(lambda: [c.close() for c in served])
        for i in range(limit):
            c = h.connect(ports[i % len(ports)], timeout=10)
            c.settimeout(10)
            try:
                c.sendall(b"x")
                got = c.recv(1)
            except socket.timeout:
                got = None  # neither: twice is stuck
            except OSError:
                got = b""
            if got == b"":
                addr = h.client_addr(c)
                c.close()
                return served, addr
            self.assertEqual(got, b"x", "client %d was neither served nor refused" % i)
            served.append(c)
        self.fail("%d clients served: twice refused none" % limit)

    def test_refusals_past_the_cap_are_logged_in_few_lines(self):
        """A client that reconnects at once when it is refused past max-connections: every
        refusal is accounted for in the log, in a bounded number of lines that carry the count
        of the ones held back (`repeated=N`), not a line each."""
        echo = h.EchoServer(name="echo-flood")
        self.addCleanup(echo.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("cap", port, echo.port, "max-connections 1"),
                                 log_level="info"))
        held = h.connect(port)
        self.addCleanup(held.close)
        self.assertEqual(echo_roundtrip(held, b"x"), b"x")
        mark = tw.log_mark()
        n = 2000
        for _ in range(n):
            with h.connect(port) as c:
                self.assertLess(h.wait_closed(c, 10), 10)

        def counted():
            return tw.event_count("session closed", since=mark, listener="cap",
                                  reason="max_connections")
        h.eventually(lambda: counted() == n, 30)
        self.assertEqual(counted(), n, "refusals accounted for in the log")
        lines = tw.log_lines()[mark:]
        self.assertLess(len(lines), n // 5, "log lines for %d refusals" % n)
        self.assertTrue([l for l in lines if " repeated=" in l], "no line counts the ones held back")
        self.assertEqual(echo_roundtrip(held, b"y"), b"y")
        tw.stop()

    def test_listener_default_cap_leaves_room_for_others(self):
        """A listener without max-connections holds at most half the sessions twice's open-file
        limit allows (as a loop would try): the next client is closed with a log line, and
        another listener and the admin API still answer."""
        echo = h.EchoServer(name="echo-cap")
        self.addCleanup(echo.close)
        p_flood, p_other = h.free_port(), h.free_port()
        tw, api, _ = self._with_admin([h.listen_block("flood", p_flood, echo.port),
                                       h.listen_block("other", p_other, echo.port)],
                                      nofile=(self.NOFILE, self.NOFILE))
        mark = tw.log_mark()
        served, refused = self._fill([p_flood], self.NOFILE // 2)
        cap = int(tw.log_records("listening", listener="flood")[0]["max_connections"])
        self.assertEqual(len(served), cap)
        self.assertLessEqual(cap, self.NOFILE // 2 // 2, "one listener may take half at most")
        rec = tw.wait_sessions([refused], since=mark)[refused]
        self.assertEqual(rec["reason"], "max_connections", rec)
        self.assertEqual(rec["error"], "listener has %d connections (max-connections %d by "
                         "default: a share of the open-file limit)" % (cap, cap))
        with h.connect(p_other, timeout=10) as o:
            self.assertEqual(echo_roundtrip(o, b"other\n"), b"other\n")
        self.assertEqual(api.get("/healthz")[0], 200)
        h.wait_until(lambda: api.json("/stats")["listeners"]["flood"]["open"] == cap, 30,
                     what="GET /stats to count %d sessions open on 'flood'" % cap)
        tw.stop()

    def test_loop_through_another_proxy_stops_at_the_cap(self):
        """Two twice processes, each the other's upstream: neither can see the loop, but one
        client's chain stops at a listener's default cap, the client gets EOF, and both give
        their descriptors back and keep serving."""
        echo = h.EchoServer(name="echo-2loop")
        self.addCleanup(echo.close)
        pa, pb, p_other = h.free_port(), h.free_port(), h.free_port()
        nofile = (self.NOFILE, self.NOFILE)
        ta = self.twice(h.config(h.listen_block("a", pa, pb),
                                 h.listen_block("other", p_other, echo.port), log_level="info"),
                        nofile=nofile)
        tb = self.twice(h.config(h.listen_block("b", pb, pa), log_level="info"), nofile=nofile)
        fds = lambda t: len(os.listdir("/proc/%d/fd" % t.pid))
        base = (fds(ta), fds(tb))
        with h.connect(pa) as s:
            self.assertLess(h.wait_closed(s, 30), 30)
        capped = ta.log_records("session closed", reason="max_connections") + \
            tb.log_records("session closed", reason="max_connections")
        self.assertEqual(len(capped), 1, capped)
        h.wait_until(lambda: (fds(ta), fds(tb)) == base, 30,
                     what="both processes' descriptors back to %r" % (base,))
        with h.connect(p_other, timeout=10) as o:
            self.assertEqual(echo_roundtrip(o, b"other\n"), b"other\n")
        ta.stop()
        tb.stop()

    def test_process_cap_keeps_the_admin_api_answering(self):
        """Listeners whose max-connections are above what the open-file limit allows: twice
        warns at start, and refuses sessions beyond its own limit, with a log line, before
        descriptors run out: the admin API still answers."""
        echo = h.EchoServer(name="echo-pcap")
        self.addCleanup(echo.close)
        p_a, p_b = h.free_port(), h.free_port()
        tw, api, _ = self._with_admin([h.listen_block("a", p_a, echo.port, "max-connections 1000"),
                                       h.listen_block("b", p_b, echo.port, "max-connections 1000")],
                                      nofile=(self.NOFILE, self.NOFILE))
        mark = tw.log_mark()
        served, refused = self._fill([p_a, p_b], self.NOFILE // 2)
        limit = int(tw.wait_for_records("started")[0]["max_connections"])
        warned = tw.log_records("max-connections above the open-file limit")
        self.assertEqual(sorted(r["listener"] for r in warned), ["a", "b"])
        self.assertEqual(len(served), limit)
        rec = tw.wait_sessions([refused], since=mark)[refused]
        self.assertEqual(rec["reason"], "max_connections", rec)
        self.assertEqual(rec["error"], "twice has %d connections (its open-file limit allows %d)"
                         % (limit, limit))
        self.assertEqual(api.get("/healthz")[0], 200)
        tw.stop()


class TlsTest(h.TestCase):
    def test_upstream_untrusted_certificate(self):
        """The upstream presents a self-signed certificate: verification
        fails, the client is closed, the log says why; with `no-verify` the
        same upstream works."""
        srv = h.EchoServer(tls=h.server_ssl_context(CERTS.untrusted_pem, CERTS.untrusted_key),
                           name="echo-untrusted")
        self.addCleanup(srv.close)
        p_verify, p_noverify = h.free_port(), h.free_port()
        tw = self.twice(h.config(
            h.listen_block("verify", p_verify, srv.port, "upstream-tls ca %s sni localhost" % CERTS.ca_pem),
            h.listen_block("noverify", p_noverify, srv.port, "upstream-tls no-verify")))
        s = h.connect(p_verify)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        try:
            s.sendall(b"secret\n")
        except OSError:
            pass
        self.assertLess(h.wait_closed(s, 15), 10)
        recs = tw.wait_for_records("upstream tls handshake failed", listener="verify",
                                   upstream="127.0.0.1:%d" % srv.port)
        self.assertIn("certificate verify failed", recs[0].get("error", ""), recs[0])
        self.assertEqual(tw.wait_sessions([client])[client]["reason"], "upstream_tls_failed")
        # no-verify: same upstream, works
        s2 = h.connect(p_noverify)
        self.addCleanup(s2.close)
        self.assertEqual(echo_roundtrip(s2, b"hello over tls\n"), b"hello over tls\n")
        tw.stop()

    def test_upstream_hostname_mismatch(self):
        """A certificate signed by the trusted CA but for another name
        (sni other.invalid) must be refused."""
        srv = h.EchoServer(tls=h.server_ssl_context(CERTS.server_pem, CERTS.server_key), name="echo-tls")
        self.addCleanup(srv.close)
        p_bad, p_good = h.free_port(), h.free_port()
        tw = self.twice(h.config(
            h.listen_block("wrongname", p_bad, srv.port, "upstream-tls ca %s sni other.invalid" % CERTS.ca_pem),
            h.listen_block("rightname", p_good, srv.port, "upstream-tls ca %s sni localhost" % CERTS.ca_pem)))
        s = h.connect(p_good)
        self.addCleanup(s.close)
        self.assertEqual(echo_roundtrip(s, b"ok\n"), b"ok\n")
        s2 = h.connect(p_bad)
        self.addCleanup(s2.close)
        self.assertLess(h.wait_closed(s2, 15), 10)
        tw.wait_for_records("upstream tls handshake failed", listener="wrongname")
        tw.stop()

    def test_upstream_verify_ip_address(self):
        """Without `sni`, the upstream host (127.0.0.1) is what is checked;
        the server certificate has IP:127.0.0.1 in its SAN, so it verifies."""
        srv = h.EchoServer(tls=h.server_ssl_context(CERTS.server_pem, CERTS.server_key), name="echo-tls-ip")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("byip", port, srv.port, "upstream-tls ca %s" % CERTS.ca_pem)))
        s = h.connect(port)
        self.addCleanup(s.close)
        try:
            got = echo_roundtrip(s, b"via ip\n")
        except (OSError, EOFError) as e:
            got = repr(e).encode()
        self.assertEqual(got, b"via ip\n", "log:\n" + tw.log_tail(10))
        tw.stop()

    def test_client_plaintext_to_tls_listener(self):
        """A client speaking plain bytes to a TLS listener is closed and the
        session is logged as client_tls_failed; TLS clients still work."""
        echo = h.EchoServer(name="echo-ctls")
        self.addCleanup(echo.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block(
            "tlsin", port, echo.port, "tls cert %s key %s" % (CERTS.server_pem, CERTS.server_key))))
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 600)
        self.assertLess(h.wait_closed(s, 20), 15)
        self.assertEqual(tw.wait_sessions([client])[client]["reason"], "client_tls_failed")
        self.assertEqual(echo.stats()["errors"], [])
        t = h.client_ssl_context(CERTS.ca_pem).wrap_socket(h.connect(port), server_hostname="localhost")
        self.addCleanup(t.close)
        self.assertEqual(echo_roundtrip(t, b"fine\n"), b"fine\n")
        tw.stop()


class SignalTest(h.TestCase):
    def _refused_soon(self, port, timeout=60):
        def refused():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return False
            except ConnectionRefusedError:
                return True
            except OSError:
                return False
        try:
            h.wait_until(refused, timeout, what="port %d to refuse connections" % port)
            return True
        except TimeoutError:
            return False

    def test_sigterm_lets_open_session_finish(self):
        echo = h.EchoServer(name="echo-term")
        self.addCleanup(echo.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("term", port, echo.port), grace="5s"))
        s = h.connect(port)
        self.addCleanup(s.close)
        self.assertEqual(echo_roundtrip(s, b"before\n"), b"before\n")
        t0 = time.monotonic()
        tw.signal(signal.SIGTERM)
        tw.wait_for_log(r'msg="shutting down"', timeout=60)
        self.assertTrue(self._refused_soon(port), "new connections still accepted after SIGTERM")
        # the open session still works inside the grace period
        self.assertEqual(echo_roundtrip(s, b"during grace\n"), b"during grace\n")
        client = h.client_addr(s)
        s.shutdown(socket.SHUT_WR)
        self.assertEqual(h.recv_all(s), b"", "EOF expected after half-close")
        s.close()
        try:
            rc = tw.proc.wait(15)
        except Exception:
            self.fail("twice still running %.0fs after SIGTERM (grace 5s)" % (time.monotonic() - t0))
        self.assertEqual(rc, 0, "exit code after SIGTERM")
        took = time.monotonic() - t0
        h.log("twice exited %.1fs after SIGTERM (session finished before the 5s grace)" % took)
        self.assertIn(tw.wait_sessions([client], timeout=1)[client]["reason"],
                      ("client_closed", "upstream_closed"))

    def test_sigterm_grace_expires(self):
        echo = h.EchoServer(name="echo-grace")
        self.addCleanup(echo.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("grace", port, echo.port), grace="2s"))
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        self.assertEqual(echo_roundtrip(s, b"x"), b"x")
        t0 = time.monotonic()
        tw.signal(signal.SIGINT)
        took = h.wait_closed(s, 15)
        self.assertLess(took, 7, "session closed %.1fs after SIGINT with shutdown-grace 2s" % took)
        try:
            rc = tw.proc.wait(10)
        except Exception:
            self.fail("twice still running %.0fs after SIGINT" % (time.monotonic() - t0))
        self.assertEqual(rc, 0)
        self.assertEqual(tw.wait_sessions([client], timeout=1)[client]["reason"], "shutdown")

    def test_sighup_reload(self):
        echo_a = h.EchoServer(banner=b"A>", name="echo-a")
        echo_b = h.EchoServer(banner=b"B>", name="echo-b")
        echo_c = h.EchoServer(banner=b"C>", name="echo-c")
        for e in (echo_a, echo_b, echo_c):
            self.addCleanup(e.close)
        pa, pb = h.free_port(), h.free_port()
        conf1 = h.config(h.listen_block("a", pa, echo_a.port))
        tw = self.twice(conf1)

        def hello(port, banner):
            s = h.connect(port)
            s.settimeout(10)
            got = h.recv_exact(s, 2)
            self.assertEqual(got, banner, "banner of the upstream behind port %d" % port)
            self.assertEqual(echo_roundtrip(s, b"hi\n"), b"hi\n")
            return s

        old = hello(pa, b"A>")
        self.addCleanup(old.close)

        # 1. add listener b
        nlines = len(tw.log_lines())
        tw.write_config(conf1 + h.listen_block("b", pb, echo_b.port))
        tw.signal(signal.SIGHUP)
        tw.wait_for_log(r"msg=reloaded", start=nlines)
        tw.wait_for_log(r"msg=listening listener=b\b", start=nlines)
        h.wait_until(lambda: h.port_open(pb), 60, what="new listener b")
        hello(pb, b"B>").close()
        hello(pa, b"A>").close()
        self.assertEqual(echo_roundtrip(old, b"still here\n"), b"still here\n")

        # 2. change a's upstream: new sessions go to C, the open one stays on A
        nlines = len(tw.log_lines())
        conf2 = h.config(h.listen_block("a", pa, echo_c.port), h.listen_block("b", pb, echo_b.port))
        tw.write_config(conf2)
        tw.signal(signal.SIGHUP)
        tw.wait_for_log(r"msg=reloaded", start=nlines)
        h.wait_until(lambda: self._banner(pa) == b"C>", 60, what="listener a to use the new upstream")
        self.assertEqual(echo_roundtrip(old, b"old session\n"), b"old session\n")

        # 3. a broken file changes nothing
        nlines = len(tw.log_lines())
        tw.write_config(conf2 + "listen broken {\n  protocol tcp\n  bind 127.0.0.1:%d\n  upstrem 127.0.0.1:1\n"
                        % h.free_port())
        tw.signal(signal.SIGHUP)
        tw.wait_for_log(r'msg="reload failed"', start=nlines)
        self.assertIsNone(tw.proc.poll(), "twice exited after a failed reload")
        hello(pa, b"C>").close()
        hello(pb, b"B>").close()
        self.assertEqual(echo_roundtrip(old, b"after failed reload\n"), b"after failed reload\n")
        old.close()
        tw.stop()

    def test_sighup_changes_tls_certificate(self):
        """A reload that points a listener's `tls` at another certificate:
        new clients get the new certificate; the open session continues."""
        echo = h.EchoServer(name="echo-rotate")
        self.addCleanup(echo.close)
        port = h.free_port()
        conf = lambda cert, key: h.config(h.listen_block("rot", port, echo.port, "tls cert %s key %s" % (cert, key)))
        tw = self.twice(conf(CERTS.server_pem, CERTS.server_key))
        trusting = h.client_ssl_context(CERTS.ca_pem)
        old = trusting.wrap_socket(h.connect(port, timeout=10), server_hostname="localhost")
        self.addCleanup(old.close)
        self.assertEqual(echo_roundtrip(old, b"1\n"), b"1\n")
        nlines = len(tw.log_lines())
        tw.write_config(conf(CERTS.untrusted_pem, CERTS.untrusted_key))
        tw.signal(signal.SIGHUP)
        tw.wait_for_log(r"msg=reloaded", start=nlines)

        def peer_cert():
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            with ctx.wrap_socket(h.connect(port, timeout=30), server_hostname="localhost") as s:
                return s.getpeercert(binary_form=True)
        with open(CERTS.untrusted_pem) as f:
            want = ssl.PEM_cert_to_DER_cert(f.read())
        h.wait_until(lambda: peer_cert() == want, 60, what="the new certificate to be served")
        self.assertEqual(echo_roundtrip(old, b"2\n"), b"2\n")
        old.close()
        tw.stop()

    @staticmethod
    def _banner(port):
        try:
            with h.connect(port, timeout=5) as s:
                return h.recv_exact(s, 2)
        except (OSError, EOFError):
            return None


class ChurnTest(h.TestCase):
    def _fds(self, tw):
        return len(os.listdir("/proc/%d/fd" % tw.pid))

    def test_no_descriptor_leak(self):
        """Thousands of short sessions ending every which way leave twice
        with the descriptors it started with."""
        echo = h.EchoServer(name="echo-churn")
        self.addCleanup(echo.close)
        dead = h.free_port()
        p_ok, p_dead = h.free_port(), h.free_port()
        tw = self.twice(h.config(h.listen_block("ok", p_ok, echo.port),
                                 h.listen_block("dead", p_dead, dead), log_level="info"))
        base = self._fds(tw)
        clients = []
        for i in range(1500):                      # normal request/response, client closes
            with h.connect(p_ok) as s:
                self.assertEqual(echo_roundtrip(s, b"m%d" % i), b"m%d" % i)
                clients.append(h.client_addr(s))
        for i in range(200):                       # connect and close at once
            s = h.connect(p_ok)
            clients.append(h.client_addr(s))
            s.close()
        for i in range(200):                       # reset by the client mid-session
            s = h.connect(p_ok)
            clients.append(h.client_addr(s))
            s.sendall(b"x" * 1000)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        for i in range(200):                       # upstream refuses
            s = h.connect(p_dead)
            h.wait_closed(s, 10)
            s.close()
        tw.wait_sessions(clients, timeout=60)
        # Those that never reached their upstream are counted, not each logged (repeated=N).
        h.wait_until(lambda: tw.event_count("session closed", listener="dead",
                                            reason="upstream_connect_failed") == 200,
                     60, what="the 200 refused sessions in the log")
        h.wait_until(lambda: self._fds(tw) <= base + 2, 60, what="twice's descriptors back to %d" % base)
        h.log("descriptors: %d before, %d after %d sessions; RSS %d KiB" % (
            base, self._fds(tw), len(clients), tw.rss_kib()))
        self.assertLess(tw.rss_kib(), RSS_LIMIT_KIB)
        tw.stop()

    def test_client_reset_mid_download(self):
        """The client resets its connection in the middle of a big download:
        twice closes the upstream side too, logs the session, keeps serving."""
        srv = h.HashServer(name="hash-reset")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("rst", port, srv.port), log_level="info"))
        s = h.connect(port)
        client = h.client_addr(s)
        s.sendall(h.HASH_HDR.pack(h.HASH_MAGIC, h.FLAG_PATTERN, 0, 512 * h.MiB, 1, 0))
        h.recv_exact(s, h.MiB)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        rec = tw.wait_sessions([client], timeout=60)[client]
        h.wait_until(lambda: srv.stats()["active"] == 0, 60, what="upstream connection to be closed")
        self.assertLess(int(rec["bytes_down"]), 512 * h.MiB, rec)
        s2 = h.connect(port)
        self.addCleanup(s2.close)
        self.assertEqual(h.exchange_problems(h.hash_exchange(s2, 1000, 1000)), [])
        tw.stop()

    def test_client_reset_before_relaying(self):
        """A client that resets while its session is still on its way to the upstream (a
        `delay` connect rule holds it before resolving; a TLS upstream that never answers its
        handshake holds it connecting) ends at once as client_error: there is nothing to
        deliver, so it closes rather than drains, and the upstream connection goes with it.
        The next client is served."""
        class Silent(h.ThreadedServer):
            def handle(self, c):
                while c.recv(4096):
                    pass
        silent = Silent(name="silent-tls")
        self.addCleanup(silent.close)
        echo = h.EchoServer(name="echo-held")
        self.addCleanup(echo.close)
        p_held, p_tls = h.free_port(), h.free_port()
        tw = self.twice(h.config(h.listen_block("held", p_held, echo.port),
                                 h.listen_block("tlswait", p_tls, silent.port, "upstream-tls no-verify"),
                                 fk.rule_block("hold", "held", "when connect", "do delay 2s"),
                                 log_level="info", connect_timeout="20s"))
        clients = {}
        for name, port in (("held", p_held), ("tlswait", p_tls)):
            s = h.connect(port)
            clients[name] = h.client_addr(s)
            s.sendall(b"half a request")
            if name == "tlswait":   # connecting: twice's TLS hello waits for an answer
                h.wait_until(lambda: silent.stats()["active"] == 1, 10, what="twice to reach the upstream")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        recs = tw.wait_sessions(list(clients.values()), timeout=15)
        for name, client in clients.items():
            rec = recs[client]
            self.assertEqual(rec.get("reason"), "client_error", rec)
            self.assertLess(int(rec["duration_ms"]), 2000, rec)   # before the delay, or the timeout
            self.assertEqual(int(rec["bytes_up"]), 0, rec)
        h.wait_until(lambda: silent.stats()["active"] == 0, 10, what="the upstream connection to close")
        self.assertEqual(tw.event_count("session state move refused"), 0)
        with h.connect(p_held) as s:
            self.assertEqual(echo_roundtrip(s, b"after"), b"after")
        tw.stop()

    def test_upstream_reset_mid_upload(self):
        """The upstream resets the connection while the client is uploading:
        the client's connection is closed promptly."""
        class Resetter(h.ThreadedServer):
            def handle(self, c):
                h.recv_exact(c, h.MiB)
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        srv = Resetter(name="resetter")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("urst", port, srv.port), log_level="info"))
        s = h.connect(port)
        self.addCleanup(s.close)
        client = h.client_addr(s)
        s.settimeout(15)
        block = b"u" * (256 * h.KiB)
        sent = 0
        err = None
        try:
            while sent < 1024 * h.MiB:
                s.sendall(block)
                sent += len(block)
        except OSError as e:
            err = e
        if err is None:
            self.fail("uploaded 1 GiB into a connection whose upstream had reset after 1 MiB")
        self.assertNotIsInstance(err, socket.timeout,
                                 "client connection still open (send blocked 15s) after the upstream reset")
        rec = tw.wait_sessions([client], timeout=60)[client]
        h.log("upstream reset: client saw %r after %d MiB; session %s" % (err, sent >> 20, rec.get("reason")))
        tw.stop()

    def test_upstream_half_close(self):
        """The upstream sends a greeting and shuts down its write side: the
        client sees the greeting and EOF, and can still send to the upstream."""
        got = {}

        class Greeter(h.ThreadedServer):
            def handle(self, c):
                c.sendall(b"greeting, then EOF")
                c.shutdown(socket.SHUT_WR)
                data = h.recv_all(c)
                got["data"] = data
        srv = Greeter(name="greeter")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block("uhc", port, srv.port), log_level="info"))
        s = h.connect(port)
        self.addCleanup(s.close)
        s.settimeout(15)
        self.assertEqual(h.recv_all(s), b"greeting, then EOF")
        payload = os.urandom(h.MiB + 13)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            self.fail("client could not send after the upstream's half-close: %r" % e)
        h.wait_until(lambda: "data" in got, 60, what="upstream to receive the client's data and EOF")
        self.assertEqual(len(got["data"]), len(payload))
        self.assertEqual(got["data"], payload)
        tw.stop()

    def test_stalled_tls_handshakes_do_not_block(self):
        """50 clients that open TCP to a TLS listener and say nothing do not
        keep another client from being served promptly."""
        echo = h.EchoServer(name="echo-stall")
        self.addCleanup(echo.close)
        port, p_plain = h.free_port(), h.free_port()
        tw = self.twice(h.config(
            h.listen_block("tlsin", port, echo.port, "tls cert %s key %s" % (CERTS.server_pem, CERTS.server_key)),
            h.listen_block("plain", p_plain, echo.port), log_level="info"))
        idle = [h.connect(port) for _ in range(50)]
        self.addCleanup(lambda: [s.close() for s in idle])
        half = []
        for _ in range(10):     # and some that send half a ClientHello
            s = h.connect(port)
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            half.append(s)
        self.addCleanup(lambda: [s.close() for s in half])
        ctx = h.client_ssl_context(CERTS.ca_pem)
        t0 = time.monotonic()
        with ctx.wrap_socket(h.connect(port, timeout=5), server_hostname="localhost") as t:
            self.assertEqual(echo_roundtrip(t, b"not blocked\n", timeout=5), b"not blocked\n")
        with h.connect(p_plain, timeout=5) as p:
            self.assertEqual(echo_roundtrip(p, b"plain too\n", timeout=5), b"plain too\n")
        self.assertLess(time.monotonic() - t0, 5)
        tw.stop()


class SlowTlsPeerTest(h.TestCase):
    def test_slow_client_reader_tls_both_sides(self):
        """Backpressure across TLS on both sides: 256 MiB to a client that
        reads nothing for 5 s; twice's RSS stays < 64 MiB."""
        srv = h.HashServer(tls=h.server_ssl_context(CERTS.server_pem, CERTS.server_key), name="hash-tls-slow")
        self.addCleanup(srv.close)
        port = h.free_port()
        tw = self.twice(h.config(h.listen_block(
            "tlsboth", port, srv.port,
            "tls cert %s key %s\nupstream-tls ca %s sni localhost" % (CERTS.server_pem, CERTS.server_key,
                                                                    CERTS.ca_pem)), log_level="info"))
        size = 256 * h.MiB
        s = h.client_ssl_context(CERTS.ca_pem).wrap_socket(h.connect(port, timeout=30),
                                                           server_hostname="localhost")
        self.addCleanup(s.close)
        sampler = RssSampler(tw)
        sampler.start()
        s.sendall(h.HASH_HDR.pack(h.HASH_MAGIC, h.FLAG_PATTERN, 0, size, 99, 0))
        time.sleep(5)   # the scenario: the client reads nothing for 5 s
        stall_rss = sampler.max_kib
        hsh = hashlib.sha256()
        n = 0
        total = size + h.HASH_TRAILER.size
        tail = bytearray()
        while n < total:
            data = s.recv(min(1 << 20, total - n))
            if not data:
                break
            pay = max(0, min(len(data), size - n))
            hsh.update(memoryview(data)[:pay])
            tail += data[pay:]
            n += len(data)
        max_rss = sampler.stop()
        h.log("TLS slow reader: RSS during stall %d KiB, max %d KiB" % (stall_rss, max_rss))
        self.assertEqual(n, total)
        self.assertEqual(hsh.digest(), h.pattern_sha256(99, size))
        self.assertLess(stall_rss, RSS_LIMIT_KIB)
        self.assertLess(max_rss, RSS_LIMIT_KIB)
        tw.stop()


class AddressTest(h.TestCase):
    def test_upstream_by_name_and_ipv6(self):
        echo4 = h.EchoServer(name="echo-v4")
        self.addCleanup(echo4.close)
        try:
            echo6 = h.EchoServer(name="echo-v6", host="::1")
        except OSError as e:
            self.skipTest("no IPv6 loopback: %r" % e)
        self.addCleanup(echo6.close)
        p_name, p_v6up, p_v6bind = h.free_port(), h.free_port(), h.free_port()
        tw = self.twice(
            h.config(h.listen_block("byname", p_name, "localhost:%d" % echo4.port),
                     h.listen_block("v6up", p_v6up, "[::1]:%d" % echo6.port),
                     "listen v6bind {\n  protocol tcp\n  bind [::1]:%d\n  upstream 127.0.0.1:%d\n}\n"
                     % (p_v6bind, echo4.port)))
        for name, host, port in (("byname", "127.0.0.1", p_name), ("v6up", "127.0.0.1", p_v6up),
                                 ("v6bind", "::1", p_v6bind)):
            with self.subTest(listener=name):
                with socket.create_connection((host, port), timeout=10) as s:
                    self.assertEqual(echo_roundtrip(s, b"via %s\n" % name.encode()), b"via %s\n" % name.encode())
        tw.stop()


class CliTest(h.TestCase):
    def test_version(self):
        r = h.run_twice(["--version"])
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("twice 0.1.0", (r.stdout + r.stderr).decode())

    def test_check(self):
        port = h.free_port()
        good = os.path.join(self.tmp, "good.conf")
        with open(good, "w") as f:
            f.write(h.config(h.listen_block("ok", port, 6379)))
        r = h.run_twice(["check", "-c", good])
        self.assertEqual(r.returncode, 0, "twice check on a valid file: %r" % (r,))
        self.assertNotIn(b"error", r.stderr)

        # Every example file: its summary names each rule, and ends with its line's newline
        # (the shell's prompt must not run on after the last rule).
        examples = os.path.join(h.SOURCE_DIR, "rules", "examples")
        for name in sorted(os.listdir(examples)):
            r = h.run_twice(["check", "-c", os.path.join(examples, name)])
            self.assertEqual(r.returncode, 0, (name, r))
            out = r.stdout.decode()
            self.assertTrue(out.endswith("\n"), "%s: the summary ends without a newline: %r"
                            % (name, out[-80:]))
            self.assertIn(" rule", out.splitlines()[0], (name, out))
            self.assertTrue(re.match(r"  rule \S+ on \S+: ", out.splitlines()[-1]), (name, out))

        bad = os.path.join(self.tmp, "bad.conf")
        with open(bad, "w") as f:
            f.write("log-level debug\n"                      # 1
                    "listen broken {\n"                      # 2
                    "  protocol tcp\n"                       # 3
                    "  bind 127.0.0.1:%d\n"                  # 4
                    "  upstrem 127.0.0.1:6379\n"             # 5  misspelled keyword
                    "}\n"                                    # 6
                    "conect-timeout 2s\n" % port)            # 7  misspelled keyword
        r = h.run_twice(["check", "-c", bad])
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 1, "twice check on an invalid file: rc=%s stderr=%s" % (r.returncode, err))
        diags = re.findall(r"^(.*):(\d+):(\d+): error: (.*)$", err, re.M)
        self.assertTrue(diags, "no FILE:LINE:COL: error: lines in:\n" + err)
        for path, _, _, _ in diags:
            self.assertTrue(path.endswith("bad.conf"), path)
        lines = {int(l) for _, l, _, _ in diags}
        self.assertIn(5, lines, "no diagnostic for line 5 (upstrem):\n" + err)
        self.assertIn(7, lines, "no diagnostic for line 7 (conect-timeout): all errors must be reported:\n" + err)
        col5 = [int(c) for _, l, c, _ in diags if int(l) == 5]
        self.assertIn(3, col5, "line 5's diagnostic should point at column 3 (the keyword):\n" + err)
        self.assertFalse(h.port_open(port), "twice check must not listen")

        # run refuses the same file, and does not listen either
        r = h.run_twice(["run", "-c", bad], timeout=20)
        self.assertNotEqual(r.returncode, 0, "twice run accepted an invalid file")
        self.assertFalse(h.port_open(port))

    def test_check_summary_shows_triggers(self):
        """The summary of `twice check` says what each rule acts on: its matchers, its triggers
        (a bare `probability 1` shown as the 100% it is, with a warning asking whether 1% was
        meant), and the earlier rules that take its events first."""
        path = os.path.join(self.tmp, "summary.conf")
        with open(path, "w") as f:
            f.write(h.config(h.listen_block("mq", h.free_port(), 5672, protocol="amqp")) +
                "rule lost on mq {\n  when ack queue=pay*\n  every 10\n  probability 5%\n"
                "  do redeliver\n}\n"
                "rule slow on mq {\n  when ack queue=payments\n  probability 1\n"
                "  do delay 5s\n}\n"
                "rule jitter on mq {\n  between 30s 5m\n  do latency 20ms\n}\n")
        r = h.run_twice(["check", "-c", path])
        self.assertEqual(r.returncode, 0, r)
        out = r.stdout.decode().splitlines()
        self.assertEqual(out[-3:], [
            "  rule lost on mq: when ack queue=pay*, every 10, probability 5% -> redeliver",
            "  rule slow on mq: when ack queue=payments, probability 100%, unless 'lost' acts "
            "first -> delay 5000ms",
            "  rule jitter on mq: every connection, between 30s 5m -> latency 20ms jitter 0ms both",
        ])
        self.assertIn("summary.conf:17:15: warning: probability '1' is a fraction: every event "
                      "(100%) (did you mean '1%'? write '100%' to say so)\n", r.stderr.decode())

    def test_check_missing_tls_files(self):
        """A `tls` line naming files that don't exist is an error of check,
        located at that line."""
        port = h.free_port()
        bad = os.path.join(self.tmp, "tls.conf")
        with open(bad, "w") as f:
            f.write("listen t {\n"                                            # 1
                    "  protocol tcp\n"                                        # 2
                    "  bind 127.0.0.1:%d\n"                                   # 3
                    "  upstream 127.0.0.1:6379\n"                             # 4
                    "  tls cert %s/missing.pem key %s/missing.key\n"          # 5
                    "}\n" % (port, self.tmp, self.tmp))
        r = h.run_twice(["check", "-c", bad])
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 1, "check accepted a tls cert that does not exist: %s" % err)
        self.assertRegex(err, r"(?m)^.*tls\.conf:5:\d+: error: ")

    def test_run_bind_in_use(self):
        """twice run on an address that is already taken exits non-zero
        with a message instead of running without its listener."""
        blocker = socket.socket()
        self.addCleanup(blocker.close)
        port = h.free_port()
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        conf = os.path.join(self.tmp, "busy.conf")
        with open(conf, "w") as f:
            f.write(h.config(h.listen_block("busy", port, 6379)))
        try:
            r = h.run_twice(["run", "-c", conf], timeout=15)
        except subprocess.TimeoutExpired:
            self.fail("twice run kept running although its only listener could not bind")
        self.assertNotEqual(r.returncode, 0)
        # The listener and its line, as `twice check` would say it: the port is another's.
        self.assertIn('error="%s:6:8: listener \'busy\' cannot listen on 127.0.0.1:%d: Address '
                      'already in use"' % (conf, port), r.stderr.decode(errors="replace"))

    def test_file_first_or_by_flag(self):
        """run and check take their file as their first argument or by -c / --config, the
        same file either way; a second, different file or none is a usage error (exit 2)
        that says so and shows the command's usage."""
        echo = h.EchoServer(name="echo-cli")
        self.addCleanup(echo.close)
        port = h.free_port()
        path = os.path.join(self.tmp, "cli.conf")
        with open(path, "w") as f:
            f.write(h.config(h.listen_block("cli", port, echo.port)))
        forms = [[path], ["-c", path], ["--config", path], ["--config=%s" % path],
                 [path, "-c", path]]
        outs = set()
        for form in forms:
            r = h.run_twice(["check"] + form)
            self.assertEqual((r.returncode, r.stderr), (0, b""), (form, r))
            outs.add(r.stdout)
        self.assertEqual(len(outs), 1, "check printed different summaries: %r" % outs)
        self.assertTrue(outs.pop().startswith(("%s: OK: 1 listener" % path).encode()))

        other = os.path.join(self.tmp, "other.conf")
        for argv, want in (
                (["check", path, other],
                 "twice check: more than one configuration file given: '%s' and '%s'\n"
                 % (path, other)),
                (["run", "-c", other, path],
                 "twice run: more than one configuration file given: '%s' and '%s'\n"
                 % (other, path)),
                (["check"], "twice check: no configuration file given\n"),
                (["run", "-c"], "twice run: -c needs a value\n"),
                (["check", path, "--verbose"], "twice check: unknown argument '--verbose'\n")):
            r = h.run_twice(argv, timeout=20)
            err = r.stderr.decode()
            self.assertEqual(r.returncode, 2, (argv, r))
            self.assertTrue(err.startswith(want), (argv, err))
            self.assertIn("usage: twice %s CONFIG\n" % argv[0], err)
            self.assertFalse(h.port_open(port), "%r listened" % argv)

        # run, the file first and by --config=: each serves its listener
        for file_args in (lambda p: ["run", p], lambda p: ["run", "--config=%s" % p]):
            tw = self.twice(h.config(h.listen_block("cli", port, echo.port)), file_args=file_args)
            with h.connect(port) as s:
                self.assertEqual(echo_roundtrip(s, b"cli\n"), b"cli\n")
            tw.stop()

    def test_help(self):
        """`twice help` names every command with its file first; `twice help CMD` and
        `twice CMD --help` print that command's usage, whose first line is the same form."""
        r = h.run_twice(["help"])
        self.assertEqual(r.returncode, 0, r)
        text = r.stdout.decode()
        forms = {"run": "CONFIG", "check": "CONFIG", "report": "JOURNAL", "verdict": "JOURNAL"}
        for cmd, file in forms.items():
            self.assertRegex(text, r"(?m)^(usage: |       )twice %s %s\b" % (cmd, file))
            r = h.run_twice(["help", cmd])
            self.assertEqual((r.returncode, r.stderr), (0, b""), (cmd, r))
            self.assertTrue(r.stdout.decode().startswith("usage: twice %s %s" % (cmd, file)),
                            (cmd, r.stdout))
            self.assertEqual(h.run_twice([cmd, "--help"]).stdout, r.stdout, cmd)
        self.assertEqual(h.run_twice(["--help"]).stdout.decode(), text)
        r = h.run_twice(["help", "nope"])
        self.assertEqual(r.returncode, 2, r)
        self.assertTrue(r.stderr.decode().startswith("twice help: unknown command 'nope'\n"), r)
        # one command at a time: the second is not dropped silently
        r = h.run_twice(["help", "report", "verdict"])
        self.assertEqual(r.returncode, 2, r)
        self.assertEqual(r.stderr, b"twice help: one command at a time, not 'verdict' too\n")
        r = h.run_twice(["--version", "report"])
        self.assertEqual((r.returncode, r.stdout), (2, b""), r)
        self.assertEqual(r.stderr, b"twice --version: takes no argument, not 'report'\n")

    def test_admin_bind_in_use(self):
        """An admin address another process holds: twice run exits naming `admin`'s line and
        the reason, as it does for a listener; a reload that would move the API there says
        the same and keeps the API where it was."""
        blocker = socket.socket()
        self.addCleanup(blocker.close)
        taken = h.free_port()
        blocker.bind(("127.0.0.1", taken))
        blocker.listen(1)
        conf = os.path.join(self.tmp, "admin-busy.conf")
        listen = h.listen_block("l", h.free_port(), 6379)
        with open(conf, "w") as f:
            f.write("admin 127.0.0.1:%d\n" % taken + listen)
        r = h.run_twice(["run", conf], timeout=15)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('error="%s:1:7: admin API cannot listen on 127.0.0.1:%d: Address already in '
                      'use"' % (conf, taken), r.stderr.decode(errors="replace"))

        port = h.free_port()
        tw = self.twice("admin 127.0.0.1:%d\n" % port + listen)
        tw.wait_for_log(r"msg=\"admin listening\"")
        tw.write_config("admin 127.0.0.1:%d\n" % taken + listen)
        tw.signal(signal.SIGHUP)
        rec = tw.wait_for_records("admin API not moved")[0]
        self.assertEqual(rec["error"], "%s:1:7: admin API cannot listen on 127.0.0.1:%d: Address "
                         "already in use" % (tw.conf_path, taken))
        self.assertEqual(fk.Admin(port).get("/healthz")[:3:2], (200, "ok\n"))
        tw.stop()

    def test_check_missing_file(self):
        path = os.path.join(self.tmp, "nope.conf")
        r = h.run_twice(["check", "-c", path])
        self.assertEqual(r.returncode, 1, r)
        self.assertEqual(r.stderr.decode(), "%s: error: cannot open: No such file or directory\n"
                         "%s: 1 error\n" % (path, path))


if __name__ == "__main__":
    unittest.main(verbosity=2)
