/* alloc.c -- the region allocator behind clamor_malloc() and friends.
 *
 * Hands out blocks of the global region to the driver.  Requests up to
 * CLAMOR_SMALL_MAX come from 32 size classes (16-byte steps to 128, then four
 * classes per power of two: at most 25% waste, every block 16-byte aligned)
 * carved out of 64 KiB slabs; larger requests are runs of 4 KiB pages.
 *
 * DESIGN
 * Every byte of bookkeeping lives outside the region: span descriptors and
 * slab bitmaps in libc's heap, and a page map with one word per 4 KiB page of
 * the region, mmap'd MAP_NORESERVE so its untouched parts cost nothing.  The
 * allocator thus never reads or writes region memory: a worker never fetches
 * a page for the allocator's sake, freed bytes stay as they were, and the
 * driver can compare page bytes between versions.  A page-map word is a
 * descriptor pointer with bit 0 set on every page of a span in use (slab or
 * large).  A free span keeps its descriptor, bit 0 clear, in its first and
 * last page only (boundary tags for coalescing) and 0 inside.
 * cl_alloc_range_used() looks only at bit 0, with relaxed atomic loads, so
 * the page server asks without the lock and never follows a pointer.  Free
 * spans sit in LIFO bins by length (exact up to 32 pages, then four bins per
 * power of two) and merge with free neighbours when released.  Runs of
 * 64 KiB and more are punched out of the memfd on release, so their memory
 * goes back to the kernel and reads as zero.  A span keeps the hull of its
 * pages that may not read zero (released unpunched, or present before the
 * heap was built); calloc clears only that part, sparing a large block the
 * memset and the memory cost of touching every page.  A class keeps at
 * most one empty slab; further empty slabs go back to the span pool.  One
 * mutex guards all of it except those page-map reads; it is held across
 * fork() so that a child inherits consistent metadata.
 *
 * Atomic blocks (Boehm's term): clamor_malloc_atomic() promises that the
 * block never holds a pointer (numpy data, clamor.empty).  They come from
 * slabs and spans of their own, so that clamor_block_atomic() answers for
 * a whole slab, and the conservative scan of share() never reads them.
 *
 * Size: one heap under one mutex.  The size classes, the large spans, the
 * page map and the public entry points read and write the same state
 * under the same lock, and every malloc of a heap() block runs through
 * them (interpose.c): kept static to one file, so that the entry points
 * inline what they call and no other file can touch the heap's state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define CL_PG_SHIFT 12
#define CL_SLAB_PAGES 16u   // 64 KiB slabs
#define CL_SLAB_BYTES ((size_t)CL_SLAB_PAGES << CL_PG_SHIFT)
#define CL_PUNCH_PAGES 16u  // punch released runs of 64 KiB and more
#define CL_NCLASS 32
#define CL_NBINS 268        // 32 exact + 4 per power of two up to 2^63 pages
#define CL_BINW ((CL_NBINS + 63) / 64)
#define CL_USED ((uintptr_t)1)

enum { CL_SPAN_FREE, CL_SPAN_SLAB, CL_SPAN_LARGE };

typedef struct cl_span {
    struct cl_span *next, *prev; // free bin, or the partial list of a class
    uint64_t first, npages;      // 4 KiB pages from the region base
    uint64_t dlo, dhi;           // pages that may not read zero: hull, or dlo == dhi
    uint8_t kind;
    uint8_t atomic;              // its blocks never hold pointers
    uint8_t cls;                 // slab only, from here on
    uint32_t csize, nslots, nfree;
    uint64_t used[];             // bit set: slot handed out
} cl_span;

typedef struct cl_class {
    cl_span *partial;            // slabs with a free slot
    uint32_t nempty;             // of them, slabs with no slot handed out
} cl_class;

static pthread_mutex_t cl_heap_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t cl_heap_once = PTHREAD_ONCE_INIT;

// Heap state, all under cl_heap_lock.
static _Atomic uintptr_t *cl_pmap;  // page map
static size_t cl_pmap_bytes;
static uint64_t cl_heap_pages;      // 4 KiB pages of the region
static uintptr_t cl_heap_base;      // geometry the heap was built for
static size_t cl_heap_size;
static cl_span *cl_bins[CL_NBINS];
static uint64_t cl_binmask[CL_BINW]; // bit set: bin not empty
static uint64_t cl_free_pages;
static cl_class cl_classes[2][CL_NCLASS]; // [atomic][class]

// Published for lock-free readers (cl_alloc_range_used, statistics).
static _Atomic uintptr_t *_Atomic cl_pmap_pub;
static _Atomic uint64_t cl_pages_pub;
static _Atomic size_t cl_allocated, cl_footprint;

/* ---- geometry ---------------------------------------------------------- */

