/* reloc.c -- relocations: region pages that hold pointers out of the region.
 *
 * DESIGN.  A Python object built under clamor.heap() points out of the
 * region: at its type, at None and small ints inside libpython, at a
 * numpy dtype inside numpy, at an interned string in the driver's heap.
 * A worker forked from the driver has all of those at the same addresses;
 * one that was not (spawned, on another host) has them elsewhere.  So the
 * driver lists, for every page that holds such pointers, each word and the
 * target it points at (an image, or an object the worker finds by import
 * or makes equal: clamor/memory/portable.py finds them), and a worker that
 * asks (CL_WIRE_RELOC) gets the list with the page and rewrites each word
 * against its own address space before the page becomes visible.  This is
 * pointer swizzling at page-fault time, with the pointer map of the JDK's
 * class-data-sharing archive in place of type descriptors.
 *
 * An entry is (word within the page, target, the driver's word).  A worker
 * writes local[target] + (word - driver[target]); target 0 is "null" (the
 * driver's garbage-collector links of region objects: a worker sees them
 * untracked).  Keeping the driver's word makes a worker's list
 * self-contained: a worker serving a peer that wants the driver's bytes (a
 * forked one) puts them back, and a peer that relocates overwrites every
 * listed word anyway.  The driver keeps only each entry's word and target,
 * and a sum of the listed words' values: its words are the bytes it serves,
 * which must sum alike, and go into the frame from those bytes (8 bytes an
 * entry kept, not 16; a walk of 10^7 entries lists 5 * 10^7 words).
 *
 * Driver: each page's list has a history by version (a list is valid from
 * the version it was computed at until a newer one replaces it), so that a
 * request of an older version gets the list of the version it is served;
 * clamor_reloc_prune drops what no kept version can ask for.
 * Worker: one list per page it holds, replaced when the page is fetched
 * again, served to peers with the page.
 *
 * Locks: one mutex, taken by Python's calls, the page server and the
 * pager; never by the fault handler.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "wire.h"

/* A page's list.  A worker's holds whole entries (e[]: it serves the
 * driver's words back).  The driver's is compact: each entry's word and
 * target (cw(l)[], 8 bytes), and a sum of its non-null words' values as
 * listed; the values themselves are the page's bytes of the version the
 * list is served with, which must sum alike (list_sum). */
struct rlist {
    struct rlist *next; /* driver: older lists of the page */
    uint32_t from;      /* driver: first version it is valid at */
    uint32_t n;
    uint64_t sum;       /* driver: list_sum of its words as listed */
    int compact;
    struct clamor_reloc e[]; /* (compact: struct cw[n]) */
};

struct cw {
    uint32_t word, target;
};

static inline struct cw *cw(const struct rlist *l) { return (struct cw *)(void *)l->e; }
static inline uint32_t word_of(const struct rlist *l, uint32_t i) { return l->compact ? cw(l)[i].word : l->e[i].word; }
static inline uint32_t target_of(const struct rlist *l, uint32_t i) {
    return l->compact ? cw(l)[i].target : l->e[i].target;
}

/* A sum of the (word, value) pairs of a list's non-null entries, the
 * values read from page (a list and the bytes it goes with agree when
 * their sums do).  Null entries are the collector's links, which the
 * driver rewrites at any time, and which read null anyway. */
static uint64_t list_sum(const struct rlist *l, const char *page) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ l->n;
    for (uint32_t i = 0; i < l->n; i++) {
        if (!target_of(l, i)) continue;
        uint64_t w, x;
        memcpy(&w, page + (size_t)word_of(l, i) * 8, 8);
        x = (w ^ ((uint64_t)word_of(l, i) << 40)) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (x ^ (x >> 31))) * 0x94D049BB133111EBull;
    }
    return h;
}

static struct {
    pthread_mutex_t lock;
    struct rlist **page; /* per page: newest list, or NULL */
    uint64_t npages;
    uint64_t *touched;   /* driver: pages that have a history */
    size_t ntouched, captouched;
    uint64_t *tdrv, *tloc; /* worker: per target, driver's and local address */
    uint8_t *tset;
    uint32_t ntargets;
} R = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The lock is held across fork(), as the allocator's is (alloc.c): a worker
 * forked while the driver's page server listed a page's relocations would
 * otherwise start with it held, and its own page server would wait on it
 * for ever at its first request from a worker that relocates. */
