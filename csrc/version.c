/* version.c -- the driver's page versions: copy-on-write between versions.
 *
 * A version numbers a state of the region that tasks read.  Version S
 * begins with clamor_version_begin(S); what a page held when S+1 began is
 * the page "as of S", and its bytes stay where they are, as a kept copy,
 * for as long as a task may read at S.
 *
 * DESIGN.  From the first version on, the region is write-protected in the
 * driver (wprot.c: userfaultfd, which stops system calls' writes too, or
 * mprotect); the first write to a page in epoch S faults, and the fault
 * handler (fault.c) or the write-protection thread (wprot.c), through
 * cl_version_on_write, leaves the page's bytes where they are, as the kept
 * copy with last version S (what versions <= S read), copies them to a
 * free location of the memfd (samehost.c: the page's home or twin, else a
 * pool slot), points the driver's view of the page there with
 * mmap(MAP_FIXED), and opens it for writing.  The location table then says
 * the page is at the copy from version S+1 on.  Workers on the same host
 * that mapped the old location keep reading it until they drop the page at
 * a later version; no driver write ever reaches memory a reader maps.
 * Everything the handler does is async-signal-safe: a location comes from a
 * bitmap of pool slots, the copy is pwrite, the rest atomics,
 * futex, mmap and mprotect.
 *
 * At the next clamor_version_begin(S+1), each page of epoch S's dirty list
 * is compared with the copy it logged: identical bytes (reference counts
 * that went up and down again, a value written back) mean no change, and
 * the view goes back to the old location, the copy freed (under
 * userfaultfd it stays at the copy: see clamor_version_begin); otherwise
 * the page is on the changed list that travels with version S+1's tasks, so
 * workers drop their copy or mapping.  The dirty pages are write-protected
 * again.
 *
 * A request for page p at version s gets the kept copy with the smallest
 * last version >= s, else the current content.  The page server copies
 * current content under a seqlock on the page's log word, so a driver write
 * racing with the copy sends the logged copy instead of torn bytes.
 *
 * clamor_versions_keep(versions) frees the kept copies that none of those
 * versions can ask for (the driver passes the versions a task may still
 * read at, and the version each worker last ran at, whose pages it may
 * still map).  The lock here (vlock) is taken by the version calls and the
 * page server, never by the fault handler.
 *
 * Size: one unit.  Every part here (the write fault, version begin, the
 * keeping and freeing of copies, serving a version) reads and changes
 * the one table of locations and kept copies (V), under vlock or the
 * exclusion of writers and version begin; split, each file would reach
 * into the others' state.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define NONE UINT32_MAX
#define LOGGING 0x80000000u

/* A kept copy: the bytes at location id (its index in meta) are what page
 * `page1 - 1` read in the versions up to last_version.  page1 == 0: no copy
 * lives there.  `entry` is the table word the page had before it moved off
 * that location, put back if the move is undone. */
struct ver {
    _Atomic uint64_t page1;
    uint64_t entry;
    uint32_t last_version;
    bool alias;            /* same bytes as the page's next newer content: kept only for readers that map it */
    _Atomic uint32_t next; /* older version, or NONE */
};

static struct {
    bool on;                    /* copy-on-write active (a version has begun) */
    _Atomic uint32_t epoch;     /* version of the last clamor_version_begin */
    _Atomic uint32_t *logged;   /* per page: epoch it was logged in (| LOGGING) */
    _Atomic uint32_t *head;     /* per page: newest version's location or NONE */
    char *fview;                /* the memfd's locations, mapped read-write */
    struct ver *meta;           /* per location */
    uint64_t pool0;             /* first pool location */
    uint32_t nslots;            /* pool locations: one per page, its third, shared when free */
    _Atomic uint64_t *pool_used; /* a bit per pool slot: taken */
    _Atomic uint64_t pool_hint; /* the word of the pool where the last search for a free slot ended */
    uint64_t *dirty;            /* pages logged (or discarded) in the current epoch */
    _Atomic uint8_t *discarded; /* per page: punched by the allocator in this epoch */
    _Atomic uint64_t ndirty;
    _Atomic uint32_t *changed_in; /* per page: the version its last change became visible in */
    uint64_t *changed;          /* result of the last version_begin */
    uint64_t nchanged;
    _Atomic uint8_t *grouped;   /* per page: logged with its aligned group this epoch */
    uint64_t *moved;            /* of the last version_begin: unchanged pages left at a new location */
    uint64_t nmoved;
    uint64_t *ahead;            /* of the last version_begin: pages to log ahead (clamor_versions_log_ahead) */
    uint64_t nahead;
    uint32_t ahead_epoch;       /* the epoch they are for, 0 once logged */
    _Atomic uint8_t *early;     /* per page: logged ahead in this epoch, not by a write */
    _Atomic uint8_t *gone;      /* per page: freed by the allocator since it was last logged */
    _Atomic uint64_t nversions;
    uint64_t *vpages;           /* pages that have had a version, each once */
    _Atomic uint8_t *vlisted;
    _Atomic uint64_t nvpages;
    _Atomic uint64_t off_home;  /* pages whose bytes are not at their home */
    uint32_t map_floor;         /* no mapping worker reads a location of a version below this */
    uint32_t gc_floor;          /* copies for versions below this are gone */
} V;

static pthread_mutex_t vlock = PTHREAD_MUTEX_INITIALIZER;

/* A write fault and clamor_version_begin exclude each other.  Without it, a
 * driver thread writing while another begins a version could log a page
 * under the old epoch into the new epoch's dirty list (where the next
 * version_begin skips it), or open a page for writing just after version_begin
 * closed it: either way the page's changes reach no changed list, and
 * workers keep their old copy for good.  The handler cannot take a mutex;
 * it announces itself in `writers` and backs off while `beginning` is set
 * (both seq_cst, so one of the two always sees the other). */
static _Atomic uint32_t beginning;
static _Atomic int writers;

static void writer_enter(void) {
    for (;;) {
        atomic_fetch_add(&writers, 1);
        if (!atomic_load(&beginning)) return;
        atomic_fetch_sub(&writers, 1);
        cl_futex_wait(&beginning, 1, 10);
    }
}

