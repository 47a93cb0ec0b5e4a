"""Helpers for the hostile-peer and conservation tests (test_hostile.py,
test_conservation.py), on top of harness.py, faultkit.py and respkit.py.

- process gauges: twice's RSS and open descriptors, a background RSS sampler;
- listen blocks for `protocol amqp` / `protocol resp`;
- a raw AMQP 0-9-1 client (frames, the connection handshake) for sending
  exactly the bytes a hostile or broken peer would;
- "bystander" loads that run in threads while a test misbehaves next to them:
  a pika connection publishing and consuming, a redis-py client doing
  SET/GET; each counts its operations and records every error;
- brokers that can be killed (SIGKILL) and restarted on the same port: a
  redis-server on a fixed port, a RabbitMQ node with its node name, data
  directory and port;
- a bounded-concurrency storm of short connections.

Processes are started through harness (so its cleanup covers them).
"""

import os
import signal
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import respkit as rk  # noqa: E402


# ---------------------------------------------------------------------------
# twice's process

def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every `every` seconds until stopped; keeps the max."""

    def __init__(self, pid, every=0.1):
        super().__init__(daemon=True)
        self.pid = pid
        self.every = every
        self.max_kib = 0
        self.samples = 0
        self._ev = threading.Event()

    def run(self):
        while not self._ev.is_set():
            try:
                self.max_kib = max(self.max_kib, rss_kib(self.pid))
                self.samples += 1
            except (OSError, RuntimeError):
                pass
            self._ev.wait(self.every)

    def stop(self):
        self._ev.set()
        self.join(5)
        return self.max_kib


def wait_fds(pid, at_most, timeout=30):
    """Wait until the process has at most `at_most` descriptors; returns the count
    (raises TimeoutError with the last count)."""
    deadline = time.monotonic() + timeout
    while True:
        n = fd_count(pid)
        if n <= at_most:
            return n
        if time.monotonic() > deadline:
            raise TimeoutError("twice still has %d descriptors (want <= %d) after %ss" % (
                n, at_most, timeout))
        time.sleep(0.2)


# ---------------------------------------------------------------------------
# Configuration

def amqp_listen(name, port, upstream, extra=""):
    return h.listen_block(name, port, upstream, extra, protocol="amqp")


def resp_listen(name, port, upstream, profile=None, extra=""):
    return h.listen_block(name, port, upstream, extra, protocol="resp", profile=profile)


# ---------------------------------------------------------------------------
# Raw AMQP 0-9-1

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE


def shortstr(s):
    s = s if isinstance(s, bytes) else s.encode()
    return struct.pack("!B", len(s)) + s


def longstr(s):
    s = s if isinstance(s, bytes) else s.encode()
    return struct.pack("!I", len(s)) + s


EMPTY_TABLE = struct.pack("!I", 0)


def frame(ftype, channel, payload, end=FRAME_END, size=None):
    """One frame; `size` overrides the size field, `end` the frame-end octet."""
    n = len(payload) if size is None else size
    return struct.pack("!BHI", ftype, channel, n) + payload + bytes([end])


def method(channel, class_id, method_id, args=b"", **kw):
    return frame(FRAME_METHOD, channel, struct.pack("!HH", class_id, method_id) + args, **kw)


def start_ok(user="guest", password="guest"):
    return method(0, 10, 11, EMPTY_TABLE + shortstr("PLAIN") +
                  longstr(b"\x00" + user.encode() + b"\x00" + password.encode()) + shortstr("en_US"))


def tune_ok(channel_max, frame_max, heartbeat=0):
    return method(0, 10, 31, struct.pack("!HIH", channel_max, frame_max, heartbeat))


def connection_open(vhost="/"):
    return method(0, 10, 40, shortstr(vhost) + shortstr("") + b"\x00")


def channel_open(ch):
    return method(ch, 20, 10, shortstr(""))


class AmqpRaw:
    """A raw AMQP socket: send bytes, read whole frames."""

    def __init__(self, port, timeout=30):
        self.sock = h.connect(port, timeout=timeout)
        self.addr = h.client_addr(self.sock)
        self.buf = bytearray()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data):
        self.sock.sendall(data)

    def _need(self, n):
        while len(self.buf) < n:
            d = self.sock.recv(65536)
            if not d:
                raise EOFError("connection closed (%d bytes buffered)" % len(self.buf))
            self.buf += d

    def read_frame(self):
        """(type, channel, payload)."""
        self._need(7)
        t, ch, n = struct.unpack("!BHI", self.buf[:7])
        self._need(7 + n + 1)
        payload = bytes(self.buf[7:7 + n])
        end = self.buf[7 + n]
        del self.buf[:8 + n]
        if end != FRAME_END:
            raise ValueError("frame-end %#x from the peer" % end)
        return t, ch, payload

    def read_method(self):
        """(channel, class_id, method_id, args), skipping heartbeats."""
        while True:
            t, ch, p = self.read_frame()
            if t == FRAME_HEARTBEAT:
                continue
            if t != FRAME_METHOD:
                raise ValueError("expected a method frame, got type %d" % t)
            cid, mid = struct.unpack("!HH", p[:4])
            return ch, cid, mid, p[4:]

    def handshake(self, frame_max=None):
        """Header, start/start-ok, tune/tune-ok, open/open-ok, channel 1 open.
        Returns the negotiated frame_max."""
        self.send(AMQP_HEADER)
        _, c, m, _ = self.read_method()
        assert (c, m) == (10, 10), "expected connection.start, got %d.%d" % (c, m)
        self.send(start_ok())
        _, c, m, args = self.read_method()
        assert (c, m) == (10, 30), "expected connection.tune, got %d.%d" % (c, m)
        chmax, fmax, _hb = struct.unpack("!HIH", args[:8])
        if frame_max is not None:
            fmax = frame_max
        self.send(tune_ok(chmax, fmax, 0) + connection_open())
        _, c, m, _ = self.read_method()
        assert (c, m) == (10, 41), "expected connection.open-ok, got %d.%d" % (c, m)
        self.send(channel_open(1))
        _, c, m, _ = self.read_method()
        assert (c, m) == (20, 11), "expected channel.open-ok, got %d.%d" % (c, m)
        self.frame_max = fmax
        return fmax


# ---------------------------------------------------------------------------
# Bystanders

class Bystander(threading.Thread):
    """Runs `step()` in a loop until stopped; counts steps, keeps errors."""

    name_ = "bystander"

    def __init__(self):
        super().__init__(daemon=True, name=self.name_)
        self.ops = 0
        self.errors = []
        self._ev = threading.Event()
        self.ready = threading.Event()

    def setup(self):
        pass

    def step(self):
        raise NotImplementedError

    def teardown(self):
        pass

    def run(self):
        try:
            self.setup()
        except BaseException as e:  # noqa
            self.errors.append("setup: %r" % (e,))
            self.ready.set()
            return
        self.ready.set()
        try:
            while not self._ev.is_set():
                self.step()
                self.ops += 1
        except BaseException as e:  # noqa
            self.errors.append("after %d operations: %r" % (self.ops, e))
        finally:
            try:
                self.teardown()
            except BaseException as e:  # noqa
                self.errors.append("teardown: %r" % (e,))

    def wait_ops(self, n, timeout=30):
        """Wait until `n` more operations have been done (proof of life)."""
        start = self.ops
        h.wait_until(lambda: self.ops >= start + n or self.errors or not self.is_alive(), timeout,
                     what="%s to do %d more operations" % (self.name_, n))
        return self.ops - start

    def stop(self, timeout=30):
        self._ev.set()
        self.join(timeout)
        return self.errors


class PikaBystander(Bystander):
    """A pika connection through twice that publishes a message to its own
    queue and gets it back with basic.get + ack, over and over; every body
    must come back unchanged."""

    name_ = "pika-bystander"

    def __init__(self, port, queue):
        super().__init__()
        self.port, self.queue = port, queue

    def setup(self):
        import pika
        self.pika = pika
        self.conn = pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=self.port, connection_attempts=1, heartbeat=0,
            socket_timeout=15, stack_timeout=30, blocked_connection_timeout=60))
        self.ch = self.conn.channel()
        self.ch.queue_declare(self.queue)
        self.ch.queue_purge(self.queue)
        self.addr = h.client_addr(self.conn._impl._transport._sock)

    def step(self):
        body = b"bystander %d %s" % (self.ops, os.urandom(8).hex().encode())
        self.ch.basic_publish("", self.queue, body,
                              self.pika.BasicProperties(message_id="by-%d" % self.ops))
        deadline = time.monotonic() + 15
        while True:
            m, _p, got = self.ch.basic_get(self.queue, auto_ack=False)
            if m is not None:
                break
            if time.monotonic() > deadline:
                raise AssertionError("published message %d never came back" % self.ops)
            self.conn.sleep(0.01)
        if got != body:
            raise AssertionError("got %r back for %r" % (got, body))
        self.ch.basic_ack(m.delivery_tag)

    def teardown(self):
        if self.conn.is_open:
            self.conn.close()


class RedisBystander(Bystander):
    """A redis-py client through twice doing SET k v / GET k in a loop."""

    name_ = "redis-bystander"

    def __init__(self, port, key):
        super().__init__()
        self.port, self.key = port, key

    def setup(self):
        import redis
        self.r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=15,
                             socket_connect_timeout=10)
        self.r.ping()

    def step(self):
        v = b"%d-%s" % (self.ops, os.urandom(6).hex().encode())
        if self.r.set(self.key, v) is not True:
            raise AssertionError("SET did not answer OK")
        got = self.r.get(self.key)
        if got != v:
            raise AssertionError("GET %s answered %r, expected %r" % (self.key, got, v))

    def teardown(self):
        self.r.connection_pool.disconnect()   # Redis.close() leaves pooled sockets open


# ---------------------------------------------------------------------------
# Brokers that can be killed and restarted

class FixedRedis:
    """A redis-server on a port chosen once, so that it can be SIGKILLed and
    started again on the same port."""

    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "redis-fixed-%d" % len(os.listdir(tmp)))
        os.makedirs(self.dir)
        self.port = h.free_port()
        self.proc = None
        self.starts = 0
        h.at_exit(self.stop)

    def start(self, timeout=30):
        self.starts += 1
        log_path = os.path.join(self.dir, "redis-%d.log" % self.starts)
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--daemonize", "no", "--unixsocket", "",
                "--protected-mode", "yes", "--maxclients", "4000"]
        self.proc = h.spawn(argv, log_path=log_path, cwd=self.dir)
        p = self.proc

        def up():
            if p.poll() is not None:
                raise RuntimeError("redis-server exited with %s:\n%s" % (p.returncode, h._tail(log_path)))
            try:
                with rk.Conn(self.port, timeout=1) as c:
                    return c.cmd("PING") == b"PONG"
            except (OSError, EOFError):
                return False
        h.wait_until(up, timeout, what="redis PING on %d" % self.port)
        return self

    def kill9(self):
        h.kill_group(self.proc, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            h.kill_group(self.proc, signal.SIGKILL)
            try:
                self.proc.wait(10)
            except Exception:  # noqa
                pass


def kill9_rabbitmq(r):
    """SIGKILL the RabbitMQ node's whole process group (the rabbitmq-server
    script, beam.smp and its port programs)."""
    h.kill_group(r.proc, signal.SIGKILL)
    try:
        r.proc.wait(15)
    except Exception:  # noqa
        pass


def restart_rabbitmq(r, timeout=120):
    """Start the node `r` (a harness.RabbitMQ, killed) again: same node name,
    data directory, environment and AMQP port.  Waits for an AMQP handshake."""
    log_path = os.path.join(r.dir, "stdout-restart.log")
    p = h.spawn([os.path.join(h.RABBIT_BIN, "rabbitmq-server")], log_path=log_path, env=r.env,
                cwd=r.dir)
    r.proc = p
    r._stopped = False

    def up():
        if p.poll() is not None:
            raise RuntimeError("rabbitmq-server exited with %s:\n%s" % (p.returncode, h._tail(log_path)))
        return h.port_open(r.port) and h._amqp_handshake_ok(r.port)
    h.wait_until(up, timeout, interval=0.5, what="RabbitMQ back on port %d" % r.port)
    return r


# ---------------------------------------------------------------------------
# Storms of short connections

def storm(n, concurrency, one):
    """Run one(i) for i in range(n) on `concurrency` threads; returns
    (successes, [errors])."""
    lock = threading.Lock()
    state = {"next": 0, "ok": 0}
    errors = []

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= n:
                    return
                state["next"] = i + 1
            try:
                one(i)
                with lock:
                    state["ok"] += 1
            except Exception as e:  # noqa
                with lock:
                    errors.append((i, repr(e)))
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return state["ok"], errors


def resp_ping_once(port, timeout=30):
    """Connect, PING, read +PONG, close."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        got = b""
        while not got.endswith(b"\r\n"):
            d = s.recv(64)
            if not d:
                raise EOFError("closed after %r" % got)
            got += d
        if got != b"+PONG\r\n":
            raise AssertionError("PING answered %r" % got)
    finally:
        s.close()


