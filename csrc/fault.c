/* fault.c -- the SIGSEGV handler and its chaining.
 *
 * DESIGN.  The handler runs in whichever thread touched a page that is not
 * present, usually one that holds the GIL inside numpy or scipy C code.  It
 * may do only async-signal-safe things (signal-safety(7)): atomics on the
 * page's state word, write(2) of the page index to the pager's wake pipe,
 * sched_yield(2) and fallocate(2) (plain system calls) to give the page its
 * memory while the request is on the wire, futex(2) to sleep until the
 * pager opens the page (or a bounded spin once the bytes have arrived),
 * write(2) and abort(3) for a fatal error.  No Python, no libzmq, no
 * malloc, no lock.  errno is saved and restored.  The pager does the
 * network work (pager.c).
 *
 * Faults outside the region, and signals sent with kill(2)/raise(3), go to
 * the handler that was installed before clamor's, in its own calling
 * convention (SA_SIGINFO or not).  SIG_DFL and SIG_IGN restore the default
 * disposition and let the fault happen again (or re-raise a sent signal), so
 * the process dies as it would have without clamor.  CPython's faulthandler
 * prints a traceback, restores its own predecessor and re-raises; if that
 * predecessor is clamor, the re-raised signal comes back here as a sent
 * signal after a chained real fault, and goes to the default action.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "internal.h"

_Atomic int cl_fault_wake_fd = -1;

static struct sigaction prev_sa;
static _Atomic int installed;
static volatile sig_atomic_t chained_real;

/* ---- async-signal-safe output ---------------------------------------------- */

static size_t slen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

static void sput(const char *s) {
    size_t n = slen(s);
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void sput_hex(uint64_t v) {
    char b[19] = "0x";
    int n = 2, started = 0;
    for (int sh = 60; sh >= 0; sh -= 4) {
        unsigned d = (unsigned)(v >> sh) & 15;
        if (d || started || sh == 0) {
            b[n++] = "0123456789abcdef"[d];
            started = 1;
        }
    }
    b[n] = 0;
    sput(b);
}

static void sput_dec(uint64_t v) {
    char b[21];
    int n = 20;
    b[n] = 0;
    do b[--n] = (char)('0' + v % 10); while (v /= 10);
    sput(b + n);
}

static const char *cause(int err) {
    switch (err) {
    case ENOENT: return "the driver never allocated this page (a dangling or wild pointer into the region)";
    case ETIMEDOUT: return "no answer from the page server within the fetch timeout (driver gone or overloaded?)";
    case ENOTCONN: return "no pager is running in this process (a process forked from the driver needs the driver's page server running: a Cluster's, or region.serve(); else start one with clamor_pager_start / attach)";
    case ENOMEM: return "out of memory mappings (vm.max_map_count) or of room for page versions";
    case ESTALE: return "the page version this task reads was already collected";
    case ERANGE: return "the page lies outside the region the server has";
    case EACCES: return "write to a page that is mapped read-only on this worker";
    case EPROTO: case EBADMSG: return "malformed reply from the page server";
    case ENOKEY: return "the page's relocations name a target this worker has not bound (reloc.c)";
    case ENOTRECOVERABLE: return "the driver has no relocation list that agrees with the bytes of that page version";
    case ESHUTDOWN: return "the pager was stopped";
    default: return "the page could not be fetched";
    }
}

/* Never returns. */
void cl_fault_fatal(uintptr_t addr, int err) {
    uint64_t off = addr - cl_region.base;
    sput("clamor: fatal: access to region offset ");
    sput_hex(off);
    sput(" (page ");
    sput_dec(off >> cl_region.page_shift);
    sput(", address ");
    sput_hex(addr);
    sput(") failed: ");
    sput(cause(err));
    sput(" [errno ");
    sput_dec((uint64_t)err);
    sput("]\n");
    /* SIGABRT: faulthandler, if enabled, adds the Python traceback. */
    abort();
}

/* ---- chaining ---------------------------------------------------------------- */

static void to_default(int sig, siginfo_t *si) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* A real fault re-executes the instruction and dies by default; a sent
     * signal has to be sent again (it is delivered once we return). */
    if (si->si_code <= 0) raise(sig);
}

