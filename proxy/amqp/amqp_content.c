/*
 * amqp_content.c - contents on an AMQP connection (amqp_internal.h): a basic.deliver,
 * basic.get-ok or basic.publish with its header and body frames.
 *
 * A content is decided when its header arrives, or when its whole body has, if a rule
 * matches on the body.  Until then its frames stay where they were read while nothing comes
 * between them, else are copied into the connection's small stash of that direction or kept
 * as chains.  Then it goes on, waits (delay), is dropped, or is duplicated as the plan of its
 * rule's fault says (proto/amqp/amqp_plan.h; content_apply() carries it out), and its event is
 * journaled with the message's identity (by default where proto/amqp/amqp_app.h says the app keeps
 * it).
 */
#include "proxy/amqp/amqp_internal.h"

/* ---- content: deliveries and publishes --------------------------------- */

/* Where frames of `ch` from `from` go: behind what is held there, or out. */
struct evbuffer *apx_chan_out(struct achan *ch, int from)
{
    struct held *t = ch->held_tail[from];
    if (t == NULL)
        return ch->ax->pump.out[apx_other((enum session_side)from)];
    if (t->open || t->release_ms == 0)
        return t->frames;
    struct held *h = apx_held_push(ch, from, 0, false);
    return h != NULL ? h->frames : ch->ax->pump.out[apx_other((enum session_side)from)];
}

bool apx_consumer_is(const struct consumer *c, struct amqp_bytes tag)
{
    return tag.len == c->tag_len && (tag.len == 0 || memcmp(tag.p, c->tag, tag.len) == 0);
}

static struct consumer *consumer_find(struct achan *ch, struct amqp_bytes tag)
{
    for (size_t i = 0; i < ch->n_consumers; i++)
        if (apx_consumer_is(&ch->consumers[i], tag))
            return &ch->consumers[i];
    return NULL;
}

static bool rules_need_body(struct amqp_px *ax, enum rule_event ev)
{
    struct ruleset *rs = ax->s->loop->rules;
    for (size_t i = 0; rs != NULL && i < ruleset_count(rs); i++) {
        const struct rule *r = ruleset_rule(rs, i);
        if (r->event != ev || strcmp(r->listener, ax->s->cfg->l->name) != 0)
            continue;
        for (size_t k = 0; k < r->n_matchers; k++)
            if (r->matchers[k].field == RULE_F_BODY)
                return true;
    }
    return false;
}

/* con: the consumer of a basic.deliver (consumer_find), NULL if unknown. */
static struct msg_info *info_from_delivery(struct achan *ch, const struct amqp_method *m,
                                           const struct consumer *con)
{
    struct msg_info *mi = apx_info_new(ch);
    if (mi == NULL)
        return NULL;
    const struct amqp_delivery *d = &m->delivery;
    mi->tag = d->delivery_tag;
    mi->redelivered = d->redelivered;
    mi->exchange = apx_info_dup(mi, d->exchange);
    mi->routing_key = apx_info_dup(mi, d->routing_key);
    if (m->id == AMQP_BASIC_DELIVER) {
        mi->consumer_tag = apx_info_dup(mi, d->consumer_tag);
        mi->queue = con != NULL
                        ? apx_info_dup(mi, (struct amqp_bytes){.p = (const uint8_t *)con->queue,
                                                               .len = con->queue_len})
                        : NULL;
    } else {
        mi->queue = ch->get_queue;
        mi->heap_strs = true;
        ch->get_queue = NULL;
    }
    return mi;
}

static struct msg_info *info_from_publish(struct achan *ch, const struct amqp_method *m)
{
    struct msg_info *mi = apx_info_new(ch);
    if (mi == NULL)
        return NULL;
    mi->exchange = apx_info_dup(mi, m->publish.exchange);
    mi->routing_key = apx_info_dup(mi, m->publish.routing_key);
    struct amqp_bytes queue;
    if (amqp_app_publish_queue(&m->publish, &queue))
        mi->queue = apx_info_dup(mi, queue);
    return mi;
}

