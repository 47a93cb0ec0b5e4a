/*
 * toxi.h - Toxiproxy's HTTP API (`toxiproxy-api HOST:PORT`), its proxies and their toxics.
 *
 *   GET  /version                          {"version": "..."}
 *   GET  /proxies                          every proxy by name, with its toxics
 *   POST /proxies                          create a proxy (201), listening at once
 *   POST /populate                         create or replace the proxies of a JSON array (201)
 *   GET  /proxies/{proxy}                  one proxy
 *   POST|PATCH /proxies/{proxy}            change listen, upstream, enabled
 *   DELETE /proxies/{proxy}                remove it (204): its socket and connections close
 *   GET  /proxies/{proxy}/toxics           its toxics
 *   POST /proxies/{proxy}/toxics           add a toxic (200)
 *   GET|POST|PATCH|DELETE /proxies/{proxy}/toxics/{toxic}
 *   POST /reset                            every proxy enabled, every toxic removed (204)
 *
 * The JSON shapes, status codes and error bodies ({"error": "...", "status": N}) are
 * Toxiproxy 2.x's (api.go); docs/toxiproxy.md says where twice differs.
 *
 * A proxy is a listener made at run time (protocol tcp, or amqp/resp with the extra fields
 * "protocol" and "profile"), named as the proxy; it is not written to the configuration file,
 * and a reload keeps it.  Its stream toxics (latency, bandwidth, slow_close, timeout,
 * reset_peer, slicer, limit_data) are stream faults of its connections (shaper.h), those open
 * included: every change reaches the open connections at once, as in Toxiproxy.  Each toxic
 * acts on a connection with the chance `toxicity`, drawn from the seed and the connection
 * (engine_coin): the same seed, the same connections.  A message toxic (redeliver, duplicate,
 * ...) is a rule of the rule set, named PROXY.TOXIC.
 *
 * Everything here runs on the main thread but the two calls sessions make
 * (toxi_session_start, toxi_session_update), which take a snapshot of the toxics under a lock.
 */
#ifndef TWICE_TOXI_H
#define TWICE_TOXI_H

#include "proto/base/must_check.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/net/shaper.h"
#include "rules/toxic_stream.h"

struct proxy;
struct session;
struct listener;

/* Stream toxics one proxy may have: far more than a test adds. */
#define TOXI_MAX_TOXICS 64

/* One stream toxic of a proxy, as the sessions see it. */
struct toxi_stream_toxic {
    char rule[160];  /* PROXY.TOXIC: its name in logs, and the coin's */
    bool downstream; /* else upstream (client to broker) */
    double toxicity; /* the chance that a connection has it */
    struct toxic_stream t;
};

/* The stream toxics of a proxy at one moment: immutable, shared by reference. */
struct toxi_toxics {
    atomic_int refs;
    uint64_t seed; /* the process's when it was made: the coins' (sessions read no proxy field) */
    size_t n;
    struct toxi_stream_toxic t[];
};

void toxi_toxics_put(struct toxi_toxics *tt);

/* Start the API (or move it) as px->conf says, and at the first call read `toxiproxy-config`.
 * Returns 0, or -1 with a reason in err. */
int toxi_apply(struct proxy *px, char *err, size_t errlen) TWICE_MUST_CHECK;

/* Close every proxy's socket (shutdown); the API stays until toxi_stop. */
void toxi_close_listeners(struct proxy *px);
void toxi_stop(struct proxy *px);

/* The rule set changed under the API (reload, PUT /rules): put the message toxics' rules back.
 * Main thread. */
void toxi_rules_changed(struct proxy *px);

struct conf;
struct conf_listener;

/* The configuration rules are checked against: the file's, with the listeners of the enabled
 * proxies after its own (a shallow view in *view, its listeners in *mem, which the caller frees
 * once done with the view), or the file's itself when there is no proxy.  Main thread. */
const struct conf *toxi_conf_view(struct proxy *px, struct conf *view, struct conf_listener **mem);

/* For a session of a proxy's listener: fold its toxics into fx (the stream faults of its rules,
 * by the side bytes come from), and keep the snapshot the names point into.  Any thread. */
void toxi_session_fx(struct session *s, struct stream_fx fx[2]);

#endif
