/*
 * conf.h - the twice configuration file: its model and its parser.
 *
 * One file configures the whole process: globals, `listen NAME { ... }`
 * blocks and `rule NAME on LISTENER { ... }` blocks (rules/rule.h).  The
 * grammar is line oriented like HAProxy's and nginx's:
 *
 *   file      := item*
 *   item      := directive (NEWLINE | ';') | directive '{' item* '}'
 *   directive := WORD arg*
 *   arg       := WORD | STRING
 *
 * `#` starts a comment that runs to the end of the line.  Strings are
 * double-quoted with the escapes \" \\ \n \t.  A directive ends at a newline
 * or `;`; a block directive's arguments end at `{`.  In a rule's `when`, a
 * string glued to the word before it is part of that word's matcher:
 * `body~"refund due"`.
 *
 * Parsing happens in two passes: the text is read into a generic tree of
 * directives (each word with its position), then each known directive is
 * interpreted.  Every problem is collected as a diagnostic with FILE:LINE:COL
 * and, for misspelled keywords, a "did you mean" hint; parsing never stops at
 * the first error.
 *
 * This module is pure: no libevent, no OpenSSL, no sockets.
 */
#ifndef TWICE_CONF_H
#define TWICE_CONF_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/jobs/msg_field.h"

#define CONF_DEFAULT_CONNECT_TIMEOUT_MS 5000u
#define CONF_DEFAULT_GRACE_MS 10000u
/* `journal-flush`: the writer writes what was queued at least this often by default. */
#define CONF_DEFAULT_JOURNAL_FLUSH_MS 1000u
/* Longest `instance NAME` (a host name is at most 64 bytes on Linux). */
#define CONF_INSTANCE_MAX 64
/* Bytes of delayed frames or replies one session may hold per direction. */
#define CONF_DEFAULT_MAX_HELD (64ull * 1024 * 1024)
/* Most event-loop threads `threads N` may ask for. */
#define CONF_MAX_THREADS 64
/* Longest file `conf_parse_stream` reads; a bigger one is a mistake. */
#define CONF_MAX_FILE_BYTES (4u * 1024u * 1024u)
/* Most rules in one file, one PUT /rules, or after a PUT /rules/NAME; the
 * duplicate check is quadratic. */
#define CONF_MAX_RULES 4096

struct conf_loc {
    unsigned line; /* 1-based */
    unsigned col;  /* 1-based, in bytes */
};

enum conf_protocol {
    CONF_PROTO_TCP = 0,
    CONF_PROTO_AMQP,
    CONF_PROTO_RESP,
};

/* `journal PATH MODE`: what twice does at start with a journal file that already holds
 * something (the codes of journal.h's enum journal_mode). */
enum conf_journal_mode {
    CONF_JOURNAL_NEW = 0,   /* refuse to start: a journal is the evidence of a run (default) */
    CONF_JOURNAL_APPEND,    /* add this run after the runs it holds */
    CONF_JOURNAL_OVERWRITE, /* replace it */
};
#define CONF_JOURNAL_MODES 3

enum conf_log_level {
    CONF_LOG_ERROR = 0,
    CONF_LOG_WARN,
    CONF_LOG_INFO,
    CONF_LOG_DEBUG,
};

/* host is a literal IPv4/IPv6 address or a DNS name (upstream only); an
 * IPv6 literal is written "[::1]:5672" in the file and stored without
 * brackets.  port is 1..65535. */
struct conf_addr {
    char *host;
    uint16_t port;
    struct conf_loc loc;
};

/* `tls cert FILE key FILE`: terminate TLS from clients. */
struct conf_tls_server {
    bool enabled;
    char *cert;
    char *key;
    struct conf_loc loc;
};

/* `upstream-tls [verify | no-verify] [ca FILE] [sni NAME] [cert FILE key FILE]`:
 * originate TLS toward the broker.  Verification is on unless `no-verify` is
 * written; the host name checked is `sni` when given, else the upstream
 * host.  Without `ca` the system's default trust store is used. */
struct conf_tls_client {
    bool enabled;
    bool verify;
    char *ca;
    char *sni;
    char *cert;
    char *key;
    struct conf_loc loc;
};

