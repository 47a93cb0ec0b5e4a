/*
 * rule_parse.h - pass 2 for `rule NAME on LISTENER { ... }` blocks.
 *
 * rule_parse.c reads the block and its triggers, rule_when.c the event and
 * its matchers, rule_do.c the action and its arguments, rule_caps.c checks
 * the result against what the listener's codec declares it can do
 * (rules/caps.h).  The language itself (which operators a field takes, that
 * a rule with no `when` acts on the byte stream) is checked here; everything
 * that depends on the protocol comes from the codec's tables.
 *
 * Internal to rules/.
 */
#ifndef TWICE_RULES_RULE_PARSE_H
#define TWICE_RULES_RULE_PARSE_H

#include "rules/interp.h"
#include "rules/rule.h"

/* Most matchers in one `when`. */
#define RULE_MAX_MATCHERS 32
/* Largest N of `every`, `nth`, `first`, `after` and `limit`. */
#define RULE_MAX_COUNT 1000000000000ull
/* Largest N of `max-per-message`. */
#define RULE_MAX_PER_MESSAGE 1000u
/* Largest size or rate of a stream action: 1 TiB (per second). */
#define RULE_MAX_BYTES (1024ull * 1024ull * 1024ull * 1024ull)
/* Longest `do error CODE`. */
#define RULE_ERROR_CODE_MAX 32
/* Room for a hint that lists names (actions allowed on an event, ...). */
#define RULE_LIST_BYTES 256

/* The directives of a rule block, in the order of conf_rule_keywords. */
enum rule_slot {
    RULE_S_WHEN = 0,
    RULE_S_DO,
    RULE_S_STREAM,
    RULE_S_DISABLED,
    RULE_S_PROBABILITY,
    RULE_S_EVERY,
    RULE_S_NTH,
    RULE_S_FIRST,
    RULE_S_AFTER,
    RULE_S_BETWEEN,
    RULE_S_LIMIT,
    RULE_S_MAX_PER_MESSAGE,
    RULE_S_COUNT,
};

/* A rule while its block is read. */
struct rule_state {
    struct rule *r;
    struct conf_loc first[RULE_S_COUNT]; /* where each directive was written; line 0: not */
    struct conf_loc event_loc;           /* of a valid `when` event; line 0: none */
    bool action_known;                   /* r->action.kind is set (its arguments may be wrong) */
    size_t cap_matchers;                 /* allocated room in r->matchers */
};

/* `when EVENT MATCHER...` into rs->r (rule_when.c). */
void rule_when_directive(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n);

/* `do ACTION ARGS...` into rs->r->action (rule_do.c). */
void rule_do_directive(struct conf_parser *p, struct rule_state *rs, const struct conf_node *n);

/* How an action is written: "do delay DURATION", "do redeliver [after DURATION]" (rule_do.c). */
const char *rule_action_usage(enum rule_action_kind k);

/* A rule block without `do`: an error, whose hint names the actions the listener's codec can
 * take on the rule's event (rule_caps.c); `l` NULL when the listener is unknown. */
void rule_check_has_do(struct conf_parser *p, const struct rule_state *rs,
                       const struct conf_node *n, const struct conf_listener *l);

/* A DURATION that may also be zero ("0s", "0ms"), for the start of a window
 * and pauses; false after an error at the word. */
bool rule_value_duration0(struct conf_parser *p, const struct conf_word *w, uint32_t *ms);

/* Check the finished rule against what listener `l`'s codec can do
 * (rule_caps.c). */
void rule_check_caps(struct conf_parser *p, const struct rule_state *rs,
                     const struct conf_listener *l);

/* Join `names` (n of them) with ", " into buf (RULE_LIST_BYTES); returns buf. */
const char *rule_join_names(const char *const *names, size_t n, char *buf);

#endif
