/*
 * golden.h - reading a test's files whole: the recordings and golden files of tests/unit/data/
 * (kit_golden), or any file a test wrote (kit_read_path).  No size limit: a buffer of exactly
 * the file's size plus a NUL that is not counted, so a text file is also a C string.  A file that
 * cannot be read fails the test, naming the path and the reason; kit_golden_maybe returns NULL
 * for a file that does not exist (a recording's connections are numbered until one is missing).
 *
 * tests/unit/data is found from TWICE_SOURCE_DIR (the unit tests' CMake targets define it), else
 * from this header's own path.  The buffers come from KIT_RAW_MALLOC, so a test that fails
 * allocations (failalloc.h, which must be included first) does not count or fail them; free
 * them with kit_free.  Header-only: include it after <cmocka.h>.
 */
#ifndef TWICE_KIT_GOLDEN_H
#define TWICE_KIT_GOLDEN_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KIT_RAW_MALLOC
#define KIT_RAW_MALLOC malloc
#define KIT_RAW_REALLOC realloc
#define KIT_RAW_FREE free
#endif

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

static void kit_free(void *p)
{
    KIT_RAW_FREE(p);
}

/* The file at path, whole; NULL with errno set when it cannot be read. */
static uint8_t *kit_read_path_or_null(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return NULL;
    uint8_t *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0)
        buf = KIT_RAW_MALLOC((size_t)n + 1);
    int saved = errno;
    if (buf != NULL && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        saved = ferror(fp) ? errno : EIO;
        KIT_RAW_FREE(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf == NULL) {
        errno = saved != 0 ? saved : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* The file at path, whole; a file that cannot be read fails the test. */
static uint8_t *kit_read_path(const char *path, size_t *len)
{
    uint8_t *buf = kit_read_path_or_null(path, len);
    if (buf == NULL)
        fail_msg("cannot read %s: %s", path, strerror(errno));
    return buf;
}

/* The path of tests/unit/data/<fmt...>. */
static void kit_golden_path(char *out, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void kit_golden_path(char *out, size_t cap, const char *fmt, va_list ap)
{
    char rel[1024];
    int r = vsnprintf(rel, sizeof(rel), fmt, ap);
#ifdef TWICE_SOURCE_DIR
    int n = snprintf(out, cap, "%s/tests/unit/data/%s", TWICE_SOURCE_DIR, rel);
#else
    const char *file = __FILE__; /* .../tests/lib/golden.h */
    const char *slash = strrchr(file, '/');
    int dir = slash == NULL ? 1 : (int)(slash - file);
    int n = snprintf(out, cap, "%.*s/../unit/data/%s", dir, slash == NULL ? "." : file, rel);
#endif
    if (r < 0 || (size_t)r >= sizeof(rel) || n < 0 || (size_t)n >= cap)
        fail_msg("path of golden file %s too long", rel);
}

/* tests/unit/data/<fmt...> (e.g. "resp/%s", "cli-client.bin"), whole; missing or unreadable
 * fails the test. */
static uint8_t *kit_golden(size_t *len, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static uint8_t *kit_golden(size_t *len, const char *fmt, ...)
{
    char path[4096];
    va_list ap;
    va_start(ap, fmt);
    kit_golden_path(path, sizeof(path), fmt, ap);
    va_end(ap);
    return kit_read_path(path, len);
}

/* tests/unit/data/<fmt...>, whole, or NULL when there is no such file; unreadable fails the
 * test. */
static uint8_t *kit_golden_maybe(size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static uint8_t *kit_golden_maybe(size_t *len, const char *fmt, ...)
{
    char path[4096];
    va_list ap;
    va_start(ap, fmt);
    kit_golden_path(path, sizeof(path), fmt, ap);
    va_end(ap);
    uint8_t *buf = kit_read_path_or_null(path, len);
    if (buf == NULL && errno != ENOENT)
        fail_msg("cannot read %s: %s", path, strerror(errno));
    return buf;
}

#pragma GCC diagnostic pop

#endif
