/*
 * conf_testkit.h - what the configuration and rule-language tests share:
 * expected diagnostics, their comparison, and parsing a text that must be
 * valid.  Header-only: each test is its own executable.
 */
#ifndef TWICE_CONF_TESTKIT_H
#define TWICE_CONF_TESTKIT_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "rules/conf.h"

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

#endif
