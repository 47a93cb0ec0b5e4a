/*
 * engine.h - from a protocol event to the rules that fault it.
 *
 * A `struct ruleset` is the runtime form of the rules of one configuration
 * (or of one PUT /rules): the rules, per-rule counters, and the per-message
 * fault counts behind `max-per-message`.  The proxy holds the current
 * ruleset by reference; a reload builds a new one and swaps the pointer, so
 * a decision always sees one consistent set.
 *
 * Decisions are deterministic.  A probabilistic decision is a pure function
 * of (seed, rule name, message identity, occurrence), where occurrence counts
 * how often this rule has already seen this identity; it does not depend on
 * a shared random stream, so the same seed faults the same messages whatever
 * the order in which workers see them.  Counting triggers (every, nth, first,
 * after) count the events that matched the rule, in the order they arrive,
 * leaving out those of messages the per-message cap already excludes.
 *
 * Order of evaluation for one rule: enabled and kill switch, matchers, the
 * per-message cap, `between` window, counting triggers, probability and
 * `limit`.  Only a rule that passes them all counts as a fault.
 *
 * Pure C: no libevent, no OpenSSL.  Thread-safe: the event loops of every
 * thread decide against the same ruleset (or, just after a reload, against
 * rulesets that share their rules' state: ruleset_inherit).  Matching reads only the rules;
 * the counters and identity table of a rule change under that rule's own
 * lock, taken only once an event matched the rule, so traffic no rule
 * matches takes no lock and two rules never wait on each other.  With
 * several threads, counting triggers (every, nth, first, after) count in
 * the order the events reach the engine; probabilities stay a pure function
 * of the seed and the message.
 */
#ifndef TWICE_ENGINE_H
#define TWICE_ENGINE_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rules/rule.h"

/* Distinct message identities whose fault counts a rule remembers; past
 * this the rule forgets them all and counts anew (docs/rules.md, triggers). */
#define ENGINE_MAX_TRACKED_IDS (1u << 22)

/* What an event carries, as far as the codec knows it.  Strings may be NULL
 * (unknown); `body` may be NULL with body_len 0. */
struct engine_event {
    enum rule_event event;
    const char *queue;
    const char *exchange;
    const char *routing_key;
    const char *consumer_tag;
    const char *message_id;
    const char *task;
    const char *command;
    const char *key;
    const uint8_t *body;
    size_t body_len;
    bool redelivered;
    bool has_client;
    uint8_t client[16]; /* IPv6, or IPv4-mapped IPv6 */
    /* header.NAME lookups: returns the value or NULL. */
    const char *(*header)(const void *ctx, const char *name);
    const void *header_ctx;
    /* Identity for determinism and the per-message cap: the message id when
     * there is one, else something stable such as "session:42". */
    const char *identity;
    /* identity names one delivery, not the message (it has no id): the
     * broker's redelivered flag is then all that tells a copy, so a
     * redelivered one is past every rule's max-per-message. */
    bool anonymous;
};

struct engine_rule_stats {
    uint64_t seen;   /* events that matched the rule's `when` */
    uint64_t faults; /* faults the rule injected */
};

struct ruleset;

/* Build a ruleset over `rules` (borrowed: they must outlive the ruleset,
 * e.g. owned by the same configuration) with `seed`.  `start_ms` is the
 * monotonic time of the process start, for `between`.  NULL on allocation
 * failure.  The caller holds one reference. */
struct ruleset *ruleset_new(const struct rule *rules, uint64_t seed,
                            uint64_t start_ms) TWICE_MUST_CHECK;
void ruleset_get(struct ruleset *rs);
void ruleset_put(struct ruleset *rs);

/* Let the ruleset free `owner` with `free_fn` when its last reference goes
 * (e.g. the rule list of a PUT /rules). */
void ruleset_set_owner(struct ruleset *rs, void *owner, void (*free_fn)(void *));

size_t ruleset_count(const struct ruleset *rs);
const struct rule *ruleset_rule(const struct ruleset *rs, size_t i);
bool ruleset_enabled(const struct ruleset *rs, size_t i);
void ruleset_set_enabled(struct ruleset *rs, size_t i, bool on);
/* Index of the rule called `name`, or -1. */
long ruleset_find(const struct ruleset *rs, const char *name);
struct engine_rule_stats ruleset_stats(const struct ruleset *rs, size_t i);

/* A new rule list for one rule's change through the admin API: copies of the
 * rules of `rs` (NULL: none), in order, with the rule called `name` replaced
 * by `with` in its place, or left out when `with` is NULL; `with` goes last
 * when no rule has that name.  `with` is a single rule (its next NULL), owned
 * by the new list on success and still the caller's on failure.  On success
 * returns 0 with the list in *out (NULL when empty), owned by the caller
 * (rule_list_free), and its length in *n_out; -1 when out of memory.  The
 * new ruleset built on it takes the old state through ruleset_inherit. */
int ruleset_edit(const struct ruleset *rs, const char *name, struct rule *with, struct rule **out,
                 size_t *n_out) TWICE_MUST_CHECK;

/* Kill switch: no rule faults anything while off. */
void ruleset_set_faults_enabled(struct ruleset *rs, bool on);
bool ruleset_faults_enabled(const struct ruleset *rs);

/* Make the same-named rules of `rs` share their enabled flag, counters and
 * per-message counts with those of `old`, and `rs` share its kill switch
 * (a reload keeps rules: counters continue instead of restarting, and an
 * event decided against `old` by a loop that has not switched yet counts
 * for `rs` too).  Call before `rs` is shared with other threads. */
void ruleset_inherit(struct ruleset *rs, const struct ruleset *old);

/* Whether rules on events of kind `ev` combine: a connection's (`connect`, and the stream
 * rules without `when`) do, their effects adding up; a message's or a command's do not: one
 * rule acts on each such event (ruleset_decide()). */
bool engine_event_combines(enum rule_event ev);

/* Decide which rules of listener `listener` fault `ev` at `now_ms`
 * (monotonic).  Writes the indexes of the faulting rules, in file order, to
 * `hits` (at most `max_hits`) and returns how many there are.  Counters are
 * updated as a side effect.
 *
 * On every protocol one rule acts on the event of a message or a command: the first in file
 * order that fires; the rules after it do not see that event (they neither count it nor
 * fault it), so nothing counts or journals a fault that was not made.  Only connection events
 * collect every rule that fires (engine_event_combines()). */
size_t ruleset_decide(struct ruleset *rs, const char *listener, const struct engine_event *ev,
                      uint64_t now_ms, size_t *hits, size_t max_hits);

/* The events (bit 1 << enum rule_event) that some rule of `listener` looks
 * at, enabled or not: a codec can skip building the events no rule wants.
 * Constant for the life of the ruleset. */
uint32_t ruleset_events(const struct ruleset *rs, const char *listener);

/* The kinds of fault (bits 1u << enum job_fault_kind, rules/plan.h's rule_job_fault()) the
 * rules of `listener` on events ev make, enabled or not: a codec prepares what only one kind
 * needs (a copy of a publish for a duplicate). */
uint32_t ruleset_fault_kinds(const struct ruleset *rs, const char *listener, enum rule_event ev);

/* The deterministic coin: a number in [0, 1) from (seed, rule, identity,
 * occurrence).  Exposed for tests. */
double engine_coin(uint64_t seed, const char *rule, const char *identity, uint64_t occurrence);

/* Whether `pattern` (with * and ?) matches `s`.  Exposed for tests. */
bool engine_glob(const char *pattern, const char *s);

#endif
