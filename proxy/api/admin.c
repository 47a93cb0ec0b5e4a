/*
 * admin.c - the admin HTTP API.  See admin.h for the endpoints.
 *
 * Handlers run on the event loop, like everything else: a PUT /rules is
 * parsed and checked completely, then the new ruleset replaces the old one
 * by a pointer swap between two events, so no event ever sees half a rule
 * set.  Rule counters and enabled flags carry over for rules that keep
 * their name.  When accept() runs out of descriptors, the API stops
 * accepting for a second, as the proxy's listeners do, instead of spinning.
 *
 * Requests are routed by one table (path and method to handler): a path the
 * table has is answered 405 with `Allow` for a method it lacks, any other
 * path 404.  Every error is JSON, {"error": "..."}, like the successes.
 */
#include "proxy/api/admin.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offline/json_out.h"
#include "proxy/api/toxi.h"
#include "proxy/core/drain.h"
#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/core/proxy.h"
#include "proxy/core/rule_changes.h"
#include "proxy/net/fault.h"
#include "rules/engine.h"

/* Largest request body (PUT /rules) accepted. */
#define ADMIN_MAX_BODY (1u << 20)

static void reply(struct evhttp_request *req, int code, const char *type, struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Cache-Control", "no-store");
    /* Said here, not left to libevent: it leaves it out of the answer to a
     * HEAD (which must say the GET's length) and of the 405 to a CONNECT
     * (whose body the client would then read until the connection closes). */
    char len[24];
    snprintf(len, sizeof(len), "%zu", evbuffer_get_length(body));
    evhttp_add_header(h, "Content-Length", len);
    /* libevent 2.1 would send a HEAD's body too */
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD)
        evbuffer_drain(body, evbuffer_get_length(body));
    evhttp_send_reply(req, code, code == 200 ? "OK" : NULL, body);
}

static void put_evbuffer(void *ctx, const char *p, size_t n)
{
    evbuffer_add(ctx, p, n);
}

/* A JSON string (json_out.h: invalid UTF-8 and control bytes escaped). */
static void json_str(struct evbuffer *b, const char *s)
{
    json_quote(s, put_evbuffer, b);
}

/* What a request gets when not even its error's buffer can be had. */
static void reply_oom(struct evhttp_request *req)
{
    evhttp_send_error(req, 500, NULL);
}

static void reply_vprintf(struct evhttp_request *req, int code, const char *type, const char *fmt,
                          va_list ap) __attribute__((format(printf, 4, 0)));

static void reply_vprintf(struct evhttp_request *req, int code, const char *type, const char *fmt,
                          va_list ap)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        reply_oom(req);
        return;
    }
    evbuffer_add_vprintf(b, fmt, ap);
    reply(req, code, type, b);
    evbuffer_free(b);
}

