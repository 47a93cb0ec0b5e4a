/*
 * test_session_state.c - a session's state moves only as session.h's diagram draws:
 * session_set_state() takes every drawn move and refuses every other one (the state stays;
 * an assertion fails in a debug build, the call returns false in a release build).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proxy/core/proxy.h"
#include "proxy/net/session.h"
#include "rules/conf.h"

#define N_STATES (SESSION_CLOSED + 1)

/* The diagram of session.h, drawn again: legal[from][to]. */
static const bool legal[N_STATES][N_STATES] = {
    [SESSION_RESOLVING] = {[SESSION_CONNECTING] = true, [SESSION_CLOSED] = true},
    [SESSION_CONNECTING] = {[SESSION_RELAYING] = true, [SESSION_CLOSED] = true},
    [SESSION_RELAYING] = {[SESSION_DRAINING] = true, [SESSION_CLOSED] = true},
    [SESSION_DRAINING] = {[SESSION_CLOSED] = true},
};

static struct conf_listener cl = {.name = (char *)"l1"};
static struct lconf cfg = {.l = &cl};

static void session_in(struct session *s, enum session_state st)
{
    memset(s, 0, sizeof(*s));
    s->id = 7;
    s->cfg = &cfg;
    s->state = st;
}

static void test_drawn_moves_are_taken(void **state)
{
    (void)state;
    for (int from = 0; from < N_STATES; from++) {
        for (int to = 0; to < N_STATES; to++) {
            if (!legal[from][to])
                continue;
            struct session s;
            session_in(&s, (enum session_state)from);
            assert_true(session_set_state(&s, (enum session_state)to));
            assert_int_equal(s.state, to);
        }
    }
}

/* A life from accept to close, the longest there is. */
static void test_whole_life(void **state)
{
    (void)state;
    struct session s;
    session_in(&s, SESSION_RESOLVING);
    const enum session_state life[] = {SESSION_CONNECTING, SESSION_RELAYING, SESSION_DRAINING,
                                       SESSION_CLOSED};
    for (size_t i = 0; i < sizeof(life) / sizeof(life[0]); i++)
        assert_true(session_set_state(&s, life[i]));
    assert_int_equal(s.state, SESSION_CLOSED);
}

/* Each move not drawn, in a child: it aborts (assertions on), or is refused and leaves the
 * state as it was (assertions off). */
static void test_other_moves_are_refused(void **state)
{
    (void)state;
    int refused = 0;
    for (int from = 0; from < N_STATES; from++) {
        for (int to = 0; to < N_STATES; to++) {
            if (legal[from][to])
                continue;
            fflush(NULL);
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                struct session s;
                session_in(&s, (enum session_state)from);
                bool ok = session_set_state(&s, (enum session_state)to);
                _exit(!ok && s.state == (enum session_state)from ? 42 : 1);
            }
            int status = 0;
            assert_int_equal(waitpid(pid, &status, 0), pid);
#ifdef NDEBUG
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 42);
#else
            assert_true(WIFSIGNALED(status));
            assert_int_equal(WTERMSIG(status), SIGABRT);
#endif
            refused++;
        }
    }
    /* 25 pairs, 7 drawn: CLOSED goes nowhere, nothing goes back or skips ahead. */
    assert_int_equal(refused, N_STATES * N_STATES - 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drawn_moves_are_taken),
        cmocka_unit_test(test_whole_life),
        cmocka_unit_test(test_other_moves_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
