/*
 * journal_reader.h - the journal file format: length-delimited protobuf
 * entries (proto/journal/journal.proto), decoded and encoded.
 *
 * Two layers, in the shape of the other codecs in proto/:
 *
 *   - journal_decode_entry() / journal_encode_entry() work on byte spans and
 *     do no I/O.  The decoder is resumable at any byte: given a prefix of an
 *     entry it asks for more.
 *   - struct journal_reader reads a file with stdio and hands out one entry at
 *     a time.  A file whose last entry is cut short (a writer killed
 *     mid-write) ends iteration cleanly and is reported as truncated.  A
 *     damaged entry is skipped and reported (journal_reader_damage()): in a
 *     journal whose entries carry their checksum, reading goes on at the next
 *     entry that checks out; in one without, it stops there.
 *
 * Pure C over protobuf-c: no libevent, no OpenSSL.
 */
#ifndef TWICE_JOURNAL_READER_H
#define TWICE_JOURNAL_READER_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/journal/journal.pb-c.h"

/* Largest encoded Entry (without its length prefix, with its checksum).  A
 * length prefix above it is an error, whatever the bytes after it. */
#define JOURNAL_RECORD_MAX (1024u * 1024u)
/* The checksum every entry ends with (journal.proto's Entry.crc32c): the tag
 * byte of field 15 as a fixed32, then the CRC-32C of the entry's bytes before
 * it, little-endian. */
#define JOURNAL_CRC_TAG 0x7du
#define JOURNAL_CRC_LEN 5u
/* A varint length prefix is at most this long (a uint64). */
#define JOURNAL_VARINT_MAX 10u
/* Journal format version this code writes and reads. */
#define JOURNAL_FORMAT_VERSION 1u

/* Status codes: 0 or negative, stable.  journal_strerror() names them. */
#define JOURNAL_ERRORS(X)                                                                          \
    X(OK, 0, "ok")                                                                                 \
    X(ERR_IO, -1, "I/O error")                                                                     \
    X(ERR_NOMEM, -2, "out of memory")                                                              \
    X(ERR_VARINT, -3, "malformed length prefix")                                                   \
    X(ERR_TOO_LARGE, -4, "entry larger than the 1 MiB limit")                                      \
    X(ERR_DECODE, -5, "entry is not a valid protobuf Entry")                                       \
    X(ERR_NO_HEADER, -6, "first entry is not a journal header")                                    \
    X(ERR_VERSION, -7, "unsupported journal format version")                                       \
    X(ERR_SPACE, -8, "output buffer too small")                                                    \
    X(ERR_EMPTY, -9, "journal is empty (no header)")                                               \
    X(ERR_TRUNCATED, -10, "journal ends inside its header")                                        \
    X(ERR_CHECKSUM, -11, "entry fails its checksum")                                               \
    X(ERR_PAST_END, -12, "length prefix runs past the end of the file")

enum journal_status {
#define JOURNAL_STATUS_ENUM(name, code, str) JOURNAL_##name = code,
    JOURNAL_ERRORS(JOURNAL_STATUS_ENUM)
#undef JOURNAL_STATUS_ENUM
};

/* A static string for a status code; "unknown error" for codes not listed. */
const char *journal_strerror(int status);

/*
 * Decodes the entry at the start of buf[0..len); with `crc`, it must end with
 * its checksum (a journal whose header has entry_crc32c), which is checked and
 * left out of *out.
 * Returns 1 and sets *out (caller frees with twice__journal__entry__free_unpacked)
 * and *used (bytes consumed, prefix included); 0 when buf holds only a prefix of
 * an entry (feed more bytes, nothing consumed); or a negative JOURNAL_ERR_*
 * (ERR_VARINT, ERR_TOO_LARGE, ERR_CHECKSUM, ERR_DECODE, ERR_NOMEM).  On
 * ERR_CHECKSUM and ERR_DECODE the entry's bytes were all there: *used is how
 * many its prefix announced.  Never reads past len.
 */
int journal_decode_entry(const uint8_t *buf, size_t len, bool crc, size_t *used,
                         Twice__Journal__Entry **out) TWICE_MUST_CHECK;

/* CRC-32C (Castagnoli) of p[0..n): the checksum of an entry.  With SSE4.2 on x86-64, where
 * the CPU has it; journal_crc32c_portable() is the table-driven code every other CPU runs (the
 * tests compare the two). */
uint32_t journal_crc32c(const uint8_t *p, size_t n);
uint32_t journal_crc32c_portable(const uint8_t *p, size_t n);

/* Bytes journal_encode_entry() writes for e: the varint prefix, the message and
 * its checksum. */
size_t journal_entry_encoded_size(const Twice__Journal__Entry *e);

/*
 * Writes the length-delimited form of e (varint byte count, then the message
 * ending with its checksum; e->crc32c is ignored) into out[0..cap) and sets
 * *written.  Returns 0, JOURNAL_ERR_TOO_LARGE when the message exceeds
 * JOURNAL_RECORD_MAX, or JOURNAL_ERR_SPACE when cap is too small (nothing is
 * written in either case).
 */
int journal_encode_entry(const Twice__Journal__Entry *e, uint8_t *out, size_t cap,
                         size_t *written) TWICE_MUST_CHECK;

/*
 * The same for an entry holding record r, written field by field: the bytes protobuf-c's
 * journal_encode_entry() writes for it (test_journal compares them), without its reflection
 * over the descriptors (three passes over every field per record, a fifth of a journaled job's
 * instructions).  On JOURNAL_ERR_SPACE, *written is the room needed.
 */
