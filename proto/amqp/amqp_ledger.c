/*
 * amqp_ledger.c - the per-channel ledger of delivery tags and publish
 * sequence numbers (amqp_ledger.h says what it guarantees).
 *
 * Storage.  Deliveries (keyed by delivery tag) and unconfirmed publishes
 * (keyed by broker sequence number) each live in a struct ledger_queue: an
 * array of entries sorted by key between `head` and `tail`.  New keys only
 * arrive at the tail, in increasing order.  Forgetting an entry leaves a
 * tombstone that keeps its key, so the array stays sorted; tombstones at the
 * front are popped at once, those in the middle are squeezed out once they
 * outnumber the live entries.  Every scan is therefore O(live) and memory
 * O(peak live), amortised.
 *
 * Why not an array indexed by `tag - lowest tag`: tags have gaps (a no-ack
 * delivery takes a tag too) and a settlement twice dropped keeps its tag at
 * the front until the channel closes, so on a long-lived channel the span
 * lowest..highest tag grows without bound while the live entries do not.
 * Lookup first tries the dense guess `head + (tag - front tag)`, exact as
 * long as there was no gap and no compaction, then binary-searches: O(1) in
 * the common case, O(log live) at worst.  A multiple ack scans the entries
 * it covers.
 *
 * Commits work in two passes over an unchanged ledger: emit the frames
 * (counting bytes past `cap` without writing them), and only when they fit,
 * apply the state changes.  A delivery's state changes in one function,
 * tag_set_state(), which keeps the counters.
 *
 * Frames come from proto/amqp/amqp.h's encoders (amqp_encode_basic_*).
 */
#include "proto/amqp/amqp_ledger.h"

#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"

/* Entries allocated when a queue first grows. */
#define LEDGER_QUEUE_MIN_CAP 64u
/* Tombstones tolerated in the middle beyond the live count before compacting. */
#define LEDGER_COMPACT_SLACK 32u
/* queue_find() found nothing. */
#define LEDGER_NONE SIZE_MAX
/* No tag / sequence number blocks a `multiple`. */
#define LEDGER_NO_BARRIER UINT64_MAX

enum ledger_state {
    LS_DEAD = 0,      /* forgotten: a tombstone */
    LS_OUTSTANDING,   /* unsettled at both ends */
    LS_HELD,          /* client settled, twice holds the frame, broker unsettled */
    LS_TWICE_SETTLED, /* twice rejected it upstream, the client has not settled it */
    LS_DROPPED,       /* client settled, twice dropped the frame, broker unsettled */
    LS_UNCONFIRMED,   /* a forwarded publish awaiting the broker's confirm */
    LS_COUNT,
};

struct ledger_entry {
    uint64_t key; /* delivery tag, or broker publish sequence number */
    uint64_t aux; /* publishes: the client sequence number */
    void *info;
    uint8_t state;   /* enum ledger_state */
    uint8_t kind;    /* held settlement: enum amqp_settle_kind */
    uint8_t requeue; /* held settlement */
};

struct ledger_queue {
    struct ledger_entry *v;
    size_t head, tail, cap;
    size_t n_dead; /* tombstones in [head, tail) */
};

enum ledger_plan_use { PLAN_NONE = 0, PLAN_SETTLE, PLAN_CONFIRM };

struct amqp_ledger {
    void (*free_info)(void *info);
    struct ledger_queue tags; /* deliveries */
    uint64_t last_tag;        /* highest tag recorded since the last reset */
    size_t n_state[LS_COUNT]; /* deliveries per state */
    struct ledger_queue pubs; /* unconfirmed forwarded publishes */
    bool confirm_mode;
    uint64_t client_seq, broker_seq; /* last numbers given out */
    /* Lowest client sequence number that will never be confirmed (a dropped
     * publish or a dropped confirm): no `multiple` may reach past it. */
    uint64_t confirm_barrier;
    /* Lowest broker sequence number of a copy twice sent: from there on the broker's numbers
     * run ahead of the client's, and no broker confirm is the client's as it stands. */
    uint64_t copies_from;
    struct amqp_plan_tag *scratch; /* plan->tags */
    size_t scratch_cap;
    enum ledger_plan_use plan_use; /* which plan is open, if any */
    uint64_t plan_id;              /* counts begins: the open plan's id */
    /* Open settle plan: lowest held or dropped tag it covers, which no
     * `multiple` frame may reach. */
    uint64_t plan_barrier;
};

/* What a commit writes for one plan tag. */
struct ledger_action {
    bool settles; /* false: nothing now (held or dropped) */
    enum amqp_settle_kind kind;
    bool requeue;
};

