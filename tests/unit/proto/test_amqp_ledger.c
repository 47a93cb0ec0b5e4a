/*
 * test_amqp_ledger.c - the AMQP delivery-tag and publisher-confirm ledger
 * (proto/amqp/amqp_ledger.h) checked against a model.
 *
 * Deliveries: a simulated RabbitMQ channel (tags 1, 2, 3... per channel,
 * collect_acks' rule: an unknown or already settled tag closes the channel
 * with 406) and a simulated client (the tags it believes outstanding), with
 * twice's ledger in between, driven by random interleavings under fixed
 * seeds: deliveries (some no-ack, so tags have gaps), client acks, nacks and
 * rejects (single, multiple, tag 0 multiple), random verdicts, twice's own
 * rejects, releases of held acks, channel closes, basic.recover, and
 * deliberate client errors.  After every step the broker, the client and a
 * model of the ledger's states must agree; at the end every delivery must
 * have been settled upstream exactly once or requeued by a close.
 *
 * Confirms: a client publishing (some publishes dropped by twice), a broker
 * confirming in RabbitMQ's ways (single, multiple, ack, nack), random
 * dropped confirms; the client must get exactly one confirm per published,
 * forwarded, confirmed and not dropped message, and nothing else.
 *
 * In both models a ledger call that allocates meets, now and then, an
 * allocation failure (tests/lib/failalloc.h): it must change nothing, and is
 * made again.  test_amqp_ledger_oom.c fails every allocation in turn.
 *
 * Frames are decoded here by hand, independently of proto/amqp/amqp.h, and fed
 * to the simulated peers.  Then directed examples of what RabbitMQ's
 * rabbit_channel (collect_acks) answers: 406 "unknown delivery tag" for a tag
 * already settled or never delivered.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/failalloc.h"

#include "proto/amqp/amqp_ledger.h"

#define CHANNEL 7u
#define FRAME_LEN AMQP_LEDGER_FRAME_LEN
/* Tags (or publish numbers) one simulated channel may use before it is closed. */
#define SIM_MAX_TAGS 2048u
/* Random steps per seed. */
#define SIM_STEPS 100000u
/* Steps between full consistency checks (every step gets the cheap ones). */
#define SIM_FULL_CHECK_EVERY 32u
/* The output buffer: a frame per tag, and two for an unknown plan. */
#define SIM_OUT_CAP (FRAME_LEN * (SIM_MAX_TAGS + 2))

static const uint64_t sim_seeds[] = {1, 2, 3, 42, 1234, 0xC0FFEE, 0x5EED5EED, 987654321};
#define SIM_N_SEEDS (sizeof(sim_seeds) / sizeof(sim_seeds[0]))

/* ---- random, infos, frames --------------------------------------------------------------- */

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

static bool rng_chance(uint64_t *s, unsigned percent)
{
    return rng_below(s, 100) < percent;
}

struct test_info {
    uint64_t tag; /* delivery tag, or client publish number */
    uint32_t rec; /* message record */
};

static long infos_live;

static void *info_new(uint64_t tag, uint32_t rec)
{
    struct test_info *i = KIT_RAW_MALLOC(sizeof(*i)); /* never failed (failalloc.h) */
    assert_non_null(i);
    i->tag = tag;
    i->rec = rec;
    infos_live++;
    return i;
}

static void info_free(void *p)
{
    infos_live--;
    KIT_RAW_FREE(p);
}

static uint64_t info_tag(const void *p)
{
    assert_non_null(p);
    return ((const struct test_info *)p)->tag;
}

/* ---- allocation failures ------------------------------------------------------------------ */

/* In the models, a ledger call that may allocate is made, one time in two, with its first
 * allocation failing (from a random stream of its own, so the models' steps are those of a run
 * without failures).  The call must return AMQP_LEDGER_E_NOMEM and change no count; made
 * again, it goes on as the model expects, which the model's checks see. */
static uint64_t sim_fail_rng = 0x5EED;
static unsigned long sim_nomem;

static uint64_t rng_next(uint64_t *s);

static void sim_fail_arm(const struct amqp_ledger *l, struct amqp_ledger_counts *before)
{
    amqp_ledger_counts(l, before);
    kit_arm(rng_next(&sim_fail_rng) % 2 == 0 ? 1 : 0);
}

/* True when the armed allocation failed in the call that returned rc. */
static bool sim_fail_disarm(const struct amqp_ledger *l, const struct amqp_ledger_counts *before,
                            int rc)
{
    bool fired = kit_alloc.failed;
    (void)kit_disarm();
    if (!fired)
        return false;
    assert_int_equal(rc, AMQP_LEDGER_E_NOMEM);
    struct amqp_ledger_counts after;
    amqp_ledger_counts(l, &after);
    assert_memory_equal(before, &after, sizeof(after));
    sim_nomem++;
    return true;
}

/* rc = call, made again when an allocation failed in it. */
#define SIM_MAY_FAIL(rc, l, call)                                                                  \
    do {                                                                                           \
        struct amqp_ledger_counts sim_before_;                                                     \
        sim_fail_arm((l), &sim_before_);                                                           \
        (rc) = (call);                                                                             \
        if (sim_fail_disarm((l), &sim_before_, (rc)))                                              \
            (rc) = (call);                                                                         \
    } while (0)

struct test_frame {
    enum amqp_settle_kind kind;
    uint64_t tag;
    bool multiple;
    bool requeue;
};

static uint64_t be_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void be_put(uint8_t *p, int n, uint64_t v)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* Decodes one 21-byte ack/reject/nack METHOD frame, failing on anything else. */
static void frame_decode(const uint8_t *p, struct test_frame *f)
{
    assert_int_equal(p[0], 1);
    assert_int_equal(be_get(p + 1, 2), CHANNEL);
    assert_int_equal(be_get(p + 3, 4), 13);
    assert_int_equal(be_get(p + 7, 2), 60);
    assert_int_equal(p[20], 0xCE);
    unsigned method = (unsigned)be_get(p + 9, 2);
    uint8_t bits = p[19];
    f->tag = be_get(p + 11, 8);
    if (method == 80) {
        assert_int_equal(bits & ~1u, 0);
        *f = (struct test_frame){AMQP_SETTLE_ACK, f->tag, bits & 1u, false};
    } else if (method == 90) {
        assert_int_equal(bits & ~1u, 0);
        *f = (struct test_frame){AMQP_SETTLE_REJECT, f->tag, false, bits & 1u};
    } else if (method == 120) {
        assert_int_equal(bits & ~3u, 0);
        *f = (struct test_frame){AMQP_SETTLE_NACK, f->tag, bits & 1u, (bits & 2u) != 0};
    } else {
        fail_msg("unexpected method 60,%u", method);
    }
}

/* The frame a client (or broker) sends, built by hand. */
static void frame_encode(uint8_t *p, const struct test_frame *f)
{
    static const unsigned method[] = {80, 120, 90};
    uint8_t bits = f->multiple ? 1 : 0;
    if (f->requeue)
        bits |= f->kind == AMQP_SETTLE_NACK ? 2 : 1;
    p[0] = 1;
    be_put(p + 1, 2, CHANNEL);
    be_put(p + 3, 4, 13);
    be_put(p + 7, 2, 60);
    be_put(p + 9, 2, method[f->kind]);
    be_put(p + 11, 8, f->tag);
    p[19] = bits;
    p[20] = 0xCE;
}

/* What a settlement does to a message: 1 + kind * 2 + requeue (0: nothing). */
static uint8_t code_of(enum amqp_settle_kind kind, bool requeue)
{
    return (uint8_t)(1 + (unsigned)kind * 2 + (requeue ? 1 : 0));
}

struct settle_rec {
    uint64_t tag;
    uint8_t code;
};

static void recs_assert_equal(const struct settle_rec *got, size_t n_got,
                              const struct settle_rec *want, size_t n_want)
{
    assert_int_equal(n_got, n_want);
    for (size_t i = 0; i < n_got; i++) {
        assert_int_equal(got[i].tag, want[i].tag);
        assert_int_equal(got[i].code, want[i].code);
    }
}

/* ---- the delivery model ------------------------------------------------------------------ */

enum model_state { M_NONE = 0, M_OUT, M_HELD, M_TS, M_DROPPED, M_COUNT };

struct msg_record {
    uint32_t settles;  /* settlements the broker accepted */
    uint32_t requeued; /* requeued by a channel close or basic.recover */
};

struct dsim_stats {
    unsigned long steps, deliveries, client_settles, transparent, transparent_multiple, rewritten,
        multiple_frames, swallowed, verdicts[4], twice_settles, releases, client_errors,
        presettle_held, presettle_dropped, closes, recovers, small_buffers, acked_one;
};

struct dsim {
    struct amqp_ledger *l;
    uint64_t rng;
    /* the broker's channel */
    uint64_t next_tag;
    uint8_t unacked[SIM_MAX_TAGS];
    uint32_t msg_of[SIM_MAX_TAGS]; /* 0: a no-ack delivery */
    size_t n_unacked;
    struct settle_rec got[SIM_MAX_TAGS]; /* what the last feed settled */
    size_t n_got;
    /* the client */
    uint8_t delivered[SIM_MAX_TAGS];
    uint8_t pending[SIM_MAX_TAGS];
    uint64_t lo; /* no pending tag below */
    /* the ledger, as the model expects it */
    uint8_t state[SIM_MAX_TAGS];
    uint8_t held_code[SIM_MAX_TAGS];
    size_t n_state[M_COUNT];
    struct settle_rec want[SIM_MAX_TAGS];
    size_t n_want;
    /* every ack-required delivery of the run */
    struct msg_record *msgs;
    uint32_t n_msgs;
    uint8_t out[SIM_OUT_CAP];
    uint8_t client_frame[FRAME_LEN];
    uint64_t held[SIM_MAX_TAGS];
    unsigned fault_pct; /* this channel's chance of a verdict other than PASS */
    struct dsim_stats st;
};

/* Each channel lifetime gets its own fault level, so that quiet channels
 * (long multiples, forwarded as is) and busy ones both occur. */
