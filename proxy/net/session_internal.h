/*
 * session_internal.h - what the three files of a session share, beyond session.h: the
 * functions one calls in another.  Only those files include it:
 *
 *   session.c          state, close and free, relaying, drains, failures and EOF, accepting,
 *                      the codec's and the shaper's entry points
 *   session_io.c       direct I/O: a relaying plain TCP end read with one readv and written
 *                      with one writev, off the bufferevent's path
 *   session_connect.c  reaching the upstream (resolve, connect, TLS, timeouts), and the
 *                      connection faults decided when a session starts (stream rules,
 *                      connect delays and refusals, resets)
 */
#ifndef TWICE_SESSION_INTERNAL_H
#define TWICE_SESSION_INTERNAL_H

#include "proxy/net/session.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "proxy/api/toxi.h"
#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/net/blockcache.h"
#include "proxy/net/codec.h"
#include "proxy/net/fault.h"
#include "proxy/net/shaper.h"
#include "proxy/net/tls.h"
#include "rules/engine.h"

/* ---- session.c ---- */

void sess_flush_unqueue(struct session_end *e);
void sess_rd_free(struct session_end *e);
void sess_fail_upstream(struct session *s, enum session_close_reason reason, const char *msg);
void sess_propagate_eof(struct session *s, enum session_side from);
void sess_relay(struct session *s, enum session_side from);
void sess_on_read(struct bufferevent *bev, void *arg);
void sess_on_write(struct bufferevent *bev, void *arg);
void sess_on_event(struct bufferevent *bev, short what, void *arg);

/* ---- session_io.c ---- */

size_t sess_read_limit(const struct session_end *e);
void sess_rd_update(struct session_end *e);
void sess_set_reading(struct session *s, enum session_side side, bool on);
void sess_flush_queue(struct session_end *e);
void sess_direct_start(struct session *s, enum session_side side);
void sess_direct_stop(struct session_end *e);

/* ---- session_connect.c ---- */

void sess_set_nodelay(evutil_socket_t fd);
void sess_setup_bev(struct session *s, enum session_side side);
void sess_start_relaying(struct session *s);
void sess_start_upstream(struct session *s);
void sess_format_addr(const struct sockaddr *sa, char *buf, size_t len);
void sess_delay_upstream(struct session *s);
int sess_apply_connection_faults(struct session *s, const struct sockaddr *sa);
/* Abort both connections with a TCP reset (SO_LINGER 0): rule `rule` says so. */
void sess_reset(struct session *s, const char *rule);

#endif
