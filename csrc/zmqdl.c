/* zmqdl.c -- resolve libzmq from the copy pyzmq loaded.
 *
 * The path normally comes from Python, which finds the libzmq that pyzmq
 * mapped (see clamor/_native.py).  dlopen() of an already-loaded library
 * returns the same handle, so clamor and pyzmq share one libzmq.  C programs
 * (tests/c, bench/fault_micro.c) pass a path or set CLAMOR_LIBZMQ.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "zmqdl.h"

struct cl_zmq cl_zmq;
int cl_zmq_loaded;

#define SYM(field, name)                                                           \
    do {                                                                           \
        *(void **)&z.field = dlsym(h, name);                                       \
        if (!z.field) {                                                            \
            rc = cl_err(ENOSYS, "libzmq at %s has no symbol %s; reinstall pyzmq "  \
                        "(pip install --force-reinstall pyzmq)", path, name);      \
            goto err;                                                              \
        }                                                                          \
    } while (0)

int clamor_zmq_load(const char *path) {
    if (cl_zmq_loaded) return 0;
    if (!path || !*path) path = getenv("CLAMOR_LIBZMQ");
    if (!path || !*path) path = "libzmq.so.5";
    int rc;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(path, RTLD_NOW);
    if (!h)
        return cl_err(ENOENT, "cannot load libzmq from %s (%s); install pyzmq (pip install pyzmq) "
                      "or set CLAMOR_LIBZMQ to a libzmq.so", path, dlerror());
    struct cl_zmq z;
    SYM(ctx_new, "zmq_ctx_new");
    SYM(ctx_term, "zmq_ctx_term");
    SYM(socket, "zmq_socket");
    SYM(close, "zmq_close");
    SYM(setsockopt, "zmq_setsockopt");
    SYM(getsockopt, "zmq_getsockopt");
    SYM(bind, "zmq_bind");
    SYM(connect, "zmq_connect");
    SYM(send, "zmq_send");
    SYM(recv, "zmq_recv");
    SYM(msg_init, "zmq_msg_init");
    SYM(msg_init_size, "zmq_msg_init_size");
    SYM(msg_send, "zmq_msg_send");
    SYM(msg_recv, "zmq_msg_recv");
    SYM(msg_close, "zmq_msg_close");
    SYM(msg_data, "zmq_msg_data");
    SYM(msg_size, "zmq_msg_size");
    SYM(msg_more, "zmq_msg_more");
    SYM(poll, "zmq_poll");
    SYM(errno_, "zmq_errno");
    SYM(strerror, "zmq_strerror");
    cl_zmq = z;
    cl_zmq_loaded = 1;
    return 0;
err:
    dlclose(h);
    return rc;
}

/* Python loads pyzmq's copy on import (clamor/_native.py); a C program
 * that did not call clamor_zmq_load() gets the default lookup the first
 * time the core needs a socket (clamor.h: clamor_pager_start). */
int cl_zmq_require(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (cl_zmq_loaded) return 0;
    pthread_mutex_lock(&lock);
    int rc = clamor_zmq_load(NULL);
    pthread_mutex_unlock(&lock);
    return rc;
}

void cl_zmq_drain(void *sock) {
    int more = 1;
    size_t sz = sizeof more;
    while (cl_zmq.getsockopt(sock, CL_ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        cl_zmq_msg m;
        cl_zmq.msg_init(&m);
        if (cl_zmq.msg_recv(&m, sock, CL_ZMQ_DONTWAIT) < 0) {
            cl_zmq.msg_close(&m);
            break;
        }
        cl_zmq.msg_close(&m);
        sz = sizeof more;
    }
}
