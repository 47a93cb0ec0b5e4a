/*
 * proxy.c - the process: configuration, listeners, signals, reload and
 * shutdown around one libevent loop.
 *
 * Reload (SIGHUP) is build-then-swap: the new file is parsed and checked,
 * its TLS contexts built and its new sockets bound before anything changes;
 * any failure leaves the running configuration untouched.  Listeners whose
 * name and bind address did not change keep their socket (no connection is
 * refused during a reload) and take the new settings for the sessions they
 * accept from then on.  Open sessions keep the settings they started with.
 *
 * Shutdown (SIGTERM/SIGINT) closes the listening sockets at once and drains
 * (drain.h): faults off, what a rule only delays goes on, and each session is
 * closed once it has no message under way; what is left may finish for
 * `shutdown-grace`, then is closed.  A second signal closes everything
 * immediately.
 */
#include "proxy/core/proxy.h"

#include <errno.h>
#include <event2/dns.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "proxy/api/admin.h"
#include "proxy/api/toxi.h"
#include "proxy/core/conf_file.h"
#include "proxy/core/drain.h"
#include "proxy/core/journal.h"
#include "proxy/core/log.h"
#include "proxy/core/rule_changes.h"
#include "proxy/net/session.h"
#include "proxy/net/tls.h"
#include "proxy/resp/idmap.h"
#include "proxy/resp/resp_aux.h"
#include "rules/engine.h"

struct conf_ref *conf_ref_new(struct conf *conf)
{
    struct conf_ref *ref = calloc(1, sizeof(*ref));
    if (ref == NULL)
        return NULL;
    ref->refs = 1;
    ref->conf = conf;
    return ref;
}

void conf_ref_put(struct conf_ref *ref)
{
    if (ref == NULL || atomic_fetch_sub(&ref->refs, 1) > 1)
        return;
    conf_free(ref->conf);
    free(ref);
}

void lconf_get(struct lconf *lc)
{
    atomic_fetch_add(&lc->refs, 1);
}

void lconf_put(struct lconf *lc)
{
    if (lc == NULL || atomic_fetch_sub(&lc->refs, 1) > 1)
        return;
    SSL_CTX_free(lc->server_ctx);
    SSL_CTX_free(lc->client_ctx);
    conf_ref_put(lc->root);
    free(lc);
}

static struct lconf *lconf_new(struct conf_ref *root, const struct conf_listener *l,
                               unsigned process_max, char *err, size_t errlen)
{
    struct lconf *lc = calloc(1, sizeof(*lc));
    if (lc == NULL) {
        snprintf(err, errlen, "%s: out of memory", root->conf->path);
        return NULL;
    }
    lc->refs = 1;
    lc->root = root;
    atomic_fetch_add(&root->refs, 1);
    lc->l = l;
    lc->process_max = process_max;
    lc->max_sessions =
        l->max_connections != 0 ? l->max_connections : process_max / PROXY_LISTENER_SHARE;
    if (lc->max_sessions == 0)
        lc->max_sessions = 1;
    conf_addr_format(&l->bind, lc->bind_str, sizeof(lc->bind_str));
    conf_addr_format(&l->upstream, lc->upstream_str, sizeof(lc->upstream_str));
    int salen = (int)sizeof(lc->upstream_sa);
    if (evutil_parse_sockaddr_port(lc->upstream_str, (struct sockaddr *)&lc->upstream_sa, &salen) ==
        0) {
        lc->upstream_is_literal = true;
        lc->upstream_salen = (socklen_t)salen;
    }
    char why[400];
    if (l->tls.enabled && (lc->server_ctx = tls_server_ctx_new(&l->tls, why, sizeof(why))) == NULL)
        goto fail;
    if (l->upstream_tls.enabled &&
        (lc->client_ctx = tls_client_ctx_new(&l->upstream_tls, why, sizeof(why))) == NULL)
        goto fail;
    return lc;
fail:
    snprintf(err, errlen, "%s:%u:%u: listener '%s': %s", root->conf->path, l->loc.line, l->loc.col,
             l->name, why);
    lconf_put(lc);
    return NULL;
}

