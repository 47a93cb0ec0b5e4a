/*
 * stream_plan.c - stream and connect rules, and stream toxics, folded into the plan of a
 * connection's bytes (rules/stream_plan.h).
 */
#include "rules/stream_plan.h"

bool stream_fx_active(const struct stream_fx *f)
{
    return f->latency_ms || f->jitter_ms || f->rate_bps || f->bandwidth_hold || f->slice_bytes ||
           f->blackhole || f->has_limit || f->has_slow_close || f->has_timeout || f->has_reset_peer;
}

static void add_stream_action(const struct rule *r, struct stream_fx *f)
{
    const struct rule_action *a = &r->action;
    switch (a->kind) {
    case RULE_ACT_LATENCY:
        f->latency_ms += a->duration_ms;
        f->jitter_ms += a->jitter_ms;
        break;
    case RULE_ACT_BANDWIDTH:
        if (f->rate_bps == 0 || a->bytes < f->rate_bps)
            f->rate_bps = a->bytes;
        break;
    case RULE_ACT_SLICE:
        f->slice_bytes = a->bytes;
        f->slice_delay_ms = a->slice_delay_ms;
        break;
    case RULE_ACT_BLACKHOLE:
        f->blackhole = true;
        break;
    case RULE_ACT_LIMIT:
        if (!f->has_limit || a->bytes < f->limit_bytes) {
            f->has_limit = true;
            f->limit_bytes = a->bytes;
            f->limit_rule = r->name;
        }
        break;
    case RULE_ACT_SLOW_CLOSE:
        f->has_slow_close = true;
        f->slow_close_ms = a->duration_ms;
        break;
    default:
        break;
    }
}

void stream_plan_add_rule(const struct rule *r, struct stream_fx fx[2], struct conn_faults *cf)
{
    const struct rule_action *a = &r->action;
    if (rule_action_is_stream(a->kind)) {
        if (r->direction & RULE_DIR_UPSTREAM)
            add_stream_action(r, &fx[STREAM_FROM_CLIENT]);
        if (r->direction & RULE_DIR_DOWNSTREAM)
            add_stream_action(r, &fx[STREAM_FROM_UPSTREAM]);
    }
    if (a->kind == RULE_ACT_RESET) {
        cf->reset = true;
        cf->reset_after_ms = a->duration_ms;
        cf->reset_rule = r->name;
    } else if (a->kind == RULE_ACT_CLOSE) {
        *(a->close_when == RULE_CLOSE_BEFORE ? &cf->close_before : &cf->close_after) = true;
        cf->close_rule = r->name;
    } else if (a->kind == RULE_ACT_DELAY) {
        cf->delay_connect_ms = a->duration_ms;
    }
}

void stream_plan_add_toxic(const struct toxic_stream *t, const char *name, struct stream_fx *f)
{
    const int64_t *a = t->attr;
    uint32_t ms0 = a[0] > 0 ? (a[0] > UINT32_MAX ? UINT32_MAX : (uint32_t)a[0]) : 0;
    switch (t->kind) {
    case TOXIC_LATENCY:
        f->latency_ms += ms0;
        f->jitter_ms += a[1] > 0 ? (uint32_t)a[1] : 0;
        break;
    case TOXIC_BANDWIDTH:
        if (a[0] <= 0)
            f->bandwidth_hold = true; /* Toxiproxy delivers nothing at rate 0 (bandwidth.go) */
        else if (f->rate_bps == 0 || (uint64_t)a[0] * 1000 < f->rate_bps)
            f->rate_bps = (uint64_t)a[0] * 1000; /* KB/s, 1 KB = 1000 bytes (bandwidth.go) */
        break;
    case TOXIC_SLOW_CLOSE:
        f->has_slow_close = true;
        f->slow_close_ms += ms0;
        break;
    case TOXIC_TIMEOUT:
        f->has_timeout = true;
        f->timeout_ms = ms0;
        f->toxic_rule = name;
        break;
    case TOXIC_RESET_PEER:
        f->has_reset_peer = true;
        f->reset_peer_ms = ms0;
        f->toxic_rule = name;
        break;
    case TOXIC_SLICER:
        f->slice_halving = true;
        f->slice_bytes = a[0] > 0 ? (uint64_t)a[0] : 1;
        f->slice_variation = a[1] > 0 ? (uint32_t)a[1] : 0;
        f->slice_delay_us = a[2] > 0 ? (uint32_t)a[2] : 0;
        break;
    case TOXIC_LIMIT_DATA:
        if (!f->has_limit || (uint64_t)(a[0] > 0 ? a[0] : 0) < f->limit_bytes) {
            f->has_limit = true;
            f->limit_bytes = a[0] > 0 ? (uint64_t)a[0] : 0;
            f->limit_rule = name;
        }
        break;
    default:
        break;
    }
}
