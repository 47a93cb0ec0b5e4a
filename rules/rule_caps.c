/*
 * rule_caps.c - a rule checked against what its listener's codec can do.
 *
 * Everything that depends on the protocol comes from the codec's table
 * (rules/caps.h): the events it produces, the fields each event can be
 * matched on, the actions it can take on each, and why it cannot take the
 * others.  No protocol is named here, so a new codec needs no change.
 */
#include "proto/amqp/amqp.h"
#include "rules/caps.h"
#include "rules/diag.h"
#include "rules/rule_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for "'connect' events" and the like. */
#define RULE_PHRASE_BYTES 64
/* Room for "header.NAME" quoted in a message. */
#define RULE_FIELD_SHOW_BYTES (CONF_SHOW_BYTES + 8)

/* How a message names the events of `ev`: "the byte stream" for a rule
 * with no `when`, else "'ack' events". */
static const char *rule_event_phrase(enum rule_event ev, char *buf)
{
    if (ev == RULE_EV_STREAM) {
        return "the byte stream";
    }
    snprintf(buf, RULE_PHRASE_BYTES, "'%s' events", rule_event_name(ev));
    return buf;
}

/* The names of the events in `mask` that a `when` can name, joined. */
static const char *rule_event_list(uint32_t mask, char *buf)
{
    const char *names[RULE_EV_COUNT];
    size_t n = 0;

    for (int e = RULE_EV_STREAM + 1; e < RULE_EV_COUNT; e++) {
        if (mask & CAPS_BIT(e)) {
            names[n++] = rule_event_name((enum rule_event)e);
        }
    }
    return rule_join_names(names, n, buf);
}

static const char *rule_field_list(uint32_t mask, char *buf)
{
    const char *names[RULE_F_COUNT];
    size_t n = 0;

    for (int f = 0; f < RULE_F_COUNT; f++) {
        if (mask & CAPS_BIT(f)) {
            names[n++] = f == RULE_F_HEADER ? "header.NAME" : rule_field_name((enum rule_field)f);
        }
    }
    return rule_join_names(names, n, buf);
}

static const char *rule_action_list(uint32_t mask, char *buf)
{
    const char *names[RULE_ACT_COUNT];
    size_t n = 0;

    for (int k = 0; k < RULE_ACT_COUNT; k++) {
        if (mask & CAPS_BIT(k)) {
            names[n++] = rule_action_name((enum rule_action_kind)k);
        }
    }
    return rule_join_names(names, n, buf);
}

/* The codec's reason, or NULL. */
static const char *rule_why_not(const struct proto_caps *caps, enum rule_event ev,
                                enum rule_action_kind act)
{
    return caps->why_not != NULL ? caps->why_not(ev, act) : NULL;
}

/* Whether the codec produces the rule's event; reported when not. */
static bool rule_caps_event(struct conf_parser *p, const struct rule_state *rs,
                            const struct conf_listener *l, const struct proto_caps *caps)
{
    const struct rule *r = rs->r;
    const char *why = rule_why_not(caps, r->event, RULE_ACT_COUNT);
    char name[CONF_SHOW_BYTES], list[RULE_LIST_BYTES], hint[RULE_LIST_BYTES + 32];

    if (caps->events & CAPS_BIT(r->event)) {
        return true;
    }
    snprintf(hint, sizeof(hint), "its events: %s", rule_event_list(caps->events, list));
    conf_diag_add(p->diags, CONF_ERROR, rs->event_loc.line != 0 ? rs->event_loc : r->loc,
                  list[0] != '\0' ? hint : NULL,
                  "listener '%s' (protocol %s) has no '%s' event%s%s", conf_show(l->name, name),
                  caps->name, rule_event_name(r->event), why != NULL ? ": " : "",
                  why != NULL ? why : "");
    return false;
}

