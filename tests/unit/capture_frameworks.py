#!/usr/bin/python3
"""capture_frameworks.py - record the golden framework sessions used by test_resp_profile.c.

The unit test only reads the committed files; CI never re-records.  To regenerate (needs
Debian's redis-server, ruby-sidekiq, python3-celery, python3-rq and python3-redis, no root):

    /usr/bin/python3 tests/unit/capture_frameworks.py tests/unit/data/frameworks [NAME...]

NAME is sidekiq, celery_redis, rq, streams, lists or bullmq (default: all six).  For each, this starts a
throw-away redis-server on 127.0.0.1 (a free port, a temporary directory, no persistence),
puts a TCP relay in front of it, and runs the framework's end-to-end app
(tests/e2e/NAME/driver.py: the framework's own client enqueues, its own worker runs the jobs)
with its broker at the relay: 2 jobs of each handler, 1 worker.  The relay writes each
connection, in the order it was accepted, to NAME/NN-client.bin and NAME/NN-server.bin.  The
driver's list of what it enqueued (`<message-id> <task>`, one job per line) goes to
NAME/enqueued.txt: that is what the unit test checks the profile's reading against, an oracle
independent of twice.  The driver's polling of the queue (--inspect) and the handlers' effect
keys go to Redis directly, unrecorded.

Message ids differ on every recording (Sidekiq's jid, Celery's uuid, RQ's uuid, stream ids):
the test reads them from enqueued.txt, never from its own source.
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

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(HERE, "..", "e2e")
FRAMEWORKS = ("sidekiq", "celery_redis", "rq", "streams", "lists", "bullmq")


class Relay:
    """Accepts clients until closed, connects each upstream, and writes each direction of
    connection N to DIR/NN-client.bin and DIR/NN-server.bin."""

    def __init__(self, upstream_port, outdir):
        self.upstream_port = upstream_port
        self.outdir = outdir
        self.n = 0
        self.threads = []
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()


    def _accept(self):
        while True:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.n += 1
            base = os.path.join(self.outdir, "%02d" % self.n)
            for src, dst, side in ((client, server, "client"), (server, client, "server")):
                path = "%s-%s.bin" % (base, side)
                open(path, "wb").close()
                t = threading.Thread(target=pump, args=(src, dst, path), daemon=True)
                t.start()
                self.threads.append(t)

    def close(self, timeout=20):
        self.lsock.close()
        deadline = time.time() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.time()))
        alive = [t for t in self.threads if t.is_alive()]
        if alive:
            raise RuntimeError("%d relay directions still open" % len(alive))


def start_redis(tmp):
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def capture(name, outdir):
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    tmp = tempfile.mkdtemp(prefix="twice-capture-")
    proc, port = start_redis(tmp)
    relay = Relay(port, d)
    try:
        files = {n: os.path.join(tmp, n + ".txt") for n in ("effects", "runs")}
        argv = ["/usr/bin/python3", os.path.join(E2E, name, "driver.py"),
                "--broker", "127.0.0.1:%d" % relay.port,
                "--inspect", "127.0.0.1:%d" % port,
                "--effect-redis", "127.0.0.1:%d" % port,
                "--effects", files["effects"], "--runs", files["runs"],
                "--enqueued", os.path.join(d, "enqueued.txt"),
                "--jobs", "2", "--workers", "1", "--quiet", "1", "--timeout", "60",
                "--log-dir", tmp]
        env = dict(os.environ, HOME=tmp)
        rc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, timeout=120).returncode
        if rc != 0:
            raise RuntimeError("%s driver exited %d (logs in %s)" % (name, rc, tmp))
        relay.close()
    finally:
        proc.terminate()
        proc.wait(10)
    sizes = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print("%s: %d connections, %d bytes" % (name, relay.n, sizes))
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    names = sys.argv[2:] or FRAMEWORKS
    for name in names:
        if name not in FRAMEWORKS:
            sys.exit("unknown framework %r (expected %s)" % (name, ", ".join(FRAMEWORKS)))
        capture(name, sys.argv[1])


if __name__ == "__main__":
    main()
