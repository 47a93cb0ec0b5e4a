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
 * Threads (`threads N`): the main thread runs loop 0 and also owns the
 * listeners, signals, reload, shutdown and the admin API; loops 1..N-1 run
 * on their own threads.  Every session lives on one loop for its whole life
 * and is touched only by that loop's thread.  The main thread accepts and
 * hands each new connection to the next loop in turn (loop.c); it talks to
 * the other loops only through their inboxes.  What the loops share:
 * configuration objects (immutable, atomic reference counts), the ruleset
 * (engine.h: per-rule locks), the journal (its own lock and thread) and
 * the Redis id map (idmap.h: its lock).  Counters are kept per loop and
 * summed by the admin API.
 */
#ifndef TWICE_PROXY_H
#define TWICE_PROXY_H

#include "proto/base/must_check.h"

#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "rules/conf.h"
#include "rules/rule.h"

struct admin_server;
struct toxi;
struct toxi_toxics;
struct session;
struct session_end;
struct ruleset;
struct journal;
struct resp_aux;
struct loop_msg;
struct loop_drain;
struct listener_pending;

struct conf_ref {
    atomic_int refs;
    struct conf *conf;
};

/* Runtime form of one `listen` block. */
struct lconf {
    atomic_int refs;
    struct conf_ref *root;
    const struct conf_listener *l; /* points into root->conf */
    SSL_CTX *server_ctx;           /* NULL: plain TCP from clients */
    SSL_CTX *client_ctx;           /* NULL: plain TCP to the upstream */
    bool upstream_is_literal;      /* upstream host is an IP: no DNS */
    struct sockaddr_storage upstream_sa;
    socklen_t upstream_salen;
    unsigned max_sessions; /* this listener's cap: `max-connections`, or its default */
    unsigned process_max;  /* sessions of every listener together (the open-file limit's) */
    char bind_str[128];
    char upstream_str[300];
};

struct listener {
    atomic_int refs; /* the proxy's list + one per session */
    struct proxy *px;
    struct lconf *cfg;            /* current configuration (main thread) */
    struct listener_stats *stats; /* counters of its name; may be NULL */
    struct evconnlistener *evl;   /* NULL once closed */
    struct event *retry_timer;    /* re-enables accept after EMFILE */
    atomic_uint n_sessions;
    bool toxi;                  /* a Toxiproxy API proxy (toxi.h) */
    struct toxi_toxics *toxics; /* its stream toxics now (toxi.h: under its lock); may be NULL */
    struct listener *next;      /* in px->listeners while open */
};

/* Admin servers replaced by a reload, freed once their replies are out. */
#define ADMIN_MAX_RETIRED 8

/* One loop's share of the counters of a listener name, on its own cache
 * line: written by that loop only (stat_add), summed by the admin API. */
struct listener_counts {
    _Alignas(64) uint64_t connections; /* accepted */
    uint64_t open;
    uint64_t bytes_up;              /* client -> upstream */
    uint64_t bytes_down;            /* upstream -> client */
    uint64_t events[RULE_EV_COUNT]; /* protocol events seen, by kind */
};

/* Counters of one listener name, kept across reloads. */
struct listener_stats {
    char name[72];
    struct listener_counts *per_loop; /* n_loops of them */
    struct listener_pending *pending; /* n_loops of them: what it holds back (drain.h) */
    struct listener_stats *next;
};

/* One event loop and the sessions on it (loop.c).  Everything but the
 * inbox and the counters read by the admin API belongs to its thread. */