/* Where frames go: bytes past `cap` are counted, not written. */
struct ledger_sink {
    uint8_t *out;
    size_t cap;
    size_t len;
};

const char *amqp_ledger_strerror(int status)
{
    switch (status) {
#define AMQP_LEDGER_STATUS_STR(name, code, str)                                                    \
    case code:                                                                                     \
        return str;
        AMQP_LEDGER_ERRORS(AMQP_LEDGER_STATUS_STR)
#undef AMQP_LEDGER_STATUS_STR
    }
    return "unknown error";
}

/* ---- queue ---------------------------------------------------------------- */

static size_t queue_live(const struct ledger_queue *q)
{
    return q->tail - q->head - q->n_dead;
}

/* First index in [lo, hi) whose key is >= key (after_key false) or > key. */
static size_t queue_bound(const struct ledger_queue *q, size_t lo, size_t hi, uint64_t key,
                          bool after_key)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t k = q->v[mid].key;
        if (k < key || (after_key && k == key))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the entry (live or tombstone) with `key`, or LEDGER_NONE. */
static size_t queue_find(const struct ledger_queue *q, uint64_t key)
{
    if (q->head == q->tail || key < q->v[q->head].key)
        return LEDGER_NONE;
    /* Keys are distinct and increasing, so `key` sits at most
     * key - front key slots after the front: exactly there while dense. */
    uint64_t span = key - q->v[q->head].key;
    size_t hi = q->tail;
    if (span < hi - q->head) {
        size_t guess = q->head + (size_t)span;
        if (q->v[guess].key == key)
            return guess;
        hi = guess;
    }
    size_t i = queue_bound(q, q->head, hi, key, false);
    return i < q->tail && q->v[i].key == key ? i : LEDGER_NONE;
}

/* Moves the live entries to the start of the array, in order. */
static void queue_compact(struct ledger_queue *q)
{
    size_t w = 0;
    for (size_t r = q->head; r < q->tail; r++)
        if (q->v[r].state != LS_DEAD)
            q->v[w++] = q->v[r];
    q->head = 0;
    q->tail = w;
    q->n_dead = 0;
}

/* Appends `e` (its key above every other).  Compacts when that frees at
 * least a quarter of the array, else doubles it. */
static int queue_push(struct ledger_queue *q, const struct ledger_entry *e)
{
    if (q->tail == q->cap) {
        if (q->cap > 0 && q->head + q->n_dead >= q->cap / 4) {
            queue_compact(q);
        } else {
            size_t cap = q->cap > 0 ? q->cap * 2 : LEDGER_QUEUE_MIN_CAP;
            struct ledger_entry *v = realloc(q->v, cap * sizeof(*v));
            if (v == NULL)
                return AMQP_LEDGER_E_NOMEM;
            q->v = v;
            q->cap = cap;
        }
    }
    q->v[q->tail++] = *e;
    return AMQP_LEDGER_OK;
}

/* Turns entry `i` into a tombstone and pops the tombstones at the front.
 * Indexes of the other entries stay valid. */
static void queue_kill(const struct amqp_ledger *l, struct ledger_queue *q, size_t i)
{
    if (q->v[i].info != NULL && l->free_info != NULL)
        l->free_info(q->v[i].info);
    q->v[i].info = NULL;
    q->v[i].state = LS_DEAD;
    q->n_dead++;
    while (q->head < q->tail && q->v[q->head].state == LS_DEAD) {
        q->head++;
        q->n_dead--;
    }
}

/* After a public call that forgot entries: keep tombstones at most about
 * as many as the live entries.  Moves indexes, so never inside a walk. */
static void queue_tidy(struct ledger_queue *q)
{
    if (q->head == q->tail)
        q->head = q->tail = 0;
    else if (q->n_dead > queue_live(q) + LEDGER_COMPACT_SLACK)
        queue_compact(q);
}

/* Forgets every entry, freeing the infos; keeps the array. */
static void queue_clear(const struct amqp_ledger *l, struct ledger_queue *q)
{
    for (size_t i = q->head; i < q->tail; i++)
        if (q->v[i].state != LS_DEAD && q->v[i].info != NULL && l->free_info != NULL)
            l->free_info(q->v[i].info);
    q->head = q->tail = q->n_dead = 0;
}

/* ---- helpers ---------------------------------------------------------------- */

static void ledger_info_free(const struct amqp_ledger *l, void *info)
{
    if (info != NULL && l->free_info != NULL)
        l->free_info(info);
}

