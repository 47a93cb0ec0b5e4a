/*
 * amqp_settle.c - held frames and settlements on an AMQP connection (amqp_internal.h).
 *
 * Per channel and direction, frames twice holds (delay) wait in order in a queue: nothing on
 * that channel overtakes them, while other channels and heartbeats keep flowing.  The client's
 * acks, nacks and rejects are split per delivery tag (proto/amqp/amqp_ledger.h keeps the tags
 * consistent on both ends) and each is decided by its message's rules (planned by
 * proto/amqp/amqp_plan.h, carried out by settle_apply()): forwarded, held past a visibility or
 * consumer timeout, swallowed, replaced by a requeue (`redeliver`), or held until a late copy
 * (`redeliver after D`, `duplicate after D`).
 */
#include "proxy/amqp/amqp_internal.h"

/* ---- holding frames (delay on deliver and publish) --------------------- */

static void held_arm(struct achan *ch, int d)
{
    struct held *h = ch->held[d];
    if (h == NULL)
        return;
    uint64_t now = apx_now_ms(), at = h->release_ms;
    uint64_t wait = at > now ? at - now : 0;
    struct timeval tv = {.tv_sec = (time_t)(wait / 1000),
                         .tv_usec = (suseconds_t)(wait % 1000) * 1000};
    evtimer_add(ch->held_timer[d], &tv);
}

/* Start holding on `ch` from `from` until `release_ms`. */
struct held *apx_held_push(struct achan *ch, int from, uint64_t release_ms, bool open)
{
    struct held *h = calloc(1, sizeof(*h));
    if (h == NULL || (h->frames = evbuffer_new()) == NULL) {
        free(h);
        return NULL;
    }
    h->release_ms = release_ms;
    h->open = open;
    if (ch->held_tail[from] != NULL)
        ch->held_tail[from]->next = h;
    else
        ch->held[from] = h;
    ch->held_tail[from] = h;
    if (ch->held[from] == h)
        held_arm(ch, from);
    return h;
}

/* Release held frames whose time has come (all of them when `all`). */
void apx_held_release(struct achan *ch, int from, bool all)
{
    struct amqp_px *ax = ch->ax;
    enum session_side to = apx_other((enum session_side)from);
    uint64_t now = apx_now_ms();
    while (ch->held[from] != NULL) {
        struct held *h = ch->held[from];
        if (!all && h->release_ms > now)
            break;
        apx_send_frames(ax, to, h->frames);
        if (ch->content[from].entry == h) {
            /* The rest of this content goes straight through now. */
            ch->content[from].fate = FATE_FORWARD;
            ch->content[from].entry = NULL;
        }
        ch->held[from] = h->next;
        if (ch->held[from] == NULL)
            ch->held_tail[from] = NULL;
        else if (ch->held[from]->release_ms == 0)
            ch->held[from]->release_ms = now;
        evbuffer_free(h->frames);
        free(h);
    }
    held_arm(ch, from);
    apx_chan_unblock(ch, (enum session_side)from);
}

/* Bytes held (delayed) on every channel from `from`. */
static size_t held_bytes(const struct amqp_px *ax, int from)
{
    size_t n = 0;
    for (size_t i = 0; i < ax->n_chans; i++)
        for (const struct held *h = ax->chans[i]->held[from]; h != NULL; h = h->next)
            n += evbuffer_get_length(h->frames);
    return n;
}

size_t apx_held_max(const struct amqp_px *ax)
{
    uint64_t m = ax->s->cfg->l->max_held;
    return (size_t)(m != 0 ? m : CONF_DEFAULT_MAX_HELD);
}

/* Backpressure for holds: a delay must not turn into unbounded memory. */
void apx_held_limit(struct amqp_px *ax)
{
    size_t max = apx_held_max(ax);
    for (int from = 0; from < 2; from++) {
        size_t n = held_bytes(ax, from);
        if (n >= max)
            pump_hold_reading(&ax->pump, (enum session_side)from, true);
        else if (n < max / 2)
            pump_hold_reading(&ax->pump, (enum session_side)from, false);
    }
}

