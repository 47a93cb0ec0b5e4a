/*
 * fuzz_resp.c - libFuzzer harness for the RESP codec (proto/resp*.c).  Not part of the default
 * build (scripts/fuzz.sh builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. proto/resp*.c tests/fuzz/fuzz_resp.c \
 *         -ljansson -o fuzz_resp
 *     ./fuzz_resp -max_total_time=60 CORPUS_DIR
 *
 * The seeds (tests/fuzz/corpus/resp/) are the captured streams tests/unit/data/resp/ *.bin (the
 * big ones cut to 8 KiB), each prefixed with one mode byte (a few with lowered limits).  The
 * mode byte picks the side (client or server), lowered limits, and a split point; the rest is
 * scanned as a stream of messages twice, whole and in two pieces (whole messages may take the
 * scanner's one-pass fast path, pieces its state machine: the two must agree view by view),
 * and every message goes through
 * the iterator, the view helpers and a pairing.  Invariants are checked with abort():
 * views stay inside their message, the iterator agrees with the scanner's views and walks exactly
 * nelem elements, a split input gives the same messages and the same error as a whole one, and
 * resp_walk() over every message (and the prefix before a split) says "whole" only with the
 * scan's length, and gives a lower bound of it while the message is cut short.
 * With a mode byte whose low two bits are 0, the input is also a conversation (commands from the
 * first half, replies from the second, in turns the mode's bits give) fed to a reference pairing
 * that takes no shortcut and to one that does: they must match every reply alike.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/resp/resp.h"

#define MAX_MSGS 256

static void check(bool ok)
{
    if (!ok)
        abort();
}

static bool inside(const struct resp_view *v, size_t len)
{
    return v->off <= len && v->len <= len - v->off;
}

static void check_views(const uint8_t *p, const struct resp_msg *m)
{
    struct resp_args it;
    struct resp_view v;
    uint64_t k = 0;
    uint8_t tmp[16];
    int64_t num;
    check(inside(&m->value, m->len));
    resp_args_init(&it, p, m);
    int rc;
    while ((rc = resp_args_next(&it, &v)) == 1) {
        check(inside(&v, m->len));
        if (k < RESP_MSG_VIEWS) {
            const struct resp_view *e = &m->elem[k];
            check(e->off == v.off && e->len == v.len && e->type == v.type && e->count == v.count &&
                  e->null == v.null && e->quoted == v.quoted);
        }
        check(resp_view_copy(p, m->len, &v, tmp, sizeof(tmp)) >= 0);
        (void)!resp_view_int(p, m->len, &v, &num);
        (void)resp_view_equals(p, m->len, &v, "subscribe");
        k++;
    }
    check(rc == 0 && k == m->nelem);
}

/* What resp_walk() says of the message at buf[off..) with `held` bytes of the stream here
 * agrees with resp_scan()'s m (a whole message of the stream, or NULL when the scan needed more
 * or failed): whole only with the scan's length (and a command's name where its first element
 * is), a lower bound of it while waiting. */
static void check_walk(const struct resp_scanner *proto, const uint8_t *buf, size_t off,
                       size_t held, const struct resp_msg *m)
{
    struct resp_flat f = {buf, held};
    struct resp_walk w;
    if (held <= off)
        return;
    int r = resp_walk(proto, resp_flat_peek, &f, off, held, &w);
    if (r == RESP_WALK_WHOLE) {
        check(m != NULL && w.len == m->len && w.type == m->type && w.nelem == m->nelem &&
              !m->push && !m->attribute);
        check(proto->side == RESP_SIDE_SERVER ||
              (w.name_off == m->elem[0].off && w.name_len == m->elem[0].len));
    } else if (r == RESP_WALK_WAIT) {
        check(w.len > held - off && (m == NULL || w.len <= m->len));
    }
}

struct run {
    size_t n;
    size_t lens[MAX_MSGS];
    uint64_t digests[MAX_MSGS];
    int rc;
};

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

static uint64_t view_digest(uint64_t h, const struct resp_view *v)
{
    h = mix(h, v->off);
    h = mix(h, v->len);
    h = mix(h, v->count);
    h = mix(h, v->type);
    h = mix(h, v->null);
    return mix(h, v->quoted);
}

/* Everything a caller may read of a message, so that a whole input (which resp_scan() may take
 * by its one-pass fast path) and a split one (its state machine) are compared view by view. */
static uint64_t msg_digest(const struct resp_msg *m)
{
    uint64_t h = mix(0, m->len);
    h = mix(h, m->type);
    h = mix(h, m->push);
    h = mix(h, m->attribute);
    h = mix(h, m->null);
    h = mix(h, m->inline_cmd);
    h = mix(h, m->body);
    h = mix(h, m->nelem);
    h = view_digest(h, &m->value);
    for (uint64_t i = 0; i < m->nelem && i < RESP_MSG_VIEWS; i++)
        h = view_digest(h, &m->elem[i]);
    return h;
}

