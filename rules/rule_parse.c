/*
 * rule_parse.c - `rule NAME on LISTENER { ... }`: the header, the block's
 * directives and triggers, and the checks over the whole block.
 *
 * Like a listen block, every directive of a rule is single-valued and keeps
 * where it was first written.  Checks between directives (`stream` needs a
 * stream action, `do redeliver` needs a `when`) run after the block, so the
 * order of directives never matters.  Rules are read after every listener,
 * so a rule may name a listener defined further down the file.
 */
#include "rules/rule_parse.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Indexed by enum rule_slot. */
const char *const conf_rule_keywords[RULE_S_COUNT] = {
    "when", "do",    "stream", "disabled", "probability", "every",
    "nth",  "first", "after",  "between",  "limit",       "max-per-message",
};
const size_t conf_n_rule_keywords = RULE_S_COUNT;

/* Largest number of digits in a probability (before and after the dot):
 * the value then stays exact in a double before its one division. */
#define RULE_PROB_MAX_DIGITS 15

struct rule_directive {
    struct conf_dirspec spec;
    void (*fn)(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n);
};

bool conf_is_rule_keyword(const char *word)
{
    for (size_t i = 0; i < RULE_S_COUNT; i++) {
        if (strcmp(word, conf_rule_keywords[i]) == 0) {
            return true;
        }
    }
    return false;
}

const char *rule_join_names(const char *const *names, size_t n, char *buf)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < n && used < RULE_LIST_BYTES; i++) {
        int w = snprintf(buf + used, RULE_LIST_BYTES - used, "%s%s", i > 0 ? ", " : "", names[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

static void rule_stream(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n)
{
    static const char *const names[] = {"upstream", "downstream", "both"};
    int i = conf_value_enum(p, &n->words[1], "stream direction", names, 3,
                            "expected upstream, downstream or both");

    if (i >= 0) {
        rs->r->direction = (enum rule_direction)(i + 1); /* RULE_DIR_* are 1, 2, 3 */
    }
}

static void rule_disabled(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n)
{
    if (n->n_words > 1) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[1].loc, NULL, "'disabled' takes no arguments");
        return;
    }
    rs->r->enabled = false;
}

/* Digits, an optional fraction and an optional '%' into *out; false when the
 * text is not such a number. */
static bool rule_parse_probability(const char *s, double *out)
{
    uint64_t mantissa = 0, divisor = 1;
    unsigned digits = 0;
    bool dot = false;

    for (; (*s >= '0' && *s <= '9') || (*s == '.' && !dot); s++) {
        if (*s == '.') {
            dot = true;
            continue;
        }
        if (++digits > RULE_PROB_MAX_DIGITS) {
            return false;
        }
        mantissa = mantissa * 10 + (uint64_t)(*s - '0');
        divisor *= dot ? 10 : 1;
    }
    if (*s == '%') {
        divisor *= 100;
        s++;
    }
    if (digits == 0 || *s != '\0') {
        return false;
    }
    *out = (double)mantissa / (double)divisor; /* both exact: one rounding */
    return true;
}

/* A bare number is a fraction (`probability 1` is every event, `0.5` half of them): a
 * warning says what it means, and the percentage that was maybe meant. */
static void rule_probability_fraction(struct conf_parser *p, const struct conf_word *w, double v)
{
    char shown[CONF_SHOW_BYTES], pct[32], hint[CONF_HINT_BYTES + CONF_SHOW_BYTES];

    conf_show(w->text, shown);
    rule_probability_text(v, pct, sizeof(pct));
    snprintf(hint, sizeof(hint), "did you mean '%s%%'? write '%s' to say so", shown, pct);
    conf_diag_add(p->diags, CONF_WARNING, w->loc, hint, "probability '%s' is a fraction: %s%s",
                  shown, v >= 1.0 ? "every event (" : pct, v >= 1.0 ? "100%)" : " of the events");
}

static void rule_probability(struct conf_parser *p, struct rule_state *rs,
                             const struct conf_node *n)
{
    const struct conf_word *w = &n->words[1];
    char shown[CONF_SHOW_BYTES];
    const char *s = conf_show(w->text, shown);
    bool percent = strchr(w->text, '%') != NULL;
    double v;

    if (!rule_parse_probability(w->text, &v)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      "write a percentage like 5% or 12.5%, or a fraction like 0.05",
                      "invalid probability '%s'", s);
    } else if (v <= 0.0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "probability '%s' must be greater than 0",
                      s);
    } else if (v > 1.0) {
        char hint[CONF_HINT_BYTES];
        snprintf(hint, sizeof(hint), "did you mean '%s%%'?", s);
        conf_diag_add(p->diags, CONF_ERROR, w->loc, percent ? NULL : hint,
                      "probability '%s' is more than %s", s, percent ? "100%" : "1");
    } else {
        rs->r->trigger.has_probability = true;
        rs->r->trigger.probability = v;
        if (!percent) {
            rule_probability_fraction(p, w, v);
        }
    }
}

