/*
 * rule.c - the names of events, fields and actions; copying and freeing rules.
 *
 * Names come from the X-macro lists in rule.h, so a code and its name are
 * written once; the parser, the journal and the admin API all print these.
 */
#include "rules/rule.h"

#include <stdlib.h>

#include "rules/conf_mem.h"

bool rule_action_is_stream(enum rule_action_kind k)
{
    switch (k) {
    case RULE_ACT_LATENCY:
    case RULE_ACT_BANDWIDTH:
    case RULE_ACT_SLICE:
    case RULE_ACT_RESET:
    case RULE_ACT_BLACKHOLE:
    case RULE_ACT_SLOW_CLOSE:
    case RULE_ACT_LIMIT:
        return true;
    default:
        return false;
    }
}

const char *rule_event_name(enum rule_event e)
{
    switch (e) {
#define RULE_EVENT_NAME(name, code, str)                                                           \
    case RULE_EV_##name:                                                                           \
        return str;
        RULE_EVENTS(RULE_EVENT_NAME)
#undef RULE_EVENT_NAME
    default:
        return "unknown";
    }
}

const char *rule_field_name(enum rule_field f)
{
    switch (f) {
#define RULE_FIELD_NAME(name, code, str)                                                           \
    case RULE_F_##name:                                                                            \
        return str;
        RULE_FIELDS(RULE_FIELD_NAME)
#undef RULE_FIELD_NAME
    default:
        return "unknown";
    }
}

const char *rule_action_name(enum rule_action_kind k)
{
    switch (k) {
#define RULE_ACTION_NAME(name, code, str)                                                          \
    case RULE_ACT_##name:                                                                          \
        return str;
        RULE_ACTIONS(RULE_ACTION_NAME)
#undef RULE_ACTION_NAME
    default:
        return "unknown";
    }
}

/* Free what one rule owns, not the rule itself. */
static void rule_free_fields(struct rule *r)
{
    for (size_t i = 0; i < r->n_matchers; i++) {
        free(r->matchers[i].header);
        free(r->matchers[i].value);
    }
    free(r->matchers);
    free(r->action.error_code);
    free(r->name);
    free(r->listener);
}

void rule_list_free(struct rule *r)
{
    while (r != NULL) {
        struct rule *next = r->next;
        rule_free_fields(r);
        free(r);
        r = next;
    }
}

/* Copies the strings a copied matcher still shares with its original. */
static bool matcher_copy_strings(struct rule_matcher *m)
{
    const char *header = m->header, *value = m->value;
    m->header = NULL;
    m->value = NULL;
    return (header == NULL || (m->header = conf_mem_strdup(header)) != NULL) &&
           (value == NULL || (m->value = conf_mem_strdup(value)) != NULL);
}

struct rule *rule_copy(const struct rule *r)
{
    struct rule *c = conf_mem_calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    *c = *r;
    c->next = NULL;
    /* Nothing is owned yet: a failure below frees only what was copied. */
    c->name = c->listener = c->action.error_code = NULL;
    c->matchers = NULL;
    c->n_matchers = 0;
    bool ok = (c->name = conf_mem_strdup(r->name)) != NULL &&
              (c->listener = conf_mem_strdup(r->listener)) != NULL &&
              (r->action.error_code == NULL ||
               (c->action.error_code = conf_mem_strdup(r->action.error_code)) != NULL);
    if (ok && r->n_matchers > 0) {
        ok = (c->matchers = conf_mem_calloc(r->n_matchers, sizeof(*c->matchers))) != NULL;
        for (size_t i = 0; ok && i < r->n_matchers; i++) {
            c->matchers[i] = r->matchers[i];
            c->n_matchers = i + 1;
            ok = matcher_copy_strings(&c->matchers[i]);
        }
    }
    if (!ok) {
        rule_list_free(c);
        return NULL;
    }
    return c;
}
