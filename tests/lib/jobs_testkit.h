/*
 * jobs_testkit.h - what the tests of the framework modules (proto/jobs/) share:
 *
 *   - a fake host (struct fake_host): the job_host a module talks to, with faults scripted by
 *     event, a job memory, the scripts it learnt, and every record, count, note and log line
 *     written down as text;
 *   - the failing allocator of failalloc.h (the test is linked with -Wl,--wrap=malloc,...),
 *     so that a test can run a path with an allocation failure at every step and check that
 *     nothing leaked;
 *   - a replay of a recorded session (tests/unit/data/frameworks/NAME/NN-{client,server}.bin)
 *     through a module, as the RESP hook would drive it: each command planned, each reply the
 *     plan tagged read, the elements of EXEC's reply handed to the module.
 *
 * Header-only: each test is its own executable; include it after <cmocka.h>.
 */
#ifndef TWICE_JOBS_TESTKIT_H
#define TWICE_JOBS_TESTKIT_H

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/framework.h"
#include "proto/resp/resp.h"
#include "tests/lib/failalloc.h"
#include "tests/lib/golden.h"
#include "tests/lib/text.h"

/* Each test uses some of the kit. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

/* ---- the fake host ------------------------------------------------------------------------ */

#define KIT_FAULTS_MAX 16u
#define KIT_MEMO_MAX 256u
#define KIT_SCRIPTS_MAX 64u

/* A rule, as far as a module can tell: an opaque handle. */
struct kit_rule {
    const char *name;
};

struct fake_host {
    struct job_host h;
    /* The faults the rules would decide: the first unused one of the event's kind (and id, when
     * given) is used once. */
    struct {
        enum job_ev kind;
        const char *id;
        struct job_fault f;
        bool used;
    } faults[KIT_FAULTS_MAX];
    size_t n_faults;
    bool wants_all;       /* a rule looks at every kind of event */
    struct kit_text said; /* records, counts, notes, log lines: one line each */
    unsigned decided[JOB_EV_COUNT], counted[JOB_EV_COUNT];
    struct {
        char key[256];
        struct job_memo m;
        bool used;
    } memo[KIT_MEMO_MAX];
    bool memo_held;
    struct {
        char hex[41];
        unsigned tag;
    } scripts[KIT_SCRIPTS_MAX];
    size_t n_scripts;
    uint64_t seq;
};

/* The rule every test's faults name. */
static struct kit_rule rule_a = {"a"};

static struct job_fault fault(enum job_fault_kind k, uint32_t ms)
{
    return (struct job_fault){.kind = k, .ms = ms, .rule = &rule_a};
}

/* One module's run over a recorded session or a hand-made one: its host and the plans it made,
 * one line each. */
struct run {
    struct fake_host host;
    struct kit_text plans;
};

static const char *const kit_ev_names[] = {"publish", "deliver", "ack", "nack", "lease"};
static const char *const kit_rec_names[] = {"PUBLISH", "DELIVER", "ACK", "NACK", "RUNNING"};
static const char *const kit_fault_names[] = {"none",      "drop",  "delay", "redeliver",
                                              "duplicate", "close", "other"};

static bool kit_wants(void *ctx, enum job_ev k)
{
    struct fake_host *f = ctx;
    if (f->wants_all)
        return true;
    for (size_t i = 0; i < f->n_faults; i++)
        if (f->faults[i].kind == k)
            return true;
    return false;
}

static void kit_count(void *ctx, enum job_ev k)
{
    struct fake_host *f = ctx;
    f->counted[k]++;
}

static struct job_fault kit_decide_unnoted(void *ctx, const struct job_event *ev)
{
    struct fake_host *f = ctx;
    assert_false(f->memo_held);
    struct job_fault none = {.kind = JOB_FAULT_NONE};
    if (!kit_wants(ctx, ev->kind)) {
        f->counted[ev->kind]++;
        return none;
    }
    f->decided[ev->kind]++;
    for (size_t i = 0; i < f->n_faults; i++) {
        if (f->faults[i].used || f->faults[i].kind != ev->kind)
            continue;
        if (f->faults[i].id != NULL && (ev->id == NULL || strcmp(ev->id, f->faults[i].id) != 0))
            continue;
        f->faults[i].used = true;
        return f->faults[i].f;
    }
    return none;
}

static void kit_note(void *ctx, const struct job_fault *fault, const struct job_event *ev)
{
    struct fake_host *f = ctx;
    kit_say(&f->said, "FAULT %s %s id=%s", kit_fault_names[fault->kind], kit_ev_names[ev->kind],
            ev->id != NULL ? ev->id : "-");
}

