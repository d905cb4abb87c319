/* pywalk.c -- share()'s walk of plain data, in C.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  share() walks
 * the object graph in Python (clamor/memory/walk.py): about 0.1 million
 * objects a second.  Most large globals are plain data, though: dicts,
 * lists, tuples and sets of ints, floats, strs and bytes.  For those,
 * clamor_py_walk_plain() does the same checks as the Python walk, in C:
 *
 *   - every object lies in the region, header to the end of its body, or
 *     is a singleton every process has (None, True, False, Ellipsis,
 *     NotImplemented, an int from -5 to 256, the empty str and the
 *     one-character Latin-1 strs), as walk._ok_outside says, or an object
 *     with no referent in a loaded image (the empty tuple), as the walk's
 *     in_image says;
 *   - every raw pointer field the Python walk checks (pyshare.c, fields())
 *     leads into the region: a list's item array, a dict's keys table (or
 *     the interpreter's static empty one, in a loaded image), a set's
 *     table, a str's data and cached copies;
 *   - no dict is split (a values table: an instance's), and no object has
 *     words a stage would hide (a set's weak-reference list, pyheap.c).
 *
 * It answers 1 only when all of that holds for every object reachable, and
 * then the Python walk would approve without a word to say or a thing to
 * write.  Anything else (another type, an object outside the region, a
 * table that grew outside a block, more than `limit` objects) answers 0,
 * and the caller walks in Python, which refuses with a path, brings the
 * object in, or accepts it for reasons this file does not know (an object
 * the workers inherited).  So C only ever says yes where Python says yes;
 * tests/test_walk_plain.py checks that on random graphs.
 *
 * The GIL is held throughout (the objects are borrowed): about 0.2 s per
 * million objects on this machine.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* [a, a+n) inside the region: region.contains(addr, n) */
static inline int inside(uintptr_t a, size_t n) {
    if (!n) n = 1;
    return a >= cl_region.base && a - cl_region.base <= cl_region.size && n <= cl_region.size - (a - cl_region.base);
}

/* ---- the set of objects seen: open addressing on addresses ------------------ */

struct seen {
    uintptr_t *slot;
    size_t mask, n;
};

static int seen_grow(struct seen *s) {
    size_t cap = s->slot ? 2 * (s->mask + 1) : 1024;
    uintptr_t *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    for (size_t i = 0; s->slot && i <= s->mask; i++) {
        uintptr_t a = s->slot[i];
        if (!a) continue;
        size_t j = (a >> 4) * 0x9E3779B97F4A7C15ull & (cap - 1);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = a;
    }
    free(s->slot);
    s->slot = t;
    s->mask = cap - 1;
    return 0;
}

/* 1 if added, 0 if seen before, -1 out of memory */
static int seen_add(struct seen *s, uintptr_t a) {
    if (!s->slot || 2 * (s->n + 1) > s->mask + 1) {
        if (seen_grow(s) < 0) return -1;
    }
    size_t j = (a >> 4) * 0x9E3779B97F4A7C15ull & s->mask;
    while (s->slot[j]) {
        if (s->slot[j] == a) return 0;
        j = (j + 1) & s->mask;
    }
    s->slot[j] = a;
    s->n++;
    return 1;
}

/* ---- the stack of objects to visit ------------------------------------------- */

struct stack {
    PyObject **item;
    size_t n, cap;
};

static int push(struct stack *st, PyObject *o) {
    if (st->n == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 4096;
        PyObject **t = realloc(st->item, cap * sizeof *t);
        if (!t) return -1;
        st->item = t;
        st->cap = cap;
    }
    st->item[st->n++] = o;
    return 0;
}

/* ---- what a reader follows pointers from (walk.pointer_extents) ---------------- */

struct extents {
    uint64_t *v; /* (start, length) pairs, each within one region page */
    size_t n, cap;
};

static int extent(struct extents *e, uintptr_t lo, size_t len) {
    if (!e) return 0;
    while (len) { /* split at page boundaries: the digests are per page */
        uintptr_t page_end = ((lo - cl_region.base) | (((uintptr_t)1 << cl_region.page_shift) - 1)) + 1 + cl_region.base;
        size_t n = page_end - lo < len ? page_end - lo : len;
        if (e->n == e->cap) {
            size_t cap = e->cap ? 2 * e->cap : 4096;
            uint64_t *t = realloc(e->v, 2 * cap * sizeof *t);
            if (!t) return -1;
            e->v = t;
            e->cap = cap;
        }
        e->v[2 * e->n] = lo;
        e->v[2 * e->n + 1] = n;
        e->n++;
        lo += n;
        len -= n;
    }
    return 0;
}

