/* park.c -- a worker that maps the driver's pages keeps their page-table
 * entries across versions.
 *
 * DESIGN.  A page the driver rewrites at every version moves among three
 * locations of its memfd (version.c: home, twin, third), and a worker that
 * maps it drops it at every version and maps the next location.  Mapping is
 * cheap; filling the page tables of the new mapping is not: one 4 KiB entry
 * at a time, 64% of a worker's time in sparse logistic regression (2^24
 * weights, every page rewritten), where a peer that keeps one shared
 * mapping of its object store fills none.
 *
 * So a dropped run's entries are not thrown away: mremap(MREMAP_DONTUNMAP)
 * moves them, with the mapping, to the run's *locations* in the park, a
 * reserved stretch of address space as long as the driver's memfd, where
 * location id lives at park + id * page_size.  When a later version puts a
 * page at a location whose entries are parked, mremap moves them back
 * under the region page: no fill.  The entries point at the memfd's pages,
 * which the driver rewrites in place, so they show its current bytes.  A
 * location the driver punches loses its entries in every mapping, the park
 * included, and refills from the file.  What must never be parked is a page
 * this worker wrote (a reference count): under MAP_PRIVATE its entry points
 * at the worker's own copy, whose bytes are not the driver's.  A run with
 * any such 4 KiB page (read from /proc/self/pagemap: present, not a file
 * page) is dropped as before.
 *
 * The park's mappings count against the kernel's limit like any other:
 * each move may split one, so after `budget / 8` moves the whole park is
 * mapped over, empty, in one call.  No pagemap, no MREMAP_DONTUNMAP for
 * file mappings (Linux < 5.13), or CLAMOR_PARK=0: nothing is parked, and
 * pages map as before.  Every function runs under the page table's lock
 * (pagetable.c).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
#define PM_FILE (1ull << 61)

static struct {
    char *base;       /* nlocs pages of address space, or NULL: parking off */
    uint8_t *parked;  /* per location: its entries are in the park */
    uint8_t *kept;    /* per region page: mapped with its parked entries (no fill needed) */
    int pagemap;      /* /proc/self/pagemap */
    uint64_t moves;   /* since the park was last emptied */
    bool on;          /* parking: off for good after the kernel refused (the arrays stay: the pager reads `kept`) */
} K = {.pagemap = -1};

static size_t park_bytes(void) { return (size_t)cl_region.nlocs << cl_region.page_shift; }
static inline char *slot(uint32_t id) { return K.base + ((size_t)id << cl_region.page_shift); }

void cl_park_close(void) {
    if (K.base) munmap(K.base, park_bytes());
    if (K.parked) munmap(K.parked, cl_region.nlocs);
    if (K.kept) munmap(K.kept, cl_region.npages);
    if (K.pagemap >= 0) close(K.pagemap);
    K.base = NULL;
    K.parked = NULL;
    K.kept = NULL;
    K.pagemap = -1;
    K.moves = 0;
    K.on = false;
}

