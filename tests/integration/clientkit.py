"""The broker side of an integration test in one place: a class-level real Redis and/or
RabbitMQ with twice in front of them, the listen blocks for every protocol, and the
clients a test talks through twice with.

- BrokerCase: a test class whose tests share a Redis (REDIS = True), a RabbitMQ node
  (RABBITMQ = True) and one twice (twice_config()); tearDownClass stops twice (exit 0, a
  logfmt log) and the brokers; a failed test gets twice's log lines written during it
  and the records its journal got, and both files are kept (collect_failure());
- listen(): a `listen` block of any protocol (amqp_listen, resp_listen for short);
- Redis clients: redis_py() (Debian's python3-redis, for a test that means "a real
  client"), and the raw RESP client (enc, Conn: exact bytes out, every reply decoded and
  raw, pipelines; respkit.py holds the codec); start_redis() with extra arguments;
- AMQP clients: pika_params() / pika_conn() / close_quietly() / get_one() (pika's
  BlockingConnection), and the raw frame client (AmqpRaw, frame, method...; hostilekit.py
  holds it) for a test that needs exact bytes.

Every wait here waits for an event (a reply, a log line, a message); a timeout only bounds a
wait that failed.  Processes are started through harness, so its cleanup covers them.
"""

import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import hostilekit as hk  # noqa: E402
import respkit as rk  # noqa: E402

# The raw clients, under the names tests use (one implementation each).
enc, inline, Conn, Reader, Status, Err = rk.enc, rk.inline, rk.Conn, rk.Reader, rk.Status, rk.Err
AmqpRaw, frame, method, shortstr, longstr = hk.AmqpRaw, hk.frame, hk.method, hk.shortstr, hk.longstr
AMQP_HEADER, FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = (
    hk.AMQP_HEADER, hk.FRAME_METHOD, hk.FRAME_HEADER, hk.FRAME_BODY, hk.FRAME_HEARTBEAT)

# How long a client waits for one reply before the test fails: generous, because the suite
# also runs on sanitizer builds of twice on a busy machine.
WAIT = 30


# ---------------------------------------------------------------------------
# Configuration

def listen(name, port, upstream, protocol="tcp", profile=None, extra=""):
    """One `listen` block (harness.listen_block); upstream is a port on 127.0.0.1 or
    "host:port"; extra holds more directives, one a line."""
    return h.listen_block(name, port, upstream, extra, protocol=protocol, profile=profile)


amqp_listen, resp_listen = hk.amqp_listen, hk.resp_listen


# ---------------------------------------------------------------------------
# Redis

def start_redis(tmp, *extra, password=None, timeout=30):
    """A redis-server on a free 127.0.0.1 port (harness.start_redis), with extra arguments
    (e.g. "--requirepass", "pw"; then pass password= for the readiness check)."""
    return h.start_redis(tmp, *extra, password=password,
                         maxclients=2000 if not extra and password is None else None,
                         timeout=timeout)


def redis_py(port, timeout=WAIT, **kw):
    """A redis-py client (python3-redis) of 127.0.0.1:port: the test means "a real client"."""
    import redis
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, **kw)


def read_until_eof(conn):
    """What a raw Conn still receives until the peer closes (a reset counts as a close)."""
    rest = bytes(conn.rd.buf[conn.rd.pos:])
    try:
        return rest + h.recv_all(conn.sock)
    except (ConnectionResetError, BrokenPipeError):
        return rest


def pipeline(conn, *commands):
    """Send every command (tuples of arguments) in one write on a raw Conn, then read their
    replies: [(value, raw bytes)] in order."""
    conn.send(*(enc(*c) for c in commands))
    return conn.read_n_values(len(commands))


# ---------------------------------------------------------------------------
# AMQP (pika)

_shared = {}


def shared_rabbitmq():
    """One RabbitMQ node for every class of the test process that sets RABBITMQ = "shared"
    (started on first need, stopped at exit): a file's classes need not wait for a node each."""
    if "rabbit" not in _shared:
        _shared["rabbit"] = h.start_rabbitmq(h.make_tmpdir("twice-it-rabbit-"))
    return _shared["rabbit"]


def pika_params(port, heartbeat=0, **kw):
    """pika parameters of 127.0.0.1:port: one connection attempt, bounded socket and
    handshake waits, heartbeats off unless asked for (a test waits for events, not beats)."""
    import pika
    kw.setdefault("connection_attempts", 1)
    kw.setdefault("socket_timeout", 15)
    kw.setdefault("stack_timeout", 30)
    kw.setdefault("blocked_connection_timeout", 60)
    return pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=heartbeat, **kw)


def pika_conn(port, heartbeat=0, **kw):
    """A pika BlockingConnection of 127.0.0.1:port (pika_params)."""
    import pika
    return pika.BlockingConnection(pika_params(port, heartbeat, **kw))


def close_quietly(conn):
    """Close a pika connection whose peer may be gone already."""
    try:
        if conn.is_open:
            conn.close()
    except Exception:  # noqa: BLE001 - closed under it (twice or the broker): nothing to do
        pass


def declare_queues(port, *queues, durable=False, purge=False):
    """queue_declare each queue on one short connection (and empty it with purge=True)."""
    c = pika_conn(port)
    try:
        ch = c.channel()
        for q in queues:
            ch.queue_declare(q, durable=durable)
            if purge:
                ch.queue_purge(q)
    finally:
        close_quietly(c)


def queue_counts(rabbit):
    """{queue: (ready, unacked)} as the RabbitMQ node says now (rabbitmqctl list_queues)."""
    r = rabbit.ctl("list_queues", "-q", "--no-table-headers", "name", "messages_ready",
                   "messages_unacknowledged")
    out = {}
    for line in r.stdout.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def get_one(ch, queue, timeout=60):
    """The next message of queue by basic.get (ack required): (method, properties, body)."""
    import faultkit as fk
    return fk.amqp_get_one(ch, queue, timeout)