def refused_once(port, timeout=30):
    """Connect and wait for twice to close the connection; True when it did."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.settimeout(timeout)
        try:
            d = s.recv(64)
        except (ConnectionResetError, ConnectionAbortedError):
            return True
        if d:
            raise AssertionError("a refused connection received %r" % d)
        return True
    finally:
        s.close()


# ---------------------------------------------------------------------------
# Logs

def session_of(t, client, timeout=30):
    """The `session closed` record of client "ip:port"."""
    return t.wait_sessions([client], timeout=timeout)[client]


def records_of_sid(t, msg, sid):
    return [r for r in t.log_records(msg) if r.get("sid") == str(sid)]


# ---------------------------------------------------------------------------
# Raw AMQP publish, Celery-on-Redis shapes

def basic_publish_frames(channel, routing_key, body, message_id, exchange=""):
    """basic.publish + content header (message-id property) + one body frame."""
    pub = method(channel, 60, 40, struct.pack("!H", 0) + shortstr(exchange) + shortstr(routing_key)
                 + b"\x00")
    props = shortstr(message_id)
    hdr = frame(FRAME_HEADER, channel, struct.pack("!HHQH", 60, 0, len(body), 1 << 7) + props)
    return pub + hdr + frame(FRAME_BODY, channel, body)


def kombu_message(task_id, queue="celery"):
    """A Celery/kombu message as kombu's Redis transport LPUSHes it; its
    delivery tag is "tag-<task_id>"."""
    import base64
    import json
    body = json.dumps([[2, 3], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                    "chord": None}]).encode()
    return json.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"lang": "py", "task": "tasks.add", "id": task_id, "retries": 0,
                    "root_id": task_id, "parent_id": None, "argsrepr": "(2, 3)",
                    "kwargsrepr": "{}", "origin": "gen1@it", "ignore_result": False},
        "properties": {"correlation_id": task_id, "reply_to": "reply", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue},
                       "priority": 0, "body_encoding": "base64",
                       "delivery_tag": "tag-" + task_id}}, sort_keys=True).encode()
