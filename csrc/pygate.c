/* pygate.c -- Python threads other than the user's keep out of heap() blocks.
 *
 * CPython's free lists (lists, tuples, dicts, floats, ...) are shared by all
 * threads of the interpreter.  A thread outside a heap() block that frees a
 * list while another thread is inside one puts an ordinary list on the free
 * list, and the block's next list comes from there: outside the region,
 * though the block made it.  share() refuses such an object; the user sees
 * a refusal that depends on timing.  The other threads of the driver must
 * not be that thread: clamor's own (the ZAP handler of the control
 * endpoint, woken by a worker's handshake; the Dask driver's control
 * endpoint and keeper), and an event loop that runs Python whenever it
 * likes (a Dask client's, which in a LocalCluster also runs the scheduler).
 *
 * DESIGN.  A gate with four counts and a generation:
 *
 *   blocks   heap() blocks open in the process (close/open, nested ones
 *            counted each; suspended() opens the gate for the while)
 *   busy     clamor threads running Python code now
 *   enlisted residents (threads that run Python whenever they like)
 *   parked   residents parked for the block now beginning or open (a
 *            resident still waking from the last block's park is not:
 *            counted so, the next block's settle ended at once, and the
 *            resident ran Python in that block before its knock parked it)
 *   gen      times the gate opened (blocks fell to 0)
 *
 * clamor_py_gate_close() waits until busy is 0 before it counts the block,
 * so the caller's collection that empties the free lists comes after the
 * last free of a clamor thread.  A clamor thread waits for its sockets (or
 * for a while) in clamor_py_gate_poll(), which returns only once no block
 * is open and counts the thread busy; its Python work ends with
 * clamor_py_gate_release().  The wait happens in C with the GIL released
 * (cffi releases it), so no Python object is made or freed between the
 * wake-up and the gate: the argument tuple of the call is freed after it
 * returns, while busy.
 *
 * A resident cannot be made to wait in C: it is asked (clamor/memory/
 * hooks.py knocks, with an event loop's call_soon_threadsafe) to call
 * clamor_py_gate_park() with the gate's generation at the knock, which
 * counts it parked and waits until the gate opens once.  Once, not until
 * no block is open: when blocks follow each other, the next block's close
 * comes before the parked resident wakes, and waits for a busy clamor
 * thread that may need the resident (the Dask keeper asks the scheduler
 * through its event loop): a resident that stayed parked for it deadlocked
 * the two.  A park of a block that ended (the knock's callback ran late)
 * returns at once.  The block's thread knocks only after clamor_py_gate_close(), so a
 * busy clamor thread may still use the loop to finish (the Dask keeper asks
 * the scheduler through it), then waits in clamor_py_gate_settle() until
 * every resident but itself is parked.  Enlisting and discharging count a
 * resident in and out.
 *
 * An abort flag ends a wait for the gate: a thread stopping the guard while
 * another thread holds a block open must not wait for the block, nor a
 * resident let out while the block runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "internal.h"
#include "zmqdl.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static int blocks, busy, enlisted, parked;
static unsigned long gen;   /* times the gate opened (blocks fell to 0) */
static pthread_once_t once = PTHREAD_ONCE_INIT;

// Timed waits run on the monotonic clock: a change of the wall clock must
// not end a settle early or make a sleep last.
static void cv_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &a);
    pthread_condattr_destroy(&a);
}

/* A fork in the middle of another thread's lock would leave the child's
 * mutex held forever; the child has none of the parent's other threads. */
static void prefork(void) { pthread_mutex_lock(&mu); }
static void parent(void) { pthread_mutex_unlock(&mu); }
static void child(void) {
    pthread_mutex_init(&mu, NULL);
    cv_init();
    blocks = busy = enlisted = parked = 0;
    gen = 0;
}
static void setup(void) {
    cv_init();
    pthread_atfork(prefork, parent, child);
}

static struct timespec deadline_in(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static inline int aborted(const int *abort_) {
    return atomic_load_explicit((_Atomic int *)abort_, memory_order_acquire);
}

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
    if (blocks > 0 && --blocks == 0) {
        gen++;
        parked = 0;          /* each park was for the block that ended */
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
}

unsigned long clamor_py_gate_generation(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    unsigned long g = gen;
    pthread_mutex_unlock(&mu);
    return g;
}

int clamor_py_gate_blocks(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    int n = blocks;
    pthread_mutex_unlock(&mu);
    return n;
}

int clamor_py_gate_poll(const uintptr_t *sockets, int n, long timeout_ms, short *revents, const int *abort_) {
    pthread_once(&once, setup);
    if (n < 0 || n > CLAMOR_GATE_MAX_SOCKETS) return -EINVAL;
    int rc = 0;
    if (n > 0) {
        if (!cl_zmq_loaded) return -ENOSYS;
        cl_zmq_pollitem items[CLAMOR_GATE_MAX_SOCKETS];
        for (int i = 0; i < n; i++) {
            items[i].socket = (void *)sockets[i];
            items[i].fd = 0;
            items[i].events = CL_ZMQ_POLLIN;
            items[i].revents = 0;
        }
        rc = cl_zmq.poll(items, n, timeout_ms);
        if (rc < 0) rc = -cl_zmq.errno_();
        for (int i = 0; i < n; i++) revents[i] = rc > 0 ? items[i].revents : 0;
    }
    pthread_mutex_lock(&mu);
    if (n == 0 && timeout_ms > 0) { /* a sleep that clamor_py_gate_wake() ends early for an abort */
        struct timespec until = deadline_in(timeout_ms);
        while (!aborted(abort_) && pthread_cond_timedwait(&cv, &mu, &until) != ETIMEDOUT) {
        }
    }
    while (blocks && !aborted(abort_)) pthread_cond_wait(&cv, &mu);
    if (aborted(abort_)) rc = -ECANCELED; /* not busy */
    else busy++;
    pthread_mutex_unlock(&mu);
    return rc;
}

void clamor_py_gate_release(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    if (busy > 0 && --busy == 0) pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

void clamor_py_gate_wake(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

void clamor_py_gate_enlist(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    enlisted++;
    pthread_mutex_unlock(&mu);
}

void clamor_py_gate_discharge(void) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    enlisted--;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

void clamor_py_gate_park(const int *abort_, unsigned long knocked) {
    pthread_once(&once, setup);
    pthread_mutex_lock(&mu);
    if (gen == knocked && blocks) {  /* (a knock of a block that ended is no park) */
        parked++;
        pthread_cond_broadcast(&cv);
        while (blocks && gen == knocked && !aborted(abort_)) pthread_cond_wait(&cv, &mu);
        if (gen == knocked) parked--; /* (an opening counted it out) */
    }
    pthread_mutex_unlock(&mu);
}

int clamor_py_gate_settle(int mine, long timeout_ms) {
    pthread_once(&once, setup);
    struct timespec until = deadline_in(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&mu);
    while (enlisted - parked > mine && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cv, &mu, &until);
    rc = enlisted - parked > mine ? ETIMEDOUT : 0;
    pthread_mutex_unlock(&mu);
    return rc;
}
