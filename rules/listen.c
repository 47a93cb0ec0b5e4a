/*
 * listen.c - the inside of `listen NAME { ... }` blocks.
 *
 * Every directive of a listen block is single-valued, so each keeps the
 * position where it was first set: for "duplicate" errors and to tell
 * whether a required one was written at all.  Checks that depend on more than
 * one directive (profile vs protocol) run after the whole block, so the
 * order of directives inside the block never matters.
 */
#include "proto/jobs/framework.h"
#include "rules/diag.h"
#include "rules/interp.h"
#include "rules/rule_parse.h"

#include "rules/conf_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Most profiles the registry may hold for the names `profile` takes. */
#define CONF_MAX_PROFILES 32
/* Room for "host:port" with a bracketed IPv6 host or a long DNS name. */
#define CONF_ADDR_TEXT_BYTES (CONF_HOST_BYTES + 8)

enum conf_listen_slot {
    CONF_L_PROTOCOL = 0,
    CONF_L_PROFILE,
    CONF_L_BIND,
    CONF_L_UPSTREAM,
    CONF_L_CONNECT_TIMEOUT,
    CONF_L_IDLE_TIMEOUT,
    CONF_L_MAX_CONNECTIONS,
    CONF_L_MAX_MESSAGE_SIZE,
    CONF_L_MAX_HELD,
    CONF_L_VISIBILITY_TIMEOUT,
    CONF_L_CONSUMER_TIMEOUT,
    CONF_L_TLS,
    CONF_L_UPSTREAM_TLS,
    CONF_L_MESSAGE_ID,
    CONF_L_TASK,
    CONF_L_COUNT,
};

const char *const conf_listen_keywords[CONF_L_COUNT] = {
    "protocol",           "profile",          "bind",
    "upstream",           "connect-timeout",  "idle-timeout",
    "max-connections",    "max-message-size", "max-held",
    "visibility-timeout", "consumer-timeout", "tls",
    "upstream-tls",       "message-id",       "task",
};
const size_t conf_n_listen_keywords = CONF_L_COUNT;

struct conf_listen_state {
    struct conf_listener *l;
    struct conf_loc first[CONF_L_COUNT]; /* line 0: not written */
    bool protocol_ok;                    /* l->protocol was set from the file */
    struct conf_loc profile_loc;         /* of a valid `profile`, line 0 if none */
    struct conf_loc timeout_loc;         /* of a valid visibility or consumer timeout */
};

struct conf_listen_directive {
    struct conf_dirspec spec;
    void (*fn)(struct conf_parser *p, struct conf_listen_state *ls, const struct conf_node *n);
};

/* What users write for a protocol when they name the broker or a framework: the protocol
 * twice calls it, and why. */
static const struct {
    const char *word, *protocol, *why;
} conf_protocol_aliases[] = {
    {"rabbitmq", "amqp", "RabbitMQ speaks AMQP 0-9-1"},
    {"rabbit", "amqp", "RabbitMQ speaks AMQP 0-9-1"},
    {"amqps", "amqp", "AMQP over TLS: add 'upstream-tls'"},
    {"redis", "resp", "Redis speaks RESP"},
    {"rediss", "resp", "RESP over TLS: add 'upstream-tls'"},
    {"valkey", "resp", "Valkey speaks RESP"},
    {"keydb", "resp", "KeyDB speaks RESP"},
    {"dragonfly", "resp", "Dragonfly speaks RESP"},
};

/* The hint for an unknown protocol word: an alias's protocol, a framework's profile, else
 * "did you mean" over the protocols; into buf (RULE_LIST_BYTES). */
static const char *conf_protocol_hint(const char *word, const char *const *names, size_t n,
                                      char *buf)
{
    for (size_t i = 0; i < sizeof(conf_protocol_aliases) / sizeof(conf_protocol_aliases[0]); i++) {
        if (strcasecmp(word, conf_protocol_aliases[i].word) == 0) {
            snprintf(buf, RULE_LIST_BYTES, "did you mean '%s'? %s",
                     conf_protocol_aliases[i].protocol, conf_protocol_aliases[i].why);
            return buf;
        }
    }
    for (size_t i = 0; i < resp_framework_count(); i++) {
        const char *profile = resp_framework_at(i)->name;
        if (strcasecmp(word, profile) == 0) {
            snprintf(buf, RULE_LIST_BYTES,
                     "did you mean 'protocol resp' with 'profile %s'? a job framework on Redis "
                     "(on RabbitMQ: 'protocol amqp')",
                     profile);
            return buf;
        }
    }
    return conf_hint_suggest(word, names, n, buf, "expected tcp, amqp or resp");
}