struct lconf **lconf_build_all(struct conf_ref *ref, unsigned process_max, char *err, size_t errlen)
{
    size_t n = ref->conf->n_listeners;
    struct lconf **all = calloc(n ? n : 1, sizeof(*all));
    if (all == NULL) {
        snprintf(err, errlen, "%s: out of memory", ref->conf->path);
        return NULL;
    }
    size_t i = 0;
    for (const struct conf_listener *l = ref->conf->listeners; l != NULL; l = l->next, i++) {
        all[i] = lconf_new(ref, l, process_max, err, errlen);
        if (all[i] == NULL) {
            while (i-- > 0)
                lconf_put(all[i]);
            free(all);
            return NULL;
        }
    }
    return all;
}

static void log_listening(const struct listener *l)
{
    const struct lconf *c = l->cfg;
    struct log_line line;
    log_begin(&line, LOG_INFO, "listening");
    log_str(&line, "listener", c->l->name);
    log_str(&line, "protocol", conf_protocol_name(c->l->protocol));
    log_str(&line, "bind", c->bind_str);
    log_str(&line, "upstream", c->upstream_str);
    log_fmt(&line, "max_connections", "%u", c->max_sessions);
    if (c->server_ctx != NULL)
        log_str(&line, "tls", "on");
    if (c->client_ctx != NULL)
        log_str(&line, "upstream_tls", c->l->upstream_tls.verify ? "verify" : "no-verify");
    log_end(&line);
}

void proxy_log_diags(const struct conf_diags *d)
{
    for (const struct conf_diag *g = d->head; g != NULL; g = g->next) {
        struct log_line line;
        log_begin(&line, g->severity == CONF_ERROR ? LOG_ERROR : LOG_WARN, "config");
        log_repeat_limit(&line, 0); /* every diagnostic of the file */
        log_fmt(&line, "at", "%s:%u:%u", d->file ? d->file : "?", g->loc.line, g->loc.col);
        log_str(&line, "problem", g->msg);
        if (g->hint != NULL)
            log_str(&line, "hint", g->hint);
        log_end(&line);
    }
}

static struct listener *find_reusable(struct proxy *px, const struct lconf *lc)
{
    for (struct listener *l = px->listeners; l != NULL; l = l->next) {
        if (l->evl != NULL && strcmp(l->cfg->l->name, lc->l->name) == 0 &&
            strcmp(l->cfg->bind_str, lc->bind_str) == 0)
            return l;
    }
    return NULL;
}

/* The sessions the open-file limit leaves room for, with PROXY_FDS_* kept
 * for the rest of the process, when `c` is applied. */
static unsigned session_limit(const struct proxy *px, const struct conf *c)
{
    struct rlimit rl;
    uint64_t nofile = UINT32_MAX; /* no limit: count as many as a cap can say */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < nofile)
        nofile = rl.rlim_cur;
    uint64_t reserved = PROXY_FDS_RESERVED + (uint64_t)PROXY_FDS_PER_LOOP * px->n_loops +
                        2 * (uint64_t)c->n_listeners;
    if (nofile < reserved + PROXY_FDS_PER_SESSION)
        return 1;
    return (unsigned)((nofile - reserved) / PROXY_FDS_PER_SESSION);
}

/* Warn about a `max-connections` that the process-wide limit will cut first. */
static void warn_caps(struct lconf **lcs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lcs[i]->max_sessions > lcs[i]->process_max)
            log_msg(LOG_WARN, "max-connections above the open-file limit",
                    "listener=%s max_connections=%u process_max_connections=%u "
                    "hint=\"raise the open-file limit (ulimit -n, LimitNOFILE=)\"",
                    lcs[i]->l->name, lcs[i]->max_sessions, lcs[i]->process_max);
}

