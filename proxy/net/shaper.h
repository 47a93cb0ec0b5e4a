/*
 * shaper.h - stream faults on one direction of one session.
 *
 * Without stream faults a session hands bytes straight to the other side.
 * With them, bytes read from `from` go through a shaper, which holds them
 * and releases them to the other side as its faults say:
 *
 *   latency D jitter J   each chunk is released D±J after it was read, in
 *                        order (a chunk never overtakes an earlier one)
 *   bandwidth R          at most R bytes per second (token bucket, 50 ms burst)
 *   slice N [delay D]    N bytes at a time, each written on its own once the
 *                        previous slice has left, D apart
 *   blackhole            bytes are read and dropped; the connection stays up
 *   limit N              after N bytes the connection is closed
 *   slow-close D         an EOF from `from` is passed on D later
 *
 * and, for Toxiproxy's toxics (docs/toxiproxy.md), which may change while the
 * connection is open (shaper_set_fx):
 *
 *   slice halving        Toxiproxy's slicer: each chunk read is cut in pieces by
 *                        halving it (rules/toxic_stream.h, struct toxic_slicer)
 *                        with average N and variation V, and the delay is in
 *                        microseconds (slice_delay_us)
 *   bandwidth hold       Toxiproxy's bandwidth at rate 0: nothing leaves until
 *                        the faults change
 *   timeout T            bytes are dropped; after T (0: never) the connection
 *                        is closed
 *   reset-peer T         the first bytes after it came are dropped, and T later
 *                        both connections are reset
 *
 * Held bytes count toward the session's backpressure, so a shaper never
 * holds more than the session's output limit.
 */
#ifndef TWICE_SHAPER_H
#define TWICE_SHAPER_H

#include <event2/buffer.h>
#include <stdbool.h>
#include <stdint.h>

#include "rules/stream_plan.h"

struct session;

/* struct stream_fx, the plan of one direction's bytes, is rules/stream_plan.h's. */

struct shaper;

/* A shaper for the bytes `s` reads from side `from` (0 client, 1 upstream).
 * NULL on allocation failure. */
struct shaper *shaper_new(struct session *s, int from, const struct stream_fx *fx,
                          uint64_t jitter_seed);
void shaper_free(struct shaper *sh);
/* Stop the shaper's timer (its session is closing). */
void shaper_stop(struct shaper *sh);

/* Replace the faults of a live shaper (a toxic added, changed or removed through the Toxiproxy
 * API): bytes already held keep their place, and leave no later than the new latency says; a
 * limit or a timeout newly set counts from now. */
void shaper_set_fx(struct shaper *sh, const struct stream_fx *fx);

/* Take every byte of `in`.  May release bytes, close the session (limit), or
 * arm the shaper's timer. */
void shaper_push(struct shaper *sh, struct evbuffer *in);

/* Bytes held, not yet released. */
size_t shaper_held(const struct shaper *sh);

/* Whether the shaper waits for the output to drain (a slice in flight): the
 * session must keep telling it (shaper_output_drained). */
bool shaper_waiting(const struct shaper *sh);

/* `from` sent EOF: pass it on once everything held has been released (and
 * after slow-close).  Calls session_shaper_eof() when it is time. */
void shaper_eof(struct shaper *sh);

/* Whether the EOF of `from` has been passed on (see shaper_eof). */
bool shaper_eof_passed(const struct shaper *sh);

/* The output toward the other side drained (slicing waits for this). */
void shaper_output_drained(struct shaper *sh);

#endif
