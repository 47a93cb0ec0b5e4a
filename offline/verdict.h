/*
 * verdict.h - `twice verdict`: did any handler produce a side effect twice?
 *
 * Inputs: the journal (which messages were delivered, faulted, to which task
 * type) and the effects list the load test wrote from the app's database
 * (one message id per side effect).  Per task type the verdict is:
 *
 *   NOT IDEMPOTENT  some message has two or more effects
 *   IDEMPOTENT      some message reached the handler twice and none has two effects,
 *                   for the copy delays tested (verdict_task.copy_*: a dedup key that
 *                   expires sooner than the longest one would have been caught)
 *   UNTESTED        no message reached the handler twice (and none has two effects)
 *
 * "Twice" means a copy: a delivery after an attempt's first that the app did not ask for.  A
 * retry the app asked for (journal.proto: retries, retry) starts a new attempt; it is counted
 * (verdict_task.retried, max_retries) and never taken for a copy.
 *
 * The core is an accumulator (verdict_add_record / verdict_add_effect, in
 * any order) and verdict_compute(), so tests and other front ends can feed
 * it directly; verdict_run() is the command around it.
 */
#ifndef TWICE_VERDICT_H
#define TWICE_VERDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/journal.pb-c.h"

/* Example ids listed per verdict row and per warning. */
#define VERDICT_EXAMPLES_MAX 5
/* Task name for messages whose records never named a task. */
#define VERDICT_UNKNOWN_TASK "(unknown)"

enum verdict_kind {
    VERDICT_UNTESTED = 0,
    VERDICT_IDEMPOTENT = 1,
    VERDICT_NOT_IDEMPOTENT = 2,
};

/* "UNTESTED", "IDEMPOTENT" or "NOT IDEMPOTENT". */
const char *verdict_kind_name(enum verdict_kind k);

/* Up to VERDICT_EXAMPLES_MAX ids, the smallest in strcmp order. */
struct verdict_examples {
    const char *ids[VERDICT_EXAMPLES_MAX]; /* borrowed from the struct verdict */
    size_t n;
};

/* One row of the verdict: counts of distinct message ids of one task type. */
struct verdict_task {
    const char *task;                  /* borrowed from the struct verdict */
    bool unknown;                      /* the VERDICT_UNKNOWN_TASK row */
    uint64_t messages;                 /* ids seen in the journal */
    uint64_t faulted;                  /* ids with at least one FAULT record */
    uint64_t delivered_more_than_once; /* ids the handler got twice or more: DELIVER
                                        * records less those a fault withheld */
    uint64_t more_than_one_effect;     /* ids with two or more effect lines */
    uint64_t no_effect;                /* ids delivered or faulted, no effect line */
    uint64_t doubled_single_delivery;  /* ids with 2+ effects but at most one delivery */
    /* Retries the app asked for (a Celery self.retry(), a Sidekiq or RQ retry, a nack with
     * requeue): each starts a new attempt, which is not a copy and tests nothing. */
    uint64_t retried;            /* ids the app retried at least once */
    uint64_t max_retries;        /* the most retries of one id */
    uint64_t doubled_by_retries; /* ids with 2+ effects over the app's own attempts alone */
    /* ids whose last settlement is a failure for good (a NACK record without retry: BullMQ's
     * failed set, a job stalled past maxStalledCount included; a reject without requeue):
     * work the framework gave up on, whatever effects it left */
    uint64_t failed;
    /* ids failed that way while a worker still ran them, and completed by it after (an ACK
     * after the NACK, no delivery between): an RQ job whose heartbeat lapsed, moved to the
     * failed registry by the registry's cleanup, that its work horse then finished */
    uint64_t abandoned;
    /* The copy delays tested: for every delivery that reached the handler after a message's
     * first, its time since that first one (microseconds). */
    uint64_t copies;
    uint64_t copy_min_us, copy_median_us, copy_max_us;
    enum verdict_kind verdict;
    struct verdict_examples examples;           /* ids with 2+ effects */
    struct verdict_examples single_examples;    /* ids counted in doubled_single_delivery */
    struct verdict_examples retry_examples;     /* ids counted in doubled_by_retries */
    struct verdict_examples failed_examples;    /* ids counted in failed */
    struct verdict_examples abandoned_examples; /* ids counted in abandoned */
};

struct verdict_result {
    struct verdict_task *tasks; /* owned; by task name, the unknown row last */
    size_t n_tasks;
    uint64_t effect_lines;         /* effect lines fed in */
    uint64_t unknown_effect_ids;   /* distinct effect ids the journal never saw */
    uint64_t unknown_effect_lines; /* effect lines naming those ids */
    struct verdict_examples unknown_examples;
    enum verdict_kind overall; /* NOT IDEMPOTENT > IDEMPOTENT > UNTESTED over the rows */
};

struct verdict;

/* An empty accumulator, or NULL when out of memory.  Free with verdict_free(). */
struct verdict *verdict_new(void) __attribute__((warn_unused_result));

/*
 * Accounts one journal record.  Records without a message id are ignored.
 * A message's task is the first non-empty task any of its records names.
 * Returns 0, or -1 when out of memory.
 */
int verdict_add_record(struct verdict *v, const Twice__Journal__Record *r)
    __attribute__((warn_unused_result));

/* Accounts one side effect of message_id.  Returns 0, or -1 when out of memory. */
int verdict_add_effect(struct verdict *v, const char *message_id)
    __attribute__((warn_unused_result));

/*
 * Computes the rows.  out's strings point into v: free out with
 * verdict_result_free() before verdict_free(v).  Returns 0, or -1 when out of
 * memory.
 */
int verdict_compute(const struct verdict *v, struct verdict_result *out)
    __attribute__((warn_unused_result));

void verdict_result_free(struct verdict_result *res);

/* Frees v and everything it owns.  NULL is a no-op. */
void verdict_free(struct verdict *v);

/*
 * Reads an effects file into v: one message id per line; leading and trailing
 * blanks and a trailing \r are stripped, blank lines and lines starting with
 * '#' are skipped.  Returns 0 (*lines = effect lines read) or -1 with a
 * message in err.
 */
int verdict_load_effects(struct verdict *v, const char *path, uint64_t *lines, char *err,
                         size_t errlen) __attribute__((warn_unused_result));

/*
 * The `twice verdict --journal J --effects E [--json]` command, printing to
 * out and diagnostics to err.  argv[0] is the subcommand name.  Returns 1 when
 * any task is NOT IDEMPOTENT, 0 otherwise, 2 on usage or I/O errors.
 */
int verdict_run(int argc, char **argv, FILE *out, FILE *err);

#endif
