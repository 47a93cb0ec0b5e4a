/*
 * toxic_msg.c - a message toxic (Toxiproxy API) as the text of one twice rule.
 *
 * The text is written, not a struct rule filled in, so that a toxic goes through the same
 * checks as a rule file (conf_parse_rules: events per protocol, actions per event, every
 * value's range) and nothing here duplicates them.  What is checked here is what the rule
 * language cannot say about JSON: an attribute's name and JSON type, and that no attribute
 * can write more than its own piece of the rule (a value is quoted, a `when` stays on its
 * line and out of other blocks).  Attributes are read in the order of one table, whatever
 * their order in the object, so a toxic always makes the same text.
 */
#include "rules/toxic_msg.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"
#include "rules/interp.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Longest duration or error code written as a string attribute ("250ms", "READONLY"). */
#define TM_WORD_MAX 32
/* Whole numbers a JSON real may stand for exactly (2^53). */
#define TM_EXACT_MAX 9007199254740992.0
/* Room for one JSON value shown in a message, or one formatted number. */
#define TM_SHOW_BYTES (CONF_SHOW_BYTES + 8)

/* How a type takes its one argument. */
enum tm_arg {
    TM_ARG_NONE = 0,
    TM_ARG_AFTER,    /* optional duration: `do duplicate after D` */
    TM_ARG_DURATION, /* required duration: `do expire D` */
    TM_ARG_CODE,     /* required error code */
    TM_ARG_AT,       /* optional before | after */
};

struct tm_type {
    const char *name; /* the toxic type, the rule's action */
    enum tm_arg arg;
    const char *arg_attr;   /* the attribute of the argument; NULL: none */
    const char *event;      /* the default event on amqp and resp listeners with a profile */
    const char *event_resp; /* on a resp listener with a profile, when not `event` */
};

static const struct tm_type tm_types[] = {
    {"redeliver", TM_ARG_AFTER, "after", "ack", "ack"},
    {"duplicate", TM_ARG_AFTER, "after", "deliver", "deliver"},
    {"expire", TM_ARG_DURATION, "timeout", "deliver", "deliver"},
    {"delay", TM_ARG_DURATION, "delay", "ack", "ack"},
    {"drop", TM_ARG_NONE, NULL, "ack", "ack"},
    {"error", TM_ARG_CODE, "code", "deliver", "command"},
    {"close", TM_ARG_AT, "at", "ack", "ack"},
};
#define TM_N_TYPES (sizeof(tm_types) / sizeof(tm_types[0]))

enum tm_attr_kind {
    TM_A_EVENT = 0,
    TM_A_WHEN,
    TM_A_MATCH,   /* FIELD=VALUE */
    TM_A_COUNT,   /* a counting trigger: WORD N */
    TM_A_BETWEEN, /* between START END */
    TM_A_ARG,     /* the argument of a type's action */
};

struct tm_attr {
    const char *name;
    enum tm_attr_kind kind;
    const char *word; /* the rule language's word */
};

/* Every attribute, in the order the text is written. */
static const struct tm_attr tm_attrs[] = {
    {"event", TM_A_EVENT, NULL},
    {"queue", TM_A_MATCH, "queue"},
    {"exchange", TM_A_MATCH, "exchange"},
    {"routing_key", TM_A_MATCH, "routing_key"},
    {"consumer_tag", TM_A_MATCH, "consumer_tag"},
    {"message_id", TM_A_MATCH, "message_id"},
    {"task", TM_A_MATCH, "task"},
    {"body", TM_A_MATCH, "body"},
    {"client", TM_A_MATCH, "client"},
    {"redelivered", TM_A_MATCH, "redelivered"},
    {"command", TM_A_MATCH, "command"},
    {"key", TM_A_MATCH, "key"},
    {"when", TM_A_WHEN, NULL},
    {"between", TM_A_BETWEEN, "between"},
    {"every", TM_A_COUNT, "every"},
    {"nth", TM_A_COUNT, "nth"},
    {"first", TM_A_COUNT, "first"},
    {"after_first", TM_A_COUNT, "after"},
    {"limit", TM_A_COUNT, "limit"},
    {"max_per_message", TM_A_COUNT, "max-per-message"},
    {"after", TM_A_ARG, NULL},
    {"timeout", TM_A_ARG, NULL},
    {"delay", TM_A_ARG, NULL},
    {"code", TM_A_ARG, NULL},
    {"at", TM_A_ARG, NULL},
};
#define TM_N_ATTRS (sizeof(tm_attrs) / sizeof(tm_attrs[0]))
#define TM_HEADER_PREFIX "header."
#define TM_HEADER_PREFIX_LEN (sizeof(TM_HEADER_PREFIX) - 1)

