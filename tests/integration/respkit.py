"""Helpers for the RESP integration tests (test_resp_proxy.py), on top of
harness.py and faultkit.py.

- enc() / inline(): commands as exact bytes (multibulk or inline);
- Reader / Conn: a raw RESP2/RESP3 client that returns every reply both
  decoded and as the exact bytes the server (or twice) sent;
- resp_listen_block(): a `protocol resp` listen block (harness's listen_block
  writes `protocol tcp`);
- start_twice_rules(): start twice, and when it refuses `when command` rules
  because the RESP codec has not landed yet, start it without them and say
  so (the tests then fail on the fault that did not happen, not on setup);

Standard library only; redis-py is imported by the tests themselves.
Processes are started through harness, so its cleanup covers them.
"""

import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

CRLF = b"\r\n"


# ---------------------------------------------------------------------------
# Encoding

def _b(x):
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    return str(x).encode()


def enc(*args):
    """One command as a RESP multibulk."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = _b(a)
        parts.append(b"$%d\r\n" % len(a))
        parts.append(a)
        parts.append(CRLF)
    return b"".join(parts)


def inline(line):
    """An inline command: the line as written plus CRLF (unless it already ends in LF)."""
    line = _b(line)
    return line if line.endswith(b"\n") else line + CRLF


# ---------------------------------------------------------------------------
# Decoded values

class Status(bytes):
    """+simple string"""


class Err(bytes):
    """-error or !blob error"""

    @property
    def code(self):
        return bytes(self).split(b" ", 1)[0]


class Push(list):
    """RESP3 >push"""


class RSet(list):
    """RESP3 ~set (kept in wire order)"""


class RMap(list):
    """RESP3 %map as a list of (key, value) pairs in wire order."""

    def dict(self):
        return {k if not isinstance(k, list) else tuple(k): v for k, v in self}


class NullArray:
    """*-1 (RESP2 null array); RESP3 `_` and $-1 decode to None."""

    def __eq__(self, other):
        return isinstance(other, NullArray)

    def __hash__(self):
        return 0

    def __repr__(self):
        return "NullArray"


NULL_ARRAY = NullArray()


class Reader:
    """Parses replies from a socket.  read() returns (value, raw bytes of the
    whole reply, attributes included)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.pos = 0

    def pending(self):
        return len(self.buf) - self.pos

    def _fill(self, want=1):
        if want <= 65536:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed (%d bytes buffered)" % self.pending())
            self.buf += chunk
            return
        # a large bulk: receive straight into the buffer, no per-call allocation
        old = len(self.buf)
        self.buf.extend(bytes(want))
        view = memoryview(self.buf)
        got = 0
        try:
            while got < want:
                n = self.sock.recv_into(view[old + got:], want - got)
                if not n:
                    raise EOFError("connection closed (%d bytes buffered)" % (self.pending() - want + got))
                got += n
        finally:
            view.release()
            del self.buf[old + got:]

    def _line(self):
        while True:
            i = self.buf.find(CRLF, self.pos)
            if i >= 0:
                line = bytes(self.buf[self.pos:i])
                self.pos = i + 2
                return line
            self._fill()

    def _exact(self, n):
        while len(self.buf) - self.pos < n:
            self._fill(n - (len(self.buf) - self.pos))
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def _value(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return Status(rest)
        if t == b"-":
            return Err(rest)
        if t == b":" or t == b"(":
            return int(rest)
        if t in (b"$", b"=", b"!"):
            n = int(rest)
            if n < 0:
                return None
            data = self._exact(n + 2)
            if data[-2:] != CRLF:
                raise ValueError("bulk not followed by CRLF: %r" % data[-10:])
            data = data[:-2]
            return Err(data) if t == b"!" else data
        if t == b"*":
            n = int(rest)
            if n < 0:
                return NULL_ARRAY
            return [self._value() for _ in range(n)]
        if t == b">":
            return Push(self._value() for _ in range(int(rest)))
        if t == b"~":
            return RSet(self._value() for _ in range(int(rest)))
        if t == b"%":
            return RMap((self._value(), self._value()) for _ in range(int(rest)))
        if t == b"|":
            for _ in range(int(rest)):
                self._value()
                self._value()
            return self._value()
        if t == b"_":
            return None
        if t == b",":
            return float(rest)
        if t == b"#":
            if rest not in (b"t", b"f"):
                raise ValueError("bad boolean %r" % line)
            return rest == b"t"
        raise ValueError("unexpected RESP line %r" % line[:80])

    def read(self):
        if self.pos > (1 << 20) and self.pos > len(self.buf) // 2:
            del self.buf[:self.pos]
            self.pos = 0
        start = self.pos
        try:
            v = self._value()
        except BaseException:
            self.pos = start
            raise
        return v, bytes(self.buf[start:self.pos])


class Conn:
    """One raw RESP connection."""

    def __init__(self, port, timeout=30):
        self.sock = h.connect(port, timeout=timeout)
        self.addr = h.client_addr(self.sock)
        self.rd = Reader(self.sock)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def settimeout(self, t):
        self.sock.settimeout(t)

    def send(self, *chunks):
        self.sock.sendall(b"".join(chunks))

    def cmd(self, *args):
        self.send(enc(*args))
        return self.rd.read()[0]

    def raw(self, *args):
        self.send(enc(*args))
        return self.rd.read()[1]

    def read(self):
        return self.rd.read()[0]

    def read_raw(self):
        return self.rd.read()[1]

    def read_n(self, n):
        """n replies as a list of raw bytes."""
        return [self.rd.read()[1] for _ in range(n)]

    def read_n_values(self, n):
        return [self.rd.read() for _ in range(n)]

    def nothing_within(self, seconds):
        """True when no byte arrives within seconds (the connection stays open);
        raises AssertionError on data or EOF."""
        if self.rd.pending():
            raise AssertionError("bytes already buffered: %r" % bytes(self.rd.buf[self.rd.pos:][:200]))
        old = self.sock.gettimeout()
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return True
        finally:
            self.sock.settimeout(old)
        if not data:
            raise AssertionError("connection closed instead of staying silent")
        raise AssertionError("unexpected bytes %r" % data[:200])


def plain(value):
    """A decoded reply as plain bytes and lists: status, error and integer replies as their
    text (b"OK", b"ERR ...", b"5"), a null array as []; for callers that compare with bytes."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, (Status, Err)):
        return bytes(value)
    if isinstance(value, NullArray):
        return []
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def hello_shape(value):
    """The HELLO reply as {key: value} with the connection id masked."""
    if isinstance(value, RMap):
        d = dict((k, v) for k, v in value)
    else:
        it = iter(value)
        d = dict(zip(it, it))
    if b"id" in d:
        d[b"id"] = "<id>"
    return d


def mask_hello_id(raw):
    """raw bytes of a HELLO reply with the id integer replaced by :0."""
    return re.sub(rb"(\$2\r\nid\r\n):\d+\r\n", rb"\1:0\r\n", raw)


# ---------------------------------------------------------------------------
# twice configuration

def resp_listen_block(name, bind_port, upstream, profile=None, extra=""):
    return h.listen_block(name, bind_port, upstream, extra, protocol="resp", profile=profile)


NO_COMMAND_EVENT = "has no 'command' event"


def check_config(text, tmp, name="check.conf"):
    """(returncode, error lines) of `twice check` on text."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    r = h.run_twice(["check", "-c", path])
    errs = [l for l in (r.stdout + r.stderr).decode(errors="replace").splitlines() if ": error: " in l]
    return r.returncode, errs


def start_twice_rules(head, listeners, rules, tmp):
    """Start twice with head (globals) + listeners + rules.

    Returns (twice, note).  When `twice check` refuses the file only because
    the listeners have no `command` event (the RESP codec is not in the tree
    yet), the `when command` rules are left out, twice starts without them,
    and note says so (for failure messages); otherwise note is ""."""
    full = head + "".join(listeners) + "".join(rules)
    rc, errs = check_config(full, tmp)
    note = ""
    if rc != 0:
        if errs and all(NO_COMMAND_EVENT in e for e in errs):
            kept = [r for r in rules if not re.search(r"^\s*when\s+command\b", r, re.M)]
            note = ("[twice refused the `when command` rules (%s), so this run had none of them: "
                    "the RESP codec has not landed]" % errs[0].split(": error: ", 1)[1][:90])
            h.log("NOTE:", note)
            full = head + "".join(listeners) + "".join(kept)
        else:
            raise AssertionError("twice check refused the test configuration:\n%s\n---\n%s" % (
                "\n".join(errs), full))
    return h.start_twice(full, tmp), note


# `twice run` prints the configuration's warnings to stderr as diagnostics
# (FILE:LINE:COL: warning: ...), i.e. into the log, not as logfmt.  While
# `protocol resp` is relayed as tcp every such configuration has one.
TRANSITIONAL_WARNING = re.compile(r"^\S+:\d+:\d+: warning: protocol resp: the resp codec is not built yet")


def stop_twice(t):
    """SIGTERM twice and check it exits 0 with a logfmt log, tolerating only the
    transitional `resp codec is not built yet` diagnostics."""
    try:
        t.stop()
    except AssertionError:
        bad = t.malformed_log_lines()
        if t.proc.returncode != 0 or not bad or not all(TRANSITIONAL_WARNING.match(l) for l in bad):
            raise
        h.log("twice log: %d `resp codec is not built yet` diagnostics (not logfmt) tolerated" % len(bad))


def error_lines(t, start=0):
    return [l for l in t.log_lines()[start:] if " level=error " in l]


def assert_twice_healthy(test, t, start=0):
    """twice t still runs and logged no level=error line (from line start on)."""
    if t.proc.poll() is not None:
        test.fail("twice exited with %s; log:\n%s" % (t.proc.returncode, t.log_tail(60)))
    errs = error_lines(t, start)
    if errs:
        test.fail("twice logged %d level=error lines, e.g.:\n%s" % (len(errs), "\n".join(errs[:5])))


# ---------------------------------------------------------------------------
# Redis with extra arguments

def journal_faults(path, rule=None):
    """FAULT records of the journal at path (optionally of one rule)."""
    import faultkit as fk
    try:
        _, recs, _ = fk.decode_journal(path)
    except (OSError, ValueError, EOFError):
        return []
    return [r for r in recs if r.get("kind") == 8 and (rule is None or r.get("rule") == rule)]


def wait_journal_faults(path, rule, n, timeout=30, sessions=None):
    """Wait (the journal is flushed at least every second, later on a loaded
    machine or a sanitized build) for n FAULT records of rule (of those
    sessions, if given); returns what is there by then."""
    deadline = time.monotonic() + timeout
    while True:
        got = [r for r in journal_faults(path, rule) if sessions is None or r.get("session") in sessions]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.1)