static const unsigned sim_fault_levels[] = {0, 3, 15, 45};
#define SIM_N_FAULT_LEVELS (sizeof(sim_fault_levels) / sizeof(sim_fault_levels[0]))

/* Counts are kept for the states the ledger records (not M_NONE). */
static void model_set(struct dsim *s, uint64_t t, enum model_state st)
{
    if (s->state[t] != M_NONE)
        s->n_state[s->state[t]]--;
    s->state[t] = (uint8_t)st;
    if (st != M_NONE)
        s->n_state[st]++;
}

static void broker_settle_one(struct dsim *s, uint64_t t, uint8_t code)
{
    s->unacked[t] = 0;
    s->n_unacked--;
    struct msg_record *m = &s->msgs[s->msg_of[t]];
    assert_int_equal(m->settles + m->requeued, 0); /* settled exactly once */
    m->settles++;
    s->got[s->n_got++] = (struct settle_rec){t, code};
}

/* RabbitMQ's collect_acks for one frame: false when it closes the channel (406). */
static bool broker_frame(struct dsim *s, const struct test_frame *f)
{
    bool all = f->multiple && f->tag == 0;
    if (!all && (f->tag == 0 || f->tag >= s->next_tag || !s->unacked[f->tag]))
        return false;
    uint64_t lo = f->multiple ? 1 : f->tag;
    uint64_t hi = all ? s->next_tag - 1 : f->tag;
    for (uint64_t t = lo; t <= hi; t++)
        if (s->unacked[t])
            broker_settle_one(s, t, code_of(f->kind, f->requeue));
    return true;
}

/* Feeds what twice sends upstream.  Only a deliberate client error may
 * close the channel, and only with the last frame (the client's own).
 * Frames twice writes itself must be ascending.  Returns whether the
 * channel survived. */
static bool broker_feed(struct dsim *s, const uint8_t *buf, size_t len, bool ascending,
                        bool error_expected)
{
    struct test_frame f;
    uint64_t prev = 0;
    assert_int_equal(len % FRAME_LEN, 0);
    s->n_got = 0;
    for (size_t off = 0; off < len; off += FRAME_LEN) {
        frame_decode(buf + off, &f);
        if (ascending) {
            assert_true(f.tag > prev);
            prev = f.tag;
        }
        if (f.multiple && f.tag != 0)
            s->st.multiple_frames += ascending;
        if (!broker_frame(s, &f)) {
            assert_true(error_expected);
            assert_int_equal(off + FRAME_LEN, len);
            return false;
        }
    }
    assert_false(error_expected);
    return true;
}

static void want_reset(struct dsim *s)
{
    s->n_want = 0;
}

static void want_add(struct dsim *s, uint64_t t, uint8_t code)
{
    s->want[s->n_want++] = (struct settle_rec){t, code};
}

/* The broker closed the channel (or the client did): everything unsettled
 * is requeued, tags restart at 1, the ledger is reset. */
static void dsim_channel_close(struct dsim *s)
{
    for (uint64_t t = 1; t < s->next_tag; t++)
        if (s->unacked[t])
            s->msgs[s->msg_of[t]].requeued++;
    memset(s->unacked, 0, sizeof(s->unacked));
    memset(s->msg_of, 0, sizeof(s->msg_of));
    memset(s->delivered, 0, sizeof(s->delivered));
    memset(s->pending, 0, sizeof(s->pending));
    memset(s->state, 0, sizeof(s->state));
    memset(s->n_state, 0, sizeof(s->n_state));
    s->next_tag = 1;
    s->lo = 1;
    s->n_unacked = 0;
    s->fault_pct = sim_fault_levels[rng_below(&s->rng, SIM_N_FAULT_LEVELS)];
    amqp_ledger_reset(s->l);
    s->st.closes++;
}

/* basic.recover(requeue=1): unsettled messages go back, old tags are void,
 * numbering goes on. */
static void dsim_recover(struct dsim *s)
{
    for (uint64_t t = 1; t < s->next_tag; t++) {
        if (s->unacked[t])
            s->msgs[s->msg_of[t]].requeued++;
        s->unacked[t] = 0;
        s->pending[t] = 0;
        s->state[t] = M_NONE;
    }
    memset(s->n_state, 0, sizeof(s->n_state));
    s->n_unacked = 0;
    amqp_ledger_recover(s->l);
    s->st.recovers++;
}

static void step_deliver(struct dsim *s)
{
    if (s->next_tag >= SIM_MAX_TAGS)
        dsim_channel_close(s);
    uint64_t t = s->next_tag++;
    assert_int_equal(s->delivered[t], 0); /* the client never sees a tag twice */
    s->delivered[t] = 1;
    if (rng_chance(&s->rng, 20))
        return; /* no-ack: the tag is used, nobody settles it */
    uint32_t m = ++s->n_msgs;
    s->msg_of[t] = m;
    s->unacked[t] = 1;
    s->n_unacked++;
    int rc;
    SIM_MAY_FAIL(rc, s->l, amqp_ledger_deliver(s->l, t, info_new(t, m)));
    assert_int_equal(rc, AMQP_LEDGER_OK);
    s->pending[t] = 1;
    model_set(s, t, M_OUT);
    s->st.deliveries++;
}

/* A random tag the client has pending, or 0. */
static uint64_t pick_pending(struct dsim *s)
{
    while (s->lo < s->next_tag && !s->pending[s->lo])
        s->lo++;
    if (s->lo >= s->next_tag)
        return 0;
    for (int k = 0; k < 32; k++) {
        uint64_t t = s->lo + rng_below(&s->rng, s->next_tag - s->lo);
        if (s->pending[t])
            return t;
    }
    return s->lo;
}

/* Is t in what the client's frame settles, from the client's point of view? */
static bool client_covers(const struct dsim *s, const struct test_frame *f, uint64_t t)
{
    if (!s->pending[t])
        return false;
    if (!f->multiple)
        return t == f->tag;
    return f->tag == 0 || t <= f->tag;
}

static uint64_t frame_hi(const struct dsim *s, const struct test_frame *f)
{
    return f->multiple ? (f->tag == 0 ? s->next_tag - 1 : f->tag) : f->tag;
}

/* The swallowed tags amqp_ledger_settle_swallowed() hands out, in order. */
struct swallowed_seen {
    uint64_t tags[SIM_MAX_TAGS];
    size_t n;
};

static void note_swallowed(void *arg, uint64_t tag, void *info)
{
    struct swallowed_seen *seen = arg;
    assert_int_equal(info_tag(info), tag);
    assert_true(seen->n < SIM_MAX_TAGS);
    seen->tags[seen->n++] = tag;
}

/* The plan lists the client's tags that are outstanding at both ends, and
 * counts the ones twice settled, which settle_swallowed() names with their
 * infos. */
static void check_plan(struct dsim *s, const struct test_frame *f, const struct amqp_plan *plan)
{
    struct swallowed_seen seen = {.n = 0};
    amqp_ledger_settle_swallowed(s->l, plan, note_swallowed, &seen);
    size_t k = 0, swallowed = 0;
    assert_false(plan->unknown);
    assert_int_equal(plan->multiple, f->multiple);
    for (uint64_t t = f->multiple ? 1 : f->tag; t <= frame_hi(s, f); t++) {
        if (!client_covers(s, f, t))
            continue;
        if (s->state[t] == M_TS) {
            assert_true(swallowed < seen.n);
            assert_int_equal(seen.tags[swallowed], t);
            swallowed++;
            continue;
        }
        assert_int_equal(s->state[t], M_OUT);
        assert_true(k < plan->n);
        assert_int_equal(plan->tags[k].tag, t);
        assert_int_equal(info_tag(plan->tags[k].info), t);
        assert_int_equal(plan->tags[k].verdict, AMQP_V_PASS);
        k++;
    }
    assert_int_equal(plan->n, k);
    assert_int_equal(plan->n_swallowed, swallowed);
    assert_int_equal(seen.n, swallowed);
}

static void choose_verdicts(struct dsim *s, struct amqp_plan *plan)
{
    for (size_t i = 0; i < plan->n; i++) {
        if (!rng_chance(&s->rng, s->fault_pct))
            continue;
        static const enum amqp_verdict v[] = {AMQP_V_REQUEUE, AMQP_V_HOLD, AMQP_V_DROP};
        plan->tags[i].verdict = v[rng_below(&s->rng, 3)];
    }
}

/* Forwarding the client's frame is right only when every verdict is PASS,
 * nothing is swallowed, and a multiple covers no held or dropped tag. */
static bool expect_transparent(const struct dsim *s, const struct test_frame *f,
                               const struct amqp_plan *plan)
{
    if (plan->n_swallowed > 0)
        return false;
    for (size_t i = 0; i < plan->n; i++)
        if (plan->tags[i].verdict != AMQP_V_PASS)
            return false;
    if (f->multiple)
        for (uint64_t t = 1; t <= frame_hi(s, f); t++)
            if (s->state[t] == M_HELD || s->state[t] == M_DROPPED)
                return false;
    return true;
}

/* Commits, sometimes first into a buffer too small, which must change nothing. */
static int commit_settle(struct dsim *s, struct amqp_plan *plan, size_t *len)
{
    if (rng_chance(&s->rng, 10)) {
        size_t small = (size_t)rng_below(&s->rng, 2 * FRAME_LEN);
        int rc = amqp_ledger_settle_commit(s->l, CHANNEL, plan, s->out, small, len);
        if (rc != AMQP_LEDGER_E_BUFFER)
            return rc;
        s->st.small_buffers++;
    }
    assert_true(amqp_ledger_plan_space(plan) <= SIM_OUT_CAP);
    return amqp_ledger_settle_commit(s->l, CHANNEL, plan, s->out, amqp_ledger_plan_space(plan),
                                     len);
}

