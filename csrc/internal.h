/* internal.h -- the internals of clamor's C core, shared between its files.
 *
 * Not installed, not part of the API (that is clamor.h; what only the
 * Python binding calls is binding.h, included here).  Each function is
 * declared under the file that defines it, with the state it shares; the
 * page protocol has its own header (wire.h), and so does the run-time
 * binding of libzmq (zmqdl.h).  Prefixes: cl_<file>_ for what one file
 * exports to the others, clamor_py_ for the hooks only the Python extension
 * has (pyheap.c, pyshare.c: cffi declares them in clamor/_cdefs.h).
 *
 * Size: one section per file of the core, each a few declarations with
 * their contracts, so the header grows with the number of files rather than
 * with any one of them; a file's exports are found under its name, and
 * every file includes this one header.
 */
#ifndef CLAMOR_INTERNAL_H
#define CLAMOR_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#include "binding.h"

#define CL_OS_PAGE ((size_t)4096)

/* ---- error.c: the failure detail ---------------------------------------- */

/* Record a one-line detail for the calling thread and return `err`, so that
 * `return cl_err(EINVAL, "...", ...)` reads naturally. */
int cl_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- futex.c ------------------------------------------------------------ */

/* Wait while *w == val (timeout_ms < 0: forever), wake every waiter.
 * Async-signal-safe. */
int cl_futex_wait(_Atomic uint32_t *w, uint32_t val, int timeout_ms);
void cl_futex_wake(_Atomic uint32_t *w);

/* ---- options.c: the tunables, the worker's version, the clock ---------- */

/* The settings other files read, in one table (options.c): each with its
 * default and the environment variable that may set it.  The public
 * setters and getters of clamor.h (clamor_set_readahead, ...) are there. */
enum cl_option {
    CL_OPT_READAHEAD,        /* bytes of read-ahead on sequential faults, 0: off */
    CL_OPT_FETCH_TIMEOUT_MS, /* a fetch not answered in this time fails (CLAMOR_FETCH_TIMEOUT_MS) */
    CL_OPT_MAX_MAPPINGS,     /* as set; clamor_max_mappings() gives the default for 0 */
    CL_OPT_DIFF_KEEP,        /* bytes of kept copies for diffs (CLAMOR_DIFF_KEEP) */
    CL_OPT_SERVE_RATE,       /* bytes per second the page server sends, 0: no limit (CLAMOR_SERVE_RATE) */
    CL_OPT_RELOC,            /* worker: ask for relocations with every page */
    CL_OPT_PARK,             /* worker: keep the page tables of dropped mapped pages (park.c; CLAMOR_PARK) */
    CL_OPT_LOG_AHEAD,        /* driver: log pages rewritten at every version at the version's start (CLAMOR_LOG_AHEAD) */
    CL_OPT_COUNT
};
/* A relaxed atomic load: async-signal-safe. */
uint64_t cl_option_get(enum cl_option o);
void cl_option_set(enum cl_option o, uint64_t v);
/* Take the option's environment variable now, if it is set and valid (the
 * moment docs/configuration.md names for it).  Not async-signal-safe. */
void cl_option_env(enum cl_option o);

/* The version the task running in this worker reads (sent with every page
 * request), the highest version it has run at, and a counter bumped after
 * every change of version (clamor_set_version).  A worker re-running a task
 * of an older version (lineage recovery) is "rewound": it may hold old
 * pages, so its page server refuses requests of newer versions (server.c). */
extern _Atomic uint32_t cl_worker_version, cl_worker_version_top;
extern _Atomic uint64_t cl_worker_view;

/* Monotonic clock in nanoseconds (clock_gettime(2)): async-signal-safe. */
uint64_t cl_now_ns(void);

/* ---- thread.c: the service threads' start and stop ------------------------ */

/* A service thread (the pager, the page server) with its libzmq context,
 * its socket and the pipe that wakes it.  Initialise with CL_THREAD_INIT. */
struct cl_thread {
    pthread_t th;
    bool running;
    void *ctx, *sock;
    int pipe_r, pipe_w;
    _Atomic int stop;
};
#define CL_THREAD_INIT {.pipe_r = -1, .pipe_w = -1}
/* The word cl_thread_join() writes to the pipe. */
#define CL_THREAD_STOP UINT64_MAX
/* Make the pipe (non-blocking), the context and a socket of `socktype`
 * (CL_ZMQ_*); on failure nothing is left open. */
int cl_thread_open(struct cl_thread *t, int socktype);
/* Run fn(NULL) on t, every signal blocked, named `name` (15 chars). */
int cl_thread_start(struct cl_thread *t, void *(*fn)(void *), const char *name);
/* Set the stop flag, wake the thread through its pipe and join it. */
void cl_thread_join(struct cl_thread *t);
/* Close the socket, the context and the pipe (the thread is not running;
 * other sockets of the context closed first).  Idempotent. */
void cl_thread_close(struct cl_thread *t);
/* In a forked child: forget the parent's context and socket, close the pipe. */
void cl_thread_abandon(struct cl_thread *t);

/* ---- region.c: the mapping ---------------------------------------------- */

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
    /* Same-host mapping (samehost.c).  The driver's memfd holds every
     * location a page's bytes may be at (homes, twins, a pool: nlocs pages),
     * then the location table. */
    uint64_t nlocs;
    struct cl_maphdr *maphdr;   /* header of the location table (driver: RW, worker: RO) */
    _Atomic uint64_t *loctab;   /* per page: its current location (cl_loc_*) */
    _Atomic uint64_t *locprev;  /* per page: the entry loctab held before, for readers of older versions */
    _Atomic uint8_t *locflags;  /* per page: CL_LOC_USED, CL_LOC_RELOC */
    bool map_share;             /* driver: forked children map its pages */
    _Atomic bool map_on;        /* worker: maps the driver's pages (srcfd) */
    int srcfd;                  /* worker: the driver's memfd, or -1 */
    _Atomic uint32_t *wloc;     /* worker: per page, location id + 1 it maps, 0: own memfd */
    /* worker: per page, the sum of its bytes as fetched and relocated
     * (cl_page_sum), 0: unknown.  A page whose bytes sum otherwise now was
     * written here (an attribute a task set, a reference count still
     * held): it is not served to a peer, which would read this worker's
     * pointers. */
    _Atomic uint64_t *sums;
    /* worker: per page absent from the public view, the version its
     * bytes, kept in the memfd, are (0: none kept).  A page the
     * driver changed keeps its old copy there, so that its next fetch may
     * come as the words that changed (a diff, wire.h). */
    _Atomic uint32_t *kept;
};
extern struct cl_region cl_region;