static unsigned cls_of(size_t n) {
    if (n <= 128) return n ? (unsigned)((n - 1) >> 4) : 0;
    unsigned l = 63u - (unsigned)__builtin_clzll(n - 1); // 2^l < n <= 2^(l+1)
    return 8 + (l - 7) * 4 + (unsigned)(((n - 1) >> (l - 2)) & 3);
}

static size_t cls_size(unsigned c) {
    if (c < 8) return (size_t)(c + 1) * 16;
    unsigned l = 7 + (c - 8) / 4;
    return ((size_t)1 << l) + (size_t)((c - 8) % 4 + 1) * ((size_t)1 << (l - 2));
}

static unsigned bin_of(uint64_t n) {
    if (n <= 32) return (unsigned)n - 1;
    unsigned l = 63u - (unsigned)__builtin_clzll(n);
    return 32 + (l - 5) * 4 + (unsigned)((n >> (l - 2)) & 3);
}

static inline char *pg_addr(uint64_t pg) {
    return (char *)(cl_heap_base + ((uintptr_t)pg << CL_PG_SHIFT));
}

static inline uint64_t pages_for(size_t bytes) {
    return ((uint64_t)bytes + CL_OS_PAGE - 1) >> CL_PG_SHIFT;
}

// Set a's dirty hull to [lo, hi) clipped to a's pages.
static void dirty_clip(cl_span *a, uint64_t lo, uint64_t hi) {
    if (lo < a->first) lo = a->first;
    if (hi > a->first + a->npages) hi = a->first + a->npages;
    a->dlo = lo < hi ? lo : 0;
    a->dhi = lo < hi ? hi : 0;
}

// Grow a's dirty hull over [lo, hi) (a's pages already cover it).
static void dirty_join(cl_span *a, uint64_t lo, uint64_t hi) {
    if (lo >= hi) return;
    if (a->dlo >= a->dhi || lo < a->dlo) a->dlo = lo;
    if (a->dlo >= a->dhi || hi > a->dhi) a->dhi = hi;
}

/* ---- page map and lists -------------------------------------------------- */

// Relaxed is enough: readers only want to know whether a page is in use, and
// a page's bytes are written by the caller after malloc returns anyway.
static inline uintptr_t map_get(uint64_t pg) {
    return atomic_load_explicit(&cl_pmap[pg], memory_order_relaxed);
}

static inline void map_set(uint64_t pg, uintptr_t v) {
    atomic_store_explicit(&cl_pmap[pg], v, memory_order_relaxed);
}

static void map_fill(uint64_t first, uint64_t n, uintptr_t v) {
    for (uint64_t i = 0; i < n; i++) map_set(first + i, v);
    if (v & CL_USED) {
        cl_map_mark_used(first << CL_PG_SHIFT, n << CL_PG_SHIFT);
        cl_wprot_used(first << CL_PG_SHIFT, n << CL_PG_SHIFT);
    }
}

static void list_push(cl_span **head, cl_span *s) {
    s->prev = NULL;
    s->next = *head;
    if (*head) (*head)->prev = s;
    *head = s;
}

static void list_unlink(cl_span **head, cl_span *s) {
    if (s->prev) s->prev->next = s->next;
    else *head = s->next;
    if (s->next) s->next->prev = s->prev;
    s->next = s->prev = NULL;
}

// Counters change under the lock but are read without it; a negative delta
// wraps, which unsigned arithmetic undoes.
static inline void footprint_add(int64_t allocated, int64_t footprint) {
    atomic_fetch_add_explicit(&cl_allocated, (size_t)allocated, memory_order_relaxed);
    atomic_fetch_add_explicit(&cl_footprint, (size_t)footprint, memory_order_relaxed);
}

