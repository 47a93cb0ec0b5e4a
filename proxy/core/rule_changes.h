/*
 * rule_changes.h - changes of the rules in force, journaled as they are applied.
 *
 * The admin API (a rule switched on or off, the kill switch, PUT /rules, POST /reload) and
 * SIGHUP change the rules a run faults with while it runs.  Each change, once applied, is
 * journaled as a RULES record (proto/journal/journal.proto): what changed, who asked (the admin
 * client's address and request, or the signal), and the rules after it: how many, how many
 * are switched off, the kill switch, and the digest of the text they came from (the
 * configuration file, or the body of PUT /rules).  So a run's result can be read against the
 * rules that were in force, not only those it started with.  Main thread only.
 */
#ifndef TWICE_RULE_CHANGES_H
#define TWICE_RULE_CHANGES_H

#include <stddef.h>
#include <stdint.h>

#include "proxy/core/journal.h"

struct proxy;
struct evhttp_request;

/* SHA-256 of p[0..n). */
void rule_changes_sha256(const void *p, size_t n, uint8_t out[32]);

/* SHA-256 of the file at path (zeros when it cannot be read). */
void rule_changes_file_sha256(const char *path, uint8_t out[32]);

/* The rule text of an admin request body (PUT /rules, PUT /rules/NAME), as it is parsed:
 * the change it makes, if applied, is named by its digest. */
void rule_changes_body(struct proxy *px, const char *text, size_t len);

/*
 * A change the admin API has just applied for req, journaled with the client's address and
 * the request ("POST /rules/slow-ack/disable").  rule: the rule changed, else NULL.  The digest
 * of the rules in force after it (journal.proto's rules_sha256): the file's after RELOADED,
 * the body's after RULES_REPLACED, a chain of the digest before, the request line and the
 * body's after a one-rule edit; a switch leaves it as it was.
 */
void rule_changes_admin(struct proxy *px, struct evhttp_request *req, enum journal_change change,
                        const char *rule);

/* The reload a SIGHUP has just applied. */
void rule_changes_signal(struct proxy *px);

#endif