/* A whole number 1..max for the trigger `what`; false after an error. */
static bool rule_value_count(struct conf_parser *p, const struct conf_word *w, const char *what,
                             uint64_t max, uint64_t *out)
{
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];
    const char *s = w->text;
    uint64_t v = 0;

    for (; *s >= '0' && *s <= '9'; s++) {
        v = v > max ? v : v * 10 + (uint64_t)(*s - '0');
    }
    if (s == w->text || *s != '\0') {
        snprintf(hint, sizeof(hint), "write a whole number, e.g. %s 10", what);
        conf_diag_add(p->diags, CONF_ERROR, w->loc, hint, "invalid number '%s' for '%s'",
                      conf_show(w->text, shown), what);
        return false;
    }
    if (v == 0 || v > max) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "'%s' must be from 1 to %llu, not %s",
                      what, (unsigned long long)max, conf_show(w->text, shown));
        return false;
    }
    *out = v;
    return true;
}

/* every, nth, first, after and limit. */
static void rule_count(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n)
{
    struct rule_trigger *t = &rs->r->trigger;
    const char *what = n->words[0].text;
    uint64_t *slot = strcmp(what, "every") == 0   ? &t->every
                     : strcmp(what, "nth") == 0   ? &t->nth
                     : strcmp(what, "first") == 0 ? &t->first
                     : strcmp(what, "after") == 0 ? &t->after
                                                  : &t->limit;

    rule_value_count(p, &n->words[1], what, RULE_MAX_COUNT, slot);
}

static void rule_max_per_message(struct conf_parser *p, struct rule_state *rs,
                                 const struct conf_node *n)
{
    uint64_t v;

    if (rule_value_count(p, &n->words[1], "max-per-message", RULE_MAX_PER_MESSAGE, &v)) {
        rs->r->trigger.max_per_message = (uint32_t)v;
    }
}

static void rule_between(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n)
{
    struct rule_trigger *t = &rs->r->trigger;
    char a[CONF_SHOW_BYTES], b[CONF_SHOW_BYTES];
    uint32_t start, end;
    /* Both are checked, so that both are reported when both are wrong. */
    bool start_ok = rule_value_duration0(p, &n->words[1], &start);
    bool end_ok = conf_value_duration(p, &n->words[2], &end);

    if (!start_ok || !end_ok) {
        return;
    }
    if (start >= end) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[2].loc, "write between START END",
                      "'between' ends at %s, not after its start %s",
                      conf_show(n->words[2].text, a), conf_show(n->words[1].text, b));
        return;
    }
    t->has_between = true;
    t->between_start_ms = start;
    t->between_end_ms = end;
}

/* Indexed by enum rule_slot. */
static const struct rule_directive rule_table[RULE_S_COUNT] = {
    {{"when", -1, "EVENT [MATCHER...]"}, rule_when_directive},
    {{"do", -1, "ACTION [ARGS...]"}, rule_do_directive},
    {{"stream", 1, "upstream, downstream or both"}, rule_stream},
    {{"disabled", -1, ""}, rule_disabled},
    {{"probability", 1, "P, e.g. 5% or 0.05"}, rule_probability},
    {{"every", 1, "N"}, rule_count},
    {{"nth", 1, "N"}, rule_count},
    {{"first", 1, "N"}, rule_count},
    {{"after", 1, "N"}, rule_count},
    {{"between", 2, "START END, e.g. 0s 10m"}, rule_between},
    {{"limit", 1, "N"}, rule_count},
    {{"max-per-message", 1, "N"}, rule_max_per_message},
};

static const struct rule_directive *rule_find_directive(const char *name)
{
    for (size_t i = 0; i < RULE_S_COUNT; i++) {
        if (strcmp(rule_table[i].spec.name, name) == 0) {
            return &rule_table[i];
        }
    }
    return NULL;
}