// Make `s` a free span: bin it and write its boundary tags.
static void bin_push(cl_span *s) {
    unsigned b = bin_of(s->npages);
    s->kind = CL_SPAN_FREE;
    list_push(&cl_bins[b], s);
    cl_binmask[b / 64] |= 1ull << (b % 64);
    cl_free_pages += s->npages;
    map_set(s->first, (uintptr_t)s);
    map_set(s->first + s->npages - 1, (uintptr_t)s);
}

// Take `s` out of its bin; the caller rewrites its page-map words.
static void bin_unlink(cl_span *s) {
    unsigned b = bin_of(s->npages);
    list_unlink(&cl_bins[b], s);
    if (!cl_bins[b]) cl_binmask[b / 64] &= ~(1ull << (b % 64));
    cl_free_pages -= s->npages;
}

// First non-empty bin >= b, or -1.
static int bin_next(unsigned b) {
    for (unsigned w = b / 64; w < CL_BINW; w++) {
        uint64_t m = cl_binmask[w];
        if (w == b / 64) m &= ~0ull << (b % 64);
        if (m) return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
    }
    return -1;
}

/* ---- spans --------------------------------------------------------------- */

// Give the pages' memory back to the kernel; afterwards they read as zero.
// Only the memfd is touched, never the mapping.  See fallocate(2).
static int pages_punch(uint64_t first, uint64_t n) {
    int saved = errno, rc = -1;
    if (cl_region.memfd >= 0) {
        rc = cl_version_punch(first << CL_PG_SHIFT, n << CL_PG_SHIFT);
        if (rc) {
            errno = rc;
            rc = -1;
        }
    }
    if (rc == 0 && n) /* workers must drop their copies: every region page it touched */
        cl_version_discarded((first << CL_PG_SHIFT) >> cl_region.page_shift,
                             ((((first + n) << CL_PG_SHIFT) - 1) >> cl_region.page_shift) -
                                 ((first << CL_PG_SHIFT) >> cl_region.page_shift) + 1);
    errno = saved;
    return rc;
}

// Carve `n` pages starting at an address aligned to `align` out of the free
// pool.  Returns a new descriptor with `extra` bytes (zeroed) after it, its
// map words not yet written; NULL with errno if nothing fits.
static cl_span *span_take(uint64_t n, size_t align, size_t extra, size_t req) {
    cl_span *s = NULL, *d, *spare = NULL;
    uint64_t start = 0;
    int b = n <= cl_free_pages ? bin_next(bin_of(n)) : -1;
    for (; b >= 0 && !s; b = b + 1 < CL_NBINS ? bin_next((unsigned)b + 1) : -1) {
        for (cl_span *t = cl_bins[b]; t; t = t->next) {
            uintptr_t a = (uintptr_t)pg_addr(t->first);
            uint64_t st = (((a + align - 1) & ~(uintptr_t)(align - 1)) - cl_heap_base) >> CL_PG_SHIFT;
            if (t->npages >= n && st - t->first <= t->npages - n) {
                s = t;
                start = st;
                break;
            }
        }
    }
    if (!s) {
        errno = cl_err(ENOMEM, "region exhausted: %zu bytes requested, %zu free", req,
                       (size_t)(cl_free_pages << CL_PG_SHIFT));
        return NULL;
    }
    uint64_t lead = start - s->first, tail = s->first + s->npages - start - n;
    d = calloc(1, sizeof *d + extra);
    if (lead && tail) spare = calloc(1, sizeof *spare);
    if (!d || (lead && tail && !spare)) {
        free(d);
        free(spare);
        errno = cl_err(ENOMEM, "out of memory for allocator metadata");
        return NULL;
    }
    bin_unlink(s);
    uint64_t dlo = s->dlo, dhi = s->dhi;
    d->first = start;
    d->npages = n;
    dirty_clip(d, dlo, dhi);
    // The remainders border used spans only (free spans are always merged),
    // so they go back without coalescing.  Every stale tag of `s` is either
    // rewritten here or covered by the caller's map_fill of the new span.
    cl_span *rest = s;
    if (tail) {
        cl_span *t = lead ? spare : rest;
        t->first = start + n;
        t->npages = tail;
        dirty_clip(t, dlo, dhi);
        bin_push(t);
        if (!lead) rest = NULL;
    }
    if (lead) {
        rest->npages = lead;
        dirty_clip(rest, dlo, dhi);
        bin_push(rest);
        rest = NULL;
    }
    free(rest);
    return d;
}

