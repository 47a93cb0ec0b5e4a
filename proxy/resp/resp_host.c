/*
 * resp_host.c - a RESP session as the host of its listener's framework module
 * (proto/jobs/job.h, proto/jobs/framework.h), and the one place that carries out the plans a
 * module makes (proto/resp/resp_plan.h), and those of the faults the `command` rules ask
 * (rpx_cmd_plan_of_fault()).
 *
 * The host answers what a module asks: whether a rule looks at an event, the rule's fault
 * (rules/plan.h), the journal, the log, and the listener's job memory (proxy/resp/idmap.h). Scripts
 * a module knows by their bodies are remembered by sha1 for the whole process: a sha names one
 * body wherever it is seen.
 *
 * A plan's bytes that could not be made (out of memory) are not half sent: the command or reply
 * goes on as it came, and a line says so.
 */
#include "proxy/resp/resp_internal.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <sys/random.h>

#include "rules/plan.h"

/* ---- scripts by sha ----------------------------------------------------------------------- */

/* Bodies remembered: BullMQ has a dozen scripts twice reads; a few versions of them side by
 * side stay far below this. */
#define RPX_SCRIPTS_MAX 256u

static struct {
    char hex[41];
    unsigned tag;
} scripts[RPX_SCRIPTS_MAX];
static size_t n_scripts;
static bool scripts_full_said;
static pthread_mutex_t scripts_mu = PTHREAD_MUTEX_INITIALIZER;

