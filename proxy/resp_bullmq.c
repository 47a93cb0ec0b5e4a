/*
 * resp_bullmq.c - BullMQ's job events on a resp listener with `profile bullmq`
 * (resp_internal.h): publish, deliver, ack and lease, read out of its Lua scripts'
 * calls and replies by proto/resp_bullmq.h, and the faults on them done the way BullMQ
 * itself produces them (docs/redis.md, "BullMQ").
 *
 * BullMQ sends each script once per connection with EVAL, its body whole, and by its sha1
 * after that (EVALSHA).  twice learns which sha is which script from the bodies of the scripts
 * it knows (and from SCRIPT LOAD), in one table for the whole process: a sha names one body
 * wherever it is seen.  An EVALSHA of a sha twice never saw a body of is relayed as it is.
 *
 * A job is remembered by its key, <prefix><id> ("bull:orders:17"): BullMQ's ids restart per
 * queue, its keys do not.
 *
 * The faults, each one BullMQ would make itself:
 *   duplicate on deliver  the job is moved back to wait at once, as the stalled-job checker moves
 *                         a job whose lock is gone, and the first worker's renewals of it
 *                         answered, never applied: another worker takes it while the first still
 *                         runs it, and the first one's completion is refused ("Lock mismatch").
 *   drop on deliver       the worker is answered "no job": the job stays active, locked, never
 *                         renewed, and stalls.
 *   redeliver/drop on ack the completion is answered as BullMQ's script answers it (0) but not
 *                         applied: the lock lapses and the stalled checker hands the job out
 *                         again.
 *   delay on ack          answered at once, applied D later (without fetching a next job).
 *   drop/delay on lease   the renewal is answered as if it succeeded, and not applied, or
 *                         applied D later: the lock lapses while the worker still runs.
 *   drop/delay on publish as on the other profiles.
 */
#include "proxy/resp_internal.h"

#include <openssl/evp.h>
#include <pthread.h>

#include "proto/msgpack.h"

/* ---- which sha is which script ------------------------------------------------------------ */

/* Known bodies kept: BullMQ has a dozen scripts twice reads; a few versions of them side by side
 * stay far below this. */
#define BMQ_SHAS_MAX 256u

static struct {
    char hex[41];
    uint8_t script; /* enum bmq_script */
} shas[BMQ_SHAS_MAX];
static size_t n_shas;
static bool shas_full_said;
static pthread_mutex_t shas_mu = PTHREAD_MUTEX_INITIALIZER;

static void sha_learn(const uint8_t *body, size_t n, enum bmq_script s)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    char hex[41];
    if (EVP_Digest(body, n, d, &dl, EVP_sha1(), NULL) != 1 || dl != 20)
        return;
    for (unsigned i = 0; i < 20; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    pthread_mutex_lock(&shas_mu);
    bool known = false;
    for (size_t i = 0; i < n_shas && !known; i++)
        known = memcmp(shas[i].hex, hex, 40) == 0;
    if (!known && n_shas < BMQ_SHAS_MAX) {
        memcpy(shas[n_shas].hex, hex, sizeof(hex));
        shas[n_shas++].script = (uint8_t)s;
    } else if (!known && !shas_full_said) {
        shas_full_said = true;
        log_msg(LOG_WARN, "bullmq scripts not learnt",
                "reason=\"more than %u script bodies\" script=%s", BMQ_SHAS_MAX,
                bmq_script_name(s));
    }
    pthread_mutex_unlock(&shas_mu);
}

/* The script an EVALSHA names, by its 40 hex digits (either case). */
static enum bmq_script sha_lookup(const uint8_t *p, size_t n)
{
    if (n != 40)
        return BMQ_SCRIPT_UNKNOWN;
    char hex[41];
    for (size_t i = 0; i < 40; i++)
        hex[i] = (char)(p[i] >= 'A' && p[i] <= 'F' ? p[i] - 'A' + 'a' : p[i]);
    hex[40] = '\0';
    enum bmq_script s = BMQ_SCRIPT_UNKNOWN;
    pthread_mutex_lock(&shas_mu);
    for (size_t i = 0; i < n_shas && s == BMQ_SCRIPT_UNKNOWN; i++)
        if (memcmp(shas[i].hex, hex, 40) == 0)
            s = (enum bmq_script)shas[i].script;
    pthread_mutex_unlock(&shas_mu);
    return s;
}

