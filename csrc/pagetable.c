/* pagetable.c -- a worker's page table: page states, the mapping budget,
 * install, drop, eviction and invalidation.
 *
 * One 32-bit state word per page of the region (internal.h lists the
 * states).  The pager writes a fetched page into the region's memfd
 * (region.c) and only then opens the public view with mprotect (install),
 * so no thread ever sees a half-filled page.  Dropping a page closes the
 * public view and punches the memfd hole, which gives the memory back.
 *
 * DESIGN.  Every mprotect of a page in the middle of a closed run splits a
 * mapping, and vm.max_map_count (65530 by default) is process-wide.  The
 * pager keeps an exact count of the mappings the public view is split into
 * and, before an install would exceed the budget, closes the oldest
 * isolated run (eviction): its bytes stay in the memfd, with the worker's
 * own writes to them, and its next touch opens it again without a fetch.
 * Candidates for eviction are the run starts of a ring, oldest first.
 * pt_lock serialises every change of the public view's protections: the
 * pager's installs, clamor_pages_drop() and clamor_invalidate() from the
 * task threads; the state words themselves are atomics that the fault
 * handler reads and waits on (futex.c) without the lock.
 *
 * Kept copies.  A page the driver changed is dropped from the public view
 * at the worker's next task (clamor_invalidate), but a fetching worker
 * keeps its bytes in the memfd, with the version they are
 * (cl_region.kept), instead of punching them out: its next fetch names
 * that version, and the driver may send only the words that changed (a diff,
 * wire.h; pager.c applies it).  Only pages the worker held are kept, so
 * its memory does not grow past what it held before the invalidation, and
 * at most clamor_diff_keep() bytes at once (CLAMOR_DIFF_KEEP, default 1
 * GiB; past it pages are punched as before).  A copy the worker wrote into
 * (reference counts) is kept too: the fetch checks the page it rebuilds
 * against the driver's sum and fetches it whole when they differ.
 *
 * Size: one unit.  The mapping count, the eviction ring and the page
 * states change together under pt_lock, and every part here (install,
 * drop, invalidation, kept copies, mapping the driver's pages) counts the
 * mappings it makes and evicts to stay in budget; split, each file would
 * reach into the others' state.  The page sums are pagesum.c's.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static uint32_t mappings = 1;     /* public-view mappings, under pt_lock */
static uint64_t *evict_ring;      /* run starts, oldest first */
static uint32_t evict_cap, evict_head, evict_len;
static inline uint32_t wloc_of(uint64_t i);
static _Atomic uint64_t kept_pages;

/* ---- pt_lock ------------------------------------------------------------- */

/* A futex lock (0 free, 1 held, 2 held with waiters), so that the fault
 * handler can try it: a try never waits, and no holder of the lock ever
 * touches region memory, so the handler cannot interrupt a holder that it
 * would need to finish. */
static _Atomic uint32_t pt_word;

static void pt_lock(void) {
    uint32_t c = 0;
    if (atomic_compare_exchange_strong(&pt_word, &c, 1)) return;
    if (c != 2) c = atomic_exchange(&pt_word, 2);
    while (c != 0) {
        cl_futex_wait(&pt_word, 2, -1);
        c = atomic_exchange(&pt_word, 2);
    }
}

static bool pt_trylock(void) {
    uint32_t c = 0;
    return atomic_compare_exchange_strong(&pt_word, &c, 1);
}

static void pt_unlock(void) {
    if (atomic_exchange(&pt_word, 0) == 2) cl_futex_wake(&pt_word);
}

/* ---- the table ----------------------------------------------------------- */