static inline bool cl_in_region(uintptr_t a) {
    return cl_region.role != CLAMOR_ROLE_NONE && a - cl_region.base < cl_region.size;
}
/* Does [a, a+n) lie inside the region (n 0 read as 1)?  region.contains in
 * Python; unlike cl_in_region, whatever the role (the py*.c walks). */
static inline bool cl_in_region_span(uintptr_t a, size_t n) {
    if (!n) n = 1;
    return a >= cl_region.base && a - cl_region.base <= cl_region.size && n <= cl_region.size - (a - cl_region.base);
}
static inline uint64_t cl_page_of(uintptr_t a) {
    return (uint64_t)(a - cl_region.base) >> cl_region.page_shift;
}
/* Where v is among a[0..n), sorted ascending, or -1. */
static inline ssize_t cl_sorted_find(const uint64_t *a, size_t n, uint64_t v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && a[lo] == v ? (ssize_t)lo : -1;
}
/* Is v among a[0..n), sorted ascending? */
static inline bool cl_sorted_has(const uint64_t *a, size_t n, uint64_t v) { return cl_sorted_find(a, n, v) >= 0; }
/* Make *buf (a thread's own buffer, *cap bytes) at least n bytes; false
 * if out of memory (the buffer is kept as it was). */
static inline bool cl_grow(void **buf, size_t *cap, size_t n) {
    if (*cap >= n) return true;
    void *p = realloc(*buf, n);
    if (!p) return false;
    *buf = p;
    *cap = n;
    return true;
}
/* Does w lie in one of the nr sorted, disjoint ranges [r[2i], r[2i+1])? */
static inline bool cl_in_ranges(uintptr_t w, const uintptr_t *r, size_t nr) {
    size_t lo = 0, hi = nr;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w < r[2 * mid]) hi = mid;
        else if (w >= r[2 * mid + 1]) lo = mid + 1;
        else return true;
    }
    return false;
}
static inline char *cl_page_addr(uint64_t idx) {
    return (char *)(cl_region.base + ((uintptr_t)idx << cl_region.page_shift));
}

/* ---- samehost.c: the location table ------------------------------------ */

/* A page's bytes are at one of three locations of the driver's memfd: its
 * home (id p, where the region's view starts), its twin (id npages + p), or
 * a pool slot (id 2 * npages + k).  The table has one word per page: the
 * version from which its current location holds what tasks read ("since",
 * high 32 bits) and the location's id XOR p (low 32 bits), so that a
 * zero-filled table reads "at home since version 0". */
#define CL_MAP_MAGIC 0x70616d726f6d616cull /* "lamormap" */
struct cl_maphdr {
    uint64_t magic;
    uint8_t cookie[16];
    uint64_t npages, nlocs, size, base;
    uint32_t page_shift, pad;
};
#define CL_LOC_USED 1u  /* the allocator handed out part of the page */
#define CL_LOC_RELOC 2u /* the page has had a relocation list */
static inline uint64_t cl_loc_make(uint64_t p, uint32_t since, uint32_t id) {
    return (uint64_t)since << 32 | (uint32_t)(id ^ (uint32_t)p);
}
static inline uint32_t cl_loc_id(uint64_t p, uint64_t e) { return (uint32_t)e ^ (uint32_t)p; }
static inline uint32_t cl_loc_since(uint64_t e) { return (uint32_t)(e >> 32); }
/* Bytes of the driver's memfd: locations, then the table. */
uint64_t cl_map_file_size(void);
/* Driver: make the table (memfd sized, header written); a worker's forked
 * child: switch to mapping (keep the driver's fd).  0 or errno + cl_err. */
int cl_map_driver_init(int fd);
int cl_map_child_init(int driver_fd);
void cl_map_close(void);
/* The allocator handed out [off, off+len) of the region. */
void cl_map_mark_used(uint64_t off, uint64_t len);
void cl_map_mark_reloc(uint64_t page);

/* ---- pagetable.c: page states, install, drop ---------------------------- */

/* One 32-bit word per page of a worker's region.  The low byte is the state,
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

/* Page word bit: invalidated while its fetch was in flight; the reply is
 * stale and must not be installed. */
#define CL_PG_STALE 0x200u
/* Page word bit (WANTED pages with waiters): the reply is here and the
 * pager is writing and opening the page; waiters spin instead of sleeping,
 * so that their wake-up overlaps that work (fault.c, pager.c). */
#define CL_PG_ARRIVING 0x400u

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
/* Map page idx (and its mappable neighbours) from the driver's memfd.
 * `claimed`: the caller set it WANTED (the pager, a prefetch), else it must
 * be ABSENT.  `from_handler`: never wait for the page table's lock (EBUSY),
 * never evict (EAGAIN).  0: mapped, or no longer the caller's to map;
 * EAGAIN: fetch it instead (an older version, a page to relocate, never
 * allocated, mapping off). */
int cl_map_run(uint64_t idx, bool claimed, bool from_handler);
/* Pages mapped at one fault at most: an aligned window. */
uint64_t cl_map_window(void);
/* Kept copies (diffs).  cl_pt_diffs_on(): this worker keeps copies and asks
 * for diffs (a budget set, fetching rather than mapping).
 * cl_pt_kept(i): the version of page i's kept copy, 0 if none.
 * cl_pt_unkeep(): forget the kept copies of [first, first+count), punching
 * their memory out if `punch` (else a fetch about to overwrite it).
 * cl_pt_kept_pages(): how many are kept now.  Atomics, no lock: only the
 * pager reads and forgets a copy while its page is in flight, and a fetch
 * checks what it rebuilt against the server's sums. */
bool cl_pt_diffs_on(void);
uint32_t cl_pt_kept(uint64_t i);
void cl_pt_unkeep(uint64_t first, uint64_t count, bool punch);
uint64_t cl_pt_kept_pages(void);
/* Pager: map the windows [first, first + count * window) where they are
 * absent and mappable, and fill their page-table entries
 * (MADV_POPULATE_READ), so that a scan reading them takes no fault. */
void cl_map_populate(uint64_t first, uint64_t count);

/* Worker: odd while held pages are being dropped (their memory punched),
 * bumped at the start and at the end of each drop (pagetable.c); a page
 * server copying a page checks it was even and did not move during the
 * copy. */
extern _Atomic uint64_t cl_pt_drops;

/* ---- pagesum.c: the sum of a page's bytes -------------------------------- */

/* A sum of a page's bytes as a worker installed them (never 0). */
uint64_t cl_page_sum(const void *p, size_t len);
/* out = a XOR b (len bytes); returns cl_page_sum(a, len), in one pass. */
uint64_t cl_page_xor_sum(const void *a, const void *b, void *out, size_t len);

