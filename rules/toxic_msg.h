/*
 * toxic_msg.h - message faults as Toxiproxy toxics: one toxic of type redeliver, duplicate,
 * expire, delay, drop, error or close, added to a parsed proxy through the Toxiproxy API,
 * becomes the text of one twice rule.
 *
 * A toxic's attributes say what the rule's `when`, triggers and `do` say:
 *
 *   {"type":"duplicate","toxicity":0.5,
 *    "attributes":{"event":"deliver","task":"tasks.charge","every":2,"after":"2s"}}
 *
 * is
 *
 *   rule NAME on PROXY {
 *     when deliver task=tasks.charge
 *     every 2
 *     probability 50%
 *     do duplicate after 2s
 *   }
 *
 * The text is parsed by conf_parse_rules(), like the body of the admin API's PUT /rules, so a
 * toxic and a rule file are the same engine, checked the same way and journaled the same way.
 * The attribute reference is docs/toxiproxy.md ("Message toxics").  Errors are one line, in
 * Toxiproxy's wording style, for the body {"error":"...","status":400}.
 *
 * Pure: no I/O.
 */
#ifndef TWICE_TOXIC_MSG_H
#define TWICE_TOXIC_MSG_H

#include "proto/base/must_check.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "rules/conf.h"
#include "rules/rule.h"

/* Room for an error message of the functions below, its NUL included. */
#define TOXIC_MSG_ERR_BYTES 512

/* Whether `type` is a message toxic type: redeliver, duplicate, expire, delay, drop, error,
 * close.  None of them is a Toxiproxy type.  NULL is false. */
bool toxic_msg_is_message(const char *type);

/* The text of the rule `rule_name` on listener `listener` that the toxic makes, malloc'ed and
 * owned by the caller; or NULL with a one-line message in err (errlen bytes): a wrong type,
 * protocol, stream, toxicity, rule name or attribute, or "out of memory".
 *
 * protocol is the listener's ("amqp" or "resp": a "tcp" listener has no message events);
 * profile is its resp profile (NULL: none).  stream may be NULL, "upstream" or "downstream",
 * and is not used: a message event has its own direction.  toxicity, from 0 to 1, is the
 * chance that an event the toxic matches is faulted: 1 writes no trigger, 0 writes the rule
 * `disabled`, anything between `probability P%`.  attributes is a JSON object or NULL. */
char *toxic_msg_rule_text(const char *rule_name, const char *listener, const char *protocol,
                          const char *profile, const char *type, const char *stream,
                          double toxicity, const json_t *attributes, char *err,
                          size_t errlen) TWICE_MUST_CHECK;

/* toxic_msg_rule_text() for the listener `listener` of `base` (its protocol and profile), then
 * that text parsed with conf_parse_rules() against `base`: the one rule, owned by the caller
 * (rule_list_free), or NULL with err: the attributes' mistake, or the parser's first error as
 * "MESSAGE (HINT)" (the generated text's line and column mean nothing to the client). */
struct rule *toxic_msg_rule(const struct conf *base, const char *rule_name, const char *listener,
                            const char *type, const char *stream, double toxicity,
                            const json_t *attributes, char *err, size_t errlen) TWICE_MUST_CHECK;

#endif