/* The one place a delivery changes state; LS_DEAD forgets it. */
static void tag_set_state(struct amqp_ledger *l, size_t i, enum ledger_state state)
{
    struct ledger_entry *e = &l->tags.v[i];
    l->n_state[e->state]--;
    if (state == LS_DEAD) {
        queue_kill(l, &l->tags, i);
        return;
    }
    e->state = (uint8_t)state;
    l->n_state[state]++;
}

/* Tags the client still has to settle: outstanding at its end. */
static bool tag_client_unsettled(uint8_t state)
{
    return state == LS_OUTSTANDING || state == LS_TWICE_SETTLED;
}

/* Makes room for `n` plan tags. */
static int ledger_scratch_reserve(struct amqp_ledger *l, size_t n)
{
    if (n <= l->scratch_cap)
        return AMQP_LEDGER_OK;
    size_t cap = l->scratch_cap > 0 ? l->scratch_cap : LEDGER_QUEUE_MIN_CAP;
    while (cap < n)
        cap *= 2;
    struct amqp_plan_tag *s = realloc(l->scratch, cap * sizeof(*s));
    if (s == NULL)
        return AMQP_LEDGER_E_NOMEM;
    l->scratch = s;
    l->scratch_cap = cap;
    return AMQP_LEDGER_OK;
}

static void ledger_plan_add(struct amqp_plan *plan, uint64_t tag, void *info)
{
    struct amqp_plan_tag *t = &plan->tags[plan->n++];
    t->tag = tag;
    t->info = info;
    t->verdict = AMQP_V_PASS;
}

static bool ledger_plan_is_open(const struct amqp_ledger *l, const struct amqp_plan *plan,
                                enum ledger_plan_use use)
{
    return l->plan_use == use && plan->id == l->plan_id && plan->tags == l->scratch;
}

/* Appends one ack/nack/reject frame to the sink. */
static void sink_frame(struct ledger_sink *s, uint16_t channel, enum amqp_settle_kind kind,
                       uint64_t tag, bool multiple, bool requeue)
{
    if (s->len <= s->cap && s->cap - s->len >= AMQP_LEDGER_FRAME_LEN) {
        uint8_t *p = s->out + s->len;
        int n;
        if (kind == AMQP_SETTLE_REJECT)
            n = amqp_encode_basic_reject(p, AMQP_LEDGER_FRAME_LEN, channel, tag, requeue);
        else if (kind == AMQP_SETTLE_NACK)
            n = amqp_encode_basic_nack(p, AMQP_LEDGER_FRAME_LEN, channel, tag, multiple, requeue);
        else
            n = amqp_encode_basic_ack(p, AMQP_LEDGER_FRAME_LEN, channel, tag, multiple);
        (void)n; /* AMQP_LEDGER_FRAME_LEN bytes always fit one of these */
    }
    s->len += AMQP_LEDGER_FRAME_LEN;
}

/* ---- lifecycle ---------------------------------------------------------------- */

struct amqp_ledger *amqp_ledger_new(void (*free_info)(void *info))
{
    struct amqp_ledger *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->free_info = free_info;
    l->confirm_barrier = LEDGER_NO_BARRIER;
    l->copies_from = LEDGER_NO_BARRIER;
    return l;
}

void amqp_ledger_free(struct amqp_ledger *l)
{
    if (l == NULL)
        return;
    queue_clear(l, &l->tags);
    queue_clear(l, &l->pubs);
    free(l->tags.v);
    free(l->pubs.v);
    free(l->scratch);
    free(l);
}

void amqp_ledger_recover(struct amqp_ledger *l)
{
    /* last_tag stays: after basic.recover the broker numbers on. */
    queue_clear(l, &l->tags);
    memset(l->n_state, 0, sizeof(l->n_state));
    l->plan_use = PLAN_NONE;
}

void amqp_ledger_reset(struct amqp_ledger *l)
{
    amqp_ledger_recover(l);
    l->last_tag = 0;
    queue_clear(l, &l->pubs);
    l->confirm_mode = false;
    l->client_seq = l->broker_seq = 0;
    l->confirm_barrier = LEDGER_NO_BARRIER;
    l->copies_from = LEDGER_NO_BARRIER;
}

/* ---- deliveries ------------------------------------------------------------- */

int amqp_ledger_deliver(struct amqp_ledger *l, uint64_t tag, void *info)
{
    l->plan_use = PLAN_NONE;
    int rc = AMQP_LEDGER_OK;
    if (tag <= l->last_tag) {
        rc = AMQP_LEDGER_E_ORDER;
    } else if (queue_live(&l->tags) >= AMQP_LEDGER_MAX_OUTSTANDING) {
        rc = AMQP_LEDGER_E_FULL;
    } else {
        struct ledger_entry e = {.key = tag, .info = info, .state = LS_OUTSTANDING};
        rc = queue_push(&l->tags, &e);
    }
    if (rc != AMQP_LEDGER_OK) {
        ledger_info_free(l, info);
        return rc;
    }
    l->last_tag = tag;
    l->n_state[LS_OUTSTANDING]++;
    return AMQP_LEDGER_OK;
}

