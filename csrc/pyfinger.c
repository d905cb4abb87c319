/* pyfinger.c -- what a forked worker reads of an object it inherited.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A forked
 * worker has the driver's private memory as it was at the fork.  share()
 * accepts a pointer from a region object to an object outside the region
 * when an object was alive at that address at the fork; but the driver may
 * since have freed that object and made another at the same address (a
 * float from CPython's free list, most often), or changed it in place, and
 * the worker reads the old one, silently.
 *
 * So the driver takes a fingerprint of every object of its snapshot when it
 * forks (clamor_py_fingerprints) and compares an inherited object with it
 * when share() meets it (clamor_py_inherited).  A fingerprint covers what a
 * reader sees, by type:
 *
 *   float, complex          the value's bits
 *   int                     the value's hash, bit length and sign
 *   str, bytes, bytearray   length and contents (bytearray: its buffer too)
 *   tuple, list             length and item pointers (list: its item array)
 *   dict, set, frozenset    size and every key and value pointer
 *   ndarray                 data, shape, strides, dtype and base pointers,
 *                           flags, and the elements: all of them up to
 *                           256 KiB, beyond that a sample (elements())
 *   anything else           its body's words after the header, but its
 *                           weak-reference list, and what the collector
 *                           sees it refer to (an instance's attributes)
 *
 *   code object             its qualified name, file and first line
 *   function                its code and qualified name pointers
 *
 * and never a reference count.  Types and modules get none (0): their
 * identity decides, since their bodies change with every cache the
 * interpreter keeps in them; an object of another kind at the address of
 * one of them is not it.  The fingerprint
 * mixes in the type, so an object of another type at the address differs.
 *
 * Both functions take the GIL and run no Python code: nothing is allocated
 * or freed while they read, and every object they are given is alive.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL clamor_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>
#include <string.h>

#include "internal.h"
#include "pyseen.h"

static uint64_t mix(uint64_t h, uint64_t w) {
    uint64_t z = h ^ (w + 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t mix_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    h = mix(h, n);
    for (; n >= 8; b += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = mix(h, w);
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, b, n);
        h = mix(h, w);
    }
    return h;
}

static uint64_t mix_ptrs(uint64_t h, PyObject *const *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) h = mix(h, (uintptr_t)items[i]);
    return h;
}

/* An array's elements: every byte of the span they lie in up to
 * ELEMENTS_WHOLE, beyond that its first and last pages and ELEMENT_PROBES
 * words spread over it (a fork costs the same for a huge array; a write in
 * place between the probes is not seen). */
#define ELEMENTS_WHOLE (256 * 1024)
#define ELEMENT_PROBES 1024
static uint64_t elements(uint64_t h, PyArrayObject *a) {
    if (PyArray_SIZE(a) == 0) return h;
    char *lo = PyArray_DATA(a), *hi = lo;
    for (int i = 0; i < PyArray_NDIM(a); i++) {
        npy_intp span = (PyArray_DIM(a, i) - 1) * PyArray_STRIDE(a, i);
        if (span < 0) lo += span;
        else hi += span;
    }
    size_t n = (size_t)(hi - lo) + (size_t)PyArray_ITEMSIZE(a);
    if (n <= ELEMENTS_WHOLE) return mix_bytes(h, lo, n);
    h = mix_bytes(mix_bytes(h, lo, 4096), lo + n - 4096, 4096);
    size_t step = (n - 8) / ELEMENT_PROBES;
    for (size_t k = 0; k < ELEMENT_PROBES; k++) {
        uint64_t w;
        memcpy(&w, lo + k * step, 8);
        h = mix(h, w);
    }
    return h;
}

static int visit(PyObject *ref, void *arg) {
    *(uint64_t *)arg = mix(*(uint64_t *)arg, (uintptr_t)ref);
    return 0;
}

struct others {
    PyObject *type;
    int n;
};

static int count_other(PyObject *ref, void *arg) {
    struct others *c = arg;
    c->n += ref != c->type;
    return 0;
}

/* Does o hold no reference, but to its type (which a heap type's objects
 * visit)? */
static int refers_to_nothing(PyObject *o) {
    if (!PyObject_IS_GC(o)) return 1;
    if (!Py_TYPE(o)->tp_traverse) return 0;
    struct others c = {(PyObject *)Py_TYPE(o), 0};
    Py_TYPE(o)->tp_traverse(o, count_other, &c);
    return c.n == 0;
}