/* A text that grows; `oom` is sticky. */
struct tm_buf {
    char *s;
    size_t len;
    size_t cap;
    bool oom;
};

/* One toxic being written. */
struct tm_ctx {
    const struct tm_type *type;
    const json_t *attrs; /* an object, or NULL */
    char *err;
    size_t errlen;
    struct tm_buf b;
};

static int tm_fail(struct tm_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes the message into err; returns -1. */
static int tm_fail(struct tm_ctx *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    if (c->errlen > 0) {
        vsnprintf(c->err, c->errlen, fmt, ap);
    }
    va_end(ap);
    return -1;
}

static void tm_add(struct tm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void tm_add(struct tm_buf *b, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    char *piece = b->oom ? NULL : conf_mem_vprintf(fmt, ap);
    va_end(ap);
    if (piece == NULL) {
        b->oom = true;
        return;
    }
    size_t n = strlen(piece);
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *s = conf_mem_realloc(b->s, cap);
        if (s == NULL) {
            b->oom = true;
            free(piece);
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->len, piece, n + 1);
    b->len += n;
    free(piece);
}

bool toxic_msg_is_message(const char *type)
{
    for (size_t i = 0; type != NULL && i < TM_N_TYPES; i++) {
        if (strcmp(type, tm_types[i].name) == 0) {
            return true;
        }
    }
    return false;
}

/* A JSON value as a message shows it: a string quoted, a number, or what it is. */
static const char *tm_show(const json_t *v, char *buf)
{
    char shown[CONF_SHOW_BYTES];

    if (json_is_string(v))
        snprintf(buf, TM_SHOW_BYTES, "\"%s\"", conf_show(json_string_value(v), shown));
    else if (json_is_integer(v))
        snprintf(buf, TM_SHOW_BYTES, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, TM_SHOW_BYTES, "%g", json_real_value(v));
    else
        snprintf(buf, TM_SHOW_BYTES, "%s",
                 json_is_true(v)    ? "true"
                 : json_is_false(v) ? "false"
                 : json_is_null(v)  ? "null"
                 : json_is_array(v) ? "an array"
                                    : "an object");
    return buf;
}

/* Whether s is 1..CONF_NAME_MAX name bytes. */
static bool tm_is_name(const char *s)
{
    size_t len = s != NULL ? strlen(s) : 0;
    bool ok = len >= 1 && len <= CONF_NAME_MAX;

    for (size_t i = 0; ok && i < len; i++) {
        ok = conf_is_name_byte(s[i]);
    }
    return ok;
}

/* Whether s is 1..TM_WORD_MAX bytes of [A-Za-z0-9._-]: a duration or an error code as the
 * rule language writes them (the parser checks which). */
static bool tm_is_word(const char *s)
{
    return strlen(s) <= TM_WORD_MAX && tm_is_name(s);
}

static const struct tm_type *tm_find_type(const char *name)
{
    for (size_t i = 0; name != NULL && i < TM_N_TYPES; i++) {
        if (strcmp(name, tm_types[i].name) == 0) {
            return &tm_types[i];
        }
    }
    return NULL;
}

static const struct tm_attr *tm_find_attr(const char *name)
{
    for (size_t i = 0; i < TM_N_ATTRS; i++) {
        if (strcmp(name, tm_attrs[i].name) == 0) {
            return &tm_attrs[i];
        }
    }
    return NULL;
}

/* ---- the toxic's own fields ---- */

static int tm_check_type(struct tm_ctx *c, const char *type, const char *protocol)
{
    const char *names[TM_N_TYPES];
    char hint[CONF_HINT_BYTES], shown[CONF_SHOW_BYTES];

    c->type = tm_find_type(type);
    if (c->type == NULL) {
        for (size_t i = 0; i < TM_N_TYPES; i++) {
            names[i] = tm_types[i].name;
        }
        const char *h = conf_hint_suggest(type != NULL ? type : "", names, TM_N_TYPES, hint, NULL);
        return tm_fail(c, "unknown message toxic type '%s'%s%s%s",
                       conf_show(type ? type : "", shown), h ? " (" : "", h ? h : "", h ? ")" : "");
    }
    if (protocol == NULL || (strcmp(protocol, "amqp") != 0 && strcmp(protocol, "resp") != 0)) {
        return tm_fail(c,
                       "toxic type %s needs a parsed proxy: this proxy's protocol is %s, which "
                       "carries opaque bytes (create the proxy with protocol amqp or resp)",
                       c->type->name, protocol != NULL ? conf_show(protocol, shown) : "tcp");
    }
    return 0;
}

/* The toxic's fields other than its type and attributes. */
static int tm_check_fields(struct tm_ctx *c, const char *rule_name, const char *listener,
                           const char *stream, double toxicity)
{
    char shown[CONF_SHOW_BYTES];

    if (!tm_is_name(rule_name)) {
        return tm_fail(c, "invalid rule name '%s': use 1 to %d letters, digits, '_', '.' or '-'",
                       conf_show(rule_name ? rule_name : "", shown), CONF_NAME_MAX);
    }
    if (!tm_is_name(listener)) {
        return tm_fail(c,
                       "invalid proxy name '%s' for a message toxic: use 1 to %d letters, "
                       "digits, '_', '.' or '-'",
                       conf_show(listener ? listener : "", shown), CONF_NAME_MAX);
    }
    if (stream != NULL && stream[0] != '\0' && strcasecmp(stream, "upstream") != 0 &&
        strcasecmp(stream, "downstream") != 0) {
        return tm_fail(c, "stream must be upstream or downstream, not '%s'",
                       conf_show(stream, shown));
    }
    if (!(toxicity >= 0.0 && toxicity <= 1.0)) { /* NaN too */
        return tm_fail(c, "toxicity must be from 0 to 1, not %g", toxicity);
    }
    return 0;
}

/* Every key of the attributes is known and belongs to this type. */
static int tm_check_keys(struct tm_ctx *c)
{
    const char *names[TM_N_ATTRS], *key;
    char hint[CONF_HINT_BYTES], shown[CONF_SHOW_BYTES];
    const json_t *v;

    for (size_t i = 0; i < TM_N_ATTRS; i++) {
        names[i] = tm_attrs[i].name;
    }
    json_object_foreach((json_t *)c->attrs, key, v)
    {
        const struct tm_attr *a = tm_find_attr(key);
        if (strncmp(key, TM_HEADER_PREFIX, TM_HEADER_PREFIX_LEN) == 0) {
            continue;
        }
        if (strcmp(key, "probability") == 0) {
            return tm_fail(c,
                           "toxic type %s has no attribute 'probability': the toxic's "
                           "toxicity is the probability (0.05 is 5%% of the events)",
                           c->type->name);
        }
        if (a == NULL) {
            const char *h = conf_hint_suggest(key, names, TM_N_ATTRS, hint, NULL);
            return tm_fail(c, "unknown attribute '%s' of toxic type %s%s%s%s",
                           conf_show(key, shown), c->type->name, h ? " (" : "", h ? h : "",
                           h ? ")" : "");
        }
        if (a->kind == TM_A_ARG &&
            (c->type->arg_attr == NULL || strcmp(c->type->arg_attr, key) != 0)) {
            return tm_fail(c, "toxic type %s has no attribute '%s'%s%s%s", c->type->name, key,
                           c->type->arg_attr ? " (its argument is '" : "",
                           c->type->arg_attr ? c->type->arg_attr : "",
                           c->type->arg_attr ? "')" : "");
        }
    }
    return 0;
}

/* ---- values ---- */

/* Whether a value can be written as it is, unquoted. */
static bool tm_is_plain(const char *s)
{
    if (s[0] == '\0') {
        return false;
    }
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p <= ' ' || *p >= 0x7f || strchr("\"#;{}\\", *p) != NULL) {
            return false;
        }
    }
    return true;
}