/* A publish a rule on publishes may duplicate: its method, encoded again, starts its copy
 * (copy_frame() adds the header and body frames as they pass). */
static void copy_begin(struct achan *ch, struct content *c, const struct amqp_method *m)
{
    uint8_t frame[AMQP_ENCODE_PUBLISH_MAX];
    int n = amqp_encode_basic_publish(frame, sizeof(frame), ch->id, &m->publish);
    if (n > 0 && (c->copy = evbuffer_new()) != NULL &&
        evbuffer_add(c->copy, frame, (size_t)n) != 0) {
        evbuffer_free(c->copy);
        c->copy = NULL;
    }
}

/* Frame f (parsed in place: its bytes are the payload's neighbours) joins the copy. */
static void copy_frame(struct content *c, const struct amqp_frame *f)
{
    if (c->copy != NULL &&
        evbuffer_add(c->copy, f->payload - AMQP_FRAME_HEADER_SIZE, f->frame_len) != 0) {
        evbuffer_free(c->copy);
        c->copy = NULL;
    }
}

void apx_content_begin(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_method *m,
                       size_t len)
{
    struct content *c = &ch->content[from];
    if (c->active) {
        apx_protocol_error(ax, "channel %u: %s inside a content sequence", ch->id,
                           amqp_method_name(m->class_id, m->method_id));
        return;
    }
    /* Not active: cleared (content_end, chan_reset), and nothing writes it till now. */
    c->active = true;
    c->method = m->id;
    if (m->id == AMQP_BASIC_RETURN) {
        c->decided = true;
        c->fate = FATE_FORWARD;
        apx_take(ax, apx_chan_out(ch, from), len);
        return;
    }
    if (m->id == AMQP_BASIC_PUBLISH) {
        /* A publish's identity serves its own event (the journal, a rule on publishes) and,
         * on a channel in confirm mode, its confirm's.  Without them it is not kept: a rule a
         * reload adds before this message's header arrives sees it without one. */
        if (ax->s->px->journal == NULL && !codec_wants(ax->s, RULE_EV_PUBLISH) &&
            !amqp_ledger_in_confirm_mode(ch->ledger)) {
            if (apx_stash_take(ax, c, len) != 0)
                pump_fail(&ax->pump, "keeping a message's frames");
            return;
        }
        c->info = info_from_publish(ch, m);
        if (codec_wants(ax->s, RULE_EV_PUBLISH) &&
            amqp_plan_copy_publish(
                ruleset_fault_kinds(ax->s->loop->rules, ax->s->cfg->l->name, RULE_EV_PUBLISH)))
            copy_begin(ch, c, m);
    } else {
        struct consumer *con =
            m->id == AMQP_BASIC_DELIVER ? consumer_find(ch, m->delivery.consumer_tag) : NULL;
        c->info = info_from_delivery(ch, m, con);
        c->tag = m->delivery.delivery_tag;
        c->ack_required =
            m->id == AMQP_BASIC_DELIVER ? con == NULL || !con->no_ack : !ch->get_no_ack;
    }
    if (c->info == NULL || apx_stash_take(ax, c, len) != 0)
        pump_fail(&ax->pump, "keeping a message's frames");
}

/* The journal's EXPIRED record of a delivery whose timeout ran out: the requeue is the
 * consequence of the rule that held or dropped its ack (`r`, whose FAULT was journaled when it
 * decided), or of the listener's timeout alone (`r` NULL: the worker was slow). */
static void journal_expired(struct amqp_px *ax, const struct msg_info *mi, const struct rule *r,
                            const char *timeout)
{
    struct journal *j = ax->s->px->journal;
    if (j == NULL)
        return;
    char detail[64];
    snprintf(detail, sizeof(detail), "%s %ums", timeout, ax->s->cfg->l->visibility_ms);
    struct journal_record rec = {
        .kind = JOURNAL_KIND_EXPIRED,
        .session = ax->s->id,
        .listener = ax->s->cfg->l->name,
        .client = ax->s->client_addr,
        .queue = mi->queue,
        .task = mi->task,
        .message_id = mi->message_id,
        .delivery_tag = mi->tag,
        .redelivered = mi->redelivered,
        .rule = r != NULL ? r->name : NULL,
        .detail = detail,
    };
    journal_record(j, &rec);
}

