/*
 * toxi.c - Toxiproxy 2.x's HTTP API over twice's listeners.  See toxi.h.
 *
 * State lives on the main thread: the proxies (a listener each while enabled) and their
 * toxics, kept as JSON-ready values.  What sessions need of a proxy's stream toxics is an
 * immutable snapshot (struct toxi_toxics) that the listener points at under `toxi_lock`; a
 * change makes a new snapshot and tells every loop (loop_listener_sessions_all), whose sessions
 * of that listener take it at once.  A message toxic is a rule, put in the rule set next to the
 * file's (toxi_sync_rules).  Answers and errors have Toxiproxy's shapes (api.go): errors are
 * {"error":MSG,"status":CODE} and a newline, as text/plain, as Go's http.Error sends them.
 */
#include "proxy/api/toxi.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "proto/base/utf8.h"
#include "proxy/api/admin.h"
#include "proxy/core/conf_file.h"
#include "proxy/core/log.h"
#include "proxy/core/proxy.h"
#include "proxy/net/session.h"
#include "rules/engine.h"
#include "rules/interp.h"

#include "rules/toxic_msg.h"

/* Longest path segment (a proxy's or a toxic's name, decoded) a route takes. */
#define TOXI_SEG_MAX 256
/* How answers are printed: compact, members in the order made, reals in 9 digits (a float32's
 * shortest form: toxicity 0.2 is "0.2", as Go prints it). */
#define TOXI_JSON_FLAGS (JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9))
/* Largest request body the API takes (a /populate of many proxies). */
#define TOXI_MAX_BODY (1u << 20)
/* What GET /version says: Toxiproxy's API version, and twice's. */
#define TOXI_VERSION "2.12.0+twice." TWICE_VERSION

/* Guards every listener's `toxics` pointer: sessions of any loop read it. */
static pthread_mutex_t toxi_lock = PTHREAD_MUTEX_INITIALIZER;

struct toxi_toxic {
    char name[72];
    char type[32];
    char stream[16]; /* as the client wrote it (Toxiproxy keeps its spelling) */
    bool downstream;
    double toxicity;       /* as float32, Toxiproxy's type */
    struct toxic_stream t; /* a stream toxic's attributes */
    json_t *attributes;    /* a message toxic's, as given; NULL for a stream toxic */
    struct rule *rule;     /* a message toxic's rule (PROXY.TOXIC) */
    struct toxi_toxic *next;
};

struct toxi_proxy {
    char name[72];
    char listen[300]; /* as asked, or as bound once enabled */
    char upstream[300];
    bool enabled;
    enum conf_protocol protocol;
    char profile[32];
    struct listener *l;        /* while enabled */
    struct toxi_toxic *toxics; /* upstream ones and downstream ones, each in the order added */
    struct toxi_proxy *next;
};

struct toxi {
    struct proxy *px;
    struct evhttp *http;
    struct evconnlistener *evl;
    struct event *retry;
    char addr[300];
    struct toxi_proxy *proxies;
    uint64_t request_id;
    bool config_read;
    char **installed; /* names of the message toxics' rules in the rule set now */
    size_t n_installed;
};

/* ---- snapshots of stream toxics (any thread) ------------------------------------------ */

void toxi_toxics_put(struct toxi_toxics *tt)
{
    if (tt != NULL && atomic_fetch_sub(&tt->refs, 1) == 1)
        free(tt);
}

void toxi_session_fx(struct session *s, struct stream_fx fx[2])
{
    if (s->rule_fx == NULL) {
        s->rule_fx = malloc(2 * sizeof(*s->rule_fx));
        if (s->rule_fx == NULL)
            return; /* the connection keeps its rules' faults, without the toxics */
        memcpy(s->rule_fx, fx, 2 * sizeof(*fx));
    }
    memcpy(fx, s->rule_fx, 2 * sizeof(*fx));
    pthread_mutex_lock(&toxi_lock);
    struct toxi_toxics *tt = s->listener->toxics;
    if (tt != NULL)
        atomic_fetch_add(&tt->refs, 1);
    pthread_mutex_unlock(&toxi_lock);
    if (s->toxics != NULL)
        toxi_toxics_put(s->toxics);
    s->toxics = tt;
    char identity[32];
    snprintf(identity, sizeof(identity), "session:%llu", (unsigned long long)s->id);
    for (size_t i = 0; tt != NULL && i < tt->n; i++) {
        const struct toxi_stream_toxic *x = &tt->t[i];
        /* Toxiproxy draws per connection and direction: the coin of (seed, toxic, session). */
        if (x->toxicity < 1.0 && engine_coin(tt->seed, x->rule, identity, 0) >= x->toxicity)
            continue;
        stream_plan_add_toxic(&x->t, x->rule, &fx[x->downstream ? SIDE_UPSTREAM : SIDE_CLIENT]);
    }
}

/* A new snapshot of p's stream toxics for its listener; its sessions take it now. */
static void publish_toxics(struct toxi *tx, struct toxi_proxy *p)
{
    if (p->l == NULL)
        return;
    size_t n = 0;
    for (const struct toxi_toxic *t = p->toxics; t != NULL; t = t->next)
        n += t->attributes == NULL;
    struct toxi_toxics *tt = calloc(1, sizeof(*tt) + n * sizeof(tt->t[0]));
    if (tt == NULL) {
        log_msg(LOG_ERROR, "out of memory: a proxy's connections keep their toxics", "proxy=%s",
                p->name);
        return;
    }
    tt->refs = 1;
    tt->seed = tx->px->seed;
    for (const struct toxi_toxic *t = p->toxics; t != NULL; t = t->next) {
        if (t->attributes != NULL)
            continue;
        struct toxi_stream_toxic *x = &tt->t[tt->n++];
        snprintf(x->rule, sizeof(x->rule), "%s.%s", p->name, t->name);
        x->downstream = t->downstream;
        x->toxicity = t->toxicity;
        x->t = t->t;
    }
    pthread_mutex_lock(&toxi_lock);
    struct toxi_toxics *old = p->l->toxics;
    p->l->toxics = tt;
    pthread_mutex_unlock(&toxi_lock);
    toxi_toxics_put(old);
    loop_listener_sessions_all(tx->px, p->l, false);
}

/* ---- message toxics: rules next to the file's ----------------------------------------- */

static void free_rule_list(void *p)
{
    rule_list_free(p);
}

static bool is_toxic_rule(const struct toxi *tx, const char *name)
{
    for (size_t i = 0; i < tx->n_installed; i++)
        if (strcmp(tx->installed[i], name) == 0)
            return true;
    return false;
}

static void free_installed(struct toxi *tx)
{
    for (size_t i = 0; i < tx->n_installed; i++)
        free(tx->installed[i]);
    free(tx->installed);
    tx->installed = NULL;
    tx->n_installed = 0;
}

/* Remembers the names of the rules of `head` from `from` on: the toxics' now in the rule set. */
static void remember_installed(struct toxi *tx, const struct rule *from, size_t n)
{
    free_installed(tx);
    tx->installed = calloc(n ? n : 1, sizeof(*tx->installed));
    for (const struct rule *r = from; tx->installed != NULL && r != NULL; r = r->next)
        if ((tx->installed[tx->n_installed] = strdup(r->name)) != NULL)
            tx->n_installed++;
}

