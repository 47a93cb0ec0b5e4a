/*
 * rule_changes.c - changes of the rules in force, journaled.  See rule_changes.h.
 *
 * The state after a change is read from the rules in force (px->rules), not told by the
 * caller: a hook is one call where the change is applied, and what the record says is what
 * the next event will be decided by.
 */
#include "proxy/core/rule_changes.h"

#include <event2/http.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "proxy/core/proxy.h"
#include "rules/engine.h"

void rule_changes_sha256(const void *p, size_t n, uint8_t out[32])
{
    unsigned int len = 32;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1)
        memset(out, 0, 32);
}

void rule_changes_file_sha256(const char *path, uint8_t out[32])
{
    memset(out, 0, 32);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1) {
        unsigned char buf[8192];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
            EVP_DigestUpdate(ctx, buf, n);
        unsigned int len = 32;
        EVP_DigestFinal_ex(ctx, out, &len);
    }
    EVP_MD_CTX_free(ctx);
    fclose(f);
}

/* Fills in the rules in force after the change, and journals c. */
static void record(struct proxy *px, struct journal_rules_change *c)
{
    const struct ruleset *rs = px->rules;
    size_t n = rs != NULL ? ruleset_count(rs) : 0;
    c->rules = (uint32_t)n;
    for (size_t i = 0; i < n; i++)
        c->rules_disabled += !ruleset_enabled(rs, i);
    c->faults_off = rs != NULL && !ruleset_faults_enabled(rs);
    memcpy(c->rules_sha256, px->rules_sha256, sizeof(c->rules_sha256));
    journal_rules_changed(px->journal, c);
}

static const char *method_name(enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET:
        return "GET";
    case EVHTTP_REQ_PUT:
        return "PUT";
    case EVHTTP_REQ_POST:
        return "POST";
    case EVHTTP_REQ_DELETE:
        return "DELETE";
    default:
        return "?";
    }
}

/* "ip:port" (IPv6 in brackets) of req's client, or "" when it is not known. */
static void client_of(struct evhttp_request *req, char *buf, size_t len)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    char *host = NULL;
    uint16_t port = 0;
    if (conn != NULL)
        evhttp_connection_get_peer(conn, &host, &port);
    if (host == NULL)
        snprintf(buf, len, "%s", "");
    else
        snprintf(buf, len, strchr(host, ':') != NULL ? "[%s]:%u" : "%s:%u", host, (unsigned)port);
}

void rule_changes_body(struct proxy *px, const char *text, size_t len)
{
    rule_changes_sha256(text, len, px->rules_body_sha256);
}

/* After a one-rule edit (request line `line`): SHA-256 of the digest before, the line, a
 * newline and the body's digest (none for DELETE). */
static void chain(struct proxy *px, const char *line, bool body)
{
    size_t n = strlen(line);
    uint8_t buf[32 + 300 + 1 + 32];
    if (n > 300)
        n = 300;
    memcpy(buf, px->rules_sha256, 32);
    memcpy(buf + 32, line, n);
    buf[32 + n] = '\n';
    if (body)
        memcpy(buf + 32 + n + 1, px->rules_body_sha256, 32);
    rule_changes_sha256(buf, 32 + n + 1 + (body ? 32 : 0), px->rules_sha256);
}

/* The digest that names the rules in force after `change` (request line `line`). */
static void update_digest(struct proxy *px, enum journal_change change, const char *line)
{
    switch (change) {
    case JOURNAL_CHANGE_RELOADED:
        rule_changes_file_sha256(px->conf_path, px->rules_sha256);
        break;
    case JOURNAL_CHANGE_RULES_REPLACED:
        memcpy(px->rules_sha256, px->rules_body_sha256, sizeof(px->rules_sha256));
        break;
    case JOURNAL_CHANGE_RULE_REPLACED:
    case JOURNAL_CHANGE_RULE_ADDED:
        chain(px, line, true);
        break;
    case JOURNAL_CHANGE_RULE_DELETED:
        chain(px, line, false);
        break;
    default: /* a switch: the rules are the same */
        break;
    }
}

void rule_changes_admin(struct proxy *px, struct evhttp_request *req, enum journal_change change,
                        const char *rule)
{
    char client[INET6_ADDRSTRLEN + 16], detail[300];
    client_of(req, client, sizeof(client));
    const char *uri = evhttp_request_get_uri(req);
    snprintf(detail, sizeof(detail), "%s %s", method_name(evhttp_request_get_command(req)),
             uri != NULL ? uri : "");
    update_digest(px, change, detail);
    struct journal_rules_change c = {.change = change,
                                     .source = JOURNAL_SOURCE_ADMIN_API,
                                     .rule = rule,
                                     .client = client,
                                     .detail = detail};
    record(px, &c);
}

void rule_changes_signal(struct proxy *px)
{
    rule_changes_file_sha256(px->conf_path, px->rules_sha256);
    struct journal_rules_change c = {
        .change = JOURNAL_CHANGE_RELOADED, .source = JOURNAL_SOURCE_SIGNAL, .detail = "SIGHUP"};
    record(px, &c);
}
