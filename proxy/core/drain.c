/*
 * drain.c - the work twice holds back or has scheduled, and POST /drain.  See drain.h.
 *
 * Counting is by walking, not by keeping a gauge up to date at every hold and release: each
 * loop walks its sessions (the codec's pending op) and its own Redis connections, so a count
 * cannot drift, whatever path a message took out of a hold.  The loop publishes per listener
 * name and in total (single writer, relaxed stores, as the other counters); the main thread
 * sums.  A drain is a generation number: the main thread raises it on every loop and wakes it;
 * a loop that sees a new one releases what its sessions hold (the codec's drain op), counts,
 * and then says it has seen that generation.  POST /drain is answered once every loop has seen
 * its generation and counts nothing, so a count from before the drain never answers it.
 */
#include "proxy/core/drain.h"

#include <event2/event.h>
#include <event2/keyvalq_struct.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offline/json_out.h"
#include "proxy/api/admin.h"
#include "proxy/core/log.h"
#include "proxy/core/proxy.h"
#include "proxy/core/rule_changes.h"
#include "proxy/net/codec.h"
#include "proxy/net/session.h"
#include "proxy/resp/resp_aux.h"
#include "rules/engine.h"

static const char *const kind_names[DRAIN_KINDS] = {"held_acks", "late_copies", "held_messages",
                                                    "scheduled_commands"};

/* A loop's drain state (lp->drain).  `total`, `want`, `seen` and `ended` are read by the main
 * thread; the rest is the loop's. */
struct loop_drain {
    _Alignas(64) uint64_t total; /* what the loop counted last, all kinds and listeners */
    atomic_uint want;            /* the drain the main thread asked for last */
    atomic_uint seen;            /* the last drain the loop carried out and counted */
    atomic_bool ended;           /* the loop's thread has ended */
    struct event *timer;         /* every DRAIN_CHECK_MS while draining or stopping */
    /* Listener counters this loop has published to (they are zeroed before each count). */
    struct listener_stats **touched;
    size_t n_touched, cap_touched;
};

static void store(uint64_t *c, uint64_t v)
{
    __atomic_store_n(c, v, __ATOMIC_RELAXED);
}

/* ---- counting, on a loop ---------------------------------------------------------------- */

struct count {
    struct loop *lp;
    uint64_t total;
    struct listener_stats *last; /* the last one added to: sessions come in runs of one */
};

/* Whether st is among the counters the loop publishes to (added if not).  False when there
 * is no room for it (its counts then reach the total only). */
static bool touch(struct loop_drain *d, struct listener_stats *st)
{
    for (size_t i = 0; i < d->n_touched; i++)
        if (d->touched[i] == st)
            return true;
    if (d->n_touched == d->cap_touched) {
        size_t cap = d->cap_touched != 0 ? 2 * d->cap_touched : 8;
        struct listener_stats **v = realloc(d->touched, cap * sizeof(*v));
        if (v == NULL)
            return false;
        d->touched = v;
        d->cap_touched = cap;
    }
    d->touched[d->n_touched++] = st;
    return true;
}

static void add(struct count *c, struct listener_stats *st, const uint64_t v[DRAIN_KINDS])
{
    for (int k = 0; k < DRAIN_KINDS; k++)
        c->total += v[k];
    if (st == NULL || st->pending == NULL)
        return;
    if (st != c->last && !touch(c->lp->drain, st))
        return;
    c->last = st;
    for (int k = 0; k < DRAIN_KINDS; k++)
        st->pending[c->lp->index].sum[k] += v[k];
}

static void add_aux(void *arg, struct listener_stats *st, size_t commands)
{
    const uint64_t v[DRAIN_KINDS] = {[DRAIN_SCHEDULED_COMMANDS] = commands};
    add(arg, st, v);
}

/* Counts what the loop's sessions and Redis connections hold, and publishes it. */
static void count_loop(struct loop *lp)
{
    struct loop_drain *d = lp->drain;
    for (size_t i = 0; i < d->n_touched; i++)
        memset(d->touched[i]->pending[lp->index].sum, 0, sizeof(uint64_t) * DRAIN_KINDS);
    struct count c = {.lp = lp};
    for (struct session *s = lp->sessions; s != NULL; s = s->next) {
        if (s->state != SESSION_RELAYING || s->codec == NULL || s->codec->pending == NULL)
            continue;
        struct codec_pending p = {0};
        s->codec->pending(s->codec_state, &p);
        const uint64_t v[DRAIN_KINDS] = {p.held_acks, p.late_copies, p.held_messages, 0};
        add(&c, s->listener != NULL ? s->listener->stats : NULL, v);
    }
    resp_aux_each_pending(lp, add_aux, &c);
    for (size_t i = 0; i < d->n_touched; i++) {
        struct listener_pending *p = &d->touched[i]->pending[lp->index];
        for (int k = 0; k < DRAIN_KINDS; k++)
            store(&p->now[k], p->sum[k]);
    }
    store(&d->total, c.total);
}

