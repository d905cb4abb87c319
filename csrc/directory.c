/* directory.c -- the driver's page directory: which worker holds which page.
 *
 * DESIGN.  Dynamic replication (paper section 4.2).  Each worker's pager
 * registers the endpoint of its own page server when it connects (REGISTER,
 * wire.h).  When the driver serves page p to a registered worker, that
 * worker becomes a holder of p: the report rides on the request itself, so
 * it costs no extra round trip.  A later request for p may then be answered
 * with REDIRECT to a holder instead of the bytes; the requester fetches from
 * that peer, and if the peer no longer has the page (invalidated, evicted,
 * gone, or silent for a second) it asks the driver again with NOREDIRECT and
 * PEERMISS, and the driver forgets that holder.  So a request never fails
 * for lack of a peer.
 *
 * Versions: holders only ever hold the current version of a page.  When the
 * driver changes p (clamor_version_begin), its holders are cleared and the
 * version is noted; a request for an older version than that is always served
 * by the driver, from its versions.
 *
 * Policies: off; random (a uniform holder, as in the paper); two-choices
 * (the less loaded of two random holders, load being the redirects sent to
 * it recently, decayed; the paper names this as future work).  The random
 * generator is xorshift64*, seeded from the clock and the process id.
 *
 * Hints: a redirect costs the requester a second round trip, which on a
 * CPU-bound machine costs more than the driver saves.  So each reply to a
 * registered worker's request of the current version carries, for the next
 * window of its sweep over the pages held so far, one holder per page (a
 * uniform pick among holders other than the requester), and the worker sends
 * a later fetch of such a page straight to that peer (peers.c).  A hint is a
 * guess: the peer serves it only if it holds the page and runs that same
 * version (server.c), else the requester asks here as before.
 *
 * Only the page-server thread touches the directory, except the version call,
 * which clears holders under dir_lock.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define MAXPEERS 64
#define HINT_WINDOW 1024 /* pages per reply: 1 KiB against a 64 KiB page */

static struct {
    uint64_t *holders;          /* per page: bitmap of peers */
    uint32_t *changed_at;       /* per page: version of its last change */
    int policy;
    int npeers;
    struct {
        uint8_t id[64];
        size_t idlen;
        char endpoint[200];
        double load;
        uint64_t hint_next; /* where its hint sweep goes on */
    } peer[MAXPEERS];
    uint64_t hi;                /* pages at or past it were never recorded held */
    uint64_t rng;
} D;

static pthread_mutex_t dir_lock = PTHREAD_MUTEX_INITIALIZER;

void clamor_set_replication(int policy) { D.policy = policy < 0 || policy > 2 ? 0 : policy; }
int clamor_replication(void) { return D.policy; }

