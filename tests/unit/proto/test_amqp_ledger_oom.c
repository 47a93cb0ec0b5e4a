/*
 * test_amqp_ledger_oom.c - the AMQP delivery-tag and publisher-confirm ledger
 * (proto/amqp/amqp_ledger.h) with an allocation failure at every allocation of a faulted
 * message's path.
 *
 * Each scenario is one channel's life through the ledger: deliveries, client settlements with
 * every verdict (PASS, REQUEUE, HOLD, DROP) on single and `multiple` frames that span held,
 * dropped and twice-settled tags, twice's own rejects, releases, publishes in confirm mode
 * (dropped, copied), the broker's confirms with dropped ones, and the channel's close.  It runs
 * once with its first allocation failing, once with its second, and so on (tests/lib/failing.h),
 * then with none failing.  The call whose allocation failed must return AMQP_LEDGER_E_NOMEM
 * and leave everything a caller can observe as it was (counts, held and kept tags, every tag's
 * info and whether twice may settle it, every publish's client number); a plan whose begin
 * failed cannot be committed; nothing leaks (the failing allocator's tracking, and the infos
 * the ledger must free).  The call is then made again, succeeds, and the rest of the scenario
 * must produce byte for byte what a run without a failure produces (frames, return codes,
 * plans, states).  A publish that cannot be recorded is the documented exception: it is
 * numbered anyway, and its caller closes the channel.
 *
 * Then a differential run: random operations on two ledgers, one whose allocations fail at
 * random (the failed call retried, as above), one without failures; after every operation
 * both must agree.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "tests/lib/failalloc.h"

#include "proto/amqp/amqp_ledger.h"

#define CHANNEL 3u
#define FRAME_LEN AMQP_LEDGER_FRAME_LEN
/* Tags and broker publish numbers a scenario uses at most (what a snapshot looks at). */
#define OOM_MAX_KEYS 400u
#define OOM_OUT_CAP (FRAME_LEN * (OOM_MAX_KEYS + 2))
/* Infos handed to the ledgers, reused once freed. */
#define OOM_POOL 4096u
/* Bytes of one run's transcript. */
#define OOM_TRANSCRIPT_CAP (1u << 20)
/* Random operations of the differential run, per seed. */
#define OOM_RANDOM_STEPS 20000u

/* ---- infos: a pool, so that the test's own bookkeeping allocates nothing ----------------- */

struct tinfo {
    uint64_t key; /* the tag or client publish number it was made for */
    bool alive;
};

static struct tinfo pool[OOM_POOL];
static size_t pool_next, pool_live;

static void *info_take(uint64_t key)
{
    for (size_t k = 0; k < OOM_POOL; k++) {
        struct tinfo *t = &pool[(pool_next + k) % OOM_POOL];
        if (!t->alive) {
            pool_next = (size_t)(t - pool) + 1;
            t->key = key;
            t->alive = true;
            pool_live++;
            return t;
        }
    }
    fail_msg("info pool exhausted");
    return NULL;
}

static void info_free(void *p)
{
    struct tinfo *t = p;
    assert_true(t->alive); /* freed once */
    t->alive = false;
    pool_live--;
}

static uint64_t info_key(const void *p)
{
    return p == NULL ? 0 : ((const struct tinfo *)p)->key;
}

/* ---- what a caller can observe of a ledger ------------------------------------------------ */

struct snap {
    struct amqp_ledger_counts counts;
    size_t outstanding;
    bool confirm_mode;
    size_t n_held;
    uint64_t held[OOM_MAX_KEYS];
    size_t n_kept;
    uint64_t kept[OOM_MAX_KEYS]; /* tag << 1 | held */
    uint64_t tag_info[OOM_MAX_KEYS + 1];
    bool settleable[OOM_MAX_KEYS + 1];
    uint64_t client_seq[OOM_MAX_KEYS + 1];
    uint64_t pub_info[OOM_MAX_KEYS + 1];
};