static void block_extent(struct extents *e, const void *p, int *fail) {
    uintptr_t start;
    size_t size;
    if (clamor_block_of(p, &start, &size) != 0) {
        start = (uintptr_t)p;
        size = 8;
    }
    if (extent(e, start, size) < 0) *fail = 1;
}

/* The extents of region object o of a plain type, as pointer_extents()
 * gives them: the body past the reference count of a container (atoms are
 * data past their type), a list's items, a dict's keys table and a set's
 * table (the allocator's blocks). */
static int extents_of(PyObject *o, struct extents *e) {
    if (!e) return 0;
    int fail = 0;
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyTuple_Type || t == &PyList_Type || t == &PyDict_Type || t == &PySet_Type || t == &PyFrozenSet_Type) {
        size_t body = clamor_py_body_size((uintptr_t)o);
        if (body > 8 && extent(e, (uintptr_t)o + 8, body - 8) < 0) return -1;
    }
    if (t == &PyList_Type) {
        PyObject **items = ((PyListObject *)o)->ob_item;
        if (items && inside((uintptr_t)items, 1) && PyList_GET_SIZE(o) &&
            extent(e, (uintptr_t)items, 8 * (size_t)PyList_GET_SIZE(o)) < 0)
            return -1;
    } else if (t == &PyDict_Type) {
        void *k = ((PyDictObject *)o)->ma_keys;
        if (k && inside((uintptr_t)k, 1)) block_extent(e, k, &fail);
    } else if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        PySetObject *s = (PySetObject *)o;
        if (s->table != s->smalltable && inside((uintptr_t)s->table, 1)) block_extent(e, s->table, &fail);
    }
    return fail ? -1 : 0;
}

/* ---- one object ---------------------------------------------------------------- */

enum { FALLBACK = 0, OK = 1, NOMEM = -1 };

/* A singleton every process has, outside the region (walk._ok_outside). */
static int everyones(PyObject *o) {
    if (o == Py_None || o == Py_True || o == Py_False || o == Py_Ellipsis || o == Py_NotImplemented) return 1;
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(o, &overflow);
        return !overflow && v >= -5 && v <= 256;
    }
    if (PyUnicode_CheckExact(o)) {
#if PY_VERSION_HEX < 0x030C0000
        if (!PyUnicode_IS_READY(o)) return 0; /* (a legacy str: its length is not known yet) */
#endif
        Py_ssize_t n = PyUnicode_GET_LENGTH(o);
        return n == 0 || (n == 1 && PyUnicode_READ_CHAR(o, 0) < 256);
    }
    return 0;
}

/* An object with no referent, of a plain type: a static one in a loaded
 * image (the empty tuple, bytes and frozenset, a cached one-byte bytes)
 * is accepted as the Python walk accepts it (walk.amap.in_image). */
static int static_atom(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
        t == &PyBytes_Type)
        return 1;
    if (t == &PyTuple_Type) return PyTuple_GET_SIZE(o) == 0;
    if (t == &PyFrozenSet_Type) return PySet_GET_SIZE(o) == 0;
    return 0;
}

static int plain_type(PyTypeObject *t) {
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyBool_Type ||
           t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyTuple_Type || t == &PyList_Type ||
           t == &PyDict_Type || t == &PySet_Type || t == &PyFrozenSet_Type;
}

/* The raw pointer fields of an object of a plain type, in the region (or,
 * a dict's keys, the static empty table of an image); no split dict. */
