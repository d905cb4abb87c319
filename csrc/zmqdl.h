/* zmqdl.h -- the few libzmq functions clamor uses, resolved at run time.
 *
 * clamor links no libzmq.  pyzmq's wheel ships one (pyzmq.libs/libzmq-*.so);
 * clamor_zmq_load() resolves these functions from that same library, so one
 * libzmq serves the whole process.  The constants below are libzmq's stable
 * ABI values (zmq.h, libzmq 4.x).
 */
#ifndef CLAMOR_ZMQDL_H
#define CLAMOR_ZMQDL_H

#include <stddef.h>

#define CL_ZMQ_REP 4
#define CL_ZMQ_DEALER 5
#define CL_ZMQ_ROUTER 6
#define CL_ZMQ_DONTWAIT 1
#define CL_ZMQ_SNDMORE 2
#define CL_ZMQ_SNDHWM 23
#define CL_ZMQ_SNDTIMEO 28
#define CL_ZMQ_MAXMSGSIZE 22
#define CL_ZMQ_RCVMORE 13
#define CL_ZMQ_LINGER 17
#define CL_ZMQ_EVENTS 15
#define CL_ZMQ_LAST_ENDPOINT 32
#define CL_ZMQ_PLAIN_SERVER 44
#define CL_ZMQ_PLAIN_USERNAME 45
#define CL_ZMQ_PLAIN_PASSWORD 46
#define CL_ZMQ_CURVE_SERVER 47
#define CL_ZMQ_CURVE_PUBLICKEY 48
#define CL_ZMQ_CURVE_SECRETKEY 49
#define CL_ZMQ_CURVE_SERVERKEY 50
#define CL_ZMQ_ZAP_DOMAIN 55
#define CL_ZMQ_ZAP_ENFORCE_DOMAIN 93
#define CL_ZMQ_POLLIN 1
#define CL_ZMQ_ETERM (156384712 + 53)

typedef union cl_zmq_msg {
    unsigned char _[64];
    void *align;
} cl_zmq_msg;

typedef struct cl_zmq_pollitem {
    void *socket;
    int fd;
    short events;
    short revents;
} cl_zmq_pollitem;

struct cl_zmq {
    void *(*ctx_new)(void);
    int (*ctx_term)(void *);
    void *(*socket)(void *, int);
    int (*close)(void *);
    int (*setsockopt)(void *, int, const void *, size_t);
    int (*getsockopt)(void *, int, void *, size_t *);
    int (*bind)(void *, const char *);
    int (*connect)(void *, const char *);
    int (*send)(void *, const void *, size_t, int);
    int (*recv)(void *, void *, size_t, int);
    int (*msg_init)(cl_zmq_msg *);
    int (*msg_init_size)(cl_zmq_msg *, size_t);
    int (*msg_send)(cl_zmq_msg *, void *, int);
    int (*msg_recv)(cl_zmq_msg *, void *, int);
    int (*msg_close)(cl_zmq_msg *);
    void *(*msg_data)(cl_zmq_msg *);
    size_t (*msg_size)(const cl_zmq_msg *);
    int (*msg_more)(const cl_zmq_msg *);
    int (*poll)(cl_zmq_pollitem *, int, long);
    int (*errno_)(void);
    const char *(*strerror)(int);
};

/* Filled by clamor_zmq_load(); `loaded` is 0 until then. */
extern struct cl_zmq cl_zmq;
extern int cl_zmq_loaded;

/* 0 once libzmq is loaded (by clamor_zmq_load(NULL) if nothing loaded it
 * before), else its ENOENT or ENOSYS with the detail. */
int cl_zmq_require(void);


/* Drain and drop the remaining frames of a multipart message. */
void cl_zmq_drain(void *sock);

#endif /* CLAMOR_ZMQDL_H */
