/*
 * loop.c - event loops on threads (`threads N`).  See proxy.h.
 *
 * Hand-off.  The listening sockets stay on the main thread's loop; each
 * accepted socket goes to the next loop in turn.  For loop 0 the session
 * starts at once; for another loop the socket, the listener and the
 * listener's configuration of that moment (both referenced) are queued in
 * the loop's inbox and its eventfd is written; the loop starts the session
 * on its own thread.  One accept thread spreading connections is what
 * HAProxy and pgbouncer-style proxies do when the kernel's SO_REUSEPORT
 * balancing is not wanted: here it keeps reload simple (one socket per
 * listener, kept across reloads) and makes the spreading even.
 *
 * Session ids are drawn here, on the main thread, in accept order: the
 * identities that probabilistic rules hash ("session:N") do not depend on
 * which loop runs first.  Messages are processed in the order they were
 * posted.
 *
 * Shutdown and "close everything" are flags, not messages, so that telling
 * a loop to stop never needs memory.  A loop reads its flags before it
 * takes its inbox: every connection handed to it before the flag was set is
 * started first.  A stopping loop closes each session with no message under
 * way (drain.h), and ends once it has no session and none of its own Redis
 * connections still has a command to send (a delayed ack is sent within the
 * grace period rather than lost).  A worker's thread tells
 * loop 0 when its dispatch returned, however it returned.  Loop 0 ends when
 * it is done and every worker has ended; the grace timer and a second
 * signal raise "close everything", which also drops the Redis connections'
 * pending commands (logged).  The worker threads are joined and their loops
 * freed on the main thread, once nothing runs on them any more.
 *
 * libevent: the bases are created with EVENT_BASE_FLAG_NOLOCK (each is
 * used by one thread only, so no event operation pays for a lock);
 * evthread_use_pthreads() is still called at start, for libevent's global
 * state (the random numbers of evdns).
 */
#include <event2/dns.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "proxy/core/drain.h"
#include "proxy/core/log.h"
#include "proxy/core/proxy.h"
#include "proxy/net/blockcache.h"
#include "proxy/net/session.h"
#include "proxy/resp/resp_aux.h"
#include "rules/engine.h"

enum loop_msg_kind {
    MSG_ACCEPT, /* start a session on fd */
    MSG_RULES,  /* make `rules` the loop's current rules */
    MSG_TOXICS, /* the sessions of `listener`: close them, or give them its toxics */
};

struct loop_msg {
    enum loop_msg_kind kind;
    struct loop_msg *next;
    struct listener *listener; /* MSG_ACCEPT, MSG_TOXICS: a reference */
    bool close;                /* MSG_TOXICS */
    struct lconf *cfg;         /* MSG_ACCEPT: a reference */
    evutil_socket_t fd;
    uint64_t sid;
    struct sockaddr_storage sa;
    int salen;
    struct ruleset *rules; /* MSG_RULES: a reference */
};

void loop_wake(struct loop *lp)
{
    uint64_t one = 1;
    /* Fails only when the counter would overflow: it is then readable. */
    (void)!write(lp->wake_fd, &one, sizeof(one));
}

static void post(struct loop *lp, struct loop_msg *m)
{
    m->next = NULL;
    pthread_mutex_lock(&lp->lock);
    *lp->inbox_tail = m;
    lp->inbox_tail = &m->next;
    pthread_mutex_unlock(&lp->lock);
    loop_wake(lp);
}

static void raise_flag(struct loop *lp, atomic_bool *flag)
{
    atomic_store(flag, true);
    loop_wake(lp);
}

/* A message never processed (its loop ended first): release what it holds. */
static void msg_discard(struct loop_msg *m)
{
    if (m->kind == MSG_ACCEPT) {
        evutil_closesocket(m->fd);
        lconf_put(m->cfg);
        listener_put(m->listener);
    } else if (m->kind == MSG_RULES) {
        ruleset_put(m->rules);
    } else {
        listener_put(m->listener);
    }
    free(m);
}

static void set_rules(struct loop *lp, struct ruleset *rs)
{
    if (lp->rules != NULL)
        ruleset_put(lp->rules);
    lp->rules = rs;
    lp->rules_gen++;
}