void *amqp_ledger_info(const struct amqp_ledger *l, uint64_t tag)
{
    size_t i = queue_find(&l->tags, tag);
    return i == LEDGER_NONE ? NULL : l->tags.v[i].info;
}

bool amqp_ledger_twice_settleable(const struct amqp_ledger *l, uint64_t tag)
{
    size_t i = queue_find(&l->tags, tag);
    if (i == LEDGER_NONE)
        return false;
    uint8_t state = l->tags.v[i].state;
    return state == LS_OUTSTANDING || state == LS_DROPPED || state == LS_HELD;
}

int amqp_ledger_twice_settle(struct amqp_ledger *l, uint16_t channel, uint64_t tag, bool requeue,
                             uint8_t *out, size_t cap)
{
    l->plan_use = PLAN_NONE;
    size_t i = queue_find(&l->tags, tag);
    if (i == LEDGER_NONE)
        return 0;
    uint8_t state = l->tags.v[i].state;
    if (state != LS_OUTSTANDING && state != LS_DROPPED && state != LS_HELD)
        return 0;
    if (cap < AMQP_LEDGER_FRAME_LEN)
        return AMQP_LEDGER_E_BUFFER;
    struct ledger_sink s = {out, cap, 0};
    sink_frame(&s, channel, AMQP_SETTLE_REJECT, tag, false, requeue);
    /* A dropped or held tag is settled at the client already: nothing left to swallow (a held
     * settlement is discarded: it would reach the broker after the message went back). */
    tag_set_state(l, i, state == LS_OUTSTANDING ? LS_TWICE_SETTLED : LS_DEAD);
    queue_tidy(&l->tags);
    return (int)s.len;
}

int amqp_ledger_release(struct amqp_ledger *l, uint16_t channel, uint64_t tag, uint8_t *out,
                        size_t cap)
{
    l->plan_use = PLAN_NONE;
    size_t i = queue_find(&l->tags, tag);
    if (i == LEDGER_NONE || l->tags.v[i].state != LS_HELD)
        return 0;
    if (cap < AMQP_LEDGER_FRAME_LEN)
        return AMQP_LEDGER_E_BUFFER;
    const struct ledger_entry *e = &l->tags.v[i];
    struct ledger_sink s = {out, cap, 0};
    sink_frame(&s, channel, (enum amqp_settle_kind)e->kind, tag, false, e->requeue != 0);
    tag_set_state(l, i, LS_DEAD);
    queue_tidy(&l->tags);
    return (int)s.len;
}

size_t amqp_ledger_held(const struct amqp_ledger *l, uint64_t *tags, size_t max)
{
    size_t n = 0;
    const struct ledger_queue *q = &l->tags;
    for (size_t i = q->head; i < q->tail && n < max && n < l->n_state[LS_HELD]; i++)
        if (q->v[i].state == LS_HELD)
            tags[n++] = q->v[i].key;
    return l->n_state[LS_HELD];
}

size_t amqp_ledger_outstanding(const struct amqp_ledger *l)
{
    return l->n_state[LS_OUTSTANDING] + l->n_state[LS_HELD] + l->n_state[LS_DROPPED];
}

void amqp_ledger_counts(const struct amqp_ledger *l, struct amqp_ledger_counts *c)
{
    c->client_unsettled = l->n_state[LS_OUTSTANDING] + l->n_state[LS_TWICE_SETTLED];
    c->held = l->n_state[LS_HELD];
    c->dropped = l->n_state[LS_DROPPED];
    c->unconfirmed = queue_live(&l->pubs);
}

void amqp_ledger_each_kept(const struct amqp_ledger *l,
                           void (*fn)(void *arg, uint64_t tag, void *info, bool held), void *arg)
{
    size_t left = l->n_state[LS_HELD] + l->n_state[LS_DROPPED];
    const struct ledger_queue *q = &l->tags;
    for (size_t i = q->head; i < q->tail && left > 0; i++) {
        const struct ledger_entry *e = &q->v[i];
        if (e->state == LS_HELD || e->state == LS_DROPPED) {
            left--;
            fn(arg, e->key, e->info, e->state == LS_HELD);
        }
    }
}