/* The name as resp_cmd_name_copy() documents it, read the long way: the first element's
 * decoded bytes, cut, empty when they hold a NUL, upper-cased. */
static size_t ref_name(const uint8_t *buf, const struct resp_msg *m, char *name)
{
    uint8_t tmp[RESP_CMD_NAME_MAX];
    int n = m->nelem >= 1 ? resp_view_copy(buf, m->len, &m->elem[0], tmp, sizeof(tmp) - 1) : 0;
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof(tmp) - 1)
        n = (int)sizeof(tmp) - 1;
    if (memchr(tmp, '\0', (size_t)n) != NULL)
        n = 0;
    for (int i = 0; i < n; i++)
        name[i] = (char)(tmp[i] >= 'a' && tmp[i] <= 'z' ? tmp[i] - 'a' + 'A' : tmp[i]);
    name[n] = '\0';
    return (size_t)n;
}

/* Both entry points of the pairing see the same stream and must agree. */
static void pair_both(struct resp_pairing *pair, struct resp_pairing *named,
                      const struct resp_msg *m, const uint8_t *buf, uint64_t tag)
{
    struct resp_cmd c, d;
    char name[RESP_CMD_NAME_MAX];
    memset(&c, 0, sizeof(c));
    memset(&d, 0, sizeof(d));
    char ref[RESP_CMD_NAME_MAX];
    size_t n = resp_cmd_name_copy(buf, m, name); /* as the RESP session layer reads it */
    check(n == ref_name(buf, m, ref) && strcmp(name, ref) == 0);
    int rc = resp_pairing_command(pair, m, buf, tag, &c);
    int rd = resp_pairing_command_named(named, m, buf, name, tag, &d);
    check(rc == rd && strcmp(c.name, d.name) == 0 && c.flags == d.flags && c.replies == d.replies &&
          c.sub_kind == d.sub_kind && c.hello_proto == d.hello_proto && c.seq == d.seq &&
          c.tag == d.tag && c.answered == d.answered);
    /* A queued command always leaves a slot for the EXEC that ends its transaction. */
    check(pair->count <= pair->cap && pair->kept <= pair->count);
    check(rc != 1 || (c.flags & RESP_CMD_QUEUED) == 0 || pair->count < pair->cap);
}

/* Replies matched by the reference pairing and the one taking shortcuts must agree. */
static void reply_both(struct resp_pairing *pair, struct resp_pairing *named,
                       const struct resp_msg *m, const uint8_t *buf)
{
    struct resp_match mt, mn;
    int rc = resp_pairing_reply(pair, m, buf, &mt);
    uint8_t type = m->attribute ? '|' : m->push ? '>' : m->type;
    if ((m->len & 1) != 0 && resp_pairing_reply_simple(named, type) == 1) {
        /* the shortcut by the first byte alone, on every other reply */
        check(rc == 1 && mt.last && !mt.queued && !mt.exec_aborted && mt.ntx == 0);
    } else {
        check(resp_pairing_reply(named, m, buf, &mn) == rc);
        check(rc != 1 || (mt.last == mn.last && mt.queued == mn.queued &&
                          mt.exec_aborted == mn.exec_aborted && mt.ntx == mn.ntx &&
                          mt.cmd.seq == mn.cmd.seq && strcmp(mt.cmd.name, mn.cmd.name) == 0));
    }
    check(resp_pairing_pending(pair) == resp_pairing_pending(named));
    if (rc == 1 && mt.ntx > 0)
        check(resp_pairing_tx(pair, mt.ntx - 1) != NULL && resp_pairing_tx(pair, mt.ntx) == NULL);
}

static void scan_stream(const struct resp_scanner *proto, const uint8_t *buf, size_t len,
                        size_t split, struct run *r, struct resp_pairing *pair,
                        struct resp_pairing *named)
{
    struct resp_scanner sc = *proto;
    size_t off = 0;
    memset(r, 0, sizeof(*r));
    while (off < len && r->n < MAX_MSGS) {
        struct resp_msg m;
        int rc = 0;
        if (split > off)
            rc = resp_scan(&sc, buf + off, split - off, &m);
        if (rc == 0)
            rc = resp_scan(&sc, buf + off, len - off, &m);
        if (rc != 1) {
            r->rc = rc;
            check(rc <= 0 && (rc < 0 || m.len > len - off));
            check_walk(proto, buf, off, len, NULL);
            return;
        }
        if (split > off)
            check_walk(proto, buf, off, split, &m);
        check_walk(proto, buf, off, len, &m);
        check(m.len > 0 && m.len <= len - off);
        check_views(buf + off, &m);
        /* The shortcuts that measure a message agree with the scan whenever they answer. */
        struct resp_view name;
        uint8_t type;
        size_t n = resp_scan_command_len(proto, buf + off, len - off, &name);
        check(n == 0 || (n == m.len && m.nelem >= 1 && name.off == m.elem[0].off &&
                         name.len == m.elem[0].len && name.type == m.elem[0].type));
        n = resp_scan_reply_len(proto, buf + off, len - off, &type);
        check(n == 0 || (n == m.len && type == m.type && !m.push && !m.attribute));
        if (sc.side == RESP_SIDE_CLIENT) {
            pair_both(pair, named, &m, buf + off, off);
        } else {
            reply_both(pair, named, &m, buf + off);
        }
        r->digests[r->n] = msg_digest(&m);
        r->lens[r->n++] = m.len;
        off += m.len;
    }
}