static void on_expire(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct msg_info *mi = arg;
    struct achan *ch = apx_timer_chan(mi);
    if (ch == NULL)
        return;
    struct amqp_px *ax = ch->ax;
    uint64_t tag = mi->tag;
    const struct conf_listener *l = ax->s->cfg->l;
    struct amqp_expiry_facts k = {
        .settleable = amqp_ledger_twice_settleable(ch->ledger, tag),
        .expire_rule = mi->expire_rule,
        .ack_rule = mi->ack_rule,
        .consumer_timeout = l->consumer_timeout,
        .channel = ch->id,
        .timeout_ms = l->visibility_ms,
    };
    struct amqp_expiry_plan p;
    amqp_plan_expiry(&k, &p);
    if (p.cause == AMQP_EXPIRY_NONE)
        return;
    /* Noted or journaled first: settling a delivery whose ack twice dropped or holds forgets
     * it and frees mi (and this timer). */
    const struct rule *r = p.rule;
    const char *timeout = amqp_expiry_name(p.cause);
    if (p.cause == AMQP_EXPIRY_RULE) {
        struct engine_event ev;
        char idbuf[96];
        apx_event_from_info(&ev, RULE_EV_DELIVER, mi, ax->s, idbuf, sizeof(idbuf));
        fault_note(ax->s, r, &ev);
    } else {
        journal_expired(ax, mi, r, timeout);
    }
    log_msg(LOG_INFO, "expired",
            "sid=%llu listener=%s channel=%u delivery_tag=%llu rule=%s timeout=%s",
            (unsigned long long)ax->s->id, l->name, ch->id, (unsigned long long)tag,
            r != NULL ? r->name : "-", timeout);
    if (p.close_channel) {
        apx_settle(ax);
        apx_close_channel(ch, p.close_code, p.close_text, 0, 0);
        apx_send_flush(ax, SIDE_UPSTREAM);
        apx_send_flush(ax, SIDE_CLIENT);
        return;
    }
    if (p.requeue && apx_settle_now(ch, tag, true))
        apx_send_flush(ax, SIDE_UPSTREAM);
}

/* An `expire` rule armed on mi: its own visibility timeout; the rule is noted as a fault only
 * if it runs out before the ack (on_expire). */
static void arm_expire(struct amqp_px *ax, struct msg_info *mi, uint32_t ms, const struct rule *r)
{
    if (apx_arm_timer(ax, mi, &mi->expire_timer, ms, on_expire) && mi->expire_rules == NULL) {
        mi->expire_rule = r;
        mi->expire_rules = ax->s->loop->rules;
        ruleset_get(mi->expire_rules);
    }
}

/* Carries out plan p of a delivery or publish (mi: the delivery's record the ledger keeps, NULL
 * for a publish or a no-ack delivery).  What the plan cannot know is settled here as the
 * planner says: a late copy whose timer cannot be armed is a requeue now, a hold that cannot
 * be pushed forwards the message.  Returns false when the session was cut. */