struct loop {
    struct proxy *px;
    unsigned index; /* 0: the main thread's */
    struct event_base *base;
    struct evdns_base *dns;
    struct session *sessions; /* every session of this loop not yet freed */
    struct session *reap;     /* closed sessions to free after dispatch */
    struct event *reaper;
    struct event *flusher;           /* writes the ends in flush_list */
    struct session_end *flush_list;  /* ends with output to write this turn, in the order
                                        their output was queued */
    struct session_end **flush_tail; /* the last end's flush_next (&flush_list: none) */
    bool flushing;                   /* session_flush_all is running */
    struct event *janitor;           /* 1 s: idle and drain timeouts */
    struct ruleset *rules;           /* this loop's reference to the current rules */
    uint64_t rules_gen;              /* changes with `rules` (1 for the first) */
    struct resp_aux *aux;            /* twice's own Redis connections on this loop */
    struct loop_drain *drain;        /* what its sessions hold back, and draining it (drain.c) */
    bool stopping;                   /* shutdown: end once its sessions are gone */
    atomic_bool stop_flag;           /* raised by the main thread: shutdown */
    atomic_bool close_flag;          /* raised by the main thread: close everything now */
    atomic_uint n_sessions;          /* written by this loop only */
    _Alignas(64) uint64_t events[RULE_EV_COUNT]; /* protocol events seen (stat_add) */
    /* Messages from other threads: a mutex-protected queue and an eventfd. */
    _Alignas(64) pthread_mutex_t lock;
    struct loop_msg *inbox, **inbox_tail;
    int wake_fd;
    struct event *wake;
    pthread_t thread;
    bool thread_started;
};

struct proxy {
    struct event_base *base; /* the main thread's: loops[0].base */
    char *conf_path;
    struct conf_ref *conf;
    struct listener *listeners;
    struct loop *loops; /* n_loops, fixed at start */
    unsigned n_loops;
    unsigned next_loop;        /* where the next connection goes */
    atomic_uint loops_running; /* worker threads whose loop has not ended */
    unsigned conf_threads;     /* `threads` as configured at start (0: auto) */
    struct event *sig_term, *sig_int, *sig_hup;
    struct event *grace_timer;
    struct event *log_timer; /* writes the counts of repeated log lines */
    struct ruleset *rules;   /* current rules (main thread); each loop holds its own reference */
    struct journal *journal; /* NULL without `journal` */
    char *journal_path;      /* as opened at start */
    char instance[256];      /* `instance NAME` or the host name, fixed at start */
    uint64_t start_ms;       /* monotonic, for `between` */
    uint64_t seed;           /* the configured seed, or one drawn at start */
    /* SHA-256 that names the rules in force: of the configuration file at start
     * (rule_changes.h) */
    uint8_t rules_sha256[32];
    uint8_t rules_body_sha256[32]; /* of the last rule text the admin API parsed */
    struct listener_stats *stats;  /* created by the main thread only */
    struct admin_server *admin;    /* NULL without `admin` */
    struct toxi *toxi;             /* the Toxiproxy API and its proxies (toxi.h); may be NULL */
    struct admin_server *admin_retired[ADMIN_MAX_RETIRED]; /* freed after their last reply */
    unsigned admin_retired_n;
    uint64_t next_session_id; /* drawn by the main thread at accept */
    unsigned session_max;     /* sessions the open-file limit allows, as last applied */
    bool shutting_down;
    int exit_code;
};

/* Descriptors the session limit leaves to the rest of the process: the
 * listening sockets (two per listener: a reload binds a new address before
 * it closes the old one), each loop's epoll, eventfd and DNS sockets
 * (PROXY_FDS_PER_LOOP), and the admin API, its clients, the journal and the
 * files a reload reads (PROXY_FDS_RESERVED). */
#define PROXY_FDS_RESERVED 64
#define PROXY_FDS_PER_LOOP 8
/* A session holds two: its client's and its upstream's. */
#define PROXY_FDS_PER_SESSION 2
/* A listener without `max-connections` may hold 1/PROXY_LISTENER_SHARE of
 * the sessions the open-file limit allows: a loop or a flood on one
 * listener leaves the rest to the others. */
#define PROXY_LISTENER_SHARE 2

/* Reference counting of configuration objects. */
struct conf_ref *conf_ref_new(struct conf *conf);
void conf_ref_put(struct conf_ref *ref);
void lconf_get(struct lconf *lc);
void lconf_put(struct lconf *lc);

/* Build the runtime form of every listen block of `ref->conf`: TLS
 * contexts, literal upstream addresses, and session caps out of
 * `process_max`, the sessions the open-file limit allows (a listener without
 * `max-connections` gets PROXY_LISTENER_SHARE of them).  Returns an array
 * of `ref->conf->n_listeners` lconfs (each holding a reference) or NULL with
 * a reason in `err`. */
struct lconf **lconf_build_all(struct conf_ref *ref, unsigned process_max, char *err,
                               size_t errlen);

