/*
 * fuzz_amqp.c - libFuzzer harness for the AMQP 0-9-1 codec (proto/amqp*.c).  Not part of the
 * default build (scripts/fuzz.sh builds and runs it):
 *
 *     clang -fsanitize=fuzzer,address,undefined -I. proto/amqp*.c tests/fuzz/fuzz_amqp.c \
 *         -o fuzz_amqp
 *     ./fuzz_amqp -max_total_time=60 CORPUS_DIR
 *
 * The seeds (tests/fuzz/corpus/amqp/) are runs of whole frames of the captured streams
 * tests/unit/data/amqp/{client,server}.bin, each prefixed with one mode byte.  The first input
 * byte picks the frame_max; the rest is scanned as a stream of frames, every complete frame's
 * payload goes through the decoder its type calls for, and the whole input also goes through
 * every payload decoder whatever it looks like.
 * Invariants are checked with abort(): views stay inside their input, the patchers round-trip,
 * validated tables never fail a lookup, encoders never exceed their buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/amqp/amqp.h"

static void check(bool ok)
{
    if (!ok)
        abort();
}

static bool inside(struct amqp_bytes v, const uint8_t *base, size_t len)
{
    return v.len == 0 || (v.p >= base && v.p <= base + len && v.len <= (size_t)(base + len - v.p));
}

/* Patches a copy of a decoded deliver/get-ok and decodes it again. */
static void patch_round_trip(const uint8_t *p, uint32_t size, const struct amqp_method *m)
{
    uint8_t *copy = malloc(size);
    if (copy == NULL)
        return;
    memcpy(copy, p, size);
    amqp_patch_delivery_tag(copy, m->delivery.tag_offset, ~m->delivery.delivery_tag);
    amqp_set_redelivered(copy, m->delivery.redelivered_offset, !m->delivery.redelivered);
    struct amqp_method again;
    check(amqp_method_decode(copy, size, &again) == 0);
    check(again.delivery.delivery_tag == ~m->delivery.delivery_tag);
    check(again.delivery.redelivered == !m->delivery.redelivered);
    free(copy);
}

static void fuzz_method(const uint8_t *p, uint32_t size)
{
    struct amqp_method m;
    int rc = amqp_method_decode(p, size, &m);
    check(rc <= 0);
    (void)amqp_method_name(m.class_id, m.method_id);
    if (rc < 0 || !m.decoded)
        return;
    if (m.id == AMQP_BASIC_DELIVER || m.id == AMQP_BASIC_GET_OK) {
        check(m.delivery.tag_offset + 8u <= size && m.delivery.redelivered_offset < size);
        check(inside(m.delivery.exchange, p, size) && inside(m.delivery.routing_key, p, size));
        patch_round_trip(p, size, &m);
    } else if (m.id == AMQP_CONNECTION_START_OK) {
        check(inside(m.start_ok.response, p, size));
        check(m.start_ok.response.len == 0 ||
              m.start_ok.response.p == p + m.start_ok.response_offset);
        check(amqp_table_validate(m.start_ok.client_properties) == 0);
    } else if (m.id == AMQP_BASIC_CONSUME) {
        struct amqp_field f;
        check(amqp_table_find(m.consume.arguments, "x-priority", &f) >= 0);
    }
}

static void fuzz_header(const uint8_t *p, uint32_t size)
{
    struct amqp_props props;
    int rc = amqp_content_header_decode(p, size, &props);
    check(rc <= 0);
    if (rc < 0)
        return;
    check(inside(props.headers, p, size) && inside(props.message_id, p, size));
    struct amqp_bytes s;
    struct amqp_field f;
    check(amqp_table_find_string(props.headers, "id", &s) >= 0);
    check(amqp_table_find_string(props.headers, "task", &s) >= 0);
    if (amqp_table_find(props.headers, "stamps", &f) == 1 && f.type == 'F')
        check(amqp_table_validate(f.bytes) >= AMQP_E_TABLE_DEPTH);
}

static void fuzz_stream(const uint8_t *data, size_t size, uint32_t frame_max)
{
    size_t off = 0;
    if (amqp_protocol_header_check(data, size) == 1)
        off = AMQP_PROTOCOL_HEADER_SIZE;
    while (off < size) {
        struct amqp_frame f;
        int rc = amqp_frame_parse(data + off, size - off, frame_max, &f);
        if (rc <= 0)
            return;
        check(f.frame_len <= size - off && f.size <= amqp_frame_payload_max(frame_max));
        if (f.type == AMQP_FRAME_METHOD)
            fuzz_method(f.payload, f.size);
        else if (f.type == AMQP_FRAME_HEADER)
            fuzz_header(f.payload, f.size);
        off += f.frame_len;
    }
}

static void fuzz_encoders(const uint8_t *data, size_t size)
{
    uint8_t out[AMQP_ENCODE_MAX];
    uint64_t tag = 0;
    memcpy(&tag, data, size < sizeof(tag) ? size : sizeof(tag));
    size_t cap = size == 0 ? 0 : data[0] % (AMQP_ENCODE_MAX + 1);
    struct amqp_bytes text = {data, size > 300 ? 300 : (uint32_t)size};
    check(amqp_encode_basic_ack(out, cap, (uint16_t)tag, tag, tag & 1) <= (int)cap);
    check(amqp_encode_basic_nack(out, cap, (uint16_t)tag, tag, tag & 1, tag & 2) <= (int)cap);
    check(amqp_encode_basic_reject(out, cap, (uint16_t)tag, tag, tag & 2) <= (int)cap);
    check(amqp_encode_channel_close(out, cap, 1, (uint16_t)tag, text, 60, 80) <= (int)cap);
    int n = amqp_encode_connection_close(out, sizeof(out), 320, text, 0, 0);
    if (n > 0) {
        struct amqp_frame f;
        check(amqp_frame_parse(out, (size_t)n, 0, &f) == 1);
        fuzz_method(f.payload, f.size);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t frame_maxes[] = {0, AMQP_FRAME_MIN_SIZE, 131072, 16, 8, 7};
    if (size == 0)
        return 0;
    uint32_t frame_max = frame_maxes[data[0] % (sizeof(frame_maxes) / sizeof(frame_maxes[0]))];
    data++;
    size--;
    fuzz_stream(data, size, frame_max);
    uint32_t n = size > UINT32_MAX ? UINT32_MAX : (uint32_t)size;
    fuzz_method(data, n);
    fuzz_header(data, n);
    struct amqp_bytes t = {data, n};
    struct amqp_field f;
    if (amqp_table_validate(t) == 0)
        check(amqp_table_find(t, "id", &f) >= 0);
    fuzz_encoders(data, size);
    return 0;
}
