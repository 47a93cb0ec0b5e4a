/*
 * fuzz_toxic.c - libFuzzer harness for the toxics of twice's Toxiproxy API (rules/toxic_msg.c,
 * rules/toxic_stream.c): what a client's POST /proxies/{proxy}/toxics body becomes.  Built and
 * run by scripts/fuzz.sh like the others (tests/fuzz/fuzz.mk).
 *
 * The input is a request body, as the API reads it: a JSON object with `type`, `stream`,
 * `toxicity` and `attributes` (the seeds in tests/fuzz/corpus/toxic/ are the README's toxics
 * and twice's message toxics).  Each input is decoded:
 *
 * - as a stream toxic of its type (or of every stream type when the type is none): an
 *   accepted one shows as JSON that reads back to the same attributes;
 * - as a message toxic on an amqp, a resp+celery and a plain resp listener: the rule text it
 *   becomes must parse, with the rule parser of PUT /rules, into exactly one rule, called as
 *   asked and on the listener asked, so that no attribute can write a rule of its own or a
 *   directive outside its piece; and toxic_msg_rule() agrees with the text;
 * - the slicer's pieces of a chunk (its length, average and variation from the input's first
 *   bytes) add up to the chunk, none empty, none bigger than average + variation unless the
 *   chunk is.
 *
 * Invariants are checked with abort(); ASan and LeakSanitizer catch the rest.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rules/conf.h"
#include "rules/rule.h"
#include "rules/toxic_msg.h"
#include "rules/toxic_stream.h"

static const char fz_base_text[] = "listen rabbit {\n protocol amqp\n bind 127.0.0.1:1\n"
                                   " upstream 127.0.0.1:2\n}\n"
                                   "listen redis {\n protocol resp\n profile celery\n"
                                   " bind 127.0.0.1:3\n upstream 127.0.0.1:4\n}\n"
                                   "listen plain {\n protocol resp\n bind 127.0.0.1:5\n"
                                   " upstream 127.0.0.1:6\n}\n";

static struct conf *fz_base;

static const struct {
    const char *listener, *protocol, *profile;
} fz_listeners[] = {{"rabbit", "amqp", NULL}, {"redis", "resp", "celery"}, {"plain", "resp", NULL}};

static const char *const fz_stream_types[] = {"latency",    "bandwidth", "slow_close", "timeout",
                                              "reset_peer", "slicer",    "limit_data", "noop"};

static void fz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_toxic: invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    struct conf_diags d;
    conf_diags_init(&d);
    int rc = conf_parse_string("base", fz_base_text, strlen(fz_base_text), &fz_base, &d);
    conf_diags_free(&d);
    fz_check(rc == 0 && fz_base != NULL, "the base configuration parses");
    return 0;
}

static void fz_stream(const char *type, const json_t *attrs)
{
    enum toxic_kind kind;
    if (toxic_stream_kind(type, &kind) != 0)
        return;
    char err[512];
    struct toxic_stream t, again;
    memset(&t, 0, sizeof(t));
    if (toxic_stream_read(kind, attrs, NULL, &t, err, sizeof(err)) != 0) {
        fz_check(err[0] != '\0', "a refused stream toxic says why");
        return;
    }
    json_t *shown = toxic_stream_json(&t);
    if (shown == NULL)
        return; /* out of memory */
    memset(&again, 0, sizeof(again));
    fz_check(toxic_stream_read(kind, shown, NULL, &again, err, sizeof(err)) == 0,
             "a stream toxic's JSON reads back");
    fz_check(memcmp(t.attr, again.attr, sizeof(t.attr)) == 0,
             "a stream toxic's JSON reads back to the same attributes");
    json_decref(shown);
}