void apx_on_held_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct achan *ch = arg;
    struct amqp_px *ax = ch->ax;
    if (!apx_alive(ax))
        return;
    for (int d = 0; d < 2; d++)
        apx_held_release(ch, d, false);
    apx_send_flush(ax, SIDE_CLIENT);
    apx_send_flush(ax, SIDE_UPSTREAM);
    if (apx_alive(ax))
        apx_held_limit(ax);
}

/* ---- settlements (client ack / nack / reject) -------------------------- */

/* Twice settles a delivery itself (duplicate, drop, an expiry, a late copy); whether it
 * wrote a frame for the broker. */
bool apx_settle_now(struct achan *ch, uint64_t tag, bool requeue)
{
    uint8_t frame[64];
    int n = amqp_ledger_twice_settle(ch->ledger, ch->id, tag, requeue, frame, sizeof(frame));
    if (n > 0)
        apx_chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
    return n > 0;
}

/* The channel of a message whose timer fired, or NULL when its session is going away. */
struct achan *apx_timer_chan(const struct msg_info *mi)
{
    return apx_alive(mi->ch->ax) ? mi->ch : NULL;
}

static void on_hold_release(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct msg_info *mi = arg;
    struct achan *ch = apx_timer_chan(mi);
    if (ch == NULL)
        return;
    uint8_t frame[64];
    /* The release forgets the tag and frees `mi` (and this timer): nothing
     * of it may be used afterwards. */
    int n = amqp_ledger_release(ch->ledger, ch->id, mi->tag, frame, sizeof(frame));
    if (n > 0) {
        apx_chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
        apx_send_flush(ch->ax, SIDE_UPSTREAM);
    }
}

/* A late copy is due (`redeliver after D` D after the ack, `duplicate after D` D after the
 * delivery): the message goes back to its queue upstream (a reject with requeue), as if its
 * ack had never come; the client's ack, held or still to come, is discarded or swallowed.  A
 * visibility timeout that ran out first has requeued it already.  Settling a held tag forgets
 * it and frees mi (and this timer). */
void apx_on_late_copy(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct msg_info *mi = arg;
    mi->ch->ax->n_late--; /* fired: no longer pending (its session may be closing) */
    struct achan *ch = apx_timer_chan(mi);
    if (ch == NULL)
        return;
    struct amqp_px *ax = ch->ax;
    uint64_t tag = mi->tag;
    if (!amqp_ledger_twice_settleable(ch->ledger, tag))
        return;
    log_msg(LOG_INFO, "late copy",
            "sid=%llu listener=%s channel=%u delivery_tag=%llu after_ms=%u action=%s",
            (unsigned long long)ax->s->id, ax->s->cfg->l->name, ch->id, (unsigned long long)tag,
            mi->late_ms, mi->hold_ack ? "duplicate" : "redeliver");
    if (apx_settle_now(ch, tag, true))
        apx_send_flush(ax, SIDE_UPSTREAM);
}

/* Arms one of mi's timers (*slot: its hold release, its expiry or its late copy, which run
 * apart: an ack held past the visibility timeout is both). */
bool apx_arm_timer(struct amqp_px *ax, struct msg_info *mi, struct event **slot, uint32_t ms,
                   void (*cb)(evutil_socket_t, short, void *))
{
    if (*slot != NULL)
        event_free(*slot);
    *slot = evtimer_new(ax->s->loop->base, cb, mi);
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return *slot != NULL && evtimer_add(*slot, &tv) == 0;
}

bool apx_arm_late(struct amqp_px *ax, struct msg_info *mi, uint32_t ms)
{
    bool was = mi->late_timer != NULL && evtimer_pending(mi->late_timer, NULL);
    bool ok = apx_arm_timer(ax, mi, &mi->late_timer, ms, apx_on_late_copy);
    if (ok && !was)
        ax->n_late++;
    else if (!ok && was)
        ax->n_late--; /* the timer it replaced was freed */
    return ok;
}

/* Flush every settlement twice holds on `ch` (before the client closes the
 * channel or recovers: held acks are not lost to a close). */
