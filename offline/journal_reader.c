/*
 * journal_reader.c - length-delimited journal entries: span codec and file
 * reader.  See journal_reader.h.
 *
 * The file reader keeps one buffer holding the unread tail of the file and
 * refills it with fread(); an entry is decoded only once all of its bytes are
 * in the buffer, so the buffer never grows past two of the largest legal
 * entries (a damaged one and the one after it, see reader_damaged()).
 *
 * Damage.  An entry that does not decode, in a journal whose entries carry
 * their checksum, is skipped: when the entry its length prefix announces
 * after it checks out, the damage is that one record; otherwise the reader
 * looks for the next position where a whole entry with a right checksum
 * starts (a random match is 1 in 2^40: the tag byte and the CRC), and reads
 * on from there.  Journals without checksums stop at their first damage:
 * nothing tells where a record after it starts.
 */
#include "offline/journal_reader.h"

#include "proto/base/utf8.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes asked of fread() at a time, and the buffer's starting size. */
#define JOURNAL_READ_CHUNK (64u * 1024u)
/* The buffer never needs more than two whole entries with their prefixes. */
#define JOURNAL_READ_BUF_MAX (2 * (JOURNAL_RECORD_MAX + JOURNAL_VARINT_MAX))
/* Room for the sticky error text. */
#define JOURNAL_ERROR_MAX 256u

struct journal_reader {
    FILE *fp;     /* owned */
    uint8_t *buf; /* owned; unread bytes are buf[start..end) */
    size_t cap, start, end;
    bool eof;           /* fread() returned 0 at the end of the file */
    bool truncated;     /* the last entry was cut short */
    bool clean_stop;    /* the last entry read is a stop record */
    uint64_t runs;      /* headers read: the first, and one per later run */
    uint64_t unclean;   /* runs before the current one that ended without a stop record */
    bool crc;           /* entries end with their checksum (header entry_crc32c) */
    size_t damaged_len; /* the damaged entry's announced length; 0: not known */
    struct journal_damage damage[JOURNAL_DAMAGE_KEPT]; /* the first stretches of damage */
    struct journal_damage_summary damage_sum;
    int status;                     /* sticky: 0 or a JOURNAL_ERR_* code */
    int sys_errno;                  /* errno of the last JOURNAL_ERR_IO */
    uint64_t offset;                /* file offset of buf[start] */
    uint64_t count;                 /* entries returned by next() */
    Twice__Journal__Entry *header;  /* owned: the first entry */
    Twice__Journal__Entry *current; /* owned: the last entry returned */
    char error[JOURNAL_ERROR_MAX];
};

const char *journal_strerror(int status)
{
    switch (status) {
#define JOURNAL_STATUS_CASE(name, code, str)                                                       \
    case code:                                                                                     \
        return str;
        JOURNAL_ERRORS(JOURNAL_STATUS_CASE)
#undef JOURNAL_STATUS_CASE
    default:
        return "unknown error";
    }
}

/* Reads a varint length prefix.  Returns 1 (value in *v, length in *n), 0 when
 * buf ends inside it, or a JOURNAL_ERR_* code.  A value is refused as soon as
 * the bytes seen so far exceed JOURNAL_RECORD_MAX: later bytes only add. */
static int read_length(const uint8_t *buf, size_t len, uint64_t *v, size_t *n)
{
    uint64_t value = 0;
    for (size_t i = 0; i < JOURNAL_VARINT_MAX; i++) {
        if (i == len)
            return 0;
        value |= (uint64_t)(buf[i] & 0x7f) << (7 * i);
        if (value > JOURNAL_RECORD_MAX)
            return JOURNAL_ERR_TOO_LARGE;
        if ((buf[i] & 0x80) == 0) {
            *v = value;
            *n = i + 1;
            return 1;
        }
    }
    return JOURNAL_ERR_VARINT;
}

/* ---- CRC-32C ----------------------------------------------------------------------------- */