static void reloc_prefork(void) { pthread_mutex_lock(&R.lock); }
static void reloc_postfork(void) { pthread_mutex_unlock(&R.lock); }
__attribute__((constructor)) static void reloc_atfork(void) {
    pthread_atfork(reloc_prefork, reloc_postfork, reloc_postfork);
}

static int ensure_pages(void) {
    if (R.page && R.npages == cl_region.npages) return 0;
    if (R.page) return cl_err(EBUSY, "relocations of another region are still held");
    void *m = mmap(NULL, cl_region.npages * sizeof(void *), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return cl_err(ENOMEM, "cannot map the relocation table");
    R.page = m;
    R.npages = cl_region.npages;
    return 0;
}

static void free_chain(struct rlist *l) {
    while (l) {
        struct rlist *n = l->next;
        free(l);
        l = n;
    }
}

static struct rlist *make(uint32_t from, const struct clamor_reloc *e, uint32_t n) {
    struct rlist *l = malloc(sizeof *l + (size_t)n * sizeof *e);
    if (!l) return NULL;
    l->next = NULL;
    l->from = from;
    l->n = n;
    l->sum = 0;
    l->compact = 0;
    if (n) memcpy(l->e, e, (size_t)n * sizeof *e);
    return l;
}

/* The driver's list of entries e[0..n) of `page`, compact, summed over the
 * page's bytes now (the entries' values are those bytes). */
static struct rlist *make_compact(uint32_t from, const struct clamor_reloc *e, uint32_t n, const char *page) {
    struct rlist *l = malloc(sizeof *l + (size_t)n * sizeof(struct cw));
    if (!l) return NULL;
    l->next = NULL;
    l->from = from;
    l->n = n;
    l->compact = 1;
    for (uint32_t i = 0; i < n; i++) cw(l)[i] = (struct cw){e[i].word, e[i].target};
    l->sum = list_sum(l, page);
    return l;
}

static int install(uint32_t version, uint64_t page, struct rlist *l);

int clamor_reloc_set(uint32_t version, uint64_t page, const struct clamor_reloc *e, uint32_t n) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER) return cl_err(EPERM, "only the driver lists relocations");
    if (page >= cl_region.npages) return cl_err(ERANGE, "page %llu is outside the region", (unsigned long long)page);
    uint64_t words = cl_region.page_size / 8;
    for (uint32_t i = 0; i < n; i++)
        if (e[i].word >= words) return cl_err(EINVAL, "relocation word %u is outside the page", e[i].word);
    /* (each listed word must hold its value now: the list is summed over the page's bytes) */
    const char *bytes = cl_page_addr(page);
    for (uint32_t i = 0; i < n; i++)
        if (e[i].target && memcmp(bytes + (size_t)e[i].word * 8, &e[i].value, 8))
            return cl_err(EINVAL, "relocation word %u does not hold the value listed", e[i].word);
    struct rlist *l = make_compact(version, e, n, bytes);
    if (!l) return cl_err(ENOMEM, "out of memory for relocations");
    return install(version, page, l);
}

/* Put list l (owned) as page's newest at version. */
static int install(uint32_t version, uint64_t page, struct rlist *l) {
    if (l->n) cl_map_mark_reloc(page); /* a worker that relocates fetches it */
    pthread_mutex_lock(&R.lock);
    int rc = ensure_pages();
    if (rc) {
        pthread_mutex_unlock(&R.lock);
        free(l);
        return rc;
    }
    struct rlist *old = R.page[page];
    if (!old && R.ntouched == R.captouched) {
        size_t cap = R.captouched ? 2 * R.captouched : 1024;
        uint64_t *t = realloc(R.touched, cap * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&R.lock);
            free(l);
            return cl_err(ENOMEM, "out of memory for relocations");
        }
        R.touched = t;
        R.captouched = cap;
    }
    if (!old) R.touched[R.ntouched++] = page;
    if (old && old->from >= version) { /* a newer computation for the same version replaces it */
        l->next = old->next;
        free(old);
    } else {
        l->next = old;
    }
    R.page[page] = l;
    pthread_mutex_unlock(&R.lock);
    /* A worker that holds the page has it relocated by the old list: no
     * peer serves it at this version or later (the driver sends the workers
     * that hold it word to drop it). */
    cl_dir_changed(page, version);
    return 0;
}