int journal_encode_record_entry(const Twice__Journal__Record *r, uint8_t *out, size_t cap,
                                size_t *written) TWICE_MUST_CHECK;

/*
 * Bytes at the end of buf[0..len), the last bytes of a journal whose entries carry their
 * checksum (at least 2 * (JOURNAL_RECORD_MAX + JOURNAL_VARINT_MAX) of them, or the whole
 * file), that are a last entry cut short: a strict prefix of an entry after the last whole
 * entry that checks out.  0 when buf ends with a whole entry, holds none, or ends with bytes
 * that are no prefix of one (damage, which the reader names).  A writer that appends a run
 * cuts them off first, so that the new run's header follows a whole entry.
 */
size_t journal_tail_cut_short(const uint8_t *buf, size_t len);

/* Appends the varint form of v to out (JOURNAL_VARINT_MAX bytes of room);
 * returns the number of bytes written. */
size_t journal_put_varint(uint8_t *out, uint64_t v);

/*
 * Length of the valid UTF-8 character starting at p (1..4), or 0 when p starts
 * an invalid sequence (overlong, surrogate, past U+10FFFF, cut short).  Reads
 * only continuation bytes after p[0], so a NUL-terminated string is never
 * read past its NUL.  proto3 `string` fields must be valid UTF-8.
 */
size_t journal_utf8_char_len(const unsigned char *p);

struct journal_reader;

/*
 * Opens the journal at path and reads its header.  Returns a reader the
 * caller closes with journal_reader_close(), or NULL with a message in err
 * (cannot open, empty, cut inside the header, first entry not a header,
 * unsupported version, or a decoding error).
 */
struct journal_reader *journal_reader_open(const char *path, char *err,
                                           size_t errlen) TWICE_MUST_CHECK;

/* The header read by journal_reader_open(); owned by the reader. */
const Twice__Journal__Header *journal_reader_header(const struct journal_reader *r);

/*
 * Reads the next entry after the header, past any damage (journal_reader_damage()).
 * Returns 1 and sets *out; 0 at the end of the journal (clean, or a cut-short
 * last entry: see journal_reader_truncated()); or a negative JOURNAL_ERR_*
 * code (I/O, memory), which is sticky: later calls return it again, and
 * journal_reader_error() says what and where.  The entry is owned by the reader and valid until the
 * next call to journal_reader_next() or journal_reader_close().  Entries whose body a newer writer
 * added are returned with body_case NOT_SET: skip them.  A header entry starts a later run
 * (journal_reader_runs()).
 */
int journal_reader_next(struct journal_reader *r,
                        const Twice__Journal__Entry **out) TWICE_MUST_CHECK;

/*
 * A journal of several runs (`journal PATH append`): each later run starts with its own
 * header, which journal_reader_next() returns as an entry (body_case HEADER) before the run's
 * records.  Its checksums are read as the first header says (a writer appends only to a
 * journal with them).  The runs read so far, the first included (1 after opening).
 */
uint64_t journal_reader_runs(const struct journal_reader *r);

/* Runs read so far that ended without a stop record, not counting the last (whose end
 * journal_reader_clean_stop() tells): another run's header followed them. */
uint64_t journal_reader_unclean_runs(const struct journal_reader *r);

/* True once journal_reader_next() hit a last entry that was cut short. */
bool journal_reader_truncated(const struct journal_reader *r);

/* True when the last entry read is a `stop` record: the writer stopped in good order.  A
 * journal read to its end without one was cut short by a kill or a crash. */
bool journal_reader_clean_stop(const struct journal_reader *r);

/* Bytes of the file read so far: whole entries and the damaged bytes skipped. */
uint64_t journal_reader_offset(const struct journal_reader *r);

/* Stretches of damage kept for journal_reader_damage_at() (the summary counts them all). */
#define JOURNAL_DAMAGE_KEPT 16

/* One stretch of damaged bytes the reader skipped. */
struct journal_damage {
    uint64_t offset;      /* file offset of its first byte */
    uint64_t bytes;       /* how many were skipped */
    int64_t records_lost; /* 1 when the damaged entry's length prefix held; -1: not known */
    int reason;           /* the JOURNAL_ERR_* its first entry gave */
    bool resumed;         /* an entry that checks out follows: reading went on */
};

/* All the damage of the journal read so far. */
struct journal_damage_summary {
    uint64_t stretches;
    uint64_t bytes;        /* skipped in all */
    uint64_t records_lost; /* of the stretches that know it */
    bool records_unknown;  /* some stretch lost an unknown number of records */
    bool stopped;          /* the last stretch runs to the end of the file */
};

/* The damage met so far (all zero when none). */
void journal_reader_damage(const struct journal_reader *r, struct journal_damage_summary *sum);

/* The i-th stretch of damage, i < JOURNAL_DAMAGE_KEPT, or NULL; owned by the reader. */
const struct journal_damage *journal_reader_damage_at(const struct journal_reader *r, size_t i);

/* Entries returned by journal_reader_next() so far (the header not counted). */
uint64_t journal_reader_count(const struct journal_reader *r);

/* The sticky error as text ("offset 1234: entry larger than ..."), or NULL. */
const char *journal_reader_error(const struct journal_reader *r);

/* Frees the reader, its current entry and its header.  NULL is a no-op. */
void journal_reader_close(struct journal_reader *r);

#endif
