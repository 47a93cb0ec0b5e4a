/*
 * instances.h - what `twice report` and `twice verdict` share to read the journals of several
 * twice instances together (docs/instances.md): the read loop over a journal_set that feeds
 * each command's accumulators in merged order, the changes of the rules in force kept per
 * journal (each instance has its own kill switch and reloads) and summed up, and the lines
 * that name the instances and their journals.
 */
#ifndef TWICE_INSTANCES_H
#define TWICE_INSTANCES_H

#include "proto/base/must_check.h"

#include <stddef.h>
#include <stdio.h>

#include "offline/changes.h"
#include "offline/journal_set.h"

/* What a command does with each entry of the set, in merged order.  `source`: the journal,
 * 0-based.  Each returns 0, or -1 when out of memory. */
struct instances_feed {
    void *ctx;
    /* A header: the journal's first (`first`), or a later run's. */
    int (*header)(void *ctx, size_t source, const Twice__Journal__Header *h, bool first);
    int (*record)(void *ctx, size_t source, const Twice__Journal__Record *r);
};

/*
 * Reads every entry of s through feed, the changes of the rules of each journal into their own
 * accumulator, summed into *changes at the end (zeroed first; free with changes_free()), and
 * finishes s (journal_set_finish()).  0, or -1 with a message in err.
 */
int instances_read(struct journal_set *s, const struct instances_feed *feed,
                   struct changes *changes, char *err, size_t errlen) TWICE_MUST_CHECK;

/* The header lines naming the instances and their journals, for a person: one line per
 * journal (instance, path, records, runs, how it ended, damage).  Nothing for one journal. */
void instances_print_text(FILE *out, const struct journal_set *s);

/* `"journals": [...]`: per journal its path, instance, records, runs, how it ended and its
 * damage (null or as damage_print_json()); after a `,` and `indent`. */
void instances_print_json(FILE *out, const struct journal_set *s, const char *indent);

/* The damage of the journals read, as damage_print_text() says it at `level`: for one journal,
 * `total`'s; for several, each damaged journal's after a line naming it and its instance. */
void instances_print_damage(FILE *out, const struct journal_set *s,
                            const struct damage_report *total, const char *level);

/* A warning line when the journals' instances ran with different seeds (then they do not
 * decide alike); nothing otherwise. */
void instances_print_mixed(FILE *out, const struct journal_set *s);

#endif
