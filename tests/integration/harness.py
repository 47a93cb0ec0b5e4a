"""Shared fixtures for the twice integration tests.

Everything here uses the Python 3 standard library only (plus python3-pika
in the AMQP test).  Every server listens on 127.0.0.1; every process started
here is put in its own process group, is registered for cleanup at exit and
dies with the test process (PR_SET_PDEATHSIG), so an interrupted run leaves
nothing behind but, possibly, an epmd started by RabbitMQ.

Environment:
  TWICE_BIN         the twice binary (default: build/twice under the repo)
  TWICE_SOURCE_DIR  the repository root
  TWICE_IT_KEEP=1   keep temporary directories (logs, configs) after the run
  TWICE_IT_VERBOSE=1  print twice's log after every test, not only failures
  TWICE_SANITIZED=1   twice is an ASan+UBSan build: RSS caps are scaled (rss_limit)
"""

import atexit
import ctypes
import hashlib
import os
import random
import re
import resource
import selectors
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("TWICE_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))


def _default_twice_bin():
    for cand in ("build/twice", "build-it/twice"):
        p = os.path.join(SOURCE_DIR, cand)
        if os.access(p, os.X_OK):
            return p
    return os.path.join(SOURCE_DIR, "build", "twice")


TWICE_BIN = os.environ.get("TWICE_BIN") or _default_twice_bin()
KEEP_TMP = os.environ.get("TWICE_IT_KEEP") == "1"
VERBOSE = os.environ.get("TWICE_IT_VERBOSE") == "1"
# Set by `make test` for its second run, on an ASan+UBSan build: memory caps
# asserted by the tests are scaled by rss_limit() (ASan's shadow memory and
# quarantine), nothing else changes.
SANITIZED = os.environ.get("TWICE_SANITIZED") == "1"


def rss_limit(kib):
    """An RSS cap in KiB, as the tests assert it for this build."""
    return kib * 6 if SANITIZED else kib

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB


def log(*args):
    """Progress output for humans; ctest shows it with --output-on-failure."""
    print("[it %s]" % time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Process-wide setup and cleanup

def raise_nofile_limit():
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


raise_nofile_limit()

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def _child_setup(nofile=None, fsize=None):
    # Runs in the child between fork and exec: kill the child if this test
    # process dies, even by SIGKILL (e.g. a ctest timeout).
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if nofile is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
    if fsize is not None:
        # A write past fsize bytes then fails with EFBIG instead of killing the
        # process with SIGXFSZ (an ignored signal stays ignored across exec).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


_live_procs = []          # subprocess.Popen objects we started (own process group each)
_live_lock = threading.Lock()
_cleanups = []            # callables to run at exit (reverse order)


def _register_proc(p):
    with _live_lock:
        _live_procs.append(p)


def kill_group(p, sig=signal.SIGKILL):
    """Send sig to the process group led by p (a Popen started with start_new_session)."""
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(p, timeout=10):
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def at_exit(fn):
    _cleanups.append(fn)
    return fn


@atexit.register
def _cleanup_everything():
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # pragma: no cover
            log("cleanup error:", e)
    with _live_lock:
        procs = list(_live_procs)
    for p in procs:
        if p.poll() is None:
            kill_group(p, signal.SIGKILL)
        else:
            # the leader is gone but stragglers in its group may remain
            kill_group(p, signal.SIGKILL)
    for p in procs:
        _reap(p, 5)


def _on_term(signum, frame):
    # ctest (or a user) asked us to stop: make atexit handlers run.
    raise SystemExit(128 + signum)


for _sig in (signal.SIGTERM, signal.SIGHUP):
    try:
        signal.signal(_sig, _on_term)
    except (ValueError, OSError):  # not the main thread
        pass


def spawn(argv, log_path=None, env=None, cwd=None, stdin=subprocess.DEVNULL, nofile=None,
          fsize=None):
    """Start argv in a new process group, output to log_path (or discarded).
    nofile=(soft, hard) sets the child's RLIMIT_NOFILE; fsize, in bytes, its
    RLIMIT_FSIZE (the largest file it may write)."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        p = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                             env=env, cwd=cwd, start_new_session=True,
                             preexec_fn=lambda: _child_setup(nofile, fsize))
    finally:
        if log_path:
            out.close()
    _register_proc(p)
    return p


# ---------------------------------------------------------------------------
# Ports and temporary directories

_used_ports = set()
_port_lock = threading.Lock()


def _local_port_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port():
    """A TCP port on 127.0.0.1 that nobody uses right now.

    Ports are drawn at random below the kernel's ephemeral range so that the
    thousands of outgoing connections some tests make cannot take a port
    between the moment it is chosen and the moment a server binds it; a port
    is never handed out twice by one process.  Falls back to bind(0)."""
    lo, _hi = _local_port_range()
    rng = random.SystemRandom()
    with _port_lock:
        if lo > 12000:
            for _ in range(200):
                port = rng.randrange(10000, lo - 1)
                if port in _used_ports:
                    continue
                if _bindable(port):
                    _used_ports.add(port)
                    return port
        for _ in range(50):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            if port not in _used_ports:
                _used_ports.add(port)
                return port
    raise RuntimeError("no free port")


def make_tmpdir(prefix="twice-it-"):
    """A fresh temporary directory, removed at exit unless TWICE_IT_KEEP=1."""
    d = tempfile.mkdtemp(prefix=prefix)
    if KEEP_TMP:
        log("keeping", d)
    else:
        at_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def wait_until(pred, timeout, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def eventually(pred, timeout, interval=0.05):
    """Like wait_until, but returns pred()'s last value instead of raising at
    the timeout: a wait for an event that the test then asserts itself, with
    its own message."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def port_open(port, host="127.0.0.1", timeout=0.5):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def client_addr(sock):
    """"IP:PORT" of our end of a connection, as twice logs it in client=."""
    return "%s:%d" % sock.getsockname()[:2]


def connect(port, host="127.0.0.1", timeout=30):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("EOF after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def recv_all(sock, limit=1 << 30):
    buf = bytearray()
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise AssertionError("more than %d bytes received" % limit)


def wait_closed(sock, timeout):
    """Wait until the peer closes sock (EOF or reset); returns the seconds it
    took, or raises TimeoutError.  Data received meanwhile is discarded."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("connection still open after %.1fs" % timeout)
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("connection still open after %.1fs" % timeout)
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            return time.monotonic() - t0
        except ssl.SSLError:
            return time.monotonic() - t0
        if not data:
            return time.monotonic() - t0


# ---------------------------------------------------------------------------
# logfmt

_LOGFMT_RE = re.compile(r'([A-Za-z0-9_.\-]+)=("(?:[^"\\]|\\.)*"|[^ ]*)')
_LOG_LINE_RE = re.compile(r'^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z level=(debug|info|warn|error) msg=("(?:[^"\\]|\\.)*"|[^ "]+)( |$)')


def parse_logfmt(line):
    out = {}
    for k, v in _LOGFMT_RE.findall(line):
        if v.startswith('"') and v.endswith('"') and len(v) >= 2:
            v = re.sub(r'\\(.)', lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), v[1:-1])
        out[k] = v
    return out


# ---------------------------------------------------------------------------
# Certificates

def _openssl(args, cwd):
    r = subprocess.run(["openssl"] + args, cwd=cwd, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("openssl %s failed:\n%s" % (" ".join(args), r.stdout.decode(errors="replace")))


class Certs:
    pass


def gen_certs(tmp):
    """Create, with the openssl CLI, in tmp/certs:
      ca.pem/ca.key            a test CA
      server.pem/server.key    CN=localhost, SAN DNS:localhost,IP:127.0.0.1, signed by the CA
      untrusted.pem/untrusted.key  a self-signed CN=localhost certificate nobody trusts
    Returns an object with those paths as attributes."""
    d = os.path.join(tmp, "certs")
    os.makedirs(d, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(["req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.pem", "-days", "3",
              "-subj", "/CN=twice integration test CA",
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign",
              "-addext", "subjectKeyIdentifier=hash"], d)
    _openssl(["req", "-new"] + ec + ["-keyout", "server.key", "-out", "server.csr",
              "-subj", "/CN=localhost"], d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                "subjectKeyIdentifier=hash\n"
                "authorityKeyIdentifier=keyid,issuer\n")
    _openssl(["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
              "-CAcreateserial", "-out", "server.pem", "-days", "3", "-extfile", "server.ext"], d)
    _openssl(["req", "-x509"] + ec + ["-keyout", "untrusted.key", "-out", "untrusted.pem",
              "-days", "3", "-subj", "/CN=localhost",
              "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
              "-addext", "basicConstraints=critical,CA:FALSE",
              "-addext", "extendedKeyUsage=serverAuth"], d)
    c = Certs()
    c.dir = d
    for name in ("ca", "server", "untrusted"):
        setattr(c, name + "_pem", os.path.join(d, name + ".pem"))
        setattr(c, name + "_key", os.path.join(d, name + ".key"))
    return c


def server_ssl_context(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def client_ssl_context(ca, check_hostname=True):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    ctx.check_hostname = check_hostname
    return ctx


# ---------------------------------------------------------------------------
# Upstream servers in threads

class ThreadedServer:
    """Accepts on 127.0.0.1:port in a thread, one handler thread per connection.

    tls: an ssl.SSLContext (server side) or None.  The TLS handshake runs in
    the connection's thread so a failing handshake doesn't stall accepts."""

    def __init__(self, tls=None, backlog=4096, name="server", host="127.0.0.1"):
        self.tls = tls
        self.host = host
        self.name = name
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.accepted = 0
        self.handshake_errors = 0
        self.errors = []
        self._conns = set()
        self._stop = False
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port = None
        for _ in range(20):
            port = free_port()
            try:
                self.sock.bind((host, port))
                self.port = port
                break
            except OSError:
                continue
        if self.port is None:
            raise RuntimeError("could not bind a port")
        self.sock.listen(backlog)
        self.thread = threading.Thread(target=self._accept_loop, name=name + "-accept", daemon=True)
        self.thread.start()
        at_exit(self.close)

    def _accept_loop(self):
        while not self._stop:
            try:
                c, addr = self.sock.accept()
            except OSError:
                if self._stop:
                    return
                time.sleep(0.01)
                continue
            with self.lock:
                self.accepted += 1
            threading.Thread(target=self._run, args=(c,), name=self.name + "-conn",
                             daemon=True).start()

    def _run(self, c):
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self._conns.add(c)
        try:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(120)
            if self.tls is not None:
                try:
                    c = self.tls.wrap_socket(c, server_side=True)
                    with self.lock:
                        self._conns.add(c)
                except (ssl.SSLError, OSError):
                    with self.lock:
                        self.handshake_errors += 1
                    return
            self.handle(c)
        except Exception as e:
            with self.lock:
                self.errors.append(repr(e))
        finally:
            try:
                c.close()
            except OSError:
                pass
            with self.lock:
                self.active -= 1
                self._conns.discard(c)

    def handle(self, c):  # pragma: no cover
        raise NotImplementedError

    def close(self):
        self._stop = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def stats(self):
        with self.lock:
            return dict(accepted=self.accepted, active=self.active, max_active=self.max_active,
                        handshake_errors=self.handshake_errors, errors=list(self.errors))


def _finish(c):
    """Close our side politely: TLS close_notify or TCP FIN, then wait (bounded)
    for the peer to close, so that no RST destroys data still in flight."""
    try:
        if isinstance(c, ssl.SSLSocket):
            c.settimeout(10)
            try:
                c.unwrap()
            except (ssl.SSLError, OSError, ValueError):
                pass
        else:
            c.shutdown(socket.SHUT_WR)
            c.settimeout(30)
            while c.recv(65536):
                pass
    except OSError:
        pass


class EchoServer(ThreadedServer):
    """Echoes every byte back until EOF, then closes its side.  If banner is
    given it is sent first on every connection (to tell servers apart)."""

    def __init__(self, tls=None, banner=b"", **kw):
        self.banner = banner
        super().__init__(tls=tls, name=kw.pop("name", "echo"), **kw)

    def handle(self, c):
        if self.banner:
            c.sendall(self.banner)
        while True:
            try:
                data = c.recv(65536)
            except (ssl.SSLError, ConnectionResetError):
                return
            if not data:
                break
            c.sendall(data)
        _finish(c)


# The "hash" protocol.  The client sends a 40-byte header
#
#   magic "TWH1" | flags u8 | 3 bytes zero | upload u64 | reply u64 | seed u64 | delay_ms u32 | 4 bytes zero
#
# (network byte order) followed by `upload` bytes of payload, or, when
# upload == UNTIL_EOF, by any number of bytes ended by a half-close.  The
# server answers with `reply` bytes of payload followed by a 72-byte trailer
#
#   sha256(received payload) | received byte count u64 | sha256(sent payload)
#
# and closes.  flags:
#   CONCURRENT: the reply payload is sent while the upload is being received
#               (full duplex); otherwise only after the whole upload arrived.
#   PATTERN:    the reply payload is a 1 MiB block derived from `seed`,
#               repeated (cheap for GiB-sized replies); otherwise it is fresh
#               random bytes.
# delay_ms: the server sleeps that long before it reads the upload (a slow
# reader upstream of twice).

HASH_MAGIC = b"TWH1"
HASH_HDR = struct.Struct("!4sB3xQQQI4x")
HASH_TRAILER = struct.Struct("!32sQ32s")
UNTIL_EOF = (1 << 64) - 1
FLAG_CONCURRENT = 1
FLAG_PATTERN = 2
PATTERN_BLOCK = MiB


def pattern_block(seed):
    return random.Random(seed).randbytes(PATTERN_BLOCK)


def pattern_sha256(seed, size):
    """sha256 of the first `size` bytes of the repeated pattern for `seed`."""
    block = pattern_block(seed)
    h = hashlib.sha256()
    full, rest = divmod(size, len(block))
    mv = memoryview(block)
    for _ in range(full):
        h.update(mv)
    h.update(mv[:rest])
    return h.digest()


def pattern_chunks(seed, size):
    block = memoryview(pattern_block(seed))
    left = size
    while left > 0:
        n = min(left, len(block))
        yield block[:n]
        left -= n


def random_chunks(size, chunk=256 * KiB):
    left = size
    while left > 0:
        n = min(left, chunk)
        yield os.urandom(n)
        left -= n


def pump(sock, chunks, want_in, on_recv, timeout, half_close=False, read_after=0.0, on_sent=None,
         max_total=900):
    """Full-duplex transfer on one socket (plain or TLS) from ONE thread.

    OpenSSL objects must not be used from two threads at once, so instead of a
    reader and a writer thread this drives a non-blocking socket: it sends
    every chunk of `chunks` (then shutdown(SHUT_WR) if half_close) while it
    receives `want_in` bytes (None: until EOF), calling on_recv(data) for each
    piece.  Reading starts at monotonic time `read_after`.  Raises
    TimeoutError when nothing moves for `timeout` seconds (not counting the
    wait for read_after) or after max_total seconds in all.  Returns
    (bytes sent, bytes received, EOF seen)."""
    is_tls = isinstance(sock, ssl.SSLSocket)
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    it = iter(chunks)
    pending = None
    sending = True
    sent = got = 0
    eof = False
    t_start = time.monotonic()
    last_progress = max(t_start, read_after)
    want_errors = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
    try:
        while True:
            if sending and pending is None:
                try:
                    pending = memoryview(next(it)).cast("B")
                    if len(pending) == 0:
                        pending = None
                        continue
                except StopIteration:
                    sending = False
                    if half_close:
                        sock.shutdown(socket.SHUT_WR)
            reading = not eof and (want_in is None or got < want_in)
            if not sending and not reading:
                break
            progressed = False
            if pending is not None:
                try:
                    n = sock.send(pending[:(16 * KiB if is_tls else 256 * KiB)])
                except want_errors:
                    n = 0
                if n:
                    progressed = True
                    sent += n
                    if on_sent:
                        on_sent(n)
                    pending = pending[n:] if n < len(pending) else None
            now = time.monotonic()
            can_read = reading and now >= read_after
            if can_read:
                while want_in is None or got < want_in:
                    try:
                        data = sock.recv(1 << 20 if want_in is None else min(1 << 20, want_in - got))
                    except want_errors:
                        break
                    if not data:
                        eof = True
                        break
                    progressed = True
                    got += len(data)
                    on_recv(data)
            if progressed:
                last_progress = max(now, last_progress)
            elif now - last_progress > timeout:
                raise TimeoutError("transfer stalled for %ss (sent %d, received %d so far)" % (timeout, sent, got))
            if now - t_start > max_total:
                raise TimeoutError("transfer took more than %ss (sent %d, received %d)" % (max_total, sent, got))
            if not progressed:
                ev = (selectors.EVENT_READ if can_read else 0) | (selectors.EVENT_WRITE if pending is not None else 0)
                wait = 0.1
                if reading and not can_read:
                    wait = max(0.0, min(wait, read_after - now))
                if ev:
                    sel.modify(sock, ev)
                    sel.select(wait)
                else:
                    time.sleep(wait)
    finally:
        sel.close()
    return sent, got, eof


class HashServer(ThreadedServer):
    def __init__(self, tls=None, **kw):
        self.progress = {}     # per connection: bytes sent / received so far
        self._next_id = 0
        super().__init__(tls=tls, name=kw.pop("name", "hash"), **kw)

    def _new_progress(self):
        with self.lock:
            self._next_id += 1
            p = {"sent": 0, "received": 0, "id": self._next_id, "done": False}
            self.progress[self._next_id] = p
            return p

    def handle(self, c):
        hdr = recv_exact(c, HASH_HDR.size)
        magic, flags, upload, reply, seed, delay_ms = HASH_HDR.unpack(hdr)
        if magic != HASH_MAGIC:
            raise ValueError("bad magic %r" % magic)
        prog = self._new_progress()
        sent_hash = hashlib.sha256()
        got_hash = hashlib.sha256()

        def reply_chunks():
            gen = pattern_chunks(seed, reply) if flags & FLAG_PATTERN else random_chunks(reply)
            for chunk in gen:
                sent_hash.update(chunk)
                yield chunk

        def on_recv(data):
            got_hash.update(data)
            prog["received"] += len(data)

        def on_sent(n):
            prog["sent"] += n

        want = None if upload == UNTIL_EOF else upload
        read_after = time.monotonic() + delay_ms / 1000.0
        if flags & FLAG_CONCURRENT:
            _, got, eof = pump(c, reply_chunks(), want, on_recv, 600, read_after=read_after,
                               on_sent=on_sent)
        else:
            _, got, eof = pump(c, (), want, on_recv, 600, read_after=read_after)
            pump(c, reply_chunks(), 0, on_recv, 600, on_sent=on_sent)
        if want is not None and got < want:
            raise EOFError("upload ended after %d of %d bytes" % (got, want))
        c.settimeout(60)
        c.sendall(HASH_TRAILER.pack(got_hash.digest(), got, sent_hash.digest()))
        prog["done"] = True
        _finish(c)


class HashResult:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        d = {k: (v.hex()[:16] if isinstance(v, bytes) else v) for k, v in self.__dict__.items()}
        return "HashResult(%r)" % d


def hash_exchange(sock, upload, reply, concurrent=True, pattern=False, seed=0, delay_ms=0,
                  half_close=False, timeout=30, upload_seed=None):
    """Run one hash-protocol exchange on a connected socket (plain or TLS).

    Uploads `upload` random bytes (length-prefixed, or ended by
    shutdown(SHUT_WR) when half_close=True) while reading the `reply`-byte
    answer and the trailer; `timeout` is how long nothing may move.
    Returns a HashResult.  With upload_seed the
    upload is the cheap repeated pattern for that seed instead of random.  Transport errors are
    recorded in .error instead of raised, so callers can assert on bytes."""
    flags = (FLAG_CONCURRENT if concurrent else 0) | (FLAG_PATTERN if pattern else 0)
    up_hash = hashlib.sha256()
    down_hash = hashlib.sha256()
    tail = bytearray()
    state = {"n": 0}

    def chunks():
        yield HASH_HDR.pack(HASH_MAGIC, flags, UNTIL_EOF if half_close else upload, reply, seed, delay_ms)
        gen = random_chunks(upload) if upload_seed is None else pattern_chunks(upload_seed, upload)
        for chunk in gen:
            up_hash.update(chunk)
            yield chunk

    def on_recv(data):
        n = state["n"]
        payload_part = max(0, min(len(data), reply - n))
        if payload_part:
            down_hash.update(memoryview(data)[:payload_part])
        if payload_part < len(data):
            tail.extend(memoryview(data)[payload_part:])
        state["n"] = n + len(data)

    error = None
    eof = False
    try:
        _, _, eof = pump(sock, chunks(), reply + HASH_TRAILER.size, on_recv, timeout,
                         half_close=half_close)
    except Exception as e:  # noqa
        error = e
    res = HashResult(upload=upload, reply=reply, sent_sha=up_hash.digest(),
                     received=min(state["n"], reply), received_sha=down_hash.digest(),
                     trailer=None, error=error, eof_early=eof)
    if len(tail) == HASH_TRAILER.size:
        srv_got_sha, srv_got_n, srv_sent_sha = HASH_TRAILER.unpack(bytes(tail))
        res.trailer = dict(server_received_sha=srv_got_sha, server_received=srv_got_n,
                           server_sent_sha=srv_sent_sha)
    return res


class BioTlsClient:
    """A blocking TLS client over ssl.MemoryBIO that can half-close: after
    close_write() (which sends close_notify) it can still read.  SSLSocket
    cannot do that (its unwrap() waits for the peer's close_notify)."""

    def __init__(self, sock, ctx, hostname):
        self.sock = sock
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inc, self.out, server_hostname=hostname)
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
        self._flush()

    def _flush(self):
        data = self.out.read()
        if data:
            self.sock.sendall(data)

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if data:
            self.inc.write(data)
        else:
            self.inc.write_eof()

    def sendall(self, data):
        mv = memoryview(data)
        for i in range(0, len(mv), 16 * KiB):
            self.obj.write(mv[i:i + 16 * KiB])
            self._flush()

    def close_write(self):
        try:
            self.obj.unwrap()
        except ssl.SSLWantReadError:
            pass
        self._flush()

    def recv(self, n):
        while True:
            try:
                return self.obj.read(n)
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
            except ssl.SSLZeroReturnError:
                return b""


def half_close_exchange(conn, upload, reply):
    """Hash exchange over a BioTlsClient (or any object with sendall /
    close_write / recv): send the upload, half-close, then read the reply
    (the server starts replying only after it saw EOF)."""
    up_hash, down_hash = hashlib.sha256(), hashlib.sha256()
    error = None
    n = 0
    tail = bytearray()
    try:
        conn.sendall(HASH_HDR.pack(HASH_MAGIC, 0, UNTIL_EOF, reply, 0, 0))
        for chunk in random_chunks(upload):
            up_hash.update(chunk)
            conn.sendall(chunk)
        conn.close_write()
        while True:
            data = conn.recv(1 << 16)
            if not data:
                break
            pay = max(0, min(len(data), reply - n))
            down_hash.update(data[:pay])
            tail += data[pay:]
            n += len(data)
    except Exception as e:  # noqa
        error = e
    res = HashResult(upload=upload, reply=reply, sent_sha=up_hash.digest(), received=min(n, reply),
                     received_sha=down_hash.digest(), trailer=None, error=error, eof_early=True)
    if len(tail) == HASH_TRAILER.size:
        a, cnt, b = HASH_TRAILER.unpack(bytes(tail))
        res.trailer = dict(server_received_sha=a, server_received=cnt, server_sent_sha=b)
    elif len(tail) > HASH_TRAILER.size:
        res.error = res.error or AssertionError("%d bytes after the trailer" % (len(tail) - HASH_TRAILER.size))
    return res


def exchange_problems(res):
    """A list of human-readable problems with a HashResult (empty if the
    exchange was byte-exact in both directions)."""
    p = []
    if res.error is not None:
        p.append("transport error: %r" % (res.error,))
    if res.received != res.reply:
        p.append("client received %d of %d reply bytes" % (res.received, res.reply))
    if res.trailer is None:
        p.append("no trailer from the server (connection ended early%s)" % (
            ", EOF" if res.eof_early else ""))
        return p
    t = res.trailer
    if t["server_received"] != res.upload:
        p.append("server received %d of %d uploaded bytes" % (t["server_received"], res.upload))
    if t["server_received_sha"] != res.sent_sha:
        p.append("upload corrupted: client sent sha256 %s, server got %s" % (
            res.sent_sha.hex(), t["server_received_sha"].hex()))
    if t["server_sent_sha"] != res.received_sha and res.received == res.reply:
        p.append("download corrupted: server sent sha256 %s, client got %s" % (
            t["server_sent_sha"].hex(), res.received_sha.hex()))
    return p


# ---------------------------------------------------------------------------
# Redis

class Redis:
    def __init__(self, proc, port, tmp, log_path):
        self.proc, self.port, self.tmp, self.log_path = proc, port, tmp, log_path

    def command(self, *args, timeout=10):
        """Send one command on a new connection; its reply as respkit.plain() gives it
        (status, error and integer replies as bytes: b"OK", b"5"; enough for PING / INFO /
        CONFIG)."""
        import respkit as rk  # it imports this module
        with rk.Conn(self.port, timeout=timeout) as c:
            return rk.plain(c.cmd(*args))

    def info(self, section):
        raw = self.command("INFO", section)
        out = {}
        for line in raw.decode().splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc)
        _reap(self.proc)


def start_redis(tmp, *extra, password=None, maxclients=2000, timeout=30):
    """A redis-server on a free 127.0.0.1 port with its own folder under tmp, no persistence,
    stopped at exit; `extra` arguments go to it (e.g. "--requirepass", "pw": then pass
    password= for the readiness check).  maxclients None leaves Redis's default.  Returns a
    Redis; call .stop() to stop it sooner."""
    import respkit as rk  # it imports this module
    d = os.path.join(tmp, "redis-%d" % len(os.listdir(tmp)))
    os.makedirs(d)
    port = free_port()
    log_path = os.path.join(d, "redis.log")
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", d, "--daemonize", "no", "--unixsocket", "",
            "--protected-mode", "yes"]
    if maxclients is not None:
        argv += ["--maxclients", str(maxclients)]
    p = spawn(argv + list(extra), log_path=log_path, cwd=d)
    r = Redis(p, port, d, log_path)
    at_exit(r.stop)

    def up():
        if p.poll() is not None:
            raise RuntimeError("redis-server exited with %s:\n%s" % (p.returncode, _tail(log_path)))
        try:
            with rk.Conn(port, timeout=1) as c:
                if password is not None and c.cmd("AUTH", password) != b"OK":
                    return False
                return c.cmd("PING") == b"PONG"
        except OSError:
            return False
    wait_until(up, timeout, what="redis PING")
    return r


def _tail(path, n=60):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except OSError as e:
        return "(no log: %s)" % e


# ---------------------------------------------------------------------------
# RabbitMQ

RABBIT_BIN = "/usr/lib/rabbitmq/bin"


def _epmd_running():
    try:
        r = subprocess.run(["epmd", "-names"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=10,
                           env=dict(os.environ, ERL_EPMD_ADDRESS="127.0.0.1"))
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _amqp_handshake_ok(port, timeout=2.0):
    """True if a full AMQP 0-9-1 connection (guest/guest) opens on port."""
    try:
        import pika
    except ImportError:  # pragma: no cover
        pika = None
    if pika is None:
        # Fall back to the protocol header: a broker answers with Connection.Start.
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                data = s.recv(7)
                return len(data) == 7 and data[0] == 1
        except OSError:
            return False
    try:
        params = pika.ConnectionParameters(host="127.0.0.1", port=port, connection_attempts=1,
                                           socket_timeout=timeout, blocked_connection_timeout=timeout,
                                           stack_timeout=timeout * 2)
        conn = pika.BlockingConnection(params)
        conn.close()
        return True
    except Exception:
        return False


class RabbitMQ:
    def __init__(self, **kw):
        self.__dict__.update(kw)
        self._stopped = False

    def ctl(self, *args, timeout=60):
        return subprocess.run([os.path.join(RABBIT_BIN, "rabbitmqctl"), "-n", self.nodename] + list(args),
                              env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, preexec_fn=_child_setup)

    def stop(self):
        if self._stopped:
            return
        self._stopped = True
        if self.proc.poll() is None:
            try:
                r = self.ctl("stop", timeout=60)
                if r.returncode != 0:
                    log("rabbitmqctl stop failed:", r.stdout.decode(errors="replace")[-2000:])
            except (subprocess.TimeoutExpired, OSError) as e:
                log("rabbitmqctl stop:", e)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                kill_group(self.proc, signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    pass
        kill_group(self.proc, signal.SIGKILL)
        _reap(self.proc)
        # epmd is started as a daemon by the first Erlang node; if it was not
        # running before we started, ask it to go away.  `epmd -kill` refuses
        # while any node is still registered, so it never disturbs others.
        if not self.epmd_was_running:
            subprocess.run(["epmd", "-kill"], env=self.env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)


def start_rabbitmq(tmp, timeout=120):
    """Start a private RabbitMQ node on free 127.0.0.1 ports; returns a
    RabbitMQ object with .port, .nodename, .stop().  Waits for a real AMQP
    handshake to succeed."""
    d = os.path.join(tmp, "rabbit-%d" % len(os.listdir(tmp)))
    home = os.path.join(d, "home")
    os.makedirs(home)
    os.makedirs(os.path.join(d, "mnesia"))
    os.makedirs(os.path.join(d, "log"))
    port = free_port()
    dist_port = free_port()
    nodename = "twiceit%s@localhost" % "".join(random.choice("abcdefghijklmnopqrstuvwxyz0123456789")
                                               for _ in range(10))
    with open(os.path.join(home, ".erlang.cookie"), "w") as f:
        f.write("".join(random.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(20)))
    os.chmod(os.path.join(home, ".erlang.cookie"), 0o400)
    conf = os.path.join(d, "rabbitmq.conf")
    with open(conf, "w") as f:
        f.write("listeners.tcp.1 = 127.0.0.1:%d\n"
                "log.console = false\n"
                "log.file.level = info\n"
                "disk_free_limit.absolute = 50MB\n"
                "collect_statistics_interval = 60000\n" % port)
    plugins = os.path.join(d, "enabled_plugins")
    with open(plugins, "w") as f:
        f.write("[].\n")
    env_conf = os.path.join(d, "rabbitmq-env.conf")
    open(env_conf, "w").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update({
        "HOME": home,
        "RABBITMQ_MNESIA_BASE": os.path.join(d, "mnesia"),
        "RABBITMQ_LOG_BASE": os.path.join(d, "log"),
        "RABBITMQ_NODENAME": nodename,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_CONFIG_FILE": conf,
        "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(d, "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
        "RABBITMQ_CONF_ENV_FILE": env_conf,
        "RABBITMQ_PID_FILE": os.path.join(d, "rabbit.pid"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_ALLOW_INPUT": "",
        "LC_ALL": "C.UTF-8",
    })
    epmd_was_running = _epmd_running()
    log_path = os.path.join(d, "stdout.log")
    p = spawn([os.path.join(RABBIT_BIN, "rabbitmq-server")], log_path=log_path, env=env, cwd=d)
    r = RabbitMQ(proc=p, port=port, dist_port=dist_port, nodename=nodename, env=env, dir=d,
                 log_path=log_path, epmd_was_running=epmd_was_running)
    at_exit(r.stop)
    t0 = time.monotonic()

    def up():
        if p.poll() is not None:
            raise RuntimeError("rabbitmq-server exited with %s:\n%s\n--- log dir ---\n%s" % (
                p.returncode, _tail(log_path), _rabbit_logs(d)))
        if not port_open(port):
            return False
        return _amqp_handshake_ok(port)
    try:
        wait_until(up, timeout, interval=0.5, what="RabbitMQ AMQP handshake on port %d" % port)
    except Exception:
        r.stop()
        raise
    log("rabbitmq %s up on 127.0.0.1:%d after %.1fs" % (nodename, port, time.monotonic() - t0))
    return r


def _rabbit_logs(d):
    out = []
    logdir = os.path.join(d, "log")
    for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
        out.append("== %s\n%s" % (name, _tail(os.path.join(logdir, name), 40)))
    return "\n".join(out)


# ---------------------------------------------------------------------------
# twice

class Twice:
    def __init__(self, proc, conf_path, log_path, conf_text):
        self.proc = proc
        self.conf_path = conf_path
        self.log_path = log_path
        self.conf_text = conf_text
        self.exit_checked = False

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_lines(self):
        """Whole lines only: twice writes each line with one write(), but a
        reader may see a write that crosses a page boundary half done (the
        file's size grows page by page), so a last line without its newline
        is left for the next read."""
        text = self.log_text()
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines.pop()
        return lines

    def log_records(self, msg=None, **match):
        """Parsed logfmt records, optionally filtered by msg and key=value."""
        out = []
        for line in self.log_lines():
            rec = parse_logfmt(line)
            if msg is not None and rec.get("msg") != msg:
                continue
            if all(rec.get(k) == str(v) for k, v in match.items()):
                out.append(rec)
        return out

    # The waits below return as soon as what they wait for is there: their
    # default timeouts are generous because the suite also runs on an
    # ASan+UBSan and a ThreadSanitizer build of twice, on a busy 2-core
    # machine, where twice is several times slower.
    def wait_for_log(self, regex, timeout=60, start=0, count=1):
        """Wait until `count` lines (from line index `start` on) match regex;
        returns the matching lines.  Raises AssertionError with the log tail."""
        rx = re.compile(regex)
        deadline = time.monotonic() + timeout
        while True:
            lines = self.log_lines()[start:]
            hits = [l for l in lines if rx.search(l)]
            if len(hits) >= count:
                return hits
            if self.proc.poll() is not None and time.monotonic() > deadline - timeout + 0.5:
                # exited: one last look, then give up
                lines = self.log_lines()[start:]
                hits = [l for l in lines if rx.search(l)]
                if len(hits) >= count:
                    return hits
                raise AssertionError("twice exited (rc=%s) before logging /%s/ x%d; log:\n%s" % (
                    self.proc.returncode, regex, count, self.log_tail()))
            if time.monotonic() >= deadline:
                raise AssertionError("no log line /%s/ (x%d, got %d) within %.0fs; log:\n%s" % (
                    regex, count, len(hits), timeout, self.log_tail()))
            time.sleep(0.05)

    def event_count(self, msg, since=0, **match):
        """How many events the log's `msg` lines (from line index `since` on,
        filtered by key=value) stand for: twice writes a line that repeats
        faster than its limit once with `repeated=N` for N of them."""
        n = 0
        for line in self.log_lines()[since:]:
            rec = parse_logfmt(line)
            if rec.get("msg") == msg and all(rec.get(k) == str(v) for k, v in match.items()):
                n += int(rec.get("repeated", 1))
        return n

    def wait_for_records(self, msg, timeout=60, count=1, **match):
        deadline = time.monotonic() + timeout
        while True:
            recs = self.log_records(msg, **match)
            if len(recs) >= count:
                return recs
            if time.monotonic() >= deadline:
                raise AssertionError("expected %d log records msg=%r %r, got %d within %.0fs; log:\n%s"
                                     % (count, msg, match, len(recs), timeout, self.log_tail()))
            time.sleep(0.05)

    def log_mark(self):
        """The log's line count now, for wait_sessions(since=...)."""
        return len(self.log_lines())

    def wait_sessions(self, clients, timeout=60, since=0):
        """Wait for the "session closed" record of each client address
        ("IP:PORT" strings); returns {client: record}.

        A client's port can be handed out again once its session is over, so
        an address may have an older session's record in the log: only lines
        from index `since` (a log_mark() taken before the connections were
        made) count."""
        want = set(clients)
        deadline = time.monotonic() + timeout
        while True:
            found = {}
            for line in self.log_lines()[since:]:
                rec = parse_logfmt(line)
                if rec.get("msg") != "session closed" or rec.get("client") not in want:
                    continue
                found[rec["client"]] = rec
            if len(found) == len(want):
                return found
            if time.monotonic() >= deadline:
                raise AssertionError("no \"session closed\" line within %.0fs for clients %s; log:\n%s" % (
                    timeout, sorted(want - set(found))[:10], self.log_tail()))
            time.sleep(0.05)

    def log_tail(self, n=80):
        lines = self.log_lines()
        return "\n".join(lines[-n:])

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS for pid %d" % self.proc.pid)

    def fd_count(self):
        """Descriptors twice has open now."""
        return len(os.listdir("/proc/%d/fd" % self.proc.pid))

    def cpu_seconds(self):
        """CPU time twice has used so far (user + system, all threads)."""
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def signal(self, sig):
        self.proc.send_signal(sig)

    def write_config(self, text):
        tmp = self.conf_path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.conf_path)
        self.conf_text = text

    def stop(self, timeout=30, expect_rc=0):
        """SIGTERM, wait, and assert the exit code (0 by default)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            _reap(self.proc)
            self.exit_checked = True
            raise AssertionError("twice did not exit within %ss of SIGTERM; log:\n%s" % (
                timeout, self.log_tail()))
        kill_group(self.proc)
        self.exit_checked = True
        if expect_rc is not None and rc != expect_rc:
            raise AssertionError("twice exited with %s (expected %s); log:\n%s" % (
                rc, expect_rc, self.log_tail()))
        bad = self.malformed_log_lines()
        if bad:
            raise AssertionError("%d log lines are not logfmt `ts=... level=... msg=...`, e.g.:\n%s" % (
                len(bad), "\n".join(bad[:5])))
        return rc

    def malformed_log_lines(self):
        """Lines of the log that are not `ts=<ISO-8601 UTC> level=<lvl> msg=<...>` logfmt."""
        bad = []
        for line in self.log_lines():
            if not _LOG_LINE_RE.match(line) or _LOGFMT_RE.sub("", line).strip():
                bad.append(line)
        return bad

    def kill(self):
        if self.proc.poll() is None:
            kill_group(self.proc)
        _reap(self.proc)


_twice_seq = [0]


def listener_names(conf_text):
    return re.findall(r"^\s*listen\s+([A-Za-z0-9_.\-]+)\s*\{", conf_text, re.M)


def start_twice(config_text, tmp, wait=True, timeout=60, args=None, nofile=None, file_args=None,
                fsize=None):
    """Write config_text to a file in tmp and run `twice run -c FILE`
    (file_args(FILE) gives other arguments that name it, e.g. ["run", FILE]).

    With wait=True, returns once every listener in the file has logged
    msg=listening."""
    if not os.access(TWICE_BIN, os.X_OK):
        raise AssertionError("twice binary not found or not executable: %s (set TWICE_BIN)" % TWICE_BIN)
    _twice_seq[0] += 1
    n = _twice_seq[0]
    conf_path = os.path.join(tmp, "twice-%d.conf" % n)
    log_path = os.path.join(tmp, "twice-%d.log" % n)
    with open(conf_path, "w") as f:
        f.write(config_text)
    argv = [TWICE_BIN] + (file_args or (lambda p: ["run", "-c", p]))(conf_path) + list(args or [])
    p = spawn(argv, log_path=log_path, cwd=tmp, nofile=nofile, fsize=fsize)
    t = Twice(p, conf_path, log_path, config_text)
    at_exit(t.kill)
    if wait:
        for name in listener_names(config_text):
            # The contract: this line is logged once the listener accepts.
            # (No probe connection: it would be a session of its own and
            # could count against max-connections or show up in the log.)
            t.wait_for_log(r"level=info msg=listening listener=%s\b" % re.escape(name), timeout=timeout)
    return t


def run_twice(args, timeout=30):
    """Run a short twice command (check, --version); returns CompletedProcess."""
    if not os.access(TWICE_BIN, os.X_OK):
        raise AssertionError("twice binary not found or not executable: %s (set TWICE_BIN)" % TWICE_BIN)
    return subprocess.run([TWICE_BIN] + list(args), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          preexec_fn=_child_setup)


def verdict_text_rows(table, task):
    """The lines of `twice verdict`'s text table that are TASK's row, and its SEEN THROUGH line
    ("TASK  INSTANCES; LISTENERS") under the table: (rows, seen); seen is None without one."""
    lines = table.splitlines()
    cut = next((i for i, l in enumerate(lines) if l.startswith("SEEN THROUGH")), len(lines))
    rows = [l for l in lines[:cut] if l.split()[:1] == [task]]
    seen = [l for l in lines[cut + 1:] if l.split()[:1] == [task]]
    return rows, (seen[0] if seen else None)


def listen_block(name, bind_port, upstream, extra="", protocol="tcp", profile=None):
    """One `listen` block; upstream is a port (on 127.0.0.1) or "host:port"; extra holds
    more directives, one a line."""
    if isinstance(upstream, int):
        upstream = "127.0.0.1:%d" % upstream
    body = "  protocol %s\n" % protocol
    if profile:
        body += "  profile %s\n" % profile
    body += "  bind 127.0.0.1:%d\n  upstream %s\n" % (bind_port, upstream)
    for line in extra.strip().splitlines():
        body += "  %s\n" % line.strip()
    return "listen %s {\n%s}\n" % (name, body)


def config(*blocks, log_level="debug", connect_timeout="2s", grace="2s"):
    head = "log-level %s\nconnect-timeout %s\nshutdown-grace %s\n" % (log_level, connect_timeout, grace)
    return head + "".join(blocks)


# ---------------------------------------------------------------------------
# unittest glue

class TestCase(unittest.TestCase):
    """Gives each test a temp dir (self.tmp), tracks twice processes started
    with self.twice(), and prints their logs when the test fails."""

    def setUp(self):
        self.tmp = make_tmpdir("twice-it-%s-" % self._testMethodName)
        self._twices = []
        t0 = time.monotonic()
        self.addCleanup(lambda: log("%s took %.1fs" % (self._testMethodName, time.monotonic() - t0)))
        self.addCleanup(self._cleanup_twices)

    def twice(self, config_text, **kw):
        t = start_twice(config_text, self.tmp, **kw)
        self._twices.append(t)
        return t

    def _failed(self):
        outcome = getattr(self, "_outcome", None)
        if outcome is None:
            return False
        result = getattr(outcome, "result", None)
        if result is not None:
            for test, _ in list(result.errors) + list(result.failures):
                if test is self:
                    return True
        return not getattr(outcome, "success", True)

    def _cleanup_twices(self):
        failed = self._failed()
        for t in self._twices:
            t.kill()
            if failed or VERBOSE:
                sys.stderr.write("\n----- twice log %s (%s) -----\n%s\n----- end -----\n" % (
                    t.log_path, self.id(), t.log_tail(200)))