// Return the pages of a span in use to the pool, merged with free
// neighbours so that runs stay as long as possible.
static void span_release(cl_span *d) {
    uint64_t first = d->first, end = d->first + d->npages;
    uintptr_t e;
    int punched = d->npages >= CL_PUNCH_PAGES && pages_punch(first, d->npages) == 0;
    dirty_clip(d, first, punched ? first : end);
    map_fill(first, d->npages, 0);
    if (first > 0 && (e = map_get(first - 1)) != 0 && !(e & CL_USED)) {
        cl_span *l = (cl_span *)e;
        bin_unlink(l);
        map_set(first - 1, 0);
        d->first = l->first;
        d->npages += l->npages;
        dirty_join(d, l->dlo, l->dhi);
        free(l);
    }
    if (end < cl_heap_pages && (e = map_get(end)) != 0 && !(e & CL_USED)) {
        cl_span *r = (cl_span *)e;
        bin_unlink(r);
        map_set(end, 0);
        d->npages += r->npages;
        dirty_join(d, r->dlo, r->dhi);
        free(r);
    }
    bin_push(d);
}

/* ---- heap lifetime --------------------------------------------------------- */

static void heap_drop(void) {
    if (!cl_pmap) return;
    atomic_store_explicit(&cl_pmap_pub, NULL, memory_order_release);
    // Spans tile the region and each one's first page names it.
    for (uint64_t pg = 0; pg < cl_heap_pages;) {
        cl_span *d = (cl_span *)(map_get(pg) & ~CL_USED);
        if (!d || d->first + d->npages <= pg) break; // cannot happen
        pg = d->first + d->npages;
        free(d);
    }
    munmap((void *)cl_pmap, cl_pmap_bytes);
    cl_pmap = NULL;
    cl_pmap_bytes = cl_heap_size = 0;
    cl_heap_pages = cl_free_pages = 0;
    cl_heap_base = 0;
    memset(cl_bins, 0, sizeof cl_bins);
    memset(cl_binmask, 0, sizeof cl_binmask);
    memset(cl_classes, 0, sizeof cl_classes);
    atomic_store_explicit(&cl_pages_pub, 0, memory_order_relaxed);
    atomic_store_explicit(&cl_allocated, 0, memory_order_relaxed);
    atomic_store_explicit(&cl_footprint, 0, memory_order_relaxed);
}

// Build the heap for the current region on first use: one free span.
static int heap_init(void) {
    if (cl_pmap && cl_heap_base == cl_region.base && cl_heap_size == cl_region.size) return 0;
    heap_drop(); // the region was replaced without cl_alloc_reset()
    uint64_t n = cl_region.size >> CL_PG_SHIFT;
    size_t bytes = ((size_t)n * sizeof(uintptr_t) + CL_OS_PAGE - 1) & ~(CL_OS_PAGE - 1);
    cl_span *s = NULL;
    struct stat st;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return cl_err(ENOMEM, "cannot map the allocator page map (%zu bytes)", bytes);
    if (!(s = calloc(1, sizeof *s))) goto err;
    cl_pmap = m;
    cl_pmap_bytes = bytes;
    cl_heap_pages = n;
    cl_heap_base = cl_region.base;
    cl_heap_size = cl_region.size;
    s->first = 0;
    s->npages = n;
    // A new memfd reads zero; one that has data (the heap was reset on a
    // live region) might not anywhere.
    off_t data = lseek(cl_region.memfd, 0, SEEK_DATA);
    if (fstat(cl_region.memfd, &st) != 0 || (data >= 0 && (uint64_t)data < cl_region.size) ||
        (data < 0 && errno != ENXIO))
        dirty_clip(s, 0, n);
    bin_push(s);
    atomic_store_explicit(&cl_pages_pub, n, memory_order_relaxed);
    atomic_store_explicit(&cl_pmap_pub, cl_pmap, memory_order_release);
    return 0;
err:
    munmap(m, bytes);
    return cl_err(ENOMEM, "out of memory for allocator metadata");
}

