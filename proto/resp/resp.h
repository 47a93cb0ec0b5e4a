/*
 * resp.h - the Redis serialization protocol (RESP2 and RESP3) codec: a resumable message scanner
 * for both directions, an argument iterator, a command/reply pairing FIFO and the encoders for
 * the replies and commands twice synthesises.
 *
 * Pure push-style functions over byte spans, in the shape of hiredis' read.c with its object
 * functions set to NULL (validate and frame, build nothing): no sockets, no libevent, no OpenSSL,
 * no logging and no allocation.  The caller (the proxy session) keeps the bytes, e.g. in an
 * evbuffer, and asks:
 *
 *     resp_scan()               one whole message at the start of buf  -> 1 / 0 need more / <0
 *     resp_scan_release()       forget the start of a long message passed on as it came
 *     resp_scan_command_len()   the length and name of a common command, without a full scan
 *     resp_scan_reply_len()     the length of a common reply, the same way
 *     resp_args_next()          every element of a scanned command or top-level aggregate
 *     resp_view_copy()          an element's bytes (inline words unquoted as Redis does)
 *     resp_pairing_command()    a command was sent: remember what its reply will look like
 *     resp_pairing_simple()     the same for a plain command known by its name alone
 *     resp_pairing_reply()      a reply arrived: which command it answers, or out-of-band
 *     resp_pairing_reply_simple()  the same for the reply to a plain command
 *     resp_encode_*()           replies and commands into a caller buffer
 *
 * Ownership: every view (struct resp_view) is an offset and length into the message the scanner
 * was given; it stays valid while the caller holds those bytes, i.e. until it drains or moves
 * them.  Offsets, not pointers, so that a caller may pull the bytes up again between calls.
 *
 * Every length read from the wire is range-checked before it is used in arithmetic, and every
 * size a peer controls has a named limit below that struct resp_scanner carries (a proxy config
 * may lower it).  Integers are parsed like Redis' string2ll(): an optional '-', no '+', no
 * leading zeros, no overflow.  Errors are 0 or negative codes from RESP_ERRORS().
 */
#ifndef TWICE_RESP_H
#define TWICE_RESP_H

#include "proto/base/must_check.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- limits ------------------------------------------------------------------------------ */

/* Longest bulk string, verbatim string or blob error: Redis' proto-max-bulk-len default. */
#define RESP_MAX_BULK (512ull * 1024 * 1024)
/* Most elements in one aggregate (a map or attribute counts 2 per pair): Redis 7 rejects a
 * multibulk count over INT_MAX ("invalid multibulk length"), so a proxy must not reject less.
 * The scanner never allocates per element, so this bounds arithmetic, not memory. */
#define RESP_MAX_ELEMENTS 2147483647ull
/* Aggregates open at once (attributes included); the 33rd nested aggregate is an error.  Redis'
 * own replies nest a handful of levels (XREADGROUP in RESP2: 4). */
#define RESP_MAX_DEPTH 32u
/* Longest line after a type byte: simple strings, errors, doubles, big numbers, length headers
 * (Redis' PROTO_INLINE_MAX_SIZE bounds its own header lines the same way). */
#define RESP_MAX_LINE (64u * 1024u)
/* Longest inline command line, without its line end: Redis' PROTO_INLINE_MAX_SIZE. */
#define RESP_INLINE_MAX (64u * 1024u)
/* Elements whose views struct resp_msg carries; resp_args_next() walks the rest. */
#define RESP_MSG_VIEWS 16u
/* The longest integer line: "-9223372036854775808". */
#define RESP_INT_LINE_MAX 20u
/* Command names in struct resp_cmd, NUL included ("GEORADIUSBYMEMBER_RO" is 20). */
#define RESP_CMD_NAME_MAX 32u

/* ---- errors ------------------------------------------------------------------------------ */