int clamor_reloc_set_words(uint32_t version, const uint64_t *pages, size_t npages, const uint64_t *addrs,
                           const uint32_t *tids, size_t n, uint8_t *changed, uint32_t *counts) {
    if (cl_region.role != CLAMOR_ROLE_DRIVER) return cl_err(EPERM, "only the driver lists relocations");
    uint64_t words = cl_region.page_size / 8;
    struct clamor_reloc *scratch = malloc(words * sizeof *scratch);
    if (!scratch) return cl_err(ENOMEM, "out of memory for relocations");
    size_t at = 0;
    int rc = 0;
    for (size_t k = 0; k < npages && !rc; k++) {
        uint64_t page = pages[k];
        if (page >= cl_region.npages || (k && page <= pages[k - 1])) {
            rc = cl_err(EINVAL, "the pages to list are not ascending pages of the region");
            break;
        }
        /* (words of pages not asked for are skipped: the first of this page's found by bisection) */
        uint64_t first = (uint64_t)(uintptr_t)cl_page_addr(page);
        for (size_t hi = n; at < hi;) {
            size_t mid = at + (hi - at) / 2;
            if (addrs[mid] < first) at = mid + 1;
            else hi = mid;
        }
        uint32_t c = 0;
        for (; at < n && cl_page_of(addrs[at]) == page; at++) {
            uint64_t w = (addrs[at] - cl_region.base) >> 3 & (words - 1);
            if (addrs[at] & 7 || (c && w <= scratch[c - 1].word)) {
                rc = cl_err(EINVAL, "relocation words are not ascending aligned words");
                break;
            }
            scratch[c].word = (uint32_t)w;
            scratch[c].target = tids[at];
            memcpy(&scratch[c].value, (const void *)(uintptr_t)addrs[at], 8);
            c++;
        }
        if (rc) break;
        counts[k] = c;
        struct rlist *l = make_compact(version, scratch, c, cl_page_addr(page));
        if (!l) {
            rc = cl_err(ENOMEM, "out of memory for relocations");
            break;
        }
        pthread_mutex_lock(&R.lock);
        const struct rlist *old = R.page && page < R.npages ? R.page[page] : NULL;
        bool same = old ? old->compact && old->n == c && old->sum == l->sum &&
                              !memcmp(old->e, l->e, (size_t)c * sizeof(struct cw))
                        : c == 0;
        pthread_mutex_unlock(&R.lock);
        changed[k] = !same;
        if (same) {
            free(l);
            continue;
        }
        rc = install(version, page, l);
    }
    free(scratch);
    return rc;
}

int clamor_reloc_list(uint64_t page, uint32_t version, struct clamor_reloc *out, uint32_t max, uint32_t *n) {
    *n = 0;
    pthread_mutex_lock(&R.lock);
    const struct rlist *l = R.page && page < R.npages ? R.page[page] : NULL, *oldest = l;
    while (l && l->from > version) {
        oldest = l;
        l = l->next;
    }
    if (!l) l = oldest;
    int rc = 0;
    if (l) {
        *n = l->n;
        if (l->n > max) rc = ERANGE;
        else if (!l->compact && l->n) memcpy(out, l->e, (size_t)l->n * sizeof *out);
        else /* (a driver's list: the values are the page's bytes now) */
            for (uint32_t i = 0; i < l->n; i++) {
                out[i].word = cw(l)[i].word;
                out[i].target = cw(l)[i].target;
                memcpy(&out[i].value, cl_page_addr(page) + (size_t)cw(l)[i].word * 8, 8);
            }
    }
    pthread_mutex_unlock(&R.lock);
    return rc;
}

void clamor_reloc_prune(uint32_t floor) {
    pthread_mutex_lock(&R.lock);
    for (size_t i = 0; R.page && i < R.ntouched; i++) {
        struct rlist *l = R.page[R.touched[i]];
        while (l && l->from > floor) l = l->next; /* the list a request at `floor` gets */
        if (l) {
            free_chain(l->next);
            l->next = NULL;
        }
    }
    pthread_mutex_unlock(&R.lock);
}

