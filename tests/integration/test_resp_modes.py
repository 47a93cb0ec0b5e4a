#!/usr/bin/python3
"""Every mode of Redis through `protocol resp` listeners with no rule acting,
against real redis-server processes: what the client gets is what it gets
directly.

Replication (the session is relayed unparsed from SYNC / PSYNC on, both
ways):
- a real redis-server replica (`replicaof` pointed at a resp listener)
  reaches master_link_status:up, gets the keys written before and after it
  attached, stays in sync through a minute of writes (each batch's marker
  waited for on the replica), answers WAIT (its REPLCONF ACKs reach the
  master), and ends with the master's DEBUG DIGEST; on a plain listener that
  has `command` rules (they still act on other sessions, never inside the
  stream), on a `sidekiq` listener, and on a client-TLS listener;
- `redis-cli --replica` shows the same command stream as directly;
  `redis-cli --rdb` writes an RDB that loads (checksum verified) into the
  master's data set, as the direct one does; plain and over TLS;
- the RDB transfer in both forms byte for byte, read by a raw client: SYNC
  (`$<len>` then raw bytes with no CRLF) and PSYNC after `REPLCONF capa eof`
  with a diskless master (`$EOF:<mark>`), then the propagated commands.
The other modes, each compared with a direct connection: MONITOR, CLIENT
PAUSE, WAIT, RESET, QUIT, DEBUG SLEEP / SEGFAULT, CLIENT KILL of the proxied
connection, SHUTDOWN, RESP3 attributes (and the other RESP3 types), CLIENT
NO-EVICT / NO-TOUCH, and cluster redirections (-MOVED, -ASK) passed on
unchanged, not rewritten.
"""

import os
import re
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import respkit as rk  # noqa: E402
import clientkit as ck  # noqa: E402

# How long the plain listener's replica takes writes for ("stays in sync for
# a minute of writes"); the others, a few batches.
SYNC_SECONDS = 60.0
WAIT = 60  # seconds any single wait may take on a loaded, sanitized run

GUARD_RULE = """rule guard on plain {
  when command command=SET key=guarded:*
  do error READONLY
}
"""


# DEBUG allowed and no delay before a diskless transfer
REDIS_ARGS = ("--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0")


def start_redis(tmp, *extra):
    """A redis-server on a free port with REDIS_ARGS."""
    return ck.start_redis(tmp, *(REDIS_ARGS + extra))


def info(port, section, ctx=None):
    with conn(port, ctx) as c:
        text = c.cmd("INFO", section).decode()
    return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)


class TlsConn(rk.Conn):
    def __init__(self, port, ctx, timeout=30):
        raw = h.connect(port, timeout=timeout)
        self.addr = h.client_addr(raw)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.rd = rk.Reader(self.sock)


def conn(port, ctx=None, timeout=30):
    return TlsConn(port, ctx, timeout) if ctx is not None else rk.Conn(port, timeout=timeout)


def digest(port):
    with rk.Conn(port) as c:
        return c.cmd("DEBUG", "DIGEST")


class Stream:
    """A raw replication client: reads the RDB transfer and the commands
    after it, keeping every byte."""

    def __init__(self, port, ctx=None):
        self.c = conn(port, ctx, timeout=WAIT)
        self.raw = bytearray()

    def _recv(self):
        data = self.c.sock.recv(65536)
        if not data:
            raise EOFError("replication stream closed after %d bytes" % len(self.raw))
        self.raw += data

    def until(self, pred):
        while not pred(bytes(self.raw)):
            self._recv()

    def line_at(self, pos):
        self.until(lambda b: b.find(b"\r\n", pos) >= 0)
        end = self.raw.find(b"\r\n", pos)
        return bytes(self.raw[pos:end]), end + 2

    def rdb(self, pos=0):
        """Reads the transfer that starts at pos (keep-alive newlines, then
        $len or $EOF:mark).  Returns (form, payload, end offset)."""
        self.until(lambda b: len(b) > pos)
        while True:
            self.until(lambda b: len(b) > pos)
            if self.raw[pos:pos + 1] != b"\n":
                break
            pos += 1
        head, pos = self.line_at(pos)
        if not head.startswith(b"$"):
            raise AssertionError("not a transfer header: %r" % head[:80])
        if head.startswith(b"$EOF:"):
            mark = head[5:]
            assert len(mark) == 40, head
            self.until(lambda b: b.find(mark, pos) >= 0)
            end = self.raw.find(mark, pos)
            return "eof", bytes(self.raw[pos:end]), end + 40
        n = int(head[1:])
        self.until(lambda b: len(b) >= pos + n)
        return "len", bytes(self.raw[pos:pos + n]), pos + n

    def close(self):
        self.c.close()