/* Status codes: 0 or negative, stable and append-only.  resp_strerror() names them. */
#define RESP_ERRORS(X)                                                                             \
    X(OK, 0, "ok")                                                                                 \
    X(E_TYPE, -1, "unknown type byte")                                                             \
    X(E_INTEGER, -2, "malformed integer: sign, leading zero, non-digit or overflow")               \
    X(E_LENGTH, -3, "negative length other than -1, or -1 where no null is allowed")               \
    X(E_LINE_END, -4, "line not ended by CRLF")                                                    \
    X(E_BULK_END, -5, "bulk payload not followed by CRLF")                                         \
    X(E_LINE_TOO_LONG, -6, "line longer than max_line")                                            \
    X(E_BULK_TOO_LONG, -7, "bulk length over max_bulk")                                            \
    X(E_TOO_MANY_ELEMENTS, -8, "aggregate count over max_elements")                                \
    X(E_TOO_DEEP, -9, "aggregates nested deeper than max_depth")                                   \
    X(E_INLINE_TOO_LONG, -10, "inline command longer than max_inline")                             \
    X(E_INLINE_QUOTES, -11, "unbalanced quotes in an inline command")                              \
    X(E_COMMAND, -12, "command element is not a bulk string")                                      \
    X(E_VALUE, -13, "malformed boolean, null, double, big number or verbatim string")              \
    X(E_BUFFER, -14, "output buffer too small")                                                    \
    X(E_ARG, -15, "invalid argument to an encoder")                                                \
    X(E_PAIRING_FULL, -16, "too many commands awaiting a reply")                                   \
    X(E_UNEXPECTED_REPLY, -17, "reply while no command awaits one")                                \
    X(E_MISMATCH, -18, "message bytes differ from what was scanned")

enum resp_status {
#define RESP_STATUS_ENUM(name, code, str) RESP_##name = code,
    RESP_ERRORS(RESP_STATUS_ENUM)
#undef RESP_STATUS_ENUM
};

/* A static string for a status code; "unknown error" for codes not listed. */
const char *resp_strerror(int status);

/* ---- views and messages ------------------------------------------------------------------ */

/* The type byte of a word of an inline command (never a RESP type byte). */
#define RESP_TYPE_INLINE 0

/*
 * One value inside a scanned message.  off is relative to the message start:
 *   bulk '$', verbatim '=', blob error '!'         the payload (len bytes, "txt:" included)
 *   '+', '-', ':', ',', '(', '#'                    the line after the type byte
 *   '*', '%', '~', '>', '|'                        the type byte of the header; len 0; count set
 *   null ($-1, *-1, _)                             null true; len 0
 *   RESP_TYPE_INLINE                               the word as written; quoted words (quotes
 *                                                  or escapes) need resp_view_copy()
 */
struct resp_view {
    size_t off;
    size_t len;
    uint64_t count; /* aggregates: elements, 2 per pair for maps and attributes */
    uint8_t type;   /* the type byte: '$', '+', ':', '*', ... or RESP_TYPE_INLINE */
    bool null;
    bool quoted;
};

/*
 * A whole message found by resp_scan().  For an aggregate reply or a command, elem[] holds the
 * first min(nelem, RESP_MSG_VIEWS) elements (maps: key, value, key, ...); resp_args_next()
 * walks all of them.  Attributes preceding a value are skipped in elem[] and by the iterator.
 */
struct resp_msg {
    size_t len;             /* bytes of the message; on "need more", a lower bound of them */
    uint8_t type;           /* the reply's type byte after any attributes; '*' or RESP_TYPE_INLINE
                               for a command */
    bool push;              /* RESP3 '>' at top level: out-of-band, pair it with no command */
    bool attribute;         /* one or more '|' attributes precede the reply, inside len */
    bool null;              /* $-1, *-1, _ (a client's "*-1" is an empty command, like "*0") */
    bool inline_cmd;        /* a client's inline command line */
    size_t body;            /* offset of the reply after its attributes (0 without) */
    uint64_t nelem;         /* aggregate or command: elements; inline: words; scalars: 0 */
    struct resp_view value; /* the reply itself: its payload, or its aggregate header */
    struct resp_view elem[RESP_MSG_VIEWS];
};

/* ---- scanner ----------------------------------------------------------------------------- */

/* Which direction a scanner reads. */
enum resp_side {
    RESP_SIDE_CLIENT, /* commands: '*' multibulk of bulk strings, or an inline line */
    RESP_SIDE_SERVER, /* replies: any RESP2/RESP3 value */
};