/* The model's side of a committed plan. */
static void apply_settle(struct dsim *s, const struct test_frame *f, const struct amqp_plan *plan)
{
    size_t k = 0;
    for (uint64_t t = f->multiple ? 1 : f->tag; t <= frame_hi(s, f); t++) {
        if (!client_covers(s, f, t))
            continue;
        s->pending[t] = 0;
        if (s->state[t] == M_TS) {
            model_set(s, t, M_NONE);
            continue;
        }
        enum amqp_verdict v = plan->tags[k++].verdict;
        s->st.verdicts[v]++;
        if (v == AMQP_V_HOLD) {
            s->held_code[t] = code_of(f->kind, f->requeue);
            model_set(s, t, M_HELD);
        } else {
            model_set(s, t, v == AMQP_V_DROP ? M_DROPPED : M_NONE);
        }
    }
}

static void random_client_frame(struct dsim *s, struct test_frame *f, uint64_t tag)
{
    unsigned r = (unsigned)rng_below(&s->rng, 100);
    f->kind = r < 60 ? AMQP_SETTLE_ACK : r < 85 ? AMQP_SETTLE_NACK : AMQP_SETTLE_REJECT;
    f->tag = tag;
    f->multiple = f->kind != AMQP_SETTLE_REJECT && rng_chance(&s->rng, 35);
    f->requeue = f->kind != AMQP_SETTLE_ACK && rng_chance(&s->rng, 50);
}

static void step_client_settle(struct dsim *s)
{
    struct test_frame f;
    struct amqp_plan plan;
    size_t len = 0;
    uint64_t t = pick_pending(s);
    if (t == 0)
        return;
    random_client_frame(s, &f, t);
    if (f.multiple && rng_chance(&s->rng, 10))
        f.tag = 0;
    if (f.kind == AMQP_SETTLE_ACK && !f.multiple && rng_chance(&s->rng, 30)) {
        /* The plan-less way of a proxy with no rule on acks: it settles exactly an
         * outstanding tag, whose frame goes on as the client sent it. */
        bool out = s->state[f.tag] == M_OUT;
        assert_int_equal(amqp_ledger_ack_one(s->l, f.tag), out);
        if (out) {
            want_reset(s);
            want_add(s, f.tag, code_of(f.kind, f.requeue));
            frame_encode(s->client_frame, &f);
            assert_true(broker_feed(s, s->client_frame, FRAME_LEN, false, false));
            recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
            s->pending[f.tag] = 0;
            s->st.verdicts[AMQP_V_PASS]++;
            model_set(s, f.tag, M_NONE);
            s->st.client_settles++;
            s->st.acked_one++;
            return;
        }
    }
    int rc;
    SIM_MAY_FAIL(rc, s->l,
                 amqp_ledger_settle_begin(s->l, f.kind, f.tag, f.multiple, f.requeue, &plan));
    assert_int_equal(rc, 0);
    check_plan(s, &f, &plan);
    choose_verdicts(s, &plan);
    bool transparent = expect_transparent(s, &f, &plan);
    rc = commit_settle(s, &plan, &len);
    assert_int_equal(rc, transparent ? 1 : 0);
    want_reset(s);
    for (size_t i = 0; i < plan.n; i++) {
        if (plan.tags[i].verdict == AMQP_V_PASS)
            want_add(s, plan.tags[i].tag, code_of(f.kind, f.requeue));
        else if (plan.tags[i].verdict == AMQP_V_REQUEUE)
            want_add(s, plan.tags[i].tag, code_of(AMQP_SETTLE_REJECT, true));
    }
    if (rc == 1) {
        frame_encode(s->client_frame, &f);
        assert_true(broker_feed(s, s->client_frame, FRAME_LEN, false, false));
        s->st.transparent++;
        s->st.transparent_multiple += f.multiple;
    } else {
        assert_true(broker_feed(s, s->out, len, true, false));
        s->st.rewritten++;
    }
    recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
    s->st.swallowed += plan.n_swallowed;
    s->st.client_settles++;
    apply_settle(s, &f, &plan);
}

/* A tag the client must not settle now: one it settled, a no-ack one, one
 * voided by basic.recover, one never delivered, or 0. */
static uint64_t pick_bad_tag(struct dsim *s)
{
    for (int k = 0; k < 32 && s->next_tag > 1; k++) {
        uint64_t t = 1 + rng_below(&s->rng, s->next_tag - 1);
        if (s->delivered[t] && !s->pending[t])
            return t;
    }
    return rng_chance(&s->rng, 50) ? s->next_tag + rng_below(&s->rng, 3) : 0;
}

/* The client errs: the broker must see its frame and close the channel, as
 * it would have without twice. */
static void step_client_error(struct dsim *s)
{
    struct test_frame f;
    struct amqp_plan plan;
    size_t len = 0;
    random_client_frame(s, &f, pick_bad_tag(s));
    if (f.tag == 0)
        f.multiple = false; /* tag 0 multiple is valid: "all outstanding" */
    int rc;
    SIM_MAY_FAIL(rc, s->l,
                 amqp_ledger_settle_begin(s->l, f.kind, f.tag, f.multiple, f.requeue, &plan));
    assert_int_equal(rc, 0);
    assert_true(plan.unknown);
    assert_int_equal(plan.n, 0);
    assert_int_equal(plan.n_swallowed, 0);
    rc = commit_settle(s, &plan, &len);
    uint8_t st = f.tag > 0 && f.tag < s->next_tag ? s->state[f.tag] : M_NONE;
    frame_encode(s->client_frame, &f);
    want_reset(s);
    if (st == M_HELD || st == M_DROPPED) {
        /* Twice still owes the broker the first settlement: it goes first. */
        assert_int_equal(rc, 0);
        assert_int_equal(len, 2 * FRAME_LEN);
        assert_memory_equal(s->out + FRAME_LEN, s->client_frame, FRAME_LEN);
        want_add(s, f.tag, st == M_HELD ? s->held_code[f.tag] : code_of(AMQP_SETTLE_REJECT, true));
        assert_false(broker_feed(s, s->out, len, false, true));
        s->st.presettle_held += st == M_HELD;
        s->st.presettle_dropped += st == M_DROPPED;
    } else {
        assert_int_equal(rc, 1);
        assert_false(broker_feed(s, s->client_frame, FRAME_LEN, false, true));
    }
    recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
    s->st.client_errors++;
    dsim_channel_close(s);
}

static void step_twice_settle(struct dsim *s)
{
    if (!rng_chance(&s->rng, s->fault_pct * 2))
        return;
    uint64_t t = rng_chance(&s->rng, 60) ? pick_pending(s) : 1 + rng_below(&s->rng, s->next_tag);
    bool requeue = rng_chance(&s->rng, 70);
    uint8_t st = t < s->next_tag ? s->state[t] : M_NONE;
    /* Outstanding, or its settlement dropped or held (held: discarded). */
    bool settleable = st == M_OUT || st == M_DROPPED || st == M_HELD;
    assert_int_equal(amqp_ledger_twice_settleable(s->l, t), settleable);
    if (rng_chance(&s->rng, 5))
        assert_int_equal(amqp_ledger_twice_settle(s->l, CHANNEL, t, requeue, s->out, 20),
                         settleable ? AMQP_LEDGER_E_BUFFER : 0);
    int rc = amqp_ledger_twice_settle(s->l, CHANNEL, t, requeue, s->out, SIM_OUT_CAP);
    if (!settleable) {
        assert_int_equal(rc, 0);
        return;
    }
    assert_int_equal(rc, FRAME_LEN);
    want_reset(s);
    want_add(s, t, code_of(AMQP_SETTLE_REJECT, requeue));
    assert_true(broker_feed(s, s->out, FRAME_LEN, true, false));
    recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
    model_set(s, t, st == M_OUT ? M_TS : M_NONE);
    s->st.twice_settles++;
}

static void release_one(struct dsim *s, uint64_t t)
{
    assert_int_equal(s->state[t], M_HELD);
    int rc = amqp_ledger_release(s->l, CHANNEL, t, s->out, SIM_OUT_CAP);
    assert_int_equal(rc, FRAME_LEN);
    want_reset(s);
    want_add(s, t, s->held_code[t]);
    assert_true(broker_feed(s, s->out, FRAME_LEN, true, false));
    recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
    model_set(s, t, M_NONE);
    s->st.releases++;
}

static void step_release(struct dsim *s)
{
    size_t n = amqp_ledger_held(s->l, s->held, 8);
    assert_int_equal(n, s->n_state[M_HELD]);
    if (n > 0)
        release_one(s, s->held[rng_below(&s->rng, n < 8 ? n : 8)]);
    uint64_t t = 1 + rng_below(&s->rng, s->next_tag);
    if (t >= s->next_tag || s->state[t] != M_HELD)
        assert_int_equal(amqp_ledger_release(s->l, CHANNEL, t, s->out, SIM_OUT_CAP), 0);
}

/* Broker, client, ledger and model agree, tag by tag. */
static void dsim_full_check(struct dsim *s)
{
    size_t n_held = 0;
    for (uint64_t t = 1; t < s->next_tag; t++) {
        uint8_t st = s->state[t];
        assert_int_equal(s->unacked[t], st == M_OUT || st == M_HELD || st == M_DROPPED);
        assert_int_equal(s->pending[t], st == M_OUT || st == M_TS);
        if (s->pending[t])
            assert_true(s->delivered[t] && s->msg_of[t] != 0);
        void *info = amqp_ledger_info(s->l, t);
        assert_int_equal(info != NULL, st != M_NONE);
        if (info != NULL)
            assert_int_equal(info_tag(info), t);
        if (st == M_HELD)
            s->held[n_held++] = t;
    }
    uint64_t *tags = calloc(n_held + 1, sizeof(*tags));
    assert_non_null(tags);
    assert_int_equal(amqp_ledger_held(s->l, tags, n_held + 1), n_held);
    assert_memory_equal(tags, s->held, n_held * sizeof(*tags));
    free(tags);
}

