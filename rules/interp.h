/*
 * interp.h - pass 2 of the parser: giving the directive tree its meaning.
 *
 * conf.c interprets the top level, listen.c the inside of `listen` blocks,
 * tls_opts.c the option lists of `tls` and `upstream-tls`, values.c the
 * typed arguments (durations, addresses, names).  All report problems to the
 * parser's diagnostic list and keep going; an allocation failure is recorded
 * once as "out of memory" and makes the parse fail.
 *
 * Internal to rules/.
 */
#ifndef TWICE_RULES_INTERP_H
#define TWICE_RULES_INTERP_H

#include "proto/base/must_check.h"

#include "rules/conf.h"
#include "rules/tree.h"

/* Names of listeners and rules: 1 to CONF_NAME_MAX of [A-Za-z0-9_.-]. */
#define CONF_NAME_MAX 64
/* Whether c may be in such a name: [A-Za-z0-9_.-], spelled out so that the locale does not
 * matter. */
bool conf_is_name_byte(char c);
/* Most listeners in one file; the duplicate checks are quadratic. */
#define CONF_MAX_LISTENERS 1024
/* Longest duration any directive accepts: 24 hours. */
#define CONF_MAX_DURATION_MS (24u * 60u * 60u * 1000u)
/* Highest `max-connections`. */
#define CONF_MAX_CONNECTIONS 1000000u
/* Longest DNS name, and the size of a buffer holding any host. */
#define CONF_DNS_NAME_MAX 253
#define CONF_HOST_BYTES (CONF_DNS_NAME_MAX + 1)
/* Longest label of a DNS name. */
#define CONF_DNS_LABEL_MAX 63

struct conf_parser {
    struct conf *conf; /* NULL in conf_parse_rules: only rules are read */
    struct conf_diags *diags;
    bool oom;
    unsigned n_listen;                     /* `listen` directives seen, valid or not */
    struct conf_listener **listeners_tail; /* where the next listener is linked */
    const struct conf *base;               /* the listeners rules refer to */
    struct rule *rules;                    /* rules read so far, file order; owned */
    struct rule **rules_tail;              /* where the next rule is linked */
    size_t n_rules;
};

/* What a directive looks like before it is interpreted. */
struct conf_dirspec {
    const char *name;
    int n_args;        /* exact argument count, or -1 when the handler checks */
    const char *usage; /* the arguments, as in "'bind' takes one argument: HOST:PORT" */
};

/* Keywords of each scope, for hints about a directive in the wrong place. */
extern const char *const conf_global_keywords[];
extern const size_t conf_n_global_keywords;
extern const char *const conf_listen_keywords[];
extern const size_t conf_n_listen_keywords;

/* Record "out of memory" once and make the parse fail. */
void conf_parser_oom(struct conf_parser *p);

/* A copy of `s` owned by the caller, or NULL after conf_parser_oom(). */
char *conf_parser_strdup(struct conf_parser *p, const char *s) TWICE_MUST_CHECK;

/* Check a block-less directive against `spec`: a block given to it is an
 * error (interpretation goes on), a wrong argument count is an error that
 * stops it.  Returns whether the arguments may be interpreted. */
bool conf_check_shape(struct conf_parser *p, const struct conf_node *n,
                      const struct conf_dirspec *spec) TWICE_MUST_CHECK;

/* Check that a single-valued directive is not repeated in its block.
 * `first` (line 0 when unset) is where it was first set; updated.  Returns
 * false after reporting a duplicate. */
bool conf_check_duplicate(struct conf_parser *p, const struct conf_node *n,
                          struct conf_loc *first) TWICE_MUST_CHECK;

/* Report an unknown directive `n` in a scope whose keywords are `known`;
 * when it is a keyword of the other scope, `elsewhere` (a format with one
 * %s for the keyword) is the hint, else a "did you mean" over `known`. */
void conf_unknown_directive(struct conf_parser *p, const struct conf_node *n,
                            const char *const *known, size_t n_known, const char *const *other,
                            size_t n_other, const char *elsewhere);

/* Typed arguments.  Each reports its own error at the word and returns false
 * (or -1), leaving its output untouched.  Since the error is already
 * reported, callers that only store the value may ignore the result (no
 * TWICE_MUST_CHECK on these, except where the result is the value). */

