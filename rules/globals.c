/*
 * globals.c - the top-level settings of the rule engine and its control:
 * `seed`, `journal`, `journal-flush`, `admin`, `admin-token`, `toxiproxy-api` and
 * `toxiproxy-config`.
 *
 * The admin API can change every rule and switch faults off, so an address
 * reachable from the network needs a bearer token: that is an error, not a
 * warning, since a forgotten token in staging is an open door.
 */
#include "rules/diag.h"
#include "rules/interp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* Shortest and longest `admin-token`: short tokens can be guessed. */
#define CONF_ADMIN_TOKEN_MIN 16
#define CONF_ADMIN_TOKEN_MAX 256
/* Room for "host:port" with a bracketed IPv6 host. */
#define CONF_ADMIN_TEXT_BYTES (CONF_HOST_BYTES + 8)

void conf_global_seed(struct conf_parser *p, const struct conf_node *n)
{
    const struct conf_word *w = &n->words[1];
    char shown[CONF_SHOW_BYTES];
    uint64_t v = 0;
    const char *s;

    for (s = w->text; *s >= '0' && *s <= '9'; s++) {
        uint64_t digit = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - digit) / 10) {
            break;
        }
        v = v * 10 + digit;
    }
    if (s == w->text || *s != '\0') {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "a whole number from 0 to 18446744073709551615",
                      "invalid seed '%s'", conf_show(w->text, shown));
        return;
    }
    p->conf->seed = v;
    p->conf->has_seed = true;
}

/* `journal PATH [MODE]`: MODE says what twice does with a file that already holds a journal
 * (refuse to start, the default; append this run; overwrite it). */
void conf_global_journal(struct conf_parser *p, const struct conf_node *n)
{
    const struct conf_word *w = &n->words[1];
    enum conf_journal_mode mode = CONF_JOURNAL_NEW;

    if (n->n_words < 2 || n->n_words > 3) {
        conf_diag_add(p->diags, CONF_ERROR, n->n_words > 3 ? n->words[3].loc : n->words[0].loc,
                      "journal PATH, or journal PATH append, or journal PATH overwrite",
                      "'journal' takes a file path and, optionally, new, append or overwrite");
        return;
    }
    if (w->text[0] == '\0') {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL, "'journal' needs a file path");
        return;
    }
    if (n->n_words == 3) {
        int i = conf_value_enum(p, &n->words[2], "journal mode", conf_journal_mode_names,
                                CONF_JOURNAL_MODES, "new, append or overwrite");
        if (i < 0) {
            return;
        }
        mode = (enum conf_journal_mode)i;
    }
    p->conf->journal = conf_parser_strdup(p, w->text);
    p->conf->journal_mode = mode;
}

/* `journal-flush every-record` (each record written as it comes: a kill loses none) or
 * `journal-flush D` (what was queued is written at least every D). */
void conf_global_journal_flush(struct conf_parser *p, const struct conf_node *n)
{
    static const char *const names[] = {"every-record"};
    const struct conf_word *w = &n->words[1];

    if (w->text[0] >= '0' && w->text[0] <= '9') {
        conf_value_duration(p, w, &p->conf->journal_flush_ms);
        return;
    }
    if (conf_value_enum(p, w, "journal-flush", names, 1,
                        "every-record, or a duration such as 200ms") == 0) {
        p->conf->journal_every_record = true;
    }
}

void conf_journal_finish(struct conf_parser *p, struct conf_loc flush_at)
{
    if (flush_at.line != 0 && p->conf->journal == NULL) {
        conf_diag_add(p->diags, CONF_WARNING, flush_at, NULL,
                      "journal-flush has no effect without journal");
    }
}