void apx_release_all_held_acks(struct achan *ch)
{
    uint64_t tags[64];
    size_t n;
    while ((n = amqp_ledger_held(ch->ledger, tags, 64)) > 0) {
        size_t k = n < 64 ? n : 64;
        for (size_t i = 0; i < k; i++) {
            uint8_t frame[64];
            const struct msg_info *mi = amqp_ledger_info(ch->ledger, tags[i]);
            int len =
                amqp_plan_release_held(mi != NULL && mi->late_timer != NULL) == AMQP_RELEASE_REQUEUE
                    ? amqp_ledger_twice_settle(ch->ledger, ch->id, tags[i], true, frame,
                                               sizeof(frame))
                    : amqp_ledger_release(ch->ledger, ch->id, tags[i], frame, sizeof(frame));
            if (len > 0) {
                apx_settle(ch->ax);
                evbuffer_add(apx_chan_out(ch, SIDE_CLIENT), frame, (size_t)len);
            }
        }
    }
}

/* Remembers the rule that holds or dropped mi's ack (the first). */
static void note_ack_rule(struct amqp_px *ax, struct msg_info *mi, const struct rule *r)
{
    if (mi == NULL || mi->ack_rules != NULL)
        return;
    mi->ack_rule = r;
    mi->ack_rules = ax->s->loop->rules;
    ruleset_get(mi->ack_rules);
}

void apx_note_late_rule(struct amqp_px *ax, struct msg_info *mi, const struct rule *r)
{
    if (mi->late_rules != NULL)
        return;
    mi->late_rule = r;
    mi->late_rules = ax->s->loop->rules;
    ruleset_get(mi->late_rules);
}

/* Delivery tags and rule names a shutdown line lists at most (`commands=` counts them all). */
#define APX_SHUTDOWN_TAGS_MAX 32
#define APX_SHUTDOWN_RULES_MAX 8
/* Room for the lists: 32 tags of up to 20 digits, 8 rule names of up to 64 bytes, and commas. */
#define APX_SHUTDOWN_LIST_BYTES 704

/* Appends ",text" ("text" when buf is empty) to buf, a NUL-terminated string in cap bytes;
 * what does not fit is left out. */
static void list_add(char *buf, size_t cap, const char *text)
{
    size_t len = strlen(buf);
    if (len + 1 < cap)
        snprintf(buf + len, cap - len, "%s%s", len > 0 ? "," : "", text);
}

/* Adds name to names[] (at most APX_SHUTDOWN_RULES_MAX, each once). */
static void add_rule_name(const char **names, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp(names[i], name) == 0)
            return;
    if (*n < APX_SHUTDOWN_RULES_MAX)
        names[(*n)++] = name;
}

/* The rule that holds mi's settlement: a delay's, else a late copy's. */
static const char *held_rule_name(const struct msg_info *mi)
{
    const struct rule *r = mi == NULL ? NULL : mi->ack_rule != NULL ? mi->ack_rule : mi->late_rule;
    return r != NULL ? r->name : "-";
}

/* The line for one channel's held settlements: the one a Redis listener writes for the
 * commands it had scheduled (resp_aux.c), with the tags and the rules that held them. */
static void log_held_chan(const struct amqp_px *ax, const struct achan *ch)
{
    uint64_t tags[APX_SHUTDOWN_TAGS_MAX];
    size_t total = amqp_ledger_held(ch->ledger, tags, APX_SHUTDOWN_TAGS_MAX);
    if (total == 0)
        return;
    size_t shown = total < APX_SHUTDOWN_TAGS_MAX ? total : APX_SHUTDOWN_TAGS_MAX;
    char list[APX_SHUTDOWN_LIST_BYTES] = "", rules[APX_SHUTDOWN_LIST_BYTES] = "";
    const char *names[APX_SHUTDOWN_RULES_MAX];
    size_t n_names = 0;
    for (size_t i = 0; i < shown; i++) {
        char tag[24];
        snprintf(tag, sizeof(tag), "%llu", (unsigned long long)tags[i]);
        list_add(list, sizeof(list), tag);
        add_rule_name(names, &n_names, held_rule_name(amqp_ledger_info(ch->ledger, tags[i])));
    }
    if (shown < total)
        list_add(list, sizeof(list), "...");
    for (size_t i = 0; i < n_names; i++)
        list_add(rules, sizeof(rules), names[i]);
    struct log_line line;
    log_begin(&line, LOG_WARN, "shutdown drops commands twice had scheduled");
    log_u64(&line, "sid", ax->s->id);
    log_str(&line, "listener", ax->s->cfg->l->name);
    log_u64(&line, "channel", ch->id);
    log_u64(&line, "commands", total);
    log_str(&line, "delivery_tags", list);
    log_str(&line, "rules", rules);
    log_end(&line);
}