// Hold the lock across fork() so that the child's copy is consistent.
static void heap_prefork(void) { pthread_mutex_lock(&cl_heap_lock); }
static void heap_postfork(void) { pthread_mutex_unlock(&cl_heap_lock); }
static void heap_once(void) { pthread_atfork(heap_prefork, heap_postfork, heap_postfork); }

// Take the lock for a call that allocates; 0, or an errno value (lock not
// held) if this process may not allocate.
static int heap_enter(void) {
    if (cl_region.role == CLAMOR_ROLE_NONE)
        return cl_err(ENXIO, "no region: call clamor_region_init() first");
    if (cl_region.role != CLAMOR_ROLE_DRIVER)
        return cl_err(EPERM, "only the driver allocates in the region");
    pthread_once(&cl_heap_once, heap_once);
    pthread_mutex_lock(&cl_heap_lock);
    int rc = heap_init();
    if (rc) pthread_mutex_unlock(&cl_heap_lock);
    return rc;
}

/* ---- blocks ---------------------------------------------------------------- */

static void *slab_alloc(unsigned c, size_t req, int atomic) {
    cl_class *k = &cl_classes[atomic][c];
    cl_span *s = k->partial;
    if (!s) {
        size_t csize = cls_size(c);
        uint32_t nslots = (uint32_t)(CL_SLAB_BYTES / csize), words = (nslots + 63) / 64;
        if (!(s = span_take(CL_SLAB_PAGES, CL_OS_PAGE, words * sizeof(uint64_t), req))) return NULL;
        s->kind = CL_SPAN_SLAB;
        s->atomic = (uint8_t)atomic;
        s->cls = (uint8_t)c;
        s->csize = (uint32_t)csize;
        s->nslots = s->nfree = nslots;
        if (nslots % 64) s->used[words - 1] = ~0ull << (nslots % 64); // no such slots
        map_fill(s->first, CL_SLAB_PAGES, (uintptr_t)s | CL_USED);
        list_push(&k->partial, s);
        k->nempty++;
        footprint_add(0, CL_SLAB_BYTES);
    }
    if (s->nfree == s->nslots) k->nempty--;
    // Lowest free slot: a block freed and asked for again comes back in place.
    uint32_t w = 0;
    while (s->used[w] == ~0ull) w++;
    unsigned bit = (unsigned)__builtin_ctzll(~s->used[w]);
    s->used[w] |= 1ull << bit;
    if (--s->nfree == 0) list_unlink(&k->partial, s);
    footprint_add(s->csize, 0);
    return pg_addr(s->first) + (size_t)(w * 64 + bit) * s->csize;
}

// Allocate under the lock.  Blocks up to CLAMOR_SMALL_MAX with alignment up
// to 4 KiB come from the smallest class that is a multiple of the alignment
// (the power-of-two classes guarantee one); all else is a span.  dirty[]
// gets the byte range of the block that may not read zero.
static void *heap_alloc(size_t size, size_t align, size_t dirty[2], const char *fn, int atomic) {
    dirty[0] = 0;
    dirty[1] = size;
    if (size <= CLAMOR_SMALL_MAX && align <= CL_OS_PAGE) {
        unsigned c = cls_of(size);
        while (cls_size(c) % align) c++;
        return slab_alloc(c, size, atomic);
    }
    if (size > cl_heap_size || align > cl_heap_size) {
        errno = cl_err(ENOMEM, "%s: %zu bytes (alignment %zu) do not fit in the %zu-byte region",
                       fn, size, align, cl_heap_size);
        return NULL;
    }
    uint64_t n = size ? pages_for(size) : 1; // aligned_alloc(8192, 0)
    cl_span *d = span_take(n, align < CL_OS_PAGE ? CL_OS_PAGE : align, 0, size);
    if (!d) return NULL;
    d->kind = CL_SPAN_LARGE;
    d->atomic = (uint8_t)atomic;
    map_fill(d->first, n, (uintptr_t)d | CL_USED);
    dirty[0] = d->dlo < d->dhi ? (size_t)((d->dlo - d->first) << CL_PG_SHIFT) : 0;
    dirty[1] = d->dlo < d->dhi ? (size_t)((d->dhi - d->first) << CL_PG_SHIFT) : 0;
    footprint_add((int64_t)n << CL_PG_SHIFT, (int64_t)n << CL_PG_SHIFT);
    return pg_addr(d->first);
}