static bool tm_is_control(unsigned char ch)
{
    return (ch < ' ' && ch != '\t' && ch != '\n') || ch == 0x7f;
}

/* The value of matcher attribute `attr` after its FIELD=, quoted when it must be. */
static int tm_add_value(struct tm_ctx *c, const char *attr, const char *s)
{
    if (tm_is_plain(s)) {
        tm_add(&c->b, "%s", s);
        return 0;
    }
    tm_add(&c->b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (tm_is_control(*p)) {
            return tm_fail(c, "attribute '%s' holds a control character (byte 0x%02x)", attr, *p);
        }
        if (*p == '"' || *p == '\\')
            tm_add(&c->b, "\\%c", *p);
        else if (*p == '\n')
            tm_add(&c->b, "\\n");
        else if (*p == '\t')
            tm_add(&c->b, "\\t");
        else
            tm_add(&c->b, "%c", *p);
    }
    tm_add(&c->b, "\"");
    return 0;
}

/* A whole number of 0 or more in a JSON integer or an integral real, into *out. */
static bool tm_whole(const json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = (long long)json_integer_value(v);
        return *out >= 0;
    }
    double d = json_is_real(v) ? json_real_value(v) : -1.0;
    if (d >= 0.0 && d <= TM_EXACT_MAX && floor(d) == d) {
        *out = (long long)d;
        return true;
    }
    return false;
}