int cl_pt_init(void) {
    size_t tbl = (size_t)cl_region.npages * sizeof(uint32_t);
    void *pt = mmap(NULL, tbl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pt == MAP_FAILED) return cl_err(errno, "mmap of the page table: %s", strerror(errno));
    if (!evict_ring) { /* made here: the fault handler may push to it */
        evict_cap = 1u << 17;
        void *r = mmap(NULL, sizeof(uint64_t) * evict_cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r == MAP_FAILED) {
            munmap(pt, tbl);
            return cl_err(errno, "mmap of the eviction ring: %s", strerror(errno));
        }
        evict_ring = r;
    }
    void *sums = mmap(NULL, (size_t)cl_region.npages * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (sums == MAP_FAILED) {
        munmap(pt, tbl);
        return cl_err(errno, "mmap of the page sums: %s", strerror(errno));
    }
    void *kept = mmap(NULL, (size_t)cl_region.npages * sizeof(uint32_t), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (kept == MAP_FAILED) {
        munmap(pt, tbl);
        munmap(sums, (size_t)cl_region.npages * sizeof(uint64_t));
        return cl_err(errno, "mmap of the kept copies' table: %s", strerror(errno));
    }
    cl_region.kept = kept;
    atomic_store(&kept_pages, 0);
    cl_option_env(CL_OPT_DIFF_KEEP);
    cl_region.sums = sums;
    cl_region.pages = pt;
    cl_region.install_prot = PROT_READ | PROT_WRITE;
    mappings = 1;
    clamor_max_mappings(); /* now: the fault handler consults the budget (options.c) */
    evict_head = evict_len = 0;
    return 0;
}

void cl_pt_free(void) {
    munmap((void *)cl_region.pages, (size_t)cl_region.npages * sizeof(uint32_t));
    cl_region.pages = NULL;
    if (cl_region.sums) munmap((void *)cl_region.sums, (size_t)cl_region.npages * sizeof(uint64_t));
    cl_region.sums = NULL;
    if (cl_region.kept) munmap((void *)cl_region.kept, (size_t)cl_region.npages * sizeof(uint32_t));
    cl_region.kept = NULL;
    atomic_store(&kept_pages, 0);
}

/* ---- kept copies ---------------------------------------------------------- */

/* The budget, CL_OPT_DIFF_KEEP, is read when the page table is made
 * (cl_pt_init). */
bool cl_pt_diffs_on(void) {
    return cl_region.kept && cl_option_get(CL_OPT_DIFF_KEEP) && !atomic_load(&cl_region.map_on);
}

uint32_t cl_pt_kept(uint64_t i) { return cl_region.kept ? atomic_load(&cl_region.kept[i]) : 0; }
uint64_t cl_pt_kept_pages(void) { return atomic_load(&kept_pages); }

void cl_pt_unkeep(uint64_t first, uint64_t count, bool punch) {
    if (!cl_region.kept) return;
    for (uint64_t i = first; i < first + count; i++) {
        if (!atomic_exchange(&cl_region.kept[i], 0)) continue;
        atomic_fetch_sub(&kept_pages, 1);
        if (punch)
            fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(i << cl_region.page_shift),
                      (off_t)cl_region.page_size);
    }
}

/* Keep page i's bytes as version `version` rather than punch them:
 * true if kept.  pt_lock held, the page closed. */
static bool keep_copy(uint64_t i, uint32_t version) {
    if (!version || !cl_pt_diffs_on() || wloc_of(i) || !atomic_load(&cl_region.sums[i])) return false;
    uint64_t cap = cl_option_get(CL_OPT_DIFF_KEEP) >> cl_region.page_shift;
    if (atomic_load(&kept_pages) >= cap) return false;
    if (atomic_exchange(&cl_region.kept[i], version) == 0) atomic_fetch_add(&kept_pages, 1);
    CL_COUNT(pages_kept, 1);
    return true;
}

/* Punch [first, first+count) out of the memfd, but keep each page it can
 * (keep: the version its bytes are, 0: none). */
static void punch_or_keep(uint64_t first, uint64_t count, uint32_t keep) {
    uint64_t s = first, end = first + count; /* s: start of the run still to punch */
    for (uint64_t i = first; i < end; i++) {
        if (!keep_copy(i, keep)) continue;
        if (i > s)
            fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(s << cl_region.page_shift),
                      (off_t)((i - s) << cl_region.page_shift));
        s = i + 1;
    }
    if (end > s)
        fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(s << cl_region.page_shift),
                  (off_t)((end - s) << cl_region.page_shift));
}

/* A parent's thread may have held the lock at fork(). */
void cl_pt_after_fork(void) { atomic_store(&pt_word, 0); }

/* ---- mapping accounting (pager side) ------------------------------------- */

static inline bool is_open(uint64_t i) {
    return CL_PG_STATE(atomic_load_explicit(&cl_region.pages[i], memory_order_relaxed)) == CL_PG_PRESENT;
}

/* Where a page's public view comes from: the worker's own memfd at the
 * page's offset, or a location of the driver's (same host), and whether it
 * is open.  Two neighbours share a mapping when their keys join: same
 * file, same protection, consecutive offsets. */
struct key {
    uint64_t off;
    bool drv, open;
};

static inline uint32_t wloc_of(uint64_t i) {
    return cl_region.wloc ? atomic_load_explicit(&cl_region.wloc[i], memory_order_relaxed) : 0;
}

static inline struct key key_of(uint64_t i) {
    uint32_t l = wloc_of(i);
    return (struct key){l ? l - 1 : i, l != 0, is_open(i)};
}