static void conf_listen_protocol(struct conf_parser *p, struct conf_listen_state *ls,
                                 const struct conf_node *n)
{
    static const char *const names[] = {"tcp", "amqp", "resp"};
    const size_t n_names = sizeof(names) / sizeof(names[0]);
    const struct conf_word *w = &n->words[1];
    char shown[CONF_SHOW_BYTES], hint[RULE_LIST_BYTES];

    for (size_t i = 0; i < n_names; i++) {
        if (strcmp(w->text, names[i]) == 0) {
            ls->l->protocol = (enum conf_protocol)i;
            ls->protocol_ok = true;
            return;
        }
    }
    conf_diag_add(p->diags, CONF_ERROR, w->loc, conf_protocol_hint(w->text, names, n_names, hint),
                  "unknown protocol '%s'", conf_show(w->text, shown));
}

/* The profiles, as the registry of framework modules lists them (proto/jobs/framework.h). */
static size_t conf_profile_names(const char **names, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < resp_framework_count() && n < cap; i++) {
        names[n++] = resp_framework_at(i)->name;
    }
    return n;
}

static void conf_listen_profile(struct conf_parser *p, struct conf_listen_state *ls,
                                const struct conf_node *n)
{
    const char *names[CONF_MAX_PROFILES];
    size_t n_names = conf_profile_names(names, CONF_MAX_PROFILES);
    char list[RULE_LIST_BYTES], expected[RULE_LIST_BYTES + 32];

    snprintf(expected, sizeof(expected), "expected one of: %s",
             rule_join_names(names, n_names, list));
    int i = conf_value_enum(p, &n->words[1], "profile", names, n_names, expected);

    if (i >= 0) {
        ls->l->profile = conf_parser_strdup(p, names[i]);
        ls->profile_loc = n->words[0].loc;
    }
}

static void conf_listen_bind(struct conf_parser *p, struct conf_listen_state *ls,
                             const struct conf_node *n)
{
    conf_value_bind(p, &n->words[1], &ls->l->bind);
}

static void conf_listen_upstream(struct conf_parser *p, struct conf_listen_state *ls,
                                 const struct conf_node *n)
{
    conf_value_upstream(p, &n->words[1], &ls->l->upstream);
}

/* `max-message-size SIZE`: the largest message a session may carry (an AMQP
 * content body, a RESP bulk string); a bigger one ends the session. */
static void conf_listen_max_message(struct conf_parser *p, struct conf_listen_state *ls,
                                    const struct conf_node *n)
{
    rule_value_bytes(p, &n->words[1], false, &ls->l->max_message);
}

/* `max-held SIZE`: bytes of delayed frames one session may hold per direction. */
static void conf_listen_max_held(struct conf_parser *p, struct conf_listen_state *ls,
                                 const struct conf_node *n)
{
    rule_value_bytes(p, &n->words[1], false, &ls->l->max_held);
}

/* `visibility-timeout D` and `consumer-timeout D` (amqp): a delivery whose ack has not reached
 * the broker D after it was delivered comes back, as from SQS (that message alone) or from
 * RabbitMQ's consumer_timeout (the channel closes with 406). */
static void conf_listen_timeout(struct conf_parser *p, struct conf_listen_state *ls,
                                const struct conf_node *n, bool consumer)
{
    uint32_t ms = 0;
    if (!conf_value_duration(p, &n->words[1], &ms)) /* refuses 0 */
        return;
    if (ls->timeout_loc.line != 0) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc,
                      "a delivery comes back one way: keep one of them",
                      "'visibility-timeout' and 'consumer-timeout' exclude each other (the "
                      "other is at %u:%u)",
                      ls->timeout_loc.line, ls->timeout_loc.col);
        return;
    }
    ls->timeout_loc = n->words[0].loc;
    ls->l->visibility_ms = ms;
    ls->l->consumer_timeout = consumer;
}

