/*
 * loadgen.h - what the two load generators (amqp_load.c, redis_jobs.c) share: the monotonic
 * clock, a latency histogram, a set of message numbers already seen, the send budget (count or
 * duration, in-flight cap, rate, timeout) and its checks, and the JSON line.
 *
 * Header-only (static functions) so that each generator still builds from one command,
 * `cc -O2 bench/amqp_load.c $(pkg-config --cflags --libs libevent_core)`: the compiler finds
 * this file next to the source.  No libevent here.
 *
 * Both generators run every connection in one thread and one process, so the send time a
 * publisher writes into a message and the receive time a consumer reads are on the same
 * CLOCK_MONOTONIC: their difference is the end-to-end latency, broker and proxy included.
 */
#ifndef TWICE_BENCH_LOADGEN_H
#define TWICE_BENCH_LOADGEN_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Nanoseconds on the monotonic clock. */
static uint64_t lg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- latency histogram ----------------------------------------------------------------------
 *
 * Log-linear buckets over microseconds: values below LG_HIST_SUB are exact, larger ones fall in
 * one of LG_HIST_SUB / 2 buckets per power of two, so a percentile is within about 3 % of the
 * true value.  Fixed size (a few KiB), no allocation per sample: recording costs nothing next
 * to parsing a frame, and millions of samples keep the same precision. */
#define LG_HIST_SUB 64u
#define LG_HIST_BUCKETS (LG_HIST_SUB + 60u * (LG_HIST_SUB / 2u))

struct lg_hist {
    uint64_t n;
    uint64_t max;
    uint64_t b[LG_HIST_BUCKETS];
};

static size_t lg_hist_index(uint64_t v)
{
    if (v < LG_HIST_SUB)
        return (size_t)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v); /* >= 6 */
    unsigned shift = msb - 5u;                         /* v >> shift is in [32, 63] */
    return LG_HIST_SUB + (shift - 1u) * (LG_HIST_SUB / 2u) + (size_t)((v >> shift) - 32u);
}

/* The middle of bucket i, the value a percentile falling in it reports. */
static uint64_t lg_hist_value(size_t i)
{
    if (i < LG_HIST_SUB)
        return i;
    unsigned shift = (unsigned)((i - LG_HIST_SUB) / (LG_HIST_SUB / 2u)) + 1u;
    uint64_t m = 32u + (i - LG_HIST_SUB) % (LG_HIST_SUB / 2u);
    return (m << shift) + ((uint64_t)1 << shift) / 2u;
}

static void lg_hist_add(struct lg_hist *h, uint64_t us)
{
    h->n++;
    if (us > h->max)
        h->max = us;
    h->b[lg_hist_index(us)]++;
}

/* The q-quantile (0 < q <= 1) in microseconds; 0 when nothing was recorded. */
static uint64_t lg_hist_quantile(const struct lg_hist *h, double q)
{
    if (h->n == 0)
        return 0;
    uint64_t want = (uint64_t)(q * (double)h->n + 0.999999);
    uint64_t seen = 0;
    for (size_t i = 0; i < LG_HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen >= want)
            return lg_hist_value(i) < h->max ? lg_hist_value(i) : h->max;
    }
    return h->max;
}

/* ---- messages seen --------------------------------------------------------------------------
 *
 * Every message carries a number unique in the run.  A proxy that injects `duplicate` (or a
 * broker redelivering) hands the same number out twice; the set tells first deliveries from
 * copies, so throughput counts work done once and the run ends when every message arrived. */
struct lg_seen {
    uint8_t *bits;
    uint64_t cap; /* numbers covered: cap / 8 bytes */
};

/* Marks seq; true when it was not seen before.  Exits on allocation failure (a benchmark
 * that cannot count is worthless). */