/* The rule set: the rules in force that are not a toxic's, then every message toxic's rule. */
static int toxi_sync_rules(struct toxi *tx)
{
    struct proxy *px = tx->px;
    struct rule *head = NULL, **tail = &head, *mine = NULL;
    size_t n_mine = 0;
    for (size_t i = 0; px->rules != NULL && i < ruleset_count(px->rules); i++) {
        const struct rule *r = ruleset_rule(px->rules, i);
        if (is_toxic_rule(tx, r->name))
            continue;
        if ((*tail = rule_copy(r)) == NULL)
            goto oom;
        tail = &(*tail)->next;
    }
    struct rule **first_mine = tail;
    for (struct toxi_proxy *p = tx->proxies; p != NULL; p = p->next) {
        for (struct toxi_toxic *t = p->toxics; t != NULL; t = t->next) {
            if (t->rule == NULL)
                continue;
            if ((*tail = rule_copy(t->rule)) == NULL)
                goto oom;
            tail = &(*tail)->next;
            n_mine++;
        }
    }
    mine = *first_mine;
    struct ruleset *rs = ruleset_new(head, px->seed, px->start_ms);
    if (rs == NULL)
        goto oom;
    ruleset_set_owner(rs, head, free_rule_list);
    remember_installed(tx, mine, n_mine);
    proxy_set_rules(px, rs);
    return 0;
oom:
    rule_list_free(head);
    return -1;
}

void toxi_rules_changed(struct proxy *px)
{
    struct toxi *tx = px->toxi;
    if (tx == NULL)
        return;
    for (const struct toxi_proxy *p = tx->proxies; p != NULL; p = p->next)
        if (conf_find_listener(px->conf->conf, p->name) != NULL)
            log_msg(LOG_WARN, "a proxy and a listener of the file share a name",
                    "proxy=%s hint=\"their rules and counters mix: delete the proxy or rename "
                    "the listener\"",
                    p->name);
    bool any = false;
    for (struct toxi_proxy *p = tx->proxies; p != NULL && !any; p = p->next)
        for (struct toxi_toxic *t = p->toxics; t != NULL && !any; t = t->next)
            any = t->rule != NULL;
    if (any && toxi_sync_rules(tx) != 0)
        log_msg(LOG_ERROR, "out of memory: message toxics left out of the rules", NULL);
}

const struct conf *toxi_conf_view(struct proxy *px, struct conf *view, struct conf_listener **mem)
{
    const struct conf *c = px->conf->conf;
    *mem = NULL;
    size_t n = 0;
    for (const struct toxi_proxy *p = px->toxi != NULL ? px->toxi->proxies : NULL; p != NULL;
         p = p->next)
        n += p->l != NULL;
    if (n == 0 || (*mem = calloc(c->n_listeners + n, sizeof(**mem))) == NULL)
        return c;
    *view = *c;
    size_t i = 0;
    for (const struct conf_listener *l = c->listeners; l != NULL; l = l->next)
        (*mem)[i++] = *l;
    for (const struct toxi_proxy *p = px->toxi->proxies; p != NULL; p = p->next)
        if (p->l != NULL)
            (*mem)[i++] = *p->l->cfg->l;
    for (size_t j = 0; j < i; j++)
        (*mem)[j].next = j + 1 < i ? &(*mem)[j + 1] : NULL;
    view->listeners = *mem;
    view->n_listeners = i;
    return view;
}

/* ---- answers ---------------------------------------------------------------------------- */

static void reply_body(struct toxi *tx, struct evhttp_request *req, int code, const char *type,
                       struct evbuffer *b)
{
    char id[24];
    snprintf(id, sizeof(id), "twice%015llu", (unsigned long long)++tx->request_id);
    evhttp_add_header(evhttp_request_get_output_headers(req), "X-Toxiproxy-Request-Id", id);
    admin_http_reply(req, code, type, b);
}

/* An answer whose body is `j` (taken) as JSON; NULL j: out of memory. */
static void reply_json(struct toxi *tx, struct evhttp_request *req, int code, json_t *j)
{
    struct evbuffer *b = evbuffer_new();
    char *text = j != NULL ? json_dumps(j, TOXI_JSON_FLAGS | JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (b == NULL || text == NULL) {
        free(text);
        if (b != NULL)
            evbuffer_free(b);
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evbuffer_add(b, text, strlen(text));
    free(text);
    reply_body(tx, req, code, "application/json", b);
    evbuffer_free(b);
}

static json_t *error_json(int code, const char *msg)
{
    return json_pack("{s:s, s:i}", "error", msg, "status", code);
}

/* Toxiproxy's apiError: {"error":MSG,"status":CODE} and a newline, sent as Go's http.Error. */
static void reply_error(struct toxi *tx, struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_error(struct toxi *tx, struct evhttp_request *req, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* What a client sent may be cut in the middle of a character: end the message before it,
     * and before any invalid byte, so that it is still a JSON string. */
    size_t len = strlen(msg);
    for (size_t i = 0; i < len;) {
        size_t n = utf8_char_len((const unsigned char *)msg + i, len - i);
        if (n == 0) {
            msg[i] = '\0';
            break;
        }
        i += n;
    }
    json_t *j = error_json(code, msg);
    char *text = j != NULL ? json_dumps(j, TOXI_JSON_FLAGS) : NULL;
    json_decref(j);
    struct evbuffer *b = evbuffer_new();
    if (b == NULL || text == NULL) {
        free(text);
        if (b != NULL)
            evbuffer_free(b);
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evbuffer_add_printf(b, "%s\n", text);
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "X-Content-Type-Options", "nosniff");
    reply_body(tx, req, code, "text/plain; charset=utf-8", b);
    evbuffer_free(b);
}

/* An answer as Go's server and gorilla/mux send it: `type` NULL leaves Content-Type out, and
 * `id` false the request id (mux answers unknown routes before Toxiproxy's middleware). */
static void reply_plain(struct toxi *tx, struct evhttp_request *req, int code, const char *type,
                        const char *text, bool id)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char len[24];
    snprintf(len, sizeof(len), "%zu", strlen(text));
    if (id) {
        char rid[24];
        snprintf(rid, sizeof(rid), "twice%015llu", (unsigned long long)++tx->request_id);
        evhttp_add_header(h, "X-Toxiproxy-Request-Id", rid);
    }
    if (type != NULL)
        evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Content-Length", len);
    if (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD)
        evbuffer_add(b, text, strlen(text));
    evhttp_send_reply(req, code, NULL, b);
    evbuffer_free(b);
}

static void reply_empty(struct toxi *tx, struct evhttp_request *req, int code, const char *type,
                        const char *text)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evbuffer_add(b, text, strlen(text));
    reply_body(tx, req, code, type, b);
    evbuffer_free(b);
}

/* toxicity as Go prints a float32: the shortest decimal that reads back as the same float. */
static json_t *toxicity_json(double v)
{
    float f = (float)v;
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f)
            break;
    }
    double d = strtod(buf, NULL);
    if (d > -1e15 && d < 1e15 && d == (double)(json_int_t)d)
        return json_integer((json_int_t)d);
    return json_real(d);
}

static json_t *toxic_json(const struct toxi_toxic *t)
{
    json_t *attrs =
        t->attributes != NULL ? json_deep_copy(t->attributes) : toxic_stream_json(&t->t);
    return json_pack("{s:o, s:s, s:s, s:s, s:o}", "attributes", attrs ? attrs : json_object(),
                     "name", t->name, "type", t->type, "stream", t->stream, "toxicity",
                     toxicity_json(t->toxicity));
}

/* The toxics of p as Toxiproxy lists them: upstream ones first, then downstream ones. */
static json_t *toxics_json(const struct toxi_proxy *p)
{
    json_t *a = json_array();
    for (int down = 0; a != NULL && down < 2; down++)
        for (const struct toxi_toxic *t = p->toxics; t != NULL; t = t->next)
            if (t->downstream == (down == 1))
                json_array_append_new(a, toxic_json(t));
    return a;
}

