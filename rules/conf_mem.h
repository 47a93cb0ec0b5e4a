/*
 * conf_mem.h - allocation wrappers used by the configuration parser.
 *
 * Every allocation in rules/ goes through these so that a test can make the
 * Nth one fail and check that the parser reports "out of memory", returns -1
 * and leaks nothing.  Outside tests they are plain malloc/realloc.
 *
 * Internal to rules/; not part of the public contract in conf.h.
 */
#ifndef TWICE_CONF_MEM_H
#define TWICE_CONF_MEM_H

#include "proto/base/must_check.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* malloc/calloc/realloc lookalikes; NULL on failure.  Free with free(). */
void *conf_mem_alloc(size_t size) TWICE_MUST_CHECK;
void *conf_mem_calloc(size_t n, size_t size) TWICE_MUST_CHECK;
void *conf_mem_realloc(void *ptr, size_t size) TWICE_MUST_CHECK;

/* A new NUL-terminated copy of the `len` bytes at `s`, owned by the caller. */
char *conf_mem_strndup(const char *s, size_t len) TWICE_MUST_CHECK;
/* A new copy of the string `s`, owned by the caller. */
char *conf_mem_strdup(const char *s) TWICE_MUST_CHECK;
/* A new string formatted like vsprintf, owned by the caller; NULL on failure. */
char *conf_mem_vprintf(const char *fmt, va_list ap) TWICE_MUST_CHECK
    __attribute__((format(printf, 1, 0)));

/* Tests only: make the allocation `nth` calls from now (0 = the next one)
 * fail, once; a negative value disables the fault.  Not thread safe. */
void conf_mem_fail_nth(long nth);
/* Tests only: whether the fault armed by conf_mem_fail_nth() has fired. */
bool conf_mem_fault_fired(void);

#endif