/* Make `ref` the running configuration.  On failure nothing changes and
 * -1 is returned with the reason in `err`, which starts with the file's
 * name, and its line where a listener is concerned (a port another process
 * holds): the same words at start, at reload and in POST /reload's answer. */
static struct ruleset *ruleset_of(struct proxy *px, struct conf_ref *ref);

static int apply_conf(struct proxy *px, struct conf_ref *ref, char *err, size_t errlen)
{
    unsigned process_max = session_limit(px, ref->conf);
    struct lconf **lcs = lconf_build_all(ref, process_max, err, errlen);
    if (lcs == NULL)
        return -1;
    if (ref->conf->has_seed)
        px->seed = ref->conf->seed;
    struct ruleset *rs = ruleset_of(px, ref);
    size_t n = ref->conf->n_listeners;
    struct listener **next = calloc(n ? n : 1, sizeof(*next));
    bool *reused = calloc(n ? n : 1, sizeof(*reused));
    int rc = -1;
    if (next == NULL || reused == NULL || rs == NULL) {
        snprintf(err, errlen, "%s: out of memory", ref->conf->path);
        goto out;
    }
    /* Bind every new address first: a failure must leave nothing changed. */
    for (size_t i = 0; i < n; i++) {
        next[i] = find_reusable(px, lcs[i]);
        reused[i] = next[i] != NULL;
        if (!reused[i] && (next[i] = listener_open(px, lcs[i], err, errlen)) == NULL) {
            for (size_t j = 0; j < i; j++)
                if (!reused[j])
                    listener_put(next[j]);
            goto out;
        }
    }
    /* Commit: swap settings into kept listeners, close the dropped ones. */
    for (size_t i = 0; i < n; i++) {
        if (reused[i]) {
            lconf_get(lcs[i]);
            lconf_put(next[i]->cfg);
            next[i]->cfg = lcs[i];
        }
    }
    for (struct listener *l = px->listeners, *nx; l != NULL; l = nx) {
        nx = l->next;
        bool kept = false;
        for (size_t i = 0; i < n; i++)
            kept = kept || next[i] == l;
        if (!kept) {
            log_msg(LOG_INFO, "listener closed", "listener=%s bind=%s", l->cfg->l->name,
                    l->cfg->bind_str);
            listener_close(l);
            listener_put(l);
        }
    }
    px->listeners = NULL;
    for (size_t i = n; i-- > 0;) {
        next[i]->next = px->listeners;
        px->listeners = next[i];
    }
    for (size_t i = 0; i < n; i++)
        if (!reused[i])
            log_listening(next[i]);
    warn_caps(lcs, n);
    px->session_max = process_max;
    conf_ref_put(px->conf);
    px->conf = ref;
    atomic_fetch_add(&ref->refs, 1);
    log_set_level((enum log_level)ref->conf->log_level);
    proxy_set_rules(px, rs);
    rs = NULL;
    rc = 0;
out:
    if (rs != NULL)
        ruleset_put(rs);
    for (size_t i = 0; i < n; i++)
        lconf_put(lcs[i]);
    free(lcs);
    free(next);
    free(reused);
    return rc;
}

static char *diags_text(const struct conf_diags *d)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return NULL;
    conf_diags_print(d, f);
    fclose(f);
    return text;
}

static void free_conf_ref(void *p)
{
    conf_ref_put(p);
}

/* The ruleset of configuration `ref`, or NULL when memory runs out. */
static struct ruleset *ruleset_of(struct proxy *px, struct conf_ref *ref)
{
    struct ruleset *rs = ruleset_new(ref->conf->rules, px->seed, px->start_ms);
    if (rs == NULL)
        return NULL;
    atomic_fetch_add(&ref->refs, 1);
    ruleset_set_owner(rs, ref, free_conf_ref);
    return rs;
}

void proxy_set_rules(struct proxy *px, struct ruleset *rs)
{
    ruleset_inherit(rs, px->rules); /* counters, switches and the kill switch */
    if (px->rules != NULL)
        ruleset_put(px->rules);
    px->rules = rs;
    loop_set_rules_all(px, rs);
}

