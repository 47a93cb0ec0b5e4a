/*
 * fuzz_ledger.c - libFuzzer harness for the AMQP delivery-tag and publisher-confirm ledger
 * (proto/amqp/amqp_ledger.c), checked against a model.  Not part of the default build
 * (scripts/fuzz.sh builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_ledger.c proto/amqp/amqp_*.c \
 *         -o fuzz_ledger
 *
 * The input is a program: each byte picks an operation of one channel (a delivery, a client's
 * ack/nack/reject with its verdicts, twice's own reject, a release of a held ack, a channel
 * close, basic.recover, confirm.select, a publish, a broker's confirm) and the next bytes its
 * arguments.  Between the ledger and the frames it writes stand a simulated RabbitMQ channel
 * (collect_acks: an unknown or settled tag closes the channel) and a simulated client, as in
 * tests/unit/proto/test_amqp_ledger.c, but driven by coverage instead of a seed.  There is no traffic
 * to seed it from: tests/fuzz/corpus/ledger/ holds a few long programs it found itself.
 *
 * Invariants are checked with abort(): every plan lists exactly the tags the frame means from
 * the client's point of view; the broker never sees an unknown tag except for the client's own
 * error, and then sees exactly that error; every verdict settles upstream what it says and
 * nothing else; a confirm reaches the client once, only for a publish it made and twice did not
 * drop, and a `multiple` never confirms a number that must stay unconfirmed; the counters, the
 * held list and the infos agree with the model; every info is freed exactly once.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_ledger.h"

/* Tags, and publish numbers, one simulated channel uses before it is closed. */
#define FZ_MAX 256u
#define FZ_CHANNEL 3u
/* Output room: a frame per tag, two for an unknown plan. */
#define FZ_OUT_CAP (AMQP_LEDGER_FRAME_LEN * (FZ_MAX + 2))

/* Failed invariants name themselves: the reproducer's log says which one. */
#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

struct fz_info {
    uint64_t key; /* delivery tag, or client publish number */
};

static long fz_infos; /* infos given to the ledger and not freed yet */

static void *info_new(uint64_t key)
{
    struct fz_info *i = malloc(sizeof(*i));
    CHECK(i != NULL);
    i->key = key;
    fz_infos++;
    return i;
}

static void info_free(void *p)
{
    CHECK(p != NULL && fz_infos > 0);
    fz_infos--;
    free(p);
}

static uint64_t info_key(const void *p)
{
    CHECK(p != NULL);
    return ((const struct fz_info *)p)->key;
}

/* What a settlement does: 1 + kind * 2 + requeue (0: nothing). */
static uint8_t code_of(enum amqp_settle_kind kind, bool requeue)
{
    return (uint8_t)(1 + (unsigned)kind * 2 + (requeue ? 1 : 0));
}

/* Confirm states of a client publish number. */
enum { C_NONE = 0, C_WAITING, C_NEVER };

struct fz {
    struct amqp_ledger *l;
    const uint8_t *in;
    size_t left;
    /* deliveries: the broker, the client, what twice keeps */
    uint64_t next_tag;
    uint8_t unacked[FZ_MAX]; /* broker: unsettled */
    uint8_t pending[FZ_MAX]; /* client: delivered, not settled by it */
    uint8_t held[FZ_MAX];    /* code of the settlement twice holds */
    uint8_t dropped[FZ_MAX]; /* twice lost the client's settlement */
    uint8_t settled[FZ_MAX]; /* code the broker settled it with in the current step */
    /* confirms */
    bool confirm_mode;
    bool any_dropped; /* a publish or a confirm dropped, or a publish copied, since the last
                         close: the client's numbers and the broker's may differ */
    uint64_t client_seq, broker_seq;
    uint64_t client_of[FZ_MAX]; /* broker number -> client number, 0 once confirmed */
    uint8_t copy_at[FZ_MAX];    /* broker number of a copy twice sent, until confirmed */
    uint8_t wait[FZ_MAX];       /* client number -> C_* */
    uint8_t out[FZ_OUT_CAP];
};

static uint8_t next_byte(struct fz *s)
{
    if (s->left == 0)
        return 0;
    s->left--;
    return *s->in++;
}

/* ---- frames --------------------------------------------------------------------------- */

struct fz_frame {
    enum amqp_settle_kind kind;
    uint64_t tag;
    bool multiple, requeue;
};

