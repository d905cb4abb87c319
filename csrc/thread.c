/* thread.c -- start and stop a service thread: the pager or the page server.
 *
 * DESIGN.  Each service thread (pager.c, server.c) owns a libzmq context, a
 * socket and the read end of a pipe, and polls the two.  It starts with
 * every signal blocked, so that signals go to the application's threads,
 * and under a name that top -H, perf and bench/scan.py's CPU figures show.
 * To stop it, its stop flag is set and a word written to the pipe, so that
 * its poll returns at once (the flag alone stops it within a poll period);
 * then it is joined, and its owner closes the sockets it made on the
 * context before cl_thread_close() ends the context (zmq_ctx_term waits
 * for every socket of the context).  A fork() keeps no thread but the
 * caller's, and libzmq is not fork-safe: a child abandons the parent's
 * context and socket, never closes them, and closes only its pipe.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "zmqdl.h"

int cl_thread_open(struct cl_thread *t, int socktype) {
    int rc, fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return cl_err(errno, "pipe2: %s", strerror(errno));
    t->pipe_r = fds[0];
    t->pipe_w = fds[1];
    atomic_store(&t->stop, 0);
    if (!(t->ctx = cl_zmq.ctx_new())) {
        rc = cl_err(EMFILE, "zmq_ctx_new failed");
        goto err;
    }
    if (!(t->sock = cl_security_socket(t->ctx, socktype))) {
        rc = EIO; // cl_security_socket left the detail
        goto err;
    }
    return 0;
err:
    cl_thread_close(t);
    return rc;
}

int cl_thread_start(struct cl_thread *t, void *(*fn)(void *), const char *name) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); // the new thread inherits this mask
    int rc = pthread_create(&t->th, NULL, fn, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) return cl_err(rc, "pthread_create: %s", strerror(rc));
    pthread_setname_np(t->th, name);
    t->running = true;
    return 0;
}

void cl_thread_join(struct cl_thread *t) {
    uint64_t word = CL_THREAD_STOP;
    atomic_store(&t->stop, 1);
    if (write(t->pipe_w, &word, sizeof word) < 0) { /* the flag alone stops it within a poll period */ }
    pthread_join(t->th, NULL);
    t->running = false;
}

void cl_thread_close(struct cl_thread *t) {
    if (t->sock) cl_zmq.close(t->sock);
    if (t->ctx) cl_zmq.ctx_term(t->ctx);
    t->sock = t->ctx = NULL;
    if (t->pipe_r >= 0) close(t->pipe_r);
    if (t->pipe_w >= 0) close(t->pipe_w);
    t->pipe_r = t->pipe_w = -1;
}

void cl_thread_abandon(struct cl_thread *t) {
    t->sock = t->ctx = NULL;
    t->running = false;
    cl_thread_close(t);
}
