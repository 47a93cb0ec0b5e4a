/*
 * redis_jobs.c - a job-queue load on Redis, shaped like Sidekiq and Celery workers, for twice's
 * benchmarks (bench/run.py).
 *
 * K producer connections LPUSH small JSON jobs onto one list; L consumer connections each
 * BRPOP a job, then send a "done" command (INCR of a counter, standing for the bookkeeping a
 * worker does after a job), then BRPOP again: one job at a time per connection, as a Sidekiq
 * processor or a Celery worker process.  Prints one JSON line on stdout (the same fields as
 * amqp_load); exits 0 when every job was popped.
 *
 *   redis_jobs --addr 127.0.0.1:6379 --producers 2 --consumers 8 --count 100000
 *
 * The job is one JSON object both of twice's list profiles read: Sidekiq's fields (jid, class,
 * queue, args) and kombu's (headers.id, headers.task, properties.delivery_tag), so that one
 * byte stream goes to every target, and a `protocol resp` listener with `profile sidekiq` or
 * `profile celery` sees a publish per LPUSH and a delivery per BRPOP.  The key defaults to
 * Sidekiq's `queue:NAME`.  The send time and a run-wide number lead the object
 * ({"bench_seq":N,"bench_ns":T,...}): consumers read them from the first bytes of the value,
 * tell first deliveries from copies (twice's `duplicate` pushes the same bytes again), and
 * compute the end-to-end latency.
 *
 * Flow control as in amqp_load: at most `inflight` jobs pushed and not yet popped (closed
 * loop), or `rate` jobs per second (open loop); each producer keeps at most `window` LPUSHes
 * unanswered (1 by default: an application pushing a job waits for Redis's reply).
 *
 * Single-threaded, one libevent loop.  Workers are freed when the run ends (libevent defers
 * the free of a bufferevent whose callback is running), the control connection at exit.
 */
#define _GNU_SOURCE
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loadgen.h"

/* Longest reply line (status, error, integer, array or bulk header) we accept. */
#define LINE_MAX_LEN 512u
/* Bytes of a popped job read for its number and send time; the rest is skipped unread. */
#define HEAD_LEN 96u
/* Largest job accepted in a reply: Redis's own bulk limit. */
#define BULK_MAX (512ull << 20)
/* Seconds a BRPOP blocks before Redis answers nil and the consumer asks again. */
#define BRPOP_TIMEOUT "1"
#define CLOSE_GRACE_MS 2000

struct options {
    const char *addr;
    struct sockaddr_in sin;
    unsigned producers, consumers, window;
    uint64_t size;           /* JSON bytes per job, at least the fixed fields */
    struct lg_budget budget; /* count or duration, inflight, rate, timeout */
    const char *key;         /* the list */
    const char *done_key;    /* the counter consumers INCR */
};

enum role { ROLE_CONTROL, ROLE_PRODUCER, ROLE_CONSUMER };

/* Changed only by conn_set_state(). */
enum conn_state {
    CS_CONNECTING,
    CS_READY,   /* connected (control: the keys are deleted) */
    CS_POPPING, /* consumer: BRPOP sent */
    CS_DONE,    /* consumer: the done command sent */
    CS_CLOSED,
};

struct conn {
    struct bufferevent *bev;
    enum role role;
    enum conn_state state;
    unsigned index;
    unsigned outstanding; /* producer: LPUSHes not answered yet */
};

struct run {
    struct options opt;
    struct event_base *base;
    struct conn control;
    struct conn *workers; /* producers first, then consumers */
    unsigned nworkers, ready;
    struct event *tick, *kick, *deadline;
    bool kick_pending, publishing_over, finishing;
    uint64_t t_start;
    uint32_t run_id; /* in job ids, so that ids never repeat across runs of one twice */
    char *job;       /* one job, rewritten per push */
    size_t pad;      /* bytes of padding in args[0] to reach opt.size */
    struct lg_result res;
    struct lg_seen seen;
    char error[256];
};

