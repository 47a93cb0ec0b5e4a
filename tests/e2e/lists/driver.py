#!/usr/bin/python3
"""Load driver of the Redis list example app (worker.py): Laravel-shaped jobs on a plain list.

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REALPORT --jobs N --workers W \\
            [--queue KEY] [--processing KEY] [--timeout T]

1. deletes the queue list KEY and the processing list, then pushes N `App\\Jobs\\Charge` and N
   `App\\Jobs\\ChargeSafe` payloads (interleaved; LPUSH KEY <json>), through --broker.  Each
   payload has the fields Laravel's queue writes (Illuminate\\Queue\\Queue::createPayloadArray,
   and RedisQueue's `id` and `attempts`): `uuid`, `displayName`, `job`, `maxTries`, `timeout`,
   `data` {`commandName`, `command`}, `id`, `attempts`;
2. starts W workers (worker.py: BLMOVE KEY processing RIGHT LEFT, the handler, then LREM
   processing 1 <json>);
3. waits until both lists are empty and no execution was recorded for --quiet seconds;
4. stops the workers with SIGTERM, prints a one-line JSON summary on stdout and exits 0 (1 if
   the run did not drain).

The message id is the payload's `uuid`, the task its `displayName`.
"""

import json
import os
import random
import string
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402

TASKS = ("App\\Jobs\\Charge", "App\\Jobs\\ChargeSafe")
RACE_TASKS = ("App\\Jobs\\CheckThenAct", "App\\Jobs\\ClaimFirst")


def payload(task, order_id):
    """A job as Laravel serialises it for its Redis queue (not a real PHP serialisation of the
    command: nothing here unserialises it)."""
    command = 'O:%d:"%s":1:{s:8:"order_id";s:%d:"%s";}' % (len(task), task, len(order_id),
                                                            order_id)
    return {
        "uuid": str(uuid.uuid4()),
        "displayName": task,
        "job": "Illuminate\\Queue\\CallQueuedHandler@call",
        "maxTries": None,
        "maxExceptions": None,
        "failOnTimeout": False,
        "backoff": None,
        "timeout": None,
        "retryUntil": None,
        "data": {"commandName": task, "command": command},
        "id": "".join(random.choice(string.ascii_letters + string.digits) for _ in range(32)),
        "attempts": 0,
    }


def extra(p):
    p.add_argument("--queue", default="queues:default", help="the queue list (default "
                   "queues:default)")
    p.add_argument("--processing", default="queues:default:processing",
                   help="the workers' processing list (default queues:default:processing)")


def main():
    k.install_signal_handlers()
    args = k.parse_args("lists", __doc__.split("\n\n")[0], extra=extra)
    started = time.monotonic()

    producer = k.redis_client(args.broker)
    producer.delete(args.queue, args.processing)
    env = k.worker_env(args)

    def start_workers():
        workers = k.Workers(args.log_dir)
        for i in range(1, args.workers + 1):
            workers.start("worker%d" % i,
                          [sys.executable, os.path.join(HERE, "worker.py"), "--broker",
                           args.broker, "--queue", args.queue, "--processing", args.processing,
                           "--name", "worker%d" % i], env=env, cwd=HERE)
        return workers

    tasks = k.job_tasks(args, TASKS[0], TASKS[1], RACE_TASKS)

    def enqueue_round(i):
        out = []
        for task in tasks:
            job = payload(task, "order-%d" % i)
            producer.lpush(args.queue, json.dumps(job))
            out.append((job["uuid"], task))
        return out

    workers, enqueued = k.run_jobs(args, start_workers, "consuming", enqueue_round)
    if enqueued is None:
        return k.finish("lists", args, workers, [], False, "a worker never got ready", started)
    k.write_enqueued(args, enqueued)
    k.log("pushed %d jobs onto %s" % (len(enqueued), args.queue))

    inspect = k.redis_client(args.inspect)

    def idle():
        return inspect.llen(args.queue) == 0 and inspect.llen(args.processing) == 0

    ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    return k.finish("lists", args, workers, enqueued, ok, reason, started,
                    {"queue": args.queue, "processing": args.processing})


if __name__ == "__main__":
    sys.exit(main())
