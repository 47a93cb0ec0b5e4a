#!/usr/bin/python3
"""Load driver of the BullMQ example app (app.js, enqueue.js, worker.js).

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REALPORT --jobs N --workers W [--concurrency C] \\
            [--timeout T] [--lock-ms L] [--stalled-ms S] [--max-stalled M] [--work-ms W] \\
            [--bullmq PACKAGE]

1. removes the queue's keys (bull:twice:*) and adds N `charge` and N `charge_safe` jobs
   (interleaved) with BullMQ's Queue.add (`node enqueue.js N`, through --broker);
2. starts W workers (`node worker.js NAME C`: a BullMQ Worker with concurrency C);
3. waits until the queue's wait, active, delayed and prioritized sets are empty and no
   execution was recorded for --quiet seconds;
4. stops the workers with SIGTERM, prints a one-line JSON summary on stdout and exits 0 (1 if
   the run did not drain).

Node.js and the npm packages (bullmq, ioredis) come from tests/node (scripts/deps.sh test):
--bullmq names the BullMQ package there, `bullmq` (5.x, the default) or `bullmq6` (6.x).  The
summary's `bullmq` is the version the queue's meta hash names (`bullmq:6.7.6`), as Redis has it.
The message id is BullMQ's job id, the task its name.
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402

NODE = "/usr/bin/node"
QUEUE = "twice"


def extra(p):
    p.add_argument("--concurrency", type=int, default=2, metavar="C",
                   help="jobs each worker runs at once (default 2)")
    p.add_argument("--lock-ms", type=int, metavar="L",
                   help="the workers' lockDuration (BullMQ's default 30000)")
    p.add_argument("--stalled-ms", type=int, metavar="S",
                   help="the workers' stalledInterval (BullMQ's default 30000)")
    p.add_argument("--max-stalled", type=int, metavar="M",
                   help="the workers' maxStalledCount (BullMQ's default 1)")
    p.add_argument("--bullmq", default="bullmq", choices=("bullmq", "bullmq6"),
                   metavar="PACKAGE",
                   help="the BullMQ package of tests/node: bullmq (5.x, default) or bullmq6 (6.x)")


def main():
    k.install_signal_handlers()
    args = k.parse_args("bullmq", __doc__.split("\n\n")[0], extra=extra)
    started = time.monotonic()
    settings = {"TWICE_LOCK_MS": args.lock_ms, "TWICE_STALLED_MS": args.stalled_ms,
                "TWICE_MAX_STALLED": args.max_stalled}
    spans = os.path.join(os.path.dirname(os.path.abspath(args.runs)), "spans.txt")
    open(spans, "w").close()
    # With --work-ms each execution works that long before its effect and writes its span to
    # spans.txt beside --runs.
    env = k.worker_env(args, TWICE_BROKER=args.broker, TWICE_QUEUE=QUEUE, TWICE_SPANS=spans,
                       TWICE_BULLMQ=args.bullmq,
                       **{n: v for n, v in settings.items() if v is not None})

    inspect = k.redis_client(args.inspect)
    stale = list(inspect.scan_iter(match="bull:%s:*" % QUEUE, count=1000))
    if stale:
        inspect.delete(*stale)
    def start_workers():
        workers = k.Workers(args.log_dir)
        for i in range(1, args.workers + 1):
            workers.start("worker%d" % i, [NODE, os.path.join(HERE, "worker.js"),
                                           "worker%d" % i, str(args.concurrency)],
                          env=env, cwd=HERE)
        return workers

    # BullMQ's ids start again at 1 in a fresh queue: the keys an earlier run's handlers left
    # for the same ids would keep this run's from their effects.
    effect_redis = k.redis_client(args.effect_redis)
    stale = [key for pattern in ("twice:done:*", "twice:mark:*", "twice:claim:*")
             for key in effect_redis.scan_iter(match=pattern, count=1000)]
    if stale:
        effect_redis.delete(*stale)
    workers = start_workers() if args.pace > 0 else None
    if workers is not None and not workers.wait_ready("consuming"):
        return k.finish("bullmq", args, workers, [], False, "a worker never got ready", started)
    r = subprocess.run([NODE, os.path.join(HERE, "enqueue.js"), str(args.jobs), args.handlers,
                        str(int(args.pace * 1000))], env=env, cwd=HERE,
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=max(30, args.timeout / 2))
    if r.returncode != 0:
        k.log("enqueue.js failed (rc=%d):\n%s" % (r.returncode, r.stderr.decode(errors="replace")))
        return 1
    enqueued = [tuple(l.split()) for l in r.stdout.decode().splitlines() if l.strip()]
    k.write_enqueued(args, enqueued)
    k.log("added %d jobs" % len(enqueued))
    if workers is None:
        workers = start_workers()

    prefix = "bull:%s:" % QUEUE

    def idle():
        p = inspect.pipeline(transaction=False)
        p.llen(prefix + "wait").llen(prefix + "active").zcard(prefix + "delayed")
        p.zcard(prefix + "prioritized")
        return p.execute() == [0, 0, 0, 0]

    ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    failed = inspect.zcard(prefix + "failed")
    version = inspect.hget(prefix + "meta", "version")
    return k.finish("bullmq", args, workers, enqueued, ok, reason, started,
                    {"failed": failed, "queue": QUEUE,
                     "bullmq": version.decode() if version is not None else None})


if __name__ == "__main__":
    sys.exit(main())
