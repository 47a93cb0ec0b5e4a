/*
 * job.h - the seam between a job framework's module (proto/jobs/<framework>.c) and the session
 * that hosts it: the proxy's RESP hook, or a unit test's fake.
 *
 * A framework module knows what the framework's commands and replies mean and what the
 * framework would answer or do after a fault.  It reads a command or a reply, reports each job
 * event in it to its host (struct job_host: the host journals it and asks the rules), and turns
 * the fault the host answers (struct job_fault) into a plan of bytes and commands
 * (proto/resp/resp_plan.h) that the host carries out.  What it must remember of a job across
 * connections (a delivery's task for the ack that comes on another connection, a lease it made
 * lapse) it keeps in the host's job memory.  It opens nothing, sends nothing and reads no clock:
 * everything it does is in the plan, so that a test can check it whole.
 *
 * Layers: proto/ knows no rule.  rules/plan.h turns the rule that fired into a struct job_fault;
 * the host names the rule to the module only as an opaque pointer, which comes back in a plan
 * that cuts the connection.
 */
#ifndef TWICE_JOBS_JOB_H
#define TWICE_JOBS_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/jobs/msg_field.h"

/* The events a module reports: the rules' `publish`, `deliver`, `ack`, `nack`, `lease`. */
enum job_ev {
    JOB_EV_PUBLISH,
    JOB_EV_DELIVER,
    JOB_EV_ACK,
    JOB_EV_NACK,
    JOB_EV_LEASE,
    JOB_EV_COUNT,
};

/* The journal records a module asks for (journal.proto's kinds of the same names). */
enum job_rec {
    JOB_REC_PUBLISH,
    JOB_REC_DELIVER,
    JOB_REC_ACK,
    JOB_REC_NACK,
    JOB_REC_RUNNING,
};

/* One job event.  Strings are NUL-terminated and live for the call they are passed to; NULL
 * when not known. */
struct job_event {
    enum job_ev kind;
    const char *id;
    const char *task;
    const char *queue;
    const char *key;          /* the Redis key the rules' `key` matcher sees */
    bool redelivered;         /* the framework marks it handed out again */
    unsigned retries;         /* the app's retries of it before */
    bool retry;               /* a publish of a job the app ran before */
    bool refused;             /* ACK, NACK: the framework refused the settlement */
    bool kept_back;           /* ACK, NACK: a rule kept it from the broker */
    uint64_t started_unix_us; /* RUNNING: the run started no later than this */
    const char *run;          /* RUNNING: which run of the job */
};

/* What a rule asks of an event, in the module's terms (rules/plan.h makes it from a rule). */
enum job_fault_kind {
    JOB_FAULT_NONE,      /* no rule fired: the framework's own course */
    JOB_FAULT_DROP,      /* the message or settlement is lost */
    JOB_FAULT_DELAY,     /* it arrives ms late */
    JOB_FAULT_REDELIVER, /* a settlement lost so that the message comes back (ms: that late) */
    JOB_FAULT_DUPLICATE, /* a second copy (ms: that much after the first) */
    JOB_FAULT_CLOSE,     /* the connection is cut before or after the frame */
    JOB_FAULT_ERROR,     /* the broker refuses it (AMQP: a channel.close with .code) */
    JOB_FAULT_EXPIRE,    /* its visibility timeout runs out ms after the delivery unless acked */
    JOB_FAULT_OTHER,     /* an action this event does not take here: nothing is done */
};

struct job_fault {
    enum job_fault_kind kind;
    uint32_t ms;
    bool before;      /* JOB_FAULT_CLOSE: before the frame reaches its peer */
    uint16_t code;    /* JOB_FAULT_ERROR: the AMQP reply code the rule names (406 when it names
                         none or no number in 200..599); 0 for other faults */
    const void *rule; /* the host's handle of the rule; NULL for JOB_FAULT_NONE */
};

/* What the listener remembers of one job across its connections (the host's job memory).
 * Strings are owned by the memory: set them with job_memo_set(). */
struct job_memo {
    char *task;
    char *queue;
    char *id;          /* the message id when the key is another handle (a Celery tag); a
                          BullMQ job's lock token whose renewals are lost (JOB_MEMO_LEASE_LOST) */
    uint32_t flags;    /* JOB_MEMO_* */
    uint32_t lease_ms; /* JOB_MEMO_LEASE_LATE */
    uint32_t pending;  /* a Celery tag's deliveries not settled yet */
    uint64_t gen;      /* unique per entry made: tells a re-made entry from one read earlier */
};