/* CRC-32C (Castagnoli): the checksum LevelDB and RocksDB give their log records, for what it is
 * here too, finding damage and the next record after it.  x86-64's SSE4.2 computes it 8 bytes
 * per instruction (a few ns per entry, where slicing by 8 takes ~50: as much as encoding the
 * record); elsewhere, or on an x86-64 without SSE4.2, slicing by 8 (Intel's, as zlib and the
 * Linux kernel use it), with eight tables of 256 built once.  The reflected polynomial. */
#define JOURNAL_CRC_POLY 0x82f63b78u

static uint32_t crc_table[8][256];
static bool crc_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? JOURNAL_CRC_POLY ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* c carried on over p[0..n), without the final inversion. */
static uint32_t crc_sliced(uint32_t c, const uint8_t *p, size_t n)
{
    const uint32_t(*t)[256] = crc_table;
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t a = load_le32(p) ^ c, b = load_le32(p + 4);
        c = t[7][a & 0xff] ^ t[6][(a >> 8) & 0xff] ^ t[5][(a >> 16) & 0xff] ^ t[4][a >> 24] ^
            t[3][b & 0xff] ^ t[2][(b >> 8) & 0xff] ^ t[1][(b >> 16) & 0xff] ^ t[0][b >> 24];
    }
    for (; n > 0; p++, n--)
        c = t[0][(c ^ *p) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const uint8_t *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, sizeof(v)); /* little-endian, as the instruction reads it */
        c = (uint32_t)__builtin_ia32_crc32di(c, v);
    }
    for (; n > 0; p++, n--)
        c = __builtin_ia32_crc32qi(c, *p);
    return c;
}
#endif

uint32_t journal_crc32c(const uint8_t *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__)
    if (crc_hw)
        return crc_sse42(0xffffffffu, p, n) ^ 0xffffffffu;
#endif
    return crc_sliced(0xffffffffu, p, n) ^ 0xffffffffu;
}

uint32_t journal_crc32c_portable(const uint8_t *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    return crc_sliced(0xffffffffu, p, n) ^ 0xffffffffu;
}

/* Writes the checksum of body[0..n) after it (JOURNAL_CRC_LEN bytes). */
static void put_crc(uint8_t *body, size_t n)
{
    uint32_t c = journal_crc32c(body, n);
    body[n] = JOURNAL_CRC_TAG;
    for (size_t i = 0; i < 4; i++)
        body[n + 1 + i] = (uint8_t)(c >> (8 * i));
}

/* Whether body[0..n) ends with the checksum of the bytes before it. */
static bool crc_ok(const uint8_t *body, size_t n)
{
    return n >= JOURNAL_CRC_LEN && body[n - JOURNAL_CRC_LEN] == JOURNAL_CRC_TAG &&
           load_le32(body + n - 4) == journal_crc32c(body, n - JOURNAL_CRC_LEN);
}

int journal_decode_entry(const uint8_t *buf, size_t len, bool crc, size_t *used,
                         Twice__Journal__Entry **out)
{
    uint64_t body_len = 0;
    size_t prefix_len = 0;
    int rc = read_length(buf, len, &body_len, &prefix_len);
    if (rc <= 0)
        return rc;
    if (len - prefix_len < body_len)
        return 0;
    *used = prefix_len + (size_t)body_len;
    const uint8_t *body = buf + prefix_len;
    size_t n = (size_t)body_len;
    if (crc) {
        if (!crc_ok(body, n))
            return JOURNAL_ERR_CHECKSUM;
        n -= JOURNAL_CRC_LEN;
    }
    Twice__Journal__Entry *e = twice__journal__entry__unpack(NULL, n, body);
    if (e == NULL)
        return JOURNAL_ERR_DECODE;
    *out = e;
    return 1;
}

