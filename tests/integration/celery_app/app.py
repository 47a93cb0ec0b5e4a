"""The Celery app of test_celery_amqp.py.

Environment (read at import, in the worker and in the test process alike):
  TWICE_CELERY_BROKER  broker URL (amqp://guest:guest@127.0.0.1:PORT//)
  TWICE_CELERY_OUT     file `charge` appends "<task_id> <order_id>" lines to
"""

import os

from celery import Celery

app = Celery("twice_it", broker=os.environ.get("TWICE_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    result_backend=None,
    worker_hijack_root_logger=False,
    broker_connection_max_retries=3,
    task_default_queue="celery",
    worker_prefetch_multiplier=4,
    accept_content=["json"],
    task_serializer="json",
)


@app.task(bind=True)
def charge(self, order_id):
    with open(os.environ["TWICE_CELERY_OUT"], "a") as f:
        f.write("%s %s\n" % (self.request.id, order_id))
        f.flush()
    return order_id