/* A duration attribute into buf (TM_SHOW_BYTES): a JSON number is milliseconds (Toxiproxy's
 * unit), a string a duration of the rule language ("250ms", "3s"); *zero says it is 0 ms. */
static int tm_duration(struct tm_ctx *c, const char *attr, const json_t *v, char *buf, bool *zero)
{
    char shown[TM_SHOW_BYTES];
    long long ms;

    *zero = false;
    if (json_is_string(v) && tm_is_word(json_string_value(v))) {
        snprintf(buf, TM_SHOW_BYTES, "%s", json_string_value(v));
        return 0;
    }
    if (!json_is_number(v) || !tm_whole(v, &ms)) {
        return tm_fail(c,
                       "attribute '%s' is a duration: milliseconds (3000) or a string like "
                       "\"3s\" or \"250ms\", not %s",
                       attr, tm_show(v, shown));
    }
    if (ms > (long long)CONF_MAX_DURATION_MS) {
        return tm_fail(c, "attribute '%s' is too large: %lld ms (at most 24h, %u ms)", attr, ms,
                       CONF_MAX_DURATION_MS);
    }
    *zero = ms == 0;
    snprintf(buf, TM_SHOW_BYTES, "%lldms", ms);
    return 0;
}

/* ---- when EVENT MATCHERS ---- */

/* A `when` attribute stays one line of one rule: no newline, `;`, brace or comment outside a
 * string, no control byte, every string closed.  The parser checks the matchers. */
static int tm_check_when(struct tm_ctx *c, const char *s)
{
    bool quoted = false;

    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (quoted && *p == '\\' && p[1] != '\0') {
            p++;
        } else if (*p == '"') {
            quoted = !quoted;
            continue;
        }
        if (tm_is_control(*p) || *p == '\n') {
            return tm_fail(c, "attribute 'when' holds a control character (byte 0x%02x)", *p);
        }
        if (!quoted && strchr(";{}#", *p) != NULL) {
            return tm_fail(c,
                           "attribute 'when' holds '%c' outside a string: it takes matchers only, "
                           "like \"task=tasks.charge queue!=celery body~\\\"refund due\\\"\"",
                           *p);
        }
    }
    if (quoted) {
        return tm_fail(c, "attribute 'when' has a string that is not closed");
    }
    return 0;
}