/* Whether a whole entry with a right checksum starts at buf[p]; sets *end past it. */
static bool whole_entry_at(const uint8_t *buf, size_t len, size_t p, size_t *end)
{
    uint64_t body = 0;
    size_t prefix = 0;
    if (read_length(buf + p, len - p, &body, &prefix) != 1 || len - p - prefix < body ||
        body < JOURNAL_CRC_LEN || buf[p + prefix + body - JOURNAL_CRC_LEN] != JOURNAL_CRC_TAG ||
        !crc_ok(buf + p + prefix, (size_t)body))
        return false;
    *end = p + prefix + (size_t)body;
    return true;
}

size_t journal_tail_cut_short(const uint8_t *buf, size_t len)
{
    /* From the end back: the first whole entry found is the last one (a false match inside a
     * record's bytes is a 1 in 2^40 chance, as in the reader's scan). */
    for (size_t p = len; p-- > 0;) {
        size_t end = 0;
        if (!whole_entry_at(buf, len, p, &end))
            continue;
        if (end == len)
            return 0;
        Twice__Journal__Entry *e = NULL;
        size_t used = 0;
        return journal_decode_entry(buf + end, len - end, true, &used, &e) == 0 ? len - end : 0;
    }
    return 0;
}

size_t journal_put_varint(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* e without its crc32c field: protobuf-c writes the other fields; the checksum is ours to add. */
static Twice__Journal__Entry without_crc(const Twice__Journal__Entry *e)
{
    Twice__Journal__Entry copy = *e;
    copy.crc32c = 0;
    return copy;
}

size_t journal_entry_encoded_size(const Twice__Journal__Entry *e)
{
    Twice__Journal__Entry copy = without_crc(e);
    size_t body = twice__journal__entry__get_packed_size(&copy) + JOURNAL_CRC_LEN;
    return varint_size(body) + body;
}

int journal_encode_entry(const Twice__Journal__Entry *e, uint8_t *out, size_t cap, size_t *written)
{
    Twice__Journal__Entry copy = without_crc(e);
    size_t msg = twice__journal__entry__get_packed_size(&copy);
    size_t body = msg + JOURNAL_CRC_LEN;
    if (body > JOURNAL_RECORD_MAX)
        return JOURNAL_ERR_TOO_LARGE;
    size_t need = varint_size(body) + body;
    if (cap < need)
        return JOURNAL_ERR_SPACE;
    size_t n = journal_put_varint(out, body);
    twice__journal__entry__pack(&copy, out + n);
    put_crc(out + n, msg);
    *written = need;
    return 0;
}

/* ---- a record's entry, encoded without protobuf-c's reflection ---------------------------- */

/* One of Record's fields (journal.proto) to write: a varint v, or a string (bytes) s of v bytes.
 * protobuf-c writes a proto3 message's fields in field order and leaves out those at their
 * default (0, false, NULL or ""): so does record_fields(). */
struct record_field {
    uint8_t number;
    uint64_t v;    /* the value, or the string's length */
    const char *s; /* NULL: a varint */
};

/* Fields of a Record (journal.proto). */
#define RECORD_FIELDS 32

/* r's fields that are not at their default, in field order, into f[]; returns how many.  Only
 * those are written to f[]: most of a record's fields are left at 0 or empty. */
static size_t record_fields(const Twice__Journal__Record *r, struct record_field f[RECORD_FIELDS])
{
    size_t n = 0;
#define RECORD_V(num, val)                                                                         \
    do {                                                                                           \
        uint64_t v_ = (val);                                                                       \
        if (v_ != 0)                                                                               \
            f[n++] = (struct record_field){(num), v_, NULL};                                       \
    } while (0)
#define RECORD_S(num, str)                                                                         \
    do {                                                                                           \
        const char *s_ = (str);                                                                    \
        if (s_ != NULL && s_[0] != '\0')                                                           \
            f[n++] = (struct record_field){(num), strlen(s_), s_};                                 \
    } while (0)
    RECORD_V(1, (uint64_t)(int64_t)r->kind);
    RECORD_V(2, r->time_unix_us);
    RECORD_V(3, r->session);
    RECORD_S(4, r->listener);
    RECORD_S(5, r->queue);
    RECORD_S(6, r->task);
    RECORD_S(7, r->message_id);
    RECORD_V(8, r->delivery_tag);
    RECORD_V(9, r->redelivered ? 1u : 0u);
    RECORD_S(10, r->rule);
    RECORD_V(11, r->action);
    RECORD_S(12, r->action_name);
    RECORD_V(13, r->event);
    RECORD_S(14, r->client);
    RECORD_V(15, r->close_reason);
    RECORD_S(16, r->close_reason_name);
    RECORD_V(17, r->bytes_up);
    RECORD_V(18, r->bytes_down);
    RECORD_S(19, r->detail);
    RECORD_V(20, r->retries);
    RECORD_V(21, r->retry ? 1u : 0u);
    RECORD_V(22, r->refused ? 1u : 0u);
    RECORD_V(23, r->started_unix_us);
    RECORD_S(24, r->run);
    RECORD_V(25, r->kept_back ? 1u : 0u);
    RECORD_V(26, r->auto_ack ? 1u : 0u);
    RECORD_V(27, (uint64_t)(int64_t)r->change);
    RECORD_V(28, (uint64_t)(int64_t)r->change_source);
    if (r->rules_sha256.len > 0)
        f[n++] = (struct record_field){29, r->rules_sha256.len, (const char *)r->rules_sha256.data};
    RECORD_V(30, r->rules);
    RECORD_V(31, r->rules_disabled);
    RECORD_V(32, r->faults_off ? 1u : 0u);
#undef RECORD_V
#undef RECORD_S
    return n;
}

int journal_encode_record_entry(const Twice__Journal__Record *r, uint8_t *out, size_t cap,
                                size_t *written)
{
    struct record_field f[RECORD_FIELDS];
    size_t n = record_fields(r, f);
    size_t rec = 0; /* the Record message's bytes */
    for (size_t i = 0; i < n; i++)
        rec += varint_size((uint64_t)f[i].number << 3) + varint_size(f[i].v) +
               (f[i].s != NULL ? f[i].v : 0);
    /* Entry: field 2, length-delimited, then the checksum */
    size_t body = 1 + varint_size(rec) + rec + JOURNAL_CRC_LEN;
    if (body > JOURNAL_RECORD_MAX)
        return JOURNAL_ERR_TOO_LARGE;
    if (cap < varint_size(body) + body) {
        *written = varint_size(body) + body;
        return JOURNAL_ERR_SPACE;
    }
    size_t o = journal_put_varint(out, body);
    size_t start = o;
    out[o++] = 2 << 3 | 2;
    o += journal_put_varint(out + o, rec);
    for (size_t i = 0; i < n; i++) {
        /* Wire type 0 (a varint) or 2 (length-delimited), then the varint either way. */
        o += journal_put_varint(out + o, (uint64_t)f[i].number << 3 | (f[i].s != NULL ? 2 : 0));
        o += journal_put_varint(out + o, f[i].v);
        if (f[i].s != NULL) {
            memcpy(out + o, f[i].s, f[i].v);
            o += f[i].v;
        }
    }
    put_crc(out + start, o - start);
    *written = o + JOURNAL_CRC_LEN;
    return 0;
}

size_t journal_utf8_char_len(const unsigned char *p)
{
    /* p is NUL-terminated: a NUL ends a sequence as any non-continuation byte does, so
     * reading up to 4 bytes never passes it. */
    return utf8_char_len(p, 4);
}

/* Records the sticky error with the file offset where it was found. */
static int reader_fail(struct journal_reader *r, int status)
{
    r->status = status;
    snprintf(r->error, sizeof(r->error), "offset %llu: %s%s%s", (unsigned long long)r->offset,
             journal_strerror(status), status == JOURNAL_ERR_IO ? ": " : "",
             status == JOURNAL_ERR_IO ? strerror(r->sys_errno) : "");
    return status;
}

/* Moves the unread bytes to the front and makes room for one more chunk,
 * growing the buffer up to JOURNAL_READ_BUF_MAX. */
static int reader_make_room(struct journal_reader *r)
{
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->end < r->cap)
        return 0;
    size_t cap = r->cap * 2 > JOURNAL_READ_BUF_MAX ? JOURNAL_READ_BUF_MAX : r->cap * 2;
    if (cap <= r->cap)
        return JOURNAL_ERR_TOO_LARGE; /* cannot happen: the decoder refuses first */
    uint8_t *buf = realloc(r->buf, cap);
    if (buf == NULL)
        return JOURNAL_ERR_NOMEM;
    r->buf = buf;
    r->cap = cap;
    return 0;
}