/* Every session lets go of what a rule only delays (codec.h's drain op); said once per loop. */
static void release_all(struct loop *lp)
{
    struct codec_pending rel = {0};
    for (struct session *s = lp->sessions; s != NULL; s = s->next)
        if (s->state == SESSION_RELAYING && s->codec != NULL && s->codec->drain != NULL)
            s->codec->drain(s->codec_state, &rel); /* may close it: s stays linked */
    if (rel.held_acks + rel.held_messages > 0)
        log_msg(LOG_INFO, "drain released", "loop=%u held_acks=%llu held_messages=%llu", lp->index,
                (unsigned long long)rel.held_acks, (unsigned long long)rel.held_messages);
}

/* Shutdown: a session with no message under way is closed now rather than at the grace's end. */
static void close_quiet(struct loop *lp)
{
    for (struct session *s = lp->sessions; s != NULL; s = s->next)
        if (session_quiet(s))
            session_close(s, SESSION_CLOSE_SHUTDOWN);
}

static void arm(struct loop_drain *d)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = DRAIN_CHECK_MS * 1000};
    evtimer_add(d->timer, &tv);
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct loop *lp = arg;
    struct loop_drain *d = lp->drain;
    if (lp->stopping)
        close_quiet(lp);
    count_loop(lp);
    if (lp->stopping ? lp->sessions != NULL : stat_get(&d->total) > 0)
        arm(d);
}

int drain_loop_init(struct loop *lp)
{
    struct loop_drain *d = aligned_alloc(_Alignof(struct loop_drain), sizeof(*d));
    if (d == NULL)
        return -1;
    memset(d, 0, sizeof(*d));
    d->timer = evtimer_new(lp->base, on_check, lp);
    if (d->timer == NULL) {
        free(d);
        return -1;
    }
    lp->drain = d;
    return 0;
}

void drain_loop_free(struct loop *lp)
{
    struct loop_drain *d = lp->drain;
    if (d == NULL)
        return;
    event_free(d->timer);
    free(d->touched);
    free(d);
    lp->drain = NULL;
}

void drain_loop_wake(struct loop *lp)
{
    struct loop_drain *d = lp->drain;
    unsigned want = atomic_load(&d->want);
    if (want == atomic_load(&d->seen))
        return;
    release_all(lp);
    count_loop(lp);
    atomic_store(&d->seen, want);
    if (stat_get(&d->total) > 0)
        arm(d);
}

void drain_loop_stopping(struct loop *lp)
{
    struct loop_drain *d = lp->drain;
    release_all(lp);
    close_quiet(lp);
    count_loop(lp);
    if (lp->sessions != NULL)
        arm(d);
}

void drain_loop_tick(struct loop *lp)
{
    count_loop(lp);
}

void drain_loop_ended(struct loop *lp)
{
    store(&lp->drain->total, 0);
    atomic_store(&lp->drain->ended, true);
}

/* ---- on the main thread ----------------------------------------------------------------- */

/* The drain asked for last. */
static unsigned drain_gen;

/* The loops that run: loop 0, and the workers whose thread started. */
static bool loop_runs(const struct proxy *px, unsigned i)
{
    return i == 0 || px->loops[i].thread_started;
}

void drain_ask_loops(struct proxy *px)
{
    drain_gen++;
    for (unsigned i = 0; i < px->n_loops; i++) {
        if (!loop_runs(px, i))
            continue;
        atomic_store(&px->loops[i].drain->want, drain_gen);
        loop_wake(&px->loops[i]);
    }
}

/* Whether every loop has carried out drain `gen` (or a later one) and counts nothing. */
static bool drained(const struct proxy *px, unsigned gen)
{
    for (unsigned i = 0; i < px->n_loops; i++) {
        if (!loop_runs(px, i))
            continue;
        struct loop_drain *d = px->loops[i].drain;
        if (atomic_load(&d->ended))
            continue;
        if ((int)(atomic_load(&d->seen) - gen) < 0 || stat_get(&d->total) > 0)
            return false;
    }
    return true;
}

/* The counts of listener st summed over the loops, into v. */
static void listener_sum(const struct proxy *px, const struct listener_stats *st,
                         uint64_t v[DRAIN_KINDS])
{
    memset(v, 0, sizeof(uint64_t) * DRAIN_KINDS);
    for (unsigned i = 0; st->pending != NULL && i < px->n_loops; i++)
        for (int k = 0; k < DRAIN_KINDS; k++)
            v[k] += stat_get(&st->pending[i].now[k]);
}

