/*
 * changes.h - the changes of the rules in force during a run (RULES records of the journal:
 * a rule switched, the kill switch, new rules from the admin API or a reload), as `twice
 * report` lists them and `twice verdict` sums them up: so that a run's result is read against
 * the rules that were in force, not only those of the header.
 *
 * Fed in journal order with every header and record, it keeps the changes (up to
 * CHANGES_KEPT, the rest counted), how many of each kind, and how long the kill switch held
 * faults off (from a change that turned it on to the next that turned it off, or to the end of
 * its twice run: a new process starts with faults on).
 */
#ifndef TWICE_CHANGES_H
#define TWICE_CHANGES_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/journal/journal.pb-c.h"

/* Changes kept for the lists; later ones are only counted. */
#define CHANGES_KEPT 10000
/* Change codes counted apart (Record.Change 1..9); a newer writer's codes count as other. */
#define CHANGES_CODES 10

/* One change, as journaled. */
struct change {
    uint32_t twice_run;           /* 1 for the journal's first run */
    uint64_t time_us;             /* when */
    uint64_t offset_us;           /* since the start of its run (its header's start time) */
    uint32_t code;                /* Record.Change */
    uint32_t source;              /* Record.ChangeSource */
    char *rule, *client, *detail; /* owned; "" when the record has none */
    char sha256[65];              /* rules_sha256 in hex ("" when absent) */
    uint32_t rules, rules_disabled;
    bool faults_off;
};

struct changes {
    struct change *list; /* owned, journal order */
    size_t n, cap;
    uint64_t count;                  /* every RULES record, kept or not */
    uint64_t by_code[CHANGES_CODES]; /* [0]: codes this reader does not know */
    uint64_t faults_off_us;          /* time the kill switch held faults off */
    /* the state while reading */
    uint32_t runs;
    uint64_t run_start_us, last_us, off_since_us;
    bool off;
};

/* Starts a twice run (its header, the journal's first or a later one's). */
void changes_add_header(struct changes *c, const Twice__Journal__Header *h);

/* Accounts one record (only RULES records are changes; every record's time counts).  0, or
 * -1 when out of memory. */
int changes_add_record(struct changes *c, const Twice__Journal__Record *r) TWICE_MUST_CHECK;

/* The journal ended: a kill switch still on held until its last record. */
void changes_finish(struct changes *c);

void changes_free(struct changes *c);

/* A change code's name: "rule disabled" (words), "rule_disabled" (JSON). */
const char *changes_code_text(uint32_t code);
const char *changes_code_json(uint32_t code);

/* The report's section: a line per change with its time from the start of its run, what, who,
 * the rules after it and their digest; `several_runs` prefixes the run. */
void changes_print_text(FILE *out, const struct changes *c, bool several_runs);

/* `[...]`: every change kept, as objects. */
void changes_print_json_list(FILE *out, const struct changes *c, const char *indent);

/* The verdict's line, when the rules changed: how often, of which kind, faults off for how
 * long.  Nothing when they did not. */
void changes_print_summary(FILE *out, const struct changes *c);

/* The verdict's JSON value: {"count", "by_change", "faults_off_us", "list"}. */
void changes_print_json(FILE *out, const struct changes *c);

#endif