/* The stream as a proxy passing long replies on reads it: pieces of `chunk` bytes, and after each
 * "need more" every byte resp_scan_releasable() allows dropped.  Lengths count the dropped bytes
 * of a message too; the type, once read, stays the whole message's. */
static void scan_released(const struct resp_scanner *proto, const uint8_t *buf, size_t len,
                          size_t chunk, struct run *r)
{
    struct resp_scanner sc = *proto;
    size_t start = 0, have = 0, dropped = 0;
    uint8_t type = 0;
    memset(r, 0, sizeof(*r));
    while (start < len && r->n < MAX_MSGS) {
        have = have + chunk < len ? have + chunk : len;
        while (start < have && r->n < MAX_MSGS) {
            struct resp_msg m;
            int rc = resp_scan(&sc, buf + start, have - start, &m);
            if (rc < 0) {
                r->rc = rc;
                return;
            }
            if (rc == 0) {
                size_t k = resp_scan_releasable(&sc, have - start);
                check(k <= have - start && (k == 0 || sc.side == RESP_SIDE_SERVER));
                check(type == 0 || type == m.type);
                type = m.type;
                resp_scan_release(&sc, k);
                start += k;
                dropped += k;
                if (have == len)
                    return;
                break;
            }
            check(type == 0 || type == m.type);
            r->lens[r->n++] = dropped + m.len;
            start += m.len;
            dropped = 0;
            type = 0;
        }
    }
}

/* A conversation: commands from the first half of buf, replies from the second, taken in the
 * turns the mode byte's bits give, through both pairings. */
static void converse(const uint8_t *buf, size_t len, uint8_t mode)
{
    size_t half = len / 2, co = 0, so = half;
    struct resp_scanner cs, ss;
    resp_scanner_init(&cs, RESP_SIDE_CLIENT);
    resp_scanner_init(&ss, RESP_SIDE_SERVER);
    struct resp_cmd slots[4], named_slots[4];
    struct resp_pairing pair, named;
    resp_pairing_init(&pair, slots, 4);
    pair.general = true;
    resp_pairing_init(&named, named_slots, 4);
    for (unsigned i = 0; i < 4 * MAX_MSGS && (co < half || so < len); i++) {
        struct resp_msg m;
        bool command = so >= len || (co < half && ((mode >> (i % 8)) & 1) != 0);
        if (command) {
            if (resp_scan(&cs, buf + co, half - co, &m) != 1) {
                co = half;
                continue;
            }
            pair_both(&pair, &named, &m, buf + co, co);
            co += m.len;
        } else {
            if (resp_scan(&ss, buf + so, len - so, &m) != 1) {
                so = len;
                continue;
            }
            reply_both(&pair, &named, &m, buf + so);
            so += m.len;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    const uint8_t *buf = data + 1;
    size_t len = size - 1;
    struct resp_scanner proto;
    resp_scanner_init(&proto, (mode & 1) ? RESP_SIDE_SERVER : RESP_SIDE_CLIENT);
    if (mode & 2) {
        proto.max_line = 1 + (mode >> 4);
        proto.max_bulk = mode >> 3;
        proto.max_elements = mode >> 5;
        proto.max_depth = mode >> 6;
        proto.max_inline = mode >> 2;
    }
    struct resp_cmd slots[4], named_slots[4];
    struct resp_pairing pair, named;
    resp_pairing_init(&pair, slots, 4);
    pair.general = true; /* the reference: no shortcut; named takes them */
    resp_pairing_init(&named, named_slots, 4);
    struct run whole, split;
    scan_stream(&proto, buf, len, 0, &whole, &pair, &named);
    scan_stream(&proto, buf, len, len > 0 ? (size_t)mode * 7919 % len : 0, &split, &pair, &named);
    check(whole.n == split.n && whole.rc == split.rc);
    for (size_t i = 0; i < whole.n; i++)
        check(whole.lens[i] == split.lens[i] && whole.digests[i] == split.digests[i]);
    struct run streamed;
    scan_released(&proto, buf, len, 1 + (size_t)(mode >> 2), &streamed);
    check(whole.n == streamed.n && whole.rc == streamed.rc);
    for (size_t i = 0; i < whole.n; i++)
        check(whole.lens[i] == streamed.lens[i]);
    if ((mode & 3) == 0)
        converse(buf, len, mode);
    return 0;
}