/* The event named `s` (len bytes), or NULL. */
static const char *tm_event_named(const char *s, size_t len)
{
    for (int e = 1; e < RULE_EV_COUNT; e++) { /* every event but `stream` */
        const char *name = rule_event_name((enum rule_event)e);
        if (strlen(name) == len && memcmp(name, s, len) == 0) {
            return name;
        }
    }
    return NULL;
}

/* The error of an event `s` that is none, with "did you mean". */
static int tm_bad_event(struct tm_ctx *c, const char *what, const char *s, size_t len)
{
    const char *names[RULE_EV_COUNT - 1];
    char word[CONF_SHOW_BYTES], shown[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES];

    for (int e = 1; e < RULE_EV_COUNT; e++) {
        names[e - 1] = rule_event_name((enum rule_event)e);
    }
    snprintf(word, sizeof(word), "%.*s", (int)(len < CONF_SHOW_MAX ? len : CONF_SHOW_MAX), s);
    const char *h = conf_hint_suggest(word, names, RULE_EV_COUNT - 1, hint, NULL);
    return tm_fail(c,
                   "%s '%s' is not an event (deliver, ack, nack, publish, confirm, command, "
                   "lease or connect)%s%s%s",
                   what, conf_show(word, shown), h ? " (" : "", h ? h : "", h ? ")" : "");
}

/* The event the `when` attribute starts with, if its first word is no matcher: *event set,
 * *rest after it.  Its first word without `=`, `!=` or `~` must be an event. */
static int tm_when_event(struct tm_ctx *c, const char *when, const char **event, const char **rest)
{
    const char *w = when + strspn(when, " \t");
    size_t len = strcspn(w, " \t");

    *event = NULL;
    *rest = when;
    if (len == 0 || memchr(w, '=', len) != NULL || memchr(w, '~', len) != NULL ||
        memchr(w, '"', len) != NULL) {
        return 0;
    }
    *event = tm_event_named(w, len);
    if (*event == NULL) {
        return tm_bad_event(c, "the first word of attribute 'when',", w, len);
    }
    *rest = w + len;
    return 0;
}

/* The event: attribute `event`, else the first word of `when`, else the type's default
 * (commands on a resp listener without a profile: its only message event). */
static int tm_event(struct tm_ctx *c, const char *protocol, const char *profile, const char **event,
                    const char **when_rest)
{
    const json_t *ev = json_object_get(c->attrs, "event");
    const json_t *when = json_object_get(c->attrs, "when");
    const char *from_when = NULL;
    char shown[TM_SHOW_BYTES];

    *when_rest = NULL;
    if (when != NULL) {
        if (!json_is_string(when)) {
            return tm_fail(c, "attribute 'when' is a string of matchers, not %s",
                           tm_show(when, shown));
        }
        if (tm_check_when(c, json_string_value(when)) != 0 ||
            tm_when_event(c, json_string_value(when), &from_when, when_rest) != 0) {
            return -1;
        }
    }
    if (ev != NULL && !json_is_string(ev)) {
        return tm_fail(c, "attribute 'event' is a string, not %s", tm_show(ev, shown));
    }
    *event = ev != NULL ? tm_event_named(json_string_value(ev), strlen(json_string_value(ev)))
                        : from_when;
    if (ev != NULL && *event == NULL) {
        const char *s = json_string_value(ev);
        return tm_bad_event(c, "attribute 'event'", s, strlen(s));
    }
    if (ev != NULL && from_when != NULL && strcmp(*event, from_when) != 0) {
        return tm_fail(c, "attribute 'event' says %s and attribute 'when' says %s: give one",
                       *event, from_when);
    }
    if (*event == NULL) {
        bool resp = strcmp(protocol, "resp") == 0;
        *event = !resp ? c->type->event : profile != NULL ? c->type->event_resp : "command";
    }
    return 0;
}