size_t amqp_ledger_plan_space(const struct amqp_plan *plan)
{
    /* At most one frame per tag; an unknown plan writes two. */
    return AMQP_LEDGER_FRAME_LEN * (plan->n + 2);
}

/* ---- settle plans -------------------------------------------------------------- */

/* Entries [*lo, *hi) the client's frame covers; false when the frame is an
 * error from the client's point of view (collect_acks would refuse it). */
static bool settle_range(const struct amqp_ledger *l, const struct amqp_plan *plan, size_t *lo,
                         size_t *hi)
{
    const struct ledger_queue *q = &l->tags;
    if (plan->multiple && plan->tag == 0) {
        *lo = q->head;
        *hi = q->tail;
        return true;
    }
    size_t i = queue_find(q, plan->tag);
    if (i == LEDGER_NONE || !tag_client_unsettled(q->v[i].state))
        return false;
    *lo = plan->multiple ? q->head : i;
    *hi = i + 1;
    return true;
}

int amqp_ledger_settle_begin(struct amqp_ledger *l, enum amqp_settle_kind kind, uint64_t tag,
                             bool multiple, bool requeue, struct amqp_plan *plan)
{
    l->plan_use = PLAN_NONE;
    l->plan_barrier = LEDGER_NO_BARRIER;
    memset(plan, 0, sizeof(*plan));
    plan->kind = kind;
    plan->tag = tag;
    plan->multiple = multiple && kind != AMQP_SETTLE_REJECT;
    plan->requeue = requeue && kind != AMQP_SETTLE_ACK;
    size_t lo = 0, hi = 0;
    plan->unknown = !settle_range(l, plan, &lo, &hi);
    size_t n_max = hi - lo < l->n_state[LS_OUTSTANDING] ? hi - lo : l->n_state[LS_OUTSTANDING];
    if (ledger_scratch_reserve(l, n_max) != AMQP_LEDGER_OK)
        return AMQP_LEDGER_E_NOMEM;
    plan->tags = l->scratch;
    plan->id = ++l->plan_id;
    for (size_t i = lo; i < hi; i++) {
        const struct ledger_entry *e = &l->tags.v[i];
        if (e->state == LS_OUTSTANDING)
            ledger_plan_add(plan, e->key, e->info);
        else if (e->state == LS_TWICE_SETTLED)
            plan->n_swallowed++;
        else if ((e->state == LS_HELD || e->state == LS_DROPPED) && e->key < l->plan_barrier)
            l->plan_barrier = e->key;
    }
    l->plan_use = PLAN_SETTLE;
    return AMQP_LEDGER_OK;
}

void amqp_ledger_settle_swallowed(const struct amqp_ledger *l, const struct amqp_plan *plan,
                                  void (*fn)(void *arg, uint64_t tag, void *info), void *arg)
{
    size_t lo = 0, hi = 0;
    if (plan->n_swallowed == 0 || !settle_range(l, plan, &lo, &hi))
        return;
    for (size_t i = lo; i < hi; i++) {
        const struct ledger_entry *e = &l->tags.v[i];
        if (e->state == LS_TWICE_SETTLED)
            fn(arg, e->key, e->info);
    }
}

bool amqp_ledger_ack_one(struct amqp_ledger *l, uint64_t tag)
{
    size_t i = queue_find(&l->tags, tag);
    if (i == LEDGER_NONE || l->tags.v[i].state != LS_OUTSTANDING)
        return false;
    l->plan_use = PLAN_NONE;
    tag_set_state(l, i, LS_DEAD);
    queue_tidy(&l->tags);
    return true;
}

static struct ledger_action settle_action(const struct amqp_plan *plan, enum amqp_verdict v)
{
    struct ledger_action a = {false, AMQP_SETTLE_ACK, false};
    if (v == AMQP_V_PASS)
        a = (struct ledger_action){true, plan->kind, plan->requeue};
    else if (v == AMQP_V_REQUEUE)
        a = (struct ledger_action){true, AMQP_SETTLE_REJECT, true};
    return a;
}

static bool action_eq(struct ledger_action a, struct ledger_action b)
{
    return a.settles == b.settles && a.kind == b.kind && a.requeue == b.requeue;
}

/* Last index of the run from `i` that one `multiple` frame may settle:
 * same action, and below every tag that stays unsettled at the broker. */
static size_t settle_run_end(const struct amqp_ledger *l, const struct amqp_plan *plan, size_t i)
{
    struct ledger_action a = settle_action(plan, plan->tags[i].verdict);
    size_t j = i;
    while (j + 1 < plan->n && plan->tags[j + 1].tag < l->plan_barrier &&
           action_eq(settle_action(plan, plan->tags[j + 1].verdict), a))
        j++;
    return j;
}

