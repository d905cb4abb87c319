/* pygate.c -- clamor's own Python threads keep out of heap() blocks.
 *
 * CPython's free lists (lists, tuples, dicts, floats, ...) are shared by all
 * threads of the interpreter.  A thread outside a heap() block that frees a
 * list while another thread is inside one puts an ordinary list on the free
 * list, and the block's next list comes from there: outside the region,
 * though the block made it.  share() refuses such an object; the user sees
 * a refusal that depends on timing.  clamor's own threads in the driver (the
 * ZAP handler of the control endpoint, woken by a worker's handshake) must
 * not be that other thread.
 *
 * A gate with two counts:
 *
 *   blocks  heap() blocks open in the process (close/open, nested ones
 *           counted each; suspended() opens the gate for the while)
 *   busy    clamor threads running Python code now
 *
 * clamor_py_gate_close() waits until busy is 0 before it counts the block,
 * so the caller's collection that empties the free lists comes after the
 * last free of a clamor thread.  A clamor thread waits for its sockets in
 * clamor_py_gate_poll(), which returns only once no block is open and counts
 * the thread busy; its Python work ends with clamor_py_gate_release().  The
 * wait happens in C with the GIL released (cffi releases it), so no Python
 * object is made or freed between the wake-up and the gate: the argument
 * tuple of the call is freed after it returns, while busy.
 *
 * An abort flag ends a wait for the gate: a thread stopping the guard while
 * another thread holds a block open must not wait for the block.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"
#include "zmqdl.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int blocks, busy;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A fork in the middle of another thread's lock would leave the child's
 * mutex held forever; the child has none of the parent's other threads. */
static void prefork(void) { pthread_mutex_lock(&mu); }
static void parent(void) { pthread_mutex_unlock(&mu); }
static void child(void) {
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv, NULL);
    blocks = busy = 0;
}
static void setup(void) { pthread_atfork(prefork, parent, child); }

void clamor_py_gate_close(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    blocks++;                       /* first: no clamor thread starts work from now on */
    while (busy) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

void clamor_py_gate_open(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    if (blocks > 0 && --blocks == 0) pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

int clamor_py_gate_blocks(void) {
    pthread_mutex_lock(&mu);
    int n = blocks;
    pthread_mutex_unlock(&mu);
    return n;
}

int clamor_py_gate_poll(const uintptr_t *sockets, int n, long timeout_ms, short *revents, const int *abort_) {
    pthread_once(&once, setup);
    if (n < 0 || n > CLAMOR_GATE_MAX_SOCKETS) return -EINVAL;
    if (!cl_zmq_loaded) return -ENOSYS;
    cl_zmq_pollitem items[CLAMOR_GATE_MAX_SOCKETS];
    for (int i = 0; i < n; i++) {
        items[i].socket = (void *)sockets[i];
        items[i].fd = 0;
        items[i].events = CL_ZMQ_POLLIN;
        items[i].revents = 0;
    }
    int rc = cl_zmq.poll(items, n, timeout_ms);
    if (rc < 0) rc = -cl_zmq.errno_();
    for (int i = 0; i < n; i++) revents[i] = rc > 0 ? items[i].revents : 0;
    pthread_mutex_lock(&mu);
    while (blocks && !atomic_load_explicit((_Atomic int *)abort_, memory_order_acquire))
        pthread_cond_wait(&cv, &mu);
    if (!blocks) busy++;
    else rc = -ECANCELED;           /* aborted while a block was open: not busy */
    pthread_mutex_unlock(&mu);
    return rc;
}

void clamor_py_gate_release(void) {
    pthread_mutex_lock(&mu);
    if (busy > 0 && --busy == 0) pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

void clamor_py_gate_wake(void) {
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}