static int fields_inside(PyObject *o, const uintptr_t *images, size_t nimages) {
    if (PyList_CheckExact(o)) {
        PyObject **items = ((PyListObject *)o)->ob_item;
        return !items || inside((uintptr_t)items, 1);
    }
    if (PyDict_CheckExact(o)) {
        PyDictObject *d = (PyDictObject *)o;
        if (d->ma_values) return 0;
        uintptr_t k = (uintptr_t)d->ma_keys;
        return !k || inside(k, 1) || cl_in_ranges(k, images, nimages);
    }
    if (PyAnySet_CheckExact(o)) {
        PySetObject *s = (PySetObject *)o;
        return s->table == s->smalltable || inside((uintptr_t)s->table, 1);
    }
    if (PyUnicode_CheckExact(o)) {
        PyASCIIObject *u = (PyASCIIObject *)o;
        if (!u->state.compact && !inside((uintptr_t)((PyUnicodeObject *)o)->data.any, 1)) return 0;
        if (!u->state.ascii) {
            const char *utf8 = ((PyCompactUnicodeObject *)o)->utf8;
            if (utf8 && !inside((uintptr_t)utf8, 1)) return 0;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (u->wstr && !inside((uintptr_t)u->wstr, 1)) return 0;
#endif
    }
    return 1;
}

static int children(PyObject *o, struct stack *st) {
    if (PyTuple_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++)
            if (push(st, PyTuple_GET_ITEM(o, i)) < 0) return -1;
    } else if (PyList_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); i++)
            if (push(st, PyList_GET_ITEM(o, i)) < 0) return -1;
    } else if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v))
            if (push(st, k) < 0 || push(st, v) < 0) return -1;
    } else if (PyAnySet_CheckExact(o)) {
        PySetObject *s = (PySetObject *)o;
        for (Py_ssize_t i = 0; i <= s->mask; i++) {
            setentry *e = &s->table[i];
            if (e->key && e->hash != -1 && push(st, e->key) < 0) return -1;   /* (a dummy's hash is -1) */
        }
    }
    return 0;
}

/* root: an object; limit: share()'s; images: the loaded images' ranges,
 * sorted pairs.  Returns 1 (approved, the Python walk has nothing to add),
 * 0 (walk it in Python) or -1 (no memory).  *visited: objects looked at. */
int clamor_py_walk_plain(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                         uintptr_t extents_out) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct seen seen = {0};
    struct stack st = {0};
    struct extents ext = {0}, *e = extents_out ? &ext : NULL;
    int rc = OK;
    long n = 0;
    if (push(&st, (PyObject *)root) < 0) rc = NOMEM;
    while (rc == OK && st.n) {
        PyObject *o = st.item[--st.n];
        int fresh = seen_add(&seen, (uintptr_t)o);
        if (fresh < 0) {
            rc = NOMEM;
            break;
        }
        if (!fresh) continue;
        if (++n > limit) {
            rc = FALLBACK;
            break;
        }
        uintptr_t a = (uintptr_t)o;
        if (!inside(a, 1)) {
            /* (not walked: the Python walk accepts it as it is) */
            if (!everyones(o) && !(static_atom(o) && cl_in_ranges(a, images, nimages))) rc = FALLBACK;
            continue;
        }
        void **weak = NULL, **info = NULL;
        if (!plain_type(Py_TYPE(o)) || !inside(a, clamor_py_body_size(a)) || !fields_inside(o, images, nimages) ||
            cl_py_to_hide(o, &weak, &info)) {
            rc = FALLBACK;
            break;
        }
        if (children(o, &st) < 0 || extents_of(o, e) < 0) rc = NOMEM;
    }
    if (rc == OK && e) { /* (start, length) pairs as native words, into the caller's bytearray */
        PyObject *ba = (PyObject *)extents_out;
        size_t bytes = 2 * ext.n * sizeof(uint64_t);
        if (!PyByteArray_Check(ba) || PyByteArray_Resize(ba, (Py_ssize_t)bytes) < 0) {
            PyErr_Clear();
            rc = NOMEM;
        } else if (bytes) {
            memcpy(PyByteArray_AS_STRING(ba), ext.v, bytes);
        }
    }
    free(ext.v);
    free(seen.slot);
    free(st.item);
    *visited = n;
    PyGILState_Release(g);
    return rc;
}

/* A 128-bit digest of the bytes of ranges[0..n) ((start, length) pairs),
 * for walk.read_digests: did a walk's bytes change?  Two 64-bit lanes of a
 * multiply-rotate hash over 8-byte words (the tail byte by byte), each range's
 * length mixed in.  Not cryptographic: the driver's own bytes, compared with
 * themselves. */
static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

void clamor_py_digest(const uint64_t *ranges, size_t n, uint64_t *out) {
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

#endif /* CLAMOR_WITH_PYTHON */
