/*
 * pump.h - the one frame pump under every protocol codec.
 *
 * A codec (RESP, AMQP) walks the frames of what a side sent and, for each, tells the pump what
 * becomes of it: pass it on unchanged, drop it, hold it (move it into a buffer of the codec's
 * that waits for a timer or a decision), or inject bytes of twice's own toward a side; and
 * flush, once a read is done.  The pump owns the bytes on their way:
 *
 *   in[side]   what side sent, not processed yet: the session's read buffer while a read is
 *              processed (borrowed, no copy), else the pump's own (what a read left: a frame
 *              cut short, a command held at the head)
 *   run[side]  the head of in[side] passed on already but not moved: a pipeline of frames
 *              that go on unchanged costs one move, made when something else needs in[side]'s
 *              head or out[other side] (the rule every operation below keeps: it settles the
 *              run first)
 *   win[side]  a view of in[side]'s first chain while its head is unchanged, for the codec to
 *              scan frames in place at the run's end
 *   out[side]  what goes toward side at the next flush, in order
 *
 * Frames that go on move by reference (codec_move: a large read's chain is shared, not
 * copied); frames held are copied (they wait, and a shared chain would pin the whole read).
 *
 * One out-of-memory policy: when an allocation on the way fails, the pump stops.  What it had
 * batched (out[], where a move that failed part-way may have left half a frame) is dropped
 * with the session, which the port closes at once with the reason logged ("out of memory"
 * and what the pump was doing).  Never a half-written frame; after that every operation is a
 * no-op returning -1, and the codec sees its session is no longer relaying.
 *
 * The pump reaches the session only through its port (struct pump_port): the real one sends
 * to the session's ends; a test's fake port (tests/lib/fake_pump.h) keeps what each side
 * would have received, so that a codec's decisions run with no socket.
 */
#ifndef TWICE_PUMP_H
#define TWICE_PUMP_H

#include <event2/buffer.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/base/must_check.h"
#include "proxy/net/session.h"

/* What the pump and its codec ask of the session.  ctx is the port's (the session). */
struct pump_port {
    /* Hands all of buf's bytes toward `to` (buf is left empty); -1 when the session no longer
     * sends (its bytes are dropped). */
    int (*send)(void *ctx, enum session_side to, struct evbuffer *buf);
    /* Ends the session with `reason`: at once (flush_to < 0), or once what was already sent
     * to side flush_to is written. */
    void (*abort)(void *ctx, enum session_close_reason reason, int flush_to);
    /* The pump ran out of memory doing `what`: the session ends at once, the reason logged. */
    void (*fail)(void *ctx, const char *what);
    /* The codec holds too much of what side sent: reading it stops (hold) or resumes. */
    void (*hold_reading)(void *ctx, enum session_side side, bool hold);
    /* Reading side stops once its input holds this many bytes (0: the session's default). */
    void (*set_read_limit)(void *ctx, enum session_side side, size_t bytes);
};

/* The port of a real session (session.c). */
extern const struct pump_port session_pump_port;

struct pump_window {
    const uint8_t *p; /* NULL: none open */
    size_t len;
};

struct pump {
    const struct pump_port *port;
    void *ctx;
    struct evbuffer *in[2];
    struct evbuffer *own[2]; /* what a read left, when the pump keeps it (PUMP_KEEP_REST) */
    size_t run[2];
    struct pump_window win[2];
    struct evbuffer *out[2];
    const char *failed; /* what the pump was doing when memory ran out; NULL while it runs */
};

/* What a read leaves in the session's read buffer: the pump takes it into its own (RESP: the
 * codec works on what is left between reads, a held command at the head), or leaves it there
 * (AMQP: a frame cut short stays in the session's buffer, whose read limit bounds it). */
enum pump_rest { PUMP_KEEP_REST, PUMP_LEAVE_REST };

/* An empty pump on port/ctx.  -1 when memory runs out (nothing to free then). */
TWICE_MUST_CHECK int pump_init(struct pump *p, const struct pump_port *port, void *ctx,
                               enum pump_rest rest);
/* Frees the pump's buffers; bytes still in them are dropped.  The pump struct is the
 * caller's. */
void pump_free(struct pump *p);

/* A read being processed: where pump_read_begin() found the pump, for pump_read_end() (an
 * AMQP codec processes frames of its own from inside a read). */
