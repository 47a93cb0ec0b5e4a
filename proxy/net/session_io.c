/*
 * session_io.c - direct reads and writes of a relaying plain TCP end (session_internal.h).
 *
 * A bufferevent writes on the loop turn after bytes are queued and turns EPOLLOUT on and off
 * around every write; a direct end instead keeps EV_WRITE off, is listed for its loop's
 * flusher when bytes are queued, and is written with one writev; EV_WRITE is turned on only
 * when the kernel takes less than all of it.  Reads are one readv of up to the end's read
 * limit, into a block of the thread's cache while reads stay small (see "Read blocks"),
 * relayed at once.  session.c's top comment has the whole design.
 */
#include "proxy/net/session_internal.h"

/* ---- direct I/O: one readv, one writev ------------------------------------------------- */

/* Bounds of what one direct read asks for. */
#define DIRECT_READ_MIN (16u * 1024u)
#define DIRECT_READ_MAX (256u * 1024u)

/*
 * Read blocks.  A read of small messages (a job, a command, an ack) into a
 * fresh evbuffer chain cost a malloc and a free of 16 KiB each, past glibc's
 * per-thread cache: about a tenth of a parsed listener's instructions on a
 * job load.  While an end's reads stay small, a read into an empty input
 * goes into a 16 KiB block of the thread's block cache (blockcache.h) instead, handed to
 * the input by reference (evbuffer_add_reference); libevent calls
 * read_block_put() when the last chain that uses it is freed (written,
 * dropped, or released by a reference that shared it), and the block goes
 * back to the cache.  No byte is copied.  A block's chain is immutable:
 * nothing is ever appended into its spare room, so reads of large traffic
 * (which fill a read) keep the chains libevent allocates, whose room the
 * next read fills.
 */

/* libevent's cleanup of a block's chain (evbuffer_ref_cleanup_cb). */
static void read_block_put(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    blockcache_free(arg);
}

/* One read of up to `want` (at most DIRECT_READ_MIN) bytes into a block,
 * added to `in`: what read() returns, errno kept. */
static ssize_t read_pooled(evutil_socket_t fd, struct evbuffer *in, size_t want)
{
    uint8_t *b = blockcache_malloc(DIRECT_READ_MIN);
    if (b == NULL) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t n = read(fd, b, want);
    int err = errno;
    if (n > 0 && evbuffer_add_reference(in, b, (size_t)n, read_block_put, b) == 0)
        return n;
    /* Not added: the bytes, if any, are copied (out of memory for the
     * chain's header), else the read failed or ended. */
    if (n > 0 && evbuffer_add(in, b, (size_t)n) != 0) {
        n = -1;
        err = ENOMEM;
    }
    blockcache_free(b);
    errno = err;
    return n;
}

size_t sess_read_limit(const struct session_end *e)
{
    return e->read_limit > SESSION_INPUT_HIGH ? e->read_limit : SESSION_INPUT_HIGH;
}

/* Add or remove a direct end's read event to match rd_want and the input. */
void sess_rd_update(struct session_end *e)
{
    if (e->rd == NULL)
        return;
    bool arm = e->rd_want && e->bev != NULL && evbuffer_get_length(e->din) < sess_read_limit(e);
    if (arm != e->rd_armed && (arm ? event_add(e->rd, NULL) : event_del(e->rd)) == 0)
        e->rd_armed = arm;
}

/* Reading from side `side` on or off. */
void sess_set_reading(struct session *s, enum session_side side, bool on)
{
    struct session_end *e = &s->end[side];
    if (e->bev == NULL)
        return;
    if (e->rd != NULL) {
        e->rd_want = on;
        sess_rd_update(e);
    } else if (on) {
        bufferevent_enable(e->bev, EV_READ);
    } else {
        bufferevent_disable(e->bev, EV_READ);
    }
}

