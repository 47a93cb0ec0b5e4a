/*
 * resp_plan.c - plans of RESP sessions as data (resp_plan.h).
 */
#include "proto/resp/resp_plan.h"

#include <stdlib.h>
#include <string.h>

#include "proto/resp/resp.h"

/* Room for n more bytes at the end of b; NULL (and b->oom) when it cannot be made. */
static uint8_t *bytes_room(struct resp_bytes *b, size_t n)
{
    if (b->oom)
        return NULL;
    if (n > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return NULL;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap != 0 ? b->cap : 64;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = true;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    return b->p + b->len;
}

void resp_bytes_add(struct resp_bytes *b, const void *p, size_t n)
{
    uint8_t *at = bytes_room(b, n);
    if (at == NULL || n == 0)
        return;
    memcpy(at, p, n);
    b->len += n;
}

void resp_bytes_command(struct resp_bytes *b, size_t argc, const char *const *argv,
                        const size_t *lens)
{
    size_t need = 32;
    for (size_t i = 0; i < argc && !b->oom; i++) {
        if (lens[i] > SIZE_MAX / 4 - need)
            b->oom = true;
        else
            need += lens[i] + 24;
    }
    uint8_t *at = bytes_room(b, need);
    if (at == NULL)
        return;
    int n = resp_encode_command(at, need, argc, argv, lens);
    if (n < 0)
        b->oom = true;
    else
        b->len += (size_t)n;
}

void resp_bytes_int(struct resp_bytes *b, int64_t v)
{
    uint8_t *at = bytes_room(b, 32);
    if (at == NULL)
        return;
    int n = resp_encode_integer(at, 32, v);
    if (n < 0)
        b->oom = true;
    else
        b->len += (size_t)n;
}

void resp_bytes_bulk(struct resp_bytes *b, const void *p, size_t len)
{
    if (len > SIZE_MAX / 2) {
        b->oom = true;
        return;
    }
    uint8_t *at = bytes_room(b, len + 32);
    if (at == NULL)
        return;
    int n = resp_encode_bulk(at, len + 32, p, len);
    if (n < 0)
        b->oom = true;
    else
        b->len += (size_t)n;
}

void resp_bytes_free(struct resp_bytes *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* The plan's group of own commands due ms from now, made on first use (*made says so).  With
 * RESP_PLAN_OWN_MAX groups already, the one due nearest to ms takes them: commands are sent a
 * little early or late rather than not at all. */
static struct resp_own *own_group(struct resp_own *own, size_t *n_own, uint32_t ms, bool *made)
{
    *made = false;
    for (size_t i = 0; i < *n_own; i++)
        if (own[i].ms == ms)
            return &own[i];
    if (*n_own >= RESP_PLAN_OWN_MAX) {
        struct resp_own *near = &own[0];
        for (size_t i = 1; i < *n_own; i++) {
            uint32_t d = own[i].ms > ms ? own[i].ms - ms : ms - own[i].ms;
            uint32_t dn = near->ms > ms ? near->ms - ms : ms - near->ms;
            if (d < dn)
                near = &own[i];
        }
        return near;
    }
    struct resp_own *g = &own[(*n_own)++];
    memset(g, 0, sizeof(*g));
    g->ms = ms;
    *made = true;
    return g;
}

/* Undoes a failed append to group g (len bytes and k commands before it): the plan is as it
 * was, without a group of bytes that cannot be used. */
static bool own_undo(struct resp_own *g, size_t *n_own, bool made, size_t len, size_t k)
{
    if (made) {
        resp_bytes_free(&g->cmds);
        (*n_own)--;
    } else {
        g->cmds.oom = false;
        g->cmds.len = len;
        g->n = k;
    }
    return false;
}

bool resp_plan_own(struct resp_own *own, size_t *n_own, uint32_t ms, size_t argc,
                   const char *const *argv, const size_t *lens)
{
    bool made;
    struct resp_own *g = own_group(own, n_own, ms, &made);
    if (g == NULL)
        return false;
    size_t len = g->cmds.len, k = g->n;
    resp_bytes_command(&g->cmds, argc, argv, lens);
    g->n++;
    return g->cmds.oom ? own_undo(g, n_own, made, len, k) : true;
}

bool resp_plan_own_raw(struct resp_own *own, size_t *n_own, uint32_t ms, const void *bytes,
                       size_t n, size_t k)
{
    bool made;
    struct resp_own *g = own_group(own, n_own, ms, &made);
    if (g == NULL)
        return false;
    size_t len = g->cmds.len, k0 = g->n;
    resp_bytes_add(&g->cmds, bytes, n);
    g->n += k;
    return g->cmds.oom ? own_undo(g, n_own, made, len, k0) : true;
}

static bool own_oom(const struct resp_own *own, size_t n_own)
{
    for (size_t i = 0; i < n_own; i++)
        if (own[i].cmds.oom)
            return true;
    return false;
}

bool resp_cmd_plan_oom(const struct resp_cmd_plan *p)
{
    return p->bytes.oom || own_oom(p->own, p->n_own);
}

bool resp_reply_plan_oom(const struct resp_reply_plan *p)
{
    return p->bytes.oom || own_oom(p->own, p->n_own);
}

static void own_free(struct resp_own *own, size_t *n_own)
{
    for (size_t i = 0; i < *n_own; i++)
        resp_bytes_free(&own[i].cmds);
    *n_own = 0;
}

void resp_cmd_plan_free(struct resp_cmd_plan *p)
{
    resp_bytes_free(&p->bytes);
    own_free(p->own, &p->n_own);
}

void resp_reply_plan_free(struct resp_reply_plan *p)
{
    resp_bytes_free(&p->bytes);
    own_free(p->own, &p->n_own);
}
