#!/usr/bin/python3
"""Stream and connect faults on `protocol tcp` listeners, as a client sees them.

One twice with one listener per action in front of a real Redis (and a few
small Python upstreams), plus separate twice runs for the seeded triggers:

- latency: a PING takes at least the injected latency; direct PINGs are fast;
- jitter: many PINGs on one connection spread inside latency +- jitter;
- bandwidth: a 1 MB GET at 500KB/s takes >= ~1.6 s and arrives intact;
- slice: a 20 KB reply comes in many separate recv() chunks, intact;
- reset: the client gets ConnectionResetError (at once, or after N ms);
- blackhole upstream: no reply, the connection stays open, others work;
- slow-close: the upstream's EOF reaches the client ~1 s after the reply;
- limit: exactly N bytes then EOF, logged as reason=fault;
- when connect: close before (upstream never contacted), close after,
  delay (first reply late), and a client= CIDR that does not match;
- an EOF behind latency / bandwidth still reaches the other side (both
  directions), and the session then closes;
- several rules on one connection add up (latencies add, the smallest
  bandwidth / limit wins); limit combined with latency, slice or bandwidth
  still delivers exactly N (shaped) bytes; limit upstream: the broker gets N;
- pipelined replies keep their order under jitter;
- probability 50% with a fixed seed faults the same sessions run after run,
  another seed faults others; every 3 faults sessions 3, 6, 9, ...; nth,
  first, after + limit, between; counters continue across a reload.
"""

import os
import signal
import socket
import statistics
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import clientkit as ck  # noqa: E402

# listener name -> rule lines (None: no rule)
STREAM_RULES = {
    "plain": None,
    "lat": ["stream downstream", "do latency 200ms"],
    "jit": ["stream downstream", "do latency 100ms jitter 50ms"],
    "bw": ["stream downstream", "do bandwidth 500KB/s"],
    "slice": ["stream downstream", "do slice 1KB delay 5ms"],
    "slice0": ["stream downstream", "do slice 3B"],
    "rst": ["do reset"],
    "rstafter": ["do reset after 300ms"],
    "bh": ["stream upstream", "do blackhole"],
    "lim": ["stream downstream", "do limit 100B"],
    "delay": ["when connect", "do delay 500ms"],
    "nomatch": ["when connect client=10.0.0.0/8", "do close before"],
}

# Two rules on one listener: limit combined with a shaping action.  The
# limit still means "exactly N bytes reach the client, then EOF", and the
# other action still shapes those bytes.
COMBO_RULES = {
    "latlim": (["stream downstream", "do latency 300ms"], ["stream downstream", "do limit 100B"]),
    "slicelim": (["stream downstream", "do slice 10B delay 5ms"], ["stream downstream", "do limit 100B"]),
    "bwlim": (["stream downstream", "do bandwidth 20KB/s"], ["stream downstream", "do limit 10000B"]),
}