/* The script a call runs: known by its body (EVAL, whose sha is learnt then) or by its sha. */
static enum bmq_script call_script(const struct rprof_cmdview *cv, const struct bmq_call *c)
{
    const uint8_t *p = cv->buf + c->script.off;
    size_t n = c->script.len;
    if (!c->eval)
        return sha_lookup(p, n);
    enum bmq_script s = bmq_script_of(p, n);
    if (s != BMQ_SCRIPT_UNKNOWN)
        sha_learn(p, n, s);
    return s;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

#define BMQ_KEY_MAX (BMQ_PREFIX_MAX + BMQ_ID_MAX)

/* A job's key, <prefix><id>: false when it does not fit. */
static bool job_key(const char *prefix, const char *id, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s%s", prefix, id);
    return n > 0 && (size_t)n < cap;
}

/* The job event of kind for job id under prefix, its task and queue as its delivery left them
 * (else `name`, when given). */
static void job_event_of(struct rpx *rx, struct job_event *j, enum rule_event kind,
                         const char *prefix, const char *id, const char *key, const char *name)
{
    memset(j, 0, sizeof(*j));
    j->kind = kind;
    j->id = rpx_jdup(j, id);
    j->key = key;
    char queue[BMQ_QUEUE_MAX];
    if (bmq_queue_of_prefix((const uint8_t *)prefix, strlen(prefix), queue, sizeof(queue)))
        j->queue = rpx_jdup(j, queue);
    if (name != NULL && name[0] != '\0') {
        j->task = rpx_jdup(j, name);
        return;
    }
    idmap_lock();
    struct idmap_info *in = idmap_get(rpx_scope(rx), key, strlen(key));
    if (in != NULL && in->task != NULL)
        j->task = rpx_jdup(j, in->task);
    idmap_unlock();
}

/* twice's own commands, one encoded command in b, to Redis at once or ms later. */
static void send_own(struct rpx *rx, struct evbuffer *b, uint32_t ms)
{
    rpx_aux_send_at(rx, b, 1, ms);
}

/* The client's command cv with arguments at[0..n) replaced by val[i] (len[i] bytes), into b. */
static bool encode_with(struct evbuffer *b, const struct rprof_cmdview *cv, size_t n,
                        const size_t *at, const void *const *val, const size_t *len)
{
    size_t argc = cv->m->nelem;
    if (argc == 0 || argc > 4096)
        return false;
    const char **argv = calloc(argc, sizeof(*argv));
    size_t *lens = calloc(argc, sizeof(*lens));
    bool ok = argv != NULL && lens != NULL;
    struct resp_view v;
    for (size_t i = 0; ok && i < argc; i++) {
        ok = rprof_arg(cv, i, &v);
        argv[i] = (const char *)cv->buf + v.off;
        lens[i] = v.len;
    }
    for (size_t i = 0; ok && i < n; i++) {
        ok = at[i] < argc;
        if (ok) {
            argv[at[i]] = val[i];
            lens[at[i]] = len[i];
        }
    }
    ok = ok && rpx_encode_cmd(b, argc, argv, lens) == 0;
    free(argv);
    free(lens);
    return ok;
}

/* The index in the command of the call's ARGV[i + 1]. */
static size_t argv_at(const struct bmq_call *c, size_t i)
{
    return 3 + c->numkeys + i;
}

/* The renewals of job `key` by lock token `token` from now on: never applied (lost), or applied
 * ms later (late).  A lease is lost as a worker loses it, for good: one renewal dropped does not
 * lapse BullMQ's lock (a worker renews every lockDuration / 4 to / 2), all of them do. */
static void mark_lease(struct rpx *rx, const char *key, const char *token, bool late, uint32_t ms)
{
    idmap_lock();
    struct idmap_info *in = idmap_put(rpx_scope(rx), key, strlen(key));
    if (in != NULL) {
        in->flags &= ~(uint32_t)(IDMAP_LEASE_LOST | IDMAP_LEASE_LATE);
        in->flags |= late ? IDMAP_LEASE_LATE : IDMAP_LEASE_LOST;
        in->lease_ms = ms;
        idmap_set_str(&in->id, token, strlen(token));
    }
    idmap_unlock();
}

/* A `duplicate` on a delivery: the job is handed out again at once (bmq_requeue_cmd, on twice's
 * own connection), while this worker still runs it, as a second worker takes a job whose lock
 * lapsed; the renewals of this worker's token are answered and never applied, so that it
 * believes it still holds the job until the other worker has it (its lock then refuses them, and
 * this worker's completion). */
static void requeue_now(struct rpx *rx, const char *prefix, const char *id, const char *key,
                        const char *token)
{
    char *keys = malloc(BMQ_REQUEUE_KEYS_MAX);
    const char *argv[BMQ_REQUEUE_ARGC];
    size_t lens[BMQ_REQUEUE_ARGC];
    struct evbuffer *b = evbuffer_new();
    bool ok = keys != NULL && b != NULL &&
              bmq_requeue_cmd(prefix, id, keys, BMQ_REQUEUE_KEYS_MAX, argv, lens) != 0 &&
              rpx_encode_cmd(b, BMQ_REQUEUE_ARGC, argv, lens) == 0;
    if (ok)
        send_own(rx, b, 0);
    else
        log_msg(LOG_WARN, "duplicate not made", "sid=%llu listener=%s job=%s reason=\"%s\"",
                (unsigned long long)rx->s->id, rpx_scope(rx), key,
                keys == NULL || b == NULL ? "out of memory" : "key too long");
    if (b != NULL)
        evbuffer_free(b);
    free(keys);
    if (ok)
        mark_lease(rx, key, token, false, 0);
}

/* ---- deliveries ------------------------------------------------------------------------------ */

/* The job a reply hands a worker (moveToActive's, or a settle's that fetched the next one). */
static void on_next(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m,
                    struct evbuffer *reply)
{
    const struct bmq_pending *pd = e->bmq;
    struct bmq_job bj;
    char key[BMQ_KEY_MAX];
    if (bmq_next_job(buf, m, &bj) != 1 || !job_key(pd->prefix, bj.id, key, sizeof(key)))
        return;
    /* The job's task for its later events; and a lease an earlier holder lost ends here: its
     * renewals go to Redis again, which refuses them (the lock is the new holder's), as BullMQ
     * refuses a worker whose lock lapsed. */
    char queue[BMQ_QUEUE_MAX];
    bool q =
        bmq_queue_of_prefix((const uint8_t *)pd->prefix, strlen(pd->prefix), queue, sizeof(queue));
    idmap_lock();
    struct idmap_info *in = idmap_put(rpx_scope(rx), key, strlen(key));
    if (in != NULL) {
        if (bj.name[0] != '\0' && (in->task == NULL || strcmp(in->task, bj.name) != 0))
            idmap_set_str(&in->task, bj.name, strlen(bj.name));
        if (q && in->queue == NULL)
            idmap_set_str(&in->queue, queue, strlen(queue));
        in->flags &= ~(uint32_t)(IDMAP_LEASE_LOST | IDMAP_LEASE_LATE);
    }
    idmap_unlock();
    if (bj.deferred_failure)
        return; /* stalled past maxStalledCount: its worker fails it unrun (journaled then) */
    struct job_event j;
    job_event_of(rx, &j, RULE_EV_DELIVER, pd->prefix, bj.id, key, bj.name);
    /* A job the stalled checker moved back comes with its `stc` up; the attempts that failed
     * before (`atm`) are the app's retries. */
    j.redelivered = bj.stalled > 0;
    j.retries = bj.attempts_made;
    rpx_journal_job(rx, JOURNAL_KIND_DELIVER, &j);
    const struct rule *r = rpx_decide_job(rx, &j);
    rpx_job_event_clear(&j);
    if (r == NULL)
        return;
    switch (r->action.kind) {
    case RULE_ACT_DUPLICATE:
        requeue_now(rx, pd->prefix, bj.id, key, pd->token);
        break;
    case RULE_ACT_DROP: {
        /* As moveToActive answers when there is nothing to do; a settle with no next job. */
        static const char none_active[] = "*4\r\n:0\r\n:0\r\n:0\r\n:0\r\n", none[] = ":0\r\n";
        evbuffer_drain(reply, evbuffer_get_length(reply));
        if (e->kind == RK_BMQ_NEXT)
            evbuffer_add(reply, none_active, sizeof(none_active) - 1);
        else
            evbuffer_add(reply, none, sizeof(none) - 1);
        break;
    }
    case RULE_ACT_DELAY:
        e->release_ms = proxy_now_ms() + r->action.duration_ms;
        break;
    case RULE_ACT_CLOSE:
        if (r->action.close_when == RULE_CLOSE_BEFORE)
            evbuffer_drain(reply, evbuffer_get_length(reply));
        e->close_after = r;
        break;
    default:
        break;
    }
}

/* ---- settles --------------------------------------------------------------------------------- */

/* A moveToFinished that Redis answered: journaled when it applied (0, or the next job), logged
 * when BullMQ refused it (a negative code: -2 its lock is gone, -6 another worker holds it). */
static void on_finish(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m,
                      struct evbuffer *reply)
{
    struct bmq_pending *pd = e->bmq;
    char key[BMQ_KEY_MAX];
    int64_t code = 0;
    if (!job_key(pd->prefix, pd->id, key, sizeof(key)))
        return;
    bool integer = bmq_finish_code(buf, m, &code);
    bool refused = integer && code < 0;
    if (refused)
        log_msg(LOG_INFO, "bullmq settle refused",
                "sid=%llu listener=%s job=%s code=%lld reason=\"%s\"",
                (unsigned long long)rx->s->id, rpx_scope(rx), key, (long long)code,
                code == -2   ? "missing lock"
                : code == -6 ? "lock held by another worker"
                : code == -3 ? "job not active"
                             : "other");
    if (m->type == '-')
        return;
    /* A refused completion is journaled too, marked: BullMQ did not apply it, but the worker
     * had finished its run of the job then, which the verdict needs to know (did a copy run
     * beside it?). */
    struct job_event j;
    job_event_of(rx, &j, RULE_EV_ACK, pd->prefix, pd->id, key, NULL);
    j.refused = refused;
    rpx_journal_job(rx, pd->failed ? JOURNAL_KIND_NACK : JOURNAL_KIND_ACK, &j);
    rpx_job_event_clear(&j);
    if (refused)
        return;
    idmap_lock();
    idmap_del(rpx_scope(rx), key, strlen(key));
    idmap_unlock();
    if (!integer)
        on_next(rx, e, buf, m, reply);
}

/* moveToFinished: decided before Redis sees it. */
static enum cmd_result command_finish(struct rpx *rx, struct rprof_cmdview *cv,
                                      const struct resp_msg *m, const uint8_t *buf,
                                      const struct bmq_call *c)
{
    size_t len = m->len;
    struct bmq_pending *pd = calloc(1, sizeof(*pd));
    bool fetch_next = false;
    if (pd == NULL ||
        bmq_finish_args(cv, c, pd->id, sizeof(pd->id), &pd->failed, &fetch_next) != 0 ||
        !bmq_call_prefix(cv, c, BMQ_MOVE_TO_FINISHED, pd->prefix, sizeof(pd->prefix))) {
        free(pd);
        rpx_forward(rx, cv, m, buf, len);
        return CMD_DONE;
    }
    if (!bmq_call_token(cv, c, BMQ_MOVE_TO_FINISHED, pd->token, sizeof(pd->token)))
        pd->token[0] = '\0';
    char key[BMQ_KEY_MAX];
    const struct rule *r = NULL;
    if (!rpx_jobs_needed(rx)) {
        codec_count(rx->s, RULE_EV_ACK);
        free(pd);
        rpx_forward(rx, cv, m, buf, len);
        return CMD_DONE;
    }
    if (job_key(pd->prefix, pd->id, key, sizeof(key))) {
        struct job_event j;
        job_event_of(rx, &j, RULE_EV_ACK, pd->prefix, pd->id, key, NULL);
        r = rpx_decide_job(rx, &j);
        /* An ack twice keeps back is journaled now: Redis never answers it.  Marked kept back
         * when it is never applied: BullMQ recorded no completion, nor failure. */
        j.kept_back =
            r != NULL && (r->action.kind == RULE_ACT_REDELIVER || r->action.kind == RULE_ACT_DROP);
        if (r != NULL && r->action.kind != RULE_ACT_CLOSE)
            rpx_journal_job(rx, pd->failed ? JOURNAL_KIND_NACK : JOURNAL_KIND_ACK, &j);
        rpx_job_event_clear(&j);
    }
    enum rule_action_kind act = r != NULL ? r->action.kind : RULE_ACT_COUNT; /* none */
    if (act == RULE_ACT_DELAY) {
        /* Applied later on twice's own connection, fetching no job: one fetched there would be
         * locked for a worker that never sees it. */
        struct evbuffer *later = evbuffer_new();
        size_t at = argv_at(c, 5);
        const void *val = "0";
        size_t vlen = 1;
        if (later != NULL && encode_with(later, cv, 1, &at, &val, &vlen)) {
            send_own(rx, later, r->action.duration_ms);
        } else {
            log_msg(LOG_WARN, "ack not kept back",
                    "sid=%llu listener=%s rule=%s reason=\"out of memory\"",
                    (unsigned long long)rx->s->id, rpx_scope(rx), r->name);
            act = RULE_ACT_COUNT;
        }
        if (later != NULL)
            evbuffer_free(later);
    }
    switch (act) {
    case RULE_ACT_REDELIVER:
    case RULE_ACT_DROP:
    case RULE_ACT_DELAY:
        /* As moveToFinished answers a job it finished without fetching another. */
        free(pd);
        rpx_swallow(rx, len);
        if (rpx_owe_reply(rx))
            rpx_answer(rx, ":0\r\n", 4);
        return CMD_DONE;
    case RULE_ACT_CLOSE:
        if (r->action.close_when == RULE_CLOSE_BEFORE) {
            free(pd);
            rpx_swallow(rx, len);
            rpx_cut_at_turn(rx, r, NULL);
            return CMD_STOP;
        }
        break;
    default:
        break;
    }
    struct entry *e = rpx_forward(rx, cv, m, buf, len);
    if (e != NULL) {
        e->kind = RK_BMQ_FINISH;
        e->bmq = pd;
    } else {
        free(pd);
    }
    if (act == RULE_ACT_CLOSE) {
        rpx_cut_at_turn(rx, r, e);
        return CMD_STOP;
    }
    return CMD_DONE;
}

/* retryJob, moveToDelayed: a failed attempt BullMQ runs again (its `attempts` not used up),
 * journaled as the app's retry.  Forwarded; moveToDelayed may bring the next job. */
static enum cmd_result command_retry(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf,
                                     const struct bmq_call *c, enum bmq_script s)
{
    struct bmq_pending *pd = NULL;
    bool fetch_next = false;
    char id[BMQ_ID_MAX], prefix[BMQ_PREFIX_MAX], key[BMQ_KEY_MAX];
    if (rpx_jobs_needed(rx) && bmq_retry_args(cv, c, s, id, sizeof(id), &fetch_next) == 0 &&
        bmq_call_prefix(cv, c, s, prefix, sizeof(prefix)) &&
        job_key(prefix, id, key, sizeof(key))) {
        struct job_event j;
        job_event_of(rx, &j, RULE_EV_NACK, prefix, id, key, NULL);
        j.retry = true;
        rpx_journal_job(rx, JOURNAL_KIND_NACK, &j);
        rpx_job_event_clear(&j);
        if (fetch_next && (pd = calloc(1, sizeof(*pd))) != NULL) {
            memcpy(pd->prefix, prefix, sizeof(prefix));
            if (!bmq_call_token(cv, c, s, pd->token, sizeof(pd->token)))
                pd->token[0] = '\0';
        }
    }
    struct entry *e = rpx_forward(rx, cv, m, buf, m->len);
    if (e != NULL && pd != NULL) {
        e->kind = RK_BMQ_RETRY;
        e->bmq = pd;
    } else {
        free(pd);
    }
    return CMD_DONE;
}

/* moveToActive: its reply is the job a worker takes. */
static enum cmd_result command_active(struct rpx *rx, struct rprof_cmdview *cv,
                                      const struct resp_msg *m, const uint8_t *buf,
                                      const struct bmq_call *c)
{
    struct bmq_pending *pd = NULL;
    if (rpx_jobs_needed(rx) && (pd = calloc(1, sizeof(*pd))) != NULL &&
        !bmq_call_prefix(cv, c, BMQ_MOVE_TO_ACTIVE, pd->prefix, sizeof(pd->prefix))) {
        free(pd);
        pd = NULL;
    }
    if (pd != NULL && !bmq_call_token(cv, c, BMQ_MOVE_TO_ACTIVE, pd->token, sizeof(pd->token)))
        pd->token[0] = '\0';
    struct entry *e = rpx_forward(rx, cv, m, buf, m->len);
    if (e != NULL && pd != NULL) {
        e->kind = RK_BMQ_NEXT;
        e->bmq = pd;
    } else {
        free(pd);
    }
    return CMD_DONE;
}

/* ---- leases ------------------------------------------------------------------------------- */

enum { LEASE_KEEP, LEASE_DROP, LEASE_LATE };

struct lease_walk {
    struct rpx *rx;
    const char *prefix;
    uint8_t *fate; /* per element of the call */
    uint32_t n;
    size_t dropped, late;
    uint32_t late_ms;
    const struct rule *close_before, *close_after;
};

static void lease_fate(struct lease_walk *w, uint32_t k, uint8_t fate, uint32_t ms)
{
    w->fate[k] = fate;
    if (fate == LEASE_DROP)
        w->dropped++;
    if (fate == LEASE_LATE) {
        w->late++;
        if (ms > w->late_ms)
            w->late_ms = ms;
    }
}

/* One job of a renewal: its `lease` event, or the loss an earlier fault on its lease made. */
static void lease_one(void *arg, uint32_t k, const char *id, const char *token)
{
    struct lease_walk *w = arg;
    struct rpx *rx = w->rx;
    char key[BMQ_KEY_MAX];
    if (k >= w->n || !job_key(w->prefix, id, key, sizeof(key)))
        return;
    idmap_lock();
    struct idmap_info *in = idmap_get(rpx_scope(rx), key, strlen(key));
    uint32_t marks = in != NULL && in->id != NULL && token[0] != '\0' && strcmp(in->id, token) == 0
                         ? in->flags & (IDMAP_LEASE_LOST | IDMAP_LEASE_LATE)
                         : 0;
    uint32_t ms = in != NULL ? in->lease_ms : 0;
    idmap_unlock();
    if (marks != 0) {
        /* Counted, not decided: the lease was lost already (a rule's one fault on the job, or
         * a duplicate of its delivery). */
        codec_count(rx->s, RULE_EV_LEASE);
        lease_fate(w, k, (marks & IDMAP_LEASE_LOST) ? LEASE_DROP : LEASE_LATE, ms);
        return;
    }
    struct job_event j;
    job_event_of(rx, &j, RULE_EV_LEASE, w->prefix, id, key, NULL);
    const struct rule *r = rpx_decide_job(rx, &j);
    rpx_job_event_clear(&j);
    if (r == NULL)
        return;
    switch (r->action.kind) {
    case RULE_ACT_DROP:
        mark_lease(rx, key, token, false, 0);
        lease_fate(w, k, LEASE_DROP, 0);
        break;
    case RULE_ACT_DELAY:
        mark_lease(rx, key, token, true, r->action.duration_ms);
        lease_fate(w, k, LEASE_LATE, r->action.duration_ms);
        break;
    case RULE_ACT_CLOSE:
        if (r->action.close_when == RULE_CLOSE_BEFORE && w->close_before == NULL)
            w->close_before = r;
        else if (r->action.close_when != RULE_CLOSE_BEFORE && w->close_after == NULL)
            w->close_after = r;
        break;
    default:
        break;
    }
}

/* The renewal with only its elements of fate `which` into b: extendLocks with its tokens and ids
 * packed anew, extendLock as it was. */
static bool lease_subset(struct evbuffer *b, const struct rprof_cmdview *cv,
                         const struct bmq_call *c, enum bmq_script s, const uint8_t *fate,
                         uint32_t n, uint8_t which)
{
    if (s == BMQ_EXTEND_LOCK)
        return evbuffer_add(b, cv->buf, cv->len) == 0;
    struct resp_view tv, iv;
    if (!bmq_arg(cv, c, 1, &tv) || !bmq_arg(cv, c, 2, &iv))
        return false;
    bool *keep = calloc(n > 0 ? n : 1, sizeof(*keep));
    uint8_t *tok = malloc(tv.len + 5), *ids = malloc(iv.len + 5);
    bool ok = keep != NULL && tok != NULL && ids != NULL;
    for (uint32_t k = 0; ok && k < n; k++)
        keep[k] = fate[k] == which;
    long tl = ok ? mp_array_subset(cv->buf + tv.off, tv.len, keep, n, tok, tv.len + 5) : -1;
    long il = ok ? mp_array_subset(cv->buf + iv.off, iv.len, keep, n, ids, iv.len + 5) : -1;
    if (tl > 0 && il > 0) {
        size_t at[2] = {argv_at(c, 1), argv_at(c, 2)};
        const void *val[2] = {tok, ids};
        size_t len[2] = {(size_t)tl, (size_t)il};
        ok = encode_with(b, cv, 2, at, val, len);
    } else {
        ok = false;
    }
    free(keep);
    free(tok);
    free(ids);
    return ok;
}

/* extendLocks / extendLock: each job's renewal decided; the call forwarded whole, without the
 * renewals kept back, or answered by twice when it keeps them all back. */
static enum cmd_result command_lease(struct rpx *rx, struct rprof_cmdview *cv,
                                     const struct resp_msg *m, const uint8_t *buf,
                                     const struct bmq_call *c, enum bmq_script s)
{
    size_t len = m->len;
    char prefix[BMQ_PREFIX_MAX];
    uint32_t n = 0;
    struct lease_walk w = {.rx = rx, .prefix = prefix};
    if (!rpx_jobs_needed(rx) || !bmq_call_prefix(cv, c, s, prefix, sizeof(prefix))) {
        codec_count(rx->s, RULE_EV_LEASE);
        rpx_forward(rx, cv, m, buf, len);
        return CMD_DONE;
    }
    struct resp_view iv;
    if (s == BMQ_EXTEND_LOCKS && bmq_arg(cv, c, 2, &iv) && iv.type == '$' && !iv.null) {
        size_t pos = 0;
        struct mp_item arr;
        if (mp_next(cv->buf + iv.off, iv.len, &pos, &arr) == 0 && arr.type == MP_ARRAY &&
            arr.count <= iv.len)
            n = arr.count;
    } else if (s == BMQ_EXTEND_LOCK) {
        n = 1;
    }
    w.n = n;
    w.fate = calloc(n > 0 ? n : 1, 1);
    uint32_t count = 0;
    if (w.fate == NULL || n == 0 || bmq_lock_each(cv, c, s, lease_one, &w, &count) != 0 ||
        count != n) {
        free(w.fate);
        rpx_forward(rx, cv, m, buf, len);
        return CMD_DONE;
    }
    if (w.close_before != NULL) {
        free(w.fate);
        rpx_swallow(rx, len);
        rpx_cut_at_turn(rx, w.close_before, NULL);
        return CMD_STOP;
    }
    if (w.late > 0) {
        struct evbuffer *later = evbuffer_new();
        if (later != NULL && lease_subset(later, cv, c, s, w.fate, n, LEASE_LATE))
            send_own(rx, later, w.late_ms);
        else
            log_msg(LOG_WARN, "renewal not delayed",
                    "sid=%llu listener=%s reason=\"out of memory\" jobs=%zu",
                    (unsigned long long)rx->s->id, rpx_scope(rx), w.late);
        if (later != NULL)
            evbuffer_free(later);
    }
    struct entry *e = NULL;
    size_t held = w.dropped + w.late;
    if (held == n) {
        /* Every renewal kept back: answered as one that renewed them all. */
        rpx_swallow(rx, len);
        if (rpx_owe_reply(rx)) {
            if (s == BMQ_EXTEND_LOCKS)
                rpx_answer(rx, "*0\r\n", 4);
            else
                rpx_answer(rx, ":1\r\n", 4);
        }
    } else if (held > 0) {
        struct evbuffer *kept = evbuffer_new();
        if (kept == NULL || !lease_subset(kept, cv, c, s, w.fate, n, LEASE_KEEP) ||
            (e = rpx_forward_instead(rx, kept, len)) == NULL) {
            log_msg(LOG_WARN, "renewal not kept back",
                    "sid=%llu listener=%s reason=\"cannot rewrite the call\"",
                    (unsigned long long)rx->s->id, rpx_scope(rx));
            e = rpx_forward(rx, cv, m, buf, len);
        }
        if (kept != NULL)
            evbuffer_free(kept);
    } else {
        e = rpx_forward(rx, cv, m, buf, len);
    }
    free(w.fate);
    if (w.close_after != NULL) {
        rpx_cut_at_turn(rx, w.close_after, e);
        return CMD_STOP;
    }
    return CMD_DONE;
}

/* ---- publishes ---------------------------------------------------------------------------- */

/* An add script: decided before Redis sees it, with the job's own id when the app chose one
 * (BullMQ's counter gives it otherwise, in the reply, where it is journaled). */
static enum cmd_result command_add(struct rpx *rx, struct rprof_cmdview *cv,
                                   const struct resp_msg *m, const uint8_t *buf,
                                   const struct bmq_call *c)
{
    size_t len = m->len;
    struct bmq_job bj;
    bool wants = rx->decided < DECIDED_ALL && codec_wants(rx->s, RULE_EV_PUBLISH);
    if ((!rpx_jobs_needed(rx) && !wants) || bmq_add_args(cv, c, &bj) != 0) {
        if (rx->decided < DECIDED_ALL)
            codec_count(rx->s, RULE_EV_PUBLISH);
        rx->decided = 0;
        rpx_forward(rx, cv, m, buf, len);
        return CMD_DONE;
    }
    const struct rule *r = NULL;
    if (wants) {
        /* The job's key (the `key` matcher) when the app chose its id; BullMQ's counter gives
         * the others theirs in the reply. */
        char key[BMQ_KEY_MAX];
        bool keyed = bj.id[0] != '\0' && job_key(bj.prefix, bj.id, key, sizeof(key));
        struct job_event j = {.kind = RULE_EV_PUBLISH, .key = keyed ? key : NULL};
        j.id = bj.id[0] != '\0' ? rpx_jdup(&j, bj.id) : NULL;
        j.task = bj.name[0] != '\0' ? rpx_jdup(&j, bj.name) : NULL;
        j.queue = bj.queue[0] != '\0' ? rpx_jdup(&j, bj.queue) : NULL;
        if (j.oom) {
            rpx_job_event_clear(&j);
            rx->decided = 0;
            rpx_forward(rx, cv, m, buf, len);
            return CMD_DONE;
        }
        struct engine_event ev;
        char anon[48], made[64];
        rpx_job_engine_event(rx, &j, &ev, anon);
        size_t hit = 0;
        r = codec_decide_first_unnoted(rx->s, &ev, &hit) == 1 ? rpx_hit_rule(rx, hit) : NULL;
        if (r != NULL && r->action.kind == RULE_ACT_DROP && j.id == NULL) {
            /* No such job will exist: an id BullMQ's counter never gives. */
            snprintf(made, sizeof(made), "twice-dropped-%llu-%llu", (unsigned long long)rx->s->id,
                     (unsigned long long)++rx->anon);
            j.id = rpx_jdup(&j, made);
        }
        if (r != NULL) {
            ev.message_id = j.id;
            fault_note(rx->s, r, &ev);
        }
        if (r != NULL && r->action.kind == RULE_ACT_DROP) {
            rpx_journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
            rpx_swallow(rx, len);
            if (rpx_owe_reply(rx) && j.id != NULL) {
                char reply[BMQ_ID_MAX + 32];
                int k = snprintf(reply, sizeof(reply), "$%zu\r\n%s\r\n", strlen(j.id), j.id);
                if (k > 0 && (size_t)k < sizeof(reply))
                    rpx_answer(rx, reply, (size_t)k);
            }
            rpx_job_event_clear(&j);
            rx->decided = 0;
            return CMD_DONE;
        }
        rpx_job_event_clear(&j);
        if (r != NULL && r->action.kind == RULE_ACT_DELAY) {
            rx->decided = DECIDED_ALL;
            rx->hold_until = proxy_now_ms() + r->action.duration_ms;
            return CMD_WAIT;
        }
        if (r != NULL && r->action.kind == RULE_ACT_CLOSE &&
            r->action.close_when == RULE_CLOSE_BEFORE) {
            rpx_swallow(rx, len);
            rpx_cut_at_turn(rx, r, NULL);
            return CMD_STOP;
        }
    } else if (rx->decided < DECIDED_ALL) {
        codec_count(rx->s, RULE_EV_PUBLISH);
    }
    rx->decided = 0;
    struct entry *e = rpx_forward(rx, cv, m, buf, len);
    struct bmq_pending *pd = e != NULL ? calloc(1, sizeof(*pd)) : NULL;
    if (pd != NULL) {
        memcpy(pd->prefix, bj.prefix, sizeof(pd->prefix));
        memcpy(pd->name, bj.name, sizeof(pd->name));
        e->kind = RK_BMQ_ADD;
        e->bmq = pd;
    }
    if (r != NULL && r->action.kind == RULE_ACT_CLOSE) {
        rpx_cut_at_turn(rx, r, e);
        return CMD_STOP;
    }
    return CMD_DONE;
}

void rpx_bmq_journal_add(struct rpx *rx, const struct bmq_pending *pd, const uint8_t *buf,
                         const struct resp_view *v)
{
    char id[BMQ_ID_MAX];
    if (bmq_add_reply(buf, v, id, sizeof(id)) != 1)
        return;
    struct job_event j = {.kind = RULE_EV_PUBLISH};
    j.id = rpx_jdup(&j, id);
    j.task = pd->name[0] != '\0' ? rpx_jdup(&j, pd->name) : NULL;
    char queue[BMQ_QUEUE_MAX];
    if (bmq_queue_of_prefix((const uint8_t *)pd->prefix, strlen(pd->prefix), queue, sizeof(queue)))
        j.queue = rpx_jdup(&j, queue);
    rpx_journal_job(rx, JOURNAL_KIND_PUBLISH, &j);
    rpx_job_event_clear(&j);
}

struct bmq_pending *rpx_bmq_tx_add(struct rpx *rx, const struct rprof_cmdview *cv)
{
    struct bmq_call c;
    struct bmq_job bj;
    if (!rpx_is_cmd(cv, RPROF_CMD_EVAL) && !rpx_is_cmd(cv, RPROF_CMD_EVALSHA))
        return NULL;
    if (!bmq_call_of(cv, &c) || !bmq_script_adds(call_script(cv, &c)))
        return NULL;
    codec_count(rx->s, RULE_EV_PUBLISH); /* seen, not decided: see docs/limits.md */
    struct bmq_pending *pd;
    if (rx->s->px->journal == NULL || bmq_add_args(cv, &c, &bj) != 0 ||
        (pd = calloc(1, sizeof(*pd))) == NULL)
        return NULL;
    memcpy(pd->prefix, bj.prefix, sizeof(pd->prefix));
    memcpy(pd->name, bj.name, sizeof(pd->name));
    return pd;
}

/* ---- entry points ------------------------------------------------------------------------- */

enum cmd_result rpx_bmq_command(struct rpx *rx, struct rprof_cmdview *cv, const struct resp_msg *m,
                                const uint8_t *buf)
{
    struct bmq_call c;
    struct resp_view sub, body;
    if (rpx_is_cmd(cv, RPROF_CMD_SCRIPT)) {
        if (rprof_arg(cv, 1, &sub) && rprof_arg_is(cv, &sub, "LOAD") && rprof_arg(cv, 2, &body) &&
            body.type == '$' && !body.null) {
            enum bmq_script s = bmq_script_of(buf + body.off, body.len);
            if (s != BMQ_SCRIPT_UNKNOWN)
                sha_learn(buf + body.off, body.len, s);
        }
        rx->decided = 0;
        rpx_forward(rx, cv, m, buf, m->len);
        return CMD_DONE;
    }
    enum bmq_script s = bmq_call_of(cv, &c) ? call_script(cv, &c) : BMQ_SCRIPT_UNKNOWN;
    if (!bmq_script_adds(s))
        rx->decided = 0; /* only an add is held (delay) and seen again */
    switch (s) {
    case BMQ_ADD_STANDARD:
    case BMQ_ADD_DELAYED:
    case BMQ_ADD_PRIORITIZED:
    case BMQ_ADD_PARENT:
        return command_add(rx, cv, m, buf, &c);
    case BMQ_MOVE_TO_ACTIVE:
        return command_active(rx, cv, m, buf, &c);
    case BMQ_MOVE_TO_FINISHED:
        return command_finish(rx, cv, m, buf, &c);
    case BMQ_RETRY_JOB:
    case BMQ_MOVE_TO_DELAYED:
        return command_retry(rx, cv, m, buf, &c, s);
    case BMQ_EXTEND_LOCK:
    case BMQ_EXTEND_LOCKS:
        return command_lease(rx, cv, m, buf, &c, s);
    default:
        rpx_forward(rx, cv, m, buf, m->len);
        return CMD_DONE;
    }
}

void rpx_bmq_on_reply(struct rpx *rx, struct entry *e, const uint8_t *buf, const struct resp_msg *m,
                      struct evbuffer *reply)
{
    if (e->bmq == NULL)
        return;
    switch (e->kind) {
    case RK_BMQ_ADD:
        rpx_bmq_journal_add(rx, e->bmq, buf, &m->value);
        break;
    case RK_BMQ_NEXT:
    case RK_BMQ_RETRY:
        on_next(rx, e, buf, m, reply);
        break;
    case RK_BMQ_FINISH:
        on_finish(rx, e, buf, m, reply);
        break;
    default:
        break;
    }
}
