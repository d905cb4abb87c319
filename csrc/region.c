/* region.c -- the fixed-address global region and its page table.
 *
 * DESIGN.  The region is a memfd mapped MAP_SHARED at a fixed address with
 * MAP_FIXED_NOREPLACE, so a taken range is an error rather than a silent
 * overwrite and ASLR stays on.  The driver maps it read-write and owns the
 * authoritative bytes.  A worker maps its own memfd twice: the public view at
 * the common base starts PROT_NONE, and a second "fill" view elsewhere is
 * always read-write.  The pager copies a page into the fill view and only
 * then opens the public view (mprotect), so no thread ever sees a half-filled
 * page.  Dropping a page closes the public view and punches the memfd hole,
 * which gives the memory back.
 *
 * Every mprotect of a page in the middle of a closed run splits a mapping,
 * and vm.max_map_count (65530 by default) is process-wide.  The pager keeps
 * an exact count of the mappings the public view is split into and, before
 * an install would exceed the budget, closes the oldest isolated run
 * (eviction): its bytes stay in the memfd, with the worker's own writes to
 * them, and its next touch opens it again without a fetch.
 *
 * A child forked from a process with a region (a local worker) replaces the
 * public view with a fresh private memfd, every page absent, from a
 * pthread_atfork() child handler: it must never read later driver writes
 * through memory shared with the driver.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

struct cl_region cl_region = {.memfd = -1};

static pthread_mutex_t pt_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t mappings = 1;     /* public-view mappings, under pt_lock */
static uint32_t max_mappings_set; /* 0: default */
static uint64_t *evict_ring;      /* run starts, oldest first */
static uint32_t evict_cap, evict_head, evict_len;
static bool atfork_registered;

/* ---- futex --------------------------------------------------------------- */

int cl_futex_wait(_Atomic uint32_t *w, uint32_t val, int timeout_ms) {
    struct timespec ts, *tp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tp = &ts;
    }
    long r = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, tp, NULL, 0);
    return r == 0 ? 0 : errno;
}

void cl_futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* ---- geometry ------------------------------------------------------------ */

/* "64G", "0x200000000000", "65536", "64K" -> bytes; 0 on a parse error. */
static uint64_t parse_size(const char *s) {
    if (!s || !*s) return 0;
    while (*s == ' ') s++;
    if (*s == '-' || *s == '+') return 0; /* strtoull would wrap a minus */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s) return 0;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end) return 0;
    if (shift && v > (UINT64_MAX >> shift)) return 0;
    return (uint64_t)v << shift;
}

static int env_or(const char *name, uint64_t dflt, uint64_t *out) {
    const char *s = getenv(name);
    if (!s || !*s) {
        *out = dflt;
        return 0;
    }
    *out = parse_size(s);
    if (*out == 0) return cl_err(EINVAL, "%s=%s is not a size or address", name, s);
    return 0;
}

static int geometry(uintptr_t *base, size_t *size, size_t *psize) {
    int rc;
    uint64_t v;
    if (*base == 0) {
        if ((rc = env_or("CLAMOR_BASE", CLAMOR_DEFAULT_BASE, &v))) return rc;
        *base = (uintptr_t)v;
    }
    if (*size == 0) {
        if ((rc = env_or("CLAMOR_REGION_SIZE", CLAMOR_DEFAULT_SIZE, &v))) return rc;
        *size = (size_t)v;
    }
    if (*psize == 0) {
        if ((rc = env_or("CLAMOR_PAGE_SIZE", CLAMOR_DEFAULT_PAGE_SIZE, &v))) return rc;
        *psize = (size_t)v;
    }
    size_t p = *psize;
    if (p < CLAMOR_MIN_PAGE_SIZE || p > CLAMOR_MAX_PAGE_SIZE || (p & (p - 1)))
        return cl_err(EINVAL, "page size %zu is not a power of two from 4 KiB to 4 MiB", p);
    if (*base % p || *size % p || *size == 0)
        return cl_err(EINVAL, "region base 0x%lx and size %zu must be non-zero multiples of the page size %zu",
                      (unsigned long)*base, *size, p);
    if (*base + *size < *base || *base + *size > ((uintptr_t)1 << 47))
        return cl_err(EINVAL, "region 0x%lx + %zu does not fit in the user address space",
                      (unsigned long)*base, *size);
    return 0;
}

