/*
 * resp_profile.c - what a Redis command or reply means to a job framework (resp_profile.h).
 *
 * The facts behind each table entry, with their upstream sources, are in docs/protocols.md:
 * Sidekiq's queue:NAME lists (sidekiq/client.rb, fetch.rb), kombu's Redis transport
 * (kombu/transport/redis.py: the unacked hash and unacked_index zset, the priority lists), RQ's
 * rq:queue / rq:wip / rq:job keys (rq/queue.py, registry.py, job.py), the stream commands, and
 * the reliable-queue pattern of plain lists (Redis's LMOVE documentation).
 */
#include "proto/resp/resp_profile.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proto/resp/resp_job.h"

/* ---- small helpers ----------------------------------------------------------------------- */

static char *dup_n(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (s != NULL) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

/* What follows `prefix` in s, or NULL when s does not start with it. */
static const char *after_prefix(const char *s, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(s, prefix, n) == 0 ? s + n : NULL;
}

static bool starts_with(const char *s, const char *prefix)
{
    return after_prefix(s, prefix) != NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static bool is(const struct rprof_cmdview *cv, enum rprof_cmd id)
{
    return cv->id == id;
}

bool rprof_view_str(const uint8_t *buf, size_t len, const struct resp_view *v, char *out,
                    size_t cap)
{
    int n = resp_view_copy(buf, len, v, (uint8_t *)out, cap - 1);
    if (n < 0) {
        out[0] = '\0';
        return false;
    }
    bool fits = (size_t)n < cap;
    out[fits ? (size_t)n : cap - 1] = '\0';
    return fits && memchr(out, '\0', (size_t)n) == NULL;
}

bool rprof_is_agg(const struct resp_view *v)
{
    return !v->null && (v->type == '*' || v->type == '%' || v->type == '~');
}

void rprof_walk_init(struct resp_args *it, const uint8_t *buf, size_t len,
                     const struct resp_view *agg)
{
    struct resp_msg m;
    memset(&m, 0, sizeof(m));
    m.len = len;
    m.nelem = agg->count;
    m.body = agg->off;
    m.type = agg->type;
    resp_args_init(it, buf, &m);
}

/* v read into out[0..cap), or why not. */
static enum rprof_field field_str(const uint8_t *buf, size_t len, const struct resp_view *v,
                                  char *out, size_t cap, uint64_t *vlen)
{
    *vlen = v->len;
    if (v->len >= cap) {
        out[0] = '\0';
        return RPROF_TOO_LONG;
    }
    return rprof_view_str(buf, len, v, out, cap) ? RPROF_FOUND : RPROF_ABSENT;
}

/* ---- profiles and commands --------------------------------------------------------------- */

enum rprof rprof_of(const char *name)
{
    static const struct {
        const char *name;
        enum rprof p;
    } names[] = {{"sidekiq", RPROF_SIDEKIQ}, {"celery", RPROF_CELERY}, {"rq", RPROF_RQ},
                 {"streams", RPROF_STREAMS}, {"list", RPROF_LIST},     {"bullmq", RPROF_BULLMQ}};
    for (size_t i = 0; name != NULL && i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i].name) == 0)
            return names[i].p;
    return RPROF_NONE;
}

struct cmd_name {
    const char *name;
    size_t len;
    enum rprof_cmd id;
};

#define CMD_NAME(s, id)                                                                            \
    {                                                                                              \
        s, sizeof(s) - 1, RPROF_CMD_##id                                                           \
    }

static const struct cmd_name cmd_names_4[] = {
    CMD_NAME("AUTH", AUTH), CMD_NAME("EVAL", EVAL), CMD_NAME("EXEC", EXEC), CMD_NAME("HDEL", HDEL),
    CMD_NAME("HSET", HSET), CMD_NAME("LPOP", LPOP), CMD_NAME("LREM", LREM), CMD_NAME("RPOP", RPOP),
    CMD_NAME("XACK", XACK), CMD_NAME("XADD", XADD), CMD_NAME("ZADD", ZADD), CMD_NAME("ZREM", ZREM)};