static void writer_exit(void) { atomic_fetch_sub(&writers, 1); }

static void begin_exclusive(void) {
    atomic_store(&beginning, 1);
    while (atomic_load(&writers)) sched_yield();
}

static void begin_done(void) {
    atomic_store(&beginning, 0);
    cl_futex_wake(&beginning);
}

/* ---- locations (async-signal-safe) -------------------------------------------- */

static inline char *loc_bytes(uint32_t id) { return V.fview + ((size_t)id << cl_region.page_shift); }
static inline off_t loc_off(uint32_t id) { return (off_t)id << cl_region.page_shift; }
static inline uint32_t cur_of(uint64_t p) { return cl_loc_id(p, atomic_load(&cl_region.loctab[p])); }

/* Take pool slot s if it is free: true if the caller has it now. */
static bool slot_take(uint64_t s) {
    uint64_t bit = 1ull << (s & 63);
    return !(atomic_fetch_or(&V.pool_used[s >> 6], bit) & bit);
}

/* A free pool slot: page p's third location if it is free, else the
 * first free one from where the last search ended; NONE if none is.  A
 * page rewritten at every version cycles through three locations (the
 * copy the driver writes, the one tasks of this version read, and that of
 * the version before, which workers that map pages may still read); its
 * third keeps it, like its home and twin, in a bank where pages written
 * together are consecutive, so that one copy and one mapping move a run. */
static uint32_t slot_get(uint64_t p) {
    if (p < V.nslots && slot_take(p)) return (uint32_t)(V.pool0 + p);
    uint64_t nw = ((uint64_t)V.nslots + 63) / 64, w0 = atomic_load_explicit(&V.pool_hint, memory_order_relaxed);
    for (uint64_t i = 0; i < nw; i++) {
        uint64_t w = (w0 + i) % nw, cur = atomic_load(&V.pool_used[w]);
        uint64_t valid = w + 1 < nw || V.nslots % 64 == 0 ? ~0ull : (1ull << (V.nslots % 64)) - 1;
        while (~cur & valid) {
            int b = __builtin_ctzll(~cur & valid);
            if (atomic_compare_exchange_weak(&V.pool_used[w], &cur, cur | 1ull << b)) {
                atomic_store_explicit(&V.pool_hint, w, memory_order_relaxed);
                return (uint32_t)(V.pool0 + w * 64 + (uint64_t)b);
            }
        }
    }
    return NONE;
}

/* Pool slot id back to the pool (async-signal-safe). */
static void slot_put(uint32_t id) {
    uint64_t s = id - V.pool0;
    atomic_fetch_and(&V.pool_used[s >> 6], ~(1ull << (s & 63)));
}

/* A location no one reads any more: its memory goes back to the kernel, and
 * a pool slot goes back on the stack.  Only a location no worker can still
 * map is freed (the versions that could read it are gone).  The home or twin
 * of a page the driver wrote in this version or the last keeps its memory:
 * the page's next first write copies there (loc_choose), and a copy into
 * memory just handed back costs the kernel an allocation and a zeroing per
 * 4 KiB, more than the copy.  Such a page holds at most its three
 * locations (home, twin and third), until the allocator frees it
 * (cl_version_punch): then every location it leaves is punched. */
static void loc_free(uint32_t id) {
    uint64_t p1 = atomic_load_explicit(&V.meta[id].page1, memory_order_relaxed);
    uint32_t e = atomic_load(&V.epoch), w = p1 ? atomic_load(&V.logged[p1 - 1]) & ~LOGGING : 0;
    bool own = p1 && (id < V.pool0 || id == V.pool0 + p1 - 1); /* the page's home, twin or third */
    bool hot = own && w && w + 1 >= e && !atomic_load(&V.gone[p1 - 1]);
    /* punched before it reads free: a write fault may take it at once */
    if (!hot)
        fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, loc_off(id), (off_t)cl_region.page_size);
    V.meta[id].alias = false;
    atomic_store_explicit(&V.meta[id].page1, 0, memory_order_release);
    if (id >= V.pool0) slot_put(id);
}

/* A location loc_choose gave that ends up unused. */
static void loc_unchoose(uint32_t id) {
    if (id != NONE && id >= V.pool0) slot_put(id);
}

/* Where page p's bytes go when the driver first writes it in an epoch: its
 * home or its twin, whichever is neither where it is now nor holding a
 * version, so that pages written together stay contiguous in the memfd
 * (and in the mappings of the driver and of the workers); else the pool. */
static uint32_t loc_choose(uint64_t p, uint32_t cur) {
    uint32_t h = (uint32_t)p, t = (uint32_t)(cl_region.npages + p);
    if (cur != h && !atomic_load_explicit(&V.meta[h].page1, memory_order_acquire)) return h;
    if (cur != t && !atomic_load_explicit(&V.meta[t].page1, memory_order_acquire)) return t;
    return slot_get(p);
}

/* Point the driver's view of page p at location id, read-only (the caller
 * opens it for writing, or leaves it closed for copy-on-write), or, where
 * userfaultfd protects the region, open: the new mapping is not registered
 * with it (wprot.c), and a closed view there is never moved.  ``populate``
 * (MAP_POPULATE) fills the page tables at once: the write fault does, for
 * the page the driver is about to write (one call, not a minor fault per
 * 4 KiB of it: half the cost of a 64 KiB page's first write on this VM). */
static int view_run(uint64_t p, uint64_t n, uint32_t id, int prot, int populate) {
    void *a = mmap(cl_page_addr(p), n << cl_region.page_shift, prot,
                   MAP_SHARED | MAP_FIXED | MAP_NORESERVE | populate, cl_region.memfd, loc_off(id));
    return a == MAP_FAILED ? errno : 0;
}

static int view_at(uint64_t p, uint32_t id, int prot, int populate) { return view_run(p, 1, id, prot, populate); }

/* Copy n pages of the driver's view, from page p on, into locations id..
 * (async-signal-safe).  pwrite(2), not a memcpy through fview: a location
 * never written, or punched, gets its memory from the write itself, which
 * fills whole pages, so the kernel does not zero them first (half the cost
 * of a first write to a fresh location on the 2-core VM), and fview takes
 * no fault per 4 KiB. */