class StreamFaults(ck.BrokerCase):
    """One twice, one Redis, one listener per fault."""

    REDIS = True
    TMP_PREFIX = "twice-it-stream-"

    @classmethod
    def twice_config(cls):
        cls.refuse_srv = h.EchoServer(name="refuse-up")
        cls.after_srv = h.EchoServer(name="after-up")
        cls.rc_srv = fk.ReplyCloseServer(name="rc-up")
        cls.ports = {}
        blocks, rules = [], []
        for name, lines in STREAM_RULES.items():
            cls.ports[name] = h.free_port()
            blocks.append(ck.listen(name, cls.ports[name], cls.redis.port))
            if lines:
                rules.append(fk.rule_block("r_" + name, name, *lines))
        for name, (a, b) in COMBO_RULES.items():
            cls.ports[name] = h.free_port()
            blocks.append(ck.listen(name, cls.ports[name], cls.redis.port))
            rules.append(fk.rule_block("r_%s_a" % name, name, *a))
            rules.append(fk.rule_block("r_%s_b" % name, name, *b))
        # several rules on one connection add up: latencies add, the
        # smallest bandwidth and the smallest limit win
        for name, rl in (("latadd", (["stream downstream", "do latency 100ms"],
                                     ["stream downstream", "do latency 150ms"])),
                         ("bwmin", (["stream downstream", "do bandwidth 1MB/s"],
                                    ["stream downstream", "do bandwidth 200KB/s"])),
                         ("limmin", (["stream downstream", "do limit 500B"],
                                     ["stream downstream", "do limit 100B"]))):
            cls.ports[name] = h.free_port()
            blocks.append(ck.listen(name, cls.ports[name], cls.redis.port))
            for i, lines in enumerate(rl):
                rules.append(fk.rule_block("r_%s_%d" % (name, i), name, *lines))
        cls.rec_srv = fk.RecordServer(name="limup-up")
        cls.hc_srv = h.EchoServer(name="halfclose-up")
        cls.rc_big = os.urandom(50 * 1000)
        cls.rcbig_srv = fk.ReplyCloseServer(reply=cls.rc_big, name="rcbig-up")
        extra = {
            "limup": (cls.rec_srv.port, ["stream upstream", "do limit 10B"]),
            "refuse": (cls.refuse_srv.port, ["when connect client=127.0.0.0/8", "do close before"]),
            "closeafter": (cls.after_srv.port, ["when connect client=127.0.0.1/32", "do close after"]),
            "slowclose": (cls.rc_srv.port, ["stream downstream", "do slow-close 1s"]),
            "rcplain": (cls.rc_srv.port, None),
            "latclose": (cls.rc_srv.port, ["stream downstream", "do latency 200ms"]),
            "latup": (cls.hc_srv.port, ["stream upstream", "do latency 200ms"]),
            "bwclose": (cls.rcbig_srv.port, ["stream downstream", "do bandwidth 100KB/s"]),
        }
        for name, (up, lines) in extra.items():
            cls.ports[name] = h.free_port()
            blocks.append(ck.listen(name, cls.ports[name], up))
            if lines:
                rules.append(fk.rule_block("r_" + name, name, *lines))
        cls.conf = fk.conf_text(blocks, rules, seed=42)
        return cls.conf

    @classmethod
    def set_up_class(cls):
        cls.big = os.urandom(500 * 1000).hex().encode()   # 1,000,000 bytes
        cls.mid = os.urandom(10 * 1024).hex().encode()    # 20 KiB
        assert cls.redis.command("SET", "big", cls.big) == b"OK"
        assert cls.redis.command("SET", "mid", cls.mid) == b"OK"
        cls.med = os.urandom(50 * 1000).hex().encode()    # 100,000 bytes
        assert cls.redis.command("SET", "med", cls.med) == b"OK"

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            for s in (cls.refuse_srv, cls.after_srv, cls.rc_srv, cls.rec_srv, cls.hc_srv,
                      cls.rcbig_srv):
                s.close()

    def setUp(self):
        super().setUp()
        self.log_start = len(self.tw.log_lines())

    def _dump_on_fail(self):
        return "\n--- twice log tail ---\n" + self.tw.log_tail(60)

    def faults_of(self, listener):
        return fk.fault_records(self.tw, listener=listener)

    # -- latency ----------------------------------------------------------

    def test_latency(self):
        direct = []
        for _ in range(5):
            with fk.RespConn(self.redis.port) as c:
                direct.append(c.timed("PING")[1])
        plain = [fk.ping_rtt(self.ports["plain"])[0] for _ in range(5)]
        slow = []
        addrs = []
        for _ in range(3):
            dt, addr = fk.ping_rtt(self.ports["lat"])
            slow.append(dt)
            addrs.append(addr)
        h.log("direct %s plain %s latency %s" % (
            ["%.3f" % x for x in direct], ["%.3f" % x for x in plain], ["%.3f" % x for x in slow]))
        self.assertGreaterEqual(min(slow), 0.19, "PING through `latency 200ms` came back too fast")
        self.assertLess(max(slow), 2.0)
        self.assertLess(statistics.median(direct), 0.1)
        self.assertLess(statistics.median(plain), 0.1, "a listener without rules is slow")
        # one fault line per faulted connection, with the rule and action
        sids = [fk.sid_of(self.tw, a) for a in addrs]
        recs = {int(r["sid"]): r for r in self.faults_of("lat")}
        for sid in sids:
            self.assertIn(sid, recs, self._dump_on_fail())
            self.assertEqual(recs[sid]["rule"], "r_lat")
            self.assertEqual(recs[sid]["action"], "latency")
            self.assertEqual(recs[sid]["event"], "stream")
            self.assertIn("200ms", recs[sid]["detail"])
        self.assertEqual(self.faults_of("plain"), [])

    def test_jitter_spread(self):
        rtts = []
        with fk.RespConn(self.ports["jit"]) as c:
            for _ in range(30):
                r, dt = c.timed("PING")
                self.assertEqual(r, b"PONG")
                rtts.append(dt)
        ms = sorted(round(x * 1000) for x in rtts)
        h.log("jitter RTTs (ms): %s" % ms)
        self.assertGreaterEqual(min(rtts), 0.045, "a chunk left before latency - jitter")
        self.assertLessEqual(max(rtts), 0.25 + 0.25, "a chunk left long after latency + jitter")
        self.assertGreater(len(set(ms)), 5, "jitter 50ms gave (nearly) constant delays")
        self.assertGreaterEqual(max(rtts) - min(rtts), 0.03, "jitter spread too small")
        # both halves of the window are used
        self.assertLess(min(rtts), 0.1)
        self.assertGreater(max(rtts), 0.1)

    # -- bandwidth ------------------------------------------------------------

    def test_bandwidth(self):
        with fk.RespConn(self.ports["bw"], timeout=60) as c:
            r, dt = c.timed("GET", "big")
        h.log("1 MB at 500KB/s took %.2fs" % dt)
        self.assertEqual(len(r), len(self.big))
        self.assertTrue(r == self.big, "the value arrived corrupted")
        self.assertGreaterEqual(dt, 1.6, "1,000,000 bytes at 500KB/s arrived in %.2fs" % dt)
        self.assertLess(dt, 15)
        # direct: fast
        with fk.RespConn(self.ports["plain"], timeout=60) as c:
            r, dt2 = c.timed("GET", "big")
        self.assertEqual(r, self.big)
        self.assertLess(dt2, 1.0)

    # -- slice ----------------------------------------------------------------

    def test_slice(self):
        s = h.connect(self.ports["slice"])
        try:
            s.sendall(fk.resp_cmd("GET", "mid"))
            want = b"$%d\r\n%s\r\n" % (len(self.mid), self.mid)
            got = bytearray()
            chunks = []
            t0 = time.monotonic()
            while len(got) < len(want):
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(len(data))
                got += data
            dt = time.monotonic() - t0
        finally:
            s.close()
        h.log("slice: %d chunks in %.3fs, sizes %s" % (len(chunks), dt, chunks[:30]))
        self.assertEqual(bytes(got), want, "sliced reply corrupted or cut")
        self.assertGreaterEqual(len(chunks), 15, "a 20 KB reply with slice 1KB came in %d recv()s" % len(chunks))
        # (a busy client may read two slices at once; most must come alone)
        self.assertGreaterEqual(sum(1 for n in chunks if n == 1000), 10, chunks)
        self.assertGreaterEqual(dt, 0.08, "20 slices 5 ms apart arrived in %.3fs" % dt)

    def test_slice_without_delay_keeps_flowing(self):
        # The last slice of a reply released from the write callback used to
        # leave the shaper waiting for a drain nobody reported: the next
        # reply on that connection never came.
        s = h.connect(self.ports["slice0"])
        s.settimeout(10)
        f = s.makefile("rb")
        try:
            for i in range(5):
                payload = b"r%d-" % i + b"x" * (20 + 7 * i)
                s.sendall(fk.resp_cmd("ECHO", payload))
                self.assertEqual(f.readline(), b"$%d\r\n" % len(payload))
                self.assertEqual(f.readline(), payload + b"\r\n")
        finally:
            s.close()

    def test_slicing_session_does_not_stall_others(self):
        # A slice without a delay is released as soon as the previous one is
        # written; written from the same flush pass, one session's 1 MB reply in
        # 3-byte slices kept the whole proxy in one callback, and the other
        # sessions' replies waited for it.
        done = threading.Event()
        got = {}

        def big_reader():
            s = h.connect(self.ports["slice0"])
            s.settimeout(60)
            try:
                s.sendall(fk.resp_cmd("GET", "big"))
                f = s.makefile("rb")
                got["hdr"] = f.readline()
                got["body"] = f.read(len(self.big) + 2)
            finally:
                done.set()
                s.close()

        th = threading.Thread(target=big_reader, daemon=True)
        th.start()
        p = h.connect(self.ports["plain"])
        p.settimeout(30)
        pf = p.makefile("rb")
        pings = 0
        try:
            while not done.is_set() and pings < 50:
                p.sendall(fk.resp_cmd("PING"))
                self.assertEqual(pf.readline(), b"+PONG\r\n")
                if not done.is_set():
                    pings += 1
        finally:
            p.close()
        th.join(60)
        self.assertEqual(got.get("hdr"), b"$%d\r\n" % len(self.big))
        self.assertEqual(got.get("body"), self.big + b"\r\n", "the sliced reply was cut or corrupted")
        h.log("slice 3B of 1 MB: %d PINGs answered on another session meanwhile" % pings)
        self.assertGreaterEqual(pings, 20, "other sessions were not served while one was slicing")

    # -- reset ----------------------------------------------------------------

    def test_reset_immediate(self):
        n_before = len(fk.closed_records(self.tw, listener="rst"))
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            # the RST may even beat connect() back to a slow client
            with self.assertRaises(ConnectionResetError):
                try:
                    s.connect(("127.0.0.1", self.ports["rst"]))
                    s.sendall(fk.resp_cmd("PING"))
                except BrokenPipeError as e:
                    raise ConnectionResetError(str(e))
                data = s.recv(100)
                # an EOF or data instead of a reset is a failure
                self.fail("expected ECONNRESET, got %r" % data)
        finally:
            s.close()
        h.wait_until(lambda: len(fk.closed_records(self.tw, listener="rst")) > n_before, 60,
                     what="the reset session's close line")
        rec = fk.closed_records(self.tw, listener="rst")[-1]
        self.assertEqual(rec["reason"], "fault", rec)
        self.assertIn("r_rst", rec.get("error", ""))

    def test_reset_after(self):
        s = h.connect(self.ports["rstafter"], timeout=10)
        addr = h.client_addr(s)
        t0 = time.monotonic()
        try:
            s.sendall(fk.resp_cmd("PING"))
            self.assertEqual(s.recv(100), b"+PONG\r\n", "the connection must work until the reset")
            with self.assertRaises(ConnectionResetError):
                data = s.recv(100)
                self.fail("expected ECONNRESET, got %r" % data)
            dt = time.monotonic() - t0
        finally:
            s.close()
        h.log("reset after 300ms: reset seen %.3fs after connect" % dt)
        self.assertGreaterEqual(dt, 0.25)
        self.assertLess(dt, 5)
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault")

    # -- blackhole ------------------------------------------------------------

    def test_blackhole_upstream(self):
        s = h.connect(self.ports["bh"], timeout=10)
        addr = h.client_addr(s)
        try:
            s.sendall(fk.resp_cmd("PING"))
            # No event follows a blackholed command: 1 s is a lower bound for
            # a reply that should not come (Redis answers in microseconds).
            s.settimeout(1.0)
            with self.assertRaises(socket.timeout, msg="a blackholed command got a reply"):
                s.recv(100)
            # still open: no EOF, no reset, and it accepts more bytes
            s.sendall(fk.resp_cmd("PING"))
            time.sleep(0.2)   # a lower bound too, for a reply or a close that should not come
            s.setblocking(False)
            with self.assertRaises(BlockingIOError, msg="blackholed connection got data or EOF"):
                s.recv(100, socket.MSG_PEEK)
            s.settimeout(10)
            # another listener without blackhole works meanwhile
            self.assertLess(fk.ping_rtt(self.ports["plain"])[0], 5)
        finally:
            s.close()
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "client_closed", rec)
        self.assertEqual(rec["bytes_down"], "0")

    # -- slow-close -----------------------------------------------------------

    def _reply_then_eof(self, port):
        s = h.connect(port, timeout=10)
        try:
            s.sendall(b"hi\n")
            self.assertEqual(h.recv_exact(s, 4), b"bye\n")
            t_reply = time.monotonic()
            rest = h.recv_all(s)
            return time.monotonic() - t_reply, rest
        finally:
            s.close()

    def test_slow_close(self):
        base, rest = self._reply_then_eof(self.ports["rcplain"])
        self.assertEqual(rest, b"")
        slow, rest = self._reply_then_eof(self.ports["slowclose"])
        h.log("EOF after reply: plain %.3fs, slow-close 1s %.3fs" % (base, slow))
        self.assertEqual(rest, b"")
        self.assertLess(base, 0.5, "without slow-close the EOF should follow the reply")
        self.assertGreaterEqual(slow, 0.9, "slow-close 1s passed the EOF on after %.3fs" % slow)
        self.assertLess(slow, 5)

    def test_latency_passes_eof(self):
        """The upstream replies then closes; with latency on the reply the
        client still gets the reply (late) and then the EOF."""
        s = h.connect(self.ports["latclose"], timeout=10)
        addr = h.client_addr(s)
        try:
            t0 = time.monotonic()
            s.sendall(b"hi\n")
            self.assertEqual(h.recv_exact(s, 4), b"bye\n")
            dt = time.monotonic() - t0
            try:
                eof_after = h.wait_closed(s, 30)
            except TimeoutError:
                eof_after = None
        finally:
            s.close()
        self.assertGreaterEqual(dt, 0.19)
        self.assertIsNotNone(eof_after, "the upstream closed after replying, but behind `latency` "
                             "the client never got the EOF" + self._dump_on_fail())
        self.tw.wait_sessions([addr])

    def test_bandwidth_passes_eof(self):
        """The upstream sends 50 KB and closes; at 100KB/s the client gets all
        of it in >= ~0.4 s, then the EOF."""
        s = h.connect(self.ports["bwclose"], timeout=10)
        try:
            t0 = time.monotonic()
            s.sendall(b"go\n")
            data = h.recv_exact(s, len(self.rc_big))
            dt = time.monotonic() - t0
            try:
                h.wait_closed(s, 30)
                eof = True
            except TimeoutError:
                eof = False
        finally:
            s.close()
        self.assertEqual(data, self.rc_big)
        self.assertGreaterEqual(dt, 0.4)
        self.assertTrue(eof, "the upstream closed after its reply, but behind `bandwidth` the "
                        "client never got the EOF")

    def test_half_close_through_latency(self):
        """Client sends, then half-closes; with latency upstream the echo
        server gets the bytes and the EOF, so the client reads the echo and EOF."""
        s = h.connect(self.ports["latup"], timeout=10)
        try:
            t0 = time.monotonic()
            s.sendall(b"abc")
            s.shutdown(socket.SHUT_WR)
            self.assertEqual(h.recv_exact(s, 3), b"abc")
            dt = time.monotonic() - t0
            try:
                h.wait_closed(s, 30)
                eof = True
            except TimeoutError:
                eof = False
        finally:
            s.close()
        self.assertGreaterEqual(dt, 0.19)
        self.assertTrue(eof, "a half-close sent through `latency ... upstream` never reached the "
                        "upstream (no EOF came back)" + self._dump_on_fail())

    # -- limit ----------------------------------------------------------------

    def test_limit(self):
        s = h.connect(self.ports["lim"], timeout=10)
        addr = h.client_addr(s)
        try:
            s.sendall(fk.resp_cmd("GET", "big"))
            data = h.recv_all(s)
        finally:
            s.close()
        want = (b"$%d\r\n" % len(self.big) + self.big)[:100]
        self.assertEqual(len(data), 100, "limit 100B delivered %d bytes" % len(data))
        self.assertEqual(data, want)
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        self.assertIn("r_lim", rec.get("error", ""))
        self.assertNotEqual(rec["bytes_down"], "0")
        sid = int(rec["sid"])
        self.assertIn(sid, fk.fault_sids(self.tw, listener="lim", action="limit"))

    def test_limit_upstream(self):
        """limit 10B upstream: the broker receives exactly the first 10 bytes."""
        n_before = len(self.rec_srv.received)
        s = h.connect(self.ports["limup"], timeout=10)
        addr = h.client_addr(s)
        try:
            s.sendall(b"0123456789abcdefghij")
            h.wait_closed(s, 30)
        finally:
            s.close()
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        h.wait_until(lambda: self.rec_srv.ended > n_before, 60, what="the upstream connection to end")
        self.assertEqual(bytes(self.rec_srv.received[n_before]), b"0123456789")

    def _combo_get(self, listener, key, value):
        s = h.connect(self.ports[listener], timeout=30)
        addr = h.client_addr(s)
        t0 = time.monotonic()
        try:
            s.sendall(fk.resp_cmd("GET", key))
            data = h.recv_all(s)
        except ConnectionResetError as e:
            data = b"<reset: %s>" % str(e).encode()
        finally:
            s.close()
        dt = time.monotonic() - t0
        rec = self.tw.wait_sessions([addr])[addr]
        h.log("%s: %d bytes then EOF after %.3fs; %s" % (listener, len(data), dt, rec))
        return (b"$%d\r\n" % len(value) + value), data, dt, rec

    def test_limit_with_latency(self):
        full, data, dt, rec = self._combo_get("latlim", "mid", self.mid)
        self.assertEqual(rec["reason"], "fault")
        self.assertEqual(len(data), 100, "latency + limit 100B delivered %d bytes" % len(data))
        self.assertEqual(data, full[:100])
        self.assertGreaterEqual(dt, 0.28, "the limited bytes skipped the 300ms latency")

    def test_limit_with_slice(self):
        full, data, dt, rec = self._combo_get("slicelim", "mid", self.mid)
        self.assertEqual(rec["reason"], "fault")
        self.assertEqual(len(data), 100, "slice 10B + limit 100B delivered %d bytes" % len(data))
        self.assertEqual(data, full[:100])

    def test_limit_with_bandwidth(self):
        full, data, dt, rec = self._combo_get("bwlim", "mid", self.mid)
        self.assertEqual(rec["reason"], "fault")
        self.assertEqual(len(data), 10000, "bandwidth + limit 10000B delivered %d bytes" % len(data))
        self.assertEqual(data, full[:10000])
        self.assertGreaterEqual(dt, 0.4, "10000 bytes at 20KB/s arrived in %.3fs" % dt)

    def test_rules_add_up(self):
        dt, _ = fk.ping_rtt(self.ports["latadd"])
        self.assertGreaterEqual(dt, 0.24, "latency 100ms + latency 150ms gave %.3fs" % dt)
        with fk.RespConn(self.ports["bwmin"], timeout=30) as c:
            r, dt = c.timed("GET", "med")
        self.assertEqual(r, self.med)
        h.log("100 KB under bandwidth 1MB/s + 200KB/s: %.3fs" % dt)
        self.assertGreaterEqual(dt, 0.4, "the smaller bandwidth (200KB/s) did not win")
        s = h.connect(self.ports["limmin"], timeout=10)
        try:
            s.sendall(fk.resp_cmd("GET", "mid"))
            data = h.recv_all(s)
        finally:
            s.close()
        self.assertEqual(len(data), 100, "limit 500B + limit 100B delivered %d bytes" % len(data))

    # -- order ------------------------------------------------------------------

    def test_jitter_keeps_order(self):
        """Replies to pipelined commands sent as separate chunks come back in
        order although each chunk draws its own jittered delay."""
        with fk.RespConn(self.ports["jit"]) as c:
            n = 40
            for i in range(n):
                c.sock.sendall(fk.resp_cmd("ECHO", "m%03d" % i))
                time.sleep(0.003)
            got = [c.read_reply() for _ in range(n)]
        self.assertEqual(got, [b"m%03d" % i for i in range(n)])

    # -- connect rules --------------------------------------------------------

    def test_close_before(self):
        before = self.refuse_srv.stats()["accepted"]
        s = h.connect(self.ports["refuse"], timeout=10)
        addr = h.client_addr(s)
        try:
            t0 = time.monotonic()
            dt = h.wait_closed(s, 5)
        finally:
            s.close()
        self.assertLess(dt, 1.0)
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        self.assertIn("r_refuse", rec.get("error", ""))
        # A connection of our own to the upstream, after the session is over:
        # its accept loop takes connections in the order they were made, so
        # once it counted ours, it counted any twice had made before.
        with h.connect(self.refuse_srv.port):
            h.wait_until(lambda: self.refuse_srv.stats()["accepted"] > before, 60,
                         what="our own connection to the upstream to be accepted")
        self.assertEqual(self.refuse_srv.stats()["accepted"] - 1, before,
                         "`close before` must not contact the upstream")
        self.assertLess(time.monotonic() - t0, 5)
        recs = fk.fault_records(self.tw, listener="refuse", sid=rec["sid"])
        self.assertEqual(len(recs), 1)
        self.assertEqual(recs[0]["event"], "connect")
        self.assertEqual(recs[0]["action"], "close")

    def test_close_after(self):
        before = self.after_srv.stats()["accepted"]
        s = h.connect(self.ports["closeafter"], timeout=10)
        addr = h.client_addr(s)
        try:
            dt = h.wait_closed(s, 5)
        finally:
            s.close()
        self.assertLess(dt, 3)
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        h.wait_until(lambda: self.after_srv.stats()["accepted"] == before + 1, 60,
                     what="`close after` connecting the upstream")

    def test_connect_delay(self):
        t0 = time.monotonic()
        with fk.RespConn(self.ports["delay"]) as c:
            r = c.call("PING")
            dt = time.monotonic() - t0
            self.assertEqual(r, b"PONG")
            # only the connection is held: later commands are fast
            r, dt2 = c.timed("PING")
        h.log("delay 500ms: first reply after %.3fs, second %.3fs" % (dt, dt2))
        self.assertGreaterEqual(dt, 0.45)
        self.assertLess(dt, 5)
        self.assertLess(dt2, 0.4)

    def test_client_cidr_not_matching(self):
        dt, addr = fk.ping_rtt(self.ports["nomatch"])
        self.assertLess(dt, 5)
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "client_closed")
        self.assertEqual(self.faults_of("nomatch"), [])