int proxy_reload(struct proxy *px, char **diag)
{
    struct conf_diags d;
    struct conf *c = NULL;
    conf_diags_init(&d);
    log_msg(LOG_INFO, "reloading", "file=\"%s\"", px->conf_path);
    if (conf_parse_file(px->conf_path, &c, &d) == 0)
        tls_check_conf(c, &d);
    proxy_log_diags(&d);
    if (d.errors != 0) {
        log_msg(LOG_ERROR, "reload failed", "errors=%u", d.errors);
        if (diag != NULL)
            *diag = diags_text(&d);
        conf_diags_free(&d);
        conf_free(c);
        return -1;
    }
    conf_diags_free(&d);
    struct conf_ref *ref = conf_ref_new(c);
    char err[512];
    snprintf(err, sizeof(err), "%s: out of memory", px->conf_path);
    if (ref == NULL || apply_conf(px, ref, err, sizeof(err)) != 0) {
        if (ref == NULL)
            conf_free(c);
        struct log_line line;
        log_begin(&line, LOG_ERROR, "reload failed");
        log_str(&line, "error", err);
        log_end(&line);
        if (diag != NULL && asprintf(diag, "%s\n", err) < 0)
            *diag = NULL;
        conf_ref_put(ref);
        return -1;
    }
    conf_ref_put(ref);
    const struct conf *nc = px->conf->conf;
    const char *was = px->journal_path, *now = nc->journal;
    struct journal_flush flush = {0};
    if (px->journal != NULL)
        flush = journal_flush_of(px->journal);
    if ((was == NULL) != (now == NULL) || (was != NULL && strcmp(was, now) != 0) ||
        (px->journal != NULL && (nc->journal_flush_ms != flush.interval_ms ||
                                 nc->journal_every_record != flush.every_record)))
        log_msg(LOG_WARN, "journal unchanged",
                "reason=\"the journal and its journal-flush are chosen at start: restart "
                "twice to change them\"");
    if (admin_apply(px, err, sizeof(err)) != 0)
        log_msg(LOG_ERROR, "admin API not moved", "error=\"%s\"", err);
    /* The Toxiproxy API's proxies are not the file's: a reload keeps them and their toxics. */
    if (toxi_apply(px, err, sizeof(err)) != 0)
        log_msg(LOG_ERROR, "toxiproxy API not moved", "error=\"%s\"", err);
    toxi_rules_changed(px);
    unsigned n = 0;
    for (struct listener *l = px->listeners; l != NULL; l = l->next)
        n++;
    if (px->conf->conf->threads != px->conf_threads)
        log_msg(LOG_WARN, "threads unchanged",
                "reason=\"the number of threads is chosen at start: restart twice to change "
                "it\" threads=%u",
                px->n_loops);
    px->conf_threads = px->conf->conf->threads;
    log_msg(LOG_INFO, "reloaded", "listeners=%u rules=%zu sessions=%u", n, ruleset_count(px->rules),
            proxy_sessions(px));
    return 0;
}

static void on_grace_over(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct proxy *px = arg;
    log_msg(LOG_WARN, "grace period over", "closing=%u", proxy_sessions(px));
    loop_close_all(px);
}