static struct run g;

static void finish(const char *error);
static void pump_all(void);

/* ---- commands -------------------------------------------------------------------------------- */

/* Appends a RESP array of bulk strings: argv[i] of lens[i] bytes. */
static void send_command(struct conn *c, int argc, const char **argv, const size_t *lens)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        evbuffer_add_printf(out, "$%zu\r\n", lens[i]);
        evbuffer_add(out, argv[i], lens[i]);
        evbuffer_add(out, "\r\n", 2);
    }
}

static void send_words(struct conn *c, int argc, const char **argv)
{
    size_t lens[4];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    send_command(c, argc, argv, lens);
}

/* Writes job number seq into g.job; returns its length.  The queue name is the key without
 * Sidekiq's "queue:" prefix, as Sidekiq writes it in the job. */
static size_t job_format(uint64_t seq, uint64_t now)
{
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    double t = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    const char *queue = strncmp(g.opt.key, "queue:", 6) == 0 ? g.opt.key + 6 : g.opt.key;
    unsigned long long s = (unsigned long long)seq;
    int n = snprintf(
        g.job, g.opt.size + 1,
        "{\"bench_seq\":%llu,\"bench_ns\":%llu,\"class\":\"BenchJob\",\"queue\":\"%s\","
        "\"jid\":\"%08x%016llx\",\"retry\":true,\"created_at\":%.3f,"
        "\"enqueued_at\":%.3f,\"headers\":{\"id\":\"%08x-%llu\",\"task\":"
        "\"bench.job\"},\"properties\":{\"delivery_tag\":\"%08x-%llu\","
        "\"delivery_info\":{\"exchange\":\"\",\"routing_key\":\"%s\"}},"
        "\"args\":[\"",
        s, (unsigned long long)now, queue, g.run_id, s, t, t, g.run_id, s, g.run_id, s, queue);
    size_t len = (size_t)n;
    /* Pad args[0] so that every job has the same size whatever the digits took. */
    size_t pad = g.opt.size > len + 3 ? (size_t)g.opt.size - len - 3 : 1;
    memset(g.job + len, 'x', pad);
    memcpy(g.job + len + pad, "\"]}", 3);
    return len + pad + 3;
}

static void push_one(struct conn *c)
{
    uint64_t seq = g.res.sent++;
    uint64_t now = lg_now_ns();
    if (seq == 0)
        g.res.t_first_send = now;
    g.res.t_last_send = now;
    size_t n = job_format(seq, now);
    const char *argv[] = {"LPUSH", g.opt.key, g.job};
    size_t lens[] = {5, strlen(g.opt.key), n};
    send_command(c, 3, argv, lens);
    c->outstanding++;
}

static void pop_one(struct conn *c)
{
    const char *argv[] = {"BRPOP", g.opt.key, BRPOP_TIMEOUT};
    send_words(c, 3, argv);
}

/* ---- replies --------------------------------------------------------------------------------- */

/* What this client needs of one reply. */
struct reply {
    char type;                  /* ':' '+' '-' , 'j' (a popped job), 'n' (nil) */
    long long num;              /* ':' */
    char text[LINE_MAX_LEN];    /* '-' and '+' */
    uint8_t head[HEAD_LEN + 1]; /* 'j': the first bytes of the job, NUL-terminated */
    size_t total;               /* bytes of the whole reply in the buffer */
};

/* Reads the CRLF-terminated line at *pos into line; moves *pos past it.  Returns its length,
 * -2 when the line is not all there yet, -1 when it is too long. */
