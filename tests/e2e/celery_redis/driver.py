#!/usr/bin/python3
"""Load driver of the Celery-on-Redis example app (tasks.py).

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REALPORT --jobs N --workers W \\
            [--visibility-timeout S] [--restore-every R] [--timeout T]

1. sends N `tasks.charge` and N `tasks.charge_safe` tasks (interleaved; with
   --handlers races `tasks.check_then_act` and `tasks.claim_first`) with
   Celery's client (apply_async: LPUSH celery <json>), through --broker (with
   --pace, one every --pace seconds once the workers are ready);
2. starts W worker nodes, each `python3 -m celery -A tasks worker --pool=solo`
   (one task at a time, prefetch 1, task_acks_late=True, visibility timeout S,
   unacked messages swept every R seconds: see tasks.py);
3. waits until the `celery` list is empty, the `unacked` hash is empty (every
   delivered message was acked for real) and no execution was recorded for
   --quiet seconds;
4. stops the workers with SIGTERM (warm shutdown), prints a one-line JSON
   summary on stdout and exits 0 (1 if the run did not drain).
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402


def extra(p):
    p.add_argument("--pool", choices=("solo", "prefork", "threads"), default="solo",
                   help="the workers' pool, each of concurrency 1 (default solo: tasks run in "
                        "the worker's event loop, which sends their acks once its buffer is "
                        "done; prefork: a child runs them while the worker reads and acks)")
    p.add_argument("--prefetch", type=int, default=4, metavar="N",
                   help="Celery's worker_prefetch_multiplier (default 4, Celery's own)")
    p.add_argument("--restore-every", type=float, default=1.0, metavar="R",
                   help="seconds between sweeps of unacked messages (default 1; 0 = kombu's "
                        "own schedule, up to ~100 s late)")


def main():
    k.install_signal_handlers()
    args = k.parse_args("celery_redis", __doc__.split("\n\n")[0], extra=extra,
                        defaults={"visibility_timeout": 30.0})
    started = time.monotonic()
    settings = {
        "TWICE_BROKER_URL": "redis://%s/0" % args.broker,
        "TWICE_VISIBILITY_TIMEOUT": args.visibility_timeout,
        "TWICE_RESTORE_EVERY": args.restore_every,
        "TWICE_PREFETCH": args.prefetch,
    }
    env = k.worker_env(args, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]),
                       HOME=args.log_dir, **settings)

    # The producer: this process, through the same app (tasks.py reads the
    # settings at import, so set them first).
    os.environ.update({key: str(v) for key, v in settings.items()})
    import tasks

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
        return k.finish("celery_redis", args, workers, [], False, "a worker never got ready",
                        started)
    k.write_enqueued(args, enqueued)
    k.log("enqueued %d tasks" % len(enqueued))

    inspect = k.redis_client(args.inspect)

    def idle():
        p = inspect.pipeline(transaction=False)
        p.llen(tasks.QUEUE).hlen("unacked").zcard("unacked_index")
        return p.execute() == [0, 0, 0]

    ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    return k.finish("celery_redis", args, workers, enqueued, ok, reason, started,
                    {"visibility_timeout": args.visibility_timeout,
                     "restore_every": args.restore_every})


if __name__ == "__main__":
    sys.exit(main())
