/*
 * rule.h - fault rules as written in the configuration file.
 *
 *   rule NAME on LISTENER {
 *     when EVENT MATCHER...        # which protocol events the rule looks at
 *     TRIGGER...                   # which of those it acts on
 *     do ACTION ARGS...            # what it does to them
 *     stream DIRECTION             # for stream actions: upstream|downstream|both
 *   }
 *
 * This header is the parsed form (the parser fills it, the engine reads it);
 * rules/engine.h holds the runtime state.  Codes in the X-macro lists are
 * stable: the journal stores them, so they are append-only.
 */
#ifndef TWICE_RULE_H
#define TWICE_RULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rules/conf.h"

/* Protocol events a rule can look at.  STREAM is a rule with no `when`:
 * it applies to every connection of the listener (stream actions). */
#define RULE_EVENTS(X)                                                                             \
    X(STREAM, 0, "stream")                                                                         \
    X(CONNECT, 1, "connect")                                                                       \
    X(DELIVER, 2, "deliver")                                                                       \
    X(ACK, 3, "ack")                                                                               \
    X(NACK, 4, "nack")                                                                             \
    X(PUBLISH, 5, "publish")                                                                       \
    X(CONFIRM, 6, "confirm")                                                                       \
    X(COMMAND, 7, "command")                                                                       \
    X(LEASE, 8, "lease")

enum rule_event {
#define RULE_EVENT_ENUM(name, code, str) RULE_EV_##name = code,
    RULE_EVENTS(RULE_EVENT_ENUM)
#undef RULE_EVENT_ENUM
        RULE_EV_COUNT
};

/* What a matcher compares. */
#define RULE_FIELDS(X)                                                                             \
    X(QUEUE, 0, "queue")                                                                           \
    X(EXCHANGE, 1, "exchange")                                                                     \
    X(ROUTING_KEY, 2, "routing_key")                                                               \
    X(CONSUMER_TAG, 3, "consumer_tag")                                                             \
    X(MESSAGE_ID, 4, "message_id")                                                                 \
    X(TASK, 5, "task")                                                                             \
    X(HEADER, 6, "header")                                                                         \
    X(BODY, 7, "body")                                                                             \
    X(CLIENT, 8, "client")                                                                         \
    X(REDELIVERED, 9, "redelivered")                                                               \
    X(COMMAND, 10, "command")                                                                      \
    X(KEY, 11, "key")

enum rule_field {
#define RULE_FIELD_ENUM(name, code, str) RULE_F_##name = code,
    RULE_FIELDS(RULE_FIELD_ENUM)
#undef RULE_FIELD_ENUM
        RULE_F_COUNT
};

/* Actions.  The first group acts on one protocol event; the second group
 * (stream actions) acts on a connection's byte stream. */
#define RULE_ACTIONS(X)                                                                            \
    X(REDELIVER, 0, "redeliver")                                                                   \
    X(DUPLICATE, 1, "duplicate")                                                                   \
    X(EXPIRE, 2, "expire")                                                                         \
    X(DELAY, 3, "delay")                                                                           \
    X(DROP, 4, "drop")                                                                             \
    X(CLOSE, 5, "close")                                                                           \
    X(ERROR, 6, "error")                                                                           \
    X(LATENCY, 7, "latency")                                                                       \
    X(BANDWIDTH, 8, "bandwidth")                                                                   \
    X(SLICE, 9, "slice")                                                                           \
    X(RESET, 10, "reset")                                                                          \
    X(BLACKHOLE, 11, "blackhole")                                                                  \
    X(SLOW_CLOSE, 12, "slow-close")                                                                \
    X(LIMIT, 13, "limit")

enum rule_action_kind {
#define RULE_ACTION_ENUM(name, code, str) RULE_ACT_##name = code,
    RULE_ACTIONS(RULE_ACTION_ENUM)
#undef RULE_ACTION_ENUM
        RULE_ACT_COUNT
};

/* Whether rule `earlier`, written before `later`, may fault events `later` would otherwise
 * act on: the same listener and message or command event (one rule acts on each: the first
 * that fires), matchers and `between` windows that do not exclude each other
 * (rules/rule_overlap.c). */
bool rule_takes_before(const struct rule *earlier, const struct rule *later);

/* A rule as text, as a rule file would write it (rules/rule_text.c).  Each writes at most cap
 * bytes into buf, NUL included, cutting what does not fit. */