static bool content_apply(struct amqp_px *ax, struct achan *ch, struct content *c,
                          struct msg_info *mi, const struct amqp_content_plan *p)
{
    if (p->settle != AMQP_NOW_NONE)
        apx_settle_now(ch, c->tag, p->settle == AMQP_NOW_REQUEUE);
    if (p->cut_before != NULL) {
        apx_cut(ax, p->cut_before, p->cut_from_broker ? SIDE_UPSTREAM : SIDE_CLIENT);
        return false;
    }
    c->close_after = p->cut_after != NULL;
    c->fate = p->fate == AMQP_FATE_DROP ? FATE_DROP : FATE_FORWARD;
    if (p->error.on) {
        /* The channel is closed under the message: the ledger reset has freed `mi`. */
        apx_inject_error(ax, ch, &p->error);
        return apx_alive(ax);
    }
    if (p->late) {
        if (apx_arm_late(ax, mi, p->late_ms)) {
            mi->hold_ack = true; /* its ack waits for the copy */
            mi->late_ms = p->late_ms;
            apx_note_late_rule(ax, mi, p->late_rule);
            ax->n_hold_ack++;
        } else if (p->settle == AMQP_NOW_NONE) {
            apx_settle_now(ch, c->tag, true);
        }
    }
    if (p->expire)
        arm_expire(ax, mi, p->expire_ms, p->expire_rule);
    if (p->dup)
        c->dup = true;
    if (p->dup_missing) {
        const struct rule *r = p->dup_rule;
        log_msg(LOG_WARN, "publish not duplicated",
                "sid=%llu listener=%s channel=%u rule=%s reason=no_copy",
                (unsigned long long)ax->s->id, ax->s->cfg->l->name, ch->id, r->name);
    }
    if (p->fate == AMQP_FATE_HOLD) {
        c->entry = apx_held_push(ch, c->method != AMQP_BASIC_PUBLISH ? SIDE_UPSTREAM : SIDE_CLIENT,
                                 apx_now_ms() + p->hold_ms, true);
        if (c->entry != NULL)
            c->fate = FATE_HOLD;
    }
    return true;
}

void apx_content_end(struct amqp_px *ax, struct achan *ch, int from)
{
    struct content *c = &ch->content[from];
    bool close_after = c->close_after;
    if (c->dup && c->copy == NULL && amqp_ledger_in_confirm_mode(ch->ledger)) {
        /* Out of memory while copying the body (`dup` is set only with a copy begun), after
         * the ledger numbered the copy: the broker's numbers would not be the ledger's, and
         * every later confirm would name the wrong publish. */
        pump_fail(&ax->pump, "copying a publish");
        return;
    }
    if (c->dup && c->copy != NULL) {
        /* The copy right behind the original: held with it, or on the channel at once. */
        if (c->fate == FATE_HOLD && c->entry != NULL)
            evbuffer_add_buffer(c->entry->frames, c->copy);
        else if (c->fate == FATE_FORWARD) {
            /* The content is still active: the copy waits on the channel's inject buffer and
             * follows once it ends (apx_chan_unblock), as apx_chan_inject() would, unpulled. */
            evbuffer_add_buffer(ch->inject[SIDE_UPSTREAM], c->copy);
            ch->injected[SIDE_UPSTREAM] = true;
        }
    }
    if (c->entry != NULL)
        c->entry->open = false;
    apx_content_clear(ax, c);
    apx_chan_unblock(ch, (enum session_side)from);
    if (close_after) {
        session_set_error(ax->s, "cut after a message (close after)");
        apx_send_flush(ax, apx_other((enum session_side)from));
        pump_abort(&ax->pump, SESSION_CLOSE_FAULT, apx_other((enum session_side)from));
    }
}

/* Hand the stashed frames on as decided. */
static void content_release_stash(struct achan *ch, int from)
{
    struct content *c = &ch->content[from];
    struct evbuffer *dst = c->fate == FATE_DROP   ? NULL
                           : c->fate == FATE_HOLD ? c->entry->frames
                                                  : apx_chan_out(ch, from);
    if (apx_stash_move(ch->ax, c, dst) != 0)
        pump_fail(&ch->ax->pump, "handing a message on");
}

/* The listener's visibility timeout (or consumer timeout) on a delivery, as the planner says
 * (amqp_plan_visibility()), once its plan was carried out. */
static void arm_visibility(struct amqp_px *ax, struct achan *ch, const struct content *c,
                           struct msg_info *mi)
{
    struct amqp_visibility_facts k = {
        .timeout_ms = ax->s->cfg->l->visibility_ms,
        .publish = c->method == AMQP_BASIC_PUBLISH,
        .ack_required = c->ack_required,
        .dropped = c->fate == FATE_DROP,
    };
    /* The ledger is asked only when a timeout could be armed at all. */
    if (k.timeout_ms != 0 && !k.publish && k.ack_required)
        k.kept = mi != NULL && amqp_ledger_info(ch->ledger, c->tag) == mi;
    k.expired = k.kept && mi->expire_timer != NULL;
    uint32_t ms = amqp_plan_visibility(&k);
    if (ms != 0)
        (void)apx_arm_timer(ax, mi, &mi->expire_timer, ms, on_expire);
}

