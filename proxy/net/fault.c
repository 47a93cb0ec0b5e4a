/*
 * fault.c - the log line (and journal record) of each injected fault.
 */
#include "proxy/net/fault.h"

#include <stdio.h>

#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/net/session.h"

static const char *direction_name(enum rule_direction d)
{
    return d == RULE_DIR_UPSTREAM ? "upstream" : d == RULE_DIR_DOWNSTREAM ? "downstream" : "both";
}

void fault_describe(const struct rule *r, char *buf, size_t len)
{
    const struct rule_action *a = &r->action;
    const char *name = rule_action_name(a->kind);
    unsigned long long bytes = (unsigned long long)a->bytes;
    switch (a->kind) {
    case RULE_ACT_LATENCY:
        snprintf(buf, len, "%s %ums jitter %ums %s", name, a->duration_ms, a->jitter_ms,
                 direction_name(r->direction));
        break;
    case RULE_ACT_BANDWIDTH:
        snprintf(buf, len, "%s %lluB/s %s", name, bytes, direction_name(r->direction));
        break;
    case RULE_ACT_SLICE:
        snprintf(buf, len, "%s %lluB delay %ums %s", name, bytes, a->slice_delay_ms,
                 direction_name(r->direction));
        break;
    case RULE_ACT_LIMIT:
        snprintf(buf, len, "%s %lluB %s", name, bytes, direction_name(r->direction));
        break;
    case RULE_ACT_BLACKHOLE:
        snprintf(buf, len, "%s %s", name, direction_name(r->direction));
        break;
    case RULE_ACT_RESET:
    case RULE_ACT_SLOW_CLOSE:
    case RULE_ACT_DELAY:
    case RULE_ACT_EXPIRE:
        snprintf(buf, len, "%s %ums", name, a->duration_ms);
        break;
    case RULE_ACT_REDELIVER:
    case RULE_ACT_DUPLICATE:
        if (a->duration_ms != 0)
            snprintf(buf, len, "%s after %ums", name, a->duration_ms);
        else
            snprintf(buf, len, "%s", name);
        break;
    case RULE_ACT_CLOSE:
        snprintf(buf, len, "%s %s", name, a->close_when == RULE_CLOSE_BEFORE ? "before" : "after");
        break;
    case RULE_ACT_ERROR:
        snprintf(buf, len, "%s %s", name, a->error_code ? a->error_code : "");
        break;
    default:
        snprintf(buf, len, "%s", name);
        break;
    }
}

void fault_note(struct session *s, const struct rule *r, const struct engine_event *ev)
{
    char detail[160];
    fault_describe(r, detail, sizeof(detail));
    struct log_line line;
    log_begin(&line, LOG_INFO, "fault");
    log_u64(&line, "sid", s->id);
    log_str(&line, "listener", s->cfg->l->name);
    log_str(&line, "rule", r->name);
    log_str(&line, "action", rule_action_name(r->action.kind));
    log_str(&line, "event", rule_event_name(r->event));
    if (ev != NULL && ev->queue != NULL)
        log_str(&line, "queue", ev->queue);
    if (ev != NULL && ev->message_id != NULL)
        log_str(&line, "message_id", ev->message_id);
    log_str(&line, "detail", detail);
    log_end(&line);
    if (s->px->journal == NULL)
        return;
    struct journal_record rec = {
        .kind = JOURNAL_KIND_FAULT,
        .session = s->id,
        .listener = s->cfg->l->name,
        .client = s->client_addr,
        .rule = r->name,
        .action = (uint32_t)r->action.kind,
        .action_name = rule_action_name(r->action.kind),
        .event = (uint32_t)r->event,
        .detail = detail,
    };
    if (ev != NULL) {
        rec.queue = ev->queue;
        rec.task = ev->task;
        rec.message_id = ev->message_id;
        rec.redelivered = ev->redelivered;
    }
    journal_record(s->px->journal, &rec);
}
