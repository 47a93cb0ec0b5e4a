"""Helpers for the fault-injection integration tests (test_stream_faults.py,
test_admin.py, test_journal_run.py), on top of harness.py.

Standard library only.  Nothing here starts a process by itself except
through harness (so cleanup stays harness's business).
"""

import http.client
import os
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import respkit as rk  # noqa: E402

TOKEN = "0123456789abcdef0123"


# ---------------------------------------------------------------------------
# Configuration text

def rule_block(name, listener, *lines):
    """`rule NAME on LISTENER { ... }` with one directive per line."""
    body = "".join("  %s\n" % l.strip() for l in lines)
    return "rule %s on %s {\n%s}\n" % (name, listener, body)


def conf_text(listeners, rules=(), seed=None, admin_port=None, token=None, journal=None,
              log_level="debug", grace="2s"):
    """A whole configuration file: globals, then listen blocks, then rules."""
    head = ""
    if seed is not None:
        head += "seed %d\n" % seed
    if journal is not None:
        head += "journal %s\n" % journal
    if admin_port is not None:
        head += "admin 127.0.0.1:%d\n" % admin_port
    if token is not None:
        head += "admin-token %s\n" % token
    return head + h.config(*listeners, log_level=log_level, grace=grace) + "".join(rules)


# ---------------------------------------------------------------------------
# RESP client (enough for PING / GET / SET)