/* Reads more of the file into the buffer.  Sets r->eof at the end. */
static int reader_fill(struct journal_reader *r)
{
    int rc = reader_make_room(r);
    if (rc < 0)
        return rc;
    size_t n = fread(r->buf + r->end, 1, r->cap - r->end, r->fp);
    r->end += n;
    if (n == 0) {
        if (ferror(r->fp)) {
            r->sys_errno = errno;
            return JOURNAL_ERR_IO;
        }
        r->eof = true;
    }
    return 0;
}

/* Decodes the next entry of the file into r->current.  Returns 1, 0 at the
 * end (r->truncated set when bytes were left over), or an error code. */
static int reader_decode(struct journal_reader *r)
{
    for (;;) {
        Twice__Journal__Entry *e = NULL;
        size_t used = 0;
        int rc = journal_decode_entry(r->buf + r->start, r->end - r->start, r->crc, &used, &e);
        if (rc < 0) {
            r->damaged_len = rc == JOURNAL_ERR_CHECKSUM || rc == JOURNAL_ERR_DECODE ? used : 0;
            return rc;
        }
        if (rc == 1) {
            twice__journal__entry__free_unpacked(r->current, NULL);
            r->current = e;
            r->start += used;
            r->offset += used;
            return 1;
        }
        if (r->eof) {
            r->truncated = r->end > r->start;
            return 0;
        }
        rc = reader_fill(r);
        if (rc < 0)
            return rc;
    }
}