struct conf_listener {
    char *name;
    struct conf_loc loc; /* of the `listen` keyword */
    enum conf_protocol protocol;
    char *profile; /* resp only; NULL when not set */
    struct conf_addr bind;
    struct conf_addr upstream;
    uint32_t connect_timeout_ms; /* the global value when not set here */
    uint32_t idle_timeout_ms;    /* 0: no idle timeout */
    uint32_t max_connections;    /* 0: unlimited */
    uint64_t max_message;        /* `max-message-size`: 0: the protocol's own limit */
    uint64_t max_held;           /* `max-held`: 0: CONF_DEFAULT_MAX_HELD */
    uint32_t visibility_ms;      /* amqp: `visibility-timeout` or `consumer-timeout`; 0: none */
    bool consumer_timeout;       /* the timeout is RabbitMQ's consumer_timeout: the channel
                                    closes with 406, every unacked delivery on it requeued */
    struct conf_tls_server tls;
    struct conf_tls_client upstream_tls;
    /* amqp: `message-id` and `task`, where the app keeps them (n 0: Celery's headers and the
     * message_id / correlation_id properties, as by default) */
    struct msg_fields message_id;
    struct msg_fields task;
    struct conf_listener *next; /* file order */
};

struct rule; /* rules/rule.h */

struct conf {
    char *path;                    /* as given to the parser */
    enum conf_log_level log_level; /* default CONF_LOG_INFO */
    uint32_t connect_timeout_ms;   /* default CONF_DEFAULT_CONNECT_TIMEOUT_MS */
    uint32_t grace_ms;             /* `shutdown-grace`, default CONF_DEFAULT_GRACE_MS */
    uint64_t seed;                 /* `seed N`: the seed of every probabilistic trigger */
    bool has_seed;                 /* false: the proxy picks one and journals it */
    unsigned threads;              /* `threads N`: event loops; 0 (default, `auto`): one per core */
    char *journal;                 /* `journal PATH`; NULL when not set */
    enum conf_journal_mode journal_mode; /* `journal PATH MODE`; default CONF_JOURNAL_NEW */
    /* `journal-flush D | every-record`: write the queued records at least every D (default
     * CONF_DEFAULT_JOURNAL_FLUSH_MS), or each record as it comes */
    uint32_t journal_flush_ms;
    bool journal_every_record;
    struct conf_addr admin; /* `admin HOST:PORT`: the admin HTTP API */
    bool has_admin;
    char *admin_token; /* `admin-token TOKEN`: bearer token; NULL when not set */
    /* `toxiproxy-api HOST:PORT`: Toxiproxy 2.x's HTTP API (docs/toxiproxy.md); the admin
     * API's rule: loopback, or `admin-token`, which it then asks for too */
    struct conf_addr toxiproxy_api;
    bool has_toxiproxy_api;
    char *toxiproxy_config; /* `toxiproxy-config FILE`: Toxiproxy's start-up JSON; NULL: none */
    char *user;             /* `user NAME`: drop root to this user after binding; NULL: stay */
    char *instance;         /* `instance NAME`: journaled in the header; NULL: the host name */
    struct conf_listener *listeners;
    size_t n_listeners;
    struct rule *rules; /* file order; freed with conf_free */
    size_t n_rules;
};

enum conf_severity {
    CONF_ERROR = 0,
    CONF_WARNING,
};

struct conf_diag {
    enum conf_severity severity;
    struct conf_loc loc;
    char *msg;
    char *hint; /* e.g. "did you mean 'upstream'?"; may be NULL */
    struct conf_diag *next;
};

struct conf_diags {
    char *file; /* file name printed before each location */
    struct conf_diag *head;
    struct conf_diag **tail;
    unsigned errors;
    unsigned warnings;
};

/* Parse the text read from stream `f` (opened by the program: rules/ opens
 * no file; proxy/core/conf_file.c's conf_parse_file() does it), at most
 * CONF_MAX_FILE_BYTES; `name` is the file name of diagnostics and
 * conf->path.  On success (no error diagnostics) returns 0 and stores a new
 * configuration in *out, owned by the caller (conf_free).  On failure
 * returns -1, *out is NULL, and `diags` holds every problem found (a read
 * error, a file too large, each mistake in the text).  Warnings may be
 * present either way.  `diags` must be zeroed or conf_diags_init()ed by the
 * caller and freed with conf_diags_free().  `f` is not closed. */