/* The frames for a known plan, ascending.  A `multiple` frame settles every
 * tag <= its own still unsettled at the broker, so one is used only while
 * every unsettled tag below the run is settled by an earlier frame
 * (`clean`): none is held, dropped, or given a HOLD/DROP verdict. */
static void settle_emit(const struct amqp_ledger *l, uint16_t channel, const struct amqp_plan *plan,
                        struct ledger_sink *s)
{
    bool clean = true;
    for (size_t i = 0; i < plan->n; i++) {
        const struct amqp_plan_tag *t = &plan->tags[i];
        struct ledger_action a = settle_action(plan, t->verdict);
        if (t->tag > l->plan_barrier)
            clean = false;
        if (!a.settles) {
            clean = false;
            continue;
        }
        size_t j = i;
        if (clean && plan->multiple && a.kind != AMQP_SETTLE_REJECT)
            j = settle_run_end(l, plan, i);
        sink_frame(s, channel, a.kind, plan->tags[j].tag, j > i, a.requeue);
        i = j;
    }
}

/* The state a plan tag's verdict leaves it in. */
static void settle_apply_verdict(struct amqp_ledger *l, const struct amqp_plan *plan, size_t i,
                                 enum amqp_verdict v)
{
    if (v == AMQP_V_HOLD) {
        l->tags.v[i].kind = (uint8_t)plan->kind;
        l->tags.v[i].requeue = plan->requeue;
        tag_set_state(l, i, LS_HELD);
    } else if (v == AMQP_V_DROP) {
        tag_set_state(l, i, LS_DROPPED);
    } else {
        tag_set_state(l, i, LS_DEAD);
    }
}

/* Walks the entries the plan covers again (the ledger has not changed since
 * begin) and applies the verdicts; swallowed tags are forgotten. */
static void settle_apply(struct amqp_ledger *l, const struct amqp_plan *plan)
{
    size_t lo, hi, k = 0;
    if (!settle_range(l, plan, &lo, &hi))
        return;
    for (size_t i = lo; i < hi; i++) {
        uint8_t state = l->tags.v[i].state;
        if (state == LS_TWICE_SETTLED)
            tag_set_state(l, i, LS_DEAD);
        else if (state == LS_OUTSTANDING && k < plan->n)
            settle_apply_verdict(l, plan, i, plan->tags[k++].verdict);
    }
}

/* The client settles a tag it settled before (or never had).  When twice
 * held or dropped that first settlement the broker still has the tag, so
 * it is settled first: then the broker refuses the client's frame exactly
 * as it would have without twice. */
static int settle_commit_unknown(struct amqp_ledger *l, uint16_t channel,
                                 const struct amqp_plan *plan, struct ledger_sink *s)
{
    size_t i = plan->tag == 0 ? LEDGER_NONE : queue_find(&l->tags, plan->tag);
    uint8_t state = i == LEDGER_NONE ? LS_DEAD : l->tags.v[i].state;
    if (state != LS_HELD && state != LS_DROPPED)
        return 1;
    const struct ledger_entry *e = &l->tags.v[i];
    if (state == LS_HELD)
        sink_frame(s, channel, (enum amqp_settle_kind)e->kind, e->key, false, e->requeue != 0);
    else
        sink_frame(s, channel, AMQP_SETTLE_REJECT, e->key, false, true);
    sink_frame(s, channel, plan->kind, plan->tag, plan->multiple, plan->requeue);
    if (s->len > s->cap)
        return AMQP_LEDGER_E_BUFFER;
    tag_set_state(l, i, LS_DEAD);
    return 0;
}

/* True when forwarding the client's frame settles exactly what the plan
 * means at the broker. */
static bool settle_is_transparent(const struct amqp_ledger *l, const struct amqp_plan *plan)
{
    if (plan->n_swallowed > 0 || (plan->multiple && l->plan_barrier != LEDGER_NO_BARRIER))
        return false;
    for (size_t i = 0; i < plan->n; i++)
        if (plan->tags[i].verdict != AMQP_V_PASS)
            return false;
    return true;
}

static bool plan_verdicts_valid(const struct amqp_plan *plan, bool confirm)
{
    for (size_t i = 0; i < plan->n; i++) {
        enum amqp_verdict v = plan->tags[i].verdict;
        if (confirm ? v != AMQP_V_PASS && v != AMQP_V_DROP : v > AMQP_V_DROP)
            return false;
    }
    return true;
}