PING_CMD = re.compile(rb"\*1\r\n\$4\r\n(?:PING|ping)\r\n")


def commands_of(stream_bytes):
    """The propagated command stream without the master's periodic PINGs."""
    return PING_CMD.sub(b"", stream_bytes)


class ReplicationTest(h.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctmp = h.make_tmpdir("twice-it-modes-")
        cls.certs = h.gen_certs(cls.ctmp)
        cls.client_ctx = h.client_ssl_context(cls.certs.ca_pem)

    def setUp(self):
        super().setUp()
        self.master = start_redis(self.tmp)
        self.addCleanup(self.master.stop)
        self.ports = {n: h.free_port() for n in ("plain", "jobs", "tls")}
        tls = "tls cert %s key %s" % (self.certs.server_pem, self.certs.server_key)
        self.tw = self.twice(h.config(
            rk.resp_listen_block("plain", self.ports["plain"], self.master.port),
            rk.resp_listen_block("jobs", self.ports["jobs"], self.master.port, profile="sidekiq"),
            rk.resp_listen_block("tls", self.ports["tls"], self.master.port, extra=tls),
            log_level="info") + GUARD_RULE)

    def write_batch(self, c, prefix, n):
        c.send(b"".join(rk.enc("SET", "%s:%d" % (prefix, i), "v%d" % i) for i in range(n)) +
               rk.enc("INCR", "counter") + rk.enc("RPUSH", "list", prefix) +
               rk.enc("HSET", "hash", prefix, n))
        for _ in range(n + 3):
            self.assertNotIsInstance(c.read(), rk.Err)

    def replica(self, listener, ctx_args=()):
        r = start_redis(self.tmp, "--replicaof", "127.0.0.1", str(self.ports[listener]),
                        "--repl-timeout", "60", *ctx_args)
        self.addCleanup(r.stop)
        h.wait_until(lambda: info(r.port, "replication").get("master_link_status") == "up",
                     WAIT, what="replica's master_link_status:up through %s" % listener)
        return r

    def follow(self, listener, seconds, ctx_args=()):
        """Keys before and after a replica attaches through `listener`, writes
        for `seconds` (each batch waited for on the replica), WAIT, digest."""
        with rk.Conn(self.master.port) as m:
            self.write_batch(m, "before", 500)
            m.cmd("SET", "guarded:before", "1")
            mark = self.tw.log_mark()
            r = self.replica(listener, ctx_args)
            self.tw.wait_for_log(r"msg=\"replication stream\" sid=\d+ listener=%s command=PSYNC"
                                 % listener, start=mark, timeout=WAIT)
            with rk.Conn(r.port) as rc:
                self.assertEqual(rc.cmd("GET", "before:499"), b"v499")
                self.assertEqual(rc.cmd("GET", "guarded:before"), b"1")
                batch, end = 0, time.monotonic() + seconds
                while batch < 3 or time.monotonic() < end:
                    self.write_batch(m, "b%d" % batch, 200)
                    # a command a rule on the listener matches, inside the
                    # stream: carried, not faulted
                    m.cmd("SET", "guarded:%d" % batch, batch)
                    h.wait_until(lambda: rc.cmd("GET", "guarded:%d" % batch) == str(batch).encode(),
                                 WAIT, what="batch %d on the replica" % batch)
                    batch += 1
                # the replica's REPLCONF ACKs reach the master
                self.assertEqual(m.cmd("WAIT", "1", str(WAIT * 1000)), 1)
                h.wait_until(lambda: info(self.master.port, "replication")["master_repl_offset"] ==
                             info(r.port, "replication")["master_repl_offset"], WAIT,
                             what="replica at the master's offset")
                self.assertEqual(digest(r.port), digest(self.master.port))
                self.assertEqual(rc.cmd("LLEN", "list"), batch + 1)
        self.assertNotIn("level=error", self.tw.log_text())
        self.assertNotIn("protocol_error", self.tw.log_text())

    def test_replica_through_plain_listener_with_command_rules(self):
        """A minute of writes; the listener's `command` rule still acts on
        ordinary sessions (and never inside the stream, checked in follow)."""
        self.follow("plain", SYNC_SECONDS)
        with rk.Conn(self.ports["plain"]) as c:
            self.assertEqual(c.cmd("SET", "guarded:x", "1").code, b"READONLY")
            self.assertEqual(c.cmd("SET", "free", "1"), b"OK")

    def test_replica_through_sidekiq_listener(self):
        self.follow("jobs", 3)

    def test_replica_through_tls_listener(self):
        c = self.certs
        self.follow("tls", 3, ("--tls-replication", "yes", "--tls-cert-file", c.server_pem,
                               "--tls-key-file", c.server_key, "--tls-ca-cert-file", c.ca_pem))

    def test_diskless_replica(self):
        """A diskless master (the $EOF: form) to a real replica."""
        with rk.Conn(self.master.port) as m:
            self.assertEqual(m.cmd("CONFIG", "SET", "repl-diskless-sync", "yes"), b"OK")
        self.follow("plain", 3)

    def cli(self, port, *args, tls=False):
        argv = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
        if tls:
            argv += ["--tls", "--cacert", self.certs.ca_pem, "--sni", "localhost"]
        return argv + list(args)

    def test_redis_cli_rdb(self):
        """`redis-cli --rdb` through twice (plain and TLS) and directly: each
        file passes Redis's own check and loads into the master's data set.
        (Two dumps are not byte-identical: the RDB's header records its time
        and memory use; its CRC64 covers every byte, and is checked.)"""
        with rk.Conn(self.master.port) as m:
            self.write_batch(m, "rdb", 2000)
            m.cmd("SET", "big", os.urandom(3 * h.MiB))
        want = digest(self.master.port)
        for name, port, tls in (("direct", self.master.port, False),
                                ("plain", self.ports["plain"], False),
                                ("tls", self.ports["tls"], True)):
            path = os.path.join(self.tmp, "%s.rdb" % name)
            r = subprocess.run(self.cli(port, "--rdb", path, tls=tls), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=WAIT * 2)
            self.assertEqual(r.returncode, 0, r.stdout)
            self.assertIn(b"Transfer finished with success", r.stdout)
            chk = subprocess.run(["redis-check-rdb", path], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, timeout=WAIT)
            self.assertEqual(chk.returncode, 0, chk.stdout)
            d = os.path.join(self.tmp, "load-%s" % name)
            os.makedirs(d)
            os.rename(path, os.path.join(d, "dump.rdb"))
            loaded = h.start_redis(self.tmp, "--enable-debug-command", "yes",
                                   "--dir", d, "--dbfilename", "dump.rdb", maxclients=None)
            try:
                self.assertEqual(digest(loaded.port), want, name)
            finally:
                loaded.stop()

    def test_redis_cli_replica(self):
        """`redis-cli --replica` through twice (plain and TLS) shows the
        command stream it shows directly."""
        outs = {}
        procs = {}
        for name, port, tls in (("direct", self.master.port, False),
                                ("plain", self.ports["plain"], False),
                                ("tls", self.ports["tls"], True)):
            p = subprocess.Popen(self.cli(port, "--replica", tls=tls), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.addCleanup(lambda p=p: (p.kill(), p.wait(), p.stdout.close()))
            procs[name] = p
            outs[name] = []
            threading.Thread(target=lambda p=p, o=outs[name]: [o.append(l) for l in p.stdout],
                             daemon=True).start()
        for name in procs:
            h.wait_until(lambda: any(l.startswith(b"SYNC done") for l in outs[name]), WAIT,
                         what="redis-cli --replica %s: SYNC done" % name)
        with rk.Conn(self.master.port) as m:
            for i in range(50):
                m.cmd("SET", "cli:%d" % i, "x" * i)
            m.cmd("DEL", "cli:0")
            m.cmd("LPUSH", "cli:list", "a", "b c")
            m.cmd("SET", "cli:last", "end")
        for name in procs:
            h.wait_until(lambda: b'"SET","cli:last","end"\n' in outs[name], WAIT,
                         what="redis-cli --replica %s: the last command" % name)

        def stream(lines):
            i = next(k for k, l in enumerate(lines) if l.startswith(b"SYNC done"))
            return [l for l in lines[i + 1:] if l != b'"ping"\n' and
                    not l.startswith(b"sending REPLCONF ACK")]
        want = stream(outs["direct"])
        self.assertIn(b'"LPUSH","cli:list","a","b c"\n', want)
        self.assertEqual(stream(outs["plain"]), want)
        self.assertEqual(stream(outs["tls"]), want)

    def replica_state(self, ident):
        """The master's INFO line of the replica that announced port ident."""
        for k, v in info(self.master.port, "replication").items():
            if k.startswith("slave") and ",port=%d," % ident in v:
                return v
        return ""

    def transfer(self, port, ctx=None, eof=False, ident=0):
        """A raw replica: SYNC, or REPLCONF listening-port ident, capa eof and
        PSYNC ? -1.  Returns the Stream and where the command stream starts."""
        s = Stream(port, ctx)
        if eof:
            s.c.send(rk.enc("REPLCONF", "listening-port", ident) +
                     rk.enc("REPLCONF", "capa", "eof", "capa", "psync2"))
            line, pos = s.line_at(0)
            self.assertEqual(line, b"+OK")
            line, pos = s.line_at(pos)
            self.assertEqual(line, b"+OK")
            s.c.send(rk.enc("PSYNC", "?", "-1"))
            line, pos = s.line_at(pos)
            self.assertTrue(line.startswith(b"+FULLRESYNC "), line)
        else:
            s.c.send(b"SYNC\r\n")  # inline, as Redis's own test suite sends it
            pos = 0
        form, payload, end = s.rdb(pos)
        self.assertEqual(form, "eof" if eof else "len")
        self.assertEqual(payload[:5], b"REDIS")
        if eof:
            # After a diskless transfer the master streams commands once the
            # replica ACKs while it is online (a real replica ACKs every
            # second; this one once, when the master says it is online).
            h.wait_until(lambda: "state=online" in self.replica_state(ident), WAIT,
                         what="replica %d online" % ident)
            s.c.send(rk.enc("REPLCONF", "ACK", "0"))
        return s, end

    def raw_stream(self, eof):
        with rk.Conn(self.master.port) as m:
            self.write_batch(m, "raw", 100)
            if eof:
                m.cmd("CONFIG", "SET", "repl-diskless-sync", "yes")
            direct, d0 = self.transfer(self.master.port, eof=eof, ident=1)
            plain, p0 = self.transfer(self.ports["plain"], eof=eof, ident=2)
            tls, t0 = self.transfer(self.ports["tls"], self.client_ctx, eof=eof, ident=3)
            self.addCleanup(direct.close)
            self.addCleanup(plain.close)
            self.addCleanup(tls.close)
            m.cmd("SET", "guarded:raw", "1")
            m.cmd("LPUSH", "queue:default", '{"jid":"1","class":"K"}')
            m.cmd("SET", "raw:last", "x")
            last = rk.enc("SET", "raw:last", "x")
            streams = []
            for s, start in ((direct, d0), (plain, p0), (tls, t0)):
                s.until(lambda b: b.find(last, start) >= 0)
                streams.append(commands_of(bytes(s.raw[start:])))
            self.assertIn(rk.enc("SET", "guarded:raw", "1"), streams[0])
            self.assertEqual(streams[1], streams[0])
            self.assertEqual(streams[2], streams[0])
            # the other way, unanswered: REPLCONF ACK reaches the master
            offset = int(info(self.master.port, "replication")["master_repl_offset"])
            for s in (plain, tls):
                s.c.send(rk.enc("REPLCONF", "ACK", str(offset)))
            h.wait_until(lambda: sum(("offset=%d," % offset) in v for k, v in
                                     info(self.master.port, "replication").items()
                                     if k.startswith("slave")) >= 2, WAIT,
                         what="the ACKs sent through twice at the master")

    def test_sync_transfer_and_stream_bytes(self):
        self.raw_stream(eof=False)

    def test_psync_eof_transfer_and_stream_bytes(self):
        self.raw_stream(eof=True)


# A rule that judges transactions (an ack), so that the celery listener reads
# each MULTI ahead (and waits for the rest of a lone one): it never fires on
# these keys.
ACK_RULE = """rule acks on celery {
  when ack queue=twice-it-never
  do redeliver
}
"""

TX_N = 100000


class SharedRedis(ck.BrokerCase):
    """A class's Redis (cls.redis, with REDIS_ARGS) and twice (cls.tw)."""

    REDIS = True
    REDIS_ARGS = REDIS_ARGS


class TransactionTest(SharedRedis):
    """A MULTI of any length, as Redis serves it: 100,000 queued commands
    sent at once and one by one (each after its +QUEUED), on a plain, a
    sidekiq, and a celery listener whose rules read transactions ahead; the
    EXEC reply is byte for byte the direct one."""

    TMP_PREFIX = "twice-it-tx-"

    @classmethod
    def twice_config(cls):
        cls.ports = {n: h.free_port() for n in ("plain", "jobs", "celery")}
        return h.config(
            ck.resp_listen("plain", cls.ports["plain"], cls.redis.port),
            ck.resp_listen("jobs", cls.ports["jobs"], cls.redis.port, profile="sidekiq"),
            ck.resp_listen("celery", cls.ports["celery"], cls.redis.port, profile="celery"),
            log_level="info") + ACK_RULE

    def tx(self, port, key, at_once):
        """The raw EXEC reply of MULTI, TX_N INCRs of key (and one SET), EXEC."""
        with rk.Conn(port, timeout=WAIT * 2) as c:
            c.send(rk.enc("DEL", key))
            self.assertIsInstance(c.read(), int)
            cmds = [rk.enc("SET", key + ":first", "1")] + [rk.enc("INCR", key)] * (TX_N - 1)
            if at_once:
                c.send(rk.enc("MULTI"), *cmds, rk.enc("EXEC"))
                self.assertEqual(c.read(), b"OK")
                for _ in range(TX_N):
                    self.assertEqual(c.read_raw(), b"+QUEUED\r\n")
            else:
                self.assertEqual(c.cmd("MULTI"), b"OK")
                for cmd in cmds:
                    c.send(cmd)
                    self.assertEqual(c.read_raw(), b"+QUEUED\r\n")
                c.send(rk.enc("EXEC"))
            reply = c.read_raw()
            self.assertEqual(c.cmd("GET", key), str(TX_N - 1).encode())
            return reply

    def test_long_transactions(self):
        for at_once in (True, False):
            want = self.tx(self.redis.port, "tx:direct", at_once)
            self.assertTrue(want.startswith(b"*%d\r\n+OK\r\n:1\r\n" % TX_N))
            for name in ("plain", "jobs", "celery"):
                with self.subTest(listener=name, at_once=at_once):
                    self.assertEqual(self.tx(self.ports[name], "tx:direct", at_once), want)

    def test_redis_py_transactional_pipeline(self):
        import redis
        for name in ("plain", "jobs", "celery"):
            r = redis.Redis(port=self.ports[name], socket_timeout=WAIT)
            p = r.pipeline(transaction=True)
            for i in range(TX_N):
                p.set("pipe:%s:%d" % (name, i), i)
            res = p.execute()
            self.assertEqual(len(res), TX_N)
            self.assertTrue(all(x is True for x in res))
            self.assertEqual(r.get("pipe:%s:%d" % (name, TX_N - 1)), str(TX_N - 1).encode())
            r.close()
        self.assertNotIn("level=error", self.tw.log_text())


class ModesTest(SharedRedis):
    """Each mode, through a plain and a sidekiq listener, as directly."""

    TMP_PREFIX = "twice-it-modes-"

    @classmethod
    def twice_config(cls):
        cls.ports = {n: h.free_port() for n in ("plain", "jobs")}
        return h.config(
            ck.resp_listen("plain", cls.ports["plain"], cls.redis.port),
            ck.resp_listen("jobs", cls.ports["jobs"], cls.redis.port, profile="sidekiq"),
            log_level="info")

    @classmethod
    def set_up_class(cls):
        cls.via = [("direct", cls.redis.port), ("plain", cls.ports["plain"]),
                   ("jobs", cls.ports["jobs"])]

    def same(self, script):
        """script(port) -> a value, run directly and through each listener:
        every result equals the direct one.  Returns it."""
        want = script(self.redis.port)
        for name, port in self.via[1:]:
            with self.subTest(listener=name):
                self.assertEqual(script(port), want)
        return want

    def test_monitor(self):
        """MONITOR's lines, out of band after its +OK, byte for byte: the
        monitors of every path watch the same commands at once."""
        mons = []
        for name, port in self.via:
            c = rk.Conn(port, timeout=WAIT)
            self.addCleanup(c.close)
            self.assertEqual(c.raw("MONITOR"), b"+OK\r\n")
            mons.append(c)
        with rk.Conn(self.redis.port) as w:
            for i in range(20):
                w.cmd("SET", "mon:%d" % i, "v %d" % i)
            w.cmd("ECHO", "mon:last")
        lines = []
        for c in mons:
            got = []
            while not got or b'"mon:last"' not in got[-1]:
                got.append(c.read_raw())
            lines.append(got)
        self.assertEqual(len([l for l in lines[0] if b'"SET"' in l]), 20)
        self.assertEqual(lines[1], lines[0])
        self.assertEqual(lines[2], lines[0])
        for c in mons:
            c.close()
        # RESET ends MONITOR
        def reset(port):
            with rk.Conn(port) as c:
                c.cmd("MONITOR")
                return c.raw("RESET"), c.raw("PING")
        self.same(reset)

    def test_client_pause(self):
        """A write held by CLIENT PAUSE is answered once the pause ends."""
        def paused_write(port):
            with rk.Conn(self.redis.port) as admin, rk.Conn(port, timeout=WAIT) as c:
                admin.cmd("DEL", "paused")
                self.assertEqual(admin.cmd("CLIENT", "PAUSE", str(WAIT * 1000), "WRITE"), b"OK")
                try:
                    c.send(rk.enc("SET", "paused", port))
                    h.wait_until(lambda: int(info(self.redis.port, "clients")["blocked_clients"]) >= 1,
                                 WAIT, what="the paused write blocked in Redis")
                    self.assertIsNone(admin.cmd("GET", "paused"))
                finally:
                    self.assertEqual(admin.cmd("CLIENT", "UNPAUSE"), b"OK")
                return c.read_raw(), c.cmd("GET", "paused") == str(port).encode()
        self.assertEqual(self.same(paused_write), (b"+OK\r\n", True))

    def test_wait_reset_quit_debug(self):
        def script(port):
            with rk.Conn(port, timeout=WAIT) as c:
                out = [c.raw("WAIT", "0", "0"), c.raw("WAIT", "1", "50"),
                       c.raw("DEBUG", "SLEEP", "0"), c.raw("DEBUG", "SLEEP", "0.2"),
                       c.raw("CLIENT", "NO-EVICT", "on"), c.raw("CLIENT", "NO-TOUCH", "on"),
                       c.raw("SET", "touch", "1"), c.raw("GET", "touch"),
                       c.raw("CLIENT", "NO-EVICT", "off")]
                # RESET after a subscription, a transaction, CLIENT REPLY OFF
                c.send(rk.enc("SUBSCRIBE", "ch"))
                out.append(c.read_raw())
                out += [c.raw("RESET"), c.raw("MULTI"), c.raw("SET", "x", "1"), c.raw("RESET"),
                        c.raw("EXEC")]
                c.send(rk.enc("CLIENT", "REPLY", "OFF"), rk.enc("SET", "silent", "1"),
                       rk.enc("RESET"))
                out += [c.read_raw(), c.raw("PING")]
                # QUIT: +OK, then the server closes
                c.send(rk.enc("QUIT"))
                out.append(c.read_raw())
                out.append(h.recv_all(c.sock))
                return out
        out = self.same(script)
        self.assertEqual(out[-2:], [b"+OK\r\n", b""])

    def test_resp3_attributes_and_types(self):
        """RESP3's attribute frames (DEBUG PROTOCOL attrib) and every other
        RESP3 type, byte for byte."""
        def script(port):
            with rk.Conn(port) as c:
                out = [rk.mask_hello_id(c.raw("HELLO", "3"))]
                for t in ("attrib", "push", "bignum", "verbatim", "double", "map", "set",
                          "null", "true", "false"):
                    c.send(rk.enc("DEBUG", "PROTOCOL", t))
                    out.append(c.read_raw())
                    if t == "push":
                        out.append(c.read_raw())  # the push comes before the reply
                out.append(c.raw("PING"))
                return out
        out = self.same(script)
        self.assertTrue(out[1].startswith(b"|1\r\n"), out[1])

    def test_replies_twice_cannot_follow_are_relayed(self):
        """Replies Redis writes that twice's scanner does not follow: a Lua
        table that holds itself (thousands of nested arrays, then Redis's
        stack-limit error) and a script's RESP3 big number with spaces in it.
        Through twice the client gets Redis's bytes, as directly, and the
        session goes on as a byte relay (logged once)."""
        def until(sock, pat, buf=b""):
            while pat not in buf:
                data = sock.recv(65536)
                if not data:
                    raise EOFError("closed after %r" % buf[-80:])
                buf += data
            return buf

        def script(port):
            out = []
            with rk.Conn(port, timeout=WAIT) as c:
                c.send(rk.enc("EVAL", "local a={}; local b={a}; a[1]=b; return a", "0"),
                       rk.enc("PING"))
                out.append(until(c.sock, b"+PONG\r\n"))
            with rk.Conn(port, timeout=WAIT) as c:
                c.send(rk.enc("HELLO", "3"))
                until(c.sock, b"modules")
                c.send(rk.enc("EVAL", "return {big_number='123\\r\\n123'}", "0"), rk.enc("PING"))
                out.append(until(c.sock, b"+PONG\r\n"))
            return out
        mark = self.tw.log_mark()
        deep, big = self.same(script)
        self.assertTrue(deep.endswith(b"*1\r\n-ERR reached lua stack limit\r\n+PONG\r\n"), deep[-80:])
        self.assertGreater(deep.count(b"*1\r\n"), 1000)
        self.assertEqual(big, b"(123  123\r\n+PONG\r\n")
        self.tw.wait_for_log(r'msg="resp reply not followed" .*error="aggregates nested deeper',
                             start=mark)
        self.tw.wait_for_log(r'msg="resp reply not followed" .*error="malformed boolean',
                             start=mark)
        self.assertNotIn("protocol_error", "\n".join(self.tw.log_lines()[mark:]))

    def test_client_kill_of_the_proxied_connection(self):
        """Killed by another client, and by itself: the client sees what it
        sees directly (a :1 and EOF for itself, EOF when killed)."""
        def script(port):
            with rk.Conn(port) as victim, rk.Conn(self.redis.port) as killer:
                vid = victim.cmd("CLIENT", "ID")
                out = [killer.raw("CLIENT", "KILL", "ID", vid), h.recv_all(victim.sock)]
            with rk.Conn(port) as c:
                cid = c.cmd("CLIENT", "ID")
                out += [c.raw("CLIENT", "KILL", "ID", cid, "SKIPME", "no"), h.recv_all(c.sock)]
            return out
        self.assertEqual(self.same(script), [b":1\r\n", b"", b":1\r\n", b""])

    def test_shutdown_and_crash(self):
        """SHUTDOWN and DEBUG SEGFAULT end a server; its clients see EOF and no
        reply, through twice as directly, and twice goes on."""
        def script(port, cmd):
            with rk.Conn(port, timeout=WAIT) as c:
                self.assertEqual(c.cmd("SET", "k", "v"), b"OK")
                c.send(rk.enc(*cmd))
                return h.recv_all(c.sock)
        for cmd in (("SHUTDOWN", "NOSAVE"), ("DEBUG", "SEGFAULT")):
            results = []
            for via in ("direct", "twice"):
                r = start_redis(self.tmp)
                self.addCleanup(r.stop)
                if via == "direct":
                    results.append(script(r.port, cmd))
                    continue
                port = h.free_port()
                t = self.twice(h.config(rk.resp_listen_block("gone", port, r.port),
                                        log_level="info"))
                results.append(script(port, cmd))
                t.wait_for_log(r"msg=\"session closed\" .*reason=upstream_closed", timeout=WAIT)
                self.assertIsNone(t.proc.poll())
            self.assertEqual(results, [b"", b""], cmd)


class OrderTest(h.TestCase):
    """Commands of several connections read in one loop turn reach Redis in
    the order they were read, as they would directly (Redis serves them in
    that order): Redis's own suite, "BRPOPLPUSH with multiple blocked
    clients", blocks for ever otherwise.  rd1's BRPOPLPUSH must fail
    (WRONGTYPE) before rd2's takes the element r's LPUSH brings; twice wrote
    the ends it had read last first, and rd1 then blocked on an empty list.
    One event loop (`threads 1`): connections on different loops are not
    ordered with each other."""

    def test_commands_of_several_connections_keep_their_order(self):
        redis = start_redis(self.tmp)
        self.addCleanup(redis.stop)
        port = h.free_port()
        self.twice("threads 1\n" + h.config(rk.resp_listen_block("one", port, redis.port),
                                            log_level="info"))
        with rk.Conn(port) as r:
            for i in range(100):
                with rk.Conn(port, timeout=WAIT) as rd1, rk.Conn(port, timeout=WAIT) as rd2:
                    self.assertEqual(r.cmd("DEL", "blist", "target1", "target2") >= 0, True)
                    self.assertEqual(r.cmd("SET", "target1", "nolist"), b"OK")
                    rd1.send(rk.enc("BRPOPLPUSH", "blist", "target1", "0"))
                    rd2.send(rk.enc("BRPOPLPUSH", "blist", "target2", "0"))
                    self.assertEqual(r.cmd("LPUSH", "blist", "foo"), 1)
                    self.assertEqual(rd1.read().code, b"WRONGTYPE", "round %d" % i)
                    self.assertEqual(rd2.read(), b"foo", "round %d" % i)


class ClusterTest(h.TestCase):
    """Two cluster nodes, slots split between them: -MOVED and -ASK reach the
    client through twice exactly as Redis wrote them (twice does not rewrite
    the address in them to its own)."""

    def node(self):
        # The cluster bus port is a free port too: by default it is the port + 10000,
        # which another process may hold (seen in a loaded run: "Failed listening on port").
        bus = h.free_port()
        r = start_redis(self.tmp, "--cluster-enabled", "yes", "--cluster-config-file",
                        "nodes-%d.conf" % h.free_port(), "--cluster-node-timeout", "60000",
                        "--cluster-port", str(bus))
        r.bus = bus
        return r

    def test_redirections(self):
        a, b = self.node(), self.node()
        self.addCleanup(a.stop)
        self.addCleanup(b.stop)
        with rk.Conn(a.port) as ca, rk.Conn(b.port) as cb:
            self.assertEqual(ca.cmd("CLUSTER", "ADDSLOTSRANGE", "0", "8191"), b"OK")
            self.assertEqual(cb.cmd("CLUSTER", "ADDSLOTSRANGE", "8192", "16383"), b"OK")
            self.assertEqual(ca.cmd("CLUSTER", "MEET", "127.0.0.1", str(b.port), str(b.bus)), b"OK")
            for c in (ca, cb):
                h.wait_until(lambda: b"cluster_state:ok" in c.cmd("CLUSTER", "INFO"), WAIT,
                             what="cluster_state:ok")
            key_b = next(k for k in ("k%d" % i for i in range(1000))
                         if ca.cmd("CLUSTER", "KEYSLOT", k) >= 8192)
            key_a = next(k for k in ("k%d" % i for i in range(1000))
                         if ca.cmd("CLUSTER", "KEYSLOT", k) < 8192)
            slot_a = ca.cmd("CLUSTER", "KEYSLOT", key_a)
            id_a, id_b = ca.cmd("CLUSTER", "MYID"), cb.cmd("CLUSTER", "MYID")
            # key_a's slot migrating from a to b: a key a lacks there is -ASK
            self.assertEqual(cb.cmd("CLUSTER", "SETSLOT", slot_a, "IMPORTING", id_a), b"OK")
            self.assertEqual(ca.cmd("CLUSTER", "SETSLOT", slot_a, "MIGRATING", id_b), b"OK")
        port = h.free_port()
        self.twice(h.config(rk.resp_listen_block("node", port, a.port), log_level="info"))

        def script(p):
            with rk.Conn(p) as c:
                return [c.raw("GET", key_b), c.raw("SET", key_b, "1"), c.raw("GET", key_a),
                        c.raw("READONLY"), c.raw("GET", key_b), c.raw("PING")]
        want = script(a.port)
        self.assertEqual(want[0], b"-MOVED %d 127.0.0.1:%d\r\n" % (
            int(want[0].split()[1]), b.port))
        self.assertTrue(want[2].startswith(b"-ASK %d 127.0.0.1:%d" % (slot_a, b.port)), want[2])
        self.assertEqual(script(port), want)


if __name__ == "__main__":
    unittest.main(verbosity=2)