/* A plain-text answer (GET /healthz). */
static void reply_text(struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_text(struct evhttp_request *req, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_vprintf(req, code, "text/plain; charset=utf-8", fmt, ap);
    va_end(ap);
}

/* A JSON answer whose text fmt makes (names in it must need no escaping). */
static void reply_json(struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_json(struct evhttp_request *req, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_vprintf(req, code, "application/json", fmt, ap);
    va_end(ap);
}

/* Longest error message; a longer one (a long path in a 404) is cut. */
#define ADMIN_ERROR_MAX 512

/* An error answer, {"error": MSG}, and with `diags` (the text of
 * conf_diags_print, NULL for none) "diagnostics": its lines, one string each. */
static void reply_verror(struct evhttp_request *req, int code, const char *diags, const char *fmt,
                         va_list ap) __attribute__((format(printf, 4, 0)));

static void reply_verror(struct evhttp_request *req, int code, const char *diags, const char *fmt,
                         va_list ap)
{
    char msg[ADMIN_ERROR_MAX], line[ADMIN_ERROR_MAX * 2];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        reply_oom(req);
        return;
    }
    evbuffer_add(b, "{\"error\":", 9);
    json_str(b, msg);
    if (diags != NULL) {
        evbuffer_add(b, ",\"diagnostics\":[", 16);
        for (const char *p = diags, *nl; *p != '\0'; p = *nl != '\0' ? nl + 1 : nl) {
            nl = p + strcspn(p, "\n");
            snprintf(line, sizeof(line), "%.*s", (int)(nl - p), p);
            if (p != diags)
                evbuffer_add(b, ",", 1);
            json_str(b, line);
        }
        evbuffer_add(b, "]", 1);
    }
    evbuffer_add(b, "}\n", 2);
    reply(req, code, "application/json", b);
    evbuffer_free(b);
}

static void reply_error(struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_error(struct evhttp_request *req, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_verror(req, code, NULL, fmt, ap);
    va_end(ap);
}

static void reply_error_diags(struct evhttp_request *req, int code, const char *diags,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void reply_error_diags(struct evhttp_request *req, int code, const char *diags,
                              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_verror(req, code, diags, fmt, ap);
    va_end(ap);
}

static bool authorized(struct proxy *px, struct evhttp_request *req)
{
    const char *token = px->conf->conf->admin_token;
    if (token == NULL)
        return true;
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0)
        return false;
    /* Compare in constant time: the token is a secret. */
    const char *given = auth + 7;
    size_t n = strlen(token), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(token[i] ^ (i < m ? given[i] : 0));
    return diff == 0;
}

/* A rule's triggers as a JSON object: those written, and max_per_message always (1 when not
 * written); a probability as the fraction the engine draws against (0.05 is 5%). */
static void triggers_json(const struct rule *r, struct evbuffer *b)
{
    const struct rule_trigger *t = &r->trigger;
    const struct {
        const char *name;
        uint64_t v;
    } counts[] = {{"every", t->every},
                  {"nth", t->nth},
                  {"first", t->first},
                  {"after", t->after},
                  {"limit", t->limit}};
    evbuffer_add(b, "{", 1);
    if (t->has_probability)
        evbuffer_add_printf(b, "\"probability\":%.10g,", t->probability);
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        if (counts[i].v != 0)
            evbuffer_add_printf(b, "\"%s\":%llu,", counts[i].name, (unsigned long long)counts[i].v);
    if (t->has_between)
        evbuffer_add_printf(b, "\"between_ms\":[%u,%u],", t->between_start_ms, t->between_end_ms);
    evbuffer_add_printf(b, "\"max_per_message\":%u}", t->max_per_message ? t->max_per_message : 1);
}

/* One rule of `rs`, as GET /rules lists it and GET /rules/NAME answers: what it is, what it
 * acts on (its matchers and triggers, as a rule file writes them), and its counters. */
static void rule_json(struct evbuffer *b, struct ruleset *rs, size_t i)
{
    const struct rule *r = ruleset_rule(rs, i);
    struct engine_rule_stats st = ruleset_stats(rs, i);
    char detail[160];
    rule_action_text(r, detail, sizeof(detail));
    evbuffer_add(b, "{\"name\":", 8);
    json_str(b, r->name);
    evbuffer_add(b, ",\"listener\":", 12);
    json_str(b, r->listener);
    evbuffer_add(b, ",\"event\":", 9);
    json_str(b, rule_event_name(r->event));
    evbuffer_add(b, ",\"action\":", 10);
    json_str(b, rule_action_name(r->action.kind));
    evbuffer_add(b, ",\"detail\":", 10);
    json_str(b, detail);
    char text[512];
    rule_matchers_text(r, text, sizeof(text));
    evbuffer_add(b, ",\"matchers\":", 12);
    json_str(b, text);
    evbuffer_add(b, ",\"triggers\":", 12);
    triggers_json(r, b);
    rule_triggers_text(r, text, sizeof(text));
    evbuffer_add(b, ",\"triggers_text\":", 17);
    json_str(b, text);
    evbuffer_add_printf(b, ",\"enabled\":%s,\"seen\":%llu,\"faults\":%llu}",
                        ruleset_enabled(rs, i) ? "true" : "false", (unsigned long long)st.seen,
                        (unsigned long long)st.faults);
}

static void rules_json(struct proxy *px, struct evbuffer *b)
{
    struct ruleset *rs = px->rules;
    evbuffer_add_printf(b, "{\"faults_enabled\":%s,\"rules\":[",
                        rs == NULL || ruleset_faults_enabled(rs) ? "true" : "false");
    for (size_t i = 0; rs != NULL && i < ruleset_count(rs); i++) {
        if (i > 0)
            evbuffer_add(b, ",", 1);
        rule_json(b, rs, i);
    }
    evbuffer_add(b, "]}\n", 3);
}

static void get_rules(struct proxy *px, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        reply_oom(req);
        return;
    }
    rules_json(px, b);
    reply(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void free_rule_list(void *p)
{
    rule_list_free(p);
}

/* The rules of the body of a PUT, checked against the configuration's
 * listeners (`src` names the body in diagnostics), into *rules (owned by the
 * caller) and *n, their warnings into d (conf_diags_init()ed, freed by the
 * caller).  Returns 0, or -1 after answering 400 with every diagnostic (or
 * 500). */
static int parse_body_rules(struct proxy *px, struct evhttp_request *req, const char *src,
                            struct rule **rules, size_t *n, struct conf_diags *d)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char *text = malloc(len + 1);
    if (text == NULL) {
        reply_error(req, 500, "out of memory");
        return -1;
    }
    evbuffer_remove(in, text, len);
    text[len] = '\0';
    /* The Toxiproxy API's proxies are listeners too: rules may name them. */
    struct conf view;
    struct conf_listener *mem;
    int rc = conf_parse_rules(src, text, len, toxi_conf_view(px, &view, &mem), rules, n, d);
    free(mem);
    rule_changes_body(px, text, len);
    free(text);
    if (rc != 0) {
        char *msg = NULL;
        size_t msglen = 0;
        FILE *f = open_memstream(&msg, &msglen);
        if (f != NULL) {
            conf_diags_print(d, f);
            fclose(f);
        }
        reply_error_diags(req, 400, msg, "%u error%s in the rules: nothing changed", d->errors,
                          d->errors == 1 ? "" : "s");
        free(msg);
    }
    return rc;
}

/* Makes `rules` (taken: freed here on failure) the proxy's rules, each rule
 * keeping the state of the rule of its name.  0, or -1 after answering 500. */
static int install_rules(struct proxy *px, struct evhttp_request *req, struct rule *rules)
{
    struct ruleset *rs = ruleset_new(rules, px->seed, px->start_ms);
    if (rs == NULL) {
        rule_list_free(rules);
        reply_error(req, 500, "out of memory");
        return -1;
    }
    ruleset_set_owner(rs, rules, free_rule_list);
    proxy_set_rules(px, rs);
    return 0;
}

/* `{"rules":N}`, with `"warnings":["PUT /rules:L:C: warning: ..."]` when the rules have some. */
static void reply_rules_replaced(struct evhttp_request *req, size_t n, const struct conf_diags *d)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        reply_oom(req);
        return;
    }
    evbuffer_add_printf(b, "{\"rules\":%zu", n);
    if (d->warnings > 0) {
        evbuffer_add(b, ",\"warnings\":[", 13);
        bool first = true;
        for (const struct conf_diag *g = d->head; g != NULL; g = g->next) {
            char *line = NULL;
            if (g->severity != CONF_WARNING ||
                asprintf(&line, "%s:%u:%u: warning: %s%s%s%s", d->file, g->loc.line, g->loc.col,
                         g->msg, g->hint != NULL ? " (" : "", g->hint != NULL ? g->hint : "",
                         g->hint != NULL ? ")" : "") < 0)
                continue;
            evbuffer_add(b, ",", first ? 0 : 1);
            first = false;
            json_str(b, line);
            free(line);
        }
        evbuffer_add(b, "]", 1);
    }
    evbuffer_add(b, "}\n", 2);
    reply(req, 200, "application/json", b);
    evbuffer_free(b);
}