static json_t *proxy_json(const struct toxi_proxy *p)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:b}", "name", p->name, "listen", p->listen, "upstream",
                          p->upstream, "enabled", p->enabled);
    if (o == NULL)
        return NULL;
    if (p->protocol != CONF_PROTO_TCP) {
        json_object_set_new(o, "protocol", json_string(conf_protocol_name(p->protocol)));
        if (p->profile[0] != '\0')
            json_object_set_new(o, "profile", json_string(p->profile));
    }
    json_object_set_new(o, "toxics", toxics_json(p));
    return o;
}

/* ---- proxies ----------------------------------------------------------------------------- */

static struct toxi_proxy *find_proxy(struct toxi *tx, const char *name)
{
    for (struct toxi_proxy *p = tx->proxies; p != NULL; p = p->next)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

static struct toxi_toxic *find_toxic(struct toxi_proxy *p, const char *name)
{
    for (struct toxi_toxic *t = p->toxics; t != NULL; t = t->next)
        if (strcmp(t->name, name) == 0)
            return t;
    return NULL;
}

static void toxic_free(struct toxi_toxic *t)
{
    json_decref(t->attributes);
    rule_list_free(t->rule);
    free(t);
}

/* Stop listening and close every connection of p (Toxiproxy's stop). */
static void proxy_stop(struct toxi *tx, struct toxi_proxy *p)
{
    if (p->l == NULL)
        return;
    log_msg(LOG_INFO, "listener closed", "listener=%s bind=%s source=toxiproxy", p->name,
            p->l->cfg->bind_str);
    listener_close(p->l);
    loop_listener_sessions_all(tx->px, p->l, true);
    listener_put(p->l);
    p->l = NULL;
    p->enabled = false;
}

/* `listen` as a literal address twice can bind: "HOST:PORT", HOST a name (resolved now, IPv4
 * first), a literal, "[v6]" or empty (every address).  0 and the text, or -1 with Go's words. */
static int resolve_listen(const char *listen, char *out, size_t outlen, char *err, size_t errlen)
{
    const char *colon = strrchr(listen, ':');
    if (colon == NULL) {
        snprintf(err, errlen, "listen tcp: address %s: missing port in address", listen);
        return -1;
    }
    char host[256];
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof(host)) {
        snprintf(err, errlen, "listen tcp: address %s: host too long", listen);
        return -1;
    }
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || port < 0 || port > 65535) {
        snprintf(err, errlen, "listen tcp: address %s: invalid port", listen);
        return -1;
    }
    if (host[0] == '\0') {
        snprintf(out, outlen, "[::]:%ld", port);
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errlen, "listen tcp: lookup %s: %s", host, gai_strerror(rc));
        return -1;
    }
    const struct addrinfo *pick = res;
    for (const struct addrinfo *a = res; a != NULL; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    char lit[64];
    if (pick->ai_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)pick->ai_addr)->sin_addr, lit, sizeof(lit));
        snprintf(out, outlen, "%s:%ld", lit, port);
    } else {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)pick->ai_addr)->sin6_addr, lit, sizeof(lit));
        snprintf(out, outlen, "[%s]:%ld", lit, port);
    }
    freeaddrinfo(res);
    return 0;
}

/* A configuration of one listen block for p (bind `bind`, port 1 standing for 0), parsed as
 * a file would be; NULL with the first problem in err. */
static struct conf *proxy_conf(struct toxi *tx, const struct toxi_proxy *p, const char *bind,
                               bool *port0, char *err, size_t errlen)
{
    char addr[300];
    snprintf(addr, sizeof(addr), "%s", bind);
    char *colon = strrchr(addr, ':');
    *port0 = colon != NULL && strcmp(colon, ":0") == 0;
    if (*port0)
        snprintf(colon, sizeof(addr) - (size_t)(colon - addr), ":1");
    char *text = NULL;
    const struct conf *fc = tx->px->conf->conf;
    if (asprintf(&text,
                 "connect-timeout %ums\nlisten %s {\n  protocol %s\n%s%s%s  bind %s\n"
                 "  upstream %s\n}\n",
                 (unsigned)fc->connect_timeout_ms, p->name, conf_protocol_name(p->protocol),
                 p->profile[0] ? "  profile " : "", p->profile, p->profile[0] ? "\n" : "", addr,
                 p->upstream) < 0) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    struct conf *c = NULL;
    struct conf_diags d;
    conf_diags_init(&d);
    if (conf_parse_string("toxiproxy", text, strlen(text), &c, &d) != 0) {
        const struct conf_diag *g = d.head;
        while (g != NULL && g->severity != CONF_ERROR)
            g = g->next;
        snprintf(err, errlen, "%s%s%s%s", g != NULL ? g->msg : "invalid proxy",
                 g != NULL && g->hint != NULL ? " (" : "", g != NULL && g->hint ? g->hint : "",
                 g != NULL && g->hint != NULL ? ")" : "");
    }
    conf_diags_free(&d);
    free(text);
    return c;
}

/* The port the listener's socket got (listen port 0). */
static void learn_port(struct listener *l, struct conf_listener *cl)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(evconnlistener_get_fd(l->evl), (struct sockaddr *)&ss, &len) != 0)
        return;
    cl->bind.port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                  : ((struct sockaddr_in6 *)&ss)->sin6_port);
    conf_addr_format(&cl->bind, l->cfg->bind_str, sizeof(l->cfg->bind_str));
}

/* Toxiproxy's start: listen, with p->listen becoming the address bound.  0, or -1 with the
 * reason in err (HTTP 500, Go's words where they are known, or 400 for what twice refuses:
 * *code). */