static struct job_fault kit_decide(void *ctx, const struct job_event *ev)
{
    struct job_fault r = kit_decide_unnoted(ctx, ev);
    if (r.kind != JOB_FAULT_NONE)
        kit_note(ctx, &r, ev);
    return r;
}

static void kit_record(void *ctx, enum job_rec rec, const struct job_event *ev)
{
    struct fake_host *f = ctx;
    assert_false(f->memo_held);
    kit_say(&f->said, "%s %s task=%s queue=%s%s%s%s%s retries=%u", kit_rec_names[rec],
            ev->id != NULL ? ev->id : "-", ev->task != NULL ? ev->task : "-",
            ev->queue != NULL ? ev->queue : "-", ev->redelivered ? " redelivered" : "",
            ev->retry ? " retry" : "", ev->refused ? " refused" : "",
            ev->kept_back ? " kept_back" : "", ev->retries);
}

static void kit_log(void *ctx, enum job_log_level level, const char *msg, const char *fields)
{
    struct fake_host *f = ctx;
    kit_say(&f->said, "log %s msg=\"%s\" %s", level == JOB_LOG_WARN ? "warn" : "info", msg, fields);
}

static bool kit_random(void *ctx, void *buf, size_t n)
{
    struct fake_host *f = ctx;
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)buf)[i] = (uint8_t)(0x11 * (i + 1) + f->seq);
    return true;
}

static uint64_t kit_wall_ms(void *ctx)
{
    (void)ctx;
    return 1700000000000ull;
}

static void kit_too_long(void *ctx, const char *field, uint64_t len, size_t cap)
{
    struct fake_host *f = ctx;
    kit_say(&f->said, "too long %s bytes=%llu limit=%zu", field, (unsigned long long)len, cap - 1);
}

static uint64_t kit_next_seq(void *ctx)
{
    struct fake_host *f = ctx;
    return ++f->seq;
}

static void kit_memo_lock(void *ctx)
{
    struct fake_host *f = ctx;
    assert_false(f->memo_held);
    f->memo_held = true;
}

static void kit_memo_unlock(void *ctx)
{
    struct fake_host *f = ctx;
    assert_true(f->memo_held);
    f->memo_held = false;
}

static struct job_memo *kit_memo_get(void *ctx, const char *key, size_t n)
{
    struct fake_host *f = ctx;
    assert_true(f->memo_held);
    for (size_t i = 0; i < KIT_MEMO_MAX; i++)
        if (f->memo[i].used && strlen(f->memo[i].key) == n && memcmp(f->memo[i].key, key, n) == 0)
            return &f->memo[i].m;
    return NULL;
}

static struct job_memo *kit_memo_put(void *ctx, const char *key, size_t n)
{
    struct fake_host *f = ctx;
    struct job_memo *m = kit_memo_get(ctx, key, n);
    if (m != NULL)
        return m;
    for (size_t i = 0; i < KIT_MEMO_MAX; i++) {
        if (!f->memo[i].used && n < sizeof(f->memo[i].key)) {
            f->memo[i].used = true;
            memcpy(f->memo[i].key, key, n);
            f->memo[i].key[n] = '\0';
            memset(&f->memo[i].m, 0, sizeof(f->memo[i].m));
            f->memo[i].m.gen = ++f->seq;
            return &f->memo[i].m;
        }
    }
    return NULL;
}

static void kit_memo_free_one(struct job_memo *m)
{
    free(m->task);
    free(m->queue);
    free(m->id);
    memset(m, 0, sizeof(*m));
}

static void kit_memo_del(void *ctx, const char *key, size_t n)
{
    struct fake_host *f = ctx;
    struct job_memo *m = kit_memo_get(ctx, key, n);
    if (m == NULL)
        return;
    kit_memo_free_one(m);
    for (size_t i = 0; i < KIT_MEMO_MAX; i++)
        if (&f->memo[i].m == m)
            f->memo[i].used = false;
}

/* The memory's entry for key, read without the lock (tests only). */
static struct job_memo *kit_memo(struct fake_host *f, const char *key)
{
    f->memo_held = true;
    struct job_memo *m = kit_memo_get(f, key, strlen(key));
    f->memo_held = false;
    return m;
}

