/*
 * engine.c - rule decisions.  See engine.h for the contract.
 */
#include "rules/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rules/plan.h"

/* One identity a rule has seen: how often, and how often it faulted it. */
struct id_slot {
    uint64_t hash; /* 0: empty (a real hash of 0 is stored as 1) */
    uint32_t seen;
    uint32_t faults;
};

struct id_table {
    struct id_slot *slots;
    size_t cap; /* power of two, or 0 */
    size_t used;
};

/* What a rule knows at run time: its switch, counters and identity table.
 * A reload or PUT /rules builds a new ruleset whose same-named rules share
 * their state with the old one (ruleset_inherit): a loop still deciding
 * against the old ruleset counts for the new one too, and a switch flipped
 * on either applies to both.  Threads: `enabled` is atomic; everything
 * below `lock` changes only under it.  Events that no matcher of a rule
 * accepts never take its lock, so pass-through traffic takes none. */
struct rule_state {
    atomic_int refs;
    atomic_bool enabled;
    pthread_mutex_t lock;
    uint64_t seen;    /* events that matched */
    uint64_t counted; /* of those, events of messages still under the cap */
    uint64_t faults;
    struct id_table ids;
};

/* The kill switch, shared along reloads the same way. */
struct kill_switch {
    atomic_int refs;
    atomic_bool faults_on;
};

struct rule_rt {
    const struct rule *rule; /* read-only */
    struct rule_state *st;
};

struct ruleset {
    atomic_int refs;
    uint64_t seed;
    uint64_t start_ms;
    struct kill_switch *sw;
    size_t n;
    struct rule_rt *rt;
    void *owner;
    void (*owner_free)(void *);
};

static uint64_t mix64(uint64_t x)
{
    /* splitmix64's finaliser: every input bit affects every output bit. */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t identity_hash(const char *identity)
{
    uint64_t h = mix64(fnv1a(0xcbf29ce484222325ULL, identity ? identity : ""));
    return h != 0 ? h : 1;
}

double engine_coin(uint64_t seed, const char *rule, const char *identity, uint64_t occurrence)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, rule);
    h = fnv1a(mix64(h) ^ 0xff, identity ? identity : "");
    uint64_t x = mix64(seed ^ mix64(h ^ mix64(occurrence + 0x9e3779b97f4a7c15ULL)));
    return (double)(x >> 11) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

bool engine_glob(const char *pattern, const char *s)
{
    const char *star = NULL, *resume = NULL;
    while (*s != '\0') {
        if (*pattern == '*') {
            star = pattern++;
            resume = s;
        } else if (*pattern == '?' || *pattern == *s) {
            pattern++;
            s++;
        } else if (star != NULL) {
            pattern = star + 1;
            s = ++resume;
        } else {
            return false;
        }
    }
    while (*pattern == '*')
        pattern++;
    return *pattern == '\0';
}

/* ---- identity table ---------------------------------------------------- */

static int id_table_grow(struct id_table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 256;
    if (cap > ENGINE_MAX_TRACKED_IDS) {
        /* Full: forget everything rather than grow without bound. */
        memset(t->slots, 0, t->cap * sizeof(*t->slots));
        t->used = 0;
        return 0;
    }
    struct id_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].hash == 0)
            continue;
        size_t j = t->slots[i].hash & (cap - 1);
        while (slots[j].hash != 0)
            j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* The slot of `hash`, created if needed; NULL when memory runs out. */
static struct id_slot *id_table_get(struct id_table *t, uint64_t hash)
{
    if ((t->used + 1) * 4 > t->cap * 3 && id_table_grow(t) != 0)
        return NULL;
    size_t i = hash & (t->cap - 1);
    while (t->slots[i].hash != 0 && t->slots[i].hash != hash)
        i = (i + 1) & (t->cap - 1);
    if (t->slots[i].hash == 0) {
        t->slots[i].hash = hash;
        t->used++;
    }
    return &t->slots[i];
}

/* ---- ruleset lifetime -------------------------------------------------- */

static struct rule_state *state_new(bool enabled)
{
    struct rule_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NULL;
    st->refs = 1;
    st->enabled = enabled;
    pthread_mutex_init(&st->lock, NULL);
    return st;
}