static inline bool joins(struct key a, struct key b) {
    return a.drv == b.drv && a.open == b.open && b.off == a.off + 1;
}

/* Change in the number of mappings if [first, first+count) became one run
 * from the given file (drv), at offsets off0.., open or not.
 * mappings = 1 + the number of neighbours that do not join. */
static int delta_to(uint64_t first, uint64_t count, bool drv, uint64_t off0, bool open) {
    uint64_t end = first + count;
    int old = 0, now = 0;
    for (uint64_t j = first; j + 1 < end; j++) old += !joins(key_of(j), key_of(j + 1));
    struct key a = {off0, drv, open}, b = {off0 + count - 1, drv, open};
    if (first > 0) {
        struct key l = key_of(first - 1);
        old += !joins(l, key_of(first));
        now += !joins(l, a);
    }
    if (end < cl_region.npages) {
        struct key r = key_of(end);
        old += !joins(key_of(end - 1), r);
        now += !joins(b, r);
    }
    return now - old;
}

/* The same for the worker's own memfd, opened (open=1) or closed. */
static int map_delta(uint64_t first, uint64_t count, int open) { return delta_to(first, count, false, first, open); }

uint32_t clamor_mappings(void) { return mappings; }

static void ring_push(uint64_t idx) {
    if (!evict_ring) return;
    if (evict_len == evict_cap) { /* forget the oldest */
        evict_head = (evict_head + 1) % evict_cap;
        evict_len--;
    }
    evict_ring[(evict_head + evict_len) % evict_cap] = idx;
    evict_len++;
}

_Atomic uint64_t cl_pt_drops;

/* Close [first, first+count) and give the memory back.  pt_lock held.
 *
 * The memory is punched out before the pages read ABSENT: once one does, a
 * fault may fetch it again, and a punch after the pager's pwrite would
 * leave the new copy zero.  Until then a touch finds the page PRESENT but
 * closed and simply faults again.  cl_pt_drops is odd while a drop is
 * under way (pt_lock makes this the only writer): a page server that
 * copies a page checks it was even and unchanged around the copy. */
/* Put the worker's own memfd back under [first, first+count), closed, where
 * the driver's pages were mapped (same host).  pt_lock held. */
static int own_closed(uint64_t first, uint64_t count) {
    void *a = mmap(cl_page_addr(first), (size_t)count << cl_region.page_shift, PROT_NONE,
                   MAP_SHARED | MAP_FIXED | MAP_NORESERVE, cl_region.memfd, (off_t)(first << cl_region.page_shift));
    if (a == MAP_FAILED) return errno;
    for (uint64_t j = first; j < first + count; j++) {
        atomic_store(&cl_region.wloc[j], 0);
        atomic_store(&cl_region.sums[j], 0);   /* (its bytes here are unknown until fetched) */
    }
    return 0;
}

/* Close [first, first+count): runs of the driver's pages by putting the
 * worker's memfd back (after copying their bytes into it when `keep`, so
 * that the worker's own writes survive), the rest by mprotect. */
