/* prefetch.c -- clamor_prefetch(): fetch a range of region pages before a
 * system call needs them, and the pager's queue entry for other callers.
 *
 * The kernel never raises SIGSEGV for a system call that touches a page
 * that is not present: read(), recv_into() and write() fail with EFAULT
 * instead (DESIGN.md trap 4).  clamor_prefetch() claims the absent pages of
 * a range, posts them to the pager as runs (one pipe word per run, the same
 * pipe the fault handler uses), and waits on each page's state word as the
 * handler would.  On the driver it opens write-protected pages instead
 * (version.c).  Called from ordinary threads, never from a handler.
 */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "internal.h"

static int wait_page(uint64_t i) {
    _Atomic uint32_t *w = &cl_region.pages[i];
    uint64_t start = cl_now_ns(), lim = (cl_option_get(CL_OPT_FETCH_TIMEOUT_MS) + 5000) * 1000000ull;
    for (;;) {
        uint32_t s = atomic_load(w);
        switch (CL_PG_STATE(s)) {
        case CL_PG_PRESENT: return 0;
        case CL_PG_ERROR: return CL_PG_ERRNO(s);
        case CL_PG_WANTED:
            if (!(s & CL_PG_WAITERS) && !atomic_compare_exchange_weak(w, &s, s | CL_PG_WAITERS)) continue;
            cl_futex_wait(w, s | CL_PG_WAITERS, 1000);
            break;
        default: /* ABSENT (dropped meanwhile) or HELD: ask again */
            if (atomic_compare_exchange_weak(w, &s, CL_PG_WANTED | CL_PG_WAITERS)) {
                uint64_t msg = CL_PG_STATE(s) == CL_PG_HELD ? i | CL_REQ_MARKER : i;
                int fd = atomic_load(&cl_fault_wake_fd);
                if (fd < 0 || write(fd, &msg, sizeof msg) != sizeof msg) return ENOTCONN;
            }
        }
        if (cl_now_ns() - start > lim) return ETIMEDOUT;
    }
}

int clamor_prefetch(const void *addr, size_t len) {
    uintptr_t a = (uintptr_t)addr;
    if (cl_region.role == CLAMOR_ROLE_DRIVER && a - cl_region.base <= cl_region.size &&
        len <= cl_region.size - (a - cl_region.base))
        return cl_version_open(a, len); /* write-protected between versions */
    if (cl_region.role == CLAMOR_ROLE_DRIVER)
        return cl_err(EFAULT, "prefetch range %p+%zu is not inside the region", addr, len);
    if (cl_region.role != CLAMOR_ROLE_WORKER) return cl_err(ENXIO, "no region in this process");
    if (len == 0) return 0;
    if (a - cl_region.base >= cl_region.size || len > cl_region.size - (a - cl_region.base))
        return cl_err(EFAULT, "prefetch range %p+%zu is not inside the region", addr, len);
    int fd = atomic_load(&cl_fault_wake_fd);
    if (fd < 0) return cl_err(ENOTCONN, "no pager is running in this process");
    uint64_t first = cl_page_of(a), end = cl_page_of(a + len - 1) + 1;
    /* Claim absent pages and post them as ranges; one pipe word per run. */
    for (uint64_t i = first; i < end;) {
        uint64_t s = i;
        while (i < end && i - s < CL_REQ_MAXRUN) {
            uint32_t exp = CL_PG_ABSENT;
            if (!atomic_compare_exchange_strong(&cl_region.pages[i], &exp, CL_PG_WANTED) &&
                (CL_PG_STATE(exp) != CL_PG_ERROR || /* a failed fetch is tried again */
                 !atomic_compare_exchange_strong(&cl_region.pages[i], &exp, CL_PG_WANTED)))
                break;
            i++;
        }
        if (i > s) {
            uint64_t msg = CL_REQ_RANGE | ((i - s) << 40) | s;
            while (write(fd, &msg, sizeof msg) != sizeof msg) {
                if (errno != EAGAIN && errno != EINTR) return cl_err(ENOTCONN, "pager pipe: %s", strerror(errno));
                usleep(100);
            }
        } else {
            i++;
        }
    }
    for (uint64_t i = first; i < end; i++) {
        int rc = wait_page(i);
        if (rc)
            return cl_err(rc, "page %lu (region offset 0x%lx) could not be fetched: %s", (unsigned long)i,
                          (unsigned long)(i << cl_region.page_shift), strerror(rc));
    }
    return 0;
}

/* Worker: how many of the n bytes at p can be read, that is, lie before
 * the first page the pager cannot fetch (one the driver never allocated).
 * For realloc of a region block on a worker, whose old size only the
 * driver knows: copying up to n readable bytes keeps every byte of the old
 * block, and never faults on a page that would end the process. */
size_t cl_prefetch_readable(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    if (n == 0 || cl_region.role != CLAMOR_ROLE_WORKER || a - cl_region.base >= cl_region.size) return 0;
    if (n > cl_region.size - (a - cl_region.base)) n = cl_region.size - (a - cl_region.base);
    if (clamor_prefetch(p, n) == 0) return n;
    /* The bound is the first page whose fetch failed.  (Not the first one
     * absent: a page fetched here may be dropped again meanwhile, by an
     * eviction or an invalidation, and the copy simply faults it back.) */
    for (uint64_t i = cl_page_of(a), end = cl_page_of(a + n - 1) + 1; i < end; i++) {
        uint32_t s = atomic_load(&cl_region.pages[i]);
        /* never allocated: the block ends before it.  (Another failure, a
         * time-out say, bounds nothing: the copy faults and reports it.) */
        if (CL_PG_STATE(s) != CL_PG_ERROR || CL_PG_ERRNO(s) != ENOENT) continue;
        atomic_compare_exchange_strong(&cl_region.pages[i], &s, CL_PG_ABSENT); /* a later touch asks again */
        uintptr_t at = cl_region.base + ((uintptr_t)i << cl_region.page_shift);
        return at > a ? at - a : 0;
    }
    return n;
}

int cl_prefetch_enqueue(uint64_t idx) {
    int fd = atomic_load(&cl_fault_wake_fd);
    if (fd < 0) return ENOTCONN;
    return write(fd, &idx, sizeof idx) == sizeof idx ? 0 : errno;
}
