/*
 * fuzz_amqp_plan.c - libFuzzer harness for the AMQP side's fault plans (proto/amqp/amqp_plan.c),
 * checked against the guarantees proto/amqp/amqp_plan.h writes.  Not part of the default build
 * (scripts/fuzz.sh builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_amqp_plan.c \
 *         proto/amqp/amqp_plan.c -o fuzz_amqp_plan
 *
 * The input is a list of events: a byte picks the event (a delivery, a publish, a settled
 * tag, a confirm, an expiry) and its facts, a byte how many faults fired, then three bytes a fault
 * (its kind, its time, its rule, a cut's side).  Invariants are checked with abort(): every rule a
 * plan names is one of the event's faults of the right kind; a cut before ends the plan (no
 * fault after it shows); an error drops the message and arms nothing; a dropped message is not
 * held and a held one for its longest delay; twice settles only a delivery the client acks,
 * and timers hang only on a delivery the ledger keeps; a settle plan's fallbacks never turn a
 * drop into a pass; an expiry does nothing to a delivery settled in time, and else requeues it
 * or closes its channel.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_plan.h"

#define CHECK(ok) check_at((ok), __LINE__, #ok)

static void check_at(bool ok, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, line, what);
        abort();
    }
}

#define FZ_MAX_FAULTS 8u

/* Rules: addresses in this array, so a plan's rule maps back to its fault. */
static const char rules[FZ_MAX_FAULTS];

static const enum job_fault_kind kinds[] = {
    JOB_FAULT_NONE,  JOB_FAULT_DROP,  JOB_FAULT_DELAY,  JOB_FAULT_REDELIVER, JOB_FAULT_DUPLICATE,
    JOB_FAULT_CLOSE, JOB_FAULT_ERROR, JOB_FAULT_EXPIRE, JOB_FAULT_OTHER,
};

/* The index of the fault rule r names in f[0..n) of kind k (its first), or -1. */
static int fault_of(const void *r, const struct job_fault *f, size_t n, enum job_fault_kind k)
{
    if (r == NULL)
        return -1;
    size_t i = (size_t)((const char *)r - rules);
    CHECK(i < n && f[i].kind == k);
    return (int)i;
}

/* The first fault in f[0..n) that ends a plan (a cut before; an error when `error`). */
static size_t end_of(const struct job_fault *f, size_t n, bool error)
{
    for (size_t i = 0; i < n; i++)
        if ((f[i].kind == JOB_FAULT_CLOSE && f[i].before) ||
            (error && f[i].kind == JOB_FAULT_ERROR))
            return i;
    return n;
}

static void check_content(const struct amqp_content_facts *k, const struct job_fault *f, size_t n)
{
    struct amqp_content_plan p = amqp_plan_content(k, f, n);
    size_t end = end_of(f, n, true);
    int i;
    if ((i = fault_of(p.cut_before, f, n, JOB_FAULT_CLOSE)) >= 0) {
        CHECK((size_t)i == end && f[i].before);
        CHECK(p.cut_from_broker == !k->publish);
    }
    if ((i = fault_of(p.error.rule, f, n, JOB_FAULT_ERROR)) >= 0) {
        CHECK((size_t)i == end && p.error.on && p.error.code == f[i].code);
        CHECK(p.fate == AMQP_FATE_DROP && !p.late && !p.expire && p.hold_ms == 0);
        CHECK(p.error.class_id == 60 && p.error.method_id == (k->method & 0xffff));
    }
    CHECK(p.error.on == (p.error.rule != NULL));
    if ((i = fault_of(p.cut_after, f, n, JOB_FAULT_CLOSE)) >= 0)
        CHECK((size_t)i < end && !f[i].before);
    bool drop = false, delay = false;
    uint32_t longest = 0;
    for (size_t j = 0; j < end; j++) {
        drop |= f[j].kind == JOB_FAULT_DROP;
        if (f[j].kind == JOB_FAULT_DELAY) {
            delay = true;
            longest = f[j].ms > longest ? f[j].ms : longest;
        }
    }
    if (p.cut_before == NULL && p.error.rule == NULL) {
        CHECK(p.fate == (drop ? AMQP_FATE_DROP : delay ? AMQP_FATE_HOLD : AMQP_FATE_FORWARD));
        if (p.fate == AMQP_FATE_HOLD) {
            CHECK(p.hold_ms == longest);
            (void)fault_of(p.hold_rule, f, n, JOB_FAULT_DELAY);
        }
    }
    if (p.fate != AMQP_FATE_HOLD)
        CHECK(p.hold_ms == 0 && p.hold_rule == NULL);
    if (p.settle != AMQP_NOW_NONE) {
        CHECK(!k->publish && k->ack_required);
        i = fault_of(p.settle_rule, f, n,
                     p.settle == AMQP_NOW_LOST ? JOB_FAULT_DROP : JOB_FAULT_DUPLICATE);
        CHECK(i >= 0 && (size_t)i < end);
    } else {
        CHECK(p.settle_rule == NULL);
    }
    if (p.late) {
        CHECK(!k->publish && k->ack_required && k->tracked && !k->hold_ack);
        i = fault_of(p.late_rule, f, n, JOB_FAULT_DUPLICATE);
        CHECK(i >= 0 && f[i].ms == p.late_ms && p.late_ms != 0);
    }
    if (p.expire) {
        CHECK(!k->publish && k->ack_required && k->tracked);
        CHECK(fault_of(p.expire_rule, f, n, JOB_FAULT_EXPIRE) >= 0);
    }
    CHECK(!(p.dup && p.dup_missing));
    if (p.dup || p.dup_missing) {
        CHECK(k->publish && p.dup == k->has_copy);
        CHECK(fault_of(p.dup_rule, f, n, JOB_FAULT_DUPLICATE) >= 0);
    }
}