static int copy_out(uint64_t p, uint64_t n, uint32_t id) {
    const char *src = cl_page_addr(p);
    size_t len = (size_t)n << cl_region.page_shift;
    off_t off = loc_off(id);
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(cl_region.memfd, src + done, len - done, off + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        done += (size_t)w;
    }
    return 0;
}

/* Page p's table entry becomes `entry`; the one before stays readable for
 * workers of older versions that map pages (pagetable.c, mappable): it is
 * stored first. */
static void loc_set(uint64_t p, uint64_t entry) {
    atomic_store(&cl_region.locprev[p], atomic_load(&cl_region.loctab[p]));
    atomic_store(&cl_region.loctab[p], entry);
}

/* ---- setup --------------------------------------------------------------------- */

static void *reserve(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int versions_init(void) {
    uint64_t n = cl_region.npages;
    V.pool0 = 2 * n;
    V.nslots = (uint32_t)(cl_region.nlocs - V.pool0);
    V.logged = reserve(n * 4);
    V.head = reserve(n * 4);
    V.dirty = reserve(n * 16); /* a page may be listed twice: logged, and discarded */
    V.discarded = reserve(n);
    V.changed = reserve(n * 8);
    V.changed_in = reserve(n * 4);
    V.meta = reserve(cl_region.nlocs * sizeof(struct ver));
    V.pool_used = reserve(((size_t)V.nslots + 63) / 64 * 8);
    V.ahead = reserve(n * 8);
    V.early = reserve(n);
    V.gone = reserve(n);
    V.vpages = reserve(n * 8);
    V.vlisted = reserve(n);
    V.grouped = reserve(n);
    V.moved = reserve(n * 8);
    void *f = mmap(NULL, (size_t)cl_region.nlocs << cl_region.page_shift, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_NORESERVE, cl_region.memfd, 0);
    V.fview = f == MAP_FAILED ? NULL : f;
    if (!V.logged || !V.head || !V.dirty || !V.discarded || !V.changed || !V.changed_in || !V.meta || !V.pool_used ||
        !V.ahead || !V.early || !V.gone || !V.vpages || !V.vlisted || !V.grouped || !V.moved || !V.fview)
        return cl_err(ENOMEM, "cannot reserve address space for page versions");
    return 0;
}

/* Head words are stored +1 so that the zero-filled reservation reads NONE.
 * The fault handler pushes and the version calls unlink with compare-and-swap,
 * so neither loses the other's change. */
static inline uint32_t head_of(uint64_t p) { return atomic_load(&V.head[p]) - 1; }
static inline bool cas_head(uint64_t p, uint32_t old, uint32_t new_) {
    uint32_t o = old + 1;
    return atomic_compare_exchange_strong(&V.head[p], &o, new_ + 1);
}

/* ---- the write fault (async-signal-safe) --------------------------------------- */

/* Claim page p for logging in epoch e: true if the caller logs it now
 * (*was: its log word before), false if it is logged in e already, or,
 * unless `wait`, being logged by another thread. */
static bool claim(uint64_t p, uint32_t e, bool wait, uint32_t *was) {
    _Atomic uint32_t *w = &V.logged[p];
    uint32_t cur = atomic_load(w);
    for (;;) {
        if (cur == e) return false; /* logged and open: retry the write */
        if (cur == (e | LOGGING)) {
            if (!wait) return false;
            cl_futex_wait(w, cur, 100);
            cur = atomic_load(w);
            continue;
        }
        if (atomic_compare_exchange_weak(w, &cur, e | LOGGING)) break;
    }
    *was = cur;
    return true;
}

static void unclaim(uint64_t p, uint32_t was) {
    atomic_store(&V.logged[p], was);
    cl_futex_wake(&V.logged[p]);
}

/* Page p, claimed, had table entry `entry` at location `old` and its view
 * now points at nl, a copy: `old` keeps the bytes versions <= e read, and
 * from e+1 on the page is at nl. */
static void commit(uint64_t p, uint32_t e, uint64_t entry, uint32_t old, uint32_t nl) {
    V.meta[old].page1 = p + 1;
    V.meta[old].entry = entry;
    V.meta[old].last_version = e;
    V.meta[old].alias = false;
    uint32_t h;
    do {
        h = head_of(p);
        atomic_store(&V.meta[old].next, h);
    } while (!cas_head(p, h, old));
    /* readers of versions <= e keep the old location; later ones map this */
    loc_set(p, cl_loc_make(p, e + 1, nl));
    if (old == p) atomic_fetch_add(&V.off_home, 1);
    else if (nl == p) atomic_fetch_sub(&V.off_home, 1);
    if (!atomic_exchange(&V.vlisted[p], 1)) V.vpages[atomic_fetch_add(&V.nvpages, 1)] = p;
    atomic_fetch_add(&V.nversions, 1);
    atomic_store(&V.gone[p], 0);
    V.dirty[atomic_fetch_add(&V.ndirty, 1)] = p;
    atomic_store(&V.logged[p], e);
    cl_futex_wake(&V.logged[p]);
}

static int log_page(uint64_t p, uint32_t e) {
    uint32_t was;
    if (!claim(p, e, true, &was)) return 0;
    cl_dir_page_written(p); /* no worker's copy is current any more */
    /* The bytes stay where they are, as the copy of versions <= e: readers
     * may have them mapped.  The driver's view moves to a copy. */
    uint64_t entry = atomic_load(&cl_region.loctab[p]);
    uint32_t old = cl_loc_id(p, entry), nl = loc_choose(p, old);
    int rc = nl == NONE ? ENOMEM : 0;
    if (!rc) {
        rc = copy_out(p, 1, nl);
        if (!rc) rc = view_at(p, nl, cl_wprot_view_prot(), MAP_POPULATE);
        if (rc) loc_free(nl);
    }
    if (rc) {
        unclaim(p, was);
        return rc;
    }
    commit(p, e, entry, old, nl);
    CL_COUNT(pages_logged, 1);
    return 0;
}

static int on_write(uintptr_t addr);

int cl_version_on_write(uintptr_t addr) {
    writer_enter();
    int rc = V.on ? on_write(addr) : EACCES; /* read after a first version_begin has finished */
    writer_exit();
    return rc;
}

static int on_write(uintptr_t addr) {
    uint32_t e = atomic_load(&V.epoch);
    uint64_t p = cl_page_of(addr);
    /* Past a few thousand pages an epoch, log aligned groups so the driver's
     * mappings stay few (vm.max_map_count): the group moves to consecutive
     * locations together and stays there, unchanged pages included. */
    uint64_t nd = atomic_load(&V.ndirty), g = nd < 4096 ? 1 : nd < 16384 ? 16 : 256;
    uint64_t first = p & ~(g - 1), end = first + g;
    if (end > cl_region.npages) end = cl_region.npages;
    for (uint64_t q = first; q < end; q++) {
        if (g > 1) atomic_store(&V.grouped[q], 1);
        int rc = log_page(q, e);
        if (rc) return rc;
    }
    return cl_wprot_open(first, end - first);
}

/* Open [a, a+len) for writing the way a write fault would (system calls that
 * write into the region get EFAULT instead of a fault). */
int cl_version_open(uintptr_t a, size_t len) {
    if (!V.on || len == 0) return 0;
    for (uintptr_t p = a & ~((uintptr_t)cl_region.page_size - 1); p < a + len; p += cl_region.page_size) {
        int rc = cl_version_on_write(p);
        if (rc) return cl_err(rc, "opening region page at %p for writing: %s", (void *)p, strerror(rc));
    }
    return 0;
}

void cl_version_prepare(uintptr_t a, size_t len) {
    if (!V.on || len == 0 || cl_wprot_mode() != CLAMOR_WPROT_MPROTECT) return;
    for (uintptr_t p = a & ~((uintptr_t)cl_region.page_size - 1); p < a + len; p += cl_region.page_size)
        if (!cl_version_open_now(cl_page_of(p))) cl_version_on_write(p);
}

/* Freed spans are punched out of the memfd (alloc.c): the pages read zero
 * from then on, and no write fault tells this file.  A later write logs the
 * zeros as the old content, the comparison at the next version finds nothing
 * changed, and workers would keep the freed bytes for the new object (a
 * calloc of punched pages writes nothing at all).  So a punched page is
 * listed as changed at the next version begin, without a kept copy: the freed
 * bytes are no one's to read at an older version. */
void cl_version_discarded(uint64_t first, uint64_t n) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER || !V.discarded) return;
    writer_enter();
    if (V.on)
        for (uint64_t p = first; p < first + n && p < cl_region.npages; p++)
            if (!atomic_exchange(&V.discarded[p], 1)) V.dirty[atomic_fetch_add(&V.ndirty, 1)] = p;
    writer_exit();
}