static void conf_listen_visibility(struct conf_parser *p, struct conf_listen_state *ls,
                                   const struct conf_node *n)
{
    conf_listen_timeout(p, ls, n, false);
}

static void conf_listen_consumer_timeout(struct conf_parser *p, struct conf_listen_state *ls,
                                         const struct conf_node *n)
{
    conf_listen_timeout(p, ls, n, true);
}

static void conf_listen_connect_timeout(struct conf_parser *p, struct conf_listen_state *ls,
                                        const struct conf_node *n)
{
    /* 0 stays "not set" until conf_listen_finish applies the global value. */
    conf_value_duration(p, &n->words[1], &ls->l->connect_timeout_ms);
}

static void conf_listen_idle_timeout(struct conf_parser *p, struct conf_listen_state *ls,
                                     const struct conf_node *n)
{
    conf_value_duration(p, &n->words[1], &ls->l->idle_timeout_ms);
}

static void conf_listen_max_connections(struct conf_parser *p, struct conf_listen_state *ls,
                                        const struct conf_node *n)
{
    conf_value_max_connections(p, &n->words[1], &ls->l->max_connections);
}

static void conf_listen_tls(struct conf_parser *p, struct conf_listen_state *ls,
                            const struct conf_node *n)
{
    conf_tls_server_directive(p, ls->l, n);
}

static void conf_listen_upstream_tls(struct conf_parser *p, struct conf_listen_state *ls,
                                     const struct conf_node *n)
{
    conf_tls_client_directive(p, ls->l, n);
}

/* `message-id SOURCE...` and `task SOURCE...`: where an app keeps its messages' ids and task
 * names (proto/jobs/msg_field.h), tried in order. */
static void conf_listen_fields(struct conf_parser *p, const struct conf_node *n,
                               struct msg_fields *fs)
{
    size_t n_args = n->n_words - 1;
    fs->n = 0;
    if (n_args == 0 || n_args > MSG_FIELD_MAX_SOURCES) {
        conf_diag_add(p->diags, CONF_ERROR,
                      n_args == 0 ? n->words[0].loc : n->words[MSG_FIELD_MAX_SOURCES + 1].loc,
                      "e.g. `task header.__TypeId__ property.type`",
                      "'%s' takes 1 to %u sources, tried in order", n->words[0].text,
                      MSG_FIELD_MAX_SOURCES);
        return;
    }
    for (size_t i = 0; i < n_args; i++) {
        char why[256];
        if (msg_field_parse(n->words[i + 1].text, &fs->src[fs->n], why, sizeof(why)) != 0) {
            conf_diag_add(p->diags, CONF_ERROR, n->words[i + 1].loc, NULL, "%s", why);
            continue;
        }
        fs->n++;
    }
}

static void conf_listen_message_id(struct conf_parser *p, struct conf_listen_state *ls,
                                   const struct conf_node *n)
{
    conf_listen_fields(p, n, &ls->l->message_id);
}

static void conf_listen_task(struct conf_parser *p, struct conf_listen_state *ls,
                             const struct conf_node *n)
{
    conf_listen_fields(p, n, &ls->l->task);
}

/* Indexed by enum conf_listen_slot. */
static const struct conf_listen_directive conf_listen_table[CONF_L_COUNT] = {
    {{"protocol", 1, "tcp, amqp or resp"}, conf_listen_protocol},
    {{"profile", 1, "NAME, a job framework (e.g. celery)"}, conf_listen_profile},
    {{"bind", 1, "HOST:PORT"}, conf_listen_bind},
    {{"upstream", 1, "HOST:PORT"}, conf_listen_upstream},
    {{"connect-timeout", 1, "DURATION"}, conf_listen_connect_timeout},
    {{"idle-timeout", 1, "DURATION"}, conf_listen_idle_timeout},
    {{"max-connections", 1, "N"}, conf_listen_max_connections},
    {{"max-message-size", 1, "SIZE"}, conf_listen_max_message},
    {{"max-held", 1, "SIZE"}, conf_listen_max_held},
    {{"visibility-timeout", 1, "DURATION"}, conf_listen_visibility},
    {{"consumer-timeout", 1, "DURATION"}, conf_listen_consumer_timeout},
    {{"tls", -1, "cert FILE key FILE"}, conf_listen_tls},
    {{"upstream-tls", -1, "[verify | no-verify] [ca FILE] [sni NAME] [cert FILE key FILE]"},
     conf_listen_upstream_tls},
    {{"message-id", -1, "SOURCE... (property.NAME, header.NAME, routing-key, body.json.PATH...)"},
     conf_listen_message_id},
    {{"task", -1, "SOURCE... (property.NAME, header.NAME, routing-key, body.json.PATH...)"},
     conf_listen_task},
};