/* Decodes the ledger's output with the AMQP codec: 21-byte ack/nack/reject frames only. */
static size_t frames_decode(const uint8_t *p, size_t len, struct fz_frame *f, size_t max)
{
    size_t n = 0;
    CHECK(len % AMQP_LEDGER_FRAME_LEN == 0);
    for (size_t off = 0; off < len; off += AMQP_LEDGER_FRAME_LEN) {
        struct amqp_frame fr;
        struct amqp_method m;
        CHECK(n < max);
        CHECK(amqp_frame_parse(p + off, AMQP_LEDGER_FRAME_LEN, 0, &fr) == 1);
        CHECK(fr.type == AMQP_FRAME_METHOD && fr.channel == FZ_CHANNEL);
        CHECK(amqp_method_decode(fr.payload, fr.size, &m) == 0 && m.decoded);
        if (m.id == AMQP_BASIC_ACK)
            f[n].kind = AMQP_SETTLE_ACK;
        else if (m.id == AMQP_BASIC_NACK)
            f[n].kind = AMQP_SETTLE_NACK;
        else if (m.id == AMQP_BASIC_REJECT)
            f[n].kind = AMQP_SETTLE_REJECT;
        else
            CHECK(!"an ack, a nack or a reject");
        f[n].tag = m.ack.delivery_tag;
        f[n].multiple = m.ack.multiple;
        f[n].requeue = m.ack.requeue;
        n++;
    }
    return n;
}

/* ---- the broker's channel and the client -------------------------------------------------- */

/* RabbitMQ's collect_acks for one frame; false when it closes the channel (406). */
static bool broker_frame(struct fz *s, const struct fz_frame *f)
{
    bool all = f->multiple && f->tag == 0;
    if (!all && (f->tag == 0 || f->tag >= s->next_tag || !s->unacked[f->tag]))
        return false;
    uint64_t hi = all ? s->next_tag - 1 : f->tag;
    for (uint64_t t = f->multiple ? 1 : f->tag; t <= hi; t++) {
        if (s->unacked[t]) {
            s->unacked[t] = 0;
            s->settled[t] = code_of(f->kind, f->requeue);
        }
    }
    return true;
}

/* The channel closes (either side): the broker requeues, numbering restarts, the ledger is
 * reset. */
static void channel_close(struct fz *s)
{
    amqp_ledger_reset(s->l);
    memset(s->unacked, 0, sizeof(s->unacked));
    memset(s->pending, 0, sizeof(s->pending));
    memset(s->held, 0, sizeof(s->held));
    memset(s->dropped, 0, sizeof(s->dropped));
    memset(s->client_of, 0, sizeof(s->client_of));
    memset(s->copy_at, 0, sizeof(s->copy_at));
    memset(s->wait, 0, sizeof(s->wait));
    s->next_tag = 1;
    s->confirm_mode = s->any_dropped = false;
    s->client_seq = s->broker_seq = 0;
}

/* A tag to name: 0, the lowest or highest the client has pending, or any. */
static uint64_t pick_tag(struct fz *s)
{
    uint8_t b = next_byte(s);
    uint64_t lo = 0, hi = 0;
    for (uint64_t t = 1; t < s->next_tag; t++) {
        if (s->pending[t]) {
            lo = lo == 0 ? t : lo;
            hi = t;
        }
    }
    switch (b % 8) {
    case 0:
        return 0;
    case 1:
    case 2:
        return lo;
    case 3:
        return hi;
    default:
        return b % (s->next_tag + 1);
    }
}

/* ---- consistency ------------------------------------------------------------------------ */

static void check_state(struct fz *s)
{
    size_t out = 0, held = 0;
    uint64_t held_tags[FZ_MAX];
    for (uint64_t t = 1; t < s->next_tag; t++) {
        out += s->unacked[t];
        held += s->held[t] != 0;
        bool recorded = s->unacked[t] || s->pending[t];
        void *info = amqp_ledger_info(s->l, t);
        CHECK(recorded ? info != NULL && info_key(info) == t : info == NULL);
    }
    CHECK(amqp_ledger_outstanding(s->l) == out);
    CHECK(amqp_ledger_held(s->l, held_tags, FZ_MAX) == held);
    for (size_t k = 0; k < held; k++)
        CHECK(held_tags[k] < s->next_tag && s->held[held_tags[k]] != 0 &&
              (k == 0 || held_tags[k] > held_tags[k - 1]));
    for (uint64_t b = 1; b <= s->broker_seq; b++) {
        void *info = NULL;
        CHECK(amqp_ledger_confirm_seq(s->l, b, &info) == s->client_of[b]);
        CHECK(s->client_of[b] == 0 ? info == NULL : info_key(info) == s->client_of[b]);
    }
    CHECK(amqp_ledger_in_confirm_mode(s->l) == s->confirm_mode);
}