static const struct cmd_name cmd_names_5[] = {CMD_NAME("BLPOP", BLPOP), CMD_NAME("BRPOP", BRPOP),
                                              CMD_NAME("HELLO", HELLO), CMD_NAME("LMOVE", LMOVE),
                                              CMD_NAME("LPUSH", LPUSH), CMD_NAME("MULTI", MULTI),
                                              CMD_NAME("RPUSH", RPUSH)};
static const struct cmd_name cmd_names_6[] = {
    CMD_NAME("BLMOVE", BLMOVE), CMD_NAME("SCRIPT", SCRIPT), CMD_NAME("SELECT", SELECT),
    CMD_NAME("XCLAIM", XCLAIM)};
static const struct cmd_name cmd_names_7[] = {
    CMD_NAME("DISCARD", DISCARD), CMD_NAME("EVALSHA", EVALSHA), CMD_NAME("HGETALL", HGETALL)};
static const struct cmd_name cmd_names_9[] = {CMD_NAME("RPOPLPUSH", RPOPLPUSH)};
static const struct cmd_name cmd_names_10[] = {CMD_NAME("BRPOPLPUSH", BRPOPLPUSH),
                                               CMD_NAME("XAUTOCLAIM", XAUTOCLAIM),
                                               CMD_NAME("XREADGROUP", XREADGROUP)};
static const struct cmd_name cmd_names_16[] = {CMD_NAME("ZREMRANGEBYSCORE", ZREMRANGEBYSCORE)};

static enum rprof_cmd cmd_find(const struct cmd_name *t, size_t count, const char *name, size_t n)
{
    for (size_t i = 0; i < count; i++)
        if (t[i].len == n && t[i].name[0] == name[0] && memcmp(t[i].name, name, n) == 0)
            return t[i].id;
    return RPROF_CMD_OTHER;
}

/* A switch on the length, then a few compares: asked once per command of every pipeline. */
#define CMD_FIND(t) cmd_find(t, sizeof(t) / sizeof(t[0]), name, n)

enum rprof_cmd rprof_cmd_of(const char *name, size_t n)
{
    switch (n) {
    case 4:
        return CMD_FIND(cmd_names_4);
    case 5:
        return CMD_FIND(cmd_names_5);
    case 6:
        return CMD_FIND(cmd_names_6);
    case 7:
        return CMD_FIND(cmd_names_7);
    case 9:
        return CMD_FIND(cmd_names_9);
    case 10:
        return CMD_FIND(cmd_names_10);
    case 16:
        return CMD_FIND(cmd_names_16);
    default:
        return RPROF_CMD_OTHER;
    }
}

bool rprof_cmd_matters(enum rprof p, enum rprof_cmd id)
{
    if (p == RPROF_BULLMQ)
        switch (id) {
        case RPROF_CMD_AUTH:
        case RPROF_CMD_HELLO:
        case RPROF_CMD_SELECT:
        case RPROF_CMD_MULTI:
        case RPROF_CMD_EXEC:
        case RPROF_CMD_DISCARD:
        case RPROF_CMD_EVAL:
        case RPROF_CMD_EVALSHA:
        case RPROF_CMD_SCRIPT:
            return true;
        default:
            return false;
        }
    switch (id) {
    case RPROF_CMD_OTHER:
    case RPROF_CMD_EVAL:
    case RPROF_CMD_EVALSHA:
    case RPROF_CMD_SCRIPT:
        return false;
    case RPROF_CMD_RPOP:
    case RPROF_CMD_LREM:
    case RPROF_CMD_RPOPLPUSH:
    case RPROF_CMD_BRPOPLPUSH:
        return p == RPROF_LIST;
    case RPROF_CMD_ZADD:
    case RPROF_CMD_ZREMRANGEBYSCORE:
        return p == RPROF_RQ;
    default:
        return true;
    }
}

void rprof_cmdview_init(struct rprof_cmdview *cv, const uint8_t *buf, const struct resp_msg *m,
                        bool want_key)
{
    /* Once per command: the two strings are set, not the whole struct cleared. */
    cv->buf = buf;
    cv->len = m->len;
    cv->m = m;
    cv->key[0] = '\0';
    cv->has_key = false;
    cv->id = rprof_cmd_of(cv->name, resp_cmd_name_copy(buf, m, cv->name)); /* "" without words */
    if (m->nelem >= 2 && (want_key || cv->id != RPROF_CMD_OTHER))
        cv->has_key = rprof_view_str(buf, m->len, &m->elem[1], cv->key, sizeof(cv->key));
}