/* ---- fault.c: the SIGSEGV handler --------------------------------------- */

/* Wake fd the handler writes a page index to (-1: no pager). */
extern _Atomic int cl_fault_wake_fd;
/* Report a failed access to region address `addr` (errno `err`) on stderr
 * and abort.  Async-signal-safe; never returns. */
void cl_fault_fatal(uintptr_t addr, int err) __attribute__((noreturn));

/* ---- pager.c: fetch and install (workers) ------------------------------- */

/* Words on the pager's pipe: a page index; with CL_REQ_MARKER, set by the
 * handler when the page was HELD (read-ahead marker); or a run of pages from
 * clamor_prefetch(): CL_REQ_RANGE | count << 40 | first. */
#define CL_REQ_MARKER (1ull << 63)
#define CL_REQ_RANGE (1ull << 62)
/* Both bits: map and populate `count` windows of the driver's pages from
 * `first` on (a scan streams through them; same host). */
#define CL_REQ_POPULATE (CL_REQ_MARKER | CL_REQ_RANGE)
#define CL_REQ_INDEX ((1ull << 40) - 1)
#define CL_REQ_MAXRUN 0x3fffffull

int cl_pager_stop_after_fork(void);
/* Queue the run [first, first+count) as read-ahead (readahead.c), page
 * `marker` (or -1) left HELD on arrival.  Pager thread only. */

/* ---- pagein.c: a reply's pages into the memfd (pager thread only) ------- */

/* Allocate the memfd pages of [first, first+count) ahead of their reply. */
void cl_pagein_prepare(uint64_t first, uint32_t count);
/* Take the page bytes of a reply (the next frame on sock: exactly len
 * bytes, sparse, or a diff of the kept copies), relocate them by the
 * frame after it (`relocs`) and write them into the memfd at the pages'
 * offset.  0, ENOMEM, EBADMSG (no such frame, the wrong size, a malformed
 * sparse frame or diff), EILSEQ (a page rebuilt from a diff does not sum
 * as the driver's), cl_reloc_apply's error, or pwrite's errno. */
int cl_pagein_write(void *sock, uint64_t first, uint32_t count, size_t len, bool relocs, bool sparse, bool diff);
/* The bytes of [first, first+count) are here: wake their waiters now;
 * they spin until the pages open (fault.c). */
void cl_pagein_announce(uint64_t first, uint32_t count);
/* Free the buffer sparse replies and diffs are expanded in. */
void cl_pagein_free(void);

/* ---- readahead.c: streams and their windows (pager thread only) --------- */

/* Where the pages claimed for a stream go: `count` pages from `first`,
 * page `marker` (or -1) to be left HELD on arrival (pager.c's queue). */
typedef void (*cl_readahead_queue)(uint64_t first, uint32_t count, int64_t marker);
/* Forget the stream: a pager starts. */
void cl_readahead_reset(void);
/* A demand fault on page idx, queued: start or follow a stream. */
void cl_readahead_demand(uint64_t idx, cl_readahead_queue queue);
/* The marker page idx was touched, and is open: read further. */
void cl_readahead_marker(uint64_t idx, cl_readahead_queue queue);
/* A run whose marker someone already waits on arrived, up to page end:
 * read further. */
void cl_readahead_marker_waited(uint64_t end, cl_readahead_queue queue);

/* ---- prefetch.c --------------------------------------------------------- */

/* Post page idx (already WANTED) to the pager: 0, ENOTCONN (no pager) or
 * write(2)'s errno. */
int cl_prefetch_enqueue(uint64_t idx);
/* Worker: how many of the n bytes at p can be read (they lie before the
 * first page the driver never allocated), fetching them. */
size_t cl_prefetch_readable(const void *p, size_t n);

/* ---- peers.c: the pager's peers and hints (pager thread only) ----------- */

#define CL_PEERS_MAX 64
struct cl_zmq_pollitem;
void *cl_peer_sock(int k);
void *cl_peer_connect(void *ctx, int k, const char *endpoint);
int cl_peer_pollitems(struct cl_zmq_pollitem *it); /* room for CL_PEERS_MAX */
void cl_peer_close_all(bool abandon);
void cl_peer_silent(int k);
bool cl_peer_is(int k, const char *endpoint);
void cl_hints_take(void *sock, uint32_t version);
int cl_hints_peer(uint64_t first, uint32_t count, uint32_t version);

/* ---- security.c: authentication of every socket the core opens ----------- */

/* Apply the process's security to socket `s` of `type` (ROUTER: server,
 * DEALER: client); 0 or EPROTO + cl_err. */
int cl_security_apply(void *s, int type);
/* Open a socket with linger 0 and the given type, with the process's
 * security applied; NULL + cl_err on failure. */
void *cl_security_socket(void *ctx, int type);
/* Server: a ZAP handler socket bound in `ctx` (NULL when security is off,
 * or + cl_err on failure); cl_zap_serve() answers what waits on it. */
void *cl_zap_open(void *ctx);
void cl_zap_serve(void *zap);

/* ---- server.c: the page server ------------------------------------------ */

int cl_server_stop_after_fork(void);

/* ---- directory.c: who holds which page (driver) ------------------------- */

int cl_dir_register(const void *id, size_t idlen, const char *endpoint, size_t eplen);
int cl_dir_peer_of(const void *id, size_t idlen);
int cl_dir_choose(uint64_t first, uint32_t count, uint32_t version, int self, const char **endpoint);
void cl_dir_served(uint64_t first, uint32_t count, uint32_t version, int peer);
void cl_dir_miss(uint64_t first, uint32_t count, int peer);
size_t cl_dir_hints(int self, uint32_t version, uint8_t *out, size_t cap);
void cl_dir_changed(uint64_t p, uint32_t version);
void cl_dir_reset(void);
void cl_dir_forget_all(void);
/* The driver is about to write page p: forget its holders.  Async-signal-safe. */
void cl_dir_page_written(uint64_t p);

/* ---- version.c: page versions (driver) ---------------------------------- */

/* Called by the fault handler for a write to a write-protected driver page:
 * log its content for the current version and open it.  Async-signal-safe.
 * 0, EACCES (copy-on-write is off: not clamor's fault) or ENOMEM. */
int cl_version_on_write(uintptr_t addr);
/* Copy page p as a task of `version` must see it (0: current).  ESTALE if
 * that version was collected.  Page-server thread. */
int cl_version_read(uint64_t p, uint32_t version, void *dst);
void cl_version_stats(uint64_t *n, uint64_t *bytes);
int cl_version_open(uintptr_t a, size_t len);
/* The allocator punched pages [first, first+n) out of the memfd (they read
 * zero now, with no write fault): list them as changed at the next version. */