static long peek_line(struct evbuffer *in, struct evbuffer_ptr *pos, char *line)
{
    size_t eol_len;
    struct evbuffer_ptr e = evbuffer_search_eol(in, pos, &eol_len, EVBUFFER_EOL_CRLF_STRICT);
    if (e.pos < 0)
        return evbuffer_get_length(in) - (size_t)pos->pos > LINE_MAX_LEN ? -1 : -2;
    size_t n = (size_t)(e.pos - pos->pos);
    if (n >= LINE_MAX_LEN)
        return -1;
    evbuffer_copyout_from(in, pos, line, n);
    line[n] = '\0';
    evbuffer_ptr_set(in, pos, (size_t)e.pos + 2, EVBUFFER_PTR_SET);
    return (long)n;
}

/* A bulk string at *pos ($LEN line and body): keeps its first HEAD_LEN bytes in head (if not
 * NULL) and moves *pos past it.  Same returns as peek_line, 1 when whole; a nil bulk is
 * returned as 0. */
static int peek_bulk(struct evbuffer *in, struct evbuffer_ptr *pos, uint8_t *head)
{
    char line[LINE_MAX_LEN];
    long n = peek_line(in, pos, line);
    if (n < 0)
        return (int)n;
    if (line[0] == '_' || strcmp(line, "$-1") == 0)
        return 0;
    char *end;
    unsigned long long len = strtoull(line + 1, &end, 10);
    if (line[0] != '$' || *end != '\0' || len > BULK_MAX)
        return -1;
    if (evbuffer_get_length(in) - (size_t)pos->pos < len + 2)
        return -2;
    if (head != NULL) {
        size_t k = len < HEAD_LEN ? (size_t)len : HEAD_LEN;
        evbuffer_copyout_from(in, pos, head, k);
        head[k] = '\0';
    }
    evbuffer_ptr_set(in, pos, (size_t)len + 2, EVBUFFER_PTR_ADD);
    return 1;
}

/* One whole reply at the start of in, not consumed.  Returns 1 (r filled), 0 (incomplete) or
 * -1 (a reply this client never asked for). */
static int reply_peek(struct evbuffer *in, struct reply *r)
{
    struct evbuffer_ptr pos;
    evbuffer_ptr_set(in, &pos, 0, EVBUFFER_PTR_SET);
    long n = peek_line(in, &pos, r->text);
    if (n == -2)
        return 0;
    if (n <= 0)
        return -1;
    r->type = r->text[0];
    if (r->type == ':')
        r->num = strtoll(r->text + 1, NULL, 10);
    else if (r->type == '_' || strcmp(r->text, "*-1") == 0)
        r->type = 'n';
    else if (strcmp(r->text, "*2") == 0) {
        int k = peek_bulk(in, &pos, NULL); /* the list's name */
        if (k == 1)
            k = peek_bulk(in, &pos, r->head);
        if (k < 0)
            return k == -2 ? 0 : -1;
        r->type = 'j';
    } else if (r->type != '+' && r->type != '-') {
        return -1;
    }
    r->total = (size_t)pos.pos;
    return 1;
}

/* ---- connection life ------------------------------------------------------------------------- */

static const char *role_name(const struct conn *c)
{
    return c->role == ROLE_CONTROL ? "control" : c->role == ROLE_PRODUCER ? "producer" : "consumer";
}

static void conn_set_state(struct conn *c, enum conn_state st)
{
    enum conn_state was = c->state;
    c->state = st;
    if (was == CS_CONNECTING && st != CS_CLOSED && c->role != ROLE_CONTROL &&
        ++g.ready == g.nworkers)
        pump_all(); /* everyone is connected: the clock starts with the first push */
    if (st == CS_CLOSED)
        bufferevent_disable(c->bev, EV_READ | EV_WRITE);
}

static void conn_fail(struct conn *c, const char *what)
{
    if (g.error[0] == '\0')
        snprintf(g.error, sizeof(g.error), "%s %u: %s", role_name(c), c->index, what);
    finish(g.error);
}

/* ---- pushing --------------------------------------------------------------------------------- */