bool rprof_arg(const struct rprof_cmdview *cv, size_t i, struct resp_view *v)
{
    if (i >= cv->m->nelem)
        return false;
    if (i < RESP_MSG_VIEWS) {
        *v = cv->m->elem[i];
        return true;
    }
    struct resp_args it;
    resp_args_init(&it, cv->buf, cv->m);
    for (size_t k = 0; k <= i; k++)
        if (resp_args_next(&it, v) != 1)
            return false;
    return true;
}

bool rprof_arg_is(const struct rprof_cmdview *cv, const struct resp_view *v, const char *word)
{
    size_t n = strlen(word);
    return v->len == n && v->off <= cv->len && n <= cv->len - v->off &&
           strncasecmp((const char *)cv->buf + v->off, word, n) == 0;
}

/* ---- what a command does ----------------------------------------------------------------- */

bool rprof_is_pop(enum rprof p, const struct rprof_cmdview *cv)
{
    if (!cv->has_key)
        return false;
    switch (p) {
    case RPROF_SIDEKIQ:
        return is(cv, RPROF_CMD_BRPOP) && starts_with(cv->key, RPROF_SIDEKIQ_QUEUE_PREFIX);
    case RPROF_CELERY:
        return is(cv, RPROF_CMD_BRPOP);
    case RPROF_RQ:
        return (is(cv, RPROF_CMD_BLPOP) || is(cv, RPROF_CMD_LPOP) || is(cv, RPROF_CMD_BLMOVE) ||
                is(cv, RPROF_CMD_LMOVE)) &&
               starts_with(cv->key, RPROF_RQ_QUEUE_PREFIX);
    case RPROF_LIST:
        /* LPOP key count answers an array of values, which is not read. */
        return is(cv, RPROF_CMD_BRPOP) || is(cv, RPROF_CMD_BLPOP) || is(cv, RPROF_CMD_LMOVE) ||
               is(cv, RPROF_CMD_BLMOVE) || is(cv, RPROF_CMD_RPOPLPUSH) ||
               is(cv, RPROF_CMD_BRPOPLPUSH) ||
               ((is(cv, RPROF_CMD_LPOP) || is(cv, RPROF_CMD_RPOP)) && cv->m->nelem == 2);
    default:
        return false;
    }
}

bool rprof_pop_takes_head(const struct rprof_cmdview *cv)
{
    struct resp_view end;
    if (is(cv, RPROF_CMD_LMOVE) || is(cv, RPROF_CMD_BLMOVE))
        return rprof_arg(cv, 3, &end) && rprof_arg_is(cv, &end, "LEFT");
    return is(cv, RPROF_CMD_BLPOP) || is(cv, RPROF_CMD_LPOP);
}

bool rprof_pop_moves_to(const struct rprof_cmdview *cv, char *out, size_t cap)
{
    struct resp_view dst;
    out[0] = '\0';
    return (is(cv, RPROF_CMD_LMOVE) || is(cv, RPROF_CMD_BLMOVE) || is(cv, RPROF_CMD_RPOPLPUSH) ||
            is(cv, RPROF_CMD_BRPOPLPUSH)) &&
           rprof_arg(cv, 2, &dst) && rprof_view_str(cv->buf, cv->len, &dst, out, cap);
}

bool rprof_list_ack(enum rprof p, const struct rprof_cmdview *cv, struct resp_view *job)
{
    return p == RPROF_LIST && is(cv, RPROF_CMD_LREM) && cv->has_key && cv->m->nelem == 4 &&
           rprof_arg(cv, 3, job);
}

