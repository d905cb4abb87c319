/* pyfreelist.c -- hand CPython's free lists back to ordinary memory.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  CPython keeps
 * dead objects of the common types (floats, tuples of up to 19 items,
 * lists, dicts, small dict key tables, a slice) on free lists and hands them to
 * the next object of that type.  A region object that dies outside a heap()
 * block goes there without any call to the allocator, and the runtime's own
 * next tuple or dict would then be region memory: shipped as if the user
 * had shared it, and read by workers at the wrong version.  A full
 * collection empties the lists, but costs tens of milliseconds; this does
 * it through the types themselves, in a few: it takes objects of each kind
 * until it has more outside the region than the list holds, then lets
 * those go first (they fill the list) and the region ones last (the list
 * is full: they go back to the region allocator).  The same run the other
 * way fills the lists with region objects inside a block that C code
 * entered; and a heap() block drains them before it begins, holding what
 * they had until it ends (clamor_py_freelists_drain).  The capacities are CPython's
 * (3.11-3.13: 100 floats, 2000 tuples of each size, 80 lists, 80 dicts, 80
 * key tables, and the one slice a slice cache holds: a region slice left
 * there was a forked worker's next slice, whose memory the driver later
 * gave a dict); taking more than that is harmless.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "internal.h"

#define TUPLE_SIZES 19
#define TAKE_TUPLES 2100
#define TAKE_OTHERS 200

static inline int regional(PyObject *o) {
    if (cl_in_region((uintptr_t)o)) return 1;
    // a dict outside whose key table came off the key-table list
    return PyDict_CheckExact(o) && cl_in_region((uintptr_t)((PyDictObject *)o)->ma_keys);
}

// In the region with its key table (a dict's): what a block may reuse.
static inline int wholly(PyObject *o) {
    return cl_in_region((uintptr_t)o) && (!PyDict_CheckExact(o) || cl_in_region((uintptr_t)((PyDictObject *)o)->ma_keys));
}

// Is o of the side the lists are to hold: outside (0, a flush) or
// wholly in the region (1, a fill)?
static inline int wanted(PyObject *o, int side) { return side ? wholly(o) : !regional(o); }

// Let go of held[0..n): those of `side` first (they fill the lists), the
// others last (the lists are full: they go back to their allocator).
static void release(PyObject **held, Py_ssize_t n, int side) {
    for (int pass = 0; pass < 2; pass++)
        for (Py_ssize_t i = 0; i < n; i++)
            if (held[i] && wanted(held[i], side) == !pass) Py_CLEAR(held[i]);
}

#define KINDS (4 + TUPLE_SIZES)

/* Kind k (floats, lists, dicts, slices, then tuples of 1..19 items): its
 * tuples' size, and how many to take to be past its list's room. */
static void kind_of(int kind, Py_ssize_t *size, Py_ssize_t *want) {
    *size = kind >= 4 ? kind - 3 : 0;
    *want = kind >= 4 ? TAKE_TUPLES : TAKE_OTHERS;
}

static PyObject *make(int kind, Py_ssize_t size, PyObject *key) {
    switch (kind) {
    case 0: return PyFloat_FromDouble(0.5);
    case 1: return PyList_New(0);
    case 2: {
        PyObject *d = PyDict_New(); // its key table (a str key's kind, the list's) comes with its first item
        if (d && PyDict_SetItem(d, key, Py_None) < 0) Py_CLEAR(d);
        return d;
    }
    case 3: return PySlice_New(Py_None, Py_None, Py_None);
    default: {
        PyObject *t = PyTuple_New(size);
        if (t)
            for (Py_ssize_t i = 0; i < size; i++) {
                Py_INCREF(Py_None);
                PyTuple_SET_ITEM(t, i, Py_None);
            }
        return t;
    }
    }
}

/* side 0 (a flush, outside every block): enough objects outside the region
 * to fill a list on their own, plus every region one the list held (no
 * more than its capacity); the lists end full of outside ones.  side 1 (a
 * fill, inside a block, whose new objects are region ones): the other
 * way.  *moved: the objects of the other side the lists held. */