/* An ndarray: its data, shape, strides, dtype and base pointers, its
 * flags, and its elements. */
static inline uint64_t of_array(uint64_t h, PyArrayObject *a) {
    int nd = PyArray_NDIM(a);
    h = mix(mix(mix(h, (uintptr_t)PyArray_DATA(a)), (uint64_t)nd), (uint64_t)PyArray_FLAGS(a));
    h = mix(mix(h, (uintptr_t)PyArray_DESCR(a)), (uintptr_t)PyArray_BASE(a));
    h = mix_bytes(h, PyArray_DIMS(a), sizeof(npy_intp) * (size_t)nd);
    h = mix_bytes(h, PyArray_STRIDES(a), sizeof(npy_intp) * (size_t)nd);
    return elements(h, a) | 1;
}

/* A dtype: its fields, not its body: the body caches the dtype's hash once
 * something asks for it. */
static inline uint64_t of_descr(uint64_t h, PyArray_Descr *d) {
    h = mix(mix(mix(h, (uint64_t)d->type_num), (uint64_t)d->kind), (uint64_t)d->byteorder);
    h = mix(mix(h, (uint64_t)PyDataType_ELSIZE(d)), (uint64_t)PyDataType_ALIGNMENT(d));
    h = mix(mix(h, (uintptr_t)PyDataType_NAMES(d)), (uintptr_t)PyDataType_FIELDS(d));
    if (PyDataType_ISLEGACY(d))
        h = mix(mix(h, (uintptr_t)PyDataType_SUBARRAY(d)), (uintptr_t)PyDataType_METADATA(d));
    return mix(h, (uintptr_t)d->typeobj) | 1;
}

/* Anything else: its body's words after the header, but its weak-reference
 * list, and what the collector sees it refer to. */
static inline uint64_t of_body(uint64_t h, PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
#if PY_VERSION_HEX < 0x030D0000
    /* an instance's dict and values pointers lie before its header (and
     * before the collector's links): a new instance at the address has
     * others (its attributes changed in place are not seen).  3.11: values
     * at -4 words, dict at -3; 3.12: its weak-reference list at -4 (never
     * read: a weak reference made after the fork changes nothing a reader
     * sees), dict or values at -3.  3.13 keeps the values inline, after the
     * body, and the traversal below sees them. */
    if (t->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        const uint64_t *pre = (const uint64_t *)o - 4;
#if PY_VERSION_HEX < 0x030C0000
        h = mix(h, pre[0]);
#endif
        h = mix(h, pre[1]);
    }
#endif
    /* a C type's object may cache its hash in its body once asked (a
     * datetime, a Decimal): ask first, so that the body reads the same
     * whenever it is read.  No Python code runs in the hash of an object
     * that holds no references, of a type that no class statement made
     * (static, or an extension's heap type: Decimal is one since 3.13,
     * collected only to visit its type). */
    if (!cl_py_is_class(t) && refers_to_nothing(o) && t->tp_hash && t->tp_hash != PyObject_HashNotImplemented &&
        t->tp_hash(o) == -1)
        PyErr_Clear();
    Py_ssize_t weak = t->tp_weaklistoffset;
    for (Py_ssize_t at = (Py_ssize_t)sizeof(PyObject); at + 8 <= t->tp_basicsize; at += 8)
        if (at != weak) h = mix(h, *(const uint64_t *)((const char *)o + at));
    /* what the collector sees it refer to: an instance's attribute values
     * too, where they lie outside its body (CPython 3.11's inline values) */
    if (PyObject_IS_GC(o) && t->tp_traverse) t->tp_traverse(o, visit, &h);
    return h | 1;
}

static uint64_t of_value(PyObject *o);

/* A class over a builtin type (a float, str or tuple subclass) may add a
 * dict or slots: what the collector sees it refer to (its slots' values,
 * its dict or its attribute values) is mixed into its value's print. */
static uint64_t fingerprint(PyObject *o) {
    uint64_t h = of_value(o);
    PyTypeObject *t = Py_TYPE(o);
    if (h && cl_py_is_class(t) && /* (h is 0 for a type) */
        (PyFloat_Check(o) || PyComplex_Check(o) || PyLong_Check(o) || PyUnicode_Check(o) || PyBytes_Check(o) ||
         PyByteArray_Check(o) || PyTuple_Check(o) || PyList_Check(o) || PyDict_Check(o) || PyAnySet_Check(o))) {
        if (PyObject_IS_GC(o) && t->tp_traverse) t->tp_traverse(o, visit, &h);
        h |= 1;
    }
    return h;
}