struct pump_read {
    struct evbuffer *in;
    size_t run;
    struct pump_window win;
    bool borrowed;
};

/* Side `from` sent what is in `in` (the session's read buffer): it becomes in[from] for the
 * codec to walk.  PUMP_KEEP_REST: appended to what an earlier read left (and its run), or
 * borrowed as it is when nothing was left.  PUMP_LEAVE_REST: borrowed, walked from its head
 * (what in[from] was is saved).  `in` must stay valid until pump_read_end(). */
void pump_read_begin(struct pump *p, enum session_side from, struct evbuffer *in,
                     struct pump_read *saved);
/* The read is done.  PUMP_KEEP_REST: what the read left (a run not flushed too) moves into
 * the pump's own buffer.  PUMP_LEAVE_REST: it stays in the session's buffer, and in[from],
 * its run and window are what they were before the read (a codec flushes before ending a
 * read: a run left unflushed is not sent). */
void pump_read_end(struct pump *p, enum session_side from, const struct pump_read *saved);

static inline enum session_side pump_other(enum session_side side)
{
    return side == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
}

static inline bool pump_failed(const struct pump *p)
{
    return p->failed != NULL;
}

/* The next n bytes of in[from] after the run go on unchanged: the run grows over them (not
 * once the pump stopped). */
static inline void pump_pass(struct pump *p, enum session_side from, size_t n)
{
    if (p->failed == NULL)
        p->run[from] += n;
}

/* The bytes of in[from] after the run: read, not yet walked or given a fate. */
static inline size_t pump_rest(const struct pump *p, enum session_side from)
{
    return p->in[from] != NULL ? evbuffer_get_length(p->in[from]) - p->run[from] : 0;
}

/* The window over in[from]'s first chain, opened when none is: NULL when in[from] is empty
 * (or the pump stopped).  Valid until something settles the run or changes in[from]. */
const struct pump_window *pump_window(struct pump *p, enum session_side from);
/* The first len bytes of in[from] in its first chain (pulled up: copied together when they
 * lie in several), and the window over that chain.  NULL when in[from] holds fewer, or when
 * memory ran out (the pump stopped). */
const struct pump_window *pump_window_pullup(struct pump *p, enum session_side from, size_t len);

/* Each operation below returns 0, or -1 when the pump stopped (memory ran out now or
 * before).  The result may go unread where the codec asks whether its session still relays
 * before it goes on: a stopped pump has closed it. */

/* Moves the run of in[from] to out[other side] and closes the window. */
int pump_settle(struct pump *p, enum session_side from);

/* The n bytes of in[from] after the run (settled first) go on now toward the other side:
 * moved, shared where large.  0 or -1 (out of memory; or fewer than n bytes: a codec's bug,
 * logged the same way). */
int pump_forward(struct pump *p, enum session_side from, size_t n);
/* ... are dropped. */
int pump_drop(struct pump *p, enum session_side from, size_t n);
/* ... are appended to dst (a buffer of the codec's that waits): copied. */
int pump_hold(struct pump *p, enum session_side from, size_t n, struct evbuffer *dst);

/* Bytes of twice's own toward `to`, after everything passed on toward it so far (the run
 * from the other side is settled first).  pump_inject_buffer() takes all of buf's bytes. */
int pump_inject(struct pump *p, enum session_side to, const void *data, size_t len);
int pump_inject_buffer(struct pump *p, enum session_side to, struct evbuffer *buf);

/* Sends what goes toward `to`: the run from the other side, then out[to].  When all that is
 * the run and it is all of in[other] (a read that goes on as it came), in[other] is handed to
 * the port as it is, not moved through out. */
void pump_flush(struct pump *p, enum session_side to);

/* Stops the pump for lack of memory while doing `what` (see the policy above).  Codecs call
 * it for an allocation of their own on a frame's way (a rewritten frame, a stash). */
void pump_fail(struct pump *p, const char *what);

/* The rest of the port, for the codec: each does nothing once the pump stopped. */
void pump_abort(struct pump *p, enum session_close_reason reason, int flush_to);
void pump_hold_reading(struct pump *p, enum session_side side, bool hold);
void pump_set_read_limit(struct pump *p, enum session_side side, size_t bytes);

#endif