/* ---- deliveries ------------------------------------------------------------------------- */

static void op_deliver(struct fz *s)
{
    uint8_t b = next_byte(s);
    if ((b & 0x80) && s->next_tag > 1) {
        /* The broker never does this; the ledger refuses it and takes the info anyway. */
        long before = fz_infos;
        CHECK(amqp_ledger_deliver(s->l, s->next_tag - 1 - b % s->next_tag, info_new(0)) ==
              AMQP_LEDGER_E_ORDER);
        CHECK(fz_infos == before);
        return;
    }
    uint64_t tag = s->next_tag + (b & 3); /* no-ack deliveries leave gaps */
    if (tag >= FZ_MAX) {
        channel_close(s);
        tag = 1;
    }
    CHECK(amqp_ledger_deliver(s->l, tag, info_new(tag)) == AMQP_LEDGER_OK);
    s->next_tag = tag + 1;
    s->unacked[tag] = s->pending[tag] = 1;
}

/* Is t in what the client's frame settles, from the client's point of view? */
static bool client_covers(const struct fz *s, const struct amqp_plan *p, uint64_t t)
{
    if (!s->pending[t])
        return false;
    return p->multiple ? p->tag == 0 || t <= p->tag : t == p->tag;
}

static void check_settle_plan(const struct fz *s, const struct amqp_plan *p)
{
    bool known = (p->multiple && p->tag == 0) || (p->tag < s->next_tag && s->pending[p->tag]);
    CHECK(p->unknown == !known);
    if (p->unknown)
        return;
    size_t k = 0, swallowed = 0;
    for (uint64_t t = 1; t < s->next_tag; t++) {
        if (!client_covers(s, p, t))
            continue;
        if (!s->unacked[t]) {
            swallowed++;
            continue;
        }
        CHECK(k < p->n && p->tags[k].tag == t && info_key(p->tags[k].info) == t);
        CHECK(p->tags[k].verdict == AMQP_V_PASS);
        k++;
    }
    CHECK(p->n == k && p->n_swallowed == swallowed);
}

/* Commits with a buffer that may be too small, then with enough. */
static int commit(struct fz *s, struct amqp_plan *p, bool confirm, size_t *len)
{
    uint8_t b = next_byte(s);
    size_t space = amqp_ledger_plan_space(p);
    CHECK(space <= FZ_OUT_CAP);
    int rc;
    if (b % 4 == 0) {
        size_t cap = b % (space + 1);
        rc = confirm ? amqp_ledger_confirm_commit(s->l, FZ_CHANNEL, p, s->out, cap, len)
                     : amqp_ledger_settle_commit(s->l, FZ_CHANNEL, p, s->out, cap, len);
        if (rc != AMQP_LEDGER_E_BUFFER)
            return rc;
        CHECK(cap < space);
    }
    return confirm ? amqp_ledger_confirm_commit(s->l, FZ_CHANNEL, p, s->out, space, len)
                   : amqp_ledger_settle_commit(s->l, FZ_CHANNEL, p, s->out, space, len);
}

/* Verdicts from the input, mostly PASS; a bad one must be refused, and is then undone. */
static void set_verdicts(struct fz *s, struct amqp_plan *p, bool confirm)
{
    for (size_t i = 0; i < p->n; i++) {
        uint8_t b = next_byte(s);
        enum amqp_verdict v = b < 128 ? AMQP_V_PASS : (enum amqp_verdict)(b % 4);
        if (confirm && v != AMQP_V_PASS)
            v = AMQP_V_DROP;
        p->tags[i].verdict = v;
    }
    if (p->n > 0 && next_byte(s) == 0xff) {
        enum amqp_verdict keep = p->tags[0].verdict;
        size_t len = 0;
        p->tags[0].verdict = confirm ? AMQP_V_HOLD : (enum amqp_verdict)7;
        int rc = confirm ? amqp_ledger_confirm_commit(s->l, FZ_CHANNEL, p, s->out, FZ_OUT_CAP, &len)
                         : amqp_ledger_settle_commit(s->l, FZ_CHANNEL, p, s->out, FZ_OUT_CAP, &len);
        CHECK(rc == AMQP_LEDGER_E_VERDICT);
        p->tags[0].verdict = keep;
    }
}

