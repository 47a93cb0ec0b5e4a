/*
 * test_conf.c - unit tests of the configuration parser (rules/conf.h).
 *
 * A valid file is parsed and every field checked; then every diagnostic the
 * parser can emit is provoked and asserted with its exact text, position,
 * severity and hint (expect_diags), so that a user-visible message never
 * changes by accident.  Garbage and allocation-failure runs check that no
 * input and no failed malloc crashes the parser or leaks (run under ASan or
 * valgrind).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "proto/jobs/framework.h"
#include "rules/caps.h"
#include "rules/conf.h"
#include "rules/conf_mem.h"
#include "rules/rule.h"
#include "tests/lib/conf_testkit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A complete, valid listener on one line, for tests about something else. */
#define LISTENER "listen a { protocol tcp; bind 127.0.0.1:1; upstream 127.0.0.1:2 }\n"

/* Lines of a listen block; the directive under test usually replaces one. */
#define L_HEAD "listen a {\n"
#define L_PROTO "    protocol tcp\n"
#define L_BIND "    bind 127.0.0.1:6380\n"
#define L_UP "    upstream 127.0.0.1:6379\n"
#define L_END "}\n"
/* A valid listener whose line 5 is `line` (its keyword at 5:5). */
#define IN_LISTEN(line) L_HEAD L_PROTO L_BIND L_UP "    " line "\n" L_END

static const char *full_config =
    "# twice test configuration\n"                                                         /* 1 */
    "log-level debug\n"                                                                    /* 2 */
    "shutdown-grace 30s\n"                                                                 /* 3 */
    "connect-timeout 3s\n"                                                                 /* 4 */
    "\n"                                                                                   /* 5 */
    "listen redis {\n"                                                                     /* 6 */
    "    protocol resp\n"                                                                  /* 7 */
    "    profile sidekiq\n"                                                                /* 8 */
    "    bind localhost:6380\n"                                                            /* 9 */
    "    upstream redis.internal:6379\n"                                                   /* 10 */
    "    idle-timeout 2m\n"                                                                /* 11 */
    "    max-connections 500\n"                                                            /* 12 */
    "    upstream-tls sni redis.internal ca \"/etc/ssl/my ca.pem\" cert c.pem key k.pem\n" /* 13 */
    "}\n"                                                                                  /* 14 */
    "\n"                                                                                   /* 15 */
    "listen rabbit {\n"                                                                    /* 16 */
    "    protocol amqp\n"                                                                  /* 17 */
    "    bind [::1]:5673\n"                                                                /* 18 */
    "    upstream [2001:db8::10]:5672\n"                                                   /* 19 */
    "    connect-timeout 250ms\n"                                                          /* 20 */
    "    tls key \"/etc/twice/key.pem\" cert \"/etc/twice/cert.pem\"\n"                    /* 21 */
    "    upstream-tls no-verify\n"                                                         /* 22 */
    "}\n"                                                                                  /* 23 */
    "listen plain { protocol tcp; bind *:7000; upstream 10.0.0.5:7000 }\n";                /* 24 */

static void assert_addr(const struct conf_addr *a, const char *host, uint16_t port, unsigned line,
                        unsigned col, const char *formatted)
{
    char buf[128];

    assert_string_equal(a->host, host);
    assert_int_equal(a->port, port);
    assert_int_equal(a->loc.line, line);
    assert_int_equal(a->loc.col, col);
    conf_addr_format(a, buf, sizeof(buf));
    assert_string_equal(buf, formatted);
}

static void test_full_config_globals_and_warnings(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(full_config, &d);

    (void)state;
    assert_string_equal(c->path, "t.conf");
    assert_string_equal(d.file, "t.conf");
    assert_int_equal(c->log_level, CONF_LOG_DEBUG);
    assert_int_equal(c->grace_ms, 30000);
    assert_int_equal(c->connect_timeout_ms, 3000);
    assert_int_equal(c->n_listeners, 3);
    /* every protocol has its codec: no warning */
    assert_int_equal(d.warnings, 0);
    assert_null(d.head);
    conf_free(c);
    conf_diags_free(&d);
}

static void test_full_config_resp_listener(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(full_config, &d);
    const struct conf_listener *l = c->listeners;

    (void)state;
    assert_string_equal(l->name, "redis");
    assert_int_equal(l->loc.line, 6);
    assert_int_equal(l->loc.col, 1);
    assert_int_equal(l->protocol, CONF_PROTO_RESP);
    assert_string_equal(l->profile, "sidekiq");
    assert_addr(&l->bind, "127.0.0.1", 6380, 9, 10, "127.0.0.1:6380");
    assert_addr(&l->upstream, "redis.internal", 6379, 10, 14, "redis.internal:6379");
    assert_int_equal(l->connect_timeout_ms, 3000); /* the global value */
    assert_int_equal(l->idle_timeout_ms, 120000);
    assert_int_equal(l->max_connections, 500);
    assert_false(l->tls.enabled);
    assert_null(l->tls.cert);
    assert_null(l->tls.key);
    assert_true(l->upstream_tls.enabled);
    assert_true(l->upstream_tls.verify);
    assert_string_equal(l->upstream_tls.sni, "redis.internal");
    assert_string_equal(l->upstream_tls.ca, "/etc/ssl/my ca.pem");
    assert_string_equal(l->upstream_tls.cert, "c.pem");
    assert_string_equal(l->upstream_tls.key, "k.pem");
    assert_int_equal(l->upstream_tls.loc.line, 13);
    assert_int_equal(l->upstream_tls.loc.col, 5);
    conf_free(c);
    conf_diags_free(&d);
}

static void test_full_config_amqp_and_tcp_listeners(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(full_config, &d);
    const struct conf_listener *l = c->listeners->next;

    (void)state;
    assert_string_equal(l->name, "rabbit");
    assert_int_equal(l->loc.line, 16);
    assert_int_equal(l->protocol, CONF_PROTO_AMQP);
    assert_null(l->profile);
    assert_addr(&l->bind, "::1", 5673, 18, 10, "[::1]:5673");
    assert_addr(&l->upstream, "2001:db8::10", 5672, 19, 14, "[2001:db8::10]:5672");
    assert_int_equal(l->connect_timeout_ms, 250); /* overrides the global */
    assert_int_equal(l->idle_timeout_ms, 0);
    assert_int_equal(l->max_connections, 0);
    assert_true(l->tls.enabled);
    assert_string_equal(l->tls.cert, "/etc/twice/cert.pem");
    assert_string_equal(l->tls.key, "/etc/twice/key.pem");
    assert_int_equal(l->tls.loc.line, 21);
    assert_int_equal(l->tls.loc.col, 5);
    assert_true(l->upstream_tls.enabled);
    assert_false(l->upstream_tls.verify);
    assert_null(l->upstream_tls.ca);
    assert_null(l->upstream_tls.sni);
    assert_null(l->upstream_tls.cert);
    assert_null(l->upstream_tls.key);

    l = l->next;
    assert_string_equal(l->name, "plain");
    assert_int_equal(l->loc.line, 24);
    assert_int_equal(l->protocol, CONF_PROTO_TCP);
    assert_addr(&l->bind, "0.0.0.0", 7000, 24, 35, "0.0.0.0:7000");
    assert_addr(&l->upstream, "10.0.0.5", 7000, 24, 52, "10.0.0.5:7000");
    assert_int_equal(l->connect_timeout_ms, 3000);
    assert_false(l->upstream_tls.enabled);
    assert_null(l->next);
    assert_ptr_equal(conf_find_listener(c, "plain"), l);
    assert_ptr_equal(conf_find_listener(c, "redis"), c->listeners);
    assert_null(conf_find_listener(c, "nope"));
    assert_null(conf_find_listener(NULL, "redis"));
    conf_free(c);
    conf_diags_free(&d);
}

static void test_defaults(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(LISTENER, &d);
    const struct conf_listener *l = c->listeners;

    (void)state;
    assert_int_equal(d.warnings, 0);
    assert_null(d.head);
    assert_int_equal(c->log_level, CONF_LOG_INFO);
    assert_int_equal(c->connect_timeout_ms, CONF_DEFAULT_CONNECT_TIMEOUT_MS);
    assert_int_equal(c->grace_ms, CONF_DEFAULT_GRACE_MS);
    assert_int_equal(c->n_listeners, 1);
    assert_int_equal(l->connect_timeout_ms, CONF_DEFAULT_CONNECT_TIMEOUT_MS);
    assert_int_equal(l->idle_timeout_ms, 0);
    assert_int_equal(l->max_connections, 0);
    assert_null(l->profile);
    assert_false(l->tls.enabled);
    assert_false(l->upstream_tls.enabled);
    conf_free(c);
    conf_diags_free(&d);
}

/* The global connect-timeout applies to listeners defined before it too. */
static void test_global_connect_timeout_order(void **state)
{
    struct conf_diags d;
    struct conf *c =
        parse_ok(LISTENER "listen b { protocol tcp; bind 127.0.0.1:3; upstream 127.0.0.1:2\n"
                          "connect-timeout 1h }\n"
                          "connect-timeout 45s\n",
                 &d);

    (void)state;
    assert_int_equal(c->connect_timeout_ms, 45000);
    assert_int_equal(c->listeners->connect_timeout_ms, 45000);
    assert_int_equal(c->listeners->next->connect_timeout_ms, 3600000);
    conf_free(c);
    conf_diags_free(&d);
}

static void test_upstream_tls_variants(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(L_HEAD L_PROTO L_BIND L_UP
                              "    upstream-tls\n" L_END
                              "listen b { protocol tcp; bind 127.0.0.1:1; upstream h:2;"
                              " upstream-tls verify ca ca.pem }\n"
                              "listen c { protocol tcp; bind 127.0.0.1:2; upstream h:2;"
                              " upstream-tls key k cert c no-verify sni \"s n\" }\n",
                              &d);
    const struct conf_listener *l = c->listeners;

    (void)state;
    assert_true(l->upstream_tls.enabled); /* bare: TLS with verification */
    assert_true(l->upstream_tls.verify);
    assert_null(l->upstream_tls.ca);
    l = l->next;
    assert_true(l->upstream_tls.enabled);
    assert_true(l->upstream_tls.verify);
    assert_string_equal(l->upstream_tls.ca, "ca.pem");
    l = l->next;
    assert_true(l->upstream_tls.enabled);
    assert_false(l->upstream_tls.verify);
    assert_string_equal(l->upstream_tls.cert, "c");
    assert_string_equal(l->upstream_tls.key, "k");
    assert_string_equal(l->upstream_tls.sni, "s n");
    conf_free(c);
    conf_diags_free(&d);
}

static void test_no_verify_ignores_ca(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(IN_LISTEN("upstream-tls no-verify ca ca.pem"), &d);

    (void)state;
    assert_int_equal(d.warnings, 1);
    assert_int_equal(d.head->severity, CONF_WARNING);
    assert_int_equal(d.head->loc.line, 5);
    assert_int_equal(d.head->loc.col, 28);
    assert_string_equal(d.head->msg, "'ca' is ignored with no-verify");
    assert_false(c->listeners->upstream_tls.verify);
    assert_null(c->listeners->upstream_tls.ca);
    conf_free(c);
    conf_diags_free(&d);
}

