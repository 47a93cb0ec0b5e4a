/*
 * toxic_stream.c - Toxiproxy's stream toxics from their JSON.  See toxic_stream.h.
 *
 * Names and attributes are Toxiproxy's (toxics/latency.go, bandwidth.go, slow_close.go,
 * timeout.go, reset_peer.go, slicer.go, limit_data.go in github.com/Shopify/toxiproxy).
 */
#include "rules/toxic_stream.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *type;
    const char *go_type; /* its Go struct, named in Toxiproxy's decoding errors */
    const char *attrs[TOXIC_MAX_ATTRS + 1];
} toxic_table[TOXIC_KIND_COUNT] = {
    [TOXIC_LATENCY] = {"latency", "LatencyToxic", {"latency", "jitter", NULL}},
    [TOXIC_BANDWIDTH] = {"bandwidth", "BandwidthToxic", {"rate", NULL}},
    [TOXIC_SLOW_CLOSE] = {"slow_close", "SlowCloseToxic", {"delay", NULL}},
    [TOXIC_TIMEOUT] = {"timeout", "TimeoutToxic", {"timeout", NULL}},
    [TOXIC_RESET_PEER] = {"reset_peer", "ResetToxic", {"timeout", NULL}},
    [TOXIC_SLICER] = {"slicer", "SlicerToxic", {"average_size", "size_variation", "delay", NULL}},
    [TOXIC_LIMIT_DATA] = {"limit_data", "LimitDataToxic", {"bytes", NULL}},
    [TOXIC_NOOP] = {"noop", "NoopToxic", {NULL}},
};

const json_t *toxic_json_get(const json_t *o, const char *key)
{
    if (!json_is_object(o))
        return NULL;
    const json_t *v = json_object_get(o, key);
    if (v != NULL)
        return v;
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)o, k, val)
    {
        if (strcasecmp(k, key) == 0)
            return val;
    }
    return NULL;
}

int toxic_stream_kind(const char *type, enum toxic_kind *kind)
{
    for (int k = 0; type != NULL && k < TOXIC_KIND_COUNT; k++) {
        if (strcmp(toxic_table[k].type, type) == 0) {
            *kind = (enum toxic_kind)k;
            return 0;
        }
    }
    return -1;
}

const char *toxic_stream_type(enum toxic_kind kind)
{
    return toxic_table[kind].type;
}

const char *const *toxic_stream_attr_names(enum toxic_kind kind)
{
    return toxic_table[kind].attrs;
}

/* What Go's decoder calls a JSON value it cannot put in an integer. */
static const char *json_kind_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return "string";
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_TRUE:
    case JSON_FALSE:
        return "bool";
    case JSON_REAL:
        return "number";
    default:
        return "value";
    }
}

int toxic_stream_read(enum toxic_kind kind, const json_t *attrs, const struct toxic_stream *base,
                      struct toxic_stream *out, char *err, size_t errlen)
{
    struct toxic_stream t = {.kind = kind};
    if (base != NULL)
        t = *base;
    const char *const *names = toxic_table[kind].attrs;
    for (int i = 0; names[i] != NULL; i++) {
        const json_t *v = toxic_json_get(attrs, names[i]);
        if (v == NULL || json_is_null(v))
            continue;
        if (json_is_integer(v)) {
            t.attr[i] = (int64_t)json_integer_value(v);
        } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
                   fabs(json_real_value(v)) < 9.0e18) {
            t.attr[i] = (int64_t)json_real_value(v); /* 1e3 is an integer to Go too */
        } else {
            char what[48];
            if (json_is_real(v))
                snprintf(what, sizeof(what), "number %.17g", json_real_value(v));
            else
                snprintf(what, sizeof(what), "%s", json_kind_name(v));
            snprintf(err, errlen,
                     "bad request body: json: cannot unmarshal %s into Go struct field "
                     "%s.attributes.%s of type %s",
                     what, toxic_table[kind].go_type, names[i],
                     kind == TOXIC_SLICER ? "int" : "int64");
            return -1;
        }
    }
    *out = t;
    return 0;
}

json_t *toxic_stream_json(const struct toxic_stream *t)
{
    json_t *o = json_object();
    const char *const *names = toxic_table[t->kind].attrs;
    for (int i = 0; o != NULL && names[i] != NULL; i++) {
        if (json_object_set_new(o, names[i], json_integer((json_int_t)t->attr[i])) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

void toxic_slicer_init(struct toxic_slicer *sl, int64_t average, int64_t variation)
{
    sl->depth = 0;
    sl->average = average > 1 ? (uint64_t)average : 1;
    uint64_t v = variation > 0 ? (uint64_t)variation : 0;
    sl->variation = v < sl->average ? v : sl->average - 1;
}

uint64_t toxic_slicer_next(struct toxic_slicer *sl, uint64_t chunk_len, uint64_t (*draw)(void *),
                           void *arg)
{
    if (sl->depth == 0)
        sl->pending[sl->depth++] = chunk_len > 0 ? chunk_len : 1;
    for (;;) {
        uint64_t len = sl->pending[sl->depth - 1];
        if (len <= sl->average + sl->variation || sl->depth == TOXIC_SLICER_STACK)
            return len;
        /* len > average + V >= 2V + 1, so len / 2 > V: both sides of the cut are non-empty */
        uint64_t left = len / 2;
        if (sl->variation != 0)
            left = left + draw(arg) % (2 * sl->variation) - sl->variation;
        sl->pending[sl->depth - 1] = len - left; /* cut later, after all of the left side */
        sl->pending[sl->depth++] = left;
    }
}

void toxic_slicer_took(struct toxic_slicer *sl, uint64_t n)
{
    if (sl->depth == 0)
        return;
    uint64_t *piece = &sl->pending[sl->depth - 1];
    *piece = n < *piece ? *piece - n : 0;
    if (*piece == 0)
        sl->depth--;
}

bool toxic_slicer_busy(const struct toxic_slicer *sl)
{
    return sl->depth > 0;
}