static void kit_sha1_hex(const uint8_t *body, size_t n, char hex[41])
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    assert_int_equal(EVP_Digest(body, n, d, &dl, EVP_sha1(), NULL), 1);
    for (unsigned i = 0; i < 20; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static void kit_script_learn(void *ctx, const uint8_t *body, size_t n, unsigned tag)
{
    struct fake_host *f = ctx;
    char hex[41];
    kit_sha1_hex(body, n, hex);
    for (size_t i = 0; i < f->n_scripts; i++)
        if (strcmp(f->scripts[i].hex, hex) == 0)
            return;
    assert_true(f->n_scripts < KIT_SCRIPTS_MAX);
    memcpy(f->scripts[f->n_scripts].hex, hex, sizeof(hex));
    f->scripts[f->n_scripts++].tag = tag;
}

static unsigned kit_script_tag(void *ctx, const uint8_t *sha, size_t n)
{
    struct fake_host *f = ctx;
    for (size_t i = 0; n == 40 && i < f->n_scripts; i++)
        if (strncasecmp(f->scripts[i].hex, (const char *)sha, 40) == 0)
            return f->scripts[i].tag;
    return 0;
}

static void fake_host_init(struct fake_host *f)
{
    memset(f, 0, sizeof(*f));
    f->h = (struct job_host){
        .ctx = f,
        .session = 7,
        .journal = true,
        .needed = true,
        .wants = kit_wants,
        .count = kit_count,
        .decide = kit_decide,
        .decide_unnoted = kit_decide_unnoted,
        .note = kit_note,
        .record = kit_record,
        .log = kit_log,
        .next_seq = kit_next_seq,
        .too_long = kit_too_long,
        .random = kit_random,
        .wall_ms = kit_wall_ms,
        .memo_lock = kit_memo_lock,
        .memo_unlock = kit_memo_unlock,
        .memo_get = kit_memo_get,
        .memo_put = kit_memo_put,
        .memo_del = kit_memo_del,
        .script_learn = kit_script_learn,
        .script_tag = kit_script_tag,
    };
}

/* The next event of kind (of job id, when not NULL) is decided `fault`. */
static void fake_fault(struct fake_host *f, enum job_ev kind, const char *id,
                       struct job_fault fault)
{
    assert_true(f->n_faults < KIT_FAULTS_MAX);
    f->faults[f->n_faults].kind = kind;
    f->faults[f->n_faults].id = id;
    f->faults[f->n_faults].f = fault;
    f->n_faults++;
}

static void fake_host_free(struct fake_host *f)
{
    for (size_t i = 0; i < KIT_MEMO_MAX; i++)
        if (f->memo[i].used)
            kit_memo_free_one(&f->memo[i].m);
    kit_text_free(&f->said);
}

/* ---- commands and replies ------------------------------------------------------------------ */

/* A RESP command of argc arguments (NUL-terminated strings, or lens[i] bytes when lens is
 * given) into a buffer the caller frees, with *m its scan. */
static uint8_t *kit_command(struct resp_msg *m, size_t argc, const char *const *argv,
                            const size_t *lens)
{
    size_t ls[64], need = 64;
    assert_true(argc <= 64);
    for (size_t i = 0; i < argc; i++) {
        ls[i] = lens != NULL ? lens[i] : strlen(argv[i]);
        need += ls[i] + 32;
    }
    uint8_t *buf = __real_malloc(need);
    assert_non_null(buf);
    int n = resp_encode_command(buf, need, argc, argv, ls);
    assert_true(n > 0);
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    assert_int_equal(resp_scan(&sc, buf, (size_t)n, m), 1);
    return buf;
}

/* A plan's bytes as text (CRLF shown as "|"). */
static void kit_bytes_text(const struct resp_bytes *b, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < b->len && k + 2 < cap; i++) {
        if (b->p[i] == '\r' && i + 1 < b->len && b->p[i + 1] == '\n') {
            out[k++] = '|';
            i++;
        } else {
            out[k++] = b->p[i] >= 32 && b->p[i] < 127 ? (char)b->p[i] : '.';
        }
    }
    out[k] = '\0';
}

static const char *const kit_fates[] = {"forward", "rewrite", "answer", "hold", "cut"};

/* Own command groups, one line each: when, how many, and their bytes. */
static void kit_say_own(struct kit_text *t, const struct resp_own *own, size_t n_own)
{
    for (size_t i = 0; i < n_own; i++) {
        char bytes[2048];
        kit_bytes_text(&own[i].cmds, bytes, sizeof(bytes));
        kit_say(t, "own ms=%u n=%zu %s", own[i].ms, own[i].n, bytes);
    }
}

