/*
 * rule_when.c - `when EVENT MATCHER...`: the event a rule looks at and the
 * matchers that filter it.
 *
 * A matcher is FIELD OP VALUE with no blank inside, OP being = != or ~.  The
 * value may be quoted, glued to the operator (`body~"refund due"`): one
 * matcher is a word and every word glued to it.  Which fields an event
 * offers depends on the listener's codec (rule_caps.c); which operators and
 * values a field takes belongs to the language and is checked here.
 */
#include "rules/rule_parse.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first allocation for a rule's matchers; it doubles from there. */
#define RULE_MATCHERS_INITIAL 4
#define RULE_HEADER_PREFIX "header."
#define RULE_HEADER_PREFIX_LEN (sizeof(RULE_HEADER_PREFIX) - 1)
/* Longest address in a CIDR block, and its NUL. */
#define RULE_CIDR_ADDR_BYTES INET6_ADDRSTRLEN
/* Bytes of an IPv6 address, and the bits an IPv4 address is shifted by
 * when it is mapped into IPv6 (::ffff:a.b.c.d). */
#define RULE_IPV6_BYTES 16
#define RULE_V4_MAPPED_BITS 96

_Static_assert(RULE_EV_STREAM == 0, "a `when` names every event but stream, the first");

static const char *const rule_event_names[RULE_EV_COUNT] = {
#define RULE_EVENT_STR(name, code, str) [code] = str,
    RULE_EVENTS(RULE_EVENT_STR)
#undef RULE_EVENT_STR
};

static const char *const rule_field_names[RULE_F_COUNT] = {
#define RULE_FIELD_STR(name, code, str) [code] = str,
    RULE_FIELDS(RULE_FIELD_STR)
#undef RULE_FIELD_STR
};

/* Fields that `~` (substring) applies to. */
#define RULE_SUBSTRING_FIELDS                                                                      \
    ((1u << RULE_F_BODY) | (1u << RULE_F_TASK) | (1u << RULE_F_QUEUE) |                            \
     (1u << RULE_F_MESSAGE_ID) | (1u << RULE_F_KEY) | (1u << RULE_F_COMMAND) |                     \
     (1u << RULE_F_HEADER))

static void rule_when_event(struct conf_parser *p, struct rule_state *rs, const struct conf_word *w)
{
    char list[RULE_LIST_BYTES], expected[RULE_LIST_BYTES + 32];
    int i;

    if (strcmp(w->text, "stream") == 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      "leave out 'when': a rule with no 'when' acts on the byte stream",
                      "unknown event 'stream'");
        return;
    }
    snprintf(expected, sizeof(expected), "expected one of: %s",
             rule_join_names(rule_event_names + 1, RULE_EV_COUNT - 1, list));
    i = conf_value_enum(p, w, "event", rule_event_names + 1, RULE_EV_COUNT - 1, expected);
    if (i >= 0) {
        rs->r->event = (enum rule_event)(i + 1);
        rs->event_loc = w->loc;
    }
}

