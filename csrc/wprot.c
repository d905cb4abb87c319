/* wprot.c -- how the driver write-protects the region between versions:
 * userfaultfd's write-protect mode, or mprotect.
 *
 * DESIGN.  Once a version has begun, the driver's first write to a page must
 * be stopped before it lands, so that the page's bytes can be kept as the
 * version running tasks read (version.c).  mprotect(PROT_READ) stops a
 * write from user space (SIGSEGV, fault.c), but not a system call that
 * writes into the page: read(2), recv(2), getrandom(2) fail with EFAULT,
 * since the kernel raises no signal for its own accesses (DESIGN.md, trap
 * 4).  So np.load, open().read() or pickle.load under heap() failed on a
 * driver whose region was protected.  userfaultfd's write-protect mode
 * (shared memory since Linux 5.19) stops both kinds: the writing thread,
 * in user space or inside a system call, sleeps until the fault is
 * resolved.  One C thread, "clamor-wprot", reads the fault events, runs the
 * same copy-on-write as the SIGSEGV handler (cl_version_on_write: the
 * page's bytes stay as the version, the driver's view moves to a copy, a
 * new mapping that is not registered and so writable), and wakes the
 * writer.  It never runs Python and takes no lock a writer may hold.
 *
 * The mechanism is chosen at the first version: CLAMOR_WRITE_PROTECT=auto
 * (the default) tries userfaultfd and falls back to mprotect with the
 * reason kept (clamor_write_protection); "userfaultfd" makes its absence
 * an error; "mprotect" never tries it.  userfaultfd needs root,
 * CAP_SYS_PTRACE, vm.unprivileged_userfaultfd=1 or access to
 * /dev/userfaultfd (Linux 6.1+).  Measured here (2 cores, 64 KiB pages): a
 * first write costs 38-44 us through the thread against 33-35 us through
 * SIGSEGV, almost all of it the copy and the new mapping.
 *
 * Protecting unpopulated shared memory installs a marker per page and
 * allocates page tables: over the whole default region (64 GiB) that is
 * 128 MiB and 150 ms.  So userfaultfd protects only pages the allocator
 * has handed out: the hull of them at the first version, and each page
 * beyond it as the allocator first hands it out (cl_wprot_used).  A range
 * userfaultfd cannot protect (out of memory) is protected with mprotect
 * instead: exact, only without the system calls.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/userfaultfd.h>

#include "internal.h"

/* (headers older than the running kernel) */
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif
#ifndef SYS_userfaultfd
#define SYS_userfaultfd 323
#endif

static struct {
    _Atomic int mode;      /* CLAMOR_WPROT_* */
    int ufd;               /* userfaultfd, or -1 */
    int pipe_r, pipe_w;    /* wakes the thread to stop */
    pthread_t th;
    bool running;
    _Atomic uint64_t hull; /* pages [0, hull) of the region have been handed out */
    uint64_t guarded;      /* userfaultfd: pages [0, guarded) were protected once */
    _Atomic bool mixed;    /* userfaultfd: some ranges were protected by mprotect instead */
    char reason[256];
} W = {.ufd = -1, .pipe_r = -1, .pipe_w = -1};

/* Mode changes and the hull's growth: leaf lock, taken under the
 * allocator's lock and under version.c's, never the other way round. */
static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;

static inline uintptr_t page_addr(uint64_t p) { return cl_region.base + ((uintptr_t)p << cl_region.page_shift); }

/* ---- userfaultfd primitives ------------------------------------------------- */

static int uffd_register(uint64_t first, uint64_t n) {
    if (!n) return 0;
    struct uffdio_register r = {.range = {page_addr(first), n << cl_region.page_shift}, .mode = UFFDIO_REGISTER_MODE_WP};
    return ioctl(W.ufd, UFFDIO_REGISTER, &r) ? errno : 0;
}