static void dsim_step(struct dsim *s)
{
    unsigned r = (unsigned)rng_below(&s->rng, 1000);
    if (r < 380)
        step_deliver(s);
    else if (r < 720)
        step_client_settle(s);
    else if (r < 820)
        step_twice_settle(s);
    else if (r < 985)
        step_release(s);
    else if (r < 993)
        step_client_error(s);
    else if (r < 997)
        dsim_channel_close(s);
    else
        dsim_recover(s);
    assert_int_equal(amqp_ledger_outstanding(s->l), s->n_unacked);
    assert_int_equal(s->n_unacked, s->n_state[M_OUT] + s->n_state[M_HELD] + s->n_state[M_DROPPED]);
    s->st.steps++;
}

/* Releases what is held, closes the channel, and accounts for every delivery. */
static void dsim_finish(struct dsim *s)
{
    size_t n;
    while ((n = amqp_ledger_held(s->l, s->held, SIM_MAX_TAGS)) > 0)
        release_one(s, s->held[0]);
    dsim_full_check(s);
    dsim_channel_close(s);
    for (uint32_t m = 1; m <= s->n_msgs; m++)
        assert_int_equal(s->msgs[m].settles + s->msgs[m].requeued, 1);
    assert_int_equal(amqp_ledger_outstanding(s->l), 0);
}

static void dsim_run(uint64_t seed, struct dsim_stats *total)
{
    long infos_before = infos_live;
    struct dsim *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->msgs = calloc(SIM_STEPS + 2, sizeof(*s->msgs));
    assert_non_null(s->msgs);
    s->l = amqp_ledger_new(info_free);
    assert_non_null(s->l);
    s->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    s->next_tag = s->lo = 1;
    s->fault_pct = sim_fault_levels[seed % SIM_N_FAULT_LEVELS];
    for (unsigned i = 0; i < SIM_STEPS; i++) {
        dsim_step(s);
        if (i % SIM_FULL_CHECK_EVERY == 0)
            dsim_full_check(s);
    }
    dsim_finish(s);
    amqp_ledger_free(s->l);
    assert_int_equal(infos_live, infos_before);
    /* The stats structs hold unsigned longs only. */
    unsigned long *dst = (unsigned long *)total, *src = (unsigned long *)&s->st;
    for (size_t i = 0; i < sizeof(*total) / sizeof(unsigned long); i++)
        dst[i] += src[i];
    free(s->msgs);
    free(s);
}

static void test_model_deliveries(void **state)
{
    (void)state;
    struct dsim_stats t = {0};
    unsigned long nomem_before = sim_nomem;
    for (size_t i = 0; i < SIM_N_SEEDS; i++)
        dsim_run(sim_seeds[i], &t);
    printf("deliveries: %zu seeds x %u steps: %lu deliveries, %lu client settles "
           "(%lu forwarded as is, %lu of them multiple; %lu rewritten, %lu multiple frames "
           "written), verdicts pass/requeue/hold/drop %lu/%lu/%lu/%lu, %lu swallowed, "
           "%lu twice settles, %lu releases, %lu client errors (%lu after a hold, %lu after "
           "a drop), %lu closes, %lu recovers, %lu short buffers, %lu plan-less acks\n",
           SIM_N_SEEDS, SIM_STEPS, t.deliveries, t.client_settles, t.transparent,
           t.transparent_multiple, t.rewritten, t.multiple_frames, t.verdicts[0], t.verdicts[1],
           t.verdicts[2], t.verdicts[3], t.swallowed, t.twice_settles, t.releases, t.client_errors,
           t.presettle_held, t.presettle_dropped, t.closes, t.recovers, t.small_buffers,
           t.acked_one);
    /* Every path was taken, an allocation failure too. */
    printf("deliveries: %lu ledger calls met an allocation failure\n", sim_nomem - nomem_before);
    assert_true(sim_nomem > nomem_before);
    assert_true(t.transparent_multiple > 0 && t.multiple_frames > 0 && t.swallowed > 0);
    assert_true(t.presettle_held > 0 && t.presettle_dropped > 0 && t.small_buffers > 0);
    assert_true(t.recovers > 0 && t.closes > t.client_errors && t.acked_one > 0);
}

/* ---- the confirm model ------------------------------------------------------------------- */

struct pub_record {
    bool dropped_publish; /* twice did not forward it */
    bool confirm_dropped; /* twice dropped its confirm */
    bool lost;            /* the channel closed before the broker confirmed it */
    uint8_t broker_code;  /* how the broker confirmed it (0: not yet) */
    uint8_t client_code;  /* how the client saw it confirmed */
    uint32_t client_confirms;
};

struct csim_stats {
    unsigned long publishes, dropped_publishes, copies, confirms, transparent, rewritten,
        multiple_frames, dropped_confirms, closes;
};

struct csim {
    struct amqp_ledger *l;
    uint64_t rng;
    /* the client */
    uint64_t client_seq;
    uint8_t awaiting[SIM_MAX_TAGS];
    uint32_t rec_of[SIM_MAX_TAGS];
    /* the broker */
    uint64_t broker_seq, lo;
    uint8_t unconfirmed[SIM_MAX_TAGS];
    uint64_t b2c[SIM_MAX_TAGS]; /* 0: a copy twice sent */
    /* the model: lowest client number never to be confirmed, lowest broker number of a copy */
    uint64_t barrier, copies_from;
    struct pub_record *recs;
    uint32_t n_recs;
    struct settle_rec got[SIM_MAX_TAGS], want[SIM_MAX_TAGS];
    size_t n_got, n_want;
    uint8_t out[SIM_OUT_CAP];
    uint8_t broker_frame[FRAME_LEN];
    unsigned drop_publish_pct, drop_confirm_pct, copy_pct; /* this channel's fault levels */
    unsigned publish_permille;                             /* publishes vs broker confirms */
    struct csim_stats st;
};

static void csim_open(struct csim *s)
{
    uint64_t seq = 99;
    assert_false(amqp_ledger_in_confirm_mode(s->l));
    /* Before confirm.select-ok nothing is numbered. */
    assert_int_equal(amqp_ledger_publish(s->l, false, info_new(0, 0), &seq), 0);
    assert_int_equal(seq, 0);
    amqp_ledger_confirm_mode(s->l);
    assert_true(amqp_ledger_in_confirm_mode(s->l));
    s->client_seq = s->broker_seq = 0;
    s->lo = 1;
    s->barrier = s->copies_from = UINT64_MAX;
    s->drop_publish_pct = sim_fault_levels[rng_below(&s->rng, SIM_N_FAULT_LEVELS)] / 3;
    s->copy_pct = sim_fault_levels[rng_below(&s->rng, SIM_N_FAULT_LEVELS)] / 3;
    s->drop_confirm_pct = sim_fault_levels[rng_below(&s->rng, SIM_N_FAULT_LEVELS)] / 3;
    s->publish_permille = rng_chance(&s->rng, 50) ? 500 : 800; /* confirms keep up, or lag */
}

static void csim_close(struct csim *s)
{
    for (uint64_t b = 1; b <= s->broker_seq; b++)
        if (s->unconfirmed[b] && s->b2c[b] != 0)
            s->recs[s->rec_of[s->b2c[b]]].lost = true;
    memset(s->awaiting, 0, sizeof(s->awaiting));
    memset(s->unconfirmed, 0, sizeof(s->unconfirmed));
    amqp_ledger_reset(s->l);
    s->st.closes++;
    csim_open(s);
}

static void cstep_publish(struct csim *s)
{
    if (s->client_seq + 1 >= SIM_MAX_TAGS || s->broker_seq + 2 >= SIM_MAX_TAGS)
        csim_close(s);
    bool dropped = rng_chance(&s->rng, s->drop_publish_pct);
    uint32_t r = ++s->n_recs;
    uint64_t cs = 0, want = s->client_seq + 1;
    assert_int_equal(amqp_ledger_publish(s->l, dropped, info_new(want, r), &cs), 0);
    assert_int_equal(cs, want);
    s->client_seq = cs;
    s->awaiting[cs] = 1;
    s->rec_of[cs] = r;
    s->recs[r].dropped_publish = dropped;
    s->st.publishes++;
    if (dropped) {
        s->barrier = cs < s->barrier ? cs : s->barrier;
        s->st.dropped_publishes++;
        return;
    }
    uint64_t b = ++s->broker_seq;
    void *info = NULL;
    s->b2c[b] = cs;
    s->unconfirmed[b] = 1;
    assert_int_equal(amqp_ledger_confirm_seq(s->l, b, &info), cs);
    assert_int_equal(info_tag(info), cs);
    if (!rng_chance(&s->rng, s->copy_pct))
        return;
    /* A `duplicate`: the copy right behind it, numbered by the broker alone. */
    assert_int_equal(amqp_ledger_publish_copy(s->l), 0);
    b = ++s->broker_seq;
    s->b2c[b] = 0;
    s->unconfirmed[b] = 1;
    s->copies_from = b < s->copies_from ? b : s->copies_from;
    s->st.copies++;
    assert_int_equal(amqp_ledger_confirm_seq(s->l, b, &info), 0);
    assert_null(info);
}

/* The client library: a confirm settles the number it names, a multiple
 * one every number up to it still awaited. */
static void client_confirm_one(struct csim *s, uint64_t cs, enum amqp_settle_kind kind)
{
    struct pub_record *r = &s->recs[s->rec_of[cs]];
    assert_false(r->dropped_publish); /* never a confirm for a dropped publish */
    assert_false(r->confirm_dropped); /* nor one twice dropped */
    assert_int_equal(r->client_confirms, 0);
    r->client_confirms++;
    r->client_code = code_of(kind, false);
    s->awaiting[cs] = 0;
    s->got[s->n_got++] = (struct settle_rec){cs, r->client_code};
}