/* [A-Za-z0-9_.-], spelled out so that the locale does not matter. */
static bool rule_is_field_byte(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

/* Split `text` into FIELD and OP: sets *field_len and *op, returns the
 * operator's length, or 0 when there is no field or no operator. */
static size_t rule_split_op(const char *text, size_t *field_len, enum rule_match_op *op)
{
    size_t len = 0;

    while (rule_is_field_byte(text[len])) {
        len++;
    }
    *field_len = len;
    if (len == 0) {
        return 0;
    }
    if (text[len] == '!' && text[len + 1] == '=') {
        *op = RULE_OP_NE;
        return 2;
    }
    *op = text[len] == '~' ? RULE_OP_CONTAINS : RULE_OP_EQ;
    return text[len] == '~' || text[len] == '=' ? 1 : 0;
}

/* An unknown field name, with "did you mean" or the list of fields. */
static void rule_unknown_field(struct conf_parser *p, const struct conf_word *w, const char *field)
{
    const char *names[RULE_F_COUNT];
    char list[RULE_LIST_BYTES], expected[RULE_LIST_BYTES + 32], hint[CONF_HINT_BYTES];
    char shown[CONF_SHOW_BYTES];

    for (size_t i = 0; i < RULE_F_COUNT; i++) {
        names[i] = i == RULE_F_HEADER ? "header.NAME" : rule_field_names[i];
    }
    snprintf(expected, sizeof(expected), "expected one of: %s",
             rule_join_names(names, RULE_F_COUNT, list));
    conf_diag_add(p->diags, CONF_ERROR, w->loc,
                  conf_hint_suggest(field, rule_field_names, RULE_F_COUNT, hint, expected),
                  "unknown field '%s'", conf_show(field, shown));
}

/* The FIELD (len bytes at text) of a matcher into m; false after an error. */
static bool rule_matcher_field(struct conf_parser *p, const struct conf_word *w, const char *text,
                               size_t len, struct rule_matcher *m)
{
    char field[CONF_SUGGEST_MAX_LEN + 1];
    bool header = len >= RULE_HEADER_PREFIX_LEN &&
                  memcmp(text, RULE_HEADER_PREFIX, RULE_HEADER_PREFIX_LEN) == 0;
    bool bare =
        header ? len == RULE_HEADER_PREFIX_LEN
               : len == RULE_HEADER_PREFIX_LEN - 1 && memcmp(text, RULE_HEADER_PREFIX, len) == 0;

    if (bare) { /* "header" or "header." */
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "e.g. header.x-retry=1",
                      "'%.*s' needs a name: header.NAME=VALUE", (int)len, text);
        return false;
    }
    if (header) {
        m->field = RULE_F_HEADER;
        m->header = conf_mem_strndup(text + RULE_HEADER_PREFIX_LEN, len - RULE_HEADER_PREFIX_LEN);
        if (m->header == NULL) {
            conf_parser_oom(p);
        }
        return m->header != NULL;
    }
    len = len < sizeof(field) - 1 ? len : sizeof(field) - 1; /* long: no suggestion anyway */
    memcpy(field, text, len);
    field[len] = '\0';
    for (size_t i = 0; i < RULE_F_COUNT; i++) {
        if (i != RULE_F_HEADER && strcmp(field, rule_field_names[i]) == 0) {
            m->field = (enum rule_field)i;
            return true;
        }
    }
    rule_unknown_field(p, w, field);
    return false;
}

/* `~` on a field it does not apply to. */
static bool rule_matcher_op_ok(struct conf_parser *p, const struct conf_word *w,
                               const struct rule_matcher *m)
{
    const char *name = rule_field_name(m->field);
    bool eq_only = m->field == RULE_F_CLIENT || m->field == RULE_F_REDELIVERED;

    if (m->op != RULE_OP_CONTAINS || ((1u << m->field) & RULE_SUBSTRING_FIELDS) != 0) {
        return true;
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc,
                  eq_only ? "use = or !="
                          : "'~' (substring) applies to body, task, queue, message_id, key, "
                            "command and header.NAME",
                  "'%s' cannot use '~'", name);
    return false;
}

/* The text after the operator joined with the `n` glued words; NULL after
 * conf_parser_oom(). */
static char *rule_join_value(struct conf_parser *p, const char *rest, const struct conf_word *glued,
                             size_t n)
{
    size_t len = strlen(rest), at;
    char *value;

    for (size_t i = 0; i < n; i++) {
        len += strlen(glued[i].text);
    }
    value = conf_mem_alloc(len + 1);
    if (value == NULL) {
        conf_parser_oom(p);
        return NULL;
    }
    at = strlen(rest);
    memcpy(value, rest, at);
    for (size_t i = 0; i < n; i++) {
        size_t piece = strlen(glued[i].text);
        memcpy(value + at, glued[i].text, piece);
        at += piece;
    }
    value[at] = '\0';
    return value;
}

/* A prefix length of 0..max, all digits; false otherwise. */
static bool rule_parse_prefix(const char *s, unsigned max, unsigned *out)
{
    unsigned v = 0;

    if (*s == '\0') {
        return false;
    }
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9' || v > max) {
            return false;
        }
        v = v * 10 + (unsigned)(*s - '0');
    }
    *out = v;
    return v <= max;
}