// The span of the live block that starts at p, or NULL.
static cl_span *heap_lookup(const void *p) {
    uintptr_t a = (uintptr_t)p;
    if (!cl_pmap || a - cl_heap_base >= cl_heap_size) return NULL;
    uintptr_t e = map_get((a - cl_heap_base) >> CL_PG_SHIFT);
    if (!(e & CL_USED)) return NULL;
    cl_span *d = (cl_span *)(e & ~CL_USED);
    size_t off = a - (uintptr_t)pg_addr(d->first), i;
    if (d->kind == CL_SPAN_LARGE) return off == 0 ? d : NULL;
    if (off % d->csize || (i = off / d->csize) >= d->nslots) return NULL;
    return (d->used[i / 64] >> (i % 64)) & 1 ? d : NULL;
}

static size_t block_usable(const cl_span *d) {
    return d->kind == CL_SPAN_SLAB ? d->csize : (size_t)(d->npages << CL_PG_SHIFT);
}

static void block_free(cl_span *d, const void *p) {
    if (d->kind == CL_SPAN_LARGE) {
        footprint_add(-(int64_t)(d->npages << CL_PG_SHIFT), -(int64_t)(d->npages << CL_PG_SHIFT));
        span_release(d);
        return;
    }
    cl_class *k = &cl_classes[d->atomic][d->cls];
    size_t i = (size_t)((const char *)p - pg_addr(d->first)) / d->csize;
    d->used[i / 64] &= ~(1ull << (i % 64));
    footprint_add(-(int64_t)d->csize, 0);
    if (d->nfree++ == 0) list_push(&k->partial, d);
    if (d->nfree < d->nslots) return;
    if (!k->nempty) { // keep one empty slab so a malloc/free loop stays cheap
        k->nempty++;
        return;
    }
    list_unlink(&k->partial, d);
    footprint_add(0, -(int64_t)CL_SLAB_BYTES);
    span_release(d);
}

// Resize the block of `d` in place if that is cheap; 1 if done.
static int block_resize(cl_span *d, size_t size) {
    if (d->kind == CL_SPAN_SLAB) return size <= d->csize && (d->cls == 0 || size > d->csize / 2);
    if (size <= CLAMOR_SMALL_MAX || size > cl_heap_size) return 0;
    uint64_t n = pages_for(size), end = d->first + d->npages;
    if (n < d->npages) { // hand the tail back
        cl_span *t = calloc(1, sizeof *t);
        if (!t) return 1; // keep it all: still correct
        t->first = d->first + n;
        t->npages = d->npages - n;
        t->kind = CL_SPAN_LARGE;
        d->npages = n;
        footprint_add(-(int64_t)(t->npages << CL_PG_SHIFT), -(int64_t)(t->npages << CL_PG_SHIFT));
        span_release(t);
        return 1;
    }
    uint64_t more = n - d->npages;
    uintptr_t e;
    if (more == 0) return 1;
    if (end >= cl_heap_pages || !(e = map_get(end)) || (e & CL_USED)) return 0;
    cl_span *r = (cl_span *)e; // a free span starts right after ours
    if (r->npages < more) return 0;
    bin_unlink(r);
    if (r->npages == more) {
        free(r);
    } else {
        r->first += more;
        r->npages -= more;
        dirty_clip(r, r->dlo, r->dhi);
        bin_push(r);
    }
    map_fill(end, more, (uintptr_t)d | CL_USED);
    d->npages = n;
    footprint_add((int64_t)more << CL_PG_SHIFT, (int64_t)more << CL_PG_SHIFT);
    return 1;
}

