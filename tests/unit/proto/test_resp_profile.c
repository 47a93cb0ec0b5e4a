/*
 * test_resp_profile.c - proto/resp/resp_profile.h: what the Redis job frameworks' commands and
 * replies mean, read from their own sessions.
 *
 *   - Golden sessions recorded from the real frameworks through a relay
 *     (tests/unit/data/frameworks/NAME/NN-{client,server}.bin, capture_frameworks.py): Sidekiq
 *     6 with redis-rb, Celery 5 with kombu's Redis transport, RQ, and a Streams consumer group
 *     with redis-py, 2 jobs of each of two handlers.  Each session is read as the proxy reads
 *     it: commands named, publishes, pops, acks and transactions classified, replies paired
 *     with their commands and the jobs read out of them.  What comes out must be what the app
 *     enqueued (NAME/enqueued.txt, written by the app's driver, not by twice): every job
 *     published once with its task and queue, delivered once, acked once where the framework
 *     acks.
 *   - The same sessions fed in two pieces split at every offset, client side and server side:
 *     the same reading every time (a transaction is planned only once its EXEC is in, as the
 *     proxy waits for it).
 *   - Edge cases of each function: keys and fields at and past their limits, wrong shapes,
 *     XADD options, JUSTID claims, priority lists, the tx scan's limits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <openssl/sha.h>

#include "proto/base/msgpack.h"
#include "proto/resp/resp.h"
#include "proto/resp/resp_bullmq.h"
#include "proto/resp/resp_job.h"
#include "proto/resp/resp_profile.h"
#include "tests/lib/golden.h"
#include "tests/lib/split.h"
#include "tests/lib/text.h"

/* ---- what a session says: one line per event, in order ---------------------------------- */

/* The reading of one connection. */
#define MAX_CMDS 4096u
struct reading {
    enum rprof prof;
    struct msg_fields ids, tasks; /* RPROF_LIST: where the app keeps them */
    struct kit_text out;
    /* per command (its index is its pairing tag): what its reply is */
    uint8_t kind[MAX_CMDS];
    bool head[MAX_CMDS]; /* RPROF_REPLY_POP: it takes its list's head */
    char *arg[MAX_CMDS];
    size_t ncmds;
    struct resp_pairing pairing;
    struct resp_cmd slots[MAX_CMDS];
    bool in_tx;
    /* BullMQ (its scripts read with proto/resp/resp_bullmq.h, as its profile does): the scripts by
     * sha, learned from the bodies of EVAL as the proxy learns them */
    bool bullmq;
    struct {
        char sha[41];
        enum bmq_script s;
    } scripts[32];
    size_t nscripts;
};

/* Reply kinds of the BullMQ reading. */
enum { KIND_BMQ_ADD = RPROF_REPLY_END + 1, KIND_BMQ_NEXT, KIND_BMQ_FINISH, KIND_BMQ_STALLED };

/* A setting of one source, as a listener's `message-id` or `task` line parses it. */
static void one_source(struct msg_fields *fs, const char *text)
{
    char why[256];
    memset(fs, 0, sizeof(*fs));
    assert_int_equal(msg_field_parse(text, &fs->src[0], why, sizeof(why)), 0);
    fs->n = 1;
}

static void reading_init(struct reading *r, enum rprof prof, const char *fw)
{
    memset(r, 0, sizeof(*r));
    r->prof = prof;
    r->bullmq = strcmp(fw, "bullmq") == 0;
    resp_pairing_init(&r->pairing, r->slots, MAX_CMDS);
    /* The list app's jobs are Laravel's: the uuid names the job, displayName its class. */
    one_source(&r->ids, "body.json.uuid");
    one_source(&r->tasks, "body.json.displayName");
}

static void reading_free(struct reading *r)
{
    for (size_t i = 0; i < r->ncmds; i++)
        free(r->arg[i]);
    free(r->out.s);
}

static void say_job(struct reading *r, const char *what, const char *queue_key, const void *v,
                    size_t n)
{
    char *queue = rprof_queue_of(r->prof, queue_key);
    assert_non_null(queue);
    if (r->prof == RPROF_RQ) {
        kit_say(&r->out, "%s %.*s - %s", what, (int)n, (const char *)v, queue);
    } else if (r->prof == RPROF_LIST) {
        struct resp_job job;
        uint64_t too_long;
        if (rprof_list_job(&r->ids, &r->tasks, v, n, &job, &too_long) == 0) {
            kit_say(&r->out, "%s %s %s %s", what, job.id, job.task != NULL ? job.task : "-", queue);
            resp_job_clear(&job);
        } else {
            kit_say(&r->out, "%s unreadable", what);
        }
        assert_int_equal(too_long, 0);
    } else {
        struct resp_job job;
        if (rprof_job(r->prof, v, n, &job) == 0) {
            kit_say(&r->out, "%s %s %s %s tag=%s", what, job.id, job.task != NULL ? job.task : "-",
                    queue, job.tag != NULL ? job.tag : "-");
            resp_job_clear(&job);
        } else {
            kit_say(&r->out, "%s unreadable", what);
        }
    }
    free(queue);
}

static void on_tx_cmd(void *arg, const struct rprof_cmdview *cv)
{
    struct reading *r = arg;
    const char *id;
    char *task;
    if (rprof_rq_job_saved(r->prof, cv, &id, &task)) {
        kit_say(&r->out, "saved %s %s", id, task);
        free(task);
    }
}

static void say_id(void *arg, const char *id)
{
    struct reading *r = arg;
    kit_say(&r->out, "lease %s", id);
}

/* A BullMQ script call: its events said, the kind of its reply returned (0: none to read). */
static uint8_t bullmq_command(struct reading *r, const struct rprof_cmdview *cv)
{
    struct bmq_call c;
    if (!bmq_call_of(cv, &c))
        return 0;
    char sha[41] = "";
    enum bmq_script s = BMQ_SCRIPT_UNKNOWN;
    const uint8_t *body = cv->buf + c.script.off;
    if (c.eval) {
        uint8_t d[SHA_DIGEST_LENGTH];
        SHA1(body, c.script.len, d);
        for (size_t i = 0; i < sizeof(d); i++)
            snprintf(sha + 2 * i, 3, "%02x", d[i]);
        s = bmq_script_of(body, c.script.len);
        assert_true(r->nscripts < sizeof(r->scripts) / sizeof(r->scripts[0]));
        memcpy(r->scripts[r->nscripts].sha, sha, sizeof(sha));
        r->scripts[r->nscripts++].s = s;
    } else {
        assert_int_equal(c.script.len, 40);
        memcpy(sha, body, 40);
        for (size_t i = 0; i < r->nscripts; i++)
            if (strcmp(r->scripts[i].sha, sha) == 0)
                s = r->scripts[i].s;
    }
    struct bmq_job j;
    char id[BMQ_ID_MAX], queue[BMQ_QUEUE_MAX], prefix[BMQ_PREFIX_MAX], token[BMQ_TOKEN_MAX];
    bool failed, next;
    switch (s) {
    case BMQ_ADD_STANDARD:
    case BMQ_ADD_DELAYED:
    case BMQ_ADD_PRIORITIZED:
    case BMQ_ADD_PARENT:
        assert_int_equal(bmq_add_args(cv, &c, &j), 0);
        assert_string_equal(j.prefix, "bull:twice:");
        kit_say(&r->out, "add %s %s id=%s", j.name, j.queue, j.id[0] ? j.id : "-");
        return KIND_BMQ_ADD;
    case BMQ_MOVE_TO_ACTIVE:
        assert_true(bmq_call_queue(cv, &c, s, queue, sizeof(queue)));
        assert_string_equal(queue, "twice");
        assert_true(bmq_call_prefix(cv, &c, s, prefix, sizeof(prefix)));
        assert_string_equal(prefix, "bull:twice:");
        /* the worker's token: "<worker uuid>:<n>" */
        assert_true(bmq_call_token(cv, &c, s, token, sizeof(token)));
        assert_non_null(strchr(token, ':'));
        return KIND_BMQ_NEXT;
    case BMQ_MOVE_TO_FINISHED:
        assert_true(bmq_call_queue(cv, &c, s, queue, sizeof(queue)));
        assert_true(bmq_call_prefix(cv, &c, s, prefix, sizeof(prefix)));
        assert_string_equal(prefix, "bull:twice:");
        assert_true(bmq_call_token(cv, &c, s, token, sizeof(token)));
        assert_non_null(strchr(token, ':'));
        assert_int_equal(bmq_finish_args(cv, &c, id, sizeof(id), &failed, &next), 0);
        kit_say(&r->out, "finish %s %s failed=%d", id, queue, failed);
        return next ? KIND_BMQ_NEXT : KIND_BMQ_FINISH;
    case BMQ_EXTEND_LOCK:
    case BMQ_EXTEND_LOCKS:
        assert_true(bmq_lock_ids(cv, &c, s, say_id, r) >= 0);
        return 0;
    case BMQ_MOVE_STALLED:
        return KIND_BMQ_STALLED;
    default:
        kit_say(&r->out, "script %s", c.eval ? "unknown" : "unseen");
        return 0;
    }
}

static void say_stalled(void *arg, const char *id)
{
    struct reading *r = arg;
    kit_say(&r->out, "stalled %s", id);
}

static void bullmq_reply(struct reading *r, uint8_t kind, const uint8_t *buf,
                         const struct resp_msg *m)
{
    char id[BMQ_ID_MAX];
    struct bmq_job j = {.queue = "twice"};
    int64_t code;
    switch (kind) {
    case KIND_BMQ_ADD:
        if (bmq_add_reply(buf, &m->value, id, sizeof(id)) == 1)
            kit_say(&r->out, "added %s", id);
        break;
    case KIND_BMQ_NEXT:
        if (bmq_next_job(buf, m, &j) == 1)
            kit_say(&r->out, "deliver %s %s %s atm=%u", j.id, j.name, j.queue, j.attempts_made);
        else if (bmq_finish_code(buf, m, &code))
            kit_say(&r->out, "finished %lld", (long long)code);
        break;
    case KIND_BMQ_FINISH:
        if (bmq_finish_code(buf, m, &code))
            kit_say(&r->out, "finished %lld", (long long)code);
        break;
    default:
        assert_true(bmq_stalled_ids(buf, m, say_stalled, r) >= 0);
        break;
    }
}

