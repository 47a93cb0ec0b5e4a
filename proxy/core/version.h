/*
 * version.h - what `twice --version` says: the version, the git commit it was built from, and
 * each library's version as built against and as loaded at run time.
 */
#ifndef TWICE_PROXY_VERSION_H
#define TWICE_PROXY_VERSION_H

#include <stdio.h>

/* Prints to out: "twice VERSION", "commit C" (`git describe --always --dirty` at build time,
 * "unknown" when twice was not built from a git work tree), then one row per library with the
 * version twice was compiled against and the version loaded at run time. */
void version_print(FILE *out);

#endif
