/*
 * version.c - `twice --version`.  See version.h.
 *
 * Each library is shown twice: the version of the headers twice was compiled with, and the
 * version of the shared library the dynamic linker loaded, as the library itself reports it.
 * They differ after a library upgrade without a rebuild (a Debian point release of OpenSSL),
 * which is what a bug report needs to say.
 */
#include "proxy/core/version.h"

#include <event2/event.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/opensslv.h>
#include <protobuf-c/protobuf-c.h>

#include "twice_commit.h"

void version_print(FILE *out)
{
    static const char row[] = "  %-11s %-16s %s\n";
    fprintf(out, "twice %s\n", TWICE_VERSION);
    fprintf(out, "commit %s\n", TWICE_COMMIT);
    fprintf(out, row, "library", "built with", "running with");
    fprintf(out, row, "libevent", LIBEVENT_VERSION, event_get_version());
    fprintf(out, row, "OpenSSL", OPENSSL_FULL_VERSION_STR,
            OpenSSL_version(OPENSSL_FULL_VERSION_STRING));
    fprintf(out, row, "jansson", JANSSON_VERSION, jansson_version_str());
    fprintf(out, row, "protobuf-c", PROTOBUF_C_VERSION, protobuf_c_version());
}
