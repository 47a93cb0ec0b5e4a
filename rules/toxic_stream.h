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
 * The proxy maps them onto its stream faults (proxy/net/shaper.h).  Pure: no I/O.
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

/*
 * Toxiproxy's slicer (toxics/slicer.go, SlicerToxic.chunk) cuts each chunk it is given in two
 * at the middle, moved by a random r in [-V, V) when the variation V is not 0, and cuts each
 * half again the same way, left first, until a piece is at most average + V bytes: 100 bytes at
 * average 10, V 0, are 16 pieces of 6 or 7 bytes.  struct toxic_slicer hands out those pieces
 * in order, one at a time, drawing each r when its cut is made (Toxiproxy's order), with a
 * stack of the pieces still to cut instead of a list of every piece.
 *
 * An average under 1 counts as 1 and a variation of at least the average as average - 1:
 * Toxiproxy's source asks for a variation under the average, and with a larger one a cut
 * can fall outside its chunk.  Then each cut leaves two non-empty pieces, and the part of a
 * piece above 2V halves (rounded up) with each cut, so the stack holds at most 66 pieces for
 * any 64-bit length.
 */
#define TOXIC_SLICER_STACK 80

struct toxic_slicer {
    uint64_t average, variation;
    size_t depth;                         /* pieces in pending[] */
    uint64_t pending[TOXIC_SLICER_STACK]; /* pieces still to cut, the next one last */
};

/* A slicer with no chunk under way. */
void toxic_slicer_init(struct toxic_slicer *sl, int64_t average, int64_t variation);

/* The size of the next piece.  When no chunk is under way, one of `chunk_len` bytes (at least
 * 1) starts.  draw(arg) gives the random numbers of the cuts.  Calling it again before
 * toxic_slicer_took() returns the same piece. */
uint64_t toxic_slicer_next(struct toxic_slicer *sl, uint64_t chunk_len, uint64_t (*draw)(void *),
                           void *arg);

/* `n` bytes of the piece toxic_slicer_next() returned have gone (n at most that piece). */
void toxic_slicer_took(struct toxic_slicer *sl, uint64_t n);

/* Whether a chunk is under way: some of its pieces are still to go. */
bool toxic_slicer_busy(const struct toxic_slicer *sl);

#endif
