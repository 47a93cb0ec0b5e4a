#!/usr/bin/python3
"""A reliable-queue worker on a plain Redis list (redis-py), the list example app.

  worker.py --broker HOST:PORT --queue KEY --processing KEY --name NAME [--block-s 1]

The loop (the reliable queue of Redis's LMOVE documentation):
  * BLMOVE queue processing RIGHT LEFT <block-s>: the oldest job moves to the processing list
    in one step, so a worker that dies holding it leaves it there rather than losing it;
  * run the handler its `displayName` names (`App\\Jobs\\Charge` is not idempotent,
    `App\\Jobs\\ChargeSafe` is), with the payload's `uuid` as the message id;
  * LREM processing 1 <payload>: the ack, after the work, so a lost ack means a second run.

SIGTERM/SIGINT: finish the job in hand and exit 0 within block-s.
Environment: TWICE_EFFECTS, TWICE_RUNS, TWICE_EFFECT_REDIS (see ../e2ekit.py).
"""

import argparse
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit  # noqa: E402

HANDLERS = {"App\\Jobs\\Charge": e2ekit.charge, "App\\Jobs\\ChargeSafe": e2ekit.charge_safe,
            "App\\Jobs\\CheckThenAct": e2ekit.check_then_act,
            "App\\Jobs\\ClaimFirst": e2ekit.claim_first}

stopping = False


def _stop(signum, frame):
    global stopping
    stopping = True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--processing", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--block-s", type=float, default=1.0)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    def log(*words):
        print("[%s %s]" % (a.name, time.strftime("%H:%M:%S")), *words, flush=True)

    r = e2ekit.redis_client(a.broker)
    log("consuming %s through %s" % (a.queue, a.processing))
    while not stopping:
        raw = r.blmove(a.queue, a.processing, a.block_s, "RIGHT", "LEFT")
        if raw is None:
            continue
        job = json.loads(raw)
        task = job.get("displayName", "")
        handler = HANDLERS.get(task)
        if handler is None:
            log("job %s has no known handler (%r): removed, not run" % (job.get("uuid"), task))
        else:
            handler(job["uuid"], task)
            log("ran %s %s" % (job["uuid"], task))
        r.lrem(a.processing, 1, raw)
    log("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