/* One command of the client's stream; its bytes are buf[0..m->len), rest[0..rest_len) what
 * follows it so far.  Returns false when it must wait for more bytes (a transaction whose
 * EXEC is not here yet), as the proxy does. */
static bool on_command(struct reading *r, const uint8_t *buf, const struct resp_msg *m,
                       size_t rest_len)
{
    struct rprof_cmdview cv;
    rprof_cmdview_init(&cv, buf, m, true);
    if (cv.id == RPROF_CMD_MULTI && !r->in_tx) {
        struct resp_scanner sc;
        resp_scanner_init(&sc, RESP_SIDE_CLIENT);
        struct rprof_tx tx;
        size_t said = r->out.len;
        int rc = rprof_tx_scan(&sc, buf, m->len + rest_len, m->len, &tx, on_tx_cmd, r);
        if (rc == 0) {
            r->out.len = said; /* unsaid: said again once EXEC is in */
            if (r->out.s != NULL)
                r->out.s[said] = '\0';
            return false;
        }
        kit_say(&r->out, "tx rc=%d queued=%zu push=%d", rc, tx.queued, tx.has_push);
        r->in_tx = true;
    } else if (cv.id == RPROF_CMD_EXEC || cv.id == RPROF_CMD_DISCARD) {
        r->in_tx = false;
    }
    uint8_t bmq_kind = r->bullmq ? bullmq_command(r, &cv) : 0;
    switch (rprof_publish_of(r->prof, &cv)) {
    case RPROF_PUB_JOBS: {
        struct resp_view v;
        for (size_t i = 2; rprof_arg(&cv, i, &v); i++)
            say_job(r, "publish", cv.key, buf + v.off, v.len);
        break;
    }
    case RPROF_PUB_RQ_ID: {
        struct resp_view v;
        assert_true(rprof_arg(&cv, 2, &v));
        say_job(r, "publish", cv.key, buf + v.off, v.len);
        break;
    }
    case RPROF_PUB_XADD: {
        char task[RPROF_TASK_MAX];
        uint64_t n;
        struct resp_view idv;
        size_t at = rprof_xadd_id_arg(&cv);
        assert_true(at > 0 && rprof_arg(&cv, at, &idv));
        assert_int_equal(rprof_xadd_task(&cv, task, sizeof(task), &n), RPROF_FOUND);
        kit_say(&r->out, "publish %.*s %s %s", (int)idv.len, (const char *)buf + idv.off, task,
                cv.key);
        break;
    }
    default:
        break;
    }
    size_t first;
    if (rprof_ack_args(r->prof, &cv, &first)) {
        struct resp_view v;
        for (size_t i = first; rprof_arg(&cv, i, &v); i++)
            kit_say(&r->out, "ack %.*s %lld", (int)v.len, (const char *)buf + v.off,
                    (long long)rprof_settled_count(&cv));
    }
    if (rprof_is_celery_unacked_hdel(r->prof, &cv))
        kit_say(&r->out, "hdel unacked");
    struct resp_view lv;
    if (rprof_rq_lease(r->prof, &cv, &lv))
        kit_say(&r->out, "lease %.*s", (int)lv.len, (const char *)buf + lv.off);
    if (rprof_rq_failed(r->prof, &cv, &lv))
        kit_say(&r->out, "failed %.*s", (int)lv.len, (const char *)buf + lv.off);
    if (cv.id == RPROF_CMD_ZADD && cv.has_key && strncmp(cv.key, "rq:wip:", 7) == 0)
        kit_say(&r->out, "started");
    struct resp_view job;
    if (rprof_list_ack(r->prof, &cv, &job))
        say_job(r, "ack", cv.key, buf + job.off, job.len);
    const char *arg;
    bool redelivered;
    enum rprof_reply kind = rprof_reply_of(r->prof, &cv, &arg, &redelivered);
    int rc = resp_pairing_command(&r->pairing, m, buf, r->ncmds, NULL);
    assert_true(rc == 0 || rc == 1);
    if (rc == 1) {
        assert_true(r->ncmds < MAX_CMDS);
        r->kind[r->ncmds] = bmq_kind != 0 ? bmq_kind : (uint8_t)kind;
        r->head[r->ncmds] = kind == RPROF_REPLY_POP && rprof_pop_takes_head(&cv);
        r->arg[r->ncmds] = arg != NULL ? strdup(arg) : NULL;
        if (kind == RPROF_REPLY_XREAD && redelivered)
            r->kind[r->ncmds] = RPROF_REPLY_END; /* a re-read: said apart */
        r->ncmds++;
    }
    return true;
}

static void say_entries(struct reading *r, const char *what, const char *stream, const uint8_t *buf,
                        size_t len, const struct resp_view *arr)
{
    struct resp_args it;
    rprof_walk_init(&it, buf, len, arr);
    struct resp_view e;
    while (resp_args_next(&it, &e) == 1) {
        struct rprof_entry ent;
        if (rprof_stream_entry(buf, len, &e, &ent) == 1)
            kit_say(&r->out, "%s %s %s %s", what, ent.id, ent.task[0] ? ent.task : "-", stream);
        else
            kit_say(&r->out, "%s unreadable", what);
    }
}

/* XREADGROUP's RESP2 reply: [[stream, entries], ...]. */
static void say_xread(struct reading *r, const uint8_t *buf, const struct resp_msg *m, bool again)
{
    if (m->null || !rprof_is_agg(&m->value))
        return;
    struct resp_args it;
    resp_args_init(&it, buf, m);
    struct resp_view pair;
    while (resp_args_next(&it, &pair) == 1) {
        assert_true(rprof_is_agg(&pair));
        struct resp_args in;
        rprof_walk_init(&in, buf, m->len, &pair);
        struct resp_view k, ents;
        char stream[RPROF_KEY_MAX];
        assert_int_equal(resp_args_next(&in, &k), 1);
        assert_int_equal(resp_args_next(&in, &ents), 1);
        assert_true(rprof_view_str(buf, m->len, &k, stream, sizeof(stream)));
        say_entries(r, again ? "redeliver" : "deliver", stream, buf, m->len, &ents);
    }
}

static void on_reply(struct reading *r, const uint8_t *buf, const struct resp_msg *m)
{
    struct resp_match match;
    int rc = resp_pairing_reply(&r->pairing, m, buf, &match);
    assert_true(rc == 0 || rc == 1);
    if (rc == 0 || !match.last)
        return;
    size_t i = (size_t)match.cmd.tag;
    assert_true(i < r->ncmds);
    switch (r->kind[i]) {
    case RPROF_REPLY_POP: {
        char list[RPROF_KEY_MAX];
        struct resp_view val;
        bool pair;
        if (rprof_pop_reply(buf, m, r->arg[i], list, sizeof(list), &val, &pair))
            say_job(r, r->prof == RPROF_LIST && r->head[i] ? "deliver-head" : "deliver", list,
                    buf + val.off, val.len);
        break;
    }
    case KIND_BMQ_ADD:
    case KIND_BMQ_NEXT:
    case KIND_BMQ_FINISH:
    case KIND_BMQ_STALLED:
        bullmq_reply(r, r->kind[i], buf, m);
        break;
    case RPROF_REPLY_XREAD:
    case RPROF_REPLY_END:
        say_xread(r, buf, m, r->kind[i] == RPROF_REPLY_END);
        break;
    case RPROF_REPLY_XADD: {
        char id[RPROF_ID_MAX];
        uint64_t n;
        assert_int_equal(rprof_xadd_reply_id(buf, m, id, sizeof(id), &n), RPROF_FOUND);
        kit_say(&r->out, "added %s %s", id, r->arg[i]);
        break;
    }
    case RPROF_REPLY_RQ_HASH: {
        char *task = NULL;
        if (rprof_rq_hash_task(buf, m, &task) == 0) {
            kit_say(&r->out, "hash %s %s", r->arg[i], task);
            free(task);
        }
        break;
    }
    default:
        break;
    }
}

/* ---- feeding a stream in two pieces ----------------------------------------------------- */

struct feed {
    struct resp_scanner sc;
    uint8_t *held;
    size_t n;
};

/* Appends buf[0..len) to what f holds and hands every complete message on. */
static void feed_push(struct feed *f, struct reading *r, bool client, const uint8_t *p, size_t k)
{
    f->held = realloc(f->held, f->n + k + 1);
    assert_non_null(f->held);
    if (k > 0)
        memcpy(f->held + f->n, p, k);
    f->n += k;
    size_t off = 0;
    for (;;) {
        struct resp_msg m;
        int rc = resp_scan(&f->sc, f->held + off, f->n - off, &m);
        assert_true(rc >= 0);
        if (rc == 0)
            break;
        if (client && !on_command(r, f->held + off, &m, f->n - off - m.len)) {
            resp_scanner_reset(&f->sc);
            break;
        }
        if (!client)
            on_reply(r, f->held + off, &m);
        off += m.len;
        resp_scanner_reset(&f->sc);
    }
    memmove(f->held, f->held + off, f->n - off);
    f->n -= off;
}

/* The reading of one connection, fed as its client stream followed by its server stream (the
 * pairing needs every command before its reply), in whatever pieces the split driver cuts. */
struct session_feed {
    struct reading *r; /* begin() starts it afresh */
    enum rprof prof;
    const char *fw;
    size_t clen; /* bytes [0, clen) are the client's, the rest the server's */
    size_t fed;
    struct feed fc, fs;
    const char *want; /* end(): what the reading must say, then it is freed (NULL: kept) */
};

static void session_begin(void *ctx)
{
    struct session_feed *sf = ctx;
    reading_init(sf->r, sf->prof, sf->fw);
    memset(&sf->fc, 0, sizeof(sf->fc));
    memset(&sf->fs, 0, sizeof(sf->fs));
    resp_scanner_init(&sf->fc.sc, RESP_SIDE_CLIENT);
    resp_scanner_init(&sf->fs.sc, RESP_SIDE_SERVER);
    sf->fed = 0;
}

static void session_piece(void *ctx, const uint8_t *p, size_t n)
{
    struct session_feed *sf = ctx;
    size_t k = sf->fed < sf->clen ? sf->clen - sf->fed : 0;
    k = k < n ? k : n;
    if (k > 0) {
        feed_push(&sf->fc, sf->r, true, p, k);
        if (sf->fed + k == sf->clen)
            assert_int_equal(sf->fc.n, 0); /* every command read, every transaction planned */
    }
    if (n > k)
        feed_push(&sf->fs, sf->r, false, p + k, n - k);
    sf->fed += n;
}

