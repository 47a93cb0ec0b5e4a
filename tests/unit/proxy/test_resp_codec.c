/*
 * test_resp_codec.c - the RESP codec (proxy/resp/) driven with no socket, through the frame pump
 * and a fake port (fake_session.h): what each side receives.
 *
 *   - Every recorded session (tests/unit/data/resp/, and each framework's under its profile)
 *     goes through unchanged with no rule: command by command with each reply after it, in
 *     1-byte reads, and pipelined whole; and with rules that make every event be classified
 *     and judged but fault none.
 *   - The faults a user names on commands, with what each side then sees: `error` answers in
 *     place and Redis never gets the command, `close before` cuts with the earlier replies
 *     delivered, `close after` lets the command's reply through and then cuts.
 *   - Each of those paths, and each profile's session with its rules, with every allocation
 *     failing in turn (libevent's too): the session either goes on as without the failure, or
 *     ends at once with the reason, and neither side ever received part of a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/resp/resp.h"
#include "proxy/core/log.h"
#include "tests/lib/fake_session.h"
#include "tests/lib/golden.h"

/* ---- a recorded exchange, cut into messages ---- */

#define MAX_MSGS 4096

struct exchange {
    uint8_t *side[2]; /* [SIDE_CLIENT]: what the client sent; [SIDE_UPSTREAM]: the server */
    size_t len[2];
    size_t at[2][MAX_MSGS + 1]; /* message boundaries */
    size_t n[2];
};

static void cut(struct exchange *x, enum session_side side)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, side == SIDE_CLIENT ? RESP_SIDE_CLIENT : RESP_SIDE_SERVER);
    size_t off = 0;
    x->n[side] = 0;
    x->at[side][0] = 0;
    while (off < x->len[side] && x->n[side] < MAX_MSGS) {
        struct resp_msg m;
        int rc = resp_scan(&sc, x->side[side] + off, x->len[side] - off, &m);
        assert_int_equal(rc, 1);
        off += m.len;
        x->at[side][++x->n[side]] = off;
    }
    assert_int_equal(off, x->len[side]);
}

static void exchange_load(struct exchange *x, const char *client, const char *server)
{
    x->side[SIDE_CLIENT] = kit_golden(&x->len[SIDE_CLIENT], "%s", client);
    x->side[SIDE_UPSTREAM] = kit_golden(&x->len[SIDE_UPSTREAM], "%s", server);
    cut(x, SIDE_CLIENT);
    cut(x, SIDE_UPSTREAM);
}

static void exchange_free(struct exchange *x)
{
    kit_free(x->side[SIDE_CLIENT]);
    kit_free(x->side[SIDE_UPSTREAM]);
}

/* Message i of side, fed in pieces of `piece` bytes (0: whole). */
static void feed_msg(struct fake_session *fs, const struct exchange *x, enum session_side side,
                     size_t i, size_t piece)
{
    const uint8_t *p = x->side[side] + x->at[side][i];
    size_t len = x->at[side][i + 1] - x->at[side][i];
    if (piece == 0)
        piece = len;
    for (size_t off = 0; off < len; off += piece)
        fake_feed(fs, side, p + off, len - off < piece ? len - off : piece);
}

enum feeding { BY_MESSAGE, BY_BYTE, PIPELINED };

/* The exchange as a client and its server would make it: each command, then the reply due
 * (a command may have several, a reply none: the pairing is the codec's to find; here replies
 * go one per command while both last, the rest at the end). */
static void replay(struct fake_session *fs, const struct exchange *x, enum feeding how)
{
    if (how == PIPELINED) {
        fake_feed(fs, SIDE_CLIENT, x->side[SIDE_CLIENT], x->len[SIDE_CLIENT]);
        fake_feed(fs, SIDE_UPSTREAM, x->side[SIDE_UPSTREAM], x->len[SIDE_UPSTREAM]);
        return;
    }
    size_t piece = how == BY_BYTE ? 1 : 0;
    size_t c = 0, r = 0;
    while (c < x->n[SIDE_CLIENT] || r < x->n[SIDE_UPSTREAM]) {
        if (c < x->n[SIDE_CLIENT])
            feed_msg(fs, x, SIDE_CLIENT, c++, piece);
        if (r < x->n[SIDE_UPSTREAM] && (r < c || c == x->n[SIDE_CLIENT]))
            feed_msg(fs, x, SIDE_UPSTREAM, r++, piece);
    }
}

