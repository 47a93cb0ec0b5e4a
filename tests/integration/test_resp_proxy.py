#!/usr/bin/python3
"""A real Redis behind `protocol resp` listeners.

A. Transparency: with no rule that matches, a `protocol resp` listener (and
   the same with `profile celery` plus a rule that matches nothing) changes
   no byte and no timing a client can see:
   - redis-benchmark, every default test, plain, pipelined (-P 16) and --csv;
   - a deterministic script (strings, lists, hashes, sorted sets, streams,
     Lua, SCAN, OBJECT ENCODING, errors, inline commands, kombu-shaped
     traffic) gives the same reply bytes as direct, one command at a time
     and in one write; a pipeline of 10,000 commands in one write too;
   - pub/sub in RESP2 (confirmations, messages published directly and
     through twice, PING in subscribed mode, unsubscribe), with raw sockets
     and with redis-py;
   - MULTI/EXEC, EXECABORT, WATCH, DISCARD, blocking commands inside MULTI;
   - blocking pops with timeouts and wake-ups (BRPOP, BLPOP, BLMOVE,
     XREADGROUP BLOCK), [BRPOP k 1, PING] in one write;
   - RESP3: HELLO 3 (and back to 2), maps, doubles, nulls, booleans, sets,
     CLIENT TRACKING invalidation pushes (also RESP2 REDIRECT), RESP3
     subscribe with pushes interleaved with ordinary replies;
   - CLIENT REPLY OFF / SKIP / ON;
   - a 64 MiB value, alone and inside a pipeline of small commands;
   - AUTH and SELECT against a Redis with requirepass;
   - malformed input: the client gets Redis's own `-ERR Protocol error`
     (after the replies to what it sent before), then the close.
B. The `command` event: `error CODE` (READONLY, LOADING, OOM, any code),
   `delay`, `drop`, `close before`, `close after`, with the fault log line
   and the journal's FAULT record; the command name of a rule is
   case-insensitive; an injected error stays silent under CLIENT REPLY
   OFF/SKIP; `close before`/`close after` inside a pipeline apply exactly
   what the client sent before (and including) the faulted command.  When
   twice refuses `when command` (no RESP codec in the build), those rules
   are left out and the tests fail on the fault that did not happen.

Every test also checks that twice is still running and logged no error.
"""

import hashlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import faultkit as fk  # noqa: E402
import respkit as rk  # noqa: E402
import clientkit as ck  # noqa: E402
from respkit import enc, inline  # noqa: E402

try:
    import redis  # Debian python3-redis
except ImportError:  # pragma: no cover
    redis = None

MiB = h.MiB
BIG = 64 * MiB


# ---------------------------------------------------------------------------
# Deterministic traffic

def kombu_message(task_id, queue="celery"):
    """A Celery/kombu message as the kombu Redis transport LPUSHes it."""
    body = json.dumps([[2, 3], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                    "chord": None}]).encode()
    import base64
    return json.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"lang": "py", "task": "tasks.add", "id": task_id, "shadow": None,
                    "eta": None, "expires": None, "group": None, "group_index": None,
                    "retries": 0, "timelimit": [None, None], "root_id": task_id,
                    "parent_id": None, "argsrepr": "(2, 3)", "kwargsrepr": "{}",
                    "origin": "gen1@it", "ignore_result": False},
        "properties": {"correlation_id": task_id, "reply_to": "a5e1c7c2-reply",
                       "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue},
                       "priority": 0, "body_encoding": "base64",
                       "delivery_tag": "tag-" + task_id}}, sort_keys=True).encode()