static void check_settle(const struct amqp_settle_facts *k, const struct job_fault *f, size_t n)
{
    struct amqp_settle_after after = {0};
    struct amqp_settle_plan p = amqp_plan_settle(k, f, n, &after);
    size_t end = end_of(f, n, false);
    int i;
    /* An ack that waits for a late copy: held for it, nothing else, no rule asked. */
    CHECK(amqp_plan_settle_asks_rules(k) == !k->hold_ack);
    CHECK((p.by == AMQP_BY_COPY) == k->hold_ack);
    if (k->hold_ack)
        CHECK(p.verdict == AMQP_V_HOLD && !p.late && !p.hold && p.ack_rule == NULL &&
              p.cut_before == NULL && !after.error.on && after.cut_after == NULL &&
              amqp_plan_settle_verdict(&p, false, false) == AMQP_V_HOLD);
    if ((i = fault_of(p.cut_before, f, n, JOB_FAULT_CLOSE)) >= 0)
        CHECK((size_t)i == end);
    if (p.late) {
        CHECK(k->tracked && p.late_ms != 0);
        i = fault_of(p.late_rule, f, n, JOB_FAULT_REDELIVER);
        CHECK(i >= 0 && (size_t)i < end);
    }
    if (p.hold) {
        CHECK(k->tracked);
        CHECK(fault_of(p.hold_rule, f, n, JOB_FAULT_DELAY) >= 0);
    }
    if (p.ack_rule != NULL) {
        size_t a = (size_t)((const char *)p.ack_rule - rules);
        CHECK(a < end && (f[a].kind == JOB_FAULT_DROP || f[a].kind == JOB_FAULT_DELAY));
    }
    if ((i = fault_of(after.error.rule, f, n, JOB_FAULT_ERROR)) >= 0)
        CHECK((size_t)i < end && after.error.code == f[i].code);
    if ((i = fault_of(after.cut_after, f, n, JOB_FAULT_CLOSE)) >= 0)
        CHECK((size_t)i < end && !f[i].before);
    for (int late_ok = 0; late_ok < 2; late_ok++)
        for (int hold_ok = 0; hold_ok < 2; hold_ok++) {
            enum amqp_verdict v = amqp_plan_settle_verdict(&p, late_ok, hold_ok);
            if (p.verdict == AMQP_V_DROP)
                CHECK(v == AMQP_V_DROP);
            if (late_ok && hold_ok)
                CHECK(v == p.verdict);
            if (p.by == AMQP_BY_NONE)
                CHECK(v == AMQP_V_PASS);
        }
    if ((n == 0 || end == 0) && !k->hold_ack)
        CHECK(p.verdict == AMQP_V_PASS || p.cut_before != NULL);
}