void cl_version_discarded(uint64_t first, uint64_t n);
/* The allocator frees [off, off+len) of the region: punch the bytes out of
 * the location each page is at now.  0 or errno. */
int cl_version_punch(uint64_t off, uint64_t len);
void cl_version_reset(void);
/* Bumped by cl_version_reset: version numbers may be used again after it. */
uint64_t cl_version_generation(void);

/* Copy-on-write versions are on (a version has begun): only then do pages
 * change at known points, so only then may peers serve them. */
bool cl_version_active(void);
bool cl_version_open_now(uint64_t p);
bool cl_version_written_now(uint64_t p);

/* ---- park.c: a mapping worker keeps the page tables of dropped pages (pt_lock held) ---- */
void cl_park_init(void);
void cl_park_close(void);
void cl_park_put(uint64_t first, uint64_t n, uint32_t loc0);
int cl_park_map(uint64_t first, uint64_t n, uint32_t loc0, int prot);
bool cl_park_kept(uint64_t p);

/* Inside heap() on a driver whose region is protected by mprotect: open
 * the pages of [a, a+len) for writing now, as a first write would, unless
 * they are open already (the allocator hands the block out: a system call
 * may write into it).  Errors are left to the write itself. */
void cl_version_prepare(uintptr_t a, size_t len);

/* ---- wprot.c: how the driver's region is write-protected ----------------- */

/* The first version: choose the mechanism (CLAMOR_WRITE_PROTECT) and protect
 * every page handed out so far.  Under version.c's lock.  0 or errno. */
int cl_wprot_start(void);
/* CLAMOR_WPROT_*; async-signal-safe. */
int cl_wprot_mode(void);
/* The protection version.c maps a view it opens with (userfaultfd: the
 * new mapping is not registered, so it is open as it is mapped). */
int cl_wprot_view_prot(void);
/* Protect region pages [first, first+n) / open them for writing.  0 or
 * errno; cl_wprot_open is async-signal-safe. */
int cl_wprot_close(uint64_t first, uint64_t n);
int cl_wprot_open(uint64_t first, uint64_t n);
/* The allocator hands out [off, off+len) of the region (driver): pages
 * handed out for the first time are protected, if userfaultfd protects. */
void cl_wprot_used(uint64_t off, uint64_t len);
/* Region closed: stop the thread, forget everything.  A forked child:
 * forget it without the thread, which did not survive fork. */
void cl_wprot_stop(void);
void cl_wprot_after_fork(void);

/* ---- alloc.c: the region allocator -------------------------------------- */

/* 1 if any byte of [off, off+len) of the region belongs to memory the
 * allocator has handed out (now or since its last reuse), else 0.  Lock-free;
 * the page server calls it to refuse pages nobody allocated. */
int cl_alloc_range_used(uint64_t off, uint64_t len);
/* Forget all allocator state (region closed). */
void cl_alloc_reset(void);

/* ---- interpose.c: malloc interposition ---------------------------------- */

/* Depth of the calling thread's heap blocks (0: outside every block). */
extern __thread int cl_heap_depth __attribute__((tls_model("initial-exec")));
/* The block a thread started inside one adopted (0: none), and whether it
 * is still open. */
extern __thread uint64_t cl_heap_adopted __attribute__((tls_model("initial-exec")));
int cl_adopted_open(void);
/* Does the calling thread's allocation go to the region? */
#define CL_IN_HEAP() (cl_heap_depth || (cl_heap_adopted && cl_adopted_open()))
/* In a forked child: no thread is inside a block any more. */
void cl_heap_reset_after_fork(void);

/* ---- pyversion.c: the CPython versions the py*.c files know ------------ */

/* Bit m set: the py*.c files were checked against the object layouts of
 * CPython 3.m (the GIL build).  Adding a version means reading every
 * PY_VERSION_HEX test and layout the py*.c files use against its headers,
 * and running the suite on it. */
#define CL_PY_KNOWN_MINORS ((1ul << 11) | (1ul << 12) | (1ul << 13))
#ifdef PY_VERSION_HEX /* a file that reads CPython's objects: refuse what it does not know */
#if PY_MAJOR_VERSION != 3 || PY_MINOR_VERSION > 63 || !((CL_PY_KNOWN_MINORS >> PY_MINOR_VERSION) & 1)
#error "clamor: this CPython's object layouts are not known to csrc/py*.c (see CL_PY_KNOWN_MINORS in internal.h)"
#endif
#ifdef Py_GIL_DISABLED
#error "clamor: the free-threaded build of CPython has other object layouts; csrc/py*.c know the GIL build only"
#endif
#endif
/* PY_VERSION_HEX of the headers the module was built with, and
 * CL_PY_KNOWN_MINORS: for clamor/_native.py's check at import. */
unsigned long clamor_py_built_for(void);
unsigned long clamor_py_known_minors(void);

/* ---- pyheap.c: Python's allocators (the Python extension only) ---------- */

/* Wrap the three PyMem domains (once; needs the GIL), and set/restore
 * numpy's NEP 49 data handler for a block (0 or -1 with a Python exception
 * set). */
int clamor_py_heap_install(void);
int clamor_py_numpy_enter(void);
int clamor_py_numpy_exit(void);
/* numpy's default data handler until the matching clamor_py_numpy_exit()
 * (heap suspension). */
int clamor_py_numpy_suspend(void);
/* Hand numpy's cache of shape buffers to the side of the heap block the
 * calling thread is on (inside 1, outside 0); needs the allocators of that
 * side to be in place.  0 or -1 (the error is printed). */
int clamor_py_numpy_dims_flush(int inside);
/* How many times region memory was freed outside a heap block on the
 * driver (region objects dying in ordinary code). */
unsigned long clamor_py_region_dropped(void);
/* The capsule of clamor's numpy data handler, made on the first call (0 if
 * it could not be). */
uintptr_t clamor_py_numpy_handler(void);
/* numpy's C API is loaded: 0, or -1. */
int cl_py_numpy_ready(void);

/* ---- pyrehome.c: tables that grew across the region's edge -------------- */

/* Give the dicts and lists in `objs` (a list, such as gc.get_objects())
 * that lie outside the region but grew a table in it a table outside;
 * outside every block.  How many moved, or -1. */
long clamor_py_rehome(uintptr_t objs);
long clamor_py_rehome_tracked(const uint64_t *heads, size_t n);
int clamor_py_gc_heads(uint64_t *heads);
long clamor_py_gc_count(const uint64_t *heads, size_t n, const uint64_t *sorted, size_t nsorted);
/* Inside a block: the table of the region object at obj made again in the
 * region (1), none to move (0), or -1; a region copy of the weak reference
 * at ref appended to the list at out (0, or -1). */