static void client_feed(struct csim *s, const uint8_t *buf, size_t len, bool rewritten)
{
    struct test_frame f;
    assert_int_equal(len % FRAME_LEN, 0);
    s->n_got = 0;
    for (size_t off = 0; off < len; off += FRAME_LEN) {
        frame_decode(buf + off, &f);
        assert_true(f.kind != AMQP_SETTLE_REJECT && !f.requeue);
        assert_true(f.tag > 0 && f.tag <= s->client_seq);
        s->st.multiple_frames += f.multiple && rewritten;
        if (!f.multiple) {
            assert_true(s->awaiting[f.tag]);
            client_confirm_one(s, f.tag, f.kind);
            continue;
        }
        for (uint64_t cs = 1; cs <= f.tag; cs++)
            if (s->awaiting[cs])
                client_confirm_one(s, cs, f.kind);
    }
}

/* What the broker confirms: one unconfirmed number, or all up to it. */
static bool broker_pick_confirm(struct csim *s, struct test_frame *f)
{
    while (s->lo <= s->broker_seq && !s->unconfirmed[s->lo])
        s->lo++;
    if (s->lo > s->broker_seq)
        return false;
    uint64_t b = s->lo + rng_below(&s->rng, s->broker_seq - s->lo + 1);
    while (!s->unconfirmed[b])
        b--;
    f->kind = rng_chance(&s->rng, 15) ? AMQP_SETTLE_NACK : AMQP_SETTLE_ACK;
    f->tag = b;
    f->multiple = rng_chance(&s->rng, 40);
    f->requeue = false;
    return true;
}

static void check_confirm_plan(struct csim *s, const struct test_frame *f,
                               const struct amqp_plan *plan)
{
    size_t k = 0;
    assert_false(plan->unknown);
    for (uint64_t b = f->multiple ? s->lo : f->tag; b <= f->tag; b++) {
        if (!s->unconfirmed[b] || s->b2c[b] == 0)
            continue;
        assert_true(k < plan->n);
        assert_int_equal(plan->tags[k].tag, s->b2c[b]);
        assert_int_equal(info_tag(plan->tags[k].info), s->b2c[b]);
        k++;
    }
    assert_int_equal(plan->n, k);
}

/* The model's side: the broker confirmed, some confirms were dropped. */
static void apply_confirm(struct csim *s, const struct test_frame *f, const struct amqp_plan *plan)
{
    size_t k = 0;
    s->n_want = 0;
    for (uint64_t b = f->multiple ? s->lo : f->tag; b <= f->tag; b++) {
        if (!s->unconfirmed[b])
            continue;
        s->unconfirmed[b] = 0;
        if (s->b2c[b] == 0)
            continue; /* a copy: the client hears nothing of it */
        struct pub_record *r = &s->recs[s->rec_of[s->b2c[b]]];
        r->broker_code = code_of(f->kind, false);
        if (plan->tags[k++].verdict == AMQP_V_DROP) {
            r->confirm_dropped = true;
            s->barrier = s->b2c[b] < s->barrier ? s->b2c[b] : s->barrier;
            s->st.dropped_confirms++;
        } else {
            s->want[s->n_want++] = (struct settle_rec){s->b2c[b], r->broker_code};
        }
    }
}

static void cstep_confirm(struct csim *s)
{
    struct test_frame f;
    struct amqp_plan plan;
    size_t len = 0;
    if (!broker_pick_confirm(s, &f))
        return;
    int rc;
    SIM_MAY_FAIL(
        rc, s->l,
        amqp_ledger_confirm_begin(s->l, f.kind == AMQP_SETTLE_NACK, f.tag, f.multiple, &plan));
    assert_int_equal(rc, 0);
    check_confirm_plan(s, &f, &plan);
    for (size_t i = 0; i < plan.n; i++)
        if (rng_chance(&s->rng, s->drop_confirm_pct))
            plan.tags[i].verdict = AMQP_V_DROP;
    bool transparent = true;
    for (size_t i = 0; i < plan.n; i++)
        transparent = transparent && plan.tags[i].verdict == AMQP_V_PASS;
    transparent = transparent && (f.multiple ? s->barrier > f.tag && s->copies_from > f.tag
                                             : s->b2c[f.tag] == f.tag);
    rc = amqp_ledger_confirm_commit(s->l, CHANNEL, &plan, s->out, 0, &len);
    if (rc == AMQP_LEDGER_E_BUFFER)
        rc = amqp_ledger_confirm_commit(s->l, CHANNEL, &plan, s->out, amqp_ledger_plan_space(&plan),
                                        &len);
    assert_int_equal(rc, transparent ? 1 : 0);
    apply_confirm(s, &f, &plan);
    if (rc == 1) {
        frame_encode(s->broker_frame, &f);
        client_feed(s, s->broker_frame, FRAME_LEN, false);
        s->st.transparent++;
    } else {
        client_feed(s, s->out, len, true);
        s->st.rewritten++;
    }
    recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
    s->st.confirms++;
}

/* The broker confirms whatever is left, then every message is accounted for. */
static void csim_finish(struct csim *s)
{
    struct test_frame f;
    struct amqp_plan plan;
    size_t len = 0;
    while (broker_pick_confirm(s, &f)) {
        assert_int_equal(
            amqp_ledger_confirm_begin(s->l, f.kind == AMQP_SETTLE_NACK, f.tag, f.multiple, &plan),
            0);
        int rc = amqp_ledger_confirm_commit(s->l, CHANNEL, &plan, s->out, SIM_OUT_CAP, &len);
        assert_true(rc == 0 || rc == 1);
        apply_confirm(s, &f, &plan);
        frame_encode(s->broker_frame, &f);
        client_feed(s, rc == 1 ? s->broker_frame : s->out, rc == 1 ? FRAME_LEN : len, rc == 0);
        recs_assert_equal(s->got, s->n_got, s->want, s->n_want);
    }
    for (uint32_t i = 1; i <= s->n_recs; i++) {
        const struct pub_record *r = &s->recs[i];
        bool owed = !r->dropped_publish && !r->confirm_dropped && !r->lost;
        assert_int_equal(r->client_confirms, owed ? 1 : 0);
        if (owed)
            assert_int_equal(r->client_code, r->broker_code);
    }
}

static void csim_run(uint64_t seed, struct csim_stats *total)
{
    long infos_before = infos_live;
    struct csim *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->recs = calloc(SIM_STEPS + 2, sizeof(*s->recs));
    assert_non_null(s->recs);
    s->l = amqp_ledger_new(info_free);
    assert_non_null(s->l);
    s->rng = seed * 0x9E3779B97F4A7C15ull + 7;
    csim_open(s);
    for (unsigned i = 0; i < SIM_STEPS; i++) {
        unsigned r = (unsigned)rng_below(&s->rng, 1000);
        if (r < 4)
            csim_close(s);
        else if (r < s->publish_permille)
            cstep_publish(s);
        else
            cstep_confirm(s);
    }
    csim_finish(s);
    amqp_ledger_free(s->l);
    assert_int_equal(infos_live, infos_before);
    /* The stats structs hold unsigned longs only. */
    unsigned long *dst = (unsigned long *)total, *src = (unsigned long *)&s->st;
    for (size_t i = 0; i < sizeof(*total) / sizeof(unsigned long); i++)
        dst[i] += src[i];
    free(s->recs);
    free(s);
}

static void test_model_confirms(void **state)
{
    (void)state;
    struct csim_stats t = {0};
    unsigned long nomem_before = sim_nomem;
    for (size_t i = 0; i < SIM_N_SEEDS; i++)
        csim_run(sim_seeds[i], &t);
    printf("confirms: %zu seeds x %u steps: %lu publishes (%lu dropped, %lu copied), %lu broker "
           "confirms (%lu forwarded as is, %lu rewritten, %lu multiple frames written), %lu "
           "confirms dropped, %lu closes\n",
           SIM_N_SEEDS, SIM_STEPS, t.publishes, t.dropped_publishes, t.copies, t.confirms,
           t.transparent, t.rewritten, t.multiple_frames, t.dropped_confirms, t.closes);
    printf("confirms: %lu ledger calls met an allocation failure\n", sim_nomem - nomem_before);
    assert_true(sim_nomem > nomem_before);
    assert_true(t.transparent > 0 && t.rewritten > 0 && t.multiple_frames > 0 && t.copies > 0);
}

/* ---- directed tests ------------------------------------------------------------------------ */

struct dt {
    struct amqp_ledger *l;
    struct amqp_plan plan;
    uint8_t out[16 * FRAME_LEN];
    size_t len;
};

static int dt_setup(void **state)
{
    struct dt *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return -1;
    d->l = amqp_ledger_new(info_free);
    *state = d;
    return d->l == NULL ? -1 : 0;
}

static int dt_teardown(void **state)
{
    struct dt *d = *state;
    amqp_ledger_free(d->l);
    free(d);
    return infos_live == 0 ? 0 : -1;
}

static void dt_deliver(struct dt *d, uint64_t from, uint64_t to)
{
    for (uint64_t t = from; t <= to; t++)
        assert_int_equal(amqp_ledger_deliver(d->l, t, info_new(t, 0)), 0);
}

static void dt_begin(struct dt *d, enum amqp_settle_kind kind, uint64_t tag, bool multiple,
                     bool requeue)
{
    assert_int_equal(amqp_ledger_settle_begin(d->l, kind, tag, multiple, requeue, &d->plan), 0);
}

static int dt_commit(struct dt *d)
{
    d->len = 12345;
    return amqp_ledger_settle_commit(d->l, CHANNEL, &d->plan, d->out, sizeof(d->out), &d->len);
}

/* d->out holds exactly these frames. */
static void dt_expect(const uint8_t *out, size_t len, const struct test_frame *want, size_t n)
{
    struct test_frame f;
    assert_int_equal(len, n * FRAME_LEN);
    for (size_t i = 0; i < n; i++) {
        frame_decode(out + i * FRAME_LEN, &f);
        assert_int_equal(f.kind, want[i].kind);
        assert_int_equal(f.tag, want[i].tag);
        assert_int_equal(f.multiple, want[i].multiple);
        assert_int_equal(f.requeue, want[i].requeue);
    }
}

#define ACK1(t)                                                                                    \
    {                                                                                              \
        AMQP_SETTLE_ACK, (t), false, false                                                         \
    }
#define ACKM(t)                                                                                    \
    {                                                                                              \
        AMQP_SETTLE_ACK, (t), true, false                                                          \
    }