static int close_runs(uint64_t first, uint64_t count, bool keep) {
    uint64_t end = first + count;
    for (uint64_t i = first; i < end;) {
        uint64_t s = i;
        bool drv = wloc_of(i) != 0;
        while (i < end && (wloc_of(i) != 0) == drv) i++;
        size_t off = (size_t)s << cl_region.page_shift, len = (size_t)(i - s) << cl_region.page_shift;
        if (!drv) {
            if (mprotect(cl_page_addr(s), len, PROT_NONE) != 0) return errno;
            continue;
        }
        for (size_t done = 0; keep && done < len;) {
            ssize_t w = pwrite(cl_region.memfd, cl_page_addr(s) + done, len - done, (off_t)(off + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return w < 0 ? errno : EIO;
            done += (size_t)w;
        }
        for (uint64_t j = s; !keep && j < i;) { /* dropped: their page tables go to the park, run by run */
            uint64_t r = j++;
            while (j < i && wloc_of(j) == wloc_of(j - 1) + 1) j++;
            cl_park_put(r, j - r, wloc_of(r) - 1);
        }
        int rc = own_closed(s, i - s);
        if (rc) return rc;
    }
    return 0;
}

static int drop_locked(uint64_t first, uint64_t count, uint32_t keep) {
    size_t off = (size_t)first << cl_region.page_shift, len = (size_t)count << cl_region.page_shift;
    int d = map_delta(first, count, 0);
    atomic_fetch_add(&cl_pt_drops, 1);
    int rc = close_runs(first, count, false);
    if (rc) {
        atomic_fetch_add(&cl_pt_drops, 1);
        return cl_err(rc, "closing pages %lu+%lu: %s", (unsigned long)first, (unsigned long)count, strerror(rc));
    }
    mappings = (uint32_t)((int64_t)mappings + d);
    if (keep) punch_or_keep(first, count, keep);
    else fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    for (uint64_t i = first; i < first + count; i++) atomic_store(&cl_region.pages[i], CL_PG_ABSENT);
    atomic_fetch_add(&cl_pt_drops, 1);
    return 0;
}

/* Close [first, first+count) but keep its bytes: the pages read HELD, and
 * the next touch opens them again without a fetch.  Eviction closes rather
 * than drops because a worker writes into the pages it reads: reference
 * counts of the objects it holds.  A page fetched again would carry the
 * driver's counts, and a reference taken before would be released against
 * a count that never had it: the object would be freed here, and its
 * memory reused by this worker over bytes the driver still uses.  A page
 * mapped from the driver's memfd is copied into the worker's own first: a
 * closed mapping of its own would bound nothing.  pt_lock held. */
static int close_locked(uint64_t first, uint64_t count) {
    int d = map_delta(first, count, 0);
    int rc = close_runs(first, count, true);
    if (rc)
        return cl_err(rc, "closing pages %lu+%lu: %s", (unsigned long)first, (unsigned long)count, strerror(rc));
    mappings = (uint32_t)((int64_t)mappings + d);
    for (uint64_t i = first; i < first + count; i++) atomic_store(&cl_region.pages[i], CL_PG_HELD);
    return 0;
}

/* Close the oldest run whose closing frees mappings.  pt_lock held. */
static int evict_locked(void) {
    while (evict_len) {
        uint64_t i = evict_ring[evict_head];
        evict_head = (evict_head + 1) % evict_cap;
        evict_len--;
        if (i >= cl_region.npages || !is_open(i)) continue;
        uint64_t s = i, e = i + 1;
        while (s > 0 && i - s < 64 && is_open(s - 1)) s--;
        while (e < cl_region.npages && e - i < 64 && is_open(e)) e++;
        if ((s > 0 && is_open(s - 1)) || (e < cl_region.npages && is_open(e))) continue; /* long run */
        if (map_delta(s, e - s, 0) >= 0) continue;
        if (close_locked(s, e - s) == 0) {
            CL_COUNT(evictions, e - s);
            return 0;
        }
    }
    return cl_err(ENOMEM, "no page run can be evicted to bound the mapping count");
}

/* A fetched page that was invalidated while in flight: its bytes are stale.
 * Forget them; if a thread waits for the page, ask for it again.  pt_lock. */
static void discard_stale(uint64_t i) {
    _Atomic uint32_t *w = &cl_region.pages[i];
    cl_pt_unkeep(i, 1, false);
    fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(i << cl_region.page_shift),
              (off_t)cl_region.page_size);
    uint32_t s = atomic_load(w);
    if (s & CL_PG_WAITERS) {
        atomic_store(w, CL_PG_WANTED | CL_PG_WAITERS);
        if (cl_prefetch_enqueue(i) != 0) { /* no pager: the waiter must not hang */
            atomic_store(w, CL_PG_MKERR(ENOTCONN));
            cl_futex_wake(w);
        }
    } else {
        atomic_store(w, CL_PG_ABSENT);
    }
}

static int install_run(uint64_t first, uint64_t count);

/* Open the public view of [first, first+count) (data already in the fill
 * view) and wake the waiters. */
int cl_pt_install(uint64_t first, uint64_t count) {
    int rc = 0;
    pt_lock();
    /* install the runs of pages not invalidated meanwhile */
    uint64_t i = first, end = first + count;
    while (i < end) {
        if (atomic_load(&cl_region.pages[i]) & CL_PG_STALE) {
            discard_stale(i++);
            continue;
        }
        uint64_t s = i;
        while (i < end && !(atomic_load(&cl_region.pages[i]) & CL_PG_STALE)) i++;
        int r = install_run(s, i - s);
        if (r && !rc) rc = r;
    }
    pt_unlock();
    return rc;
}

/* pt_lock held */
static int install_run(uint64_t first, uint64_t count) {
    size_t off = (size_t)first << cl_region.page_shift, len = (size_t)count << cl_region.page_shift;
    int rc = 0;
    int d = map_delta(first, count, 1);
    uint32_t budget = clamor_max_mappings();
    while (d > 0 && mappings + (uint32_t)d > budget) {
        if (evict_locked() != 0) break; /* try anyway: the budget is ours, not the kernel's */
        d = map_delta(first, count, 1);
    }
    for (int tries = 0;; tries++) {
        if (mprotect((void *)(cl_region.base + off), len, cl_region.install_prot) == 0) break;
        rc = errno;
        if (rc != ENOMEM || tries > 64 || evict_locked() != 0) {
            rc = cl_err(rc, "mprotect of pages %lu+%lu: %s (vm.max_map_count reached?)", (unsigned long)first,
                        (unsigned long)count, strerror(rc));
            goto out;
        }
        d = map_delta(first, count, 1);
        rc = 0;
    }
    mappings = (uint32_t)((int64_t)mappings + d);
    if (d > 0) ring_push(first);
out:
    for (uint64_t i = first; i < first + count; i++) {
        uint32_t old = atomic_exchange(&cl_region.pages[i], rc ? CL_PG_MKERR(rc) : CL_PG_PRESENT);
        if (old & CL_PG_WAITERS) cl_futex_wake(&cl_region.pages[i]);
    }
    return rc;
}

int cl_pt_drop(uint64_t first, uint64_t count) {
    int rc = 0;
    pt_lock();
    /* Drop maximal runs of present pages; pages in flight stay as they are. */
    uint64_t i = first, end = first + count;
    while (i < end && rc == 0) {
        while (i < end && !is_open(i)) {
            uint32_t exp = CL_PG_HELD;
            if (atomic_compare_exchange_strong(&cl_region.pages[i], &exp, CL_PG_ABSENT)) {
                fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)(i << cl_region.page_shift), (off_t)cl_region.page_size);
            } else if (CL_PG_STATE(exp) == CL_PG_ABSENT) {
                cl_pt_unkeep(i, 1, true); /* a kept copy goes too */
            }
            i++;
        }
        uint64_t s = i;
        while (i < end && is_open(i)) i++;
        if (i > s) {
            rc = drop_locked(s, i - s, 0);
            if (!rc) CL_COUNT(pages_dropped, i - s);
            /* A partial drop splits a run, and the part that lost the page
             * its ring entry named could never be evicted again: name both
             * remains, so the mapping budget stays enforceable. */
            if (!rc && s > 0 && is_open(s - 1)) ring_push(s - 1);
            if (!rc && i < cl_region.npages && is_open(i)) ring_push(i);
        }
    }
    pt_unlock();
    return rc;
}