/* ---- logging ahead --------------------------------------------------------------- */

/* A page the driver rewrites at every version (a weight vector updated in
 * place at each iteration) would take, in every epoch, a write fault, a
 * copy and a mapping: 40 to 130 us for a 64 KiB page on the 2-core VM,
 * more than the update itself.  A page that changed at this version begin
 * and at one of the AHEAD_WINDOW versions before is logged as the version
 * begins instead (clamor_versions_log_ahead, after clamor_versions_keep
 * has freed the locations it moves to), in runs: one copy and one mapping
 * for each run of pages whose copies are consecutive (home, twin or third
 * banks; a page whose other bank still holds a version, and which never
 * had a third copy, waits for a later call in the epoch: a Cluster calls
 * again as a stage ends, when its workers have moved on from the version
 * before, so that a global rewritten between stages lives in two
 * locations, not three).  The driver then writes it without a fault.  A page logged ahead
 * and not written is found unchanged at the next version begin, as a page
 * written back to its old bytes is. */
#define AHEAD_WINDOW 4
#define LOG_RUN 64 /* pages logged with one copy and one mapping, at most */

/* Log ahead the claimed run [first, first+n) into locations nl.. nl+n-1
 * (`entry`, `was`: each page's table entry and log word before).  On an
 * error the pages stay as they were, for their write faults to log. */
static int log_run(uint64_t first, uint64_t n, uint32_t nl, const uint64_t *entry, const uint32_t *was, uint32_t e) {
    int rc = copy_out(first, n, nl);
    if (!rc) rc = view_run(first, n, nl, PROT_READ | PROT_WRITE, MAP_POPULATE);
    for (uint64_t k = 0; k < n; k++) {
        if (rc) {
            loc_unchoose(nl + (uint32_t)k);
            unclaim(first + k, was[k]);
            continue;
        }
        atomic_store(&V.early[first + k], 1);
        commit(first + k, e, entry[k], cl_loc_id(first + k, entry[k]), nl + (uint32_t)k);
    }
    if (!rc) {
        CL_COUNT(pages_logged, n);
        CL_COUNT(pages_logged_ahead, n);
    }
    return rc;
}

/* Pool slot nl is page p's own third and holds memory: the page had a
 * third copy before (the driver wrote it while a stage ran, with the
 * version before still held), so it is likely to again. */
static bool warm_third(uint64_t p, uint32_t nl) {
    unsigned char in = 0;
    return nl == V.pool0 + p && mincore(loc_bytes(nl), 4096, &in) == 0 && (in & 1);
}

/* Log ahead in epoch e, in runs (one copy and one mapping for each run of
 * pages whose copies are consecutive), the pages pages[0..count)
 * (ascending) but those logged or being logged already, and those whose
 * home and twin are both taken and whose third was never used (*left
 * counts them: a version the workers have not moved on from yet holds
 * one; they are logged at a later call, once it is freed, or by their
 * write fault).  Returns how many it logged. */