static void test_addresses(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok("listen a { protocol tcp; bind [0:0::1]:1; upstream localhost:2 }\n"
                              "listen b { protocol tcp; bind 10.1.2.3:65535; upstream "
                              "my_host-1.internal:80 }\n",
                              &d);
    struct conf_addr a = {.host = (char *)"127.0.0.1", .port = 80};
    char buf[16];

    (void)state;
    assert_string_equal(c->listeners->bind.host, "::1"); /* canonical form */
    assert_string_equal(c->listeners->upstream.host, "localhost");
    assert_string_equal(c->listeners->next->bind.host, "10.1.2.3");
    assert_int_equal(c->listeners->next->bind.port, 65535);
    assert_string_equal(c->listeners->next->upstream.host, "my_host-1.internal");
    conf_free(c);
    conf_diags_free(&d);

    conf_addr_format(&a, buf, 5); /* truncated, still terminated */
    assert_string_equal(buf, "127.");
    buf[0] = 'x';
    conf_addr_format(&a, buf, 0);
    assert_int_equal(buf[0], 'x');
}

/* LISTENER after the global line "NAME VALUE" (no line when value is NULL),
 * parsed without error. */
static struct conf *parse_global_ok(const char *name, const char *value, struct conf_diags *d)
{
    char text[256];
    if (value == NULL)
        snprintf(text, sizeof(text), "%s", LISTENER);
    else
        snprintf(text, sizeof(text), "%s %s\n" LISTENER, name, value);
    return parse_ok(text, d);
}

static void test_durations(void **state)
{
    static const struct {
        const char *text;
        uint32_t ms;
    } ok[] = {{"1ms", 1},          {"250ms", 250},           {"45s", 45000},
              {"2m", 120000},      {"1h", 3600000},          {"24h", 86400000},
              {"1440m", 86400000}, {"86400000ms", 86400000}, {"007s", 7000}};

    (void)state;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        struct conf_diags d;
        struct conf *c = parse_global_ok("shutdown-grace", ok[i].text, &d);
        assert_int_equal(c->grace_ms, ok[i].ms);
        conf_free(c);
        conf_diags_free(&d);
    }
}

static void test_comments_semicolons_crlf(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok("# leading comment { } ; \"\r\n"
                              "log-level warn# no space before the comment\r\n"
                              ";;\r\n"
                              "listen a { # a comment with { and }\r\n"
                              "\tprotocol tcp ; bind 127.0.0.1:6380#c\r\n"
                              "  upstream 127.0.0.1:6379 ; } ; ;\r\n"
                              "listen b{protocol tcp;bind 127.0.0.1:1;upstream 127.0.0.1:2}",
                              &d);

    (void)state;
    assert_int_equal(c->log_level, CONF_LOG_WARN);
    assert_int_equal(c->n_listeners, 2);
    assert_int_equal(c->listeners->bind.port, 6380);
    assert_int_equal(c->listeners->bind.loc.line, 5);
    assert_int_equal(c->listeners->bind.loc.col, 22); /* a tab is one column */
    assert_int_equal(c->listeners->upstream.port, 6379);
    assert_int_equal(c->listeners->next->upstream.loc.col, 49);
    conf_free(c);
    conf_diags_free(&d);
    /* positions after CRLF lines */
    EXPECT("log-level info\r\nlog-level verbose\r\n" LISTENER, -1,
           EH(2, 1, "duplicate 'log-level'", "first set at 1:1"));
    EXPECT("listen a {\r\n\tprotocol tpc\r\n}\r\n", -1, E(1, 1, "listener 'a' has no 'bind'"),
           E(1, 1, "listener 'a' has no 'upstream'"),
           EH(2, 11, "unknown protocol 'tpc'", "did you mean 'tcp'?"));
}

static void test_quoted_strings(void **state)
{
    struct conf_diags d;
    struct conf *c =
        parse_ok(IN_LISTEN("tls cert \"/etc/my certs/c.pem\" key \"a\\\"b\\\\c\\td\\ne{;}#\""), &d);

    (void)state;
    assert_string_equal(c->listeners->tls.cert, "/etc/my certs/c.pem");
    assert_string_equal(c->listeners->tls.key, "a\"b\\c\td\ne{;}#");
    conf_free(c);
    conf_diags_free(&d);
    /* a UTF-8 byte order mark is skipped and does not shift columns */
    EXPECT("\xef\xbb\xbflog-level loud\n" LISTENER, -1,
           EH(1, 11, "unknown log level 'loud'", "expected error, warn, info or debug"));
    /* a quoted word is a word: keywords and values may be quoted */
    c = parse_ok("\"listen\" \"a\" { \"protocol\" \"tcp\"; bind \"127.0.0.1:1\"; upstream "
                 "127.0.0.1:2 }",
                 &d);
    assert_string_equal(c->listeners->name, "a");
    conf_free(c);
    conf_diags_free(&d);
}

static void test_zeroed_diags_and_names(void **state)
{
    struct conf_diags d = {0}; /* zeroed rather than conf_diags_init()ed */
    struct conf *c = NULL;

    (void)state;
    assert_int_equal(conf_parse_string("z.conf", LISTENER, strlen(LISTENER), &c, &d), 0);
    assert_non_null(c);
    assert_string_equal(d.file, "z.conf");
    conf_free(c);
    conf_diags_free(&d);
    conf_free(NULL);
    assert_string_equal(conf_protocol_name(CONF_PROTO_TCP), "tcp");
    assert_string_equal(conf_protocol_name(CONF_PROTO_AMQP), "amqp");
    assert_string_equal(conf_protocol_name(CONF_PROTO_RESP), "resp");
    assert_string_equal(conf_log_level_name(CONF_LOG_ERROR), "error");
    assert_string_equal(conf_log_level_name(CONF_LOG_WARN), "warn");
    assert_string_equal(conf_log_level_name(CONF_LOG_INFO), "info");
    assert_string_equal(conf_log_level_name(CONF_LOG_DEBUG), "debug");
}

/* ---- pass 1: lexical and block structure errors ---- */

static void test_lexer_errors(void **state)
{
    (void)state;
    EXPECT("log-level \"debug\n" LISTENER, -1, E(1, 11, "unterminated string"));
    EXPECT(LISTENER "log-level \"info", -1, E(2, 11, "unterminated string"));
    EXPECT(LISTENER "log-level \"info\\", -1, E(2, 11, "unterminated string"));
    EXPECT(IN_LISTEN("tls cert \"a\\qb\" key k.pem"), -1,
           EH(5, 16, "invalid escape '\\q' in string", "valid escapes are \\\" \\\\ \\n \\t"));
    EXPECT(IN_LISTEN("tls cert \"a\\\tb\\x\" key k.pem"), -1,
           EH(5, 16, "invalid escape in string", "valid escapes are \\\" \\\\ \\n \\t"),
           EH(5, 19, "invalid escape '\\x' in string", "valid escapes are \\\" \\\\ \\n \\t"));
    expect_diags(__FILE__, __LINE__, NULL, "log-level info\0\n" LISTENER, 16 + strlen(LISTENER), -1,
                 (const struct want[]){E(1, 15, "NUL byte in the configuration")}, 1);
}

static void test_block_errors(void **state)
{
    (void)state;
    EXPECT(LISTENER "}\n", -1, EH(2, 1, "unexpected '}'", "no block is open here"));
    EXPECT("log-level info\nlisten a {\n    protocol tcp\n", -1,
           E(2, 1, "listener 'a' has no 'bind'"), E(2, 1, "listener 'a' has no 'upstream'"),
           E(2, 10, "'{' opened here is never closed"));
    EXPECT(LISTENER "{ log-level info }\n", -1, E(2, 1, "'{' has no directive name before it"));
}

static void test_nesting_limit(void **state)
{
    char text[512] = LISTENER;

    (void)state;
    /* 17 nested blocks on line 2: "x { x { ... } }"; the 17th '{' is at column 67 */
    for (int i = 0; i < 17; i++) {
        strcat(text, "x { ");
    }
    for (int i = 0; i < 17; i++) {
        strcat(text, "} ");
    }
    EXPECT(text, -1, E(2, 1, "unknown directive 'x'"),
           E(2, 67, "blocks are nested too deeply (at most 16 levels)"));
}

/* ---- pass 2: unknown keywords and "did you mean" ---- */

static void test_unknown_directives(void **state)
{
    (void)state;
    EXPECT(LISTENER "lisen b {\n}\n", -1,
           EH(2, 1, "unknown directive 'lisen'", "did you mean 'listen'?"));
    EXPECT("log-levle debug\n" LISTENER, -1,
           EH(1, 1, "unknown directive 'log-levle'", "did you mean 'log-level'?"));
    EXPECT("rle r on a {\n}\n" LISTENER, -1,
           EH(1, 1, "unknown directive 'rle'", "did you mean 'rule'?"));
    EXPECT("frobnicate 1\n" LISTENER, -1, E(1, 1, "unknown directive 'frobnicate'"));
    EXPECT(IN_LISTEN("upstraem-tls"), -1,
           EH(5, 5, "unknown directive 'upstraem-tls'", "did you mean 'upstream-tls'?"));
    EXPECT(IN_LISTEN("tsl cert c key k"), -1,
           EH(5, 5, "unknown directive 'tsl'", "did you mean 'tls'?"));
    EXPECT(IN_LISTEN("idle-timout 5s"), -1,
           EH(5, 5, "unknown directive 'idle-timout'", "did you mean 'idle-timeout'?"));
    /* two edits are too many for a short word, fine for a long one */
    EXPECT(IN_LISTEN("bxnx 1"), -1, E(5, 5, "unknown directive 'bxnx'"));
    EXPECT(IN_LISTEN("protcl tcp"), -1,
           EH(5, 5, "unknown directive 'protcl'", "did you mean 'protocol'?"));
    EXPECT(IN_LISTEN("max-conections 5"), -1,
           EH(5, 5, "unknown directive 'max-conections'", "did you mean 'max-connections'?"));
}

static void test_directive_in_wrong_scope(void **state)
{
    (void)state;
    EXPECT("bind 1.2.3.4:5\n" LISTENER, -1,
           EH(1, 1, "unknown directive 'bind'", "'bind' belongs inside a listen block"));
    EXPECT("max-connections 5\n" LISTENER, -1,
           EH(1, 1, "unknown directive 'max-connections'",
              "'max-connections' belongs inside a listen block"));
    EXPECT(IN_LISTEN("log-level debug"), -1,
           EH(5, 5, "unknown directive 'log-level'",
              "'log-level' belongs at the top level, outside listen blocks"));
    EXPECT(IN_LISTEN("rule r on a {\n    }"), -1,
           EH(5, 5, "unknown directive 'rule'",
              "'rule' belongs at the top level, outside listen blocks"));
}

static void test_enum_values(void **state)
{
    (void)state;
    EXPECT(L_HEAD "    protocol ftp\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'ftp'", "expected tcp, amqp or resp"));
    EXPECT(L_HEAD "    protocol amqq\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'amqq'", "did you mean 'amqp'?"));
    EXPECT("log-level verbose\n" LISTENER, -1,
           EH(1, 11, "unknown log level 'verbose'", "expected error, warn, info or debug"));
    EXPECT("log-level debgu\n" LISTENER, -1,
           EH(1, 11, "unknown log level 'debgu'", "did you mean 'debug'?"));
    EXPECT(L_HEAD "    protocol resp\n    profile sidekik\n" L_BIND L_UP L_END, -1,
           EH(3, 13, "unknown profile 'sidekik'", "did you mean 'sidekiq'?"));
    EXPECT(L_HEAD "    protocol resp\n    profile resque\n" L_BIND L_UP L_END, -1,
           EH(3, 13, "unknown profile 'resque'",
              "expected one of: sidekiq, celery, rq, streams, list, bullmq"));
}