long clamor_py_table_in(uintptr_t obj);
long clamor_py_weakref_copy(uintptr_t ref, uintptr_t out);

/* ---- pyhide.c: the words of region objects a version hides -------------- */

/* The HIDE_* bits of the words of the region object at obj a version would
 * hide now; clamor_version_begin() with those words of objs[0..n) shown
 * zero (state[i]: 1 if kept, 0 if the caller forgets it). */
int clamor_py_hides(uintptr_t obj);
int clamor_py_version_begin_hiding(uint32_t version, const uint64_t *objs, const uint64_t *types, int8_t *state,
                                 size_t n);

/* ---- pyheld.c: region objects this process's own objects hold ----------- */

/* Driver, before a fork: the region objects held from outside the region
 * (objs: gc.get_objects()) appended to the list at out; how many, or -1.
 * Worker, before pages change: region objects, and this process's objects
 * holding one on a page being dropped (kept), out of the collector's lists;
 * how many, or -1. */
long clamor_py_held_from_outside(uintptr_t objs, uintptr_t out);
long clamor_py_untrack_region(uintptr_t objs, const uint64_t *pages, size_t npages, uint64_t first, uint64_t count,
                              long *kept);

/* ---- pyfreelist.c: CPython's free lists (the Python extension only) ----- */

/* Empty CPython's free lists of region objects, outside every heap block:
 * how many region objects were on them, or -1 (the error is printed). */
long clamor_py_freelists_flush(void);
long clamor_py_freelists_drain(uintptr_t out);
int clamor_py_freelists_release(uintptr_t list);
int cl_py_freelists_fill(void);
int cl_py_freelists_out(void);

/* ---- pydeadfree.c: region objects that die on a worker (the Python extension only) ---- */

/* Wrap the deallocs of dict, list, tuple, float and slice in a worker so
 * that a region object that dies there stays off CPython's free lists.
 * 0, or -1 (the Python error is set).  And how many were kept off. */
int clamor_py_worker_deallocs(void);
long clamor_py_worker_kept(void);
/* After a task: region key tables a worker's growing region dicts dropped,
 * taken off the free list (how many). */
long clamor_py_worker_sweep(void);
/* pyufunc.c: numpy's per-ufunc dispatch caches out of the region before a fork. */
long clamor_py_ufunc_caches_out(uintptr_t ufuncs, int layout, long *unread);
/* pyreloc.c: the hull of an ELF object's PT_LOAD segments (.bss included). */
struct dl_phdr_info;
void cl_py_image_hull(const struct dl_phdr_info *info, uintptr_t *lo, uintptr_t *hi);
/* pyextfree.c: extension modules' free lists of dead region objects, before a fork. */
long clamor_py_ext_freelists_flush(const uint64_t *types, size_t ntypes, long *failed);

/* ---- pyfinger.c: what a forked worker reads of an inherited object ----- */

/* Fingerprints of the n live objects at objs[i] into out[i] (0: identity
 * only, for types, functions, code, modules); returns n.  Takes the GIL. */
long clamor_py_fingerprints(const uint64_t *objs, uint64_t *out, size_t n);
/* The addresses of the objects of the list at `list` and of what each refers
 * to (its referents, as gc.get_referents() gives them, and a few levels of
 * what those hold untracked) into out[cap], each once; returns how many, or
 * minus how many out would need, or LONG_MIN if out of memory. */
long clamor_py_snapshot(uintptr_t list, uint64_t *out, size_t cap);
/* ids: sorted addresses of a snapshot, fps their fingerprints.  has: was
 * there an object at addr?  inherited: 1 if the live object obj reads as
 * the snapshot's at its address, 0 if none was there, -1 if it differs. */
int clamor_py_snapshot_has(uint64_t addr, const uint64_t *ids, size_t n);
int clamor_py_inherited(uintptr_t obj, const uint64_t *ids, const uint64_t *fps, size_t n);

/* ---- pygate.c: other Python threads keep out of heap() blocks ---------- */

/* A heap() block opens (waits until no clamor thread runs Python code) and
 * closes; nested blocks count each. */
void clamor_py_gate_close(void);
void clamor_py_gate_open(void);
int clamor_py_gate_blocks(void);
/* A clamor thread: zmq_poll() the n sockets (pyzmq's `underlying` handles)
 * for input, or with n == 0 sleep timeout_ms, then wait until no block is
 * open and count the thread busy.  Returns zmq_poll's result (-errno on
 * error; revents[i] set; 0 after a sleep), or -ECANCELED, not busy, when
 * *abort_ was set during the wait.  Busy ends with
 * clamor_py_gate_release(); clamor_py_gate_wake() wakes waiters to read
 * their abort flags. */
#define CLAMOR_GATE_MAX_SOCKETS 16
int clamor_py_gate_poll(const uintptr_t *sockets, int n, long timeout_ms, short *revents, const int *abort_);
void clamor_py_gate_release(void);
void clamor_py_gate_wake(void);
/* Residents: threads that run Python whenever they like.  Enlist counts one
 * in (running), discharge out.  On the resident, park waits until the gate
 * opens once after the knock that read generation `knocked` (or *abort_ is
 * set), counted out meanwhile; a knock of a block that ended is no park.  The block's thread,
 * after clamor_py_gate_close() and its knocks, settles: waits until no more
 * than `mine` residents run (1 if it is one itself); 0, or ETIMEDOUT after
 * timeout_ms.  The generation counts the times the gate opened. */
void clamor_py_gate_enlist(void);
void clamor_py_gate_discharge(void);
void clamor_py_gate_park(const int *abort_, unsigned long knocked);
unsigned long clamor_py_gate_generation(void);
int clamor_py_gate_settle(int mine, long timeout_ms);
/* pyknock.c: have the thread `thread_id` (threading.get_ident()), which
 * runs plain Python, park (with `abort_`) at its next call or return, by a
 * one-shot profile function; its own profile function is put back first.
 * 0, -ESRCH (no such thread, or the caller), -ENOMEM or -EPERM. */
int clamor_py_knock(unsigned long thread_id, const int *abort_, unsigned long knocked);

/* ---- pyshare.c: what share() cannot see (the Python extension only) ----- */

/* The pointer fields of the object at `obj` that hold no Python reference,
 * as (CLAMOR_FIELD_*, address) pairs in out[2 * max]; returns how many (0
 * for other types), -1 on error.  The caller keeps the object alive. */