enum {
    JOB_MEMO_SUPPRESS_ACK = 1u << 0, /* a `duplicate` on a stream entry: swallow its next XACK */
    JOB_MEMO_POP_HEAD = 1u << 1,     /* a processing list fed from its queue's head */
    JOB_MEMO_LEASE_LOST = 1u << 2,   /* renewals by the token in .id answered, never applied */
    JOB_MEMO_LEASE_LATE = 1u << 3,   /* ... answered, and applied .lease_ms later */
};

/* Replaces *dst by a copy of src[0..len) (NULL src: frees; a failed copy leaves NULL). */
void job_memo_set(char **dst, const char *src, size_t len);

enum job_log_level { JOB_LOG_INFO, JOB_LOG_WARN };

/*
 * The host of a module: what the module may ask of the session it runs in.  Every function
 * gets `ctx`.  The memory's functions are called between memo_lock and memo_unlock only (other
 * sessions share it), and no other host function is called while it is held.
 */
struct job_host {
    void *ctx;
    uint64_t session; /* the session's id, for ids twice makes */
    bool journal;     /* records are kept */
    bool needed;      /* something reads jobs (the journal, a rule on job events): without it a
                         module only counts its events and decodes nothing */
    uint8_t resp;     /* the connection's RESP version, 2 or 3 (HELLO) */
    void *state;      /* the module's own state for this session (struct resp_framework's
                         open), or NULL */
    /* The listener's `message-id` and `task` sources (docs/any-app.md); NULL: none set. */
    const struct msg_fields *ids;
    const struct msg_fields *tasks;
    /* A rule of the listener looks at events of kind k. */
    bool (*wants)(void *ctx, enum job_ev k);
    /* The event counted (/stats) without a decision. */
    void (*count)(void *ctx, enum job_ev k);
    /* The fault the first rule that fires on ev asks for (the event counted; the fault noted
     * as one, in the log and the journal), JOB_FAULT_NONE when none fires. */
    struct job_fault (*decide)(void *ctx, const struct job_event *ev);
    /* The same, the fault not noted: the module notes it with note() once it knows the id the
     * fault's record must carry (one twice makes for a job it keeps from the broker). */
    struct job_fault (*decide_unnoted)(void *ctx, const struct job_event *ev);
    void (*note)(void *ctx, const struct job_fault *f, const struct job_event *ev);
    /* Journals ev as a record of kind rec (nothing without a journal). */
    void (*record)(void *ctx, enum job_rec rec, const struct job_event *ev);
    /* A line in the log: msg, and `fields` (logfmt, the session's id and listener added). */
    void (*log)(void *ctx, enum job_log_level level, const char *msg, const char *fields);
    /* A number unique in the session, for the ids twice makes. */
    uint64_t (*next_seq)(void *ctx);
    /* A field longer than its limit (cap, NUL included) was not read: logged once a session. */
    void (*too_long)(void *ctx, const char *field, uint64_t len, size_t cap);
    /* n random bytes (a delivery tag as a framework draws one); false when there are none. */
    bool (*random)(void *ctx, void *buf, size_t n);
    /* The wall clock in milliseconds (an id as Redis makes one). */
    uint64_t (*wall_ms)(void *ctx);
    /* The job memory of the listener, keyed by bytes. */
    void (*memo_lock)(void *ctx);
    void (*memo_unlock)(void *ctx);
    struct job_memo *(*memo_get)(void *ctx, const char *key, size_t n);
    struct job_memo *(*memo_put)(void *ctx, const char *key, size_t n); /* NULL: out of memory */
    void (*memo_del)(void *ctx, const char *key, size_t n);
    /* Scripts the session saw by their bodies (EVAL, SCRIPT LOAD): a module names a body it
     * knows with a tag; an EVALSHA's sha (40 hex digits, either case) finds it again.  0 when
     * the sha is unknown. */
    void (*script_learn)(void *ctx, const uint8_t *body, size_t n, unsigned tag);
    unsigned (*script_tag)(void *ctx, const uint8_t *sha, size_t n);
};

#endif