/* A protocol named after the broker or a framework: the protocol twice calls it. */
static void test_protocol_names_a_broker(void **state)
{
    (void)state;
    EXPECT(L_HEAD "    protocol rabbitmq\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'rabbitmq'",
              "did you mean 'amqp'? RabbitMQ speaks AMQP 0-9-1"));
    EXPECT(L_HEAD "    protocol RabbitMQ\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'RabbitMQ'",
              "did you mean 'amqp'? RabbitMQ speaks AMQP 0-9-1"));
    EXPECT(L_HEAD "    protocol redis\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'redis'", "did you mean 'resp'? Redis speaks RESP"));
    EXPECT(L_HEAD "    protocol valkey\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'valkey'", "did you mean 'resp'? Valkey speaks RESP"));
    EXPECT(L_HEAD "    protocol celery\n" L_BIND L_UP L_END, -1,
           EH(2, 14, "unknown protocol 'celery'",
              "did you mean 'protocol resp' with 'profile celery'? a job framework on Redis (on "
              "RabbitMQ: 'protocol amqp')"));
}

/* The profiles `profile` takes are the framework modules' (proto/jobs/framework.h): the list
 * in a hint is theirs, BullMQ included, and the start of one suggests it. */
static void test_profile_names_from_the_registry(void **state)
{
    (void)state;
    EXPECT(L_HEAD "    protocol resp\n    profile bull\n" L_BIND L_UP L_END, -1,
           EH(3, 13, "unknown profile 'bull'", "did you mean 'bullmq'?"));
    EXPECT(L_HEAD "    protocol resp\n    profile kombu\n" L_BIND L_UP L_END, -1,
           EH(3, 13, "unknown profile 'kombu'",
              "expected one of: sidekiq, celery, rq, streams, list, bullmq"));
    for (size_t i = 0; i < resp_framework_count(); i++) {
        const char *name = resp_framework_at(i)->name;
        char text[512];
        snprintf(text, sizeof(text), L_HEAD "    protocol resp\n    profile %s\n" L_BIND L_UP L_END,
                 name);
        struct conf_diags d;
        struct conf *c = parse_ok(text, &d);
        assert_string_equal(c->listeners->profile, name);
        /* each has what the rules of its listener can do, and its module */
        assert_ptr_not_equal(proto_caps_find(CONF_PROTO_RESP, name),
                             proto_caps_find(CONF_PROTO_RESP, NULL));
        assert_ptr_equal(resp_framework_of(rprof_of(name)), resp_framework_at(i));
        conf_free(c);
        conf_diags_free(&d);
    }
}

/* `threads N` (1..64) or `auto` (0: one per core, the default). */
static void test_threads(void **state)
{
    static const struct {
        const char *text; /* NULL: no `threads` line */
        unsigned threads;
    } ok[] = {{NULL, 0}, {"auto", 0}, {"1", 1}, {"4", 4}, {"64", 64}};
    (void)state;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        struct conf_diags d;
        struct conf *c = parse_global_ok("threads", ok[i].text, &d);
        assert_int_equal(c->threads, ok[i].threads);
        conf_free(c);
        conf_diags_free(&d);
    }
    const char *hint = "a number from 1 to 64, or auto (one per core)";
    EXPECT("threads 0\n" LISTENER, -1, EH(1, 9, "invalid threads '0'", hint));
    EXPECT("threads 65\n" LISTENER, -1, EH(1, 9, "invalid threads '65'", hint));
    EXPECT("threads 99999999999999999999\n" LISTENER, -1,
           EH(1, 9, "invalid threads '99999999999999999999'", hint));
    EXPECT("threads -2\n" LISTENER, -1, EH(1, 9, "invalid threads '-2'", hint));
    EXPECT("threads many\n" LISTENER, -1, EH(1, 9, "invalid threads 'many'", hint));
}

/* `journal-flush D` or `every-record` (default: every second); without `journal`, a warning. */
static void test_journal_flush(void **state)
{
    static const struct {
        const char *text; /* NULL: no `journal-flush` line */
        uint32_t ms;
        bool every_record;
    } ok[] = {{NULL, CONF_DEFAULT_JOURNAL_FLUSH_MS, false},
              {"every-record", CONF_DEFAULT_JOURNAL_FLUSH_MS, true},
              {"200ms", 200, false},
              {"5s", 5000, false}};
    (void)state;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text), "journal j.pb\n%s%s%s" LISTENER,
                 ok[i].text != NULL ? "journal-flush " : "", ok[i].text != NULL ? ok[i].text : "",
                 ok[i].text != NULL ? "\n" : "");
        struct conf_diags d;
        struct conf *c = parse_ok(text, &d);
        assert_int_equal(d.warnings, 0);
        assert_int_equal(c->journal_flush_ms, ok[i].ms);
        assert_int_equal(c->journal_every_record, ok[i].every_record);
        conf_free(c);
        conf_diags_free(&d);
    }
    const char *hint = "every-record, or a duration such as 200ms";
    EXPECT("journal j.pb\njournal-flush every-recrd\n" LISTENER, -1,
           EH(2, 15, "unknown journal-flush 'every-recrd'", "did you mean 'every-record'?"));
    EXPECT("journal j.pb\njournal-flush always\n" LISTENER, -1,
           EH(2, 15, "unknown journal-flush 'always'", hint));
    EXPECT("journal j.pb\njournal-flush 0ms\n" LISTENER, -1,
           E(2, 15, "duration '0ms' must be greater than 0"));
    EXPECT("journal j.pb\njournal-flush 10\n" LISTENER, -1,
           E(2, 15, "duration '10' needs a unit: ms, s, m or h"));
    EXPECT("journal j.pb\njournal-flush 1s\njournal-flush every-record\n" LISTENER, -1,
           EH(3, 1, "duplicate 'journal-flush'", "first set at 2:1"));
    EXPECT("journal-flush every-record\n" LISTENER, 0,
           W(1, 1, "journal-flush has no effect without journal"));
    EXPECT("journal j.pb\njournal-flush\n" LISTENER, -1,
           E(2, 1, "'journal-flush' takes one argument: DURATION or every-record"));
}

/* `journal PATH [new|append|overwrite]`: what twice does with a file that holds a journal
 * already (default: refuse to start). */
static void test_journal_mode(void **state)
{
    static const struct {
        const char *line;
        enum conf_journal_mode mode;
    } ok[] = {{"journal j.pb\n", CONF_JOURNAL_NEW},
              {"journal j.pb new\n", CONF_JOURNAL_NEW},
              {"journal j.pb append\n", CONF_JOURNAL_APPEND},
              {"journal j.pb overwrite\n", CONF_JOURNAL_OVERWRITE}};
    (void)state;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text), "%s" LISTENER, ok[i].line);
        struct conf_diags d;
        struct conf *c = parse_ok(text, &d);
        assert_string_equal(c->journal, "j.pb");
        assert_int_equal(c->journal_mode, ok[i].mode);
        conf_free(c);
        conf_diags_free(&d);
    }
    const char *shape = "journal PATH, or journal PATH append, or journal PATH overwrite";
    EXPECT("journal j.pb apend\n" LISTENER, -1,
           EH(1, 14, "unknown journal mode 'apend'", "did you mean 'append'?"));
    EXPECT("journal j.pb truncate\n" LISTENER, -1,
           EH(1, 14, "unknown journal mode 'truncate'", "new, append or overwrite"));
    EXPECT(
        "journal j.pb append now\n" LISTENER, -1,
        EH(1, 21, "'journal' takes a file path and, optionally, new, append or overwrite", shape));
    EXPECT(
        "journal\n" LISTENER, -1,
        EH(1, 1, "'journal' takes a file path and, optionally, new, append or overwrite", shape));
    enum conf_journal_mode m = CONF_JOURNAL_NEW;
    assert_int_equal(conf_journal_mode_parse("overwrite", &m), 0);
    assert_int_equal(m, CONF_JOURNAL_OVERWRITE);
    assert_int_equal(conf_journal_mode_parse("Append", &m), -1);
}

static void test_profile_needs_resp(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
    /* profile before protocol: the check does not depend on order */
    EXPECT(L_HEAD "    profile sidekiq\n" L_PROTO L_BIND L_UP L_END, -1,
           E(2, 5, "'profile' applies only to protocol resp"));
    EXPECT(L_HEAD L_BIND "    protocol amqp\n" L_UP "    profile celery\n" L_END, -1,
           E(5, 5, "'profile' applies only to protocol resp"));
    c = parse_ok(L_HEAD "    profile streams\n    protocol resp\n" L_BIND L_UP L_END, &d);
    assert_string_equal(c->listeners->profile, "streams");
    assert_int_equal(c->listeners->protocol, CONF_PROTO_RESP);
    assert_int_equal(d.warnings, 0);
    conf_free(c);
    conf_diags_free(&d);
}

/* ---- shape: arguments and blocks ---- */

static void test_argument_counts(void **state)
{
    (void)state;
    EXPECT(L_HEAD L_PROTO L_UP "    bind\n" L_END, -1,
           E(4, 5, "'bind' takes one argument: HOST:PORT"));
    EXPECT(L_HEAD L_PROTO L_UP "    bind 1.2.3.4:5 6.7.8.9:10\n" L_END, -1,
           E(4, 20, "'bind' takes one argument: HOST:PORT"));
    EXPECT("listen {\n}\n" LISTENER, -1, E(1, 1, "'listen' takes one argument: NAME"));
    EXPECT("listen a b {" L_PROTO L_BIND L_UP L_END, -1,
           E(1, 10, "'listen' takes one argument: NAME"));
    EXPECT("log-level\n" LISTENER, -1,
           E(1, 1, "'log-level' takes one argument: error, warn, info or debug"));
    EXPECT("shutdown-grace 1s 2s\n" LISTENER, -1,
           E(1, 19, "'shutdown-grace' takes one argument: DURATION"));
    EXPECT(IN_LISTEN("max-connections"), -1, E(5, 5, "'max-connections' takes one argument: N"));
    EXPECT(L_HEAD L_BIND L_UP "    protocol tcp amqp\n" L_END, -1,
           E(4, 18, "'protocol' takes one argument: tcp, amqp or resp"));
}

static void test_block_shape(void **state)
{
    struct conf_diags d;
    struct conf *c = NULL;

    (void)state;
    EXPECT(L_HEAD L_PROTO L_UP "    bind 127.0.0.1:6380 { }\n" L_END, -1,
           E(4, 25, "'bind' does not take a block"));
    EXPECT("log-level debug {\n}\n" LISTENER, -1, E(1, 17, "'log-level' does not take a block"));
    EXPECT(LISTENER "listen b\n", -1, E(2, 1, "'listen' needs a block: listen NAME { ... }"));
    /* a listen without a block still counts: no "no listener defined" on top */
    conf_diags_init(&d);
    assert_int_equal(conf_parse_string("t", "listen b\n", 9, &c, &d), -1);
    assert_int_equal(d.errors, 1);
    conf_diags_free(&d);
}

/* ---- duplicates and conflicts ---- */