/* An unknown directive: a hint when it belongs elsewhere, else "did you mean". */
static void rule_unknown_directive(struct conf_parser *p, const struct conf_node *n)
{
    const char *name = n->words[0].text;
    char hint[CONF_HINT_BYTES];
    bool global = false;

    for (size_t i = 0; i < conf_n_global_keywords; i++) {
        global = global || strcmp(name, conf_global_keywords[i]) == 0;
    }
    for (int k = 0; k < RULE_ACT_COUNT && !global; k++) {
        if (strcmp(name, rule_action_name((enum rule_action_kind)k)) == 0 &&
            !conf_is_rule_keyword(name)) {
            /* `delay 5s` for `do delay 5s`; an action name is short and printable */
            snprintf(hint, sizeof(hint), "did you mean 'do %s'?", name);
            conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, hint, "unknown directive '%s'",
                          name);
            return;
        }
    }
    if (global) {
        conf_unknown_directive(p, n, conf_rule_keywords, RULE_S_COUNT, conf_global_keywords,
                               conf_n_global_keywords,
                               "'%s' belongs at the top level, outside rule blocks");
    } else {
        conf_unknown_directive(p, n, conf_rule_keywords, RULE_S_COUNT, conf_listen_keywords,
                               conf_n_listen_keywords, "'%s' belongs inside a listen block");
    }
}

static void rule_block(struct conf_parser *p, struct rule_state *rs, const struct conf_node *block)
{
    for (const struct conf_node *n = block; n != NULL && !p->oom; n = n->next) {
        const struct rule_directive *d = rule_find_directive(n->words[0].text);
        if (d == NULL) {
            rule_unknown_directive(p, n);
            continue;
        }
        if (conf_check_duplicate(p, n, &rs->first[d - rule_table]) &&
            conf_check_shape(p, n, &d->spec)) {
            d->fn(p, rs, n);
        }
    }
}

/* The names of the stream actions, comma separated, into buf (RULE_LIST_BYTES). */
static const char *rule_stream_action_names(char *buf)
{
    const char *names[RULE_ACT_COUNT];
    size_t n = 0;

    for (int k = 0; k < RULE_ACT_COUNT; k++) {
        if (rule_action_is_stream((enum rule_action_kind)k)) {
            names[n++] = rule_action_name((enum rule_action_kind)k);
        }
    }
    return rule_join_names(names, n, buf);
}

/* A non-stream action in a rule that does not say which event it acts on. */
static void rule_check_needs_event(struct conf_parser *p, const struct rule *r)
{
    const char *act = rule_action_name(r->action.kind);
    bool on_connect = r->action.kind == RULE_ACT_CLOSE || r->action.kind == RULE_ACT_DELAY;

    conf_diag_add(p->diags, CONF_ERROR, r->action.loc, NULL,
                  "'do %s' needs 'when EVENT': %s acts on %s", act, act,
                  on_connect ? "an event such as connect" : "a message event");
}

/* Checks between the directives of a block, once it is read. */
static void rule_check_block(struct conf_parser *p, const struct rule_state *rs)
{
    const struct rule *r = rs->r;
    bool event_known = rs->first[RULE_S_WHEN].line == 0 || rs->event_loc.line != 0;
    char list[RULE_LIST_BYTES];

    if (rs->action_known && !rule_action_is_stream(r->action.kind)) {
        if (rs->first[RULE_S_WHEN].line == 0) {
            rule_check_needs_event(p, r);
        }
        if (rs->first[RULE_S_STREAM].line != 0) {
            conf_diag_add(p->diags, CONF_ERROR, rs->first[RULE_S_STREAM], NULL,
                          "'stream' applies only to stream actions (%s)",
                          rule_stream_action_names(list));
        }
    }
    if (rs->first[RULE_S_MAX_PER_MESSAGE].line != 0 && event_known &&
        (r->event == RULE_EV_STREAM || r->event == RULE_EV_CONNECT)) {
        conf_diag_add(p->diags, CONF_ERROR, rs->first[RULE_S_MAX_PER_MESSAGE],
                      r->event == RULE_EV_STREAM ? "this rule has no 'when'"
                                                 : "'connect' is not a message event",
                      "'max-per-message' applies to message events");
    }
}

