/*
 * fault.c - the log line (and journal record) of each injected fault.
 */
#include "proxy/net/fault.h"

#include <stdio.h>

#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/net/session.h"

void fault_note(struct session *s, const struct rule *r, const struct engine_event *ev)
{
    char detail[160];
    rule_action_text(r, detail, sizeof(detail));
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