int clamor_pages_drop(uint64_t first, uint64_t count) {
    if (cl_region.role != CLAMOR_ROLE_WORKER) return cl_err(EPERM, "only a worker drops pages");
    if (first > cl_region.npages || count > cl_region.npages - first)
        return cl_err(EINVAL, "pages %lu+%lu are outside the region (%lu pages)", (unsigned long)first,
                      (unsigned long)count, (unsigned long)cl_region.npages);
    return cl_pt_drop(first, count);
}

/* Invalidate page i, not open: a copy held closed goes (punched, or kept
 * as the base of a diff), a fetch in flight is marked stale (its reply is
 * not installed), an error is cleared (a later touch may succeed: the page
 * changed).  A touch or the pager may move the page between those states
 * meanwhile (they do not take pt_lock): each change is looked at again.
 * pt_lock held. */
static void invalidate_closed(uint64_t i, uint32_t keep) {
    _Atomic uint32_t *w = &cl_region.pages[i];
    uint32_t s = atomic_load(w);
    for (;;) {
        switch (CL_PG_STATE(s)) {
        case CL_PG_HELD: {
            /* Claim it as if a fetch were under way, punch, then let it go:
             * a fault meanwhile waits, and gets a fetch of its own. */
            if (!atomic_compare_exchange_strong(w, &s, CL_PG_WANTED)) continue;
            atomic_fetch_add(&cl_pt_drops, 1);
            if (!keep_copy(i, keep))
                fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)(i << cl_region.page_shift), (off_t)cl_region.page_size);
            uint32_t exp = CL_PG_WANTED;
            if (!atomic_compare_exchange_strong(w, &exp, CL_PG_ABSENT)) { /* a waiter came */
                atomic_store(w, CL_PG_WANTED | CL_PG_WAITERS);
                if (cl_prefetch_enqueue(i) != 0) {
                    atomic_store(w, CL_PG_MKERR(ENOTCONN));
                    cl_futex_wake(w);
                }
            }
            atomic_fetch_add(&cl_pt_drops, 1);
            CL_COUNT(pages_invalidated, 1);
            return;
        }
        case CL_PG_WANTED:
            if (s & CL_PG_STALE) return;
            if (!atomic_compare_exchange_weak(w, &s, s | CL_PG_STALE)) continue; /* (the pager may have held it again) */
            CL_COUNT(pages_invalidated, 1);
            return;
        case CL_PG_ERROR:
            if (!atomic_compare_exchange_weak(w, &s, CL_PG_ABSENT)) continue;
            return;
        default: /* absent: nothing to drop; open: the caller's */
            return;
        }
    }
}

