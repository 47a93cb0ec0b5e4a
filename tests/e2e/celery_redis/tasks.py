"""The Celery-on-Redis example app: tasks `tasks.charge` and `tasks.charge_safe`.

Imported by the workers (`celery -A tasks worker`) and by driver.py (to send
tasks).  Configuration from the environment, read at import:

  TWICE_BROKER_URL          redis://HOST:PORT/0, twice's listener
  TWICE_VISIBILITY_TIMEOUT  seconds (kombu's default is 3600)
  TWICE_RESTORE_EVERY       seconds between unacked-message sweeps (see below);
                            0 or unset leaves kombu's own schedule
  TWICE_EFFECTS, TWICE_RUNS, TWICE_EFFECT_REDIS: see ../e2ekit.py

Redis has no acks, so kombu emulates them (kombu/transport/redis.py, QoS): on
delivery the worker stores the message in the hash `unacked` (and its time in
the zset `unacked_index`); the ack deletes it; a message left there longer than
`visibility_timeout` is pushed back to the queue by a sweep
(`QoS.restore_visible`), and runs again under the same task id.  With
task_acks_late=True the ack is sent after the task returned, so a lost or late
ack means a second execution.

Making restores quick.  In kombu 5.2.4 (kombu/transport/redis.py) the sweep
is slow on purpose: the worker's event loop calls `maybe_restore_messages`
every 10 s (`loop.call_repeatedly(10, ...)`, hard-coded), and
`restore_visible(..., interval=10)` only scans on every 10th call, so a message
comes back up to ~100 s after its visibility timeout.  The transport option
`unacked_restore_limit` only caps how many messages one sweep restores, and
does not make sweeps happen more often.  So this app adds a consumer bootstep
(FastRestore) that calls kombu's own `restore_visible(num=unacked_restore_limit,
interval=1)` every TWICE_RESTORE_EVERY seconds from the worker's event loop
(the same call, on the same channel, over the same connection pool, as kombu's
sweep; only the period differs).  A message whose ack was lost then comes back
within visibility_timeout + TWICE_RESTORE_EVERY seconds.
"""

import logging
import os
import sys

from celery import Celery, bootsteps

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit  # noqa: E402

QUEUE = "celery"
BROKER = os.environ.get("TWICE_BROKER_URL", "redis://127.0.0.1:6379/0")
VISIBILITY_TIMEOUT = float(os.environ.get("TWICE_VISIBILITY_TIMEOUT") or 3600)
RESTORE_EVERY = float(os.environ.get("TWICE_RESTORE_EVERY") or 0)

logger = logging.getLogger("tasks")

app = Celery("tasks", broker=BROKER)
app.conf.update(
    task_acks_late=True,                 # ack after the task ran: a lost ack means a rerun
    task_ignore_result=True,
    result_backend=None,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=int(os.environ.get("TWICE_PREFETCH") or 4),
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
    broker_connection_max_retries=3,
    accept_content=["json"],
    task_serializer="json",
    worker_hijack_root_logger=False,
)


@app.task(bind=True, name="tasks.charge")
def charge(self, order_id):
    """NOT idempotent."""
    e2ekit.charge(self.request.id, self.name)
    return order_id


@app.task(bind=True, name="tasks.charge_safe")
def charge_safe(self, order_id):
    """Idempotent: SET twice:done:<task id> NX on the real Redis first."""
    e2ekit.charge_safe(self.request.id, self.name)
    return order_id


@app.task(bind=True, name="tasks.check_then_act")
def check_then_act(self, order_id):
    """A done-marker checked first, set after the work: races a copy that runs beside it."""
    e2ekit.check_then_act(self.request.id, self.name)
    return order_id


@app.task(bind=True, name="tasks.claim_first")
def claim_first(self, order_id):
    """SET NX claim before the work: idempotent against any copy."""
    e2ekit.claim_first(self.request.id, self.name)
    return order_id


class FastRestore(bootsteps.StartStopStep):
    """Sweeps `unacked` every TWICE_RESTORE_EVERY seconds (see the module doc)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.tref = None

    def start(self, c):
        if RESTORE_EVERY <= 0:
            return
        channel = c.task_consumer.channel
        qos = getattr(channel, "qos", None)
        if not hasattr(qos, "restore_visible"):   # not kombu's Redis transport
            logger.warning("FastRestore: transport has no restore_visible, not sweeping")
            return

        def sweep():
            try:
                qos.restore_visible(num=channel.unacked_restore_limit, interval=1)
            except Exception as e:  # noqa: a broken connection is kombu's business, not ours
                logger.warning("FastRestore: sweep failed: %r", e)

        self.tref = c.timer.call_repeatedly(RESTORE_EVERY, sweep)
        logger.info("FastRestore: sweeping unacked messages every %.1fs (visibility timeout %.1fs)",
                    RESTORE_EVERY, VISIBILITY_TIMEOUT)

    def stop(self, c):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


app.steps["consumer"].add(FastRestore)