/* ---- recorded sessions, unchanged ---- */

struct recording {
    const char *profile; /* NULL: plain */
    const char *client, *server;
};

static const struct recording recordings[] = {
    {NULL, "resp/resp2-client.bin", "resp/resp2-server.bin"},
    {NULL, "resp/resp3-client.bin", "resp/resp3-server.bin"},
    {NULL, "resp/cli-client.bin", "resp/cli-server.bin"},
    {NULL, "resp/big-client.bin", "resp/big-server.bin"},
    {"sidekiq", "frameworks/sidekiq/01-client.bin", "frameworks/sidekiq/01-server.bin"},
    {"sidekiq", "frameworks/sidekiq/02-client.bin", "frameworks/sidekiq/02-server.bin"},
    {"celery", "frameworks/celery_redis/01-client.bin", "frameworks/celery_redis/01-server.bin"},
    {"celery", "frameworks/celery_redis/02-client.bin", "frameworks/celery_redis/02-server.bin"},
    {"celery", "frameworks/celery_redis/05-client.bin", "frameworks/celery_redis/05-server.bin"},
    {"rq", "frameworks/rq/01-client.bin", "frameworks/rq/01-server.bin"},
    {"rq", "frameworks/rq/02-client.bin", "frameworks/rq/02-server.bin"},
    {"rq", "frameworks/rq/05-client.bin", "frameworks/rq/05-server.bin"},
    {"streams", "frameworks/streams/01-client.bin", "frameworks/streams/01-server.bin"},
    {"streams", "frameworks/streams/02-client.bin", "frameworks/streams/02-server.bin"},
    {"bullmq", "frameworks/bullmq/01-client.bin", "frameworks/bullmq/01-server.bin"},
    {"bullmq", "frameworks/bullmq/02-client.bin", "frameworks/bullmq/02-server.bin"},
    {"bullmq", "frameworks/bullmq/03-client.bin", "frameworks/bullmq/03-server.bin"},
    {"list", "frameworks/lists/01-client.bin", "frameworks/lists/01-server.bin"},
    {"list", "frameworks/lists/02-client.bin", "frameworks/lists/02-server.bin"},
};

/* The listener of a recording, with `rules` after it. */
static void listener_text(char *out, size_t cap, const struct recording *r, const char *rules)
{
    char prof[64] = "";
    if (r->profile != NULL)
        snprintf(prof, sizeof(prof), "  profile %s\n", r->profile);
    snprintf(out, cap,
             "listen l {\n  protocol resp\n%s  bind 127.0.0.1:1\n  upstream 127.0.0.1:2\n}\n%s",
             prof, rules);
}

/* Rules on every job event and on commands that judge each one and fault none (the Nth of a
 * million never comes): the modules classify every command and reply, the rules decide. */
static const char judged_not_faulted[] =
    "rule p on l {\n  when publish\n  nth 1000000\n  do drop\n}\n"
    "rule d on l {\n  when deliver\n  nth 1000000\n  do drop\n}\n";
static const char acks_judged[] = "rule a on l {\n  when ack\n  nth 1000000\n  do drop\n}\n";

/* The rules that judge every job event of r's profile (Sidekiq's basic fetch has no ack). */
static void judged_rules(char *out, size_t cap, const struct recording *r)
{
    bool acks = strcmp(r->profile, "sidekiq") != 0;
    snprintf(out, cap, "%s%s", judged_not_faulted, acks ? acks_judged : "");
}
static const char commands_judged[] =
    "rule c on l {\n  when command\n  nth 1000000\n  do close before\n}\n";