/* A direct end is readable: one readv into its input, then relay. */
static void on_direct_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct session_end *e = arg;
    struct session *s = e->owner;
    struct bufferevent *bev = e->bev;
    struct evbuffer *in = e->din;
    size_t len = evbuffer_get_length(in), limit = sess_read_limit(e);
    if (len >= limit) {
        sess_rd_update(e);
        return;
    }
    /* A read asks for what the last ones needed, from 16 KiB (a heap chunk
     * malloc reuses) doubling while reads come back full, up to the limit:
     * asking 256 KiB every time made glibc grow and trim the heap per read. */
    if (e->read_size == 0)
        e->read_size = DIRECT_READ_MIN;
    size_t want = limit - len < e->read_size ? limit - len : e->read_size;
    struct evbuffer_iovec vec[2];
    ssize_t n = -1;
    int err = ENOMEM;
    /* Small reads into an empty input: a read block (see above). */
    int nvec = len == 0 && e->read_size == DIRECT_READ_MIN
                   ? 0
                   : evbuffer_reserve_space(in, (ev_ssize_t)want, vec, 2);
    if (nvec == 0) {
        n = read_pooled(fd, in, want);
        err = errno;
    } else if (nvec > 0) {
        struct iovec iov[2];
        size_t room = 0;
        for (int i = 0; i < nvec; i++) {
            iov[i].iov_base = vec[i].iov_base;
            iov[i].iov_len = room + vec[i].iov_len > want ? want - room : vec[i].iov_len;
            room += iov[i].iov_len;
        }
        n = readv(fd, iov, nvec);
        err = errno;
        size_t left = n > 0 ? (size_t)n : 0;
        for (int i = 0; i < nvec; i++) {
            vec[i].iov_len = iov[i].iov_len < left ? iov[i].iov_len : left;
            left -= vec[i].iov_len;
        }
        evbuffer_commit_space(in, vec, n > 0 ? nvec : 0);
    }
    if (n > 0 && (size_t)n == want && want == e->read_size && e->read_size < DIRECT_READ_MAX)
        e->read_size *= 2;
    else if (n > 0 && (size_t)n < e->read_size / 8 && e->read_size > DIRECT_READ_MIN)
        e->read_size /= 2;
    if (n > 0) {
        sess_on_read(bev, s);
        return;
    }
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
        return;
    /* EOF or an error: reported as the bufferevent would, reading off. */
    e->rd_want = false;
    sess_rd_update(e);
    errno = n == 0 ? 0 : err;
    sess_on_event(bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), s);
}

/* Write what is queued toward `e` now (see the top of this file). */
static void flush_end(struct session_end *e)
{
    struct session *s = e->owner;
    struct bufferevent *bev = e->bev;
    if (bev == NULL)
        return;
    struct evbuffer *out = bufferevent_get_output(bev);
    if (e->rd == NULL || s->state != SESSION_RELAYING) {
        if (evbuffer_get_length(out) > 0)
            bufferevent_enable(bev, EV_WRITE);
        return;
    }
    bool left; /* bytes wait in the bufferevent's output */
    if (evbuffer_get_length(out) > 0) {
        /* What libevent still has to write goes first, and ours after it.
         * A socket bufferevent freezes the front of its output between its
         * own writes; thaw it for this one as bufferevent_writecb does. */
        evbuffer_add_buffer(out, e->dout);
        evbuffer_unfreeze(out, 1);
        (void)evbuffer_write(out, e->fd);
        evbuffer_freeze(out, 1);
        left = evbuffer_get_length(out) > 0;
    } else {
        /* The usual case: the kernel takes all of dout, and nothing is left
         * anywhere (no length asked again). */
        size_t n = evbuffer_get_length(e->dout);
        int w = n > 0 ? evbuffer_write(e->dout, e->fd) : 0;
        left = n > 0 && (w < 0 || (size_t)w != n);
        if (left)
            evbuffer_add_buffer(out, e->dout); /* what the kernel did not take */
    }
    if (left) {
        /* The kernel took less (or failed): libevent writes the rest when
         * the socket is writable and reports an error as usual. */
        bufferevent_enable(bev, EV_WRITE);
        return;
    }
    if (bufferevent_get_enabled(bev) & EV_WRITE)
        bufferevent_disable(bev, EV_WRITE);
    if (e->write_cb)
        sess_on_write(bev, s); /* what the bufferevent would call once drained */
}

