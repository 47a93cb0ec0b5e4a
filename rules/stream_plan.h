/*
 * stream_plan.h - what a connection's stream and connect rules, and a Toxiproxy proxy's stream
 * toxics, do to its bytes: folded into one plan per direction when the connection opens (and
 * again when the toxics change), which proxy/net/shaper.c carries out.
 *
 * Pure: a rule or a toxic in, the plan changed in place.  Several faults on one direction add
 * up as they would one behind the other: latencies and jitters add, the lowest bandwidth and
 * the lowest limit win, the last slicer and slow-close count; a rule's connect faults (close
 * before or after, a delayed connect, a reset) go to struct conn_faults.
 */
#ifndef TWICE_RULES_STREAM_PLAN_H
#define TWICE_RULES_STREAM_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "rules/rule.h"
#include "rules/toxic_stream.h"

/* Index of a direction in a stream_fx pair: the bytes read from that side. */
enum { STREAM_FROM_CLIENT = 0, STREAM_FROM_UPSTREAM = 1 };

/* What happens to the bytes of one direction. */
struct stream_fx {
    uint32_t latency_ms;
    uint32_t jitter_ms;
    uint64_t rate_bps;    /* 0: unlimited */
    uint64_t slice_bytes; /* 0: no slicing */
    uint32_t slice_delay_ms;
    bool blackhole;
    bool has_limit;
    uint64_t limit_bytes;
    bool has_slow_close;
    uint32_t slow_close_ms;
    const char *limit_rule;   /* name of the rule behind `limit`, for the log */
    bool slice_halving;       /* Toxiproxy's slicer: pieces of each chunk by halving */
    uint32_t slice_variation; /* its size_variation */
    uint32_t slice_delay_us;  /* added to slice_delay_ms */
    bool bandwidth_hold;      /* hold every byte (Toxiproxy's rate 0) */
    bool has_timeout;         /* drop bytes; close after timeout_ms (0: never) */
    uint32_t timeout_ms;
    bool has_reset_peer; /* on the first bytes: drop, reset after reset_peer_ms */
    uint32_t reset_peer_ms;
    const char *toxic_rule; /* name of the toxic behind timeout or reset-peer, for the log */
};

/* Connection-level faults decided when the connection is accepted. */
struct conn_faults {
    bool close_before;         /* `when connect ... do close before` */
    bool close_after;          /* close once the upstream is connected */
    uint32_t delay_connect_ms; /* `when connect ... do delay D` */
    bool reset;                /* `do reset [after D]` */
    uint32_t reset_after_ms;
    const char *close_rule; /* rule names, for the close log */
    const char *reset_rule;
};

/* Whether `fx` does anything. */
bool stream_fx_active(const struct stream_fx *fx);

/* Folds rule r, which fired on a `stream` or `connect` event, into the plan of each direction
 * its `direction` names (fx, indexed by STREAM_FROM_*) and into the connection's faults.
 * Names point into r, which must outlive the plan. */
void stream_plan_add_rule(const struct rule *r, struct stream_fx fx[2], struct conn_faults *cf);

/* Folds a Toxiproxy stream toxic named `name` (PROXY.TOXIC, which must outlive the plan) into
 * the plan of the direction it acts on, with Toxiproxy's meaning of its attributes. */
void stream_plan_add_toxic(const struct toxic_stream *t, const char *name, struct stream_fx *f);

#endif