/* Whether `text` has a host and a port, as "[v6]:port" or "host:port". */
static bool conf_has_host_and_port(const char *text)
{
    const char *colon;

    if (text[0] == '[') {
        colon = strchr(text, ']');
        return colon != NULL && colon > text + 1 && colon[1] == ':' && colon[2] != '\0';
    }
    colon = strrchr(text, ':');
    return colon != NULL && colon != text && colon[1] != '\0';
}

/* An HTTP API's `KEYWORD HOST:PORT` into *addr, *has set when it is one. */
static void conf_global_api(struct conf_parser *p, const struct conf_node *n,
                            struct conf_addr *addr, bool *has)
{
    const struct conf_word *w = &n->words[1];

    /* conf_value_bind would say 'bind' in this message: say the keyword. */
    if (!conf_has_host_and_port(w->text)) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                      "'%s' needs HOST:PORT, e.g. 127.0.0.1:8474", n->words[0].text);
        return;
    }
    if (conf_value_bind(p, w, addr)) {
        *has = true;
    }
}

void conf_global_admin(struct conf_parser *p, const struct conf_node *n)
{
    conf_global_api(p, n, &p->conf->admin, &p->conf->has_admin);
}

void conf_global_admin_token(struct conf_parser *p, const struct conf_node *n)
{
    const struct conf_word *w = &n->words[1];
    size_t len = strlen(w->text);

    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)w->text[i] <= ' ' || (unsigned char)w->text[i] >= 0x7f) {
            conf_diag_add(p->diags, CONF_ERROR, w->loc, NULL,
                          "admin-token must be printable ASCII with no blanks");
            return;
        }
    }
    if (len < CONF_ADMIN_TOKEN_MIN || len > CONF_ADMIN_TOKEN_MAX) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "e.g. the output of: openssl rand -hex 24",
                      "admin-token must be %d to %d characters long, not %zu", CONF_ADMIN_TOKEN_MIN,
                      CONF_ADMIN_TOKEN_MAX, len);
        return;
    }
    p->conf->admin_token = conf_parser_strdup(p, w->text);
}

/* `user NAME`: the account twice switches to once its sockets are bound (a
 * login name: letters, digits, '.', '_', '-', at most 32 bytes).  Whether it
 * exists is checked at start, not here: `twice check` runs anywhere. */
/* Whether `text` is a name of 1 to `max` bytes of letters, digits, '.', '_', '-' and the
 * characters of `extra`, not starting with '-'. */
static bool conf_name_ok(const char *text, size_t max, const char *extra)
{
    size_t len = strlen(text);
    bool ok = len >= 1 && len <= max && text[0] != '-';
    for (size_t i = 0; ok && i < len; i++) {
        char c = text[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-' || strchr(extra, c) != NULL;
    }
    return ok;
}

void conf_global_user(struct conf_parser *p, const struct conf_node *n)
{
    const struct conf_word *w = &n->words[1];
    char shown[CONF_SHOW_BYTES];
    if (!conf_name_ok(w->text, 32, "")) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "a login name, e.g. user twice",
                      "invalid user name '%s'", conf_show(w->text, shown));
        return;
    }
    p->conf->user = conf_parser_strdup(p, w->text);
}

/* `instance NAME`: letters, digits, '.', '_', '-' and ':', at most CONF_INSTANCE_MAX bytes (a
 * host name, a pod name, "zone-a:pool-1"), as it goes into the journal's header and the
 * output of twice report and twice verdict. */
void conf_global_instance(struct conf_parser *p, const struct conf_node *n)
{
    const struct conf_word *w = &n->words[1];
    char shown[CONF_SHOW_BYTES];
    if (!conf_name_ok(w->text, CONF_INSTANCE_MAX, ":")) {
        conf_diag_add(p->diags, CONF_ERROR, w->loc, "e.g. instance zone-a",
                      "invalid instance name '%s': letters, digits, '.', '_', '-' and ':', at "
                      "most %d bytes",
                      conf_show(w->text, shown), CONF_INSTANCE_MAX);
        return;
    }
    p->conf->instance = conf_parser_strdup(p, w->text);
}