/* ---- damage ------------------------------------------------------------------------------ */

static bool is_damage(int rc)
{
    return rc == JOURNAL_ERR_VARINT || rc == JOURNAL_ERR_TOO_LARGE || rc == JOURNAL_ERR_CHECKSUM ||
           rc == JOURNAL_ERR_DECODE;
}

/* Whether a whole entry that checks out starts `off` bytes past r->start: 1, 0, or an error
 * (I/O, memory).  Reads more of the file as needed; the bytes from r->start on stay. */
static int reader_valid_at(struct journal_reader *r, size_t off)
{
    for (;;) {
        size_t avail = r->end - r->start;
        if (avail > off) {
            Twice__Journal__Entry *e = NULL;
            size_t used = 0;
            int rc = journal_decode_entry(r->buf + r->start + off, avail - off, true, &used, &e);
            if (rc == 1) {
                twice__journal__entry__free_unpacked(e, NULL);
                return 1;
            }
            if (rc < 0)
                return 0;
        }
        if (r->eof)
            return 0;
        int rc = reader_fill(r);
        if (rc < 0)
            return rc;
    }
}

/* Skips bytes from r->start, one at a time, until a whole entry that checks out starts there
 * (1) or the file ends (0); or an error. */
static int reader_scan(struct journal_reader *r)
{
    for (;;) {
        if (r->start == r->end) {
            if (r->eof)
                return 0;
            int rc = reader_fill(r);
            if (rc < 0)
                return rc;
            continue;
        }
        r->start++;
        r->offset++;
        int rc = reader_valid_at(r, 0);
        if (rc != 0)
            return rc;
    }
}

/* Skips the rest of the file, counting it. */
static int reader_skip_rest(struct journal_reader *r)
{
    for (;;) {
        r->offset += r->end - r->start;
        r->start = r->end;
        if (r->eof)
            return 0;
        int rc = reader_fill(r);
        if (rc < 0)
            return rc;
    }
}

