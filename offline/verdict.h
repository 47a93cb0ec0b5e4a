/*
 * verdict.h - `twice verdict`: did any handler produce a side effect twice, and over which
 * evidence?
 *
 * Inputs: the journal (which messages were delivered and settled, on which connections, which
 * were faulted, to which task type) and the effects list the load test wrote from the app's
 * database (one message id per side effect).  Per task type the verdict is:
 *
 *   NOT IDEMPOTENT  some message has two or more effects
 *   IDEMPOTENT      some copy reached the handler and no message has two effects; the row says
 *                   over which evidence: the copy delays tested (verdict_task.copy_*: a dedup
 *                   key that expires sooner than the longest one would have been caught), and
 *                   how many copies reached a worker while an earlier delivery of the message
 *                   was still running (verdict_task.overlapping: a check-then-act guard is
 *                   only tested by those).  Evidence a row lacks is named in `missing`.
 *   UNTESTED        no copy reached the handler (and none has two effects), or, under
 *                   verdict_options.require, the row lacks the evidence a CI job asked for
 *
 * A copy is a delivery after an attempt's first that the app did not ask for.  A retry the app
 * asked for (journal.proto: retries, retry) starts a new attempt; it is counted
 * (verdict_task.retried, max_retries) and never taken for a copy.
 *
 * Each delivery is replayed with its settlement: the ack, nack, completion or failure the
 * worker sent for it (matched by connection and delivery tag, else the oldest unsettled
 * delivery of the message), and the close of its connection.  On a listener whose framework
 * settles deliveries on the wire, a delivery that was never settled was never seen to reach a
 * handler (a prefetched message requeued when its connection closed): it is no evidence, and a
 * redelivery after it is set aside, not counted as a copy (verdict_task.set_aside).
 *
 * The core is an accumulator (verdict_add_header / verdict_add_record / verdict_add_effect,
 * the records in journal order) and verdict_compute(), so tests and other front ends can feed
 * it directly; verdict_run() is the command around it (offline/verdict_print.c).
 */
#ifndef TWICE_VERDICT_H
#define TWICE_VERDICT_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/journal/journal.pb-c.h"

/* Example ids listed per verdict row and per warning. */
#define VERDICT_EXAMPLES_MAX 5
/* Task name for messages whose records never named a task. */
#define VERDICT_UNKNOWN_TASK "(unknown)"
/* A copy delivered less than this before the settlement of an earlier delivery (the same
 * millisecond) came after it: that worker had done its work and was sending its ack. */
#define VERDICT_OVERLAP_MARGIN_US 1000ull
/* A run a worker reports (Sidekiq's heartbeat) counts as another's than a copy only when it
 * started more than this before the copy came: its start is by the worker's clock, to the
 * second, the copy's delivery by twice's. */
#define VERDICT_RUN_CLOCK_US (1000ull * 1000)
/* Copies within this of the first delivery test a short window only: said as missing
 * evidence ("window"). */
#define VERDICT_SHORT_WINDOW_US (60ull * 1000 * 1000)
/* Instance and listener names listed per row (verdict_task.seen_*). */
#define VERDICT_SEEN_MAX 8
/* Default of verdict_options.stall_after_us. */
#define VERDICT_STALL_AFTER_US (30ull * 1000 * 1000)

enum verdict_kind {
    VERDICT_UNTESTED = 0,
    VERDICT_IDEMPOTENT = 1,
    VERDICT_NOT_IDEMPOTENT = 2,
};

/* "UNTESTED", "IDEMPOTENT" or "NOT IDEMPOTENT". */
const char *verdict_kind_name(enum verdict_kind k);

/* How a copy stood to the earlier deliveries of its message (same attempt) that reached a
 * handler. */
enum verdict_overlap {
    VERDICT_COPY_NONE = 0,    /* not a copy: a first delivery, withheld, or set aside */
    VERDICT_COPY_AFTER = 1,   /* each earlier one had been settled when the copy came */
    VERDICT_COPY_OVERLAP = 2, /* an earlier one, on another connection, was still unsettled, and
                                 both surely ran then: neither connection had anything earlier
                                 still out (nothing waited in a prefetch buffer) */
    VERDICT_COPY_UNKNOWN = 3, /* an earlier one was never settled on the wire (Sidekiq, lists
                                 without a processing list), or was unsettled on the same
                                 connection, or on one closed before the copy came (the copy may
                                 have waited behind it in that worker, reconnected), or one of
                                 the two may have waited behind other work of its worker */
};