static const struct conf_listen_directive *conf_find_listen_directive(const char *name)
{
    for (size_t i = 0; i < CONF_L_COUNT; i++) {
        if (strcmp(conf_listen_table[i].spec.name, name) == 0) {
            return &conf_listen_table[i];
        }
    }
    return NULL;
}

static void conf_listen_block(struct conf_parser *p, struct conf_listen_state *ls,
                              const struct conf_node *block)
{
    for (const struct conf_node *n = block; n != NULL && !p->oom; n = n->next) {
        const struct conf_listen_directive *d = conf_find_listen_directive(n->words[0].text);
        if (d == NULL) {
            conf_unknown_directive(p, n, conf_listen_keywords, conf_n_listen_keywords,
                                   conf_global_keywords, conf_n_global_keywords,
                                   "'%s' belongs at the top level, outside listen blocks");
            continue;
        }
        if (conf_check_duplicate(p, n, &ls->first[d - conf_listen_table]) &&
            conf_check_shape(p, n, &d->spec)) {
            d->fn(p, ls, n);
        }
    }
}

/* On a Redis list a job is its payload alone: only body.json sources can be read there. */
static void conf_listen_list_fields(struct conf_parser *p, const struct conf_listen_state *ls,
                                    int slot)
{
    const struct msg_fields *fs = slot == CONF_L_MESSAGE_ID ? &ls->l->message_id : &ls->l->task;
    for (size_t i = 0; i < fs->n; i++)
        if (fs->src[i].kind != MSG_FIELD_BODY_JSON)
            conf_diag_add(p->diags, CONF_ERROR, ls->first[slot],
                          "a job on a Redis list is its payload alone: use body.json.PATH "
                          "(e.g. body.json.uuid)",
                          "'%s' source '%s' is an AMQP one", conf_listen_keywords[slot],
                          fs->src[i].text);
}

/* Checks over the whole block: required directives, profile vs protocol. */
static void conf_listen_check_block(struct conf_parser *p, const struct conf_listen_state *ls)
{
    static const enum conf_listen_slot required[] = {CONF_L_PROTOCOL, CONF_L_BIND, CONF_L_UPSTREAM};
    char shown[CONF_SHOW_BYTES];

    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        if (ls->first[required[i]].line == 0) {
            conf_diag_add(p->diags, CONF_ERROR, ls->l->loc, NULL, "listener '%s' has no '%s'",
                          conf_show(ls->l->name, shown), conf_listen_keywords[required[i]]);
        }
    }
    if (ls->profile_loc.line != 0 && ls->protocol_ok && ls->l->protocol != CONF_PROTO_RESP) {
        conf_diag_add(p->diags, CONF_ERROR, ls->profile_loc, NULL,
                      "'profile' applies only to protocol resp");
    }
    bool list = ls->l->profile != NULL && strcmp(ls->l->profile, "list") == 0;
    for (int slot = CONF_L_MESSAGE_ID; slot <= CONF_L_TASK; slot++) {
        if (ls->first[slot].line == 0 || !ls->protocol_ok || ls->l->protocol == CONF_PROTO_AMQP)
            continue;
        if (ls->l->protocol == CONF_PROTO_RESP && list) {
            conf_listen_list_fields(p, ls, slot);
            continue;
        }
        conf_diag_add(p->diags, CONF_ERROR, ls->first[slot],
                      ls->l->protocol == CONF_PROTO_RESP
                          ? "Sidekiq's, Celery's, RQ's and a stream's jobs name their ids and "
                            "tasks themselves; 'profile list' reads any app's from body.json "
                            "sources"
                          : NULL,
                      "'%s' applies only to protocol amqp and to 'profile list'",
                      conf_listen_keywords[slot]);
    }
    if (ls->timeout_loc.line != 0 && ls->protocol_ok && ls->l->protocol != CONF_PROTO_AMQP) {
        conf_diag_add(p->diags, CONF_ERROR, ls->timeout_loc,
                      "a Redis transport has its own (kombu's visibility_timeout, a stream's "
                      "XAUTOCLAIM min-idle-time): `expire D` rules act on it",
                      "'%s' applies only to protocol amqp",
                      ls->l->consumer_timeout ? "consumer-timeout" : "visibility-timeout");
    }
}

