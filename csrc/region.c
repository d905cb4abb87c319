/* region.c -- the fixed-address global region: map, close, fork.
 *
 * DESIGN.  The region is a memfd mapped MAP_SHARED at a fixed address with
 * MAP_FIXED_NOREPLACE, so a taken range is an error rather than a silent
 * overwrite and ASLR stays on.  The driver maps it read-write and owns the
 * authoritative bytes.  A worker maps its own memfd twice: the public view at
 * the common base starts PROT_NONE, and a second "fill" view elsewhere is
 * always read-write.  The pager writes a fetched page into the memfd while
 * its public view is still closed, and the page table (pagetable.c) then
 * opens it; the fill view is how a worker's page server reads its pages.
 *
 * A child forked from a process with a region (a local worker) replaces the
 * public view with a fresh private memfd, every page absent, from a
 * pthread_atfork() child handler: it must never read later driver writes
 * through memory shared with the driver.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

struct cl_region cl_region = {.memfd = -1, .srcfd = -1};

static bool atfork_registered;

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

static int reset_after_fork(void);

/* A forked worker may touch the region before any of its own code runs:
 * the interpreter's after-fork work reuses objects from CPython's free lists
 * and reads dicts and caches that grew inside a heap() block.  Every page is
 * absent now, so the pager and this worker's page server start here, before
 * fork() returns to the child, and such a touch is fetched like any other
 * instead of dying for want of a pager.  (glibc has unlocked malloc by the
 * time child handlers run; the threads are this process's first.)  A
 * failure leaves them stopped; clamor/memory/region.py tries again. */
static unsigned fork_port_lo, fork_port_hi;

int clamor_set_fork_ports(unsigned lo, unsigned hi) {
    if (!(lo == 0 && hi == 0) && !(lo > 0 && lo <= hi && hi <= 65535))
        return cl_err(EINVAL, "a port range is 1 <= lo <= hi <= 65535 (or 0, 0 for any), not %u..%u", lo, hi);
    fork_port_lo = lo;
    fork_port_hi = hi;
    return 0;
}

/* Start a forked worker's page server on the host its driver's serves on
 * (so that peers reach it wherever they reach the driver; loopback for
 * any other transport), on any port or the first free one of the range. */
static void start_child_server(const char *parent) {
    const char *colon = strrchr(parent, ':');
    char host[200], ep[256], bound[256];
    if (strncmp(parent, "tcp://", 6) == 0 && colon && colon > parent + 6 && colon - (parent + 6) < (long)sizeof host)
        snprintf(host, sizeof host, "%.*s", (int)(colon - (parent + 6)), parent + 6);
    else
        snprintf(host, sizeof host, "127.0.0.1");
    if (!fork_port_lo) {
        snprintf(ep, sizeof ep, "tcp://%s:*", host);
        clamor_server_start(ep, bound, sizeof bound);
        return;
    }
    for (unsigned p = fork_port_lo; p <= fork_port_hi; p++) {
        snprintf(ep, sizeof ep, "tcp://%s:%u", host, p);
        if (clamor_server_start(ep, bound, sizeof bound) != EADDRINUSE) return;
    }
}

static void atfork_child(void) {
    cl_heap_reset_after_fork(); /* first: allocations below must not go to the region */
    if (cl_region.role == CLAMOR_ROLE_NONE || reset_after_fork() != 0) return;
    const char *parent = clamor_fork_parent_endpoint();
    if (!parent[0]) { /* no page server to fetch from: a touch ends with a clear message, not a bare SIGSEGV */
        clamor_fault_install();
        return;
    }
    start_child_server(parent); /* first: the pager names it to the driver */
    clamor_pager_start(parent);
}

