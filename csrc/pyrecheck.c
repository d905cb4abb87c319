/* pyrecheck.c -- what a recheck of share()'s walk reads: where a root's
 * entries lie, and the digests of a read table's pages.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A walk of a
 * dict or list root in C (pywalk.c, clamor_py_walk_tagged) tags each range
 * it read with the root's entry it came through.  Before the next version
 * the driver asks which of those ranges changed: clamor_py_digest_runs()
 * gives a digest of each page's ranges (clamor/memory/readtable.py), and
 * clamor_py_root_slots() says which bytes of the root's table hold which
 * entry, so that a write to one entry sends only that entry to be walked
 * again (clamor/memory/walk.py).  Neither walks anything: the walk itself
 * is pywalk.c's.  clamor_py_sort_by_page() puts a walk's ranges in a read
 * table's order: by page, stably (a counting sort).
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- where a root's entries lie ------------------------------------------------ */

/* Entry i of the dict or list `root` occupies [*first + i * *stride, + *stride)
 * for i < *count.  0, or -1: not known here (another layout, a split or
 * foreign table); the caller walks the root whole. */
int clamor_py_root_slots(uintptr_t root, uint64_t *first, uint64_t *stride, int64_t *count) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = (PyObject *)root;
    int rc = -1;
    if (PyList_CheckExact(o)) {
        *first = (uint64_t)(uintptr_t)((PyListObject *)o)->ob_item;
        *stride = sizeof(PyObject *);
        *count = PyList_GET_SIZE(o);
        rc = 0;
    } else if (PyDict_CheckExact(o) && !((PyDictObject *)o)->ma_values &&
               cl_in_region_span((uintptr_t)((PyDictObject *)o)->ma_keys, 1)) {
        struct cl_dict_keys *k = (struct cl_dict_keys *)((PyDictObject *)o)->ma_keys;
        size_t size = k->dk_kind == 0 ? 3 * sizeof(void *) : 2 * sizeof(void *), key_at = k->dk_kind == 0 ? 8 : 0;
        uintptr_t e0 = (uintptr_t)k->dk_indices + ((size_t)1 << k->dk_log2_index_bytes);
        uintptr_t start;
        size_t block;
        int ok = k->dk_kind <= 1 && k->dk_log2_index_bytes < 40 && clamor_block_of(k, &start, &block) == 0 &&
                 k->dk_nentries >= 0 && e0 + (size_t)k->dk_nentries * size <= start + block;
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        for (int checked = 0; ok && checked < 4 && PyDict_Next(o, &pos, &key, &val); checked++) {
            PyObject **slot = (PyObject **)(e0 + (size_t)(pos - 1) * size + key_at);
            ok = slot[0] == key && slot[1] == val;
        }
        if (ok) {
            *first = e0;
            *stride = size;
            *count = k->dk_nentries;
            rc = 0;
        }
    }
    PyGILState_Release(g);
    return rc;
}

/* ---- the digests of a read table's pages ------------------------------------ */

/* A 128-bit digest of the bytes of ranges[0..n) ((start, length) pairs),
 * for walk.read_digests: did a walk's bytes change?  Two 64-bit lanes of a
 * multiply-rotate hash over 8-byte words (the tail byte by byte), each range's
 * length mixed in.  Not cryptographic: the driver's own bytes, compared with
 * themselves. */