static void put_rules(struct proxy *px, struct evhttp_request *req)
{
    struct rule *rules = NULL;
    size_t n = 0;
    struct conf_diags d;
    conf_diags_init(&d);
    if (parse_body_rules(px, req, "PUT /rules", &rules, &n, &d) == 0 &&
        install_rules(px, req, rules) == 0) {
        rule_changes_admin(px, req, JOURNAL_CHANGE_RULES_REPLACED, NULL);
        toxi_rules_changed(px); /* the Toxiproxy API's message toxics stay */
        log_msg(LOG_INFO, "rules replaced", "source=admin rules=%zu", n);
        proxy_log_diags(&d);
        reply_rules_replaced(req, n, &d);
    }
    conf_diags_free(&d);
}

/* Longer than any rule name (CONF_NAME_MAX), so that a longer NAME is no rule. */
#define ADMIN_NAME_MAX 128

/* The NAME of /rules/NAME... into name; "" when it is too long to be one. */
static void rule_name_of(struct evhttp_request *req, char name[ADMIN_NAME_MAX])
{
    const char *p = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req)) + strlen("/rules/");
    size_t n = strcspn(p, "/");
    if (n >= ADMIN_NAME_MAX)
        n = 0;
    memcpy(name, p, n);
    name[n] = '\0';
}