/* Worker-only parts: fill view and page table. */
static int map_worker_side(int fd) {
    void *fill = mmap(NULL, cl_region.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (fill == MAP_FAILED) return cl_err(errno, "mmap of the fill view: %s", strerror(errno));
    int rc = cl_pt_init();
    if (rc) {
        munmap(fill, cl_region.size);
        return rc;
    }
    cl_region.fill = fill;
    return 0;
}

static int region_map(uintptr_t base, size_t size, size_t psize, int role) {
    int rc, fd = -1;
    if (cl_region.role != CLAMOR_ROLE_NONE)
        return cl_err(EBUSY, "this process already has a region at 0x%lx", (unsigned long)cl_region.base);
    if ((rc = geometry(&base, &size, &psize))) return rc;
    cl_region.base = base;
    cl_region.size = size;
    cl_region.page_size = psize;
    cl_region.page_shift = (unsigned)__builtin_ctzll(psize);
    cl_region.npages = size >> cl_region.page_shift;
    /* locations of the driver's memfd: homes, twins and a pool as large */
    cl_region.nlocs = 3 * cl_region.npages;
    if (cl_region.nlocs >= UINT32_MAX) {
        rc = cl_err(EINVAL, "a region of %lu pages is too many to version (at most 2^30): choose larger pages",
                    (unsigned long)cl_region.npages);
        goto err;
    }
    if ((rc = new_memfd(role == CLAMOR_ROLE_DRIVER ? cl_map_file_size() : size, &fd))) goto err;
    if ((rc = map_fixed(base, size, role == CLAMOR_ROLE_DRIVER ? PROT_READ | PROT_WRITE : PROT_NONE, fd)))
        goto err;
    cl_region.memfd = fd;
    if (role == CLAMOR_ROLE_WORKER && (rc = map_worker_side(fd))) {
        munmap((void *)base, size);
        goto err;
    }
    if (role == CLAMOR_ROLE_DRIVER && (rc = cl_map_driver_init(fd))) {
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
    if (fd >= 0) close(fd);
    memset(&cl_region, 0, sizeof cl_region);
    cl_region.memfd = -1;
    cl_region.srcfd = -1;
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
    cl_wprot_stop(); /* (its thread serves writes to the region) */
    int role = cl_region.role;
    cl_region.role = CLAMOR_ROLE_NONE;
    atomic_thread_fence(memory_order_seq_cst);
    munmap((void *)cl_region.base, cl_region.size);
    if (role == CLAMOR_ROLE_WORKER) {
        munmap(cl_region.fill, cl_region.size);
        cl_pt_free();
    }
    cl_map_close();
    close(cl_region.memfd);
    cl_alloc_reset();
    cl_version_reset();
    clamor_reloc_reset();
    cl_dir_reset();
    memset(&cl_region, 0, sizeof cl_region);
    cl_region.memfd = -1;
    cl_region.srcfd = -1;
    return 0;
}

uintptr_t clamor_region_base(void) { return cl_region.role ? cl_region.base : 0; }
size_t clamor_region_size(void) { return cl_region.role ? cl_region.size : 0; }
size_t clamor_page_size(void) { return cl_region.role ? cl_region.page_size : 0; }
int clamor_region_role(void) { return cl_region.role; }

/* ---- fork ---------------------------------------------------------------- */

static char fork_parent_ep[256];

const char *clamor_fork_parent_endpoint(void) { return fork_parent_ep; }

/* Make this forked child a worker: a fresh private memfd at the same
 * address, every page absent, none of the parent's threads. */
static int reset_after_fork(void) {
    if (cl_region.role == CLAMOR_ROLE_NONE) return cl_err(ENXIO, "no region to reset");
    /* The parent's threads are gone; forget them without touching their
     * (now orphaned) libzmq state. */
    snprintf(fork_parent_ep, sizeof fork_parent_ep, "%s", clamor_server_endpoint());
    clamor_stats_reset(); /* the counters describe this process only */
    cl_pager_stop_after_fork();
    cl_server_stop_after_fork();
    cl_pt_after_fork();
    cl_wprot_after_fork();
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
        cl_pt_free();
    } else {
        cl_version_reset(); /* the driver's versions, and its writable view of its memfd */
    }
    /* Same host as the driver: map its pages, through the memfd inherited
     * (the driver's own, or the one a worker parent mapped from). */
    int srcfd = -1;
    if (was_worker ? cl_region.srcfd >= 0 : cl_region.map_share) srcfd = was_worker ? cl_region.srcfd : oldfd;
    if (was_worker && cl_region.wloc) munmap((void *)cl_region.wloc, (size_t)cl_region.npages * 4);
    cl_region.wloc = NULL;
    if (srcfd < 0) {
        cl_map_close();
    } else if (cl_map_child_init(srcfd) != 0) {
        if (srcfd != oldfd) close(srcfd);
        srcfd = -1;
    }
    if (oldfd != srcfd) close(oldfd);
    cl_region.memfd = fd;
    cl_region.role = CLAMOR_ROLE_WORKER;
    return map_worker_side(fd);
}