static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static void digest(const uint64_t *ranges, size_t n, uint64_t *out) {
    uint64_t a = 0x9E3779B97F4A7C15ull, b = 0xC2B2AE3D27D4EB4Full;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = (const unsigned char *)(uintptr_t)ranges[2 * i];
        uint64_t len = ranges[2 * i + 1];
        a = rotl(a ^ len, 27) * 0x100000001B3ull;
        b = rotl(b + len, 31) * 0x9E3779B97F4A7C15ull;
        size_t k = 0;
        for (; k + 8 <= len; k += 8) {
            uint64_t w;
            memcpy(&w, p + k, 8);
            a = rotl(a ^ (w * 0x87C37B91114253D5ull), 31) * 0x4CF5AD432745937Full;
            b = rotl(b + (w ^ (w >> 29)), 27) * 0x9FB21C651E98DF25ull + a;
        }
        for (; k < len; k++) {
            a = (a ^ p[k]) * 0x100000001B3ull;
            b = rotl(b + p[k], 13) * 0x9E3779B97F4A7C15ull;
        }
    }
    a ^= a >> 33;
    a *= 0xFF51AFD7ED558CCDull;
    a ^= a >> 33;
    b ^= b >> 29;
    b *= 0xC4CEB9FE1A85EC53ull;
    b ^= b >> 32;
    out[0] = a;
    out[1] = b;
}

/* The digests of runs of ranges (a read table's pages, walk.ReadTable):
 * for each k < n, run which[k] is ranges[starts[which[k]] .. starts[which[k] + 1]),
 * its digest goes to out[2k], out[2k + 1]. */
void clamor_py_digest_runs(const uint64_t *ranges, const uint64_t *starts, const uint64_t *which, size_t n,
                           uint64_t *out) {
    for (size_t k = 0; k < n; k++) {
        uint64_t i = which[k];
        digest(ranges + 2 * starts[i], starts[i + 1] - starts[i], out + 2 * k);
    }
}

/* ---- a read table's order ----------------------------------------------------- */

int clamor_py_sort_by_page(const uint64_t *ranges, const int32_t *tags, const uint8_t *skip, size_t n,
                           struct clamor_pagesort *out) {
    memset(out, 0, sizeof *out);
    uint64_t lo = UINT64_MAX, hi = 0;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i]) continue;
        kept++;
        if (!cl_in_region_span(ranges[2 * i], 1)) return EINVAL;
        uint64_t p = cl_page_of(ranges[2 * i]);
        if (p < lo) lo = p;
        if (p > hi) hi = p;
    }
    if (!kept) return 0;
    size_t span = (size_t)(hi - lo) + 1;
    size_t *count = calloc(span + 1, sizeof *count);
    out->ranges = malloc(2 * kept * sizeof *out->ranges);
    out->tags = tags ? malloc(kept * sizeof *out->tags) : NULL;
    if (!count || !out->ranges || (tags && !out->tags)) goto nomem;
    for (size_t i = 0; i < n; i++)
        if (!skip || !skip[i]) count[cl_page_of(ranges[2 * i]) - lo + 1]++;
    size_t npages = 0;
    for (size_t d = 0; d < span; d++) {
        npages += count[d + 1] != 0;
        count[d + 1] += count[d];
    }
    out->pages = malloc(npages * sizeof *out->pages);
    out->starts = malloc((npages + 1) * sizeof *out->starts);
    if (!out->pages || !out->starts) goto nomem;
    for (size_t d = 0; d < span; d++)
        if (count[d + 1] != count[d]) {
            out->pages[out->npages] = lo + d;
            out->starts[out->npages++] = count[d];
        }
    out->starts[npages] = kept;
    for (size_t i = 0; i < n; i++) { /* stable: each page's ranges in the walk's order */
        if (skip && skip[i]) continue;
        size_t at = count[cl_page_of(ranges[2 * i]) - lo]++;
        out->ranges[2 * at] = ranges[2 * i];
        out->ranges[2 * at + 1] = ranges[2 * i + 1];
        if (tags) out->tags[at] = tags[i];
    }
    out->n = kept;
    free(count);
    return 0;
nomem:
    free(count);
    clamor_py_pagesort_free(out);
    return ENOMEM;
}

void clamor_py_pagesort_free(struct clamor_pagesort *s) {
    free(s->ranges);
    free(s->tags);
    free(s->pages);
    free(s->starts);
    memset(s, 0, sizeof *s);
}

#endif /* CLAMOR_WITH_PYTHON */
