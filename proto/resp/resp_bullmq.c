/*
 * resp_bullmq.c - BullMQ's scripts and the jobs in them (resp_bullmq.h).  The facts, with their
 * sources in BullMQ's src/commands/ (the .lua scripts) and src/classes/scripts.ts, are in
 * docs/protocols.md.
 */
#include "proto/resp/resp_bullmq.h"

#include <stdio.h>
#include <string.h>

#include "proto/base/msgpack.h"

/* ---- scripts ----------------------------------------------------------------------------- */

static const struct {
    enum bmq_script s;
    const char *name;
    const char *header; /* the first words of the body's opening comment */
} scripts[] = {
    {BMQ_SCRIPT_UNKNOWN, "unknown", NULL},
    {BMQ_ADD_STANDARD, "addStandardJob", "Adds a job to the queue"},
    {BMQ_ADD_DELAYED, "addDelayedJob", "Adds a delayed job"},
    {BMQ_ADD_PRIORITIZED, "addPrioritizedJob", "Adds a prioritized job"},
    {BMQ_ADD_PARENT, "addParentJob", "Adds a parent job"},
    {BMQ_MOVE_TO_ACTIVE, "moveToActive", "Move next job to be processed to active"},
    {BMQ_MOVE_TO_FINISHED, "moveToFinished", "Move job from active to a finished status"},
    {BMQ_EXTEND_LOCK, "extendLock", "Extend lock and removes the job from the stalled set"},
    {BMQ_EXTEND_LOCKS, "extendLocks", "Extend locks for multiple jobs"},
    {BMQ_MOVE_STALLED, "moveStalledJobsToWait", "Move stalled jobs to wait"},
    {BMQ_RETRY_JOB, "retryJob", "Retries a failed job by moving it back to the wait queue"},
    {BMQ_MOVE_TO_DELAYED, "moveToDelayed", "Moves job from active to delayed set"},
};