/* Report each matcher on a field the event does not offer. */
static void rule_caps_matchers(struct conf_parser *p, const struct rule *r,
                               const struct conf_listener *l, const struct proto_caps *caps)
{
    uint32_t allowed = caps->matchers[r->event];
    char name[CONF_SHOW_BYTES], field[RULE_FIELD_SHOW_BYTES], shown[CONF_SHOW_BYTES];
    char list[RULE_LIST_BYTES], hint[RULE_LIST_BYTES + 32];

    snprintf(hint, sizeof(hint), "it can match: %s", rule_field_list(allowed, list));
    for (size_t i = 0; i < r->n_matchers; i++) {
        const struct rule_matcher *m = &r->matchers[i];
        if (allowed & CAPS_BIT(m->field)) {
            continue;
        }
        if (m->field == RULE_F_HEADER) {
            snprintf(field, sizeof(field), "header.%s", conf_show(m->header, shown));
        } else {
            snprintf(field, sizeof(field), "%s", rule_field_name(m->field));
        }
        conf_diag_add(p->diags, CONF_ERROR, m->loc,
                      allowed != 0 ? hint : "nothing can be matched on them",
                      "'%s' cannot be matched on '%s' events of listener '%s' (protocol %s)", field,
                      rule_event_name(r->event), conf_show(l->name, name), caps->name);
    }
}

/* Report an action the codec cannot take on the rule's event. */
static void rule_caps_action(struct conf_parser *p, const struct rule *r,
                             const struct conf_listener *l, const struct proto_caps *caps)
{
    uint32_t allowed = caps->actions[r->event];
    const char *why = rule_why_not(caps, r->event, r->action.kind);
    char name[CONF_SHOW_BYTES], phrase[RULE_PHRASE_BYTES], list[RULE_LIST_BYTES];
    char hint[RULE_LIST_BYTES + 32];

    if (allowed & CAPS_BIT(r->action.kind)) {
        return;
    }
    snprintf(hint, sizeof(hint), "it can do: %s", rule_action_list(allowed, list));
    conf_diag_add(p->diags, CONF_ERROR, r->action.loc, allowed != 0 ? hint : NULL,
                  "listener '%s' (protocol %s) cannot do '%s' on %s%s%s", conf_show(l->name, name),
                  caps->name, rule_action_name(r->action.kind), rule_event_phrase(r->event, phrase),
                  why != NULL ? ": " : "", why != NULL ? why : "");
}

/* `do redeliver after D` / `do duplicate after D`: the codec must be able to
 * choose when the copy comes, and the listener's own timeout must not hand
 * the message out first (a held ack counts as not acked, and the ack comes
 * after the delivery, so a copy due at or past the timeout never happens
 * at D). */
static void rule_caps_late(struct conf_parser *p, const struct rule *r,
                           const struct conf_listener *l, const struct proto_caps *caps)
{
    const struct rule_action *a = &r->action;
    const char *act = rule_action_name(a->kind), *why;
    char name[CONF_SHOW_BYTES], phrase[RULE_PHRASE_BYTES], hint[RULE_LIST_BYTES + 64];

    if ((a->kind != RULE_ACT_REDELIVER && a->kind != RULE_ACT_DUPLICATE) || a->duration_ms == 0 ||
        !(caps->actions[r->event] & CAPS_BIT(a->kind))) {
        return;
    }
    if (!(caps->late[r->event] & CAPS_BIT(a->kind))) {
        why = caps->why_not_late != NULL ? caps->why_not_late(r->event, a->kind) : NULL;
        snprintf(hint, sizeof(hint), "write 'do %s' without 'after'", act);
        conf_diag_add(p->diags, CONF_ERROR, a->loc, hint,
                      "listener '%s' (protocol %s) cannot do '%s after' on %s%s%s",
                      conf_show(l->name, name), caps->name, act,
                      rule_event_phrase(r->event, phrase), why != NULL ? ": " : "",
                      why != NULL ? why : "");
        return;
    }
    if (l->visibility_ms != 0 && a->duration_ms >= l->visibility_ms) {
        const char *timeout = l->consumer_timeout ? "consumer-timeout" : "visibility-timeout";
        char d[24], v[24];
        rule_ms_text(a->duration_ms, d, sizeof(d));
        rule_ms_text(l->visibility_ms, v, sizeof(v));
        snprintf(hint, sizeof(hint),
                 "make it shorter than %s; for a copy %s after the delivery, 'do expire %s' on "
                 "these deliveries with 'do drop' on their acks (docs/rules.md, late copies past "
                 "a visibility timeout)",
                 v, d, d);
        conf_diag_add(p->diags, CONF_ERROR, a->loc, hint,
                      "'%s after %s' cannot happen at that time: listener '%s' has a %s of %s, "
                      "which hands the message out again first (an ack twice holds counts as "
                      "not acked)",
                      act, d, conf_show(l->name, name), timeout, v);
    }
}

