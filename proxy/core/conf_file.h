/*
 * conf_file.h - reading the configuration file (rules/conf.h parses it).
 */
#ifndef TWICE_CONF_FILE_H
#define TWICE_CONF_FILE_H

#include "proto/base/must_check.h"

#include "rules/conf.h"

/* Opens the file at `path` and parses it (conf_parse_stream): 0 and a new
 * configuration in *out (the caller's: conf_free), or -1 with *out NULL and
 * every problem in `diags`, "cannot open: REASON" among them. */
int conf_parse_file(const char *path, struct conf **out, struct conf_diags *diags) TWICE_MUST_CHECK;

#endif
