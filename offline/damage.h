/*
 * damage.h - what `twice report` and `twice verdict` say of a damaged journal, in the same
 * words: the stretches of bytes the reader skipped (offline/journal_reader.h), where, why, and
 * what was lost with them.
 */
#ifndef TWICE_DAMAGE_H
#define TWICE_DAMAGE_H

#include <stdbool.h>
#include <stdio.h>

#include "offline/journal_reader.h"

/* A journal's damage, kept once its reader is closed. */
struct damage_report {
    struct journal_damage_summary sum;
    struct journal_damage list[JOURNAL_DAMAGE_KEPT]; /* the first sum.stretches of them */
    bool checksums;                                  /* the journal's entries carry theirs */
};

/* Copies r's damage into d (r's header must have been read). */
void damage_report_take(struct damage_report *d, const struct journal_reader *r);

/* Whether any byte was skipped. */
bool damage_any(const struct damage_report *d);

/* The lines for a person: "LEVEL: the journal is damaged: ..." and one line per stretch (the
 * first JOURNAL_DAMAGE_KEPT), each ending in a newline; nothing when undamaged. */
void damage_print_text(FILE *out, const struct damage_report *d, const char *level);

/* The JSON value: null when undamaged, else an object with the totals and the stretches. */
void damage_print_json(FILE *out, const struct damage_report *d);

#endif