/* The message's identity and task where the app keeps them by default (proto/amqp/amqp_app.h). */
static void default_id(struct msg_info *mi, const struct amqp_props *p)
{
    struct amqp_bytes v;
    if (amqp_app_message_id(p, &v))
        mi->message_id = apx_info_dup(mi, v);
}

static void default_task(struct msg_info *mi, const struct amqp_props *p)
{
    struct amqp_bytes v;
    if (amqp_app_task(p, &v))
        mi->task = apx_info_dup(mi, v);
}

/* A string of mi as bytes; absent (length 0) when NULL. */
static struct amqp_bytes str_bytes(const char *s)
{
    return s != NULL ? amqp_cstr(s) : (struct amqp_bytes){0};
}

/* A value of the listener's `message-id` or `task` longer than twice reads: said once per
 * connection (the message goes on without it, as one whose field is absent). */
static void say_field_too_long(struct amqp_px *ax, const struct msg_field *f, size_t len)
{
    if (ax->said_too_long)
        return;
    ax->said_too_long = true;
    log_msg(LOG_WARN, "message field too long", "sid=%llu listener=%s field=%s bytes=%zu limit=%u",
            (unsigned long long)ax->s->id, ax->s->cfg->l->name, f->text, len,
            MSG_FIELD_VALUE_MAX - 1);
}

/* The first of fs's sources below `below` that message m has, into *dst; returns its index,
 * or `below` when none has.  A body.json source is skipped while the body is not there. */
static uint8_t ident_pick(struct amqp_px *ax, const struct msg_fields *fs, uint8_t below,
                          const struct msg_field_amqp *m, struct msg_info *mi, char **dst)
{
    char v[MSG_FIELD_VALUE_MAX];
    size_t n;
    for (uint8_t i = 0; i < fs->n && i < below; i++) {
        enum msg_field_got got = msg_field_read_amqp(&fs->src[i], m, v, &n);
        if (got == MSG_FIELD_TOO_LONG)
            say_field_too_long(ax, &fs->src[i], n);
        if (got == MSG_FIELD_FOUND) {
            *dst = apx_info_dup(mi, (struct amqp_bytes){.p = (const uint8_t *)v, .len = n});
            return i;
        }
    }
    return below;
}

/* The message's identity and task from the header: the listener's sources when it names them,
 * else default_id() / default_task(). */
static void ident_from_header(struct amqp_px *ax, struct content *c, struct msg_info *mi,
                              const struct amqp_props *p)
{
    const struct conf_listener *l = ax->s->cfg->l;
    c->id_at = c->task_at = MSG_FIELD_MAX_SOURCES;
    mi->retries = amqp_app_retries(p);
    if (l->message_id.n == 0)
        default_id(mi, p);
    if (l->task.n == 0)
        default_task(mi, p);
    if (l->message_id.n == 0 && l->task.n == 0)
        return;
    struct msg_field_amqp m = {.props = p,
                               .routing_key = str_bytes(mi->routing_key),
                               .exchange = str_bytes(mi->exchange),
                               .queue = c->method == AMQP_BASIC_PUBLISH ? (struct amqp_bytes){0}
                                                                        : str_bytes(mi->queue)};
    if (l->message_id.n > 0)
        c->id_at = ident_pick(ax, &l->message_id, MSG_FIELD_MAX_SOURCES, &m, mi, &mi->message_id);
    if (l->task.n > 0)
        c->task_at = ident_pick(ax, &l->task, MSG_FIELD_MAX_SOURCES, &m, mi, &mi->task);
}