bool rprof_ack_args(enum rprof p, const struct rprof_cmdview *cv, size_t *first)
{
    if (!cv->has_key)
        return false;
    switch (p) {
    case RPROF_CELERY:
        if (is(cv, RPROF_CMD_ZREM) && ends_with(cv->key, "unacked_index"))
            return *first = 2, true;
        return false;
    case RPROF_RQ:
        if (is(cv, RPROF_CMD_ZREM) && starts_with(cv->key, RPROF_RQ_WIP_PREFIX))
            return *first = 2, true;
        return false;
    case RPROF_STREAMS:
        if (is(cv, RPROF_CMD_XACK))
            return *first = 3, true;
        return false;
    default:
        return false;
    }
}

enum rprof_publish rprof_publish_of(enum rprof p, const struct rprof_cmdview *cv)
{
    if (!cv->has_key || cv->m->nelem < 3)
        return RPROF_PUB_NONE;
    bool lpush = is(cv, RPROF_CMD_LPUSH), rpush = is(cv, RPROF_CMD_RPUSH);
    switch (p) {
    case RPROF_SIDEKIQ:
        return lpush && starts_with(cv->key, RPROF_SIDEKIQ_QUEUE_PREFIX) ? RPROF_PUB_JOBS
                                                                         : RPROF_PUB_NONE;
    case RPROF_CELERY:
        return lpush ? RPROF_PUB_JOBS : RPROF_PUB_NONE;
    case RPROF_RQ:
        return (lpush || rpush) && starts_with(cv->key, RPROF_RQ_QUEUE_PREFIX) ? RPROF_PUB_RQ_ID
                                                                               : RPROF_PUB_NONE;
    case RPROF_STREAMS:
        return is(cv, RPROF_CMD_XADD) ? RPROF_PUB_XADD : RPROF_PUB_NONE;
    case RPROF_LIST:
        return lpush || rpush ? RPROF_PUB_JOBS : RPROF_PUB_NONE;
    default:
        return RPROF_PUB_NONE;
    }
}

/* A body.json source of one key, as msg_field_parse() makes it. */
#define JSON_SOURCE(k)                                                                             \
    {                                                                                              \
        .kind = MSG_FIELD_BODY_JSON, .text = "body.json." k, .name = k, .nkeys = 1                 \
    }

static const struct msg_fields list_ids = {
    .src = {JSON_SOURCE("id"), JSON_SOURCE("uuid"), JSON_SOURCE("jid")},
    .n = 3,
};
static const struct msg_fields list_tasks = {
    .src = {JSON_SOURCE("task"), JSON_SOURCE("displayName"), JSON_SOURCE("name"),
            JSON_SOURCE("class")},
    .n = 4,
};

const struct msg_fields *rprof_list_default_ids(void)
{
    return &list_ids;
}

const struct msg_fields *rprof_list_default_tasks(void)
{
    return &list_tasks;
}

/* The first of fs's sources the payload has, malloc'd into *out; 0, 1 (none), -1 (no memory). */
static int list_field(const struct msg_fields *fs, const void *v, size_t n, char **out,
                      uint64_t *too_long)
{
    *out = NULL;
    for (size_t i = 0; i < fs->n; i++) {
        char val[MSG_FIELD_VALUE_MAX];
        size_t len = 0;
        enum msg_field_got got = msg_field_read_json(&fs->src[i], v, n, val, &len);
        if (got == MSG_FIELD_TOO_LONG && too_long != NULL && *too_long == 0)
            *too_long = len;
        if (got != MSG_FIELD_FOUND)
            continue;
        return (*out = dup_n(val, len)) != NULL ? 0 : -1;
    }
    return 1;
}

int rprof_list_job(const struct msg_fields *ids, const struct msg_fields *tasks, const void *v,
                   size_t n, struct resp_job *j, uint64_t *too_long)
{
    memset(j, 0, sizeof(*j));
    if (too_long != NULL)
        *too_long = 0;
    if (ids == NULL || ids->n == 0)
        ids = &list_ids;
    if (tasks == NULL || tasks->n == 0)
        tasks = &list_tasks;
    if (list_field(ids, v, n, &j->id, too_long) != 0 ||
        list_field(tasks, v, n, &j->task, too_long) < 0) {
        resp_job_clear(j);
        return -1;
    }
    return 0;
}