/* One open aggregate (the scanner's task stack, as in hiredis). */
struct resp_level {
    uint8_t type;
    uint64_t count; /* elements in total */
    uint64_t left;  /* elements not yet complete */
};

/*
 * Scanner state for one direction of one connection.  resp_scanner_init() sets the side and the
 * default limits; the caller may then lower max_* (values above the defaults are clamped for
 * max_depth only, whose stack is fixed).  The fields after the limits are private: the progress
 * through a partial message, so that scanning resumes where it stopped and costs O(new bytes).
 */
struct resp_scanner {
    enum resp_side side;
    uint64_t max_bulk;
    uint64_t max_elements;
    uint32_t max_depth;
    size_t max_line;
    size_t max_inline;

    int err;          /* sticky: once negative, every resp_scan() returns it */
    bool started;     /* a message has begun (at least its first byte seen) */
    bool done;        /* the current message is complete */
    bool in_bulk;     /* inside a bulk payload that ends at bulk_end */
    size_t pos;       /* bytes of the current message validated so far */
    size_t scan_from; /* where the search for the current line's end resumes */
    size_t bulk_end;  /* offset of the CRLF after the current bulk payload */
    size_t bulk_off;  /* offset of the current bulk payload */
    uint8_t bulk_type;
    uint32_t depth; /* open aggregates in stack[] */
    struct resp_level stack[RESP_MAX_DEPTH];
    struct resp_msg cur;
};

/* Sets up sc for one direction with the default limits. */
void resp_scanner_init(struct resp_scanner *sc, enum resp_side side);

/* Forgets a partial message and the sticky error; keeps side and limits.  For a caller that
 * discards its buffered bytes (e.g. after an error it reported). */
void resp_scanner_reset(struct resp_scanner *sc);

/*
 * Scans the bytes at the start of buf[0..len), which the caller has positioned at a message
 * boundary.  Returns 1 with *out filled when a whole message is present: consume out->len bytes.
 * Only out->elem[0 .. max(3, min(nelem, RESP_MSG_VIEWS))) are written: read no view past nelem.
 * Returns 0 when more bytes are needed; nothing is consumed and out->len is a lower bound of the
 * message's length (the whole of it once a bulk header has been read); out->type, out->push and
 * out->attribute are set once the first value's header has been read (type 0 before, and while
 * inside a leading attribute), the rest of *out is zero.  Call again with the same
 * bytes followed by more: the scanner resumes where it stopped, so feeding a 64 MiB bulk in 16 KiB
 * pieces costs O(total).  Passing fewer bytes than before restarts the message.
 * Returns a negative code as soon as the bytes seen prove the message invalid; the error is
 * sticky until resp_scanner_reset().
 * Server side: any RESP2/RESP3 value; top-level attributes belong to the reply that follows them
 * and push frames are messages of their own (out->push).  Client side: '*' starts a multibulk
 * whose elements must be bulk strings; any other first byte starts an inline command (as in Redis'
 * processInputBuffer), ended by "\n" or "\r\n" and split into words as sdssplitargs() does.  A
 * client's "*0", "*-1" and blank inline lines are empty commands (nelem 0) that Redis ignores.
 */
int resp_scan(struct resp_scanner *sc, const uint8_t *buf, size_t len,
              struct resp_msg *out) TWICE_MUST_CHECK;

/*
 * Streaming a long server message (a 3,000,000-element LRANGE reply) that the caller passes on
 * unread: after resp_scan() returned 0 on buf[0..len), resp_scan_releasable() is how many bytes
 * at the message's start no later call needs (whole values and headers, the part of a bulk
 * payload already here).  The caller drops n of them (n up to that) and calls
 * resp_scan_release(sc, n); the next resp_scan() is given the bytes after them and resumes as if
 * they were still there.  The message's type byte and count stay in the scanner (out->type,
 * out->push, out->attribute of the next call); its views and out->len then count from the new
 * start, so they do not locate anything the caller dropped: read no view of such a message.
 */
size_t resp_scan_releasable(const struct resp_scanner *sc, size_t len);
void resp_scan_release(struct resp_scanner *sc, size_t n);

