/*
 * fault_log.c - fault times per rule and per message.  See fault_log.h.
 */
#include "offline/fault_log.h"

#include <stdlib.h>
#include <string.h>

void fault_log_init(struct fault_log *f)
{
    memset(f, 0, sizeof(*f));
}

void fault_log_add_header(struct fault_log *f, const Twice__Journal__Header *h)
{
    if (f->start_us == 0)
        f->start_us = h->start_unix_ms * 1000u;
}

const char *fault_log_event_name(uint32_t event)
{
    return event < RULE_EV_COUNT ? rule_event_name((enum rule_event)event) : "other";
}

static struct fault_log_rule *rule_of(struct fault_log *f, const Twice__Journal__Record *r)
{
    bool inserted = false;
    const char *name = r->rule[0] != '\0' ? r->rule : "(none)";
    void **slot = strmap_put(&f->rules, name, &inserted);
    if (slot == NULL)
        return NULL;
    if (*slot == NULL) {
        struct fault_log_rule *rule = calloc(1, sizeof(*rule));
        if (rule == NULL || (rule->action = strdup(r->action_name)) == NULL) {
            free(rule);
            return NULL;
        }
        rule->name = strmap_key(&f->rules, name);
        *slot = rule;
    }
    return *slot;
}

static int rule_add_time(struct fault_log_rule *rule, uint64_t t)
{
    if (rule->count == rule->cap) {
        size_t cap = rule->cap != 0 ? rule->cap * 2 : 16;
        uint64_t *times = realloc(rule->times, cap * sizeof(*times));
        if (times == NULL)
            return -1;
        rule->times = times;
        rule->cap = cap;
    }
    rule->times[rule->count++] = t;
    return 0;
}

static int message_add(struct fault_log *f, const Twice__Journal__Record *r,
                       const struct fault_log_rule *rule)
{
    bool inserted = false;
    void **slot = strmap_put(&f->messages, r->message_id, &inserted);
    if (slot == NULL)
        return -1;
    if (*slot == NULL && (*slot = calloc(1, sizeof(struct fault_log_msg))) == NULL)
        return -1;
    struct fault_log_msg *m = *slot;
    if (m->n == FAULT_LOG_PER_MESSAGE) {
        m->more++;
        return 0;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap != 0 ? m->cap * 2 : 2;
        struct fault_log_fault *list = realloc(m->list, cap * sizeof(*list));
        if (list == NULL)
            return -1;
        m->list = list;
        m->cap = cap;
    }
    m->list[m->n++] = (struct fault_log_fault){r->time_unix_us, rule, r->event};
    return 0;
}

int fault_log_add_record(struct fault_log *f, const Twice__Journal__Record *r)
{
    if (r->time_unix_us > f->last_us)
        f->last_us = r->time_unix_us;
    if (r->kind != TWICE__JOURNAL__RECORD__KIND__FAULT)
        return 0;
    struct fault_log_rule *rule = rule_of(f, r);
    if (rule == NULL || rule_add_time(rule, r->time_unix_us) != 0)
        return -1;
    rule->by_event[r->event < RULE_EV_COUNT ? r->event : RULE_EV_COUNT]++;
    f->faults++;
    return r->message_id[0] != '\0' ? message_add(f, r, rule) : 0;
}

static int rule_cmp(const void *a, const void *b)
{
    const struct fault_log_rule *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

const struct fault_log_rule **fault_log_rules(const struct fault_log *f, size_t *n)
{
    *n = 0;
    if (strmap_count(&f->rules) == 0)
        return NULL;
    const struct fault_log_rule **v = malloc(strmap_count(&f->rules) * sizeof(*v));
    if (v == NULL) {
        *n = SIZE_MAX;
        return NULL;
    }
    size_t pos = 0;
    const struct strmap_slot *s = NULL;
    while (strmap_next(&f->rules, &pos, &s))
        v[(*n)++] = s->value;
    qsort(v, *n, sizeof(*v), rule_cmp);
    return v;
}

const struct fault_log_msg *fault_log_message(const struct fault_log *f, const char *id)
{
    return strmap_get(&f->messages, id);
}

void fault_log_write_events(FILE *out, const struct fault_log_rule *r)
{
    const char *sep = "";
    for (uint32_t e = 0; e < FAULT_LOG_EVENTS; e++) {
        if (r->by_event[e] == 0)
            continue;
        fprintf(out, "%s%s %llu", sep, fault_log_event_name(e), (unsigned long long)r->by_event[e]);
        sep = ", ";
    }
}

static void rule_free(void *p)
{
    struct fault_log_rule *r = p;
    if (r != NULL) {
        free(r->action);
        free(r->times);
    }
    free(r);
}

static void msg_free(void *p)
{
    struct fault_log_msg *m = p;
    if (m != NULL)
        free(m->list);
    free(m);
}

void fault_log_free(struct fault_log *f)
{
    strmap_free(&f->rules, rule_free);
    strmap_free(&f->messages, msg_free);
}
