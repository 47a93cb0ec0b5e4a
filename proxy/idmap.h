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
 * Chained hashing with a list in order of the last idmap_put for eviction.  Shared by
 * the loops of every thread (a job is delivered on one connection and acked
 * on another, which may live on another loop): every use, from idmap_get or
 * idmap_put to the last touch of the entry it returned, holds idmap_lock().
 * Uses are short (copy a few strings) and never take another lock.
 */
#ifndef TWICE_IDMAP_H
#define TWICE_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Entries kept before the oldest is evicted. */
#define IDMAP_MAX (1u << 20)

/* What twice remembers of one message. */
struct idmap_info {
    char *task;  /* owned; NULL when unknown */
    char *queue; /* owned; NULL when unknown */
    char *id;    /* owned; the message id when the key is another handle (a Celery tag); a
                    BullMQ job's: the lock token whose renewals are lost (IDMAP_LEASE_LOST) */
    uint32_t flags;
    uint32_t lease_ms; /* IDMAP_LEASE_LATE */
    uint32_t pending;  /* a Celery tag's deliveries not settled yet: a copy of a message is
                          delivered under its tag too, and the first ack must not forget it */
    uint64_t gen;      /* unique per entry made: tells a re-made entry from the one read earlier */
};

/* Flags of struct idmap_info. */
enum {
    IDMAP_SUPPRESS_ACK = 1u << 0, /* a `duplicate` on a stream entry: swallow its next XACK */
    IDMAP_POP_HEAD = 1u << 1,     /* a processing list fed from its queue's head (list profile) */
    IDMAP_LEASE_LOST = 1u << 2,   /* a BullMQ job's renewals by the lock token in .id are
                                     answered, never applied (`duplicate` on its delivery,
                                     `drop` on a renewal) */
    IDMAP_LEASE_LATE = 1u << 3,   /* ... answered, and applied .lease_ms later (`delay`) */
};

/* The map's lock (see above); idmap_count and idmap_clear need not hold it. */
void idmap_lock(void);
void idmap_unlock(void);

/* The value slot for (scope, key), created empty when absent; NULL when out of memory. */
struct idmap_info *idmap_put(const char *scope, const char *key, size_t keylen);
/* The value for (scope, key), or NULL. */
struct idmap_info *idmap_get(const char *scope, const char *key, size_t keylen);
/* Forgets (scope, key). */
void idmap_del(const char *scope, const char *key, size_t keylen);
/* Replaces *dst by a copy of src[0..len) (NULL src: frees). */
void idmap_set_str(char **dst, const char *src, size_t len);
/* Entries held (for tests and metrics). */
size_t idmap_count(void);
/* Frees everything (at exit, for leak checkers). */
void idmap_clear(void);

#endif
