/*
 * codec.c - which protocol layer a listener's sessions use.
 */
#include "proxy/net/codec.h"

#include <stdio.h>

#include "proxy/core/log.h"
#include "proxy/net/fault.h"

const struct codec_ops *codec_for(const struct conf_listener *l)
{
    switch (l->protocol) {
    case CONF_PROTO_AMQP:
        return &amqp_codec_ops;
    case CONF_PROTO_RESP:
        return &resp_codec_ops;
    case CONF_PROTO_TCP:
    default:
        return NULL;
    }
}

/* The events the listener's rules look at, after a reload swapped them (codec_wants). */
uint32_t codec_wanted_now(struct session *s)
{
    const struct ruleset *rs = s->loop->rules;
    s->rules_gen = s->loop->rules_gen;
    s->wanted = rs != NULL ? ruleset_events(rs, s->cfg->l->name) : 0;
    return s->wanted;
}

static size_t decide_up_to(struct session *s, const struct engine_event *ev, size_t *hits,
                           size_t max, bool note)
{
    struct loop *lp = s->loop;
    session_count_events(s, ev->event, 1);
    if (lp->rules == NULL)
        return 0;
    size_t n = ruleset_decide(lp->rules, s->cfg->l->name, ev, proxy_now_ms(), hits, max);
    for (size_t i = 0; note && i < n; i++) {
        const struct rule *r = ruleset_rule(lp->rules, hits[i]);
        if (r->action.kind != RULE_ACT_EXPIRE)
            fault_note(s, r, ev);
    }
    return n;
}

size_t codec_decide(struct session *s, const struct engine_event *ev, size_t *hits)
{
    return decide_up_to(s, ev, hits, SESSION_MAX_RULE_HITS, true);
}

size_t codec_decide_unnoted(struct session *s, const struct engine_event *ev, size_t *hits)
{
    return decide_up_to(s, ev, hits, SESSION_MAX_RULE_HITS, false);
}

void codec_log_protocol_error(struct session *s, const char *msg, const char *detail)
{
    char what[48];
    snprintf(what, sizeof(what), "%s protocol error", s->codec->name);
    struct log_line line;
    log_begin(&line, LOG_WARN, what);
    log_u64(&line, "sid", s->id);
    log_str(&line, "listener", s->cfg->l->name);
    log_str(&line, "error", msg);
    if (detail != NULL)
        log_str(&line, "detail", detail);
    log_end(&line);
    session_set_error(s, "%s: %s", s->codec->name, msg);
}

const char *codec_anon_id(char *buf, size_t cap, const char *prefix, const uint64_t *v, size_t n)
{
    if (cap == 0)
        return buf;
    size_t at = 0;
    for (const char *c = prefix; *c != '\0' && at + 1 < cap; c++)
        buf[at++] = *c;
    for (size_t i = 0; i < n; i++) {
        char digits[20];
        size_t k = 0;
        uint64_t x = v[i];
        do {
            digits[k++] = (char)('0' + x % 10);
            x /= 10;
        } while (x != 0);
        if (at + 1 < cap)
            buf[at++] = ':';
        while (k > 0 && at + 1 < cap)
            buf[at++] = digits[--k];
    }
    buf[at] = '\0';
    return buf;
}

/* A shared head was written (or `out` freed): the split chain it lies in
 * may go. */
static void codec_unpin(const void *data, size_t len, void *pin)
{
    (void)data;
    (void)len;
    evbuffer_free(pin);
}

/* The n bytes at the head of `in` end inside its first chain, which begins
 * at p: the head goes to `out` as a reference to p, and `pin` holds
 * libevent's references to every chain of `in`, which keep the memory (and
 * make the chains immutable: nothing is written where `out` reads) until
 * codec_unpin frees it. */
static int share_head(struct evbuffer *in, struct evbuffer *out, const void *p, size_t n)
{
    struct evbuffer *pin = evbuffer_new();
    if (pin == NULL)
        return -1;
    /* libevent stops referencing chains when memory runs out without
     * saying so: the lengths tell */
    if (evbuffer_add_buffer_reference(pin, in) != 0 ||
        evbuffer_get_length(pin) != evbuffer_get_length(in) ||
        evbuffer_add_reference(out, p, n, codec_unpin, pin) != 0) {
        evbuffer_free(pin);
        return -1;
    }
    (void)evbuffer_drain(in, n); /* fails only on a frozen head: never an input's */
    return 0;
}

/* A split chain's head of `head` bytes, `rest` bytes staying in `in`: shared
 * rather than copied (see codec.h). */
static bool worth_sharing(size_t head, size_t rest)
{
    return head > CODEC_MOVE_COPY_MAX && head >= rest;
}

/* evbuffer_remove_buffer's move: whole chains, the split one's part copied.  libevent (2.1)
 * does not check the copy's evbuffer_add(): when its allocation fails, the part is drained
 * from `in` and counted as moved.  What `out` gained tells. */
static int move_copying(struct evbuffer *in, struct evbuffer *out, size_t n)
{
    size_t had = evbuffer_get_length(out);
    if (evbuffer_remove_buffer(in, out, n) != (int)n)
        return -1;
    return evbuffer_get_length(out) - had == n ? 0 : -1;
}

int codec_move(struct evbuffer *in, struct evbuffer *out, size_t n)
{
    size_t len = evbuffer_get_length(in);
    if (n > len)
        return -1;
    if (n == len) /* all of it: whole chains */
        return evbuffer_add_buffer(out, in);
    /* What stays in `in` is pinned with a shared head: no more than the head
     * (bytes a rule then drops stay allocated until the head is written). */
    size_t rest = len - n;
    /* The usual case: the bytes end in the first chain. */
    size_t first = evbuffer_get_contiguous_space(in);
    if (n <= first) {
        if (n == first || !worth_sharing(n, rest))
            return move_copying(in, out, n);
        const void *p = evbuffer_pullup(in, (ev_ssize_t)n); /* in place: n <= first */
        if (p != NULL && share_head(in, out, p, n) == 0)
            return 0;
        return move_copying(in, out, n);
    }
    while (n > 0) {
        /* The chains the n bytes lie in, up to 16 at a time: the whole
         * ones move as chains; the last one may be split. */
        struct evbuffer_iovec v[16];
        int k = evbuffer_peek(in, (ev_ssize_t)n, NULL, v, 16);
        if (k <= 0)
            return -1;
        size_t whole = 0;
        int i = 0;
        for (; i < k && i < 16 && v[i].iov_len <= n - whole; i++)
            whole += v[i].iov_len;
        if (i < k && i < 16 && worth_sharing(n - whole, rest)) {
            /* v[i] is split: the chains before it move, its head is
             * shared (its memory stays where it is) */
            if (whole > 0 && move_copying(in, out, whole) != 0)
                return -1;
            n -= whole;
            if (share_head(in, out, v[i].iov_base, n) == 0)
                return 0;
            whole = 0; /* out of memory: copied after all */
        }
        if (i == k || i < 16 || whole == 0)
            return move_copying(in, out, n);
        /* more than 16 chains: the first 16 move, then look again */
        if (move_copying(in, out, whole) != 0)
            return -1;
        n -= whole;
    }
    return 0;
}

void codec_event_identity(struct engine_event *ev, char *buf, size_t cap, const uint64_t *v,
                          size_t n)
{
    if (ev->message_id != NULL) {
        ev->identity = ev->message_id;
        return;
    }
    ev->anonymous = true;
    ev->identity = codec_anon_id(buf, cap, "anon", v, n);
}
