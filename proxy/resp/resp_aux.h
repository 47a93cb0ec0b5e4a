/*
 * resp_aux.h - twice's own connection to a session's Redis, for the
 * commands a fault adds (a duplicate's re-push, a delayed ack).  See
 * resp_aux.c.
 */
#ifndef TWICE_RESP_AUX_H
#define TWICE_RESP_AUX_H

#include <event2/buffer.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct session;
struct resp_aux;
struct loop;
struct listener_stats;

/* Opens a connection to the server the session's upstream socket is
 * connected to (TLS when the listener's upstream is), sending `prologue`
 * (the client's AUTH/HELLO/SELECT, `prologue_n` commands; copied) first.  NULL when that is
 * impossible. */
struct resp_aux *resp_aux_open(struct session *s, struct evbuffer *prologue, size_t prologue_n);

/* Whether the connection failed (the caller should detach and open another). */
bool resp_aux_failed(const struct resp_aux *a);

/* Sends `n` encoded commands (drained from cmds) now. */
void resp_aux_send(struct resp_aux *a, struct evbuffer *cmds, size_t n);

/* Sends them `ms` from now (drained from cmds).  0, or -1 out of memory. */
int resp_aux_send_later(struct resp_aux *a, uint32_t ms, struct evbuffer *cmds, size_t n);

/* The session is done with `a`: it finishes its scheduled work, then frees
 * itself.  NULL is allowed. */
void resp_aux_detach(struct resp_aux *a);

/* Calls fn for every aux of loop `lp` (detached or not) that still has commands to send or
 * replies to read (the client's setup commands not counted), with their number and the
 * counters of the listener whose session opened it (NULL when it has none). */
void resp_aux_each_pending(struct loop *lp,
                           void (*fn)(void *arg, struct listener_stats *st, size_t commands),
                           void *arg);

/* At exit: frees every aux of loop `lp` (on its loop, as the session that
 * opened it), detached or not, logging what they still had scheduled (a
 * delayed ack not yet due is lost, as in any crash). */
void resp_aux_free_all(struct loop *lp);

#endif
