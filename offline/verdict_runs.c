/*
 * verdict_runs.c - twice runs and their connections, keyed apart.  See verdict_runs.h.
 *
 * The connection index (proto/base/hmap.h) maps (run, session) to keys into `conns`: one lookup
 * per record.
 */
#include "offline/verdict_runs.h"

#include <stdlib.h>
#include <string.h>

void vd_runs_free(struct vd_runs *rs)
{
    free(rs->runs);
    free(rs->current);
    free(rs->conns);
    hmap_free(&rs->conn_index);
    strmap_free(&rs->instance_ids, NULL);
    memset(rs, 0, sizeof(*rs));
}

/* The index of instance `name`, added when new; the last slot past VD_INSTANCES_MAX. */
static int instance_index(struct vd_runs *rs, const char *name, uint8_t *idx)
{
    bool inserted = false;
    void **slot = strmap_put(&rs->instance_ids, name, &inserted);
    if (slot == NULL)
        return -1;
    if (*slot == NULL) {
        if (rs->n_instances == VD_INSTANCES_MAX) {
            *idx = (uint8_t)(VD_INSTANCES_MAX - 1);
            return 0;
        }
        rs->instance_names[rs->n_instances] = strmap_key(&rs->instance_ids, name);
        *slot = (void *)(uintptr_t)(++rs->n_instances);
    }
    *idx = (uint8_t)((uintptr_t)*slot - 1);
    return 0;
}

int vd_runs_begin(struct vd_runs *rs, uint32_t source, const char *instance, uint32_t *prev,
                  uint32_t *run)
{
    if (source >= rs->n_sources) {
        uint32_t *c = realloc(rs->current, ((size_t)source + 1) * sizeof(*c));
        if (c == NULL)
            return -1;
        memset(c + rs->n_sources, 0, ((size_t)source + 1 - rs->n_sources) * sizeof(*c));
        rs->current = c;
        rs->n_sources = (size_t)source + 1;
    }
    if (rs->n_runs == rs->cap_runs) {
        size_t cap = rs->cap_runs != 0 ? rs->cap_runs * 2 : 8;
        struct vd_trun *r = realloc(rs->runs, cap * sizeof(*r));
        if (r == NULL)
            return -1;
        rs->runs = r;
        rs->cap_runs = cap;
    }
    uint8_t inst = 0;
    if (instance_index(rs, instance != NULL ? instance : "-", &inst) != 0)
        return -1;
    *prev = rs->current[source] != 0 ? rs->current[source] - 1 : VD_RUN_NONE;
    uint32_t number = *prev != VD_RUN_NONE ? rs->runs[*prev].number + 1 : 1;
    rs->runs[rs->n_runs] = (struct vd_trun){source, number, inst, 0};
    *run = (uint32_t)rs->n_runs++;
    rs->current[source] = *run + 1;
    return 0;
}

uint32_t vd_runs_current(const struct vd_runs *rs, uint32_t source)
{
    return source < rs->n_sources && rs->current[source] != 0 ? rs->current[source] - 1
                                                              : VD_RUN_NONE;
}

const char *vd_runs_instance(const struct vd_runs *rs, uint32_t run)
{
    return run < rs->n_runs ? rs->instance_names[rs->runs[run].instance] : NULL;
}

/* A connection as looked up: its run and session, and the table they are in. */
struct conn_lookup {
    const struct vd_conn *conns;
    uint32_t run;
    uint64_t session;
};

static uint64_t conn_hash(uint32_t run, uint64_t session)
{
    return hmap_hash_u64(session ^ ((uint64_t)run << 40) ^ ((uint64_t)run >> 24));
}

/* Items are connection keys (never 0), as pointers. */
static bool conn_same(const void *item, const void *key)
{
    const struct conn_lookup *k = key;
    const struct vd_conn *c = &k->conns[(uintptr_t)item];
    return c->run == k->run && c->session == k->session;
}

/* Appends a connection; its key in *key.  -1 when out of memory. */
static int conn_add(struct vd_runs *rs, uint32_t run, uint64_t session, uint32_t *key)
{
    if (rs->n_conns == 0)
        rs->n_conns = 1; /* key 0: no connection named */
    if (rs->n_conns >= rs->cap_conns) {
        uint32_t cap = rs->cap_conns != 0 ? rs->cap_conns * 2 : 256;
        if (cap <= rs->cap_conns)
            return -1;
        struct vd_conn *c = realloc(rs->conns, (size_t)cap * sizeof(*c));
        if (c == NULL)
            return -1;
        rs->conns = c;
        rs->cap_conns = cap;
    }
    *key = rs->n_conns++;
    rs->conns[*key] = (struct vd_conn){run, false, session};
    return 0;
}

int vd_runs_key(struct vd_runs *rs, uint32_t run, uint64_t session, uint32_t *key)
{
    *key = 0;
    if (session == 0)
        return 0;
    uint64_t h = conn_hash(run, session);
    struct conn_lookup k = {rs->conns, run, session};
    uintptr_t found = (uintptr_t)hmap_find(&rs->conn_index, h, conn_same, &k);
    if (found != 0) {
        *key = (uint32_t)found;
        return 0;
    }
    if (conn_add(rs, run, session, key) != 0)
        return -1;
    if (hmap_add(&rs->conn_index, h, (void *)(uintptr_t)*key) != 0) {
        rs->n_conns--; /* the connection just appended, unknown to the map */
        *key = 0;
        return -1;
    }
    return 0;
}
