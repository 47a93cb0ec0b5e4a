/*
 * conf_mem.c - allocation wrappers with a one-shot fault for tests.
 *
 * The countdown is a plain static: the parser runs once at start-up on one
 * thread, and only unit tests ever arm it.
 */
#include "rules/conf_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long conf_mem_countdown = -1;
static bool conf_mem_fired;

/* True when this allocation is the one a test asked to fail. */
static bool conf_mem_should_fail(void)
{
    if (conf_mem_countdown < 0) {
        return false;
    }
    if (conf_mem_countdown-- == 0) {
        conf_mem_fired = true;
        return true;
    }
    return false;
}

void conf_mem_fail_nth(long nth)
{
    conf_mem_countdown = nth;
    conf_mem_fired = false;
}

bool conf_mem_fault_fired(void)
{
    return conf_mem_fired;
}

void *conf_mem_alloc(size_t size)
{
    return conf_mem_should_fail() ? NULL : malloc(size == 0 ? 1 : size);
}

void *conf_mem_calloc(size_t n, size_t size)
{
    return conf_mem_should_fail() ? NULL : calloc(n == 0 ? 1 : n, size == 0 ? 1 : size);
}

void *conf_mem_realloc(void *ptr, size_t size)
{
    return conf_mem_should_fail() ? NULL : realloc(ptr, size == 0 ? 1 : size);
}

char *conf_mem_strndup(const char *s, size_t len)
{
    char *copy = conf_mem_alloc(len + 1);

    if (copy != NULL) {
        memcpy(copy, s, len);
        copy[len] = '\0';
    }
    return copy;
}

char *conf_mem_strdup(const char *s)
{
    return conf_mem_strndup(s, strlen(s));
}

char *conf_mem_vprintf(const char *fmt, va_list ap)
{
    va_list again;
    char *buf;
    int n;

    va_copy(again, ap);
    n = vsnprintf(NULL, 0, fmt, ap);
    if (n < 0) {
        va_end(again);
        return NULL;
    }
    buf = conf_mem_alloc((size_t)n + 1);
    if (buf != NULL) {
        vsnprintf(buf, (size_t)n + 1, fmt, again);
    }
    va_end(again);
    return buf;
}