/* What the broker must have settled for a known plan: PASS as the client asked, REQUEUE as a
 * reject, HOLD and DROP nothing; and nothing outside the plan. */
static void check_settled(const struct fz *s, const struct amqp_plan *p)
{
    uint8_t want[FZ_MAX] = {0};
    for (size_t i = 0; i < p->n; i++) {
        enum amqp_verdict v = p->tags[i].verdict;
        if (v == AMQP_V_PASS)
            want[p->tags[i].tag] = code_of(p->kind, p->requeue);
        else if (v == AMQP_V_REQUEUE)
            want[p->tags[i].tag] = code_of(AMQP_SETTLE_REJECT, true);
    }
    CHECK(memcmp(want, s->settled, sizeof(want)) == 0);
}

/* Feeds what twice sends upstream; returns false when the channel closed on the last frame. */
static bool broker_feed(struct fz *s, const struct fz_frame *f, size_t n, bool error_last)
{
    memset(s->settled, 0, sizeof(s->settled));
    for (size_t i = 0; i < n; i++) {
        bool ok = broker_frame(s, &f[i]);
        if (error_last && i == n - 1) {
            CHECK(!ok);
            return false;
        }
        CHECK(ok);
        CHECK(error_last || i == 0 || f[i].tag > f[i - 1].tag);
    }
    return true;
}

static void settle_update_model(struct fz *s, const struct amqp_plan *p)
{
    for (uint64_t t = 1; t < s->next_tag; t++)
        if (client_covers(s, p, t))
            s->pending[t] = 0;
    for (size_t i = 0; i < p->n; i++) {
        uint64_t t = p->tags[i].tag;
        if (p->tags[i].verdict == AMQP_V_HOLD)
            s->held[t] = code_of(p->kind, p->requeue);
        else if (p->tags[i].verdict == AMQP_V_DROP)
            s->dropped[t] = 1;
    }
}

static void op_client_settle(struct fz *s)
{
    uint8_t b = next_byte(s);
    enum amqp_settle_kind kind = (enum amqp_settle_kind)(b % 3);
    uint64_t tag = pick_tag(s);
    struct amqp_plan p;
    if (kind == AMQP_SETTLE_ACK && !(b & 4) && (b & 16)) {
        /* The plan-less ack (no rule on acks): exactly an outstanding tag, its frame as is. */
        bool live = tag > 0 && tag < s->next_tag;
        bool out = live && s->unacked[tag] && s->pending[tag] && !s->held[tag] && !s->dropped[tag];
        CHECK(amqp_ledger_ack_one(s->l, tag) == out);
        if (out) {
            struct fz_frame f = {AMQP_SETTLE_ACK, tag, false, false};
            CHECK(broker_feed(s, &f, 1, false));
            CHECK(s->settled[tag] == code_of(AMQP_SETTLE_ACK, false));
            s->pending[tag] = 0;
            return;
        }
    }
    CHECK(amqp_ledger_settle_begin(s->l, kind, tag, b & 4, b & 8, &p) == AMQP_LEDGER_OK);
    CHECK(p.kind == kind && p.tag == tag);
    CHECK(p.multiple == ((b & 4) && kind != AMQP_SETTLE_REJECT));
    CHECK(p.requeue == ((b & 8) && kind != AMQP_SETTLE_ACK));
    check_settle_plan(s, &p);
    set_verdicts(s, &p, false);
    size_t len = 99;
    int rc = commit(s, &p, false, &len);
    struct fz_frame f[FZ_MAX + 2];
    size_t n = 0;
    if (rc == 1) {
        CHECK(len == 0);
        f[n++] = (struct fz_frame){p.kind, p.tag, p.multiple, p.requeue};
    } else {
        CHECK(rc == 0);
        n = frames_decode(s->out, len, f, FZ_MAX + 2);
        CHECK(!p.unknown || n == 2);
    }
    if (!broker_feed(s, f, n, p.unknown)) {
        /* The client's own error, and the broker saw exactly that frame. */
        CHECK(f[n - 1].tag == p.tag && f[n - 1].kind == p.kind);
        channel_close(s);
        return;
    }
    CHECK(!p.unknown);
    check_settled(s, &p);
    settle_update_model(s, &p);
}