/* The hint for binds `a` and `b` that clash without being written alike:
 * which wildcard takes the other (NULL: an IPv4-mapped address, no wildcard). */
static const char *conf_clash_hint(const struct conf_addr *a, const struct conf_addr *b)
{
    if (strcmp(a->host, "::") == 0 || strcmp(b->host, "::") == 0) {
        return "[::] takes its port on every address, IPv4 too (Linux's default "
               "net.ipv6.bindv6only=0): only one of them can listen";
    }
    if (strcmp(a->host, "0.0.0.0") == 0 || strcmp(b->host, "0.0.0.0") == 0) {
        return "0.0.0.0 (or *) takes its port on every IPv4 address: only one of them can "
               "listen";
    }
    return NULL;
}

/* Report that `l` binds an address that listener `o`'s bind already takes. */
static void conf_listen_clash(struct conf_parser *p, const struct conf_listener *l,
                              const struct conf_listener *o)
{
    char shown[CONF_SHOW_BYTES], other[CONF_SHOW_BYTES];
    char addr[CONF_ADDR_TEXT_BYTES], taken[CONF_ADDR_TEXT_BYTES];

    conf_addr_format(&l->bind, addr, sizeof(addr));
    conf_addr_format(&o->bind, taken, sizeof(taken));
    if (strcmp(addr, taken) == 0) {
        conf_diag_add(p->diags, CONF_ERROR, l->bind.loc, NULL,
                      "listener '%s' binds %s, already bound by listener '%s' at %u:%u",
                      conf_show(l->name, shown), addr, conf_show(o->name, other), o->bind.loc.line,
                      o->bind.loc.col);
        return;
    }
    conf_diag_add(p->diags, CONF_ERROR, l->bind.loc, conf_clash_hint(&l->bind, &o->bind),
                  "listener '%s' binds %s, which clashes with %s of listener '%s' at %u:%u",
                  conf_show(l->name, shown), addr, taken, conf_show(o->name, other),
                  o->bind.loc.line, o->bind.loc.col);
}

/* Report a listener whose name or bind address an earlier one already has. */
static void conf_listen_check_unique(struct conf_parser *p, const struct conf_listener *l,
                                     const struct conf_word *name)
{
    char shown[CONF_SHOW_BYTES];
    bool name_reported = false, bind_reported = false;

    for (const struct conf_listener *o = p->conf->listeners; o != l; o = o->next) {
        if (!name_reported && strcmp(o->name, l->name) == 0) {
            conf_diag_add(p->diags, CONF_ERROR, name->loc, NULL,
                          "listener '%s' is already defined at %u:%u", conf_show(l->name, shown),
                          o->loc.line, o->loc.col);
            name_reported = true;
        }
        if (!bind_reported && conf_binds_clash(&l->bind, &o->bind)) {
            conf_listen_clash(p, l, o);
            bind_reported = true;
        }
    }
}

/* Check the words and block of `listen`; returns the NAME word, or NULL when
 * there is nothing to interpret. */
static const struct conf_word *conf_listen_shape(struct conf_parser *p, const struct conf_node *n)
{
    size_t n_args = n->n_words - 1;

    if (n_args != 1) {
        conf_diag_add(p->diags, CONF_ERROR, n_args > 1 ? n->words[2].loc : n->words[0].loc, NULL,
                      "'listen' takes one argument: NAME");
    }
    if (!n->has_block) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, NULL,
                      "'listen' needs a block: listen NAME { ... }");
        return NULL;
    }
    if (n_args == 0) {
        return NULL;
    }
    if (p->conf->n_listeners >= CONF_MAX_LISTENERS) {
        conf_diag_add(p->diags, CONF_ERROR, n->words[0].loc, NULL,
                      "too many listeners (at most %d)", CONF_MAX_LISTENERS);
        return NULL;
    }
    conf_value_name(p, &n->words[1], "listener");
    return &n->words[1];
}