static void begin_shutdown(struct proxy *px, const char *signame)
{
    if (px->shutting_down) {
        log_msg(LOG_WARN, "second signal: closing now", "signal=%s sessions=%u", signame,
                proxy_sessions(px));
        loop_close_all(px);
        return;
    }
    px->shutting_down = true;
    uint32_t grace = px->conf->conf->grace_ms;
    log_msg(LOG_INFO, "shutting down", "signal=%s grace_ms=%u sessions=%u", signame, grace,
            proxy_sessions(px));
    /* A drain: no new fault, what a rule only delays goes on now, each session is closed once
     * it has no message under way (drain.h); what is still held or scheduled has the grace. */
    if (px->rules != NULL && ruleset_faults_enabled(px->rules)) {
        ruleset_set_faults_enabled(px->rules, false);
        log_msg(LOG_INFO, "faults off", "source=shutdown");
    }
    while (px->listeners != NULL) {
        struct listener *l = px->listeners;
        px->listeners = l->next;
        listener_close(l);
        listener_put(l);
    }
    toxi_close_listeners(px);
    struct timeval tv = {.tv_sec = grace / 1000, .tv_usec = (grace % 1000) * 1000};
    evtimer_add(px->grace_timer, &tv);
    loop_shutdown_all(px);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    struct proxy *px = arg;
    if (sig == SIGHUP) {
        if (!px->shutting_down && proxy_reload(px, NULL) == 0)
            rule_changes_signal(px);
        return;
    }
    begin_shutdown(px, sig == SIGTERM ? "TERM" : "INT");
}

uint64_t proxy_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A seed for a run whose file sets none; logged and journaled so the run
 * can be repeated with `seed N`. */
static uint64_t random_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return seed;
}

struct listener_stats *proxy_stats(struct proxy *px, const char *name)
{
    for (struct listener_stats *st = px->stats; st != NULL; st = st->next)
        if (strcmp(st->name, name) == 0)
            return st;
    struct listener_stats *st = calloc(1, sizeof(*st));
    size_t size = px->n_loops * sizeof(*st->per_loop);
    size_t psize = px->n_loops * sizeof(*st->pending);
    if (st == NULL ||
        (st->per_loop = aligned_alloc(_Alignof(struct listener_counts), size)) == NULL ||
        (st->pending = aligned_alloc(_Alignof(struct listener_pending), psize)) == NULL) {
        if (st != NULL)
            free(st->per_loop);
        free(st);
        return NULL;
    }
    memset(st->per_loop, 0, size);
    memset(st->pending, 0, psize);
    snprintf(st->name, sizeof(st->name), "%s", name);
    st->next = px->stats;
    px->stats = st;
    return st;
}

struct listener_counts proxy_stats_total(const struct proxy *px, const struct listener_stats *st)
{
    struct listener_counts t = {0};
    for (unsigned i = 0; i < px->n_loops; i++) {
        const struct listener_counts *c = &st->per_loop[i];
        t.connections += stat_get(&c->connections);
        t.open += stat_get(&c->open);
        t.bytes_up += stat_get(&c->bytes_up);
        t.bytes_down += stat_get(&c->bytes_down);
        for (int e = 0; e < RULE_EV_COUNT; e++)
            t.events[e] += stat_get(&c->events[e]);
    }
    return t;
}

/* `threads N`, or one loop per core (`auto`, the default). */
static int make_loops(struct proxy *px, unsigned threads)
{
    if (threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores < 1 ? 1 : cores > CONF_MAX_THREADS ? CONF_MAX_THREADS : (unsigned)cores;
    }
    px->loops = aligned_alloc(_Alignof(struct loop), threads * sizeof(*px->loops));
    if (px->loops == NULL)
        return -1;
    memset(px->loops, 0, threads * sizeof(*px->loops));
    px->n_loops = threads;
    for (unsigned i = 0; i < threads; i++)
        if (loop_init(&px->loops[i], px, i) != 0)
            return -1;
    px->base = px->loops[0].base;
    return 0;
}

/* Repeated log lines held back are counted in a line once their interval is
 * over, even when nothing is logged after them. */
static void on_log_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    log_repeat_flush(0);
}

