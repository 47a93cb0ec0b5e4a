#!/usr/bin/python3
"""Load driver of the Celery-on-RabbitMQ example app (tasks.py).

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REDISPORT --jobs N --workers W \\
            [--inspect 127.0.0.1:RABBITPORT] [--rabbitmqctl "CMD ARGS"] [--timeout T]

1. sends N `tasks.charge` and N `tasks.charge_safe` tasks (interleaved; with
   --handlers races `tasks.check_then_act` and `tasks.claim_first`) with
   Celery's client (apply_async: basic.publish to the default exchange,
   routing key `celery`), through --broker;
2. starts W worker nodes, each `python3 -m celery -A tasks worker --pool=solo`
   (one task at a time, prefetch --prefetch, task_acks_late=True); with
   --pace, the workers first, then one task every --pace seconds;
3. waits until the `celery` queue has no ready message (a passive
   queue.declare on --inspect, which should be RabbitMQ itself: the message
   count it answers is the ready messages) and no unacknowledged one
   (`rabbitmqctl list_queues name messages_ready messages_unacknowledged`,
   when --rabbitmqctl says how to run it; without it, unacked messages cannot
   be seen without the management plugin, so the driver waits for every task
   id sent to have run at least once instead), and no execution was recorded
   for --quiet seconds;
4. stops the workers with SIGTERM (warm shutdown), prints a one-line JSON
   summary on stdout and exits 0 (1 if the run did not drain).
   --visibility-timeout is accepted and ignored (RabbitMQ redelivers at once).

--effect-redis is a Redis server: the idempotent handler keeps its keys there,
whatever the broker is.
"""

import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402

RABBITMQCTL_EVERY = 1.5   # seconds between two rabbitmqctl calls (each starts an Erlang VM)


def extra(p):
    p.add_argument("--pool", choices=("solo", "prefork", "threads"), default="solo",
                   help="the workers' pool, each of concurrency 1 (default solo: tasks run in "
                        "the worker's event loop, which sends their acks once its buffer is "
                        "done; prefork: a child runs them while the worker reads and acks)")
    p.add_argument("--prefetch", type=int, default=4, metavar="N",
                   help="Celery's worker_prefetch_multiplier (default 4, Celery's own); 1 keeps a "
                        "busy worker from holding a copy that another one could run")
    p.add_argument("--rabbitmqctl", metavar="CMD",
                   help="how to run rabbitmqctl for the node behind --inspect, e.g. "
                        "\"rabbitmqctl -n rabbit@host\" (split like a shell would; the driver's "
                        "environment is passed on: HOME for the Erlang cookie, RABBITMQ_*, ERL_*). "
                        "Without it, unacknowledged messages are not looked at")
    p.add_argument("--confirm-timeout", type=float, default=0, metavar="S",
                   help="the producer publishes in confirm mode (kombu's confirm_publish) and "
                        "stops waiting for a confirm after S seconds (py-amqp's read_timeout): "
                        "apply_async's retry (kombu's Connection.ensure) then reconnects and "
                        "publishes the task again, under its id (default 0: no confirms)")


def broker_url(addr):
    return "amqp://guest:guest@%s//" % addr