/* "after", "overlap", "unknown", or "" for VERDICT_COPY_NONE. */
const char *verdict_overlap_name(enum verdict_overlap o);

/* Evidence a row lacks (verdict_task.missing), bits. */
enum verdict_missing {
    VERDICT_MISSING_COPIES = 1,  /* no copy reached the handler (UNTESTED) */
    VERDICT_MISSING_OVERLAP = 2, /* no copy reached a worker while an earlier one ran */
    VERDICT_MISSING_WINDOW = 4,  /* every copy came within VERDICT_SHORT_WINDOW_US, or within
                                    less than the window --require asked for */
};

/* What a CI job asks of every row (`--require`); 0: not asked. */
struct verdict_require {
    uint64_t copies;    /* at least this many copies reached the handler */
    uint64_t overlaps;  /* at least this many of them overlapped an earlier delivery */
    uint64_t window_us; /* a copy came at least this long after its first delivery */
};

struct verdict_options {
    struct verdict_require require;
    uint64_t stall_after_us; /* 0: VERDICT_STALL_AFTER_US */
};

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
    uint64_t delivered_more_than_once; /* ids with a copy that reached the handler */
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
    /* The copy delays tested: for every copy that reached the handler, its time since the
     * first delivery of its attempt that did (microseconds). */
    uint64_t copies;
    uint64_t copy_min_us, copy_median_us, copy_max_us;
    /* The copies by how they stood to the earlier deliveries (enum verdict_overlap); they add
     * up to `copies`. */
    uint64_t overlapping, sequential, overlap_unknown;
    /* Overlapping copies: how long before the earlier delivery's settlement each came (the
     * time both workers had the message, at least), longest and median. */
    uint64_t overlap_max_us, overlap_median_us;
    /* Redeliveries not counted as copies because no worker was seen to finish the delivery
     * before them (journal.proto: never settled, its connection closed or still open at the
     * end), and the ids they belong to. */
    uint64_t set_aside;
    uint64_t set_aside_messages;
    /* Work that stopped: ids published through twice and never delivered; delivered (on a
     * listener that settles) whose last delivery was never settled, or that were requeued and
     * never delivered again. */
    uint64_t never_delivered, unfinished;
    /* Outstanding ids at the end and no delivery or settlement of the task during the last
     * stall_after_us of the journal: the consumers stopped while work was waiting. */
    bool stalled;
    uint64_t last_progress_us; /* the task's last delivery or settlement (0: none) */
    unsigned missing;          /* enum verdict_missing bits: evidence this row lacks */
    bool required_short;       /* fell short of verdict_options.require: verdict UNTESTED */
    /* The listener its first delivery came through, as the journal's header names it (NULL:
     * not in the header): which rule would bring the missing evidence. */
    const char *listener, *protocol, *profile;
    /* That listener's visibility or consumer timeout in ms (0: none, or a journal that does not
     * say): a later copy cannot be asked for with `after D` there. */
    uint32_t visibility_ms;
    bool consumer_timeout;
    /* The twice instances and listeners its messages were delivered or settled through: the
     * first VERDICT_SEEN_MAX names in strcmp order (borrowed from the struct verdict), and how
     * many in all.  An instance is the journal header's `instance`, or the journal's file name
     * for a journal that does not name one. */
    const char *seen_instances[VERDICT_SEEN_MAX];
    size_t n_seen_instances, seen_instances_total;
    const char *seen_listeners[VERDICT_SEEN_MAX];
    size_t n_seen_listeners, seen_listeners_total;
    enum verdict_kind verdict;
    struct verdict_examples examples;             /* ids with 2+ effects */
    struct verdict_examples single_examples;      /* ids counted in doubled_single_delivery */
    struct verdict_examples retry_examples;       /* ids counted in doubled_by_retries */
    struct verdict_examples failed_examples;      /* ids counted in failed */
    struct verdict_examples abandoned_examples;   /* ids counted in abandoned */
    struct verdict_examples overlap_examples;     /* ids with an overlapping copy */
    struct verdict_examples set_aside_examples;   /* ids with a delivery set aside */
    struct verdict_examples outstanding_examples; /* never delivered or unfinished */
};