static void test_duplicates(void **state)
{
    (void)state;
    EXPECT(L_HEAD L_PROTO L_BIND L_UP "    bind 127.0.0.1:6381\n" L_END, -1,
           EH(5, 5, "duplicate 'bind'", "first set at 3:5"));
    EXPECT("log-level info\nlog-level debug\n" LISTENER, -1,
           EH(2, 1, "duplicate 'log-level'", "first set at 1:1"));
    EXPECT(LISTENER "connect-timeout 1s\n\nconnect-timeout 2s\n", -1,
           EH(4, 1, "duplicate 'connect-timeout'", "first set at 2:1"));
    EXPECT(LISTENER "listen a { protocol tcp; bind 127.0.0.1:3; upstream 127.0.0.1:2 }\n", -1,
           E(2, 8, "listener 'a' is already defined at 1:1"));
}

/* A listener block binding `addr` on one line, its address at column 31. */
#define BINDS(name, addr) "listen " name " { protocol tcp; bind " addr "; upstream 127.0.0.1:2 }\n"

static void test_bind_conflicts(void **state)
{
    (void)state;
    EXPECT(LISTENER "listen b { protocol tcp; bind 127.0.0.1:1; upstream 127.0.0.1:2 }\n", -1,
           E(2, 31, "listener 'b' binds 127.0.0.1:1, already bound by listener 'a' at 1:31"));
    EXPECT("listen a { protocol tcp; bind [::1]:1; upstream 127.0.0.1:2 }\n"
           "listen b { protocol tcp; bind [0:0::1]:1; upstream 127.0.0.1:2 }\n",
           -1, E(2, 31, "listener 'b' binds [::1]:1, already bound by listener 'a' at 1:31"));
    EXPECT(LISTENER "listen b { protocol tcp; bind localhost:1; upstream 127.0.0.1:2 }\n", -1,
           E(2, 31, "listener 'b' binds 127.0.0.1:1, already bound by listener 'a' at 1:31"));
}

/* A wildcard bind takes its port on every address (of its family, or of both for [::]): a
 * second listener on that port fails at `run` with "Address already in use", so `check`
 * says it first, naming both. */
static void test_bind_conflicts_through_wildcards(void **state)
{
    static const char *const v4 =
        "0.0.0.0 (or *) takes its port on every IPv4 address: only one of them can listen";
    static const char *const v6 = "[::] takes its port on every address, IPv4 too (Linux's "
                                  "default net.ipv6.bindv6only=0): only one of them can listen";

    (void)state;
    EXPECT(BINDS("a", "127.0.0.1:1") BINDS("b", "0.0.0.0:1"), -1,
           EH(2, 31,
              "listener 'b' binds 0.0.0.0:1, which clashes with 127.0.0.1:1 of listener "
              "'a' at 1:31",
              v4));
    EXPECT(BINDS("a", "*:1") BINDS("b", "127.0.0.1:1"), -1,
           EH(2, 31,
              "listener 'b' binds 127.0.0.1:1, which clashes with 0.0.0.0:1 of listener "
              "'a' at 1:31",
              v4));
    EXPECT(BINDS("a", "*:1") BINDS("b", "0.0.0.0:1"), -1,
           E(2, 31, "listener 'b' binds 0.0.0.0:1, already bound by listener 'a' at 1:31"));
    EXPECT(BINDS("a", "[::]:1") BINDS("b", "0.0.0.0:1"), -1,
           EH(2, 31,
              "listener 'b' binds 0.0.0.0:1, which clashes with [::]:1 of listener 'a' "
              "at 1:31",
              v6));
    EXPECT(BINDS("a", "0.0.0.0:1") BINDS("b", "[::]:1"), -1,
           EH(2, 31,
              "listener 'b' binds [::]:1, which clashes with 0.0.0.0:1 of listener 'a' "
              "at 1:31",
              v6));
    EXPECT(BINDS("a", "[::]:1") BINDS("b", "127.0.0.1:1"), -1,
           EH(2, 31,
              "listener 'b' binds 127.0.0.1:1, which clashes with [::]:1 of listener 'a' "
              "at 1:31",
              v6));
    EXPECT(BINDS("a", "[::1]:1") BINDS("b", "[::]:1"), -1,
           EH(2, 31,
              "listener 'b' binds [::]:1, which clashes with [::1]:1 of listener 'a' "
              "at 1:31",
              v6));
    /* an IPv4-mapped address is its IPv4 address */
    EXPECT(BINDS("a", "127.0.0.1:1") BINDS("b", "[::ffff:127.0.0.1]:1"), -1,
           E(2, 31,
             "listener 'b' binds [::ffff:127.0.0.1]:1, which clashes with 127.0.0.1:1 of "
             "listener 'a' at 1:31"));
    /* reported once per listener, against the first it clashes with */
    EXPECT(BINDS("a", "127.0.0.1:1") BINDS("b", "127.0.0.2:1") BINDS("c", "*:1"), -1,
           EH(3, 31,
              "listener 'c' binds 0.0.0.0:1, which clashes with 127.0.0.1:1 of listener "
              "'a' at 1:31",
              v4));
    /* what Linux lets listen side by side */
    EXPECT_CLEAN(BINDS("a", "127.0.0.1:1") BINDS("b", "127.0.0.2:1"));
    EXPECT_CLEAN(BINDS("a", "0.0.0.0:1") BINDS("b", "[::1]:1"));
    EXPECT_CLEAN(BINDS("a", "0.0.0.0:1") BINDS("b", "0.0.0.0:3"));
    EXPECT_CLEAN(BINDS("a", "[::1]:1") BINDS("b", "127.0.0.1:1"));
}

/* `toxiproxy-api`: the admin API's rules (loopback unless admin-token, no listener's port, not
 * the admin API's), and a file with it needs no listener. */
static void test_toxiproxy_api(void **state)
{
    (void)state;
    EXPECT_CLEAN("toxiproxy-api 127.0.0.1:8474\n");
    EXPECT_CLEAN("toxiproxy-config proxies.json\n");
    EXPECT_CLEAN("toxiproxy-api 127.0.0.1:8474\ntoxiproxy-config proxies.json\n" LISTENER);
    EXPECT_CLEAN("toxiproxy-api 0.0.0.0:8474\nadmin-token 0123456789abcdef\n");
    EXPECT("toxiproxy-api 0.0.0.0:8474\n", -1,
           E(1, 15,
             "Toxiproxy API on 0.0.0.0:8474 is reachable from the network: set "
             "admin-token"));
    EXPECT("toxiproxy-api 127.0.0.1:1\n" LISTENER, -1,
           E(1, 15, "Toxiproxy API on 127.0.0.1:1, already bound by listener 'a' at 2:31"));
    EXPECT("toxiproxy-api 127.0.0.1:9\nadmin 127.0.0.1:9\n", -1,
           E(1, 15, "Toxiproxy API on the admin API's address: give it its own port"));
    EXPECT("toxiproxy-api 8474\n" LISTENER, -1,
           E(1, 15, "'toxiproxy-api' needs HOST:PORT, e.g. 127.0.0.1:8474"));
    EXPECT("log-level info\n", -1,
           EH(1, 1, "no listener defined",
              "add one, e.g. listen redis { protocol resp; bind 127.0.0.1:6380; upstream "
              "127.0.0.1:6379 }"));
}

/* The admin API's address clashes with a listener's like two listeners'. */
static void test_admin_bind_conflicts(void **state)
{
    (void)state;
    EXPECT("admin 127.0.0.1:1\n" LISTENER, -1,
           E(1, 7, "admin API on 127.0.0.1:1, already bound by listener 'a' at 2:31"));
    EXPECT("admin *:1\nadmin-token 0123456789abcdef\n" LISTENER, -1,
           EH(1, 7, "admin API on 0.0.0.0:1 clashes with 127.0.0.1:1 of listener 'a' at 3:31",
              "a wildcard address (0.0.0.0, *, [::]) takes its port on every address: only one "
              "of them can listen"));
    EXPECT("admin 127.0.0.1:1\n" BINDS("a", "[::]:1"), -1,
           EH(1, 7, "admin API on 127.0.0.1:1 clashes with [::]:1 of listener 'a' at 2:31",
              "a wildcard address (0.0.0.0, *, [::]) takes its port on every address: only one "
              "of them can listen"));
    EXPECT_CLEAN("admin 127.0.0.1:3\n" BINDS("a", "0.0.0.0:1"));
}

/* A listener block binding `addr` with upstream `up`, on one line; UP_COL is the column of
 * its upstream address (the length of what comes before it, plus one). */
#define LOOPS(name, addr, up) "listen " name " { protocol tcp; bind " addr "; upstream " up " }\n"
#define UP_COL(addr) (unsigned)(sizeof("listen a { protocol tcp; bind " addr "; upstream "))
#define LOOP_HINT "upstream names the broker; to combine faults, put several rules on one listener"

/* An upstream that is twice itself: one client connection would make twice connect to itself
 * until every descriptor is taken.  Refused, wildcards and the admin API included. */
static void test_upstream_loops(void **state)
{
    (void)state;
    EXPECT(LOOPS("a", "127.0.0.1:1", "127.0.0.1:1"), -1,
           EH(1, UP_COL("127.0.0.1:1"),
              "listener 'a' would connect to itself: upstream 127.0.0.1:1 reaches its own bind "
              "127.0.0.1:1 at 1:31",
              LOOP_HINT));
    EXPECT(LOOPS("a", "0.0.0.0:1", "127.0.0.1:1"), -1,
           EH(1, UP_COL("0.0.0.0:1"),
              "listener 'a' would connect to itself: upstream 127.0.0.1:1 reaches its own bind "
              "0.0.0.0:1 at 1:31",
              LOOP_HINT));
    EXPECT(LOOPS("a", "*:1", "127.3.2.1:1"), -1,
           EH(1, UP_COL("*:1"),
              "listener 'a' would connect to itself: upstream 127.3.2.1:1 reaches its own bind "
              "0.0.0.0:1 at 1:31",
              LOOP_HINT));
    EXPECT(LOOPS("a", "[::]:1", "127.0.0.1:1"), -1,
           EH(1, UP_COL("[::]:1"),
              "listener 'a' would connect to itself: upstream 127.0.0.1:1 reaches its own bind "
              "[::]:1 at 1:31",
              LOOP_HINT));
    EXPECT(LOOPS("a", "[::]:1", "[::1]:1"), -1,
           EH(1, UP_COL("[::]:1"),
              "listener 'a' would connect to itself: upstream [::1]:1 reaches its own bind [::]:1 "
              "at 1:31",
              LOOP_HINT));
    /* a connect() to 0.0.0.0 goes to loopback */
    EXPECT(LOOPS("a", "127.0.0.1:1", "0.0.0.0:1"), -1,
           EH(1, UP_COL("127.0.0.1:1"),
              "listener 'a' would connect to itself: upstream 0.0.0.0:1 reaches its own bind "
              "127.0.0.1:1 at 1:31",
              LOOP_HINT));
    /* localhost is a loopback address, whichever the resolver gives */
    EXPECT(LOOPS("a", "127.0.0.1:1", "localhost:1"), -1,
           EH(1, UP_COL("127.0.0.1:1"),
              "listener 'a' would connect to itself: upstream localhost:1 reaches its own bind "
              "127.0.0.1:1 at 1:31",
              LOOP_HINT));
    EXPECT(LOOPS("a", "[::1]:1", "LocalHost:1"), -1,
           EH(1, UP_COL("[::1]:1"),
              "listener 'a' would connect to itself: upstream LocalHost:1 reaches its own bind "
              "[::1]:1 at 1:31",
              LOOP_HINT));
}