void apx_log_held_at_shutdown(const struct amqp_px *ax)
{
    for (size_t i = 0; i < ax->n_chans; i++)
        log_held_chan(ax, ax->chans[i]);
}

/* Carries out plan p of one settled tag: arms its timers and sets the ledger's verdict (the
 * planner's fallback when a timer cannot be armed: amqp_plan_settle_verdict()).  Returns false
 * when the session was cut (`close before`). */
static bool settle_apply(struct amqp_px *ax, struct amqp_plan_tag *t,
                         const struct amqp_settle_plan *p)
{
    struct msg_info *mi = t->info;
    if (p->cut_before != NULL) {
        apx_cut(ax, p->cut_before, SIDE_CLIENT);
        return false;
    }
    bool late_ok = true, hold_ok = true;
    if (p->late && (late_ok = apx_arm_late(ax, mi, p->late_ms))) {
        /* Held, then requeued at D instead of forwarded. */
        mi->late_ms = p->late_ms;
        apx_note_late_rule(ax, mi, p->late_rule);
    }
    if (p->hold)
        hold_ok = apx_arm_timer(ax, mi, &mi->timer, p->hold_ms, on_hold_release);
    if (p->ack_rule != NULL && (hold_ok || p->ack_rule != p->hold_rule))
        note_ack_rule(ax, mi, p->ack_rule);
    t->verdict = amqp_plan_settle_verdict(p, late_ok, hold_ok);
    return true;
}

/* Commit a settle or confirm plan for the frame of `len` bytes at the head
 * of `in`, read from side `from`: the frame goes on unchanged, or is
 * replaced by what the ledger wrote.  Returns the commit's result (negative
 * on error, the frame then left in `in`). */
int apx_apply_plan(struct achan *ch, int from, struct amqp_plan *plan,
                   int (*commit)(struct amqp_ledger *, uint16_t, struct amqp_plan *, uint8_t *,
                                 size_t, size_t *),
                   size_t len)
{
    size_t space = amqp_ledger_plan_space(plan), out = 0;
    uint8_t room[AMQP_PX_FRAME_SPACE]; /* one ack's frames, without a malloc */
    uint8_t *frames = space <= sizeof(room) ? room : malloc(space);
    int rc = frames != NULL ? commit(ch->ledger, ch->id, plan, frames, space, &out)
                            : AMQP_LEDGER_E_NOMEM;
    if (rc == 1) {
        apx_take(ch->ax, apx_chan_out(ch, from), len);
    } else if (rc == 0) {
        apx_take(ch->ax, NULL, len);
        evbuffer_add(apx_chan_out(ch, from), frames, out);
    }
    if (frames != room)
        free(frames);
    return rc;
}

/* What journal_swallowed() journals a swallowed settlement as. */
struct swallowed_ctx {
    struct amqp_px *ax;
    enum journal_kind kind;
};

static void journal_swallowed(void *arg, uint64_t tag, void *info)
{
    struct swallowed_ctx *sw = arg;
    apx_journal_event(sw->ax, sw->kind, info, tag, APX_J_KEPT_BACK);
}

