#!/usr/bin/python3
"""Byte-exactness of `protocol tcp` listeners, with and without TLS.

One twice process has four listeners in front of the "hash" servers of
harness.py (see the protocol there):
  plain  client --tcp--> twice --tcp--> hash server
  ctls   client --TLS--> twice --tcp--> hash server    (`tls cert .. key ..`)
  utls   client --tcp--> twice --TLS--> TLS hash server (`upstream-tls ca .. sni localhost`)
  both   client --TLS--> twice --TLS--> TLS hash server
For every payload size, one connection uploads N random bytes while it
downloads N other random bytes (full duplex); both sides compare sha256.
Half-close: the client sends, shuts down its write side and must still get
the whole reply.
"""

import os
import socket
import ssl
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

SIZES = [0, 1, 4095, 65536, h.MiB + 7, 16 * h.MiB, 64 * h.MiB]
HDR = h.HASH_HDR.size
TRAILER = h.HASH_TRAILER.size


class BytesTest(h.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctmp = h.make_tmpdir("twice-it-bytes-")
        cls.certs = h.gen_certs(cls.ctmp)
        cls.plain_srv = h.HashServer(name="hash-plain")
        cls.tls_srv = h.HashServer(tls=h.server_ssl_context(cls.certs.server_pem, cls.certs.server_key),
                                   name="hash-tls")
        cls.ports = {n: h.free_port() for n in ("plain", "ctls", "utls", "both")}
        c = cls.certs
        tls = "tls cert %s key %s" % (c.server_pem, c.server_key)
        utls = "upstream-tls ca %s sni localhost" % c.ca_pem
        cls.conf = h.config(
            h.listen_block("plain", cls.ports["plain"], cls.plain_srv.port),
            h.listen_block("ctls", cls.ports["ctls"], cls.plain_srv.port, tls),
            h.listen_block("utls", cls.ports["utls"], cls.tls_srv.port, utls),
            h.listen_block("both", cls.ports["both"], cls.tls_srv.port, tls + "\n" + utls),
            log_level="info")
        cls.tw = h.start_twice(cls.conf, cls.ctmp)
        cls.client_ctx = h.client_ssl_context(c.ca_pem)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.tw.stop()
        finally:
            cls.tw.kill()
            cls.plain_srv.close()
            cls.tls_srv.close()

    # listeners on which a transfer stalled: later transfers through them are
    # skipped instead of each waiting out its own stall timeout
    stalled = {}

    def _connect(self, mode):
        s = h.connect(self.ports[mode], timeout=10)
        if mode in ("ctls", "both"):
            # verifies twice's certificate against the test CA for "localhost"
            s = self.client_ctx.wrap_socket(s, server_hostname="localhost")
        return s

    def _exchange(self, mode, upload, reply, **kw):
        if mode in self.stalled:
            self.skipTest("not run: an earlier transfer via listener %s stalled (%s)" % (mode, self.stalled[mode]))
        what = "%d up / %d down" % (upload, reply)
        try:
            s = self._connect(mode)
        except (OSError, ssl.SSLError) as e:
            if isinstance(e, socket.timeout):
                self.stalled[mode] = "connect/handshake of " + what
            self.fail("cannot connect to listener %s: %r\nlog tail:\n%s" % (mode, e, self.tw.log_tail(30)))
        try:
            res = h.hash_exchange(s, upload, reply, **kw)
            res.client = h.client_addr(s)
        finally:
            s.close()
        if isinstance(res.error, TimeoutError):
            self.stalled[mode] = what
        return res

    def _check(self, mode, res, what):
        problems = h.exchange_problems(res)
        if problems:
            self.fail("%s via listener %s: %s\nlog tail:\n%s" % (
                what, mode, "; ".join(problems), self.tw.log_tail(30)))

    def _run_sizes(self, mode):
        """Returns [(client address, bytes up, bytes down)] of every exchange."""
        done = []

        def run(what, upload, reply, **kw):
            res = self._exchange(mode, upload, reply, **kw)
            self._check(mode, res, what)
            done.append((res.client, HDR + upload, reply + TRAILER))

        for size in SIZES:
            with self.subTest(mode=mode, size=size):
                run("full-duplex %d bytes each way" % size, size, size, concurrent=True)
        # the reply only after the whole upload was read: twice must hold on
        # to neither direction's bytes
        for size in (1, 16 * h.MiB):
            with self.subTest(mode=mode, size=size, sequential=True):
                run("sequential %d bytes each way" % size, size, size, concurrent=False)
        with self.subTest(mode=mode, asymmetric=True):
            run("download only", 0, 4 * h.MiB + 3)
            run("upload only", 4 * h.MiB + 3, 0)
        if mode in self.stalled:
            self.fail("transfers through listener %s stalled" % mode)
        return done

    def test_plain(self):
        mark = self.tw.log_mark()
        done = self._run_sizes("plain")
        # Each exchange is one session; in plain mode the accounting is exact:
        # bytes_up = header + upload, bytes_down = reply + trailer.
        recs = self.tw.wait_sessions([c for c, _, _ in done], since=mark)
        for client, up, down in done:
            rec = recs[client]
            with self.subTest(client=client, bytes_up=up, bytes_down=down):
                self.assertEqual((int(rec["bytes_up"]), int(rec["bytes_down"])), (up, down),
                                 "bytes_up/bytes_down in %r" % rec)
                self.assertEqual(rec.get("listener"), "plain")

    def _run_tls(self, mode):
        # a client port of an earlier test's session (through another
        # listener) can come back here: only this test's records count
        mark = self.tw.log_mark()
        done = self._run_sizes(mode)
        # With TLS on a side the counters may be of plaintext or of TLS records,
        # but never less than the payload that crossed.
        recs = self.tw.wait_sessions([c for c, _, _ in done], since=mark)
        for client, up, down in done:
            rec = recs[client]
            self.assertEqual(rec.get("listener"), mode)
            self.assertGreaterEqual(int(rec["bytes_up"]), up, "bytes_up in %r" % rec)
            self.assertGreaterEqual(int(rec["bytes_down"]), down, "bytes_down in %r" % rec)

    def test_client_tls(self):
        self._run_tls("ctls")

    def test_upstream_tls(self):
        self._run_tls("utls")

    def test_both_tls(self):
        self._run_tls("both")

    def test_client_tls_certificate(self):
        """twice presents the configured certificate: it verifies for localhost
        and for 127.0.0.1 against the test CA."""
        s = h.connect(self.ports["ctls"])
        ctx = h.client_ssl_context(self.certs.ca_pem)
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            cert = t.getpeercert()
            self.assertIn(("commonName", "localhost"), [x[0] for x in cert["subject"]])
            res = h.hash_exchange(t, 10, 10)
            self._check("ctls", res, "10 bytes")

    def _half_close(self, mode):
        for upload, reply in ((0, 1000), (h.MiB + 7, 4 * h.MiB), (3, 0)):
            with self.subTest(mode=mode, upload=upload, reply=reply):
                # reply starts only after the server saw EOF (the shutdown
                # propagated through twice), so a full reply proves both
                # directions survived the half-close
                res = self._exchange(mode, upload, reply, concurrent=False, half_close=True, timeout=20)
                self._check(mode, res, "half-close (upload %d, then EOF, then reply %d)" % (upload, reply))

    def _tls_half_close(self, mode):
        for upload, reply in ((0, 1000), (h.MiB + 7, 4 * h.MiB), (3, 0)):
            with self.subTest(mode=mode, upload=upload, reply=reply):
                key = mode + "/tls-half-close"
                if key in self.stalled:
                    self.skipTest("not run: an earlier transfer stalled")
                s = h.connect(self.ports[mode])
                s.settimeout(20)
                try:
                    conn = h.BioTlsClient(s, self.client_ctx, "localhost")
                    res = h.half_close_exchange(conn, upload, reply)
                except socket.timeout as e:
                    self.stalled[key] = True
                    self.fail("TLS handshake with listener %s: %r" % (mode, e))
                finally:
                    s.close()
                if isinstance(res.error, (TimeoutError, socket.timeout)):
                    self.stalled[key] = True
                self._check(mode, res, "TLS half-close: upload %d, close_notify, then reply %d" % (upload, reply))

    def test_half_close_client_tls(self):
        """The client sends close_notify but keeps reading: twice passes the
        EOF on to the upstream and still relays the whole reply."""
        self._tls_half_close("ctls")

    def test_half_close_both_tls(self):
        self._tls_half_close("both")

    def test_parallel_exchanges(self):
        """16 connections over all four listeners transfer at the same time;
        every byte arrives intact."""
        results = []
        lock = threading.Lock()

        def worker(k):
            mode = ("plain", "ctls", "utls", "both")[k % 4]
            size = (8 * h.MiB + k * 4099) if k % 2 == 0 else (k * 65537)
            try:
                res = self._exchange(mode, size, 2 * size + 1, concurrent=bool(k % 3))
            except Exception as e:  # noqa
                res = h.HashResult(upload=size, reply=2 * size + 1, error=e, received=0, trailer=None,
                                   eof_early=False, sent_sha=b"", received_sha=b"")
            with lock:
                results.append((mode, size, res))
        ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        self.assertEqual(len(results), 16, "some transfers did not finish")
        for mode, size, res in results:
            with self.subTest(mode=mode, size=size):
                self._check(mode, res, "parallel exchange of %d up / %d down" % (size, 2 * size + 1))

    def test_half_close_plain(self):
        self._half_close("plain")

    def test_half_close_upstream_tls(self):
        """Client half-closes plain TCP; twice must pass the EOF on over the
        TLS upstream (close_notify) and keep relaying the reply."""
        self._half_close("utls")


if __name__ == "__main__":
    unittest.main(verbosity=2)