/* The index of the rule of /rules/NAME..., or -1 after answering 404. */
static long find_rule(struct proxy *px, struct evhttp_request *req, char name[ADMIN_NAME_MAX])
{
    rule_name_of(req, name);
    long i = px->rules != NULL && name[0] != '\0' ? ruleset_find(px->rules, name) : -1;
    if (i < 0)
        reply_error(req, 404, "no rule named '%s'", name);
    return i;
}

/* Answers `code` with the rule called `name`, as GET /rules/NAME does. */
static void reply_rule(struct proxy *px, struct evhttp_request *req, int code, const char *name)
{
    long i = ruleset_find(px->rules, name);
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        reply_oom(req);
        return;
    }
    rule_json(b, px->rules, (size_t)i);
    evbuffer_add(b, "\n", 1);
    reply(req, code, "application/json", b);
    evbuffer_free(b);
}

/* GET /rules/NAME */
static void get_rule(struct proxy *px, struct evhttp_request *req)
{
    char name[ADMIN_NAME_MAX];
    if (find_rule(px, req, name) >= 0)
        reply_rule(px, req, 200, name);
}

/* The one rule of a PUT /rules/NAME body, checked to be called NAME and to
 * fit in the rule set.  0, or -1 after answering 400 (rules freed). */
static int check_put_rule(struct proxy *px, struct evhttp_request *req, const char *name,
                          struct rule *rules, size_t n)
{
    bool known = px->rules != NULL && ruleset_find(px->rules, name) >= 0;
    size_t count = px->rules != NULL ? ruleset_count(px->rules) : 0;
    if (n != 1)
        reply_error(req, 400,
                    "the body has %zu rules: give one rule block, `rule %s on LISTENER "
                    "{ ... }`",
                    n, name);
    else if (strcmp(rules->name, name) != 0)
        reply_error(req, 400, "the body's rule is named '%s', the path's '%s'", rules->name, name);
    else if (!known && count >= CONF_MAX_RULES)
        reply_error(req, 400, "too many rules (at most %d): nothing changed", CONF_MAX_RULES);
    else
        return 0;
    rule_list_free(rules);
    return -1;
}

/* PUT /rules/NAME: the body's one rule replaces the rule called NAME in its
 * place, or is added after the others. */
static void put_rule(struct proxy *px, struct evhttp_request *req)
{
    char name[ADMIN_NAME_MAX], src[ADMIN_NAME_MAX + 16];
    rule_name_of(req, name);
    if (name[0] == '\0') {
        reply_error(req, 400, "the path's rule name is too long");
        return;
    }
    snprintf(src, sizeof(src), "PUT /rules/%s", name);
    struct rule *rules = NULL, *list = NULL;
    size_t n = 0;
    struct conf_diags d;
    conf_diags_init(&d);
    int rc = parse_body_rules(px, req, src, &rules, &n, &d);
    if (rc == 0 && (rc = check_put_rule(px, req, name, rules, n)) == 0)
        proxy_log_diags(&d); /* the rule's own warnings, not its place among the others' */
    conf_diags_free(&d);
    if (rc != 0)
        return;
    bool known = px->rules != NULL && ruleset_find(px->rules, name) >= 0;
    if (ruleset_edit(px->rules, name, rules, &list, &n) != 0) {
        rule_list_free(rules);
        reply_error(req, 500, "out of memory");
        return;
    }
    if (install_rules(px, req, list) != 0)
        return;
    rule_changes_admin(px, req, known ? JOURNAL_CHANGE_RULE_REPLACED : JOURNAL_CHANGE_RULE_ADDED,
                       name);
    log_msg(LOG_INFO, known ? "rule replaced" : "rule added", "rule=%s source=admin rules=%zu",
            name, n);
    reply_rule(px, req, known ? 200 : 201, name);
}

/* DELETE /rules/NAME */
static void delete_rule(struct proxy *px, struct evhttp_request *req)
{
    char name[ADMIN_NAME_MAX];
    struct rule *list = NULL;
    size_t n = 0;
    if (find_rule(px, req, name) < 0)
        return;
    if (ruleset_edit(px->rules, name, NULL, &list, &n) != 0) {
        reply_error(req, 500, "out of memory");
        return;
    }
    if (install_rules(px, req, list) != 0)
        return;
    rule_changes_admin(px, req, JOURNAL_CHANGE_RULE_DELETED, name);
    log_msg(LOG_INFO, "rule deleted", "rule=%s source=admin rules=%zu", name, n);
    reply_json(req, 200, "{\"rule\":\"%s\",\"deleted\":true,\"rules\":%zu}\n", name, n);
}