static uint64_t log_pages(const uint64_t *pages, uint64_t count, uint32_t e, uint64_t *left) {
    uint64_t entry[LOG_RUN], first = 0, n = 0, done = 0;
    uint32_t was[LOG_RUN], nl0 = NONE;
    int rc = 0;
    *left = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t p = pages[i], en;
        uint32_t w, nl;
        if (!claim(p, e, false, &w)) continue; /* a write logged it already */
        en = atomic_load(&cl_region.loctab[p]);
        nl = loc_choose(p, cl_loc_id(p, en));
        if (nl != NONE && nl >= V.pool0 && !warm_third(p, nl)) {
            /* (a pool slot is a third copy of the page, and memory that may
             * never have been used: 200 us a page on the 2-core VM) */
            loc_unchoose(nl);
            unclaim(p, w);
            (*left)++;
            continue;
        }
        if (n && (p != first + n || nl != nl0 + n || n == LOG_RUN)) {
            rc = log_run(first, n, nl0, entry, was, e);
            done += rc ? 0 : n;
            n = 0;
        }
        if (rc || nl == NONE) { /* (the write faults say why) */
            loc_unchoose(nl);
            unclaim(p, w);
            break;
        }
        if (!n) first = p, nl0 = nl;
        entry[n] = en, was[n] = w, n++;
    }
    if (n && !log_run(first, n, nl0, entry, was, e)) done += n;
    return done;
}

/* The second half of a long list, on a thread of its own: the copy and
 * the fill of the page tables run on two CPUs (the workers wait for the
 * stage meanwhile).  The pages are disjoint, and every step of logging
 * is atomic per page; the caller's writer_enter covers both. */
struct half {
    const uint64_t *pages;
    uint64_t count, done, left;
    uint32_t e;
};

static void *log_half(void *arg) {
    struct half *h = arg;
    h->done = log_pages(h->pages, h->count, h->e, &h->left);
    return NULL;
}

#define AHEAD_SPLIT 256 /* pages: a list this long is logged by two threads */

uint64_t clamor_versions_log_ahead(void) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER || !V.logged) return 0;
    writer_enter(); /* no version begins meanwhile */
    uint32_t e = atomic_load(&V.epoch);
    uint64_t done = 0;
    if (V.on && V.ahead_epoch == e && cl_option_get(CL_OPT_LOG_AHEAD)) {
        uint64_t n = V.nahead, mine = n, left = 0;
        struct half h = {V.ahead + n / 2, n - n / 2, 0, 0, e};
        pthread_t th;
        bool two = n >= AHEAD_SPLIT && sysconf(_SC_NPROCESSORS_ONLN) > 1;
        if (two) {
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old); /* (no signal handler runs on it) */
            two = pthread_create(&th, NULL, log_half, &h) == 0;
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            if (two) mine = n / 2;
        }
        done = log_pages(V.ahead, mine, e, &left);
        if (two) {
            pthread_join(th, NULL);
            done += h.done;
            left += h.left;
        }
        if (!left) V.ahead_epoch = 0; /* (else a later call in this epoch logs the rest) */
    }
    writer_exit();
    return done;
}

/* ---- versions -------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Pages away from home split the driver's view (and the views of workers
 * that map them): one mapping more on each side of each such page.  Past
 * a quarter of the mapping budget (half of vm.max_map_count by default,
 * clamor_set_max_mappings), pages whose home is free go back home at a
 * version begin, every page write-protected: the bytes are copied home, the
 * view moves there, and the location left becomes a version of the epoch
 * that ended (a worker may map it) until the workers that map pages have
 * dropped the page (the moved list).  Under begin_exclusive and vlock. */
/* Take version location `id` out of page p's list, its place taken by
 * `repl` (NONE: simply unlinked).  Under vlock, no writer running. */
static bool relink(uint64_t p, uint32_t id, uint32_t repl) {
    uint32_t prevn = NONE;
    for (uint32_t c = head_of(p); c != NONE; prevn = c, c = atomic_load(&V.meta[c].next)) {
        if (c != id) continue;
        uint32_t nx = atomic_load(&V.meta[c].next), to = repl == NONE ? nx : repl;
        if (repl != NONE) atomic_store(&V.meta[repl].next, nx);
        if (prevn == NONE) return cas_head(p, c, to);
        atomic_store(&V.meta[prevn].next, to);
        return true;
    }
    return false;
}

/* Page p's home holds a version no mapping worker can read through a
 * mapping any more (below the map floor): free the home.  An alias (the
 * same bytes as the next newer content) is dropped; any other version's
 * bytes move to a pool slot, where the page server still finds them. */
static bool free_home(uint64_t p) {
    uint32_t h = (uint32_t)p;
    if (V.meta[h].last_version >= V.map_floor) return false;
    if (V.meta[h].alias) {
        if (!relink(p, h, NONE)) return false;
        atomic_fetch_sub(&V.nversions, 1);
        loc_free(h);
        return true;
    }
    uint32_t sl = slot_get(p);
    if (sl == NONE) return false;
    memcpy(loc_bytes(sl), loc_bytes(h), cl_region.page_size);
    V.meta[sl].entry = V.meta[h].entry;
    V.meta[sl].last_version = V.meta[h].last_version;
    V.meta[sl].alias = false;
    atomic_store(&V.meta[sl].page1, p + 1);
    if (!relink(p, h, sl)) {
        loc_free(sl);
        return false;
    }
    loc_free(h);
    return true;
}

/* Pages away from home split the driver's view (and the views of workers
 * that map them): one mapping more on each side of each such page.  Past
 * a quarter of the mapping budget (half of vm.max_map_count by default,
 * clamor_set_max_mappings), pages go back home at a version begin, every
 * page write-protected: the bytes are copied home, the view moves there,
 * and the location left becomes an alias version of the epoch that ended
 * (a worker may map it) until the workers that map pages have dropped the
 * page (the moved list) and moved past that epoch.  A home that holds a
 * version no mapping worker can read is freed first.  Under
 * begin_exclusive and vlock. */