static void state_put(struct rule_state *st)
{
    if (st == NULL || atomic_fetch_sub_explicit(&st->refs, 1, memory_order_acq_rel) > 1)
        return;
    free(st->ids.slots);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

static void switch_put(struct kill_switch *sw)
{
    if (sw != NULL && atomic_fetch_sub_explicit(&sw->refs, 1, memory_order_acq_rel) == 1)
        free(sw);
}

struct ruleset *ruleset_new(const struct rule *rules, uint64_t seed, uint64_t start_ms)
{
    struct ruleset *rs = calloc(1, sizeof(*rs));
    if (rs == NULL)
        return NULL;
    rs->refs = 1;
    rs->seed = seed;
    rs->start_ms = start_ms;
    for (const struct rule *r = rules; r != NULL; r = r->next)
        rs->n++;
    rs->rt = calloc(rs->n ? rs->n : 1, sizeof(*rs->rt));
    rs->sw = calloc(1, sizeof(*rs->sw));
    if (rs->rt == NULL || rs->sw == NULL) {
        ruleset_put(rs);
        return NULL;
    }
    rs->sw->refs = 1;
    rs->sw->faults_on = true;
    size_t i = 0;
    for (const struct rule *r = rules; r != NULL; r = r->next, i++) {
        rs->rt[i].rule = r;
        if ((rs->rt[i].st = state_new(r->enabled)) == NULL) {
            ruleset_put(rs);
            return NULL;
        }
    }
    return rs;
}

void ruleset_get(struct ruleset *rs)
{
    atomic_fetch_add_explicit(&rs->refs, 1, memory_order_relaxed);
}

void ruleset_put(struct ruleset *rs)
{
    if (rs == NULL || atomic_fetch_sub_explicit(&rs->refs, 1, memory_order_acq_rel) > 1)
        return;
    for (size_t i = 0; rs->rt != NULL && i < rs->n; i++)
        state_put(rs->rt[i].st);
    free(rs->rt);
    switch_put(rs->sw);
    if (rs->owner_free != NULL)
        rs->owner_free(rs->owner);
    free(rs);
}

void ruleset_set_owner(struct ruleset *rs, void *owner, void (*free_fn)(void *))
{
    rs->owner = owner;
    rs->owner_free = free_fn;
}

size_t ruleset_count(const struct ruleset *rs)
{
    return rs->n;
}

const struct rule *ruleset_rule(const struct ruleset *rs, size_t i)
{
    return rs->rt[i].rule;
}

bool ruleset_enabled(const struct ruleset *rs, size_t i)
{
    return atomic_load(&rs->rt[i].st->enabled);
}

void ruleset_set_enabled(struct ruleset *rs, size_t i, bool on)
{
    atomic_store(&rs->rt[i].st->enabled, on);
}

long ruleset_find(const struct ruleset *rs, const char *name)
{
    for (size_t i = 0; i < rs->n; i++)
        if (strcmp(rs->rt[i].rule->name, name) == 0)
            return (long)i;
    return -1;
}

int ruleset_edit(const struct ruleset *rs, const char *name, struct rule *with, struct rule **out,
                 size_t *n_out)
{
    struct rule *head = NULL, **tail = &head;
    size_t n = 0;
    bool placed = false;
    for (size_t i = 0; rs != NULL && i < rs->n; i++) {
        const struct rule *r = rs->rt[i].rule;
        struct rule *c = NULL;
        if (strcmp(r->name, name) != 0) {
            if ((c = rule_copy(r)) == NULL)
                goto oom;
        } else if (with != NULL) {
            c = with;
            placed = true;
        }
        if (c != NULL) {
            *tail = c;
            tail = &c->next;
            n++;
        }
    }
    if (with != NULL && !placed) {
        *tail = with;
        n++;
    }
    *out = head;
    *n_out = n;
    return 0;
oom:
    /* `with` is the caller's again: unlink it before freeing the copies. */
    for (struct rule **pp = &head; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == with) {
            *pp = with->next;
            with->next = NULL;
            break;
        }
    }
    rule_list_free(head);
    *out = NULL;
    *n_out = 0;
    return -1;
}

