/*
 * failing.h - an allocation failure at every step: a body run once with its first allocation
 * failing, once with its second, and so on, until a run in which no allocation failed (the body
 * then made them all, and the count is returned).  The body asks kit_failed() whether its
 * failure happened, and checks what a user of the code would see either way ("out of memory",
 * -1, nothing half-done).  Leaks are caught by the hook when it tracks allocations
 * (failalloc.h), and by ASan otherwise.
 *
 * A hook is how allocations are made to fail:
 *   - kit_wrap_hook (failalloc.h): malloc, calloc and realloc wrapped at link time, so every
 *     allocation of the process counts (proto/ allocates with plain malloc);
 *   - kit_conf_mem_hook (conf_testkit.h): rules/'s own allocator, conf_mem_fail_nth().
 *
 * Header-only: include it after <cmocka.h>.
 */
#ifndef TWICE_KIT_FAILING_H
#define TWICE_KIT_FAILING_H

#include <stdbool.h>
#include <stddef.h>

struct kit_fail_hook {
    void (*arm)(long nth);  /* the nth allocation from now (0: the next) fails, once; -1: none */
    bool (*fired)(void);    /* the armed failure happened */
    size_t (*leaked)(void); /* allocations made since arm() and not freed; NULL: not tracked */
};

/* One run; nth is the allocation that fails in it. */
typedef void (*kit_fail_body)(void *ctx, long nth);

static const struct kit_fail_hook *kit_fail_current;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

/* Whether the failure armed for this run happened (so far). */
static bool kit_failed(void)
{
    return kit_fail_current != NULL && kit_fail_current->fired();
}

/* Runs body with allocation 0, 1, 2, ... failing until a run where none failed; returns how
 * many allocations that run made.  Fails the test on a leak the hook saw. */
static long kit_each_allocation_fails(const struct kit_fail_hook *hook, kit_fail_body body,
                                      void *ctx)
{
    for (long nth = 0;; nth++) {
        kit_fail_current = hook;
        hook->arm(nth);
        body(ctx, nth);
        bool fired = hook->fired();
        size_t leaked = hook->leaked != NULL ? hook->leaked() : 0;
        hook->arm(-1);
        kit_fail_current = NULL;
        if (leaked != 0)
            fail_msg("%zu allocations leaked with allocation %ld failing", leaked, nth);
        if (!fired)
            return nth;
    }
}

#pragma GCC diagnostic pop

#endif