static void chain(int sig, siginfo_t *si, void *uc) {
    const struct sigaction *p = &prev_sa;
    bool plain = !(p->sa_flags & SA_SIGINFO);
    if ((plain && (p->sa_handler == SIG_DFL || p->sa_handler == SIG_IGN)) ||
        (si->si_code <= 0 && chained_real)) {
        to_default(sig, si);
        return;
    }
    if (si->si_code > 0) chained_real = 1;
    if (plain)
        p->sa_handler(sig);
    else
        p->sa_sigaction(sig, si, uc);
}

/* ---- the handler ------------------------------------------------------------- */

static bool is_write_fault(void *uc) {
#if defined(__x86_64__)
    return (((ucontext_t *)uc)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
    (void)uc;
    return false;
#endif
}

static void post(uintptr_t addr, uint64_t msg) {
    int fd = atomic_load(&cl_fault_wake_fd);
    if (fd < 0) cl_fault_fatal(addr, ENOTCONN);
    for (;;) {
        ssize_t w = write(fd, &msg, sizeof msg);
        if (w == (ssize_t)sizeof msg) return;
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) { /* pipe full: the pager is draining it */
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
            continue;
        }
        cl_fault_fatal(addr, ENOTCONN);
    }
}

/* While the request is on the wire, allocate the page's memory in the memfd
 * from this thread, which would only sleep.  fallocate(2) allocates without
 * zeroing and maps nothing; the pager then writes the bytes with pwrite(2)
 * (pager.c), which maps nothing either.  On this VM page-table work is what
 * makes fresh memory slow: MADV_POPULATE_WRITE of the fill view took 60-130
 * us per 64 KiB page, fallocate takes ~25 us, and the less CPU this thread
 * takes, the sooner the reply gets through on two cores.  sched_yield()
 * first: a pager woken on this CPU then sends the request before the
 * allocation runs (when it did not, the send waited 50-90 us behind it).
 * Both are plain system calls; failure only loses the head start. */
static void give_memory(uint64_t idx) {
    sched_yield();
    fallocate(cl_region.memfd, FALLOC_FL_KEEP_SIZE, (off_t)(idx << cl_region.page_shift), (off_t)cl_region.page_size);
}

static uint64_t now_us(void) { return cl_now_ns() / 1000; } /* async-signal-safe (options.c) */