static void op_twice_settle(struct fz *s)
{
    uint8_t b = next_byte(s);
    uint64_t t = pick_tag(s);
    bool live = t > 0 && t < s->next_tag;
    bool settleable = live && s->unacked[t] && (s->pending[t] || s->dropped[t] || s->held[t]);
    size_t cap = (b & 2) ? b % AMQP_LEDGER_FRAME_LEN : FZ_OUT_CAP;
    int rc = amqp_ledger_twice_settle(s->l, FZ_CHANNEL, t, b & 1, s->out, cap);
    if (!settleable) {
        CHECK(rc == 0);
        return;
    }
    if (cap < AMQP_LEDGER_FRAME_LEN) {
        CHECK(rc == AMQP_LEDGER_E_BUFFER);
        return;
    }
    CHECK(rc == (int)AMQP_LEDGER_FRAME_LEN);
    struct fz_frame f;
    CHECK(frames_decode(s->out, (size_t)rc, &f, 1) == 1);
    CHECK(f.kind == AMQP_SETTLE_REJECT && f.tag == t && f.requeue == (b & 1));
    CHECK(broker_feed(s, &f, 1, false));
    s->dropped[t] = 0;
    s->held[t] = 0; /* a held settlement is discarded: its release writes nothing */
}

static void op_release(struct fz *s)
{
    uint8_t b = next_byte(s);
    uint64_t t = b % (s->next_tag + 1);
    for (uint64_t k = t; k < s->next_tag; k++) {
        if (s->held[k]) {
            t = k; /* the next held tag, when there is one */
            break;
        }
    }
    bool held = t > 0 && t < s->next_tag && s->held[t];
    int rc = amqp_ledger_release(s->l, FZ_CHANNEL, t, s->out, FZ_OUT_CAP);
    if (!held) {
        CHECK(rc == 0);
        return;
    }
    CHECK(rc == (int)AMQP_LEDGER_FRAME_LEN);
    struct fz_frame f;
    CHECK(frames_decode(s->out, (size_t)rc, &f, 1) == 1);
    CHECK(f.tag == t && !f.multiple && code_of(f.kind, f.requeue) == s->held[t]);
    CHECK(broker_feed(s, &f, 1, false));
    s->held[t] = 0;
}

/* basic.recover: unsettled messages go back, every tag is void, numbering goes on. */
static void op_recover(struct fz *s)
{
    amqp_ledger_recover(s->l);
    memset(s->unacked, 0, sizeof(s->unacked));
    memset(s->pending, 0, sizeof(s->pending));
    memset(s->held, 0, sizeof(s->held));
    memset(s->dropped, 0, sizeof(s->dropped));
}

/* ---- publisher confirms ----------------------------------------------------------------- */

static void op_publish(struct fz *s)
{
    uint8_t b = next_byte(s);
    bool dropped = b & 1, copied = !dropped && (b & 2);
    if (s->confirm_mode && (s->client_seq + 1 >= FZ_MAX || s->broker_seq + 2 >= FZ_MAX))
        channel_close(s);
    uint64_t seq = 99;
    CHECK(amqp_ledger_publish(s->l, dropped, info_new(s->client_seq + 1), &seq) == 0);
    if (!s->confirm_mode) {
        CHECK(seq == 0);
        return;
    }
    CHECK(seq == ++s->client_seq);
    if (dropped) {
        s->wait[seq] = C_NEVER;
        s->any_dropped = true;
        return;
    }
    s->wait[seq] = C_WAITING;
    s->client_of[++s->broker_seq] = seq;
    if (copied) {
        /* A `duplicate`: the broker numbers the copy next; the client knows nothing of it. */
        CHECK(amqp_ledger_publish_copy(s->l) == 0);
        s->copy_at[++s->broker_seq] = 1;
        s->any_dropped = true;
    }
}

static uint64_t pick_seq(struct fz *s)
{
    uint8_t b = next_byte(s);
    uint64_t lo = 0;
    for (uint64_t k = 1; k <= s->broker_seq && lo == 0; k++)
        lo = s->client_of[k] != 0 || s->copy_at[k] ? k : 0;
    switch (b % 4) {
    case 0:
        return lo;
    case 1:
        return s->broker_seq;
    default:
        return b % (s->broker_seq + 2);
    }
}

static void check_confirm_plan(const struct fz *s, const struct amqp_plan *p)
{
    bool known = p->multiple ? p->tag > 0 && p->tag <= s->broker_seq
                             : p->tag > 0 && p->tag <= s->broker_seq &&
                                   (s->client_of[p->tag] || s->copy_at[p->tag]);
    CHECK(p->unknown == !known);
    if (p->unknown)
        return;
    size_t k = 0;
    for (uint64_t b = p->multiple ? 1 : p->tag; b <= p->tag; b++) {
        if (s->client_of[b] == 0)
            continue;
        CHECK(k < p->n && p->tags[k].tag == s->client_of[b]);
        CHECK(info_key(p->tags[k].info) == s->client_of[b]);
        k++;
    }
    CHECK(p->n == k);
}