void apx_on_settle(struct amqp_px *ax, struct achan *ch, const struct amqp_method *m, size_t len)
{
    enum amqp_settle_kind kind = m->id == AMQP_BASIC_ACK    ? AMQP_SETTLE_ACK
                                 : m->id == AMQP_BASIC_NACK ? AMQP_SETTLE_NACK
                                                            : AMQP_SETTLE_REJECT;
    /* The usual ack, one outstanding tag that neither the journal nor a rule looks at: settled
     * in the ledger at once and passed on as it came, as a plan whose verdict is to pass. */
    if (kind == AMQP_SETTLE_ACK && !m->ack.multiple && ax->s->px->journal == NULL &&
        !codec_wants(ax->s, RULE_EV_ACK) && ax->n_hold_ack == 0 &&
        amqp_ledger_ack_one(ch->ledger, m->ack.delivery_tag)) {
        codec_count(ax->s, RULE_EV_ACK);
        apx_take(ax, apx_chan_out(ch, SIDE_CLIENT), len);
        return;
    }
    struct amqp_plan plan;
    if (amqp_ledger_settle_begin(ch->ledger, kind, m->ack.delivery_tag, m->ack.multiple,
                                 m->ack.requeue, &plan) != 0) {
        pump_fail(&ax->pump, "tracking delivery tags");
        return;
    }
    /* The client's settlement of deliveries twice had settled upstream (a duplicate, an
     * expire): swallowed, but journaled, for the worker had finished with them then, as kept
     * back: the broker never gets it (twice requeued the message already), so it fails nothing
     * and asks for no new attempt. */
    struct swallowed_ctx sw = {ax, kind == AMQP_SETTLE_ACK ? JOURNAL_KIND_ACK : JOURNAL_KIND_NACK};
    amqp_ledger_settle_swallowed(ch->ledger, &plan, journal_swallowed, &sw);
    struct amqp_settle_after after = {0};
    for (size_t i = 0; i < plan.n; i++) {
        struct amqp_plan_tag *t = &plan.tags[i];
        struct msg_info *mi = t->info;
        apx_journal_event(ax, kind == AMQP_SETTLE_ACK ? JOURNAL_KIND_ACK : JOURNAL_KIND_NACK, mi,
                          t->tag, kind != AMQP_SETTLE_ACK && m->ack.requeue ? APX_J_REQUEUE : 0);
        enum rule_event ev = kind == AMQP_SETTLE_ACK ? RULE_EV_ACK : RULE_EV_NACK;
        struct amqp_settle_facts k = {
            .method = m->id, .tracked = mi != NULL, .hold_ack = mi != NULL && mi->hold_ack};
        struct job_fault f[SESSION_MAX_RULE_HITS];
        size_t n = 0;
        if (amqp_plan_settle_asks_rules(&k))
            n = apx_decide_msg(ax, ev, mi, NULL, NULL, f);
        else
            codec_count(ax->s, ev); /* a late copy's ack: held for it, seen by no rule */
        struct amqp_settle_plan p = amqp_plan_settle(&k, f, n, &after);
        if (!settle_apply(ax, t, &p))
            return;
    }
    int rc = apx_apply_plan(ch, SIDE_CLIENT, &plan, amqp_ledger_settle_commit, len);
    if (rc < 0) {
        if (rc == AMQP_LEDGER_E_NOMEM)
            pump_fail(&ax->pump, "rewriting a settlement");
        else
            apx_protocol_error(ax, "cannot rewrite a settlement: %s", amqp_ledger_strerror(rc));
        return;
    }
    if (after.error.on)
        apx_inject_error(ax, ch, &after.error);
    else if (after.cut_after != NULL)
        apx_cut(ax, after.cut_after, SIDE_CLIENT);
}

/* ---- drain (codec.h) ----------------------------------------------------- */

/* Whether mi's timer *ev is armed, and when it fires. */
static bool armed(struct event *ev, struct timeval *at)
{
    return ev != NULL && evtimer_pending(ev, at);
}

/* A settlement twice keeps back that a drain waits for: held (a delay, or until a late copy,
 * counted with the late copies instead), or dropped while the listener's visibility timeout
 * is still to requeue its message. */
struct kept_count {
    uint64_t acks;
};

static void count_kept(void *arg, uint64_t tag, void *info, bool held)
{
    (void)tag;
    struct kept_count *k = arg;
    struct msg_info *mi = info;
    if (mi != NULL && armed(mi->late_timer, NULL))
        return;
    if (held || (mi != NULL && armed(mi->expire_timer, NULL)))
        k->acks++;
}

void apx_pending(void *state, struct codec_pending *p)
{
    struct amqp_px *ax = state;
    p->late_copies += ax->n_late;
    for (size_t i = 0; i < ax->n_chans; i++) {
        struct achan *ch = ax->chans[i];
        struct kept_count k = {0};
        amqp_ledger_each_kept(ch->ledger, count_kept, &k);
        p->held_acks += k.acks;
        for (int d = 0; d < 2; d++)
            for (const struct held *h = ch->held[d]; h != NULL; h = h->next)
                p->held_messages++;
    }
}

