/*
 * admin.h - the admin HTTP API (libevent's evhttp), loopback by default.
 *
 *   GET  /healthz                     200 "ok" (no token needed)
 *   GET  /rules                       the rules, their state and counters (JSON)
 *   PUT  /rules                       replace the rules with the rule text in the body;
 *                                     400 with every diagnostic, and nothing changes
 *   GET  /rules/NAME                  one rule, as GET /rules lists it
 *   PUT  /rules/NAME                  replace (200) or add (201) the one rule of the body
 *   DELETE /rules/NAME                remove one rule
 *   POST /rules/NAME/enable|disable   switch one rule
 *   POST /faults/off | /faults/on     the kill switch for every rule
 *   POST /reload                      re-read the configuration file (as SIGHUP)
 *   GET  /stats                       counters (JSON)
 *   GET  /metrics                     counters (Prometheus text format)
 *   POST /drain[?timeout=D]           faults off, release what is only delayed, answer once
 *                                     nothing is held or scheduled (drain.h)
 *
 * HEAD is answered wherever GET is.  Errors are JSON, {"error": "..."}:
 * 404 for a path no route has, 405 with `Allow` for a method a path does not
 * take.  With `admin-token` set, every request but GET /healthz needs
 * `Authorization: Bearer TOKEN`.
 */
#ifndef TWICE_ADMIN_H
#define TWICE_ADMIN_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;
struct proxy;

/* Start (or move) the admin API to match px->conf; stop it when the
 * configuration has no `admin`.  Returns 0, or -1 with a reason in err. */
int admin_apply(struct proxy *px, char *err, size_t errlen) TWICE_MUST_CHECK;
void admin_stop(struct proxy *px);

struct evhttp_request;

/* What the admin API and the Toxiproxy API (toxi.c) share: an answer with its Content-Type,
 * Content-Length and no caching (HEAD without the body; `body` is drained), and the bearer
 * token check of `admin-token` (true when no token is set). */
void admin_http_reply(struct evhttp_request *req, int code, const char *type,
                      struct evbuffer *body);
bool admin_http_authorized(struct proxy *px, struct evhttp_request *req);

/* s as a Prometheus label value (quotes, backslashes and newlines escaped) onto b. */
void admin_prom_label(struct evbuffer *b, const char *s);

#endif
