/* pyrelist.c -- a portable walk's relocation words, found, sorted and
 * grouped by page in one pass of C (clamor/memory/_relocentries.py).
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  The walk
 * (pywalk.c) gives extents to read, each with a strictness byte and the
 * root's entry it was reached through, and the words a worker reads as
 * null.  What a page's relocation list needs of them is:
 *
 *   - every word of the extents that points at a target (the binary search
 *     of pyreloc.c's clamor_py_match, with the last target hit tried first:
 *     most words are type words of a few types), with its target;
 *   - the null words, target 0;
 *   - those, sorted by address, each address once: a null word first, then
 *     the first extent's (the order of portable._match's reference);
 *   - the words of strict extents that point into private memory and are
 *     no null word (a refusal: "bad"), in the extents' order.
 *
 * The sort packs (word's offset from the lowest word, in words) << 32 |
 * (its place in that order) into one 64-bit key and sorts the keys by
 * their upper half, 11 bits a pass (a stable LSD radix sort), so equal
 * addresses keep their first order and the first one is kept.  With
 * want_pages, the pages the sorted words lie in come too, each with where
 * its words end (clamor_reloc_set_words makes the lists from them).
 *
 * Every array handed back is malloc'd: clamor_py_buffer_free frees it
 * (Python's owner of the numpy view over it).  No Python object is
 * touched and the GIL is not needed: cffi releases it for the call, so the
 * cluster's heartbeats go on through it.
 */
#ifdef CLAMOR_WITH_PYTHON
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void clamor_py_buffer_free(void *p) { free(p); }

/* The target range holding w, or -1; *last: the one hit before. */
static inline long find_target(uintptr_t w, const uintptr_t *lo, const uintptr_t *hi, size_t n, long *last) {
    long k = *last;
    if (k >= 0 && w >= lo[k] && w < hi[k]) return k;
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (w < lo[m]) b = m;
        else if (w >= hi[m]) a = m + 1;
        else return *last = (long)m;
    }
    return -1;
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Sort keys[0..n) by key >> seq_bits (each lo or more, at most lo + span),
 * stably: LSD, in as few passes of at most 15 bits as span needs (a pass
 * is a read and a scattered write of every key: fewer, wider passes win
 * while the counts stay in cache).  0, or -1 out of memory. */
static int sort_keys(uint64_t *keys, size_t n, unsigned seq_bits, uint64_t lo, uint64_t span) {
    unsigned bits = 1;
    while (bits < 64 && span >> bits) bits++;
    unsigned passes = (bits + 14) / 15, digit = (bits + passes - 1) / passes;
    size_t nb = (size_t)1 << digit;
    uint64_t *tmp = malloc(n * sizeof *tmp);
    size_t *count = malloc((nb + 1) * sizeof *count);
    if (!tmp || !count) {
        free(tmp);
        free(count);
        return -1;
    }
    uint64_t *src = keys, *dst = tmp, mask = nb - 1;
    for (unsigned pass = 0, shift = 0; pass < passes; pass++, shift += digit) {
        memset(count, 0, (nb + 1) * sizeof *count);
        for (size_t i = 0; i < n; i++) count[((((src[i] >> seq_bits) - lo) >> shift) & mask) + 1]++;
        for (size_t d = 0; d < nb; d++) count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) dst[count[(((src[i] >> seq_bits) - lo) >> shift) & mask]++] = src[i];
        uint64_t *s = src;
        src = dst;
        dst = s;
    }
    if (src != keys) memcpy(keys, src, n * sizeof *keys);
    free(tmp);
    free(count);
    return 0;
}

static int page_cuts(struct clamor_relist *out);

/* The words found, before they are sorted: keys (the word's offset from
 * the region's base, in words) << seq_bits | (its place: the null words
 * first, then each extent's in order), and each place's target and tag
 * (g: tagged walks only); the words of strict extents into private memory
 * (bad). */
struct found {
    uint64_t *keys;
    uint32_t *t;
    int32_t *g;
    size_t m;
    unsigned seq_bits;
    uint64_t *bad;
    size_t nbad;
};

/* Fill f from the null words and the extents' words (arrays sized for every
 * word the extents hold: memory never touched costs nothing, and nothing is
 * copied as they grow).  0, ENOMEM, EINVAL (a word outside the region) or
 * E2BIG (more places than the keys hold). */