/* One pass over the ends listed so far.  An end listed again while the pass
 * runs (a shaper releasing its next slice from on_write, a paused side
 * resumed) waits for the next loop iteration, after epoll: else one session
 * writing slice after slice would keep every other one waiting. */
void session_flush_all(struct loop *lp)
{
    struct session_end *pass = lp->flush_list;
    lp->flush_list = NULL;
    lp->flush_tail = &lp->flush_list;
    if (pass != NULL)
        pass->flush_pprev = &pass;
    lp->flushing = true;
    while (pass != NULL) {
        struct session_end *e = pass;
        sess_flush_unqueue(e);
        flush_end(e);
    }
    lp->flushing = false;
}

/* List a direct end with output for the flusher. */
void sess_flush_queue(struct session_end *e)
{
    if (e->flush_queued || e->rd == NULL)
        return;
    struct loop *lp = e->owner->loop;
    if (lp->flush_list == NULL) {
        /* event_active runs the flusher after this turn's callbacks; during
         * a flush pass it would run it again before epoll (see above). */
        static const struct timeval next_iteration = {0, 0};
        if (lp->flushing)
            event_add(lp->flusher, &next_iteration);
        else
            event_active(lp->flusher, EV_WRITE, 0);
    }
    /* At the tail: ends are written in the order their output was queued, which is the
     * order their peers' bytes were read.  Redis serves connections in the order their
     * commands arrive: a client's BRPOPLPUSH read before another's LPUSH must reach it first
     * (pushed at the head, the last end listed was written first). */
    e->flush_queued = true;
    e->flush_next = NULL;
    e->flush_pprev = lp->flush_tail;
    *lp->flush_tail = e;
    lp->flush_tail = &e->flush_next;
}

/* Put a plain end that starts relaying into direct mode. */
void sess_direct_start(struct session *s, enum session_side side)
{
    struct session_end *e = &s->end[side];
    e->owner = s;
    if (e->tls || e->bev == NULL || e->rd != NULL || s->loop->flusher == NULL)
        return;
    struct evbuffer *out = bufferevent_get_output(e->bev);
    if (e->din == NULL)
        e->din = evbuffer_new();
    if (e->dout == NULL)
        e->dout = evbuffer_new();
    if (e->din == NULL || e->dout == NULL)
        return; /* stays on the bufferevent's path (freed with the session) */
    e->fd = bufferevent_getfd(e->bev);
    e->rd = event_new(s->loop->base, e->fd, EV_READ | EV_PERSIST, on_direct_read, e);
    if (e->rd == NULL)
        return;
    e->rd_armed = false;
    /* What the bufferevent read before (a client's bytes while connecting)
     * comes first. */
    evbuffer_add_buffer(e->din, bufferevent_get_input(e->bev));
    e->rd_want = (bufferevent_get_enabled(e->bev) & EV_READ) != 0;
    bufferevent_disable(e->bev, EV_READ);
    sess_rd_update(e);
    if (evbuffer_get_length(out) > 0)
        sess_flush_queue(e);
    else
        bufferevent_disable(e->bev, EV_WRITE);
}

/* Back to the bufferevent's own writes (draining). */
void sess_direct_stop(struct session_end *e)
{
    if (e->bev == NULL || e->rd == NULL)
        return;
    sess_flush_unqueue(e);
    bool reading = e->rd_want;
    /* What waits to be written joins the bufferevent's output.  Unread
     * input stays in din unless the end is to go on reading (no caller
     * does: a draining end reads nothing). */
    evbuffer_add_buffer(bufferevent_get_output(e->bev), e->dout);
    sess_rd_free(e);
    if (reading) {
        evbuffer_prepend_buffer(bufferevent_get_input(e->bev), e->din);
        bufferevent_enable(e->bev, EV_READ);
    }
    bufferevent_enable(e->bev, EV_WRITE);
}
