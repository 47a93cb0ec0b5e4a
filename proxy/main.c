/*
 * main.c - the `twice` command line.
 *
 *   twice run -c FILE      run the proxy in the foreground
 *   twice check -c FILE    validate FILE, print a summary or every error
 *   twice --version | --help
 */
#include <event2/thread.h>
#include <malloc.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "offline/report.h"
#include "proxy/blockcache.h"
#include "proxy/conf_file.h"
#include "proxy/fault.h"
#include "proxy/log.h"
#include "proxy/proxy.h"
#include "proxy/tls.h"
#include "rules/conf.h"
#include "rules/rule.h"

static const char usage[] =
    "usage: twice run -c FILE      run the proxy described by FILE\n"
    "       twice check -c FILE    check FILE and print a summary or every error\n"
    "       twice report JOURNAL [--json] [--message ID]\n"
    "                              faults per rule, deliveries per message, a message's timeline\n"
    "       twice verdict --journal JOURNAL --effects FILE [--json]\n"
    "                              which task types are not idempotent (exit 1 if any)\n"
    "       twice --version        print the version\n"
    "       twice --help           print this help\n"
    "\n"
    "Signals while running: SIGHUP re-reads FILE; SIGTERM or SIGINT stop accepting,\n"
    "let open sessions finish for `shutdown-grace`, then exit.\n";

/* A proxy holds two descriptors per session: ask for as many as allowed. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            log_msg(LOG_WARN, "cannot raise open file limit", NULL);
    }
}

/* A listener's `message-id` or `task` sources, as written. */
static void print_fields(const char *name, const struct msg_fields *fs)
{
    if (fs->n == 0)
        return;
    printf(", %s", name);
    for (size_t i = 0; i < fs->n; i++)
        printf(" %s", fs->src[i].text);
}

static void print_listener(const struct conf_listener *l)
{
    char bind[300], up[300];
    conf_addr_format(&l->bind, bind, sizeof(bind));
    conf_addr_format(&l->upstream, up, sizeof(up));
    printf("  listen %s: %s %s%s -> %s%s", l->name, conf_protocol_name(l->protocol), bind,
           l->tls.enabled ? " (tls)" : "", up,
           !l->upstream_tls.enabled ? ""
           : l->upstream_tls.verify ? " (tls, verify)"
                                    : " (tls, no-verify)");
    if (l->profile != NULL)
        printf(" profile %s", l->profile);
    printf(", connect-timeout %ums", l->connect_timeout_ms);
    if (l->idle_timeout_ms)
        printf(", idle-timeout %ums", l->idle_timeout_ms);
    if (l->max_connections)
        printf(", max-connections %u", l->max_connections);
    if (l->visibility_ms)
        printf(", %s %ums", l->consumer_timeout ? "consumer-timeout" : "visibility-timeout",
               l->visibility_ms);
    print_fields("message-id", &l->message_id);
    print_fields("task", &l->task);
    printf("\n");
}

/* "  rule NAME on LISTENER: when EVENT MATCHERS, TRIGGERS, unless 'a' acts first -> ACTION": what
 * the rule does, as it would be written, and the earlier rules that take its events first (one
 * rule acts on an event: rules/engine.h). */
static void print_rule(const struct conf *c, const struct rule *r)
{
    char detail[160], matchers[512], triggers[256];
    fault_describe(r, detail, sizeof(detail));
    rule_matchers_text(r, matchers, sizeof(matchers));
    rule_triggers_text(r, triggers, sizeof(triggers));
    printf("  rule %s on %s: %s%s%s%s%s%s", r->name, r->listener,
           r->event == RULE_EV_STREAM ? "every connection" : "when ",
           r->event == RULE_EV_STREAM ? "" : rule_event_name(r->event), matchers[0] ? " " : "",
           matchers, triggers[0] ? ", " : "", triggers);
    size_t n = 0;
    for (const struct rule *o = c->rules; o != NULL && o != r; o = o->next)
        if (rule_takes_before(o, r))
            printf("%s'%s'", n++ == 0 ? ", unless " : " or ", o->name);
    printf("%s -> %s%s\n",
           n == 0   ? ""
           : n == 1 ? " acts first"
                    : " act first",
           detail, r->enabled ? "" : " (disabled)");
}

static int cmd_check(const char *path)
{
    struct conf_diags d;
    struct conf *c = NULL;
    conf_diags_init(&d);
    if (conf_parse_file(path, &c, &d) == 0)
        tls_check_conf(c, &d);
    conf_diags_print(&d, stderr);
    int rc = d.errors ? 1 : 0;
    if (rc == 0) {
        printf("%s: OK: %zu listener%s, %zu rule%s, %u warning%s\n", path, c->n_listeners,
               c->n_listeners == 1 ? "" : "s", c->n_rules, c->n_rules == 1 ? "" : "s", d.warnings,
               d.warnings == 1 ? "" : "s");
        for (const struct conf_listener *l = c->listeners; l != NULL; l = l->next)
            print_listener(l);
        for (const struct rule *r = c->rules; r != NULL; r = r->next)
            print_rule(c, r);
    } else {
        fprintf(stderr, "%s: %u error%s\n", path, d.errors, d.errors == 1 ? "" : "s");
    }
    conf_diags_free(&d);
    conf_free(c);
    return rc;
}

static int cmd_run(const char *path)
{
    struct proxy px;
    signal(SIGPIPE, SIG_IGN);
    log_libevent_install();
    raise_fd_limit();
    /* Relayed bytes live in evbuffer chains of 1 KiB to 256 KiB, allocated
     * per read and freed per write.  With glibc's defaults each free of
     * one at the top of the heap trimmed it (brk) and the next read grew it
     * again: a brk per read.  Fixed thresholds keep chains up to 1 MiB on
     * the heap and let 8 MiB of free heap stay before it is given back. */
    mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 8 * 1024 * 1024);
    /* Before any libevent call that allocates: its chains then come from
     * a per-thread cache (blockcache.h). */
    blockcache_install();
    /* Before any event base: libevent's global state (evdns's random
     * numbers) is then locked; each base is still lock-free (loop.c). */
    if (evthread_use_pthreads() != 0) {
        log_msg(LOG_ERROR, "cannot set up libevent for threads", NULL);
        return 1;
    }
    if (proxy_init(&px, path) != 0) {
        proxy_free(&px);
        return 1;
    }
    int rc = proxy_run(&px);
    proxy_free(&px);
    return rc;
}

/* Find `-c FILE` / `--config FILE` / `--config=FILE` in argv[2..]. */
static const char *config_arg(int argc, char **argv)
{
    for (int i = 2; i < argc; i++) {
        if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) && i + 1 < argc)
            return argv[i + 1];
        if (strncmp(argv[i], "--config=", 9) == 0)
            return argv[i] + 9;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("twice %s\n", TWICE_VERSION);
        return 0;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "report") == 0)
        return report_main(argc - 1, argv + 1);
    if (strcmp(cmd, "verdict") == 0)
        return verdict_main(argc - 1, argv + 1);
    if (strcmp(cmd, "run") != 0 && strcmp(cmd, "check") != 0) {
        fprintf(stderr, "twice: unknown command '%s'\n\n%s", cmd, usage);
        return 2;
    }
    const char *path = config_arg(argc, argv);
    if (path == NULL) {
        fprintf(stderr, "twice %s: missing -c FILE\n\n%s", cmd, usage);
        return 2;
    }
    return strcmp(cmd, "check") == 0 ? cmd_check(path) : cmd_run(path);
}
