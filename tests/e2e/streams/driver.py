#!/usr/bin/python3
"""Load driver of the Redis Streams example app (worker.py).

  driver.py --broker 127.0.0.1:PORT --effects FILE --runs FILE \\
            --effect-redis 127.0.0.1:REALPORT --jobs N --workers W \\
            [--visibility-timeout S] [--stream KEY] [--group G] [--timeout T]

1. deletes the stream KEY, creates it with the consumer group G
   (XGROUP CREATE KEY G 0 MKSTREAM), and adds N `charge` and N `charge_safe`
   entries (interleaved; XADD KEY * task <name> order_id order-<i>), all
   through --broker;
2. starts W consumers (worker.py: XREADGROUP BLOCK, XACK after the work,
   XAUTOCLAIM with min-idle-time S);
3. waits until the group has read every entry (its last-delivered-id is the
   stream's last id), nothing is pending (XPENDING count 0) and no execution
   was recorded for --quiet seconds;
4. stops the consumers with SIGTERM, prints a one-line JSON summary on stdout
   and exits 0 (1 if the run did not drain).
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit as k  # noqa: E402


def extra(p):
    p.add_argument("--stream", default="twice:e2e:jobs", help="stream key (default twice:e2e:jobs)")
    p.add_argument("--group", default="workers", help="consumer group (default workers)")


def main():
    k.install_signal_handlers()
    args = k.parse_args("streams", __doc__.split("\n\n")[0], extra=extra,
                        defaults={"visibility_timeout": 5.0})
    started = time.monotonic()

    producer = k.redis_client(args.broker)
    producer.delete(args.stream)
    producer.xgroup_create(args.stream, args.group, id="0", mkstream=True)
    enqueued = []
    for i in range(args.jobs):
        for task in ("charge", "charge_safe"):
            entry_id = producer.xadd(args.stream, {"task": task, "order_id": "order-%d" % i})
            enqueued.append((entry_id.decode(), task))
    k.write_enqueued(args, enqueued)
    k.log("added %d entries to %s" % (len(enqueued), args.stream))

    env = k.worker_env(args)
    workers = k.Workers(args.log_dir)
    for i in range(1, args.workers + 1):
        workers.start("consumer%d" % i,
                      [sys.executable, os.path.join(HERE, "worker.py"), "--broker", args.broker,
                       "--stream", args.stream, "--group", args.group,
                       "--consumer", "consumer%d-%d" % (i, os.getpid()),
                       "--visibility-timeout", str(args.visibility_timeout)], env=env, cwd=HERE)

    inspect = k.redis_client(args.inspect)
    last_id = enqueued[-1][0].encode()

    def idle():
        for g in inspect.xinfo_groups(args.stream):
            if g["name"] in (args.group, args.group.encode()):
                return g["pending"] == 0 and g["last-delivered-id"] == last_id
        return False

    ok, reason = k.wait_drained(args, workers, idle, expected=len(enqueued))
    return k.finish("streams", args, workers, enqueued, ok, reason, started,
                    {"stream": args.stream, "group": args.group,
                     "visibility_timeout": args.visibility_timeout})


if __name__ == "__main__":
    sys.exit(main())
