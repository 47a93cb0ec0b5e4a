/*
 * proxy.h - the running process: its event loop, listeners and sessions.
 *
 *   struct proxy ── listeners ── struct listener (one bound socket each)
 *        │                            │ accept
 *        │                            ▼
 *        └── sessions ───────── struct session (session.h)
 *
 * Configuration is shared by reference count: a `struct conf_ref` owns one
 * parsed file, a `struct lconf` is the runtime form of one listen block
 * (TLS contexts, resolved address) and keeps its conf_ref alive.  A listener
 * points at its current lconf; a session keeps the lconf it was accepted
 * under, so a reload never changes a session in flight.
 *
 * Everything here runs on one event loop thread.
 */
#ifndef TWICE_PROXY_H
#define TWICE_PROXY_H

#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "rules/conf.h"
#include "rules/rule.h"

struct session;
struct session_end;
struct ruleset;
struct journal;

struct conf_ref {
    int refs;
    struct conf *conf;
};

/* Runtime form of one `listen` block. */
struct lconf {
    int refs;
    struct conf_ref *root;
    const struct conf_listener *l; /* points into root->conf */
    SSL_CTX *server_ctx;           /* NULL: plain TCP from clients */
    SSL_CTX *client_ctx;           /* NULL: plain TCP to the upstream */
    bool upstream_is_literal;      /* upstream host is an IP: no DNS */
    struct sockaddr_storage upstream_sa;
    socklen_t upstream_salen;
    char bind_str[128];
    char upstream_str[300];
};

struct listener {
    int refs; /* the proxy's list + one per session */
    struct proxy *px;
    struct lconf *cfg;          /* current configuration */
    struct evconnlistener *evl; /* NULL once closed */
    struct event *retry_timer;  /* re-enables accept after EMFILE */
    unsigned n_sessions;
    struct listener *next; /* in px->listeners while open */
};

/* Admin servers replaced by a reload, freed once their replies are out. */
#define ADMIN_MAX_RETIRED 8

/* Counters of one listener name, kept across reloads. */
struct listener_stats {
    char name[72];
    uint64_t connections; /* accepted */
    uint64_t open;
    uint64_t bytes_up;   /* client -> upstream */
    uint64_t bytes_down; /* upstream -> client */
    struct listener_stats *next;
};

struct proxy {
    struct event_base *base;
    struct evdns_base *dns;
    char *conf_path;
    struct conf_ref *conf;
    struct listener *listeners;
    struct session *sessions; /* every session not yet freed */
    struct session *reap;     /* closed sessions to free after dispatch */
    struct event *reaper;
    struct event *flusher;          /* writes the ends in flush_list */
    struct session_end *flush_list; /* ends with output to write this turn */
    bool flushing;                  /* session_flush_all is running */
    struct event *janitor;          /* 1 s: idle and drain timeouts */
    struct event *sig_term, *sig_int, *sig_hup;
    struct event *grace_timer;
    struct ruleset *rules;   /* current rules; sessions read it per event */
    struct journal *journal; /* NULL without `journal` */
    char *journal_path;      /* as opened at start */
    uint64_t start_ms;       /* monotonic, for `between` */
    uint64_t seed;           /* the configured seed, or one drawn at start */
    bool faults_off;         /* kill switch, kept across rule changes */
    uint64_t events[RULE_EV_COUNT];
    struct listener_stats *stats;
    struct evhttp *admin_http;
    struct evhttp *admin_retired[ADMIN_MAX_RETIRED]; /* freed after their last reply */
    unsigned admin_retired_n;
    char admin_addr[300];
    unsigned n_sessions;
    uint64_t next_session_id;
    bool shutting_down;
    int exit_code;
};

/* Reference counting of configuration objects. */
struct conf_ref *conf_ref_new(struct conf *conf);
void conf_ref_put(struct conf_ref *ref);
void lconf_get(struct lconf *lc);
void lconf_put(struct lconf *lc);

/* Build the runtime form of every listen block of `ref->conf`: TLS
 * contexts and literal upstream addresses.  Returns an array of
 * `ref->conf->n_listeners` lconfs (each holding a reference) or NULL with a
 * reason in `err`. */
struct lconf **lconf_build_all(struct conf_ref *ref, char *err, size_t errlen);

/* Listeners (listener.c). */
struct listener *listener_open(struct proxy *px, struct lconf *cfg, char *err, size_t errlen);
void listener_close(struct listener *l);
void listener_put(struct listener *l);

/* The process (proxy.c).  proxy_init parses and applies `conf_path`;
 * returns 0, or -1 after printing why. */
int proxy_init(struct proxy *px, const char *conf_path) __attribute__((warn_unused_result));
int proxy_run(struct proxy *px);
void proxy_free(struct proxy *px);

/* Called by sessions when they are freed. */
void proxy_session_gone(struct proxy *px);

/* Re-read the configuration file (SIGHUP, POST /reload).  Returns 0, or -1
 * and, when `diag` is not NULL, a malloc'ed text of every problem. */
int proxy_reload(struct proxy *px, char **diag);

/* Make `rs` the current rules (takes the caller's reference); enabled
 * flags, counters and the kill switch carry over by rule name. */
void proxy_set_rules(struct proxy *px, struct ruleset *rs);

/* The counters of listener `name`, created on first use (NULL if out of
 * memory). */
struct listener_stats *proxy_stats(struct proxy *px, const char *name);

/* Monotonic milliseconds. */
uint64_t proxy_now_ms(void);

#endif