/* One FIELD=VALUE matcher of attribute `name` (value v); a header.NAME attribute keeps its
 * name as the field. */
static int tm_matcher(struct tm_ctx *c, const char *name, const json_t *v)
{
    char shown[TM_SHOW_BYTES], num[TM_SHOW_BYTES];
    const char *header = strncmp(name, TM_HEADER_PREFIX, TM_HEADER_PREFIX_LEN) == 0
                             ? name + TM_HEADER_PREFIX_LEN
                             : NULL;
    bool flag = strcmp(name, "redelivered") == 0;

    if (header != NULL && !tm_is_name(header)) {
        return tm_fail(c,
                       "attribute '%s' needs a header name of letters, digits, '_', '.' or "
                       "'-' after 'header.'",
                       conf_show(name, shown));
    }
    if (flag ? !json_is_boolean(v) : !json_is_string(v) && !json_is_integer(v)) {
        return tm_fail(c, "attribute '%s' is %s, not %s", name,
                       flag ? "true or false" : "a string (a glob: * and ? match)",
                       tm_show(v, shown));
    }
    tm_add(&c->b, " %s=", name);
    if (flag) {
        tm_add(&c->b, "%s", json_is_true(v) ? "true" : "false");
        return 0;
    }
    if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
    }
    return tm_add_value(c, name, json_is_string(v) ? json_string_value(v) : num);
}

/* `when EVENT MATCHER...`: the table's matchers, the header.NAME ones, then `when`'s. */
static int tm_when_line(struct tm_ctx *c, const char *protocol, const char *profile)
{
    const char *event = NULL, *rest = NULL, *key;
    const json_t *v;

    if (tm_event(c, protocol, profile, &event, &rest) != 0) {
        return -1;
    }
    tm_add(&c->b, "  when %s", event);
    for (size_t i = 0; i < TM_N_ATTRS; i++) {
        v = json_object_get(c->attrs, tm_attrs[i].name);
        if (tm_attrs[i].kind == TM_A_MATCH && v != NULL &&
            tm_matcher(c, tm_attrs[i].name, v) != 0) {
            return -1;
        }
    }
    json_object_foreach((json_t *)c->attrs, key, v)
    {
        if (strncmp(key, TM_HEADER_PREFIX, TM_HEADER_PREFIX_LEN) == 0 &&
            tm_matcher(c, key, v) != 0) {
            return -1;
        }
    }
    if (rest != NULL) {
        rest += strspn(rest, " \t");
        size_t len = strlen(rest);
        while (len > 0 && (rest[len - 1] == ' ' || rest[len - 1] == '\t')) {
            len--;
        }
        if (len > 0) {
            tm_add(&c->b, " %.*s", (int)len, rest);
        }
    }
    tm_add(&c->b, "\n");
    return 0;
}

/* ---- triggers ---- */

/* `between START END` from ["30s", "5m"], [0, 300000] or "30s 5m". */
static int tm_between(struct tm_ctx *c, const json_t *v)
{
    char a[TM_SHOW_BYTES], b[TM_SHOW_BYTES], shown[TM_SHOW_BYTES];
    bool zero;

    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t la = strcspn(s, " "), lb = strlen(s) - la - (s[la] != '\0');
        if (la <= TM_WORD_MAX && lb <= TM_WORD_MAX && s[la] == ' ') {
            snprintf(a, sizeof(a), "%.*s", (int)la, s);
            snprintf(b, sizeof(b), "%s", s + la + 1);
            if (tm_is_word(a) && tm_is_word(b)) {
                tm_add(&c->b, "  between %s %s\n", a, b);
                return 0;
            }
        }
    } else if (json_is_array(v) && json_array_size(v) == 2) {
        if (tm_duration(c, "between", json_array_get(v, 0), a, &zero) != 0 ||
            tm_duration(c, "between", json_array_get(v, 1), b, &zero) != 0) {
            return -1;
        }
        tm_add(&c->b, "  between %s %s\n", a, b);
        return 0;
    }
    return tm_fail(c,
                   "attribute 'between' is a window since twice started: [\"30s\", \"5m\"], "
                   "[30000, 300000] (milliseconds) or \"30s 5m\", not %s",
                   tm_show(v, shown));
}