static void note_kept(void *arg, uint64_t tag, void *info, bool held)
{
    (void)info;
    struct snap *s = arg;
    if (s->n_kept < OOM_MAX_KEYS)
        s->kept[s->n_kept++] = tag << 1 | held;
}

static void snap_take(const struct amqp_ledger *l, struct snap *s)
{
    memset(s, 0, sizeof(*s));
    amqp_ledger_counts(l, &s->counts);
    s->outstanding = amqp_ledger_outstanding(l);
    s->confirm_mode = amqp_ledger_in_confirm_mode(l);
    s->n_held = amqp_ledger_held(l, s->held, OOM_MAX_KEYS);
    amqp_ledger_each_kept(l, note_kept, s);
    for (uint64_t k = 1; k <= OOM_MAX_KEYS; k++) {
        s->tag_info[k] = info_key(amqp_ledger_info(l, k));
        s->settleable[k] = amqp_ledger_twice_settleable(l, k);
        void *info = NULL;
        s->client_seq[k] = amqp_ledger_confirm_seq(l, k, &info);
        s->pub_info[k] = info_key(info);
    }
}

static void snap_assert_equal(const struct snap *a, const struct snap *b)
{
    assert_int_equal(a->counts.client_unsettled, b->counts.client_unsettled);
    assert_int_equal(a->counts.held, b->counts.held);
    assert_int_equal(a->counts.dropped, b->counts.dropped);
    assert_int_equal(a->counts.unconfirmed, b->counts.unconfirmed);
    assert_int_equal(a->outstanding, b->outstanding);
    assert_memory_equal(a, b, sizeof(*a));
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- one run: a ledger, the failure it met, what it produced ------------------------------ */

struct run {
    struct amqp_ledger *l;
    struct amqp_plan plan;
    uint8_t out[OOM_OUT_CAP];
    size_t len;
    uint64_t last_tag, client_seq;
    int nomem;       /* calls that returned AMQP_LEDGER_E_NOMEM */
    bool closed;     /* the run ended early, as its caller would (a publish not recorded) */
    uint8_t *script; /* transcript */
    size_t n_script;
    struct snap before; /* scratch */
    struct snap after;
};

static uint8_t transcript_ref[OOM_TRANSCRIPT_CAP];
static size_t n_transcript_ref;
static uint8_t transcript_run[OOM_TRANSCRIPT_CAP];
static struct run the_run;

static void script_put(struct run *r, const void *p, size_t n)
{
    if (n == 0)
        return;
    assert_true(r->n_script + n <= OOM_TRANSCRIPT_CAP);
    memcpy(r->script + r->n_script, p, n);
    r->n_script += n;
}

/* Records what one call produced: its result, frames, plan and the state after it. */
static void script_call(struct run *r, int rc, const uint8_t *out, size_t len)
{
    script_put(r, &rc, sizeof(rc));
    script_put(r, &len, sizeof(len));
    script_put(r, out, len);
    snap_take(r->l, &r->after);
    uint64_t h = fnv(0xcbf29ce484222325ull, &r->after, sizeof(r->after));
    script_put(r, &h, sizeof(h));
}

static void script_plan(struct run *r)
{
    const struct amqp_plan *p = &r->plan;
    uint64_t head[4] = {p->n, p->n_swallowed, p->unknown, p->multiple};
    script_put(r, head, sizeof(head));
    for (size_t i = 0; i < p->n; i++) {
        uint64_t t[2] = {p->tags[i].tag, info_key(p->tags[i].info)};
        script_put(r, t, sizeof(t));
    }
}

/* Before a call that may allocate: the state to compare with if it fails. */
static void call_begin(struct run *r)
{
    snap_take(r->l, &r->before);
    memset(r->out, 0xA5, sizeof(r->out));
}

/* After it: true when it returned AMQP_LEDGER_E_NOMEM, which must be because the armed
 * allocation failed in it, leaving the ledger as it was and no frame written. */
static bool call_nomem(struct run *r, bool fired_before, int rc)
{
    if (!fired_before && kit_failed())
        assert_int_equal(rc, AMQP_LEDGER_E_NOMEM);
    if (rc != AMQP_LEDGER_E_NOMEM)
        return false;
    assert_false(fired_before);
    assert_true(kit_failed());
    r->nomem++;
    snap_take(r->l, &r->after);
    snap_assert_equal(&r->before, &r->after);
    for (size_t i = 0; i < sizeof(r->out); i++)
        assert_int_equal(r->out[i], 0xA5);
    return true;
}

/* ---- calls, each retried once after an allocation failure --------------------------------- */

static void do_deliver(struct run *r, uint64_t tag)
{
    bool fired = kit_failed();
    call_begin(r);
    void *info = info_take(tag);
    int rc = amqp_ledger_deliver(r->l, tag, info);
    if (call_nomem(r, fired, rc)) {
        assert_false(((struct tinfo *)info)->alive); /* the ledger took it, and freed it */
        rc = amqp_ledger_deliver(r->l, tag, info_take(tag));
    }
    assert_int_equal(rc, AMQP_LEDGER_OK);
    r->last_tag = tag;
    script_call(r, rc, NULL, 0);
}

static void do_deliver_range(struct run *r, uint64_t from, uint64_t to)
{
    for (uint64_t t = from; t <= to; t++)
        do_deliver(r, t);
}

static void do_settle_begin(struct run *r, enum amqp_settle_kind kind, uint64_t tag, bool multiple,
                            bool requeue)
{
    bool fired = kit_failed();
    call_begin(r);
    int rc = amqp_ledger_settle_begin(r->l, kind, tag, multiple, requeue, &r->plan);
    if (call_nomem(r, fired, rc)) {
        /* A plan whose begin failed cannot be committed. */
        size_t len = 7;
        assert_int_equal(
            amqp_ledger_settle_commit(r->l, CHANNEL, &r->plan, r->out, sizeof(r->out), &len),
            AMQP_LEDGER_E_STALE);
        assert_int_equal(len, 7);
        rc = amqp_ledger_settle_begin(r->l, kind, tag, multiple, requeue, &r->plan);
    }
    assert_int_equal(rc, AMQP_LEDGER_OK);
    script_plan(r);
}

static int do_settle_commit(struct run *r)
{
    r->len = 0;
    int rc = amqp_ledger_settle_commit(r->l, CHANNEL, &r->plan, r->out, sizeof(r->out), &r->len);
    assert_true(rc >= 0);
    script_call(r, rc, r->out, r->len);
    return rc;
}

/* A client's frame with one verdict for every tag it settles (`every` 0), or for every
 * `every`-th, PASS for the others. */
static int do_settle(struct run *r, enum amqp_settle_kind kind, uint64_t tag, bool multiple,
                     bool requeue, enum amqp_verdict v, size_t every)
{
    do_settle_begin(r, kind, tag, multiple, requeue);
    for (size_t i = 0; i < r->plan.n; i++)
        if (every == 0 || i % every == 0)
            r->plan.tags[i].verdict = v;
    return do_settle_commit(r);
}

static void do_twice_settle(struct run *r, uint64_t tag)
{
    int rc = amqp_ledger_twice_settle(r->l, CHANNEL, tag, true, r->out, sizeof(r->out));
    assert_true(rc >= 0);
    script_call(r, rc, r->out, (size_t)rc);
}

static void do_release(struct run *r, uint64_t tag)
{
    int rc = amqp_ledger_release(r->l, CHANNEL, tag, r->out, sizeof(r->out));
    assert_true(rc >= 0);
    script_call(r, rc, r->out, (size_t)rc);
}

/* The channel closes: nothing recorded, every info freed, numbering from 1 again. */
static void do_reset(struct run *r)
{
    amqp_ledger_reset(r->l);
    struct amqp_ledger_counts c;
    amqp_ledger_counts(r->l, &c);
    assert_int_equal(c.client_unsettled + c.held + c.dropped + c.unconfirmed, 0);
    assert_int_equal(pool_live, 0);
    r->last_tag = r->client_seq = 0;
    script_call(r, 0, NULL, 0);
}

/* After a publish or a copy: true when recorded.  When not (its allocation failed), nothing
 * else changed that a caller can see, and the channel is closed, as a caller does. */
static bool publish_done(struct run *r, bool fired_before, int rc)
{
    if (!fired_before && kit_failed())
        assert_int_equal(rc, AMQP_LEDGER_E_NOMEM);
    if (rc == AMQP_LEDGER_E_NOMEM) {
        snap_take(r->l, &r->after);
        snap_assert_equal(&r->before, &r->after);
        r->nomem++;
        r->closed = true;
        do_reset(r);
        return false;
    }
    assert_int_equal(rc, AMQP_LEDGER_OK);
    script_call(r, rc, NULL, 0);
    return true;
}

/* A publish in confirm mode; false when it could not be recorded (the documented result: it
 * is numbered all the same, its info freed, nothing recorded), and the channel was closed. */
static bool do_publish(struct run *r, bool dropped)
{
    bool fired = kit_failed();
    call_begin(r);
    uint64_t seq = 0;
    void *info = info_take(r->client_seq + 1);
    int rc = amqp_ledger_publish(r->l, dropped, info, &seq);
    assert_int_equal(seq, ++r->client_seq);
    if (rc == AMQP_LEDGER_E_NOMEM) {
        assert_false(dropped); /* a dropped publish records nothing */
        assert_false(((struct tinfo *)info)->alive);
    }
    return publish_done(r, fired, rc);
}

/* twice's copy of the publish recorded last; false as for do_publish. */
static bool do_publish_copy(struct run *r)
{
    bool fired = kit_failed();
    call_begin(r);
    return publish_done(r, fired, amqp_ledger_publish_copy(r->l));
}

/* The broker's confirm; the plan's `drop_every`-th confirm dropped (0: none). */
static int do_confirm(struct run *r, bool nack, uint64_t seq, bool multiple, size_t drop_every)
{
    bool fired = kit_failed();
    call_begin(r);
    int rc = amqp_ledger_confirm_begin(r->l, nack, seq, multiple, &r->plan);
    if (call_nomem(r, fired, rc)) {
        size_t len = 7;
        assert_int_equal(
            amqp_ledger_confirm_commit(r->l, CHANNEL, &r->plan, r->out, sizeof(r->out), &len),
            AMQP_LEDGER_E_STALE);
        assert_int_equal(len, 7);
        rc = amqp_ledger_confirm_begin(r->l, nack, seq, multiple, &r->plan);
    }
    assert_int_equal(rc, AMQP_LEDGER_OK);
    script_plan(r);
    for (size_t i = 0; drop_every != 0 && i < r->plan.n; i += drop_every)
        r->plan.tags[i].verdict = AMQP_V_DROP;
    r->len = 0;
    rc = amqp_ledger_confirm_commit(r->l, CHANNEL, &r->plan, r->out, sizeof(r->out), &r->len);
    assert_true(rc >= 0);
    script_call(r, rc, r->out, r->len);
    return rc;
}

/* ---- the runs ----------------------------------------------------------------------------- */

typedef void (*oom_scenario)(struct run *r, long arg);

struct oom_case {
    oom_scenario fn;
    long arg;
};

/* One run of a scenario: a new ledger (its own allocation may fail: NULL, retried), the
 * scenario, the ledger freed; every info freed, and what it produced compared with the run
 * without a failure (unless it ended early, as a caller would). */
static void oom_run(struct oom_case *c, uint8_t *script)
{
    struct run *r = &the_run;
    memset(r, 0, offsetof(struct run, before));
    r->script = script;
    memset(pool, 0, sizeof(pool));
    pool_next = pool_live = 0;
    bool fired = kit_failed();
    r->l = amqp_ledger_new(info_free);
    if (r->l == NULL) {
        assert_true(!fired && kit_failed());
        r->nomem++;
        r->l = amqp_ledger_new(info_free);
    }
    assert_non_null(r->l);
    c->fn(r, c->arg);
    amqp_ledger_free(r->l);
    assert_int_equal(pool_live, 0);
    assert_true(r->nomem <= 1);
}

static void oom_body(void *ctx, long nth)
{
    (void)nth;
    oom_run(ctx, transcript_run);
    struct run *r = &the_run;
    if (kit_failed() && r->closed)
        return;
    if (kit_failed())
        assert_int_equal(r->nomem, 1);
    assert_int_equal(r->n_script, n_transcript_ref);
    assert_memory_equal(transcript_run, transcript_ref, n_transcript_ref);
}

/* Runs the scenario once without a failure (the reference), then with each allocation failing
 * in turn; returns how many allocations it makes. */
static long oom_every_allocation(oom_scenario fn, long arg)
{
    struct oom_case c = {fn, arg};
    oom_run(&c, transcript_ref);
    assert_int_equal(the_run.nomem, 0);
    n_transcript_ref = the_run.n_script;
    long n = kit_each_allocation_fails(&kit_wrap_hook, oom_body, &c);
    assert_true(n > 0);
    print_message("%ld allocations, each failed in turn\n", n);
    return n;
}

/* Deliveries 1..150, then client frames with verdict `v` on single and multiple settlements
 * that span held, dropped and twice-settled tags, twice's rejects, releases, a client error
 * on a held tag, tag-0 multiple, more deliveries, and the channel's close. */
static void scenario_settle(struct run *r, long arg)
{
    enum amqp_verdict v = (enum amqp_verdict)arg;
    do_deliver_range(r, 1, 150);
    /* Single frames: one of each verdict, then `v`. */
    do_settle(r, AMQP_SETTLE_ACK, 1, false, false, AMQP_V_PASS, 0);
    do_settle(r, AMQP_SETTLE_ACK, 2, false, false, AMQP_V_HOLD, 0);
    do_settle(r, AMQP_SETTLE_ACK, 3, false, false, AMQP_V_DROP, 0);
    do_settle(r, AMQP_SETTLE_NACK, 4, false, true, AMQP_V_REQUEUE, 0);
    do_twice_settle(r, 5);
    do_twice_settle(r, 6);
    do_settle(r, AMQP_SETTLE_REJECT, 7, false, false, v, 0);
    do_settle(r, AMQP_SETTLE_ACK, 5, false, false, v, 0); /* twice-settled: swallowed */
    /* A multiple spanning held 2, dropped 3, twice-settled 6 and 7's fate: its plan needs more
     * than the first scratch (64 tags). */
    do_settle(r, AMQP_SETTLE_ACK, 100, true, false, v, 0);
    /* Another, with every third tag given `v`, the others passed. */
    do_twice_settle(r, 120);
    do_settle(r, AMQP_SETTLE_NACK, 140, true, true, v, 3);
    /* The client settles 2 again (held, or settled): an error the broker must see. */
    do_settle(r, AMQP_SETTLE_ACK, 2, false, false, AMQP_V_PASS, 0);
    /* What twice keeps, let go. */
    for (uint64_t t = 1; t <= 150; t++) {
        do_release(r, t);
        do_twice_settle(r, t);
    }
    do_deliver_range(r, 151, 380);
    do_settle(r, AMQP_SETTLE_ACK, 0, true, false, v, 2);
    do_settle(r, AMQP_SETTLE_ACK, 0, true, false, AMQP_V_PASS, 0);
    do_reset(r);
    do_deliver_range(r, 1, 70);
    do_settle(r, AMQP_SETTLE_ACK, 70, true, false, v, 0);
}

static void test_settle_pass(void **state)
{
    (void)state;
    assert_true(oom_every_allocation(scenario_settle, AMQP_V_PASS) >= 5);
}

static void test_settle_requeue(void **state)
{
    (void)state;
    assert_true(oom_every_allocation(scenario_settle, AMQP_V_REQUEUE) >= 5);
}

static void test_settle_hold(void **state)
{
    (void)state;
    assert_true(oom_every_allocation(scenario_settle, AMQP_V_HOLD) >= 5);
}

static void test_settle_drop(void **state)
{
    (void)state;
    assert_true(oom_every_allocation(scenario_settle, AMQP_V_DROP) >= 5);
}

/* Confirm mode: publishes (every 10th dropped, copies behind some), the broker's single
 * and multiple acks and nacks with confirms dropped (every `arg`-th of a plan, 0: none), an
 * unknown confirm, and the channel's close. */
static void scenario_confirm(struct run *r, long arg)
{
    size_t drop_every = (size_t)arg;
    amqp_ledger_confirm_mode(r->l);
    uint64_t broker_seq = 0;
    for (int i = 1; i <= 200; i++) {
        bool dropped = i % 10 == 0;
        if (!do_publish(r, dropped))
            return;
        broker_seq += !dropped;
        /* Copies of every 25th, and of the publish that fills the array: the copy makes it
         * grow. */
        if (!dropped && (i % 25 == 0 || broker_seq % 64 == 0)) {
            if (!do_publish_copy(r))
                return;
            broker_seq++;
        }
    }
    do_confirm(r, false, 1, false, drop_every);
    do_confirm(r, true, 2, false, drop_every);
    do_confirm(r, false, 100, true, drop_every);
    do_confirm(r, false, 100, false, drop_every); /* confirmed already: unknown */
    do_confirm(r, true, 150, true, drop_every);
    do_confirm(r, false, broker_seq, true, drop_every);
    do_confirm(r, false, broker_seq + 5, true, drop_every); /* beyond the last publish */
    do_reset(r);
    amqp_ledger_confirm_mode(r->l);
    for (int i = 1; i <= 70; i++)
        if (!do_publish(r, false))
            return;
    do_confirm(r, false, 70, true, drop_every);
}

static void test_confirm(void **state)
{
    (void)state;
    assert_true(oom_every_allocation(scenario_confirm, 0) >= 3);
}

static void test_confirm_dropped(void **state)
{
    (void)state;
    assert_true(oom_every_allocation(scenario_confirm, 4) >= 3);
}

/* ---- the differential run ----------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

/* One random operation, made on both ledgers: `a` may meet an allocation failure (armed with a
 * chance of 1 in 2 before each call), `b` never does.  A settle or confirm plan gets the same
 * random verdicts on both. */
struct diff {
    struct amqp_ledger *l[2];
    uint64_t rng;
    uint64_t last_tag, client_seq;
    struct amqp_plan plan[2];
    uint8_t out[2][OOM_OUT_CAP];
    size_t len[2];
    struct snap s[2];
    long failures;
};

static void diff_arm(struct diff *d)
{
    kit_arm(rng_below(&d->rng, 2) == 0 ? 1 : 0);
}

static void diff_compare(struct diff *d)
{
    snap_take(d->l[0], &d->s[0]);
    snap_take(d->l[1], &d->s[1]);
    snap_assert_equal(&d->s[0], &d->s[1]);
}

/* The channel closes; one time in two the ledgers are made anew (a new channel), so that
 * their arrays grow, and allocate, again. */
static void diff_reset(struct diff *d)
{
    bool renew = rng_below(&d->rng, 2) == 0;
    for (int k = 0; k < 2; k++) {
        if (!renew) {
            amqp_ledger_reset(d->l[k]);
            continue;
        }
        amqp_ledger_free(d->l[k]);
        if (k == 0)
            diff_arm(d);
        d->l[k] = amqp_ledger_new(info_free);
        if (k == 0 && kit_alloc.failed) {
            assert_null(d->l[k]);
            d->failures++;
            (void)kit_disarm();
            d->l[k] = amqp_ledger_new(info_free);
        }
        (void)kit_disarm();
        assert_non_null(d->l[k]);
    }
    d->last_tag = d->client_seq = 0;
}

/* Runs `call` on ledger a armed, retrying once (disarmed) after AMQP_LEDGER_E_NOMEM, which must
 * change nothing; then on b.  Returns a's result, which must be b's. */
#define DIFF_CALL(d, rc, call_k)                                                                   \
    do {                                                                                           \
        int k = 0;                                                                                 \
        snap_take((d)->l[0], &(d)->s[0]);                                                          \
        diff_arm(d);                                                                               \
        int rc0 = (call_k);                                                                        \
        bool fired = kit_alloc.failed;                                                             \
        (void)kit_disarm();                                                                        \
        if (fired) {                                                                               \
            assert_int_equal(rc0, AMQP_LEDGER_E_NOMEM);                                            \
            snap_take((d)->l[0], &(d)->s[1]);                                                      \
            snap_assert_equal(&(d)->s[0], &(d)->s[1]);                                             \
            (d)->failures++;                                                                       \
            rc0 = (call_k);                                                                        \
        }                                                                                          \
        k = 1;                                                                                     \
        int rc1 = (call_k);                                                                        \
        assert_int_equal(rc0, rc1);                                                                \
        (rc) = rc0;                                                                                \
    } while (0)

/* Both ledgers wrote the same frames. */
static void diff_same_out(const struct diff *d)
{
    assert_int_equal(d->len[0], d->len[1]);
    assert_memory_equal(d->out[0], d->out[1], d->len[0]);
}

/* Both plans (the same tags, the same verdicts) committed: the same frames. */
static void diff_commit(struct diff *d, bool confirm)
{
    assert_int_equal(d->plan[0].n, d->plan[1].n);
    for (int k = 0; k < 2; k++) {
        d->len[k] = 0;
        int rc = confirm ? amqp_ledger_confirm_commit(d->l[k], CHANNEL, &d->plan[k], d->out[k],
                                                      OOM_OUT_CAP, &d->len[k])
                         : amqp_ledger_settle_commit(d->l[k], CHANNEL, &d->plan[k], d->out[k],
                                                     OOM_OUT_CAP, &d->len[k]);
        assert_true(rc >= 0);
    }
    diff_same_out(d);
}

static void diff_settle(struct diff *d)
{
    static const enum amqp_settle_kind kinds[] = {AMQP_SETTLE_ACK, AMQP_SETTLE_NACK,
                                                  AMQP_SETTLE_REJECT};
    enum amqp_settle_kind kind = kinds[rng_below(&d->rng, 3)];
    uint64_t tag = rng_below(&d->rng, d->last_tag + 2);
    bool multiple = rng_below(&d->rng, 3) == 0;
    bool requeue = rng_below(&d->rng, 2) == 0;
    int rc;
    DIFF_CALL(d, rc, amqp_ledger_settle_begin(d->l[k], kind, tag, multiple, requeue, &d->plan[k]));
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < d->plan[0].n; i++) {
        enum amqp_verdict v = (enum amqp_verdict)rng_below(&d->rng, 4);
        if (rng_below(&d->rng, 2) == 0)
            v = AMQP_V_PASS;
        d->plan[0].tags[i].verdict = d->plan[1].tags[i].verdict = v;
    }
    diff_commit(d, false);
}