size_t clamor_reloc_nbytes(void) {
    pthread_mutex_lock(&R.lock);
    size_t n = R.captouched * sizeof *R.touched + R.ntouched * sizeof *R.page;
    for (size_t i = 0; R.page && i < R.ntouched; i++)
        for (struct rlist *l = R.page[R.touched[i]]; l; l = l->next)
            n += sizeof *l + (size_t)l->n * (l->compact ? sizeof(struct cw) : sizeof l->e[0]);
    pthread_mutex_unlock(&R.lock);
    return n;
}

void clamor_reloc_reset(void) {
    pthread_mutex_lock(&R.lock);
    if (R.page) {
        for (uint64_t i = 0; i < R.npages; i++)
            if (R.page[i]) free_chain(R.page[i]);
        munmap(R.page, R.npages * sizeof(void *));
    }
    R.page = NULL;
    R.npages = 0;
    free(R.touched);
    R.touched = NULL;
    R.ntouched = R.captouched = 0;
    free(R.tdrv);
    free(R.tloc);
    free(R.tset);
    R.tdrv = R.tloc = NULL;
    R.tset = NULL;
    R.ntargets = 0;
    cl_option_set(CL_OPT_RELOC, 0);
    pthread_mutex_unlock(&R.lock);
}

int clamor_reloc_bind(uint32_t target, uint64_t driver_addr, uint64_t local_addr) {
    if (target == 0) return cl_err(EINVAL, "target 0 is null, it cannot be bound");
    if (target > 1u << 26) return cl_err(ERANGE, "relocation target %u is out of range", target);
    pthread_mutex_lock(&R.lock);
    if (target >= R.ntargets) {
        uint32_t cap = R.ntargets ? R.ntargets : 256;
        while (cap <= target) cap *= 2;
        uint64_t *d = realloc(R.tdrv, cap * sizeof *d), *l = d ? realloc(R.tloc, cap * sizeof *l) : NULL;
        uint8_t *s = l ? realloc(R.tset, cap) : NULL;
        if (d) R.tdrv = d;
        if (l) R.tloc = l;
        if (!s) {
            pthread_mutex_unlock(&R.lock);
            return cl_err(ENOMEM, "out of memory for relocation targets");
        }
        memset(s + R.ntargets, 0, cap - R.ntargets);
        R.tset = s;
        R.ntargets = cap;
    }
    R.tdrv[target] = driver_addr;
    R.tloc[target] = local_addr;
    R.tset[target] = 1;
    pthread_mutex_unlock(&R.lock);
    return 0;
}


/* ---- the data plane (server and pager threads) ------------------------------- */

/* Does every word the list names hold the driver's word it recorded?
 * (Null entries are garbage-collector links, which the driver's collector
 * rewrites at any time, and which read null anyway.)  A driver's list
 * answers by its sum. */
static bool matches(const struct rlist *l, const char *page) {
    if (l->compact) return list_sum(l, page) == l->sum;
    for (uint32_t i = 0; i < l->n; i++) {
        if (!l->e[i].target) continue;
        uint64_t w;
        memcpy(&w, page + (size_t)l->e[i].word * 8, 8);
        if (w != l->e[i].value) return false;
    }
    return true;
}

