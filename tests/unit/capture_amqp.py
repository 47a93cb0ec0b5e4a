#!/usr/bin/python3
"""capture_amqp.py - record the golden AMQP 0-9-1 byte streams used by test_amqp.c.

The unit test only reads the committed files; CI never re-records.  To regenerate
(needs Debian's rabbitmq-server 3.10 and python3-pika, no systemd, no root):

    /usr/bin/python3 tests/unit/capture_amqp.py tests/unit/data/amqp

This starts a throw-away RabbitMQ node on 127.0.0.1 in a temporary directory, puts a
TCP relay in front of it that copies each direction into a file (client.bin = bytes
the client sent, server.bin = bytes the broker sent), runs one pika session through
the relay, then stops the node and checks that no beam.smp of ours is left.

The session, in order (test_amqp.c asserts this exact sequence, so re-recording
means updating the expected lists there):
  connection (frame_max=4096, heartbeat=60), channel 1 open, confirm.select,
  queue.declare, 3 publishes with Celery-style headers {"id", "task", ...} and
  message_id/correlation_id (message 1 has a 10000-byte body: 3 body frames at
  frame_max 4096), basic.qos(prefetch_count=10), basic.consume, 3 deliveries,
  ack(1), nack(2, requeue), reject(3, no requeue), redelivery of message 2 as tag 4
  with redelivered=1, ack(4, multiple), basic.cancel, publish a 4th message,
  basic.get (get-ok, tag 5), ack(5), basic.get (get-empty), channel 2 open,
  tx.select, publish, tx.commit, publish, tx.rollback, channel 2 close,
  channel 1 close, connection close.
"""

import datetime
import decimal
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

import pika

TASK = "tasks.charge"
BIG_BODY = 10000
FRAME_MAX = 4096


class Relay:
    """Accepts one client, connects upstream, and copies each direction to a file."""

    def __init__(self, upstream_port, client_path, server_path):
        self.upstream_port = upstream_port
        self.paths = (client_path, server_path)
        for path in self.paths:
            open(path, "wb").close()
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.port = self.lsock.getsockname()[1]
        self.threads = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        client, _ = self.lsock.accept()
        server = socket.create_connection(("127.0.0.1", self.upstream_port))
        for src, dst, path in ((client, server, self.paths[0]), (server, client, self.paths[1])):
            t = threading.Thread(target=pump, args=(src, dst, path), daemon=True)
            t.start()
            self.threads.append(t)

    def join(self, timeout=10):
        deadline = time.time() + timeout
        while len(self.threads) < 2 and time.time() < deadline:
            time.sleep(0.05)
        for t in self.threads:
            t.join(max(0.1, deadline - time.time()))


def start_rabbit(base):
    name = "rec%d@localhost" % os.getpid()
    port, dist = free_port(), free_port()
    with open(os.path.join(base, "enabled_plugins"), "w") as f:
        f.write("[].\n")
    env = dict(os.environ)
    env.update({
        "RABBITMQ_MNESIA_BASE": os.path.join(base, "mnesia"),
        "RABBITMQ_LOG_BASE": os.path.join(base, "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(base, "enabled_plugins"),
        "RABBITMQ_NODENAME": name,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "HOME": base,
    })
    proc = subprocess.Popen(["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    # await_startup fails at once while the node is not yet registered with epmd: poll.
    deadline = time.time() + 120
    while True:
        r = subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", name, "await_startup",
                            "--timeout", "60"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return proc, env, name, port
        if proc.poll() is not None or time.time() > deadline:
            stop_rabbit(proc, env, name)
            sys.exit("rabbitmq-server did not start (logs in %s)" % base)
        time.sleep(1)


def stop_rabbit(proc, env, name):
    subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", name, "stop"], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(10)
    # epmd was started by this node's process group with our HOME; stop what is left of it.
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:
        pass


def props(n, **extra):
    task_id = "c0ffee00-0000-4000-8000-00000000000%d" % n
    headers = {
        "lang": "py",
        "task": TASK,
        "id": task_id,
        "retries": n - 1,
        "timelimit": [None, None],
        "argsrepr": "(%d,)" % n,
        "eta": None,
        "big": 1 << 40,
        "ok": True,
        "raw": b"\x00\x01",
        "price": decimal.Decimal("12.34"),
        "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "stamps": {"origin": "gen1@host", "depth": {"level": 2}},
    }
    return pika.BasicProperties(content_type="application/json", content_encoding="utf-8",
                                headers=headers, delivery_mode=2, correlation_id=task_id,
                                message_id="msg-%d" % n, **extra)


def body(n, size=None):
    text = '[[%d], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]' % n
    if size is not None:
        text = (text + " " * size)[:size]
    return text.encode()


def session(port):
    params = pika.ConnectionParameters(host="127.0.0.1", port=port, frame_max=FRAME_MAX,
                                       heartbeat=60, connection_attempts=1)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(queue="twice.golden", durable=False, auto_delete=False).method.queue
    ch.basic_publish("", q, body(1, BIG_BODY), props(1, priority=3, app_id="twice-rec"))
    ch.basic_publish("", q, body(2), props(2, reply_to="replies", type="task",
                                           timestamp=1700000000, user_id="guest"))
    ch.basic_publish("", q, body(3), props(3, expiration="600000"))
    ch.basic_qos(prefetch_count=10)
    got = []

    def on_msg(chan, method, properties, payload):
        got.append(method)
        if len(got) == 3:
            chan.basic_ack(got[0].delivery_tag)
            chan.basic_nack(got[1].delivery_tag, requeue=True)
            chan.basic_reject(got[2].delivery_tag, requeue=False)
        elif len(got) == 4:
            chan.basic_ack(got[3].delivery_tag, multiple=True)
            chan.stop_consuming()

    ch.basic_consume(q, on_msg, consumer_tag="ctag-golden", arguments={"x-priority": 5})
    ch.start_consuming()
    ch.basic_publish("", q, body(4), props(4))
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    method, _, _ = ch.basic_get(q)
    assert method is None
    ch2 = conn.channel()
    ch2.tx_select()
    ch2.basic_publish("", q, body(5), props(5))
    ch2.tx_commit()
    ch2.basic_publish("", q, body(6), props(6))
    ch2.tx_rollback()
    ch2.close()
    ch.queue_delete(q)
    ch.close()
    conn.close()
    return got


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: capture_amqp.py OUTDIR")
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    base = tempfile.mkdtemp(prefix="twice-amqp-rec-")
    proc, env, name, port = start_rabbit(base)
    try:
        relay = Relay(port, os.path.join(outdir, "client.bin"), os.path.join(outdir, "server.bin"))
        got = session(relay.port)
        relay.join()
        for m in got:
            print("delivered tag=%d redelivered=%s" % (m.delivery_tag, m.redelivered))
    finally:
        stop_rabbit(proc, env, name)
        shutil.rmtree(base, ignore_errors=True)
    for f in ("client.bin", "server.bin"):
        print(f, os.path.getsize(os.path.join(outdir, f)))


if __name__ == "__main__":
    main()
