/*
 * toxic_stream.h - Toxiproxy's stream toxics, read from the JSON of its HTTP API.
 *
 * Toxiproxy (github.com/Shopify/toxiproxy, its toxics folder) has seven stream toxics; each is a
 * type name and a few integer attributes, every one 0 when the JSON leaves it out:
 *
 *   latency      latency, jitter (ms)            each chunk D±J late
 *   bandwidth    rate (KB/s, 1 KB = 1000 bytes)  throughput cap
 *   slow_close   delay (ms)                      the end of stream D late
 *   timeout      timeout (ms)                    data dropped; closed after it (0: never)
 *   reset_peer   timeout (ms)                    the first data, then a TCP reset after it
 *   slicer       average_size, size_variation (bytes), delay (µs)   data cut in slices
 *   limit_data   bytes                           closed once that many bytes went through
 *   noop         (none)                          nothing
 *
 * The proxy maps them onto its stream faults (proxy/shaper.h).  Pure: no I/O.
 */
#ifndef TWICE_TOXIC_STREAM_H
#define TWICE_TOXIC_STREAM_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum toxic_kind {
    TOXIC_LATENCY = 0,
    TOXIC_BANDWIDTH,
    TOXIC_SLOW_CLOSE,
    TOXIC_TIMEOUT,
    TOXIC_RESET_PEER,
    TOXIC_SLICER,
    TOXIC_LIMIT_DATA,
    TOXIC_NOOP, /* passes the data: a registered type of Toxiproxy's */
    TOXIC_KIND_COUNT,
};

/* Attributes a stream toxic has at most. */
#define TOXIC_MAX_ATTRS 3

struct toxic_stream {
    enum toxic_kind kind;
    int64_t attr[TOXIC_MAX_ATTRS]; /* in the order of toxic_stream_attr_names() */
};

/* The kind of Toxiproxy stream toxic `type`: 0 and *kind, or -1 when it is none. */
int toxic_stream_kind(const char *type, enum toxic_kind *kind);
const char *toxic_stream_type(enum toxic_kind kind);

/* The attribute names of `kind`, in Toxiproxy's JSON order, NULL-terminated. */
const char *const *toxic_stream_attr_names(enum toxic_kind kind);

/* Reads `attrs` (a JSON object, or NULL: every attribute 0) into *out for a toxic of `kind`;
 * when `base` is not NULL its values stand for the attributes `attrs` leaves out (an update).
 * Unknown keys are ignored, as Toxiproxy's JSON decoder does.  Returns 0, or -1 with
 * Toxiproxy's words in err when an attribute is not an integer. */
int toxic_stream_read(enum toxic_kind kind, const json_t *attrs, const struct toxic_stream *base,
                      struct toxic_stream *out, char *err, size_t errlen);

/* Member `key` of object `o` as Go's decoder finds it: the exact name, else one that differs
 * only in case; NULL when none (or `o` is no object). */
const json_t *toxic_json_get(const json_t *o, const char *key);

/* The attributes of `t` as Toxiproxy shows them: a new JSON object with every attribute. */
json_t *toxic_stream_json(const struct toxic_stream *t);

#endif