void conf_listen_directive(struct conf_parser *p, const struct conf_node *n)
{
    struct conf_listen_state ls = {0};
    const struct conf_word *name;

    p->n_listen++;
    name = conf_listen_shape(p, n);
    if (name == NULL) {
        return;
    }
    ls.l = conf_mem_calloc(1, sizeof(*ls.l));
    if (ls.l == NULL || (ls.l->name = conf_mem_strdup(name->text)) == NULL) {
        free(ls.l);
        conf_parser_oom(p);
        return;
    }
    ls.l->loc = n->words[0].loc;
    *p->listeners_tail = ls.l;
    p->listeners_tail = &ls.l->next;
    p->conf->n_listeners++;
    conf_listen_block(p, &ls, n->children);
    if (!p->oom) {
        conf_listen_check_block(p, &ls);
        conf_listen_check_unique(p, ls.l, name);
    }
}

/* Report that listener `l`'s upstream reaches twice itself: the bind of listener `o` (maybe
 * `l`), or the admin API's when `o` is NULL. */
static void conf_listen_loop(struct conf_parser *p, const struct conf_listener *l,
                             const struct conf_listener *o)
{
    static const char *const hint =
        "upstream names the broker; to combine faults, put several rules on one listener";
    char shown[CONF_SHOW_BYTES], other[CONF_SHOW_BYTES];
    char up[CONF_ADDR_TEXT_BYTES], bind[CONF_ADDR_TEXT_BYTES];
    const struct conf_addr *b = o != NULL ? &o->bind : &p->conf->admin;

    conf_addr_format(&l->upstream, up, sizeof(up));
    conf_addr_format(b, bind, sizeof(bind));
    if (o == l) {
        conf_diag_add(p->diags, CONF_ERROR, l->upstream.loc, hint,
                      "listener '%s' would connect to itself: upstream %s reaches its own bind %s "
                      "at %u:%u",
                      conf_show(l->name, shown), up, bind, b->loc.line, b->loc.col);
    } else if (o != NULL) {
        conf_diag_add(p->diags, CONF_ERROR, l->upstream.loc, hint,
                      "listener '%s' would connect to twice itself: upstream %s reaches listener "
                      "'%s' (bind %s at %u:%u)",
                      conf_show(l->name, shown), up, conf_show(o->name, other), bind, b->loc.line,
                      b->loc.col);
    } else {
        conf_diag_add(p->diags, CONF_ERROR, l->upstream.loc, hint,
                      "listener '%s' would connect to twice itself: upstream %s reaches the admin "
                      "API (admin %s at %u:%u)",
                      conf_show(l->name, shown), up, bind, b->loc.line, b->loc.col);
    }
}

/* Whether a connection to `host`:`port` reaches one of twice's own sockets; reported. */
static bool conf_listen_check_target(struct conf_parser *p, const struct conf_listener *l,
                                     const char *host, uint16_t port)
{
    for (const struct conf_listener *o = p->conf->listeners; o != NULL; o = o->next) {
        if (conf_bind_takes(&o->bind, host, port, false)) {
            conf_listen_loop(p, l, o);
            return true;
        }
    }
    if (p->conf->has_admin && conf_bind_takes(&p->conf->admin, host, port, false)) {
        conf_listen_loop(p, l, NULL);
        return true;
    }
    return false;
}

/* An upstream that is twice itself: each connection would make another, until every
 * descriptor is taken.  A literal address is checked here (and again at run time, with the
 * host's other addresses), `localhost` as both loopback addresses; other names only at run
 * time, once resolved (proxy/net/session_connect.c). */
static void conf_listen_check_loop(struct conf_parser *p, const struct conf_listener *l)
{
    const char *host = l->upstream.host;

    if (host == NULL) {
        return;
    }
    if (strcasecmp(host, "localhost") == 0) {
        if (!conf_listen_check_target(p, l, "127.0.0.1", l->upstream.port)) {
            conf_listen_check_target(p, l, "::1", l->upstream.port);
        }
        return;
    }
    conf_listen_check_target(p, l, host, l->upstream.port);
}

void conf_listen_finish(struct conf_parser *p)
{
    for (struct conf_listener *l = p->conf->listeners; l != NULL; l = l->next) {
        if (l->connect_timeout_ms == 0) {
            l->connect_timeout_ms = p->conf->connect_timeout_ms;
        }
        conf_listen_check_loop(p, l);
    }
}