static void pass_unchanged(const struct recording *r, const char *rules, enum feeding how)
{
    char text[1024];
    listener_text(text, sizeof(text), r, rules);
    struct exchange x;
    exchange_load(&x, r->client, r->server);
    struct fake_session fs;
    fake_session_init(&fs, text);
    assert_true(fake_session_open(&fs));
    replay(&fs, &x, how);
    char what[256];
    snprintf(what, sizeof(what), "%s (%s, feeding %d)", r->client,
             r->profile != NULL ? r->profile : "plain", (int)how);
    assert_false(fs.port.closed);
    fake_port_expect(&fs.port, SIDE_UPSTREAM, x.side[SIDE_CLIENT], x.len[SIDE_CLIENT], what);
    fake_port_expect(&fs.port, SIDE_CLIENT, x.side[SIDE_UPSTREAM], x.len[SIDE_UPSTREAM], what);
    fake_session_free(&fs);
    exchange_free(&x);
}

static void test_recordings_unchanged(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(recordings) / sizeof(recordings[0]); i++) {
        const struct recording *r = &recordings[i];
        pass_unchanged(r, "", BY_MESSAGE);
        pass_unchanged(r, "", PIPELINED);
        if (strstr(r->client, "big") == NULL)
            pass_unchanged(r, "", BY_BYTE);
    }
}

static void test_recordings_judged_unchanged(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(recordings) / sizeof(recordings[0]); i++) {
        const struct recording *r = &recordings[i];
        char rules[512];
        if (r->profile != NULL) {
            judged_rules(rules, sizeof(rules), r);
            pass_unchanged(r, rules, BY_MESSAGE);
        }
        pass_unchanged(r, commands_judged, BY_MESSAGE);
    }
}

/* ---- faults on commands ---- */

static const char set_a[] = "*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n";
static const char set_boom[] = "*3\r\n$3\r\nSET\r\n$4\r\nboom\r\n$1\r\n2\r\n";
static const char get_a[] = "*2\r\n$3\r\nGET\r\n$1\r\na\r\n";

static const char plain[] = "listen l {\n  protocol resp\n  bind 127.0.0.1:1\n"
                            "  upstream 127.0.0.1:2\n}\n";

static void faulted_open(struct fake_session *fs, const char *action)
{
    char text[512];
    snprintf(text, sizeof(text),
             "%srule f on l {\n  when command command=SET key=boom\n  do %s\n}\n", plain, action);
    fake_session_init(fs, text);
    assert_true(fake_session_open(fs));
}

/* SET a, SET boom, GET a in one read; Redis answers what reaches it. */
static void three_commands(struct fake_session *fs)
{
    char b[256];
    int n = snprintf(b, sizeof(b), "%s%s%s", set_a, set_boom, get_a);
    fake_feed(fs, SIDE_CLIENT, b, (size_t)n);
}

static void test_error_answers_in_place(void **state)
{
    (void)state;
    struct fake_session fs;
    faulted_open(&fs, "error READONLY");
    three_commands(&fs);
    char *up = fake_port_take(&fs.port, SIDE_UPSTREAM, NULL);
    char want[256];
    snprintf(want, sizeof(want), "%s%s", set_a, get_a);
    assert_string_equal(up, want); /* Redis never got SET boom */
    __real_free(up);
    fake_feed(&fs, SIDE_UPSTREAM, "+OK\r\n$1\r\n1\r\n", 12);
    char *down = fake_port_take(&fs.port, SIDE_CLIENT, NULL);
    /* the error in SET boom's place, between the two replies of Redis */
    assert_true(strncmp(down, "+OK\r\n-READONLY ", 15) == 0);
    assert_non_null(strstr(down, "\r\n$1\r\n1\r\n"));
    assert_false(fs.port.closed);
    __real_free(down);
    fake_session_free(&fs);
}

