/*
 * codec.c - which protocol layer a listener's sessions use.
 */
#include "proxy/codec.h"

#include <stdio.h>

#include "proxy/fault.h"
#include "proxy/log.h"

const struct codec_ops *codec_for(const struct conf_listener *l)
{
    switch (l->protocol) {
    case CONF_PROTO_AMQP:
        return &amqp_codec_ops;
    case CONF_PROTO_RESP:
        return &resp_codec_ops;
    case CONF_PROTO_TCP:
    default:
        return NULL;
    }
}

size_t codec_decide(struct session *s, const struct engine_event *ev, size_t *hits)
{
    struct loop *lp = s->loop;
    stat_add(&lp->events[ev->event], 1);
    if (lp->rules == NULL)
        return 0;
    size_t n =
        ruleset_decide(lp->rules, s->cfg->l->name, ev, proxy_now_ms(), hits, SESSION_MAX_RULE_HITS);
    for (size_t i = 0; i < n; i++) {
        const struct rule *r = ruleset_rule(lp->rules, hits[i]);
        if (r->action.kind != RULE_ACT_EXPIRE)
            fault_note(s, r, ev);
    }
    return n;
}

void codec_log_protocol_error(struct session *s, const char *msg, const char *detail)
{
    char what[48];
    snprintf(what, sizeof(what), "%s protocol error", s->codec->name);
    struct log_line line;
    log_begin(&line, LOG_WARN, what);
    log_u64(&line, "sid", s->id);
    log_str(&line, "listener", s->cfg->l->name);
    log_str(&line, "error", msg);
    if (detail != NULL)
        log_str(&line, "detail", detail);
    log_end(&line);
    session_set_error(s, "%s: %s", s->codec->name, msg);
}

const char *codec_anon_id(char *buf, size_t cap, const char *prefix, const uint64_t *v, size_t n)
{
    if (cap == 0)
        return buf;
    size_t at = 0;
    for (const char *c = prefix; *c != '\0' && at + 1 < cap; c++)
        buf[at++] = *c;
    for (size_t i = 0; i < n; i++) {
        char digits[20];
        size_t k = 0;
        uint64_t x = v[i];
        do {
            digits[k++] = (char)('0' + x % 10);
            x /= 10;
        } while (x != 0);
        if (at + 1 < cap)
            buf[at++] = ':';
        while (k > 0 && at + 1 < cap)
            buf[at++] = digits[--k];
    }
    buf[at] = '\0';
    return buf;
}
