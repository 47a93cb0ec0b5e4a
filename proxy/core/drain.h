/*
 * drain.h - the work twice holds back or has scheduled, and waiting for it to be done.
 *
 * What a load test must wait for before it reads the verdict, per listener:
 *
 *   held_acks           settlements twice holds (a `delay`, or until a late copy), or dropped
 *                       while the listener's visibility timeout is still to requeue them (amqp)
 *   late_copies         copies twice will make later: `redeliver after D`, `duplicate after D`
 *                       (amqp)
 *   held_messages       deliveries, publishes, replies and commands a `delay` holds
 *   scheduled_commands  commands twice will send, or has sent and awaits the reply of, on its
 *                       own Redis connections: a delayed ack, a late copy (resp)
 *
 * Each loop counts its own sessions and Redis connections (drain_loop_count()): once a second,
 * and every DRAIN_CHECK_MS while it drains or stops.  It publishes the counts per listener name
 * (struct listener_pending, one per loop, in struct listener_stats) and its total, written by
 * that loop only and summed by the admin API, like the other counters.
 *
 * POST /drain switches faults off (the kill switch: POST /faults/on resumes them), asks every
 * loop to release what a rule only delays (codec.h's drain op: a delayed delivery, publish,
 * reply or command, and a delayed ack that would reach the broker before its visibility timeout
 * goes on now; a late copy and an ack held or dropped past the timeout come when they would
 * have), and answers once every loop has done so and counts nothing pending, or when its
 * timeout runs out.  A shutdown does the same, and also closes each session that has no message
 * under way (session_quiet()) instead of waiting out `shutdown-grace` for it.
 */
#ifndef TWICE_DRAIN_H
#define TWICE_DRAIN_H

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdint.h>

struct proxy;
struct loop;
struct listener_stats;

/* How often a loop that drains or stops counts again (and closes the sessions that became
 * quiet), and how often POST /drain looks at the counts. */
#define DRAIN_CHECK_MS 50u
/* POST /drain's timeout when the request names none, and the longest it may name. */
#define DRAIN_DEFAULT_TIMEOUT_MS 30000u
#define DRAIN_MAX_TIMEOUT_MS 3600000u

enum drain_kind {
    DRAIN_HELD_ACKS,
    DRAIN_LATE_COPIES,
    DRAIN_HELD_MESSAGES,
    DRAIN_SCHEDULED_COMMANDS,
    DRAIN_KINDS,
};

/* One loop's counts of one listener name: `now` as last published (read by the admin API),
 * `sum` the count being made (its loop's only). */
struct listener_pending {
    _Alignas(64) uint64_t now[DRAIN_KINDS];
    uint64_t sum[DRAIN_KINDS];
};

/* ---- on a loop's thread ---- */

/* The loop's drain state (lp->drain): 0, or -1 out of memory.  drain_loop_free frees it. */
int drain_loop_init(struct loop *lp);
void drain_loop_free(struct loop *lp);
/* The loop was woken (loop.c): a drain asked for since its last is carried out now. */
void drain_loop_wake(struct loop *lp);
/* The loop stops (shutdown; the caller has set lp->stopping, which this file reads): what is
 * held is released as by a drain, and each quiet session is closed, now and as others become
 * quiet. */
void drain_loop_stopping(struct loop *lp);
/* Once a second (the loop's janitor): count. */
void drain_loop_tick(struct loop *lp);
/* The loop's thread has ended: it counts nothing any more. */
void drain_loop_ended(struct loop *lp);

/* ---- on the main thread ---- */

/* Asks every loop to drain (faults are the caller's to switch off first). */
void drain_ask_loops(struct proxy *px);
/* POST /drain[?timeout=D]: answered once nothing is pending (200) or at the timeout (504),
 * with the counts in JSON; 400 for a timeout that does not read. */
void drain_request(struct proxy *px, struct evhttp_request *req);
/* `"pending":{...},` for GET /stats: the totals and each listener's. */
void drain_stats_json(struct proxy *px, struct evbuffer *b);
/* The `twice_pending{listener,kind}` gauges for GET /metrics. */
void drain_metrics(struct proxy *px, struct evbuffer *b);
/* At exit, before the admin API goes: the requests still waiting are answered (503). */
void drain_stop(struct proxy *px);

#endif