static void session_end(void *ctx, const char *how)
{
    struct session_feed *sf = ctx;
    assert_int_equal(sf->fs.n, 0);
    free(sf->fc.held);
    free(sf->fs.held);
    if (sf->want == NULL)
        return;
    const char *got = kit_str(&sf->r->out);
    if (strcmp(got, sf->want) != 0)
        fail_msg("%s: %s (client %zu bytes first):\n%s\nwhole:\n%s", sf->fw, how, sf->clen, got,
                 sf->want);
    reading_free(sf->r);
}

static const struct kit_feed session_ops = {session_begin, session_piece, session_end};

/* Connection i's client stream followed by its server stream, in one buffer (the caller frees). */
struct recording;
static uint8_t *session_bytes(const struct recording *rec, size_t i, size_t *len);

/* ---- one framework's recording ---------------------------------------------------------- */

#define MAX_CONNS 32
struct recording {
    const char *fw;
    enum rprof prof;
    size_t n;
    uint8_t *c[MAX_CONNS], *s[MAX_CONNS];
    size_t clen[MAX_CONNS], slen[MAX_CONNS];
    char *events;   /* every connection's reading, in order */
    char *enqueued; /* the driver's list */
};

static void recording_load(struct recording *rec, const char *fw, enum rprof prof)
{
    memset(rec, 0, sizeof(*rec));
    rec->fw = fw;
    rec->prof = prof;
    for (size_t i = 0; i < MAX_CONNS; i++) {
        rec->c[i] = kit_golden_maybe(&rec->clen[i], "frameworks/%s/%02zu-client.bin", fw, i + 1);
        if (rec->c[i] == NULL)
            break;
        rec->s[i] = kit_golden(&rec->slen[i], "frameworks/%s/%02zu-server.bin", fw, i + 1);
        rec->n++;
    }
    assert_true(rec->n > 0);
    size_t len;
    rec->enqueued = (char *)kit_golden(&len, "frameworks/%s/enqueued.txt", fw);
    struct kit_text all = {0};
    for (size_t i = 0; i < rec->n; i++) {
        struct reading *r = malloc(sizeof(*r));
        assert_non_null(r);
        struct session_feed sf = {.r = r, .prof = prof, .fw = fw, .clen = rec->clen[i]};
        size_t n;
        uint8_t *both = session_bytes(rec, i, &n);
        kit_feed_split_at(both, n, n, &session_ops, &sf);
        free(both);
        if (r->out.s != NULL)
            kit_say(&all, "%s", r->out.s);
        reading_free(r);
        free(r);
    }
    rec->events = all.s != NULL ? all.s : strdup("");
}

static void recording_free(struct recording *rec)
{
    for (size_t i = 0; i < rec->n; i++) {
        kit_free(rec->c[i]);
        kit_free(rec->s[i]);
    }
    free(rec->events);
    kit_free(rec->enqueued);
}

/* How many lines of text start with `prefix`; *line (may be NULL) gets the last one. */
static size_t lines_with(const char *text, const char *prefix, const char **line)
{
    size_t count = 0, n = strlen(prefix);
    for (const char *p = text; p != NULL && *p != '\0';) {
        if (strncmp(p, prefix, n) == 0) {
            count++;
            if (line != NULL)
                *line = p;
        }
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    return count;
}

/* Each job the driver enqueued, as (id, task); returns how many. */
#define MAX_JOBS 16
static size_t enqueued_jobs(const struct recording *rec, char ids[][128], char tasks[][128])
{
    size_t n = 0;
    const char *p = rec->enqueued;
    while (*p != '\0' && n < MAX_JOBS) {
        assert_int_equal(sscanf(p, "%127s %127s", ids[n], tasks[n]), 2);
        n++;
        p = strchr(p, '\n');
        if (p == NULL)
            break;
        p++;
    }
    return n;
}

/* Fails with the whole reading when `count` lines do not start with the expected text. */
static void expect_lines(const struct recording *rec, size_t count, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void expect_lines(const struct recording *rec, size_t count, const char *fmt, ...)
{
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    size_t got = lines_with(rec->events, prefix, NULL);
    if (got != count)
        fail_msg("%s: %zu lines \"%s...\", expected %zu; the reading:\n%s", rec->fw, got, prefix,
                 count, rec->events);
}

static uint8_t *session_bytes(const struct recording *rec, size_t i, size_t *len)
{
    *len = rec->clen[i] + rec->slen[i];
    uint8_t *both = malloc(*len + 1);
    assert_non_null(both);
    memcpy(both, rec->c[i], rec->clen[i]);
    memcpy(both + rec->clen[i], rec->s[i], rec->slen[i]);
    return both;
}

/* The same reading whichever byte the client's or the server's stream is split at. */
static void split_everywhere(const struct recording *rec)
{
    for (size_t i = 0; i < rec->n; i++) {
        struct reading *whole = malloc(sizeof(*whole)), *r = malloc(sizeof(*r));
        assert_non_null(whole);
        assert_non_null(r);
        size_t len;
        uint8_t *both = session_bytes(rec, i, &len);
        struct session_feed sf = {
            .r = whole, .prof = rec->prof, .fw = rec->fw, .clen = rec->clen[i]};
        kit_feed_split_at(both, len, len, &session_ops, &sf);
        sf.r = r;
        sf.want = kit_str(&whole->out);
        kit_split_everywhere(both, len, KIT_SPLIT_TWO, &session_ops, &sf);
        free(both);
        reading_free(whole);
        free(whole);
        free(r);
    }
}

/* ---- the frameworks --------------------------------------------------------------------- */

static void test_sidekiq(void **state)
{
    (void)state;
    struct recording rec;
    recording_load(&rec, "sidekiq", RPROF_SIDEKIQ);
    char ids[MAX_JOBS][128], tasks[MAX_JOBS][128];
    size_t n = enqueued_jobs(&rec, ids, tasks);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        /* perform_async's LPUSH queue:default, the fetcher's BRPOP queue:default */
        expect_lines(&rec, 1, "publish %s %s default tag=-", ids[i], tasks[i]);
        expect_lines(&rec, 1, "deliver %s %s default tag=-", ids[i], tasks[i]);
    }
    expect_lines(&rec, n, "publish ");
    expect_lines(&rec, n, "deliver ");
    expect_lines(&rec, 0, "ack "); /* basic fetch: the pop is the ack */
    split_everywhere(&rec);
    recording_free(&rec);
}

/* The tag of job id's delivery, from "deliver ID TASK QUEUE tag=TAG". */
static void delivery_tag(const struct recording *rec, const char *id, char *tag, size_t cap)
{
    char prefix[256];
    snprintf(prefix, sizeof(prefix), "deliver %s ", id);
    const char *line = NULL;
    assert_int_equal(lines_with(rec->events, prefix, &line), 1);
    const char *t = strstr(line, "tag=");
    assert_non_null(t);
    t += 4;
    size_t k = strcspn(t, "\n");
    assert_true(k > 0 && k < cap);
    memcpy(tag, t, k);
    tag[k] = '\0';
}

static void test_celery(void **state)
{
    (void)state;
    struct recording rec;
    recording_load(&rec, "celery_redis", RPROF_CELERY);
    char ids[MAX_JOBS][128], tasks[MAX_JOBS][128];
    size_t n = enqueued_jobs(&rec, ids, tasks);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        /* apply_async's LPUSH celery; the worker's BRPOP celery; kombu's QoS acks by the
         * delivery tag: ZREM unacked_index TAG, then HDEL unacked TAG */
        expect_lines(&rec, 1, "publish %s %s celery tag=", ids[i], tasks[i]);
        expect_lines(&rec, 1, "deliver %s %s celery tag=", ids[i], tasks[i]);
        char tag[128];
        delivery_tag(&rec, ids[i], tag, sizeof(tag));
        expect_lines(&rec, 1, "ack %s 1", tag);
    }
    expect_lines(&rec, n, "ack ");
    expect_lines(&rec, n, "hdel unacked");
    split_everywhere(&rec);
    recording_free(&rec);
}

static void test_rq(void **state)
{
    (void)state;
    struct recording rec;
    recording_load(&rec, "rq", RPROF_RQ);
    char ids[MAX_JOBS][128], tasks[MAX_JOBS][128];
    size_t n = enqueued_jobs(&rec, ids, tasks);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        /* enqueue: MULTI, HSET rq:job:ID ... description "tasks.charge(...)", RPUSH
         * rq:queue:default ID, EXEC; the worker's BLPOP, its HGETALL rq:job:ID, and the ZREM
         * rq:wip:default ID that settles the job */
        /* saved at enqueue, and again by the worker: always with the job's task */
        char saved[256];
        snprintf(saved, sizeof(saved), "saved %s ", ids[i]);
        size_t n_saved = lines_with(rec.events, saved, NULL);
        assert_true(n_saved >= 1);
        expect_lines(&rec, n_saved, "saved %s %s", ids[i], tasks[i]);
        expect_lines(&rec, 1, "publish %s - default", ids[i]);
        expect_lines(&rec, 1, "deliver %s - default", ids[i]);
        expect_lines(&rec, 1, "ack %s 1", ids[i]);
        if (lines_with(rec.events, "hash ", NULL) > 0)
            expect_lines(&rec, 1, "hash %s %s", ids[i], tasks[i]);
    }
    expect_lines(&rec, n, "publish ");
    expect_lines(&rec, n, "deliver ");
    expect_lines(&rec, n, "ack ");
    /* each job's start in the started registry (the horse's ZADD, no XX) is no renewal: the
     * jobs ended before the worker's first heartbeat, and none failed */
    expect_lines(&rec, n, "started");
    expect_lines(&rec, 0, "lease ");
    expect_lines(&rec, 0, "failed ");
    split_everywhere(&rec);
    recording_free(&rec);
}