static bool lg_seen_mark(struct lg_seen *s, uint64_t seq)
{
    if (seq >= s->cap) {
        uint64_t cap = s->cap ? s->cap : 1u << 16;
        while (cap <= seq)
            cap *= 2;
        uint8_t *bits = realloc(s->bits, cap / 8);
        if (bits == NULL) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        memset(bits + s->cap / 8, 0, (cap - s->cap) / 8);
        s->bits = bits;
        s->cap = cap;
    }
    uint8_t bit = (uint8_t)(1u << (seq % 8));
    if (s->bits[seq / 8] & bit)
        return false;
    s->bits[seq / 8] |= bit;
    return true;
}

/* ---- the result ------------------------------------------------------------------------------ */

struct lg_result {
    uint64_t sent, received, unique, redelivered;
    uint64_t t_first_send, t_last_send, t_last_unique; /* lg_now_ns() */
    struct lg_hist lat;
    bool complete;     /* every message sent was received at least once */
    const char *error; /* static text, or NULL */
};

/* How much a load sends, the same in both generators: `count` messages (0: for `duration`
 * seconds from the first send), at most `inflight` sent and not yet received, at most `rate`
 * per second (0: as fast as the other bounds allow), and the whole run given up after `timeout`
 * seconds. */
struct lg_budget {
    uint64_t count;
    double duration;
    uint64_t inflight;
    double rate;
    double timeout;
};

/* A `duration` replaces the count; with neither, `default_count` messages. */
static void lg_budget_settle(struct lg_budget *b, uint64_t default_count)
{
    if (b->duration > 0)
        b->count = 0;
    else if (b->count == 0)
        b->count = default_count;
}

/* Whether the budget lets one more message go now; sets *over once `count` have been sent. */
static bool lg_budget_allows(const struct lg_budget *b, const struct lg_result *r, bool *over)
{
    if (b->count > 0 && r->sent >= b->count) {
        *over = true;
        return false;
    }
    if (r->sent - r->unique >= b->inflight)
        return false;
    if (b->rate > 0 && r->sent > 0) {
        double allowed = b->rate * (double)(lg_now_ns() - r->t_first_send) / 1e9;
        if ((double)r->sent >= allowed + 1.0)
            return false;
    }
    return true;
}

enum lg_tick { LG_TICK_GOING, LG_TICK_TIMEOUT, LG_TICK_DONE };

/* The generators' periodic check at `now`: the run is past its timeout, or sending is over
 * (*over, set here once `duration` has passed) and every message sent came back, or it goes on. */
static enum lg_tick lg_budget_tick(const struct lg_budget *b, const struct lg_result *r,
                                   uint64_t t_start, uint64_t now, bool *over)
{
    if ((double)(now - t_start) / 1e9 > b->timeout)
        return LG_TICK_TIMEOUT;
    if (b->count == 0 && r->sent > 0 && (double)(now - r->t_first_send) / 1e9 >= b->duration)
        *over = true;
    return *over && r->unique >= r->sent && r->sent > 0 ? LG_TICK_DONE : LG_TICK_GOING;
}

static double lg_rate(uint64_t n, uint64_t t0, uint64_t t1)
{
    return t1 > t0 ? (double)n * 1e9 / (double)(t1 - t0) : 0.0;
}

/* Prints the fields common to both generators, after the caller's own (which must end with a
 * comma), then closes the JSON object. */
