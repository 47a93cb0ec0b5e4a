/*
 * tls.c - OpenSSL contexts for both sides of a listener.  See tls.h.
 */
#include "proxy/net/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

/* The most recent OpenSSL error, or `fallback`, into `err`. */
static void last_error(const char *what, const char *file, char *err, size_t errlen)
{
    unsigned long e = ERR_peek_last_error();
    char reason[256] = "unknown error";
    if (e != 0)
        ERR_error_string_n(e, reason, sizeof(reason));
    if (file != NULL)
        snprintf(err, errlen, "%s '%s': %s", what, file, reason);
    else
        snprintf(err, errlen, "%s: %s", what, reason);
    ERR_clear_error();
}

static SSL_CTX *ctx_new(const SSL_METHOD *method, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(method);
    if (ctx == NULL) {
        last_error("cannot create TLS context", NULL, err, errlen);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* A peer that closes TCP without close_notify is an ordinary EOF for a
     * proxy of broker protocols: the protocol frames its own messages. */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    return ctx;
}

static int load_cert_and_key(SSL_CTX *ctx, const char *cert, const char *key, char *err,
                             size_t errlen)
{
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        last_error("cannot load certificate", cert, err, errlen);
        return -1;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        last_error("cannot load private key", key, err, errlen);
        return -1;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "private key '%s' does not match certificate '%s'", key, cert);
        ERR_clear_error();
        return -1;
    }
    return 0;
}

SSL_CTX *tls_server_ctx_new(const struct conf_tls_server *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = ctx_new(TLS_server_method(), err, errlen);
    if (ctx == NULL)
        return NULL;
    if (load_cert_and_key(ctx, cfg->cert, cfg->key, err, errlen) != 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

SSL_CTX *tls_client_ctx_new(const struct conf_tls_client *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = ctx_new(TLS_client_method(), err, errlen);
    if (ctx == NULL)
        return NULL;
    if (cfg->verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = cfg->ca != NULL ? SSL_CTX_load_verify_locations(ctx, cfg->ca, NULL)
                                 : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            last_error("cannot load CA file", cfg->ca ? cfg->ca : "(system default)", err, errlen);
            SSL_CTX_free(ctx);
            return NULL;
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    if (cfg->cert != NULL && load_cert_and_key(ctx, cfg->cert, cfg->key, err, errlen) != 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static int is_ip_literal(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

SSL *tls_client_ssl_new(SSL_CTX *ctx, const struct conf_tls_client *cfg, const char *upstream_host)
{
    SSL *ssl = SSL_new(ctx);
    if (ssl == NULL)
        return NULL;
    const char *name = cfg->sni != NULL ? cfg->sni : upstream_host;
    int ip = is_ip_literal(name);
    /* RFC 6066: SNI carries host names only, never address literals. */
    if (!ip && SSL_set_tlsext_host_name(ssl, name) != 1)
        goto fail;
    if (cfg->verify) {
        if (ip) {
            X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
            if (X509_VERIFY_PARAM_set1_ip_asc(param, name) != 1)
                goto fail;
        } else if (SSL_set1_host(ssl, name) != 1) {
            goto fail;
        }
    }
    return ssl;
fail:
    SSL_free(ssl);
    return NULL;
}

void tls_describe_error(SSL *ssl, unsigned long err, char *buf, size_t len)
{
    long vr = ssl != NULL ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (vr != X509_V_OK) {
        snprintf(buf, len, "certificate verify failed: %s", X509_verify_cert_error_string(vr));
        return;
    }
    if (err == 0)
        err = ERR_peek_last_error();
    if (err != 0) {
        char reason[256];
        ERR_error_string_n(err, reason, sizeof(reason));
        snprintf(buf, len, "%s", reason);
    } else {
        snprintf(buf, len, "connection closed during TLS handshake");
    }
    ERR_clear_error();
}

unsigned tls_check_conf(const struct conf *conf, struct conf_diags *diags)
{
    unsigned errors = 0;
    char err[512];
    for (const struct conf_listener *l = conf->listeners; l != NULL; l = l->next) {
        if (l->tls.enabled) {
            SSL_CTX *ctx = tls_server_ctx_new(&l->tls, err, sizeof(err));
            if (ctx == NULL) {
                conf_diag_add(diags, CONF_ERROR, l->tls.loc, NULL, "listener '%s': %s", l->name,
                              err);
                errors++;
            }
            SSL_CTX_free(ctx);
        }
        if (l->upstream_tls.enabled) {
            SSL_CTX *ctx = tls_client_ctx_new(&l->upstream_tls, err, sizeof(err));
            if (ctx == NULL) {
                conf_diag_add(diags, CONF_ERROR, l->upstream_tls.loc, NULL, "listener '%s': %s",
                              l->name, err);
                errors++;
            }
            SSL_CTX_free(ctx);
        }
    }
    return errors;
}