static void diff_confirm(struct diff *d)
{
    bool nack = rng_below(&d->rng, 4) == 0;
    uint64_t seq = 1 + rng_below(&d->rng, d->client_seq + 2);
    bool multiple = rng_below(&d->rng, 2) == 0;
    int rc;
    DIFF_CALL(d, rc, amqp_ledger_confirm_begin(d->l[k], nack, seq, multiple, &d->plan[k]));
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < d->plan[0].n; i++) {
        enum amqp_verdict v = rng_below(&d->rng, 5) == 0 ? AMQP_V_DROP : AMQP_V_PASS;
        d->plan[0].tags[i].verdict = d->plan[1].tags[i].verdict = v;
    }
    diff_commit(d, true);
}

/* A publish (or a copy) whose recording failed: numbered all the same, so the ledgers part;
 * the channel closes, as a caller does. */
static void diff_publish(struct diff *d)
{
    bool copy = d->client_seq > 0 && rng_below(&d->rng, 10) == 0;
    bool dropped = rng_below(&d->rng, 10) == 0;
    bool numbered = !copy && amqp_ledger_in_confirm_mode(d->l[1]);
    int rc[2];
    uint64_t seq[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (k == 0)
            diff_arm(d);
        rc[k] = copy ? amqp_ledger_publish_copy(d->l[k])
                     : amqp_ledger_publish(d->l[k], dropped, info_take(d->client_seq + 1), &seq[k]);
        if (k == 0)
            (void)kit_disarm();
        assert_int_equal(seq[k], numbered ? d->client_seq + 1 : 0);
    }
    assert_int_equal(rc[1], 0);
    d->client_seq += numbered;
    if (rc[0] == AMQP_LEDGER_E_NOMEM) {
        d->failures++;
        diff_reset(d);
        for (int k = 0; k < 2; k++)
            amqp_ledger_confirm_mode(d->l[k]);
    }
}