static int setup_events(struct proxy *px)
{
    struct timeval tick = {.tv_sec = LOG_REPEAT_INTERVAL_MS / 1000,
                           .tv_usec = (LOG_REPEAT_INTERVAL_MS % 1000) * 1000};
    px->log_timer = event_new(px->base, -1, EV_PERSIST, on_log_tick, px);
    if (px->log_timer == NULL || evtimer_add(px->log_timer, &tick) != 0)
        return -1;
    px->grace_timer = evtimer_new(px->base, on_grace_over, px);
    px->sig_term = evsignal_new(px->base, SIGTERM, on_signal, px);
    px->sig_int = evsignal_new(px->base, SIGINT, on_signal, px);
    px->sig_hup = evsignal_new(px->base, SIGHUP, on_signal, px);
    if (px->grace_timer == NULL || px->sig_term == NULL || px->sig_int == NULL ||
        px->sig_hup == NULL)
        return -1;
    if (evsignal_add(px->sig_term, NULL) != 0 || evsignal_add(px->sig_int, NULL) != 0 ||
        evsignal_add(px->sig_hup, NULL) != 0)
        return -1;
    return 0;
}

_Static_assert(CONF_DEFAULT_JOURNAL_FLUSH_MS == JOURNAL_FLUSH_INTERVAL_MS,
               "journal-flush's default is the writer's");
_Static_assert((int)CONF_JOURNAL_NEW == (int)JOURNAL_MODE_NEW &&
                   (int)CONF_JOURNAL_APPEND == (int)JOURNAL_MODE_APPEND &&
                   (int)CONF_JOURNAL_OVERWRITE == (int)JOURNAL_MODE_OVERWRITE,
               "`journal PATH MODE` names the writer's modes");

/* The error of a journal that was refused because it holds a run: what to do about it. */
static void journal_refused_hint(char *err, size_t errlen, const char *conf_path)
{
    size_t n = strlen(err);
    snprintf(err + n, errlen - n,
             ": twice does not overwrite a journal unless told. Move it away, or start with "
             "--journal-mode append (add this run after it: twice report and twice verdict read "
             "every run) or --journal-mode overwrite (replace it), or say so in %s: "
             "`journal PATH append` or `journal PATH overwrite`",
             conf_path);
}

/* Logs what opening the journal did to a file that held something. */
static void journal_found_log(const char *path, enum journal_mode mode,
                              const struct journal_found *found)
{
    if (found->bytes == 0)
        return;
    if (mode == JOURNAL_MODE_OVERWRITE)
        log_msg(LOG_WARN, "journal overwritten", "path=\"%s\" bytes=%llu", path,
                (unsigned long long)found->bytes);
    else
        log_msg(LOG_INFO, "journal appended to", "path=\"%s\" bytes=%llu", path,
                (unsigned long long)(found->bytes - found->cut_short));
    if (found->cut_short != 0)
        log_msg(LOG_WARN, "journal's last record was cut short: cut off",
                "path=\"%s\" bytes=%llu reason=\"the twice before was killed while writing it: "
                "it never read\"",
                path, (unsigned long long)found->cut_short);
}