void cl_park_init(void) {
    cl_park_close();
    cl_option_env(CL_OPT_PARK);
    if (!cl_option_get(CL_OPT_PARK)) return;
    int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pm < 0) return;
    void *b = mmap(NULL, park_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *f = mmap(NULL, cl_region.nlocs, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *k = mmap(NULL, cl_region.npages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (b == MAP_FAILED || f == MAP_FAILED || k == MAP_FAILED) {
        if (b != MAP_FAILED) munmap(b, park_bytes());
        if (f != MAP_FAILED) munmap(f, cl_region.nlocs);
        if (k != MAP_FAILED) munmap(k, cl_region.npages);
        close(pm);
        return;
    }
    K.base = b;
    K.parked = f;
    K.kept = k;
    K.pagemap = pm;
    K.on = true;
}

/* Empty the park: one mapping again, nothing parked. */
static void empty(void) {
    if (mmap(K.base, park_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) ==
        MAP_FAILED) {
        K.on = false; /* (the old mappings stay: nothing reads them) */
        return;
    }
    memset(K.parked, 0, cl_region.nlocs);
    K.moves = 0;
}

static void counted_move(void) {
    if (++K.moves > clamor_max_mappings() / 8) empty();
}

/* True if every present 4 KiB page of [a, a+len) is the file's (none is
 * this worker's own copy). */
static bool only_file_pages(const char *a, size_t len) {
    uint64_t e[512];
    size_t n = len / CL_OS_PAGE, first = (uintptr_t)a / CL_OS_PAGE;
    for (size_t k = 0; k < n;) {
        size_t m = n - k < 512 ? n - k : 512;
        ssize_t got = pread(K.pagemap, e, m * 8, (off_t)((first + k) * 8));
        if (got != (ssize_t)(m * 8)) return false;
        for (size_t j = 0; j < m; j++)
            if ((e[j] & PM_SWAPPED) || ((e[j] & PM_PRESENT) && !(e[j] & PM_FILE))) return false;
        k += m;
    }
    return true;
}

/* Move the mapping and page tables of n pages at `from` to `to`, leaving
 * an empty mapping behind.  A range that spans mappings (mapped or parked
 * in separate calls, and not merged by the kernel) moves page by page: no
 * page is in two.  moved[k]: page k moved.  Returns how many did.  A
 * kernel that cannot move such a mapping at all turns parking off. */
static uint64_t move(char *from, char *to, uint64_t n, bool *moved) {
    size_t ps = cl_region.page_size;
    if (mremap(from, n * ps, n * ps, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) != MAP_FAILED) {
        memset(moved, 1, n);
        return n;
    }
    if (errno != EFAULT) { /* (EINVAL: no MREMAP_DONTUNMAP for file mappings here) */
        K.on = false;
        memset(moved, 0, n);
        return 0;
    }
    uint64_t done = 0;
    for (uint64_t k = 0; k < n; k++) {
        moved[k] = mremap(from + k * ps, ps, ps, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to + k * ps) !=
                   MAP_FAILED;
        done += moved[k];
    }
    return done;
}

void cl_park_put(uint64_t first, uint64_t n, uint32_t loc0) {
    if (!K.on || !n) return;
    size_t len = (size_t)n << cl_region.page_shift;
    char *a = cl_page_addr(first);
    if (!only_file_pages(a, len)) return;
    /* (the parked flags are the `moved` array itself) */
    uint64_t done = move(a, slot(loc0), n, (bool *)(K.parked + loc0));
    CL_COUNT(pages_parked, done);
    if (done) counted_move();
}

/* True if region page p was mapped with its parked entries: filling its
 * page tables ahead of a scan (pagetable.c, cl_map_populate) would walk
 * entries that are there already. */
bool cl_park_kept(uint64_t p) { return K.kept && K.kept[p]; }

/* Map locations loc0.. under region pages [first, first+n), `prot`, with the
 * parked entries of those that have them.  0 or errno. */
int cl_park_map(uint64_t first, uint64_t n, uint32_t loc0, int prot) {
    for (uint64_t k = 0; k < n;) {
        uint64_t s = k;
        bool parked = K.on && K.parked[loc0 + s];
        while (k < n && (K.on && K.parked[loc0 + k]) == parked) k++;
        size_t len = (size_t)(k - s) << cl_region.page_shift;
        char *at = cl_page_addr(first + s);
        uint32_t id = loc0 + (uint32_t)s;
        if (parked) {
            /* (parked open, as mapped: with the protection asked for) */
            bool *back = (bool *)(K.kept + first + s);
            uint64_t done = move(slot(id), at, k - s, back);
            memset(K.parked + id, 0, k - s);
            CL_COUNT(pages_unparked, done);
            if (done) counted_move();
            for (uint64_t j = 0; j < k - s; j++) /* what did not move maps afresh */
                if (!back[j] && mmap(at + (j << cl_region.page_shift), cl_region.page_size, prot,
                                     MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, cl_region.srcfd,
                                     (off_t)(id + j) << cl_region.page_shift) == MAP_FAILED)
                    return errno;
            continue;
        }
        void *m = mmap(at, len, prot, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, cl_region.srcfd,
                       (off_t)id << cl_region.page_shift);
        if (m == MAP_FAILED) return errno;
        if (K.kept) memset(K.kept + first + s, 0, k - s);
    }
    return 0;
}
