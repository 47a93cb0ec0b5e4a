/*
 * session.h - one client connection and its upstream connection.
 *
 * A session relays bytes between a client and the listener's upstream.  Its
 * life is one state (session.state), changed only by session_set_state(),
 * which refuses (logs at error level, and asserts in a debug build) a move
 * not drawn here:
 *
 *   RESOLVING ──> CONNECTING ──> RELAYING ──> DRAINING ──> CLOSED
 *        │              │            │                        ▲
 *        └──────────────┴────────────┴────────────────────────┘
 *
 *   RESOLVING   the upstream name is being resolved (at once for a literal),
 *               or a `delay` connect fault holds the connection back
 *   CONNECTING  TCP connect, then the TLS handshake when upstream-tls is on
 *   RELAYING    bytes flow both ways; half-closes are propagated
 *   DRAINING    one side failed while relaying; what was already read for
 *               the other side is flushed to it (bounded in time) before it
 *               is closed.  Only a relaying session drains: before, nothing
 *               was sent to either side, and a failure closes at once
 *   CLOSED      both sockets are closed; the struct is freed by the proxy's
 *               reaper after the callback that closed it has returned.  It
 *               is the end: closing again is no move (session_close returns)
 *
 * Backpressure: when the bytes waiting for one side pass
 * SESSION_OUTPUT_HIGH, the session stops reading from the other side until
 * they drain below half of it, so a peer that stops reading costs at most a
 * few hundred KiB per direction.
 */
#ifndef TWICE_SESSION_H
#define TWICE_SESSION_H

#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "proxy/core/proxy.h"
#include "rules/stream_plan.h"

/* Bytes queued toward one side before reading from the other stops. */
#define SESSION_OUTPUT_HIGH (256u * 1024u)
/* Bytes read from one side and not yet handed over, before reading stops. */
#define SESSION_INPUT_HIGH (256u * 1024u)
/* Rules that may fire on one event of one session. */
#define SESSION_MAX_RULE_HITS 32
/* How long a failed session may spend flushing to the surviving side. */
#define SESSION_DRAIN_MS 5000u

enum session_state {
    SESSION_RESOLVING = 0,
    SESSION_CONNECTING,
    SESSION_RELAYING,
    SESSION_DRAINING,
    SESSION_CLOSED,
};

/* Why a session ended: stable codes, append only (the journal stores them). */
#define SESSION_CLOSE_REASONS(X)                                                                   \
    X(NONE, 0, "none")                                                                             \
    X(CLIENT_CLOSED, 1, "client_closed")                                                           \
    X(UPSTREAM_CLOSED, 2, "upstream_closed")                                                       \
    X(CLIENT_ERROR, 3, "client_error")                                                             \
    X(UPSTREAM_ERROR, 4, "upstream_error")                                                         \
    X(UPSTREAM_CONNECT_FAILED, 5, "upstream_connect_failed")                                       \
    X(UPSTREAM_TLS_FAILED, 6, "upstream_tls_failed")                                               \
    X(CLIENT_TLS_FAILED, 7, "client_tls_failed")                                                   \
    X(RESOLVE_FAILED, 8, "resolve_failed")                                                         \
    X(IDLE_TIMEOUT, 9, "idle_timeout")                                                             \
    X(SHUTDOWN, 10, "shutdown")                                                                    \
    X(MAX_CONNECTIONS, 11, "max_connections")                                                      \
    X(INTERNAL_ERROR, 12, "internal_error")                                                        \
    X(FAULT, 13, "fault")                                                                          \
    X(PROTOCOL_ERROR, 14, "protocol_error")

enum session_close_reason {
#define SESSION_REASON_ENUM(name, code, str) SESSION_CLOSE_##name = code,
    SESSION_CLOSE_REASONS(SESSION_REASON_ENUM)
#undef SESSION_REASON_ENUM
};

const char *session_close_reason_name(enum session_close_reason r);

enum session_side {
    SIDE_CLIENT = 0,
    SIDE_UPSTREAM = 1,
};

struct session_end {
    struct bufferevent *bev;
    bool tls;
    bool eof;        /* this peer sent EOF: we read everything it will send */
    bool shut;       /* we shut down our writing toward this peer */
    bool paused;     /* reading from this peer is paused by backpressure */
    bool codec_hold; /* the codec holds too much of what this peer sent */
    /* Direct I/O (plain TCP while relaying; see session.c).  An end is direct
     * while it has rd, its own read event (the bufferevent's is off, and so
     * is EV_WRITE until a write falls short), and reads into din and is
     * written from dout: buffers of its own, which carry no callbacks. */
    struct event *rd;
    struct evbuffer *din, *dout;
    evutil_socket_t fd; /* the bufferevent's, while direct (asking takes its lock) */
    bool rd_armed;      /* rd is added: asking libevent takes the base's lock */
    bool rd_want;       /* reading is on (not paused, held or ended) */
    bool flush_queued;  /* in its loop's flush_list */
    bool write_cb;      /* bev's write callback is on (want_drain), until on_write takes it off */
    size_t read_limit;  /* input bytes before reading stops (0: SESSION_INPUT_HIGH) */
    uint32_t read_size; /* what the next direct read asks for (adapts to the traffic) */
    struct session *owner;
    struct session_end *flush_next, **flush_pprev;
};

struct shaper;
struct toxi_toxics;
struct ruleset;
struct codec_ops;
struct pump_port;