/* What the effects list says of itself against the journal. */
enum verdict_effects_check {
    VERDICT_EFFECTS_OK = 0,
    VERDICT_EFFECTS_EMPTY = 1,     /* no effect line, while messages were delivered (a journal
                                      of publishes only, a stalled run, is no mismatch) */
    VERDICT_EFFECTS_NO_MATCH = 2,  /* no line names a message of the journal */
    VERDICT_EFFECTS_MOSTLY_OFF = 3 /* more than half of the lines name none */
};

struct verdict_result {
    struct verdict_task *tasks; /* owned; by task name, the unknown row last */
    size_t n_tasks;
    uint64_t effect_lines;            /* effect lines fed in */
    uint64_t unknown_effect_ids;      /* distinct effect ids the journal never saw */
    uint64_t unknown_effect_lines;    /* effect lines naming those ids */
    uint64_t effect_lines_with_comma; /* lines holding a ',' or a ';' (a CSV export?) */
    struct verdict_examples unknown_examples;
    enum verdict_effects_check effects_check;
    uint64_t end_us;             /* the journal's last record */
    uint64_t delivered_messages; /* ids delivered at least once */
    enum verdict_kind overall;   /* NOT IDEMPOTENT > IDEMPOTENT > UNTESTED over the rows */
    bool any_required_short;     /* a row fell short of the requirements */
    bool any_stalled;
};

/* One delivery of a message as the verdict replayed it (verdict_message_deliveries). */
struct verdict_delivery {
    uint64_t time_us;
    uint64_t session;   /* its connection's id, as journaled in its twice run */
    uint32_t twice_run; /* that run: 1 for the journal's first (a journal of several runs:
                           `journal PATH append`); 0 when no header was added */
    uint64_t tag;       /* low 32 bits of the AMQP delivery tag */
    uint32_t attempt;   /* 1: the first attempt; one more per retry the app asked for */
    uint32_t ev;        /* its place among the accumulator's records: tells two deliveries apart */
    bool withheld;      /* a fault kept it from the worker */
    bool auto_ack;      /* taken without an ack (AMQP no-ack): reached, never settled */
    bool settled;
    bool refused;        /* its settlement was refused by the framework (journal.proto) */
    bool settled_guess;  /* the settlement could be another delivery's (no tag or connection
                            named it, and another delivery of the message was out): taken as
                            this one's, the oldest's, its earliest possible end */
    bool nack;           /* settled by a NACK record */
    uint64_t settled_us; /* settled: when */
    uint64_t closed_us;  /* its connection closed before it was settled: when; else 0 */
    bool reached;        /* counted as having reached a handler */
    bool set_aside;      /* a redelivery not counted as a copy */
    enum verdict_overlap overlap; /* for a copy */
    uint64_t copy_delay_us;       /* for a copy: since its attempt's first */
    uint64_t overlap_us;          /* VERDICT_COPY_OVERLAP: how long it ran beside the earlier */
    uint32_t journal;             /* the journal it came through: 1 for the first read; 0 when
                                     no header was added */
    const char *instance;         /* that journal's instance (borrowed), NULL with no header */
    const char *listener;         /* the listener it came through (borrowed), NULL: not named */
};

struct verdict;

/* An empty accumulator, or NULL when out of memory.  Free with verdict_free(). */
struct verdict *verdict_new(void) TWICE_MUST_CHECK;

/*
 * Notes the journal header's listeners (their protocol and profile say whether deliveries
 * are settled on the wire, and which rule brings missing evidence).  Optional; call before
 * the records.  In a journal of several runs, call it again at each later run's header, in
 * journal order: the run before ended there (the connections it left open closed with it),
 * and the sessions of the runs are told apart.  Returns 0, or -1 when out of memory.
 */
int verdict_add_header(struct verdict *v, const Twice__Journal__Header *h) TWICE_MUST_CHECK;

/*
 * Several journals read together (instances of twice, docs/instances.md): the header of journal
 * `source` (0-based, numbered by the caller; its first, or a later run's), written by the
 * header's `instance`, or `fallback_instance` when it names none (a journal of a twice before
 * instances: the caller passes its file name).  Connections of different journals and runs are
 * kept apart; a message is keyed by its id alone, so one delivered through one instance and
 * settled through another is one message.  verdict_add_header(v, h) is
 * verdict_add_source_header(v, 0, h, NULL).  Returns 0, or -1 when out of memory.
 */