static void h_script_learn(void *ctx, const uint8_t *body, size_t n, unsigned tag)
{
    (void)ctx;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    char hex[41];
    if (EVP_Digest(body, n, d, &dl, EVP_sha1(), NULL) != 1 || dl != 20)
        return;
    for (unsigned i = 0; i < 20; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    pthread_mutex_lock(&scripts_mu);
    bool known = false;
    for (size_t i = 0; i < n_scripts && !known; i++)
        known = memcmp(scripts[i].hex, hex, 40) == 0;
    if (!known && n_scripts < RPX_SCRIPTS_MAX) {
        memcpy(scripts[n_scripts].hex, hex, sizeof(hex));
        scripts[n_scripts++].tag = tag;
    } else if (!known && !scripts_full_said) {
        scripts_full_said = true;
        log_msg(LOG_WARN, "scripts not learnt", "reason=\"more than %u script bodies\"",
                RPX_SCRIPTS_MAX);
    }
    pthread_mutex_unlock(&scripts_mu);
}

static unsigned h_script_tag(void *ctx, const uint8_t *p, size_t n)
{
    (void)ctx;
    if (n != 40)
        return 0;
    char hex[41];
    for (size_t i = 0; i < 40; i++)
        hex[i] = (char)(p[i] >= 'A' && p[i] <= 'F' ? p[i] - 'A' + 'a' : p[i]);
    hex[40] = '\0';
    unsigned tag = 0;
    pthread_mutex_lock(&scripts_mu);
    for (size_t i = 0; i < n_scripts && tag == 0; i++)
        if (memcmp(scripts[i].hex, hex, 40) == 0)
            tag = scripts[i].tag;
    pthread_mutex_unlock(&scripts_mu);
    return tag;
}

/* ---- events, rules, journal ------------------------------------------------------------ */

static bool h_wants(void *ctx, enum job_ev k)
{
    struct rpx *rx = ctx;
    return codec_wants(rx->s, rule_event_of_job(k));
}

static void h_count(void *ctx, enum job_ev k)
{
    struct rpx *rx = ctx;
    codec_count(rx->s, rule_event_of_job(k));
}

/* The rules' view of a job event (no identity: decide() adds it). */
static void engine_event_of(const struct job_event *j, struct engine_event *ev)
{
    memset(ev, 0, sizeof(*ev));
    ev->event = rule_event_of_job(j->kind);
    ev->queue = j->queue;
    ev->message_id = j->id;
    ev->task = j->task;
    ev->key = j->key;
    ev->redelivered = j->redelivered;
}

static struct job_fault decide(struct rpx *rx, const struct job_event *j, bool note)
{
    struct job_fault none = {.kind = JOB_FAULT_NONE};
    enum rule_event kind = rule_event_of_job(j->kind);
    if (!codec_wants(rx->s, kind)) {
        /* No rule of this listener looks at the event: counted, without naming an anonymous
         * job first. */
        codec_count(rx->s, kind);
        return none;
    }
    struct engine_event ev;
    char anon[48];
    engine_event_of(j, &ev);
    /* No id: each event is its own identity (session, a counter). */
    uint64_t seq = j->id == NULL ? ++rx->anon : 0;
    codec_event_identity(&ev, anon, sizeof(anon), (const uint64_t[]){rx->s->id, seq}, 2);
    size_t hits[SESSION_MAX_RULE_HITS];
    size_t n = note ? codec_decide(rx->s, &ev, hits) : codec_decide_unnoted(rx->s, &ev, hits);
    if (n == 0)
        return none;
    const struct rule *r = rpx_hit_rule(rx, hits[0]); /* one rule acts on a job event */
    return rule_action_is_stream(r->action.kind) ? none : rule_job_fault(r);
}

static struct job_fault h_decide(void *ctx, const struct job_event *j)
{
    return decide(ctx, j, true);
}

static struct job_fault h_decide_unnoted(void *ctx, const struct job_event *j)
{
    return decide(ctx, j, false);
}

static void h_note(void *ctx, const struct job_fault *f, const struct job_event *j)
{
    struct rpx *rx = ctx;
    struct engine_event ev;
    engine_event_of(j, &ev);
    if (f->rule != NULL)
        fault_note(rx->s, f->rule, &ev);
}

static enum journal_kind journal_kind_of(enum job_rec r)
{
    switch (r) {
    case JOB_REC_PUBLISH:
        return JOURNAL_KIND_PUBLISH;
    case JOB_REC_DELIVER:
        return JOURNAL_KIND_DELIVER;
    case JOB_REC_ACK:
        return JOURNAL_KIND_ACK;
    case JOB_REC_NACK:
        return JOURNAL_KIND_NACK;
    default:
        return JOURNAL_KIND_RUNNING;
    }
}

void rpx_journal_event(struct rpx *rx, enum journal_kind kind, const struct job_event *j)
{
    struct journal *jr = rx->s->px->journal;
    if (jr == NULL)
        return;
    struct journal_record r = {
        .kind = kind,
        .session = rx->s->id,
        .listener = rx->s->cfg->l->name,
        .client = rx->s->client_addr,
        .queue = j->queue,
        .task = j->task,
        .message_id = j->id,
        .redelivered = j->redelivered,
        .retries = j->retries,
        .retry = j->retry,
        .refused = j->refused,
        .kept_back = j->kept_back,
        .started_unix_us = j->started_unix_us,
        .run = j->run,
    };
    journal_record(jr, &r);
}

static void h_record(void *ctx, enum job_rec rec, const struct job_event *j)
{
    rpx_journal_event(ctx, journal_kind_of(rec), j);
}

static void h_log(void *ctx, enum job_log_level level, const char *msg, const char *fields)
{
    struct rpx *rx = ctx;
    log_msg(level == JOB_LOG_WARN ? LOG_WARN : LOG_INFO, msg, "sid=%llu listener=%s %s",
            (unsigned long long)rx->s->id, rpx_scope(rx), fields);
}

static uint64_t h_next_seq(void *ctx)
{
    struct rpx *rx = ctx;
    return ++rx->anon;
}

/* A field longer than its limit: the session's first is logged with the field, its length and
 * the limit. */
static void h_too_long(void *ctx, const char *field, uint64_t len, size_t cap)
{
    struct rpx *rx = ctx;
    if (rx->said_too_long)
        return;
    rx->said_too_long = true;
    log_msg(LOG_WARN, "resp field too long", "sid=%llu listener=%s field=%s bytes=%llu limit=%zu",
            (unsigned long long)rx->s->id, rpx_scope(rx), field, (unsigned long long)len, cap - 1);
}

static bool h_random(void *ctx, void *buf, size_t n)
{
    (void)ctx;
    return getrandom(buf, n, 0) == (ssize_t)n;
}

static uint64_t h_wall_ms(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the job memory ------------------------------------------------------------------------ */

static void h_memo_lock(void *ctx)
{
    (void)ctx;
    idmap_lock();
}

static void h_memo_unlock(void *ctx)
{
    (void)ctx;
    idmap_unlock();
}

static struct job_memo *h_memo_get(void *ctx, const char *key, size_t n)
{
    return idmap_get(rpx_scope(ctx), key, n);
}

static struct job_memo *h_memo_put(void *ctx, const char *key, size_t n)
{
    return idmap_put(rpx_scope(ctx), key, n);
}

static void h_memo_del(void *ctx, const char *key, size_t n)
{
    idmap_del(rpx_scope(ctx), key, n);
}

/* Whether anything needs what a profile reads from a job's payload: the journal (every publish,
 * delivery and ack is recorded with the job's identity) or a rule on those events.  Without
 * either, jobs are still counted as events (/stats) but not decoded: jansson was a third of a
 * profiled listener's CPU. */
bool rpx_jobs_needed(struct rpx *rx)
{
    return rx->s->px->journal != NULL || codec_wants(rx->s, RULE_EV_PUBLISH) ||
           codec_wants(rx->s, RULE_EV_DELIVER) || codec_wants(rx->s, RULE_EV_ACK) ||
           codec_wants(rx->s, RULE_EV_NACK) || codec_wants(rx->s, RULE_EV_LEASE);
}

/* One action per event, as on every protocol (ruleset_decide()): the first rule that fires, in
 * file order. */
size_t rpx_decide(struct rpx *rx, struct engine_event *ev, size_t *hits)
{
    return codec_decide(rx->s, ev, hits);
}

const struct rule *rpx_hit_rule(struct rpx *rx, size_t idx)
{
    struct ruleset *rs = rx->s->loop->rules;
    if (rx->n_pinned == 0 || rx->pinned[rx->n_pinned - 1] != rs) {
        struct ruleset **p = realloc(rx->pinned, (rx->n_pinned + 1) * sizeof(*p));
        if (p == NULL) {
            /* The rule is valid now; the session ends before any later use. */
            pump_fail(&rx->pump, "pinning a ruleset");
        } else {
            ruleset_get(rs);
            p[rx->n_pinned++] = rs;
            rx->pinned = p;
        }
    }
    return ruleset_rule(rs, idx);
}

int rpx_host_init(struct rpx *rx)
{
    const struct conf_listener *l = rx->s->cfg->l;
    rx->host = (struct job_host){
        .ctx = rx,
        .session = rx->s->id,
        .ids = &l->message_id,
        .tasks = &l->task,
        .too_long = h_too_long,
        .random = h_random,
        .wall_ms = h_wall_ms,
        .wants = h_wants,
        .count = h_count,
        .decide = h_decide,
        .decide_unnoted = h_decide_unnoted,
        .note = h_note,
        .record = h_record,
        .log = h_log,
        .next_seq = h_next_seq,
        .memo_lock = h_memo_lock,
        .memo_unlock = h_memo_unlock,
        .memo_get = h_memo_get,
        .memo_put = h_memo_put,
        .memo_del = h_memo_del,
        .script_learn = h_script_learn,
        .script_tag = h_script_tag,
    };
    if (rx->fw != NULL && rx->fw->open != NULL && (rx->host.state = rx->fw->open()) == NULL)
        return -1;
    return 0;
}

void rpx_host_free(struct rpx *rx)
{
    if (rx->fw != NULL && rx->fw->close != NULL && rx->host.state != NULL)
        rx->fw->close(rx->host.state);
    rx->host.state = NULL;
}

const struct job_host *rpx_host(struct rpx *rx)
{
    /* The rules change between events (a reload): what reads jobs is asked anew. */
    rx->host.journal = rx->s->px->journal != NULL;
    rx->host.needed = rpx_jobs_needed(rx);
    rx->host.resp = rx->pairing.proto == 3 ? 3 : 2;
    return &rx->host;
}

/* ---- carrying plans out -------------------------------------------------------------------- */

/* Sends a plan's own commands on twice's own connection. */
static void send_own(struct rpx *rx, const struct resp_own *own, size_t n_own)
{
    for (size_t i = 0; i < n_own; i++) {
        if (own[i].n == 0 || own[i].cmds.oom)
            continue;
        struct evbuffer *b = evbuffer_new();
        if (b == NULL || evbuffer_add(b, own[i].cmds.p, own[i].cmds.len) != 0)
            log_msg(LOG_WARN, "own commands not sent",
                    "sid=%llu listener=%s reason=\"out of memory\" commands=%zu",
                    (unsigned long long)rx->s->id, rpx_scope(rx), own[i].n);
        else
            rpx_aux_send_at(rx, b, own[i].n, own[i].ms);
        if (b != NULL)
            evbuffer_free(b);
    }
}

/* The own commands of a held command's plan, kept until it goes on. */
static void keep_own(struct rpx *rx, struct resp_cmd_plan *p)
{
    rpx_held_own_free(rx);
    memcpy(rx->held_own, p->own, sizeof(rx->held_own));
    rx->n_held_own = p->n_own;
    p->n_own = 0;
}

void rpx_held_own_free(struct rpx *rx)
{
    for (size_t i = 0; i < rx->n_held_own; i++)
        resp_bytes_free(&rx->held_own[i].cmds);
    rx->n_held_own = 0;
}

static void say_not_carried_out(struct rpx *rx, const char *what)
{
    log_msg(LOG_WARN, "fault not carried out", "sid=%llu listener=%s reason=\"out of memory\" %s",
            (unsigned long long)rx->s->id, rpx_scope(rx), what);
}

/* The command Redis gets instead of the client's (REWRITE): its entry, or NULL when it could
 * not be sent (the caller forwards the client's). */
static struct entry *rewrite(struct rpx *rx, const struct resp_bytes *bytes, size_t len,
                             int64_t add)
{
    struct evbuffer *b = evbuffer_new();
    struct entry *e = NULL;
    if (b != NULL && evbuffer_add(b, bytes->p, bytes->len) == 0)
        e = rpx_forward_instead(rx, b, len);
    if (b != NULL)
        evbuffer_free(b);
    if (e != NULL && add != 0) {
        e->kind = RK_ADD_INT;
        e->add = add;
    }
    return e;
}

void rpx_cmd_plan_of_fault(const struct job_fault *f, struct resp_cmd_plan *p)
{
    switch (f->kind) {
    case JOB_FAULT_ERROR:
        p->fate = RESP_CMD_REFUSE;
        rpx_error_reply(f->rule, &p->bytes);
        break;
    case JOB_FAULT_DROP:
        p->fate = RESP_CMD_DROP;
        break;
    case JOB_FAULT_DELAY:
        p->fate = RESP_CMD_HOLD;
        p->hold_ms = f->ms;
        break;
    case JOB_FAULT_CLOSE:
        /* before: kept from Redis and cut at its turn; after: forwarded, cut after its reply */
        p->fate = f->before ? RESP_CMD_CUT : RESP_CMD_FORWARD;
        p->cut = f->rule;
        break;
    default:
        p->fate = RESP_CMD_FORWARD;
        break;
    }
}

/* `drop`: as from a hung server, the replies already due go out, then nothing more (an entry
 * that never completes), and what the client sends after it is discarded. */
static void hang(struct rpx *rx)
{
    (void)rpx_set_phase(rx, RPX_BLACKHOLED, 0);
    struct entry *hole = rpx_entry_add(rx, false);
    if (hole != NULL)
        hole->done = false;
}

enum cmd_result rpx_apply_cmd_plan(struct rpx *rx, const struct rprof_cmdview *cv,
                                   const struct resp_msg *m, const uint8_t *buf,
                                   struct resp_cmd_plan *p)
{
    size_t len = m->len;
    if (p->bytes.oom) {
        /* Nothing of it: no command of twice's own either. */
        say_not_carried_out(rx, "detail=\"the command goes on as it came\"");
        resp_cmd_plan_free(p);
        p->fate = RESP_CMD_FORWARD;
    }
    struct entry *e = NULL;
    enum cmd_result res = CMD_DONE;
    switch (p->fate) {
    case RESP_CMD_HOLD:
        (void)rpx_set_phase(rx, RPX_HOLDING, proxy_now_ms() + p->hold_ms);
        res = CMD_WAIT;
        break;
    case RESP_CMD_CUT:
        res = rpx_cut_command(rx, p->cut, true, NULL, len);
        break;
    case RESP_CMD_DROP:
        rpx_swallow(rx, len);
        hang(rx);
        res = CMD_STOP;
        break;
    case RESP_CMD_ANSWER:
    case RESP_CMD_REFUSE:
        rpx_swallow(rx, len);
        if (rpx_owe_reply(rx))
            rpx_answer(rx, p->bytes.p, p->bytes.len);
        if (p->fate == RESP_CMD_REFUSE && rx->tx.active)
            rx->tx.aborted = true; /* as a queue-time error: EXEC will abort */
        break;
    case RESP_CMD_REWRITE:
        if ((e = rewrite(rx, &p->bytes, len, p->reply_add)) == NULL && pump_failed(&rx->pump)) {
            res = CMD_STOP; /* the command left the buffer: buf is gone with it */
        } else if (e == NULL) {
            log_msg(LOG_WARN, "command not rewritten",
                    "sid=%llu listener=%s reason=\"cannot send the rewritten command\"",
                    (unsigned long long)rx->s->id, rpx_scope(rx));
            e = rpx_forward(rx, cv, m, buf, len);
        }
        break;
    default:
        e = rpx_forward(rx, cv, m, buf, len);
        break;
    }
    if (e != NULL && p->reply.kind != 0) {
        e->kind = RK_FRAMEWORK;
        e->tag = p->reply;
        e->fw = rx->fw;
        p->reply = (struct resp_reply_tag){0};
    }
    resp_framework_free_tag(rx->fw, &p->reply);
    if (res == CMD_WAIT) {
        /* Held: its own commands go once it does (copies of the jobs of a publish). */
        keep_own(rx, p);
    } else {
        send_own(rx, p->own, p->n_own);
        send_own(rx, rx->held_own, rx->n_held_own);
        rpx_held_own_free(rx);
    }
    if (res == CMD_DONE && p->cut != NULL)
        res = rpx_cut_command(rx, p->cut, false, e, len); /* once its reply went out */
    resp_cmd_plan_free(p);
    return res;
}

void rpx_apply_reply_plan(struct rpx *rx, struct entry *e, struct evbuffer *reply,
                          struct resp_reply_plan *p)
{
    if (p->replace && p->bytes.oom) {
        say_not_carried_out(rx, "detail=\"the reply goes on as it came\"");
        p->replace = false;
    }
    if (p->replace) {
        evbuffer_drain(reply, evbuffer_get_length(reply));
        evbuffer_add(reply, p->bytes.p, p->bytes.len);
    }
    if (p->delay_ms != 0)
        e->release_ms = proxy_now_ms() + p->delay_ms;
    if (p->cut != NULL) {
        if (p->cut_before)
            evbuffer_drain(reply, evbuffer_get_length(reply)); /* nothing of it goes out */
        e->close_after = p->cut;
    }
    send_own(rx, p->own, p->n_own);
    resp_reply_plan_free(p);
}

void rpx_framework_reply(struct rpx *rx, struct entry *e, const uint8_t *buf,
                         const struct resp_msg *m, struct evbuffer *reply)
{
    if (e->fw == NULL || e->fw->reply == NULL)
        return;
    struct resp_reply_plan p;
    memset(&p, 0, sizeof(p));
    e->fw->reply(rpx_host(rx), &e->tag, buf, m, &p);
    rpx_apply_reply_plan(rx, e, reply, &p);
}

bool rpx_framework_counted(struct rpx *rx, struct entry *e, const uint8_t *buf,
                           const struct resp_msg *m)
{
    if (e->fw == NULL || e->fw->count_pop == NULL || rpx_jobs_needed(rx) || e != rx->head ||
        e->release_ms != 0 || e->hide || evbuffer_get_length(e->bytes) > 0)
        return false;
    if (e->fw->count_pop(rpx_host(rx), &e->tag, buf, m))
        codec_count(rx->s, RULE_EV_DELIVER); /* as a decision would count it */
    pump_pass(&rx->pump, SIDE_UPSTREAM, m->len);
    return true;
}