static int proxy_start(struct toxi *tx, struct toxi_proxy *p, int *code, char *err, size_t errlen)
{
    char bind[300];
    *code = 500;
    if (p->l != NULL)
        return 0;
    if (resolve_listen(p->listen[0] ? p->listen : "127.0.0.1:0", bind, sizeof(bind), err, errlen) !=
        0)
        return -1;
    bool port0;
    struct conf *c = proxy_conf(tx, p, bind, &port0, err, errlen);
    if (c == NULL) {
        *code = 400;
        return -1;
    }
    if (port0)
        c->listeners->bind.port = 0;
    struct conf_ref *ref = conf_ref_new(c);
    if (ref == NULL) {
        conf_free(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct lconf **lcs = lconf_build_all(ref, tx->px->session_max, err, errlen);
    struct listener *l = NULL;
    if (lcs != NULL) {
        char why[512];
        l = listener_open(tx->px, lcs[0], why, sizeof(why));
        if (l == NULL) {
            /* Go's words: "listen tcp ADDR: bind: address already in use". */
            const char *why_end = why;
            for (const char *q = strstr(why, ": "); q != NULL; q = strstr(q + 2, ": "))
                why_end = q + 2;
            char reason[128];
            snprintf(reason, sizeof(reason), "%.120s", why_end);
            reason[0] = (char)tolower((unsigned char)reason[0]);
            snprintf(err, errlen, "listen tcp %s: bind: %s", bind, reason);
        }
        lconf_put(lcs[0]);
        free(lcs);
    }
    conf_ref_put(ref);
    if (l == NULL)
        return -1;
    l->toxi = true;
    if (port0)
        learn_port(l, c->listeners);
    snprintf(p->listen, sizeof(p->listen), "%s", l->cfg->bind_str);
    p->l = l;
    p->enabled = true;
    log_msg(LOG_INFO, "listening", "listener=%s protocol=%s bind=%s upstream=%s source=toxiproxy",
            p->name, conf_protocol_name(p->protocol), l->cfg->bind_str, p->upstream);
    publish_toxics(tx, p);
    return 0;
}

static void proxy_free_one(struct toxi *tx, struct toxi_proxy *p)
{
    proxy_stop(tx, p);
    while (p->toxics != NULL) {
        struct toxi_toxic *t = p->toxics;
        p->toxics = t->next;
        toxic_free(t);
    }
    free(p);
}

static bool has_msg_rules(const struct toxi_proxy *p)
{
    for (const struct toxi_toxic *t = p->toxics; t != NULL; t = t->next)
        if (t->rule != NULL)
            return true;
    return false;
}

static void proxy_remove(struct toxi *tx, struct toxi_proxy *p)
{
    bool rules = has_msg_rules(p);
    for (struct toxi_proxy **pp = &tx->proxies; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    if (rules) /* its toxics' rules go with it */
        (void)toxi_sync_rules(tx);
    proxy_free_one(tx, p);
}

/* ---- request bodies ---------------------------------------------------------------------- */

/* The body as JSON; NULL after answering 400 (Toxiproxy's "bad request body: ..."). */
static json_t *read_body(struct toxi *tx, struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char *text = malloc(len + 1);
    if (text == NULL) {
        reply_error(tx, req, 500, "out of memory");
        return NULL;
    }
    evbuffer_remove(in, text, len);
    text[len] = '\0';
    size_t i = strspn(text, " \t\r\n");
    if (text[i] == '\0') {
        free(text);
        reply_error(tx, req, 400, "bad request body: EOF");
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loadb(text, len, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &e);
    free(text);
    if (j == NULL)
        reply_error(tx, req, 400, "bad request body: %s", e.text);
    return j;
}

/* A string field of a request: its value, `dflt` when absent or null; NULL with err. */
static const char *str_field(const json_t *o, const char *key, const char *dflt, const char *what,
                             char *err, size_t errlen)
{
    const json_t *v = toxic_json_get(o, key);
    if (v == NULL || json_is_null(v))
        return dflt;
    if (!json_is_string(v)) {
        snprintf(err, errlen,
                 "bad request body: json: cannot unmarshal %s into Go struct field %s.%s of type "
                 "string",
                 json_is_number(v)    ? "number"
                 : json_is_boolean(v) ? "bool"
                                      : "object",
                 what, key);
        return NULL;
    }
    return json_string_value(v);
}

/* A boolean field: 0 with *out (left alone when absent), -1 with err. */
static int bool_field(const json_t *o, const char *key, bool *out, char *err, size_t errlen)
{
    const json_t *v = toxic_json_get(o, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        snprintf(err, errlen,
                 "bad request body: json: cannot unmarshal %s into Go struct field Proxy.%s of "
                 "type bool",
                 json_is_number(v)   ? "number"
                 : json_is_string(v) ? "string"
                                     : "object",
                 key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* A proxy or toxic name twice can name a listener or rule with. */
static bool name_ok(const char *name, size_t max)
{
    size_t n = strlen(name);
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

/* Whether `s` can only be a host and port (a name, IPv4, [IPv6%zone]) of at most `max`
 * bytes: the proxy's listen block is written as text and parsed, so a blank, a newline, a
 * brace or a '#' in what a client sent would add directives of its own to it. */
static bool addr_ok(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("_.-:[]%", c) != NULL))
            return false;
    }
    return true;
}

/* A proxy's listen, upstream and profile as twice can write them in its listen block: 0, or
 * -1 with the reason in err (HTTP 400). */
static int proxy_fields_ok(const char *listen, const char *up, const char *profile, char *err,
                           size_t errlen)
{
    if (!addr_ok(listen, 255)) {
        snprintf(err, errlen, "twice takes HOST:PORT as listen, not '%s'", listen);
        return -1;
    }
    if (!addr_ok(up, 255)) {
        snprintf(err, errlen, "twice takes HOST:PORT as upstream, not '%s'", up);
        return -1;
    }
    if (profile[0] != '\0' && !name_ok(profile, 32)) {
        snprintf(err, errlen, "unknown profile '%s'", profile);
        return -1;
    }
    return 0;
}

/* A new proxy from a request's object `o` (Toxiproxy's Proxy, and twice's protocol and
 * profile), not started: NULL with *code and err. */
static struct toxi_proxy *proxy_from_json(const json_t *o, const char *where, int *code, char *err,
                                          size_t errlen)
{
    *code = 400;
    if (!json_is_object(o) && !json_is_null(o)) { /* null decodes to nothing, as in Go */
        snprintf(err, errlen,
                 "bad request body: json: cannot unmarshal %s into Go value of type "
                 "toxiproxy.Proxy",
                 json_is_array(o)    ? "array"
                 : json_is_string(o) ? "string"
                                     : "number");
        return NULL;
    }
    const char *name = str_field(o, "name", "", "Proxy", err, errlen);
    const char *listen = name ? str_field(o, "listen", "", "Proxy", err, errlen) : NULL;
    const char *up = listen ? str_field(o, "upstream", "", "Proxy", err, errlen) : NULL;
    const char *proto = up ? str_field(o, "protocol", "tcp", "Proxy", err, errlen) : NULL;
    const char *profile = proto ? str_field(o, "profile", "", "Proxy", err, errlen) : NULL;
    if (profile == NULL)
        return NULL;
    if (name[0] == '\0') {
        snprintf(err, errlen, "missing required field: name%s", where);
        return NULL;
    }
    if (up[0] == '\0') {
        snprintf(err, errlen, "missing required field: upstream%s", where);
        return NULL;
    }
    if (!name_ok(name, CONF_NAME_MAX)) {
        snprintf(err, errlen,
                 "twice names a proxy with 1 to %d letters, digits, '_', '.' or '-', not '%s'",
                 CONF_NAME_MAX, name);
        return NULL;
    }
    if (proxy_fields_ok(listen, up, profile, err, errlen) != 0)
        return NULL;
    struct toxi_proxy *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        *code = 500;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->listen, sizeof(p->listen), "%s", listen);
    snprintf(p->upstream, sizeof(p->upstream), "%s", up);
    snprintf(p->profile, sizeof(p->profile), "%s", profile);
    p->enabled = true;
    if (strcmp(proto, "tcp") == 0) {
        p->protocol = CONF_PROTO_TCP;
    } else if (strcmp(proto, "amqp") == 0) {
        p->protocol = CONF_PROTO_AMQP;
    } else if (strcmp(proto, "resp") == 0) {
        p->protocol = CONF_PROTO_RESP;
    } else {
        snprintf(err, errlen, "unknown protocol '%s': tcp, amqp or resp", proto);
        free(p);
        return NULL;
    }
    if (bool_field(o, "enabled", &p->enabled, err, errlen) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

/* Whether a file listener already has the name (a proxy cannot take it). */
static bool file_has_listener(struct toxi *tx, const char *name)
{
    return conf_find_listener(tx->px->conf->conf, name) != NULL;
}

/* ---- handlers --------------------------------------------------------------------------- */

static void get_version(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    (void)args;
    reply_empty(tx, req, 200, "application/json;charset=utf-8",
                "{\"version\": \"" TOXI_VERSION "\"}\n");
}

static void get_proxies(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    (void)args;
    json_t *o = json_object();
    /* Go marshals a map with its keys sorted. */
    const struct toxi_proxy *last = NULL;
    for (;;) {
        const struct toxi_proxy *next = NULL;
        for (const struct toxi_proxy *p = tx->proxies; p != NULL; p = p->next)
            if ((last == NULL || strcmp(p->name, last->name) > 0) &&
                (next == NULL || strcmp(p->name, next->name) < 0))
                next = p;
        if (next == NULL)
            break;
        json_object_set_new(o, next->name, proxy_json(next));
        last = next;
    }
    reply_json(tx, req, 200, o);
}

/* The most proxies one twice keeps: each is a listening socket, and its sessions take two
 * descriptors each from what the listeners of the file were sized with (docs/toxiproxy.md). */
#define TOXI_MAX_PROXIES 1000

/* Whether one more proxy is refused; err says why (HTTP 507). */
static bool proxies_full(const struct toxi *tx, char *err, size_t errlen)
{
    size_t n = 0;
    for (const struct toxi_proxy *p = tx->proxies; p != NULL; p = p->next)
        n++;
    if (n < TOXI_MAX_PROXIES)
        return false;
    snprintf(err, errlen, "twice keeps at most %d proxies: delete some first", TOXI_MAX_PROXIES);
    return true;
}

static void create_proxy(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    (void)args;
    json_t *body = read_body(tx, req);
    if (body == NULL)
        return;
    char err[512];
    int code;
    struct toxi_proxy *p = proxy_from_json(body, "", &code, err, sizeof(err));
    json_decref(body);
    if (p == NULL) {
        reply_error(tx, req, code, "%s", err);
        return;
    }
    if (find_proxy(tx, p->name) != NULL || file_has_listener(tx, p->name)) {
        free(p);
        reply_error(tx, req, 409, "proxy already exists");
        return;
    }
    if (proxies_full(tx, err, sizeof(err))) {
        free(p);
        reply_error(tx, req, 507, "%s", err);
        return;
    }
    bool enable = p->enabled;
    p->enabled = false;
    if (enable && proxy_start(tx, p, &code, err, sizeof(err)) != 0) {
        free(p);
        reply_error(tx, req, code, "%s", err);
        return;
    }
    p->next = tx->proxies;
    tx->proxies = p;
    reply_json(tx, req, 201, proxy_json(p));
}

/* Whether the entry `n` asks for another proxy than p (Toxiproxy's Differs). */
static bool proxy_differs(const struct toxi_proxy *p, const struct toxi_proxy *n)
{
    char bind[300], err[256];
    const char *listen = n->listen;
    if (resolve_listen(n->listen[0] ? n->listen : "127.0.0.1:0", bind, sizeof(bind), err,
                       sizeof(err)) == 0)
        listen = bind;
    return strcmp(p->listen, listen) != 0 || strcmp(p->upstream, n->upstream) != 0 ||
           p->protocol != n->protocol || strcmp(p->profile, n->profile) != 0;
}

/* One entry of /populate: add it, keep the same proxy, or replace one that differs.  The
 * proxy in force, or NULL with *code and err. */
static struct toxi_proxy *populate_one(struct toxi *tx, struct toxi_proxy *n, int *code, char *err,
                                       size_t errlen)
{
    struct toxi_proxy *old = find_proxy(tx, n->name);
    if (old != NULL && !proxy_differs(old, n)) {
        free(n);
        return old;
    }
    if (old == NULL && file_has_listener(tx, n->name)) {
        *code = 409;
        snprintf(err, errlen, "proxy already exists");
        free(n);
        return NULL;
    }
    if (old == NULL && proxies_full(tx, err, errlen)) {
        *code = 507;
        free(n);
        return NULL;
    }
    if (old != NULL)
        proxy_remove(tx, old);
    bool enable = n->enabled;
    n->enabled = false;
    if (enable && proxy_start(tx, n, code, err, errlen) != 0) {
        free(n);
        return NULL;
    }
    n->next = tx->proxies;
    tx->proxies = n;
    return n;
}

/* POST /populate and `toxiproxy-config`: the proxies of `arr`.  Returns the JSON answer and
 * its status (201, or the error's). */
static json_t *populate(struct toxi *tx, const json_t *arr, int *status)
{
    char err[512];
    int code = 400;
    json_t *list = json_array(), *out = NULL;
    struct toxi_proxy **made = NULL;
    size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
    if (!json_is_array(arr) && !json_is_null(arr)) { /* null decodes to no proxy, as in Go */
        snprintf(err, sizeof(err),
                 "bad request body: json: cannot unmarshal %s into Go value of type []struct { "
                 "toxiproxy.Proxy; Enabled *bool \"json:\\\"enabled\\\"\" }",
                 json_is_object(arr)   ? "object"
                 : json_is_string(arr) ? "string"
                                       : "number");
        goto fail;
    }
    made = calloc(n + 1, sizeof(*made));
    for (size_t i = 0; made != NULL && i < n; i++) {
        char where[32];
        snprintf(where, sizeof(where), " at proxy %zu", i + 1);
        if ((made[i] = proxy_from_json(json_array_get(arr, i), where, &code, err, sizeof(err))) ==
            NULL) {
            for (size_t j = 0; j < i; j++)
                free(made[j]);
            goto fail;
        }
    }
    for (size_t i = 0; made != NULL && i < n; i++) {
        struct toxi_proxy *p = populate_one(tx, made[i], &code, err, sizeof(err));
        if (p == NULL) {
            for (size_t j = i + 1; j < n; j++)
                free(made[j]);
            goto fail;
        }
        json_array_append_new(list, proxy_json(p));
    }
    free(made);
    *status = 201;
    return json_pack("{s:o}", "proxies",
                     json_array_size(list) ? list : (json_decref(list), json_null()));
fail:
    free(made);
    *status = code;
    out = error_json(code, err);
    json_object_set_new(out, "proxies",
                        json_array_size(list) ? list : (json_decref(list), json_null()));
    return out;
}

static void post_populate(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    (void)args;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    json_error_t e;
    size_t len = evbuffer_get_length(in);
    char *text = malloc(len + 1);
    if (text == NULL) {
        reply_error(tx, req, 500, "out of memory");
        return;
    }
    evbuffer_remove(in, text, len);
    json_t *arr = json_loadb(text, len, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &e);
    free(text);
    int status;
    json_t *out;
    if (arr == NULL) {
        status = 400;
        char msg[300];
        snprintf(msg, sizeof(msg), "bad request body: %s", len == 0 ? "EOF" : e.text);
        out = error_json(400, msg);
        json_object_set_new(out, "proxies", json_null());
    } else {
        out = populate(tx, arr, &status);
        json_decref(arr);
    }
    reply_json(tx, req, status, out);
}

/* The proxy of /proxies/{proxy}..., or NULL after answering 404. */
static struct toxi_proxy *proxy_of(struct toxi *tx, struct evhttp_request *req,
                                   char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p = find_proxy(tx, args[0]);
    if (p == NULL)
        reply_error(tx, req, 404, "proxy not found");
    return p;
}

static void get_proxy(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p = proxy_of(tx, req, args);
    if (p != NULL)
        reply_json(tx, req, 200, proxy_json(p));
}

/* The proxy of the path and the request's body (owned by the caller), or NULL after answering
 * 404 or 400. */
static struct toxi_proxy *proxy_and_body(struct toxi *tx, struct evhttp_request *req,
                                         char args[2][TOXI_SEG_MAX], json_t **body)
{
    struct toxi_proxy *p = proxy_of(tx, req, args);
    if (p == NULL || (*body = read_body(tx, req)) == NULL)
        return NULL;
    return p;
}

static void update_proxy(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    json_t *body;
    struct toxi_proxy *p = proxy_and_body(tx, req, args, &body);
    if (p == NULL)
        return;
    char err[512];
    int code = 400;
    bool enabled = p->enabled;
    const char *listen = str_field(body, "listen", p->listen, "Proxy", err, sizeof(err));
    const char *up =
        listen ? str_field(body, "upstream", p->upstream, "Proxy", err, sizeof(err)) : NULL;
    if (up == NULL || bool_field(body, "enabled", &enabled, err, sizeof(err)) != 0 ||
        proxy_fields_ok(listen, up, "", err, sizeof(err)) != 0) {
        json_decref(body);
        reply_error(tx, req, 400, "%s", err);
        return;
    }
    struct toxi_proxy n = *p;
    snprintf(n.listen, sizeof(n.listen), "%s", listen);
    snprintf(n.upstream, sizeof(n.upstream), "%s", up);
    json_decref(body);
    char bind[300];
    if (n.listen[0] != '\0' &&
        resolve_listen(n.listen, bind, sizeof(bind), err, sizeof(err)) != 0) {
        /* Toxiproxy resolves the new address first (Differs): nothing changes. */
        const char *why = strncmp(err, "listen tcp: ", 12) == 0 ? err + 12 : err;
        reply_error(tx, req, 500, "%s", why);
        return;
    }
    if (proxy_differs(p, &n)) {
        /* Toxiproxy stops the proxy (its connections close) and starts it anew. */
        bool was = p->enabled;
        proxy_stop(tx, p);
        snprintf(p->listen, sizeof(p->listen), "%s", n.listen);
        snprintf(p->upstream, sizeof(p->upstream), "%s", n.upstream);
        if (was && enabled && proxy_start(tx, p, &code, err, sizeof(err)) != 0) {
            reply_error(tx, req, code, "%s", err);
            return;
        }
    }
    if (enabled && !p->enabled && proxy_start(tx, p, &code, err, sizeof(err)) != 0) {
        reply_error(tx, req, code, "%s", err);
        return;
    }
    if (!enabled && p->enabled)
        proxy_stop(tx, p);
    reply_json(tx, req, 200, proxy_json(p));
}

static void delete_proxy(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p = proxy_of(tx, req, args);
    if (p == NULL)
        return;
    log_msg(LOG_INFO, "proxy deleted", "proxy=%s source=toxiproxy", p->name);
    proxy_remove(tx, p);
    reply_plain(tx, req, 204, NULL, "", true);
}

static void get_toxics(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p = proxy_of(tx, req, args);
    if (p != NULL)
        reply_json(tx, req, 200, toxics_json(p));
}

/* toxicity from the body, `dflt` when absent; -1 with err when it is no number. */
static int toxicity_field(const json_t *o, double dflt, double *out, char *err, size_t errlen)
{
    const json_t *v = toxic_json_get(o, "toxicity");
    *out = dflt;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_number(v)) {
        snprintf(err, errlen,
                 "bad request body: json: cannot unmarshal %s into Go struct field "
                 "ToxicWrapper.toxicity of type float32",
                 json_is_string(v)    ? "string"
                 : json_is_boolean(v) ? "bool"
                                      : "object");
        return -1;
    }
    double d = json_number_value(v);
    if (!isfinite(d) || fabs(d) > FLT_MAX) { /* (float) of it would be undefined */
        snprintf(err, errlen,
                 "bad request body: json: cannot unmarshal number %g into Go struct field "
                 "ToxicWrapper.toxicity of type float32",
                 d);
        return -1;
    }
    *out = (double)(float)d;
    return 0;
}

/* A message toxic's rule into t->rule; 0, or -1 with err (400). */
static int message_rule(struct toxi *tx, struct toxi_proxy *p, struct toxi_toxic *t, char *err,
                        size_t errlen)
{
    char rule[160];
    snprintf(rule, sizeof(rule), "%s.%s", p->name, t->name);
    /* Checked against the proxy's listener: its own, or (disabled) the one it would have. */
    bool port0;
    struct conf *own = p->l == NULL ? proxy_conf(tx, p, "127.0.0.1:1", &port0, err, errlen) : NULL;
    if (p->l == NULL && own == NULL)
        return -1;
    struct conf base = *tx->px->conf->conf;
    struct conf_listener cl = p->l != NULL ? *p->l->cfg->l : *own->listeners;
    cl.next = NULL;
    base.listeners = &cl;
    base.n_listeners = 1;
    base.rules = NULL;
    base.n_rules = 0;
    t->rule = toxic_msg_rule(&base, rule, p->name, t->type, t->stream, t->toxicity, t->attributes,
                             err, errlen);
    conf_free(own);
    return t->rule != NULL ? 0 : -1;
}

/* Whether a rule of the file or of the admin API is called as p's toxic t would be: the rule
 * set tells toxics' rules from the others by their names, so the toxic is refused (409). */
static bool rule_name_taken(struct toxi *tx, const struct toxi_proxy *p, const char *toxic)
{
    char rule[160];
    snprintf(rule, sizeof(rule), "%s.%s", p->name, toxic);
    const struct ruleset *rs = tx->px->rules;
    for (size_t i = 0; rs != NULL && i < ruleset_count(rs); i++)
        if (strcmp(ruleset_rule(rs, i)->name, rule) == 0 && !is_toxic_rule(tx, rule))
            return true;
    return false;
}

/* Adds t (taken) to p, upstream ones before downstream ones as Toxiproxy lists them. */
static void add_toxic(struct toxi_proxy *p, struct toxi_toxic *t)
{
    struct toxi_toxic **pp = &p->toxics;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = t;
}

/* After a change of p's toxics: its connections and the rule set follow. */
static void toxics_changed(struct toxi *tx, struct toxi_proxy *p, bool rules)
{
    publish_toxics(tx, p);
    if (rules && toxi_sync_rules(tx) != 0)
        log_msg(LOG_ERROR, "out of memory: message toxics left out of the rules", NULL);
}

static void create_toxic(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    json_t *body;
    struct toxi_proxy *p = proxy_and_body(tx, req, args, &body);
    if (p == NULL)
        return;
    char err[512];
    int code = 400;
    struct toxi_toxic *t = calloc(1, sizeof(*t));
    const char *name = str_field(body, "name", "", "ToxicWrapper", err, sizeof(err));
    const char *type = name ? str_field(body, "type", "", "ToxicWrapper", err, sizeof(err)) : NULL;
    const char *stream =
        type ? str_field(body, "stream", "downstream", "ToxicWrapper", err, sizeof(err)) : NULL;
    if (t == NULL) {
        code = 500;
        snprintf(err, sizeof(err), "out of memory");
        goto fail;
    }
    if (stream == NULL || toxicity_field(body, 1.0, &t->toxicity, err, sizeof(err)) != 0)
        goto fail;
    if (strcasecmp(stream, "upstream") != 0 && strcasecmp(stream, "downstream") != 0) {
        snprintf(err, sizeof(err), "stream was invalid, can be either upstream or downstream");
        goto fail;
    }
    if (strlen(type) >= sizeof(t->type)) {
        snprintf(err, sizeof(err), "invalid toxic type");
        goto fail;
    }
    if (name[0] != '\0' &&
        (!name_ok(name, CONF_NAME_MAX) || strlen(p->name) + 1 + strlen(name) > CONF_NAME_MAX)) {
        snprintf(err, sizeof(err),
                 "twice names a toxic with letters, digits, '_', '.' or '-', at most %zu with "
                 "its proxy's name and a '.', not '%s'",
                 (size_t)CONF_NAME_MAX, name);
        goto fail;
    }
    t->downstream = strcasecmp(stream, "downstream") == 0;
    snprintf(t->stream, sizeof(t->stream), "%s", stream);
    snprintf(t->type, sizeof(t->type), "%s", type);
    if (name[0] != '\0')
        snprintf(t->name, sizeof(t->name), "%s", name);
    else
        snprintf(t->name, sizeof(t->name), "%s_%s", type, stream);
    bool message = toxic_msg_is_message(type);
    if (!message && toxic_stream_kind(type, &t->t.kind) != 0) {
        snprintf(err, sizeof(err), "invalid toxic type");
        goto fail;
    }
    if (find_toxic(p, t->name) != NULL) {
        code = 409;
        snprintf(err, sizeof(err), "toxic already exists");
        goto fail;
    }
    if (strlen(p->name) + 1 + strlen(t->name) > CONF_NAME_MAX) { /* the default name */
        snprintf(err, sizeof(err),
                 "twice names a toxic with letters, digits, '_', '.' or '-', at most %zu with "
                 "its proxy's name and a '.', not '%s'",
                 (size_t)CONF_NAME_MAX, t->name);
        goto fail;
    }
    if (message && rule_name_taken(tx, p, t->name)) {
        code = 409;
        snprintf(err, sizeof(err), "a rule called %s.%s is in force already", p->name, t->name);
        goto fail;
    }
    const json_t *attrs = toxic_json_get(body, "attributes");
    if (message) {
        t->attributes = json_is_object(attrs) ? json_deep_copy(attrs) : json_object();
        if (t->attributes == NULL || message_rule(tx, p, t, err, sizeof(err)) != 0)
            goto fail;
    } else if (toxic_stream_read(t->t.kind, attrs, NULL, &t->t, err, sizeof(err)) != 0) {
        goto fail;
    }
    json_decref(body);
    add_toxic(p, t);
    log_msg(LOG_INFO, "toxic added", "proxy=%s toxic=%s type=%s stream=%s toxicity=%g", p->name,
            t->name, t->type, t->downstream ? "downstream" : "upstream", t->toxicity);
    toxics_changed(tx, p, message);
    reply_json(tx, req, 200, toxic_json(t));
    return;
fail:
    json_decref(body);
    if (t != NULL)
        toxic_free(t);
    reply_error(tx, req, code, "%s", err);
}

/* The toxic of /proxies/{proxy}/toxics/{toxic}, or NULL after answering 404. */
static struct toxi_toxic *toxic_of(struct toxi *tx, struct evhttp_request *req,
                                   char args[2][TOXI_SEG_MAX], struct toxi_proxy **pp)
{
    struct toxi_proxy *p = proxy_of(tx, req, args);
    if (p == NULL)
        return NULL;
    struct toxi_toxic *t = find_toxic(p, args[1]);
    if (t == NULL)
        reply_error(tx, req, 404, "toxic not found");
    *pp = p;
    return t;
}

static void get_toxic(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p;
    struct toxi_toxic *t = toxic_of(tx, req, args, &p);
    if (t != NULL)
        reply_json(tx, req, 200, toxic_json(t));
}

/* A message toxic's new attributes (the old ones, with the body's over them) and rule. */
static int update_message(struct toxi *tx, struct toxi_proxy *p, struct toxi_toxic *t,
                          const json_t *attrs, double toxicity, char *err, size_t errlen)
{
    struct toxi_toxic n = *t;
    n.toxicity = toxicity;
    n.attributes = json_deep_copy(t->attributes);
    n.rule = NULL;
    if (n.attributes == NULL ||
        (json_is_object(attrs) && json_object_update(n.attributes, (json_t *)attrs)) ||
        message_rule(tx, p, &n, err, errlen) != 0) {
        json_decref(n.attributes);
        return -1;
    }
    json_decref(t->attributes);
    rule_list_free(t->rule);
    t->attributes = n.attributes;
    t->rule = n.rule;
    t->toxicity = toxicity;
    return 0;
}

static void update_toxic(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p;
    struct toxi_toxic *t = toxic_of(tx, req, args, &p);
    if (t == NULL)
        return;
    json_t *body = read_body(tx, req);
    if (body == NULL)
        return;
    char err[512];
    double toxicity;
    const json_t *attrs = toxic_json_get(body, "attributes");
    int rc = toxicity_field(body, t->toxicity, &toxicity, err, sizeof(err));
    if (rc == 0 && t->attributes != NULL) {
        rc = update_message(tx, p, t, attrs, toxicity, err, sizeof(err));
    } else if (rc == 0) {
        rc = toxic_stream_read(t->t.kind, attrs, &t->t, &t->t, err, sizeof(err));
        if (rc == 0)
            t->toxicity = toxicity;
    }
    json_decref(body);
    if (rc != 0) {
        reply_error(tx, req, 400, "%s", err);
        return;
    }
    toxics_changed(tx, p, t->attributes != NULL);
    reply_json(tx, req, 200, toxic_json(t));
}

static void remove_toxics(struct toxi *tx, struct toxi_proxy *p, struct toxi_toxic *only)
{
    bool rules = false;
    for (struct toxi_toxic **pp = &p->toxics; *pp != NULL;) {
        struct toxi_toxic *t = *pp;
        if (only != NULL && t != only) {
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        rules = rules || t->rule != NULL;
        toxic_free(t);
    }
    toxics_changed(tx, p, rules);
}

static void delete_toxic(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    struct toxi_proxy *p;
    struct toxi_toxic *t = toxic_of(tx, req, args, &p);
    if (t == NULL)
        return;
    log_msg(LOG_INFO, "toxic removed", "proxy=%s toxic=%s", p->name, t->name);
    remove_toxics(tx, p, t);
    reply_plain(tx, req, 204, NULL, "", true);
}

static void post_reset(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX])
{
    (void)args;
    char err[512];
    int code;
    for (struct toxi_proxy *p = tx->proxies; p != NULL; p = p->next) {
        if (!p->enabled && proxy_start(tx, p, &code, err, sizeof(err)) != 0) {
            reply_error(tx, req, code, "%s", err);
            return;
        }
        if (p->toxics != NULL)
            remove_toxics(tx, p, NULL);
    }
    log_msg(LOG_INFO, "toxiproxy reset", NULL);
    reply_plain(tx, req, 204, NULL, "", true);
}

/* ---- routing ---------------------------------------------------------------------------- */

#define M_GET EVHTTP_REQ_GET
#define M_POST EVHTTP_REQ_POST
#define M_PATCH EVHTTP_REQ_PATCH
#define M_DELETE EVHTTP_REQ_DELETE

/* Toxiproxy's routes (api.go Routes): '*' is one path segment, handed to the handler. */
static const struct toxi_route {
    const char *path;
    unsigned methods;
    void (*fn)(struct toxi *tx, struct evhttp_request *req, char args[2][TOXI_SEG_MAX]);
} toxi_routes[] = {
    {"/reset", M_POST, post_reset},
    {"/proxies", M_GET, get_proxies},
    {"/proxies", M_POST, create_proxy},
    {"/populate", M_POST, post_populate},
    {"/proxies/*", M_GET, get_proxy},
    {"/proxies/*", M_POST | M_PATCH, update_proxy},
    {"/proxies/*", M_DELETE, delete_proxy},
    {"/proxies/*/toxics", M_GET, get_toxics},
    {"/proxies/*/toxics", M_POST, create_toxic},
    {"/proxies/*/toxics/*", M_GET, get_toxic},
    {"/proxies/*/toxics/*", M_POST | M_PATCH, update_toxic},
    {"/proxies/*/toxics/*", M_DELETE, delete_toxic},
    {"/version", M_GET, get_version},
};

static int hex_val(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One path segment, percent-decoded, into out; false when it does not fit or is malformed.
 * (libevent's decoder allocates with twice's allocator: decoding here keeps it simple.) */
static bool decode_segment(const char *seg, size_t n, char out[TOXI_SEG_MAX])
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = seg[i];
        if (c == '%') {
            int hi = i + 2 < n ? hex_val(seg[i + 1]) : -1;
            int lo = hi >= 0 ? hex_val(seg[i + 2]) : -1;
            if (lo < 0)
                return false;
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        if (c == '\0' || o + 1 >= TOXI_SEG_MAX)
            return false;
        out[o++] = c;
    }
    out[o] = '\0';
    return true;
}

/* Whether `path` matches `pattern`; the '*' segments go to args, decoded (*bad when one could
 * not be). */
static bool route_matches(const char *pattern, const char *path, char args[2][TOXI_SEG_MAX],
                          bool *bad)
{
    int nargs = 0;
    while (*pattern != '\0') {
        if (*pattern == '*') {
            size_t n = strcspn(path, "/");
            if (n == 0)
                return false;
            if (!decode_segment(path, n, args[nargs++]))
                *bad = true;
            path += n;
            pattern++;
        } else if (*pattern++ != *path++) {
            return false;
        }
    }
    return *path == '\0';
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct toxi *tx = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri != NULL ? evhttp_uri_get_path(uri) : NULL;
    const char *ua = evhttp_find_header(evhttp_request_get_input_headers(req), "User-Agent");
    if (ua != NULL && strncmp(ua, "Mozilla/", 8) == 0) {
        reply_empty(tx, req, 403, "text/plain; charset=utf-8", "User agent not allowed\n");
        return;
    }
    if (!admin_http_authorized(tx->px, req)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
        reply_error(tx, req, 401, "unauthorized: send Authorization: Bearer TOKEN");
        return;
    }
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    bool path_known = false;
    for (size_t i = 0; path != NULL && i < sizeof(toxi_routes) / sizeof(toxi_routes[0]); i++) {
        char args[2][TOXI_SEG_MAX];
        bool bad = false;
        bool hit = route_matches(toxi_routes[i].path, path, args, &bad) && !bad;
        if (hit && (toxi_routes[i].methods & m)) {
            toxi_routes[i].fn(tx, req, args);
            return;
        }
        path_known = path_known || hit;
    }
    if (path_known)
        reply_plain(tx, req, 405, NULL, "", false);
    else
        reply_plain(tx, req, 404, "text/plain; charset=utf-8", "404 page not found\n", false);
}

/* ---- the server -------------------------------------------------------------------------- */

/* The one API server: evhttp gives its socket's error callback the evhttp, not ours. */
static struct toxi *toxi_server;

static void on_accept_error(struct evconnlistener *evl, void *arg)
{
    (void)arg;
    if (toxi_server != NULL)
        listener_accept_failed(evl, toxi_server->retry, "toxiproxy_api", toxi_server->addr);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct toxi *tx = arg;
    if (tx->evl != NULL)
        evconnlistener_enable(tx->evl);
}

static void server_close(struct toxi *tx)
{
    if (tx->http != NULL)
        evhttp_free(tx->http);
    tx->http = NULL;
    tx->evl = NULL;
    tx->addr[0] = '\0';
}

static int server_open(struct toxi *tx, const struct conf *c, char *err, size_t errlen)
{
    char addr[300];
    conf_addr_format(&c->toxiproxy_api, addr, sizeof(addr));
    if (tx->http != NULL && strcmp(addr, tx->addr) == 0)
        return 0;
    struct evhttp *http = evhttp_new(tx->px->base);
    if (http == NULL) {
        snprintf(err, errlen, "cannot create the Toxiproxy HTTP server");
        return -1;
    }
    evhttp_set_max_body_size(http, TOXI_MAX_BODY);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                         EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH |
                                         EVHTTP_REQ_OPTIONS);
    evhttp_set_gencb(http, on_request, tx);
    evhttp_set_default_content_type(http, NULL); /* Go sends none on a 204 or a 405 */
    struct evhttp_bound_socket *bound =
        evhttp_bind_socket_with_handle(http, c->toxiproxy_api.host, c->toxiproxy_api.port);
    if (bound == NULL) {
        snprintf(err, errlen, "%s:%u:%u: Toxiproxy API cannot listen on %s: %s", c->path,
                 c->toxiproxy_api.loc.line, c->toxiproxy_api.loc.col, addr,
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        evhttp_free(http);
        return -1;
    }
    server_close(tx);
    toxi_server = tx;
    tx->http = http;
    tx->evl = evhttp_bound_socket_get_listener(bound);
    evconnlistener_set_error_cb(tx->evl, on_accept_error);
    snprintf(tx->addr, sizeof(tx->addr), "%s", addr);
    log_msg(LOG_INFO, "toxiproxy API listening", "addr=%s auth=%s", addr,
            c->admin_token != NULL ? "bearer" : "none");
    return 0;
}

/* `toxiproxy-config FILE`: Toxiproxy's start-up JSON, as /populate takes it.  As Toxiproxy,
 * a problem is logged and twice starts with the proxies made before it. */
static void read_config(struct toxi *tx, const char *path)
{
    json_error_t e;
    json_t *arr = json_load_file(path, JSON_DECODE_ANY, &e);
    if (arr == NULL) {
        log_msg(LOG_ERROR, "cannot read toxiproxy-config", "file=\"%s\" error=\"%s\"", path,
                e.text);
        return;
    }
    int status;
    json_t *out = populate(tx, arr, &status);
    json_decref(arr);
    const json_t *proxies = json_object_get(out, "proxies");
    if (status != 201)
        log_msg(LOG_ERROR, "toxiproxy-config failed", "file=\"%s\" error=\"%s\"", path,
                json_string_value(json_object_get(out, "error")));
    else
        log_msg(LOG_INFO, "toxiproxy-config read", "file=\"%s\" proxies=%zu", path,
                json_array_size(proxies));
    json_decref(out);
}

int toxi_apply(struct proxy *px, char *err, size_t errlen)
{
    const struct conf *c = px->conf->conf;
    if (px->toxi == NULL) {
        if (!c->has_toxiproxy_api && c->toxiproxy_config == NULL)
            return 0;
        px->toxi = calloc(1, sizeof(*px->toxi));
        if (px->toxi == NULL ||
            (px->toxi->retry = evtimer_new(px->base, on_retry, px->toxi)) == NULL) {
            free(px->toxi);
            px->toxi = NULL;
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        px->toxi->px = px;
    }
    struct toxi *tx = px->toxi;
    if (!c->has_toxiproxy_api) {
        if (tx->http != NULL)
            log_msg(LOG_INFO, "toxiproxy API closed", "addr=%s", tx->addr);
        server_close(tx);
    } else if (server_open(tx, c, err, errlen) != 0) {
        return -1;
    }
    if (!tx->config_read && c->toxiproxy_config != NULL) {
        tx->config_read = true;
        read_config(tx, c->toxiproxy_config);
    }
    return 0;
}

void toxi_close_listeners(struct proxy *px)
{
    if (px->toxi == NULL)
        return;
    for (struct toxi_proxy *p = px->toxi->proxies; p != NULL; p = p->next) {
        if (p->l != NULL) {
            listener_close(p->l);
            listener_put(p->l);
            p->l = NULL;
        }
    }
}

void toxi_stop(struct proxy *px)
{
    struct toxi *tx = px->toxi;
    if (tx == NULL)
        return;
    server_close(tx);
    while (tx->proxies != NULL) {
        struct toxi_proxy *p = tx->proxies;
        tx->proxies = p->next;
        if (p->l != NULL) {
            listener_close(p->l);
            listener_put(p->l);
            p->l = NULL;
        }
        proxy_free_one(tx, p);
    }
    if (tx->retry != NULL)
        event_free(tx->retry);
    if (toxi_server == tx)
        toxi_server = NULL;
    free_installed(tx);
    free(tx);
    px->toxi = NULL;
}