class SeededTriggers(ck.BrokerCase):
    """Which connections a probabilistic / counting rule faults."""

    N = 40
    REDIS = True
    TMP_PREFIX = "twice-it-seed-redis-"

    def _run(self, seed, rule_lines, n, timing=False):
        port = h.free_port()
        conf = fk.conf_text([ck.listen("r", port, self.redis.port)],
                            [fk.rule_block("coin", "r", *rule_lines)], seed=seed)
        t = self.twice(conf)
        rtts = {}
        held = []   # kept open until the end: a closed client port can be reused at once
        try:
            for _ in range(n):
                c = fk.RespConn(port, timeout=30)   # sequential: sessions follow our order
                held.append(c)
                addr = h.client_addr(c.sock)
                r, dt = c.timed("PING")
                self.assertEqual(r, b"PONG")
                rtts[addr] = dt
        finally:
            for c in held:
                c.close()
        sids = {fk.sid_of(t, a): dt for a, dt in rtts.items()}
        self.assertEqual(sorted(sids), list(range(1, n + 1)))
        fk.wait_closed_sids(t, sids)
        faulted = fk.fault_sids(t, rule="coin")
        t.stop()
        if timing:
            slow = [sids[s] for s in faulted]
            fast = [sids[s] for s in sids if s not in faulted]
            if slow:
                self.assertGreaterEqual(min(slow), 0.14, "a faulted session was not delayed")
            if fast:
                self.assertLess(statistics.median(fast), 0.1, "unfaulted sessions are slow")
        return faulted

    def test_probability_is_reproducible(self):
        rule = ["stream downstream", "probability 50%", "do latency 150ms"]
        a = self._run(42, rule, self.N, timing=True)
        b = self._run(42, rule, self.N, timing=True)
        c = self._run(7, rule, self.N)
        h.log("seed 42: %s\nseed 42 again: %s\nseed 7: %s" % (a, b, c))
        self.assertTrue(8 <= len(a) <= 32, "probability 50%% faulted %d of %d" % (len(a), self.N))
        self.assertEqual(a, b, "the same seed faulted different connections")
        self.assertNotEqual(a, c, "another seed faulted the same connections")
        self.assertTrue(8 <= len(c) <= 32)

    def test_counting_triggers(self):
        """nth, first, after + limit, every, between: which sessions fault
        (counters are per rule, over the connections of its listener, and
        continue across a reload of an unchanged file)."""
        port = h.free_port()
        rules = [fk.rule_block(n, "r", "stream downstream", *trig, "do latency 1ms") for n, trig in (
            ("nth2", ["nth 2"]), ("first2", ["first 2"]), ("after3lim2", ["after 3", "limit 2"]),
            ("every3", ["every 3"]), ("window", ["between 0s 1h"]), ("later", ["between 1h 2h"]))]
        t = self.twice(fk.conf_text([ck.listen("r", port, self.redis.port)], rules, seed=9))
        for _ in range(4):
            fk.ping_rtt(port)
        n = len(t.log_records("reloaded"))
        t.signal(signal.SIGHUP)
        t.wait_for_log(r"msg=reloaded", count=n + 1)
        for _ in range(3):
            fk.ping_rtt(port)
        fk.wait_closed_sids(t, range(1, 8))
        got = {r: fk.fault_sids(t, rule=r) for r in ("nth2", "first2", "after3lim2", "every3",
                                                      "window", "later")}
        self.assertEqual(got, {"nth2": [2], "first2": [1, 2], "after3lim2": [4, 5],
                               "every3": [3, 6], "window": list(range(1, 8)), "later": []})
        t.stop()

    def test_every_3(self):
        got = self._run(5, ["stream downstream", "every 3", "do latency 150ms"], 14, timing=True)
        self.assertEqual(got, [3, 6, 9, 12])


if __name__ == "__main__":
    unittest.main(verbosity=2)
