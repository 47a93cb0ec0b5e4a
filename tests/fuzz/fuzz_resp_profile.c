/*
 * fuzz_resp_profile.c - libFuzzer harness for the Redis framework layer
 * (proto/resp/resp_profile.c): commands named and classified for each profile, the transaction
 * scan, and the replies read for jobs.  Not part of the default build (scripts/fuzz.sh builds
 * and runs it).
 *
 * The first byte picks the profile (its low 7 bits mod 6) and the direction (bit 7: a server's
 * replies, else a client's commands); the rest is a byte stream, cut into messages by the
 * RESP scanner as the proxy cuts it.  Every message goes through every function that applies
 * to its direction, for the chosen profile, and BullMQ's script readers (proto/resp/resp_bullmq.h,
 * whatever the profile: any EVAL or EVALSHA read as each script, each argument walked as
 * MessagePack).  Seeds are the framework sessions of
 * tests/unit/data/frameworks/ (tests/fuzz/corpus/resp_profile/).  Invariants are checked with
 * abort(): every string read is NUL-terminated within its limit, every argument index and
 * view is inside the message, a pointer handed back points into the command's key, and
 * nothing leaks (ASan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/base/msgpack.h"
#include "proto/resp/resp.h"
#include "proto/resp/resp_bullmq.h"
#include "proto/resp/resp_job.h"
#include "proto/resp/resp_profile.h"

#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

static bool in_key(const struct rprof_cmdview *cv, const char *p)
{
    return p == NULL || (p >= cv->key && p <= cv->key + strlen(cv->key));
}

static void count_queued(void *arg, const struct rprof_cmdview *cv)
{
    CHECK(cv->has_key == false || strlen(cv->key) < RPROF_KEY_MAX);
    const char *id;
    char *task;
    if (rprof_rq_job_saved(RPROF_RQ, cv, &id, &task)) {
        CHECK(in_key(cv, id) && task != NULL && task[0] != '\0');
        free(task);
    } else {
        CHECK(task == NULL);
    }
    (*(size_t *)arg)++;
}

/* A list job read with the defaults and with a listener's sources of two and three keys: an id
 * is a non-empty string within its limit, a too-long value is said with its length. */
static void list_job(const uint8_t *v, size_t n)
{
    static struct msg_fields ids, tasks;
    if (ids.n == 0) {
        char why[128];
        CHECK(msg_field_parse("body.json.data.uuid", &ids.src[0], why, sizeof(why)) == 0);
        CHECK(msg_field_parse("body.json.uuid", &ids.src[1], why, sizeof(why)) == 0);
        CHECK(msg_field_parse("body.json.a.b.c", &tasks.src[0], why, sizeof(why)) == 0);
        ids.n = 2;
        tasks.n = 1;
    }
    for (int k = 0; k < 2; k++) {
        struct resp_job job;
        uint64_t too_long;
        int rc = k == 0 ? rprof_list_job(NULL, NULL, v, n, &job, &too_long)
                        : rprof_list_job(&ids, &tasks, v, n, &job, &too_long);
        CHECK(too_long == 0 || too_long >= MSG_FIELD_VALUE_MAX);
        if (rc == 0) {
            CHECK(job.id != NULL && job.id[0] != '\0' && strlen(job.id) < MSG_FIELD_VALUE_MAX);
            CHECK(job.task == NULL || (job.task[0] != '\0' && strlen(job.task) < MSG_FIELD_VALUE_MAX));
            resp_job_clear(&job);
        } else {
            CHECK(rc == -1 && job.id == NULL && job.task == NULL);
        }
    }
}

static void bmq_seen(void *arg, const char *id)
{
    CHECK(id[0] != '\0' && strlen(id) < BMQ_ID_MAX);
    (*(int *)arg)++;
}

struct pairs {
    uint32_t last; /* the next index must be above it, + 1 */
    uint32_t n;
};

static void bmq_pair(void *arg, uint32_t k, const char *id, const char *token)
{
    struct pairs *p = arg;
    CHECK(id[0] != '\0' && strlen(id) < BMQ_ID_MAX && strlen(token) < BMQ_TOKEN_MAX);
    CHECK(k + 1 > p->last);
    p->last = k + 1;
    p->n++;
}

