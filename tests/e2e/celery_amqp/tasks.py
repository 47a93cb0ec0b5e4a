"""The Celery-on-RabbitMQ example app: tasks `tasks.charge` and `tasks.charge_safe`.

Imported by the workers (`celery -A tasks worker`) and by driver.py (to send
tasks).  Configuration from the environment, read at import:

  TWICE_BROKER_URL  amqp://guest:guest@HOST:PORT//, twice's listener
  TWICE_EFFECTS, TWICE_RUNS, TWICE_EFFECT_REDIS: see ../e2ekit.py

Celery 5.2 on py-amqp speaks AMQP 0-9-1 (celery/app/amqp.py, kombu/messaging.py): tasks are
published to the default exchange with routing key `celery` (queue `celery`,
durable), the task id in the `id` header and the task name in the `task`
header, which is how twice's `protocol amqp` listener names them
(message_id, task).  A worker consumes with basic.consume and
basic.qos(prefetch_count = 4 x concurrency); with task_acks_late=True it sends
basic.ack after the task returned, so anything that makes RabbitMQ hand the
message out again after the work (a lost ack, a cut connection, a consumer
timeout) means a second execution under the same task id.  RabbitMQ itself
redelivers at once: there is no visibility timeout to wait for, unlike
kombu's Redis transport.

The handlers are the same as in ../celery_redis: the idempotent one takes
`SET twice:done:<task id> 1 NX` on the real Redis (TWICE_EFFECT_REDIS) first.

Acks that wait 10 s.  Celery 5.2.6 does not send an ack when the task
returns: it queues it with `hub.call_soon` (celery/worker/consumer/
consumer.py), and kombu 5.2.4's event loop (kombu/asynchronous/hub.py,
create_loop) runs what call_soon queued only at the top of each iteration,
then sleeps in poll() until an fd is ready or the next timer is due, at most
`fire_timers(max_delay=10)` seconds.  When the task itself ran from a
call_soon callback (kombu's reader re-queues itself after every message, so
the second message of a burst is read that way), its ack is queued during
that run and waits through the next poll().  With the prefetch window full of
such unsent acks, RabbitMQ has nothing to send, so poll() sleeps the full
10 s.  Seen without twice as well: every few hundred tasks both workers idle
for ~10 s, the broker listing 4 unacked messages per channel and the workers'
sockets holding nothing unread.  The consumer bootstep LoopTick below adds a
no-op timer every TICK seconds, so poll() never sleeps longer than that: acks
go out within TICK, as they would under a busier event loop.
"""

import logging
import os
import sys

from celery import Celery, bootsteps

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2ekit  # noqa: E402

QUEUE = "celery"
TICK = 0.1   # seconds: the longest the worker's event loop sleeps (see LoopTick)
BROKER = os.environ.get("TWICE_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")

logger = logging.getLogger("tasks")

app = Celery("tasks", broker=BROKER)
app.conf.update(
    task_acks_late=True,                 # ack after the task ran: a lost ack means a rerun
    task_ignore_result=True,
    result_backend=None,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=int(os.environ.get("TWICE_PREFETCH") or 4),  # 4: Celery's own
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


@app.task(bind=True, name="tasks.charge_retried")
def charge_retried(self, order_id):
    """Asks for e2ekit.RETRIES retries, then charges once: Task.retry() sends the task again
    under the same id with its `retries` header one up (celery/app/task.py), at once with
    countdown=0."""
    if self.request.retries < e2ekit.RETRIES:
        raise self.retry(countdown=0, max_retries=e2ekit.RETRIES)
    e2ekit.charge(self.request.id, self.name)
    return order_id


class LoopTick(bootsteps.StartStopStep):
    """A no-op timer every TICK seconds in the worker's event loop, so that
    acks queued with call_soon go out within TICK instead of up to 10 s
    later (see the module doc)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.tref = None

    def start(self, c):
        self.tref = c.timer.call_repeatedly(TICK, lambda: None)

    def stop(self, c):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


app.steps["consumer"].add(LoopTick)