static void test_upstream_loops_through_others(void **state)
{
    (void)state;
    /* into another listener, written later in the file */
    EXPECT(LOOPS("a", "127.0.0.1:1", "127.0.0.1:7") LOOPS("b", "*:7", "127.0.0.1:2"), -1,
           EH(1, UP_COL("127.0.0.1:1"),
              "listener 'a' would connect to twice itself: upstream 127.0.0.1:7 reaches listener "
              "'b' (bind 0.0.0.0:7 at 2:31)",
              LOOP_HINT));
    /* into the admin API */
    EXPECT("admin 127.0.0.1:8474\n" LOOPS("a", "127.0.0.1:1", "127.0.0.1:8474"), -1,
           EH(2, UP_COL("127.0.0.1:1"),
              "listener 'a' would connect to twice itself: upstream 127.0.0.1:8474 reaches the "
              "admin API (admin 127.0.0.1:8474 at 1:7)",
              LOOP_HINT));
    EXPECT("admin [::]:8474\nadmin-token 0123456789abcdef\n" LOOPS("a", "127.0.0.1:1",
                                                                   "localhost:8474"),
           -1,
           EH(3, UP_COL("127.0.0.1:1"),
              "listener 'a' would connect to twice itself: upstream localhost:8474 reaches the "
              "admin API (admin [::]:8474 at 1:7)",
              LOOP_HINT));
    /* not twice: another address, another family, a name, a host that may be another */
    EXPECT_CLEAN(LOOPS("a", "127.0.0.1:1", "127.0.0.2:1"));
    EXPECT_CLEAN(LOOPS("a", "[::1]:1", "127.0.0.1:1"));
    EXPECT_CLEAN(LOOPS("a", "0.0.0.0:1", "[::1]:1"));
    EXPECT_CLEAN(LOOPS("a", "0.0.0.0:1", "10.0.0.5:1"));
    EXPECT_CLEAN(LOOPS("a", "0.0.0.0:1", "broker.example:1"));
    EXPECT_CLEAN("admin 127.0.0.1:8474\n" LOOPS("a", "127.0.0.1:1", "127.0.0.1:8475"));
}

static void test_missing_required(void **state)
{
    (void)state;
    EXPECT("\n  listen a {\n}\n", -1, E(2, 3, "listener 'a' has no 'protocol'"),
           E(2, 3, "listener 'a' has no 'bind'"), E(2, 3, "listener 'a' has no 'upstream'"));
    EXPECT(L_HEAD L_PROTO L_BIND L_END, -1, E(1, 1, "listener 'a' has no 'upstream'"));
    /* written but invalid is not missing */
    EXPECT(L_HEAD L_PROTO "    bind nowhere\n" L_UP L_END, -1,
           E(3, 10, "'bind' needs HOST:PORT, e.g. 127.0.0.1:6380"));
}

static void test_no_listener(void **state)
{
    (void)state;
    EXPECT("", -1,
           EH(1, 1, "no listener defined",
              "add one, e.g. listen redis { protocol resp; bind 127.0.0.1:6380; upstream "
              "127.0.0.1:6379 }"));
    EXPECT("# only a comment\nlog-level info\n", -1,
           EH(1, 1, "no listener defined",
              "add one, e.g. listen redis { protocol resp; bind 127.0.0.1:6380; upstream "
              "127.0.0.1:6379 }"));
}

static void test_listener_names(void **state)
{
    char text[512], msg[128];
    char name[66];

    (void)state;
    EXPECT("listen bad/name {" L_PROTO L_BIND L_UP L_END, -1,
           EH(1, 8, "invalid listener name 'bad/name'",
              "use 1 to 64 letters, digits, '_', '.' or '-'"));
    EXPECT("listen \"\" {" L_PROTO L_BIND L_UP L_END, -1,
           EH(1, 8, "invalid listener name ''", "use 1 to 64 letters, digits, '_', '.' or '-'"));
    memset(name, 'n', 64);
    name[64] = '\0';
    snprintf(text, sizeof(text), "listen %s {" L_PROTO L_BIND L_UP L_END, name);
    EXPECT_CLEAN(text); /* 64 is fine */
    strcat(name, "n");
    snprintf(text, sizeof(text), "listen %s {" L_PROTO L_BIND L_UP L_END, name);
    /* quoted user text is cut at 64 bytes */
    name[64] = '\0';
    snprintf(msg, sizeof(msg), "invalid listener name '%s...'", name);
    EXPECT(text, -1, EH(1, 8, msg, "use 1 to 64 letters, digits, '_', '.' or '-'"));
    EXPECT_CLEAN("listen a.b_c-9 {" L_PROTO L_BIND L_UP L_END);
}

static void test_too_many_listeners(void **state)
{
    size_t cap = 1100 * 80, len = 0;
    char *text = malloc(cap);

    (void)state;
    assert_non_null(text);
    for (int i = 0; i < 1024; i++) {
        len += (size_t)snprintf(text + len, cap - len,
                                "listen l%d { protocol tcp; bind 127.0.0.1:%d; upstream h:1 }\n", i,
                                i + 1);
    }
    expect_diags(__FILE__, __LINE__, NULL, text, len, 0, NULL, 0);
    snprintf(text + len, cap - len,
             "listen x { protocol tcp; bind 127.0.0.1:9999; upstream h:1 }\n");
    EXPECT(text, -1, E(1025, 1, "too many listeners (at most 1024)"));
    free(text);
}

/* ---- addresses ---- */

#define WITH_BIND(addr) L_HEAD L_PROTO "    bind " addr "\n" L_UP L_END
#define WITH_UPSTREAM(addr) L_HEAD L_PROTO L_BIND "    upstream " addr "\n" L_END

static void test_bind_errors(void **state)
{
    static const char *const hint_v4 =
        "use an IPv4 address, a bracketed IPv6 address, localhost or *";

    (void)state;
    EXPECT(WITH_BIND("127.0.0.1"), -1, E(3, 10, "'bind' needs HOST:PORT, e.g. 127.0.0.1:6380"));
    EXPECT(WITH_BIND("127.0.0.1:"), -1, E(3, 10, "'bind' needs HOST:PORT, e.g. 127.0.0.1:6380"));
    EXPECT(WITH_BIND(":6380"), -1, E(3, 10, "'bind' needs HOST:PORT, e.g. 127.0.0.1:6380"));
    EXPECT(WITH_BIND("[::1]"), -1, E(3, 10, "'bind' needs HOST:PORT, e.g. 127.0.0.1:6380"));
    EXPECT(WITH_BIND("127.0.0.1:0"), -1, E(3, 10, "invalid port '0' (1-65535)"));
    EXPECT(WITH_BIND("127.0.0.1:65536"), -1, E(3, 10, "invalid port '65536' (1-65535)"));
    EXPECT(WITH_BIND("127.0.0.1:http"), -1, E(3, 10, "invalid port 'http' (1-65535)"));
    EXPECT(WITH_BIND("127.0.0.1:-1"), -1, E(3, 10, "invalid port '-1' (1-65535)"));
    EXPECT(WITH_BIND("127.0.0.1:99999999999999999999999"), -1,
           E(3, 10, "invalid port '99999999999999999999999' (1-65535)"));
    EXPECT(WITH_BIND("10.0.0.256:80"), -1, EH(3, 10, "invalid bind address '10.0.0.256'", hint_v4));
    EXPECT(WITH_BIND("example.com:80"), -1,
           EH(3, 10, "invalid bind address 'example.com'", hint_v4));
    EXPECT(WITH_BIND("::1:80"), -1,
           EH(3, 10, "IPv6 address in '::1:80' must be in brackets", "e.g. [::1]:6380"));
    EXPECT(WITH_BIND("[::1"), -1,
           EH(3, 10, "invalid address '[::1'", "write an IPv6 address as [::1]:6380"));
    EXPECT(WITH_BIND("[::1]x80"), -1,
           EH(3, 10, "invalid address '[::1]x80'", "write an IPv6 address as [::1]:6380"));
    EXPECT(WITH_BIND("[zz::1]:80"), -1, E(3, 10, "invalid IPv6 address 'zz::1'"));
    EXPECT(WITH_BIND("[127.0.0.1]:80"), -1, E(3, 10, "invalid IPv6 address '127.0.0.1'"));
    EXPECT(WITH_BIND("[localhost]:80"), -1, E(3, 10, "invalid IPv6 address 'localhost'"));
}

static void test_upstream_errors(void **state)
{
    static const char *const hint_dns =
        "use an IPv4 address, a bracketed IPv6 address or a DNS name";
    char label[70], text[1024], msg[256];

    (void)state;
    EXPECT(WITH_UPSTREAM("redis"), -1, E(4, 14, "'upstream' needs HOST:PORT, e.g. 127.0.0.1:6379"));
    EXPECT(WITH_UPSTREAM("redis:0"), -1, E(4, 14, "invalid port '0' (1-65535)"));
    EXPECT(WITH_UPSTREAM("a..b:1"), -1, EH(4, 14, "invalid upstream host 'a..b'", hint_dns));
    EXPECT(WITH_UPSTREAM(".a:1"), -1, EH(4, 14, "invalid upstream host '.a'", hint_dns));
    EXPECT(WITH_UPSTREAM("a.:1"), -1, EH(4, 14, "invalid upstream host 'a.'", hint_dns));
    EXPECT(WITH_UPSTREAM("bad!host:1"), -1,
           EH(4, 14, "invalid upstream host 'bad!host'", hint_dns));
    EXPECT(WITH_UPSTREAM("*:1"), -1, EH(4, 14, "invalid upstream host '*'", hint_dns));
    EXPECT(WITH_UPSTREAM("1.2.3:5"), -1, E(4, 14, "invalid IPv4 address '1.2.3'"));
    EXPECT(WITH_UPSTREAM("[::g]:5"), -1, E(4, 14, "invalid IPv6 address '::g'"));
    EXPECT(WITH_UPSTREAM("2001:db8::1:5"), -1,
           EH(4, 14, "IPv6 address in '2001:db8::1:5' must be in brackets", "e.g. [::1]:6380"));

    /* a broker URL is not an address: what to write instead, its host and port */
    EXPECT(WITH_UPSTREAM("amqp://host:5672"), -1,
           EH(4, 14, "'amqp://host:5672' is a URL, not an address: 'upstream' takes HOST:PORT",
              "write 'upstream host:5672'"));
    EXPECT(WITH_UPSTREAM("amqp://guest:guest@rabbit.staging/prod"), -1,
           EH(4, 14,
              "'amqp://guest:guest@rabbit.staging/prod' is a URL, not an address: 'upstream' "
              "takes HOST:PORT",
              "write 'upstream rabbit.staging:5672'; the rest (user, password, vhost or db) "
              "stays in the app's URL"));
    EXPECT(WITH_UPSTREAM("redis://[::1]/0"), -1,
           EH(4, 14, "'redis://[::1]/0' is a URL, not an address: 'upstream' takes HOST:PORT",
              "write 'upstream [::1]:6379'; the rest (user, password, vhost or db) stays in "
              "the app's URL"));
    EXPECT(WITH_UPSTREAM("amqps://mq.example.com"), -1,
           EH(4, 14,
              "'amqps://mq.example.com' is a URL, not an address: 'upstream' takes "
              "HOST:PORT",
              "write 'upstream mq.example.com:5671'; 'upstream-tls' for its TLS"));
    EXPECT(WITH_UPSTREAM("nats://"), -1,
           EH(4, 14, "'nats://' is a URL, not an address: 'upstream' takes HOST:PORT",
              "write 'upstream HOST:PORT'"));
    EXPECT(WITH_BIND("amqp://0.0.0.0:5673"), -1,
           EH(3, 10, "'amqp://0.0.0.0:5673' is a URL, not an address: 'bind' takes HOST:PORT",
              "write 'bind 0.0.0.0:5673'"));

    /* labels: at most 63 bytes */
    memset(label, 'a', 63);
    label[63] = '\0';
    snprintf(text, sizeof(text), WITH_UPSTREAM("%s.b:1"), label);
    EXPECT_CLEAN(text);
    strcat(label, "a");
    snprintf(text, sizeof(text), WITH_UPSTREAM("%s.b:1"), label);
    snprintf(msg, sizeof(msg), "invalid upstream host '%s...'", label); /* cut at 64 */
    EXPECT(text, -1, EH(4, 14, msg, hint_dns));
}