static void compact(uint32_t prev, uint32_t version) {
    uint64_t budget = clamor_max_mappings(), target = budget / 16;
    if (2 * atomic_load(&V.off_home) <= budget / 4) return;
    uint64_t np = atomic_load(&V.nvpages);
    for (uint64_t k = 0; k < np && atomic_load(&V.off_home) > target; k++) {
        uint64_t p = V.vpages[k];
        uint64_t entry = atomic_load(&cl_region.loctab[p]);
        uint32_t cur = cl_loc_id(p, entry), h = (uint32_t)p;
        if (cur == h || (atomic_load(&V.logged[p]) & LOGGING)) continue;
        /* Not a page of this epoch (a page rewritten at every version
         * stays where it is): asked first, for freeing its home would copy
         * the version there into a pool slot, memory never used before,
         * for nothing (1 GiB of such pages: 3.5 s every third version). */
        uint32_t top = head_of(p);
        if (top != NONE && V.meta[top].last_version >= prev) continue;
        if (atomic_load(&V.meta[h].page1) && !free_home(p)) continue;
        top = head_of(p); /* (free_home may have moved it) */
        if (cl_wprot_mode() == CLAMOR_WPROT_USERFAULTFD) {
            /* A closed view cannot move here (see version_begin): the page
             * is logged as a first write in this version would log it, so
             * its bytes and its view go home, open; the next version begin
             * finds it unchanged, and the workers that map it move. */
            if (log_page(p, version) == 0) CL_COUNT(pages_compacted, 1);
            continue;
        }
        memcpy(loc_bytes(h), loc_bytes(cur), cl_region.page_size);
        if (view_at(p, h, PROT_READ, 0) != 0) continue;
        V.meta[cur].entry = entry;
        V.meta[cur].last_version = prev;
        V.meta[cur].alias = true;
        atomic_store(&V.meta[cur].next, top);
        atomic_store(&V.meta[cur].page1, p + 1);
        if (!cas_head(p, top, cur)) { /* (no writer runs now: cannot happen) */
            view_at(p, cur, PROT_READ, 0);
            V.meta[cur].alias = false;
            atomic_store(&V.meta[cur].page1, 0);
            continue;
        }
        atomic_fetch_add(&V.nversions, 1);
        /* from the version beginning now: a task of an earlier version keeps its
         * mapping of the old location, or fetches */
        loc_set(p, cl_loc_make(p, version, h));
        atomic_fetch_sub(&V.off_home, 1);
        V.moved[V.nmoved++] = p;
        CL_COUNT(pages_compacted, 1);
    }
}

/* The first version: everything written so far is the content of version
 * 1, and copy-on-write starts.  Under vlock and begin_exclusive. */
static int first_version(uint32_t version) {
    int rc;
    if ((rc = clamor_fault_install()) > 0) return rc;
    cl_option_env(CL_OPT_LOG_AHEAD);
    atomic_store(&V.epoch, version);
    V.on = true; /* before the protection: a write from now on is logged */
    if ((rc = cl_wprot_start())) {
        V.on = false;
        return rc;
    }
    cl_dir_forget_all(); /* copies fetched before versions may be stale */
    return 0;
}

/* The dirty list of the epoch that ends, sorted, each page once: how many. */
static uint64_t take_dirty(void) {
    uint64_t nd = atomic_exchange(&V.ndirty, 0);
    qsort(V.dirty, nd, sizeof *V.dirty, cmp_u64);
    uint64_t u = 0; /* a page logged and discarded is listed twice */
    for (uint64_t i = 0; i < nd; i++)
        if (!u || V.dirty[i] != V.dirty[u - 1]) V.dirty[u++] = V.dirty[i];
    return u;
}

/* Write-protect the nd dirty pages again, run by run. */
static int protect_dirty(uint64_t nd) {
    int rc;
    for (uint64_t i = 0; i < nd;) {
        uint64_t s = i;
        while (i + 1 < nd && V.dirty[i + 1] == V.dirty[i] + 1) i++;
        i++;
        if ((rc = cl_wprot_close(V.dirty[s], V.dirty[i - 1] - V.dirty[s] + 1)))
            return cl_err(rc, "write-protecting changed pages: %s", strerror(rc));
    }
    return 0;
}

/* Dirty page p of epoch prev, as `version` begins: on the changed list,
 * or, its bytes the same as the copy it logged, unchanged (see below). */
static void settle(uint64_t p, uint32_t prev, uint32_t version) {
    atomic_store(&V.early[p], 0);
    uint32_t s = head_of(p);
    bool discarded = atomic_exchange(&V.discarded[p], 0);
    if (s == NONE || V.meta[s].last_version != prev) {
        if (discarded) V.changed[V.nchanged++] = p;
        return;
    }
    bool grouped = atomic_exchange(&V.grouped[p], 0);
    if (!discarded && memcmp(loc_bytes(s), cl_page_addr(p), cl_region.page_size) == 0) {
        /* No change after all.  A page logged with its group stays with
         * it, at the copy, so that the group stays one mapping: readers
         * that map the page must drop it (the moved list), and the old
         * location stays a version until none can read it.  So does
         * every page where userfaultfd protects: moving a closed view
         * makes a new mapping, writable or read-only until it is
         * protected, and a system call writing there meanwhile would
         * go unlogged or get EFAULT.  Any other page goes back to the
         * old location, and the copy is freed. */
        if (grouped || cl_wprot_mode() == CLAMOR_WPROT_USERFAULTFD) {
            V.meta[s].alias = true;
            loc_set(p, cl_loc_make(p, version, cur_of(p)));
            V.moved[V.nmoved++] = p;
            CL_COUNT(pages_unchanged, 1);
            return;
        }
        uint32_t copy = cur_of(p);
        if (view_at(p, s, PROT_READ, 0) == 0 && cas_head(p, s, atomic_load(&V.meta[s].next))) {
            loc_set(p, V.meta[s].entry);
            V.meta[s].alias = false;
            if (copy == p) atomic_fetch_add(&V.off_home, 1);
            else if (s == p) atomic_fetch_sub(&V.off_home, 1);
            atomic_store(&V.meta[s].page1, 0);
            atomic_fetch_sub(&V.nversions, 1);
            loc_free(copy);
            CL_COUNT(pages_unchanged, 1);
            return;
        }
        view_at(p, copy, PROT_READ, 0);
        V.changed[V.nchanged++] = p; /* logged again meanwhile: treat as changed */
    } else {
        V.changed[V.nchanged++] = p;
    }
}