/* Drop open page i, which may split its run in two: one mapping more.
 * Within the mapping budget, evict as an install would; if nothing can be
 * evicted, drop i's whole open run instead (its other pages are fetched
 * again if touched).  What is left of a split run joins the eviction ring.
 * pt_lock held. */
static int drop_open_page(uint64_t i, uint32_t keep) {
    uint64_t s = i, e = i + 1;
    uint32_t budget = clamor_max_mappings();
    int d = map_delta(i, 1, 0);
    while (d > 0 && mappings + (uint32_t)d > budget && evict_locked() == 0) {
        if (!is_open(i)) { /* the eviction closed i's run, bytes kept: i goes all the same */
            invalidate_closed(i, keep);
            return 0;
        }
        d = map_delta(i, 1, 0);
    }
    if (d > 0 && mappings + (uint32_t)d > budget) {
        while (s > 0 && is_open(s - 1)) s--;
        while (e < cl_region.npages && is_open(e)) e++;
    }
    int rc = drop_locked(s, e - s, keep);
    if (rc == 0 && e - s == 1) {
        if (i > 0 && is_open(i - 1)) ring_push(i - 1);
        if (i + 1 < cl_region.npages && is_open(i + 1)) ring_push(i + 1);
    }
    return rc;
}

/* Drop open pages [s, s+n) of a list of changed pages: in one call where
 * the mapping budget allows, else page by page.  pt_lock held. */
static int drop_open_run(uint64_t s, uint64_t n, uint32_t keep) {
    int d = map_delta(s, n, 0);
    if (n == 1 || (d > 0 && mappings + (uint32_t)d > clamor_max_mappings())) {
        int rc = 0;
        for (uint64_t i = s; i < s + n; i++) {
            /* (an eviction for an earlier page may have closed this one) */
            int r = 0;
            if (is_open(i)) r = drop_open_page(i, keep);
            else invalidate_closed(i, keep);
            if (r && !rc) rc = r;
        }
        return rc;
    }
    int rc = drop_locked(s, n, keep);
    if (!rc && s > 0 && is_open(s - 1)) ring_push(s - 1);
    if (!rc && s + n < cl_region.npages && is_open(s + n)) ring_push(s + n);
    return rc;
}

static int check_pages(const uint64_t *pages, uint64_t n) {
    if (cl_region.role != CLAMOR_ROLE_WORKER) return cl_err(EPERM, "only a worker invalidates pages");
    for (uint64_t k = 0; k < n; k++)
        if ((pages[k] & ~CLAMOR_INVAL_MOVED) >= cl_region.npages)
            return cl_err(EINVAL, "page %lu is outside the region (%lu pages)",
                          (unsigned long)(pages[k] & ~CLAMOR_INVAL_MOVED), (unsigned long)cl_region.npages);
    return 0;
}

/* Drop the listed pages; copies kept for diffs are of version `keep`.
 * pt_lock held. */
static int invalidate_locked(const uint64_t *pages, uint64_t n, uint32_t keep) {
    int rc = 0;
    for (uint64_t k = 0; k < n; k++) { /* an error on one page must not keep the others */
        uint64_t i = pages[k] & ~CLAMOR_INVAL_MOVED;
        uint32_t s = atomic_load(&cl_region.pages[i]);
        if ((pages[k] & CLAMOR_INVAL_MOVED) && !wloc_of(i) &&
            (CL_PG_STATE(s) == CL_PG_PRESENT || CL_PG_STATE(s) == CL_PG_HELD))
            continue; /* (moved, unchanged, and the copy here is this worker's own: kept) */
        switch (CL_PG_STATE(s)) {
        case CL_PG_PRESENT: { /* with the open pages listed after it, one run */
            uint64_t m = 1;
            while (k + m < n && (pages[k + m] & ~CLAMOR_INVAL_MOVED) == i + m &&
                   CL_PG_STATE(atomic_load(&cl_region.pages[i + m])) == CL_PG_PRESENT &&
                   !((pages[k + m] & CLAMOR_INVAL_MOVED) && !wloc_of(i + m)))
                m++;
            int r = drop_open_run(i, m, keep);
            if (r && !rc) rc = r;
            CL_COUNT(pages_invalidated, m);
            k += m - 1;
            break;
        }
        default:
            invalidate_closed(i, keep);
            break;
        }
    }
    return rc;
}

