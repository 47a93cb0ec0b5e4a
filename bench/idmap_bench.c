/*
 * idmap_bench.c - the cost of the job memory (proxy/resp/idmap.c) under the loads that use it.
 *
 *   make -C bench idmap                      # into build/bench/bin/idmap_bench
 *   build/bench/bin/idmap_bench [ROUNDS]
 *
 * Built from the sources of the tree it is in (bench/Makefile), so that an old and a new tree
 * compare back to back.  Three patterns, each timed ROUNDS times (default 7) after a warm-up
 * round; prints per pattern the median, the fastest and the slowest round in ns per job:
 *
 *   acked    Celery on Redis: a delivery puts the job's tag, its ack gets and deletes it, 1000
 *            jobs in flight (a worker pool's prefetch): the map stays small and churns
 *   backlog  the same with 200,000 jobs in flight (a slow consumer, acks far behind)
 *   unacked  deliveries whose acks twice never sees (a load without acks, RQ's work horses on
 *            another listener): puts only, past IDMAP_MAX, so every put evicts the oldest
 *
 * Keys are 36-character tags as kombu makes them (uuid4), made before the clock starts.  No
 * job_memo strings are set: the numbers are the map's, not malloc's for the task names.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proxy/resp/idmap.h"

#define KEY_LEN 36
#define SCOPE "redis"

static char (*keys)[KEY_LEN + 1];
static size_t n_keys;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A uuid4-looking tag per job, from a fixed xorshift stream (the same in every build). */
static void make_keys(size_t n)
{
    keys = malloc(n * sizeof(*keys));
    if (keys == NULL) {
        perror("malloc");
        exit(1);
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t y = x * 0xbf58476d1ce4e5b9ull;
        snprintf(keys[i], sizeof(keys[i]), "%08x-%04x-4%03x-a%03x-%012llx", (unsigned)(x >> 32),
                 (unsigned)(x & 0xffff), (unsigned)(y >> 52), (unsigned)((y >> 40) & 0xfff),
                 (unsigned long long)(y & 0xffffffffffffull));
    }
    n_keys = n;
}

static void put(size_t i)
{
    idmap_lock();
    struct job_memo *m = idmap_put(SCOPE, keys[i], KEY_LEN);
    if (m == NULL) {
        fprintf(stderr, "idmap_put: out of memory\n");
        exit(1);
    }
    m->pending++;
    idmap_unlock();
}

static void ack(size_t i)
{
    idmap_lock();
    struct job_memo *m = idmap_get(SCOPE, keys[i], KEY_LEN);
    if (m == NULL || m->pending != 1) {
        fprintf(stderr, "idmap_get: job %zu lost\n", i);
        exit(1);
    }
    idmap_del(SCOPE, keys[i], KEY_LEN);
    idmap_unlock();
}

/* Jobs put and acked with `inflight` unacked at any time: ns per job. */
static double run_acked(size_t jobs, size_t inflight)
{
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < jobs; i++) {
        put(i);
        if (i >= inflight)
            ack(i - inflight);
    }
    for (size_t i = jobs > inflight ? jobs - inflight : 0; i < jobs; i++)
        ack(i);
    double ns = (double)(now_ns() - t0) / (double)jobs;
    if (idmap_count() != 0) {
        fprintf(stderr, "acked: %zu entries left\n", idmap_count());
        exit(1);
    }
    return ns;
}

/* Puts only, starting from a map already at its bound: ns per job. */
static double run_unacked(size_t jobs)
{
    idmap_clear();
    for (size_t i = 0; i < IDMAP_MAX; i++)
        put(i);
    uint64_t t0 = now_ns();
    for (size_t i = IDMAP_MAX; i < IDMAP_MAX + jobs; i++)
        put(i);
    double ns = (double)(now_ns() - t0) / (double)jobs;
    if (idmap_count() != IDMAP_MAX) {
        fprintf(stderr, "unacked: %zu entries, not %u\n", idmap_count(), IDMAP_MAX);
        exit(1);
    }
    idmap_clear();
    return ns;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *name, double *ns, int rounds)
{
    qsort(ns, (size_t)rounds, sizeof(*ns), cmp_double);
    printf("%-8s median %7.1f ns/job   min %7.1f   max %7.1f   (%d rounds)\n", name,
           ns[rounds / 2], ns[0], ns[rounds - 1], rounds);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: %s [ROUNDS 1..100]\n", argv[0]);
        return 2;
    }
    const size_t jobs = 2000000;
    make_keys(IDMAP_MAX + jobs);
    double acked[100], backlog[100], unacked[100];
    run_acked(jobs, 1000);
    for (int r = 0; r < rounds; r++)
        acked[r] = run_acked(jobs, 1000);
    run_acked(jobs, 200000);
    for (int r = 0; r < rounds; r++)
        backlog[r] = run_acked(jobs, 200000);
    for (int r = 0; r < rounds; r++)
        unacked[r] = run_unacked(jobs);
    report("acked", acked, rounds);
    report("backlog", backlog, rounds);
    report("unacked", unacked, rounds);
    idmap_clear();
    free(keys);
    return 0;
}
