/*
 * conf_testkit.h - what the configuration and rule-language tests share: expected diagnostics
 * and their comparison (EXPECT, EXPECT_CLEAN, EXPECT_RULES), parsing a text that must be valid,
 * and a parse with each of its allocations failing in turn (rules/ allocates through
 * conf_mem.h, whose conf_mem_fail_nth() is kit_conf_mem_hook).  Header-only: each test is its
 * own executable; include it after <cmocka.h>.
 */
#ifndef TWICE_CONF_TESTKIT_H
#define TWICE_CONF_TESTKIT_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "rules/conf.h"
#include "rules/conf_mem.h"
#include "rules/rule.h"
#include "tests/lib/failing.h"

/* One expected diagnostic; hint NULL means "no hint". */
struct want {
    unsigned line;
    unsigned col;
    enum conf_severity sev;
    const char *msg;
    const char *hint;
};

#define E(l, c, m)                                                                                 \
    {                                                                                              \
        (l), (c), CONF_ERROR, (m), NULL                                                            \
    }
#define EH(l, c, m, h)                                                                             \
    {                                                                                              \
        (l), (c), CONF_ERROR, (m), (h)                                                             \
    }
#define W(l, c, m)                                                                                 \
    {                                                                                              \
        (l), (c), CONF_WARNING, (m), NULL                                                          \
    }

static inline bool same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* Print the input and what the parser said, for a failing test. */
static inline void dump(const char *text, int rc, const struct conf_diags *d)
{
    fprintf(stderr, "---- input ----\n%s\n---- rc=%d, diagnostics ----\n", text, rc);
    conf_diags_print(d, stderr);
}

/* Whether the diagnostics are exactly w[0..n); says which one differs. */
static inline bool diags_match(const struct conf_diags *d, const struct want *w, size_t n)
{
    const struct conf_diag *g = d->head;
    size_t i = 0;

    for (; g != NULL && i < n; g = g->next, i++) {
        if (g->loc.line != w[i].line || g->loc.col != w[i].col || g->severity != w[i].sev ||
            !same_str(g->msg, w[i].msg) || !same_str(g->hint, w[i].hint)) {
            fprintf(stderr, "diag #%zu: want %u:%u %s '%s' (%s)\n", i, w[i].line, w[i].col,
                    w[i].sev == CONF_ERROR ? "error" : "warning", w[i].msg,
                    w[i].hint ? w[i].hint : "no hint");
            return false;
        }
    }
    return g == NULL && i == n;
}

#define WANTS(...)                                                                                 \
    (const struct want[])                                                                          \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }
#define N_WANTS(...) (sizeof((const struct want[]){__VA_ARGS__}) / sizeof(struct want))

/* Parse a whole file and check the result code and every diagnostic. */
#define EXPECT(text, rc, ...)                                                                      \
    expect_diags(__FILE__, __LINE__, NULL, (text), strlen(text), (rc), WANTS(__VA_ARGS__),         \
                 N_WANTS(__VA_ARGS__))

/* Parse a whole file expecting success and no diagnostic at all. */
#define EXPECT_CLEAN(text) expect_diags(__FILE__, __LINE__, NULL, (text), strlen(text), 0, NULL, 0)

/* Parse rules only, against `base`, and check the same way. */
#define EXPECT_RULES(base, text, rc, ...)                                                          \
    expect_diags(__FILE__, __LINE__, (base), (text), strlen(text), (rc), WANTS(__VA_ARGS__),       \
                 N_WANTS(__VA_ARGS__))

/* Parse text[0..len): a whole file, or rules only (into *rules) when `base` is given. */
static inline int parse_any(const struct conf *base, const char *text, size_t len,
                            struct conf_diags *d, struct conf **c, struct rule **rules,
                            size_t *n_rules)
{
    *c = NULL;
    *rules = NULL;
    *n_rules = 0;
    if (base != NULL)
        return conf_parse_rules("t.rules", text, len, base, rules, n_rules, d);
    return conf_parse_string("t.conf", text, len, c, d);
}

/* Parse text[0..len) (see parse_any) and check the result code and the whole diagnostic list;
 * on a mismatch, says file:line of the expectation, the input and what the parser said. */
static inline void expect_diags(const char *file, int line, const struct conf *base,
                                const char *text, size_t len, int want_rc, const struct want *w,
                                size_t n)
{
    struct conf_diags d;
    struct conf *c;
    struct rule *rules;
    size_t n_rules;

    conf_diags_init(&d);
    int rc = parse_any(base, text, len, &d, &c, &rules, &n_rules);
    bool ok = rc == want_rc && (base != NULL || (rc == 0) == (c != NULL)) &&
              (rc == 0 || (rules == NULL && n_rules == 0)) && diags_match(&d, w, n);
    if (!ok) {
        fprintf(stderr, "%s:%d: unexpected result\n", file, line);
        dump(text, rc, &d);
    }
    conf_free(c);
    rule_list_free(rules);
    conf_diags_free(&d);
    assert_true(ok);
}

/* Parse `text` expecting success; the caller frees the result and `d`. */
static inline struct conf *parse_ok(const char *text, struct conf_diags *d)
{
    struct conf *c = NULL;
    int rc;

    conf_diags_init(d);
    rc = conf_parse_string("t.conf", text, strlen(text), &c, d);
    if (rc != 0) {
        dump(text, rc, d);
    }
    assert_int_equal(rc, 0);
    assert_non_null(c);
    assert_int_equal(d->errors, 0);
    return c;
}

/* rules/'s allocator (conf_mem.h) made to fail. */
static inline void kit_conf_mem_arm(long nth)
{
    conf_mem_fail_nth(nth);
}

static const struct kit_fail_hook kit_conf_mem_hook = {kit_conf_mem_arm, conf_mem_fault_fired,
                                                       NULL};

struct parse_failing {
    const struct conf *base;
    const char *text;
    int want_rc;
};

static inline void parse_failing_run(void *ctx, long nth)
{
    const struct parse_failing *p = ctx;
    struct conf_diags d;
    struct conf *c;
    struct rule *rules;
    size_t n_rules;

    (void)nth;
    conf_diags_init(&d);
    int rc = parse_any(p->base, p->text, strlen(p->text), &d, &c, &rules, &n_rules);
    if (kit_failed()) {
        assert_int_equal(rc, -1);
        assert_null(c);
        assert_null(rules);
        assert_int_equal(n_rules, 0);
        assert_true(d.errors >= 1);
    } else {
        assert_int_equal(rc, p->want_rc);
    }
    conf_free(c);
    rule_list_free(rules);
    conf_diags_free(&d);
}

/* Parse `text` (see parse_any) with each allocation failing in turn: always -1 with an error
 * and nothing leaked (ASan), until the parse runs out of allocations to fail; then the result
 * is `want_rc`. */
static inline void parse_with_failing_allocations(const struct conf *base, const char *text,
                                                  int want_rc)
{
    struct parse_failing p = {base, text, want_rc};
    assert_true(kit_each_allocation_fails(&kit_conf_mem_hook, parse_failing_run, &p) > 10);
}

#endif
