#!/usr/bin/python3
"""Load driver of the RQ example app (tasks.py).

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REALPORT --jobs N --workers W [--timeout T]

1. enqueues N `tasks.charge` and N `tasks.charge_safe` jobs (interleaved; with
   --handlers races `tasks.check_then_act` and `tasks.claim_first`) with RQ's
   Queue.enqueue, through --broker (with --pace, one every --pace seconds once
   the workers are listening);
2. starts W `rq worker` processes (`python3 -m rq.cli worker --url
   redis://BROKER/0 --path <this folder> default`; each forks a work horse
   per job);
3. waits until rq:queue:default is empty, the started registry
   (rq:wip:default) is empty and no execution was recorded for --quiet
   seconds;
4. stops the workers with SIGTERM (warm shutdown), prints a one-line JSON
   summary on stdout (with the size of the failed registry) and exits 0
   (1 if the run did not drain).  --visibility-timeout is accepted and ignored
   (RQ has none).
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402

QUEUE = "default"


def main():
    k.install_signal_handlers()
    args = k.parse_args("rq", __doc__.split("\n\n")[0])
    started = time.monotonic()
    env = k.worker_env(args, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]))

    from rq import Queue, Retry
    q = Queue(QUEUE, connection=k.redis_client(args.broker))

    def start_workers():
        workers = k.Workers(args.log_dir)
        for i in range(1, args.workers + 1):
            workers.start("rq%d" % i,
                          [sys.executable, "-m", "rq.cli", "worker", "--url",
                           "redis://%s/0" % args.broker, "--path", HERE,
                           "--name", "rq%d-%d" % (i, os.getpid()), QUEUE],
                          env=env, cwd=HERE)
        return workers

    names = ["tasks." + n for n in k.job_tasks(args, "charge", "charge_safe", k.RACE_HANDLERS)]

    def enqueue_round(i):
        return [(q.enqueue(name, "order-%d" % i).id, name) for name in names]

    workers, enqueued = k.run_jobs(args, start_workers, "Listening on", enqueue_round)
    if enqueued is None:
        return k.finish("rq", args, workers, [], False, "a worker never got ready", started)
    for i in range(args.retried):
        job = q.enqueue("tasks.charge_retried", "retried-%d" % i, retry=Retry(max=k.RETRIES))
        enqueued.append((job.id, "tasks.charge_retried"))
    k.write_enqueued(args, enqueued)
    k.log("enqueued %d jobs" % len(enqueued))

    inspect = k.redis_client(args.inspect)

    def idle():
        p = inspect.pipeline(transaction=False)
        p.llen("rq:queue:" + QUEUE).zcard("rq:wip:" + QUEUE)
        return p.execute() == [0, 0]

    ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    failed = inspect.zcard("rq:failed:" + QUEUE)
    if failed:
        k.log("%d jobs failed (rq:failed:%s); see the worker logs" % (failed, QUEUE))
    return k.finish("rq", args, workers, enqueued, ok, reason, started, {"failed": failed})


if __name__ == "__main__":
    sys.exit(main())