/* The counting triggers and `between`, in the table's order. */
static int tm_triggers(struct tm_ctx *c)
{
    char shown[TM_SHOW_BYTES];
    long long n;

    for (size_t i = 0; i < TM_N_ATTRS; i++) {
        const struct tm_attr *a = &tm_attrs[i];
        const json_t *v = json_object_get(c->attrs, a->name);
        if (v == NULL) {
            continue;
        }
        if (a->kind == TM_A_BETWEEN && tm_between(c, v) != 0) {
            return -1;
        }
        if (a->kind != TM_A_COUNT) {
            continue;
        }
        if (!tm_whole(v, &n) || n < 1) {
            return tm_fail(c, "attribute '%s' is a whole number from 1, not %s", a->name,
                           tm_show(v, shown));
        }
        tm_add(&c->b, "  %s %lld\n", a->word, n);
    }
    return 0;
}

/* toxicity: 1 every matching event (no trigger), 0 none (`disabled`), else a coin per event. */
static int tm_toxicity(struct tm_ctx *c, double toxicity)
{
    char pct[TM_SHOW_BYTES];

    if (toxicity == 0.0) {
        tm_add(&c->b, "  disabled\n");
    } else if (toxicity < 1.0) {
        rule_probability_text(toxicity, pct, sizeof(pct));
        if (strchr(pct, 'e') != NULL) {
            return tm_fail(c, "toxicity %g is too small (write 0 for none)", toxicity);
        }
        tm_add(&c->b, "  probability %s\n", pct);
    }
    return 0;
}

/* ---- do ACTION ARG ---- */

/* The argument of the error and close types. */
static int tm_word_arg(struct tm_ctx *c, const json_t *v)
{
    const char *attr = c->type->arg_attr;
    char shown[TM_SHOW_BYTES];

    if (c->type->arg == TM_ARG_AT) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "before") != 0 && strcmp(s, "after") != 0) {
            return tm_fail(c,
                           "attribute 'at' is \"before\" (the frame is not forwarded) or "
                           "\"after\" (it is), not %s",
                           tm_show(v, shown));
        }
        tm_add(&c->b, " %s", s);
    } else if (json_is_integer(v) && json_integer_value(v) > 0) {
        tm_add(&c->b, " %lld", (long long)json_integer_value(v));
    } else if (json_is_string(v) && tm_is_word(json_string_value(v))) {
        tm_add(&c->b, " %s", json_string_value(v));
    } else {
        return tm_fail(c,
                       "attribute '%s' is an error code: an AMQP code like 406 or a Redis "
                       "error like \"READONLY\", not %s",
                       attr, tm_show(v, shown));
    }
    return 0;
}

/* `do ACTION [ARG]`. */
static int tm_do_line(struct tm_ctx *c)
{
    const char *attr = c->type->arg_attr;
    const json_t *v = attr != NULL ? json_object_get(c->attrs, attr) : NULL;
    char d[TM_SHOW_BYTES];
    bool zero;

    tm_add(&c->b, "  do %s", c->type->name);
    if (v == NULL && (c->type->arg == TM_ARG_DURATION || c->type->arg == TM_ARG_CODE)) {
        return tm_fail(c, "toxic type %s needs the attribute '%s' (%s)", c->type->name, attr,
                       c->type->arg == TM_ARG_CODE ? "an error code, e.g. 406 or \"READONLY\""
                                                   : "a duration, e.g. 3000 (ms) or \"3s\"");
    }
    if (v == NULL) {
        tm_add(&c->b, c->type->arg == TM_ARG_AT ? " before\n" : "\n");
        return 0;
    }
    if (c->type->arg == TM_ARG_CODE || c->type->arg == TM_ARG_AT) {
        int rc = tm_word_arg(c, v);
        tm_add(&c->b, "\n");
        return rc;
    }
    if (tm_duration(c, attr, v, d, &zero) != 0) {
        return -1;
    }
    if (zero && c->type->arg == TM_ARG_DURATION) {
        return tm_fail(c, "attribute '%s' must be more than 0 ms", attr);
    }
    if (zero) { /* `after 0`: a copy at once, as without `after` */
        tm_add(&c->b, "\n");
    } else {
        tm_add(&c->b, c->type->arg == TM_ARG_AFTER ? " after %s\n" : " %s\n", d);
    }
    return 0;
}