# ---------------------------------------------------------------------------
# Evidence of a failed test

_JOURNAL_RE = re.compile(r"^\s*journal\s+(\S+)", re.M)


def journal_of(t):
    """The journal path twice t writes (from its configuration), or None."""
    m = _JOURNAL_RE.search(t.conf_text)
    if not m:
        return None
    p = m.group(1)
    return p if os.path.isabs(p) else os.path.join(os.path.dirname(t.conf_path), p)


def journal_summary(path, last=30):
    """The journal's record count and its last records, one a line, for a failure message."""
    import faultkit as fk
    try:
        _, recs, truncated = fk.decode_journal(path)
    except (OSError, ValueError, EOFError) as e:
        return "(journal %s not readable: %s)" % (path, e)
    out = ["journal %s: %d records%s" % (path, len(recs), ", last one cut short" if truncated else "")]
    for r in recs[-last:]:
        kind = fk.KIND_NAMES.get(r.get("kind"), r.get("kind"))
        out.append("  %s %s" % (kind, " ".join("%s=%s" % (k, v) for k, v in sorted(r.items())
                                              if k != "kind")))
    return "\n".join(out)


def collect_failure(test, twices, since=None):
    """Keep twice's log and journal of a failed test in a directory that outlives the run
    (named on stderr); print the journal's last records and, for each twice of `since`
    ({id(twice): line index}: a class's twice), its log lines written since then (harness
    prints the logs of the test's own twices)."""
    keep = tempfile.mkdtemp(prefix="twice-it-failed-%s-" % test._testMethodName)
    for i, t in enumerate(twices):
        if id(t) in (since or {}):
            sys.stderr.write("\n----- twice log %s since the test began (%s) -----\n%s\n" % (
                t.log_path, test.id(), "\n".join(t.log_lines()[since[id(t)]:][-200:])))
        for path in (t.log_path, t.conf_path, journal_of(t)):
            if path and os.path.exists(path):
                shutil.copy(path, os.path.join(keep, "%d-%s" % (i, os.path.basename(path))))
        j = journal_of(t)
        if j and os.path.exists(j):
            sys.stderr.write(journal_summary(j) + "\n")
    sys.stderr.write("----- kept in %s -----\n" % keep)


# ---------------------------------------------------------------------------
# The test class

class BrokerCase(h.TestCase):
    """Tests that share, for their class, a real Redis (REDIS = True; REDIS_ARGS for extra
    redis-server arguments), a real RabbitMQ node (RABBITMQ = True; "shared": the process's
    shared_rabbitmq(), left running for other classes) and one twice whose configuration
    twice_config() returns (None: no class twice).

    setUpClass gives cls.ctmp, cls.redis, cls.rabbit and cls.tw, then calls
    set_up_class() for what the class adds (queues, data).  tearDownClass stops twice with
    SIGTERM and asserts it exits 0 with a logfmt log (stop_twice() says otherwise), then
    the brokers.  Each test still gets self.tmp and self.twice() (harness.TestCase); when
    one fails, collect_failure() shows and keeps the class twice's log and journal."""

    REDIS = False
    REDIS_ARGS = ()
    REDIS_PASSWORD = None
    RABBITMQ = False
    TMP_PREFIX = "twice-it-class-"

    @classmethod
    def twice_config(cls):
        """The class twice's configuration text; cls.ctmp, cls.redis and cls.rabbit exist."""
        return None

    @classmethod
    def set_up_class(cls):
        """What the class needs once its brokers and twice are up."""

    @classmethod
    def stop_twice(cls, t):
        t.stop()

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ctmp = h.make_tmpdir(cls.TMP_PREFIX)
        cls.redis = cls.rabbit = cls.tw = None
        try:
            if cls.RABBITMQ == "shared":
                cls.rabbit = shared_rabbitmq()
            elif cls.RABBITMQ:
                cls.rabbit = h.start_rabbitmq(cls.ctmp)
            if cls.REDIS:
                cls.redis = start_redis(cls.ctmp, *cls.REDIS_ARGS, password=cls.REDIS_PASSWORD)
            text = cls.twice_config()
            if text is not None:
                cls.tw = h.start_twice(text, cls.ctmp)
            cls.set_up_class()
        except BaseException:
            cls._stop_class(check=False)
            raise

    @classmethod
    def tearDownClass(cls):
        cls._stop_class(check=True)
        super().tearDownClass()

    @classmethod
    def _stop_class(cls, check):
        try:
            if cls.tw is not None and check:
                cls.stop_twice(cls.tw)
        finally:
            if cls.tw is not None:
                cls.tw.kill()
            if cls.rabbit is not None and cls.RABBITMQ != "shared":
                cls.rabbit.stop()
            if cls.redis is not None:
                cls.redis.stop()

    def setUp(self):
        super().setUp()
        # the class's twice, even once a test names a twice of its own self.tw
        self.class_tw = type(self).tw
        self.class_mark = self.class_tw.log_mark() if self.class_tw is not None else 0
        self.addCleanup(self._collect_on_failure)

    def _collect_on_failure(self):
        if not self._failed():
            return
        twices = [self.class_tw] if self.class_tw is not None else []
        twices += [t for t in self._twices if t is not self.class_tw]
        if twices:
            collect_failure(self, twices, {id(self.class_tw): self.class_mark})

    def wait_log(self, regex, timeout=60, count=1):
        """Wait for `count` lines of the class twice's log, written since this test began,
        that match regex; returns them."""
        return self.class_tw.wait_for_log(regex, timeout=timeout, start=self.class_mark,
                                          count=count)
