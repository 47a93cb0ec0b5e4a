/*
 * main.c - the `twice` command line.
 *
 *   twice run CONFIG [--journal-mode new|append|overwrite]
 *                          run the proxy in the foreground
 *   twice check CONFIG     validate CONFIG, print a summary or every error
 *   twice report JOURNAL, twice verdict JOURNAL   (offline/report.h)
 *   twice help [COMMAND] | --help | --version
 *
 * Every command takes its file the same way (offline/cli.h): as its first
 * argument, or by its flag (-c/--config for run and check).
 */
#include <event2/thread.h>
#include <malloc.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "offline/cli.h"
#include "offline/report.h"
#include "proxy/core/conf_file.h"
#include "proxy/core/log.h"
#include "proxy/core/proxy.h"
#include "proxy/core/version.h"
#include "proxy/net/blockcache.h"
#include "proxy/net/fault.h"
#include "proxy/net/tls.h"
#include "rules/conf.h"
#include "rules/rule.h"

static const char usage[] =
    "usage: twice run CONFIG [--journal-mode MODE]\n"
    "                                run the proxy described by CONFIG, in the foreground\n"
    "       twice check CONFIG       check CONFIG: a summary, or every error as FILE:LINE:COL\n"
    "       twice report JOURNAL... [--json] [--message ID] [--messages]\n"
    "                                faults per rule, deliveries per message, timelines\n"
    "       twice verdict JOURNAL... --effects EFFECTS... [--json] [--require R]...\n"
    "                                which task types are not idempotent (exit 1 if any)\n"
    "       twice help [COMMAND]     this help, or the options of COMMAND\n"
    "       twice --version          the version, the git commit, each library's version\n"
    "\n"
    "Each command takes its file as its first argument, or by a flag: -c CONFIG or\n"
    "--config CONFIG for run and check, --journal JOURNAL for report and verdict; report and\n"
    "verdict read several journals together (twice instances: `--journal 'runs/*.pb'`).\n"
    "\n"
    "Signals while running: SIGHUP re-reads CONFIG; SIGTERM or SIGINT stop accepting,\n"
    "let open sessions finish for `shutdown-grace`, then exit.\n";

static const char usage_run[] =
    "usage: twice run CONFIG\n"
    "  CONFIG  the configuration file (also -c CONFIG, --config CONFIG)\n"
    "  --journal-mode new|append|overwrite\n"
    "          what to do with a journal file that holds a run already, over CONFIG's\n"
    "          `journal PATH MODE`: new (the default) refuses to start, append adds this\n"
    "          run after it, overwrite replaces it\n"
    "Runs the proxy in the foreground, logging to stderr.  SIGHUP re-reads CONFIG;\n"
    "SIGTERM or SIGINT stop accepting, let open sessions finish for `shutdown-grace`,\n"
    "then exit.\n";

static const char usage_check[] =
    "usage: twice check CONFIG\n"
    "  CONFIG  the configuration file (also -c CONFIG, --config CONFIG)\n"
    "Prints a summary of CONFIG and exits 0, or every error as FILE:LINE:COL and exits 1.\n"
    "Opens no socket.\n";

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
    rule_action_text(r, detail, sizeof(detail));
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

static int cmd_run(const char *path, const struct proxy_options *opt)
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
    if (proxy_init(&px, path, opt) != 0) {
        proxy_free(&px);
        return 1;
    }
    int rc = proxy_run(&px);
    proxy_free(&px);
    return rc;
}

/* `--journal-mode MODE` or `--journal-mode=MODE` at argv[*i] into opt: 1 taken (*i past its
 * value), 0 not this option, -1 after saying what is wrong. */
static int journal_mode_arg(int argc, char **argv, int *i, struct proxy_options *opt)
{
    const char *v = NULL;
    if (strcmp(argv[*i], "--journal-mode") == 0)
        v = *i + 1 < argc ? argv[++*i] : "";
    else if (strncmp(argv[*i], "--journal-mode=", 15) == 0)
        v = argv[*i] + 15;
    else
        return 0;
    if (v[0] == '\0') {
        fprintf(stderr, "twice %s: --journal-mode needs a value: new, append or overwrite\n",
                argv[0]);
        return -1;
    }
    enum conf_journal_mode mode;
    if (conf_journal_mode_parse(v, &mode) != 0) {
        fprintf(stderr, "twice %s: --journal-mode takes new, append or overwrite, not '%s'\n",
                argv[0], v);
        return -1;
    }
    /* Given twice, the two must agree: neither is dropped silently. */
    if (opt->journal_mode_set && mode != opt->journal_mode) {
        fprintf(stderr, "twice %s: --journal-mode given twice with different modes\n", argv[0]);
        return -1;
    }
    opt->journal_mode = mode;
    opt->journal_mode_set = true;
    return 1;
}

/* The configuration file of `twice run|check` (argv[0] is the command) into
 * *path, and run's options into opt (NULL for check).  Returns 0 to go on, 1
 * after printing the command's help, or 2 (the exit code) after a usage
 * error. */
static int config_arg(int argc, char **argv, const char *help, const char **path,
                      struct proxy_options *opt)
{
    static const char *const flags[] = {"-c", "--config", NULL};
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(help, stdout);
            return 1;
        }
        int rc = opt != NULL ? journal_mode_arg(argc, argv, &i, opt) : 0;
        if (rc < 0) {
            fputs(help, stderr);
            return 2;
        }
        if (rc == 0)
            rc = cli_file_arg(argc, argv, &i, flags, "configuration file", path, stderr);
        if (rc == 0)
            fprintf(stderr, "twice %s: unknown argument '%s'\n", argv[0], argv[i]);
        if (rc <= 0) {
            fputs(help, stderr);
            return 2;
        }
    }
    if (*path != NULL)
        return 0;
    fprintf(stderr, "twice %s: no configuration file given\n%s", argv[0], help);
    return 2;
}

/* run or check (argv[0]) with its arguments. */
static int cmd_config(int argc, char **argv)
{
    bool check = strcmp(argv[0], "check") == 0;
    const char *path = NULL;
    struct proxy_options opt = {0};
    int rc = config_arg(argc, argv, check ? usage_check : usage_run, &path, check ? NULL : &opt);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    return check ? cmd_check(path) : cmd_run(path, &opt);
}

/* `twice help [COMMAND]`: the general help, or the command's own. */
static int cmd_help(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc > 2) { /* one command's help at a time: none of the others is dropped silently */
        fprintf(stderr, "twice help: one command at a time, not '%s' too\n", argv[2]);
        return 2;
    }
    char *help[] = {argv[1], (char *)"--help", NULL};
    if (strcmp(argv[1], "run") == 0 || strcmp(argv[1], "check") == 0)
        return cmd_config(2, help);
    if (strcmp(argv[1], "report") == 0)
        return report_main(2, help);
    if (strcmp(argv[1], "verdict") == 0)
        return verdict_main(2, help);
    fprintf(stderr, "twice help: unknown command '%s'\n\n%s", argv[1], usage);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        if (argc > 2) { /* nothing after it is dropped silently */
            fprintf(stderr, "twice %s: takes no argument, not '%s'\n", cmd, argv[2]);
            return 2;
        }
        version_print(stdout);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0)
        return cmd_help(argc - 1, argv + 1);
    if (strcmp(cmd, "report") == 0)
        return report_main(argc - 1, argv + 1);
    if (strcmp(cmd, "verdict") == 0)
        return verdict_main(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0 || strcmp(cmd, "check") == 0)
        return cmd_config(argc - 1, argv + 1);
    fprintf(stderr, "twice: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