/*
 * The length of the command at the start of buf[0..len) when it is the common kind, a multibulk
 * of one or more bulk strings, whole in buf and within sc's limits; *name is then its first
 * element's view.  Returns 0 for anything else (another form, not all here, a limit reached, sc in
 * the middle of a message or failed), which resp_scan() then decides.  Whenever it returns n > 0,
 * resp_scan() on the same bytes would return 1 with len n and elem[0] == *name; it changes
 * nothing in sc.  For a caller that only needs to know where a command ends and what it is named.
 */
size_t resp_scan_command_len(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                             struct resp_view *name);

/* The same for a server's reply of the common kinds (a bulk string, a RESP2 null, a simple
 * string, an error, an integer, an array of bulk strings): its length, *type its first byte,
 * or 0 (then resp_scan() decides). */
size_t resp_scan_reply_len(const struct resp_scanner *sc, const uint8_t *buf, size_t len,
                           uint8_t *type);

/* The header line of a bulk string ('$') or an array ('*') at p[0..n) as the two functions
 * above read it: the type byte, then 1 to 18 plain digits (no sign, no leading zero but "0"),
 * then CRLF.  Returns the line's bytes with *count its number, or 0 for anything else or a line
 * not all here (n >= RESP_LEN_HEADER_MAX holds any line this accepts). */
size_t resp_len_header(const uint8_t *p, size_t n, uint8_t type, uint64_t *count);
#define RESP_LEN_HEADER_MAX 21u

/*
 * A message too long to be handed to resp_scan() in one piece without copying it (it spans
 * buffers), walked header by header: each header read through `peek` (at most
 * RESP_LEN_HEADER_MAX bytes), each payload skipped by its length and its CRLF checked.  Only the
 * kinds the two functions above take: on the client side a multibulk of bulk strings, on the
 * server side a bulk string or an array of bulk strings, of at most RESP_WALK_ELEMENTS_MAX
 * elements.  The message starts at offset `at` of a source holding n > at bytes; peek(src, off,
 * dst, cap) copies up to cap bytes from offset off (< n) and returns how many.  Returns
 * RESP_WALK_WHOLE with w->len the message's length (then resp_scan() on the same bytes returns 1
 * with that length), RESP_WALK_WAIT with w->len a lower bound of it when more bytes are needed,
 * RESP_WALK_NO for any other kind, limit or error (then resp_scan() decides).  w->name_len > 0 once
 * a command's first element is all here, at w->name_off from the message's start.  Of sc only the
 * side and the limits are read: a caller that lets the walker take a message resp_scan() had begun
 * resets the scanner.
 */
enum { RESP_WALK_NO, RESP_WALK_WAIT, RESP_WALK_WHOLE };
/* The most elements resp_walk() takes.  A caller walks a message again from its start when more
 * bytes arrive (each header read costs a walk through the source's buffers): messages of many
 * elements are left to resp_scan(), which resumes where it stopped.  Long values come in
 * commands and replies of few elements (SET, APPEND, PUBLISH, a GET's or an MGET's reply). */
#define RESP_WALK_ELEMENTS_MAX 16u
struct resp_walk {
    size_t len;
    uint8_t type;    /* the first byte */
    uint64_t nelem;  /* an array's elements (a bulk string: 0, as in resp_msg) */
    size_t name_off; /* a command's first element, once here */
    size_t name_len;
};
typedef size_t (*resp_peek_fn)(void *src, size_t off, uint8_t *dst, size_t cap);
int resp_walk(const struct resp_scanner *sc, resp_peek_fn peek, void *src, size_t at, size_t n,
              struct resp_walk *w);
/* resp_walk()'s reader for a message in one buffer (src: a struct resp_flat). */
struct resp_flat {
    const uint8_t *p;
    size_t len;
};
size_t resp_flat_peek(void *src, size_t off, uint8_t *dst, size_t cap);

/* ---- elements ---------------------------------------------------------------------------- */