static void diff_step(struct diff *d)
{
    uint64_t op = rng_below(&d->rng, 100);
    int rc;
    if (d->last_tag >= OOM_MAX_KEYS - 8 || d->client_seq >= OOM_MAX_KEYS - 8 || op < 1) {
        diff_reset(d);
    } else if (op < 2) {
        for (int k = 0; k < 2; k++)
            amqp_ledger_recover(d->l[k]);
    } else if (op < 30) {
        uint64_t tag = d->last_tag + 1 + rng_below(&d->rng, 3);
        DIFF_CALL(d, rc, amqp_ledger_deliver(d->l[k], tag, info_take(tag)));
        assert_int_equal(rc, 0);
        d->last_tag = tag;
    } else if (op < 55) {
        diff_settle(d);
    } else if (op < 66) {
        uint64_t tag = 1 + rng_below(&d->rng, d->last_tag + 1);
        bool release = op >= 62;
        for (int k = 0; k < 2; k++) {
            rc = release ? amqp_ledger_release(d->l[k], CHANNEL, tag, d->out[k], OOM_OUT_CAP)
                         : amqp_ledger_twice_settle(d->l[k], CHANNEL, tag, true, d->out[k],
                                                    OOM_OUT_CAP);
            assert_true(rc >= 0);
            d->len[k] = (size_t)rc;
        }
        diff_same_out(d);
    } else if (op < 67) {
        for (int k = 0; k < 2; k++)
            amqp_ledger_confirm_mode(d->l[k]);
    } else if (op < 85) {
        diff_publish(d);
    } else {
        diff_confirm(d);
    }
    diff_compare(d);
}