struct session {
    uint64_t id;
    enum session_state state;         /* changed only by session_set_state() */
    enum session_close_reason reason; /* set when the end is decided */
    enum session_side first_eof;      /* who half-closed first, for the reason */
    struct proxy *px;
    struct loop *loop;             /* the loop (thread) the session lives on */
    struct listener *listener;     /* holds a reference */
    struct listener_counts *stats; /* its loop's counters of the listener name; may be NULL */
    struct lconf *cfg;             /* holds a reference */
    struct session_end end[2];     /* indexed by enum session_side */
    const struct codec_ops *codec; /* NULL: bytes are relayed as they are */
    void *codec_state;
    const struct pump_port *port; /* how its codec's pump reaches it (pump.h) */
    void *port_ctx;               /* the port's context: the session, or a test's fake */
    uint64_t rules_gen;           /* the loop's rules_gen `wanted` was computed for (0: never) */
    uint32_t wanted;              /* events some rule of the listener looks at (codec_wants) */
    struct shaper *shaper[2];     /* stream faults, by the side bytes come from */
    struct ruleset *rules;        /* held while shapers name its rules */
    struct toxi_toxics *toxics;   /* a Toxiproxy proxy's toxics, held while shapers name them */
    struct stream_fx *rule_fx;    /* a Toxiproxy proxy's: the faults of its rules, by side */
    struct conn_faults faults;
    struct event *fault_timer;     /* delayed connect, reset */
    struct event *handshake_timer; /* client TLS handshake deadline */
    struct evdns_getaddrinfo_request *dns_req;
    struct event *connect_timer;
    char client_addr[64];
    char error[256];            /* detail of a failure, for the close log */
    bool upstream_failed;       /* never reached the upstream; a warning said why */
    uint64_t bytes_up;          /* client -> upstream */
    uint64_t bytes_down;        /* upstream -> client */
    struct timeval started;     /* monotonic */
    struct timeval last_active; /* monotonic, updated on every read */
    struct timeval drain_started;
    struct session *prev, *next; /* loop->sessions */
    struct session *reap_next;   /* loop->reap once CLOSED */
};

/* Counts n protocol events of kind ev on s: for its loop (GET /stats) and for
 * its listener (GET /metrics). */
static inline void session_count_events(struct session *s, enum rule_event ev, uint64_t n)
{
    stat_add(&s->loop->events[ev], n);
    if (s->stats != NULL)
        stat_add(&s->stats->events[ev], n);
}

/* Accept `fd` (a connected client socket) on listener `l` with its settings
 * `cfg` (referenced by the session), on loop `lp` (the calling thread's), as
 * session `sid` (drawn at accept, in accept order).  Takes ownership of fd:
 * it is closed on failure.  The session is linked into lp->sessions and
 * lives until it closes itself. */
void session_accept(struct loop *lp, struct listener *l, struct lconf *cfg, evutil_socket_t fd,
                    const struct sockaddr *sa, int salen, uint64_t sid);

/* The toxics of the session's listener changed (toxi.h): its stream faults follow. */
void session_toxics_changed(struct session *s);

/* Move s to `next`: true, or false for a move the diagram above does not draw (refused: logged
 * at error level, an assertion fails in a debug build; the state stays).  Only the session's
 * own files (and its unit test) call it: others end a session with session_close() or
 * session_abort(). */
bool session_set_state(struct session *s, enum session_state next);

/* Close the session now (e.g. at the end of the shutdown grace period). */
void session_close(struct session *s, enum session_close_reason reason);

/* Whether the session could be closed without cutting a message under way: it relays on a
 * listener whose codec says nothing is busy (codec.h), and no byte waits to be read, written
 * or released by a stream fault.  A `tcp` session never is: twice cannot tell. */
bool session_quiet(const struct session *s);

/* Periodic check of idle and drain timeouts, `now` monotonic. */
void session_tick(struct session *s, const struct timeval *now);

/* Write the output queued on direct ends this turn (the loop's flusher). */
void session_flush_all(struct loop *lp);

/* Free a CLOSED session; only its loop's reaper calls this. */
void session_free(struct session *s);

/* Send `buf` (drained) to side `to`, through the stream faults of that
 * direction.  Returns 0, or -1 when the session is closing (the bytes are
 * dropped) or was closed for lack of memory. */
int session_send(struct session *s, enum session_side to, struct evbuffer *buf);
int session_send_bytes(struct session *s, enum session_side to, const void *data, size_t len);

/* Record the detail of why the session ends (the first one wins). */
void session_set_error(struct session *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* End the session because of `reason`: at once (flush_to < 0), or after
 * what was already sent to side `flush_to` has been delivered. */
void session_abort(struct session *s, enum session_close_reason reason, int flush_to);

/* Stop (hold true) or resume reading from side `side` because the codec
 * holds too many of its bytes (delayed frames). */
void session_hold_reading(struct session *s, enum session_side side, bool hold);

/* Let side `side` hold at least `bytes` of unread input (a codec that needs
 * whole frames of that size). */
void session_set_read_limit(struct session *s, enum session_side side, size_t bytes);

/* Hooks for the shaper (shaper.c) of the bytes read from side `from`: the
 * buffer its bytes go out through (NULL when the session is not relaying),
 * what waits there to be written, and the call that has them written. */
struct evbuffer *session_peer_output(struct session *s, int from);
size_t session_peer_pending(const struct session *s, int from);
void session_peer_output_added(struct session *s, int from);
void session_shaper_eof(struct session *s, int from);
void session_shaper_limit(struct session *s, int from, const char *rule, uint64_t bytes);
void session_want_output_drained(struct session *s, int from);
/* A toxic's deadline (shaper.h): close the connection (timeout) or reset it (reset-peer). */
void session_shaper_toxic(struct session *s, int from, const char *rule, bool reset);

#endif