size_t cl_reloc_frame(uint64_t first, uint32_t count, uint32_t version, const char *data, void **out, int *err) {
    /* [u32 n][n entries]: word counted from the start of the reply's data */
    *err = 0;
    *out = NULL;
    pthread_mutex_lock(&R.lock);
    size_t n = 0;
    uint64_t words = cl_region.page_size / 8;
    struct rlist *pick[CL_WIRE_MAX_COUNT];
    for (uint32_t k = 0; k < count; k++) {
        struct rlist *l = R.page && first + k < R.npages ? R.page[first + k] : NULL;
        if (cl_region.role == CLAMOR_ROLE_DRIVER && l && !data) { /* (the caller has no bytes: asked again with) */
            pthread_mutex_unlock(&R.lock);
            *err = EAGAIN;
            return 0;
        }
        if (cl_region.role == CLAMOR_ROLE_DRIVER && l) {
            /* The list of the version: the newest from that version
             * or before, else (a list first made later, for objects that
             * were there already) the oldest.  Whichever it is must agree
             * with the bytes served, word for word, or none is sent: a
             * relocation applied to the wrong bytes would corrupt them. */
            const char *page = data + (size_t)k * cl_region.page_size;
            struct rlist *c = l, *oldest = l;
            while (c && c->from > version) {
                oldest = c;
                c = c->next;
            }
            if (!c) c = oldest;
            if (!matches(c, page)) {
                for (c = l; c && !matches(c, page); c = c->next) {}
            }
            if (!c) {
                pthread_mutex_unlock(&R.lock);
                *err = ENOTRECOVERABLE;
                return 0;
            }
            l = c;
        }
        pick[k] = l;
        if (l) n += l->n;
    }
    size_t bytes = 4 + n * sizeof(struct clamor_reloc);
    uint8_t *b = malloc(bytes);
    if (!b) {
        pthread_mutex_unlock(&R.lock);
        *err = ENOMEM;
        return 0;
    }
    uint32_t n32 = (uint32_t)n;
    memcpy(b, &n32, 4);
    struct clamor_reloc *o = (struct clamor_reloc *)(b + 4);
    for (uint32_t k = 0; k < count; k++)
        for (uint32_t i = 0; pick[k] && i < pick[k]->n; i++) {
            if (pick[k]->compact) { /* (the driver's words are the bytes served, which match the list) */
                o->word = cw(pick[k])[i].word;
                o->target = cw(pick[k])[i].target;
                memcpy(&o->value, data + ((size_t)k * words + o->word) * 8, 8);
            } else {
                *o = pick[k]->e[i];
            }
            o->word += (uint32_t)(k * words);
            o++;
        }
    pthread_mutex_unlock(&R.lock);
    *out = b;
    return bytes;
}

void cl_reloc_restore(uint64_t first, uint32_t count, char *data) {
    uint64_t words = cl_region.page_size / 8;
    pthread_mutex_lock(&R.lock);
    for (uint32_t k = 0; R.page && k < count; k++) {
        struct rlist *l = first + k < R.npages ? R.page[first + k] : NULL;
        for (uint32_t i = 0; l && !l->compact && i < l->n; i++) /* (a driver's are its bytes already) */
            memcpy(data + ((size_t)k * words + l->e[i].word) * 8, &l->e[i].value, 8);
    }
    pthread_mutex_unlock(&R.lock);
}

int cl_reloc_apply(uint64_t first, uint32_t count, char *data, size_t len, const void *frame, size_t flen) {
    uint32_t n;
    if (flen < 4) return EBADMSG;
    memcpy(&n, frame, 4);
    if (flen != 4 + (size_t)n * sizeof(struct clamor_reloc)) return EBADMSG;
    const struct clamor_reloc *e = (const struct clamor_reloc *)((const char *)frame + 4);
    uint64_t words = cl_region.page_size / 8, total = len / 8;
    pthread_mutex_lock(&R.lock);
    int rc = ensure_pages();
    for (uint32_t i = 0; !rc && i < n; i++) {
        struct clamor_reloc r;
        memcpy(&r, e + i, sizeof r);
        if (r.word >= total) {
            rc = EBADMSG;
            break;
        }
        uint64_t v = 0;
        if (r.target) {
            if (r.target >= R.ntargets || !R.tset[r.target]) {
                rc = cl_err(ENOKEY, "page %llu points at relocation target %u, which this worker has not bound",
                            (unsigned long long)(first + r.word / words), r.target);
                break;
            }
            v = R.tloc[r.target] + (r.value - R.tdrv[r.target]);
        }
        memcpy(data + (size_t)r.word * 8, &v, 8);
    }
    /* keep each page's list, in its own numbering, for serving peers */
    size_t i = 0;
    for (uint32_t k = 0; !rc && k < count; k++) {
        size_t j = i;
        while (j < n && e[j].word / words == k) j++;
        struct rlist *l = make(0, e + i, (uint32_t)(j - i));
        for (uint32_t m = 0; l && m < l->n; m++) l->e[m].word -= (uint32_t)(k * words);
        if (!l) {
            rc = ENOMEM;
            break;
        }
        free_chain(R.page[first + k]);
        R.page[first + k] = l;
        i = j;
    }
    if (!rc && i != n) rc = EBADMSG; /* entries out of order */
    pthread_mutex_unlock(&R.lock);
    return rc;
}

bool cl_reloc_held(uint64_t first, uint32_t count) {
    pthread_mutex_lock(&R.lock);
    bool ok = R.page != NULL;
    for (uint32_t k = 0; ok && k < count; k++) ok = R.page[first + k] != NULL;
    pthread_mutex_unlock(&R.lock);
    return ok;
}
