#!/usr/bin/python3
"""capture_resp.py - record the golden RESP byte streams used by test_resp.c.

The unit test only reads the committed files; CI never re-records.  To regenerate
(needs Debian's redis-server 7 and redis-cli, no root):

    /usr/bin/python3 tests/unit/capture_resp.py tests/unit/data/resp
    /usr/bin/python3 tests/unit/capture_resp.py --describe tests/unit/data/resp

The second command prints, with a parser independent of twice's, the message sequences
that test_resp.c expects (golden_*_seq[]).

This starts a throw-away redis-server on 127.0.0.1 (a free port, a temporary directory,
no persistence, DEBUG enabled), puts a TCP relay in front of it that copies each
direction of one connection into NAME-client.bin / NAME-server.bin, runs one session
per NAME through the relay, then stops the server.  A second, unrecorded connection
(the "other" client) publishes, touches WATCHed and tracked keys.

Sessions (test_resp.c asserts these sequences; re-recording means updating them):
  resp2  raw socket, RESP2: inline commands (quoted words, a bare LF, a blank line),
         SET/GET, a null bulk, LPUSH + BRPOP with a timeout (null array) and with data,
         MULTI/EXEC, MULTI with an unknown command (EXECABORT), DISCARD, WATCH + a
         conflicting write (null EXEC), a pipeline written at once, CLIENT REPLY
         OFF/ON/SKIP, streams (XADD, XGROUP, XREADGROUP, XACK, XREADGROUP BLOCK
         timeout, XPENDING), READONLY from a replica, SUBSCRIBE/PSUBSCRIBE with
         messages published by the other client, PING while subscribed,
         UNSUBSCRIBE/PUNSUBSCRIBE without arguments, QUIT.
  resp3  raw socket: HELLO 3, DEBUG PROTOCOL for every RESP3 type (attribute and push
         included), HGETALL (map), SMEMBERS (set), ZSCORE (double), ZRANGE WITHSCORES,
         BRPOP timeout (RESP3 null), XREADGROUP (map), CLIENT TRACKING with an
         invalidation push, SUBSCRIBE with push messages, a command while subscribed,
         UNSUBSCRIBE, HELLO 2, RESET, QUIT.
  cli    nine one-shot redis-cli connections (most with -3, i.e. HELLO 3 first), one after
         the other in one pair of files.
  big    raw socket: SET and GET of a 100 KiB value (102400 bytes).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capturekit import free_port, pump  # noqa: E402

BIG = 102400


class Relay:
    """Accepts `conns` clients one after the other, connects each upstream, and appends each
    direction to a file."""

    def __init__(self, upstream_port, client_path, server_path, conns=1):
        self.upstream_port = upstream_port
        self.conns = conns
        for path in (client_path, server_path):
            open(path, "wb").close()
        self.paths = (client_path, server_path)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.port = self.lsock.getsockname()[1]
        self.threads = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        for _ in range(self.conns):
            client, _ = self.lsock.accept()
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            pair = []
            for src, dst, path in ((client, server, self.paths[0]),
                                   (server, client, self.paths[1])):
                t = threading.Thread(target=pump, args=(src, dst, path), daemon=True)
                t.start()
                pair.append(t)
            for t in pair:
                t.join(10)
            self.threads.extend(pair)

    def join(self, timeout=10):
        deadline = time.time() + timeout
        while len(self.threads) < 2 * self.conns and time.time() < deadline:
            time.sleep(0.05)
        for t in self.threads:
            t.join(max(0.1, deadline - time.time()))
        self.lsock.close()


class Conn:
    """A raw RESP connection with a small independent reply parser (not twice's)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _bytes(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        """One reply as (type, value); attributes are returned as ('|', attr, reply)."""
        line = self._line()
        t, rest = chr(line[0]), line[1:]
        if t in "+-:,(#_":
            return (t, rest)
        if t in "$=!":
            n = int(rest)
            return (t, None if n < 0 else self._bytes(n))
        n = int(rest)
        if n < 0:
            return (t, None)
        count = 2 * n if t in "%|" else n
        items = [self.read() for _ in range(count)]
        if t == "|":
            return ("|", items, self.read())
        return (t, items)

    def cmd(self, *args):
        self.send(encode(*args))
        return self.read()

    def close(self):
        self.sock.close()


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def expect(got, t, value=None):
    if got[0] != t or (value is not None and got[1] != value):
        raise AssertionError("expected %s %r, got %r" % (t, value, got))
    return got


def session_resp2(c, other, dead_port):
    expect(c.cmd_inline(b"PING\r\n"), "+", b"PONG")
    expect(c.cmd_inline(b"SET \"inline key\" 'it\\'s' \r\n"), "+", b"OK")
    expect(c.cmd_inline(b"GET \"inline\\x20key\"\n"), "$", b"it's")
    c.send(b"\r\n")  # a blank inline line: Redis answers nothing
    expect(c.cmd("SET", "golden:k", "v1"), "+", b"OK")
    expect(c.cmd("GET", "golden:k"), "$", b"v1")
    expect(c.cmd("GET", "golden:missing"), "$", None)
    c.cmd("DEL", "golden:q", "golden:empty", "golden:n", "golden:s")
    expect(c.cmd("LPUSH", "golden:q", "job-1", "job-2", "job-3"), ":", b"3")
    expect(c.cmd("BRPOP", "golden:empty", "0.1"), "*", None)
    expect(c.cmd("BRPOP", "golden:q", "1"), "*")
    # MULTI/LPUSH/EXEC, as kombu's QoS pipelines send it: one write.
    c.send(encode("MULTI") + encode("LPUSH", "golden:q", "job-4") + encode("INCR", "golden:n") +
           encode("EXEC"))
    expect(c.read(), "+", b"OK")
    expect(c.read(), "+", b"QUEUED")
    expect(c.read(), "+", b"QUEUED")
    expect(c.read(), "*")
    expect(c.cmd("MULTI"), "+", b"OK")
    expect(c.cmd("NOSUCHCMD", "x"), "-")
    expect(c.cmd("EXEC"), "-")
    expect(c.cmd("MULTI"), "+", b"OK")
    expect(c.cmd("SET", "golden:k", "v2"), "+", b"QUEUED")
    expect(c.cmd("DISCARD"), "+", b"OK")
    expect(c.cmd("WATCH", "golden:k"), "+", b"OK")
    expect(c.cmd("MULTI"), "+", b"OK")
    expect(c.cmd("INCR", "golden:n"), "+", b"QUEUED")
    expect(other.cmd("SET", "golden:k", "changed"), "+", b"OK")
    expect(c.cmd("EXEC"), "*", None)
    # A pipeline written at once, as redis-py's transaction=False pipeline does.
    c.send(encode("SET", "golden:p", "1") + encode("INCR", "golden:p") +
           encode("LRANGE", "golden:q", "0", "-1") + encode("HSET", "golden:h", "f1", "a", "f2", "b") +
           encode("HGETALL", "golden:h") + encode("ZADD", "golden:z", "1.5", "m1", "2", "m2") +
           encode("ZRANGE", "golden:z", "0", "-1", "WITHSCORES"))
    for _ in range(7):
        c.read()
    # CLIENT REPLY: OFF silences until ON; SKIP silences the next command only.
    c.send(encode("CLIENT", "REPLY", "OFF") + encode("SET", "golden:off", "1") +
           encode("INCR", "golden:off") + encode("CLIENT", "REPLY", "ON"))
    expect(c.read(), "+", b"OK")
    c.send(encode("CLIENT", "REPLY", "SKIP") + encode("INCR", "golden:off") +
           encode("INCR", "golden:off"))
    expect(c.read(), ":", b"4")
    # Streams: a consumer group delivery, its ack, a blocking read that times out.
    expect(c.cmd("XADD", "golden:s", "1-1", "task", "t1", "body", "{}"), "$", b"1-1")
    expect(c.cmd("XADD", "golden:s", "1-2", "task", "t2", "body", "{}"), "$", b"1-2")
    expect(c.cmd("XGROUP", "CREATE", "golden:s", "g", "0"), "+", b"OK")
    expect(c.cmd("XREADGROUP", "GROUP", "g", "c1", "COUNT", "10", "STREAMS", "golden:s", ">"),
           "*")
    expect(c.cmd("XACK", "golden:s", "g", "1-1"), ":", b"1")
    expect(c.cmd("XREADGROUP", "GROUP", "g", "c1", "BLOCK", "100", "STREAMS", "golden:s", ">"),
           "*", None)
    expect(c.cmd("XPENDING", "golden:s", "g"), "*")
    # READONLY, as a replica answers a write.
    expect(c.cmd("REPLICAOF", "127.0.0.1", str(dead_port)), "+")
    expect(c.cmd("SET", "golden:k", "v3"), "-")
    expect(c.cmd("REPLICAOF", "NO", "ONE"), "+")
    # Pub/sub in RESP2: confirmations and messages are arrays.
    c.send(encode("SUBSCRIBE", "golden.a", "golden.b"))
    expect(c.read(), "*")
    expect(c.read(), "*")
    expect(c.cmd("PSUBSCRIBE", "golden.*"), "*")
    other.cmd("PUBLISH", "golden.a", "hello")
    expect(c.read(), "*")  # message
    expect(c.read(), "*")  # pmessage
    expect(c.cmd("PING"), "*")
    c.send(encode("UNSUBSCRIBE"))
    expect(c.read(), "*")
    expect(c.read(), "*")
    expect(c.cmd("PUNSUBSCRIBE"), "*")
    expect(c.cmd("QUIT"), "+", b"OK")


def session_resp3(c, other):
    expect(c.cmd("HELLO", "3"), "%")
    for t in ("string", "integer", "double", "bignum", "null", "array", "set", "map", "attrib",
              "verbatim", "true", "false"):
        c.cmd("DEBUG", "PROTOCOL", t)
    c.send(encode("DEBUG", "PROTOCOL", "push"))
    expect(c.read(), ">")
    c.read()
    c.cmd("DEL", "golden:h3", "golden:set3", "golden:z3", "golden:s3", "golden:t3")
    c.cmd("HSET", "golden:h3", "f1", "a", "f2", "b")
    expect(c.cmd("HGETALL", "golden:h3"), "%")
    c.cmd("SADD", "golden:set3", "x", "y")
    expect(c.cmd("SMEMBERS", "golden:set3"), "~")
    c.cmd("ZADD", "golden:z3", "1.5", "m1", "2", "m2")
    expect(c.cmd("ZSCORE", "golden:z3", "m1"), ",")
    expect(c.cmd("ZRANGE", "golden:z3", "0", "-1", "WITHSCORES"), "*")
    expect(c.cmd("BRPOP", "golden:empty3", "0.1"), "_")
    c.cmd("XADD", "golden:s3", "1-1", "task", "t1")
    c.cmd("XGROUP", "CREATE", "golden:s3", "g", "0")
    expect(c.cmd("XREADGROUP", "GROUP", "g", "c1", "STREAMS", "golden:s3", ">"), "%")
    expect(c.cmd("CLIENT", "TRACKING", "ON"), "+", b"OK")
    c.cmd("SET", "golden:t3", "1")
    c.cmd("GET", "golden:t3")
    other.cmd("SET", "golden:t3", "2")
    expect(c.read(), ">")  # invalidate
    c.send(encode("SUBSCRIBE", "golden.c"))
    expect(c.read(), ">")
    other.cmd("PUBLISH", "golden.c", "hi")
    expect(c.read(), ">")
    expect(c.cmd("GET", "golden:t3"), "$")
    expect(c.cmd("PING"), "+", b"PONG")
    c.send(encode("UNSUBSCRIBE"))
    expect(c.read(), ">")
    expect(c.cmd("HELLO", "2"), "*")
    expect(c.cmd("DEBUG", "PROTOCOL", "null"), "$", None)
    expect(c.cmd("RESET"), "+", b"RESET")
    expect(c.cmd("QUIT"), "+", b"OK")


def session_big(c):
    value = bytes(b"0123456789abcdef"[i % 16] for i in range(BIG))
    expect(c.cmd("SET", "golden:big", value), "+", b"OK")
    expect(c.cmd("GET", "golden:big"), "$", value)
    expect(c.cmd("STRLEN", "golden:big"), ":", str(BIG).encode())


# One redis-cli connection each (in one-shot mode redis-cli sends no COMMAND DOCS, whose
# 170 KiB reply would not fit the 64 KiB budget for golden files).
CLI_INVOCATIONS = [
    ["-3", "SET", "golden:cli", "hello world"],
    ["-3", "GET", "golden:cli"],
    ["LPUSH", "golden:cliq", "a", "b", "c"],
    ["-3", "LRANGE", "golden:cliq", "0", "-1"],
    ["-3", "HSET", "golden:clih", "f", "1"],
    ["-3", "HGETALL", "golden:clih"],
    ["HGETALL", "golden:clih"],
    ["-3", "INCRBYFLOAT", "golden:clif", "1.5"],
    ["-3", "GET", "golden:nope"],
]


def session_cli(port):
    for args in CLI_INVOCATIONS:
        subprocess.run(["redis-cli", "-p", str(port)] + args, check=True,
                       stdout=subprocess.DEVNULL)


def run_session(port, outdir, name, fn, conns=1):
    relay = Relay(port, os.path.join(outdir, name + "-client.bin"),
                  os.path.join(outdir, name + "-server.bin"), conns)
    fn(relay.port)
    relay.join()


def with_conn(fn, *extra):
    def go(port):
        c = Conn(port)
        try:
            fn(c, *extra)
        finally:
            c.close()
    return go


def cmd_inline(self, data):
    self.send(data)
    return self.read()


Conn.cmd_inline = cmd_inline


# --- describe: the message sequences test_resp.c expects, by an independent parser -------------


class Bytes:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def line(self):
        end = self.data.index(b"\r\n", self.pos)
        line, self.pos = self.data[self.pos:end], end + 2
        return line

    def read(self):
        """One value as (type, payload or items, attributed)."""
        line = self.line()
        t, rest = chr(line[0]), line[1:]
        if t in "+-:,(#_":
            return (t, None if t == "_" else rest)
        if t in "$=!":
            n = int(rest)
            if n < 0:
                return (t, None)
            data = self.data[self.pos:self.pos + n]
            self.pos += n + 2
            return (t, data)
        n = int(rest)
        if n < 0:
            return (t, None)
        items = [self.read() for _ in range(2 * n if t in "%|" else n)]
        if t == "|":
            inner = self.read()
            return inner + ("|",) if len(inner) == 2 else inner
        return (t, items)


def printable(b):
    return "".join(chr(c) if 32 <= c < 127 and c not in b'"\\' else "." for c in b[:24])


def describe_reply(v):
    t, payload = v[0], v[1]
    prefix = "|" if len(v) > 2 else ""
    if payload is None:
        return prefix + t + "null"
    if isinstance(payload, bytes):
        return prefix + t + printable(payload)
    n = len(payload) // 2 if t in "%|" else len(payload)
    out = "%s%s%d" % (prefix, t, n)
    if payload and isinstance(payload[0][1], bytes) and payload[0][0] in "$+":
        out += ":" + printable(payload[0][1])
    return out


def split_inline(line):
    """Redis' sdssplitargs(), enough for the recorded lines: the first word and the count."""
    words, i, n = [], 0, len(line)
    while True:
        while i < n and chr(line[i]).isspace():
            i += 1
        if i >= n:
            return words
        word, quote = b"", None
        while i < n:
            c = chr(line[i])
            if quote:
                if c == "\\" and i + 1 < n:
                    word += line[i + 1:i + 2]
                    i += 2
                    continue
                if c == quote:
                    quote = None
                else:
                    word += line[i:i + 1]
            elif c in " \t\r\n":
                break
            elif c in "\"'":
                quote = c
            else:
                word += line[i:i + 1]
            i += 1
        words.append(word)


def describe_commands(data):
    out, pos = [], 0
    while pos < len(data):
        if data[pos:pos + 1] == b"*":
            b = Bytes(data)
            b.pos = pos
            n = int(b.line()[1:])
            args = [b.read()[1] for _ in range(max(n, 0))]
            pos = b.pos
            out.append("%s/%d" % (args[0].upper().decode() if args else "", len(args)))
        else:
            end = data.index(b"\n", pos)
            words = split_inline(data[pos:end].rstrip(b"\r"))
            pos = end + 1
            out.append("i:%s/%d" % (words[0].upper().decode() if words else "", len(words)))
    return out


def describe_replies(data):
    b, out = Bytes(data), []
    while b.pos < len(data):
        out.append(describe_reply(b.read()))
    return out


def describe(outdir):
    for name in ("resp2", "resp3", "cli", "big"):
        for side, fn in (("client", describe_commands), ("server", describe_replies)):
            with open(os.path.join(outdir, "%s-%s.bin" % (name, side)), "rb") as f:
                items = fn(f.read())
            print("/* %s-%s.bin: %d messages */" % (name, side, len(items)))
            print(", ".join('"%s"' % d for d in items))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--describe":
        describe(sys.argv[2])
        return
    if len(sys.argv) != 2:
        sys.exit("usage: capture_resp.py OUTDIR | --describe OUTDIR")
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    base = tempfile.mkdtemp(prefix="twice-resp-rec-")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--daemonize", "no",
                             "--enable-debug-command", "yes", "--dir", base],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while True:
            try:
                other = Conn(port)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        expect(other.cmd("FLUSHALL"), "+", b"OK")
        run_session(port, outdir, "resp2", with_conn(session_resp2, other, free_port()))
        run_session(port, outdir, "resp3", with_conn(session_resp3, other))
        run_session(port, outdir, "big", with_conn(session_big))
        run_session(port, outdir, "cli", session_cli, len(CLI_INVOCATIONS))
        other.close()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)
    for name in ("resp2", "resp3", "big", "cli"):
        for side in ("client", "server"):
            f = "%s-%s.bin" % (name, side)
            print(f, os.path.getsize(os.path.join(outdir, f)))


if __name__ == "__main__":
    main()
