/*
 * rule_text.c - a rule's `when` and triggers as text, as a rule file would write them: what
 * `twice check`'s summary and the admin API's `GET /rules` show of each rule, so that what a
 * rule does (a bare `probability 1` is every event) can be read back.
 */
#include "rules/rule.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *rule_ms_text(uint32_t ms, char *buf, size_t cap)
{
    if (ms == 0)
        snprintf(buf, cap, "0s");
    else if (ms % 60000 == 0)
        snprintf(buf, cap, "%um", ms / 60000);
    else if (ms % 1000 == 0)
        snprintf(buf, cap, "%us", ms / 1000);
    else
        snprintf(buf, cap, "%ums", ms);
    return buf;
}

const char *rule_probability_text(double p, char *buf, size_t cap)
{
    /* 10 significant digits: a percentage written with up to 15 digits reads back as written
     * without the binary fraction's tail (0.05 * 100 is 5.000000000000001). */
    snprintf(buf, cap, "%.10g%%", p * 100.0);
    return buf;
}

/* Appends to buf (cap bytes, *used of them written) what fmt says; the text is cut at cap. */
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
{
    if (*used >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *used, cap - *used, fmt, ap);
    va_end(ap);
    *used += w > 0 ? (size_t)w : 0;
    if (*used >= cap)
        *used = cap - 1;
}

size_t rule_matchers_text(const struct rule *r, char *buf, size_t cap)
{
    static const char *const ops[] = {
        [RULE_OP_EQ] = "=", [RULE_OP_NE] = "!=", [RULE_OP_CONTAINS] = "~"};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < r->n_matchers; i++) {
        const struct rule_matcher *m = &r->matchers[i];
        const char *sep = i > 0 ? " " : "";
        bool quote = strpbrk(m->value, " \t\"") != NULL || m->value[0] == '\0';
        if (m->field == RULE_F_HEADER)
            append(buf, cap, &used, "%sheader.%s%s", sep, m->header, ops[m->op]);
        else
            append(buf, cap, &used, "%s%s%s", sep, rule_field_name(m->field), ops[m->op]);
        append(buf, cap, &used, quote ? "\"%s\"" : "%s", m->value);
    }
    return used;
}

size_t rule_triggers_text(const struct rule *r, char *buf, size_t cap)
{
    const struct rule_trigger *t = &r->trigger;
    char a[24], b[24];
    size_t used = 0;
    buf[0] = '\0';
    /* In the order the engine checks them (docs/rules.md, triggers). */
    if (t->has_between)
        append(buf, cap, &used, "%sbetween %s %s", used ? ", " : "",
               rule_ms_text(t->between_start_ms, a, sizeof(a)),
               rule_ms_text(t->between_end_ms, b, sizeof(b)));
    if (t->every != 0)
        append(buf, cap, &used, "%severy %llu", used ? ", " : "", (unsigned long long)t->every);
    if (t->nth != 0)
        append(buf, cap, &used, "%snth %llu", used ? ", " : "", (unsigned long long)t->nth);
    if (t->first != 0)
        append(buf, cap, &used, "%sfirst %llu", used ? ", " : "", (unsigned long long)t->first);
    if (t->after != 0)
        append(buf, cap, &used, "%safter %llu", used ? ", " : "", (unsigned long long)t->after);
    if (t->has_probability)
        append(buf, cap, &used, "%sprobability %s", used ? ", " : "",
               rule_probability_text(t->probability, a, sizeof(a)));
    if (t->limit != 0)
        append(buf, cap, &used, "%slimit %llu", used ? ", " : "", (unsigned long long)t->limit);
    if (t->max_per_message > 1)
        append(buf, cap, &used, "%smax-per-message %u", used ? ", " : "", t->max_per_message);
    return used;
}

static const char *direction_text(enum rule_direction d)
{
    return d == RULE_DIR_UPSTREAM ? "upstream" : d == RULE_DIR_DOWNSTREAM ? "downstream" : "both";
}

size_t rule_action_text(const struct rule *r, char *buf, size_t cap)
{
    const struct rule_action *a = &r->action;
    const char *name = rule_action_name(a->kind);
    unsigned long long bytes = (unsigned long long)a->bytes;
    size_t used = 0;
    buf[0] = '\0';
    switch (a->kind) {
    case RULE_ACT_LATENCY:
        append(buf, cap, &used, "%s %ums jitter %ums %s", name, a->duration_ms, a->jitter_ms,
               direction_text(r->direction));
        break;
    case RULE_ACT_BANDWIDTH:
        append(buf, cap, &used, "%s %lluB/s %s", name, bytes, direction_text(r->direction));
        break;
    case RULE_ACT_SLICE:
        append(buf, cap, &used, "%s %lluB delay %ums %s", name, bytes, a->slice_delay_ms,
               direction_text(r->direction));
        break;
    case RULE_ACT_LIMIT:
        append(buf, cap, &used, "%s %lluB %s", name, bytes, direction_text(r->direction));
        break;
    case RULE_ACT_BLACKHOLE:
        append(buf, cap, &used, "%s %s", name, direction_text(r->direction));
        break;
    case RULE_ACT_RESET:
    case RULE_ACT_SLOW_CLOSE:
    case RULE_ACT_DELAY:
    case RULE_ACT_EXPIRE:
        append(buf, cap, &used, "%s %ums", name, a->duration_ms);
        break;
    case RULE_ACT_REDELIVER:
    case RULE_ACT_DUPLICATE:
        if (a->duration_ms != 0)
            append(buf, cap, &used, "%s after %ums", name, a->duration_ms);
        else
            append(buf, cap, &used, "%s", name);
        break;
    case RULE_ACT_CLOSE:
        append(buf, cap, &used, "%s %s", name,
               a->close_when == RULE_CLOSE_BEFORE ? "before" : "after");
        break;
    case RULE_ACT_ERROR:
        append(buf, cap, &used, "%s %s", name, a->error_code ? a->error_code : "");
        break;
    default:
        append(buf, cap, &used, "%s", name);
        break;
    }
    return used;
}