/* ---- entry points ---- */

char *toxic_msg_rule_text(const char *rule_name, const char *listener, const char *protocol,
                          const char *profile, const char *type, const char *stream,
                          double toxicity, const json_t *attributes, char *err, size_t errlen)
{
    struct tm_ctx c = {.attrs = attributes, .err = err, .errlen = errlen};
    char shown[TM_SHOW_BYTES];

    if (errlen > 0) {
        err[0] = '\0';
    }
    if (tm_check_type(&c, type, protocol) != 0 ||
        tm_check_fields(&c, rule_name, listener, stream, toxicity) != 0) {
        return NULL;
    }
    if (attributes != NULL && !json_is_object(attributes)) {
        tm_fail(&c, "attributes must be a JSON object, not %s", tm_show(attributes, shown));
        return NULL;
    }
    if (tm_check_keys(&c) != 0) {
        return NULL;
    }
    tm_add(&c.b, "rule %s on %s {\n", rule_name, listener);
    if (tm_when_line(&c, protocol, profile) != 0 || tm_triggers(&c) != 0 ||
        tm_toxicity(&c, toxicity) != 0 || tm_do_line(&c) != 0) {
        free(c.b.s);
        return NULL;
    }
    tm_add(&c.b, "}\n");
    if (c.b.oom) {
        tm_fail(&c, "out of memory");
        free(c.b.s);
        return NULL;
    }
    return c.b.s;
}

/* The parser's first error as "MESSAGE (HINT)" into err. */
static void tm_diag_text(const struct conf_diags *d, char *err, size_t errlen)
{
    for (const struct conf_diag *g = d->head; g != NULL; g = g->next) {
        if (g->severity == CONF_ERROR) {
            snprintf(err, errlen, "%s%s%s%s", g->msg, g->hint ? " (" : "", g->hint ? g->hint : "",
                     g->hint ? ")" : "");
            return;
        }
    }
    snprintf(err, errlen, "the toxic's rule is not valid");
}

struct rule *toxic_msg_rule(const struct conf *base, const char *rule_name, const char *listener,
                            const char *type, const char *stream, double toxicity,
                            const json_t *attributes, char *err, size_t errlen)
{
    const struct conf_listener *l =
        base != NULL && listener != NULL ? conf_find_listener(base, listener) : NULL;
    struct conf_diags d;
    struct rule *rules = NULL;
    size_t n = 0;
    char shown[CONF_SHOW_BYTES];

    if (l == NULL) {
        snprintf(err, errlen, "no proxy '%s'", conf_show(listener ? listener : "", shown));
        return NULL;
    }
    char *text = toxic_msg_rule_text(rule_name, listener, conf_protocol_name(l->protocol),
                                     l->profile, type, stream, toxicity, attributes, err, errlen);
    if (text == NULL) {
        return NULL;
    }
    conf_diags_init(&d);
    int rc = conf_parse_rules("toxic", text, strlen(text), base, &rules, &n, &d);
    free(text);
    if (rc != 0 || n != 1) {
        tm_diag_text(&d, err, errlen);
        rule_list_free(rules);
        rules = NULL;
    }
    conf_diags_free(&d);
    return rules;
}