int rprof_job(enum rprof p, const void *v, size_t n, struct resp_job *j)
{
    memset(j, 0, sizeof(*j));
    switch (p) {
    case RPROF_SIDEKIQ:
        return resp_job_sidekiq(v, n, j);
    case RPROF_CELERY:
        return resp_job_celery(v, n, j);
    case RPROF_LIST:
        return rprof_list_job(NULL, NULL, v, n, j, NULL);
    default:
        return -1;
    }
}

char *rprof_queue_of(enum rprof p, const char *key)
{
    const char *name;
    if (p == RPROF_SIDEKIQ && (name = after_prefix(key, RPROF_SIDEKIQ_QUEUE_PREFIX)) != NULL)
        return strdup(name);
    if (p == RPROF_RQ && ((name = after_prefix(key, RPROF_RQ_QUEUE_PREFIX)) != NULL ||
                          (name = after_prefix(key, RPROF_RQ_WIP_PREFIX)) != NULL ||
                          (name = after_prefix(key, RPROF_RQ_FAILED_PREFIX)) != NULL))
        return strdup(name);
    if (p == RPROF_CELERY) {
        /* kombu's priority lists: "<queue>\x06\x16<priority>" */
        const char *sep = strstr(key, "\x06\x16");
        return sep != NULL ? dup_n(key, (size_t)(sep - key)) : strdup(key);
    }
    return strdup(key);
}

const char *rprof_repush_cmd(enum rprof p, bool head)
{
    return p == RPROF_RQ || head ? "LPUSH" : "RPUSH";
}

bool rprof_rq_queue_of_wip(const char *key, char *out, size_t cap)
{
    const char *name = after_prefix(key, RPROF_RQ_WIP_PREFIX);
    if (name == NULL)
        return false;
    size_t need = strlen(RPROF_RQ_QUEUE_PREFIX) + strlen(name) + 1;
    if (need > cap)
        return false;
    memcpy(out, RPROF_RQ_QUEUE_PREFIX, strlen(RPROF_RQ_QUEUE_PREFIX));
    memcpy(out + strlen(RPROF_RQ_QUEUE_PREFIX), name, strlen(name) + 1);
    return true;
}

bool rprof_is_celery_unacked_hdel(enum rprof p, const struct rprof_cmdview *cv)
{
    return p == RPROF_CELERY && is(cv, RPROF_CMD_HDEL) && cv->has_key &&
           ends_with(cv->key, "unacked") && cv->m->nelem >= 3;
}

int64_t rprof_settled_count(const struct rprof_cmdview *cv)
{
    if (is(cv, RPROF_CMD_XACK))
        return cv->m->nelem > 3 ? (int64_t)cv->m->nelem - 3 : 0;
    if (is(cv, RPROF_CMD_ZREM) || is(cv, RPROF_CMD_HDEL))
        return cv->m->nelem > 2 ? (int64_t)cv->m->nelem - 2 : 0;
    return 1;
}

size_t rprof_xadd_id_arg(const struct rprof_cmdview *cv)
{
    struct resp_view a;
    size_t i = 2;
    while (rprof_arg(cv, i, &a)) {
        if (rprof_arg_is(cv, &a, "NOMKSTREAM")) {
            i++;
        } else if (rprof_arg_is(cv, &a, "MAXLEN") || rprof_arg_is(cv, &a, "MINID")) {
            i++;
            if (rprof_arg(cv, i, &a) && (rprof_arg_is(cv, &a, "=") || rprof_arg_is(cv, &a, "~")))
                i++;
            i++; /* the threshold */
        } else if (rprof_arg_is(cv, &a, "LIMIT")) {
            i += 2; /* Redis takes the options in any order */
        } else {
            return i;
        }
    }
    return 0;
}

enum rprof_field rprof_xadd_task(const struct rprof_cmdview *cv, char *out, size_t cap,
                                 uint64_t *len)
{
    out[0] = '\0';
    *len = 0;
    size_t at = rprof_xadd_id_arg(cv);
    struct resp_view f, v;
    for (size_t i = at + 1; at != 0 && rprof_arg(cv, i, &f) && rprof_arg(cv, i + 1, &v); i += 2)
        if (resp_view_equals(cv->buf, cv->len, &f, "task"))
            return field_str(cv->buf, cv->len, &v, out, cap, len);
    return RPROF_ABSENT;
}

