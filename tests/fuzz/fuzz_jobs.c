/*
 * fuzz_jobs.c - libFuzzer harness for the framework modules (proto/jobs/): a session's commands
 * and replies, as any peer may send them, through a module with faults decided from the input,
 * and the plans it makes checked.  Not part of the default build (scripts/fuzz.sh builds and
 * runs it).
 *
 * The first byte picks the framework (mod 6: Sidekiq, Celery, RQ, Streams, the list profile,
 * BullMQ); the rest is a sequence of steps: a control byte, then one RESP message (cut by the
 * scanner of its side).  Control bits: 0 the message is a reply (else a command); 1-3 the fault every
 * decision of the step gets (enum job_fault_kind, mod 7); 4 `decided`; 5 a cut is before the
 * frame; 6-7 which of the module's events a rule looks at (none, all, or half).  A reply is read
 * by the module when the oldest command that awaits one was tagged, as the host reads it.  A
 * MULTI's transaction (the commands of the steps after it, as far as EXEC) is planned whole, as
 * the host plans it, and every command is seen as it passes.  Seeds: the recorded sessions of
 * every framework in that form (tests/fuzz/corpus/jobs/, made by tests/fuzz/seed_jobs.py).
 *
 * Invariants, checked with abort(): a plan's fate is one of the five; an answer is one whole
 * reply and a rewrite one whole command; own commands are whole commands, as many as they say;
 * a replaced reply is one whole reply; a transaction's kept-back commands are answered by one
 * whole reply each; the job memory is held only between its lock and unlock
 * and never across another host call; every record's strings are NUL-terminated; and nothing
 * leaks (ASan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/jobs/framework.h"
#include "proto/resp/resp.h"

#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

/* ---- a small host --------------------------------------------------------------------------- */

#define FZ_MEMO 64u
#define FZ_SCRIPTS 32u

static const int fz_rule = 1; /* the one rule's handle */

static struct {
    struct job_fault fault; /* what every decision of the step gets */
    unsigned wants;         /* 0 none, 1 all, 2 half (by kind) */
    bool held;
    struct {
        char key[128];
        struct job_memo m;
        bool used;
    } memo[FZ_MEMO];
    struct {
        uint64_t hash;
        unsigned tag;
    } scripts[FZ_SCRIPTS];
    size_t n_scripts;
    uint64_t seq;
} fz;

static bool h_wants(void *ctx, enum job_ev k)
{
    (void)ctx;
    CHECK(!fz.held && k < JOB_EV_COUNT);
    return fz.wants == 1 || (fz.wants == 2 && k % 2 == 0);
}

static void h_count(void *ctx, enum job_ev k)
{
    (void)ctx;
    CHECK(!fz.held && k < JOB_EV_COUNT);
}

static void check_event(const struct job_event *ev)
{
    CHECK(ev->kind < JOB_EV_COUNT);
    const char *s[] = {ev->id, ev->task, ev->queue, ev->key, ev->run};
    for (size_t i = 0; i < 5; i++)
        CHECK(s[i] == NULL || strlen(s[i]) < (1u << 20));
}

static struct job_fault h_decide(void *ctx, const struct job_event *ev)
{
    CHECK(!fz.held);
    check_event(ev);
    if (!h_wants(ctx, ev->kind))
        return (struct job_fault){.kind = JOB_FAULT_NONE};
    return fz.fault;
}

static void h_note(void *ctx, const struct job_fault *f, const struct job_event *ev)
{
    (void)ctx;
    CHECK(!fz.held && f->rule == &fz_rule);
    check_event(ev);
}

static void h_record(void *ctx, enum job_rec rec, const struct job_event *ev)
{
    (void)ctx;
    CHECK(!fz.held && rec <= JOB_REC_RUNNING);
    check_event(ev);
}

static void h_log(void *ctx, enum job_log_level level, const char *msg, const char *fields)
{
    (void)ctx;
    CHECK(!fz.held && (level == JOB_LOG_INFO || level == JOB_LOG_WARN));
    CHECK(strlen(msg) > 0 && strlen(fields) < 4096);
}