int conf_parse_stream(const char *name, FILE *f, struct conf **out,
                      struct conf_diags *diags) TWICE_MUST_CHECK;

/* Records that `path` could not be opened (errno value `err`) in `diags`, as
 * the one error of that file.  Returns -1. */
int conf_cannot_open(const char *path, int err, struct conf_diags *diags);

/* Same as conf_parse_stream over an in-memory text. */
int conf_parse_string(const char *name, const char *text, size_t len, struct conf **out,
                      struct conf_diags *diags) TWICE_MUST_CHECK;

/* Parse a text made only of `rule` blocks and comments (the body of the
 * admin API's PUT /rules).  Listener names and what each listener's protocol
 * can do are checked against `base`, which is only read.  On success returns
 * 0 and stores a new list of *n_out rules in *out (NULL when the text has
 * none), owned by the caller (rule_list_free).  On failure returns -1, *out
 * is NULL, *n_out is 0 and `diags` says why; `name` is the file name shown in
 * diagnostics. */
int conf_parse_rules(const char *name, const char *text, size_t len, const struct conf *base,
                     struct rule **out, size_t *n_out, struct conf_diags *diags) TWICE_MUST_CHECK;

/* Free a configuration and everything it owns, rules included.  NULL is fine. */
void conf_free(struct conf *conf);

/* Free a list of rules linked by `next` (from conf_parse_rules).  NULL is fine. */
void rule_list_free(struct rule *r);

/* A deep copy of rule `r` alone (its `next` NULL), owned by the caller
 * (rule_list_free), or NULL when out of memory. */
struct rule *rule_copy(const struct rule *r) TWICE_MUST_CHECK;

void conf_diags_init(struct conf_diags *diags);
void conf_diags_free(struct conf_diags *diags);

/* Append a diagnostic (used by later passes, e.g. TLS file checks in proxy/).
 * `hint` may be NULL. */
void conf_diag_add(struct conf_diags *diags, enum conf_severity sev, struct conf_loc loc,
                   const char *hint, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Print every diagnostic, one per line, in file order:
 *   FILE:LINE:COL: error: MESSAGE (did you mean 'x'?)
 *   FILE:LINE:COL: warning: MESSAGE */
void conf_diags_print(const struct conf_diags *diags, FILE *out);

const char *conf_protocol_name(enum conf_protocol p);
const char *conf_log_level_name(enum conf_log_level l);

/* "new", "append", "overwrite": the words of `journal PATH MODE` and `--journal-mode`. */
extern const char *const conf_journal_mode_names[CONF_JOURNAL_MODES];
/* The mode named `word`: 0 and *mode, or -1. */
int conf_journal_mode_parse(const char *word, enum conf_journal_mode *mode);

/* "host:port" with IPv6 literals bracketed; writes at most `size` bytes. */
void conf_addr_format(const struct conf_addr *a, char *buf, size_t size);

/* Whether two bind addresses cannot both listen on Linux: the same port, and
 * the same address or one of them a wildcard that takes the other's (0.0.0.0
 * every IPv4 address, [::] every address, IPv4 too: net.ipv6.bindv6only=0).
 * False when either host is not a literal. */
bool conf_binds_clash(const struct conf_addr *a, const struct conf_addr *b);

/* Whether a connection to the literal address `host` (canonical, as stored
 * in a conf_addr) and `port` reaches a socket bound to `bind`: the same port,
 * and the same address, or `bind` a wildcard that takes `host`'s family while
 * `host` is an address of this host (loopback always is; `here` says so of
 * any other).  A connect() to 0.0.0.0 or :: goes to loopback.  False when
 * either host is not a literal. */
bool conf_bind_takes(const struct conf_addr *bind, const char *host, uint16_t port, bool here);

/* Find a listener by name, or NULL. */
const struct conf_listener *conf_find_listener(const struct conf *conf, const char *name);

#endif