/* A DNS name of exactly `len` bytes made of 50-byte labels. */
static void make_dns_name(char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        buf[i] = (i % 51 == 50) ? '.' : 'h';
    }
    buf[len] = '\0';
}

static void test_upstream_name_length(void **state)
{
    char name[300], text[1024], msg[400];

    (void)state;
    make_dns_name(name, 253);
    snprintf(text, sizeof(text), WITH_UPSTREAM("%s:1"), name);
    EXPECT_CLEAN(text);
    make_dns_name(name, 254);
    snprintf(text, sizeof(text), WITH_UPSTREAM("%s:1"), name);
    name[64] = '\0';
    snprintf(msg, sizeof(msg), "host in '%s...' is too long (at most 253 bytes)", name);
    EXPECT(text, -1, E(4, 14, msg));
}

/* `visibility-timeout D` and `consumer-timeout D`: amqp only, above 0, one of the two. */
static void test_visibility_timeouts(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
#define AMQP_HEAD L_HEAD "    protocol amqp\n" L_BIND L_UP
    c = parse_ok(AMQP_HEAD "    visibility-timeout 3s\n" L_END, &d);
    assert_int_equal(c->listeners->visibility_ms, 3000);
    assert_false(c->listeners->consumer_timeout);
    conf_free(c);
    conf_diags_free(&d);
    c = parse_ok(AMQP_HEAD "    consumer-timeout 1500ms\n" L_END, &d);
    assert_int_equal(c->listeners->visibility_ms, 1500);
    assert_true(c->listeners->consumer_timeout);
    conf_free(c);
    conf_diags_free(&d);
    c = parse_ok(AMQP_HEAD L_END, &d);
    assert_int_equal(c->listeners->visibility_ms, 0);
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(AMQP_HEAD "    visibility-timeout 0s\n" L_END, -1,
           E(5, 24, "duration '0s' must be greater than 0"));
    EXPECT(AMQP_HEAD "    visibility-timeout 3s\n    consumer-timeout 5s\n" L_END, -1,
           EH(6, 5,
              "'visibility-timeout' and 'consumer-timeout' exclude each other (the other is at "
              "5:5)",
              "a delivery comes back one way: keep one of them"));
    EXPECT(IN_LISTEN("visibility-timeout 3s"), -1,
           EH(5, 5, "'visibility-timeout' applies only to protocol amqp",
              "a Redis transport has its own (kombu's visibility_timeout, a stream's XAUTOCLAIM "
              "min-idle-time): `expire D` rules act on it"));
#undef AMQP_HEAD
}

/* `message-id SOURCE...` and `task SOURCE...`: amqp only, 1 to 4 sources, each one that
 * proto/jobs/msg_field.h knows, kept in order. */
static void test_identity_sources(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
#define AMQP_HEAD L_HEAD "    protocol amqp\n" L_BIND L_UP
    c = parse_ok(AMQP_HEAD
                 "    message-id header.MT-MessageId property.message_id\n"
                 "    task header.__TypeId__ property.type routing-key body.json.job\n" L_END,
                 &d);
    const struct conf_listener *l = c->listeners;
    assert_int_equal(l->message_id.n, 2);
    assert_int_equal(l->message_id.src[0].kind, MSG_FIELD_HEADER);
    assert_string_equal(l->message_id.src[0].name, "MT-MessageId");
    assert_int_equal(l->message_id.src[1].kind, MSG_FIELD_PROPERTY);
    assert_int_equal(l->message_id.src[1].prop, MSG_PROP_MESSAGE_ID);
    assert_int_equal(l->task.n, 4);
    assert_int_equal(l->task.src[2].kind, MSG_FIELD_ROUTING_KEY);
    assert_int_equal(l->task.src[3].kind, MSG_FIELD_BODY_JSON);
    assert_true(msg_fields_need_body(&l->task));
    assert_false(msg_fields_need_body(&l->message_id));
    conf_free(c);
    conf_diags_free(&d);
    c = parse_ok(AMQP_HEAD L_END, &d);
    assert_int_equal(c->listeners->message_id.n, 0); /* the defaults: Celery's and the properties */
    assert_int_equal(c->listeners->task.n, 0);
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(AMQP_HEAD "    task property.typ\n" L_END, -1,
           E(5, 10,
             "unknown property 'typ' (expected message_id, correlation_id, type, app_id, "
             "user_id, reply_to, content_type or content_encoding)"));
    EXPECT(AMQP_HEAD "    message-id headers.id\n" L_END, -1,
           E(5, 16,
             "unknown source 'headers.id' (expected property.NAME, header.NAME, routing-key, "
             "exchange, queue or body.json.PATH)"));
    EXPECT(AMQP_HEAD "    task body.json.a..b\n" L_END, -1,
           E(5, 10, "an empty key in the JSON path 'a..b'"));
    EXPECT(AMQP_HEAD "    task body.json.a.b.c.d\n" L_END, -1,
           E(5, 10, "the JSON path 'a.b.c.d' has more than 3 keys"));
    EXPECT(AMQP_HEAD "    task queue routing-key exchange property.type header.x\n" L_END, -1,
           EH(5, 51, "'task' takes 1 to 4 sources, tried in order",
              "e.g. `task header.__TypeId__ property.type`"));
    EXPECT(AMQP_HEAD "    task\n" L_END, -1,
           EH(5, 5, "'task' takes 1 to 4 sources, tried in order",
              "e.g. `task header.__TypeId__ property.type`"));
    EXPECT(L_HEAD "    protocol resp\n" L_BIND L_UP "    task property.type\n" L_END, -1,
           EH(5, 5, "'task' applies only to protocol amqp and to 'profile list'",
              "Sidekiq's, Celery's, RQ's and a stream's jobs name their ids and tasks "
              "themselves; 'profile list' reads any app's from body.json sources"));
    EXPECT(L_HEAD "    protocol resp\n    profile celery\n" L_BIND L_UP
                  "    message-id body.json.uuid\n" L_END,
           -1,
           EH(6, 5, "'message-id' applies only to protocol amqp and to 'profile list'",
              "Sidekiq's, Celery's, RQ's and a stream's jobs name their ids and tasks "
              "themselves; 'profile list' reads any app's from body.json sources"));
    EXPECT(IN_LISTEN("message-id property.message_id"), -1,
           E(5, 5, "'message-id' applies only to protocol amqp and to 'profile list'"));
    /* A Redis list: a job is its JSON payload, read with body.json sources only. */
    c = parse_ok(L_HEAD "    protocol resp\n    profile list\n" L_BIND L_UP
                        "    message-id body.json.uuid\n    task body.json.displayName\n" L_END,
                 &d);
    assert_string_equal(c->listeners->profile, "list");
    assert_int_equal(c->listeners->message_id.n, 1);
    assert_string_equal(c->listeners->message_id.src[0].text, "body.json.uuid");
    assert_string_equal(c->listeners->task.src[0].text, "body.json.displayName");
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(L_HEAD "    protocol resp\n    profile list\n" L_BIND L_UP
                  "    task body.json.displayName header.x\n" L_END,
           -1,
           EH(6, 5, "'task' source 'header.x' is an AMQP one",
              "a job on a Redis list is its payload alone: use body.json.PATH (e.g. "
              "body.json.uuid)"));
#undef AMQP_HEAD
}

/* ---- limits and privileges ---- */

static void test_limits_and_user(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
    c = parse_ok("user nobody\n" IN_LISTEN("max-message-size 16MiB\n    max-held 1MB"), &d);
    assert_string_equal(c->user, "nobody");
    assert_int_equal(c->listeners->max_message, 16u * 1024 * 1024);
    assert_int_equal(c->listeners->max_held, 1000000);
    conf_free(c);
    conf_diags_free(&d);
    /* not set: 0, the protocol's own limits and the default hold cap */
    c = parse_ok(IN_LISTEN("idle-timeout 1s"), &d);
    assert_null(c->user);
    assert_int_equal(c->listeners->max_message, 0);
    assert_int_equal(c->listeners->max_held, 0);
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(IN_LISTEN("max-message-size 16"), -1,
           E(5, 22, "size '16' needs a unit: B, KB, MB, GB, KiB, MiB or GiB"));
    EXPECT(IN_LISTEN("max-held 0MB"), -1, E(5, 14, "size '0MB' must be greater than 0"));
    EXPECT(IN_LISTEN("max-held 1MB/s"), -1,
           EH(5, 14, "size '1MB/s' is a rate", "write it without '/s'"));
    EXPECT("user -x\n" LISTENER, -1,
           EH(1, 6, "invalid user name '-x'", "a login name, e.g. user twice"));
    EXPECT("user \"a b\"\n" LISTENER, -1,
           EH(1, 6, "invalid user name 'a b'", "a login name, e.g. user twice"));
}

/* `instance NAME`: which twice wrote a journal, among several read together. */
static void test_instance(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
    c = parse_ok("instance zone-a:pool_1.eu\n" LISTENER, &d);
    assert_string_equal(c->instance, "zone-a:pool_1.eu");
    conf_free(c);
    conf_diags_free(&d);
    c = parse_ok(LISTENER, &d);
    assert_null(c->instance); /* the host name, at start */
    conf_free(c);
    conf_diags_free(&d);
    EXPECT("instance \"a b\"\n" LISTENER, -1,
           EH(1, 10,
              "invalid instance name 'a b': letters, digits, '.', '_', '-' and ':', at most 64 "
              "bytes",
              "e.g. instance zone-a"));
    EXPECT("instance a\ninstance b\n" LISTENER, -1,
           EH(2, 1, "duplicate 'instance'", "first set at 1:1"));
}

/* ---- numbers ---- */