bool rprof_rq_job_saved(enum rprof p, const struct rprof_cmdview *cv, const char **id, char **task)
{
    *task = NULL;
    if (p != RPROF_RQ || !is(cv, RPROF_CMD_HSET) || !cv->has_key ||
        (*id = after_prefix(cv->key, RPROF_RQ_JOB_PREFIX)) == NULL)
        return false;
    struct resp_view f, v;
    for (size_t i = 2; rprof_arg(cv, i, &f) && rprof_arg(cv, i + 1, &v); i += 2) {
        if (!resp_view_equals(cv->buf, cv->len, &f, "description") || v.type != '$')
            continue;
        char *t = NULL;
        if (resp_job_rq_task(cv->buf + v.off, v.len, &t) == 0) {
            free(*task); /* the last description wins, as it does in the hash */
            *task = t;
        }
    }
    return *task != NULL;
}

/* The one member of ZADD KEY [flags] SCORE MEMBER into *member, and whether XX, NX and CH were
 * among the flags; false for INCR or anything but one score and one member. */
static bool zadd_one(const struct rprof_cmdview *cv, struct resp_view *member, bool *xx, bool *nx,
                     bool *ch)
{
    *xx = *nx = *ch = false;
    size_t i = 2;
    struct resp_view a;
    for (; rprof_arg(cv, i, &a); i++) {
        if (rprof_arg_is(cv, &a, "XX"))
            *xx = true;
        else if (rprof_arg_is(cv, &a, "NX"))
            *nx = true;
        else if (rprof_arg_is(cv, &a, "CH"))
            *ch = true;
        else if (rprof_arg_is(cv, &a, "INCR"))
            return false;
        else if (!rprof_arg_is(cv, &a, "GT") && !rprof_arg_is(cv, &a, "LT"))
            break;
    }
    return cv->m->nelem == i + 2 && rprof_arg(cv, i + 1, member) && member->type == '$' &&
           !member->null;
}

bool rprof_rq_lease(enum rprof p, const struct rprof_cmdview *cv, struct resp_view *id)
{
    /* Without CH a renewal of a member there answers 0, which is what twice answers for one it
     * keeps back; RQ sends no CH. */
    bool xx, nx, ch;
    return p == RPROF_RQ && is(cv, RPROF_CMD_ZADD) && cv->has_key &&
           starts_with(cv->key, RPROF_RQ_WIP_PREFIX) && zadd_one(cv, id, &xx, &nx, &ch) && xx &&
           !nx && !ch;
}

bool rprof_rq_failed(enum rprof p, const struct rprof_cmdview *cv, struct resp_view *id)
{
    bool xx, nx, ch;
    return p == RPROF_RQ && is(cv, RPROF_CMD_ZADD) && cv->has_key &&
           starts_with(cv->key, RPROF_RQ_FAILED_PREFIX) && zadd_one(cv, id, &xx, &nx, &ch) && !xx &&
           !nx;
}

bool rprof_rq_reaps(enum rprof p, const struct rprof_cmdview *cv)
{
    return p == RPROF_RQ && is(cv, RPROF_CMD_ZREMRANGEBYSCORE) && cv->has_key &&
           starts_with(cv->key, RPROF_RQ_WIP_PREFIX);
}

bool rprof_rq_job_heartbeat(enum rprof p, const struct rprof_cmdview *cv, const char *id)
{
    const char *of;
    struct resp_view f;
    return p == RPROF_RQ && is(cv, RPROF_CMD_HSET) && cv->has_key && cv->m->nelem == 4 &&
           (of = after_prefix(cv->key, RPROF_RQ_JOB_PREFIX)) != NULL && strcmp(of, id) == 0 &&
           rprof_arg(cv, 2, &f) && resp_view_equals(cv->buf, cv->len, &f, "last_heartbeat");
}

