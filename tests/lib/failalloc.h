/*
 * failalloc.h - the failing allocator: malloc, calloc and realloc wrapped at link time, counting
 * the allocations made while armed, failing the Nth, and tracking what was allocated meanwhile
 * so that a run with a failure can be checked to free everything.  proto/ allocates with plain
 * malloc (no hook of its own), so this is how its tests make its allocations fail; rules/ has
 * conf_mem_fail_nth() (conf_testkit.h).
 *
 * A test that includes this header is linked with -Wl,--wrap=malloc,... (CMakeLists.txt does it
 * for every unit test that includes it, directly or through a kit header); it is defined once
 * per test executable.  Include it before golden.h and text.h: the kit's own buffers then
 * bypass it.
 *
 * Header-only: include it after <cmocka.h>.
 */
#ifndef TWICE_KIT_FAILALLOC_H
#define TWICE_KIT_FAILALLOC_H

#if defined(TWICE_KIT_GOLDEN_H) || defined(TWICE_KIT_TEXT_H)
#error "include tests/lib/failalloc.h before tests/lib/golden.h and tests/lib/text.h"
#endif

#include <stdbool.h>
#include <stddef.h>

#include "tests/lib/failing.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

/* The kit's own buffers (golden files, texts) are neither counted nor failed. */
#define KIT_RAW_MALLOC __real_malloc
#define KIT_RAW_REALLOC __real_realloc
#define KIT_RAW_FREE __real_free

#define KIT_TRACK_MAX 8192u

static struct {
    bool armed;     /* counting (and tracking) allocations */
    size_t n, fail; /* allocations since armed; the one that fails (0: none) */
    bool failed;    /* the failure happened */
    void *live[KIT_TRACK_MAX];
    size_t n_live;
} kit_alloc;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

static void kit_track(void *p)
{
    if (p != NULL && kit_alloc.armed && kit_alloc.n_live < KIT_TRACK_MAX)
        kit_alloc.live[kit_alloc.n_live++] = p;
}

static void kit_untrack(void *p)
{
    for (size_t i = 0; p != NULL && i < kit_alloc.n_live; i++) {
        if (kit_alloc.live[i] == p) {
            kit_alloc.live[i] = kit_alloc.live[--kit_alloc.n_live];
            return;
        }
    }
}

static bool kit_fails(void)
{
    if (!kit_alloc.armed)
        return false;
    if (++kit_alloc.n == kit_alloc.fail) {
        kit_alloc.failed = true;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n)
{
    if (kit_fails())
        return NULL;
    void *p = __real_malloc(n);
    kit_track(p);
    return p;
}

void *__wrap_calloc(size_t k, size_t n);
void *__wrap_calloc(size_t k, size_t n)
{
    if (kit_fails())
        return NULL;
    void *p = __real_calloc(k, n);
    kit_track(p);
    return p;
}

void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n)
{
    if (kit_fails())
        return NULL;
    void *q = __real_realloc(p, n);
    if (q != NULL) {
        kit_untrack(p);
        kit_track(q);
    }
    return q;
}

void __wrap_free(void *p);
void __wrap_free(void *p)
{
    kit_untrack(p);
    __real_free(p);
}

/* Counts allocations from now on; the fail-th fails (1-based; 0: none).  Forgets what was
 * tracked. */
static void kit_arm(size_t fail)
{
    kit_alloc.armed = true;
    kit_alloc.n = 0;
    kit_alloc.fail = fail;
    kit_alloc.failed = false;
    kit_alloc.n_live = 0;
}

/* Stops counting; returns the allocations made while armed. */
static size_t kit_disarm(void)
{
    kit_alloc.armed = false;
    return kit_alloc.n;
}

/* Allocations made while armed and not freed since. */
static size_t kit_live(void)
{
    return kit_alloc.n_live;
}

static void kit_wrap_arm(long nth)
{
    if (nth < 0)
        (void)kit_disarm();
    else
        kit_arm((size_t)nth + 1);
}

static bool kit_wrap_fired(void)
{
    return kit_alloc.failed;
}

/* Every allocation of the process, through the link-time wrap. */
static const struct kit_fail_hook kit_wrap_hook = {kit_wrap_arm, kit_wrap_fired, kit_live};

/* A path that makes and frees everything it allocates. */
typedef void (*kit_scenario_fn)(void);

struct kit_scenario {
    kit_scenario_fn fn;
};

static void kit_scenario_run(void *ctx, long nth)
{
    (void)nth;
    ((struct kit_scenario *)ctx)->fn();
}

/* Runs fn with every one of its allocations failing in turn, then with none failing; it must
 * allocate, and nothing it allocated may outlive it. */
static void kit_every_allocation_fails(kit_scenario_fn fn)
{
    struct kit_scenario s = {fn};
    assert_true(kit_each_allocation_fails(&kit_wrap_hook, kit_scenario_run, &s) > 0);
}

#pragma GCC diagnostic pop

#endif