static uint64_t of_value(PyObject *o) {
    uint64_t h = mix(0x636c616d6f72ULL, (uintptr_t)Py_TYPE(o));
    /* A code object's names and place, a function's code and name: what a
     * reader sees, and none of the caches the interpreter keeps in them
     * (a freed module body's code at the address of an array made later
     * read as inherited while these had no fingerprint). */
    if (PyCode_Check(o)) {
        PyCodeObject *c = (PyCodeObject *)o;
        return mix(mix(mix(h, (uint64_t)PyObject_Hash(c->co_qualname)), (uint64_t)PyObject_Hash(c->co_filename)),
                   (uint64_t)c->co_firstlineno) | 1;
    }
    if (PyFunction_Check(o))
        return mix(mix(h, (uintptr_t)PyFunction_GET_CODE(o)), (uintptr_t)((PyFunctionObject *)o)->func_qualname) | 1;
    if (PyType_Check(o) || PyModule_Check(o) || PyCFunction_Check(o))
        return 0;
    if (PyFloat_Check(o)) {
        double v = PyFloat_AS_DOUBLE(o);
        return mix_bytes(h, &v, sizeof v) | 1;
    }
    if (PyComplex_Check(o)) {
        Py_complex v = ((PyComplexObject *)o)->cval;
        return mix_bytes(h, &v, sizeof v) | 1;
    }
    if (PyLong_Check(o)) {
        h = mix(h, (uint64_t)PyObject_Hash(o));
        size_t bits = _PyLong_NumBits(o);
        if (bits == (size_t)-1 && PyErr_Occurred()) PyErr_Clear();
        h = mix(h, bits);
        return mix(h, (uint64_t)(int64_t)_PyLong_Sign(o)) | 1;
    }
    if (PyUnicode_Check(o)) {
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(o) < 0) {
            PyErr_Clear();
            return mix(h, (uintptr_t)o) | 1;   /* cannot read it: never equal to the fork's */
        }
#endif
        h = mix(h, (uint64_t)PyUnicode_KIND(o));
        return mix_bytes(h, PyUnicode_DATA(o), (size_t)PyUnicode_GET_LENGTH(o) * PyUnicode_KIND(o)) | 1;
    }
    if (PyBytes_Check(o)) return mix_bytes(h, PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o)) | 1;
    if (PyByteArray_Check(o)) {
        h = mix(h, (uintptr_t)((PyByteArrayObject *)o)->ob_bytes);
        return mix_bytes(h, PyByteArray_AS_STRING(o), (size_t)PyByteArray_GET_SIZE(o)) | 1;
    }
    if (PyTuple_Check(o)) {
        h = mix(h, (uint64_t)PyTuple_GET_SIZE(o));
        return mix_ptrs(h, ((PyTupleObject *)o)->ob_item, PyTuple_GET_SIZE(o)) | 1;
    }
    if (PyList_Check(o)) {
        PyListObject *l = (PyListObject *)o;
        h = mix(mix(h, (uint64_t)Py_SIZE(l)), (uintptr_t)l->ob_item);
        return mix_ptrs(h, l->ob_item, Py_SIZE(l)) | 1;
    }
    if (PyDict_Check(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        h = mix(h, (uint64_t)PyDict_GET_SIZE(o));
        while (PyDict_Next(o, &pos, &k, &v)) h = mix(mix(h, (uintptr_t)k), (uintptr_t)v);
        return h | 1;
    }
    if (PyAnySet_Check(o)) {
        PySetObject *s = (PySetObject *)o;
        h = mix(mix(h, (uint64_t)s->used), (uint64_t)s->mask);
        for (Py_ssize_t i = 0; i <= s->mask; i++) h = mix(h, (uintptr_t)s->table[i].key);
        return h | 1;
    }
    if (cl_py_numpy_ready() == 0 && PyArray_Check(o)) return of_array(h, (PyArrayObject *)o);
    if (cl_py_numpy_ready() == 0 && PyArray_DescrCheck(o)) return of_descr(h, (PyArray_Descr *)o);
    return of_body(h, o);
}