static int scan(struct found *f, const uint64_t *ext, const uint8_t *strict, const int32_t *tags, size_t n,
                const uint64_t *nulls, const int32_t *null_tags, size_t nnulls, const uintptr_t *tlo,
                const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv) {
    unsigned wbits = 1;
    while (wbits < 64 && (cl_region.size >> 3) >> wbits) wbits++;
    unsigned sb = f->seq_bits = 64 - wbits;
    size_t cap = nnulls;
    for (size_t i = 0; i < n; i++) cap += ext[2 * i + 1] / 8 + 1;
    if (sb < 20 || cap >> sb) return E2BIG;
    f->keys = malloc((cap ? cap : 1) * sizeof *f->keys);
    f->t = malloc((cap ? cap : 1) * sizeof *f->t);
    f->g = tags ? malloc((cap ? cap : 1) * sizeof *f->g) : NULL;
    if (!f->keys || !f->t || (tags && !f->g)) return ENOMEM;
    for (size_t j = 0; j < nnulls; j++, f->m++) {
        if (!cl_in_region_span(nulls[j], 8)) return EINVAL;
        f->keys[f->m] = ((nulls[j] - cl_region.base) >> 3) << sb | f->m;
        f->t[f->m] = 0;
        if (f->g) f->g[f->m] = null_tags[j];
    }
    uintptr_t tmin = nt ? tlo[0] : 1, tmax = nt ? thi[nt - 1] : 0;
    long last = -1;
    for (size_t i = 0; i < n; i++) {
        uintptr_t p = (ext[2 * i] + 7) & ~(uintptr_t)7, end = ext[2 * i] + ext[2 * i + 1];
        if (p < end && !cl_in_region_span(p, end - p)) return EINVAL;
        for (; p + 8 <= end; p += 8) {
            uintptr_t w = *(const uintptr_t *)p;
            if (w < 4096 || cl_in_region(w)) continue;
            long k = w >= tmin && w < tmax ? find_target(w, tlo, thi, nt, &last) : -1;
            if (k >= 0) {
                f->keys[f->m] = ((p - cl_region.base) >> 3) << sb | f->m;
                f->t[f->m] = tid[k];
                if (f->g) f->g[f->m] = tags[i];
                f->m++;
            } else if (strict[i] && npriv && cl_in_ranges(w, priv, npriv)) {
                if (!f->bad && !(f->bad = malloc(cap * sizeof *f->bad))) return ENOMEM;
                f->bad[f->nbad++] = p;
            }
        }
    }
    return 0;
}

/* The refusals: f's words into private memory that are no null word (a
 * worker reads those null), into out->bad in order.  0, or ENOMEM. */
static int refusals(struct found *f, const uint64_t *nulls, size_t nnulls, struct clamor_relist *out) {
    if (!f->nbad) return 0;
    uint64_t *sorted = malloc((nnulls ? nnulls : 1) * sizeof *sorted);
    if (!sorted) return ENOMEM;
    if (nnulls) memcpy(sorted, nulls, nnulls * sizeof *nulls);
    qsort(sorted, nnulls, sizeof *sorted, cmp_u64);
    for (size_t i = 0; i < f->nbad; i++)
        if (!cl_sorted_has(sorted, nnulls, f->bad[i])) f->bad[out->nbad++] = f->bad[i];
    free(sorted);
    if (out->nbad) {
        out->bad = f->bad;
        f->bad = NULL;
    }
    return 0;
}

/* f's words sorted by address, each once (the first place's target and
 * tag), into out (addrs: f's keys, rewritten in place).  0, or ENOMEM. */
static int unique_words(struct found *f, struct clamor_relist *out) {
    if (!f->m) return 0;
    unsigned sb = f->seq_bits;
    uint64_t lo = f->keys[0] >> sb, hi = lo;
    for (size_t i = 1; i < f->m; i++) {
        uint64_t w = f->keys[i] >> sb;
        if (w < lo) lo = w;
        if (w > hi) hi = w;
    }
    if (sort_keys(f->keys, f->m, sb, lo, hi - lo) < 0) return ENOMEM;
    uint64_t seq_mask = ((uint64_t)1 << sb) - 1;
    out->tids = malloc(f->m * sizeof *out->tids);
    out->tags = f->g ? malloc(f->m * sizeof *out->tags) : NULL;
    if (!out->tids || (f->g && !out->tags)) return ENOMEM;
    size_t u = 0;
    for (size_t i = 0; i < f->m; i++) {
        uint64_t w = f->keys[i] >> sb;
        if (u && w == (f->keys[u - 1] - cl_region.base) >> 3) continue;
        size_t at = (size_t)(f->keys[i] & seq_mask);
        out->tids[u] = f->t[at];
        if (f->g) out->tags[u] = f->g[at];
        f->keys[u++] = cl_region.base + (w << 3);
    }
    out->addrs = f->keys;
    f->keys = NULL;
    out->n = u;
    return 0;
}

/* The targets out's words name, each once, ascending.  0, or ENOMEM. */
static int targets_named(struct clamor_relist *out) {
    if (!out->n) return 0;
    uint32_t top = 0;
    for (size_t i = 0; i < out->n; i++)
        if (out->tids[i] > top) top = out->tids[i];
    uint8_t *named = calloc((size_t)top + 1, 1);
    if (!named) return ENOMEM;
    size_t nn = 0;
    for (size_t i = 0; i < out->n; i++) {
        nn += !named[out->tids[i]];
        named[out->tids[i]] = 1;
    }
    out->targets = malloc(nn * sizeof *out->targets);
    if (out->targets)
        for (uint32_t k = 0; k <= top; k++)
            if (named[k]) out->targets[out->ntargets++] = k;
    free(named);
    return out->targets ? 0 : ENOMEM;
}

