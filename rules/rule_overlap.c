/*
 * rule_overlap.c - rules that may want the same event, and the one of them that gets it.
 *
 * One rule acts on the event of a message or a command, on every protocol: the first in file
 * order that fires (rules/engine.h).  A later rule whose matchers and window do not exclude an
 * earlier one's, on the same listener and event, does not see the events the earlier one
 * faults: it acts on those the earlier one leaves (`twice check`'s summary says so).  When the
 * earlier one leaves none (no trigger: it faults each event it matches, once per message), the
 * later one never acts on them: a warning, once per later rule, names the earlier ones with
 * FILE:LINE (not one written `disabled`, which leaves them until it is switched on).  Whether
 * two rules exclude each other is judged from what is written (a `queue=a` and a `queue=b`,
 * `redelivered=true` and `=false`, windows that do not meet); triggers that count (every,
 * first...) or draw (probability) never exclude.
 */
#include "rules/rule_parse.h"

#include "rules/diag.h"
#include "rules/engine.h"

#include <stdio.h>
#include <string.h>

/* Earlier rules named in one warning; more are counted. */
#define RULE_OVERLAP_NAMED 3
/* Room for the names and places of RULE_OVERLAP_NAMED rules. */
#define RULE_OVERLAP_TEXT_BYTES (RULE_OVERLAP_NAMED * (CONF_SHOW_BYTES * 2 + 40) + 40)

/* Whether an event matching `eq` (FIELD=VALUE) can never match `other` (FIELD=VALUE or
 * FIELD!=VALUE on the same field): two values that name nothing in common. */
static bool text_excludes(const struct rule_matcher *eq, const struct rule_matcher *other)
{
    if (other->op == RULE_OP_EQ) {
        if (!eq->is_glob && !other->is_glob)
            return strcmp(eq->value, other->value) != 0;
        if (!eq->is_glob)
            return !engine_glob(other->value, eq->value);
        if (!other->is_glob)
            return !engine_glob(eq->value, other->value);
        return false; /* two globs: judged to meet */
    }
    /* FIELD=v against FIELD!=p: v is one value, which p excludes when it matches it. */
    return other->op == RULE_OP_NE && !eq->is_glob && engine_glob(other->value, eq->value);
}

/* Whether two CIDR blocks have no address in common. */
static bool cidr_excludes(const struct rule_matcher *a, const struct rule_matcher *b)
{
    unsigned bits = a->cidr_prefix < b->cidr_prefix ? a->cidr_prefix : b->cidr_prefix;
    size_t whole = bits / 8;
    if (memcmp(a->cidr_addr, b->cidr_addr, whole) != 0)
        return true;
    if (bits % 8 == 0)
        return false;
    uint8_t mask = (uint8_t)(0xff << (8 - bits % 8));
    return (a->cidr_addr[whole] & mask) != (b->cidr_addr[whole] & mask);
}

/* Whether no event can match both matchers. */
static bool matcher_excludes(const struct rule_matcher *a, const struct rule_matcher *b)
{
    if (a->field != b->field ||
        (a->field == RULE_F_HEADER &&
         strcmp(a->header != NULL ? a->header : "", b->header != NULL ? b->header : "") != 0))
        return false;
    switch (a->field) {
    case RULE_F_REDELIVERED:
        return (a->bool_value == b->bool_value) != (a->op == b->op);
    case RULE_F_CLIENT:
        return a->op == RULE_OP_EQ && b->op == RULE_OP_EQ && cidr_excludes(a, b);
    default:
        if (a->op == RULE_OP_EQ)
            return text_excludes(a, b);
        return b->op == RULE_OP_EQ && text_excludes(b, a);
    }
}

/* Whether two rules' matchers and windows let one event through both. */
static bool rules_meet(const struct rule *a, const struct rule *b)
{
    const struct rule_trigger *ta = &a->trigger, *tb = &b->trigger;
    if (ta->has_between && tb->has_between &&
        (ta->between_end_ms <= tb->between_start_ms || tb->between_end_ms <= ta->between_start_ms))
        return false;
    for (size_t i = 0; i < a->n_matchers; i++)
        for (size_t k = 0; k < b->n_matchers; k++)
            if (matcher_excludes(&a->matchers[i], &b->matchers[k]))
                return false;
    return true;
}

bool rule_takes_before(const struct rule *earlier, const struct rule *later)
{
    return earlier->event == later->event && !engine_event_combines(later->event) &&
           strcmp(earlier->listener, later->listener) == 0 && rules_meet(earlier, later);
}

/* Whether r faults every event it matches (once per message): no trigger leaves one to the
 * rules after it. */
static bool rule_takes_all(const struct rule *r)
{
    const struct rule_trigger *t = &r->trigger;
    return !t->has_probability && t->every == 0 && t->nth == 0 && t->first == 0 && t->after == 0 &&
           !t->has_between && t->limit == 0;
}

/* The earlier rules that take every event of r's they match, as "'a' (FILE:LINE), 'b'
 * (FILE:LINE) or 'c' (FILE:LINE)" into buf; how many there are. */
static size_t earlier_rules(const struct conf_parser *p, const struct rule *r, char *buf,
                            size_t cap)
{
    const char *file = p->diags->file != NULL ? p->diags->file : "<config>";
    const struct rule *named[RULE_OVERLAP_NAMED];
    size_t n = 0, used = 0;
    char a[CONF_SHOW_BYTES], f[CONF_SHOW_BYTES];

    for (const struct rule *o = p->rules; o != NULL && o != r; o = o->next) {
        /* one written `disabled` leaves the events to r until it is switched on */
        if (o->enabled && rule_takes_all(o) && rule_takes_before(o, r)) {
            if (n < RULE_OVERLAP_NAMED)
                named[n] = o;
            n++;
        }
    }
    buf[0] = '\0';
    for (size_t i = 0; i < n && i < RULE_OVERLAP_NAMED && used < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(buf + used, cap - used, "%s'%s' (%s:%u)", sep,
                         conf_show(named[i]->name, a), conf_show(file, f), named[i]->loc.line);
        used += w > 0 ? (size_t)w : 0;
    }
    if (n > RULE_OVERLAP_NAMED && used < cap)
        snprintf(buf + used, cap - used, " or %zu more", n - RULE_OVERLAP_NAMED);
    return n;
}

void rule_check_overlaps(struct conf_parser *p)
{
    char earlier[RULE_OVERLAP_TEXT_BYTES], name[CONF_SHOW_BYTES];

    for (const struct rule *r = p->rules; r != NULL; r = r->next) {
        if (engine_event_combines(r->event))
            continue; /* connection rules all apply, their effects adding up */
        size_t n = earlier_rules(p, r, earlier, sizeof(earlier));
        if (n == 0)
            continue;
        conf_diag_add(p->diags, CONF_WARNING, r->loc,
                      "one rule acts on an event, the first in the file that fires: narrow one "
                      "'when', give the earlier rule a trigger, or put this one first",
                      "rule '%s' never acts on the '%s' events it shares with rule%s %s, which "
                      "come%s first and fault%s each of them (only copies past max-per-message "
                      "are left to it)",
                      conf_show(r->name, name), rule_event_name(r->event), n > 1 ? "s" : "",
                      earlier, n > 1 ? "" : "s", n > 1 ? "" : "s");
    }
}
