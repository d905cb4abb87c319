/* peers.c -- the pager's side of dynamic replication: its sockets to peer
 * workers' page servers, and the driver's holder hints.
 *
 * DESIGN.  A fetch the driver redirects costs the requester two round trips
 * (driver, then peer).  On a CPU-bound machine that extra trip cost the
 * workers more than the driver saved (issue 6: 1.16x the time of no
 * replication on loopback).  So the driver's replies carry hints (wire.h,
 * CL_WIRE_HINTS): for a window of pages, a peer that holds each one
 * (directory.c).  The pager keeps them in a table of one byte per page and
 * sends a later fetch of a hinted page straight to that peer
 * (CL_WIRE_DIRECT): one round trip, as from the driver.
 *
 * A hint is only a guess, checked where it matters.  The driver hands hints
 * out only with replies to requests of its current version; the table holds
 * the hints of one version and is cleared when the worker's version changes;
 * the peer serves a direct request only if it holds the page and runs that
 * same version (server.c), since a worker's pages are as its current version
 * has them (it drops changed pages before it takes a new version).  A
 * refusal or a silence sends the fetch to the driver, as after a redirect,
 * and a silent peer gets no more direct requests until the driver
 * redirects to it again (it may be gone, and its number given to a new
 * peer that this worker has no socket to yet).
 *
 * Only the pager thread calls these functions, except clamor_peer_gone
 * (any thread: the driver's word that a peer is lost, read by the pager
 * under gone_lock).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "wire.h"
#include "zmqdl.h"

static struct {
    void *sock[CL_PEERS_MAX]; /* DEALER per peer page server, by the driver's number */
    char ep[CL_PEERS_MAX][256]; /* the endpoint each socket is connected to */
    bool silent[CL_PEERS_MAX]; /* no direct requests to it until a redirect names it again */
    uint8_t *hint;             /* per page: 0, or peer + 1 */
    uint64_t npages;           /* length of hint */
    uint64_t lo, hi;           /* hints set since the last clear lie in [lo, hi) */
    uint32_t version;            /* the version the hints are for */
} H;

void *cl_peer_sock(int k) { return k >= 0 && k < CL_PEERS_MAX ? H.sock[k] : NULL; }

/* Peers the driver declared lost, by page-server endpoint (any thread adds;
 * the pager reads them when the generation moves).  A socket to one of them
 * gets no more hinted requests: the driver may have given its number to a
 * new peer, and a request there would wait PEER_TIMEOUT_NS for nothing. */
#define GONE_MAX 16
static pthread_mutex_t gone_lock = PTHREAD_MUTEX_INITIALIZER;
static char gone[GONE_MAX][256];
static unsigned ngone;
static _Atomic unsigned gone_gen;
static unsigned gone_seen;

void clamor_peer_gone(const char *endpoint) {
    if (!endpoint || strlen(endpoint) >= sizeof gone[0]) return;
    pthread_mutex_lock(&gone_lock);
    strcpy(gone[ngone++ % GONE_MAX], endpoint);
    pthread_mutex_unlock(&gone_lock);
    atomic_fetch_add(&gone_gen, 1);
}

static void forget_gone(const char *endpoint) {
    pthread_mutex_lock(&gone_lock);
    for (unsigned g = 0; g < GONE_MAX; g++)
        if (strcmp(gone[g], endpoint) == 0) gone[g][0] = '\0';
    pthread_mutex_unlock(&gone_lock);
}

static void silence_gone(void) {
    unsigned gen = atomic_load(&gone_gen);
    if (gen == gone_seen) return;
    gone_seen = gen;
    pthread_mutex_lock(&gone_lock);
    for (int k = 0; k < CL_PEERS_MAX; k++)
        for (unsigned g = 0; H.sock[k] && g < GONE_MAX; g++)
            if (gone[g][0] && strcmp(gone[g], H.ep[k]) == 0) H.silent[k] = true;
    pthread_mutex_unlock(&gone_lock);
}

bool cl_peer_is(int k, const char *endpoint) {
    return k >= 0 && k < CL_PEERS_MAX && H.sock[k] && strcmp(H.ep[k], endpoint) == 0;
}

/* The socket to the driver's peer number k at `endpoint`.  The driver
 * reuses the number of a lost peer for a new one: a different endpoint
 * replaces the socket (the pager first sends what it still asked of the old
 * one to the driver, pager.c follow_redirect).  A redirect to k also lifts
 * a silence: the driver has just seen k serve. */