/* How a `client` value failed: 0 when it did not. */
enum rule_cidr_error {
    RULE_CIDR_OK = 0,
    RULE_CIDR_BAD_ADDR,
    RULE_CIDR_BAD_PREFIX_V4,
    RULE_CIDR_BAD_PREFIX_V6,
};

/* "ADDR" or "ADDR/PREFIX" into m->cidr_*, IPv4 mapped into IPv6. */
static enum rule_cidr_error rule_parse_cidr(const char *value, struct rule_matcher *m)
{
    char addr[RULE_CIDR_ADDR_BYTES];
    const char *slash = strchr(value, '/');
    size_t len = slash != NULL ? (size_t)(slash - value) : strlen(value);
    unsigned char v4[4];
    unsigned prefix;

    if (len >= sizeof(addr)) {
        return RULE_CIDR_BAD_ADDR;
    }
    memcpy(addr, value, len);
    addr[len] = '\0';
    if (inet_pton(AF_INET, addr, v4) == 1) {
        prefix = 32;
        if (slash != NULL && !rule_parse_prefix(slash + 1, 32, &prefix)) {
            return RULE_CIDR_BAD_PREFIX_V4;
        }
        memset(m->cidr_addr, 0, RULE_IPV6_BYTES);
        m->cidr_addr[10] = 0xff;
        m->cidr_addr[11] = 0xff;
        memcpy(m->cidr_addr + 12, v4, sizeof(v4));
        m->cidr_prefix = (uint8_t)(prefix + RULE_V4_MAPPED_BITS);
        return RULE_CIDR_OK;
    }
    if (inet_pton(AF_INET6, addr, m->cidr_addr) != 1) {
        return RULE_CIDR_BAD_ADDR;
    }
    prefix = 128;
    if (slash != NULL && !rule_parse_prefix(slash + 1, 128, &prefix)) {
        return RULE_CIDR_BAD_PREFIX_V6;
    }
    m->cidr_prefix = (uint8_t)prefix;
    return RULE_CIDR_OK;
}

/* Check a `client` value and store its address; false after an error. */
static bool rule_matcher_client(struct conf_parser *p, const struct conf_word *w,
                                struct rule_matcher *m)
{
    char shown[CONF_SHOW_BYTES];
    enum rule_cidr_error e = rule_parse_cidr(m->value, m);

    if (e == RULE_CIDR_BAD_ADDR) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      "write an IPv4 or IPv6 address or a CIDR block, e.g. 10.0.0.0/8 or ::1/128",
                      "invalid client address '%s'", conf_show(m->value, shown));
    } else if (e != RULE_CIDR_OK) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                      "invalid prefix length in '%s' (0-%d for IPv%d)", conf_show(m->value, shown),
                      e == RULE_CIDR_BAD_PREFIX_V4 ? 32 : 128,
                      e == RULE_CIDR_BAD_PREFIX_V4 ? 4 : 6);
    }
    return e == RULE_CIDR_OK;
}

/* Check the value of `client` and `redelivered` matchers; others take any. */
static bool rule_matcher_value(struct conf_parser *p, const struct conf_word *w,
                               struct rule_matcher *m)
{
    char shown[CONF_SHOW_BYTES];

    if (m->field == RULE_F_CLIENT && !rule_matcher_client(p, w, m)) {
        return false;
    }
    if (m->field == RULE_F_REDELIVERED) {
        if (strcmp(m->value, "true") != 0 && strcmp(m->value, "false") != 0) {
            conf_diag_add(p->diags, CONF_ERROR, w->loc, "expected true or false",
                          "invalid redelivered value '%s'", conf_show(m->value, shown));
            return false;
        }
        m->bool_value = strcmp(m->value, "true") == 0;
    }
    if (m->field == RULE_F_COMMAND) {
        /* Redis command names are case-insensitive; events carry them upper-cased. */
        for (char *c = m->value; *c != '\0'; c++)
            *c = (char)toupper((unsigned char)*c);
    }
    m->is_glob = m->field != RULE_F_CLIENT && m->field != RULE_F_REDELIVERED &&
                 strpbrk(m->value, "*?") != NULL;
    return true;
}

/* Append a finished matcher to the rule (which takes what it owns); false
 * after conf_parser_oom(). */