/* An iterator over the elements of one scanned command or top-level aggregate. */
struct resp_args {
    const uint8_t *buf; /* the message */
    size_t len;         /* its length */
    size_t pos;         /* next element (inline: in the line) */
    size_t end;         /* inline: end of the line's words */
    uint64_t left;      /* elements not yet returned */
    bool inline_cmd;
    int err; /* sticky RESP_E_MISMATCH */
};

/* Starts iterating the elements of m, whose bytes are buf[0..m->len).  A scalar message has no
 * elements.  buf must stay valid while the iterator is used. */
void resp_args_init(struct resp_args *it, const uint8_t *buf, const struct resp_msg *m);

/*
 * Sets *v to the next element, as in struct resp_msg's elem[] (offsets from the message start);
 * nested aggregates are stepped over whole.  Returns 1, 0 after the last element, or
 * RESP_E_MISMATCH when buf does not hold the message that was scanned.
 */
int resp_args_next(struct resp_args *it, struct resp_view *v) TWICE_MUST_CHECK;

/*
 * Copies the bytes of view v of the message in buf (whose length is len) into out[0..cap),
 * unquoting an inline word as Redis does ("a b" -> a b, \x41 -> A, \n, 'it\'s').  Returns the
 * full length of the copy, which may exceed cap (only cap bytes are written then, like
 * snprintf); 0 for nulls and aggregates; RESP_E_MISMATCH when v is not inside buf[0..len).
 */
int resp_view_copy(const uint8_t *buf, size_t len, const struct resp_view *v, uint8_t *out,
                   size_t cap) TWICE_MUST_CHECK;

/* True when view v holds s (a NUL-terminated ASCII string), compared case-insensitively, after
 * unquoting an inline word. */
bool resp_view_equals(const uint8_t *buf, size_t len, const struct resp_view *v, const char *s);

/* Parses view v (an integer reply, a bulk string or an inline word) as a strict integer.
 * Returns 0 with *out set, or RESP_E_INTEGER. */
int resp_view_int(const uint8_t *buf, size_t len, const struct resp_view *v,
                  int64_t *out) TWICE_MUST_CHECK;

/* ---- pairing replies with commands ------------------------------------------------------- */

enum resp_cmd_flag {
    RESP_CMD_BLOCKING = 1u << 0, /* may wait server-side: BLPOP, BRPOP, BLMOVE, BRPOPLPUSH,
                                    BLMPOP, BZPOPMIN, BZPOPMAX, BZMPOP, WAIT, WAITAOF,
                                    XREAD/XREADGROUP BLOCK (not inside MULTI, where they don't) */
    RESP_CMD_QUEUED = 1u << 1,   /* sent inside MULTI: answered by +QUEUED, or an error */
    RESP_CMD_MULTI = 1u << 2,
    RESP_CMD_EXEC = 1u << 3,
    RESP_CMD_DISCARD = 1u << 4,
    RESP_CMD_SUBSCRIBE = 1u << 5, /* (P|S)(UN)SUBSCRIBE: one confirmation per channel */
    RESP_CMD_HELLO = 1u << 6,     /* may switch the protocol version */
    RESP_CMD_RESET = 1u << 7,     /* ends MULTI, subscriptions, CLIENT REPLY OFF; back to RESP2 */
    RESP_CMD_QUIT = 1u << 8,      /* the server closes after +OK */
    RESP_CMD_MONITOR = 1u << 9,   /* after +OK, the server streams +<timestamp> lines */
    RESP_CMD_REJECTED = 1u << 10, /* queued, but answered by an error: EXEC will not run it */
    RESP_CMD_NO_REPLY = 1u << 11, /* CLIENT REPLY OFF/SKIP in force: the server stays silent */
    RESP_CMD_RUN = 1u << 12,      /* with QUEUED: a run of queued commands counted in one slot
                                     (replies of them, answered so far, rejected by an error) */
    RESP_CMD_SYNC = 1u << 13,     /* SYNC, PSYNC: answered by a replication stream (an RDB
                                     transfer, then the commands the server propagates), not
                                     by replies: the connection leaves request and reply */
};