static void put_evbuffer(void *ctx, const char *p, size_t n)
{
    evbuffer_add(ctx, p, n);
}

static void counts_json(struct evbuffer *b, const uint64_t v[DRAIN_KINDS])
{
    for (int k = 0; k < DRAIN_KINDS; k++)
        evbuffer_add_printf(b, "%s\"%s\":%llu", k ? "," : "", kind_names[k],
                            (unsigned long long)v[k]);
}

/* {"total":N,"held_acks":N,...,"listeners":{"NAME":{"held_acks":N,...},...}} */
static void pending_json(const struct proxy *px, struct evbuffer *b)
{
    uint64_t all[DRAIN_KINDS] = {0}, total = 0;
    struct evbuffer *per = evbuffer_new();
    for (const struct listener_stats *st = px->stats; st != NULL; st = st->next) {
        uint64_t v[DRAIN_KINDS];
        listener_sum(px, st, v);
        for (int k = 0; k < DRAIN_KINDS; k++) {
            all[k] += v[k];
            total += v[k];
        }
        if (per == NULL)
            continue;
        if (evbuffer_get_length(per) > 0)
            evbuffer_add(per, ",", 1);
        json_quote(st->name, put_evbuffer, per);
        evbuffer_add(per, ":{", 2);
        counts_json(per, v);
        evbuffer_add(per, "}", 1);
    }
    evbuffer_add_printf(b, "{\"total\":%llu,", (unsigned long long)total);
    counts_json(b, all);
    evbuffer_add(b, ",\"listeners\":{", 14);
    if (per != NULL) {
        evbuffer_add_buffer(b, per);
        evbuffer_free(per);
    }
    evbuffer_add(b, "}}", 2);
}

void drain_stats_json(struct proxy *px, struct evbuffer *b)
{
    evbuffer_add(b, "\"pending\":", 10);
    pending_json(px, b);
    evbuffer_add(b, ",", 1);
}

void drain_metrics(struct proxy *px, struct evbuffer *b)
{
    evbuffer_add_printf(b, "# HELP twice_pending What twice holds back or has scheduled (what "
                           "POST /drain waits for), per listener and kind.\n"
                           "# TYPE twice_pending gauge\n");
    for (const struct listener_stats *st = px->stats; st != NULL; st = st->next) {
        uint64_t v[DRAIN_KINDS];
        listener_sum(px, st, v);
        for (int k = 0; k < DRAIN_KINDS; k++) {
            evbuffer_add(b, "twice_pending{listener=\"", 24);
            admin_prom_label(b, st->name);
            evbuffer_add_printf(b, "\",kind=\"%s\"} %llu\n", kind_names[k],
                                (unsigned long long)v[k]);
        }
    }
}

/* ---- POST /drain -------------------------------------------------------------------------- */

/* A request waiting for drain `gen`.  req is NULL once its connection was freed with it. */
struct drain_waiter {
    struct proxy *px;
    struct evhttp_request *req;
    unsigned gen;
    uint64_t start_ms, deadline_ms;
    struct event *timer;
    struct drain_waiter *next;
};

static struct drain_waiter *waiters;

