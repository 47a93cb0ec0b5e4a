/*
 * conf_file.c - the configuration file, opened for rules/ (which opens no
 * file itself): `twice check`, `twice run`, SIGHUP and the admin API's reload.
 */
#include "proxy/core/conf_file.h"

#include <errno.h>
#include <stdio.h>

int conf_parse_file(const char *path, struct conf **out, struct conf_diags *diags)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return conf_cannot_open(path, errno, diags);
    int rc = conf_parse_stream(path, f, out, diags);
    fclose(f);
    return rc;
}