/* A BullMQ script call read as every script it could be (the proxy knows which from the
 * body; here any bytes are any script), and every argument walked as MessagePack. */
static void bullmq_command(const struct rprof_cmdview *cv)
{
    struct bmq_call c;
    if (!bmq_call_of(cv, &c))
        return;
    CHECK(c.script.off + c.script.len <= cv->len && 3 + c.numkeys <= cv->m->nelem);
    if (c.eval)
        CHECK(bmq_script_of(cv->buf + c.script.off, c.script.len) < BMQ_SCRIPT_COUNT);
    struct bmq_job j;
    if (bmq_add_args(cv, &c, &j) == 0)
        CHECK(j.name[0] != '\0' && strlen(j.name) < BMQ_NAME_MAX && strlen(j.id) < BMQ_ID_MAX &&
              strlen(j.queue) < BMQ_QUEUE_MAX);
    char id[BMQ_ID_MAX], queue[BMQ_QUEUE_MAX];
    bool failed, next;
    if (bmq_finish_args(cv, &c, id, sizeof(id), &failed, &next) == 0)
        CHECK(id[0] != '\0' && strlen(id) < sizeof(id));
    for (int s = 0; s < BMQ_SCRIPT_COUNT; s++) {
        if (bmq_call_queue(cv, &c, (enum bmq_script)s, queue, sizeof(queue)))
            CHECK(queue[0] != '\0' && strlen(queue) < sizeof(queue) && strchr(queue, ':') == NULL);
        if (bmq_retry_args(cv, &c, (enum bmq_script)s, id, sizeof(id), &next) == 0)
            CHECK(id[0] != '\0' && strlen(id) < sizeof(id));
        int seen = 0;
        int n = bmq_lock_ids(cv, &c, (enum bmq_script)s, bmq_seen, &seen);
        CHECK(n == -1 || n == seen);
        struct pairs pr = {0};
        uint32_t count = 0;
        if (bmq_lock_each(cv, &c, (enum bmq_script)s, bmq_pair, &pr, &count) == 0)
            CHECK(pr.n <= count && pr.last <= count);
        char prefix[BMQ_PREFIX_MAX], token[BMQ_TOKEN_MAX];
        if (bmq_call_prefix(cv, &c, (enum bmq_script)s, prefix, sizeof(prefix)))
            CHECK(prefix[0] != '\0' && strlen(prefix) < sizeof(prefix));
        if (bmq_call_token(cv, &c, (enum bmq_script)s, token, sizeof(token)))
            CHECK(token[0] != '\0' && strlen(token) < sizeof(token));
    }
    struct resp_view v;
    for (size_t i = 0; bmq_arg(cv, &c, i, &v); i++) {
        size_t pos = 0;
        if (v.type == '$' && mp_skip(cv->buf + v.off, v.len, &pos) == 0)
            CHECK(pos <= v.len);
        struct mp_item it;
        if (v.type == '$')
            (void)mp_map_get(cv->buf + v.off, v.len, "token", &it);
        /* every other element kept, into room the contract says is enough */
        struct mp_item arr;
        pos = 0;
        if (v.type == '$' && mp_next(cv->buf + v.off, v.len, &pos, &arr) == 0 &&
            arr.type == MP_ARRAY && arr.count <= v.len) {
            bool *keep = malloc(arr.count + 1u);
            uint8_t *out = malloc(v.len + 5);
            if (keep != NULL && out != NULL) {
                for (uint32_t k = 0; k < arr.count; k++)
                    keep[k] = k % 2 == 0;
                long w = mp_array_subset(cv->buf + v.off, v.len, keep, arr.count, out, v.len + 5);
                CHECK(w == -1 || (w > 0 && (size_t)w <= v.len + 5));
                if (w > 0) {
                    size_t q = 0;
                    CHECK(mp_skip(out, (size_t)w, &q) == 0 && q == (size_t)w);
                }
            }
            free(keep);
            free(out);
        }
    }
}