static void waiter_free(struct drain_waiter *w)
{
    for (struct drain_waiter **pp = &waiters; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    if (w->timer != NULL)
        event_free(w->timer);
    free(w);
}

static void reply(struct evhttp_request *req, int code, const char *type, struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Cache-Control", "no-store");
    evhttp_send_reply(req, code, code == 200 ? "OK" : NULL, body);
}

/* Answers w's request with the counts as they stand (code 200: drained), and frees w.  A
 * request whose client left is freed by the reply (evhttp). */
static void waiter_answer(struct drain_waiter *w, int code, const char *error)
{
    struct proxy *px = w->px;
    uint64_t waited = proxy_now_ms() - w->start_ms;
    if (w->req != NULL) {
        struct evhttp_connection *evcon = evhttp_request_get_connection(w->req);
        if (evcon != NULL)
            evhttp_connection_set_closecb(evcon, NULL, NULL);
        struct evbuffer *b = evbuffer_new();
        if (b == NULL) {
            evhttp_send_error(w->req, 500, NULL);
        } else {
            evbuffer_add_printf(
                b, "{\"drained\":%s,\"faults_enabled\":%s,\"waited_ms\":%llu,\"pending\":",
                code == 200 ? "true" : "false",
                px->rules != NULL && ruleset_faults_enabled(px->rules) ? "true" : "false",
                (unsigned long long)waited);
            pending_json(px, b);
            if (error != NULL)
                evbuffer_add_printf(b, ",\"error\":\"%s\"", error);
            evbuffer_add_printf(b, ",\"resume\":\"POST /faults/on\"}\n");
            reply(w->req, code, "application/json", b);
            evbuffer_free(b);
        }
    }
    waiter_free(w);
}

static void on_wait(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct drain_waiter *w = arg;
    if (w->req == NULL) {
        waiter_free(w); /* its client is gone, and the request with it */
        return;
    }
    uint64_t now = proxy_now_ms();
    if (drained(w->px, w->gen)) {
        log_msg(LOG_INFO, "drained", "waited_ms=%llu", (unsigned long long)(now - w->start_ms));
        waiter_answer(w, 200, NULL);
        return;
    }
    if (now >= w->deadline_ms) {
        uint64_t total = 0;
        for (unsigned i = 0; i < w->px->n_loops; i++)
            if (loop_runs(w->px, i))
                total += stat_get(&w->px->loops[i].drain->total);
        log_msg(LOG_WARN, "drain timed out", "waited_ms=%llu pending=%llu",
                (unsigned long long)(now - w->start_ms), (unsigned long long)total);
        waiter_answer(w, 504, "still pending at the timeout");
        return;
    }
    struct timeval tv = {.tv_sec = 0, .tv_usec = DRAIN_CHECK_MS * 1000};
    evtimer_add(w->timer, &tv);
}

/* The request's connection goes away.  When the request goes with it (the admin API moved or
 * stopped), it must not be answered; when the client only left, evhttp has let go of the
 * request (it has no connection any more), and the answer frees it. */
static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    struct drain_waiter *w = arg;
    if (w->req != NULL && evhttp_request_get_connection(w->req) == evcon)
        w->req = NULL;
}

/* ?timeout=D: a number of ms, s or m (s when it has no unit), at most DRAIN_MAX_TIMEOUT_MS.
 * 0, or -1 when it does not read. */
static int parse_timeout(struct evhttp_request *req, uint32_t *ms)
{
    *ms = DRAIN_DEFAULT_TIMEOUT_MS;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *query = uri != NULL ? evhttp_uri_get_query(uri) : NULL;
    if (query == NULL)
        return 0;
    struct evkeyvalq params;
    if (evhttp_parse_query_str(query, &params) != 0)
        return -1;
    const char *v = evhttp_find_header(&params, "timeout");
    int rc = 0;
    if (v != NULL) {
        char *end = NULL;
        unsigned long long n = strtoull(v, &end, 10);
        unsigned long long scale = strcmp(end, "ms") == 0                          ? 1
                                   : strcmp(end, "s") == 0 || strcmp(end, "") == 0 ? 1000
                                   : strcmp(end, "m") == 0                         ? 60000
                                                                                   : 0;
        if (end == v || v[0] == '-' || scale == 0 || n > DRAIN_MAX_TIMEOUT_MS / scale)
            rc = -1;
        else
            *ms = (uint32_t)(n * scale);
    }
    evhttp_clear_headers(&params);
    return rc;
}

void drain_request(struct proxy *px, struct evhttp_request *req)
{
    uint32_t timeout = 0;
    if (parse_timeout(req, &timeout) != 0) {
        struct evbuffer *b = evbuffer_new();
        if (b != NULL)
            evbuffer_add_printf(b, "bad timeout: use ?timeout=30s (a number of ms, s or m, at "
                                   "most 3600s)\n");
        reply(req, 400, "text/plain; charset=utf-8", b);
        if (b != NULL)
            evbuffer_free(b);
        return;
    }
    struct drain_waiter *w = calloc(1, sizeof(*w));
    if (w == NULL || (w->timer = evtimer_new(px->base, on_wait, w)) == NULL) {
        free(w);
        evhttp_send_error(req, 500, NULL);
        return;
    }
    /* New faults stop first: nothing is held after the loops released what they hold. */
    if (px->rules != NULL)
        ruleset_set_faults_enabled(px->rules, false);
    rule_changes_admin(px, req, JOURNAL_CHANGE_FAULTS_OFF, NULL);
    log_msg(LOG_WARN, "draining", "source=admin faults=off timeout_ms=%u", timeout);
    drain_ask_loops(px);
    w->px = px;
    w->req = req;
    w->gen = drain_gen;
    w->start_ms = proxy_now_ms();
    w->deadline_ms = w->start_ms + timeout;
    w->next = waiters;
    waiters = w;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    if (evcon != NULL)
        evhttp_connection_set_closecb(evcon, on_conn_close, w);
    struct timeval tv = {.tv_sec = 0, .tv_usec = DRAIN_CHECK_MS * 1000};
    evtimer_add(w->timer, &tv);
}

void drain_stop(struct proxy *px)
{
    (void)px;
    while (waiters != NULL)
        waiter_answer(waiters, 503, "twice is stopping");
}