#define REJQ(t)                                                                                    \
    {                                                                                              \
        AMQP_SETTLE_REJECT, (t), false, true                                                       \
    }

/* AMQP 0-9-1's basic.ack (class 60, method 80: tag u64, multiple bit): ack of tag 5
 * on channel 1, byte for byte, from a held
 * ack released; and the bits of reject and nack. */
static void test_frame_bytes(void **state)
{
    struct dt *d = *state;
    static const uint8_t ack5[FRAME_LEN] = {0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0D,
                                            0x00, 0x3C, 0x00, 0x50, 0,    0,    0,
                                            0,    0,    0,    0,    0x05, 0x00, 0xCE};
    dt_deliver(d, 5, 7);
    dt_begin(d, AMQP_SETTLE_ACK, 5, false, false);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(d->len, 0);
    assert_int_equal(amqp_ledger_release(d->l, 1, 5, d->out, sizeof(d->out)), FRAME_LEN);
    assert_memory_equal(d->out, ack5, FRAME_LEN);
    assert_int_equal(amqp_ledger_twice_settle(d->l, 1, 6, true, d->out, sizeof(d->out)), FRAME_LEN);
    assert_int_equal(d->out[10], 90);
    assert_int_equal(d->out[19], 0x01);
    dt_begin(d, AMQP_SETTLE_NACK, 7, true, true);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(amqp_ledger_release(d->l, 1, 7, d->out, sizeof(d->out)), FRAME_LEN);
    assert_int_equal(d->out[10], 120);
    assert_int_equal(d->out[19], 0x02); /* requeue, and never multiple on release */
}

/* A.9 (3): a multiple ack must not overtake a held ack of a lower tag. */
static void test_multiple_split_around_held(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 5);
    dt_begin(d, AMQP_SETTLE_ACK, 2, false, false);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(d->len, 0);
    dt_begin(d, AMQP_SETTLE_ACK, 5, true, false);
    assert_int_equal(d->plan.n, 4); /* 1 3 4 5: the client settled 2 already */
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {ACK1(1), ACK1(3), ACK1(4), ACK1(5)};
    dt_expect(d->out, d->len, want, 4);
    assert_int_equal(amqp_ledger_outstanding(d->l), 1);
    assert_int_equal(amqp_ledger_release(d->l, CHANNEL, 2, d->out, sizeof(d->out)), FRAME_LEN);
    const struct test_frame want2[] = {ACK1(2)};
    dt_expect(d->out, FRAME_LEN, want2, 1);
    assert_int_equal(amqp_ledger_outstanding(d->l), 0);
}

/* A.9 (1a): a multiple ack covering a tag twice redelivers becomes
 * ack-multiple below it, reject(requeue) of it, ack-multiple above it. */
static void test_multiple_split_around_requeue(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 5);
    dt_begin(d, AMQP_SETTLE_ACK, 5, true, false);
    assert_int_equal(d->plan.n, 5);
    d->plan.tags[2].verdict = AMQP_V_REQUEUE;
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {ACKM(2), REJQ(3), ACKM(5)};
    dt_expect(d->out, d->len, want, 3);
    assert_int_equal(amqp_ledger_outstanding(d->l), 0);
}

/* All PASS: the client's multiple goes as is, even with gaps in the tags. */
static void test_multiple_all_pass_forwarded(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 2);
    dt_deliver(d, 4, 6); /* 3 was a no-ack delivery */
    dt_begin(d, AMQP_SETTLE_NACK, 5, true, true);
    assert_int_equal(d->plan.n, 4);
    assert_true(d->plan.requeue && d->plan.multiple);
    assert_int_equal(dt_commit(d), 1);
    assert_int_equal(d->len, 0);
    assert_int_equal(amqp_ledger_outstanding(d->l), 1);
    assert_null(amqp_ledger_info(d->l, 5));
    assert_int_equal(info_tag(amqp_ledger_info(d->l, 6)), 6);
}

/* DESIGN: duplicate / expire: twice rejects at once, the late ack is swallowed. */
static void test_twice_settled_ack_swallowed(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 2);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 1, true, d->out, sizeof(d->out)),
                     FRAME_LEN);
    const struct test_frame want[] = {REJQ(1)};
    dt_expect(d->out, FRAME_LEN, want, 1);
    assert_int_equal(amqp_ledger_outstanding(d->l), 1);
    assert_non_null(amqp_ledger_info(d->l, 1));
    /* twice settles each tag once */
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 1, true, d->out, sizeof(d->out)), 0);
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    assert_false(d->plan.unknown);
    assert_int_equal(d->plan.n, 0);
    assert_int_equal(d->plan.n_swallowed, 1);
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(d->len, 0);
    assert_null(amqp_ledger_info(d->l, 1));
    /* The client acks it again: its own error, the broker must say so. */
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    assert_true(d->plan.unknown);
    assert_int_equal(dt_commit(d), 1);
}

/* A multiple naming a twice-settled tag: the broker would refuse that tag,
 * so the ack goes out for the tags below it. */
static void test_multiple_naming_twice_settled(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 3);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 3, false, d->out, sizeof(d->out)),
                     FRAME_LEN);
    dt_begin(d, AMQP_SETTLE_ACK, 3, true, false);
    assert_int_equal(d->plan.n, 2);
    assert_int_equal(d->plan.n_swallowed, 1);
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {ACKM(2)};
    dt_expect(d->out, d->len, want, 1);
    assert_int_equal(amqp_ledger_outstanding(d->l), 0);
}

/* delivery-tag 0 with multiple: everything the client has outstanding. */
static void test_tag0_multiple(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 4);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 2, true, d->out, sizeof(d->out)),
                     FRAME_LEN);
    dt_begin(d, AMQP_SETTLE_ACK, 0, true, false);
    assert_int_equal(d->plan.n, 3);
    assert_int_equal(d->plan.n_swallowed, 1);
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {ACKM(4)}; /* 2 is settled at the broker already */
    dt_expect(d->out, d->len, want, 1);
    /* Nothing outstanding: the broker accepts it, forward it. */
    dt_begin(d, AMQP_SETTLE_ACK, 0, true, false);
    assert_false(d->plan.unknown);
    assert_int_equal(dt_commit(d), 1);
    /* With a held tag below, tag 0 multiple must not reach the broker as is. */
    dt_deliver(d, 5, 6);
    dt_begin(d, AMQP_SETTLE_ACK, 5, false, false);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    dt_begin(d, AMQP_SETTLE_ACK, 0, true, false);
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want2[] = {ACK1(6)};
    dt_expect(d->out, d->len, want2, 1);
    dt_begin(d, AMQP_SETTLE_ACK, 0, true, false);
    assert_int_equal(d->plan.n, 0);
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(d->len, 0);
    /* Tag 0 without multiple is unknown at both ends. */
    dt_begin(d, AMQP_SETTLE_ACK, 0, false, false);
    assert_true(d->plan.unknown);
    assert_int_equal(dt_commit(d), 1);
}

/* DESIGN "drop: never ack an unknown tag afterwards": a dropped ack stays
 * unsettled at the broker; a later multiple is split around it. */
static void test_dropped_ack_split_and_client_error(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 3);
    dt_begin(d, AMQP_SETTLE_ACK, 2, false, false);
    d->plan.tags[0].verdict = AMQP_V_DROP;
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(d->len, 0);
    dt_begin(d, AMQP_SETTLE_ACK, 3, true, false);
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {ACK1(1), ACK1(3)};
    dt_expect(d->out, d->len, want, 2);
    assert_int_equal(amqp_ledger_outstanding(d->l), 1);
    /* The client acks 2 again: without twice the broker would close the
     * channel; so it must now, and the lost ack's message is requeued. */
    dt_begin(d, AMQP_SETTLE_ACK, 2, false, false);
    assert_true(d->plan.unknown);
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want2[] = {REJQ(2), ACK1(2)};
    dt_expect(d->out, d->len, want2, 2);
    assert_int_equal(amqp_ledger_outstanding(d->l), 0);
}

/* A held nack, then the client settles the same tag again. */
static void test_held_then_client_error(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 2);
    dt_begin(d, AMQP_SETTLE_NACK, 1, false, true);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    dt_begin(d, AMQP_SETTLE_ACK, 1, true, false);
    assert_true(d->plan.unknown);
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {{AMQP_SETTLE_NACK, 1, false, true}, ACKM(1)};
    dt_expect(d->out, d->len, want, 2);
    uint64_t held[2];
    assert_int_equal(amqp_ledger_held(d->l, held, 2), 0);
    assert_int_equal(amqp_ledger_release(d->l, CHANNEL, 1, d->out, sizeof(d->out)), 0);
}

/* A.9 (2): a lost ack turned into a redelivery by twice's own reject. */
static void test_twice_settle_dropped_and_held(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 2);
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    d->plan.tags[0].verdict = AMQP_V_DROP;
    assert_int_equal(dt_commit(d), 0);
    dt_begin(d, AMQP_SETTLE_ACK, 2, false, false);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(amqp_ledger_outstanding(d->l), 2);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 1, true, d->out, sizeof(d->out)),
                     FRAME_LEN);
    assert_null(amqp_ledger_info(d->l, 1));
    /* A held ack past a visibility timeout: twice requeues the message, and the held frame,
     * which would come too late, is discarded. */
    assert_true(amqp_ledger_twice_settleable(d->l, 2));
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 2, true, d->out, sizeof(d->out)),
                     FRAME_LEN);
    const struct test_frame want[] = {REJQ(2)};
    dt_expect(d->out, FRAME_LEN, want, 1);
    assert_int_equal(amqp_ledger_outstanding(d->l), 0);
    assert_int_equal(amqp_ledger_held(d->l, NULL, 0), 0);
    assert_int_equal(amqp_ledger_release(d->l, CHANNEL, 2, d->out, sizeof(d->out)), 0);
    assert_null(amqp_ledger_info(d->l, 2));
}

