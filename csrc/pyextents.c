/* pyextents.c -- what a reader of an object follows pointers from
 * (walk.pointer_extents), in C.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  share()'s
 * walk in C (pywalk.c) lists, for each region object it approves, the
 * ranges of its bytes a reader follows pointers from, as pointer_extents()
 * gives them to the Python walk: a container's body past its reference
 * count, a list's items, a dict's keys table and a set's table (the
 * allocator's blocks), an instance's body and its dict's words before its
 * header.  Each range is split at page boundaries (a read table's digests
 * are per page: pyrecheck.c) and, in a tagged walk, tagged with the
 * root's entry it came through.  The GIL is held.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#include "internal.h"

/* Add [lo, lo+len), split at page boundaries, tagged e->cur and marked
 * e->strict_now: 0, or -1 (no memory).  e NULL: nothing to add. */
int cl_py_extent(struct cl_py_extents *e, uintptr_t lo, size_t len) {
    if (!e) return 0;
    while (len) { /* split at page boundaries: the digests are per page */
        uintptr_t page_end = ((lo - cl_region.base) | (((uintptr_t)1 << cl_region.page_shift) - 1)) + 1 + cl_region.base;
        size_t n = page_end - lo < len ? page_end - lo : len;
        if (e->n == e->cap) {
            size_t cap = e->cap ? 2 * e->cap : 4096;
            uint64_t *t = realloc(e->v, 2 * cap * sizeof *t);
            if (!t) return -1;
            e->v = t;
            int32_t *g = realloc(e->tag, cap * sizeof *g);
            if (!g) return -1;
            e->tag = g;
            uint8_t *f = realloc(e->strict, cap);
            if (!f) return -1;
            e->strict = f;
            e->cap = cap;
        }
        e->tag[e->n] = e->cur;
        e->strict[e->n] = e->strict_now;
        e->v[2 * e->n] = lo;
        e->v[2 * e->n + 1] = n;
        e->n++;
        lo += n;
        len -= n;
    }
    return 0;
}

static void block_extent(struct cl_py_extents *e, const void *p, int *fail) {
    uintptr_t start;
    size_t size;
    if (clamor_block_of(p, &start, &size) != 0) {
        start = (uintptr_t)p;
        size = 8;
    }
    if (cl_py_extent(e, start, size) < 0) *fail = 1;
}

/* The extents of region object o of a plain type, as pointer_extents()
 * gives them: the body past the reference count of a container (atoms are
 * data past their type), a list's items, a dict's keys table and a set's
 * table (the allocator's blocks). */
int cl_py_extents_of(PyObject *o, struct cl_py_extents *e) {
    if (!e) return 0;
    int fail = 0;
    PyTypeObject *t = Py_TYPE(o);
    e->strict_now = 1; /* (a body and an item array: pointers; a keys or set table also holds hashes) */
    if (t == &PyTuple_Type || t == &PyList_Type || t == &PyDict_Type || t == &PySet_Type || t == &PyFrozenSet_Type) {
        size_t body = clamor_py_body_size((uintptr_t)o);
        if (body > 8 && cl_py_extent(e, (uintptr_t)o + 8, body - 8) < 0) return -1;
    }
    if (t == &PyList_Type) {
        PyObject **items = ((PyListObject *)o)->ob_item;
        if (items && cl_in_region_span((uintptr_t)items, 1) && PyList_GET_SIZE(o) &&
            cl_py_extent(e, (uintptr_t)items, 8 * (size_t)PyList_GET_SIZE(o)) < 0)
            return -1;
    } else if (t == &PyDict_Type) {
        void *k = ((PyDictObject *)o)->ma_keys, *v = ((PyDictObject *)o)->ma_values;
        e->strict_now = 0;
        if (k && cl_in_region_span((uintptr_t)k, 1)) block_extent(e, k, &fail);
        if (v && cl_in_region_span((uintptr_t)v, 1)) block_extent(e, v, &fail); /* (an instance's values) */
    } else if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        PySetObject *s = (PySetObject *)o;
        e->strict_now = 0;
        if (s->table != s->smalltable && cl_in_region_span((uintptr_t)s->table, 1)) block_extent(e, s->table, &fail);
    }
    return fail ? -1 : 0;
}

/* An instance's extents as pointer_extents() gives them: its body past the
 * reference count, the dict's words before its header and, since CPython
 * 3.13, the values after its body (a values table's header, then a slot
 * per name of the class's keys table); before 3.13, while it has no dict,
 * its values table.  An attribute set there while they
 * are valid changes no dict, so its bytes must be read as the dict's. */
int cl_py_instance_extents(PyObject *o, struct cl_py_extents *e) {
    if (!e) return 0;
    uintptr_t a = (uintptr_t)o;
    size_t body = clamor_py_body_size(a), pre = 2 * sizeof(void *) + (PyObject_IS_GC(o) ? 2 * sizeof(void *) : 0);
    e->strict_now = 1;
    if (body > 8 && cl_py_extent(e, a + 8, body - 8) < 0) return -1;
    if (cl_py_extent(e, a - pre, 2 * sizeof(void *)) < 0) return -1;
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_TYPE(o)->tp_flags & Py_TPFLAGS_INLINE_VALUES) {
        uintptr_t v = a + (size_t)Py_TYPE(o)->tp_basicsize;
        e->strict_now = 0; /* (its header is bytes; spare slots are null) */
        return cl_py_extent(e, v, sizeof(void *) * (1 + (size_t)*(const uint8_t *)v));
    }
#else
    PyObject **v = cl_py_instance_values(o); /* (no dict made: the values table, the allocator's block) */
    if (v && cl_in_region_span((uintptr_t)v, 1)) {
        int fail = 0;
        e->strict_now = 0; /* (its prefix is bytes; spare slots are null) */
        block_extent(e, v, &fail);
        return fail ? -1 : 0;
    }
#endif
    return 0;
}

/* An object with extents of its own (a region container or instance): one
 * reached through two entries of the root makes a walk of one entry not
 * enough to vouch for it. */
int cl_py_has_extents(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    return cl_in_region_span((uintptr_t)o, 1) && t != &PyLong_Type && t != &PyFloat_Type && t != &PyComplex_Type &&
           t != &PyUnicode_Type && t != &PyBytes_Type && t != &PyBool_Type;
}

#endif /* CLAMOR_WITH_PYTHON */