int amqp_ledger_settle_commit(struct amqp_ledger *l, uint16_t channel, struct amqp_plan *plan,
                              uint8_t *out, size_t cap, size_t *len)
{
    if (!ledger_plan_is_open(l, plan, PLAN_SETTLE))
        return AMQP_LEDGER_E_STALE;
    if (!plan_verdicts_valid(plan, false))
        return AMQP_LEDGER_E_VERDICT;
    struct ledger_sink s = {out, cap, 0};
    int rc;
    if (plan->unknown) {
        rc = settle_commit_unknown(l, channel, plan, &s);
    } else if (settle_is_transparent(l, plan)) {
        rc = 1;
    } else {
        settle_emit(l, channel, plan, &s);
        rc = s.len > cap ? AMQP_LEDGER_E_BUFFER : 0;
    }
    if (rc < 0)
        return rc;
    if (!plan->unknown)
        settle_apply(l, plan);
    l->plan_use = PLAN_NONE;
    queue_tidy(&l->tags);
    *len = rc == 0 ? s.len : 0;
    return rc;
}

/* ---- publisher confirms ---------------------------------------------------------- */

void amqp_ledger_confirm_mode(struct amqp_ledger *l)
{
    l->confirm_mode = true;
}

bool amqp_ledger_in_confirm_mode(const struct amqp_ledger *l)
{
    return l->confirm_mode;
}

int amqp_ledger_publish(struct amqp_ledger *l, bool dropped, void *info, uint64_t *client_seq)
{
    l->plan_use = PLAN_NONE;
    *client_seq = 0;
    if (!l->confirm_mode) {
        ledger_info_free(l, info);
        return AMQP_LEDGER_OK;
    }
    *client_seq = ++l->client_seq;
    if (dropped) {
        if (*client_seq < l->confirm_barrier)
            l->confirm_barrier = *client_seq;
        ledger_info_free(l, info);
        return AMQP_LEDGER_OK;
    }
    /* Numbered even when it cannot be recorded: the broker will number it. */
    struct ledger_entry e = {
        .key = ++l->broker_seq, .aux = *client_seq, .info = info, .state = LS_UNCONFIRMED};
    int rc = queue_live(&l->pubs) >= AMQP_LEDGER_MAX_OUTSTANDING ? AMQP_LEDGER_E_FULL
                                                                 : queue_push(&l->pubs, &e);
    if (rc != AMQP_LEDGER_OK)
        ledger_info_free(l, info);
    return rc;
}

int amqp_ledger_publish_copy(struct amqp_ledger *l)
{
    l->plan_use = PLAN_NONE;
    if (!l->confirm_mode)
        return AMQP_LEDGER_OK;
    /* A copy is an entry without a client number (aux 0): its confirms go nowhere. */
    struct ledger_entry e = {.key = ++l->broker_seq, .aux = 0, .state = LS_UNCONFIRMED};
    if (l->broker_seq < l->copies_from)
        l->copies_from = l->broker_seq;
    return queue_live(&l->pubs) >= AMQP_LEDGER_MAX_OUTSTANDING ? AMQP_LEDGER_E_FULL
                                                               : queue_push(&l->pubs, &e);
}

uint64_t amqp_ledger_confirm_seq(const struct amqp_ledger *l, uint64_t broker_seq, void **info)
{
    size_t i = queue_find(&l->pubs, broker_seq);
    bool live = i != LEDGER_NONE && l->pubs.v[i].state != LS_DEAD;
    if (info != NULL)
        *info = live ? l->pubs.v[i].info : NULL;
    return live ? l->pubs.v[i].aux : 0;
}

/* Entries [*lo, *hi) the broker's confirm covers; false when unknown. */
static bool confirm_range(const struct amqp_ledger *l, const struct amqp_plan *plan, size_t *lo,
                          size_t *hi)
{
    const struct ledger_queue *q = &l->pubs;
    if (plan->multiple) {
        if (plan->tag == 0 || plan->tag > l->broker_seq)
            return false;
        *lo = q->head;
        *hi = queue_bound(q, q->head, q->tail, plan->tag, true);
        return true;
    }
    size_t i = queue_find(q, plan->tag);
    if (i == LEDGER_NONE || q->v[i].state == LS_DEAD)
        return false;
    *lo = i;
    *hi = i + 1;
    return true;
}

