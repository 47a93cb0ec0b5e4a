#!/usr/bin/python3
"""A Redis Streams consumer-group worker (redis-py), the Streams example app.

  worker.py --broker HOST:PORT --stream KEY --group G --consumer NAME
            --visibility-timeout S [--block-ms 1000] [--ack-broker HOST:PORT]

--ack-broker sends the XACKs to another address than the reads (default: the same): a
worker behind a load balancer that spreads its connections over several twice instances
(tests/integration/test_instances.py).

Each stream entry is a job: field `task` (`charge` or `charge_safe`) and field
`order_id`.  The message id is the entry id ("<ms>-<seq>").

The loop (Redis's consumer-group commands: XREADGROUP, XACK, XAUTOCLAIM):
  * XREADGROUP GROUP G NAME COUNT 1 BLOCK <block-ms> STREAMS KEY >
    new entries, which Redis puts in the group's pending entries list (PEL);
  * run the handler, then XACK KEY G <id> (the ack comes after the work, so a
    lost ack means a second execution);
  * every min(1 s, S/2): XAUTOCLAIM KEY G NAME <S in ms> <cursor> COUNT 10 until
    the cursor comes back to 0-0: entries some consumer read but did not ack
    for S seconds (the visibility-timeout analogue) are taken over and run
    again under the same entry id.  Entries deleted from the stream but still
    pending (XAUTOCLAIM's third element, Redis >= 7) are acked and skipped.

SIGTERM/SIGINT: finish the entry in hand and exit 0 within block-ms.
Environment: TWICE_EFFECTS, TWICE_RUNS, TWICE_EFFECT_REDIS (see ../e2ekit.py).
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit  # noqa: E402

HANDLERS = {"charge": e2ekit.charge, "charge_safe": e2ekit.charge_safe}

stopping = False


def _stop(signum, frame):
    global stopping
    stopping = True


def log(*a):
    print("[%s %s]" % (os.environ.get("TWICE_CONSUMER", "worker"), time.strftime("%H:%M:%S")), *a,
          flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--consumer", required=True)
    p.add_argument("--visibility-timeout", type=float, required=True, metavar="S")
    p.add_argument("--block-ms", type=int, default=1000)
    p.add_argument("--ack-broker", metavar="HOST:PORT")
    a = p.parse_args()
    os.environ["TWICE_CONSUMER"] = a.consumer
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    r = e2ekit.redis_client(a.broker)
    ra = e2ekit.redis_client(a.ack_broker) if a.ack_broker else r
    min_idle_ms = int(a.visibility_timeout * 1000)
    claim_every = min(1.0, a.visibility_timeout / 2)
    next_claim = 0.0

    def work(entry_id, fields, claimed):
        entry_id = entry_id.decode()
        task = fields.get(b"task", b"").decode()
        handler = HANDLERS.get(task)
        if handler is None:
            log("entry %s has no known task (%r): acked, not run" % (entry_id, fields))
        else:
            handler(entry_id, task)
            log("%s %s %s(%s)" % ("reclaimed" if claimed else "ran", entry_id, task,
                                  fields.get(b"order_id", b"").decode()))
        ra.xack(a.stream, a.group, entry_id)

    log("consuming %s group %s (XAUTOCLAIM min-idle %d ms every %.1fs)" % (
        a.stream, a.group, min_idle_ms, claim_every))
    while not stopping:
        if time.monotonic() >= next_claim:
            cursor = "0-0"
            while not stopping:
                cursor, entries, deleted = r.xautoclaim(a.stream, a.group, a.consumer, min_idle_ms,
                                                        start_id=cursor, count=10)
                for entry_id, fields in entries:
                    if fields is None:     # deleted while pending (Redis 6.2 style)
                        r.xack(a.stream, a.group, entry_id)
                        continue
                    work(entry_id, fields, claimed=True)
                if deleted:
                    r.xack(a.stream, a.group, *deleted)
                if cursor in (b"0-0", "0-0"):
                    break
            next_claim = time.monotonic() + claim_every
        block = max(1, min(a.block_ms, int((next_claim - time.monotonic()) * 1000)))
        reply = r.xreadgroup(a.group, a.consumer, {a.stream: ">"}, count=1, block=block)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                work(entry_id, fields, claimed=False)
    log("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