/* ---- public API -------------------------------------------------------------- */

// A block handed out inside heap() is opened for writing now, where the
// region is write-protected by mprotect (version.c): a system call that
// writes into it (read(2) into a new buffer) gets EFAULT from a closed page.
// Under userfaultfd such a write waits for its version like any other.
static void *handed_out(void *p, size_t size) {
    if (p && cl_heap_depth) cl_version_prepare((uintptr_t)p, size);
    return p;
}

// heap_alloc() for the public calls: checks the role, takes the lock.
static void *heap_alloc_locked(size_t size, size_t align, size_t dirty[2], const char *fn, int atomic) {
    int rc = heap_enter();
    if (rc) {
        errno = rc;
        return NULL;
    }
    void *p = heap_alloc(size, align, dirty, fn, atomic);
    pthread_mutex_unlock(&cl_heap_lock);
    return handed_out(p, size);
}

void *clamor_malloc(size_t size) {
    size_t dirty[2];
    return heap_alloc_locked(size, 16, dirty, "clamor_malloc", 0);
}

void *clamor_malloc_atomic(size_t size) {
    size_t dirty[2];
    return heap_alloc_locked(size, 16, dirty, "clamor_malloc_atomic", 1);
}

static void *calloc_kind(size_t n, size_t size, int atomic) {
    size_t total, dirty[2];
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = cl_err(ENOMEM, "clamor_calloc: %zu * %zu bytes overflows", n, size);
        return NULL;
    }
    char *p = heap_alloc_locked(total, 16, dirty, "clamor_calloc", atomic);
    if (!p) return NULL;
    if (dirty[1] > total) dirty[1] = total;
    if (dirty[0] < dirty[1]) memset(p + dirty[0], 0, dirty[1] - dirty[0]);
    return p;
}

void *clamor_calloc(size_t n, size_t size) { return calloc_kind(n, size, 0); }
void *clamor_calloc_atomic(size_t n, size_t size) { return calloc_kind(n, size, 1); }

static void *aligned_kind(size_t align, size_t size, const char *fn, int atomic) {
    size_t dirty[2];
    if (align == 0 || (align & (align - 1))) {
        errno = cl_err(EINVAL, "%s: alignment %zu is not a power of two", fn, align);
        return NULL;
    }
    return heap_alloc_locked(size, align < 16 ? 16 : align, dirty, fn, atomic);
}

void *clamor_aligned_alloc(size_t align, size_t size) {
    return aligned_kind(align, size, "clamor_aligned_alloc", 0);
}

void *clamor_aligned_alloc_atomic(size_t align, size_t size) {
    return aligned_kind(align, size, "clamor_aligned_alloc_atomic", 1);
}

int clamor_free_checked(void *ptr) {
    if (!ptr) return 0;
    if (cl_region.role == CLAMOR_ROLE_WORKER)
        return cl_err(EPERM, "clamor_free: %p: only the driver frees region blocks", ptr);
    if (cl_region.role != CLAMOR_ROLE_DRIVER)
        return cl_err(EINVAL, "clamor_free: %p: no region in this process", ptr);
    if (!cl_in_region((uintptr_t)ptr))
        return cl_err(EINVAL, "clamor_free: %p is outside the region", ptr);
    pthread_mutex_lock(&cl_heap_lock);
    cl_span *d = heap_lookup(ptr);
    if (d) block_free(d, ptr);
    pthread_mutex_unlock(&cl_heap_lock);
    return d ? 0 : cl_err(EINVAL, "clamor_free: %p is not a live block (already freed?)", ptr);
}

void clamor_free(void *ptr) {
    int rc = clamor_free_checked(ptr);
    if (rc) errno = rc;
}

