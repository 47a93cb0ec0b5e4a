/*
 * fake_session.h - a codec (RESP, AMQP) driven with no socket: a session of the first listener
 * of a configuration text, with that text's rules, on a loop of its own with no thread, whose
 * pump reaches a fake port (fake_pump.h).  A test feeds what each side sends (fake_feed) and
 * reads what each side received (fake_port_take on fs->port), and whether the session ended
 * and why.  The loop's event base runs only when the test asks (fake_run_timers), so a timer
 * the codec arms fires at the test's turn.
 *
 * What the session needs of a proxy (its journal, its statistics, twice's own Redis
 * connections) is absent: rules that need twice's own connection (a requeue on Redis) are not
 * for this kit.
 *
 * Header-only: include it after <cmocka.h>, before golden.h and text.h.
 */
#ifndef TWICE_KIT_FAKE_SESSION_H
#define TWICE_KIT_FAKE_SESSION_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdbool.h>
#include <string.h>

#include "proxy/core/proxy.h"
#include "proxy/net/codec.h"
#include "proxy/net/session.h"
#include "proxy/resp/idmap.h"
#include "rules/conf.h"
#include "rules/engine.h"
#include "tests/lib/fake_pump.h"

struct fake_session {
    struct conf *conf;
    struct conf_ref ref;
    struct lconf lc;
    struct proxy px;
    struct loop lp;
    struct session s;
    struct fake_port port;
    bool open; /* the codec opened */
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

/* The configuration, loop and session, made before any failure is armed (they are the test's,
 * not the codec's). */
static void fake_session_init(struct fake_session *fs, const char *conf_text)
{
    memset(fs, 0, sizeof(*fs));
    bool armed = fake_port_unarmed();
    struct conf_diags d;
    conf_diags_init(&d);
    int rc = conf_parse_string("fake.conf", conf_text, strlen(conf_text), &fs->conf, &d);
    if (rc != 0)
        conf_diags_print(&d, stderr);
    conf_diags_free(&d);
    assert_int_equal(rc, 0);
    assert_true(fs->conf->n_listeners > 0);
    fs->ref.conf = fs->conf;
    fs->lc.root = &fs->ref;
    fs->lc.l = &fs->conf->listeners[0];
    fs->lp.px = &fs->px;
    fs->lp.base = event_base_new();
    assert_non_null(fs->lp.base);
    fs->lp.rules = ruleset_new(fs->conf->rules, 1, 0);
    assert_non_null(fs->lp.rules);
    fs->lp.rules_gen = 1;
    fs->s.id = 1;
    fs->s.loop = &fs->lp;
    fs->s.px = &fs->px;
    fs->s.cfg = &fs->lc;
    fs->s.state = SESSION_RELAYING;
    fs->s.codec = codec_for(fs->lc.l);
    assert_non_null(fs->s.codec);
    fake_port_init(&fs->port, &fs->s);
    fs->s.port = &fake_pump_port;
    fs->s.port_ctx = &fs->port;
    kit_alloc.armed = armed;
}

/* Opens the codec, as session_accept() does; false when it could not (out of memory: the
 * session would be refused). */
static bool fake_session_open(struct fake_session *fs)
{
    fs->s.codec_state = fs->s.codec->open(&fs->s);
    fs->open = fs->s.codec_state != NULL;
    return fs->open;
}

/* Side `from` sent len bytes: one read, processed by the codec, as session_io.c hands it.
 * What the codec leaves in the read buffer stays there for the next read (the session's
 * input buffer of that side). */
static struct evbuffer *fake_input[2];

static void fake_feed(struct fake_session *fs, enum session_side from, const void *b, size_t len)
{
    if (fs->s.state != SESSION_RELAYING)
        return;                       /* a closed session reads nothing */
    bool armed = fake_port_unarmed(); /* the session's read: not the codec's to fail */
    if (fake_input[from] == NULL)
        fake_input[from] = evbuffer_new();
    assert_non_null(fake_input[from]);
    assert_int_equal(evbuffer_add(fake_input[from], b, len), 0);
    kit_alloc.armed = armed;
    fs->s.codec->process(fs->s.codec_state, from, fake_input[from]);
}

/* Runs the timers that are due (none waits). */
static void fake_run_timers(struct fake_session *fs)
{
    (void)event_base_loop(fs->lp.base, EVLOOP_NONBLOCK);
}

/* Closes the codec (as session_close() would) and frees everything, the process's memo of
 * message ids included (a next run starts as a fresh process would). */
static void fake_session_free(struct fake_session *fs)
{
    if (fs->open) {
        fs->s.codec->stop(fs->s.codec_state);
        fs->s.codec->free(fs->s.codec_state);
    }
    for (int i = 0; i < 2; i++) {
        if (fake_input[i] != NULL)
            evbuffer_free(fake_input[i]);
        fake_input[i] = NULL;
    }
    ruleset_put(fs->lp.rules);
    event_base_free(fs->lp.base);
    idmap_clear(); /* what RESP sessions share across connections (ids and their tasks) */
    fake_port_free(&fs->port);
    conf_free(fs->conf);
}

#pragma GCC diagnostic pop

#endif