def script_items():
    """A deterministic list of commands (exact bytes), one reply each."""
    rng = random.Random(20260401)
    c = []
    a = c.append
    # inline commands, as telnet or redis-benchmark's PING_INLINE send them
    a(inline("PING"))
    a(inline("SET a b"))
    a(inline("GET a"))
    a(inline("SET \"sp ace\" 'q\"uote'"))
    a(inline("GET \"sp ace\""))
    a(inline("ECHO \"\\x41\\n\\x00z\""))
    a(b"EXISTS a\n")                       # LF alone ends an inline command too
    a(inline("foobar a b"))                # unknown command, inline
    a(enc("PING"))
    a(enc("PING", "hello"))
    # strings
    a(enc("SET", "k:small", "hello"))
    a(enc("GET", "k:small"))
    a(enc("GET", "k:missing"))
    a(enc("SET", "k:bin", bytes(range(256))))
    a(enc("GET", "k:bin"))
    a(enc("STRLEN", "k:bin"))
    a(enc("APPEND", "k:small", " world"))
    a(enc("GETRANGE", "k:small", "-5", "-1"))
    a(enc("SETRANGE", "k:small", "0", "J"))
    a(enc("GET", "k:small"))
    a(enc("INCR", "k:small"))              # -ERR value is not an integer
    for _ in range(3):
        a(enc("INCR", "counter"))
    a(enc("INCRBY", "counter", "100"))
    a(enc("DECR", "counter"))
    a(enc("INCRBYFLOAT", "fl", "1.5"))
    a(enc("INCRBYFLOAT", "fl", "-0.25"))
    a(enc("SETNX", "counter", "x"))
    a(enc("MSET", "m:1", "one", "m:2", "two", "m:3", ""))
    a(enc("MGET", "m:1", "m:2", "m:3", "m:4"))
    a(enc("SET", "k:empty", ""))
    a(enc("GET", "k:empty"))
    a(enc("SETBIT", "bits", "7", "1"))
    a(enc("BITCOUNT", "bits"))
    a(enc("PFADD", "hll", "a", "b", "c", "a"))
    a(enc("PFCOUNT", "hll"))
    a(enc("EXPIRE", "m:1", "1000"))
    a(enc("PERSIST", "m:1"))
    a(enc("TTL", "m:1"))
    a(enc("TYPE", "m:1"))
    # lists
    a(enc("LPUSH", "list", *["v%d" % i for i in range(50)]))
    a(enc("LRANGE", "list", "0", "-1"))
    a(enc("LLEN", "list"))
    a(enc("RPUSH", "list", "tail"))
    a(enc("LRANGE", "list", "45", "-1"))
    a(enc("LPOP", "list", "2"))
    a(enc("RPOP", "list"))
    a(enc("LINDEX", "list", "3"))
    a(enc("LPOS", "list", "v10"))
    a(enc("LRANGE", "nolist", "0", "-1"))
    # hashes
    a(enc("HSET", "h", "f1", "v1", "f2", "v2", "f3", ""))
    a(enc("HGETALL", "h"))
    a(enc("HINCRBY", "h", "n", "7"))
    a(enc("HMGET", "h", "f1", "nope", "n"))
    a(enc("HLEN", "h"))
    a(enc("HGETALL", "nohash"))
    # sorted sets
    a(enc("ZADD", "z", "1", "one", "2", "two", "2.5", "twofive", "3", "three", "-inf", "low"))
    a(enc("ZRANGE", "z", "0", "-1", "WITHSCORES"))
    a(enc("ZSCORE", "z", "twofive"))
    a(enc("ZSCORE", "z", "nope"))
    a(enc("ZRANGEBYSCORE", "z", "(1", "+inf", "LIMIT", "0", "2"))
    a(enc("ZINCRBY", "z", "0.125", "one"))
    a(enc("ZRANK", "z", "three"))
    # sets (same server process, so the same hash seed and the same order)
    a(enc("SADD", "s", "a", "b", "c", "d"))
    a(enc("SCARD", "s"))
    a(enc("SISMEMBER", "s", "c"))
    a(enc("SMEMBERS", "s"))
    a(enc("SADD", "ints", "3", "1", "2"))
    a(enc("SMEMBERS", "ints"))
    # streams with explicit ids
    a(enc("XADD", "st", "1-1", "f", "v"))
    a(enc("XADD", "st", "1-2", "f2", "v2", "g", "h"))
    a(enc("XADD", "st", "2-0", "a", "b"))
    a(enc("XADD", "st", "1-0", "x", "y"))   # -ERR ... equal or smaller
    a(enc("XRANGE", "st", "-", "+"))
    a(enc("XREVRANGE", "st", "+", "-", "COUNT", "1"))
    a(enc("XLEN", "st"))
    a(enc("XGROUP", "CREATE", "st", "g", "0"))
    a(enc("XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "STREAMS", "st", ">"))
    a(enc("XACK", "st", "g", "1-1"))
    a(enc("XPENDING", "st", "g", "-", "+", "10"))   # idle times: not deterministic... see below
    # Lua
    a(enc("EVAL", "return {1, 2, {3, 'x'}, redis.call('GET', 'a'), 'end'}", "0"))
    a(enc("EVAL", "return redis.call('INCR', KEYS[1])", "1", "counter"))
    a(enc("EVAL", "return redis.error_reply('MYERR boom')", "0"))
    a(enc("EVAL", "return redis.status_reply('FINE')", "0"))
    a(enc("EVAL", "return redis.call('NOSUCH')", "0"))
    a(enc("EVAL", "return 3.99", "0"))
    a(enc("EVAL", "return true", "0"))
    a(enc("EVAL", "return false", "0"))
    a(enc("EVALSHA", "0" * 40, "0"))              # -NOSCRIPT
    # scans (one call each: COUNT covers the whole db)
    for i in range(20):
        a(enc("SET", "scan:%02d" % i, str(i)))
    a(enc("SCAN", "0", "MATCH", "scan:*", "COUNT", "1000"))
    a(enc("HSCAN", "h", "0"))
    a(enc("SSCAN", "s", "0"))
    a(enc("ZSCAN", "z", "0"))
    # encodings
    for k in ("list", "h", "z", "s", "ints", "counter", "k:small", "st", "nope"):
        a(enc("OBJECT", "ENCODING", k))
    # errors: wrong type, unknown command, arity
    a(enc("GET", "list"))
    a(enc("LPUSH", "h", "x"))
    a(enc("FOOBAR", "a", "b"))
    a(enc("GET"))
    a(enc("SET", "a"))
    # kombu's Redis transport (what `profile celery` will look at)
    for i in range(3):
        a(enc("LPUSH", "celery", kombu_message("00000000-0000-4000-8000-%012d" % i)))
    a(enc("LLEN", "celery"))
    a(enc("BRPOP", "celery", "celery\x06\x163", "celery\x06\x166", "1"))
    a(enc("MULTI"))
    a(enc("ZADD", "unacked_index", "1700000000.5", "tag-1"))
    a(enc("HSET", "unacked", "tag-1", kombu_message("00000000-0000-4000-8000-000000000000")))
    a(enc("EXEC"))
    a(enc("MULTI"))
    a(enc("ZREM", "unacked_index", "tag-1"))
    a(enc("HDEL", "unacked", "tag-1"))
    a(enc("EXEC"))
    a(enc("RPOP", "celery", "5"))
    a(enc("RPOP", "celery"))
    # databases
    a(enc("SELECT", "1"))
    a(enc("SET", "in1", "x"))
    a(enc("DBSIZE"))
    a(enc("SELECT", "0"))
    a(enc("GET", "in1"))
    # a medium value
    a(enc("ECHO", rng.randbytes(200 * 1024)))
    a(enc("DBSIZE"))
    a(enc("PING"))
    return c


# XPENDING's extended form reports idle times: replace it by the summary form.
def _script():
    return [enc("XPENDING", "st", "g") if x.startswith(b"*6\r\n$8\r\nXPENDING") else x
            for x in script_items()]


def pipeline_10k():
    """10,000 commands of every shape, deterministic."""
    rng = random.Random(10000)
    out = []
    for i in range(10000):
        k = rng.randrange(200)
        r = rng.random()
        if r < 0.2:
            out.append(enc("SET", "p:%d" % k, rng.randbytes(rng.randrange(0, 300))))
        elif r < 0.35:
            out.append(enc("GET", "p:%d" % k))
        elif r < 0.45:
            out.append(enc("INCR", "c:%d" % (k % 20)))
        elif r < 0.55:
            out.append(enc("LPUSH", "l:%d" % (k % 10), "v%d" % i))
        elif r < 0.6:
            out.append(enc("LRANGE", "l:%d" % (k % 10), "0", "7"))
        elif r < 0.68:
            out.append(enc("HSET", "h:%d" % (k % 10), "f%d" % (i % 7), i))
        elif r < 0.72:
            out.append(enc("HGETALL", "h:%d" % (k % 10)))
        elif r < 0.78:
            out.append(inline("PING") if i % 2 else inline("GET p:%d" % k))
        elif r < 0.82:
            out.append(enc("INCR", "p:%d" % k))      # mostly: not an integer
        elif r < 0.84:
            out.append(enc("NOSUCHCMD", k))
        elif r < 0.9:
            out.append(enc("EXISTS", "p:%d" % k, "c:%d" % (k % 20)))
        elif r < 0.95:
            out.append(enc("ZADD", "z:%d" % (k % 5), rng.randrange(1000) / 8, "m%d" % k))
        else:
            out.append(enc("ZRANGE", "z:%d" % (k % 5), "0", "3", "WITHSCORES"))
    return out


def run_items(port, items, pipelined, timeout=60):
    """Send items (one reply each) and return the raw replies."""
    with rk.Conn(port, timeout=timeout) as c:
        if not pipelined:
            out = []
            for it in items:
                c.send(it)
                out.append(c.read_raw())
            return out
        sender = fk.Bg(c.send, *items)
        sender.start()
        out = c.read_n(len(items))
        sender.join(timeout)
        if sender.error:
            raise sender.error
        return out


def first_difference(a, b, items):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return "reply %d to %r: direct %r, via twice %r" % (i, items[i][:120], x[:300], y[:300])
    return "lengths differ: %d vs %d replies" % (len(a), len(b))


# ---------------------------------------------------------------------------
# A. Transparency

class Transparency(ck.BrokerCase):
    """One Redis; twice with a `protocol resp` listener without profile or
    rule (`plain`) and one with `profile celery` and a rule that matches
    nothing (`celery`).  Every test runs through both and compares with
    Redis itself."""

    REDIS = True
    TMP_PREFIX = "twice-it-resp-"

    @classmethod
    def set_up_class(cls):
        # SCAN and SMEMBERS orders must not depend on background rehashing
        assert cls.redis.command("CONFIG", "SET", "activerehashing", "no") == b"OK"
        cls.ports = {"plain": h.free_port(), "celery": h.free_port()}
        listeners = [ck.resp_listen("plain", cls.ports["plain"], cls.redis.port),
                     ck.resp_listen("celery", cls.ports["celery"], cls.redis.port,
                                    profile="celery")]
        rules = [fk.rule_block("never", "celery",
                               "when command command=LPUSH key=twice-it-never:*",
                               "do error READONLY")]
        head = "log-level info\nconnect-timeout 2s\nshutdown-grace 2s\n"
        cls.tw, cls.note = rk.start_twice_rules(head, listeners, rules, cls.ctmp)

    @classmethod
    def stop_twice(cls, t):
        rk.stop_twice(t)

    def setUp(self):
        super().setUp()
        self.mark = self.class_mark

    def tearDown(self):
        rk.assert_twice_healthy(self, self.tw, self.mark)
        self.assertEqual(fk.fault_records(self.tw), [], "a rule fired: %s" % self.tw.log_tail(20))

    def via(self):
        """(name, port) of each listener under test."""
        return sorted(self.ports.items())

    def flush(self):
        assert self.redis.command("FLUSHALL") == b"OK"

    def redis_py(self, port, **kw):
        return ck.redis_py(port, timeout=20, **kw)

    def log_on_fail(self):
        return "\n--- twice log tail ---\n" + self.tw.log_tail(30)

    # -- redis-benchmark --------------------------------------------------

    def _bench(self, port, extra):
        argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", "2000", "-c", "10"] + extra
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        out = r.stdout.decode(errors="replace")
        self.assertEqual(r.returncode, 0, "%s failed:\n%s" % (" ".join(argv), out))
        self.assertNotIn("WARN", out, out)
        self.assertNotIn("rror", out, out)
        return out

    @staticmethod
    def _parse_q(out):
        res = {}
        for piece in re.split(r"[\r\n]+", out):
            m = re.match(r"^\s*(.+?): ([0-9.]+) requests per second", piece)
            if m:
                res[m.group(1)] = float(m.group(2))
        return res

    @staticmethod
    def _parse_csv(out):
        import csv
        rows = list(csv.reader([l for l in out.splitlines() if l.startswith('"')]))
        if not rows or rows[0][:2] != ["test", "rps"]:
            raise AssertionError("no CSV header in:\n%s" % out)
        return {row[0]: float(row[1]) for row in rows[1:]}

    def test_benchmark_default_tests(self):
        direct = self._parse_csv(self._bench(self.redis.port, ["--csv"]))
        self.assertGreaterEqual(len(direct), 15, direct)
        for name, port in self.via():
            with self.subTest(listener=name):
                self.redis.command("CONFIG", "RESETSTAT")
                for extra, parse in ((["-q"], self._parse_q), (["-q", "-P", "16"], self._parse_q),
                                     (["--csv"], self._parse_csv)):
                    res = parse(self._bench(port, extra))
                    h.log("redis-benchmark %s via %s: %d tests, min %.0f/s" % (
                        " ".join(extra), name, len(res), min(res.values() or [0])))
                    self.assertEqual(sorted(res), sorted(direct),
                                     "tests reported through twice (%s) differ from direct" % extra)
                    for title, rps in res.items():
                        self.assertGreater(rps, 0, "%s: %s" % (title, extra))
                # every request reached Redis: 3 runs x 2000 of each command
                calls = {}
                for k, v in self.redis.info("commandstats").items():
                    m = re.search(r"calls=(\d+)", v)
                    if m:
                        calls[k[len("cmdstat_"):]] = int(m.group(1))
                for cmd, per_run in (("ping", 4000), ("set", 2000), ("get", 2000), ("incr", 2000),
                                     ("lpush", 4000), ("lrange", 8000), ("mset", 2000),
                                     ("zpopmin", 2000), ("spop", 2000)):
                    self.assertGreaterEqual(calls.get(cmd, 0), 3 * per_run, "%s: %r" % (cmd, calls))

    # -- byte-identical replies -------------------------------------------

    def _compare(self, items, pipelined, what):
        self.flush()
        direct = run_items(self.redis.port, items, pipelined)
        self.assertEqual(len(direct), len(items))
        for name, port in self.via():
            with self.subTest(listener=name, what=what):
                self.flush()
                got = run_items(port, items, pipelined)
                if got != direct:
                    self.fail("%s via %s: %s%s" % (what, name, first_difference(direct, got, items),
                                                   self.log_on_fail()))
        return direct

    def test_script_identical(self):
        items = _script()
        ref = self._compare(items, False, "script, one command at a time")
        # sanity of the reference itself
        joined = b"".join(ref)
        for needle in (b"-ERR unknown command 'foobar'", b"-WRONGTYPE", b"-NOSCRIPT",
                       b"-MYERR boom", b"+FINE", b"$6\r\nq\"uote", b"$4\r\nA\n\x00z",
                       b"$8\r\nlistpack\r\n", b"$6\r\nintset\r\n", b"-ERR value is not an integer",
                       b"*2\r\n$6\r\ncelery\r\n"):
            self.assertTrue(needle in joined, "%r not in the direct replies" % needle)
        ref2 = self._compare(items, True, "script, one write")
        self.assertEqual(ref2, ref, "the script is not deterministic on Redis itself")

    def test_pipeline_10k_one_write(self):
        items = pipeline_10k()
        t0 = time.monotonic()
        ref = self._compare(items, True, "10,000 commands in one write")
        h.log("10k pipeline: %d reply bytes, %.1fs for 3 runs" % (sum(map(len, ref)),
                                                                 time.monotonic() - t0))
        self.assertTrue(any(r.startswith(b"-ERR unknown command") for r in ref))
        self.assertTrue(any(r == b"+PONG\r\n" for r in ref))

    def test_protocol_errors_like_redis(self):
        """Malformed input: Redis answers `-ERR Protocol error: ...` and
        closes; through twice the client must see the same bytes (not a bare
        close), after the replies to what came before."""
        cases = [b"*1\r\n$abc\r\n", b"*2\r\n$3\r\nGET\r\n:1\r\n", b'SET "a b\r\n',
                 b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$-1\r\n", b"A" * 70000]

        def run(port, data):
            with rk.Conn(port, timeout=30) as c:
                c.send(enc("PING"), inline("ECHO x"), data)
                got = bytearray()
                try:
                    while True:
                        chunk = c.sock.recv(65536)
                        if not chunk:
                            break
                        got += chunk
                except ConnectionResetError:
                    got += b"<reset>"
                except socket.timeout:
                    got += b"<still open after 30s>"
                return bytes(got)

        for data in cases:
            ref = run(self.redis.port, data)
            self.assertTrue(ref.startswith(b"+PONG\r\n$1\r\nx\r\n-ERR Protocol error: "), ref)
            for name, port in self.via():
                with self.subTest(listener=name, input=data[:30]):
                    got = run(port, data)
                    self.assertEqual(got, ref, "input %r: direct %r, via twice %r" % (data[:30], ref, got))

    # -- pub/sub ----------------------------------------------------------

    def test_pubsub_resp2(self):
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                with rk.Conn(port) as sub, rk.Conn(port) as pub:
                    sub.send(enc("SUBSCRIBE", "ch1", "ch2"))
                    self.assertEqual(sub.read_n(2), [
                        b"*3\r\n$9\r\nsubscribe\r\n$3\r\nch1\r\n:1\r\n",
                        b"*3\r\n$9\r\nsubscribe\r\n$3\r\nch2\r\n:2\r\n"])
                    self.assertEqual(sub.raw("PSUBSCRIBE", "news.*"),
                                     b"*3\r\n$10\r\npsubscribe\r\n$6\r\nnews.*\r\n:3\r\n")
                    self.assertEqual(self.redis.command("PUBLISH", "ch1", "direct"), b"1")
                    self.assertEqual(sub.read_raw(), b"*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$6\r\ndirect\r\n")
                    self.assertEqual(pub.cmd("PUBLISH", "news.x", "via"), 1)
                    self.assertEqual(sub.read_raw(),
                                     b"*4\r\n$8\r\npmessage\r\n$6\r\nnews.*\r\n$6\r\nnews.x\r\n$3\r\nvia\r\n")
                    # PING in subscribed mode: an array, not +PONG
                    sub.send(enc("PING"), enc("PING", "x"))
                    self.assertEqual(sub.read_n(2), [b"*2\r\n$4\r\npong\r\n$0\r\n\r\n",
                                                     b"*2\r\n$4\r\npong\r\n$1\r\nx\r\n"])
                    # a message racing a PING: both arrive, each whole
                    big = os.urandom(300 * 1024)
                    self.assertEqual(pub.cmd("PUBLISH", "ch2", big), 1)
                    sub.send(enc("PING"))
                    got = sub.read_n(2)
                    want = b"*3\r\n$7\r\nmessage\r\n$3\r\nch2\r\n$%d\r\n%s\r\n" % (len(big), big)
                    self.assertTrue(got[0] == want, "the 300 KiB message differs: %r..." % got[0][:80])
                    self.assertEqual(got[1], b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")
                    # a command not allowed in subscribed mode
                    self.assertTrue(sub.raw("GET", "a").startswith(b"-ERR Can't execute 'get'"))
                    sub.send(enc("UNSUBSCRIBE", "ch1"), enc("PUNSUBSCRIBE"), enc("UNSUBSCRIBE"))
                    self.assertEqual(sub.read_n(3), [
                        b"*3\r\n$11\r\nunsubscribe\r\n$3\r\nch1\r\n:2\r\n",
                        b"*3\r\n$12\r\npunsubscribe\r\n$6\r\nnews.*\r\n:1\r\n",
                        b"*3\r\n$11\r\nunsubscribe\r\n$3\r\nch2\r\n:0\r\n"])
                    # unsubscribing from nothing: one confirmation with a null channel
                    sub.send(enc("UNSUBSCRIBE"), enc("PING"), enc("GET", "a"))
                    self.assertEqual(sub.read_n(3), [b"*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n",
                                                     b"+PONG\r\n", b"$-1\r\n"])

    def test_pubsub_redis_py(self):
        for name, port in self.via():
            with self.subTest(listener=name):
                r = self.redis_py(port)
                p = r.pubsub()
                p.subscribe("jobs")
                p.psubscribe("ev.*")
                kinds = [p.get_message(timeout=30)["type"] for _ in range(2)]
                self.assertEqual(kinds, ["subscribe", "psubscribe"])
                self.assertEqual(redis.Redis(port=self.redis.port).publish("jobs", "j1"), 1)
                self.assertEqual(r.publish("ev.done", "e1"), 1)
                msgs = [p.get_message(timeout=30) for _ in range(2)]
                self.assertEqual([(m["type"], m["channel"], m["data"]) for m in msgs],
                                 [("message", b"jobs", b"j1"), ("pmessage", b"ev.done", b"e1")])
                p.ping("hi")
                m = p.get_message(timeout=30)
                self.assertEqual((m["type"], m["data"]), ("pong", b"hi"))
                p.unsubscribe()
                p.punsubscribe()
                kinds = sorted(p.get_message(timeout=30)["type"] for _ in range(2))
                self.assertEqual(kinds, ["punsubscribe", "unsubscribe"])
                p.close()
                r.close()

    # -- transactions -----------------------------------------------------

    def test_multi_exec(self):
        def steps(port):
            out = []
            with rk.Conn(port) as c, rk.Conn(self.redis.port) as other:
                c.send(enc("MULTI"), enc("SET", "t", "1"), enc("INCR", "t"), enc("GET", "t"),
                       enc("LPUSH", "t", "x"), enc("EXEC"))
                out += c.read_n(6)
                # a queued command with a syntax error: EXECABORT
                c.send(enc("MULTI"), enc("SET", "t"), enc("GET", "t"), enc("EXEC"), enc("GET", "t"))
                out += c.read_n(5)
                # WATCH: another client changes the key, EXEC answers a null array
                out.append(c.raw("WATCH", "w"))
                other.cmd("SET", "w", "theirs")
                c.send(enc("MULTI"), enc("SET", "w", "mine"), enc("EXEC"), enc("GET", "w"))
                out += c.read_n(4)
                # DISCARD
                c.send(enc("MULTI"), enc("SET", "d", "1"), enc("DISCARD"), enc("GET", "d"),
                       enc("DISCARD"), enc("EXEC"))
                out += c.read_n(6)
                # blocking commands inside MULTI do not block
                t0 = time.monotonic()
                c.send(enc("MULTI"), enc("BRPOP", "empty", "0"), enc("BLMOVE", "empty", "x", "LEFT",
                                                                      "RIGHT", "0"),
                       enc("XREAD", "BLOCK", "0", "STREAMS", "nostream", "$"), enc("EXEC"))
                out += c.read_n(5)
                dt = time.monotonic() - t0
                self.assertLess(dt, 5, "a blocking command inside MULTI blocked")
                # nested MULTI, EXEC without MULTI
                c.send(enc("MULTI"), enc("MULTI"), enc("EXEC"), enc("EXEC"))
                out += c.read_n(4)
            return out

        self.flush()
        ref = steps(self.redis.port)
        self.assertEqual(ref[5], b"*4\r\n+OK\r\n:2\r\n$1\r\n2\r\n-WRONGTYPE Operation against a key "
                         b"holding the wrong kind of value\r\n")
        self.assertEqual(ref[9], b"-EXECABORT Transaction discarded because of previous errors.\r\n")
        self.assertEqual(ref[14], b"*-1\r\n")
        self.assertEqual(ref[15], b"$6\r\ntheirs\r\n")
        self.assertEqual(ref[26], b"*3\r\n*-1\r\n$-1\r\n*-1\r\n")
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                got = steps(port)
                self.assertEqual(got, ref, self.log_on_fail())

    # -- blocking commands ------------------------------------------------

    def test_blocking_commands(self):
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                with rk.Conn(port) as c, rk.Conn(port) as c2:
                    # timeout
                    t0 = time.monotonic()
                    self.assertEqual(c.raw("BRPOP", "empty", "1"), b"*-1\r\n")
                    self.assertGreaterEqual(time.monotonic() - t0, 0.9)
                    # woken by a push from another connection (direct)
                    threading.Timer(0.3, self.redis.command, ("LPUSH", "q", "job1")).start()
                    t0 = time.monotonic()
                    self.assertEqual(c.raw("BLPOP", "q", "10"), b"*2\r\n$1\r\nq\r\n$4\r\njob1\r\n")
                    self.assertGreaterEqual(time.monotonic() - t0, 0.25)
                    # BLMOVE woken by a push through twice
                    threading.Timer(0.3, c2.cmd, ("RPUSH", "src", "x")).start()
                    self.assertEqual(c.raw("BLMOVE", "src", "dst", "LEFT", "RIGHT", "10"), b"$1\r\nx\r\n")
                    self.assertEqual(self.redis.command("LRANGE", "dst", "0", "-1"), [b"x"])
                    # XREADGROUP BLOCK
                    self.assertEqual(c.cmd("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"), b"OK")
                    threading.Timer(0.3, self.redis.command, ("XADD", "s", "7-1", "f", "v")).start()
                    self.assertEqual(
                        c.raw("XREADGROUP", "GROUP", "g", "c1", "COUNT", "1", "BLOCK", "10000",
                              "STREAMS", "s", ">"),
                        b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n7-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n")
                    # XREADGROUP BLOCK timing out: a null array
                    t0 = time.monotonic()
                    self.assertEqual(c.raw("XREADGROUP", "GROUP", "g", "c1", "BLOCK", "500",
                                           "STREAMS", "s", ">"), b"*-1\r\n")
                    self.assertGreaterEqual(time.monotonic() - t0, 0.45)
                    # [BRPOP k 1, PING] in one write: PONG only after the BRPOP's null
                    t0 = time.monotonic()
                    c.send(enc("BRPOP", "k", "1"), enc("PING"))
                    first = c.read_raw()
                    t1 = time.monotonic() - t0
                    second = c.read_raw()
                    self.assertEqual((first, second), (b"*-1\r\n", b"+PONG\r\n"))
                    self.assertGreaterEqual(t1, 0.9)
                    # [BLPOP k 10, GET k2, PING], woken after 0.3 s
                    threading.Timer(0.3, self.redis.command, ("RPUSH", "k", "a", "b")).start()
                    c.send(enc("BLPOP", "k", "10"), enc("LLEN", "k"), enc("PING"))
                    self.assertEqual(c.read_n(3), [b"*2\r\n$1\r\nk\r\n$1\r\na\r\n", b":1\r\n",
                                                   b"+PONG\r\n"])

    # -- RESP3 ------------------------------------------------------------

    def test_resp3_hello_and_types(self):
        def steps(port):
            out = []
            with rk.Conn(port) as c:
                c.send(enc("HELLO", "3"))
                v, raw = c.rd.read()
                out.append(rk.mask_hello_id(raw))
                self.assertIsInstance(v, rk.RMap)
                shape = rk.hello_shape(v)
                self.assertEqual(shape[b"proto"], 3)
                self.assertEqual(shape[b"server"], b"redis")
                self.assertEqual(sorted(shape), sorted([b"server", b"version", b"proto", b"id",
                                                        b"mode", b"role", b"modules"]))
                cmds = [enc("HSET", "h", "f", "v"), enc("HGETALL", "h"), enc("HGETALL", "none"),
                        enc("ZADD", "z", "1.5", "m"), enc("ZSCORE", "z", "m"),
                        enc("ZRANGE", "z", "0", "-1", "WITHSCORES"), enc("GET", "nope"),
                        enc("EVAL", "redis.setresp(3); return true", "0"),
                        enc("EVAL", "redis.setresp(3); return false", "0"),
                        enc("EVAL", "return true", "0"), enc("EVAL", "return false", "0"),
                        enc("EVAL", "return {double=3.5}", "0"),
                        enc("EVAL", "return {map={a=1}}", "0"),
                        enc("EVAL", "redis.setresp(3); return redis.call('HGETALL', 'h')", "0"),
                        enc("SADD", "st", "x"), enc("SMEMBERS", "st"), enc("SMEMBERS", "nost"),
                        enc("INCRBYFLOAT", "f", "1.5"), enc("BRPOP", "nolist", "0.1"),
                        enc("XREAD", "COUNT", "1", "STREAMS", "nostream", "0"),
                        enc("MULTI"), enc("HGETALL", "h"), enc("ZSCORE", "z", "m"), enc("EXEC"),
                        enc("NOSUCH"), enc("PING")]
                c.send(*cmds)
                out += c.read_n(len(cmds))
                # back to RESP2: the HELLO 2 reply itself is a RESP2 array
                c.send(enc("HELLO", "2"))
                v, raw = c.rd.read()
                self.assertIsInstance(v, list)
                self.assertEqual(rk.hello_shape(v)[b"proto"], 2)
                out.append(rk.mask_hello_id(raw))
                c.send(enc("HGETALL", "h"), enc("ZSCORE", "z", "m"), enc("GET", "nope"))
                out += c.read_n(3)
                # HELLO 3 pipelined with commands: the protocol switches between them
                c.send(enc("HELLO", "3"), enc("HGETALL", "h"), enc("HELLO", "2"), enc("HGETALL", "h"),
                       enc("HELLO", "4"), enc("GET", "nope"))
                out += [rk.mask_hello_id(r) for r in c.read_n(6)]
            return out

        self.flush()
        ref = steps(self.redis.port)
        joined = b"".join(ref)
        for needle in (b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n", b",1.5\r\n", b"_\r\n", b"#t\r\n", b"#f\r\n",
                       b"~1\r\n$1\r\nx\r\n", b"-NOPROTO"):
            self.assertIn(needle, joined)
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                got = steps(port)
                self.assertEqual(got, ref, self.log_on_fail())

    def test_resp3_client_tracking(self):
        inv = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\ntk\r\n"

        def steps(port):
            out = []
            with rk.Conn(port) as c, rk.Conn(self.redis.port) as other:
                c.cmd("HELLO", "3")
                c.send(enc("CLIENT", "TRACKING", "ON"), enc("GET", "tk"))
                out += c.read_n(2)
                other.cmd("SET", "tk", "1")
                v, raw = c.rd.read()            # the invalidation push, unprompted
                self.assertIsInstance(v, rk.Push)
                out.append(raw)
                out.append(c.raw("PING"))
                # the client's own write: +OK, then the push (Redis 7.0 order)
                c.send(enc("GET", "tk"), enc("SET", "tk", "2"), enc("PING"))
                out += c.read_n(4)
                c.send(enc("GET", "tk"), enc("DEL", "tk"), enc("GET", "tk"), enc("PING"))
                out += c.read_n(5)
                # FLUSHALL: an invalidation with a null key list
                c.send(enc("GET", "tk2"))
                out.append(c.read_raw())
                other.cmd("FLUSHALL")
                out.append(c.read_raw())
                out.append(c.raw("CLIENT", "TRACKING", "OFF"))
            return out

        self.flush()
        ref = steps(self.redis.port)
        self.assertEqual(ref[2], inv)
        self.assertEqual(ref[4:8], [b"$1\r\n1\r\n", b"+OK\r\n", inv, b"+PONG\r\n"])
        self.assertEqual(ref[8:13], [b"$1\r\n2\r\n", b":1\r\n", inv, b"_\r\n", b"+PONG\r\n"])
        self.assertEqual(ref[14], b">2\r\n$10\r\ninvalidate\r\n_\r\n")
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                self.assertEqual(steps(port), ref, self.log_on_fail())

    def test_resp2_tracking_redirect(self):
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                with rk.Conn(port) as sink, rk.Conn(port) as c:
                    sid = sink.cmd("CLIENT", "ID")
                    self.assertEqual(sink.raw("SUBSCRIBE", "__redis__:invalidate"),
                                     b"*3\r\n$9\r\nsubscribe\r\n$20\r\n__redis__:invalidate\r\n:1\r\n")
                    self.assertEqual(c.cmd("CLIENT", "TRACKING", "ON", "REDIRECT", sid), b"OK")
                    self.assertEqual(c.raw("GET", "rk"), b"$-1\r\n")
                    self.redis.command("SET", "rk", "1")
                    self.assertEqual(sink.read_raw(), b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate"
                                     b"\r\n*1\r\n$2\r\nrk\r\n")
                    self.assertEqual(c.raw("PING"), b"+PONG\r\n")

    def test_resp3_subscribe_interleaved(self):
        n = 300
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                self.redis.command("HSET", "h", "f", "v")
                with rk.Conn(port) as c:
                    c.cmd("HELLO", "3")
                    c.send(enc("SUBSCRIBE", "c1", "c2"))
                    self.assertEqual(c.read_n(2), [b">3\r\n$9\r\nsubscribe\r\n$2\r\nc1\r\n:1\r\n",
                                                   b">3\r\n$9\r\nsubscribe\r\n$2\r\nc2\r\n:2\r\n"])
                    # in RESP3, ordinary commands work while subscribed
                    c.send(enc("GET", "h"), enc("PING"), enc("HGETALL", "h"))
                    self.assertEqual(c.read_n(3), [
                        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
                        b"+PONG\r\n", b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n"])

                    def publisher():
                        with rk.Conn(self.redis.port) as p:
                            for i in range(n):
                                p.cmd("PUBLISH", "c1" if i % 2 else "c2", "m%d" % i)
                                if i % 10 == 0:
                                    time.sleep(0.002)
                    pub = fk.Bg(publisher)
                    pub.start()
                    expect = []
                    for i in range(n):
                        if i % 3 == 0:
                            c.send(enc("PING"))
                            expect.append(b"+PONG\r\n")
                        elif i % 3 == 1:
                            c.send(enc("HGETALL", "h"))
                            expect.append(b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n")
                        else:
                            c.send(enc("ECHO", "e%d" % i))
                            expect.append(b"$%d\r\ne%d\r\n" % (len(b"e%d" % i), i))
                    replies, pushes = [], []
                    while len(replies) < n or len(pushes) < n:
                        v, raw = c.rd.read()
                        (pushes if isinstance(v, rk.Push) else replies).append((v, raw))
                    pub.join(30)
                    self.assertIsNone(pub.error)
                    self.assertEqual([r for _, r in replies], expect)
                    self.assertEqual([(v[0], v[2]) for v, _ in pushes],
                                     [(b"message", b"m%d" % i) for i in range(n)])
                    # unsubscribe confirmations are pushes that answer a command
                    c.send(enc("UNSUBSCRIBE", "c1"), enc("PING"), enc("UNSUBSCRIBE"), enc("UNSUBSCRIBE"),
                           enc("GET", "nope"))
                    self.assertEqual(c.read_n(5), [
                        b">3\r\n$11\r\nunsubscribe\r\n$2\r\nc1\r\n:1\r\n", b"+PONG\r\n",
                        b">3\r\n$11\r\nunsubscribe\r\n$2\r\nc2\r\n:0\r\n",
                        b">3\r\n$11\r\nunsubscribe\r\n_\r\n:0\r\n", b"_\r\n"])

    # -- CLIENT REPLY -----------------------------------------------------

    def test_client_reply(self):
        cmds = [enc("CLIENT", "REPLY", "OFF"), enc("SET", "a", "1"), enc("GET", "a"),
                enc("HGET", "a", "f"), enc("LPUSH", "a", "x"),   # errors stay silent too
                enc("CLIENT", "REPLY", "ON"), enc("GET", "a"),
                enc("CLIENT", "REPLY", "SKIP"), enc("SET", "b", "2"), enc("GET", "b"),
                enc("CLIENT", "REPLY", "SKIP"), enc("NOSUCH"), enc("CLIENT", "REPLY", "SKIP"),
                enc("CLIENT", "REPLY", "OFF"), enc("GET", "b"), enc("CLIENT", "REPLY", "ON"),
                enc("PING")]
        expect = [b"+OK\r\n", b"$1\r\n1\r\n", b"$1\r\n2\r\n", b"+OK\r\n", b"+PONG\r\n"]
        for name, port in [("direct", self.redis.port)] + self.via():
            for mode in ("one write", "one at a time"):
                with self.subTest(listener=name, mode=mode):
                    self.flush()
                    with rk.Conn(port) as c:
                        if mode == "one write":
                            c.send(*cmds)
                        else:
                            for x in cmds:
                                c.send(x)
                                time.sleep(0.01)
                        self.assertEqual(c.read_n(len(expect)), expect)
                        self.assertTrue(c.nothing_within(0.2))
                        self.assertEqual(c.raw("GET", "a"), b"$1\r\n1\r\n")
                    self.assertEqual(self.redis.command("GET", "b"), b"2")

    # -- 64 MiB -----------------------------------------------------------

    def test_64mib_value(self):
        value = random.Random(64).randbytes(BIG)
        digest = hashlib.sha256(value).hexdigest()
        set_cmd = enc("SET", "big", value)
        for name, port in self.via():
            with self.subTest(listener=name):
                self.flush()
                with rk.Conn(port, timeout=60) as c:
                    c.send(set_cmd)
                    self.assertEqual(c.read_raw(), b"+OK\r\n")
                    got = c.cmd("GET", "big")
                    self.assertEqual(len(got), BIG)
                    self.assertEqual(hashlib.sha256(got).hexdigest(), digest)
                with rk.Conn(self.redis.port, timeout=60) as d:
                    self.assertEqual(hashlib.sha256(d.cmd("GET", "big")).hexdigest(), digest)
                # inside a pipeline of small commands, in one write
                items = [enc("SET", "s", "a"), enc("GET", "s"), enc("INCR", "n"),
                         enc("SET", "big2", value), enc("INCR", "n"), inline("PING"),
                         enc("GET", "big2"), enc("GET", "s"), enc("STRLEN", "big2"), enc("INCR", "n")]
                with rk.Conn(port, timeout=60) as c:
                    sender = fk.Bg(c.send, *items)
                    sender.start()
                    got = c.read_n_values(len(items))
                    sender.join(60)
                    self.assertIsNone(sender.error)
                vals = [v for v, _ in got]
                self.assertEqual(vals[:6], [b"OK", b"a", 1, b"OK", 2, b"PONG"])
                self.assertEqual(hashlib.sha256(vals[6]).hexdigest(), digest)
                self.assertEqual(vals[7:], [b"a", BIG, 3])

    # -- long messages, cut anywhere ----------------------------------------

    @staticmethod
    def _enc_marked(*args):
        """enc(*args) and the offsets inside it where a read had better not
        end for a scanner that wants whole lines: inside each header, and
        between the CR and the LF after each value."""
        out, cuts = bytearray(b"*%d\r\n" % len(args)), [1, 2]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            cuts += [len(out) + 1, len(out) + 2]
            out += b"$%d\r\n" % len(a)
            out += a
            cuts.append(len(out) + 1)
            out += b"\r\n"
        return bytes(out), cuts

    def test_long_values_cut_anywhere(self):
        """Commands and replies longer than one read (values of 70 KB to
        1 MiB that hold CRLF, `$` and `*` bytes), in a pipeline with small
        ones, sent with every header, every command name and the CRLF after
        every value split between two writes.  A plain one is walked header
        by header (never pulled up into one buffer); every reply is Redis's
        own, byte for byte."""
        rnd = random.Random(5)

        def value(n):
            unit = b"\r\n$12\r\n*3\r\n" + rnd.randbytes(61)
            return (unit * (n // len(unit) + 1))[:n]

        v1, v2, v3 = value(1 << 20), value(70000), value(300000)
        cmds = [("SET", "k1", v1), ("MSET", "k2", "small", "k3", v3), ("GET", "k1"),
                ("RPUSH", "l", v2, "x"), ("LRANGE", "l", 0, -1), ("GET", "k3"), ("STRLEN", "k1"),
                ("APPEND", "k2", v2), ("GETRANGE", "k2", 0, 9), ("GET", "k2"), ("DEL", "l")]
        data, cuts = bytearray(), set()
        for c in cmds:
            b, marks = self._enc_marked(*c)
            cuts.update(len(data) + m for m in marks)
            data += b
        cuts.update(rnd.sample(range(1, len(data)), 40))
        cuts = sorted(x for x in cuts if 0 < x < len(data))

        def run(port):
            self.flush()
            with rk.Conn(port, timeout=30) as c:
                c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

                def send():
                    for a, b in zip([0] + cuts, cuts + [len(data)]):
                        c.sock.sendall(data[a:b])
                        time.sleep(0.002)
                sender = fk.Bg(send)
                sender.start()
                got = c.read_n(len(cmds))
                sender.join(30)
                self.assertIsNone(sender.error)
                return got

        ref = run(self.redis.port)
        self.assertEqual(ref[2], b"$%d\r\n%s\r\n" % (len(v1), v1))
        for name, port in self.via():
            with self.subTest(listener=name):
                got = run(port)
                for i, (g, r) in enumerate(zip(got, ref)):
                    self.assertEqual(g, r, "reply %d (%s) via %s: %d bytes, %d directly%s" % (
                        i, cmds[i][0], name, len(g), len(r), self.log_on_fail()))
        h.log("long values: %d commands, %d bytes, in %d writes" % (len(cmds), len(data), len(cuts) + 1))

    def test_long_value_with_a_bad_crlf(self):
        """A long SET whose value is not followed by CRLF: twice reports a
        protocol error (as for a short one) and passes the client's bytes on
        unparsed; what the client gets is what Redis answers directly."""
        bad = b"*3\r\n$3\r\nSET\r\n$3\r\nbad\r\n$200000\r\n" + b"v" * 200000 + b"XY"

        def run(port):
            self.flush()
            with rk.Conn(port, timeout=10) as c:
                c.send(bad, enc("GET", "bad"), enc("PING"))
                got = c.read_n(3)
            return got, self.redis.command("STRLEN", "bad")

        ref = run(self.redis.port)
        for name, port in self.via():
            with self.subTest(listener=name):
                mark = len(self.tw.log_lines())
                self.assertEqual(run(port), ref)
                recs = [r for r in (h.parse_logfmt(l) for l in self.tw.log_lines()[mark:])
                        if r.get("msg") == "resp protocol error"]
                self.assertEqual(len(recs), 1, self.log_on_fail())


# ---------------------------------------------------------------------------
# A. AUTH and SELECT (a Redis with requirepass)

class AuthSelect(h.TestCase):
    PASSWORD = "s3cret-twice-it"

    def setUp(self):
        super().setUp()
        self.redis = h.start_redis(self.tmp, "--requirepass", self.PASSWORD,
                                   password=self.PASSWORD, maxclients=None)
        self.port = h.free_port()
        self.tw = self.twice("log-level info\nconnect-timeout 2s\nshutdown-grace 2s\n" +
                             rk.resp_listen_block("auth", self.port, self.redis.port))

    def tearDown(self):
        try:
            rk.assert_twice_healthy(self, self.tw)
        finally:
            self.tw.kill()
            self.redis.stop()

    def test_auth_select(self):
        direct = redis.Redis(port=self.redis.port, password=self.PASSWORD, db=3)
        direct.flushall()
        with rk.Conn(self.port) as c:
            self.assertEqual(c.raw("SET", "k", "v"), b"-NOAUTH Authentication required.\r\n")
            self.assertEqual(c.raw("AUTH", "wrong"),
                             b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
            c.send(enc("AUTH", self.PASSWORD), enc("SELECT", "3"), enc("SET", "k", "raw"),
                   enc("GET", "k"), enc("SELECT", "99"))
            self.assertEqual(c.read_n(5), [b"+OK\r\n", b"+OK\r\n", b"+OK\r\n", b"$3\r\nraw\r\n",
                                           b"-ERR DB index is out of range\r\n"])
        self.assertEqual(direct.get("k"), b"raw")
        # redis-py sends AUTH then SELECT on connect
        r = redis.Redis(port=self.port, password=self.PASSWORD, db=3, socket_timeout=10)
        self.assertTrue(r.set("k2", "v2"))
        self.assertEqual(r.get("k2"), b"v2")
        self.assertEqual(direct.get("k2"), b"v2")
        db0 = redis.Redis(port=self.redis.port, password=self.PASSWORD, db=0)
        self.assertIsNone(db0.get("k2"))
        self.assertEqual(db0.dbsize(), 0)
        # HELLO 3 AUTH default PASSWORD
        with rk.Conn(self.port) as c:
            v = c.cmd("HELLO", "3", "AUTH", "default", self.PASSWORD)
            self.assertEqual(rk.hello_shape(v)[b"proto"], 3)
            c.send(enc("SELECT", "3"), enc("HGETALL", "none"), enc("GET", "k"))
            self.assertEqual(c.read_n(3), [b"+OK\r\n", b"%0\r\n", b"$3\r\nraw\r\n"])


class ProfileWithoutJournal(h.TestCase):
    """A profiled listener with neither a journal nor a job rule does not decode job JSON
    (it only relays), yet still counts what its profile recognises: /stats shows the
    publishes and deliveries a user would check to see that the profile sees the jobs, and
    /metrics the listener they came through."""

    def test_jobs_counted_without_journal(self):
        rd = h.start_redis(self.tmp)
        self.addCleanup(rd.stop)
        port, admin = h.free_port(), h.free_port()
        self.twice(fk.conf_text([rk.resp_listen_block("sk", port, rd.port, profile="sidekiq"),
                                 rk.resp_listen_block("idle", h.free_port(), rd.port,
                                                      profile="sidekiq")],
                                admin_port=admin, token=fk.TOKEN, log_level="info"))
        api = fk.Admin(admin, fk.TOKEN)
        h.wait_until(lambda: h.port_open(admin), 60, what="admin API")
        job = json.dumps({"class": "HardWorker", "jid": "b4a577edbccf1d805744efa9",
                          "queue": "default", "args": [1], "retry": True})
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("LPUSH", "queue:default", job, job), 2)
            got = c.cmd("BRPOP", "queue:default", "1")
            self.assertEqual(got, [b"queue:default", job.encode()])
        ev = api.json("/stats")["events"]
        self.assertEqual(ev.get("publish"), 2, ev)
        self.assertEqual(ev.get("deliver"), 1, ev)
        with rk.Conn(port) as c:
            # A pop that times out delivers nothing; a pipelined pop's reply goes out in its
            # place, between the replies around it, and counts once.
            self.assertEqual(c.cmd("BRPOP", "queue:empty", "0.1"), rk.NULL_ARRAY)
            c.send(enc("LPUSH", "queue:other", "x"), enc("BRPOP", "queue:other", "1"),
                   enc("GET", "nokey"))
            self.assertEqual(c.read_n(3), [b":1\r\n",
                                           b"*2\r\n$11\r\nqueue:other\r\n$1\r\nx\r\n",
                                           b"$-1\r\n"])
        ev = api.json("/stats")["events"]
        self.assertEqual(ev.get("publish"), 3, ev)
        self.assertEqual(ev.get("deliver"), 2, ev)
        # /metrics says whose they are
        _, samples = fk.parse_prometheus(api.get("/metrics")[2])
        for listener, want in (("sk", (3, 2)), ("idle", (0, 0))):
            self.assertEqual(tuple(fk.prom_value(samples, "twice_events_total", listener=listener,
                                                 kind=kind) for kind in ("publish", "deliver")),
                             want, listener)


class PublishFaults(h.TestCase):
    """Rules on publishes: the push a rule drops never reaches Redis and the client is
    answered as Redis would have; a delayed one reaches it late.  Streams' XADD is decided
    before Redis sees it (its `task` field, the id the client chose), where it once was
    only journaled from its reply and its rules never fired."""

    def test_publish_drop_and_delay(self):
        rd = h.start_redis(self.tmp)
        self.addCleanup(rd.stop)
        sk, st = h.free_port(), h.free_port()
        rules = [fk.rule_block("skdrop", "sk", "when publish task=Drop*", "do drop"),
                 fk.rule_block("stdrop", "st", "when publish task=dropme", "do drop"),
                 fk.rule_block("stlate", "st", "when publish task=late", "do delay 1s"),
                 fk.rule_block("skdup", "sk", "when publish task=Dup", "do duplicate"),
                 fk.rule_block("sklate", "sk", "when publish task=Late", "do delay 500ms")]
        journal = os.path.join(self.tmp, "publish.pb")
        tw = self.twice(fk.conf_text([rk.resp_listen_block("sk", sk, rd.port, profile="sidekiq"),
                                      rk.resp_listen_block("st", st, rd.port, profile="streams")],
                                     rules, log_level="info", journal=journal))
        job = lambda cls, jid: json.dumps({"class": cls, "jid": jid, "queue": "default",
                                           "args": [1], "retry": True})
        with rk.Conn(sk) as c:
            self.assertEqual(c.cmd("LPUSH", "queue:default", job("DropMe", "a" * 24)), 1)
            self.assertEqual(c.cmd("LPUSH", "queue:default", job("Keep", "b" * 24)), 1)
        # Under CLIENT REPLY SKIP the dropped push is answered by no one: the next reply is
        # PING's (twice asked whether a reply was owed twice, and the second time sent one).
        with rk.Conn(sk) as c:
            c.send(enc("CLIENT", "REPLY", "SKIP"), enc("LPUSH", "queue:default", job("DropMe", "d" * 24)),
                   enc("PING"))
            self.assertEqual(c.read_n(1), [b"+PONG\r\n"])
            self.assertTrue(c.nothing_within(0.3))
        with rk.Conn(rd.port) as direct:
            self.assertEqual(direct.cmd("LRANGE", "queue:default", "0", "-1"),
                             [job("Keep", "b" * 24).encode()])
        # One push of two jobs (Sidekiq's push_bulk): the first delayed holds the push, and the
        # copy the second's `duplicate` made goes out once the push does.
        with rk.Conn(sk) as c:
            self.assertEqual(c.cmd("LPUSH", "queue:bulk", job("Late", "l" * 24),
                                   job("Dup", "u" * 24)), 2)
        with rk.Conn(rd.port) as direct:
            h.wait_until(lambda: direct.cmd("LLEN", "queue:bulk") == 3, 10,
                         what="the held push and the copy of its second job")
            self.assertEqual(sorted(direct.cmd("LRANGE", "queue:bulk", "0", "-1")),
                             sorted([job("Late", "l" * 24).encode()] +
                                    [job("Dup", "u" * 24).encode()] * 2))
        with rk.Conn(st) as c:
            made = c.cmd("XADD", "jobs", "*", "task", "dropme", "n", "1")
            self.assertRegex(made, rb"^[0-9]+-[0-9]+$")
            self.assertEqual(c.cmd("XADD", "jobs", "MAXLEN", "~", "100", "7-1", "task", "dropme"),
                             b"7-1")
            # Options in any order; an id completed as Redis completes it.
            self.assertEqual(c.cmd("XADD", "jobs", "LIMIT", "10", "MINID", "=", "0", "8",
                                   "task", "dropme"), b"8-0")
            self.assertEqual(c.cmd("XADD", "jobs", "9-*", "task", "dropme"), b"9-0")
            kept = c.cmd("XADD", "jobs", "*", "task", "keep")
            t0 = time.monotonic()
            late = c.cmd("XADD", "jobs", "NOMKSTREAM", "*", "n", "2", "task", "late")
            took = time.monotonic() - t0
            # Batched in a transaction, as redis-py's pipeline() sends them.
            c.send(enc("MULTI"), enc("XADD", "jobs", "*", "task", "dropme"),
                   enc("XADD", "jobs", "*", "task", "keep"), enc("EXEC"))
            got = c.read_n_values(4)
            # A delayed publish holds its whole transaction, and the rest of the transaction's
            # plan stands when it goes on: the dropped XADD in it still never reaches Redis.
            t1 = time.monotonic()
            c.send(enc("MULTI"), enc("XADD", "jobs", "*", "task", "late"),
                   enc("XADD", "jobs", "*", "task", "dropme"), enc("EXEC"))
            held = c.read_n_values(4)
            held_took = time.monotonic() - t1
        self.assertGreaterEqual(took, 0.9, "the delayed XADD was answered after %.2fs" % took)
        self.assertEqual([v[0] for v in got[:3]], [b"OK", b"QUEUED", b"QUEUED"], got)
        made_in_tx, batched = got[3][0]
        self.assertRegex(made_in_tx, rb"^[0-9]+-[0-9]+$")
        self.assertGreaterEqual(held_took, 0.9, "the held transaction went after %.2fs" % held_took)
        late_in_tx, made_in_held = held[3][0]
        self.assertRegex(made_in_held, rb"^[0-9]+-[0-9]+$")
        with rk.Conn(rd.port) as direct:
            self.assertEqual([e[0] for e in direct.cmd("XRANGE", "jobs", "-", "+")],
                             [kept, late, batched, late_in_tx])
        self.assertEqual(len(fk.fault_records(tw, rule="skdrop")), 2)
        self.assertEqual(len(fk.fault_records(tw, rule="stdrop")), 6)
        self.assertEqual(len(fk.fault_records(tw, rule="stlate")), 2)
        # The id twice made for a dropped XADD is on its fault record and its publish record
        # alike: the verdict's NO EFFECT counts it as a lost enqueue.
        tw.stop()
        _, recs, _ = fk.decode_journal(journal)
        named = [(fk.KIND_NAMES.get(r.get("kind")), r.get("rule")) for r in recs
                 if r.get("message_id") == made.decode()]
        self.assertEqual(sorted(named, key=str), sorted([("publish", None), ("fault", "stdrop")],
                                                        key=str), named)


class OneActionPerEvent(h.TestCase):
    """On a resp listener the first rule that fires (in file order) acts on an event and the
    rules after it do not see it.  They used to be counted and journaled as faults too, though
    only the first acted: the journal named a drop that never happened, and the verdict
    miscounted deliveries."""

    def test_first_rule_acts_alone(self):
        rd = h.start_redis(self.tmp)
        self.addCleanup(rd.stop)
        port = h.free_port()
        rules = [fk.rule_block("first", "sk", "when publish task=Both", "do drop"),
                 fk.rule_block("second", "sk", "when publish task=Both", "do delay 2s")]
        tw = self.twice(fk.conf_text([rk.resp_listen_block("sk", port, rd.port, profile="sidekiq")],
                                     rules, log_level="info"))
        job = json.dumps({"class": "Both", "jid": "c" * 24, "queue": "default", "args": []})
        with rk.Conn(port) as c:
            t0 = time.monotonic()
            self.assertEqual(c.cmd("LPUSH", "queue:default", job), 1)
            self.assertLess(time.monotonic() - t0, 1.5, "the second rule's delay applied too")
        h.wait_until(lambda: fk.fault_records(tw, rule="first"), 60, what="the first rule's fault")
        # The fault lines of one decision are written before its reply, which
        # came above: 0.3 s is only a margin, for a line that should not come.
        time.sleep(0.3)
        self.assertEqual(len(fk.fault_records(tw, rule="first")), 1)
        self.assertEqual(fk.fault_records(tw, rule="second"), [],
                         "a rule that did not act was logged as a fault")


class SwallowedAck(h.TestCase):
    """A streams `duplicate` leaves the entry pending by swallowing its XACK: that ack is
    not applied, so no rule on acks acts on it, and none may be journaled as faulting it."""

    def test_swallowed_xack_is_not_faulted(self):
        rd = h.start_redis(self.tmp)
        self.addCleanup(rd.stop)
        port = h.free_port()
        rules = [fk.rule_block("dup", "st", "when deliver", "first 1", "do duplicate"),
                 fk.rule_block("slowack", "st", "when ack", "do delay 10ms")]
        tw = self.twice(fk.conf_text([rk.resp_listen_block("st", port, rd.port, profile="streams")],
                                     rules, log_level="info"))
        with rk.Conn(port) as c:
            self.assertEqual(c.cmd("XGROUP", "CREATE", "jobs", "g", "$", "MKSTREAM"), b"OK")
            eid = c.cmd("XADD", "jobs", "*", "task", "t")
            got = c.cmd("XREADGROUP", "GROUP", "g", "w", "COUNT", "1", "STREAMS", "jobs", ">")
            self.assertEqual(got[0][1][0][0], eid)
            self.assertEqual(c.cmd("XACK", "jobs", "g", eid), 1)  # swallowed: stays pending
            # A lower bound: had twice applied the ack after all (`slowack`
            # delays acks 10 ms, on its own connection), it would be in Redis by now.
            time.sleep(0.3)
        with rk.Conn(rd.port) as direct:
            self.assertEqual(direct.cmd("XPENDING", "jobs", "g")[0], 1)
        self.assertEqual(len(fk.fault_records(tw, rule="dup")), 1)
        self.assertEqual(fk.fault_records(tw, rule="slowack"), [],
                         "the swallowed ack was journaled as faulted")


class MaxMessageSize(h.TestCase):
    """A command with a bulk over max-message-size ends the session as Redis ends one over
    proto-max-bulk-len: the commands before it are applied and their replies reach the
    client, then Redis's refusal, then the close.  The replies used to be lost (the session
    closed at once, the client saw only EOF though its SET was applied)."""

    def test_replies_before_the_oversized_command_arrive(self):
        rd = h.start_redis(self.tmp)
        self.addCleanup(rd.stop)
        port = h.free_port()
        tw = self.twice(fk.conf_text([rk.resp_listen_block("r", port, rd.port,
                                                           extra="max-message-size 1KiB")],
                                     log_level="info"))
        with rk.Conn(port) as c:
            c.send(enc("SET", "a", "1"), enc("GET", "a"), enc("SET", "big", "x" * 2000),
                   enc("PING"))
            got = c.read_n(3)
            self.assertEqual(got, [b"+OK\r\n", b"$1\r\n1\r\n",
                                   b"-ERR Protocol error: invalid bulk length\r\n"])
            h.wait_closed(c.sock, 30)
            addr = c.addr
        rec = tw.wait_sessions([addr], timeout=60)[addr]
        self.assertEqual(rec["reason"], "protocol_error", rec)
        with rk.Conn(rd.port) as direct:
            self.assertEqual(direct.cmd("EXISTS", "a", "big"), 1)


# ---------------------------------------------------------------------------
# B. The `command` event

READONLY_MSG = b"READONLY You can't write against a read only replica."
LOADING_MSG = b"LOADING Redis is loading the dataset in memory"
OOM_MSG = b"OOM command not allowed when used memory > 'maxmemory'."

# listener -> rules (name, lines)
FAULT_RULES = {
    "ro1": [("ro", ["when command command=LPUSH key=queue:*", "first 1", "do error READONLY"])],
    "ro": [("ro_all", ["when command command=LPUSH key=queue:*", "do error -READONLY"])],
    "romulti": [("ro_multi", ["when command command=LPUSH key=queue:*", "do error READONLY"])],
    # the command name in a rule is case-insensitive, like Redis's
    "rocase": [("rocase", ["when command command=rpush key=queue:*", "do error READONLY"])],
    # an injected error while the client asked for no replies
    "roquiet": [("quiet", ["when command command=LPUSH key=queue:*", "do error READONLY"])],
    # twice's own answer to a command read only once replies drained the pipeline
    "rocap": [("ro_cap", ["when command command=LPUSH key=queue:*", "do error READONLY"])],
    "codes": [("loading", ["when command command=GET key=loading:*", "do error LOADING"]),
              ("oom", ["when command command=SET key=oom:*", "do error OOM"]),
              ("custom", ["when command command=HSET key=custom:*", "do error NOPE"])],
    "slow": [("slow", ["when command command=GET", "do delay 1s"])],
    "hang": [("hang", ["when command command=GET key=hang", "do drop"])],
    "closer": [("cbefore", ["when command command=SET key=boom", "do close before"]),
               ("cafter", ["when command command=SET key=boom-after", "do close after"])],
    # a held reply with a pipeline behind it (profile celery)
    "held": [("held", ["when deliver queue=celery", "do delay 600ms"])],
    # every Celery ack kept back (kombu's MULTI / ZREM unacked_index / HDEL unacked / EXEC)
    "celack": [("lostack", ["when ack", "do redeliver"])],
}
FAULT_PROFILES = {"held": "celery", "celack": "celery"}

EV_COMMAND = 7  # enum rule_event (rules/rule.h)


class CommandFaults(ck.BrokerCase):
    REDIS = True
    TMP_PREFIX = "twice-it-respfault-"

    @classmethod
    def set_up_class(cls):
        cls.journal = os.path.join(cls.ctmp, "journal.pb")
        cls.ports = {name: h.free_port() for name in FAULT_RULES}
        listeners = [ck.resp_listen(name, port, cls.redis.port, profile=FAULT_PROFILES.get(name))
                     for name, port in sorted(cls.ports.items())]
        rules = [fk.rule_block(rn, ln, *lines) for ln, rl in FAULT_RULES.items() for rn, lines in rl]
        head = "seed 7\njournal %s\nlog-level debug\nconnect-timeout 2s\nshutdown-grace 2s\n" % cls.journal
        cls.tw, cls.note = rk.start_twice_rules(head, listeners, rules, cls.ctmp)

    @classmethod
    def stop_twice(cls, t):
        rk.stop_twice(t)

    def setUp(self):
        super().setUp()
        self.mark = self.class_mark
        self.redis.command("FLUSHALL")

    def tearDown(self):
        rk.assert_twice_healthy(self, self.tw, self.mark)

    def client(self, listener, **kw):
        return ck.redis_py(self.ports[listener], timeout=10, **kw)

    def why(self, what):
        return "%s %s\n--- twice log tail ---\n%s" % (what, self.note, self.tw.log_tail(30))

    def check_fault(self, rule, listener, action, n=1, addrs=None):
        """n `msg=fault` lines and n journal FAULT records of rule (of the
        sessions of client addresses addrs if given), matching each other."""
        want = None
        if addrs is not None:
            want = set(fk.sid_of(self.tw, a) for a in addrs)

        def recs_now():
            return [r for r in fk.fault_records(self.tw, rule=rule)
                    if want is None or int(r["sid"]) in want]
        try:
            h.wait_until(lambda: len(recs_now()) >= n, 60, what="fault lines")
        except TimeoutError:
            self.fail(self.why("expected %d msg=fault lines of rule %s, got %r" % (n, rule, recs_now())))
        recs = recs_now()
        self.assertEqual(len(recs), n, recs)
        for r in recs:
            self.assertEqual(r["listener"], listener, r)
            self.assertEqual(r["action"], action, r)
            self.assertEqual(r.get("event"), "command", r)
        sids = sorted(int(r["sid"]) for r in recs)
        if want is not None:
            self.assertEqual(sorted(want), sorted(set(sids)))
        jr = rk.wait_journal_faults(self.journal, rule, n, sessions=want)
        self.assertEqual(len(jr), n, self.why("journal FAULT records of %s: %r" % (rule, jr)))
        self.assertEqual(sorted(r.get("session") for r in jr), sids)
        for r in jr:
            self.assertEqual(r.get("listener"), listener, r)
            self.assertEqual(r.get("action_name"), action, r)
            self.assertEqual(r.get("event"), EV_COMMAND, r)

    # -- error --------------------------------------------------------------

    def test_error_readonly_first_1(self):
        r = self.client("ro1")
        with self.assertRaises(redis.exceptions.ReadOnlyError,
                               msg=self.why("LPUSH queue:x was not refused")) as cm:
            r.lpush("queue:x", "v1")
        self.assertEqual(str(cm.exception), READONLY_MSG.decode().split(" ", 1)[1])
        self.assertEqual(self.redis.command("EXISTS", "queue:x"), b"0", "the refused LPUSH was applied")
        self.assertEqual(r.lpush("other:x", "v"), 1)
        self.assertEqual(r.lpush("queue:x", "v2"), 1, "`first 1`: the second LPUSH must pass")
        self.assertEqual(self.redis.command("LRANGE", "queue:x", "0", "-1"), [b"v2"])
        self.check_fault("ro", "ro1", "error", 1)

    def test_error_readonly_pipeline_order(self):
        with rk.Conn(self.ports["ro"]) as c:
            c.send(enc("SET", "a", "1"), enc("LPUSH", "queue:y", "v"), enc("GET", "a"))
            got = c.read_n(3)
            self.assertEqual(got[1], b"-" + READONLY_MSG + b"\r\n",
                             self.why("LPUSH queue:y in a pipeline was not refused: %r" % got))
            self.assertEqual(got, [b"+OK\r\n", b"-" + READONLY_MSG + b"\r\n", b"$1\r\n1\r\n"])
            # an inline lpush, lower case: the same rule
            c.send(inline("lpush queue:z v"), inline("PING"))
            self.assertEqual(c.read_n(2), [b"-" + READONLY_MSG + b"\r\n", b"+PONG\r\n"])
            addr = c.addr
        self.assertEqual(self.redis.command("EXISTS", "queue:y", "queue:z"), b"0")
        self.assertEqual(self.redis.command("GET", "a"), b"1")
        # redis-py, pipeline without a transaction
        r = self.client("ro")
        p = r.pipeline(transaction=False)
        p.set("b", "2").lpush("queue:w", "x").get("b").lpush("q2", "y")
        res = p.execute(raise_on_error=False)
        self.assertIs(res[0], True)
        self.assertIsInstance(res[1], redis.exceptions.ReadOnlyError)
        self.assertEqual(res[2:], [b"2", 1])
        self.assertEqual(self.redis.command("EXISTS", "queue:w"), b"0")
        self.check_fault("ro_all", "ro", "error", 3)
        self.assertIn(fk.sid_of(self.tw, addr), [int(x["sid"]) for x in fk.fault_records(self.tw, rule="ro_all")])

    def test_error_answered_after_the_pipeline_cap(self):
        """4,096 PINGs fill a session's reply pairing (its cap): the LPUSH
        behind them is read only once replies drained some of it, in the
        handling of Redis's bytes, and twice's own error for it keeps its
        place.  (When the last reply of the drain empties the queue, that
        error is at its head and is flushed there too; Redis answers 4,096
        PINGs in several writes, so this test does not reach that case.)"""
        with rk.Conn(self.ports["rocap"]) as c:
            c.send(*([enc("PING")] * 4096), enc("LPUSH", "queue:cap", "v"))
            got = c.read_n(4097)
            self.assertEqual(got[:4096], [b"+PONG\r\n"] * 4096)
            self.assertEqual(got[4096], b"-" + READONLY_MSG + b"\r\n")
        self.assertEqual(self.redis.command("EXISTS", "queue:cap"), b"0")
        self.check_fault("ro_cap", "rocap", "error", 1)

    def test_error_loading_oom_custom(self):
        self.redis.command("SET", "loading:1", "v")
        r = self.client("codes")
        with self.assertRaises(redis.exceptions.BusyLoadingError,
                               msg=self.why("GET loading:1 was not refused")):
            r.get("loading:1")
        # redis-py 4.3.4 has no OutOfMemoryError (later versions map OOM to it
        # and strip the code from the message, as for READONLY)
        oom_cls = getattr(redis.exceptions, "OutOfMemoryError", None)
        with self.assertRaises(oom_cls or redis.exceptions.ResponseError,
                               msg=self.why("SET oom:1 was not refused")) as cm:
            r.set("oom:1", "v")
        self.assertEqual(str(cm.exception), OOM_MSG.decode().split(" ", 1)[1] if oom_cls else OOM_MSG.decode())
        self.assertEqual(self.redis.command("EXISTS", "oom:1"), b"0")
        with rk.Conn(self.ports["codes"]) as c:
            c.send(enc("GET", "loading:2"), enc("SET", "oom:2", "v"), enc("HSET", "custom:1", "f", "v"),
                   enc("GET", "loading:3"), enc("GET", "other"))
            got = c.read_n(5)
        self.assertEqual(got, [b"-" + LOADING_MSG + b"\r\n", b"-" + OOM_MSG + b"\r\n",
                               b"-NOPE error injected by twice rule 'custom'\r\n",
                               b"-" + LOADING_MSG + b"\r\n", b"$-1\r\n"], self.why("replies %r" % got))
        self.assertEqual(self.redis.command("EXISTS", "oom:2", "custom:1"), b"0")
        self.check_fault("loading", "codes", "error", 3)
        self.check_fault("oom", "codes", "error", 2)
        self.check_fault("custom", "codes", "error", 1)

    def test_negative_count_is_an_empty_command(self):
        """Redis reads a multibulk count below -1 as it reads *-1 and *0: an empty command,
        no reply, the connection goes on.  twice took it for a protocol error and passed the
        rest of the session on unparsed: no rule applied to it any more."""
        before = len(fk.fault_records(self.tw, rule="oom"))
        with rk.Conn(self.ports["codes"]) as c:
            c.send(b"*-5\r\n", enc("SET", "oom:3", "v"), b"*-2\r\n*0\r\n", enc("GET", "other"))
            got = c.read_n(2)
            # An empty command ends a CLIENT REPLY SKIP (Redis's resetClient): GET is answered.
            c.send(enc("CLIENT", "REPLY", "SKIP"), b"*-3\r\n", enc("GET", "other"), enc("PING"))
            got += c.read_n(2)
        self.assertEqual(got, [b"-" + OOM_MSG + b"\r\n", b"$-1\r\n", b"$-1\r\n", b"+PONG\r\n"],
                         self.why("replies %r" % got))
        self.assertEqual(self.redis.command("EXISTS", "oom:3"), b"0")
        h.wait_until(lambda: len(fk.fault_records(self.tw, rule="oom")) == before + 1, 60,
                     what="one more fault line of rule oom")

    def test_celery_ack_of_several_tags_kept_back_whole(self):
        """An ack transaction naming several tags, all kept back: the HDEL of the payloads
        goes with the ZREM of their index entries.  Only an HDEL of one tag was kept back, so
        the payloads were deleted while the index kept the tags: kombu's restore then found
        nothing to restore, and the jobs were lost instead of redelivered."""
        direct = self.redis.command
        direct("ZADD", "unacked_index", "1", "t6", "1", "t7")
        direct("HSET", "unacked", "t6", "job6", "t7", "job7")
        with rk.Conn(self.ports["celack"]) as c:
            c.send(enc("MULTI"), enc("ZREM", "unacked_index", "t6", "t7"),
                   enc("HDEL", "unacked", "t6", "t7"), enc("EXEC"))
            got = c.read_n(4)
        self.assertEqual(got, [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n",
                               b"*2\r\n:2\r\n:2\r\n"], self.why("replies %r" % got))
        self.assertEqual(direct("ZCARD", "unacked_index"), b"2", "the index entries stay")
        self.assertEqual(direct("HLEN", "unacked"), b"2", "the payloads stay with them")
        self.assertEqual(len(fk.fault_records(self.tw, rule="lostack")), 2)

    def test_celery_ack_written_in_pieces(self):
        """A MULTI that arrives alone on a listener with an ack rule waits (up to 100 ms) for
        the rest of its transaction: an ack written command by command is kept back as one
        written at once.  It used to go on at once, and its ack was never faulted.  A client
        that waits for MULTI's +OK before going on gets it after the wait, and is not faulted."""
        direct = self.redis.command
        direct("ZADD", "unacked_index", "1", "t8")
        direct("HSET", "unacked", "t8", "job8")
        before = len(fk.fault_records(self.tw, rule="lostack"))
        with rk.Conn(self.ports["celack"]) as c:
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for piece in (enc("MULTI"), enc("ZREM", "unacked_index", "t8"),
                          enc("HDEL", "unacked", "t8"), enc("EXEC")):
                c.send(piece)
                time.sleep(0.005)
            got = c.read_n(4)
        self.assertEqual(got, [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n",
                               b"*2\r\n:1\r\n:1\r\n"], self.why("replies %r" % got))
        self.assertEqual(direct("ZSCORE", "unacked_index", "t8"), b"1", "the ack was kept back")
        self.assertEqual(direct("HEXISTS", "unacked", "t8"), b"1")
        self.assertEqual(len(fk.fault_records(self.tw, rule="lostack")), before + 1)
        # One step at a time, as redis-cli: MULTI's +OK comes after the wait.
        with rk.Conn(self.ports["celack"]) as c:
            t0 = time.monotonic()
            self.assertEqual(c.cmd("MULTI"), b"OK")
            self.assertLess(time.monotonic() - t0, 5)
            self.assertEqual(c.cmd("SET", "k", "v"), b"QUEUED")
            self.assertEqual(c.cmd("EXEC"), [b"OK"])

    def test_rule_command_name_case_insensitive(self):
        # the rule says `command=rpush`; clients send RPUSH, rpush, RpUsH
        with rk.Conn(self.ports["rocase"]) as c:
            c.send(enc("RPUSH", "queue:c1", "v"), inline("rpush queue:c2 v"), enc("RpUsH", "queue:c3", "v"),
                   enc("RPUSH", "other", "v"))
            got = c.read_n(4)
            addr = c.addr
        err = b"-" + READONLY_MSG + b"\r\n"
        self.assertEqual(got, [err, err, err, b":1\r\n"],
                         self.why("a rule with command=rpush (lower case) against RPUSH / rpush / RpUsH:"))
        self.assertEqual(self.redis.command("EXISTS", "queue:c1", "queue:c2", "queue:c3"), b"0")
        self.check_fault("rocase", "rocase", "error", 3, addrs=[addr])

    def test_error_inside_multi_aborts_exec(self):
        """A command refused at queue time makes Redis discard the whole
        transaction: an injected error does the same (EXECABORT, nothing
        applied), and the connection goes on in order."""
        with rk.Conn(self.ports["romulti"]) as c:
            c.send(enc("MULTI"), enc("SET", "tx:a", "1"), enc("LPUSH", "queue:tx", "v"),
                   enc("SET", "tx:b", "2"), enc("EXEC"), enc("PING"))
            got = c.read_n(6)
            addr = c.addr
        self.assertEqual(got[:4], [b"+OK\r\n", b"+QUEUED\r\n",
                                   b"-READONLY You can't write against a read only replica.\r\n",
                                   b"+QUEUED\r\n"], self.why("queued replies:"))
        self.assertEqual(got[4], b"-EXECABORT Transaction discarded because of previous errors.\r\n")
        self.assertEqual(got[5], b"+PONG\r\n")
        self.assertEqual(self.redis.command("EXISTS", "tx:a", "tx:b", "queue:tx"), b"0",
                         self.why("a command of the aborted transaction was applied"))
        self.check_fault("ro_multi", "romulti", "error", 1, addrs=[addr])

    def test_push_while_twice_discards(self):
        """RESP3 with tracking: an invalidation push that Redis sends while
        twice's own DISCARD (of a transaction it aborted) waits for its +OK
        reaches the client, before EXECABORT; twice hides only its own reply.
        A busy script on another connection holds Redis so that the push
        (from that connection's SET) is written before the DISCARD's +OK."""
        inv = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\npk\r\n"
        busy = ("local t0 = redis.call('TIME') local t = t0 "
                "while (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) < 1000000 do t = redis.call('TIME') end "
                "return 1")
        with rk.Conn(self.ports["romulti"]) as c, rk.Conn(self.redis.port) as other:
            c.cmd("HELLO", "3")
            c.send(enc("CLIENT", "TRACKING", "ON"), enc("GET", "pk"))
            self.assertEqual(c.read_n(2), [b"+OK\r\n", b"_\r\n"])
            c.send(enc("MULTI"), enc("LPUSH", "queue:tx", "v"))
            self.assertEqual(c.read_n(2)[0], b"+OK\r\n")
            other.send(enc("EVAL", busy, "0"), enc("SET", "pk", "1"))
            time.sleep(0.3)  # Redis runs the script (1 s); the DISCARD waits behind it
            c.send(enc("EXEC"), enc("PING"))
            got = c.read_n(3)
            self.assertEqual(other.read_n(2), [b":1\r\n", b"+OK\r\n"])
        self.assertEqual(got, [inv, b"-EXECABORT Transaction discarded because of previous errors.\r\n",
                               b"+PONG\r\n"], self.why("replies after EXEC:"))

    def test_error_while_client_reply_off(self):
        """Redis stays silent under CLIENT REPLY OFF / SKIP, errors included:
        an injected error must stay silent too, or every later reply is
        paired with the wrong command."""
        with rk.Conn(self.ports["roquiet"]) as c:
            c.send(enc("CLIENT", "REPLY", "OFF"), enc("LPUSH", "queue:q1", "v"), enc("CLIENT", "REPLY", "ON"),
                   enc("PING"),
                   enc("CLIENT", "REPLY", "SKIP"), enc("LPUSH", "queue:q2", "v"), enc("ECHO", "after-skip"))
            got = c.read_n(3)
            self.assertEqual(got, [b"+OK\r\n", b"+PONG\r\n", b"$10\r\nafter-skip\r\n"],
                             self.why("replies around silenced injected errors:"))
            self.assertTrue(c.nothing_within(0.3))
            addr = c.addr
        self.assertEqual(self.redis.command("EXISTS", "queue:q1", "queue:q2"), b"0",
                         self.why("a silenced LPUSH reached Redis"))
        self.check_fault("quiet", "roquiet", "error", 2, addrs=[addr])

    # -- delay --------------------------------------------------------------

    def test_delay(self):
        self.redis.command("SET", "a", "va")
        with rk.Conn(self.ports["slow"]) as c:
            self.assertEqual(c.raw("PING"), b"+PONG\r\n")
            t0 = time.monotonic()
            c.send(enc("GET", "a"), enc("PING"), enc("SET", "a", "vb"))
            first = c.read_raw()
            dt = time.monotonic() - t0
            rest = c.read_n(2)
            addr = c.addr
        self.assertEqual([first] + rest, [b"$2\r\nva\r\n", b"+PONG\r\n", b"+OK\r\n"])
        self.assertGreaterEqual(dt, 0.9, self.why("pipelined [GET a, PING] answered after %.3fs" % dt))
        self.assertEqual(self.redis.command("GET", "a"), b"vb")
        self.check_fault("slow", "slow", "delay", 1, addrs=[addr])

    def test_pipeline_behind_a_held_reply(self):
        """A delivery held back 600 ms, with GET, INCR, PING... pipelined
        behind it in the same write: their replies come back from Redis at
        once, but reach the client only after the held one, in order, byte
        for byte; then the next delivery is held as well.  (twice owes a run
        of plain replies through one entry: a count that ends too late would
        hand the next delivery's reply to that entry, unseen and unheld.)"""
        self.redis.command("LPUSH", "celery", kombu_message("held-1"))
        self.redis.command("SET", "a", "va")
        plain = [enc("GET", "a"), enc("INCR", "n"), enc("GET", "nope"), enc("PING"),
                 enc("INCR", "n"), enc("SET", "b", "vb"), enc("GET", "b"), enc("STRLEN", "a")]
        want = [b":1\r\n", b"$-1\r\n", b"+PONG\r\n", b":2\r\n", b"+OK\r\n",
                b"$2\r\nvb\r\n", b":2\r\n"]
        with rk.Conn(self.ports["held"]) as c:
            t0 = time.monotonic()
            c.send(enc("BRPOP", "celery", "1"), *plain)
            first = c.read_raw()
            dt = time.monotonic() - t0
            rest = c.read_n(len(plain))
            # the same connection goes on: a pipeline with nothing held
            c.send(*[enc("INCR", "m") for _ in range(50)])
            after = c.read_n(50)
            # and the next delivery is seen, and held, as the first was: the
            # run of plain replies before it ended where it should
            self.redis.command("LPUSH", "celery", kombu_message("held-2"))
            t1 = time.monotonic()
            c.send(enc("BRPOP", "celery", "1"), enc("PING"))
            second = c.read_raw()
            dt2 = time.monotonic() - t1
            pong = c.read_raw()
        self.assertTrue(first.startswith(b"*2\r\n$6\r\ncelery\r\n"), self.why("BRPOP's reply: %r" % first[:80]))
        self.assertGreaterEqual(dt, 0.5, self.why("the held delivery came after %.3fs" % dt))
        self.assertEqual(rest, [b"$2\r\nva\r\n"] + want,
                         self.why("replies behind the held one, out of order or changed:"))
        self.assertEqual(after, [b":%d\r\n" % i for i in range(1, 51)])
        self.assertTrue(second.startswith(b"*2\r\n$6\r\ncelery\r\n") and b"held-2" in second,
                        self.why("the second BRPOP's reply: %r" % second[:80]))
        self.assertGreaterEqual(dt2, 0.5, self.why("the second held delivery came after %.3fs" % dt2))
        self.assertEqual(pong, b"+PONG\r\n")
        self.assertEqual(self.redis.command("GET", "n"), b"2")

    # -- drop ---------------------------------------------------------------

    def test_drop(self):
        self.redis.command("SET", "hang", "h")
        self.redis.command("CONFIG", "RESETSTAT")
        c = rk.Conn(self.ports["hang"])
        try:
            c.send(enc("GET", "hang"))
            with rk.Conn(self.ports["hang"]) as other:
                self.assertEqual(other.raw("PING"), b"+PONG\r\n")
                self.assertEqual(other.raw("GET", "nothang"), b"$-1\r\n")
            try:
                c.nothing_within(2.0)
            except AssertionError as e:
                self.fail(self.why("GET hang was answered: %s" % e))
            # nothing more is answered on that connection
            c.send(enc("PING"))
            c.nothing_within(1.0)
            addr = c.addr
        finally:
            c.close()
        calls = self.redis.info("commandstats").get("cmdstat_get", "")
        self.assertIn("calls=1,", calls, "Redis ran GET hang: %r" % calls)
        self.tw.wait_sessions([addr])
        self.check_fault("hang", "hang", "drop", 1, addrs=[addr])

    # -- close --------------------------------------------------------------

    def test_close_before(self):
        with rk.Conn(self.ports["closer"]) as c:
            c.send(enc("SET", "boom", "v"))
            c.settimeout(30)
            try:
                data = c.sock.recv(65536)
            except ConnectionResetError:
                data = b""      # a reset is a close too
            except socket.timeout:
                data = b"<still open after 30s>"
            self.assertEqual(data, b"", self.why("SET boom was answered %r" % data))
            addr = c.addr
        self.assertEqual(self.redis.command("EXISTS", "boom"), b"0", "SET boom reached Redis")
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        self.check_fault("cbefore", "closer", "close", 1, addrs=[addr])

    def test_close_after(self):
        with rk.Conn(self.ports["closer"]) as c:
            c.send(enc("SET", "boom-after", "v"))
            c.settimeout(30)
            try:
                data = h.recv_all(c.sock)
            except socket.timeout:
                self.fail(self.why("the connection stayed open after SET boom-after"))
            addr = c.addr
        self.assertEqual(data, b"+OK\r\n", self.why("before the close"))
        self.assertEqual(self.redis.command("GET", "boom-after"), b"v")
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        self.check_fault("cafter", "closer", "close", 1, addrs=[addr])


    def test_close_before_in_pipeline(self):
        """[SET pre, SET boom, SET post] in one write: what the client sent
        before the faulted command reaches Redis; the command and what
        follows it do not."""
        with rk.Conn(self.ports["closer"]) as c:
            c.send(enc("SET", "pre", "1"), enc("SET", "boom", "v"), enc("SET", "post", "1"))
            c.settimeout(30)
            try:
                data = h.recv_all(c.sock)
            except ConnectionResetError:
                data = b""
            except socket.timeout:
                self.fail(self.why("the connection stayed open after SET boom"))
            addr = c.addr
        self.assertIn(data, (b"", b"+OK\r\n"), self.why("replies before the close: %r" % data))
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        # When the close came before SET pre's reply, Redis may not have run
        # it yet: wait for it.  What followed pre in the client's one write
        # would have been run with it, had twice passed it on; 0.2 s more is
        # a lower bound for a later write.
        h.eventually(lambda: self.redis.command("EXISTS", "pre") == b"1", 60)
        time.sleep(0.2)
        self.assertEqual([self.redis.command("EXISTS", k) for k in ("pre", "boom", "post")],
                         [b"1", b"0", b"0"], self.why("keys pre, boom, post after `close before` on boom:"))
        self.check_fault("cbefore", "closer", "close", 1, addrs=[addr])

    def test_close_after_in_pipeline(self):
        """[SET pre, SET boom-after, SET post] in one write: pre and boom-after
        are applied and answered, then the connection closes; post never
        reaches Redis (the client crashed right after boom-after)."""
        with rk.Conn(self.ports["closer"]) as c:
            c.send(enc("SET", "pre", "1"), enc("SET", "boom-after", "v"), enc("SET", "post", "1"))
            c.settimeout(30)
            try:
                data = h.recv_all(c.sock)
            except socket.timeout:
                self.fail(self.why("the connection stayed open after SET boom-after"))
            addr = c.addr
        self.assertEqual(data, b"+OK\r\n+OK\r\n", self.why("replies before the close:"))
        rec = self.tw.wait_sessions([addr])[addr]
        self.assertEqual(rec["reason"], "fault", rec)
        # pre and boom-after are answered, so applied; post came in the same
        # write and would have been run with them, had twice passed it on:
        # 0.2 s is a lower bound for a later write.
        time.sleep(0.2)
        self.assertEqual([self.redis.command("EXISTS", k) for k in ("pre", "boom-after", "post")],
                         [b"1", b"1", b"0"], self.why("keys pre, boom-after, post after `close after`:"))
        self.check_fault("cafter", "closer", "close", 1, addrs=[addr])


if __name__ == "__main__":
    unittest.main(verbosity=2)
