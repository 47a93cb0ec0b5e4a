#!/usr/bin/python3
"""Load driver of the Sidekiq example app (app.rb).

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REALPORT --jobs N --workers W [--timeout T]

1. pushes N `Charge` and N `ChargeSafe` jobs, and --retried R `ChargeRetried` jobs
   (which fail twice under `retry: 2` before they charge), with Sidekiq's client
   (`ruby enqueue.rb N R`, through --broker);
2. starts ONE Sidekiq process with W threads:
   `sidekiq -r app.rb -c W -q default -t 5` (Debian's /usr/bin/sidekiq, 6.4);
3. waits until queue:default is empty (and the retry and schedule sets too)
   and no execution was recorded for --quiet seconds (Sidekiq has no ack, so
   there is nothing else to watch: a fetched job lives only in the worker);
4. stops Sidekiq with SIGTERM (it finishes running jobs within -t 5 s),
   prints a one-line JSON summary on stdout and exits 0 (1 if the run did not
   drain).  --visibility-timeout is accepted and ignored (BasicFetch has none).
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402

RUBY = "/usr/bin/ruby"
SIDEKIQ = "/usr/bin/sidekiq"
QUEUE = "default"


def main():
    k.install_signal_handlers()
    args = k.parse_args("sidekiq", __doc__.split("\n\n")[0])
    started = time.monotonic()
    env = k.worker_env(args, TWICE_BROKER_URL="redis://%s/0" % args.broker)

    def start_workers():
        workers = k.Workers(args.log_dir)
        workers.start("sidekiq", [SIDEKIQ, "-r", os.path.join(HERE, "app.rb"), "-c",
                                  str(args.workers), "-q", QUEUE, "-t", "5"], env=env, cwd=HERE)
        return workers

    workers = start_workers() if args.pace > 0 else None
    if workers is not None and not workers.wait_ready("Starting processing"):
        return k.finish("sidekiq", args, workers, [], False, "Sidekiq never got ready", started)
    r = subprocess.run([RUBY, os.path.join(HERE, "enqueue.rb"), str(args.jobs), str(args.retried),
                        args.handlers, str(args.pace)],
                       env=env, cwd=HERE,
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=max(30, args.timeout / 2))
    if r.returncode != 0:
        k.log("enqueue.rb failed (rc=%d):\n%s" % (r.returncode, r.stderr.decode(errors="replace")))
        return 1
    enqueued = [tuple(l.split()) for l in r.stdout.decode().splitlines() if l.strip()]
    k.write_enqueued(args, enqueued)
    k.log("enqueued %d jobs" % len(enqueued))
    if workers is None:
        workers = start_workers()

    inspect = k.redis_client(args.inspect)

    def idle():
        p = inspect.pipeline(transaction=False)
        p.llen("queue:" + QUEUE).zcard("retry").zcard("schedule")
        return p.execute() == [0, 0, 0]

    ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    dead = inspect.zcard("dead")
    if dead:
        k.log("%d jobs failed and went to the Dead set; see the worker log" % dead)
    return k.finish("sidekiq", args, workers, enqueued, ok, reason, started, {"dead": dead})


if __name__ == "__main__":
    sys.exit(main())