static void test_streams(void **state)
{
    (void)state;
    struct recording rec;
    recording_load(&rec, "streams", RPROF_STREAMS);
    char ids[MAX_JOBS][128], tasks[MAX_JOBS][128];
    size_t n = enqueued_jobs(&rec, ids, tasks);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        /* XADD twice:e2e:jobs * task NAME ...: Redis names the entry; XREADGROUP ... >
         * delivers it with its fields; XACK settles it */
        expect_lines(&rec, 1, "added %s twice:e2e:jobs", ids[i]);
        expect_lines(&rec, 1, "deliver %s %s twice:e2e:jobs", ids[i], tasks[i]);
        expect_lines(&rec, 1, "ack %s 1", ids[i]);
    }
    expect_lines(&rec, n, "publish * ");
    expect_lines(&rec, 0, "redeliver ");
    split_everywhere(&rec);
    recording_free(&rec);
}

static void test_list(void **state)
{
    (void)state;
    struct recording rec;
    recording_load(&rec, "lists", RPROF_LIST);
    char ids[MAX_JOBS][128], tasks[MAX_JOBS][128];
    size_t n = enqueued_jobs(&rec, ids, tasks);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        /* the producer's LPUSH queues:default JSON; the worker's BLMOVE queues:default
         * queues:default:processing RIGHT LEFT (the tail: the oldest job), and after the work
         * LREM queues:default:processing 1 JSON, the job's payload naming it */
        expect_lines(&rec, 1, "publish %s %s queues:default\n", ids[i], tasks[i]);
        expect_lines(&rec, 1, "deliver %s %s queues:default\n", ids[i], tasks[i]);
        expect_lines(&rec, 1, "ack %s %s queues:default:processing\n", ids[i], tasks[i]);
    }
    expect_lines(&rec, n, "publish ");
    expect_lines(&rec, n, "deliver ");
    expect_lines(&rec, n, "ack ");
    expect_lines(&rec, 0, "deliver-head ");
    split_everywhere(&rec);
    recording_free(&rec);
}

static void test_bullmq(void **state)
{
    (void)state;
    struct recording rec;
    recording_load(&rec, "bullmq", RPROF_NONE);
    char ids[MAX_JOBS][128], tasks[MAX_JOBS][128];
    size_t n = enqueued_jobs(&rec, ids, tasks);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        /* Queue.add: addStandardJob (EVAL first, EVALSHA after), its reply the job id; the
         * worker's moveToActive, then moveToFinished with fetchNext handing it the next one */
        expect_lines(&rec, 1, "added %s\n", ids[i]);
        expect_lines(&rec, 1, "deliver %s %s twice atm=0\n", ids[i], tasks[i]);
        expect_lines(&rec, 1, "finish %s twice failed=0\n", ids[i]);
    }
    expect_lines(&rec, 2, "add charge twice id=-\n");
    expect_lines(&rec, 2, "add charge_safe twice id=-\n");
    expect_lines(&rec, n, "deliver ");
    expect_lines(&rec, 0, "script ");
    split_everywhere(&rec);
    recording_free(&rec);
}

/* ---- edge cases ------------------------------------------------------------------------- */

/* A command from its words, scanned into *m (the bytes stay in buf). */
static void make_cmd(uint8_t *buf, size_t cap, struct resp_msg *m, struct rprof_cmdview *cv,
                     size_t argc, const char *const *argv)
{
    size_t off = (size_t)snprintf((char *)buf, cap, "*%zu\r\n", argc);
    for (size_t i = 0; i < argc; i++)
        off += (size_t)snprintf((char *)buf + off, cap - off, "$%zu\r\n%s\r\n", strlen(argv[i]),
                                argv[i]);
    assert_true(off < cap);
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(resp_scan(&sc, buf, off, m), 1);
    rprof_cmdview_init(cv, buf, m, true);
}

#define CMD(...)                                                                                   \
    make_cmd(buf, sizeof(buf), &m, &cv, sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *),    \
             (const char *[]){__VA_ARGS__})

/* Sidekiq's heartbeat writing its work state: HSET <identity>:workers (6) or :work (7+), one
 * field/value pair per job in progress; nothing else, and on no other profile. */