static int flush(long *moved, int side) {
    PyObject **held = PyMem_RawMalloc(sizeof(PyObject *) * 2 * TAKE_TUPLES);
    PyObject *key = PyUnicode_FromString("clamor-free-list");
    if (!held || !key) {
        PyMem_RawFree(held);
        Py_XDECREF(key);
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (int kind = 0; kind < KINDS && rc == 0; kind++) {
        Py_ssize_t size, want, n = 0, mine = 0;
        kind_of(kind, &size, &want);
        while (mine < want && n < 2 * want) {
            if (!(held[n] = make(kind, size, key))) {
                rc = -1; // the Python error is set
                break;
            }
            if (wanted(held[n++], side)) mine++;
            else (*moved)++;
        }
        release(held, n, side);
    }
    PyMem_RawFree(held);
    Py_DECREF(key);
    return rc;
}

/* The calling thread outside every heap block.  Returns how many region
 * objects were on the lists, or -1 (the error is printed). */
long clamor_py_freelists_flush(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    long moved = 0;
    if (cl_heap_depth) {
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_freelists_flush inside a heap block");
        moved = -1;
    } else if (flush(&moved, 0) < 0) {
        moved = -1;
    }
    if (moved < 0) PyErr_Print();
    PyGILState_Release(g);
    return moved;
}

/* Outside every block: every free list emptied, its objects (and, past
 * them, new ones outside the region) appended to the list `out`, to be
 * held while a heap() block runs: the block's objects are then new region
 * ones, and no region memory is made only to fill the lists.  Returns how
 * many objects were taken, or -1 (the error is printed). */
long clamor_py_freelists_drain(uintptr_t out) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *list = (PyObject *)out, *key = NULL;
    long taken = -1;
    if (cl_heap_depth) PyErr_SetString(PyExc_RuntimeError, "clamor_py_freelists_drain inside a heap block");
    else if (!PyList_CheckExact(list)) PyErr_SetString(PyExc_TypeError, "clamor_py_freelists_drain needs a list");
    else if ((key = PyUnicode_FromString("clamor-free-list"))) taken = 0;
    for (int kind = 0; taken >= 0 && kind < KINDS; kind++) {
        Py_ssize_t size, want;
        kind_of(kind, &size, &want);
        for (Py_ssize_t i = 0; i < want; i++) {
            PyObject *o = make(kind, size, key);
            if (!o || PyList_Append(list, o) < 0) {
                Py_XDECREF(o);
                taken = -1;
                break;
            }
            Py_DECREF(o);
            taken++;
        }
    }
    Py_XDECREF(key);
    if (taken < 0) PyErr_Print();
    PyGILState_Release(g);
    return taken;
}

/* Outside every block: let go of what clamor_py_freelists_drain took into
 * `list`, those outside the region first (they fill the lists again), the
 * region ones last (past the lists' room: back to the region allocator);
 * the list is left empty.  0, or -1 (the error is printed). */
int clamor_py_freelists_release(uintptr_t list) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *l = (PyObject *)list;
    int rc = -1;
    if (cl_heap_depth) {
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_freelists_release inside a heap block");
    } else if (!PyList_CheckExact(l)) {
        PyErr_SetString(PyExc_TypeError, "clamor_py_freelists_release needs a list");
    } else {
        Py_ssize_t n = PyList_GET_SIZE(l);
        PyObject **held = PyMem_RawMalloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
        if (!held) {
            PyErr_NoMemory();
        } else {
            for (Py_ssize_t i = 0; i < n; i++) {
                held[i] = PyList_GET_ITEM(l, i);
                Py_INCREF(held[i]);
            }
            rc = PyList_SetSlice(l, 0, n, NULL);
            release(held, n, 0);
            PyMem_RawFree(held);
        }
    }
    if (rc < 0) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

/* The GIL held, inside a heap block that C code entered of its own
 * (pyownkeys.c): the free lists hold no object outside the region (a
 * copy's dict or key table would be one), filled with region ones.  0, or
 * -1 with the Python error set. */
int cl_py_freelists_fill(void) {
    long moved = 0;
    if (!cl_heap_depth) {
        PyErr_SetString(PyExc_RuntimeError, "cl_py_freelists_fill outside a heap block");
        return -1;
    }
    return flush(&moved, 1) < 0 ? -1 : 0;
}

/* The GIL held: after such a block, outside every block, the free lists
 * hold no region object again (what the fill left there, what died in the
 * block).  Inside an outer block of the caller's, nothing to do.  0, or -1
 * with the Python error set. */
int cl_py_freelists_out(void) {
    long moved = 0;
    return cl_heap_depth ? 0 : flush(&moved, 0) < 0 ? -1 : 0;
}

#endif /* CLAMOR_WITH_PYTHON */
