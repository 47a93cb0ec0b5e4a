/*
 * page_walk.c - the per-task figures of the pages, from one walk over the verdict
 * accumulator's messages (each replayed as the verdict counts it), and writing a page to its
 * file.  See page.h.
 */
#include "offline/page.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The upper edges of the copy-delay bins, in microseconds (the last bin has none). */
static const uint64_t page_delay_edges[PAGE_DELAY_BINS - 1] = {
    1000,     3000,     10000,    30000,     100000,    300000,     1000000,    3000000,
    10000000, 30000000, 60000000, 180000000, 600000000, 1800000000, 3600000000,
};

static size_t delay_bin(uint64_t us)
{
    size_t i = 0;
    while (i < PAGE_DELAY_BINS - 1 && us >= page_delay_edges[i])
        i++;
    return i;
}

enum page_counted page_counted_of(const struct verdict_delivery *d)
{
    if (d->withheld)
        return PAGE_WITHHELD;
    if (d->set_aside)
        return PAGE_SET_ASIDE;
    if (d->overlap != VERDICT_COPY_NONE)
        return PAGE_COPY;
    return d->reached ? PAGE_FIRST : PAGE_UNREACHED;
}

static struct page_task *task_of(struct page_walk *w, const char *name)
{
    bool inserted = false;
    void **slot = strmap_put(&w->tasks, name, &inserted);
    if (slot == NULL)
        return NULL;
    if (*slot == NULL) {
        struct page_task *t = calloc(1, sizeof(*t));
        if (t == NULL)
            return NULL;
        t->name = strmap_key(&w->tasks, name);
        *slot = t;
    }
    return *slot;
}

/* Keeps id among the PAGE_TOP messages with the most deliveries (ties: the smaller id, which
 * comes first in the walk). */
static void top_add(struct page_walk *w, const char *id, uint64_t n)
{
    size_t i = w->n_top;
    if (i == PAGE_TOP) {
        if (n <= w->top_n[i - 1])
            return;
        i--;
    } else {
        w->n_top++;
    }
    for (; i > 0 && n > w->top_n[i - 1]; i--) {
        w->top_id[i] = w->top_id[i - 1];
        w->top_n[i] = w->top_n[i - 1];
    }
    w->top_id[i] = id;
    w->top_n[i] = n;
}

struct walk_ctx {
    struct page_walk *w;
    const struct verdict *v;
    const struct fault_log *fl;
};

/* Counts one message's deliveries into t; its examples when t has none yet. */
static void count_deliveries(struct page_task *t, const char *id, const struct verdict_delivery *d,
                             size_t n)
{
    bool copy = false, overlap = false, aside = false;
    for (size_t i = 0; i < n; i++) {
        enum page_counted c = page_counted_of(&d[i]);
        t->counted[c]++;
        aside |= c == PAGE_SET_ASIDE || c == PAGE_WITHHELD;
        if (c != PAGE_COPY)
            continue;
        copy = true;
        overlap |= d[i].overlap == VERDICT_COPY_OVERLAP;
        t->copies++;
        t->overlapping += d[i].overlap == VERDICT_COPY_OVERLAP;
        t->delays[delay_bin(d[i].copy_delay_us)]++;
    }
    if (copy && (t->copy_id == NULL || (overlap && !t->copy_overlapped))) {
        t->copy_id = id;
        t->copy_overlapped = overlap;
    }
    if (aside && t->aside_id == NULL)
        t->aside_id = id;
}

static int walk_one(void *ctx, const char *id, const char *task)
{
    struct walk_ctx *c = ctx;
    struct page_task *t = task_of(c->w, task != NULL ? task : VERDICT_UNKNOWN_TASK);
    struct verdict_delivery *d = NULL;
    size_t n = 0;
    if (t == NULL || verdict_message_deliveries(c->v, id, &d, &n) < 0)
        return -1;
    t->messages++;
    uint32_t effects = verdict_message_effects(c->v, id);
    t->by_effects[effects < 2 ? effects : 2]++;
    count_deliveries(t, id, d, n);
    if (t->fault_id == NULL && c->fl != NULL && fault_log_message(c->fl, id) != NULL)
        t->fault_id = id;
    c->w->messages++;
    c->w->delivered += n > 0;
    c->w->delivered_more_than_once += n > 1;
    if (n > 0)
        top_add(c->w, id, n);
    free(d);
    return 0;
}

int page_walk(struct page_walk *w, const struct verdict *v, const struct fault_log *fl)
{
    memset(w, 0, sizeof(*w));
    struct walk_ctx c = {w, v, fl};
    return verdict_each_message(v, walk_one, &c) == 0 ? 0 : -1;
}

static int task_cmp(const void *a, const void *b)
{
    const struct page_task *const *x = a, *const *y = b;
    /* the unknown row last, as in the verdict */
    bool ux = strcmp((*x)->name, VERDICT_UNKNOWN_TASK) == 0;
    bool uy = strcmp((*y)->name, VERDICT_UNKNOWN_TASK) == 0;
    if (ux != uy)
        return ux ? 1 : -1;
    return strcmp((*x)->name, (*y)->name);
}

const struct page_task **page_walk_tasks(const struct page_walk *w, size_t *n)
{
    *n = 0;
    if (strmap_count(&w->tasks) == 0)
        return NULL;
    const struct page_task **v = malloc(strmap_count(&w->tasks) * sizeof(*v));
    if (v == NULL)
        return NULL;
    size_t pos = 0;
    const struct strmap_slot *s = NULL;
    while (strmap_next(&w->tasks, &pos, &s))
        v[(*n)++] = s->value;
    qsort(v, *n, sizeof(*v), task_cmp);
    return v;
}

void page_walk_free(struct page_walk *w)
{
    strmap_free(&w->tasks, free);
}

int page_write_file(const char *path, FILE *out, int (*fn)(FILE *f, void *ctx), void *ctx,
                    char *err, size_t errlen)
{
    if (strcmp(path, "-") == 0)
        return fn(out, ctx);
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp)) {
        snprintf(err, errlen, "%s: name too long", path);
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = fn(f, ctx);
    bool written = rc == 0 && fflush(f) == 0 && !ferror(f);
    int saved = errno;
    if (fclose(f) != 0 && written) {
        written = false;
        saved = errno;
    }
    if (written && rename(tmp, path) == 0)
        return 0;
    if (written)
        saved = errno;
    unlink(tmp);
    snprintf(err, errlen, "%s: %s", path, rc != 0 ? "out of memory" : strerror(saved));
    return -1;
}

void page_names(FILE *out, const char *const *names, size_t n, size_t total,
                void (*item)(FILE *out, const char *name))
{
    for (size_t i = 0; i < n; i++) {
        fputs(i > 0 ? ", " : "", out);
        item(out, names[i]);
    }
    if (n == 0)
        fputc('-', out);
    if (total > n)
        fprintf(out, " (+%zu more)", total - n);
}
