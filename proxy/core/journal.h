/*
 * journal.h - the running proxy's journal writer.
 *
 * The event loops (one per thread) call journal_record() for every delivery,
 * ack, publish, fault, connect and close.  That call never touches the disk:
 * it encodes the record (proto/journal/journal.proto, length-delimited), appends it to
 * an in-memory buffer under a mutex (a copy: the only shared step) and
 * returns.  A writer thread swaps the buffer out and writes
 * it with write(2) at least every JOURNAL_FLUSH_INTERVAL_MS (or the interval
 * journal_open_with() was given), and sooner when it passes
 * JOURNAL_FLUSH_BYTES.  A kill of the process loses what was still queued.
 * With `every_record` (`journal-flush every-record`), journal_record() writes
 * its record itself, under the mutex, before it returns: a kill loses
 * nothing journal_record() returned from, and each record costs the caller a
 * write(2).  When the disk cannot keep up and the buffer
 * reaches JOURNAL_BUFFER_CAP, new records are dropped and counted
 * (journal_dropped()); a write error is logged once, and every record after
 * it is dropped and counted too.  Nothing here ever aborts the proxy.
 */
#ifndef TWICE_JOURNAL_H
#define TWICE_JOURNAL_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The writer thread writes at least this often... */
#define JOURNAL_FLUSH_INTERVAL_MS 1000u
/* ...and as soon as this many bytes are waiting. */
#define JOURNAL_FLUSH_BYTES (1024u * 1024u)
/* Bytes buffered while the disk is slow before records are dropped. */
#define JOURNAL_BUFFER_CAP (64u * 1024u * 1024u)
/* A string field longer than this is cut (at a UTF-8 character boundary). */
#define JOURNAL_FIELD_MAX 4096u

/* Record kinds: the codes of journal.proto's Record.Kind (stable, append only). */
enum journal_kind {
    JOURNAL_KIND_CONNECT = 1,
    JOURNAL_KIND_CLOSE = 2,
    JOURNAL_KIND_DELIVER = 3,
    JOURNAL_KIND_ACK = 4,
    JOURNAL_KIND_NACK = 5,
    JOURNAL_KIND_PUBLISH = 6,
    JOURNAL_KIND_CONFIRM = 7,
    JOURNAL_KIND_FAULT = 8,
    JOURNAL_KIND_COMMAND = 9,
    JOURNAL_KIND_RUNNING = 10,
    JOURNAL_KIND_STOP = 11,
    JOURNAL_KIND_EXPIRED = 12,
    JOURNAL_KIND_RULES = 13,
};

/* RULES: what changed, and who made the change (journal.proto's Record.Change and
 * Record.ChangeSource; stable, append only). */
enum journal_change {
    JOURNAL_CHANGE_RULE_ENABLED = 1,
    JOURNAL_CHANGE_RULE_DISABLED = 2,
    JOURNAL_CHANGE_FAULTS_OFF = 3,
    JOURNAL_CHANGE_FAULTS_ON = 4,
    JOURNAL_CHANGE_RULES_REPLACED = 5,
    JOURNAL_CHANGE_RULE_REPLACED = 6,
    JOURNAL_CHANGE_RULE_ADDED = 7,
    JOURNAL_CHANGE_RULE_DELETED = 8,
    JOURNAL_CHANGE_RELOADED = 9,
};
enum journal_change_source {
    JOURNAL_SOURCE_ADMIN_API = 1,
    JOURNAL_SOURCE_SIGNAL = 2,
};

/* A change of the rules in force, as journal_rules_changed() records it: what changed, how,
 * and the rules after it.  Strings are borrowed for the call. */
struct journal_rules_change {
    uint64_t time_unix_us; /* 0: the writer stamps the current time */
    enum journal_change change;
    enum journal_change_source source;
    const char *rule;         /* a change of one rule (RULE_*): its name; else NULL */
    const char *client;       /* ADMIN_API: the client's "ip:port"; else NULL */
    const char *detail;       /* the request ("POST /reload") or the signal ("SIGHUP") */
    uint8_t rules_sha256[32]; /* names the rules in force (journal.proto, rules_sha256) */
    uint32_t rules;           /* rules in force after the change */
    uint32_t rules_disabled;  /* of those, switched off */
    bool faults_off;          /* the kill switch is on after it */
};

/* What journal_open() writes in the header. */
struct journal_header_info {
    uint64_t seed;             /* the trigger RNG seed */
    uint8_t config_sha256[32]; /* digest of the configuration file */
    const char *config_path;   /* may be NULL; copied */
    const char *instance;      /* `instance NAME` or the host name; may be NULL; copied */
    uint64_t start_unix_ms;    /* 0: now */
    /* The configuration's listeners (journal.proto's Listener): names, protocol and profile
     * names, borrowed for the duration of journal_open() */
    const char *const *listener_names;
    const char *const *listener_protocols;
    const char *const *listener_profiles; /* NULL entries: no profile */
    /* Per listener, or NULL for none: its visibility or consumer timeout in ms (0: none), and
     * whether it is a consumer timeout. */
    const uint32_t *listener_visibility_ms;
    const bool *listener_consumer_timeout;
    size_t n_listeners;
};

/*
 * One record, as the event loop knows it.  Fields that do not apply stay 0 /
 * NULL.  Strings are borrowed for the duration of journal_record() only.
 * Strings that are not valid UTF-8 (proto3 `string` must be) are written with
 * each invalid byte replaced by '?'.
 */