/* The kinds of pub/sub confirmations, as their first element names them. */
enum resp_sub_kind {
    RESP_SUB_NONE,
    RESP_SUB_SUBSCRIBE,
    RESP_SUB_UNSUBSCRIBE,
    RESP_SUB_PSUBSCRIBE,
    RESP_SUB_PUNSUBSCRIBE,
    RESP_SUB_SSUBSCRIBE,
    RESP_SUB_SUNSUBSCRIBE,
};

/* A command sent and awaiting its reply (or replies). */
struct resp_cmd {
    char name[RESP_CMD_NAME_MAX]; /* upper-cased, NUL-terminated; a longer name is cut */
    uint32_t flags;               /* enum resp_cmd_flag */
    uint32_t replies;             /* subscribe family: confirmations expected (0 = as many as
                                     subscriptions of that kind, at least 1); others 1 */
    uint32_t answered;            /* subscribe family: confirmations seen so far */
    uint32_t rejected;            /* a run: its commands answered by an error */
    uint8_t sub_kind;             /* enum resp_sub_kind */
    uint8_t hello_proto;          /* HELLO <v>: v (2 or 3), else 0 */
    uint64_t seq;                 /* 0, 1, 2 ...: the commands passed to resp_pairing_command() */
    uint64_t tag;                 /* the caller's cookie */
};

/*
 * The FIFO of one connection's commands awaiting replies, and what the connection's state does
 * to them: MULTI/EXEC, CLIENT REPLY, subscriptions, the protocol version.  Storage is the
 * caller's: slots[0..cap).  Client-side state (MULTI open, CLIENT REPLY) advances as commands
 * are passed in; server-side state (subscriptions, protocol, MONITOR) as replies are.
 *
 * A transaction never fills the FIFO.  Its queued commands stay in it until EXEC is answered,
 * so a transaction longer than the FIFO would wait for ever for room that only its own EXEC
 * frees (Redis queues a MULTI of any length).  Once a queued command would leave fewer than
 * RESP_PAIRING_ROOM slots free, it and every queued command after it are counted in one slot,
 * a run (RESP_CMD_RUN), so the EXEC always finds a slot.  A caller that can grow the FIFO does
 * so before that point, and keeps each command in a slot of its own.
 */
#define RESP_PAIRING_ROOM 2u
struct resp_pairing {
    struct resp_cmd *slots;
    size_t cap;
    size_t head;  /* oldest slot */
    size_t count; /* slots in use: queued commands kept for EXEC, then commands awaiting replies */
    size_t kept;  /* the first `kept` slots: queued commands already answered by +QUEUED/error */
    uint64_t seq;
    bool in_multi;  /* client side: MULTI sent, EXEC/DISCARD/RESET not yet */
    bool reply_off; /* client side: CLIENT REPLY OFF in force */
    bool skip_next; /* client side: CLIENT REPLY SKIP silences the next command */
    uint8_t proto;  /* 2 or 3, after HELLO replies */
    bool monitor;
    uint64_t channels, patterns, shard_channels; /* from the confirmations' counts */
    /* The EXEC reply last matched: its queued commands, valid until the next call. */
    size_t tx_first, tx_n;
    bool tx_rejected; /* or a run among them: resp_pairing_tx() walks the slots */
    bool general;     /* tests: every command and reply takes the general path (no shortcut) */
};

/* Sets up an empty pairing for a new RESP2 connection, using slots[0..cap) as its FIFO. */
void resp_pairing_init(struct resp_pairing *p, struct resp_cmd *slots, size_t cap);

/*
 * Notes that the client sent command m (a message from a client-side scanner, bytes in buf).
 * Returns 1 when the server will reply (the command is queued; *cmd, if not NULL, is a copy),
 * 0 when it will not: an empty command, or CLIENT REPLY OFF / SKIP in force (then *cmd has
 * RESP_CMD_NO_REPLY), or RESP_E_PAIRING_FULL when all cap slots are in use (nothing is recorded:
 * stop reading the client until replies drain).  tag is stored in the command.
 * Inside MULTI, CLIENT REPLY and HELLO take effect at EXEC, which is not modelled.
 */
int resp_pairing_command(struct resp_pairing *p, const struct resp_msg *m, const uint8_t *buf,
                         uint64_t tag, struct resp_cmd *cmd) TWICE_MUST_CHECK;