/* A duration: "3s", "1m", "250ms"; returns buf. */
const char *rule_ms_text(uint32_t ms, char *buf, size_t cap);
/* A probability as a percentage: 0.05 is "5%", 1 is "100%"; returns buf. */
const char *rule_probability_text(double p, char *buf, size_t cap);
/* The matchers of `when`: "queue=celery task!=x body~\"refund due\"", "" without any;
 * returns the length written. */
size_t rule_matchers_text(const struct rule *r, char *buf, size_t cap);
/* The triggers in the order the engine checks them: "every 10, probability 5%"; "" without
 * any (max-per-message is shown when it is not 1); returns the length written. */
size_t rule_triggers_text(const struct rule *r, char *buf, size_t cap);
/* The action and its arguments as the log's and the admin API's `detail` gives them: "latency
 * 100ms jitter 10ms downstream", "close before", "redeliver after 5000ms"; returns the length
 * written. */
size_t rule_action_text(const struct rule *r, char *buf, size_t cap);

/* True for latency, bandwidth, slice, reset, blackhole, slow-close, limit. */
bool rule_action_is_stream(enum rule_action_kind k);

const char *rule_event_name(enum rule_event e);
const char *rule_field_name(enum rule_field f);
const char *rule_action_name(enum rule_action_kind k);

enum rule_match_op {
    RULE_OP_EQ = 0,   /* field=value; value may contain * and ? globs */
    RULE_OP_NE,       /* field!=value */
    RULE_OP_CONTAINS, /* field~value (substring), e.g. body~"refund" */
};

struct rule_matcher {
    enum rule_field field;
    enum rule_match_op op;
    char *header; /* header name for RULE_F_HEADER (header.NAME), else NULL */
    char *value;  /* as written, unquoted */
    bool is_glob; /* value contains * or ? */
    /* RULE_F_CLIENT: address/prefix (IPv4 mapped into IPv6). */
    uint8_t cidr_addr[16];
    uint8_t cidr_prefix; /* 0..128 */
    /* RULE_F_REDELIVERED */
    bool bool_value;
    struct conf_loc loc;
};

/* Triggers: which of the matching events the rule acts on.  Counting
 * triggers (every, nth, first, after) count matching events per rule over
 * the whole process; `between` is a window since start; `limit` caps the
 * faults the rule injects; `max-per-message` caps the faults per message
 * identity (default 1). */
struct rule_trigger {
    bool has_probability;
    double probability; /* 0 < p <= 1 */
    uint64_t every;     /* 0: unset */
    uint64_t nth;       /* 0: unset */
    uint64_t first;     /* 0: unset */
    uint64_t after;     /* 0: unset */
    bool has_between;
    uint32_t between_start_ms;
    uint32_t between_end_ms;
    uint64_t limit;           /* 0: unlimited */
    uint32_t max_per_message; /* default 1 */
};

enum rule_close_when {
    RULE_CLOSE_BEFORE = 0,
    RULE_CLOSE_AFTER,
};

struct rule_action {
    enum rule_action_kind kind;
    uint32_t duration_ms;    /* delay, expire, latency, slow-close; `after` of reset,
                              * redeliver, duplicate (0: none) */
    uint32_t jitter_ms;      /* latency */
    uint64_t bytes;          /* bandwidth: bytes per second; slice: size; limit: bytes */
    uint32_t slice_delay_ms; /* slice: pause between slices (default 0) */
    enum rule_close_when close_when;
    char *error_code;    /* error: "406", "320", "READONLY", ... as written */
    struct conf_loc loc; /* of the action word */
};

enum rule_direction {
    RULE_DIR_UPSTREAM = 1,   /* client -> broker */
    RULE_DIR_DOWNSTREAM = 2, /* broker -> client */
    RULE_DIR_BOTH = 3,
};

struct rule {
    char *name;
    char *listener;      /* name as written */
    struct conf_loc loc; /* of the `rule` keyword */
    enum rule_event event;
    struct rule_matcher *matchers;
    size_t n_matchers;
    struct rule_trigger trigger;
    struct rule_action action;
    enum rule_direction direction; /* stream actions; default both */
    bool enabled;                  /* `disabled` in the block makes it start off */
    struct rule *next;             /* file order */
};

#endif