static bool may_publish(void)
{
    if (g.publishing_over || g.finishing || g.nworkers == 0 || g.ready < g.nworkers)
        return false;
    return lg_budget_allows(&g.opt.budget, &g.res, &g.publishing_over);
}

/* Round-robin over the producers, one job each, while the budget lasts. */
static void pump_all(void)
{
    bool progress = true;
    while (progress && may_publish()) {
        progress = false;
        for (unsigned i = 0; i < g.opt.producers && may_publish(); i++) {
            struct conn *c = &g.workers[i];
            if (c->state == CS_READY && c->outstanding < g.opt.window) {
                push_one(c);
                progress = true;
            }
        }
    }
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    g.kick_pending = false;
    pump_all();
}

/* Pushes resume once the current read is handled: in batches, not one per reply. */
static void kick_producers(void)
{
    if (!g.kick_pending && !g.publishing_over) {
        g.kick_pending = true;
        event_active(g.kick, EV_TIMEOUT, 0);
    }
}

/* ---- popping --------------------------------------------------------------------------------- */

/* A popped job: its number and send time are the first two fields. */
static void job_popped(struct conn *c, const struct reply *r)
{
    uint64_t now = lg_now_ns();
    const char *s = strstr((const char *)r->head, "\"bench_seq\":");
    const char *t = strstr((const char *)r->head, "\"bench_ns\":");
    g.res.received++;
    if (s == NULL || t == NULL) {
        conn_fail(c, "popped a value that is not a bench job");
        return;
    }
    uint64_t seq = strtoull(s + 12, NULL, 10), sent_at = strtoull(t + 11, NULL, 10);
    if (sent_at <= now && seq < g.res.sent) {
        lg_hist_add(&g.res.lat, (now - sent_at) / 1000u);
        if (lg_seen_mark(&g.seen, seq)) {
            g.res.unique++;
            g.res.t_last_unique = now;
        }
    }
}

/* The consumer's turn: BRPOP -> job -> INCR -> BRPOP ... */
static void consumer_reply(struct conn *c, const struct reply *r)
{
    if (c->state == CS_POPPING && r->type == 'j') {
        job_popped(c, r);
        const char *argv[] = {"INCR", g.opt.done_key};
        send_words(c, 2, argv);
        conn_set_state(c, CS_DONE);
        if (g.publishing_over && g.res.unique >= g.res.sent)
            finish(NULL);
        else
            kick_producers();
    } else if ((c->state == CS_POPPING && r->type == 'n') ||
               (c->state == CS_DONE && r->type == ':')) {
        pop_one(c);
        conn_set_state(c, CS_POPPING);
    } else {
        conn_fail(c, r->type == '-' ? r->text : "unexpected reply");
    }
}

/* ---- the socket ------------------------------------------------------------------------------ */

static void start_workers(void);