/* The objects reached so far (each tagged with the least depth it was
 * reached at) and the list of them, in the order first reached. */
struct ids {
    uint64_t *at;
    size_t n, cap;
    int depth;
    struct seen seen;
    int oom;
};

/* 1 if ref must be followed from this depth: not reached before, or only
 * deeper (from there the depth limit cut off more of what it refers to). */
static int first_at(struct ids *b, uint64_t k) {
    int r = seen_least(&b->seen, (uintptr_t)k, b->depth);
    if (r < 0) {
        b->oom = 1;
        return 0;
    }
    if (r && b->seen.n > b->n) {   // (added, not lowered)
        if (b->n < b->cap) b->at[b->n] = k;
        b->n++;
    }
    return r;
}

/* What the collector's links do not show.  A dict with str keys does not
 * visit its keys (strs make no cycles): attribute and global names.  A
 * container of atomic items is untracked (not in gc.get_objects()), and
 * so is a code object, whose names and constants are the strs a class's
 * methods set as attributes.  So the snapshot follows those too, a few
 * levels deep.  Each object is followed once from the least depth it is
 * reached at: the same set as following every path, without the repeats
 * (the constants of one code object are reached from every function,
 * method and frame that holds it). */
static int collect(PyObject *ref, void *arg);

static void collect_more(PyObject *o, struct ids *b) {
    if (b->depth >= 8) return;
    b->depth++;
    if (PyCode_Check(o)) {
        PyCodeObject *c = (PyCodeObject *)o;
        PyObject *parts[] = {c->co_consts, c->co_names, c->co_localsplusnames, c->co_filename, c->co_name,
                             c->co_qualname, c->co_linetable, c->co_exceptiontable};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (parts[i]) collect(parts[i], b);
    } else if (PyDict_Check(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            collect(k, b);
            if (!PyObject_IS_GC(o) || !PyObject_GC_IsTracked(o)) collect(v, b);
        }
    } else if (PyObject_IS_GC(o) && !PyObject_GC_IsTracked(o) && Py_TYPE(o)->tp_traverse) {
        Py_TYPE(o)->tp_traverse(o, collect, b);
    }
    b->depth--;
}

static int collect(PyObject *ref, void *arg) {
    struct ids *b = arg;
    if (ref && first_at(b, (uintptr_t)ref)) collect_more(ref, b);
    return 0;
}

long clamor_py_snapshot(uintptr_t list, uint64_t *out, size_t cap) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *l = (PyObject *)list;
    struct ids b = {out, 0, cap, 0, {NULL, NULL, 0, 0}, 0};
    for (Py_ssize_t i = 0; !b.oom && PyList_Check(l) && i < PyList_GET_SIZE(l); i++) {
        PyObject *o = PyList_GET_ITEM(l, i);
        collect(o, &b);
        if (PyObject_IS_GC(o) && Py_TYPE(o)->tp_traverse) Py_TYPE(o)->tp_traverse(o, collect, &b);
    }
    free(b.seen.slot);
    free(b.seen.tag);
    PyGILState_Release(g);
    if (b.oom) return LONG_MIN;
    return b.n <= cap ? (long)b.n : -(long)b.n;
}

long clamor_py_fingerprints(const uint64_t *objs, uint64_t *out, size_t n) {
    PyGILState_STATE g = PyGILState_Ensure();
    for (size_t i = 0; i < n; i++) out[i] = fingerprint((PyObject *)(uintptr_t)objs[i]);
    PyGILState_Release(g);
    return (long)n;
}

static ssize_t find(uint64_t x, const uint64_t *ids, size_t n) { return cl_sorted_find(ids, n, x); }

int clamor_py_snapshot_has(uint64_t addr, const uint64_t *ids, size_t n) { return find(addr, ids, n) >= 0; }

int clamor_py_inherited(uintptr_t obj, const uint64_t *ids, const uint64_t *fps, size_t n) {
    ssize_t i = find(obj, ids, n);
    if (i < 0) return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    uint64_t now = fingerprint((PyObject *)obj);
    PyGILState_Release(g);
    /* no fingerprint (a type, a module): identity decides, but only for an
     * object of such a kind at the address */
    return now == fps[i] ? 1 : -1;
}
#endif /* CLAMOR_WITH_PYTHON */
