/*
 * amqp_app.h - where an AMQP app keeps what twice journals of a message by default: its id,
 * its task, the app's retries of it, its queue.
 *
 * The defaults follow Celery (protocol 2, celery/app/amqp.py as_task_v2) and kombu, which most
 * Python AMQP apps use, and read the AMQP properties any client sets: a listener's
 * `message-id` and `task` sources (docs/any-app.md) replace the id and task defaults.  Each is a
 * pure function over proto/amqp/amqp.h's decoded method or content header: views into it, nothing
 * allocated.
 */
#ifndef TWICE_AMQP_APP_H
#define TWICE_AMQP_APP_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/amqp/amqp.h"

/* The message's id: the message_id property, else Celery's `id` header (protocol 2), else the
 * correlation_id property (Celery sets it to the task id too; RPC clients to their request's).
 * False when it has none. */
bool amqp_app_message_id(const struct amqp_props *p, struct amqp_bytes *out);

/* Its task: Celery's `task` header.  False when it has none. */
bool amqp_app_task(const struct amqp_props *p, struct amqp_bytes *out);

/* The app's retries of it before: Celery's `retries` header, an integer above 0 on a task its
 * handler sent again with self.retry() (as_task_v2 writes it); 0 when absent, not an integer
 * or not above 0, UINT32_MAX at most. */
uint32_t amqp_app_retries(const struct amqp_props *p);

/* A publish of a message the app ran before: Celery's retry sends the task again, with the
 * same id and its `retries` header one up. */
bool amqp_app_publish_is_retry(uint32_t retries);

/* The queue a publish goes to when the exchange says it: through the default exchange ("")
 * the routing key is the queue (AMQP 0-9-1's default exchange, how kombu sends Celery's tasks
 * to a queue of the same name).  False for any other exchange (its bindings, which twice does
 * not see, decide). */
bool amqp_app_publish_queue(const struct amqp_publish *m, struct amqp_bytes *out);

#endif