static uint64_t now_ms(void) { return now_us() / 1000; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* The page's bytes have arrived (CL_PG_ARRIVING): the pager opens it within
 * a pwrite and an mprotect, ~15-25 us here, about what a futex wake-up
 * takes.  Spin until the word changes rather than sleep, so the wake-up no
 * longer follows that work; yield now and then, so a pager on this CPU can
 * finish it.  Bounded: after SPIN_US the caller sleeps as usual.  Returns
 * the word as last seen. */
#define SPIN_US 200
static uint32_t spin_while(_Atomic uint32_t *w, uint32_t s) {
    uint64_t t0 = now_us();
    for (unsigned k = 1;; k++) {
        uint32_t t = atomic_load(w);
        if (t != s) return t;
        if (k % 64) {
            cpu_relax();
            continue;
        }
        if (now_us() - t0 > SPIN_US) return t;
        sched_yield();
    }
}

/* Same host: map the page from this thread.  The page table's lock is
 * held only briefly (no holder waits for anything while it has it), so a
 * busy lock is tried again a few times before the page goes to the pager,
 * which may be filling windows ahead of a scan. */
static int map_here(uint64_t idx) {
    for (int k = 0;; k++) {
        int rc = cl_map_run(idx, false, true);
        if (rc != EBUSY) return rc;
        if (k == 64) return EAGAIN;
        sched_yield();
    }
}

/* Same host: a fault in the window after the previous fault's is a scan.
 * The pager then maps and fills the next windows while this thread reads
 * (cl_map_populate); the fault at the window after those asks for more. */
#define POPULATE_WINDOWS 8
static _Atomic uint64_t last_window = UINT64_MAX - 1;

static void stream(uintptr_t addr, uint64_t idx) {
    if (!cl_option_get(CL_OPT_READAHEAD)) return; /* read-ahead off: no filling ahead either */
    uint64_t win = cl_map_window(), k = idx / win;
    uint64_t prev = atomic_exchange_explicit(&last_window, k, memory_order_relaxed);
    if (prev + 1 != k && prev + POPULATE_WINDOWS != k) return;
    uint64_t first = (k + 1) * win;
    if (first < cl_region.npages && atomic_load(&cl_fault_wake_fd) >= 0) post(addr, CL_REQ_POPULATE | ((uint64_t)(POPULATE_WINDOWS - 1) << 40) | first);
}

static void handler(int sig, siginfo_t *si, void *uc) {
    int saved = errno;
    uintptr_t a = (uintptr_t)si->si_addr;
    if (si->si_code <= 0 || !cl_in_region(a)) {
        chain(sig, si, uc);
        errno = saved;
        return;
    }
    if (cl_region.role == CLAMOR_ROLE_DRIVER) {
        /* a write to a page write-protected for copy-on-write (version.c) */
        int rc = is_write_fault(uc) ? cl_version_on_write(a) : EACCES;
        if (rc == EACCES) chain(sig, si, uc);
        else if (rc) cl_fault_fatal(a, rc);
        errno = saved;
        return;
    }
    uint64_t idx = cl_page_of(a);
    _Atomic uint32_t *w = &cl_region.pages[idx];
    CL_COUNT(faults, 1);
    uint64_t start = 0;
    uint32_t s = atomic_load(w);
    for (;;) {
        switch (CL_PG_STATE(s)) {
        case CL_PG_PRESENT:
            if (!(cl_region.install_prot & PROT_WRITE) && is_write_fault(uc)) cl_fault_fatal(a, EACCES);
            errno = saved;
            return; /* open now: the access is retried */
        case CL_PG_ABSENT:
        case CL_PG_HELD:
            /* Same host as the driver: map its page where it lies. */
            if (CL_PG_STATE(s) == CL_PG_ABSENT && atomic_load_explicit(&cl_region.map_on, memory_order_relaxed) &&
                map_here(idx) == 0) {
                stream(a, idx);
                s = atomic_load(w);
                continue;
            }
            if (atomic_compare_exchange_weak(w, &s, CL_PG_WANTED | CL_PG_WAITERS)) {
                bool fresh = CL_PG_STATE(s) == CL_PG_ABSENT;
                post(a, fresh ? idx : idx | CL_REQ_MARKER);
                if (fresh) give_memory(idx);
                s = CL_PG_WANTED | CL_PG_WAITERS;
                break;
            }
            continue; /* s reloaded by the failed CAS */
        case CL_PG_WANTED:
            if (!(s & CL_PG_WAITERS)) {
                if (!atomic_compare_exchange_weak(w, &s, s | CL_PG_WAITERS)) continue;
                s |= CL_PG_WAITERS;
            }
            if (s & CL_PG_ARRIVING) {
                uint32_t t = spin_while(w, s);
                if (t != s) {
                    s = t;
                    continue;
                }
            }
            break;
        default: /* CL_PG_ERROR */
            /* An earlier fetch failed (a prefetch, or read-ahead, that timed
             * out): this access has not waited for anything yet, so ask
             * once more; the error is fatal only if this fetch fails. */
            if (start) cl_fault_fatal(a, CL_PG_ERRNO(s));
            if (!atomic_compare_exchange_weak(w, &s, CL_PG_WANTED | CL_PG_WAITERS)) continue;
            post(a, idx);
            give_memory(idx);
            s = CL_PG_WANTED | CL_PG_WAITERS;
            break;
        }
        /* Sleep until the pager changes the word.  The pager times fetches
         * out itself; this bound only guards against a pager that died. */
        if (!start) start = now_ms();
        cl_futex_wait(w, s, 1000);
        if (now_ms() - start > cl_option_get(CL_OPT_FETCH_TIMEOUT_MS) + 5000) cl_fault_fatal(a, ETIMEDOUT);
        s = atomic_load(w);
    }
}

/* ---- installation ------------------------------------------------------------- */

static int install_front(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &old) != 0) return cl_err(errno, "sigaction(SIGSEGV): %s", strerror(errno));
    /* Only remember a predecessor that is not clamor itself. */
    if (!((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == handler)) prev_sa = old;
    chained_real = 0;
    return 0;
}

int clamor_fault_install(void) {
    if (atomic_load(&installed)) return 0;
    int rc = install_front();
    if (!rc) atomic_store(&installed, 1);
    return rc;
}

int clamor_fault_is_first(void) {
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) != 0) return 0;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == handler;
}

int clamor_fault_ensure_first(void) {
    if (clamor_fault_is_first()) return 0;
    int rc = install_front();
    if (rc) return rc;
    atomic_store(&installed, 1);
    return -1;
}
