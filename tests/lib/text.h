/*
 * text.h - what a test says, one line at a time, to compare or search afterwards: a reading of
 * a session, the records a fake host was handed, the plans a module made.  kit_say appends one
 * formatted line of any length; kit_contains / kit_lacks fail the test showing the whole text.
 *
 * The buffer comes from KIT_RAW_REALLOC (golden.h), so a test that fails allocations
 * (failalloc.h, included first) neither counts nor fails it.  Header-only: include it after
 * <cmocka.h>.
 */
#ifndef TWICE_KIT_TEXT_H
#define TWICE_KIT_TEXT_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tests/lib/golden.h"

struct kit_text {
    char *s; /* NULL until the first line */
    size_t len, cap;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

static void kit_say(struct kit_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends one line (the newline is added). */
static void kit_say(struct kit_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    if (t->len + (size_t)n + 2 > t->cap) {
        size_t cap = (t->len + (size_t)n + 2) * 2;
        char *s = KIT_RAW_REALLOC(t->s, cap);
        assert_non_null(s);
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
    t->s[t->len++] = '\n';
    t->s[t->len] = '\0';
}

static void kit_text_free(struct kit_text *t)
{
    KIT_RAW_FREE(t->s);
    memset(t, 0, sizeof(*t));
}

/* The text, "" when nothing was said. */
static const char *kit_str(const struct kit_text *t)
{
    return t->s != NULL ? t->s : "";
}

static void kit_contains(const struct kit_text *t, const char *needle)
{
    if (strstr(kit_str(t), needle) == NULL)
        fail_msg("expected to find\n  %s\nin\n%s", needle, kit_str(t));
}

static void kit_lacks(const struct kit_text *t, const char *needle)
{
    if (strstr(kit_str(t), needle) != NULL)
        fail_msg("did not expect\n  %s\nin\n%s", needle, kit_str(t));
}

#pragma GCC diagnostic pop

#endif