static bool rule_add_matcher(struct conf_parser *p, struct rule_state *rs,
                             const struct rule_matcher *m)
{
    struct rule *r = rs->r;

    if (r->n_matchers == rs->cap_matchers) {
        size_t cap = rs->cap_matchers == 0 ? RULE_MATCHERS_INITIAL : rs->cap_matchers * 2;
        struct rule_matcher *grown = conf_mem_realloc(r->matchers, cap * sizeof(*grown));
        if (grown == NULL) {
            conf_parser_oom(p);
            return false;
        }
        r->matchers = grown;
        rs->cap_matchers = cap;
    }
    r->matchers[r->n_matchers++] = *m;
    return true;
}

/* "missing value after 'body~'"; when a string follows after a blank, that
 * is the likely value: say so, and return 1 to skip it. */
static size_t rule_missing_value(struct conf_parser *p, const struct conf_word *w,
                                 const struct conf_word *next)
{
    char shown[CONF_SHOW_BYTES], value[CONF_SHOW_BYTES], hint[CONF_HINT_BYTES + CONF_SHOW_BYTES];
    bool quoted_next = next != NULL && next->quoted;

    conf_show(w->text, shown);
    if (quoted_next) {
        snprintf(hint, sizeof(hint), "write %s\"%s\" with no blank before the quote", shown,
                 conf_show(next->text, value));
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc, quoted_next ? hint : NULL,
                  "missing value after '%s'", shown);
    return quoted_next ? 1 : 0;
}

/* The field, operator and value of the matcher made of the word w and its
 * n_glued glued words, into *m; false after an error. */
static bool rule_matcher_parse(struct conf_parser *p, const struct conf_word *w, size_t n_glued,
                               struct rule_matcher *m)
{
    char shown[CONF_SHOW_BYTES];
    size_t field_len, op_len = 0;

    if (!w->quoted) {
        op_len = rule_split_op(w->text, &field_len, &m->op);
    }
    if (op_len == 0) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc,
                      "write FIELD=VALUE, FIELD!=VALUE or FIELD~TEXT with no blanks, e.g. "
                      "queue=payments; only the value may be quoted",
                      "invalid matcher '%s'", conf_show(w->text, shown));
        return false;
    }
    if (!rule_matcher_field(p, w, w->text, field_len, m) || !rule_matcher_op_ok(p, w, m)) {
        return false;
    }
    m->value = rule_join_value(p, w->text + field_len + op_len, w + 1, n_glued);
    return m->value != NULL && rule_matcher_value(p, w, m);
}

/* Read the matcher starting at word i of `n`; returns how many words it
 * used (at least 1). */
static size_t rule_matcher(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n,
                           size_t i)
{
    const struct conf_word *w = &n->words[i];
    struct rule_matcher m = {.loc = w->loc};
    size_t n_glued = 0, op_len, field_len = 0;

    while (i + 1 + n_glued < n->n_words && n->words[i + 1 + n_glued].glued) {
        n_glued++;
    }
    op_len = w->quoted ? 0 : rule_split_op(w->text, &field_len, &m.op);
    if (op_len != 0 && n_glued == 0 && w->text[field_len + op_len] == '\0') {
        return 1 + rule_missing_value(p, w, i + 1 < n->n_words ? w + 1 : NULL);
    }
    if (rs->r->n_matchers == RULE_MAX_MATCHERS) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "too many matchers (at most %d)",
                      RULE_MAX_MATCHERS);
        return n->n_words - i; /* once is enough */
    }
    if (!rule_matcher_parse(p, w, n_glued, &m) || !rule_add_matcher(p, rs, &m)) {
        free(m.header);
        free(m.value);
    }
    return 1 + n_glued;
}

void rule_when_directive(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n)
{
    char list[RULE_LIST_BYTES], hint[RULE_LIST_BYTES + 32];

    if (n->n_words < 2) {
        snprintf(hint, sizeof(hint), "events: %s",
                 rule_join_names(rule_event_names + 1, RULE_EV_COUNT - 1, list));
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, hint,
                      "'when' needs an event: when EVENT [MATCHER...]");
        return;
    }
    rule_when_event(p, rs, &n->words[1]);
    for (size_t i = 2; i < n->n_words && !p->oom;) {
        i += rule_matcher(p, rs, n, i);
    }
}