/* POST /rules/NAME/enable|disable */
static void switch_rule(struct proxy *px, struct evhttp_request *req, bool on)
{
    char name[ADMIN_NAME_MAX];
    long i = find_rule(px, req, name);
    if (i < 0)
        return;
    ruleset_set_enabled(px->rules, (size_t)i, on);
    rule_changes_admin(px, req, on ? JOURNAL_CHANGE_RULE_ENABLED : JOURNAL_CHANGE_RULE_DISABLED,
                       name);
    log_msg(LOG_INFO, on ? "rule enabled" : "rule disabled", "rule=%s source=admin", name);
    reply_json(req, 200, "{\"rule\":\"%s\",\"enabled\":%s}\n", name, on ? "true" : "false");
}

static void enable_rule(struct proxy *px, struct evhttp_request *req)
{
    switch_rule(px, req, true);
}

static void disable_rule(struct proxy *px, struct evhttp_request *req)
{
    switch_rule(px, req, false);
}

static void set_faults(struct proxy *px, struct evhttp_request *req, bool on)
{
    if (px->rules != NULL) /* the switch is shared by the rules that follow (reload, PUT) */
        ruleset_set_faults_enabled(px->rules, on);
    rule_changes_admin(px, req, on ? JOURNAL_CHANGE_FAULTS_ON : JOURNAL_CHANGE_FAULTS_OFF, NULL);
    log_msg(LOG_WARN, on ? "faults on" : "faults off", "source=admin");
    reply_json(req, 200, "{\"faults_enabled\":%s}\n", on ? "true" : "false");
}

static void faults_off(struct proxy *px, struct evhttp_request *req)
{
    set_faults(px, req, false);
}

static void faults_on(struct proxy *px, struct evhttp_request *req)
{
    set_faults(px, req, true);
}

static void post_reload(struct proxy *px, struct evhttp_request *req)
{
    char *diag = NULL;
    if (proxy_reload(px, &diag) == 0) {
        rule_changes_admin(px, req, JOURNAL_CHANGE_RELOADED, NULL);
        reply_json(req, 200, "{\"reloaded\":true}\n");
    } else {
        reply_error_diags(req, 400, diag, "reload failed: nothing changed");
    }
    free(diag);
}

static void get_stats(struct proxy *px, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evbuffer_add_printf(b, "{\"uptime_ms\":%llu,\"sessions_open\":%u,\"threads\":%u,",
                        (unsigned long long)(proxy_now_ms() - px->start_ms), proxy_sessions(px),
                        px->n_loops);
    /* Sessions open on each event loop thread: how the hand-off spread them. */
    evbuffer_add_printf(b, "\"sessions_per_thread\":[");
    for (unsigned i = 0; i < px->n_loops; i++)
        evbuffer_add_printf(b, "%s%u", i ? "," : "", atomic_load(&px->loops[i].n_sessions));
    evbuffer_add_printf(b, "],\"listeners\":{");
    int first = 1;
    for (struct listener_stats *st = px->stats; st != NULL; st = st->next, first = 0) {
        struct listener_counts t = proxy_stats_total(px, st);
        evbuffer_add_printf(b, "%s", first ? "" : ",");
        json_str(b, st->name);
        evbuffer_add_printf(b,
                            ":{\"connections\":%llu,\"open\":%llu,\"bytes_up\":%llu,"
                            "\"bytes_down\":%llu}",
                            (unsigned long long)t.connections, (unsigned long long)t.open,
                            (unsigned long long)t.bytes_up, (unsigned long long)t.bytes_down);
    }
    evbuffer_add(b, "},\"events\":{", 12);
    for (int e = 0; e < RULE_EV_COUNT; e++)
        evbuffer_add_printf(b, "%s\"%s\":%llu", e ? "," : "", rule_event_name((enum rule_event)e),
                            (unsigned long long)proxy_events(px, (unsigned)e));
    evbuffer_add(b, "},", 2);
    evbuffer_drain(b, 0);
    drain_stats_json(px, b);
    /* The rules part is the same document as GET /rules, without its braces. */
    struct evbuffer *r = evbuffer_new();
    if (r != NULL) {
        rules_json(px, r);
        evbuffer_drain(r, 1); /* "{" */
        evbuffer_add_buffer(b, r);
        evbuffer_free(r);
    }
    reply(req, 200, "application/json", b);
    evbuffer_free(b);
}

void admin_prom_label(struct evbuffer *b, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            evbuffer_add_printf(b, "\\%c", *p);
        else if (*p == '\n')
            evbuffer_add(b, "\\n", 2);
        else
            evbuffer_add(b, p, 1);
    }
}