int clamor_version_begin(uint32_t version) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER) return cl_err(EPERM, "only the driver begins versions");
    if (version == 0 || version <= atomic_load(&V.epoch))
        return cl_err(EINVAL, "version %u does not follow version %u", version, atomic_load(&V.epoch));
    pthread_mutex_lock(&vlock);
    int rc = 0;
    if (!V.logged && (rc = versions_init())) goto unlock;
    begin_exclusive();
    V.nchanged = 0;
    V.nmoved = 0;
    if (!V.on) {
        rc = first_version(version);
        goto out;
    }
    uint32_t prev = atomic_load(&V.epoch);
    atomic_store(&V.epoch, version); /* writes from now on log as `version` */
    uint64_t nd = take_dirty();
    if ((rc = protect_dirty(nd))) goto out;
    for (uint64_t i = 0; i < nd; i++) settle(V.dirty[i], prev, version);
    V.nahead = 0;
    for (uint64_t i = 0; i < V.nchanged; i++) {
        uint64_t p = V.changed[i];
        uint32_t before = atomic_exchange(&V.changed_in[p], version);
        /* (not a page the allocator freed: its copy would hold zeros in memory) */
        if (before && version - before <= AHEAD_WINDOW && !atomic_load(&V.gone[p])) V.ahead[V.nahead++] = p;
        cl_dir_changed(p, version);
    }
    V.ahead_epoch = version;
    compact(prev, version);
out:
    begin_done();
unlock:
    pthread_mutex_unlock(&vlock);
    return rc;
}

uint64_t clamor_changed_count(void) { return V.nchanged; }
uint64_t clamor_dirty_count(void) { return atomic_load(&V.ndirty); }

uint64_t clamor_dirty_copy(uint64_t *out, uint64_t n) {
    /* Writers append (index first, page after): wait them out for a
     * complete list, as a version begin does. */
    pthread_mutex_lock(&vlock);
    begin_exclusive();
    uint64_t nd = atomic_load(&V.ndirty);
    if (V.dirty) memcpy(out, V.dirty, (n < nd ? n : nd) * sizeof *out);
    begin_done();
    pthread_mutex_unlock(&vlock);
    return V.dirty ? nd : 0;
}

uint64_t clamor_moved_count(void) { return V.nmoved; }

void clamor_versions_map_floor(uint32_t version) {
    pthread_mutex_lock(&vlock);
    V.map_floor = version;
    pthread_mutex_unlock(&vlock);
}

void clamor_moved_copy(uint64_t *out, uint64_t n) { memcpy(out, V.moved, (n < V.nmoved ? n : V.nmoved) * sizeof *out); }

void clamor_changed_copy(uint64_t *out, uint64_t n) {
    memcpy(out, V.changed, (n < V.nchanged ? n : V.nchanged) * sizeof *out);
}

uint32_t clamor_version_current(void) { return atomic_load(&V.epoch); }

bool cl_version_active(void) { return V.on; }

/* 1 if the driver may be writing page p now (opened in this epoch). */
bool cl_version_open_now(uint64_t p) {
    return V.on && (atomic_load(&V.logged[p]) & ~LOGGING) == atomic_load(&V.epoch);
}

/* 1 if page p is open in this epoch because the driver wrote it (not
 * logged ahead as the version began). */
bool cl_version_written_now(uint64_t p) { return cl_version_open_now(p) && !atomic_load(&V.early[p]); }

static bool any_in(const uint32_t *sorted, size_t n, uint32_t lo, uint32_t hi) { /* some x with lo < x <= hi */
    size_t a = 0, b = n;
    while (a < b) { /* first index with sorted[i] > lo */
        size_t m = (a + b) / 2;
        if (sorted[m] > lo) b = m;
        else a = m + 1;
    }
    return a < n && sorted[a] <= hi;
}

int clamor_versions_keep(const uint32_t *versions, size_t n) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER || !V.logged) return 0;
    for (size_t i = 1; i < n; i++)
        if (versions[i] < versions[i - 1]) return cl_err(EINVAL, "clamor_versions_keep: versions are not sorted");
    pthread_mutex_lock(&vlock);
    if (n && versions[0] > V.gc_floor) V.gc_floor = versions[0];
    /* A kept copy with last version L, whose next older one has last version
     * L0 (0 for none), answers the versions in (L0, L]: it goes if no version
     * to keep lies there.  Dropping it widens its newer neighbour's range only
     * by versions not kept, so the order of the walk does not matter. */
    uint64_t np = atomic_load(&V.nvpages);
    for (uint64_t k = 0; k < np; k++) {
        uint64_t p = V.vpages[k];
        uint32_t prev = NONE;
        for (uint32_t c = head_of(p); c != NONE;) {
            uint32_t nx = atomic_load(&V.meta[c].next);
            uint32_t lo = nx == NONE ? 0 : V.meta[nx].last_version;
            /* the newest version of the epoch being written stays: a write is logged there */
            bool keep = any_in(versions, n, lo, V.meta[c].last_version) || V.meta[c].last_version >= atomic_load(&V.epoch);
            /* an alias only serves readers that map it: the page server
             * finds the same bytes in the next newer content */
            if (V.meta[c].alias && V.meta[c].last_version < V.map_floor) keep = false;
            if (!keep && (prev == NONE ? cas_head(p, c, nx) : (atomic_store(&V.meta[prev].next, nx), true))) {
                loc_free(c);
                atomic_fetch_sub(&V.nversions, 1);
            } else {
                prev = c;
            }
            c = nx;
        }
    }
    pthread_mutex_unlock(&vlock);
    return 0;
}

/* *differs: 1 if a byte of [a, a+len) reads otherwise now than in the
 * version `version`, else 0.  Only pages written since `version` began
 * (logged in epoch `version` or later) are compared; a copy already
 * collected counts as different.  0, or errno + cl_err. */