struct journal_record {
    enum journal_kind kind;
    uint64_t time_unix_us; /* 0: the writer stamps the current time */
    uint64_t session;      /* session id */
    const char *listener;
    const char *queue;
    const char *task;
    const char *message_id;
    uint64_t delivery_tag;
    bool redelivered;
    const char *rule;              /* FAULT: rule name */
    uint32_t action;               /* FAULT: enum rule_action_kind */
    const char *action_name;       /* FAULT: rule_action_name(action) */
    uint32_t event;                /* FAULT: enum rule_event */
    const char *client;            /* "ip:port" */
    uint32_t close_reason;         /* CLOSE: enum session_close_reason */
    const char *close_reason_name; /* CLOSE: session_close_reason_name() */
    uint64_t bytes_up;             /* CLOSE: client -> broker */
    uint64_t bytes_down;           /* CLOSE: broker -> client */
    const char *detail;            /* free text, e.g. "delay 45000ms" */
    uint32_t retries;              /* DELIVER, PUBLISH: the app's retries before (journal.proto) */
    bool retry;   /* PUBLISH: the app put a message it ran back; NACK: requeue asked for */
    bool refused; /* ACK, NACK: the framework refused the settlement (journal.proto) */
    uint64_t started_unix_us; /* RUNNING: the run started no later than this; 0: not said */
    const char *run;          /* RUNNING: which run of the message (journal.proto) */
    bool kept_back;           /* ACK, NACK: a rule kept it from the broker (journal.proto) */
    bool auto_ack;            /* DELIVER: taken without an ack (journal.proto) */
};

struct journal;

/* When records reach the file (`journal-flush`). */
struct journal_flush {
    uint32_t interval_ms; /* what was queued is written at least this often; 0: the default */
    bool every_record;    /* each record is written before journal_record() returns */
};

/* What journal_open_mode() does with a file that already holds bytes (`journal PATH MODE`).
 * A journal is the evidence of a run: none is destroyed unless asked. */
enum journal_mode {
    JOURNAL_MODE_NEW = 0,   /* refuse it, leaving it as it was (the default) */
    JOURNAL_MODE_APPEND,    /* add this run after the runs it holds */
    JOURNAL_MODE_OVERWRITE, /* empty it first */
};

/* What journal_open_mode() found at the path. */
struct journal_found {
    uint64_t bytes;         /* the file's size before (0: new, empty, or not a regular file) */
    uint64_t start_unix_ms; /* the start of its first run, from its header; 0: none reads */
    uint64_t cut_short;     /* APPEND: bytes of a last entry cut short (a writer killed inside a
                               write), cut off before the new run */
    bool refused;           /* NEW: it holds bytes, so nothing was opened */
};

/*
 * Opens the journal at path, creating it when it does not exist, as `mode` says when it holds
 * bytes, writes this run's header and starts the writer thread.  The file is locked (flock)
 * while open: a second twice on it is refused.  APPEND refuses a file that is not a journal
 * with checksums of this format (journal_reader.h), and cuts off a last entry cut short first
 * (journal_tail_cut_short()).  Returns the journal, owned by the caller until journal_close(),
 * or NULL with a message in err that names the path.  found (may be NULL) says what was there.
 * Blocks on the disk: call it at startup, not from the event loop.  journal_open() is NEW and
 * flushes every JOURNAL_FLUSH_INTERVAL_MS; journal_open_with() is NEW and flushes as `flush`
 * says.
 */
struct journal *journal_open(const char *path, const struct journal_header_info *hdr, char *err,
                             size_t errlen) TWICE_MUST_CHECK;
struct journal *journal_open_with(const char *path, const struct journal_header_info *hdr,
                                  const struct journal_flush *flush, char *err,
                                  size_t errlen) TWICE_MUST_CHECK;
struct journal *journal_open_mode(const char *path, const struct journal_header_info *hdr,
                                  const struct journal_flush *flush, enum journal_mode mode,
                                  struct journal_found *found, char *err,
                                  size_t errlen) TWICE_MUST_CHECK;

/*
 * Queues one record; thread-safe, never blocks on the disk (except with
 * every_record: it writes the record).  Copies what it needs from r before
 * returning.  A record that does not fit (buffer at JOURNAL_BUFFER_CAP, an
 * earlier write error, out of memory) is dropped and counted.  j may be NULL
 * (no journal configured): nothing happens.
 */
void journal_record(struct journal *j, const struct journal_record *r);

/*
 * Queues a RULES record saying that the rules in force changed as c says (an admin request, a
 * signal), like journal_record().  j may be NULL: nothing happens.
 */
void journal_rules_changed(struct journal *j, const struct journal_rules_change *c);

/* The flushing j was opened with (interval_ms never 0); j not NULL. */
struct journal_flush journal_flush_of(const struct journal *j);

/* Records queued so far (written or waiting to be written). */
uint64_t journal_records(const struct journal *j);

/* Records dropped so far (buffer full, write error, out of memory). */
uint64_t journal_dropped(const struct journal *j);

/*
 * Writes everything queued, stops the writer thread, syncs and closes the
 * file, and frees j.  NULL is a no-op.  Records queued concurrently with
 * journal_close() are a caller bug.
 */
void journal_close(struct journal *j);

#endif