static void on_reply(struct conn *c, const struct reply *r)
{
    if (r->type == '-') {
        conn_fail(c, r->text);
        return;
    }
    switch (c->role) {
    case ROLE_CONTROL: /* the DEL before the run, or the one after */
        if (g.finishing) {
            conn_set_state(c, CS_CLOSED);
            event_base_loopbreak(g.base);
        } else {
            conn_set_state(c, CS_READY);
            start_workers();
        }
        break;
    case ROLE_PRODUCER:
        if (r->type != ':' || c->outstanding == 0) {
            conn_fail(c, "unexpected reply to LPUSH");
            return;
        }
        c->outstanding--;
        pump_all();
        break;
    case ROLE_CONSUMER:
        consumer_reply(c, r);
        break;
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct reply r;
    while (c->state != CS_CLOSED) {
        int rc = reply_peek(in, &r);
        if (rc == 0)
            return;
        if (rc < 0) {
            conn_fail(c, "malformed reply");
            return;
        }
        evbuffer_drain(in, r.total);
        on_reply(c, &r);
    }
}

static void send_del(struct conn *c)
{
    const char *argv[] = {"DEL", g.opt.key, g.opt.done_key};
    send_words(c, 3, argv);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (c->role == ROLE_CONTROL) {
            send_del(c); /* READY at its reply */
        } else if (c->role == ROLE_CONSUMER) {
            pop_one(c);
            conn_set_state(c, CS_POPPING);
        } else {
            conn_set_state(c, CS_READY);
        }
        return;
    }
    char what_s[160];
    snprintf(what_s, sizeof(what_s), "connection %s: %s",
             what & BEV_EVENT_EOF ? "closed by the peer" : "failed",
             evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    conn_set_state(c, CS_CLOSED);
    if (c->role == ROLE_CONTROL && g.finishing)
        event_base_loopbreak(g.base);
    else if (!g.finishing)
        conn_fail(c, what_s);
}

static int conn_open(struct conn *c, enum role role, unsigned index)
{
    c->role = role;
    c->index = index;
    c->state = CS_CONNECTING;
    c->bev = bufferevent_socket_new(g.base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (c->bev == NULL)
        return -1;
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return bufferevent_socket_connect(c->bev, (struct sockaddr *)&g.opt.sin, sizeof(g.opt.sin));
}

static void start_workers(void)
{
    unsigned n = g.opt.producers + g.opt.consumers;
    g.workers = calloc(n, sizeof(*g.workers));
    if (g.workers == NULL) {
        finish("out of memory"); /* with no workers to close */
        return;
    }
    g.nworkers = n;
    for (unsigned i = 0; i < g.nworkers; i++) {
        enum role role = i < g.opt.producers ? ROLE_PRODUCER : ROLE_CONSUMER;
        if (conn_open(&g.workers[i], role, i) != 0) {
            conn_fail(&g.workers[i], "cannot connect");
            return;
        }
    }
}

/* ---- the end --------------------------------------------------------------------------------- */

/* Ends the run (the first call decides the outcome).  Workers are simply closed: a consumer
 * blocked in BRPOP has nothing to hand back.  The control deletes the keys, and its reply
 * ends the loop. */
static void finish(const char *error)
{
    if (g.finishing)
        return;
    g.finishing = true;
    g.publishing_over = true;
    g.res.error = error;
    g.res.complete = error == NULL && g.res.sent > 0 && g.res.unique >= g.res.sent;
    for (unsigned i = 0; i < g.nworkers; i++) {
        conn_set_state(&g.workers[i], CS_CLOSED);
        if (g.workers[i].bev != NULL) /* closes now: pending BRPOPs end */
            bufferevent_free(g.workers[i].bev);
        g.workers[i].bev = NULL;
    }
    struct timeval grace = {CLOSE_GRACE_MS / 1000, (CLOSE_GRACE_MS % 1000) * 1000};
    event_add(g.deadline, &grace);
    if (g.control.state == CS_READY)
        send_del(&g.control);
    else
        event_base_loopbreak(g.base);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    event_base_loopbreak(g.base);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    if (g.finishing)
        return;
    switch (lg_budget_tick(&g.opt.budget, &g.res, g.t_start, lg_now_ns(), &g.publishing_over)) {
    case LG_TICK_TIMEOUT:
        finish("timeout");
        break;
    case LG_TICK_DONE:
        finish(NULL);
        break;
    case LG_TICK_GOING:
        if (g.opt.budget.rate > 0)
            pump_all();
        break;
    }
}

/* ---- options and main ------------------------------------------------------------------------ */

static void parse_options(int argc, char **argv, struct options *o)
{
    static char key[64], done_key[128];
    snprintf(key, sizeof(key), "queue:bench-%d", (int)getpid());
    *o = (struct options){.producers = 2,
                          .consumers = 4,
                          .window = 1,
                          .size = 400,
                          .budget = {.inflight = 1000, .timeout = 60},
                          .key = key};
    const struct lg_opt opts[] = {
        {"addr", LG_STR, &o->addr, "IP:PORT of Redis or of the proxy (required)"},
        {"producers", LG_UINT, &o->producers, "K LPUSH connections (default 2)"},
        {"consumers", LG_UINT, &o->consumers, "L BRPOP + INCR connections (default 4)"},
        {"size", LG_SIZE, &o->size, "JSON bytes per job, >= 400 (default 400)"},
        {"window", LG_UINT, &o->window, "LPUSHes in flight per producer (default 1)"},
        {"count", LG_U64, &o->budget.count, "jobs to push (default 10000)"},
        {"duration", LG_DOUBLE, &o->budget.duration, "push for this many seconds instead"},
        {"inflight", LG_U64, &o->budget.inflight,
         "pushed and not yet popped, at most (default 1000)"},
        {"rate", LG_DOUBLE, &o->budget.rate, "jobs/s, all producers (default: as fast as allowed)"},
        {"key", LG_STR, &o->key, "the list (default queue:bench-PID): deleted before and after"},
        {"timeout", LG_DOUBLE, &o->budget.timeout, "give up after this many seconds (default 60)"},
    };
    size_t n = sizeof(opts) / sizeof(opts[0]);
    lg_parse_options(argc, argv, opts, n);
    lg_budget_settle(&o->budget, 10000);
    snprintf(done_key, sizeof(done_key), "%s:done", o->key);
    o->done_key = done_key;
    if (o->addr == NULL || !lg_parse_addr(o->addr, &o->sin) || o->producers == 0 ||
        o->consumers == 0 || o->window == 0 || o->size < 400 || o->size > BULK_MAX ||
        o->budget.inflight == 0 || strlen(o->key) > 100)
        lg_usage(argv[0], opts, n);
}

int main(int argc, char **argv)
{
    parse_options(argc, argv, &g.opt);
    g.run_id = (uint32_t)(lg_now_ns() ^ ((uint64_t)getpid() << 16));
    g.job = malloc(g.opt.size + 1);
    g.base = event_base_new();
    if (g.job == NULL || g.base == NULL) {
        fprintf(stderr, "redis_jobs: out of memory\n");
        return 2;
    }
    g.tick = event_new(g.base, -1, EV_PERSIST, on_tick, NULL);
    g.kick = event_new(g.base, -1, 0, on_kick, NULL);
    g.deadline = event_new(g.base, -1, 0, on_deadline, NULL);
    struct timeval tick = {0, g.opt.budget.rate > 0 ? 1000 : 20000};
    event_add(g.tick, &tick);
    g.t_start = lg_now_ns();
    if (conn_open(&g.control, ROLE_CONTROL, 0) != 0)
        finish("cannot connect");
    else
        event_base_dispatch(g.base);
    if (!g.finishing)
        g.res.error = "event loop ended early";

    printf("{\"tool\":\"redis_jobs\",\"addr\":\"%s\",\"key\":\"%s\",\"publishers\":%u,"
           "\"consumers\":%u,\"size\":%llu,\"window\":%u,\"inflight\":%llu,\"rate\":%.0f,",
           g.opt.addr, g.opt.key, g.opt.producers, g.opt.consumers, (unsigned long long)g.opt.size,
           g.opt.window, (unsigned long long)g.opt.budget.inflight, g.opt.budget.rate);
    lg_print_result(stdout, &g.res);
    fflush(stdout);

    for (unsigned i = 0; i < g.nworkers; i++)
        if (g.workers[i].bev != NULL)
            bufferevent_free(g.workers[i].bev);
    if (g.control.bev != NULL)
        bufferevent_free(g.control.bev);
    event_free(g.tick);
    event_free(g.kick);
    event_free(g.deadline);
    event_base_free(g.base);
    free(g.workers);
    free(g.job);
    free(g.seen.bits);
    return g.res.complete && g.res.error == NULL ? 0 : 1;
}
