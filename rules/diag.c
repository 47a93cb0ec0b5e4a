/*
 * diag.c - the diagnostic list: every problem found in a configuration file,
 * kept sorted by position so that it prints in file order.
 *
 * A diagnostic is inserted after every existing one at the same or an earlier
 * position, which keeps the list stably sorted by (line, col) without a sort
 * pass: problems found late (a missing `bind`, an unknown rule listener) land
 * where they belong.  Most diagnostics arrive in file order, so insertion is
 * usually an append.
 */
#include "rules/diag.h"

#include "rules/conf_mem.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void conf_diags_init(struct conf_diags *diags)
{
    memset(diags, 0, sizeof(*diags));
    diags->tail = &diags->head;
}

void conf_diags_free(struct conf_diags *diags)
{
    struct conf_diag *d = diags->head;

    while (d != NULL) {
        struct conf_diag *next = d->next;
        free(d->msg);
        free(d->hint);
        free(d);
        d = next;
    }
    free(diags->file);
    conf_diags_init(diags);
}

/* True when position a sorts after position b. */
static bool conf_loc_after(struct conf_loc a, struct conf_loc b)
{
    return a.line > b.line || (a.line == b.line && a.col > b.col);
}

/* Link `d` after every diagnostic at or before its position. */
static void conf_diags_insert(struct conf_diags *diags, struct conf_diag *d)
{
    struct conf_diag **link = &diags->head;

    if (diags->tail == NULL) {
        diags->tail = &diags->head; /* a zeroed, never initialised list */
    }
    if (diags->tail != &diags->head) {
        struct conf_diag *last =
            (struct conf_diag *)((char *)diags->tail - offsetof(struct conf_diag, next));
        if (!conf_loc_after(last->loc, d->loc)) {
            link = diags->tail;
        }
    }
    while (*link != NULL && !conf_loc_after((*link)->loc, d->loc)) {
        link = &(*link)->next;
    }
    d->next = *link;
    *link = d;
    if (d->next == NULL) {
        diags->tail = &d->next;
    }
}

/* A new diagnostic owning `msg` (taken even on failure), or NULL when out of
 * memory. */
static struct conf_diag *conf_diag_make(enum conf_severity sev, struct conf_loc loc,
                                        const char *hint, char *msg)
{
    struct conf_diag *d = conf_mem_calloc(1, sizeof(*d));

    if (d == NULL || msg == NULL) {
        free(d);
        free(msg);
        return NULL;
    }
    d->hint = hint != NULL ? conf_mem_strdup(hint) : NULL;
    if (hint != NULL && d->hint == NULL) {
        free(d);
        free(msg);
        return NULL;
    }
    d->severity = sev;
    d->loc = loc;
    d->msg = msg;
    return d;
}

/* A diagnostic could not be stored.  Whatever it was, the result is now
 * unreliable, so count an error (the parse fails) and say why if we can. */
static void conf_diag_lost(struct conf_diags *diags)
{
    struct conf_diag *d =
        conf_diag_make(CONF_ERROR, (struct conf_loc){0, 0}, NULL, conf_mem_strdup("out of memory"));

    diags->errors++;
    if (d != NULL) {
        conf_diags_insert(diags, d);
    }
}

void conf_diag_add(struct conf_diags *diags, enum conf_severity sev, struct conf_loc loc,
                   const char *hint, const char *fmt, ...)
{
    struct conf_diag *d;
    va_list ap;
    char *msg;

    va_start(ap, fmt);
    msg = conf_mem_vprintf(fmt, ap);
    va_end(ap);
    d = conf_diag_make(sev, loc, hint, msg);
    if (d == NULL) {
        conf_diag_lost(diags);
        return;
    }
    if (sev == CONF_ERROR) {
        diags->errors++;
    } else {
        diags->warnings++;
    }
    conf_diags_insert(diags, d);
}

void conf_diag_oom(struct conf_diags *diags)
{
    conf_diag_add(diags, CONF_ERROR, (struct conf_loc){0, 0}, NULL, "out of memory");
}

void conf_diags_print(const struct conf_diags *diags, FILE *out)
{
    const char *file = diags->file != NULL ? diags->file : "<config>";

    for (const struct conf_diag *d = diags->head; d != NULL; d = d->next) {
        const char *sev = d->severity == CONF_ERROR ? "error" : "warning";
        if (d->loc.line == 0) {
            fprintf(out, "%s: %s: %s", file, sev, d->msg);
        } else {
            fprintf(out, "%s:%u:%u: %s: %s", file, d->loc.line, d->loc.col, sev, d->msg);
        }
        if (d->hint != NULL) {
            fprintf(out, " (%s)", d->hint);
        }
        fputc('\n', out);
    }
}

const char *conf_show(const char *s, char *buf)
{
    size_t i;

    for (i = 0; s[i] != '\0' && i < CONF_SHOW_MAX; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (s[i] != '\0') {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}