static void test_sidekiq_work_hash(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    size_t n = 0;
    CMD("hset", "vm:11834:e90caba8846c:workers", "1x3", "{}");
    assert_true(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
    assert_int_equal(n, strlen("vm:11834:e90caba8846c"));
    assert_false(rprof_sidekiq_work(RPROF_CELERY, &cv, &n));
    assert_false(rprof_sidekiq_work(RPROF_RQ, &cv, &n));
    CMD("HSET", "host:7:abc:work", "t1", "{}", "t2", "{}");
    assert_true(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
    assert_int_equal(n, strlen("host:7:abc"));
    CMD("HSET", "host:7:abc:work", "t1", "{}", "t2"); /* a field without its value */
    assert_false(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
    CMD("HSET", "host:7:abc:work", "t1");
    assert_false(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
    CMD("HSET", ":workers", "t1", "{}"); /* no identity */
    assert_false(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
    CMD("HSET", "host:7:abc:workers:x", "t1", "{}");
    assert_false(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
    CMD("HMSET", "host:7:abc:workers", "t1", "{}"); /* the process's own hash is HMSET */
    assert_false(rprof_sidekiq_work(RPROF_SIDEKIQ, &cv, &n));
}

/* The command that hands a BullMQ job out again at once: EVAL of twice's script over the seven
 * keys of the job's queue and the job, its id the one argument; refused when the keys do not
 * fit. */
static void test_bullmq_requeue_cmd(void **state)
{
    (void)state;
    char keys[BMQ_REQUEUE_KEYS_MAX];
    const char *argv[BMQ_REQUEUE_ARGC];
    size_t lens[BMQ_REQUEUE_ARGC];
    assert_int_equal(bmq_requeue_cmd("bull:twice:", "17", keys, sizeof(keys), argv, lens),
                     BMQ_REQUEUE_ARGC);
    assert_string_equal(argv[0], "EVAL");
    assert_int_equal(lens[1], strlen(argv[1]));
    assert_non_null(strstr(argv[1], "-- twice: hand an active job out again now"));
    assert_non_null(strstr(argv[1], "redis.call('LREM', KEYS[1], 1, id)"));
    assert_int_equal(bmq_script_of((const uint8_t *)argv[1], lens[1]), BMQ_SCRIPT_UNKNOWN);
    assert_string_equal(argv[2], "7");
    static const char *const want[] = {
        "bull:twice:active", "bull:twice:wait",   "bull:twice:paused", "bull:twice:meta",
        "bull:twice:marker", "bull:twice:events", "bull:twice:17",     "17"};
    for (size_t i = 0; i < 8; i++) {
        assert_int_equal(lens[3 + i], strlen(want[i]));
        assert_memory_equal(argv[3 + i], want[i], lens[3 + i]);
    }
    /* a room too small for the keys: nothing */
    assert_int_equal(bmq_requeue_cmd("bull:twice:", "17", keys, 60, argv, lens), 0);
    char prefix[BMQ_PREFIX_MAX];
    memset(prefix, 'p', sizeof(prefix) - 1);
    prefix[sizeof(prefix) - 1] = '\0';
    char id[BMQ_ID_MAX];
    memset(id, '9', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    assert_int_equal(bmq_requeue_cmd(prefix, id, keys, sizeof(keys), argv, lens),
                     BMQ_REQUEUE_ARGC); /* the longest prefix and id fit */
}

static void test_profiles_and_names(void **state)
{
    (void)state;
    assert_int_equal(rprof_of("sidekiq"), RPROF_SIDEKIQ);
    assert_int_equal(rprof_of("celery"), RPROF_CELERY);
    assert_int_equal(rprof_of("rq"), RPROF_RQ);
    assert_int_equal(rprof_of("streams"), RPROF_STREAMS);
    assert_int_equal(rprof_of("Sidekiq"), RPROF_NONE);
    assert_int_equal(rprof_of(NULL), RPROF_NONE);
    assert_int_equal(rprof_cmd_of("XREADGROUP", 10), RPROF_CMD_XREADGROUP);
    assert_int_equal(rprof_cmd_of("XREADGROUX", 10), RPROF_CMD_OTHER);
    assert_int_equal(rprof_cmd_of("GET", 3), RPROF_CMD_OTHER);
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    CMD("lpush", "queue:default", "{}");
    assert_int_equal(cv.id, RPROF_CMD_LPUSH); /* names are read in any case */
    assert_string_equal(cv.key, "queue:default");
    /* a key at RPROF_KEY_MAX bytes is not read: no profile function names it */
    char big[RPROF_KEY_MAX + 1];
    memset(big, 'k', RPROF_KEY_MAX);
    big[RPROF_KEY_MAX] = '\0';
    memcpy(big, "queue:", 6);
    CMD("BRPOP", big, "1");
    assert_false(cv.has_key);
    assert_false(rprof_is_pop(RPROF_SIDEKIQ, &cv));
    big[RPROF_KEY_MAX - 1] = '\0'; /* 511 bytes: fits */
    CMD("BRPOP", big, "1");
    assert_true(cv.has_key);
    assert_true(rprof_is_pop(RPROF_SIDEKIQ, &cv));
}

static void test_commands_per_profile(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    size_t first = 0;
    CMD("BRPOP", "other:list", "1");
    assert_false(rprof_is_pop(RPROF_SIDEKIQ, &cv));
    assert_true(rprof_is_pop(RPROF_CELERY, &cv)); /* kombu's queues are plain lists */
    assert_false(rprof_is_pop(RPROF_NONE, &cv));
    CMD("LMOVE", "rq:queue:default", "rq:wip:default", "RIGHT", "LEFT");
    assert_true(rprof_is_pop(RPROF_RQ, &cv));
    CMD("ZREM", "unacked_index", "tag-1", "tag-2");
    assert_true(rprof_ack_args(RPROF_CELERY, &cv, &first));
    assert_int_equal(first, 2);
    assert_int_equal(rprof_settled_count(&cv), 2);
    assert_false(rprof_ack_args(RPROF_RQ, &cv, &first));
    CMD("XACK", "s", "g", "1-0", "2-0", "3-0");
    assert_true(rprof_ack_args(RPROF_STREAMS, &cv, &first));
    assert_int_equal(first, 3);
    assert_int_equal(rprof_settled_count(&cv), 3);
    CMD("HDEL", "unacked", "tag-1");
    assert_true(rprof_is_celery_unacked_hdel(RPROF_CELERY, &cv));
    assert_false(rprof_is_celery_unacked_hdel(RPROF_RQ, &cv));
    CMD("LPUSH", "celery");
    assert_int_equal(rprof_publish_of(RPROF_CELERY, &cv), RPROF_PUB_NONE); /* no value */
    CMD("RPUSH", "rq:queue:default", "id-1");
    assert_int_equal(rprof_publish_of(RPROF_RQ, &cv), RPROF_PUB_RQ_ID);
    assert_int_equal(rprof_publish_of(RPROF_SIDEKIQ, &cv), RPROF_PUB_NONE);
    CMD("LPUSH", "queue:x", "{}");
    assert_int_equal(rprof_publish_of(RPROF_SIDEKIQ, &cv), RPROF_PUB_JOBS);
    struct resp_job job;
    assert_int_equal(rprof_job(RPROF_SIDEKIQ, "{}", 2, &job), -1); /* no jid, no class */
    assert_int_equal(rprof_job(RPROF_RQ, "{}", 2, &job), -1);
}

/* RQ's heartbeat (ZADD rq:wip:Q XX SCORE ID), its failed registry (ZADD rq:failed:Q SCORE ID),
 * the started registry's reaping, and the job hash's half of a heartbeat. */
static void test_rq_lease_and_failed(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    struct resp_view v;
    CMD("ZADD", "rq:wip:default", "XX", "1700000090", "job-1");
    assert_true(rprof_rq_lease(RPROF_RQ, &cv, &v));
    assert_int_equal(v.len, 5);
    assert_memory_equal(buf + v.off, "job-1", 5);
    assert_false(rprof_rq_failed(RPROF_RQ, &cv, &v));
    assert_false(rprof_rq_lease(RPROF_SIDEKIQ, &cv, &v));
    CMD("zadd", "rq:wip:default", "gt", "xx", "1700000090", "job-1"); /* any case, GT */
    assert_true(rprof_rq_lease(RPROF_RQ, &cv, &v));
    /* CH answers 1 for a changed score: not the 0 twice answers for one it keeps back */
    CMD("ZADD", "rq:wip:default", "XX", "CH", "1700000090", "job-1");
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:wip:default", "1700000090", "job-1"); /* the job's start */
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:wip:default", "XX", "NX", "1", "job-1");
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:wip:default", "XX", "INCR", "1", "job-1");
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:wip:default", "XX", "1", "job-1", "2", "job-2"); /* two members */
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:wip:default", "XX", "1"); /* no member */
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:wip:default", "XX");
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:finished:default", "XX", "1", "job-1");
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    CMD("ZADD", "rq:failed:default", "1700031536", "job-2");
    assert_true(rprof_rq_failed(RPROF_RQ, &cv, &v));
    assert_memory_equal(buf + v.off, "job-2", 5);
    char *q = rprof_queue_of(RPROF_RQ, cv.key);
    assert_string_equal(q, "default");
    free(q);
    assert_false(rprof_rq_lease(RPROF_RQ, &cv, &v));
    assert_false(rprof_rq_failed(RPROF_CELERY, &cv, &v));
    CMD("ZADD", "rq:failed:default", "XX", "1", "job-2");
    assert_false(rprof_rq_failed(RPROF_RQ, &cv, &v));
    CMD("ZREMRANGEBYSCORE", "rq:wip:default", "0", "1700000100");
    assert_int_equal(cv.id, RPROF_CMD_ZREMRANGEBYSCORE);
    assert_true(rprof_rq_reaps(RPROF_RQ, &cv));
    assert_false(rprof_rq_reaps(RPROF_SIDEKIQ, &cv));
    CMD("ZREMRANGEBYSCORE", "rq:failed:default", "0", "1700000100");
    assert_false(rprof_rq_reaps(RPROF_RQ, &cv));
    CMD("HSET", "rq:job:job-1", "last_heartbeat", "2026-12-02T10:00:00.000000Z");
    assert_true(rprof_rq_job_heartbeat(RPROF_RQ, &cv, "job-1"));
    assert_false(rprof_rq_job_heartbeat(RPROF_RQ, &cv, "job-2"));
    assert_false(rprof_rq_job_heartbeat(RPROF_SIDEKIQ, &cv, "job-1"));
    CMD("HSET", "rq:job:job-1", "last_heartbeat", "T", "status", "started");
    assert_false(rprof_rq_job_heartbeat(RPROF_RQ, &cv, "job-1")); /* more than the beat */
    CMD("HSET", "rq:worker:w1", "last_heartbeat", "T");
    assert_false(rprof_rq_job_heartbeat(RPROF_RQ, &cv, "w1"));
    /* only RQ's profile looks at ZADD: Sidekiq's retry and schedule sets stay plain */
    assert_true(rprof_cmd_matters(RPROF_RQ, RPROF_CMD_ZADD));
    assert_false(rprof_cmd_matters(RPROF_SIDEKIQ, RPROF_CMD_ZADD));
    assert_false(rprof_cmd_matters(RPROF_CELERY, RPROF_CMD_ZREMRANGEBYSCORE));
}

static void test_list_commands(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    struct resp_view job;
    assert_int_equal(rprof_of("list"), RPROF_LIST);
    /* every pop of one value from any list; a pop's end says where a copy goes back */
    struct {
        const char *const argv[6];
        size_t argc;
        bool pop, head;
    } pops[] = {
        {{"BRPOP", "q", "1"}, 3, true, false},
        {{"BLPOP", "q", "r", "0"}, 4, true, true},
        {{"RPOP", "q"}, 2, true, false},
        {{"LPOP", "q"}, 2, true, true},
        {{"LPOP", "q", "5"}, 3, false, true}, /* with a count: an array of values */
        {{"RPOPLPUSH", "q", "p"}, 3, true, false},
        {{"BRPOPLPUSH", "q", "p", "1"}, 4, true, false},
        {{"LMOVE", "q", "p", "RIGHT", "LEFT"}, 5, true, false},
        {{"BLMOVE", "q", "p", "left", "LEFT", "1"}, 6, true, true},
        {{"LRANGE", "q", "0", "-1"}, 4, false, false},
    };
    for (size_t i = 0; i < sizeof(pops) / sizeof(pops[0]); i++) {
        make_cmd(buf, sizeof(buf), &m, &cv, pops[i].argc, pops[i].argv);
        if (rprof_is_pop(RPROF_LIST, &cv) != pops[i].pop)
            fail_msg("%s: pop %d, expected %d", pops[i].argv[0], !pops[i].pop, pops[i].pop);
        assert_int_equal(rprof_pop_takes_head(&cv), pops[i].head);
        const char *arg;
        bool again;
        assert_int_equal(rprof_reply_of(RPROF_LIST, &cv, &arg, &again),
                         pops[i].pop ? RPROF_REPLY_POP : RPROF_REPLY_PLAIN);
    }
    CMD("RPOPLPUSH", "rq:queue:x", "p");
    assert_false(rprof_is_pop(RPROF_RQ, &cv)); /* another profile's pops are its own */
    /* pushes onto any list publish; LREM processing COUNT JOB acks */
    CMD("RPUSH", "queues:default", "{\"uuid\":\"u-1\"}", "{\"uuid\":\"u-2\"}");
    assert_int_equal(rprof_publish_of(RPROF_LIST, &cv), RPROF_PUB_JOBS);
    CMD("LPUSH", "queues:default", "{\"uuid\":\"u-1\"}");
    assert_int_equal(rprof_publish_of(RPROF_LIST, &cv), RPROF_PUB_JOBS);
    assert_false(rprof_list_ack(RPROF_LIST, &cv, &job));
    CMD("LREM", "processing", "1", "{\"uuid\":\"u-1\"}");
    assert_true(rprof_list_ack(RPROF_LIST, &cv, &job));
    assert_int_equal(job.len, 14);
    assert_memory_equal(buf + job.off, "{\"uuid\":\"u-1\"}", 14);
    assert_false(rprof_list_ack(RPROF_CELERY, &cv, &job));
    size_t first;
    assert_false(rprof_ack_args(RPROF_LIST, &cv, &first)); /* not an ack by id */
    CMD("LREM", "processing", "1");
    assert_false(rprof_list_ack(RPROF_LIST, &cv, &job));
    CMD("LREM", "processing", "1", "a", "b");
    assert_false(rprof_list_ack(RPROF_LIST, &cv, &job));
    /* the list profile's own commands leave the other profiles' plain path alone */
    assert_true(rprof_cmd_matters(RPROF_LIST, RPROF_CMD_LREM));
    assert_true(rprof_cmd_matters(RPROF_LIST, RPROF_CMD_RPOPLPUSH));
    assert_false(rprof_cmd_matters(RPROF_CELERY, RPROF_CMD_LREM));
    assert_false(rprof_cmd_matters(RPROF_NONE, RPROF_CMD_RPOP));
    assert_true(rprof_cmd_matters(RPROF_NONE, RPROF_CMD_LPUSH));
    assert_false(rprof_cmd_matters(RPROF_LIST, RPROF_CMD_OTHER));
    char *q = rprof_queue_of(RPROF_LIST, "queues:default");
    assert_string_equal(q, "queues:default"); /* a plain list is its own queue */
    free(q);
}

/* Reads job v with the list profile's sources ids and tasks (NULL: the defaults). */
static int list_job(const struct msg_fields *ids, const struct msg_fields *tasks, const char *v,
                    struct resp_job *job, uint64_t *too_long)
{
    return rprof_list_job(ids, tasks, v, strlen(v), job, too_long);
}

static void test_list_jobs(void **state)
{
    (void)state;
    struct resp_job job;
    uint64_t too_long;
    /* Laravel's Redis payload has both `id` (RedisQueue's, a random string) and `uuid`
     * (Queue::createPayloadArray's): the defaults take `id`, and displayName as the task. */
    size_t len;
    char *laravel = (char *)kit_golden(&len, "frameworks/lists/01-client.bin");
    assert_non_null(laravel);
    char *start = strstr(laravel, "{\"uuid\"");
    assert_non_null(start);
    char *end = strstr(start, "}\r\n");
    assert_non_null(end);
    assert_int_equal(rprof_list_job(NULL, NULL, start, (size_t)(end + 1 - start), &job, &too_long),
                     0);
    assert_int_equal(strlen(job.id), 32);
    assert_string_equal(job.task, "App\\Jobs\\Charge");
    resp_job_clear(&job);
    struct msg_fields uuid, name;
    one_source(&uuid, "body.json.uuid");
    one_source(&name, "body.json.data.commandName");
    assert_int_equal(rprof_list_job(&uuid, &name, start, (size_t)(end + 1 - start), &job, NULL), 0);
    assert_int_equal(strlen(job.id), 36);
    assert_string_equal(job.task, "App\\Jobs\\Charge");
    resp_job_clear(&job);
    kit_free(laravel);
    /* the other defaults, in order; a job may have no task */
    assert_int_equal(list_job(NULL, NULL, "{\"jid\":\"j\",\"class\":\"C\"}", &job, NULL), 0);
    assert_string_equal(job.id, "j");
    assert_string_equal(job.task, "C");
    resp_job_clear(&job);
    assert_int_equal(
        list_job(NULL, NULL, "{\"name\":\"n\",\"uuid\":\"u\",\"task\":\"t\"}", &job, NULL), 0);
    assert_string_equal(job.id, "u");
    assert_string_equal(job.task, "t");
    resp_job_clear(&job);
    assert_int_equal(list_job(NULL, NULL, "{\"id\":\"x\"}", &job, NULL), 0);
    assert_string_equal(job.id, "x");
    assert_null(job.task);
    resp_job_clear(&job);
    /* no id: not a job (a number, an empty string, a payload that is not a JSON object) */
    const char *not_jobs[] = {"{\"id\":7}",
                              "{\"id\":\"\"}",
                              "1",
                              "[\"id\"]",
                              "{\"id\":\"x\"",
                              "",
                              "{\"uuid\":{\"id\":\"x\"}}"};
    for (size_t i = 0; i < sizeof(not_jobs) / sizeof(not_jobs[0]); i++)
        if (list_job(NULL, NULL, not_jobs[i], &job, NULL) != -1)
            fail_msg("'%s' read as a job", not_jobs[i]);
    /* the listener's sources replace the defaults: `id` is then not read */
    assert_int_equal(list_job(&uuid, NULL, "{\"id\":\"x\"}", &job, NULL), -1);
    /* a value too long for an id is not cut: the next source is read, and the length said */
    char big[MSG_FIELD_VALUE_MAX + 64];
    int n = snprintf(big, sizeof(big), "{\"id\":\"%0*d\",\"uuid\":\"u\"}", MSG_FIELD_VALUE_MAX, 0);
    assert_true(n > 0 && (size_t)n < sizeof(big));
    assert_int_equal(list_job(NULL, NULL, big, &job, &too_long), 0);
    assert_string_equal(job.id, "u");
    assert_int_equal(too_long, MSG_FIELD_VALUE_MAX);
    resp_job_clear(&job);
    /* rprof_job() reads a list job with the defaults */
    assert_int_equal(rprof_job(RPROF_LIST, "{\"uuid\":\"u\"}", 12, &job), 0);
    assert_string_equal(job.id, "u");
    resp_job_clear(&job);
    assert_int_equal(rprof_list_default_ids()->n, 3);
    assert_string_equal(rprof_list_default_tasks()->src[1].text, "body.json.displayName");
}

static void make_reply(const char *bytes, struct resp_msg *m);

static void count_id(void *arg, const char *id)
{
    char *seen = arg;
    strcat(seen, id);
    strcat(seen, ",");
}

/* "<k>:<id>=<token>," for each job of a renewal. */
static void say_pair(void *arg, uint32_t k, const char *id, const char *token)
{
    char *out = arg;
    size_t n = strlen(out);
    snprintf(out + n, 256 - n, "%u:%s=%s,", k, id, token);
}

static void test_bullmq_edges(void **state)
{
    (void)state;
    /* scripts by their opening comment, whatever follows; nothing else is one */
    const struct {
        const char *body;
        enum bmq_script s;
    } bodies[] = {
        {"--[[\n  Adds a job to the queue by doing the following:", BMQ_ADD_STANDARD},
        {"--[[\n  Adds a delayed job to the queue", BMQ_ADD_DELAYED},
        {"--[[\n  Adds a prioritized job", BMQ_ADD_PRIORITIZED},
        {"--[[\n  Adds a parent job", BMQ_ADD_PARENT},
        {"--[[\n  Move next job to be processed to active, lock it", BMQ_MOVE_TO_ACTIVE},
        {"--[[\n  Move job from active to a finished status", BMQ_MOVE_TO_FINISHED},
        {"--[[\n  Extend lock and removes the job from the stalled set.", BMQ_EXTEND_LOCK},
        {"--[[\n  Extend locks for multiple jobs", BMQ_EXTEND_LOCKS},
        {"--[[\n  Move stalled jobs to wait.", BMQ_MOVE_STALLED},
        {"--[[\n  Retries a failed job by moving it back to the wait queue.", BMQ_RETRY_JOB},
        {"--[[\n  Moves job from active to delayed set.", BMQ_MOVE_TO_DELAYED},
        {"--[[\n  Adds a log row to the job", BMQ_SCRIPT_UNKNOWN},
        {"return redis.call('GET', KEYS[1])", BMQ_SCRIPT_UNKNOWN},
        {"--[[", BMQ_SCRIPT_UNKNOWN},
        {"", BMQ_SCRIPT_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        if (bmq_script_of((const uint8_t *)bodies[i].body, strlen(bodies[i].body)) != bodies[i].s)
            fail_msg("'%s' read as %s", bodies[i].body,
                     bmq_script_name(
                         bmq_script_of((const uint8_t *)bodies[i].body, strlen(bodies[i].body))));
    assert_string_equal(bmq_script_name(BMQ_MOVE_TO_ACTIVE), "moveToActive");
    assert_true(bmq_script_adds(BMQ_ADD_PARENT));
    assert_false(bmq_script_adds(BMQ_MOVE_TO_ACTIVE));
    char q[BMQ_QUEUE_MAX];
    assert_true(bmq_queue_of_prefix((const uint8_t *)"bull:orders:", 12, q, sizeof(q)));
    assert_string_equal(q, "orders");
    assert_true(bmq_queue_of_prefix((const uint8_t *)"{app}:bull:orders:", 18, q, sizeof(q)));
    assert_string_equal(q, "orders");
    assert_false(bmq_queue_of_prefix((const uint8_t *)"orders:", 7, q, sizeof(q)));
    assert_false(bmq_queue_of_prefix((const uint8_t *)"bull:orders", 11, q, sizeof(q)));
    assert_false(bmq_queue_of_prefix((const uint8_t *)"bull::", 6, q, sizeof(q)));

    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    struct bmq_call c;
    struct bmq_job j;
    /* an add with the app's own job id */
    const char packed[] = "\x93\xa9"
                          "bull:q:x:"
                          "\xa7order-7\xa6refund";
    CMD("EVALSHA", "0123456789012345678901234567890123456789", "1", "bull:q:x:wait", packed);
    assert_true(bmq_call_of(&cv, &c));
    assert_false(c.eval);
    assert_int_equal(c.numkeys, 1);
    assert_int_equal(bmq_add_args(&cv, &c, &j), 0);
    assert_string_equal(j.id, "order-7");
    assert_string_equal(j.name, "refund");
    assert_string_equal(j.queue, "x");
    /* numkeys beyond the arguments, or not a number: no call */
    CMD("EVALSHA", "0123", "3", "k");
    assert_false(bmq_call_of(&cv, &c));
    CMD("EVAL", "return 1", "x");
    assert_false(bmq_call_of(&cv, &c));
    CMD("EVAL", "return 1", "-1");
    assert_false(bmq_call_of(&cv, &c));
    /* lock renewals: extendLocks' packed ids, extendLock's plain one */
    char seen[256] = "";
    const char ids[] = "\x94\xa1"
                       "1\x91\xa1z\xa2"
                       "22\xc0";
    CMD("EVALSHA", "s", "1", "bull:q:stalled", "bull:q:", "\x91\xa1t", ids, "30000");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_lock_ids(&cv, &c, BMQ_EXTEND_LOCKS, count_id, seen), 2);
    assert_string_equal(seen, "1,22,"); /* a nested array (skipped whole) and nil are no ids */
    seen[0] = '\0';
    CMD("EVALSHA", "s", "2", "bull:q:9:lock", "bull:q:stalled", "token", "30000", "9");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_lock_ids(&cv, &c, BMQ_EXTEND_LOCK, count_id, seen), 1);
    assert_string_equal(seen, "9,");
    assert_int_equal(bmq_lock_ids(&cv, &c, BMQ_MOVE_TO_ACTIVE, count_id, seen), -1);
    /* ... with each id's token, by position; a call whose arrays differ in length is not read */
    char pairs[256] = "";
    uint32_t count = 0;
    const char tokens[] = "\x94\xa2t1\xa2t2\xa2t3\xc0";
    CMD("EVALSHA", "s", "1", "bull:q:stalled", "bull:q:", tokens, ids, "30000");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_lock_each(&cv, &c, BMQ_EXTEND_LOCKS, say_pair, pairs, &count), 0);
    assert_int_equal(count, 4);
    assert_string_equal(pairs, "0:1=t1,2:22=t3,");
    char prefix[BMQ_PREFIX_MAX], token[BMQ_TOKEN_MAX];
    assert_true(bmq_call_prefix(&cv, &c, BMQ_EXTEND_LOCKS, prefix, sizeof(prefix)));
    assert_string_equal(prefix, "bull:q:");
    CMD("EVALSHA", "s", "1", "bull:q:stalled", "bull:q:", "\x91\xa1t", ids, "30000");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_lock_each(&cv, &c, BMQ_EXTEND_LOCKS, say_pair, pairs, &count), -1);
    pairs[0] = '\0';
    CMD("EVALSHA", "s", "2", "bull:q:9:lock", "bull:q:stalled", "tok", "30000", "9");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_lock_each(&cv, &c, BMQ_EXTEND_LOCK, say_pair, pairs, &count), 0);
    assert_string_equal(pairs, "0:9=tok,");
    /* extendLock's prefix: its lock key without "<id>:lock" */
    assert_true(bmq_call_prefix(&cv, &c, BMQ_EXTEND_LOCK, prefix, sizeof(prefix)));
    assert_string_equal(prefix, "bull:q:");
    assert_true(bmq_call_token(&cv, &c, BMQ_EXTEND_LOCK, token, sizeof(token)));
    assert_string_equal(token, "tok");
    CMD("EVALSHA", "s", "2", "bull:q:8:lock", "bull:q:stalled", "tok", "30000", "9");
    assert_true(bmq_call_of(&cv, &c));
    assert_false(bmq_call_prefix(&cv, &c, BMQ_EXTEND_LOCK, prefix, sizeof(prefix)));
    assert_false(bmq_call_prefix(&cv, &c, BMQ_ADD_STANDARD, prefix, sizeof(prefix)));
    /* moveToActive's token in its packed options */
    const char opts[] = "\x82\xa4name\xa1w\xa5token\xa4u:17";
    CMD("EVALSHA", "s", "1", "bull:q:wait", "bull:q:", "1700000000000", opts);
    assert_true(bmq_call_of(&cv, &c));
    assert_true(bmq_call_token(&cv, &c, BMQ_MOVE_TO_ACTIVE, token, sizeof(token)));
    assert_string_equal(token, "u:17");
    CMD("EVALSHA", "s", "1", "bull:q:wait", "bull:q:", "1700000000000", "\x81\xa4name\xa1w");
    assert_true(bmq_call_of(&cv, &c));
    assert_false(bmq_call_token(&cv, &c, BMQ_MOVE_TO_ACTIVE, token, sizeof(token)));
    /* a failed attempt: for good (moveToFinished), or retried (retryJob, moveToDelayed) */
    char id[BMQ_ID_MAX];
    bool failed = false, fetch = true;
    CMD("EVALSHA", "s", "1", "bull:q:active", "7", "1700000000000", "failedReason", "boom",
        "failed", "0", "bull:q:", "\x80", "");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_finish_args(&cv, &c, id, sizeof(id), &failed, &fetch), 0);
    assert_string_equal(id, "7");
    assert_true(failed);
    assert_false(fetch);
    char queue[BMQ_QUEUE_MAX];
    assert_true(bmq_call_queue(&cv, &c, BMQ_MOVE_TO_FINISHED, queue, sizeof(queue)));
    assert_string_equal(queue, "q");
    CMD("EVALSHA", "s", "2", "bull:q:active", "bull:q:wait", "bull:q:", "1700000000000", "LPUSH",
        "8", "token");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_retry_args(&cv, &c, BMQ_RETRY_JOB, id, sizeof(id), &fetch), 0);
    assert_string_equal(id, "8");
    assert_false(fetch);
    CMD("EVALSHA", "s", "1", "bull:q:marker", "bull:q:", "1700000000000", "9", "token", "500", "0",
        "", "1", "\x80");
    assert_true(bmq_call_of(&cv, &c));
    assert_int_equal(bmq_retry_args(&cv, &c, BMQ_MOVE_TO_DELAYED, id, sizeof(id), &fetch), 0);
    assert_string_equal(id, "9");
    assert_true(fetch);
    assert_int_equal(bmq_retry_args(&cv, &c, BMQ_MOVE_TO_FINISHED, id, sizeof(id), &fetch), -1);
    assert_true(bmq_call_token(&cv, &c, BMQ_MOVE_TO_DELAYED, token, sizeof(token)));
    assert_string_equal(token, "token");
    assert_true(bmq_call_queue(&cv, &c, BMQ_MOVE_TO_DELAYED, queue, sizeof(queue)));
    assert_string_equal(queue, "q");
    /* replies */
    make_reply("$2\r\n17\r\n", &m);
    assert_int_equal(bmq_add_reply((const uint8_t *)"$2\r\n17\r\n", &m.value, id, sizeof(id)), 1);
    assert_string_equal(id, "17");
    make_reply(":-5\r\n", &m);
    assert_int_equal(bmq_add_reply((const uint8_t *)":-5\r\n", &m.value, id, sizeof(id)), 0);
    int64_t code = 0;
    make_reply(":-2\r\n", &m);
    assert_true(bmq_finish_code((const uint8_t *)":-2\r\n", &m, &code));
    assert_int_equal(code, -2); /* Missing lock */
    const char none[] = "*4\r\n:0\r\n:0\r\n:0\r\n:0\r\n";
    make_reply(none, &m);
    assert_int_equal(bmq_next_job((const uint8_t *)none, &m, &j), 0);
    const char next[] = "*4\r\n*6\r\n$4\r\nname\r\n$6\r\ncharge\r\n$3\r\natm\r\n$1\r\n2\r\n"
                        "$3\r\nstc\r\n$1\r\n1\r\n$2\r\n42\r\n:0\r\n:0\r\n";
    make_reply(next, &m);
    assert_int_equal(bmq_next_job((const uint8_t *)next, &m, &j), 1);
    assert_string_equal(j.id, "42");
    assert_string_equal(j.name, "charge");
    assert_int_equal(j.attempts_made, 2);
    assert_int_equal(j.stalled, 1);
    assert_false(j.deferred_failure);
    /* a job stalled past maxStalledCount: its worker fails it unrun */
    const char defa[] = "*4\r\n*4\r\n$4\r\nname\r\n$6\r\ncharge\r\n$4\r\ndefa\r\n"
                        "$37\r\njob stalled more than allowable limit\r\n$2\r\n42\r\n:0\r\n:0\r\n";
    make_reply(defa, &m);
    assert_int_equal(bmq_next_job((const uint8_t *)defa, &m, &j), 1);
    assert_true(j.deferred_failure);
    make_reply("+OK\r\n", &m);
    assert_int_equal(bmq_next_job((const uint8_t *)"+OK\r\n", &m, &j), -1);
    const char stalled[] = "*2\r\n$1\r\n3\r\n$1\r\n4\r\n";
    make_reply(stalled, &m);
    seen[0] = '\0';
    assert_int_equal(bmq_stalled_ids((const uint8_t *)stalled, &m, count_id, seen), 2);
    assert_string_equal(seen, "3,4,");
}

static void test_queues(void **state)
{
    (void)state;
    struct {
        enum rprof p;
        const char *key, *queue;
    } cases[] = {
        {RPROF_SIDEKIQ, "queue:default", "default"},
        {RPROF_SIDEKIQ, "retry", "retry"},
        {RPROF_CELERY, "celery", "celery"},
        {RPROF_CELERY,
         "celery\x06\x16"
         "3",
         "celery"}, /* kombu's priority list */
        {RPROF_RQ, "rq:queue:high", "high"},
        {RPROF_RQ, "rq:wip:high", "high"},
        {RPROF_RQ, "rq:other", "rq:other"},
        {RPROF_STREAMS, "jobs", "jobs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *q = rprof_queue_of(cases[i].p, cases[i].key);
        assert_non_null(q);
        assert_string_equal(q, cases[i].queue);
        free(q);
    }
    char out[32];
    assert_true(rprof_rq_queue_of_wip("rq:wip:high", out, sizeof(out)));
    assert_string_equal(out, "rq:queue:high");
    assert_false(rprof_rq_queue_of_wip("rq:queue:high", out, sizeof(out)));
    assert_false(rprof_rq_queue_of_wip("rq:wip:a-very-long-queue-name", out, 16));
    assert_string_equal(rprof_repush_cmd(RPROF_RQ, false), "LPUSH");
    assert_string_equal(rprof_repush_cmd(RPROF_CELERY, false), "RPUSH");
    assert_string_equal(rprof_repush_cmd(RPROF_LIST, true), "LPUSH");
    assert_string_equal(rprof_repush_cmd(RPROF_LIST, false), "RPUSH");
}

static void test_xadd(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    char task[RPROF_TASK_MAX];
    uint64_t n;
    CMD("XADD", "s", "NOMKSTREAM", "maxlen", "~", "1000", "LIMIT", "10", "5-*", "task", "charge");
    assert_int_equal(rprof_xadd_id_arg(&cv), 8);
    assert_int_equal(rprof_xadd_task(&cv, task, sizeof(task), &n), RPROF_FOUND);
    assert_string_equal(task, "charge");
    CMD("XADD", "s", "MINID", "0", "*", "order", "1", "task", "charge_safe");
    assert_int_equal(rprof_xadd_id_arg(&cv), 4);
    assert_int_equal(rprof_xadd_task(&cv, task, sizeof(task), &n), RPROF_FOUND);
    assert_string_equal(task, "charge_safe");
    /* a value "task" is not the field "task" */
    CMD("XADD", "s", "*", "kind", "task", "x", "y");
    assert_int_equal(rprof_xadd_task(&cv, task, sizeof(task), &n), RPROF_ABSENT);
    CMD("XADD", "s", "MAXLEN");
    assert_int_equal(rprof_xadd_id_arg(&cv), 0);
    char longtask[RPROF_TASK_MAX + 1];
    memset(longtask, 't', RPROF_TASK_MAX);
    longtask[RPROF_TASK_MAX] = '\0';
    CMD("XADD", "s", "*", "task", longtask);
    assert_int_equal(rprof_xadd_task(&cv, task, sizeof(task), &n), RPROF_TOO_LONG);
    assert_int_equal(n, RPROF_TASK_MAX);
    longtask[RPROF_TASK_MAX - 1] = '\0';
    CMD("XADD", "s", "*", "task", longtask);
    assert_int_equal(rprof_xadd_task(&cv, task, sizeof(task), &n), RPROF_FOUND);
}

static void test_reply_kinds(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    const char *arg;
    bool again;
    CMD("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_XREAD);
    assert_false(again);
    CMD("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", "0");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_XREAD);
    assert_true(again);
    CMD("XAUTOCLAIM", "s", "g", "c", "1000", "0-0");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_XAUTOCLAIM);
    assert_string_equal(arg, "s");
    CMD("XAUTOCLAIM", "s", "g", "c", "1000", "0-0", "COUNT", "5", "justid");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_PLAIN);
    CMD("XCLAIM", "s", "g", "c", "1000", "1-0", "JUSTID");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_PLAIN);
    CMD("XCLAIM", "s", "g", "c", "1000", "1-0");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_XCLAIM);
    CMD("HGETALL", "rq:job:abc");
    assert_int_equal(rprof_reply_of(RPROF_RQ, &cv, &arg, &again), RPROF_REPLY_RQ_HASH);
    assert_string_equal(arg, "abc");
    assert_int_equal(rprof_reply_of(RPROF_SIDEKIQ, &cv, &arg, &again), RPROF_REPLY_PLAIN);
    assert_null(arg);
    CMD("XADD", "s", "*", "a", "b");
    assert_int_equal(rprof_reply_of(RPROF_STREAMS, &cv, &arg, &again), RPROF_REPLY_XADD);
    assert_int_equal(rprof_reply_of(RPROF_CELERY, &cv, &arg, &again), RPROF_REPLY_PLAIN);
}