/* Check the words of `rule NAME on LISTENER`; returns whether NAME and
 * LISTENER are there to be checked. */
static bool rule_header(struct conf_parser *p, const struct conf_node *n)
{
    char shown[CONF_SHOW_BYTES];
    size_t n_args = n->n_words - 1;
    bool on_ok = n_args >= 2 && strcmp(n->words[2].text, "on") == 0;

    if (n_args != 3) {
        conf_diag_add(p->diags, CONF_ERROR, n_args > 3 ? n->words[4].loc : n->words[0].loc, NULL,
                      "'rule' takes three arguments: NAME on LISTENER");
    }
    if (n_args >= 1) {
        conf_value_name(p, &n->words[1], "rule");
    }
    if (n_args >= 2 && !on_ok) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[2].loc, "rule NAME on LISTENER { ... }",
                      "expected 'on' after the rule name, found '%s'",
                      conf_show(n->words[2].text, shown));
    }
    if (!n->has_block) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, NULL,
                      "'rule' needs a block: rule NAME on LISTENER { ... }");
    }
    return n_args >= 3 && on_ok;
}

/* A new rule with its defaults and the names of its header, or NULL after
 * conf_parser_oom(). */
static struct rule *rule_new(struct conf_parser *p, const struct conf_node *n)
{
    struct rule *r = conf_mem_calloc(1, sizeof(*r));

    if (r == NULL) {
        conf_parser_oom(p);
        return NULL;
    }
    r->loc = n->words[0].loc;
    r->event = RULE_EV_STREAM;
    r->trigger.max_per_message = 1;
    r->direction = RULE_DIR_BOTH;
    r->enabled = true;
    r->name = conf_parser_strdup(p, n->n_words > 1 ? n->words[1].text : "");
    r->listener = conf_parser_strdup(p, n->n_words > 3 ? n->words[3].text : "");
    if (r->name == NULL || r->listener == NULL) {
        rule_list_free(r);
        return NULL;
    }
    return r;
}

/* Report a rule whose name an earlier rule already has. */
static void rule_check_unique(struct conf_parser *p, const struct rule *r,
                              const struct conf_word *name)
{
    char shown[CONF_SHOW_BYTES];

    for (const struct rule *o = p->rules; o != NULL; o = o->next) {
        if (strcmp(o->name, r->name) == 0) {
            conf_diag_add(p->diags, CONF_ERROR, name->loc, NULL,
                          "rule '%s' is already defined at %u:%u", conf_show(r->name, shown),
                          o->loc.line, o->loc.col);
            return;
        }
    }
}

/* Find the rule's listener and check the rule against its codec. */
static void rule_resolve(struct conf_parser *p, const struct rule_state *rs,
                         const struct conf_node *n)
{
    const struct conf_word *w = &n->words[3];
    const char *names[CONF_MAX_LISTENERS];
    char shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];
    const struct conf_listener *l = conf_find_listener(p->base, w->text);
    size_t n_names = 0;

    rule_check_has_do(p, rs, n, l);
    if (l != NULL) {
        rule_check_caps(p, rs, l);
        return;
    }
    for (l = p->base != NULL ? p->base->listeners : NULL; l != NULL && n_names < CONF_MAX_LISTENERS;
         l = l->next) {
        names[n_names++] = l->name;
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc,
                  conf_hint_suggest(w->text, names, n_names, hint, NULL), "unknown listener '%s'",
                  conf_show(w->text, shown));
}

void conf_rule_directive(struct conf_parser *p, const struct conf_node *n)
{
    struct rule_state rs = {0};
    bool named = rule_header(p, n);

    if (!n->has_block) {
        return;
    }
    if (p->n_rules >= CONF_MAX_RULES) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, NULL, "too many rules (at most %d)",
                      CONF_MAX_RULES);
        return;
    }
    rs.r = rule_new(p, n);
    if (rs.r == NULL) {
        return;
    }
    rule_block(p, &rs, n->children);
    if (!p->oom) {
        rule_check_block(p, &rs);
    }
    if (p->oom || !named) {
        if (!p->oom) {
            rule_check_has_do(p, &rs, n, NULL);
        }
        rule_list_free(rs.r);
        return;
    }
    rule_check_unique(p, rs.r, &n->words[1]);
    rule_resolve(p, &rs, n);
    *p->rules_tail = rs.r;
    p->rules_tail = &rs.r->next;
    p->n_rules++;
}