/* Once the body is here: a body.json source listed before the one the header gave wins. */
static void ident_from_body(struct amqp_px *ax, struct content *c, struct msg_info *mi)
{
    const struct conf_listener *l = ax->s->cfg->l;
    if (!msg_fields_need_body(&l->message_id) && !msg_fields_need_body(&l->task))
        return;
    size_t n = evbuffer_get_length(c->body);
    const uint8_t *body = evbuffer_pullup(c->body, (ev_ssize_t)n);
    static const struct amqp_props none;
    struct msg_field_amqp m = {.props = &none,
                               .body = body != NULL ? body : (const uint8_t *)"",
                               .body_len = body != NULL ? n : 0};
    char *v = NULL;
    if (msg_fields_need_body(&l->message_id) &&
        ident_pick(ax, &l->message_id, c->id_at, &m, mi, &v) < c->id_at) {
        if (mi->message_id != NULL)
            apx_info_str_free(mi, mi->message_id); /* the header's, which the body's beats */
        mi->message_id = v;
    }
    v = NULL;
    if (msg_fields_need_body(&l->task) &&
        ident_pick(ax, &l->task, c->task_at, &m, mi, &v) < c->task_at) {
        if (mi->task != NULL)
            apx_info_str_free(mi, mi->task);
        mi->task = v;
    }
}

static void content_decide(struct amqp_px *ax, struct achan *ch, int from, struct amqp_bytes hdrs)
{
    struct content *c = &ch->content[from];
    struct msg_info *mi = c->info;
    bool deliver = c->method != AMQP_BASIC_PUBLISH;
    if (c->needs_body && mi != NULL)
        ident_from_body(ax, c, mi);
    c->decided = true;
    c->fate = FATE_FORWARD;
    if (deliver && c->ack_required) {
        c->info = NULL; /* the ledger owns it from here */
        int rc = amqp_ledger_deliver(ch->ledger, c->tag, mi);
        if (rc == AMQP_LEDGER_E_NOMEM) {
            pump_fail(&ax->pump, "tracking a delivery");
            return;
        }
        if (rc != 0) {
            apx_protocol_error(ax, "channel %u: delivery tag %llu out of order", ch->id,
                               (unsigned long long)c->tag);
            return;
        }
    }
    apx_journal_event(ax, deliver ? JOURNAL_KIND_DELIVER : JOURNAL_KIND_PUBLISH, mi, c->tag,
                      deliver && !c->ack_required ? APX_J_AUTO_ACK : 0);
    struct job_fault f[SESSION_MAX_RULE_HITS];
    size_t n = apx_decide_msg(ax, deliver ? RULE_EV_DELIVER : RULE_EV_PUBLISH, mi, &hdrs,
                              c->needs_body ? c->body : NULL, f);
    struct msg_info *tracked = deliver && c->ack_required ? mi : NULL;
    struct amqp_content_facts k = {
        .publish = !deliver,
        .method = c->method,
        .ack_required = deliver && c->ack_required,
        .tracked = tracked != NULL,
        .hold_ack = tracked != NULL && tracked->hold_ack,
        .has_copy = c->copy != NULL,
    };
    struct amqp_content_plan plan = amqp_plan_content(&k, f, n);
    if (!content_apply(ax, ch, c, tracked, &plan))
        return;
    if (c->copy != NULL && (!c->dup || c->fate == FATE_DROP)) {
        evbuffer_free(c->copy); /* no copy goes out: stop copying */
        c->copy = NULL;
        c->dup = false;
    }
    arm_visibility(ax, ch, c, mi);
    if (!deliver) {
        uint64_t seq;
        c->info = NULL;
        /* A copy goes right behind its original (apx_content_end()): in confirm mode the
         * broker numbers it next, and its confirm is the ledger's to swallow. */
        int rc = amqp_ledger_publish(ch->ledger, c->fate == FATE_DROP, mi, &seq);
        if (rc == 0 && c->dup)
            rc = amqp_ledger_publish_copy(ch->ledger);
        if (rc == AMQP_LEDGER_E_NOMEM) {
            pump_fail(&ax->pump, "numbering a publish");
            return;
        }
        if (rc != 0) {
            apx_protocol_error(ax, "channel %u: too many unconfirmed publishes", ch->id);
            return;
        }
    }
    content_release_stash(ch, from);
    if (c->body_left == 0)
        apx_content_end(ax, ch, from);
}