/* A reply from its bytes. */
static void make_reply(const char *bytes, struct resp_msg *m)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_SERVER);
    assert_int_equal(resp_scan(&sc, (const uint8_t *)bytes, strlen(bytes), m), 1);
}

static void test_replies(void **state)
{
    (void)state;
    struct resp_msg m;
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    const char *r = "*2\r\n$5\r\nqueue\r\n$3\r\njob\r\n";
    make_reply(r, &m);
    assert_true(rprof_pop_reply((const uint8_t *)r, &m, NULL, list, sizeof(list), &val, &pair));
    assert_true(pair);
    assert_string_equal(list, "queue");
    assert_int_equal(val.len, 3);
    r = "$3\r\njob\r\n"; /* LMOVE: the value alone, its list the command's */
    make_reply(r, &m);
    assert_true(
        rprof_pop_reply((const uint8_t *)r, &m, "rq:queue:a", list, sizeof(list), &val, &pair));
    assert_false(pair);
    assert_string_equal(list, "rq:queue:a");
    assert_false(rprof_pop_reply((const uint8_t *)r, &m, NULL, list, sizeof(list), &val, &pair));
    r = "*-1\r\n"; /* timed out */
    make_reply(r, &m);
    assert_false(rprof_pop_reply((const uint8_t *)r, &m, NULL, list, sizeof(list), &val, &pair));
    r = "*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n";
    make_reply(r, &m);
    assert_false(rprof_pop_reply((const uint8_t *)r, &m, NULL, list, sizeof(list), &val, &pair));

    /* stream entries: [id, [f, v...]] */
    struct rprof_entry ent;
    r = "*2\r\n$3\r\n1-0\r\n*4\r\n$1\r\nx\r\n$1\r\ny\r\n$4\r\ntask\r\n$6\r\ncharge\r\n";
    make_reply(r, &m);
    assert_int_equal(rprof_stream_entry((const uint8_t *)r, m.len, &m.value, &ent), 1);
    assert_string_equal(ent.id, "1-0");
    assert_string_equal(ent.task, "charge");
    assert_null(ent.too_long);
    r = "*2\r\n$3\r\n1-0\r\n*-1\r\n"; /* deleted meanwhile: no fields */
    make_reply(r, &m);
    assert_int_equal(rprof_stream_entry((const uint8_t *)r, m.len, &m.value, &ent), 1);
    assert_string_equal(ent.task, "");
    r = ":1\r\n";
    make_reply(r, &m);
    assert_int_equal(rprof_stream_entry((const uint8_t *)r, m.len, &m.value, &ent), 0);
    /* an id of RPROF_ID_MAX bytes: refused and said */
    char big[RPROF_ID_MAX + 64];
    int k = snprintf(big, sizeof(big), "*1\r\n$%u\r\n", RPROF_ID_MAX);
    memset(big + k, '7', RPROF_ID_MAX);
    memcpy(big + k + RPROF_ID_MAX, "\r\n", 3);
    make_reply(big, &m);
    assert_int_equal(rprof_stream_entry((const uint8_t *)big, m.len, &m.value, &ent), 0);
    assert_string_equal(ent.too_long, "stream entry id");
    assert_int_equal(ent.too_long_len, RPROF_ID_MAX);

    char id[RPROF_ID_MAX];
    uint64_t n;
    r = "$15\r\n1700000000000-0\r\n";
    make_reply(r, &m);
    assert_int_equal(rprof_xadd_reply_id((const uint8_t *)r, &m, id, sizeof(id), &n), RPROF_FOUND);
    assert_string_equal(id, "1700000000000-0");
    r = "-ERR no\r\n";
    make_reply(r, &m);
    assert_int_equal(rprof_xadd_reply_id((const uint8_t *)r, &m, id, sizeof(id), &n), RPROF_ABSENT);

    char *task = NULL;
    r = "*4\r\n$6\r\nstatus\r\n$6\r\nqueued\r\n$11\r\ndescription\r\n$15\r\ntasks.charge(1)\r\n";
    make_reply(r, &m);
    assert_int_equal(rprof_rq_hash_task((const uint8_t *)r, &m, &task), 0);
    assert_string_equal(task, "tasks.charge");
    free(task);
    r = "*2\r\n$6\r\nstatus\r\n$6\r\nqueued\r\n";
    make_reply(r, &m);
    assert_int_equal(rprof_rq_hash_task((const uint8_t *)r, &m, &task), -1);
    assert_null(task);
}

