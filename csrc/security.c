/* security.c -- every socket the core makes authenticates its peer.
 *
 * DESIGN.  The process's security is set once, before the page server and
 * the pager start (clamor_security()), and cl_security_socket() applies it to
 * each socket it opens, before the socket binds or connects:
 *
 *   CURVE   a ROUTER is a CURVE server with the cluster's server key; a
 *           DEALER a CURVE client that expects that key and presents the
 *           members' client key.  Encrypted.
 *   PLAIN   user "clamor" and the cluster's token.  Not encrypted: for
 *           trusted networks only; it authenticates.
 *
 * A server also sets ZMQ_ZAP_ENFORCE_DOMAIN, so that without a ZAP handler
 * libzmq refuses every peer rather than admitting all, and its thread answers
 * ZAP requests itself (cl_zap_open/cl_zap_serve on the server's context): a
 * peer is admitted only if it presents the members' client key (CURVE) or
 * the token (PLAIN).  Before that, libzmq hands the server no frame of the
 * peer's, so the core parses nothing an outsider sends.
 *
 * Keys are Z85 text, 40 characters (libzmq takes them with the terminating
 * NUL, 41 bytes).  The ZAP request carries the client key as 32 bytes, so
 * the members' key is also kept decoded.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "zmqdl.h"

#define Z85_KEY 40
#define CL_DEALER_SEND_TIMEOUT_MS 1000

static struct {
    int mode;
    char server_public[Z85_KEY + 1], server_secret[Z85_KEY + 1];
    char client_public[Z85_KEY + 1], client_secret[Z85_KEY + 1];
    uint8_t member[32];   /* client_public, decoded */
    char token[128];
} SEC;