/* Open the journal named by the configuration, if any, as `mode` says. */
static int open_journal(struct proxy *px, const struct conf *c, enum journal_mode mode)
{
    if (c->journal == NULL)
        return 0;
    struct journal_header_info hdr = {
        .seed = px->seed, .config_path = px->conf_path, .instance = px->instance};
    struct timeval tv;
    gettimeofday(&tv, NULL);
    hdr.start_unix_ms = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
    memcpy(hdr.config_sha256, px->rules_sha256, sizeof(hdr.config_sha256));
    char err[1024]; /* a refusal names the journal, the configuration and what to do */
    size_t n = c->n_listeners;
    const char **names = calloc(3 * n + 1, sizeof(*names));
    uint32_t *visibility = calloc(n + 1, sizeof(*visibility));
    bool *consumer = calloc(n + 1, sizeof(*consumer));
    px->journal_path = strdup(c->journal);
    if (px->journal_path == NULL || names == NULL || visibility == NULL || consumer == NULL) {
        snprintf(err, sizeof(err), "%s: out of memory", c->journal);
    } else {
        size_t i = 0;
        for (const struct conf_listener *l = c->listeners; l != NULL && i < n; l = l->next, i++) {
            names[i] = l->name;
            names[n + i] = conf_protocol_name(l->protocol);
            names[2 * n + i] = l->profile;
            visibility[i] = l->visibility_ms;
            consumer[i] = l->consumer_timeout;
        }
        hdr.listener_names = names;
        hdr.listener_protocols = names + n;
        hdr.listener_profiles = names + 2 * n;
        hdr.listener_visibility_ms = visibility;
        hdr.listener_consumer_timeout = consumer;
        hdr.n_listeners = i;
        struct journal_flush flush = {.interval_ms = c->journal_flush_ms,
                                      .every_record = c->journal_every_record};
        struct journal_found found;
        px->journal = journal_open_mode(c->journal, &hdr, &flush, mode, &found, err, sizeof(err));
        if (px->journal == NULL && found.refused)
            journal_refused_hint(err, sizeof(err), px->conf_path);
        else if (px->journal != NULL)
            journal_found_log(c->journal, mode, &found);
    }
    free(names);
    free(visibility);
    free(consumer);
    if (px->journal == NULL) {
        struct log_line line;
        log_begin(&line, LOG_ERROR, "cannot open journal");
        log_str(&line, "path", c->journal);
        log_str(&line, "error", err);
        log_end(&line);
        return -1;
    }
    char flush[32];
    if (c->journal_every_record)
        snprintf(flush, sizeof(flush), "every-record");
    else
        snprintf(flush, sizeof(flush), "%ums", (unsigned)c->journal_flush_ms);
    log_msg(LOG_INFO, "journal open", "path=\"%s\" seed=%llu flush=%s mode=%s", c->journal,
            (unsigned long long)px->seed, flush, conf_journal_mode_names[mode]);
    return 0;
}

/* `user NAME`: once every socket is bound and the journal is open, give up
 * root for good (groups, then gid, then uid), so a compromised session cannot
 * act as root.  A reload keeps the user the process started with. */