static int uffd_protect(uint64_t first, uint64_t n) {
    if (!n) return 0;
    struct uffdio_writeprotect w = {.range = {page_addr(first), n << cl_region.page_shift},
                                    .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    return ioctl(W.ufd, UFFDIO_WRITEPROTECT, &w) ? errno : 0;
}

/* Protect pages [first, first+n): userfaultfd if it runs (registering
 * first: the views version.c moved are new mappings), else, or should
 * that fail, mprotect. */
static int protect_pages(uint64_t first, uint64_t n) {
    if (!n) return 0;
    bool uffd = atomic_load(&W.mode) == CLAMOR_WPROT_USERFAULTFD;
    if (uffd && !uffd_register(first, n) && !uffd_protect(first, n)) return 0;
    if (mprotect((void *)page_addr(first), n << cl_region.page_shift, PROT_READ)) return errno;
    if (uffd) atomic_store(&W.mixed, true);
    return 0;
}

/* ---- the thread ------------------------------------------------------------------ */

static void resolve(uintptr_t a, uint64_t flags) {
    uintptr_t page = a & ~((uintptr_t)cl_region.page_size - 1);
    int rc = (flags & UFFD_PAGEFAULT_FLAG_WP) ? cl_version_on_write(a) : EACCES;
    if (rc == EACCES) {
        /* no copy-on-write running (cannot happen while pages are
         * protected): open the page rather than leave the writer asleep */
        struct uffdio_writeprotect w = {.range = {page, cl_region.page_size}, .mode = 0};
        ioctl(W.ufd, UFFDIO_WRITEPROTECT, &w);
        return;
    }
    if (rc) cl_fault_fatal(a, rc);
    struct uffdio_range r = {page, cl_region.page_size};
    ioctl(W.ufd, UFFDIO_WAKE, &r);
}

static void *wprot_main(void *arg) {
    (void)arg;
    struct pollfd pf[2] = {{.fd = W.ufd, .events = POLLIN}, {.fd = W.pipe_r, .events = POLLIN}};
    struct uffd_msg msg[16];
    for (;;) {
        if (poll(pf, 2, -1) < 0) continue; /* EINTR */
        if (pf[1].revents) return NULL;    /* cl_wprot_stop */
        ssize_t n = read(W.ufd, msg, sizeof msg);
        if (n <= 0) continue; /* EAGAIN: another read took it */
        for (size_t i = 0; i < (size_t)n / sizeof msg[0]; i++)
            if (msg[i].event == UFFD_EVENT_PAGEFAULT) resolve((uintptr_t)msg[i].arg.pagefault.address, msg[i].arg.pagefault.flags);
    }
}

/* ---- choosing ---------------------------------------------------------------------- */

static int uffd_open(void) {
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) return fd;
    int e = errno;
    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
        fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
        int e2 = errno;
        close(dev);
        if (fd >= 0) return fd;
        snprintf(W.reason, sizeof W.reason, "userfaultfd(2): %s; /dev/userfaultfd: %s", strerror(e), strerror(e2));
        return -1;
    }
    snprintf(W.reason, sizeof W.reason, "userfaultfd(2): %s (needs root, CAP_SYS_PTRACE, "
             "vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd); /dev/userfaultfd: %s",
             strerror(e), strerror(errno));
    return -1;
}

/* Open a userfaultfd with write protection of shared memory, register the
 * whole region (a flag on the mapping: cheap) and start the thread. */
static int uffd_start(void) {
    int fd = uffd_open();
    if (fd < 0) return ENOTSUP;
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
    if (ioctl(fd, UFFDIO_API, &api) || !(api.features & UFFD_FEATURE_WP_HUGETLBFS_SHMEM)) {
        snprintf(W.reason, sizeof W.reason, "userfaultfd cannot write-protect shared memory here (Linux 5.19+): %s",
                 strerror(errno));
        close(fd);
        return ENOTSUP;
    }
    W.ufd = fd;
    int p[2] = {-1, -1}, rc = uffd_register(0, cl_region.npages);
    if (rc) snprintf(W.reason, sizeof W.reason, "registering the region with userfaultfd: %s", strerror(rc));
    else if (pipe2(p, O_CLOEXEC | O_NONBLOCK)) rc = errno;
    if (!rc) {
        W.pipe_r = p[0];
        W.pipe_w = p[1];
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits it: no signal runs there */
        rc = pthread_create(&W.th, NULL, wprot_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc) snprintf(W.reason, sizeof W.reason, "starting the write-protection thread: %s", strerror(rc));
        else pthread_setname_np(W.th, "clamor-wprot");
    }
    if (rc) {
        if (p[0] >= 0) close(p[0]), close(p[1]);
        close(fd); /* unregisters the region */
        W.ufd = W.pipe_r = W.pipe_w = -1;
        return rc;
    }
    W.running = true;
    return 0;
}

/* Stop the thread and close the userfaultfd (which unregisters the region:
 * its pages are writable again).  Not under wlock: the thread may wait for
 * version.c's writers, never for wlock, but keep it simple. */
static void uffd_stop(void) {
    if (W.running) {
        uint64_t one = 1;
        while (write(W.pipe_w, &one, sizeof one) < 0 && errno == EINTR) continue;
        pthread_join(W.th, NULL);
        W.running = false;
    }
    if (W.pipe_r >= 0) close(W.pipe_r), close(W.pipe_w);
    if (W.ufd >= 0) close(W.ufd);
    W.ufd = W.pipe_r = W.pipe_w = -1;
}