/* DURATION: an integer and a unit (ms, s, m, h), 1ms..24h, in milliseconds. */
bool conf_value_duration(struct conf_parser *p, const struct conf_word *w, uint32_t *ms);
/* A size (64KB, 1MiB: B, KB, MB, GB x1000, KiB, MiB, GiB x1024), or with `rate` bytes per
 * second ("100KB/s"), 1 byte to 1024 GiB (rule_do.c). */
bool rule_value_bytes(struct conf_parser *p, const struct conf_word *w, bool rate, uint64_t *out);
/* N in 1..CONF_MAX_CONNECTIONS for `max-connections`. */
bool conf_value_max_connections(struct conf_parser *p, const struct conf_word *w, uint32_t *n);
/* `threads` (1 to CONF_MAX_THREADS, or `auto`: 0). */
bool conf_value_threads(struct conf_parser *p, const struct conf_word *w, unsigned *n);
/* The index in `names` of the word, or -1 after "unknown WHAT 'x'" with a
 * "did you mean" hint, else `expected` as the hint. */
int conf_value_enum(struct conf_parser *p, const struct conf_word *w, const char *what,
                    const char *const *names, size_t n, const char *expected) TWICE_MUST_CHECK;
/* A listener or rule name (`what` is "listener" or "rule"). */
bool conf_value_name(struct conf_parser *p, const struct conf_word *w, const char *what);
/* `bind ADDR:PORT` into *out (host allocated, owned by *out). */
bool conf_value_bind(struct conf_parser *p, const struct conf_word *w, struct conf_addr *out);
/* `upstream HOST:PORT` into *out (host allocated, owned by *out). */
bool conf_value_upstream(struct conf_parser *p, const struct conf_word *w, struct conf_addr *out);

/* Interpret a top-level `listen NAME { ... }` and link the new listener. */
void conf_listen_directive(struct conf_parser *p, const struct conf_node *n);

/* After the whole file is read (the admin API's address included): fill in
 * inherited values and report upstreams that reach twice's own sockets. */
void conf_listen_finish(struct conf_parser *p);

/* Interpret `rule NAME on LISTENER { ... }` and link the new rule at
 * p->rules_tail.  Runs after every listener of p->base is known. */
void conf_rule_directive(struct conf_parser *p, const struct conf_node *n);

/* Once every rule is read: a warning for each rule that may not see events an earlier rule
 * on the same listener and event takes (one rule acts on an event: rule_overlap.c). */
void rule_check_overlaps(struct conf_parser *p);

/* Whether `word` is a directive of rule blocks (for hints elsewhere). */
bool conf_is_rule_keyword(const char *word) TWICE_MUST_CHECK;
extern const char *const conf_rule_keywords[];
extern const size_t conf_n_rule_keywords;

/* The globals `seed`, `journal`, `journal-flush`, `admin` and `admin-token` (globals.c). */
void conf_global_seed(struct conf_parser *p, const struct conf_node *n);
void conf_global_journal(struct conf_parser *p, const struct conf_node *n);
void conf_global_journal_flush(struct conf_parser *p, const struct conf_node *n);
void conf_global_admin(struct conf_parser *p, const struct conf_node *n);
void conf_global_admin_token(struct conf_parser *p, const struct conf_node *n);
void conf_global_toxiproxy_api(struct conf_parser *p, const struct conf_node *n);
void conf_global_toxiproxy_config(struct conf_parser *p, const struct conf_node *n);
void conf_global_user(struct conf_parser *p, const struct conf_node *n);
/* `instance NAME`: which twice wrote a journal, among several read together. */
void conf_global_instance(struct conf_parser *p, const struct conf_node *n);

/* After the globals and listeners are read: checks between `admin`,
 * `admin-token` and the listeners.  `token_at` is where `admin-token` was
 * written (line 0: not written). */
void conf_globals_finish(struct conf_parser *p, struct conf_loc token_at);
/* `journal-flush` (set at flush_at, line 0 when not) without `journal`: a warning. */
void conf_journal_finish(struct conf_parser *p, struct conf_loc flush_at);

/* Interpret `tls ...` and `upstream-tls ...` into the listener. */
void conf_tls_server_directive(struct conf_parser *p, struct conf_listener *l,
                               const struct conf_node *n);
void conf_tls_client_directive(struct conf_parser *p, struct conf_listener *l,
                               const struct conf_node *n);

#endif
