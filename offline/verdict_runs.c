/*
 * verdict_runs.c - twice runs and their connections, keyed apart.  See verdict_runs.h.
 *
 * The connection table is an open-addressing hash (linear probing, at most half full) of keys
 * into `conns`, hashed on (run, session): one lookup per record.
 */
#include "offline/verdict_runs.h"

#include <stdlib.h>
#include <string.h>

void vd_runs_free(struct vd_runs *rs)
{
    free(rs->runs);
    free(rs->current);
    free(rs->conns);
    free(rs->slots);
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

static size_t conn_hash(uint32_t run, uint64_t session)
{
    uint64_t h = (session ^ ((uint64_t)run << 40) ^ ((uint64_t)run >> 24)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29));
}

/* Doubles the table and puts every key back.  -1 when out of memory. */
static int slots_grow(struct vd_runs *rs)
{
    size_t n = rs->n_slots != 0 ? rs->n_slots * 2 : 256;
    uint32_t *s = calloc(n, sizeof(*s));
    if (s == NULL)
        return -1;
    for (uint32_t k = 1; k < rs->n_conns; k++) {
        size_t i = conn_hash(rs->conns[k].run, rs->conns[k].session) & (n - 1);
        while (s[i] != 0)
            i = (i + 1) & (n - 1);
        s[i] = k;
    }
    free(rs->slots);
    rs->slots = s;
    rs->n_slots = n;
    return 0;
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
    if ((size_t)rs->n_conns * 2 >= rs->n_slots && slots_grow(rs) != 0)
        return -1;
    size_t i = conn_hash(run, session) & (rs->n_slots - 1);
    for (; rs->slots[i] != 0; i = (i + 1) & (rs->n_slots - 1)) {
        const struct vd_conn *c = &rs->conns[rs->slots[i]];
        if (c->run == run && c->session == session) {
            *key = rs->slots[i];
            return 0;
        }
    }
    if (conn_add(rs, run, session, key) != 0)
        return -1;
    rs->slots[i] = *key;
    return 0;
}