static int ensure(void) {
    if (D.holders) return 0;
    uint64_t n = cl_region.npages;
    void *h = mmap(NULL, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *c = mmap(NULL, n * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (h == MAP_FAILED || c == MAP_FAILED) return ENOMEM;
    D.holders = h;
    D.changed_at = c;
    D.rng = cl_now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ull;
    return 0;
}

static uint64_t rnd(void) {
    uint64_t x = D.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    D.rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static void clear_bits(uint64_t keep) {
    for (uint64_t p = 0; D.holders && p < D.hi; p++)
        if (D.holders[p] & ~keep) __atomic_and_fetch(&D.holders[p], keep, __ATOMIC_SEQ_CST);
}

/* Called on the page-server thread, as cl_dir_served is.  A forgotten
 * peer's slot is reused (replacement workers would otherwise run out of
 * the 64 after enough losses, and replication would stop).  Its holder bits
 * are cleared again first: a request of the old peer that the server was
 * answering while the peer was forgotten may have set some after
 * clamor_replication_forget cleared them, and they must not name the new
 * one.  A worker reaches a reused slot's new endpoint on a redirect
 * (peers.c reconnects when the endpoint differs). */
int cl_dir_register(const void *id, size_t idlen, const char *endpoint, size_t eplen) {
    if (idlen == 0 || idlen > sizeof D.peer[0].id || eplen == 0 || eplen >= sizeof D.peer[0].endpoint) return EINVAL;
    pthread_mutex_lock(&dir_lock);
    int rc = ensure(), slot = -1;
    for (int i = 0; !rc && i < D.npeers; i++)
        if (D.peer[i].idlen == idlen && !memcmp(D.peer[i].id, id, idlen)) slot = i;
    for (int i = 0; !rc && slot < 0 && i < D.npeers; i++)
        if (D.peer[i].idlen == 0) {
            slot = i;
            clear_bits(~(1ull << i));
            memset(&D.peer[i], 0, sizeof D.peer[i]);
        }
    if (!rc && slot < 0) {
        if (D.npeers == MAXPEERS) rc = ENOSPC;
        else slot = D.npeers++;
    }
    if (!rc) {
        memcpy(D.peer[slot].id, id, idlen);
        D.peer[slot].idlen = idlen;
        memcpy(D.peer[slot].endpoint, endpoint, eplen);
        D.peer[slot].endpoint[eplen] = '\0';
    }
    pthread_mutex_unlock(&dir_lock);
    return rc;
}

int cl_dir_peer_of(const void *id, size_t idlen) {
    for (int i = 0; i < D.npeers; i++)
        if (D.peer[i].idlen == idlen && !memcmp(D.peer[i].id, id, idlen)) return i;
    return -1;
}

/* A peer to redirect [first, first+count) to for a request of `version` from
 * peer `self` (-1: unregistered), or -1 to serve it here. */
int cl_dir_choose(uint64_t first, uint32_t count, uint32_t version, int self, const char **endpoint) {
    /* Before versions begin, the driver may write any page at any time and no
     * one tells the workers: their copies cannot stand in for the driver's. */
    if (!D.policy || !D.holders || !cl_version_active()) return -1;
    uint64_t mask = ~0ull;
    for (uint64_t p = first; p < first + count && mask; p++) {
        if (version && version < D.changed_at[p]) return -1; /* an old version: ours only */
        mask &= D.holders[p];
    }
    if (self >= 0) mask &= ~(1ull << self);
    if (!mask) return -1;
    int cand[MAXPEERS], n = 0;
    for (int i = 0; i < D.npeers; i++)
        if ((mask >> i & 1) && D.peer[i].endpoint[0]) cand[n++] = i;
    if (!n) return -1;
    int pick = cand[rnd() % (uint64_t)n];
    if (D.policy == 2 && n > 1) {
        int other = cand[rnd() % (uint64_t)n];
        if (D.peer[other].load < D.peer[pick].load) pick = other;
    }
    for (int i = 0; i < D.npeers; i++) D.peer[i].load *= 0.995; /* recent redirects weigh most */
    D.peer[pick].load += 1.0;
    *endpoint = D.peer[pick].endpoint;
    return pick;
}

/* The driver served [first, first+count) at the current version to `peer`. */
void cl_dir_served(uint64_t first, uint32_t count, uint32_t version, int peer) {
    if (peer < 0 || !D.holders || !cl_version_active()) return;
    if (first + count > D.hi) D.hi = first + count;
    for (uint64_t p = first; p < first + count; p++) {
        if (version && version < __atomic_load_n(&D.changed_at[p], __ATOMIC_SEQ_CST)) continue; /* an old version */
        __atomic_or_fetch(&D.holders[p], 1ull << peer, __ATOMIC_SEQ_CST);
        /* A write that began meanwhile makes that copy stale; the fault
         * handler clears holders after marking the page, so checking after
         * setting the bit closes the race.  Likewise a version begun
         * meanwhile that found the page changed (cl_dir_changed notes the
         * version before it clears the holders).  A page the driver logged
         * ahead as the version began (version.c) keeps its holders: their
         * copies are of the version the requests name, a peer serves only
         * requests of its own version (server.c), and the next version
         * begin clears the holders of the pages that changed. */
        if (cl_version_written_now(p) || (version && version < __atomic_load_n(&D.changed_at[p], __ATOMIC_SEQ_CST)))
            __atomic_and_fetch(&D.holders[p], ~(1ull << peer), __ATOMIC_SEQ_CST);
    }
}

/* Fill out (8 + up to CL_WIRE_MAX_HINTS bytes, wire.h) with the hints for
 * a reply to `self`'s request of `version`; returns the length, 0 for none.
 * Only for the current version: the worker uses them only while it stays in
 * the version they name, so an old-version request never leads to a peer. */
size_t cl_dir_hints(int self, uint32_t version, uint8_t *out, size_t cap) {
    if (!D.policy || !D.holders || self < 0 || self >= D.npeers || !cl_version_active() || version == 0 ||
        version != clamor_version_current() || D.hi == 0 || cap <= 8)
        return 0;
    uint64_t live = 0;
    for (int i = 0; i < D.npeers; i++)
        if (D.peer[i].endpoint[0]) live |= 1ull << i;
    live &= ~(1ull << self);
    if (!live) return 0;
    uint64_t first = D.peer[self].hint_next, n = cap - 8;
    if (n > HINT_WINDOW) n = HINT_WINDOW;
    if (first >= D.hi) first = 0;
    if (n > D.hi - first) n = D.hi - first;
    D.peer[self].hint_next = first + n;
    bool any = false;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t m = __atomic_load_n(&D.holders[first + i], __ATOMIC_RELAXED) & live;
        uint8_t k = 0;
        if (m) {
            if (m & (m - 1)) { /* several: a uniform one spreads the load */
                for (uint64_t j = rnd() % (uint64_t)__builtin_popcountll(m); j; j--) m &= m - 1;
            }
            k = (uint8_t)(__builtin_ctzll(m) + 1);
            any = true;
        }
        out[8 + i] = k;
    }
    if (!any) return 0;
    for (int b = 0; b < 8; b++) out[b] = (uint8_t)(first >> (8 * b));
    return 8 + n;
}

void cl_dir_page_written(uint64_t p) {
    uint64_t *h = __atomic_load_n(&D.holders, __ATOMIC_ACQUIRE);
    if (h) __atomic_store_n(&h[p], 0, __ATOMIC_SEQ_CST);
}

/* `peer` did not have [first, first+count): forget it as a holder. */
void cl_dir_miss(uint64_t first, uint32_t count, int peer) {
    if (peer < 0 || peer >= D.npeers || !D.holders) return;
    for (uint64_t p = first; p < first + count; p++) D.holders[p] &= ~(1ull << peer);
}

/* Page p changed before `version`: no worker holds the new version. */
void cl_dir_changed(uint64_t p, uint32_t version) {
    if (!D.holders) return;
    pthread_mutex_lock(&dir_lock);
    __atomic_store_n(&D.changed_at[p], version, __ATOMIC_SEQ_CST); /* first: see cl_dir_served */
    __atomic_store_n(&D.holders[p], 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&dir_lock);
}

void cl_dir_forget_all(void) {
    if (!D.holders) return;
    pthread_mutex_lock(&dir_lock);
    madvise(D.holders, cl_region.npages * 8, MADV_DONTNEED); /* zero pages again */
    pthread_mutex_unlock(&dir_lock);
}

/* Forget the peer whose page server is `endpoint` (it died or left). */
int clamor_replication_forget(const char *endpoint) {
    int found = 0;
    pthread_mutex_lock(&dir_lock);
    for (int i = 0; i < D.npeers; i++) {
        if (strcmp(D.peer[i].endpoint, endpoint) != 0) continue;
        D.peer[i].endpoint[0] = '\0';
        D.peer[i].idlen = 0;
        clear_bits(~(1ull << i));
        found = 1;
    }
    pthread_mutex_unlock(&dir_lock);
    return found ? 0 : ENOENT;
}

/* Forget every peer and holder (a cluster ended). */
void clamor_replication_reset(void) {
    cl_dir_forget_all();
    pthread_mutex_lock(&dir_lock);
    D.npeers = 0;
    memset(D.peer, 0, sizeof D.peer);
    pthread_mutex_unlock(&dir_lock);
}

void cl_dir_reset(void) {
    if (D.holders) {
        munmap(D.holders, cl_region.npages * 8);
        munmap(D.changed_at, cl_region.npages * 4);
    }
    int policy = D.policy;
    memset(&D, 0, sizeof D);
    D.policy = policy;
}