int verdict_add_source_header(struct verdict *v, uint32_t source, const Twice__Journal__Header *h,
                              const char *fallback_instance) TWICE_MUST_CHECK;

/* Accounts one record of journal `source`: the records of all journals merged by time, each
 * journal's in its own order (offline/journal_set.h).  verdict_add_record(v, r) is
 * verdict_add_source_record(v, 0, r).  Returns 0, or -1 when out of memory. */
int verdict_add_source_record(struct verdict *v, uint32_t source,
                              const Twice__Journal__Record *r) TWICE_MUST_CHECK;

/*
 * Accounts one journal record, in journal order.  Records without a message id count only
 * for their time and, for CLOSE, their session.  A message's task is the first non-empty task
 * any of its records names.  Returns 0, or -1 when out of memory.
 */
int verdict_add_record(struct verdict *v, const Twice__Journal__Record *r) TWICE_MUST_CHECK;

/* Accounts one side effect of message_id.  Returns 0, or -1 when out of memory. */
int verdict_add_effect(struct verdict *v, const char *message_id) TWICE_MUST_CHECK;

/* Counts an effect line that holds a ',' or ';' (verdict_result.effect_lines_with_comma). */
void verdict_note_effect_line_shape(struct verdict *v, const char *line);

/*
 * Computes the rows.  opt may be NULL (no requirement, the default stall time).  out's
 * strings point into v: free out with verdict_result_free() before verdict_free(v).  Returns
 * 0, or -1 when out of memory.
 */
int verdict_compute_with(const struct verdict *v, const struct verdict_options *opt,
                         struct verdict_result *out) TWICE_MUST_CHECK;

/* verdict_compute_with(v, NULL, out). */
int verdict_compute(const struct verdict *v, struct verdict_result *out) TWICE_MUST_CHECK;

void verdict_result_free(struct verdict_result *res);

/*
 * The deliveries of message id as replayed, in journal order, into *out (caller frees) and
 * *n.  Returns 1, 0 when the journal never named id (*out NULL), or -1 when out of memory.
 */
int verdict_message_deliveries(const struct verdict *v, const char *id,
                               struct verdict_delivery **out, size_t *n) TWICE_MUST_CHECK;

/* The effect lines that name message id (saturating), 0 when none does. */
uint32_t verdict_message_effects(const struct verdict *v, const char *id);

/* Calls fn for every message id in the journal, in strcmp order, with its task (or NULL).
 * Stops at and returns fn's first non-zero return; -1 when out of memory. */
int verdict_each_message(const struct verdict *v,
                         int (*fn)(void *ctx, const char *id, const char *task), void *ctx);

/* Frees v and everything it owns.  NULL is a no-op. */
void verdict_free(struct verdict *v);

/*
 * Reads an effects file into v: one message id per line; leading and trailing
 * blanks and a trailing \r are stripped, blank lines and lines starting with
 * '#' are skipped.  Returns 0 (*lines = effect lines read) or -1 with a
 * message in err.
 */
int verdict_load_effects(struct verdict *v, const char *path, uint64_t *lines, char *err,
                         size_t errlen) TWICE_MUST_CHECK;

/* Exit codes of `twice verdict` (docs/journal.md): the first that applies, in this order. */
#define VERDICT_EXIT_ERROR 2          /* usage, an unreadable journal or effects file */
#define VERDICT_EXIT_EFFECTS 3        /* the effects list does not match the journal */
#define VERDICT_EXIT_NOT_IDEMPOTENT 1 /* a task did its side effect twice */
/* the journal is damaged: the verdict stands on part of the run (--allow-damaged accepts it) */
#define VERDICT_EXIT_DAMAGED 6
#define VERDICT_EXIT_UNTESTED 4 /* a task fell short of what --require asked */
#define VERDICT_EXIT_STALLED 5  /* work stopped while messages were outstanding */

/*
 * The `twice verdict JOURNAL --effects E [--json] [--require R]... [--stall-after D]
 * [--allow-damaged]` command, printing to out and diagnostics to err.  argv[0] is the subcommand
 * name.  Returns 0, or one of the VERDICT_EXIT_* codes.
 */
int verdict_run(int argc, char **argv, FILE *out, FILE *err);

#endif