/* Listeners (listener.c). */
struct listener *listener_open(struct proxy *px, struct lconf *cfg, char *err, size_t errlen);
void listener_close(struct listener *l);
void listener_put(struct listener *l);
/* accept() on `evl` failed (EVUTIL_SOCKET_ERROR() says why): log it, naming
 * the socket by ` key=value`, and when descriptors or memory ran out, stop
 * accepting and add `retry`, a timer that enables `evl` again, a second
 * later: the socket stays readable, and accepting again at once would spin.
 * For the admin API's socket too. */
void listener_accept_failed(struct evconnlistener *evl, struct event *retry, const char *key,
                            const char *value);

/* What the command line of `twice run` sets over the file. */
struct proxy_options {
    bool journal_mode_set; /* --journal-mode MODE: MODE, not the file's `journal PATH MODE` */
    enum conf_journal_mode journal_mode;
};

/* The process (proxy.c).  proxy_init parses and applies `conf_path`, with
 * `opt` (may be NULL) over it; returns 0, or -1 after printing why. */
int proxy_init(struct proxy *px, const char *conf_path,
               const struct proxy_options *opt) TWICE_MUST_CHECK;
int proxy_run(struct proxy *px);
void proxy_free(struct proxy *px);

/* Called by sessions when they are freed. */
void proxy_session_gone(struct loop *lp);

/* Sessions open on every loop, and the protocol events of kind `e` seen
 * (read from the main thread). */
unsigned proxy_sessions(const struct proxy *px);
uint64_t proxy_events(const struct proxy *px, unsigned e);

/* Counters with one writer (a loop) and readers on other threads (the
 * admin API): relaxed atomic loads and stores, no lock, no locked add. */
static inline void stat_add(uint64_t *c, uint64_t n)
{
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}
static inline void stat_sub(uint64_t *c, uint64_t n)
{
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) - n, __ATOMIC_RELAXED);
}
static inline uint64_t stat_get(const uint64_t *c)
{
    return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* The counters of `st` summed over every loop. */
struct listener_counts proxy_stats_total(const struct proxy *px, const struct listener_stats *st);

/* Loops (loop.c).  loop_init builds loop `index` with its own base (loop
 * 0's is the main thread's); loop_start runs a worker loop on its own
 * thread. */
int loop_init(struct loop *lp, struct proxy *px, unsigned index);
int loop_start(struct loop *lp);
/* Wake loop `lp` (from any thread): it reads its flags, its inbox and a drain asked for. */
void loop_wake(struct loop *lp);
/* Hand connection `fd` accepted by `l` to the next loop. */
void loop_accept(struct proxy *px, struct listener *l, evutil_socket_t fd,
                 const struct sockaddr *sa, int salen);
/* Give every loop a reference to `rs` (main thread). */
void loop_set_rules_all(struct proxy *px, struct ruleset *rs);
/* On every loop, close each session of listener `l` (close), or give it the listener's toxics
 * now (toxi.h).  Main thread. */
void loop_listener_sessions_all(struct proxy *px, struct listener *l, bool close);
/* Close every session of every loop now. */
void loop_close_all(struct proxy *px);
/* Shutdown: each loop ends once its sessions are gone; the main loop ends
 * after the others. */
void loop_shutdown_all(struct proxy *px);
/* One of the loop's own Redis connections freed itself (resp_aux.c). */
void loop_aux_gone(struct loop *lp);
/* Wait for the worker threads and free every loop (main thread, at exit). */
void loop_free_all(struct proxy *px);

/* Re-read the configuration file (SIGHUP, POST /reload).  Returns 0, or -1
 * and, when `diag` is not NULL, a malloc'ed text of every problem. */
int proxy_reload(struct proxy *px, char **diag);

/* Logs each diagnostic of d as a `msg=config` line (level warn or error) with its FILE:LINE:COL,
 * problem and hint: the warnings of a configuration that starts, is reloaded or replaces the
 * rules go to the log with everything else. */
void proxy_log_diags(const struct conf_diags *d);

/* Make `rs` the current rules (takes the caller's reference); enabled
 * flags, counters and the kill switch carry over by rule name. */
void proxy_set_rules(struct proxy *px, struct ruleset *rs);

/* The counters of listener `name`, created on first use (NULL if out of
 * memory). */
struct listener_stats *proxy_stats(struct proxy *px, const char *name);

/* Monotonic milliseconds. */
uint64_t proxy_now_ms(void);

#endif
