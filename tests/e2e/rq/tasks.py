"""The RQ example app: functions `tasks.charge` and `tasks.charge_safe`.

Run by `rq worker` (driver.py puts this folder and tests/e2e on the import
path), enqueued by name: `queue.enqueue("tasks.charge", order_id)`.  The
message id is the RQ job id (`get_current_job().id`, a uuid4).

RQ 1.13 (rq/worker.py, rq/registry.py): a worker BLPOPs the job id from
rq:queue:default, loads rq:job:<id>, and runs it in a forked work horse, which
records the start (ZADD rq:wip:default) and the end (MULTI ... ZREM
rq:wip:default ... EXEC) on its own connection; the worker renews the start
entry while the horse runs.  A job runs twice only if its id is pushed again:
by twice, or by RQ when the entry lapsed and the job has retries left.

Environment: TWICE_EFFECTS, TWICE_RUNS, TWICE_EFFECT_REDIS (see ../e2ekit.py).
"""

import os
import sys

from rq import get_current_job

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import e2ekit  # noqa: E402


def charge(order_id):
    """NOT idempotent."""
    e2ekit.charge(get_current_job().id, "tasks.charge")
    return order_id


def charge_retried(order_id):
    """Fails e2ekit.RETRIES times, then charges once: enqueued with Retry(max=RETRIES), each
    failure makes RQ's worker save the job (its start time set) and push its id again
    (rq/job.py, Job.retry)."""
    job = get_current_job()
    if job.retries_left:
        raise e2ekit.RetryAsked("retries left: %d" % job.retries_left)
    e2ekit.charge(job.id, "tasks.charge_retried")
    return order_id


def charge_safe(order_id):
    """Idempotent: SET twice:done:<job id> NX on the real Redis first."""
    e2ekit.charge_safe(get_current_job().id, "tasks.charge_safe")
    return order_id


def check_then_act(order_id):
    """A done-marker checked first, set after the work: races a copy that runs beside it."""
    e2ekit.check_then_act(get_current_job().id, "tasks.check_then_act")
    return order_id


def claim_first(order_id):
    """SET NX claim before the work: idempotent against any copy."""
    e2ekit.claim_first(get_current_job().id, "tasks.claim_first")
    return order_id


def _held(order_id, handler):
    """Runs handler (its runs line says the job started) and then works until the file
    TWICE_RELEASE exists (at most TWICE_HOLD_S, 180 s by default): a job that outlives its lease
    when the worker's heartbeat is lost (tests/integration/test_rq_lease.py)."""
    import time
    job = get_current_job()
    handler(job.id, job.func_name)
    deadline = time.monotonic() + float(os.environ.get("TWICE_HOLD_S") or 180)
    while not os.path.exists(os.environ["TWICE_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return order_id


def charge_held(order_id):
    """NOT idempotent, and long: see _held()."""
    return _held(order_id, e2ekit.charge)


def charge_safe_held(order_id):
    """Idempotent, and long: see _held()."""
    return _held(order_id, e2ekit.charge_safe)