static void test_close_before_cuts_with_earlier_replies(void **state)
{
    (void)state;
    struct fake_session fs;
    faulted_open(&fs, "close before");
    three_commands(&fs);
    char *up = fake_port_take(&fs.port, SIDE_UPSTREAM, NULL);
    assert_string_equal(up, set_a); /* SET boom and what follows never reach Redis */
    __real_free(up);
    assert_false(fs.port.closed); /* SET a's reply is still owed */
    fake_feed(&fs, SIDE_UPSTREAM, "+OK\r\n", 5);
    char *down = fake_port_take(&fs.port, SIDE_CLIENT, NULL);
    assert_string_equal(down, "+OK\r\n"); /* then the cut */
    __real_free(down);
    assert_true(fs.port.closed);
    assert_int_equal(fs.port.reason, SESSION_CLOSE_FAULT);
    fake_session_free(&fs);
}

static void test_close_after_lets_the_reply_through(void **state)
{
    (void)state;
    struct fake_session fs;
    faulted_open(&fs, "close after");
    three_commands(&fs);
    char *up = fake_port_take(&fs.port, SIDE_UPSTREAM, NULL);
    char want[256];
    snprintf(want, sizeof(want), "%s%s", set_a, set_boom);
    assert_string_equal(up, want); /* SET boom reaches Redis; GET a does not */
    __real_free(up);
    assert_false(fs.port.closed); /* not before SET boom's reply */
    fake_feed(&fs, SIDE_UPSTREAM, "+OK\r\n+OK\r\n", 10);
    char *down = fake_port_take(&fs.port, SIDE_CLIENT, NULL);
    assert_string_equal(down, "+OK\r\n+OK\r\n");
    __real_free(down);
    assert_true(fs.port.closed);
    assert_int_equal(fs.port.reason, SESSION_CLOSE_FAULT);
    fake_session_free(&fs);
}

/* ---- out of memory ---- */

/* got, what side `to` received, is whole messages of that side's protocol. */
static void whole_messages(const char *got, size_t n, enum session_side to)
{
    struct resp_scanner sc;
    resp_scanner_init(&sc, to == SIDE_CLIENT ? RESP_SIDE_SERVER : RESP_SIDE_CLIENT);
    size_t off = 0;
    while (off < n) {
        struct resp_msg m;
        int rc = resp_scan(&sc, (const uint8_t *)got + off, n - off, &m);
        if (rc != 1)
            fail_msg("the %s received part of a message (%zu bytes whole of %zu)",
                     to == SIDE_CLIENT ? "client" : "server", off, n);
        off += m.len;
    }
}

static const char *oom_text;
static const struct recording *oom_rec;
static unsigned oom_stopped;

/* After a run with an allocation failing: the session went on unharmed, or ended at once with
 * the reason; either way each side received whole messages only. */
static void oom_check(struct fake_session *fs)
{
    for (int to = 0; to < 2; to++) {
        size_t n;
        char *got = fake_port_take(&fs->port, (enum session_side)to, &n);
        whole_messages(got, n, (enum session_side)to);
        __real_free(got);
    }
    if (fs->port.closed && fs->port.reason == SESSION_CLOSE_INTERNAL_ERROR) {
        assert_true(kit_failed());
        assert_int_equal(fs->port.flush_to, -1);
        oom_stopped++;
    }
}

static void oom_faults(void)
{
    struct fake_session fs;
    fake_session_init(&fs, oom_text);
    if (fake_session_open(&fs)) {
        three_commands(&fs);
        fake_feed(&fs, SIDE_UPSTREAM, "+OK\r\n+OK\r\n$1\r\n1\r\n", 17);
        oom_check(&fs);
    }
    fake_session_free(&fs);
}

static void test_every_allocation_fails_on_faults(void **state)
{
    (void)state;
    static char text[3][512];
    const char *actions[] = {"error READONLY", "close before", "close after"};
    oom_stopped = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(text[i], sizeof(text[i]),
                 "%srule f on l {\n  when command command=SET key=boom\n  do %s\n}\n", plain,
                 actions[i]);
        oom_text = text[i];
        kit_every_allocation_fails(oom_faults);
    }
    assert_true(oom_stopped > 0);
}