static void count_cmd(void *arg, const struct rprof_cmdview *cv)
{
    (void)cv;
    (*(size_t *)arg)++;
}

static void test_tx_scan_limits(void **state)
{
    (void)state;
    static const char one[] = "*3\r\n$5\r\nRPUSH\r\n$1\r\nq\r\n$1\r\nx\r\n";
    static const char exec[] = "*1\r\n$4\r\nEXEC\r\n";
    size_t cap = (RPROF_TX_MAX + 2) * (sizeof(one) - 1) + sizeof(exec);
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    struct resp_scanner sc;
    struct rprof_tx tx;
    size_t seen;
    for (size_t queued = RPROF_TX_MAX; queued <= RPROF_TX_MAX + 1; queued++) {
        size_t len = 0;
        for (size_t i = 0; i < queued; i++, len += sizeof(one) - 1)
            memcpy(buf + len, one, sizeof(one) - 1);
        resp_scanner_init(&sc, RESP_SIDE_CLIENT);
        seen = 0;
        int waiting = rprof_tx_scan(&sc, buf, len, 0, &tx, count_cmd, &seen);
        assert_int_equal(waiting, queued == RPROF_TX_MAX ? 0 : -1); /* -1: past the limit */
        assert_int_equal(seen, RPROF_TX_MAX);
        memcpy(buf + len, exec, sizeof(exec) - 1);
        len += sizeof(exec) - 1;
        resp_scanner_init(&sc, RESP_SIDE_CLIENT);
        int rc = rprof_tx_scan(&sc, buf, len, 0, &tx, NULL, NULL);
        if (queued == RPROF_TX_MAX) {
            assert_int_equal(rc, 1);
            assert_int_equal(tx.queued, RPROF_TX_MAX);
            assert_true(tx.has_push);
            assert_int_equal(tx.end, len);
        } else {
            assert_int_equal(rc, -1); /* one command too many: not planned */
        }
    }
    free(buf);
    /* DISCARD, a malformed command */
    static const char discard[] = "*1\r\n$7\r\nDISCARD\r\n";
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(
        rprof_tx_scan(&sc, (const uint8_t *)discard, sizeof(discard) - 1, 0, &tx, NULL, NULL), -1);
    static const char bad[] = "*1\r\n$x\r\n";
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(rprof_tx_scan(&sc, (const uint8_t *)bad, sizeof(bad) - 1, 0, &tx, NULL, NULL),
                     -1);
    /* RPROF_TX_PEEK_MAX bytes without EXEC: given up */
    size_t big = RPROF_TX_PEEK_MAX + 64;
    uint8_t *p = malloc(big + 64);
    assert_non_null(p);
    int k = snprintf((char *)p, 64, "*2\r\n$3\r\nSET\r\n$%zu\r\n", big);
    memset(p + k, 'v', big);
    memcpy(p + k + big, "\r\n", 2);
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(rprof_tx_scan(&sc, p, (size_t)k + big + 2, 0, &tx, NULL, NULL), -1);
    free(p);
}

