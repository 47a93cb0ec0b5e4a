/*
 * split.h - a byte string fed to a resumable parser in pieces: split in two at every point
 * (0..len, both empty ends included), in pieces of a fixed size, or one byte at a time.  The
 * test says what a fresh parser is, what it does with a piece, and what it checks once the
 * whole string went in; the driver calls them for each way of cutting, and names the cut in
 * `how` ("split at 123", "in 1-byte pieces") so a failing check can say which one failed.
 *
 * Header-only: include it after <cmocka.h>.
 */
#ifndef TWICE_KIT_SPLIT_H
#define TWICE_KIT_SPLIT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct kit_feed {
    void (*begin)(void *ctx);                             /* a fresh parser; may be NULL */
    void (*piece)(void *ctx, const uint8_t *p, size_t n); /* the next piece (n may be 0) */
    void (*end)(void *ctx, const char *how);              /* all fed: check; may be NULL */
};

enum {
    KIT_SPLIT_TWO = 1u,   /* two pieces, at every split point */
    KIT_SPLIT_BYTES = 2u, /* one byte at a time */
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

/* buf[0..len) in pieces of `chunk` bytes (the last one shorter). */
static void kit_feed_chunks(const uint8_t *buf, size_t len, size_t chunk, const struct kit_feed *f,
                            void *ctx)
{
    char how[64];
    snprintf(how, sizeof(how), "in %zu-byte pieces", chunk);
    if (f->begin != NULL)
        f->begin(ctx);
    for (size_t off = 0; off < len; off += chunk)
        f->piece(ctx, buf + off, len - off < chunk ? len - off : chunk);
    if (f->end != NULL)
        f->end(ctx, how);
}

/* buf[0..len) in two pieces split at `at`. */
static void kit_feed_split_at(const uint8_t *buf, size_t len, size_t at, const struct kit_feed *f,
                              void *ctx)
{
    char how[64];
    snprintf(how, sizeof(how), "split at %zu of %zu", at, len);
    if (f->begin != NULL)
        f->begin(ctx);
    f->piece(ctx, buf, at);
    f->piece(ctx, buf + at, len - at);
    if (f->end != NULL)
        f->end(ctx, how);
}

/* buf[0..len) split in two at every point (KIT_SPLIT_TWO) and/or one byte at a time
 * (KIT_SPLIT_BYTES). */
static void kit_split_everywhere(const uint8_t *buf, size_t len, unsigned ways,
                                 const struct kit_feed *f, void *ctx)
{
    if (ways & KIT_SPLIT_TWO)
        for (size_t at = 0; at <= len; at++)
            kit_feed_split_at(buf, len, at, f, ctx);
    if (ways & KIT_SPLIT_BYTES)
        kit_feed_chunks(buf, len, 1, f, ctx);
}

#pragma GCC diagnostic pop

#endif