static void test_duration_errors(void **state)
{
    (void)state;
    EXPECT("connect-timeout 5\n" LISTENER, -1,
           E(1, 17, "duration '5' needs a unit: ms, s, m or h"));
    EXPECT("connect-timeout 5x\n" LISTENER, -1,
           EH(1, 17, "unknown unit 'x' in duration '5x'", "use ms, s, m or h"));
    EXPECT("connect-timeout 5sec\n" LISTENER, -1,
           EH(1, 17, "unknown unit 'sec' in duration '5sec'", "use ms, s, m or h"));
    EXPECT("connect-timeout 5S\n" LISTENER, -1,
           EH(1, 17, "unknown unit 'S' in duration '5S'", "use ms, s, m or h"));
    EXPECT("connect-timeout fast\n" LISTENER, -1,
           EH(1, 17, "invalid duration 'fast'", "write a number and a unit, e.g. 250ms, 45s, 2m"));
    EXPECT("connect-timeout -5s\n" LISTENER, -1,
           EH(1, 17, "invalid duration '-5s'", "write a number and a unit, e.g. 250ms, 45s, 2m"));
    EXPECT("connect-timeout 0s\n" LISTENER, -1, E(1, 17, "duration '0s' must be greater than 0"));
    EXPECT("connect-timeout 0ms\n" LISTENER, -1, E(1, 17, "duration '0ms' must be greater than 0"));
    EXPECT("shutdown-grace 25h\n" LISTENER, -1,
           E(1, 16, "duration '25h' is too large (at most 24h)"));
    EXPECT("shutdown-grace 86400001ms\n" LISTENER, -1,
           E(1, 16, "duration '86400001ms' is too large (at most 24h)"));
    EXPECT("shutdown-grace 99999999999999999999999999h\n" LISTENER, -1,
           E(1, 16, "duration '99999999999999999999999999h' is too large (at most 24h)"));
    EXPECT(IN_LISTEN("idle-timeout 1d"), -1,
           EH(5, 18, "unknown unit 'd' in duration '1d'", "use ms, s, m or h"));
    EXPECT(IN_LISTEN("connect-timeout 100"), -1,
           E(5, 21, "duration '100' needs a unit: ms, s, m or h"));
}

static void test_max_connections(void **state)
{
    struct conf_diags d;
    struct conf *c = parse_ok(IN_LISTEN("max-connections 1000000"), &d);

    (void)state;
    assert_int_equal(c->listeners->max_connections, 1000000);
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(IN_LISTEN("max-connections 0"), -1, E(5, 21, "invalid max-connections '0' (1-1000000)"));
    EXPECT(IN_LISTEN("max-connections 1000001"), -1,
           E(5, 21, "invalid max-connections '1000001' (1-1000000)"));
    EXPECT(IN_LISTEN("max-connections ten"), -1,
           E(5, 21, "invalid max-connections 'ten' (1-1000000)"));
    EXPECT(IN_LISTEN("max-connections 10k"), -1,
           E(5, 21, "invalid max-connections '10k' (1-1000000)"));
    EXPECT(IN_LISTEN("max-connections -1"), -1,
           E(5, 21, "invalid max-connections '-1' (1-1000000)"));
}

/* ---- tls and upstream-tls ---- */

static void test_tls_errors(void **state)
{
    static const char *const needs = "'tls' needs cert FILE and key FILE";
    static const char *const write = "write: tls cert FILE key FILE";

    (void)state;
    EXPECT(IN_LISTEN("tls"), -1, EH(5, 5, needs, write));
    EXPECT(IN_LISTEN("tls cert a.pem"), -1, EH(5, 5, needs, write));
    EXPECT(IN_LISTEN("tls key k.pem"), -1, EH(5, 5, needs, write));
    EXPECT(IN_LISTEN("tls cert a.pem key"), -1, E(5, 20, "'key' needs a value: key FILE"));
    EXPECT(IN_LISTEN("tls cert \"\" key k.pem"), -1, E(5, 9, "'cert' needs a value: cert FILE"));
    EXPECT(IN_LISTEN("tls cert a.pem kye"), -1, EH(5, 5, needs, write),
           EH(5, 20, "unknown 'tls' option 'kye'", "did you mean 'key'?"));
    EXPECT(IN_LISTEN("tls cert a.pem key k.pem cert b.pem"), -1,
           EH(5, 30, "duplicate 'cert' in 'tls'", "first given at 5:9"));
    EXPECT(IN_LISTEN("tls cert a key b { }"), -1, E(5, 22, "'tls' does not take a block"));
}

static void test_upstream_tls_errors(void **state)
{
    (void)state;
    EXPECT(IN_LISTEN("upstream-tls verify no-verify"), -1,
           E(5, 25, "'verify' and 'no-verify' cannot be used together"));
    EXPECT(IN_LISTEN("upstream-tls no-verify sni x verify"), -1,
           E(5, 34, "'verify' and 'no-verify' cannot be used together"));
    EXPECT(IN_LISTEN("upstream-tls cert c.pem"), -1,
           EH(5, 18, "'upstream-tls' has 'cert' but no 'key'", "write: cert FILE key FILE"));
    EXPECT(IN_LISTEN("upstream-tls sni s key k.pem"), -1,
           EH(5, 24, "'upstream-tls' has 'key' but no 'cert'", "write: cert FILE key FILE"));
    EXPECT(IN_LISTEN("upstream-tls veryfy"), -1,
           EH(5, 18, "unknown 'upstream-tls' option 'veryfy'", "did you mean 'verify'?"));
    EXPECT(IN_LISTEN("upstream-tls enable"), -1,
           E(5, 18, "unknown 'upstream-tls' option 'enable'"));
    EXPECT(IN_LISTEN("upstream-tls sni"), -1, E(5, 18, "'sni' needs a value: sni NAME"));
    EXPECT(IN_LISTEN("upstream-tls ca a ca b"), -1,
           EH(5, 23, "duplicate 'ca' in 'upstream-tls'", "first given at 5:18"));
    EXPECT(IN_LISTEN("upstream-tls\n    upstream-tls no-verify"), -1,
           EH(6, 5, "duplicate 'upstream-tls'", "first set at 5:5"));
}

/* ---- rules: the header (the language itself is tested in test_rules.c) ---- */

#define REDIS "listen redis { protocol tcp; bind 127.0.0.1:1; upstream 127.0.0.1:2 }\n"

static void test_rules(void **state)
{
    struct conf_diags d;
    struct conf *c;

    (void)state;
    /* the listener may come after the rule */
    c = parse_ok("rule slow on redis {\n    do latency 5s\n}\n" REDIS, &d);
    assert_int_equal(c->n_rules, 1);
    assert_string_equal(c->rules->name, "slow");
    assert_string_equal(c->rules->listener, "redis");
    conf_free(c);
    conf_diags_free(&d);
    EXPECT(REDIS "rule slow on redis {\n    delay 5s\n    anything { goes }\n}\n", -1,
           EH(2, 1, "rule 'slow' has no 'do ACTION'",
              "e.g. do latency DURATION; listener 'redis' (protocol tcp) can do on the byte "
              "stream: latency, bandwidth, slice, reset, blackhole, slow-close, limit"),
           EH(3, 5, "unknown directive 'delay'", "did you mean 'do delay'?"),
           E(4, 5, "unknown directive 'anything'"));
    EXPECT("rule slow on redsi {\n do latency 1s\n}\n" REDIS, -1,
           EH(1, 14, "unknown listener 'redsi'", "did you mean 'redis'?"));
    EXPECT(REDIS "rule slow on kafka {\n do latency 1s\n}\n", -1,
           E(2, 14, "unknown listener 'kafka'"));
    EXPECT(REDIS "rule slow redis {\n do latency 1s\n}\n", -1,
           E(2, 1, "'rule' takes three arguments: NAME on LISTENER"),
           EH(2, 11, "expected 'on' after the rule name, found 'redis'",
              "rule NAME on LISTENER { ... }"));
    EXPECT(REDIS "rule slow on redis now {\n do latency 1s\n}\n", -1,
           E(2, 20, "'rule' takes three arguments: NAME on LISTENER"));
    EXPECT(REDIS "rule slow on redis\n", -1,
           E(2, 1, "'rule' needs a block: rule NAME on LISTENER { ... }"));
    EXPECT(REDIS "rule s/w on redis {\n do latency 1s\n}\n", -1,
           EH(2, 6, "invalid rule name 's/w'", "use 1 to 64 letters, digits, '_', '.' or '-'"));
}

/* ---- everything at once ---- */

static void test_all_errors_reported(void **state)
{
    (void)state;
    EXPECT("log-levl debug\n"
           "listen a {\n"
           "    protocol tpc            # a comment\n"
           "    bind 127.0.0.1:99999\n"
           "    upstream redis\n"
           "    idle-timeout 10\n"
           "}\n",
           -1, EH(1, 1, "unknown directive 'log-levl'", "did you mean 'log-level'?"),
           EH(3, 14, "unknown protocol 'tpc'", "did you mean 'tcp'?"),
           E(4, 10, "invalid port '99999' (1-65535)"),
           E(5, 14, "'upstream' needs HOST:PORT, e.g. 127.0.0.1:6379"),
           E(6, 18, "duration '10' needs a unit: ms, s, m or h"));
}

/* ---- printing ---- */

/* conf_diags_print into a string owned by the caller. */
static char *print_to_string(const struct conf_diags *d)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);

    assert_non_null(f);
    conf_diags_print(d, f);
    fclose(f);
    return buf;
}

static void test_print_format(void **state)
{
    struct conf_diags d;
    struct conf *c = NULL;
    const char *text = "log-level verbose\n"
                       "listen a {\n"
                       "    protocol resp\n"
                       "    bind 1.2.3.4\n"
                       "    upstrem x:1\n"
                       "}\n";
    char *out;

    (void)state;
    conf_diags_init(&d);
    assert_int_equal(conf_parse_string("conf/twice.conf", text, strlen(text), &c, &d), -1);
    assert_null(c);
    assert_int_equal(d.errors, 4);
    assert_int_equal(d.warnings, 0);
    out = print_to_string(&d);
    assert_string_equal(
        out, "conf/twice.conf:1:11: error: unknown log level 'verbose' (expected error, warn, "
             "info or debug)\n"
             "conf/twice.conf:2:1: error: listener 'a' has no 'upstream'\n"
             "conf/twice.conf:4:10: error: 'bind' needs HOST:PORT, e.g. 127.0.0.1:6380\n"
             "conf/twice.conf:5:5: error: unknown directive 'upstrem' (did you mean "
             "'upstream'?)\n");
    free(out);
    conf_diags_free(&d);
}

/* Diagnostics added later (as proxy/ does for TLS files) print in file order,
 * stably; one without a position comes first. */
static void test_print_order_of_added_diags(void **state)
{
    struct conf_diags d;
    char *out;

    (void)state;
    conf_diags_init(&d);
    d.file = strdup("x.conf");
    conf_diag_add(&d, CONF_ERROR, (struct conf_loc){3, 5}, NULL, "third %d", 3);
    conf_diag_add(&d, CONF_WARNING, (struct conf_loc){1, 1}, "a hint", "first");
    conf_diag_add(&d, CONF_ERROR, (struct conf_loc){3, 5}, NULL, "fourth");
    conf_diag_add(&d, CONF_ERROR, (struct conf_loc){2, 9}, NULL, "second");
    conf_diag_add(&d, CONF_ERROR, (struct conf_loc){0, 0}, NULL, "cannot open: %s", "nope");
    conf_diag_add(&d, CONF_ERROR, (struct conf_loc){9, 1}, NULL, "last");
    assert_int_equal(d.errors, 5);
    assert_int_equal(d.warnings, 1);
    out = print_to_string(&d);
    assert_string_equal(out, "x.conf: error: cannot open: nope\n"
                             "x.conf:1:1: warning: first (a hint)\n"
                             "x.conf:2:9: error: second\n"
                             "x.conf:3:5: error: third 3\n"
                             "x.conf:3:5: error: fourth\n"
                             "x.conf:9:1: error: last\n");
    free(out);
    /* the tail stays right: appending after the sort still lands last */
    conf_diag_add(&d, CONF_ERROR, (struct conf_loc){10, 1}, NULL, "after");
    const struct conf_diag *last = d.head;
    while (last->next != NULL) {
        last = last->next;
    }
    assert_string_equal(last->msg, "after");
    assert_ptr_equal(d.tail, &last->next);
    conf_diags_free(&d);
    assert_null(d.head);
    assert_null(d.file);
}