enum clamor_field {
    CLAMOR_FIELD_DATA = 1, CLAMOR_FIELD_DIMS, CLAMOR_FIELD_STRIDES, CLAMOR_FIELD_ITEMS, CLAMOR_FIELD_KEYS,
    CLAMOR_FIELD_VALUES, CLAMOR_FIELD_TABLE, CLAMOR_FIELD_BUFFER, CLAMOR_FIELD_UTF8, CLAMOR_FIELD_WSTR,
    CLAMOR_FIELD_SUBARRAY, CLAMOR_FIELD_CMETA
};
int clamor_py_fields(uintptr_t obj, uintptr_t *out, int max);
/* Instance obj of a class statement's type whose attributes the collector
 * visits in a values table (no dict made; since 3.13, inline values still
 * valid, a dict made over them or not): a (name, value) pair for each
 * attribute set appended to the list out, named by its class's keys table.
 * The pairs appended, or -1 (its dict is visited, or no such table), or -2
 * (no memory). */
int clamor_py_instance_items(uintptr_t obj, uintptr_t out);
/* Learn how CPython frees the instances of a class statement's type (once,
 * at import): 0, or -1 (the error is printed).  Then is_class() tells a
 * type made by a class statement from one an extension made, static or
 * not; before, it takes every heap type for a class. */
int clamor_py_classes_init(void);
int clamor_py_is_class(uintptr_t type);
#ifdef PY_VERSION_HEX
bool cl_py_is_class(PyTypeObject *t);
/* A class statement's type whose instances are laid out as object's plus
 * a managed dict and weak references: no __slots__, no C base but object
 * in its MRO. */
bool cl_py_plain_class(PyTypeObject *t);
/* The dict of an instance of such a class, once made (NULL while its
 * attributes lie in a values table, or it has none). */
struct _object *cl_py_instance_dict(struct _object *o);
/* Its value slots while it has no dict (its attributes in a values table,
 * named by its class's keys table), or NULL. */
struct _object **cl_py_instance_values(struct _object *o);
/* o.__dict__ = d, through the type's setter (pyshare.c); -1 with an exception set. */
int cl_py_set_instance_dict(struct _object *o, struct _object *d);
/* The head of object o's list of weak references (pyhide.c): NULL when
 * it has none or its type has no list. */
void *cl_py_weaklist_head(struct _object *o);
/* The HIDE_* bits of region object o's words a version would hide (pyhide.c),
 * with the words' addresses. */
int cl_py_to_hide(struct _object *o, void ***weak, void ***info);   /* (struct _object: PyObject) */
#endif
/* Bytes of the object's own body (basic size and items). */
size_t clamor_py_body_size(uintptr_t obj);
/* Conservative scan of the aligned words of [lo, lo + len), driver only:
 * words into the region but outside [lo, lo + len) go to inner[] (a repeat
 * of the previous one dropped), words inside one of the npriv sorted,
 * disjoint ranges [priv[2i], priv[2i+1]) go to outer[] as (offset, word)
 * pairs.  Stops when either array is full; returns the bytes scanned (len
 * once done). */
size_t clamor_py_scan(uintptr_t lo, size_t len, const uintptr_t *priv, size_t npriv, uintptr_t *inner,
                      size_t *ninner, size_t maxinner, uintptr_t *outer, size_t *nouter, size_t maxouter);

/* ---- pywalk.c: share()'s walk of plain data and plain instances --------- */

/* 1 when every object reachable from root is plain data or an instance of
 * a plain class, in the region (or a singleton) with its tables there, and
 * each object outside the region appended to the list at outside_out
 * (atoms, classes) passes the caller's rule; 0 when the Python walk must
 * decide; 2 when an instance's dict needs keys of its own first
 * (clamor_py_own_keys); -1 out of memory.  extents_out: 0, or a bytearray
 * for the extents. */
int clamor_py_walk_plain(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                         uintptr_t extents_out, uintptr_t outside_out);
int clamor_py_walk_tagged(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                          uintptr_t extents_out, uintptr_t tags_out, uintptr_t outside_out, const int32_t *dirty,
                          size_t ndirty, int recheck, int *shared);
/* The walk for workers not forked from the driver: clamor_py_walk_plain's,
 * with the words to relocate and those read as null (portable._Mode). */
/* What clamor_py_walk_portable hands back, every array malloc'd (freed
 * with clamor_py_buffer_free): n extents (start, length pairs), their
 * strictness bytes and, tagging, their tags; nnulls null words and their
 * tags. */
struct clamor_walkout {
    uint64_t *ext;
    uint8_t *strict;
    int32_t *tags;
    size_t n;
    uint64_t *nulls;
    int32_t *null_tags;
    size_t nnulls;
    uint64_t *keyed; /* the classes whose instances were taken over their frozen tables (cl_py_portable_keys) */
    size_t nkeyed;
};
int clamor_py_walk_portable(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                            uintptr_t outside_out, int *seeded, int tagging, const int32_t *dirty, size_t ndirty,
                            int recheck, int *shared, struct clamor_walkout *out);
/* Copy n bytes at src into the bytearray at ba, resized: 0, or -1.  GIL held. */
int cl_py_to_bytearray(uintptr_t ba, const void *src, size_t n);
/* A stack of objects, each pushed with the tag `cur` of the moment (the
 * walk's: the root's entry it was reached through), grown by doubling.
 * Zeroed is empty; its owner frees item and tag. */
struct _object;
struct cl_py_stack {
    struct _object **item;
    int32_t *tag;
    int32_t cur;
    size_t n, cap;
};
/* Push o (no reference taken): 0, or -1 (no memory). */
int cl_py_stack_push(struct cl_py_stack *st, struct _object *o);
/* walk._owns_keys: d is a region dict, combined, its keys table there too. */
int cl_py_owns_keys(struct _object *d);

/* The head of a dict's keys table, CPython 3.11-3.13 (pycore_dict.h; the
 * default build): entry i lies at dk_indices + (1 << dk_log2_index_bytes)
 * + i * the entry's size (a key, a value, and a hash unless the table is
 * of str keys only).  dk_kind: 0 general, 1 str keys, 2 a class's shared
 * table (str keys). */
struct cl_dict_keys {
    ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;
    uint32_t dk_version;
    ssize_t dk_usable;
    ssize_t dk_nentries;
    char dk_indices[];
};

/* ---- pyclasskeys.c: classes' shared keys tables, frozen at a fork -------- */

/* Freeze the keys table of class `type` (dk_usable 0: CPython appends no
 * name to it again) and record it as frozen at fork number seq: 1, or 0
 * (no shared table naming anything), or -1 (no memory).  GIL held. */
