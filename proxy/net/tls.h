/*
 * tls.h - OpenSSL contexts for the two sides of a listener.
 *
 * A listener may terminate TLS from its clients (`tls cert F key F`) and,
 * independently, originate TLS toward its upstream (`upstream-tls ...`).
 * Both sides require TLS 1.2 or newer.  Toward the upstream, the peer's
 * certificate is verified against the configured CA file (or the system
 * store) and its name is checked against `sni` or the upstream host, unless
 * the configuration says `no-verify`.
 */
#ifndef TWICE_TLS_H
#define TWICE_TLS_H

#include <openssl/ssl.h>
#include <stddef.h>

#include "rules/conf.h"

/* Build the server-side context of `cfg`.  Returns NULL and writes a
 * human-readable reason to `err` on failure (unreadable file, key not
 * matching the certificate, ...).  The caller owns the context. */
SSL_CTX *tls_server_ctx_new(const struct conf_tls_server *cfg, char *err, size_t errlen);

/* Build the client-side (upstream) context of `cfg`.  Same contract. */
SSL_CTX *tls_client_ctx_new(const struct conf_tls_client *cfg, char *err, size_t errlen);

/* Create the SSL object for one upstream connection: SNI and the host-name
 * (or IP) check are set from `cfg` and `upstream_host`.  NULL on failure. */
SSL *tls_client_ssl_new(SSL_CTX *ctx, const struct conf_tls_client *cfg, const char *upstream_host);

/* Describe why the handshake of `ssl` failed, given the OpenSSL error code
 * that libevent reported (0 when none): the certificate verification result
 * when verification failed, else the library's reason string. */
void tls_describe_error(SSL *ssl, unsigned long err, char *buf, size_t len);

/* Check every TLS setting of `conf` by building the contexts, adding a
 * diagnostic at the directive for each failure.  Returns the number of
 * errors added. */
unsigned tls_check_conf(const struct conf *conf, struct conf_diags *diags);

#endif