static void listener_sessions(struct loop *lp, struct listener *l, bool close)
{
    for (struct session *s = lp->sessions; s != NULL; s = s->next) {
        if (s->listener != l || s->state == SESSION_CLOSED)
            continue;
        if (close) {
            session_set_error(s, "proxy disabled or deleted through the Toxiproxy API");
            session_close(s, SESSION_CLOSE_FAULT);
        } else {
            session_toxics_changed(s);
        }
    }
}

static void close_sessions(struct loop *lp)
{
    for (struct session *s = lp->sessions; s != NULL; s = s->next)
        session_close(s, SESSION_CLOSE_SHUTDOWN);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct loop *lp = arg;
    while (lp->reap != NULL) {
        struct session *s = lp->reap;
        lp->reap = s->reap_next;
        session_free(s);
    }
}

/* Close every session now, and drop what twice's own Redis connections
 * still had to send.  Not called from a session's callback: the sessions
 * are freed here. */
static void close_everything(struct loop *lp)
{
    close_sessions(lp);
    on_reap(-1, 0, lp);
    resp_aux_free_all(lp);
}

/* The main loop ends once it is done and every worker has ended. */
static void main_maybe_done(struct proxy *px)
{
    struct loop *lp0 = &px->loops[0];
    if (lp0->stopping && atomic_load(&lp0->n_sessions) == 0 && lp0->aux == NULL &&
        atomic_load(&px->loops_running) == 0)
        event_base_loopexit(lp0->base, NULL);
}

/* A stopping loop with no session and no pending Redis command ends. */
static void maybe_done(struct loop *lp)
{
    if (!lp->stopping || atomic_load(&lp->n_sessions) != 0 || lp->aux != NULL)
        return;
    if (lp->index == 0)
        main_maybe_done(lp->px);
    else
        event_base_loopexit(lp->base, NULL); /* loop_main tells loop 0 */
}

static void handle(struct loop *lp, struct loop_msg *m)
{
    switch (m->kind) {
    case MSG_ACCEPT:
        session_accept(lp, m->listener, m->cfg, m->fd, (struct sockaddr *)&m->sa, m->salen, m->sid);
        lconf_put(m->cfg);
        listener_put(m->listener);
        break;
    case MSG_RULES:
        set_rules(lp, m->rules);
        break;
    case MSG_TOXICS:
        listener_sessions(lp, m->listener, m->close);
        listener_put(m->listener);
        break;
    }
    free(m);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct loop *lp = arg;
    uint64_t n;
    (void)!read(fd, &n, sizeof(n));
    /* Flags first: what was posted before a flag was raised is in the inbox
     * taken below. */
    bool stop = atomic_exchange(&lp->stop_flag, false);
    bool close_all = atomic_exchange(&lp->close_flag, false);
    pthread_mutex_lock(&lp->lock);
    struct loop_msg *m = lp->inbox;
    lp->inbox = NULL;
    lp->inbox_tail = &lp->inbox;
    pthread_mutex_unlock(&lp->lock);
    while (m != NULL) {
        struct loop_msg *next = m->next;
        handle(lp, m);
        m = next;
    }
    if (close_all)
        close_everything(lp);
    if (stop && !lp->stopping) {
        lp->stopping = true;
        drain_loop_stopping(lp);
    }
    drain_loop_wake(lp);
    maybe_done(lp); /* also: loop 0 woken by a worker that ended */
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    session_flush_all(arg);
}

static void on_janitor(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct loop *lp = arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    struct timeval now = {.tv_sec = ts.tv_sec, .tv_usec = ts.tv_nsec / 1000};
    for (struct session *s = lp->sessions; s != NULL; s = s->next)
        session_tick(s, &now);
    drain_loop_tick(lp);
}

