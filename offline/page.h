/*
 * page.h - `twice report` and `twice verdict` as a page to look at (`--html FILE`) and as
 * markdown to paste where code is reviewed (`--format markdown`).
 *
 * Both commands hand over what they already computed (the journal's facts, their verdict
 * accumulator, the verdict's rows) and a fault log (offline/fault_log.h) fed in the same pass;
 * the per-task figures the charts need (deliveries by how the verdict counted them, copy
 * delays, example messages) come from one walk over the accumulator's messages (page_walk).
 * The page keeps the text output's honesty: a row without copies says UNTESTED as loudly as
 * one that failed, missing evidence is named in the row, the warnings stand at the top, and
 * the whole text output is on the page too.
 */
#ifndef TWICE_PAGE_H
#define TWICE_PAGE_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "offline/changes.h"
#include "offline/damage.h"
#include "offline/fault_log.h"
#include "offline/strmap.h"
#include "offline/verdict.h"

/* Deliveries by how the verdict counted them (the report's "COUNTED"). */
enum page_counted {
    PAGE_FIRST = 0,
    PAGE_COPY = 1,
    PAGE_SET_ASIDE = 2,
    PAGE_WITHHELD = 3,
    PAGE_UNREACHED = 4,
    PAGE_COUNTED = 5
};

/* Bins of the copy-delay histograms (edges 0, 1ms, 3ms, 10ms, ..., 1h, then longer). */
#define PAGE_DELAY_BINS 16
/* Example messages drawn as timelines, per task and in all. */
#define PAGE_EXAMPLES_PER_TASK 2
#define PAGE_EXAMPLES_MAX 12
/* Example ids in a row of the verdict's table (page and markdown); all are listed whole under
 * it. */
#define PAGE_ROW_EXAMPLES 2
/* Messages listed by deliveries (the report's "top"). */
#define PAGE_TOP 10

/* The journal and the inputs, as the command read them. */
struct page_facts {
    const char *journal, *effects;        /* effects: NULL for the report */
    const Twice__Journal__Header *header; /* the first run's, or NULL */
    uint64_t seed, start_unix_ms, records, runs, unclean_runs, effect_lines;
    bool truncated, clean_stop, allow_damaged;
    const struct damage_report *damage;
    const struct changes *changes;
    const char *text;  /* the command's whole text output (the page shows it at its end) */
    const char *notes; /* the verdict's lines under its table (evidence, warnings) */
};

/* One task's figures from the walk. */
struct page_task {
    const char *name; /* the map's key */
    uint64_t messages;
    uint64_t counted[PAGE_COUNTED];
    uint64_t copies, overlapping;
    uint64_t delays[PAGE_DELAY_BINS];
    uint64_t by_effects[3]; /* messages with no, one, two or more effect lines */
    const char *copy_id;    /* a message with a copy (one that overlapped, when any) */
    const char *aside_id;   /* one with a delivery set aside or withheld */
    const char *fault_id;   /* one twice faulted */
    bool copy_overlapped;
};

struct page_walk {
    struct strmap tasks; /* name -> struct page_task * (owned) */
    const char *top_id[PAGE_TOP];
    uint64_t top_n[PAGE_TOP];
    size_t n_top;
    uint64_t messages, delivered, delivered_more_than_once;
};

/* Walks every message of v (fl: the faults, for the examples).  0, or -1 when out of memory
 * (w then holds what was walked: free it). */
int page_walk(struct page_walk *w, const struct verdict *v,
              const struct fault_log *fl) TWICE_MUST_CHECK;

/* The tasks, by name, into a new array (caller frees); NULL when none or out of memory. */
const struct page_task **page_walk_tasks(const struct page_walk *w, size_t *n);

void page_walk_free(struct page_walk *w);

/* How the verdict counted delivery d. */
enum page_counted page_counted_of(const struct verdict_delivery *d);

/* The report's page.  0, or -1 when out of memory. */
int page_report_html(FILE *out, const struct page_facts *f, const struct verdict *v,
                     const struct fault_log *fl) TWICE_MUST_CHECK;

/* The verdict's page.  0, or -1 when out of memory. */
int page_verdict_html(FILE *out, const struct page_facts *f, const struct verdict *v,
                      const struct verdict_result *res,
                      const struct fault_log *fl) TWICE_MUST_CHECK;

/* The report as markdown.  0, or -1 when out of memory. */
int page_report_markdown(FILE *out, const struct page_facts *f, const struct verdict *v,
                         const struct fault_log *fl) TWICE_MUST_CHECK;

/* The verdict as markdown.  0, or -1 when out of memory. */
int page_verdict_markdown(FILE *out, const struct page_facts *f, const struct verdict_result *res,
                          const struct fault_log *fl) TWICE_MUST_CHECK;

/* A verdict row's instances or listeners: "a, b (+N more)", each name written by item(), or
 * "-" when there is none.  The text table, the markdown and the page share it. */
void page_names(FILE *out, const char *const *names, size_t n, size_t total,
                void (*item)(FILE *out, const char *name));

/* Writes the output of fn(out, ctx) to path ("-": out) whole or not at all: into a temporary
 * file beside it, renamed over it once written.  0, or -1 with a message in err. */
int page_write_file(const char *path, FILE *out, int (*fn)(FILE *f, void *ctx), void *ctx,
                    char *err, size_t errlen) TWICE_MUST_CHECK;

#endif