static void get_metrics(struct proxy *px, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    /* The version as a label, the way Prometheus exporters say what runs. */
    evbuffer_add_printf(b, "# HELP twice_build_info The version of twice that runs.\n"
                           "# TYPE twice_build_info gauge\n"
                           "twice_build_info{version=\"");
    admin_prom_label(b, TWICE_VERSION);
    /* Which twice, among several one Prometheus scrapes (docs/instances.md): not `instance`,
     * the label Prometheus sets to the target itself. */
    evbuffer_add_printf(b, "\",twice_instance=\"");
    admin_prom_label(b, px->instance);
    evbuffer_add_printf(b, "\"} 1\n");
    /* journal.h: the writer drops a record when its buffer is full (the disk
     * too slow), after a write error, or out of memory. */
    evbuffer_add_printf(b,
                        "# HELP twice_journal_records_dropped_total Journal records lost: buffer "
                        "full, write error or out of memory.\n"
                        "# TYPE twice_journal_records_dropped_total counter\n"
                        "twice_journal_records_dropped_total %llu\n",
                        (unsigned long long)journal_dropped(px->journal));
    evbuffer_add_printf(b, "# HELP twice_faults_total Faults injected, per rule and action.\n"
                           "# TYPE twice_faults_total counter\n");
    for (size_t i = 0; px->rules != NULL && i < ruleset_count(px->rules); i++) {
        const struct rule *r = ruleset_rule(px->rules, i);
        evbuffer_add(b, "twice_faults_total{rule=\"", 25);
        admin_prom_label(b, r->name);
        evbuffer_add_printf(b, "\",action=\"%s\",listener=\"", rule_action_name(r->action.kind));
        admin_prom_label(b, r->listener);
        evbuffer_add_printf(b, "\"} %llu\n",
                            (unsigned long long)ruleset_stats(px->rules, i).faults);
    }
    evbuffer_add_printf(b, "# HELP twice_events_total Protocol events seen, per listener and "
                           "kind.\n"
                           "# TYPE twice_events_total counter\n");
    for (struct listener_stats *st = px->stats; st != NULL; st = st->next) {
        struct listener_counts t = proxy_stats_total(px, st);
        for (int e = 0; e < RULE_EV_COUNT; e++) {
            evbuffer_add_printf(b, "twice_events_total{listener=\"");
            admin_prom_label(b, st->name);
            evbuffer_add_printf(b, "\",kind=\"%s\"} %llu\n", rule_event_name((enum rule_event)e),
                                (unsigned long long)t.events[e]);
        }
    }
    /* Prometheus wants each family's samples together, after its TYPE. */
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"twice_connections_total", "counter", "Client connections accepted."},
        {"twice_connections_open", "gauge", "Client connections open now."},
        {"twice_bytes_total", "counter", "Bytes relayed, per direction."},
    };
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help,
                            fam[f].name, fam[f].type);
        for (struct listener_stats *st = px->stats; st != NULL; st = st->next) {
            struct listener_counts t = proxy_stats_total(px, st);
            uint64_t v[3] = {t.connections, t.open, 0};
            for (int d = 0; d < (f == 2 ? 2 : 1); d++) {
                evbuffer_add_printf(b, "%s{listener=\"", fam[f].name);
                admin_prom_label(b, st->name);
                if (f == 2) {
                    v[2] = d == 0 ? t.bytes_up : t.bytes_down;
                    evbuffer_add_printf(b, "\",direction=\"%s\"",
                                        d == 0 ? "upstream" : "downstream");
                } else {
                    evbuffer_add(b, "\"", 1);
                }
                evbuffer_add_printf(b, "} %llu\n", (unsigned long long)v[f]);
            }
        }
    }
    drain_metrics(px, b);
    reply(req, 200, "text/plain; version=0.0.4", b);
    evbuffer_free(b);
}

static void get_healthz(struct proxy *px, struct evhttp_request *req)
{
    (void)px;
    reply_text(req, 200, "ok\n");
}

/* What the API answers: a path (where '*' stands for one segment, a rule's
 * name) and a method.  HEAD is answered as GET, without the body. */