/* The same, for a caller that has already read the command's name: `name` is its first element
 * upper-cased (ASCII) and cut to RESP_CMD_NAME_MAX - 1 bytes, as resp_pairing_command() would
 * make it. */
int resp_pairing_command_named(struct resp_pairing *p, const struct resp_msg *m, const uint8_t *buf,
                               const char *name, uint64_t tag,
                               struct resp_cmd *cmd) TWICE_MUST_CHECK;

/* The same for a command known by its name alone (n bytes, upper-cased as above, no NUL), with
 * at least one element: when it is plain (answered by exactly one reply, changing no state:
 * not MULTI, CLIENT, SUBSCRIBE, a blocking command...) and the connection is in its plain
 * state (no MULTI open, no CLIENT REPLY OFF / SKIP), records it and returns 1, as
 * resp_pairing_command_named() would; RESP_E_PAIRING_FULL as there; 0, recording nothing, for
 * any other command or state (then call resp_pairing_command_named()). */
int resp_pairing_simple(struct resp_pairing *p, const char *name, size_t n, uint64_t tag,
                        struct resp_cmd *cmd) TWICE_MUST_CHECK;

/* The command's name as the pairing reads it: its first element upper-cased (ASCII), cut to
 * RESP_CMD_NAME_MAX - 1 bytes, into name[RESP_CMD_NAME_MAX]; empty when it holds a NUL byte (Redis
 * has no such command, and a prefix must not pass for MULTI or EXEC).  Returns its length. */
size_t resp_cmd_name_copy(const uint8_t *buf, const struct resp_msg *m, char *name);

/* The same from a name's bytes s[0..n) (a bulk string's payload, as it is on the wire). */
size_t resp_cmd_name_bytes(const uint8_t *s, size_t n, char *name);

/* x[0..n) == y[0..n) for w <= n <= 2w, by two loads of w bytes from each (w: 4 or 8, a constant
 * once inlined, so that each memcpy compiles to one load). */
static inline bool resp_eq_ends(const uint8_t *x, const uint8_t *y, size_t n, size_t w)
{
    uint64_t x0 = 0, x1 = 0, y0 = 0, y1 = 0;
    memcpy(&x0, x, w);
    memcpy(&x1, x + n - w, w);
    memcpy(&y0, y, w);
    memcpy(&y1, y + n - w, w);
    return ((x0 ^ y0) | (x1 ^ y1)) == 0;
}

/* Whether a[0..n) and b[0..n) are equal (a command's name): below 16 bytes without a call to
 * memcmp. */
static inline bool resp_small_eq(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    if (n >= 16)
        return memcmp(x, y, n) == 0;
    if (n >= 8)
        return resp_eq_ends(x, y, n, 8);
    if (n >= 4)
        return resp_eq_ends(x, y, n, 4);
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return false;
    return true;
}

/* The flags the command table gives a command by its name alone (upper-cased, n bytes):
 * RESP_CMD_MULTI, RESP_CMD_SYNC..., or 0 for a command that changes nothing of the pairing
 * (GET, SET...).  Flags that depend on the arguments (XREAD BLOCK) are not included. */
uint32_t resp_cmd_name_flags(const char *name, size_t n);

/* Whether every name of the command table is found under its first letter (for tests). */
bool resp_cmd_table_ok(void);

/* What a reply answers. */
struct resp_match {
    struct resp_cmd cmd; /* the command answered */
    bool last;           /* the command expects no further reply (false for all but the last
                            confirmation of a multi-channel (UN)SUBSCRIBE) */
    bool queued;         /* the +QUEUED (or the error) of a command sent inside MULTI */
    bool exec_aborted;   /* EXEC answered by an error (EXECABORT) or a null (WATCH) */
    size_t ntx;          /* EXEC answered by an array: its elements answer resp_pairing_tx(0..) */
};

/*
 * Notes that reply m (from a server-side scanner, bytes in buf) arrived.  Returns 1 with *match
 * set when it answers the oldest command awaiting a reply; 0 when it is out-of-band and answers
 * nothing: a RESP3 push (other than a (un)subscribe confirmation awaited), a RESP2 pub/sub message
 * while subscribed, a MONITOR line; RESP_E_UNEXPECTED_REPLY when no command awaits a reply.
 */
