/*
 * journal_set.h - several journals read as one: those of several twice instances (one per
 * worker pool, per zone, per broker: docs/instances.md), named on the command line.
 *
 * A command that reads journals takes them as positional arguments and as `--journal FILE`
 * (repeated, or `--journal=FILE`), each possibly a glob pattern twice expands itself
 * (every `.pb` file of a directory, quoted so that the shell leaves it alone).  A pattern that
 * matches no file is an error; every journal given is read, a file named twice (a pattern and
 * a name) once.
 *
 * journal_set_next() hands out the entries of all journals merged by time: each journal's in
 * its own order (its records are in the order its writer saw them), and of the journals' next
 * entries the earliest first (a later run's header by its start time, a record by its time;
 * ties go to the journal named first).  Damage, a last record cut short and a missing stop
 * record are each journal's own: journal_set_info() says them per journal once read.
 *
 * Pure C over offline/journal_reader.h and glob(3): no libevent, no OpenSSL.
 */
#ifndef TWICE_JOURNAL_SET_H
#define TWICE_JOURNAL_SET_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "offline/damage.h"
#include "offline/journal_reader.h"

/* Journals one command reads at most. */
#define JOURNAL_SET_MAX 4096

/* The journal files a command was given, in order, globs expanded.  Owned strings. */
struct journal_paths {
    char **path;
    size_t n, cap;
};

/*
 * Takes argv[*i] if it names journals: a positional argument ("-" alone included) or
 * `--journal FILE` / `--journal=FILE`, FILE a path or a glob pattern.  Returns 1 when taken
 * (*i advanced past a flag's value), 0 when argv[*i] is another option, or -1 after writing
 * why to err (a flag without a value, a pattern matching nothing, a journal named twice, out
 * of memory).  argv[0] is the command.
 */
int journal_paths_arg(int argc, char **argv, int *i, struct journal_paths *p,
                      FILE *err) TWICE_MUST_CHECK;

void journal_paths_free(struct journal_paths *p);

/* What a journal of the set held, once read (journal_set_finish()). */
struct journal_info {
    const char *path;     /* as given (borrowed from the set) */
    const char *instance; /* its first header's instance, or its path when it names none */
    const Twice__Journal__Header *header; /* its first header (owned by the set) */
    uint64_t records;                     /* records read, headers not counted */
    uint64_t runs, unclean_runs;          /* as journal_reader_runs(), _unclean_runs() */
    bool truncated, clean_stop;
    struct damage_report damage;
};

struct journal_set;

/*
 * Opens every journal of paths and reads their headers.  NULL with a message in err when one
 * cannot be opened (the message names it) or out of memory.
 */
struct journal_set *journal_set_open(const struct journal_paths *paths, char *err,
                                     size_t errlen) TWICE_MUST_CHECK;

/* Journals in the set. */
size_t journal_set_count(const struct journal_set *s);

/* Journal i's information (its header right after opening; the rest once finished). */
const struct journal_info *journal_set_info(const struct journal_set *s, size_t i);

/*
 * The next entry of the set, merged by time: 1 with *e (owned by the set, valid until the next
 * call) and *source (the journal, 0-based); 0 when every journal is read; or -1 on a reader's
 * sticky error (I/O, memory) with a message naming the journal in err.
 */
int journal_set_next(struct journal_set *s, size_t *source, const Twice__Journal__Entry **e,
                     char *err, size_t errlen) TWICE_MUST_CHECK;

/* Fills each journal's information from its reader (call after the last journal_set_next()). */
void journal_set_finish(struct journal_set *s);

/* The sum over the set: any truncated, all with their stop record, the damage added up (its
 * stretches in journal order), records, runs and unclean runs summed. */
void journal_set_total(const struct journal_set *s, struct journal_info *total);

/* Whether the journals' first headers differ in seed (their instances then do not decide
 * alike: docs/instances.md).  Their configurations differ anyway (each has its own `instance`,
 * binds and upstreams): the digest says nothing of the rules alone. */
bool journal_set_mixed_config(const struct journal_set *s);

void journal_set_close(struct journal_set *s);

#endif