static void lg_print_result(FILE *f, const struct lg_result *r)
{
    uint64_t end = r->t_last_unique > r->t_first_send ? r->t_last_unique : r->t_first_send;
    fprintf(f,
            "\"sent\":%llu,\"received\":%llu,\"unique\":%llu,\"duplicates\":%llu,"
            "\"redelivered\":%llu,\"elapsed_s\":%.3f,\"publishes_per_s\":%.1f,"
            "\"deliveries_per_s\":%.1f,\"throughput\":%.1f,\"p50_us\":%llu,\"p99_us\":%llu,"
            "\"max_us\":%llu,\"complete\":%s,\"error\":",
            (unsigned long long)r->sent, (unsigned long long)r->received,
            (unsigned long long)r->unique, (unsigned long long)(r->received - r->unique),
            (unsigned long long)r->redelivered, (double)(end - r->t_first_send) / 1e9,
            lg_rate(r->sent, r->t_first_send, r->t_last_send),
            lg_rate(r->received, r->t_first_send, end), lg_rate(r->unique, r->t_first_send, end),
            (unsigned long long)lg_hist_quantile(&r->lat, 0.50),
            (unsigned long long)lg_hist_quantile(&r->lat, 0.99), (unsigned long long)r->lat.max,
            r->complete ? "true" : "false");
    if (r->error == NULL) {
        fputs("null}\n", f);
        return;
    }
    fputc('"', f);
    for (const char *p = r->error; *p; p++) {
        if (*p == '"' || *p == '\\')
            fputc('\\', f);
        fputc((unsigned char)*p < 0x20 ? ' ' : *p, f);
    }
    fputs("\"}\n", f);
}

/* Parses a positive number with an optional K/M/G suffix (powers of 1024), e.g. "64K".
 * Returns false on anything else. */
static bool lg_parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return false;
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'B')
        end += *end == 'i' && end[1] == 'B' ? 2 : 1;
    *out = v;
    return *end == '\0';
}

/* ---- options --------------------------------------------------------------------------------
 *
 * Both generators take `--name VALUE` (or `--name=VALUE`) options described by one table, which
 * also prints the usage: no getopt switch to keep in step with a help text. */
enum lg_opt_kind { LG_STR, LG_UINT, LG_U64, LG_SIZE, LG_DOUBLE, LG_FLAG };

struct lg_opt {
    const char *name;
    enum lg_opt_kind kind;
    void *dst; /* const char **, unsigned *, uint64_t *, uint64_t *, double *, bool * */
    const char *help;
};

static void lg_usage(const char *prog, const struct lg_opt *opts, size_t n)
{
    fprintf(stderr, "usage: %s --addr IP:PORT [options]\n", prog);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  --%-11s %s\n", opts[i].name, opts[i].help);
    exit(2);
}

static bool lg_opt_set(const struct lg_opt *o, const char *v)
{
    char *end = NULL;
    switch (o->kind) {
    case LG_STR:
        *(const char **)o->dst = v;
        return true;
    case LG_UINT: {
        unsigned long x = strtoul(v, &end, 10);
        *(unsigned *)o->dst = (unsigned)x;
        return end != v && *end == '\0' && x <= 0xffffffffu;
    }
    case LG_U64:
        *(uint64_t *)o->dst = strtoull(v, &end, 10);
        return end != v && *end == '\0';
    case LG_SIZE:
        return lg_parse_size(v, (uint64_t *)o->dst);
    case LG_DOUBLE:
        *(double *)o->dst = strtod(v, &end);
        return end != v && *end == '\0';
    case LG_FLAG:
        break;
    }
    return false;
}

/* Fills the table's destinations from argv; prints the usage and exits on anything unknown. */
static void lg_parse_options(int argc, char **argv, const struct lg_opt *opts, size_t n)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i] + 2, *eq = strchr(argv[i], '=');
        size_t len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        const struct lg_opt *o = NULL;
        for (size_t k = 0; k < n && strncmp(argv[i], "--", 2) == 0; k++)
            if (strlen(opts[k].name) == len && memcmp(opts[k].name, arg, len) == 0)
                o = &opts[k];
        if (o != NULL && o->kind == LG_FLAG && eq == NULL) {
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq != NULL ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (o == NULL || v == NULL || !lg_opt_set(o, v))
            lg_usage(argv[0], opts, n);
    }
}

/* Parses "IPv4:PORT" into sin.  Only numeric addresses: the benchmarks run on loopback, and a
 * name lookup would be one more thing to measure.  Returns false when malformed. */
static bool lg_parse_addr(const char *s, struct sockaddr_in *sin)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= sizeof(host))
        return false;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)port);
    return *end == '\0' && port > 0 && port < 65536 &&
           inet_pton(AF_INET, host, &sin->sin_addr) == 1;
}

#endif