int clamor_py_freeze_keys(uintptr_t type, uint64_t seq);
/* The Cluster's workers were forked after freeze number seq (0: none). */
void clamor_py_frozen_accept(uint64_t seq);
/* 1 if instance obj's class's keys table was frozen before the Cluster's
 * workers were forked and still reads as it did then (every forked worker
 * finds its names), and obj's dict is a region dict over that table with
 * its values table in the region, or obj has no dict and its values table
 * lies in the region; else 0. */
int clamor_py_frozen_instance(uintptr_t obj);
/* 1 if keys is the table of a class that clamor_py_frozen_instance accepts. */
int clamor_py_frozen_keys(uintptr_t keys);
/* 1 if instance obj's class is as clamor_py_frozen_instance wants it, and
 * obj has no dict yet or one over its class's keys table, wherever it
 * lies: a region dict over that table is then what it needs. */
int clamor_py_frozen_split(uintptr_t obj);
/* Instance obj (of a class clamor_py_frozen_instance accepts, or as
 * clamor_py_keyed_instance takes it, with no dict: its attributes in a
 * values table) holding old as an attribute's value:
 * that slot set to new, a reference moved (new == old: a look-up).  1, or
 * 0 (no slot holds old). */
int clamor_py_instance_replace(uintptr_t obj, uintptr_t old, uintptr_t new_value);
/* Workers not forked (a portable walk): 1 if region instance obj has no
 * dict and its values table lies in the region, and its class's table is
 * frozen (now, if it was not: the driver never lays an attribute out
 * otherwise again); else 0.  Before CPython 3.13 only. */
int clamor_py_portable_keys(uintptr_t obj);
/* Driver: the names of class `type`'s table frozen so, in order, appended
 * to the list at `out`: the table's address, or 0 (not frozen so). */
uintptr_t clamor_py_frozen_names(uintptr_t type, uintptr_t out);
/* Worker: how many of the tuple of strs `names` class `type`'s table names
 * at their places (all: its length), or -1 (something else, more, or no
 * shared table). */
long clamor_py_keys_prefix(uintptr_t type, uintptr_t names);
/* Worker: class `type`'s table frozen and kept for good if it names the
 * tuple of strs `names` exactly, in order: its address, or 0. */
uintptr_t clamor_py_keys_freeze_at(uintptr_t type, uintptr_t names);
/* 1 if region instance obj is as clamor_py_portable_keys took it (no freeze here). */
int clamor_py_keyed_instance(uintptr_t obj);
/* Worker: class `type` takes the keys table of class `twin`, kept for
 * good, after each instance of it that objects() (gc.get_objects) lists is
 * given its dict over the old table, and the interpreter's caches of its
 * attributes' places are dropped, in one hold of the GIL
 * (classkeys.adopt).  0, or -1. */
int clamor_py_keys_relayout(uintptr_t type, uintptr_t twin, uintptr_t objects);
#ifdef PY_VERSION_HEX
int cl_py_portable_keys(struct _object *o);
/* portable._seeded of an exact dict, set or frozenset's keys: one is a str
 * or bytes, or a tuple or frozenset holding one (its hash is seeded). */
int cl_py_seeded_keys(struct _object *o);
/* Its two halves: o's layout, and its class's table (frozen now if not). */
int cl_py_portable_layout(struct _object *o);
int cl_py_portable_class(PyTypeObject *t);
int cl_py_frozen_class(PyTypeObject *t);
int cl_py_frozen_instance(struct _object *o);
/* clamor_py_frozen_instance's test of o itself, its class's known frozen. */
int cl_py_frozen_layout(struct _object *o);
int cl_py_frozen_keys(uintptr_t keys);
/* d is o's dict made from its values, over its class's keys table. */
int cl_py_split_over_class(struct _object *o, struct _object *d);
#endif
/* The walk of clamor_py_own_keys, the GIL held: the region instances of
 * plain classes reachable from root (up to `limit` objects) whose dicts are
 * not their own yet, each held, into *todo (the caller drops them and frees
 * it).  0, or -ENOMEM. */
int cl_py_walk_needing_keys(struct _object *root, long limit, int frozen, struct cl_py_stack *todo);
/* The walk of clamor_py_rekey, the GIL held: the exact region dicts
 * reachable from root as above that hold one of keys[0..nkeys) (addresses,
 * ascending) as a key, each held, into *todo.  0, or -ENOMEM. */
int cl_py_walk_holding_keys(struct _object *root, long limit, const uint64_t *keys, size_t nkeys,
                            struct cl_py_stack *todo);

/* ---- pyextents.c: what a reader of an object follows pointers from ----- */

/* The ranges a walk read, as (start, length) pairs in v, each within one
 * region page, with the tag of the object each belongs to (`cur` when it
 * was added) and its strictness byte (`strict_now` then: bit 0, every word
 * a pointer or null, pointer_extents' strict; pywalk.c's TYPE_WORD, an
 * atom's type word).  Zeroed is empty; its owner frees v, tag and strict. */
struct cl_py_extents {
    uint64_t *v;
    int32_t *tag;
    uint8_t *strict;
    int32_t cur;
    uint8_t strict_now;
    size_t n, cap;
};
/* Add [lo, lo+len) (e NULL: nothing): 0, or -1 (no memory). */
int cl_py_extent(struct cl_py_extents *e, uintptr_t lo, size_t len);
/* The extents of the region object o, as pointer_extents() gives them: of
 * a plain type, of an instance of a plain class.  0, or -1 (no memory). */
int cl_py_extents_of(struct _object *o, struct cl_py_extents *e);
int cl_py_instance_extents(struct _object *o, struct cl_py_extents *e);
/* Has o extents of its own (a region container or instance)? */
int cl_py_has_extents(struct _object *o);

/* ---- pyownkeys.c: instances given dicts with keys of their own ---------- */

/* walk._own_keys for every region instance of a plain class reachable from
 * root, in one heap block: the conversions made, or a negative errno. */
long clamor_py_own_keys(uintptr_t root, long limit, int frozen);
/* promote.rekey for the exact region dicts reachable from root that hold
 * one of the strs at keys[0..nkeys) as a key: each gets, in one heap block,
 * one region copy of each such key in its place, its order kept.  The
 * (dict, key) pairs replaced, or a negative errno. */
long clamor_py_rekey(uintptr_t root, long limit, const uint64_t *keys, size_t nkeys);

/* ---- pyrecheck.c: what a recheck of the walk reads ---------------------- */

/* Where the entries of the dict or list at root lie: entry i at
 * [*first + i * *stride, + *stride) for i < *count.  0, or -1 (not known). */
int clamor_py_root_slots(uintptr_t root, uint64_t *first, uint64_t *stride, int64_t *count);
/* For each k < n, the 128-bit digest of run which[k] of ranges (pairs
 * ranges[starts[which[k]] .. starts[which[k] + 1])) into out[2k], out[2k+1]. */