/* The held settlements a drain releases now: those of a `delay` whose hold would end before
 * the listener's visibility (or consumer) timeout runs out.  An ack held until a late copy
 * waits for it, and one held past the timeout is left to expire: the copy those rules make
 * comes when it would have.  Collected first: releasing changes the ledger. */
struct kept_release {
    uint64_t *tags;
    size_t n, cap;
    bool oom;
};

static void pick_release(void *arg, uint64_t tag, void *info, bool held)
{
    struct kept_release *r = arg;
    struct msg_info *mi = info;
    struct timeval hold, expiry;
    if (!held || (mi != NULL && (mi->hold_ack || armed(mi->late_timer, NULL))))
        return;
    if (mi != NULL && armed(mi->expire_timer, &expiry) &&
        (!armed(mi->timer, &hold) || !evutil_timercmp(&hold, &expiry, <)))
        return;
    if (r->n == r->cap) {
        size_t cap = r->cap != 0 ? 2 * r->cap : 16;
        uint64_t *v = realloc(r->tags, cap * sizeof(*v));
        if (v == NULL) {
            r->oom = true;
            return;
        }
        r->tags = v;
        r->cap = cap;
    }
    r->tags[r->n++] = tag;
}

/* Releases what the drain releases on `ch`: its held frames, and the held acks above. */
static void drain_chan(struct achan *ch, struct codec_pending *released)
{
    for (int d = 0; d < 2; d++) {
        for (const struct held *h = ch->held[d]; h != NULL; h = h->next)
            released->held_messages++;
        apx_held_release(ch, d, true);
    }
    struct kept_release r = {0};
    amqp_ledger_each_kept(ch->ledger, pick_release, &r);
    if (r.oom)
        log_msg(LOG_WARN, "drain: held acks kept to their time",
                "sid=%llu listener=%s channel=%u reason=\"out of memory\"",
                (unsigned long long)ch->ax->s->id, ch->ax->s->cfg->l->name, ch->id);
    for (size_t i = 0; i < r.n; i++) {
        uint8_t frame[64];
        /* Forgets the tag and frees its info (and its timers). */
        int n = amqp_ledger_release(ch->ledger, ch->id, r.tags[i], frame, sizeof(frame));
        if (n > 0) {
            apx_chan_inject(ch, SIDE_UPSTREAM, frame, (size_t)n);
            released->held_acks++;
        }
    }
    free(r.tags);
}

void apx_drain(void *state, struct codec_pending *released)
{
    struct amqp_px *ax = state;
    if (!apx_alive(ax))
        return;
    for (size_t i = 0; i < ax->n_chans && apx_alive(ax); i++)
        drain_chan(ax->chans[i], released);
    if (!apx_alive(ax))
        return;
    apx_send_flush(ax, SIDE_UPSTREAM);
    apx_send_flush(ax, SIDE_CLIENT);
    if (apx_alive(ax))
        apx_held_limit(ax);
}

/* A dropped settlement whose message the visibility timeout is still to requeue. */
static void note_expiring(void *arg, uint64_t tag, void *info, bool held)
{
    (void)tag;
    struct msg_info *mi = info;
    if (!held && mi != NULL && armed(mi->expire_timer, NULL))
        *(bool *)arg = true;
}

bool apx_busy(void *state)
{
    struct amqp_px *ax = state;
    if (ax->n_late > 0)
        return true;
    for (size_t i = 0; i < ax->n_chans; i++) {
        struct achan *ch = ax->chans[i];
        struct amqp_ledger_counts c;
        amqp_ledger_counts(ch->ledger, &c);
        if (c.client_unsettled > 0 || c.held > 0 || c.unconfirmed > 0)
            return true;
        if (ch->held[0] != NULL || ch->held[1] != NULL || ch->content[0].active ||
            ch->content[1].active || evbuffer_get_length(ch->deferred) > 0)
            return true;
        bool expiring = false;
        if (c.dropped > 0)
            amqp_ledger_each_kept(ch->ledger, note_expiring, &expiring);
        if (expiring)
            return true;
    }
    return false;
}