int clamor_py_reloc_words(const uint64_t *ext, const uint8_t *strict, const int32_t *tags, size_t n,
                          const uint64_t *nulls, const int32_t *null_tags, size_t nnulls, const uintptr_t *tlo,
                          const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv,
                          int want_pages, struct clamor_relist *out) {
    memset(out, 0, sizeof *out);
    struct found f = {0};
    int rc = scan(&f, ext, strict, tags, n, nulls, null_tags, nnulls, tlo, thi, tid, nt, priv, npriv);
    if (!rc) rc = refusals(&f, nulls, nnulls, out);
    if (!rc) rc = unique_words(&f, out);
    if (!rc) rc = targets_named(out);
    if (!rc && want_pages && page_cuts(out) < 0) rc = ENOMEM;
    free(f.keys);
    free(f.t);
    free(f.g);
    free(f.bad);
    if (rc) clamor_py_relist_free(out);
    return rc;
}

/* The page cuts of out->addrs[0..out->n) (ascending): out->pages, out->ends.
 * 0, or -1 out of memory. */
static int page_cuts(struct clamor_relist *out) {
    if (!out->n) return 0;
    size_t npages = 1;
    for (size_t i = 1; i < out->n; i++) npages += (out->addrs[i] ^ out->addrs[i - 1]) >> cl_region.page_shift != 0;
    out->pages = malloc(npages * sizeof *out->pages);
    out->ends = malloc(npages * sizeof *out->ends);
    if (!out->pages || !out->ends) return -1;
    for (size_t i = 0; i < out->n; i++) {
        uint64_t page = cl_page_of(out->addrs[i]);
        if (!out->npages || out->pages[out->npages - 1] != page) {
            if (out->npages) out->ends[out->npages - 1] = i;
            out->pages[out->npages++] = page;
        }
    }
    out->ends[out->npages - 1] = out->n;
    return 0;
}

static int has_tag(const int32_t *drop, size_t ndrop, int32_t g) {
    size_t lo = 0, hi = ndrop;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (drop[mid] < g) lo = mid + 1;
        else hi = mid;
    }
    return lo < ndrop && drop[lo] == g;
}

int clamor_py_reloc_splice(const uint64_t *a, const uint32_t *t, const int32_t *g, size_t n, const int32_t *drop,
                           size_t ndrop, const uint64_t *na, const uint32_t *nt, const int32_t *ng, size_t m,
                           struct clamor_relist *out) {
    memset(out, 0, sizeof *out);
    size_t cap = n + m ? n + m : 1, k = 0, j = 0, nb = 0;
    out->addrs = malloc(cap * sizeof *out->addrs);
    out->tids = malloc(cap * sizeof *out->tids);
    out->tags = malloc(cap * sizeof *out->tags);
    out->bad = malloc(cap * sizeof *out->bad); /* (here: the pages of the words gone and come, then deduplicated) */
    int rc = ENOMEM;
    if (!out->addrs || !out->tids || !out->tags || !out->bad) goto fail;
    for (size_t i = 0; i <= n; i++) {
        /* the new words before the next kept one (all of them at the end) */
        while (j < m && (i == n || na[j] <= a[i])) {
            if (i < n && na[j] == a[i] && !has_tag(drop, ndrop, g[i])) {
                rc = EEXIST; /* (a word both kept and found again: an object two entries share) */
                goto fail;
            }
            out->addrs[k] = na[j];
            out->tids[k] = nt[j];
            out->tags[k++] = ng[j];
            out->bad[nb++] = cl_page_of(na[j]);
            j++;
        }
        if (i == n) break;
        if (has_tag(drop, ndrop, g[i])) {
            out->bad[nb++] = cl_page_of(a[i]);
            continue;
        }
        out->addrs[k] = a[i];
        out->tids[k] = t[i];
        out->tags[k++] = g[i];
    }
    out->n = k;
    qsort(out->bad, nb, sizeof *out->bad, cmp_u64);
    for (size_t i = 0; i < nb; i++)
        if (!out->nbad || out->bad[out->nbad - 1] != out->bad[i]) out->bad[out->nbad++] = out->bad[i];
    if (page_cuts(out) < 0) goto fail;
    return 0;
fail:
    clamor_py_relist_free(out);
    return rc;
}

void clamor_py_relist_free(struct clamor_relist *l) {
    free(l->addrs);
    free(l->tids);
    free(l->tags);
    free(l->bad);
    free(l->pages);
    free(l->ends);
    free(l->targets);
    memset(l, 0, sizeof *l);
}
#endif /* CLAMOR_WITH_PYTHON */