static const struct admin_route {
    const char *path;
    enum evhttp_cmd_type method;
    void (*fn)(struct proxy *px, struct evhttp_request *req);
} routes[] = {
    {"/healthz", EVHTTP_REQ_GET, get_healthz},
    {"/rules", EVHTTP_REQ_GET, get_rules},
    {"/rules", EVHTTP_REQ_PUT, put_rules},
    {"/rules/*", EVHTTP_REQ_GET, get_rule},
    {"/rules/*", EVHTTP_REQ_PUT, put_rule},
    {"/rules/*", EVHTTP_REQ_DELETE, delete_rule},
    {"/rules/*/enable", EVHTTP_REQ_POST, enable_rule},
    {"/rules/*/disable", EVHTTP_REQ_POST, disable_rule},
    {"/faults/off", EVHTTP_REQ_POST, faults_off},
    {"/faults/on", EVHTTP_REQ_POST, faults_on},
    {"/reload", EVHTTP_REQ_POST, post_reload},
    {"/stats", EVHTTP_REQ_GET, get_stats},
    {"/metrics", EVHTTP_REQ_GET, get_metrics},
    {"/drain", EVHTTP_REQ_POST, drain_request},
};

/* Methods the server lets through to on_request: every one libevent knows,
 * so that a method no route has is our 405, not libevent's 501 page. */
#define ADMIN_METHODS                                                                              \
    (EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |     \
     EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH)

static bool path_matches(const char *pattern, const char *path)
{
    while (*pattern != '\0') {
        if (*pattern == '*') {
            size_t n = strcspn(path, "/");
            if (n == 0)
                return false;
            path += n;
            pattern++;
        } else if (*pattern++ != *path++) {
            return false;
        }
    }
    return *path == '\0';
}

static const struct {
    enum evhttp_cmd_type method;
    const char *name;
} method_names[] = {
    {EVHTTP_REQ_GET, "GET"},     {EVHTTP_REQ_HEAD, "HEAD"},       {EVHTTP_REQ_POST, "POST"},
    {EVHTTP_REQ_PUT, "PUT"},     {EVHTTP_REQ_DELETE, "DELETE"},   {EVHTTP_REQ_OPTIONS, "OPTIONS"},
    {EVHTTP_REQ_TRACE, "TRACE"}, {EVHTTP_REQ_CONNECT, "CONNECT"}, {EVHTTP_REQ_PATCH, "PATCH"},
};

/* 405 for method m on a path whose routes take the methods `allowed`. */
static void method_not_allowed(struct evhttp_request *req, enum evhttp_cmd_type m, unsigned allowed,
                               const char *path)
{
    if (allowed & EVHTTP_REQ_GET)
        allowed |= EVHTTP_REQ_HEAD;
    char allow[64] = "", *p = allow;
    const char *name = "?";
    for (size_t i = 0; i < sizeof(method_names) / sizeof(method_names[0]); i++) {
        if (method_names[i].method == m)
            name = method_names[i].name;
        if (allowed & method_names[i].method)
            p += snprintf(p, sizeof(allow) - (size_t)(p - allow), "%s%s", p == allow ? "" : ", ",
                          method_names[i].name);
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
    reply_error(req, 405, "%s is not allowed on %s: use %s", name, path, allow);
}

void admin_http_reply(struct evhttp_request *req, int code, const char *type, struct evbuffer *body)
{
    reply(req, code, type, body);
}

bool admin_http_authorized(struct proxy *px, struct evhttp_request *req)
{
    return authorized(px, req);
}

static void route(struct proxy *px, struct evhttp_request *req, enum evhttp_cmd_type m,
                  const char *path)
{
    enum evhttp_cmd_type as = m == EVHTTP_REQ_HEAD ? EVHTTP_REQ_GET : m;
    unsigned allowed = 0;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (!path_matches(routes[i].path, path))
            continue;
        if (routes[i].method == as) {
            routes[i].fn(px, req);
            return;
        }
        allowed |= routes[i].method;
    }
    if (allowed != 0)
        method_not_allowed(req, m, allowed, path);
    else
        reply_error(req, 404, "not found: %s", path);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct proxy *px = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri != NULL ? evhttp_uri_get_path(uri) : NULL;
    if (evhttp_request_get_command(req) == EVHTTP_REQ_CONNECT) {
        /* its target is HOST:PORT, no path: no route has it */
        method_not_allowed(req, EVHTTP_REQ_CONNECT,
                           EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE,
                           evhttp_request_get_uri(req));
        return;
    }
    if (path == NULL) {
        reply_error(req, 400, "bad request: no path");
        return;
    }
    /* A load balancer's health check carries no token; the answer says
     * nothing but "ok". */
    if (strcmp(path, "/healthz") != 0 && !authorized(px, req)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
        reply_error(req, 401, "unauthorized: send Authorization: Bearer TOKEN");
        return;
    }
    route(px, req, evhttp_request_get_command(req), path);
}

