/* pyreloc.c -- what clamor/memory/portable.py needs from C to list a
 * page's relocations: the loaded images, and a scan that finds the words
 * pointing at relocation targets.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).
 *
 * clamor_py_images() lists every ELF object of the process (dl_iterate_phdr):
 * its load base and the hull of its PT_LOAD segments, .bss included, which
 * /proc/self/maps shows as an anonymous mapping that could not be told
 * from others.  A pointer into that hull is an offset into that image.
 *
 * clamor_py_match() reads every aligned word of [lo, lo+len) and reports
 * those that point at a target (sorted, disjoint ranges: an image's hull,
 * or an object's first byte) with the target's number, and those that
 * point into private memory outside the region and every target, with
 * CLAMOR_NO_TARGET.  Words into the region are not reported: a worker maps
 * the region at the driver's address.
 */
#ifdef CLAMOR_WITH_PYTHON
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL clamor_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#include "internal.h"

/* Offset of an ndarray's cached buffer description (numpy's, made when a
 * buffer of the array is taken: a worker starts without one). */
size_t clamor_py_array_cache_offset(void) { return offsetof(PyArrayObject_fields, _buffer_info); }

struct img_ctx {
    struct clamor_image *out;
    size_t max, n;
};

void cl_py_image_hull(const struct dl_phdr_info *info, uintptr_t *lo, uintptr_t *hi) {
    *lo = UINTPTR_MAX;
    *hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < *lo) *lo = a;
        if (a + ph->p_memsz > *hi) *hi = a + ph->p_memsz;
    }
}

static int one_image(struct dl_phdr_info *info, size_t size, void *arg) {
    struct img_ctx *c = arg;
    uintptr_t lo, hi;
    cl_py_image_hull(info, &lo, &hi);
    if (lo >= hi) return 0;
    if (c->n < c->max) {
        struct clamor_image *m = &c->out[c->n];
        m->base = info->dlpi_addr;
        m->lo = lo;
        m->hi = hi;
        snprintf(m->name, sizeof m->name, "%s", info->dlpi_name ? info->dlpi_name : "");
    }
    c->n++;
    return 0;
}

size_t clamor_py_images(struct clamor_image *out, size_t max) {
    struct img_ctx c = {out, max, 0};
    dl_iterate_phdr(one_image, &c);
    return c.n;
}

static long find(uintptr_t w, const uintptr_t *lo, const uintptr_t *hi, size_t n) {
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (w < lo[m]) b = m;
        else if (w >= hi[m]) a = m + 1;
        else return (long)m;
    }
    return -1;
}

size_t clamor_py_match(uintptr_t lo, size_t len, const uintptr_t *tlo, const uintptr_t *thi, const uint32_t *tid,
                       size_t nt, const uintptr_t *priv, size_t npriv, uintptr_t *at, uint32_t *id, size_t max,
                       size_t *done) {
    uintptr_t p = (lo + 7) & ~(uintptr_t)7, end = lo + len;
    uintptr_t tmin = nt ? tlo[0] : 1, tmax = nt ? thi[nt - 1] : 0;
    size_t n = 0;
    for (; p + 8 <= end && n < max; p += 8) {
        uintptr_t w = *(const uintptr_t *)p;
        if (w < 4096 || cl_in_region(w)) continue;
        long k = w >= tmin && w < tmax ? find(w, tlo, thi, nt) : -1;
        if (k >= 0) {
            at[n] = p;
            id[n++] = tid[k];
        } else if (npriv) { /* priv: sorted [lo, hi) pairs */
            size_t a = 0, b = npriv;
            while (a < b) {
                size_t m = (a + b) / 2;
                if (w < priv[2 * m]) b = m;
                else if (w >= priv[2 * m + 1]) a = m + 1;
                else {
                    at[n] = p;
                    id[n++] = CLAMOR_NO_TARGET;
                    break;
                }
            }
        }
    }
    *done = p + 8 > end ? len : p - lo; /* (a tail shorter than a word: scanned) */
    return n;
}
int clamor_py_match_all(const uint64_t *ext, const uint8_t *strict, size_t n, const uintptr_t *tlo,
                        const uintptr_t *thi, const uint32_t *tid, size_t nt, const uintptr_t *priv, size_t npriv,
                        uintptr_t at_out, uintptr_t id_out, uintptr_t which_out) {
    size_t cap = 4096, k = 0;
    uintptr_t *at = malloc(cap * sizeof *at);
    uint32_t *id = malloc(cap * sizeof *id), *which = malloc(cap * sizeof *which);
    int rc = at && id && which ? 0 : ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        size_t pos = 0, len = ext[2 * i + 1], done;
        while (!rc && pos < len) {
            if (cap - k < 512) {
                uintptr_t *a2 = realloc(at, 2 * cap * sizeof *at);
                if (a2) at = a2;
                uint32_t *i2 = a2 ? realloc(id, 2 * cap * sizeof *id) : NULL;
                if (i2) id = i2;
                uint32_t *w2 = i2 ? realloc(which, 2 * cap * sizeof *which) : NULL;
                if (w2) which = w2;
                if (!a2 || !i2 || !w2) {
                    rc = ENOMEM;
                    break;
                }
                cap *= 2;
            }
            size_t got = clamor_py_match(ext[2 * i] + pos, len - pos, tlo, thi, tid, nt, strict[i] ? priv : NULL,
                                         strict[i] ? npriv : 0, at + k, id + k, cap - k, &done);
            for (size_t j = k; j < k + got; j++) which[j] = (uint32_t)i;
            k += got;
            pos += done;
        }
    }
    if (!rc) {
        PyGILState_STATE g = PyGILState_Ensure();
        if (cl_py_to_bytearray(at_out, at, k * sizeof *at) < 0 || cl_py_to_bytearray(id_out, id, k * sizeof *id) < 0 ||
            (which_out && cl_py_to_bytearray(which_out, which, k * sizeof *which) < 0))
            rc = ENOMEM;
        PyGILState_Release(g);
    }
    free(at);
    free(id);
    free(which);
    return rc;
}
/* A stable sort of n words' addresses (LSD radix, 11 bits a pass, as many
 * passes as the largest offset from the smallest needs): order[] gets the
 * permutation that sorts them, equal addresses in their first order.
 * 0, or ENOMEM. */
int clamor_py_sort_words(const uint64_t *addrs, size_t n, uint32_t *order) {
    if (!n) return 0;
    uint64_t lo = addrs[0], hi = addrs[0];
    for (size_t i = 1; i < n; i++) {
        if (addrs[i] < lo) lo = addrs[i];
        if (addrs[i] > hi) hi = addrs[i];
    }
    uint32_t *tmp = malloc(n * sizeof *tmp);
    size_t *count = malloc(2049 * sizeof *count);
    if (!tmp || !count) {
        free(tmp);
        free(count);
        return ENOMEM;
    }
    for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
    uint64_t span = (hi - lo) >> 3; /* (words are 8-aligned) */
    for (int shift = 0; shift == 0 || (shift < 64 && (span >> shift)); shift += 11) {
        memset(count, 0, 2049 * sizeof *count);
        for (size_t i = 0; i < n; i++) count[(((addrs[order[i]] - lo) >> 3 >> shift) & 2047) + 1]++;
        for (int d = 0; d < 2048; d++) count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) tmp[count[((addrs[order[i]] - lo) >> 3 >> shift) & 2047]++] = order[i];
        memcpy(order, tmp, n * sizeof *order);
    }
    free(tmp);
    free(count);
    return 0;
}
#endif /* CLAMOR_WITH_PYTHON */