int cl_wprot_start(void) {
    const char *want = getenv("CLAMOR_WRITE_PROTECT");
    if (!want || !*want) want = "auto";
    bool strict = strcmp(want, "userfaultfd") == 0, mprot = strcmp(want, "mprotect") == 0;
    if (!strict && !mprot && strcmp(want, "auto") != 0)
        return cl_err(EINVAL, "CLAMOR_WRITE_PROTECT=%s: the choices are auto, userfaultfd and mprotect", want);
    pthread_mutex_lock(&wlock);
    int rc = 0;
    if (atomic_load(&W.mode) != CLAMOR_WPROT_NONE) goto out;
    if (mprot) {
        snprintf(W.reason, sizeof W.reason, "CLAMOR_WRITE_PROTECT=mprotect");
    } else if (uffd_start() == 0) {
        W.guarded = atomic_load(&W.hull);
        if ((rc = uffd_protect(0, W.guarded)) == 0) {
            snprintf(W.reason, sizeof W.reason, "userfaultfd: system calls may write into the region");
            atomic_store(&W.mode, CLAMOR_WPROT_USERFAULTFD);
            goto out;
        }
        uffd_stop();
        snprintf(W.reason, sizeof W.reason, "write-protecting the region with userfaultfd: %s", strerror(rc));
    }
    if (strict) {
        rc = cl_err(ENOTSUP, "CLAMOR_WRITE_PROTECT=userfaultfd: %s", W.reason);
        goto out;
    }
    rc = 0;
    if (mprotect((void *)cl_region.base, cl_region.size, PROT_READ))
        rc = cl_err(errno, "write-protecting the region: %s", strerror(errno));
    else
        atomic_store(&W.mode, CLAMOR_WPROT_MPROTECT);
out:
    pthread_mutex_unlock(&wlock);
    return rc;
}

int cl_wprot_mode(void) { return atomic_load_explicit(&W.mode, memory_order_relaxed); }

int cl_wprot_view_prot(void) {
    return cl_wprot_mode() == CLAMOR_WPROT_USERFAULTFD ? PROT_READ | PROT_WRITE : PROT_READ;
}

int cl_wprot_close(uint64_t first, uint64_t n) { return protect_pages(first, n); }

int cl_wprot_open(uint64_t first, uint64_t n) {
    if (cl_wprot_mode() != CLAMOR_WPROT_USERFAULTFD || atomic_load(&W.mixed)) {
        if (mprotect((void *)page_addr(first), n << cl_region.page_shift, PROT_READ | PROT_WRITE)) return errno;
        if (cl_wprot_mode() != CLAMOR_WPROT_USERFAULTFD) return 0;
    }
    /* Usually the views just moved to new mappings, not registered, and
     * this fails with ENOENT.  A page still registered and protected (one
     * the allocator handed out after a prefetch had opened it) is opened
     * here, and its writers woken. */
    for (uint64_t p = first; p < first + n; p++) {
        struct uffdio_writeprotect w = {.range = {page_addr(p), cl_region.page_size}, .mode = 0};
        ioctl(W.ufd, UFFDIO_WRITEPROTECT, &w);
    }
    return 0;
}

void cl_wprot_used(uint64_t off, uint64_t len) {
    if (!len || cl_region.role != CLAMOR_ROLE_DRIVER) return;
    uint64_t end = ((off + len - 1) >> cl_region.page_shift) + 1;
    if (end <= atomic_load_explicit(&W.hull, memory_order_relaxed)) return;
    pthread_mutex_lock(&wlock);
    if (end > atomic_load(&W.hull)) {
        if (atomic_load(&W.mode) == CLAMOR_WPROT_USERFAULTFD && end > W.guarded) {
            /* (should both ways fail, the pages stay writable, and their
             * first writes go unlogged: nothing better is left here) */
            protect_pages(W.guarded, end - W.guarded);
            W.guarded = end;
        }
        atomic_store(&W.hull, end);
    }
    pthread_mutex_unlock(&wlock);
}

void cl_wprot_stop(void) {
    pthread_mutex_lock(&wlock);
    uffd_stop();
    atomic_store(&W.mode, CLAMOR_WPROT_NONE);
    atomic_store(&W.hull, 0);
    W.guarded = 0;
    atomic_store(&W.mixed, false);
    W.reason[0] = 0;
    pthread_mutex_unlock(&wlock);
}

void cl_wprot_after_fork(void) {
    /* The thread did not survive fork, and the child's mappings are no
     * longer registered (no UFFD_FEATURE_EVENT_FORK): close what is left. */
    pthread_mutex_init(&wlock, NULL);
    W.running = false;
    if (W.pipe_r >= 0) close(W.pipe_r), close(W.pipe_w);
    if (W.ufd >= 0) close(W.ufd);
    W.ufd = W.pipe_r = W.pipe_w = -1;
    atomic_store(&W.mode, CLAMOR_WPROT_NONE);
    atomic_store(&W.hull, 0);
    W.guarded = 0;
    atomic_store(&W.mixed, false);
    W.reason[0] = 0;
}

int clamor_write_protection(char *reason, size_t cap) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER) {
        if (reason && cap) reason[0] = 0;
        return CLAMOR_WPROT_NONE;
    }
    pthread_mutex_lock(&wlock);
    int mode = atomic_load(&W.mode);
    if (reason && cap) snprintf(reason, cap, "%s%s", W.reason, atomic_load(&W.mixed) ? " (some ranges by mprotect: userfaultfd could not protect them)" : "");
    pthread_mutex_unlock(&wlock);
    return mode;
}