static void test_rq_job_saved(void **state)
{
    (void)state;
    uint8_t buf[4096];
    struct resp_msg m;
    struct rprof_cmdview cv;
    const char *id;
    char *task;
    CMD("HSET", "rq:job:j1", "status", "queued", "description", "tasks.charge(7)");
    assert_true(rprof_rq_job_saved(RPROF_RQ, &cv, &id, &task));
    assert_string_equal(id, "j1");
    assert_string_equal(task, "tasks.charge");
    free(task);
    assert_false(rprof_rq_job_saved(RPROF_CELERY, &cv, &id, &task));
    CMD("HSET", "rq:job:j1", "status", "started");
    assert_false(rprof_rq_job_saved(RPROF_RQ, &cv, &id, &task));
    assert_null(task);
    CMD("HSET", "rq:other:j1", "description", "tasks.charge(7)");
    assert_false(rprof_rq_job_saved(RPROF_RQ, &cv, &id, &task));

    /* A job that ran, saved again (RQ's retry): started_at is set.  At enqueue it is empty. */
    CMD("HSET", "rq:job:j1", "description", "tasks.charge(7)", "started_at", "");
    assert_false(rprof_rq_job_ran(RPROF_RQ, &cv));
    CMD("HSET", "rq:job:j1", "started_at", "2026-12-02T08:00:00.000000Z", "retries_left", "1");
    assert_true(rprof_rq_job_ran(RPROF_RQ, &cv));
    assert_false(rprof_rq_job_ran(RPROF_CELERY, &cv));
    CMD("HSET", "rq:job:j1", "status", "started");
    assert_false(rprof_rq_job_ran(RPROF_RQ, &cv));
    CMD("HSET", "rq:other:j1", "started_at", "2026-12-02T08:00:00.000000Z");
    assert_false(rprof_rq_job_ran(RPROF_RQ, &cv));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sidekiq),
        cmocka_unit_test(test_celery),
        cmocka_unit_test(test_rq),
        cmocka_unit_test(test_rq_lease_and_failed),
        cmocka_unit_test(test_sidekiq_work_hash),
        cmocka_unit_test(test_bullmq_requeue_cmd),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_list_commands),
        cmocka_unit_test(test_list_jobs),
        cmocka_unit_test(test_bullmq),
        cmocka_unit_test(test_bullmq_edges),
        cmocka_unit_test(test_profiles_and_names),
        cmocka_unit_test(test_commands_per_profile),
        cmocka_unit_test(test_queues),
        cmocka_unit_test(test_xadd),
        cmocka_unit_test(test_reply_kinds),
        cmocka_unit_test(test_replies),
        cmocka_unit_test(test_tx_scan_limits),
        cmocka_unit_test(test_rq_job_saved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