static void command(enum rprof p, const uint8_t *buf, size_t len, const struct resp_msg *m)
{
    struct rprof_cmdview cv;
    rprof_cmdview_init(&cv, buf, m, true);
    CHECK(strlen(cv.name) < RESP_CMD_NAME_MAX);
    bullmq_command(&cv);
    CHECK(!cv.has_key || strlen(cv.key) < RPROF_KEY_MAX);
    size_t first = 0;
    if (rprof_ack_args(p, &cv, &first))
        CHECK(first >= 2 && first <= 3);
    CHECK(rprof_settled_count(&cv) >= 0);
    (void)rprof_is_pop(p, &cv);
    (void)rprof_is_celery_unacked_hdel(p, &cv);
    enum rprof_publish pub = rprof_publish_of(p, &cv);
    if (pub != RPROF_PUB_NONE)
        CHECK(cv.has_key && m->nelem >= 3);
    struct resp_view v;
    for (size_t i = 2; pub == RPROF_PUB_JOBS && rprof_arg(&cv, i, &v); i++) {
        CHECK(v.off + v.len <= m->len);
        struct resp_job job;
        if (rprof_job(p, buf + v.off, v.len, &job) == 0) {
            CHECK(job.id != NULL && job.id[0] != '\0');
            resp_job_clear(&job);
        }
    }
    (void)rprof_pop_takes_head(&cv);
    struct resp_view jv;
    if (rprof_list_ack(p, &cv, &jv)) {
        CHECK(p == RPROF_LIST && cv.id == RPROF_CMD_LREM && jv.off + jv.len <= m->len);
        list_job(buf + jv.off, jv.len);
    }
    for (size_t i = 2; p == RPROF_LIST && pub == RPROF_PUB_JOBS && rprof_arg(&cv, i, &v); i++)
        list_job(buf + v.off, v.len);
    size_t at = rprof_xadd_id_arg(&cv);
    CHECK(at == 0 || at >= 2);
    char task[RPROF_TASK_MAX];
    uint64_t tlen;
    enum rprof_field f = rprof_xadd_task(&cv, task, sizeof(task), &tlen);
    CHECK(strlen(task) < sizeof(task));
    CHECK(f != RPROF_TOO_LONG || tlen >= sizeof(task));
    if (cv.has_key) {
        char *q = rprof_queue_of(p, cv.key);
        CHECK(q != NULL && strlen(q) <= strlen(cv.key));
        free(q);
        char list[RPROF_KEY_MAX + 16];
        if (rprof_rq_queue_of_wip(cv.key, list, sizeof(list)))
            CHECK(strncmp(list, RPROF_RQ_QUEUE_PREFIX, strlen(RPROF_RQ_QUEUE_PREFIX)) == 0);
    }
    const char *arg;
    bool again;
    enum rprof_reply k = rprof_reply_of(p, &cv, &arg, &again);
    CHECK(k < RPROF_REPLY_END && in_key(&cv, arg));
    const char *id;
    char *saved;
    if (rprof_rq_job_saved(p, &cv, &id, &saved))
        free(saved);
    /* A job that ran is a job save. */
    CHECK(!rprof_rq_job_ran(p, &cv) || (p == RPROF_RQ && cv.id == RPROF_CMD_HSET));
    /* A renewal or a failure names one member inside the command, of a ZADD of RQ's. */
    struct resp_view lv;
    if (rprof_rq_lease(p, &cv, &lv))
        CHECK(p == RPROF_RQ && cv.id == RPROF_CMD_ZADD && lv.off + lv.len <= m->len &&
              !rprof_rq_failed(p, &cv, &lv));
    if (rprof_rq_failed(p, &cv, &lv))
        CHECK(p == RPROF_RQ && cv.id == RPROF_CMD_ZADD && lv.off + lv.len <= m->len);
    CHECK(!rprof_rq_reaps(p, &cv) || cv.id == RPROF_CMD_ZREMRANGEBYSCORE);
    CHECK(!rprof_rq_job_heartbeat(p, &cv, "x") || cv.id == RPROF_CMD_HSET);
    /* Sidekiq's work state: an HSET of pairs whose key names an identity before the suffix. */
    size_t ident = 0;
    if (rprof_sidekiq_work(p, &cv, &ident))
        CHECK(p == RPROF_SIDEKIQ && cv.id == RPROF_CMD_HSET && ident > 0 &&
              ident < strlen(cv.key) && m->nelem % 2 == 0);
    if (cv.id == RPROF_CMD_MULTI) {
        struct resp_scanner sc;
        resp_scanner_init(&sc, RESP_SIDE_CLIENT);
        struct rprof_tx tx;
        size_t seen = 0;
        int rc = rprof_tx_scan(&sc, buf, len, m->len, &tx, count_queued, &seen);
        CHECK(rc >= -1 && rc <= 1 && seen <= RPROF_TX_MAX);
        if (rc == 1)
            CHECK(tx.queued == seen && tx.end > m->len && tx.end <= len);
    }
}