int clamor_invalidate(const uint64_t *pages, uint64_t n) {
    int rc = check_pages(pages, n);
    if (rc) return rc;
    pt_lock();
    rc = invalidate_locked(pages, n, atomic_load(&cl_worker_version));
    pt_unlock();
    return rc;
}

/* The version first, then the drops, under pt_lock.  A mapping is made
 * under pt_lock, so none comes between.  A fetch claims its page (a state
 * word) before it reads the version it names: claimed before a drop, the
 * page is in flight there and its reply is discarded; claimed after, its
 * request names the new version.  Dropping first and setting the version
 * after left a window in which the pager, still reading ahead for the
 * last task, mapped or fetched a page just dropped as the version left
 * had it, and the next task read those bytes: a silent wrong result. */
int clamor_change_version(uint32_t version, const uint64_t *pages, uint64_t n) {
    int rc = check_pages(pages, n);
    if (rc) return rc;
    pt_lock();
    uint32_t keep = atomic_load(&cl_worker_version); /* (what the copies held are) */
    clamor_set_version(version);
    rc = invalidate_locked(pages, n, keep);
    pt_unlock();
    return rc;
}

/* ---- mapping the driver's pages (same host) ---------------------------------- */

/* Pages mapped at one fault, at most: an aligned window, so that a scan
 * takes one fault per window rather than per page.  Mapping costs no copy
 * and no memory; the kernel fills the page-table entries on first touch. */
#define MAP_WINDOW_BYTES ((size_t)4 << 20)

/* Page j can be mapped for a task of `version`: the driver allocated it, a
 * worker that relocates does not need its relocations, and its current
 * location, or the one before it, holds what that version reads (the
 * driver moved the page in this version: it logs the pages it rewrites at
 * every version as the version begins).  *id gets the location.  The
 * driver stores the previous entry before the current one, so an entry
 * read after the current one is that one's predecessor or newer: a newer
 * one's version is above `version`, and the page is not mappable. */
static bool mappable(uint64_t j, uint32_t version, bool reloc, uint32_t *id) {
    uint8_t f = atomic_load_explicit(&cl_region.locflags[j], memory_order_relaxed);
    if (!(f & CL_LOC_USED) || (reloc && (f & CL_LOC_RELOC))) return false;
    uint64_t e = atomic_load_explicit(&cl_region.loctab[j], memory_order_acquire);
    if (cl_loc_since(e) > version) {
        uint64_t before = atomic_load_explicit(&cl_region.locprev[j], memory_order_acquire);
        if (cl_loc_since(before) > version || cl_loc_since(before) >= cl_loc_since(e)) return false;
        e = before;
    }
    *id = cl_loc_id(j, e);
    return *id < cl_region.nlocs;
}

/* Claimed page j goes back: absent, or to the pager if a thread waits. */
static void give_back(uint64_t j) {
    _Atomic uint32_t *w = &cl_region.pages[j];
    uint32_t exp = CL_PG_WANTED;
    if (atomic_compare_exchange_strong(w, &exp, CL_PG_ABSENT)) return;
    if (cl_prefetch_enqueue(j) != 0) {
        atomic_store(w, CL_PG_MKERR(ENOTCONN));
        cl_futex_wake(w);
    }
}