static uint64_t h_next_seq(void *ctx)
{
    (void)ctx;
    return ++fz.seq;
}

static void h_too_long(void *ctx, const char *field, uint64_t len, size_t cap)
{
    (void)ctx;
    CHECK(!fz.held && strlen(field) > 0 && len + 1 >= cap);
}

static bool h_random(void *ctx, void *buf, size_t n)
{
    (void)ctx;
    memset(buf, (int)(fz.seq & 0xff), n);
    return fz.seq % 5 != 4;
}

static uint64_t h_wall_ms(void *ctx)
{
    (void)ctx;
    return 1700000000000ull + fz.seq;
}

static void h_lock(void *ctx)
{
    (void)ctx;
    CHECK(!fz.held);
    fz.held = true;
}

static void h_unlock(void *ctx)
{
    (void)ctx;
    CHECK(fz.held);
    fz.held = false;
}

static struct job_memo *h_get(void *ctx, const char *key, size_t n)
{
    (void)ctx;
    CHECK(fz.held);
    for (size_t i = 0; i < FZ_MEMO; i++)
        if (fz.memo[i].used && strlen(fz.memo[i].key) == n && memcmp(fz.memo[i].key, key, n) == 0)
            return &fz.memo[i].m;
    return NULL;
}

static struct job_memo *h_put(void *ctx, const char *key, size_t n)
{
    struct job_memo *m = h_get(ctx, key, n);
    for (size_t i = 0; m == NULL && i < FZ_MEMO; i++) {
        if (!fz.memo[i].used && n < sizeof(fz.memo[i].key)) {
            fz.memo[i].used = true;
            memcpy(fz.memo[i].key, key, n);
            fz.memo[i].key[n] = '\0';
            m = &fz.memo[i].m;
        }
    }
    return m;
}

static void memo_free(struct job_memo *m)
{
    free(m->task);
    free(m->queue);
    free(m->id);
    memset(m, 0, sizeof(*m));
}

static void h_del(void *ctx, const char *key, size_t n)
{
    (void)ctx;
    CHECK(fz.held);
    for (size_t i = 0; i < FZ_MEMO; i++) {
        if (fz.memo[i].used && strlen(fz.memo[i].key) == n &&
            memcmp(fz.memo[i].key, key, n) == 0) {
            memo_free(&fz.memo[i].m);
            fz.memo[i].used = false;
        }
    }
}

/* Scripts by a hash of their bodies (the real host uses SHA-1; an EVALSHA names a script here
 * by the hash's 16 hex digits padded to 40). */
static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void h_learn(void *ctx, const uint8_t *body, size_t n, unsigned tag)
{
    (void)ctx;
    CHECK(!fz.held && tag != 0);
    if (fz.n_scripts < FZ_SCRIPTS) {
        fz.scripts[fz.n_scripts].hash = fnv(body, n);
        fz.scripts[fz.n_scripts++].tag = tag;
    }
}

static unsigned h_tag(void *ctx, const uint8_t *sha, size_t n)
{
    (void)ctx;
    CHECK(!fz.held);
    char hex[17];
    if (n != 40)
        return 0;
    for (size_t i = 0; i < fz.n_scripts; i++) {
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)fz.scripts[i].hash);
        if (memcmp(hex, sha, 16) == 0)
            return fz.scripts[i].tag;
    }
    return 0;
}

static struct job_host host = {
    .ctx = NULL,
    .session = 9,
    .journal = true,
    .needed = true,
    .wants = h_wants,
    .count = h_count,
    .decide = h_decide,
    .decide_unnoted = h_decide,
    .note = h_note,
    .record = h_record,
    .log = h_log,
    .next_seq = h_next_seq,
    .too_long = h_too_long,
    .random = h_random,
    .wall_ms = h_wall_ms,
    .memo_lock = h_lock,
    .memo_unlock = h_unlock,
    .memo_get = h_get,
    .memo_put = h_put,
    .memo_del = h_del,
    .script_learn = h_learn,
    .script_tag = h_tag,
};