/* Whether `do error CODE` names one of AMQP 0-9-1's error reply codes
 * (amqp_reply_error_name()), what a channel or connection may be closed with.
 * A code outside them used to pass and be replaced by 406 at run time, while
 * the log and journal named the code written. */
static bool amqp_error_code(const char *code)
{
    const char *c = code[0] == '-' ? code + 1 : code;
    return strlen(c) == 3 && strspn(c, "0123456789") == 3 &&
           amqp_reply_error_name((uint16_t)atoi(c)) != NULL;
}

static void rule_caps_error_code(struct conf_parser *p, const struct rule *r,
                                 const struct conf_listener *l)
{
    char name[CONF_SHOW_BYTES], code[CONF_SHOW_BYTES];
    if (r->action.kind != RULE_ACT_ERROR || l->protocol != CONF_PROTO_AMQP ||
        r->action.error_code == NULL || amqp_error_code(r->action.error_code))
        return;
    conf_diag_add(p->diags, CONF_ERROR, r->action.loc,
                  "e.g. 406 (precondition-failed), 404 (not-found), 403 (access-refused), "
                  "320 (connection-forced), 541 (internal-error)",
                  "'%s' is not an AMQP 0-9-1 error code for listener '%s' (protocol amqp): one "
                  "of 311-313, 320, 402-406, 501-506, 530, 540, 541",
                  conf_show(r->action.error_code, code), conf_show(l->name, name));
}

void rule_check_has_do(struct conf_parser *p, const struct rule_state *rs,
                       const struct conf_node *n, const struct conf_listener *l)
{
    const struct rule *r = rs->r;
    bool event_known = rs->first[RULE_S_WHEN].line == 0 || rs->event_loc.line != 0;
    const struct proto_caps *caps = l != NULL ? proto_caps_find(l->protocol, l->profile) : NULL;
    uint32_t can = caps != NULL && event_known && (caps->events & CAPS_BIT(r->event))
                       ? caps->actions[r->event]
                       : 0;
    char shown[CONF_SHOW_BYTES], lname[CONF_SHOW_BYTES], phrase[RULE_PHRASE_BYTES];
    char list[RULE_LIST_BYTES], hint[RULE_LIST_BYTES + 2 * CONF_SHOW_BYTES + 64];
    int first = -1;

    if (rs->first[RULE_S_DO].line != 0) {
        return;
    }
    for (int k = 0; k < RULE_ACT_COUNT && first < 0; k++) {
        first = can & CAPS_BIT(k) ? k : -1;
    }
    /* Only what this listener can do on this event is offered: an ack cannot take a latency. */
    if (first >= 0) {
        /* the usage without its option: "do redeliver", "do delay DURATION" */
        const char *usage = rule_action_usage((enum rule_action_kind)first);
        int len = (int)strcspn(usage, "[");
        while (len > 0 && usage[len - 1] == ' ') {
            len--;
        }
        snprintf(hint, sizeof(hint), "e.g. %.*s; listener '%s' (protocol %s) can do on %s: %s", len,
                 usage, conf_show(l->name, lname), caps->name, rule_event_phrase(r->event, phrase),
                 rule_action_list(can, list));
    }
    conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, first >= 0 ? hint : NULL,
                  "rule '%s' has no 'do ACTION'", conf_show(r->name, shown));
}

void rule_check_caps(struct conf_parser *p, const struct rule_state *rs,
                     const struct conf_listener *l)
{
    const struct proto_caps *caps = proto_caps_find(l->protocol, l->profile);

    if (rs->first[RULE_S_WHEN].line != 0 && rs->event_loc.line == 0) {
        return; /* the event is wrong, and already reported */
    }
    if (!rule_caps_event(p, rs, l, caps)) {
        return;
    }
    rule_caps_matchers(p, rs->r, l, caps);
    /* A message action with no `when` is already reported by the language check. */
    if (rs->action_known &&
        (rs->r->event != RULE_EV_STREAM || rule_action_is_stream(rs->r->action.kind))) {
        rule_caps_action(p, rs->r, l, caps);
        rule_caps_late(p, rs->r, l, caps);
        rule_caps_error_code(p, rs->r, l);
    }
}