void clamor_py_digest_runs(const uint64_t *ranges, const uint64_t *starts, const uint64_t *which, size_t n,
                           uint64_t *out);

/* ---- pyreloc.c: for clamor/memory/portable.py ------------------------------ */

/* An ELF object of the process: load base, and the hull [lo, hi) of its
 * loadable segments; name as the loader has it ("" for the executable). */
struct clamor_image {
    uintptr_t base, lo, hi;
    char name[4096];
};
/* Images into out[0..max); returns how many there are. */
size_t clamor_py_images(struct clamor_image *out, size_t max);
size_t clamor_py_array_cache_offset(void);
#define CLAMOR_NO_TARGET 0xffffffffu
/* Aligned words of [lo, lo + len) that point at one of the nt targets
 * (sorted, disjoint [tlo[i], thi[i]), number tid[i]) go to at[]/id[]; those
 * pointing into one of the npriv private ranges (sorted [lo, hi) pairs) and
 * no target get CLAMOR_NO_TARGET; region words are skipped.  Stops when max
 * are found; *done gets the bytes scanned.  Returns the count. */
size_t clamor_py_match(uintptr_t lo, size_t len, const uintptr_t *tlo, const uintptr_t *thi, const uint32_t *tid,
                       size_t nt, const uintptr_t *priv, size_t npriv, uintptr_t *at, uint32_t *id, size_t max,
                       size_t *done);
/* clamor_py_match over the n extents ext[2i], ext[2i+1] (start, length),
 * in order, the words into the bytearrays at_out (native words) and id_out
 * (uint32); a word into private memory is reported (CLAMOR_NO_TARGET) only
 * from an extent marked strict[i]; which_out (0, or a bytearray): the
 * index of each word's extent (uint32).  0, or ENOMEM. */
/* The permutation (order[n]) that sorts n 8-aligned addresses, stably
 * (a radix sort: portable.py's relocation words).  0, or ENOMEM. */
int clamor_py_sort_words(const uint64_t *addrs, size_t n, uint32_t *order);
int clamor_py_match_all(const uint64_t *ext, const uint8_t *strict, size_t n, const uintptr_t *tlo,
                        const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv,
                        uintptr_t at_out, uintptr_t id_out, uintptr_t which_out);

/* ---- pyrelist.c: a portable walk's relocation words ------------------------ */

/* What clamor_py_reloc_words hands back, every array malloc'd (freed with
 * clamor_py_buffer_free, or all at once with clamor_py_relist_free). */
struct clamor_relist {
    uint64_t *addrs;  /* the words to relocate, sorted, each once */
    uint32_t *tids;   /* each one's target (0: null) */
    int32_t *tags;    /* the tag of its extent or null word */
    size_t n;
    uint64_t *bad;    /* words of strict extents into private memory, no null word, in order */
    size_t nbad;
    uint64_t *pages;  /* with want_pages: the pages they lie in, ascending, and where each one's words end */
    uint64_t *ends;
    size_t npages;
    uint32_t *targets; /* the targets the words name, each once, ascending */
    size_t ntargets;
};
/* The words of the n extents ext[2i], ext[2i+1] (strict[i], tags[i] or
 * NULL) that point at one of the nt targets, and the nnulls null words
 * (null_tags[j] or NULL), sorted by address, each once (a null word first,
 * then the first extent's); the words of strict extents into one of the
 * npriv private ranges that are no null word go to bad.  0, ENOMEM,
 * E2BIG (more words than its packed keys number) or EINVAL (a word
 * outside the region): the caller's reference decides those. */
int clamor_py_reloc_words(const uint64_t *ext, const uint8_t *strict, const int32_t *tags, size_t n,
                          const uint64_t *nulls, const int32_t *null_tags, size_t nnulls, const uintptr_t *tlo,
                          const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv,
                          int want_pages, struct clamor_relist *out);
/* A recheck's tagged words: the n old ones (a, t, g; ascending addresses)
 * but those tagged one of drop[0..ndrop) (ascending), and the m new ones
 * (na, nt, ng; ascending), merged by address into out (addrs, tids, tags,
 * pages, ends; bad: the pages of the words gone and come, ascending, each
 * once).  0, ENOMEM, or EEXIST (a new word's address is a kept one's). */
int clamor_py_reloc_splice(const uint64_t *a, const uint32_t *t, const int32_t *g, size_t n, const int32_t *drop,
                           size_t ndrop, const uint64_t *na, const uint32_t *nt, const int32_t *ng, size_t m,
                           struct clamor_relist *out);
/* A walk's n ranges (start, length; each within one page, in the region)
 * and their tags (or NULL), but those whose skip byte (skip NULL: none) is
 * nonzero, ordered by page, stably, into malloc'd arrays
 * (freed with clamor_py_buffer_free): the pages, ascending, and where each
 * one's ranges start (npages + 1 of them).  0, ENOMEM, or EINVAL (a range
 * outside the region). */
struct clamor_pagesort {
    uint64_t *ranges;
    int32_t *tags;
    size_t n;
    uint64_t *pages;
    uint64_t *starts;
    size_t npages;
};
int clamor_py_sort_by_page(const uint64_t *ranges, const int32_t *tags, const uint8_t *skip, size_t n,
                           struct clamor_pagesort *out);
void clamor_py_pagesort_free(struct clamor_pagesort *s);
void clamor_py_relist_free(struct clamor_relist *l);
void clamor_py_buffer_free(void *p);

/* ---- stats.c: counters and the latency histogram ------------------------ */

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

/* ---- reloc.c: relocations with the pages ------------------------------- */

/* The relocation frame for pages [first, first+count) at `version` (the
 * driver's list of that version, checked against the words of
 * `data`, the pages served: ENOTRECOVERABLE if none agrees; a worker's own lists):
 * malloc'd into *out, its size returned; 0 and *err on failure.  The
 * driver may pass no data for pages that have no list (EAGAIN if one has). */
size_t cl_reloc_frame(uint64_t first, uint32_t count, uint32_t version, const char *data, void **out, int *err);
/* Worker: put the driver's words back into a copy of pages it holds. */
void cl_reloc_restore(uint64_t first, uint32_t count, char *data);
/* Worker: relocate the reply data of [first, first+count) (len bytes) by
 * the frame, and keep each page's list.  0, EBADMSG, ENOKEY, ENOMEM. */
int cl_reloc_apply(uint64_t first, uint32_t count, char *data, size_t len, const void *frame, size_t flen);
/* Worker: does it hold the lists of these pages (fetched with them)? */
bool cl_reloc_held(uint64_t first, uint32_t count);

#endif /* CLAMOR_INTERNAL_H */