/* ---- plans ---------------------------------------------------------------------------------- */

/* bytes[0..n) is exactly k whole messages of a side. */
static bool whole(const uint8_t *p, size_t n, size_t k, enum resp_side side)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, side);
    size_t off = 0, got = 0;
    while (off < n) {
        struct resp_msg m;
        if (resp_scan(&sc, p + off, n - off, &m) != 1)
            return false;
        off += m.len;
        got++;
        resp_scanner_reset(&sc);
    }
    return got == k;
}

static void check_own(const struct resp_own *own, size_t n_own)
{
    CHECK(n_own <= RESP_PLAN_OWN_MAX);
    for (size_t i = 0; i < n_own; i++) {
        CHECK(!own[i].cmds.oom && own[i].n > 0);
        CHECK(whole(own[i].cmds.p, own[i].cmds.len, own[i].n, RESP_SIDE_CLIENT));
    }
}

static void check_cmd_plan(const struct resp_cmd_plan *p)
{
    CHECK(p->fate <= RESP_CMD_CUT);
    if (p->fate == RESP_CMD_ANSWER && !p->bytes.oom)
        CHECK(whole(p->bytes.p, p->bytes.len, 1, RESP_SIDE_SERVER));
    if (p->fate == RESP_CMD_REWRITE && !p->bytes.oom)
        CHECK(whole(p->bytes.p, p->bytes.len, 1, RESP_SIDE_CLIENT));
    if (p->fate == RESP_CMD_FORWARD || p->fate == RESP_CMD_HOLD || p->fate == RESP_CMD_CUT)
        CHECK(p->bytes.len == 0);
    if (p->fate == RESP_CMD_CUT)
        CHECK(p->cut == &fz_rule);
    check_own(p->own, p->n_own);
}

static void check_reply_plan(const struct resp_reply_plan *p)
{
    if (p->replace && !p->bytes.oom)
        CHECK(whole(p->bytes.p, p->bytes.len, 1, RESP_SIDE_SERVER));
    CHECK(p->cut == NULL || p->cut == &fz_rule);
    check_own(p->own, p->n_own);
}

/* ---- the session ------------------------------------------------------------------------------ */

#define FZ_PENDING 64u

static const enum rprof fz_profiles[] = {RPROF_SIDEKIQ, RPROF_CELERY, RPROF_RQ,
                                         RPROF_STREAMS, RPROF_LIST,   RPROF_BULLMQ};

static void check_tx_plan(const struct resp_tx_plan *p)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->cmds[i].keep_back && !p->cmds[i].answer.oom)
            CHECK(whole(p->cmds[i].answer.p, p->cmds[i].answer.len, 1, RESP_SIDE_SERVER));
    check_own(p->own, p->n_own);
    if (p->after_exec.n > 0)
        CHECK(whole(p->after_exec.cmds.p, p->after_exec.cmds.len, p->after_exec.n,
                    RESP_SIDE_CLIENT));
    CHECK(p->cut_before == NULL || p->cut_before == &fz_rule);
    CHECK(p->cut_after == NULL || p->cut_after == &fz_rule);
}

/* The transaction a MULTI (buf, its m.len bytes) opens: the commands of the steps after it in
 * data[off..size), as far as EXEC, made contiguous and planned. */