void apx_content_header(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_frame *f,
                        size_t len)
{
    struct content *c = &ch->content[from];
    if (c->active && !c->decided && c->header_seen) {
        apx_protocol_error(ax, "channel %u: a second content header", ch->id);
        return;
    }
    if (!c->active || c->decided || apx_stash_len(ax, c) == 0) {
        if (c->active && c->decided && c->method == AMQP_BASIC_RETURN) {
            struct amqp_props p;
            if (amqp_content_header_decode(f->payload, f->size, &p) == 0)
                c->body_left = p.body_size;
            apx_take(ax, apx_chan_out(ch, from), len);
            if (c->body_left == 0)
                apx_content_end(ax, ch, from);
            return;
        }
        apx_protocol_error(ax, "channel %u: content header without a content method", ch->id);
        return;
    }
    struct amqp_props p;
    int rc = amqp_content_header_decode(f->payload, f->size, &p);
    if (rc != 0) {
        apx_protocol_error(ax, "channel %u: bad content header: %s", ch->id, amqp_strerror(rc));
        return;
    }
    uint64_t max_message = ax->s->cfg->l->max_message;
    if (max_message != 0 && p.body_size > max_message) {
        apx_protocol_error(ax, "channel %u: a message of %llu bytes, over max-message-size %llu",
                           ch->id, (unsigned long long)p.body_size,
                           (unsigned long long)max_message);
        return;
    }
    if (c->info != NULL)
        ident_from_header(ax, c, c->info, &p);
    copy_frame(c, f);
    c->header_seen = true;
    c->body_left = p.body_size;
    enum rule_event ev = c->method == AMQP_BASIC_PUBLISH ? RULE_EV_PUBLISH : RULE_EV_DELIVER;
    const struct conf_listener *l = ax->s->cfg->l;
    c->needs_body =
        p.body_size > 0 && p.body_size <= AMQP_PX_BODY_MATCH_MAX &&
        (rules_need_body(ax, ev) || (c->info != NULL && (msg_fields_need_body(&l->message_id) ||
                                                         msg_fields_need_body(&l->task))));
    /* When the content's frames are kept in place (the method was), the
     * header joins them and stays where it was parsed until the rules have
     * read its headers (content_decide settles only after them).  Else the
     * frame moves into the stash below, and the decision, now or after the
     * body, reads a copy. */
    bool in_place = ax->kept_by == c && !c->needs_body;
    c->headers.len = 0;
    if (!in_place && p.headers.len > 0 && (c->headers_copy = malloc(p.headers.len)) != NULL) {
        memcpy(c->headers_copy, p.headers.p, p.headers.len);
        c->headers.p = c->headers_copy;
        c->headers.len = p.headers.len;
    }
    if (apx_stash_take(ax, c, len) != 0) {
        pump_fail(&ax->pump, "keeping a message's frames");
        return;
    }
    if (!c->needs_body)
        content_decide(ax, ch, from, in_place ? p.headers : c->headers);
}

void apx_content_body(struct amqp_px *ax, struct achan *ch, int from, const struct amqp_frame *f,
                      size_t len)
{
    struct content *c = &ch->content[from];
    if (!c->active || c->body_left < f->size || apx_stash_len(ax, c) + c->decided == 0) {
        apx_protocol_error(ax, "channel %u: unexpected body frame", ch->id);
        return;
    }
    c->body_left -= f->size;
    copy_frame(c, f);
    if (!c->decided) {
        evbuffer_add(c->body, f->payload, f->size);
        if (apx_stash_take(ax, c, len) != 0) {
            pump_fail(&ax->pump, "keeping a message's frames");
            return;
        }
        if (c->body_left == 0)
            content_decide(ax, ch, from, c->headers);
        return;
    }
    if (c->fate == FATE_DROP)
        apx_take(ax, NULL, len);
    else if (c->fate == FATE_HOLD && c->entry != NULL)
        apx_take(ax, c->entry->frames, len);
    else
        apx_take(ax, apx_chan_out(ch, from), len);
    if (c->body_left == 0)
        apx_content_end(ax, ch, from);
}