static void entries(const uint8_t *buf, size_t len, const struct resp_view *arr)
{
    if (!rprof_is_agg(arr))
        return;
    struct resp_args it;
    rprof_walk_init(&it, buf, len, arr);
    struct resp_view e;
    for (int i = 0; i < 64 && resp_args_next(&it, &e) == 1; i++) {
        struct rprof_entry ent;
        int rc = rprof_stream_entry(buf, len, &e, &ent);
        CHECK(rc == 0 || rc == 1);
        CHECK(strlen(ent.id) < sizeof(ent.id) && strlen(ent.task) < sizeof(ent.task));
        if (ent.too_long != NULL)
            CHECK(ent.too_long_len >= (rc == 1 ? sizeof(ent.task) : sizeof(ent.id)));
        entries(buf, len, &e); /* nested shapes: XREAD's [[stream, entries]] */
    }
}

static void reply(enum rprof p, const uint8_t *buf, const struct resp_msg *m)
{
    char list[RPROF_KEY_MAX];
    struct resp_view val;
    bool pair;
    if (rprof_pop_reply(buf, m, "rq:queue:x", list, sizeof(list), &val, &pair)) {
        CHECK(strlen(list) < sizeof(list) && val.off + val.len <= m->len);
        struct resp_job job;
        if (rprof_job(p, buf + val.off, val.len, &job) == 0)
            resp_job_clear(&job);
    }
    char id[RPROF_ID_MAX];
    uint64_t n;
    (void)rprof_xadd_reply_id(buf, m, id, sizeof(id), &n);
    CHECK(strlen(id) < sizeof(id));
    char *task = NULL;
    if (rprof_rq_hash_task(buf, m, &task) == 0)
        CHECK(task != NULL && task[0] != '\0');
    else
        CHECK(task == NULL);
    free(task);
    entries(buf, m->len, &m->value);
    /* BullMQ's replies */
    char bid[BMQ_ID_MAX];
    if (bmq_add_reply(buf, &m->value, bid, sizeof(bid)) == 1)
        CHECK(bid[0] != '\0' && strlen(bid) < sizeof(bid));
    struct bmq_job j = {.queue = "q"};
    if (bmq_next_job(buf, m, &j) == 1)
        CHECK(j.id[0] != '\0' && strlen(j.name) < BMQ_NAME_MAX && strcmp(j.queue, "q") == 0);
    int64_t code;
    (void)bmq_finish_code(buf, m, &code);
    int seen = 0;
    int got = bmq_stalled_ids(buf, m, bmq_seen, &seen);
    CHECK(got == -1 || got == seen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum rprof p = (enum rprof)((data[0] & 0x7f) % 7);
    bool server = (data[0] & 0x80) != 0;
    size_t len = size - 1;
    uint8_t *buf = malloc(len > 0 ? len : 1); /* exactly its size: a read past len is caught */
    if (buf == NULL)
        return 0;
    memcpy(buf, data + 1, len);
    struct resp_scanner sc;
    resp_scanner_init(&sc, server ? RESP_SIDE_SERVER : RESP_SIDE_CLIENT);
    size_t off = 0;
    while (off < len) {
        struct resp_msg m;
        int rc = resp_scan(&sc, buf + off, len - off, &m);
        if (rc <= 0)
            break;
        CHECK(m.len > 0 && m.len <= len - off);
        if (server)
            reply(p, buf + off, &m);
        else
            command(p, buf + off, len - off, &m);
        off += m.len;
        resp_scanner_reset(&sc);
    }
    free(buf);
    return 0;
}