int loop_init(struct loop *lp, struct proxy *px, unsigned index)
{
    memset(lp, 0, sizeof(*lp));
    lp->px = px;
    lp->index = index;
    lp->wake_fd = -1;
    lp->inbox_tail = &lp->inbox;
    pthread_mutex_init(&lp->lock, NULL);
    struct event_config *cfg = event_config_new();
    if (cfg == NULL)
        return -1;
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
    lp->base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (lp->base == NULL)
        return -1;
    struct timeval second = {.tv_sec = 1, .tv_usec = 0};
    lp->reaper = event_new(lp->base, -1, 0, on_reap, lp);
    lp->flush_tail = &lp->flush_list;
    lp->flusher = event_new(lp->base, -1, 0, on_flush, lp);
    lp->janitor = event_new(lp->base, -1, EV_PERSIST, on_janitor, lp);
    lp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (lp->wake_fd >= 0)
        lp->wake = event_new(lp->base, lp->wake_fd, EV_READ | EV_PERSIST, on_wake, lp);
    if (lp->reaper == NULL || lp->flusher == NULL || lp->janitor == NULL || lp->wake == NULL ||
        event_add(lp->janitor, &second) != 0 || event_add(lp->wake, NULL) != 0)
        return -1;
    if (drain_loop_init(lp) != 0)
        return -1;
    lp->dns = evdns_base_new(lp->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    if (lp->dns == NULL)
        lp->dns = evdns_base_new(lp->base, 0);
    return 0;
}

static void *loop_main(void *arg)
{
    struct loop *lp = arg;
    if (event_base_dispatch(lp->base) < 0)
        log_msg(LOG_ERROR, "event loop failed", "loop=%u", lp->index);
    blockcache_drain(); /* its sessions' chains are freed by the main thread */
    drain_loop_ended(lp);
    atomic_fetch_sub(&lp->px->loops_running, 1);
    loop_wake(&lp->px->loops[0]);
    return NULL;
}

int loop_start(struct loop *lp)
{
    int rc = pthread_create(&lp->thread, NULL, loop_main, lp);
    if (rc != 0) {
        log_msg(LOG_ERROR, "cannot start thread", "loop=%u error=\"%s\"", lp->index, strerror(rc));
        return -1;
    }
    lp->thread_started = true;
    atomic_fetch_add(&lp->px->loops_running, 1);
    return 0;
}

void loop_accept(struct proxy *px, struct listener *l, evutil_socket_t fd,
                 const struct sockaddr *sa, int salen)
{
    struct loop *lp = &px->loops[px->next_loop];
    px->next_loop = (px->next_loop + 1) % px->n_loops;
    uint64_t sid = ++px->next_session_id;
    if (lp->index == 0 || !lp->thread_started) {
        session_accept(&px->loops[0], l, l->cfg, fd, sa, salen, sid);
        return;
    }
    struct loop_msg *m = calloc(1, sizeof(*m));
    if (m == NULL || (size_t)salen > sizeof(m->sa)) {
        log_msg(LOG_ERROR, m == NULL ? "out of memory" : "address too long", "listener=%s",
                l->cfg->l->name);
        free(m);
        evutil_closesocket(fd);
        return;
    }
    m->kind = MSG_ACCEPT;
    m->sid = sid;
    m->fd = fd;
    memcpy(&m->sa, sa, (size_t)salen);
    m->salen = salen;
    m->listener = l;
    atomic_fetch_add(&l->refs, 1);
    m->cfg = l->cfg;
    lconf_get(m->cfg);
    post(lp, m);
}

void loop_set_rules_all(struct proxy *px, struct ruleset *rs)
{
    for (unsigned i = 0; i < px->n_loops; i++) {
        struct loop *lp = &px->loops[i];
        ruleset_get(rs);
        if (i == 0 || !lp->thread_started) {
            set_rules(lp, rs);
            continue;
        }
        struct loop_msg *m = calloc(1, sizeof(*m));
        if (m == NULL) {
            /* The loop keeps its rules until the next change. */
            log_msg(LOG_ERROR, "out of memory: a loop keeps its previous rules", "loop=%u", i);
            ruleset_put(rs);
            continue;
        }
        m->kind = MSG_RULES;
        m->rules = rs;
        post(lp, m);
    }
}

void loop_listener_sessions_all(struct proxy *px, struct listener *l, bool close)
{
    for (unsigned i = 0; i < px->n_loops; i++) {
        struct loop *lp = &px->loops[i];
        if (i == 0 || !lp->thread_started) {
            listener_sessions(lp, l, close);
            continue;
        }
        struct loop_msg *m = calloc(1, sizeof(*m));
        if (m == NULL) {
            log_msg(LOG_ERROR, "out of memory: a loop's sessions keep their toxics", "loop=%u", i);
            continue;
        }
        m->kind = MSG_TOXICS;
        m->listener = l;
        atomic_fetch_add(&l->refs, 1);
        m->close = close;
        post(lp, m);
    }
}

void loop_close_all(struct proxy *px)
{
    for (unsigned i = 1; i < px->n_loops; i++)
        if (px->loops[i].thread_started)
            raise_flag(&px->loops[i], &px->loops[i].close_flag);
    close_everything(&px->loops[0]);
    maybe_done(&px->loops[0]);
}

void loop_shutdown_all(struct proxy *px)
{
    for (unsigned i = 1; i < px->n_loops; i++)
        if (px->loops[i].thread_started)
            raise_flag(&px->loops[i], &px->loops[i].stop_flag);
    px->loops[0].stopping = true;
    drain_loop_stopping(&px->loops[0]);
    maybe_done(&px->loops[0]);
}

void loop_aux_gone(struct loop *lp)
{
    maybe_done(lp);
}

static void free_event(struct event **ev)
{
    if (*ev != NULL) {
        event_free(*ev);
        *ev = NULL;
    }
}

/* Ask every worker to end now and wait for it. */
static void join_workers(struct proxy *px)
{
    for (unsigned i = 1; i < px->n_loops; i++) {
        struct loop *lp = &px->loops[i];
        if (!lp->thread_started)
            continue;
        /* A loop still running (the main loop failed) is told to close
         * everything and stop; one that ended ignores it. */
        atomic_store(&lp->close_flag, true);
        raise_flag(lp, &lp->stop_flag);
    }
    for (unsigned i = 1; i < px->n_loops; i++) {
        struct loop *lp = &px->loops[i];
        if (!lp->thread_started)
            continue;
        pthread_join(lp->thread, NULL);
        lp->thread_started = false;
    }
}

void loop_free_all(struct proxy *px)
{
    if (px->loops == NULL)
        return;
    join_workers(px);
    /* What is left is freed here, on the main thread: every loop's thread
     * has ended.  Sessions first (a loop that is not stopping posts nothing
     * when its last session goes), then the messages nobody read. */
    for (unsigned i = 0; i < px->n_loops; i++) {
        struct loop *lp = &px->loops[i];
        if (lp->base == NULL)
            continue;
        lp->stopping = false;
        close_everything(lp);
    }
    for (unsigned i = 0; i < px->n_loops; i++) {
        struct loop *lp = &px->loops[i];
        if (lp->base == NULL) {
            pthread_mutex_destroy(&lp->lock);
            continue;
        }
        struct loop_msg *m = lp->inbox;
        lp->inbox = NULL;
        while (m != NULL) {
            struct loop_msg *next = m->next;
            msg_discard(m);
            m = next;
        }
        set_rules(lp, NULL);
        free_event(&lp->reaper);
        free_event(&lp->flusher);
        free_event(&lp->janitor);
        free_event(&lp->wake);
        drain_loop_free(lp);
        if (lp->dns != NULL)
            evdns_base_free(lp->dns, 0);
        event_base_free(lp->base);
        if (lp->wake_fd >= 0)
            close(lp->wake_fd);
        pthread_mutex_destroy(&lp->lock);
    }
    free(px->loops);
    px->loops = NULL;
    px->n_loops = 0;
    blockcache_drain();
}

unsigned proxy_sessions(const struct proxy *px)
{
    unsigned n = 0;
    for (unsigned i = 0; i < px->n_loops; i++)
        n += atomic_load(&px->loops[i].n_sessions);
    return n;
}

uint64_t proxy_events(const struct proxy *px, unsigned e)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < px->n_loops; i++)
        n += stat_get(&px->loops[i].events[e]);
    return n;
}

void proxy_session_gone(struct loop *lp)
{
    atomic_fetch_sub(&lp->n_sessions, 1);
    maybe_done(lp);
}