class QueueState:
    """Ready and unacked counts of one queue on the real broker, without the
    management plugin: a passive queue.declare for ready messages, and
    rabbitmqctl (at most every RABBITMQCTL_EVERY s) for unacked ones."""

    def __init__(self, addr, queue, rabbitmqctl):
        self.addr, self.queue = addr, queue
        self.ctl = shlex.split(rabbitmqctl) if rabbitmqctl else None
        self.conn = self.ch = None
        self.ctl_at, self.ctl_counts = 0.0, None

    def ready(self):
        """Messages ready in the queue (an exception while it does not exist)."""
        import pika  # python3-pika, only the driver needs it
        if self.ch is None or not self.ch.is_open:
            self.close()
            host, port = k.host_port(self.addr)
            self.conn = pika.BlockingConnection(pika.ConnectionParameters(
                host=host, port=port, connection_attempts=1, heartbeat=0,
                socket_timeout=10, blocked_connection_timeout=10))
            self.ch = self.conn.channel()
        # A passive declare of a missing queue closes the channel (404):
        # reopened on the next call.
        return self.ch.queue_declare(self.queue, passive=True).method.message_count

    def ctl_state(self):
        """(ready, unacked) from rabbitmqctl, cached for RABBITMQCTL_EVERY s;
        None without --rabbitmqctl."""
        if self.ctl is None:
            return None
        now = time.monotonic()
        if self.ctl_counts is None or now - self.ctl_at >= RABBITMQCTL_EVERY:
            r = subprocess.run(self.ctl + ["list_queues", "-q", "--no-table-headers", "name",
                                           "messages_ready", "messages_unacknowledged"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60)
            text = r.stdout.decode(errors="replace")
            if r.returncode != 0:
                raise RuntimeError("rabbitmqctl list_queues failed (rc=%d): %s" % (
                    r.returncode, text[-500:]))
            counts = None
            for line in text.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == self.queue and parts[1].isdigit() \
                        and parts[2].isdigit():
                    counts = (int(parts[1]), int(parts[2]))
            if counts is None:
                raise RuntimeError("rabbitmqctl list_queues has no queue %r: %s" % (
                    self.queue, text[-500:]))
            self.ctl_at, self.ctl_counts = time.monotonic(), counts
        return self.ctl_counts

    def close(self):
        try:
            if self.conn is not None and self.conn.is_open:
                self.conn.close()
        except Exception:  # noqa: closing a broken connection
            pass
        self.conn = self.ch = None


def main():
    k.install_signal_handlers()
    args = k.parse_args("celery_amqp", __doc__.split("\n\n")[0], extra=extra)
    started = time.monotonic()
    env = k.worker_env(args, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]),
                       HOME=args.log_dir, TWICE_BROKER_URL=broker_url(args.broker),
                       TWICE_PREFETCH=args.prefetch)

    # The producer: this process, through the same app (tasks.py reads the
    # broker URL at import, so set it first).
    os.environ["TWICE_BROKER_URL"] = broker_url(args.broker)
    import tasks
    if args.confirm_timeout > 0:
        # The producer only: the workers' connections keep their defaults.
        tasks.app.conf.broker_transport_options = {"confirm_publish": True,
                                                   "read_timeout": args.confirm_timeout}
    def start_workers():
        workers = k.Workers(args.log_dir)
        for i in range(1, args.workers + 1):
            workers.start("celery%d" % i,
                          [sys.executable, "-m", "celery", "-A", "tasks", "worker",
                           "--pool=%s" % args.pool, "--concurrency=1", "-Q", tasks.QUEUE,
                           "-n", "w%d@twice-e2e" % i, "--without-gossip", "--without-mingle",
                           "--without-heartbeat", "-l", "info"], env=env, cwd=HERE)
        return workers

    pair = [getattr(tasks, n) for n in k.job_tasks(args, "charge", "charge_safe",
                                                   k.RACE_HANDLERS)]
    with tasks.app.connection_for_write() as conn:
        def enqueue_round(i):
            return [(t.apply_async(("order-%d" % i,), connection=conn).id, t.name) for t in pair]

        workers, enqueued = k.run_jobs(args, start_workers, " ready.", enqueue_round)
        if enqueued is None:
            return k.finish("celery_amqp", args, workers, [], False, "a worker never got ready",
                            started)
        for i in range(args.retried):
            r = tasks.charge_retried.apply_async(("retried-%d" % i,), connection=conn)
            enqueued.append((r.id, tasks.charge_retried.name))
    k.write_enqueued(args, enqueued)
    k.log("enqueued %d tasks" % len(enqueued))

    state = QueueState(args.inspect, tasks.QUEUE, args.rabbitmqctl)
    ids = set(m for m, _ in enqueued)
    last = {}

    def idle():
        if state.ready() != 0:
            return False
        counts = state.ctl_state()
        if counts is not None:
            # Nothing ready, nothing delivered and not acknowledged yet.
            last["ready"], last["unacked"] = counts
            return counts == (0, 0)
        # Without rabbitmqctl, a message in a worker's prefetch buffer (or
        # one whose ack twice holds back) is invisible: wait for every task
        # id to have run at least once; the quiet period does the rest.  A
        # task lost for good (`drop` on deliver) then ends in --timeout.
        return not ids - set(m for m, _ in k.read_runs(args.runs))

    try:
        ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    finally:
        state.close()
    return k.finish("celery_amqp", args, workers, enqueued, ok, reason, started,
                    {"queue": tasks.QUEUE, "rabbitmqctl": bool(args.rabbitmqctl),
                     "last_queue_state": last})


if __name__ == "__main__":
    sys.exit(main())
