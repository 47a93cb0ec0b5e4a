/*
 * idmap.h - a bounded map from message ids to what twice learned about the
 * message, shared by the sessions of the process.
 *
 * A job framework on Redis delivers a message on one connection and settles
 * it on another (kombu marks and acks it on its sync pool, an RQ work horse
 * is a forked process); only the id crosses.  The RESP layer therefore keeps,
 * per listener, what the delivery said about each id (task, queue, pending
 * fault decisions) until the ack removes it.  The map is bounded: past
 * IDMAP_MAX entries the one put longest ago is forgotten (a later ack of it
 * then carries no task), so a load that never acks cannot grow twice without
 * limit, and an entry put again and again (a processing list's) stays.
 *
 * Entries are indexed by proto/base/hmap.h's map, with a list in order of the last idmap_put for
 * eviction.  Shared by the loops of every thread (a job is delivered on one connection and
 * acked on another, which may live on another loop): every use, from idmap_get or idmap_put to
 * the last touch of the entry it returned, holds idmap_lock().  Uses are short (copy a few
 * strings) and never take another lock.
 */
#ifndef TWICE_IDMAP_H
#define TWICE_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/jobs/job.h"

/* Entries kept before the oldest is evicted. */
#define IDMAP_MAX (1u << 20)

/* The values are struct job_memo (proto/jobs/job.h): what twice remembers of one message. */

/* The map's lock (see above); idmap_count and idmap_clear need not hold it. */
void idmap_lock(void);
void idmap_unlock(void);

/* The value slot for (scope, key), created empty when absent; NULL when out of memory. */
struct job_memo *idmap_put(const char *scope, const char *key, size_t keylen);
/* The value for (scope, key), or NULL. */
struct job_memo *idmap_get(const char *scope, const char *key, size_t keylen);
/* Forgets (scope, key). */
void idmap_del(const char *scope, const char *key, size_t keylen);
/* Entries held (for tests and metrics). */
size_t idmap_count(void);
/* Frees everything (at exit, for leak checkers). */
void idmap_clear(void);

#endif