int clamor_version_differs(uintptr_t a, size_t len, uint32_t version, int *differs) {
    *differs = 0;
    if (cl_region.role != CLAMOR_ROLE_DRIVER) return cl_err(EPERM, "only the driver keeps page versions");
    if (a < cl_region.base || a - cl_region.base >= cl_region.size || len > cl_region.size - (a - cl_region.base))
        return cl_err(EINVAL, "range %#lx+%zu is not inside the region", (unsigned long)a, len);
    if (!V.on || !len || version == 0) return 0;
    char *page = NULL;
    for (uintptr_t pos = a, end = a + len; pos < end && !*differs;) {
        uint64_t p = cl_page_of(pos);
        uintptr_t start = (uintptr_t)cl_page_addr(p);
        uintptr_t stop = start + cl_region.page_size < end ? start + cl_region.page_size : end;
        if ((atomic_load(&V.logged[p]) & ~LOGGING) >= version) {
            if (!page && !(page = malloc(cl_region.page_size))) return cl_err(ENOMEM, "no memory for a page");
            *differs = cl_version_read(p, version, page) != 0 ||
                       memcmp(page + (pos - start), (const void *)pos, stop - pos) != 0;
        }
        pos = stop;
    }
    free(page);
    return 0;
}

/* ---- serving -------------------------------------------------------------------- */

/* Copy page p as version `version` sees it into dst.  0, or ESTALE if the page
 * changed after that version and its copy of then was collected. */
int cl_version_read(uint64_t p, uint32_t version, void *dst) {
    if (!V.on || version == 0) {
        memcpy(dst, cl_page_addr(p), cl_region.page_size);
        return 0;
    }
    for (;;) {
        uint32_t before = atomic_load(&V.logged[p]);
        if (before & LOGGING) { /* a write is being logged: wait for the version */
            sched_yield();
            continue;
        }
        pthread_mutex_lock(&vlock);
        /* Below the floor only a page changed since `version` is unknown: one
         * that did not change reads as it did then (the walk below gives
         * the current content, or this epoch's logged version of it). */
        if (version < V.gc_floor && atomic_load(&V.changed_in[p]) > version) {
            pthread_mutex_unlock(&vlock);
            return ESTALE;
        }
        uint32_t best = NONE;
        for (uint32_t c = head_of(p); c != NONE; c = atomic_load(&V.meta[c].next)) {
            if (V.meta[c].last_version < version) break;
            best = c;
        }
        const char *src = best != NONE ? loc_bytes(best) : cl_page_addr(p);
        memcpy(dst, src, cl_region.page_size);
        pthread_mutex_unlock(&vlock);
        /* Current content is stable unless a write was logged meanwhile
         * (seqlock on the log word): then the list has the version. */
        if (best != NONE || atomic_load(&V.logged[p]) == before) return 0;
    }
}

void cl_version_stats(uint64_t *n, uint64_t *bytes) {
    *n = atomic_load(&V.nversions);
    *bytes = *n << cl_region.page_shift;
}

/* A whole page the allocator freed: the locations it keeps warm for its
 * next first write (home, twin, third) that hold nothing go back to the
 * kernel too, and those holding versions go when the versions do. */
static void punch_spares(uint64_t p) {
    atomic_store(&V.gone[p], 1);
    uint32_t cur = cur_of(p), own[3] = {(uint32_t)p, (uint32_t)(cl_region.npages + p), (uint32_t)(V.pool0 + p)};
    for (int k = 0; k < 3; k++) {
        uint32_t id = own[k];
        if (id == cur || atomic_load(&V.meta[id].page1)) continue;
        if (k == 2 && !slot_take(p)) continue; /* another page's now */
        fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, loc_off(id), (off_t)cl_region.page_size);
        if (k == 2) slot_put(id);
    }
}

/* Freed region memory reads zero from now on, at whichever location each
 * page's bytes are (never a version's). */
int cl_version_punch(uint64_t off, uint64_t len) {
    if (!len) return 0;
    /* A first write (another thread) or a version begin may move a page's
     * view while this punches: wait out a write being logged, keep version
     * begins out, and punch again wherever the page went meanwhile. */
    bool guard = cl_region.role == CLAMOR_ROLE_DRIVER && V.logged;
    if (guard) writer_enter();
    uint64_t end = off + len;
    int rc = 0;
    while (off < end && !rc) {
        uint64_t p = off >> cl_region.page_shift;
        uint64_t in = off & (cl_region.page_size - 1), stop = (p + 1) << cl_region.page_shift;
        if (stop > end) stop = end;
        for (uint32_t id = NONE;;) {
            if (guard)
                while (atomic_load(&V.logged[p]) & LOGGING) sched_yield();
            uint32_t now = cl_region.loctab ? cur_of(p) : (uint32_t)p;
            if (now == id) break;
            id = now;
            if (fallocate(cl_region.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)(((uint64_t)id << cl_region.page_shift) + in), (off_t)(stop - off)) != 0) {
                rc = errno;
                break;
            }
        }
        if (!rc && guard && V.on && in == 0 && stop - off == cl_region.page_size) punch_spares(p);
        off = stop;
    }
    if (guard) writer_exit();
    return rc;
}

static _Atomic uint64_t generation;

uint64_t cl_version_generation(void) { return atomic_load(&generation); }

void cl_version_reset(void) {
    atomic_fetch_add(&generation, 1);
    size_t n = cl_region.npages;
    if (V.logged) {
        munmap((void *)V.logged, n * 4);
        munmap((void *)V.head, n * 4);
        munmap(V.dirty, n * 16);
        munmap((void *)V.discarded, n);
        munmap(V.changed, n * 8);
        munmap((void *)V.changed_in, n * 4);
        munmap(V.meta, cl_region.nlocs * sizeof(struct ver));
        munmap((void *)V.pool_used, ((size_t)V.nslots + 63) / 64 * 8);
        munmap(V.ahead, n * 8);
        munmap((void *)V.early, n);
        munmap((void *)V.gone, n);
        munmap(V.vpages, n * 8);
        munmap((void *)V.vlisted, n);
        munmap((void *)V.grouped, n);
        munmap(V.moved, n * 8);
        if (V.fview) munmap(V.fview, (size_t)cl_region.nlocs << cl_region.page_shift);
    }
    memset(&V, 0, sizeof V);
}