static const char Z85_CHARS[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

static int z85_decode(const char *in, uint8_t out[32]) {
    if (strlen(in) != Z85_KEY) return -1;
    for (int i = 0; i < Z85_KEY; i += 5) {
        uint64_t v = 0;
        for (int j = 0; j < 5; j++) {
            const char *p = strchr(Z85_CHARS, in[i + j]);
            if (!p || !in[i + j]) return -1;
            v = v * 85 + (uint64_t)(p - Z85_CHARS);
        }
        if (v > 0xffffffffu) return -1;
        for (int j = 3; j >= 0; j--, v >>= 8) out[i / 5 * 4 + j] = (uint8_t)(v & 0xff);
    }
    return 0;
}

static int copy_key(char dst[Z85_KEY + 1], const char *src, const char *what) {
    uint8_t raw[32];
    if (!src || z85_decode(src, raw) != 0) return cl_err(EINVAL, "the %s is not a 40-character Z85 key", what);
    memcpy(dst, src, Z85_KEY + 1);
    return 0;
}

int clamor_security(int mode, const char *server_public, const char *server_secret, const char *client_public,
                    const char *client_secret, const char *token) {
    int rc;
    if (mode == CLAMOR_SECURITY_NONE) {
        memset(&SEC, 0, sizeof SEC);
        return 0;
    }
    if (mode == CLAMOR_SECURITY_CURVE) {
        if ((rc = copy_key(SEC.server_public, server_public, "server public key")) ||
            (rc = copy_key(SEC.server_secret, server_secret, "server secret key")) ||
            (rc = copy_key(SEC.client_public, client_public, "client public key")) ||
            (rc = copy_key(SEC.client_secret, client_secret, "client secret key")))
            return rc;
        z85_decode(SEC.client_public, SEC.member);
    } else if (mode == CLAMOR_SECURITY_PLAIN) {
        if (!token || !*token || strlen(token) >= sizeof SEC.token)
            return cl_err(EINVAL, "the PLAIN token must hold 1 to %zu characters", sizeof SEC.token - 1);
        snprintf(SEC.token, sizeof SEC.token, "%s", token);
    } else {
        return cl_err(EINVAL, "unknown security mode %d", mode);
    }
    SEC.mode = mode;
    return 0;
}

int clamor_security_mode(void) { return SEC.mode; }

static int opt(void *s, int name, const void *v, size_t n) {
    if (cl_zmq.setsockopt(s, name, v, n) == 0) return 0;
    return cl_err(EPROTO, "cannot set socket option %d: %s", name, cl_zmq.strerror(cl_zmq.errno_()));
}

int cl_security_apply(void *s, int type) {
    int one = 1;
    if (SEC.mode == CLAMOR_SECURITY_NONE) return 0;
    if (type == CL_ZMQ_ROUTER) {
        int rc = opt(s, CL_ZMQ_ZAP_DOMAIN, "clamor", 6);
        if (!rc) rc = opt(s, CL_ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one);
        if (rc) return rc;
        if (SEC.mode == CLAMOR_SECURITY_CURVE)
            return opt(s, CL_ZMQ_CURVE_SERVER, &one, sizeof one) ||
                   opt(s, CL_ZMQ_CURVE_SECRETKEY, SEC.server_secret, Z85_KEY + 1) ? EPROTO : 0;
        return opt(s, CL_ZMQ_PLAIN_SERVER, &one, sizeof one);
    }
    if (SEC.mode == CLAMOR_SECURITY_CURVE)
        return opt(s, CL_ZMQ_CURVE_SERVERKEY, SEC.server_public, Z85_KEY + 1) ||
               opt(s, CL_ZMQ_CURVE_PUBLICKEY, SEC.client_public, Z85_KEY + 1) ||
               opt(s, CL_ZMQ_CURVE_SECRETKEY, SEC.client_secret, Z85_KEY + 1) ? EPROTO : 0;
    return opt(s, CL_ZMQ_PLAIN_USERNAME, "clamor", 6) || opt(s, CL_ZMQ_PLAIN_PASSWORD, SEC.token, strlen(SEC.token))
               ? EPROTO : 0;
}

/* A socket of `type` on ctx with no linger and the process's security
 * applied (cl_security_apply), or NULL with the detail left. */
void *cl_security_socket(void *ctx, int type) {
    void *s = cl_zmq.socket(ctx, type);
    if (!s) {
        cl_err(cl_zmq.errno_(), "zmq_socket: %s", cl_zmq.strerror(cl_zmq.errno_()));
        return NULL;
    }
    int zero = 0;
    cl_zmq.setsockopt(s, CL_ZMQ_LINGER, &zero, sizeof zero);
    /* A DEALER's send fails (EAGAIN) rather than wait for ever where it
     * has no connection to send on: libzmq drops for good a connection
     * whose handshake failed on the mechanism or was refused by ZAP (a
     * port another cluster took), and a send there would block the thread
     * (the pager's: every fault of the process) with no end.  The callers
     * treat a failed send as a failed request. */
    if (type == CL_ZMQ_DEALER) {
        int ms = CL_DEALER_SEND_TIMEOUT_MS;
        cl_zmq.setsockopt(s, CL_ZMQ_SNDTIMEO, &ms, sizeof ms);
    }
    if (cl_security_apply(s, type) != 0) {
        cl_zmq.close(s);
        return NULL;
    }
    return s;
}

void *cl_zap_open(void *ctx) {
    if (SEC.mode == CLAMOR_SECURITY_NONE) return NULL;
    void *z = cl_zmq.socket(ctx, CL_ZMQ_REP);
    if (!z) {
        cl_err(EPROTO, "zmq_socket (ZAP): %s", cl_zmq.strerror(cl_zmq.errno_()));
        return NULL;
    }
    int zero = 0;
    cl_zmq.setsockopt(z, CL_ZMQ_LINGER, &zero, sizeof zero);
    if (cl_zmq.bind(z, "inproc://zeromq.zap.01") != 0) {
        cl_err(EADDRINUSE, "cannot bind the ZAP handler: %s", cl_zmq.strerror(cl_zmq.errno_()));
        cl_zmq.close(z);
        return NULL;
    }
    return z;
}

/* A ZAP request (RFC 27): version, request id, domain, address, identity,
 * mechanism, then the mechanism's credentials. */
#define ZAP_FRAMES 8

static void zap_answer(void *z) {
    char f[ZAP_FRAMES][256];
    int len[ZAP_FRAMES], n = 0, more = 1;
    size_t sz = sizeof more;
    while (more && n < ZAP_FRAMES) {
        len[n] = cl_zmq.recv(z, f[n], sizeof f[n], CL_ZMQ_DONTWAIT);
        if (len[n] < 0) return;
        if (len[n] > (int)sizeof f[n]) len[n] = -1;   /* truncated: never matches */
        n++;
        if (cl_zmq.getsockopt(z, CL_ZMQ_RCVMORE, &more, &sz) != 0) more = 0;
    }
    if (more) cl_zmq_drain(z);
    bool ok = false;
    if (n >= 7 && len[0] == 3 && !memcmp(f[0], "1.0", 3)) {
        if (SEC.mode == CLAMOR_SECURITY_CURVE && len[5] == 5 && !memcmp(f[5], "CURVE", 5))
            ok = len[6] == 32 && !memcmp(f[6], SEC.member, 32);
        else if (SEC.mode == CLAMOR_SECURITY_PLAIN && n >= 8 && len[5] == 5 && !memcmp(f[5], "PLAIN", 5))
            ok = len[7] >= 0 && (size_t)len[7] == strlen(SEC.token) && !memcmp(f[7], SEC.token, (size_t)len[7]);
    }
    if (ok) CL_COUNT(peers_admitted, 1);
    else CL_COUNT(peers_refused, 1);
    const char *status = ok ? "200" : "400", *text = ok ? "OK" : "not a member of this cluster";
    cl_zmq.send(z, "1.0", 3, CL_ZMQ_SNDMORE);
    cl_zmq.send(z, f[1], len[1] > 0 ? (size_t)len[1] : 0, CL_ZMQ_SNDMORE);
    cl_zmq.send(z, status, 3, CL_ZMQ_SNDMORE);
    cl_zmq.send(z, text, strlen(text), CL_ZMQ_SNDMORE);
    cl_zmq.send(z, "", 0, CL_ZMQ_SNDMORE);
    cl_zmq.send(z, "", 0, 0);
}

void cl_zap_serve(void *z) {
    for (int k = 0; k < 64; k++) {
        uint32_t ev = 0;
        size_t sz = sizeof ev;
        if (cl_zmq.getsockopt(z, CL_ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & CL_ZMQ_POLLIN)) return;
        zap_answer(z);
    }
}