static int map_locked(uint64_t idx, bool claimed, bool from_handler) {
    uint32_t s = atomic_load(&cl_region.pages[idx]);
    if (CL_PG_STATE(s) != (claimed ? CL_PG_WANTED : CL_PG_ABSENT)) return 0; /* no longer the caller's */
    /* Outside a task (version 0) the worker reads "now", which no kept
     * version promises to stay: those few touches are fetched. */
    uint32_t version = atomic_load(&cl_worker_version), id;
    bool reloc = cl_option_get(CL_OPT_RELOC);
    if (version == 0 || !mappable(idx, version, reloc, &id)) return EAGAIN;
    uint64_t win = MAP_WINDOW_BYTES >> cl_region.page_shift;
    if (!win) win = 1;
    uint64_t lo = idx & ~(win - 1), hi = lo + win > cl_region.npages ? cl_region.npages : lo + win;
    uint64_t a = idx, b = idx + 1;
    uint32_t id2;
    while (a > lo && CL_PG_STATE(atomic_load(&cl_region.pages[a - 1])) == CL_PG_ABSENT &&
           mappable(a - 1, version, reloc, &id2) && (uint64_t)id2 + (idx - a + 1) == id)
        a--;
    while (b < hi && CL_PG_STATE(atomic_load(&cl_region.pages[b])) == CL_PG_ABSENT &&
           mappable(b, version, reloc, &id2) && id2 == (uint64_t)id + (b - idx))
        b++;
    uint32_t budget = clamor_max_mappings();
    int d = delta_to(a, b - a, true, id - (idx - a), true);
    if (d > 0 && mappings + (uint32_t)d + 2 > budget) { /* +2: a neighbour claimed meanwhile */
        if (from_handler) return EAGAIN;
        a = idx;
        b = idx + 1;
        while ((d = delta_to(idx, 1, true, id, true)) > 0 && mappings + (uint32_t)d + 2 > budget &&
               evict_locked() == 0) {}
    }
    /* Claim the pages; a fault elsewhere may take a neighbour first. */
    if (!claimed) {
        uint32_t exp = CL_PG_ABSENT;
        if (!atomic_compare_exchange_strong(&cl_region.pages[idx], &exp, CL_PG_WANTED)) return 0;
    }
    for (uint64_t j = idx; j-- > a;) {
        uint32_t exp = CL_PG_ABSENT;
        if (!atomic_compare_exchange_strong(&cl_region.pages[j], &exp, CL_PG_WANTED)) {
            a = j + 1;
            break;
        }
    }
    for (uint64_t j = idx + 1; j < b; j++) {
        uint32_t exp = CL_PG_ABSENT;
        if (!atomic_compare_exchange_strong(&cl_region.pages[j], &exp, CL_PG_WANTED)) {
            b = j;
            break;
        }
    }
    uint32_t id0 = (uint32_t)(id - (idx - a));
    d = delta_to(a, b - a, true, id0, true);
    int e = cl_park_map(a, b - a, id0, cl_region.install_prot);
    if (e) {
        /* the range may have lost its mapping: put the worker's own back */
        mmap(cl_page_addr(a), (size_t)(b - a) << cl_region.page_shift, PROT_NONE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE,
             cl_region.memfd, (off_t)(a << cl_region.page_shift));
        for (uint64_t j = a; j < b; j++)
            if (j != idx || !claimed) give_back(j);
        (void)e; /* fetched instead */
        return EAGAIN;
    }
    for (uint64_t j = a; j < b; j++) atomic_store(&cl_region.wloc[j], (uint32_t)(id0 + (j - a) + 1));
    mappings = (uint32_t)((int64_t)mappings + d);
    if (d > 0) ring_push(a);
    for (uint64_t j = a; j < b; j++) {
        uint32_t old = atomic_exchange(&cl_region.pages[j], CL_PG_PRESENT);
        if (old & CL_PG_WAITERS) cl_futex_wake(&cl_region.pages[j]);
    }
    CL_COUNT(pages_mapped, b - a);
    return 0;
}

int cl_map_run(uint64_t idx, bool claimed, bool from_handler) {
    if (!atomic_load_explicit(&cl_region.map_on, memory_order_acquire) || idx >= cl_region.npages) return EAGAIN;
    if (from_handler) {
        if (!pt_trylock()) return EBUSY;
    } else {
        pt_lock();
    }
    int rc = map_locked(idx, claimed, from_handler);
    pt_unlock();
    return rc;
}

uint64_t cl_map_window(void) {
    uint64_t w = MAP_WINDOW_BYTES >> cl_region.page_shift;
    return w ? w : 1;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* A fresh mapping of the driver's memfd has no page-table entries: the
 * first read of each 4 KiB takes a minor fault (64 KiB at a time with the
 * kernel's fault-around), and filling them costs more than the scan reads
 * on this machine kind.  The pager fills them ahead of a scan, on another
 * CPU, outside the lock (a page dropped meanwhile only makes the madvise
 * fail). */
void cl_map_populate(uint64_t first, uint64_t count) {
    uint64_t win = cl_map_window();
    for (uint64_t k = 0; k < count; k++) {
        uint64_t lo = first + k * win, hi = lo + win;
        if (lo >= cl_region.npages) return;
        if (hi > cl_region.npages) hi = cl_region.npages;
        for (uint64_t i = lo; i < hi; i++) {
            uint32_t s = CL_PG_STATE(atomic_load(&cl_region.pages[i]));
            if (s == CL_PG_ABSENT && cl_map_run(i, false, false) != 0) return; /* not mappable: the stream ends */
        }
        for (uint64_t i = lo; i < hi;) { /* runs mapped from the driver, their tables not kept */
            while (i < hi && (!wloc_of(i) || cl_park_kept(i))) i++;
            uint64_t s = i;
            while (i < hi && wloc_of(i) && !cl_park_kept(i)) i++;
            if (i > s) madvise(cl_page_addr(s), (size_t)(i - s) << cl_region.page_shift, MADV_POPULATE_READ);
        }
    }
}
