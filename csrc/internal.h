/* internal.h -- shared internals of clamor's C core (prefix _cl_ / cl_).
 *
 * Not installed, not part of the API.  Holds the process-wide region state,
 * page-state encoding, error and statistics helpers that several files use.
 */
#ifndef CLAMOR_INTERNAL_H
#define CLAMOR_INTERNAL_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clamor.h"

#define CL_OS_PAGE ((size_t)4096)

/* ---- errors (error.c) ---------------------------------------------------- */

/* Record a one-line detail for the calling thread and return `err`, so that
 * `return cl_err(EINVAL, "...", ...)` reads naturally. */
int cl_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cl_err_clear(void);

/* ---- page states (pagetable.c) ------------------------------------------- *
 *
 * One 32-bit word per page of a worker's region.  The low byte is the state,
 * bit 8 says a thread is (or was) waiting on it, bits 16.. hold an errno for
 * CL_PG_ERROR.  Words are read and written with atomics and waited on with
 * futex(2) (futex.c), which the fault handler may use: it is a plain system
 * call.
 *
 *   ABSENT  -> WANTED   a fault, a prefetch or read-ahead asked for it
 *   WANTED  -> PRESENT  the pager copied it in and opened the public view
 *   WANTED  -> HELD     read-ahead data arrived; public view still closed so
 *                       that the first touch tells the pager to read further
 *   HELD    -> WANTED   that first touch (the pager then opens it)
 *   WANTED  -> ERROR    the fetch failed; every waiter reports the errno
 *   PRESENT -> ABSENT   dropped (invalidated, or on request)
 *   PRESENT -> HELD     evicted to bound mappings: closed, bytes kept
 */
enum {
    CL_PG_ABSENT = 0,
    CL_PG_WANTED = 1,
    CL_PG_PRESENT = 2,
    CL_PG_HELD = 3,
    CL_PG_ERROR = 4,
};
#define CL_PG_STATE(w) ((w) & 0xffu)
#define CL_PG_WAITERS 0x100u
#define CL_PG_ERRNO(w) ((int)((w) >> 16))
#define CL_PG_MKERR(e) (CL_PG_ERROR | ((uint32_t)(e) << 16))

/* Process-wide region state.  Written only by region calls (not
 * thread-safe against each other); read by everyone. */
struct cl_region {
    uintptr_t base;
    size_t size;
    size_t page_size;
    unsigned page_shift;
    uint64_t npages;
    int role;               /* enum clamor_role */
    int memfd;
    char *fill;             /* second RW view of the memfd (workers) */
    _Atomic uint32_t *pages; /* page-state words (workers), npages long */
    int install_prot;       /* protection of a present page (workers) */
};
extern struct cl_region cl_region;

static inline bool cl_in_region(uintptr_t a) {
    return cl_region.role != CLAMOR_ROLE_NONE && a - cl_region.base < cl_region.size;
}
static inline uint64_t cl_page_of(uintptr_t a) {
    return (uint64_t)(a - cl_region.base) >> cl_region.page_shift;
}
static inline char *cl_page_addr(uint64_t idx) {
    return (char *)(cl_region.base + ((uintptr_t)idx << cl_region.page_shift));
}

/* Wait while *w == val (timeout_ms < 0: forever), wake every waiter
 * (futex.c).  Async-signal-safe. */
int cl_futex_wait(_Atomic uint32_t *w, uint32_t val, int timeout_ms);
void cl_futex_wake(_Atomic uint32_t *w);

/* The page table (pagetable.c).  cl_pt_init() maps the state words of a
 * fresh worker region (every page ABSENT) and cl_pt_free() unmaps them;
 * cl_pt_after_fork() re-initialises its lock in a forked child.  Install
 * opens the public view of pages the pager filled (evicting if the mapping
 * budget says so) and wakes their waiters; drop closes them and punches
 * their memory out.  Both take the page table's lock. */
int cl_pt_init(void);
void cl_pt_free(void);
void cl_pt_after_fork(void);
int cl_pt_install(uint64_t first, uint64_t count);
int cl_pt_drop(uint64_t first, uint64_t count);

/* ---- allocator hooks (alloc.c) ------------------------------------------- */

/* 1 if any byte of [off, off+len) of the region belongs to memory the
 * allocator has handed out (now or since its last reuse), else 0.  Lock-free;
 * the page server calls it to refuse pages nobody allocated. */
int cl_alloc_range_used(uint64_t off, uint64_t len);
/* Forget all allocator state (region closed). */
void cl_alloc_reset(void);

/* ---- fault handler (fault.c) --------------------------------------------- */

/* Wake fd the handler writes a page index to (-1: no pager). */
extern _Atomic int cl_fault_wake_fd;
/* Words on the pager's pipe: a page index; with CL_REQ_MARKER, set by the
 * handler when the page was HELD (read-ahead marker); or a run of pages from
 * clamor_prefetch(): CL_REQ_RANGE | count << 40 | first. */
#define CL_REQ_MARKER (1ull << 63)
#define CL_REQ_RANGE (1ull << 62)
#define CL_REQ_INDEX ((1ull << 40) - 1)
#define CL_REQ_MAXRUN 0x3fffffull