struct engine_rule_stats ruleset_stats(const struct ruleset *rs, size_t i)
{
    struct rule_state *st = rs->rt[i].st;
    pthread_mutex_lock(&st->lock);
    struct engine_rule_stats out = {.seen = st->seen, .faults = st->faults};
    pthread_mutex_unlock(&st->lock);
    return out;
}

void ruleset_set_faults_enabled(struct ruleset *rs, bool on)
{
    atomic_store(&rs->sw->faults_on, on);
}

bool ruleset_faults_enabled(const struct ruleset *rs)
{
    return atomic_load(&rs->sw->faults_on);
}

void ruleset_inherit(struct ruleset *rs, const struct ruleset *old)
{
    if (old == NULL)
        return;
    atomic_fetch_add(&old->sw->refs, 1);
    switch_put(rs->sw);
    rs->sw = old->sw;
    for (size_t i = 0; i < rs->n; i++) {
        long j = ruleset_find(old, rs->rt[i].rule->name);
        if (j < 0)
            continue;
        struct rule_state *shared = old->rt[j].st;
        atomic_fetch_add(&shared->refs, 1);
        state_put(rs->rt[i].st);
        rs->rt[i].st = shared;
    }
}

/* ---- matching ---------------------------------------------------------- */

static const char *field_text(const struct engine_event *ev, const struct rule_matcher *m)
{
    switch (m->field) {
    case RULE_F_QUEUE:
        return ev->queue;
    case RULE_F_EXCHANGE:
        return ev->exchange;
    case RULE_F_ROUTING_KEY:
        return ev->routing_key;
    case RULE_F_CONSUMER_TAG:
        return ev->consumer_tag;
    case RULE_F_MESSAGE_ID:
        return ev->message_id;
    case RULE_F_TASK:
        return ev->task;
    case RULE_F_COMMAND:
        return ev->command;
    case RULE_F_KEY:
        return ev->key;
    case RULE_F_HEADER:
        return ev->header != NULL ? ev->header(ev->header_ctx, m->header) : NULL;
    default:
        return NULL;
    }
}

static bool client_in_prefix(const struct engine_event *ev, const struct rule_matcher *m)
{
    if (!ev->has_client)
        return false;
    unsigned bits = m->cidr_prefix;
    size_t whole = bits / 8;
    if (memcmp(ev->client, m->cidr_addr, whole) != 0)
        return false;
    if (bits % 8 == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - bits % 8));
    return (ev->client[whole] & mask) == (m->cidr_addr[whole] & mask);
}

static bool body_contains(const struct engine_event *ev, const char *needle)
{
    if (ev->body == NULL)
        return false;
    return memmem(ev->body, ev->body_len, needle, strlen(needle)) != NULL;
}

static bool text_matches(const struct rule_matcher *m, const char *text)
{
    if (text == NULL)
        return false;
    if (m->op == RULE_OP_CONTAINS)
        return strstr(text, m->value) != NULL;
    return m->is_glob ? engine_glob(m->value, text) : strcmp(m->value, text) == 0;
}

static bool matcher_holds(const struct engine_event *ev, const struct rule_matcher *m)
{
    bool hit;
    switch (m->field) {
    case RULE_F_CLIENT:
        hit = client_in_prefix(ev, m);
        break;
    case RULE_F_REDELIVERED:
        hit = ev->redelivered == m->bool_value;
        break;
    case RULE_F_BODY:
        hit = m->op == RULE_OP_CONTAINS ? body_contains(ev, m->value)
                                        : ev->body != NULL && ev->body_len == strlen(m->value) &&
                                              memcmp(ev->body, m->value, ev->body_len) == 0;
        break;
    default:
        hit = text_matches(m, field_text(ev, m));
        break;
    }
    return m->op == RULE_OP_NE ? !hit : hit;
}

/* ---- triggers ---------------------------------------------------------- */

static bool counting_triggers_pass(const struct rule_trigger *t, uint64_t n)
{
    if (t->every != 0 && n % t->every != 0)
        return false;
    if (t->nth != 0 && n != t->nth)
        return false;
    if (t->first != 0 && n > t->first)
        return false;
    if (t->after != 0 && n <= t->after)
        return false;
    return true;
}