int resp_pairing_reply(struct resp_pairing *p, const struct resp_msg *m, const uint8_t *buf,
                       struct resp_match *match) TWICE_MUST_CHECK;

/* The same for a reply known by its first byte alone (type; '>' a RESP3 push, '|' an
 * attribute): when the command at the head is a plain one (one reply, no state, as
 * resp_pairing_simple() records) and nothing can come out of band (no subscription, no MONITOR,
 * not a push), removes that command and returns 1, as resp_pairing_reply() would with
 * match.last; otherwise 0, changing nothing (then call resp_pairing_reply()). */
int resp_pairing_reply_simple(struct resp_pairing *p, uint8_t type) TWICE_MUST_CHECK;

/* Whether resp_pairing_reply_simple() would take a reply of this type now, changing nothing: a
 * caller that passes a long reply on before its end checks here at its start. */
bool resp_pairing_reply_plain(const struct resp_pairing *p, uint8_t type);

/* After resp_pairing_reply() matched an EXEC array: the queued command its element i answers
 * (i < match->ntx), or NULL.  Valid until the next call on p. */
const struct resp_cmd *resp_pairing_tx(const struct resp_pairing *p, size_t i);

/* The oldest command awaiting a reply, or NULL.  Valid until the next call on p. */
const struct resp_cmd *resp_pairing_head(const struct resp_pairing *p);

/* Commands awaiting a reply (queued commands already answered by +QUEUED not included). */
size_t resp_pairing_pending(const struct resp_pairing *p);

/* ---- encoders ---------------------------------------------------------------------------- */

/*
 * Each writes one complete message at the start of buf[0..cap) and returns its length, or
 * RESP_E_BUFFER when cap is too small (or the message would exceed INT_MAX bytes), RESP_E_ARG
 * for a simple string or error containing CR or LF.  Nothing is promised about buf after an
 * error.  proto is the connection's protocol version (2 or 3, as struct resp_pairing.proto).
 */

/* A command: *argc then argc bulk strings.  argvlen may be NULL for NUL-terminated argv. */
int resp_encode_command(uint8_t *buf, size_t cap, size_t argc, const char *const *argv,
                        const size_t *argvlen) TWICE_MUST_CHECK;
/* +s\r\n, e.g. "OK", "QUEUED". */
int resp_encode_simple(uint8_t *buf, size_t cap, const char *s) TWICE_MUST_CHECK;
/* -s\r\n, s being "CODE message", e.g. "READONLY You can't write against a read only
 * replica.". */
int resp_encode_error(uint8_t *buf, size_t cap, const char *s) TWICE_MUST_CHECK;
/* :v\r\n. */
int resp_encode_integer(uint8_t *buf, size_t cap, int64_t v) TWICE_MUST_CHECK;
/* $len\r\n<bytes>\r\n. */
int resp_encode_bulk(uint8_t *buf, size_t cap, const void *p, size_t len) TWICE_MUST_CHECK;
/* A null bulk string: $-1 in RESP2, _ in RESP3. */
int resp_encode_null(uint8_t *buf, size_t cap, int proto) TWICE_MUST_CHECK;
/* A null array (BRPOP/XREAD timeout, EXEC after WATCH): *-1 in RESP2, _ in RESP3. */
int resp_encode_null_array(uint8_t *buf, size_t cap, int proto) TWICE_MUST_CHECK;
/* *n\r\n: an array header; the caller appends the n elements. */
int resp_encode_array(uint8_t *buf, size_t cap, uint64_t n) TWICE_MUST_CHECK;
/* +QUEUED\r\n: the reply to a command inside MULTI. */
int resp_encode_queued(uint8_t *buf, size_t cap) TWICE_MUST_CHECK;
/* An EXEC reply: *n then the n already-encoded replies replies[i][0..lens[i]). */
int resp_encode_exec(uint8_t *buf, size_t cap, size_t n, const uint8_t *const *replies,
                     const size_t *lens) TWICE_MUST_CHECK;

#endif