/* One admin HTTP server: the evhttp, the socket it accepts on (the evhttp
 * owns it) and the timer that has it accept again after accept() ran out of
 * descriptors.  Freed together, by server_free, on the main thread. */
struct admin_server {
    struct evhttp *http;
    struct evconnlistener *evl;
    struct event *retry;
    char addr[300];
    struct admin_server *next; /* in `servers` */
};

/* The servers alive.  evhttp gives its socket's error callback the evhttp as
 * argument, not ours: the server is found by it here. */
static struct admin_server *servers;

static void on_accept_error(struct evconnlistener *evl, void *arg)
{
    for (struct admin_server *srv = servers; srv != NULL; srv = srv->next) {
        if (srv->http == arg) {
            listener_accept_failed(evl, srv->retry, "admin", srv->addr);
            return;
        }
    }
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct admin_server *srv = arg;
    evconnlistener_enable(srv->evl);
}

static void server_free(struct admin_server *srv)
{
    if (srv == NULL)
        return;
    for (struct admin_server **pp = &servers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == srv) {
            *pp = srv->next;
            break;
        }
    }
    if (srv->retry != NULL)
        event_free(srv->retry);
    if (srv->http != NULL)
        evhttp_free(srv->http);
    free(srv);
}

/* A server answering on `addr` (c->admin), or NULL with a reason in err. */
static struct admin_server *server_new(struct proxy *px, const struct conf *c, const char *addr,
                                       char *err, size_t errlen)
{
    struct admin_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL || (srv->http = evhttp_new(px->base)) == NULL ||
        (srv->retry = evtimer_new(px->base, on_retry, srv)) == NULL) {
        snprintf(err, errlen, "cannot create the admin HTTP server");
        server_free(srv);
        return NULL;
    }
    snprintf(srv->addr, sizeof(srv->addr), "%s", addr);
    srv->next = servers;
    servers = srv;
    evhttp_set_max_body_size(srv->http, ADMIN_MAX_BODY);
    evhttp_set_allowed_methods(srv->http, ADMIN_METHODS);
    evhttp_set_gencb(srv->http, on_request, px);
    struct evhttp_bound_socket *bound =
        evhttp_bind_socket_with_handle(srv->http, c->admin.host, c->admin.port);
    if (bound == NULL) {
        snprintf(err, errlen, "%s:%u:%u: admin API cannot listen on %s: %s", c->path,
                 c->admin.loc.line, c->admin.loc.col, addr,
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        server_free(srv);
        return NULL;
    }
    srv->evl = evhttp_bound_socket_get_listener(bound);
    evconnlistener_set_error_cb(srv->evl, on_accept_error);
    return srv;
}

static void free_retired(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct proxy *px = arg;
    while (px->admin_retired_n > 0)
        server_free(px->admin_retired[--px->admin_retired_n]);
}

/* Free the server `srv` once the current request (possibly one of its
 * own, e.g. a POST /reload that moved the API) has been answered: freeing
 * it from inside its own callback would take the reply down with it. */
static void retire(struct proxy *px, struct admin_server *srv)
{
    if (px->admin_retired_n == ADMIN_MAX_RETIRED)
        free_retired(-1, 0, px);
    px->admin_retired[px->admin_retired_n++] = srv;
    struct timeval tv = {.tv_sec = 1, .tv_usec = 0};
    event_base_once(px->base, -1, EV_TIMEOUT, free_retired, px, &tv);
}

void admin_stop(struct proxy *px)
{
    free_retired(-1, 0, px);
    server_free(px->admin);
    px->admin = NULL;
}

int admin_apply(struct proxy *px, char *err, size_t errlen)
{
    const struct conf *c = px->conf->conf;
    if (!c->has_admin) {
        if (px->admin != NULL)
            retire(px, px->admin);
        px->admin = NULL;
        return 0;
    }
    char addr[300];
    conf_addr_format(&c->admin, addr, sizeof(addr));
    if (px->admin != NULL && strcmp(addr, px->admin->addr) == 0)
        return 0;
    struct admin_server *srv = server_new(px, c, addr, err, errlen);
    if (srv == NULL)
        return -1;
    if (px->admin != NULL)
        retire(px, px->admin);
    px->admin = srv;
    log_msg(LOG_INFO, "admin listening", "addr=%s auth=%s", addr,
            c->admin_token != NULL ? "bearer" : "none");
    return 0;
}