/* The counting part of rule_fires, under the rule's lock. */
static bool rule_counts(struct ruleset *rs, const struct rule *r, struct rule_state *st,
                        const struct engine_event *ev, uint64_t now_ms)
{
    const struct rule_trigger *t = &r->trigger;
    st->seen++;
    /* A message without an id has a new identity on each delivery: its copies
     * (redelivered by the broker, maybe because of this very rule) would be
     * faulted again and again, a redelivery storm that never completes.  Such
     * a copy is past the cap, and takes no slot in the identity table. */
    if (ev->anonymous && ev->redelivered)
        return false;
    struct id_slot *id = id_table_get(&st->ids, identity_hash(ev->identity));
    uint64_t occurrence = id != NULL ? id->seen++ : 0;
    uint32_t cap = t->max_per_message ? t->max_per_message : 1;
    /* A message the rule may no longer fault does not count toward every,
     * nth, first and after: otherwise the redelivered copies a fault
     * creates would use them up, and `first 3` could fault fewer than three
     * messages depending on timing. */
    if (id != NULL && id->faults >= cap)
        return false;
    uint64_t n = ++st->counted;
    if (t->has_between) {
        uint64_t since = now_ms > rs->start_ms ? now_ms - rs->start_ms : 0;
        if (since < t->between_start_ms || since >= t->between_end_ms)
            return false;
    }
    if (!counting_triggers_pass(t, n))
        return false;
    if (t->has_probability &&
        engine_coin(rs->seed, r->name, ev->identity, occurrence) >= t->probability)
        return false;
    if (t->limit != 0 && st->faults >= t->limit)
        return false;
    if (id != NULL)
        id->faults++;
    st->faults++;
    return true;
}

/* Whether rule `rt` faults `ev`; updates its counters. */
static bool rule_fires(struct ruleset *rs, struct rule_rt *rt, const struct engine_event *ev,
                       uint64_t now_ms)
{
    const struct rule *r = rt->rule;
    for (size_t i = 0; i < r->n_matchers; i++)
        if (!matcher_holds(ev, &r->matchers[i]))
            return false;
    pthread_mutex_lock(&rt->st->lock);
    bool fires = rule_counts(rs, r, rt->st, ev, now_ms);
    pthread_mutex_unlock(&rt->st->lock);
    return fires;
}

uint32_t ruleset_events(const struct ruleset *rs, const char *listener)
{
    uint32_t mask = 0;
    for (size_t i = 0; i < rs->n; i++)
        if (strcmp(rs->rt[i].rule->listener, listener) == 0)
            mask |= 1u << (unsigned)rs->rt[i].rule->event;
    return mask;
}

uint32_t ruleset_fault_kinds(const struct ruleset *rs, const char *listener, enum rule_event ev)
{
    uint32_t kinds = 0;
    for (size_t i = 0; rs != NULL && i < rs->n; i++) {
        const struct rule *r = rs->rt[i].rule;
        if (r->event == ev && strcmp(r->listener, listener) == 0)
            kinds |= 1u << rule_job_fault(r).kind;
    }
    return kinds;
}

bool engine_event_combines(enum rule_event ev)
{
    return ev == RULE_EV_STREAM || ev == RULE_EV_CONNECT;
}

size_t ruleset_decide(struct ruleset *rs, const char *listener, const struct engine_event *ev,
                      uint64_t now_ms, size_t *hits, size_t max_hits)
{
    size_t n = 0;
    if (!atomic_load_explicit(&rs->sw->faults_on, memory_order_relaxed))
        return 0;
    /* A frame has one fate (a drop and a duplicate of one ack cannot both happen): the first
     * rule that fires decides it. */
    if (!engine_event_combines(ev->event) && max_hits > 1)
        max_hits = 1;
    for (size_t i = 0; i < rs->n && n < max_hits; i++) {
        struct rule_rt *rt = &rs->rt[i];
        if (rt->rule->event != ev->event || !atomic_load(&rt->st->enabled) ||
            strcmp(rt->rule->listener, listener) != 0)
            continue;
        if (rule_fires(rs, rt, ev, now_ms))
            hits[n++] = i;
    }
    return n;
}