static void fz_message(const char *type, const char *stream, double toxicity, const json_t *attrs)
{
    if (!toxic_msg_is_message(type))
        return;
    for (size_t i = 0; i < sizeof(fz_listeners) / sizeof(fz_listeners[0]); i++) {
        char err[TOXIC_MSG_ERR_BYTES];
        err[0] = '\0';
        char *text = toxic_msg_rule_text("p.t", fz_listeners[i].listener, fz_listeners[i].protocol,
                                         fz_listeners[i].profile, type, stream, toxicity, attrs,
                                         err, sizeof(err));
        if (text == NULL) {
            fz_check(err[0] != '\0', "a refused message toxic says why");
            continue;
        }
        struct rule *rules = NULL;
        size_t n = 0;
        struct conf_diags d;
        conf_diags_init(&d);
        int rc = conf_parse_rules("toxic", text, strlen(text), fz_base, &rules, &n, &d);
        conf_diags_free(&d);
        if (rc == 0) {
            fz_check(n == 1, "a message toxic is one rule");
            fz_check(strcmp(rules->name, "p.t") == 0, "the rule has the toxic's name");
            fz_check(strcmp(rules->listener, fz_listeners[i].listener) == 0,
                     "the rule is on the toxic's listener");
        }
        rule_list_free(rules);
        /* toxic_msg_rule() builds and checks the same text: it accepts it when the parser did */
        struct rule *r = toxic_msg_rule(fz_base, "p.t", fz_listeners[i].listener, type, stream,
                                        toxicity, attrs, err, sizeof(err));
        if (rc == 0)
            fz_check(r != NULL || strstr(err, "memory") != NULL,
                     "toxic_msg_rule() accepts what the rule parser accepts");
        rule_list_free(r);
        free(text);
    }
}

static uint64_t fz_draw_state;

static uint64_t fz_draw(void *arg)
{
    (void)arg;
    fz_draw_state = fz_draw_state * 6364136223846793005u + 1442695040888963407u;
    return fz_draw_state >> 11;
}

static void fz_slicer(const uint8_t *data, size_t size)
{
    if (size < 6)
        return;
    uint64_t len = 1 + ((uint64_t)data[0] << 8 | data[1]);
    int64_t average = (int64_t)(data[2] << 8 | data[3]) - 16;
    int64_t variation = (int64_t)(data[4] << 8 | data[5]) - 16;
    fz_draw_state = size;
    struct toxic_slicer sl;
    toxic_slicer_init(&sl, average, variation);
    uint64_t avg = average < 1 ? 1 : (uint64_t)average;
    uint64_t var = variation < 0 ? 0 : (uint64_t)variation >= avg ? avg - 1 : (uint64_t)variation;
    uint64_t total = 0;
    size_t pieces = 0;
    do {
        uint64_t piece = toxic_slicer_next(&sl, len, fz_draw, NULL);
        fz_check(piece >= 1, "no empty piece");
        fz_check(piece <= avg + var || piece == len, "no piece above average + variation");
        toxic_slicer_took(&sl, piece);
        total += piece;
        fz_check(++pieces <= len, "no more pieces than bytes");
    } while (toxic_slicer_busy(&sl));
    fz_check(total == len, "the pieces add up to the chunk");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_slicer(data, size);
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    if (body == NULL)
        return 0;
    const json_t *type = toxic_json_get(body, "type");
    const json_t *stream = toxic_json_get(body, "stream");
    const json_t *tox = toxic_json_get(body, "toxicity");
    const json_t *attrs = toxic_json_get(body, "attributes");
    const char *s = json_is_string(stream) ? json_string_value(stream) : NULL;
    double toxicity = json_is_number(tox) ? json_number_value(tox) : 1.0;
    if (json_is_string(type)) {
        fz_stream(json_string_value(type), attrs);
        fz_message(json_string_value(type), s, toxicity, attrs);
    } else {
        for (size_t i = 0; i < sizeof(fz_stream_types) / sizeof(fz_stream_types[0]); i++)
            fz_stream(fz_stream_types[i], attrs);
        static const char *const msg[] = {"redeliver", "duplicate", "expire", "delay",
                                          "drop",      "error",     "close"};
        for (size_t i = 0; i < sizeof(msg) / sizeof(msg[0]); i++)
            fz_message(msg[i], s, toxicity, attrs);
    }
    json_decref(body);
    return 0;
}
