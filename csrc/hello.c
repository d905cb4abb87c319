/* hello.c -- ask a page server for its region's geometry (clamor_hello).
 *
 * The one request made outside the pager: a worker asks before it attaches
 * (clamor/memory/region.py, connect()), so before this process has a region
 * or a pager, over a socket of its own that lives for the one HELLO and its
 * reply (wire.h).  The server's side of it is in server.c.
 */
#include <stdint.h>

#include "internal.h"
#include "wire.h"
#include "zmqdl.h"

int clamor_hello(const char *endpoint, uint64_t *base, uint64_t *size, uint64_t *page_size, int timeout_ms) {
    int rc = cl_zmq_require();
    if (rc) return rc;
    void *ctx = cl_zmq.ctx_new(), *s = ctx ? cl_security_socket(ctx, CL_ZMQ_DEALER) : NULL;
    if (!s) {
        rc = cl_err(EMFILE, "cannot create a socket for hello");
        goto out;
    }
    if (cl_zmq.connect(s, endpoint) != 0) {
        rc = cl_err(EINVAL, "cannot connect to %s: %s", endpoint, cl_zmq.strerror(cl_zmq.errno_()));
        goto out;
    }
    struct cl_wire_hdr h = {.type = CL_WIRE_HELLO, .tag = 7};
    uint8_t buf[CL_WIRE_HDR], geo[64];
    cl_wire_encode(&h, buf);
    cl_zmq.send(s, buf, sizeof buf, 0);
    cl_zmq_pollitem it = {s, 0, CL_ZMQ_POLLIN, 0};
    if (cl_zmq.poll(&it, 1, timeout_ms) <= 0) {
        rc = cl_err(ETIMEDOUT, "no answer from the page server at %s within %d ms", endpoint, timeout_ms);
        goto out;
    }
    int n = cl_zmq.recv(s, buf, sizeof buf, 0);
    struct cl_wire_hdr r;
    if (n != CL_WIRE_HDR || cl_wire_decode(buf, (size_t)n, &r) || r.type != CL_WIRE_HELLO_REPLY) {
        rc = cl_err(EPROTO, "the server at %s did not answer hello", endpoint);
        goto out;
    }
    n = cl_zmq.recv(s, geo, sizeof geo, 0);
    struct cl_wire_geo g;
    if (n != 32 || cl_wire_geo_decode(geo, 32, &g)) {
        rc = cl_err(EPROTO, "malformed hello reply from %s", endpoint);
        goto out;
    }
    *base = g.base;
    *size = g.size;
    *page_size = g.page_size;
out:
    if (s) cl_zmq.close(s);
    if (ctx) cl_zmq.ctx_term(ctx);
    return rc;
}