static void note_damage(struct journal_reader *r, const struct journal_damage *d)
{
    struct journal_damage_summary *sum = &r->damage_sum;
    if (sum->stretches < JOURNAL_DAMAGE_KEPT)
        r->damage[sum->stretches] = *d;
    sum->stretches++;
    sum->bytes += d->bytes;
    if (d->records_lost >= 0)
        sum->records_lost += (uint64_t)d->records_lost;
    else
        sum->records_unknown = true;
    sum->stopped = !d->resumed;
}

/* The entry at r->start is damaged (reason, a JOURNAL_ERR_*): skips it, as said at the top of
 * the file, and notes the stretch skipped.  Returns 1 when an entry that checks out follows,
 * 0 when the file ended first, or an error. */
static int reader_damaged(struct journal_reader *r, int reason)
{
    struct journal_damage d = {.offset = r->offset, .reason = reason, .records_lost = -1};
    size_t len = r->damaged_len;
    int rc = r->crc && len > 0 ? reader_valid_at(r, len) : 0;
    if (rc < 0)
        return rc;
    if (!r->crc) {
        rc = reader_skip_rest(r);
    } else if (rc == 1) {
        d.records_lost = 1; /* its length held: the next entry starts where it said */
        r->start += len;
        r->offset += len;
    } else if (len > 0 && r->eof && r->end - r->start == len) {
        d.records_lost = 1; /* the last entry, whole but damaged */
        rc = reader_skip_rest(r);
    } else {
        rc = reader_scan(r);
    }
    if (rc < 0)
        return rc;
    d.bytes = r->offset - d.offset;
    d.resumed = rc == 1;
    note_damage(r, &d);
    return rc;
}

/* At the end of the file, bytes that make no whole entry: the last one cut short (a writer
 * killed inside a write), or, in a journal with checksums, damage after which whole entries
 * still come.  Returns 1 when reading goes on, 0 at the end, or an error. */
static int reader_tail(struct journal_reader *r)
{
    if (!r->crc)
        return 0;
    /* The rest of the file is in the buffer: scanning reads nothing and moves nothing. */
    size_t start = r->start;
    uint64_t offset = r->offset;
    int rc = reader_scan(r);
    if (rc <= 0) {
        /* A cut-short last entry: put it back, so that the offset is where it starts. */
        if (rc == 0) {
            r->start = start;
            r->offset = offset;
        }
        return rc;
    }
    struct journal_damage d = {.offset = offset,
                               .bytes = r->offset - offset,
                               .reason = JOURNAL_ERR_PAST_END,
                               .records_lost = -1,
                               .resumed = true};
    r->truncated = false;
    note_damage(r, &d);
    return 1;
}

/* The next entry into r->current, past any damage: 1, 0 at the end, or an error. */
static int reader_next_entry(struct journal_reader *r)
{
    for (;;) {
        int rc = reader_decode(r);
        if (rc == 0 && r->truncated)
            rc = reader_tail(r);
        else if (is_damage(rc))
            rc = reader_damaged(r, rc);
        else
            return rc;
        if (rc <= 0)
            return rc;
    }
}

int journal_reader_next(struct journal_reader *r, const Twice__Journal__Entry **out)
{
    if (r->status < 0)
        return r->status;
    int rc = reader_next_entry(r);
    if (rc < 0)
        return reader_fail(r, rc);
    if (rc == 0)
        return 0;
    r->count++;
    if (r->current->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER) {
        /* A later run (`journal PATH append`): the run before it ended here. */
        r->unclean += !r->clean_stop;
        r->runs++;
    }
    r->clean_stop = r->current->body_case == TWICE__JOURNAL__ENTRY__BODY_RECORD &&
                    r->current->record->kind == TWICE__JOURNAL__RECORD__KIND__STOP;
    *out = r->current;
    return 1;
}

/* Reads and checks the first entry.  Returns 0 or an error code.  A header whose checksum
 * fails is read again as one of a journal without checksums: if it says it has them, it is
 * damaged. */