static void transaction(const struct resp_framework *fw, const uint8_t *buf,
                        const struct resp_msg *m, const uint8_t *data, size_t off, size_t size)
{
    if (fw->transaction == NULL)
        return;
    uint8_t *tx = malloc(size + m->len);
    CHECK(tx != NULL);
    memcpy(tx, buf, m->len);
    size_t len = m->len;
    struct resp_scanner sc;
    resp_scanner_init(&sc, RESP_SIDE_CLIENT);
    while (off + 1 < size) {
        bool reply = data[off++] & 1;
        struct resp_msg q;
        if (resp_scan(&sc, data + off, size - off, &q) != 1)
            break;
        resp_scanner_reset(&sc);
        if (!reply) {
            memcpy(tx + len, data + off, q.len);
            len += q.len;
        }
        off += q.len;
    }
    struct resp_tx_plan p;
    memset(&p, 0, sizeof(p));
    int rc = fw->transaction(&host, tx, len, m->len, RESP_MAX_BULK, &p);
    CHECK(rc >= -1 && rc <= 1);
    if (rc == 1)
        check_tx_plan(&p);
    resp_tx_plan_free(fw, &p);
    free(tx);
}
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const struct resp_framework *fw =
        resp_framework_of(fz_profiles[data[0] % (sizeof(fz_profiles) / sizeof(fz_profiles[0]))]);
    CHECK(fw != NULL);
    memset(&fz, 0, sizeof(fz));
    host.state = fw->open != NULL ? fw->open() : NULL;
    host.resp = (data[0] & 0x80) ? 3 : 2;
    struct resp_reply_tag pending[FZ_PENDING];
    size_t n_pending = 0;
    struct resp_scanner cs, ss;
    resp_scanner_init(&cs, RESP_SIDE_CLIENT);
    resp_scanner_init(&ss, RESP_SIDE_SERVER);
    size_t off = 1;
    while (off + 1 < size) {
        uint8_t c = data[off++];
        fz.fault = (struct job_fault){.kind = (enum job_fault_kind)((c >> 1 & 7) % 7),
                                      .ms = (uint32_t)c * 100,
                                      .before = (c & 0x20) != 0,
                                      .rule = &fz_rule};
        if (fz.fault.kind == JOB_FAULT_NONE)
            fz.fault.rule = NULL;
        fz.wants = (c >> 6) % 3;
        bool reply = c & 1;
        struct resp_msg m;
        struct resp_scanner *sc = reply ? &ss : &cs;
        if (resp_scan(sc, data + off, size - off, &m) != 1)
            break;
        const uint8_t *buf = data + off;
        off += m.len;
        resp_scanner_reset(sc);
        if (reply) {
            if (n_pending == 0)
                continue;
            struct resp_reply_tag tag = pending[0];
            memmove(pending, pending + 1, (--n_pending) * sizeof(pending[0]));
            struct resp_reply_plan p;
            memset(&p, 0, sizeof(p));
            fw->reply(&host, &tag, buf, &m, &p);
            check_reply_plan(&p);
            resp_reply_plan_free(&p);
            resp_framework_free_tag(fw, &tag);
            continue;
        }
        struct rprof_cmdview cv;
        rprof_cmdview_init(&cv, buf, &m, true);
        if (fw->seen != NULL)
            fw->seen(&host, &cv);
        if (cv.id == RPROF_CMD_MULTI)
            transaction(fw, buf, &m, data, off, size);
        struct resp_cmd_plan p;
        memset(&p, 0, sizeof(p));
        if (fw->command(&host, &cv, (c & 0x10) != 0, &p) == 1) {
            check_cmd_plan(&p);
            if (p.reply.kind != 0 && n_pending < FZ_PENDING &&
                (p.fate == RESP_CMD_FORWARD || p.fate == RESP_CMD_REWRITE)) {
                pending[n_pending++] = p.reply;
                p.reply = (struct resp_reply_tag){0};
            }
            resp_framework_free_tag(fw, &p.reply);
        } else {
            CHECK(p.fate == RESP_CMD_FORWARD && p.reply.kind == 0 && p.n_own == 0);
        }
        resp_cmd_plan_free(&p);
    }
    for (size_t i = 0; i < n_pending; i++)
        resp_framework_free_tag(fw, &pending[i]);
    for (size_t i = 0; i < FZ_MEMO; i++)
        memo_free(&fz.memo[i].m);
    if (fw->close != NULL && host.state != NULL)
        fw->close(host.state);
    host.state = NULL;
    return 0;
}