static void oom_recording(void)
{
    struct exchange x;
    bool armed = fake_port_unarmed();
    exchange_load(&x, oom_rec->client, oom_rec->server);
    kit_alloc.armed = armed;
    struct fake_session fs;
    fake_session_init(&fs, oom_text);
    if (fake_session_open(&fs)) {
        replay(&fs, &x, BY_MESSAGE);
        oom_check(&fs);
    }
    fake_session_free(&fs);
    exchange_free(&x);
}

static void test_every_allocation_fails_on_each_profile(void **state)
{
    (void)state;
    static char text[2048];
    oom_stopped = 0;
    const char *done[8] = {0};
    size_t n_done = 0;
    for (size_t i = 0; i < sizeof(recordings) / sizeof(recordings[0]); i++) {
        const struct recording *r = &recordings[i];
        bool seen = false;
        for (size_t k = 0; k < n_done; k++)
            seen = seen || (done[k] == NULL ? r->profile == NULL
                                            : r->profile != NULL && !strcmp(done[k], r->profile));
        if (seen || strstr(r->client, "big") != NULL)
            continue; /* one session per profile: each run is quadratic in its allocations */
        done[n_done++] = r->profile;
        char rules[512];
        if (r->profile != NULL)
            judged_rules(rules, sizeof(rules), r);
        listener_text(text, sizeof(text), r, r->profile != NULL ? rules : commands_judged);
        oom_text = text;
        oom_rec = r;
        struct kit_scenario sc = {oom_recording};
        long n = kit_each_allocation_fails(&kit_wrap_hook, kit_scenario_run, &sc);
        printf("%s: %ld allocations, each failed in turn\n",
               r->profile != NULL ? r->profile : "plain", n);
        assert_true(n > 5);
    }
    assert_int_equal(n_done, 7);
    assert_true(oom_stopped > 0);
}

/* Faults that fire on each profile's job events, each with every allocation failing in turn.
 * The recorded server did not see them (its later replies answer the session as it was): a
 * session may end for that, never with part of a message sent or memory lost. */
static void test_every_allocation_fails_on_profile_faults(void **state)
{
    (void)state;
    static const char *const faults[] = {
        "rule f on l {\n  when publish\n  do drop\n}\n",
        "rule f on l {\n  when publish\n  do delay 1s\n}\n",
        "rule f on l {\n  when deliver\n  do close before\n}\n",
        "rule f on l {\n  when deliver\n  do close after\n}\n",
        "rule f on l {\n  when ack\n  do drop\n}\n",
        "rule f on l {\n  when ack\n  do close before\n}\n",
    };
    static char text[2048];
    size_t runs = 0;
    for (size_t i = 0; i < sizeof(recordings) / sizeof(recordings[0]); i++) {
        const struct recording *r = &recordings[i];
        if (r->profile == NULL)
            continue;
        for (size_t k = 0; k < sizeof(faults) / sizeof(faults[0]); k++) {
            if (strstr(faults[k], "when ack") != NULL && !strcmp(r->profile, "sidekiq"))
                continue; /* no ack event */
            listener_text(text, sizeof(text), r, faults[k]);
            oom_text = text;
            oom_rec = r;
            struct kit_scenario sc = {oom_recording};
            runs += (size_t)kit_each_allocation_fails(&kit_wrap_hook, kit_scenario_run, &sc);
        }
    }
    printf("profile faults: %zu allocations failed in turn\n", runs);
}

int main(void)
{
    kit_libevent_counted();
    log_set_level(LOG_ERROR); /* a fault's line per run of the failing allocator otherwise */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recordings_unchanged),
        cmocka_unit_test(test_recordings_judged_unchanged),
        cmocka_unit_test(test_error_answers_in_place),
        cmocka_unit_test(test_close_before_cuts_with_earlier_replies),
        cmocka_unit_test(test_close_after_lets_the_reply_through),
        cmocka_unit_test(test_every_allocation_fails_on_faults),
        cmocka_unit_test(test_every_allocation_fails_on_each_profile),
        cmocka_unit_test(test_every_allocation_fails_on_profile_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
