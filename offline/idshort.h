/*
 * idshort.h - message ids shortened in a table, as git shortens commit ids: the first
 * IDSHORT_MIN characters and "…", longer when two ids of the table share that prefix, so that
 * each shortened id still names one message among those the table shows.  The whole ids are
 * listed under the table (idshort_print_list) and stay whole in --json.
 */
#ifndef TWICE_IDSHORT_H
#define TWICE_IDSHORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "offline/verdict.h"

/* Characters kept at least. */
#define IDSHORT_MIN 8
/* The length that cuts no id (a set that ran out of memory). */
#define IDSHORT_WHOLE ((size_t)1 << 30)

struct idshort {
    const char **ids; /* owned array of borrowed ids, sorted and distinct after finish */
    size_t n, cap;
    size_t len;  /* characters kept (after idshort_finish) */
    bool failed; /* out of memory: nothing is cut */
};

/* An empty set (same as zeroing it). */
void idshort_init(struct idshort *s);

/* Notes an id the table will show (borrowed: it must outlive s).  Out of memory, s shows
 * every id whole. */
void idshort_add(struct idshort *s, const char *id);

/* s: a new set (idshort_init()) of the example ids of every row of res (verdict_task.examples),
 * finished. */
void idshort_of_examples(struct idshort *s, const struct verdict_result *res);

/* Computes the length: IDSHORT_MIN characters, or one more than the longest prefix two of the
 * ids share. */
void idshort_finish(struct idshort *s);

/* Whether id is shown cut (longer than the length plus one). */
bool idshort_cut(const struct idshort *s, const char *id);

/* id as the table shows it, for a terminal (text_write_safe()).  Returns the characters
 * written. */
int idshort_write(FILE *out, const struct idshort *s, const char *id);

/* The bytes of id kept when it is cut (at a character boundary). */
size_t idshort_prefix_bytes(const struct idshort *s, const char *id);

/* "\nTITLE\n" and one line "  SHORT  WHOLE" per id shown cut; nothing when none is. */
void idshort_print_list(FILE *out, const struct idshort *s, const char *title);

void idshort_free(struct idshort *s);

#endif