bool rprof_rq_job_ran(enum rprof p, const struct rprof_cmdview *cv)
{
    if (p != RPROF_RQ || !is(cv, RPROF_CMD_HSET) || !cv->has_key ||
        after_prefix(cv->key, RPROF_RQ_JOB_PREFIX) == NULL)
        return false;
    bool ran = false;
    struct resp_view f, v;
    for (size_t i = 2; rprof_arg(cv, i, &f) && rprof_arg(cv, i + 1, &v); i += 2)
        if (resp_view_equals(cv->buf, cv->len, &f, "started_at"))
            ran = v.type == '$' && v.len > 0; /* the last one wins, as in the hash */
    return ran;
}

bool rprof_sidekiq_work(enum rprof p, const struct rprof_cmdview *cv, size_t *identity_len)
{
    static const char *const suffix[] = {":workers", ":work"};
    if (p != RPROF_SIDEKIQ || !is(cv, RPROF_CMD_HSET) || !cv->has_key || cv->m->nelem < 4 ||
        cv->m->nelem % 2 != 0)
        return false;
    size_t n = strlen(cv->key);
    for (size_t i = 0; i < 2; i++) {
        size_t s = strlen(suffix[i]);
        if (n > s && memcmp(cv->key + n - s, suffix[i], s) == 0) {
            *identity_len = n - s;
            return true;
        }
    }
    return false;
}

/* ---- the reply a command will get -------------------------------------------------------- */

/* XCLAIM and XAUTOCLAIM with JUSTID answer ids only: nothing is delivered. */
static bool claims_justid(const struct rprof_cmdview *cv)
{
    struct resp_view a;
    for (size_t i = 5; rprof_arg(cv, i, &a); i++)
        if (rprof_arg_is(cv, &a, "JUSTID"))
            return true;
    return false;
}

static enum rprof_reply stream_reply_of(const struct rprof_cmdview *cv, const char **arg,
                                        bool *redelivered)
{
    if (is(cv, RPROF_CMD_XREADGROUP)) {
        /* An id other than '>' re-reads the consumer's pending entries. */
        struct resp_view last;
        if (rprof_arg(cv, cv->m->nelem - 1, &last))
            *redelivered = !resp_view_equals(cv->buf, cv->len, &last, ">");
        return RPROF_REPLY_XREAD;
    }
    if ((is(cv, RPROF_CMD_XCLAIM) || is(cv, RPROF_CMD_XAUTOCLAIM)) && cv->has_key &&
        !claims_justid(cv)) {
        *arg = cv->key;
        return is(cv, RPROF_CMD_XCLAIM) ? RPROF_REPLY_XCLAIM : RPROF_REPLY_XAUTOCLAIM;
    }
    if (is(cv, RPROF_CMD_XADD) && cv->has_key) {
        *arg = cv->key;
        return RPROF_REPLY_XADD;
    }
    return RPROF_REPLY_PLAIN;
}

enum rprof_reply rprof_reply_of(enum rprof p, const struct rprof_cmdview *cv, const char **arg,
                                bool *redelivered)
{
    *arg = NULL;
    *redelivered = false;
    if (rprof_is_pop(p, cv)) {
        *arg = cv->key;
        return RPROF_REPLY_POP;
    }
    const char *id;
    if (p == RPROF_RQ && is(cv, RPROF_CMD_HGETALL) && cv->has_key &&
        (id = after_prefix(cv->key, RPROF_RQ_JOB_PREFIX)) != NULL) {
        *arg = id;
        return RPROF_REPLY_RQ_HASH;
    }
    if (p == RPROF_STREAMS)
        return stream_reply_of(cv, arg, redelivered);
    return RPROF_REPLY_PLAIN;
}

bool rprof_pop_reply(const uint8_t *buf, const struct resp_msg *m, const char *own_list, char *list,
                     size_t cap, struct resp_view *val, bool *pair)
{
    *pair = false;
    if (m->null || cap == 0)
        return false;
    if (m->type == '*' && m->nelem == 2 && m->elem[0].type == '$' && m->elem[1].type == '$') {
        if (!rprof_view_str(buf, m->len, &m->elem[0], list, cap))
            return false;
        *val = m->elem[1];
        *pair = true;
        return true;
    }
    if (m->type == '$' && own_list != NULL && strlen(own_list) < cap) {
        memcpy(list, own_list, strlen(own_list) + 1);
        *val = m->value;
        return true;
    }
    return false;
}