static int reader_read_header(struct journal_reader *r)
{
    r->crc = true;
    int rc = reader_decode(r);
    if (rc == JOURNAL_ERR_CHECKSUM || rc == JOURNAL_ERR_DECODE) {
        r->crc = false;
        rc = reader_decode(r);
        if (rc == 1 && r->current->body_case == TWICE__JOURNAL__ENTRY__BODY_HEADER &&
            r->current->header->entry_crc32c)
            return JOURNAL_ERR_CHECKSUM;
    }
    if (rc < 0)
        return rc;
    if (rc == 0)
        return r->truncated ? JOURNAL_ERR_TRUNCATED : JOURNAL_ERR_EMPTY;
    if (r->current->body_case != TWICE__JOURNAL__ENTRY__BODY_HEADER)
        return JOURNAL_ERR_NO_HEADER;
    if (r->current->header->version != JOURNAL_FORMAT_VERSION)
        return JOURNAL_ERR_VERSION;
    r->crc = r->current->header->entry_crc32c;
    r->runs = 1;
    r->header = r->current;
    r->current = NULL;
    return 0;
}

struct journal_reader *journal_reader_open(const char *path, char *err, size_t errlen)
{
    struct journal_reader *r = calloc(1, sizeof(*r));
    uint8_t *buf = malloc(JOURNAL_READ_CHUNK);
    if (r == NULL || buf == NULL) {
        free(r);
        free(buf);
        snprintf(err, errlen, "%s: %s", path, journal_strerror(JOURNAL_ERR_NOMEM));
        return NULL;
    }
    r->buf = buf;
    r->cap = JOURNAL_READ_CHUNK;
    r->fp = fopen(path, "rb");
    if (r->fp == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        journal_reader_close(r);
        return NULL;
    }
    int rc = reader_read_header(r);
    if (rc < 0) {
        if (rc == JOURNAL_ERR_VERSION)
            snprintf(err, errlen, "%s: %s %u (this twice reads %u)", path, journal_strerror(rc),
                     r->current->header->version, JOURNAL_FORMAT_VERSION);
        else if (rc == JOURNAL_ERR_IO)
            snprintf(err, errlen, "%s: %s", path, strerror(r->sys_errno));
        else
            snprintf(err, errlen, "%s: %s", path, journal_strerror(rc));
        journal_reader_close(r);
        return NULL;
    }
    return r;
}

const Twice__Journal__Header *journal_reader_header(const struct journal_reader *r)
{
    return r->header->header;
}

bool journal_reader_truncated(const struct journal_reader *r)
{
    return r->truncated;
}

bool journal_reader_clean_stop(const struct journal_reader *r)
{
    return r->clean_stop;
}

uint64_t journal_reader_runs(const struct journal_reader *r)
{
    return r->runs;
}

uint64_t journal_reader_unclean_runs(const struct journal_reader *r)
{
    return r->unclean;
}

void journal_reader_damage(const struct journal_reader *r, struct journal_damage_summary *sum)
{
    *sum = r->damage_sum;
}

const struct journal_damage *journal_reader_damage_at(const struct journal_reader *r, size_t i)
{
    return i < r->damage_sum.stretches && i < JOURNAL_DAMAGE_KEPT ? &r->damage[i] : NULL;
}

uint64_t journal_reader_offset(const struct journal_reader *r)
{
    return r->offset;
}

uint64_t journal_reader_count(const struct journal_reader *r)
{
    return r->count;
}

const char *journal_reader_error(const struct journal_reader *r)
{
    return r->status < 0 ? r->error : NULL;
}

void journal_reader_close(struct journal_reader *r)
{
    if (r == NULL)
        return;
    if (r->fp != NULL)
        fclose(r->fp);
    twice__journal__entry__free_unpacked(r->current, NULL);
    twice__journal__entry__free_unpacked(r->header, NULL);
    free(r->buf);
    free(r);
}