/* A command's plan, one line: its fate, bytes, hold, cut, reply tag and own commands. */
static void kit_say_cmd_plan(struct kit_text *t, const struct resp_cmd_plan *p)
{
    char bytes[512];
    kit_bytes_text(&p->bytes, bytes, sizeof(bytes));
    kit_say(t, "plan %s bytes=%s hold=%u cut=%s reply=%u own=%zu", kit_fates[p->fate], bytes,
            p->hold_ms, p->cut != NULL ? ((const struct kit_rule *)p->cut)->name : "-",
            p->reply.kind, p->n_own);
    kit_say_own(t, p->own, p->n_own);
}

static void kit_say_reply_plan(struct kit_text *t, const struct resp_reply_plan *p)
{
    char bytes[512];
    kit_bytes_text(&p->bytes, bytes, sizeof(bytes));
    kit_say(t, "reply replace=%d bytes=%s delay=%u cut=%s%s own=%zu", p->replace, bytes,
            p->delay_ms, p->cut != NULL ? ((const struct kit_rule *)p->cut)->name : "-",
            p->cut_before ? " before" : "", p->n_own);
    kit_say_own(t, p->own, p->n_own);
}

/* ---- replaying a recorded session ---------------------------------------------------------- */

#define KIT_CMDS_MAX 4096u

/* One connection replayed through module fw: the plans it made are said into `plans`. */
struct kit_replay {
    const struct resp_framework *fw;
    struct fake_host *host;
    struct kit_text *plans;
    struct resp_pairing pairing;
    struct resp_cmd slots[KIT_CMDS_MAX];
    struct resp_reply_tag tags[KIT_CMDS_MAX]; /* by the command's pairing tag */
    size_t ncmds;
    bool in_tx;
    struct resp_tx_plan tx; /* the transaction's plan, its tags taken as its commands go */
    size_t tx_next;
};

/* A transaction's plan, said: each queued command kept back (with its answer) or read. */
static void kit_say_tx_plan(struct kit_text *t, int rc, const struct resp_tx_plan *p)
{
    kit_say(t, "tx rc=%d n=%zu own=%zu after_exec=%zu cut_before=%s cut_after=%s hold=%u", rc, p->n,
            p->n_own, p->after_exec.n,
            p->cut_before != NULL ? ((const struct kit_rule *)p->cut_before)->name : "-",
            p->cut_after != NULL ? ((const struct kit_rule *)p->cut_after)->name : "-",
            p->hold ? p->hold_ms : 0);
    for (size_t i = 0; i < p->n; i++) {
        char bytes[512];
        kit_bytes_text(&p->cmds[i].answer, bytes, sizeof(bytes));
        if (p->cmds[i].keep_back || p->cmds[i].tag.kind != 0 || p->cmds[i].reply_add != 0)
            kit_say(t, "queued %zu keep_back=%d answer=%s add=%lld tag=%u", i, p->cmds[i].keep_back,
                    bytes, (long long)p->cmds[i].reply_add, p->cmds[i].tag.kind);
    }
    kit_say_own(t, p->own, p->n_own);
    if (p->after_exec.n > 0) {
        char bytes[2048];
        kit_bytes_text(&p->after_exec.cmds, bytes, sizeof(bytes));
        kit_say(t, "after_exec n=%zu %s", p->after_exec.n, bytes);
    }
}

static void kit_replay_reply(struct kit_replay *r, const uint8_t *buf, const struct resp_msg *m)
{
    struct resp_match match;
    int rc = resp_pairing_reply(&r->pairing, m, buf, &match);
    assert_true(rc >= 0);
    if (rc != 1)
        return;
    struct resp_reply_tag *tag = &r->tags[match.cmd.tag];
    if (match.ntx > 0) {
        struct resp_args it;
        struct resp_view v;
        resp_args_init(&it, buf, m);
        for (size_t i = 0; i < match.ntx && resp_args_next(&it, &v) == 1; i++) {
            const struct resp_cmd *c = resp_pairing_tx(&r->pairing, i);
            if (c == NULL)
                continue;
            struct resp_reply_tag *qt = &r->tags[c->tag];
            if (qt->kind != 0)
                r->fw->element(&r->host->h, qt, buf, &v);
            resp_framework_free_tag(r->fw, qt);
        }
    }
    if (tag->kind == 0 || !match.last || match.queued)
        return;
    struct resp_reply_plan p;
    memset(&p, 0, sizeof(p));
    r->fw->reply(&r->host->h, tag, buf, m, &p);
    kit_say_reply_plan(r->plans, &p);
    resp_reply_plan_free(&p);
    resp_framework_free_tag(r->fw, tag);
}