/* ---- page versions (version.c, driver) ------------------------------------ */

/* Called by the fault handler for a write to a write-protected driver page:
 * log its content for the current stage and open it.  Async-signal-safe.
 * 0, EACCES (copy-on-write is off: not clamor's fault) or ENOMEM. */
int cl_version_on_write(uintptr_t addr);
/* Copy page p as a task of `stage` must see it (0: current).  ESTALE if
 * that version was collected.  Page-server thread. */
int cl_version_read(uint64_t p, uint32_t stage, void *dst);
void cl_version_stats(uint64_t *n, uint64_t *bytes);
int cl_version_open(uintptr_t a, size_t len);
/* The allocator punched pages [first, first+n) out of the memfd (they read
 * zero now, with no write fault): list them as changed at the next stage. */
void cl_version_discarded(uint64_t first, uint64_t n);
void cl_version_reset(void);

/* Stage of the task running in this worker (sent with every page request),
 * the highest stage it has run, and a counter bumped after every change of
 * stage.  A worker re-running a task of an older stage (lineage recovery)
 * is "rewound": it may hold old versions, so its page server refuses
 * requests of newer stages (server.c). */
extern _Atomic uint32_t cl_worker_stage, cl_worker_stage_top;
extern _Atomic uint64_t cl_worker_view;
/* Worker: odd while held pages are being dropped (their memory punched),
 * bumped at the start and at the end of each drop (pagetable.c); a page
 * server copying a page checks it was even and did not move during the
 * copy. */
extern _Atomic uint64_t cl_pt_drops;
/* Page word bit: invalidated while its fetch was in flight; the reply is
 * stale and must not be installed. */
#define CL_PG_STALE 0x200u
/* Page word bit (WANTED pages with waiters): the reply is here and the
 * pager is writing and opening the page; waiters spin instead of sleeping,
 * so that their wake-up overlaps that work (fault.c, pager.c). */
#define CL_PG_ARRIVING 0x400u

/* ---- page directory (directory.c, driver) --------------------------------- */

int cl_dir_register(const void *id, size_t idlen, const char *endpoint, size_t eplen);
int cl_dir_peer_of(const void *id, size_t idlen);
int cl_dir_choose(uint64_t first, uint32_t count, uint32_t stage, int self, const char **endpoint);
void cl_dir_served(uint64_t first, uint32_t count, uint32_t stage, int peer);
void cl_dir_miss(uint64_t first, uint32_t count, int peer);
size_t cl_dir_hints(int self, uint32_t stage, uint8_t *out, size_t cap);
void cl_dir_changed(uint64_t p, uint32_t stage);
void cl_dir_reset(void);
void cl_dir_forget_all(void);
/* Copy-on-write versions are on (a stage has begun): only then do pages
 * change at known points, so only then may peers serve them. */
bool cl_version_active(void);
bool cl_version_open_now(uint64_t p);
/* The driver is about to write page p: forget its holders.  Async-signal-safe. */
void cl_dir_page_written(uint64_t p);

/* ---- pager and server ---------------------------------------------------- */

int cl_pager_stop_after_fork(void);

/* ---- the pager's peers and hints (peers.c; pager thread only) ------------ */

#define CL_PEERS_MAX 64
struct cl_zmq_pollitem;
void *cl_peer_sock(int k);
void *cl_peer_connect(void *ctx, int k, const char *endpoint);
int cl_peer_pollitems(struct cl_zmq_pollitem *it); /* room for CL_PEERS_MAX */
void cl_peer_close_all(bool abandon);
void cl_peer_silent(int k);
bool cl_peer_is(int k, const char *endpoint);
void cl_hints_take(void *sock, uint32_t stage);
int cl_hints_peer(uint64_t first, uint32_t count, uint32_t stage);

int cl_server_stop_after_fork(void);
/* Ask the pager to fetch [first, first+count) pages (already WANTED). */
int cl_pager_enqueue(uint64_t idx);
size_t cl_region_readable(const void *p, size_t n);
void cl_heap_reset_after_fork(void);

/* ---- statistics (stats.c) ------------------------------------------------ */

/* The counters of struct clamor_stats (CLAMOR_STATS in clamor.h), as relaxed
 * atomics; the VALUE fields are worked out by clamor_stats_get(). */
#define CL_STATS_ATOMIC_(name) _Atomic uint64_t name;
#define CL_STATS_NONE(type, name)
struct cl_counters {
    CLAMOR_STATS(CL_STATS_ATOMIC_, CL_STATS_NONE)
};
#undef CL_STATS_ATOMIC_
extern struct cl_counters cl_stats;
#define CL_COUNT(field, n) atomic_fetch_add_explicit(&cl_stats.field, (n), memory_order_relaxed)
void cl_stats_latency(uint64_t ns);

/* Monotonic clock in nanoseconds. */
uint64_t cl_now_ns(void);

/* pyheap.c (Python extension only): numpy's C API is loaded; 0 or -1. */
int cl_py_numpy_ready(void);

#endif /* CLAMOR_INTERNAL_H */