/* What a drain and a shutdown read of a channel: the deliveries its consumer still works on, the
 * settlements twice holds or dropped (each by its tag and info, in order), the publishes awaiting
 * a confirm. */
struct kept_seen {
    uint64_t tags[8];
    bool held[8];
    size_t n;
};

static void note_kept(void *arg, uint64_t tag, void *info, bool held)
{
    struct kept_seen *k = arg;
    assert_int_equal(info_tag(info), tag);
    assert_true(k->n < 8);
    k->tags[k->n] = tag;
    k->held[k->n++] = held;
}

static void test_counts_and_kept(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 6);
    dt_begin(d, AMQP_SETTLE_ACK, 2, false, false);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    dt_begin(d, AMQP_SETTLE_ACK, 4, false, false);
    d->plan.tags[0].verdict = AMQP_V_DROP;
    assert_int_equal(dt_commit(d), 0);
    dt_begin(d, AMQP_SETTLE_ACK, 5, false, false);
    d->plan.tags[0].verdict = AMQP_V_HOLD;
    assert_int_equal(dt_commit(d), 0);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 6, true, d->out, sizeof(d->out)),
                     FRAME_LEN);
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    assert_int_equal(dt_commit(d), 1);
    struct amqp_ledger_counts c;
    amqp_ledger_counts(d->l, &c);
    /* 3 outstanding, 6 settled upstream by twice: the client still has both */
    assert_int_equal(c.client_unsettled, 2);
    assert_int_equal(c.held, 2);
    assert_int_equal(c.dropped, 1);
    assert_int_equal(c.unconfirmed, 0);
    struct kept_seen k = {.n = 0};
    amqp_ledger_each_kept(d->l, note_kept, &k);
    assert_int_equal(k.n, 3);
    assert_int_equal(k.tags[0], 2);
    assert_true(k.held[0]);
    assert_int_equal(k.tags[1], 4);
    assert_false(k.held[1]);
    assert_int_equal(k.tags[2], 5);
    assert_true(k.held[2]);
    /* released and settled: nothing kept */
    assert_int_equal(amqp_ledger_release(d->l, CHANNEL, 2, d->out, sizeof(d->out)), FRAME_LEN);
    assert_int_equal(amqp_ledger_release(d->l, CHANNEL, 5, d->out, sizeof(d->out)), FRAME_LEN);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 4, true, d->out, sizeof(d->out)),
                     FRAME_LEN);
    k.n = 0;
    amqp_ledger_each_kept(d->l, note_kept, &k);
    assert_int_equal(k.n, 0);
    amqp_ledger_confirm_mode(d->l);
    uint64_t seq = 0;
    assert_int_equal(amqp_ledger_publish(d->l, false, info_new(1, 0), &seq), 0);
    amqp_ledger_counts(d->l, &c);
    assert_int_equal(c.held + c.dropped, 0);
    assert_int_equal(c.client_unsettled, 2);
    assert_int_equal(c.unconfirmed, 1);
}

/* basic.reject has no multiple bit; basic.ack no requeue bit. */
static void test_flags_per_method(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 3);
    dt_begin(d, AMQP_SETTLE_REJECT, 3, true, true);
    assert_false(d->plan.multiple);
    assert_true(d->plan.requeue);
    assert_int_equal(d->plan.n, 1);
    assert_int_equal(dt_commit(d), 1);
    dt_begin(d, AMQP_SETTLE_ACK, 2, true, true);
    assert_false(d->plan.requeue);
    assert_int_equal(d->plan.n, 2);
    d->plan.tags[0].verdict = AMQP_V_REQUEUE;
    assert_int_equal(dt_commit(d), 0);
    const struct test_frame want[] = {REJQ(1), ACK1(2)};
    dt_expect(d->out, d->len, want, 2);
}

/* Unknown from the client's point of view, and at the broker too: forward. */
static void test_unknown_tags(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 2, 3);
    const uint64_t bad[] = {1, 4, 1000};
    for (size_t i = 0; i < 3; i++) {
        dt_begin(d, AMQP_SETTLE_ACK, bad[i], i == 2, false);
        assert_true(d->plan.unknown);
        assert_int_equal(d->plan.n, 0);
        assert_int_equal(dt_commit(d), 1);
    }
    assert_int_equal(amqp_ledger_outstanding(d->l), 2); /* nothing changed */
}

/* Too small a buffer changes nothing; the plan stays open. */
static void test_buffer_too_small(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 3);
    assert_int_equal(amqp_ledger_twice_settle(d->l, CHANNEL, 1, true, d->out, FRAME_LEN - 1),
                     AMQP_LEDGER_E_BUFFER);
    dt_begin(d, AMQP_SETTLE_ACK, 3, true, false);
    d->plan.tags[1].verdict = AMQP_V_REQUEUE;
    size_t len = 0;
    assert_int_equal(
        amqp_ledger_settle_commit(d->l, CHANNEL, &d->plan, d->out, 3 * FRAME_LEN - 1, &len),
        AMQP_LEDGER_E_BUFFER);
    assert_int_equal(amqp_ledger_outstanding(d->l), 3);
    assert_int_equal(
        amqp_ledger_settle_commit(d->l, CHANNEL, &d->plan, d->out, 3 * FRAME_LEN, &len), 0);
    const struct test_frame want[] = {ACK1(1), REJQ(2), ACK1(3)};
    dt_expect(d->out, len, want, 3);
    assert_true(3 * FRAME_LEN <= amqp_ledger_plan_space(&d->plan));
}

/* A plan is good for one commit, before anything else changes the ledger;
 * verdicts are checked. */
static void test_stale_plan_and_bad_verdict(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 1);
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    assert_non_null(amqp_ledger_info(d->l, 1)); /* read-only calls keep it open */
    dt_deliver(d, 2, 2);
    assert_int_equal(dt_commit(d), AMQP_LEDGER_E_STALE);
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    d->plan.tags[0].verdict = (enum amqp_verdict)9;
    assert_int_equal(dt_commit(d), AMQP_LEDGER_E_VERDICT);
    d->plan.tags[0].verdict = AMQP_V_PASS;
    assert_int_equal(dt_commit(d), 1);
    assert_int_equal(dt_commit(d), AMQP_LEDGER_E_STALE);
    assert_int_equal(amqp_ledger_confirm_begin(d->l, false, 1, false, &d->plan), 0);
    assert_int_equal(dt_commit(d), AMQP_LEDGER_E_STALE); /* a confirm plan */
    /* A plan overtaken by another begin, into another struct, is stale. */
    struct amqp_plan second;
    size_t len = 0;
    dt_begin(d, AMQP_SETTLE_ACK, 2, false, false);
    assert_int_equal(amqp_ledger_settle_begin(d->l, AMQP_SETTLE_ACK, 2, false, false, &second), 0);
    assert_int_equal(dt_commit(d), AMQP_LEDGER_E_STALE);
    assert_int_equal(amqp_ledger_settle_commit(d->l, CHANNEL, &second, d->out, 0, &len), 1);
    assert_string_equal(amqp_ledger_strerror(AMQP_LEDGER_E_STALE),
                        "plan is not the one the ledger has open");
    assert_string_equal(amqp_ledger_strerror(-99), "unknown error");
}

/* Tags must increase; reset restarts them, recover does not. */
static void test_order_reset_recover(void **state)
{
    struct dt *d = *state;
    uint64_t seq = 0;
    dt_deliver(d, 1, 2);
    assert_int_equal(amqp_ledger_deliver(d->l, 2, info_new(2, 0)), AMQP_LEDGER_E_ORDER);
    amqp_ledger_confirm_mode(d->l);
    assert_int_equal(amqp_ledger_publish(d->l, false, info_new(1, 0), &seq), 0);
    amqp_ledger_recover(d->l);
    assert_int_equal(amqp_ledger_outstanding(d->l), 0);
    assert_int_equal(amqp_ledger_deliver(d->l, 1, info_new(1, 0)), AMQP_LEDGER_E_ORDER);
    dt_deliver(d, 3, 3);
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 1, NULL), 1); /* confirms survive */
    amqp_ledger_reset(d->l);
    assert_false(amqp_ledger_in_confirm_mode(d->l));
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 1, NULL), 0);
    dt_deliver(d, 1, 1);
    assert_int_equal(amqp_ledger_outstanding(d->l), 1);
}

/* The named limit, crossed; and the ledger works without infos. */
static void test_limit(void **state)
{
    (void)state;
    struct amqp_ledger *l = amqp_ledger_new(NULL);
    assert_non_null(l);
    for (uint64_t t = 1; t <= AMQP_LEDGER_MAX_OUTSTANDING; t++)
        if (amqp_ledger_deliver(l, t, NULL) != 0)
            fail_msg("deliver %llu failed", (unsigned long long)t);
    assert_int_equal(amqp_ledger_deliver(l, AMQP_LEDGER_MAX_OUTSTANDING + 1, NULL),
                     AMQP_LEDGER_E_FULL);
    assert_int_equal(amqp_ledger_outstanding(l), AMQP_LEDGER_MAX_OUTSTANDING);
    struct amqp_plan plan;
    uint8_t out[FRAME_LEN];
    size_t len = 0;
    /* A multiple ack of all but the last, then room for one more. */
    assert_int_equal(amqp_ledger_settle_begin(l, AMQP_SETTLE_ACK, AMQP_LEDGER_MAX_OUTSTANDING - 1,
                                              true, false, &plan),
                     0);
    assert_int_equal(plan.n, AMQP_LEDGER_MAX_OUTSTANDING - 1);
    assert_int_equal(amqp_ledger_settle_commit(l, CHANNEL, &plan, out, sizeof(out), &len), 1);
    assert_int_equal(amqp_ledger_deliver(l, AMQP_LEDGER_MAX_OUTSTANDING + 2, NULL), 0);
    assert_int_equal(amqp_ledger_outstanding(l), 2);
    uint64_t seq = 0;
    amqp_ledger_confirm_mode(l);
    for (uint64_t i = 1; i <= AMQP_LEDGER_MAX_OUTSTANDING; i++)
        if (amqp_ledger_publish(l, false, NULL, &seq) != 0)
            fail_msg("publish %llu failed", (unsigned long long)i);
    assert_int_equal(amqp_ledger_publish(l, false, NULL, &seq), AMQP_LEDGER_E_FULL);
    assert_int_equal(seq, AMQP_LEDGER_MAX_OUTSTANDING + 1); /* numbering stays in step */
    amqp_ledger_free(l);
}