static int drop_privileges(const char *user, char *err, size_t errlen)
{
    if (user == NULL)
        return 0;
    struct passwd *pw = getpwnam(user);
    if (pw == NULL) {
        snprintf(err, errlen, "user '%s' does not exist", user);
        return -1;
    }
    if (geteuid() == pw->pw_uid && getuid() == pw->pw_uid)
        return 0;
    if (geteuid() != 0) {
        snprintf(err, errlen, "cannot switch to user '%s': twice is not running as root", user);
        return -1;
    }
    if (initgroups(user, pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) {
        snprintf(err, errlen, "cannot switch to user '%s': %s", user, strerror(errno));
        return -1;
    }
    if (setuid(0) == 0) {
        snprintf(err, errlen, "switched to user '%s' but could regain root", user);
        return -1;
    }
    log_msg(LOG_INFO, "dropped privileges", "user=%s uid=%lu gid=%lu", user,
            (unsigned long)pw->pw_uid, (unsigned long)pw->pw_gid);
    return 0;
}

int proxy_init(struct proxy *px, const char *conf_path, const struct proxy_options *opt)
{
    memset(px, 0, sizeof(*px));
    struct conf_diags d;
    struct conf *c = NULL;
    conf_diags_init(&d);
    int rc = conf_parse_file(conf_path, &c, &d);
    if (rc == 0)
        tls_check_conf(c, &d);
    rc = d.errors ? -1 : 0;
    if (rc != 0) {
        /* As `twice check` prints them: the file's mistakes, for the person who started it. */
        conf_diags_print(&d, stderr);
        conf_diags_free(&d);
        conf_free(c);
        return -1;
    }
    log_set_level((enum log_level)c->log_level);
    proxy_log_diags(&d); /* warnings: in the log, as at a reload */
    conf_diags_free(&d);
    px->start_ms = proxy_now_ms();
    px->seed = c->has_seed ? c->seed : random_seed();
    px->conf_path = strdup(conf_path);
    px->conf_threads = c->threads;
    rule_changes_file_sha256(conf_path, px->rules_sha256);
    if (px->conf_path == NULL || make_loops(px, c->threads) != 0 || setup_events(px) != 0) {
        conf_free(c);
        log_msg(LOG_ERROR, "cannot start event loop", NULL);
        return -1;
    }
    enum conf_journal_mode mode =
        opt != NULL && opt->journal_mode_set ? opt->journal_mode : c->journal_mode;
    /* Which twice this is, among several whose journals are read together: `instance NAME`,
     * or the host name (docs/instances.md).  Fixed at start, as the journal is. */
    if (c->instance != NULL)
        snprintf(px->instance, sizeof(px->instance), "%s", c->instance);
    else if (gethostname(px->instance, sizeof(px->instance) - 1) != 0)
        px->instance[0] = '\0';
    if (open_journal(px, c, (enum journal_mode)mode) != 0) {
        conf_free(c);
        return -1;
    }
    struct conf_ref *ref = conf_ref_new(c);
    if (ref == NULL) {
        conf_free(c);
        return -1;
    }
    char err[512];
    rc = apply_conf(px, ref, err, sizeof(err));
    conf_ref_put(ref);
    if (rc == 0)
        rc = admin_apply(px, err, sizeof(err));
    if (rc == 0)
        rc = toxi_apply(px, err, sizeof(err));
    if (rc == 0)
        rc = drop_privileges(px->conf->conf->user, err, sizeof(err));
    if (rc != 0) {
        struct log_line line;
        log_begin(&line, LOG_ERROR, "cannot start");
        log_str(&line, "error", err);
        log_end(&line);
        return -1;
    }
    return 0;
}

int proxy_run(struct proxy *px)
{
    for (unsigned i = 1; i < px->n_loops; i++)
        if (loop_start(&px->loops[i]) != 0)
            break; /* the loops that did not start leave their share to loop 0 */
    log_msg(LOG_INFO, "started",
            "version=%s pid=%ld seed=%llu rules=%zu threads=%u max_connections=%u", TWICE_VERSION,
            (long)getpid(), (unsigned long long)px->seed, ruleset_count(px->rules), px->n_loops,
            px->session_max);
    if (event_base_dispatch(px->base) < 0) {
        log_msg(LOG_ERROR, "event loop failed", NULL);
        return 1;
    }
    log_repeat_flush(1);
    log_msg(LOG_INFO, "stopped", NULL);
    return px->exit_code;
}

static void free_event(struct event **ev)
{
    if (*ev != NULL) {
        event_free(*ev);
        *ev = NULL;
    }
}

void proxy_free(struct proxy *px)
{
    /* What lives on the main loop first, then the loops and their sessions
     * (which journal their close), then what sessions used. */
    while (px->listeners != NULL) {
        struct listener *l = px->listeners;
        px->listeners = l->next;
        listener_close(l);
        listener_put(l);
    }
    drain_stop(px);
    admin_stop(px);
    toxi_stop(px);
    free_event(&px->grace_timer);
    free_event(&px->log_timer);
    free_event(&px->sig_term);
    free_event(&px->sig_int);
    free_event(&px->sig_hup);
    loop_free_all(px);
    px->base = NULL;
    log_repeat_flush(1); /* the sessions closed just now */
    idmap_clear();
    /* The last record says the run ended in good order (its time ends the run for the verdict:
     * work that stopped long before it stalled). */
    struct journal_record stop = {.kind = JOURNAL_KIND_STOP};
    journal_record(px->journal, &stop);
    journal_close(px->journal);
    px->journal = NULL;
    free(px->journal_path);
    if (px->rules != NULL)
        ruleset_put(px->rules);
    while (px->stats != NULL) {
        struct listener_stats *st = px->stats;
        px->stats = st->next;
        free(st->per_loop);
        free(st->pending);
        free(st);
    }
    conf_ref_put(px->conf);
    free(px->conf_path);
    memset(px, 0, sizeof(*px));
}