int amqp_ledger_confirm_begin(struct amqp_ledger *l, bool nack, uint64_t seq, bool multiple,
                              struct amqp_plan *plan)
{
    l->plan_use = PLAN_NONE;
    memset(plan, 0, sizeof(*plan));
    plan->kind = nack ? AMQP_SETTLE_NACK : AMQP_SETTLE_ACK;
    plan->tag = seq;
    plan->multiple = multiple;
    size_t lo = 0, hi = 0;
    plan->unknown = !confirm_range(l, plan, &lo, &hi);
    size_t live = queue_live(&l->pubs);
    if (ledger_scratch_reserve(l, hi - lo < live ? hi - lo : live) != AMQP_LEDGER_OK)
        return AMQP_LEDGER_E_NOMEM;
    plan->tags = l->scratch;
    plan->id = ++l->plan_id;
    for (size_t i = lo; i < hi; i++)
        if (l->pubs.v[i].state != LS_DEAD && l->pubs.v[i].aux != 0)
            ledger_plan_add(plan, l->pubs.v[i].aux, l->pubs.v[i].info);
    l->plan_use = PLAN_CONFIRM;
    return AMQP_LEDGER_OK;
}

/* True when the broker's frame means exactly the plan to the client: the
 * client's numbers equal the broker's below it, and a `multiple` does not
 * reach a number that must stay unconfirmed. */
static bool confirm_is_transparent(const struct amqp_ledger *l, const struct amqp_plan *plan)
{
    for (size_t i = 0; i < plan->n; i++)
        if (plan->tags[i].verdict != AMQP_V_PASS)
            return false;
    /* No barrier <= seq: nothing was dropped below seq, and no copy sent: numbers agree. */
    if (plan->multiple)
        return l->confirm_barrier > plan->tag && l->copies_from > plan->tag;
    return plan->n == 1 && plan->tags[0].tag == plan->tag;
}

/* The frames for the client, ascending.  A `multiple` confirms every client
 * number <= its own not yet confirmed, so it is used only below the first
 * number that stays unconfirmed (a barrier or a DROP verdict).  All the
 * plan's unconfirmed numbers below its last one are in the plan: the broker
 * confirmed every unconfirmed broker number <= seq. */
static void confirm_emit(const struct amqp_ledger *l, uint16_t channel,
                         const struct amqp_plan *plan, struct ledger_sink *s)
{
    bool clean = true;
    for (size_t i = 0; i < plan->n; i++) {
        const struct amqp_plan_tag *t = &plan->tags[i];
        if (t->tag > l->confirm_barrier)
            clean = false;
        if (t->verdict == AMQP_V_DROP) {
            clean = false;
            continue;
        }
        size_t j = i;
        while (clean && plan->multiple && j + 1 < plan->n &&
               plan->tags[j + 1].verdict == AMQP_V_PASS &&
               plan->tags[j + 1].tag < l->confirm_barrier)
            j++;
        sink_frame(s, channel, plan->kind, plan->tags[j].tag, j > i, false);
        i = j;
    }
}

static void confirm_apply(struct amqp_ledger *l, const struct amqp_plan *plan)
{
    size_t lo, hi, k = 0;
    if (!confirm_range(l, plan, &lo, &hi))
        return;
    for (size_t i = lo; i < hi; i++) {
        if (l->pubs.v[i].state == LS_DEAD)
            continue;
        if (l->pubs.v[i].aux == 0) { /* a copy: confirmed, and nobody to tell */
            queue_kill(l, &l->pubs, i);
            continue;
        }
        if (k == plan->n)
            continue; /* not in the plan (cannot happen: every live publish in range is) */
        const struct amqp_plan_tag *t = &plan->tags[k++];
        if (t->verdict == AMQP_V_DROP && t->tag < l->confirm_barrier)
            l->confirm_barrier = t->tag;
        queue_kill(l, &l->pubs, i);
    }
}

int amqp_ledger_confirm_commit(struct amqp_ledger *l, uint16_t channel, struct amqp_plan *plan,
                               uint8_t *out, size_t cap, size_t *len)
{
    if (!ledger_plan_is_open(l, plan, PLAN_CONFIRM))
        return AMQP_LEDGER_E_STALE;
    if (!plan_verdicts_valid(plan, true))
        return AMQP_LEDGER_E_VERDICT;
    struct ledger_sink s = {out, cap, 0};
    int rc;
    if (plan->unknown) {
        /* A broker error: harmless to pass on only while numbers agree. */
        rc = l->confirm_barrier == LEDGER_NO_BARRIER && l->copies_from == LEDGER_NO_BARRIER ? 1 : 0;
    } else if (confirm_is_transparent(l, plan)) {
        rc = 1;
    } else {
        confirm_emit(l, channel, plan, &s);
        rc = s.len > cap ? AMQP_LEDGER_E_BUFFER : 0;
    }
    if (rc < 0)
        return rc;
    if (!plan->unknown)
        confirm_apply(l, plan);
    l->plan_use = PLAN_NONE;
    queue_tidy(&l->pubs);
    *len = rc == 0 ? s.len : 0;
    return rc;
}