void *cl_peer_connect(void *ctx, int k, const char *endpoint) {
    if (k < 0 || k >= CL_PEERS_MAX || strlen(endpoint) >= sizeof H.ep[k]) return NULL;
    H.silent[k] = false;
    if (H.sock[k] && strcmp(H.ep[k], endpoint) == 0) return H.sock[k];
    if (H.sock[k]) cl_zmq.close(H.sock[k]);
    forget_gone(endpoint); /* a new peer at a lost one's endpoint */
    void *s = cl_security_socket(ctx, CL_ZMQ_DEALER);
    if (s && cl_zmq.connect(s, endpoint) != 0) {
        cl_zmq.close(s);
        s = NULL;
    }
    strcpy(H.ep[k], s ? endpoint : "");
    return H.sock[k] = s;
}

int cl_peer_pollitems(cl_zmq_pollitem *it) {
    int n = 0;
    for (int k = 0; k < CL_PEERS_MAX; k++)
        if (H.sock[k]) it[n++] = (cl_zmq_pollitem){H.sock[k], 0, CL_ZMQ_POLLIN, 0};
    return n;
}

static void clear_hints(uint32_t version) {
    if (H.hi > H.lo) { /* give the touched pages back: they read as zero again */
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        size_t a = (size_t)H.lo & ~(pg - 1), b = ((size_t)H.hi + pg - 1) & ~(pg - 1);
        if (madvise(H.hint + a, b - a, MADV_DONTNEED) != 0) memset(H.hint + H.lo, 0, (size_t)(H.hi - H.lo));
    }
    H.lo = UINT64_MAX;
    H.hi = 0;
    H.version = version;
}

/* abandon: after fork, the sockets belong to the parent's libzmq state. */
void cl_peer_close_all(bool abandon) {
    for (int k = 0; k < CL_PEERS_MAX; k++)
        if (H.sock[k] && !abandon) cl_zmq.close(H.sock[k]);
    memset(H.sock, 0, sizeof H.sock);
    memset(H.ep, 0, sizeof H.ep);
    memset(H.silent, 0, sizeof H.silent);
    if (H.hint) clear_hints(0);
}

void cl_peer_silent(int k) {
    if (k >= 0 && k < CL_PEERS_MAX) H.silent[k] = true;
}

/* Read the hints frame that follows on `sock` (the driver's reply to a
 * request of `version`); a malformed one is ignored. */
void cl_hints_take(void *sock, uint32_t version) {
    int more = 0;
    size_t sz = sizeof more;
    /* never read past the reply: a flag without its frame is only ignored */
    if (cl_zmq.getsockopt(sock, CL_ZMQ_RCVMORE, &more, &sz) != 0 || !more) return;
    cl_zmq_msg m;
    cl_zmq.msg_init(&m);
    if (cl_zmq.msg_recv(&m, sock, CL_ZMQ_DONTWAIT) < 0) goto out;
    size_t len = cl_zmq.msg_size(&m);
    const uint8_t *b = cl_zmq.msg_data(&m);
    if (len <= 8 || len > 8 + CL_WIRE_MAX_HINTS || version != atomic_load(&cl_worker_version)) goto out;
    if (!H.hint || H.npages != cl_region.npages) {
        if (H.hint) munmap(H.hint, H.npages);
        void *t = mmap(NULL, cl_region.npages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        H.hint = t == MAP_FAILED ? NULL : t;
        H.npages = H.hint ? cl_region.npages : 0;
        H.lo = UINT64_MAX;
        H.hi = 0;
        H.version = version;
        if (!H.hint) goto out;
    }
    if (version != H.version) clear_hints(version);
    uint64_t first = 0, n = len - 8;
    for (int i = 0; i < 8; i++) first |= (uint64_t)b[i] << (8 * i);
    if (first >= H.npages || n > H.npages - first) goto out;
    memcpy(H.hint + first, b + 8, n); /* the driver's latest word, "none" included */
    if (first < H.lo) H.lo = first;
    if (first + n > H.hi) H.hi = first + n;
out:
    cl_zmq.msg_close(&m);
}

/* The peer to ask directly for [first, first+count) at `version`, or -1. */
int cl_hints_peer(uint64_t first, uint32_t count, uint32_t version) {
    silence_gone();
    if (!H.hint || version != H.version || first < H.lo || first + count > H.hi) return -1;
    uint8_t v = H.hint[first];
    for (uint64_t p = first + 1; p < first + count; p++)
        if (H.hint[p] != v) return -1;
    int k = (int)v - 1;
    return k >= 0 && H.sock[k] && !H.silent[k] ? k : -1;
}