static struct diff the_diff;

/* Random operations on a ledger whose allocations fail at random, and on one whose never do:
 * after every operation (a failed call retried) they agree. */
static void test_random_failures_change_nothing(void **state)
{
    (void)state;
    static const uint64_t seeds[] = {1, 7, 42, 0xC0FFEE};
    long failures = 0;
    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        struct diff *d = &the_diff;
        memset(d, 0, offsetof(struct diff, plan));
        memset(pool, 0, sizeof(pool));
        pool_next = pool_live = 0;
        d->rng = seeds[s];
        for (int k = 0; k < 2; k++) {
            d->l[k] = amqp_ledger_new(info_free);
            assert_non_null(d->l[k]);
        }
        for (unsigned i = 0; i < OOM_RANDOM_STEPS; i++)
            diff_step(d);
        for (int k = 0; k < 2; k++)
            amqp_ledger_free(d->l[k]);
        assert_int_equal(pool_live, 0);
        failures += d->failures;
    }
    /* Allocations are rare (arrays double): still, some must have failed. */
    print_message("%ld calls met an allocation failure\n", failures);
    assert_true(failures > 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settle_pass),
        cmocka_unit_test(test_settle_requeue),
        cmocka_unit_test(test_settle_hold),
        cmocka_unit_test(test_settle_drop),
        cmocka_unit_test(test_confirm),
        cmocka_unit_test(test_confirm_dropped),
        cmocka_unit_test(test_random_failures_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