void *clamor_realloc(void *ptr, size_t size) {
    if (!ptr) return clamor_malloc(size);
    if (size == 0) { // as glibc: free and return NULL
        clamor_free(ptr);
        return NULL;
    }
    int rc = heap_enter();
    if (rc) {
        errno = rc;
        return NULL;
    }
    cl_span *d = heap_lookup(ptr);
    size_t old = d ? block_usable(d) : 0;
    int atomic = d ? d->atomic : 0;
    int done = d && block_resize(d, size);
    pthread_mutex_unlock(&cl_heap_lock);
    if (!d) {
        errno = cl_err(EINVAL, "clamor_realloc: %p is not a live block", ptr);
        return NULL;
    }
    if (done) return handed_out(ptr, size);
    void *q = atomic ? clamor_malloc_atomic(size) : clamor_malloc(size);
    if (!q) return NULL; // the old block stays as it was
    memcpy(q, ptr, old < size ? old : size);
    clamor_free(ptr);
    return q;
}

size_t clamor_usable_size(const void *ptr) {
    if (!ptr || cl_region.role != CLAMOR_ROLE_DRIVER) return 0;
    pthread_mutex_lock(&cl_heap_lock);
    cl_span *d = heap_lookup(ptr);
    size_t n = d ? block_usable(d) : 0;
    pthread_mutex_unlock(&cl_heap_lock);
    return n;
}

// The live block that holds p, anywhere inside it: its start and usable size.
int clamor_block_of(const void *ptr, uintptr_t *start, size_t *size) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER) return cl_err(EPERM, "clamor_block_of: only the driver's allocator knows its blocks");
    uintptr_t a = (uintptr_t)ptr;
    int rc = EINVAL;
    pthread_mutex_lock(&cl_heap_lock);
    if (cl_pmap && a - cl_heap_base < cl_heap_size) {
        uintptr_t e = map_get((a - cl_heap_base) >> CL_PG_SHIFT);
        if (e & CL_USED) {
            cl_span *d = (cl_span *)(e & ~CL_USED);
            uintptr_t b = (uintptr_t)pg_addr(d->first), off = a - b;
            if (d->kind == CL_SPAN_SLAB) b += off / d->csize * d->csize; // the slot's start
            if (heap_lookup((void *)b) == d && off < block_usable(d) * (d->kind == CL_SPAN_SLAB ? d->nslots : 1)) {
                *start = b;
                *size = block_usable(d);
                rc = 0;
            }
        }
    }
    pthread_mutex_unlock(&cl_heap_lock);
    return rc ? cl_err(rc, "clamor_block_of: %#lx is not inside a live block", (unsigned long)a) : 0;
}

int clamor_block_atomic(const void *ptr) {
    uintptr_t start;
    size_t size;
    if (clamor_block_of(ptr, &start, &size) != 0) return -1;
    pthread_mutex_lock(&cl_heap_lock);
    uintptr_t e = map_get(((uintptr_t)ptr - cl_heap_base) >> CL_PG_SHIFT);
    int atomic = (e & CL_USED) ? ((cl_span *)(e & ~CL_USED))->atomic : -1;
    pthread_mutex_unlock(&cl_heap_lock);
    return atomic;
}

// Usable bytes of live blocks (class size, or whole pages for spans).
size_t clamor_heap_allocated(void) {
    return atomic_load_explicit(&cl_allocated, memory_order_relaxed);
}

// Bytes of slabs (cached empty ones included) and large spans.
size_t clamor_heap_footprint(void) {
    return atomic_load_explicit(&cl_footprint, memory_order_relaxed);
}

/* ---- internal hooks -------------------------------------------------------- */

int cl_alloc_range_used(uint64_t off, uint64_t len) {
    _Atomic uintptr_t *m = atomic_load_explicit(&cl_pmap_pub, memory_order_acquire);
    uint64_t size = atomic_load_explicit(&cl_pages_pub, memory_order_relaxed) << CL_PG_SHIFT;
    if (!m || len == 0 || off >= size) return 0;
    uint64_t last = (len > size - off ? size : off + len) - 1;
    for (uint64_t pg = off >> CL_PG_SHIFT; pg <= last >> CL_PG_SHIFT; pg++)
        if (atomic_load_explicit(&m[pg], memory_order_relaxed) & CL_USED) return 1;
    return 0;
}

// No lock: the caller guarantees no other thread is in the allocator (the
// region is being closed, or this is a fork child, where the lock may still
// be held on behalf of the parent's thread until the atfork handler runs).
void cl_alloc_reset(void) {
    heap_drop();
}