/* Whether the canonical address `host` is a loopback address. */
static bool conf_is_loopback(const char *host)
{
    struct in_addr v4;
    struct in6_addr v6;

    if (inet_pton(AF_INET, host, &v4) == 1) {
        return ntohl(v4.s_addr) >> 24 == 127;
    }
    if (inet_pton(AF_INET6, host, &v6) != 1) {
        return false;
    }
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
}

/* An HTTP API (`what`, at `api`) on a listener's address, or on one a wildcard takes. */
static void conf_api_check_listeners(struct conf_parser *p, const struct conf_addr *api,
                                     const char *what, const char *addr)
{
    char shown[CONF_SHOW_BYTES], bind[CONF_ADMIN_TEXT_BYTES];

    for (const struct conf_listener *l = p->conf->listeners; l != NULL; l = l->next) {
        if (!conf_binds_clash(api, &l->bind)) {
            continue;
        }
        conf_addr_format(&l->bind, bind, sizeof(bind));
        if (strcmp(addr, bind) == 0) {
            conf_diag_add(p->diags, CONF_ERROR, api->loc, NULL,
                          "%s on %s, already bound by listener '%s' at %u:%u", what, addr,
                          conf_show(l->name, shown), l->bind.loc.line, l->bind.loc.col);
        } else {
            conf_diag_add(p->diags, CONF_ERROR, api->loc,
                          "a wildcard address (0.0.0.0, *, [::]) takes its port on every "
                          "address: only one of them can listen",
                          "%s on %s clashes with %s of listener '%s' at %u:%u", what, addr, bind,
                          conf_show(l->name, shown), l->bind.loc.line, l->bind.loc.col);
        }
        return;
    }
}

/* An HTTP API off loopback needs the token; it may not take a listener's port. */
static void conf_api_check(struct conf_parser *p, const struct conf_addr *api, const char *what,
                           struct conf_loc token_at)
{
    char addr[CONF_ADMIN_TEXT_BYTES];

    conf_addr_format(api, addr, sizeof(addr));
    /* A token written but invalid is reported already: no second error here. */
    if (token_at.line == 0 && !conf_is_loopback(api->host)) {
        conf_diag_add(p->diags, CONF_ERROR, api->loc, NULL,
                      "%s on %s is reachable from the network: set admin-token", what, addr);
    }
    conf_api_check_listeners(p, api, what, addr);
}

/* `toxiproxy-api HOST:PORT`: Toxiproxy's HTTP API, under the admin API's rule. */
void conf_global_toxiproxy_api(struct conf_parser *p, const struct conf_node *n)
{
    conf_global_api(p, n, &p->conf->toxiproxy_api, &p->conf->has_toxiproxy_api);
}

/* `toxiproxy-config FILE`: read by the program at start (rules/ opens no file). */
void conf_global_toxiproxy_config(struct conf_parser *p, const struct conf_node *n)
{
    p->conf->toxiproxy_config = conf_parser_strdup(p, n->words[1].text);
}

void conf_globals_finish(struct conf_parser *p, struct conf_loc token_at)
{
    const struct conf *c = p->conf;

    if (c->has_toxiproxy_api) {
        conf_api_check(p, &c->toxiproxy_api, "Toxiproxy API", token_at);
        if (c->has_admin && conf_binds_clash(&c->admin, &c->toxiproxy_api)) {
            conf_diag_add(p->diags, CONF_ERROR, c->toxiproxy_api.loc, NULL,
                          "Toxiproxy API on the admin API's address: give it its own port");
        }
    }
    if (!c->has_admin) {
        if (token_at.line != 0 && !c->has_toxiproxy_api) {
            conf_diag_add(p->diags, CONF_WARNING, token_at, NULL,
                          "admin-token has no effect without admin");
        }
        return;
    }
    conf_api_check(p, &c->admin, "admin API", token_at);
}
