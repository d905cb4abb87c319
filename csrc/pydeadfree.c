/* pydeadfree.c -- region objects that die on a worker kept off CPython's
 * free lists.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A worker's
 * reference counts on region objects live in its own copy of the page, so
 * a task that lets a region object go (a library replacing an entry of a
 * region dict's cache, a list item set to None) frees it on the worker.
 * The allocator's free leaves region memory alone there (pyheap.c), but the
 * deallocs of dicts, lists, tuples, floats and slices put the object, and a
 * dict's small key table, on CPython's free lists first, and the worker's
 * next object of that type is made there: in region memory, which the next
 * version's page overwrites with the driver's bytes (a worker's own dicts
 * read otherwise, or its collector followed a key table's garbage).
 *
 * clamor_py_worker_deallocs() wraps those types' deallocs in a worker: after
 * a region object's dealloc, the object (and the key table) that the free
 * list hands out next is taken, and kept for good if it is that region
 * memory; otherwise let go again.  One allocation per region object that
 * dies, none for the worker's own objects.  A region slice keeps its
 * memory without slice_dealloc (see slice_dealloc1).
 *
 * A region dict that grows on a worker drops its small key table without a
 * dealloc: clamor_py_worker_sweep() takes such tables off the list after
 * each task and before a change of version.  Not covered: a small dict the
 * worker makes in the same task after such a growth, a float that the
 * interpreter's specialised arithmetic frees without its type's dealloc
 * (_PyFloat_ExactDealloc), and a region object whose dealloc the trashcan
 * defers (nesting deeper than 50).
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "internal.h"

#define TUPLE_SAVED 20 /* CPython's PyTuple_MAXSAVESIZE: tuples of 1..19 items are kept */

static destructor dict_dealloc0, list_dealloc0, tuple_dealloc0, float_dealloc0, slice_dealloc0;
static PyObject *probe_key;
static long kept;

static inline int regional(const void *p) { return cl_in_region((uintptr_t)p); }

/* `got`, just made: kept for good if it is the region memory `was` (the
 * free list gave it back), out of the collector's lists (its links are in
 * a page the next version replaces), else let go.  The caller saved the
 * exception being raised, if any. */
static void keep_if(PyObject *got, const void *was) {
    if (!got) {
        PyErr_Clear();
        return;
    }
    if ((const void *)got == was) {
        if (PyObject_IS_GC(got)) PyObject_GC_UnTrack(got);
        kept++; /* (never released: nothing is made there again) */
    } else {
        Py_DECREF(got);
    }
}

/* An exception may be on its way while a dealloc runs: saved and put back
 * around what is made here. */
#define KEEPING(stmt)                          \
    do {                                       \
        PyObject *exc_, *val_, *tb_;           \
        PyErr_Fetch(&exc_, &val_, &tb_);       \
        stmt;                                  \
        PyErr_Restore(exc_, val_, tb_);        \
    } while (0)

/* The dict free list's next dict, and the key-table list's next table. */
static void take_dict(const void *obj, const void *keys) {
    if (obj) keep_if(PyDict_New(), obj);
    if (!keys) return;
    PyObject *d = PyDict_New();
    if (!d || PyDict_SetItem(d, probe_key, Py_None) < 0) { /* (a str key: the small table the list keeps) */
        PyErr_Clear();
        Py_XDECREF(d);
        return;
    }
    if ((const void *)((PyDictObject *)d)->ma_keys == keys || regional(d)) kept++; /* (a dict of None: never tracked) */
    else Py_DECREF(d);
}

static void dict_dealloc1(PyObject *o) {
    const void *obj = regional(o) ? (const void *)o : NULL;
    const void *keys = regional(((PyDictObject *)o)->ma_keys) ? (const void *)((PyDictObject *)o)->ma_keys : NULL;
    dict_dealloc0(o);
    if (obj || keys) KEEPING(take_dict(obj, keys));
}

static void list_dealloc1(PyObject *o) {
    int r = regional(o);
    list_dealloc0(o);
    if (r) KEEPING(keep_if(PyList_New(0), o));
}

static void tuple_dealloc1(PyObject *o) {
    Py_ssize_t n = Py_SIZE(o);
    int r = regional(o) && n > 0 && n < TUPLE_SAVED;
    tuple_dealloc0(o);
    if (r) KEEPING(keep_if(PyTuple_New(n), o));
}

static void float_dealloc1(PyObject *o) {
    int r = regional(o);
    float_dealloc0(o);
    if (r) KEEPING(keep_if(PyFloat_FromDouble(0.0), o));
}

/* A region slice is not handed to slice_dealloc at all: its members are let
 * go and its memory kept.  (slice_dealloc unlinks it from the collector's
 * list unchecked, and a worker not forked reads a region object's links as
 * null: it died there.) */
static void slice_dealloc1(PyObject *o) {
    if (!regional(o)) {
        slice_dealloc0(o);
        return;
    }
    PyObject_GC_UnTrack(o); /* (only if tracked) */
    PySliceObject *s = (PySliceObject *)o;
    Py_CLEAR(s->step);
    Py_CLEAR(s->start);
    Py_CLEAR(s->stop);
    kept++;
}

/* In a worker, once (a second call does nothing).  0, or -1 (the Python
 * error is set). */
int clamor_py_worker_deallocs(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    if (!dict_dealloc0) {
        if (!(probe_key = PyUnicode_InternFromString("clamor-dead-region-memory"))) {
            rc = -1;
        } else {
            dict_dealloc0 = PyDict_Type.tp_dealloc;
            list_dealloc0 = PyList_Type.tp_dealloc;
            tuple_dealloc0 = PyTuple_Type.tp_dealloc;
            float_dealloc0 = PyFloat_Type.tp_dealloc;
            slice_dealloc0 = PySlice_Type.tp_dealloc;
            PyDict_Type.tp_dealloc = dict_dealloc1;
            PyList_Type.tp_dealloc = list_dealloc1;
            PyTuple_Type.tp_dealloc = tuple_dealloc1;
            PyFloat_Type.tp_dealloc = float_dealloc1;
            PySlice_Type.tp_dealloc = slice_dealloc1;
        }
    }
    PyGILState_Release(g);
    return rc;
}

#define KEYS_SWEPT 90 /* more than CPython's 80 small key tables on the list */

/* A worker, after a task: the region key tables on the free list taken
 * and kept.  A region dict that grows on a worker drops its small key
 * table without any dealloc (dictresize); the worker's next small dict
 * would be made over it.  Dicts of one str key are made until the list is
 * through, those over region memory kept, the others let go in the order
 * that puts the list back as it was.  Returns how many were kept. */
long clamor_py_worker_sweep(void) {
    if (!dict_dealloc0) return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *exc, *val, *tb;
    PyErr_Fetch(&exc, &val, &tb);
    PyObject *made[KEYS_SWEPT];
    int n = 0;
    long took = 0;
    for (int i = 0; i < KEYS_SWEPT; i++) {
        PyObject *d = PyDict_New();
        if (!d || PyDict_SetItem(d, probe_key, Py_None) < 0) {
            PyErr_Clear();
            Py_XDECREF(d);
            break;
        }
        if (regional(d) || regional(((PyDictObject *)d)->ma_keys)) took++; /* (kept: a dict of None is never tracked) */
        else made[n++] = d;
    }
    while (n) Py_DECREF(made[--n]);
    kept += took;
    PyErr_Restore(exc, val, tb);
    PyGILState_Release(g);
    return took;
}

/* Region objects (and key tables) kept off the free lists so far. */
long clamor_py_worker_kept(void) { return kept; }
#endif /* CLAMOR_WITH_PYTHON */
