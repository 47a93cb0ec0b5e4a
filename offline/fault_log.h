/*
 * fault_log.h - when each fault happened, per rule and per message: what the `--html` pages
 * and `--format markdown` need beyond the counters of the report and the verdict (faults per
 * rule over time, the faults on an example message's timeline, the rules in force).
 *
 * Fed in journal order with every header and record, next to the report's or verdict's own
 * accumulator; only the commands asked for a page or markdown keep one.  Per fault it keeps a
 * time (8 bytes) and, per faulted message, up to FAULT_LOG_PER_MESSAGE of them.
 */
#ifndef TWICE_FAULT_LOG_H
#define TWICE_FAULT_LOG_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "offline/strmap.h"
#include "proto/journal/journal.pb-c.h"
#include "rules/rule.h"

/* Faults of one message kept for its timeline; later ones are only counted. */
#define FAULT_LOG_PER_MESSAGE 64
/* Event slots of a rule: enum rule_event codes, then one for codes a newer writer added. */
#define FAULT_LOG_EVENTS (RULE_EV_COUNT + 1)

/* One rule that injected faults. */
struct fault_log_rule {
    const char *name; /* the map's key ("(none)" for a fault without a rule) */
    char *action;     /* owned; the first fault's action name */
    uint64_t count;   /* its faults */
    uint64_t *times;  /* owned: each fault's time, journal order */
    size_t cap;       /* of times (count of them used) */
    uint64_t by_event[FAULT_LOG_EVENTS];
};

/* One fault of a message. */
struct fault_log_fault {
    uint64_t time_us;
    const struct fault_log_rule *rule;
    uint32_t event;
};

/* The faults of one message. */
struct fault_log_msg {
    struct fault_log_fault *list; /* owned */
    size_t n, cap;
    uint64_t more; /* past FAULT_LOG_PER_MESSAGE */
};

struct fault_log {
    struct strmap rules;    /* name -> struct fault_log_rule * (owned) */
    struct strmap messages; /* id -> struct fault_log_msg * (owned) */
    uint64_t start_us;      /* the first run's start (its header) */
    uint64_t last_us;       /* the latest record's time */
    uint64_t faults;
};

/* An empty log (same as zeroing it). */
void fault_log_init(struct fault_log *f);

/* A run's header: the first one's start is the axis' zero. */
void fault_log_add_header(struct fault_log *f, const Twice__Journal__Header *h);

/* Accounts one record (only FAULT records are kept; every record's time counts).  0, or -1
 * when out of memory. */
int fault_log_add_record(struct fault_log *f, const Twice__Journal__Record *r) TWICE_MUST_CHECK;

/* The rules by name, into a new array (caller frees) of *n; NULL with *n 0 when there is none
 * or out of memory (*n then SIZE_MAX). */
const struct fault_log_rule **fault_log_rules(const struct fault_log *f, size_t *n);

/* The faults of message id, or NULL when it had none. */
const struct fault_log_msg *fault_log_message(const struct fault_log *f, const char *id);

/* An event code's name ("deliver", "ack", ...; "other" past the known ones). */
const char *fault_log_event_name(uint32_t event);

/* A rule's faults by event: "deliver 3, ack 2" (plain ASCII, fit for HTML and markdown). */
void fault_log_write_events(FILE *out, const struct fault_log_rule *r);

void fault_log_free(struct fault_log *f);

#endif