static void check_confirm(const struct job_fault *f, size_t n)
{
    const void *after = NULL;
    struct amqp_confirm_plan p = amqp_plan_confirm(f, n, &after);
    size_t end = end_of(f, n, false);
    bool drop = false;
    for (size_t j = 0; j < end; j++)
        drop |= f[j].kind == JOB_FAULT_DROP;
    if (p.cut_before != NULL)
        CHECK(fault_of(p.cut_before, f, n, JOB_FAULT_CLOSE) == (int)end);
    CHECK(p.drop == drop);
    int i = fault_of(after, f, n, JOB_FAULT_CLOSE);
    CHECK(i < 0 || ((size_t)i < end && !f[i].before));
}

/* An expiry: nothing when settled in time; else its rule, a requeue or (a consumer timeout,
 * no expire rule) the channel's close with its text, never both. */
static void check_expiry(uint8_t ev, const struct job_fault *f, size_t n)
{
    struct amqp_expiry_facts k = {
        .settleable = (ev & 0x04) != 0,
        .expire_rule = n > 0 && (ev & 0x08) != 0 ? f[0].rule : NULL,
        .ack_rule = n > 1 && (ev & 0x10) != 0 ? f[1].rule : NULL,
        .consumer_timeout = (ev & 0x20) != 0,
        .channel = (uint16_t)(ev * 257u),
        .timeout_ms = (uint32_t)ev * 1000u,
    };
    struct amqp_expiry_plan p;
    amqp_plan_expiry(&k, &p);
    if (!k.settleable) {
        CHECK(p.cause == AMQP_EXPIRY_NONE && !p.requeue && !p.close_channel && p.rule == NULL);
        return;
    }
    CHECK(p.requeue != p.close_channel);
    CHECK(p.rule == (k.expire_rule != NULL ? k.expire_rule : k.ack_rule));
    CHECK(p.close_channel == (k.expire_rule == NULL && k.consumer_timeout));
    if (p.close_channel)
        CHECK(p.close_code == 406 && strlen(p.close_text) > 0 &&
              strlen(p.close_text) < sizeof(p.close_text));
    CHECK(amqp_expiry_name(p.cause)[0] != '\0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t content_methods[] = {AMQP_BASIC_DELIVER, AMQP_BASIC_GET_OK,
                                               AMQP_BASIC_PUBLISH};
    static const uint32_t settle_methods[] = {AMQP_BASIC_ACK, AMQP_BASIC_NACK, AMQP_BASIC_REJECT};
    size_t off = 0;
    while (off + 2 <= size) {
        uint8_t ev = data[off++];
        size_t n = data[off++] % (FZ_MAX_FAULTS + 1);
        struct job_fault f[FZ_MAX_FAULTS];
        size_t got = 0;
        for (; got < n && off + 3 <= size; got++, off += 3) {
            const uint8_t *b = data + off;
            f[got] = (struct job_fault){
                .kind = kinds[b[0] % (sizeof(kinds) / sizeof(kinds[0]))],
                .before = (b[0] & 0x80) != 0,
                .ms = (uint32_t)b[1] * (b[2] & 0x0f) * 37u,
                .code = (uint16_t)(300 + b[2]),
                .rule = &rules[got],
            };
            if (f[got].kind != JOB_FAULT_ERROR)
                f[got].code = 0;
            if (f[got].kind == JOB_FAULT_NONE)
                f[got].rule = NULL;
        }
        switch (ev % 4) {
        case 0: {
            uint32_t method = content_methods[(ev >> 2) % 3];
            struct amqp_content_facts k = {
                .publish = method == AMQP_BASIC_PUBLISH,
                .method = method,
                .ack_required = method != AMQP_BASIC_PUBLISH && (ev & 0x10) != 0,
                .tracked = method != AMQP_BASIC_PUBLISH && (ev & 0x30) == 0x30,
                .hold_ack = (ev & 0x40) != 0,
                .has_copy = method == AMQP_BASIC_PUBLISH && (ev & 0x80) != 0,
            };
            check_content(&k, f, got);
            break;
        }
        case 1: {
            struct amqp_settle_facts k = {.method = settle_methods[(ev >> 2) % 3],
                                          .tracked = (ev & 0x40) != 0,
                                          .hold_ack = (ev & 0xc0) == 0xc0};
            check_settle(&k, f, got);
            break;
        }
        case 2:
            check_confirm(f, got);
            break;
        default:
            check_expiry(ev, f, got);
            break;
        }
    }
    return 0;
}