/* One command; rest bytes of the client's stream follow it (a transaction is planned whole). */
static void kit_replay_command(struct kit_replay *r, const uint8_t *buf, const struct resp_msg *m,
                               size_t rest)
{
    struct rprof_cmdview cv;
    rprof_cmdview_init(&cv, buf, m, true);
    struct resp_reply_tag tag = {0};
    if (cv.id == RPROF_CMD_MULTI) {
        r->in_tx = true;
        resp_tx_plan_free(r->fw, &r->tx);
        r->tx_next = 0;
        if (r->fw->transaction != NULL) {
            int rc =
                r->fw->transaction(&r->host->h, buf, m->len + rest, m->len, RESP_MAX_BULK, &r->tx);
            kit_say_tx_plan(r->plans, rc, &r->tx);
        }
    } else if (cv.id == RPROF_CMD_EXEC || cv.id == RPROF_CMD_DISCARD) {
        r->in_tx = false;
    } else if (r->in_tx) {
        if (r->tx_next < r->tx.n) {
            tag = r->tx.cmds[r->tx_next].tag;
            r->tx.cmds[r->tx_next].tag = (struct resp_reply_tag){0};
        }
        r->tx_next++;
    } else {
        struct resp_cmd_plan p;
        memset(&p, 0, sizeof(p));
        if (r->fw->command(&r->host->h, &cv, false, &p) == 1) {
            kit_say_cmd_plan(r->plans, &p);
            tag = p.reply;
            p.reply = (struct resp_reply_tag){0};
        }
        resp_cmd_plan_free(&p);
    }
    assert_true(r->ncmds < KIT_CMDS_MAX);
    int rc = resp_pairing_command(&r->pairing, m, buf, r->ncmds, NULL);
    assert_true(rc == 0 || rc == 1);
    if (rc == 1)
        r->tags[r->ncmds++] = tag;
    else
        resp_framework_free_tag(r->fw, &tag);
}

/* Replays one connection: each command, then the replies to the commands sent so far (a
 * worker gets its job before it finishes it). */
static void kit_replay(const struct resp_framework *fw, struct fake_host *host,
                       struct kit_text *plans, const uint8_t *cli, size_t cn, const uint8_t *srv,
                       size_t sn)
{
    struct kit_replay *r = __real_calloc(1, sizeof(*r));
    assert_non_null(r);
    r->fw = fw;
    r->host = host;
    r->plans = plans;
    resp_pairing_init(&r->pairing, r->slots, KIT_CMDS_MAX);
    struct resp_scanner cs, ss;
    resp_scanner_init(&cs, RESP_SIDE_CLIENT);
    resp_scanner_init(&ss, RESP_SIDE_SERVER);
    size_t co = 0, so = 0;
    while (co < cn || so < sn) {
        struct resp_msg m;
        if (co < cn && resp_scan(&cs, cli + co, cn - co, &m) == 1) {
            kit_replay_command(r, cli + co, &m, cn - co - m.len);
            co += m.len;
        } else {
            co = cn;
        }
        while (so < sn && r->pairing.count > r->pairing.kept &&
               resp_scan(&ss, srv + so, sn - so, &m) == 1) {
            kit_replay_reply(r, srv + so, &m);
            so += m.len;
        }
        if (co >= cn && r->pairing.count <= r->pairing.kept)
            break;
        if (co >= cn && so < sn && resp_scan(&ss, srv + so, sn - so, &m) != 1)
            break;
    }
    for (size_t i = 0; i < r->ncmds; i++)
        resp_framework_free_tag(fw, &r->tags[i]);
    resp_tx_plan_free(fw, &r->tx);
    __real_free(r);
}

/* The bytes of tests/unit/data/frameworks/<fw>/<name>, NUL-terminated (free with kit_free),
 * NULL when absent. */
static uint8_t *kit_data(const char *fw, const char *name, size_t *len)
{
    return kit_golden_maybe(len, "frameworks/%s/%s", fw, name);
}

/* Replays every recorded connection of framework `name` (NN-client.bin with NN-server.bin). */
static void kit_replay_all(const struct resp_framework *fw, const char *name,
                           struct fake_host *host, struct kit_text *plans)
{
    for (int i = 1; i < 100; i++) {
        char cn[32], sn[32];
        snprintf(cn, sizeof(cn), "%02d-client.bin", i);
        snprintf(sn, sizeof(sn), "%02d-server.bin", i);
        size_t cl = 0, sl = 0;
        uint8_t *c = kit_data(name, cn, &cl), *s = kit_data(name, sn, &sl);
        if (c == NULL || s == NULL) {
            __real_free(c);
            __real_free(s);
            break;
        }
        kit_replay(fw, host, plans, c, cl, s, sl);
        __real_free(c);
        __real_free(s);
    }
}

#pragma GCC diagnostic pop

#endif
