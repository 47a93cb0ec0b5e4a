/*
 * amqp_frame.c - AMQP 0-9-1 framing: the client's 8-byte protocol header and the
 * type|channel|size|payload|0xCE frame scanner, plus the codec's error strings.
 *
 * The scanner is resumable at any byte without state of its own: the caller hands it the
 * bytes it holds from a frame boundary on, and it answers "complete", "need N bytes" or
 * "invalid".  It rejects a frame as soon as the bytes seen prove it invalid (type at byte 1,
 * size and heartbeat rules at byte 7), so a peer cannot make the proxy buffer a frame it will
 * refuse anyway.  The payload is not looked at; see amqp_method.c and amqp_props.c.
 */
#include "proto/amqp/amqp.h"
#include "proto/amqp/amqp_wire.h"

static const char *const amqp_status_str[] = {
#define AMQP_STATUS_STR(name, code, str) [-(code)] = str,
    AMQP_ERRORS(AMQP_STATUS_STR)
#undef AMQP_STATUS_STR
};

const char *amqp_strerror(int status)
{
    size_t n = sizeof(amqp_status_str) / sizeof(amqp_status_str[0]);
    if (status > 0 || status <= -(int)n || amqp_status_str[-status] == NULL)
        return "unknown error";
    return amqp_status_str[-status];
}

bool amqp_bytes_eq(struct amqp_bytes b, const char *s)
{
    size_t n = strlen(s);
    return n == b.len && (n == 0 || memcmp(b.p, s, n) == 0);
}

/* "AMQP" 0 0 9 1, and the pre-standard "AMQP" 1 1 0 9 that RabbitMQ maps to 0-9-1
 * (rabbit_reader:handle_input(handshake, <<"AMQP", 1, 1, 0, 9>>, ...)). */
static const uint8_t amqp_header_091[AMQP_PROTOCOL_HEADER_SIZE] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
static const uint8_t amqp_header_legacy[AMQP_PROTOCOL_HEADER_SIZE] = {'A', 'M', 'Q', 'P',
                                                                      1,   1,   0,   9};

int amqp_protocol_header_check(const uint8_t *buf, size_t len)
{
    size_t n = len < AMQP_PROTOCOL_HEADER_SIZE ? len : AMQP_PROTOCOL_HEADER_SIZE;
    size_t magic = n < 4 ? n : 4;

    if (n == 0)
        return 0;
    if (memcmp(buf, amqp_header_091, magic) != 0)
        return AMQP_E_NOT_AMQP;
    if (memcmp(buf, amqp_header_091, n) != 0 && memcmp(buf, amqp_header_legacy, n) != 0)
        return AMQP_E_VERSION;
    return n == AMQP_PROTOCOL_HEADER_SIZE ? 1 : 0;
}

static bool amqp_frame_type_known(uint8_t type)
{
    return type == AMQP_FRAME_METHOD || type == AMQP_FRAME_HEADER || type == AMQP_FRAME_BODY ||
           type == AMQP_FRAME_HEARTBEAT;
}

/* Checks the 7 header bytes and fills type, channel, size and frame_len. */
static int amqp_frame_header(const uint8_t *buf, uint32_t frame_max, struct amqp_frame *f)
{
    f->type = buf[0];
    f->channel = (uint16_t)(buf[1] << 8 | buf[2]);
    f->size = amqp_load_u32(buf + 3);
    if (f->size > amqp_frame_payload_max(frame_max))
        return AMQP_E_FRAME_TOO_LARGE;
    if (f->type == AMQP_FRAME_HEARTBEAT && (f->size != 0 || f->channel != 0))
        return AMQP_E_HEARTBEAT;
    /* size <= AMQP_FRAME_MAX_LIMIT - 8 here, so this cannot wrap even with a 32-bit size_t. */
    f->frame_len = (size_t)f->size + AMQP_FRAME_OVERHEAD;
    return AMQP_OK;
}

int amqp_frame_parse(const uint8_t *buf, size_t len, uint32_t frame_max, struct amqp_frame *f)
{
    memset(f, 0, sizeof(*f));
    if (len == 0)
        return 0;
    if (!amqp_frame_type_known(buf[0]))
        return AMQP_E_FRAME_TYPE;
    if (len < AMQP_FRAME_HEADER_SIZE)
        return 0;

    int rc = amqp_frame_header(buf, frame_max, f);
    if (rc < 0)
        return rc;
    if (len < f->frame_len)
        return 0;
    if (buf[f->frame_len - 1] != AMQP_FRAME_END)
        return AMQP_E_FRAME_END;
    f->payload = buf + AMQP_FRAME_HEADER_SIZE;
    return 1;
}