/* The client takes the confirms it is sent: each names numbers it waits for, that the plan
 * passes, once; a `multiple` covers no number that must stay unconfirmed. */
static void client_feed(struct fz *s, const struct amqp_plan *p, const struct fz_frame *f, size_t n)
{
    uint8_t pass[FZ_MAX] = {0};
    for (size_t i = 0; i < p->n; i++)
        if (p->tags[i].verdict == AMQP_V_PASS)
            pass[p->tags[i].tag] = 1;
    for (size_t i = 0; i < n; i++) {
        CHECK(f[i].kind == p->kind && !f[i].requeue && f[i].tag > 0 && f[i].tag < FZ_MAX);
        for (uint64_t t = f[i].multiple ? 1 : f[i].tag; t <= f[i].tag; t++) {
            if (s->wait[t] == C_NONE && f[i].multiple)
                continue;
            CHECK(s->wait[t] == C_WAITING && pass[t]);
            s->wait[t] = C_NONE;
            pass[t] = 0;
        }
    }
    for (uint64_t t = 0; t < FZ_MAX; t++)
        CHECK(!pass[t]);
}

static void op_confirm(struct fz *s)
{
    uint8_t b = next_byte(s);
    uint64_t seq = pick_seq(s);
    struct amqp_plan p;
    CHECK(amqp_ledger_confirm_begin(s->l, b & 1, seq, b & 2, &p) == AMQP_LEDGER_OK);
    CHECK(p.kind == ((b & 1) ? AMQP_SETTLE_NACK : AMQP_SETTLE_ACK) && p.tag == seq);
    check_confirm_plan(s, &p);
    set_verdicts(s, &p, true);
    size_t len = 99;
    int rc = commit(s, &p, true, &len);
    CHECK(rc == 0 || rc == 1);
    if (p.unknown) {
        /* Passed on only while the numbers agree; the client's business then. */
        CHECK(rc == (s->any_dropped ? 0 : 1) && len == 0);
        return;
    }
    struct fz_frame f[FZ_MAX];
    size_t n = 0;
    if (rc == 1) {
        CHECK(len == 0);
        f[n++] = (struct fz_frame){p.kind, p.tag, p.multiple, false};
    } else {
        n = frames_decode(s->out, len, f, FZ_MAX);
    }
    client_feed(s, &p, f, n);
    for (size_t i = 0; i < p.n; i++) {
        if (p.tags[i].verdict == AMQP_V_DROP) {
            s->wait[p.tags[i].tag] = C_NEVER;
            s->any_dropped = true;
        }
    }
    for (uint64_t k = p.multiple ? 1 : p.tag; k <= p.tag; k++)
        s->client_of[k] = s->copy_at[k] = 0;
}

/* ---- driver ----------------------------------------------------------------------------- */

/* Steps between full consistency checks (each looks at every tag); the last step is checked
 * too. */
#define FZ_CHECK_EVERY 8u

static void step(struct fz *s, size_t i)
{
    switch (next_byte(s) % 12) {
    case 0:
    case 1:
    case 2:
        op_deliver(s);
        break;
    case 3:
    case 4:
    case 5:
        op_client_settle(s);
        break;
    case 6:
        op_twice_settle(s);
        break;
    case 7:
        op_release(s);
        break;
    case 8:
        if (next_byte(s) % 4 == 0)
            channel_close(s);
        else
            op_recover(s);
        break;
    case 9:
        amqp_ledger_confirm_mode(s->l);
        s->confirm_mode = true;
        break;
    case 10:
        op_publish(s);
        break;
    default:
        op_confirm(s);
        break;
    }
    if (i % FZ_CHECK_EVERY == 0 || s->left == 0)
        check_state(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fz s;
    memset(&s, 0, sizeof(s));
    s.in = data;
    s.left = size;
    s.next_tag = 1;
    s.l = amqp_ledger_new(info_free);
    CHECK(s.l != NULL);
    for (size_t i = 1; s.left > 0; i++)
        step(&s, i);
    amqp_ledger_free(s.l);
    CHECK(fz_infos == 0);
    return 0;
}