/* Many tags forgotten around one that stays (a dropped ack): lookups and
 * multiples stay right across compactions. */
static void test_compaction_around_stuck_tag(void **state)
{
    struct dt *d = *state;
    dt_deliver(d, 1, 1);
    dt_begin(d, AMQP_SETTLE_ACK, 1, false, false);
    d->plan.tags[0].verdict = AMQP_V_DROP;
    assert_int_equal(dt_commit(d), 0);
    for (uint64_t t = 2; t < 20000; t += 3) {
        dt_deliver(d, t, t + 1); /* t + 2: a no-ack delivery */
        dt_begin(d, AMQP_SETTLE_ACK, t, false, false);
        assert_int_equal(dt_commit(d), 1);
        assert_int_equal(info_tag(amqp_ledger_info(d->l, t + 1)), t + 1);
        assert_null(amqp_ledger_info(d->l, t));
        assert_null(amqp_ledger_info(d->l, t + 2));
    }
    assert_int_equal(amqp_ledger_outstanding(d->l), 1 + 6666);
    /* Tag 0 multiple would settle the dropped tag 1: 6666 single acks. */
    dt_begin(d, AMQP_SETTLE_ACK, 0, true, false);
    assert_int_equal(d->plan.n, 6666);
    assert_int_equal(dt_commit(d), AMQP_LEDGER_E_BUFFER);
    size_t cap = amqp_ledger_plan_space(&d->plan), len = 0;
    uint8_t *out = malloc(cap);
    assert_non_null(out);
    assert_int_equal(amqp_ledger_settle_commit(d->l, CHANNEL, &d->plan, out, cap, &len), 0);
    assert_int_equal(len, 6666 * FRAME_LEN);
    struct test_frame f;
    for (size_t i = 0; i < 6666; i++) {
        frame_decode(out + i * FRAME_LEN, &f);
        assert_int_equal(f.tag, 3 + 3 * i);
        assert_false(f.multiple);
    }
    free(out);
    assert_int_equal(amqp_ledger_outstanding(d->l), 1);
    assert_non_null(amqp_ledger_info(d->l, 1));
}

/* ---- directed confirm tests ---------------------------------------------------------------- */

static uint64_t dt_publish(struct dt *d, bool dropped)
{
    uint64_t seq = 0;
    assert_int_equal(amqp_ledger_publish(d->l, dropped, info_new(0, 0), &seq), 0);
    return seq;
}

static int dt_confirm(struct dt *d, bool nack, uint64_t seq, bool multiple, size_t drop_index)
{
    assert_int_equal(amqp_ledger_confirm_begin(d->l, nack, seq, multiple, &d->plan), 0);
    if (drop_index < d->plan.n)
        d->plan.tags[drop_index].verdict = AMQP_V_DROP;
    d->len = 12345;
    return amqp_ledger_confirm_commit(d->l, CHANNEL, &d->plan, d->out, sizeof(d->out), &d->len);
}

/* A dropped publish: the broker numbers behind the client, a multiple
 * confirm is translated and split around the number never confirmed. */
static void test_confirm_dropped_publish(void **state)
{
    struct dt *d = *state;
    amqp_ledger_confirm_mode(d->l);
    assert_int_equal(dt_publish(d, false), 1);
    assert_int_equal(dt_publish(d, false), 2);
    assert_int_equal(dt_publish(d, true), 3);
    assert_int_equal(dt_publish(d, false), 4);
    assert_int_equal(dt_publish(d, false), 5);
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 3, NULL), 4);
    assert_int_equal(dt_confirm(d, false, 2, true, SIZE_MAX), 1); /* below the drop: as is */
    assert_int_equal(dt_confirm(d, false, 4, true, SIZE_MAX), 0);
    assert_int_equal(d->plan.n, 2);
    const struct test_frame want[] = {ACK1(4), ACK1(5)};
    dt_expect(d->out, d->len, want, 2);
    /* A broker error (a number confirmed twice) is swallowed once numbers differ. */
    assert_int_equal(dt_confirm(d, false, 4, false, SIZE_MAX), 0);
    assert_true(d->plan.unknown);
    assert_int_equal(d->len, 0);
}

/* A dropped confirm stays owed forever: later multiples go out as singles. */
static void test_confirm_dropped_confirm(void **state)
{
    struct dt *d = *state;
    amqp_ledger_confirm_mode(d->l);
    for (int i = 0; i < 5; i++)
        (void)dt_publish(d, false);
    assert_int_equal(dt_confirm(d, true, 2, true, 1), 0); /* nack 1 2, drop 2's */
    const struct test_frame want[] = {{AMQP_SETTLE_NACK, 1, false, false}};
    dt_expect(d->out, d->len, want, 1);
    assert_int_equal(dt_confirm(d, false, 4, false, SIZE_MAX), 1); /* a single: as is */
    assert_int_equal(dt_confirm(d, false, 5, true, SIZE_MAX), 0);
    const struct test_frame want2[] = {ACK1(3), ACK1(5)};
    dt_expect(d->out, d->len, want2, 2);
}

/* A copy twice sent: the broker numbers ahead of the client; the copy's confirm goes nowhere,
 * later ones are translated, a multiple below the copy goes as is. */
static void test_confirm_copied_publish(void **state)
{
    struct dt *d = *state;
    amqp_ledger_confirm_mode(d->l);
    assert_int_equal(dt_publish(d, false), 1);           /* broker 1 */
    assert_int_equal(dt_publish(d, false), 2);           /* broker 2 */
    assert_int_equal(amqp_ledger_publish_copy(d->l), 0); /* broker 3: the copy of 2 */
    assert_int_equal(dt_publish(d, false), 3);           /* broker 4 */
    assert_int_equal(dt_publish(d, false), 4);           /* broker 5 */
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 3, NULL), 0);
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 4, NULL), 3);
    assert_int_equal(dt_confirm(d, false, 2, true, SIZE_MAX), 1);  /* below the copy: as is */
    assert_int_equal(dt_confirm(d, false, 3, false, SIZE_MAX), 0); /* the copy's: nothing */
    assert_int_equal(d->plan.n, 0);
    assert_int_equal(d->len, 0);
    assert_int_equal(dt_confirm(d, false, 5, true, SIZE_MAX), 0); /* broker 4-5: client 3-4 */
    assert_int_equal(d->plan.n, 2);
    const struct test_frame want[] = {{AMQP_SETTLE_ACK, 4, true, false}};
    dt_expect(d->out, d->len, want, 1);
    /* A copy inside a multiple: swallowed with it. */
    assert_int_equal(dt_publish(d, false), 5);           /* broker 6 */
    assert_int_equal(amqp_ledger_publish_copy(d->l), 0); /* broker 7 */
    assert_int_equal(dt_publish(d, false), 6);           /* broker 8 */
    assert_int_equal(dt_confirm(d, true, 8, true, SIZE_MAX), 0);
    const struct test_frame want2[] = {{AMQP_SETTLE_NACK, 6, true, false}};
    dt_expect(d->out, d->len, want2, 1);
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 7, NULL), 0);
    /* Numbers differ: an unknown confirm is swallowed. */
    assert_int_equal(dt_confirm(d, false, 8, false, SIZE_MAX), 0);
    assert_true(d->plan.unknown);
    assert_int_equal(d->len, 0);
    /* Outside confirm mode a copy is nothing. */
    amqp_ledger_reset(d->l);
    assert_int_equal(amqp_ledger_publish_copy(d->l), 0);
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 1, NULL), 0);
}

/* Without drops every confirm is forwarded, unknown ones included. */
static void test_confirm_transparent(void **state)
{
    struct dt *d = *state;
    amqp_ledger_confirm_mode(d->l);
    for (int i = 0; i < 4; i++)
        (void)dt_publish(d, false);
    assert_int_equal(dt_confirm(d, false, 3, true, SIZE_MAX), 1);
    assert_int_equal(d->plan.n, 3);
    assert_int_equal(dt_confirm(d, false, 3, false, SIZE_MAX), 1);
    assert_true(d->plan.unknown);
    assert_int_equal(dt_confirm(d, false, 9, true, SIZE_MAX), 1);
    assert_true(d->plan.unknown);
    assert_int_equal(dt_confirm(d, true, 4, false, SIZE_MAX), 1);
    assert_int_equal(amqp_ledger_confirm_seq(d->l, 4, NULL), 0);
}

int main(void)
{
#define DT(f) cmocka_unit_test_setup_teardown(f, dt_setup, dt_teardown)
    const struct CMUnitTest tests[] = {
        DT(test_frame_bytes),
        DT(test_multiple_split_around_held),
        DT(test_multiple_split_around_requeue),
        DT(test_multiple_all_pass_forwarded),
        DT(test_twice_settled_ack_swallowed),
        DT(test_multiple_naming_twice_settled),
        DT(test_tag0_multiple),
        DT(test_dropped_ack_split_and_client_error),
        DT(test_held_then_client_error),
        DT(test_twice_settle_dropped_and_held),
        DT(test_counts_and_kept),
        DT(test_flags_per_method),
        DT(test_unknown_tags),
        DT(test_buffer_too_small),
        DT(test_stale_plan_and_bad_verdict),
        DT(test_order_reset_recover),
        DT(test_compaction_around_stuck_tag),
        DT(test_confirm_dropped_publish),
        DT(test_confirm_dropped_confirm),
        DT(test_confirm_transparent),
        DT(test_confirm_copied_publish),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_model_deliveries),
        cmocka_unit_test(test_model_confirms),
    };
#undef DT
    return cmocka_run_group_tests(tests, NULL, NULL);
}