enum bmq_script bmq_script_of(const uint8_t *body, size_t n)
{
    /* "--[[" then blanks and newlines, then the header */
    size_t i = 0;
    if (n < 4 || memcmp(body, "--[[", 4) != 0)
        return BMQ_SCRIPT_UNKNOWN;
    for (i = 4; i < n && i < 64 &&
                (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t');
         i++)
        ;
    for (size_t k = 1; k < sizeof(scripts) / sizeof(scripts[0]); k++) {
        size_t h = strlen(scripts[k].header);
        if (n - i >= h && memcmp(body + i, scripts[k].header, h) == 0)
            return scripts[k].s;
    }
    return BMQ_SCRIPT_UNKNOWN;
}

const char *bmq_script_name(enum bmq_script s)
{
    return s < BMQ_SCRIPT_COUNT ? scripts[s].name : "unknown";
}

bool bmq_script_adds(enum bmq_script s)
{
    return s == BMQ_ADD_STANDARD || s == BMQ_ADD_DELAYED || s == BMQ_ADD_PRIORITIZED ||
           s == BMQ_ADD_PARENT;
}

/* ---- calls ------------------------------------------------------------------------------- */

bool bmq_call_of(const struct rprof_cmdview *cv, struct bmq_call *c)
{
    bool eval = strcmp(cv->name, "EVAL") == 0, evalsha = strcmp(cv->name, "EVALSHA") == 0;
    struct resp_view nk;
    int64_t numkeys;
    if ((!eval && !evalsha) || cv->m->nelem < 3 || !rprof_arg(cv, 1, &c->script) ||
        c->script.type != '$' || !rprof_arg(cv, 2, &nk) ||
        resp_view_int(cv->buf, cv->len, &nk, &numkeys) != 0 || numkeys < 0 ||
        (uint64_t)numkeys > cv->m->nelem - 3)
        return false;
    c->eval = eval;
    c->numkeys = (size_t)numkeys;
    return true;
}

bool bmq_arg(const struct rprof_cmdview *cv, const struct bmq_call *c, size_t i,
             struct resp_view *v)
{
    return rprof_arg(cv, 3 + c->numkeys + i, v);
}

/* p[0..n) as a string in out[0..cap): no NUL, not empty, shorter than cap. */
static bool copy_str(const uint8_t *p, size_t n, char *out, size_t cap)
{
    if (cap == 0)
        return false;
    out[0] = '\0';
    if (n == 0 || n >= cap || memchr(p, '\0', n) != NULL)
        return false;
    memcpy(out, p, n);
    out[n] = '\0';
    return true;
}

/* A bulk-string view's bytes (an inline word is not BullMQ's). */
static bool bulk(const struct rprof_cmdview *cv, const struct resp_view *v, const uint8_t **p,
                 size_t *n)
{
    if (v->type != '$' || v->null || v->off > cv->len || v->len > cv->len - v->off)
        return false;
    *p = cv->buf + v->off;
    *n = v->len;
    return true;
}

bool bmq_queue_of_prefix(const uint8_t *p, size_t n, char *out, size_t cap)
{
    if (cap == 0)
        return false;
    out[0] = '\0';
    if (n < 3 || p[n - 1] != ':')
        return false;
    size_t end = n - 1, start = end;
    while (start > 0 && p[start - 1] != ':')
        start--;
    return start > 0 && copy_str(p + start, end - start, out, cap);
}

/* The packed string item it into out; "" (and true) for nil when nil_ok. */
static bool mp_str(const struct mp_item *it, char *out, size_t cap, bool nil_ok)
{
    out[0] = '\0';
    if (it->type == MP_NIL || (it->type == MP_STR && it->len == 0))
        return nil_ok;
    return it->type == MP_STR && copy_str(it->data, it->len, out, cap);
}

int bmq_add_args(const struct rprof_cmdview *cv, const struct bmq_call *c, struct bmq_job *j)
{
    memset(j, 0, sizeof(*j));
    struct resp_view a;
    const uint8_t *p;
    size_t n, pos;
    struct mp_item prefix, id, name;
    if (!bmq_arg(cv, c, 0, &a) || !bulk(cv, &a, &p, &n) ||
        mp_array_get(p, n, 0, &prefix, &pos) != 0 || mp_array_get(p, n, 1, &id, &pos) != 0 ||
        mp_array_get(p, n, 2, &name, &pos) != 0 || !mp_str(&id, j->id, sizeof(j->id), true) ||
        !mp_str(&name, j->name, sizeof(j->name), false))
        return -1;
    if (prefix.type != MP_STR ||
        !bmq_queue_of_prefix(prefix.data, prefix.len, j->queue, sizeof(j->queue)) ||
        !copy_str(prefix.data, prefix.len, j->prefix, sizeof(j->prefix))) {
        j->queue[0] = '\0';
        j->prefix[0] = '\0';
    }
    return 0;
}

int bmq_add_reply(const uint8_t *buf, const struct resp_view *v, char *out, size_t cap)
{
    out[0] = '\0';
    if (v->type == ':')
        return 0;
    if (v->type != '$' || v->null || v->len == 0)
        return -1;
    return copy_str(buf + v->off, v->len, out, cap) ? 1 : -1;
}

/* A decimal count in v (a bulk string), 0 when it is not one. */
static unsigned small_count(const uint8_t *buf, size_t len, const struct resp_view *v)
{
    int64_t x;
    return resp_view_int(buf, len, v, &x) == 0 && x > 0 && x < 1000000 ? (unsigned)x : 0;
}

int bmq_next_job(const uint8_t *buf, const struct resp_msg *m, struct bmq_job *j)
{
    j->id[0] = j->name[0] = '\0'; /* the queue and prefix are the caller's */
    j->attempts_made = j->stalled = 0;
    j->deferred_failure = false;
    if (m->type == ':' && !m->null)
        return 0;
    if (m->type != '*' || m->null || m->nelem < 2)
        return -1;
    struct resp_view hash = m->elem[0], id = m->elem[1];
    if (hash.type == ':' || (id.type == ':'))
        return 0; /* [0, 0, rate limit ttl, next delayed]: nothing to do */
    if (!rprof_is_agg(&hash) || id.type != '$' || id.null ||
        !copy_str(buf + id.off, id.len, j->id, sizeof(j->id)))
        return -1;
    struct resp_args it;
    rprof_walk_init(&it, buf, m->len, &hash);
    struct resp_view f, v;
    while (resp_args_next(&it, &f) == 1 && resp_args_next(&it, &v) == 1) {
        if (resp_view_equals(buf, m->len, &f, "name") && v.type == '$' && !v.null)
            copy_str(buf + v.off, v.len, j->name, sizeof(j->name));
        else if (resp_view_equals(buf, m->len, &f, "atm"))
            j->attempts_made = small_count(buf, m->len, &v);
        else if (resp_view_equals(buf, m->len, &f, "stc"))
            j->stalled = small_count(buf, m->len, &v);
        else if (resp_view_equals(buf, m->len, &f, "defa"))
            j->deferred_failure = v.type == '$' && !v.null && v.len > 0;
    }
    return 1;
}

bool bmq_call_prefix(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                     char *out, size_t cap)
{
    out[0] = '\0';
    struct resp_view a;
    const uint8_t *p;
    size_t n;
    if (s == BMQ_EXTEND_LOCK) {
        /* KEYS[1] is <prefix><id>:lock, ARGV[3] the id */
        struct resp_view k, idv;
        const uint8_t *ip;
        size_t in;
        if (c->numkeys < 1 || !rprof_arg(cv, 3, &k) || !bulk(cv, &k, &p, &n) ||
            !bmq_arg(cv, c, 2, &idv) || !bulk(cv, &idv, &ip, &in) || n < in + 5 ||
            memcmp(p + n - 5, ":lock", 5) != 0 || memcmp(p + n - 5 - in, ip, in) != 0)
            return false;
        return copy_str(p, n - 5 - in, out, cap);
    }
    size_t at = s == BMQ_MOVE_TO_ACTIVE     ? 0
                : s == BMQ_MOVE_TO_FINISHED ? 6
                : s == BMQ_MOVE_STALLED     ? 1
                : s == BMQ_EXTEND_LOCKS     ? 0
                : s == BMQ_RETRY_JOB        ? 0
                : s == BMQ_MOVE_TO_DELAYED  ? 0
                                            : (size_t)-1;
    return at != (size_t)-1 && bmq_arg(cv, c, at, &a) && bulk(cv, &a, &p, &n) &&
           copy_str(p, n, out, cap);
}

bool bmq_call_queue(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                    char *out, size_t cap)
{
    char prefix[BMQ_PREFIX_MAX];
    out[0] = '\0';
    return s != BMQ_EXTEND_LOCK && bmq_call_prefix(cv, c, s, prefix, sizeof(prefix)) &&
           bmq_queue_of_prefix((const uint8_t *)prefix, strlen(prefix), out, cap);
}

bool bmq_call_token(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                    char *out, size_t cap)
{
    out[0] = '\0';
    struct resp_view a;
    const uint8_t *p;
    size_t n;
    struct mp_item it;
    switch (s) {
    case BMQ_MOVE_TO_ACTIVE:
    case BMQ_MOVE_TO_FINISHED:
        return bmq_arg(cv, c, s == BMQ_MOVE_TO_ACTIVE ? 2 : 7, &a) && bulk(cv, &a, &p, &n) &&
               mp_map_get(p, n, "token", &it) == 0 && mp_str(&it, out, cap, false);
    case BMQ_MOVE_TO_DELAYED:
    case BMQ_EXTEND_LOCK:
        return bmq_arg(cv, c, s == BMQ_MOVE_TO_DELAYED ? 3 : 0, &a) && bulk(cv, &a, &p, &n) &&
               copy_str(p, n, out, cap);
    default:
        return false;
    }
}

int bmq_finish_args(const struct rprof_cmdview *cv, const struct bmq_call *c, char *id, size_t cap,
                    bool *failed, bool *fetch_next)
{
    struct resp_view a, target, next;
    const uint8_t *p;
    size_t n;
    if (!bmq_arg(cv, c, 0, &a) || !bulk(cv, &a, &p, &n) || !copy_str(p, n, id, cap) ||
        !bmq_arg(cv, c, 4, &target) || !bmq_arg(cv, c, 5, &next))
        return -1;
    *failed = resp_view_equals(cv->buf, cv->len, &target, "failed");
    *fetch_next = resp_view_equals(cv->buf, cv->len, &next, "1");
    return 0;
}

int bmq_retry_args(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                   char *id, size_t cap, bool *fetch_next)
{
    struct resp_view a, next;
    const uint8_t *p;
    size_t n;
    *fetch_next = false;
    if (s != BMQ_RETRY_JOB && s != BMQ_MOVE_TO_DELAYED)
        return -1;
    if (!bmq_arg(cv, c, s == BMQ_RETRY_JOB ? 3 : 2, &a) || !bulk(cv, &a, &p, &n) ||
        !copy_str(p, n, id, cap))
        return -1;
    if (s == BMQ_MOVE_TO_DELAYED && bmq_arg(cv, c, 7, &next))
        *fetch_next = resp_view_equals(cv->buf, cv->len, &next, "1");
    return 0;
}

bool bmq_finish_code(const uint8_t *buf, const struct resp_msg *m, int64_t *code)
{
    return m->type == ':' && !m->null && resp_view_int(buf, m->len, &m->value, code) == 0;
}

int bmq_lock_ids(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                 bmq_id_fn fn, void *arg)
{
    struct resp_view a;
    const uint8_t *p;
    size_t n;
    char id[BMQ_ID_MAX];
    if ((s != BMQ_EXTEND_LOCK && s != BMQ_EXTEND_LOCKS) || !bmq_arg(cv, c, 2, &a) ||
        !bulk(cv, &a, &p, &n))
        return -1;
    if (s == BMQ_EXTEND_LOCK) {
        if (!copy_str(p, n, id, sizeof(id)))
            return -1;
        fn(arg, id);
        return 1;
    }
    size_t pos = 0;
    struct mp_item arr, it;
    if (mp_next(p, n, &pos, &arr) != 0 || arr.type != MP_ARRAY || arr.count > n)
        return -1;
    int count = 0;
    for (uint32_t k = 0; k < arr.count; k++) {
        size_t at = pos;
        if (mp_next(p, n, &pos, &it) != 0)
            return -1;
        if (it.type == MP_ARRAY || it.type == MP_MAP) {
            pos = at;
            if (mp_skip(p, n, &pos) != 0)
                return -1;
            continue;
        }
        if (mp_str(&it, id, sizeof(id), false)) {
            fn(arg, id);
            count++;
        }
    }
    return count;
}

int bmq_lock_each(const struct rprof_cmdview *cv, const struct bmq_call *c, enum bmq_script s,
                  bmq_lock_fn fn, void *arg, uint32_t *count)
{
    struct resp_view a, t;
    const uint8_t *p, *tp;
    size_t n, tn;
    char id[BMQ_ID_MAX], token[BMQ_TOKEN_MAX];
    *count = 0;
    if ((s != BMQ_EXTEND_LOCK && s != BMQ_EXTEND_LOCKS) || !bmq_arg(cv, c, 2, &a) ||
        !bulk(cv, &a, &p, &n) || !bmq_arg(cv, c, s == BMQ_EXTEND_LOCK ? 0 : 1, &t) ||
        !bulk(cv, &t, &tp, &tn))
        return -1;
    if (s == BMQ_EXTEND_LOCK) {
        if (!copy_str(p, n, id, sizeof(id)))
            return -1;
        if (!copy_str(tp, tn, token, sizeof(token)))
            token[0] = '\0';
        *count = 1;
        fn(arg, 0, id, token);
        return 0;
    }
    size_t pos = 0, tpos = 0;
    struct mp_item arr, tarr, it, tk;
    if (mp_next(p, n, &pos, &arr) != 0 || arr.type != MP_ARRAY || arr.count > n ||
        mp_next(tp, tn, &tpos, &tarr) != 0 || tarr.type != MP_ARRAY || tarr.count != arr.count)
        return -1;
    for (uint32_t k = 0; k < arr.count; k++) {
        size_t at = pos, tat = tpos;
        if (mp_next(p, n, &pos, &it) != 0 || mp_next(tp, tn, &tpos, &tk) != 0)
            return -1;
        bool nested = it.type == MP_ARRAY || it.type == MP_MAP;
        if (nested) {
            pos = at;
            if (mp_skip(p, n, &pos) != 0)
                return -1;
        }
        if (tk.type == MP_ARRAY || tk.type == MP_MAP) {
            tpos = tat;
            if (mp_skip(tp, tn, &tpos) != 0)
                return -1;
        }
        if (!mp_str(&tk, token, sizeof(token), false))
            token[0] = '\0';
        if (!nested && mp_str(&it, id, sizeof(id), false))
            fn(arg, k, id, token);
    }
    *count = arr.count;
    return 0;
}

int bmq_stalled_ids(const uint8_t *buf, const struct resp_msg *m, bmq_id_fn fn, void *arg)
{
    if (m->type != '*' || m->null)
        return -1;
    struct resp_args it;
    resp_args_init(&it, buf, m);
    struct resp_view v;
    char id[BMQ_ID_MAX];
    int count = 0;
    while (resp_args_next(&it, &v) == 1) {
        if (v.type == '$' && !v.null && copy_str(buf + v.off, v.len, id, sizeof(id))) {
            fn(arg, id);
            count++;
        }
    }
    return count;
}

/* The script of bmq_requeue_cmd().  KEYS: active, wait, paused, meta, marker, events, the job;
 * ARGV: the job's id.  Written for twice from what moveStalledJobsToWait does to each job it
 * moves (BullMQ 5.x, src/commands/moveStalledJobsToWait-9.lua and its includes). */
static const char bmq_requeue_script[] =
    "-- twice: hand an active job out again now, as the stalled-job check does\n"
    "local id = ARGV[1]\n"
    "if redis.call('LREM', KEYS[1], 1, id) == 0 then return 0 end\n"
    "redis.call('DEL', KEYS[7] .. ':lock')\n"
    "redis.call('HINCRBY', KEYS[7], 'stc', 1)\n"
    "local meta = redis.call('HMGET', KEYS[4], 'paused', 'concurrency')\n"
    "local target, held = KEYS[2], false\n"
    "if meta[1] then\n"
    "  target, held = KEYS[3], true\n"
    "elseif meta[2] and redis.call('LLEN', KEYS[1]) >= tonumber(meta[2]) then\n"
    "  held = true\n"
    "end\n"
    "redis.call('RPUSH', target, id)\n"
    "if not held then redis.call('ZADD', KEYS[5], 0, '0') end\n"
    "redis.call('XADD', KEYS[6], '*', 'event', 'waiting', 'jobId', id, 'prev', 'active')\n"
    "redis.call('XADD', KEYS[6], '*', 'event', 'stalled', 'jobId', id)\n"
    "return 1\n";

size_t bmq_requeue_cmd(const char *prefix, const char *id, char *keys, size_t cap,
                       const char *argv[BMQ_REQUEUE_ARGC], size_t lens[BMQ_REQUEUE_ARGC])
{
    static const char *const suffix[] = {"active", "wait", "paused", "meta", "marker", "events"};
    argv[0] = "EVAL";
    argv[1] = bmq_requeue_script;
    argv[2] = "7";
    size_t used = 0;
    for (size_t k = 0; k < 7; k++) {
        const char *tail = k < 6 ? suffix[k] : id;
        int n = snprintf(keys + used, cap - used, "%s%s", prefix, tail);
        if (n < 0 || (size_t)n >= cap - used)
            return 0;
        argv[3 + k] = keys + used;
        lens[3 + k] = (size_t)n;
        used += (size_t)n + 1;
    }
    argv[10] = id;
    for (size_t i = 0; i < 3; i++)
        lens[i] = strlen(argv[i]);
    lens[10] = strlen(id);
    return BMQ_REQUEUE_ARGC;
}
