/*
 * report.h - the `twice report` and `twice verdict` subcommands.
 *
 *   twice report JOURNAL [--json] [--message ID] [--messages]
 *       the journal's header, faults per rule, deliveries per message,
 *       connections and close reasons; with --message the timeline of one
 *       message and each of its deliveries as the verdict counts it (how it
 *       ended, copy or not, overlap); with --messages that of every message.
 *   twice verdict JOURNAL --effects E [--json]
 *       per task type: was any message's side effect produced twice?
 *       (offline/verdict.h has the computation.)
 *
 * Both take the journal as their first argument, or as --journal JOURNAL
 * (offline/cli.h).  Both read the journal with offline/journal_reader.h in
 * one streaming pass and keep one hash-map entry per distinct message id, so
 * a journal of millions of records is fine.  --json output is one object whose keys and order are
 * stable; fields are only ever added.
 */
#ifndef TWICE_REPORT_H
#define TWICE_REPORT_H

#include <stdio.h>

/* Messages listed in "top messages by deliveries". */
#define REPORT_TOP_N 10
/* Records of one message kept for --message; later ones are only counted. */
#define REPORT_TIMELINE_MAX 10000
/* What both commands say of a journal that ends without its `stop` record (a warning: the
 * records before the end are sound). */
#define REPORT_NO_CLEAN_STOP                                                                       \
    "warning: the journal ended without a clean stop (no stop record: twice was killed or "        \
    "crashed); the records it had not yet written are missing (by default the last second of "     \
    "them: see journal-flush)"

/* What both commands say of a journal of several runs when some run before the last ended
 * without its `stop` record (printf: the count of those runs, the count of runs). */
#define REPORT_UNCLEAN_RUNS                                                                        \
    "warning: %llu of the journal's %llu runs ended without a clean stop before the next run "     \
    "started (twice was killed or crashed): the records it had not yet written are missing, "      \
    "and the connections it left open are taken as closed at its last record"

/*
 * `twice report`, printing to out and diagnostics to err.  argv[0] is the
 * subcommand name.  Returns 0; 1 when --message names an id no record has; or
 * 2 on usage, I/O or journal errors.  A journal cut short at the end, or one
 * that ended without a clean stop, is reported with a warning, not an error.
 */
int report_run(int argc, char **argv, FILE *out, FILE *err);

/* report_run() on stdout and stderr: the entry point for proxy/core/main.c. */
int report_main(int argc, char **argv);

/* verdict_run() (offline/verdict.h) on stdout and stderr: the entry point for
 * proxy/core/main.c.  Returns its exit code (VERDICT_EXIT_* of offline/verdict.h). */
int verdict_main(int argc, char **argv);

#endif