def amqp_get_one(ch, queue, timeout=60):
    """The next message of queue by basic.get (ack required): (method, properties, body),
    waiting for it (pika's BlockingChannel ch) up to timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        m, props, body = ch.basic_get(queue, auto_ack=False)
        if m is not None:
            return m, props, body
        if time.monotonic() > deadline:
            raise AssertionError("no message on %s within %ss" % (queue, timeout))
        ch.connection.process_data_events(time_limit=0.05)


resp_cmd = rk.enc


class RespConn(rk.Conn):
    """respkit's RESP connection whose replies come back as plain bytes (respkit.plain:
    the simple-string payload, the bulk bytes, integers as text, or None)."""

    def read_reply(self):
        return rk.plain(self.read())

    def call(self, *args):
        self.send(rk.enc(*args))
        return self.read_reply()

    def timed(self, *args):
        """(reply, seconds) for one command."""
        t0 = time.monotonic()
        r = self.call(*args)
        return r, time.monotonic() - t0


def ping_rtt(port, timeout=30):
    """Open a new connection, PING once; returns (seconds, client "ip:port")."""
    with RespConn(port, timeout=timeout) as c:
        addr = h.client_addr(c.sock)
        r, dt = c.timed("PING")
        if r != b"PONG":
            raise AssertionError("PING through port %d answered %r" % (port, r))
        return dt, addr


def echo_rtt(port, payload=b"ping\n", timeout=30):
    """New connection to an echo upstream (through twice): send, read the echo;
    returns (seconds from connect to echo, client "ip:port")."""
    t0 = time.monotonic()
    s = h.connect(port, timeout=timeout)
    try:
        addr = h.client_addr(s)
        s.sendall(payload)
        got = h.recv_exact(s, len(payload))
        dt = time.monotonic() - t0
        if got != payload:
            raise AssertionError("echo returned %r for %r" % (got, payload))
        return dt, addr
    finally:
        s.close()


# ---------------------------------------------------------------------------
# Small upstream servers

class ReplyCloseServer(h.ThreadedServer):
    """Reads one chunk, answers `reply`, then closes its side (FIN) and waits
    for the client to go away."""

    def __init__(self, reply=b"bye\n", **kw):
        self.reply = reply
        super().__init__(name=kw.pop("name", "replyclose"), **kw)

    def handle(self, c):
        data = c.recv(65536)
        if not data:
            return
        c.sendall(self.reply)
        c.shutdown(socket.SHUT_WR)
        c.settimeout(30)
        try:
            while c.recv(65536):
                pass
        except OSError:
            pass


class RecordServer(h.ThreadedServer):
    """Records every byte each connection sends until EOF or error; sends
    nothing.  .received is a list of bytearrays (one per connection, in
    accept order), .ended the number of connections that ended."""

    def __init__(self, **kw):
        self.received = []
        self.ended = 0
        super().__init__(name=kw.pop("name", "record"), **kw)

    def handle(self, c):
        buf = bytearray()
        with self.lock:
            self.received.append(buf)
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                buf += data
        except OSError:
            pass
        finally:
            with self.lock:
                self.ended += 1


# ---------------------------------------------------------------------------
# Logs

def fault_records(t, **match):
    """Parsed `msg=fault` log lines of twice `t`, filtered by key=value."""
    return t.log_records("fault", **match)


def fault_sids(t, **match):
    return sorted(int(r["sid"]) for r in fault_records(t, **match))


def closed_records(t, **match):
    return t.log_records("session closed", **match)


def wait_closed_sids(t, sids, timeout=60):
    """Wait for the `session closed` line of every sid in sids; {sid: record}."""
    want = set(int(s) for s in sids)
    deadline = time.monotonic() + timeout
    while True:
        got = {int(r["sid"]): r for r in closed_records(t) if int(r.get("sid", 0)) in want}
        if len(got) == len(want):
            return got
        if time.monotonic() > deadline:
            raise AssertionError("no `session closed` for sids %s within %ss; log:\n%s" % (
                sorted(want - set(got)), timeout, t.log_tail()))
        time.sleep(0.05)


def sid_of(t, client, timeout=60):
    """The session id twice gave to the connection from client "ip:port"
    (from its `session opened` debug line or its `session closed` line).  The
    newest such session: ephemeral ports are reused, and a run that opened
    thousands of connections (redis-benchmark) has had this address before."""
    deadline = time.monotonic() + timeout
    while True:
        for rec in reversed(t.log_records()):
            if rec.get("client") == client and rec.get("msg") in ("session opened", "session closed"):
                return int(rec["sid"])
        if time.monotonic() > deadline:
            raise AssertionError("no session for client %s in the log:\n%s" % (client, t.log_tail()))
        time.sleep(0.05)


# ---------------------------------------------------------------------------
# Admin HTTP API

class Admin:
    def __init__(self, port, token=None):
        self.port = port
        self.token = token

    def request(self, method, path, body=None, token="default", headers=None, timeout=60):
        """(status, headers dict lower-cased, body text)."""
        tok = self.token if token == "default" else token
        hdrs = dict(headers or {})
        if tok is not None:
            hdrs["Authorization"] = "Bearer %s" % tok
        if body is not None and not isinstance(body, bytes):
            body = body.encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            data = r.read().decode("utf-8", errors="replace")
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=b"", **kw):
        return self.request("POST", path, body=body, **kw)

    def put(self, path, body, **kw):
        return self.request("PUT", path, body=body, **kw)

    def json(self, path):
        import json
        st, _, body = self.get(path)
        if st != 200:
            raise AssertionError("GET %s -> %s %r" % (path, st, body))
        return json.loads(body)

    def rule(self, name):
        for r in self.json("/rules")["rules"]:
            if r["name"] == name:
                return r
        return None


def wait_admin(port, timeout=60):
    h.wait_until(lambda: h.port_open(port), timeout, what="admin port %d" % port)


# ---------------------------------------------------------------------------
# Prometheus text format

_PROM_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*,?)?\})? '
    r'(-?[0-9.]+(?:[eE][+-]?[0-9]+)?|NaN|\+Inf|-Inf)( -?[0-9]+)?$')
_PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


def parse_prometheus(text):
    """Parse and validate Prometheus text format 0.0.4.  Returns
    (types {family: type}, samples [(name, {labels}, value)]); raises
    AssertionError on a malformed line, a sample before its family's TYPE,
    a family whose samples are not contiguous, or a repeated TYPE/HELP."""
    types, helps, samples = {}, set(), []
    finished = set()
    current = None
    if not text.endswith("\n"):
        raise AssertionError("exposition does not end with a newline")
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                fam = parts[2]
                if fam != current and current is not None:
                    finished.add(current)
                if fam in finished:
                    raise AssertionError("line %d: family %s is split: %r" % (n, fam, line))
                current = fam
                if parts[1] == "TYPE":
                    if fam in types:
                        raise AssertionError("line %d: second TYPE for %s" % (n, fam))
                    if any(s[0] == fam for s in samples):
                        raise AssertionError("line %d: TYPE for %s after its samples" % (n, fam))
                    if len(parts) != 4 or parts[3] not in ("counter", "gauge", "histogram",
                                                           "summary", "untyped"):
                        raise AssertionError("line %d: bad TYPE line %r" % (n, line))
                    types[fam] = parts[3]
                else:
                    if fam in helps:
                        raise AssertionError("line %d: second HELP for %s" % (n, fam))
                    helps.add(fam)
            continue
        if not line.strip():
            continue
        m = _PROM_SAMPLE.match(line)
        if not m:
            raise AssertionError("line %d is not a Prometheus sample: %r" % (n, line))
        name = m.group(1)
        fam = name
        if fam not in types:
            raise AssertionError("line %d: sample %s before any TYPE line of its family" % (n, name))
        if fam != current:
            if current is not None:
                finished.add(current)
            if fam in finished:
                raise AssertionError("line %d: samples of %s are not together" % (n, fam))
            current = fam
        labels = {}
        if m.group(2):
            for k, v in _PROM_LABEL.findall(m.group(2)):
                if k in labels:
                    raise AssertionError("line %d: label %s repeated" % (n, k))
                labels[k] = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)), v)
        samples.append((name, labels, float(m.group(3))))
    keys = [(nm, tuple(sorted(lb.items()))) for nm, lb, _ in samples]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise AssertionError("duplicate samples: %s" % sorted(dup)[:5])
    return types, samples


def prom_value(samples, name, **labels):
    for nm, lb, v in samples:
        if nm == name and all(lb.get(k) == str(x) for k, x in labels.items()):
            return v
    return None


# ---------------------------------------------------------------------------
# Journal: length-delimited protobuf, decoded by hand (no protobuf library)

def read_varint(buf, pos):
    """(value, new pos); raises ValueError when cut short or longer than 10 bytes."""
    v = 0
    shift = 0
    for i in range(10):
        if pos + i >= len(buf):
            raise EOFError("varint cut short at %d" % pos)
        b = buf[pos + i]
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, pos + i + 1
        shift += 7
    raise ValueError("varint longer than 10 bytes at %d" % pos)


def journal_frames(data):
    """Split a journal into its frames.  Returns (frames, truncated): a last
    frame cut short sets truncated instead of raising."""
    frames = []
    pos = 0
    while pos < len(data):
        try:
            n, p = read_varint(data, pos)
        except EOFError:
            return frames, True
        if n > 1024 * 1024:
            raise ValueError("frame at %d claims %d bytes (> 1 MiB)" % (pos, n))
        if p + n > len(data):
            return frames, True
        frames.append(bytes(data[p:p + n]))
        pos = p + n
    return frames, False


def pb_fields(msg):
    """Decode one protobuf message's wire format: {field: [values]}; varints
    as int, length-delimited as bytes, fixed as bytes.  Raises on bad wire."""
    out = {}
    pos = 0
    while pos < len(msg):
        key, pos = read_varint(msg, pos)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wt == 0:
            v, pos = read_varint(msg, pos)
        elif wt == 2:
            n, pos = read_varint(msg, pos)
            if pos + n > len(msg):
                raise ValueError("length-delimited field runs past the message")
            v = bytes(msg[pos:pos + n])
            pos += n
        elif wt == 1:
            v = bytes(msg[pos:pos + 8])
            pos += 8
        elif wt == 5:
            v = bytes(msg[pos:pos + 4])
            pos += 4
        else:
            raise ValueError("wire type %d" % wt)
        if pos > len(msg):
            raise ValueError("field runs past the message")
        out.setdefault(field, []).append(v)
    return out


HEADER_FIELDS = {1: "version", 2: "seed", 3: "config_sha256", 4: "start_unix_ms",
                 5: "twice_version", 6: "config_path", 7: "listeners", 8: "entry_crc32c"}
LISTENER_FIELDS = {1: "name", 2: "protocol", 3: "profile"}
RECORD_FIELDS = {1: "kind", 2: "time_unix_us", 3: "session", 4: "listener", 5: "queue", 6: "task",
                 7: "message_id", 8: "delivery_tag", 9: "redelivered", 10: "rule", 11: "action",
                 12: "action_name", 13: "event", 14: "client", 15: "close_reason",
                 16: "close_reason_name", 17: "bytes_up", 18: "bytes_down", 19: "detail",
                 20: "retries", 21: "retry", 22: "refused", 23: "started_unix_us", 24: "run",
                 25: "kept_back", 26: "auto_ack", 27: "change", 28: "change_source",
                 29: "rules_sha256", 30: "rules", 31: "rules_disabled", 32: "faults_off"}
KIND_NAMES = {1: "connect", 2: "close", 3: "deliver", 4: "ack", 5: "nack", 6: "publish",
              7: "confirm", 8: "fault", 9: "command", 10: "running", 11: "stop", 12: "expired",
              13: "rules"}
# RULES records: Record.Change and Record.ChangeSource (journal.proto)
CHANGE_NAMES = {1: "rule_enabled", 2: "rule_disabled", 3: "faults_off", 4: "faults_on",
                5: "rules_replaced", 6: "rule_replaced", 7: "rule_added", 8: "rule_deleted",
                9: "reloaded"}
CHANGE_SOURCES = {1: "admin_api", 2: "signal"}
_STRING_FIELDS = {"listener", "queue", "task", "message_id", "rule", "action_name", "client",
                  "close_reason_name", "detail", "twice_version", "config_path", "name",
                  "protocol", "profile", "run"}


def _named(fields, names):
    d = {}
    for num, vals in fields.items():
        name = names.get(num, "field%d" % num)
        v = vals[-1]
        if name in _STRING_FIELDS and isinstance(v, bytes):
            v = v.decode("utf-8")
        d[name] = v
    return d


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (0x82F63B78 ^ (c >> 1)) if c & 1 else c >> 1
        t.append(c)
    return t


_CRC32C = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli) of data, byte by byte: crc32c(b"123456789") == 0xE3069283."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def entry_checksum_ok(frame):
    """Whether an entry ends with its checksum (journal.proto, Entry.crc32c): the byte 0x7d,
    then the CRC-32C of the bytes before it, little-endian."""
    return (len(frame) >= 5 and frame[-5] == 0x7D
            and crc32c(frame[:-5]) == int.from_bytes(frame[-4:], "little"))


def decode_journal_runs(path):
    """Returns ([(header dict, [record dicts])], truncated): one pair per run of twice on the
    file (a journal of several runs: `journal PATH append`, each later run starting with its
    own header).  In a journal whose first header says entry_crc32c, every entry must end with
    its checksum."""
    with open(path, "rb") as f:
        data = f.read()
    frames, truncated = journal_frames(data)
    if not frames:
        raise ValueError("journal %s has no frame" % path)
    runs = []
    crc_on = False
    for i, fr in enumerate(frames):
        entry = pb_fields(fr)
        crc = entry.pop(15, None)
        if set(entry) - {1, 2} or sum(len(v) for v in entry.values()) != 1:
            raise ValueError("frame %d is not an Entry with exactly one body: fields %s" % (i, sorted(entry)))
        if 1 in entry:
            hf = pb_fields(entry[1][0])
            listeners = [_named(pb_fields(b), LISTENER_FIELDS) for b in hf.pop(7, [])]
            header = _named(hf, HEADER_FIELDS)
            header["listeners"] = listeners
            if i == 0:
                crc_on = bool(header.get("entry_crc32c"))
            runs.append((header, []))
        elif i == 0:
            raise ValueError("first frame is a record, not a header")
        else:
            runs[-1][1].append(_named(pb_fields(entry[2][0]), RECORD_FIELDS))
        if crc_on and (crc is None or not entry_checksum_ok(fr)):
            raise ValueError("frame %d fails its checksum" % i)
    return runs, truncated


def decode_journal(path):
    """Returns (header dict, [record dicts], truncated): the first run's header and the records
    of every run (decode_journal_runs() tells the runs apart)."""
    runs, truncated = decode_journal_runs(path)
    return runs[0][0], [r for _, recs in runs for r in recs], truncated


# ---------------------------------------------------------------------------
# misc

class Bg(threading.Thread):
    """Run fn in a thread; .result / .error after join()."""

    def __init__(self, fn, *args, **kw):
        super().__init__(daemon=True)
        self.fn, self.args, self.kw = fn, args, kw
        self.result = self.error = None

    def run(self):
        try:
            self.result = self.fn(*self.args, **self.kw)
        except BaseException as e:  # noqa
            self.error = e