/* ---- files ---- */

/* Write `len` bytes to a new temporary file; returns its path (static). */
static const char *write_temp(const char *data, size_t len)
{
    static char path[64];
    int fd;

    snprintf(path, sizeof(path), "/tmp/test_conf_XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
    return path;
}

/* What the program does with a path (proxy/core/conf_file.c): rules/ opens no file, it reads the
 * stream it is handed. */
static int parse_path(const char *path, struct conf **c, struct conf_diags *d)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        *c = NULL;
        return conf_cannot_open(path, errno, d);
    }
    int rc = conf_parse_stream(path, f, c, d);
    fclose(f);
    return rc;
}

static void test_parse_file(void **state)
{
    const char *path = write_temp(full_config, strlen(full_config));
    struct conf_diags d;
    struct conf *c = NULL;

    (void)state;
    conf_diags_init(&d);
    assert_int_equal(parse_path(path, &c, &d), 0);
    assert_non_null(c);
    assert_string_equal(c->path, path);
    assert_string_equal(d.file, path);
    assert_int_equal(c->n_listeners, 3);
    conf_free(c);
    conf_diags_free(&d);
    unlink(path);
}

static void test_parse_file_errors(void **state)
{
    struct conf_diags d;
    struct conf *c = (struct conf *)&d; /* must be reset to NULL */
    char *out;

    (void)state;
    conf_diags_init(&d);
    assert_int_equal(parse_path("/nonexistent/twice.conf", &c, &d), -1);
    assert_null(c);
    assert_int_equal(d.errors, 1);
    assert_int_equal(d.head->loc.line, 0);
    assert_string_equal(d.head->msg, "cannot open: No such file or directory");
    out = print_to_string(&d);
    assert_string_equal(out, "/nonexistent/twice.conf: error: cannot open: No such file or "
                             "directory\n");
    free(out);
    conf_diags_free(&d);

    conf_diags_init(&d);
    assert_int_equal(parse_path("/tmp", &c, &d), -1);
    assert_string_equal(d.head->msg, "cannot read: Is a directory");
    conf_diags_free(&d);
}

static void test_file_size_limit(void **state)
{
    size_t len = CONF_MAX_FILE_BYTES;
    char *data = malloc(len + 1);
    const char *path;
    struct conf_diags d;
    struct conf *c = NULL;

    (void)state;
    assert_non_null(data);
    /* exactly the limit: a listener, then a comment padding to the end */
    memset(data, '#', len + 1);
    memcpy(data, LISTENER, strlen(LISTENER));
    path = write_temp(data, len);
    conf_diags_init(&d);
    assert_int_equal(parse_path(path, &c, &d), 0);
    conf_free(c);
    conf_diags_free(&d);
    unlink(path);

    path = write_temp(data, len + 1);
    conf_diags_init(&d);
    assert_int_equal(parse_path(path, &c, &d), -1);
    assert_null(c);
    assert_int_equal(d.errors, 1);
    assert_int_equal(d.head->loc.line, 0);
    assert_string_equal(d.head->msg, "file is too large (more than 4194304 bytes)");
    conf_diags_free(&d);
    unlink(path);
    free(data);
}

/* ---- robustness ---- */

static uint64_t rng_state;

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static size_t rng_below(size_t n)
{
    return n == 0 ? 0 : (size_t)(rng_next() % n);
}

/* Parse arbitrary bytes: the result must be coherent, whatever they are. */
static void check_garbage(const char *text, size_t len)
{
    struct conf_diags d;
    struct conf *c = NULL;
    unsigned lines = 1;
    char *out;
    int rc;

    for (size_t i = 0; i < len; i++) {
        lines += text[i] == '\n';
    }
    conf_diags_init(&d);
    rc = conf_parse_string("g.conf", text, len, &c, &d);
    assert_true(rc == 0 || rc == -1);
    if (rc == -1) {
        assert_null(c);
        assert_true(d.errors >= 1);
        assert_non_null(d.head);
    } else {
        size_t n = 0;
        assert_non_null(c);
        assert_int_equal(d.errors, 0);
        for (const struct conf_listener *l = c->listeners; l != NULL; l = l->next, n++) {
            assert_non_null(l->bind.host);
            assert_non_null(l->upstream.host);
            assert_true(l->bind.port != 0 && l->upstream.port != 0);
            assert_true(l->connect_timeout_ms != 0);
        }
        assert_int_equal(n, c->n_listeners);
    }
    for (const struct conf_diag *g = d.head; g != NULL; g = g->next) {
        assert_true(g->loc.line <= lines);
        assert_true(g->loc.line == 0 || g->loc.col >= 1);
        assert_non_null(g->msg);
    }
    out = print_to_string(&d);
    free(out);
    conf_free(c);
    conf_diags_free(&d);
}

static const char *const fragments[] = {
    "listen",
    "protocol",
    "tcp",
    "resp",
    "amqp",
    "profile",
    "rq",
    "bind",
    "upstream",
    "127.0.0.1:1",
    "[::1]:2",
    "localhost:3",
    "h.example:4",
    "tls",
    "cert",
    "key",
    "upstream-tls",
    "verify",
    "no-verify",
    "ca",
    "sni",
    "rule",
    "on",
    "log-level",
    "debug",
    "connect-timeout",
    "idle-timeout",
    "max-connections",
    "5s",
    "0ms",
    "25h",
    "a",
    "b",
    "{",
    "}",
    ";",
    "\n",
    "\r\n",
    "\"",
    "\\",
    "\\q",
    "#",
    " ",
    "\t",
    "[",
    "]",
    ":",
};

/* Random text made of pieces of the language, with the odd random byte. */
static size_t make_fragment_soup(char *buf, size_t cap)
{
    size_t len = 0, n = rng_below(80);

    for (size_t i = 0; i < n; i++) {
        const char *f = fragments[rng_below(sizeof(fragments) / sizeof(fragments[0]))];
        size_t flen = strlen(f);
        if (len + flen + 2 > cap) {
            break;
        }
        memcpy(buf + len, f, flen);
        len += flen;
        buf[len++] = rng_below(8) == 0 ? (char)rng_below(256) : ' ';
    }
    return len;
}

/* The full valid configuration with a few random edits. */
static size_t make_mutant(char *buf, size_t cap)
{
    size_t len = strlen(full_config), edits = 1 + rng_below(4);

    memcpy(buf, full_config, len);
    for (size_t e = 0; e < edits && len > 0; e++) {
        size_t at = rng_below(len);
        switch (rng_below(4)) {
        case 0: /* overwrite a byte */
            buf[at] = (char)rng_below(256);
            break;
        case 1: /* delete a run */
        {
            size_t n = 1 + rng_below(len - at < 20 ? len - at : 20);
            memmove(buf + at, buf + at + n, len - at - n);
            len -= n;
        } break;
        case 2: /* insert a syntax byte */
            if (len + 1 < cap) {
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = "{}\";#\\\n "[rng_below(8)];
                len++;
            }
            break;
        default: /* duplicate a run */
        {
            size_t n = 1 + rng_below(len - at < 40 ? len - at : 40);
            if (len + n < cap) {
                memmove(buf + at + n, buf + at, len - at);
                len += n;
            }
        } break;
        }
    }
    return len;
}

static void test_garbage(void **state)
{
    char buf[4096];

    (void)state;
    rng_state = 0x7477696365ull; /* "twice" */
    for (int i = 0; i < 1500; i++) {
        size_t len = make_fragment_soup(buf, sizeof(buf));
        check_garbage(buf, len);
    }
    for (int i = 0; i < 1500; i++) {
        size_t len = make_mutant(buf, sizeof(buf));
        check_garbage(buf, len);
    }
    for (int i = 0; i < 1000; i++) {
        size_t len = rng_below(300);
        for (size_t k = 0; k < len; k++) {
            buf[k] = (char)rng_below(256);
        }
        check_garbage(buf, len);
    }
}

static void test_out_of_memory(void **state)
{
    const char *path = write_temp(full_config, strlen(full_config));
    struct conf_diags d;
    struct conf *c = NULL;

    (void)state;
    parse_with_failing_allocations(NULL, full_config, 0);
    parse_with_failing_allocations(NULL,
                                   "log-levl x\nlisten a {\n protocol tpc\n bind ::1:2\n}\n"
                                   "rule r on b { }\n\"unterminated",
                                   -1);
    /* the first allocation of conf_parse_file: the file name */
    conf_diags_init(&d);
    conf_mem_fail_nth(0);
    assert_int_equal(parse_path(path, &c, &d), -1);
    conf_mem_fail_nth(-1);
    assert_null(c);
    assert_int_equal(d.errors, 1);
    assert_string_equal(d.head->msg, "out of memory");
    conf_diags_free(&d);
    /* the second: the read buffer */
    conf_diags_init(&d);
    conf_mem_fail_nth(1);
    assert_int_equal(parse_path(path, &c, &d), -1);
    conf_mem_fail_nth(-1);
    assert_string_equal(d.head->msg, "out of memory");
    conf_diags_free(&d);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_config_globals_and_warnings),
        cmocka_unit_test(test_full_config_resp_listener),
        cmocka_unit_test(test_full_config_amqp_and_tcp_listeners),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_global_connect_timeout_order),
        cmocka_unit_test(test_upstream_tls_variants),
        cmocka_unit_test(test_no_verify_ignores_ca),
        cmocka_unit_test(test_addresses),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_comments_semicolons_crlf),
        cmocka_unit_test(test_quoted_strings),
        cmocka_unit_test(test_zeroed_diags_and_names),
        cmocka_unit_test(test_lexer_errors),
        cmocka_unit_test(test_block_errors),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_unknown_directives),
        cmocka_unit_test(test_directive_in_wrong_scope),
        cmocka_unit_test(test_enum_values),
        cmocka_unit_test(test_protocol_names_a_broker),
        cmocka_unit_test(test_profile_names_from_the_registry),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_journal_flush),
        cmocka_unit_test(test_journal_mode),
        cmocka_unit_test(test_profile_needs_resp),
        cmocka_unit_test(test_visibility_timeouts),
        cmocka_unit_test(test_identity_sources),
        cmocka_unit_test(test_argument_counts),
        cmocka_unit_test(test_block_shape),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_bind_conflicts),
        cmocka_unit_test(test_bind_conflicts_through_wildcards),
        cmocka_unit_test(test_admin_bind_conflicts),
        cmocka_unit_test(test_toxiproxy_api),
        cmocka_unit_test(test_upstream_loops),
        cmocka_unit_test(test_upstream_loops_through_others),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_no_listener),
        cmocka_unit_test(test_listener_names),
        cmocka_unit_test(test_too_many_listeners),
        cmocka_unit_test(test_bind_errors),
        cmocka_unit_test(test_upstream_errors),
        cmocka_unit_test(test_upstream_name_length),
        cmocka_unit_test(test_limits_and_user),
        cmocka_unit_test(test_instance),
        cmocka_unit_test(test_duration_errors),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_tls_errors),
        cmocka_unit_test(test_upstream_tls_errors),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_all_errors_reported),
        cmocka_unit_test(test_print_format),
        cmocka_unit_test(test_print_order_of_added_diags),
        cmocka_unit_test(test_parse_file),
        cmocka_unit_test(test_parse_file_errors),
        cmocka_unit_test(test_file_size_limit),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_out_of_memory),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
