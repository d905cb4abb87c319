/* prefetch.c -- clamor_prefetch(): fetch a range of pages before it is
 * touched, and wait for it.
 *
 * DESIGN.  The caller claims the absent pages of the range (ABSENT ->
 * WANTED), posts each run of them to the pager as one pipe word (a
 * CL_REQ_RANGE, pager.c), then waits on each page's state word as the fault
 * handler would.  It is what system calls into region memory need on a
 * worker, since the kernel raises no SIGSEGV for them (EFAULT instead).  On
 * the driver, where pages are write-protected between stages, it opens the
 * range for writing instead (version.c).
 */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "internal.h"

static int wait_page(uint64_t i) {
    _Atomic uint32_t *w = &cl_region.pages[i];
    uint64_t start = cl_now_ns(), lim = ((uint64_t)clamor_fetch_timeout_ms() + 5000) * 1000000ull;
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
        return cl_version_open(a, len); /* write-protected between stages */
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
        while (i < end && i - s < 0x3fffff) {
            uint32_t exp = CL_PG_ABSENT;
            if (!atomic_compare_exchange_strong(&cl_region.pages[i], &exp, CL_PG_WANTED)) break;
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