/* The value of field `name` in an entry's [f, v, ...] array. */
static enum rprof_field entry_field(const uint8_t *buf, size_t len, const struct resp_view *fields,
                                    const char *name, char *out, size_t cap, uint64_t *vlen)
{
    out[0] = '\0';
    if (!rprof_is_agg(fields))
        return RPROF_ABSENT;
    struct resp_args it;
    rprof_walk_init(&it, buf, len, fields);
    struct resp_view f, v;
    while (resp_args_next(&it, &f) == 1) {
        if (resp_args_next(&it, &v) != 1)
            return RPROF_ABSENT;
        if (resp_view_equals(buf, len, &f, name))
            return field_str(buf, len, &v, out, cap, vlen);
    }
    return RPROF_ABSENT;
}

int rprof_stream_entry(const uint8_t *buf, size_t len, const struct resp_view *e,
                       struct rprof_entry *out)
{
    out->id[0] = out->task[0] = '\0';
    out->too_long = NULL;
    out->too_long_len = 0;
    if (!rprof_is_agg(e) || e->count < 1)
        return 0;
    struct resp_args it;
    rprof_walk_init(&it, buf, len, e);
    struct resp_view idv, fields;
    uint64_t n;
    if (resp_args_next(&it, &idv) != 1)
        return 0;
    enum rprof_field got = field_str(buf, len, &idv, out->id, sizeof(out->id), &n);
    if (got != RPROF_FOUND) {
        if (got == RPROF_TOO_LONG)
            out->too_long = "stream entry id", out->too_long_len = n;
        return 0;
    }
    if (resp_args_next(&it, &fields) == 1 &&
        entry_field(buf, len, &fields, "task", out->task, sizeof(out->task), &n) == RPROF_TOO_LONG)
        out->too_long = "task", out->too_long_len = n;
    return 1;
}

enum rprof_field rprof_xadd_reply_id(const uint8_t *buf, const struct resp_msg *m, char *out,
                                     size_t cap, uint64_t *len)
{
    out[0] = '\0';
    *len = 0;
    if (m->type != '$' || m->null)
        return RPROF_ABSENT;
    return field_str(buf, m->len, &m->value, out, cap, len);
}

int rprof_rq_hash_task(const uint8_t *buf, const struct resp_msg *m, char **task)
{
    *task = NULL;
    if (!rprof_is_agg(&m->value))
        return -1;
    struct resp_args it;
    resp_args_init(&it, buf, m);
    struct resp_view f, v;
    while (resp_args_next(&it, &f) == 1 && resp_args_next(&it, &v) == 1) {
        if (!resp_view_equals(buf, m->len, &f, "description") || v.type != '$')
            continue;
        return resp_job_rq_task(buf + v.off, v.len, task);
    }
    return -1;
}

/* ---- transactions ------------------------------------------------------------------------ */

int rprof_tx_scan(struct resp_scanner *sc, const uint8_t *buf, size_t len, size_t off,
                  struct rprof_tx *tx, rprof_tx_fn each, void *arg)
{
    memset(tx, 0, sizeof(*tx));
    size_t pos = off;
    while (pos < len) {
        struct resp_msg m;
        int rc = resp_scan(sc, buf + pos, len - pos, &m);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
        struct rprof_cmdview cv;
        rprof_cmdview_init(&cv, buf + pos, &m, true);
        pos += m.len;
        resp_scanner_reset(sc);
        if (is(&cv, RPROF_CMD_EXEC) || is(&cv, RPROF_CMD_DISCARD)) {
            tx->end = pos;
            return is(&cv, RPROF_CMD_EXEC) ? 1 : -1;
        }
        if (++tx->queued > RPROF_TX_MAX)
            return -1;
        if (is(&cv, RPROF_CMD_LPUSH) || is(&cv, RPROF_CMD_RPUSH))
            tx->has_push = true;
        if (each != NULL)
            each(arg, &cv);
    }
    return pos - off > RPROF_TX_PEEK_MAX ? -1 : 0;
}