static int map_fixed(uintptr_t base, size_t size, int prot, int fd) {
    void *p = mmap((void *)base, size, prot, MAP_SHARED | MAP_FIXED_NOREPLACE | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        if (e == EEXIST)
            return cl_err(EEXIST, "region address range 0x%lx-0x%lx is already mapped in this process; "
                          "choose another base with CLAMOR_BASE=0x... or the base= argument",
                          (unsigned long)base, (unsigned long)(base + size));
        return cl_err(e, "mmap of the region at 0x%lx (%zu bytes): %s", (unsigned long)base, size, strerror(e));
    }
    if ((uintptr_t)p != base) { /* a kernel before 4.17 treats the flag as a hint */
        munmap(p, size);
        return cl_err(EEXIST, "region address 0x%lx is not available (kernel offered %p); "
                      "choose another base with CLAMOR_BASE", (unsigned long)base, p);
    }
    return 0;
}

static int new_memfd(size_t size, int *fd_out) {
    int fd = (int)syscall(SYS_memfd_create, "clamor-region", MFD_CLOEXEC);
    if (fd < 0) return cl_err(errno, "memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return cl_err(e, "ftruncate of the region memfd to %zu bytes: %s", size, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

/* A forked worker may touch the region before any of its own code runs:
 * the interpreter's after-fork work reuses objects from CPython's free lists
 * and reads dicts and caches that grew inside a heap() block.  Every page is
 * absent now, so the pager and this worker's page server start here, before
 * fork() returns to the child, and such a touch is fetched like any other
 * instead of dying for want of a pager.  (glibc has unlocked malloc by the
 * time child handlers run; the threads are this process's first.)  A
 * failure leaves them stopped; clamor/region.py tries again. */
static void atfork_child(void) {
    cl_heap_reset_after_fork(); /* first: allocations below must not go to the region */
    if (cl_region.role == CLAMOR_ROLE_NONE || clamor_region_reset_after_fork() != 0) return;
    const char *parent = clamor_fork_parent_endpoint();
    if (!parent[0]) { /* no page server to fetch from: a touch ends with a clear message, not a bare SIGSEGV */
        clamor_fault_install();
        return;
    }
    char bound[256];
    clamor_server_start("tcp://127.0.0.1:*", bound, sizeof bound); /* first: the pager names it to the driver */
    clamor_pager_start(parent);
}

/* Worker-only parts: fill view and page table. */
static int map_worker_side(int fd) {
    size_t tbl = (size_t)cl_region.npages * sizeof(uint32_t);
    void *fill = mmap(NULL, cl_region.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (fill == MAP_FAILED) return cl_err(errno, "mmap of the fill view: %s", strerror(errno));
    void *pt = mmap(NULL, tbl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pt == MAP_FAILED) {
        int e = errno;
        munmap(fill, cl_region.size);
        return cl_err(e, "mmap of the page table: %s", strerror(e));
    }
    cl_region.fill = fill;
    cl_region.pages = pt;
    cl_region.install_prot = PROT_READ | PROT_WRITE;
    mappings = 1;
    evict_head = evict_len = 0;
    return 0;
}

static int region_map(uintptr_t base, size_t size, size_t psize, int role) {
    int rc, fd = -1;
    if (cl_region.role != CLAMOR_ROLE_NONE)
        return cl_err(EBUSY, "this process already has a region at 0x%lx", (unsigned long)cl_region.base);
    if ((rc = geometry(&base, &size, &psize))) return rc;
    if ((rc = new_memfd(size, &fd))) return rc;
    if ((rc = map_fixed(base, size, role == CLAMOR_ROLE_DRIVER ? PROT_READ | PROT_WRITE : PROT_NONE, fd)))
        goto err;
    cl_region.base = base;
    cl_region.size = size;
    cl_region.page_size = psize;
    cl_region.page_shift = (unsigned)__builtin_ctzll(psize);
    cl_region.npages = size >> cl_region.page_shift;
    cl_region.memfd = fd;
    if (role == CLAMOR_ROLE_WORKER && (rc = map_worker_side(fd))) {
        munmap((void *)base, size);
        goto err;
    }
    if (!atfork_registered) {
        pthread_atfork(NULL, NULL, atfork_child);
        atfork_registered = true;
    }
    atomic_thread_fence(memory_order_seq_cst);
    cl_region.role = role;
    return 0;
err:
    close(fd);
    memset(&cl_region, 0, sizeof cl_region);
    cl_region.memfd = -1;
    return rc;
}

int clamor_region_init(uintptr_t base, size_t size, size_t page_size) {
    return region_map(base, size, page_size, CLAMOR_ROLE_DRIVER);
}

int clamor_region_attach(uintptr_t base, size_t size, size_t page_size) {
    return region_map(base, size, page_size, CLAMOR_ROLE_WORKER);
}

int clamor_region_close(void) {
    if (cl_region.role == CLAMOR_ROLE_NONE) return 0;
    int inside = clamor_heap_threads();
    if (inside) /* their next allocation would land in unmapped memory */
        return cl_err(EBUSY, "%d thread(s) are inside clamor.heap(); leave the block(s) first", inside);
    clamor_pager_stop();
    clamor_server_stop();
    int role = cl_region.role;
    cl_region.role = CLAMOR_ROLE_NONE;
    atomic_thread_fence(memory_order_seq_cst);
    munmap((void *)cl_region.base, cl_region.size);
    if (role == CLAMOR_ROLE_WORKER) {
        munmap(cl_region.fill, cl_region.size);
        munmap((void *)cl_region.pages, (size_t)cl_region.npages * sizeof(uint32_t));
    }
    close(cl_region.memfd);
    cl_alloc_reset();
    cl_version_reset();
    cl_dir_reset();
    memset(&cl_region, 0, sizeof cl_region);
    cl_region.memfd = -1;
    return 0;
}

uintptr_t clamor_region_base(void) { return cl_region.role ? cl_region.base : 0; }
size_t clamor_region_size(void) { return cl_region.role ? cl_region.size : 0; }
size_t clamor_page_size(void) { return cl_region.role ? cl_region.page_size : 0; }
int clamor_region_role(void) { return cl_region.role; }

/* ---- fork ---------------------------------------------------------------- */

static char fork_parent_ep[256];

const char *clamor_fork_parent_endpoint(void) { return fork_parent_ep; }

int clamor_region_reset_after_fork(void) {
    if (cl_region.role == CLAMOR_ROLE_NONE) return cl_err(ENXIO, "no region to reset");
    /* The parent's threads are gone; forget them without touching their
     * (now orphaned) libzmq state. */
    snprintf(fork_parent_ep, sizeof fork_parent_ep, "%s", clamor_server_endpoint());
    clamor_stats_reset(); /* the counters describe this process only */
    cl_pager_stop_after_fork();
    cl_server_stop_after_fork();
    pthread_mutex_init(&pt_lock, NULL);
    int oldfd = cl_region.memfd, fd, rc;
    int was_worker = cl_region.role == CLAMOR_ROLE_WORKER;
    if ((rc = new_memfd(cl_region.size, &fd))) return rc;
    /* MAP_FIXED replaces the shared view in one step: no window in which the
     * range is unmapped and could be taken by another mmap. */
    void *p = mmap((void *)cl_region.base, cl_region.size, PROT_NONE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        rc = errno;
        close(fd);
        return cl_err(rc, "remapping the region after fork: %s", strerror(rc));
    }
    if (was_worker) {
        munmap(cl_region.fill, cl_region.size);
        munmap((void *)cl_region.pages, (size_t)cl_region.npages * sizeof(uint32_t));
    }
    close(oldfd);
    cl_region.memfd = fd;
    cl_region.role = CLAMOR_ROLE_WORKER;
    return map_worker_side(fd);
}

/* ---- mapping accounting (pager side) ------------------------------------- */

static inline bool is_open(uint64_t i) {
    return CL_PG_STATE(atomic_load_explicit(&cl_region.pages[i], memory_order_relaxed)) == CL_PG_PRESENT;
}

int cl_region_map_delta(uint64_t first, uint64_t count, int open) {
    /* mappings = 1 + number of boundaries where openness changes.  Only the
     * two outer boundaries of the run can change. */
    int d = 0;
    uint64_t end = first + count;
    if (first > 0) {
        bool left = is_open(first - 1);
        d += (left != (bool)open) - (left != !open);
    }
    if (end < cl_region.npages) {
        bool right = is_open(end);
        d += (right != (bool)open) - (right != !open);
    }
    return d;
}

uint32_t cl_region_mapping_budget(void) {
    if (max_mappings_set) return max_mappings_set;
    static uint32_t dflt;
    if (!dflt) {
        long sys = 65530;
        FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
        if (f) {
            if (fscanf(f, "%ld", &sys) != 1) sys = 65530;
            fclose(f);
        }
        /* Leave half for the interpreter, libraries, thread stacks and the
         * rest of the process. */
        dflt = (uint32_t)(sys / 2 > 1024 ? sys / 2 : 512);
    }
    return dflt;
}

void clamor_set_max_mappings(uint32_t n) { max_mappings_set = n; }
uint32_t clamor_max_mappings(void) { return cl_region_mapping_budget(); }
uint32_t cl_region_mappings(void) { return mappings; }
uint32_t clamor_mappings(void) { return mappings; }

static void ring_push(uint64_t idx) {
    if (!evict_ring) {
        evict_cap = 1u << 17;
        evict_ring = malloc(sizeof(uint64_t) * evict_cap);
        if (!evict_ring) return;
    }
    if (evict_len == evict_cap) { /* forget the oldest */
        evict_head = (evict_head + 1) % evict_cap;
        evict_len--;
    }
    evict_ring[(evict_head + evict_len) % evict_cap] = idx;
    evict_len++;
}

_Atomic uint64_t cl_region_drops;

/* Close [first, first+count) and give the memory back.  pt_lock held.
 *
 * The memory is punched out before the pages read ABSENT: once one does, a
 * fault may fetch it again, and a punch after the pager's pwrite would
 * leave the new copy zero.  Until then a touch finds the page PRESENT but
 * closed and simply faults again.  cl_region_drops is odd while a drop is
 * under way (pt_lock makes this the only writer): a page server that
 * copies a page checks it was even and unchanged around the copy. */
static int drop_locked(uint64_t first, uint64_t count) {
    size_t off = (size_t)first << cl_region.page_shift, len = (size_t)count << cl_region.page_shift;
    int d = cl_region_map_delta(first, count, 0);
    atomic_fetch_add(&cl_region_drops, 1);
    if (mprotect((void *)(cl_region.base + off), len, PROT_NONE) != 0) {
        atomic_fetch_add(&cl_region_drops, 1);
        return cl_err(errno, "mprotect(PROT_NONE) of pages %lu+%lu: %s", (unsigned long)first,
                      (unsigned long)count, strerror(errno));
    }
    mappings = (uint32_t)((int64_t)mappings + d);
    fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    for (uint64_t i = first; i < first + count; i++) atomic_store(&cl_region.pages[i], CL_PG_ABSENT);
    atomic_fetch_add(&cl_region_drops, 1);
    return 0;
}

/* Close [first, first+count) but keep its bytes: the pages read HELD, and
 * the next touch opens them again without a fetch.  Eviction closes rather
 * than drops because a worker writes into the pages it reads: reference
 * counts of the objects it holds.  A page fetched again would carry the
 * driver's counts, and a reference taken before would be released against
 * a count that never had it: the object would be freed here, and its
 * memory reused by this worker over bytes the driver still uses.  pt_lock
 * held. */
static int close_locked(uint64_t first, uint64_t count) {
    size_t off = (size_t)first << cl_region.page_shift, len = (size_t)count << cl_region.page_shift;
    int d = cl_region_map_delta(first, count, 0);
    if (mprotect((void *)(cl_region.base + off), len, PROT_NONE) != 0)
        return cl_err(errno, "mprotect(PROT_NONE) of pages %lu+%lu: %s", (unsigned long)first,
                      (unsigned long)count, strerror(errno));
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
        if (cl_region_map_delta(s, e - s, 0) >= 0) continue;
        if (close_locked(s, e - s) == 0) {
            CL_COUNT(evictions, e - s);
            return 0;
        }
    }
    return cl_err(ENOMEM, "no page run can be evicted to bound the mapping count");
}

int cl_region_evict_one(void) {
    pthread_mutex_lock(&pt_lock);
    int rc = evict_locked();
    pthread_mutex_unlock(&pt_lock);
    return rc;
}

/* Open the public view of [first, first+count) (data already in the fill
 * view) and wake the waiters. */
/* A fetched page that was invalidated while in flight: its bytes are stale.
 * Forget them; if a thread waits for the page, ask for it again.  pt_lock. */
static void discard_stale(uint64_t i) {
    _Atomic uint32_t *w = &cl_region.pages[i];
    fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(i << cl_region.page_shift),
              (off_t)cl_region.page_size);
    uint32_t s = atomic_load(w);
    if (s & CL_PG_WAITERS) {
        atomic_store(w, CL_PG_WANTED | CL_PG_WAITERS);
        if (cl_pager_enqueue(i) != 0) { /* no pager: the waiter must not hang */
            atomic_store(w, CL_PG_MKERR(ENOTCONN));
            cl_futex_wake(w);
        }
    } else {
        atomic_store(w, CL_PG_ABSENT);
    }
}

static int install_run(uint64_t first, uint64_t count);

int cl_region_install(uint64_t first, uint64_t count) {
    int rc = 0;
    pthread_mutex_lock(&pt_lock);
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
    pthread_mutex_unlock(&pt_lock);
    return rc;
}

/* pt_lock held */
static int install_run(uint64_t first, uint64_t count) {
    size_t off = (size_t)first << cl_region.page_shift, len = (size_t)count << cl_region.page_shift;
    int rc = 0;
    int d = cl_region_map_delta(first, count, 1);
    uint32_t budget = cl_region_mapping_budget();
    while (d > 0 && mappings + (uint32_t)d > budget) {
        if (evict_locked() != 0) break; /* try anyway: the budget is ours, not the kernel's */
        d = cl_region_map_delta(first, count, 1);
    }
    for (int tries = 0;; tries++) {
        if (mprotect((void *)(cl_region.base + off), len, cl_region.install_prot) == 0) break;
        rc = errno;
        if (rc != ENOMEM || tries > 64 || evict_locked() != 0) {
            rc = cl_err(rc, "mprotect of pages %lu+%lu: %s (vm.max_map_count reached?)", (unsigned long)first,
                        (unsigned long)count, strerror(rc));
            goto out;
        }
        d = cl_region_map_delta(first, count, 1);
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

int cl_region_drop(uint64_t first, uint64_t count) {
    int rc = 0;
    pthread_mutex_lock(&pt_lock);
    /* Drop maximal runs of present pages; pages in flight stay as they are. */
    uint64_t i = first, end = first + count;
    while (i < end && rc == 0) {
        while (i < end && !is_open(i)) {
            uint32_t exp = CL_PG_HELD;
            if (atomic_compare_exchange_strong(&cl_region.pages[i], &exp, CL_PG_ABSENT)) {
                fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)(i << cl_region.page_shift), (off_t)cl_region.page_size);
            }
            i++;
        }
        uint64_t s = i;
        while (i < end && is_open(i)) i++;
        if (i > s) {
            rc = drop_locked(s, i - s);
            if (!rc) CL_COUNT(pages_dropped, i - s);
            /* A partial drop splits a run, and the part that lost the page
             * its ring entry named could never be evicted again: name both
             * remains, so the mapping budget stays enforceable. */
            if (!rc && s > 0 && is_open(s - 1)) ring_push(s - 1);
            if (!rc && i < cl_region.npages && is_open(i)) ring_push(i);
        }
    }
    pthread_mutex_unlock(&pt_lock);
    return rc;
}

int clamor_pages_drop(uint64_t first, uint64_t count) {
    if (cl_region.role != CLAMOR_ROLE_WORKER) return cl_err(EPERM, "only a worker drops pages");
    if (first > cl_region.npages || count > cl_region.npages - first)
        return cl_err(EINVAL, "pages %lu+%lu are outside the region (%lu pages)", (unsigned long)first,
                      (unsigned long)count, (unsigned long)cl_region.npages);
    return cl_region_drop(first, count);
}

/* Drop open page i, which may split its run in two: one mapping more.
 * Within the mapping budget, evict as an install would; if nothing can be
 * evicted, drop i's whole open run instead (its other pages are fetched
 * again if touched).  What is left of a split run joins the eviction ring.
 * pt_lock held. */
static int drop_open_page(uint64_t i) {
    uint64_t s = i, e = i + 1;
    uint32_t budget = cl_region_mapping_budget();
    int d = cl_region_map_delta(i, 1, 0);
    while (d > 0 && mappings + (uint32_t)d > budget && evict_locked() == 0) {
        if (!is_open(i)) return 0; /* the eviction took i's run with it */
        d = cl_region_map_delta(i, 1, 0);
    }
    if (d > 0 && mappings + (uint32_t)d > budget) {
        while (s > 0 && is_open(s - 1)) s--;
        while (e < cl_region.npages && is_open(e)) e++;
    }
    int rc = drop_locked(s, e - s);
    if (rc == 0 && e - s == 1) {
        if (i > 0 && is_open(i - 1)) ring_push(i - 1);
        if (i + 1 < cl_region.npages && is_open(i + 1)) ring_push(i + 1);
    }
    return rc;
}

int clamor_invalidate(const uint64_t *pages, uint64_t n) {
    if (cl_region.role != CLAMOR_ROLE_WORKER) return cl_err(EPERM, "only a worker invalidates pages");
    for (uint64_t k = 0; k < n; k++)
        if (pages[k] >= cl_region.npages)
            return cl_err(EINVAL, "page %lu is outside the region (%lu pages)", (unsigned long)pages[k],
                          (unsigned long)cl_region.npages);
    int rc = 0;
    pthread_mutex_lock(&pt_lock);
    for (uint64_t k = 0; k < n; k++) { /* an error on one page must not keep the others */
        uint64_t i = pages[k];
        _Atomic uint32_t *w = &cl_region.pages[i];
        uint32_t s = atomic_load(w);
        switch (CL_PG_STATE(s)) {
        case CL_PG_PRESENT: {
            int r = drop_open_page(i);
            if (r && !rc) rc = r;
            CL_COUNT(pages_invalidated, 1);
            break;
        }
        case CL_PG_HELD: {
            /* Claim it as if a fetch were under way, punch, then let it go:
             * a fault meanwhile waits, and gets a fetch of its own. */
            if (!atomic_compare_exchange_strong(w, &s, CL_PG_WANTED)) {
                k--; /* it changed (a touch opened it): look again */
                continue;
            }
            atomic_fetch_add(&cl_region_drops, 1);
            fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      (off_t)(i << cl_region.page_shift), (off_t)cl_region.page_size);
            uint32_t exp = CL_PG_WANTED;
            if (!atomic_compare_exchange_strong(w, &exp, CL_PG_ABSENT)) { /* a waiter came */
                atomic_store(w, CL_PG_WANTED | CL_PG_WAITERS);
                if (cl_pager_enqueue(i) != 0) {
                    atomic_store(w, CL_PG_MKERR(ENOTCONN));
                    cl_futex_wake(w);
                }
            }
            atomic_fetch_add(&cl_region_drops, 1);
            CL_COUNT(pages_invalidated, 1);
            break;
        }
        case CL_PG_WANTED: /* in flight: the reply must not be installed */
            while (CL_PG_STATE(s) == CL_PG_WANTED && !atomic_compare_exchange_weak(w, &s, s | CL_PG_STALE)) {}
            CL_COUNT(pages_invalidated, 1);
            break;
        case CL_PG_ERROR: /* a later touch may succeed: the page changed */
            atomic_store(w, CL_PG_ABSENT);
            break;
        default:
            break;
        }
    }
    pthread_mutex_unlock(&pt_lock);
    return rc;
}
